//! The pool's plain core: the job queues and the start retry arithmetic.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;

use crate::model::{
    CapacityPreference, CapacityType, CloudInstance, FailOutcome, InstanceId, Machine, MachineId, ProvisioningInfo,
    ZoneError, ZoneRequest,
};
use crate::ports::{BrokerError, BrokerErrorKind, ModelError};

/// Start one machine.
///
/// Small (about 100 bytes): a fleet's first batch makes one per machine, all alive at once
/// (queued in the pool). Its provisioning info is shared (a fleet's machines mostly have the
/// same, empty one: see [`StartJob::shared_info`]) and the rare instance to adopt is boxed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartJob {
    /// The machine, as classified.
    pub machine: Machine,
    /// Its provisioning info.
    pub info: Arc<ProvisioningInfo>,
    /// The other machines of its distribution group (empty = none).
    pub group: Vec<MachineId>,
    /// An instance already tagged for it, to adopt instead of starting one.
    pub adopt: Option<Box<crate::model::CloudInstance>>,
    /// The interrupted instance this start replaces (a spot hand-over, issue 33): its nonce
    /// mixes this id in, so that it never repeats the machine's first start's (the pool's
    /// seeded nonces repeat after a restart, and that start's client token would answer the
    /// interrupted instance itself).
    pub replaces: Option<crate::model::InstanceId>,
    /// The span the coordinator picked it under (issue 37), the start's parent: disabled
    /// unless traces are exported.
    pub trace: crate::trace::Carried,
}

impl StartJob {
    /// `info` as a job holds it: `empty` (shared by every job made from one batch) when `info`
    /// is the default, else a box of its own.
    pub fn shared_info(info: ProvisioningInfo, empty: &Arc<ProvisioningInfo>) -> Arc<ProvisioningInfo> {
        if info == **empty {
            Arc::clone(empty)
        } else {
            Arc::new(info)
        }
    }

    /// What this start asks of the allocator, given the zones derived for it.
    pub fn zone_request(&self, derived: Vec<String>) -> crate::model::ZoneRequest {
        crate::model::ZoneRequest::for_start(&self.info, &self.group, derived)
    }

    /// Its cloud call's parameters, before a zone and a client token are chosen: tagged with
    /// `model_uuid`, its machine and `nonce`. What a batch's shape is made of, so the start
    /// procedure and `provisioner plan` build it alike.
    pub fn call_params(&self, model_uuid: &str, nonce: &str) -> crate::ports::StartInstanceParams {
        let machine = self.machine.id.clone();
        crate::ports::StartInstanceParams {
            machine: machine.clone(),
            zone: None,
            constraints: self.info.constraints.clone(),
            placement: self.info.placement.clone(),
            volumes: self.info.volumes.clone(),
            nonce: nonce.to_owned(),
            tags: crate::model::InstanceTags {
                model: Some(model_uuid.to_owned()),
                machine: Some(machine),
                start: Some(nonce.to_owned()),
            },
            extra_tags: self.info.tags.clone(),
            client_token: String::new(),
            distribution_group: self.group.clone(),
            capacity: self.info.capacity.first(),
            spot_max_price: None,
        }
    }
}

/// Terminate instances, then have their dead machines removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopJob {
    /// The instances.
    pub instances: Vec<InstanceId>,
    /// Dead machines to remove once they are gone.
    pub machines: Vec<MachineId>,
    /// Failed tries so far (for the backoff).
    pub attempt: u32,
    /// Run at once even if every worker is busy (a model destruction kills eagerly).
    pub eager: bool,
}

/// Strip our identity from instances left alone on purpose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseJob {
    /// The instances.
    pub instances: Vec<InstanceId>,
    /// Dead machines to remove once they are released.
    pub machines: Vec<MachineId>,
    /// Failed tries so far.
    pub attempt: u32,
}

/// One unit of broker work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// Start a machine (boxed: a queue of 100,000 starts moves pointers, not whole jobs).
    Start(Box<StartJob>),
    /// Stop instances.
    Stop(StopJob),
    /// Release instances.
    Release(ReleaseJob),
}

/// The largest start queue buffer kept once drained (in jobs).
const DRAINED_KEEP: usize = 1024;

