//! The leader lease of replicas on PostgreSQL (issue 15): one lease per model, keyed by the
//! model's uuid, with an epoch that grows at each acquisition; the leader's writes are fenced
//! with it.
//!
//! - [`state`]: the plain core, [`LeaseBook`]: what to ask next, when to step down, each
//!   transition; and [`LeaseTimings`], the checked `lease`, `renew_deadline`, `retry`. Built
//!   with the binary (feature `cli`), since the settings check the timings.
//! - `pg` (feature `postgres`): the lease's SQL on the database's clock (acquire when free or
//!   expired with epoch + 1, renew by the holder at its epoch, release keeping the epoch).

#[cfg(feature = "postgres")]
pub mod pg;
pub mod state;
#[cfg(test)]
mod tests;

pub use state::{
    Answer, LeaseBook, LeaseTimings, LeaseTimingsError, Role, Step, Transition, Why, DEFAULT_LEASE,
    DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY,
};
