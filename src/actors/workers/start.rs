//! The start procedure's shell: carries out, one at a time, what a start's plain run
//! ([`StartRun`], `run.rs`: adopt or start, retry, fail over, register) asks of the ports and
//! the actors it consults, and feeds it the answers. The decisions are the run's; this file
//! holds the start's dependencies ([`StartDeps`]), its view of them while its "starting" status
//! write commits ([`Start`]), and how a cloud call joins a batch.

use std::cell::RefCell;
use std::sync::Arc;

use actix::Recipient;
use tracing::field::Empty;
use tracing::{Instrument, Span};

use super::messages::JoinBatch;
use super::run::{StartAnswer, StartAsk, StartRun, StartSettings};
use super::state::{JobOutcome, StartJob};
use crate::actors::harvest::ClaimReusable;
use crate::actors::lifecycle::StillWanted;
use crate::actors::registry::InstanceStateOf;
use crate::actors::zones::{ChooseZone, MarkZoneFailed, ReleaseMachine, ReleaseReservation};
use crate::config::{Backoff, RetryStrategy};
use crate::model::{InstanceStatus, MachineId, MachineStatus};
use crate::ports::{Broker, BrokerError, ModelApi, ModelFuture, StartInstanceParams};
use crate::trace::TRACE_TARGET;

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
    /// The registry: the stop of an instance a start made and could not record is decided.
    pub stops_planned: Recipient<crate::actors::registry::StopsPlanned>,
    /// How old a listing may be to decide on it.
    pub listing_max_age: std::time::Duration,
    /// Start retries.
    pub retry: RetryStrategy,
    /// The most a spot call pays (`ProvisionerConfig::spot_max_price`), handed to the broker
    /// with every spot call.
    pub spot_max_price: Option<crate::model::UsdPerHour>,
    /// Backoff for throttling and failed stops.
    pub backoff: Backoff,
    /// Our model's uuid, tagged on every instance (shared with every start's settings).
    pub model_uuid: Arc<str>,
    /// The first half of every nonce.
    pub host_tag: String,
    /// Batched starts (`None`: one call per machine).
    pub batch: Option<BatchDeps>,
    /// A start gives its worker back once it is done with the cloud, and records its instance
    /// in the model outside the pool's size (see `ProvisionerConfig::record_outside_worker`).
    pub record_outside_worker: bool,
    /// Code broken on purpose (the model checker's tests and replays, issue 35).
    pub mutations: crate::config::Mutations,
}

impl StartDeps {
    /// What a start reads of them besides its ports and actors (`batched`: its cloud call joins
    /// a batch).
    fn settings(&self, batched: bool) -> StartSettings {
        StartSettings {
            retry: self.retry,
            backoff: self.backoff,
            supports_zones: self.broker.supports_zones(),
            claim: self.claim.is_some(),
            batched,
            spot_max_price: self.spot_max_price,
            model_uuid: Arc::clone(&self.model_uuid),
            mutations: self.mutations,
        }
    }
}

/// Writes an instance status once the write still pending has committed, and waits for it (a
/// failure is logged: the start goes on).
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
    let outcome = start_or_adopt(start, job, nonce, seed, batch).await;
    start.settle().await;
    outcome
}