/// Where a start that may give its worker back before it ends stands
/// (`ProvisionerConfig::record_outside_worker`): its worker freed and its end reach the pool in
/// either order, and each is counted once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartSlot {
    /// It holds its worker.
    #[default]
    Held,
    /// It gave its worker back and records its instance.
    Released,
    /// It ended.
    Done,
}

/// The queues and the concurrency limit.
#[derive(Debug, Clone)]
pub struct PoolBook {
    size: usize,
    in_flight: usize,
    /// Starts that gave their worker back to record their instance in the model
    /// ([`PoolBook::release_start`]): running, but not counted against the size.
    recording: usize,
    /// How many starts one worker carries: 1, or the batch size with batched starts on (the
    /// starts of one batch share one cloud call).
    starts_per_worker: usize,
    urgent: VecDeque<Job>,
    /// The starts, as their boxes (8 bytes a start where a [`Job`] is 64: a fleet's first
    /// batch queues one per machine at once).
    starts: VecDeque<Box<StartJob>>,
}

impl PoolBook {
    /// An empty pool of this size.
    pub fn new(size: usize) -> Self {
        Self {
            size,
            in_flight: 0,
            recording: 0,
            starts_per_worker: 1,
            urgent: VecDeque::new(),
            starts: VecDeque::new(),
        }
    }

    /// The same pool with batched starts of up to `batch` machines: up to `size × batch`
    /// starts run at once (their cloud calls are batched), other jobs still `size`.
    pub fn with_batches(mut self, batch: usize) -> Self {
        self.starts_per_worker = batch.max(1);
        self
    }

    /// Queues a job: stops and releases ahead of starts; a spot hand-over's replacement start
    /// (it races the interruption's deadline) ahead of other starts, and it does not wait for a
    /// free worker ([`PoolBook::take_next`]).
    pub fn push(&mut self, job: Job) {
        match job {
            Job::Start(start) if start.replaces.is_some() => self.starts.push_front(start),
            Job::Start(start) => self.starts.push_back(start),
            _ => self.urgent.push_back(job),
        }
    }

    /// The next job to run, if a worker is free.
    pub fn take_next(&mut self) -> Option<Job> {
        if self.in_flight >= self.size {
            // An eager stop does not wait for a free worker, nor does a release: a decision to
            // leave an instance alone is made durable (untagged) at once, so that no restart in
            // between re-decides it under a later harvest mode (a release is final).
            if let Some(pos) =
                self.urgent.iter().position(|j| matches!(j, Job::Stop(StopJob { eager: true, .. }) | Job::Release(_)))
            {
                let job = self.urgent.remove(pos)?;
                self.in_flight += 1;
                return Some(job);
            }
            // Nor does a spot hand-over's replacement: it races the interruption's deadline
            // (one per machine warned, so a bounded number beyond the pool's size).
            if self.starts.front().is_some_and(|s| s.replaces.is_some()) {
                let job = self.starts.pop_front()?;
                self.in_flight += 1;
                return Some(Job::Start(job));
            }
            // With batched starts, more starts may join the calls in flight; never ahead of a
            // stop waiting for a worker.
            if !self.urgent.is_empty() || self.in_flight >= self.size.saturating_mul(self.starts_per_worker) {
                return None;
            }
            let job = self.starts.pop_front()?;
            self.in_flight += 1;
            self.release_drained();
            return Some(Job::Start(job));
        }
        let job = self.urgent.pop_front().or_else(|| self.starts.pop_front().map(Job::Start))?;
        self.in_flight += 1;
        self.release_drained();
        Some(job)
    }

    /// Gives a drained start queue's buffer back: a fleet's first batch queues a start per
    /// machine at once, and a buffer sized for all of them would be held for nothing while the
    /// fleet's instances fill the other actors.
    fn release_drained(&mut self) {
        if self.starts.is_empty() && self.starts.capacity() > DRAINED_KEEP {
            self.starts = VecDeque::new();
        }
    }

