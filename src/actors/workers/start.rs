//! The start procedure one worker runs for one machine: adopt or start, retry, fail over,
//! register. Every decision about rounds is made by [`Attempts`]; every decision about zones
//! by the allocator.
//!
//! An ambiguous failure (the call may have made the instance) is repeated in place, same zone,
//! same client token, unless it is a zone that did not answer (`ZoneUnreachable`, issue 32):
//! that one would hang again, so the zone is marked failed for the machine and the start fails
//! over; being unsure, it looks for an instance tagged for its start before its next call
//! (adopting it if the unanswered call made one by then), and before it gives up. What the
//! frozen zone makes later, once the machine has its instance elsewhere, the registry finds as
//! the machine's extra instance and the provisioner stops (see `registry`).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use actix::Recipient;
use futures::future::{Either, LocalBoxFuture};
use futures::FutureExt;

use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::messages::JoinBatch;
use super::state::JobOutcome;
use super::state::{repeats_in_place, Attempts, CapacityPlan, CapacityStep, FailureKind, StartJob, Step, WorkerError};
use crate::actors::lifecycle::StillWanted;
use crate::actors::zones::{ChooseZone, MarkZoneFailed, ReleaseMachine, ReleaseReservation};
use crate::config::{Backoff, RetryStrategy};
use crate::model::{CloudInstance, InstanceState, InstanceStatus, MachineId, MachineStatus};
use crate::ports::{Broker, BrokerError, ModelApi, ModelFuture, ProvisionedInstance, StartInstanceParams};

/// What batched starts need (batching on, on a broker that batches natively).
pub struct BatchDeps {
    /// The cloud, not paced: the pool takes the batch's one start token itself, through
    /// `gate`, and closes the batch only then.
    pub broker: Arc<dyn Broker>,
    /// The limiter (`None`: no client-side limit).
    pub gate: Option<crate::actors::limiter::CallGate>,
    /// Most machines in one call.
    pub size: usize,
}

/// Everything a start needs besides its job: the ports and the actors it consults.
pub struct StartDeps {
    /// The cloud.
    pub broker: Arc<dyn Broker>,
    /// The model.
    pub model: Arc<dyn ModelApi>,
    /// The allocator: choose a zone.
    pub choose: Recipient<ChooseZone>,
    /// The allocator: mark a zone failed.
    pub mark_failed: Recipient<MarkZoneFailed>,
    /// The allocator: drop a reservation.
    pub release_reservation: Recipient<ReleaseReservation>,
    /// The allocator: forget a machine.
    pub release_machine: Recipient<ReleaseMachine>,
    /// The lifecycle: is the start still wanted.
    pub still_wanted: Recipient<StillWanted>,
    /// The harvest policy: a parked instance to reuse (only with machine reuse on).
    pub claim: Option<Recipient<crate::actors::harvest::ClaimReusable>>,
    /// The registry: the last known state of an instance (a claimed one must still run).
    pub state_of: Recipient<crate::actors::registry::InstanceStateOf>,
    /// How old a listing may be to decide on it.
    pub listing_max_age: std::time::Duration,
    /// Start retries.
    pub retry: RetryStrategy,
    /// The most a spot call pays (`ProvisionerConfig::spot_max_price`), handed to the broker
    /// with every spot call.
    pub spot_max_price: Option<crate::model::UsdPerHour>,
    /// Backoff for throttling and failed stops.
    pub backoff: Backoff,
    /// Our model's uuid, tagged on every instance.
    pub model_uuid: String,
    /// The first half of every nonce.
    pub host_tag: String,
    /// Batched starts (`None`: one call per machine).
    pub batch: Option<BatchDeps>,
    /// A start gives its worker back once it is done with the cloud, and records its instance
    /// in the model outside the pool's size (see `ProvisionerConfig::record_outside_worker`).
    pub record_outside_worker: bool,
}

