//! Connections the stores of a lane share (issue 36): a replica's PostgreSQL stores (every
//! model's, and their simulated clouds') belong to one *pool*, and each lane's thread
//! (`store::lanes`) keeps one connection per pool, which the stores pinned to that lane borrow in
//! turn. So a replica holds at most one store connection per lane, however many models it hosts.
//!
//! A store borrows its lane's connection at its first statement of a turn and gives it back
//! when the lane ends its turn (`LaneStore::end_turn`), after its open group has committed: a
//! connection is never handed over inside a transaction, or with statements queued on it (one
//! that is, is closed instead: the next borrower dials a new one). Each model lives in a schema
//! of its own; the borrower sets the session's `search_path` to its schema when the connection
//! last served another one, by a statement of its own outside any transaction (a `SET` in a
//! transaction would be undone by its rollback). The statements are prepared per schema: one
//! prepared under another `search_path` would be parsed and planned again by the server at
//! each change of path (it sees the new path's tables), which with a lane's stores taking turns
//! made planning a third of the server's time (issue 36's profile); so a connection keeps each
//! schema's prepared statements, the last few dozen schemas' at most (`PREPARED_SCHEMAS`).
//!
//! The slots live in a thread-local map on the lane's thread, keyed by pool: reached only
//! from that thread, one store at a time, as a lane runs one unit of work at a time. A store
//! outside a pool (tests, a store of its own) keeps a connection of its own, as before.
//!
//! Dialing (either way) waits out a backoff after a failure ([`Dialer`]); PostgreSQL's refusal
//! of one more connection (SQLSTATE 53300) is reported as what it is, with what to change.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use postgres::Statement;
use std::collections::HashMap;

use super::client::PgClient;
use crate::service::store::errors::StoreError;

/// The longest wait between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The first wait after a failed attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// How long a connection may go without an answer before it is checked before a store runs on
/// it: the server may have ended the session meanwhile (a restart, an administrator), and the
/// client learns of it only when it next reads, so the unit of work that made that call would
/// fail for nothing (seen after a restart of the server: an operator's add through a replica
/// whose connection had been idle since). Past [`QUIET_AFTER`] the connection reads what the
/// server sent meanwhile (no round trip: a session the server ended said so at once); past
/// `CHECK_AFTER` it is also asked an empty statement (one round trip: a server that went away
/// without a word).
pub(super) const CHECK_AFTER: Duration = Duration::from_secs(2);
/// See [`CHECK_AFTER`]: a connection that answered more recently than this is taken as it is.
pub(super) const QUIET_AFTER: Duration = Duration::from_millis(100);

/// The connection and the statements prepared on it (a store's own, or its lane's, which the
/// stores of its pool borrow in turn: see `pool`).
pub(super) struct Conn {
    pub(super) client: PgClient,
    pub(super) statements: HashMap<String, Statement>,
    /// The session's backend process id (what its notifications carry).
    pub(super) pid: i32,
    /// Which connection this is (a store sets itself up again on each new one).
    pub(super) generation: u64,
    /// The schema the session's `search_path` was last set to by a borrower (`None`: the
    /// session's own, the URL's).
    pub(super) search_path: Option<String>,
    /// The statements prepared for the other schemas the connection served, each set with
    /// when it was last put aside (`statements` are the current schema's: a statement
    /// prepared under one `search_path` and run under another is parsed and planned again by
    /// the server, each time the path changes; see `pool`). At most [`PREPARED_SCHEMAS`].
    pub(super) aside: HashMap<Option<String>, (u64, HashMap<String, Statement>)>,
    /// Schema switches made (the order of `aside`).
    pub(super) switches: u64,
    /// The session's `synchronous_commit` (`None`: not set on this connection yet).
    pub(super) durable: Option<bool>,
}

/// The most schemas whose prepared statements a shared connection keeps aside (about twenty
/// statements each, their plans in the server's session): the stores of a lane beyond these,
/// least recently served first, prepare theirs again at their next turn.
const PREPARED_SCHEMAS: usize = 64;

impl Conn {
    /// The session's `search_path` is now `schema`'s: the statements prepared under it (if
    /// kept) become the current ones, the last schema's are put aside; past
    /// [`PREPARED_SCHEMAS`], the set put aside longest ago is dropped (its statements closed
    /// on the server).
    pub(super) fn switch_statements(&mut self, schema: Option<String>) {
        self.switches += 1;
        let mine = self.aside.remove(&schema).map(|(_, s)| s).unwrap_or_default();
        let theirs = std::mem::replace(&mut self.statements, mine);
        let left = std::mem::replace(&mut self.search_path, schema);
        if !theirs.is_empty() {
            self.aside.insert(left, (self.switches, theirs));
        }
        if self.aside.len() > PREPARED_SCHEMAS {
            if let Some(oldest) = self.aside.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| k.clone()) {
                self.aside.remove(&oldest);
            }
        }
    }
}

/// Where a store's connection comes from.
#[derive(Debug)]
pub(super) enum Source {
    /// A connection of its own, (re)made on demand with backoff (tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Own(Dialer),
    /// Its lane's connection of the pool `pool` (see `pool`), borrowed for a turn, the
    /// session's `search_path` set to `schema` (`None`: the URL's own).
    Pooled { pool: u64, schema: Option<String> },
}

/// The SQLSTATE of PostgreSQL's refusal of one more connection (`too_many_connections`).
pub(super) const TOO_MANY_CONNECTIONS: &str = "53300";

/// The pools made so far (a pool's id).
static POOLS: AtomicU64 = AtomicU64::new(1);

/// The connections made so far (a connection's generation: a store set up on one connection
/// sets itself up again on the next).
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// A new pool's id.
pub(crate) fn new_pool() -> u64 {
    POOLS.fetch_add(1, Ordering::Relaxed)
}

