//! The container manager actor: a thin shell over [`ManagerBook`].

use crate::actors::work::WorkCount;
use std::collections::BTreeMap;

use actix::prelude::*;

use super::messages::*;
use super::state::{HostEffect, ManagerBook};
use crate::actors::containers::supervisor::{
    ContainerSupervisor, ContainersChanged, HostDied, HostProvisioned, ModelDying, SetSupervisorMode, SupervisorDeps,
};
use crate::actors::coordinator::MachinesChanged;
use crate::model::events::ProvisionerEvent;
use crate::model::{InstanceStatus, MachineId, MachineStatus};
use crate::ports::ModelError;

/// What can fail in the container manager: its model reads and writes (each retried with
/// backoff), and a container of a type its host does not run (the container's status).
#[derive(Debug, thiserror::Error)]
enum ManagerError {
    /// Reading whether the model is dying failed.
    #[error("reading the model's life: {0}")]
    ModelLife(#[source] ModelError),
    /// Taking a dead host's container to dead failed.
    #[error("cannot take container {machine} of a dead host to dead: {source}")]
    EnsureDead {
        /// The container.
        machine: MachineId,
        /// The model's error.
        #[source]
        source: ModelError,
    },
    /// Reading the hosts failed.
    #[error("reading container hosts: {0}")]
    Hosts(#[source] ModelError),
    /// Reading a provisioned host's zone failed.
    #[error("reading the zone of host {host}: {source}")]
    HostZone {
        /// The host.
        host: MachineId,
        /// The model's error.
        #[source]
        source: ModelError,
    },
    /// The container's type is not one its host runs: the text is the container's status.
    #[error("container type {kind:?} is not supported on this host")]
    Unsupported {
        /// The container type.
        kind: String,
    },
}

/// Watches hosts and routes containers to their supervisors.
pub struct ContainerManager {
    book: ManagerBook,
    deps: SupervisorDeps,
    supervisors: BTreeMap<(MachineId, String), Addr<ContainerSupervisor>>,
    /// Host reads, model-life reads and EnsureDead calls in flight or waiting out their
    /// backoff, one guard each.
    reads: WorkCount,
    rng: rand::rngs::StdRng,
    /// The model is dying (destroyed, or found dying by the first notification).
    model_dying: bool,
    /// Whether the first notification (and the model-life read it triggers) came.
    first_seen: bool,
}

impl ContainerManager {
    /// A manager for hosts supporting `kinds`.
    pub fn new(kinds: Vec<String>, deps: SupervisorDeps) -> Self {
        let rng = rand::SeedableRng::seed_from_u64(deps.config.seed ^ 0x6d61_6e61_6765_7221);
        Self {
            book: ManagerBook::new(kinds),
            deps,
            supervisors: BTreeMap::new(),
            reads: WorkCount::new(),
            rng,
            model_dying: false,
            first_seen: false,
        }
    }

    /// The model is dying: every supervisor, and every later one, stops its containers'
    /// instances.
    fn model_destroyed(&mut self) {
        if self.model_dying {
            return;
        }
        self.model_dying = true;
        for s in self.supervisors.values() {
            s.do_send(ModelDying);
        }
    }

    /// A restarted manager learns whether the model is dying (retried with backoff).
    fn read_model_life(&mut self, attempt: u32, ctx: &mut Context<Self>) {
        let call = self.deps.model.model_life();
        let read = self.reads.guard();
        ctx.spawn(call.into_actor(self).map(move |res, act, ctx| match res {
            Ok(life) if life != crate::model::Life::Alive => act.model_destroyed(),
            Ok(_) => {}
            Err(e) => {
                let delay = act.deps.config.backoff.delay(attempt, &mut act.rng);
                let error = ManagerError::ModelLife(e);
                tracing::warn!(%error, retry_in = ?delay, "will retry");
                ctx.run_later(delay, move |act, ctx| {
                    act.read_model_life(attempt + 1, ctx);
                    drop(read);
                });
            }
        }));
    }

    /// Takes a dead host's containers to dead; a failure is retried with backoff (a container
    /// already gone is done).
    fn ensure_dead(&mut self, ids: Vec<MachineId>, attempt: u32, ctx: &mut Context<Self>) {
        let model = self.deps.model.clone();
        let fut = async move {
            let mut failed = Vec::new();
            for id in ids {
                match model.ensure_dead(id.clone()).await {
                    Ok(()) | Err(ModelError::NotFound(_)) => {}
                    Err(source) => {
                        let error = ManagerError::EnsureDead { machine: id.clone(), source };
                        tracing::warn!(%error, "will retry");
                        failed.push(id);
                    }
                }
            }
            failed
        };
        let call = self.reads.guard();
        ctx.spawn(fut.into_actor(self).map(move |failed, act, ctx| {
            if failed.is_empty() {
                return;
            }
            let delay = act.deps.config.backoff.delay(attempt, &mut act.rng);
            ctx.run_later(delay, move |act, ctx| {
                act.ensure_dead(failed, attempt + 1, ctx);
                drop(call);
            });
        }));
    }

    /// Reads hosts (and their instances' zones); a failed read is retried with backoff (a failed
    /// call that concerns everything is retried with backoff), never dropped: a host not read is a
    /// host whose containers wait.
    fn read_hosts(&mut self, hosts: Vec<MachineId>, attempt: u32, ctx: &mut Context<Self>) {
        let model = self.deps.model.clone();
        let again = hosts.clone();
        let fut = async move {
            let reads = model.machines(hosts.clone()).await.map_err(ManagerError::Hosts)?;
            let mut out = Vec::new();
            for (id, read) in hosts.into_iter().zip(reads) {
                let zone = match &read {
                    Ok(m) if m.instance.is_some() => {
                        let zone = model.availability_zone(id.clone()).await;
                        zone.map_err(|source| ManagerError::HostZone { host: id.clone(), source })?
                    }
                    _ => None,
                };
                out.push((id, read.ok(), zone));
            }
            Ok::<_, ManagerError>(out)
        };
        let read = self.reads.guard();
        ctx.spawn(fut.into_actor(self).map(move |res, act, ctx| match res {
            Ok(hosts) => {
                for (id, machine, zone) in hosts {
                    let effects = act.book.host_seen(&id, machine.as_ref(), zone);
                    act.perform(effects, ctx);
                }
            }
            Err(error) => {
                let delay = act.deps.config.backoff.delay(attempt, &mut act.rng);
                tracing::warn!(%error, retry_in = ?delay, "will retry");
                ctx.run_later(delay, move |act, ctx| {
                    act.read_hosts(again, attempt + 1, ctx);
                    drop(read);
                });
            }
        }));
    }

    fn perform(&mut self, effects: Vec<HostEffect>, ctx: &mut Context<Self>) {
        for effect in effects {
            match effect {
                HostEffect::Supervise { host, kind, zone, dead } => {
                    let (h, k, deps) = (host.clone(), kind.clone(), self.deps.clone());
                    let sup = if dead {
                        ContainerSupervisor::for_dead_host(h, k, zone, deps)
                    } else {
                        ContainerSupervisor::new(h, k, zone, deps)
                    }
                    .start();
                    if self.model_dying {
                        sup.do_send(ModelDying);
                    }
                    self.supervisors.insert((host, kind), sup);
                }
                HostEffect::Provisioned { host, zone } => {
                    for ((h, _), sup) in self.supervisors.range((host.clone(), String::new())..) {
                        if h != &host {
                            break;
                        }
                        sup.do_send(HostProvisioned(zone.clone()));
                    }
                }
                HostEffect::Route { host, kind, ids } => {
                    if let Some(sup) = self.supervisors.get(&(host, kind)) {
                        sup.do_send(ContainersChanged(ids));
                    }
                }
                HostEffect::Died(host) => {
                    // Supervisors stay: they reap the host's containers, later ones included.
                    for ((h, _), sup) in self.supervisors.range((host.clone(), String::new())..) {
                        if h != &host {
                            break;
                        }
                        sup.do_send(HostDied);
                    }
                }
                HostEffect::EnsureDead(ids) => {
                    tracing::info!(containers = ?ids, "host is dead: its containers die with it");
                    self.ensure_dead(ids, 0, ctx);
                }
                HostEffect::Unsupported(id, kind) => {
                    let error = ManagerError::Unsupported { kind };
                    tracing::warn!(machine = %id, %error);
                    let msg = error.to_string();
                    let model = self.deps.model.clone();
                    let fut = async move {
                        let _ = model
                            .set_instance_status(id.clone(), InstanceStatus::provisioning_error(), msg.clone())
                            .await;
                        let _ = model.set_status(id, MachineStatus::Error, msg).await;
                    };
                    ctx.spawn(fut.into_actor(self));
                }
            }
        }
    }
}

impl Actor for ContainerManager {
    type Context = Context<Self>;
}

impl Handler<MachinesChanged> for ContainerManager {
    type Result = ();
    fn handle(&mut self, msg: MachinesChanged, ctx: &mut Self::Context) {
        if !self.first_seen {
            self.first_seen = true;
            self.read_model_life(0, ctx);
        }
        let (containers, hosts): (Vec<MachineId>, Vec<MachineId>) =
            msg.ids.into_iter().partition(MachineId::is_container);
        let effects = self.book.containers_seen(&containers);
        self.perform(effects, ctx);
        let hosts = self.book.hosts_to_read(hosts);
        if hosts.is_empty() {
            return;
        }
        self.read_hosts(hosts, 0, ctx);
    }
}

impl Handler<ProvisionerEvent> for ContainerManager {
    type Result = ();
    fn handle(&mut self, msg: ProvisionerEvent, ctx: &mut Self::Context) {
        match msg {
            ProvisionerEvent::MachineStarted { machine, zone, .. } if !machine.is_container() => {
                let effects = self.book.provisioned(&machine, zone);
                self.perform(effects, ctx);
            }
            ProvisionerEvent::ProcessedMachines => {
                // The environ provisioner has read the model: a host it found provisioned
                // without starting it (its predecessor's start) is provisioned for us too.
                let waiting = self.book.waiting_hosts();
                if !waiting.is_empty() {
                    self.read_hosts(waiting, 0, ctx);
                }
            }
            _ => {}
        }
    }
}

impl Handler<SetContainersHarvestMode> for ContainerManager {
    type Result = ();
    fn handle(&mut self, msg: SetContainersHarvestMode, _ctx: &mut Self::Context) {
        self.deps.config.harvest_mode = msg.0;
        for s in self.supervisors.values() {
            s.do_send(SetSupervisorMode(msg.0));
        }
    }
}

impl Handler<ContainersModelDestroyed> for ContainerManager {
    type Result = ();
    fn handle(&mut self, _msg: ContainersModelDestroyed, _ctx: &mut Self::Context) {
        self.model_destroyed();
    }
}

impl Handler<GetSupervisors> for ContainerManager {
    type Result = MessageResult<GetSupervisors>;
    fn handle(&mut self, _msg: GetSupervisors, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.supervisors.iter().map(|((h, k), a)| (h.clone(), k.clone(), a.clone())).collect())
    }
}

impl Handler<crate::actors::messages::Busy> for ContainerManager {
    type Result = ResponseFuture<usize>;
    fn handle(&mut self, _msg: crate::actors::messages::Busy, _ctx: &mut Self::Context) -> Self::Result {
        let sups: Vec<_> = self.supervisors.values().cloned().collect();
        let own = self.reads.count();
        Box::pin(async move {
            let mut busy = own;
            for s in sups {
                busy += s.send(crate::actors::messages::Busy).await.unwrap_or(0);
            }
            busy
        })
    }
}

/// Answered once the manager's own reads are done and every supervisor answered its own
/// `WhenIdle` (see [`ContainersHandle::wait_idle`](crate::ContainersHandle::wait_idle)).
impl Handler<crate::actors::messages::WhenIdle> for ContainerManager {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, _msg: crate::actors::messages::WhenIdle, _ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = futures::channel::oneshot::channel();
        self.reads.when_idle(tx);
        let sups: Vec<_> = self.supervisors.values().cloned().collect();
        Box::pin(async move {
            let _ = rx.await;
            for s in sups {
                let _ = s.send(crate::actors::messages::WhenIdle).await;
            }
        })
    }
}

impl Handler<crate::actors::messages::Shutdown> for ContainerManager {
    type Result = ();
    fn handle(&mut self, _msg: crate::actors::messages::Shutdown, ctx: &mut Self::Context) {
        for s in self.supervisors.values() {
            s.do_send(crate::actors::messages::Shutdown);
        }
        ctx.stop();
    }
}