/// A start call's client token: `MACHINE/NONCE/CALL` (built by hand, not `format!`: one per
/// call, on the hot path).
fn client_token(machine: &MachineId, nonce: &str, call: u32) -> String {
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

/// How many client tokens that answer an instance terminated since a start skips at most.
const SPENT_TOKENS: u32 = 3;

/// How many times instance info is written before the instance is given up.
const REGISTER_ATTEMPTS: u32 = 3;

/// Whether the lifecycle still wants the machine started: not if it died meanwhile, nor if
/// the lifecycle stopped (the provisioner is stopping).
async fn still_wanted(deps: &StartDeps, machine: &MachineId) -> bool {
    match deps.still_wanted.send(StillWanted { machine: machine.clone() }).await {
        Ok(true) => true,
        Ok(false) => {
            tracing::info!(%machine, "machine died before its start completed; not starting it");
            false
        }
        Err(source) => {
            let error = WorkerError::Stopped { actor: "lifecycle", source };
            tracing::info!(%machine, %error, "not starting it");
            false
        }
    }
}

async fn set_instance_status(deps: &Start<'_>, machine: &MachineId, status: InstanceStatus, message: String) {
    deps.settle().await;
    if let Err(e) = deps.model.set_instance_status(machine.clone(), status, message).await {
        tracing::warn!(%machine, error = %e, "cannot set instance status");
    }
}

/// One start's view of its dependencies ([`StartDeps`], through `Deref`), with the start's
/// status write still committing, if one is. The "starting" status is written while the start
/// goes on to the cloud (with a store, its commit and the cloud call's overlap: one commit fewer
/// that each start waits for), and every later write of the start awaits it first, as does
/// the start's end, so the model gets the machine's writes in the order they were made whatever
/// the model (a remote API may run two calls at once), and a start's outcome still follows its
/// writes.
struct Start<'d> {
    deps: &'d StartDeps,
    pending: RefCell<Option<(MachineId, ModelFuture<()>)>>,
    /// Frees the start's worker (with the records outside the workers): sent once.
    freed: RefCell<Option<futures::channel::oneshot::Sender<()>>>,
}

impl std::ops::Deref for Start<'_> {
    type Target = StartDeps;
    fn deref(&self) -> &StartDeps {
        self.deps
    }
}

impl Start<'_> {
    /// Sends an instance status write without waiting for it (after any write still pending).
    async fn send_instance_status(&self, machine: &MachineId, status: InstanceStatus, message: String) {
        self.settle().await;
        let write = self.deps.model.set_instance_status(machine.clone(), status, message);
        *self.pending.borrow_mut() = Some((machine.clone(), write));
    }

    /// Gives the start's worker back, if it is to be given back before the start ends.
    fn free_worker(&self) {
        if let Some(freed) = self.freed.borrow_mut().take() {
            let _ = freed.send(());
        }
    }

    /// Waits for the write still pending, if one is.
    async fn settle(&self) {
        let pending = self.pending.borrow_mut().take();
        if let Some((machine, write)) = pending {
            if let Err(e) = write.await {
                tracing::warn!(%machine, error = %e, "cannot set instance status");
            }
        }
    }
}

/// Writes a final provisioning error: instance status `provisioning error` and
/// machine status `error`, both with the cause (the error's text).
async fn fail(deps: &Start<'_>, machine: MachineId, error: WorkerError) -> JobOutcome {
    fail_retiring(deps, machine, error, None, None).await
}

/// [`fail`], retiring `retired` (a dead machine whose parked instance the start tried), and
/// naming the `zone` of the cloud call that failed last, if the start ended on one.
///
/// Boxed, as are the start's other rare paths ([`look_for_own`], [`adopt_own`]): a future
/// awaited in place makes every start's future as large as its largest path.
fn fail_retiring<'a>(
    deps: &'a Start<'_>,
    machine: MachineId,
    error: WorkerError,
    retired: Option<MachineId>,
    zone: Option<String>,
) -> LocalBoxFuture<'a, JobOutcome> {
    Box::pin(fail_retiring_now(deps, machine, error, retired, zone))
}

