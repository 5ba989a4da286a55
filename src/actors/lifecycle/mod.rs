//! The machine lifecycle actor: the starting / stop-deferred / running / stopping state of every
//! machine the provisioner is working on (starting, stopping, and stops deferred while a start is
//! in flight). It also says which extra instances of live machines may be stopped
//! (`WithoutStart`): never a start's product, nor while a start of the machine is in flight.
//!
//! One actor owns a map of small per-machine state machines rather than one actor per
//! machine: a batch of 10,000 changes is one message, not 10,000 mailboxes, iteration order is
//! fixed, and memory per machine is one map entry (see ARCHITECTURE.md).

mod actor;
mod messages;
mod state;
#[cfg(test)]
mod tests;

pub use actor::MachineLifecycle;
pub use messages::{
    BeginReplacement, ForgetLifecycle, GetPhases, ObserveDead, ObserveDestroy, ObservePending, StartsFinished,
    StillWanted, WithoutStart,
};
pub use state::{AfterStart, Deaths, LifecycleBook, Phase};
