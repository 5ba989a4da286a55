//! The scenario file's value types that are checked alone while parsing: durations in
//! humantime's syntax and worker pool sizes (used by the tables in `spec.rs` and their
//! defaults in `defaults.rs`).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A humantime duration (`"0s"`, `"250ms"`, `"10s"`, `"2m"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Dur(pub Duration);

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map(Dur).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {text:?} ({e}); use e.g. \"0s\", \"250ms\", \"10s\", \"2m\""
            ))
        })
    }
}

/// Formats a duration as the report does: `0s`, `35s`, `1m 5s`, `250ms`.
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        "0s".into()
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// A worker pool size, checked to be in `1..=100` while parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Workers(pub usize);

impl<'de> Deserialize<'de> for Workers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        if !(1..=crate::config::MAX_WORKERS as i64).contains(&n) {
            return Err(serde::de::Error::custom(format!(
                "workers must be between 1 and {}, got {n}",
                crate::config::MAX_WORKERS
            )));
        }
        Ok(Workers(n as usize))
    }
}
