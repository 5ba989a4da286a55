//! The store: owns the backend (SQLite or PostgreSQL) on its lane's thread (`lanes`), runs
//! its units of work in group commits, and notifies watchers.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use actix::{MailboxError, Recipient};

use super::backend::{Fence, StoreBackend};
use super::errors::StoreError;
use super::lanes::{Lane, LaneStore};
use super::messages::{CountsChanged, Work};
use super::records::StoreCounts;
use super::sqlite::StoreCore;
use super::writes::{Write, Written};
use crate::{MachinesChanged, RetryTick};

/// One unit of work's answer, held until its group commits: called with the group's failure
/// (`None`: committed), it answers the work's own result, or the group's failure if the work
/// succeeded but its group did not commit.
type Answer = Box<dyn FnOnce(Option<&StoreError>) + Send>;

/// How many times a group of write-behind units lets the other threads run before it commits
/// at an empty mailbox ([`StoreActor::group_done`]): 1 and 3 measured alike, both well ahead of 0.
const YIELDS_BEFORE_COMMIT: usize = 3;

/// The group commit open on the store's thread: whether it commits durably, and the answers
/// it holds back until then.
#[derive(Default)]
struct Group {
    /// `Some(durable)` while a group is open.
    durable: Option<bool>,
    /// The answers of its units of work that read or wrote what is not committed yet.
    answers: Vec<Answer>,
    /// Where the answers of the write-behind units the backend queued go, in the order queued.
    deferred: Vec<DeferredReply>,
}

/// Where a write-behind unit's answer goes.
type DeferredReply = futures::channel::oneshot::Sender<Result<Written, StoreError>>;

/// Owns the backend (on its lane's thread: both backends' calls block) and the watchers.
///
/// Group commit: while more units of work wait in its mailbox (`waiting`, counted by the
/// clients), the actor runs them in one open transaction, each in a savepoint of its own (a
/// failing one is rolled back alone), and commits them together when none waits any more (or
/// `MAX_GROUP` are in): one fsync for every durable write of the group. Each is answered only
/// after that commit (acknowledged means durable, as before), then the watchers hear what the
/// group changed. A unit of work that finds nothing written in its group yet (a read) is
/// answered at once: it saw only committed data. A durable write joins a lazy group only if
/// the backend can make it durable (PostgreSQL); else (SQLite) that group commits first. A
/// backend without group commits would run each alone. A write-behind unit ([`Write`]: the
/// provisioner's hot writes as data) joins the open group (opening a lazy one) and, if the
/// backend queues it ([`StoreBackend::defer`]: PostgreSQL), costs no round trip of its own:
/// its statements go with the group's commit and its answer comes from
/// [`StoreBackend::take_deferred`]; else it runs as any unit of work.
pub(crate) struct StoreActor {
    core: Result<Box<dyn StoreBackend>, StoreError>,
    watchers: Vec<Recipient<MachinesChanged>>,
    retry_watchers: Vec<Recipient<RetryTick>>,
    count_watchers: Vec<Recipient<CountsChanged>>,
    /// Operations run (every unit of work), shared with the clients.
    operations: Arc<AtomicU64>,
    /// Units of work sent and not yet run, shared with the clients.
    waiting: Arc<AtomicUsize>,
    /// Group commits made, shared with the clients.
    commits: Arc<AtomicU64>,
    /// The database session it writes on (-1: none), shared with the clients.
    session: Arc<AtomicI64>,
    /// Where it publishes its counts after each commit that changed them, for the clients'
    /// [`Store::counts`].
    counts: Arc<tokio::sync::watch::Sender<StoreCounts>>,
    /// The group commit open, if one is.
    group: Group,
    /// Its last unit of work failed on the database (or its last group did not commit), and
    /// none succeeded since: a probe then reads the model itself ([`Store::probe`]).
    troubled: bool,
}

impl LaneStore for StoreActor {
    /// Its last handle is gone: the open group commits (the backend closes when dropped).
    fn close(&mut self) {
        self.end_turn();
    }

    /// Its lane serves another store next: its open group commits, and a connection it
    /// borrowed from the lane goes back.
    fn end_turn(&mut self) {
        self.finish_group();
        if let Ok(core) = self.core.as_mut() {
            core.release_connection();
        }
    }

