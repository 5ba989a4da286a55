//! The coordinator actor: sequences one batch at a time through the registry, lifecycle,
//! harvest policy, allocator and pool, and turns job outcomes into follow-up work and events.

use std::sync::Arc;

use actix::prelude::*;

use super::messages::*;
use super::state::{BatchBook, DestroyError, DestroySummary};
use crate::actors::harvest::{
    EndSafeMode, HarvestPlan, ModeChange, PlanDeadMachines, PlanDestroy, PlanStops, PlanUnknown, SetHarvestMode,
    StopsDone,
};
use crate::actors::lifecycle::{
    AfterStart, Deaths, ForgetLifecycle, ObserveDead, ObserveDestroy, ObservePending, StartFinished,
};
use crate::actors::registry::{
    ForgetMachines, InstancesGone, PrepareDestroy, RecordInstance, Refresh, RegistryError, StopsPlanned, SweepTargets,
};
use crate::actors::workers::{Enqueue, GivenUp, Job, JobOutcome, ReleaseJob, ResizePool, StartJob, StopJob};
use crate::actors::zones::{PopulateZones, RefreshZones, ReleaseMachine};
use crate::model::events::ProvisionerEvent;
use crate::model::{InstanceStatus, Machine, MachineId, MachineStatus};
use crate::ports::ModelApi;

/// Why a machine's start could not be prepared: a per-machine model read failed. The status line
/// shows the model's error (the cause); the log shows which read failed.
#[derive(Debug, thiserror::Error)]
enum StartInfoError {
    /// Reading the machine's provisioning info failed.
    #[error("fetching provisioning info for machine {:?}: {source}", machine.as_str())]
    ProvisioningInfo {
        /// The machine.
        machine: MachineId,
        /// The model's error.
        #[source]
        source: crate::ports::ModelError,
    },
    /// Reading the machine's distribution group failed.
    #[error("fetching distribution groups for machine {:?}: {source}", machine.as_str())]
    DistributionGroups {
        /// The machine.
        machine: MachineId,
        /// The model's error.
        #[source]
        source: crate::ports::ModelError,
    },
}

impl StartInfoError {
    /// The model's error, shown in the machine's status.
    fn cause(&self) -> &crate::ports::ModelError {
        match self {
            Self::ProvisioningInfo { source, .. } | Self::DistributionGroups { source, .. } => source,
        }
    }
}

