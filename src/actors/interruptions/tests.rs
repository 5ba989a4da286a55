use std::time::Duration;

use super::state::*;
use crate::config::Backoff;
use crate::model::InstanceId;
use crate::ports::{BrokerError, InterruptionNotice, NoticeKind};

fn notice(id: &str, receipt: &str) -> InterruptionNotice {
    InterruptionNotice {
        instance: InstanceId::new(id),
        kind: NoticeKind::Interruption,
        deadline: Some(Duration::from_secs(120)),
        receipt: receipt.into(),
    }
}

#[test]
fn new_notices_are_handed_on_once_until_acknowledged() {
    let mut book = NoticeBook::new(Backoff::default());
    let step = book.on_answer(Ok(vec![notice("i-1", "r1"), notice("i-2", "r2")]));
    assert_eq!(step.forward.len(), 2);
    assert_eq!(step.next, NextPoll::Now);
    // Redelivered while still in hand: not again.
    assert!(book.on_answer(Ok(vec![notice("i-1", "r1")])).forward.is_empty());
    book.acknowledged(&["r1".to_owned()]);
    assert_eq!(book.in_hand(), 1);
    // Redelivered after an acknowledgement that did not reach the cloud: handed on again.
    assert_eq!(book.on_answer(Ok(vec![notice("i-1", "r1")])).forward, vec![notice("i-1", "r1")]);
}

#[test]
fn failures_back_off_and_not_supported_stops_polling() {
    let backoff = Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(4) };
    let mut book = NoticeBook::new(backoff);
    let delays: Vec<NextPoll> = (0..4).map(|_| book.on_answer(Err(BrokerError::transient("reset"))).next).collect();
    let secs = |s| NextPoll::After(Duration::from_secs(s));
    assert_eq!(delays, vec![secs(1), secs(2), secs(4), secs(4)]);
    assert_eq!(book.on_answer(Ok(Vec::new())).next, NextPoll::Now);
    assert_eq!(book.on_answer(Err(BrokerError::transient("reset"))).next, secs(1), "a success resets the backoff");
    assert_eq!(book.on_answer(Err(BrokerError::NotSupported("interruption_notices"))).next, NextPoll::Never);
}
