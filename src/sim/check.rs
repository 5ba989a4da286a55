//! The contract's invariants, checked over the whole run: the cloud's call log and instance
//! history (every moment, not samples) and the model's final state.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::scenario::{format_duration, Action, MachineSpec, Scenario};
use crate::fake::{CloudOp, CloudSnapshot, ModelSnapshot};
use crate::types::{HarvestMode, InstanceState, Life, MachineStatus};

/// How long before a stop call its decision may have been taken (queueing, throttling).
const DECISION_WINDOW: Duration = Duration::from_secs(120);

/// The harvest mode in force over time (from the scenario's model-config changes).
#[derive(Debug, Clone)]
pub struct ModeTimeline {
    changes: Vec<(Duration, HarvestMode)>,
}

impl ModeTimeline {
    /// Starts in `initial`.
    pub fn new(initial: HarvestMode) -> Self {
        Self { changes: vec![(Duration::ZERO, initial)] }
    }

    /// The mode becomes `mode` at `at`.
    pub fn set(&mut self, at: Duration, mode: HarvestMode) {
        if at.is_zero() {
            self.changes = vec![(Duration::ZERO, mode)];
        } else {
            self.changes.push((at, mode));
        }
    }

    /// The mode at `t`.
    pub fn at(&self, t: Duration) -> HarvestMode {
        self.changes.iter().rev().find(|(at, _)| *at <= t).map(|(_, m)| *m).unwrap_or_default()
    }

    /// Whether some mode in force during `[from, to]` satisfies `f` (a stop decided under one
    /// mode may land after a change).
    pub fn any_between(&self, from: Duration, to: Duration, f: impl Fn(HarvestMode) -> bool) -> bool {
        f(self.at(from)) || self.changes.iter().any(|(at, m)| *at >= from && *at <= to && f(*m))
    }

    /// Whether every mode in force during `[from, to]` satisfies `f`.
    pub fn all_between(&self, from: Duration, to: Duration, f: impl Fn(HarvestMode) -> bool) -> bool {
        f(self.at(from)) && self.changes.iter().all(|(at, m)| *at < from || *at > to || f(*m))
    }
}

fn all_machines(s: &Scenario) -> BTreeMap<String, MachineSpec> {
    let mut out: BTreeMap<String, MachineSpec> = s.machines.iter().map(|m| (m.id.clone(), m.clone())).collect();
    for (_, a) in s.timeline() {
        if let Action::AddMachine(m) = a {
            out.insert(m.id.clone(), m);
        }
    }
    out
}

/// The zones open to new instances over time: the cloud's list less its unavailable zones,
/// from the scenario's initial cloud and its `set_zones` events (contract semantics 12).
struct ZoneTimeline {
    changes: Vec<(Duration, BTreeSet<String>)>,
}

impl ZoneTimeline {
    fn new(s: &Scenario) -> Self {
        let open = |zones: &[String], unavailable: &[String]| -> BTreeSet<String> {
            zones.iter().filter(|z| !unavailable.contains(z)).cloned().collect()
        };
        let mut changes = vec![(Duration::ZERO, open(&s.cloud.zones, &s.cloud.unavailable_zones))];
        for (at, a) in s.timeline() {
            if let Action::SetZones(z) = a {
                changes.push((at, open(&z.zones, &z.unavailable_zones)));
            }
        }
        Self { changes }
    }

    /// Whether `zone` was closed at `t`, under the list in force then and under the one before
    /// a change made at that very instant (either order of two events at one instant is fine).
    fn closed_at(&self, zone: &str, t: Duration) -> bool {
        let mut closed = true;
        let mut seen = false;
        for (at, open) in self.changes.iter().filter(|(at, _)| *at <= t).rev() {
            closed &= !open.contains(zone);
            if seen || *at < t {
                break;
            }
            seen = true;
        }
        closed
    }
}

