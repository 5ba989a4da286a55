//! The manager's plain core: hosts, their zones, their containers, and where container
//! changes go.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Life, Machine, MachineId};

/// What the actor must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEffect {
    /// Create a supervisor for `kind` on `host` (zone known if provisioned).
    Supervise {
        /// The host.
        host: MachineId,
        /// The container type.
        kind: String,
        /// `Some(zone)` once the host is provisioned.
        zone: Option<Option<String>>,
        /// The host is dead already: the supervisor only reaps (a restarted manager finding a
        /// dead host with containers).
        dead: bool,
    },
    /// The host got its instance.
    Provisioned {
        /// The host.
        host: MachineId,
        /// Its zone.
        zone: Option<String>,
    },
    /// Containers of `kind` on `host` changed.
    Route {
        /// The host.
        host: MachineId,
        /// The type.
        kind: String,
        /// The containers.
        ids: Vec<MachineId>,
    },
    /// The host is dead or gone: its supervisors start nothing more and reap.
    Died(MachineId),
    /// Containers of a dead host: take them to dead (the host takes its containers with it,
    /// its containers die with it); their supervisors then stop their instances by harvest mode and
    /// mark them for removal.
    EnsureDead(Vec<MachineId>),
    /// A container of a type no host supports: tell its status.
    Unsupported(MachineId, String),
}

#[derive(Debug, Clone, Default)]
struct Host {
    zone: Option<Option<String>>,
    dead: bool,
    /// The container types it has a supervisor for: made with the first container of that
    /// type (lazily: a fleet of hosts without containers costs no actor).
    supervised: BTreeSet<String>,
    /// Every container of it seen so far.
    containers: BTreeSet<MachineId>,
    /// Containers already asked to die (a dead host's).
    killed: BTreeSet<MachineId>,
}

/// Hosts and supported types.
#[derive(Debug, Clone)]
pub struct ManagerBook {
    kinds: Vec<String>,
    hosts: BTreeMap<MachineId, Host>,
    unsupported: BTreeSet<MachineId>,
    /// The hosts [`ManagerBook::waiting_hosts`] answers (live, not known to be provisioned,
    /// with containers), kept as the hosts change: asked after every pass of the environ
    /// provisioner, it must not walk every host (every top-level machine is one).
    waiting: BTreeSet<MachineId>,
    /// Hosts that got their first container and have not been read since: what the book
    /// knows of a host without containers is nothing (no host is read, nor kept, before it has
    /// a container: a fleet of machines without containers costs no reads and no entries).
    unread: BTreeSet<MachineId>,
}

impl ManagerBook {
    /// A book for hosts that support these container types.
    pub fn new(kinds: Vec<String>) -> Self {
        Self {
            kinds,
            hosts: BTreeMap::new(),
            unsupported: BTreeSet::new(),
            waiting: BTreeSet::new(),
            unread: BTreeSet::new(),
        }
    }

    /// Puts `id` in or out of the waiting hosts, as it now is.
    fn note_waiting(&mut self, id: &MachineId) {
        let waits = self.hosts.get(id).is_some_and(|h| !h.dead && h.zone.is_none() && !h.containers.is_empty());
        if waits {
            if !self.waiting.contains(id) {
                self.waiting.insert(id.clone());
            }
        } else {
            self.waiting.remove(id);
        }
    }

    /// Makes the host's supervisor for `kind` unless it exists.
    fn supervise(&mut self, id: &MachineId, kind: &str, out: &mut Vec<HostEffect>) {
        let host = self.hosts.entry(id.clone()).or_default();
        if !host.supervised.insert(kind.to_owned()) {
            return;
        }
        out.push(HostEffect::Supervise {
            host: id.clone(),
            kind: kind.to_owned(),
            zone: host.zone.clone(),
            dead: host.dead,
        });
    }

    /// Records a live host; false if it is dead.
    fn ensure_host(&mut self, id: &MachineId) -> bool {
        !self.hosts.entry(id.clone()).or_default().dead
    }

    /// The host's containers not yet asked to die.
    fn kill(&mut self, id: &MachineId) -> Vec<HostEffect> {
        let Some(host) = self.hosts.get_mut(id) else { return Vec::new() };
        let doomed: Vec<MachineId> = host.containers.difference(&host.killed).cloned().collect();
        if doomed.is_empty() {
            return Vec::new();
        }
        host.killed.extend(doomed.iter().cloned());
        vec![HostEffect::EnsureDead(doomed)]
    }

