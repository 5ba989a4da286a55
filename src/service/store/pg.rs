//! The PostgreSQL backend (feature `postgres`): the same operations as the SQLite core, over one
//! connection owned by the store's thread ([`PgClient`]).
//!
//! The connection: the store runs each unit of work synchronously on a dedicated thread
//! (`SyncArbiter`), one transaction at a time, so it blocks on its statements as the `postgres`
//! crate does; but it speaks through `tokio-postgres` on a runtime of its own (`pg_client`) so
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

use std::time::Duration;

use std::borrow::BorrowMut;
use std::collections::HashMap;

use postgres::types::ToSql;
use postgres::{Config, Row, Statement};
use tokio::time::Instant;

use super::backend::{refuse_hosts_with_live_containers, Fence, StoreBackend};
use super::errors::{PgFailure, StoreError};
use super::pg_client::{CallError, ConnectError, PgClient, Piped, Reply};
use super::records::{
    random_uuid, token_record, ApplicationRecord, Book, BookMark, InstanceRecord, MachineRecord, NewMachine, Settings,
    StoreCounts, CONTAINER_SEQ_BASE,
};
use super::writes::{Write, Written};
use crate::model::{
    CloudInstance, Constraints, HarvestMode, InstanceId, InstanceState, InstanceStatus, InstanceTags, Life, Machine,
    MachineId, MachineStatus, ProvisioningInfo,
};
use crate::ports::ProvisionedInstance;
use crate::service::token::{token_id, Scope, TokenRecord};

/// The newest schema version this build knows (rows of `schema_migrations`).
pub const PG_SCHEMA_VERSION: i64 = 10;

/// The channel of change notifications.
pub const CHANGES_CHANNEL: &str = "provisioner_changes";

/// The advisory lock key migrations hold (`pg_advisory_xact_lock`): "prov" in ASCII.
pub(crate) const MIGRATION_LOCK: i64 = 0x7072_6f76;

/// How long the server lets a store's session sit idle inside a transaction before it ends
/// the session (its locks released, its writes rolled back): shorter than any lease minus
/// its retry, so that a partitioned leader's open transaction never holds the lease row past
/// the lease's expiry.
pub const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(2);

/// The longest one statement of the store may run on the server (`statement_timeout`, and
/// `lock_timeout` for its lock waits): past it the server cancels the statement (its
/// transaction fails and is rolled back), so no operation of the store waits on the database
/// for ever — a lock held by a session that will never let go, or a server that stopped
/// answering. The store's thread waits [`CALL_SLACK`] longer for the answer, then closes the
/// connection itself. Shorter than the lease's default renew deadline, so that one stuck call
/// never outlasts the leader's proof of progress (see `lease::state`).
pub const STATEMENT_DEADLINE: Duration = Duration::from_secs(5);
/// How much longer than [`STATEMENT_DEADLINE`] the store's thread waits for a call's answer
/// before it gives the connection up (the server's own cancel comes first when it can).
pub const CALL_SLACK: Duration = Duration::from_secs(1);
/// The deadline of the schema's migrations, at each connection (they may rewrite tables).
const MIGRATION_DEADLINE: Duration = Duration::from_secs(120);

/// The longest wait between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The first wait after a failed attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
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

/// Version 1: the whole model, the simulated cloud, and the leader lease.
const SCHEMA_V1: &str = r#"
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE constraints (
    id BIGSERIAL PRIMARY KEY,
    spec TEXT NOT NULL UNIQUE,
    zones TEXT,
    arch TEXT,
    cores BIGINT,
    mem_mb BIGINT,
    root_disk_mb BIGINT,
    instance_type TEXT,
    spaces TEXT,
    tags TEXT
);
CREATE TABLE applications (
    name TEXT PRIMARY KEY,
    constraints_id BIGINT REFERENCES constraints(id)
);
CREATE TABLE machines (
    seq BIGINT PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    life TEXT NOT NULL DEFAULT 'alive',
    status TEXT NOT NULL DEFAULT 'pending',
    status_message TEXT NOT NULL DEFAULT '',
    instance_status TEXT NOT NULL DEFAULT '',
    instance_status_message TEXT NOT NULL DEFAULT '',
    instance TEXT,
    zone TEXT,
    nonce TEXT,
    display_name TEXT NOT NULL DEFAULT '',
    zones TEXT,
    keep_instance BOOLEAN NOT NULL DEFAULT false,
    transient BOOLEAN NOT NULL DEFAULT false,
    constraints_id BIGINT REFERENCES constraints(id),
    placement TEXT,
    application TEXT,
    changed_at TEXT,
    manual BOOLEAN NOT NULL DEFAULT false,
    address TEXT
);
CREATE INDEX machines_by_application ON machines(application) WHERE application IS NOT NULL;
CREATE FUNCTION machines_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (TG_OP = 'INSERT' AND NEW.changed_at IS NULL)
       OR (TG_OP = 'UPDATE' AND NEW.changed_at IS NOT DISTINCT FROM OLD.changed_at) THEN
        NEW.changed_at := to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER machines_stamp BEFORE INSERT OR UPDATE ON machines
    FOR EACH ROW EXECUTE FUNCTION machines_stamp();
CREATE TABLE instances (
    seq BIGINT PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    zone TEXT,
    model TEXT,
    machine TEXT,
    start TEXT,
    client_token TEXT UNIQUE
);
CREATE TABLE leader_lease (
    model_uuid TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
"#;

/// Every migration, in order: version `n` takes a database from `n - 1` to `n`.
/// Version 2: each machine's start attempts and its last start error (`machine show`).
const SCHEMA_V2: &str = "
ALTER TABLE machines ADD COLUMN IF NOT EXISTS start_attempts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE machines ADD COLUMN IF NOT EXISTS last_start_error TEXT;
";

/// Version 3: the epochs' record ([`EPOCH_TABLES_SQL`]): each lease acquisition and the writes
/// made under each epoch, ordered by one sequence (what proves no write committed under a
/// stale epoch).
const MIGRATIONS: &[(i64, &str)] = &[
    (1, SCHEMA_V1),
    (2, SCHEMA_V2),
    (3, EPOCH_TABLES_SQL),
    (4, SCHEMA_V4),
    (5, SCHEMA_V5),
    (6, SCHEMA_V6),
    (7, SCHEMA_V7),
    (8, SCHEMA_V8),
    (9, SCHEMA_V9),
    (10, SCHEMA_V10),
];

/// The epochs' record, created by migration 3 (and by the lease where missing, so that the
/// lease can be used and tested on its own): `fence_seq` orders acquisitions and fenced writes;
/// `lease_epochs` has a row per acquisition (`acquired_seq` drawn after the lease row was
/// locked); `epoch_writes` a row per model, epoch, holder and writing session (`writer`, its
/// backend's process id: schema version 9; the writes' count and the last `fence_seq` value
/// drawn by one of them while it held the lease row share-locked).
pub const EPOCH_TABLES_SQL: &str = "
CREATE SEQUENCE IF NOT EXISTS fence_seq;
CREATE TABLE IF NOT EXISTS lease_epochs (
    model_uuid TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    holder TEXT NOT NULL,
    acquired_seq BIGINT NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (model_uuid, epoch)
);
CREATE TABLE IF NOT EXISTS epoch_writes (
    model_uuid TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    holder TEXT NOT NULL,
    writes BIGINT NOT NULL,
    first_seq BIGINT NOT NULL,
    last_seq BIGINT NOT NULL,
    writer INT NOT NULL DEFAULT 0,
    PRIMARY KEY (model_uuid, epoch, holder, writer)
);
";

/// What a fenced write records, in its transaction, once the fence passed (the lease row is
/// share-locked, so no acquisition can draw from `fence_seq` until this commits): `$1` model,
/// `$2` holder, `$3` epoch.
pub const RECORD_WRITE_SQL: &str =
    "INSERT INTO epoch_writes AS w (model_uuid, epoch, holder, writer, writes, first_seq, last_seq)
    SELECT $1, $3, $2, pg_backend_pid(), 1, s, s FROM nextval('fence_seq') AS s
    ON CONFLICT (model_uuid, epoch, holder, writer) DO UPDATE SET writes = w.writes + 1, last_seq = EXCLUDED.last_seq";

/// [`RECORD_WRITE_SQL`] for a group commit's fenced writes, recorded at once just before its
/// commit (the lease row share-locked since the group checked the fence): `$4` writes.
const RECORD_WRITES_SQL: &str = "INSERT INTO epoch_writes AS w (model_uuid, epoch, holder, writer, writes, first_seq, last_seq)
    SELECT $1, $3, $2, pg_backend_pid(), $4, s, s FROM nextval('fence_seq') AS s
    ON CONFLICT (model_uuid, epoch, holder, writer) DO UPDATE SET writes = w.writes + EXCLUDED.writes, last_seq = EXCLUDED.last_seq";

/// Version 4: the created API tokens (their SHA-256 only), looked up by hash on every request
/// that carries one.
const SCHEMA_V4: &str = "
CREATE TABLE IF NOT EXISTS api_tokens (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    scope TEXT NOT NULL,
    sha256 TEXT NOT NULL UNIQUE,
    created TEXT NOT NULL,
    revoked TEXT
);
";

/// Version 5: start intents (each start's client token, machine and parameters, written fenced
/// before the cloud call and dropped once settled; `service::intents`).
const SCHEMA_V5: &str = "
CREATE TABLE IF NOT EXISTS start_intents (
    seq BIGSERIAL PRIMARY KEY,
    client_token TEXT NOT NULL UNIQUE,
    machine TEXT NOT NULL,
    params TEXT NOT NULL
);
";

/// Version 6: a partial index of the machines in error, so that `/v1/status` counts them
/// without reading every machine.
const SCHEMA_V6: &str = "
CREATE INDEX IF NOT EXISTS machines_in_error ON machines(seq) WHERE status = 'error' OR instance_status = 'provisioning error';
";

/// Version 10: the uuid of the model a token is scoped to (valid for that model only, not for
/// a later model of the same name).
const SCHEMA_V10: &str = "ALTER TABLE api_tokens ADD COLUMN IF NOT EXISTS model_uuid TEXT;";

/// Version 7: the model a token is scoped to (`NULL`: every model).
const SCHEMA_V7: &str = "ALTER TABLE api_tokens ADD COLUMN IF NOT EXISTS model TEXT;";

/// Version 8: the provisioner's writes to a machine's row made *HOT* (heap-only: the new row
/// version on the same page, no index entry written). An update is HOT only if no index names
/// a column it changes (a partial index's predicate counts) and the page has room, so the
/// machines in error are kept in a table of their own (`machine_errors`, by triggers that fire
/// only when a machine goes into or out of error) instead of version 6's partial index over
/// `status` and `instance_status`, and the machines' pages are filled to 70 % (room for a few
/// versions of their rows; the dead ones are pruned as the page is next written). Measured: a
/// start's two updates, 15 rows a statement over 100,000 machines, 5.9 s → 4.1 s, 87 % of them
/// HOT (`docs/performance.md`).
const SCHEMA_V8: &str = "
DROP INDEX IF EXISTS machines_in_error;
ALTER TABLE machines SET (fillfactor = 70);
CREATE TABLE IF NOT EXISTS machine_errors (seq BIGINT PRIMARY KEY);
INSERT INTO machine_errors SELECT seq FROM machines
    WHERE status = 'error' OR instance_status = 'provisioning error' ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION machine_errors_track() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND (OLD.status = 'error' OR OLD.instance_status = 'provisioning error') THEN
        DELETE FROM machine_errors WHERE seq = OLD.seq;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND (NEW.status = 'error' OR NEW.instance_status = 'provisioning error') THEN
        INSERT INTO machine_errors (seq) VALUES (NEW.seq) ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_errors_insert AFTER INSERT ON machines FOR EACH ROW
    WHEN (NEW.status = 'error' OR NEW.instance_status = 'provisioning error')
    EXECUTE FUNCTION machine_errors_track();
CREATE TRIGGER machine_errors_update AFTER UPDATE ON machines FOR EACH ROW
    WHEN ((OLD.status = 'error' OR OLD.instance_status = 'provisioning error')
          IS DISTINCT FROM (NEW.status = 'error' OR NEW.instance_status = 'provisioning error'))
    EXECUTE FUNCTION machine_errors_track();
CREATE TRIGGER machine_errors_delete AFTER DELETE ON machines FOR EACH ROW
    WHEN (OLD.status = 'error' OR OLD.instance_status = 'provisioning error')
    EXECUTE FUNCTION machine_errors_track();
";

/// Version 9: the epochs' record keeps a row per writing session (`epoch_writes.writer`, the
/// backend's process id), so that two sessions of one holder (the model's store and the
/// simulated cloud's, `Store::companion`) do not queue on one row lock for every group commit;
/// the audit (`lease::pg::audit_epochs`) checks each row as before. And `changed_at` stamped by
/// the trigger only for a write that does not stamp it itself (`WHEN` clauses: the function is not even called for the others). The provisioner's
/// set-based writes and the adds stamp their rows with one value a statement
/// ([`stamp_sql`]), so that no row they write runs the PL/pgSQL function (7 % of the server's
/// time at 100,000 machines went to calling it once a row). Any other write leaves the column
/// alone and is stamped as before.
const SCHEMA_V9: &str = "
ALTER TABLE epoch_writes ADD COLUMN IF NOT EXISTS writer INT NOT NULL DEFAULT 0;
ALTER TABLE epoch_writes DROP CONSTRAINT IF EXISTS epoch_writes_pkey;
ALTER TABLE epoch_writes ADD PRIMARY KEY (model_uuid, epoch, holder, writer);
DROP TRIGGER IF EXISTS machines_stamp ON machines;
DROP TRIGGER IF EXISTS machines_stamp_insert ON machines;
DROP TRIGGER IF EXISTS machines_stamp_update ON machines;
CREATE TRIGGER machines_stamp_insert BEFORE INSERT ON machines FOR EACH ROW
    WHEN (NEW.changed_at IS NULL) EXECUTE FUNCTION machines_stamp();
CREATE TRIGGER machines_stamp_update BEFORE UPDATE ON machines FOR EACH ROW
    WHEN (NEW.changed_at IS NOT DISTINCT FROM OLD.changed_at) EXECUTE FUNCTION machines_stamp();
";

/// The stamp the `machines_stamp` trigger writes, as a statement's own: an uncorrelated scalar
/// subquery, so evaluated once a statement (an `InitPlan`), not once a row. A row written twice
/// within the same millisecond gets the same value again, and the trigger stamps it then.
macro_rules! stamp_sql {
    () => {
        "(SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'))"
    };
}

/// A change notification's payload (JSON on channel [`CHANGES_CHANNEL`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Notice {
    /// The model changed.
    pub model_uuid: String,
    /// What changed: `machines`, `model` (its life) or `settings`.
    pub kind: String,
    /// The machines changed (empty when `all`, or for `model` and `settings`).
    pub ids: Vec<String>,
    /// Too many ids for one payload: re-read every machine.
    pub all: bool,
}

