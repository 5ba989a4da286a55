//! # provisioner
//!
//! A machine provisioner built from actix actors: it keeps a cloud in line with a model of
//! machines, as Juju's provisioner task does, without its races, O(N)-per-event work or
//! leaks.
//!
//! # Layout
//!
//! - [`actor_messages`]: `Shutdown` and `Busy`, which every actor handles.
//! - [`types`]: identifiers, lives, statuses, constraints, harvest modes, cloud instances.
//! - [`rate_limits`]: the client-side rate limits as configured (enforced by `limiter`).
//! - [`ports`]: the [`Broker`] (cloud) and [`ModelApi`] traits
//!   an embedder implements.
//! - The actors, one folder each (`mod.rs`, `actor.rs`, `messages.rs`, `state.rs`, tests):
//!   - [`coordinator`]: the front door; batches notifications and sequences the others.
//!   - [`registry`]: the machine cache and the cloud's instance view; classification.
//!   - [`zones`]: the availability-zone allocator.
//!   - [`harvest`]: the harvest policy (mode, safe mode, released instances).
//!   - [`lifecycle`]: each machine's starting / stop-deferred / running / stopping phase.
//!   - [`workers`]: the resizable broker worker pool and the start retry procedure.
//! - [`wiring`]: [`start`] builds and links the actors and returns a [`ProvisionerHandle`].
//! - [`containers`]: lazy container provisioners (a manager, and a supervisor per host and
//!   container type running a provisioner scoped to those containers).
//! - [`events`]: what subscribers hear.
//! - `fake` (feature `test-util`): an in-process fake cloud and fake model, for tests, and
//!   `fake::broker_contract`, the suite every broker must pass (run it on your own).
//! - `sim` (feature `sim`): the deterministic simulator behind `provisioner simulate`.
//! - `service` (feature `serve`): the standalone service behind `provisioner serve` (embedded
//!   store, simulated cloud in real time, HTTP API, metrics); its `settings` (the flags and
//!   config file of `serve`) are built with the binary (feature `cli`) alone too.
//!
//! Each actor is a thin shell over a plain struct (`ZoneBook`, `LifecycleBook`, ...) that holds
//! its decisions and is unit-tested without a runtime.
//!
//! # Example
//!
//! ```no_run
//! # #[cfg(feature = "test-util")]
//! # fn main() {
//! use std::sync::Arc;
//! use provisioner::fake::{FakeCloud, FakeModel};
//! use provisioner::{start, ProvisionerConfig, Machine};
//!
//! actix::System::new().block_on(async {
//!     let config = ProvisionerConfig::default();
//!     let cloud = FakeCloud::with_zones(&config.model_uuid, &["az1", "az2"]);
//!     let model = FakeModel::new(vec![Machine::pending("0")]);
//!     let handle = start(config, Arc::new(cloud.broker()), Arc::new(model.api())).unwrap();
//!     model.watch(handle.machines_changed());
//! });
//! # }
//! # #[cfg(not(feature = "test-util"))]
//! # fn main() {}
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod actor_messages;
pub mod config;
pub mod containers;
pub mod coordinator;
#[cfg(feature = "ec2")]
pub mod ec2;
pub mod events;
#[cfg(feature = "test-util")]
pub mod fake;
pub mod harvest;
pub mod lifecycle;
pub mod limiter;
pub mod ports;
pub mod rate_limits;
pub mod registry;
#[cfg(feature = "cli")]
pub mod service;
#[cfg(feature = "sim")]
pub mod sim;
pub mod types;
pub mod wiring;
pub mod workers;
pub mod zones;

pub use config::{Backoff, ConfigError, ProvisionerConfig, RetryStrategy};
pub use events::ProvisionerEvent;
pub use ports::{Broker, BrokerError, ModelApi, ModelError};
pub use types::{CloudInstance, Constraints, HarvestMode, InstanceId, Life, Machine, MachineId, MachineStatus};
pub use wiring::{start, start_containers, ContainersHandle, ProvisionerError, ProvisionerHandle};

pub use actor_messages::{Busy, Shutdown};

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
