//! Messages the rate limiter handles.

use actix::Message;

use super::state::LimiterSnapshot;
use crate::config::rate_limits::ApiClass;

/// Wait for a token of this class. Answers the rate epoch the call is sent under, to be
/// reported back with [`CallOutcome`].
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "u64")]
pub struct Acquire {
    /// The class of the call about to be made.
    pub class: ApiClass,
}

/// How a call let through by [`Acquire`] went.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct CallOutcome {
    /// Its class.
    pub class: ApiClass,
    /// The epoch [`Acquire`] answered.
    pub epoch: u64,
    /// The cloud answered `RequestLimitExceeded`.
    pub throttled: bool,
}

/// The state of every limited class.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "LimiterSnapshot")]
pub struct GetLimiterSnapshot;
