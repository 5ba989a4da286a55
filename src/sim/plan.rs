//! `provisioner plan FILE`: what the provisioner would do next from a scenario's initial
//! state — starts with their chosen zones, adoptions, stops, releases, removals — computed by
//! the same plain cores the actors use, without doing any of it. Events are not applied.

use std::collections::BTreeSet;

use serde::Serialize;

use super::run::SIM_MODEL_UUID;
use super::scenario::{InitialState, MachineSpec, Scenario};
use crate::actors::coordinator::batch::{Answer, Ask, BatchRun, Effect, Next};
use crate::actors::coordinator::BatchBook;
use crate::actors::harvest::{HarvestBook, HarvestPlan, HarvestSafety, UnknownInstance};
use crate::actors::lifecycle::LifecycleBook;
use crate::actors::registry::MachineBook;
use crate::actors::zones::ZoneBook;
use crate::config::Scope;
use crate::model::{CloudInstance, DeadMachine, InstanceId, InstanceState, InstanceTags, MachineId, ProvisioningInfo};
use crate::ports::ModelError;

/// One start the provisioner would make.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedStart {
    /// The machine.
    pub machine: String,
    /// The zone it would get (`null` on a zoneless cloud).
    pub zone: Option<String>,
    /// With `[provisioner] batch_starts`: the call it would share with the other starts of
    /// its zone and shape (numbered from 1): starts leave in waves of `batch_size` per worker,
    /// and a wave's starts of one zone and shape share a call of at most `batch_size` machines
    /// (if the start token is not granted before the wave has joined).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<u64>,
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

/// Plans the next step from the scenario's initial state (`seed` overrides the file's): the
/// coordinator's own batch planner (`BatchRun`) runs the first batch, its questions answered
/// by the plain cores the actors would consult, its effects recorded instead of carried out.
pub fn plan(s: &Scenario, seed: Option<u64>) -> Plan {
    let mut world = PlanWorld::new(s, seed.unwrap_or(s.seed));
    // The first notification carries every machine, batched as the coordinator batches it.
    let config = crate::config::ProvisionerConfig::default();
    let mut batches = BatchBook::new(config.backoff, config.workers);
    batches.notify(s.machines.iter().map(|m| MachineId::new(m.id.as_str())));
    let Some(start) = batches.start_batch() else { return world.finish() };
    let (mut run, mut steps) = BatchRun::new(start);
    let outcome = loop {
        for effect in std::mem::take(&mut steps.effects) {
            world.apply(effect);
        }
        let ask = match steps.next {
            Next::Done(outcome) => break Some(outcome),
            Next::Ask(ask) => ask,
        };
        let answer = world.answer(ask);
        match run.answer(answer) {
            Ok(next) => steps = next,
            // The batch would be retried as a whole: nothing more to plan now.
            Err(_) => break None,
        }
    };
    if outcome.is_some_and(|o| o.mode_change.is_some()) {
        // The cache is complete: the coordinator has the unknown instances harvested next.
        let plan = world.plan_harvest(&[]);
        world.apply(Effect::Execute(Box::new(plan)));
    }
    world.finish()
}

/// The plain cores the actors would consult, and what the plan records.
struct PlanWorld<'a> {
    s: &'a Scenario,
    book: MachineBook,
    harvest: HarvestBook,
    lifecycle: LifecycleBook,
    zones: ZoneBook,
    out: Plan,
    unknown: Vec<InstanceId>,
    stopped: BTreeSet<InstanceId>,
    recheck_in: Option<std::time::Duration>,
    /// The batcher's core, with batching on.
    batches: Option<crate::actors::workers::batch::BatchBook<()>>,
}

