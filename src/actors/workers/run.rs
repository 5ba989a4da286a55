//! The start procedure one worker runs for one machine, as values: adopt or start, retry, fail
//! over, register. Plain (no actix): [`StartRun`] names the next thing to ask or do
//! ([`StartAsk`]), the shell (`start.rs`) carries it out against the ports and the actors and
//! feeds the answer back ([`StartAnswer`]), one at a time, in the order the run names them; a
//! model checker may drive the same run synchronously, answering as it likes. Every decision
//! about rounds is made by [`Attempts`]; every decision about zones by the allocator; the
//! jitter of every backoff comes from the run's own seeded generator, so a run is a function of
//! its seed and its answers.
//!
//! An ambiguous failure (the call may have made the instance) is repeated in place, same zone,
//! same client token, unless it is a zone that did not answer (`ZoneUnreachable`, issue 32):
//! that one would hang again, so the zone is marked failed for the machine and the start fails
//! over; being unsure, it looks for an instance tagged for its start before its next call
//! (adopting it if the unanswered call made one by then), and before it gives up. What the
//! frozen zone makes later, once the machine has its instance elsewhere, the registry finds as
//! the machine's extra instance and the provisioner stops (see `registry`).

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::state::{
    repeats_in_place, Attempts, CapacityPlan, CapacityStep, FailureKind, GivenUp, JobOutcome, StartJob, Step,
    Unavailable, WorkerError,
};
use crate::config::{Backoff, RetryStrategy};
use crate::model::{
    CloudInstance, Constraints, FailOutcome, InstanceId, InstanceState, InstanceStatus, InstanceTags, MachineId,
    Reusable, ZoneError, ZoneRequest,
};
use crate::ports::{BrokerError, ModelError, ProvisionedInstance, StartInstanceParams, StartedInstance};

/// How many client tokens that answer an instance terminated since a start skips at most.
const SPENT_TOKENS: u32 = 3;

/// How many times instance info is written before the instance is given up.
const REGISTER_ATTEMPTS: u32 = 3;

/// How many times the lookup for an instance tagged for this start is made before the start
/// gives up (each failure backs off).
const LOOKUP_ATTEMPTS: u32 = 5;

/// A start call's client token: `MACHINE/NONCE/CALL` (built by hand, not `format!`: one per
/// call, on the hot path).
pub fn client_token(machine: &MachineId, nonce: &str, call: u32) -> String {
    use std::fmt::Write;
    // Room for the call number's ten digits: one allocation.
    let mut token = String::with_capacity(machine.as_str().len() + nonce.len() + 12);
    token.push_str(machine.as_str());
    token.push('/');
    token.push_str(nonce);
    token.push('/');
    let _ = write!(token, "{call}");
    token
}

/// What a start reads of its provisioner's configuration and its cloud (the shell's
/// `StartDeps`, without the ports and the actors).
#[derive(Debug, Clone, PartialEq)]
pub struct StartSettings {
    /// Start retries.
    pub retry: RetryStrategy,
    /// Backoff for throttling, lookups and records.
    pub backoff: Backoff,
    /// The cloud derives a machine's zones (`Broker::supports_zones`): ask it to before the
    /// first call.
    pub supports_zones: bool,
    /// Machine reuse is on: look for a parked instance to take over, and remember the
    /// constraints a machine started with.
    pub claim: bool,
    /// The cloud call joins a batch (the pool replays an ambiguous batched call itself).
    pub batched: bool,
    /// The most a spot call pays, handed to the broker with every spot call.
    pub spot_max_price: Option<crate::model::UsdPerHour>,
    /// Our model's uuid, tagged on every instance.
    pub model_uuid: std::sync::Arc<str>,
    /// Code broken on purpose (the model checker's tests, issue 35): none in production.
    pub mutations: crate::config::Mutations,
}

