//! The coordinator actor: sequences one batch at a time through the registry, lifecycle,
//! harvest policy, allocator and pool, and turns job outcomes into follow-up work and events.

use actix::prelude::*;

use super::batch::BatchStart;
use super::links::{execute_plan, forget, run_batch, Links};
use super::messages::*;
use super::state::{BatchBook, DestroyError, DestroySummary};
use crate::actors::harvest::{
    HarvestPlan, ModeChange, PlanDeadMachines, PlanDestroy, PlanStops, PlanUnknown, SetHarvestMode, StopsDone,
};
use crate::actors::lifecycle::{AfterStart, ObserveDestroy, StartFinished};
use crate::actors::registry::{InstancesGone, PrepareDestroy, RecordInstance, StopsPlanned, SweepTargets};
use crate::actors::workers::{GivenUp, JobOutcome, ResizePool};
use crate::actors::zones::PopulateZones;
use crate::model::events::ProvisionerEvent;
use crate::model::{InstanceStatus, MachineId, MachineStatus};

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
        let start = BatchStart {
            ids: ids.clone(),
            first,
            need_zones,
            model_dying: self.model_dying,
            starts_closed: self.starts_closed,
        };
        let fut = run_batch(links, start);
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
            JobOutcome::StartFailed { machine, message, retired, orphan, given_up } => {
                self.retire(retired, given_up, ctx);
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
