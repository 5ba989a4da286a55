//! Messages the worker pool handles, and the outcome it reports.

use actix::Message;

use super::state::Job;
use crate::config::ConfigError;
use crate::types::{CloudInstance, InstanceId, MachineId};

/// Queue a job.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Enqueue(pub Job);

/// Change the number of concurrent jobs (1..=max).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<(), ConfigError>")]
pub struct ResizePool(pub usize);

/// The pool's load.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "PoolStatus")]
pub struct GetPoolStatus;

/// The pool's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatus {
    /// Concurrency limit.
    pub size: usize,
    /// Jobs running.
    pub in_flight: usize,
    /// Jobs waiting.
    pub queued: usize,
}

/// How a job ended.
// Outcomes are transient (one per job, handled at once): boxing `Started` saves nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// The machine has this instance (new, adopted after a lost result, or reused).
    Started {
        /// The machine.
        machine: MachineId,
        /// Its instance.
        instance: CloudInstance,
        /// The constraints it was started with (`None` when adopted).
        constraints: Option<crate::types::Constraints>,
        /// A dead machine whose parked instance this start took over (or gave up): remove it.
        retired: Option<MachineId>,
        /// Whether the allocator reserved its zone (not for adopted or reused instances).
        reserved: bool,
        /// A parked instance this start tried to take over and gave up: stop it (then remove
        /// `retired`).
        given_up: Option<GivenUp>,
    },
    /// The start failed for good; the machine's status says why.
    StartFailed {
        /// The machine.
        machine: MachineId,
        /// The message written.
        message: String,
        /// A dead machine whose parked instance this start gave up: remove it.
        retired: Option<MachineId>,
        /// The instance it started (or adopted) but could not record: stop it (semantics 18).
        orphan: Option<InstanceId>,
        /// A parked instance this start gave up: stop it (then remove `retired`).
        given_up: Option<GivenUp>,
    },
    /// The machine died before or during its start; nothing was left running.
    StartAbandoned {
        /// The machine.
        machine: MachineId,
        /// A parked instance this start gave up: stop it.
        given_up: Option<GivenUp>,
    },
    /// Instances are terminated.
    Stopped {
        /// The instances.
        instances: Vec<InstanceId>,
        /// Dead machines to remove now.
        machines: Vec<MachineId>,
    },
    /// Instances were released.
    Released {
        /// The instances.
        instances: Vec<InstanceId>,
        /// Dead machines to remove now.
        machines: Vec<MachineId>,
    },
}

/// A parked instance a start tried to take over (machine reuse) and gave up, with the dead
/// machine it came from: the instance is stopped, then the machine removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenUp {
    /// The parked instance.
    pub instance: InstanceId,
    /// Its dead machine.
    pub retired: MachineId,
}

impl JobOutcome {
    /// The same outcome, naming a parked instance the start gave up (if any).
    pub fn with_given_up(mut self, instance: Option<GivenUp>) -> Self {
        if instance.is_some() {
            match &mut self {
                JobOutcome::Started { given_up, .. }
                | JobOutcome::StartFailed { given_up, .. }
                | JobOutcome::StartAbandoned { given_up, .. } => *given_up = instance,
                JobOutcome::Stopped { .. } | JobOutcome::Released { .. } => {}
            }
        }
        self
    }
}

/// Sent to the coordinator when a job ends.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct JobDone(pub JobOutcome);
