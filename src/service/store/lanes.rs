//! The threads the stores run on (issue 36): a fixed set of lanes, each one thread serving the
//! stores pinned to it, their units of work in the order they arrive. A store's backend blocks
//! (SQLite, and the PostgreSQL client on its own small runtime), so it needs a thread; a thread
//! of its own made every model, idle or not, cost one. A store is pinned to one lane for its
//! life, so its units of work run one at a time and in order, as on a thread of its own. A lane
//! serves its stores with work in turns (round robin, up to [`MAX_TURN`] units each): a busy
//! store's units run back to back, so its group commits stay large, and a quiet store waits for
//! at most one turn of each busy store on its lane. Before another store runs, the last one's
//! turn ends ([`LaneStore::end_turn`]): its open group commits, and a connection it borrowed
//! from the lane goes back (PostgreSQL's stores share one connection per lane:
//! `postgres::pool`).
//!
//! The lanes are the process's, made on first use ([`LANES`], a once-cell: nothing in them is
//! shared but the channels); their number is [`DEFAULT_LANES`] unless [`configure`] set
//! another first (`serve --store-threads`). Stores are spread over them in turn. A store's
//! state (its backend and group) is owned by its lane's thread, and reached only by the jobs
//! sent to it: no lock guards it. A job that panics loses its store (logged; its later work
//! answers [`StoreError::Stopped`](super::StoreError::Stopped)), not the lane.
//!
//! An idle store gives back the memory it keeps only to go faster (SQLite's prepared
//! statements and page cache: most of what an idle model costs): a lane sweeps its stores every
//! [`SWEEP_PERIOD`] (at its next job, or after waiting that long for one), and sheds the memory
//! of each store that ran nothing since the sweep before. A busy store keeps its
//! statements; an idle one prepares them again on its next work.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};

/// How many lanes there are unless configured: `[store] threads`' default.
pub(crate) const DEFAULT_LANES: usize = crate::service::settings::DEFAULT_STORE_THREADS;

/// What a lane runs: a store (the store actor; a test's stand-in), reached by the jobs sent
/// for it.
pub(crate) trait LaneStore: std::any::Any + Send {
    /// Its last handle is gone.
    fn close(&mut self);
    /// It has been idle since the lane's last sweep.
    fn shed_memory(&mut self);
    /// Its lane serves another store next (or stops): what it keeps open between units of
    /// work (a group commit, a connection it borrowed from the lane) is closed or given back.
    fn end_turn(&mut self);
}

/// The most lanes one may configure.
pub(crate) const MAX_LANES: usize = 256;

/// How often a lane sweeps its idle stores (read on the lane's own thread, which waits at most
/// this long for a job: not a timer of any actor).
const SWEEP_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Work for the store `id` on a lane.
type Job = Box<dyn FnOnce(&mut dyn LaneStore) + Send>;

/// What a lane's thread is sent.
enum Envelope {
    /// A new store: made on the lane's thread (its backend opened there).
    Open { id: u64, make: Box<dyn FnOnce() -> Box<dyn LaneStore> + Send> },
    /// A job for a store.
    Run { id: u64, job: Job },
    /// The store's last handle is gone: its open group commits, its backend closes.
    Close { id: u64 },
}

/// The lanes: one channel to each thread.
struct Lanes {
    senders: Vec<mpsc::Sender<Envelope>>,
    /// The next lane a store is pinned to.
    next: AtomicUsize,
    /// The next store id.
    ids: AtomicU64,
}

/// The process's lanes, made on first use.
static LANES: OnceLock<Lanes> = OnceLock::new();

/// The number of lanes to make (0: [`DEFAULT_LANES`]), read when they are made.
static CONFIGURED: AtomicUsize = AtomicUsize::new(0);

/// Sets the number of lanes, before the first store starts: `Ok(())`, or `Err(n)` with the
/// number the lanes already run with if they were made before with another.
pub(crate) fn configure(lanes: usize) -> Result<(), usize> {
    let lanes = lanes.clamp(1, MAX_LANES);
    CONFIGURED.store(lanes, Ordering::SeqCst);
    match LANES.get() {
        Some(made) if made.senders.len() != lanes => Err(made.senders.len()),
        _ => Ok(()),
    }
}

