//! The store actor: owns the backend (SQLite or PostgreSQL) on its own thread, and notifies
//! watchers.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;

use super::backend::{Fence, StoreBackend};
use super::messages::{CountsChanged, Exec, SetFence, Watch, WatchCounts, WatchRetries};
use super::state::{StoreCore, StoreError};
use crate::{MachinesChanged, RetryTick};

/// Owns the backend (one `SyncArbiter` thread: both backends' calls block) and the watchers.
pub struct StoreActor {
    core: Result<Box<dyn StoreBackend>, StoreError>,
    watchers: Vec<Recipient<MachinesChanged>>,
    retry_watchers: Vec<Recipient<RetryTick>>,
    count_watchers: Vec<Recipient<CountsChanged>>,
    /// Operations run (every `Exec`), shared with the clients.
    operations: Arc<AtomicU64>,
}

impl Actor for StoreActor {
    type Context = SyncContext<Self>;
}

impl StoreActor {
    /// An actor over an open core.
    pub fn new(core: impl StoreBackend + 'static) -> Self {
        Self::over(Ok(Box::new(core)), Arc::default())
    }

    fn over(core: Result<Box<dyn StoreBackend>, StoreError>, operations: Arc<AtomicU64>) -> Self {
        Self { core, watchers: Vec::new(), retry_watchers: Vec::new(), count_watchers: Vec::new(), operations }
    }

    /// Sends the outbox to the watchers.
    fn publish(&mut self) {
        let Ok(core) = self.core.as_mut() else { return };
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
            self.count_watchers.retain(|w| w.connected());
            for w in &self.count_watchers {
                w.do_send(CountsChanged(counts.clone()));
            }
        }
    }
}

impl<T: Send + 'static> Handler<Exec<T>> for StoreActor {
    type Result = Result<T, StoreError>;
    fn handle(&mut self, msg: Exec<T>, _ctx: &mut Self::Context) -> Self::Result {
        self.operations.fetch_add(1, Ordering::Relaxed);
        let result = match self.core.as_mut() {
            Ok(core) => {
                core.set_fenced(msg.fenced);
                let result = core.set_durable(msg.durable).and_then(|()| (msg.work)(core.as_mut()));
                if let Err(e) = &result {
                    core.note_damage(e);
                }
                result
            }
            Err(e) => Err(e.clone()),
        };
        self.publish();
        result
    }
}

impl Handler<SetFence> for StoreActor {
    type Result = Result<(), StoreError>;
    fn handle(&mut self, msg: SetFence, _ctx: &mut Self::Context) -> Self::Result {
        match self.core.as_mut() {
            Ok(core) => core.set_fence(msg.0),
            Err(e) => Err(e.clone()),
        }
    }
}

impl Handler<Watch> for StoreActor {
    type Result = ();
    fn handle(&mut self, msg: Watch, _ctx: &mut Self::Context) {
        match self.core.as_mut().map_err(|e| e.clone()).and_then(|c| c.machine_ids()) {
            Ok(ids) => {
                msg.0.do_send(MachinesChanged { ids });
                self.watchers.push(msg.0);
            }
            Err(e) => tracing::error!(error = %e, "cannot list machines for a new watcher"),
        }
    }
}

impl Handler<WatchCounts> for StoreActor {
    type Result = ();
    fn handle(&mut self, msg: WatchCounts, _ctx: &mut Self::Context) {
        if let Ok(core) = &self.core {
            msg.0.do_send(CountsChanged(core.counts().clone()));
        }
        self.count_watchers.push(msg.0);
    }
}

impl Handler<WatchRetries> for StoreActor {
    type Result = ();
    fn handle(&mut self, msg: WatchRetries, _ctx: &mut Self::Context) {
        self.retry_watchers.push(msg.0);
    }
}

/// A handle on the running store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    addr: Addr<StoreActor>,
    operations: Arc<AtomicU64>,
}

