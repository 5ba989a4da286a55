//! The cloud broker port.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use thiserror::Error;

use crate::model::{
    CapacityType, CloudInstance, Constraints, InstanceId, InstanceTags, MachineId, UsdPerHour, VolumeParams,
};

/// A boxed broker call.
pub type BrokerFuture<T> = BoxFuture<'static, Result<T, BrokerError>>;

/// How a broker call failed. The kind decides what the provisioner does next.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BrokerError {
    /// The call failed because of the zone it targeted (capacity, zone unavailable): another
    /// zone may work. Marks the zone as failed for this machine and fails over.
    #[error("{message}")]
    ZoneSpecific {
        /// The cloud's message.
        message: String,
    },
    /// The call would fail in any zone (quota, auth, bad image): uses up a retry round.
    #[error("{message}")]
    ZoneIndependent {
        /// The cloud's message.
        message: String,
    },
    /// The cloud throttled the call (`RequestLimitExceeded`): never a machine's failure; the
    /// provisioner waits and tries again without using a round or marking a zone.
    #[error("throttled: {message}")]
    Throttled {
        /// The cloud's message.
        message: String,
    },
    /// A passing or ambiguous fault (timeout, connection reset, a lost response, a 5xx): the
    /// call may have taken effect. A start retries it with the same client token and the same
    /// parameters (the cloud then returns the instance the first call made), using a round as
    /// a zone-independent failure does; listings and stops retry with backoff.
    #[error("{message}")]
    Transient {
        /// What went wrong.
        message: String,
    },
    /// The zone did not answer in time (LXD: a cluster member frozen or cut off, whose calls
    /// hang rather than fail): the call may still take effect there (ambiguous, as a
    /// transient failure), but repeating it in that zone would hang again. The provisioner
    /// marks the zone failed for the machine and fails over, looks for an instance of the
    /// start before its next call (with a new client token), and stops what the unanswered
    /// call makes later once the machine has its instance elsewhere.
    #[error("{message}")]
    ZoneUnreachable {
        /// What did not answer.
        message: String,
    },
    /// The broker does not implement this optional call (e.g. zones).
    #[error("not supported by this broker: {0}")]
    NotSupported(&'static str),
}

/// Whether a start call's outcome settles it: anything but an ambiguous failure (which the
/// start retries with the same client token, and a successor must be able to repeat). The
/// service drops a start's intent once its call is settled (`service::cloud::intents`); the
/// model checker does the same.
pub fn start_settled(outcome: &Result<StartedInstance, BrokerError>) -> bool {
    !matches!(outcome, Err(e) if e.is_ambiguous())
}

impl BrokerError {
    /// Whether the call may have taken effect although it failed (a transient failure: the
    /// response may have been lost). Zone-specific, zone-independent and throttled failures
    /// are definite: the cloud refused the call.
    pub fn is_ambiguous(&self) -> bool {
        matches!(self, BrokerError::Transient { .. } | BrokerError::ZoneUnreachable { .. })
    }

    /// A zone-specific failure.
    pub fn zone_specific(message: impl Into<String>) -> Self {
        Self::ZoneSpecific { message: message.into() }
    }
    /// A zone-independent failure.
    pub fn zone_independent(message: impl Into<String>) -> Self {
        Self::ZoneIndependent { message: message.into() }
    }
    /// A throttled call.
    pub fn throttled(message: impl Into<String>) -> Self {
        Self::Throttled { message: message.into() }
    }
    /// A transient failure.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::Transient { message: message.into() }
    }
    /// The zone-independent refusal of a spot call by a broker that does not start spot
    /// instances (issue 33): `prefer-spot` machines go on to on-demand at once; a `spot`
    /// machine's start fails saying so.
    pub fn no_spot() -> Self {
        Self::zone_independent("this cloud's broker does not start spot instances yet")
    }
    /// A zone that did not answer (ambiguous).
    pub fn zone_unreachable(message: impl Into<String>) -> Self {
        Self::ZoneUnreachable { message: message.into() }
    }
    /// The kind, as a value.
    pub fn failure_kind(&self) -> BrokerErrorKind {
        match self {
            BrokerError::ZoneSpecific { .. } => BrokerErrorKind::ZoneSpecific,
            BrokerError::ZoneIndependent { .. } => BrokerErrorKind::ZoneIndependent,
            BrokerError::Throttled { .. } => BrokerErrorKind::Throttled,
            BrokerError::Transient { .. } => BrokerErrorKind::Transient,
            BrokerError::ZoneUnreachable { .. } => BrokerErrorKind::ZoneUnreachable,
            BrokerError::NotSupported(_) => BrokerErrorKind::NotSupported,
        }
    }

    /// The kind, as a metrics label: `zone_specific`, `zone_independent`, `throttled`,
    /// `transient`, `zone_unreachable` or `not_supported`.
    pub fn kind(&self) -> &'static str {
        self.failure_kind().label()
    }

    /// The text written to a machine's status: the cloud's own message.
    pub fn message(&self) -> String {
        match self {
            BrokerError::ZoneSpecific { message }
            | BrokerError::ZoneIndependent { message }
            | BrokerError::Transient { message }
            | BrokerError::ZoneUnreachable { message } => message.clone(),
            BrokerError::Throttled { .. } | BrokerError::NotSupported(_) => self.to_string(),
        }
    }
}

