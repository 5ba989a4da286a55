//! All wiring in one place: builds the seven actors, links them by `Recipient`s, and hands back
//! a [`ProvisionerHandle`].

use std::sync::Arc;

use actix::prelude::*;
use thiserror::Error;

use crate::actors::coordinator::{
    ChangeHarvestMode, Coordinator, GetHealth, Health, InterruptionLinks, Links, MachinesChanged, ResizeError,
    RetryTick, SetRepairPolicy, SetWorkers, Subscribe,
};
use crate::actors::harvest::{GetHarvestMode, HarvestPolicy, HarvestSafety};
use crate::actors::interruptions::InterruptionPoller;
use crate::actors::lifecycle::{GetPhases, MachineLifecycle, Phase};
use crate::actors::limiter::{CallGate, GetLimiterSnapshot, LimitedBroker, LimiterSnapshot, RateLimiter};
use crate::actors::messages::Shutdown;
use crate::actors::registry::{GetRegistrySnapshot, MachineRegistry, RegistrySnapshot};
use crate::actors::workers::{BatchDeps, GetPoolStatus, PoolStatus, StartDeps, WorkerPool};
use crate::actors::zones::{GetZoneSnapshot, ZoneAllocator, ZoneSnapshot};
use crate::config::{ConfigError, ProvisionerConfig};
use crate::model::events::ProvisionerEvent;
use crate::model::{HarvestMode, MachineId};
use crate::ports::{Broker, ModelApi};

/// Errors from talking to a running provisioner.
#[derive(Debug, Error)]
pub enum ProvisionerError {
    /// The request was invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The provisioner has stopped.
    #[error("provisioner is not running: {0}")]
    Stopped(#[from] MailboxError),
}

/// A running provisioner: its inputs, its snapshots, and its off switch.
#[derive(Clone)]
pub struct ProvisionerHandle {
    coordinator: Addr<Coordinator>,
    registry: Addr<MachineRegistry>,
    zones: Addr<ZoneAllocator>,
    harvest: Addr<HarvestPolicy>,
    lifecycle: Addr<MachineLifecycle>,
    pool: Addr<WorkerPool>,
    limiter: Option<Addr<RateLimiter>>,
    /// The interruption poller, when the cloud warns of interruptions (issue 33).
    interruptions: Option<Addr<InterruptionPoller>>,
    /// The limiter is shared with other provisioners ([`start_sharing`]): their shutdown
    /// leaves it running.
    shared_limiter: bool,
}

/// A client-side rate limiter that several provisioners share: those whose calls count
/// against one cloud bucket (models on one account and region), so that together they stay
/// inside it, and one's throttling slows the others (the learned rate is one). Stopped when
/// the last handle of it is dropped, never by a provisioner's shutdown.
#[derive(Clone)]
pub struct SharedLimiter(Addr<RateLimiter>);

impl SharedLimiter {
    /// Starts a limiter with full buckets on the current actix system.
    pub fn start(limits: crate::config::rate_limits::RateLimits) -> Self {
        Self(RateLimiter::new(limits).start())
    }

