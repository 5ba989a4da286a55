//! Why the settings cannot be used: [`SettingsError`], each case bad usage or input.

use std::path::PathBuf;

use thiserror::Error;

use super::lease::LeaseTimingsError;
use crate::config::ConfigError;

/// Why the settings cannot be used. Every case is bad usage or input (the binary exits 2).
#[derive(Debug, Error)]
pub enum SettingsError {
    /// The config file cannot be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not TOML, has an unknown key, or a key has a bad value.
    #[error("{}{}: {}{}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default(),
            key.as_deref().map(|k| format!("{k}: ")).unwrap_or_default(), source.message())]
    File {
        /// The file.
        path: PathBuf,
        /// The line the error is on, where the parser knows it.
        line: Option<usize>,
        /// The key whose value is wrong (`retry.delay`); `None` for a syntax error or an
        /// unknown key (whose message names it).
        key: Option<String>,
        /// The parser's error.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// The worker pool size is out of range.
    #[error("config: {0}")]
    Workers(#[source] ConfigError),
    /// `resync` is zero.
    #[error("config: resync must be positive")]
    ZeroResync,
    /// `[store] threads` is out of range.
    #[error("config: store.threads must be between 1 and 256, got {0}")]
    StoreThreads(u16),
    /// `[audit] files` is zero.
    #[error("config: audit.files must be at least 1, got 0")]
    NoAuditFiles,
    /// `request_deadline` is zero.
    #[error("config: request_deadline must be positive")]
    ZeroRequestDeadline,
    /// An `[events]` limit is zero (`events.max_streams`, ...).
    #[error("config: events.{0} must be positive")]
    ZeroEventsLimit(&'static str),
    /// A `[sim] subnets` entry names no zone, or one the simulated cloud does not have.
    #[error("config: sim.subnets: subnet {subnet:?} must be in one or more of the simulated cloud's zones ({zones}), got {got:?}")]
    SimSubnet {
        /// The subnet.
        subnet: String,
        /// Its zones as given.
        got: Vec<String>,
        /// The cloud's zones.
        zones: String,
    },
    /// The lease's timings are out of order (`lease > renew_deadline > 1.2 × retry`) or zero.
    #[error("{0}")]
    Lease(#[source] LeaseTimingsError),
    /// `--init` with a PostgreSQL store: it recovers a SQLite data directory; a PostgreSQL
    /// database is initialised by the first replica that finds it empty.
    #[error(
        "--init applies to the embedded SQLite store (it makes a new model in a data directory that has none it \
         can use); with --store postgres://... the first replica to find the database empty creates the model, \
         and a database that holds one is never replaced: drop it or name another database to start afresh"
    )]
    InitWithPostgres,
    /// Only one of `--tls-cert` and `--tls-key` is given.
    #[error(
        "--tls-cert and --tls-key go together: give both (a PEM certificate chain and its PEM private key) or neither"
    )]
    TlsPair,
    /// A non-loopback listen address without TLS and without `--insecure-http`.
    #[error(
        "refusing to listen on {listen} without TLS: the API token and every request would cross the network in \
         clear text. Give --tls-cert FILE --tls-key FILE, or --insecure-http to serve plain HTTP anyway (e.g. \
         behind a TLS-terminating proxy)"
    )]
    InsecureListen {
        /// The listen address.
        listen: String,
    },
    /// The matches given to [`ServeSettings::load`](super::ServeSettings::load) are not those of these settings' arguments
    /// (a mistake of the caller, not of the user).
    #[error("the arguments do not match the serve settings: {0}")]
    Arguments(#[source] Box<clap::Error>),
}
