//! Provisioner configuration, with Juju's defaults and validation.

use std::time::Duration;

use thiserror::Error;

pub mod rate_limits;
pub mod repair;

use crate::model::{HarvestMode, MachineId};

/// Largest broker worker pool of a container provisioner.
pub const MAX_CONTAINER_WORKERS: usize = 25;
/// Default broker worker pool of a container provisioner.
pub const DEFAULT_CONTAINER_WORKERS: usize = 4;

/// Which machines a provisioner is responsible for (the environ provisioner: top-level machines
/// only).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Scope {
    /// Top-level machines (the environ provisioner).
    #[default]
    Environ,
    /// Containers of one type on one host (`HOST/KIND/N`).
    Containers {
        /// The host machine.
        host: MachineId,
        /// The container type, e.g. `lxd`.
        kind: String,
    },
}

impl Scope {
    /// Whether this provisioner acts on the machine.
    pub fn contains(&self, id: &MachineId) -> bool {
        match self {
            Scope::Environ => !id.is_container(),
            Scope::Containers { host, kind } => {
                id.container_of().is_some_and(|(h, k)| &h == host && k == kind.as_str())
            }
        }
    }

    /// Whether an instance tagged for `machine` (or untagged, `None`) is this provisioner's
    /// business when looking for unknown instances.
    pub fn judges(&self, machine: Option<&MachineId>) -> bool {
        match (self, machine) {
            (Scope::Environ, None) => true,
            (Scope::Containers { .. }, None) => false,
            (_, Some(m)) => self.contains(m),
        }
    }
}

/// Default size of the broker worker pool (Juju's `num-provision-workers`).
pub const DEFAULT_WORKERS: usize = 16;
/// Largest broker worker pool of the environ provisioner.
pub const MAX_WORKERS: usize = 100;
/// Default extra StartInstance rounds.
pub const DEFAULT_RETRY_COUNT: u32 = 10;
/// Default delay between StartInstance rounds.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_secs(10);
/// Default time a parked instance waits for reuse.
pub const DEFAULT_REUSE_WINDOW: Duration = Duration::from_secs(300);
/// Default maximum age of the listing unknown instances are judged on.
pub const DEFAULT_HARVEST_LISTING_MAX_AGE: Duration = Duration::from_secs(10);
/// Default grace period of an unknown instance, counted from its launch: younger ones are
/// spared by harvests (a start of another incarnation may not be recorded yet).
pub const DEFAULT_HARVEST_GRACE: Duration = Duration::from_secs(300);
/// Default cap on unknown instances stopped in one harvest pass.
pub const DEFAULT_HARVEST_MAX_STOPS: usize = 100;
/// Default time a zone's capacity failure steers machines of the same shape elsewhere.
pub const DEFAULT_CAPACITY_MEMORY: Duration = Duration::from_secs(180);
/// Default cap on the delay between two StartInstance rounds.
pub const DEFAULT_RETRY_MAX_DELAY: Duration = Duration::from_secs(120);
/// Default interval between full cloud listings.
pub const DEFAULT_RESYNC_INTERVAL: Duration = Duration::from_secs(60);
/// Default largest number of machines one batched start call carries.
pub const DEFAULT_BATCH_SIZE: usize = 100;
/// Largest valid batch size (a bound on one call, not a tuning: the cloud's own account
/// limits cap a `RunInstances` long before).
pub const MAX_BATCH_SIZE: usize = 1000;