    /// A job finished: its worker is free.
    pub fn finished(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// A start is done with the cloud and records its instance: its worker is free for the next
    /// job while it does, unless the start ended already. Whether a worker was freed.
    pub fn release_start(&mut self, slot: &Cell<StartSlot>) -> bool {
        if slot.get() != StartSlot::Held {
            return false;
        }
        slot.set(StartSlot::Released);
        self.in_flight = self.in_flight.saturating_sub(1);
        self.recording += 1;
        true
    }

    /// A start ended (`slot`: where it stood, if it could give its worker back first): the
    /// worker it held, or its place among the recording starts, is free.
    pub fn start_ended(&mut self, slot: Option<&Cell<StartSlot>>) {
        match slot.map(|s| s.replace(StartSlot::Done)) {
            Some(StartSlot::Released) => self.recording = self.recording.saturating_sub(1),
            _ => self.finished(),
        }
    }

    /// Starts recording their instances, their workers given back.
    pub fn recording(&self) -> usize {
        self.recording
    }

    /// Changes the limit; nothing queued or in flight is lost.
    pub fn resize(&mut self, size: usize) {
        self.size = size;
    }

    /// The limit.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Jobs running.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Jobs waiting.
    pub fn queued(&self) -> usize {
        self.urgent.len() + self.starts.len()
    }
}

/// How a StartInstance call failed, as far as retrying goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Because of its zone (and it had one).
    Zone,
    /// For a reason any zone would share, or a passing fault.
    Independent,
    /// Throttled by the cloud.
    Throttled,
}

impl FailureKind {
    /// How a failed start call counts, from the cloud's error and the zone it targeted: a
    /// zone-specific failure, and a zone that did not answer (`ZoneUnreachable`), are the
    /// zone's when the call had one; throttling is no failure; anything else (a zoneless
    /// cloud's zone failure included) is independent of the zone.
    pub fn of(err: &BrokerError, zone: Option<&str>) -> Self {
        match err {
            BrokerError::Throttled { .. } => FailureKind::Throttled,
            BrokerError::ZoneSpecific { .. } | BrokerError::ZoneUnreachable { .. } if zone.is_some() => {
                FailureKind::Zone
            }
            _ => FailureKind::Independent,
        }
    }
}

/// Whether a failed start call is repeated exactly (same zone, same client token, same
/// parameters), so that the cloud answers what it may have made: an ambiguous failure
/// ([`BrokerError::is_ambiguous`]) that is not its zone's. A zone that did not answer
/// (`ZoneUnreachable` with a zone) would hang again: the zone is marked failed for the machine
/// instead, and the start, unsure, looks for an instance of its own before its next call (with a
/// new token, in another zone). On a zoneless cloud an unreachable cloud is repeated as a
/// transient failure is: there is no other zone to go to.
pub fn repeats_in_place(err: &BrokerError, zone: Option<&str>) -> bool {
    err.is_ambiguous() && FailureKind::of(err, zone) != FailureKind::Zone
}

/// What the start procedure does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Ask the allocator to mark the zone failed, then call [`Attempts::on_zone_outcome`].
    MarkZone,
    /// Try another zone at once, using no round.
    FailOver,
    /// Start a new round after the retry delay.
    NewRound,
    /// Wait (backoff) and try again, using no round.
    Backoff,
    /// Give up: the failure is final.
    Final,
    /// Every allowed zone refused spot, or the cloud refused spot wherever: a `prefer-spot`
    /// start goes on to on-demand at once, using no round ([`CapacityPlan`]).
    OnDemand,
}

/// Which capacity type a start's calls ask for (issue 33), decided from the machine's
/// preference: `on-demand` always on-demand; `spot` always spot; `prefer-spot` spot first,
/// across every allowed zone (and, within each call, every type the broker's per-type
/// fail-over allows), then on-demand.
///
/// While a start asks for spot, a zone's failure (capacity, a spot price above the maximum,
/// a zone that did not answer) marks the zone failed for the machine under the spot shape
/// (`capacity=spot`: the allocator's capacity memory keeps spot apart from on-demand) and
/// fails over using no round, whatever the rounds left: a spot start tries every allowed
/// zone. When every allowed zone has refused, `prefer-spot` goes on to on-demand (no round
/// used); `spot` uses a round, and with none left ends in [`WorkerError::NoSpotCapacity`]. A
/// definite zone-independent refusal of a spot call (a broker without spot, a refusal any
/// zone would share) sends `prefer-spot` to on-demand at once; for `spot` it uses a round.
/// Throttled and ambiguous (transient) failures are the usual arithmetic's ([`Attempts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityPlan {
    preference: CapacityPreference,
    now: CapacityType,
}

