//! The worker pool actor: a thin shell over [`PoolBook`] that runs jobs as futures on its own
//! context (no extra threads or arbiters, so a paused test clock governs every wait).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use actix::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tracing::Instrument;

use super::batch::{Answer, BatchBook, Reply};
use super::messages::*;
use super::start::{run_start, StartDeps};
use super::state::{Job, JobOutcome, PoolBook, PoolStatus, ReleaseJob, StartSlot, StopJob, WorkerError};
use crate::actors::coordinator::JobsDone;
use crate::actors::work::{BusyState, WorkCount};
use crate::config::rate_limits::ApiClass;
use crate::config::{validate_workers, ConfigError};
use crate::ports::{BatchStartParams, BrokerError};

/// Runs broker jobs.
pub struct WorkerPool {
    book: PoolBook,
    max: usize,
    deps: Arc<StartDeps>,
    done: Recipient<JobsDone>,
    /// Outcomes of jobs ended in this turn of the context, sent as one [`JobsDone`] when the
    /// turn's last item has run (held as work in flight meanwhile).
    ended: Vec<JobOutcome>,
    rng: StdRng,
    /// Work outside the book: failed jobs waiting out their backoff before being queued again,
    /// and the outcomes waiting to be reported; one guard each.
    requeues: WorkCount,
    /// The book's jobs (queued or in flight), in the provisioner's total.
    jobs: BusyState,
    /// Batched starts: the open batches and the intents in flight (their members are starts
    /// in flight, counted as jobs).
    batches: BatchBook<futures::channel::oneshot::Sender<Reply>>,
}

impl WorkerPool {
    /// A pool of `size` workers (valid `1..=max`), reporting to `done`.
    pub fn new(size: usize, max: usize, deps: StartDeps, done: Recipient<JobsDone>, seed: u64) -> Self {
        let requeues = WorkCount::new();
        let batch_size = deps.batch.as_ref().map_or(1, |b| b.size);
        Self {
            batches: BatchBook::new(batch_size).with_mutations(deps.mutations),
            book: PoolBook::new(size).with_batches(batch_size),
            max,
            deps: Arc::new(deps),
            done,
            ended: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
            jobs: BusyState::new(&requeues),
            requeues,
        }
    }

    /// The same pool counting its work in `work`'s total (its provisioner's).
    pub fn with_work(mut self, work: WorkCount) -> Self {
        self.jobs = BusyState::new(&work);
        self.requeues = work;
        self
    }

    /// A start's nonce, `HOST_TAG:UUID` (built by hand, not `format!`: one per start).
    fn nonce(&mut self) -> String {
        let id = uuid::Builder::from_random_bytes(self.rng.random()).into_uuid();
        let mut buf = uuid::Uuid::encode_buffer();
        let id = id.hyphenated().encode_lower(&mut buf);
        let mut nonce = String::with_capacity(self.deps.host_tag.len() + 1 + id.len());
        nonce.push_str(&self.deps.host_tag);
        nonce.push(':');
        nonce.push_str(id);
        nonce
    }

