//! The supervisor's plain core: the listening → initialising → running state machine.

use std::collections::BTreeSet;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::actors::containers::InitialiseError;
use crate::config::Backoff;
use crate::model::MachineId;

/// Failed host initialisations before its containers are given a provisioning error.
pub const DEFAULT_MAX_INIT_FAILURES: u32 = 6;

/// Where a supervisor is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for the first container of its type on a provisioned host.
    Listening,
    /// Making the host ready (attempt number, from 0).
    Initialising {
        /// Failed attempts so far.
        failures: u32,
    },
    /// A container provisioner runs.
    Running,
    /// The host could not be made ready: its containers of this type are in error.
    Failed {
        /// The last initialisation error.
        message: String,
    },
    /// The host died or the model is dying: nothing new starts; a provisioner (started without
    /// initialising the host, if none ran) reaps the containers.
    Stopped,
}

/// What the actor must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Call the initialiser.
    Initialise,
    /// Call it again after this delay, and show this on the containers' status.
    RetryInitialise {
        /// The delay.
        after: Duration,
        /// The status message for the waiting containers.
        message: String,
    },
    /// Start the container provisioner in this zone, telling it of these containers.
    StartProvisioner {
        /// The host's zone.
        zone: Option<String>,
        /// Every container seen so far.
        containers: Vec<MachineId>,
        /// Only to reap (the host is dead or the model dying): starts closed from the outset.
        reap: bool,
    },
    /// Tell the running provisioner of these changed containers.
    Forward(Vec<MachineId>),
    /// Stop starting containers; keep reaping dead ones.
    CloseStarts,
    /// The model was destroyed: the running provisioner stops every container's instance.
    Destroyed,
    /// Initialisation failed for good: these containers get a provisioning error.
    GiveUp {
        /// The containers.
        containers: Vec<MachineId>,
        /// Why.
        message: String,
    },
}

/// The supervisor's state.
#[derive(Debug, Clone)]
pub struct SupervisorBook {
    stage: Stage,
    host_zone: Option<Option<String>>,
    containers: BTreeSet<MachineId>,
    backoff: Backoff,
    rng: StdRng,
    max_failures: u32,
    running: bool,
    host_dead: bool,
    model_dying: bool,
    /// Bumped by every container change (a reaper is retired only if none came meanwhile).
    generation: u64,
}

impl SupervisorBook {
    /// A listening supervisor; `host_zone` is `Some` once the host is provisioned.
    pub fn new(backoff: Backoff, host_zone: Option<Option<String>>) -> Self {
        Self {
            stage: Stage::Listening,
            host_zone,
            containers: BTreeSet::new(),
            backoff,
            rng: StdRng::seed_from_u64(0),
            max_failures: DEFAULT_MAX_INIT_FAILURES,
            running: false,
            host_dead: false,
            model_dying: false,
            generation: 0,
        }
    }

    /// The same book for a host already dead: it only ever reaps.
    pub fn for_dead_host(mut self) -> Self {
        self.stage = Stage::Stopped;
        self.host_dead = true;
        self
    }

