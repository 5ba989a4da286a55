//! The registry's plain core: the machine cache, the instance view and classification.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::Scope;
use thiserror::Error;

use crate::model::{repack, Packing};
use crate::model::{
    CloudInstance, Constraints, DeadMachine, InstanceId, InstanceState, InstanceStatus, Life, Machine, MachineId,
    MachineStatus, MultiMap,
};
use crate::ports::{BrokerError, ModelError};

/// What a machine needs from the provisioner right now (Juju's classification of machines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Alive, unprovisioned, pending (or instance status `provisioning`): start it.
    Pending,
    /// Dead: stop its instance (by harvest mode) and mark it for removal.
    Dead,
    /// Dying and unprovisioned: take it to dead, then treat it as dead.
    DyingUnprovisioned,
    /// Nothing to do.
    None,
}

/// Classifies one machine.
///
/// Manual machines are never started; a dead manual machine is still removed. Which machines
/// a provisioner looks at at all is its [`Scope`](crate::config::Scope)'s business.
pub fn classify(m: &Machine) -> Class {
    match m.life {
        Life::Dead => Class::Dead,
        Life::Dying if m.instance.is_none() && !m.manual => Class::DyingUnprovisioned,
        Life::Dying => Class::None,
        Life::Alive if m.instance.is_some() || m.manual => Class::None,
        Life::Alive if m.status == MachineStatus::Pending => Class::Pending,
        Life::Alive if m.instance_status.is_provisioning() => Class::Pending,
        Life::Alive => Class::None,
    }
}

/// Whether a machine stops a model destruction without `force` from completing: a manual,
/// non-controller machine in scope that is not dead. The destruction kills what it
/// can, then names these.
pub fn blocks_destroy(m: &Machine, scope: &Scope) -> bool {
    scope.contains(&m.id) && !m.controller && m.manual && m.life != Life::Dead
}

/// The machine cache and the instance view.
#[derive(Debug, Default)]
pub struct MachineBook {
    scope: Scope,
    machines: BTreeMap<MachineId, Machine>,
    /// Instances we learnt of from our own starts: they win over an older model read.
    recorded: BTreeMap<MachineId, InstanceId>,
    /// Which cached machine owns each instance.
    owner: BTreeMap<InstanceId, MachineId>,
    /// Boxed: the map fills in id order, which leaves its B-tree nodes half empty, and a
    /// half-empty node of pointers wastes far less than one of 168-byte instances.
    instances: BTreeMap<InstanceId, Box<CloudInstance>>,
    /// Instances by the machine named in their tags.
    by_tag: MultiMap<MachineId, InstanceId>,
    loaded_once: bool,
    fresh: bool,
    /// The constraints our starts used, for machine reuse.
    started_with: BTreeMap<MachineId, Constraints>,
    /// When `machines` is rebuilt packed (it fills in id order).
    machines_packing: Packing,
    /// When `recorded`, `owner` and `instances` are rebuilt packed (they fill as our starts
    /// succeed, in about id order).
    recorded_packing: Packing,
    /// The book's clock (set by its actor before each decision).
    clock: Duration,
    /// Each listed instance's age as of a time on the clock: `(when, age then)`. An instance
    /// whose age the cloud does not give is aged from its first listing.
    ages: BTreeMap<InstanceId, (Duration, Duration)>,
    /// Instances whose stop this provisioner decided and has not seen through, with the
    /// machine they are tagged for when known: never adopted, not after a restart either.
    stopping: BTreeMap<InstanceId, Option<MachineId>>,
    /// The same, by the machine they are tagged for.
    stopping_for: MultiMap<MachineId, InstanceId>,
}

impl MachineBook {
    /// An empty book for the environ provisioner: no machines, no view.
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty book for a scope.
    pub fn with_scope(scope: Scope) -> Self {
        Self { scope, ..Self::default() }
    }

    /// The time the next decisions are taken at (the actor's clock).
    pub fn set_clock(&mut self, now: Duration) {
        self.clock = self.clock.max(now);
    }

    /// How long ago a listed instance was launched (see [`CloudInstance::age`]).
    pub fn age_of(&self, id: &InstanceId) -> Option<Duration> {
        let (when, age) = self.ages.get(id)?;
        Some(*age + self.clock.saturating_sub(*when))
    }

    /// Which machines this book is about.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The ids of a notification this provisioner acts on (machines outside its scope are none
    /// of its business), in the order given.
    pub fn in_scope(&self, ids: impl IntoIterator<Item = MachineId>) -> Vec<MachineId> {
        ids.into_iter().filter(|id| self.scope.contains(id)).collect()
    }

