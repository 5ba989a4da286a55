//! Messages the container supervisor handles.

use actix::Message;

use super::state::Stage;
use crate::model::MachineId;

/// Containers of this supervisor's host and type changed.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ContainersChanged(pub Vec<MachineId>);

/// The host got its instance, in this zone.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct HostProvisioned(pub Option<String>);

/// The host died.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct HostDied;

/// The supervisor's stage.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Stage")]
pub struct GetSupervisorState;

/// The harvest mode changed (model config): the running provisioner and any later one use it.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct SetSupervisorMode(pub crate::model::HarvestMode);

/// The model was destroyed: stop every container's instance, start nothing more.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct ModelDying;
