//! The settings of `provisioner serve`, defined once: [`ServeSettings`] is both the clap
//! arguments of `serve` (each flag with its `PROVISIONER_...` environment variable) and the
//! serde shape of the TOML config file. Layers, highest first: a flag, its environment
//! variable, the config file, the defaults. Model settings changed at run time with
//! `provisioner config set` (harvest mode, workers) are kept in the database and win over the
//! file at the next start.
//!
//! How the layers are merged: the file is deserialised into a `ServeSettings` whose missing
//! keys take the defaults (serde's container `default`), then clap's
//! [`FromArgMatches::update_from_arg_matches`] overwrites exactly the fields whose flag or
//! environment variable was given (clap's own precedence puts a flag over its variable).
//! Keys with no flag (`workers`, `resync`, `[retry]`, ...) are `#[arg(skip)]`; flags with no
//! key (`--config`, `--init`) are `#[serde(skip)]`.
//!
//! This module is built with the binary (feature `cli`) even without the service, so that
//! `provisioner serve --help` lists the flags in every build.
//!
//! - `parse`: the values' syntax (durations, sizes, zone lists) and serde's helpers for them.
//! - `sections`: `[events]`, `[retry]`, `[ec2]` and `[audit]`.
//! - `sim`: `[sim]`, the simulated cloud.
//! - `lease`: `[lease]` and the checked [`LeaseTimings`] the lease runs with.
//! - `store`: `[store]`, the store's URL (SQLite or PostgreSQL) and its redaction.

mod lease;
mod parse;
mod sections;
mod sim;
mod store;
#[cfg(test)]
mod tests;

mod errors;
pub use errors::SettingsError;
pub use lease::{LeaseSettings, LeaseTimings, LeaseTimingsError, DEFAULT_LEASE, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY};
pub use parse::{is_loopback, parse_duration, ZoneList};
pub use sections::{
    AuditSection, Ec2Settings, EventsSettings, LxdSettings, RetrySettings, DEFAULT_MAX_STREAMS,
    DEFAULT_MAX_STREAMS_PER_TOKEN, DEFAULT_STREAM_IDLE_TIMEOUT,
};
pub use sim::{SimSection, DEFAULT_SIM_CONTAINER_INIT_DELAY, DEFAULT_SIM_START_LATENCY, DEFAULT_SIM_ZONES};
pub use store::{StoreSection, StoreUrl, DEFAULT_STORE_THREADS};

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{ArgMatches, Args, FromArgMatches, ValueEnum};
use serde::Deserialize;

use crate::config::{DEFAULT_RESYNC_INTERVAL, DEFAULT_WORKERS, MAX_WORKERS};
use crate::model::HarvestMode;

use parse::{duration, from_str};

/// The default data directory.
pub const DEFAULT_DATA_DIR: &str = "./provisioner-data";
/// The audit log's file name in the data directory, by default.
pub const DEFAULT_AUDIT_FILE: &str = "audit.log";
/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// How long a graceful shutdown waits for in-flight cloud calls by default.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// The longest an HTTP request waits for its answer by default: longer than one database
/// call may take (`store::pg::STATEMENT_DEADLINE` and its slack), so that a store that can
/// say why it failed says so first.
pub const DEFAULT_REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// Which cloud the service drives. (The values carry no help of their own in `--help`: the
/// flag's says what they mean, on one line.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BrokerKind {
    /// The simulated cloud, in real time, persisted in the data directory.
    #[default]
    #[value(help = None::<&str>)]
    Sim,
    /// EC2 (a build with the `ec2` feature).
    #[value(help = None::<&str>)]
    Ec2,
    /// LXD: containers on a daemon or a cluster (`--lxd-...`).
    #[value(help = None::<&str>)]
    Lxd,
}

