//! `[lease]`: the replicas' leader lease, as the flags and the config file give it, and
//! [`LeaseTimings`], the timings checked (what the lease's plain core runs with).

use std::time::Duration;

use clap::Args;
use serde::Deserialize;
use thiserror::Error;

use super::parse::{optional_duration, parse_duration};

/// The lease's duration by default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// How long a leader goes on acting without a successful renewal, by default.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(8);
/// The interval between attempts (acquire or renew), by default.
pub const DEFAULT_RETRY: Duration = Duration::from_secs(2);

/// The lease's timings, checked: `lease > renew_deadline > 1.2 × retry`, all positive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    lease: Duration,
    renew_deadline: Duration,
    retry: Duration,
}

/// Why lease timings cannot be used; each names the setting at fault as the config file's
/// `[lease]` table spells it (`lease.duration`, `lease.renew_deadline`, `lease.retry`; the
/// flags are `--lease`, `--lease-renew-deadline`, `--lease-retry`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LeaseTimingsError {
    /// A duration is zero.
    #[error("config: {setting} must be positive")]
    Zero {
        /// The setting.
        setting: &'static str,
    },
    /// The lease does not outlast the renew deadline.
    #[error("config: lease.duration ({lease:?}) must be longer than lease.renew_deadline ({renew_deadline:?})")]
    LeaseNotAboveDeadline {
        /// The lease.
        lease: Duration,
        /// The renew deadline.
        renew_deadline: Duration,
    },
    /// The renew deadline leaves no room for a retry.
    #[error("config: lease.renew_deadline ({renew_deadline:?}) must be longer than 1.2 × lease.retry ({retry:?})")]
    DeadlineNotAboveRetry {
        /// The renew deadline.
        renew_deadline: Duration,
        /// The retry interval.
        retry: Duration,
    },
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self { lease: DEFAULT_LEASE, renew_deadline: DEFAULT_RENEW_DEADLINE, retry: DEFAULT_RETRY }
    }
}

impl LeaseTimings {
    /// Checks the timings.
    pub fn new(lease: Duration, renew_deadline: Duration, retry: Duration) -> Result<Self, LeaseTimingsError> {
        for (setting, d) in
            [("lease.duration", lease), ("lease.renew_deadline", renew_deadline), ("lease.retry", retry)]
        {
            if d.is_zero() {
                return Err(LeaseTimingsError::Zero { setting });
            }
        }
        if lease <= renew_deadline {
            return Err(LeaseTimingsError::LeaseNotAboveDeadline { lease, renew_deadline });
        }
        // renew_deadline > 1.2 × retry, in whole nanoseconds: 5 × deadline > 6 × retry.
        if renew_deadline.as_nanos() * 5 <= retry.as_nanos() * 6 {
            return Err(LeaseTimingsError::DeadlineNotAboveRetry { renew_deadline, retry });
        }
        Ok(Self { lease, renew_deadline, retry })
    }

    /// How long an acquired or renewed lease lasts (on the database's clock).
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// How long a leader acts without a successful renewal.
    pub fn renew_deadline(&self) -> Duration {
        self.renew_deadline
    }

    /// The interval between attempts.
    pub fn retry(&self) -> Duration {
        self.retry
    }
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
