//! The lifecycle's plain core: one small state machine per machine.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use crate::model::DeadMachine;
use crate::model::{repack, InstanceId, MachineId, Packing};

/// Where a machine is in its life with the provisioner. Machines with no phase are idle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// A start is queued or in flight.
    Starting,
    /// The machine died while starting: stop what the start produces when it returns. Boxed:
    /// rare, and a dead machine is ten times the size of the other phases, which every one of
    /// a fleet's machines carries.
    StopDeferred(Box<DeadMachine>),
    /// The model is being destroyed while the machine starts: stop what the start produces.
    DestroyDeferred(Box<DeadMachine>),
    /// The start produced this instance.
    Running {
        /// The instance.
        instance: InstanceId,
    },
    /// Its instance is being stopped (or it is being removed).
    Stopping,
}

/// What to do with a dead machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeathDecision {
    /// Stop (harvest) it now.
    StopNow,
    /// It is starting: stop what the start produces when it returns.
    Deferred,
    /// Already being stopped: ignore (de-duplicates stop requests, as Juju's
    /// `TestDedupStopRequests`).
    AlreadyStopping,
}

/// The decisions for a batch of dead machines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deaths {
    /// To harvest now.
    pub stop_now: Vec<DeadMachine>,
    /// Deferred until their start returns.
    pub deferred: Vec<MachineId>,
}

impl Deaths {
    /// What a dying model's sweep stops now: the machines to harvest now that still have an
    /// instance (the others have nothing left to stop).
    pub fn into_sweep(self) -> Vec<DeadMachine> {
        self.stop_now.into_iter().filter(|d| d.instances().next().is_some()).collect()
    }
}

/// What follows a finished start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterStart {
    /// Nothing more.
    Done,
    /// The machine died while starting: harvest it now, with the instance the start produced.
    StopDeferred {
        /// The dead machine, with the instance the start produced (if any).
        dead: DeadMachine,
    },
    /// The model is being destroyed: stop the instance the start produced, whatever the mode.
    DestroyDeferred {
        /// The machine, with the instance the start produced (if any).
        machine: DeadMachine,
    },
    /// The start ended without an instance while the machine was asked to start again (a
    /// retry of a machine in error read while its failing start was finishing): look at the
    /// machine again now, or the retry would be lost.
    Again,
}

/// Every machine's phase.
#[derive(Debug, Clone, Default)]
pub struct LifecycleBook {
    phases: BTreeMap<MachineId, Phase>,
    /// When `phases` is rebuilt packed (it fills in id order).
    packing: Packing,
    /// The model was destroyed: nothing starts any more (a batch read before the destruction
    /// may still ask).
    destroyed: bool,
    /// Machines asked to start while their start was in flight (found by the model checker,
    /// issue 35: a retry of a machine in error read before its failing start had ended was
    /// dropped, and the machine stayed pending for ever): looked at again when that start
    /// ends without an instance.
    wanted_again: BTreeSet<MachineId>,
    /// Code broken on purpose (tests and replays only).
    mutations: crate::config::Mutations,
}

impl LifecycleBook {
    /// No machine in any phase.
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// The same book with `mutations` on (the model checker's tests and replays only).
    pub fn with_mutations(mut self, mutations: crate::config::Mutations) -> Self {
        self.mutations = mutations;
        self
    }

    /// A machine's phase.
    #[cfg(test)]
    pub fn phase(&self, id: &MachineId) -> Option<&Phase> {
        self.phases.get(id)
    }

    /// Every phase, in id order.
    pub fn phases(&self) -> impl Iterator<Item = (&MachineId, &Phase)> {
        self.phases.iter()
    }

    /// A machine was classified pending: start it unless it is already starting, running or
    /// stopping (a machine is never started twice, where Juju may queue a second start), or the
    /// model was destroyed.
    pub fn want_start(&mut self, id: &MachineId) -> bool {
        if self.destroyed {
            return false;
        }
        // One search, not a look-up and then an insert.
        match self.phases.entry(id.clone()) {
            Entry::Occupied(e) => {
                if matches!(e.get(), Phase::Starting) {
                    self.wanted_again.insert(id.clone());
                }
                return false;
            }
            Entry::Vacant(e) => {
                e.insert(Phase::Starting);
            }
        }
        if self.packing.due(self.phases.len()) {
            repack(&mut self.phases);
        }
        true
    }

    /// A machine was seen dead (its stop deferred while its start is in flight).
    pub fn on_death(&mut self, dead: &DeadMachine) -> DeathDecision {
        match self.phases.get(&dead.id) {
            Some(Phase::Starting) => {
                self.phases.insert(dead.id.clone(), Phase::StopDeferred(Box::new(dead.clone())));
                DeathDecision::Deferred
            }
            Some(Phase::StopDeferred(_)) => DeathDecision::Deferred,
            Some(Phase::DestroyDeferred(d)) => {
                // Dead as well: the start's instance is stopped by the destruction; removal follows
                // the ordinary way.
                let d = DeadMachine { keep_instance: dead.keep_instance, ..(**d).clone() };
                self.phases.insert(dead.id.clone(), Phase::StopDeferred(Box::new(d)));
                DeathDecision::Deferred
            }
            Some(Phase::Stopping) => DeathDecision::AlreadyStopping,
            Some(Phase::Running { .. }) | None => {
                self.phases.insert(dead.id.clone(), Phase::Stopping);
                DeathDecision::StopNow
            }
        }
    }