    /// It has been idle a while (no work since its lane's last sweep): the backend gives back
    /// what it keeps only to go faster. Not while a group is open or work is on its way.
    fn shed_memory(&mut self) {
        if self.group.durable.is_none() && self.waiting.load(Ordering::Acquire) == 0 {
            if let Ok(core) = self.core.as_mut() {
                core.shed_memory();
            }
        }
    }
}

impl StoreActor {
    fn over(core: Result<Box<dyn StoreBackend>, StoreError>, shared: &Shared) -> Self {
        if let Ok(core) = &core {
            shared.counts.send_replace(core.counts().clone());
        }
        Self {
            core,
            watchers: Vec::new(),
            retry_watchers: Vec::new(),
            count_watchers: Vec::new(),
            operations: shared.operations.clone(),
            waiting: shared.waiting.clone(),
            commits: shared.commits.clone(),
            session: shared.session.clone(),
            counts: shared.counts.clone(),
            group: Group::default(),
            troubled: false,
        }
    }

    /// Notes how a unit of work (or a group's commit) went on the database: a failure there
    /// makes the store troubled, a success makes it well.
    fn note_outcome(&mut self, failure: Option<&StoreError>) {
        match failure {
            None => self.troubled = false,
            Some(StoreError::Postgres { .. } | StoreError::Unavailable(_) | StoreError::Sqlite { .. }) => {
                self.troubled = true
            }
            Some(_) => {}
        }
    }

    /// Sends the outbox to the watchers.
    fn publish(&mut self) {
        let Ok(core) = self.core.as_mut() else { return };
        self.session.store(core.session_pid().map_or(-1, i64::from), Ordering::Relaxed);
        let (ids, tick) = core.take_outbox();
        if !ids.is_empty() {
            self.watchers.retain(|w| w.connected());
            for w in &self.watchers {
                w.do_send(MachinesChanged { ids: ids.clone() });
            }
        }
        if tick {
            self.retry_watchers.retain(|w| w.connected());
            for w in &self.retry_watchers {
                w.do_send(RetryTick);
            }
        }
        if let Some(counts) = core.take_counts() {
            self.counts.send_replace(counts.clone());
            self.count_watchers.retain(|w| w.connected());
            for w in &self.count_watchers {
                w.do_send(CountsChanged(counts.clone()));
            }
        }
    }

    /// Commits the open group (if one is), tells the watchers what it changed, then answers
    /// its units of work.
    fn finish_group(&mut self) {
        if self.group.durable.take().is_none() {
            return;
        }
        let answers = std::mem::take(&mut self.group.answers);
        let deferred = std::mem::take(&mut self.group.deferred);
        let (committed, mut results) = match self.core.as_mut() {
            Ok(core) => (core.commit_group().inspect_err(|e| core.note_damage(e)), core.take_deferred().into_iter()),
            Err(e) => (Err(e.clone()), Vec::new().into_iter()),
        };
        if committed.is_ok() {
            self.commits.fetch_add(1, Ordering::Relaxed);
        }
        self.note_outcome(committed.as_ref().err());
        self.publish();
        let failure = committed.err();
        if let Some(e) = &failure {
            tracing::error!(error = %e, writes = answers.len(), "a group commit failed: none of its writes was made");
        }
        for answer in answers {
            answer(failure.as_ref());
        }
        for reply in deferred {
            let _ = reply.send(match (&failure, results.next()) {
                (Some(e), _) => Err(e.clone()),
                (None, Some(result)) => result,
                (None, None) => Err(StoreError::Refused("the store kept no answer for a write-behind unit".into())),
            });
        }
    }

    /// The open group's transaction is gone (`why`): nothing of it is written; every unit of
    /// work held answers its own error, or `why`.
    fn abort_group(&mut self, why: &StoreError) {
        self.group.durable = None;
        if let Ok(core) = self.core.as_mut() {
            core.abort_group();
        }
        tracing::error!(error = %why, writes = self.group.answers.len(), "a group commit was rolled back");
        for answer in std::mem::take(&mut self.group.answers) {
            answer(Some(why));
        }
        for reply in std::mem::take(&mut self.group.deferred) {
            let _ = reply.send(Err(why.clone()));
        }
    }

