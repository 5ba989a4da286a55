//! Messages the machine registry handles.

use actix::Message;
use thiserror::Error;

use crate::ports::{BrokerError, ModelError};
use crate::types::{CloudInstance, InstanceId, Machine, MachineId};

/// Why the registry could not answer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RegistryError {
    /// The cloud listing failed; nothing was classified.
    #[error("listing instances: {0}")]
    Listing(BrokerError),
    /// The batched machines call failed; nothing was classified.
    #[error("getting machines {ids:?}: {source}")]
    Machines {
        /// The ids asked for.
        ids: Vec<MachineId>,
        /// The model's error.
        source: ModelError,
    },
    /// The last listing failed, so unknown instances cannot be told apart.
    #[error("instance view is stale: the last cloud listing failed")]
    ViewStale,
}

/// A dead machine, with what harvesting needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadMachine {
    /// The machine.
    pub id: MachineId,
    /// Its instance, if provisioned.
    pub instance: Option<InstanceId>,
    /// Leave the instance alone.
    pub keep_instance: bool,
    /// Manually provisioned: never stopped.
    pub manual: bool,
    /// Other live instances tagged for it that nobody owns (a start whose result was lost):
    /// they share the machine's fate.
    pub tagged: Vec<InstanceId>,
    /// Its instance, if it is clean enough to be reused (known constraints, running, the
    /// machine not in error).
    pub reusable: Option<crate::types::Reusable>,
}

impl DeadMachine {
    /// The dead-machine view of a cached machine (no stray tagged instances).
    pub fn of(m: &Machine) -> Self {
        Self {
            id: m.id.clone(),
            instance: m.instance.clone(),
            keep_instance: m.keep_instance,
            manual: m.manual,
            tagged: Vec::new(),
            reusable: None,
        }
    }

    /// Every instance of the machine: the recorded one, then the stray tagged ones.
    pub fn instances(&self) -> impl Iterator<Item = &InstanceId> {
        self.instance.iter().chain(self.tagged.iter().filter(move |t| Some(*t) != self.instance.as_ref()))
    }
}

/// Re-read these machines from the model (loading the instance view first if it never loaded)
/// and classify them.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Refreshed, RegistryError>")]
pub struct Refresh {
    /// The ids that changed.
    pub ids: Vec<MachineId>,
}

/// The classified batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refreshed {
    /// Machines to start.
    pub pending: Vec<Machine>,
    /// Dead machines (including dying unprovisioned ones taken to dead).
    pub dead: Vec<DeadMachine>,
    /// Ids whose read or EnsureDead failed: try them again later.
    pub retry_later: Vec<MachineId>,
    /// Ids no longer in the model.
    pub gone: Vec<MachineId>,
    /// Provisioned machines of the batch and the zones of their instances (for the allocator).
    pub placements: Vec<(MachineId, String)>,
    /// Pending machines with an instance already tagged for them (a start whose result was
    /// lost): they adopt it instead of starting another.
    pub adopt: Vec<(MachineId, CloudInstance)>,
    /// Live machines in provisioning error and the unrecorded instances tagged for them (a
    /// start whose record failed): stop them.
    pub orphans: Vec<(MachineId, InstanceId)>,
}

/// Our start produced this instance for this machine.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct RecordInstance {
    /// The machine.
    pub machine: MachineId,
    /// The instance.
    pub instance: CloudInstance,
    /// The constraints it was started with (unknown for adopted instances).
    pub constraints: Option<crate::types::Constraints>,
}

/// These instances were terminated by us.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct InstancesGone {
    /// The instances.
    pub ids: Vec<InstanceId>,
}

/// Mark these dead machines for removal in the model (retried with backoff) and forget them.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ForgetMachines {
    /// The machines.
    pub ids: Vec<MachineId>,
}

/// Unknown instances: ours, owned by no live machine. With `fresher_than`, a view older than
/// that is re-listed first (harvesting decides on recent knowledge, yet the cloud is listed at
/// most once per that age, not once per event).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<Vec<(InstanceId, std::time::Duration)>, RegistryError>")]
pub struct UnknownInstances {
    /// The oldest acceptable view.
    pub fresher_than: Option<std::time::Duration>,
}

/// An instance tagged for this machine that it may adopt instead of starting another.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Option<CloudInstance>")]
pub struct Adoptable {
    /// The machine.
    pub machine: MachineId,
}

/// The view's state of an instance (`None`: not in the view, i.e. terminated or unknown),
/// from a listing at most `fresher_than` old.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Option<crate::types::InstanceState>")]
pub struct InstanceStateOf {
    /// The instance.
    pub id: InstanceId,
    /// The oldest acceptable view.
    pub fresher_than: std::time::Duration,
}

/// Published by the registry after a successful periodic listing.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct ViewRefreshed;

/// A copy of the registry's state, for status pages and tests.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "RegistrySnapshot")]
pub struct GetRegistrySnapshot;

/// The registry's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrySnapshot {
    /// Cached machines, in id order.
    pub machines: Vec<Machine>,
    /// The instance view, in id order.
    pub instances: Vec<CloudInstance>,
    /// Whether the last listing succeeded.
    pub fresh: bool,
}

/// The model is being destroyed and had these machines: cache them, and answer what to stop.
#[derive(Debug, Clone, Message)]
#[rtype(result = "DestroyTargets")]
pub struct PrepareDestroy {
    /// Every machine of the model at the moment it became dying.
    pub machines: Vec<Machine>,
}

/// The cached non-manual, non-controller machines of a dying model, with their instances still
/// in the cloud (tagged strays included), those without one too (they may be starting): what
/// its destruction must have stopped.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<DeadMachine>")]
pub struct SweepTargets;

/// What the destruction concerns, within this provisioner's scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestroyTargets {
    /// Non-manual, non-controller machines, with their instances.
    pub machines: Vec<DeadMachine>,
    /// Manual, non-controller machines that are not dead.
    pub manual: Vec<MachineId>,
}

/// The provisioner decided to stop these instances: never adopt them, and start no machine
/// they are tagged for before the stop is done.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct StopsPlanned {
    /// The instances.
    pub ids: Vec<InstanceId>,
    /// The machine they are tagged for, when the sender knows it.
    pub machine: Option<MachineId>,
}
