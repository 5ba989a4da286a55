//! The contract's invariants, checked over the whole run: the cloud's call log and instance
//! history (every moment, not samples) and the model's final state.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::scenario::{format_duration, Action, MachineSpec, Scenario};
use crate::model::{HarvestMode, InstanceState, Life, MachineStatus};
use crate::testing::{CloudOp, CloudSnapshot, ModelSnapshot};

/// How long before a stop call its decision may have been taken (queueing, throttling).
const DECISION_WINDOW: Duration = Duration::from_secs(120);

/// How long after a death the provisioner may take to decide its instance's fate (the batch
/// that sees it, a start still recording its instance). A mode switch within it may decide; a
/// decision made before a later switch holds, across restarts too (a release is never undone).
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
    let tries: Vec<&crate::testing::CallRecord> = cloud
        .calls
        .iter()
        .filter(|c| matches!(c.op, CloudOp::AllInstances | CloudOp::AvailabilityZones))
        .filter(|c| c.at >= died && c.at <= switch.0)
        .collect();
    // A batch failing when the machine died (its last listing before the death failed) is
    // retried with backoff, maybe only after the switch: blind too.
    let failing_then = cloud
        .calls
        .iter()
        .filter(|c| matches!(c.op, CloudOp::AllInstances | CloudOp::AvailabilityZones))
        .rfind(|c| c.at <= died)
        .is_some_and(|c| c.ok == Some(false));
    failing_then || tries.iter().any(|c| c.ok == Some(false))
}

fn all_machines(s: &Scenario) -> BTreeMap<String, MachineSpec> {
    let mut out: BTreeMap<String, MachineSpec> = s.machines.iter().map(|m| (m.id.clone(), m.clone())).collect();
    for (_, a) in s.timeline() {
        if let Action::AddMachine(m) = a {
            out.insert(m.id.clone(), *m);
        }
    }
    out
}

/// The zones open to new instances over time: the cloud's list less its unavailable zones, from the
/// scenario's initial cloud and its `set_zones` events (a zone listed as unavailable takes no new
/// instance).
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

/// The instances named by the successful calls of `op` (those begun before `before`, if given).
fn succeeded(cloud: &CloudSnapshot, op: CloudOp, before: Option<Duration>) -> BTreeSet<String> {
    cloud
        .calls
        .iter()
        .filter(|c| c.op == op && c.ok == Some(true) && before.is_none_or(|b| c.at < b))
        .flat_map(|c| c.instances.iter().map(ToString::to_string))
        .collect()
}

