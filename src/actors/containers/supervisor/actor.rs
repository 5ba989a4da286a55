//! The container supervisor actor: a thin shell over [`SupervisorBook`] that calls the
//! initialiser, writes waiting statuses, and starts or stops the container provisioner.

use std::sync::Arc;

use actix::prelude::*;

use super::messages::*;
use super::state::{Effect, SupervisorBook};
use crate::actors::containers::{BrokerFactory, ContainerInitialiser, ContainerProvisioner, ProvisionerFactory};
use crate::actors::work::{BusyState, WorkCount};
use crate::config::ProvisionerConfig;
use crate::model::events::ProvisionerEvent;
use crate::model::{InstanceStatus, MachineId};
use crate::ports::ModelApi;

/// What can fail in a supervisor: the host's initialisation (retried, then given up; the text
/// is the containers' status) and starting its provisioner.
#[derive(Debug, thiserror::Error)]
enum SupervisorError {
    /// The initialiser failed; it is called again after `after`.
    #[error("waiting for host {host} to support {kind} containers: {message} (retrying in {after:?})")]
    Initialising {
        /// The host.
        host: MachineId,
        /// The container type.
        kind: String,
        /// The initialiser's message.
        message: String,
        /// The delay before the next try.
        after: std::time::Duration,
    },
    /// The initialiser failed too often: the containers are in error.
    #[error("host {host} cannot run {kind} containers: {message}")]
    GaveUp {
        /// The host.
        host: MachineId,
        /// The container type.
        kind: String,
        /// The last initialiser message.
        message: String,
    },
    /// The container provisioner refused its configuration.
    #[error("cannot start the {kind} container provisioner of host {host}: {source}")]
    Provisioner {
        /// The host.
        host: MachineId,
        /// The container type.
        kind: String,
        /// Why.
        #[source]
        source: crate::config::ConfigError,
    },
}

/// What a supervisor needs.
#[derive(Clone)]
pub struct SupervisorDeps {
    /// The model.
    pub model: Arc<dyn ModelApi>,
    /// Builds the container broker.
    pub brokers: BrokerFactory,
    /// Starts the container provisioner.
    pub provisioners: ProvisionerFactory,
    /// Prepares hosts.
    pub initialiser: Arc<dyn ContainerInitialiser>,
    /// The environ provisioner's configuration, from which the container one is derived.
    pub config: ProvisionerConfig,
    /// Who hears the container provisioner's events.
    pub subscribers: Vec<Recipient<ProvisionerEvent>>,
}

/// Supervises `kind` containers on `host`.
pub struct ContainerSupervisor {
    host: MachineId,
    kind: String,
    book: SupervisorBook,
    deps: SupervisorDeps,
    provisioner: Option<Arc<dyn ContainerProvisioner>>,
    incarnation: u64,
    /// The check that retires a dead host's reaper once it has nothing left, in flight.
    done_check: Option<SpawnHandle>,
    /// Something changed while that check was in flight: check again.
    changed_during_check: bool,
    /// Whether the host is being prepared (its initialisation or a retry's timer in flight),
    /// as one guard of `work`, whose waiters [`WhenIdle`](crate::actors::messages::WhenIdle)
    /// registers.
    work: WorkCount,
    initialising: BusyState,
}

impl ContainerSupervisor {
    /// A listening supervisor; `host_zone` is `Some` if the host is already provisioned.
    pub fn new(host: MachineId, kind: String, host_zone: Option<Option<String>>, deps: SupervisorDeps) -> Self {
        let book = SupervisorBook::new(deps.config.backoff, host_zone).with_seed(deps.config.seed ^ 0x5u64);
        let work = WorkCount::new();
        Self {
            host,
            kind,
            book,
            deps,
            provisioner: None,
            incarnation: 0,
            done_check: None,
            changed_during_check: false,
            initialising: BusyState::new(&work),
            work,
        }
    }

    /// A supervisor for a host already dead: it only reaps the host's containers.
    pub fn for_dead_host(
        host: MachineId,
        kind: String,
        host_zone: Option<Option<String>>,
        deps: SupervisorDeps,
    ) -> Self {
        let mut s = Self::new(host, kind, host_zone, deps);
        s.book = s.book.for_dead_host();
        s
    }