/// What the run asks the shell to do, one at a time; the answer (or, where the answer is only
/// that it was done, [`StartAnswer::Done`]) goes to [`StartRun::answer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartAsk {
    /// Whether the lifecycle still wants the machine started. Answer: [`StartAnswer::Wanted`].
    StillWanted,
    /// Send a status write without waiting for it (after any write still pending); a later
    /// write, and the start's end, wait for it first. Answer: [`StartAnswer::Done`].
    SendInstanceStatus {
        /// The status.
        status: InstanceStatus,
        /// Its message.
        message: String,
    },
    /// Write an instance status (after any write still pending) and wait for it; a failure is
    /// the shell's to log. Answer: [`StartAnswer::Done`].
    SetInstanceStatus {
        /// The status.
        status: InstanceStatus,
        /// Its message.
        message: String,
    },
    /// Write the machine's status `error` with this message; a failure is the shell's to log.
    /// Answer: [`StartAnswer::Done`].
    SetMachineError(String),
    /// The cloud derives the machine's zones from its first call's parameters
    /// ([`StartRun::first_call_params`], lent rather than copied into the question). Answer:
    /// [`StartAnswer::Zones`].
    DeriveZones,
    /// Wait this long (even zero: the wait is awaited as asked). Answer: [`StartAnswer::Done`].
    Sleep(Duration),
    /// The harvest policy: a parked instance that fits (machine reuse). Answer:
    /// [`StartAnswer::Claimed`].
    ClaimReusable {
        /// The machine's constraints.
        constraints: Constraints,
        /// Its derived zones.
        derived: Vec<String>,
    },
    /// The registry: the last known state of this (claimed) instance, from a listing no older
    /// than the shell's limit. Answer: [`StartAnswer::StateOf`].
    InstanceStateOf(InstanceId),
    /// The cloud: tag a parked instance for this machine. Answer: [`StartAnswer::Retagged`].
    Retag {
        /// The parked instance.
        instance: InstanceId,
        /// The machine's tags.
        tags: InstanceTags,
    },
    /// The allocator: choose (and reserve) a zone. Answer: [`StartAnswer::Zone`].
    ChooseZone(ZoneRequest),
    /// The cloud call, alone or joining a batch ([`StartSettings::batched`]). Answer:
    /// [`StartAnswer::Called`]. Boxed: a question is moved at every step, and the parameters are
    /// most of it.
    Call(Box<StartInstanceParams>),
    /// The allocator: the call's zone failed for the machine. Answer: [`StartAnswer::Marked`].
    MarkZoneFailed {
        /// The zone.
        zone: String,
        /// The machine's shape (the spot shape for a spot call).
        shape: Option<String>,
    },
    /// The allocator: drop the machine's reservation. Answer: [`StartAnswer::Done`].
    ReleaseReservation,
    /// The allocator: forget the machine. Answer: [`StartAnswer::Done`].
    ReleaseMachine,
    /// The registry: the stop of this instance the start made and could not record is decided
    /// (never adopted; the machine is not started again before the stop is seen through). Asked
    /// before the machine's provisioning error is written, so that a retry of the machine in
    /// error (which reads that error) finds the stop decided. Answer: [`StartAnswer::Done`].
    OrphanStopping(InstanceId),
    /// The cloud: live instances tagged for this machine and this start's nonce. Answer:
    /// [`StartAnswer::Found`].
    LookForOwn(String),
    /// Give the start's worker back (it is done with the cloud), if it is to be given back
    /// before the start ends. Answer: [`StartAnswer::Done`].
    FreeWorker,
    /// Record the instance in the model. Answer: [`StartAnswer::Recorded`].
    Record(ProvisionedInstance),
    /// The start ended (once any status write still pending has committed): its outcome.
    Finish(JobOutcome),
}

/// The answer to a [`StartAsk`].
#[derive(Debug, Clone)]
pub enum StartAnswer {
    /// It was done (for the asks whose answer is nothing more).
    Done,
    /// The lifecycle's answer, or why it could not answer.
    Wanted(Result<bool, Unavailable>),
    /// The derived zones, or why the cloud could not derive them.
    Zones(Result<Vec<String>, BrokerError>),
    /// A parked instance and its dead machine, if one fits (an unavailable policy claims none).
    Claimed(Result<Option<(MachineId, Reusable)>, Unavailable>),
    /// The registry's last known state of the instance.
    StateOf(Result<Option<InstanceState>, Unavailable>),
    /// The cloud retagged the parked instance, or why not.
    Retagged(Result<(), BrokerError>),
    /// The allocator's zone (`None`: a zoneless cloud), or why none.
    Zone(Result<Result<Option<String>, ZoneError>, Unavailable>),
    /// The cloud call's result.
    Called {
        /// The started instance, or why not.
        result: Result<StartedInstance, BrokerError>,
        /// The call may have made the instance although it failed.
        maybe_made: bool,
    },
    /// The allocator's answer to the zone's failure.
    Marked(Result<FailOutcome, Unavailable>),
    /// The instances of this start, or why the lookup failed.
    Found(Result<Vec<CloudInstance>, BrokerError>),
    /// The model recorded the instance, or why not.
    Recorded(Result<(), ModelError>),
}

/// How the instance being registered came about.
#[derive(Debug, Clone, Default)]
struct Started {
    /// The constraints it was started with (`None` for an adopted instance).
    constraints: Option<Constraints>,
    /// The dead machine whose parked instance was taken over or given up.
    retired: Option<MachineId>,
    /// The allocator reserved its zone.
    reserved: bool,
}

/// An instance being recorded in the model.
#[derive(Debug, Clone)]
struct Registering {
    instance: CloudInstance,
    /// The nonce of the start that made it, when not this start's (an adopted instance).
    nonce: Option<String>,
    name: String,
    started: Started,
    /// Failed writes so far.
    attempt: u32,
}

/// A start ending in failure: what its outcome names.
#[derive(Debug, Clone)]
struct Failing {
    error: WorkerError,
    retired: Option<MachineId>,
    zone: Option<String>,
    orphan: Option<InstanceId>,
}

/// The last call's failure, while its consequences are being carried out.
#[derive(Debug, Clone)]
struct Failure {
    err: BrokerError,
    /// The call's zone.
    zone: Option<String>,
    /// What the capacity type made of it.
    spot: CapacityStep,
    step: Step,
}

/// What a lookup for an instance of this start is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LookFor {
    /// Before a call with a new token.
    NextCall,
    /// Out of rounds: before giving up.
    OutOfRounds,
    /// The machine died meanwhile: hand the instance on as the start's product, if there is one.
    Abandon,
}

