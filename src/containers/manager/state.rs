//! The manager's plain core: hosts, their zones, and where container changes go.

use std::collections::{BTreeMap, BTreeSet};

use crate::types::{Life, Machine, MachineId};

/// What the actor must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEffect {
    /// Create a listening supervisor for `kind` on `host` (zone known if provisioned).
    Supervise {
        /// The host.
        host: MachineId,
        /// The container type.
        kind: String,
        /// `Some(zone)` once the host is provisioned.
        zone: Option<Option<String>>,
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
    /// The host is dead or gone: stop its supervisors.
    Died(MachineId),
    /// A container of a type no host supports: tell its status.
    Unsupported(MachineId, String),
}

#[derive(Debug, Clone)]
struct Host {
    zone: Option<Option<String>>,
    dead: bool,
}

/// Hosts and supported types.
#[derive(Debug, Clone)]
pub struct ManagerBook {
    kinds: Vec<String>,
    hosts: BTreeMap<MachineId, Host>,
    unsupported: BTreeSet<MachineId>,
}

impl ManagerBook {
    /// A book for hosts that support these container types.
    pub fn new(kinds: Vec<String>) -> Self {
        Self { kinds, hosts: BTreeMap::new(), unsupported: BTreeSet::new() }
    }

    fn ensure_host(&mut self, id: &MachineId, out: &mut Vec<HostEffect>) -> bool {
        if self.hosts.get(id).is_some_and(|h| h.dead) {
            return false;
        }
        if !self.hosts.contains_key(id) {
            self.hosts.insert(id.clone(), Host { zone: None, dead: false });
            for kind in &self.kinds {
                out.push(HostEffect::Supervise { host: id.clone(), kind: kind.clone(), zone: None });
            }
        }
        true
    }

    /// A top-level machine was read (`None` = not found) with the zone of its instance.
    pub fn host_seen(&mut self, id: &MachineId, machine: Option<&Machine>, zone: Option<String>) -> Vec<HostEffect> {
        let mut out = Vec::new();
        match machine {
            Some(m) if m.life != Life::Dead => {
                if !self.ensure_host(id, &mut out) {
                    return out;
                }
                if m.instance.is_some() {
                    out.extend(self.provisioned(id, zone));
                }
            }
            _ => {
                if let Some(h) = self.hosts.get_mut(id) {
                    if !h.dead {
                        h.dead = true;
                        out.push(HostEffect::Died(id.clone()));
                    }
                }
            }
        }
        out
    }

    /// The host got its instance in `zone`.
    pub fn provisioned(&mut self, id: &MachineId, zone: Option<String>) -> Vec<HostEffect> {
        let mut out = Vec::new();
        if !self.ensure_host(id, &mut out) {
            return out;
        }
        let host = self.hosts.get_mut(id).expect("ensured above");
        if host.zone.is_none() {
            host.zone = Some(zone.clone());
            out.push(HostEffect::Provisioned { host: id.clone(), zone });
        }
        out
    }

    /// Containers changed: route them by host and type.
    pub fn containers_seen(&mut self, ids: &[MachineId]) -> Vec<HostEffect> {
        let mut out = Vec::new();
        let mut routes: BTreeMap<(MachineId, String), Vec<MachineId>> = BTreeMap::new();
        for id in ids {
            let Some((host, kind)) = id.container_of() else { continue };
            if !self.kinds.iter().any(|k| k == kind) {
                if self.unsupported.insert(id.clone()) {
                    out.push(HostEffect::Unsupported(id.clone(), kind.to_owned()));
                }
                continue;
            }
            // A dead host's supervisor still hears of its containers (to reap dead ones).
            if !self.hosts.get(&host).is_some_and(|h| h.dead) && !self.ensure_host(&host, &mut out) {
                continue;
            }
            routes.entry((host, kind.to_owned())).or_default().push(id.clone());
        }
        out.extend(routes.into_iter().map(|((host, kind), ids)| HostEffect::Route { host, kind, ids }));
        out
    }

    /// The zone recorded for a provisioned host.
    pub fn zone_of(&self, host: &MachineId) -> Option<Option<String>> {
        self.hosts.get(host).and_then(|h| h.zone.clone())
    }
}
