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
//! - `cloud`: the brokers of one model: the simulated cloud over the store (`cloud::sim`),
//!   the start intents of a real cloud (`cloud::intents`), the simulated container
//!   initialiser (`cloud::initialiser`), and a real cloud's listings (`cloud::listing`).
//! - `events`: the server-sent event stream of provisioner events, and the gate that caps the
//!   streams and ends a revoked token's.
//! - `metrics`: counters, histograms and the text format; the metered broker decorator.
//! - `http`: the HTTP layer, by role (routes and the app, errors, the bearer check, bodies) and
//!   by URL resource (machines, applications, config, status, models, tokens, events, metrics,
//!   health), the JSON bodies shared with the client (`http::wire`), the OpenAPI document, and
//!   the dashboard at `GET /` (`http::dashboard`: its HTML, CSS and JavaScript embedded).
//! - [`lease`]: the leader lease of replicas on PostgreSQL: its plain core (built with the
//!   binary, for the settings) and its SQL (feature `postgres`).
//! - `pgconnect` (feature `postgres`): connections to PostgreSQL within a deadline, start-up
//!   included, for the store, the lease and the listener.
//! - `pgtls` (feature `postgres`): TLS to PostgreSQL, the store URL's `sslmode` and
//!   `sslrootcert` for every connection.
//! - `runtime`: one model's runtime ([`runtime::ModelRuntime`]: its store, cloud,
//!   provisioners, metrics and event streams), below the HTTP layer; `StoreModel`, the engine's
//!   [`ModelApi`](crate::ports::ModelApi) over the store.
//! - `serve`: [`serve()`], which wires it all and runs until SIGTERM (the top of the service:
//!   it alone may import the HTTP layer and every other).
//! - `tls`: the rustls configurations of `serve --tls-cert/--tls-key` and of the client's
//!   `--ca-cert`, read from PEM files and checked.

#[cfg(feature = "serve")]
pub mod audit;
#[cfg(feature = "serve")]
pub mod cloud;
#[cfg(feature = "serve")]
pub mod datadir;
#[cfg(feature = "serve")]
pub mod error;
#[cfg(feature = "serve")]
pub mod events;
#[cfg(feature = "serve")]
pub mod host;
#[cfg(feature = "serve")]
pub mod http;
pub mod lease;
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
pub mod store;
#[cfg(feature = "serve")]
pub mod tls;
#[cfg(feature = "serve")]
pub mod token;

#[cfg(feature = "serve")]
pub use error::ServeError;
#[cfg(feature = "serve")]
pub use serve::serve;
pub use settings::{BrokerKind, Ec2Settings, LeaseSettings, ServeSettings, SettingsError};