/// [`run_start`]'s body: asks what the start's run asks, one question at a time, in its order,
/// and feeds it the answers, until it ends. A parked instance it gives up (machine reuse) is
/// named in its outcome for the coordinator to stop, then remove its dead machine, however the
/// start ends (no stop is fire-and-forget).
async fn start_or_adopt(
    deps: &Start<'_>,
    job: StartJob,
    nonce: String,
    seed: u64,
    batch: Option<Recipient<JoinBatch>>,
) -> JobOutcome {
    let machine = job.machine.id.clone();
    let (mut run, mut ask) = StartRun::new(job, nonce, deps.settings(batch.is_some()), seed);
    loop {
        let answer = match ask {
            StartAsk::Finish(outcome) => return outcome,
            StartAsk::StillWanted => {
                StartAnswer::Wanted(deps.still_wanted.send(StillWanted { machine: machine.clone() }).await)
            }
            StartAsk::SendInstanceStatus { status, message } => {
                deps.send_instance_status(&machine, status, message).await;
                StartAnswer::Done
            }
            StartAsk::SetInstanceStatus { status, message } => {
                set_instance_status(deps, &machine, status, message).await;
                StartAnswer::Done
            }
            StartAsk::SetMachineError(message) => {
                if let Err(e) = deps.model.set_status(machine.clone(), MachineStatus::Error, message).await {
                    tracing::warn!(%machine, error = %e, "cannot set machine status");
                }
                StartAnswer::Done
            }
            // The run asks only while it holds them (an answer without them derives nothing).
            StartAsk::DeriveZones => match run.first_call_params() {
                Some(params) => {
                    let span = call_span("derive_availability_zones", None);
                    StartAnswer::Zones(traced_call(deps.broker.derive_availability_zones(params), span).await)
                }
                None => StartAnswer::Zones(Ok(Vec::new())),
            },
            StartAsk::Sleep(delay) => {
                let span = tracing::info_span!(target: TRACE_TARGET, "retry wait", wait_ms = delay.as_millis() as u64);
                actix_rt::time::sleep(delay).instrument(span).await;
                StartAnswer::Done
            }
            StartAsk::ClaimReusable { constraints, derived } => match &deps.claim {
                Some(claim) => StartAnswer::Claimed(claim.send(ClaimReusable { constraints, derived }).await),
                None => StartAnswer::Claimed(Ok(None)),
            },
            StartAsk::InstanceStateOf(id) => {
                let ask = InstanceStateOf { id, fresher_than: deps.listing_max_age };
                StartAnswer::StateOf(deps.state_of.send(ask).await)
            }
            StartAsk::Retag { instance, tags } => {
                let span = call_span("retag_instance", None);
                span.record("instance", instance.as_str());
                StartAnswer::Retagged(traced_call(deps.broker.retag_instance(instance, tags), span).await)
            }
            StartAsk::ChooseZone(request) => {
                let span = tracing::info_span!(target: TRACE_TARGET, "zone decision", zone = Empty, outcome = Empty);
                let chosen =
                    deps.choose.send(ChooseZone { machine: machine.clone(), request }).instrument(span.clone()).await;
                match &chosen {
                    Ok(Ok(Some(zone))) => span.record("zone", zone.as_str()),
                    Ok(Ok(None)) => span.record("outcome", "no zones"),
                    Ok(Err(e)) => span.record("outcome", tracing::field::display(e)),
                    Err(_) => span.record("outcome", "allocator unavailable"),
                };
                StartAnswer::Zone(chosen)
            }
            StartAsk::Call(params) => {
                let span = call_span("start_instance", params.zone.as_deref());
                // Boxed: a batched call is rare, and a future awaited in place makes every
                // start's future as large as its largest path.
                let (result, maybe_made) = match &batch {
                    Some(join) => Box::pin(call_in_batch(join.clone(), *params, &span)).instrument(span.clone()).await,
                    None => {
                        let result = deps.broker.start_instance(*params).instrument(span.clone()).await;
                        let ambiguous = result.as_ref().err().is_some_and(BrokerError::is_ambiguous);
                        (result, ambiguous)
                    }
                };
                if let Ok(started) = &result {
                    span.record("instance", started.instance.id.as_str());
                }
                record_call(&span, result.as_ref().err());
                StartAnswer::Called { result, maybe_made }
            }
            StartAsk::MarkZoneFailed { zone, shape } => {
                let ask = MarkZoneFailed { machine: machine.clone(), zone, shape };
                StartAnswer::Marked(deps.mark_failed.send(ask).await)
            }
            StartAsk::ReleaseReservation => {
                let _ = deps.release_reservation.send(ReleaseReservation { machine: machine.clone() }).await;
                StartAnswer::Done
            }
            StartAsk::ReleaseMachine => {
                let _ = deps.release_machine.send(ReleaseMachine { machine: machine.clone() }).await;
                StartAnswer::Done
            }
            StartAsk::OrphanStopping(instance) => {
                let planned =
                    crate::actors::registry::StopsPlanned { ids: vec![instance], machine: Some(machine.clone()) };
                deps.stops_planned.do_send(planned);
                StartAnswer::Done
            }
            StartAsk::LookForOwn(nonce) => {
                let span = call_span("instances_of_start", None);
                StartAnswer::Found(traced_call(deps.broker.instances_of_start(machine.clone(), nonce), span).await)
            }
            StartAsk::FreeWorker => {
                deps.free_worker();
                StartAnswer::Done
            }
            StartAsk::Record(info) => {
                // The record follows the start's status writes.
                deps.settle().await;
                let span = tracing::info_span!(target: TRACE_TARGET, "record instance", instance = %info.instance, error = Empty);
                let recorded =
                    async { deps.model.set_instance_info(machine.clone(), info).await }.instrument(span.clone()).await;
                if let Err(e) = &recorded {
                    span.record("error", tracing::field::display(e));
                }
                StartAnswer::Recorded(recorded)
            }
        };
        ask = run.answer(answer);
    }
}

