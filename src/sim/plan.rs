//! `provisioner plan FILE`: what the provisioner would do next from a scenario's initial
//! state — starts with their chosen zones, adoptions, stops, releases, removals — computed by
//! the same plain cores the actors use, without doing any of it. Events are not applied.

use serde::Serialize;

use super::run::SIM_MODEL_UUID;
use super::scenario::{InitialState, Scenario};
use crate::actors::harvest::{HarvestBook, HarvestSafety, UnknownInstance};
use crate::actors::registry::MachineBook;
use crate::actors::zones::{ZoneBook, ZoneRequest};
use crate::model::{CloudInstance, InstanceState, InstanceTags, MachineId};

/// One start the provisioner would make.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedStart {
    /// The machine.
    pub machine: String,
    /// The zone it would get (`null` on a zoneless cloud).
    pub zone: Option<String>,
}

/// A machine and what about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MachineNote {
    /// The machine.
    pub machine: String,
    /// The instance it would adopt, or why it would fail.
    pub detail: String,
}

/// What the provisioner would do next.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// StartInstance calls, in order, with their zones.
    pub starts: Vec<PlannedStart>,
    /// Pending machines that would adopt an instance already tagged for them (no start).
    pub adoptions: Vec<MachineNote>,
    /// Pending machines that would get a provisioning error, with the message.
    pub failures: Vec<MachineNote>,
    /// Dying, unprovisioned machines that would be taken to dead.
    pub ensure_dead: Vec<String>,
    /// Instances that would be stopped, in one call (dead machines' first, then unknown ones).
    pub stops: Vec<String>,
    /// Instances that would be released (left running, our identity removed).
    pub releases: Vec<String>,
    /// Dead machines that would be marked for removal.
    pub removals: Vec<String>,
    /// Unknown instances that would be harvested later, not now: younger than the harvest
    /// grace period, or held back by the cap on stops per pass.
    pub harvest_later: Vec<String>,
    /// When the harvest would look at them again (a duration such as `"4m 10s"`).
    pub harvest_again_in: Option<String>,
}