    /// Whether the open group must commit now: none waits to join it, or it is full.
    ///
    /// A group holding write-behind units first lets the other threads run a little (a few
    /// yields of the store's thread: no sleep, no clock) and commits only if still none waits:
    /// the provisioner's writers are woken together by the previous commit's answers and hand in
    /// their next writes one after another, so committing at the first empty mailbox cut their
    /// writes into many small groups, and a group's statements and commit cost much the same
    /// for one write as for twenty (`docs/performance.md`, "Set-based write-behind units").
    fn group_done(&self) -> bool {
        let idle = || self.waiting.load(Ordering::Acquire) == 0;
        (idle()
            && (self.group.deferred.is_empty()
                || (0..YIELDS_BEFORE_COMMIT).all(|_| {
                    std::thread::yield_now();
                    idle()
                })))
            || self.core.as_ref().is_ok_and(|c| c.group_full(self.group.answers.len() + self.group.deferred.len()))
    }
}

impl StoreActor {
    /// One unit of work (`Store::send`): a read, or a write answered once its group commits.
    fn exec<T: Send + 'static>(
        &mut self,
        work: Work<T>,
        durable: bool,
        fenced: bool,
        reply: futures::channel::oneshot::Sender<Result<T, StoreError>>,
    ) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        self.operations.fetch_add(1, Ordering::Relaxed);
        self.run(work, durable, fenced, reply);
    }

    /// One write-behind unit (`Store::write_behind`): queued in the open group if the backend
    /// queues such writes, else run as any unit of work.
    fn apply(&mut self, write: Write, reply: DeferredReply) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        self.operations.fetch_add(1, Ordering::Relaxed);
        let write = match self.defer(write) {
            None => {
                self.group.deferred.push(reply);
                if self.group_done() {
                    self.finish_group();
                }
                return;
            }
            Some(write) => write,
        };
        // Run as any unit of work.
        let (durable, fenced) = (write.durable(), write.fenced());
        self.run(Box::new(move |s: &mut dyn StoreBackend| write.apply(s)), durable, fenced, reply);
    }
}

impl StoreActor {
    /// Queues a write-behind unit in the open group (opened for it if none is, durable if it
    /// is), if the backend queues such writes; else gives it back.
    fn defer(&mut self, write: Write) -> Option<Write> {
        let durable = write.durable();
        let Ok(core) = self.core.as_mut() else { return Some(write) };
        match self.group.durable {
            None => match core.begin_group(durable) {
                Ok(true) => self.group.durable = Some(durable),
                _ => return Some(write),
            },
            // A lazy group that cannot be made durable: the write runs as any (after its commit).
            Some(false) if durable => {
                if !core.raise_group_durability() {
                    return Some(write);
                }
                self.group.durable = Some(true);
            }
            Some(_) => {}
        }
        core.set_fenced(write.fenced());
        core.defer(write)
    }

    /// Runs one unit of work in the open group (opening one if none is), or alone on a backend
    /// without group commits.
    fn run<T: Send + 'static>(
        &mut self,
        work: Work<T>,
        durable: bool,
        fenced: bool,
        reply: futures::channel::oneshot::Sender<Result<T, StoreError>>,
    ) {
        // A durable write joins a group that commits without waiting for the disk only if the
        // backend can make that group durable (PostgreSQL); else that group commits first.
        if durable && self.group.durable == Some(false) {
            if self.core.as_mut().is_ok_and(|c| c.raise_group_durability()) {
                self.group.durable = Some(true);
            } else {
                self.finish_group();
            }
        }
        let core = match self.core.as_mut() {
            Ok(core) => core,
            Err(e) => {
                let _ = reply.send(Err(e.clone()));
                return;
            }
        };
        if self.group.durable.is_none() {
            match core.begin_group(durable) {
                Ok(true) => self.group.durable = Some(durable),
                Ok(false) => {
                    // This backend commits each write alone.
                    core.set_fenced(fenced);
                    let result = core.set_durable(durable).and_then(|()| work(core.as_mut()));
                    if let Err(e) = &result {
                        core.note_damage(e);
                    }
                    self.publish();
                    let _ = reply.send(result);
                    return;
                }
                Err(e) => {
                    core.note_damage(&e);
                    let _ = reply.send(Err(e));
                    return;
                }
            }
        }
        core.set_fenced(fenced);
        if let Err(e) = core.begin_member() {
            core.note_damage(&e);
            let _ = reply.send(Err(e.clone()));
            self.abort_group(&e);
            return;
        }
        let result = work(core.as_mut());
        if let Err(e) = &result {
            core.note_damage(e);
        }
        let ended = core.end_member(result.is_ok());
        let written = core.group_has_written();
        if let Err(e) = &ended {
            core.note_damage(e);
        }
        self.note_outcome(result.as_ref().err());
        let answer: Answer = Box::new(move |failure: Option<&StoreError>| {
            let _ = reply.send(match (failure, result) {
                (Some(e), Ok(_)) => Err(e.clone()),
                (_, result) => result,
            });
        });
        match ended {
            Err(e) => {
                self.group.answers.push(answer);
                self.abort_group(&e);
                return;
            }
            // Nothing written in the group yet: what it read was committed before.
            Ok(()) if !written => answer(None),
            Ok(()) => self.group.answers.push(answer),
        }
        if self.group_done() {
            self.finish_group();
        }
    }
}

