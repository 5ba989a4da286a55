//! The container manager actor: stands in for the machine agents. It watches the model,
//! creates a supervisor for every supported container type on every live host, tells it when
//! its host is provisioned or dies, and routes container changes to it.

mod actor;
mod messages;
mod state;
#[cfg(test)]
mod tests;

pub use actor::ContainerManager;
pub use messages::{ContainersModelDestroyed, GetSupervisors, SetContainersHarvestMode};