/// The kind of a [`BrokerError`], without its message: what the provisioner decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BrokerErrorKind {
    /// [`BrokerError::ZoneSpecific`].
    ZoneSpecific,
    /// [`BrokerError::ZoneIndependent`].
    ZoneIndependent,
    /// [`BrokerError::Throttled`].
    Throttled,
    /// [`BrokerError::Transient`].
    Transient,
    /// [`BrokerError::ZoneUnreachable`].
    ZoneUnreachable,
    /// [`BrokerError::NotSupported`].
    NotSupported,
}

impl BrokerErrorKind {
    /// The kind as a label (metrics): `zone_specific`, `zone_independent`, `throttled`,
    /// `transient`, `zone_unreachable` or `not_supported`.
    pub fn label(self) -> &'static str {
        match self {
            BrokerErrorKind::ZoneSpecific => "zone_specific",
            BrokerErrorKind::ZoneIndependent => "zone_independent",
            BrokerErrorKind::Throttled => "throttled",
            BrokerErrorKind::Transient => "transient",
            BrokerErrorKind::ZoneUnreachable => "zone_unreachable",
            BrokerErrorKind::NotSupported => "not_supported",
        }
    }
}

/// An availability zone and whether new instances may go there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AvailabilityZone {
    /// Its name.
    pub name: String,
    /// Whether it accepts new instances.
    pub available: bool,
}

impl AvailabilityZone {
    /// An available zone.
    pub fn available(name: impl Into<String>) -> Self {
        Self { name: name.into(), available: true }
    }
}

/// Everything a broker needs to start one instance. Serialisable, so that a start's intent
/// (its client token and these parameters) can be written down before the call and the same
/// call repeated after a crash or a change of leader.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StartInstanceParams {
    /// The machine the instance is for.
    pub machine: MachineId,
    /// The zone to start in; `None` on a zoneless cloud.
    pub zone: Option<String>,
    /// Hardware and placement constraints.
    pub constraints: Constraints,
    /// Placement directive.
    pub placement: Option<String>,
    /// Volumes to create.
    pub volumes: Vec<VolumeParams>,
    /// `<host-tag>:<uuid>`, the same for every attempt of one start.
    pub nonce: String,
    /// Identity tags (model, machine, start) the instance must carry.
    pub tags: InstanceTags,
    /// Extra tags from the model.
    pub extra_tags: BTreeMap<String, String>,
    /// An idempotency token (EC2 `ClientToken`): a call with the same token and parameters
    /// returns the instance the first one made. A start keeps its token across retries of an
    /// ambiguous (transient) failure and takes a new one only after a definite failure.
    pub client_token: String,
    /// The other machines of its distribution group.
    pub distribution_group: Vec<MachineId>,
    /// The capacity type this call asks for (issue 33): on-demand (the default, left out of
    /// serialisations, so that intents written before it existed read the same) or spot. A
    /// broker that cannot start spot instances refuses a spot call with a zone-independent
    /// failure that says so ([`BrokerError::no_spot`]).
    #[serde(default, skip_serializing_if = "crate::model::CapacityType::is_on_demand")]
    pub capacity: CapacityType,
    /// The most a spot call pays (`ProvisionerConfig::spot_max_price`): a spot price above it
    /// counts as no spot capacity. `None`: no cap (the cloud's own, on-demand price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_max_price: Option<UsdPerHour>,
}

/// What a successful start returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedInstance {
    /// The new instance, as the cloud sees it.
    pub instance: CloudInstance,
    /// A display name, if the cloud has one.
    pub display_name: String,
}

