//! The EC2 broker (feature `ec2`): the [`Broker`](crate::ports::Broker) port over the AWS SDK
//! for Rust, for EC2 or an EC2-compatible endpoint.
//!
//! - Zones: `DescribeAvailabilityZones`; only zones in state `available` take new instances.
//! - Starts: `RunInstances` of one instance with `Placement.AvailabilityZone`, the configured
//!   image and instance type (and optional subnet and security groups), a `ClientToken` derived
//!   from the provisioner's per-attempt token (so a retried call returns the instance the first
//!   one made), and `TagSpecifications` carrying the model uuid, the machine id and the start
//!   nonce ([`TAG_MODEL`], [`TAG_MACHINE`], [`TAG_START`]).
//! - Listings: `DescribeInstances` filtered by our model tag and the states pending, running,
//!   stopping and stopped, every page. Instances without our model tag are never listed, so
//!   they can never be adopted or harvested.
//! - Stops: `TerminateInstances` in batches of 1,000 (an instance already gone is not an
//!   error). `StopInstances` is never used to mean "remove".
//! - Released instances lose the model tag (`DeleteTags`); reuse re-tags (`CreateTags`).
//! - Errors: see [`classify`]. Throttling becomes [`BrokerError::Throttled`] (the client-side
//!   limiter slows down), capacity and zone problems zone-specific, auth and quota problems
//!   zone-independent, with AWS's message on the machine's status.
//!
//! [`BrokerError::Throttled`]: crate::ports::BrokerError::Throttled

mod broker;
mod config;
mod errors;
#[cfg(test)]
mod tests;

pub use broker::{client_token, Ec2Broker, TAG_MACHINE, TAG_MODEL, TAG_START};
pub use config::{Ec2Config, Ec2ConfigError};
pub use errors::classify;