fn failure(e: &CallError) -> PgFailure {
    let e = match e {
        CallError::Postgres(e) => e,
        timed_out @ CallError::TimedOut(_) => {
            return PgFailure { code: None, message: timed_out.to_string(), connection_lost: true }
        }
    };
    let code = e.code().map(|c| c.code().to_owned());
    // No server answer (closed, reset, refused, timed out), or the server going away.
    let connection_lost = e.is_closed()
        || e.as_db_error().is_none()
        || code.as_deref().is_some_and(|c| c.starts_with("08") || c.starts_with("57P"));
    let message = match e.as_db_error() {
        Some(db) => db.to_string(),
        None => match std::error::Error::source(e) {
            Some(s) => format!("{e}: {s}"),
            None => e.to_string(),
        },
    };
    PgFailure { code, message, connection_lost }
}

/// Maps a client error onto the store's, naming what was being done.
fn pg<E: Into<CallError>>(context: &'static str) -> impl Fn(E) -> StoreError {
    move |e| StoreError::Postgres { context, source: failure(&e.into()) }
}

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// A statement prepared once per connection (the client would prepare each text again: one
/// more round trip per statement).
fn prepared(c: &mut PgClient, cache: &mut HashMap<String, Statement>, sql: &str) -> Result<Statement, CallError> {
    if let Some(st) = cache.get(sql) {
        return Ok(st.clone());
    }
    let st = c.prepare(sql)?;
    cache.insert(sql.to_owned(), st.clone());
    Ok(st)
}

