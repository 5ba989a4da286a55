//! The store's operations as one trait, [`StoreBackend`], implemented by each backend itself:
//! SQLite in the data directory ([`StoreCore`](super::StoreCore), `sqlite/`, the embedded
//! default) and PostgreSQL (`PgStore`, `postgres/`, feature `postgres`). Both are plain and
//! synchronous: the store actor owns one on its own thread and runs every closure the API, the
//! model port and the simulated cloud send it against `&mut dyn StoreBackend`. No actix here.

use std::collections::BTreeMap;

use super::errors::StoreError;
use super::records::{ApplicationRecord, InstanceRecord, MachineRecord, NewMachine, Settings, StoreCounts};
use super::writes::{Write, Written};
use crate::model::{
    CloudInstance, Constraints, HarvestMode, InstanceId, InstanceStatus, InstanceTags, Life, Machine, MachineId,
    MachineStatus, ProvisioningInfo,
};
use crate::ports::ProvisionedInstance;
use crate::service::token::{Scope, TokenRecord};

/// The leader's fence (a plain decision of the model's, shared with the model checker).
pub(crate) use crate::model::Fence;

/// The most units of work one group commit of the store actor holds: a bound on how long the
/// first of them waits for its answer while others keep arriving (a backend may hold fewer).
pub(super) const MAX_GROUP: usize = 256;

/// Every read and write the service makes on its store. Each write is one transaction: it has
/// committed (or changed nothing) when the method returns. Reads take `&mut self` too (a
/// PostgreSQL client needs it).
pub(crate) trait StoreBackend: Send {
    /// `sqlite` or `postgres`.
    fn kind(&self) -> &'static str;

    // ---- the store's own state ---------------------------------------------------------------