async fn fail_retiring_now(
    deps: &Start<'_>,
    machine: MachineId,
    error: WorkerError,
    retired: Option<MachineId>,
    zone: Option<String>,
) -> JobOutcome {
    tracing::warn!(%machine, %error, kind = ?error.kind(), "cannot start instance for machine");
    let _ = deps.release_machine.send(ReleaseMachine { machine: machine.clone() }).await;
    let message = error.to_string();
    set_instance_status(deps, &machine, InstanceStatus::provisioning_error(), message.clone()).await;
    if let Err(e) = deps.model.set_status(machine.clone(), MachineStatus::Error, message).await {
        tracing::warn!(%machine, error = %e, "cannot set machine status");
    }
    JobOutcome::StartFailed { machine, error, retired, orphan: None, given_up: None, zone }
}

/// Ends a start the lifecycle no longer wants ([`still_wanted`] said why).
async fn abandon(deps: &StartDeps, machine: MachineId) -> JobOutcome {
    let _ = deps.release_machine.send(ReleaseMachine { machine: machine.clone() }).await;
    JobOutcome::StartAbandoned { machine, given_up: None }
}

/// Records the instance in the model, retrying a few times; gives the instance up if that never
/// works: the machine's provisioning error is written first (so no restarted provisioner takes
/// the machine for pending and adopts the instance), then the outcome names the instance as the
/// orphan, which the coordinator has stopped like any other stop (retried until it succeeds).
async fn register(
    deps: &Start<'_>,
    machine: MachineId,
    instance: CloudInstance,
    nonce: &str,
    name: String,
    started: Started,
    rng: &mut SmallRng,
) -> JobOutcome {
    // Built for each write rather than built once and cloned for each (every write takes its
    // own): a retry is rare, a start's first write is not.
    let info = || ProvisionedInstance {
        instance: instance.id.clone(),
        zone: instance.zone.clone(),
        nonce: nonce.to_owned(),
        display_name: name.clone(),
        status: InstanceStatus::from_static(instance.state.as_str()),
        capacity_type: instance.capacity_type,
    };
    let mut attempt = 0;
    // Done with the cloud: what is left is the model's.
    deps.free_worker();
    deps.settle().await;
    let source = loop {
        match deps.model.set_instance_info(machine.clone(), info()).await {
            Ok(()) => {
                return JobOutcome::Started {
                    machine,
                    instance: Box::new(instance),
                    constraints: started.constraints.map(Box::new),
                    retired: started.retired,
                    reserved: started.reserved,
                    given_up: None,
                };
            }
            Err(e) => {
                tracing::warn!(%machine, instance = %instance.id, error = %e, "cannot record instance");
                attempt += 1;
                if attempt == REGISTER_ATTEMPTS {
                    break e;
                }
                actix_rt::time::sleep(deps.backoff.delay(attempt - 1, rng)).await;
            }
        }
    };
    let error = WorkerError::Record { instance: instance.id.clone(), source };
    match fail_retiring(deps, machine, error, started.retired, None).await {
        JobOutcome::StartFailed { machine, error, retired, given_up, zone, .. } => {
            JobOutcome::StartFailed { machine, error, retired, orphan: Some(instance.id), given_up, zone }
        }
        other => other,
    }
}

/// How the instance being registered came about.
#[derive(Default)]
struct Started {
    /// The constraints it was started with (`None` for an adopted instance).
    constraints: Option<crate::model::Constraints>,
    /// The dead machine whose parked instance was taken over or given up.
    retired: Option<MachineId>,
    /// The allocator reserved its zone.
    reserved: bool,
}