/// Runs statements, prepared once per connection: on the connection ([`Conn`]) or in a
/// transaction ([`Tx`]).
trait Run {
    fn execute(&mut self, sql: &str, p: Params<'_>) -> Result<u64, CallError>;
    fn query(&mut self, sql: &str, p: Params<'_>) -> Result<Vec<Row>, CallError>;
    fn query_opt(&mut self, sql: &str, p: Params<'_>) -> Result<Option<Row>, CallError>;
    fn query_one(&mut self, sql: &str, p: Params<'_>) -> Result<Row, CallError>;
}

macro_rules! run_over {
    ($ty:ty, $client:ident, $cache:ident) => {
        impl Run for $ty {
            fn execute(&mut self, sql: &str, p: Params<'_>) -> Result<u64, CallError> {
                let st = prepared(
                    BorrowMut::<PgClient>::borrow_mut(&mut self.$client),
                    BorrowMut::<HashMap<String, Statement>>::borrow_mut(&mut self.$cache),
                    sql,
                )?;
                self.$client.execute(&st, p)
            }
            fn query(&mut self, sql: &str, p: Params<'_>) -> Result<Vec<Row>, CallError> {
                let st = prepared(
                    BorrowMut::<PgClient>::borrow_mut(&mut self.$client),
                    BorrowMut::<HashMap<String, Statement>>::borrow_mut(&mut self.$cache),
                    sql,
                )?;
                self.$client.query(&st, p)
            }
            fn query_opt(&mut self, sql: &str, p: Params<'_>) -> Result<Option<Row>, CallError> {
                let st = prepared(
                    BorrowMut::<PgClient>::borrow_mut(&mut self.$client),
                    BorrowMut::<HashMap<String, Statement>>::borrow_mut(&mut self.$cache),
                    sql,
                )?;
                self.$client.query_opt(&st, p)
            }
            fn query_one(&mut self, sql: &str, p: Params<'_>) -> Result<Row, CallError> {
                let st = prepared(
                    BorrowMut::<PgClient>::borrow_mut(&mut self.$client),
                    BorrowMut::<HashMap<String, Statement>>::borrow_mut(&mut self.$cache),
                    sql,
                )?;
                self.$client.query_one(&st, p)
            }
        }
    };
}

/// The connection and the statements prepared on it.
struct Conn {
    client: PgClient,
    statements: HashMap<String, Statement>,
    /// The session's backend process id (what its notifications carry).
    pid: i32,
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

impl Tx<'_> {
    /// Commits it (a transaction of its own), or keeps it in its group (the savepoint's
    /// release is sent with the group's next statements).
    fn commit(mut self) -> Result<(), CallError> {
        self.done = true;
        match self.group.as_deref_mut() {
            None => self.client.batch_execute("COMMIT"),
            Some(g) => {
                if self.savepoint {
                    self.client.queue("RELEASE SAVEPOINT write");
                }
                g.written = true;
                g.member_wrote = true;
                g.member_fenced_writes += i64::from(self.fenced);
                Ok(())
            }
        }
    }
    fn batch_execute(&mut self, sql: &str) -> Result<(), CallError> {
        self.client.batch_execute(sql)
    }
    /// Runs statements that do not need each other's answers in one round trip (see
    /// [`PgClient::pipeline`]): their answers, or the first failure.
    fn pipeline(&mut self, statements: &[(&str, Params<'_>, bool)]) -> Result<Vec<Reply>, CallError> {
        let mut piped = Vec::with_capacity(statements.len());
        for (sql, params, rows) in statements {
            let statement = prepared(&mut *self.client, &mut *self.statements, sql)?;
            piped.push(Piped { statement, params, rows: *rows });
        }
        Ok(self.client.pipeline(&piped)?.into_iter().collect::<Result<_, _>>()?)
    }
}

impl Reply {
    /// The rows of a query.
    fn into_rows(self) -> Vec<Row> {
        match self {
            Reply::Rows(rows) => rows,
            Reply::Count(_) => Vec::new(),
        }
    }
    /// The rows a statement changed (or returned).
    fn count(&self) -> u64 {
        match self {
            Reply::Rows(rows) => rows.len() as u64,
            Reply::Count(n) => *n,
        }
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // In a group, sent with the next statement (its failure breaks the group: see
        // `PgClient`).
        match self.group.as_deref_mut() {
            None => {
                let _ = self.client.rollback();
            }
            Some(_) if self.savepoint => {
                self.client.queue("ROLLBACK TO SAVEPOINT write");
                self.client.queue("RELEASE SAVEPOINT write");
            }
            Some(g) => {
                // The unit's first write: back to the unit's savepoint (kept), which holds
                // nothing else the unit wrote. A fence checked inside it lost its lock.
                self.client.queue("ROLLBACK TO SAVEPOINT member");
                if std::mem::take(&mut g.fence_in_member) {
                    g.fence = None;
                }
            }
        }
    }
}

run_over!(Conn, client, statements);
run_over!(Tx<'_>, client, statements);
run_over!(GroupRun<'_>, client, statements);

/// Statements at a group's level (outside its units of work's savepoints).
struct GroupRun<'a> {
    client: &'a mut PgClient,
    statements: &'a mut HashMap<String, Statement>,
}

/// What a fenced write runs first: the lease names this holder at this epoch and has not
/// expired, its row share-locked until the transaction ends (so no takeover commits before
/// it); `Fenced` if not. (`FENCE_SQL` of `lease::pg`, with the statement's own time: in a
/// group commit the transaction may have begun a little earlier.)
fn check_fence(r: &mut impl Run, f: &Fence) -> Result<(), StoreError> {
    let held = r
        .query_opt(
            "SELECT 1 FROM leader_lease WHERE model_uuid = $1 AND holder = $2 AND epoch = $3 \
             AND expires_at > statement_timestamp() FOR SHARE",
            &[&f.model_uuid, &f.holder, &f.epoch],
        )
        .map_err(pg("checking the leader lease"))?;
    match held {
        Some(_) => Ok(()),
        None => Err(StoreError::Fenced { model_uuid: f.model_uuid.clone(), holder: f.holder.clone(), epoch: f.epoch }),
    }
}

impl Conn {
    /// A transaction of its own.
    fn transaction(&mut self) -> Result<Tx<'_>, CallError> {
        self.client.batch_execute("BEGIN")?;
        Ok(Tx {
            client: &mut self.client,
            statements: &mut self.statements,
            group: None,
            fenced: false,
            savepoint: false,
            done: false,
        })
    }
}

/// A group commit open on the store's connection (see [`StoreBackend::begin_group`]): one
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
    /// The write-behind units queued for the commit ([`StoreBackend::defer`]).
    deferred: Vec<Write>,
}

/// Breaks `group` if a statement queued on its connection (a savepoint, a release, a rollback to
/// one) failed: its transaction is then in no state to keep anything. The error it broke with.
fn queued_failure(conn: Option<&mut Conn>, group: &mut PgGroup) -> Option<StoreError> {
    let message = conn?.client.take_queued_failure()?;
    let e = StoreError::Postgres {
        context: "running a group's savepoints",
        source: PgFailure { code: None, message, connection_lost: false },
    };
    Some(group.broken.get_or_insert(e).clone())
}

/// A machine's status and life, its row locked: `$1` its id.
const STATUS_LIFE_SQL: &str = "SELECT status, life FROM machines WHERE id = $1 FOR UPDATE";

/// A machine's whole record; its first seven columns are [`LEAN_MACHINE_SQL`]'s.
const MACHINE_COLUMNS: &str = "m.id, m.life, m.status, m.instance_status, m.instance, m.keep_instance, m.manual, \
                               m.status_message, m.instance_status_message, m.zone, m.transient, \
                               COALESCE(c.zones, m.zones), c.arch, c.cores, c.mem_mb, c.root_disk_mb, \
                               c.instance_type, c.spaces, c.tags, m.placement, m.application, m.changed_at, \
                               m.address, m.start_attempts, m.last_start_error";
const MACHINE_FROM: &str = "machines m LEFT JOIN constraints c ON c.id = m.constraints_id";
const INSTANCE_COLUMNS: &str = "id, state, zone, model, machine, start, client_token";

fn bad_row(context: &'static str, message: String) -> StoreError {
    StoreError::Damaged { context, message }
}

fn machine_from_row(r: &Row) -> Result<MachineRecord, StoreError> {
    let get = |e: postgres::Error| pg("reading a machine")(e);
    let constraints = constraints_from_row(r, 11)?;
    Ok(MachineRecord {
        machine: lean_machine_from_row(r)?,
        status_message: r.try_get(7).map_err(get)?,
        instance_status_message: r.try_get(8).map_err(get)?,
        zone: r.try_get(9).map_err(get)?,
        transient: r.try_get(10).map_err(get)?,
        zones: constraints.zones.clone(),
        constraints,
        placement: r.try_get(19).map_err(get)?,
        application: r.try_get(20).map_err(get)?,
        changed_at: r.try_get(21).map_err(get)?,
        address: r.try_get(22).map_err(get)?,
        start_attempts: r.try_get::<_, i64>(23).map_err(get)?.max(0) as u64,
        last_start_error: r.try_get(24).map_err(get)?,
    })
}

/// The constraints of a row whose eight columns from `first` on are the machine's zones (its own or its
/// constraint set's), then the constraint set's arch, cores, memory, root disk, instance type, spaces
/// and tags.
fn constraints_from_row(r: &Row, first: usize) -> Result<Constraints, StoreError> {
    let get = |e: postgres::Error| pg("reading a machine")(e);
    let zones: Option<String> = r.try_get(first).map_err(get)?;
    let list = |s: Option<String>| -> Vec<String> {
        s.filter(|s| !s.is_empty()).map(|s| s.split(',').map(str::to_owned).collect()).unwrap_or_default()
    };
    Ok(Constraints {
        zones: zones.map(|z| z.split(',').map(str::to_owned).collect()),
        arch: r.try_get(first + 1).map_err(get)?,
        cores: r.try_get::<_, Option<i64>>(first + 2).map_err(get)?.map(|n| n as u32),
        mem_mb: r.try_get::<_, Option<i64>>(first + 3).map_err(get)?.map(|n| n as u64),
        root_disk_mb: r.try_get::<_, Option<i64>>(first + 4).map_err(get)?.map(|n| n as u64),
        instance_type: r.try_get(first + 5).map_err(get)?,
        spaces: list(r.try_get(first + 6).map_err(get)?),
        tags: list(r.try_get(first + 7).map_err(get)?),
    })
}

/// A machine as the provisioner reads it, from [`LEAN_MACHINE_SQL`]'s row.
fn lean_machine_from_row(r: &Row) -> Result<Machine, StoreError> {
    let ctx = "reading a machine";
    let get = |e: postgres::Error| pg(ctx)(e);
    let life: String = r.try_get(1).map_err(get)?;
    let status: String = r.try_get(2).map_err(get)?;
    Ok(Machine {
        id: MachineId::from(r.try_get::<_, String>(0).map_err(get)?),
        life: life.parse().map_err(|e| bad_row(ctx, format!("life {life:?}: {e}")))?,
        status: status.parse().map_err(|e| bad_row(ctx, format!("status {status:?}: {e}")))?,
        instance_status: InstanceStatus::other(r.try_get::<_, String>(3).map_err(get)?),
        instance: r.try_get::<_, Option<String>>(4).map_err(get)?.map(InstanceId::from),
        keep_instance: r.try_get(5).map_err(get)?,
        manual: r.try_get(6).map_err(get)?,
        controller: false,
    })
}

/// The provisioner's lean reads of many machines (what it needs of each, not the whole record:
/// `machine show`'s): the machine ([`lean_machine_from_row`]), its application, its
/// provisioning info; `$1` the ids.
const LEAN_MACHINE_SQL: &str =
    "SELECT id, life, status, instance_status, instance, keep_instance, manual FROM machines WHERE id = ANY($1)";
const MACHINE_APPLICATION_SQL: &str = "SELECT id, application FROM machines WHERE id = ANY($1)";
const MACHINE_PROVISIONING_SQL: &str = "SELECT m.id, COALESCE(c.zones, m.zones), c.arch, c.cores, c.mem_mb, \
     c.root_disk_mb, c.instance_type, c.spaces, c.tags, m.placement \
     FROM machines m LEFT JOIN constraints c ON c.id = m.constraints_id WHERE m.id = ANY($1)";

fn instance_from_row(r: &Row) -> Result<InstanceRecord, StoreError> {
    let ctx = "reading an instance";
    let get = |e: postgres::Error| pg(ctx)(e);
    let state: String = r.try_get(1).map_err(get)?;
    Ok(InstanceRecord {
        instance: CloudInstance {
            id: InstanceId::from(r.try_get::<_, String>(0).map_err(get)?),
            state: state.parse().map_err(|e| bad_row(ctx, format!("state {state:?}: {e}")))?,
            zone: r.try_get(2).map_err(get)?,
            tags: InstanceTags {
                model: r.try_get(3).map_err(get)?,
                machine: r.try_get::<_, Option<String>>(4).map_err(get)?.map(MachineId::from),
                start: r.try_get(5).map_err(get)?,
            },
            age: None,
            instance_type: None,
        },
        client_token: r.try_get(6).map_err(get)?,
    })
}

fn ids_of(rows: Vec<Row>, ctx: &'static str) -> Result<Vec<MachineId>, StoreError> {
    rows.iter().map(|r| r.try_get::<_, String>(0).map(MachineId::from).map_err(pg(ctx))).collect()
}

fn meta_get(c: &mut impl Run, key: &str) -> Result<Option<String>, CallError> {
    Ok(c.query_opt("SELECT value FROM meta WHERE key = $1", &[&key])?.map(|r| r.get(0)))
}

fn meta_set(c: &mut impl Run, key: &str, value: &str) -> Result<(), CallError> {
    c.execute(
        "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&key, &value],
    )
    .map(|_| ())
}

/// Takes the next value of a counter kept in `meta` (0 first), atomically.
fn next_counter(tx: &mut Tx<'_>, key: &str) -> Result<i64, CallError> {
    next_counters(tx, key, 1)
}

/// Takes `$2` values of the counter `$1` kept in `meta` at once: the first of them, `first`.
macro_rules! counter_sql {
    () => {
        "INSERT INTO meta (key, value) VALUES ($1, $2::bigint::text) \
         ON CONFLICT (key) DO UPDATE SET value = ((meta.value)::bigint + $2::bigint)::text \
         RETURNING (value)::bigint - $2::bigint AS first"
    };
}

/// A simulated instance's row, unless one with this client token exists: its seq and id drawn
/// from the counter in the same statement, the counter untouched when the token has its
/// instance already (`$1` `next_instance`, `$2` 1; `$3`... zone, model, machine, start, client
/// token, state): the new id, or no row. The id is `i-` and the seq plus one in hex, at least 8
/// digits.
const INSERT_NEW_INSTANCE_SQL: &str = "WITH c AS (\
     INSERT INTO meta (key, value) SELECT $1::text, $2::bigint::text \
     WHERE NOT EXISTS (SELECT 1 FROM instances WHERE client_token = $7) \
     ON CONFLICT (key) DO UPDATE SET value = ((meta.value)::bigint + $2::bigint)::text \
     RETURNING (value)::bigint - $2::bigint AS first\
     ) INSERT INTO instances (seq, id, state, zone, model, machine, start, client_token) \
     SELECT first, 'i-' || lpad(to_hex(first + 1), greatest(8, length(to_hex(first + 1))), '0'), $8, \
     $3, $4, $5, $6, $7 FROM c RETURNING id";

/// Adds of machines with no constraints by one statement (a group's [`Write::AddMachines`]
/// units, or one add alone), each in order: the model's life read and locked (as
/// [`life_in`]: nothing is added unless it is alive), the ids drawn from the counter at once
/// and the rows inserted; `$1` counts, `$2` placements, `$3` applications; the machines'
/// notices sent (`$4` channel, `$5` model uuid, at most `$6` ids a notice). Answers the first
/// seq drawn (the adds' machines follow it, in order), or no row if the model is not alive
/// (nothing added). Its parameters: [`add_many_params`].
pub(super) const ADD_MANY_SQL: &str = concat!(
    "WITH life AS (SELECT value FROM meta WHERE key = 'model_life' FOR SHARE), \
     v AS (SELECT n, count, placement, application, sum(count) OVER (ORDER BY n) - count AS skip \
     FROM unnest($1::bigint[], $2::text[], $3::text[]) WITH ORDINALITY AS v(count, placement, application, n)), \
     c AS (INSERT INTO meta (key, value) SELECT 'next_machine', sum(count)::text FROM v \
     HAVING COALESCE((SELECT value FROM life), 'alive') = 'alive' \
     ON CONFLICT (key) DO UPDATE SET value = ((meta.value)::bigint + (EXCLUDED.value)::bigint)::text \
     RETURNING (value)::bigint - (SELECT sum(count) FROM v)::bigint AS first), \
     ins AS (INSERT INTO machines (seq, id, placement, application, changed_at) \
     SELECT c.first + v.skip + g.k, (c.first + v.skip + g.k)::text, v.placement, v.application, ",
    stamp_sql!(),
    " \
     FROM c, v, generate_series(0::bigint, v.count - 1) AS g(k) ORDER BY 1 RETURNING seq), \
     notices AS (SELECT pg_notify($4, json_build_object('model_uuid', $5::text, 'kind', 'machines', \
     'ids', json_agg(seq::text ORDER BY seq), 'all', false)::text) FROM ins \
     GROUP BY (seq - (SELECT first FROM c)) / $6::bigint) \
     SELECT first, (SELECT count(*) FROM notices) FROM c"
);

/// [`ADD_MANY_SQL`]'s parameters for `adds` (each a count and what the machines are) in
/// model `uuid`.
fn add_many_params<'a>(adds: impl Iterator<Item = (usize, &'a NewMachine)>, uuid: &'a str) -> Vec<Param<'a>> {
    let (mut counts, mut placements, mut applications) = (Vec::new(), Vec::new(), Vec::new());
    for (count, spec) in adds {
        counts.push(count as i64);
        placements.push(spec.placement.as_deref());
        applications.push(spec.application.as_deref());
    }
    vec![
        Box::new(counts),
        Box::new(placements),
        Box::new(applications),
        Box::new(CHANGES_CHANNEL),
        Box::new(uuid),
        Box::new(MAX_NOTIFIED_IDS as i64),
    ]
}

/// Takes the next `count` values of a counter kept in `meta` at once: the first of them.
fn next_counters(tx: &mut Tx<'_>, key: &str, count: i64) -> Result<i64, CallError> {
    Ok(tx.query_one(counter_sql!(), &[&key, &count])?.try_get(0)?)
}

/// Sends a change notification from `tx` (delivered at its commit, not before, not without):
/// queued to go with the transaction's next statement or its commit, no round trip of its own.
fn notify(tx: &mut Tx<'_>, model_uuid: &str, kind: &str, ids: &[MachineId]) -> Result<(), StoreError> {
    let payload = notice_payload(model_uuid, kind, ids);
    match notify_literal(&payload) {
        Some(sql) => tx.client.queue(&sql),
        None => {
            tx.execute(NOTIFY_SQL, &[&CHANGES_CHANNEL, &payload]).map_err(pg("notifying a change"))?;
        }
    }
    Ok(())
}

/// [`NOTIFY_SQL`] with its payload as a dollar-quoted literal (a queued statement has no
/// parameters), unless the payload holds the quote's tag.
fn notify_literal(payload: &str) -> Option<String> {
    (!payload.contains("$n$")).then(|| format!("SELECT pg_notify('{CHANGES_CHANNEL}', $n${payload}$n$)"))
}

/// What [`notify`] runs: `$1` the channel, `$2` the payload.
const NOTIFY_SQL: &str = "SELECT pg_notify($1, $2)";

/// A change notification's payload (a [`Notice`] as JSON).
fn notice_payload(model_uuid: &str, kind: &str, ids: &[MachineId]) -> String {
    let all = ids.len() > MAX_NOTIFIED_IDS;
    let notice = Notice {
        model_uuid: model_uuid.to_owned(),
        kind: kind.to_owned(),
        ids: if all { Vec::new() } else { ids.iter().map(ToString::to_string).collect() },
        all,
    };
    serde_json::to_string(&notice).unwrap_or_default()
}

/// The model's life as `tx` sees it (locked against a concurrent destruction until it ends).
fn life_in(tx: &mut Tx<'_>) -> Result<Life, StoreError> {
    let life = tx
        .query_opt("SELECT value FROM meta WHERE key = 'model_life' FOR SHARE", &[])
        .map_err(pg("reading the model life"))?
        .map(|r| r.get::<_, String>(0));
    Ok(life.and_then(|l| l.parse().ok()).unwrap_or(Life::Alive))
}

/// The store over PostgreSQL. One connection, (re)made on demand with backoff.
pub struct PgStore {
    /// What it connects with (within the configured connect timeout, start-up included).
    config: tokio_postgres::Config,
    /// The URL's TLS settings (`sslmode`, `sslrootcert`).
    tls: crate::service::pgtls::PgTls,
    client: Option<Conn>,
    /// The model's uuid, read at the first connection (it never changes).
    model_uuid: Option<String>,
    book: Book,
    /// The leader's fence, if set.
    fence: Option<Fence>,
    /// Whether the current unit of work is the provisioner's (checked against the fence).
    fenced: bool,
    /// Whether commits wait for the server's disk (`synchronous_commit`).
    durable: bool,
    /// The session's `synchronous_commit` (`None`: not set on this connection yet).
    session_durable: Option<bool>,
    /// Connection backoff: the next wait, and when the next attempt may be made.
    backoff: Duration,
    next_attempt: Option<Instant>,
    /// Why the last attempt failed.
    last_failure: Option<String>,
    /// This store created the model (applied the first migration on an empty database).
    created: bool,
    /// The group commit open, if one is.
    group: Option<PgGroup>,
    /// The answers of the write-behind units of the group that last committed.
    deferred_results: Vec<Result<Written, StoreError>>,
}

/// A group's write-behind units ([`Write`]) as *set-based* statements: the units are cut into
/// runs in which no machine and no client token appears twice ([`runs`]), and each run's
/// units of one kind are written by one statement over arrays (`unnest`), so a group of any
/// size costs a few statements, not two a unit (a statement's fixed cost, tens of
/// microseconds on the server, was what a unit cost: `docs/performance.md`). Within a run the
/// order of its units does not matter (each touches its own row); runs go in order, so a
/// machine written twice in a group is written in the order given. Its rows are locked and
/// read first, in one statement ([`LOCK_MACHINES_SQL`]), for the counts' before.
///
/// Their plans are kept (prepared statements) but made under [`INDEX_PLANS_SQL`], as every
/// statement of the store's session: a generic plan made while the table was small (a
/// sequential scan, a hash join) would be kept at 100,000 machines, and planning each
/// execution for its arrays instead cost a quarter of the server's time
/// (`docs/performance.md`).
pub(super) const LOCK_MACHINES_SQL: &str =
    "SELECT id, status, life FROM machines WHERE id = ANY($1::text[]) ORDER BY seq FOR UPDATE";

/// The planner settings of the store's session (set when it connects): a row is found through
/// an index where there is one, never by a scan of the table or a hash of it, whatever the
/// size of the table when a statement's plan was made. The store's statements are prepared
/// once a session and their generic plans kept: one made at the start, on a table of a few
/// rows, would otherwise scan it for each look-up when it holds 100,000 (a lean read of 14
/// machines took 3 ms, a scan, in the single adds' benchmark). A statement that reads a whole
/// table (the counts) still scans it: no index path is cheaper, the disabled one is the only
/// one. No JIT compilation: such a plan's cost, disabled, is over `jit_above_cost`, and
/// compiling it took 100 ms for a count of 200 rows (the store's statements are all short).
pub(super) const INDEX_PLANS_SQL: &str =
    "SET enable_seqscan TO off; SET enable_hashjoin TO off; SET enable_mergejoin TO off; SET jit TO off";

/// [`Write::MachineStatus`] units (`set_status`'s update): ids, statuses, messages.
pub(super) const SET_STATUSES_SQL: &str = concat!(
    "UPDATE machines m SET status = v.status, status_message = v.message, changed_at = ",
    stamp_sql!(),
    ", \
     transient = CASE WHEN v.status = 'pending' THEN false ELSE m.transient END \
     FROM unnest($1::text[], $2::text[], $3::text[]) AS v(id, status, message) WHERE m.id = v.id RETURNING m.id"
);

/// [`Write::InstanceStatus`] units: ids, statuses, messages, and each failed attempt's error
/// (`NULL`: no attempt's outcome; else the attempt counted, its error kept).
pub(super) const SET_INSTANCE_STATUSES_SQL: &str = concat!(
    "UPDATE machines m SET changed_at = ",
    stamp_sql!(),
    ", instance_status = v.status, \
     instance_status_message = v.message, start_attempts = m.start_attempts + (v.error IS NOT NULL)::int, \
     last_start_error = COALESCE(v.error, m.last_start_error) \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS v(id, status, message, error) \
     WHERE m.id = v.id RETURNING m.id"
);

/// [`Write::StartedInstance`] units (`record_started_instance`'s update): ids, instances,
/// zones, nonces, display names, instance statuses.
pub(super) const SET_STARTED_SQL: &str = concat!(
    "UPDATE machines m SET changed_at = ",
    stamp_sql!(),
    ", instance = v.instance, zone = v.zone, nonce = v.nonce, \
     display_name = v.display_name, instance_status = v.status, instance_status_message = '', \
     status = 'started', status_message = '', transient = false, start_attempts = m.start_attempts + 1, \
     last_start_error = NULL \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) \
     AS v(id, instance, zone, nonce, display_name, status) WHERE m.id = v.id RETURNING m.id"
);

/// One start's instance at a time per client token, across replicas (held to the commit): a
/// run's tokens locked in order.
const LOCK_TOKENS_SQL: &str =
    "SELECT count(pg_advisory_xact_lock(hashtext(t))) FROM (SELECT t FROM unnest($1::text[]) AS t ORDER BY t) AS s";

/// [`Write::RunningInstance`] units: the instances of the tokens that have none, inserted
/// running with ids drawn from the counter in `meta` (bumped once, by their number), in the
/// order given: tokens, zones, models, machines, starts; `$6` the state. Answers each new
/// instance's token and id (a token that had one is read after the commit).
pub(super) const INSERT_INSTANCES_SQL: &str = "WITH v AS (\
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY \
     AS v(token, zone, model, machine, start, n) \
     WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.client_token = v.token)), \
     c AS (INSERT INTO meta (key, value) SELECT 'next_instance', count(*)::text FROM v HAVING count(*) > 0 \
     ON CONFLICT (key) DO UPDATE SET value = ((meta.value)::bigint + (EXCLUDED.value)::bigint)::text \
     RETURNING (value)::bigint - (SELECT count(*) FROM v) AS first) \
     INSERT INTO instances (seq, id, state, zone, model, machine, start, client_token) \
     SELECT first + r, 'i-' || lpad(to_hex(first + r + 1), greatest(8, length(to_hex(first + r + 1))), '0'), \
     $6, w.zone, w.model, w.machine, w.start, w.token \
     FROM c, (SELECT v.*, row_number() OVER (ORDER BY n) - 1 AS r FROM v) AS w \
     RETURNING client_token, id";

/// The fence's check ([`check_fence`]) and [`RECORD_WRITES_SQL`] as one statement, for a group
/// whose fence is checked by its write-behind units' pipeline (its first statement): it fails
/// (division by zero, nothing recorded) unless the lease passes (`$1` model, `$2` holder, `$3`
/// epoch), its row share-locked to the commit, then records the group's `$4` fenced writes. The value drawn from `fence_seq` may be drawn before
/// the lease row is locked: no acquisition can commit between the draw and this transaction's
/// commit and leave the check passing (an acquisition changes the row this check locks and
/// re-reads), and one that comes after draws its value after this commit.
const FENCE_AND_RECORD_SQL: &str = "WITH held AS (SELECT 1 / count(*) AS ok FROM (SELECT 1 FROM leader_lease      WHERE model_uuid = $1 AND holder = $2 AND epoch = $3 AND expires_at > statement_timestamp() FOR SHARE) AS l)      INSERT INTO epoch_writes AS w (model_uuid, epoch, holder, writer, writes, first_seq, last_seq)      SELECT $1, $3, $2, pg_backend_pid(), $4, s, s FROM held, nextval('fence_seq') AS s      ON CONFLICT (model_uuid, epoch, holder, writer)      DO UPDATE SET writes = w.writes + EXCLUDED.writes, last_seq = EXCLUDED.last_seq";

/// One parameter of a deferred statement.
type Param<'a> = Box<dyn ToSql + Sync + 'a>;

/// What a deferred statement's answer tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The fence's check.
    Fence,
    /// A run's machines locked and read (their status and life before).
    Locked(usize),
    /// A run's machines written (their ids).
    Updated(usize),
    /// A run's new instances (their tokens and ids).
    Inserted(usize),
    /// The group's adds (the first seq drawn).
    Added,
    /// Nothing to read (a lock, a notice, the epochs' record).
    Other,
}

/// The key a unit writes under: a machine, or a client token (none for an add: its machines
/// are new).
fn write_key(w: &Write) -> Option<(bool, &str)> {
    match w {
        Write::MachineStatus { id, .. } | Write::InstanceStatus { id, .. } | Write::StartedInstance { id, .. } => {
            Some((false, id.as_str()))
        }
        Write::RunningInstance { client_token, .. } => Some((true, client_token.as_str())),
        Write::AddMachines { .. } => None,
    }
}

/// Which run each unit belongs to, in order: a unit whose machine (or token) the current run
/// writes already begins the next run.
fn runs(writes: &[Write]) -> Vec<usize> {
    let mut run = 0;
    let mut keys = std::collections::HashSet::new();
    writes
        .iter()
        .map(|w| {
            if let Some(key) = write_key(w) {
                if !keys.insert(key) {
                    run += 1;
                    keys.clear();
                    keys.insert(key);
                }
            }
            run
        })
        .collect()
}

/// The set-based statements of `writes` cut into runs (`run_of`), in order, with their roles;
/// `payloads` the notices of the machines they write.
fn deferred_statements<'a>(
    writes: &'a [Write],
    run_of: &[usize],
    payloads: &'a [String],
) -> Vec<(&'static str, Vec<Param<'a>>, Role)> {
    let mut out: Vec<(&'static str, Vec<Param<'a>>, Role)> = Vec::new();
    let last = run_of.last().map_or(0, |r| r + 1);
    let mut start = 0;
    for run in 0..last {
        let end = start + run_of[start..].iter().take_while(|r| **r == run).count();
        let units = &writes[start..end];
        start = end;
        let mut locked: Vec<&str> = Vec::new();
        let (mut s_ids, mut s_status, mut s_message) = (Vec::new(), Vec::new(), Vec::new());
        let (mut i_ids, mut i_status, mut i_message, mut i_error) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut t_ids, mut t_instance, mut t_zone, mut t_nonce, mut t_name, mut t_status) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut tokens, mut zones, mut models, mut machines, mut starts) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for w in units {
            match w {
                Write::MachineStatus { id, status, message } => {
                    locked.push(id.as_str());
                    s_ids.push(id.as_str());
                    s_status.push(status.as_str());
                    s_message.push(message.as_str());
                }
                Write::InstanceStatus { id, status, message, failed_attempt } => {
                    locked.push(id.as_str());
                    i_ids.push(id.as_str());
                    i_status.push(status.as_str());
                    i_message.push(message.as_str());
                    i_error.push(failed_attempt.as_deref());
                }
                Write::StartedInstance { id, info } => {
                    locked.push(id.as_str());
                    t_ids.push(id.as_str());
                    t_instance.push(info.instance.as_str());
                    t_zone.push(info.zone.as_deref());
                    t_nonce.push(info.nonce.as_str());
                    t_name.push(info.display_name.as_str());
                    t_status.push(info.status.as_str());
                }
                Write::RunningInstance { client_token, zone, tags } => {
                    tokens.push(client_token.as_str());
                    zones.push(zone.as_deref());
                    models.push(tags.model.as_deref());
                    machines.push(tags.machine.as_ref().map(MachineId::as_str));
                    starts.push(tags.start.as_deref());
                }
                // All of a group's adds are made by one statement ([`ADD_MANY_SQL`]).
                Write::AddMachines { .. } => {}
            }
        }
        if !locked.is_empty() {
            out.push((LOCK_MACHINES_SQL, vec![Box::new(locked)], Role::Locked(run)));
        }
        if !s_ids.is_empty() {
            out.push((
                SET_STATUSES_SQL,
                vec![Box::new(s_ids), Box::new(s_status), Box::new(s_message)],
                Role::Updated(run),
            ));
        }
        if !i_ids.is_empty() {
            out.push((
                SET_INSTANCE_STATUSES_SQL,
                vec![Box::new(i_ids), Box::new(i_status), Box::new(i_message), Box::new(i_error)],
                Role::Updated(run),
            ));
        }
        if !t_ids.is_empty() {
            let p: Vec<Param<'a>> = vec![
                Box::new(t_ids),
                Box::new(t_instance),
                Box::new(t_zone),
                Box::new(t_nonce),
                Box::new(t_name),
                Box::new(t_status),
            ];
            out.push((SET_STARTED_SQL, p, Role::Updated(run)));
        }
        if !tokens.is_empty() {
            out.push((LOCK_TOKENS_SQL, vec![Box::new(tokens.clone())], Role::Other));
            let p: Vec<Param<'a>> = vec![
                Box::new(tokens),
                Box::new(zones),
                Box::new(models),
                Box::new(machines),
                Box::new(starts),
                Box::new(InstanceState::Running.as_str()),
            ];
            out.push((INSERT_INSTANCES_SQL, p, Role::Inserted(run)));
        }
    }
    for payload in payloads {
        out.push((NOTIFY_SQL, vec![Box::new(CHANGES_CHANNEL), Box::new(payload.as_str())], Role::Other));
    }
    out
}

