//! Unit tests of the limiter's core, on plain numbers: no runtime.

use std::time::Duration;

use super::state::*;
use crate::config::rate_limits::*;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn limits(start: BucketLimit) -> RateLimits {
    RateLimits { start: Some(start), ..RateLimits::unlimited() }
}

#[test]
fn grants_the_burst_then_paces_at_the_rate_in_arrival_order() {
    let mut book = LimiterBook::new(limits(BucketLimit::new(2, 4.0)));
    assert_eq!(book.acquire(ApiClass::Start, Duration::ZERO), Grant::Now { epoch: 0 });
    assert_eq!(book.acquire(ApiClass::Start, Duration::ZERO), Grant::Now { epoch: 0 });
    let Grant::Queued { ticket: a, wake_in } = book.acquire(ApiClass::Start, Duration::ZERO) else { panic!() };
    assert_eq!(wake_in, Duration::from_millis(250));
    let Grant::Queued { ticket: b, .. } = book.acquire(ApiClass::Start, Duration::ZERO) else { panic!() };
    // Too early: nothing.
    assert_eq!(book.wake(ApiClass::Start, secs(0.1)).granted, Vec::<u64>::new());
    let w = book.wake(ApiClass::Start, secs(0.25));
    assert_eq!(w.granted, vec![a]);
    assert_eq!(w.next, Some(Duration::from_millis(250)));
    let w = book.wake(ApiClass::Start, secs(0.5));
    assert_eq!((w.granted, w.next), (vec![b], None));
    // A newcomer does not jump the queue: with someone waiting it queues even if a token is there.
    let Grant::Queued { ticket: c, .. } = book.acquire(ApiClass::Start, secs(0.5)) else { panic!() };
    let Grant::Queued { ticket: d, .. } = book.acquire(ApiClass::Start, secs(0.5)) else { panic!() };
    assert_eq!(book.wake(ApiClass::Start, secs(1.0)).granted, vec![c, d]);
}

#[test]
fn unlimited_classes_always_go() {
    let mut book = LimiterBook::new(limits(BucketLimit::new(1, 1.0)));
    for _ in 0..1000 {
        assert_eq!(book.acquire(ApiClass::Stop, Duration::ZERO), Grant::Now { epoch: 0 });
        assert_eq!(book.acquire(ApiClass::Describe, Duration::ZERO), Grant::Now { epoch: 0 });
    }
    assert_eq!(book.on_throttled(ApiClass::Stop, 0, Duration::ZERO), None);
    assert_eq!(book.view().len(), 1);
}

#[test]
fn throttling_cuts_the_rate_once_per_epoch_and_successes_restore_it() {
    let mut book = LimiterBook::new(limits(BucketLimit::new(10, 5.0)));
    let rate = |b: &LimiterBook| b.view()[0].rate;
    // Six calls sent together come back throttled: one cut, not six.
    for _ in 0..6 {
        book.on_throttled(ApiClass::Start, 0, Duration::ZERO);
    }
    assert!((rate(&book) - 3.5).abs() < 1e-9, "one multiplicative decrease, got {}", rate(&book));
    assert_eq!(book.view()[0].throttled, 6);
    // The bucket was emptied: the next call waits.
    assert!(matches!(book.acquire(ApiClass::Start, Duration::ZERO), Grant::Queued { .. }));
    // A success from before the cut does not undo it; one after it raises the rate.
    book.on_success(ApiClass::Start, 0, secs(1.0));
    assert!((rate(&book) - 3.5).abs() < 1e-9);
    book.on_success(ApiClass::Start, 1, secs(1.0));
    assert!((rate(&book) - 3.55).abs() < 1e-9);
    for _ in 0..100 {
        book.on_success(ApiClass::Start, 1, secs(2.0));
    }
    assert!((rate(&book) - 5.0).abs() < 1e-9, "never above the configured rate");
}