/// One machine of a batched start: what differs from one instance of the call to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchMember {
    /// The machine the instance is for.
    pub machine: MachineId,
    /// Its start's nonce (`<host-tag>:<uuid>`).
    pub nonce: String,
    /// The identity tags (model, machine, start) its instance must carry.
    pub tags: InstanceTags,
    /// The other machines of its distribution group.
    pub distribution_group: Vec<MachineId>,
}

/// Everything a broker needs to start several instances of one zone and one shape in one call
/// (EC2: one `RunInstances` with `MinCount` 1 and `MaxCount` = the number of members, one
/// `ClientToken`; the instance with `AmiLaunchIndex` i is `members[i]`'s, tagged with its
/// machine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchStartParams {
    /// The zone every instance goes to; `None` on a zoneless cloud.
    pub zone: Option<String>,
    /// Hardware and placement constraints, shared.
    pub constraints: Constraints,
    /// Placement directive, shared.
    pub placement: Option<String>,
    /// Volumes to create with each instance.
    pub volumes: Vec<VolumeParams>,
    /// Extra tags from the model, shared.
    pub extra_tags: BTreeMap<String, String>,
    /// One idempotency token for the whole call: a call with the same token and the same
    /// members, in the same order, in the same zone, returns what the first one made and
    /// creates nothing.
    pub client_token: String,
    /// The machines, in launch order: the launch index of an instance is its member's
    /// position.
    pub members: Vec<BatchMember>,
    /// The capacity type the call asks for, shared (see [`StartInstanceParams::capacity`]).
    pub capacity: CapacityType,
    /// The spot price cap, shared (see [`StartInstanceParams::spot_max_price`]).
    pub spot_max_price: Option<UsdPerHour>,
}

impl BatchStartParams {
    /// The single-machine start of member `index`, with its own client token
    /// (`<batch token>#<index>`): what a broker that does not batch calls for it.
    pub fn member_params(&self, index: usize) -> Option<StartInstanceParams> {
        let m = self.members.get(index)?;
        Some(StartInstanceParams {
            machine: m.machine.clone(),
            zone: self.zone.clone(),
            constraints: self.constraints.clone(),
            placement: self.placement.clone(),
            volumes: self.volumes.clone(),
            nonce: m.nonce.clone(),
            tags: m.tags.clone(),
            extra_tags: self.extra_tags.clone(),
            client_token: format!("{}#{index}", self.client_token),
            distribution_group: m.distribution_group.clone(),
            capacity: self.capacity,
            spot_max_price: self.spot_max_price,
        })
    }
}

/// What a batched start answers, one entry per member in launch order: the member's instance,
/// or why it got none. A partial launch (EC2 under capacity pressure launches fewer than
/// `MaxCount`) answers instances for the first members and a zone-specific failure for the
/// rest; a failure of the whole call (throttled, refused, ambiguous) is the call's `Err`.
pub type BatchStarted = Vec<Result<StartedInstance, BrokerError>>;

/// What an interruption notice says about an instance (issue 33).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NoticeKind {
    /// It will be taken away at the notice's deadline (EC2: a spot interruption warning).
    Interruption,
    /// It is at an elevated risk of interruption (EC2: a rebalance recommendation).
    Rebalance,
    /// It is going now, warned or not (EC2: a state change to shutting-down or terminated).
    Terminating,
}

/// A cloud's notice that one of our instances is going, or may go (issue 33): read by
/// [`Broker::interruption_notices`], acknowledged by its receipt with
/// [`Broker::acknowledge_notices`] once the provisioner has acted on it. A notice not
/// acknowledged is answered again (as SQS redelivers a message not deleted), so a crash between
/// reading and acting loses none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterruptionNotice {
    /// The instance it is about.
    pub instance: InstanceId,
    /// What it says.
    pub kind: NoticeKind,
    /// How long from when it was received until the cloud takes the instance; `None` when the
    /// notice does not say (rebalance recommendations, terminations).
    pub deadline: Option<Duration>,
    /// What acknowledges it.
    pub receipt: String,
}