    /// Makes the next commits fsynced before they return (`true`) or not.
    fn set_durable(&mut self, durable: bool) -> Result<(), StoreError>;
    /// Whether the next writes are the provisioner's own (checked against the fence, if one
    /// is set): the store actor says so before each unit of work.
    fn set_fenced(&mut self, _fenced: bool) {}
    /// Sets or clears the leader's fence. Only PostgreSQL has leases.
    fn set_fence(&mut self, _fence: Option<Fence>) -> Result<(), StoreError> {
        Err(StoreError::Refused(format!("the {} store has no leader lease to fence with", self.kind())))
    }
    /// Keeps `offer` as the API token's hash (SHA-256, hex) unless the database keeps one
    /// already, and answers the one it keeps. SQLite keeps none (the token file in the data
    /// directory is the token): it answers `offer`.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn api_token_hash(&mut self, offer: &str) -> Result<String, StoreError> {
        Ok(offer.to_owned())
    }
    /// Takes what the watchers must hear: the machines changed since the last call, and
    /// whether a retry tick is due.
    fn take_outbox(&mut self) -> (Vec<MachineId>, bool);
    /// The gauges' counts as of the last commit.
    fn counts(&self) -> &StoreCounts;
    /// The counts, if they changed since the last call.
    fn take_counts(&mut self) -> Option<StoreCounts>;
    /// Counts every machine and instance (one scan).
    fn recount(&mut self) -> Result<StoreCounts, StoreError>;
    /// Recounts the gauges' counts when another session changed the database: after a
    /// reconnection (`resync`), or when one of `senders` (the backend process ids of the
    /// sessions that notified changes) is not this store's. The counts are then published as
    /// any write's are. A store that alone writes its database (SQLite) has nothing to do.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn refresh_counts(&mut self, resync: bool, senders: &[i32]) -> Result<(), StoreError> {
        let _ = (resync, senders);
        Ok(())
    }
    /// The database session this store writes on, if it has one (PostgreSQL's backend process
    /// id, which its change notifications carry).
    fn session_pid(&self) -> Option<i32> {
        None
    }
    /// Remembers damage an operation ran into.
    fn note_damage(&mut self, e: &StoreError);
    /// The store has been idle a while: gives back the memory it keeps only to go faster (its
    /// prepared statements, its page cache), outside a group. Nothing by default.
    fn shed_memory(&mut self) {}
    /// Its lane ends its turn (no group is open): a connection it borrowed from its lane goes
    /// back (PostgreSQL's pooled stores). Nothing by default.
    fn release_connection(&mut self) {}

    // ---- group commit (the store actor's) ------------------------------------------------------

    /// Opens a group commit: the units of work until [`StoreBackend::commit_group`] share one
    /// transaction, each in a savepoint of its own, and commit together (fsynced once for all
    /// if `durable`). `Ok(false)`: this backend commits each write alone, and the store actor
    /// runs each unit of work by itself. Both backends group.
    fn begin_group(&mut self, durable: bool) -> Result<bool, StoreError> {
        let _ = durable;
        Ok(false)
    }
    /// Whether the open group, holding `units` units of work whose answers wait for its
    /// commit, must commit now rather than take in more: at `MAX_GROUP` of the store actor's by
    /// default.
    fn group_full(&self, units: usize) -> bool {
        units >= MAX_GROUP
    }
    /// Makes the open group durable (its commit waits for the disk), so that a durable unit
    /// of work can join it; `false` if this backend cannot (SQLite sets its safety level
    /// outside a transaction only), and the group must commit first.
    fn raise_group_durability(&mut self) -> bool {
        false
    }
    /// A unit of work of the open group begins (its savepoint).
    fn begin_member(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    /// The unit of work ends: kept in the group, or rolled back alone. An error: the group's
    /// transaction is gone, and the group must be aborted.
    fn end_member(&mut self, keep: bool) -> Result<(), StoreError> {
        let _ = keep;
        Ok(())
    }
    /// Whether the open group has written anything yet.
    fn group_has_written(&self) -> bool {
        false
    }
    /// Commits the open group: every unit of work kept in it is committed (on disk, if the
    /// group is durable) when this returns `Ok`; none is on an error.
    fn commit_group(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Abandons the open group: nothing of it is written, the outbox and counts are as before.
    fn abort_group(&mut self) {}
    /// Queues a write-behind unit of work in the open group, outside any other unit: its
    /// statements go out with the group's commit and its answer is one of
    /// [`StoreBackend::take_deferred`]'s. `Some(write)`, given back: this backend does not queue
    /// it (SQLite, or no group open), and the store actor runs it as any unit of work
    /// ([`Write::apply`]).
    fn defer(&mut self, write: Write) -> Option<Write> {
        Some(write)
    }
    /// The answers of the writes the group that just committed had queued
    /// ([`StoreBackend::defer`]), in the order queued (each its own: one that failed wrote
    /// nothing and did not undo the others). Empty after a group that failed.
    fn take_deferred(&mut self) -> Vec<Result<Written, StoreError>> {
        Vec::new()
    }
    /// Whether the store can be read now (`/healthz`, `/readyz`).
    fn check_readable(&mut self) -> Result<(), StoreError>;
    /// Whether the store answers now (a leader's lease probe, every lease retry): by default a
    /// read of the model's life; a backend whose connection answered a moment ago may say so
    /// without asking the database again (PostgreSQL: a lane's models share one connection,
    /// so a round of probes costs a query per lane, not one per model).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn check_alive(&mut self) -> Result<(), StoreError> {
        self.model_life().map(|_| ())
    }

    // ---- the model ---------------------------------------------------------------------------

    /// The model's uuid (tagged on every instance).
    fn model_uuid(&mut self) -> Result<String, StoreError>;
    /// The model's life.
    fn model_life(&mut self) -> Result<Life, StoreError>;
    /// One machine.
    fn machine(&mut self, id: &MachineId) -> Result<Option<MachineRecord>, StoreError>;
    /// Every machine, in id order.
    fn list_machines(&mut self) -> Result<Vec<MachineRecord>, StoreError>;
    /// Every machine's id, in id order.
    fn machine_ids(&mut self) -> Result<Vec<MachineId>, StoreError>;
    /// Records a machine's instance; the machine becomes `started`.
    fn set_instance_info(&mut self, id: &MachineId, info: &ProvisionedInstance) -> Result<(), StoreError>;
    /// Writes a machine status.
    fn set_status(&mut self, id: &MachineId, status: MachineStatus, message: &str) -> Result<(), StoreError>;
    /// Writes an instance status.
    fn set_instance_status(&mut self, id: &MachineId, status: &InstanceStatus, message: &str)
        -> Result<(), StoreError>;
    /// Counts one start attempt of a machine and keeps its outcome: `error` is the failed
    /// attempt's message, `None` a success (which clears the last error).
    fn record_start_outcome(&mut self, id: &MachineId, error: Option<&str>) -> Result<(), StoreError>;
    /// Records the instance a start made ([`StoreBackend::set_instance_info`]) and counts that
    /// start as a successful attempt ([`StoreBackend::record_start_outcome`] with no error), in
    /// one write: the model port's record of every start. SQLite makes it one statement.
    fn record_started_instance(&mut self, id: &MachineId, info: &ProvisionedInstance) -> Result<(), StoreError> {
        self.set_instance_info(id, info)?;
        self.record_start_outcome(id, None)
    }
    /// Takes a machine to dead (notifies if it was not).
    fn ensure_dead(&mut self, id: &MachineId) -> Result<(), StoreError>;
    /// Removes a dead machine for good.
    fn mark_for_removal(&mut self, id: &MachineId) -> Result<(), StoreError>;
    /// Makes the model dying and returns every machine at that moment.
    fn destroy_model(&mut self) -> Result<Vec<Machine>, StoreError>;
    /// Asks for these machines to be removed, all or none.
    fn remove_machines(&mut self, ids: &[MachineId], keep_instance: bool, force: bool) -> Result<(), StoreError>;
    /// Marks machines in provisioning error for another start, all or none.
    fn retry_machines(&mut self, ids: &[MachineId]) -> Result<(), StoreError>;
    /// Replaces a live machine's constraints (the caller has validated them): its constraint
    /// row as [`StoreBackend::add_new_machines`] stores one (none for an empty set), and the
    /// machine notified as changed. [`StoreError::NotFound`] for an unknown machine;
    /// [`StoreError::Refused`] for one not alive or manual. Later starts read the new ones.
    fn set_constraints(&mut self, id: &MachineId, constraints: &Constraints) -> Result<(), StoreError>;
    /// The settings changed at run time.
    fn settings(&mut self) -> Result<Settings, StoreError>;
    /// Persists the harvest mode.
    fn set_harvest_mode(&mut self, mode: HarvestMode) -> Result<(), StoreError>;
    /// Persists the worker pool size.
    fn set_workers(&mut self, workers: usize) -> Result<(), StoreError>;
    /// Persists the repair policy (issue 34).
    fn set_repair(&mut self, policy: crate::config::repair::RepairPolicy) -> Result<(), StoreError>;
    /// Adds `count` new alive, pending machines like `spec`, in one transaction.
    fn add_new_machines(&mut self, count: usize, spec: &NewMachine) -> Result<Vec<MachineId>, StoreError>;
    /// Adds an application and machines for its units, in one transaction.
    fn add_application(
        &mut self,
        name: &str,
        units: usize,
        constraints: &Constraints,
        capacity: crate::model::CapacityPreference,
    ) -> Result<Vec<MachineId>, StoreError>;
    /// Every application, by name.
    fn applications(&mut self) -> Result<Vec<ApplicationRecord>, StoreError>;
    /// The machines of an application that are not dead, in id order.
    fn application_machines(&mut self, name: &str) -> Result<Vec<MachineId>, StoreError>;
    /// Removes an application: its machines become dead. Returns them.
    fn remove_application(&mut self, name: &str) -> Result<Vec<MachineId>, StoreError>;
    /// Adds containers of `kind` on an alive `host`.
    fn add_containers(&mut self, host: &MachineId, kind: &str, count: usize) -> Result<Vec<MachineId>, StoreError>;
    /// Registers a manually provisioned machine.
    fn add_manual(&mut self, address: &str) -> Result<MachineId, StoreError>;
    /// The containers on `host` that are not dead, in id order.
    fn live_containers_of(&mut self, host: &MachineId) -> Result<Vec<MachineId>, StoreError>;
    /// The live manual machines, in id order.
    fn live_manual_machines(&mut self) -> Result<Vec<MachineId>, StoreError>;
    /// How many machines are in error (`status` error, or `provisioning error` as instance
    /// status), read through a partial index of those machines: `/v1/status` counts them without
    /// reading every machine.
    fn machines_in_error(&mut self) -> Result<u64, StoreError>;

    // ---- start intents (see `service::cloud::intents`) ------------------------------------------------

    /// Writes a start's intent before its cloud call: its client token (the key), its machine
    /// and its parameters as JSON. Writing the same token again keeps the first row.
    fn put_start_intent(&mut self, client_token: &str, machine: &MachineId, params: &str) -> Result<(), StoreError>;
    /// The start is settled (an instance, or a definite refusal): its intent goes.
    fn drop_start_intent(&mut self, client_token: &str) -> Result<(), StoreError>;
    /// Every intent not yet settled, oldest first: their parameters as written.
    fn start_intents(&mut self) -> Result<Vec<String>, StoreError>;

    // ---- API tokens (hashes only) -------------------------------------------------------------

    /// Creates an API token: the next id (`tok-N`, never reused), its scope, the token's
    /// SHA-256, created at `created` (RFC 3339).
    /// `model`: the model's name and uuid (the token is valid for that model only).
    fn create_token(
        &mut self,
        scope: Scope,
        model: Option<(&str, &str)>,
        sha256: &str,
        created: &str,
    ) -> Result<TokenRecord, StoreError>;
    /// Revokes at `at` every token scoped to model `name` of uuid `uuid` (and those scoped to
    /// `name` made before uuids were kept): the model was destroyed. The tokens revoked now.
    fn revoke_model_tokens(&mut self, name: &str, uuid: &str, at: &str) -> Result<Vec<TokenRecord>, StoreError>;
    /// Every created token, oldest first.
    fn tokens(&mut self) -> Result<Vec<TokenRecord>, StoreError>;
    /// The created token whose SHA-256 this is, revoked or not.
    fn token_by_hash(&mut self, sha256: &str) -> Result<Option<TokenRecord>, StoreError>;
    /// Revokes a token at `at` (RFC 3339); one revoked already keeps its first time.
    /// [`StoreError::NoToken`] if no created token has this id.
    fn revoke_token(&mut self, id: &str, at: &str) -> Result<TokenRecord, StoreError>;

    // ---- the simulated cloud's instances -----------------------------------------------------

    /// Creates a pending instance for a start, or returns the one this client token made.
    fn create_instance(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
    ) -> Result<(InstanceRecord, bool), StoreError>;
    /// Creates an instance already running, for a start with no latency to wait (its creation
    /// and its landing as one write), or returns the one this client token made, as it is
    /// (`false`: not new; landing it is the caller's, once the repeat is known to be the same
    /// start). SQLite writes it running at once.
    fn create_running_instance(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
    ) -> Result<(InstanceRecord, bool), StoreError> {
        let (record, new) = self.create_instance(client_token, zone, tags)?;
        if !new {
            return Ok((record, false));
        }
        let landed = self.land_instance(&record.instance.id)?;
        Ok((landed.unwrap_or(record), true))
    }
    /// One instance.
    #[cfg(test)]
    fn instance(&mut self, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError>;
    /// A pending instance comes up. Returns it.
    fn land_instance(&mut self, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError>;
    /// Every instance ever created, in creation order.
    #[cfg(test)]
    fn all_instances(&mut self) -> Result<Vec<InstanceRecord>, StoreError>;
    /// The non-terminated instances tagged with this model.
    fn live_instances(&mut self, model: &str) -> Result<Vec<CloudInstance>, StoreError>;
    /// Terminates instances (unknown ids are ignored).
    fn terminate_instances(&mut self, ids: &[InstanceId]) -> Result<(), StoreError>;
    /// Removes our model's tag from instances.
    fn release_instances(&mut self, ids: &[InstanceId]) -> Result<(), StoreError>;
    /// Gives a live instance new identity tags; `false` if it is not there or terminated.
    fn retag_instance(&mut self, id: &InstanceId, tags: &InstanceTags) -> Result<bool, StoreError>;
    /// The ids of instances still pending.
    fn pending_instances(&mut self) -> Result<Vec<InstanceId>, StoreError>;

    // ---- derived: the same for both backends ---------------------------------------------------

    /// Adds `count` machines with this `zones=` constraint.
    #[cfg(test)]
    fn add_machines(&mut self, count: usize, zones: Option<&[String]>) -> Result<Vec<MachineId>, StoreError> {
        let spec = NewMachine {
            constraints: Constraints { zones: zones.map(<[String]>::to_vec), ..Constraints::default() },
            ..NewMachine::default()
        };
        self.add_new_machines(count, &spec)
    }
    /// These machines, in request order (`None` for a missing one).
    #[cfg(test)]
    fn machines(&mut self, ids: &[MachineId]) -> Result<Vec<Option<MachineRecord>>, StoreError> {
        ids.iter().map(|id| self.machine(id)).collect()
    }
    /// A machine as the provisioner reads it (the model port's `machines`, at every change of
    /// every machine): its [`Machine`] alone. SQLite reads only those columns.
    fn model_machine(&mut self, id: &MachineId) -> Result<Option<Machine>, StoreError> {
        Ok(self.machine(id)?.map(|m| m.machine))
    }
    /// What a start of a machine needs to know of it: its constraints and its placement
    /// directive (`None`: no such machine). SQLite reads only those columns.
    fn machine_provisioning(&mut self, id: &MachineId) -> Result<Option<ProvisioningInfo>, StoreError> {
        Ok(self.machine(id)?.map(|m| ProvisioningInfo {
            constraints: m.constraints,
            placement: m.placement,
            capacity: m.capacity,
            ..ProvisioningInfo::default()
        }))
    }
    /// The application whose unit a machine hosts (`Some(None)`: none; `None`: no such
    /// machine). SQLite reads only that column.
    fn machine_application(&mut self, id: &MachineId) -> Result<Option<Option<String>>, StoreError> {
        Ok(self.machine(id)?.map(|m| m.application))
    }
    /// [`StoreBackend::model_machine`] of each of these machines, in request order.
    /// PostgreSQL reads them in one statement.
    fn model_machines(&mut self, ids: &[MachineId]) -> Result<Vec<Option<Machine>>, StoreError> {
        ids.iter().map(|id| self.model_machine(id)).collect()
    }
    /// [`StoreBackend::machine_application`] of each of these machines, in request order.
    /// PostgreSQL reads them in one statement.
    fn machine_applications(&mut self, ids: &[MachineId]) -> Result<Vec<Option<Option<String>>>, StoreError> {
        ids.iter().map(|id| self.machine_application(id)).collect()
    }
    /// Alive, unprovisioned machines in provisioning error that were marked for a retry.
    fn transient_errors(&mut self) -> Result<Vec<Machine>, StoreError> {
        Ok(self
            .list_machines()?
            .into_iter()
            .filter(|m| m.transient && m.machine.instance.is_none() && m.machine.instance_status.is_error())
            .map(|m| m.machine)
            .collect())
    }
    /// Provisioning info: the constraints and the placement directive.
    fn provisioning_info(&mut self, ids: &[MachineId]) -> Result<Vec<Option<ProvisioningInfo>>, StoreError> {
        ids.iter().map(|id| self.machine_provisioning(id)).collect()
    }
    /// The zone recorded with a machine's instance.
    fn availability_zone(&mut self, id: &MachineId) -> Result<Option<String>, StoreError> {
        Ok(self.machine(id)?.and_then(|m| m.zone))
    }
    /// Each machine's distribution group (the other live machines of its application).
    fn distribution_groups(&mut self, ids: &[MachineId]) -> Result<Vec<Option<Vec<MachineId>>>, StoreError> {
        let mut groups: BTreeMap<String, Vec<MachineId>> = BTreeMap::new();
        let mut out = Vec::with_capacity(ids.len());
        for (id, application) in ids.iter().zip(self.machine_applications(ids)?) {
            let Some(application) = application else {
                out.push(None);
                continue;
            };
            let group = match application {
                None => Vec::new(),
                Some(app) => {
                    if !groups.contains_key(&app) {
                        let members = self.application_machines(&app)?;
                        groups.insert(app.clone(), members);
                    }
                    groups[&app].iter().filter(|g| *g != id).cloned().collect()
                }
            };
            out.push(Some(group));
        }
        Ok(out)
    }
}

/// A write-behind unit run alone (see `writes.rs`).
impl Write {
    /// Runs it as a unit of work on `s` (the slow path, and every backend that does not queue
    /// it).
    pub(crate) fn apply(&self, s: &mut dyn StoreBackend) -> Result<Written, StoreError> {
        match self {
            Write::MachineStatus { id, status, message } => s.set_status(id, *status, message).map(|()| Written::Done),
            Write::InstanceStatus { id, status, message, failed_attempt } => {
                s.set_instance_status(id, status, message)?;
                if let Some(error) = failed_attempt {
                    s.record_start_outcome(id, Some(error))?;
                }
                Ok(Written::Done)
            }
            Write::StartedInstance { id, info } => s.record_started_instance(id, info).map(|()| Written::Done),
            Write::NewInstance { client_token, zone, tags, running: true } => s
                .create_running_instance(client_token, zone.as_deref(), tags)
                .map(|(record, new)| Written::Instance(record, new)),
            Write::NewInstance { client_token, zone, tags, running: false } => s
                .create_instance(client_token, zone.as_deref(), tags)
                .map(|(record, new)| Written::Instance(record, new)),
            Write::LandInstance { id } => s.land_instance(id).map(Written::Landed),
            Write::AddMachines { count, spec } => s.add_new_machines(*count, spec).map(Written::Added),
        }
    }
}

/// Refuses a change of constraints to a machine that is not alive (its constraints no longer
/// matter) or is manual (never started by the provisioner). Both backends.
pub(super) fn refuse_constraints_change(id: &MachineId, life: &str, manual: bool) -> Result<(), StoreError> {
    if manual {
        return Err(StoreError::Refused(format!(
            "machine {id} is a manual machine: the provisioner never starts it, so it has no constraints to change"
        )));
    }
    if life != Life::Alive.as_str() {
        return Err(StoreError::Refused(format!("machine {id} is {life}: only an alive machine's constraints change")));
    }
    Ok(())
}

/// Refuses (nothing written) the removal of a host whose live containers are not removed with
/// it: a removal without `force` must name them, or they would die unasked. Both backends.
pub(super) fn refuse_hosts_with_live_containers(s: &mut dyn StoreBackend, ids: &[MachineId]) -> Result<(), StoreError> {
    let asked: std::collections::BTreeSet<&MachineId> = ids.iter().collect();
    for id in ids.iter().collect::<std::collections::BTreeSet<_>>() {
        let left: Vec<String> =
            s.live_containers_of(id)?.into_iter().filter(|c| !asked.contains(c)).map(|c| c.to_string()).collect();
        if !left.is_empty() {
            return Err(StoreError::Refused(format!(
                "machine {id} hosts live containers {}: remove them first, or remove the host with --force \
                 (API: \"force\": true) to take them with it",
                left.join(", ")
            )));
        }
    }
    Ok(())
}