#[test]
fn the_rate_has_a_floor() {
    let mut book = LimiterBook::new(limits(BucketLimit::new(10, 64.0)));
    for epoch in 0..100 {
        book.on_throttled(ApiClass::Start, epoch, Duration::ZERO);
    }
    assert!((book.view()[0].rate - 1.0).abs() < 1e-9);
}

#[test]
fn validation_names_the_class_and_the_value() {
    let bad = RateLimits { stop: Some(BucketLimit::new(0, 1.0)), ..RateLimits::ec2() };
    assert_eq!(bad.validate().unwrap_err().to_string(), "rate limit for stop calls: burst must be at least 1, got 0");
    let bad = RateLimits { describe: Some(BucketLimit::new(1, f64::NAN)), ..RateLimits::ec2() };
    assert!(bad.validate().unwrap_err().to_string().starts_with("rate limit for describe calls: per_second"));
    assert_eq!(RateLimits::ec2().validate(), Ok(()));
    assert!(RateLimits::ec2().any() && !RateLimits::unlimited().any());
}

/// Drives `calls` single calls from `workers` concurrent callers (zero latency, a throttled
/// call retried at once) through the client limiter against a cloud bucket. Returns the time
/// the last call succeeded and how many were throttled.
fn drive(client: RateLimits, cloud: BucketLimit, workers: usize, calls: u32) -> (f64, u32) {
    let mut book = LimiterBook::new(client);
    let mut cloud = TokenBucket::new(cloud);
    let mut now = Duration::ZERO;
    let mut left = calls;
    let mut throttled = 0;
    let mut waiting = 0usize;
    let mut idle = workers;
    let mut next_wake: Option<Duration> = None;
    let mut last_ok = Duration::ZERO;
    let mut guard = 0;
    while left > 0 {
        guard += 1;
        assert!(guard < 1_000_000, "no progress");
        // Every idle caller with work asks for a token; granted ones call at once.
        let mut ready: Vec<u64> = Vec::new();
        let outstanding = left as usize;
        while idle > 0 && waiting + ready.len() < outstanding {
            idle -= 1;
            match book.acquire(ApiClass::Start, now) {
                Grant::Now { epoch } => ready.push(epoch),
                Grant::Queued { wake_in, .. } => {
                    waiting += 1;
                    next_wake = Some(next_wake.map_or(now + wake_in, |w| w.min(now + wake_in)));
                }
            }
        }
        if ready.is_empty() {
            let at = next_wake.take().expect("someone waits");
            now = now.max(at);
            let w = book.wake(ApiClass::Start, now);
            waiting -= w.granted.len();
            ready.extend(w.granted.iter().map(|_| w.epoch));
            next_wake = w.next.map(|d| now + d);
        }
        for epoch in ready {
            if left == 0 {
                break;
            }
            if cloud.take(now) {
                left -= 1;
                last_ok = now;
                book.on_success(ApiClass::Start, epoch, now);
            } else {
                throttled += 1;
                if let Some(d) = book.on_throttled(ApiClass::Start, epoch, now) {
                    next_wake = Some(now + d);
                }
            }
            idle += 1;
        }
    }
    (last_ok.as_secs_f64(), throttled)
}

#[test]
fn adapts_to_a_cloud_slower_than_its_defaults_close_to_the_ideal() {
    // The case: 100 starts, a cloud allowing 10 at once then 2 per second (ideal 45 s),
    // the client sized for EC2 (50 at once, then 5 per second).
    let (took, throttled) = drive(RateLimits::ec2(), BucketLimit::new(10, 2.0), 16, 100);
    eprintln!("took {took:.1} s, {throttled} throttled");
    assert!(took <= 50.0, "took {took:.1} s against the 45 s ideal");
    assert!(throttled <= 20, "{throttled} throttled calls");
}

#[test]
fn a_client_within_the_cloud_limit_is_never_throttled() {
    let client = limits(BucketLimit::new(10, 2.0));
    let (took, throttled) = drive(client, BucketLimit::new(10, 2.0), 16, 100);
    assert_eq!(throttled, 0);
    assert!((took - 45.0).abs() < 0.01, "took {took}");
}
