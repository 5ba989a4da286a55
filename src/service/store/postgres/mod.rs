//! The PostgreSQL backend (feature `postgres`): the same operations as the SQLite core, over one
//! connection at a time ([`PgClient`]): its lane's, shared by a replica's stores in turns.
//!
//! The layout: the types here ([`PgStore`], a write's transaction, an open group commit);
//! `pool.rs` its connection and where it comes from (its own, or its lane's, shared by a
//! replica's stores); `client.rs` the connection's client; `connect.rs` (re)connecting and migrating;
//! `schema.rs` the migrations; `conn.rs` running statements; `rows.rs` rows, reads and the writes
//! several operations share; `group.rs` group commits; `deferred.rs` write-behind units as
//! set-based statements; `backend.rs` [`StoreBackend`](super::StoreBackend) for [`PgStore`]. Each file sees the
//! others' items by name (no file imports one that imports it).
//!
//! The connection: the store runs each unit of work synchronously on its lane's thread
//! (`store::lanes`), on the lane's connection of its pool (`pool.rs`), one transaction at a time, so it blocks on its statements as the `postgres`
//! crate does; but it speaks through `tokio-postgres` on a runtime of its own (`client.rs`) so
//! that statements which do not need each other's answers go out together, answered in one
//! round trip: a group's `BEGIN`, savepoints and releases with the next statement, a machine's
//! read-lock, update and notice together (what a PostgreSQL store spends its time on is round
//! trips). When the connection drops, the next operation reconnects, with backoff between
//! attempts (the operations in between answer [`StoreError::Unavailable`]: never stale data).
//!
//! Schema: versioned migrations ([`PG_SCHEMA_VERSION`], table `schema_migrations`), applied at
//! each connection in one transaction under `pg_advisory_xact_lock`, so replicas starting
//! together do not race; a database whose schema is newer than this build is refused, naming
//! both versions. The schema includes `leader_lease`, the lease the fence checks.
//!
//! Fencing: with a [`Fence`] set, every write the actor marks as the provisioner's own runs
//! `SELECT 1 FROM leader_lease WHERE model_uuid=$1 AND holder=$2 AND epoch=$3 AND expires_at >
//! now() FOR SHARE` first, in its own transaction, and fails with [`StoreError::Fenced`]
//! (nothing written) if no row matches. A write that passes records its epoch in the same
//! transaction ([`RECORD_WRITE_SQL`]: `epoch_writes`, one row per model, epoch, holder and
//! writing session, with the count and the last value drawn from `fence_seq` while the lease row
//! was share-locked);
//! each acquisition records its epoch in `lease_epochs` with a value of the same sequence drawn
//! after it locked the row. So a write committed under a stale epoch would show as an
//! `epoch_writes` row whose `last_seq` is above the `acquired_seq` of a later epoch: see
//! `lease::pg::audit_epochs`, which the fault tests run. Both tables stay small (a row per
//! epoch).
//!
//! Change notification: every transaction that changes machines (or the model's life, or the
//! settings) runs `pg_notify('provisioner_changes', JSON)` before its commit, so the
//! notification is delivered exactly when (and only if) the change commits. The JSON is
//! [`Notice`]: `{"model_uuid": "...", "kind": "machines"|"model"|"settings", "ids": [...],
//! "all": false}`; `all: true` (ids empty) when the ids would not fit in a payload.

#[macro_use]
mod macros;

mod backend;
mod client;
mod conn;
mod connect;
mod deferred;
mod group;
#[cfg(test)]
mod group_tests;
mod pool;
mod rows;
mod schema;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::Duration;

use postgres::Statement;
use tokio::time::Instant;

use self::client::PgClient;
use super::backend::Fence;
use super::errors::StoreError;
use super::records::{Book, BookMark};
use super::writes::{Write, Written};

pub(crate) use self::pool::new_pool;
use self::pool::{Conn, Source};
pub(crate) use self::schema::EPOCH_TABLES_SQL;

