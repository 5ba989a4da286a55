//! `[events]`, `[retry]`, `[ec2]`, `[lxd]` and `[audit]`: the config file's smaller tables and
//! their flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::config::RetryStrategy;

use super::errors::SettingsError;
use super::parse::duration;

/// The most event streams (`/v1/events`) one API token may hold open on a replica by default.
pub const DEFAULT_MAX_STREAMS_PER_TOKEN: usize = 8;
/// The most event streams a replica holds open, all tokens together, by default.
pub const DEFAULT_MAX_STREAMS: usize = 256;
/// How long an event stream may go without a frame written to its client (frames waiting)
/// before the client is dropped, by default.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

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
    pub(super) fn check(&self) -> Result<(), SettingsError> {
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
    /// EC2: the SQS queue (its URL) an EventBridge rule delivers EC2's spot interruption
    /// warnings, rebalance recommendations and instance state changes to (optional). With it,
    /// a warned spot instance's machine is handed over to a replacement before EC2 takes the
    /// instance; without it, the provisioner hears of no interruption.
    #[arg(
        id = "ec2_interruption_queue",
        long = "ec2-interruption-queue",
        env = "PROVISIONER_EC2_INTERRUPTION_QUEUE",
        value_name = "URL"
    )]
    pub interruption_queue: Option<String>,
    /// A subnet for new instances.
    #[arg(skip)]
    pub subnet: Option<String>,
    /// Security groups for new instances.
    #[arg(skip)]
    pub security_groups: Vec<String>,
}

/// The LXD broker's settings (used with `--broker lxd`): the flags, the config file's `[lxd]`
/// table, and a model's own (`model add --broker lxd --lxd-...`, the body's `lxd` object; the
/// files are on the service's host), where each one left out is the service's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args, Serialize, Deserialize)]
#[cfg_attr(feature = "serve", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, default)]
pub struct LxdSettings {
    /// LXD: the API, `unix:PATH` (the daemon's socket, e.g. /var/lib/lxd/unix.socket) or
    /// `https://HOST:PORT` (with --lxd-client-cert, --lxd-client-key and --lxd-server-cert).
    #[arg(
        id = "lxd_endpoint",
        long = "lxd-endpoint",
        env = "PROVISIONER_LXD_ENDPOINT",
        value_name = "unix:PATH|https://HOST:PORT"
    )]
    pub endpoint: Option<String>,
    /// LXD: the image alias every container starts from (`lxc image alias list`).
    #[arg(id = "lxd_image", long = "lxd-image", env = "PROVISIONER_LXD_IMAGE", value_name = "ALIAS")]
    pub image: Option<String>,
    /// LXD: the project containers are made in [default: default].
    #[arg(id = "lxd_project", long = "lxd-project", env = "PROVISIONER_LXD_PROJECT", value_name = "NAME")]
    pub project: Option<String>,
    /// LXD over HTTPS: the PEM client certificate the daemon trusts (`lxc config trust add FILE`).
    #[arg(id = "lxd_client_cert", long = "lxd-client-cert", env = "PROVISIONER_LXD_CLIENT_CERT", value_name = "FILE")]
    #[cfg_attr(feature = "serve", schema(value_type = Option<String>))]
    pub client_cert: Option<PathBuf>,
    /// LXD over HTTPS: the client certificate's PEM private key.
    #[arg(id = "lxd_client_key", long = "lxd-client-key", env = "PROVISIONER_LXD_CLIENT_KEY", value_name = "FILE")]
    #[cfg_attr(feature = "serve", schema(value_type = Option<String>))]
    pub client_key: Option<PathBuf>,
    /// LXD over HTTPS: the daemon's PEM certificate, pinned ($LXD_DIR/server.crt; a cluster's
    /// cluster.crt).
    #[arg(id = "lxd_server_cert", long = "lxd-server-cert", env = "PROVISIONER_LXD_SERVER_CERT", value_name = "FILE")]
    #[cfg_attr(feature = "serve", schema(value_type = Option<String>))]
    pub server_cert: Option<PathBuf>,
}

impl LxdSettings {
    /// Each setting with its flag's name, as text.
    pub fn named(&self) -> [(&'static str, Option<String>); 6] {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        [
            ("lxd-endpoint", self.endpoint.clone()),
            ("lxd-image", self.image.clone()),
            ("lxd-project", self.project.clone()),
            ("lxd-client-cert", path(&self.client_cert)),
            ("lxd-client-key", path(&self.client_key)),
            ("lxd-server-cert", path(&self.server_cert)),
        ]
    }

    /// These settings over `base`: each one given here wins.
    pub fn over(&self, base: &LxdSettings) -> LxdSettings {
        LxdSettings {
            endpoint: self.endpoint.clone().or_else(|| base.endpoint.clone()),
            image: self.image.clone().or_else(|| base.image.clone()),
            project: self.project.clone().or_else(|| base.project.clone()),
            client_cert: self.client_cert.clone().or_else(|| base.client_cert.clone()),
            client_key: self.client_key.clone().or_else(|| base.client_key.clone()),
            server_cert: self.server_cert.clone().or_else(|| base.server_cert.clone()),
        }
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
pub(super) fn parse_size(text: &str) -> Result<u64, String> {
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

pub(super) fn optional_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    text.map(|t| parse_size(&t).map_err(serde::de::Error::custom)).transpose()
}
