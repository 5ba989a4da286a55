//! The registry's plain core: the machine cache, the instance view and classification.

use std::collections::{BTreeMap, BTreeSet};
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

/// What the book knows of one machine id: one entry where there were four maps (the machine
/// cache, our records, our starts' constraints and the index by tag). A machine of a fleet
/// has all four; an id may also be known by a part alone (an instance tagged for a machine the
/// cache does not hold). An entry with no part left is removed.
#[derive(Debug, Clone, Default)]
struct MachineSlot {
    /// The cached machine, as last read from the model.
    machine: Option<Machine>,
    /// What our starts and the view know of it, boxed: a machine only read so far (a whole
    /// fleet, while its first batch is classified) has none of it.
    ours: Option<Box<Ours>>,
}

/// The parts of a machine's entry that our starts and the view add.
#[derive(Debug, Clone, Default)]
struct Ours {
    /// The instance we learnt of from our own start: it wins over an older model read.
    recorded: Option<InstanceId>,
    /// The constraints our start used, for machine reuse.
    started_with: StartedWith,
    /// The view's instances whose tags name this machine, in id order.
    tagged: Tagged,
    /// The listings issued when it got its recorded instance (see
    /// [`MachineBook::issue_listing`]): only a listing issued after that judges its extra
    /// instances.
    recorded_after: u64,
}

impl Ours {
    fn is_empty(&self) -> bool {
        self.recorded.is_none()
            && matches!(self.started_with, StartedWith::Unknown)
            && matches!(self.tagged, Tagged::None)
    }
}

/// No instance tagged.
static NO_TAGS: Tagged = Tagged::None;

impl MachineSlot {
    fn is_empty(&self) -> bool {
        self.machine.is_none() && self.ours.as_ref().is_none_or(|o| o.is_empty())
    }

    /// Our parts, made (empty) if there are none.
    fn ours(&mut self) -> &mut Ours {
        self.ours.get_or_insert_with(Box::default)
    }

    /// Drops our parts' box once they are all empty.
    fn tidy(&mut self) {
        if self.ours.as_ref().is_some_and(|o| o.is_empty()) {
            self.ours = None;
        }
    }

    fn recorded(&self) -> Option<&InstanceId> {
        self.ours.as_ref()?.recorded.as_ref()
    }

    fn started_with(&self) -> Option<Constraints> {
        self.ours.as_ref()?.started_with.get()
    }

    fn tagged(&self) -> &Tagged {
        self.ours.as_ref().map_or(&NO_TAGS, |o| &o.tagged)
    }
}

/// The constraints a start of ours used: a fleet's machines mostly have none, which takes no
/// allocation here.
#[derive(Debug, Clone, Default)]
enum StartedWith {
    /// Not started by us (or adopted): not reusable.
    #[default]
    Unknown,
    /// Started with no constraints (`Constraints::default()`).
    Default,
    /// Started with these.
    Given(Box<Constraints>),
}

impl StartedWith {
    fn of(constraints: Option<Constraints>) -> Self {
        match constraints {
            None => StartedWith::Unknown,
            Some(c) if c == Constraints::default() => StartedWith::Default,
            Some(c) => StartedWith::Given(Box::new(c)),
        }
    }

    fn get(&self) -> Option<Constraints> {
        match self {
            StartedWith::Unknown => None,
            StartedWith::Default => Some(Constraints::default()),
            StartedWith::Given(c) => Some((**c).clone()),
        }
    }
}

/// Instances tagged for one machine: nearly always none or one, held inline.
#[derive(Debug, Clone, Default)]
enum Tagged {
    #[default]
    None,
    One(InstanceId),
    Many(BTreeSet<InstanceId>),
}

impl Tagged {
    /// Built from instance ids in order, without repeats.
    fn of(mut ids: impl Iterator<Item = InstanceId>) -> Self {
        match (ids.next(), ids.next()) {
            (None, _) => Tagged::None,
            (Some(one), None) => Tagged::One(one),
            (Some(a), Some(b)) => Tagged::Many([a, b].into_iter().chain(ids).collect()),
        }
    }

    fn add(&mut self, id: InstanceId) {
        match self {
            Tagged::None => *self = Tagged::One(id),
            Tagged::One(one) if *one == id => {}
            Tagged::One(one) => *self = Tagged::Many(BTreeSet::from([one.clone(), id])),
            Tagged::Many(set) => {
                set.insert(id);
            }
        }
    }

    fn remove(&mut self, id: &InstanceId) {
        match self {
            Tagged::One(one) if one == id => *self = Tagged::None,
            Tagged::Many(set) => {
                set.remove(id);
                if set.is_empty() {
                    *self = Tagged::None;
                }
            }
            _ => {}
        }
    }

