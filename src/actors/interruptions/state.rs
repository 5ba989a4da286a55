//! The poller's plain core: which notices are new, when to poll again.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::config::Backoff;
use crate::ports::{BrokerError, InterruptionNotice};

/// The state of a replacement start's instances as listed: a running one's first (a start
/// repeated with the same client token makes no second instance, but the listing may show a
/// stopped one beside it), `None` if none is listed.
pub fn replacement_state(found: &[crate::model::CloudInstance]) -> Option<crate::model::InstanceState> {
    use crate::model::InstanceState;
    let running = found.iter().any(|i| i.state == InstanceState::Running);
    if running {
        Some(InstanceState::Running)
    } else {
        found.first().map(|i| i.state)
    }
}

/// When to ask the cloud again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextPoll {
    /// At once (each call waits a bounded time itself when nothing is pending).
    Now,
    /// After a backoff (the last call failed).
    After(Duration),
    /// Never: the broker does not warn of interruptions after all.
    Never,
}

/// What to do with one answer of the cloud.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollStep {
    /// Notices to hand to the coordinator.
    pub forward: Vec<InterruptionNotice>,
    /// When to poll again.
    pub next: NextPoll,
}

/// Receipts handed on and not acknowledged, and the failures in a row.
#[derive(Debug, Clone, Default)]
pub struct NoticeBook {
    in_hand: BTreeSet<String>,
    failures: u32,
    backoff: Backoff,
}

impl NoticeBook {
    /// Nothing in hand; failed polls back off by `backoff` (its ceilings, without jitter: one
    /// poller per provisioner).
    pub fn new(backoff: Backoff) -> Self {
        Self { in_hand: BTreeSet::new(), failures: 0, backoff }
    }

    /// One answer of [`crate::ports::Broker::interruption_notices`].
    pub fn on_answer(&mut self, answer: Result<Vec<InterruptionNotice>, BrokerError>) -> PollStep {
        match answer {
            Ok(notices) => {
                self.failures = 0;
                let forward: Vec<InterruptionNotice> =
                    notices.into_iter().filter(|n| self.in_hand.insert(n.receipt.clone())).collect();
                PollStep { forward, next: NextPoll::Now }
            }
            Err(BrokerError::NotSupported(_)) => PollStep { forward: Vec::new(), next: NextPoll::Never },
            Err(_) => {
                let delay = self.backoff.ceiling(self.failures);
                self.failures = self.failures.saturating_add(1);
                PollStep { forward: Vec::new(), next: NextPoll::After(delay) }
            }
        }
    }

    /// The coordinator acted on these: they leave the book (a failed acknowledgement is
    /// redelivered by the cloud, and the coordinator acknowledges a notice it has nothing more
    /// to do for), and are acknowledged to the cloud.
    pub fn acknowledged(&mut self, receipts: &[String]) {
        for r in receipts {
            self.in_hand.remove(r);
        }
    }

    /// How many notices are handed on and not acknowledged.
    #[cfg(test)]
    pub fn in_hand(&self) -> usize {
        self.in_hand.len()
    }
}