/// What a failed call means for a start's capacity type ([`CapacityPlan::on_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacityStep {
    /// Nothing special: the usual arithmetic ([`Attempts::on_failure`]) decides.
    Usual,
    /// A spot call failed for its zone: mark the zone failed (spot shape), using no round,
    /// then [`CapacityPlan::on_zone_outcome`].
    MarkZone,
    /// A `prefer-spot` start goes on to on-demand now ([`Step::OnDemand`]).
    OnDemand,
}

impl CapacityPlan {
    /// The plan of a machine with this preference: its first call asks for
    /// [`CapacityPreference::first`].
    pub fn new(preference: CapacityPreference) -> Self {
        Self { preference, now: preference.first() }
    }

    /// The capacity type the next call asks for.
    pub fn capacity(&self) -> CapacityType {
        self.now
    }

    /// What the start asks of the allocator now: `base` with the current capacity type's
    /// shape (a spot call's shape ends in ` capacity=spot`).
    pub fn request(&self, base: &ZoneRequest) -> ZoneRequest {
        match self.now {
            CapacityType::OnDemand => base.clone(),
            CapacityType::Spot => {
                ZoneRequest { shape: base.shape.as_deref().map(|s| self.now.shape(s)), ..base.clone() }
            }
        }
    }

    /// A call failed with `err` (into `zone`): whether the capacity type decides what follows.
    pub fn on_failure(&self, err: &BrokerError, zone: Option<&str>) -> CapacityStep {
        if self.now != CapacityType::Spot {
            return CapacityStep::Usual;
        }
        match FailureKind::of(err, zone) {
            FailureKind::Throttled => CapacityStep::Usual,
            FailureKind::Zone => CapacityStep::MarkZone,
            FailureKind::Independent if err.is_ambiguous() => CapacityStep::Usual,
            FailureKind::Independent if self.preference == CapacityPreference::PreferSpot => CapacityStep::OnDemand,
            FailureKind::Independent => CapacityStep::Usual,
        }
    }

    /// The allocator's answer to a spot call's zone failure: fail over while an allowed zone
    /// is untried; once every one has refused, `prefer-spot` goes on to on-demand, `spot` uses
    /// a round (final with none left).
    pub fn on_zone_outcome(&self, outcome: FailOutcome, attempts: &mut Attempts) -> Step {
        match outcome {
            FailOutcome::TryAnotherZone => Step::FailOver,
            FailOutcome::RoundExhausted if self.preference == CapacityPreference::PreferSpot => Step::OnDemand,
            FailOutcome::RoundExhausted if attempts.rounds_left() == 0 => Step::Final,
            FailOutcome::RoundExhausted => attempts.on_zone_outcome(outcome),
        }
    }

    /// Goes on to on-demand ([`Step::OnDemand`]).
    pub fn fall_back(&mut self) {
        self.now = CapacityType::OnDemand;
    }

    /// The error a start ends with when `err` was its last call's: a `spot` machine's refusal
    /// (zone-specific or zone-independent) is [`WorkerError::NoSpotCapacity`], which says why.
    pub fn final_error(&self, err: BrokerError) -> WorkerError {
        let refused = matches!(err, BrokerError::ZoneSpecific { .. } | BrokerError::ZoneIndependent { .. });
        if self.preference == CapacityPreference::Spot && self.now == CapacityType::Spot && refused {
            WorkerError::NoSpotCapacity(err)
        } else {
            WorkerError::Cloud(err)
        }
    }
}

/// Round accounting for one start: with `count = N`, a machine that
/// always fails gets N+1 calls without zones and N·Z+1 with Z eligible zones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts {
    count: u32,
    rounds_left: u32,
    throttled: u32,
}

impl Attempts {
    /// `count` extra rounds.
    pub fn new(count: u32) -> Self {
        Self { count, rounds_left: count, throttled: 0 }
    }

    /// Rounds left.
    pub fn rounds_left(&self) -> u32 {
        self.rounds_left
    }

    /// Rounds used up so far (the backoff before the next round grows with it).
    pub fn rounds_used(&self) -> u32 {
        self.count - self.rounds_left
    }

