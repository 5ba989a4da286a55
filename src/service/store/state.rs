//! The store's plain core: the schema and every query, over one SQLite connection. No actix.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension, Row, Transaction};
use thiserror::Error;

use crate::model::{
    CloudInstance, Constraints, HarvestMode, InstanceId, InstanceState, InstanceStatus, InstanceTags, Life, Machine,
    MachineId, MachineStatus, ProvisioningInfo,
};
use crate::ports::ProvisionedInstance;

/// The database file's name inside the data directory.
pub const DB_FILE: &str = "provisioner.db";
/// The schema version this build writes (`PRAGMA user_version`).
/// Version 2 added the `constraints` table (a constraint shared by many machines is stored
/// once); version 3 made its rows whole constraint sets (every key, keyed by the canonical
/// text), and gave machines a placement, an application and the time they last changed, with
/// an `applications` table. Older databases are upgraded in place when opened.
/// Version 3 also added the `manual` and `address` columns of manual machines (a step that
/// adds only the columns a database lacks).
/// Version 4 added `api_tokens` (the created API tokens' hashes, `tokens.rs`), a table that
/// older databases gain when opened.
/// Version 5 added `start_intents` (each start's client token and parameters, written before
/// the cloud call: `service::cloud::intents`), likewise.
/// Version 6 added `api_tokens.model` (a token scoped to one model; `NULL`: every model).
/// Version 7 added `api_tokens.model_uuid` (that model's uuid: the token is valid for it only).
pub const SCHEMA_VERSION: i64 = 7;

/// Containers' `seq` values start here (machines' equal their numeric ids, which never get this
/// far), so that a container never takes a `seq` a later machine's id needs: machines list in
/// id order, then containers in the order they were added.
pub const CONTAINER_SEQ_BASE: i64 = 1 << 40;

/// Adds to `machines` each of `columns` (name, DDL) it lacks, so that additive schema steps
/// compose with one another and run again harmlessly.
fn add_missing_machine_columns(tx: &Transaction<'_>, columns: &[(&str, &str)]) -> Result<(), StoreError> {
    let have: Vec<String> = tx
        .prepare("SELECT name FROM pragma_table_info('machines')")
        .and_then(|mut st| st.query_map([], |r| r.get::<_, String>(0))?.collect())
        .map_err(StoreError::sql("reading the schema"))?;
    for (name, ddl) in columns {
        if !have.iter().any(|c| c == name) {
            tx.execute_batch(ddl).map_err(StoreError::sql("upgrading the schema"))?;
        }
    }
    Ok(())
}

/// Schema step of version 3: manual machines (`machine add --manual --address HOST`) keep the
/// flag and their address.
fn upgrade_manual_machines(tx: &Transaction<'_>) -> Result<(), StoreError> {
    add_missing_machine_columns(
        tx,
        &[
            ("manual", "ALTER TABLE machines ADD COLUMN manual INTEGER NOT NULL DEFAULT 0"),
            ("address", "ALTER TABLE machines ADD COLUMN address TEXT"),
        ],
    )
}

/// Schema step of version 3 (additive, for `machine show`): per machine, how many start
/// attempts the provisioner reported and the last one's error ([`StoreCore::record_start_outcome`]).
fn upgrade_start_attempts(tx: &Transaction<'_>) -> Result<(), StoreError> {
    add_missing_machine_columns(
        tx,
        &[
            ("start_attempts", "ALTER TABLE machines ADD COLUMN start_attempts INTEGER NOT NULL DEFAULT 0"),
            ("last_start_error", "ALTER TABLE machines ADD COLUMN last_start_error TEXT"),
        ],
    )
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS constraints (
    id INTEGER PRIMARY KEY,
    spec TEXT NOT NULL UNIQUE,
    zones TEXT,
    arch TEXT,
    cores INTEGER,
    mem_mb INTEGER,
    root_disk_mb INTEGER,
    instance_type TEXT,
    spaces TEXT,
    tags TEXT
);
CREATE TABLE IF NOT EXISTS applications (
    name TEXT PRIMARY KEY,
    constraints_id INTEGER REFERENCES constraints(id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS machines (
    seq INTEGER PRIMARY KEY,
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
    keep_instance INTEGER NOT NULL DEFAULT 0,
    transient INTEGER NOT NULL DEFAULT 0,
    constraints_id INTEGER REFERENCES constraints(id)
);
CREATE TABLE IF NOT EXISTS api_tokens (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    scope TEXT NOT NULL,
    sha256 TEXT NOT NULL UNIQUE,
    created TEXT NOT NULL,
    revoked TEXT,
    model TEXT
);
CREATE TABLE IF NOT EXISTS start_intents (
    seq INTEGER PRIMARY KEY,
    client_token TEXT NOT NULL UNIQUE,
    machine TEXT NOT NULL,
    params TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS instances (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    zone TEXT,
    model TEXT,
    machine TEXT,
    start TEXT,
    client_token TEXT UNIQUE
);
";

/// Version 3's additions to `machines` (added to older tables in place), then what needs them.
const MACHINE_COLUMNS_V3: [(&str, &str); 3] = [("placement", "TEXT"), ("application", "TEXT"), ("changed_at", "TEXT")];

/// `changed_at` is kept by the database itself: every insert and update of a machine stamps it
/// (UTC, milliseconds), whoever writes.
const SCHEMA_V3_AFTER_COLUMNS: &str = "
CREATE INDEX IF NOT EXISTS machines_by_application ON machines(application) WHERE application IS NOT NULL;
CREATE INDEX IF NOT EXISTS machines_in_error ON machines(seq) WHERE status = 'error' OR instance_status = 'provisioning error';
CREATE TRIGGER IF NOT EXISTS machines_stamp_insert AFTER INSERT ON machines WHEN NEW.changed_at IS NULL
BEGIN
    UPDATE machines SET changed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE seq = NEW.seq;
END;
CREATE TRIGGER IF NOT EXISTS machines_stamp_update AFTER UPDATE ON machines WHEN NEW.changed_at IS OLD.changed_at
BEGIN
    UPDATE machines SET changed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE seq = NEW.seq;
END;
";

/// Version 2's `constraints` rows held a `zones=` constraint alone (`zones` unique): rebuilt
/// as version 3's whole constraint sets, ids kept (the machines point at them). Runs with
/// foreign keys off (SQLite's way to rebuild a table others reference).
const UPGRADE_CONSTRAINTS_V2: &str = "
CREATE TABLE constraints_v3 (
    id INTEGER PRIMARY KEY,
    spec TEXT NOT NULL UNIQUE,
    zones TEXT,
    arch TEXT,
    cores INTEGER,
    mem_mb INTEGER,
    root_disk_mb INTEGER,
    instance_type TEXT,
    spaces TEXT,
    tags TEXT
);
INSERT INTO constraints_v3 (id, spec, zones) SELECT id, 'zones=' || zones, zones FROM constraints;
DROP TABLE constraints;
ALTER TABLE constraints_v3 RENAME TO constraints;
";

/// What went wrong in the store. Every variant says what was being done.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("database error while {context}: {source}")]
    Sqlite {
        /// What the store was doing.
        context: &'static str,
        /// SQLite's error (shared: a store that failed to open answers it to every request).
        #[source]
        source: std::sync::Arc<rusqlite::Error>,
    },
    /// The database was written by a newer build.
    #[error("the database has schema version {found}, newer than this build's {supported}; upgrade the binary")]
    TooNew {
        /// The version found.
        found: i64,
        /// The newest version this build knows (the backend's).
        supported: i64,
    },
    /// PostgreSQL failed (or could not be reached).
    #[error("database error while {context}: {source}")]
    Postgres {
        /// What the store was doing.
        context: &'static str,
        /// What the server or the connection said.
        #[source]
        source: PgFailure,
    },
    /// The database cannot be reached now (the store reconnects with backoff): nothing was
    /// read or written.
    #[error("the database is unreachable: {0}")]
    Unavailable(String),
    /// A provisioner write under a fence that no longer holds: the lease this replica acts on
    /// has another holder, a newer epoch, or has expired. Nothing was written.
    #[error("fenced: the leader lease of model {model_uuid} is no longer held by {holder} at epoch {epoch}")]
    Fenced {
        /// The lease's model.
        model_uuid: String,
        /// The holder the write was made for.
        holder: String,
        /// The epoch the write was made under.
        epoch: i64,
    },
    /// No such machine (or it was removed).
    #[error("machine {0} not found")]
    NotFound(MachineId),
    /// The model is dying: it refuses new machines and changes.
    #[error("the model is dying")]
    ModelDying,
    /// A request the model's state forbids, with the reason.
    #[error("{0}")]
    Refused(String),
    /// A request field names something the model does not allow (a container's host that
    /// does not exist or is not alive, a manual machine's address already registered): bad
    /// input, refused before anything is written.
    #[error("field {field:?}: {message}")]
    Invalid {
        /// The request's field.
        field: &'static str,
        /// Why.
        message: String,
    },
    /// Another process holds the database (another service on the same data directory).
    #[error(
        "the database is in use by another process (is another provisioner service running on this data directory?)"
    )]
    InUse,
    /// No such application.
    #[error("application {0:?} not found")]
    NoApplication(String),
    /// No created API token has this id.
    #[error("API token {0:?} not found (see `provisioner token list`)")]
    NoToken(String),
    /// The store stopped: its actor no longer takes messages.
    #[error("the store is not running: {0}")]
    Stopped(#[source] actix::MailboxError),
    /// The database file is damaged (SQLite found a corrupt page, or it is not a database).
    #[error("the database is damaged ({context}: {message})")]
    Damaged {
        /// What the store was doing.
        context: &'static str,
        /// What SQLite found.
        message: String,
    },
}

impl StoreError {
    pub(super) fn sql(context: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
        move |e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                StoreError::Damaged { context, message: e.to_string() }
            }
            _ => StoreError::Sqlite { context, source: std::sync::Arc::new(e) },
        }
    }
}

