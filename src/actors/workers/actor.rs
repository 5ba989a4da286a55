//! The worker pool actor: a thin shell over [`PoolBook`] that runs jobs as futures on its own
//! context (no extra threads or arbiters, so a paused test clock governs every wait).

use std::sync::Arc;

use actix::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tracing::Instrument;

use super::messages::*;
use super::start::{run_start, StartDeps};
use super::state::{Job, JobOutcome, PoolBook, PoolStatus, ReleaseJob, StopJob, WorkerError};
use crate::actors::coordinator::JobDone;
use crate::actors::work::{BusyState, WorkCount};
use crate::config::{validate_workers, ConfigError};
use crate::ports::BrokerError;

/// Runs broker jobs.
pub struct WorkerPool {
    book: PoolBook,
    max: usize,
    deps: Arc<StartDeps>,
    done: Recipient<JobDone>,
    rng: StdRng,
    /// Failed jobs waiting out their backoff before being queued again, one guard each.
    requeues: WorkCount,
    /// The book's jobs (queued or in flight), in the provisioner's total.
    jobs: BusyState,
}

impl WorkerPool {
    /// A pool of `size` workers (valid `1..=max`), reporting to `done`.
    pub fn new(size: usize, max: usize, deps: StartDeps, done: Recipient<JobDone>, seed: u64) -> Self {
        let requeues = WorkCount::new();
        Self {
            book: PoolBook::new(size),
            max,
            deps: Arc::new(deps),
            done,
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

    fn nonce(&mut self) -> String {
        let id = uuid::Builder::from_random_bytes(self.rng.random()).into_uuid();
        format!("{}:{id}", self.deps.host_tag)
    }

    fn dispatch(&mut self, ctx: &mut Context<Self>) {
        while let Some(job) = self.book.take_next() {
            match job {
                Job::Start(start) => {
                    let nonce = self.nonce();
                    // One span per machine operation: every line the start logs carries it.
                    let span = tracing::info_span!("start", machine = %start.machine.id);
                    let fut = run_start(self.deps.clone(), *start, nonce, self.rng.random()).instrument(span);
                    ctx.spawn(fut.into_actor(self).map(|outcome, act, ctx| {
                        act.book.finished();
                        act.done.do_send(JobDone(outcome));
                        act.dispatch(ctx);
                    }));
                }
                Job::Stop(stop) => {
                    let span = tracing::info_span!("stop", instances = ?stop.instances, machines = ?stop.machines);
                    let call = self.deps.broker.stop_instances(stop.instances.clone()).instrument(span);
                    let done =
                        JobOutcome::Stopped { instances: stop.instances.clone(), machines: stop.machines.clone() };
                    self.spawn_cloud_job(call, done, ctx, move |source| {
                        let (failed, instances) = (stop.attempt, stop.instances.clone());
                        let again = Job::Stop(StopJob { attempt: failed + 1, ..stop });
                        (again, failed, WorkerError::Stop { instances, source })
                    });
                }
                Job::Release(release) => {
                    let call = self.deps.broker.release_instances(release.instances.clone());
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
        self.jobs.set(self.book.in_flight() + self.book.queued() > 0);
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
                Ok(()) => act.done.do_send(JobDone(done)),
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

    fn requeue_later(&mut self, job: Job, delay: std::time::Duration, ctx: &mut Context<Self>) {
        let waiting = self.requeues.guard();
        ctx.run_later(delay, move |act, ctx| {
            act.enqueue(job, ctx);
            drop(waiting);
        });
    }

    fn enqueue(&mut self, job: Job, ctx: &mut Context<Self>) {
        self.book.push(job);
        self.dispatch(ctx);
    }
}

impl Actor for WorkerPool {
    type Context = Context<Self>;
}

impl Handler<Enqueue> for WorkerPool {
    type Result = ();
    fn handle(&mut self, msg: Enqueue, ctx: &mut Self::Context) {
        self.enqueue(msg.0, ctx);
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
