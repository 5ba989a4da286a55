//! The container manager actor: a thin shell over [`ManagerBook`].

use std::collections::BTreeMap;

use actix::prelude::*;

use super::messages::*;
use super::state::{HostEffect, ManagerBook};
use crate::containers::supervisor::{
    ContainerSupervisor, ContainersChanged, HostDied, HostProvisioned, SupervisorDeps,
};
use crate::coordinator::MachinesChanged;
use crate::events::ProvisionerEvent;
use crate::types::{InstanceStatus, MachineId, MachineStatus};

/// Watches hosts and routes containers to their supervisors.
pub struct ContainerManager {
    book: ManagerBook,
    deps: SupervisorDeps,
    supervisors: BTreeMap<(MachineId, String), Addr<ContainerSupervisor>>,
    /// Host reads in flight or waiting out their backoff.
    reads: usize,
    rng: rand::rngs::StdRng,
}

impl ContainerManager {
    /// A manager for hosts supporting `kinds`.
    pub fn new(kinds: Vec<String>, deps: SupervisorDeps) -> Self {
        let rng = rand::SeedableRng::seed_from_u64(deps.config.seed ^ 0x6d61_6e61_6765_7221);
        Self { book: ManagerBook::new(kinds), deps, supervisors: BTreeMap::new(), reads: 0, rng }
    }

    /// Reads hosts (and their instances' zones); a failed read is retried with backoff
    /// (contract semantics 6), never dropped: a host not read is a host whose containers wait.
    fn read_hosts(&mut self, hosts: Vec<MachineId>, attempt: u32, ctx: &mut Context<Self>) {
        let model = self.deps.model.clone();
        let again = hosts.clone();
        let fut = async move {
            let reads = model.machines(hosts.clone()).await.map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            for (id, read) in hosts.into_iter().zip(reads) {
                let zone = match &read {
                    Ok(m) if m.instance.is_some() => {
                        model.availability_zone(id.clone()).await.map_err(|e| e.to_string())?
                    }
                    _ => None,
                };
                out.push((id, read.ok(), zone));
            }
            Ok::<_, String>(out)
        };
        self.reads += 1;
        ctx.spawn(fut.into_actor(self).map(move |res, act, ctx| {
            act.reads -= 1;
            match res {
                Ok(hosts) => {
                    for (id, machine, zone) in hosts {
                        let effects = act.book.host_seen(&id, machine.as_ref(), zone);
                        act.perform(effects, ctx);
                    }
                }
                Err(e) => {
                    let delay = act.deps.config.backoff.delay(attempt, &mut act.rng);
                    tracing::warn!(error = %e, retry_in = ?delay, "reading container hosts failed; will retry");
                    act.reads += 1;
                    ctx.run_later(delay, move |act, ctx| {
                        act.reads -= 1;
                        act.read_hosts(again, attempt + 1, ctx);
                    });
                }
            }
        }));
    }

    fn perform(&mut self, effects: Vec<HostEffect>, ctx: &mut Context<Self>) {
        for effect in effects {
            match effect {
                HostEffect::Supervise { host, kind, zone } => {
                    let sup = ContainerSupervisor::new(host.clone(), kind.clone(), zone, self.deps.clone()).start();
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
                    // Supervisors stay reachable: a running one keeps reaping dead containers.
                    for ((h, _), sup) in &self.supervisors {
                        if h == &host {
                            sup.do_send(HostDied);
                        }
                    }
                    self.supervisors.retain(|_, sup| sup.connected());
                }
                HostEffect::Unsupported(id, kind) => {
                    let msg = format!("container type {kind:?} is not supported on this host");
                    tracing::warn!(machine = %id, "{msg}");
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
        let (containers, hosts): (Vec<MachineId>, Vec<MachineId>) =
            msg.ids.into_iter().partition(MachineId::is_container);
        let effects = self.book.containers_seen(&containers);
        self.perform(effects, ctx);
        if hosts.is_empty() {
            return;
        }
        self.read_hosts(hosts, 0, ctx);
    }
}

impl Handler<ProvisionerEvent> for ContainerManager {
    type Result = ();
    fn handle(&mut self, msg: ProvisionerEvent, ctx: &mut Self::Context) {
        if let ProvisionerEvent::MachineStarted { machine, zone, .. } = msg {
            if !machine.is_container() {
                let effects = self.book.provisioned(&machine, zone);
                self.perform(effects, ctx);
            }
        }
    }
}

impl Handler<GetSupervisors> for ContainerManager {
    type Result = MessageResult<GetSupervisors>;
    fn handle(&mut self, _msg: GetSupervisors, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.supervisors.iter().map(|((h, k), a)| (h.clone(), k.clone(), a.clone())).collect())
    }
}

impl Handler<crate::Busy> for ContainerManager {
    type Result = ResponseFuture<usize>;
    fn handle(&mut self, _msg: crate::Busy, _ctx: &mut Self::Context) -> Self::Result {
        let sups: Vec<_> = self.supervisors.values().cloned().collect();
        let own = self.reads;
        Box::pin(async move {
            let mut busy = own;
            for s in sups {
                busy += s.send(crate::Busy).await.unwrap_or(0);
            }
            busy
        })
    }
}

impl Handler<crate::Shutdown> for ContainerManager {
    type Result = ();
    fn handle(&mut self, _msg: crate::Shutdown, ctx: &mut Self::Context) {
        for s in self.supervisors.values() {
            s.do_send(crate::Shutdown);
        }
        ctx.stop();
    }
}