impl Store {
    /// Opens the database at `path` (creating it and its schema if needed) and starts the
    /// store's thread. Must be called inside an actix system. The database is opened here
    /// first, so that a bad path or a too-new schema is an error now, not on the first call.
    pub fn start(path: &Path) -> Result<Self, StoreError> {
        // Opened (and checked whole) here first, so that a damaged database is an error now;
        // the store's thread then opens it again without repeating the check.
        drop(StoreCore::open(path)?);
        let path: PathBuf = path.to_owned();
        let operations = Arc::new(AtomicU64::new(0));
        let ops = operations.clone();
        let addr = SyncArbiter::start(1, move || {
            let core = StoreCore::open_checked_before(&path);
            if let Err(e) = &core {
                tracing::error!(error = %e, "cannot open the database");
            }
            StoreActor::over(core.map(|c| Box::new(c) as Box<dyn StoreBackend>), ops.clone())
        });
        Ok(Self { addr, operations })
    }

    /// Starts the store's thread over a backend that `open` makes there (called again if the
    /// thread's actor restarts). For a backend that connects lazily (PostgreSQL), `open` does
    /// not fail on an unreachable server: its operations answer [`StoreError::Unavailable`]
    /// until it reconnects.
    pub fn start_with(open: impl Fn() -> Result<Box<dyn StoreBackend>, StoreError> + Send + Sync + 'static) -> Self {
        let operations = Arc::new(AtomicU64::new(0));
        let ops = operations.clone();
        let addr = SyncArbiter::start(1, move || {
            let core = open();
            if let Err(e) = &core {
                tracing::error!(error = %e, "cannot open the database");
            }
            StoreActor::over(core, ops.clone())
        });
        Self { addr, operations }
    }

    /// Opens the PostgreSQL store at `url` (feature `postgres`): the URL is parsed now (a bad
    /// one is an error now); the server is reached from the store's thread, with backoff.
    #[cfg(feature = "postgres")]
    pub fn start_postgres(url: &str) -> Result<Self, StoreError> {
        let config = super::pg::PgStore::config(url)?;
        Ok(Self::start_with(move || Ok(Box::new(super::pg::PgStore::new(config.clone())) as Box<dyn StoreBackend>)))
    }

    /// Sets (`Some`) or clears (`None`) the leader's fence: every later write of
    /// [`Store::exec_lazy`] (the provisioner's and the simulated cloud's) commits only while
    /// the `leader_lease` row names this holder at this epoch and has not expired, else fails
    /// with [`StoreError::Fenced`] having written nothing. PostgreSQL only.
    pub fn set_fence(&self, fence: Option<Fence>) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let req = self.addr.send(SetFence(fence));
        async move { req.await.map_err(StoreError::Stopped)? }
    }

    /// How many operations the store has run (reads and writes alike).
    pub fn operations(&self) -> u64 {
        self.operations.load(Ordering::Relaxed)
    }

    /// Subscribes to the gauges' counts: the current ones now, then each change.
    pub fn watch_counts(&self, to: Recipient<CountsChanged>) {
        self.addr.do_send(WatchCounts(to));
    }

    /// Runs `f` on the store's thread and answers its result; a write it makes is on disk
    /// (fsynced) before the answer. For what an operator's request acknowledges.
    pub fn exec<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn StoreBackend) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let req = self.addr.send(Exec { work: Box::new(f), durable: true, fenced: false });
        async move { req.await.map_err(StoreError::Stopped)? }
    }

    /// Runs `f` like [`Store::exec`], but a write it makes is committed without waiting for
    /// the disk: it survives a crash of the process, and a power cut loses at most a suffix of
    /// such writes (the WAL keeps commits in order). For the provisioner's and the simulated
    /// cloud's own writes, which a restarted provisioner re-derives (tagged instances are
    /// adopted, dead machines harvested again). Its writes are fenced: while a fence is set
    /// ([`Store::set_fence`]), they commit only under the lease it names.
    pub fn exec_lazy<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn StoreBackend) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let req = self.addr.send(Exec { work: Box::new(f), durable: false, fenced: true });
        async move { req.await.map_err(StoreError::Stopped)? }
    }

    /// Subscribes a machine watcher (it hears every machine at once).
    pub fn watch(&self, to: Recipient<MachinesChanged>) {
        self.addr.do_send(Watch(to));
    }

    /// Subscribes a transient-retry watcher.
    pub fn watch_retries(&self, to: Recipient<RetryTick>) {
        self.addr.do_send(WatchRetries(to));
    }
}