/// Invalid configuration.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// The worker pool size is out of range.
    #[error("workers must be between 1 and {max}, got {value}")]
    Workers {
        /// The value given.
        value: usize,
        /// The largest valid value.
        max: usize,
    },
    /// The backoff is inconsistent.
    #[error("backoff initial delay {initial:?} must be positive and not above its cap {max:?}")]
    Backoff {
        /// The initial delay.
        initial: Duration,
        /// The cap.
        max: Duration,
    },
    /// The resync interval is zero.
    #[error("resync interval must be positive")]
    ResyncInterval,
    /// The model uuid is empty.
    #[error("model uuid must not be empty")]
    ModelUuid,
    /// Machine reuse with a harvest mode that never stops dead machines' instances.
    #[error("machine reuse needs harvest mode destroyed or all (got {0}): in other modes dead machines' instances are kept, not reused")]
    Reuse(HarvestMode),
    /// Machine reuse with a zero window.
    #[error("the reuse window must be positive")]
    ReuseWindow,
    /// A client-side rate limit is out of range.
    #[error(transparent)]
    RateLimit(#[from] crate::config::rate_limits::RateLimitError),
    /// A harvest pass that may stop nothing.
    #[error("harvest_max_stops must be at least 1")]
    HarvestMaxStops,
    /// The batch size is out of range.
    #[error("batch_size must be between 1 and {max}, got {value}")]
    BatchSize {
        /// The value given.
        value: usize,
        /// The largest valid value.
        max: usize,
    },
}

/// How StartInstance failures are retried (a zone-specific failure moves on to another zone without
/// using up a round).
///
/// Round `k` (0-based) waits a random time in `[0, min(delay · 2^k, max_delay)]` (exponential
/// backoff with full jitter, drawn from the seeded RNG); a zone fail-over does not wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryStrategy {
    /// Extra rounds after the first.
    pub count: u32,
    /// Base delay before a new round (not before a zone fail-over).
    pub delay: Duration,
    /// Cap on the delay before a new round.
    pub max_delay: Duration,
}

impl Default for RetryStrategy {
    fn default() -> Self {
        Self { count: DEFAULT_RETRY_COUNT, delay: DEFAULT_RETRY_DELAY, max_delay: DEFAULT_RETRY_MAX_DELAY }
    }
}

impl RetryStrategy {
    /// `count` extra rounds, `delay` as the backoff base, the default cap (never below `delay`).
    pub fn new(count: u32, delay: Duration) -> Self {
        Self { count, delay, max_delay: DEFAULT_RETRY_MAX_DELAY.max(delay) }
    }

    /// The delay before round `round` (0-based): full jitter over `delay · 2^round`, capped.
    pub fn delay_before(&self, round: u32, rng: &mut impl rand::Rng) -> Duration {
        jitter(exponential(self.delay, round, self.max_delay), rng)
    }
}

fn exponential(base: Duration, attempt: u32, cap: Duration) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
    base.saturating_mul(factor).min(cap)
}

/// Full jitter: uniform in `[0, ceiling]`, at millisecond resolution.
fn jitter(ceiling: Duration, rng: &mut impl rand::Rng) -> Duration {
    let ms = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rng.random_range(0..=ms))
}

/// Exponential backoff for calls that concern everything (listings, stops, model reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay.
    pub initial: Duration,
    /// Cap.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial: Duration::from_secs(1), max: Duration::from_secs(60) }
    }
}

impl Backoff {
    /// The ceiling of retry number `attempt` (0-based): initial · 2^attempt, capped.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        exponential(self.initial, attempt, self.max)
    }

    /// The delay before retry number `attempt`: full jitter over [`Backoff::ceiling`] (uniform
    /// in `[0, ceiling]`), so that callers failing together do not retry together.
    pub fn delay(&self, attempt: u32, rng: &mut impl rand::Rng) -> Duration {
        jitter(self.ceiling(attempt), rng)
    }
}

