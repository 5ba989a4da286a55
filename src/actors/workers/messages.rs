//! Messages the worker pool handles.

use actix::Message;

use super::state::{Job, PoolStatus};
use crate::config::ConfigError;

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
