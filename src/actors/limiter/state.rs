//! The limiter's plain core: token buckets, the adaptive (AIMD) rate, and the FIFO of calls
//! waiting for a token. Time is a [`Duration`] since the actor's start, passed in by the caller.

use std::collections::VecDeque;
use std::time::Duration;

use crate::config::rate_limits::{ApiClass, BucketLimit, RateLimits};

/// A plain token bucket on caller-supplied time: what a cloud enforces (the fake cloud uses it).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    burst: f64,
    per_second: f64,
    tokens: f64,
    last: Duration,
}

impl TokenBucket {
    /// A full bucket at time zero.
    pub fn new(limit: BucketLimit) -> Self {
        let burst = f64::from(limit.burst);
        Self { burst, per_second: limit.per_second, tokens: burst, last: Duration::ZERO }
    }

    fn refill(&mut self, now: Duration) {
        let elapsed = now.saturating_sub(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.last = self.last.max(now);
    }

    /// Takes a token if one is there at `now`.
    pub fn take(&mut self, now: Duration) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Multiplicative decrease on throttling.
const DECREASE: f64 = 0.7;
/// Additive increase per successful call, as a fraction of the configured rate.
const INCREASE: f64 = 0.01;
/// The rate never falls below this fraction of the configured rate.
const FLOOR: f64 = 1.0 / 64.0;

/// One class's adaptive bucket and its queue of waiting calls.
#[derive(Debug, Clone)]
struct AdaptiveBucket {
    limit: BucketLimit,
    /// The current refill rate (≤ `limit.per_second`).
    rate: f64,
    /// The current bucket size (≤ `limit.burst`).
    cap: f64,
    tokens: f64,
    last: Duration,
    /// Incremented at each decrease: a call sent before the last decrease reports an older
    /// epoch, and neither decreases the rate again nor raises it.
    epoch: u64,
    queue: VecDeque<u64>,
    granted: u64,
    throttled: u64,
}

impl AdaptiveBucket {
    fn new(limit: BucketLimit) -> Self {
        let cap = f64::from(limit.burst);
        Self {
            limit,
            rate: limit.per_second,
            cap,
            tokens: cap,
            last: Duration::ZERO,
            epoch: 0,
            queue: VecDeque::new(),
            granted: 0,
            throttled: 0,
        }
    }

    fn refill(&mut self, now: Duration) {
        let elapsed = now.saturating_sub(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.cap);
        self.last = self.last.max(now);
    }

    /// Time until the next token, from `now` (after a refill).
    fn next_token_in(&self) -> Duration {
        if self.tokens >= 1.0 {
            Duration::ZERO
        } else {
            // Round up to a whole microsecond so the wake never comes a hair too early.
            let secs = (1.0 - self.tokens) / self.rate;
            Duration::from_micros((secs * 1e6).ceil() as u64)
        }
    }
}

/// The answer to a request for a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Go now; report the outcome with this epoch.
    Now {
        /// The rate epoch the call is sent under.
        epoch: u64,
    },
    /// Wait in line: the ticket is granted by a later [`LimiterBook::wake`].
    Queued {
        /// The ticket.
        ticket: u64,
        /// When to call [`LimiterBook::wake`] for this class next.
        wake_in: Duration,
    },
}

/// What a wake-up released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wake {
    /// Tickets granted now, in arrival order.
    pub granted: Vec<u64>,
    /// The epoch they are sent under.
    pub epoch: u64,
    /// When to wake again (`None`: nobody is waiting).
    pub next: Option<Duration>,
}

/// One class's state, for snapshots and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassView {
    /// The class.
    pub class: ApiClass,
    /// The configured bucket.
    pub limit: BucketLimit,
    /// The current (adapted) rate per second.
    pub rate: f64,
    /// Calls waiting for a token.
    pub waiting: usize,
    /// Calls let through so far.
    pub granted: u64,
    /// Calls the cloud throttled so far.
    pub throttled: u64,
}