/// Paces the cloud calls a broker makes on its own inside one of the provisioner's calls (a
/// batched start's `CreateTags`, one per instance), by the client-side limiter that paces the
/// provisioner's calls: each such call waits for a token of its class first, then reports
/// whether the cloud throttled it (so the limiter learns the rate from them too).
pub trait Pacer: Send + Sync + 'static {
    /// Waits for a token of `class`; answers the epoch to report under.
    fn token(&self, class: crate::config::rate_limits::ApiClass) -> BoxFuture<'static, u64>;
    /// Reports how a call let through under `epoch` went: throttled or not.
    fn report(&self, class: crate::config::rate_limits::ApiClass, epoch: u64, throttled: bool);
}

/// A cloud that can start and stop instances.
///
/// Implementations must list only instances tagged with their model's identity: foreign
/// instances are invisible to the provisioner. Stopping an instance that is already gone
/// succeeds. Client tokens are the model's own: another model's start with the same token
/// makes its own instance. The broker contract suite (`testing::broker_contract`, feature
/// `test-util`) checks these promises on any implementation.
pub trait Broker: Send + Sync + 'static {
    /// Hands the broker the pacer of its follow-up calls (see [`Pacer`]), replacing any
    /// earlier one (a provisioner started again brings its new limiter). The default ignores
    /// it: a broker that makes no calls of its own needs none. A broker that wraps another
    /// passes it on.
    fn pace_follow_ups(&self, pacer: std::sync::Arc<dyn Pacer>) {
        let _ = pacer;
    }
    /// Starts one instance.
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance>;
    /// Whether [`Broker::start_instances`] is one cloud call (true) or the per-machine
    /// fallback (false, the default). The provisioner batches starts only on a broker that
    /// batches natively.
    fn batches_starts(&self) -> bool {
        false
    }
    /// Starts one instance per member of `params`, all in its zone and of its shape, each
    /// tagged with its own machine; answers one entry per member, in launch order.
    ///
    /// The default falls back to one [`Broker::start_instance`] per member, in order, each with
    /// the client token `<batch token>#<index>` (so a repeated batch repeats every member's
    /// token); it never fails as a whole: every member carries its own outcome.
    fn start_instances(&self, params: BatchStartParams) -> BrokerFuture<BatchStarted> {
        let calls: Vec<BrokerFuture<StartedInstance>> =
            (0..params.members.len()).filter_map(|i| params.member_params(i)).map(|p| self.start_instance(p)).collect();
        Box::pin(async move {
            let mut out = Vec::with_capacity(calls.len());
            for call in calls {
                out.push(call.await);
            }
            Ok(out)
        })
    }
    /// Terminates these instances (not "stop" in the EC2 sense: they are removed).
    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()>;
    /// Every non-terminated instance of this model, with its state (pending, running, stopped).
    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>>;
    /// The non-terminated instances tagged for this start (`machine` and the start's `nonce`),
    /// looked up before a start tries again with a new client token after an ambiguous
    /// failure ("look before you create again"). The default filters [`Broker::all_instances`];
    /// a cloud that can filter by tag on its side should.
    fn instances_of_start(&self, machine: MachineId, nonce: String) -> BrokerFuture<Vec<CloudInstance>> {
        let all = self.all_instances();
        Box::pin(async move {
            Ok(all
                .await?
                .into_iter()
                .filter(|i| {
                    i.tags.machine.as_ref() == Some(&machine) && i.tags.start.as_deref() == Some(nonce.as_str())
                })
                .filter(|i| i.state != crate::model::InstanceState::Terminated)
                .collect())
        })
    }
    /// Whether this cloud has availability zones; when false, the zone calls are not made.
    fn supports_zones(&self) -> bool {
        false
    }
    /// Whether the cloud's zones may change while the provisioner runs (the zone allocator
    /// then lists them again every resync period). A cloud whose zones are fixed by its
    /// configuration (the service's simulated cloud) says no: an idle model's allocator then
    /// holds no timer.
    fn zones_change(&self) -> bool {
        true
    }
    /// The cloud's zones, with availability.
    fn availability_zones(&self) -> BrokerFuture<Vec<AvailabilityZone>> {
        Box::pin(async { Err(BrokerError::NotSupported("availability_zones")) })
    }
    /// Zones implied by the start params (placement, volumes); empty = no restriction.
    fn derive_availability_zones(&self, _params: &StartInstanceParams) -> BrokerFuture<Vec<String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    /// Gives an instance new identity tags (machine reuse hands it to another machine).
    fn retag_instance(&self, _id: InstanceId, _tags: InstanceTags) -> BrokerFuture<()> {
        Box::pin(async { Err(BrokerError::NotSupported("retag_instance")) })
    }
    /// Whether this cloud warns of interruptions ([`Broker::interruption_notices`]); when
    /// false (the default) the provisioner starts no interruption poller.
    fn supports_interruptions(&self) -> bool {
        false
    }
    /// The interruption notices waiting (issue 33): answers those pending at once, else waits
    /// a bounded time (EC2: one SQS long poll) and answers what came, possibly none. Notices
    /// not acknowledged are answered again later. The default: not supported.
    fn interruption_notices(&self) -> BrokerFuture<Vec<InterruptionNotice>> {
        Box::pin(async { Err(BrokerError::NotSupported("interruption_notices")) })
    }
    /// Acknowledges notices by their receipts: they are answered no more. Acknowledging an
    /// unknown or already acknowledged receipt succeeds. The default does nothing.
    fn acknowledge_notices(&self, receipts: Vec<String>) -> BrokerFuture<()> {
        let _ = receipts;
        Box::pin(async { Ok(()) })
    }
    /// Our instances whose cloud status checks fail now (issue 34: EC2's instance or system
    /// status `impaired`; the simulated clouds' `cloud_impair`): a machine whose instance stays
    /// impaired for the model's `repair-after` is repaired. Instances of other models may be
    /// answered too (the caller keeps its own). The default: the cloud reports no status
    /// checks (none impaired).
    fn impaired_instances(&self) -> BrokerFuture<Vec<InstanceId>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    /// The image a start makes today (issue 34), in the form listings report an instance's
    /// [`crate::model::CloudInstance::image`] (EC2: the configured AMI id; LXD: the fingerprint
    /// the configured alias names now): an instance listed with another image has drifted.
    /// The default: the cloud does not say (no image drift is judged).
    fn current_image(&self) -> BrokerFuture<Option<String>> {
        Box::pin(async { Ok(None) })
    }
    /// A hint (issue 33): the cloud is short of `capacity` for `instance_type` in `zone` (it
    /// warned that it takes an instance of that type away there). A broker with a per-type
    /// fail-over avoids the type there for its capacity memory's length, as after a capacity
    /// refusal; the default ignores it.
    fn capacity_short(&self, zone: Option<&str>, instance_type: &str, capacity: crate::model::CapacityType) {
        let _ = (zone, instance_type, capacity);
    }
    /// Removes our identity from instances left alone on purpose (keep-instance, or dead
    /// while the harvest mode excluded `destroyed`), so that no later harvest, not even after
    /// a restart, takes them for ours: [`Broker::all_instances`] lists them no more. Required:
    /// a broker that could not release would have its kept instances harvested later.
    fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()>;
}