/// Where to go on from once the lifecycle still wants the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    Begin,
    DeriveZones,
    NextCall,
}

/// Where the run stands: the question outstanding.
#[derive(Debug, Clone)]
enum Waiting {
    Nothing,
    Wanted(Then),
    Abandoning,
    Starting,
    Zones,
    ZonesBackoff,
    Claim,
    /// A claimed parked instance and its dead machine.
    StateOf(Box<(MachineId, Reusable)>),
    Retag(Box<(MachineId, Reusable)>),
    Zone,
    Call,
    Mark,
    Release,
    Progress(Duration),
    Delay,
    Look {
        attempt: u32,
        why: LookFor,
    },
    LookBackoff {
        attempt: u32,
        why: LookFor,
    },
    FreeWorker,
    Record,
    RecordBackoff,
    /// The machine is released; its instance status is next.
    FailReleased,
    OrphanStopping,
    FailInstanceStatus,
    FailMachineStatus,
}

/// One start in flight: the procedure's state between questions.
#[derive(Debug, Clone)]
pub struct StartRun {
    job: StartJob,
    nonce: String,
    settings: StartSettings,
    rng: SmallRng,
    waiting: Waiting,
    /// Throttled zone derivations so far.
    throttled: u32,
    /// The first call's parameters, built for the zones' derivation (a later call builds them
    /// again, the same: they follow from the job).
    spare: Option<Box<StartInstanceParams>>,
    /// The derived zones, until the zone request is made of them.
    derived: Vec<String>,
    request: ZoneRequest,
    attempts: Attempts,
    capacity: CapacityPlan,
    /// Calls made with a new token so far.
    call: u32,
    /// Tokens found spent (they answer an instance terminated since): each skipped for the next.
    spent: u32,
    /// The zone and client token (its call number) of a call whose failure was ambiguous (it
    /// may have made the instance): the next call repeats it exactly, so the cloud returns what
    /// it made.
    repeat: Option<(Option<String>, u32)>,
    /// Some call of this start failed ambiguously: before a call with a new token, look for an
    /// instance tagged for this start.
    unsure: bool,
    /// The call in flight: its zone and token, and whether it repeats the one before.
    zone: Option<String>,
    token: u32,
    repeating: bool,
    failure: Option<Failure>,
    /// Constraints are only remembered where reuse may need them.
    own: Option<Constraints>,
    /// The dead machine whose parked instance this start tried.
    retired: Option<MachineId>,
    /// A parked instance this start gave up (machine reuse): named in the outcome, however the
    /// start ends, for the coordinator to stop, then remove its dead machine (no stop is
    /// fire-and-forget).
    given_up: Option<GivenUp>,
    registering: Option<Box<Registering>>,
    failing: Option<Box<Failing>>,
}

impl StartRun {
    /// A run of `job` with this nonce (the first half of its tags' start nonce), and its first
    /// question. `seed` seeds the jitter of its backoffs, so a run is reproducible.
    pub fn new(job: StartJob, nonce: String, settings: StartSettings, seed: u64) -> (Self, StartAsk) {
        let attempts = Attempts::new(settings.retry.count);
        let capacity = CapacityPlan::new(job.info.capacity);
        let own = settings.claim.then(|| job.info.constraints.clone());
        let mut run = Self {
            job,
            nonce,
            settings,
            rng: SmallRng::seed_from_u64(seed),
            waiting: Waiting::Nothing,
            throttled: 0,
            spare: None,
            derived: Vec::new(),
            request: ZoneRequest::default(),
            attempts,
            capacity,
            call: 0,
            spent: 0,
            repeat: None,
            unsure: false,
            zone: None,
            token: 0,
            repeating: false,
            failure: None,
            own,
            retired: None,
            given_up: None,
            registering: None,
            failing: None,
        };
        let ask = run.ask(Waiting::Wanted(Then::Begin), StartAsk::StillWanted);
        (run, ask)
    }

    /// The machine being started.
    pub fn machine(&self) -> &MachineId {
        &self.job.machine.id
    }

    /// The first call's parameters, before a zone and a client token are chosen (what
    /// [`StartAsk::DeriveZones`] derives the zones from); `None` once the first call took them.
    pub fn first_call_params(&self) -> Option<&StartInstanceParams> {
        self.spare.as_deref()
    }