impl<'a> PlanWorld<'a> {
    fn new(s: &'a Scenario, seed: u64) -> Self {
        let mut book = MachineBook::with_scope(Scope::Environ);
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
                    capacity_type: None,
                    image: s.cloud.image.clone(),
                })
                .collect(),
        );
        let safety = HarvestSafety {
            grace: s.provisioner.harvest_grace.0,
            max_stops: s.provisioner.harvest_max_stops,
            pass_interval: s.provisioner.resync_interval.0,
        };
        let harvest = HarvestBook::new(s.provisioner.harvest_mode).with_reuse(s.provisioner.reuse).with_safety(safety);
        Self {
            s,
            book,
            harvest,
            lifecycle: LifecycleBook::default(),
            zones: ZoneBook::new(seed),
            out: Plan::default(),
            unknown: Vec::new(),
            stopped: BTreeSet::new(),
            recheck_in: None,
            batches: s
                .provisioner
                .batch_starts
                .then(|| crate::actors::workers::batch::BatchBook::new(s.provisioner.batch_size)),
        }
    }

    fn spec(&self, id: &MachineId) -> Option<&'a MachineSpec> {
        self.s.machines.iter().find(|m| m.id == id.as_str())
    }

    /// Plans dead machines and the unknown instances of the instance view, as the harvest
    /// policy does.
    fn plan_harvest(&mut self, dead: &[DeadMachine]) -> HarvestPlan {
        let unknown: Vec<UnknownInstance> = self
            .book
            .unknown_with_ages()
            .unwrap_or_default()
            .into_iter()
            .map(|(id, age)| UnknownInstance { id, age })
            .collect();
        let plan = self.harvest.plan(dead, &unknown);
        if self.harvest.wants_unknown() {
            for u in unknown {
                if !self.unknown.contains(&u.id) {
                    self.unknown.push(u.id);
                }
            }
            self.recheck_in = plan.recheck_in.or(self.recheck_in);
        }
        plan
    }

    /// Answers the batch planner's question from the plain cores.
    fn answer(&mut self, ask: Ask) -> Answer {
        match ask {
            // A scenario's model starts alive.
            Ask::ModelLife => Answer::Life(Ok(crate::model::Life::Alive)),
            Ask::DestroyWins => Answer::Plan(self.harvest.plan_destroy(&[])),
            Ask::RefreshZones => {
                let mut listed: Vec<(String, bool)> = self.s.cloud.zones.iter().map(|z| (z.clone(), true)).collect();
                listed.extend(self.s.cloud.unavailable_zones.iter().map(|z| (z.clone(), false)));
                self.zones.update_zones(&listed);
                Answer::Zones(Ok(()))
            }
            Ask::Refresh(ids) => {
                let ids = self.book.in_scope(ids);
                let reads: Vec<_> = ids
                    .into_iter()
                    .filter_map(|id| self.spec(&id).map(|spec| (id, Ok::<_, ModelError>(spec.to_machine()))))
                    .collect();
                let (mut refreshed, to_kill) = self.book.absorb(reads);
                for id in to_kill {
                    self.out.ensure_dead.push(id.to_string());
                    self.book.set_dead(&id);
                    refreshed.dead.extend(self.book.dead_machine(&id));
                }
                Answer::Refreshed(Ok(refreshed))
            }
            Ask::EndSafeMode => Answer::ModeChange(self.harvest.end_safe_mode()),
            Ask::PlanOrphanStops(instances) => Answer::Plan(self.harvest.plan_stops(&instances, &[], None)),
            Ask::ObserveDead(dead) => Answer::Deaths(self.lifecycle.on_deaths(&dead)),
            Ask::PlanDead(dead) => Answer::Plan(self.plan_harvest(&dead)),
            Ask::ObservePending(ids) => {
                Answer::ToStart(ids.into_iter().filter(|id| self.lifecycle.want_start(id)).collect())
            }
            Ask::StartInfo(ids) => {
                let specs: Vec<Option<&MachineSpec>> = ids.iter().map(|id| self.spec(id)).collect();
                let infos = specs
                    .iter()
                    .map(|spec| {
                        // As the simulated model answers it (`sim::run`), so a batch's shape is the
                        // run's.
                        let mut info = ProvisioningInfo::default();
                        if let Some(s) = spec {
                            info.constraints = s.constraints();
                            info.placement = s.placement.clone();
                        }
                        Ok(info)
                    })
                    .collect();
                let groups = specs
                    .iter()
                    .map(|spec| match spec {
                        Some(s) if !s.distribution_group_error.is_empty() => {
                            Err(ModelError::Other(s.distribution_group_error.clone()))
                        }
                        Some(s) => Ok(s.distribution_group.iter().flatten().map(MachineId::new).collect()),
                        None => Ok(Vec::new()),
                    })
                    .collect();
                Answer::StartInfo { infos: Ok(infos), groups: Ok(groups) }
            }
            Ask::WriteError { machine, message } => {
                self.out.failures.push(MachineNote { machine: machine.to_string(), detail: message });
                Answer::Written
            }
        }
    }

    /// Records what the batch would do.
    fn apply(&mut self, effect: Effect) {
        match effect {
            Effect::Populate(placements) => self.zones.populate(&placements),
            Effect::Gone(ids) | Effect::ForgetLifecycle(ids) => {
                for id in &ids {
                    self.lifecycle.forget(id);
                }
            }
            Effect::StopsPlanned { ids, machine } => self.book.stops_planned(&ids, machine.as_ref()),
            Effect::Execute(h) => {
                self.book.stops_planned(&h.stop, None);
                self.stopped.extend(h.stop.iter().cloned());
                self.out.stops.extend(h.stop.iter().map(ToString::to_string));
                self.out.releases.extend(h.release.iter().map(ToString::to_string));
                self.out.removals.extend(
                    h.remove_now
                        .iter()
                        .chain(&h.remove_after_stop)
                        .chain(&h.remove_after_release)
                        .map(ToString::to_string),
                );
            }
            Effect::Start(job) => {
                let id = job.machine.id.clone();
                if let Some(inst) = &job.adopt {
                    self.out.adoptions.push(MachineNote { machine: id.to_string(), detail: inst.id.to_string() });
                    return;
                }
                let placement = self.spec(&id).and_then(|m| m.placement.clone());
                let derived = match self.s.cloud.derived_zones_for(id.as_str(), placement.as_deref()) {
                    Ok(d) => d,
                    Err(e) => {
                        self.out.failures.push(MachineNote { machine: id.to_string(), detail: e });
                        return;
                    }
                };
                match self.zones.choose(&id, job.zone_request(derived)) {
                    Ok(zone) => {
                        // A wave: the starts the pool runs at once (a batch per worker).
                        let p = &self.s.provisioner;
                        let wave = p.workers.0.max(1).saturating_mul(p.batch_size.max(1));
                        let wave_ends = (self.out.starts.len() + 1) % wave == 0;
                        let batch = self.batches.as_mut().map(|b| {
                            let params = crate::ports::StartInstanceParams {
                                zone: zone.clone(),
                                ..job.call_params(SIM_MODEL_UUID, "plan")
                            };
                            let batch = b.join(params, ()).batch;
                            // A wave of starts reaches the cloud together; the next wave only
                            // once workers are free, in new calls.
                            if wave_ends {
                                b.close_all();
                            }
                            batch
                        });
                        self.out.starts.push(PlannedStart { machine: id.to_string(), zone, batch })
                    }
                    Err(e) => self.out.failures.push(MachineNote { machine: id.to_string(), detail: e.to_string() }),
                }
            }
        }
    }

    fn finish(mut self) -> Plan {
        if self.harvest.wants_unknown() {
            self.out.harvest_later =
                self.unknown.iter().filter(|u| !self.stopped.contains(*u)).map(ToString::to_string).collect();
            self.out.harvest_again_in = self.recheck_in.map(super::scenario::format_duration);
        }
        self.out
    }
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
            let batch = st.batch.map(|b| format!(" (batched call {b})")).unwrap_or_default();
            lines.push(format!("start machine {} in {}{batch}", st.machine, st.zone.as_deref().unwrap_or("(no zone)")));
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
