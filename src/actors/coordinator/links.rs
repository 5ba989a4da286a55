//! The coordinator's links to the other actors, and how the shell carries out what its cores
//! decide over them: a batch's [`Ask`]s and [`Effect`]s, a harvest plan, a removal.

use std::sync::Arc;

use actix::prelude::*;

use super::batch::{Answer, Ask, BatchFailure, BatchOutcome, BatchRun, BatchStart, Effect, Next};
use super::followup::AfterStartStep;
use super::state::{DestroyError, DestroySummary};
use crate::actors::harvest::{
    EndSafeMode, HarvestPlan, PlanDeadMachines, PlanDestroy, PlanExtras, PlanStops, PlanUnknown, SetHarvestMode,
    StopsDone,
};
use crate::actors::lifecycle::{
    ForgetLifecycle, ObserveDead, ObserveDestroy, ObservePending, StartsFinished, WithoutStart,
};
use crate::actors::registry::{
    ForgetMachines, InstancesGone, PrepareDestroy, RecordInstances, Refresh, StopsPlanned, SweepTargets,
};
use crate::actors::workers::{Enqueue, Job, ReleaseJob, ResizePool, StartJob, StopJob};
use crate::actors::zones::{PopulateZones, RefreshZones, ReleaseMachine};
use crate::model::{InstanceId, InstanceStatus, MachineId, MachineStatus};
use crate::ports::ModelApi;

/// The coordinator's links to the other actors (all wiring happens in [`crate::wiring`]).
#[derive(Clone)]
pub struct Links {
    /// The model, for provisioning info, distribution groups and transient retries.
    pub model: Arc<dyn ModelApi>,
    /// Registry: classify a batch.
    pub refresh: Recipient<Refresh>,
    /// Registry: our starts produced instances.
    pub record: Recipient<RecordInstances>,
    /// Registry: instances terminated.
    pub gone: Recipient<InstancesGone>,
    /// Registry: remove dead machines.
    pub forget: Recipient<ForgetMachines>,
    /// Allocator: reload zones.
    pub refresh_zones: Recipient<RefreshZones>,
    /// Allocator: count existing placements.
    pub populate: Recipient<PopulateZones>,
    /// Allocator: forget a machine.
    pub release_zone: Recipient<ReleaseMachine>,
    /// Harvest: plan dead machines.
    pub plan_dead: Recipient<PlanDeadMachines>,
    /// Harvest: plan unknown instances.
    pub plan_unknown: Recipient<PlanUnknown>,
    /// Harvest: change mode.
    pub set_mode: Recipient<SetHarvestMode>,
    /// Harvest: leave safe mode.
    pub end_safe: Recipient<EndSafeMode>,
    /// Harvest: stops done.
    pub stops_done: Recipient<StopsDone>,
    /// Harvest: plan a model destruction.
    pub plan_destroy: Recipient<PlanDestroy>,
    /// Harvest: plan stops decided outside a harvest (orphans, given-up parked instances).
    pub plan_stops: Recipient<PlanStops>,
    /// Harvest: plan the stop of live machines' extra instances.
    pub plan_extras: Recipient<PlanExtras>,
    /// Lifecycle: which extra instances have no start of their machine in flight.
    pub without_start: Recipient<WithoutStart>,
    /// Registry: stops decided (their instances are never adopted).
    pub stops_planned: Recipient<StopsPlanned>,
    /// Registry: the machines of a model being destroyed.
    pub prepare_destroy: Recipient<PrepareDestroy>,
    /// Registry: what a dying model still runs, from the cache.
    pub sweep: Recipient<SweepTargets>,
    /// Lifecycle: the model is being destroyed.
    pub observe_destroy: Recipient<ObserveDestroy>,
    /// Lifecycle: pending machines.
    pub observe_pending: Recipient<ObservePending>,
    /// Lifecycle: dead machines.
    pub observe_dead: Recipient<ObserveDead>,
    /// Lifecycle: starts returned.
    pub start_finished: Recipient<StartsFinished>,
    /// Lifecycle: machines removed.
    pub forget_lifecycle: Recipient<ForgetLifecycle>,
    /// Pool: queue a job.
    pub enqueue: Recipient<Enqueue>,
    /// Pool: resize.
    pub resize: Recipient<ResizePool>,
}

