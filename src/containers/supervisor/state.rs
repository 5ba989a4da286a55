//! The supervisor's plain core: the listening → initialising → running state machine.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::config::Backoff;
use crate::types::MachineId;

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
    /// The host died: nothing runs any more.
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
    },
    /// Tell the running provisioner of these changed containers.
    Forward(Vec<MachineId>),
    /// Stop the container provisioner.
    StopProvisioner,
}

/// The supervisor's state.
#[derive(Debug, Clone)]
pub struct SupervisorBook {
    stage: Stage,
    host_zone: Option<Option<String>>,
    containers: BTreeSet<MachineId>,
    backoff: Backoff,
}

impl SupervisorBook {
    /// A listening supervisor; `host_zone` is `Some` once the host is provisioned.
    pub fn new(backoff: Backoff, host_zone: Option<Option<String>>) -> Self {
        Self { stage: Stage::Listening, host_zone, containers: BTreeSet::new(), backoff }
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
        if self.stage == Stage::Listening && !self.containers.is_empty() && self.host_zone.is_some() {
            self.stage = Stage::Initialising { failures: 0 };
            vec![Effect::Initialise]
        } else {
            Vec::new()
        }
    }

    /// Containers of this type on this host changed (the first ones wake the supervisor).
    pub fn containers_changed(&mut self, ids: Vec<MachineId>) -> Vec<Effect> {
        self.containers.extend(ids.iter().cloned());
        match self.stage {
            Stage::Listening => self.maybe_initialise(),
            Stage::Running => vec![Effect::Forward(ids)],
            Stage::Initialising { .. } | Stage::Stopped => Vec::new(),
        }
    }

    /// The host got its instance (in this zone).
    pub fn host_provisioned(&mut self, zone: Option<String>) -> Vec<Effect> {
        if self.host_zone.is_none() {
            self.host_zone = Some(zone);
        }
        self.maybe_initialise()
    }

    /// The initialiser answered.
    pub fn initialised(&mut self, result: Result<(), String>) -> Vec<Effect> {
        let Stage::Initialising { failures } = self.stage else { return Vec::new() };
        match result {
            Ok(()) => {
                self.stage = Stage::Running;
                vec![Effect::StartProvisioner {
                    zone: self.host_zone.clone().flatten(),
                    containers: self.containers.iter().cloned().collect(),
                }]
            }
            Err(e) => {
                let after = self.backoff.delay(failures);
                self.stage = Stage::Initialising { failures: failures + 1 };
                vec![Effect::RetryInitialise { after, message: e }]
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

    /// The host died: stop.
    pub fn host_died(&mut self) -> Vec<Effect> {
        let was_running = self.stage == Stage::Running;
        self.stage = Stage::Stopped;
        if was_running {
            vec![Effect::StopProvisioner]
        } else {
            Vec::new()
        }
    }
}