    /// Whether a listing ever succeeded (starts wait for it).
    pub fn loaded_once(&self) -> bool {
        self.loaded_once
    }

    /// Whether the last listing succeeded (unknown instances are only reported then).
    pub fn is_fresh(&self) -> bool {
        self.fresh
    }

    /// A cached machine.
    pub fn machine(&self, id: &MachineId) -> Option<&Machine> {
        self.machines.get(id)
    }

    /// Every cached machine, in id order.
    pub fn machines(&self) -> impl Iterator<Item = &Machine> {
        self.machines.values()
    }

    /// Every instance in the view, in id order.
    pub fn instances(&self) -> impl Iterator<Item = &CloudInstance> {
        self.instances.values().map(|i| &**i)
    }

    /// Stores a machine read from the model. An instance we recorded ourselves wins over a
    /// model read that predates it.
    pub fn upsert(&mut self, mut m: Machine) {
        if m.instance.is_none() {
            if let Some(ours) = self.recorded.get(&m.id) {
                m.instance = Some(ours.clone());
            }
        }
        if let Some(old) = self.machines.get(&m.id).and_then(|o| o.instance.clone()) {
            if Some(&old) != m.instance.as_ref() {
                self.owner.remove(&old);
            }
        }
        if let Some(inst) = &m.instance {
            self.owner.insert(inst.clone(), m.id.clone());
        }
        self.machines.insert(m.id.clone(), m);
        if self.machines_packing.due(self.machines.len()) {
            repack(&mut self.machines);
        }
    }

    /// Takes a batch of machine reads into the cache and classifies them (as Juju's
    /// `classifyMachine`): pending machines (with where they or the instance they will adopt are),
    /// dead ones (with their instances), ids gone from the model, ids to read again later; and the
    /// dying, unprovisioned machines to take to dead.
    pub fn absorb(
        &mut self,
        reads: impl IntoIterator<Item = (MachineId, Result<Machine, ModelError>)>,
    ) -> (Refreshed, Vec<MachineId>) {
        let mut out = Refreshed::default();
        let mut to_kill = Vec::new();
        for (id, read) in reads {
            match read {
                Ok(m) => {
                    let class = classify(&m);
                    self.upsert(m);
                    // Where it is, or where the instance it will adopt is: the allocator counts
                    // both before any zone is chosen.
                    let adopt = (class == Class::Pending).then(|| self.adoptable(&id)).flatten();
                    if let Some(zone) = self.placement(&id).or_else(|| adopt.as_ref().and_then(|i| i.zone.clone())) {
                        out.placements.push((id.clone(), zone));
                    }
                    if matches!(class, Class::Pending | Class::None) {
                        let keeps = adopt.as_ref().map(|i| &i.id);
                        out.orphans.extend(self.orphans_of(&id, keeps).into_iter().map(|i| (id.clone(), i)));
                    }
                    if class == Class::Dead {
                        out.orphans.extend(self.dead_orphans_of(&id).into_iter().map(|i| (id.clone(), i)));
                    }
                    if let Some(instance) = adopt {
                        out.adopt.push((id.clone(), instance));
                    }
                    match class {
                        // Its tagged instance is being stopped: a new start waits until the stop
                        // is seen through (never two live instances for one machine).
                        Class::Pending if self.stop_in_flight_for(&id) || self.tagged_held_by_dead(&id) => {
                            out.retry_later.push(id.clone())
                        }
                        Class::Pending => out.pending.extend(self.machine(&id).cloned()),
                        Class::Dead => out.dead.extend(self.dead_machine(&id)),
                        Class::DyingUnprovisioned => to_kill.push(id),
                        Class::None => {}
                    }
                }
                Err(ModelError::NotFound(_) | ModelError::Unauthorized(_)) => {
                    self.remove(&id);
                    out.gone.push(id);
                }
                Err(e) => {
                    tracing::warn!(machine = %id, error = %e, "reading machine failed; will retry");
                    out.retry_later.push(id);
                }
            }
        }
        (out, to_kill)
    }

    /// Marks a cached machine dead (after EnsureDead).
    pub fn set_dead(&mut self, id: &MachineId) {
        if let Some(m) = self.machines.get_mut(id) {
            m.life = Life::Dead;
        }
    }

