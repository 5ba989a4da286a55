//! The provisioner's actors: one folder each (`mod.rs`, `actor.rs`, `messages.rs`, `state.rs`,
//! `tests.rs`), each a thin actix shell over a plain core that makes its decisions.
//!
//! - [`coordinator`]: the front door; batches notifications and sequences the others.
//! - [`registry`]: the machine cache and the cloud's instance view; classification.
//! - [`zones`]: the availability-zone allocator.
//! - [`harvest`]: the harvest policy (mode, safe mode, released instances).
//! - [`interruptions`]: the interruption poller (issue 33), when the cloud warns of them.
//! - [`lifecycle`]: each machine's starting / stop-deferred / running / stopping phase.
//! - [`workers`]: the resizable broker worker pool and the start retry procedure.
//! - [`limiter`]: the client-side rate limiter and the broker decorator that waits on it.
//! - [`containers`]: lazy container provisioners (a manager, and a supervisor per host and
//!   container type running a provisioner scoped to those containers).
//! - [`messages`]: `Shutdown` and `Busy`, which every actor handles.
//! - [`wiring`]: the only place actors are created and linked.
//!
//! Everything in here is crate-private: embedders reach it through [`crate::start`], the
//! [`crate::ProvisionerHandle`] and the items the crate root re-exports.

pub mod containers;
pub mod coordinator;
pub mod harvest;
pub mod interruptions;
pub mod lifecycle;
pub mod limiter;
pub mod messages;
pub mod registry;
pub mod wiring;
pub mod work;
pub mod workers;
pub mod zones;

use messages::Shutdown;

/// The mailbox capacity every actor sets when started: more messages than its senders ever
/// queue (actix's largest capacity is far above it, but `usize::MAX` overflows its arithmetic).
const MAILBOX_CAPACITY: usize = 1 << 20;

/// Lifts the limit of an actor's mailbox (its first act when started). actix holds 16 queued
/// messages by default, and a request that finds the mailbox full parks its sender, which
/// sends again when woken: an allocation, a wake-up and a poll more per request. With up to
/// `max_workers` starts asking one actor at once, most requests did. The senders are bounded
/// (the workers, the coordinator, the handles), so the queue is too.
pub(crate) fn unlimited_mailbox<A>(ctx: &mut actix::Context<A>)
where
    A: actix::Actor<Context = actix::Context<A>>,
{
    ctx.set_mailbox_capacity(MAILBOX_CAPACITY);
}

macro_rules! handle_shutdown {
    ($($actor:ty),*) => {$(
        impl actix::Handler<Shutdown> for $actor {
            type Result = ();
            fn handle(&mut self, _msg: Shutdown, ctx: &mut Self::Context) {
                actix::ActorContext::stop(ctx);
            }
        }
    )*};
}
handle_shutdown!(
    coordinator::Coordinator,
    registry::MachineRegistry,
    zones::ZoneAllocator,
    harvest::HarvestPolicy,
    lifecycle::MachineLifecycle,
    limiter::RateLimiter,
    interruptions::InterruptionPoller,
    workers::WorkerPool
);

#[cfg(test)]
mod tests {
    use actix::Actor;

    use super::lifecycle::{MachineLifecycle, StillWanted};
    use crate::model::MachineId;

    #[test]
    fn a_started_actor_queues_more_requests_than_actixs_default_mailbox_holds() {
        actix_rt::System::new().block_on(async {
            let lifecycle = MachineLifecycle::new().start();
            // Answered once the actor has started (and set its mailbox's capacity).
            lifecycle.send(StillWanted { machine: MachineId::new("0") }).await.expect("the lifecycle runs");
            // As many requests as 100 workers make at once, queued without yielding: with
            // actix's default capacity (16), the 18th is refused as full.
            for i in 1..=100 {
                let ask = StillWanted { machine: MachineId::new(i.to_string()) };
                assert!(lifecycle.try_send(ask).is_ok(), "request {i} found the mailbox full");
            }
        });
    }
}
