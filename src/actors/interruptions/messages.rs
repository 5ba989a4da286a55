//! What the interruption poller sends and handles.

use actix::prelude::*;

use crate::ports::InterruptionNotice;

/// Sent to the coordinator: notices the poller has not handed on before, in the order the cloud
/// answered them.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct InterruptionsNoticed(pub Vec<InterruptionNotice>);

/// The notices with these receipts were acted on: the poller acknowledges them to the cloud.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct AcknowledgeNotices(pub Vec<String>);
