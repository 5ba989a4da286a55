//! The EC2 broker's memory: what [`Ec2Broker`](super::Ec2Broker) learns and remembers between
//! calls, owned by one actor, [`BrokerMemory`], and reached by its messages (the broker's calls
//! run concurrently, from many workers, over clones of one broker).
//!
//! - The per-type capacity fail-over ([`TypeFailover`](crate::model::instance_types::TypeFailover)):
//!   a launch asks for the order of its types ([`OrderTypes`]), makes its calls, and reports
//!   each attempt's outcome ([`Attempted`]).
//! - The instances of batched starts not yet tagged with their machine, by `(machine, nonce)`
//!   ([`RememberUntagged`], [`TakeUntagged`]): the member's look-up tags its instance first.
//! - The pacer of the broker's own calls ([`SetPacer`], [`GetPacer`]), replaced by each
//!   provisioner started over the broker.
//! - The catalogue and the image's root device, read once ([`ReadCatalogue`],
//!   [`ReadRootDevice`]): each message carries the read to make; one read at a time, its
//!   callers waiting for it; a failed read is made again by the next caller (a plain
//!   [`OnceRead`]).
//!
//! The plain core, [`MemoryBook`] and [`OnceRead`], has no actix import; the actor is a thin
//! shell that runs the reads.

mod actor;
mod messages;
mod state;
#[cfg(test)]
mod tests;

pub(super) use actor::BrokerMemory;
pub(super) use messages::{
    Attempt, GetPacer, OrderTypes, ReadCatalogue, ReadRootDevice, RememberUntagged, SetPacer, TakeUntagged,
};
#[cfg(test)]
use state::{After, Ask, MemoryBook, OnceRead, Place};
pub(super) use state::{Attempted, Untagged};
