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

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::{ArgMatches, Args, FromArgMatches, ValueEnum};
use serde::{Deserialize, Deserializer};
use thiserror::Error;

use crate::config::{ConfigError, RetryStrategy, DEFAULT_RESYNC_INTERVAL, DEFAULT_WORKERS, MAX_WORKERS};
use crate::model::HarvestMode;
use crate::service::lease::{LeaseTimings, LeaseTimingsError};

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
/// The most event streams (`/v1/events`) one API token may hold open on a replica by default.
pub const DEFAULT_MAX_STREAMS_PER_TOKEN: usize = 8;
/// The most event streams a replica holds open, all tokens together, by default.
pub const DEFAULT_MAX_STREAMS: usize = 256;
/// How long an event stream may go without a frame written to its client (frames waiting)
/// before the client is dropped, by default.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The simulated cloud's zones by default.
pub const DEFAULT_SIM_ZONES: [&str; 3] = ["az1", "az2", "az3"];
/// How long a simulated start takes by default.
pub const DEFAULT_SIM_START_LATENCY: Duration = Duration::from_secs(2);
/// How long the simulated preparation of a host for containers takes by default.
pub const DEFAULT_SIM_CONTAINER_INIT_DELAY: Duration = Duration::from_secs(1);

/// Parses a duration as every flag and config key spells it (humantime: `500ms`, `2s`, `1m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// A list of zones; on the command line comma-separated, blanks dropped (`""`: no zones).
/// (A named type, so that clap takes it as one value, not as a repeated flag.)
pub type ZoneList = Vec<String>;

fn parse_zone_list(s: &str) -> Result<ZoneList, String> {
    Ok(s.split(',').map(|z| z.trim().to_owned()).filter(|z| !z.is_empty()).collect())
}

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
}

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
    /// The matches given to [`ServeSettings::load`] are not those of these settings' arguments
    /// (a mistake of the caller, not of the user).
    #[error("the arguments do not match the serve settings: {0}")]
    Arguments(#[source] Box<clap::Error>),
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
    /// The cloud: `sim` (simulated, in real time, persisted in DIR) or `ec2` [default: sim].
    #[arg(long, env = "PROVISIONER_BROKER", value_name = "sim|ec2", value_enum)]
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
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            request_deadline: DEFAULT_REQUEST_DEADLINE,
            events: EventsSettings::default(),
            retry: RetrySettings::default(),
            sim: SimSection::default(),
            ec2: Ec2Settings::default(),
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

/// The event streams' limits (`[events]` in the config file): each replica's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsSettings {
    /// The most streams one API token may hold open (beyond it: 429).
    pub max_streams_per_token: usize,
    /// The most streams open, all tokens together (beyond it: 429).
    pub max_streams: usize,
    /// A client none of whose waiting frames could be written for this long is dropped.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
}

impl Default for EventsSettings {
    fn default() -> Self {
        Self {
            max_streams_per_token: DEFAULT_MAX_STREAMS_PER_TOKEN,
            max_streams: DEFAULT_MAX_STREAMS,
            idle_timeout: DEFAULT_STREAM_IDLE_TIMEOUT,
        }
    }
}

impl EventsSettings {
    fn check(&self) -> Result<(), SettingsError> {
        for (key, zero) in [
            ("max_streams_per_token", self.max_streams_per_token == 0),
            ("max_streams", self.max_streams == 0),
            ("idle_timeout", self.idle_timeout.is_zero()),
        ] {
            if zero {
                return Err(SettingsError::ZeroEventsLimit(key));
            }
        }
        Ok(())
    }
}

/// StartInstance retries (`[retry]` in the config file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySettings {
    /// Extra rounds after the first.
    pub count: u32,
    /// Base delay before a new round.
    #[serde(deserialize_with = "duration")]
    pub delay: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        let r = RetryStrategy::default();
        Self { count: r.count, delay: r.delay }
    }
}

impl RetrySettings {
    /// The retry strategy (the delay's cap is the default one).
    pub fn strategy(&self) -> RetryStrategy {
        RetryStrategy { count: self.count, delay: self.delay, ..RetryStrategy::default() }
    }
}

