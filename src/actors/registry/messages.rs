//! Messages the machine registry handles.

use super::state::{DestroyTargets, Refreshed, RegistryError, RegistrySnapshot};
use crate::model::{CloudInstance, DeadMachine, InstanceId, Machine, MachineId};
use actix::Message;

/// Re-read these machines from the model (loading the instance view first if it never loaded)
/// and classify them.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Refreshed, RegistryError>")]
pub struct Refresh {
    /// The ids that changed.
    pub ids: Vec<MachineId>,
}

/// Our starts produced these instances (those whose outcomes reached the coordinator
/// together), recorded in order.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct RecordInstances(pub Vec<RecordInstance>);

/// One of [`RecordInstances`]: our start produced this instance for this machine.
#[derive(Debug, Clone)]
pub struct RecordInstance {
    /// The machine.
    pub machine: MachineId,
    /// The instance.
    pub instance: CloudInstance,
    /// The constraints it was started with (unknown for adopted instances).
    pub constraints: Option<crate::model::Constraints>,
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
#[rtype(result = "Option<crate::model::InstanceState>")]
pub struct InstanceStateOf {
    /// The instance.
    pub id: InstanceId,
    /// The oldest acceptable view.
    pub fresher_than: std::time::Duration,
}

/// A copy of the registry's state, for status pages and tests.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "RegistrySnapshot")]
pub struct GetRegistrySnapshot;

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

/// What the registry knows of the instances interruption notices are about (issue 33), one
/// answer per instance, in order: the machine that owns it (by record, else by tag), whether it
/// is that machine's recorded instance, whether the machine is alive, its zone and type.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<Option<crate::actors::coordinator::handover::NoticedInstance>>")]
pub struct NoticedInstances(pub Vec<InstanceId>);

/// The hand-overs the last listing shows under way (`MachineBook::resumable_handovers`): asked
/// once after a provisioner's first batch, so that a restart resumes them at once.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<crate::actors::coordinator::handover::NoticedInstance>")]
pub struct ResumableHandovers;

/// The live, cloud-backed machines whose recorded instance the view lists (issue 34): whose
/// drift the coordinator judges when the model replaces drifted machines. Empty while the view
/// is stale.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<MachineId>")]
pub struct ListedMachines;

/// Which of these machines' recorded instances have drifted from what a start would make with
/// this provisioning info (`model::drift`), with what a hand-over needs of each (issue 34).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<crate::actors::coordinator::repair::DriftedMachine>")]
pub struct DriftOf(pub Vec<(MachineId, crate::model::ProvisioningInfo)>);