    /// Its classes: rates learned, calls waiting, throttles seen.
    pub async fn snapshot(&self) -> Result<LimiterSnapshot, ProvisionerError> {
        Ok(self.0.send(GetLimiterSnapshot).await?)
    }
}

/// Starts a provisioner as [`start`] does, its cloud calls paced by `limiter` (shared with
/// other provisioners) instead of a limiter of its own; `config.rate_limits` are not used.
pub fn start_sharing(
    config: ProvisionerConfig,
    broker: Arc<dyn Broker>,
    model: Arc<dyn ModelApi>,
    limiter: &SharedLimiter,
) -> Result<ProvisionerHandle, ConfigError> {
    start_with(config, broker, model, Some(limiter.0.clone()))
}

/// Starts a provisioner on the current actix system.
///
/// Nothing happens until the first [`MachinesChanged`] arrives (it must carry every machine);
/// the cloud listing starts with it.
pub fn start(
    config: ProvisionerConfig,
    broker: Arc<dyn Broker>,
    model: Arc<dyn ModelApi>,
) -> Result<ProvisionerHandle, ConfigError> {
    start_with(config, broker, model, None)
}

fn start_with(
    config: ProvisionerConfig,
    broker: Arc<dyn Broker>,
    model: Arc<dyn ModelApi>,
    shared: Option<Addr<RateLimiter>>,
) -> Result<ProvisionerHandle, ConfigError> {
    config.validate()?;
    let shared_limiter = shared.is_some();
    let coord_ctx: Context<Coordinator> = Context::new();
    let coord = coord_ctx.address();
    // One count of work in flight for the whole provisioner: each actor holds its own part.
    let work = crate::actors::work::WorkCount::new();

    // Every cloud call is paced by the client-side limiter (unless every class is unlimited).
    let limiter = shared.or_else(|| config.rate_limits.any().then(|| RateLimiter::new(config.rate_limits).start()));
    // One gate over the limiter: the limited broker's calls, the batcher's start token and the
    // broker's own calls all pass through it.
    let gate = limiter.as_ref().map(|l| CallGate::new(l.clone().recipient(), l.clone().recipient()));
    // Batched starts go to the cloud itself, the pool taking their one start token.
    let batch = (config.batch_starts && broker.batches_starts()).then(|| BatchDeps {
        broker: broker.clone(),
        gate: gate.clone(),
        size: config.batch_size,
    });
    let broker: Arc<dyn Broker> = match gate {
        Some(gate) => {
            // The calls the broker makes on its own (a batched start's tagging) take the
            // limiter's tokens too.
            broker.pace_follow_ups(Arc::new(gate.clone()));
            Arc::new(LimitedBroker::new(broker, gate))
        }
        None => broker,
    };

    let registry = MachineRegistry::new(
        config.scope.clone(),
        broker.clone(),
        model.clone(),
        config.backoff,
        config.resync_interval,
        Some(coord.clone().recipient()),
    )
    .with_seed(config.seed ^ 0x0072_6567_6973_7472)
    .with_mutations(config.mutations)
    .with_work(work.sibling())
    .start();
    let zones = ZoneAllocator::new(broker.clone(), config.seed, config.resync_interval)
        .with_capacity_memory(config.capacity_memory)
        .start();
    let safety = HarvestSafety {
        grace: config.harvest_grace,
        max_stops: config.harvest_max_stops,
        pass_interval: config.resync_interval,
    };
    let mut harvest = HarvestPolicy::new(
        config.harvest_mode,
        registry.clone().recipient(),
        config.harvest_listing_max_age,
        coord.clone().recipient(),
    )
    .with_safety(safety)
    .with_work(work.sibling());
    if config.reuse {
        harvest = harvest.with_reuse(config.reuse_window);
    }
    let harvest = harvest.start();
    let lifecycle = MachineLifecycle::new().with_mutations(config.mutations).start();
    let deps = StartDeps {
        broker: broker.clone(),
        model: model.clone(),
        choose: zones.clone().recipient(),
        mark_failed: zones.clone().recipient(),
        release_reservation: zones.clone().recipient(),
        release_machine: zones.clone().recipient(),
        still_wanted: lifecycle.clone().recipient(),
        claim: config.reuse.then(|| harvest.clone().recipient()),
        state_of: registry.clone().recipient(),
        stops_planned: registry.clone().recipient(),
        listing_max_age: config.harvest_listing_max_age,
        retry: config.retry,
        spot_max_price: config.spot_max_price,
        backoff: config.backoff,
        model_uuid: config.model_uuid.as_str().into(),
        host_tag: config.host_tag.clone(),
        batch,
        record_outside_worker: config.record_outside_worker,
        mutations: config.mutations,
    };
    let pool = WorkerPool::new(
        config.workers,
        config.max_workers,
        deps,
        coord.clone().recipient(),
        config.seed.wrapping_add(1),
    )
    .with_work(work.sibling())
    .start();
    let links = Links {
        model,
        refresh: registry.clone().recipient(),
        record: registry.clone().recipient(),
        gone: registry.clone().recipient(),
        forget: registry.clone().recipient(),
        refresh_zones: zones.clone().recipient(),
        populate: zones.clone().recipient(),
        release_zone: zones.clone().recipient(),
        plan_dead: harvest.clone().recipient(),
        plan_unknown: harvest.clone().recipient(),
        set_mode: harvest.clone().recipient(),
        end_safe: harvest.clone().recipient(),
        stops_done: harvest.clone().recipient(),
        plan_destroy: harvest.clone().recipient(),
        plan_stops: harvest.clone().recipient(),
        plan_extras: harvest.clone().recipient(),
        without_start: lifecycle.clone().recipient(),
        stops_planned: registry.clone().recipient(),
        prepare_destroy: registry.clone().recipient(),
        sweep: registry.clone().recipient(),
        observe_destroy: lifecycle.clone().recipient(),
        observe_pending: lifecycle.clone().recipient(),
        observe_dead: lifecycle.clone().recipient(),
        start_finished: lifecycle.clone().recipient(),
        forget_lifecycle: lifecycle.clone().recipient(),
        enqueue: pool.clone().recipient(),
        resize: pool.clone().recipient(),
    };
    let mut coordinator =
        Coordinator::new(links, config.backoff, config.workers, config.retry_path, config.scope.clone(), work)
            .with_seed(config.seed ^ 0x636f_6f72_6469_6e61)
            .with_repair(config.repair, config.resync_interval);
    // Hand-overs (issues 33 and 34) are the environ provisioner's alone: a container
    // provisioner's broker wraps the same cloud, whose notices are not its own. The poller
    // reads interruption notices where the cloud gives them (else it asks once and stops) and
    // looks up replacements for the repairs any cloud can have.
    let interruptions = (config.scope == crate::config::Scope::Environ)
        .then(|| InterruptionPoller::new(broker.clone(), config.backoff, coord.clone().recipient()).start());
    if let Some(poller) = &interruptions {
        coordinator = coordinator.with_interruptions(InterruptionLinks {
            noticed: registry.clone().recipient(),
            resumable: registry.clone().recipient(),
            acknowledge: poller.clone().recipient(),
            begin: lifecycle.clone().recipient(),
            short: zones.clone().recipient(),
            states: poller.clone().recipient(),
            impaired: poller.clone().recipient(),
            listed: registry.clone().recipient(),
            drift_of: registry.clone().recipient(),
            release: poller.clone().recipient(),
            short_type: poller.clone().recipient(),
            host_tag: config.host_tag.clone(),
        });
    }
    let coordinator = coord_ctx.run(coordinator);
    Ok(ProvisionerHandle {
        coordinator,
        registry,
        zones,
        harvest,
        lifecycle,
        pool,
        limiter,
        shared_limiter,
        interruptions,
    })
}

impl ProvisionerHandle {
    /// Where the machine watcher sends its events.
    pub fn machines_changed(&self) -> Recipient<MachinesChanged> {
        self.coordinator.clone().recipient()
    }

