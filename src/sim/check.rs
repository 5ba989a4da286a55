//! The contract's invariants, checked over the whole run: the cloud's call log and instance
//! history (every moment, not samples) and the model's final state.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::scenario::{format_duration, Action, MachineSpec, Scenario};
use crate::fake::{CloudOp, CloudSnapshot, ModelSnapshot};
use crate::types::{HarvestMode, InstanceState, Life, MachineStatus};

/// How long before a stop call its decision may have been taken (queueing, throttling).
const DECISION_WINDOW: Duration = Duration::from_secs(120);

/// How long after a death the provisioner may take to decide its instance's fate (the batch
/// that sees it, a start still recording its instance). A mode switch within it may decide; a
/// decision made before a later switch holds, across restarts too (semantics 5).
const DECIDE_WINDOW: Duration = Duration::from_secs(2);

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

/// Whether the provisioner may not have seen a death before the mode next stopped dead
/// machines' instances: a cloud or zone listing failed in between (its batch failed and was
/// retried). It then decides under the mode in force when it first can.
fn blind_until_switch(cloud: &CloudSnapshot, modes: &ModeTimeline, died: Duration) -> bool {
    let Some(switch) =
        modes.changes.iter().map(|(at, m)| (*at, *m)).find(|(at, m)| *at > died && m.harvests_destroyed())
    else {
        return false;
    };
    let tries: Vec<&crate::fake::CallRecord> = cloud
        .calls
        .iter()
        .filter(|c| matches!(c.op, CloudOp::AllInstances | CloudOp::AvailabilityZones))
        .filter(|c| c.at >= died && c.at <= switch.0)
        .collect();
    tries.iter().any(|c| c.ok == Some(false))
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
    // Instances a stop call of ours terminated.
    let stopped_by_us: BTreeSet<String> = cloud
        .calls
        .iter()
        .filter(|c| c.op == CloudOp::StopInstances && c.ok == Some(true))
        .flat_map(|c| c.instances.iter().map(ToString::to_string))
        .collect();
    // From the first destroy_model on, every instance is stopped whatever the mode (semantics 15).
    let destroyed_from: Option<Duration> =
        s.timeline().into_iter().find(|(_, a)| matches!(a, Action::DestroyModel(_))).map(|(at, _)| at);
    // When each instance of ours landed: its start call's end (pre-existing ones: at 0).
    let landed: BTreeMap<String, Duration> = cloud
        .calls
        .iter()
        .filter(|c| c.op == CloudOp::StartInstance && c.ok == Some(true))
        .flat_map(|c| c.instances.iter().map(move |i| (i.to_string(), c.done_at.unwrap_or(c.at))))
        .collect();
    // Instances launched out of band during the run, and when (not the provisioner's doing).
    let launched: BTreeMap<String, Duration> = s
        .timeline()
        .into_iter()
        .filter_map(|(at, a)| match a {
            Action::CloudLaunch(l) => Some((l.id.clone(), at)),
            _ => None,
        })
        .collect();
    // The first stop call naming each instance.
    let mut first_stop: BTreeMap<String, Duration> = BTreeMap::new();
    for c in cloud.calls.iter().filter(|c| c.op == CloudOp::StopInstances) {
        for i in &c.instances {
            first_stop.entry(i.to_string()).or_insert(c.at);
        }
    }

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
                    // 5. An instance left alone on purpose is never stopped later, not after a restart
                    // either (semantics 5): the instance a machine records, landed before the machine
                    // died in a mode excluding destroyed (for DECIDE_WINDOW, and with no failed listing
                    // keeping the provisioner from seeing the death before a switch), unless a
                    // destroy_model came first (semantics 15) or a stop of it was sent before the death.
                    // An orphan (never recorded) may have had its stop decided while its machine lived
                    // (semantics 18).
                    let machine_of = own.and_then(|m| model.machines.get(&crate::types::MachineId::new(m)));
                    if let Some(m) = machine_of.filter(|m| m.machine.instance.as_ref() == Some(inst)) {
                        let landed_at = landed.get(&id).copied().unwrap_or_default();
                        let first = first_stop.get(&id).copied().unwrap_or(call.at);
                        if let Some(died) = m.died_at.filter(|d| landed_at <= *d && first >= *d) {
                            let kept = modes.all_between(died, died + DECIDE_WINDOW, |md| !md.harvests_destroyed())
                                && !blind_until_switch(cloud, modes, died);
                            let destroying = destroyed_from.is_some_and(|d| d <= call.at);
                            if kept && !destroying && !m.machine.keep_instance && !m.machine.manual {
                                v.push(format!(
                                    "instance {id} of machine {}, which died in mode {}, was stopped at {at}",
                                    m.machine.id,
                                    modes.at(died)
                                ));
                            }
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
        // A recorded instance that we terminated provisions nothing (a restart that adopted an
        // instance being stopped, semantics 17).
        let lost = m.machine.instance.as_ref().is_some_and(|i| {
            stopped_by_us.contains(i.as_str())
                && cloud.instances.get(i).is_some_and(|r| r.instance.state == InstanceState::Terminated)
        });
        if m.removed || m.machine.life != Life::Alive || (m.machine.instance.is_some() && !lost) {
            continue;
        }
        if lost {
            v.push(format!(
                "machine {id} is alive and records instance {}, which the provisioner stopped: it is not provisioned",
                m.machine.instance.as_ref().map(|i| i.as_str()).unwrap_or_default()
            ));
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
    // 10. A model destruction stops every instance of its non-manual, non-controller,
    // non-keep-instance machines, starts landing at that instant included (semantics 15), and,
    // without force, names the manual machines left (at 0s as later). Containers are left to
    // the container provisioners' own checks.
    let first_destroy = s.timeline().into_iter().find_map(|(at, a)| match a {
        Action::DestroyModel(d) => Some((at, d.force)),
        _ => None,
    });
    if let Some((at, force)) = first_destroy {
        for (iid, inst) in &cloud.instances {
            if inst.foreign || inst.instance.state == InstanceState::Terminated || inst.instance.tags.model.is_none() {
                continue;
            }
            let Some(m) = owner.get(iid.as_str()) else { continue };
            if launched.get(iid.as_str()).is_some_and(|l| *l > at) {
                continue;
            }
            let spared = specs.get(m).is_none_or(|s| s.manual || s.controller || s.keep_instance);
            if spared || crate::types::MachineId::new(m.as_str()).container_of().is_some() {
                continue;
            }
            v.push(format!("instance {iid} of machine {m} still {} after destroy_model", inst.instance.state));
        }
        if !force {
            let manual: Vec<&str> = model
                .machines
                .iter()
                .filter(|(id, m)| {
                    m.machine.manual
                        && !m.machine.controller
                        && id.container_of().is_none()
                        && m.died_at.is_none_or(|d| d > at)
                        && specs.get(id.as_str()).is_some_and(|s| m.died_at.is_some() || s.life != Life::Dead)
                })
                .map(|(id, _)| id.as_str())
                .collect();
            let named = model.errors.iter().any(|e| {
                e.contains("manually provisioned machines")
                    && manual.iter().all(|m| e.split([' ', ',']).any(|w| w == *m))
            });
            if !manual.is_empty() && !named {
                v.push(format!(
                    "destroy_model at {} without force left manual machines {} unnamed in the model's errors",
                    format_duration(at),
                    manual.join(", ")
                ));
            }
        }
    }

    // 9. No leak: an instance of ours tagged for a live machine is that machine's, recorded by
    // it, or gone (an orphan whose record failed is stopped, semantics 18).
    for (iid, inst) in &cloud.instances {
        if inst.foreign || inst.instance.state == InstanceState::Terminated || inst.instance.tags.model.is_none() {
            continue;
        }
        let Some(tagged) = &inst.instance.tags.machine else { continue };
        let Some(m) = model.machines.get(tagged) else { continue };
        if launched.contains_key(iid.as_str()) {
            continue;
        }
        // A container whose host died goes with its host (semantics 16), and one whose host
        // never got an instance has no container provisioner (as for invariant 7).
        let host_gone = tagged.container_of().is_some_and(|(host, _)| {
            model
                .machines
                .get(&host)
                .is_none_or(|h| h.removed || h.machine.life != Life::Alive || h.machine.instance.is_none())
        });
        // In a dying model the destruction check covers top-level machines; containers are the
        // container provisioners' (semantics 15).
        if host_gone || (model.life != Life::Alive && tagged.container_of().is_some()) {
            continue;
        }
        if m.removed || m.machine.life != Life::Alive || m.machine.manual || recorder.contains_key(iid.as_str()) {
            continue;
        }
        v.push(format!("instance {iid} tagged for live machine {tagged} is recorded by no machine (leaked)"));
    }
    v
}