/// Code broken on purpose (issue 35): each switch turns one of the protocol's safeguards off,
/// so that the model checker's tests (`sim::mc`) show it finds what the safeguard prevents,
/// and a scenario replays the checker's counterexample in the simulator
/// (`[provisioner] mutations`). Every switch is off by default; nothing but those tests and
/// replays turns one on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Mutations {
    /// After an ambiguous failure of a start call (it may have made the instance), the next
    /// call takes a new client token instead of repeating the one that may have made it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub new_token_after_ambiguous: bool,
    /// The registry adopts an instance tagged for a pending machine even while the stop this
    /// provisioner decided for it is in flight (the machine does not wait for that stop).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopt_while_stopping: bool,
    /// A cloud listing that failed part way is taken for the whole cloud (the model: the pages
    /// before the failure held nothing) instead of leaving the view stale until one succeeds.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub judge_incomplete_listing: bool,
    /// The leader's fence admits every write (`model::Fence::skip_check`): a leader that lost
    /// its lease keeps writing to the model under its stale epoch.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_fence_check: bool,
    /// The service writes no start intents (`service::cloud::intents`): a start call on the wire
    /// when its provisioner crashes or loses the lease is not repeated by the next one before
    /// it runs. Read by the model checker's model of the intent broker only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_start_intents: bool,
    /// The lifecycle keeps a machine whose start is in flight wanted when the model is
    /// destroyed (instead of deferring its destruction to the start's end): the start goes on
    /// to call the cloud, and what it makes is never stopped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub start_through_destroy: bool,
    /// A warning about a machine's recorded instance opens its hand-over even while another
    /// instance of the machine is still there (the interrupted instance of a switch whose stop
    /// a crash lost, an orphan being stopped): the registry reports no leftover.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handover_ignores_leftovers: bool,
    /// The pool replays a batched start call that failed ambiguously under a new client token
    /// instead of the intent's own (the first call may have made the batch's instances).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub batch_replay_new_token: bool,
}

impl Mutations {
    /// Whether no switch is on (the code as shipped).
    pub fn none(&self) -> bool {
        *self == Self::default()
    }
}

/// Everything a provisioner needs to know besides its ports.
#[derive(Debug, Clone, PartialEq)]
pub struct ProvisionerConfig {
    /// The model's uuid: tagged on every instance we start; instances without it are not ours.
    pub model_uuid: String,
    /// The tag of the host running the provisioner, the first half of every nonce.
    pub host_tag: String,
    /// Initial harvest mode.
    pub harvest_mode: HarvestMode,
    /// Broker worker pool size.
    pub workers: usize,
    /// Largest valid pool size (100 for the environ provisioner, 25 for containers).
    pub max_workers: usize,
    /// StartInstance retries.
    pub retry: RetryStrategy,
    /// Backoff for failed listings, stops and model calls.
    pub backoff: Backoff,
    /// Interval between full cloud listings (the view is otherwise kept current from broker
    /// results).
    pub resync_interval: Duration,
    /// Unknown instances are judged on a listing at most this old: a harvest that needs them
    /// re-lists an older view first (so the cloud is listed at most once per this age).
    pub harvest_listing_max_age: Duration,
    /// Seed of every random choice (zone tie-breaks, nonces).
    pub seed: u64,
    /// Which machines this provisioner acts on.
    pub scope: Scope,
    /// Machine reuse, off by default: a dead machine's clean instance is parked for
    /// `reuse_window` and handed to a new pending machine with the same constraints and a
    /// compatible zone, instead of stopping one instance and starting another.
    pub reuse: bool,
    /// How long a parked instance waits for a new machine before it is stopped.
    pub reuse_window: Duration,
    /// Whether the transient-retry path runs (the container provisioner has none, as in Juju).
    pub retry_path: bool,
    /// Client-side rate limits per cloud API class (EC2-sized by default), adapted down when
    /// the cloud throttles.
    pub rate_limits: crate::config::rate_limits::RateLimits,
    /// An unknown instance younger than this (from its launch) is not harvested yet.
    pub harvest_grace: Duration,
    /// Most unknown instances stopped in one harvest pass; the rest wait for the next pass.
    pub harvest_max_stops: usize,
    /// How long a zone that failed a start for its zone (e.g. no capacity) is avoided by other
    /// machines of the same shape.
    pub capacity_memory: Duration,
    /// Batched starts, off by default: starts waiting for the cloud in the same zone with the
    /// same shape (constraints, placement, volumes, extra tags) go out as one call of up to
    /// `batch_size` machines, taking one token of the start bucket, and a worker carries a
    /// batch (up to `workers × batch_size` starts run at once). Only on a broker that batches
    /// natively ([`Broker::batches_starts`](crate::ports::Broker::batches_starts)).
    pub batch_starts: bool,
    /// Most machines in one batched start call (`1..=MAX_BATCH_SIZE`, default 100).
    pub batch_size: usize,
    /// A start gives its worker back once it is done with the cloud (its instance started or
    /// adopted) and records the instance in the model outside the pool's size, so that a model
    /// whose writes wait for a commit does not hold a worker, and the cloud calls a worker
    /// could make, while they do. The workers then bound the calls to the cloud, not the
    /// records (their number is bounded by the machines started). Off by default, as in
    /// Juju's pool (and the simulator's scenarios); `provisioner serve` turns it on.
    pub record_outside_worker: bool,
    /// The most a spot start pays, in USD per hour (issue 33): handed to the broker with every
    /// spot call, and a spot price above it counts as no spot capacity there. `None` (the
    /// default): no cap of ours.
    pub spot_max_price: Option<crate::model::UsdPerHour>,
    /// Repair of machines whose instance stays stopped (issue 34): off by default.
    pub repair: repair::RepairPolicy,
    /// Code broken on purpose, for the model checker's tests and replays (issue 35): none by
    /// default.
    pub mutations: Mutations,
}