    /// Once the host is dead, retires the reaper when it has nothing left to reap: checked
    /// once its provisioner is idle (it says when; nothing polls), and again whenever what it
    /// holds may have changed since (a container changed, or it published an event).
    fn watch_done(&mut self, ctx: &mut Context<Self>) {
        if !self.book.host_dead() || !self.book.is_running() {
            return;
        }
        if self.done_check.is_some() {
            self.changed_during_check = true;
            return;
        }
        let Some(h) = self.provisioner.clone() else { return };
        self.changed_during_check = false;
        let generation = self.book.generation();
        let check = async move {
            h.wait_idle().await;
            h.holds_no_machine().await
        };
        let handle = ctx.spawn(check.into_actor(self).map(move |done, act, ctx| {
            act.done_check = None;
            if done && act.book.reaper_done(generation) {
                tracing::info!(host = %act.host, kind = %act.kind, "dead host's containers reaped; its provisioner stops");
                if let Some(h) = act.provisioner.take() {
                    h.shutdown();
                }
            } else if std::mem::take(&mut act.changed_during_check) {
                act.watch_done(ctx);
            }
        }));
        self.done_check = Some(handle);
    }

    fn perform(&mut self, effects: Vec<Effect>, ctx: &mut Context<Self>) {
        self.perform_effects(effects, ctx);
        self.initialising.set(matches!(self.book.stage(), super::Stage::Initialising { .. }));
    }

    fn perform_effects(&mut self, effects: Vec<Effect>, ctx: &mut Context<Self>) {
        for effect in effects {
            match effect {
                Effect::Initialise => {
                    tracing::info!(host = %self.host, kind = %self.kind, "initialising host for containers");
                    let call = self.deps.initialiser.initialise(self.host.clone(), self.kind.clone());
                    ctx.spawn(call.into_actor(self).map(|res, act, ctx| {
                        // The core keeps the message (the containers' status); the cause is logged here.
                        if let Some(cause) = res.as_ref().err().and_then(std::error::Error::source) {
                            tracing::debug!(host = %act.host, kind = %act.kind, %cause, "container initialisation failed");
                        }
                        let effects = act.book.initialised(res);
                        act.perform(effects, ctx);
                    }));
                }
                Effect::RetryInitialise { after, message } => {
                    let (host, kind) = (self.host.clone(), self.kind.clone());
                    let text = SupervisorError::Initialising { host, kind, message, after }.to_string();
                    tracing::warn!(error = %text, "container initialisation failed");
                    for c in self.book.containers().cloned().collect::<Vec<_>>() {
                        let call = self.deps.model.set_instance_status(c, InstanceStatus::provisioning(), text.clone());
                        ctx.spawn(call.into_actor(self).map(|_, _, _| ()));
                    }
                    ctx.run_later(after, |act, ctx| {
                        let effects = act.book.retry_due();
                        act.perform(effects, ctx);
                    });
                }
                Effect::StartProvisioner { zone, containers, reap } => {
                    let broker = (self.deps.brokers)(&self.host, &self.kind, zone);
                    let mut config = self.deps.config.for_containers(self.host.clone(), &self.kind);
                    self.incarnation += 1;
                    config.seed = config.seed.wrapping_add(self.incarnation.wrapping_mul(0x2545_F491_4F6C_DD1D));
                    match (self.deps.provisioners)(config, broker, self.deps.model.clone()) {
                        Ok(h) => {
                            tracing::info!(host = %self.host, kind = %self.kind, reap, "container provisioner running");
                            for s in &self.deps.subscribers {
                                h.subscribe(s.clone());
                            }
                            // Its events may mean its reaping is done.
                            h.subscribe(ctx.address().recipient());
                            // Before the first notification, so that nothing starts.
                            if reap {
                                h.close_starts();
                            }
                            if self.book.model_dying() {
                                h.model_destroyed();
                            }
                            h.notify(containers);
                            self.provisioner = Some(h);
                            self.watch_done(ctx);
                        }
                        Err(source) => {
                            let (host, kind) = (self.host.clone(), self.kind.clone());
                            let error = SupervisorError::Provisioner { host, kind, source };
                            tracing::error!(%error)
                        }
                    }
                }
                Effect::Forward(ids) => {
                    if let Some(h) = &self.provisioner {
                        h.notify(ids);
                    }
                    self.watch_done(ctx);
                }
                Effect::CloseStarts => {
                    if let Some(h) = &self.provisioner {
                        tracing::info!(host = %self.host, kind = %self.kind, "host died; its container provisioner only reaps now");
                        h.close_starts();
                    }
                    // Once it has nothing left to reap, it goes.
                    self.watch_done(ctx);
                }
                Effect::Destroyed => {
                    if let Some(h) = &self.provisioner {
                        tracing::info!(host = %self.host, kind = %self.kind, "model destroyed; stopping every container's instance");
                        h.model_destroyed();
                    }
                }
                Effect::GiveUp { containers, message } => {
                    let (host, kind) = (self.host.clone(), self.kind.clone());
                    let text = SupervisorError::GaveUp { host, kind, message }.to_string();
                    tracing::error!(error = %text, "container initialisation failed for good");
                    for c in containers {
                        let model = self.deps.model.clone();
                        let text = text.clone();
                        let fut = async move {
                            let _ = model
                                .set_instance_status(c.clone(), InstanceStatus::provisioning_error(), text.clone())
                                .await;
                            let _ = model.set_status(c, crate::model::MachineStatus::Error, text).await;
                        };
                        ctx.spawn(fut.into_actor(self));
                    }
                }
            }
        }
    }
}

