//! The machine registry actor: a thin shell over [`MachineBook`] that performs the model and
//! cloud calls.

use std::sync::Arc;

use actix::prelude::*;
use futures::future::join_all;

use super::messages::*;
use super::state::{MachineBook, Refreshed, RegistryError, RegistrySnapshot};
use crate::actors::coordinator::ViewRefreshed;
use crate::actors::work::{BusyState, WorkCount};
use crate::config::Backoff;
use crate::model::MachineId;
use crate::ports::{Broker, ModelApi, ModelError};

/// Owns the machine cache and the instance view.
pub struct MachineRegistry {
    book: MachineBook,
    broker: Arc<dyn Broker>,
    model: Arc<dyn ModelApi>,
    backoff: Backoff,
    rng: rand::rngs::StdRng,
    resync_interval: std::time::Duration,
    resync_failures: u32,
    on_refresh: Option<Recipient<ViewRefreshed>>,
    /// Removals not yet acknowledged by the model, one guard each.
    removals: WorkCount,
    /// A stale view (a listing failed after one succeeded), in the provisioner's total.
    stale: BusyState,
    /// When the last successful listing was loaded.
    listed_at: Option<actix_rt::time::Instant>,
    /// The book's clock starts here.
    epoch: actix_rt::time::Instant,
}

impl MachineRegistry {
    /// A registry over these ports; `on_refresh` hears of every successful periodic listing.
    pub fn new(
        scope: crate::config::Scope,
        broker: Arc<dyn Broker>,
        model: Arc<dyn ModelApi>,
        backoff: Backoff,
        resync_interval: std::time::Duration,
        on_refresh: Option<Recipient<ViewRefreshed>>,
    ) -> Self {
        let removals = WorkCount::new();
        Self {
            book: MachineBook::with_scope(scope),
            broker,
            model,
            backoff,
            rng: rand::SeedableRng::seed_from_u64(0),
            resync_interval,
            resync_failures: 0,
            on_refresh,
            stale: BusyState::new(&removals),
            removals,
            listed_at: None,
            epoch: actix_rt::time::Instant::now(),
        }
    }

    /// The same registry counting its work in `work`'s total (its provisioner's).
    pub fn with_work(mut self, work: WorkCount) -> Self {
        self.stale = BusyState::new(&work);
        self.removals = work;
        self
    }

    /// The same registry with these safeguards turned off (issue 35's mutation tests).
    pub fn with_mutations(mut self, mutations: crate::config::Mutations) -> Self {
        self.book = std::mem::take(&mut self.book).with_mutations(mutations);
        self
    }

    /// The same registry drawing its backoff jitter from this seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.rng = rand::SeedableRng::seed_from_u64(seed);
        self
    }

    fn schedule_resync(&self, ctx: &mut Context<Self>, after: std::time::Duration) {
        ctx.run_later(after, |act, ctx| act.resync(ctx));
    }

    /// Asks the cloud for a listing, numbered for the book (see `MachineBook::issue_listing`).
    fn list(&mut self) -> (crate::ports::BrokerFuture<Vec<crate::model::CloudInstance>>, u64) {
        (self.broker.all_instances(), self.book.issue_listing())
    }

    /// The periodic listing, with the image a start uses today (for drift, issue 34; a cloud
    /// that cannot say this time leaves image drift unjudged until it can).
    fn resync(&mut self, ctx: &mut Context<Self>) {
        let (listing, number) = self.list();
        let image = self.broker.current_image();
        let both = async move {
            let (list, image) = futures::join!(listing, image);
            let image = image.unwrap_or_else(|e| {
                tracing::debug!(error = %e, "cannot read the image a start uses; image drift not judged");
                None
            });
            list.map(|l| (l, image))
        };
        ctx.spawn(both.into_actor(self).map(move |res, act, ctx| match res {
            Ok((list, image)) => {
                act.load(list, number);
                act.book.set_current_image(image);
                act.resync_failures = 0;
                act.report_status_changes(ctx);
                if let Some(r) = &act.on_refresh {
                    // Judged on this fresh listing: the coordinator has them stopped.
                    let (stopped, population) = act.book.stopped_machines();
                    r.do_send(ViewRefreshed {
                        extras: act.book.extra_instances(),
                        resumes: act.book.resumable_handovers(),
                        stopped,
                        population,
                    });
                }
                act.schedule_resync(ctx, act.resync_interval);
            }
            Err(e) => {
                act.mark_stale();
                let delay = act.backoff.delay(act.resync_failures, &mut act.rng).min(act.resync_interval);
                act.resync_failures += 1;
                tracing::warn!(error = %e, retry_in = ?delay, "cloud listing failed; not harvesting until one succeeds");
                act.schedule_resync(ctx, delay);
            }
        }));
    }

    fn tick(&mut self) {
        self.book.set_clock(self.epoch.elapsed());
    }

    fn load(&mut self, list: Vec<crate::model::CloudInstance>, number: u64) {
        self.tick();
        self.book.load_listing(list, number);
        self.listed_at = Some(actix_rt::time::Instant::now());
        self.stale.set(false);
    }

    /// The last listing failed: the resync retries it, work in flight until it succeeds.
    fn mark_stale(&mut self) {
        self.book.listing_failed();
        self.stale.set(self.book.loaded_once() && !self.book.is_fresh());
    }

    /// Writes instance statuses that changed outside our control (an instance stopped in the cloud
    /// shows as `stopped`).
    fn report_status_changes(&mut self, ctx: &mut Context<Self>) {
        for (id, status, message) in self.book.status_changes() {
            tracing::info!(machine = %id, %status, "instance status changed outside the provisioner");
            let call = self.model.set_instance_status(id.clone(), status, message);
            ctx.spawn(call.into_actor(self).map(move |res, _act, _ctx| {
                if let Err(e) = res {
                    tracing::warn!(machine = %id, error = %e, "cannot write instance status");
                }
            }));
        }
    }

    fn mark_for_removal(&mut self, ctx: &mut Context<Self>, id: MachineId, attempt: u32) {
        let call = self.model.mark_for_removal(id.clone());
        let removal = self.removals.guard();
        ctx.spawn(call.into_actor(self).map(move |res, act, ctx| match res {
            Ok(()) | Err(ModelError::NotFound(_)) => drop(removal),
            Err(e) => {
                let delay = act.backoff.delay(attempt, &mut act.rng);
                tracing::warn!(machine = %id, error = %e, retry_in = ?delay, "mark for removal failed");
                ctx.run_later(delay, move |act, ctx| {
                    act.mark_for_removal(ctx, id, attempt + 1);
                    drop(removal);
                });
            }
        }));
    }
}

