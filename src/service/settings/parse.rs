//! The settings' values as the flags and the config file spell them: durations (humantime),
//! zone lists, and serde's helpers that parse a key with the same parser as its flag.

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Parses a duration as every flag and config key spells it (humantime: `500ms`, `2s`, `1m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// A list of zones; on the command line comma-separated, blanks dropped (`""`: no zones).
/// (A named type, so that clap takes it as one value, not as a repeated flag.)
pub type ZoneList = Vec<String>;

pub(super) fn parse_zone_list(s: &str) -> Result<ZoneList, String> {
    Ok(s.split(',').map(|z| z.trim().to_owned()).filter(|z| !z.is_empty()).collect())
}

pub(super) fn optional_from_str<'de, D: Deserializer<'de>, T: FromStr<Err: Display>>(
    d: D,
) -> Result<Option<T>, D::Error> {
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

pub(super) fn from_str<'de, D: Deserializer<'de>, T: FromStr<Err: Display>>(d: D) -> Result<T, D::Error> {
    String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
}

pub(super) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    parse_duration(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

pub(super) fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}
