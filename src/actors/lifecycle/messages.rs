//! Messages the lifecycle handles.

use actix::Message;

use super::state::{AfterStart, Deaths, Phase};
use crate::model::DeadMachine;
use crate::model::{InstanceId, MachineId};

/// Machines classified pending: answers those to start now.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<MachineId>")]
pub struct ObservePending {
    /// The machines.
    pub ids: Vec<MachineId>,
}

/// Machines seen dead: answers which to harvest now and which are deferred.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Deaths")]
pub struct ObserveDead {
    /// The machines.
    pub dead: Vec<DeadMachine>,
}

/// Starts returned (those whose outcomes reached the coordinator together): answers what
/// follows each, in the same order.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<AfterStart>")]
pub struct StartsFinished {
    /// Each machine, with the instance its start produced, if any.
    pub starts: Vec<(MachineId, Option<InstanceId>)>,
}

/// Whether a start in flight should go on retrying.
#[derive(Debug, Clone, Message)]
#[rtype(result = "bool")]
pub struct StillWanted {
    /// The machine.
    pub machine: MachineId,
}

/// Extra instances of live machines (issue 32): answers those whose machine has no start in
/// flight and is not being stopped, less any start's product (`LifecycleBook::without_start`).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<(MachineId, InstanceId)>")]
pub struct WithoutStart {
    /// The instances, each with its machine.
    pub extras: Vec<(MachineId, InstanceId)>,
}

/// These machines were removed.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ForgetLifecycle {
    /// The machines.
    pub ids: Vec<MachineId>,
}

/// Every machine's phase, in id order.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<(MachineId, Phase)>")]
pub struct GetPhases;

/// The model is being destroyed: these are its non-manual, non-controller machines.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Deaths")]
pub struct ObserveDestroy {
    /// The machines, with their instances.
    pub machines: Vec<DeadMachine>,
}

/// A spot hand-over (issue 33) starts a replacement for this provisioned machine: it is starting
/// again (its recorded instance stays until the switch). Answers whether it may: not while the
/// model is destroyed, nor while the machine is starting, stopping or deferred.
#[derive(Debug, Clone, Message)]
#[rtype(result = "bool")]
pub struct BeginReplacement {
    /// The machine.
    pub machine: MachineId,
}