/// The simulated cloud (`[sim]`, `--sim-zones`, `--sim-start-latency`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimSection {
    /// The simulated cloud's zones, comma-separated (empty: no zones) [default: az1,az2,az3].
    #[arg(id = "sim_zones", long = "sim-zones", env = "PROVISIONER_SIM_ZONES", value_name = "a,b,c",
          value_parser = parse_zone_list)]
    pub zones: Option<ZoneList>,
    /// Zones listed but refusing starts.
    #[arg(skip)]
    pub unavailable_zones: Vec<String>,
    /// How long a simulated start takes, e.g. 2s or 500ms [default: 2s].
    #[arg(id = "sim_start_latency", long = "sim-start-latency", env = "PROVISIONER_SIM_START_LATENCY",
          value_name = "DUR", value_parser = parse_duration)]
    #[serde(deserialize_with = "optional_duration")]
    pub start_latency: Option<Duration>,
    /// How long a simulated stop takes.
    #[arg(skip)]
    #[serde(deserialize_with = "duration")]
    pub stop_latency: Duration,
    /// The simulated cloud's subnets and the zones each is in (`--to subnet=ID`); by default
    /// one per zone, `subnet-ZONE` in `ZONE`.
    #[arg(skip)]
    #[serde(default)]
    pub subnets: Option<std::collections::BTreeMap<String, Vec<String>>>,
    /// How long preparing a host for containers of a type takes (the simulated initialiser
    /// run before a host's first container of that type starts), e.g. 2s [default: 1s].
    #[arg(id = "sim_container_init_delay", long = "sim-container-init-delay",
          env = "PROVISIONER_SIM_CONTAINER_INIT_DELAY", value_name = "DUR", value_parser = parse_duration)]
    #[serde(deserialize_with = "optional_duration")]
    pub container_init_delay: Option<Duration>,
    /// Fault injection: the first N preparations of each host for each container type fail
    /// (retried with backoff, shown on the containers' status; 6 failures in a row give up)
    /// [default: 0].
    #[arg(
        id = "sim_container_init_failures",
        long = "sim-container-init-failures",
        env = "PROVISIONER_SIM_CONTAINER_INIT_FAILURES",
        value_name = "N"
    )]
    pub container_init_failures: Option<u32>,
    /// Fault injection: the first N start calls the simulated cloud gets after the service
    /// starts are refused with a zone-independent error (each uses a retry round; with
    /// `[retry] count = 0` its machine ends in provisioning error, which `machine retry` then
    /// provisions) [default: 0].
    #[arg(
        id = "sim_start_failures",
        long = "sim-start-failures",
        env = "PROVISIONER_SIM_START_FAILURES",
        value_name = "N"
    )]
    pub start_failures: Option<u32>,
    /// Each simulated account's start rate: the starts per second (and at once) it takes from
    /// all the models on it together, refusing more as throttled; the models on one account
    /// share one client-side limiter of that size [default: no limit, no client-side limiter].
    #[arg(id = "sim_account_start_rate", long = "sim-account-start-rate",
          env = "PROVISIONER_SIM_ACCOUNT_START_RATE", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub account_start_rate: Option<u32>,
    /// The instance type of machines without hardware constraints (file only; unset: no type).
    #[arg(skip)]
    pub instance_type: Option<String>,
    /// `TYPE:ZONE` pairs out of capacity (file only): starts try the next fitting type there.
    #[arg(skip)]
    pub out_of_capacity: Vec<String>,
}

/// The EC2 broker's settings (used with `--broker ec2`; credentials come from the standard AWS
/// chain, never from here).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ec2Settings {
    /// EC2: an EC2-compatible endpoint instead of AWS's (with `--broker ec2`; needs a build
    /// with the `ec2` feature). Credentials come from the standard AWS chain.
    #[arg(id = "ec2_endpoint", long = "ec2-endpoint", env = "PROVISIONER_EC2_ENDPOINT", value_name = "URL")]
    pub endpoint: Option<String>,
    /// EC2: the region.
    #[arg(long, env = "AWS_REGION")]
    pub region: Option<String>,
    /// EC2: the image.
    #[arg(id = "ec2_image", long = "ec2-image", env = "PROVISIONER_EC2_IMAGE", value_name = "AMI")]
    pub image: Option<String>,
    /// EC2: the instance type of machines without hardware constraints (optional; others get
    /// the cheapest type that satisfies their constraints).
    #[arg(
        id = "ec2_instance_type",
        long = "ec2-instance-type",
        env = "PROVISIONER_EC2_INSTANCE_TYPE",
        value_name = "TYPE"
    )]
    pub instance_type: Option<String>,
    /// A subnet for new instances.
    #[arg(skip)]
    pub subnet: Option<String>,
    /// Security groups for new instances.
    #[arg(skip)]
    pub security_groups: Vec<String>,
}

