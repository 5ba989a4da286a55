//! The fake cloud.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_rt::time::Instant;

use super::compact::{token_moved, FakeInstance, Names, Stored, Tokens};
use crate::actors::limiter::{RateLimits, TokenBucket};

use crate::model::instance_types::{self, has_hardware_constraint, InstanceType, TypeFailover};
use crate::model::{CapacityType, CloudInstance, InstanceId, InstanceState, InstanceTags, MachineId, MultiMap};
use crate::ports::{
    repeated_start, token_key, AvailabilityZone, BatchStartParams, BatchStarted, Broker, BrokerError, BrokerFuture,
    InterruptionNotice, NoticeKind, StartInstanceParams, StartedInstance,
};

/// A kind of broker call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CloudOp {
    /// `all_instances`.
    AllInstances,
    /// `availability_zones`.
    AvailabilityZones,
    /// `derive_availability_zones`.
    DeriveZones,
    /// `start_instance`.
    StartInstance,
    /// `stop_instances`.
    StopInstances,
    /// `release_instances`.
    ReleaseInstances,
    /// `retag_instance`.
    RetagInstance,
}

impl CloudOp {
    /// The name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            CloudOp::AllInstances => "all_instances",
            CloudOp::AvailabilityZones => "availability_zones",
            CloudOp::DeriveZones => "derive_zones",
            CloudOp::StartInstance => "start_instance",
            CloudOp::StopInstances => "stop_instances",
            CloudOp::ReleaseInstances => "release_instances",
            CloudOp::RetagInstance => "retag_instance",
        }
    }
}

/// One broker call, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    /// When it began, since the cloud was created.
    pub at: Duration,
    /// Which call.
    pub op: CloudOp,
    /// The machine (starts, derive).
    pub machine: Option<MachineId>,
    /// The zone (starts).
    pub zone: Option<String>,
    /// The instances (stops, releases), or the one a start made.
    pub instances: Vec<InstanceId>,
    /// Whether it succeeded (`None` while in flight).
    pub ok: Option<bool>,
    /// Its error text.
    pub error: Option<String>,
    /// The params of a start.
    pub params: Option<Box<StartInstanceParams>>,
    /// The cloud refused the call for lack of a rate-limit token.
    pub throttled: bool,
    /// When it completed (`None` while in flight).
    pub done_at: Option<Duration>,
    /// The instance type a start made its instance with (when its constraints or the cloud's
    /// default type chose one).
    pub instance_type: Option<String>,
    /// The instance types a start tried first that were out of capacity in its zone, in order
    /// (the per-type fail-over within the one call).
    pub failed_types: Vec<String>,
    /// The batched call this start was part of (one record per machine of the call, all with
    /// the same id); `None` for a single-machine start.
    pub batch: Option<String>,
}

/// A scripted StartInstance failure: the first `times` matching calls fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The machine whose starts fail.
    pub machine: MachineId,
    /// How many matching calls fail.
    pub times: u32,
    /// Only calls into this zone match (and count).
    pub zone: Option<String>,
    /// The failure would happen in any zone.
    pub zone_independent: bool,
    /// The error text.
    pub message: String,
    /// The call makes the instance (tagged, listed, its client token remembered) and then
    /// fails with a transient error, as a call whose response was lost would.
    pub lost_response: bool,
}

impl Fault {
    /// The first `times` starts of `machine` fail with `message` in the zone they try, each
    /// failure moving the start to another zone.
    pub fn zone_specific(machine: &str, times: u32, message: &str) -> Self {
        Fault {
            machine: MachineId::new(machine),
            times,
            zone: None,
            zone_independent: false,
            message: message.into(),
            lost_response: false,
        }
    }

    /// The first `times` starts of `machine` fail with `message`, as they would in any zone.
    pub fn zone_independent(machine: &str, times: u32, message: &str) -> Self {
        Fault { zone_independent: true, ..Self::zone_specific(machine, times, message) }
    }
}

/// A scripted capacity failure of one instance type: the first `times` starts that try
/// `instance_type` (in `zone`, for `machine`, when given) fail there zone-specifically, and the
/// start moves on to the next type that satisfies its constraints in the same zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeFault {
    /// The instance type out of capacity.
    pub instance_type: String,
    /// Only tries into this zone match (and count).
    pub zone: Option<String>,
    /// Only this machine's tries match.
    pub machine: Option<MachineId>,
    /// How many matching tries fail.
    pub times: u32,
    /// The error text.
    pub message: String,
}

/// A scripted want of spot capacity (issue 33): the first `times` spot starts that match (into
/// `zone`, of `instance_type`, for `machine`, each when given) are refused there as EC2 refuses
/// a spot request without capacity: a zone-specific failure (of that type alone, when the
/// fault names one: the per-type fail-over then tries the next type in the zone). On-demand
/// starts never match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpotFault {
    /// Only spot starts into this zone match (and count).
    pub zone: Option<String>,
    /// Only spot tries of this instance type match.
    pub instance_type: Option<String>,
    /// Only this machine's spot starts match.
    pub machine: Option<MachineId>,
    /// How many matching spot starts are refused.
    pub times: u32,
    /// The error text; `None`: [`NO_SPOT_CAPACITY`].
    pub message: Option<String>,
}

/// What the fake cloud answers a spot start without spot capacity, by default (EC2's text).
pub const NO_SPOT_CAPACITY: &str =
    "InsufficientInstanceCapacity: There is no Spot capacity available that matches your request.";

/// The spot price of a type, as a share of its on-demand price, unless the cloud is given a
/// spot price of its own ([`FakeCloud::set_spot_price`]): the model's
/// [`instance_types::SPOT_PRICE_RATIO`], which [`instance_types::hourly_price`] applies.
pub const SPOT_PRICE_RATIO: f64 = instance_types::SPOT_PRICE_RATIO;

/// A scripted partial launch (EC2 under capacity pressure launches fewer instances than a call
/// asks for): the first `times` start calls into `zone` (any, when `None`) that carry
/// `machine` (any, when `None`) launch only their first `launched` machines; the others get a
/// zone-specific failure with `message`. A single-machine start is a call of one: it fails
/// when `launched` is 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialLaunch {
    /// Only calls into this zone match (and count).
    pub zone: Option<String>,
    /// Only calls carrying this machine match.
    pub machine: Option<MachineId>,
    /// How many machines of a matching call get an instance.
    pub launched: u32,
    /// How many matching calls launch partially.
    pub times: u32,
    /// The failure of the machines left out.
    pub message: String,
}

/// What a batched call made, kept under its client token: a repeat with the same token and
/// the same machines in the same zone answers it again and creates nothing.
#[derive(Debug, Clone)]
struct BatchMade {
    zone: Option<String>,
    machines: Vec<MachineId>,
    results: Vec<Result<InstanceId, BrokerError>>,
}

/// The fake cloud's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloudSnapshot {
    /// Every instance that ever existed, by id.
    pub instances: BTreeMap<InstanceId, FakeInstance>,
    /// Every call, in the order made.
    pub calls: Vec<CallRecord>,
    /// The zones.
    pub zones: Vec<AvailabilityZone>,
    /// Calls still in flight.
    pub in_flight: usize,
    /// When the cloud last changed or answered, since its creation.
    pub last_activity: Duration,
    /// Every moment a machine got a second live instance (invariant 1), as sentences.
    pub duplicates: Vec<String>,
    /// Calls made, by kind (kept even when the call log is off).
    pub counts: BTreeMap<CloudOp, usize>,
}

impl CloudSnapshot {
    /// A cloud that holds these instances and has had no call.
    pub fn of(instances: impl IntoIterator<Item = (InstanceId, FakeInstance)>) -> Self {
        CloudSnapshot { instances: instances.into_iter().collect(), ..Self::default() }
    }

    /// The calls of one kind.
    pub fn calls_of(&self, op: CloudOp) -> Vec<&CallRecord> {
        self.calls.iter().filter(|c| c.op == op).collect()
    }

