//! The machine registry actor: owns the machine cache fed from the model and the cloud's
//! instance view, and classifies machines (what each needs: a start, a stop, nothing).
//!
//! The instance view is loaded once before anything is started (so that an instance made by a
//! crashed predecessor is adopted, not duplicated), kept current from broker results, and
//! reloaded every resync interval. Unknown instances are only reported from a view whose last
//! listing succeeded.

mod actor;
mod messages;
mod state;
#[cfg(test)]
mod tests;

pub use actor::MachineRegistry;
pub use messages::{
    ForgetMachines, GetRegistrySnapshot, InstanceStateOf, InstancesGone, PrepareDestroy, RecordInstance,
    RecordInstances, Refresh, StopsPlanned, SweepTargets, UnknownInstances,
};
pub use state::{blocks_destroy, MachineBook, Refreshed, RegistryError, RegistrySnapshot};