/// A PostgreSQL failure as the store keeps it (comparable and cloneable, like every
/// [`StoreError`]): its SQLSTATE code if the server sent one, and the client's message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct PgFailure {
    /// The SQLSTATE code (`40001`, `57P01`, ...), if the server answered.
    pub code: Option<String>,
    /// The message.
    pub message: String,
    /// The connection is gone (closed, reset, refused): the store reconnects.
    pub connection_lost: bool,
}

impl PgFailure {
    /// The server gave the statement up at its deadline (`statement_timeout`: `57014`,
    /// `lock_timeout`: `55P03`): the database could not answer in time (a 503, not a fault of
    /// the request).
    pub fn timed_out(&self) -> bool {
        matches!(self.code.as_deref(), Some("57014" | "55P03"))
    }
}

/// The counts behind the metrics' state gauges, kept by the store as it writes (loaded once
/// when the database is opened), so that a scrape reads them instead of scanning tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreCounts {
    /// Machines by status (`pending`, `started`, ...).
    pub machines_by_status: BTreeMap<String, u64>,
    /// Machines by life.
    pub machines_by_life: BTreeMap<String, u64>,
    /// The simulated cloud's instances by state, terminated ones included.
    pub instances_by_state: BTreeMap<String, u64>,
    /// The model's life.
    pub model_life: String,
}

/// Adds `delta` to one count; a count that reaches 0 goes (as a recount would not have it).
pub(super) fn bump(map: &mut BTreeMap<String, u64>, key: &str, delta: i64) {
    let n = map.entry(key.to_owned()).or_default();
    *n = n.saturating_add_signed(delta);
    if *n == 0 {
        map.remove(key);
    }
}

impl StoreCounts {
    fn machine_moved(&mut self, from: Option<(&str, &str)>, to: Option<(&str, &str)>) {
        if let Some((status, life)) = from {
            bump(&mut self.machines_by_status, status, -1);
            bump(&mut self.machines_by_life, life, -1);
        }
        if let Some((status, life)) = to {
            bump(&mut self.machines_by_status, status, 1);
            bump(&mut self.machines_by_life, life, 1);
        }
    }
    fn instance_moved(&mut self, from: Option<&str>, to: &str) {
        if let Some(f) = from {
            bump(&mut self.instances_by_state, f, -1);
        }
        bump(&mut self.instances_by_state, to, 1);
    }
}

/// What a backend's commits leave for the store actor to publish: the machines changed (the
/// watchers' next notification), whether a retry tick is due, and the gauges' counts. Shared by
/// both backends, so that they count and notify alike.
#[derive(Debug, Clone, Default)]
pub struct Book {
    /// Machines changed since the outbox was last taken (the watcher's next notification).
    pub(super) changed: BTreeSet<MachineId>,
    /// A retry tick is due.
    pub(super) retry_due: bool,
    /// The gauges' counts, kept as the writes commit.
    pub(super) counts: StoreCounts,
    /// The counts changed since they were last taken.
    pub(super) counts_changed: bool,
}

impl Book {
    /// Counts a machine's change of status or life (after its write committed).
    pub(super) fn count_machine(&mut self, before: Option<(String, String)>, status: Option<&str>, life: Option<&str>) {
        if let Some((s, l)) = before {
            let after = (status.unwrap_or(&s).to_owned(), life.unwrap_or(&l).to_owned());
            if after != (s.clone(), l.clone()) {
                self.counts.machine_moved(Some((&s, &l)), Some((&after.0, &after.1)));
                self.counts_changed = true;
            }
        }
    }

    /// Counts and notifies machines just added in `status` (alive).
    pub(super) fn added(&mut self, ids: &[MachineId], status: MachineStatus) {
        self.changed.extend(ids.iter().cloned());
        bump(&mut self.counts.machines_by_status, status.as_str(), ids.len() as i64);
        bump(&mut self.counts.machines_by_life, Life::Alive.as_str(), ids.len() as i64);
        self.counts_changed = true;
    }

    /// A machine removed for good.
    pub(super) fn removed(&mut self, status: &str, life: &str) {
        self.counts.machine_moved(Some((status, life)), None);
        self.counts_changed = true;
    }

    /// An instance created (`from` = `None`) or moved between states.
    pub(super) fn instance_moved(&mut self, from: Option<&str>, to: &str) {
        self.counts.instance_moved(from, to);
        self.counts_changed = true;
    }

    /// Takes what the watchers must hear.
    pub(super) fn take_outbox(&mut self) -> (Vec<MachineId>, bool) {
        (std::mem::take(&mut self.changed).into_iter().collect(), std::mem::take(&mut self.retry_due))
    }

    /// The counts, if they changed since the last call.
    pub(super) fn take_counts(&mut self) -> Option<StoreCounts> {
        std::mem::take(&mut self.counts_changed).then(|| self.counts.clone())
    }

    /// Marks where the book is before writes that may be undone: [`Book::keep`] adds what
    /// they recorded to what was there, [`Book::undo`] goes back to the mark.
    pub(super) fn mark(&mut self) -> BookMark {
        BookMark {
            changed: std::mem::take(&mut self.changed),
            retry_due: self.retry_due,
            counts: self.counts.clone(),
            counts_changed: self.counts_changed,
        }
    }

    /// The writes since `mark` committed (or are kept in their group): the book keeps them.
    pub(super) fn keep(&mut self, mut mark: BookMark) {
        mark.changed.append(&mut self.changed);
        self.changed = mark.changed;
    }

    /// The writes since `mark` were rolled back: the book is as it was at the mark.
    pub(super) fn undo(&mut self, mark: BookMark) {
        self.changed = mark.changed;
        self.retry_due = mark.retry_due;
        self.counts = mark.counts;
        self.counts_changed = mark.counts_changed;
    }
}

/// The book as it was before writes that may be rolled back (a group commit's, one write's in
/// it): its machines changed (moved out, so that a mark costs no copy of them), its flags and
/// its counts (a few dozen entries).
#[derive(Debug, Default)]
pub(super) struct BookMark {
    changed: BTreeSet<MachineId>,
    retry_due: bool,
    counts: StoreCounts,
    counts_changed: bool,
}

/// A group commit open on a SQLite connection (see [`StoreCore::begin_group`]).
#[derive(Debug, Default)]
struct OpenGroup {
    /// The book before the group.
    before: BookMark,
    /// The book before the write in progress, if one is.
    member: Option<BookMark>,
    /// The connection's change count when the group began: more now means it has written.
    changes_at_begin: u64,
    /// The time the writes of its unit of work in progress stamp `changed_at` with (see
    /// [`StoreCore::stamp`]), taken at the first.
    stamp: std::cell::OnceCell<String>,
}

/// The model settings an operator changes at run time (`provisioner config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Harvest mode, if ever set.
    pub harvest_mode: Option<HarvestMode>,
    /// Worker pool size, if ever set.
    pub workers: Option<usize>,
}

/// A machine with everything the service shows about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineRecord {
    /// The machine as the provisioner reads it.
    pub machine: Machine,
    /// The zone its instance landed in.
    pub zone: Option<String>,
    /// Its `zones=` constraint.
    pub zones: Option<Vec<String>>,
    /// The machine status message.
    pub status_message: String,
    /// The instance status message.
    pub instance_status_message: String,
    /// Marked for another start (`retry-provisioning`).
    pub transient: bool,
    /// Every constraint (its `zones` are [`MachineRecord::zones`]).
    pub constraints: Constraints,
    /// Its placement directive (`zone=az2`, `subnet=...`).
    pub placement: Option<String>,
    /// The application whose unit it hosts.
    pub application: Option<String>,
    /// When its row last changed (UTC, RFC 3339), as the database stamped it.
    pub changed_at: Option<String>,
    /// A manual machine's address (`machine.manual` is set).
    pub address: Option<String>,
    /// How many start attempts the provisioner reported for it (see
    /// [`StoreCore::record_start_outcome`]).
    pub start_attempts: u64,
    /// The last reported attempt's error (`None`: none yet, or it succeeded).
    pub last_start_error: Option<String>,
}

impl MachineRecord {
    /// The message an operator wants to see: the instance status's, else the machine's.
    pub fn message(&self) -> &str {
        if self.instance_status_message.is_empty() {
            &self.status_message
        } else {
            &self.instance_status_message
        }
    }
}

/// What new machines ask for (`POST /v1/machines`, `application add`); validated by the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewMachine {
    /// Their constraints.
    pub constraints: Constraints,
    /// Their placement directive (`zone=az2`, `subnet=...`).
    pub placement: Option<String>,
    /// The application whose units they host.
    pub application: Option<String>,
}

/// An application, as `application list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplicationRecord {
    /// Its name.
    pub name: String,
    /// The constraints its machines were added with.
    pub constraints: Constraints,
    /// Its machines that are not dead, in id order.
    pub machines: Vec<MachineId>,
}

/// A simulated cloud instance as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRecord {
    /// Id, state, zone and tags.
    pub instance: CloudInstance,
    /// The idempotency token of the start that made it.
    pub client_token: Option<String>,
}

impl InstanceRecord {
    /// An instance just created for a start with this client token.
    pub fn created(
        id: String,
        state: InstanceState,
        zone: Option<&str>,
        tags: &InstanceTags,
        client_token: &str,
    ) -> Self {
        Self {
            instance: CloudInstance {
                id: InstanceId::from(id),
                state,
                zone: zone.map(str::to_owned),
                tags: tags.clone(),
                age: None,
                instance_type: None,
            },
            client_token: Some(client_token.to_owned()),
        }
    }
}

