//! Capacity types (issue 33): what a machine would like (`on-demand`, `spot`, `prefer-spot`),
//! what one start call asks the cloud for (`spot` or `on-demand`), and the spot price cap.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A machine's capacity preference: what kind of capacity its instance may run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityPreference {
    /// On-demand capacity only (the default, as before capacity types existed).
    #[default]
    OnDemand,
    /// Spot capacity only: the start never falls back to on-demand; without spot capacity in
    /// any allowed zone it ends in a provisioning error that says so.
    Spot,
    /// Spot while it can be had (across every allowed zone and type), on-demand when not.
    PreferSpot,
}

impl CapacityPreference {
    /// Every value, in the order error messages list them.
    pub const ALL: [CapacityPreference; 3] =
        [CapacityPreference::OnDemand, CapacityPreference::Spot, CapacityPreference::PreferSpot];

    /// The kebab-case name: `on-demand`, `spot`, `prefer-spot`.
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityPreference::OnDemand => "on-demand",
            CapacityPreference::Spot => "spot",
            CapacityPreference::PreferSpot => "prefer-spot",
        }
    }

    /// Whether this is the default (`on-demand`): serialisations leave it out.
    pub fn is_default(&self) -> bool {
        *self == CapacityPreference::OnDemand
    }

    /// The capacity type a start asks for first: spot for `spot` and `prefer-spot`.
    pub fn first(self) -> CapacityType {
        match self {
            CapacityPreference::OnDemand => CapacityType::OnDemand,
            CapacityPreference::Spot | CapacityPreference::PreferSpot => CapacityType::Spot,
        }
    }

    /// Whether an instance of capacity type `got` honours this preference (`None`: the cloud
    /// did not say, taken as on-demand).
    pub fn allows(self, got: Option<CapacityType>) -> bool {
        match (self, got.unwrap_or_default()) {
            (CapacityPreference::PreferSpot, _) => true,
            (CapacityPreference::OnDemand, t) => t == CapacityType::OnDemand,
            (CapacityPreference::Spot, t) => t == CapacityType::Spot,
        }
    }
}

impl fmt::Display for CapacityPreference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A capacity preference other than `on-demand`, `spot` or `prefer-spot`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid capacity {0:?}: expected one of on-demand, spot, prefer-spot")]
pub struct CapacityError(pub String);

impl FromStr for CapacityPreference {
    type Err = CapacityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CapacityPreference::ALL.into_iter().find(|c| c.as_str() == s).ok_or_else(|| CapacityError(s.to_owned()))
    }
}

/// The capacity type one start call asks for, and what an instance runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    /// On-demand capacity (the default: what every call asked for before capacity types).
    #[default]
    OnDemand,
    /// Spot capacity.
    Spot,
}

impl CapacityType {
    /// The kebab-case name: `on-demand` or `spot`.
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityType::OnDemand => "on-demand",
            CapacityType::Spot => "spot",
        }
    }

    /// Whether this is on-demand (serialisations of a call's parameters leave it out).
    pub fn is_on_demand(&self) -> bool {
        *self == CapacityType::OnDemand
    }

    /// A shape (see `Constraints::shape`) as this capacity type's: spot's gains
    /// ` capacity=spot`, so that the allocator's capacity memory for spot starts is apart from
    /// on-demand's (a zone out of spot capacity may still have on-demand capacity).
    pub fn shape(self, shape: &str) -> String {
        match self {
            CapacityType::OnDemand => shape.to_owned(),
            CapacityType::Spot => format!("{shape} capacity=spot"),
        }
    }
}

impl fmt::Display for CapacityType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A price in US dollars per hour, kept in millionths of a dollar (so that the call parameters
/// that carry it compare exactly); written as a number of dollars (`0.035`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "f64", try_from = "f64")]
pub struct UsdPerHour {
    micros: u64,
}

impl UsdPerHour {
    /// `dollars` per hour; `None` unless finite and not negative.
    pub fn new(dollars: f64) -> Option<Self> {
        (dollars.is_finite() && dollars >= 0.0).then(|| Self { micros: (dollars * 1e6).round() as u64 })
    }

    /// The price in dollars per hour.
    pub fn dollars(self) -> f64 {
        self.micros as f64 / 1e6
    }
}

impl fmt::Display for UsdPerHour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} USD/hour", self.dollars())
    }
}

impl From<UsdPerHour> for f64 {
    fn from(p: UsdPerHour) -> f64 {
        p.dollars()
    }
}

impl TryFrom<f64> for UsdPerHour {
    type Error = String;
    fn try_from(dollars: f64) -> Result<Self, String> {
        Self::new(dollars).ok_or_else(|| format!("invalid price {dollars}: expected a number of dollars, 0 or more"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferences_parse_and_name_the_values_when_wrong() {
        assert_eq!("prefer-spot".parse::<CapacityPreference>(), Ok(CapacityPreference::PreferSpot));
        assert_eq!("spot".parse::<CapacityPreference>(), Ok(CapacityPreference::Spot));
        assert_eq!("on-demand".parse::<CapacityPreference>(), Ok(CapacityPreference::OnDemand));
        let err = "cheap".parse::<CapacityPreference>().unwrap_err().to_string();
        assert_eq!(err, "invalid capacity \"cheap\": expected one of on-demand, spot, prefer-spot");
        assert_eq!(serde_json::to_string(&CapacityPreference::PreferSpot).unwrap(), "\"prefer-spot\"");
        assert_eq!(serde_json::to_string(&CapacityType::OnDemand).unwrap(), "\"on-demand\"");
    }

    #[test]
    fn a_preference_starts_with_spot_unless_on_demand_and_allows_what_it_asked_for() {
        assert_eq!(CapacityPreference::OnDemand.first(), CapacityType::OnDemand);
        assert_eq!(CapacityPreference::Spot.first(), CapacityType::Spot);
        assert_eq!(CapacityPreference::PreferSpot.first(), CapacityType::Spot);
        assert!(CapacityPreference::PreferSpot.allows(Some(CapacityType::OnDemand)));
        assert!(!CapacityPreference::Spot.allows(Some(CapacityType::OnDemand)));
        assert!(!CapacityPreference::Spot.allows(None));
        assert!(!CapacityPreference::OnDemand.allows(Some(CapacityType::Spot)));
    }

    #[test]
    fn spot_shapes_are_apart_from_on_demand_ones() {
        assert_eq!(CapacityType::Spot.shape("arch=amd64"), "arch=amd64 capacity=spot");
        assert_eq!(CapacityType::OnDemand.shape("arch=amd64"), "arch=amd64");
    }

    #[test]
    fn prices_read_and_write_as_dollars() {
        let p: UsdPerHour = serde_json::from_str("0.035").unwrap();
        assert_eq!(p, UsdPerHour::new(0.035).unwrap());
        assert_eq!(serde_json::to_string(&p).unwrap(), "0.035");
        assert!(serde_json::from_str::<UsdPerHour>("-1").is_err());
    }
}
