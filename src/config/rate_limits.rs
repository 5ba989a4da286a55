//! The client-side rate limits as configured: the classes of cloud API calls and one optional
//! bucket per class. Configuration vocabulary, below [`crate::config`] and the limiter actor
//! that enforces it.

use std::fmt;

use thiserror::Error;

/// A class of cloud API calls sharing one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiClass {
    /// StartInstance (EC2 `RunInstances`).
    Start,
    /// StopInstances and the other mutating calls (EC2 `TerminateInstances`, `CreateTags`).
    Stop,
    /// Listings and lookups (EC2 `DescribeInstances`, `DescribeAvailabilityZones`, ...).
    Describe,
}

impl ApiClass {
    /// Every class, in a fixed order.
    pub const ALL: [ApiClass; 3] = [ApiClass::Start, ApiClass::Stop, ApiClass::Describe];

    /// Its position in [`ApiClass::ALL`].
    pub(crate) fn index(self) -> usize {
        match self {
            ApiClass::Start => 0,
            ApiClass::Stop => 1,
            ApiClass::Describe => 2,
        }
    }

    /// Its name: `start`, `stop` or `describe`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiClass::Start => "start",
            ApiClass::Stop => "stop",
            ApiClass::Describe => "describe",
        }
    }
}

impl fmt::Display for ApiClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One bucket: `burst` calls at once, then `per_second`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketLimit {
    /// Bucket size: how many calls may go at once after a quiet spell.
    pub burst: u32,
    /// Refill rate: sustained calls per second (the most the adaptive rate ever reaches).
    pub per_second: f64,
}

impl BucketLimit {
    /// A bucket of `burst` tokens refilled at `per_second`.
    pub const fn new(burst: u32, per_second: f64) -> Self {
        Self { burst, per_second }
    }
}

/// Invalid rate limits.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RateLimitError {
    /// A bucket with no room.
    #[error("rate limit for {class} calls: burst must be at least 1, got {burst}")]
    Burst {
        /// The class.
        class: ApiClass,
        /// The value given.
        burst: u32,
    },
    /// A refill rate that is not a positive number.
    #[error("rate limit for {class} calls: per_second must be a positive number, got {per_second}")]
    Rate {
        /// The class.
        class: ApiClass,
        /// The value given.
        per_second: f64,
    },
}

/// The client-side limits, one optional bucket per class (`None` = that class is not limited).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimits {
    /// StartInstance.
    pub start: Option<BucketLimit>,
    /// StopInstances and other mutating calls.
    pub stop: Option<BucketLimit>,
    /// Listings and lookups.
    pub describe: Option<BucketLimit>,
}

impl Default for RateLimits {
    fn default() -> Self {
        Self::ec2()
    }
}

impl RateLimits {
    /// Sized from EC2's published request buckets (per account and region): mutating calls
    /// (`RunInstances`, `TerminateInstances`, tagging) 50 at once then 5 per second;
    /// non-mutating calls (`Describe*`) 100 at once then 20 per second. `RunInstances` also
    /// has a resource bucket of 1,000 instances refilled at 2 per second; a fleet that spends
    /// it is slowed by the cloud's throttling, which the adaptive rate then follows.
    pub const fn ec2() -> Self {
        Self {
            start: Some(BucketLimit::new(50, 5.0)),
            stop: Some(BucketLimit::new(50, 5.0)),
            describe: Some(BucketLimit::new(100, 20.0)),
        }
    }

    /// No client-side limit at all (a cloud without throttling, or benchmarks).
    pub const fn unlimited() -> Self {
        Self { start: None, stop: None, describe: None }
    }

    /// The bucket of one class.
    pub fn get(&self, class: ApiClass) -> Option<BucketLimit> {
        match class {
            ApiClass::Start => self.start,
            ApiClass::Stop => self.stop,
            ApiClass::Describe => self.describe,
        }
    }

    /// Whether any class is limited.
    pub fn any(&self) -> bool {
        ApiClass::ALL.iter().any(|c| self.get(*c).is_some())
    }

    /// Checks every bucket; the error names the first bad one.
    pub fn validate(&self) -> Result<(), RateLimitError> {
        for class in ApiClass::ALL {
            let Some(limit) = self.get(class) else { continue };
            if limit.burst == 0 {
                return Err(RateLimitError::Burst { class, burst: limit.burst });
            }
            if !(limit.per_second.is_finite() && limit.per_second > 0.0) {
                return Err(RateLimitError::Rate { class, per_second: limit.per_second });
            }
        }
        Ok(())
    }
}