    /// Forgets a machine (removed from the model, or marked for removal).
    pub fn remove(&mut self, id: &MachineId) {
        self.recorded.remove(id);
        self.started_with.remove(id);
        if let Some(m) = self.machines.remove(id) {
            if let Some(inst) = m.instance {
                if self.owner.get(&inst) == Some(id) {
                    self.owner.remove(&inst);
                }
            }
        }
    }

    /// Records the instance our start produced for a machine, with the constraints it used.
    pub fn record_started(&mut self, machine: &MachineId, instance: CloudInstance, constraints: Option<Constraints>) {
        match constraints {
            Some(c) => self.started_with.insert(machine.clone(), c),
            None => self.started_with.remove(machine),
        };
        self.record_instance(machine, instance);
    }

    /// Records the instance our start produced for a machine.
    pub fn record_instance(&mut self, machine: &MachineId, instance: CloudInstance) {
        self.recorded.insert(machine.clone(), instance.id.clone());
        self.owner.insert(instance.id.clone(), machine.clone());
        if let Some(m) = self.machines.get_mut(machine) {
            m.instance = Some(instance.id.clone());
            m.instance_status = InstanceStatus::from_static(instance.state.as_str());
        }
        self.insert_instance(instance);
        if self.recorded_packing.due(self.recorded.len()) {
            repack(&mut self.recorded);
            repack(&mut self.owner);
            repack(&mut self.instances);
        }
    }

    /// Replaces the view with a fresh listing (only non-terminated instances are kept).
    ///
    /// The maps are built whole from the sorted listing (a bulk build: packed nodes, no search
    /// per instance), not filled one insertion at a time: a resync of 100,000 instances costs a
    /// sort of an already sorted list instead of 200,000 tree insertions.
    pub fn load_view(&mut self, listing: Vec<CloudInstance>) {
        let live: Vec<CloudInstance> =
            listing.into_iter().filter(|inst| inst.state != InstanceState::Terminated).collect();
        let ages = live
            .iter()
            .map(|inst| {
                let age = match inst.age {
                    Some(age) => (self.clock, age),
                    None => self.ages.get(&inst.id).copied().unwrap_or((self.clock, Duration::ZERO)),
                };
                (inst.id.clone(), age)
            })
            .collect();
        self.by_tag = live.iter().filter_map(|inst| Some((inst.tags.machine.clone()?, inst.id.clone()))).collect();
        // Equal ids keep the last one listed, as insertion would.
        self.instances = live.into_iter().map(|inst| (inst.id.clone(), Box::new(inst))).collect();
        self.ages = ages;
        self.loaded_once = true;
        self.fresh = true;
    }

    /// A listing failed: nothing is harvested until one succeeds.
    pub fn mark_stale(&mut self) {
        self.fresh = false;
    }

    /// The provisioner decided to stop these instances (tagged for `machine`, when known):
    /// they are never adopted, and their machine is not started again before the stop is done.
    pub fn stops_planned(&mut self, ids: &[InstanceId], machine: Option<&MachineId>) {
        for id in ids {
            let tagged = machine
                .cloned()
                .or_else(|| self.stopping.get(id).cloned().flatten())
                .or_else(|| self.instances.get(id).and_then(|i| i.tags.machine.clone()));
            if let Some(m) = &tagged {
                self.stopping_for.insert(m.clone(), id.clone());
            }
            self.stopping.insert(id.clone(), tagged);
        }
    }

    /// Whether an instance tagged for this machine is still recorded by a dead machine (a reuse
    /// handover a crash interrupted): it goes with the dead machine, and this one is started
    /// only once it is gone (never two live instances for one machine).
    pub fn tagged_held_by_dead(&self, machine: &MachineId) -> bool {
        self.by_tag.get(machine).any(|i| {
            self.owner
                .get(i)
                .filter(|o| *o != machine)
                .and_then(|o| self.machines.get(o))
                .is_some_and(|o| o.life == Life::Dead)
        })
    }

    /// Whether a stop the provisioner decided is in flight for an instance of this machine.
    pub fn stop_in_flight_for(&self, machine: &MachineId) -> bool {
        self.stopping_for.contains_key(machine)
    }

    /// Instances tagged for a live machine that it will never own: besides the one it records
    /// (or is about to adopt, `keeps`), every other unowned one (a second start whose result a
    /// crash lost); and all of them if it records none and is in provisioning error (a start
    /// whose record failed: its stop was decided, maybe by a predecessor that crashed before
    /// seeing it through). They are stopped, never adopted, each stop retried until it succeeds.
    pub fn orphans_of(&self, machine: &MachineId, keeps: Option<&InstanceId>) -> Vec<InstanceId> {
        let Some(m) = self.machines.get(machine) else { return Vec::new() };
        if m.life != Life::Alive || m.manual || !self.fresh {
            return Vec::new();
        }
        let failed = m.status == MachineStatus::Error || m.instance_status.is_error();
        let keeps = m.instance.as_ref().or(keeps);
        if keeps.is_none() && !failed {
            return Vec::new();
        }
        self.by_tag
            .get(machine)
            .filter(|i| Some(*i) != keeps && !self.owner.contains_key(*i) && !self.stopping.contains_key(*i))
            .cloned()
            .collect()
    }