    /// Feeds the answer to the question outstanding; answers the next question, or the end.
    /// An answer that does not answer the question (a shell's bug) ends the start in
    /// [`WorkerError::Unexpected`].
    pub fn answer(&mut self, answer: StartAnswer) -> StartAsk {
        let waiting = std::mem::replace(&mut self.waiting, Waiting::Nothing);
        match (waiting, answer) {
            (Waiting::Wanted(then), StartAnswer::Wanted(wanted)) => self.on_wanted(then, wanted),
            (Waiting::Abandoning, StartAnswer::Done) => {
                let machine = self.machine().clone();
                self.finish(JobOutcome::StartAbandoned { machine, given_up: None })
            }
            (Waiting::Starting, StartAnswer::Done) => self.derive_zones(),
            (Waiting::Zones, StartAnswer::Zones(zones)) => match zones {
                Ok(z) => {
                    self.derived = z;
                    self.claim()
                }
                // Throttling is never the machine's failure (no round used, no zone marked): wait
                // and ask again.
                Err(BrokerError::Throttled { .. }) => {
                    let d = self.settings.backoff.delay(self.throttled, &mut self.rng);
                    self.throttled += 1;
                    tracing::debug!(machine = %self.machine(), retry_in = ?d, "deriving zones throttled by the cloud; waiting");
                    self.ask(Waiting::ZonesBackoff, StartAsk::Sleep(d))
                }
                Err(e) => self.fail(WorkerError::DeriveZones(e)),
            },
            (Waiting::ZonesBackoff, StartAnswer::Done) => {
                self.ask(Waiting::Wanted(Then::DeriveZones), StartAsk::StillWanted)
            }
            (Waiting::Claim, StartAnswer::Claimed(claimed)) => match claimed {
                Ok(Some((old, parked))) => {
                    self.retired = Some(old.clone());
                    // Only a running instance is handed over: one stopped or gone since it was
                    // parked is given up (stopped) and the machine starts afresh.
                    let id = parked.instance.clone();
                    self.ask(Waiting::StateOf(Box::new((old, parked))), StartAsk::InstanceStateOf(id))
                }
                _ => self.calls(),
            },
            (Waiting::StateOf(claimed), StartAnswer::StateOf(state)) => match state {
                Ok(Some(InstanceState::Running)) => {
                    let instance = claimed.1.instance.clone();
                    let tags = self.tags();
                    self.ask(Waiting::Retag(claimed), StartAsk::Retag { instance, tags })
                }
                Ok(_) => {
                    let error = WorkerError::NotRunning(claimed.1.instance.clone());
                    self.on_handed(*claimed, Err(error))
                }
                Err(source) => self.on_handed(*claimed, Err(WorkerError::Stopped { actor: "registry", source })),
            },
            (Waiting::Retag(claimed), StartAnswer::Retagged(res)) => {
                self.on_handed(*claimed, res.map_err(WorkerError::Retag))
            }
            (Waiting::Zone, StartAnswer::Zone(zone)) => match zone {
                Ok(Ok(zone)) => {
                    self.call += 1;
                    self.make_call(zone, self.call - 1)
                }
                Ok(Err(e)) => self.fail(WorkerError::NoZone(e)),
                Err(source) => self.fail(WorkerError::Stopped { actor: "zone allocator", source }),
            },
            (Waiting::Call, StartAnswer::Called { result, maybe_made }) => self.on_called(result, maybe_made),
            (Waiting::Mark, StartAnswer::Marked(outcome)) => {
                let Some(failure) = self.failure.as_mut() else { return self.unexpected("a call's failure", "Marked") };
                match outcome {
                    Ok(outcome) if failure.spot == CapacityStep::MarkZone => {
                        failure.step = self.capacity.on_zone_outcome(outcome, &mut self.attempts)
                    }
                    Ok(outcome) => failure.step = self.attempts.on_zone_outcome(outcome),
                    Err(source) => return self.fail(WorkerError::Stopped { actor: "zone allocator", source }),
                }
                self.on_step()
            }
            (Waiting::Release, StartAnswer::Done) => self.on_step(),
            (Waiting::Progress(delay), StartAnswer::Done) => self.wait(delay),
            (Waiting::Delay, StartAnswer::Done) => self.ask(Waiting::Wanted(Then::NextCall), StartAsk::StillWanted),
            (Waiting::Look { attempt, why }, StartAnswer::Found(found)) => match found {
                Ok(found) => self.on_found(why, Ok(found.into_iter().next())),
                Err(e) => {
                    tracing::warn!(machine = %self.machine(), error = %e, "cannot look for an instance of this start");
                    let attempt = attempt + 1;
                    if attempt == LOOKUP_ATTEMPTS {
                        return self.on_found(why, Err(WorkerError::Lookup(e)));
                    }
                    let d = self.settings.backoff.delay(attempt - 1, &mut self.rng);
                    self.ask(Waiting::LookBackoff { attempt, why }, StartAsk::Sleep(d))
                }
            },
            (Waiting::LookBackoff { attempt, why }, StartAnswer::Done) => {
                let nonce = self.nonce.clone();
                self.ask(Waiting::Look { attempt, why }, StartAsk::LookForOwn(nonce))
            }
            (Waiting::FreeWorker, StartAnswer::Done) => self.record(),
            (Waiting::Record, StartAnswer::Recorded(res)) => self.on_recorded(res),
            (Waiting::RecordBackoff, StartAnswer::Done) => self.record(),
            (Waiting::FailReleased, StartAnswer::Done) => {
                if let Some(orphan) = self.failing.as_ref().and_then(|f| f.orphan.clone()) {
                    return self.ask(Waiting::OrphanStopping, StartAsk::OrphanStopping(orphan));
                }
                self.fail_status()
            }
            (Waiting::OrphanStopping, StartAnswer::Done) => self.fail_status(),
            (Waiting::FailInstanceStatus, StartAnswer::Done) => {
                let message = self.failing.as_ref().map(|f| f.error.to_string()).unwrap_or_default();
                self.ask(Waiting::FailMachineStatus, StartAsk::SetMachineError(message))
            }
            (Waiting::FailMachineStatus, StartAnswer::Done) => match self.failing.take() {
                Some(failing) => {
                    let Failing { error, retired, zone, orphan } = *failing;
                    let machine = self.machine().clone();
                    self.finish(JobOutcome::StartFailed { machine, error, retired, orphan, given_up: None, zone })
                }
                None => self.unexpected("a failure", "Done"),
            },
            (waiting, answer) => self.unexpected(waiting.name(), answer.name()),
        }
    }

