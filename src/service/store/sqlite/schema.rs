//! The SQLite schema and its upgrades: the tables as this build creates them ([`SCHEMA`]) and
//! the steps that take a database of an older version to this one, each adding only what it
//! lacks (so that the steps compose and run again harmlessly).

use rusqlite::{Connection, Transaction};

use crate::service::store::errors::StoreError;

/// Adds to `machines` each of `columns` (name, DDL) it lacks, so that additive schema steps
/// compose with one another and run again harmlessly.
pub(super) fn add_missing_machine_columns(tx: &Transaction<'_>, columns: &[(&str, &str)]) -> Result<(), StoreError> {
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
pub(super) fn upgrade_manual_machines(tx: &Transaction<'_>) -> Result<(), StoreError> {
    add_missing_machine_columns(
        tx,
        &[
            ("manual", "ALTER TABLE machines ADD COLUMN manual INTEGER NOT NULL DEFAULT 0"),
            ("address", "ALTER TABLE machines ADD COLUMN address TEXT"),
        ],
    )
}

/// Schema step of version 3 (additive, for `machine show`): per machine, how many start
/// attempts the provisioner reported and the last one's error ([`StoreBackend::record_start_outcome`](crate::service::store::StoreBackend::record_start_outcome)).
pub(super) fn upgrade_start_attempts(tx: &Transaction<'_>) -> Result<(), StoreError> {
    add_missing_machine_columns(
        tx,
        &[
            ("start_attempts", "ALTER TABLE machines ADD COLUMN start_attempts INTEGER NOT NULL DEFAULT 0"),
            ("last_start_error", "ALTER TABLE machines ADD COLUMN last_start_error TEXT"),
        ],
    )
}

/// Schema step of version 8 (issue 33): each machine's capacity preference (`NULL`:
/// `on-demand`) and the capacity its instance runs on (`NULL`: not known), and each
/// application's capacity preference.
pub(super) fn upgrade_capacity(tx: &Transaction<'_>) -> Result<(), StoreError> {
    add_missing_machine_columns(
        tx,
        &[
            ("capacity", "ALTER TABLE machines ADD COLUMN capacity TEXT"),
            ("capacity_type", "ALTER TABLE machines ADD COLUMN capacity_type TEXT"),
        ],
    )?;
    let has: i64 = tx
        .query_row("SELECT count(*) FROM pragma_table_info('applications') WHERE name = 'capacity'", [], |r| r.get(0))
        .map_err(StoreError::sql("reading the schema"))?;
    if has == 0 {
        tx.execute_batch("ALTER TABLE applications ADD COLUMN capacity TEXT")
            .map_err(StoreError::sql("upgrading the schema"))?;
    }
    Ok(())
}

/// Schema step of version 9 (issue 37): the trace context (W3C `traceparent`) of the request
/// that added a machine (`NULL`: not traced).
pub(super) fn upgrade_trace_parent(tx: &Transaction<'_>) -> Result<(), StoreError> {
    add_missing_machine_columns(tx, &[("trace_parent", "ALTER TABLE machines ADD COLUMN trace_parent TEXT")])
}

/// The columns of version 3's `constraints` table, whole constraint sets: the table
/// [`SCHEMA`] creates and the one [`UPGRADE_CONSTRAINTS_V2`] rebuilds a version-2 table as.
macro_rules! constraints_columns {
    () => {
        "(
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
);"
    };
}

pub(super) const SCHEMA: &str = concat!(
    "
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS constraints ",
    constraints_columns!(),
    "
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
"
);

/// Version 3's additions to `machines` (added to older tables in place), then what needs them.
pub(super) const MACHINE_COLUMNS_V3: [(&str, &str); 3] =
    [("placement", "TEXT"), ("application", "TEXT"), ("changed_at", "TEXT")];

/// `changed_at` is kept by the database itself: every insert and update of a machine stamps it
/// (UTC, milliseconds), whoever writes.
pub(super) const SCHEMA_V3_AFTER_COLUMNS: &str = "
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
pub(super) const UPGRADE_CONSTRAINTS_V2: &str = concat!(
    "
CREATE TABLE constraints_v3 ",
    constraints_columns!(),
    "
INSERT INTO constraints_v3 (id, spec, zones) SELECT id, 'zones=' || zones, zones FROM constraints;
DROP TABLE constraints;
ALTER TABLE constraints_v3 RENAME TO constraints;
"
);

/// Rebuilds a version-2 `constraints` table (zones alone) as version 3's, if there is one.
pub(super) fn upgrade_constraints_v2(conn: &mut Connection) -> Result<(), StoreError> {
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
pub(super) fn add_machine_columns_v3(tx: &Transaction<'_>) -> Result<(), StoreError> {
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

/// Schema step of version 6: the model a token is scoped to (a database of version 4 or 5
/// gains the column; its tokens stay service-wide).
pub(super) fn upgrade_token_models(tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
    // Version 7 adds the model's uuid (a scoped token is valid for that model only).
    for column in ["model", "model_uuid"] {
        let has: i64 = tx
            .query_row("SELECT count(*) FROM pragma_table_info('api_tokens') WHERE name = ?1", [column], |r| r.get(0))
            .map_err(StoreError::sql("reading the schema"))?;
        if has == 0 {
            tx.execute_batch(&format!("ALTER TABLE api_tokens ADD COLUMN {column} TEXT"))
                .map_err(StoreError::sql("upgrading the schema"))?;
        }
    }
    Ok(())
}
