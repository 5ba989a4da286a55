//! The leader lease of replicas on PostgreSQL (issue 15): one lease per model, keyed by the
//! model's uuid, with an epoch that grows at each acquisition; the leader's writes are fenced
//! with it.
//!
//! - [`state`]: the plain core, [`LeaseBook`]: what to ask next, when to step down, each
//!   transition; and [`LeaseTimings`], the checked `lease`, `renew_deadline`, `retry`. Built
//!   with the binary (feature `cli`), since the settings check the timings.
//! - `actor` (feature `postgres`): the replica's role, `LeaseActor`, driving the book on a
//!   timer and the SQL on the replica's lease thread, handing each transition to the service's
//!   `RoleHooks` (leader: fence and start the provisioner; follower: stop it).
//! - `leading` (feature `serve`): `Leading`, the provisioner actors of the epoch this replica
//!   leads, stopped at once when it no longer does.
//! - `listen` (feature `postgres`): `LISTEN provisioner_changes` on a dedicated connection and
//!   thread, forwarding each notification (how followers learn of changes, not by polling);
//!   one listener per replica, its notices handed to each model by `NoticeHub`.
//! - `members` (feature `postgres`): the replicas' membership (a heartbeat row each in
//!   `public.provisioner_replicas`, live while unexpired) and the round's view of every
//!   model's lease, what the spread is planned from.
//! - [`share`]: the plain core that spreads many models' leaders over the replicas (each
//!   replica's fair share, rendezvous ranking, hand-overs only to replicas with room).
//! - `sql` (feature `postgres`): `LeaseSql`, the replica's lease thread and connection, which
//!   every model's lease shares (renewals asked together commit together).
//! - `pg` (feature `postgres`): the lease's SQL on the database's clock (acquire when free or
//!   expired with epoch + 1, renew by the holder at its epoch, release keeping the epoch).

#[cfg(feature = "postgres")]
pub(crate) mod actor;
#[cfg(all(test, feature = "postgres"))]
mod actor_tests;
#[cfg(feature = "serve")]
pub(crate) mod leading;
#[cfg(feature = "postgres")]
pub(crate) mod listen;
#[cfg(feature = "postgres")]
pub(crate) mod members;
#[cfg(feature = "postgres")]
pub(crate) mod messages;
#[cfg(feature = "postgres")]
pub(crate) mod pg;
pub(crate) mod share;
#[cfg(feature = "postgres")]
pub(crate) mod sql;
pub(crate) mod state;
#[cfg(test)]
mod tests;

#[cfg(feature = "postgres")]
pub(crate) use crate::service::settings::LeaseTimings;
#[cfg(feature = "postgres")]
pub(crate) use state::{Role, Transition, Why};