/// The store's core. One per database; every method is one statement or one transaction.
pub struct StoreCore {
    pub(super) conn: Connection,
    /// Whether commits are fsynced now (`synchronous=FULL`) or not (`NORMAL`).
    durable: bool,
    /// What the watchers and the gauges must hear next.
    book: Book,
    /// Damage seen by an earlier call (sticky: a damaged database does not heal).
    damaged: Option<StoreError>,
    /// The database file and its identity (inode) when opened; `None` in memory.
    file: Option<(PathBuf, Option<u64>)>,
    /// The group commit open, if one is.
    group: Option<OpenGroup>,
}

/// One write's own atomicity: a savepoint (a transaction of its own outside a group commit,
/// a nested one inside), rolled back if dropped before [`Atomic::commit`]. Its statements are
/// prepared once per connection (rusqlite's `Savepoint` parses its SQL at every use, which
/// showed in the store thread's profile).
pub(super) struct Atomic<'c> {
    conn: &'c Connection,
    done: bool,
}

impl<'c> Atomic<'c> {
    /// Opens the savepoint.
    pub(super) fn begin(conn: &'c Connection) -> rusqlite::Result<Self> {
        run_cached(conn, "SAVEPOINT write")?;
        Ok(Self { conn, done: false })
    }

    /// Releases it: its writes are kept (committed, if it was the outermost).
    pub(super) fn commit(mut self) -> rusqlite::Result<()> {
        run_cached(self.conn, "RELEASE write")?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Atomic<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = run_cached(self.conn, "ROLLBACK TO write");
            let _ = run_cached(self.conn, "RELEASE write");
        }
    }
}

impl std::ops::Deref for Atomic<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

/// The wall clock now as `changed_at` keeps it, in the format of the stamping triggers'
/// `strftime('%Y-%m-%dT%H:%M:%fZ', 'now')` (UTC, milliseconds: `2026-12-02T06:41:15.123Z`).
/// Formatted here, bound as a parameter: SQLite's `strftime` took about 4,500 instructions a
/// stamp (5 % of the service's at 100,000 machines).
pub(super) fn now_stamp() -> String {
    crate::service::audit::now_rfc3339()
}

/// Runs a statement without parameters or rows, prepared once per connection.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// The identity of a file: its inode where there is one.
fn file_identity(path: &Path) -> std::io::Result<Option<u64>> {
    let meta = std::fs::metadata(path)?;
    #[cfg(unix)]
    {
        Ok(Some(std::os::unix::fs::MetadataExt::ino(&meta)))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        Ok(None)
    }
}

fn machine_from_row(r: &Row<'_>) -> rusqlite::Result<MachineRecord> {
    let parse_err = |i: usize, e: crate::model::ParseError| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
    };
    let life: String = r.get(1)?;
    let status: String = r.get(2)?;
    let constraints = constraints_from_row(r, 10)?;
    Ok(MachineRecord {
        machine: Machine {
            id: MachineId::from(r.get::<_, String>(0)?),
            life: life.parse().map_err(|e| parse_err(1, e))?,
            status: status.parse().map_err(|e| parse_err(2, e))?,
            instance_status: InstanceStatus::other(r.get::<_, String>(4)?),
            instance: r.get::<_, Option<String>>(6)?.map(InstanceId::from),
            keep_instance: r.get(8)?,
            manual: r.get(21)?,
            controller: false,
        },
        status_message: r.get(3)?,
        instance_status_message: r.get(5)?,
        zone: r.get(7)?,
        transient: r.get(9)?,
        zones: constraints.zones.clone(),
        constraints,
        placement: r.get(18)?,
        application: r.get(19)?,
        changed_at: r.get(20)?,
        address: r.get(22)?,
        start_attempts: r.get::<_, i64>(23)?.max(0) as u64,
        last_start_error: r.get(24)?,
    })
}

/// A machine's constraints from the eight columns from `first` on, as [`CONSTRAINT_COLUMNS`]
/// names them.
fn constraints_from_row(r: &Row<'_>, first: usize) -> rusqlite::Result<Constraints> {
    let list = |s: Option<String>| -> Vec<String> {
        s.filter(|s| !s.is_empty()).map(|s| s.split(',').map(str::to_owned).collect()).unwrap_or_default()
    };
    let zones: Option<String> = r.get(first)?;
    Ok(Constraints {
        zones: zones.map(|z| z.split(',').map(str::to_owned).collect()),
        arch: r.get(first + 1)?,
        cores: r.get(first + 2)?,
        mem_mb: r.get::<_, Option<i64>>(first + 3)?.map(|n| n as u64),
        root_disk_mb: r.get::<_, Option<i64>>(first + 4)?.map(|n| n as u64),
        instance_type: r.get(first + 5)?,
        spaces: list(r.get(first + 6)?),
        tags: list(r.get(first + 7)?),
    })
}

/// A machine's constraints, as [`constraints_from_row`] reads them (over [`MACHINE_FROM`]).
const CONSTRAINT_COLUMNS: &str =
    "COALESCE(c.zones, m.zones), c.arch, c.cores, c.mem_mb, c.root_disk_mb, c.instance_type, c.spaces, c.tags";

const MACHINE_COLUMNS: &str = "m.id, m.life, m.status, m.status_message, m.instance_status, \
                               m.instance_status_message, m.instance, m.zone, m.keep_instance, m.transient, \
                               COALESCE(c.zones, m.zones), c.arch, c.cores, c.mem_mb, c.root_disk_mb, \
                               c.instance_type, c.spaces, c.tags, m.placement, m.application, m.changed_at, \
                               m.manual, m.address, m.start_attempts, m.last_start_error";
/// Machines with their shared constraints (`m.zones` holds those of version-1 rows).
const MACHINE_FROM: &str = "machines m LEFT JOIN constraints c ON c.id = m.constraints_id";

fn instance_from_row(r: &Row<'_>) -> rusqlite::Result<InstanceRecord> {
    let state: String = r.get(1)?;
    Ok(InstanceRecord {
        instance: CloudInstance {
            id: InstanceId::from(r.get::<_, String>(0)?),
            state: state
                .parse()
                .map_err(|e| rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(e)))?,
            zone: r.get(2)?,
            tags: InstanceTags {
                model: r.get(3)?,
                machine: r.get::<_, Option<String>>(4)?.map(MachineId::from),
                start: r.get(5)?,
            },
            // Not stored: the provisioner ages the instance from its first listing.
            age: None,
            // Not stored (yet): the simulated cloud's type is shown on the start's answer.
            instance_type: None,
        },
        client_token: r.get(6)?,
    })
}

const INSTANCE_COLUMNS: &str = "id, state, zone, model, machine, start, client_token";

fn meta_get(tx: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    tx.prepare_cached("SELECT value FROM meta WHERE key = ?1")?.query_row([key], |r| r.get(0)).optional()
}

fn meta_set(tx: &Connection, key: &str, value: &str) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )?
    .execute([key, value])
    .map(|_| ())
}

/// Takes the next value of the counter `key` in `meta` (0 for a counter never used).
pub(super) fn next_counter(tx: &Connection, key: &str) -> rusqlite::Result<u64> {
    take_counter(tx, key, 1)
}

/// Takes `count` consecutive values of the counter `key` at once: answers the first (0 for a
/// counter never used); the counter then stands `count` further. (A read and a write: one
/// upsert with `RETURNING` took twice their instructions.)
pub(super) fn take_counter(tx: &Connection, key: &str, count: u64) -> rusqlite::Result<u64> {
    let n: u64 = meta_get(tx, key)?.and_then(|v| v.parse().ok()).unwrap_or(0);
    meta_set(tx, key, &(n + count).to_string())?;
    Ok(n)
}

/// A random version-4 uuid, from the operating system's randomness.
pub(super) fn random_uuid() -> String {
    uuid::Builder::from_random_bytes(rand::random()).into_uuid().to_string()
}