fn wanted() -> usize {
    match CONFIGURED.load(Ordering::SeqCst) {
        0 => DEFAULT_LANES,
        n => n,
    }
}

fn lanes() -> &'static Lanes {
    LANES.get_or_init(|| {
        let senders = (0..wanted())
            .map(|i| {
                let (tx, rx) = mpsc::channel();
                std::thread::Builder::new()
                    .name(format!("store-{i}"))
                    .spawn(move || serve(rx))
                    .expect("cannot start a store thread");
                tx
            })
            .collect();
        Lanes { senders, next: AtomicUsize::new(0), ids: AtomicU64::new(0) }
    })
}

/// The most units of work one store runs in a turn before the lane serves the next store that
/// has work (its turn then ends, its group committed, as at the end of any turn).
const MAX_TURN: usize = 128;

/// What waits on a store's queue.
enum Item {
    Job(Job),
    /// Its last handle is gone (after the work sent before).
    Close,
}

/// One store on its lane: the store, its queue, and the lane's job count when it last ran one.
struct Pinned {
    store: Box<dyn LaneStore>,
    last_job: u64,
    queue: std::collections::VecDeque<Item>,
    /// It is in the lane's ring of stores with work.
    ready: bool,
}

/// A lane: its stores, the ring of those with work, and the store whose turn it is.
struct LaneThread {
    stores: BTreeMap<u64, Pinned>,
    ready: std::collections::VecDeque<u64>,
    /// The store that ran last (its turn not ended yet: it may hold its group open, or a
    /// connection it borrowed).
    current: Option<u64>,
    /// Jobs run.
    jobs: u64,
}

/// A lane's thread: its stores, each reached only by the jobs sent for it. The lane takes in
/// what arrives, store by store, and serves the stores with work in turns (round robin): a
/// store's turn runs its queued work, and what arrives for it meanwhile, up to [`MAX_TURN`]
/// units; before another store runs, the last one's turn ends ([`LaneStore::end_turn`]). So a
/// busy store's units run back to back (its group commits stay large) and a quiet store waits
/// for at most one turn of each busy store on its lane.
fn serve(rx: mpsc::Receiver<Envelope>) {
    let mut lane = LaneThread { stores: BTreeMap::new(), ready: Default::default(), current: None, jobs: 0 };
    // The job count and the time at the last sweep (tokio's clock: outside a runtime, the
    // system's monotonic one).
    let (mut swept, mut last_sweep) = (0u64, tokio::time::Instant::now());
    loop {
        if lane.ready.is_empty() {
            let received = rx.recv_timeout(SWEEP_PERIOD);
            if last_sweep.elapsed() >= SWEEP_PERIOD {
                sweep(&mut lane.stores, swept);
                (swept, last_sweep) = (lane.jobs, tokio::time::Instant::now());
            }
            match received {
                Ok(e) => lane.take(e),
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    lane.end_turn();
                    return;
                }
            }
        }
        while let Ok(e) = rx.try_recv() {
            lane.take(e);
        }
        if let Some(id) = lane.ready.pop_front() {
            lane.turn(id, &rx);
        }
    }
}