impl Actor for MachineRegistry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::actors::unlimited_mailbox(ctx);
        let interval = self.resync_interval;
        self.schedule_resync(ctx, interval);
    }
}

impl Handler<Refresh> for MachineRegistry {
    type Result = ResponseActFuture<Self, Result<Refreshed, RegistryError>>;

    fn handle(&mut self, msg: Refresh, _ctx: &mut Self::Context) -> Self::Result {
        let listing = (!self.book.loaded_once()).then(|| self.list());
        let model = self.model.clone();
        // Machines outside this provisioner's scope are none of its business.
        let ids = self.book.in_scope(msg.ids);
        let fut = async move {
            let listing = match listing {
                Some((call, number)) => Some((call.await.map_err(RegistryError::Listing)?, number)),
                None => None,
            };
            let reads = if ids.is_empty() {
                Vec::new()
            } else {
                model
                    .machines(ids.clone())
                    .await
                    .map_err(|source| RegistryError::Machines { ids: ids.clone(), source })?
            };
            Ok((listing, ids, reads))
        };
        Box::pin(fut.into_actor(self).then(|res, act, _ctx| {
            let model = act.model.clone();
            let mut out = Refreshed::default();
            let mut to_kill = Vec::new();
            let mut failed = None;
            match res {
                Err(e) => {
                    if matches!(e, RegistryError::Listing(_)) {
                        act.mark_stale();
                    }
                    failed = Some(e);
                }
                Ok((listing, ids, reads)) => {
                    if let Some((list, number)) = listing {
                        act.load(list, number);
                    }
                    let (refreshed, kill) = act.book.absorb(ids.into_iter().zip(reads));
                    out = refreshed;
                    to_kill = kill;
                }
            }
            let kills = join_all(to_kill.into_iter().map(move |id| {
                let call = model.ensure_dead(id.clone());
                async move { (id, call.await) }
            }));
            kills.into_actor(act).map(move |results, act, _ctx| match failed {
                Some(e) => Err(e),
                None => {
                    act.book.killed(results, &mut out);
                    Ok(out)
                }
            })
        }))
    }
}

impl Handler<RecordInstances> for MachineRegistry {
    type Result = ();
    fn handle(&mut self, msg: RecordInstances, _ctx: &mut Self::Context) {
        for r in msg.0 {
            self.book.record_started(&r.machine, r.instance, r.constraints);
        }
    }
}

impl Handler<InstancesGone> for MachineRegistry {
    type Result = ();
    fn handle(&mut self, msg: InstancesGone, _ctx: &mut Self::Context) {
        self.book.instances_gone(&msg.ids);
    }
}

impl Handler<StopsPlanned> for MachineRegistry {
    type Result = ();
    fn handle(&mut self, msg: StopsPlanned, _ctx: &mut Self::Context) {
        self.book.stops_planned(&msg.ids, msg.machine.as_ref());
    }
}