impl StoreCore {
    /// Opens (creating if needed) the database at `path`: WAL journal, full fsync on every
    /// commit, the schema, and a model uuid drawn on first open.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_file(path, true)
    }

    /// Opens the database at `path` that [`StoreCore::open`] has just checked (and closed),
    /// without reading it whole again.
    pub fn open_checked_before(path: &Path) -> Result<Self, StoreError> {
        Self::open_file(path, false)
    }

    fn open_file(path: &Path, check: bool) -> Result<Self, StoreError> {
        let conn = Connection::open(path).map_err(StoreError::sql("opening the database"))?;
        let mut core = Self::init(conn, check)?;
        core.file = Some((path.to_owned(), file_identity(path).ok().flatten()));
        Ok(core)
    }

    /// An in-memory store (tests).
    pub fn in_memory() -> Result<Self, StoreError> {
        Self::init(Connection::open_in_memory().map_err(StoreError::sql("opening the database"))?, true)
    }

    fn init(mut conn: Connection, check: bool) -> Result<Self, StoreError> {
        // One process at a time: the exclusive lock is taken at the first access and held until
        // the connection closes (the operating system drops it if the process dies).
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE").map_err(StoreError::sql("setting the locking mode"))?;
        // Fail at once if another process holds it (rusqlite would wait 5 s by default).
        conn.busy_timeout(std::time::Duration::ZERO).map_err(StoreError::sql("setting the busy timeout"))?;
        // WAL: readers never block the writer; FULL: the WAL is fsynced at every commit, so a
        // write that returned survives a process kill and a power cut alike.
        conn.pragma_update(None, "journal_mode", "WAL").map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => StoreError::InUse,
            _ => StoreError::sql("setting the journal mode")(e),
        })?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(StoreError::sql("setting synchronous mode"))?;
        // Every statement the store runs more than once stays prepared (rusqlite keeps 16).
        conn.set_prepared_statement_cache_capacity(128);
        // The savepoints of a group commit's writes journal the pages they change: in memory.
        conn.pragma_update(None, "temp_store", "MEMORY").map_err(StoreError::sql("setting the temporary store"))?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(StoreError::sql("enabling foreign keys"))?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(StoreError::sql("setting the busy timeout"))?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(StoreError::sql("reading the schema version"))?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::TooNew { found: version, supported: SCHEMA_VERSION });
        }
        // A database that has tables was written before: check it whole before trusting it.
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(StoreError::sql("reading the schema"))?;
        if tables > 0 && check {
            let problems: Vec<String> = conn
                .prepare("PRAGMA quick_check(5)")
                .and_then(|mut st| st.query_map([], |r| r.get::<_, String>(0))?.collect())
                .map_err(StoreError::sql("checking the database"))?;
            if problems != ["ok"] {
                return Err(StoreError::Damaged { context: "checking the database", message: problems.join("; ") });
            }
        }
        Self::upgrade_constraints_v2(&mut conn)?;
        let tx = conn.transaction().map_err(StoreError::sql("creating the schema"))?;
        tx.execute_batch(SCHEMA).map_err(StoreError::sql("creating the schema"))?;
        let has_constraints: i64 = tx
            .query_row("SELECT count(*) FROM pragma_table_info('machines') WHERE name = 'constraints_id'", [], |r| {
                r.get(0)
            })
            .map_err(StoreError::sql("reading the schema"))?;
        if has_constraints == 0 {
            // Version 1: machines kept their zones in a column of their own.
            tx.execute_batch("ALTER TABLE machines ADD COLUMN constraints_id INTEGER REFERENCES constraints(id)")
                .map_err(StoreError::sql("upgrading the schema"))?;
        }
        Self::add_machine_columns_v3(&tx)?;
        upgrade_manual_machines(&tx)?;
        upgrade_start_attempts(&tx)?;
        super::tokens::upgrade_token_models(&tx)?;
        if meta_get(&tx, "model_uuid").map_err(StoreError::sql("reading the model uuid"))?.is_none() {
            if tables > 0 {
                // Never a new model in place of one whose identity was lost.
                return Err(StoreError::Damaged {
                    context: "reading the model uuid",
                    message: "the database has tables but no model uuid".into(),
                });
            }
            meta_set(&tx, "model_uuid", &random_uuid()).map_err(StoreError::sql("writing the model uuid"))?;
            meta_set(&tx, "model_life", Life::Alive.as_str()).map_err(StoreError::sql("writing the model life"))?;
        }
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(StoreError::sql("writing the schema version"))?;
        tx.commit().map_err(StoreError::sql("creating the schema"))?;
        let mut core = Self {
            conn,
            durable: true,
            book: Book { counts_changed: true, ..Book::default() },
            damaged: None,
            file: None,
            group: None,
        };
        core.book.counts = core.recount()?;
        Ok(core)
    }

    /// Counts every machine and instance (one scan: at open, and in tests).
    pub fn recount(&self) -> Result<StoreCounts, StoreError> {
        let group = |sql: &str| -> Result<BTreeMap<String, u64>, StoreError> {
            let mut st = self.conn.prepare(sql).map_err(StoreError::sql("counting"))?;
            let rows = st
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)))
                .map_err(StoreError::sql("counting"))?;
            rows.collect::<Result<_, _>>().map_err(StoreError::sql("counting"))
        };
        Ok(StoreCounts {
            machines_by_status: group("SELECT status, count(*) FROM machines GROUP BY status")?,
            machines_by_life: group("SELECT life, count(*) FROM machines GROUP BY life")?,
            instances_by_state: group("SELECT state, count(*) FROM instances GROUP BY state")?,
            model_life: self.model_life()?.to_string(),
        })
    }

    /// The gauges' counts as of the last commit.
    pub fn counts(&self) -> &StoreCounts {
        &self.book.counts
    }

    /// The counts, if they changed since the last call.
    pub fn take_counts(&mut self) -> Option<StoreCounts> {
        self.book.take_counts()
    }

    /// Remembers damage an operation ran into: from then on [`StoreCore::check_readable`] fails.
    pub fn note_damage(&mut self, e: &StoreError) {
        if matches!(e, StoreError::Damaged { .. }) && self.damaged.is_none() {
            self.damaged = Some(e.clone());
        }
    }

    /// Whether the store can be read (`/healthz`): no damage seen so far, and the model's
    /// identity and both tables' newest rows read now (a few pages, no scan).
    pub fn check_readable(&mut self) -> Result<(), StoreError> {
        if let Some(e) = &self.damaged {
            return Err(e.clone());
        }
        let probe = (|| -> Result<(), StoreError> {
            // The page cache could hide a file that was deleted, replaced or truncated: look at
            // the file itself (its identity and its size), then read through SQLite.
            if let Some((path, identity)) = &self.file {
                let damaged = |message: String| StoreError::Damaged { context: "reading the database file", message };
                let now = file_identity(path).map_err(|e| damaged(format!("{}: {e}", path.display())))?;
                if now != *identity {
                    return Err(damaged(format!("{} was replaced since the service opened it", path.display())));
                }
                // Truncated: the pages not in the log are gone. (The header itself may be stale
                // or even overwritten while the log holds page 1: that is SQLite's to judge.)
                let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
                if len < 512 {
                    return Err(damaged(format!("{} was truncated to {len} bytes", path.display())));
                }
            }
            self.model_uuid()?;
            for sql in ["SELECT max(seq) FROM machines", "SELECT max(seq) FROM instances"] {
                self.conn
                    .query_row(sql, [], |r| r.get::<_, Option<i64>>(0))
                    .map_err(StoreError::sql("reading the database"))?;
            }
            Ok(())
        })();
        if let Err(e) = &probe {
            self.note_damage(e);
        }
        probe
    }

    /// A machine's status and life, if it exists.
    fn status_life(&self, id: &MachineId) -> Result<Option<(String, String)>, StoreError> {
        self.conn
            .prepare_cached("SELECT status, life FROM machines WHERE id = ?1")
            .and_then(|mut s| s.query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?))).optional())
            .map_err(StoreError::sql("reading a machine"))
    }

    fn count_machine(&mut self, before: Option<(String, String)>, status: Option<&str>, life: Option<&str>) {
        self.book.count_machine(before, status, life);
    }

    /// Makes the next commits fsynced (`true`, `synchronous=FULL`) or not (`NORMAL`: still in
    /// order, still surviving a process crash). In WAL mode a durable commit also makes every
    /// earlier one durable.
    pub fn set_durable(&mut self, durable: bool) -> Result<(), StoreError> {
        if self.durable != durable {
            let mode = if durable { "FULL" } else { "NORMAL" };
            self.conn.pragma_update(None, "synchronous", mode).map_err(StoreError::sql("setting synchronous mode"))?;
            self.durable = durable;
        }
        Ok(())
    }

    // ---- group commit (the store actor's, see `actor.rs`) ---------------------------------

    /// Opens a group commit: one transaction that the writes until [`StoreCore::commit_group`]
    /// share, each in a savepoint of its own ([`StoreCore::begin_member`],
    /// [`StoreCore::end_member`]), committed at once: fsynced once for all of them if
    /// `durable` (SQLite cannot change its safety level inside a transaction, so a group is
    /// durable or not from its start).
    pub fn begin_group(&mut self, durable: bool) -> Result<(), StoreError> {
        if self.group.is_some() {
            return Err(StoreError::Refused("a group commit is open already".into()));
        }
        self.set_durable(durable)?;
        run_cached(&self.conn, "BEGIN").map_err(StoreError::sql("beginning a group commit"))?;
        self.group = Some(OpenGroup {
            before: self.book.mark(),
            member: None,
            changes_at_begin: self.conn.total_changes(),
            stamp: std::cell::OnceCell::new(),
        });
        Ok(())
    }

    /// A write of the open group begins: its savepoint, and the book's mark to go back to if
    /// it fails.
    pub fn begin_member(&mut self) -> Result<(), StoreError> {
        let Some(group) = self.group.as_mut() else {
            return Err(StoreError::Refused("no group commit is open".into()));
        };
        run_cached(&self.conn, "SAVEPOINT member").map_err(StoreError::sql("beginning a write of a group"))?;
        group.member = Some(self.book.mark());
        group.stamp = std::cell::OnceCell::new();
        Ok(())
    }

    /// The write in progress ends: kept in the group (`keep`), or rolled back to its savepoint
    /// (its failure undoes none of the others). An error means the group's transaction itself
    /// is gone (SQLite rolls a transaction back on its own after some failures, a full disk
    /// among them): the caller must abort the group.
    pub fn end_member(&mut self, keep: bool) -> Result<(), StoreError> {
        let Some(mark) = self.group.as_mut().and_then(|g| g.member.take()) else {
            return Err(StoreError::Refused("no write of a group is in progress".into()));
        };
        let rollback = if keep { Ok(()) } else { run_cached(&self.conn, "ROLLBACK TO member") };
        let ended = rollback
            .and_then(|()| run_cached(&self.conn, "RELEASE member"))
            .map_err(StoreError::sql("ending a write of a group"));
        match ended {
            Ok(()) if keep => self.book.keep(mark),
            _ => self.book.undo(mark),
        }
        ended?;
        if self.conn.is_autocommit() {
            return Err(StoreError::Refused("the group commit's transaction ended before its commit".into()));
        }
        Ok(())
    }

    /// Whether the open group has written anything so far: until it has, what its writes read
    /// was committed before it began.
    pub fn group_has_written(&self) -> bool {
        self.group.as_ref().is_some_and(|g| self.conn.total_changes() != g.changes_at_begin)
    }

    /// Commits the open group: when this returns `Ok`, every write kept in it is on disk (if
    /// the group is durable) and the book holds them; on an error none of them is, and the book
    /// is as before the group.
    pub fn commit_group(&mut self) -> Result<(), StoreError> {
        let Some(group) = self.group.take() else {
            return Err(StoreError::Refused("no group commit is open".into()));
        };
        match run_cached(&self.conn, "COMMIT").map_err(StoreError::sql("committing a group of writes")) {
            Ok(()) => {
                self.book.keep(group.before);
                Ok(())
            }
            Err(e) => {
                if !self.conn.is_autocommit() {
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
                self.book.undo(group.before);
                Err(e)
            }
        }
    }

    /// Abandons the open group (nothing of it is written): the book goes back to before it.
    pub fn abort_group(&mut self) {
        if let Some(group) = self.group.take() {
            if !self.conn.is_autocommit() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
            self.book.undo(group.before);
        }
    }

    #[cfg(test)]
    pub(super) fn conn_for_tests(&self) -> &Connection {
        &self.conn
    }

    /// Whether commits are fsynced now.
    pub fn is_durable(&self) -> bool {
        self.durable
    }

    /// The time the provisioner's writes stamp `changed_at` with: taken once for the group's
    /// unit of work in progress (at its first such write), else now. Once a unit, not once a
    /// group: a row's stamp never goes back to before a stamp a trigger gave it in an earlier
    /// unit of the same group.
    fn stamp(&self) -> Cow<'_, str> {
        match &self.group {
            Some(g) => Cow::Borrowed(g.stamp.get_or_init(now_stamp)),
            None => Cow::Owned(now_stamp()),
        }
    }

    /// Takes what the watchers must hear: the machines changed since the last call, and
    /// whether a retry tick is due.
    pub fn take_outbox(&mut self) -> (Vec<MachineId>, bool) {
        self.book.take_outbox()
    }

    // ---- the model -------------------------------------------------------------------------

    /// The model's uuid (tagged on every instance).
    pub fn model_uuid(&self) -> Result<String, StoreError> {
        meta_get(&self.conn, "model_uuid")
            .map_err(StoreError::sql("reading the model uuid"))?
            .ok_or_else(|| StoreError::Refused("the database has no model uuid".into()))
    }

    /// The model's life.
    pub fn model_life(&self) -> Result<Life, StoreError> {
        let life = meta_get(&self.conn, "model_life").map_err(StoreError::sql("reading the model life"))?;
        Ok(life.and_then(|l| l.parse().ok()).unwrap_or(Life::Alive))
    }

    /// Adds `count` new alive, pending machines (ids never reused), each with this `zones=`
    /// constraint. Refused while the model is dying.
    pub fn add_machines(&mut self, count: usize, zones: Option<&[String]>) -> Result<Vec<MachineId>, StoreError> {
        let spec = NewMachine {
            constraints: Constraints { zones: zones.map(<[String]>::to_vec), ..Constraints::default() },
            ..NewMachine::default()
        };
        self.add_new_machines(count, &spec)
    }

    /// One machine.
    pub fn machine(&self, id: &MachineId) -> Result<Option<MachineRecord>, StoreError> {
        self.conn
            .prepare_cached(&format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} WHERE m.id = ?1"))
            .and_then(|mut s| s.query_row([id.as_str()], machine_from_row).optional())
            .map_err(StoreError::sql("reading a machine"))
    }

    /// A machine as the provisioner reads it: its [`Machine`] alone (no constraints, no
    /// messages), the model port's read at every change of every machine.
    pub fn model_machine(&self, id: &MachineId) -> Result<Option<Machine>, StoreError> {
        let read = |r: &Row<'_>| -> rusqlite::Result<Machine> {
            let parse_err = |i: usize, e: crate::model::ParseError| {
                rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
            };
            Ok(Machine {
                id: id.clone(),
                life: r.get::<_, String>(0)?.parse().map_err(|e| parse_err(0, e))?,
                status: r.get::<_, String>(1)?.parse().map_err(|e| parse_err(1, e))?,
                instance_status: InstanceStatus::other(r.get::<_, String>(2)?),
                instance: r.get::<_, Option<String>>(3)?.map(InstanceId::from),
                keep_instance: r.get(4)?,
                manual: r.get(5)?,
                controller: false,
            })
        };
        self.conn
            .prepare_cached(
                "SELECT life, status, instance_status, instance, keep_instance, manual FROM machines WHERE id = ?1",
            )
            .and_then(|mut s| s.query_row([id.as_str()], read).optional())
            .map_err(StoreError::sql("reading a machine"))
    }

    /// A machine's constraints and placement directive: what its start needs of it.
    pub fn machine_provisioning(&self, id: &MachineId) -> Result<Option<ProvisioningInfo>, StoreError> {
        let read = |r: &Row<'_>| -> rusqlite::Result<ProvisioningInfo> {
            Ok(ProvisioningInfo {
                constraints: constraints_from_row(r, 0)?,
                placement: r.get(8)?,
                ..ProvisioningInfo::default()
            })
        };
        self.conn
            .prepare_cached(&format!("SELECT {CONSTRAINT_COLUMNS}, m.placement FROM {MACHINE_FROM} WHERE m.id = ?1"))
            .and_then(|mut s| s.query_row([id.as_str()], read).optional())
            .map_err(StoreError::sql("reading a machine"))
    }

    /// The application whose unit a machine hosts (`Some(None)`: none; `None`: no such
    /// machine).
    pub fn machine_application(&self, id: &MachineId) -> Result<Option<Option<String>>, StoreError> {
        self.conn
            .prepare_cached("SELECT application FROM machines WHERE id = ?1")
            .and_then(|mut s| s.query_row([id.as_str()], |r| r.get(0)).optional())
            .map_err(StoreError::sql("reading a machine"))
    }

    /// Every machine, in id order.
    pub fn list_machines(&self) -> Result<Vec<MachineRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} ORDER BY m.seq"))
            .map_err(StoreError::sql("listing machines"))?;
        let rows = stmt.query_map([], machine_from_row).map_err(StoreError::sql("listing machines"))?;
        rows.collect::<Result<_, _>>().map_err(StoreError::sql("listing machines"))
    }

    /// Every machine's id.
    pub fn machine_ids(&self) -> Result<Vec<MachineId>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id FROM machines ORDER BY seq")
            .map_err(StoreError::sql("listing machines"))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0).map(MachineId::from))
            .map_err(StoreError::sql("listing machines"))?;
        rows.collect::<Result<_, _>>().map_err(StoreError::sql("listing machines"))
    }

    /// One machine's update; the hot ones (the provisioner's, at every start) stamp
    /// `changed_at` themselves, so that the `machines_stamp_update` trigger (kept for every
    /// other writer) does not write the row a second time.
    fn update_machine(
        &self,
        id: &MachineId,
        context: &'static str,
        sql: &str,
        p: &[&dyn rusqlite::ToSql],
    ) -> Result<(), StoreError> {
        let n = self.conn.prepare_cached(sql).and_then(|mut s| s.execute(p)).map_err(StoreError::sql(context))?;
        if n == 0 {
            return Err(StoreError::NotFound(id.clone()));
        }
        Ok(())
    }

    /// Records a machine's instance and instance status. The service stands in for the
    /// machine agent, which would come up with its instance: the machine becomes `started`.
    pub fn set_instance_info(&mut self, id: &MachineId, info: &ProvisionedInstance) -> Result<(), StoreError> {
        self.write_instance_info(id, info, false)
    }

    /// [`StoreCore::set_instance_info`] and [`StoreCore::record_start_outcome`] for the
    /// success, as one statement: the provisioner's record of every start.
    pub fn record_started_instance(&mut self, id: &MachineId, info: &ProvisionedInstance) -> Result<(), StoreError> {
        self.write_instance_info(id, info, true)
    }

    /// Records a machine's instance; `started`: also counts the start that made it as a
    /// successful attempt (its last error cleared), in the same statement.
    fn write_instance_info(
        &mut self,
        id: &MachineId,
        info: &ProvisionedInstance,
        started: bool,
    ) -> Result<(), StoreError> {
        let before = self.status_life(id)?;
        let sql = if started {
            "UPDATE machines SET instance = ?2, zone = ?3, nonce = ?4, display_name = ?5, instance_status = ?6, \
             instance_status_message = '', status = 'started', status_message = '', transient = 0, \
             start_attempts = start_attempts + 1, last_start_error = NULL, changed_at = ?7 WHERE id = ?1"
        } else {
            "UPDATE machines SET instance = ?2, zone = ?3, nonce = ?4, display_name = ?5, instance_status = ?6, \
             instance_status_message = '', status = 'started', status_message = '', transient = 0, \
             changed_at = ?7 WHERE id = ?1"
        };
        let stamp = self.stamp();
        self.update_machine(
            id,
            "recording an instance",
            sql,
            &[
                &id.as_str(),
                &info.instance.as_str(),
                &info.zone,
                &info.nonce,
                &info.display_name,
                &info.status.as_str(),
                &stamp.as_ref(),
            ],
        )?;
        self.count_machine(before, Some(MachineStatus::Started.as_str()), None);
        Ok(())
    }

    /// Writes a machine status.
    pub fn set_status(&mut self, id: &MachineId, status: MachineStatus, message: &str) -> Result<(), StoreError> {
        // A reset to pending ends a retry request.
        let before = self.status_life(id)?;
        let stamp = self.stamp();
        self.update_machine(
            id,
            "writing a machine status",
            "UPDATE machines SET status = ?2, status_message = ?3, \
             transient = CASE WHEN ?2 = 'pending' THEN 0 ELSE transient END, changed_at = ?4 WHERE id = ?1",
            &[&id.as_str(), &status.as_str(), &message, &stamp.as_ref()],
        )?;
        self.count_machine(before, Some(status.as_str()), None);
        Ok(())
    }

    /// Writes an instance status.
    pub fn set_instance_status(
        &mut self,
        id: &MachineId,
        status: &InstanceStatus,
        message: &str,
    ) -> Result<(), StoreError> {
        let stamp = self.stamp();
        self.update_machine(
            id,
            "writing an instance status",
            "UPDATE machines SET instance_status = ?2, instance_status_message = ?3, changed_at = ?4 WHERE id = ?1",
            &[&id.as_str(), &status.as_str(), &message, &stamp.as_ref()],
        )
    }

    /// Counts one start attempt of a machine and keeps its outcome: `error` is the failed
    /// attempt's message, `None` a success (which clears the last error).
    pub fn record_start_outcome(&mut self, id: &MachineId, error: Option<&str>) -> Result<(), StoreError> {
        let stamp = self.stamp();
        self.update_machine(
            id,
            "recording a start attempt",
            "UPDATE machines SET start_attempts = start_attempts + 1, last_start_error = ?2, changed_at = ?3 \
             WHERE id = ?1",
            &[&id.as_str(), &error, &stamp.as_ref()],
        )
    }

    /// Takes a machine to dead (notifies if it was not).
    pub fn ensure_dead(&mut self, id: &MachineId) -> Result<(), StoreError> {
        let before = self.machine(id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?;
        if before.machine.life != Life::Dead {
            self.update_machine(
                id,
                "taking a machine to dead",
                "UPDATE machines SET life = 'dead' WHERE id = ?1",
                &[&id.as_str()],
            )?;
            let was = (before.machine.status.as_str().to_owned(), before.machine.life.as_str().to_owned());
            self.count_machine(Some(was), None, Some(Life::Dead.as_str()));
            self.book.changed.insert(id.clone());
        }
        Ok(())
    }

    /// Removes a dead machine for good (its instance is gone or released).
    pub fn mark_for_removal(&mut self, id: &MachineId) -> Result<(), StoreError> {
        let m = self.machine(id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?;
        if m.machine.life != Life::Dead {
            return Err(StoreError::Refused(format!("machine {id} is not dead")));
        }
        self.update_machine(id, "removing a machine", "DELETE FROM machines WHERE id = ?1", &[&id.as_str()])?;
        self.book.removed(m.machine.status.as_str(), m.machine.life.as_str());
        Ok(())
    }

    /// The zone recorded with a machine's instance.
    pub fn availability_zone(&self, id: &MachineId) -> Result<Option<String>, StoreError> {
        Ok(self.machine(id)?.and_then(|m| m.zone))
    }

    /// Makes the model dying and returns every machine at that moment, in one transaction.
    pub fn destroy_model(&mut self) -> Result<Vec<Machine>, StoreError> {
        if self.model_life()? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("destroying the model"))?;
        meta_set(&tx, "model_life", Life::Dying.as_str()).map_err(StoreError::sql("destroying the model"))?;
        tx.commit().map_err(StoreError::sql("destroying the model"))?;
        self.book.counts.model_life = Life::Dying.to_string();
        self.book.counts_changed = true;
        Ok(self.list_machines()?.into_iter().map(|m| m.machine).collect())
    }

    /// Asks for these machines to be removed, all or none: each becomes dead (the service
    /// stands in for the machine agents, which would take a dying machine to dead), with
    /// `keep_instance` if asked. Without `force`, a machine already dead is refused.
    pub fn remove_machines(&mut self, ids: &[MachineId], keep_instance: bool, force: bool) -> Result<(), StoreError> {
        if !force {
            super::backend::refuse_hosts_with_live_containers(self, ids)?;
        }
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("removing machines"))?;
        let mut seen = BTreeSet::new();
        let mut moved = Vec::new();
        for id in ids {
            if !seen.insert(id) {
                continue; // `remove 3 3` is `remove 3`
            }
            let row: Option<(String, String)> = tx
                .query_row("SELECT life, status FROM machines WHERE id = ?1", [id.as_str()], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
                .map_err(StoreError::sql("removing machines"))?;
            let life = row.as_ref().map(|(l, _)| l.clone());
            if let Some((l, s)) = row {
                moved.push((s, l));
            }
            match life.as_deref() {
                None => return Err(StoreError::NotFound(id.clone())),
                Some("dead") if !force => {
                    return Err(StoreError::Refused(format!(
                        "machine {id} is already being removed (use --force to ask again)"
                    )))
                }
                _ => {}
            }
            tx.execute(
                "UPDATE machines SET life = 'dead', keep_instance = (keep_instance OR ?2) WHERE id = ?1",
                params![id.as_str(), keep_instance],
            )
            .map_err(StoreError::sql("removing machines"))?;
        }
        tx.commit().map_err(StoreError::sql("removing machines"))?;
        for before in moved {
            self.count_machine(Some(before), None, Some(Life::Dead.as_str()));
        }
        self.book.changed.extend(ids.iter().cloned());
        Ok(())
    }

    /// Marks machines in provisioning error for another start (`retry-provisioning`), all or
    /// none; a retry tick is then due.
    pub fn retry_machines(&mut self, ids: &[MachineId]) -> Result<(), StoreError> {
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("marking machines for retry"))?;
        for id in ids.iter().collect::<BTreeSet<_>>() {
            let row: Option<(String, Option<String>, String)> = tx
                .query_row("SELECT life, instance, instance_status FROM machines WHERE id = ?1", [id.as_str()], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .optional()
                .map_err(StoreError::sql("marking machines for retry"))?;
            let Some((life, instance, status)) = row else { return Err(StoreError::NotFound(id.clone())) };
            if life != "alive" || instance.is_some() || !InstanceStatus::other(status).is_error() {
                return Err(StoreError::Refused(format!("machine {id} is not in a provisioning error")));
            }
            tx.execute("UPDATE machines SET transient = 1 WHERE id = ?1", [id.as_str()])
                .map_err(StoreError::sql("marking machines for retry"))?;
        }
        tx.commit().map_err(StoreError::sql("marking machines for retry"))?;
        self.book.retry_due = true;
        Ok(())
    }

    /// The settings changed at run time.
    pub fn settings(&self) -> Result<Settings, StoreError> {
        let mode = meta_get(&self.conn, "harvest_mode").map_err(StoreError::sql("reading settings"))?;
        let workers = meta_get(&self.conn, "workers").map_err(StoreError::sql("reading settings"))?;
        Ok(Settings { harvest_mode: mode.and_then(|m| m.parse().ok()), workers: workers.and_then(|w| w.parse().ok()) })
    }

    /// Persists the harvest mode.
    pub fn set_harvest_mode(&mut self, mode: HarvestMode) -> Result<(), StoreError> {
        meta_set(&self.conn, "harvest_mode", mode.as_str()).map_err(StoreError::sql("writing the harvest mode"))
    }

    /// Persists the worker pool size.
    pub fn set_workers(&mut self, workers: usize) -> Result<(), StoreError> {
        meta_set(&self.conn, "workers", &workers.to_string()).map_err(StoreError::sql("writing the worker count"))
    }

    // ---- constraints, placement and applications (schema version 3) -------------------------

    /// Rebuilds a version-2 `constraints` table (zones alone) as version 3's, if there is one.
    fn upgrade_constraints_v2(conn: &mut Connection) -> Result<(), StoreError> {
        let ctx = "upgrading the constraints table";
        let columns = |conn: &Connection| -> Result<Vec<String>, StoreError> {
            conn.prepare("SELECT name FROM pragma_table_info('constraints')")
                .and_then(|mut st| st.query_map([], |r| r.get::<_, String>(0))?.collect())
                .map_err(StoreError::sql(ctx))
        };
        let cols = columns(conn)?;
        if cols.is_empty() || cols.iter().any(|c| c == "spec") {
            return Ok(()); // none yet (created whole below), or already version 3
        }
        // Foreign keys cannot be switched inside a transaction: off around it, on again after.
        conn.pragma_update(None, "foreign_keys", "OFF").map_err(StoreError::sql(ctx))?;
        let upgraded = (|| {
            let tx = conn.transaction().map_err(StoreError::sql(ctx))?;
            tx.execute_batch(UPGRADE_CONSTRAINTS_V2).map_err(StoreError::sql(ctx))?;
            tx.commit().map_err(StoreError::sql(ctx))
        })();
        conn.pragma_update(None, "foreign_keys", "ON").map_err(StoreError::sql("enabling foreign keys"))?;
        upgraded
    }

    /// Adds version 3's machine columns a table made by an older version lacks, then their
    /// index and the `changed_at` triggers.
    fn add_machine_columns_v3(tx: &Transaction<'_>) -> Result<(), StoreError> {
        let ctx = "upgrading the machines table";
        let have: Vec<String> = tx
            .prepare("SELECT name FROM pragma_table_info('machines')")
            .and_then(|mut st| st.query_map([], |r| r.get::<_, String>(0))?.collect())
            .map_err(StoreError::sql(ctx))?;
        for (name, kind) in MACHINE_COLUMNS_V3 {
            if !have.iter().any(|c| c == name) {
                tx.execute_batch(&format!("ALTER TABLE machines ADD COLUMN {name} {kind}"))
                    .map_err(StoreError::sql(ctx))?;
            }
        }
        tx.execute_batch(SCHEMA_V3_AFTER_COLUMNS).map_err(StoreError::sql(ctx))
    }

    /// The id of the row holding this constraint set (made if new); `None` for no constraint.
    fn constraint_row(tx: &Connection, c: &Constraints) -> Result<Option<i64>, StoreError> {
        if c.is_empty() {
            return Ok(None);
        }
        let ctx = "storing a constraint";
        let spec = c.to_string();
        let list = |v: &[String]| (!v.is_empty()).then(|| v.join(","));
        tx.execute(
            "INSERT INTO constraints (spec, zones, arch, cores, mem_mb, root_disk_mb, instance_type, spaces, tags) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT(spec) DO NOTHING",
            params![
                spec,
                c.zones.as_ref().map(|z| z.join(",")),
                c.arch,
                c.cores,
                c.mem_mb.map(|n| n as i64),
                c.root_disk_mb.map(|n| n as i64),
                c.instance_type,
                list(&c.spaces),
                list(&c.tags),
            ],
        )
        .map_err(StoreError::sql(ctx))?;
        tx.query_row("SELECT id FROM constraints WHERE spec = ?1", [&spec], |r| r.get(0))
            .map(Some)
            .map_err(StoreError::sql(ctx))
    }

    /// Inserts `count` machines like `spec` in `tx` (ids never reused), stamped `stamp`: their
    /// ids taken from the counter at once, their rows by one statement (ids `n` to
    /// `n + count - 1`, each its `seq` as text), not a statement per machine.
    fn insert_machines(
        tx: &Connection,
        count: usize,
        spec: &NewMachine,
        stamp: &str,
    ) -> Result<Vec<MachineId>, StoreError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let constraint = Self::constraint_row(tx, &spec.constraints)?;
        let first =
            take_counter(tx, "next_machine", count as u64).map_err(StoreError::sql("allocating machine ids"))?;
        let end = first + count as u64;
        let added = tx
            .prepare_cached(
                "WITH RECURSIVE n(seq) AS (SELECT ?1 UNION ALL SELECT seq + 1 FROM n WHERE seq + 1 < ?2) \
                 INSERT INTO machines (seq, id, constraints_id, placement, application, changed_at) \
                 SELECT seq, CAST(seq AS TEXT), ?3, ?4, ?5, ?6 FROM n",
            )
            .and_then(|mut st| {
                st.execute(params![first as i64, end as i64, constraint, spec.placement, spec.application, stamp])
            })
            .map_err(StoreError::sql("adding machines"))?;
        if added != count {
            return Err(StoreError::Refused(format!("{added} machines were added of the {count} asked for")));
        }
        Ok((first..end).map(|n| MachineId::from(n.to_string())).collect())
    }

    /// Counts and notifies machines just added.
    fn added(&mut self, ids: &[MachineId]) {
        self.book.added(ids, MachineStatus::Pending);
    }

    /// Adds `count` new alive, pending machines like `spec` (constraints, placement,
    /// application), in one transaction. Refused while the model is dying. The caller has
    /// validated `spec`.
    pub fn add_new_machines(&mut self, count: usize, spec: &NewMachine) -> Result<Vec<MachineId>, StoreError> {
        if self.model_life()? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        let stamp = self.stamp();
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("adding machines"))?;
        let ids = Self::insert_machines(&tx, count, spec, &stamp)?;
        tx.commit().map_err(StoreError::sql("adding machines"))?;
        self.added(&ids);
        Ok(ids)
    }

    /// Adds an application and `units` machines for its units, each with its constraints, in
    /// one transaction. Refused while the model is dying, or if the application exists.
    pub fn add_application(
        &mut self,
        name: &str,
        units: usize,
        constraints: &Constraints,
    ) -> Result<Vec<MachineId>, StoreError> {
        if self.model_life()? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        let ctx = "adding an application";
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql(ctx))?;
        let exists: bool = tx
            .query_row("SELECT count(*) FROM applications WHERE name = ?1", [name], |r| r.get::<_, i64>(0))
            .map_err(StoreError::sql(ctx))?
            > 0;
        if exists {
            return Err(StoreError::Refused(format!("application {name:?} already exists")));
        }
        let constraint = Self::constraint_row(&tx, constraints)?;
        tx.execute("INSERT INTO applications (name, constraints_id) VALUES (?1, ?2)", params![name, constraint])
            .map_err(StoreError::sql(ctx))?;
        let spec = NewMachine {
            constraints: constraints.clone(),
            application: Some(name.to_owned()),
            ..NewMachine::default()
        };
        let ids = Self::insert_machines(&tx, units, &spec, &self.stamp())?;
        tx.commit().map_err(StoreError::sql(ctx))?;
        self.added(&ids);
        Ok(ids)
    }

    /// Every application, by name, with its constraints and its machines that are not dead.
    pub fn applications(&self) -> Result<Vec<ApplicationRecord>, StoreError> {
        let ctx = "listing applications";
        let mut st = self
            .conn
            .prepare_cached("SELECT a.name, c.spec FROM applications a LEFT JOIN constraints c ON c.id = a.constraints_id ORDER BY a.name")
            .map_err(StoreError::sql(ctx))?;
        let rows: Vec<(String, Option<String>)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect())
            .map_err(StoreError::sql(ctx))?;
        rows.into_iter()
            .map(|(name, spec)| {
                // Written from a parsed set: it parses back (an unreadable row shows unconstrained).
                let constraints = spec.and_then(|s| Constraints::parse(&s).ok()).unwrap_or_default();
                let machines = self.application_machines(&name)?;
                Ok(ApplicationRecord { name, constraints, machines })
            })
            .collect()
    }

    /// The machines of an application that are not dead, in id order.
    pub(super) fn application_machines(&self, name: &str) -> Result<Vec<MachineId>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT id FROM machines WHERE application = ?1 AND life != 'dead' ORDER BY seq")
            .map_err(StoreError::sql("reading an application's machines"))?;
        let ids = st
            .query_map([name], |r| r.get::<_, String>(0).map(MachineId::from))
            .and_then(|rows| rows.collect())
            .map_err(StoreError::sql("reading an application's machines"));
        ids
    }

    /// Removes an application: its machines become dead (the provisioner stops their
    /// instances, then removes them) and it is forgotten, in one transaction. Returns the
    /// machines it took to dead.
    pub fn remove_application(&mut self, name: &str) -> Result<Vec<MachineId>, StoreError> {
        let ctx = "removing an application";
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql(ctx))?;
        let n = tx.execute("DELETE FROM applications WHERE name = ?1", [name]).map_err(StoreError::sql(ctx))?;
        if n == 0 {
            return Err(StoreError::NoApplication(name.to_owned()));
        }
        let mut moved = Vec::new();
        {
            let mut st = tx
                .prepare("SELECT id, status, life FROM machines WHERE application = ?1 AND life != 'dead' ORDER BY seq")
                .map_err(StoreError::sql(ctx))?;
            let rows = st
                .query_map([name], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))
                .map_err(StoreError::sql(ctx))?;
            for row in rows {
                moved.push(row.map_err(StoreError::sql(ctx))?);
            }
        }
        tx.execute("UPDATE machines SET life = 'dead' WHERE application = ?1 AND life != 'dead'", [name])
            .map_err(StoreError::sql(ctx))?;
        tx.commit().map_err(StoreError::sql(ctx))?;
        let mut ids = Vec::with_capacity(moved.len());
        for (id, status, life) in moved {
            self.count_machine(Some((status, life)), None, Some(Life::Dead.as_str()));
            ids.push(MachineId::from(id));
        }
        self.book.changed.extend(ids.iter().cloned());
        Ok(ids)
    }

    // ---- the simulated cloud's instances -----------------------------------------------------

    /// Creates a pending instance for a start, or returns the one this client token already
    /// made (`false`: not new).
    pub fn create_instance(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
    ) -> Result<(InstanceRecord, bool), StoreError> {
        self.create_instance_in(client_token, zone, tags, InstanceState::Pending)
    }

    /// Creates a running instance for a start with no latency to wait (created and landed by
    /// one statement), or returns the one this client token already made, as it is (`false`).
    pub fn create_running_instance(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
    ) -> Result<(InstanceRecord, bool), StoreError> {
        self.create_instance_in(client_token, zone, tags, InstanceState::Running)
    }

    /// Creates an instance in `state` (pending, or running), or returns the one this client
    /// token already made.
    fn create_instance_in(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
        state: InstanceState,
    ) -> Result<(InstanceRecord, bool), StoreError> {
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("creating an instance"))?;
        let existing = tx
            .prepare_cached(&format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE client_token = ?1"))
            .and_then(|mut st| st.query_row([client_token], instance_from_row).optional())
            .map_err(StoreError::sql("looking up a client token"))?;
        if let Some(existing) = existing {
            return Ok((existing, false));
        }
        let n = next_counter(&tx, "next_instance").map_err(StoreError::sql("allocating an instance id"))?;
        let id = format!("i-{:08x}", n + 1);
        tx.prepare_cached(
            "INSERT INTO instances (seq, id, state, zone, model, machine, start, client_token) \
             VALUES (?1, ?2, ?8, ?3, ?4, ?5, ?6, ?7)",
        )
        .and_then(|mut st| {
            st.execute(params![
                n as i64,
                id,
                zone,
                tags.model,
                tags.machine.as_ref().map(MachineId::as_str),
                tags.start,
                client_token,
                state.as_str()
            ])
        })
        .map_err(StoreError::sql("creating an instance"))?;
        tx.commit().map_err(StoreError::sql("creating an instance"))?;
        self.book.instance_moved(None, state.as_str());
        Ok((InstanceRecord::created(id, state, zone, tags, client_token), true))
    }

    /// One instance.
    pub fn instance(&self, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError> {
        self.conn
            .prepare_cached(&format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE id = ?1"))
            .and_then(|mut s| s.query_row([id.as_str()], instance_from_row).optional())
            .map_err(StoreError::sql("reading an instance"))
    }

    /// A pending instance comes up: it becomes running (any other state is kept). Returns it.
    pub fn land_instance(&mut self, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError> {
        let n = self
            .conn
            .prepare_cached("UPDATE instances SET state = 'running' WHERE id = ?1 AND state = 'pending'")
            .and_then(|mut st| st.execute([id.as_str()]))
            .map_err(StoreError::sql("landing an instance"))?;
        if n > 0 {
            self.book.instance_moved(Some(InstanceState::Pending.as_str()), InstanceState::Running.as_str());
        }
        self.instance(id)
    }

    /// Every instance ever created, terminated ones included, in creation order.
    pub fn all_instances(&self) -> Result<Vec<InstanceRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("SELECT {INSTANCE_COLUMNS} FROM instances ORDER BY seq"))
            .map_err(StoreError::sql("listing instances"))?;
        let rows = stmt.query_map([], instance_from_row).map_err(StoreError::sql("listing instances"))?;
        rows.collect::<Result<_, _>>().map_err(StoreError::sql("listing instances"))
    }

    /// The non-terminated instances tagged with this model.
    pub fn live_instances(&self, model: &str) -> Result<Vec<CloudInstance>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {INSTANCE_COLUMNS} FROM instances WHERE model = ?1 AND state != 'terminated' ORDER BY seq"
            ))
            .map_err(StoreError::sql("listing instances"))?;
        let rows = stmt
            .query_map([model], |r| instance_from_row(r).map(|i| i.instance))
            .map_err(StoreError::sql("listing instances"))?;
        rows.collect::<Result<_, _>>().map_err(StoreError::sql("listing instances"))
    }

    /// Terminates instances (unknown ids are ignored: stopping a gone instance succeeds).
    pub fn terminate_instances(&mut self, ids: &[InstanceId]) -> Result<(), StoreError> {
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("terminating instances"))?;
        let mut moved = Vec::new();
        for id in ids.iter().collect::<BTreeSet<_>>() {
            let state: Option<String> = tx
                .query_row("SELECT state FROM instances WHERE id = ?1", [id.as_str()], |r| r.get(0))
                .optional()
                .map_err(StoreError::sql("terminating instances"))?;
            if let Some(state) = state.filter(|s| s != InstanceState::Terminated.as_str()) {
                tx.execute("UPDATE instances SET state = 'terminated' WHERE id = ?1", [id.as_str()])
                    .map_err(StoreError::sql("terminating instances"))?;
                moved.push(state);
            }
        }
        tx.commit().map_err(StoreError::sql("terminating instances"))?;
        for state in moved {
            self.book.instance_moved(Some(&state), InstanceState::Terminated.as_str());
        }
        Ok(())
    }

    /// Removes our model's tag from instances left alone on purpose.
    pub fn release_instances(&mut self, ids: &[InstanceId]) -> Result<(), StoreError> {
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("releasing instances"))?;
        for id in ids {
            tx.execute("UPDATE instances SET model = NULL WHERE id = ?1", [id.as_str()])
                .map_err(StoreError::sql("releasing instances"))?;
        }
        tx.commit().map_err(StoreError::sql("releasing instances"))
    }

    /// Gives a live instance new identity tags; `false` if it is not there or terminated.
    pub fn retag_instance(&mut self, id: &InstanceId, tags: &InstanceTags) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute(
                "UPDATE instances SET model = ?2, machine = ?3, start = ?4 WHERE id = ?1 AND state != 'terminated'",
                params![id.as_str(), tags.model, tags.machine.as_ref().map(MachineId::as_str), tags.start],
            )
            .map_err(StoreError::sql("retagging an instance"))?;
        Ok(n > 0)
    }

    /// The ids of instances still pending (their start's landing was lost with a crash).
    pub fn pending_instances(&self) -> Result<Vec<InstanceId>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id FROM instances WHERE state = 'pending' ORDER BY seq")
            .map_err(StoreError::sql("listing pending instances"))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0).map(InstanceId::from))
            .map_err(StoreError::sql("listing pending instances"))?;
        rows.collect::<Result<_, _>>().map_err(StoreError::sql("listing pending instances"))
    }
}

