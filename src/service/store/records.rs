//! What both backends read and write, shared by them: the records ([`MachineRecord`],
//! [`InstanceRecord`], [`ApplicationRecord`], [`NewMachine`], [`Settings`]), the gauges' counts
//! ([`StoreCounts`]) and the [`Book`] each backend keeps of what its commits changed, the token
//! rows' decoding, and the ids both backends draw alike. No database here.

use std::collections::{BTreeMap, BTreeSet};

use super::errors::StoreError;
use crate::model::{
    CapacityPreference, CapacityType, CloudInstance, Constraints, HarvestMode, InstanceId, InstanceState,
    InstanceStatus, InstanceTags, Life, Machine, MachineId, MachineStatus,
};
use crate::service::token::{Scope, TokenRecord};

/// Containers' `seq` values start here (machines' equal their numeric ids, which never get this
/// far), so that a container never takes a `seq` a later machine's id needs: machines list in
/// id order, then containers in the order they were added.
pub(super) const CONTAINER_SEQ_BASE: i64 = 1 << 40;

/// The counts behind the metrics' state gauges, kept by the store as it writes (loaded once
/// when the database is opened), so that a scrape reads them instead of scanning tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StoreCounts {
    /// Machines by status (`pending`, `started`, ...).
    pub machines_by_status: BTreeMap<String, u64>,
    /// Machines by life.
    pub machines_by_life: BTreeMap<String, u64>,
    /// The simulated cloud's instances by state, terminated ones included.
    pub instances_by_state: BTreeMap<String, u64>,
    /// The model's life.
    pub model_life: String,
    /// Machines in error: status `error`, or instance status `provisioning error` (a failed
    /// start waiting for its retry), each machine once.
    pub machines_in_error: u64,
}

/// Whether a machine with this status and instance status is in error (as `machines_in_error`
/// counts it).
pub(super) fn in_error(status: &str, instance_status: &str) -> bool {
    status == MachineStatus::Error.as_str() || instance_status == InstanceStatus::provisioning_error().as_str()
}

/// Adds `delta` to one count; a count that reaches 0 goes (as a recount would not have it).
pub(super) fn bump(map: &mut BTreeMap<String, u64>, key: &str, delta: i64) {
    let n = map.entry(key.to_owned()).or_default();
    *n = n.saturating_add_signed(delta);
    if *n == 0 {
        map.remove(key);
    }
}

impl StoreCounts {
    fn machine_moved(&mut self, from: Option<(&str, &str)>, to: Option<(&str, &str)>) {
        if let Some((status, life)) = from {
            bump(&mut self.machines_by_status, status, -1);
            bump(&mut self.machines_by_life, life, -1);
        }
        if let Some((status, life)) = to {
            bump(&mut self.machines_by_status, status, 1);
            bump(&mut self.machines_by_life, life, 1);
        }
    }
    fn instance_moved(&mut self, from: Option<&str>, to: &str) {
        if let Some(f) = from {
            bump(&mut self.instances_by_state, f, -1);
        }
        bump(&mut self.instances_by_state, to, 1);
    }
}

/// What a backend's commits leave for the store actor to publish: the machines changed (the
/// watchers' next notification), whether a retry tick is due, and the gauges' counts. Shared by
/// both backends, so that they count and notify alike.
#[derive(Debug, Clone, Default)]
pub(super) struct Book {
    /// Machines changed since the outbox was last taken (the watcher's next notification).
    pub(super) changed: BTreeSet<MachineId>,
    /// A retry tick is due.
    pub(super) retry_due: bool,
    /// The gauges' counts, kept as the writes commit.
    pub(super) counts: StoreCounts,
    /// The counts changed since they were last taken.
    pub(super) counts_changed: bool,
}

impl Book {
    /// Counts a machine's change of status or life (after its write committed).
    pub(super) fn count_machine(&mut self, before: Option<(String, String)>, status: Option<&str>, life: Option<&str>) {
        if let Some((s, l)) = before {
            let after = (status.unwrap_or(&s).to_owned(), life.unwrap_or(&l).to_owned());
            if after != (s.clone(), l.clone()) {
                self.counts.machine_moved(Some((&s, &l)), Some((&after.0, &after.1)));
                self.counts_changed = true;
            }
        }
    }

    /// Counts and notifies machines just added in `status` (alive).
    pub(super) fn added(&mut self, ids: &[MachineId], status: MachineStatus) {
        self.changed.extend(ids.iter().cloned());
        bump(&mut self.counts.machines_by_status, status.as_str(), ids.len() as i64);
        bump(&mut self.counts.machines_by_life, Life::Alive.as_str(), ids.len() as i64);
        self.counts_changed = true;
    }

    /// A machine removed for good: `instance_status` its last, for the machines in error.
    pub(super) fn removed(&mut self, status: &str, life: &str, instance_status: &str) {
        self.counts.machine_moved(Some((status, life)), None);
        self.count_error(in_error(status, instance_status), false);
        self.counts_changed = true;
    }

