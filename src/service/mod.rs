//! The standalone service behind `provisioner serve` (feature `serve`): the provisioner's
//! actors over a model kept in an embedded SQLite database, a simulated cloud in real time
//! whose instances are persisted beside it, an HTTP API for operators and the client
//! commands, and Prometheus metrics.
//!
//! - [`settings`]: the settings of `serve`, defined once (flags, environment, config file,
//!   defaults). Built with the binary (feature `cli`) even without the service, so that
//!   `serve --help` works in every build.
//! - `store`: the database (one connection, owned by a store actor on its own thread) and
//!   the model's machine watcher; the `StoreBackend` trait with its two implementations,
//!   SQLite in the data directory (the default) and PostgreSQL (`--store postgres://...`,
//!   feature `postgres`).
//! - `error`: [`ServeError`], the service's error type (why it could not start or run, and its
//!   exit code), and the file operations on the data directory it names.
//! - `datadir`: the data directory and its token file (whether a directory may be opened as it
//!   is; the API token read or created).
//! - `token`: API tokens, plain: the admin token and scoped tokens (`admin`, `read-only`),
//!   their hashes (SHA-256, compared in constant time) and what each scope may do.
//! - `audit`: the audit log of change requests (JSON lines in a file, and `audit` tracing
//!   events).
//! - `host`: many models per service (the model host): the models directory (plain), where it is kept, and
//!   the running models the API looks up by name.
//! - `simcloud`: [`Broker`](crate::ports::Broker) over the store: the simulated cloud.
//! - `events`: the server-sent event stream of provisioner events, and the gate that caps the
//!   streams and ends a revoked token's (`streams`: its plain core).
//! - `intents`: the broker decorator that writes each start's client token and parameters
//!   before a real cloud's call, and repeats the unsettled ones before a provisioner starts.
//! - `initialiser`: the simulated container initialiser (delay and fault injection) that the
//!   container provisioners run with beside the simulated cloud.
//! - `metrics`: counters, histograms and the text format; the metered broker decorator.
//! - `api`: the HTTP API (routes, bearer-token check, JSON types shared with the client).
//! - `dashboard`: the dashboard at `GET /`, its HTML, CSS and JavaScript embedded.
//! - [`lease`]: the leader lease of replicas on PostgreSQL: its plain core (built with the
//!   binary, for the settings) and its SQL (feature `postgres`).
//! - `pgconnect` (feature `postgres`): connections to PostgreSQL within a deadline, start-up
//!   included, for the store, the lease and the listener.
//! - `pgtls` (feature `postgres`): TLS to PostgreSQL, the store URL's `sslmode` and
//!   `sslrootcert` for every connection.
//! - `listing`: a real cloud's instances as readers see them: served from the listings made,
//!   with their age (no reader drives the cloud's API).
//! - `runtime`: one model's runtime ([`runtime::ModelRuntime`]: its store, cloud,
//!   provisioners, metrics and event streams), below the HTTP layer; `StoreModel`, the engine's
//!   [`ModelApi`](crate::ports::ModelApi) over the store.
//! - `serve`: [`serve()`], which wires it all and runs until SIGTERM (the top of the service:
//!   it alone may import the HTTP layer and every other).
//! - `tls`: the rustls configurations of `serve --tls-cert/--tls-key` and of the client's
//!   `--ca-cert`, read from PEM files and checked.

#[cfg(feature = "serve")]
pub mod api;
#[cfg(feature = "serve")]
pub mod audit;
#[cfg(feature = "serve")]
pub mod dashboard;
#[cfg(feature = "serve")]
pub mod datadir;
#[cfg(feature = "serve")]
pub mod error;
#[cfg(feature = "serve")]
pub mod events;
#[cfg(feature = "serve")]
pub mod host;
#[cfg(feature = "serve")]
pub mod initialiser;
#[cfg(feature = "serve")]
pub mod intents;
pub mod lease;
#[cfg(feature = "serve")]
pub mod listing;
#[cfg(feature = "serve")]
pub mod metrics;
#[cfg(feature = "postgres")]
pub mod pgconnect;
#[cfg(feature = "postgres")]
pub mod pgtls;
#[cfg(feature = "serve")]
pub mod runtime;
#[cfg(feature = "serve")]
pub mod serve;
pub mod settings;
#[cfg(feature = "serve")]
pub mod simcloud;
#[cfg(feature = "serve")]
pub mod store;
#[cfg(feature = "serve")]
pub mod streams;
#[cfg(feature = "serve")]
pub mod tls;
#[cfg(feature = "serve")]
pub mod token;

#[cfg(feature = "serve")]
pub use error::ServeError;
#[cfg(feature = "serve")]
pub use serve::serve;
pub use settings::{BrokerKind, Ec2Settings, LeaseSettings, ServeSettings, SettingsError};
