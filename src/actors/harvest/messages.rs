//! Messages the harvest policy handles.

use actix::Message;

use super::state::{HarvestPlan, ModeChange};
use crate::model::DeadMachine;
use crate::model::HarvestMode;

/// Plan the fate of these dead machines (and of unknown instances, if the mode says so).
#[derive(Debug, Clone, Message)]
#[rtype(result = "HarvestPlan")]
pub struct PlanDeadMachines {
    /// The dead machines.
    pub dead: Vec<DeadMachine>,
}

/// Plan the harvest of unknown instances alone (after a mode change or a resync).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "HarvestPlan")]
pub struct PlanUnknown {
    /// Judge on a cloud listing at most this old (`None`: the view as it is, e.g. just after a
    /// resync; `Some(ZERO)`: list now, e.g. on a mode switch).
    pub fresher_than: Option<std::time::Duration>,
}

/// Change the harvest mode.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "ModeChange")]
pub struct SetHarvestMode(pub HarvestMode);

/// The first full notification was processed.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "ModeChange")]
pub struct EndSafeMode;

/// The mode in force.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "HarvestMode")]
pub struct GetHarvestMode;

/// A new machine looks for a parked instance to take over (machine reuse).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Option<(crate::model::MachineId, crate::model::Reusable)>")]
pub struct ClaimReusable {
    /// The new machine's constraints.
    pub constraints: crate::model::Constraints,
    /// Its derived zones.
    pub derived: Vec<String>,
}

/// A parked instance's reuse window ran out.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ParkExpired(pub crate::model::InstanceId);

/// These instances were terminated. Answers the dead machines that waited for these stops
/// (planned while they were in flight) and are to be marked for removal now.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<crate::model::MachineId>")]
pub struct StopsDone {
    /// The instances.
    pub instances: Vec<crate::model::InstanceId>,
}

/// Plan the stop of everything these machines run (the model is being destroyed).
#[derive(Debug, Clone, Message)]
#[rtype(result = "HarvestPlan")]
pub struct PlanDestroy {
    /// The machines.
    pub machines: Vec<DeadMachine>,
}

/// Plan the stop of live machines' extra instances, whatever the mode (issue 32; see
/// `HarvestBook::plan_extras`).
#[derive(Debug, Clone, Message)]
#[rtype(result = "HarvestPlan")]
pub struct PlanExtras {
    /// The instances.
    pub instances: Vec<crate::model::InstanceId>,
}

/// Plan the stop of instances the provisioner gave up outside a harvest (an orphan whose record
/// failed, a parked instance a start could not take over), then the removal of these machines.
#[derive(Debug, Clone, Message)]
#[rtype(result = "HarvestPlan")]
pub struct PlanStops {
    /// The instances.
    pub instances: Vec<crate::model::InstanceId>,
    /// Dead machines to mark for removal once they are stopped.
    pub remove_after: Vec<crate::model::MachineId>,
    /// The machine the instances are tagged for, when known: its dead-machine plan waits for
    /// these stops.
    pub machine: Option<crate::model::MachineId>,
}