    /// Where the transient-retry watcher sends its ticks.
    pub fn retry_ticks(&self) -> Recipient<RetryTick> {
        self.coordinator.clone().recipient()
    }

    /// Notifies the provisioner that these machines changed.
    pub fn notify<I: Into<MachineId>>(&self, ids: impl IntoIterator<Item = I>) {
        self.coordinator.do_send(MachinesChanged::new(ids));
    }

    /// Sends one transient-retry tick.
    pub fn retry_tick(&self) {
        self.coordinator.do_send(RetryTick);
    }

    /// Changes the harvest mode (applied after the first full notification).
    pub fn set_harvest_mode(&self, mode: HarvestMode) {
        self.coordinator.do_send(ChangeHarvestMode(mode));
    }

    /// Resizes the broker worker pool; queued and in-flight work is kept.
    pub async fn set_workers(&self, n: usize) -> Result<(), ProvisionerError> {
        match self.coordinator.send(SetWorkers(n)).await? {
            Ok(()) => Ok(()),
            Err(ResizeError::Invalid(e)) => Err(ProvisionerError::Config(e)),
            // The pool stopped before the coordinator: the provisioner is shutting down.
            Err(ResizeError::Stopped(e)) => Err(ProvisionerError::Stopped(e)),
        }
    }

    /// Changes the repair policy (issue 34), applied from the next listing.
    pub fn set_repair_policy(&self, policy: crate::config::repair::RepairPolicy) {
        self.coordinator.do_send(SetRepairPolicy(policy));
    }

    /// The machines the last listing showed unhealthy, the repairs on and the policy.
    pub async fn health(&self) -> Result<Health, ProvisionerError> {
        Ok(self.coordinator.send(GetHealth).await?)
    }

    /// Subscribes to every event.
    pub fn subscribe(&self, to: Recipient<ProvisionerEvent>) {
        self.harvest.do_send(Subscribe(to.clone()));
        self.coordinator.do_send(Subscribe(to));
    }

    /// The registry's machines and instance view.
    pub async fn registry(&self) -> Result<RegistrySnapshot, ProvisionerError> {
        Ok(self.registry.send(GetRegistrySnapshot).await?)
    }

    /// The zone book.
    pub async fn zones(&self) -> Result<ZoneSnapshot, ProvisionerError> {
        Ok(self.zones.send(GetZoneSnapshot).await?)
    }

    /// The client-side rate limiter's classes (empty when every class is unlimited).
    pub async fn limiter(&self) -> Result<LimiterSnapshot, ProvisionerError> {
        match &self.limiter {
            Some(l) => Ok(l.send(GetLimiterSnapshot).await?),
            None => Ok(LimiterSnapshot::default()),
        }
    }

