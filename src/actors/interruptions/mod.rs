//! The interruption poller (issue 33): reads the cloud's interruption notices
//! ([`crate::ports::Broker::interruption_notices`], a bounded wait each), hands each new one to
//! the coordinator, and acknowledges them when the coordinator says it has acted on them. Started
//! by the wiring only when the broker warns of interruptions.
//!
//! A notice not acknowledged is answered again by the cloud (SQS redelivers it): the book keeps
//! the receipts handed on and not yet acknowledged, so a redelivery of a notice still being acted
//! on is not handed on twice, while one lost to a crash (the book is gone with the actor) is.

mod actor;
mod messages;
mod state;
#[cfg(test)]
mod tests;

pub use actor::InterruptionPoller;
pub use messages::{AcknowledgeNotices, CapacityShort, ImpairedInstances, ReleaseNotices, ReplacementStates};
#[cfg(feature = "mc")]
pub use state::NoticeBook;