    /// Throttled calls so far (for the backoff).
    pub fn throttled(&self) -> u32 {
        self.throttled
    }

    /// A call failed.
    pub fn on_failure(&mut self, kind: FailureKind) -> Step {
        match kind {
            FailureKind::Throttled => {
                self.throttled += 1;
                Step::Backoff
            }
            _ if self.rounds_left == 0 => Step::Final,
            FailureKind::Zone => Step::MarkZone,
            FailureKind::Independent => {
                self.rounds_left -= 1;
                Step::NewRound
            }
        }
    }

    /// The allocator's answer to a zone failure.
    pub fn on_zone_outcome(&mut self, outcome: FailOutcome) -> Step {
        match outcome {
            FailOutcome::TryAnotherZone => Step::FailOver,
            FailOutcome::RoundExhausted => {
                self.rounds_left = self.rounds_left.saturating_sub(1);
                Step::NewRound
            }
        }
    }
}

/// How a job ended.
///
/// Small (the instance and the constraints boxed): an outcome is moved from the start through
/// the pool to the coordinator, and every move copies the whole of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// The machine has this instance (new, adopted after a lost result, or reused).
    Started {
        /// The machine.
        machine: MachineId,
        /// Its instance.
        instance: Box<CloudInstance>,
        /// The constraints it was started with (`None` when adopted, and when machine reuse is
        /// off: only reuse needs them).
        constraints: Option<Box<crate::model::Constraints>>,
        /// A dead machine whose parked instance this start took over (or gave up): remove it.
        retired: Option<MachineId>,
        /// Whether the allocator reserved its zone (not for adopted or reused instances).
        reserved: bool,
        /// A parked instance this start tried to take over and gave up: stop it (then remove
        /// `retired`).
        given_up: Option<GivenUp>,
    },
    /// The start failed for good; the machine's status says why (the error's text).
    StartFailed {
        /// The machine.
        machine: MachineId,
        /// Why: its text is the message written to the machine's status.
        error: WorkerError,
        /// A dead machine whose parked instance this start gave up: remove it.
        retired: Option<MachineId>,
        /// The instance it started (or adopted) but could not record: stop it, retried until it
        /// succeeds.
        orphan: Option<InstanceId>,
        /// A parked instance this start gave up: stop it (then remove `retired`).
        given_up: Option<GivenUp>,
        /// The zone of the last cloud call that failed, when the start ended on one (what a
        /// failed start is counted under, per zone).
        zone: Option<String>,
    },
    /// The machine died before or during its start; nothing was left running.
    StartAbandoned {
        /// The machine.
        machine: MachineId,
        /// A parked instance this start gave up: stop it.
        given_up: Option<GivenUp>,
    },
    /// Instances are terminated.
    Stopped {
        /// The instances.
        instances: Vec<InstanceId>,
        /// Dead machines to remove now.
        machines: Vec<MachineId>,
    },
    /// Instances were released.
    Released {
        /// The instances.
        instances: Vec<InstanceId>,
        /// Dead machines to remove now.
        machines: Vec<MachineId>,
    },
}

/// Why an actor did not answer (it no longer takes messages: the provisioner is stopping): the
/// mailbox's error, named here so that a plain core can take it as an answer without actix.
pub type Unavailable = actix::MailboxError;