    fn dispatch(&mut self, ctx: &mut Context<Self>) {
        while let Some(job) = self.book.take_next() {
            match job {
                Job::Start(start) => {
                    let nonce = match &start.replaces {
                        Some(replaces) => crate::model::InstanceTags::replacement_nonce(&self.deps.host_tag, replaces),
                        None => self.nonce(),
                    };
                    // One span per machine operation: every line the start logs carries it.
                    let span = tracing::info_span!("start", machine = %start.machine.id);
                    // And the start in its machine's trace (issue 37): a child of the span it was
                    // picked under (which stays open while the start runs).
                    let traced = super::start::start_span(&start.trace.0, &start.machine.id, &nonce);
                    let batch = self.deps.batch.as_ref().map(|_| ctx.address().recipient());
                    // Boxed before it is wrapped: the start's future is large (several KiB), and
                    // every wrapper would move it whole; a box moves as a pointer.
                    let (freed, slot) = self.slot(ctx);
                    let start = Box::pin(run_start(self.deps.clone(), *start, nonce, self.rng.random(), batch, freed));
                    let ended = traced.clone();
                    let fut = start.instrument(traced).instrument(span);
                    ctx.spawn(fut.into_actor(self).map(move |outcome, act, ctx| {
                        super::start::record_start_outcome(&ended, &outcome);
                        act.book.start_ended(slot.as_deref());
                        act.report(outcome, ctx);
                        act.dispatch(ctx);
                    }));
                }
                Job::Stop(stop) => {
                    let span = tracing::info_span!("stop", instances = ?stop.instances, machines = ?stop.machines);
                    let traced = super::start::cloud_span("stop", "stop_instances", &stop.instances, &stop.machines);
                    let call =
                        super::start::traced_call(self.deps.broker.stop_instances(stop.instances.clone()), traced)
                            .instrument(span);
                    let done =
                        JobOutcome::Stopped { instances: stop.instances.clone(), machines: stop.machines.clone() };
                    self.spawn_cloud_job(call, done, ctx, move |source| {
                        let (failed, instances) = (stop.attempt, stop.instances.clone());
                        let again = Job::Stop(StopJob { attempt: failed + 1, ..stop });
                        (again, failed, WorkerError::Stop { instances, source })
                    });
                }
                Job::Release(release) => {
                    let traced =
                        super::start::cloud_span("release", "release_instances", &release.instances, &release.machines);
                    let call = super::start::traced_call(
                        self.deps.broker.release_instances(release.instances.clone()),
                        traced,
                    );
                    let done = JobOutcome::Released {
                        instances: release.instances.clone(),
                        machines: release.machines.clone(),
                    };
                    self.spawn_cloud_job(call, done, ctx, move |source| {
                        let (failed, instances) = (release.attempt, release.instances.clone());
                        let again = Job::Release(ReleaseJob { attempt: failed + 1, ..release });
                        (again, failed, WorkerError::Release { instances, source })
                    });
                }
            }
        }
        // Queued and running jobs are work in flight until the book is empty.
        self.jobs.set(self.book.in_flight() + self.book.recording() + self.book.queued() > 0);
    }

    /// With the records outside the workers ([`StartDeps::record_outside_worker`]): the sender a
    /// start frees its worker with once it is done with the cloud, and the start's slot state
    /// (the job's end and the freeing may come in either order).
    fn slot(
        &mut self,
        ctx: &mut Context<Self>,
    ) -> (Option<futures::channel::oneshot::Sender<()>>, Option<Rc<Cell<StartSlot>>>) {
        if !self.deps.record_outside_worker {
            return (None, None);
        }
        let slot = Rc::new(Cell::new(StartSlot::Held));
        let (freed, on_freed) = futures::channel::oneshot::channel::<()>();
        let mine = slot.clone();
        ctx.spawn(on_freed.into_actor(self).map(move |freed, act, ctx| {
            if freed.is_ok() && act.book.release_start(&mine) {
                act.dispatch(ctx);
            }
        }));
        (Some(freed), Some(slot))
    }

    /// Runs a stop or a release: reports `done` when the call succeeds; otherwise the job gives
    /// its slot back and is queued again after a backoff, as `retry` rebuilds it (with the tries
    /// failed so far, and the error to log).
    fn spawn_cloud_job(
        &mut self,
        call: impl std::future::Future<Output = Result<(), BrokerError>> + 'static,
        done: JobOutcome,
        ctx: &mut Context<Self>,
        retry: impl FnOnce(BrokerError) -> (Job, u32, WorkerError) + 'static,
    ) {
        ctx.spawn(call.into_actor(self).map(move |res, act, ctx| {
            act.book.finished();
            match res {
                Ok(()) => act.report(done, ctx),
                Err(source) => {
                    let (again, failed, error) = retry(source);
                    let delay = act.deps.backoff.delay(failed, &mut act.rng);
                    tracing::warn!(%error, retry_in = ?delay, "will retry");
                    act.requeue_later(again, delay, ctx);
                }
            }
            act.dispatch(ctx);
        }));
    }

    /// Reports a job's outcome to the coordinator, with the others that end in this turn of
    /// the context: the first one of a turn spawns the item that sends them all, which the
    /// context runs after the items already there (the jobs' futures that end with it).
    fn report(&mut self, outcome: JobOutcome, ctx: &mut Context<Self>) {
        if self.ended.is_empty() {
            let reporting = self.requeues.guard();
            ctx.spawn(fut::ready(()).map(move |(), act: &mut Self, _ctx| {
                // The next turn's buffer starts as large as this one's (outcomes are large:
                // growing a buffer of them one doubling at a time copies them again and again).
                let size = act.ended.len();
                act.done.do_send(JobsDone(std::mem::replace(&mut act.ended, Vec::with_capacity(size))));
                drop(reporting);
            }));
        }
        self.ended.push(outcome);
    }