    /// Instances (not terminated) started for a machine.
    pub fn live_instances_of(&self, machine: &MachineId) -> Vec<&FakeInstance> {
        self.instances
            .values()
            .filter(|i| {
                i.instance.tags.machine.as_ref() == Some(machine) && i.instance.state != InstanceState::Terminated
            })
            .collect()
    }

    /// An instance's state.
    pub fn state_of(&self, id: &str) -> Option<InstanceState> {
        self.instances.get(&InstanceId::new(id)).map(|i| i.instance.state)
    }
}

/// The longest [`Broker::interruption_notices`] waits on the fake cloud when no notice is
/// pending (on the paused clock; EC2's long poll waits up to 20 s).
pub const NOTICE_WAIT: Duration = Duration::from_secs(1);

/// How long a notice answered and not acknowledged stays hidden before it is answered again (as
/// SQS's visibility timeout).
pub const NOTICE_VISIBILITY: Duration = Duration::from_secs(30);

/// A notice not yet acknowledged.
#[derive(Debug, Clone)]
struct PendingNotice {
    receipt: String,
    instance: InstanceId,
    kind: NoticeKind,
    /// When (on the cloud's clock) the instance is taken away.
    deadline: Option<Duration>,
    /// Hidden until then (answered and not acknowledged).
    visible_at: Duration,
}

struct CloudActor {
    model_uuid: String,
    /// Interruption notices not acknowledged, in the order sent.
    notices: Vec<PendingNotice>,
    /// Receipts made so far.
    receipts: u64,
    /// Instances warned of an interruption, with when (on the cloud's clock) the warning runs
    /// out: during it their machine may have a second live instance (its replacement).
    warned: BTreeMap<InstanceId, Duration>,
    /// Instances whose status checks fail (`cloud_impair`, issue 34).
    impaired: std::collections::BTreeSet<InstanceId>,
    /// The image a start uses now (`set_image`, issue 34; none: the cloud does not say, and
    /// no image drift is judged).
    image: Option<String>,
    zoned: bool,
    zones: Vec<AvailabilityZone>,
    /// Every instance, compactly (about 80 bytes held inline; see [`Stored`]). Ids are made in
    /// order, which would leave the map's B-tree nodes half empty: it is rebuilt packed as it
    /// grows (`packing`).
    instances: BTreeMap<InstanceId, Stored>,
    /// When `instances` is rebuilt packed (ids are made in order).
    packing: crate::model::Packing,
    /// The model uuids, zones, instance types and nonce hosts the instances name.
    names: Names,
    next_id: u64,
    start_latency: Duration,
    stop_latency: Duration,
    faults: Vec<Fault>,
    derived: BTreeMap<MachineId, Vec<String>>,
    /// Subnets and their zones, for `subnet=ID` placements.
    subnets: BTreeMap<String, Vec<String>>,
    fail_next: BTreeMap<CloudOp, VecDeque<String>>,
    /// Client tokens seen, per model (tokens are the model's own): mostly as their hash alone,
    /// checked against the instance they made (see [`Tokens`]).
    tokens: BTreeMap<String, Tokens>,
    /// Client tokens of batched calls, with what each made (looked up, never iterated).
    batch_tokens: std::collections::HashMap<String, BatchMade>,
    /// Batched calls so far (their ids in the call log).
    batches: u64,
    /// Scripted partial launches.
    partials: Vec<PartialLaunch>,
    calls: Vec<CallRecord>,
    epoch: Instant,
    start_bucket: Option<TokenBucket>,
    stop_bucket: Option<TokenBucket>,
    describe_bucket: Option<TokenBucket>,
    in_flight: usize,
    last_activity: Duration,
    duplicates: Vec<String>,
    /// Instances by the machine first tagged on them (retags are rare and checked by tag).
    by_machine: MultiMap<MachineId, InstanceId>,
    /// Keep every start's params in the call log (off for benchmarks).
    record_params: bool,
    /// Keep the call log at all (off for benchmarks; the counts are always kept).
    log_calls: bool,
    /// Calls made, by kind.
    counts: BTreeMap<CloudOp, usize>,
    /// The instance-type catalogue (the shipped one).
    catalogue: Vec<InstanceType>,
    /// The type of a machine without hardware constraints; `None`: such a machine's instance
    /// has no type (as before types existed).
    default_type: Option<String>,
    /// Scripted capacity failures per instance type.
    type_faults: Vec<TypeFault>,
    /// The per-type capacity fail-over (order and memory), as the EC2 broker keeps it.
    failover: TypeFailover,
    /// The same for spot tries: a type out of spot capacity in a zone is remembered apart
    /// from its on-demand capacity there.
    spot_failover: TypeFailover,
    /// Scripted wants of spot capacity.
    spot_faults: Vec<SpotFault>,
    /// The spot price of every start; `None`: [`SPOT_PRICE_RATIO`] of its type's on-demand
    /// price (unknown for a start without a type: never above a maximum).
    spot_price: Option<crate::model::UsdPerHour>,
}

impl Actor for CloudActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::actors::unlimited_mailbox(ctx);
    }
}

impl CloudActor {
    fn log(
        &mut self,
        op: CloudOp,
        machine: Option<MachineId>,
        zone: Option<String>,
        instances: Vec<InstanceId>,
    ) -> usize {
        let at = self.epoch.elapsed();
        self.last_activity = at;
        self.in_flight += 1;
        *self.counts.entry(op).or_default() += 1;
        if !self.log_calls {
            return usize::MAX;
        }
        self.calls.push(CallRecord {
            at,
            op,
            machine,
            zone,
            instances,
            ok: None,
            error: None,
            params: None,
            throttled: false,
            done_at: None,
            instance_type: None,
            failed_types: Vec::new(),
            batch: None,
        });
        self.calls.len() - 1
    }

    /// Logs a call other than a start and refuses it when it is throttled or scripted to fail
    /// (a scripted failure finishes its record); answers its record's index.
    fn admit(
        &mut self,
        op: CloudOp,
        machine: Option<MachineId>,
        instances: Vec<InstanceId>,
    ) -> Result<usize, BrokerError> {
        let idx = self.log(op, machine, None, instances);
        if let Some(err) = self.throttle(idx, op) {
            return Err(err);
        }
        if let Some(m) = self.scripted_failure(op) {
            self.finish(idx, Some(m.clone()));
            return Err(BrokerError::transient(m));
        }
        Ok(idx)
    }

    fn finish(&mut self, idx: usize, error: Option<String>) {
        let now = self.epoch.elapsed();
        self.last_activity = now;
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(c) = self.calls.get_mut(idx) {
            c.ok = Some(error.is_none());
            c.error = error;
            c.done_at = Some(now);
        }
    }

    fn throttle(&mut self, idx: usize, kind: CloudOp) -> Option<BrokerError> {
        let bucket = match kind {
            CloudOp::StartInstance => self.start_bucket.as_mut(),
            CloudOp::StopInstances => self.stop_bucket.as_mut(),
            CloudOp::AllInstances | CloudOp::AvailabilityZones | CloudOp::DeriveZones => self.describe_bucket.as_mut(),
            CloudOp::ReleaseInstances | CloudOp::RetagInstance => None,
        }?;
        if bucket.take(self.epoch.elapsed()) {
            return None;
        }
        if let Some(c) = self.calls.get_mut(idx) {
            c.throttled = true;
        }
        self.finish(idx, Some("RequestLimitExceeded".into()));
        Some(BrokerError::throttled("RequestLimitExceeded"))
    }