    /// Counts a machine's write of its status or instance status (after it committed): `was`
    /// its status and instance status before, `status` and `instance_status` what the write
    /// set (`None`: left as they were).
    pub(super) fn count_error_of(&mut self, was: (&str, &str), status: Option<&str>, instance_status: Option<&str>) {
        let now = in_error(status.unwrap_or(was.0), instance_status.unwrap_or(was.1));
        self.count_error(in_error(was.0, was.1), now);
    }

    /// A machine went into error (`was` false, `now` true) or out of it.
    fn count_error(&mut self, was: bool, now: bool) {
        if was != now {
            let n = &mut self.counts.machines_in_error;
            *n = if now { n.saturating_add(1) } else { n.saturating_sub(1) };
            self.counts_changed = true;
        }
    }

    /// An instance created (`from` = `None`) or moved between states.
    pub(super) fn instance_moved(&mut self, from: Option<&str>, to: &str) {
        self.counts.instance_moved(from, to);
        self.counts_changed = true;
    }

    /// Takes what the watchers must hear.
    pub(super) fn take_outbox(&mut self) -> (Vec<MachineId>, bool) {
        (std::mem::take(&mut self.changed).into_iter().collect(), std::mem::take(&mut self.retry_due))
    }

    /// The counts, if they changed since the last call.
    pub(super) fn take_counts(&mut self) -> Option<StoreCounts> {
        std::mem::take(&mut self.counts_changed).then(|| self.counts.clone())
    }

    /// Marks where the book is before writes that may be undone: [`Book::keep`] adds what
    /// they recorded to what was there, [`Book::undo`] goes back to the mark.
    pub(super) fn mark(&mut self) -> BookMark {
        BookMark {
            changed: std::mem::take(&mut self.changed),
            retry_due: self.retry_due,
            counts: self.counts.clone(),
            counts_changed: self.counts_changed,
        }
    }

    /// The writes since `mark` committed (or are kept in their group): the book keeps them.
    pub(super) fn keep(&mut self, mut mark: BookMark) {
        mark.changed.append(&mut self.changed);
        self.changed = mark.changed;
    }

    /// The writes since `mark` were rolled back: the book is as it was at the mark.
    pub(super) fn undo(&mut self, mark: BookMark) {
        self.changed = mark.changed;
        self.retry_due = mark.retry_due;
        self.counts = mark.counts;
        self.counts_changed = mark.counts_changed;
    }
}

/// The book as it was before writes that may be rolled back (a group commit's, one write's in
/// it): its machines changed (moved out, so that a mark costs no copy of them), its flags and
/// its counts (a few dozen entries).
#[derive(Debug, Default)]
pub(super) struct BookMark {
    changed: BTreeSet<MachineId>,
    retry_due: bool,
    counts: StoreCounts,
    counts_changed: bool,
}

/// The model settings an operator changes at run time (`provisioner config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settings {
    /// Harvest mode, if ever set.
    pub harvest_mode: Option<HarvestMode>,
    /// Worker pool size, if ever set.
    pub workers: Option<usize>,
    /// The repair policy (issue 34), if ever set.
    pub repair: Option<crate::config::repair::RepairPolicy>,
}

impl Settings {
    /// The meta table's keys of the repair policy, in [`Settings::from_meta`]'s order.
    pub(crate) const REPAIR_KEYS: [&'static str; 4] =
        ["repair_after", "repair_max_unhealthy", "replace_drifted", "drift_budget"];

    /// The repair policy as the meta table's text values, in [`Settings::REPAIR_KEYS`]'s order.
    pub(crate) fn repair_meta(p: &crate::config::repair::RepairPolicy) -> [String; 4] {
        [
            crate::config::repair::show_repair_after(p.after),
            p.max_unhealthy.to_string(),
            p.replace_drifted.to_string(),
            p.drift_budget.to_string(),
        ]
    }

    /// Settings from the meta table's text values (a value that does not parse is not set).
    pub(crate) fn from_meta(mode: Option<String>, workers: Option<String>, repair: [Option<String>; 4]) -> Self {
        use crate::config::repair::{parse_drift_budget, parse_repair_after, parse_replace_drifted, RepairPolicy};
        let repair = match repair {
            [None, None, None, None] => None,
            [after, max, replace, budget] => {
                let d = RepairPolicy::default();
                Some(RepairPolicy {
                    after: after.and_then(|a| parse_repair_after(&a).ok()).flatten(),
                    max_unhealthy: max.and_then(|m| m.parse().ok()).unwrap_or(d.max_unhealthy),
                    replace_drifted: replace.and_then(|r| parse_replace_drifted(&r).ok()).unwrap_or(d.replace_drifted),
                    drift_budget: budget.and_then(|b| parse_drift_budget(&b).ok()).unwrap_or(d.drift_budget),
                })
            }
        };
        Settings {
            harvest_mode: mode.and_then(|m| m.parse().ok()),
            workers: workers.and_then(|w| w.parse().ok()),
            repair,
        }
    }
}

/// A machine with everything the service shows about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MachineRecord {
    /// The machine as the provisioner reads it.
    pub machine: Machine,
    /// The zone its instance landed in.
    pub zone: Option<String>,
    /// Its `zones=` constraint.
    pub zones: Option<Vec<String>>,
    /// The machine status message.
    pub status_message: String,
    /// The instance status message.
    pub instance_status_message: String,
    /// Marked for another start (`retry-provisioning`).
    pub transient: bool,
    /// Every constraint (its `zones` are [`MachineRecord::zones`]).
    pub constraints: Constraints,
    /// Its placement directive (`zone=az2`, `subnet=...`).
    pub placement: Option<String>,
    /// The application whose unit it hosts.
    pub application: Option<String>,
    /// When its row last changed (UTC, RFC 3339), as the database stamped it.
    pub changed_at: Option<String>,
    /// A manual machine's address (`machine.manual` is set).
    pub address: Option<String>,
    /// How many start attempts the provisioner reported for it (see
    /// [`StoreBackend::record_start_outcome`](super::StoreBackend::record_start_outcome)).
    pub start_attempts: u64,
    /// The last reported attempt's error (`None`: none yet, or it succeeded).
    pub last_start_error: Option<String>,
    /// Its capacity preference (issue 33).
    pub capacity: CapacityPreference,
    /// The capacity its instance runs on, as recorded with the instance (`None`: not known).
    pub capacity_type: Option<CapacityType>,
}

