//! What the interruption poller handles (it sends the coordinator's `InterruptionsNoticed`).

use actix::prelude::*;

/// The notices with these receipts were acted on: the poller acknowledges them to the cloud.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct AcknowledgeNotices(pub Vec<String>);