/// The notices of the machines `writes` write, each machine once, at most
/// [`MAX_NOTIFIED_IDS`] a notice. (A unit that finds no machine is notified too: a reader finds
/// it gone, as after any removal.)
fn deferred_notices(uuid: &str, writes: &[Write]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let ids: Vec<MachineId> = writes
        .iter()
        .filter_map(|w| match w {
            Write::MachineStatus { id, .. } | Write::InstanceStatus { id, .. } | Write::StartedInstance { id, .. } => {
                seen.insert(id.as_str()).then(|| id.clone())
            }
            // An add's statement sends its own notices.
            Write::RunningInstance { .. } | Write::AddMachines { .. } => None,
        })
        .collect();
    ids.chunks(MAX_NOTIFIED_IDS).map(|c| notice_payload(uuid, "machines", c)).collect()
}

impl PgStore {
    /// Parses a `postgres://` URL (or a key=value connection string): the blocking client's
    /// configuration and the URL's TLS settings (`sslmode`, `sslrootcert`: see `pgtls`). A bad
    /// one is [`StoreError::Invalid`] naming `store`.
    pub fn config(url: &str) -> Result<(Config, crate::service::pgtls::PgTls), StoreError> {
        let (config, tls) = Self::store_config(url)?;
        let mut config = Config::from(config);
        crate::service::pgconnect::quiet_notices(&mut config);
        Ok((config, tls))
    }