impl MachineRecord {
    /// The message an operator wants to see: the instance status's, else the machine's.
    pub(crate) fn message(&self) -> &str {
        if self.instance_status_message.is_empty() {
            &self.status_message
        } else {
            &self.instance_status_message
        }
    }
}

/// What new machines ask for (`POST /v1/machines`, `application add`); validated by the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NewMachine {
    /// Their constraints.
    pub constraints: Constraints,
    /// Their placement directive (`zone=az2`, `subnet=...`).
    pub placement: Option<String>,
    /// The application whose units they host.
    pub application: Option<String>,
    /// Their capacity preference (issue 33).
    pub capacity: CapacityPreference,
    /// The trace context of the request that adds them (issue 37; `None`: not traced).
    pub trace_parent: Option<String>,
}

/// A constraint set as the columns of its `constraints` row (lists comma-joined, sizes as
/// integers), as both backends insert it; `None` for no constraint (no row).
pub(super) struct ConstraintRow {
    pub(super) spec: String,
    pub(super) zones: Option<String>,
    pub(super) arch: Option<String>,
    pub(super) cores: Option<i64>,
    pub(super) mem_mb: Option<i64>,
    pub(super) root_disk_mb: Option<i64>,
    pub(super) instance_type: Option<String>,
    pub(super) spaces: Option<String>,
    pub(super) tags: Option<String>,
}

impl ConstraintRow {
    pub(super) fn of(c: &Constraints) -> Option<Self> {
        if c.is_empty() {
            return None;
        }
        let list = |v: &[String]| (!v.is_empty()).then(|| v.join(","));
        Some(Self {
            spec: c.to_string(),
            zones: c.zones.as_ref().map(|z| z.join(",")),
            arch: c.arch.clone(),
            cores: c.cores.map(i64::from),
            mem_mb: c.mem_mb.map(|n| n as i64),
            root_disk_mb: c.root_disk_mb.map(|n| n as i64),
            instance_type: c.instance_type.clone(),
            spaces: list(&c.spaces),
            tags: list(&c.tags),
        })
    }
}

/// An application, as `application list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApplicationRecord {
    /// Its name.
    pub name: String,
    /// The constraints its machines were added with.
    pub constraints: Constraints,
    /// The capacity preference its machines were added with (issue 33).
    pub capacity: CapacityPreference,
    /// Its machines that are not dead, in id order.
    pub machines: Vec<MachineId>,
}

/// A simulated cloud instance as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InstanceRecord {
    /// Id, state, zone and tags.
    pub instance: CloudInstance,
    /// The idempotency token of the start that made it.
    pub client_token: Option<String>,
}

impl InstanceRecord {
    /// An instance just created for a start with this client token.
    pub(crate) fn created(
        id: String,
        state: InstanceState,
        zone: Option<&str>,
        tags: &InstanceTags,
        client_token: &str,
    ) -> Self {
        Self {
            instance: CloudInstance {
                id: InstanceId::from(id),
                state,
                zone: zone.map(str::to_owned),
                tags: tags.clone(),
                age: None,
                instance_type: None,
                capacity_type: None,
                image: None,
            },
            client_token: Some(client_token.to_owned()),
        }
    }
}

/// A token row's columns: id, scope, created, revoked, model, model_uuid.
pub(super) type TokenRow = (String, String, String, Option<String>, Option<String>, Option<String>);

/// A row as a record; a scope this build does not know is damage, not a guess.
pub(super) fn token_record(
    (id, scope, created, revoked, model, model_uuid): TokenRow,
) -> Result<TokenRecord, StoreError> {
    let scope: Scope =
        scope.parse().map_err(|e| StoreError::Damaged { context: "reading an API token", message: e })?;
    Ok(TokenRecord { id, scope, created, revoked, model, model_uuid })
}

/// A random version-4 uuid, from the operating system's randomness.
pub(super) fn random_uuid() -> String {
    uuid::Builder::from_random_bytes(rand::random()).into_uuid().to_string()
}
