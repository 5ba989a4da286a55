//! Implementations of the ports for real clouds.
//!
//! - `ec2` (feature `ec2`): [`Broker`](crate::ports::Broker) over the AWS SDK for Rust.

#[cfg(feature = "ec2")]
pub mod ec2;