    fn iter(&self) -> impl Iterator<Item = &InstanceId> {
        let (one, many) = match self {
            Tagged::None => (None, None),
            Tagged::One(one) => (Some(one), None),
            Tagged::Many(set) => (None, Some(set.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

/// What the book knows of one instance id: which cached machine owns it, the view's record
/// and its age (one entry where there were three maps). An entry with no part left is removed.
#[derive(Debug, Clone, Default)]
struct InstanceSlot {
    /// The cached machine that owns it.
    owner: Option<MachineId>,
    /// The view's record. Boxed: the map fills in id order, which leaves its B-tree nodes
    /// partly empty, and an empty place for a pointer wastes far less than one for a
    /// 168-byte instance.
    view: Option<Box<CloudInstance>>,
    /// Its age as of a time on the clock, `(when, age then)`, once listed. An instance whose
    /// age the cloud does not give is aged from its first listing.
    age: Option<(Duration, Duration)>,
}

impl InstanceSlot {
    fn is_empty(&self) -> bool {
        self.owner.is_none() && self.view.is_none() && self.age.is_none()
    }
}

/// The machine cache and the instance view.
#[derive(Debug, Clone, Default)]
pub struct MachineBook {
    scope: Scope,
    /// Everything known by machine id, one entry per id.
    machines: BTreeMap<MachineId, MachineSlot>,
    /// Everything known by instance id (owner, view, age), one entry per id.
    instances: BTreeMap<InstanceId, InstanceSlot>,
    loaded_once: bool,
    fresh: bool,
    /// When `machines` is rebuilt packed (it fills in id order).
    machines_packing: Packing,
    /// When `instances` is rebuilt packed (it fills as our starts succeed, in about id order).
    instances_packing: Packing,
    /// Tags an instance recorded since the last listing had in the view before (an instance
    /// handed to another machine): the entry under the old machine stays until the next
    /// listing, which drops it.
    stale_tags: Vec<(MachineId, InstanceId)>,
    /// The book's clock (set by its actor before each decision).
    clock: Duration,
    /// Instances whose stop this provisioner decided and has not seen through, with the
    /// machine they are tagged for when known: never adopted, not after a restart either.
    stopping: BTreeMap<InstanceId, Option<MachineId>>,
    /// The same, by the machine they are tagged for.
    stopping_for: MultiMap<MachineId, InstanceId>,
    /// Listings issued so far (each numbered by [`MachineBook::issue_listing`]).
    listings_issued: u64,
    /// The number of the listing the view holds.
    view_listing: u64,
    /// Live machines whose recorded instance the listings show stopped, since when (on the
    /// book's clock) and which instance (issue 34): a stop seen again after a restart counts
    /// from then, never earlier.
    stopped_since: BTreeMap<MachineId, (InstanceId, Duration)>,
    /// The image a start uses today, as the last periodic listing read it (issue 34; none: the
    /// cloud does not say, and image drift is not judged).
    current_image: Option<String>,
    /// Instances whose stop this provisioner saw through, with the number of the last listing
    /// issued by then: a listing issued no later may have been answered before the stop, and
    /// does not bring them back into the view (found by the model checker, issue 35: a lagging
    /// listing showed a stopped orphan live, and a retried machine adopted it). Kept until a
    /// listing issued after the stop is loaded.
    stopped_at: BTreeMap<InstanceId, u64>,
    /// Safeguards turned off on purpose (issue 35's model-check tests; none as shipped).
    mutations: crate::config::Mutations,
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

    /// The same book with these safeguards turned off (the model checker's mutation tests).
    pub fn with_mutations(mut self, mutations: crate::config::Mutations) -> Self {
        self.mutations = mutations;
        self
    }

    /// Records the image a start uses today ([`crate::ports::Broker::current_image`]).
    pub fn set_current_image(&mut self, image: Option<String>) {
        self.current_image = image;
    }

    /// The time the next decisions are taken at (the actor's clock).
    pub fn set_clock(&mut self, now: Duration) {
        self.clock = self.clock.max(now);
    }

    /// How long ago a listed instance was launched (see [`CloudInstance::age`]).
    pub fn age_of(&self, id: &InstanceId) -> Option<Duration> {
        let (when, age) = self.instances.get(id)?.age?;
        Some(age + self.clock.saturating_sub(when))
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
        self.machines.get(id)?.machine.as_ref()
    }

    /// Every cached machine, in id order.
    pub fn machines(&self) -> impl Iterator<Item = &Machine> {
        self.machines.values().filter_map(|s| s.machine.as_ref())
    }

    /// Every instance in the view, in id order.
    pub fn instances(&self) -> impl Iterator<Item = &CloudInstance> {
        self.instances.values().filter_map(|s| s.view.as_deref())
    }

    /// The machine's entry, made (empty) if there is none (one search). The caller fills
    /// it, then calls `pack`.
    fn machine_slot(&mut self, id: &MachineId) -> &mut MachineSlot {
        self.machines.entry(id.clone()).or_default()
    }

    /// The instance's entry, made (empty) if there is none (one search). The caller fills
    /// it, then calls `pack`.
    fn instance_slot(&mut self, id: &InstanceId) -> &mut InstanceSlot {
        self.instances.entry(id.clone()).or_default()
    }

    /// Rebuilds the maps packed when they have grown enough (see `Packing`).
    fn pack(&mut self) {
        if self.machines_packing.due(self.machines.len()) {
            repack(&mut self.machines);
        }
        if self.instances_packing.due(self.instances.len()) {
            repack(&mut self.instances);
        }
    }

    /// Which cached machine owns an instance.
    fn owner(&self, id: &InstanceId) -> Option<&MachineId> {
        self.instances.get(id)?.owner.as_ref()
    }

    /// The view's record of an instance, as a reference.
    fn view(&self, id: &InstanceId) -> Option<&CloudInstance> {
        self.instances.get(id)?.view.as_deref()
    }

    /// Forgets who owns an instance (its entry goes if nothing else is left in it).
    fn disown(&mut self, id: &InstanceId) {
        if let Some(slot) = self.instances.get_mut(id) {
            slot.owner = None;
            if slot.is_empty() {
                self.instances.remove(id);
            }
        }
    }

    /// Stores a machine read from the model. An instance we recorded ourselves wins over a
    /// model read that predates it.
    pub fn upsert(&mut self, mut m: Machine) {
        let id = m.id.clone();
        let issued = self.listings_issued;
        let slot = self.machine_slot(&id);
        if m.instance.is_none() {
            if let Some(ours) = slot.recorded() {
                m.instance = Some(ours.clone());
            }
        }
        let old = slot.machine.as_ref().and_then(|o| o.instance.clone());
        let new = m.instance.clone();
        if new.is_some() && new != old {
            // Learnt of a new instance from the model: its extras are judged on a later listing.
            if let Some(ours) = &mut slot.ours {
                ours.recorded_after = issued;
            }
        }
        slot.machine = Some(m);
        if let Some(old) = old {
            if Some(&old) != new.as_ref() {
                self.disown(&old);
            }
        }
        if let Some(inst) = new {
            self.instance_slot(&inst).owner = Some(id);
        }
        self.pack();
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
                    // Its entry, looked up once for all the questions below.
                    let slot = self.machines.get(&id).expect("stored above");
                    // Where it is, or where the instance it will adopt is: the allocator counts
                    // both before any zone is chosen.
                    let adopt = (class == Class::Pending).then(|| self.adoptable_in(&id, slot)).flatten();
                    if let Some(zone) = self.placement_in(slot).or_else(|| adopt.as_ref().and_then(|i| i.zone.clone()))
                    {
                        out.placements.push((id.clone(), zone));
                    }
                    if matches!(class, Class::Pending | Class::None) {
                        let keeps = adopt.as_ref().map(|i| &i.id);
                        out.orphans.extend(self.orphans_in(slot, keeps).into_iter().map(|i| (id.clone(), i)));
                    }
                    if class == Class::Dead {
                        out.orphans.extend(self.dead_orphans_in(slot).into_iter().map(|i| (id.clone(), i)));
                    }
                    // The mutation `adopt-while-stopping`: a machine that adopts an instance
                    // whose stop is in flight does not wait for that stop.
                    let adopts_stopping = self.mutations.adopt_while_stopping && adopt.is_some();
                    if let Some(instance) = adopt {
                        out.adopt.push((id.clone(), instance));
                    }
                    match class {
                        // Its tagged instance is being stopped: a new start waits until the stop
                        // is seen through (never two live instances for one machine).
                        Class::Pending
                            if (self.stop_in_flight_for(&id) && !adopts_stopping)
                                || self.held_by_dead_in(&id, slot) =>
                        {
                            out.retry_later.push(id.clone())
                        }
                        Class::Pending => out.pending.extend(slot.machine.clone()),
                        Class::Dead => out.dead.extend(self.dead_machine_in(&id, slot)),
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

    /// The answers of the `EnsureDead` calls [`MachineBook::absorb`] asked for, into `out`: a
    /// machine taken to dead is dead here too and handed on with its instance; one whose call
    /// failed is read again later.
    pub fn killed(&mut self, results: Vec<(MachineId, Result<(), ModelError>)>, out: &mut Refreshed) {
        for (id, res) in results {
            match res {
                Ok(()) => {
                    tracing::info!(machine = %id, "killing dying, unprovisioned machine");
                    self.set_dead(&id);
                    out.dead.extend(self.dead_machine(&id));
                }
                Err(e) => {
                    tracing::warn!(machine = %id, error = %e, "ensure dead failed; will retry");
                    out.retry_later.push(id);
                }
            }
        }
    }

    /// Marks a cached machine dead (after EnsureDead).
    pub fn set_dead(&mut self, id: &MachineId) {
        if let Some(m) = self.machines.get_mut(id).and_then(|s| s.machine.as_mut()) {
            m.life = Life::Dead;
        }
    }

    /// Forgets a machine (removed from the model, or marked for removal).
    pub fn remove(&mut self, id: &MachineId) {
        let Some(slot) = self.machines.get_mut(id) else { return };
        if let Some(ours) = &mut slot.ours {
            ours.recorded = None;
            ours.started_with = StartedWith::Unknown;
        }
        slot.tidy();
        let machine = slot.machine.take();
        if slot.is_empty() {
            self.machines.remove(id);
        }
        if let Some(inst) = machine.and_then(|m| m.instance) {
            if self.owner(&inst) == Some(id) {
                self.disown(&inst);
            }
        }
    }

    /// Records the instance our start produced for a machine, with the constraints it used.
    pub fn record_started(&mut self, machine: &MachineId, instance: CloudInstance, constraints: Option<Constraints>) {
        self.record(machine, instance, Some(StartedWith::of(constraints)));
    }

    /// Records the instance our start produced for a machine.
    #[cfg(test)]
    pub fn record_instance(&mut self, machine: &MachineId, instance: CloudInstance) {
        self.record(machine, instance, None);
    }

    /// Records an instance of ours, and the constraints of its start when given.
    fn record(&mut self, machine: &MachineId, instance: CloudInstance, started_with: Option<StartedWith>) {
        let issued = self.listings_issued;
        let slot = self.machine_slot(machine);
        if let Some(m) = &mut slot.machine {
            m.instance = Some(instance.id.clone());
            m.instance_status = InstanceStatus::from_static(instance.state.as_str());
        }
        let ours = slot.ours();
        if let Some(started_with) = started_with {
            ours.started_with = started_with;
        }
        ours.recorded = Some(instance.id.clone());
        ours.recorded_after = issued;
        if let Some(tag) = &instance.tags.machine {
            if tag == machine {
                ours.tagged.add(instance.id.clone());
            } else {
                self.machine_slot(tag).ours().tagged.add(instance.id.clone());
            }
        }
        let slot = self.instances.entry(instance.id.clone()).or_default();
        slot.owner = Some(machine.clone());
        let before = slot.view.as_ref().and_then(|v| v.tags.machine.as_ref());
        if let Some(before) = before.filter(|m| Some(*m) != instance.tags.machine.as_ref()) {
            self.stale_tags.push((before.clone(), instance.id.clone()));
        }
        slot.view = Some(Box::new(instance));
        self.pack();
    }

    /// Numbers a listing about to be asked of the cloud: [`MachineBook::load_listing`] takes
    /// its answer with that number, so the book knows whether the view was listed after a
    /// machine got its instance.
    pub fn issue_listing(&mut self) -> u64 {
        self.listings_issued += 1;
        self.listings_issued
    }

    /// [`MachineBook::load_listing`] of a listing issued now.
    pub fn load_view(&mut self, listing: Vec<CloudInstance>) {
        let number = self.issue_listing();
        self.load_listing(listing, number);
    }

    /// Replaces the view with a fresh listing (only non-terminated instances are kept), the
    /// one [`MachineBook::issue_listing`] numbered `number`.
    ///
    /// Nothing is looked up instance by instance: the listing is put in instance-id order (a
    /// pass when the cloud lists in that order) and merged in one pass with the entries by
    /// instance id, in place (each entry keeps its box). Only what changed reaches the entries
    /// by machine: the instances that came, went or changed machine tags. A listing that
    /// changes more than half the view (the first one) sets every machine's tags in one pass
    /// instead (the tags sorted by machine through the ids' integer keys).
    pub fn load_listing(&mut self, listing: Vec<CloudInstance>, number: u64) {
        if number < self.view_listing {
            // Older than the view (two listings crossed): it would bring back what the newer
            // one no longer shows.
            return;
        }
        self.view_listing = number;
        let stopped_at = &self.stopped_at;
        let mut live: Vec<CloudInstance> = listing
            .into_iter()
            .filter(|inst| inst.state != InstanceState::Terminated)
            .filter(|inst| stopped_at.get(&inst.id).is_none_or(|at| *at < number))
            .collect();
        self.stopped_at.retain(|_, at| *at >= number);
        // Stable: of equal ids the last one listed stays last, and is the one kept.
        live.sort_by(|a, b| a.id.cmp(&b.id));
        live.dedup_by(|later, kept| {
            let same = later.id == kept.id;
            if same {
                std::mem::swap(later, kept);
            }
            same
        });
        let viewed = self.instances.values().filter(|s| s.view.is_some()).count();
        let whole = viewed < live.len() / 2;
        if whole {
            self.retag(&live);
            self.stale_tags.clear();
        } else {
            for (m, id) in std::mem::take(&mut self.stale_tags) {
                // Unless the view tags it for that machine again (handed back since).
                if self.view(&id).and_then(|v| v.tags.machine.as_ref()) != Some(&m) {
                    self.untag(&m, &id);
                }
            }
        }
        let clock = self.clock;
        let fresh_age = |inst: &CloudInstance, before: Option<(Duration, Duration)>| match inst.age {
            Some(age) => (clock, age),
            None => before.unwrap_or((clock, Duration::ZERO)),
        };
        // (machine it was tagged for, machine it is tagged for, instance)
        let mut moved: Vec<(Option<MachineId>, Option<MachineId>, InstanceId)> = Vec::new();
        let mut added: Vec<(InstanceId, InstanceSlot)> = Vec::new();
        let mut emptied = false;
        let mut listed = live.into_iter().peekable();
        for (id, slot) in self.instances.iter_mut() {
            while let Some(inst) = listed.next_if(|i| i.id < *id) {
                if let Some(m) = inst.tags.machine.clone().filter(|_| !whole) {
                    moved.push((None, Some(m), inst.id.clone()));
                }
                let age = fresh_age(&inst, None);
                added.push((inst.id.clone(), InstanceSlot { owner: None, view: Some(Box::new(inst)), age: Some(age) }));
            }
            match listed.next_if(|i| i.id == *id) {
                Some(inst) => {
                    slot.age = Some(fresh_age(&inst, slot.age));
                    let before = slot.view.as_ref().and_then(|v| v.tags.machine.as_ref());
                    if !whole && before != inst.tags.machine.as_ref() {
                        moved.push((before.cloned(), inst.tags.machine.clone(), id.clone()));
                    }
                    match &mut slot.view {
                        // A listing that does not say what capacity the instance runs on keeps
                        // what its start said (the service's simulated cloud lists none).
                        Some(view) => {
                            let known = view.capacity_type;
                            **view = inst;
                            view.capacity_type = view.capacity_type.or(known);
                        }
                        None => slot.view = Some(Box::new(inst)),
                    }
                }
                None => {
                    if let Some(m) = slot.view.take().and_then(|v| v.tags.machine).filter(|_| !whole) {
                        moved.push((Some(m), None, id.clone()));
                    }
                    slot.age = None;
                    emptied |= slot.owner.is_none();
                }
            }
        }
        for inst in listed {
            if let Some(m) = inst.tags.machine.clone().filter(|_| !whole) {
                moved.push((None, Some(m), inst.id.clone()));
            }
            let age = fresh_age(&inst, None);
            added.push((inst.id.clone(), InstanceSlot { owner: None, view: Some(Box::new(inst)), age: Some(age) }));
        }
        if emptied {
            self.instances.retain(|_, slot| !slot.is_empty());
        }
        if added.len() > self.instances.len() / 4 {
            // Many new entries: built whole (packed), the two sorted runs merged.
            let mut old = std::mem::take(&mut self.instances).into_iter().peekable();
            let mut all = Vec::with_capacity(old.len() + added.len());
            for (id, slot) in added {
                all.extend(std::iter::from_fn(|| old.next_if(|(o, _)| *o < id)));
                all.push((id, slot));
            }
            all.extend(old);
            self.instances = all.into_iter().collect();
            self.instances_packing = Packing::built(self.instances.len());
        } else {
            self.instances.extend(added);
        }
        for (before, now, id) in moved {
            if let Some(m) = before {
                self.untag(&m, &id);
            }
            if let Some(m) = now {
                self.machine_slot(&m).ours().tagged.add(id);
            }
        }
        self.pack();
        self.loaded_once = true;
        self.fresh = true;
    }

    /// Takes an instance from under the machine it was tagged for (the machine's entry goes if
    /// nothing else is left in it).
    fn untag(&mut self, machine: &MachineId, id: &InstanceId) {
        if let Some(slot) = self.machines.get_mut(machine) {
            if let Some(ours) = &mut slot.ours {
                ours.tagged.remove(id);
            }
            slot.tidy();
            if slot.is_empty() {
                self.machines.remove(machine);
            }
        }
    }

    /// Sets every machine's tagged instances to those of a listing (in instance-id order,
    /// without repeats).
    fn retag(&mut self, listing: &[CloudInstance]) {
        let machine_of = |i: u32| listing[i as usize].tags.machine.as_ref().expect("tagged");
        let mut tags: Vec<(u64, u32)> = listing
            .iter()
            .enumerate()
            .filter_map(|(i, inst)| Some((inst.tags.machine.as_ref()?.sort_key(), i as u32)))
            .collect();
        tags.sort_unstable();
        // Equal keys: long ids that share their first seven bytes (or one machine's instances,
        // already in instance-id order): ordered by the whole id.
        let mut start = 0;
        while start < tags.len() {
            let end = start + tags[start..].iter().take_while(|t| t.0 == tags[start].0).count();
            if end - start > 1 {
                tags[start..end].sort_by(|a, b| machine_of(a.1).cmp(machine_of(b.1)).then(a.1.cmp(&b.1)));
            }
            start = end;
        }
        // One pass over both, in machine order.
        let mut next = tags.iter().map(|t| t.1).peekable();
        let mut unknown: Vec<(MachineId, Tagged)> = Vec::new();
        let mut emptied = false;
        for (id, slot) in self.machines.iter_mut() {
            while let Some(i) = next.next_if(|i| machine_of(*i) < id) {
                let m = machine_of(i);
                let mut group = vec![listing[i as usize].id.clone()];
                while let Some(j) = next.next_if(|j| machine_of(*j) == m) {
                    group.push(listing[j as usize].id.clone());
                }
                unknown.push((m.clone(), Tagged::of(group.into_iter())));
            }
            let mut group = std::iter::from_fn(|| next.next_if(|i| machine_of(*i) == id))
                .map(|i| listing[i as usize].id.clone())
                .peekable();
            match group.peek() {
                None => {
                    if let Some(ours) = &mut slot.ours {
                        ours.tagged = Tagged::None;
                    }
                    slot.tidy();
                }
                Some(_) => slot.ours().tagged = Tagged::of(group),
            }
            emptied |= slot.is_empty();
        }
        while let Some(i) = next.next() {
            let m = machine_of(i);
            let mut group = vec![listing[i as usize].id.clone()];
            while let Some(j) = next.next_if(|j| machine_of(*j) == m) {
                group.push(listing[j as usize].id.clone());
            }
            unknown.push((m.clone(), Tagged::of(group.into_iter())));
        }
        if emptied {
            self.machines.retain(|_, slot| !slot.is_empty());
        }
        for (m, tagged) in unknown {
            self.machine_slot(&m).ours().tagged = tagged;
        }
        self.pack();
    }

    /// A listing failed: nothing is harvested until one succeeds.
    pub fn mark_stale(&mut self) {
        self.fresh = false;
    }

    /// The last listing issued failed: the view goes stale (nothing judged on it, nothing
    /// harvested, no adoption decided before a listing succeeds). With the mutation
    /// `judge-incomplete-listing`, what came before the failure (nothing) is taken for the
    /// whole cloud instead.
    pub fn listing_failed(&mut self) {
        if self.mutations.judge_incomplete_listing {
            self.load_listing(Vec::new(), self.listings_issued);
        } else {
            self.mark_stale();
        }
    }

    /// The provisioner decided to stop these instances (tagged for `machine`, when known):
    /// they are never adopted, and their machine is not started again before the stop is done.
    pub fn stops_planned(&mut self, ids: &[InstanceId], machine: Option<&MachineId>) {
        for id in ids {
            let tagged = machine
                .cloned()
                .or_else(|| self.stopping.get(id).cloned().flatten())
                .or_else(|| self.view(id).and_then(|i| i.tags.machine.clone()));
            if let Some(m) = &tagged {
                self.stopping_for.insert(m.clone(), id.clone());
            }
            self.stopping.insert(id.clone(), tagged);
        }
    }

    /// Whether an instance tagged for this machine is still recorded by a dead machine (a reuse
    /// handover a crash interrupted): it goes with the dead machine, and this one is started
    /// only once it is gone (never two live instances for one machine).
    fn held_by_dead_in(&self, machine: &MachineId, slot: &MachineSlot) -> bool {
        slot.tagged().iter().any(|i| {
            self.owner(i).filter(|o| *o != machine).and_then(|o| self.machine(o)).is_some_and(|o| o.life == Life::Dead)
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
    #[cfg(test)]
    pub fn orphans_of(&self, machine: &MachineId, keeps: Option<&InstanceId>) -> Vec<InstanceId> {
        self.machines.get(machine).map(|slot| self.orphans_in(slot, keeps)).unwrap_or_default()
    }

    fn orphans_in(&self, slot: &MachineSlot, keeps: Option<&InstanceId>) -> Vec<InstanceId> {
        let Some(m) = &slot.machine else { return Vec::new() };
        if m.life != Life::Alive || m.manual || !self.fresh {
            return Vec::new();
        }
        let failed = m.status == MachineStatus::Error || m.instance_status.is_error();
        let keeps = m.instance.as_ref().or(keeps);
        if keeps.is_none() && !failed {
            return Vec::new();
        }
        slot.tagged()
            .iter()
            .filter(|i| {
                Some(*i) != keeps
                    && self.owner(i).is_none()
                    && !self.stopping.contains_key(*i)
                    && !self.replaces_recorded(m, i)
            })
            .cloned()
            .collect()
    }

    /// Whether `i` is a live machine's hand-over replacement of its recorded instance, as listed
    /// ([`crate::model::InstanceTags::replaces`]): never an orphan nor an extra, but a hand-over
    /// to resume ([`MachineBook::resumable_handovers`]).
    fn replaces_recorded(&self, m: &Machine, i: &InstanceId) -> bool {
        let Some(recorded) = &m.instance else { return false };
        // A machine in provisioning error: its replacement's start failed (maybe a predecessor's,
        // whose stop of the replacement it could not record may still be under way): an orphan.
        m.life == Life::Alive
            && !m.instance_status.is_error()
            && self
                .view(i)
                .is_some_and(|v| v.tags.replaces() == Some(recorded.as_str()) && v.state != InstanceState::Terminated)
    }

    /// Instances tagged for a dead machine in provisioning error that records none: orphans of a
    /// start whose record failed, whose stop was decided (maybe by a predecessor that crashed
    /// before seeing it through, having left the machine dead until then). They are stopped
    /// whatever the mode, as for a live machine, retried until it succeeds; they stay in the dead
    /// machine's view too, so that its removal waits for their stop.
    #[cfg(test)]
    pub fn dead_orphans_of(&self, machine: &MachineId) -> Vec<InstanceId> {
        self.machines.get(machine).map(|slot| self.dead_orphans_in(slot)).unwrap_or_default()
    }

    fn dead_orphans_in(&self, slot: &MachineSlot) -> Vec<InstanceId> {
        let Some(m) = &slot.machine else { return Vec::new() };
        let failed = m.status == MachineStatus::Error || m.instance_status.is_error();
        if m.life != Life::Dead || m.manual || !self.fresh || m.instance.is_some() || !failed {
            return Vec::new();
        }
        slot.tagged().iter().filter(|i| self.owner(i).is_none() && !self.stopping.contains_key(*i)).cloned().collect()
    }

    /// Extra instances of live machines, judged on a fresh listing (issue 32): an instance of
    /// ours tagged for a live, non-manual machine that records another instance, owned by no
    /// machine (recorded by none, so neither a reuse hand-over nor a parked instance, which its
    /// dead machine still records), whose stop is not decided already, in a view listed after
    /// the machine got its recorded instance. A start whose call went unanswered (a frozen zone)
    /// made it after the machine got its instance elsewhere: left alone, it would run for the
    /// machine for ever. The recorded instance is never one, whatever its state (stopped
    /// outside our control, or missing). Empty while the view is stale. The caller still
    /// leaves out machines with a start in flight (the lifecycle's business) and instances
    /// released or parked (the harvest policy's), then stops the rest whatever the mode.
    pub fn extra_instances(&self) -> Vec<(MachineId, InstanceId)> {
        let mut out = Vec::new();
        if !self.fresh {
            return out;
        }
        for (id, slot) in &self.machines {
            let Some(ours) = slot.ours.as_deref() else { continue };
            if matches!(ours.tagged, Tagged::None) {
                continue;
            }
            let Some(m) = &slot.machine else { continue };
            let Some(recorded) = &m.instance else { continue };
            if m.life != Life::Alive || m.manual || ours.recorded_after >= self.view_listing {
                continue;
            }
            let extra = |i: &&InstanceId| {
                *i != recorded
                    && ours.recorded.as_ref() != Some(*i)
                    && self.owner(i).is_none()
                    && !self.stopping.contains_key(*i)
                    && self.view(i).is_some()
                    && !self.replaces_recorded(m, i)
            };
            out.extend(ours.tagged.iter().filter(extra).map(|i| (id.clone(), i.clone())));
        }
        out
    }

    /// Hand-overs a listing shows under way (issue 33): a live machine's free instance whose
    /// start replaced the machine's recorded instance ([`crate::model::InstanceTags::replaces`])
    /// — a replacement a provisioner started before it crashed or lost the lead. Each comes as
    /// what a notice about the recorded (interrupted) instance would find, the replacement
    /// adoptable: the coordinator resumes the hand-over with it, never starting another. Such
    /// an instance is never an extra ([`MachineBook::extra_instances`]). Empty while the view is
    /// stale.
    pub fn resumable_handovers(&self) -> Vec<crate::actors::coordinator::handover::NoticedInstance> {
        let mut out = Vec::new();
        if !self.fresh {
            return out;
        }
        for slot in self.machines.values() {
            let (Some(ours), Some(m)) = (slot.ours.as_deref(), &slot.machine) else { continue };
            let Some(recorded) = &m.instance else { continue };
            if m.life != Life::Alive || m.manual {
                continue;
            }
            let replaces_recorded = |i: &InstanceId| {
                self.replaces_recorded(m, i) && self.owner(i).is_none() && !self.stopping.contains_key(i)
            };
            if ours.tagged.iter().any(replaces_recorded) {
                out.extend(self.noticed(recorded));
            }
        }
        out
    }

    /// The machines a fresh listing shows unhealthy-to-be (issue 34): each live, cloud-backed
    /// machine whose recorded instance is listed stopped, with what a repair's hand-over needs
    /// and how long it has been seen stopped; and the model's population (its live machines
    /// with an instance), which the repair cap is a share of. Empty while the view is stale.
    pub fn stopped_machines(&mut self) -> (Vec<crate::actors::coordinator::repair::StoppedMachine>, usize) {
        if !self.fresh {
            return (Vec::new(), 0);
        }
        let mut population = 0;
        let mut still = BTreeMap::new();
        for m in self.machines.values().filter_map(|s| s.machine.as_ref()) {
            let Some(inst) = &m.instance else { continue };
            if m.life != Life::Alive || m.manual {
                continue;
            }
            population += 1;
            if self.view(inst).is_some_and(|v| v.state == InstanceState::Stopped) {
                let since = match self.stopped_since.get(&m.id) {
                    Some((i, t)) if i == inst => *t,
                    _ => self.clock,
                };
                still.insert(m.id.clone(), (inst.clone(), since));
            }
        }
        self.stopped_since = still;
        let clock = self.clock;
        let out = self
            .stopped_since
            .iter()
            .filter_map(|(m, (inst, since))| {
                let owner = self.noticed(inst).filter(|o| o.machine == *m)?;
                Some(crate::actors::coordinator::repair::StoppedMachine {
                    owner,
                    stopped_for: clock.saturating_sub(*since),
                    reason: "stopped",
                })
            })
            .collect();
        (out, population)
    }

    /// The live, cloud-backed machines whose recorded instance the view lists (not
    /// terminated), in id order; empty while the view is stale.
    pub fn listed_machines(&self) -> Vec<MachineId> {
        if !self.fresh {
            return Vec::new();
        }
        self.machines
            .values()
            .filter_map(|s| s.machine.as_ref())
            .filter(|m| m.life == Life::Alive && !m.manual)
            .filter(|m| {
                m.instance.as_ref().and_then(|i| self.view(i)).is_some_and(|v| v.state != InstanceState::Terminated)
            })
            .map(|m| m.id.clone())
            .collect()
    }

    /// Which of these machines' recorded instances (as the view lists them) have drifted from
    /// what a start with this provisioning info would make (`model::drift`, judged on the
    /// shipped catalogue of types), in the order given; empty while the view is stale.
    pub fn drifted(
        &self,
        infos: &[(MachineId, crate::model::ProvisioningInfo)],
    ) -> Vec<crate::actors::coordinator::repair::DriftedMachine> {
        use crate::model::drift::{drift_of, Expected};
        if !self.fresh {
            return Vec::new();
        }
        let catalogue = crate::model::instance_types::shipped();
        let mut out = Vec::new();
        for (id, info) in infos {
            let Some(m) = self.machine(id).filter(|m| m.life == Life::Alive && !m.manual) else { continue };
            let Some(inst) = &m.instance else { continue };
            let Some(view) = self.view(inst).filter(|v| v.state != InstanceState::Terminated) else { continue };
            let expected = Expected {
                machine: id,
                constraints: &info.constraints,
                placement: info.placement.as_deref(),
                catalogue: &catalogue,
                image: self.current_image.as_deref(),
            };
            let reasons = drift_of(&expected, view);
            if reasons.is_empty() {
                continue;
            }
            if let Some(owner) = self.noticed(inst).filter(|o| o.machine == *id) {
                out.push(crate::actors::coordinator::repair::DriftedMachine { owner, reasons });
            }
        }
        out
    }

    /// What an interruption notice about `id` concerns (issue 33): the machine that owns it (by
    /// record, else by its tag), whether it is that machine's recorded instance, whether the
    /// machine is alive, and the instance's zone and type from the view. `None`: no machine we
    /// cache owns it.
    pub fn noticed(&self, id: &InstanceId) -> Option<crate::actors::coordinator::handover::NoticedInstance> {
        let view = self.view(id);
        let machine = self.owner(id).cloned().or_else(|| view.and_then(|v| v.tags.machine.clone()))?;
        let m = self.machine(&machine)?;
        Some(crate::actors::coordinator::handover::NoticedInstance {
            recorded: m.instance.as_ref() == Some(id),
            alive: m.life == Life::Alive,
            zone: view.and_then(|v| v.zone.clone()),
            instance_type: view.and_then(|v| v.instance_type.clone()),
            state: view.map(|v| v.state),
            record: Box::new(m.clone()),
            adoptable: self.machines.get(&machine).filter(|_| !m.instance_status.is_error()).and_then(|slot| {
                let free = slot.tagged().iter().filter_map(|i| {
                    let free = i != id
                        && self.owner(i).is_none_or(|o| *o == machine)
                        && !self.stopping.contains_key(i)
                        && m.instance.as_ref() != Some(i);
                    free.then(|| self.view(i).filter(|v| v.state != InstanceState::Terminated)).flatten()
                });
                // The one started to replace `id`, if listed, before any other.
                let mut free: Vec<&CloudInstance> = free.collect();
                free.sort_by_key(|v| v.tags.replaces() != Some(id.as_str()));
                free.first().map(|v| Box::new((*v).clone()))
            }),
            leftover: self.leftover(m, id),
            replaces_recorded: self.replaces_recorded(m, id),
            machine,
        })
    }

    /// Another instance of ours tagged for the machine whose recorded instance is `id`, still
    /// listed (not terminated), owned by no machine, and not a replacement of `id` (that one is
    /// adopted by a hand-over): the interrupted instance of a switch whose stop a crash lost,
    /// or an orphan or extra whose stop is decided or due. A hand-over of `id` waits for it to
    /// go (never a third live instance).
    fn leftover(&self, m: &Machine, id: &InstanceId) -> Option<InstanceId> {
        if m.instance.as_ref() != Some(id) || self.mutations.handover_ignores_leftovers {
            return None;
        }
        let slot = self.machines.get(&m.id)?;
        slot.tagged()
            .iter()
            .find(|i| {
                *i != id
                    && self.owner(i).is_none()
                    && self
                        .view(i)
                        .is_some_and(|v| v.state != InstanceState::Terminated && v.tags.replaces() != Some(id.as_str()))
            })
            .cloned()
    }

    /// Instances that were terminated (by us).
    pub fn instances_gone(&mut self, ids: &[InstanceId]) {
        for id in ids {
            self.stopped_at.insert(id.clone(), self.listings_issued);
            if let Some(Some(m)) = self.stopping.remove(id) {
                self.stopping_for.remove(&m, id);
            }
            let Some(slot) = self.instances.get_mut(id) else { continue };
            let view = slot.view.take();
            if slot.is_empty() {
                self.instances.remove(id);
            }
            if let Some(m) = view.and_then(|inst| inst.tags.machine) {
                self.untag(&m, id);
            }
        }
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
            .filter(|s| s.owner.is_none())
            .filter_map(|s| s.view.as_deref())
            .filter(|i| self.scope.judges(i.tags.machine.as_ref()))
            // An instance tagged for a machine we still know is that machine's business (a
            // dead one's harvest takes its strays, a deferred stop takes a start in flight, a
            // live one's extras are stopped as such, see `extra_instances`): only once the
            // machine is gone is the instance unknown.
            .filter(|i| i.tags.machine.as_ref().is_none_or(|m| self.machine(m).is_none()))
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
        self.adoptable_in(machine, self.machines.get(machine)?)
    }

    fn adoptable_in(&self, machine: &MachineId, slot: &MachineSlot) -> Option<CloudInstance> {
        slot.tagged().iter().find_map(|id| {
            let stopping = self.stopping.contains_key(id) && !self.mutations.adopt_while_stopping;
            let free = self.owner(id).is_none_or(|o| o == machine) && !stopping;
            free.then(|| self.view(id).cloned()).flatten()
        })
    }

    /// Live machines whose instance changed state outside our control since we last said (instances
    /// stopped outside our control): a stopped or suspended instance shows as `stopped`, one that
    /// came back as `running`, one gone from a fresh listing as `missing`. The cache takes the new
    /// status; the caller writes it to the model. Manual machines are not in the cloud and are
    /// skipped.
    pub fn status_changes(&mut self) -> Vec<(MachineId, InstanceStatus, String)> {
        let mut out = Vec::new();
        for slot in self.machines.values_mut() {
            // A listing issued before the machine got its instance cannot show it.
            let listed_after = slot.ours.as_ref().is_none_or(|o| o.recorded_after < self.view_listing);
            let Some(m) = slot.machine.as_mut() else { continue };
            if m.life == Life::Dead || m.manual {
                continue;
            }
            let Some(inst) = &m.instance else { continue };
            let (status, message) = match self.instances.get(inst).and_then(|s| s.view.as_deref()) {
                Some(i) if i.state == InstanceState::Stopped => (
                    InstanceStatus::other("stopped"),
                    format!("instance {inst} is stopped or suspended outside the provisioner's control"),
                ),
                Some(i) => (InstanceStatus::from_static(i.state.as_str()), String::new()),
                None if self.fresh && listed_after => {
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

    /// The model is being destroyed, its machines as the destruction read them: each in scope
    /// (controllers aside) is cached as read; answers the non-manual ones with their instances,
    /// to stop, and the manual ones that block a destruction without `force`.
    pub fn destroy_targets(&mut self, machines: Vec<Machine>) -> DestroyTargets {
        let mut out = DestroyTargets::default();
        let scope = self.scope().clone();
        for m in machines.into_iter().filter(|m| scope.contains(&m.id) && !m.controller) {
            let id = m.id.clone();
            let manual = m.manual;
            let blocks = blocks_destroy(&m, &scope);
            self.upsert(m);
            if manual {
                if blocks {
                    out.manual.push(id);
                }
            } else if let Some(d) = self.dead_machine(&id) {
                out.machines.push(d);
            }
        }
        out
    }

    /// What a dying model still runs, to sweep: every cached machine (manual ones and
    /// controllers aside) as a dead machine, with only the instances the view still shows (no
    /// stop for an instance already gone).
    pub fn sweep_targets(&self) -> Vec<DeadMachine> {
        let ids: Vec<MachineId> =
            self.machines().filter(|m| !m.manual && !m.controller).map(|m| m.id.clone()).collect();
        ids.iter()
            .filter_map(|id| self.dead_machine(id))
            .map(|mut d| {
                d.instance = d.instance.take().filter(|i| self.instance(i).is_some());
                d
            })
            .collect()
    }

    /// The dead-machine view of a cached machine, with stray instances tagged for it.
    pub fn dead_machine(&self, id: &MachineId) -> Option<DeadMachine> {
        self.dead_machine_in(id, self.machines.get(id)?)
    }

    fn dead_machine_in(&self, id: &MachineId, slot: &MachineSlot) -> Option<DeadMachine> {
        let m = slot.machine.as_ref()?;
        let mut dead = DeadMachine::of(m);
        if !m.manual {
            dead.tagged = slot
                .tagged()
                .iter()
                .filter(|i| self.owner(i).is_none_or(|o| o == id) && Some(*i) != m.instance.as_ref())
                .cloned()
                .collect();
            // Those whose stop is decided and not seen through, even if no listing shows them yet
            // (an orphan whose record failed): the machine is removed only after that stop.
            for inst in self.stopping_for.get(id) {
                if Some(inst) != m.instance.as_ref() && !dead.tagged.contains(inst) {
                    dead.tagged.push(inst.clone());
                }
            }
            // Clean enough to reuse: started by us with known constraints, running, no error,
            // not on spot (only on-demand machines take parked instances over).
            dead.reusable =
                m.instance.as_ref().and_then(|inst| {
                    let view = self.view(inst).filter(|i| {
                        i.state == InstanceState::Running && i.capacity_type != Some(crate::model::CapacityType::Spot)
                    })?;
                    let constraints = slot.started_with()?;
                    (m.status != MachineStatus::Error && !m.instance_status.is_error()).then(|| {
                        crate::model::Reusable { instance: inst.clone(), zone: view.zone.clone(), constraints }
                    })
                });
        }
        Some(dead)
    }

    /// The zone of a live machine's instance, if the view knows it.
    #[cfg(test)]
    pub fn placement(&self, id: &MachineId) -> Option<String> {
        self.placement_in(self.machines.get(id)?)
    }

    fn placement_in(&self, slot: &MachineSlot) -> Option<String> {
        let m = slot.machine.as_ref().filter(|m| m.life != Life::Dead)?;
        self.view(m.instance.as_ref()?)?.zone.clone()
    }

    /// The view's record of an instance.
    pub fn instance(&self, id: &InstanceId) -> Option<&CloudInstance> {
        self.view(id)
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
