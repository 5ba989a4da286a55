//! The standalone service behind `provisioner serve` (feature `serve`): the provisioner's
//! actors over models kept in a database (SQLite in the data directory, or PostgreSQL with
//! replicas), a simulated cloud in real time whose instances are persisted beside them (or
//! EC2), an HTTP API for operators and the client commands, and Prometheus metrics.
//!
//! Its folders are layers, bottom first; a file imports only from its own layer or lower, and
//! no two files import each other (`tests/layers.rs` checks both; ARCHITECTURE.md, "Service
//! layers", says why):
//!
//! 1. base: [`settings`] (the settings of `serve`, defined once: flags, environment, config
//!    file, defaults; built with the binary even without the service, so that `serve --help`
//!    works in every build), `token` (plain API tokens), [`tls`] (rustls configurations of
//!    `serve` and of the client), `pgconnect` and `pgtls` (connections to PostgreSQL within a
//!    deadline, and TLS to it), `audit` (the audit log of change requests), `telemetry`
//!    (the spans exported as OpenTelemetry traces, feature `otel`);
//! 2. state: `store` (the database, SQLite or PostgreSQL, owned by a store actor on its own
//!    thread, and the model's machine watcher) and `lease` (the leader lease of replicas);
//! 3. parts: `metrics`, `events` (the event streams and their gate), `cloud` (the brokers of
//!    one model: the simulated cloud, start intents, the container initialiser, listings),
//!    `error` ([`ServeError`]) and `datadir` (the data directory and the token file);
//! 4. `runtime`: one model's runtime (its handles, its start and stop, its replica side);
//! 5. `host`: many models per service, an actor given the model starter;
//! 6. `http`: the HTTP layer by role and by URL resource, the JSON bodies shared with the
//!    client ([`wire`]), the OpenAPI document, the dashboard;
//! 7. `serve`: [`serve()`], which wires it all and runs until SIGTERM.
//!
//! Everything is crate-private but what the binary, the tests and embedders use: [`serve()`],
//! [`ServeError`], [`ServeSettings`] and the [`settings`] module, the client's [`wire`] bodies,
//! [`tls`]'s client configuration, and the few items the tests read (`sha256_hex`,
//! `PG_SCHEMA_VERSION`, `audit_epochs`).
#![warn(unreachable_pub)]

#[cfg(feature = "serve")]
pub(crate) mod audit;
#[cfg(feature = "serve")]
pub(crate) mod cloud;
#[cfg(feature = "serve")]
pub(crate) mod datadir;
#[cfg(feature = "serve")]
pub(crate) mod error;
#[cfg(feature = "serve")]
pub(crate) mod events;
#[cfg(feature = "serve")]
pub(crate) mod host;
#[cfg(feature = "serve")]
pub(crate) mod http;
#[cfg(feature = "serve")]
pub(crate) mod lease;
#[cfg(feature = "serve")]
pub(crate) mod metrics;
#[cfg(feature = "postgres")]
pub(crate) mod pgconnect;
#[cfg(feature = "postgres")]
pub(crate) mod pgtls;
#[cfg(feature = "serve")]
pub(crate) mod runtime;
#[cfg(feature = "serve")]
pub(crate) mod serve;
pub mod settings;
#[cfg(feature = "serve")]
pub(crate) mod store;
#[cfg(feature = "otel")]
pub mod telemetry;
#[cfg(feature = "serve")]
pub mod tls;
#[cfg(feature = "serve")]
pub(crate) mod token;

#[cfg(feature = "serve")]
pub use error::{FileOp, ServeError};
#[cfg(feature = "serve")]
pub use http::wire;
#[cfg(feature = "postgres")]
pub use lease::pg::{audit_epochs, EpochAudit};
#[cfg(feature = "serve")]
pub use serve::serve;
pub use settings::{BrokerKind, Ec2Settings, LeaseSettings, LxdSettings, ServeSettings, SettingsError};
#[cfg(feature = "postgres")]
pub use store::PG_SCHEMA_VERSION;
#[cfg(feature = "serve")]
pub use token::sha256_hex;