impl Handler<ForgetMachines> for MachineRegistry {
    type Result = ();
    fn handle(&mut self, msg: ForgetMachines, ctx: &mut Self::Context) {
        for id in msg.ids {
            self.book.remove(&id);
            self.mark_for_removal(ctx, id, 0);
        }
    }
}

impl Handler<UnknownInstances> for MachineRegistry {
    type Result = ResponseActFuture<Self, Result<Vec<(crate::model::InstanceId, std::time::Duration)>, RegistryError>>;
    fn handle(&mut self, msg: UnknownInstances, _ctx: &mut Self::Context) -> Self::Result {
        let stale = match (msg.fresher_than, self.listed_at) {
            (Some(max), Some(at)) => at.elapsed() > max,
            (Some(_), None) => true,
            (None, _) => false,
        };
        self.tick();
        if !stale {
            return Box::pin(fut::ready(self.book.unknown_with_ages().ok_or(RegistryError::ViewStale)));
        }
        let (listing, number) = self.list();
        Box::pin(listing.into_actor(self).map(move |res, act, ctx| match res {
            Ok(list) => {
                act.load(list, number);
                act.report_status_changes(ctx);
                act.book.unknown_with_ages().ok_or(RegistryError::ViewStale)
            }
            Err(e) => {
                act.mark_stale();
                Err(RegistryError::Listing(e))
            }
        }))
    }
}

impl Handler<Adoptable> for MachineRegistry {
    type Result = Option<crate::model::CloudInstance>;
    fn handle(&mut self, msg: Adoptable, _ctx: &mut Self::Context) -> Self::Result {
        self.book.adoptable(&msg.machine)
    }
}

impl Handler<NoticedInstances> for MachineRegistry {
    type Result = MessageResult<NoticedInstances>;
    fn handle(&mut self, msg: NoticedInstances, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(msg.0.iter().map(|id| self.book.noticed(id)).collect())
    }
}

impl Handler<ListedMachines> for MachineRegistry {
    type Result = MessageResult<ListedMachines>;
    fn handle(&mut self, _msg: ListedMachines, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.listed_machines())
    }
}

impl Handler<DriftOf> for MachineRegistry {
    type Result = MessageResult<DriftOf>;
    fn handle(&mut self, msg: DriftOf, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.drifted(&msg.0))
    }
}

impl Handler<ResumableHandovers> for MachineRegistry {
    type Result = MessageResult<ResumableHandovers>;
    fn handle(&mut self, _msg: ResumableHandovers, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.resumable_handovers())
    }
}

impl Handler<GetRegistrySnapshot> for MachineRegistry {
    type Result = MessageResult<GetRegistrySnapshot>;
    fn handle(&mut self, _msg: GetRegistrySnapshot, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(RegistrySnapshot {
            machines: self.book.machines().cloned().collect(),
            instances: self.book.instances().cloned().collect(),
            fresh: self.book.is_fresh(),
        })
    }
}

impl Handler<crate::actors::messages::Busy> for MachineRegistry {
    type Result = usize;
    fn handle(&mut self, _msg: crate::actors::messages::Busy, _ctx: &mut Self::Context) -> usize {
        // A stale view is a one-shot retry pending.
        self.removals.count() + usize::from(self.book.loaded_once() && !self.book.is_fresh())
    }
}

impl Handler<PrepareDestroy> for MachineRegistry {
    type Result = MessageResult<PrepareDestroy>;
    fn handle(&mut self, msg: PrepareDestroy, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.destroy_targets(msg.machines))
    }
}

impl Handler<InstanceStateOf> for MachineRegistry {
    type Result = ResponseActFuture<Self, Option<crate::model::InstanceState>>;
    fn handle(&mut self, msg: InstanceStateOf, _ctx: &mut Self::Context) -> Self::Result {
        let fresh = self.listed_at.is_some_and(|at| at.elapsed() <= msg.fresher_than);
        if fresh {
            return Box::pin(fut::ready(self.book.instance(&msg.id).map(|i| i.state)));
        }
        let (listing, number) = self.list();
        Box::pin(listing.into_actor(self).map(move |res, act, ctx| {
            match res {
                Ok(list) => {
                    act.load(list, number);
                    act.report_status_changes(ctx);
                }
                Err(e) => {
                    act.mark_stale();
                    tracing::warn!(error = %e, "cloud listing failed");
                    return None;
                }
            }
            act.book.instance(&msg.id).map(|i| i.state)
        }))
    }
}

impl Handler<SweepTargets> for MachineRegistry {
    type Result = MessageResult<SweepTargets>;
    fn handle(&mut self, _msg: SweepTargets, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.sweep_targets())
    }
}