/// Every setting of `provisioner serve`: the flags and the config file's keys (doc comments
/// of flags are their `--help`).
#[derive(Debug, Clone, PartialEq, Eq, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeSettings {
    /// A TOML config file (keys mirror the flags; see docs/operator-guide.md, "Config file").
    #[arg(long, env = "PROVISIONER_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Where the database and the API token live [default: ./provisioner-data].
    #[arg(long, env = "PROVISIONER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The HTTP API's address [default: 127.0.0.1:7878].
    #[arg(long, env = "PROVISIONER_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// The cloud: `sim` (simulated, in real time, persisted in DIR), `ec2` or `lxd`
    /// [default: sim].
    #[arg(long, env = "PROVISIONER_BROKER", value_name = "sim|ec2|lxd", value_enum)]
    pub broker: Option<BrokerKind>,
    /// Initial harvest mode (a value set with `config set` wins); case-insensitive.
    #[arg(skip)]
    #[serde(deserialize_with = "from_str")]
    pub harvest_mode: HarvestMode,
    /// Initial worker pool size (a value set with `config set` wins).
    #[arg(skip = DEFAULT_WORKERS)]
    pub workers: usize,
    /// Interval between full cloud listings.
    #[arg(skip = DEFAULT_RESYNC_INTERVAL)]
    #[serde(deserialize_with = "duration")]
    pub resync: Duration,
    /// How young an unknown instance (one of ours no machine owns) is spared by harvests
    /// (file only: `harvest_grace`): a start whose result is not recorded yet is not taken
    /// for an orphan.
    #[arg(skip = crate::config::DEFAULT_HARVEST_GRACE)]
    #[serde(deserialize_with = "duration")]
    pub harvest_grace: Duration,
    /// The most a spot start pays, in USD per hour (file only: `spot_max_price`; issue 33):
    /// handed to the broker with every spot call, a spot price above it counts as no spot
    /// capacity. Unset: no maximum of ours.
    #[arg(skip)]
    pub spot_max_price: Option<crate::model::UsdPerHour>,
    /// How long SIGTERM waits for in-flight cloud calls.
    #[arg(skip = DEFAULT_SHUTDOWN_GRACE)]
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// The longest an HTTP request waits for its answer (file only: `request_deadline`): past
    /// it the API answers 503 (the database may be unreachable or slow), so that no caller
    /// hangs on a store that cannot answer.
    #[arg(skip = DEFAULT_REQUEST_DEADLINE)]
    #[serde(deserialize_with = "duration")]
    pub request_deadline: Duration,
    /// The event streams' limits (`[events]`, file only).
    #[arg(skip)]
    pub events: EventsSettings,
    /// StartInstance retries (`[retry]`).
    #[arg(skip)]
    pub retry: RetrySettings,
    /// The simulated cloud (`[sim]`, `--sim-...`).
    #[command(flatten)]
    pub sim: SimSection,
    /// The EC2 broker (`[ec2]`, `--ec2-...`, `--region`).
    #[command(flatten)]
    pub ec2: Ec2Settings,
    /// The LXD broker (`[lxd]`, `--lxd-...`).
    #[command(flatten)]
    pub lxd: LxdSettings,
    /// The leader lease of replicas on PostgreSQL (`[lease]`, `--lease...`, `--replica-id`).
    #[command(flatten)]
    pub lease: LeaseSettings,
    /// Where the model lives (`[store]`, `--store`).
    #[command(flatten)]
    pub store: StoreSection,
    /// The audit log of change requests (`[audit]`, `--audit-log`).
    #[command(flatten)]
    pub audit: AuditSection,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key).
    #[arg(long, env = "PROVISIONER_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "PROVISIONER_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a non-loopback address (refused without it: the API token would
    /// cross the network in clear text).
    // An `Option` (no clap default), so that the file's value stands unless the flag or its
    // variable is given.
    #[arg(long, env = "PROVISIONER_INSECURE_HTTP", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub insecure_http: Option<bool>,
    /// Export the service's spans as OpenTelemetry traces (OTLP over HTTP, protobuf) to this
    /// collector: a base URL (`/v1/traces` is added) or the whole traces URL. Else the standard
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`; none: no export. A
    /// build with the `otel` feature.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Create a new model where the data directory has none it can use: a database that is
    /// empty or missing next to an old run's WAL or token (the old model's instances in the
    /// cloud are no longer managed). Refused where a database is there. Without it, a new model
    /// is created only in an empty data directory. (No environment variable: it must be asked
    /// for on purpose, once.)
    #[arg(long)]
    #[serde(skip)]
    pub init: bool,
}

impl Default for ServeSettings {
    fn default() -> Self {
        Self {
            config: None,
            data_dir: None,
            listen: None,
            broker: None,
            harvest_mode: HarvestMode::default(),
            workers: DEFAULT_WORKERS,
            resync: DEFAULT_RESYNC_INTERVAL,
            harvest_grace: crate::config::DEFAULT_HARVEST_GRACE,
            spot_max_price: None,
            otlp_endpoint: None,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            request_deadline: DEFAULT_REQUEST_DEADLINE,
            events: EventsSettings::default(),
            retry: RetrySettings::default(),
            sim: SimSection::default(),
            ec2: Ec2Settings::default(),
            lxd: LxdSettings::default(),
            lease: LeaseSettings::default(),
            store: StoreSection::default(),
            audit: AuditSection::default(),
            tls_cert: None,
            tls_key: None,
            insecure_http: None,
            init: false,
        }
    }
}

impl ServeSettings {
    /// The settings `serve` runs with: the file named by `--config` (or its variable), if
    /// any, under the flags and variables in `matches` (the `serve` subcommand's), over the
    /// defaults; then checked.
    pub fn load(matches: &ArgMatches) -> Result<Self, SettingsError> {
        let arguments = |e| SettingsError::Arguments(Box::new(e));
        let flags = Self::from_arg_matches(matches).map_err(arguments)?;
        let mut settings = match &flags.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| SettingsError::Read { path: path.clone(), source })?;
                Self::from_file(path, &text)?
            }
            None => flags,
        };
        settings.update_from_arg_matches(matches).map_err(arguments)?;
        settings.check()?;
        Ok(settings)
    }

    /// Parses a config file's text (`path` names it in errors).
    pub fn from_file(path: &Path, text: &str) -> Result<Self, SettingsError> {
        serde_path_to_error::deserialize(
            toml::Deserializer::parse(text).map_err(|source| file_error(path, text, None, source))?,
        )
        .map_err(|e| {
            let key = e.path().to_string();
            let key = (key != ".").then_some(key);
            file_error(path, text, key, e.into_inner())
        })
    }

    fn check(&self) -> Result<(), SettingsError> {
        crate::config::validate_workers(self.workers, MAX_WORKERS).map_err(SettingsError::Workers)?;
        if self.resync.is_zero() {
            return Err(SettingsError::ZeroResync);
        }
        if let Some(n @ (0 | 257..)) = self.store.threads {
            return Err(SettingsError::StoreThreads(n));
        }
        if self.audit.files == Some(0) {
            return Err(SettingsError::NoAuditFiles);
        }
        if self.request_deadline.is_zero() {
            return Err(SettingsError::ZeroRequestDeadline);
        }
        self.events.check()?;
        self.sim.check_subnets()?;
        self.lease.timings().map_err(SettingsError::Lease)?;
        if self.init && matches!(self.store.url(), StoreUrl::Postgres(_)) {
            return Err(SettingsError::InitWithPostgres);
        }
        self.check_tls()?;
        Ok(())
    }

    fn check_tls(&self) -> Result<(), SettingsError> {
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(SettingsError::TlsPair);
        }
        if self.tls_files().is_none() && self.insecure_http != Some(true) && !is_loopback(self.listen()) {
            return Err(SettingsError::InsecureListen { listen: self.listen().to_owned() });
        }
        Ok(())
    }

    /// The TLS certificate and key files, when the API is served over HTTPS.
    pub fn tls_files(&self) -> Option<(&Path, &Path)> {
        Some((self.tls_cert.as_deref()?, self.tls_key.as_deref()?))
    }

    /// The data directory (database, token).
    pub fn data_dir(&self) -> &Path {
        self.data_dir.as_deref().unwrap_or(Path::new(DEFAULT_DATA_DIR))
    }

    /// The audit log's file: `--audit-log`, else `DATA_DIR/audit.log`.
    pub fn audit_log(&self) -> PathBuf {
        self.audit.file.clone().unwrap_or_else(|| self.data_dir().join(DEFAULT_AUDIT_FILE))
    }

    /// The HTTP listen address.
    pub fn listen(&self) -> &str {
        self.listen.as_deref().unwrap_or(DEFAULT_LISTEN)
    }

    /// The cloud.
    pub fn broker(&self) -> BrokerKind {
        self.broker.unwrap_or_default()
    }
}

fn file_error(path: &Path, text: &str, key: Option<String>, source: toml::de::Error) -> SettingsError {
    let line = source.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
    // An unknown key's message names it already (and the path would end at its parent).
    let key = key.filter(|_| !source.message().starts_with("unknown field"));
    SettingsError::File { path: path.to_owned(), line, key, source: Box::new(source) }
}