    /// [`PgStore::config`] for the store's own connection (`tokio-postgres`'s, the same
    /// settings: see `pg_client`).
    pub fn store_config(url: &str) -> Result<(tokio_postgres::Config, crate::service::pgtls::PgTls), StoreError> {
        let (mut config, tls) = crate::service::pgtls::parse(url)
            .map_err(|e| StoreError::Invalid { field: "store", message: format!("{url:?}: {e}") })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        config.keepalives(true).keepalives_idle(Duration::from_secs(10));
        // A statement whose packets go unacknowledged (the server unreachable mid-query) fails
        // after this instead of waiting out TCP's retransmissions (many minutes).
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(Duration::from_secs(10));
        }
        // A transaction left open by a store that can no longer talk to the server (a partition
        // swallowed its COMMIT) would keep its share lock on the lease row, and no replica could
        // take the lease until the server noticed the dead connection (hours, with TCP keepalive
        // answered by a middlebox). The store never idles inside a transaction (its statements
        // run back to back), so the server ends such a session soon, releasing its locks and
        // rolling its writes back.
        // Every statement bounded on the server too (see `STATEMENT_DEADLINE`).
        let idle = format!(
            "-c idle_in_transaction_session_timeout={} -c statement_timeout={ms} -c lock_timeout={ms}",
            IDLE_IN_TRANSACTION.as_millis(),
            ms = STATEMENT_DEADLINE.as_millis()
        );
        let options = match config.get_options() {
            Some(given) if !given.is_empty() => format!("{given} {idle}"),
            _ => idle,
        };
        config.options(&options);
        if config.get_application_name().is_none() {
            config.application_name("provisioner");
        }
        Ok((config, tls))
    }

    /// A store that connects at its first operation (over TLS as `tls` says).
    pub fn new(config: tokio_postgres::Config, tls: crate::service::pgtls::PgTls) -> Self {
        Self {
            config,
            tls,
            client: None,
            model_uuid: None,
            book: Book { counts_changed: true, ..Book::default() },
            fence: None,
            fenced: false,
            durable: true,
            session_durable: None,
            backoff: FIRST_BACKOFF,
            next_attempt: None,
            last_failure: None,
            created: false,
            group: None,
            deferred_results: Vec::new(),
        }
    }

    /// Connects now (tests and start-up): the store, or why not.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let (config, tls) = Self::store_config(url)?;
        let mut s = Self::new(config, tls);
        s.client()?;
        Ok(s)
    }

    /// Replaces the statements queued on the connection (tests: a failing one in their place).
    #[cfg(test)]
    pub(super) fn replace_queued(&mut self, sql: &str) {
        if let Some(conn) = self.client.as_mut() {
            conn.client.replace_queued(sql);
        }
    }

    /// Runs parameterless statements on the store's own session and answers their rows as text
    /// (tests: what the session has prepared, and the plans it keeps).
    #[cfg(test)]
    pub(super) fn on_session(&mut self, sql: &str) -> Vec<Vec<Option<String>>> {
        let conn = self.client().expect("a connection");
        conn.client.flush().expect("the queued statements");
        conn.client.simple_rows(sql).expect("the statements")
    }

    /// Round trips made on the current connection (tests).
    #[cfg(test)]
    pub(super) fn round_trips(&self) -> u64 {
        self.client.as_ref().map_or(0, |c| c.client.round_trips())
    }

    /// Whether this store created the model (it found an empty database).
    pub fn created_model(&self) -> bool {
        self.created
    }

    /// The connection, made now if there is none (and the backoff allows an attempt): what a
    /// read runs on (the open group's queued statements go with its statement).
    fn client(&mut self) -> Result<&mut Conn, StoreError> {
        self.connection()?;
        self.client.as_mut().ok_or_else(|| StoreError::Unavailable("no connection".into()))
    }

    /// The connection, made now if there is none (and the backoff allows an attempt). Not
    /// while a group's transaction is begun: it went with the connection it was on.
    fn connection(&mut self) -> Result<&mut Conn, StoreError> {
        if self.client.as_ref().is_some_and(|c| c.client.is_closed()) {
            self.client = None;
            self.session_durable = None;
        }
        if self.client.is_none() {
            if let Some(group) = self.group.as_mut().filter(|g| g.begun) {
                let e = StoreError::Unavailable("the connection was lost with a group commit's transaction".into());
                return Err(group.broken.get_or_insert(e).clone());
            }
            self.connect()?;
        }
        let want = self.durable;
        let Some(client) = self.client.as_mut() else {
            return Err(StoreError::Unavailable("no connection".into()));
        };
        if self.session_durable != Some(want) {
            let sql = if want { "SET synchronous_commit TO on" } else { "SET synchronous_commit TO off" };
            client.client.batch_execute(sql).map_err(pg("setting synchronous_commit"))?;
            self.session_durable = Some(want);
        }
        Ok(client)
    }

    fn connect(&mut self) -> Result<(), StoreError> {
        let now = Instant::now();
        if let Some(at) = self.next_attempt.filter(|at| now < *at) {
            let why = self.last_failure.clone().unwrap_or_default();
            return Err(StoreError::Unavailable(format!("{why} (next attempt in {} ms)", (at - now).as_millis())));
        }
        match self.open_client() {
            Ok(client) => {
                if self.last_failure.take().is_some() {
                    tracing::info!("the database is reachable again");
                }
                self.client = Some(client);
                self.session_durable = None;
                self.backoff = FIRST_BACKOFF;
                self.next_attempt = None;
                // Other writers may have changed anything while we were away.
                self.book.counts = self.recount()?;
                self.book.counts_changed = true;
                Ok(())
            }
            Err(StoreError::Postgres { context, source }) if source.connection_lost => {
                let why = format!("{context}: {}", source.message);
                tracing::warn!(error = %why, retry_in_ms = self.backoff.as_millis() as u64, "cannot reach the database; retrying with backoff");
                self.last_failure = Some(why.clone());
                self.next_attempt = Some(now + self.backoff);
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                Err(StoreError::Unavailable(why))
            }
            Err(e) => Err(e),
        }
    }

    /// Connects, applies the migrations this database lacks, and reads (or draws) the model.
    fn open_client(&mut self) -> Result<Conn, StoreError> {
        let deadline = self.config.get_connect_timeout().copied().unwrap_or(Duration::from_secs(5));
        let mut client = PgClient::connect(&self.config, &self.tls, deadline, MIGRATION_DEADLINE + CALL_SLACK)
            .map_err(|e| match e {
                ConnectError::Postgres(e) => pg("connecting to the database")(e),
                other => StoreError::Postgres {
                    context: "connecting to the database",
                    source: PgFailure { code: None, message: other.to_string(), connection_lost: true },
                },
            })?;
        // The session's planner settings go with its first statement.
        client.queue(INDEX_PLANS_SQL);
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .and_then(|r| r.try_get(0).map_err(CallError::from))
            .map_err(pg("reading the session's process id"))?;
        let mut conn = Conn { client, statements: HashMap::new(), pid };
        let ctx = "migrating the schema";
        let mut tx = conn.transaction().map_err(pg(ctx))?;
        tx.batch_execute(&format!(
            "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}",
            ms = MIGRATION_DEADLINE.as_millis()
        ))
        .map_err(pg(ctx))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(pg(ctx))?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, \
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .map_err(pg(ctx))?;
        let found: i64 = tx
            .query_one("SELECT COALESCE(max(version), 0) FROM schema_migrations", &[])
            .and_then(|r| r.try_get(0).map_err(CallError::from))
            .map_err(pg(ctx))?;
        if found > PG_SCHEMA_VERSION {
            return Err(StoreError::TooNew { found, supported: PG_SCHEMA_VERSION });
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
            tx.batch_execute(sql).map_err(pg(ctx))?;
            tx.execute("INSERT INTO schema_migrations (version) VALUES ($1)", &[version]).map_err(pg(ctx))?;
        }
        let uuid = match meta_get(&mut tx, "model_uuid").map_err(pg("reading the model uuid"))? {
            Some(u) => u,
            None if found > 0 => {
                return Err(StoreError::Damaged {
                    context: "reading the model uuid",
                    message: "the database has a schema but no model uuid".into(),
                })
            }
            None => {
                let u = random_uuid();
                meta_set(&mut tx, "model_uuid", &u).map_err(pg("writing the model uuid"))?;
                meta_set(&mut tx, "model_life", Life::Alive.as_str()).map_err(pg("writing the model life"))?;
                self.created = true;
                u
            }
        };
        tx.commit().map_err(pg(ctx))?;
        conn.client.set_deadline(STATEMENT_DEADLINE + CALL_SLACK);
        self.model_uuid = Some(uuid);
        Ok(conn)
    }

    fn uuid(&self) -> String {
        self.model_uuid.clone().unwrap_or_default()
    }

    /// A write's transaction: begun, and checked against the fence when the work is the
    /// provisioner's and a fence is set.
    fn begin(&mut self, ctx: &'static str) -> Result<Tx<'_>, StoreError> {
        let fence = if self.fenced { self.fence.clone() } else { None };
        self.begin_with(ctx, fence)
    }

    /// A write's transaction checked against `fence` (if some): a transaction of its own, or
    /// a savepoint in the open group's (the group's transaction begun, and the fence checked
    /// once for the group, if not done yet).
    fn begin_with(&mut self, ctx: &'static str, fence: Option<Fence>) -> Result<Tx<'_>, StoreError> {
        self.connection()?;
        let Self { client, group, .. } = self;
        let Some(conn) = client.as_mut() else {
            return Err(StoreError::Unavailable("no connection".into()));
        };
        let Some(group) = group.as_mut() else {
            let mut tx = conn.transaction().map_err(pg(ctx))?;
            if let Some(f) = &fence {
                check_fence(&mut tx, f)?;
                tx.execute(RECORD_WRITE_SQL, &[&f.model_uuid, &f.holder, &f.epoch])
                    .map_err(pg("recording the write's epoch"))?;
                tx.fenced = true;
            }
            return Ok(tx);
        };
        if let Some(e) = &group.broken {
            return Err(e.clone());
        }
        if !group.begun {
            conn.client.queue("BEGIN");
            group.begun = true;
            group.began = Some(Instant::now());
        }
        if let Some(f) = &fence {
            match &group.fence {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(e.clone()),
                None => {
                    // Sent with what is queued (`BEGIN`, a savepoint): a failure of those is no
                    // `Fenced`, and breaks the group.
                    let mut run = GroupRun { client: &mut conn.client, statements: &mut conn.statements };
                    let checked = check_fence(&mut run, f).map(|()| Ok(())).or_else(|e| match e {
                        StoreError::Fenced { .. } => Ok(Err(e)),
                        e => Err(e),
                    });
                    match checked {
                        Ok(passed) => {
                            group.fence = Some(passed.clone());
                            group.fence_in_member = group.member_savepoint;
                            passed?;
                        }
                        Err(e) => return Err(group.broken.get_or_insert(e).clone()),
                    }
                }
            }
        }
        if !group.member_savepoint {
            conn.client.queue("SAVEPOINT member");
            group.member_savepoint = true;
        }
        // Sent with the write's first statement.
        let savepoint = group.member_wrote;
        if savepoint {
            conn.client.queue("SAVEPOINT write");
        }
        Ok(Tx {
            client: &mut conn.client,
            statements: &mut conn.statements,
            group: Some(group),
            fenced: fence.is_some(),
            savepoint,
            done: false,
        })
    }

    fn status_life_in(tx: &mut Tx<'_>, id: &MachineId) -> Result<Option<(String, String)>, StoreError> {
        Ok(tx
            .query_opt(STATUS_LIFE_SQL, &[&id.as_str()])
            .map_err(pg("reading a machine"))?
            .map(|r| (r.get(0), r.get(1))))
    }

    /// Creates an instance in `state` (pending, or running for a start with no latency to wait),
    /// or returns the one this client token already made, as it is (`false`).
    fn create_instance_in(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
        state: InstanceState,
    ) -> Result<(InstanceRecord, bool), StoreError> {
        let ctx = "creating an instance";
        let mut tx = self.begin(ctx)?;
        // One start per token at a time, across replicas: the second waits, then finds the
        // first's. The lock, the look-up and the insert (made only if the look-up finds nothing)
        // go in one round trip.
        let machine = tags.machine.as_ref().map(MachineId::as_str);
        let insert: [&(dyn postgres::types::ToSql + Sync); 8] =
            [&"next_instance", &1_i64, &zone, &tags.model, &machine, &tags.start, &client_token, &state.as_str()];
        let replies = tx
            .pipeline(&[
                ("SELECT pg_advisory_xact_lock(hashtext($1))", &[&client_token], true),
                (&format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE client_token = $1"), &[&client_token], true),
                (INSERT_NEW_INSTANCE_SQL, &insert, true),
            ])
            .map_err(pg(ctx))?;
        let mut replies = replies.into_iter().skip(1);
        if let Some(row) = replies.next().map(Reply::into_rows).unwrap_or_default().first() {
            return Ok((instance_from_row(row)?, false));
        }
        let id: String = replies
            .next()
            .map(Reply::into_rows)
            .unwrap_or_default()
            .first()
            .ok_or_else(|| StoreError::Refused("the new instance's row was not written".into()))?
            .try_get(0)
            .map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))?;
        self.book.instance_moved(None, state.as_str());
        Ok((InstanceRecord::created(id, state, zone, tags, client_token), true))
    }

    /// Records the instance a start made (`set_instance_info`); with `started`, counts that
    /// start as a successful attempt too (`record_start_outcome` with no error), in the same
    /// update: one round trip.
    fn record_instance(&mut self, id: &MachineId, info: &ProvisionedInstance, started: bool) -> Result<(), StoreError> {
        const SQL: &str = "UPDATE machines SET instance = $2, zone = $3, nonce = $4, display_name = $5, \
             instance_status = $6, instance_status_message = '', status = 'started', status_message = '', \
             transient = false WHERE id = $1";
        const STARTED_SQL: &str = "UPDATE machines SET instance = $2, zone = $3, nonce = $4, display_name = $5, \
             instance_status = $6, instance_status_message = '', status = 'started', status_message = '', \
             transient = false, start_attempts = start_attempts + 1, last_start_error = NULL WHERE id = $1";
        let before = self.update_machine(
            id,
            "recording an instance",
            if started { STARTED_SQL } else { SQL },
            &[
                &id.as_str(),
                &info.instance.as_str(),
                &info.zone,
                &info.nonce,
                &info.display_name,
                &info.status.as_str(),
            ],
        )?;
        self.book.count_machine(before, Some(MachineStatus::Started.as_str()), None);
        Ok(())
    }

    /// One machine update in its own (fenced) transaction, notified; `NotFound` if no row.
    fn update_machine(
        &mut self,
        id: &MachineId,
        ctx: &'static str,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Option<(String, String)>, StoreError> {
        let payload = notice_payload(&self.uuid(), "machines", std::slice::from_ref(id));
        let mut tx = self.begin(ctx)?;
        // The row read (and locked), written and notified in one round trip: if no row was
        // written the unit fails, and its notice goes with its savepoint.
        let key = id.as_str();
        let replies = tx
            .pipeline(&[
                (STATUS_LIFE_SQL, &[&key], true),
                (sql, params, false),
                (NOTIFY_SQL, &[&CHANGES_CHANNEL, &payload], true),
            ])
            .map_err(pg(ctx))?;
        let mut replies = replies.into_iter();
        let before = replies.next().map(Reply::into_rows).unwrap_or_default().first().map(|r| (r.get(0), r.get(1)));
        if replies.next().is_none_or(|n| n.count() == 0) {
            return Err(StoreError::NotFound(id.clone()));
        }
        tx.commit().map_err(pg(ctx))?;
        Ok(before)
    }

    fn constraint_row(tx: &mut Tx<'_>, c: &Constraints) -> Result<Option<i64>, StoreError> {
        if c.is_empty() {
            return Ok(None);
        }
        let ctx = "storing a constraint";
        let spec = c.to_string();
        let list = |v: &[String]| (!v.is_empty()).then(|| v.join(","));
        tx.execute(
            "INSERT INTO constraints (spec, zones, arch, cores, mem_mb, root_disk_mb, instance_type, spaces, tags) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (spec) DO NOTHING",
            &[
                &spec,
                &c.zones.as_ref().map(|z| z.join(",")),
                &c.arch,
                &c.cores.map(i64::from),
                &c.mem_mb.map(|n| n as i64),
                &c.root_disk_mb.map(|n| n as i64),
                &c.instance_type,
                &list(&c.spaces),
                &list(&c.tags),
            ],
        )
        .map_err(pg(ctx))?;
        tx.query_one("SELECT id FROM constraints WHERE spec = $1", &[&spec])
            .and_then(|r| r.try_get(0).map_err(CallError::from))
            .map(Some)
            .map_err(pg(ctx))
    }

    /// Adds `count` machines in two statements whatever the count (their ids drawn at once, the
    /// rows inserted by one statement): an add of 1,000 machines is two round trips, not 2,000.
    fn insert_machines(tx: &mut Tx<'_>, count: usize, spec: &NewMachine) -> Result<Vec<MachineId>, StoreError> {
        let constraint = Self::constraint_row(tx, &spec.constraints)?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let first = next_counters(tx, "next_machine", count as i64).map_err(pg("allocating machine ids"))?;
        let last = first + count as i64 - 1;
        tx.execute(
            "INSERT INTO machines (seq, id, constraints_id, placement, application) \
             SELECT g.n, g.n::text, $3, $4, $5 FROM generate_series($1::bigint, $2::bigint) AS g(n) ORDER BY g.n",
            &[&first, &last, &constraint, &spec.placement, &spec.application],
        )
        .map_err(pg("adding machines"))?;
        Ok((first..=last).map(|n| MachineId::from(n.to_string())).collect())
    }

    /// Sends the open group's write-behind units with its commit, in one round trip (after the
    /// group's fence check, if it has not made one): `SAVEPOINT deferred`, each unit's
    /// statements, the epochs' record, then `RELEASE SAVEPOINT deferred; SELECT 1; COMMIT`.
    /// `Ok(true)`: committed, each unit answered from its own statements' answers (a missing
    /// machine is its `NotFound`, having written nothing). If a statement failed, the
    /// transaction is aborted and the commit not run: it is rolled back to the savepoint (the
    /// other units of work of the group kept) and the units are run again one at a time, each
    /// in a savepoint of its own, answered alone (the slow path; `Ok(false)`: the group is to be
    /// committed as usual). Fenced out: each unit answers `Fenced` (`Ok(false)`). An error: the
    /// group's transaction is gone.
    fn send_deferred(&mut self, writes: Vec<Write>) -> Result<bool, StoreError> {
        let ctx = "committing a group's write-behind units";
        let uuid = self.uuid();
        let fence = self.fence.clone();
        self.connection()?;
        let Self { client, group, session_durable, .. } = self;
        let (Some(conn), Some(group)) = (client.as_mut(), group.as_mut()) else {
            return Err(StoreError::Unavailable("no connection".into()));
        };
        if let Some(e) = &group.broken {
            return Err(e.clone());
        }
        if !group.begun {
            conn.client.queue("BEGIN");
            group.begun = true;
        }
        let fenced_units = writes.iter().filter(|w| w.fenced()).count() as i64;
        if let Some(Err(e)) = fence.as_ref().and(group.fence.as_ref()) {
            let e = e.clone();
            self.run_alone(&writes, Some(&e))?;
            return Ok(false);
        }
        // The fence not checked in this group yet: checked first in the pipeline, by a
        // statement that fails if it does not pass (nothing after it runs).
        let check = fence.as_ref().filter(|_| group.fence.is_none() && fenced_units > 0);
        let run_of = runs(&writes);
        let payloads = deferred_notices(&uuid, &writes);
        let mut bound: Vec<(&str, Vec<Param<'_>>, Role)> = Vec::new();
        let recorded = group.fenced_writes + fenced_units;
        if let Some(f) = check {
            // Checked and recorded by one statement, first.
            bound.push((
                FENCE_AND_RECORD_SQL,
                vec![Box::new(&f.model_uuid), Box::new(&f.holder), Box::new(f.epoch), Box::new(recorded)],
                Role::Fence,
            ));
        }
        let adds = || {
            writes.iter().filter_map(|w| match w {
                Write::AddMachines { count, spec } => Some((*count, spec)),
                _ => None,
            })
        };
        if adds().next().is_some() {
            bound.push((ADD_MANY_SQL, add_many_params(adds(), &uuid), Role::Added));
        }
        bound.extend(deferred_statements(&writes, &run_of, &payloads));
        if let Some(f) = fence.as_ref().filter(|_| recorded > 0 && check.is_none()) {
            bound.push((
                RECORD_WRITES_SQL,
                vec![Box::new(&f.model_uuid), Box::new(&f.holder), Box::new(f.epoch), Box::new(recorded)],
                Role::Other,
            ));
        }
        let params: Vec<Vec<&(dyn ToSql + Sync)>> =
            bound.iter().map(|(_, p, _)| p.iter().map(|b| &**b as &(dyn ToSql + Sync)).collect()).collect();
        let mut piped = Vec::with_capacity(bound.len());
        for ((sql, _, _), params) in bound.iter().zip(&params) {
            let statement = prepared(&mut conn.client, &mut conn.statements, sql)
                .map_err(|e| group.broken.get_or_insert(pg(ctx)(e)).clone())?;
            piped.push(Piped { statement, params, rows: true });
        }
        let durability = match (*session_durable == Some(group.durable), group.durable) {
            (true, _) => "",
            (false, true) => "SET LOCAL synchronous_commit TO on; ",
            (false, false) => "SET LOCAL synchronous_commit TO off; ",
        };
        conn.client.queue("SAVEPOINT deferred");
        // In a transaction that failed, the release fails and nothing after it runs.
        let then = format!("RELEASE SAVEPOINT deferred; {durability}SELECT 1; COMMIT");
        let (answers, committed) =
            conn.client.pipeline_then(&piped, &then).map_err(|e| group.broken.get_or_insert(pg(ctx)(e)).clone())?;
        let fenced_out = match check {
            None => None,
            Some(f) => match answers.first() {
                Some(Err(e)) if e.code() == Some(&postgres::error::SqlState::DIVISION_BY_ZERO) => {
                    Some(StoreError::Fenced {
                        model_uuid: f.model_uuid.clone(),
                        holder: f.holder.clone(),
                        epoch: f.epoch,
                    })
                }
                _ => None,
            },
        };
        let roles: Vec<Role> = bound.iter().map(|(_, _, role)| *role).collect();
        match (committed, fenced_out) {
            (Ok(()), _) => {
                if check.is_some() {
                    group.fence = Some(Ok(()));
                }
            }
            (Err(e), out) if out.is_none() && answers.iter().all(Result::is_ok) || conn.client.is_closed() => {
                return Err(group.broken.get_or_insert(pg(ctx)(e)).clone());
            }
            (Err(_), Some(out)) => {
                // Fenced out: none of the units is written; the group's other units of work
                // (none of them fenced: the group had not checked its fence) commit.
                conn.client.queue("ROLLBACK TO SAVEPOINT deferred");
                conn.client.queue("RELEASE SAVEPOINT deferred");
                group.fence = Some(Err(out.clone()));
                // An operator's adds are not fenced: made one at a time.
                self.run_alone(&writes, Some(&out))?;
                return Ok(false);
            }
            (Err(_), None) => {
                // The slow path: back to before the units, then each alone (a fence checked
                // in the pipeline went with the savepoint: checked again).
                conn.client.queue("ROLLBACK TO SAVEPOINT deferred");
                conn.client.queue("RELEASE SAVEPOINT deferred");
                if check.is_some() {
                    group.fence = None;
                }
                self.run_alone(&writes, None)?;
                return Ok(false);
            }
        }
        // Committed: each unit's answer from its run's statements'.
        let runs_count = run_of.last().map_or(0, |r| r + 1);
        let mut before: Vec<HashMap<String, (String, String)>> = vec![HashMap::new(); runs_count];
        let mut updated: Vec<std::collections::HashSet<String>> = vec![Default::default(); runs_count];
        let mut inserted: Vec<HashMap<String, String>> = vec![HashMap::new(); runs_count];
        let mut added_first: Option<i64> = None;
        for (role, answer) in roles.into_iter().zip(answers) {
            let rows = match answer {
                Ok(reply) => reply.into_rows(),
                // Committed, so every statement succeeded; a failure here is the client's.
                Err(e) => {
                    let e = pg(ctx)(e);
                    self.deferred_results = writes.iter().map(|_| Err(e.clone())).collect();
                    return Ok(true);
                }
            };
            let read = |r: &Row, i: usize| r.try_get::<_, String>(i).map_err(pg(ctx));
            let mut take = |r: &Row| -> Result<(), StoreError> {
                match role {
                    Role::Locked(run) => {
                        before[run].insert(read(r, 0)?, (read(r, 1)?, read(r, 2)?));
                    }
                    Role::Updated(run) => {
                        updated[run].insert(read(r, 0)?);
                    }
                    Role::Inserted(run) => {
                        inserted[run].insert(read(r, 0)?, read(r, 1)?);
                    }
                    Role::Added => added_first = Some(r.try_get::<_, i64>(0).map_err(pg(ctx))?),
                    Role::Fence | Role::Other => {}
                }
                Ok(())
            };
            if let Err(e) = rows.iter().try_for_each(&mut take) {
                self.deferred_results = writes.iter().map(|_| Err(e.clone())).collect();
                return Ok(true);
            }
        }
        let mut results = Vec::with_capacity(writes.len());
        let mut look_up = Vec::new();
        let mut next_added = added_first;
        for (i, (w, run)) in writes.iter().zip(&run_of).enumerate() {
            let result = match w {
                Write::AddMachines { count, .. } => match next_added.as_mut() {
                    Some(next) => {
                        let ids: Vec<MachineId> =
                            (*next..*next + *count as i64).map(|n| MachineId::from(n.to_string())).collect();
                        *next += *count as i64;
                        self.book.added(&ids, MachineStatus::Pending);
                        Ok(Written::Added(ids))
                    }
                    None => Err(StoreError::ModelDying),
                },
                Write::RunningInstance { client_token, zone, tags } => match inserted[*run].remove(client_token) {
                    Some(id) => {
                        self.book.instance_moved(None, InstanceState::Running.as_str());
                        let record =
                            InstanceRecord::created(id, InstanceState::Running, zone.as_deref(), tags, client_token);
                        Ok(Written::Instance(record, true))
                    }
                    None => {
                        // The token's instance was there: read after the commit.
                        look_up.push(i);
                        Ok(Written::Done)
                    }
                },
                Write::MachineStatus { id, .. }
                | Write::InstanceStatus { id, .. }
                | Write::StartedInstance { id, .. } => {
                    match (before[*run].remove(id.as_str()), updated[*run].contains(id.as_str())) {
                        (Some(was), true) => {
                            match w {
                                Write::MachineStatus { status, .. } => {
                                    self.book.count_machine(Some(was), Some(status.as_str()), None)
                                }
                                Write::StartedInstance { .. } => {
                                    self.book.count_machine(Some(was), Some(MachineStatus::Started.as_str()), None)
                                }
                                _ => {}
                            }
                            Ok(Written::Done)
                        }
                        _ => Err(StoreError::NotFound(id.clone())),
                    }
                }
            };
            results.push(result);
        }
        for i in look_up {
            let Write::RunningInstance { client_token, .. } = &writes[i] else { continue };
            let sql = format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE client_token = $1");
            results[i] = self
                .client()
                .and_then(|c| c.query_opt(&sql, &[&client_token.as_str()]).map_err(pg("reading an instance")))
                .and_then(|row| {
                    let row = row.ok_or_else(|| StoreError::Refused("the token's instance is gone".into()))?;
                    Ok(Written::Instance(instance_from_row(&row)?, false))
                });
        }
        self.deferred_results = results;
        Ok(true)
    }

    /// Runs `writes` one at a time, each a unit of work of the open group of its own (the slow
    /// path of [`PgStore::send_deferred`]); with `fenced_out`, a fenced one answers that
    /// instead. Their answers are kept for [`StoreBackend::take_deferred`].
    fn run_alone(&mut self, writes: &[Write], fenced_out: Option<&StoreError>) -> Result<(), StoreError> {
        let mut results = Vec::with_capacity(writes.len());
        for w in writes {
            if let (true, Some(e)) = (w.fenced(), fenced_out) {
                results.push(Err(e.clone()));
                continue;
            }
            self.fenced = w.fenced();
            self.begin_member()?;
            let result = w.apply(self);
            if let Err(e) = &result {
                self.note_damage(e);
            }
            self.end_member(result.is_ok())?;
            results.push(result);
        }
        self.deferred_results = results;
        Ok(())
    }

    /// Reads `ids` by one statement (`sql`, `$1` the ids, each row's first column its id), each
    /// row by `read`: in request order, `None` for an id not found.
    fn read_many<T: Clone>(
        &mut self,
        ids: &[MachineId],
        sql: &str,
        read: impl Fn(&Row) -> Result<T, StoreError>,
    ) -> Result<Vec<Option<T>>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let asked: Vec<&str> = ids.iter().map(MachineId::as_str).collect();
        let rows = self.client()?.query(sql, &[&asked]).map_err(pg("reading machines"))?;
        let mut found = HashMap::with_capacity(rows.len());
        for row in &rows {
            let id: String = row.try_get(0).map_err(pg("reading machines"))?;
            found.insert(id, read(row)?);
        }
        Ok(ids.iter().map(|id| found.get(id.as_str()).cloned()).collect())
    }

    fn query_ids(
        &mut self,
        ctx: &'static str,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<MachineId>, StoreError> {
        let rows = self.client()?.query(sql, params).map_err(pg(ctx))?;
        ids_of(rows, ctx)
    }
}

