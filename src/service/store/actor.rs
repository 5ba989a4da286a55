//! The store actor: owns the SQLite connection on its own thread, and notifies watchers.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;

use super::messages::{CountsChanged, Exec, Watch, WatchCounts, WatchRetries};
use super::state::{StoreCore, StoreError};
use crate::{MachinesChanged, RetryTick};

/// Owns the connection (one `SyncArbiter` thread: SQLite calls block) and the watchers.
pub struct StoreActor {
    core: Result<StoreCore, StoreError>,
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
    pub fn new(core: StoreCore) -> Self {
        Self::over(Ok(core), Arc::default())
    }

    fn over(core: Result<StoreCore, StoreError>, operations: Arc<AtomicU64>) -> Self {
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
                let result = core.set_durable(msg.durable).and_then(|()| (msg.work)(core));
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

impl Handler<Watch> for StoreActor {
    type Result = ();
    fn handle(&mut self, msg: Watch, _ctx: &mut Self::Context) {
        match self.core.as_ref().map_err(Clone::clone).and_then(StoreCore::machine_ids) {
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
            StoreActor::over(core, ops.clone())
        });
        Ok(Self { addr, operations })
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
        f: impl FnOnce(&mut StoreCore) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let req = self.addr.send(Exec { work: Box::new(f), durable: true });
        async move { req.await.map_err(|e| StoreError::Unavailable(e.to_string()))? }
    }

    /// Runs `f` like [`Store::exec`], but a write it makes is committed without waiting for
    /// the disk: it survives a crash of the process, and a power cut loses at most a suffix of
    /// such writes (the WAL keeps commits in order). For the provisioner's and the simulated
    /// cloud's own writes, which a restarted provisioner re-derives (tagged instances are
    /// adopted, dead machines harvested again).
    pub fn exec_lazy<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut StoreCore) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let req = self.addr.send(Exec { work: Box::new(f), durable: false });
        async move { req.await.map_err(|e| StoreError::Unavailable(e.to_string()))? }
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
