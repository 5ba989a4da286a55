//! The standalone service behind `provisioner serve` (feature `serve`): the provisioner's
//! actors over a model kept in an embedded SQLite database, a simulated cloud in real time
//! whose instances are persisted beside it, an HTTP API for operators and the client
//! commands, and Prometheus metrics.
//!
//! - [`store`]: the database (one connection, owned by a store actor on its own thread) and
//!   the model's machine watcher.
//! - [`model`]: [`ModelApi`](crate::ports::ModelApi) over the store.
//! - [`simcloud`]: [`Broker`](crate::ports::Broker) over the store: the simulated cloud.
//! - [`events`]: the server-sent event stream of provisioner events.
//! - [`metrics`]: counters, histograms and the text format; the metered broker decorator.
//! - [`api`]: the HTTP API (routes, bearer-token check, JSON types shared with the client).
//! - [`settings`]: the `serve` options: flags, config file, defaults.
//! - [`run`]: [`serve`], which wires it all and runs until SIGTERM.

pub mod api;
pub mod events;
pub mod metrics;
pub mod model;
pub mod run;
pub mod settings;
pub mod simcloud;
pub mod store;

pub use run::{serve, ServeError};
pub use settings::{BrokerKind, Ec2Settings, ServeFlags, ServeOptions};
