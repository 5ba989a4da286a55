//! The client-side rate limiter actor: one adaptive token bucket per cloud API class (start, stop,
//! describe), so the provisioner paces its own calls instead of learning the cloud's limits from
//! `RequestLimitExceeded` errors; a throttled call is never a machine's failure, only a slowdown.
//!
//! Every broker call passes through [`LimitedBroker`], which asks the limiter for a token
//! ([`Acquire`]), makes the call, and reports whether the cloud throttled it
//! ([`CallOutcome`]). The limiter's plain core, [`LimiterBook`], decides: a throttled call
//! halves-ish the class's rate (multiplicative decrease, at most once per refill interval)
//! and empties its bucket; successes raise the rate again by small steps (additive increase)
//! up to the configured rate. Waiters are served in arrival order, so no call starves.
//!
//! Defaults follow EC2's published request buckets ([`RateLimits::ec2`]); every class can be
//! changed or switched off in [`ProvisionerConfig`](crate::ProvisionerConfig).

mod actor;
mod broker;
mod messages;
mod state;
#[cfg(test)]
mod tests;

pub use crate::config::rate_limits::{BucketLimit, RateLimits};
pub use actor::RateLimiter;
pub use broker::{CallGate, LimitedBroker};
pub use messages::GetLimiterSnapshot;
pub use state::{ClassView, LimiterSnapshot, TokenBucket};