/// The newest schema version this build knows (rows of `schema_migrations`).
pub const PG_SCHEMA_VERSION: i64 = 12;

/// The channel of change notifications.
pub(crate) const CHANGES_CHANNEL: &str = "provisioner_changes";

/// The advisory lock key migrations hold (`pg_advisory_xact_lock`): "prov" in ASCII.
pub(crate) const MIGRATION_LOCK: i64 = 0x7072_6f76;

/// How long the server lets a store's session sit idle inside a transaction before it ends
/// the session (its locks released, its writes rolled back): shorter than any lease minus
/// its retry, so that a partitioned leader's open transaction never holds the lease row past
/// the lease's expiry.
pub(super) const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(2);

/// The longest one statement of the store may run on the server (`statement_timeout`, and
/// `lock_timeout` for its lock waits): past it the server cancels the statement (its
/// transaction fails and is rolled back), so no operation of the store waits on the database
/// for ever — a lock held by a session that will never let go, or a server that stopped
/// answering. The store's thread waits [`CALL_SLACK`] longer for the answer, then closes the
/// connection itself. Shorter than the lease's default renew deadline, so that one stuck call
/// never outlasts the leader's proof of progress (see `lease::state`).
pub(super) const STATEMENT_DEADLINE: Duration = Duration::from_secs(5);
/// How much longer than [`STATEMENT_DEADLINE`] the store's thread waits for a call's answer
/// before it gives the connection up (the server's own cancel comes first when it can).
pub(super) const CALL_SLACK: Duration = Duration::from_secs(1);
/// The deadline of the schema's migrations, at each connection (they may rewrite tables).
const MIGRATION_DEADLINE: Duration = Duration::from_secs(120);

/// The most units of work one group commit holds, and the longest it takes them in after its
/// transaction began: each unit costs round trips to the server (a SQLite one costs
/// microseconds), and the first unit's answer waits for the last; a unit that is long by
/// itself (an add of 1,000 machines) commits right after it, answered as soon as alone. With
/// its statements pipelined a unit costs about two round trips, so the time bound is the one
/// that holds; 128 units (from 32) measured no slower adds and a slightly faster run
/// (`docs/performance.md`, "Fewer round trips on PostgreSQL"). While the provisioner writes, a
/// group rarely finds its mailbox empty, so the time bound is what an operator's add waits for:
/// 2 ms took single adds from 16 clients from 971 to 1,538 requests/s (medians of 5), but the
/// tests that make a group of several units on a loaded debug build need the 10 ms
/// (`docs/performance.md`, "the fifth pass", step 6).
const MAX_GROUP: usize = 128;
const MAX_GROUP_TIME: Duration = Duration::from_millis(10);
/// Ids per notification at most (a payload must stay under 8000 bytes).
const MAX_NOTIFIED_IDS: usize = 200;

/// A change notification's payload (JSON on channel [`CHANGES_CHANNEL`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Notice {
    /// The model changed.
    pub model_uuid: String,
    /// What changed: `machines`, `model` (its life) or `settings`.
    pub kind: String,
    /// The machines changed (empty when `all`, or for `model` and `settings`).
    pub ids: Vec<String>,
    /// Too many ids for one payload: re-read every machine.
    pub all: bool,
}

/// A write's transaction on a [`Conn`]: a transaction of its own (`BEGIN` ... `COMMIT`, rolled
/// back if dropped before [`Tx::commit`]), or, inside a group commit, a savepoint in the
/// group's transaction (released by [`Tx::commit`], rolled back alone if dropped before).
struct Tx<'a> {
    client: &'a mut PgClient,
    statements: &'a mut HashMap<String, Statement>,
    /// The group commit it is part of (`None`: a transaction of its own).
    group: Option<&'a mut PgGroup>,
    /// Whether it passed the leader's fence (a write recorded in `epoch_writes`).
    fenced: bool,
    /// In a group, whether it has a savepoint of its own (`write`): only when its unit of work
    /// has kept a write before it. A unit's first write needs none: if it fails, the unit's
    /// own savepoint (`member`) is rolled back to, which undoes no more than it.
    savepoint: bool,
    done: bool,
}