    /// Invariant 1, at the moment a start creates an instance: no other live instance of ours
    /// is tagged for the same machine, except one instance whose interruption warning is
    /// running (issue 33) or the instance this one's start replaces (its nonce names it: a
    /// repair or a drift replacement, issue 34, whose reason the checker judges): a machine has
    /// at most two live instances, and two only during a hand-over.
    /// `before`: the instances tagged for the machine before this one; `replaces`: the
    /// instance the start that made it replaces, if any.
    fn check_duplicate(&mut self, id: &InstanceId, m: &MachineId, before: &[InstanceId], replaces: Option<&str>) {
        if before.is_empty() {
            return;
        }
        let model = self.names.find(&self.model_uuid);
        let others: Vec<String> = before
            .iter()
            .filter_map(|id| self.instances.get_key_value(id))
            .filter(|(_, i)| i.ours(model) && i.machine() == Some(m))
            .filter(|(_, i)| i.state != InstanceState::Terminated)
            .map(|(id, _)| id.to_string())
            .collect();
        let now = self.epoch.elapsed();
        let warned = |o: &String| self.warned.get(&InstanceId::new(o.as_str())).is_some_and(|d| now < *d);
        // The instance this start replaces (its nonce names it): a hand-over. Why it may be
        // replaced (a warning, a repair, drift) is the scenario checker's to judge.
        let repaired = |o: &String| replaces == Some(o.as_str());
        if others.len() > 1 {
            self.duplicates.push(format!("machine {m} has three live instances: {} and {id}", others.join(", ")));
        } else if !others.is_empty() && !others.iter().all(|o| warned(o) || repaired(o)) {
            self.duplicates.push(format!("machine {m} has two live instances: {} and {id}", others.join(", ")));
        }
    }

    fn record_new(&mut self, instance: FakeInstance) {
        let (id, stored) = Stored::new(instance, &mut self.names);
        self.record_stored(id, stored, self.epoch.elapsed());
    }

    fn record_stored(&mut self, id: InstanceId, stored: Stored, now: Duration) {
        self.last_activity = now;
        if let Some(m) = stored.machine() {
            self.by_machine.insert(m.clone(), id.clone());
        }
        self.instances.insert(id, stored);
        if self.packing.due(self.instances.len()) {
            crate::model::repack(&mut self.instances);
        }
    }

    /// Whether instance `id` exists, is `model`'s and is not terminated.
    fn live_ours(&self, id: &InstanceId, model: &str) -> bool {
        let model = self.names.find(model);
        self.instances.get(id).is_some_and(|i| i.ours(model) && i.state != InstanceState::Terminated)
    }

    fn scripted_failure(&mut self, op: CloudOp) -> Option<String> {
        let q = self.fail_next.get_mut(&op)?;
        let msg = q.pop_front();
        if q.is_empty() {
            self.fail_next.remove(&op);
        }
        msg
    }

    /// Whether a start is refused (`Err`), goes through (`Ok(None)`), or makes its instance and
    /// then loses its response (`Ok(Some(message))`).
    fn start_error(&mut self, params: &StartInstanceParams) -> Result<Option<String>, BrokerError> {
        if let Some(err) = self.call_error(params.zone.as_ref()) {
            return Err(err);
        }
        if let Some((launched, message)) = self.partial_launch(std::slice::from_ref(&params.machine), &params.zone) {
            if launched == 0 {
                return Err(BrokerError::zone_specific(message));
            }
        }
        self.member_fault(params)
    }

    /// What refuses a start call as a whole: a scripted failure, an unavailable zone.
    fn call_error(&mut self, zone: Option<&String>) -> Option<BrokerError> {
        if let Some(msg) = self.scripted_failure(CloudOp::StartInstance) {
            return Some(BrokerError::zone_independent(msg));
        }
        if let Some(zone) = zone.filter(|_| self.zoned) {
            // A zone listed as unavailable takes no new instance, whatever else lists it.
            let listed = self.zones.iter().any(|z| &z.name == zone);
            if !listed || self.zones.iter().any(|z| &z.name == zone && !z.available) {
                return Some(BrokerError::zone_specific(format!("zone {zone:?} is unavailable")));
            }
        }
        None
    }

    /// Uses up a partial launch matching a call of these machines into `zone`: how many of
    /// them get an instance, and the others' failure.
    fn partial_launch(&mut self, machines: &[MachineId], zone: &Option<String>) -> Option<(usize, String)> {
        let p = self.partials.iter_mut().find(|p| {
            p.times > 0
                && p.zone.as_ref().is_none_or(|z| Some(z) == zone.as_ref())
                && p.machine.as_ref().is_none_or(|m| machines.contains(m))
        })?;
        p.times -= 1;
        Some((p.launched as usize, p.message.clone()))
    }

    /// One machine's scripted fault: refused (`Err`), through (`Ok(None)`), or made and its
    /// answer lost (`Ok(Some(message))`).
    fn member_fault(&mut self, params: &StartInstanceParams) -> Result<Option<String>, BrokerError> {
        let Some(fault) = self.faults.iter_mut().find(|f| {
            f.times > 0
                && f.machine == params.machine
                && f.zone.as_ref().is_none_or(|z| Some(z) == params.zone.as_ref())
        }) else {
            return Ok(None);
        };
        fault.times -= 1;
        if fault.lost_response {
            return Ok(Some(fault.message.clone()));
        }
        Err(if fault.zone_independent {
            BrokerError::zone_independent(fault.message.clone())
        } else {
            BrokerError::zone_specific(fault.message.clone())
        })
    }

    /// The instance type a start makes its instance with, after the per-type fail-over in its
    /// zone: `Ok(None)` when neither its constraints nor a default type ask for one; an error
    /// when no type fits (zone-independent) or every candidate is out of capacity in the zone
    /// (zone-specific, the last type's message).
    fn choose_type(&mut self, idx: usize, p: &StartInstanceParams) -> Result<Option<String>, BrokerError> {
        if !has_hardware_constraint(&p.constraints) && self.default_type.is_none() {
            if let Some(message) = self.spot_refusal(p, None) {
                return Err(BrokerError::zone_specific(message));
            }
            return Ok(None);
        }
        let mut candidates = instance_types::choose(&p.constraints, &self.catalogue, self.default_type.as_deref())
            .map_err(|e| BrokerError::zone_independent(e.to_string()))?;
        candidates.truncate(instance_types::DEFAULT_TYPES_PER_ZONE);
        let now = self.epoch.elapsed();
        let zone = p.zone.as_deref();
        let spot = p.capacity == CapacityType::Spot;
        let failover = if spot { &mut self.spot_failover } else { &mut self.failover };
        let order = failover.order(now, zone, &p.client_token, &candidates);
        let mut failed = Vec::new();
        let mut last = None;
        for attempt in order {
            let t = attempt.instance_type;
            let fault = self.type_faults.iter_mut().find(|f| {
                f.times > 0
                    && f.instance_type == t
                    && f.zone.as_deref().is_none_or(|z| Some(z) == zone)
                    && f.machine.as_ref().is_none_or(|m| *m == p.machine)
            });
            let refused = match fault {
                Some(f) => {
                    f.times -= 1;
                    Some(f.message.clone())
                }
                None => self.spot_refusal(p, Some(&t)),
            };
            let failover = if spot { &mut self.spot_failover } else { &mut self.failover };
            match refused {
                Some(message) => {
                    last = Some(message);
                    failover.capacity_failed(now, &t, zone);
                    failed.push(t);
                }
                None => {
                    failover.settled(&p.client_token);
                    if let Some(c) = self.calls.get_mut(idx) {
                        c.instance_type = Some(t.clone());
                        c.failed_types = failed;
                    }
                    return Ok(Some(t));
                }
            }
        }
        if let Some(c) = self.calls.get_mut(idx) {
            c.failed_types = failed;
        }
        Err(BrokerError::zone_specific(last.unwrap_or_else(|| "no instance type".into())))
    }