impl LaneThread {
    /// Takes in what arrived: a store opened, or an item on its queue.
    fn take(&mut self, envelope: Envelope) {
        let (id, item) = match envelope {
            Envelope::Open { id, make } => {
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(make)) {
                    Ok(store) => {
                        let pinned = Pinned { store, last_job: self.jobs, queue: Default::default(), ready: false };
                        self.stores.insert(id, pinned);
                    }
                    Err(_) => tracing::error!(store = id, "opening a store panicked: it is not running"),
                }
                return;
            }
            Envelope::Run { id, job } => (id, Item::Job(job)),
            Envelope::Close { id } => (id, Item::Close),
        };
        // A store gone (lost to a panic): the job is dropped, and with it its reply, which
        // answers `Stopped`.
        let Some(pinned) = self.stores.get_mut(&id) else { return };
        pinned.queue.push_back(item);
        if !std::mem::replace(&mut pinned.ready, true) {
            self.ready.push_back(id);
        }
    }

    /// Ends the turn of the store that ran last, if it is still there.
    fn end_turn(&mut self) {
        let Some(id) = self.current.take() else { return };
        let Some(pinned) = self.stores.get_mut(&id) else { return };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pinned.store.end_turn())).is_err() {
            tracing::error!(store = id, "ending a store's turn panicked: the store is stopped");
            self.stores.remove(&id);
        }
    }

    /// Store `id`'s turn: its queued work, and what arrives for it meanwhile, up to [`MAX_TURN`]
    /// units.
    fn turn(&mut self, id: u64, rx: &mpsc::Receiver<Envelope>) {
        if self.current != Some(id) {
            self.end_turn();
            self.current = Some(id);
        }
        if let Some(pinned) = self.stores.get_mut(&id) {
            pinned.ready = false;
        }
        for _ in 0..MAX_TURN {
            let Some(pinned) = self.stores.get_mut(&id) else { return };
            let Some(item) = pinned.queue.pop_front() else { return };
            match item {
                Item::Job(job) => {
                    self.jobs += 1;
                    pinned.last_job = self.jobs;
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(pinned.store.as_mut()))).is_err() {
                        tracing::error!(store = id, "a unit of work panicked: the store is stopped");
                        self.stores.remove(&id);
                        self.current = None;
                        return;
                    }
                }
                Item::Close => {
                    if let Some(mut pinned) = self.stores.remove(&id) {
                        pinned.store.close();
                    }
                    self.current = None;
                    return;
                }
            }
            // What arrived meanwhile joins the queues: this store's next work continues its turn.
            while let Ok(e) = rx.try_recv() {
                self.take(e);
            }
        }
        // Its turn is up with work left: it waits for the others' turns.
        if let Some(pinned) = self.stores.get_mut(&id).filter(|p| !p.queue.is_empty() && !p.ready) {
            pinned.ready = true;
            self.ready.push_back(id);
        }
    }
}

/// Sheds the memory of the stores that ran no job since the sweep at job count `swept`.
fn sweep(stores: &mut BTreeMap<u64, Pinned>, swept: u64) {
    for pinned in stores.values_mut().filter(|p| p.last_job <= swept) {
        pinned.store.shed_memory();
    }
}

/// How many lanes run (made now if they were not: tests).
#[cfg(test)]
pub(crate) fn count() -> usize {
    lanes().senders.len()
}

/// A handle on one store on its lane. Cheap to clone; the store closes when the last clone is
/// dropped.
#[derive(Clone)]
pub(crate) struct Lane {
    id: u64,
    /// Which lane it is on.
    #[cfg_attr(not(test), allow(dead_code))]
    lane: usize,
    tx: mpsc::Sender<Envelope>,
    _open: Arc<Opened>,
}

/// Closes its store when dropped (the last handle gone).
struct Opened {
    id: u64,
    tx: mpsc::Sender<Envelope>,
}

impl Drop for Opened {
    fn drop(&mut self) {
        let _ = self.tx.send(Envelope::Close { id: self.id });
    }
}

impl Lane {
    /// Starts a store on the next lane: `make` builds it on the lane's thread.
    pub(crate) fn open(make: impl FnOnce() -> Box<dyn LaneStore> + Send + 'static) -> Self {
        let lanes = lanes();
        let id = lanes.ids.fetch_add(1, Ordering::Relaxed);
        let lane = lanes.next.fetch_add(1, Ordering::Relaxed) % lanes.senders.len();
        let tx = lanes.senders[lane].clone();
        let _ = tx.send(Envelope::Open { id, make: Box::new(make) });
        Self { id, lane, tx: tx.clone(), _open: Arc::new(Opened { id, tx }) }
    }

