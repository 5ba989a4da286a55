//! Placement directives as Juju's providers read them (`--to zone=az2`, `--to subnet=SUBNET`),
//! and the rule for application names. Plain logic, no I/O.

use std::fmt;

use thiserror::Error;

/// Where a machine must go.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Placement {
    /// `zone=NAME`: in this availability zone.
    Zone(String),
    /// `subnet=ID`: on this subnet, hence in its zones (`DeriveAvailabilityZones`).
    Subnet(String),
}

/// Why a placement directive or an application name is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlacementError {
    /// Neither `zone=NAME` nor `subnet=ID`.
    #[error("invalid placement {0:?}: expected zone=ZONE or subnet=SUBNET")]
    Invalid(String),
    /// An application name that breaks Juju's rule.
    #[error(
        "invalid application name {0:?}: use lowercase letters, digits and hyphens, starting with a letter (each part between hyphens must have a letter; no hyphen at the end)"
    )]
    ApplicationName(String),
}

impl Placement {
    /// Parses `zone=NAME` or `subnet=ID` (surrounding blanks ignored).
    pub fn parse(text: &str) -> Result<Placement, PlacementError> {
        let invalid = || PlacementError::Invalid(text.to_owned());
        let (kind, value) = text.trim().split_once('=').ok_or_else(invalid)?;
        let ok =
            !value.is_empty() && value.chars().all(|c| !c.is_whitespace() && !c.is_control() && c != '=' && c != ',');
        match kind {
            "zone" if ok => Ok(Placement::Zone(value.to_owned())),
            "subnet" if ok => Ok(Placement::Subnet(value.to_owned())),
            _ => Err(invalid()),
        }
    }

    /// The zone the directive pins, if it is `zone=`.
    pub fn zone(&self) -> Option<&str> {
        match self {
            Placement::Zone(z) => Some(z),
            Placement::Subnet(_) => None,
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Zone(z) => write!(f, "zone={z}"),
            Placement::Subnet(s) => write!(f, "subnet={s}"),
        }
    }
}

/// Juju's application-name rule (`names.IsValidApplication`): lowercase letters and digits in
/// hyphen-separated parts, the first starting with a letter, every part holding a letter
/// (`mysql`, `wordpress-2x`; not `2x`, `web-2`, `web-`, `Web`, `a--b`).
pub fn check_application_name(name: &str) -> Result<(), PlacementError> {
    let bad = || PlacementError::ApplicationName(name.to_owned());
    let mut parts = name.split('-');
    let first = parts.next().unwrap_or_default();
    if !first.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(bad());
    }
    let part_ok = |p: &str| {
        p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()) && p.chars().any(|c| c.is_ascii_lowercase())
    };
    if part_ok(first) && parts.all(part_ok) {
        Ok(())
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_and_subnet_directives_parse() {
        assert_eq!(Placement::parse("zone=az2"), Ok(Placement::Zone("az2".into())));
        assert_eq!(Placement::parse(" subnet=subnet-az1 "), Ok(Placement::Subnet("subnet-az1".into())));
        assert_eq!(Placement::parse("zone=az2").unwrap().to_string(), "zone=az2");
        assert_eq!(Placement::parse("subnet=s").unwrap().zone(), None);
        for bad in ["az2", "zone=", "host=3", "zone=a b", "zone=a=b", "", "lxd:3"] {
            assert_eq!(Placement::parse(bad), Err(PlacementError::Invalid(bad.into())), "{bad}");
        }
    }

    #[test]
    fn application_names_follow_juju() {
        for good in ["mysql", "wordpress-2x", "a", "a1", "web-front", "x-1a"] {
            assert_eq!(check_application_name(good), Ok(()), "{good}");
        }
        for bad in ["", "2x", "web-2", "web-", "-web", "Web", "a--b", "a_b", "a.b", "ä"] {
            assert!(check_application_name(bad).is_err(), "{bad}");
        }
    }
}