    /// Why a spot start of type `t` (`None`: no type) is refused in its zone, if it is: a
    /// matching [`SpotFault`] (used up), or a spot price above the call's maximum. `None` for
    /// an on-demand start.
    fn spot_refusal(&mut self, p: &StartInstanceParams, t: Option<&str>) -> Option<String> {
        if p.capacity != CapacityType::Spot {
            return None;
        }
        let zone = p.zone.as_deref();
        if let Some(f) = self.spot_faults.iter_mut().find(|f| {
            f.times > 0
                && f.zone.as_deref().is_none_or(|z| Some(z) == zone)
                && f.instance_type.as_deref().is_none_or(|x| Some(x) == t)
                && f.machine.as_ref().is_none_or(|m| *m == p.machine)
        }) {
            f.times -= 1;
            return Some(f.message.clone().unwrap_or_else(|| NO_SPOT_CAPACITY.to_owned()));
        }
        let max = p.spot_max_price?;
        // The one pricing rule, which the simulator's fleet cost uses too.
        let price = instance_types::hourly_price(&self.catalogue, t, CapacityType::Spot, self.spot_price)?;
        (price > max).then(|| {
            let what = t.map_or_else(String::new, |t| format!(" of {t}"));
            format!("SpotMaxPriceTooLow: the spot price{what} ({price}) is above the maximum ({max})")
        })
    }

    /// Uses up a matching `lost_response` fault, if any, for a call that repeats a known token.
    fn lost_answer(&mut self, params: &StartInstanceParams) -> Option<String> {
        let fault = self.faults.iter_mut().find(|f| {
            f.times > 0
                && f.machine == params.machine
                && f.zone.as_ref().is_none_or(|z| Some(z) == params.zone.as_ref())
        })?;
        if !fault.lost_response {
            return None;
        }
        fault.times -= 1;
        Some(fault.message.clone())
    }

    /// Makes the instance a start asks for, pending and tagged (invariant 1 checked): as on
    /// EC2, it exists from the moment the call begins.
    ///
    /// One search of each map: the instance goes in where its fresh id was found free, and the
    /// index by machine answers with the instances already tagged for it as it takes this one.
    ///
    /// `token`: the model and client token the instance is known by, if any (a batch's token is
    /// kept whole, elsewhere).
    fn make_pending(
        &mut self,
        p: &StartInstanceParams,
        instance_type: Option<String>,
        token: Option<(&str, &str)>,
    ) -> InstanceId {
        let now = self.epoch.elapsed();
        self.last_activity = now;
        let mut stored = Stored::pending(&p.tags, p.zone.as_deref(), instance_type.as_deref(), now, &mut self.names);
        stored.set_capacity(Some(p.capacity));
        stored.set_image(self.image.as_deref(), &mut self.names);
        let (all_tokens, names) = (&mut self.tokens, &self.names);
        let id = insert_fresh(&mut self.instances, &mut self.next_id, stored, |id, stored| {
            if let Some((model, client_token)) = token {
                let tokens = match all_tokens.get_mut(model) {
                    Some(tokens) => tokens,
                    None => all_tokens.entry(model.to_owned()).or_default(),
                };
                tokens.insert(client_token, id.clone(), stored, names);
            }
        });
        if self.packing.due(self.instances.len()) {
            crate::model::repack(&mut self.instances);
        }
        if let Some(m) = &p.tags.machine {
            let (_, before) = self.by_machine.insert_seeing(m.clone(), id.clone());
            self.check_duplicate(&id, m, &before, p.tags.replaces());
        }
        id
    }
}

/// Stores an instance under a fresh id (the next of `i-1`, `i-2`, ... that was never taken:
/// pre-existing ids included), with one search a try; `named` sees the instance with its id
/// just before it goes in.
fn insert_fresh(
    instances: &mut BTreeMap<InstanceId, Stored>,
    next_id: &mut u64,
    mut stored: Stored,
    named: impl FnOnce(&InstanceId, &mut Stored),
) -> InstanceId {
    loop {
        let id = next_instance_id(next_id);
        if let std::collections::btree_map::Entry::Vacant(e) = instances.entry(id.clone()) {
            named(&id, &mut stored);
            e.insert(stored);
            return id;
        }
    }
}

/// The next id in the sequence `i-1`, `i-2`, ... (taken or not).
fn next_instance_id(next_id: &mut u64) -> InstanceId {
    *next_id += 1;
    // `i-N`, written on the stack: the id's shared text is its one allocation.
    let mut buf = [0u8; 2 + 20];
    let mut at = buf.len();
    let mut n = *next_id;
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    at -= 2;
    buf[at..at + 2].copy_from_slice(b"i-");
    InstanceId::new(std::str::from_utf8(&buf[at..]).unwrap_or_default())
}

macro_rules! msg {
    ($name:ident { $($field:ident : $ty:ty),* } -> $res:literal) => {
        #[derive(Message)]
        #[rtype(result = $res)]
        struct $name { $($field: $ty),* }
    };
}

msg!(Start { model: Arc<str>, params: StartInstanceParams } -> "Result<StartedInstance, BrokerError>");
msg!(StartBatch { model: Arc<str>, params: BatchStartParams } -> "Result<BatchStarted, BrokerError>");
msg!(Stop { ids: Vec<InstanceId> } -> "Result<(), BrokerError>");
msg!(List { model: Arc<str> } -> "Result<Vec<CloudInstance>, BrokerError>");
msg!(Zones {} -> "Result<Vec<AvailabilityZone>, BrokerError>");
msg!(Derive { machine: MachineId, placement: Option<String> } -> "Result<Vec<String>, BrokerError>");
msg!(Release { ids: Vec<InstanceId> } -> "Result<(), BrokerError>");
msg!(Retag { model: Arc<str>, id: InstanceId, tags: InstanceTags } -> "Result<(), BrokerError>");
msg!(Interrupt { id: InstanceId, warning: Duration } -> "()");
msg!(Notices { model: Arc<str> } -> "Result<Vec<InterruptionNotice>, BrokerError>");
msg!(Acknowledge { receipts: Vec<String> } -> "Result<(), BrokerError>");
msg!(Unacknowledged {} -> "Vec<InstanceId>");
msg!(Impaired { model: Arc<str> } -> "Result<Vec<InstanceId>, BrokerError>");
msg!(CurrentImage {} -> "Result<Option<String>, BrokerError>");

impl Handler<CurrentImage> for CloudActor {
    type Result = Result<Option<String>, BrokerError>;
    fn handle(&mut self, _msg: CurrentImage, _ctx: &mut Self::Context) -> Self::Result {
        Ok(self.image.clone())
    }
}

impl Handler<Impaired> for CloudActor {
    type Result = Result<Vec<InstanceId>, BrokerError>;
    fn handle(&mut self, msg: Impaired, _ctx: &mut Self::Context) -> Self::Result {
        let model = self.names.find(&msg.model);
        let ours = |id: &InstanceId| {
            self.instances.get(id).is_some_and(|i| i.ours(model) && i.state != InstanceState::Terminated)
        };
        Ok(self.impaired.iter().filter(|id| ours(id)).cloned().collect())
    }
}

impl Handler<Unacknowledged> for CloudActor {
    type Result = MessageResult<Unacknowledged>;
    fn handle(&mut self, _msg: Unacknowledged, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.notices.iter().map(|n| n.instance.clone()).collect())
    }
}

impl Handler<Interrupt> for CloudActor {
    type Result = ();
    fn handle(&mut self, msg: Interrupt, ctx: &mut Self::Context) {
        let live = self.instances.get(&msg.id).is_some_and(|i| i.state != InstanceState::Terminated);
        if !live {
            return;
        }
        let now = self.epoch.elapsed();
        self.last_activity = now;
        self.warned.insert(msg.id.clone(), now + msg.warning);
        self.receipts += 1;
        self.notices.push(PendingNotice {
            receipt: format!("notice-{}", self.receipts),
            instance: msg.id.clone(),
            kind: NoticeKind::Interruption,
            deadline: Some(now + msg.warning),
            visible_at: now,
        });
        let id = msg.id;
        ctx.run_later(msg.warning, move |act, _ctx| {
            if let Some(i) = act.instances.get_mut(&id) {
                if i.state != InstanceState::Terminated {
                    i.state = InstanceState::Terminated;
                    act.last_activity = act.epoch.elapsed();
                }
            }
        });
    }
}

