//! The replica's role, an actor over [`LeaseBook`]: it ticks the book on a timer, carries out
//! each [`Step`] on the replica's lease thread ([`LeaseSql`]: the sync PostgreSQL client
//! there, one connection for every model's lease; a hung call never blocks the actor, and the
//! renew deadline is kept by the timer, not by the call), feeds the
//! answers back, and hands every [`Transition`] to the service's [`RoleHooks`] at once: to
//! leader ⇒ set the fence and start the provisioner; to follower ⇒ stop it.

use actix::prelude::*;
use actix_rt::time::Instant;
use futures::channel::oneshot;
use futures::future::LocalBoxFuture;

pub(crate) use super::messages::{Answered, GetLeaseStatus, ReleaseLease, SpreadOrder};
use super::pg::LeaseKey;
use super::sql::LeaseSql;
use super::state::{Answer, LeaseBook, Role, Step, Transition, Why};
use crate::service::settings::LeaseTimings;

/// What a change of role asks of the service. Called on the lease actor's thread, at once.
pub(crate) trait RoleHooks: 'static {
    /// This replica leads at `epoch`: set the store's fence, start the provisioner and the
    /// cloud.
    fn lead(&mut self, epoch: i64, transition: Transition);
    /// This replica no longer leads: stop the provisioner at once (in-flight cloud calls
    /// abandoned; the fence stays set, so nothing more it writes commits).
    fn follow(&mut self, why: Why, transition: Transition);
    /// A probe of this replica's own work (its store answers a read, its provisioner answers a
    /// question): `true` once it answered well. A leader whose probes have not answered well
    /// for the renew deadline steps down ([`Why::Stalled`]). `None`: nothing to probe (the work
    /// is taken to progress).
    fn probe(&mut self) -> Option<LocalBoxFuture<'static, bool>> {
        None
    }
}

/// Where and who: the lease of `model_uuid` on the database at `url`, held as `replica`.
#[derive(Debug, Clone)]
pub(crate) struct LeaseConfig {
    /// The PostgreSQL URL (the tests' lease thread is started from it; the service's is shared,
    /// `ReplicaLinks`).
    #[cfg(test)]
    pub url: String,
    /// The model whose lease it is.
    pub model_uuid: String,
    /// The schema of the model's tables on a connection shared by many models' leases
    /// ([`LeaseActor::start_on`]); `None`: the URL's own `search_path`.
    pub schema: Option<String>,
    /// This replica's id.
    pub replica: String,
    /// The timings.
    pub timings: LeaseTimings,
    /// Whether the models' leaders are spread over the replicas: the lease is asked for only
    /// once the spread's driver allows it ([`SpreadOrder`]); otherwise at once and every retry.
    pub spread: bool,
    /// The replica's beat, which every model's lease ticks on (`None`: ticks a retry apart,
    /// from its own start): see `LeaseBook::with_beat`.
    pub beat: Option<Instant>,
}

pub(crate) use super::state::LeaseStatus;

/// The replica's role actor.
pub(crate) struct LeaseActor {
    book: LeaseBook,
    replica: String,
    key: LeaseKey,
    sql: LeaseSql,
    hooks: Box<dyn RoleHooks>,
    timer: Option<SpawnHandle>,
    released: Vec<oneshot::Sender<()>>,
}

impl LeaseActor {
    /// Starts the actor, on the current arbiter, with a lease thread of its own; it tries to
    /// acquire at once.
    #[cfg(test)]
    pub(crate) fn start(config: LeaseConfig, hooks: Box<dyn RoleHooks>) -> std::io::Result<Addr<Self>> {
        let sql = LeaseSql::start(
            config.url.clone(),
            config.replica.clone(),
            config.timings.retry(),
            config.timings.lease(),
        )?;
        Ok(LeaseActor::create(move |_ctx| Self::new(config, hooks, sql)))
    }

    /// Starts the actor on `arbiter` (a thread that only the leases run on, so that no other
    /// work delays a renewal), its steps carried out by `sql`, the replica's lease thread that
    /// many models' leases share (made for the same replica id and timings).
    pub(crate) fn start_on(
        arbiter: &actix_rt::ArbiterHandle,
        config: LeaseConfig,
        hooks: Box<dyn RoleHooks + Send>,
        sql: LeaseSql,
    ) -> Addr<Self> {
        LeaseActor::start_in_arbiter(arbiter, move |_ctx| Self::new(config, hooks, sql))
    }

    fn new(config: LeaseConfig, hooks: Box<dyn RoleHooks>, sql: LeaseSql) -> Self {
        let book = if config.spread { LeaseBook::spread(config.timings) } else { LeaseBook::new(config.timings) };
        LeaseActor {
            book: match config.beat {
                Some(origin) => book.with_beat(origin),
                None => book,
            },
            replica: config.replica,
            key: LeaseKey { model_uuid: config.model_uuid, schema: config.schema },
            sql,
            hooks,
            timer: None,
            released: Vec::new(),
        }
    }

