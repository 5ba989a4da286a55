//! The broker worker pool actor: runs StartInstance and StopInstances jobs, at most `size` at a
//! time, stops before starts (so no instance is duplicated), with the start retry strategy and zone
//! fail-over (throttling costs time, never a round).
//!
//! Resizing only changes how many jobs may run at once: queued jobs stay queued and jobs in flight
//! finish: no worker ever waits on the queue it feeds, nothing is dropped (Juju's resize closes the
//! pool and waits for the starts in flight). A failed stop gives its slot back and is queued again
//! after a backoff.
//!
//! With batching on (`ProvisionerConfig::batch_starts`, on a broker that batches natively), a
//! start that reaches its cloud call joins a batch of its zone and shape instead
//! (`batch.rs`, the plain core; `JoinBatch`); each machine still runs its own start (zone
//! choice, rounds, fail-over, registration), and only the call is shared. A worker then carries a
//! batch: up to `size × batch_size` starts run at once (`PoolBook::with_batches`).

mod actor;
pub(crate) mod batch;
mod messages;
pub mod run;
mod start;
mod state;
#[cfg(test)]
mod tests;

pub use actor::WorkerPool;
pub use messages::{Enqueue, GetPoolStatus, ResizePool};
pub use start::{BatchDeps, StartDeps};
#[cfg(test)]
pub(crate) use state::{Attempts, FailureKind, Step};
pub use state::{GivenUp, Job, JobOutcome, PoolStatus, ReleaseJob, StartJob, StopJob};