    /// A top-level machine was read (`None` = not found) with the zone of its instance.
    pub fn host_seen(&mut self, id: &MachineId, machine: Option<&Machine>, zone: Option<String>) -> Vec<HostEffect> {
        let mut out = Vec::new();
        match machine {
            Some(m) if m.life != Life::Dead => {
                if !self.ensure_host(id) {
                    return out;
                }
                if m.instance.is_some() {
                    out.extend(self.provisioned(id, zone));
                }
            }
            _ => {
                let host = self.hosts.entry(id.clone()).or_default();
                if !host.dead {
                    host.dead = true;
                    if !host.supervised.is_empty() {
                        out.push(HostEffect::Died(id.clone()));
                    }
                    self.waiting.remove(id);
                    out.extend(self.kill(id));
                }
            }
        }
        out
    }

    /// The host got its instance in `zone`. A host without containers is not recorded: its
    /// first container has it read (and its zone learnt) then.
    pub fn provisioned(&mut self, id: &MachineId, zone: Option<String>) -> Vec<HostEffect> {
        let mut out = Vec::new();
        let Some(host) = self.hosts.get_mut(id) else { return out };
        if host.dead {
            return out;
        }
        if host.zone.is_none() {
            host.zone = Some(zone.clone());
            self.waiting.remove(id);
            // Supervisors made later learn the zone when they are made.
            if !host.supervised.is_empty() {
                out.push(HostEffect::Provisioned { host: id.clone(), zone });
            }
        }
        out
    }

    /// Containers changed: route them by host and type. Containers of a dead host are taken
    /// to dead (once each) and still routed, so that its supervisors reap them.
    pub fn containers_seen(&mut self, ids: &[MachineId]) -> Vec<HostEffect> {
        let mut out = Vec::new();
        let mut routes: BTreeMap<(MachineId, String), Vec<MachineId>> = BTreeMap::new();
        let mut dead_hosts = BTreeSet::new();
        for id in ids {
            let Some((host, kind)) = id.container_of() else { continue };
            if !self.kinds.iter().any(|k| k == kind) {
                if self.unsupported.insert(id.clone()) {
                    out.push(HostEffect::Unsupported(id.clone(), kind.to_owned()));
                }
                continue;
            }
            if !self.ensure_host(&host) {
                // A dead host's supervisors reap (made now if a restart found the host dead).
                dead_hosts.insert(host.clone());
            }
            self.supervise(&host, kind, &mut out);
            let entry = self.hosts.entry(host.clone()).or_default();
            if entry.containers.is_empty() && !entry.dead {
                // Its first container: the host was never read (or not since it had none).
                self.unread.insert(host.clone());
            }
            entry.containers.insert(id.clone());
            self.note_waiting(&host);
            routes.entry((host, kind.to_owned())).or_default().push(id.clone());
        }
        for host in &dead_hosts {
            out.extend(self.kill(host));
        }
        out.extend(routes.into_iter().map(|((host, kind), ids)| HostEffect::Route { host, kind, ids }));
        out
    }

    /// Which of these changed top-level machines are worth reading, with the hosts that got
    /// their first container since the last call: hosts with containers only (a machine
    /// without containers matters to no supervisor; it is read when its first container comes).
    pub fn hosts_to_read(&mut self, changed: Vec<MachineId>) -> Vec<MachineId> {
        let mut read: BTreeSet<MachineId> = std::mem::take(&mut self.unread);
        read.extend(changed.into_iter().filter(|id| self.hosts.get(id).is_some_and(|h| !h.containers.is_empty())));
        read.into_iter().collect()
    }

    /// Live hosts not known to be provisioned that have containers waiting: worth reading
    /// again (a restarted provisioner may find a host already provisioned by its predecessor,
    /// whose record landed after this manager last read it, and then announces no start).
    pub fn waiting_hosts(&self) -> Vec<MachineId> {
        self.waiting.iter().cloned().collect()
    }

    /// [`ManagerBook::waiting_hosts`] found by walking every host (tests: the kept set must
    /// match it).
    #[cfg(test)]
    pub fn waiting_hosts_by_scan(&self) -> Vec<MachineId> {
        self.hosts
            .iter()
            .filter(|(_, h)| !h.dead && h.zone.is_none() && !h.containers.is_empty())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The zone recorded for a provisioned host.
    #[cfg(test)]
    pub fn zone_of(&self, host: &MachineId) -> Option<Option<String>> {
        self.hosts.get(host).and_then(|h| h.zone.clone())
    }
}
