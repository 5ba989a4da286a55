//! The model's repair policy (issue 34): when a machine whose instance stays stopped is
//! unhealthy (`repair-after`, unset by default: seed 000's rule, a stopped instance is expected
//! back and kept), and how many of the model's machines are repaired at a time
//! (`repair-max-unhealthy`, a count or a percentage; when more are unhealthy at once nothing is
//! repaired: the cloud, not the machines, is then probably at fault).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

/// Default `drift-budget`: one drifted machine replaced at a time.
pub const DEFAULT_DRIFT_BUDGET: usize = 1;

/// Default `repair-max-unhealthy`: a fifth of the model's machines.
pub const DEFAULT_MAX_UNHEALTHY: MaxUnhealthy = MaxUnhealthy::Percent(20);

/// A repair setting that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RepairError {
    /// `repair-after` is neither `off` nor a positive duration.
    #[error("repair-after must be a duration such as 10m (or \"off\"), got {0:?}")]
    After(String),
    /// `repair-max-unhealthy` is neither a count nor a percentage up to 100.
    #[error("repair-max-unhealthy must be a machine count such as 3 or a percentage such as 20%, got {0:?}")]
    MaxUnhealthy(String),
    /// `replace-drifted` is neither `true` nor `false`.
    #[error("replace-drifted must be true or false, got {0:?}")]
    ReplaceDrifted(String),
    /// `drift-budget` is not a whole number of 1 or more.
    #[error("drift-budget must be a whole number of machines, 1 or more, got {0:?}")]
    DriftBudget(String),
}

/// How many of a model's machines may be unhealthy at once and still be repaired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxUnhealthy {
    /// This many machines.
    Count(usize),
    /// This percentage (0..=100) of the model's machines, rounded down, at least one while the
    /// percentage is not zero (a model of three machines still repairs one at 20 %).
    Percent(u8),
}

impl MaxUnhealthy {
    /// The cap for a model of `population` machines.
    pub fn of(self, population: usize) -> usize {
        match self {
            MaxUnhealthy::Count(n) => n,
            MaxUnhealthy::Percent(0) => 0,
            MaxUnhealthy::Percent(p) => (population * usize::from(p) / 100).max(1).min(population),
        }
    }
}

impl fmt::Display for MaxUnhealthy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxUnhealthy::Count(n) => write!(f, "{n}"),
            MaxUnhealthy::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl FromStr for MaxUnhealthy {
    type Err = RepairError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || RepairError::MaxUnhealthy(s.to_owned());
        let t = s.trim();
        let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        match t.strip_suffix('%') {
            Some(p) if digits(p.trim_end()) => {
                let p: u8 = p.trim_end().parse().map_err(|_| bad())?;
                if p > 100 {
                    return Err(bad());
                }
                Ok(MaxUnhealthy::Percent(p))
            }
            Some(_) => Err(bad()),
            None if digits(t) => t.parse().map(MaxUnhealthy::Count).map_err(|_| bad()),
            None => Err(bad()),
        }
    }
}

impl serde::Serialize for MaxUnhealthy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MaxUnhealthy::Count(n) => s.serialize_u64(*n as u64),
            MaxUnhealthy::Percent(_) => s.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> serde::Deserialize<'de> for MaxUnhealthy {
    /// A count (`3`) or a percentage (`"20%"`).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Count(n) => usize::try_from(n).map(MaxUnhealthy::Count).map_err(serde::de::Error::custom),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// `repair-after`: how long an instance stays stopped before its machine is unhealthy;
/// `None` (`off`, the default) never.
pub fn parse_repair_after(s: &str) -> Result<Option<Duration>, RepairError> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("off") || t.is_empty() {
        return Ok(None);
    }
    match humantime::parse_duration(t) {
        Ok(d) if !d.is_zero() => Ok(Some(d)),
        _ => Err(RepairError::After(s.to_owned())),
    }
}

/// `repair-after` as the settings show it.
pub fn show_repair_after(after: Option<Duration>) -> String {
    after.map_or_else(|| "off".to_owned(), |d| humantime::format_duration(d).to_string())
}

/// A model's repair policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairPolicy {
    /// How long an instance stays stopped before its machine is unhealthy (and repaired);
    /// `None`: never (the default).
    pub after: Option<Duration>,
    /// How many of the model's machines are repaired at a time; more unhealthy at once hold
    /// every repair back.
    pub max_unhealthy: MaxUnhealthy,
    /// Whether drifted machines are replaced (`replace-drifted`; off: drift is reported only).
    pub replace_drifted: bool,
    /// How many drifted machines are replaced at a time (`drift-budget`).
    pub drift_budget: usize,
}

impl Default for RepairPolicy {
    fn default() -> Self {
        Self {
            after: None,
            max_unhealthy: DEFAULT_MAX_UNHEALTHY,
            replace_drifted: false,
            drift_budget: DEFAULT_DRIFT_BUDGET,
        }
    }
}

/// `replace-drifted`: `true` or `false`.
pub fn parse_replace_drifted(s: &str) -> Result<bool, RepairError> {
    match s.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(RepairError::ReplaceDrifted(s.to_owned())),
    }
}

/// `drift-budget`: a whole number of machines, 1 or more.
pub fn parse_drift_budget(s: &str) -> Result<usize, RepairError> {
    let t = s.trim();
    Some(t)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse().ok())
        .filter(|n| *n >= 1)
        .ok_or_else(|| RepairError::DriftBudget(s.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_parse_and_scale() {
        assert_eq!("3".parse(), Ok(MaxUnhealthy::Count(3)));
        assert_eq!(" 20% ".parse(), Ok(MaxUnhealthy::Percent(20)));
        for bad in ["", "-1", "+2", "101%", "x%", "2.5", "%"] {
            assert!(bad.parse::<MaxUnhealthy>().is_err(), "{bad:?}");
        }
        assert_eq!(MaxUnhealthy::Percent(20).of(10), 2);
        assert_eq!(MaxUnhealthy::Percent(20).of(3), 1, "at least one");
        assert_eq!(MaxUnhealthy::Percent(20).of(0), 0);
        assert_eq!(MaxUnhealthy::Percent(0).of(50), 0);
        assert_eq!(MaxUnhealthy::Count(4).of(2), 4);
        assert_eq!(MaxUnhealthy::Percent(20).to_string(), "20%");
    }

    #[test]
    fn repair_after_is_off_or_a_positive_duration() {
        assert_eq!(parse_repair_after("off"), Ok(None));
        assert_eq!(parse_repair_after("10m"), Ok(Some(Duration::from_secs(600))));
        assert!(parse_repair_after("0s").is_err());
        assert!(parse_repair_after("soon").is_err());
        assert_eq!(show_repair_after(Some(Duration::from_secs(600))), "10m");
        assert_eq!(show_repair_after(None), "off");
    }

    #[test]
    fn drift_settings_parse_strictly() {
        assert_eq!((parse_replace_drifted("true"), parse_replace_drifted("false")), (Ok(true), Ok(false)));
        assert!(parse_replace_drifted("yes").is_err());
        assert_eq!(parse_drift_budget(" 3 "), Ok(3));
        for bad in ["0", "-1", "+2", "x", ""] {
            assert!(parse_drift_budget(bad).is_err(), "{bad:?}");
        }
    }
}
