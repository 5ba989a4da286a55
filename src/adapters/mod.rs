//! Implementations of the ports for real clouds.
//!
//! - `ec2` (feature `ec2`): [`Broker`](crate::ports::Broker) over the AWS SDK for Rust.
//! - `lxd` (feature `lxd`): [`Broker`](crate::ports::Broker) over LXD's REST API.

#[cfg(feature = "ec2")]
pub mod ec2;
#[cfg(feature = "lxd")]
pub mod lxd;
#[cfg(any(feature = "lxd", feature = "postgres"))]
pub(crate) mod tls;
