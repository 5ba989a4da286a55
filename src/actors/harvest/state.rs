//! The harvest policy's plain core.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::model::DeadMachine;
use crate::model::{HarvestMode, InstanceId, MachineId, Reusable};

/// What to do with dead machines and unknown instances.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HarvestPlan {
    /// Instances to terminate, in one call: dead machines' first, then unknown ones (as Juju's
    /// `TestHarvestAllReapsAllTheThings`).
    pub stop: Vec<InstanceId>,
    /// Dead machines to mark for removal once `stop` succeeded.
    pub remove_after_stop: Vec<MachineId>,
    /// Dead machines to mark for removal now (nothing of theirs to stop).
    pub remove_now: Vec<MachineId>,
    /// Instances left alone on purpose: strip our identity so they are never harvested.
    pub release: Vec<InstanceId>,
    /// Dead machines to mark for removal once `release` succeeded (so that a crash in between
    /// leaves them dead, to be released again, rather than their instances unknown).
    pub remove_after_release: Vec<MachineId>,
    /// Dead machines whose clean instance is parked for reuse (removed once it is handed over
    /// or, after the reuse window, stopped).
    pub park: Vec<(MachineId, Reusable)>,
    /// Stop at once, without waiting for a free worker (model destruction).
    pub eager: bool,
    /// Plan the unknown instances again after this long: some were spared (younger than the
    /// grace period) or held back by the cap on stops per pass.
    pub recheck_in: Option<Duration>,
    /// Unknown instances this plan spared: younger than the grace period.
    pub spared_by_grace: usize,
    /// Unknown instances this plan held back: the cap on stops per pass was reached.
    pub held_back_by_cap: usize,
}

impl HarvestPlan {
    /// Whether the plan does nothing.
    pub fn is_empty(&self) -> bool {
        self.stop.is_empty()
            && self.remove_after_stop.is_empty()
            && self.remove_now.is_empty()
            && self.release.is_empty()
            && self.remove_after_release.is_empty()
            && self.park.is_empty()
    }
}

/// The result of a mode change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeChange {
    /// Same mode: nothing happens, no event.
    Unchanged,
    /// In safe mode: applied after the first full notification.
    Deferred,
    /// Applied; `harvest_unknown` says whether unknown instances are to be harvested now.
    Changed {
        /// The new mode.
        mode: HarvestMode,
        /// The new mode harvests unknown instances: harvest them at once, not only when some
        /// machine dies.
        harvest_unknown: bool,
    },
}

/// An instance of ours that no live machine owns, and how long ago it was launched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownInstance {
    /// Its id.
    pub id: InstanceId,
    /// Its age (see [`CloudInstance::age`](crate::model::CloudInstance::age)).
    pub age: Duration,
}

impl UnknownInstance {
    /// An instance launched `age` ago.
    #[cfg(test)]
    pub fn new(id: impl Into<InstanceId>, age: Duration) -> Self {
        Self { id: id.into(), age }
    }
}

/// How carefully unknown instances are harvested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HarvestSafety {
    /// An unknown instance younger than this is spared (it may be a start of ours, or of
    /// another incarnation, whose record is not written yet).
    pub grace: Duration,
    /// Most unknown instances stopped in one pass.
    pub max_stops: usize,
    /// How long the rest waits for the next pass when the cap is hit.
    pub pass_interval: Duration,
}

impl Default for HarvestSafety {
    fn default() -> Self {
        Self {
            grace: crate::config::DEFAULT_HARVEST_GRACE,
            max_stops: crate::config::DEFAULT_HARVEST_MAX_STOPS,
            pass_interval: crate::config::DEFAULT_RESYNC_INTERVAL,
        }
    }
}