/// Why a batch's provisioning info or distribution groups could not be read at all (the
/// machines are read again later).
#[derive(Debug, thiserror::Error)]
enum BatchInfoError {
    /// The model refused one of the two calls.
    #[error("{0}")]
    Model(#[source] crate::ports::ModelError),
    /// The model answered for a different number of machines than it was asked about.
    #[error("result count mismatch")]
    CountMismatch,
}

/// The coordinator's links to the other actors (all wiring happens in [`crate::actors::wiring`]).
#[derive(Clone)]
pub struct Links {
    /// The model, for provisioning info, distribution groups and transient retries.
    pub model: Arc<dyn ModelApi>,
    /// Registry: classify a batch.
    pub refresh: Recipient<Refresh>,
    /// Registry: our start produced an instance.
    pub record: Recipient<RecordInstance>,
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
    /// Lifecycle: a start returned.
    pub start_finished: Recipient<StartFinished>,
    /// Lifecycle: machines removed.
    pub forget_lifecycle: Recipient<ForgetLifecycle>,
    /// Pool: queue a job.
    pub enqueue: Recipient<Enqueue>,
    /// Pool: resize.
    pub resize: Recipient<ResizePool>,
}

/// Why a batch failed as a whole.
#[derive(Debug, thiserror::Error)]
enum BatchError {
    #[error("refreshing zones: {0}")]
    Zones(crate::ports::BrokerError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The provisioner stopped: an actor the batch needs no longer takes messages.
    #[error("actor unavailable: {0}")]
    Stopped(#[from] MailboxError),
    #[error("reading the model's life: {0}")]
    Model(crate::ports::ModelError),
}

struct BatchReport {
    zones_loaded: bool,
    retry_later: Vec<MachineId>,
    mode_change: Option<ModeChange>,
    model_dying: bool,
}

/// The provisioner's front door.
pub struct Coordinator {
    book: BatchBook,
    links: Links,
    subscribers: Vec<Recipient<ProvisionerEvent>>,
    /// Follow-up futures and one-shot timers not yet done (for quiescence checks).
    outstanding: usize,
    /// Whether transient-retry ticks are honoured (not for container provisioners).
    retry_path: bool,
    /// Which machines this provisioner acts on.
    scope: crate::config::Scope,
    /// The model is dying: nothing new is started.
    model_dying: bool,
    /// Starts are closed (a container provisioner whose host died): nothing new is started,
    /// but the harvest mode still decides what happens to dead machines' instances.
    starts_closed: bool,
}

impl Coordinator {
    /// A coordinator over these links; `workers` is the pool's initial size.
    pub fn new(
        links: Links,
        backoff: crate::config::Backoff,
        workers: usize,
        retry_path: bool,
        scope: crate::config::Scope,
    ) -> Self {
        Self {
            book: BatchBook::new(backoff, workers),
            links,
            subscribers: Vec::new(),
            outstanding: 0,
            retry_path,
            scope,
            model_dying: false,
            starts_closed: false,
        }
    }

    /// The same coordinator drawing its backoff jitter from this seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.book = self.book.with_seed(seed);
        self
    }

    fn publish(&self, event: ProvisionerEvent) {
        tracing::debug!(event = event.name(), "provisioner event");
        for s in &self.subscribers {
            s.do_send(event.clone());
        }
    }

    fn kick(&mut self, ctx: &mut Context<Self>) {
        let Some(ids) = self.book.take_batch() else { return };
        let links = self.links.clone();
        let need_zones = !self.book.zones_loaded();
        let first = !self.book.first_done();
        let fut = process_batch(links, ids.clone(), need_zones, first, self.model_dying, self.starts_closed);
        ctx.spawn(fut.into_actor(self).map(move |res, act, ctx| {
            match res {
                Ok(report) => {
                    act.model_dying |= report.model_dying;
                    if report.zones_loaded {
                        act.book.set_zones_loaded();
                    }
                    if !report.retry_later.is_empty() {
                        let delay = act.book.retry_later_delay();
                        let later = report.retry_later;
                        act.outstanding += 1;
                        ctx.run_later(delay, move |act, ctx| {
                            act.outstanding -= 1;
                            act.book.notify(later);
                            act.kick(ctx);
                        });
                    }
                    act.book.batch_succeeded();
                    act.publish(ProvisionerEvent::ProcessedMachines);
                    if report.mode_change.is_some() && act.model_dying {
                        // A dying model found at start-up: finish its destruction (a crash may
                        // have lost starts in flight or the destroy's own stop).
                        act.sweep_dying_model(ctx);
                    }
                    if let Some(change) = report.mode_change {
                        // The cache is complete: unknown instances can be told apart now.
                        if let ModeChange::Changed { mode, .. } = change {
                            act.publish(ProvisionerEvent::HarvestModeChanged { mode });
                        }
                        act.harvest_unknown(ctx, false, None);
                    }
                }
                Err(e) => {
                    let delay = act.book.batch_failed(ids);
                    tracing::warn!(error = %e, retry_in = ?delay, "processing updated machines failed; will retry");
                    ctx.run_later(delay, |act, ctx| {
                        act.book.backoff_over();
                        act.kick(ctx);
                    });
                }
            }
            act.kick(ctx);
        }));
    }

    fn mode_changed(&mut self, change: ModeChange, ctx: &mut Context<Self>) {
        let ModeChange::Changed { mode, harvest_unknown } = change else { return };
        tracing::info!(%mode, "harvest mode changed");
        self.publish(ProvisionerEvent::HarvestModeChanged { mode });
        if harvest_unknown {
            self.harvest_unknown(ctx, true, Some(std::time::Duration::ZERO));
        }
    }

    /// Harvests unknown instances (if the mode says so), judged on a listing at most
    /// `fresher_than` old.
    fn harvest_unknown(&mut self, ctx: &mut Context<Self>, announce: bool, fresher_than: Option<std::time::Duration>) {
        let ask = self.links.plan_unknown.send(PlanUnknown { fresher_than });
        self.outstanding += 1;
        ctx.spawn(ask.into_actor(self).map(move |res, act, _ctx| {
            act.outstanding -= 1;
            if let Ok(plan) = res {
                if !plan.stop.is_empty() {
                    tracing::info!(instances = ?plan.stop, "harvesting unknown instances");
                }
                act.execute(plan);
            }
            if announce {
                act.publish(ProvisionerEvent::ProcessedMachines);
            }
        }));
    }

    /// Stops every instance of the (dying) model's non-manual, non-controller machines, as
    /// the destruction did; idempotent.
    fn sweep_dying_model(&mut self, ctx: &mut Context<Self>) {
        let links = self.links.clone();
        let fut = async move {
            // Every machine in scope, those without an instance included: the ones starting
            // stop what their start produces when it lands.
            let targets = links.sweep.send(SweepTargets).await?;
            let deaths = links.observe_destroy.send(ObserveDestroy { machines: targets }).await?;
            let stop_now = deaths.stop_now.into_iter().filter(|d| d.instances().next().is_some()).collect();
            let plan = links.plan_destroy.send(PlanDestroy { machines: stop_now }).await?;
            Ok::<_, MailboxError>(plan)
        };
        self.outstanding += 1;
        ctx.spawn(fut.into_actor(self).map(|res, act, _ctx| {
            act.outstanding -= 1;
            if let Ok(plan) = res {
                if !plan.stop.is_empty() {
                    tracing::info!(instances = ?plan.stop, "model is dying: stopping what its destruction left running");
                }
                act.execute(plan);
            }
        }));
    }

    /// A dead machine whose parked instance was taken over is removed; one whose parked
    /// instance was given up is removed once that instance is stopped.
    fn retire(&mut self, retired: Option<MachineId>, given_up: Option<GivenUp>, ctx: &mut Context<Self>) {
        match (retired, given_up) {
            (_, Some(GivenUp { instance, retired })) => self.plan_stops(vec![instance], vec![retired], None, ctx),
            (Some(old), None) => {
                forget(&self.links, vec![old.clone()]);
                self.publish(ProvisionerEvent::MachineRemoved { machine: old });
            }
            (None, None) => {}
        }
    }

    /// Stops decided outside a harvest: through the harvest policy (so they are never planned
    /// twice) into a normal stop job, retried with backoff until it succeeds.
    fn plan_stops(
        &mut self,
        instances: Vec<crate::model::InstanceId>,
        remove_after: Vec<MachineId>,
        machine: Option<MachineId>,
        ctx: &mut Context<Self>,
    ) {
        if instances.is_empty() {
            return;
        }
        tracing::info!(instances = ?instances, "stopping instances given up");
        self.links.stops_planned.do_send(StopsPlanned { ids: instances.clone(), machine });
        let ask = self.links.plan_stops.send(PlanStops { instances, remove_after });
        self.outstanding += 1;
        ctx.spawn(ask.into_actor(self).map(|res, act, _ctx| {
            act.outstanding -= 1;
            if let Ok(plan) = res {
                act.execute(plan);
            }
        }));
    }

    /// Tells the harvest policy these stops are seen through, and marks for removal the dead
    /// machines that waited for them (planned while the stops were in flight).
    fn stops_done(&mut self, instances: Vec<crate::model::InstanceId>, ctx: &mut Context<Self>) {
        let ask = self.links.stops_done.send(StopsDone { instances });
        self.outstanding += 1;
        ctx.spawn(ask.into_actor(self).map(|res, act, _ctx| {
            act.outstanding -= 1;
            let Ok(machines) = res else { return };
            if machines.is_empty() {
                return;
            }
            tracing::info!(machines = ?machines, "the stops dead machines waited for are seen through; removing them");
            forget(&act.links, machines.clone());
            for m in machines {
                act.publish(ProvisionerEvent::MachineRemoved { machine: m });
            }
        }));
    }

    /// Performs a harvest plan: stops (then removals) through the pool, removals now.
    fn execute(&mut self, plan: HarvestPlan) {
        for (m, r) in &plan.park {
            tracing::info!(machine = %m, instance = %r.instance, "parking a dead machine's instance for reuse");
        }
        execute_plan(&self.links, plan.clone());
        for m in plan.remove_now {
            self.publish(ProvisionerEvent::MachineRemoved { machine: m });
        }
    }

    /// A start returned, with the instance it produced, or the orphan it could not record (to
    /// be stopped, or released if its machine died meanwhile in a mode that keeps instances).
    fn after_start(
        &mut self,
        machine: MachineId,
        instance: Option<crate::model::InstanceId>,
        orphan: Option<crate::model::InstanceId>,
        ctx: &mut Context<Self>,
    ) {
        let id = machine.clone();
        let ask = self.links.start_finished.send(StartFinished { machine, instance });
        self.outstanding += 1;
        ctx.spawn(ask.into_actor(self).then(move |res, act, ctx| {
            let with_orphan = |d: &mut crate::model::DeadMachine| {
                if let Some(o) = orphan.clone().filter(|o| d.instance.as_ref() != Some(o) && !d.tagged.contains(o)) {
                    d.tagged.push(o);
                }
            };
            let plan = match res {
                Ok(AfterStart::StopDeferred { mut dead }) => {
                    with_orphan(&mut dead);
                    tracing::info!(machine = %dead.id, instance = ?dead.instance, "machine died while starting; harvesting its instance");
                    Some(futures::future::Either::Left(act.links.plan_dead.send(PlanDeadMachines { dead: vec![dead] })))
                }
                Ok(AfterStart::DestroyDeferred { mut machine }) => {
                    with_orphan(&mut machine);
                    tracing::info!(machine = %machine.id, instance = ?machine.instance, "model destroyed while starting; stopping the new instance");
                    Some(futures::future::Either::Right(act.links.plan_destroy.send(PlanDestroy { machines: vec![machine] })))
                }
                _ => {
                    if let Some(o) = orphan.clone() {
                        act.plan_stops(vec![o], Vec::new(), Some(id.clone()), ctx);
                    }
                    None
                }
            };
            async move {
                match plan {
                    Some(p) => p.await.ok(),
                    None => None,
                }
            }
            .into_actor(act)
            .map(|plan, act, _ctx| {
                act.outstanding -= 1;
                if let Some(plan) = plan {
                    act.execute(plan);
                }
            })
        }));
    }
}

/// Enqueues a plan's work. Stops are queued ahead of starts by the pool.
fn execute_plan(links: &Links, plan: HarvestPlan) {
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

fn forget(links: &Links, machines: Vec<MachineId>) {
    if machines.is_empty() {
        return;
    }
    for m in &machines {
        links.release_zone.do_send(ReleaseMachine { machine: m.clone() });
    }
    links.forget_lifecycle.do_send(ForgetLifecycle { ids: machines.clone() });
    links.forget.do_send(ForgetMachines { ids: machines });
}

/// One batch of machine ids: classify, harvest the dead, start the pending.
async fn process_batch(
    links: Links,
    ids: Vec<MachineId>,
    need_zones: bool,
    first: bool,
    mut model_dying: bool,
    starts_closed: bool,
) -> Result<BatchReport, BatchError> {
    if first {
        // A dying model gets no new instances, even from a restarted provisioner.
        model_dying |= links.model.model_life().await.map_err(BatchError::Model)? != crate::model::Life::Alive;
        if model_dying {
            // The destruction wins over releases from the first plan on (every instance stopped,
            // whatever the mode): an empty destroy plan tells the harvest policy so.
            links.plan_destroy.send(PlanDestroy { machines: Vec::new() }).await?;
        }
    }
    let zones_loaded = if need_zones {
        links.refresh_zones.send(RefreshZones).await?.map_err(BatchError::Zones)?;
        true
    } else {
        false
    };
    let refreshed = links.refresh.send(Refresh { ids }).await??;
    // The first full notification is in the cache: leave safe mode before harvesting.
    let mode_change = if first { Some(links.end_safe.send(EndSafeMode).await?) } else { None };
    if !refreshed.placements.is_empty() {
        links.populate.do_send(PopulateZones { placements: refreshed.placements.clone() });
    }
    if !refreshed.gone.is_empty() {
        for m in &refreshed.gone {
            links.release_zone.do_send(ReleaseMachine { machine: m.clone() });
        }
        links.forget_lifecycle.do_send(ForgetLifecycle { ids: refreshed.gone.clone() });
    }

    // Orphans (instances tagged for a live machine that it will never own: a record that failed,
    // maybe a predecessor's whose stop a crash lost, or a second start whose result was lost;
    // or for a dead machine in provisioning error): stopped until the stop succeeds, never adopted.
    // A pending machine's only once the lifecycle clears it to start (or adopt) now: never
    // while a start of its own is in flight. Planned before the dead machines, so that a dead
    // machine's removal waits for its orphans' stops.
    let pending_ids: std::collections::BTreeSet<MachineId> = refreshed.pending.iter().map(|m| m.id.clone()).collect();
    let (mut pending_orphans, orphans): (Vec<_>, Vec<_>) =
        refreshed.orphans.into_iter().partition(|(m, _)| pending_ids.contains(m));
    stop_orphans(&links, orphans).await?;

    // Dead machines first, so their stops are queued ahead of the starts (so no instance is
    // duplicated).
    if !refreshed.dead.is_empty() {
        let Deaths { stop_now, deferred } = links.observe_dead.send(ObserveDead { dead: refreshed.dead }).await?;
        if !deferred.is_empty() {
            tracing::info!(machines = ?deferred, "machines died while starting; their stop waits for the start");
        }
        if !stop_now.is_empty() {
            let plan = links.plan_dead.send(PlanDeadMachines { dead: stop_now }).await?;
            execute_plan(&links, plan);
        }
    }

    let mut retry_later = refreshed.retry_later;
    if (model_dying || starts_closed) && !refreshed.pending.is_empty() {
        tracing::info!(
            machines = refreshed.pending.len(),
            "model is dying or starts are closed: not starting pending machines"
        );
    } else if !refreshed.pending.is_empty() {
        let ids = refreshed.pending.iter().map(|m| m.id.clone()).collect();
        let to_start = links.observe_pending.send(ObservePending { ids }).await?;
        let to_start: std::collections::BTreeSet<MachineId> = to_start.into_iter().collect();
        pending_orphans.retain(|(m, _)| to_start.contains(m));
        stop_orphans(&links, std::mem::take(&mut pending_orphans)).await?;
        let machines: Vec<Machine> = refreshed.pending.into_iter().filter(|m| to_start.contains(&m.id)).collect();
        if !machines.is_empty() && !zones_loaded {
            // Re-read the zone list once per batch of starts (a zone no longer available is not
            // chosen), not per machine; a failure keeps the last list (the start fails over if a
            // zone is gone).
            if let Err(e) = links.refresh_zones.send(RefreshZones).await? {
                tracing::warn!(error = %e, "refreshing availability zones failed; using the last list");
            }
        }
        let adopt: std::collections::BTreeMap<MachineId, crate::model::CloudInstance> =
            refreshed.adopt.into_iter().collect();
        retry_later.extend(queue_starts(&links, machines, adopt).await);
    }
    Ok(BatchReport { zones_loaded, retry_later, mode_change, model_dying })
}

/// Has the harvest policy plan the stop of orphaned instances, and queues it.
async fn stop_orphans(links: &Links, orphans: Vec<(MachineId, crate::model::InstanceId)>) -> Result<(), BatchError> {
    if orphans.is_empty() {
        return Ok(());
    }
    let mut instances = Vec::new();
    for (machine, inst) in orphans {
        links.stops_planned.do_send(StopsPlanned { ids: vec![inst.clone()], machine: Some(machine) });
        instances.push(inst);
    }
    tracing::info!(instances = ?instances, "stopping instances tagged for machines that will never own them");
    let plan = links.plan_stops.send(PlanStops { instances, remove_after: Vec::new() }).await?;
    execute_plan(links, plan);
    Ok(())
}

/// Reads provisioning info and distribution groups for machines cleared to start, in one
/// batched call each, and queues their starts. A per-machine failure becomes that machine's
/// provisioning error; a failed call leaves the machines to be retried later.
async fn queue_starts(
    links: &Links,
    machines: Vec<Machine>,
    mut adopt: std::collections::BTreeMap<MachineId, crate::model::CloudInstance>,
) -> Vec<MachineId> {
    // A machine with an instance already tagged for it adopts that instance: it needs neither
    // provisioning info nor a distribution group (the tagged instance is adopted first), so no
    // failing lookup can leave the tagged instance unowned.
    let (adopters, machines): (Vec<Machine>, Vec<Machine>) =
        machines.into_iter().partition(|m| adopt.contains_key(&m.id));
    for machine in adopters {
        let adopt = adopt.remove(&machine.id);
        let job = StartJob { machine, info: Default::default(), group: Vec::new(), adopt };
        links.enqueue.do_send(Enqueue(Job::Start(Box::new(job))));
    }
    if machines.is_empty() {
        return Vec::new();
    }
    let ids: Vec<MachineId> = machines.iter().map(|m| m.id.clone()).collect();
    let (infos, groups) =
        futures::join!(links.model.provisioning_info(ids.clone()), links.model.distribution_groups(ids.clone()));
    let (infos, groups) = match (infos, groups) {
        (Ok(i), Ok(g)) if i.len() == ids.len() && g.len() == ids.len() => (i, g),
        (i, g) => {
            let err = i.err().or(g.err()).map_or(BatchInfoError::CountMismatch, BatchInfoError::Model);
            tracing::warn!(machines = ?ids, error = %err, "cannot read provisioning info; will retry");
            links.forget_lifecycle.do_send(ForgetLifecycle { ids: ids.clone() });
            return ids;
        }
    };
    let mut failed = Vec::new();
    for ((machine, info), group) in machines.into_iter().zip(infos).zip(groups) {
        let err = match (info, group) {
            (Ok(info), Ok(group)) => {
                links.enqueue.do_send(Enqueue(Job::Start(Box::new(StartJob { machine, info, group, adopt: None }))));
                continue;
            }
            (Err(source), _) => StartInfoError::ProvisioningInfo { machine: machine.id.clone(), source },
            (_, Err(source)) => StartInfoError::DistributionGroups { machine: machine.id.clone(), source },
        };
        tracing::warn!(machine = %machine.id, "{err}");
        let cause = err.cause().to_string();
        let _ = links
            .model
            .set_instance_status(machine.id.clone(), InstanceStatus::provisioning_error(), cause.clone())
            .await;
        let _ = links.model.set_status(machine.id.clone(), MachineStatus::Error, cause).await;
        failed.push(machine.id);
    }
    if !failed.is_empty() {
        links.forget_lifecycle.do_send(ForgetLifecycle { ids: failed });
    }
    Vec::new()
}

impl Actor for Coordinator {
    type Context = Context<Self>;
}

impl Handler<MachinesChanged> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: MachinesChanged, ctx: &mut Self::Context) {
        self.book.notify(msg.ids);
        self.kick(ctx);
    }
}

impl Handler<RetryTick> for Coordinator {
    type Result = ();
    fn handle(&mut self, _msg: RetryTick, ctx: &mut Self::Context) {
        if !self.retry_path {
            tracing::debug!("retry tick ignored: this provisioner has no transient-retry path");
            return;
        }
        let model = self.links.model.clone();
        let scope = self.scope.clone();
        let fut = async move {
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
                    && model
                        .set_instance_status(m.id.clone(), InstanceStatus::provisioning(), String::new())
                        .await
                        .is_ok();
                if ok {
                    reset.push(m.id);
                } else {
                    tracing::warn!(machine = %m.id, "cannot reset status for a retry; skipped");
                }
            }
            reset
        };
        self.outstanding += 1;
        ctx.spawn(fut.into_actor(self).map(|ids, act, ctx| {
            act.outstanding -= 1;
            if ids.is_empty() {
                return;
            }
            act.book.notify(ids);
            act.kick(ctx);
            act.publish(ProvisionerEvent::RetriedMachinesWithErrors);
        }));
    }
}

