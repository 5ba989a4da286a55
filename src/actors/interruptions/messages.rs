//! What the interruption poller handles (it sends the coordinator's `InterruptionsNoticed`).

use actix::prelude::*;

/// The notices with these receipts were acted on: the poller acknowledges them to the cloud.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct AcknowledgeNotices(pub Vec<String>);

/// The notices with these receipts could not be acted on yet (their instance is not known to
/// be a machine's, or the model could not be read): the poller forgets them without
/// acknowledging them, so that the cloud's next delivery of each is handed on again.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ReleaseNotices(pub Vec<String>);

/// The cloud warned that it takes a spot instance of this type away in this zone: the broker
/// is told ([`crate::ports::Broker::capacity_short`]), so that a replacement's start avoids
/// the type there where another fits.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct CapacityShort {
    /// The zone, if the cloud has zones.
    pub zone: Option<String>,
    /// The instance type.
    pub instance_type: String,
}

/// The states of hand-overs' replacements, each looked up by its start (the machine and the
/// start's nonce, [`crate::ports::Broker::instances_of_start`]): the state of the start's
/// instance (a running one first), `None` if none is listed or the lookup failed. The
/// coordinator asks while a replacement is not yet seen running.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<Option<crate::model::InstanceState>>")]
pub struct ReplacementStates(pub Vec<(crate::model::MachineId, String)>);

/// Our instances whose cloud status checks fail now ([`crate::ports::Broker::impaired_instances`],
/// issue 34); none when the call fails (the next listing asks again).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<crate::model::InstanceId>")]
pub struct ImpairedInstances;
