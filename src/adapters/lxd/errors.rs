//! How an LXD call fails ([`CallError`]), and how LXD's failures map onto the provisioner's
//! failure kinds.

use std::time::Duration;

use thiserror::Error;

use crate::ports::BrokerError;

/// How a call failed.
#[derive(Debug, Error)]
pub enum CallError {
    /// No complete answer within the deadline: the call may have taken effect.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The connection could not be made: nothing was sent.
    #[error("cannot connect: {0}")]
    Connect(#[source] std::io::Error),
    /// The TLS handshake failed: nothing was sent.
    #[error("TLS handshake: {0}")]
    Handshake(#[source] std::io::Error),
    /// The HTTP exchange broke after it began: the call may have taken effect.
    #[error("HTTP: {0}")]
    Http(#[source] hyper::Error),
    /// LXD answered with an error.
    #[error("{message} (HTTP {status})")]
    Api {
        /// The HTTP status.
        status: u16,
        /// LXD's error text.
        message: String,
    },
    /// An operation ended in failure (its `err`).
    #[error("{0}")]
    Operation(String),
    /// An answer that is not LXD's envelope, or not what the call expects.
    #[error("unexpected answer: {0}")]
    Decode(String),
}

impl CallError {
    /// Whether the call may have taken effect although it failed (no answer, or the exchange
    /// broke midway).
    pub fn is_ambiguous(&self) -> bool {
        matches!(self, CallError::Timeout(_) | CallError::Http(_))
    }

    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            CallError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// LXD's message, for an error LXD itself answered (an API error or a failed operation).
    pub fn lxd_message(&self) -> Option<&str> {
        match self {
            CallError::Api { message, .. } | CallError::Operation(message) => Some(message),
            _ => None,
        }
    }
}

/// Maps a failed call onto a [`BrokerError`]. `what` says what was being done (`create
/// prov-…`); `member` is the cluster member the call was aimed at (`target=`), if any.
///
/// - no answer in time: on a member, [`BrokerError::ZoneUnreachable`] (the member is frozen or
///   cut off; the call may still take effect; another member may work); without one,
///   transient;
/// - a broken exchange or a refused connection: transient (the daemon may come back; a
///   repeat is safe: names are idempotent);
/// - HTTP 429: throttled; 5xx (other than an operation's own failure): transient;
/// - a member LXD says is offline or unreachable, or out of resources: zone-specific;
/// - anything else LXD answered (bad image, bad config, forbidden): zone-independent, with
///   LXD's message.
pub fn classify(e: &CallError, what: &str, member: Option<&str>) -> BrokerError {
    let text = format!("LXD {what}: {e}");
    match e {
        CallError::Timeout(_) => match member {
            Some(m) => BrokerError::zone_unreachable(format!(
                "LXD {what}: cluster member {m} did not answer within {:?} (the call may still take effect there)",
                timeout_of(e)
            )),
            None => BrokerError::transient(text),
        },
        CallError::Http(_) | CallError::Connect(_) | CallError::Handshake(_) | CallError::Decode(_) => {
            BrokerError::transient(text)
        }
        CallError::Api { status: 429, .. } => BrokerError::throttled(text),
        CallError::Api { .. } | CallError::Operation(_) => {
            let message = e.lxd_message().unwrap_or_default().to_ascii_lowercase();
            if member_trouble(&message) {
                BrokerError::zone_specific(text)
            } else if e.status().is_some_and(|s| s >= 500) && !message.contains("not found") {
                BrokerError::transient(text)
            } else {
                BrokerError::zone_independent(text)
            }
        }
    }
}

fn timeout_of(e: &CallError) -> Duration {
    match e {
        CallError::Timeout(d) => *d,
        _ => Duration::ZERO,
    }
}

/// Messages that mean "this member cannot take it now".
fn member_trouble(message: &str) -> bool {
    const MEMBER: [&str; 6] =
        ["offline", "unreachable", "failed to connect to", "no space left", "not enough", "evacuated"];
    MEMBER.iter().any(|m| message.contains(m))
}

/// Whether LXD's message says the instance already exists (a create repeated after an
/// ambiguous failure, or racing the first one still under way).
pub fn already_exists(e: &CallError) -> bool {
    e.status() == Some(409)
        || e.lxd_message().is_some_and(|m| {
            let m = m.to_ascii_lowercase();
            m.contains("already exists") || m.contains("busy running a \"create\"")
        })
}

/// Whether LXD's message says the instance is not there (a stop or delete of one gone).
pub fn not_found(e: &CallError) -> bool {
    e.status() == Some(404) || e.lxd_message().is_some_and(|m| m.to_ascii_lowercase().contains("not found"))
}

/// Whether LXD refused because another operation holds the instance (retry shortly).
pub fn busy(e: &CallError) -> bool {
    e.lxd_message().is_some_and(|m| m.to_ascii_lowercase().contains("busy"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::BrokerErrorKind as K;

    fn api(status: u16, message: &str) -> CallError {
        CallError::Api { status, message: message.into() }
    }

    #[test]
    fn lxd_failures_map_onto_the_provisioners_kinds() {
        let kind = |e: &CallError, member| classify(e, "create x", member).failure_kind();
        assert_eq!(kind(&CallError::Timeout(Duration::from_secs(10)), Some("m2")), K::ZoneUnreachable);
        assert_eq!(kind(&CallError::Timeout(Duration::from_secs(10)), None), K::Transient);
        let refused = CallError::Connect(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(kind(&refused, None), K::Transient);
        assert_eq!(kind(&api(429, "slow down"), None), K::Throttled);
        assert_eq!(kind(&api(404, "Image alias not found"), None), K::ZoneIndependent);
        assert_eq!(kind(&api(403, "not authorized"), None), K::ZoneIndependent);
        assert_eq!(kind(&api(500, "Member m2 is offline"), Some("m2")), K::ZoneSpecific);
        assert_eq!(kind(&api(503, "database busy"), None), K::Transient);
        assert_eq!(kind(&CallError::Operation("Failed to run: no space left on device".into()), None), K::ZoneSpecific);
        assert_eq!(kind(&CallError::Operation("Invalid value for limits.memory".into()), None), K::ZoneIndependent);
        let m = classify(&CallError::Timeout(Duration::from_secs(10)), "create prov-a", Some("m2")).message();
        assert!(m.contains("m2") && m.contains("did not answer") && m.contains("create prov-a"), "{m}");
    }

    #[test]
    fn repeats_and_gone_instances_are_recognised() {
        assert!(already_exists(&api(409, "x")));
        assert!(already_exists(&CallError::Operation(
            "Failed creating instance record: Add instance info to the database: This \"instances\" entry already exists"
                .into()
        )));
        assert!(already_exists(&CallError::Operation(
            "Failed creating instance record: Instance is busy running a \"create\" operation".into()
        )));
        assert!(!already_exists(&api(404, "Image alias not found")));
        assert!(not_found(&api(404, "Instance not found")));
        assert!(busy(&CallError::Operation("Instance is busy running a \"start\" operation".into())));
    }
}