impl Default for ProvisionerConfig {
    fn default() -> Self {
        Self {
            model_uuid: "00000000-0000-4000-8000-000000000000".into(),
            host_tag: "machine-0".into(),
            harvest_mode: HarvestMode::default(),
            workers: DEFAULT_WORKERS,
            max_workers: MAX_WORKERS,
            retry: RetryStrategy::default(),
            backoff: Backoff::default(),
            resync_interval: DEFAULT_RESYNC_INTERVAL,
            harvest_listing_max_age: DEFAULT_HARVEST_LISTING_MAX_AGE,
            seed: 0,
            scope: Scope::Environ,
            retry_path: true,
            reuse: false,
            reuse_window: DEFAULT_REUSE_WINDOW,
            rate_limits: crate::config::rate_limits::RateLimits::ec2(),
            harvest_grace: DEFAULT_HARVEST_GRACE,
            harvest_max_stops: DEFAULT_HARVEST_MAX_STOPS,
            capacity_memory: DEFAULT_CAPACITY_MEMORY,
            batch_starts: false,
            batch_size: DEFAULT_BATCH_SIZE,
            record_outside_worker: false,
            spot_max_price: None,
            repair: repair::RepairPolicy::default(),
            mutations: Mutations::default(),
        }
    }
}

impl ProvisionerConfig {
    /// A container provisioner's configuration for `kind` containers on `host`: 4 workers
    /// (valid 1..=25), no transient-retry path, the rest from `self`.
    pub fn for_containers(&self, host: MachineId, kind: &str) -> Self {
        Self {
            workers: DEFAULT_CONTAINER_WORKERS,
            max_workers: MAX_CONTAINER_WORKERS,
            scope: Scope::Containers { host, kind: kind.to_owned() },
            retry_path: false,
            ..self.clone()
        }
    }

    /// The same configuration with a seed drawn from the operating system: what a long-running
    /// service wants, so that two incarnations never draw the same nonces.
    pub fn with_random_seed(mut self) -> Self {
        self.seed = rand::random();
        self
    }

    /// Checks every field; the error names the first one out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_workers(self.workers, self.max_workers)?;
        if self.backoff.initial.is_zero() || self.backoff.initial > self.backoff.max {
            return Err(ConfigError::Backoff { initial: self.backoff.initial, max: self.backoff.max });
        }
        if self.resync_interval.is_zero() {
            return Err(ConfigError::ResyncInterval);
        }
        if self.model_uuid.is_empty() {
            return Err(ConfigError::ModelUuid);
        }
        if self.reuse && !self.harvest_mode.harvests_destroyed() {
            return Err(ConfigError::Reuse(self.harvest_mode));
        }
        if self.reuse && self.reuse_window.is_zero() {
            return Err(ConfigError::ReuseWindow);
        }
        if self.harvest_max_stops == 0 {
            return Err(ConfigError::HarvestMaxStops);
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return Err(ConfigError::BatchSize { value: self.batch_size, max: MAX_BATCH_SIZE });
        }
        self.rate_limits.validate()?;
        Ok(())
    }
}

