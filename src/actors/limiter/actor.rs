//! The rate limiter actor: a thin shell over [`LimiterBook`] that parks waiting calls on
//! oneshot channels and wakes each class's queue on the actor's own timer (no threads, so a
//! paused test clock governs every wait).

use std::collections::BTreeMap;

use actix::prelude::*;
use actix_rt::time::Instant;
use futures::channel::oneshot;

use super::messages::*;
use super::state::{Grant, LimiterBook, LimiterSnapshot};
use crate::config::rate_limits::{ApiClass, RateLimits};

/// Paces cloud calls per API class.
pub struct RateLimiter {
    book: LimiterBook,
    epoch: Instant,
    waiters: BTreeMap<u64, (ApiClass, oneshot::Sender<u64>)>,
    timers: BTreeMap<ApiClass, SpawnHandle>,
}

impl RateLimiter {
    /// A limiter with full buckets.
    pub fn new(limits: RateLimits) -> Self {
        Self {
            book: LimiterBook::new(limits),
            epoch: Instant::now(),
            waiters: BTreeMap::new(),
            timers: BTreeMap::new(),
        }
    }

    fn now(&self) -> std::time::Duration {
        self.epoch.elapsed()
    }

    /// (Re)arms the class's wake-up timer.
    fn schedule(&mut self, class: ApiClass, delay: std::time::Duration, ctx: &mut Context<Self>) {
        if let Some(old) = self.timers.remove(&class) {
            ctx.cancel_future(old);
        }
        let handle = ctx.run_later(delay, move |act, ctx| {
            act.timers.remove(&class);
            act.wake(class, ctx);
        });
        self.timers.insert(class, handle);
    }

    fn wake(&mut self, class: ApiClass, ctx: &mut Context<Self>) {
        let wake = self.book.wake(class, self.now());
        for ticket in wake.granted {
            if let Some((_, tx)) = self.waiters.remove(&ticket) {
                if tx.send(wake.epoch).is_err() {
                    // The caller went away; its token is simply spent.
                    tracing::debug!(%class, "a call waiting for a token was dropped");
                }
            }
        }
        if let Some(next) = wake.next {
            self.schedule(class, next, ctx);
        }
    }
}

impl Actor for RateLimiter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::actors::unlimited_mailbox(ctx);
    }
}

impl Handler<Acquire> for RateLimiter {
    type Result = ResponseFuture<u64>;
    fn handle(&mut self, msg: Acquire, ctx: &mut Self::Context) -> Self::Result {
        match self.book.acquire(msg.class, self.now()) {
            Grant::Now { epoch } => Box::pin(async move { epoch }),
            Grant::Queued { ticket, wake_in } => {
                let (tx, rx) = oneshot::channel();
                self.waiters.insert(ticket, (msg.class, tx));
                if !self.timers.contains_key(&msg.class) {
                    self.schedule(msg.class, wake_in, ctx);
                }
                // A limiter stopped under a waiting call lets it through rather than hang it.
                Box::pin(async move { rx.await.unwrap_or(0) })
            }
        }
    }
}

impl Handler<CallOutcome> for RateLimiter {
    type Result = ();
    fn handle(&mut self, msg: CallOutcome, ctx: &mut Self::Context) {
        let now = self.now();
        if msg.throttled {
            if let Some(next) = self.book.on_throttled(msg.class, msg.epoch, now) {
                // The rate changed: the queue's next wake-up moves.
                self.schedule(msg.class, next, ctx);
            }
        } else {
            self.book.on_success(msg.class, msg.epoch, now);
        }
    }
}

impl Handler<GetLimiterSnapshot> for RateLimiter {
    type Result = MessageResult<GetLimiterSnapshot>;
    fn handle(&mut self, _msg: GetLimiterSnapshot, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(LimiterSnapshot { classes: self.book.view() })
    }
}

impl Handler<crate::actors::messages::Busy> for RateLimiter {
    type Result = usize;
    fn handle(&mut self, _msg: crate::actors::messages::Busy, _ctx: &mut Self::Context) -> usize {
        // Waiting calls are counted by whoever waits for them; nothing of its own.
        0
    }
}