impl CloudActor {
    /// The notices visible now about `model`'s instances, hidden for [`NOTICE_VISIBILITY`]
    /// once answered.
    fn visible_notices(&mut self, model: &str) -> Vec<InterruptionNotice> {
        let now = self.epoch.elapsed();
        let model = self.names.find(model);
        let mut out = Vec::new();
        for n in &mut self.notices {
            let ours = self.instances.get(&n.instance).is_some_and(|i| i.ours(model));
            if n.visible_at > now || !ours {
                continue;
            }
            n.visible_at = now + NOTICE_VISIBILITY;
            out.push(InterruptionNotice {
                instance: n.instance.clone(),
                kind: n.kind,
                deadline: n.deadline.map(|d| d.saturating_sub(now)),
                receipt: n.receipt.clone(),
            });
        }
        out
    }
}

impl Handler<Notices> for CloudActor {
    type Result = ResponseActFuture<Self, Result<Vec<InterruptionNotice>, BrokerError>>;
    fn handle(&mut self, msg: Notices, _ctx: &mut Self::Context) -> Self::Result {
        let now = self.visible_notices(&msg.model);
        if !now.is_empty() {
            return Box::pin(fut::ready(Ok(now)));
        }
        // A long poll: waits a bounded time for one to come.
        Box::pin(
            actix_rt::time::sleep(NOTICE_WAIT)
                .into_actor(self)
                .map(move |(), act, _ctx| Ok(act.visible_notices(&msg.model))),
        )
    }
}

impl Handler<Acknowledge> for CloudActor {
    type Result = Result<(), BrokerError>;
    fn handle(&mut self, msg: Acknowledge, _ctx: &mut Self::Context) -> Self::Result {
        self.notices.retain(|n| !msg.receipts.contains(&n.receipt));
        Ok(())
    }
}

impl Handler<Retag> for CloudActor {
    type Result = Result<(), BrokerError>;
    fn handle(&mut self, msg: Retag, _ctx: &mut Self::Context) -> Self::Result {
        let idx = self.log(CloudOp::RetagInstance, msg.tags.machine.clone(), None, vec![msg.id.clone()]);
        if !self.live_ours(&msg.id, &msg.model) {
            let err = BrokerError::zone_independent(format!("instance {} not found", msg.id));
            self.finish(idx, Some(err.message()));
            return Err(err);
        }
        if let Some(m) = &msg.tags.machine {
            self.by_machine.insert(m.clone(), msg.id.clone());
        }
        if let Some(i) = self.instances.get_mut(&msg.id) {
            for t in self.tokens.values_mut() {
                t.before_retag(&msg.id, i, &self.names);
            }
            token_moved(i);
            i.retag(msg.tags, &mut self.names);
        }
        self.finish(idx, None);
        Ok(())
    }
}

msg!(Control { f: Box<dyn FnOnce(&mut CloudActor) + Send> } -> "()");
msg!(Snapshot {} -> "CloudSnapshot");
msg!(InFlight {} -> "usize");

impl Handler<InFlight> for CloudActor {
    type Result = usize;
    fn handle(&mut self, _msg: InFlight, _ctx: &mut Self::Context) -> usize {
        // An interruption warning still running is work in flight: the cloud takes the
        // instance when it runs out, and the provisioner hands the machine over meanwhile.
        let now = self.epoch.elapsed();
        self.in_flight + self.warned.values().filter(|d| now <= **d).count()
    }
}

impl Handler<Start> for CloudActor {
    type Result = ActorResponse<Self, Result<StartedInstance, BrokerError>>;
    fn handle(&mut self, msg: Start, _ctx: &mut Self::Context) -> Self::Result {
        let p = msg.params;
        // What the record names is cloned only when calls are logged (benchmarks log none).
        let idx = self.log(CloudOp::StartInstance, None, None, Vec::new());
        if let Some(c) = self.calls.get_mut(idx) {
            c.machine = Some(p.machine.clone());
            c.zone = p.zone.clone();
            if self.record_params {
                c.params = Some(Box::new(p.clone()));
            }
        }
        if let Some(err) = self.throttle(idx, CloudOp::StartInstance) {
            return ActorResponse::reply(Err(err));
        }
        let known = self.tokens.get(&*msg.model).and_then(|t| t.get(&p.client_token, &self.instances, &self.names));
        if let Some(instance) = known.and_then(|id| Some(self.instances.get(id)?.instance(id, &self.names))) {
            if let Err(err) = repeated_start(&p, &instance) {
                self.finish(idx, Some(err.message()));
                return ActorResponse::reply(Err(err));
            }
            if let Some(c) = self.calls.get_mut(idx) {
                c.instances = vec![instance.id.clone()];
            }
            // A repeat can lose its answer too (it makes nothing new: the token is known).
            if let Some(message) = self.lost_answer(&p) {
                let err = BrokerError::transient(message);
                self.finish(idx, Some(err.message()));
                return ActorResponse::reply(Err(err));
            }
            self.finish(idx, None);
            return ActorResponse::reply(Ok(StartedInstance { instance, display_name: String::new() }));
        }
        let lost = match self.start_error(&p) {
            Ok(lost) => lost,
            Err(err) => {
                self.finish(idx, Some(err.message()));
                return ActorResponse::reply(Err(err));
            }
        };
        let instance_type = match self.choose_type(idx, &p) {
            Ok(t) => t,
            Err(err) => {
                self.finish(idx, Some(err.message()));
                return ActorResponse::reply(Err(err));
            }
        };
        let id = self.make_pending(&p, instance_type, Some((&msg.model, &p.client_token)));
        if let Some(c) = self.calls.get_mut(idx) {
            c.instances = vec![id.clone()];
        }
        let latency = self.start_latency;
        let answer = move |act: &mut Self| {
            let started = act.land(idx, id);
            match lost {
                // The instance is there; only the answer is lost.
                Some(message) => {
                    let err = BrokerError::transient(message);
                    if let Some(c) = act.calls.get_mut(idx) {
                        c.ok = Some(false);
                        c.error = Some(err.message());
                    }
                    Err(err)
                }
                None => Ok(started),
            }
        };
        // Answered at once, without a boxed future, when the cloud takes no time.
        if latency.is_zero() {
            return ActorResponse::reply(answer(self));
        }
        ActorResponse::r#async(actix_rt::time::sleep(latency).into_actor(self).map(move |(), act, _ctx| answer(act)))
    }
}