    /// Runs `job` on the store, after the work sent before it. Dropped (unrun) if the store is
    /// gone.
    pub(crate) fn run(&self, job: impl FnOnce(&mut dyn LaneStore) + Send + 'static) {
        let _ = self.tx.send(Envelope::Run { id: self.id, job: Box::new(job) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in store: the jobs it ran, in order.
    struct Log(futures::channel::mpsc::UnboundedSender<(u64, u32)>, u64);
    impl LaneStore for Log {
        fn close(&mut self) {}
        fn shed_memory(&mut self) {}
        fn end_turn(&mut self) {}
    }

    /// A stand-in store that logs its jobs and the ends of its turns (its closing ends one),
    /// all stores to one log.
    struct Turns(std::sync::mpsc::Sender<(u64, Option<u32>)>, u64);
    impl LaneStore for Turns {
        fn close(&mut self) {
            self.end_turn();
        }
        fn shed_memory(&mut self) {}
        fn end_turn(&mut self) {
            let _ = self.0.send((self.1, None));
        }
    }

    /// On one lane, a store's turn ends before another store's job runs (what lets stores
    /// share a connection), each store's jobs run in order, and a store whose work arrived
    /// together runs it in one turn.
    #[test]
    fn a_stores_turn_ends_before_another_store_runs() {
        let (tx, rx) = std::sync::mpsc::channel();
        // Every store on the same lane: as many stores as lanes apart.
        let n = count();
        let stores: Vec<Lane> = (0..3 * n as u64)
            .map(|i| {
                let tx = tx.clone();
                Lane::open(move || Box::new(Turns(tx, i)))
            })
            .collect();
        // (Other tests open stores meanwhile: those on the first one's lane.)
        let ours: Vec<(u64, &Lane)> = (0u64..).zip(&stores).filter(|(_, l)| l.lane == stores[0].lane).take(3).collect();
        assert!(ours.len() >= 2, "stores on one lane");
        for round in 0..20u32 {
            for (_, lane) in &ours {
                lane.run(move |s| {
                    let t = (s as &mut dyn std::any::Any).downcast_mut::<Turns>().unwrap();
                    let _ = t.0.send((t.1, Some(round)));
                });
            }
        }
        let ids: Vec<u64> = ours.iter().map(|(i, _)| *i).collect();
        drop(tx);
        drop(stores);
        let log: Vec<(u64, Option<u32>)> = rx.iter().collect();
        let jobs: Vec<&(u64, Option<u32>)> = log.iter().filter(|(s, j)| j.is_some() && ids.contains(s)).collect();
        assert_eq!(jobs.len(), 20 * ids.len());
        // Between two jobs of different stores, the first store's turn ended.
        let mut running: Option<u64> = None;
        for (store, job) in log.iter().filter(|(s, _)| ids.contains(s)) {
            match job {
                Some(_) => {
                    assert!(
                        running.is_none() || running == Some(*store),
                        "{store} ran inside {running:?}'s turn: {log:?}"
                    );
                    running = Some(*store);
                }
                None if running == Some(*store) => running = None,
                None => {}
            }
        }
        for id in ids {
            let order: Vec<u32> = log.iter().filter(|(s, _)| *s == id).filter_map(|(_, j)| *j).collect();
            assert_eq!(order, (0..20).collect::<Vec<_>>(), "store {id}'s jobs in order");
        }
    }

    /// A hundred stores share the lanes: the lanes are all the threads there are, however many
    /// stores run, and each store's jobs run in the order they were sent.
    #[test]
    fn a_hundred_stores_run_on_the_lanes_their_jobs_in_order() {
        use futures::StreamExt;
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let lanes: Vec<Lane> = (0..100)
            .map(|i| {
                let tx = tx.clone();
                Lane::open(move || Box::new(Log(tx, i)))
            })
            .collect();
        drop(tx);
        for n in 0..10 {
            for lane in &lanes {
                lane.run(move |s| {
                    let log = (s as &mut dyn std::any::Any).downcast_mut::<Log>().unwrap();
                    log.0.unbounded_send((log.1, n)).unwrap();
                });
            }
        }
        let threads = std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0);
        assert!(threads < 100, "{threads} threads for 100 stores");
        drop(lanes);
        let ran: Vec<(u64, u32)> = futures::executor::block_on(rx.collect());
        assert_eq!(ran.len(), 1000);
        for store in 0..100 {
            let order: Vec<u32> = ran.iter().filter(|(s, _)| *s == store).map(|(_, n)| *n).collect();
            assert_eq!(order, (0..10).collect::<Vec<_>>(), "store {store}'s jobs in order");
        }
    }
}