impl StoreActor {
    /// A probe of the store (a leader's lease asks it every retry): a read of the model itself
    /// when the store is troubled (its last work failed on the database), else only whether the
    /// backend answers ([`StoreBackend::check_alive`]: on PostgreSQL, its lane's connection
    /// answered a moment ago, or answers now).
    fn probe(&mut self, reply: futures::channel::oneshot::Sender<Result<(), StoreError>>) {
        let troubled = self.troubled;
        let work: Work<()> =
            Box::new(move |s: &mut dyn StoreBackend| if troubled { s.model_life().map(drop) } else { s.check_alive() });
        self.exec(work, false, false, reply);
    }

    /// Sets (or clears) the leader's fence, after the open group commits.
    fn set_fence(&mut self, fence: Option<Fence>) -> Result<(), StoreError> {
        self.finish_group();
        match self.core.as_mut() {
            Ok(core) => core.set_fence(fence),
            Err(e) => Err(e.clone()),
        }
    }

    /// A machine watcher: every machine now, then the ids that change.
    fn watch(&mut self, to: Recipient<MachinesChanged>) {
        self.finish_group();
        match self.core.as_mut().map_err(|e| e.clone()).and_then(|c| c.machine_ids()) {
            Ok(ids) => {
                to.do_send(MachinesChanged { ids });
                self.watchers.push(to);
            }
            Err(e) => tracing::error!(error = %e, "cannot list machines for a new watcher"),
        }
    }

    /// A watcher of the gauges' counts: the current ones now, then each change.
    fn watch_counts(&mut self, to: Recipient<CountsChanged>) {
        self.finish_group();
        if let Ok(core) = &self.core {
            to.do_send(CountsChanged(core.counts().clone()));
        }
        self.count_watchers.push(to);
    }

    /// A transient-retry watcher.
    fn watch_retries(&mut self, to: Recipient<RetryTick>) {
        self.finish_group();
        self.retry_watchers.push(to);
    }
}

/// The counters the store's clients and its actor share.
#[derive(Clone)]
struct Shared {
    /// Operations run (every unit of work).
    operations: Arc<AtomicU64>,
    /// Units of work sent and not yet run (the actor's group commits end when none is).
    waiting: Arc<AtomicUsize>,
    /// Group commits made.
    commits: Arc<AtomicU64>,
    /// The database session the store writes on, as of its last commit (-1: none).
    session: Arc<AtomicI64>,
    /// The counts as of the last commit that changed them (published by the actor).
    counts: Arc<tokio::sync::watch::Sender<StoreCounts>>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            operations: Arc::default(),
            waiting: Arc::default(),
            commits: Arc::default(),
            session: Arc::new(AtomicI64::new(-1)),
            counts: Arc::new(tokio::sync::watch::Sender::new(StoreCounts::default())),
        }
    }
}