    /// The pool's load.
    pub async fn pool(&self) -> Result<PoolStatus, ProvisionerError> {
        Ok(self.pool.send(GetPoolStatus).await?)
    }

    /// Every machine's lifecycle phase.
    pub async fn phases(&self) -> Result<Vec<(MachineId, Phase)>, ProvisionerError> {
        Ok(self.lifecycle.send(GetPhases).await?)
    }

    /// The harvest mode in force.
    pub async fn harvest_mode(&self) -> Result<HarvestMode, ProvisionerError> {
        Ok(self.harvest.send(GetHarvestMode).await?)
    }

    /// Stops every actor (a crash, as far as in-memory state goes). Cloud calls already made
    /// complete in the cloud; their results are dropped.
    pub fn shutdown(&self) {
        self.coordinator.do_send(Shutdown);
        self.registry.do_send(Shutdown);
        self.zones.do_send(Shutdown);
        self.harvest.do_send(Shutdown);
        self.lifecycle.do_send(Shutdown);
        self.pool.do_send(Shutdown);
        if let Some(p) = &self.interruptions {
            p.do_send(Shutdown);
        }
        if let Some(l) = self.limiter.as_ref().filter(|_| !self.shared_limiter) {
            l.do_send(Shutdown);
        }
    }

    /// Destroys the model: it becomes dying and refuses new machines; every instance of a
    /// non-manual, non-controller machine is stopped in one call, starts in flight are stopped
    /// as they land; then, unless `force`, manual machines that remain are an error
    /// ([`DestroyError::ManualMachines`](crate::DestroyError::ManualMachines)).
    pub async fn destroy_model(
        &self,
        force: bool,
    ) -> Result<crate::actors::coordinator::DestroySummary, crate::actors::coordinator::DestroyError> {
        self.coordinator
            .send(crate::actors::coordinator::DestroyModel { force })
            .await
            .map_err(crate::actors::coordinator::DestroyError::Unavailable)?
    }

    /// Starts nothing any more; dead machines are still harvested and removed.
    pub fn close_starts(&self) {
        self.coordinator.do_send(crate::actors::coordinator::CloseStarts);
    }

    /// The model was destroyed by someone else (the environ provisioner, for a container
    /// provisioner): starts nothing more and stops every instance in scope whatever the mode,
    /// those of starts in flight as they land (the destruction wins over releases).
    pub fn model_destroyed(&self) {
        self.coordinator.do_send(crate::actors::coordinator::ModelDestroyed);
    }

    /// Whether every actor is quiescent: no batch, job, call or one-shot retry pending
    /// (periodic resyncs do not count). A stopped provisioner is idle.
    pub async fn is_idle(&self) -> bool {
        let (c, p, r, h) = futures::join!(
            self.coordinator.send(crate::actors::messages::Busy),
            self.pool.send(crate::actors::messages::Busy),
            self.registry.send(crate::actors::messages::Busy),
            self.harvest.send(crate::actors::messages::Busy)
        );
        [c, p, r, h].into_iter().all(|b| b.map(|n| n == 0).unwrap_or(true))
    }

    /// Resolves once every actor is quiescent (as [`ProvisionerHandle::is_idle`] tells), at
    /// once if it is or if the provisioner stopped. Nothing polls: the coordinator answers when
    /// the provisioner's work count (every actor's guards) reaches zero, and the answer is
    /// confirmed by [`ProvisionerHandle::is_idle`] (work handed from one actor to another by
    /// message counts once its receiver has it), waiting again if work was on its way.
    pub async fn wait_idle(&self) {
        loop {
            if self.coordinator.send(crate::actors::messages::WhenIdle).await.is_err() || self.is_idle().await {
                return;
            }
        }
    }