/// Harvest mode, safe mode and released instances.
#[derive(Debug, Clone)]
pub struct HarvestBook {
    mode: HarvestMode,
    safe: bool,
    deferred: Option<HarvestMode>,
    released: BTreeSet<InstanceId>,
    stopping: BTreeSet<InstanceId>,
    reuse: bool,
    parked: BTreeMap<InstanceId, (MachineId, Reusable)>,
    safety: HarvestSafety,
    /// The book's clock (set by its actor before each decision).
    clock: Duration,
    /// After a pass that hit the cap, no unknown instance is stopped before this time.
    next_pass: Option<Duration>,
    /// The model was destroyed: dead machines' instances are stopped whatever the mode.
    destroyed: bool,
    /// Questions for unknown instances sent to the registry and not yet answered.
    asks: usize,
    /// Instances whose stop was seen through while a question was out: an answer read before
    /// the registry heard of it may still list them, and they must not be stopped twice.
    gone_meanwhile: BTreeSet<InstanceId>,
    /// Dead machines planned while stops of their instances were already in flight (the
    /// destruction's, an orphan's), with the stops they wait for: marked for removal only once
    /// every one is seen through ([`HarvestBook::stops_done`]). Removed earlier, a crash that lost
    /// the stop would leave a running instance tagged for a machine no longer in the model:
    /// unknown, never stopped in modes `none` and `destroyed` (the destruction wins over releases,
    /// invariant 5).
    awaiting: BTreeMap<MachineId, BTreeSet<InstanceId>>,
    /// Stops decided outside a harvest for an instance tagged for a machine (an orphan whose
    /// record failed), by machine, until seen through: a dead-machine plan made on a view read
    /// before that stop was decided still waits for it (found by the model checker, issue 35:
    /// a machine that died while its failing start finished was marked for removal at once, and
    /// a crash that lost the orphan's stop left the orphan running, unknown).
    stopping_for: BTreeMap<MachineId, BTreeSet<InstanceId>>,
    /// Instances released by the mode (not keep-instance) at the book's current instant. A
    /// destruction at that same instant wins over them (starts that land at the
    /// instant of `destroy_model` are stopped): a container provisioner hears of a destruction
    /// only after the environ provisioner applied it, and may have released a landing instance
    /// meanwhile.
    released_now: BTreeSet<InstanceId>,
    /// The instant `released_now` is about.
    released_now_at: Duration,
}

impl HarvestBook {
    /// A book in safe mode with this initial mode.
    pub fn new(mode: HarvestMode) -> Self {
        Self {
            mode,
            safe: true,
            deferred: None,
            released: BTreeSet::new(),
            stopping: BTreeSet::new(),
            reuse: false,
            parked: BTreeMap::new(),
            safety: HarvestSafety::default(),
            clock: Duration::ZERO,
            next_pass: None,
            destroyed: false,
            asks: 0,
            gone_meanwhile: BTreeSet::new(),
            awaiting: BTreeMap::new(),
            stopping_for: BTreeMap::new(),
            released_now: BTreeSet::new(),
            released_now_at: Duration::ZERO,
        }
    }

    /// The time the next decisions are taken at (the actor's clock).
    pub fn set_clock(&mut self, now: Duration) {
        self.clock = self.clock.max(now);
    }

    /// Records a release the mode decided (a destruction at this same instant wins over it).
    fn released_by_mode(&mut self, inst: &InstanceId) {
        if self.released_now_at != self.clock {
            self.released_now.clear();
            self.released_now_at = self.clock;
        }
        self.released_now.insert(inst.clone());
    }

    /// The same book with this grace period and cap.
    pub fn with_safety(mut self, safety: HarvestSafety) -> Self {
        self.safety = safety;
        self
    }

    /// The same book with machine reuse on (a dead machine's clean instance parked for reuse).
    pub fn with_reuse(mut self, reuse: bool) -> Self {
        self.reuse = reuse;
        self
    }

    /// Instances parked for reuse, in id order.
    pub fn parked(&self) -> impl Iterator<Item = &InstanceId> {
        self.parked.keys()
    }

    /// A new machine with these constraints and derived zones takes a parked instance, if one
    /// fits (same constraints, a zone it may use). The dead machine it came from is returned
    /// for removal.
    pub fn claim(
        &mut self,
        constraints: &crate::model::Constraints,
        derived: &[String],
    ) -> Option<(MachineId, Reusable)> {
        let id = self.parked.iter().find(|(_, (_, r))| r.fits(constraints, derived)).map(|(id, _)| id.clone())?;
        self.parked.remove(&id)
    }