/// What can fail in the pool: why a start failed for good (its text is what the machine's
/// status and the `machine-failed` event say), or why a stop or release is tried again. The
/// cloud's failure, when there is one, is kept as the source, with its kind
/// ([`WorkerError::kind`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerError {
    /// The cloud refused the start for good: the last attempt's failure, rounds used up.
    #[error("{0}")]
    Cloud(#[source] BrokerError),
    /// A `spot` machine (which never falls back to on-demand) found no spot capacity: every
    /// allowed zone refused its spot calls, rounds used up (the last refusal).
    #[error("no spot capacity in any allowed zone: {0}")]
    NoSpotCapacity(#[source] BrokerError),
    /// The cloud could not derive the machine's availability zones.
    #[error("deriving availability zones: {0}")]
    DeriveZones(#[source] BrokerError),
    /// The allocator found no zone for the machine.
    #[error("{0}")]
    NoZone(#[source] ZoneError),
    /// A call failed ambiguously, and looking for the instance it may have made failed every
    /// time (the last lookup's failure).
    #[error("cannot tell whether the cloud made an instance for this start: {0}")]
    Lookup(#[source] BrokerError),
    /// The instance could not be recorded in the model (the last attempt's failure).
    #[error("cannot record instance {instance}: {source}")]
    Record {
        /// The instance, left unrecorded: the start's orphan.
        instance: InstanceId,
        /// The model's error.
        #[source]
        source: ModelError,
    },
    /// The provisioner stopped: an actor the start asks (the zone allocator, the lifecycle,
    /// the registry) no longer takes messages.
    #[error("{actor} unavailable: {source}")]
    Stopped {
        /// The actor, as the text names it.
        actor: &'static str,
        /// The mailbox's error.
        #[source]
        source: Unavailable,
    },
    /// A parked instance could not be handed over (machine reuse): the cloud refused its new
    /// tags. It is given up (stopped) and the machine starts afresh.
    #[error("{0}")]
    Retag(#[source] BrokerError),
    /// A parked instance is no longer running: it is given up, and the machine starts afresh.
    #[error("instance {0} is no longer running")]
    NotRunning(InstanceId),
    /// The allocator's answer to a zone failure left the start with nothing to do (a bug).
    #[error("internal: zone failure left unresolved")]
    Unresolved,
    /// The start's shell answered a question the start did not ask (a bug).
    #[error("internal: unexpected answer {answer} while waiting for {waiting}")]
    Unexpected {
        /// What the start waited for.
        waiting: &'static str,
        /// What came.
        answer: &'static str,
    },
    /// Stopping instances failed: the stop is queued again after a backoff.
    #[error("stopping instances {instances:?}: {source}")]
    Stop {
        /// The instances.
        instances: Vec<InstanceId>,
        /// The cloud's error.
        #[source]
        source: BrokerError,
    },
    /// Releasing instances failed: the release is queued again after a backoff.
    #[error("releasing instances {instances:?}: {source}")]
    Release {
        /// The instances.
        instances: Vec<InstanceId>,
        /// The cloud's error.
        #[source]
        source: BrokerError,
    },
}

impl WorkerError {
    /// The cloud's failure behind it, if the cloud failed.
    pub fn broker_error(&self) -> Option<&BrokerError> {
        match self {
            WorkerError::Cloud(e)
            | WorkerError::NoSpotCapacity(e)
            | WorkerError::DeriveZones(e)
            | WorkerError::Lookup(e)
            | WorkerError::Retag(e)
            | WorkerError::Stop { source: e, .. }
            | WorkerError::Release { source: e, .. } => Some(e),
            WorkerError::NoZone(_)
            | WorkerError::Record { .. }
            | WorkerError::Stopped { .. }
            | WorkerError::NotRunning(_)
            | WorkerError::Unresolved
            | WorkerError::Unexpected { .. } => None,
        }
    }

    /// The kind of the cloud's failure behind it (zone-specific, zone-independent, throttled,
    /// transient), if the cloud failed.
    pub fn kind(&self) -> Option<BrokerErrorKind> {
        self.broker_error().map(BrokerError::failure_kind)
    }
}

/// A parked instance a start tried to take over (machine reuse) and gave up, with the dead
/// machine it came from: the instance is stopped, then the machine removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenUp {
    /// The parked instance.
    pub instance: InstanceId,
    /// Its dead machine.
    pub retired: MachineId,
}

impl JobOutcome {
    /// The same outcome, naming a parked instance the start gave up (if any).
    pub fn with_given_up(mut self, instance: Option<GivenUp>) -> Self {
        if instance.is_some() {
            match &mut self {
                JobOutcome::Started { given_up, .. }
                | JobOutcome::StartFailed { given_up, .. }
                | JobOutcome::StartAbandoned { given_up, .. } => *given_up = instance,
                JobOutcome::Stopped { .. } | JobOutcome::Released { .. } => {}
            }
        }
        self
    }
}

/// The pool's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatus {
    /// Concurrency limit.
    pub size: usize,
    /// Jobs running on a worker (a start recording its instance after giving its worker back,
    /// `ProvisionerConfig::record_outside_worker`, is not counted).
    pub in_flight: usize,
    /// Jobs waiting.
    pub queued: usize,
}