    fn ask(&mut self, waiting: Waiting, ask: StartAsk) -> StartAsk {
        self.waiting = waiting;
        ask
    }

    /// The end: the outcome names the parked instance given up, if any.
    fn finish(&mut self, outcome: JobOutcome) -> StartAsk {
        self.waiting = Waiting::Nothing;
        StartAsk::Finish(outcome.with_given_up(self.given_up.clone()))
    }

    /// A shell's bug: the start ends in failure, saying so.
    fn unexpected(&mut self, waiting: &'static str, answer: &'static str) -> StartAsk {
        tracing::error!(machine = %self.machine(), waiting, answer, "unexpected answer in a start");
        self.fail(WorkerError::Unexpected { waiting, answer })
    }

    /// Whether the lifecycle still wants the machine started: not if it died meanwhile, nor if
    /// the lifecycle stopped (the provisioner is stopping).
    fn on_wanted(&mut self, then: Then, wanted: Result<bool, Unavailable>) -> StartAsk {
        let wanted = match wanted {
            Ok(true) => true,
            Ok(false) => {
                tracing::info!(machine = %self.machine(), "machine died before its start completed; not starting it");
                false
            }
            Err(source) => {
                let error = WorkerError::Stopped { actor: "lifecycle", source };
                tracing::info!(machine = %self.machine(), %error, "not starting it");
                false
            }
        };
        match then {
            Then::Begin if wanted => self.begin(),
            Then::DeriveZones if wanted => self.derive_zones(),
            Then::NextCall if wanted => self.next_call(),
            // The machine died meanwhile, but an earlier call may have made its instance: hand
            // it on as the start's product, so that it is harvested with the machine.
            Then::NextCall if self.unsure => self.look(LookFor::Abandon),
            Then::Begin | Then::DeriveZones | Then::NextCall => self.abandon(),
        }
    }

    /// Ends a start the lifecycle no longer wants ([`StartRun::on_wanted`] said why).
    fn abandon(&mut self) -> StartAsk {
        self.ask(Waiting::Abandoning, StartAsk::ReleaseMachine)
    }

    fn begin(&mut self) -> StartAsk {
        // A start whose result was lost (a crash) left a tagged instance: adopt it.
        if let Some(instance) = self.job.adopt.take() {
            let instance = *instance;
            tracing::info!(machine = %self.machine(), instance = %instance.id, "adopting existing instance tagged for this machine");
            let nonce = instance.tags.start.clone();
            return self.register(instance, nonce, String::new(), Started::default());
        }
        // A spot hand-over's replacement says whom it replaces (`machine show` during the
        // hand-over).
        let message = match &self.job.replaces {
            Some(interrupted) => format!("replacing instance {interrupted}: the cloud warned it takes it away"),
            None => "starting".into(),
        };
        // The first call's parameters, built now for the zones' derivation, and kept for it.
        self.spare = Some(Box::new(self.job.call_params(&self.settings.model_uuid, &self.nonce)));
        self.ask(Waiting::Starting, StartAsk::SendInstanceStatus { status: InstanceStatus::provisioning(), message })
    }

    fn derive_zones(&mut self) -> StartAsk {
        if self.settings.supports_zones && self.spare.is_some() {
            return self.ask(Waiting::Zones, StartAsk::DeriveZones);
        }
        self.claim()
    }

    /// The machine's tags, as its calls carry them.
    fn tags(&self) -> InstanceTags {
        match &self.spare {
            Some(params) => params.tags.clone(),
            None => self.job.call_params(&self.settings.model_uuid, &self.nonce).tags,
        }
    }

    fn claim(&mut self) -> StartAsk {
        // Machine reuse (opt-in): take over a parked instance that fits (on-demand machines
        // only: a parked instance's capacity type is not known).
        if self.settings.claim && self.job.info.capacity.is_default() {
            let ask = StartAsk::ClaimReusable {
                constraints: self.job.info.constraints.clone(),
                derived: self.derived.clone(),
            };
            return self.ask(Waiting::Claim, ask);
        }
        self.calls()
    }

    /// The parked instance handed over, or why not.
    fn on_handed(&mut self, (old, parked): (MachineId, Reusable), handed: Result<(), WorkerError>) -> StartAsk {
        match handed {
            Ok(()) => {
                tracing::info!(machine = %self.machine(), instance = %parked.instance, from = %old, "reusing the instance of a dead machine");
                let instance = CloudInstance {
                    id: parked.instance,
                    state: InstanceState::Running,
                    zone: parked.zone,
                    tags: self.tags(),
                    age: None,
                    instance_type: None,
                    capacity_type: None,
                    image: None,
                };
                let started = Started {
                    constraints: Some(self.job.info.constraints.clone()),
                    retired: self.retired.clone(),
                    reserved: false,
                };
                self.register(instance, None, String::new(), started)
            }
            Err(e) => {
                tracing::warn!(machine = %self.machine(), instance = %parked.instance, error = %e, "cannot hand the parked instance over; stopping it and starting anew");
                self.given_up = Some(GivenUp { instance: parked.instance, retired: old });
                self.calls()
            }
        }
    }