/// A new connection's generation.
pub(super) fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, Ordering::Relaxed)
}

/// Dials with backoff: after a failed attempt the next waits (100 ms, doubling up to 5 s), and
/// the operations in between answer [`StoreError::Unavailable`] with the last failure.
#[derive(Debug)]
pub(super) struct Dialer {
    backoff: Duration,
    next_attempt: Option<Instant>,
    last_failure: Option<String>,
}

impl Default for Dialer {
    fn default() -> Self {
        Self { backoff: FIRST_BACKOFF, next_attempt: None, last_failure: None }
    }
}

impl Dialer {
    /// Makes a connection with `dial`, unless the backoff says to wait.
    pub(super) fn dial(&mut self, dial: impl FnOnce() -> Result<Conn, StoreError>) -> Result<Conn, StoreError> {
        let now = Instant::now();
        if let Some(at) = self.next_attempt.filter(|at| now < *at) {
            let why = self.last_failure.clone().unwrap_or_default();
            return Err(StoreError::Unavailable(format!("{why} (next attempt in {} ms)", (at - now).as_millis())));
        }
        match dial() {
            Ok(conn) => {
                if self.last_failure.take().is_some() {
                    tracing::info!("the database is reachable again");
                }
                self.backoff = FIRST_BACKOFF;
                self.next_attempt = None;
                Ok(conn)
            }
            Err(StoreError::Postgres { context, source })
                if source.connection_lost || source.code.as_deref() == Some(TOO_MANY_CONNECTIONS) =>
            {
                let why = if source.code.as_deref() == Some(TOO_MANY_CONNECTIONS) {
                    let why = format!(
                        "PostgreSQL refuses more connections (SQLSTATE 53300, too many clients: {}): \
                         raise the server's max_connections, or lower --store-threads (a replica's \
                         stores hold at most one connection per store thread)",
                        source.message
                    );
                    tracing::error!(error = %why, retry_in_ms = self.backoff.as_millis() as u64, "cannot connect to the database");
                    why
                } else {
                    let why = format!("{context}: {}", source.message);
                    tracing::warn!(error = %why, retry_in_ms = self.backoff.as_millis() as u64, "cannot reach the database; retrying with backoff");
                    why
                };
                self.last_failure = Some(why.clone());
                self.next_attempt = Some(now + self.backoff);
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                Err(StoreError::Unavailable(why))
            }
            Err(e) => Err(e),
        }
    }
}

/// One pool's connection on one lane.
#[derive(Default)]
struct Slot {
    /// The connection, when no store has borrowed it.
    conn: Option<Conn>,
    dialer: Dialer,
    /// The pool's stores on this lane (the slot goes, and its connection closes, with the last).
    stores: usize,
}

thread_local! {
    /// This lane's slots, by pool.
    static SLOTS: RefCell<BTreeMap<u64, Slot>> = const { RefCell::new(BTreeMap::new()) };
}

/// A store of `pool` is on this lane.
pub(super) fn join(pool: u64) {
    SLOTS.with_borrow_mut(|slots| slots.entry(pool).or_default().stores += 1);
}

/// A store of `pool` leaves this lane: the last one closes the connection.
pub(super) fn leave(pool: u64) {
    // Not during the thread's own teardown (the map may be gone already).
    let _ = SLOTS.try_with(|slots| {
        let mut slots = slots.borrow_mut();
        if let Some(slot) = slots.get_mut(&pool) {
            slot.stores = slot.stores.saturating_sub(1);
            if slot.stores == 0 {
                slots.remove(&pool);
            }
        }
    });
}

/// Borrows `pool`'s connection on this lane, dialed with `dial` if there is none (or it was
/// lost), as its backoff allows.
pub(super) fn borrow(pool: u64, dial: impl FnOnce() -> Result<Conn, StoreError>) -> Result<Conn, StoreError> {
    SLOTS.with_borrow_mut(|slots| {
        let slot = slots.entry(pool).or_default();
        match slot.conn.take().filter(|c| !c.client.is_closed()).and_then(still_there) {
            Some(conn) => Ok(conn),
            None => slot.dialer.dial(dial),
        }
    })
}

/// `conn` if it is still there: it answered within [`QUIET_AFTER`], or it has statements
/// queued or a transaction open (it is in use: not checked), or the server has not ended it
/// (what it sent meanwhile is read) and it answered within [`CHECK_AFTER`] or answers an empty
/// statement now. `None`: it is gone (closed here), and the caller dials a new one.
pub(super) fn still_there(mut conn: Conn) -> Option<Conn> {
    if conn.client.answered_within(QUIET_AFTER) || !conn.client.is_idle() {
        return Some(conn);
    }
    conn.client.drive();
    if conn.client.is_closed() {
        tracing::info!(
            pid = conn.pid,
            "a database connection idle for a while was ended by the server: connecting again"
        );
        return None;
    }
    if conn.client.answered_within(CHECK_AFTER) {
        return Some(conn);
    }
    match conn.client.batch_execute("") {
        Ok(()) => Some(conn),
        Err(e) => {
            tracing::info!(error = %e, pid = conn.pid, "a database connection idle for a while is gone: connecting again");
            None
        }
    }
}

/// Gives `conn` back to `pool`'s slot on this lane: only a connection outside any transaction,
/// with nothing queued on it (else it is closed).
pub(super) fn give_back(pool: u64, conn: Conn) {
    if conn.client.is_closed() || !conn.client.is_idle() {
        return;
    }
    SLOTS.with_borrow_mut(|slots| {
        if let Some(slot) = slots.get_mut(&pool) {
            if slot.conn.is_none() {
                slot.conn = Some(conn);
            }
        }
    });
}