impl Handler<StartBatch> for CloudActor {
    type Result = ResponseActFuture<Self, Result<BatchStarted, BrokerError>>;
    /// One call for every member: one record per member (same batch id), one rate-limit
    /// token, one client token; instances made pending (tagged per machine) at once, running
    /// when the call returns.
    fn handle(&mut self, msg: StartBatch, _ctx: &mut Self::Context) -> Self::Result {
        let p = msg.params;
        let singles: Vec<StartInstanceParams> = (0..p.members.len()).filter_map(|i| p.member_params(i)).collect();
        self.batches += 1;
        let batch = self.batches.to_string();
        let idxs: Vec<usize> = singles
            .iter()
            .map(|m| {
                let idx = self.log(CloudOp::StartInstance, Some(m.machine.clone()), m.zone.clone(), Vec::new());
                if let Some(c) = self.calls.get_mut(idx) {
                    c.batch = Some(batch.clone());
                    if self.record_params {
                        c.params = Some(Box::new(m.clone()));
                    }
                }
                idx
            })
            .collect();
        let fail_all = |act: &mut Self, err: BrokerError| {
            for &idx in &idxs {
                act.finish(idx, Some(err.message()));
            }
            Box::pin(fut::ready(Err(err)))
        };
        // One token of the start bucket for the whole call.
        if let Some(err) = self.throttle(idxs.first().copied().unwrap_or(usize::MAX), CloudOp::StartInstance) {
            for &idx in idxs.iter().skip(1) {
                if let Some(c) = self.calls.get_mut(idx) {
                    c.throttled = true;
                }
                self.finish(idx, Some(err.message()));
            }
            return Box::pin(fut::ready(Err(err)));
        }
        let machines: Vec<MachineId> = p.members.iter().map(|m| m.machine.clone()).collect();
        let token = token_key(&msg.model, &p.client_token);
        if let Some(made) = self.batch_tokens.get(&token).cloned() {
            if made.zone != p.zone || made.machines != machines {
                let err = BrokerError::zone_independent(format!(
                    "IdempotentParameterMismatch: client token {} was used for another batch",
                    p.client_token
                ));
                return fail_all(self, err);
            }
            // A repeat can lose its answer too (it makes nothing new: the token is known).
            if let Some(message) = singles.iter().find_map(|m| self.lost_answer(m)) {
                return fail_all(self, BrokerError::transient(message));
            }
            let results = made
                .results
                .iter()
                .zip(&idxs)
                .map(|(r, &idx)| match r {
                    Ok(id) => {
                        if let Some(c) = self.calls.get_mut(idx) {
                            c.instances = vec![id.clone()];
                        }
                        Ok(self.land(idx, id.clone()))
                    }
                    Err(e) => {
                        self.finish(idx, Some(e.message()));
                        Err(e.clone())
                    }
                })
                .collect();
            return Box::pin(fut::ready(Ok(results)));
        }
        if let Some(err) = self.call_error(p.zone.as_ref()) {
            return fail_all(self, err);
        }
        let launched = match self.partial_launch(&machines, &p.zone) {
            Some((k, message)) => (k, Some(message)),
            None => (machines.len(), None),
        };
        // Every member's own fault first (a lost answer loses the whole call's answer).
        let mut lost = None;
        let mut outcomes: Vec<Result<(), BrokerError>> = Vec::with_capacity(singles.len());
        for (i, m) in singles.iter().enumerate() {
            if i >= launched.0 {
                let message = launched.1.clone().unwrap_or_default();
                outcomes.push(Err(BrokerError::zone_specific(message)));
                continue;
            }
            match self.member_fault(m) {
                Ok(l) => {
                    lost = lost.or(l);
                    outcomes.push(Ok(()));
                }
                Err(e) => outcomes.push(Err(e)),
            }
        }
        // One instance type for the whole call (its members share their constraints).
        let instance_type = match singles.first().map(|first| self.choose_type(idxs[0], first)) {
            Some(Ok(t)) => t,
            Some(Err(err)) => return fail_all(self, err),
            None => None,
        };
        let mut results: Vec<Result<InstanceId, BrokerError>> = Vec::with_capacity(singles.len());
        for ((m, outcome), &idx) in singles.iter().zip(outcomes).zip(&idxs) {
            match outcome {
                Err(e) => {
                    self.finish(idx, Some(e.message()));
                    results.push(Err(e));
                }
                Ok(()) => {
                    let id = self.make_pending(m, instance_type.clone(), None);
                    if let Some(c) = self.calls.get_mut(idx) {
                        c.instances = vec![id.clone()];
                        c.instance_type = instance_type.clone();
                    }
                    results.push(Ok(id));
                }
            }
        }
        self.batch_tokens.insert(token, BatchMade { zone: p.zone.clone(), machines, results: results.clone() });
        let answer = move |act: &mut Self| {
            let landed: BatchStarted =
                results.into_iter().zip(&idxs).map(|(r, &idx)| r.map(|id| act.land(idx, id))).collect();
            match lost {
                // The instances are there; only the answer is lost.
                Some(message) => {
                    let err = BrokerError::transient(message);
                    for &idx in &idxs {
                        if let Some(c) = act.calls.get_mut(idx) {
                            c.ok = Some(false);
                            c.error = Some(err.message());
                        }
                    }
                    Err(err)
                }
                None => Ok(landed),
            }
        };
        let latency = self.start_latency;
        if latency.is_zero() {
            return Box::pin(fut::ready(answer(self)));
        }
        Box::pin(actix_rt::time::sleep(latency).into_actor(self).map(move |(), act, _ctx| answer(act)))
    }
}

impl CloudActor {
    /// A start's call returns: the instance is running (unless terminated meanwhile).
    fn land(&mut self, idx: usize, id: InstanceId) -> StartedInstance {
        self.finish(idx, None);
        let instance = match self.instances.get_mut(&id) {
            Some(i) => {
                if i.state == InstanceState::Pending {
                    i.state = InstanceState::Running;
                }
                i.instance(&id, &self.names)
            }
            None => CloudInstance {
                id,
                state: InstanceState::Terminated,
                zone: None,
                tags: InstanceTags::default(),
                age: None,
                instance_type: None,
                capacity_type: None,
                image: None,
            },
        };
        StartedInstance { display_name: String::new(), instance }
    }
}

impl Handler<Stop> for CloudActor {
    type Result = ResponseActFuture<Self, Result<(), BrokerError>>;
    fn handle(&mut self, msg: Stop, _ctx: &mut Self::Context) -> Self::Result {
        let idx = match self.admit(CloudOp::StopInstances, None, msg.ids.clone()) {
            Ok(idx) => idx,
            Err(err) => return Box::pin(fut::ready(Err(err))),
        };
        let latency = self.stop_latency;
        Box::pin(actix_rt::time::sleep(latency).into_actor(self).map(move |(), act, _ctx| {
            for id in &msg.ids {
                if let Some(i) = act.instances.get_mut(id) {
                    i.state = InstanceState::Terminated;
                }
            }
            act.finish(idx, None);
            Ok(())
        }))
    }
}

impl Handler<List> for CloudActor {
    type Result = Result<Vec<CloudInstance>, BrokerError>;
    fn handle(&mut self, msg: List, _ctx: &mut Self::Context) -> Self::Result {
        let idx = self.admit(CloudOp::AllInstances, None, Vec::new())?;
        self.finish(idx, None);
        let now = self.epoch.elapsed();
        let model = self.names.find(&msg.model);
        Ok(self
            .instances
            .iter()
            .filter(|(_, i)| i.ours(model) && i.state != InstanceState::Terminated)
            .map(|(id, i)| CloudInstance { age: Some(i.age_at(now)), ..i.instance(id, &self.names) })
            .collect())
    }
}

impl Handler<Zones> for CloudActor {
    type Result = Result<Vec<AvailabilityZone>, BrokerError>;
    fn handle(&mut self, _msg: Zones, _ctx: &mut Self::Context) -> Self::Result {
        if !self.zoned {
            return Err(BrokerError::NotSupported("availability_zones"));
        }
        let idx = self.admit(CloudOp::AvailabilityZones, None, Vec::new())?;
        self.finish(idx, None);
        Ok(self.zones.clone())
    }
}

impl Handler<Derive> for CloudActor {
    type Result = Result<Vec<String>, BrokerError>;
    fn handle(&mut self, msg: Derive, _ctx: &mut Self::Context) -> Self::Result {
        let idx = self.admit(CloudOp::DeriveZones, Some(msg.machine.clone()), Vec::new())?;
        // A placement directive: `zone=NAME` pins that zone, `subnet=ID` the subnet's zones
        // (an unknown subnet is the machine's own problem); other directives are ignored.
        if let Some(p) = msg.placement.as_deref().map(str::trim) {
            if let Some(zone) = p.strip_prefix("zone=") {
                self.finish(idx, None);
                return Ok(vec![zone.to_owned()]);
            }
            if let Some(subnet) = p.strip_prefix("subnet=") {
                return match self.subnets.get(subnet).cloned() {
                    Some(zones) => {
                        self.finish(idx, None);
                        Ok(zones)
                    }
                    None => {
                        let m = format!("subnet {subnet:?} is not one of this cloud's subnets");
                        self.finish(idx, Some(m.clone()));
                        Err(BrokerError::zone_independent(m))
                    }
                };
            }
        }
        self.finish(idx, None);
        Ok(self.derived.get(&msg.machine).cloned().unwrap_or_default())
    }
}

impl Handler<Release> for CloudActor {
    type Result = Result<(), BrokerError>;
    fn handle(&mut self, msg: Release, _ctx: &mut Self::Context) -> Self::Result {
        let idx = self.log(CloudOp::ReleaseInstances, None, None, msg.ids.clone());
        if let Some(m) = self.scripted_failure(CloudOp::ReleaseInstances) {
            self.finish(idx, Some(m.clone()));
            return Err(BrokerError::transient(m));
        }
        for id in &msg.ids {
            if let Some(i) = self.instances.get_mut(id) {
                i.release();
            }
        }
        self.finish(idx, None);
        Ok(())
    }
}