/// The simulated cloud's own contract (semantics 12, 13): no start is accepted into a zone
/// closed to new instances, and no new instance takes the id of one that exists or existed.
fn check_cloud(s: &Scenario, cloud: &CloudSnapshot, v: &mut Vec<String>) {
    if !s.cloud.zones.is_empty() || !s.cloud.unavailable_zones.is_empty() {
        let zones = ZoneTimeline::new(s);
        // The call that made an instance is the first to name it (a repeat of its client token
        // names it again later, when the zone may have closed meanwhile).
        let mut made: BTreeSet<&crate::types::InstanceId> = BTreeSet::new();
        for call in cloud.calls.iter().filter(|c| c.op == CloudOp::StartInstance) {
            let new = call.instances.iter().filter(|id| made.insert(id)).count() > 0;
            if let (true, Some(zone), Some(m)) = (new, &call.zone, &call.machine) {
                if zones.closed_at(zone, call.at) {
                    let at = format_duration(call.at);
                    v.push(format!("machine {m} was started in zone {zone}, closed to new instances, at {at}"));
                }
            }
        }
    }
    let mut preexisting: BTreeSet<String> = s.cloud.instances.iter().map(|i| i.id.clone()).collect();
    for (_, a) in s.timeline() {
        if let Action::CloudLaunch(l) = a {
            preexisting.insert(l.id);
        }
    }
    let mut made_for: BTreeMap<String, String> = BTreeMap::new();
    for call in cloud.calls.iter().filter(|c| c.op == CloudOp::StartInstance && c.ok == Some(true)) {
        let m = call.machine.as_ref().map(ToString::to_string).unwrap_or_default();
        for inst in &call.instances {
            let id = inst.to_string();
            if preexisting.contains(&id) {
                v.push(format!("the cloud gave machine {m}'s new instance the id {id} of an existing instance"));
            }
            match made_for.get(&id) {
                Some(other) if *other != m => {
                    v.push(format!("the cloud gave instance id {id} to machines {other} and {m}"));
                }
                _ => {
                    made_for.insert(id, m.clone());
                }
            }
        }
    }
}