    /// Decides a batch of deaths.
    ///
    /// A machine whose start landed just before its death was read may be dead in a registry
    /// answer read before its instance was recorded: the lifecycle has that instance (`Running`),
    /// and it goes with the machine (stopped or released by the mode), never left unowned to be
    /// harvested later as unknown.
    pub fn on_deaths(&mut self, dead: &[DeadMachine]) -> Deaths {
        let mut out = Deaths::default();
        for d in dead {
            let landed = match self.phases.get(&d.id) {
                Some(Phase::Running { instance }) => Some(instance.clone()),
                _ => None,
            };
            match self.on_death(d) {
                DeathDecision::StopNow => out.stop_now.push(match landed {
                    Some(instance) => d.clone().with_instance(instance),
                    None => d.clone(),
                }),
                DeathDecision::Deferred => out.deferred.push(d.id.clone()),
                DeathDecision::AlreadyStopping => {}
            }
        }
        out
    }

    /// A start returned, with the instance it produced if any (stopped at once if its machine died
    /// meanwhile, where Juju's deferred stop misses that new instance).
    pub fn start_finished(&mut self, id: &MachineId, instance: Option<InstanceId>) -> AfterStart {
        let again = !self.wanted_again.is_empty() && self.wanted_again.remove(id);
        // The common case in place: a plain start that produced an instance is now running.
        if let (Some(phase @ Phase::Starting), Some(inst)) = (self.phases.get_mut(id), instance.as_ref()) {
            *phase = Phase::Running { instance: inst.clone() };
            return AfterStart::Done;
        }
        match self.phases.remove(id) {
            Some(Phase::StopDeferred(dead)) => {
                let mut dead = *dead;
                dead.instance = instance.or(dead.instance);
                self.phases.insert(id.clone(), Phase::Stopping);
                AfterStart::StopDeferred { dead }
            }
            Some(Phase::DestroyDeferred(machine)) => {
                let mut machine = *machine;
                machine.instance = instance.or(machine.instance);
                AfterStart::DestroyDeferred { machine }
            }
            Some(Phase::Starting) => match instance {
                Some(instance) => {
                    self.phases.insert(id.clone(), Phase::Running { instance });
                    AfterStart::Done
                }
                None if again => AfterStart::Again,
                None => AfterStart::Done,
            },
            Some(other) => {
                self.phases.insert(id.clone(), other);
                AfterStart::Done
            }
            None => AfterStart::Done,
        }
    }

    /// The model is being destroyed: machines starting stop what their start produces when it
    /// lands; the others are handed back to be stopped now (and go idle). Machines already
    /// stopping or stop-deferred are left to that.
    pub fn on_destroy(&mut self, machines: &[DeadMachine]) -> Deaths {
        self.destroyed = true;
        let mut out = Deaths::default();
        for m in machines {
            match self.phases.get(&m.id) {
                Some(Phase::Starting) if self.mutations.start_through_destroy => {}
                Some(Phase::Starting) => {
                    self.phases.insert(m.id.clone(), Phase::DestroyDeferred(Box::new(m.clone())));
                    out.deferred.push(m.id.clone());
                }
                Some(Phase::StopDeferred(_) | Phase::DestroyDeferred(_) | Phase::Stopping) => {}
                Some(Phase::Running { instance }) => {
                    // Its start landed at this very instant: the registry may not have recorded
                    // the instance yet, the lifecycle has (it wins over releases).
                    let mut m = m.clone();
                    if m.instance.as_ref() != Some(instance) && !m.tagged.contains(instance) {
                        m.tagged.push(instance.clone());
                    }
                    self.phases.remove(&m.id);
                    out.stop_now.push(m);
                }
                None => {
                    self.phases.remove(&m.id);
                    out.stop_now.push(m.clone());
                }
            }
        }
        out
    }

    /// Of a live machine's extra instances (see the registry's `extra_instances`), those the
    /// provisioner may stop: its machine has no start queued or in flight (idle, or running
    /// since its start returned) and is not being stopped, and the instance is not the one its
    /// start produced. A start's product is never touched.
    pub fn without_start(&self, extras: Vec<(MachineId, InstanceId)>) -> Vec<(MachineId, InstanceId)> {
        extras
            .into_iter()
            .filter(|(m, i)| match self.phases.get(m) {
                None => true,
                Some(Phase::Running { instance }) => instance != i,
                Some(Phase::Starting | Phase::StopDeferred(_) | Phase::DestroyDeferred(_) | Phase::Stopping) => false,
            })
            .collect()
    }

    /// Whether a start in flight should keep retrying (the machine has not died).
    pub fn still_wanted(&self, id: &MachineId) -> bool {
        matches!(self.phases.get(id), Some(Phase::Starting))
    }

    /// A spot hand-over's replacement start (issue 33): a machine running (or not tracked: a
    /// provisioned machine this provisioner did not start) is starting again; `false` for one
    /// starting, stopping or deferred, or in a destroyed model.
    pub fn begin_replacement(&mut self, id: &MachineId) -> bool {
        if self.destroyed {
            return false;
        }
        match self.phases.get_mut(id) {
            Some(phase @ Phase::Running { .. }) => *phase = Phase::Starting,
            Some(_) => return false,
            None => {
                self.phases.insert(id.clone(), Phase::Starting);
            }
        }
        true
    }

    /// The machine was removed: forget it.
    pub fn forget(&mut self, id: &MachineId) {
        self.phases.remove(id);
        self.wanted_again.remove(id);
    }
}
