//! The provisioner's actors: one folder each (`mod.rs`, `actor.rs`, `messages.rs`, `state.rs`,
//! `tests.rs`), each a thin actix shell over a plain core that makes its decisions.
//!
//! - [`coordinator`]: the front door; batches notifications and sequences the others.
//! - [`registry`]: the machine cache and the cloud's instance view; classification.
//! - [`zones`]: the availability-zone allocator.
//! - [`harvest`]: the harvest policy (mode, safe mode, released instances).
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
pub mod lifecycle;
pub mod limiter;
pub mod messages;
pub mod registry;
pub mod wiring;
pub mod work;
pub mod workers;
pub mod zones;

use messages::Shutdown;

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
    workers::WorkerPool
);
