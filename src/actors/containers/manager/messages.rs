//! Messages the container manager handles (besides `MachinesChanged`, `ProvisionerEvent`,
//! `Busy` and `Shutdown`).

use actix::prelude::*;

use crate::actors::containers::supervisor::ContainerSupervisor;
use crate::model::MachineId;

/// Every supervisor, by host and type.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<(MachineId, String, Addr<ContainerSupervisor>)>")]
pub struct GetSupervisors;

/// The harvest mode changed (model config): every container provisioner uses it from now on.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct SetContainersHarvestMode(pub crate::model::HarvestMode);

/// The model was destroyed: every container provisioner stops its containers' instances.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct ContainersModelDestroyed;
