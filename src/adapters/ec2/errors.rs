//! How EC2's error codes map onto the provisioner's failure kinds.

use crate::ports::BrokerError;

/// Codes that mean "this zone cannot take it now": another zone may.
const ZONE_SPECIFIC: &[&str] = &[
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "Unsupported",
    // A spot price above the call's maximum: no spot capacity at that price here (another zone's
    // price may be lower; `prefer-spot` goes on to on-demand when none is).
    "SpotMaxPriceTooLow",
];

/// Codes that mean "slow down".
const THROTTLED: &[&str] =
    &["RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled", "TooManyRequestsException"];

/// Whether an error code means "slow down".
pub(super) fn is_throttling(code: Option<&str>) -> bool {
    code.is_some_and(|c| THROTTLED.contains(&c))
}

/// Codes that are a passing fault on AWS's side.
const TRANSIENT: &[&str] = &["InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable"];

/// Maps an EC2 error (`code` as AWS spells it, `None` when the request never got an answer)
/// onto a [`BrokerError`]. `zone` is the zone the call targeted, if any: an
/// `InvalidParameterValue` about that zone is zone-specific.
///
/// - capacity and `Unsupported` (in this zone) → zone-specific: fail over to another zone;
/// - `RequestLimitExceeded` and other throttling → throttled: the limiter slows down and the
///   call is retried, using no round;
/// - auth, quota (`UnauthorizedOperation`, `AuthFailure`, `InstanceLimitExceeded`,
///   `VcpuLimitExceeded`), bad image or parameters, and anything unknown → zone-independent;
/// - AWS internal errors and requests that got no answer (timeouts, connection errors) →
///   transient.
///
/// The message keeps AWS's code and text, so the machine's status says what AWS said.
pub fn classify(code: Option<&str>, message: &str, zone: Option<&str>) -> BrokerError {
    let Some(code) = code else {
        return BrokerError::transient(format!("no answer from EC2: {message}"));
    };
    let text = if message.is_empty() { code.to_owned() } else { format!("{code}: {message}") };
    if THROTTLED.contains(&code) {
        return BrokerError::throttled(text);
    }
    if ZONE_SPECIFIC.contains(&code) {
        return BrokerError::zone_specific(text);
    }
    if code == "InvalidParameterValue" && zone.is_some_and(|z| !z.is_empty() && message.contains(z)) {
        return BrokerError::zone_specific(text);
    }
    if TRANSIENT.contains(&code) {
        return BrokerError::transient(text);
    }
    BrokerError::zone_independent(text)
}