/// Makes the start's cloud call as a member of a batch: the answer for this machine, and
/// whether the call may have made its instance although it failed.
async fn call_in_batch(
    join: Recipient<JoinBatch>,
    params: StartInstanceParams,
    span: &Span,
) -> (Result<crate::ports::StartedInstance, BrokerError>, bool) {
    match join.send(JoinBatch(params)).await {
        Ok(reply) => {
            if !span.is_disabled() {
                let with: Vec<&str> = reply.with.iter().map(|m| m.as_str()).collect();
                span.record("batch.with", with.join(","));
            }
            (reply.result, reply.maybe_made)
        }
        // The pool is gone (the provisioner stopping): the call may have gone out.
        Err(e) => (Err(BrokerError::transient(format!("worker pool unavailable: {e}"))), true),
    }
}

/// A start's span in its machine's trace (issue 37): a child of `picked` (the coordinator's
/// pick, itself a child of the request that added the machine), or a root. Its outcome is
/// recorded when the start ends ([`record_start_outcome`]).
pub(super) fn start_span(picked: &Span, machine: &MachineId, nonce: &str) -> Span {
    tracing::info_span!(target: TRACE_TARGET, parent: picked, "start", machine = %machine, nonce, outcome = Empty, instance = Empty)
}

/// Records how a start ended on its span.
pub(super) fn record_start_outcome(span: &Span, outcome: &JobOutcome) {
    if span.is_disabled() {
        return;
    }
    match outcome {
        JobOutcome::Started { instance, .. } => {
            span.record("outcome", "started");
            span.record("instance", instance.id.as_str())
        }
        JobOutcome::StartFailed { error, .. } => span.record("outcome", tracing::field::display(error)),
        JobOutcome::StartAbandoned { .. } => span.record("outcome", "abandoned"),
        JobOutcome::Stopped { .. } | JobOutcome::Released { .. } => span.record("outcome", "done"),
    };
}

/// A cloud call's span (issue 37): the call, its zone, and once answered its outcome.
fn call_span(operation: &'static str, zone: Option<&str>) -> Span {
    tracing::info_span!(
        target: TRACE_TARGET,
        "cloud call",
        cloud.operation = operation,
        zone,
        outcome = Empty,
        error.kind = Empty,
        error = Empty,
        instance = Empty,
        batch.with = Empty,
    )
}

/// A stop's or a release's span: its instances and machines (a root: a machine's stop is not
/// part of the trace of its start).
pub(super) fn cloud_span(
    name: &'static str,
    operation: &'static str,
    instances: &[crate::model::InstanceId],
    machines: &[MachineId],
) -> Span {
    tracing::info_span!(
        target: TRACE_TARGET,
        parent: None,
        "cloud call",
        otel.name = name,
        cloud.operation = operation,
        instances = ?instances,
        machines = ?machines,
        outcome = Empty,
        error.kind = Empty,
        error = Empty,
    )
}

/// `call` in `span`, its outcome (and error) recorded on it.
pub(super) async fn traced_call<T>(
    call: impl std::future::Future<Output = Result<T, BrokerError>>,
    span: Span,
) -> Result<T, BrokerError> {
    let result = call.instrument(span.clone()).await;
    record_call(&span, result.as_ref().err());
    result
}

/// Records a cloud call's outcome and error on its span ([`record_outcome`]).
fn record_call(span: &Span, error: Option<&BrokerError>) {
    if let Some(e) = error {
        span.record("error", tracing::field::display(e));
    }
    record_outcome(span, error);
}

/// Records a cloud call's outcome on its span: `ok`, or what the provisioner does about the
/// failure: `throttled` (waits and calls again), `failed over` (another zone), `ambiguous`
/// (may have taken effect: retried with the same client token, or looked for), `ambiguous,
/// failed over` (a zone that did not answer), `failed`.
fn record_outcome(span: &Span, error: Option<&BrokerError>) {
    if span.is_disabled() {
        return;
    }
    let outcome = match error {
        None => "ok",
        Some(BrokerError::Throttled { .. }) => "throttled",
        Some(BrokerError::ZoneSpecific { .. }) => "failed over",
        Some(BrokerError::Transient { .. }) => "ambiguous",
        Some(BrokerError::ZoneUnreachable { .. }) => "ambiguous, failed over",
        Some(BrokerError::ZoneIndependent { .. } | BrokerError::NotSupported(_)) => "failed",
    };
    span.record("outcome", outcome);
    if let Some(e) = error {
        span.record("error.kind", e.kind());
    }
}