    fn apply(&mut self, t: Option<Transition>) {
        let Some(t) = t else { return };
        tracing::info!(replica = %self.replica, from = t.from.name(), to = t.to.name(), why = t.why.name(),
                       "lease: role changed");
        match t.to {
            Role::Leader { epoch } => self.hooks.lead(epoch, t),
            Role::Follower => self.hooks.follow(t.why, t),
        }
    }

    fn send(&mut self, step: Step, ctx: &mut Context<Self>) {
        if step != Step::Wait && !self.sql.send(&self.key, step, ctx.address().recipient()) {
            tracing::error!("lease: the SQL thread is gone");
        }
    }

    /// Ticks the book, then sets the timer for the next tick.
    fn tick(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let (t, step) = self.book.tick(now);
        self.apply(t);
        self.send(step, ctx);
        self.probe(ctx, now);
        self.schedule(ctx, now);
    }

    /// Sends a probe of the replica's own work if the book wants one; its answer goes back to
    /// the book.
    fn probe(&mut self, ctx: &mut Context<Self>, now: Instant) {
        if !self.book.probe_due(now) {
            return;
        }
        match self.hooks.probe() {
            None => self.book.probed(now, true),
            Some(probe) => {
                ctx.spawn(probe.into_actor(self).map(|ok, act, ctx| {
                    let now = Instant::now();
                    if !ok {
                        tracing::warn!(replica = %act.replica, "lease: this replica's store or provisioner did not answer its probe");
                    }
                    act.book.probed(now, ok);
                    // A stalled replica that answered again may ask for the lease at once.
                    act.schedule(ctx, now);
                }));
            }
        }
    }

    fn schedule(&mut self, ctx: &mut Context<Self>, now: Instant) {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let wait = self.book.next_tick(now).saturating_duration_since(now);
        self.timer = Some(ctx.run_later(wait, |act, ctx| {
            act.timer = None;
            act.tick(ctx);
        }));
    }
}

impl Actor for LeaseActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.tick(ctx);
    }
}

impl Handler<Answered> for LeaseActor {
    type Result = ();

    fn handle(&mut self, msg: Answered, ctx: &mut Self::Context) {
        let now = Instant::now();
        if let Answer::Failed(why) = &msg.0 {
            tracing::warn!(replica = %self.replica, reason = %why, "lease: the database did not answer");
        }
        // The release answered (or the database did not): a shutdown waits no longer.
        let release_done = matches!(msg.0, Answer::Released | Answer::Failed(_));
        let t = self.book.answer(&self.replica, now, msg.0);
        self.apply(t);
        if release_done {
            for tx in self.released.drain(..) {
                let _ = tx.send(());
            }
        }
        self.probe(ctx, now);
        self.schedule(ctx, now);
    }
}

impl Handler<ReleaseLease> for LeaseActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _msg: ReleaseLease, ctx: &mut Self::Context) -> Self::Result {
        let (t, step) = self.book.shutdown(Instant::now());
        let releasing = matches!(step, Step::Release { .. });
        self.apply(t);
        self.send(step, ctx);
        let (tx, rx) = oneshot::channel();
        if releasing {
            self.released.push(tx);
        } else {
            let _ = tx.send(());
        }
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

impl Handler<SpreadOrder> for LeaseActor {
    type Result = ();

    fn handle(&mut self, msg: SpreadOrder, ctx: &mut Self::Context) {
        self.book.observe(msg.seen);
        let now = Instant::now();
        if msg.hand_over {
            self.book.allow(false);
            if matches!(self.book.role(), Role::Leader { .. }) {
                tracing::info!(replica = %self.replica, "lease: handing the model over (above the fair share)");
            }
            let (t, step) = self.book.hand_over(now);
            self.apply(t);
            self.send(step, ctx);
            self.schedule(ctx, now);
            return;
        }
        let newly = msg.acquire && !self.book.may_acquire();
        self.book.allow(msg.acquire);
        // Given a model: ask for it now rather than at the next retry.
        if newly && matches!(self.book.role(), Role::Follower) {
            self.tick(ctx);
        }
    }
}

impl Handler<GetLeaseStatus> for LeaseActor {
    type Result = MessageResult<GetLeaseStatus>;

    fn handle(&mut self, _msg: GetLeaseStatus, ctx: &mut Self::Context) -> Self::Result {
        let now = Instant::now();
        // A leader past its deadline whose timer has not fired yet (a process just resumed)
        // steps down now rather than report a role it may no longer act in.
        if matches!(self.book.role(), Role::Leader { .. }) && !self.book.may_act(now) {
            self.tick(ctx);
        }
        let (leader, epoch) = match (self.book.role(), self.book.holder()) {
            (Role::Leader { epoch }, _) => (Some(self.replica.clone()), Some(epoch)),
            (Role::Follower, Some((h, e))) if h != self.replica => (Some(h.to_owned()), Some(e)),
            (Role::Follower, Some((_, e))) => (None, Some(e)),
            (Role::Follower, None) => (None, None),
        };
        MessageResult(LeaseStatus {
            role: self.book.role().name(),
            leader,
            epoch,
            replica: self.replica.clone(),
            last_transition: self
                .book
                .last_transition()
                .map(|t| (t.from.name(), t.to.name(), t.why.name(), now.saturating_duration_since(t.at))),
            transitions: self.book.transitions(),
        })
    }
}