    /// Instances tagged for a dead machine in provisioning error that records none: orphans of a
    /// start whose record failed, whose stop was decided (maybe by a predecessor that crashed
    /// before seeing it through, having left the machine dead until then). They are stopped
    /// whatever the mode, as for a live machine, retried until it succeeds; they stay in the dead
    /// machine's view too, so that its removal waits for their stop.
    pub fn dead_orphans_of(&self, machine: &MachineId) -> Vec<InstanceId> {
        let Some(m) = self.machines.get(machine) else { return Vec::new() };
        let failed = m.status == MachineStatus::Error || m.instance_status.is_error();
        if m.life != Life::Dead || m.manual || !self.fresh || m.instance.is_some() || !failed {
            return Vec::new();
        }
        self.by_tag
            .get(machine)
            .filter(|i| !self.owner.contains_key(*i) && !self.stopping.contains_key(*i))
            .cloned()
            .collect()
    }

    /// Instances that were terminated (by us).
    pub fn instances_gone(&mut self, ids: &[InstanceId]) {
        for id in ids {
            if let Some(Some(m)) = self.stopping.remove(id) {
                self.stopping_for.remove(&m, id);
            }
            if let Some(inst) = self.instances.remove(id) {
                if let Some(m) = inst.tags.machine {
                    self.by_tag.remove(&m, id);
                }
            }
        }
    }

    fn insert_instance(&mut self, inst: CloudInstance) {
        if let Some(m) = &inst.tags.machine {
            self.by_tag.insert(m.clone(), inst.id.clone());
        }
        self.instances.insert(inst.id.clone(), Box::new(inst));
    }

    /// Instances of ours that no cached machine owns and whose tag names no cached machine
    /// (which would be starting it, adopt it, or harvest it with itself). `None` while the view
    /// is stale.
    pub fn unknown_instances(&self) -> Option<Vec<InstanceId>> {
        if !self.fresh {
            return None;
        }
        let unknown = self
            .instances
            .values()
            .filter(|i| !self.owner.contains_key(&i.id))
            .filter(|i| self.scope.judges(i.tags.machine.as_ref()))
            // An instance tagged for a machine we still know is that machine's business (a
            // dead one's harvest takes its strays, a deferred stop takes a start in flight):
            // only once the machine is gone is the instance unknown.
            .filter(|i| i.tags.machine.as_ref().is_none_or(|m| !self.machines.contains_key(m)))
            .map(|i| i.id.clone())
            .collect();
        Some(unknown)
    }

    /// [`MachineBook::unknown_instances`] with each one's age (see [`MachineBook::age_of`]).
    pub fn unknown_with_ages(&self) -> Option<Vec<(InstanceId, Duration)>> {
        let unknown = self.unknown_instances()?;
        Some(
            unknown
                .into_iter()
                .map(|id| {
                    let age = self.age_of(&id).unwrap_or_default();
                    (id, age)
                })
                .collect(),
        )
    }

    /// A non-terminated instance tagged with this machine that no other machine owns: the
    /// product of a start whose result was lost (a crash), to adopt instead of starting again.
    pub fn adoptable(&self, machine: &MachineId) -> Option<CloudInstance> {
        self.by_tag.get(machine).find_map(|id| {
            let free = self.owner.get(id).is_none_or(|o| o == machine) && !self.stopping.contains_key(id);
            free.then(|| self.instances.get(id).map(|i| (**i).clone())).flatten()
        })
    }

