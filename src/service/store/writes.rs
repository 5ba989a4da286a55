//! Write-behind units of work: the provisioner's and the simulated cloud's hot writes (a
//! machine's status, its instance status, a start's record, a start's instance and its
//! landing) and an
//! operator's add of machines (durable, not fenced), given to the
//! store as *data* ([`Write`]) instead of a closure, so that a backend may queue their
//! statements in its group commit without waiting for each answer (PostgreSQL sends them all
//! with the group's `COMMIT`: one round trip for the group instead of one per write), and run
//! them again one at a time if one of them fails. Their callers need only the outcome, and the
//! answer waits for the group's commit anyway (acknowledged still means committed).
//!
//! A backend that does not queue them (SQLite: its statements cost microseconds) runs each as
//! any unit of work, by [`Write::apply`] (in `backend.rs`, so that this file imports no trait):
//! the same store calls the closures made before. No actix here.

use super::records::{InstanceRecord, NewMachine};
use crate::model::{InstanceId, InstanceStatus, InstanceTags, MachineId, MachineStatus};
use crate::ports::ProvisionedInstance;

/// One write-behind unit of work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Write {
    /// A machine status ([`StoreBackend::set_status`](super::StoreBackend::set_status)).
    MachineStatus {
        /// The machine.
        id: MachineId,
        /// Its new status.
        status: MachineStatus,
        /// The status message.
        message: String,
    },
    /// An instance status ([`StoreBackend::set_instance_status`](super::StoreBackend::set_instance_status)), and with `failed_attempt`
    /// one failed start attempt counted with that error ([`StoreBackend::record_start_outcome`](super::StoreBackend::record_start_outcome))
    /// in the same unit.
    InstanceStatus {
        /// The machine.
        id: MachineId,
        /// Its new instance status.
        status: InstanceStatus,
        /// The status message.
        message: String,
        /// The failed attempt's error, if the status reports one.
        failed_attempt: Option<String>,
    },
    /// A start's record ([`StoreBackend::record_started_instance`](super::StoreBackend::record_started_instance)).
    StartedInstance {
        /// The machine.
        id: MachineId,
        /// What the start made.
        info: ProvisionedInstance,
    },
    /// The simulated cloud's instance for a start: created running when the start has no
    /// latency to wait ([`StoreBackend::create_running_instance`](super::StoreBackend::create_running_instance)),
    /// else pending ([`StoreBackend::create_instance`](super::StoreBackend::create_instance)),
    /// to be landed later ([`Write::LandInstance`]).
    NewInstance {
        /// The start's client token (the key: a repeat gets the instance it made, as it is).
        client_token: String,
        /// The zone asked for.
        zone: Option<String>,
        /// Its tags.
        tags: InstanceTags,
        /// Created running (`true`) or pending.
        running: bool,
    },
    /// The simulated cloud's pending instance comes up ([`StoreBackend::land_instance`](super::StoreBackend::land_instance)).
    LandInstance {
        /// The instance.
        id: InstanceId,
    },
    /// An operator's add of machines ([`StoreBackend::add_new_machines`](super::StoreBackend::add_new_machines)): acknowledged only
    /// once on disk, and not the provisioner's (never fenced).
    AddMachines {
        /// How many.
        count: usize,
        /// What they are.
        spec: NewMachine,
    },
}

/// What a [`Write`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Written {
    /// The machine write was made.
    Done,
    /// The instance, and whether this write made it (`false`: the token's, as it was).
    Instance(InstanceRecord, bool),
    /// The machines added, in order.
    Added(Vec<MachineId>),
    /// The instance landed, as it is now (`None`: there is no such instance).
    Landed(Option<InstanceRecord>),
}

impl Write {
    /// Whether it is the provisioner's (checked against the leader's fence) rather than an
    /// operator's.
    pub(crate) fn fenced(&self) -> bool {
        !matches!(self, Write::AddMachines { .. })
    }

    /// Whether its commit must be on disk before its answer (an operator's), or only in the
    /// operating system's hands (the provisioner's: see [`super::Store::exec_lazy`]).
    pub(crate) fn durable(&self) -> bool {
        matches!(self, Write::AddMachines { .. })
    }

    /// What it writes, in a word (its span's `write`).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Write::MachineStatus { .. } => "machine status",
            Write::InstanceStatus { .. } => "instance status",
            Write::StartedInstance { .. } => "instance record",
            Write::NewInstance { .. } => "cloud instance",
            Write::LandInstance { .. } => "cloud instance landing",
            Write::AddMachines { .. } => "machines added",
        }
    }
}