impl StoreBackend for PgStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn set_durable(&mut self, durable: bool) -> Result<(), StoreError> {
        self.durable = durable; // applied to the session before the next statement
        Ok(())
    }
    fn set_fenced(&mut self, fenced: bool) {
        self.fenced = fenced;
    }
    fn set_fence(&mut self, fence: Option<Fence>) -> Result<(), StoreError> {
        if self.group.is_some() {
            return Err(StoreError::Refused("the fence cannot change inside a group commit".into()));
        }
        self.fence = fence;
        Ok(())
    }

    fn begin_group(&mut self, durable: bool) -> Result<bool, StoreError> {
        if self.group.is_some() {
            return Err(StoreError::Refused("a group commit is open already".into()));
        }
        if let Some(conn) = self.client.as_mut() {
            conn.client.take_queued_failure(); // a past group's, rolled back with it
        }
        self.group = Some(PgGroup { before: self.book.mark(), durable, ..PgGroup::default() });
        Ok(true)
    }
    fn group_full(&self, units: usize) -> bool {
        units >= MAX_GROUP || self.group.as_ref().and_then(|g| g.began).is_some_and(|t| t.elapsed() >= MAX_GROUP_TIME)
    }
    fn raise_group_durability(&mut self) -> bool {
        // `synchronous_commit` is read at the commit: the group's is set just before it.
        match self.group.as_mut() {
            Some(g) => {
                g.durable = true;
                true
            }
            None => false,
        }
    }
    fn begin_member(&mut self) -> Result<(), StoreError> {
        let Some(group) = self.group.as_mut() else {
            return Err(StoreError::Refused("no group commit is open".into()));
        };
        if let Some(e) = &group.broken {
            return Err(e.clone());
        }
        group.member = Some(self.book.mark());
        group.member_fenced_writes = 0;
        group.member_wrote = false;
        // Once the transaction is begun, every unit of work has its savepoint (a failed read
        // would otherwise abort the group's transaction); before, a read runs outside it.
        if group.begun {
            let Some(conn) = self.client.as_mut() else {
                let e = StoreError::Unavailable("the connection was lost with a group commit's transaction".into());
                return Err(group.broken.get_or_insert(e).clone());
            };
            conn.client.queue("SAVEPOINT member"); // sent with its first statement
            group.member_savepoint = true;
        }
        Ok(())
    }
    fn end_member(&mut self, keep: bool) -> Result<(), StoreError> {
        let Some(group) = self.group.as_mut() else {
            return Err(StoreError::Refused("no group commit is open".into()));
        };
        let Some(mark) = group.member.take() else {
            return Err(StoreError::Refused("no write of a group is in progress".into()));
        };
        let savepoint = std::mem::take(&mut group.member_savepoint);
        let fenced_writes = std::mem::take(&mut group.member_fenced_writes);
        group.member_wrote = false;
        queued_failure(self.client.as_mut(), group);
        if let Some(e) = &group.broken {
            self.book.undo(mark);
            return Err(e.clone());
        }
        let conn = match self.client.as_mut() {
            Some(conn) => Some(conn),
            None if savepoint => {
                let e = StoreError::Unavailable("the connection was lost with a group commit's transaction".into());
                self.book.undo(mark);
                return Err(group.broken.get_or_insert(e).clone());
            }
            None => None,
        };
        // The release or the rollback goes with the next statement, or with the commit.
        if keep {
            if let Some(conn) = conn.filter(|_| savepoint) {
                conn.client.queue("RELEASE SAVEPOINT member");
            }
            group.fenced_writes += fenced_writes;
            group.fence_in_member = false;
            self.book.keep(mark);
            return Ok(());
        }
        self.book.undo(mark);
        if std::mem::take(&mut group.fence_in_member) {
            group.fence = None; // its lock went with the savepoint
        }
        if let Some(conn) = conn.filter(|_| savepoint) {
            conn.client.queue("ROLLBACK TO SAVEPOINT member");
            conn.client.queue("RELEASE SAVEPOINT member");
        }
        Ok(())
    }
    fn group_has_written(&self) -> bool {
        self.group.as_ref().is_some_and(|g| g.written)
    }
    fn defer(&mut self, write: Write) -> Option<Write> {
        let Some(group) = self.group.as_mut().filter(|g| g.member.is_none()) else {
            return Some(write);
        };
        if let Write::AddMachines { count, spec } = &write {
            // Constraints are stored first, by statements of their own: such an add runs alone.
            if *count == 0 || !spec.constraints.is_empty() {
                return Some(write);
            }
        }
        // The group's time bound runs from its first unit of work, queued or sent.
        group.began.get_or_insert_with(Instant::now);
        group.deferred.push(write);
        None
    }
    fn take_deferred(&mut self) -> Vec<Result<Written, StoreError>> {
        std::mem::take(&mut self.deferred_results)
    }
    fn commit_group(&mut self) -> Result<(), StoreError> {
        self.deferred_results.clear();
        let deferred = self.group.as_mut().map(|g| std::mem::take(&mut g.deferred)).unwrap_or_default();
        if !deferred.is_empty() {
            match self.send_deferred(deferred) {
                Ok(true) => {
                    if let Some(group) = self.group.take() {
                        self.book.keep(group.before);
                    }
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => {
                    self.deferred_results.clear();
                    if let Some(group) = self.group.as_mut() {
                        group.broken.get_or_insert(e);
                    }
                }
            }
        }
        let Some(mut group) = self.group.take() else {
            return Err(StoreError::Refused("no group commit is open".into()));
        };
        if !group.begun {
            if let Some(e) = group.broken {
                self.book.undo(group.before);
                return Err(e);
            }
            self.book.keep(group.before);
            return Ok(());
        }
        let ctx = "committing a group of writes";
        let committed = (|| {
            if let Some(e) = group.broken.take() {
                return Err(e);
            }
            let conn = self.client.as_mut().ok_or_else(|| {
                StoreError::Unavailable("the connection was lost with a group commit's transaction".into())
            })?;
            if let Some(e) = queued_failure(Some(conn), &mut group) {
                return Err(e);
            }
            if let Some(f) = self.fence.as_ref().filter(|_| group.fenced_writes > 0) {
                let mut run = GroupRun { client: &mut conn.client, statements: &mut conn.statements };
                run.execute(RECORD_WRITES_SQL, &[&f.model_uuid, &f.holder, &f.epoch, &group.fenced_writes])
                    .map_err(pg("recording the writes' epoch"))?;
            }
            if self.session_durable != Some(group.durable) {
                conn.client.queue(if group.durable {
                    "SET LOCAL synchronous_commit TO on"
                } else {
                    "SET LOCAL synchronous_commit TO off"
                });
            }
            // In a transaction that failed, COMMIT would roll back and answer success: the
            // SELECT before it fails there, and the commit is not sent.
            conn.client.queue("SELECT 1");
            conn.client.queue("COMMIT");
            conn.client.flush().map_err(pg(ctx))
        })();
        match committed {
            Ok(()) => {
                self.book.keep(group.before);
                Ok(())
            }
            Err(e) => {
                if let Some(conn) = self.client.as_mut().filter(|c| !c.client.is_closed()) {
                    let _ = conn.client.rollback();
                }
                self.book.undo(group.before);
                Err(e)
            }
        }
    }
    fn abort_group(&mut self) {
        self.deferred_results.clear();
        if let Some(group) = self.group.take() {
            if let Some(conn) = self.client.as_mut().filter(|c| group.begun && !c.client.is_closed()) {
                let _ = conn.client.rollback();
            }
            self.book.undo(group.before);
        }
    }

    fn api_token_hash(&mut self, offer: &str) -> Result<String, StoreError> {
        let ctx = "keeping the API token's hash";
        let mut tx = self.begin_with(ctx, None)?;
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('api_token_sha256', $1) ON CONFLICT (key) DO NOTHING",
            &[&offer],
        )
        .map_err(pg(ctx))?;
        let kept = meta_get(&mut tx, "api_token_sha256").map_err(pg(ctx))?.unwrap_or_else(|| offer.to_owned());
        tx.commit().map_err(pg(ctx))?;
        Ok(kept)
    }
    fn take_outbox(&mut self) -> (Vec<MachineId>, bool) {
        self.book.take_outbox()
    }
    fn counts(&self) -> &StoreCounts {
        &self.book.counts
    }
    fn take_counts(&mut self) -> Option<StoreCounts> {
        self.book.take_counts()
    }
    fn recount(&mut self) -> Result<StoreCounts, StoreError> {
        let client = self.client.as_mut().ok_or_else(|| StoreError::Unavailable("no connection".into()))?;
        let mut group = |sql: &str| -> Result<std::collections::BTreeMap<String, u64>, StoreError> {
            let rows = client.query(sql, &[]).map_err(pg("counting"))?;
            Ok(rows.iter().map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64)).collect())
        };
        let machines_by_status = group("SELECT status, count(*) FROM machines GROUP BY status")?;
        let machines_by_life = group("SELECT life, count(*) FROM machines GROUP BY life")?;
        let instances_by_state = group("SELECT state, count(*) FROM instances GROUP BY state")?;
        let life = meta_get(client, "model_life").map_err(pg("reading the model life"))?;
        let model_life = life.and_then(|l| l.parse::<Life>().ok()).unwrap_or(Life::Alive).to_string();
        Ok(StoreCounts { machines_by_status, machines_by_life, instances_by_state, model_life })
    }
    fn refresh_counts(&mut self, resync: bool, senders: &[i32]) -> Result<(), StoreError> {
        let own = self.client.as_ref().map(|c| c.pid);
        if resync || senders.iter().any(|p| Some(*p) != own) {
            self.client()?; // the open group's savepoints sent first
            self.book.counts = self.recount()?;
            self.book.counts_changed = true;
        }
        Ok(())
    }
    fn session_pid(&self) -> Option<i32> {
        self.client.as_ref().map(|c| c.pid)
    }
    fn note_damage(&mut self, e: &StoreError) {
        // A lost connection is not damage: drop it, the next operation reconnects.
        if let StoreError::Postgres { source, .. } = e {
            if source.connection_lost {
                self.client = None;
                self.session_durable = None;
            }
        }
    }
    fn check_readable(&mut self) -> Result<(), StoreError> {
        let r = self
            .client()?
            .query_opt("SELECT value FROM meta WHERE key = 'model_uuid'", &[])
            .map_err(pg("reading the database"));
        if let Err(e) = &r {
            self.note_damage(e);
        }
        r?.map(|_| ()).ok_or_else(|| StoreError::Refused("the database has no model uuid".into()))
    }

    fn model_uuid(&mut self) -> Result<String, StoreError> {
        self.client()?;
        self.model_uuid.clone().ok_or_else(|| StoreError::Refused("the database has no model uuid".into()))
    }
    fn model_life(&mut self) -> Result<Life, StoreError> {
        let life = meta_get(self.client()?, "model_life").map_err(pg("reading the model life"))?;
        Ok(life.and_then(|l| l.parse().ok()).unwrap_or(Life::Alive))
    }
    fn machine(&mut self, id: &MachineId) -> Result<Option<MachineRecord>, StoreError> {
        let row = self
            .client()?
            .query_opt(&format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} WHERE m.id = $1"), &[&id.as_str()])
            .map_err(pg("reading a machine"))?;
        row.as_ref().map(machine_from_row).transpose()
    }
    fn machines(&mut self, ids: &[MachineId]) -> Result<Vec<Option<MachineRecord>>, StoreError> {
        // One statement for them all (the provisioner reads its machines in batches).
        let sql = format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} WHERE m.id = ANY($1)");
        self.read_many(ids, &sql, machine_from_row)
    }
    fn model_machines(&mut self, ids: &[MachineId]) -> Result<Vec<Option<Machine>>, StoreError> {
        self.read_many(ids, LEAN_MACHINE_SQL, lean_machine_from_row)
    }
    fn machine_applications(&mut self, ids: &[MachineId]) -> Result<Vec<Option<Option<String>>>, StoreError> {
        self.read_many(ids, MACHINE_APPLICATION_SQL, |r| r.try_get(1).map_err(pg("reading a machine")))
    }
    fn provisioning_info(&mut self, ids: &[MachineId]) -> Result<Vec<Option<ProvisioningInfo>>, StoreError> {
        self.read_many(ids, MACHINE_PROVISIONING_SQL, |r| {
            Ok(ProvisioningInfo {
                constraints: constraints_from_row(r, 1)?,
                placement: r.try_get(9).map_err(pg("reading a machine"))?,
                ..ProvisioningInfo::default()
            })
        })
    }
    fn list_machines(&mut self) -> Result<Vec<MachineRecord>, StoreError> {
        let rows = self
            .client()?
            .query(&format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} ORDER BY m.seq"), &[])
            .map_err(pg("listing machines"))?;
        rows.iter().map(machine_from_row).collect()
    }
    fn machine_ids(&mut self) -> Result<Vec<MachineId>, StoreError> {
        self.query_ids("listing machines", "SELECT id FROM machines ORDER BY seq", &[])
    }
    fn set_instance_info(&mut self, id: &MachineId, info: &ProvisionedInstance) -> Result<(), StoreError> {
        self.record_instance(id, info, false)
    }
    fn set_status(&mut self, id: &MachineId, status: MachineStatus, message: &str) -> Result<(), StoreError> {
        let before = self.update_machine(
            id,
            "writing a machine status",
            "UPDATE machines SET status = $2, status_message = $3, \
             transient = CASE WHEN $2 = 'pending' THEN false ELSE transient END WHERE id = $1",
            &[&id.as_str(), &status.as_str(), &message],
        )?;
        self.book.count_machine(before, Some(status.as_str()), None);
        Ok(())
    }
    fn set_instance_status(
        &mut self,
        id: &MachineId,
        status: &InstanceStatus,
        message: &str,
    ) -> Result<(), StoreError> {
        self.update_machine(
            id,
            "writing an instance status",
            "UPDATE machines SET instance_status = $2, instance_status_message = $3 WHERE id = $1",
            &[&id.as_str(), &status.as_str(), &message],
        )
        .map(|_| ())
    }
    fn record_started_instance(&mut self, id: &MachineId, info: &ProvisionedInstance) -> Result<(), StoreError> {
        self.record_instance(id, info, true)
    }
    fn record_start_outcome(&mut self, id: &MachineId, error: Option<&str>) -> Result<(), StoreError> {
        self.update_machine(
            id,
            "recording a start attempt",
            "UPDATE machines SET start_attempts = start_attempts + 1, last_start_error = $2 WHERE id = $1",
            &[&id.as_str(), &error],
        )
        .map(|_| ())
    }
    fn ensure_dead(&mut self, id: &MachineId) -> Result<(), StoreError> {
        let ctx = "taking a machine to dead";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        let before = Self::status_life_in(&mut tx, id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?;
        if before.1 == Life::Dead.as_str() {
            return Ok(()); // nothing to write (the transaction rolls back)
        }
        tx.execute("UPDATE machines SET life = 'dead' WHERE id = $1", &[&id.as_str()]).map_err(pg(ctx))?;
        notify(&mut tx, &uuid, "machines", std::slice::from_ref(id))?;
        tx.commit().map_err(pg(ctx))?;
        self.book.count_machine(Some(before), None, Some(Life::Dead.as_str()));
        self.book.changed.insert(id.clone());
        Ok(())
    }
    fn mark_for_removal(&mut self, id: &MachineId) -> Result<(), StoreError> {
        let ctx = "removing a machine";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        let (status, life) = Self::status_life_in(&mut tx, id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?;
        if life != Life::Dead.as_str() {
            return Err(StoreError::Refused(format!("machine {id} is not dead")));
        }
        tx.execute("DELETE FROM machines WHERE id = $1", &[&id.as_str()]).map_err(pg(ctx))?;
        notify(&mut tx, &uuid, "machines", std::slice::from_ref(id))?;
        tx.commit().map_err(pg(ctx))?;
        self.book.removed(&status, &life);
        Ok(())
    }
    fn destroy_model(&mut self) -> Result<Vec<Machine>, StoreError> {
        let ctx = "destroying the model";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        if life_in(&mut tx)? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        meta_set(&mut tx, "model_life", Life::Dying.as_str()).map_err(pg(ctx))?;
        let rows =
            tx.query(&format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} ORDER BY m.seq"), &[]).map_err(pg(ctx))?;
        let machines = rows.iter().map(|r| machine_from_row(r).map(|m| m.machine)).collect::<Result<Vec<_>, _>>()?;
        notify(&mut tx, &uuid, "model", &[])?;
        tx.commit().map_err(pg(ctx))?;
        self.book.counts.model_life = Life::Dying.to_string();
        self.book.counts_changed = true;
        Ok(machines)
    }
    fn remove_machines(&mut self, ids: &[MachineId], keep_instance: bool, force: bool) -> Result<(), StoreError> {
        if !force {
            refuse_hosts_with_live_containers(self, ids)?;
        }
        let ctx = "removing machines";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        let mut seen = std::collections::BTreeSet::new();
        let mut moved = Vec::new();
        for id in ids {
            if !seen.insert(id) {
                continue;
            }
            let Some((status, life)) = Self::status_life_in(&mut tx, id)? else {
                return Err(StoreError::NotFound(id.clone()));
            };
            if life == "dead" && !force {
                return Err(StoreError::Refused(format!(
                    "machine {id} is already being removed (use --force to ask again)"
                )));
            }
            tx.execute(
                "UPDATE machines SET life = 'dead', keep_instance = (keep_instance OR $2) WHERE id = $1",
                &[&id.as_str(), &keep_instance],
            )
            .map_err(pg(ctx))?;
            moved.push((status, life));
        }
        notify(&mut tx, &uuid, "machines", ids)?;
        tx.commit().map_err(pg(ctx))?;
        for before in moved {
            self.book.count_machine(Some(before), None, Some(Life::Dead.as_str()));
        }
        self.book.changed.extend(ids.iter().cloned());
        Ok(())
    }
    fn retry_machines(&mut self, ids: &[MachineId]) -> Result<(), StoreError> {
        let ctx = "marking machines for retry";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        for id in ids.iter().collect::<std::collections::BTreeSet<_>>() {
            let row = tx
                .query_opt(
                    "SELECT life, instance, instance_status FROM machines WHERE id = $1 FOR UPDATE",
                    &[&id.as_str()],
                )
                .map_err(pg(ctx))?;
            let Some(row) = row else { return Err(StoreError::NotFound(id.clone())) };
            let (life, instance, status): (String, Option<String>, String) = (row.get(0), row.get(1), row.get(2));
            if life != "alive" || instance.is_some() || !InstanceStatus::other(status).is_error() {
                return Err(StoreError::Refused(format!("machine {id} is not in a provisioning error")));
            }
            tx.execute("UPDATE machines SET transient = true WHERE id = $1", &[&id.as_str()]).map_err(pg(ctx))?;
        }
        notify(&mut tx, &uuid, "machines", ids)?;
        tx.commit().map_err(pg(ctx))?;
        self.book.retry_due = true;
        Ok(())
    }
    fn settings(&mut self) -> Result<Settings, StoreError> {
        let client = self.client()?;
        let mode = meta_get(client, "harvest_mode").map_err(pg("reading settings"))?;
        let workers = meta_get(client, "workers").map_err(pg("reading settings"))?;
        Ok(Settings { harvest_mode: mode.and_then(|m| m.parse().ok()), workers: workers.and_then(|w| w.parse().ok()) })
    }
    fn set_harvest_mode(&mut self, mode: HarvestMode) -> Result<(), StoreError> {
        let ctx = "writing the harvest mode";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        meta_set(&mut tx, "harvest_mode", mode.as_str()).map_err(pg(ctx))?;
        notify(&mut tx, &uuid, "settings", &[])?;
        tx.commit().map_err(pg(ctx))
    }
    fn set_workers(&mut self, workers: usize) -> Result<(), StoreError> {
        let ctx = "writing the worker count";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        meta_set(&mut tx, "workers", &workers.to_string()).map_err(pg(ctx))?;
        notify(&mut tx, &uuid, "settings", &[])?;
        tx.commit().map_err(pg(ctx))
    }
    fn add_new_machines(&mut self, count: usize, spec: &NewMachine) -> Result<Vec<MachineId>, StoreError> {
        let ctx = "adding machines";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        let ids = if count > 0 && spec.constraints.is_empty() {
            // The model's life checked, the ids drawn, the rows inserted and notified by one
            // statement.
            let p = add_many_params(std::iter::once((count, spec)), &uuid);
            let params: Vec<&(dyn ToSql + Sync)> = p.iter().map(|b| &**b as &(dyn ToSql + Sync)).collect();
            let first: i64 = match tx.query_opt(ADD_MANY_SQL, &params).map_err(pg(ctx))? {
                Some(row) => row.try_get(0).map_err(pg(ctx))?,
                None => return Err(StoreError::ModelDying),
            };
            (first..first + count as i64).map(|n| MachineId::from(n.to_string())).collect()
        } else {
            if life_in(&mut tx)? != Life::Alive {
                return Err(StoreError::ModelDying);
            }
            let ids = Self::insert_machines(&mut tx, count, spec)?;
            notify(&mut tx, &uuid, "machines", &ids)?;
            ids
        };
        tx.commit().map_err(pg(ctx))?;
        self.book.added(&ids, MachineStatus::Pending);
        Ok(ids)
    }
    fn add_application(
        &mut self,
        name: &str,
        units: usize,
        constraints: &Constraints,
    ) -> Result<Vec<MachineId>, StoreError> {
        let ctx = "adding an application";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        if life_in(&mut tx)? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        let constraint = Self::constraint_row(&mut tx, constraints)?;
        let n = tx
            .execute(
                "INSERT INTO applications (name, constraints_id) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                &[&name, &constraint],
            )
            .map_err(pg(ctx))?;
        if n == 0 {
            return Err(StoreError::Refused(format!("application {name:?} already exists")));
        }
        let spec = NewMachine {
            constraints: constraints.clone(),
            application: Some(name.to_owned()),
            ..NewMachine::default()
        };
        let ids = Self::insert_machines(&mut tx, units, &spec)?;
        notify(&mut tx, &uuid, "machines", &ids)?;
        tx.commit().map_err(pg(ctx))?;
        self.book.added(&ids, MachineStatus::Pending);
        Ok(ids)
    }
    fn applications(&mut self) -> Result<Vec<ApplicationRecord>, StoreError> {
        let ctx = "listing applications";
        let rows = self
            .client()?
            .query(
                "SELECT a.name, c.spec FROM applications a LEFT JOIN constraints c ON c.id = a.constraints_id \
                 ORDER BY a.name",
                &[],
            )
            .map_err(pg(ctx))?;
        let apps: Vec<(String, Option<String>)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        apps.into_iter()
            .map(|(name, spec)| {
                let constraints = spec.and_then(|s| Constraints::parse(&s).ok()).unwrap_or_default();
                let machines = self.application_machines(&name)?;
                Ok(ApplicationRecord { name, constraints, machines })
            })
            .collect()
    }
    fn application_machines(&mut self, name: &str) -> Result<Vec<MachineId>, StoreError> {
        self.query_ids(
            "reading an application's machines",
            "SELECT id FROM machines WHERE application = $1 AND life != 'dead' ORDER BY seq",
            &[&name],
        )
    }
    fn remove_application(&mut self, name: &str) -> Result<Vec<MachineId>, StoreError> {
        let ctx = "removing an application";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        let n = tx.execute("DELETE FROM applications WHERE name = $1", &[&name]).map_err(pg(ctx))?;
        if n == 0 {
            return Err(StoreError::NoApplication(name.to_owned()));
        }
        let rows = tx
            .query(
                "SELECT id, status, life FROM machines WHERE application = $1 AND life != 'dead' ORDER BY seq \
                 FOR UPDATE",
                &[&name],
            )
            .map_err(pg(ctx))?;
        let moved: Vec<(String, String, String)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        tx.execute("UPDATE machines SET life = 'dead' WHERE application = $1 AND life != 'dead'", &[&name])
            .map_err(pg(ctx))?;
        let ids: Vec<MachineId> = moved.iter().map(|(id, _, _)| MachineId::from(id.clone())).collect();
        notify(&mut tx, &uuid, "machines", &ids)?;
        tx.commit().map_err(pg(ctx))?;
        for (_, status, life) in moved {
            self.book.count_machine(Some((status, life)), None, Some(Life::Dead.as_str()));
        }
        self.book.changed.extend(ids.iter().cloned());
        Ok(ids)
    }
    fn add_containers(&mut self, host: &MachineId, kind: &str, count: usize) -> Result<Vec<MachineId>, StoreError> {
        let ctx = "adding containers";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        if life_in(&mut tx)? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        match Self::status_life_in(&mut tx, host)? {
            None => {
                return Err(StoreError::Invalid { field: "host", message: format!("machine {host} does not exist") })
            }
            Some((_, life)) if life != Life::Alive.as_str() => {
                return Err(StoreError::Invalid {
                    field: "host",
                    message: format!("machine {host} is {life}: containers need an alive host"),
                })
            }
            Some(_) => {}
        }
        let key = format!("next_container/{host}/{kind}");
        let mut ids = Vec::with_capacity(count);
        for _ in 0..count {
            let n = next_counter(&mut tx, &key).map_err(pg("allocating a container id"))?;
            let seq = next_counter(&mut tx, "next_container_seq").map_err(pg("allocating a container id"))?;
            let id = format!("{host}/{kind}/{n}");
            tx.execute("INSERT INTO machines (seq, id) VALUES ($1, $2)", &[&(CONTAINER_SEQ_BASE + seq), &id])
                .map_err(pg(ctx))?;
            ids.push(MachineId::from(id));
        }
        notify(&mut tx, &uuid, "machines", &ids)?;
        tx.commit().map_err(pg(ctx))?;
        self.book.added(&ids, MachineStatus::Pending);
        Ok(ids)
    }
    fn add_manual(&mut self, address: &str) -> Result<MachineId, StoreError> {
        let ctx = "adding a manual machine";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        if life_in(&mut tx)? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        // One registration of an address at a time, across replicas.
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&address]).map_err(pg(ctx))?;
        let taken = tx
            .query_opt(
                "SELECT id FROM machines WHERE manual AND address = $1 AND life != 'dead' ORDER BY seq LIMIT 1",
                &[&address],
            )
            .map_err(pg(ctx))?;
        if let Some(row) = taken {
            let id: String = row.get(0);
            return Err(StoreError::Invalid {
                field: "address",
                message: format!("{address} is already manual machine {id}"),
            });
        }
        let n = next_counter(&mut tx, "next_machine").map_err(pg("allocating a machine id"))?;
        let id = MachineId::from(n.to_string());
        tx.execute(
            "INSERT INTO machines (seq, id, status, status_message, instance, instance_status, manual, address) \
             VALUES ($1, $2, 'started', $3, $4, $5, true, $6)",
            &[
                &n,
                &id.as_str(),
                &format!("manually provisioned at {address}"),
                &format!("manual:{address}"),
                &InstanceStatus::running().as_str(),
                &address,
            ],
        )
        .map_err(pg(ctx))?;
        notify(&mut tx, &uuid, "machines", std::slice::from_ref(&id))?;
        tx.commit().map_err(pg(ctx))?;
        self.book.added(std::slice::from_ref(&id), MachineStatus::Started);
        Ok(id)
    }
    fn live_containers_of(&mut self, host: &MachineId) -> Result<Vec<MachineId>, StoreError> {
        let prefix = format!("{host}/");
        let ids = self.query_ids(
            "listing containers",
            "SELECT id FROM machines WHERE starts_with(id, $1) AND life != 'dead' ORDER BY seq",
            &[&prefix],
        )?;
        Ok(ids.into_iter().filter(|c| c.container_of().is_some_and(|(h, _)| &h == host)).collect())
    }
    fn machines_in_error(&mut self) -> Result<u64, StoreError> {
        let ctx = "counting machines in error";
        let n: i64 = self
            .client()?
            .query_one("SELECT count(*) FROM machine_errors", &[])
            .and_then(|r| r.try_get(0).map_err(CallError::from))
            .map_err(pg(ctx))?;
        Ok(n as u64)
    }
    fn live_manual_machines(&mut self) -> Result<Vec<MachineId>, StoreError> {
        self.query_ids(
            "listing manual machines",
            "SELECT id FROM machines WHERE manual AND life != 'dead' ORDER BY seq",
            &[],
        )
    }

    fn create_instance(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
    ) -> Result<(InstanceRecord, bool), StoreError> {
        self.create_instance_in(client_token, zone, tags, InstanceState::Pending)
    }
    fn create_running_instance(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
    ) -> Result<(InstanceRecord, bool), StoreError> {
        // Created running by the one insert: no landing's round trip after it.
        self.create_instance_in(client_token, zone, tags, InstanceState::Running)
    }
    fn instance(&mut self, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError> {
        let row = self
            .client()?
            .query_opt(&format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE id = $1"), &[&id.as_str()])
            .map_err(pg("reading an instance"))?;
        row.as_ref().map(instance_from_row).transpose()
    }
    fn land_instance(&mut self, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError> {
        let ctx = "landing an instance";
        let key = id.as_str();
        let mut tx = self.begin(ctx)?;
        // Landed and read back in one round trip.
        let replies = tx
            .pipeline(&[
                ("UPDATE instances SET state = 'running' WHERE id = $1 AND state = 'pending'", &[&key], false),
                (&format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE id = $1"), &[&key], true),
            ])
            .map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))?;
        let mut replies = replies.into_iter();
        if replies.next().is_some_and(|n| n.count() > 0) {
            self.book.instance_moved(Some(InstanceState::Pending.as_str()), InstanceState::Running.as_str());
        }
        replies.next().map(Reply::into_rows).unwrap_or_default().first().map(instance_from_row).transpose()
    }
    fn all_instances(&mut self) -> Result<Vec<InstanceRecord>, StoreError> {
        let rows = self
            .client()?
            .query(&format!("SELECT {INSTANCE_COLUMNS} FROM instances ORDER BY seq"), &[])
            .map_err(pg("listing instances"))?;
        rows.iter().map(instance_from_row).collect()
    }
    fn live_instances(&mut self, model: &str) -> Result<Vec<CloudInstance>, StoreError> {
        let rows = self
            .client()?
            .query(
                &format!(
                    "SELECT {INSTANCE_COLUMNS} FROM instances WHERE model = $1 AND state != 'terminated' ORDER BY seq"
                ),
                &[&model],
            )
            .map_err(pg("listing instances"))?;
        rows.iter().map(|r| instance_from_row(r).map(|i| i.instance)).collect()
    }
    fn terminate_instances(&mut self, ids: &[InstanceId]) -> Result<(), StoreError> {
        let ctx = "terminating instances";
        let mut tx = self.begin(ctx)?;
        let mut moved = Vec::new();
        for id in ids.iter().collect::<std::collections::BTreeSet<_>>() {
            let row = tx
                .query_opt(
                    "UPDATE instances i SET state = 'terminated' FROM (SELECT id, state FROM instances WHERE id = $1 \
                     FOR UPDATE) old WHERE i.id = old.id AND old.state != 'terminated' RETURNING old.state",
                    &[&id.as_str()],
                )
                .map_err(pg(ctx))?;
            if let Some(row) = row {
                moved.push(row.get::<_, String>(0));
            }
        }
        tx.commit().map_err(pg(ctx))?;
        for state in moved {
            self.book.instance_moved(Some(&state), InstanceState::Terminated.as_str());
        }
        Ok(())
    }
    fn release_instances(&mut self, ids: &[InstanceId]) -> Result<(), StoreError> {
        let ctx = "releasing instances";
        let mut tx = self.begin(ctx)?;
        for id in ids {
            tx.execute("UPDATE instances SET model = NULL WHERE id = $1", &[&id.as_str()]).map_err(pg(ctx))?;
        }
        tx.commit().map_err(pg(ctx))
    }
    fn retag_instance(&mut self, id: &InstanceId, tags: &InstanceTags) -> Result<bool, StoreError> {
        let ctx = "retagging an instance";
        let mut tx = self.begin(ctx)?;
        let n = tx
            .execute(
                "UPDATE instances SET model = $2, machine = $3, start = $4 WHERE id = $1 AND state != 'terminated'",
                &[&id.as_str(), &tags.model, &tags.machine.as_ref().map(MachineId::as_str), &tags.start],
            )
            .map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))?;
        Ok(n > 0)
    }
    fn pending_instances(&mut self) -> Result<Vec<InstanceId>, StoreError> {
        let ctx = "listing pending instances";
        let rows = self
            .client()?
            .query("SELECT id FROM instances WHERE state = 'pending' ORDER BY seq", &[])
            .map_err(pg(ctx))?;
        rows.iter().map(|r| r.try_get::<_, String>(0).map(InstanceId::from).map_err(pg(ctx))).collect()
    }

    fn put_start_intent(&mut self, client_token: &str, machine: &MachineId, params: &str) -> Result<(), StoreError> {
        let ctx = "writing a start's intent";
        let mut tx = self.begin(ctx)?;
        tx.execute(
            "INSERT INTO start_intents (client_token, machine, params) VALUES ($1, $2, $3) \
             ON CONFLICT (client_token) DO NOTHING",
            &[&client_token, &machine.as_str(), &params],
        )
        .map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))
    }
    fn drop_start_intent(&mut self, client_token: &str) -> Result<(), StoreError> {
        let ctx = "dropping a start's intent";
        let mut tx = self.begin(ctx)?;
        tx.execute("DELETE FROM start_intents WHERE client_token = $1", &[&client_token]).map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))
    }
    fn start_intents(&mut self) -> Result<Vec<String>, StoreError> {
        let ctx = "reading the start intents";
        let rows = self.client()?.query("SELECT params FROM start_intents ORDER BY seq", &[]).map_err(pg(ctx))?;
        rows.iter().map(|r| r.try_get(0).map_err(pg(ctx))).collect()
    }
    fn create_token(
        &mut self,
        scope: Scope,
        model: Option<(&str, &str)>,
        sha256: &str,
        created: &str,
    ) -> Result<TokenRecord, StoreError> {
        let ctx = "creating an API token";
        let (name, uuid) = (model.map(|m| m.0), model.map(|m| m.1));
        let mut tx = self.begin_with(ctx, None)?;
        let id = token_id(next_counter(&mut tx, "next_token").map_err(pg(ctx))? as u64 + 1);
        tx.execute(
            "INSERT INTO api_tokens (id, scope, sha256, created, model, model_uuid) VALUES ($1, $2, $3, $4, $5, $6)",
            &[&id, &scope.as_str(), &sha256, &created, &name, &uuid],
        )
        .map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))?;
        Ok(TokenRecord::created(id, scope, created, model))
    }
    fn revoke_model_tokens(&mut self, name: &str, uuid: &str, at: &str) -> Result<Vec<TokenRecord>, StoreError> {
        let ctx = "revoking a destroyed model's API tokens";
        let mut tx = self.begin_with(ctx, None)?;
        let rows = tx
            .query(
                &format!(
                    "UPDATE api_tokens SET revoked = $3 WHERE revoked IS NULL \
                     AND (model_uuid = $2 OR (model_uuid IS NULL AND model = $1)) RETURNING {TOKEN_COLUMNS}"
                ),
                &[&name, &uuid, &at],
            )
            .map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))?;
        let mut tokens = rows.iter().map(|r| token_from_row(r, ctx)).collect::<Result<Vec<_>, _>>()?;
        tokens.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(tokens)
    }
    fn tokens(&mut self) -> Result<Vec<TokenRecord>, StoreError> {
        let ctx = "listing API tokens";
        let rows = self
            .client()?
            .query(&format!("SELECT {TOKEN_COLUMNS} FROM api_tokens ORDER BY seq"), &[])
            .map_err(pg(ctx))?;
        rows.iter().map(|r| token_from_row(r, ctx)).collect()
    }
    fn token_by_hash(&mut self, sha256: &str) -> Result<Option<TokenRecord>, StoreError> {
        let ctx = "looking up an API token";
        let row = self
            .client()?
            .query_opt(&format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE sha256 = $1"), &[&sha256])
            .map_err(pg(ctx))?;
        row.map(|r| token_from_row(&r, ctx)).transpose()
    }
    fn revoke_token(&mut self, id: &str, at: &str) -> Result<TokenRecord, StoreError> {
        let ctx = "revoking an API token";
        let mut tx = self.begin_with(ctx, None)?;
        tx.execute("UPDATE api_tokens SET revoked = $2 WHERE id = $1 AND revoked IS NULL", &[&id, &at])
            .map_err(pg(ctx))?;
        let row =
            tx.query_opt(&format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE id = $1"), &[&id]).map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))?;
        token_from_row(&row.ok_or_else(|| StoreError::NoToken(id.to_owned()))?, ctx)
    }
}

const TOKEN_COLUMNS: &str = "id, scope, created, revoked, model, model_uuid";

fn token_from_row(r: &Row, ctx: &'static str) -> Result<TokenRecord, StoreError> {
    let get = |e: postgres::Error| pg(ctx)(e);
    token_record((
        r.try_get(0).map_err(get)?,
        r.try_get(1).map_err(get)?,
        r.try_get(2).map_err(get)?,
        r.try_get(3).map_err(get)?,
        r.try_get(4).map_err(get)?,
        r.try_get(5).map_err(get)?,
    ))
}