    /// The calls begin: the zone request is made of the derived zones.
    fn calls(&mut self) -> StartAsk {
        self.request = self.job.zone_request(std::mem::take(&mut self.derived));
        self.next_call()
    }

    /// The next call: the one to repeat, or one with a new token (after looking for an
    /// instance of this start, if unsure) in the zone the allocator chooses.
    fn next_call(&mut self) -> StartAsk {
        self.repeating = self.repeat.is_some();
        if let Some((zone, token)) = self.repeat.take() {
            return self.make_call(zone, token);
        }
        if self.unsure {
            return self.look(LookFor::NextCall);
        }
        self.choose_zone()
    }

    fn choose_zone(&mut self) -> StartAsk {
        let request = self.capacity.request(&self.request);
        self.ask(Waiting::Zone, StartAsk::ChooseZone(request))
    }

    fn make_call(&mut self, zone: Option<String>, token: u32) -> StartAsk {
        // The first call takes the parameters built for the zones' derivation; a later one
        // builds them again, the same (they follow from the job), rather than every call taking
        // a copy.
        let mut params =
            self.spare.take().unwrap_or_else(|| Box::new(self.job.call_params(&self.settings.model_uuid, &self.nonce)));
        params.client_token = client_token(&self.job.machine.id, &self.nonce, token);
        params.zone = zone.clone();
        params.capacity = self.capacity.capacity();
        params.spot_max_price = self.settings.spot_max_price.filter(|_| !params.capacity.is_on_demand());
        self.zone = zone;
        self.token = token;
        self.ask(Waiting::Call, StartAsk::Call(params))
    }

    fn on_called(&mut self, result: Result<StartedInstance, BrokerError>, maybe_made: bool) -> StartAsk {
        let zone = self.zone.take();
        let err = match result {
            // The token made an instance before (a start repeated after a crash) that is gone
            // since: it answers that instance again. A new token makes a new one, at once and
            // using no round (a few times at most: then a failure as any other).
            Ok(started) if started.instance.state == InstanceState::Terminated && self.spent < SPENT_TOKENS => {
                self.spent += 1;
                tracing::info!(machine = %self.machine(), instance = %started.instance.id, "the start's client token answers an instance terminated since: starting with a new token");
                return self.next_call();
            }
            Ok(started) if started.instance.state == InstanceState::Terminated => BrokerError::zone_independent(
                format!("the start's client tokens answer instance {}, terminated since", started.instance.id),
            ),
            Ok(started) => {
                tracing::info!(machine = %self.machine(), instance = %started.instance.id, zone = ?zone, "started instance");
                let how = Started { constraints: self.own.take(), retired: self.retired.clone(), reserved: true };
                return self.register(started.instance, None, started.display_name, how);
            }
            Err(e) => e,
        };
        // Mutation (the model checker's tests): an ambiguous failure taken for a definite one,
        // so that the next call takes a new token, without looking first.
        let ambiguous = maybe_made && !self.settings.mutations.new_token_after_ambiguous;
        self.unsure |= ambiguous;
        let spot = self.capacity.on_failure(&err, zone.as_deref());
        let step = match spot {
            CapacityStep::Usual => self.attempts.on_failure(FailureKind::of(&err, zone.as_deref())),
            CapacityStep::MarkZone => Step::MarkZone,
            CapacityStep::OnDemand => Step::OnDemand,
        };
        // A batched call was replayed by the pool already (same token, same machines) while
        // this start waited: it is never repeated from here, the start looks first instead. A
        // zone that did not answer is never repeated either: it is marked failed below, and the
        // start (unsure) looks before its next call, in another zone.
        let in_place = ambiguous && repeats_in_place(&err, zone.as_deref());
        let repeat = !self.settings.batched && (in_place || (self.repeating && step == Step::Backoff));
        self.failure = Some(Failure { err, zone: zone.clone(), spot, step });
        if repeat {
            // The call may have made the instance: the next one repeats it (same zone, same
            // token, same parameters), keeping the zone's reservation.
            self.repeat = Some((zone, self.token));
            self.on_step()
        } else if step == Step::MarkZone {
            let shape = self.capacity.request(&self.request).shape;
            self.ask(Waiting::Mark, StartAsk::MarkZoneFailed { zone: zone.unwrap_or_default(), shape })
        } else {
            self.ask(Waiting::Release, StartAsk::ReleaseReservation)
        }
    }

