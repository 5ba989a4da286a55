//! The lease actor's messages ([`LeaseActor`](super::actor::LeaseActor) handles them): the
//! lease thread's answers, the service's shutdown and status questions, and the spread's
//! orders.

use actix::prelude::*;

use super::state::{Answer, LeaseStatus};

/// The SQL thread's answer.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Answered(pub Answer);

/// Clean shutdown: a leader stops acting and releases its lease; answers once the release
/// answered (or at once for a follower). The caller bounds the wait.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct ReleaseLease;

/// The spread's order for this model, each round (see `service::host::spread`): what the
/// driver read of the lease, whether to try to acquire it, and whether to hand it over.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub(crate) struct SpreadOrder {
    /// The live holder the driver read (`None`: free or expired).
    pub seen: Option<(String, i64)>,
    /// Whether a follower tries to acquire.
    pub acquire: bool,
    /// Hand the lease over: stop acting now and release it (a leader only).
    pub hand_over: bool,
}

/// The role as the status shows it.
#[derive(Message)]
#[rtype(result = "LeaseStatus")]
pub(crate) struct GetLeaseStatus;