impl Handler<ChangeHarvestMode> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: ChangeHarvestMode, ctx: &mut Self::Context) {
        let ask = self.links.set_mode.send(SetHarvestMode(msg.0));
        self.outstanding += 1;
        ctx.spawn(ask.into_actor(self).map(|res, act, ctx| {
            act.outstanding -= 1;
            if let Ok(change) = res {
                act.mode_changed(change, ctx);
            }
        }));
    }
}

impl Handler<SetWorkers> for Coordinator {
    type Result = ResponseActFuture<Self, Result<(), ResizeError>>;
    fn handle(&mut self, msg: SetWorkers, _ctx: &mut Self::Context) -> Self::Result {
        let n = msg.0;
        if n == self.book.workers() {
            return Box::pin(fut::ready(Ok(())));
        }
        let ask = self.links.resize.send(ResizePool(n));
        Box::pin(ask.into_actor(self).map(move |res, act, _ctx| {
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(ResizeError::Invalid(e)),
                Err(e) => return Err(ResizeError::Stopped(e)),
            }
            if act.book.set_workers(n) {
                act.publish(ProvisionerEvent::ResizedWorkerPool { size: n });
            }
            Ok(())
        }))
    }
}

impl Handler<Subscribe> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: Subscribe, _ctx: &mut Self::Context) {
        self.subscribers.push(msg.0);
    }
}