impl Actor for ContainerSupervisor {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        if let Some(h) = self.provisioner.take() {
            h.shutdown();
        }
    }
}

impl Handler<ContainersChanged> for ContainerSupervisor {
    type Result = ();
    fn handle(&mut self, msg: ContainersChanged, ctx: &mut Self::Context) {
        let effects = self.book.containers_changed(msg.0);
        self.perform(effects, ctx);
    }
}

impl Handler<HostProvisioned> for ContainerSupervisor {
    type Result = ();
    fn handle(&mut self, msg: HostProvisioned, ctx: &mut Self::Context) {
        let effects = self.book.host_provisioned(msg.0);
        self.perform(effects, ctx);
    }
}

impl Handler<HostDied> for ContainerSupervisor {
    type Result = ();
    fn handle(&mut self, _msg: HostDied, ctx: &mut Self::Context) {
        // It stays: containers added to the dead host later are reaped too.
        let effects = self.book.host_died();
        self.perform(effects, ctx);
    }
}

impl Handler<SetSupervisorMode> for ContainerSupervisor {
    type Result = ();
    fn handle(&mut self, msg: SetSupervisorMode, _ctx: &mut Self::Context) {
        self.deps.config.harvest_mode = msg.0;
        if let Some(h) = &self.provisioner {
            h.set_harvest_mode(msg.0);
        }
    }
}

impl Handler<ModelDying> for ContainerSupervisor {
    type Result = ();
    fn handle(&mut self, _msg: ModelDying, ctx: &mut Self::Context) {
        let effects = self.book.model_destroyed();
        self.perform(effects, ctx);
    }
}

impl Handler<GetSupervisorState> for ContainerSupervisor {
    type Result = MessageResult<GetSupervisorState>;
    fn handle(&mut self, _msg: GetSupervisorState, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.stage().clone())
    }
}

impl Handler<crate::actors::messages::Busy> for ContainerSupervisor {
    type Result = ResponseFuture<usize>;
    fn handle(&mut self, _msg: crate::actors::messages::Busy, _ctx: &mut Self::Context) -> Self::Result {
        let initialising = usize::from(matches!(self.book.stage(), super::Stage::Initialising { .. }));
        let provisioner = self.provisioner.clone();
        Box::pin(async move {
            let busy = match provisioner {
                Some(h) => usize::from(!h.is_idle().await),
                None => 0,
            };
            initialising + busy
        })
    }
}

/// Answered once the host is prepared (or given up on) and the container provisioner, if one
/// runs, is idle. A provisioner started meanwhile is not waited for: the containers' handle
/// asks again until everything is idle (each ask waits for real progress; nothing polls).
impl Handler<crate::actors::messages::WhenIdle> for ContainerSupervisor {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, _msg: crate::actors::messages::WhenIdle, _ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = futures::channel::oneshot::channel();
        self.work.when_idle(tx);
        let provisioner = self.provisioner.clone();
        Box::pin(async move {
            let _ = rx.await;
            if let Some(p) = provisioner {
                p.wait_idle().await;
            }
        })
    }
}

impl Handler<ProvisionerEvent> for ContainerSupervisor {
    type Result = ();
    fn handle(&mut self, _msg: ProvisionerEvent, ctx: &mut Self::Context) {
        self.watch_done(ctx);
    }
}

impl Handler<crate::actors::messages::Shutdown> for ContainerSupervisor {
    type Result = ();
    fn handle(&mut self, _msg: crate::actors::messages::Shutdown, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