/// The leader lease of replicas on PostgreSQL (`[lease]` in the config file: `duration`,
/// `renew_deadline`, `retry`, `replica_id`). Checked: `lease > renew_deadline > 1.2 × retry`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseSettings {
    /// Replicas: how long the leader's lease lasts on the database's clock [default: 10s].
    #[arg(id = "lease_duration", long = "lease", env = "PROVISIONER_LEASE", value_name = "DUR",
          value_parser = parse_duration)]
    #[serde(deserialize_with = "optional_duration")]
    pub duration: Option<Duration>,
    /// Replicas: a leader that has not renewed its lease for this long stops acting [default: 8s].
    #[arg(id = "lease_renew_deadline", long = "lease-renew-deadline", env = "PROVISIONER_LEASE_RENEW_DEADLINE",
          value_name = "DUR", value_parser = parse_duration)]
    #[serde(deserialize_with = "optional_duration")]
    pub renew_deadline: Option<Duration>,
    /// Replicas: the interval between attempts to acquire or renew the lease [default: 2s].
    #[arg(id = "lease_retry", long = "lease-retry", env = "PROVISIONER_LEASE_RETRY", value_name = "DUR",
          value_parser = parse_duration)]
    #[serde(deserialize_with = "optional_duration")]
    pub retry: Option<Duration>,
    /// Replicas: this replica's id (the lease's holder) [default: a random uuid per process].
    #[arg(id = "replica_id", long = "replica-id", env = "PROVISIONER_REPLICA_ID", value_name = "ID")]
    pub replica_id: Option<String>,
}

impl LeaseSettings {
    /// The lease's timings, checked.
    pub fn timings(&self) -> Result<LeaseTimings, LeaseTimingsError> {
        let d = LeaseTimings::default();
        LeaseTimings::new(
            self.duration.unwrap_or(d.lease()),
            self.renew_deadline.unwrap_or(d.renew_deadline()),
            self.retry.unwrap_or(d.retry()),
        )
    }
}

/// The audit log (`[audit]` in the config file, `--audit-log`): one JSON line per change
/// request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditSection {
    /// Append the audit log (one JSON line per change request) to this file
    /// [default: DATA_DIR/audit.log].
    #[arg(id = "audit_log", long = "audit-log", env = "PROVISIONER_AUDIT_LOG", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The size past which the audit log rotates, e.g. `100MiB` (file only:
    /// `[audit] max_size`) [default: 100MiB].
    #[arg(skip)]
    #[serde(deserialize_with = "optional_size")]
    pub max_size: Option<u64>,
    /// How many rotated audit logs are kept (file only: `[audit] files`) [default: 5].
    #[arg(skip)]
    pub files: Option<usize>,
}

#[cfg(feature = "serve")]
impl AuditSection {
    /// How the audit log rotates.
    pub fn rotation(&self) -> crate::service::audit::Rotation {
        let d = crate::service::audit::Rotation::default();
        crate::service::audit::Rotation {
            max_bytes: self.max_size.unwrap_or(d.max_bytes),
            files: self.files.unwrap_or(d.files),
        }
    }
}

/// A size in bytes: a number, or a number with `KiB`, `MiB`, `GiB` (or `K`, `M`, `G`, each
/// 1024-based), at least one kilobyte.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: u64 = number.parse().map_err(|_| format!("{text:?} is not a size (e.g. 100MiB)"))?;
    let scale = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "KB" => 1 << 10,
        "M" | "MiB" | "MB" => 1 << 20,
        "G" | "GiB" | "GB" => 1 << 30,
        other => return Err(format!("{text:?}: unknown unit {other:?} (B, KiB, MiB or GiB)")),
    };
    let bytes = n.checked_mul(scale).ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes < 1024 {
        return Err(format!("{text:?} is below the least size, 1KiB"));
    }
    Ok(bytes)
}

fn optional_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    text.map(|t| parse_size(&t).map_err(serde::de::Error::custom)).transpose()
}

/// Where the service keeps the model, its API token's hash, its settings and the simulated
/// cloud (`[store]` in the config file, `--store`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    /// The store: `sqlite` (the embedded database in the data directory) or a PostgreSQL URL,
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE` (a build with the `postgres` feature)
    /// [default: sqlite].
    #[arg(id = "store", long = "store", env = "PROVISIONER_STORE", value_name = "sqlite|postgres://...",
          value_parser = StoreUrl::from_str)]
    #[serde(deserialize_with = "optional_from_str")]
    pub url: Option<StoreUrl>,
}

impl StoreSection {
    /// The store to use.
    pub fn url(&self) -> StoreUrl {
        self.url.clone().unwrap_or_default()
    }
}

/// A store, as `--store` names it.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum StoreUrl {
    /// SQLite in the data directory.
    #[default]
    Sqlite,
    /// PostgreSQL at this URL (`postgres://` or `postgresql://`).
    Postgres(String),
}

impl StoreUrl {
    /// The URL with its password masked, for logs and messages.
    pub fn redacted(&self) -> String {
        match self {
            StoreUrl::Sqlite => "sqlite".into(),
            StoreUrl::Postgres(url) => redact_password(url),
        }
    }
}