/// Runs one start to its end. Never panics; every failure becomes the outcome.
///
/// `seed` seeds the jitter of its backoffs, so a run is reproducible.
///
/// `batch` is the pool's own address when starts are batched: the cloud call joins a batch.
pub(super) async fn run_start(
    deps: std::sync::Arc<StartDeps>,
    job: StartJob,
    nonce: String,
    seed: u64,
    batch: Option<Recipient<JoinBatch>>,
    freed: Option<futures::channel::oneshot::Sender<()>>,
) -> JobOutcome {
    let start = &Start { deps: &deps, pending: RefCell::new(None), freed: RefCell::new(freed) };
    let mut given_up = None;
    let outcome = start_or_adopt(start, job, nonce, seed, batch, &mut given_up).await;
    start.settle().await;
    outcome.with_given_up(given_up)
}

/// [`run_start`]'s body; a parked instance it gives up (machine reuse) is left in `given_up`
/// for the coordinator to stop, then remove its dead machine, however the start ends (no stop is
/// fire-and-forget).
async fn start_or_adopt(
    deps: &Start<'_>,
    job: StartJob,
    nonce: String,
    seed: u64,
    batch: Option<Recipient<JoinBatch>>,
    given_up: &mut Option<super::state::GivenUp>,
) -> JobOutcome {
    let rng = &mut SmallRng::seed_from_u64(seed);
    let machine = job.machine.id.clone();
    if !still_wanted(deps, &machine).await {
        return abandon(deps, machine).await;
    }

    // A start whose result was lost (a crash) left a tagged instance: adopt it.
    if let Some(instance) = job.adopt.as_deref().cloned() {
        tracing::info!(%machine, instance = %instance.id, "adopting existing instance tagged for this machine");
        let start_nonce = instance.tags.start.clone().unwrap_or_else(|| nonce.clone());
        return register(deps, machine, instance, &start_nonce, String::new(), Started::default(), rng).await;
    }

    // A spot hand-over's replacement says whom it replaces (`machine show` during the hand-over).
    let starting = match &job.replaces {
        Some(interrupted) => format!("replacing instance {interrupted}: the cloud warned it takes it away"),
        None => "starting".into(),
    };
    deps.send_instance_status(&machine, InstanceStatus::provisioning(), starting).await;

    // The first call's parameters, built now for the zones' derivation: kept in a block of
    // their own, so that the start's future holds them once (`spare`), not in every state.
    let derived;
    let mut retired = None;
    let mut spare;
    {
        let params = job.call_params(&deps.model_uuid, &nonce);
        derived = if deps.broker.supports_zones() {
            let mut throttled = 0;
            loop {
                match deps.broker.derive_availability_zones(&params).await {
                    Ok(z) => break z,
                    // Throttling is never the machine's failure (no round used, no zone marked): wait
                    // and ask again.
                    Err(BrokerError::Throttled { .. }) => {
                        let d = deps.backoff.delay(throttled, rng);
                        throttled += 1;
                        tracing::debug!(%machine, retry_in = ?d, "deriving zones throttled by the cloud; waiting");
                        actix_rt::time::sleep(d).await;
                        if !still_wanted(deps, &machine).await {
                            return abandon(deps, machine).await;
                        }
                    }
                    Err(e) => return fail(deps, machine, WorkerError::DeriveZones(e)).await,
                }
            }
        } else {
            Vec::new()
        };
        // Machine reuse (opt-in): take over a parked instance that fits (on-demand machines
        // only: a parked instance's capacity type is not known).
        if let Some(claim) = deps.claim.as_ref().filter(|_| job.info.capacity.is_default()) {
            let ask = crate::actors::harvest::ClaimReusable {
                constraints: job.info.constraints.clone(),
                derived: derived.clone(),
            };
            if let Ok(Some((old, parked))) = claim.send(ask).await {
                retired = Some(old.clone());
                // Only a running instance is handed over: one stopped or gone since it was parked
                // is given up (stopped) and the machine starts afresh.
                let ask = crate::actors::registry::InstanceStateOf {
                    id: parked.instance.clone(),
                    fresher_than: deps.listing_max_age,
                };
                let handed = match deps.state_of.send(ask).await {
                    Ok(Some(crate::model::InstanceState::Running)) => deps
                        .broker
                        .retag_instance(parked.instance.clone(), params.tags.clone())
                        .await
                        .map_err(WorkerError::Retag),
                    Ok(_) => Err(WorkerError::NotRunning(parked.instance.clone())),
                    Err(source) => Err(WorkerError::Stopped { actor: "registry", source }),
                };
                match handed {
                    Ok(()) => {
                        tracing::info!(%machine, instance = %parked.instance, from = %old, "reusing the instance of a dead machine");
                        let instance = CloudInstance {
                            id: parked.instance,
                            state: crate::model::InstanceState::Running,
                            zone: parked.zone,
                            tags: params.tags.clone(),
                            age: None,
                            instance_type: None,
                            capacity_type: None,
                            image: None,
                        };
                        let started =
                            Started { constraints: Some(job.info.constraints.clone()), retired, reserved: false };
                        return register(deps, machine, instance, &nonce, String::new(), started, rng).await;
                    }
                    Err(e) => {
                        tracing::warn!(%machine, instance = %parked.instance, error = %e, "cannot hand the parked instance over; stopping it and starting anew");
                        *given_up = Some(super::state::GivenUp { instance: parked.instance.clone(), retired: old });
                    }
                }
            }
        }
        spare = Some(params);
    }

    let request = job.zone_request(derived);

    let mut attempts = Attempts::new(deps.retry.count);
    let mut capacity = CapacityPlan::new(job.info.capacity);
    let mut call = 0u32;
    // Tokens found spent (they answer an instance terminated since): each skipped for the next.
    let mut spent = 0u32;
    // The zone and client token (its call number) of a call whose failure was ambiguous (it
    // may have made the instance): the next call repeats it exactly, so the cloud returns what
    // it made.
    let mut repeat: Option<(Option<String>, u32)> = None;
    // Some call of this start failed ambiguously: before a call with a new token, look for an
    // instance tagged for this start.
    let mut unsure = false;
    // Constraints are only remembered where reuse may need them.
    let own = deps.claim.is_some().then(|| job.info.constraints.clone());
    loop {
        let repeating = repeat.is_some();
        let (zone, token) = if let Some(again) = repeat.take() {
            again
        } else {
            if unsure {
                match look_for_own(deps, &machine, &nonce, rng).await {
                    Ok(Some(found)) => {
                        return adopt_own(deps, machine, found, &nonce, (own.clone(), retired), rng).await
                    }
                    // Nothing was made: a new token is safe.
                    Ok(None) => unsure = false,
                    Err(e) => return fail_retiring(deps, machine, e, retired, None).await,
                }
            }
            let ask = ChooseZone { machine: machine.clone(), request: capacity.request(&request) };
            let zone = match deps.choose.send(ask).await {
                Ok(Ok(zone)) => zone,
                Ok(Err(e)) => return fail(deps, machine, WorkerError::NoZone(e)).await,
                Err(source) => {
                    return fail(deps, machine, WorkerError::Stopped { actor: "zone allocator", source }).await
                }
            };
            call += 1;
            (zone, call - 1)
        };
        // The first call takes the parameters built above; a later one builds them again, the
        // same (they follow from the job), rather than every call taking a copy. The call's
        // future is made in a block: the parameters it took are not held across its await.
        let call = {
            let mut params = spare.take().unwrap_or_else(|| job.call_params(&deps.model_uuid, &nonce));
            params.client_token = client_token(&machine, &nonce, token);
            params.zone = zone.clone();
            params.capacity = capacity.capacity();
            params.spot_max_price = deps.spot_max_price.filter(|_| !params.capacity.is_on_demand());
            match &batch {
                Some(join) => Either::Left(Box::pin(call_in_batch(join.clone(), params))),
                None => Either::Right(deps.broker.start_instance(params).map(|result| {
                    let ambiguous = result.as_ref().err().is_some_and(BrokerError::is_ambiguous);
                    (result, ambiguous)
                })),
            }
        };
        let (result, maybe_made) = call.await;
        let err = match result {
            // The token made an instance before (a start repeated after a crash) that is gone
            // since: it answers that instance again. A new token makes a new one, at once and
            // using no round (a few times at most: then a failure as any other).
            Ok(started) if started.instance.state == InstanceState::Terminated && spent < SPENT_TOKENS => {
                spent += 1;
                tracing::info!(%machine, instance = %started.instance.id, "the start's client token answers an instance terminated since: starting with a new token");
                continue;
            }
            Ok(started) if started.instance.state == InstanceState::Terminated => BrokerError::zone_independent(
                format!("the start's client tokens answer instance {}, terminated since", started.instance.id),
            ),
            Ok(started) => {
                tracing::info!(%machine, instance = %started.instance.id, zone = ?zone, "started instance");
                let how = Started { constraints: own, retired, reserved: true };
                return register(deps, machine, started.instance, &nonce, started.display_name, how, rng).await;
            }
            Err(e) => e,
        };
        let ambiguous = maybe_made;
        unsure |= ambiguous;
        let spot = capacity.on_failure(&err, zone.as_deref());
        let mut step = match spot {
            CapacityStep::Usual => attempts.on_failure(FailureKind::of(&err, zone.as_deref())),
            CapacityStep::MarkZone => Step::MarkZone,
            CapacityStep::OnDemand => Step::OnDemand,
        };
        // A batched call was replayed by the pool already (same token, same machines) while
        // this start waited: it is never repeated from here, the start looks first instead. A
        // zone that did not answer is never repeated either: it is marked failed below, and the
        // start (unsure) looks before its next call, in another zone.
        let in_place = ambiguous && repeats_in_place(&err, zone.as_deref());
        if batch.is_none() && (in_place || (repeating && step == Step::Backoff)) {
            // The call may have made the instance: the next one repeats it (same zone, same
            // token, same parameters), keeping the zone's reservation.
            repeat = Some((zone.clone(), token));
        } else if step == Step::MarkZone {
            let zone = zone.clone().unwrap_or_default();
            let shape = capacity.request(&request).shape;
            match deps.mark_failed.send(MarkZoneFailed { machine: machine.clone(), zone, shape }).await {
                Ok(outcome) if spot == CapacityStep::MarkZone => {
                    step = capacity.on_zone_outcome(outcome, &mut attempts)
                }
                Ok(outcome) => step = attempts.on_zone_outcome(outcome),
                Err(source) => {
                    return fail(deps, machine, WorkerError::Stopped { actor: "zone allocator", source }).await
                }
            }
        } else {
            let _ = deps.release_reservation.send(ReleaseReservation { machine: machine.clone() }).await;
        }
        let delay = match step {
            Step::Final if unsure => {
                // Out of rounds, but an earlier call may have made the instance: look first.
                match look_for_own(deps, &machine, &nonce, rng).await {
                    Ok(Some(found)) => {
                        return adopt_own(deps, machine, found, &nonce, (own.clone(), retired), rng).await
                    }
                    Ok(None) => return fail_retiring(deps, machine, capacity.final_error(err), retired, zone).await,
                    Err(e) => return fail_retiring(deps, machine, e, retired, zone).await,
                }
            }
            Step::Final => return fail_retiring(deps, machine, capacity.final_error(err), retired, zone).await,
            // The start goes on at once: on-demand after every zone refused spot, or in another
            // zone.
            Step::OnDemand | Step::FailOver => {
                let why = err.message();
                let msg = if step == Step::OnDemand {
                    capacity.fall_back();
                    format!("no spot capacity for machine {machine} in any allowed zone ({why}); starting it on-demand")
                } else {
                    let z = zone.as_deref().unwrap_or_default();
                    format!(
                        "failed to start machine {machine} in zone {z:?}, retrying with new availability zone: {why}"
                    )
                };
                tracing::info!(%machine, "{msg}");
                set_instance_status(deps, &machine, InstanceStatus::provisioning(), msg).await;
                Duration::ZERO
            }
            Step::NewRound => {
                let d = deps.retry.delay_before(attempts.rounds_used().saturating_sub(1), rng);
                let msg = format!(
                    "failed to start machine {machine} ({}), retrying in {d:?} ({} more attempts)",
                    err.message(),
                    attempts.rounds_left()
                );
                tracing::info!(%machine, "{msg}");
                set_instance_status(deps, &machine, InstanceStatus::provisioning(), msg).await;
                d
            }
            Step::Backoff => {
                let d = deps.backoff.delay(attempts.throttled().saturating_sub(1), rng);
                tracing::debug!(%machine, retry_in = ?d, "start throttled by the cloud; waiting");
                d
            }
            Step::MarkZone => return fail(deps, machine, WorkerError::Unresolved).await,
        };
        if !delay.is_zero() {
            actix_rt::time::sleep(delay).await;
        }
        if !still_wanted(deps, &machine).await {
            if unsure {
                // The machine died meanwhile, but an earlier call may have made its instance:
                // hand it on as the start's product, so that it is harvested with the machine.
                if let Ok(Some(found)) = look_for_own(deps, &machine, &nonce, rng).await {
                    return adopt_own(deps, machine, found, &nonce, (own.clone(), retired), rng).await;
                }
            }
            return abandon(deps, machine).await;
        }
    }
}

