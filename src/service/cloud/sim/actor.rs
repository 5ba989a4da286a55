//! The simulated cloud's actors, thin shells over their plain cores: an account's start bucket
//! ([`AccountBucket`], shared by the models on the account) and one cloud's per-type
//! fail-over ([`TypeMemory`], shared by the clones of its broker).

use actix::prelude::*;

use super::messages::{PickType, TakeStart};
use super::state::SimTypes;
use crate::actors::limiter::TokenBucket;

/// Owns a simulated account's start bucket.
pub(crate) struct AccountBucket {
    bucket: TokenBucket,
    epoch: actix_rt::time::Instant,
}

impl AccountBucket {
    /// Starts an account whose bucket is full now.
    pub(crate) fn start(bucket: TokenBucket) -> Addr<Self> {
        Self::create(|ctx| {
            crate::actors::unlimited_mailbox(ctx);
            Self { bucket, epoch: actix_rt::time::Instant::now() }
        })
    }
}

impl Actor for AccountBucket {
    type Context = Context<Self>;
}

impl Handler<TakeStart> for AccountBucket {
    type Result = bool;
    fn handle(&mut self, _msg: TakeStart, _ctx: &mut Self::Context) -> bool {
        self.bucket.take(self.epoch.elapsed())
    }
}

/// Owns one simulated cloud's per-type fail-over.
pub(crate) struct TypeMemory {
    types: SimTypes,
}

impl TypeMemory {
    /// Starts the fail-over over `types`.
    pub(crate) fn start(types: SimTypes) -> Addr<Self> {
        Self::create(|ctx| {
            crate::actors::unlimited_mailbox(ctx);
            Self { types }
        })
    }
}

impl Actor for TypeMemory {
    type Context = Context<Self>;
}

impl Handler<PickType> for TypeMemory {
    type Result = MessageResult<PickType>;
    fn handle(&mut self, msg: PickType, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.types.pick(msg.now, msg.zone.as_deref(), &msg.token, &msg.candidates))
    }
}