/// Implements [`Broker`] methods that hand the call on to a field holding another broker, for
/// the decorators that change a few calls and pass the rest on: inside an `impl Broker for
/// ...` block, `forward_broker!(inner: all_instances, availability_zones);` writes
/// `fn all_instances(&self) -> ... { self.inner.all_instances() }` and the like. Every method of
/// the trait can be named.
#[macro_export]
macro_rules! forward_broker {
    ($inner:ident: $($method:ident),+ $(,)?) => { $($crate::forward_broker!(@ $inner $method);)+ };
    (@ $inner:ident pace_follow_ups) => {
        fn pace_follow_ups(&self, pacer: ::std::sync::Arc<dyn $crate::ports::Pacer>) { self.$inner.pace_follow_ups(pacer) }
    };
    (@ $inner:ident start_instance) => {
        fn start_instance(&self, params: $crate::ports::StartInstanceParams)
            -> $crate::ports::BrokerFuture<$crate::ports::StartedInstance> { self.$inner.start_instance(params) }
    };
    (@ $inner:ident batches_starts) => { fn batches_starts(&self) -> bool { self.$inner.batches_starts() } };
    (@ $inner:ident start_instances) => {
        fn start_instances(&self, params: $crate::ports::BatchStartParams)
            -> $crate::ports::BrokerFuture<$crate::ports::BatchStarted> { self.$inner.start_instances(params) }
    };
    (@ $inner:ident stop_instances) => {
        fn stop_instances(&self, ids: Vec<$crate::model::InstanceId>) -> $crate::ports::BrokerFuture<()> {
            self.$inner.stop_instances(ids)
        }
    };
    (@ $inner:ident all_instances) => {
        fn all_instances(&self) -> $crate::ports::BrokerFuture<Vec<$crate::model::CloudInstance>> { self.$inner.all_instances() }
    };
    (@ $inner:ident instances_of_start) => {
        fn instances_of_start(&self, machine: $crate::model::MachineId, nonce: String)
            -> $crate::ports::BrokerFuture<Vec<$crate::model::CloudInstance>> { self.$inner.instances_of_start(machine, nonce) }
    };
    (@ $inner:ident supports_zones) => { fn supports_zones(&self) -> bool { self.$inner.supports_zones() } };
    (@ $inner:ident zones_change) => { fn zones_change(&self) -> bool { self.$inner.zones_change() } };
    (@ $inner:ident availability_zones) => {
        fn availability_zones(&self) -> $crate::ports::BrokerFuture<Vec<$crate::ports::AvailabilityZone>> {
            self.$inner.availability_zones()
        }
    };
    (@ $inner:ident derive_availability_zones) => {
        fn derive_availability_zones(&self, params: &$crate::ports::StartInstanceParams)
            -> $crate::ports::BrokerFuture<Vec<String>> { self.$inner.derive_availability_zones(params) }
    };
    (@ $inner:ident retag_instance) => {
        fn retag_instance(&self, id: $crate::model::InstanceId, tags: $crate::model::InstanceTags)
            -> $crate::ports::BrokerFuture<()> { self.$inner.retag_instance(id, tags) }
    };
    (@ $inner:ident supports_interruptions) => {
        fn supports_interruptions(&self) -> bool { self.$inner.supports_interruptions() }
    };
    (@ $inner:ident interruption_notices) => {
        fn interruption_notices(&self)
            -> $crate::ports::BrokerFuture<Vec<$crate::ports::InterruptionNotice>> { self.$inner.interruption_notices() }
    };
    (@ $inner:ident acknowledge_notices) => {
        fn acknowledge_notices(&self, receipts: Vec<String>) -> $crate::ports::BrokerFuture<()> {
            self.$inner.acknowledge_notices(receipts)
        }
    };
    (@ $inner:ident impaired_instances) => {
        fn impaired_instances(&self) -> $crate::ports::BrokerFuture<Vec<$crate::model::InstanceId>> {
            self.$inner.impaired_instances()
        }
    };
    (@ $inner:ident current_image) => {
        fn current_image(&self) -> $crate::ports::BrokerFuture<Option<String>> { self.$inner.current_image() }
    };
    (@ $inner:ident capacity_short) => {
        fn capacity_short(&self, zone: Option<&str>, instance_type: &str, capacity: $crate::model::CapacityType) {
            self.$inner.capacity_short(zone, instance_type, capacity)
        }
    };
    (@ $inner:ident release_instances) => {
        fn release_instances(&self, ids: Vec<$crate::model::InstanceId>) -> $crate::ports::BrokerFuture<()> {
            self.$inner.release_instances(ids)
        }
    };
}