impl Handler<ViewRefreshed> for Coordinator {
    type Result = ();
    fn handle(&mut self, _msg: ViewRefreshed, ctx: &mut Self::Context) {
        if self.book.first_done() {
            self.harvest_unknown(ctx, false, None);
        }
    }
}

impl Handler<JobDone> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: JobDone, ctx: &mut Self::Context) {
        match msg.0 {
            JobOutcome::Started { machine, instance, constraints, retired, reserved, given_up } => {
                self.retire(retired, given_up, ctx);
                if let Some(zone) = instance.zone.as_ref().filter(|_| !reserved) {
                    // Adopted and reused instances were never reserved: count them now.
                    self.links.populate.do_send(PopulateZones { placements: vec![(machine.clone(), zone.clone())] });
                }
                self.links.record.do_send(RecordInstance {
                    machine: machine.clone(),
                    instance: instance.clone(),
                    constraints,
                });
                self.publish(ProvisionerEvent::MachineStarted {
                    machine: machine.clone(),
                    instance: instance.id.clone(),
                    zone: instance.zone.clone(),
                });
                self.after_start(machine, Some(instance.id), None, ctx);
            }
            JobOutcome::StartFailed { machine, error, retired, orphan, given_up } => {
                self.retire(retired, given_up, ctx);
                // The event says what the machine's status says: the error's text.
                let message = error.to_string();
                self.publish(ProvisionerEvent::MachineFailed { machine: machine.clone(), message });
                self.after_start(machine, None, orphan, ctx);
            }
            JobOutcome::StartAbandoned { machine, given_up } => {
                self.retire(None, given_up, ctx);
                self.after_start(machine, None, None, ctx);
            }
            JobOutcome::Stopped { instances, machines } => {
                self.links.gone.do_send(InstancesGone { ids: instances.clone() });
                self.stops_done(instances.clone(), ctx);
                forget(&self.links, machines.clone());
                self.publish(ProvisionerEvent::InstancesStopped { instances });
                for m in machines {
                    self.publish(ProvisionerEvent::MachineRemoved { machine: m });
                }
            }
            JobOutcome::Released { instances, machines } => {
                forget(&self.links, machines.clone());
                self.publish(ProvisionerEvent::InstancesReleased { instances });
                for m in machines {
                    self.publish(ProvisionerEvent::MachineRemoved { machine: m });
                }
            }
        }
    }
}