/// Why a batch failed as a whole.
#[derive(Debug, thiserror::Error)]
pub(super) enum BatchError {
    /// The planner's reason.
    #[error(transparent)]
    Failed(#[from] BatchFailure),
    /// The provisioner stopped: an actor the batch asked no longer takes messages.
    #[error("actor unavailable: {0}")]
    Stopped(#[from] MailboxError),
}

/// Runs one batch: carries out the planner's effects in order and answers its questions.
/// Where interruption notices are looked up and acknowledged (issue 33): present when the
/// wiring started an interruption poller.
pub struct InterruptionLinks {
    /// The registry: what each notice's instance is to us.
    pub noticed: Recipient<crate::actors::registry::NoticedInstances>,
    /// The poller: acknowledges notices acted on.
    pub acknowledge: Recipient<crate::actors::interruptions::AcknowledgeNotices>,
    /// The lifecycle: a replacement starts the machine again.
    pub begin: Recipient<crate::actors::lifecycle::BeginReplacement>,
    /// The zone allocator: a spot replacement avoids the interrupted instance's zone.
    pub short: Recipient<crate::actors::zones::RememberCapacity>,
    /// The registry: the hand-overs a listing shows under way (asked once, after the first
    /// batch).
    pub resumable: Recipient<crate::actors::registry::ResumableHandovers>,
    /// The poller: a spot replacement's broker avoids the interrupted instance's type there.
    pub short_type: Recipient<crate::actors::interruptions::CapacityShort>,
    /// The poller: notices to look at again at their next delivery.
    pub release: Recipient<crate::actors::interruptions::ReleaseNotices>,
    /// The poller: the states of replacements not yet seen running.
    pub states: Recipient<crate::actors::interruptions::ReplacementStates>,
    /// The poller: our instances whose cloud status checks fail (repairs, issue 34).
    pub impaired: Recipient<crate::actors::interruptions::ImpairedInstances>,
    /// The registry: the machines whose recorded instance it lists (drift, issue 34).
    pub listed: Recipient<crate::actors::registry::ListedMachines>,
    /// The registry: which of them have drifted from their provisioning info.
    pub drift_of: Recipient<crate::actors::registry::DriftOf>,
    /// The first half of every nonce (a replacement's start is looked up by its nonce).
    pub host_tag: String,
}

pub(super) async fn run_batch(links: Arc<Links>, start: BatchStart) -> Result<BatchOutcome, BatchError> {
    let machines = start.ids.len();
    let (mut run, mut steps) = BatchRun::new(start);
    loop {
        let picked = steps.effects.iter().filter(|e| matches!(e, Effect::Start(_))).count();
        for effect in steps.effects {
            match effect {
                Effect::Start(mut job) => {
                    job.trace = picked_span(&job, machines, picked);
                    perform(&links, Effect::Start(job));
                }
                effect => perform(&links, effect),
            }
        }
        let ask = match steps.next {
            Next::Done(outcome) => return Ok(outcome),
            Next::Ask(ask) => ask,
        };
        let answer = ask_links(&links, ask).await?;
        steps = run.answer(answer)?;
    }
}

/// The span a start is picked under (issue 37), in its machine's trace: a child of the request
/// that added the machine (the trace context stored with it), linked to its host's for a
/// container; it names the batch (`machines` looked at, `picked` of them started together)
/// and is the parent of the worker's `start` span (the gap before it is the wait for a
/// worker). Disabled unless traces are exported.
fn picked_span(job: &StartJob, machines: usize, picked: usize) -> crate::trace::Carried {
    let span = tracing::info_span!(
        target: crate::trace::TRACE_TARGET,
        parent: None,
        "coordinator batch",
        machine = %job.machine.id,
        batch.machines = machines,
        batch.starts = picked,
    );
    crate::trace::continue_from(&span, job.info.trace_parent.as_deref());
    crate::trace::link_to(&span, job.info.host_trace_parent.as_deref());
    crate::trace::Carried(span)
}

/// Asks what the planner asks.
async fn ask_links(links: &Links, ask: Ask) -> Result<Answer, MailboxError> {
    Ok(match ask {
        Ask::ModelLife => Answer::Life(links.model.model_life().await),
        Ask::DestroyWins => Answer::Plan(links.plan_destroy.send(PlanDestroy { machines: Vec::new() }).await?),
        Ask::RefreshZones => Answer::Zones(links.refresh_zones.send(RefreshZones).await?.map(drop)),
        Ask::Refresh(ids) => Answer::Refreshed(links.refresh.send(Refresh { ids }).await?),
        Ask::EndSafeMode => Answer::ModeChange(links.end_safe.send(EndSafeMode).await?),
        Ask::PlanOrphanStops(instances) => {
            Answer::Plan(links.plan_stops.send(PlanStops { instances, remove_after: Vec::new(), machine: None }).await?)
        }
        Ask::ObserveDead(dead) => Answer::Deaths(links.observe_dead.send(ObserveDead { dead }).await?),
        Ask::PlanDead(dead) => Answer::Plan(links.plan_dead.send(PlanDeadMachines { dead }).await?),
        Ask::ObservePending(ids) => Answer::ToStart(links.observe_pending.send(ObservePending { ids }).await?),
        Ask::StartInfo(ids) => {
            let (infos, groups) =
                futures::join!(links.model.provisioning_info(ids.clone()), links.model.distribution_groups(ids));
            Answer::StartInfo { infos, groups }
        }
        Ask::WriteError { machine, message } => {
            let status = InstanceStatus::provisioning_error();
            let _ = links.model.set_instance_status(machine.clone(), status, message.clone()).await;
            let _ = links.model.set_status(machine, MachineStatus::Error, message).await;
            Answer::Written
        }
    })
}

/// Carries out one effect.
pub(super) fn perform(links: &Links, effect: Effect) {
    match effect {
        Effect::Populate(placements) => links.populate.do_send(PopulateZones { placements }),
        Effect::Gone(ids) => {
            for m in &ids {
                links.release_zone.do_send(ReleaseMachine { machine: m.clone() });
            }
            links.forget_lifecycle.do_send(ForgetLifecycle { ids });
        }
        Effect::StopsPlanned { ids, machine } => links.stops_planned.do_send(StopsPlanned { ids, machine }),
        Effect::Execute(plan) => execute_plan(links, *plan),
        Effect::Start(job) => links.enqueue.do_send(Enqueue(Job::Start(job))),
        Effect::ForgetLifecycle(ids) => links.forget_lifecycle.do_send(ForgetLifecycle { ids }),
    }
}

/// Enqueues a plan's work. Stops are queued ahead of starts by the pool.
pub(super) fn execute_plan(links: &Links, plan: HarvestPlan) {
    if !plan.stop.is_empty() {
        links.stops_planned.do_send(StopsPlanned { ids: plan.stop.clone(), machine: None });
        links.enqueue.do_send(Enqueue(Job::Stop(StopJob {
            instances: plan.stop,
            machines: plan.remove_after_stop,
            attempt: 0,
            eager: plan.eager,
        })));
    }
    if !plan.release.is_empty() {
        links.enqueue.do_send(Enqueue(Job::Release(ReleaseJob {
            instances: plan.release,
            machines: plan.remove_after_release,
            attempt: 0,
        })));
    }
    forget(links, plan.remove_now);
}

pub(super) fn forget(links: &Links, machines: Vec<MachineId>) {
    if machines.is_empty() {
        return;
    }
    for m in &machines {
        links.release_zone.do_send(ReleaseMachine { machine: m.clone() });
    }
    links.forget_lifecycle.do_send(ForgetLifecycle { ids: machines.clone() });
    links.forget.do_send(ForgetMachines { ids: machines });
}

/// What the (dying) model still runs, planned for stopping: every machine in scope, those
/// without an instance included (the ones starting stop what their start produces when it
/// lands).
pub(super) async fn plan_sweep(links: Arc<Links>) -> Result<HarvestPlan, MailboxError> {
    let targets = links.sweep.send(SweepTargets).await?;
    let deaths = links.observe_destroy.send(ObserveDestroy { machines: targets }).await?;
    links.plan_destroy.send(PlanDestroy { machines: deaths.into_sweep() }).await
}

/// Resets the status of this provisioner's machines with transient errors, for a retry;
/// answers those reset.
pub(super) async fn reset_transient(model: Arc<dyn ModelApi>, scope: crate::config::Scope) -> Vec<MachineId> {
    let machines = match model.machines_with_transient_errors().await {
        // Only this provisioner's machines: containers have no retry path (as in Juju).
        Ok(m) => m.into_iter().filter(|m| scope.contains(&m.id)).collect::<Vec<_>>(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read machines with transient errors");
            return Vec::new();
        }
    };
    let mut reset = Vec::new();
    for m in machines {
        let ok = model.set_status(m.id.clone(), MachineStatus::Pending, String::new()).await.is_ok()
            && model.set_instance_status(m.id.clone(), InstanceStatus::provisioning(), String::new()).await.is_ok();
        if ok {
            reset.push(m.id);
        } else {
            tracing::warn!(machine = %m.id, "cannot reset status for a retry; skipped");
        }
    }
    reset
}

/// Destroys the model and stops what it runs (see [`DestroyModel`](super::DestroyModel)).
pub(super) async fn destroy(links: Arc<Links>, force: bool) -> Result<DestroySummary, DestroyError> {
    let machines = match links.model.destroy_model().await {
        Ok(m) => m,
        Err(crate::ports::ModelError::ModelDying) => return Err(DestroyError::AlreadyDying),
        Err(e) => return Err(DestroyError::Model(e)),
    };
    let unavailable = DestroyError::Unavailable;
    let targets = links.prepare_destroy.send(PrepareDestroy { machines }).await.map_err(unavailable)?;
    let deaths =
        links.observe_destroy.send(ObserveDestroy { machines: targets.machines }).await.map_err(unavailable)?;
    let plan = links.plan_destroy.send(PlanDestroy { machines: deaths.stop_now }).await.map_err(unavailable)?;
    let summary = DestroySummary { stopping: plan.stop.clone(), awaiting_starts: deaths.deferred };
    tracing::info!(stopping = ?summary.stopping, awaiting = ?summary.awaiting_starts, "model destroyed: stopping its instances");
    execute_plan(&links, plan);
    if !force && !targets.manual.is_empty() {
        return Err(DestroyError::ManualMachines { ids: targets.manual, summary });
    }
    Ok(summary)
}

/// Plans the stop of live machines' extra instances (issue 32): the lifecycle leaves out
/// machines with a start in flight (and any start's product), then the harvest policy plans one
/// stop of those neither released, parked nor already being stopped. Answers the plan and the
/// machines of the instances it stops.
pub(super) async fn plan_extras(
    links: Arc<Links>,
    extras: Vec<(MachineId, InstanceId)>,
) -> Result<(HarvestPlan, Vec<MachineId>), MailboxError> {
    let extras = links.without_start.send(WithoutStart { extras }).await?;
    if extras.is_empty() {
        return Ok((HarvestPlan::default(), Vec::new()));
    }
    let instances = extras.iter().map(|(_, i)| i.clone()).collect();
    let plan = links.plan_extras.send(PlanExtras { instances }).await?;
    let mut machines: Vec<MachineId> =
        extras.into_iter().filter(|(_, i)| plan.stop.contains(i)).map(|(m, _)| m).collect();
    machines.sort();
    machines.dedup();
    Ok((plan, machines))
}

/// Has the harvest policy plan what a finished start left behind (see
/// [`after_start`](super::followup::after_start)): a machine that died, or a model destroyed,
/// while it started.
pub(super) async fn plan_after_start(links: Arc<Links>, step: AfterStartStep) -> Option<HarvestPlan> {
    match step {
        AfterStartStep::PlanDead(dead) => links.plan_dead.send(PlanDeadMachines { dead: vec![dead] }).await.ok(),
        AfterStartStep::PlanDestroy(machine) => {
            links.plan_destroy.send(PlanDestroy { machines: vec![machine] }).await.ok()
        }
        AfterStartStep::Then(_) => None,
    }
}