/// Statements at a group's level (outside its units of work's savepoints).
struct GroupRun<'a> {
    client: &'a mut PgClient,
    statements: &'a mut HashMap<String, Statement>,
}

/// A group commit open on the store's connection (see
/// [`StoreBackend::begin_group`](super::StoreBackend::begin_group)): one
/// transaction that the units of work share, each in a savepoint (`member`) of its own, each
/// write inside it in a nested one (`write`), committed at once.
///
/// Round trips are what a PostgreSQL store spends its time on, so the group sends as few as
/// it can: `BEGIN`, the savepoints and their releases are queued on the connection and go out
/// pipelined with the next statement, answered in its round trip ([`PgClient`]); a group that
/// only read never begins a transaction (its reads see committed data, as outside a group).
/// The leader's fence is checked once per group
/// (its share lock on the lease row then lasts until the group's commit), and the writes that
/// passed it are recorded in `epoch_writes` once, at the commit, under that lock.
#[derive(Debug, Default)]
struct PgGroup {
    /// The book before the group.
    before: BookMark,
    /// The book before the unit of work in progress, if one is.
    member: Option<BookMark>,
    /// Whether its commit waits for the server's disk.
    durable: bool,
    /// `BEGIN` is sent (or queued on the connection).
    begun: bool,
    /// When `BEGIN` was queued.
    began: Option<Instant>,
    /// The unit of work in progress has its savepoint (sent or queued).
    member_savepoint: bool,
    /// A write was kept in the group.
    written: bool,
    /// Why the group's transaction is gone (a statement outside any savepoint failed, or the
    /// connection was lost): its commit fails with this.
    broken: Option<StoreError>,
    /// The fence checked in this group: passed (the lease row share-locked), or refused.
    fence: Option<Result<(), StoreError>>,
    /// The fence was checked inside the unit of work in progress (its rollback releases the
    /// lock, so the next fenced write checks again).
    fence_in_member: bool,
    /// The unit of work in progress kept a write (its next write needs a savepoint of its own).
    member_wrote: bool,
    /// Fenced writes kept in the group, and in the unit of work in progress.
    fenced_writes: i64,
    member_fenced_writes: i64,
    /// The write-behind units queued for the commit ([`StoreBackend::defer`](super::StoreBackend::defer)).
    deferred: Vec<Write>,
}

/// The store over PostgreSQL. One connection at a time: its own, (re)made on demand with
/// backoff, or its lane's, borrowed for a turn (see `pool`).
pub(crate) struct PgStore {
    /// What it connects with (within the configured connect timeout, start-up included).
    config: tokio_postgres::Config,
    /// The URL's TLS settings (`sslmode`, `sslrootcert`).
    tls: crate::service::pgtls::PgTls,
    /// The connection it holds now.
    client: Option<Conn>,
    source: Source,
    /// The connection (its generation) this store last set itself up on: its schema migrated,
    /// its model read and its counts made.
    attached: Option<u64>,
    /// The session it last wrote on (what its change notices carry).
    last_pid: Option<i32>,
    /// The model's uuid, read at the first connection (it never changes).
    model_uuid: Option<String>,
    book: Book,
    /// The leader's fence, if set.
    fence: Option<Fence>,
    /// Whether the current unit of work is the provisioner's (checked against the fence).
    fenced: bool,
    /// Whether commits wait for the server's disk (`synchronous_commit`).
    durable: bool,
    /// This store created the model (applied the first migration on an empty database).
    created: bool,
    /// The group commit open, if one is.
    group: Option<PgGroup>,
    /// The answers of the write-behind units of the group that last committed.
    deferred_results: Vec<Result<Written, StoreError>>,
}