/// A handle on the running store. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Store {
    lane: Lane,
    shared: Shared,
    /// How its backend is opened, for a backend a second connection can share the database
    /// with ([`Store::companion`]; `None`: SQLite, whose writers take turns anyway).
    reopen: Option<Opener>,
    /// On PostgreSQL: the URL and the pool of connections its stores borrow (one per lane), for
    /// the other models' stores beside it ([`Store::start_postgres_beside`]).
    #[cfg(feature = "postgres")]
    pg: Option<(Arc<str>, u64)>,
}

/// Opens a store's backend on its thread.
type Opener = Arc<dyn Fn() -> Result<Box<dyn StoreBackend>, StoreError> + Send + Sync>;

impl Store {
    /// Opens the database at `path` (creating it and its schema if needed) and starts the
    /// store's thread. Must be called inside an actix system. The database is opened here
    /// first, so that a bad path or a too-new schema is an error now, not on the first call.
    pub(crate) fn start(path: &Path) -> Result<Self, StoreError> {
        // Opened (and checked whole) here first, so that a damaged database is an error now;
        // the store's thread then opens it again without repeating the check.
        drop(StoreCore::open(path)?);
        let path: PathBuf = path.to_owned();
        let shared = Shared::default();
        let theirs = shared.clone();
        let lane = Lane::open(move || {
            let core = StoreCore::open_checked_before(&path);
            if let Err(e) = &core {
                tracing::error!(error = %e, "cannot open the database");
            }
            Box::new(StoreActor::over(core.map(|c| Box::new(c) as Box<dyn StoreBackend>), &theirs))
                as Box<dyn LaneStore>
        });
        Ok(Self {
            lane,
            shared,
            reopen: None,
            #[cfg(feature = "postgres")]
            pg: None,
        })
    }