/// The simulated cloud's own contract: no start is accepted into a zone
/// closed to new instances, and no new instance takes the id of one that exists or existed.
fn check_cloud(s: &Scenario, cloud: &CloudSnapshot, v: &mut Vec<String>) {
    if !s.cloud.zones.is_empty() || !s.cloud.unavailable_zones.is_empty() {
        let zones = ZoneTimeline::new(s);
        // The call that made an instance is the first to name it (a repeat of its client token
        // names it again later, when the zone may have closed meanwhile).
        let mut made: BTreeSet<&crate::model::InstanceId> = BTreeSet::new();
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

/// The constraints a machine spec asks the cloud for.
fn spec_constraints(m: &MachineSpec) -> crate::model::Constraints {
    m.constraints()
}

/// Every set of constraints machine `m` had up to `at`: its spec's, then each `set_constraints`
/// of it (issue 34) at or before `at`, in order.
fn constraint_versions(
    s: &Scenario,
    specs: &BTreeMap<String, MachineSpec>,
    m: &str,
    at: Duration,
) -> Vec<crate::model::Constraints> {
    let mut out: Vec<crate::model::Constraints> = specs.get(m).map(spec_constraints).into_iter().collect();
    for (t, a) in s.timeline() {
        if let Action::SetConstraints(c) = a {
            if t <= at && c.machine == m {
                out.extend(crate::model::Constraints::parse(&c.constraints).ok());
            }
        }
    }
    out
}

/// Instance types (an addition): an instance a start made with a type has a type its
/// machine's constraints allow: one `choose` returns for them from the shipped catalogue and
/// the cloud's default type (the explicit `instance_type` only, when one is asked for).
fn check_types(s: &Scenario, cloud: &CloudSnapshot, specs: &BTreeMap<String, MachineSpec>, v: &mut Vec<String>) {
    use crate::model::instance_types::{choose, shipped};
    let catalogue = shipped();
    for call in cloud.calls.iter().filter(|c| c.op == CloudOp::StartInstance && c.ok == Some(true)) {
        let (Some(t), Some(m)) = (&call.instance_type, &call.machine) else { continue };
        if !specs.contains_key(m.as_str()) {
            continue;
        }
        let versions = constraint_versions(s, specs, m.as_str(), call.at);
        let fits = |c: &crate::model::Constraints| {
            choose(c, &catalogue, s.cloud.instance_type.as_deref()).is_ok_and(|a| a.iter().any(|x| &x.name == t))
        };
        if versions.iter().any(fits) {
            continue;
        }
        let allowed =
            choose(versions.last().unwrap_or(&Default::default()), &catalogue, s.cloud.instance_type.as_deref());
        {
            let why = match allowed {
                Ok(a) => format!("it may have {}", a.iter().map(|x| x.name.as_str()).collect::<Vec<_>>().join(", ")),
                Err(e) => e.to_string(),
            };
            v.push(format!("machine {m} got an instance of type {t}, which its constraints do not allow ({why})"));
        }
    }
}

/// Capacity types (issue 33): no `spot` machine gets an instance on on-demand capacity, and no
/// `on-demand` machine one on spot (`prefer-spot` may have either). Judged on every instance a
/// start of ours made (a lost answer's included), by the capacity the cloud says it runs on.
fn check_capacity(cloud: &CloudSnapshot, specs: &BTreeMap<String, MachineSpec>, v: &mut Vec<String>) {
    let mut seen = BTreeSet::new();
    for call in cloud.calls.iter().filter(|c| c.op == CloudOp::StartInstance) {
        let Some(m) = &call.machine else { continue };
        let Some(spec) = specs.get(m.as_str()) else { continue };
        for id in &call.instances {
            let Some(got) = cloud.instances.get(id).and_then(|i| i.instance.capacity_type) else { continue };
            if !spec.capacity.allows(Some(got)) && seen.insert(id.clone()) {
                v.push(format!("machine {m} ({}) got instance {id} on {got} capacity", spec.capacity));
            }
        }
    }
}

/// Spot hand-overs (issue 33): a top-level machine alive and not removed at the end whose instance the
/// cloud warned of an interruption (`interrupt`) gets a start call (a replacement; it may fail)
/// before the warning runs out, unless the instance was no longer live at the warning (a stop
/// call of ours named it before, or the cloud terminated it), the machine's every start failed (provisioning error, e.g. no zone
/// left for the replacement), a restart while the warning ran lost the notice until after it
/// ran out (the cloud hands a notice out again only after its visibility timeout), or the
/// model was destroyed. A warning about an instance whose start had not answered yet is held
/// until the machine records it: the replacement's start call then comes after that start
/// answered, whenever that is (if it answered at all). (At most two live instances per
/// machine, two only while a warning runs, is checked by the fake cloud at every creation:
/// `CloudSnapshot::duplicates`.)
fn check_handovers(s: &Scenario, cloud: &CloudSnapshot, model: &ModelSnapshot, v: &mut Vec<String>) {
    if s.timeline().iter().any(|(_, a)| matches!(a, Action::DestroyModel(_))) {
        return;
    }
    for (at, a) in s.timeline() {
        let Action::Interrupt(i) = a else { continue };
        let Some(inst) = cloud.instances.get(&crate::model::InstanceId::new(i.instance.as_str())) else { continue };
        // Containers' instances are their hosts' business: only the environ provisioner reads
        // the cloud's interruption notices.
        let Some(m) = inst.instance.tags.machine.as_ref().filter(|m| !inst.foreign && !m.as_str().contains('/')) else {
            continue;
        };
        // The replacement's start may fail before any call (no zone left): the machine is then
        // in provisioning error, as any machine whose every start failed.
        let alive = model.machines.get(m).is_some_and(|x| {
            !x.removed
                && x.machine.life == crate::model::Life::Alive
                && !x.machine.manual
                && !x.machine.instance_status.is_error()
                && x.machine.status != MachineStatus::Error
        });
        // When the start that made it answered (`None`: it never did, its answer lost, or it
        // was made after the warning, which then warned of nothing).
        let answered = cloud
            .calls
            .iter()
            .filter(|c| c.op == CloudOp::StartInstance && c.instances.iter().any(|x| x.as_str() == i.instance))
            .filter(|c| c.at <= at)
            .find_map(|c| c.done_at);
        // Taken away before the warning (terminated outside the provisioner): nothing warned.
        let terminated_before =
            s.timeline().iter().any(|(t, a)| *t <= at && matches!(a, Action::CloudTerminate(id) if *id == i.instance));
        // A restart while the warning runs loses the notice the provisioner held: the cloud
        // hands it out again once its visibility timeout runs out (as SQS does). If that is
        // after the warning, no provisioner could have heard of it in time.
        let until = at + i.warning.0;
        let lost_to_restart = s.timeline().iter().any(|(t, a)| {
            matches!(a, Action::Restart) && *t >= at && *t < until && *t + crate::testing::NOTICE_VISIBILITY >= until
        });
        if terminated_before || lost_to_restart {
            continue;
        }
        let stopped_before = cloud.calls.iter().any(|c| {
            c.op == CloudOp::StopInstances && c.at <= at && c.instances.iter().any(|x| x.as_str() == i.instance)
        });
        if !alive || stopped_before {
            continue;
        }
        // A start for the machine, or (a replacement that reused a dead machine's instance, no
        // start call) our stop of the interrupted instance, which follows the switch: before
        // the warning ran out, or, for a warning that came before its start answered, after
        // that answer.
        let Some(answered) = answered else { continue };
        let (from, by) = if answered <= at { (at, until) } else { (answered, Duration::MAX) };
        let replaced = cloud.calls.iter().any(|c| {
            c.at >= from
                && c.at < by
                && match c.op {
                    CloudOp::StartInstance => c.machine.as_ref() == Some(m),
                    CloudOp::StopInstances => c.instances.iter().any(|x| x.as_str() == i.instance),
                    _ => false,
                }
        });
        if !replaced && answered <= at {
            v.push(format!(
                "machine {m}'s instance {} was warned of an interruption at {} and no replacement was started before the warning ran out at {}",
                i.instance,
                format_duration(at),
                format_duration(until)
            ));
        } else if !replaced {
            v.push(format!(
                "machine {m}'s instance {} was warned of an interruption at {}, before its start answered at {}, and no replacement was started after",
                i.instance,
                format_duration(at),
                format_duration(answered)
            ));
        }
    }
}

/// Repairs and drift (issue 34): a replacement started for an instance never warned of an
/// interruption needs a reason: it has been stopped out of band (`cloud_stop`, not started
/// again since) or impaired (`cloud_impair`, not recovered since) for `repair_after` (a
/// repair), or it has drifted (`model::drift`) from constraints its machine had up to the
/// call with `replace_drifted` on (a drift replacement); neither for a keep-instance machine.
/// Judged on each replacement's first start call.
fn check_repairs(s: &Scenario, cloud: &CloudSnapshot, specs: &BTreeMap<String, MachineSpec>, v: &mut Vec<String>) {
    let timeline = s.timeline();
    let mut first: BTreeMap<&str, &crate::testing::CallRecord> = BTreeMap::new();
    for c in cloud.calls.iter().filter(|c| c.op == CloudOp::StartInstance) {
        let Some(replaces) = c.params.as_ref().and_then(|p| p.tags.replaces()) else { continue };
        first.entry(replaces).or_insert(c);
    }
    for (old, call) in first {
        let warned = timeline.iter().any(|(_, a)| matches!(a, Action::Interrupt(i) if i.instance == old));
        if warned {
            continue;
        }
        let machine = call.machine.as_ref().map_or("?", |m| m.as_str());
        let initially = s
            .cloud
            .instances
            .iter()
            .any(|i| i.id == old && matches!(i.state, crate::sim::scenario::InitialState::Stopped));
        // Since when `old` has stayed stopped (a second stop of a stopped instance changes
        // nothing) and since when its status checks have failed, as of the call.
        let mut stopped_at = initially.then_some(Duration::ZERO);
        let mut impaired_at = None;
        for (t, a) in timeline.iter().filter(|(t, _)| *t <= call.at) {
            match a {
                Action::CloudStop(id) if id == old => stopped_at = stopped_at.or(Some(*t)),
                Action::CloudStart(id) if id == old => stopped_at = None,
                Action::CloudImpair(id) if id == old => impaired_at = impaired_at.or(Some(*t)),
                Action::CloudRecover(id) if id == old => impaired_at = None,
                _ => {}
            }
        }
        // Drifted (`model::drift`) from any constraints the machine had, or any image the
        // cloud's starts used, up to the call.
        let drifted = cloud.instances.get(&crate::model::InstanceId::new(old)).is_some_and(|i| {
            let catalogue = crate::model::instance_types::shipped();
            let id = crate::model::MachineId::new(machine);
            let placement = specs.get(machine).and_then(|m| m.placement.clone());
            let images = s.images_until(call.at);
            constraint_versions(s, specs, machine, call.at).iter().any(|c| {
                images.iter().any(|image| {
                    let expected = crate::model::drift::Expected {
                        machine: &id,
                        constraints: c,
                        placement: placement.as_deref(),
                        catalogue: &catalogue,
                        image: image.as_deref(),
                    };
                    !crate::model::drift::drift_of(&expected, &i.instance).is_empty()
                })
            })
        });
        let due = |since: Option<Duration>| {
            s.provisioner.repair_after.is_some_and(|after| since.is_some_and(|t| call.at >= t + after.0))
        };
        let protected = specs.get(machine).is_some_and(|m| m.keep_instance || m.manual);
        if due(stopped_at) || due(impaired_at) {
            if protected {
                v.push(format!("keep-instance machine {machine}'s unhealthy instance {old} was repaired"));
            }
        } else if drifted && s.provisioner.replace_drifted {
            if protected {
                v.push(format!("keep-instance machine {machine}'s drifted instance {old} was replaced"));
            }
        } else {
            let why = match stopped_at.into_iter().chain(impaired_at).min() {
                Some(first) => match s.provisioner.repair_after {
                    Some(after) => format!(
                        "unhealthy since {}, before repair_after ({})",
                        format_duration(first),
                        format_duration(after.0)
                    ),
                    None => format!("unhealthy since {}, with repair off", format_duration(first)),
                },
                None if drifted => "drifted, with replace_drifted off".to_owned(),
                None => "for no reason (not warned, unhealthy or drifted)".to_owned(),
            };
            v.push(format!("machine {machine}'s instance {old} was replaced at {}: {why}", format_duration(call.at)));
        }
    }
}

/// Every broken invariant, as sentences naming the machine or instance.
pub fn check(s: &Scenario, cloud: &CloudSnapshot, model: &ModelSnapshot, modes: &ModeTimeline) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    let specs = all_machines(s);
    // What DeriveAvailabilityZones answers each machine: its placement's zone or subnet's
    // zones, else its `derived_zones` entry; an error for a placement on an unknown subnet.
    let mut derived: BTreeMap<String, Result<Vec<String>, String>> =
        s.cloud.derived_zones.iter().map(|d| (d.machine.clone(), Ok(d.zones.clone()))).collect();
    for (id, m) in &specs {
        if m.placement.is_some() {
            derived.insert(id.clone(), s.cloud.derived_zones_for(id, m.placement.as_deref()));
        }
    }

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
    let started = succeeded(cloud, CloudOp::StartInstance, None);
    let protected = |machine: &str, f: fn(&MachineSpec) -> bool| specs.get(machine).is_some_and(f);
    // Instances a stop call of ours terminated.
    let stopped_by_us = succeeded(cloud, CloudOp::StopInstances, None);
    // When the model was destroyed (destroy_model wins over releases and harvest modes): from
    // then on every instance is stopped whatever the mode, releases included.
    let destroyed_at: Option<Duration> =
        s.timeline().into_iter().find(|(_, a)| matches!(a, Action::DestroyModel(_))).map(|(at, _)| at);
    // When each instance of ours landed: the end of the last start call naming it, a call
    // whose answer was lost included (pre-existing ones: at 0).
    let landed: BTreeMap<String, Duration> = cloud
        .calls
        .iter()
        .filter(|c| c.op == CloudOp::StartInstance)
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

    check_cloud(s, cloud, &mut v);
    check_types(s, cloud, &specs, &mut v);
    check_capacity(cloud, &specs, &mut v);
    check_handovers(s, cloud, model, &mut v);
    check_repairs(s, cloud, &all_machines(s), &mut v);

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

    let destroyed_by = |t: Duration| destroyed_at.is_some_and(|d| d <= t);
    // Whether a start of `machine` was in flight at `t` (its instance did not exist yet).
    let starting_at = |machine: &str, t: Duration| {
        cloud.calls.iter().any(|c| {
            c.op == CloudOp::StartInstance
                && c.machine.as_ref().is_some_and(|x| x.as_str() == machine)
                && c.at <= t
                && c.done_at.is_none_or(|d| d >= t)
        })
    };
    // Whether the provisioner in charge at `t` had processed a batch since it started (it had
    // started or stopped something: it could have processed a death at `t`; before that, it
    // processes the death under whatever mode is in force once it can).
    let restarts: Vec<Duration> =
        s.timeline().into_iter().filter(|(_, a)| matches!(a, Action::Restart)).map(|(at, _)| at).collect();
    let seen_in_time = |t: Duration| {
        let since = restarts.iter().copied().filter(|r| *r <= t).max().unwrap_or_default();
        cloud
            .calls
            .iter()
            .any(|c| matches!(c.op, CloudOp::StartInstance | CloudOp::StopInstances) && c.at >= since && c.at <= t)
    };
    // Instances released so far, in call order (a released instance is never stopped later).
    let mut released: BTreeSet<String> = BTreeSet::new();
    for call in &cloud.calls {
        let at = format_duration(call.at);
        match call.op {
            // A release at or after the destruction's instant is not one the contract keeps:
            // from then on every instance is stopped whatever the mode (the
            // destruction check below holds such an instance to be terminated), keep-instance
            // ones excepted.
            CloudOp::ReleaseInstances if call.ok == Some(true) => {
                let kept_for_good = |id: &String| {
                    !destroyed_by(call.at) || owner.get(id).is_some_and(|m| protected(m, |s| s.keep_instance))
                };
                released.extend(call.instances.iter().map(ToString::to_string).filter(kept_for_good));
            }
            CloudOp::StopInstances => {
                for inst in &call.instances {
                    let id = inst.to_string();
                    let rec = cloud.instances.get(inst);
                    // A released instance is left alone for good.
                    if released.contains(&id) {
                        v.push(format!("released instance {id} was stopped at {at}"));
                    }
                    // A release is final, and the mode in force when a start lands decides: the
                    // instance of a machine that died while the mode excluded `destroyed` is
                    // released, not stopped (unless the model is destroyed by then: the destruction
                    // wins over releases). An instance never recorded because its record failed is
                    // an orphan, stopped whatever the mode and its stop retried until it succeeds:
                    // only recorded instances and strays that predate the death are judged here,
                    // and a stray only if it did not become such an orphan (an adoption whose
                    // record failed) or have its stop sent while its machine lived. (Manual and
                    // keep-instance machines have checks of their own below.)
                    let judged = recorder
                        .get(&id)
                        .or_else(|| owner.get(&id).filter(|_| !started.contains(&id)))
                        .filter(|m| !protected(m, |s| s.manual || s.keep_instance));
                    let mut judged_stopped = false;
                    if let Some(m) = judged {
                        let fake = model.machines.get(&crate::model::MachineId::new(m));
                        let dead = fake.and_then(|f| f.died_at);
                        // A stray its machine does not record whose stop was decided while the
                        // machine lived is stopped by that decision, retried until it succeeds,
                        // whatever the mode at the death: an adoption whose
                        // record failed made it an orphan (the failed write shows it), or a stop
                        // of it was sent before the death. (A record that failed only after the
                        // death leaves an orphan that follows its machine: judged.)
                        let decided_alive = |died: Duration| {
                            let record_failed =
                                fake.is_some_and(|f| f.record_failures.iter().any(|(at, i)| i == inst && *at <= died));
                            let stop_sent = first_stop.get(&id).is_some_and(|first| *first < died);
                            recorder.get(&id).is_none_or(|r| r != m) && (record_failed || stop_sent)
                        };
                        if let Some(died) = dead.filter(|d| *d <= call.at && !decided_alive(*d)) {
                            // The mode at its death decides the fate of the instance recorded for
                            // it. If it may have been starting then (a start call in flight, or a
                            // stray tagged for a pending machine, whose start may have been queued),
                            // the mode in force when that start landed decides: any
                            // mode from its death to this stop.
                            // Only a provisioner that could see the death then is held to that
                            // mode (one that had started or stopped something since its last
                            // restart); a container provisioner's readiness is not in the call log.
                            let recorded = recorder.get(&id).is_some_and(|r| r == m);
                            let container = crate::model::MachineId::new(m).is_container();
                            // A record landing after the death (an adoption's, or a start's
                            // still being written) is a start in flight at the death too.
                            let recorded_by = fake.and_then(|f| f.recorded_at).is_none_or(|r| r <= died);
                            let strict =
                                recorded && recorded_by && !container && !starting_at(m, died) && seen_in_time(died);
                            let decided = if strict { died } else { call.at };
                            let from = died.saturating_sub(Duration::from_millis(1));
                            if !destroyed_by(call.at)
                                && !modes.any_between(from, decided, HarvestMode::harvests_destroyed)
                            {
                                judged_stopped = true;
                                v.push(format!(
                                    "instance {id} of machine {m}, dead since {} in mode {}, was stopped at {at} in mode {}",
                                    format_duration(died),
                                    modes.at(died),
                                    modes.at(call.at)
                                ));
                            }
                        }
                    }
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
                    // either: the instance a machine records, landed before the machine died in a
                    // mode excluding destroyed (for DECIDE_WINDOW, and with no failed listing
                    // keeping the provisioner from seeing the death before a switch), unless a
                    // destroy_model came first (it wins over releases) or a stop of it was sent
                    // before the death. An orphan (never recorded) may have had its stop decided
                    // while its machine lived (its stop is then retried until it succeeds). (Not
                    // said twice: the check above may have flagged this stop already.)
                    let machine_of = own
                        .and_then(|m| model.machines.get(&crate::model::MachineId::new(m)))
                        .filter(|_| !judged_stopped);
                    if let Some(m) = machine_of.filter(|m| m.machine.instance.as_ref() == Some(inst)) {
                        // It landed for the provisioner once its start returned and its record
                        // was written (an adoption has only the record).
                        let landed_at =
                            landed.get(&id).copied().unwrap_or_default().max(m.recorded_at.unwrap_or_default());
                        let first = first_stop.get(&id).copied().unwrap_or(call.at);
                        if let Some(died) = m.died_at.filter(|d| landed_at <= *d && first >= *d) {
                            let kept = modes.all_between(died, died + DECIDE_WINDOW, |md| !md.harvests_destroyed())
                                && !blind_until_switch(cloud, modes, died);
                            let destroying = destroyed_at.is_some_and(|d| d <= call.at);
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
                    let known = own.is_some_and(|m| model.machines.contains_key(&crate::model::MachineId::new(m)));
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
                    // Any constraints the machine had up to the call (`set_constraints` may
                    // change them while a start is being made).
                    let versions = constraint_versions(s, &specs, &m, call.at);
                    let zoned: Vec<&Vec<String>> = versions.iter().filter_map(|c| c.zones.as_ref()).collect();
                    let unzoned = versions.iter().any(|c| c.zones.as_ref().is_none_or(Vec::is_empty));
                    if !unzoned && !zoned.iter().any(|a| a.contains(zone)) {
                        let allowed = zoned.last().map(|a| format!("{a:?}")).unwrap_or_default();
                        v.push(format!(
                            "machine {m} was started in zone {zone} outside its zones constraint {allowed} at {at}"
                        ));
                    }
                    match derived.get(m.as_str()) {
                        Some(Ok(d)) if !d.is_empty() && !d.contains(zone) => v.push(format!(
                            "machine {m} was started in zone {zone} outside its derived zones {d:?} at {at}"
                        )),
                        Some(Err(e)) => v.push(format!(
                            "machine {m} was started in zone {zone} although its placement has no zone ({e}) at {at}"
                        )),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }

    // 5. Removed machines' instances are terminated (modes destroyed/all at death, not kept);
    // so are those of machines dead at the end but not removed (containers included).
    for (id, m) in &model.machines {
        let dead = m.removed || m.machine.life == Life::Dead;
        if !dead || m.machine.keep_instance || m.machine.manual {
            continue;
        }
        let died = m.died_at.unwrap_or_default();
        let removed = if m.removed { m.removed_at.unwrap_or(died) } else { Duration::MAX };
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
            if let Some(rec) = cloud.instances.get(&crate::model::InstanceId::new(&inst)) {
                if rec.instance.state != InstanceState::Terminated {
                    let what = if m.removed { "removed" } else { "dead" };
                    v.push(format!("{what} machine {id} left instance {inst} {}", rec.instance.state));
                }
            }
        }
    }

    // A host that dies takes its containers with it (they end dead and marked
    // for removal; their instances are judged by invariant 5 above).
    for (id, m) in &model.machines {
        let Some((host, _)) = id.container_of() else { continue };
        let host_gone = model.machines.get(&host).is_some_and(|h| h.removed || h.machine.life == Life::Dead);
        if host_gone && !m.removed {
            v.push(format!("container {id} of dead host {host} is {} and not marked for removal", m.machine.life));
        }
    }

    // Once the model is destroyed, every instance of a non-manual, non-controller,
    // non-keep-instance machine (containers included) ends terminated, whatever the harvest
    // mode; only instances released before the destruction are no longer ours.
    if let Some(destroyed) = destroyed_at.filter(|_| model.life != Life::Alive) {
        let released_before = succeeded(cloud, CloudOp::ReleaseInstances, Some(destroyed));
        // Launched out of band after the destruction: not an instance the destruction knew.
        let launched_after: BTreeSet<String> = s
            .timeline()
            .into_iter()
            .filter_map(|(at, a)| match a {
                Action::CloudLaunch(l) if at >= destroyed => Some(l.id),
                _ => None,
            })
            .collect();
        let released_ever = succeeded(cloud, CloudOp::ReleaseInstances, None);
        for (iid, inst) in &cloud.instances {
            let iid = iid.to_string();
            let skip = inst.foreign
                || inst.instance.state == InstanceState::Terminated
                || released_before.contains(&iid)
                || launched_after.contains(&iid);
            if skip {
                continue;
            }
            let Some(m) = recorder.get(&iid).or_else(|| owner.get(&iid)) else { continue };
            let Some(f) = model.machines.get(&crate::model::MachineId::new(m)) else { continue };
            // Its release was decided before the destruction (the machine died before it in a
            // mode that excludes destroyed, and any start in flight then had landed before it),
            // even if carried out after.
            let landed_before = |d: Duration| {
                !cloud.calls.iter().any(|c| {
                    c.op == CloudOp::StartInstance
                        && c.machine.as_ref().is_some_and(|x| x.as_str() == m.as_str())
                        && c.at <= d
                        && c.done_at.is_none_or(|done| done >= destroyed)
                })
            };
            let decided_release = released_ever.contains(&iid)
                && f.died_at.is_some_and(|d| d < destroyed && !modes.at(d).harvests_destroyed() && landed_before(d));
            if decided_release {
                continue;
            }
            let spec = specs.get(m.as_str());
            let exempt = f.machine.manual
                || f.machine.controller
                || f.machine.keep_instance
                || spec.is_some_and(|s| s.manual || s.controller || s.keep_instance);
            if !exempt {
                v.push(format!(
                    "model destroyed at {} but instance {iid} of machine {m} is {}",
                    format_duration(destroyed),
                    inst.instance.state
                ));
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
        if let Some((host, _)) = crate::model::MachineId::new(id.as_str()).container_of() {
            let host_ready = model
                .machines
                .get(&host)
                .is_some_and(|h| !h.removed && h.machine.life == Life::Alive && h.machine.instance.is_some());
            if !host_ready {
                continue;
            }
        }
        let Some(m) = model.machines.get(&crate::model::MachineId::new(id)) else { continue };
        // A recorded instance that we terminated provisions nothing (a restart that adopted an
        // instance being stopped: such an instance is never adopted).
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
    // 10. A model destruction without force names the manual machines left (at 0s as later).
    let first_destroy = s.timeline().into_iter().find_map(|(at, a)| match a {
        Action::DestroyModel(d) => Some((at, d.force)),
        _ => None,
    });
    // (Instances left running are flagged by the destroyed-model check above, containers
    // included; this one names the manual machines.)
    if let Some((at, force)) = first_destroy {
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
            let named =
                model.refused_destroys.iter().any(|ids| manual.iter().all(|m| ids.iter().any(|id| id.as_str() == *m)));
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
    // it, or gone (an orphan whose record failed is stopped, retried until it succeeds).
    for (iid, inst) in &cloud.instances {
        if inst.foreign || inst.instance.state == InstanceState::Terminated || inst.instance.tags.model.is_none() {
            continue;
        }
        let Some(tagged) = &inst.instance.tags.machine else { continue };
        let Some(m) = model.machines.get(tagged) else { continue };
        if launched.contains_key(iid.as_str()) {
            continue;
        }
        // A container whose host died goes with its host (its instance stopped, itself marked for
        // removal), and one whose host never got an instance has no container provisioner (as for
        // invariant 7).
        let host_gone = tagged.container_of().is_some_and(|(host, _)| {
            model
                .machines
                .get(&host)
                .is_none_or(|h| h.removed || h.machine.life != Life::Alive || h.machine.instance.is_none())
        });
        // In a dying model the destruction check covers top-level machines; containers are the
        // container provisioners'.
        if host_gone || (model.life != Life::Alive && tagged.container_of().is_some()) {
            continue;
        }
        if m.removed || m.machine.life != Life::Alive || m.machine.manual || recorder.contains_key(iid.as_str()) {
            continue;
        }
        v.push(format!("instance {iid} tagged for live machine {tagged} is recorded by no machine (leaked)"));
    }
    // 10. A decided stop is retried until it succeeds, across restarts too: an instance whose
    // record failed while its machine lived (an orphan, its stop decided then) is not left
    // running with our tag once that machine is dead, unless some machine recorded it later.
    for (iid, inst) in &cloud.instances {
        if inst.foreign || inst.instance.state == InstanceState::Terminated || inst.instance.tags.model.is_none() {
            continue;
        }
        let Some(tagged) = &inst.instance.tags.machine else { continue };
        let Some(m) = model.machines.get(tagged) else { continue };
        if m.machine.manual || recorder.contains_key(iid.as_str()) {
            continue;
        }
        let Some(died) = m.died_at.filter(|_| m.removed || m.machine.life == Life::Dead) else { continue };
        if let Some((failed, _)) = m.record_failures.iter().find(|(at, i)| i == iid && *at <= died) {
            v.push(format!(
                "orphan {iid} of machine {tagged}, whose record failed at {}, was left running after its machine died (its stop was decided)",
                format_duration(*failed)
            ));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    //! The checker fires on bad runs (hand-made snapshots standing for a broken provisioner)
    //! and stays quiet on the good ones next to them.

    use super::*;
    use crate::model::{CloudInstance, InstanceId, InstanceTags, Machine, MachineId};
    use crate::sim::scenario::Format;
    use crate::testing::{CallRecord, FakeInstance, FakeMachine};

    fn scenario(text: &str) -> Scenario {
        Scenario::parse(text, Format::Toml, "t.toml").unwrap()
    }

    fn instance(id: &str, machine: &str, state: InstanceState) -> (InstanceId, FakeInstance) {
        let tags = InstanceTags { model: Some("m".into()), machine: Some(MachineId::new(machine)), start: None };
        let instance = CloudInstance::tagged(InstanceId::new(id), state, tags);
        (InstanceId::new(id), FakeInstance { instance, foreign: false, born: (Duration::ZERO, Duration::ZERO) })
    }

    fn call(op: CloudOp, at: u64, instances: &[&str]) -> CallRecord {
        CallRecord {
            at: Duration::from_secs(at),
            op,
            machine: None,
            zone: None,
            instances: instances.iter().map(|i| InstanceId::new(*i)).collect(),
            ok: Some(true),
            error: None,
            params: None,
            throttled: false,
            done_at: Some(Duration::from_secs(at)),
            instance_type: None,
            failed_types: Vec::new(),
            batch: None,
        }
    }

    fn machine(
        id: &str,
        life: Life,
        instance: Option<&str>,
        died: Option<u64>,
        removed: bool,
    ) -> (MachineId, FakeMachine) {
        let mut m = Machine::pending(id);
        m.life = life;
        m.instance = instance.map(InstanceId::new);
        let mut f = FakeMachine::new(m);
        f.died_at = died.map(Duration::from_secs);
        f.removed = removed;
        f.removed_at = removed.then(|| Duration::from_secs(died.unwrap_or(0)));
        (MachineId::new(id), f)
    }

    const HOST_AND_CONTAINER: &str = r#"
        [[machines]]
        id = "0"
        [[machines]]
        id = "0/lxd/0"
    "#;

    #[test]
    fn an_instance_of_a_type_the_constraints_do_not_allow_is_caught() {
        // A mutant cloud ignoring the constraints: machine 0 asks for cores=2 mem=8G and gets
        // t3.micro; machine 1 asks for instance_type=m5.large and gets t3.large. Machine 2's
        // m5.large (the second cheapest fit, after a capacity fail-over) is fine.
        let s = scenario(
            r#"
            [[machines]]
            id = "0"
            cores = 2
            mem_mb = 8192
            [[machines]]
            id = "1"
            instance_type = "m5.large"
            [[machines]]
            id = "2"
            cores = 2
            mem_mb = 8192
        "#,
        );
        let start = |m: &str, t: &str, i: &str| CallRecord {
            machine: Some(MachineId::new(m)),
            instance_type: Some(t.into()),
            ..call(CloudOp::StartInstance, 1, &[i])
        };
        let cloud = CloudSnapshot {
            calls: vec![start("0", "t3.micro", "i-1"), start("1", "t3.large", "i-2"), start("2", "m5.large", "i-3")],
            ..CloudSnapshot::default()
        };
        let mut v = Vec::new();
        check_types(&s, &cloud, &all_machines(&s), &mut v);
        assert_eq!(v.len(), 2, "{v:#?}");
        assert!(v[0].starts_with("machine 0 got an instance of type t3.micro"), "{v:#?}");
        assert!(v[1].contains("machine 1 got an instance of type t3.large") && v[1].contains("m5.large"), "{v:#?}");
    }

    #[test]
    fn a_start_that_ignores_its_placement_is_caught() {
        // A mutant cloud whose DeriveAvailabilityZones ignores placements: machine 0 (zone=az3)
        // and machine 1 (subnet-b, in az2) start in az1, machine 2 (an unknown subnet) starts
        // at all. Machine 3, placed on subnet-a in az1, is fine.
        let s = scenario(
            r#"
            [cloud]
            zones = ["az1", "az2", "az3"]
            subnets = { subnet-a = ["az1"], subnet-b = ["az2"] }
            [[machines]]
            id = "0"
            placement = "zone=az3"
            [[machines]]
            id = "1"
            placement = "subnet=subnet-b"
            [[machines]]
            id = "2"
            placement = "subnet=nope"
            [[machines]]
            id = "3"
            placement = "subnet=subnet-a"
        "#,
        );
        let start = |m: &str, i: &str| CallRecord {
            machine: Some(MachineId::new(m)),
            zone: Some("az1".into()),
            ..call(CloudOp::StartInstance, 1, &[i])
        };
        let cloud = CloudSnapshot {
            calls: vec![start("0", "i-1"), start("1", "i-2"), start("2", "i-3"), start("3", "i-4")],
            ..CloudSnapshot::default()
        };
        let v = check(&s, &cloud, &ModelSnapshot::default(), &ModeTimeline::new(HarvestMode::Destroyed));
        assert_eq!(
            v,
            [
                "machine 0 was started in zone az1 outside its derived zones [\"az3\"] at 1s",
                "machine 1 was started in zone az1 outside its derived zones [\"az2\"] at 1s",
                "machine 2 was started in zone az1 although its placement has no zone (subnet \"nope\" is not one of this cloud's subnets) at 1s",
            ],
            "{v:#?}"
        );
    }

    #[test]
    fn a_dead_hosts_container_left_alive_with_its_instance_is_caught() {
        // The run of dead_host_container_not_reaped_after_restart before the fix: the host is
        // removed, its container dead (not removed) with its instance running.
        let s = scenario(HOST_AND_CONTAINER);
        let modes = ModeTimeline::new(HarvestMode::Destroyed);
        let cloud = CloudSnapshot::of([
            instance("i-h0", "0", InstanceState::Terminated),
            instance("i-1", "0/lxd/0", InstanceState::Running),
        ]);
        let mut model = ModelSnapshot::of([
            machine("0", Life::Dead, Some("i-h0"), Some(10), true),
            machine("0/lxd/0", Life::Dead, Some("i-1"), Some(20), false),
        ]);
        let v = check(&s, &cloud, &model, &modes);
        assert!(v.contains(&"dead machine 0/lxd/0 left instance i-1 running".to_owned()), "{v:?}");
        assert!(v.iter().any(|x| x.starts_with("container 0/lxd/0 of dead host 0 is dead and not marked")), "{v:?}");
        // An alive container of a dead host is caught too.
        model.machines.get_mut(&MachineId::new("0/lxd/0")).unwrap().machine.life = Life::Alive;
        let v = check(&s, &cloud, &model, &modes);
        assert!(v.iter().any(|x| x.starts_with("container 0/lxd/0 of dead host 0 is alive")), "{v:?}");
        // The good run: terminated and removed.
        let mut good_cloud = cloud.clone();
        good_cloud.instances.get_mut(&InstanceId::new("i-1")).unwrap().instance.state = InstanceState::Terminated;
        let good = ModelSnapshot::of([
            machine("0", Life::Dead, Some("i-h0"), Some(10), true),
            machine("0/lxd/0", Life::Dead, Some("i-1"), Some(10), true),
        ]);
        assert_eq!(check(&s, &good_cloud, &good, &modes), Vec::<String>::new());
    }

    #[test]
    fn a_stop_in_a_mode_that_excludes_destroyed_or_after_a_release_is_caught() {
        // container_stops_after_switch_to_none before the fix: the container died at 20s in mode
        // none (switched at 10s) and its instance was stopped.
        let s = scenario(HOST_AND_CONTAINER);
        let mut modes = ModeTimeline::new(HarvestMode::Destroyed);
        modes.set(Duration::from_secs(10), HarvestMode::None);
        let cloud = CloudSnapshot {
            calls: vec![call(CloudOp::StopInstances, 20, &["i-1"])],
            ..CloudSnapshot::of([instance("i-1", "0/lxd/0", InstanceState::Terminated)])
        };
        let model = ModelSnapshot::of([machine("0/lxd/0", Life::Dead, Some("i-1"), Some(20), true)]);
        let v = check(&s, &cloud, &model, &modes);
        assert!(
            v.iter().any(|x| x.starts_with("instance i-1 of machine 0/lxd/0, dead since 20s in mode none")),
            "{v:?}"
        );
        // Released first, stopped later: a release must be final.
        let mut released = cloud.clone();
        released.calls.insert(0, call(CloudOp::ReleaseInstances, 20, &["i-1"]));
        let v = check(&s, &released, &model, &ModeTimeline::new(HarvestMode::Destroyed));
        assert_eq!(v, vec!["released instance i-1 was stopped at 20s".to_owned()]);
        // Died in mode destroyed: the stop is right.
        assert_eq!(check(&s, &cloud, &model, &ModeTimeline::new(HarvestMode::Destroyed)), Vec::<String>::new());
    }

    #[test]
    fn the_mode_at_a_machines_death_decides_even_if_the_stop_comes_after_a_switch() {
        // released_instance_stopped_after_restart (a queued release lost across a restart): machine
        // 0 died at 5s in mode none; its release waited; the mode became destroyed at 10s; the
        // instance was stopped at 20s. The provisioner had processed a batch by then (a start at
        // 0s).
        let s = scenario("[[machines]]\nid = \"0\"\n[[machines]]\nid = \"1\"");
        let mut modes = ModeTimeline::new(HarvestMode::None);
        modes.set(Duration::from_secs(10), HarvestMode::Destroyed);
        let mut start = call(CloudOp::StartInstance, 0, &["i-1"]);
        start.machine = Some(MachineId::new("1"));
        let cloud = CloudSnapshot {
            calls: vec![start, call(CloudOp::StopInstances, 20, &["pre-0"])],
            ..CloudSnapshot::of([
                instance("pre-0", "0", InstanceState::Terminated),
                instance("i-1", "1", InstanceState::Running),
            ])
        };
        let model = ModelSnapshot::of([
            machine("0", Life::Dead, Some("pre-0"), Some(5), true),
            machine("1", Life::Alive, Some("i-1"), None, false),
        ]);
        let v = check(&s, &cloud, &model, &modes);
        assert_eq!(
            v,
            vec!["instance pre-0 of machine 0, dead since 5s in mode none, was stopped at 20s in mode destroyed"
                .to_owned()]
        );
        // A provisioner that had processed nothing yet when the machine died (its listings
        // failing, say) judges the death under the mode in force once it can.
        let mut late = cloud.clone();
        late.calls.remove(0);
        let mut listing = call(CloudOp::AllInstances, 6, &[]);
        listing.ok = Some(false);
        late.calls.insert(0, listing);
        assert_eq!(check(&s, &late, &model, &modes), Vec::<String>::new());
    }

    #[test]
    fn a_strays_stop_decided_while_its_machine_lived_holds_after_its_death() {
        // Seeds 1361, 2052, 3771 of the merged property test: stray-0, tagged for pending machine
        // 0, was adopted; the record failed (at 1s), so its stop was decided then (semantics
        // 18); the machine died at 5s in mode none; the stop went out at 9s. Not a release
        // broken: the orphan was never the dead machine's to release.
        let s = scenario("[[machines]]\nid = \"0\"");
        let modes = ModeTimeline::new(HarvestMode::None);
        let cloud = CloudSnapshot {
            calls: vec![call(CloudOp::StopInstances, 9, &["stray-0"])],
            ..CloudSnapshot::of([instance("stray-0", "0", InstanceState::Terminated)])
        };
        let (id, mut dead) = machine("0", Life::Dead, None, Some(5), true);
        dead.record_failures.push((Duration::from_secs(1), InstanceId::new("stray-0")));
        let model = ModelSnapshot::of([(id.clone(), dead.clone())]);
        assert_eq!(check(&s, &cloud, &model, &modes), Vec::<String>::new());
        // A record that failed only after the death leaves an orphan that follows its machine
        // (released in mode none): stopping it is caught, as is a stray never adopted.
        let flagged = vec![
            "instance stray-0 of machine 0, dead since 5s in mode none, was stopped at 9s in mode none".to_owned()
        ];
        let mut late = dead.clone();
        late.record_failures = vec![(Duration::from_secs(6), InstanceId::new("stray-0"))];
        let model_late = ModelSnapshot::of([(id.clone(), late)]);
        assert_eq!(check(&s, &cloud, &model_late, &modes), flagged);
        let mut never = dead.clone();
        never.record_failures.clear();
        let model_never = ModelSnapshot::of([(id, never)]);
        assert_eq!(check(&s, &cloud, &model_never, &modes), flagged);
        // A stop first sent (and failed) while the machine lived, retried after its death: the
        // decision predates the death.
        let mut retried = cloud.clone();
        let mut first = call(CloudOp::StopInstances, 3, &["stray-0"]);
        first.ok = Some(false);
        retried.calls.insert(0, first);
        assert_eq!(check(&s, &retried, &model_never, &modes), Vec::<String>::new());
    }

    #[test]
    fn the_stop_of_a_live_machines_extra_instance_is_accepted_and_its_recorded_ones_caught() {
        // Issue 32: machine 0's call into frozen zone a went unanswered; it failed over to b
        // (i-b, recorded); the member woke up and made i-a (logged as the call that made it);
        // the provisioner stopped i-a at 100s in mode none: a stray of a live machine, made by
        // our own start, stopped whatever the mode.
        let s = scenario("[[machines]]\nid = \"0\"");
        let modes = ModeTimeline::new(HarvestMode::None);
        let start = |zone: &str, at: u64, i: &str| CallRecord {
            machine: Some(MachineId::new("0")),
            zone: Some(zone.into()),
            ..call(CloudOp::StartInstance, at, &[i])
        };
        let calls = vec![start("b", 31, "i-b"), start("a", 60, "i-a"), call(CloudOp::StopInstances, 100, &["i-a"])];
        let cloud = CloudSnapshot {
            calls,
            ..CloudSnapshot::of([
                instance("i-a", "0", InstanceState::Terminated),
                instance("i-b", "0", InstanceState::Running),
            ])
        };
        let (id, live) = machine("0", Life::Alive, Some("i-b"), None, false);
        let model = ModelSnapshot::of([(id, live)]);
        assert_eq!(check(&s, &cloud, &model, &modes), Vec::<String>::new());
        // Left running, the extra is caught (two live instances, one leaked); stopping the
        // recorded one instead is caught too.
        let mut leaked = cloud.clone();
        leaked.calls.pop();
        leaked.instances.insert(InstanceId::new("i-a"), instance("i-a", "0", InstanceState::Running).1);
        let leak = [
            "machine 0 has two live instances: i-a, i-b".to_owned(),
            "instance i-a tagged for live machine 0 is recorded by no machine (leaked)".to_owned(),
        ];
        assert_eq!(check(&s, &leaked, &model, &modes), leak);
        let mut wrong = leaked.clone();
        wrong.calls.push(call(CloudOp::StopInstances, 100, &["i-b"]));
        wrong.instances.insert(InstanceId::new("i-b"), instance("i-b", "0", InstanceState::Terminated).1);
        let v = check(&s, &wrong, &model, &modes);
        assert!(v.iter().any(|l| l.contains("records instance i-b, which the provisioner stopped")), "{v:#?}");
    }

    /// A host with a container and a keep-instance machine; the model is destroyed (force) at 10s.
    fn destroyed_with_container_and_kept() -> Scenario {
        scenario(&format!(
            "{HOST_AND_CONTAINER}
            [[machines]]
            id = \"1\"
            keep_instance = true
            [[events]]
            at = \"10s\"
            destroy_model = {{ force = true }}"
        ))
    }

    /// The host's instance gone, the container's and the keep-instance machine's running.
    fn host_container_and_kept_instances() -> BTreeMap<InstanceId, FakeInstance> {
        [
            instance("i-h0", "0", InstanceState::Terminated),
            instance("i-1", "0/lxd/0", InstanceState::Running),
            instance("i-k", "1", InstanceState::Running),
        ]
        .into_iter()
        .collect()
    }

    /// Keep-instance machine 1 with its instance i-k.
    fn kept_machine() -> (MachineId, FakeMachine) {
        let mut kept = Machine::pending("1");
        kept.keep_instance = true;
        kept.instance = Some(InstanceId::new("i-k"));
        (MachineId::new("1"), FakeMachine::new(kept))
    }

    #[test]
    fn a_container_instance_left_running_in_a_destroyed_model_is_caught() {
        // seed002_destroy_force before the fix: the container's instance survived destroy_model.
        let s = destroyed_with_container_and_kept();
        let modes = ModeTimeline::new(HarvestMode::None);
        let mut cloud = CloudSnapshot::of(host_container_and_kept_instances());
        let model = ModelSnapshot {
            life: Life::Dying,
            ..ModelSnapshot::of([
                machine("0", Life::Alive, Some("i-h0"), None, false),
                machine("0/lxd/0", Life::Alive, Some("i-1"), None, false),
                kept_machine(),
            ])
        };
        let v = check(&s, &cloud, &model, &modes);
        assert_eq!(v, vec!["model destroyed at 10s but instance i-1 of machine 0/lxd/0 is running".to_owned()]);
        // Released before the destruction: no longer ours.
        cloud.calls.push(call(CloudOp::ReleaseInstances, 5, &["i-1"]));
        assert_eq!(check(&s, &cloud, &model, &modes), Vec::<String>::new());
    }

    #[test]
    fn a_release_at_the_instant_of_the_destruction_is_no_release_the_destruction_keeps() {
        // Property-test seeds 10239, 11869, 13915 (the destruction wins over releases): container
        // 0/lxd/0 died at 5s while starting in mode none; its start landed at 10s, the instant of
        // destroy_model, and its provisioner released it before hearing of the destruction.
        let s = destroyed_with_container_and_kept();
        let modes = ModeTimeline::new(HarvestMode::None);
        let mut start = call(CloudOp::StartInstance, 0, &["i-1"]);
        start.machine = Some(MachineId::new("0/lxd/0"));
        start.done_at = Some(Duration::from_secs(10));
        let model = ModelSnapshot {
            life: Life::Dying,
            ..ModelSnapshot::of([
                machine("0", Life::Alive, Some("i-h0"), None, false),
                machine("0/lxd/0", Life::Dead, Some("i-1"), Some(5), true),
                kept_machine(),
            ])
        };
        let released = CloudSnapshot {
            calls: vec![
                start,
                call(CloudOp::ReleaseInstances, 10, &["i-1", "i-k"]),
                call(CloudOp::StopInstances, 10, &["i-h0"]),
            ],
            ..CloudSnapshot::of(host_container_and_kept_instances())
        };
        // Left running: the destruction lost to the release.
        let v = check(&s, &released, &model, &modes);
        assert_eq!(v, vec!["model destroyed at 10s but instance i-1 of machine 0/lxd/0 is running".to_owned()]);
        // Stopped after all, as the destruction requires: not a released instance stopped.
        let mut stopped = released.clone();
        stopped.calls.push(call(CloudOp::StopInstances, 10, &["i-1"]));
        stopped.instances.insert(InstanceId::new("i-1"), instance("i-1", "0/lxd/0", InstanceState::Terminated).1);
        assert_eq!(check(&s, &stopped, &model, &modes), Vec::<String>::new());
        // A keep-instance release at that instant still holds.
        let mut kept_stopped = stopped.clone();
        kept_stopped.calls.push(call(CloudOp::StopInstances, 11, &["i-k"]));
        let v = check(&s, &kept_stopped, &model, &modes);
        assert!(v.contains(&"released instance i-k was stopped at 11s".to_owned()), "{v:?}");
        // A release before the destruction holds too.
        let mut early = stopped.clone();
        early.calls[1] = call(CloudOp::ReleaseInstances, 9, &["i-1", "i-k"]);
        let v = check(&s, &early, &model, &modes);
        assert!(v.contains(&"released instance i-1 was stopped at 10s".to_owned()), "{v:?}");
    }

    #[test]
    fn a_container_of_a_ready_host_left_pending_without_an_error_is_caught() {
        // Invariant 7 covers containers whose host is alive and provisioned (a host
        // that never initialises leaves them in provisioning error, with a message).
        let s = scenario(HOST_AND_CONTAINER);
        let mut model = ModelSnapshot::of([
            machine("0", Life::Alive, Some("i-h0"), None, false),
            machine("0/lxd/0", Life::Alive, None, None, false),
        ]);
        let modes = ModeTimeline::new(HarvestMode::Destroyed);
        let v = check(&s, &CloudSnapshot::default(), &model, &modes);
        assert!(v.iter().any(|x| x.starts_with("machine 0/lxd/0 is alive and pending")), "{v:?}");
        let c = model.machines.get_mut(&MachineId::new("0/lxd/0")).unwrap();
        c.machine.instance_status = crate::model::InstanceStatus::provisioning_error();
        c.instance_status_message = "host 0 cannot run lxd containers: no".into();
        assert_eq!(check(&s, &CloudSnapshot::default(), &model, &modes), Vec::<String>::new());
    }

    #[test]
    fn a_warning_without_a_replacement_start_before_it_runs_out_is_caught() {
        let s = scenario(
            r#"
            [[machines]]
            id = "0"
            [[machines]]
            id = "1"
            [[events]]
            at = "10s"
            interrupt = { instance = "i-1", warning = "2m" }
            [[events]]
            at = "10s"
            interrupt = { instance = "i-2", warning = "2m" }
        "#,
        );
        let start = |m: &str, at: u64, i: &str| CallRecord {
            machine: Some(MachineId::new(m)),
            ..call(CloudOp::StartInstance, at, &[i])
        };
        let cloud = CloudSnapshot {
            instances: [
                instance("i-1", "0", InstanceState::Terminated),
                instance("i-2", "1", InstanceState::Terminated),
            ]
            .into_iter()
            .collect(),
            // Machine 0's replacement starts in time; machine 1's only after the warning ran out.
            calls: vec![start("0", 0, "i-1"), start("1", 0, "i-2"), start("0", 11, "i-3"), start("1", 130, "i-4")],
            ..CloudSnapshot::default()
        };
        let model = ModelSnapshot {
            machines: [
                machine("0", Life::Alive, Some("i-3"), None, false),
                machine("1", Life::Alive, Some("i-4"), None, false),
            ]
            .into_iter()
            .collect(),
            ..ModelSnapshot::default()
        };
        let mut v = Vec::new();
        check_handovers(&s, &cloud, &model, &mut v);
        assert_eq!(
            v,
            vec!["machine 1's instance i-2 was warned of an interruption at 10s and no replacement was started before the warning ran out at 2m 10s".to_owned()]
        );
    }
}
