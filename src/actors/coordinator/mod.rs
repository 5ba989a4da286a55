//! The coordinator actor: takes machine-change notifications, transient-retry ticks,
//! harvest-mode changes and pool resizes, drives the other actors through one batch at a
//! time, and publishes [`ProvisionerEvent`](crate::model::events::ProvisionerEvent)s.
//!
//! Notifications that arrive while a batch is in flight are coalesced into the next batch.
//! A batch that fails as a whole (the cloud listing or the machines call) is retried with
//! backoff; nothing in it is lost. Per-machine failures never fail a batch.

mod actor;
pub mod batch;
pub mod followup;
pub mod handover;
mod links;
mod messages;
pub mod repair;
mod state;
#[cfg(test)]
mod tests;

pub use actor::Coordinator;
pub use links::{InterruptionLinks, Links};
pub use messages::{
    ChangeHarvestMode, CloseStarts, DestroyModel, ExecutePlan, GetHealth, Health, InterruptionsNoticed, JobsDone,
    MachinesChanged, ModelDestroyed, ResizeError, RetryTick, SetRepairPolicy, SetWorkers, Subscribe, ViewRefreshed,
};
pub use state::{BatchBook, DestroyError, DestroySummary};