/// `postgres://user:secret@host/db` -> `postgres://user:***@host/db`.
fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl FromStr for StoreUrl {
    type Err = String;
    /// `sqlite`, or a `postgres://` / `postgresql://` URL with a host (and a numeric port, if
    /// any); with the `postgres` feature, also whatever the PostgreSQL client itself refuses, and
    /// TLS settings that cannot be used (`sslmode`, `sslrootcert`: see `pgtls`).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "sqlite" {
            return Ok(StoreUrl::Sqlite);
        }
        let expected = "expected `sqlite` or postgres://USER@HOST[:PORT]/DATABASE";
        let Some(rest) = s.strip_prefix("postgres://").or_else(|| s.strip_prefix("postgresql://")) else {
            return Err(format!("unknown store {:?}: {expected}", redact_password(s)));
        };
        let shown = redact_password(s);
        if s.chars().any(char::is_whitespace) {
            return Err(format!("{shown:?} has white space in it: {expected}"));
        }
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = match hostport.strip_prefix('[') {
            // [::1]:5432
            Some(v6) => match v6.split_once(']') {
                Some((h, p)) => (h, p.strip_prefix(':')),
                None => return Err(format!("{shown:?} has an unclosed [ in its host: {expected}")),
            },
            None => match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            },
        };
        if host.is_empty() {
            return Err(format!("{shown:?} names no host: {expected}"));
        }
        if let Some(p) = port {
            if p.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(format!("{shown:?} has a bad port {p:?}: {expected}"));
            }
        }
        #[cfg(feature = "postgres")]
        // Its TLS settings too: an sslmode it does not know, an sslrootcert that cannot be read.
        if let Err(e) = crate::service::pgtls::parse(s) {
            return Err(format!("{shown:?}: {e}"));
        }
        #[cfg(not(feature = "postgres"))]
        return Err(format!(
            "{shown:?}: this build has no PostgreSQL store: build with `--features postgres`, or use `sqlite`"
        ));
        #[cfg(feature = "postgres")]
        Ok(StoreUrl::Postgres(s.to_owned()))
    }
}

fn optional_from_str<'de, D: Deserializer<'de>, T: FromStr<Err: Display>>(d: D) -> Result<Option<T>, D::Error> {
    from_str(d).map(Some)
}

/// Whether a listen address (`IP:PORT` or `HOST:PORT`) is only reachable from this machine:
/// a loopback IP, or `localhost`. Anything else (a hostname, a wildcard) counts as the network.
pub fn is_loopback(listen: &str) -> bool {
    if let Ok(addr) = listen.parse::<std::net::SocketAddr>() {
        return addr.ip().is_loopback();
    }
    listen.rsplit_once(':').is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
}

