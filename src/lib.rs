//! # provisioner
//!
//! A machine provisioner built from actix actors: it keeps a cloud in line with a model of
//! machines, as Juju's provisioner task does, without its races, O(N)-per-event work or
//! leaks.
//!
//! # Layout
//!
//! The public API is what an embedder needs; everything else is crate-private.
//!
//! - [`model`]: the vocabulary every layer shares: identifiers, lives, statuses, constraints
//!   (with their parser in Juju's syntax, `model::constraints`), placement directives and
//!   application names (`model::placement`), harvest modes, cloud instances, and the
//!   [`ProvisionerEvent`]s subscribers hear.
//! - [`config`]: [`ProvisionerConfig`] with Juju's defaults, and the client-side rate limits.
//! - [`ports`]: the [`Broker`] (cloud) and [`ModelApi`] traits an embedder implements.
//! - [`start`] builds the actors and returns a [`ProvisionerHandle`]; [`start_containers`]
//!   runs the lazy container provisioners ([`containers`] has what they are built from); the
//!   handles answer with the read-only views in [`snapshots`].
//! - `actors` (crate-private): the seven actors, one folder each, a thin actix shell over a
//!   plain core (`BatchBook`, `ZoneBook`, `LifecycleBook`, ...) that makes the decisions and is
//!   unit-tested without a runtime, and the wiring that links them.
//! - [`adapters`]: ports implemented for real clouds (`adapters::ec2`, feature `ec2`).
//! - `testing` (feature `test-util`): an in-process fake cloud and fake model for tests, and
//!   `testing::broker_contract`, the suite every broker must pass (run it on your own).
//! - `sim` (feature `sim`): the deterministic simulator behind `provisioner simulate`.
//! - `service` (feature `serve`): the standalone service behind `provisioner serve` (embedded
//!   store, simulated cloud in real time, HTTP API, metrics); its `settings` (the flags and
//!   config file of `serve`) are built with the binary (feature `cli`) alone too.
//!
//! The binary (`src/bin/provisioner/`) is a client of this library like any other.
//!
//! # Example
//!
//! ```no_run
//! # #[cfg(feature = "test-util")]
//! # fn main() {
//! use std::sync::Arc;
//! use provisioner::testing::{FakeCloud, FakeModel};
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

// The simulator (`plan`, `bench`) drives some cores directly: without it they look unused.
#[cfg_attr(not(feature = "sim"), allow(dead_code, unused_imports))]
mod actors;
pub mod adapters;
pub mod config;
pub mod model;
pub mod ports;
#[cfg(feature = "cli")]
pub mod service;
#[cfg(feature = "sim")]
pub mod sim;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod trace;

pub use actors::coordinator::{DestroyError, DestroySummary, MachinesChanged, RetryTick};

pub use actors::wiring::{
    start, start_containers, start_sharing, ContainersHandle, ProvisionerError, ProvisionerHandle, SharedLimiter,
};
pub use config::{Backoff, ConfigError, ProvisionerConfig, RetryStrategy};
pub use model::{
    CloudInstance, Constraints, HarvestMode, InstanceId, Life, Machine, MachineId, MachineStatus, ProvisionerEvent,
};
pub use ports::{Broker, BrokerError, ModelApi, ModelError};
/// The `tracing` target of the spans meant for traces (issue 37): see [`trace`].
pub use trace::TRACE_TARGET;

/// What the lazy container provisioners are built from: the host preparation an embedder
/// plugs in, the broker and provisioner factories, and the supervisors' stages.
pub mod containers {
    pub use crate::actors::containers::supervisor::Stage;
    pub use crate::actors::containers::{
        BrokerFactory, ContainerInitialiser, ContainerProvisioner, HostZoneBroker, InitialiseError, ProvisionerFactory,
        DEFAULT_CONTAINER_TYPES,
    };
}

/// The read-only views of the actors' state that [`ProvisionerHandle`] answers with.
pub mod snapshots {
    pub use crate::actors::lifecycle::Phase;
    pub use crate::actors::limiter::{ClassView, LimiterSnapshot};
    pub use crate::actors::registry::RegistrySnapshot;
    pub use crate::actors::workers::PoolStatus;
    pub use crate::actors::zones::{ZoneSnapshot, ZoneView};
}