    /// The reuse window of a parked instance ran out: stop it (or release it, if the mode no
    /// longer stops dead machines' instances), then remove its dead machine. Nothing if it was
    /// claimed meanwhile.
    pub fn expire(&mut self, instance: &InstanceId) -> HarvestPlan {
        let mut plan = HarvestPlan::default();
        let Some((machine, _)) = self.parked.remove(instance) else { return plan };
        if self.destroyed || self.mode.harvests_destroyed() {
            self.stopping.insert(instance.clone());
            plan.stop.push(instance.clone());
            plan.remove_after_stop.push(machine);
        } else {
            self.released.insert(instance.clone());
            self.released_by_mode(instance);
            plan.release.push(instance.clone());
            plan.remove_after_release.push(machine);
        }
        plan
    }

    /// The mode in force.
    pub fn mode(&self) -> HarvestMode {
        self.mode
    }

    /// Whether unknown instances are harvested now.
    pub fn wants_unknown(&self) -> bool {
        !self.safe && self.mode.harvests_unknown()
    }

    /// Requests a mode change (the same mode is a no-op).
    pub fn set_mode(&mut self, mode: HarvestMode) -> ModeChange {
        if self.safe {
            self.deferred = Some(mode);
            return ModeChange::Deferred;
        }
        if mode == self.mode {
            return ModeChange::Unchanged;
        }
        self.mode = mode;
        ModeChange::Changed { mode, harvest_unknown: mode.harvests_unknown() }
    }

    /// The first full notification was processed: leave safe mode, apply a deferred change.
    pub fn end_safe_mode(&mut self) -> ModeChange {
        if !self.safe {
            return ModeChange::Unchanged;
        }
        self.safe = false;
        match self.deferred.take() {
            Some(mode) => self.set_mode(mode),
            None => ModeChange::Unchanged,
        }
    }

    /// Plans the fate of dead machines (and, given, unknown instances).
    ///
    /// A dead machine's instance is stopped in modes `destroyed`/`all` whatever its state
    /// (running or stopped/suspended); kept (released) with keep-instance or in modes
    /// `none`/`unknown` (released: never stopped later); a manual machine's is never touched. Every
    /// dead machine is removed.
    ///
    /// Unknown instances (ours, no live machine) are stopped only in modes `unknown` and
    /// `all`, only once older than the grace period, and at most `max_stops` per pass; the
    /// plan's `recheck_in` says when to look again at those left.
    pub fn plan(&mut self, dead: &[DeadMachine], unknown: &[UnknownInstance]) -> HarvestPlan {
        let mut plan = HarvestPlan::default();
        for m in dead {
            // An instance whose stop is already decided (an orphan whose record failed, the
            // destruction's) is stopped by that stop, retried until it succeeds: neither released
            // (a decided stop stands) nor stopped again; the machine waits for it.
            let instances: Vec<&InstanceId> =
                m.instances().filter(|i| !self.released.contains(*i) && !self.stopping.contains(*i)).collect();
            let in_flight: BTreeSet<InstanceId> = if m.manual {
                BTreeSet::new()
            } else {
                let decided = self.stopping_for.get(&m.id).into_iter().flatten();
                m.instances()
                    .chain(decided)
                    .filter(|i| !self.released.contains(*i) && self.stopping.contains(*i))
                    .cloned()
                    .collect()
            };
            let waits = !in_flight.is_empty();
            if m.manual || instances.is_empty() {
                if waits {
                    self.awaiting.entry(m.id.clone()).or_default().extend(in_flight);
                } else {
                    plan.remove_now.push(m.id.clone());
                }
            } else if m.keep_instance || !(self.destroyed || self.mode.harvests_destroyed()) {
                for inst in instances {
                    self.released.insert(inst.clone());
                    if !m.keep_instance {
                        self.released_by_mode(inst);
                    }
                    plan.release.push(inst.clone());
                }
                // Removed once the release lands, even with a stop of another of its instances
                // in flight: a machine still dead after a crash would have its released
                // instance (which it still records) decided again, maybe stopped after a switch
                // to a mode that stops them (a release is final). That stop is retried until it
                // succeeds meanwhile.
                plan.remove_after_release.push(m.id.clone());
            } else if let Some(r) = m
                .reusable
                .as_ref()
                .filter(|r| self.reuse && !waits && m.tagged.is_empty() && instances == [&r.instance])
            {
                if !self.parked.contains_key(&r.instance) {
                    self.parked.insert(r.instance.clone(), (m.id.clone(), r.clone()));
                    plan.park.push((m.id.clone(), r.clone()));
                }
            } else if waits {
                // Removed once the stops in flight and this one are all seen through.
                let all = in_flight.into_iter().chain(instances.iter().map(|i| (*i).clone()));
                self.awaiting.entry(m.id.clone()).or_default().extend(all);
                plan.stop.extend(instances.into_iter().cloned());
            } else {
                plan.stop.extend(instances.into_iter().cloned());
                plan.remove_after_stop.push(m.id.clone());
            }
        }
        if self.wants_unknown() {
            let (mut taken, mut held, mut young) = (0usize, 0usize, 0usize);
            let mut recheck: Option<Duration> = None;
            let mut soonest = |d: Duration| recheck = Some(recheck.map_or(d, |r: Duration| r.min(d)));
            // A pass that hit the cap holds unknown stops until the next pass is due, however
            // many harvests are asked for meanwhile.
            let waiting_pass = self.next_pass.filter(|at| *at > self.clock);
            for u in unknown {
                let inst = &u.id;
                if self.released.contains(inst)
                    || self.stopping.contains(inst)
                    || self.parked.contains_key(inst)
                    || plan.stop.contains(inst)
                {
                    continue;
                }
                if u.age < self.safety.grace {
                    young += 1;
                    soonest(self.safety.grace - u.age);
                } else if taken >= self.safety.max_stops || waiting_pass.is_some() {
                    held += 1;
                } else {
                    taken += 1;
                    plan.stop.push(inst.clone());
                }
            }
            if young > 0 {
                tracing::info!(instances = young, grace = ?self.safety.grace, "sparing unknown instances younger than the grace period");
            }
            if let (Some(at), true) = (waiting_pass, held > 0) {
                tracing::info!(waiting = held, next_pass_in = ?(at - self.clock), "unknown instances wait for the next harvest pass");
                soonest(at - self.clock);
            } else if held > 0 {
                self.next_pass = Some(self.clock + self.safety.pass_interval);
                tracing::warn!(
                    stopping = taken,
                    waiting = held,
                    next_pass_in = ?self.safety.pass_interval,
                    "harvest cap reached: stopping {taken} unknown instances in this pass; {held} more wait for the next pass (raise harvest_max_stops, or switch the harvest mode if this is unexpected)"
                );
                soonest(self.safety.pass_interval);
            }
            plan.recheck_in = recheck;
            (plan.spared_by_grace, plan.held_back_by_cap) = (young, held);
        }
        self.stopping.extend(plan.stop.iter().cloned());
        plan
    }