    /// The same book drawing its backoff jitter from this seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.rng = StdRng::seed_from_u64(seed);
        self
    }

    /// Gives up after this many failed initialisations.
    #[cfg(test)]
    pub fn with_max_failures(mut self, n: u32) -> Self {
        self.max_failures = n.max(1);
        self
    }

    /// Its stage.
    pub fn stage(&self) -> &Stage {
        &self.stage
    }

    /// Containers seen so far.
    pub fn containers(&self) -> impl Iterator<Item = &MachineId> {
        self.containers.iter()
    }

    fn maybe_initialise(&mut self) -> Vec<Effect> {
        if self.stage == Stage::Listening
            && !self.containers.is_empty()
            && self.host_zone.is_some()
            && !self.host_dead
            && !self.model_dying
        {
            self.stage = Stage::Initialising { failures: 0 };
            vec![Effect::Initialise]
        } else {
            Vec::new()
        }
    }

    /// Containers of this type on this host changed (the first ones wake the supervisor).
    pub fn containers_changed(&mut self, ids: Vec<MachineId>) -> Vec<Effect> {
        let new: Vec<MachineId> = ids.iter().filter(|i| !self.containers.contains(*i)).cloned().collect();
        self.containers.extend(ids.iter().cloned());
        self.generation += 1;
        match &self.stage {
            Stage::Listening => self.maybe_initialise(),
            Stage::Running => vec![Effect::Forward(ids)],
            // A dead host's provisioner still reaps its dead containers.
            Stage::Stopped if self.running => vec![Effect::Forward(ids)],
            // A reaper, started when there is something to reap.
            Stage::Stopped => self.start_reaper(),
            Stage::Failed { message } if !new.is_empty() => {
                vec![Effect::GiveUp { containers: new, message: message.clone() }]
            }
            Stage::Initialising { .. } | Stage::Failed { .. } => Vec::new(),
        }
    }

    /// A provisioner that only reaps, needing no initialised host (nothing starts), for every
    /// container seen so far: if none runs and there is something to reap.
    fn start_reaper(&mut self) -> Vec<Effect> {
        if self.running || self.containers.is_empty() {
            return Vec::new();
        }
        self.running = true;
        vec![Effect::StartProvisioner {
            zone: self.host_zone.clone().flatten(),
            containers: self.containers.iter().cloned().collect(),
            reap: true,
        }]
    }

    /// The host got its instance (in this zone).
    pub fn host_provisioned(&mut self, zone: Option<String>) -> Vec<Effect> {
        if self.host_zone.is_none() {
            self.host_zone = Some(zone);
        }
        self.maybe_initialise()
    }

    /// The initialiser answered.
    pub fn initialised(&mut self, result: Result<(), InitialiseError>) -> Vec<Effect> {
        let Stage::Initialising { failures } = self.stage else { return Vec::new() };
        match result {
            Ok(()) => {
                self.stage = Stage::Running;
                self.running = true;
                vec![Effect::StartProvisioner {
                    zone: self.host_zone.clone().flatten(),
                    containers: self.containers.iter().cloned().collect(),
                    reap: false,
                }]
            }
            Err(e) if failures + 1 >= self.max_failures => {
                let message = e.message().to_owned();
                self.stage = Stage::Failed { message: message.clone() };
                vec![Effect::GiveUp { containers: self.containers.iter().cloned().collect(), message }]
            }
            Err(e) => {
                let after = self.backoff.delay(failures, &mut self.rng);
                self.stage = Stage::Initialising { failures: failures + 1 };
                vec![Effect::RetryInitialise { after, message: e.message().to_owned() }]
            }
        }
    }

    /// The retry delay ran out.
    pub fn retry_due(&self) -> Vec<Effect> {
        match self.stage {
            Stage::Initialising { .. } => vec![Effect::Initialise],
            _ => Vec::new(),
        }
    }

    /// The host died: nothing new starts; a running provisioner goes on reaping, and one is
    /// started (without initialising the host) if none runs and containers are known: a host
    /// takes its containers with it, across restarts too.
    pub fn host_died(&mut self) -> Vec<Effect> {
        self.host_dead = true;
        self.stop_starting(Effect::CloseStarts)
    }

    /// The model was destroyed: nothing new starts; the running provisioner stops every container's
    /// instance, and one is started to do so if none runs (the destruction wins over releases).
    pub fn model_destroyed(&mut self) -> Vec<Effect> {
        if self.model_dying {
            return Vec::new();
        }
        self.model_dying = true;
        self.stop_starting(Effect::Destroyed)
    }

    /// Nothing new starts: the running provisioner is told `told`, and one is started to reap
    /// if none runs.
    fn stop_starting(&mut self, told: Effect) -> Vec<Effect> {
        self.stage = Stage::Stopped;
        if self.running {
            vec![told]
        } else {
            self.start_reaper()
        }
    }

    /// The reaper of a dead host has nothing left (every container it knew is removed) and was
    /// shut down, unless a container changed since `generation` (then it goes on).
    pub fn reaper_done(&mut self, generation: u64) -> bool {
        if generation != self.generation || !self.running || !self.host_dead {
            return false;
        }
        self.running = false;
        true
    }

    /// The container-change count (see [`SupervisorBook::reaper_done`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a container provisioner runs.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Whether the host is dead.
    pub fn host_dead(&self) -> bool {
        self.host_dead
    }

    /// Whether the model is dying.
    pub fn model_dying(&self) -> bool {
        self.model_dying
    }
}