    /// Starts the store on a lane over a backend that `open` makes there. For a backend that connects lazily (PostgreSQL), `open` does
    /// not fail on an unreachable server: its operations answer [`StoreError::Unavailable`]
    /// until it reconnects.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn start_with(
        open: impl Fn() -> Result<Box<dyn StoreBackend>, StoreError> + Send + Sync + 'static,
    ) -> Self {
        Self::start_opener(Arc::new(open))
    }

    fn start_opener(open: Opener) -> Self {
        let shared = Shared::default();
        let theirs = shared.clone();
        let opener = open.clone();
        let lane = Lane::open(move || {
            let core = opener();
            if let Err(e) = &core {
                tracing::error!(error = %e, "cannot open the database");
            }
            Box::new(StoreActor::over(core, &theirs)) as Box<dyn LaneStore>
        });
        Self {
            lane,
            shared,
            reopen: Some(open),
            #[cfg(feature = "postgres")]
            pg: None,
        }
    }

    /// A second store over the same database on a connection of its own (on the next lane), if the
    /// backend allows one (PostgreSQL; `None` for SQLite): its units of work commit in groups
    /// of their own, beside this store's. The simulated cloud's writes go there, so that the
    /// server runs them on a second backend process, in parallel with the provisioner's.
    pub(crate) fn companion(&self) -> Option<Store> {
        self.reopen.clone().map(|open| Self {
            #[cfg(feature = "postgres")]
            pg: self.pg.clone(),
            ..Self::start_opener(open)
        })
    }

    /// Opens the PostgreSQL store at `url` (feature `postgres`): the URL is parsed now (a bad
    /// one is an error now); the server is reached from the store's lane, with backoff. The
    /// store starts a pool of connections (one per lane, borrowed in turn by the pool's stores
    /// there: see `postgres::pool`), which the stores opened beside it share
    /// ([`Store::start_postgres_beside`]).
    #[cfg(feature = "postgres")]
    pub(crate) fn start_postgres(url: &str) -> Result<Self, StoreError> {
        Self::start_pooled(url, super::postgres::new_pool(), None)
    }

    /// Opens the store of the model in `schema` beside this PostgreSQL store: over the same
    /// URL, on the same pool of connections.
    #[cfg(feature = "postgres")]
    pub(crate) fn start_postgres_beside(&self, schema: &str) -> Result<Self, StoreError> {
        let Some((url, pool)) = &self.pg else {
            return Err(StoreError::Refused("a model's PostgreSQL store beside one that is not".into()));
        };
        Self::start_pooled(url, *pool, Some(schema.to_owned()))
    }

    #[cfg(feature = "postgres")]
    fn start_pooled(url: &str, pool: u64, schema: Option<String>) -> Result<Self, StoreError> {
        let (config, tls) = super::PgStore::store_config(url)?;
        let store = Self::start_with(move || {
            Ok(Box::new(super::PgStore::pooled(config.clone(), tls.clone(), pool, schema.clone()))
                as Box<dyn StoreBackend>)
        });
        Ok(Self { pg: Some((url.into(), pool)), ..store })
    }

    /// Sets (`Some`) or clears (`None`) the leader's fence: every later write of
    /// [`Store::exec_lazy`] (the provisioner's and the simulated cloud's) commits only while
    /// the `leader_lease` row names this holder at this epoch and has not expired, else fails
    /// with [`StoreError::Fenced`] having written nothing. PostgreSQL only.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn set_fence(
        &self,
        fence: Option<Fence>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let (reply, answer) = futures::channel::oneshot::channel();
        self.on_store(move |s| {
            let _ = reply.send(s.set_fence(fence));
        });
        async move { answer.await.map_err(|_| StoreError::Stopped(MailboxError::Closed))? }
    }

    /// Runs `job` on the store actor on its lane, after the work sent before it.
    fn on_store(&self, job: impl FnOnce(&mut StoreActor) + Send + 'static) {
        self.lane.run(move |s| {
            if let Some(store) = (s as &mut dyn std::any::Any).downcast_mut::<StoreActor>() {
                job(store);
            }
        });
    }

    /// How many operations the store has run (reads and writes alike).
    pub(crate) fn operations(&self) -> u64 {
        self.shared.operations.load(Ordering::Relaxed)
    }

    /// How many group commits the store has made (each commits one or more units of work).
    #[cfg(test)]
    pub(crate) fn group_commits(&self) -> u64 {
        self.shared.commits.load(Ordering::Relaxed)
    }

    /// The database session the store writes on, as of its last commit (PostgreSQL's backend
    /// process id: the sender of the change notifications its commits send); `None` before the
    /// first, or for SQLite.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn session_pid(&self) -> Option<i32> {
        i32::try_from(self.shared.session.load(Ordering::Relaxed)).ok().filter(|pid| *pid >= 0)
    }

    /// The counts as of the store's last commit that changed them (its machines by status and
    /// life, those in error, the simulated cloud's instances, the model's life), as published
    /// after that commit and before its units of work were answered: read here, on the
    /// caller's thread, without waiting for the store's lane (`GET /v1/status` never queues
    /// behind the provisioner's writes). Empty until the store has first opened its backend.
    pub(crate) fn counts(&self) -> StoreCounts {
        self.shared.counts.borrow().clone()
    }

    /// [`Store::counts`], or, for a store that has published none yet (its backend not opened:
    /// PostgreSQL connects on first use), the counts read through the store once (reading the
    /// model's life opens the backend, which counts).
    pub(crate) fn published_counts(&self) -> impl Future<Output = Result<StoreCounts, StoreError>> + Send + 'static {
        let published = self.counts();
        let read = published.model_life.is_empty().then(|| self.read(|s| s.model_life().map(|_| s.counts().clone())));
        async move {
            match read {
                Some(read) => read.await,
                None => Ok(published),
            }
        }
    }

    /// Subscribes to the gauges' counts: the current ones now, then each change.
    pub(crate) fn watch_counts(&self, to: Recipient<CountsChanged>) {
        self.on_store(move |s| s.watch_counts(to));
    }

    /// Sends one unit of work to the store's thread; its answer comes after its group commits.
    fn send<T: Send + 'static>(
        &self,
        work: Work<T>,
        durable: bool,
        fenced: bool,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let (reply, answer) = futures::channel::oneshot::channel();
        // Counted before it is sent: the store keeps its group open while any is on its way.
        self.shared.waiting.fetch_add(1, Ordering::AcqRel);
        self.on_store(move |s| s.exec(work, durable, fenced, reply));
        // A dropped answer: the store's thread stopped (or its mailbox was closed).
        async move { answer.await.map_err(|_| StoreError::Stopped(MailboxError::Closed))? }
    }

    /// Runs `f` on the store's thread and answers its result; a write it makes is on disk
    /// (fsynced) before the answer. For what an operator's request acknowledges. `f` is atomic:
    /// if it fails, none of its writes is made.
    pub(crate) fn exec<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn StoreBackend) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        self.send(Box::new(f), true, false)
    }

    /// Runs `f`, a read, on the store's thread: like [`Store::exec`], but a write it made would
    /// not wait for the disk, so a read shares any group commit (see [`StoreActor`]).
    pub(crate) fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn StoreBackend) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        self.send(Box::new(f), false, false)
    }

    /// Runs `f` like [`Store::exec`], but a write it makes is committed without waiting for
    /// the disk: it survives a crash of the process, and a power cut loses at most a suffix of
    /// such writes (the WAL keeps commits in order). For the provisioner's and the simulated
    /// cloud's own writes, which a restarted provisioner re-derives (tagged instances are
    /// adopted, dead machines harvested again). Its writes are fenced: while a fence is set
    /// ([`Store::set_fence`]), they commit only under the lease it names.
    pub(crate) fn exec_lazy<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn StoreBackend) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        self.send(Box::new(f), false, true)
    }

    /// Runs a write-behind unit of work: like [`Store::exec_lazy`] of [`Write::apply`] (lazy,
    /// fenced, atomic, answered after its group commits), or for an operator's write
    /// ([`Write::durable`]) like [`Store::exec`], but given as data, so that the backend may
    /// queue it with the group's commit instead of waiting for its own answer (PostgreSQL).
    pub(crate) fn write_behind(
        &self,
        write: Write,
    ) -> impl Future<Output = Result<Written, StoreError>> + Send + 'static {
        // Its span in the trace of the work that asked for it (issue 37; disabled unless traces
        // are exported): from now to its group's commit.
        let span = tracing::info_span!(target: crate::trace::TRACE_TARGET, "store commit", write = write.name());
        let (reply, answer) = futures::channel::oneshot::channel();
        self.shared.waiting.fetch_add(1, Ordering::AcqRel);
        self.on_store(move |s| s.apply(write, reply));
        let answer = async move { answer.await.map_err(|_| StoreError::Stopped(MailboxError::Closed))? };
        if span.is_disabled() {
            return futures::future::Either::Left(answer);
        }
        // Traced: the answer is taken as it comes, so that the span ends at the commit even
        // when the writer awaits it later (a start's "starting" status, sent without waiting).
        let taken = actix_rt::spawn(tracing::Instrument::instrument(answer, span));
        futures::future::Either::Right(async move {
            taken.await.unwrap_or_else(|_| Err(StoreError::Stopped(MailboxError::Closed)))
        })
    }

    /// Adds `count` machines as `spec` says ([`StoreBackend::add_new_machines`]), as a
    /// write-behind unit ([`Write::AddMachines`]: durable, not fenced), so that concurrent adds
    /// share their group's statements on PostgreSQL. Their ids, once on disk.
    pub(crate) fn add_machines(
        &self,
        count: usize,
        spec: super::records::NewMachine,
    ) -> impl Future<Output = Result<Vec<crate::model::MachineId>, StoreError>> + Send + 'static {
        let written = self.write_behind(Write::AddMachines { count, spec });
        async move {
            match written.await? {
                Written::Added(ids) => Ok(ids),
                other => Err(StoreError::Refused(format!("the store answered {other:?} for an add"))),
            }
        }
    }

    /// Probes the store (see `StoreActor::probe`): `Ok` once it answered well, after the work
    /// sent before it.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let (reply, answer) = futures::channel::oneshot::channel();
        self.shared.waiting.fetch_add(1, Ordering::AcqRel);
        self.on_store(move |s| s.probe(reply));
        async move { answer.await.map_err(|_| StoreError::Stopped(MailboxError::Closed))? }
    }

    /// Subscribes a machine watcher (it hears every machine at once).
    pub(crate) fn watch(&self, to: Recipient<MachinesChanged>) {
        self.on_store(move |s| s.watch(to));
    }

    /// Subscribes a transient-retry watcher.
    pub(crate) fn watch_retries(&self, to: Recipient<RetryTick>) {
        self.on_store(move |s| s.watch_retries(to));
    }
}
