//! Messages the worker pool handles.

use actix::Message;

use super::batch::Reply;
use super::state::{Job, PoolStatus};
use crate::config::ConfigError;
use crate::ports::StartInstanceParams;

/// Queue a job.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Enqueue(pub Job);

/// Change the number of concurrent jobs (1..=max).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<(), ConfigError>")]
pub struct ResizePool(pub usize);

/// The pool's load.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "PoolStatus")]
pub struct GetPoolStatus;

/// A start (running on the pool) reached its cloud call with batching on: join the open batch
/// of its zone and shape, and answer once that batch's call has answered for this machine.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Reply")]
pub struct JoinBatch(pub StartInstanceParams);
