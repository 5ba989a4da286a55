//! What the metrics actor handles (besides `ProvisionerEvent`, which it counts).

use actix::prelude::*;

use super::state::Gauges;

/// One HTTP request answered.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub(crate) struct HttpDone {
    /// The method's label (`GET`, ..., or `other`: see `api::method_label`).
    pub method: &'static str,
    /// The matched route pattern (`/v1/machines`), or `unmatched`.
    pub route: String,
    /// The status code.
    pub code: u16,
    /// How long it took.
    pub seconds: f64,
}

/// One audit line of a refused request not written (past its peer's rate).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub(crate) struct AuditSuppressed;

/// One broker call completed.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub(crate) struct BrokerCallDone {
    /// The operation (`start_instance`, ...).
    pub op: &'static str,
    /// `ok`, or the kind of failure ([`BrokerError::kind`](crate::ports::BrokerError::kind)).
    pub result: &'static str,
    /// How long it took.
    pub seconds: f64,
}

/// The simulated cloud's instances by state, from the store its instances are written on when
/// that is not the model's ([`Store::companion`](crate::service::store::Store::companion)).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub(crate) struct CloudCounts(pub std::collections::BTreeMap<String, u64>);

/// Renders every metric with these gauges.
#[derive(Debug, Clone, Message)]
#[rtype(result = "String")]
pub(crate) struct Render(pub Gauges);

/// Renders the service's families alone, with these gauges: no model runs as `default`
/// (destroyed, or not started), so the model's state gauges (machines, instances, life) are
/// left out, whatever `default` last published.
#[derive(Debug, Clone, Message)]
#[rtype(result = "String")]
pub(crate) struct RenderService(pub Gauges);

/// This replica's role changed (replicas on PostgreSQL): `provisioner_leader` and
/// `provisioner_leader_transitions_total`.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub(crate) struct LeaderChanged {
    /// Whether it leads now.
    pub leader: bool,
    /// Whether this is a transition (`false`: the first report, as a follower).
    pub transition: bool,
}

/// Machines just added (pending): the start of `provisioner_time_to_running_seconds`.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub(crate) struct MachinesPending(pub Vec<crate::model::MachineId>);

/// A listing of the cloud answered (through the metered broker): every instance not
/// terminated, with its zone and capacity type; `at`: when the call was made.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub(crate) struct InstancesListed {
    /// The instances.
    pub instances: Vec<super::state::ListedInstance>,
    /// When the call was made.
    pub at: actix_rt::time::Instant,
}

/// A start answered (through the metered broker) at `at`: its instance.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub(crate) struct InstanceStarted {
    /// The instance.
    pub instance: crate::model::InstanceId,
    /// Its zone.
    pub zone: Option<String>,
    /// The capacity it runs on, when the cloud said.
    pub capacity: Option<crate::model::CapacityType>,
    /// When the answer came.
    pub at: actix_rt::time::Instant,
}

/// A stop or release answered (through the metered broker) at `at`: these instances are gone
/// from the model's cloud.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub(crate) struct InstancesGone {
    /// The instances.
    pub instances: Vec<crate::model::InstanceId>,
    /// When the answer came.
    pub at: actix_rt::time::Instant,
}