/// Containers and manual machines (issue 14).
impl StoreCore {
    /// Adds `count` alive, pending containers of `kind` on `host`: `HOST/KIND/N`, numbered per
    /// host and type from 0 (never reused). The host must exist and be alive (else
    /// [`StoreError::Invalid`] naming `host`, nothing written); refused while the model is
    /// dying.
    pub fn add_containers(&mut self, host: &MachineId, kind: &str, count: usize) -> Result<Vec<MachineId>, StoreError> {
        if self.model_life()? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        match self.machine(host)? {
            None => {
                return Err(StoreError::Invalid { field: "host", message: format!("machine {host} does not exist") })
            }
            Some(h) if h.machine.life != Life::Alive => {
                return Err(StoreError::Invalid {
                    field: "host",
                    message: format!("machine {host} is {}: containers need an alive host", h.machine.life),
                })
            }
            Some(_) => {}
        }
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("adding containers"))?;
        let mut ids = Vec::with_capacity(count);
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO machines (seq, id) VALUES (?1, ?2)")
                .map_err(StoreError::sql("adding containers"))?;
            let key = format!("next_container/{host}/{kind}");
            for _ in 0..count {
                let n = next_counter(&tx, &key).map_err(StoreError::sql("allocating a container id"))?;
                let seq =
                    next_counter(&tx, "next_container_seq").map_err(StoreError::sql("allocating a container id"))?;
                let id = format!("{host}/{kind}/{n}");
                insert
                    .execute(params![CONTAINER_SEQ_BASE + seq as i64, id])
                    .map_err(StoreError::sql("adding containers"))?;
                ids.push(MachineId::from(id));
            }
        }
        tx.commit().map_err(StoreError::sql("adding containers"))?;
        self.book.added(&ids, MachineStatus::Pending);
        Ok(ids)
    }

    /// Registers a manually provisioned machine at `address` (validated by the caller): a new
    /// top-level id, shown as Juju's manual provider shows one (status `started`, instance
    /// `manual:ADDRESS`, instance status `running`); the provisioner never starts or stops it.
    /// An address already a live manual machine's is [`StoreError::Invalid`] naming `address`.
    pub fn add_manual(&mut self, address: &str) -> Result<MachineId, StoreError> {
        if self.model_life()? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        let taken: Option<String> = self
            .conn
            .query_row(
                "SELECT id FROM machines WHERE manual = 1 AND address = ?1 AND life != 'dead' ORDER BY seq LIMIT 1",
                [address],
                |r| r.get(0),
            )
            .optional()
            .map_err(StoreError::sql("adding a manual machine"))?;
        if let Some(id) = taken {
            return Err(StoreError::Invalid {
                field: "address",
                message: format!("{address} is already manual machine {id}"),
            });
        }
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("adding a manual machine"))?;
        let n = next_counter(&tx, "next_machine").map_err(StoreError::sql("allocating a machine id"))?;
        let id = MachineId::from(n.to_string());
        tx.execute(
            "INSERT INTO machines (seq, id, status, status_message, instance, instance_status, manual, address) \
             VALUES (?1, ?2, 'started', ?3, ?4, ?5, 1, ?6)",
            params![
                n as i64,
                id.as_str(),
                format!("manually provisioned at {address}"),
                format!("manual:{address}"),
                InstanceStatus::running().as_str(),
                address
            ],
        )
        .map_err(StoreError::sql("adding a manual machine"))?;
        tx.commit().map_err(StoreError::sql("adding a manual machine"))?;
        self.book.added(std::slice::from_ref(&id), MachineStatus::Started);
        Ok(id)
    }

    /// The containers on `host` that are not dead, in id order.
    pub fn live_containers_of(&self, host: &MachineId) -> Result<Vec<MachineId>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id FROM machines WHERE substr(id, 1, length(?1) + 1) = ?1 || '/' AND life != 'dead' ORDER BY seq")
            .map_err(StoreError::sql("listing containers"))?;
        let rows = stmt
            .query_map([host.as_str()], |r| r.get::<_, String>(0).map(MachineId::from))
            .map_err(StoreError::sql("listing containers"))?;
        let ids: Vec<MachineId> = rows.collect::<Result<_, _>>().map_err(StoreError::sql("listing containers"))?;
        Ok(ids.into_iter().filter(|c| c.container_of().is_some_and(|(h, _)| &h == host)).collect())
    }

    /// How many machines are in error (through the partial index `machines_in_error`).
    pub fn machines_in_error(&self) -> Result<u64, StoreError> {
        self.conn
            .prepare_cached("SELECT count(*) FROM machines INDEXED BY machines_in_error WHERE status = 'error' OR instance_status = 'provisioning error'")
            .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)))
            .map(|n| n as u64)
            .map_err(StoreError::sql("counting machines in error"))
    }

    /// The live manual machines (they refuse a model destruction without `force`), in id order.
    pub fn live_manual_machines(&self) -> Result<Vec<MachineId>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id FROM machines WHERE manual = 1 AND life != 'dead' ORDER BY seq")
            .map_err(StoreError::sql("listing manual machines"))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0).map(MachineId::from))
            .map_err(StoreError::sql("listing manual machines"))?;
        rows.collect::<Result<_, _>>().map_err(StoreError::sql("listing manual machines"))
    }
}