/// What a simulated cloud answers to a start whose client token already made `made` (the
/// instance of the first call with that token): `Ok` (the repeat returns `made` and creates
/// nothing) when the parameters are the same machine and zone, else EC2's
/// `IdempotentParameterMismatch`, a definite failure. Shared by the fake cloud and the
/// service's simulated cloud so that both keep tokens as EC2 does.
#[cfg(any(feature = "test-util", feature = "serve"))]
pub(crate) fn repeated_start(params: &StartInstanceParams, made: &CloudInstance) -> Result<(), BrokerError> {
    let mismatch = |what: String| {
        BrokerError::zone_independent(format!(
            "IdempotentParameterMismatch: client token {} was used for {what}",
            params.client_token
        ))
    };
    if made.tags.machine.as_ref() != Some(&params.machine) {
        return Err(mismatch("another machine".into()));
    }
    if made.zone != params.zone {
        let zone = made.zone.as_deref().unwrap_or("none");
        return Err(mismatch(format!("a start in another zone ({zone})")));
    }
    Ok(())
}

/// The key under which a simulated cloud remembers a client token: tokens are the model's
/// own (EC2 scopes them to the account, and the EC2 broker folds the model's uuid into
/// them), so two models whose machine ids and seeded nonces coincide never get each
/// other's instance.
#[cfg(any(feature = "test-util", feature = "serve"))]
pub(crate) fn token_key(model: &str, client_token: &str) -> String {
    let mut key = String::with_capacity(model.len() + 1 + client_token.len());
    key.push_str(model);
    key.push('\n');
    key.push_str(client_token);
    key
}
