//! The machine registry actor: owns the machine cache fed from the model and the cloud's
//! instance view, and classifies machines (what each needs: a start, a stop, nothing).
//!
//! The instance view is loaded once before anything is started (so that an instance made by a
//! crashed predecessor is adopted, not duplicated), kept current from broker results, and
//! reloaded every resync interval. Unknown instances are only reported from a view whose last
//! listing succeeded.
//!
//! Each periodic listing also judges the extra instances of live machines (issue 32,
//! `MachineBook::extra_instances`): an instance of ours tagged for a live machine that records
//! another one, owned by no machine, not being stopped, on a listing asked for after the
//! machine got its instance (listings are numbered when asked for). They go to the coordinator
//! with `ViewRefreshed`, which has them stopped whatever the harvest mode once the lifecycle
//! (no start in flight) and the harvest policy (not released or parked) agree.

mod actor;
mod messages;
mod state;
#[cfg(test)]
mod tests;

pub use actor::MachineRegistry;
pub use messages::{
    DriftOf, ForgetMachines, GetRegistrySnapshot, InstanceStateOf, InstancesGone, ListedMachines, NoticedInstances,
    PrepareDestroy, RecordInstance, RecordInstances, Refresh, ResumableHandovers, StopsPlanned, SweepTargets,
    UnknownInstances,
};
pub use state::{blocks_destroy, MachineBook, Refreshed, RegistryError, RegistrySnapshot};