impl Handler<crate::actors::messages::Busy> for Coordinator {
    type Result = usize;
    fn handle(&mut self, _msg: crate::actors::messages::Busy, _ctx: &mut Self::Context) -> usize {
        self.book.busy() + self.outstanding
    }
}

impl Handler<DestroyModel> for Coordinator {
    type Result = ResponseActFuture<Self, Result<DestroySummary, DestroyError>>;

    fn handle(&mut self, msg: DestroyModel, _ctx: &mut Self::Context) -> Self::Result {
        let links = self.links.clone();
        let fut = async move {
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
            if !msg.force && !targets.manual.is_empty() {
                return Err(DestroyError::ManualMachines { ids: targets.manual, summary });
            }
            Ok(summary)
        };
        self.model_dying = true;
        Box::pin(fut.into_actor(self).map(|res, act, _ctx| {
            if matches!(res, Err(DestroyError::AlreadyDying)) {
                // Nothing changed by this call; the model was already dying.
                act.model_dying = true;
            }
            res
        }))
    }
}

impl Handler<ExecutePlan> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: ExecutePlan, _ctx: &mut Self::Context) {
        self.execute(msg.0);
    }
}

impl Handler<CloseStarts> for Coordinator {
    type Result = ();
    fn handle(&mut self, _msg: CloseStarts, _ctx: &mut Self::Context) {
        self.starts_closed = true;
    }
}

impl Handler<ModelDestroyed> for Coordinator {
    type Result = ();
    fn handle(&mut self, _msg: ModelDestroyed, ctx: &mut Self::Context) {
        self.model_dying = true;
        // Before the first batch the cache is incomplete: that batch reads the model's life
        // and sweeps then.
        if self.book.first_done() {
            self.sweep_dying_model(ctx);
        }
    }
}