/// Every broken invariant, as sentences naming the machine or instance.
pub fn check(s: &Scenario, cloud: &CloudSnapshot, model: &ModelSnapshot, modes: &ModeTimeline) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    let specs = all_machines(s);
    let derived: BTreeMap<&str, &Vec<String>> =
        s.cloud.derived_zones.iter().map(|d| (d.machine.as_str(), &d.zones)).collect();

    // Whose instance is it: the machine recording it (`recorder`), else the machine named in
    // its tags (`owner`).
    let mut recorder: BTreeMap<String, String> = BTreeMap::new();
    // Removed machines first: a live machine that took an instance over (reuse) wins.
    let (gone, live): (Vec<_>, Vec<_>) = model.machines.iter().partition(|(_, m)| m.removed);
    for (id, m) in gone.into_iter().chain(live) {
        if let Some(inst) = &m.machine.instance {
            recorder.insert(inst.to_string(), id.to_string());
        }
    }
    let mut owner = recorder.clone();
    for (id, inst) in &cloud.instances {
        if let Some(m) = &inst.instance.tags.machine {
            owner.entry(id.to_string()).or_insert_with(|| m.to_string());
        }
    }
    // Instances the provisioner started (invariant 1 is about those).
    let started: BTreeSet<String> = cloud
        .calls
        .iter()
        .filter(|c| c.op == CloudOp::StartInstance && c.ok == Some(true))
        .flat_map(|c| c.instances.iter().map(ToString::to_string))
        .collect();
    let protected = |machine: &str, f: fn(&MachineSpec) -> bool| specs.get(machine).is_some_and(f);

    check_cloud(s, cloud, &mut v);

    // 1. Never two live instances for one machine (checked at every creation, and at the end).
    v.extend(cloud.duplicates.iter().cloned());
    let mut live: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (id, inst) in &cloud.instances {
        if inst.foreign || inst.instance.state == InstanceState::Terminated {
            continue;
        }
        let id = id.to_string();
        let theirs = inst.instance.tags.machine.as_ref().map(ToString::to_string).filter(|_| started.contains(&id));
        if let Some(m) = theirs.or_else(|| recorder.get(&id).cloned()) {
            live.entry(m).or_default().push(id);
        }
    }
    for (m, ids) in live {
        if ids.len() > 1 && !cloud.duplicates.iter().any(|d| d.starts_with(&format!("machine {m} "))) {
            v.push(format!("machine {m} has two live instances: {}", ids.join(", ")));
        }
    }

    for call in &cloud.calls {
        let at = format_duration(call.at);
        match call.op {
            CloudOp::StopInstances => {
                for inst in &call.instances {
                    let id = inst.to_string();
                    let rec = cloud.instances.get(inst);
                    // 2. Foreign instances are never stopped.
                    if rec.is_some_and(|r| r.foreign) {
                        v.push(format!("foreign instance {id} was stopped at {at}"));
                        continue;
                    }
                    let own = owner.get(&id);
                    // 3. / 4. Manual and keep-instance machines' instances are never stopped.
                    if let Some(m) = recorder.get(&id) {
                        if protected(m, |s| s.manual) {
                            v.push(format!("instance {id} of manual machine {m} was stopped at {at}"));
                        }
                        if protected(m, |s| s.keep_instance) {
                            v.push(format!("instance {id} of keep-instance machine {m} was stopped at {at}"));
                        }
                    }
                    // 6. Unknown instances are stopped only in modes unknown and all.
                    let known = own.is_some_and(|m| model.machines.contains_key(&crate::types::MachineId::new(m)));
                    let mode = modes.at(call.at);
                    let window = call.at.saturating_sub(DECISION_WINDOW);
                    if !known && !modes.any_between(window, call.at, HarvestMode::harvests_unknown) {
                        v.push(format!("unknown instance {id} was stopped at {at} in mode {mode}"));
                    }
                }
            }
            CloudOp::StartInstance => {
                let Some(m) = call.machine.as_ref().map(ToString::to_string) else { continue };
                // 3. Manual machines are never started.
                if protected(&m, |s| s.manual) {
                    v.push(format!("manual machine {m} was started at {at}"));
                }
                // 8. Zones stay within the constraint and the derived zones.
                if let Some(zone) = &call.zone {
                    if let Some(allowed) = specs.get(&m).and_then(|s| s.zones.as_ref()) {
                        if !allowed.contains(zone) {
                            v.push(format!("machine {m} was started in zone {zone} outside its zones constraint {allowed:?} at {at}"));
                        }
                    }
                    if let Some(d) = derived.get(m.as_str()).filter(|d| !d.is_empty()) {
                        if !d.contains(zone) {
                            v.push(format!(
                                "machine {m} was started in zone {zone} outside its derived zones {d:?} at {at}"
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
    }

    // 5. Removed machines' instances are terminated (modes destroyed/all at death, not kept).
    for (id, m) in &model.machines {
        if !m.removed || m.machine.keep_instance || m.machine.manual {
            continue;
        }
        let died = m.died_at.unwrap_or_default();
        let removed = m.removed_at.unwrap_or(died);
        if !modes.all_between(died, removed, HarvestMode::harvests_destroyed) {
            continue;
        }
        let mut theirs: BTreeSet<String> = BTreeSet::new();
        if let Some(inst) = &m.machine.instance {
            theirs.insert(inst.to_string());
        }
        for (iid, inst) in &cloud.instances {
            if inst.instance.tags.machine.as_ref() == Some(id) && !inst.foreign {
                theirs.insert(iid.to_string());
            }
        }
        for inst in theirs {
            // Handed over to another machine (machine reuse): no longer this one's.
            if recorder.get(&inst).is_some_and(|r| r != &id.to_string()) {
                continue;
            }
            if let Some(rec) = cloud.instances.get(&crate::types::InstanceId::new(&inst)) {
                if rec.instance.state != InstanceState::Terminated {
                    v.push(format!("removed machine {id} left instance {inst} {}", rec.instance.state));
                }
            }
        }
    }

    // 7. Every alive, non-manual machine that was pending is provisioned or in error (a dying
    // model provisions nothing new).
    for (id, spec) in specs.iter().filter(|_| model.life == Life::Alive) {
        if spec.manual || spec.status != MachineStatus::Pending || spec.life != Life::Alive {
            continue;
        }
        // A container is provisioned once its host is: only if the host is alive and has one.
        if let Some((host, _)) = crate::types::MachineId::new(id.as_str()).container_of() {
            let host_ready = model
                .machines
                .get(&host)
                .is_some_and(|h| !h.removed && h.machine.life == Life::Alive && h.machine.instance.is_some());
            if !host_ready {
                continue;
            }
        }
        let Some(m) = model.machines.get(&crate::types::MachineId::new(id)) else { continue };
        if m.removed || m.machine.life != Life::Alive || m.machine.instance.is_some() {
            continue;
        }
        let errored = m.machine.instance_status.is_error() && !m.instance_status_message.is_empty();
        if !errored {
            v.push(format!(
                "machine {id} is alive and pending but neither provisioned nor in provisioning error (instance status {:?})",
                m.machine.instance_status.as_str()
            ));
        }
    }
    v
}