impl Handler<Control> for CloudActor {
    type Result = ();
    fn handle(&mut self, msg: Control, _ctx: &mut Self::Context) {
        (msg.f)(self);
    }
}

impl Handler<Snapshot> for CloudActor {
    type Result = MessageResult<Snapshot>;
    fn handle(&mut self, _msg: Snapshot, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(CloudSnapshot {
            instances: self.instances.iter().map(|(id, i)| (id.clone(), i.fake(id, &self.names))).collect(),
            calls: self.calls.clone(),
            zones: self.zones.clone(),
            in_flight: self.in_flight,
            last_activity: self.last_activity,
            duplicates: self.duplicates.clone(),
            counts: self.counts.clone(),
        })
    }
}

/// A handle on the fake cloud. Cheap to clone; every clone talks to the same cloud.
#[derive(Clone)]
pub struct FakeCloud {
    addr: Addr<CloudActor>,
    model_uuid: String,
    zoned: bool,
    /// Whether its brokers warn of interruptions.
    interruptions: bool,
}

impl FakeCloud {
    /// A zoneless cloud for this model. Must be called inside an actix system.
    pub fn new(model_uuid: &str) -> Self {
        Self::build(model_uuid, false, &[])
    }

    /// A cloud with these (available) zones.
    pub fn with_zones(model_uuid: &str, zones: &[&str]) -> Self {
        Self::build(model_uuid, true, zones)
    }

    fn build(model_uuid: &str, zoned: bool, zones: &[&str]) -> Self {
        let actor = CloudActor {
            model_uuid: model_uuid.to_owned(),
            notices: Vec::new(),
            receipts: 0,
            warned: BTreeMap::new(),
            impaired: std::collections::BTreeSet::new(),
            image: None,
            zoned,
            zones: zones.iter().map(|z| AvailabilityZone::available(*z)).collect(),
            instances: BTreeMap::new(),
            packing: crate::model::Packing::default(),
            names: Names::default(),
            next_id: 0,
            start_latency: Duration::ZERO,
            stop_latency: Duration::ZERO,
            faults: Vec::new(),
            derived: BTreeMap::new(),
            subnets: BTreeMap::new(),
            fail_next: BTreeMap::new(),
            tokens: BTreeMap::new(),
            batch_tokens: std::collections::HashMap::new(),
            batches: 0,
            partials: Vec::new(),
            calls: Vec::new(),
            epoch: Instant::now(),
            start_bucket: None,
            stop_bucket: None,
            describe_bucket: None,
            in_flight: 0,
            last_activity: Duration::ZERO,
            duplicates: Vec::new(),
            by_machine: MultiMap::new(),
            record_params: true,
            log_calls: true,
            counts: BTreeMap::new(),
            catalogue: instance_types::shipped(),
            default_type: None,
            type_faults: Vec::new(),
            failover: TypeFailover::new(instance_types::DEFAULT_CAPACITY_MEMORY),
            spot_failover: TypeFailover::new(instance_types::DEFAULT_CAPACITY_MEMORY),
            spot_faults: Vec::new(),
            spot_price: None,
        };
        Self { addr: actor.start(), model_uuid: model_uuid.to_owned(), zoned, interruptions: false }
    }

    /// The same cloud, whose brokers made from now on warn of interruptions
    /// ([`Broker::supports_interruptions`]): the provisioner then polls for notices.
    pub fn with_interruptions(mut self) -> Self {
        self.interruptions = true;
        self
    }

    /// Interrupts an instance (issue 33): an interruption notice now, whose deadline is
    /// `warning` away, and the instance terminated when the warning runs out (on the cloud's
    /// clock). An instance already terminated, or unknown, gets nothing.
    pub fn interrupt(&self, id: &str, warning: Duration) {
        self.addr.do_send(Interrupt { id: InstanceId::new(id), warning });
    }

    /// The broker port over this cloud, for its model.
    pub fn broker(&self) -> FakeBroker {
        self.broker_for(&self.model_uuid)
    }

    /// A broker over the same cloud for another model: it lists and retags only that
    /// model's instances, its client tokens are its own, and what it starts is foreign to
    /// this cloud's model (as the broker contract's check of foreign instances needs).
    pub fn broker_for(&self, model_uuid: &str) -> FakeBroker {
        FakeBroker {
            addr: self.addr.clone(),
            zoned: self.zoned,
            interruptions: self.interruptions,
            model: model_uuid.into(),
        }
    }

    fn control(&self, f: impl FnOnce(&mut CloudActor) + Send + 'static) {
        self.addr.do_send(Control { f: Box::new(f) });
    }

    /// Sets the start and stop latencies.
    pub fn set_latency(&self, start: Duration, stop: Duration) {
        self.control(move |c| {
            c.start_latency = start;
            c.stop_latency = stop;
        });
    }

    /// Replaces the zone list: the `available` zones not also named `unavailable` first, then
    /// the listed-but-unavailable ones (a zone named in both lists is listed once, unavailable,
    /// as the scenario format's version 2 fixes it).
    pub fn set_zones(&self, available: &[&str], unavailable: &[&str]) {
        let mut zones: Vec<AvailabilityZone> =
            available.iter().filter(|z| !unavailable.contains(z)).map(|z| AvailabilityZone::available(*z)).collect();
        for z in unavailable {
            if !zones.iter().any(|a| a.name == *z) {
                zones.push(AvailabilityZone { name: (*z).to_owned(), available: false });
            }
        }
        self.control(move |c| c.zones = zones);
    }

    /// Adds a scripted StartInstance fault.
    pub fn add_fault(&self, fault: Fault) {
        self.control(move |c| c.faults.push(fault));
    }

    /// Adds a scripted partial launch.
    pub fn add_partial_launch(&self, partial: PartialLaunch) {
        self.control(move |c| c.partials.push(partial));
    }

    /// Adds a scripted want of spot capacity.
    pub fn add_spot_fault(&self, fault: SpotFault) {
        self.control(move |c| c.spot_faults.push(fault));
    }

    /// Sets the spot price of every start (`None`, the default: [`SPOT_PRICE_RATIO`] of its
    /// type's on-demand price).
    pub fn set_spot_price(&self, price: Option<crate::model::UsdPerHour>) {
        self.control(move |c| c.spot_price = price);
    }

    /// Adds a scripted capacity failure of one instance type.
    pub fn add_type_fault(&self, fault: TypeFault) {
        self.control(move |c| c.type_faults.push(fault));
    }

    /// Sets the instance type of machines without hardware constraints (`None`, the default:
    /// their instances have no type, and the catalogue is only used by machines that ask for
    /// hardware).
    pub fn set_default_instance_type(&self, instance_type: Option<&str>) {
        let t = instance_type.map(str::to_owned);
        self.control(move |c| c.default_type = t);
    }

    /// Sets the cloud's subnets and their zones (what DeriveAvailabilityZones returns for a
    /// machine placed with `subnet=ID`).
    pub fn set_subnets(&self, subnets: BTreeMap<String, Vec<String>>) {
        self.control(move |c| c.subnets = subnets);
    }

    /// Sets what DeriveAvailabilityZones returns for a machine.
    pub fn set_derived_zones(&self, machine: &str, zones: &[&str]) {
        let machine = MachineId::new(machine);
        let zones: Vec<String> = zones.iter().map(|z| (*z).to_owned()).collect();
        self.control(move |c| {
            c.derived.insert(machine, zones);
        });
    }

    /// The next `times` calls of `op` fail with `message`.
    pub fn fail_next(&self, op: CloudOp, times: u32, message: &str) {
        let message = message.to_owned();
        self.control(move |c| {
            let q = c.fail_next.entry(op).or_default();
            q.extend((0..times).map(|_| message.clone()));
        });
    }

