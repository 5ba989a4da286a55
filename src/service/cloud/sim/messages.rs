//! Messages of the simulated cloud's actors.

use std::time::Duration;

use actix::Message;

use crate::model::instance_types::{InstanceType, TypeAttempt};

/// Spend a token of the account's start bucket: `true` when there was one.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "bool")]
pub(crate) struct TakeStart;

/// The type (and client token) a start uses after the per-type fail-over in its zone; `Err`
/// with the last type tried when every candidate is out of capacity there.
#[derive(Debug, Message)]
#[rtype(result = "Result<TypeAttempt, Option<String>>")]
pub(crate) struct PickType {
    /// The cloud's time.
    pub now: Duration,
    /// The start's zone.
    pub zone: Option<String>,
    /// The start's client token.
    pub token: String,
    /// The types that fit it, best first.
    pub candidates: Vec<InstanceType>,
}