    /// Whether the provisioner's front door is still open.
    pub fn is_running(&self) -> bool {
        self.coordinator.connected()
    }
}

/// Running container provisioning: the manager and, through it, every supervisor.
#[derive(Clone)]
pub struct ContainersHandle {
    manager: Addr<crate::actors::containers::manager::ContainerManager>,
}

/// Starts lazy container provisioning on the current actix system: a supervisor per
/// live host and type in `kinds`, each running a container provisioner once the first
/// container of its type appears on its provisioned host. Feed it every machine notification
/// ([`ContainersHandle::machines_changed`]) and the environ provisioner's events
/// ([`ContainersHandle::provisioner_events`]).
pub fn start_containers(
    config: ProvisionerConfig,
    brokers: crate::actors::containers::BrokerFactory,
    model: Arc<dyn ModelApi>,
    initialiser: Arc<dyn crate::actors::containers::ContainerInitialiser>,
    kinds: Vec<String>,
    subscribers: Vec<Recipient<ProvisionerEvent>>,
) -> Result<ContainersHandle, ConfigError> {
    config.validate()?;
    let provisioners: crate::actors::containers::ProvisionerFactory = Arc::new(|config, broker, model| {
        start(config, broker, model).map(|h| Arc::new(h) as Arc<dyn crate::actors::containers::ContainerProvisioner>)
    });
    let deps = crate::actors::containers::supervisor::SupervisorDeps {
        model,
        brokers,
        provisioners,
        initialiser,
        config,
        subscribers,
    };
    let manager = crate::actors::containers::manager::ContainerManager::new(kinds, deps).start();
    Ok(ContainersHandle { manager })
}

impl crate::actors::containers::ContainerProvisioner for ProvisionerHandle {
    fn notify(&self, ids: Vec<MachineId>) {
        ProvisionerHandle::notify(self, ids);
    }
    fn set_harvest_mode(&self, mode: HarvestMode) {
        ProvisionerHandle::set_harvest_mode(self, mode);
    }
    fn subscribe(&self, to: Recipient<ProvisionerEvent>) {
        ProvisionerHandle::subscribe(self, to);
    }
    fn close_starts(&self) {
        ProvisionerHandle::close_starts(self);
    }
    fn model_destroyed(&self) {
        ProvisionerHandle::model_destroyed(self);
    }
    fn shutdown(&self) {
        ProvisionerHandle::shutdown(self);
    }
    fn is_idle(&self) -> futures::future::BoxFuture<'static, bool> {
        let h = self.clone();
        Box::pin(async move { h.is_idle().await })
    }
    fn wait_idle(&self) -> futures::future::BoxFuture<'static, ()> {
        let h = self.clone();
        Box::pin(async move { h.wait_idle().await })
    }
    fn holds_no_machine(&self) -> futures::future::BoxFuture<'static, bool> {
        let h = self.clone();
        Box::pin(async move { h.registry().await.map(|r| r.machines.is_empty()).unwrap_or(true) })
    }
}

impl ContainersHandle {
    /// Where the machine watcher sends its events (all machines, hosts and containers).
    pub fn machines_changed(&self) -> Recipient<MachinesChanged> {
        self.manager.clone().recipient()
    }

    /// Where the environ provisioner's events go (to learn when hosts are provisioned).
    pub fn provisioner_events(&self) -> Recipient<ProvisionerEvent> {
        self.manager.clone().recipient()
    }

    /// The harvest mode changed (model config): every running container provisioner and every
    /// later one uses it from now on (every component honours a mode change at once).
    pub fn set_harvest_mode(&self, mode: HarvestMode) {
        self.manager.do_send(crate::actors::containers::manager::SetContainersHarvestMode(mode));
    }

    /// The model was destroyed (by the environ provisioner's
    /// [`ProvisionerHandle::destroy_model`]): every container's instance is stopped whatever
    /// the mode, including those of starts in flight as they land; nothing new starts.
    pub fn model_destroyed(&self) {
        self.manager.do_send(crate::actors::containers::manager::ContainersModelDestroyed);
    }

    /// Every supervisor's stage, by host and type.
    pub async fn supervisors(
        &self,
    ) -> Result<Vec<(MachineId, String, crate::actors::containers::supervisor::Stage)>, ProvisionerError> {
        let sups = self.manager.send(crate::actors::containers::manager::GetSupervisors).await?;
        let mut out = Vec::new();
        for (host, kind, addr) in sups {
            if let Ok(stage) = addr.send(crate::actors::containers::supervisor::GetSupervisorState).await {
                out.push((host, kind, stage));
            }
        }
        Ok(out)
    }

    /// Resolves once every supervisor and container provisioner is quiescent (as
    /// [`ContainersHandle::is_idle`] tells), or at once if the manager stopped. Nothing polls:
    /// each round waits on the manager's and the supervisors' `WhenIdle` (real progress: a read
    /// done, a host prepared, a provisioner idle), then confirms.
    pub async fn wait_idle(&self) {
        loop {
            if self.manager.send(crate::actors::messages::WhenIdle).await.is_err() || self.is_idle().await {
                return;
            }
        }
    }

    /// Whether every supervisor and container provisioner is quiescent.
    pub async fn is_idle(&self) -> bool {
        self.manager.send(crate::actors::messages::Busy).await.map(|n| n == 0).unwrap_or(true)
    }

    /// Stops the manager, every supervisor and every container provisioner (a crash, as far as
    /// in-memory state goes).
    pub fn shutdown(&self) {
        self.manager.do_send(Shutdown);
    }
}