    /// Puts an instance in the cloud directly (pre-existing, or launched out of band). With
    /// `machine`, it carries our tags for that machine; `foreign` ones carry another model's.
    ///
    /// It is launched now; see [`FakeCloud::launch_aged`] for an older one.
    pub fn launch(&self, id: &str, zone: Option<&str>, machine: Option<&str>, state: InstanceState, foreign: bool) {
        self.launch_aged(id, zone, machine, state, foreign, Duration::ZERO);
    }

    /// [`FakeCloud::launch`] for an instance launched `age` ago (listings report its age).
    pub fn launch_aged(
        &self,
        id: &str,
        zone: Option<&str>,
        machine: Option<&str>,
        state: InstanceState,
        foreign: bool,
        age: Duration,
    ) {
        let model = if foreign { "foreign-model".to_owned() } else { self.model_uuid.clone() };
        let instance = CloudInstance {
            id: InstanceId::new(id),
            state,
            zone: zone.map(str::to_owned),
            tags: InstanceTags { model: Some(model), machine: machine.map(MachineId::new), start: None },
            age: None,
            instance_type: None,
            capacity_type: None,
            image: None,
        };
        self.control(move |c| {
            let mut instance = instance;
            // Started from the cloud's image of the moment (`set_image`).
            instance.image = if foreign { None } else { c.image.clone() };
            let born = (c.epoch.elapsed(), age);
            c.record_new(FakeInstance { instance, foreign, born });
        });
    }

    /// Whether every start's params are kept in the call log (on by default; benchmarks turn
    /// it off to measure the provisioner rather than the log).
    pub fn record_params(&self, on: bool) {
        self.control(move |c| c.record_params = on);
    }

    /// Whether calls are logged one by one (on by default; benchmarks turn it off and read
    /// [`CloudSnapshot::counts`]).
    pub fn log_calls(&self, on: bool) {
        self.control(move |c| c.log_calls = on);
    }

    /// Throttles calls as EC2 does, with a token bucket per class (`None` = unlimited): starts,
    /// stops, and listings/lookups. A call without a token fails with `RequestLimitExceeded`.
    pub fn set_rate_limit(&self, limits: RateLimits) {
        self.control(move |c| {
            c.start_bucket = limits.start.map(TokenBucket::new);
            c.stop_bucket = limits.stop.map(TokenBucket::new);
            c.describe_bucket = limits.describe.map(TokenBucket::new);
        });
    }

    /// Changes an instance's state out of band (stop, start, terminate). A terminated
    /// instance, or one already in that state, does not change.
    pub fn set_state(&self, id: &str, state: InstanceState) {
        let id = InstanceId::new(id);
        self.control(move |c| {
            if let Some(i) = c.instances.get_mut(&id) {
                if i.state != InstanceState::Terminated && i.state != state {
                    i.state = state;
                    c.last_activity = c.epoch.elapsed();
                }
            }
        });
    }

    /// Sets the image every start uses from now on (`set_image`, issue 34): instances started
    /// from another have drifted. `None` (the default): the cloud does not say.
    pub fn set_image(&self, image: Option<&str>) {
        let image = image.map(str::to_owned);
        self.control(move |c| c.image = image);
    }

    /// The instance's status checks start failing (`impaired`) or pass again (issue 34).
    pub fn set_impaired(&self, id: &str, impaired: bool) {
        let id = InstanceId::new(id);
        self.control(move |c| {
            let changed = if impaired { c.impaired.insert(id) } else { c.impaired.remove(&id) };
            if changed {
                c.last_activity = c.epoch.elapsed();
            }
        });
    }

    /// The instances of the interruption notices not acknowledged, in the order sent.
    pub async fn unacknowledged_notices(&self) -> Vec<InstanceId> {
        self.addr.send(Unacknowledged {}).await.unwrap_or_default()
    }

    /// Calls in flight.
    pub async fn in_flight(&self) -> usize {
        self.addr.send(InFlight {}).await.unwrap_or(0)
    }

    /// Everything the cloud knows.
    pub async fn snapshot(&self) -> CloudSnapshot {
        self.addr.send(Snapshot {}).await.unwrap_or_default()
    }

    /// Whether the cloud has zones (fixed at creation).
    pub fn is_zoned(&self) -> bool {
        self.zoned
    }
}

/// The [`Broker`] over a [`FakeCloud`].
#[derive(Clone)]
pub struct FakeBroker {
    addr: Addr<CloudActor>,
    zoned: bool,
    /// Whether it warns of interruptions.
    interruptions: bool,
    /// Shared by every call's message, not copied into each.
    model: Arc<str>,
}

fn mailbox(e: MailboxError) -> BrokerError {
    BrokerError::transient(format!("fake cloud unavailable: {e}"))
}

impl Broker for FakeBroker {
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        let req = self.addr.send(Start { model: self.model.clone(), params });
        Box::pin(async move { req.await.map_err(mailbox)? })
    }

    fn batches_starts(&self) -> bool {
        true
    }

    fn start_instances(&self, params: BatchStartParams) -> BrokerFuture<BatchStarted> {
        let req = self.addr.send(StartBatch { model: self.model.clone(), params });
        Box::pin(async move { req.await.map_err(mailbox)? })
    }

    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        let req = self.addr.send(Stop { ids });
        Box::pin(async move { req.await.map_err(mailbox)? })
    }

    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
        let req = self.addr.send(List { model: self.model.clone() });
        Box::pin(async move { req.await.map_err(mailbox)? })
    }

    fn supports_zones(&self) -> bool {
        self.zoned
    }

    fn availability_zones(&self) -> BrokerFuture<Vec<AvailabilityZone>> {
        let req = self.addr.send(Zones {});
        Box::pin(async move { req.await.map_err(mailbox)? })
    }

    fn derive_availability_zones(&self, params: &StartInstanceParams) -> BrokerFuture<Vec<String>> {
        let req = self.addr.send(Derive { machine: params.machine.clone(), placement: params.placement.clone() });
        Box::pin(async move { req.await.map_err(mailbox)? })
    }

    fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        let req = self.addr.send(Release { ids });
        Box::pin(async move { req.await.map_err(mailbox)? })
    }

    fn retag_instance(&self, id: InstanceId, tags: InstanceTags) -> BrokerFuture<()> {
        let req = self.addr.send(Retag { model: self.model.clone(), id, tags });
        Box::pin(async move { req.await.map_err(mailbox)? })
    }

    fn supports_interruptions(&self) -> bool {
        self.interruptions
    }

    fn impaired_instances(&self) -> BrokerFuture<Vec<InstanceId>> {
        let req = self.addr.send(Impaired { model: self.model.clone() });
        Box::pin(async move { req.await.map_err(mailbox)? })
    }

    fn current_image(&self) -> BrokerFuture<Option<String>> {
        let req = self.addr.send(CurrentImage {});
        Box::pin(async move { req.await.map_err(mailbox)? })
    }

    fn capacity_short(&self, zone: Option<&str>, instance_type: &str, capacity: CapacityType) {
        let (zone, t) = (zone.map(str::to_owned), instance_type.to_owned());
        let f = move |c: &mut CloudActor| {
            let now = c.epoch.elapsed();
            let failover = if capacity == CapacityType::Spot { &mut c.spot_failover } else { &mut c.failover };
            failover.capacity_failed(now, &t, zone.as_deref());
        };
        self.addr.do_send(Control { f: Box::new(f) });
    }

    fn interruption_notices(&self) -> BrokerFuture<Vec<InterruptionNotice>> {
        if !self.interruptions {
            return Box::pin(async { Err(BrokerError::NotSupported("interruption_notices")) });
        }
        let req = self.addr.send(Notices { model: self.model.clone() });
        Box::pin(async move { req.await.map_err(mailbox)? })
    }

    fn acknowledge_notices(&self, receipts: Vec<String>) -> BrokerFuture<()> {
        let req = self.addr.send(Acknowledge { receipts });
        Box::pin(async move { req.await.map_err(mailbox)? })
    }
}