    /// The model is being destroyed: every instance of these machines is stopped, in one call,
    /// whatever the mode; keep-instance ones are released; manual ones are untouched. Nothing is
    /// marked for removal (the machines are not dead).
    ///
    /// From then on the destruction wins over releases: a machine dying later,
    /// or whose start lands later, has its instance stopped whatever the mode. So does one
    /// released by the mode at this very instant (a start that landed, a machine that died, at
    /// the instant of the destruction, decided before this provisioner heard of it): it is
    /// stopped after all.
    pub fn plan_destroy(&mut self, machines: &[DeadMachine]) -> HarvestPlan {
        self.destroyed = true;
        let mut plan = HarvestPlan { eager: true, ..HarvestPlan::default() };
        if self.released_now_at == self.clock {
            for inst in std::mem::take(&mut self.released_now) {
                tracing::info!(instance = %inst, "released at the instant of the destruction: stopping it after all");
                self.released.remove(&inst);
                plan.stop.push(inst);
            }
        }
        for m in machines.iter().filter(|m| !m.manual) {
            for inst in m.instances() {
                if self.released.contains(inst) || self.stopping.contains(inst) || plan.stop.contains(inst) {
                    continue;
                }
                if m.keep_instance {
                    self.released.insert(inst.clone());
                    plan.release.push(inst.clone());
                } else {
                    plan.stop.push(inst.clone());
                }
            }
        }
        self.stopping.extend(plan.stop.iter().cloned());
        plan
    }