/// Checks a pool size against `1..=max`.
pub fn validate_workers(value: usize, max: usize) -> Result<(), ConfigError> {
    if value == 0 || value > max {
        Err(ConfigError::Workers { value, max })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_jujus() {
        let c = ProvisionerConfig::default();
        assert_eq!(c.workers, 16);
        assert_eq!((c.retry.count, c.retry.delay), (10, Duration::from_secs(10)));
        assert_eq!(c.harvest_mode, HarvestMode::Destroyed);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn workers_must_be_within_one_to_max() {
        assert!(validate_workers(0, 100).is_err());
        assert!(validate_workers(1, 100).is_ok());
        assert!(validate_workers(100, 100).is_ok());
        let err = validate_workers(101, 100).unwrap_err();
        assert_eq!(err.to_string(), "workers must be between 1 and 100, got 101");
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let b = Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(10) };
        assert_eq!(b.ceiling(0), Duration::from_secs(1));
        assert_eq!(b.ceiling(3), Duration::from_secs(8));
        assert_eq!(b.ceiling(4), Duration::from_secs(10));
        assert_eq!(b.ceiling(1000), Duration::from_secs(10));
    }

    #[test]
    fn jitter_is_full_seeded_and_within_the_ceiling() {
        use rand::SeedableRng;
        let b = Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(60) };
        let draw = |seed| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            (0..200).map(|a| b.delay(a % 8, &mut rng)).collect::<Vec<_>>()
        };
        let d = draw(7);
        assert_eq!(d, draw(7), "a seed reproduces the delays");
        assert_ne!(d, draw(8));
        for (a, x) in d.iter().enumerate() {
            assert!(*x <= b.ceiling(a as u32 % 8));
        }
        // Full jitter: short and long delays both occur at the same attempt.
        let at5: Vec<_> = d.iter().skip(5).step_by(8).collect();
        assert!(at5.iter().any(|x| **x < Duration::from_secs(8)) && at5.iter().any(|x| **x > Duration::from_secs(24)));
        let r = RetryStrategy::new(3, Duration::from_secs(10));
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        assert!((0..100).all(|k| r.delay_before(k, &mut rng) <= Duration::from_secs(120)));
        assert_eq!(RetryStrategy::new(1, Duration::ZERO).delay_before(3, &mut rng), Duration::ZERO);
    }

    #[test]
    fn bad_rate_limits_and_harvest_cap_are_refused() {
        let mut c = ProvisionerConfig::default();
        c.rate_limits.start = Some(crate::config::rate_limits::BucketLimit::new(0, 1.0));
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "rate limit for start calls: burst must be at least 1, got 0"
        );
        let c = ProvisionerConfig { harvest_max_stops: 0, ..ProvisionerConfig::default() };
        assert_eq!(c.validate(), Err(ConfigError::HarvestMaxStops));
    }

    #[test]
    fn batch_size_out_of_range_is_refused() {
        for bad in [0, MAX_BATCH_SIZE + 1] {
            let c = ProvisionerConfig { batch_starts: true, batch_size: bad, ..ProvisionerConfig::default() };
            assert_eq!(c.validate(), Err(ConfigError::BatchSize { value: bad, max: MAX_BATCH_SIZE }));
        }
        let c = ProvisionerConfig { batch_starts: true, batch_size: MAX_BATCH_SIZE, ..ProvisionerConfig::default() };
        assert_eq!(c.validate(), Ok(()));
        assert!(!ProvisionerConfig::default().batch_starts, "batching is off by default");
        assert_eq!(ProvisionerConfig::default().batch_size, 100);
    }
}
