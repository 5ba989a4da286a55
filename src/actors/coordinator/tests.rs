use std::time::Duration;

use super::state::*;
use crate::config::Backoff;
use crate::model::MachineId;

fn ids(v: &[&str]) -> Vec<MachineId> {
    v.iter().map(|s| MachineId::new(*s)).collect()
}

fn backoff() -> Backoff {
    Backoff { initial: Duration::from_millis(100), max: Duration::from_millis(1000) }
}

fn book() -> BatchBook {
    BatchBook::new(backoff(), 16)
}

/// A book whose first batch already succeeded.
fn after_first_batch() -> BatchBook {
    let mut b = book();
    b.notify(Vec::new());
    assert_eq!(b.take_batch(), Some(vec![]));
    assert!(b.batch_succeeded());
    b
}

#[test]
fn take_batch_is_none_before_any_notification() {
    let mut b = book();
    assert_eq!(b.take_batch(), None);
    assert!(!b.first_done());
}

#[test]
fn first_empty_notification_still_yields_a_batch() {
    let mut b = book();
    b.notify(Vec::new());
    assert_eq!(b.take_batch(), Some(vec![]));
    assert_eq!(b.take_batch(), None, "one batch at a time");
    assert!(b.batch_succeeded());
    assert!(b.first_done());
    // Later empty notifications yield nothing.
    b.notify(Vec::new());
    assert_eq!(b.take_batch(), None);
}

#[test]
fn take_batch_returns_notified_ids_sorted_and_deduplicated() {
    let mut b = after_first_batch();
    b.notify(ids(&["2", "0"]));
    b.notify(ids(&["0", "1"]));
    assert_eq!(b.take_batch(), Some(ids(&["0", "1", "2"])));
}

#[test]
fn notifications_during_a_batch_are_coalesced_into_the_next() {
    let mut b = book();
    b.notify(ids(&["1", "2"]));
    assert_eq!(b.take_batch(), Some(ids(&["1", "2"])));

    b.notify(ids(&["3"]));
    b.notify(ids(&["2", "3", "4"]));
    assert_eq!(b.take_batch(), None, "a batch is in flight");
    assert_eq!(b.take_batch(), None);

    assert!(b.batch_succeeded());
    assert_eq!(b.take_batch(), Some(ids(&["2", "3", "4"])));
    assert_eq!(b.take_batch(), None);
    assert!(!b.batch_succeeded());
    assert_eq!(b.take_batch(), None, "nothing waiting");
}

/// Fails the batch in flight, waits out the backoff and answers its delay.
fn fail_and_wait(b: &mut BatchBook, batch: Vec<MachineId>) -> Duration {
    let d = b.batch_failed(batch);
    b.backoff_over();
    d
}

#[test]
fn batch_failed_puts_ids_back_and_backoff_grows() {
    // Delays are drawn with full jitter under a ceiling that doubles up to the cap.
    let mut b = after_first_batch();
    b.notify(ids(&["1"]));
    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(100));

    b.notify(ids(&["2"]));
    let batch = b.take_batch().expect("the failed batch is retried");
    assert_eq!(batch, ids(&["1", "2"]), "failed ids wait with new ones");
    assert!(b.retry_later_delay() <= Duration::from_millis(200));
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(200));

    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(400));
    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(800));
    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(1000), "capped");
    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(1000));

    // Success resets the backoff.
    let batch = b.take_batch().unwrap();
    assert_eq!(batch, ids(&["1", "2"]));
    assert!(!b.batch_succeeded());
    // Full jitter under a 100 ms ceiling again (under the old 1 s one, ten draws would not all
    // stay below 100 ms).
    assert!((0..10).all(|_| b.retry_later_delay() <= Duration::from_millis(100)));
    b.notify(ids(&["3"]));
    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(100));
}

#[test]
fn no_batch_is_taken_while_backing_off() {
    let mut b = after_first_batch();
    b.notify(ids(&["1"]));
    let batch = b.take_batch().unwrap();
    b.batch_failed(batch);
    assert_eq!(b.take_batch(), None, "the failed batch waits for its backoff");
    b.notify(ids(&["2"]));
    assert_eq!(b.take_batch(), None, "new notifications wait too");
    b.backoff_over();
    assert_eq!(b.take_batch(), Some(ids(&["1", "2"])));
    assert_eq!(b.take_batch(), None, "in flight again");
}

#[test]
fn backoff_over_without_a_failure_changes_nothing() {
    let mut b = book();
    b.backoff_over();
    assert_eq!(b.take_batch(), None);
    b.notify(ids(&["1"]));
    assert_eq!(b.take_batch(), Some(ids(&["1"])));
    b.backoff_over();
    assert_eq!(b.take_batch(), None, "still in flight");
}

#[test]
fn failed_first_batch_is_retried_even_when_empty() {
    let mut b = book();
    b.notify(Vec::new());
    let batch = b.take_batch().unwrap();
    fail_and_wait(&mut b, batch);
    assert!(!b.first_done());
    assert_eq!(b.take_batch(), Some(vec![]), "the first batch must still happen to end safe mode");
    assert!(b.batch_succeeded());
}

#[test]
fn batch_succeeded_returns_true_only_the_first_time() {
    let mut b = book();
    b.notify(ids(&["0"]));
    b.take_batch().unwrap();
    assert!(b.batch_succeeded());
    for i in 1..4 {
        b.notify(ids(&[&i.to_string()]));
        b.take_batch().unwrap();
        assert!(!b.batch_succeeded());
    }
    assert!(b.first_done());
}

#[test]
fn failed_batch_does_not_count_as_first() {
    let mut b = book();
    b.notify(ids(&["0"]));
    let batch = b.take_batch().unwrap();
    fail_and_wait(&mut b, batch);
    b.take_batch().unwrap();
    assert!(b.batch_succeeded(), "the first successful batch is the first");
}

#[test]
fn set_workers_reports_change_only_when_different() {
    let mut b = book();
    assert_eq!(b.workers(), 16);
    assert!(!b.set_workers(16));
    assert!(b.set_workers(8));
    assert_eq!(b.workers(), 8);
    assert!(!b.set_workers(8));
    assert!(b.set_workers(16));
    assert_eq!(b.workers(), 16);
}

#[test]
fn zones_loaded_is_remembered() {
    let mut b = book();
    assert!(!b.zones_loaded());
    b.set_zones_loaded();
    assert!(b.zones_loaded());
}
