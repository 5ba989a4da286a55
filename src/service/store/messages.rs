//! What the store actor handles.

use actix::prelude::*;

use super::backend::{Fence, StoreBackend};
use super::errors::StoreError;
use super::records::StoreCounts;
use super::writes::{Write, Written};
use crate::{MachinesChanged, RetryTick};

/// A unit of work on the store's core.
pub(super) type Work<T> = Box<dyn FnOnce(&mut dyn StoreBackend) -> Result<T, StoreError> + Send>;

/// Runs one unit of work on the store's connection: a read, or a write that has committed
/// when the answer arrives (in a group commit with the units of work waiting beside it).
/// Watchers hear about the machines it changed before the answer.
pub(crate) struct Exec<T> {
    /// The work.
    pub work: Work<T>,
    /// Whether its commit must be on disk before the answer (`synchronous=FULL`: what an
    /// operator's request acknowledges), or only in the operating system's hands
    /// (`synchronous=NORMAL`: survives a process crash; a power cut may lose it, and everything
    /// after it, which the provisioner re-derives at its next start).
    pub durable: bool,
    /// Whether its writes are the provisioner's own (the model port's and the simulated
    /// cloud's): checked against the leader's fence, if one is set. Writes of desired state
    /// from the API are not.
    pub fenced: bool,
    /// Where its result goes, once its group has committed.
    pub reply: futures::channel::oneshot::Sender<Result<T, StoreError>>,
}

impl<T: Send + 'static> Message for Exec<T> {
    type Result = ();
}

/// Runs one write-behind unit of work ([`Write`]): the provisioner's (lazy and fenced, as
/// [`Exec`] with `durable: false, fenced: true`). A backend may queue it in the open group and
/// answer it only after the group's commit, without a round trip of its own.
pub(crate) struct Apply {
    /// The write.
    pub write: Write,
    /// Where its result goes, once its group has committed.
    pub reply: futures::channel::oneshot::Sender<Result<Written, StoreError>>,
}

impl Message for Apply {
    type Result = ();
}

/// Subscribes a machine watcher: it gets every machine now, then the ids that change.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Watch(pub Recipient<MachinesChanged>);

/// Subscribes a transient-retry watcher: it gets a tick after each `retry`.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct WatchRetries(pub Recipient<RetryTick>);

/// Subscribes to the gauges' counts: the current ones at once, then every change.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct WatchCounts(pub Recipient<CountsChanged>);

/// The gauges' counts after a write changed them.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub(crate) struct CountsChanged(pub StoreCounts);

/// Sets (or clears) the leader's fence: from then on every fenced write commits only while
/// the lease still names this holder at this epoch (PostgreSQL only; SQLite refuses a fence).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), StoreError>")]
pub(crate) struct SetFence(pub Option<Fence>);
