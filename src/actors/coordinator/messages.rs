//! Messages the coordinator handles: the provisioner's public inputs, and what the other
//! actors report to it (a job's outcome, a fresh cloud view, a plan to execute).

use actix::prelude::*;

use super::state::{DestroyError, DestroySummary};
use crate::actors::harvest::HarvestPlan;
use crate::actors::workers::JobOutcome;
use crate::config::ConfigError;
use crate::model::{HarvestMode, MachineId};

/// Machines changed in the model (the machine watcher's event). The first one must carry every
/// machine: until it is processed nothing unknown is harvested.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct MachinesChanged {
    /// The ids that changed (all of them, the first time).
    pub ids: Vec<MachineId>,
}

impl MachinesChanged {
    /// A notification for these ids.
    pub fn new<I: Into<MachineId>>(ids: impl IntoIterator<Item = I>) -> Self {
        Self { ids: ids.into_iter().map(Into::into).collect() }
    }
}

/// Machines were marked for a retry (`retry-provisioning`): re-read machines with transient
/// errors and start them again.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct RetryTick;

/// The harvest mode changed in the model config.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct ChangeHarvestMode(pub HarvestMode);

/// The worker count changed in the model config.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<(), ResizeError>")]
pub struct SetWorkers(pub usize);

/// Why a pool resize ([`SetWorkers`]) was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    /// The size is out of range.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// The worker pool has stopped (the provisioner is shutting down).
    #[error("the worker pool has stopped")]
    Stopped(#[source] MailboxError),
}

/// Start nothing any more; keep stopping and removing (a container provisioner whose host
/// died keeps reaping its containers).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct CloseStarts;

/// The model was destroyed by someone else (a container provisioner hears of the environ
/// provisioner's `destroy_model`): start nothing more and stop every instance in scope,
/// whatever the harvest mode, including those of starts still in flight as they land
/// (from then on the destruction wins over releases). Idempotent.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct ModelDestroyed;

pub use crate::actors::messages::Subscribe;

/// Destroy the model: it becomes dying and refuses new machines; every instance of
/// a non-manual, non-controller machine is stopped in one call, starts in flight are stopped
/// as they land; then, unless `force`, manual machines that remain are an error.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<DestroySummary, DestroyError>")]
pub struct DestroyModel {
    /// Skip the manual-machine check.
    pub force: bool,
}

/// Sent to the coordinator when jobs end: the outcomes of every job the pool saw end in one
/// turn of its context, in the order they ended (one message, not one per job).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct JobsDone(pub Vec<JobOutcome>);

/// Published by the registry after a successful periodic listing, with the extra instances of
/// live machines it found on it (`MachineBook::extra_instances`), each with its machine: the
/// coordinator has them stopped.
#[derive(Debug, Clone, Default, Message)]
#[rtype(result = "()")]
pub struct ViewRefreshed {
    /// Extra instances of live machines, with their machines.
    pub extras: Vec<(crate::model::MachineId, crate::model::InstanceId)>,
    /// Hand-overs the listing shows under way (`MachineBook::resumable_handovers`).
    pub resumes: Vec<super::handover::NoticedInstance>,
    /// Live machines whose recorded instance it shows stopped (`MachineBook::stopped_machines`).
    pub stopped: Vec<super::repair::StoppedMachine>,
    /// The model's live machines with an instance (the repair cap is a share of them).
    pub population: usize,
}

/// The model's repair policy changed (issue 34): applied from the next listing.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct SetRepairPolicy(pub crate::config::repair::RepairPolicy);

/// The machines the last listing showed unhealthy, and whether repairs are held back.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Health")]
pub struct GetHealth;

/// The answer to [`GetHealth`].
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
pub struct Health {
    /// The unhealthy machines, in id order.
    pub unhealthy: Vec<super::repair::Unhealthy>,
    /// Whether more are unhealthy than the cap allows (every repair held back).
    pub held: bool,
    /// The machines in a repair now.
    pub repairing: Vec<crate::model::MachineId>,
    /// The repair policy in force.
    pub policy: crate::config::repair::RepairPolicy,
}

/// A plan the harvest policy made on its own (a parked instance's window ran out), for the
/// coordinator to execute.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ExecutePlan(pub HarvestPlan);

/// Sent by the interruption poller (issue 33): notices it has not handed on before, in the
/// order the cloud answered them.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct InterruptionsNoticed(pub Vec<crate::ports::InterruptionNotice>);
