//! The container supervisor actor: one per host and container type, with the state machine
//! listening → initialising → running (→ stopped when the host dies).

mod actor;
mod messages;
mod state;
#[cfg(test)]
mod tests;

pub use actor::{ContainerSupervisor, SupervisorDeps};
pub use messages::{ContainersChanged, GetSupervisorState, HostDied, HostProvisioned, ModelDying, SetSupervisorMode};
pub use state::Stage;
