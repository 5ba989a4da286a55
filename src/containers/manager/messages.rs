//! Messages the container manager handles (besides `MachinesChanged`, `ProvisionerEvent`,
//! `Busy` and `Shutdown`).

use actix::prelude::*;

use crate::containers::supervisor::ContainerSupervisor;
use crate::types::MachineId;

/// Every supervisor, by host and type.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<(MachineId, String, Addr<ContainerSupervisor>)>")]
pub struct GetSupervisors;
