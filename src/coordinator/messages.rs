//! Messages the coordinator handles: the provisioner's public inputs.

use actix::prelude::*;

use crate::config::ConfigError;
use crate::events::ProvisionerEvent;
use crate::types::{HarvestMode, MachineId};

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
#[rtype(result = "Result<(), ConfigError>")]
pub struct SetWorkers(pub usize);

/// Hear every [`ProvisionerEvent`].
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Subscribe(pub Recipient<ProvisionerEvent>);
