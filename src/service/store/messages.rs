//! What the store's units of work are, and what its count watchers hear.

use actix::prelude::*;

use super::backend::StoreBackend;
use super::errors::StoreError;
use super::records::StoreCounts;

/// A unit of work on the store's core: a read, or a write that has committed when its answer
/// arrives (in a group commit with the units of work waiting beside it). Watchers hear about
/// the machines it changed before the answer.
pub(super) type Work<T> = Box<dyn FnOnce(&mut dyn StoreBackend) -> Result<T, StoreError> + Send>;

/// The gauges' counts after a write changed them.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub(crate) struct CountsChanged(pub StoreCounts);