    /// What follows the last call's failure, its zone marked or its reservation released.
    fn on_step(&mut self) -> StartAsk {
        let Some(failure) = self.failure.as_ref() else { return self.unexpected("a call's failure", "Done") };
        let step = failure.step;
        match step {
            // Out of rounds, but an earlier call may have made the instance: look first.
            Step::Final if self.unsure => self.look(LookFor::OutOfRounds),
            Step::Final => self.fail_last_call(None),
            // The start goes on at once: on-demand after every zone refused spot, or in another
            // zone.
            Step::OnDemand | Step::FailOver => {
                let machine = self.machine().clone();
                let why = failure.err.message();
                let msg = if step == Step::OnDemand {
                    self.capacity.fall_back();
                    format!("no spot capacity for machine {machine} in any allowed zone ({why}); starting it on-demand")
                } else {
                    let z = failure.zone.as_deref().unwrap_or_default();
                    format!(
                        "failed to start machine {machine} in zone {z:?}, retrying with new availability zone: {why}"
                    )
                };
                tracing::info!(%machine, "{msg}");
                self.progress(msg, Duration::ZERO)
            }
            Step::NewRound => {
                let d = self.settings.retry.delay_before(self.attempts.rounds_used().saturating_sub(1), &mut self.rng);
                let machine = self.machine();
                let msg = format!(
                    "failed to start machine {machine} ({}), retrying in {d:?} ({} more attempts)",
                    failure.err.message(),
                    self.attempts.rounds_left()
                );
                tracing::info!(%machine, "{msg}");
                self.progress(msg, d)
            }
            Step::Backoff => {
                let d = self.settings.backoff.delay(self.attempts.throttled().saturating_sub(1), &mut self.rng);
                tracing::debug!(machine = %self.machine(), retry_in = ?d, "start throttled by the cloud; waiting");
                self.wait(d)
            }
            Step::MarkZone => self.fail(WorkerError::Unresolved),
        }
    }

    /// Says why the start goes on, then waits `delay`.
    fn progress(&mut self, message: String, delay: Duration) -> StartAsk {
        let ask = StartAsk::SetInstanceStatus { status: InstanceStatus::provisioning(), message };
        self.ask(Waiting::Progress(delay), ask)
    }

    /// Waits `delay` (not at all if zero), then asks whether the machine is still wanted.
    fn wait(&mut self, delay: Duration) -> StartAsk {
        if !delay.is_zero() {
            return self.ask(Waiting::Delay, StartAsk::Sleep(delay));
        }
        self.ask(Waiting::Wanted(Then::NextCall), StartAsk::StillWanted)
    }

    /// Looks for a live instance tagged for this start (machine and nonce), retrying a failed
    /// or throttled lookup with backoff, [`LOOKUP_ATTEMPTS`] times at most.
    fn look(&mut self, why: LookFor) -> StartAsk {
        let nonce = self.nonce.clone();
        self.ask(Waiting::Look { attempt: 0, why }, StartAsk::LookForOwn(nonce))
    }

    /// What the lookup found (`Err`: the last lookup's failure).
    fn on_found(&mut self, why: LookFor, found: Result<Option<CloudInstance>, WorkerError>) -> StartAsk {
        match (why, found) {
            (_, Ok(Some(found))) => self.adopt_own(found),
            // Nothing was made: a new token is safe.
            (LookFor::NextCall, Ok(None)) => {
                self.unsure = false;
                self.choose_zone()
            }
            (LookFor::NextCall, Err(e)) => {
                let retired = self.retired.clone();
                self.fail_retiring(e, retired, None)
            }
            (LookFor::OutOfRounds, Ok(None)) => self.fail_last_call(None),
            (LookFor::OutOfRounds, Err(e)) => self.fail_last_call(Some(e)),
            (LookFor::Abandon, _) => self.abandon(),
        }
    }

    /// Ends the start on its last call's failure (or `instead`), naming that call's zone.
    fn fail_last_call(&mut self, instead: Option<WorkerError>) -> StartAsk {
        let retired = self.retired.clone();
        match self.failure.take() {
            Some(Failure { err, zone, .. }) => {
                let error = instead.unwrap_or_else(|| self.capacity.final_error(err));
                self.fail_retiring(error, retired, zone)
            }
            None => self.unexpected("a call's failure", "Found"),
        }
    }

    /// Takes the instance an ambiguous call made (found by its tags) as the start's product.
    fn adopt_own(&mut self, instance: CloudInstance) -> StartAsk {
        tracing::info!(machine = %self.machine(), instance = %instance.id, "a start that failed ambiguously made this instance; keeping it");
        // Counted in its zone by the coordinator (the reservation may have been let go meanwhile).
        let how = Started { constraints: self.own.clone(), retired: self.retired.clone(), reserved: false };
        self.register(instance, None, String::new(), how)
    }

    /// Records the instance in the model, retrying a few times; gives the instance up if that
    /// never works: the machine's provisioning error is written first (so no restarted
    /// provisioner takes the machine for pending and adopts the instance), then the outcome
    /// names the instance as the orphan, which the coordinator has stopped like any other stop
    /// (retried until it succeeds).
    ///
    /// `nonce` is the nonce of the start that made the instance, when not this start's.
    fn register(&mut self, instance: CloudInstance, nonce: Option<String>, name: String, started: Started) -> StartAsk {
        self.registering = Some(Box::new(Registering { instance, nonce, name, started, attempt: 0 }));
        // Done with the cloud: what is left is the model's.
        self.ask(Waiting::FreeWorker, StartAsk::FreeWorker)
    }