    /// Live machines whose instance changed state outside our control since we last said (instances
    /// stopped outside our control): a stopped or suspended instance shows as `stopped`, one that
    /// came back as `running`, one gone from a fresh listing as `missing`. The cache takes the new
    /// status; the caller writes it to the model. Manual machines are not in the cloud and are
    /// skipped.
    pub fn status_changes(&mut self) -> Vec<(MachineId, InstanceStatus, String)> {
        let mut out = Vec::new();
        for m in self.machines.values_mut() {
            if m.life == Life::Dead || m.manual {
                continue;
            }
            let Some(inst) = &m.instance else { continue };
            let (status, message) = match self.instances.get(inst) {
                Some(i) if i.state == InstanceState::Stopped => (
                    InstanceStatus::other("stopped"),
                    format!("instance {inst} is stopped or suspended outside the provisioner's control"),
                ),
                Some(i) => (InstanceStatus::from_static(i.state.as_str()), String::new()),
                None if self.fresh => {
                    (InstanceStatus::from_static("missing"), format!("instance {inst} is not in the cloud"))
                }
                None => continue,
            };
            if m.instance_status != status {
                m.instance_status = status.clone();
                out.push((m.id.clone(), status, message));
            }
        }
        out
    }

    /// The dead-machine view of a cached machine, with stray instances tagged for it.
    pub fn dead_machine(&self, id: &MachineId) -> Option<DeadMachine> {
        let m = self.machines.get(id)?;
        let mut dead = DeadMachine::of(m);
        if !m.manual {
            dead.tagged = self
                .by_tag
                .get(id)
                .filter(|i| self.owner.get(*i).is_none_or(|o| o == id) && Some(*i) != m.instance.as_ref())
                .cloned()
                .collect();
            // Those whose stop is decided and not seen through, even if no listing shows them yet
            // (an orphan whose record failed): the machine is removed only after that stop.
            for inst in self.stopping_for.get(id) {
                if Some(inst) != m.instance.as_ref() && !dead.tagged.contains(inst) {
                    dead.tagged.push(inst.clone());
                }
            }
            // Clean enough to reuse: started by us with known constraints, running, no error.
            dead.reusable =
                m.instance.as_ref().and_then(|inst| {
                    let view = self.instances.get(inst).filter(|i| i.state == InstanceState::Running)?;
                    let constraints = self.started_with.get(id)?.clone();
                    (m.status != MachineStatus::Error && !m.instance_status.is_error()).then(|| {
                        crate::model::Reusable { instance: inst.clone(), zone: view.zone.clone(), constraints }
                    })
                });
        }
        Some(dead)
    }

    /// The zone of a live machine's instance, if the view knows it.
    pub fn placement(&self, id: &MachineId) -> Option<String> {
        let m = self.machines.get(id).filter(|m| m.life != Life::Dead)?;
        self.instances.get(m.instance.as_ref()?)?.zone.clone()
    }

    /// The view's record of an instance.
    pub fn instance(&self, id: &InstanceId) -> Option<&CloudInstance> {
        self.instances.get(id).map(|i| &**i)
    }
}

/// Why the registry could not answer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RegistryError {
    /// The cloud listing failed; nothing was classified.
    #[error("listing instances: {0}")]
    Listing(BrokerError),
    /// The batched machines call failed; nothing was classified.
    #[error("getting machines {ids:?}: {source}")]
    Machines {
        /// The ids asked for.
        ids: Vec<MachineId>,
        /// The model's error.
        source: ModelError,
    },
    /// The last listing failed, so unknown instances cannot be told apart.
    #[error("instance view is stale: the last cloud listing failed")]
    ViewStale,
}

/// The classified batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refreshed {
    /// Machines to start.
    pub pending: Vec<Machine>,
    /// Dead machines (including dying unprovisioned ones taken to dead).
    pub dead: Vec<DeadMachine>,
    /// Ids whose read or EnsureDead failed: try them again later.
    pub retry_later: Vec<MachineId>,
    /// Ids no longer in the model.
    pub gone: Vec<MachineId>,
    /// Provisioned machines of the batch and the zones of their instances (for the allocator).
    pub placements: Vec<(MachineId, String)>,
    /// Pending machines with an instance already tagged for them (a start whose result was
    /// lost): they adopt it instead of starting another.
    pub adopt: Vec<(MachineId, CloudInstance)>,
    /// Live machines in provisioning error and the unrecorded instances tagged for them (a
    /// start whose record failed): stop them.
    pub orphans: Vec<(MachineId, InstanceId)>,
}

/// The registry's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrySnapshot {
    /// Cached machines, in id order.
    pub machines: Vec<Machine>,
    /// The instance view, in id order.
    pub instances: Vec<CloudInstance>,
    /// Whether the last listing succeeded.
    pub fresh: bool,
}

/// What the destruction concerns, within this provisioner's scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestroyTargets {
    /// Non-manual, non-controller machines, with their instances.
    pub machines: Vec<DeadMachine>,
    /// Manual, non-controller machines that are not dead.
    pub manual: Vec<MachineId>,
}
