//! The model API port.

use futures::future::BoxFuture;
use thiserror::Error;

use crate::model::{InstanceId, InstanceStatus, Life, Machine, MachineId, MachineStatus, ProvisioningInfo};

/// A boxed model call.
pub type ModelFuture<T> = BoxFuture<'static, Result<T, ModelError>>;

/// How a model call failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ModelError {
    /// The machine does not exist (any more).
    #[error("machine {0} not found")]
    NotFound(MachineId),
    /// The provisioner may not see this machine.
    #[error("permission denied for machine {0}")]
    Unauthorized(MachineId),
    /// The model is dying and refuses the change.
    #[error("model is dying")]
    ModelDying,
    /// The provisioner no longer leads the model (its lease moved to another replica, or
    /// expired): its write was refused and nothing was written. The next leader takes over;
    /// nothing is to be undone for it (an instance it made is the next leader's to adopt).
    #[error("fenced: {0}")]
    Fenced(String),
    /// Anything else, with the model's message.
    #[error("{0}")]
    Other(String),
}

/// What the provisioner records for a machine once its instance exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionedInstance {
    /// The instance.
    pub instance: InstanceId,
    /// The zone it landed in.
    pub zone: Option<String>,
    /// The nonce of the start that made it.
    pub nonce: String,
    /// The cloud's display name.
    pub display_name: String,
    /// The instance status to record with it (the instance's state, e.g. `running`), clearing
    /// any "provisioning"/retry message.
    pub status: InstanceStatus,
    /// The capacity the instance runs on, when the cloud says (issue 33): recorded with the
    /// machine, so that `machine show` tells what it got.
    pub capacity_type: Option<crate::model::CapacityType>,
}

/// The model of machines the provisioner keeps the cloud in line with.
///
/// Batched calls return one result per requested id, in request order.
pub trait ModelApi: Send + Sync + 'static {
    /// The machines with these ids.
    fn machines(&self, ids: Vec<MachineId>) -> ModelFuture<Vec<Result<Machine, ModelError>>>;
    /// Machines whose provisioning error was marked transient (`retry-provisioning`).
    fn machines_with_transient_errors(&self) -> ModelFuture<Vec<Machine>>;
    /// Provisioning info for these machines.
    fn provisioning_info(&self, ids: Vec<MachineId>) -> ModelFuture<Vec<Result<ProvisioningInfo, ModelError>>>;
    /// The other members of each machine's distribution group.
    fn distribution_groups(&self, ids: Vec<MachineId>) -> ModelFuture<Vec<Result<Vec<MachineId>, ModelError>>>;
    /// Records the instance a machine was provisioned with, and its instance status (one call,
    /// so that a provisioned machine never shows a stale retry message).
    fn set_instance_info(&self, id: MachineId, info: ProvisionedInstance) -> ModelFuture<()>;
    /// Writes the machine (agent) status.
    fn set_status(&self, id: MachineId, status: MachineStatus, message: String) -> ModelFuture<()>;
    /// Writes the instance status.
    fn set_instance_status(&self, id: MachineId, status: InstanceStatus, message: String) -> ModelFuture<()>;
    /// Takes a dying, unprovisioned machine to dead.
    fn ensure_dead(&self, id: MachineId) -> ModelFuture<()>;
    /// Marks a dead machine for removal (its instance is gone or released).
    fn mark_for_removal(&self, id: MachineId) -> ModelFuture<()>;
    /// The availability zone of a provisioned machine's instance (containers take their
    /// host's).
    fn availability_zone(&self, _id: MachineId) -> ModelFuture<Option<String>> {
        Box::pin(async { Ok(None) })
    }
    /// The model's own life: a dying model gets no new instances.
    fn model_life(&self) -> ModelFuture<Life> {
        Box::pin(async { Ok(Life::Alive) })
    }
    /// Makes the model dying (it refuses new machines from then on) and returns every machine
    /// it has at that moment, atomically. [`ModelError::ModelDying`] if it already is.
    fn destroy_model(&self) -> ModelFuture<Vec<Machine>> {
        Box::pin(async { Err(ModelError::Other("this model cannot be destroyed".into())) })
    }
}