/// Makes the start's cloud call as a member of a batch: the answer for this machine, and
/// whether the call may have made its instance although it failed.
async fn call_in_batch(
    join: Recipient<JoinBatch>,
    params: StartInstanceParams,
) -> (Result<crate::ports::StartedInstance, BrokerError>, bool) {
    match join.send(JoinBatch(params)).await {
        Ok(reply) => (reply.result, reply.maybe_made),
        // The pool is gone (the provisioner stopping): the call may have gone out.
        Err(e) => (Err(BrokerError::transient(format!("worker pool unavailable: {e}"))), true),
    }
}

/// How many times the lookup for an instance tagged for this start is made before the start
/// gives up (each failure backs off).
const LOOKUP_ATTEMPTS: u32 = 5;

/// Looks for a live instance tagged for this start (machine and nonce), retrying a failed or
/// throttled lookup with backoff. `Err` is the last lookup's failure.
fn look_for_own<'a>(
    deps: &'a StartDeps,
    machine: &'a MachineId,
    nonce: &'a str,
    rng: &'a mut SmallRng,
) -> LocalBoxFuture<'a, Result<Option<CloudInstance>, WorkerError>> {
    Box::pin(look_for_own_now(deps, machine, nonce, rng))
}

async fn look_for_own_now(
    deps: &StartDeps,
    machine: &MachineId,
    nonce: &str,
    rng: &mut SmallRng,
) -> Result<Option<CloudInstance>, WorkerError> {
    let mut attempt = 0;
    loop {
        match deps.broker.instances_of_start(machine.clone(), nonce.to_owned()).await {
            Ok(found) => return Ok(found.into_iter().next()),
            Err(e) => {
                tracing::warn!(%machine, error = %e, "cannot look for an instance of this start");
                attempt += 1;
                if attempt == LOOKUP_ATTEMPTS {
                    return Err(WorkerError::Lookup(e));
                }
                actix_rt::time::sleep(deps.backoff.delay(attempt - 1, rng)).await;
            }
        }
    }
}

/// Takes the instance an ambiguous call made (found by its tags) as the start's product.
fn adopt_own<'a>(
    deps: &'a Start<'_>,
    machine: MachineId,
    instance: CloudInstance,
    nonce: &'a str,
    (constraints, retired): (Option<crate::model::Constraints>, Option<MachineId>),
    rng: &'a mut SmallRng,
) -> LocalBoxFuture<'a, JobOutcome> {
    tracing::info!(%machine, instance = %instance.id, "a start that failed ambiguously made this instance; keeping it");
    // Counted in its zone by the coordinator (the reservation may have been let go meanwhile).
    let how = Started { constraints, retired, reserved: false };
    Box::pin(register(deps, machine, instance, nonce, String::new(), how, rng))
}