/// Every class's bucket.
#[derive(Debug, Clone)]
pub struct LimiterBook {
    buckets: [Option<AdaptiveBucket>; 3],
    next_ticket: u64,
}

impl LimiterBook {
    /// Full buckets at time zero.
    pub fn new(limits: RateLimits) -> Self {
        Self { buckets: ApiClass::ALL.map(|c| limits.get(c).map(AdaptiveBucket::new)), next_ticket: 0 }
    }

    /// Asks for a token: granted at once when one is there and nobody waits, else queued.
    pub fn acquire(&mut self, class: ApiClass, now: Duration) -> Grant {
        let Some(b) = self.buckets[class.index()].as_mut() else { return Grant::Now { epoch: 0 } };
        b.refill(now);
        if b.queue.is_empty() && b.tokens >= 1.0 {
            b.tokens -= 1.0;
            b.granted += 1;
            return Grant::Now { epoch: b.epoch };
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        b.queue.push_back(ticket);
        Grant::Queued { ticket, wake_in: b.next_token_in() }
    }

    /// Releases as many waiting calls as there are tokens at `now`.
    pub fn wake(&mut self, class: ApiClass, now: Duration) -> Wake {
        let Some(b) = self.buckets[class.index()].as_mut() else {
            return Wake { granted: Vec::new(), epoch: 0, next: None };
        };
        b.refill(now);
        let mut granted = Vec::new();
        while b.tokens >= 1.0 {
            let Some(t) = b.queue.pop_front() else { break };
            b.tokens -= 1.0;
            b.granted += 1;
            granted.push(t);
        }
        let next = (!b.queue.is_empty()).then(|| b.next_token_in());
        Wake { granted, epoch: b.epoch, next }
    }

    /// The cloud throttled a call sent under `epoch`: the bucket is emptied (the cloud's is),
    /// and unless the rate was already lowered since the call went out, rate and bucket size
    /// are cut by a factor. Returns when to wake the class's queue next.
    pub fn on_throttled(&mut self, class: ApiClass, epoch: u64, now: Duration) -> Option<Duration> {
        let b = self.buckets[class.index()].as_mut()?;
        b.refill(now);
        b.throttled += 1;
        b.tokens = b.tokens.min(0.0);
        if epoch == b.epoch {
            b.rate = (b.rate * DECREASE).max(b.limit.per_second * FLOOR);
            b.cap = (b.cap * DECREASE).max(1.0);
            b.epoch += 1;
            tracing::info!(%class, rate = b.rate, "cloud throttled a call; slowing down");
        }
        (!b.queue.is_empty()).then(|| b.next_token_in())
    }

    /// A call sent under `epoch` was not throttled: the rate and the bucket size creep back up
    /// (only for calls sent at the current rate, so a success from before a cut does not undo it).
    pub fn on_success(&mut self, class: ApiClass, epoch: u64, now: Duration) {
        let Some(b) = self.buckets[class.index()].as_mut() else { return };
        if epoch != b.epoch || b.rate >= b.limit.per_second && b.cap >= f64::from(b.limit.burst) {
            return;
        }
        b.refill(now);
        b.rate = (b.rate + b.limit.per_second * INCREASE).min(b.limit.per_second);
        b.cap = (b.cap + 1.0).min(f64::from(b.limit.burst));
    }

    /// Every limited class, in a fixed order.
    pub fn view(&self) -> Vec<ClassView> {
        ApiClass::ALL
            .iter()
            .filter_map(|c| {
                let b = self.buckets[c.index()].as_ref()?;
                Some(ClassView {
                    class: *c,
                    limit: b.limit,
                    rate: b.rate,
                    waiting: b.queue.len(),
                    granted: b.granted,
                    throttled: b.throttled,
                })
            })
            .collect()
    }
}

/// Every limited class, in a fixed order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimiterSnapshot {
    /// Each class's state.
    pub classes: Vec<ClassView>,
}
