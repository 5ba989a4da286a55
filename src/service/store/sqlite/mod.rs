//! The SQLite backend, the embedded default: one database file in the data directory
//! ([`DB_FILE`]), opened by one process at a time, WAL journal, `synchronous=FULL` (a transaction
//! that returned has been fsynced, so it survives `kill -9` and a power cut).
//!
//! [`StoreCore`] is the plain core over one `rusqlite::Connection`: opened here, its schema and
//! upgrades in `schema.rs`, rows and shared machine writes in `rows.rs`, its operations (the
//! [`StoreBackend`] trait) in `backend.rs`, with group commits,
//! instances, start intents and tokens in files of their own. No actix.

mod backend;
mod group;
mod instances;
mod intents;
mod machines;
mod rows;
mod schema;
#[cfg(test)]
mod tests;
mod tokens;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension};

use self::rows::{meta_get, meta_set, now_stamp};
use self::schema::{
    add_machine_columns_v3, upgrade_capacity, upgrade_constraints_v2, upgrade_manual_machines, upgrade_start_attempts,
    upgrade_token_models, upgrade_trace_parent, SCHEMA,
};
use super::backend::StoreBackend;
use super::errors::StoreError;
use super::records::{random_uuid, Book, BookMark};
use crate::model::{Life, MachineId};

/// The database file's name inside the data directory.
pub(crate) const DB_FILE: &str = "provisioner.db";
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
/// Version 8 added `machines.capacity`, `machines.capacity_type` and `applications.capacity`
/// (capacity preferences and what a machine got, issue 33; `NULL`: on-demand, not known).
/// Version 9 added `machines.trace_parent` (the trace context of the request that added a
/// machine, issue 37).
pub(crate) const SCHEMA_VERSION: i64 = 9;

/// The store's core. One per database; every method is one statement or one transaction.
pub(crate) struct StoreCore {
    conn: Connection,
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

/// A group commit open on a SQLite connection (see [`StoreBackend::begin_group`]).
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

impl StoreCore {
    /// Opens (creating if needed) the database at `path`: WAL journal, full fsync on every
    /// commit, the schema, and a model uuid drawn on first open.
    pub(crate) fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_file(path, true)
    }

    /// Opens the database at `path` that [`StoreCore::open`] has just checked (and closed),
    /// without reading it whole again.
    pub(crate) fn open_checked_before(path: &Path) -> Result<Self, StoreError> {
        Self::open_file(path, false)
    }

    fn open_file(path: &Path, check: bool) -> Result<Self, StoreError> {
        let conn = Connection::open(path).map_err(StoreError::sql("opening the database"))?;
        let mut core = Self::init(conn, check)?;
        core.file = Some((path.to_owned(), file_identity(path).ok().flatten()));
        Ok(core)
    }

    /// An in-memory store (tests).
    #[cfg(test)]
    pub(crate) fn in_memory() -> Result<Self, StoreError> {
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
        upgrade_constraints_v2(&mut conn)?;
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
        add_machine_columns_v3(&tx)?;
        upgrade_manual_machines(&tx)?;
        upgrade_start_attempts(&tx)?;
        upgrade_token_models(&tx)?;
        upgrade_capacity(&tx)?;
        upgrade_trace_parent(&tx)?;
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

    /// A machine's status, life and instance status (what the counts need of it before a
    /// write), if it exists.
    fn status_life(&self, id: &MachineId) -> Result<Option<(String, String, String)>, StoreError> {
        self.conn
            .prepare_cached("SELECT status, life, instance_status FROM machines WHERE id = ?1")
            .and_then(|mut s| s.query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).optional())
            .map_err(StoreError::sql("reading a machine"))
    }

    /// Counts a write of a machine's status (`status`, with the instance status it set, if it
    /// set one) and life, with `before` as read by [`StoreCore::status_life`].
    fn count_machine(
        &mut self,
        before: Option<(String, String, String)>,
        status: Option<&str>,
        life: Option<&str>,
        instance_status: Option<&str>,
    ) {
        if let Some((was, was_life, was_instance)) = before {
            self.book.count_error_of((&was, &was_instance), status, instance_status);
            self.book.count_machine(Some((was, was_life)), status, life);
        }
    }

    #[cfg(test)]
    pub(super) fn conn_for_tests(&self) -> &Connection {
        &self.conn
    }

    /// Whether commits are fsynced now.
    #[cfg(test)]
    pub(crate) fn is_durable(&self) -> bool {
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
}