fn from_str<'de, D: Deserializer<'de>, T: FromStr<Err: Display>>(d: D) -> Result<T, D::Error> {
    String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    parse_duration(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
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

impl SimSection {
    /// The zones the simulated cloud has available.
    pub fn zones(&self) -> ZoneList {
        self.zones.clone().unwrap_or_else(|| DEFAULT_SIM_ZONES.map(String::from).to_vec())
    }

    /// How long a simulated start takes.
    pub fn start_latency(&self) -> Duration {
        self.start_latency.unwrap_or(DEFAULT_SIM_START_LATENCY)
    }

    /// Every zone the simulated cloud lists, available or not.
    pub fn known_zones(&self) -> ZoneList {
        let mut all = self.zones();
        all.extend(self.unavailable_zones.iter().filter(|z| !all.contains(z)).cloned().collect::<Vec<_>>());
        all
    }

    /// The simulated cloud's subnets: as configured, else `subnet-ZONE` for each zone it lists.
    pub fn subnets(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        self.subnets
            .clone()
            .unwrap_or_else(|| self.known_zones().into_iter().map(|z| (format!("subnet-{z}"), vec![z])).collect())
    }

    fn check_subnets(&self) -> Result<(), SettingsError> {
        let known = self.known_zones();
        for (subnet, zones) in self.subnets.iter().flatten() {
            if zones.is_empty() || zones.iter().any(|z| !known.contains(z)) {
                return Err(SettingsError::SimSubnet {
                    subnet: subnet.clone(),
                    got: zones.clone(),
                    zones: known.join(", "),
                });
            }
        }
        Ok(())
    }

    /// How long the simulated preparation of a host for containers takes.
    pub fn container_init_delay(&self) -> Duration {
        self.container_init_delay.unwrap_or(DEFAULT_SIM_CONTAINER_INIT_DELAY)
    }

    /// How many preparations of each host and container type fail first.
    pub fn container_init_failures(&self) -> u32 {
        self.container_init_failures.unwrap_or(0)
    }

    /// How many start calls the simulated cloud refuses first.
    pub fn start_failures(&self) -> u32 {
        self.start_failures.unwrap_or(0)
    }
}

fn file_error(path: &Path, text: &str, key: Option<String>, source: toml::de::Error) -> SettingsError {
    let line = source.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
    // An unknown key's message names it already (and the path would end at its parent).
    let key = key.filter(|_| !source.message().starts_with("unknown field"));
    SettingsError::File { path: path.to_owned(), line, key, source: Box::new(source) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeSettings,
    }

    fn file(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("provisioner-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Loads the settings as `serve ARGS` would (no environment variable is set in tests).
    fn load(args: &[&str]) -> Result<ServeSettings, SettingsError> {
        let matches = Cli::command().get_matches_from(std::iter::once("serve").chain(args.iter().copied()));
        ServeSettings::load(&matches)
    }

    fn with_file(name: &str, text: &str, args: &[&str]) -> Result<ServeSettings, SettingsError> {
        let p = file(name, text);
        let mut all = vec!["--config", p.to_str().unwrap()];
        all.extend_from_slice(args);
        load(&all)
    }

    #[test]
    fn defaults_are_the_contracts() {
        let o = load(&[]).unwrap();
        assert_eq!(o.data_dir(), Path::new("./provisioner-data"));
        assert_eq!(o.listen(), "127.0.0.1:7878");
        assert_eq!(o.broker(), BrokerKind::Sim);
        assert_eq!(o.sim.zones(), ["az1", "az2", "az3"]);
        assert_eq!(o.sim.start_latency(), Duration::from_secs(2));
        assert_eq!((o.workers, o.harvest_mode, o.resync), (16, HarvestMode::Destroyed, Duration::from_secs(60)));
        assert_eq!(o.retry.strategy(), RetryStrategy::default());
        assert_eq!(o, ServeSettings::default(), "clap's skipped fields hold the same defaults");
        let parsed = Cli::try_parse_from(["serve"]).unwrap().serve;
        assert_eq!(parsed, ServeSettings::default(), "a parse without the file layer holds the defaults too");
    }

    #[test]
    fn event_stream_limits_come_from_the_file_and_are_checked() {
        let d = load(&[]).unwrap().events;
        assert_eq!((d.max_streams_per_token, d.max_streams, d.idle_timeout), (8, 256, Duration::from_secs(60)));
        let text = "[events]\nmax_streams_per_token = 2\nmax_streams = 3\nidle_timeout = \"5s\"\n";
        let e = with_file("events.toml", text, &[]).unwrap().events;
        assert_eq!((e.max_streams_per_token, e.max_streams, e.idle_timeout), (2, 3, Duration::from_secs(5)));
        let e = with_file("events0.toml", "[events]\nmax_streams = 0\n", &[]).unwrap_err();
        assert_eq!(e.to_string(), "config: events.max_streams must be positive");
        let e = with_file("events1.toml", "[events]\nidle_timeout = \"0s\"\n", &[]).unwrap_err();
        assert_eq!(e.to_string(), "config: events.idle_timeout must be positive");
        let e = with_file("events2.toml", "[events]\nstreams = 3\n", &[]).unwrap_err();
        assert!(e.to_string().contains("streams"), "{e}");
    }

    #[test]
    fn the_audit_log_is_in_the_data_dir_unless_moved() {
        assert_eq!(load(&["--data-dir", "/d"]).unwrap().audit_log(), Path::new("/d/audit.log"));
        let o = with_file("audit.toml", "[audit]\nfile = \"/var/log/p.log\"\n", &[]).unwrap();
        assert_eq!(o.audit_log(), Path::new("/var/log/p.log"));
        let o = with_file("audit2.toml", "[audit]\nfile = \"/var/log/p.log\"\n", &["--audit-log", "/x.log"]).unwrap();
        assert_eq!(o.audit_log(), Path::new("/x.log"), "the flag wins");
        let e = with_file("audit3.toml", "[audit]\npath = \"/x\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("path"), "{e}");
    }

    #[test]
    fn sim_subnets_default_to_one_per_zone_and_are_checked() {
        let o = load(&["--sim-zones", "a,b"]).unwrap();
        let want: std::collections::BTreeMap<String, Vec<String>> =
            [("subnet-a".to_owned(), vec!["a".to_owned()]), ("subnet-b".to_owned(), vec!["b".to_owned()])].into();
        assert_eq!(o.sim.subnets(), want);
        let o = with_file("subnets.toml", "[sim]\nzones = [\"a\", \"b\"]\nsubnets = { wide = [\"a\", \"b\"] }\n", &[])
            .unwrap();
        assert_eq!(o.sim.subnets().get("wide").map(Vec::len), Some(2));
        let e = with_file("badsubnets.toml", "[sim]\nzones = [\"a\"]\nsubnets = { s = [\"zz\"] }\n", &[]).unwrap_err();
        assert!(matches!(e, SettingsError::SimSubnet { .. }) && e.to_string().contains("\"zz\""), "{e}");
    }

    #[test]
    fn ec2_settings_come_from_the_file_and_the_flags() {
        let o = with_file(
            "ec2.toml",
            "broker = \"ec2\"\n[ec2]\nregion = \"eu-west-1\"\nimage = \"ami-1\"\ninstance_type = \"t3.micro\"\nsubnet = \"subnet-9\"\nsecurity_groups = [\"sg-1\"]\n",
            &["--ec2-image", "ami-2", "--ec2-endpoint", "http://127.0.0.1:5000"],
        )
        .unwrap();
        assert_eq!(o.broker(), BrokerKind::Ec2);
        assert_eq!(o.ec2.region.as_deref(), Some("eu-west-1"));
        assert_eq!(o.ec2.image.as_deref(), Some("ami-2"), "the flag wins");
        assert_eq!(o.ec2.instance_type.as_deref(), Some("t3.micro"));
        assert_eq!(o.ec2.subnet.as_deref(), Some("subnet-9"));
        assert_eq!(o.ec2.security_groups, ["sg-1"]);
        assert_eq!(o.ec2.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
    }

    #[test]
    fn sim_instance_types_come_from_the_file() {
        let o =
            with_file("types.toml", "[sim]\ninstance_type = \"m5.large\"\nout_of_capacity = [\"m5.large:az1\"]\n", &[])
                .unwrap();
        assert_eq!(o.sim.instance_type.as_deref(), Some("m5.large"));
        assert_eq!(o.sim.out_of_capacity, ["m5.large:az1"]);
        let none = ServeSettings::default();
        assert_eq!((none.sim.instance_type, none.sim.out_of_capacity.len()), (None, 0));
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_defaults() {
        let o = with_file(
            "ok.toml",
            "listen = \"127.0.0.1:9999\"\nworkers = 4\nharvest_mode = \"ALL\"\nresync = \"5s\"\nbroker = \"ec2\"\n[retry]\ncount = 2\ndelay = \"1s\"\n[sim]\nzones = [\"a\"]\nstart_latency = \"100ms\"\n",
            &["--listen", "127.0.0.1:1", "--broker", "sim", "--sim-zones", " b, ,c "],
        )
        .unwrap();
        assert_eq!(o.listen(), "127.0.0.1:1");
        assert_eq!(o.broker(), BrokerKind::Sim);
        assert_eq!(o.workers, 4);
        assert_eq!(o.harvest_mode, HarvestMode::All, "harvest modes are case-insensitive");
        assert_eq!(o.resync, Duration::from_secs(5));
        assert_eq!((o.retry.count, o.retry.delay), (2, Duration::from_secs(1)));
        assert_eq!(o.sim.zones(), ["b", "c"]);
        assert_eq!(o.sim.start_latency(), Duration::from_millis(100));
        assert_eq!(o.data_dir(), Path::new(DEFAULT_DATA_DIR));
        let o = with_file("zoneless.toml", "[sim]\nzones = [\"a\"]\n", &["--sim-zones", ""]).unwrap();
        assert_eq!(o.sim.zones(), ZoneList::new(), "an empty flag is a zoneless cloud");
    }

    #[test]
    fn injected_start_failures_come_from_the_file_and_the_flag() {
        assert_eq!(load(&[]).unwrap().sim.start_failures(), 0);
        let o = with_file("faults.toml", "[sim]\nstart_failures = 3\n", &[]).unwrap();
        assert_eq!(o.sim.start_failures(), 3);
        let o = with_file("faults-flag.toml", "[sim]\nstart_failures = 3\n", &["--sim-start-failures", "1"]).unwrap();
        assert_eq!(o.sim.start_failures(), 1, "the flag wins");
        assert!(Cli::command().try_get_matches_from(["serve", "--sim-start-failures", "-1"]).is_err());
    }

    #[test]
    fn container_initialiser_settings_come_from_the_file_and_the_flags() {
        let o = load(&[]).unwrap();
        assert_eq!((o.sim.container_init_delay(), o.sim.container_init_failures()), (Duration::from_secs(1), 0));
        let o = with_file(
            "containers.toml",
            "[sim]\ncontainer_init_delay = \"3s\"\ncontainer_init_failures = 2\n",
            &["--sim-container-init-delay", "250ms"],
        )
        .unwrap();
        assert_eq!(o.sim.container_init_delay(), Duration::from_millis(250), "the flag wins");
        assert_eq!(o.sim.container_init_failures(), 2);
        let o = load(&["--sim-container-init-failures", "4"]).unwrap();
        assert_eq!(o.sim.container_init_failures(), 4);
        assert!(Cli::command().try_get_matches_from(["serve", "--sim-container-init-failures", "-1"]).is_err());
    }

    #[test]
    fn lease_settings_come_from_the_file_and_the_flags_and_are_checked() {
        let o = load(&[]).unwrap();
        assert_eq!(o.lease.timings(), Ok(LeaseTimings::default()));
        assert_eq!(o.lease.replica_id, None);
        let o = with_file(
            "lease.toml",
            "[lease]\nduration = \"20s\"\nrenew_deadline = \"15s\"\nretry = \"3s\"\nreplica_id = \"r1\"\n",
            &["--lease-retry", "1s", "--replica-id", "r2"],
        )
        .unwrap();
        let t = o.lease.timings().unwrap();
        assert_eq!((t.lease(), t.renew_deadline(), t.retry()), (secs(20), secs(15), secs(1)), "the flag wins");
        assert_eq!(o.lease.replica_id.as_deref(), Some("r2"));
        let o = load(&["--lease", "4s", "--lease-renew-deadline", "3s", "--lease-retry", "500ms"]).unwrap();
        assert_eq!(o.lease.timings().map(|t| t.lease()), Ok(secs(4)));
        let e = load(&["--lease", "8s"]).unwrap_err();
        assert!(matches!(e, SettingsError::Lease(LeaseTimingsError::LeaseNotAboveDeadline { .. })), "{e:?}");
        assert_eq!(e.to_string(), "config: lease.duration (8s) must be longer than lease.renew_deadline (8s)");
        assert!(std::error::Error::source(&e).is_some(), "the timings' error is kept as the source");
        let e = with_file("badlease.toml", "[lease]\nretry = \"7s\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("lease.renew_deadline (8s) must be longer than 1.2 × lease.retry (7s)"), "{e}");
        let e = with_file("zerolease.toml", "[lease]\nretry = \"0s\"\n", &[]).unwrap_err();
        assert_eq!(e.to_string(), "config: lease.retry must be positive");
        let e = with_file("unknownlease.toml", "[lease]\nttl = \"1s\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("unknown field `ttl`"), "{e}");
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// An environment variable sits between the flag and the file. (The test renames the
    /// variable of `--listen`, so that no other test sees it.)
    #[test]
    fn a_variable_wins_over_the_file_and_loses_to_the_flag() {
        let var: &'static str = format!("PROVISIONER_TEST_LISTEN_{}", std::process::id()).leak();
        std::env::set_var(var, "127.0.0.1:2");
        let p = file("env.toml", "listen = \"127.0.0.1:9999\"\nworkers = 3\n");
        let command = || Cli::command().mut_arg("listen", |a| a.env(var));
        let load = |args: &[&str]| {
            let matches = command().get_matches_from(["serve", "--config", p.to_str().unwrap()].iter().chain(args));
            ServeSettings::load(&matches).unwrap()
        };
        let from_var = load(&[]);
        let from_flag = load(&["--listen", "127.0.0.1:3"]);
        std::env::remove_var(var);
        assert_eq!((from_var.listen(), from_var.workers), ("127.0.0.1:2", 3), "the variable over the file");
        assert_eq!(from_flag.listen(), "127.0.0.1:3", "the flag over the variable");
    }

    #[test]
    fn the_store_is_sqlite_unless_a_postgres_url_is_given() {
        assert_eq!(load(&[]).unwrap().store.url(), StoreUrl::Sqlite);
        assert_eq!(load(&["--store", "sqlite"]).unwrap().store.url(), StoreUrl::Sqlite);
        for bad in ["mysql://h/db", "postgres://", "postgres:///db", "postgres://h:99999/db", "postgres://h:x/db", "pg"]
        {
            let e = Cli::command().try_get_matches_from(["serve", "--store", bad]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad}: {e}");
            assert!(e.to_string().contains("--store"), "the message names the flag: {e}");
        }
        let e = with_file("store.toml", "[store]\nurl = \"postgres://:5432/x\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("store.toml:2: store.url: "), "{e}");
        // The password is never shown.
        let e = StoreUrl::from_str("postgres://u:hunter2@/db").unwrap_err();
        assert!(e.contains("u:***@") && !e.contains("hunter2"), "{e}");
        #[cfg(feature = "postgres")]
        {
            let url = "postgres://u:hunter2@127.0.0.1:5432/prov";
            let o = with_file("pg.toml", "[store]\nurl = \"postgres://h/file\"\n", &["--store", url]).unwrap();
            assert_eq!(o.store.url(), StoreUrl::Postgres(url.into()), "the flag wins");
            assert_eq!(format!("{:?}", o.store.url()), "postgres://u:***@127.0.0.1:5432/prov");
            let o = with_file("pg2.toml", "[store]\nurl = \"postgresql://h/file\"\n", &[]).unwrap();
            assert_eq!(o.store.url(), StoreUrl::Postgres("postgresql://h/file".into()));
        }
        #[cfg(not(feature = "postgres"))]
        {
            let e = Cli::command().try_get_matches_from(["serve", "--store", "postgres://h/db"]).unwrap_err();
            assert!(e.to_string().contains("--features postgres"), "{e}");
        }
    }

    // A build without PostgreSQL refuses the URL itself (another test says so).
    #[cfg(feature = "postgres")]
    #[test]
    fn init_is_for_sqlite_and_refused_with_postgres() {
        assert!(load(&["--init"]).unwrap().init);
        let e = load(&["--init", "--store", "postgres://p@127.0.0.1:5432/db"]).unwrap_err();
        assert!(matches!(e, SettingsError::InitWithPostgres), "{e:?}");
        assert!(e.to_string().contains("--init") && e.to_string().contains("first replica"), "{e}");
    }

    #[test]
    fn plain_http_off_loopback_needs_insecure_http_and_tls_needs_both_files() {
        for ok in ["127.0.0.1:1", "[::1]:1", "localhost:1", "127.0.0.2:1"] {
            assert!(is_loopback(ok), "{ok}");
        }
        for not in ["0.0.0.0:1", "[::]:1", "10.0.0.1:1", "example.com:1"] {
            assert!(!is_loopback(not), "{not}");
        }
        let e = load(&["--listen", "0.0.0.0:7878"]).unwrap_err();
        assert!(matches!(e, SettingsError::InsecureListen { .. }) && e.to_string().contains("--insecure-http"), "{e}");
        assert!(load(&["--listen", "0.0.0.0:7878", "--insecure-http"]).unwrap().insecure_http == Some(true));
        let o = load(&["--listen", "0.0.0.0:7878", "--tls-cert", "c.pem", "--tls-key", "k.pem"]).unwrap();
        assert_eq!(o.tls_files(), Some((Path::new("c.pem"), Path::new("k.pem"))));
        assert!(matches!(load(&["--tls-cert", "c.pem"]).unwrap_err(), SettingsError::TlsPair));
        let o =
            with_file("tls.toml", "listen = \"0.0.0.0:1\"\ntls_cert = \"a.pem\"\ntls_key = \"b.pem\"\n", &[]).unwrap();
        assert_eq!(o.tls_files(), Some((Path::new("a.pem"), Path::new("b.pem"))), "the file's keys");
        let e = with_file("insecure.toml", "listen = \"0.0.0.0:1\"\n", &[]).unwrap_err();
        assert!(matches!(e, SettingsError::InsecureListen { .. }), "{e}");
        assert!(with_file("insecure2.toml", "listen = \"0.0.0.0:1\"\ninsecure_http = true\n", &[]).is_ok());
        let e =
            with_file("insecure3.toml", "listen = \"0.0.0.0:1\"\ninsecure_http = true\n", &["--insecure-http=false"]);
        assert!(matches!(e, Err(SettingsError::InsecureListen { .. })), "the flag wins over the file: {e:?}");
    }

    #[test]
    fn bad_files_name_the_file_line_and_key() {
        let e = with_file("bad.toml", "workers = 4\nwrokers = 5\n", &[]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("bad.toml:2: unknown field `wrokers`"), "{msg}");
        assert!(matches!(&e, SettingsError::File { source, .. } if source.span().is_some()), "{e:?}");
        let e = with_file("w.toml", "workers = 0\n", &[]).unwrap_err();
        assert_eq!(e.to_string(), "config: workers must be between 1 and 100, got 0");
        assert!(std::error::Error::source(&e).is_some(), "the config error is kept as the source");
        let e = with_file("d.toml", "[sim]\nstart_latency = \"soon\"\n", &[]).unwrap_err();
        assert!(
            e.to_string().ends_with("d.toml:2: sim.start_latency: invalid duration \"soon\": expected number at 0"),
            "{e}"
        );
        let e = with_file("r.toml", "[retry]\ndelay = 5\n", &[]).unwrap_err();
        assert!(e.to_string().ends_with("r.toml:2: retry.delay: invalid type: integer `5`, expected a string"), "{e}");
        let e = with_file("b.toml", "broker = \"gce\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("b.toml:1: broker: unknown variant `gce`"), "{e}");
        let e = with_file("h.toml", "harvest_mode = \"sometimes\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("h.toml:1: harvest_mode: invalid harvest mode \"sometimes\""), "{e}");
        let e = with_file("s.toml", "workers = \n", &[]).unwrap_err();
        assert!(e.to_string().contains("s.toml:1: "), "{e}");
        let e = with_file("z.toml", "resync = \"0s\"\n", &[]).unwrap_err();
        assert_eq!(e.to_string(), "config: resync must be positive");
        let e = load(&["--config", "/nonexistent/p.toml"]).unwrap_err();
        assert!(matches!(e, SettingsError::Read { .. }) && e.to_string().contains("cannot read config file"), "{e}");
    }
}