    fn requeue_later(&mut self, job: Job, delay: std::time::Duration, ctx: &mut Context<Self>) {
        let waiting = self.requeues.guard();
        ctx.run_later(delay, move |act, ctx| {
            act.enqueue(job, ctx);
            drop(waiting);
        });
    }

    /// Waits for the start token of `batch`, then makes its call: the first time, closing it
    /// (it takes no more members, its intent is recorded); later, replaying that intent.
    fn await_token(&mut self, batch: u64, replay: bool, ctx: &mut Context<Self>) {
        let token = self.deps.batch.as_ref().and_then(|b| b.gate.as_ref()).map(|g| g.token(ApiClass::Start));
        let wait = async move {
            match token {
                Some(token) => token.await,
                None => 0,
            }
        };
        ctx.spawn(wait.into_actor(self).map(move |epoch, act, ctx| {
            let params = if replay { act.batches.replay(batch) } else { act.batches.close(batch) };
            if let Some(params) = params {
                act.call_batch(batch, params, epoch, ctx);
            }
        }));
    }

    /// Makes a batch's call and hands each member its answer (or replays it after a backoff).
    fn call_batch(&mut self, batch: u64, params: BatchStartParams, epoch: u64, ctx: &mut Context<Self>) {
        let Some(deps) = self.deps.batch.as_ref() else { return };
        tracing::info!(
            batch,
            token = %params.client_token,
            zone = ?params.zone,
            machines = params.members.len(),
            "starting a batch of instances"
        );
        let call = deps.broker.start_instances(params);
        let gate = deps.gate.clone();
        ctx.spawn(call.into_actor(self).map(move |res, act, ctx| {
            if let Some(gate) = &gate {
                gate.report(ApiClass::Start, epoch, &res);
            }
            match act.batches.answered(batch, res) {
                Answer::Deliver(replies) => {
                    for (tx, reply) in replies {
                        let _ = tx.send(reply);
                    }
                }
                Answer::Replay { attempt } => {
                    let delay = act.deps.backoff.delay(attempt, &mut act.rng);
                    tracing::warn!(batch, retry_in = ?delay, "batched start failed ambiguously; replaying it");
                    ctx.run_later(delay, move |act, ctx| act.await_token(batch, true, ctx));
                }
                Answer::Unknown => {}
            }
        }));
    }

    fn enqueue(&mut self, job: Job, ctx: &mut Context<Self>) {
        self.book.push(job);
        self.dispatch(ctx);
    }
}

impl Actor for WorkerPool {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::actors::unlimited_mailbox(ctx);
    }
}

impl Handler<Enqueue> for WorkerPool {
    type Result = ();
    fn handle(&mut self, msg: Enqueue, ctx: &mut Self::Context) {
        self.enqueue(msg.0, ctx);
    }
}

impl Handler<JoinBatch> for WorkerPool {
    type Result = ResponseFuture<Reply>;
    fn handle(&mut self, msg: JoinBatch, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = futures::channel::oneshot::channel();
        let joined = self.batches.join(msg.0, tx);
        if joined.opened {
            self.await_token(joined.batch, false, ctx);
        }
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| Reply {
                result: Err(BrokerError::transient("the worker pool stopped before the batch answered")),
                maybe_made: true,
                with: std::sync::Arc::from([]),
            })
        })
    }
}

impl Handler<ResizePool> for WorkerPool {
    type Result = Result<(), ConfigError>;
    fn handle(&mut self, msg: ResizePool, ctx: &mut Self::Context) -> Self::Result {
        validate_workers(msg.0, self.max)?;
        self.book.resize(msg.0);
        self.dispatch(ctx);
        Ok(())
    }
}

impl Handler<GetPoolStatus> for WorkerPool {
    type Result = MessageResult<GetPoolStatus>;
    fn handle(&mut self, _msg: GetPoolStatus, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(PoolStatus {
            size: self.book.size(),
            in_flight: self.book.in_flight(),
            queued: self.book.queued(),
        })
    }
}

impl Handler<crate::actors::messages::Busy> for WorkerPool {
    type Result = usize;
    fn handle(&mut self, _msg: crate::actors::messages::Busy, _ctx: &mut Self::Context) -> usize {
        self.book.in_flight() + self.book.queued() + self.requeues.count()
    }
}