    /// Stops the provisioner decided outside a harvest (an orphan whose record failed, a
    /// parked instance a start gave up): one stop of those not already being stopped or
    /// released, then `remove_after` is marked for removal (at once if nothing is left to stop).
    /// Like every stop, it is retried until it succeeds.
    ///
    /// `machine`: the machine the instances are tagged for, when the caller knows it: its
    /// dead-machine plan waits for these stops ([`HarvestBook::plan`]).
    pub fn plan_stops(
        &mut self,
        instances: &[InstanceId],
        remove_after: &[MachineId],
        machine: Option<&MachineId>,
    ) -> HarvestPlan {
        let mut plan = HarvestPlan::default();
        let mut in_flight = BTreeSet::new();
        for inst in instances {
            if self.released.contains(inst) || plan.stop.contains(inst) {
                continue;
            }
            if self.stopping.contains(inst) {
                in_flight.insert(inst.clone());
                continue;
            }
            plan.stop.push(inst.clone());
        }
        self.stopping.extend(plan.stop.iter().cloned());
        if let Some(m) = machine {
            let decided = instances.iter().filter(|i| self.stopping.contains(*i)).cloned();
            self.stopping_for.entry(m.clone()).or_default().extend(decided);
        }
        if !in_flight.is_empty() {
            // A stop already in flight: the machines wait for it as well as for this one.
            in_flight.extend(plan.stop.iter().cloned());
            for m in remove_after {
                self.awaiting.entry(m.clone()).or_default().extend(in_flight.iter().cloned());
            }
        } else if plan.stop.is_empty() {
            plan.remove_now = remove_after.to_vec();
        } else {
            plan.remove_after_stop = remove_after.to_vec();
        }
        plan
    }

    /// The stop of live machines' extra instances (issue 32, see the registry's
    /// `extra_instances`), whatever the mode: they were made by our own starts and the
    /// provisioner knows them to be duplicates (the modes govern instances it does not know).
    /// Left out: instances released (no longer ours), parked for reuse (a dead machine's, to be
    /// handed over), or already being stopped (no stop is planned twice). One stop, retried
    /// until it succeeds; nothing is removed after it.
    pub fn plan_extras(&mut self, extras: &[InstanceId]) -> HarvestPlan {
        let mut plan = HarvestPlan::default();
        for inst in extras {
            let skip = self.released.contains(inst)
                || self.parked.contains_key(inst)
                || self.stopping.contains(inst)
                || plan.stop.contains(inst);
            if !skip {
                plan.stop.push(inst.clone());
            }
        }
        self.stopping.extend(plan.stop.iter().cloned());
        plan
    }

    /// These instances are gone: they may be planned again if they ever reappear (in an answer
    /// asked for after this). Returns the dead machines that waited for these stops and wait
    /// for nothing more: to be marked for removal now.
    pub fn stops_done(&mut self, ids: &[InstanceId]) -> Vec<MachineId> {
        for id in ids {
            self.stopping.remove(id);
            if self.asks > 0 {
                self.gone_meanwhile.insert(id.clone());
            }
        }
        if !self.stopping_for.is_empty() {
            self.stopping_for.retain(|_, decided| {
                decided.retain(|i| !ids.contains(i));
                !decided.is_empty()
            });
        }
        let mut done = Vec::new();
        self.awaiting.retain(|m, waits| {
            for id in ids {
                waits.remove(id);
            }
            // An instance no longer being stopped (its stop done by an earlier call) waits
            // for nothing either.
            waits.retain(|i| self.stopping.contains(i));
            if waits.is_empty() {
                done.push(m.clone());
            }
            !waits.is_empty()
        });
        done
    }

    /// Dead machines waiting for stops in flight before they are marked for removal.
    #[cfg(test)]
    pub fn awaiting_removal(&self) -> impl Iterator<Item = &MachineId> {
        self.awaiting.keys()
    }

    /// The registry is asked for unknown instances (see [`HarvestBook::ask_answered`]).
    pub fn ask_sent(&mut self) {
        self.asks += 1;
    }

    /// The registry's answer to a question: instances whose stop was seen through since it
    /// was sent are dropped (the answer may predate the registry hearing of it).
    pub fn ask_answered(&mut self, unknown: Vec<UnknownInstance>) -> Vec<UnknownInstance> {
        let unknown = unknown.into_iter().filter(|u| !self.gone_meanwhile.contains(&u.id)).collect();
        self.asks = self.asks.saturating_sub(1);
        if self.asks == 0 {
            self.gone_meanwhile.clear();
        }
        unknown
    }

    /// Instances whose stop is planned and not yet done (never planned twice as unknown).
    #[cfg(test)]
    pub fn stopping(&self) -> impl Iterator<Item = &InstanceId> {
        self.stopping.iter()
    }
}