    fn record(&mut self) -> StartAsk {
        let Some(r) = self.registering.as_ref() else { return self.unexpected("a record", "Done") };
        // Built for each write rather than built once and cloned for each (every write takes
        // its own): a retry is rare, a start's first write is not.
        let info = ProvisionedInstance {
            instance: r.instance.id.clone(),
            zone: r.instance.zone.clone(),
            nonce: r.nonce.as_ref().unwrap_or(&self.nonce).clone(),
            display_name: r.name.clone(),
            status: InstanceStatus::from_static(r.instance.state.as_str()),
            capacity_type: r.instance.capacity_type,
        };
        self.ask(Waiting::Record, StartAsk::Record(info))
    }

    fn on_recorded(&mut self, recorded: Result<(), ModelError>) -> StartAsk {
        let Some(mut r) = self.registering.take() else { return self.unexpected("a record", "Recorded") };
        let machine = self.machine().clone();
        match recorded {
            Ok(()) => {
                let Registering { instance, started, .. } = *r;
                self.finish(JobOutcome::Started {
                    machine,
                    instance: Box::new(instance),
                    constraints: started.constraints.map(Box::new),
                    retired: started.retired,
                    reserved: started.reserved,
                    given_up: None,
                })
            }
            Err(e) => {
                tracing::warn!(%machine, instance = %r.instance.id, error = %e, "cannot record instance");
                r.attempt += 1;
                if matches!(e, ModelError::Fenced(_)) {
                    // This provisioner no longer leads: no retry can succeed, and the instance is
                    // not an orphan to stop (the next leader adopts it by its tags, or stops it
                    // as an extra): stopping it here could stop the instance the next leader
                    // adopted and recorded.
                    let Registering { instance, started, .. } = *r;
                    let error = WorkerError::Record { instance: instance.id, source: e };
                    return self.fail_retiring(error, started.retired, None);
                }
                if r.attempt == REGISTER_ATTEMPTS {
                    let Registering { instance, started, .. } = *r;
                    let error = WorkerError::Record { instance: instance.id.clone(), source: e };
                    let ask = self.fail_retiring(error, started.retired, None);
                    if let Some(failing) = self.failing.as_mut() {
                        failing.orphan = Some(instance.id);
                    }
                    return ask;
                }
                let d = self.settings.backoff.delay(r.attempt - 1, &mut self.rng);
                self.registering = Some(r);
                self.ask(Waiting::RecordBackoff, StartAsk::Sleep(d))
            }
        }
    }

    /// The failure's instance status write (`provisioning error`, with the cause).
    fn fail_status(&mut self) -> StartAsk {
        let message = self.failing.as_ref().map(|f| f.error.to_string()).unwrap_or_default();
        let ask = StartAsk::SetInstanceStatus { status: InstanceStatus::provisioning_error(), message };
        self.ask(Waiting::FailInstanceStatus, ask)
    }

    /// Writes a final provisioning error: instance status `provisioning error` and machine
    /// status `error`, both with the cause (the error's text).
    fn fail(&mut self, error: WorkerError) -> StartAsk {
        self.fail_retiring(error, None, None)
    }

    /// [`StartRun::fail`], retiring `retired` (a dead machine whose parked instance the start
    /// tried), and naming the `zone` of the cloud call that failed last, if the start ended on
    /// one.
    fn fail_retiring(&mut self, error: WorkerError, retired: Option<MachineId>, zone: Option<String>) -> StartAsk {
        tracing::warn!(machine = %self.machine(), %error, kind = ?error.kind(), "cannot start instance for machine");
        self.failing = Some(Box::new(Failing { error, retired, zone, orphan: None }));
        self.ask(Waiting::FailReleased, StartAsk::ReleaseMachine)
    }
}

impl Waiting {
    fn name(&self) -> &'static str {
        match self {
            Self::Nothing => "nothing",
            Self::Wanted(_) => "whether the machine is still wanted",
            Self::Abandoning | Self::FailReleased => "the machine's release",
            Self::OrphanStopping => "the orphan's stop decided",
            Self::Starting | Self::Progress(_) | Self::FailInstanceStatus => "an instance status write",
            Self::Zones => "the derived zones",
            Self::ZonesBackoff | Self::Delay | Self::LookBackoff { .. } | Self::RecordBackoff => "a wait",
            Self::Claim => "a parked instance",
            Self::StateOf(_) => "the parked instance's state",
            Self::Retag(_) => "the parked instance's retag",
            Self::Zone => "a zone",
            Self::Call => "the cloud call",
            Self::Mark => "the zone's failure",
            Self::Release => "the reservation's release",
            Self::Look { .. } => "the instances of this start",
            Self::FreeWorker => "the worker's release",
            Self::Record => "the instance's record",
            Self::FailMachineStatus => "the machine status write",
        }
    }
}

impl StartAnswer {
    fn name(&self) -> &'static str {
        match self {
            Self::Done => "Done",
            Self::Wanted(_) => "Wanted",
            Self::Zones(_) => "Zones",
            Self::Claimed(_) => "Claimed",
            Self::StateOf(_) => "StateOf",
            Self::Retagged(_) => "Retagged",
            Self::Zone(_) => "Zone",
            Self::Called { .. } => "Called",
            Self::Marked(_) => "Marked",
            Self::Found(_) => "Found",
            Self::Recorded(_) => "Recorded",
        }
    }
}