/// Plans the next step from the scenario's initial state (`seed` overrides the file's).
pub fn plan(s: &Scenario, seed: Option<u64>) -> Plan {
    let mut out = Plan::default();
    let mut book = MachineBook::new();
    book.load_view(
        s.cloud
            .instances
            .iter()
            .filter(|i| !i.foreign)
            .map(|i| CloudInstance {
                id: i.id.as_str().into(),
                state: match i.state {
                    InitialState::Running => InstanceState::Running,
                    InitialState::Stopped => InstanceState::Stopped,
                },
                zone: i.zone.clone(),
                tags: InstanceTags {
                    model: Some(SIM_MODEL_UUID.into()),
                    machine: i.machine.as_deref().map(MachineId::new),
                    start: None,
                },
                age: Some(i.age()),
                instance_type: None,
            })
            .collect(),
    );
    let reads = s.machines.iter().filter(|m| !m.id.contains('/')).map(|spec| {
        let m = spec.to_machine();
        (m.id.clone(), Ok(m))
    });
    let (refreshed, to_kill) = book.absorb(reads);
    let mut dead = refreshed.dead;
    for id in to_kill {
        out.ensure_dead.push(id.to_string());
        book.set_dead(&id);
        dead.extend(book.dead_machine(&id));
    }

    // Harvest: the first full notification ends safe mode.
    let safety = HarvestSafety {
        grace: s.provisioner.harvest_grace.0,
        max_stops: s.provisioner.harvest_max_stops,
        pass_interval: s.provisioner.resync_interval.0,
    };
    let mut harvest = HarvestBook::new(s.provisioner.harvest_mode).with_reuse(s.provisioner.reuse).with_safety(safety);
    harvest.end_safe_mode();
    let unknown: Vec<UnknownInstance> =
        book.unknown_with_ages().unwrap_or_default().into_iter().map(|(id, age)| UnknownInstance { id, age }).collect();
    let h = harvest.plan(&dead, &unknown);
    out.stops = h.stop.iter().map(ToString::to_string).collect();
    if harvest.wants_unknown() {
        out.harvest_later = unknown.iter().filter(|u| !h.stop.contains(&u.id)).map(|u| u.id.to_string()).collect();
        out.harvest_again_in = h.recheck_in.map(super::scenario::format_duration);
    }
    out.releases = h.release.iter().map(ToString::to_string).collect();
    out.removals = h
        .remove_now
        .iter()
        .chain(&h.remove_after_stop)
        .chain(&h.remove_after_release)
        .map(ToString::to_string)
        .collect();

    // Starts, in the order the batch would queue them, through the zone book.
    let mut zones = ZoneBook::new(seed.unwrap_or(s.seed));
    let mut listed: Vec<(String, bool)> = s.cloud.zones.iter().map(|z| (z.clone(), true)).collect();
    listed.extend(s.cloud.unavailable_zones.iter().map(|z| (z.clone(), false)));
    zones.update_zones(&listed);
    zones.populate(&refreshed.placements);
    let adopt: std::collections::BTreeMap<MachineId, CloudInstance> = refreshed.adopt.into_iter().collect();
    for m in refreshed.pending {
        if let Some(inst) = adopt.get(&m.id) {
            out.adoptions.push(MachineNote { machine: m.id.to_string(), detail: inst.id.to_string() });
            continue;
        }
        let Some(spec) = s.machines.iter().find(|x| x.id == m.id.as_str()) else { continue };
        if !spec.distribution_group_error.is_empty() {
            out.failures.push(MachineNote { machine: m.id.to_string(), detail: spec.distribution_group_error.clone() });
            continue;
        }
        let derived =
            s.cloud.derived_zones.iter().find(|d| d.machine == spec.id).map(|d| d.zones.clone()).unwrap_or_default();
        let group: Vec<MachineId> = spec.distribution_group.iter().flatten().map(MachineId::new).collect();
        let request = ZoneRequest {
            allowed: spec.zones.clone(),
            derived,
            group: (!group.is_empty()).then_some(group),
            ..ZoneRequest::default()
        };
        match zones.choose(&m.id, request) {
            Ok(zone) => out.starts.push(PlannedStart { machine: m.id.to_string(), zone }),
            Err(e) => out.failures.push(MachineNote { machine: m.id.to_string(), detail: e.to_string() }),
        }
    }
    out
}

impl Plan {
    /// The plan as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The plan for people.
    pub fn to_human(&self) -> String {
        let mut lines = Vec::new();
        if self.starts.is_empty() && self.adoptions.is_empty() && self.stops.is_empty() && self.failures.is_empty() {
            lines.push("nothing to do".to_owned());
        }
        for st in &self.starts {
            lines.push(format!("start machine {} in {}", st.machine, st.zone.as_deref().unwrap_or("(no zone)")));
        }
        for a in &self.adoptions {
            lines.push(format!("adopt instance {} for machine {}", a.detail, a.machine));
        }
        for f in &self.failures {
            lines.push(format!("provisioning error for machine {}: {}", f.machine, f.detail));
        }
        for m in &self.ensure_dead {
            lines.push(format!("take dying machine {m} to dead"));
        }
        if !self.stops.is_empty() {
            lines.push(format!("stop instances {}", self.stops.join(", ")));
        }
        if !self.releases.is_empty() {
            lines.push(format!("release instances {}", self.releases.join(", ")));
        }
        for m in &self.removals {
            lines.push(format!("remove dead machine {m}"));
        }
        if !self.harvest_later.is_empty() {
            let when = self.harvest_again_in.as_deref().map(|d| format!(", looking again in {d}")).unwrap_or_default();
            lines.push(format!(
                "harvest later (younger than the grace period, or over the cap per pass): {}{when}",
                self.harvest_later.join(", ")
            ));
        }
        lines.join("\n") + "\n"
    }
}
