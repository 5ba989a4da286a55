//! SQLite rows: a write's own atomicity ([`Atomic`]), the decoding of machine and instance rows,
//! and the `meta` table's values and counters. (The machine-row writes several operations share
//! are `machines.rs`'s.)

use rusqlite::{Connection, OptionalExtension, Row};

use crate::model::{CloudInstance, Constraints, InstanceId, InstanceStatus, InstanceTags, Machine, MachineId};
use crate::service::store::errors::StoreError;
use crate::service::store::records::{InstanceRecord, MachineRecord};

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
pub(super) fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

pub(super) fn machine_from_row(r: &Row<'_>) -> rusqlite::Result<MachineRecord> {
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
        capacity: capacity_from(r.get(25)?).map_err(|e| text_err(25, e))?,
        capacity_type: capacity_type_from(r.get(26)?).map_err(|e| text_err(26, e))?,
    })
}

/// A conversion failure of column `i` (its text did not parse).
fn text_err(i: usize, e: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, e.into())
}

/// A capacity preference column (`NULL`: `on-demand`).
pub(super) fn capacity_from(text: Option<String>) -> Result<crate::model::CapacityPreference, String> {
    text.map_or(Ok(crate::model::CapacityPreference::OnDemand), |t| t.parse().map_err(|e| format!("{e}")))
}

/// A capacity type column (`NULL`: not known).
pub(super) fn capacity_type_from(text: Option<String>) -> Result<Option<crate::model::CapacityType>, String> {
    match text.as_deref() {
        None => Ok(None),
        Some("spot") => Ok(Some(crate::model::CapacityType::Spot)),
        Some("on-demand") => Ok(Some(crate::model::CapacityType::OnDemand)),
        Some(other) => Err(format!("invalid capacity type {other:?}: expected spot or on-demand")),
    }
}

/// A capacity preference as its column holds it (`NULL` for `on-demand`, the default).
pub(super) fn capacity_column(c: crate::model::CapacityPreference) -> Option<&'static str> {
    (!c.is_default()).then(|| c.as_str())
}

/// A machine's constraints from the eight columns from `first` on, as [`CONSTRAINT_COLUMNS`]
/// names them.
pub(super) fn constraints_from_row(r: &Row<'_>, first: usize) -> rusqlite::Result<Constraints> {
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
pub(super) const CONSTRAINT_COLUMNS: &str =
    "COALESCE(c.zones, m.zones), c.arch, c.cores, c.mem_mb, c.root_disk_mb, c.instance_type, c.spaces, c.tags";

pub(super) const MACHINE_COLUMNS: &str = "m.id, m.life, m.status, m.status_message, m.instance_status, \
                               m.instance_status_message, m.instance, m.zone, m.keep_instance, m.transient, \
                               COALESCE(c.zones, m.zones), c.arch, c.cores, c.mem_mb, c.root_disk_mb, \
                               c.instance_type, c.spaces, c.tags, m.placement, m.application, m.changed_at, \
                               m.manual, m.address, m.start_attempts, m.last_start_error, m.capacity, \
                               m.capacity_type";
/// Machines with their shared constraints (`m.zones` holds those of version-1 rows).
pub(super) const MACHINE_FROM: &str = "machines m LEFT JOIN constraints c ON c.id = m.constraints_id";

pub(super) fn instance_from_row(r: &Row<'_>) -> rusqlite::Result<InstanceRecord> {
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
            capacity_type: None,
            image: None,
        },
        client_token: r.get(6)?,
    })
}

pub(super) const INSTANCE_COLUMNS: &str = "id, state, zone, model, machine, start, client_token";

pub(super) fn meta_get(tx: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    tx.prepare_cached("SELECT value FROM meta WHERE key = ?1")?.query_row([key], |r| r.get(0)).optional()
}

pub(super) fn meta_set(tx: &Connection, key: &str, value: &str) -> rusqlite::Result<()> {
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

/// Every row a query without parameters selects, in its order, each read by `read`; `what`
/// names the reading in an error.
pub(super) fn select_all<T>(
    conn: &Connection,
    sql: &str,
    read: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    what: &'static str,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(StoreError::sql(what))?;
    let rows = stmt.query_map([], read).map_err(StoreError::sql(what))?;
    rows.collect::<Result<_, _>>().map_err(StoreError::sql(what))
}

/// [`select_all`] of a query whose first column is text, each made a `T` (an id).
pub(super) fn text_column<T: From<String>>(
    conn: &Connection,
    sql: &str,
    what: &'static str,
) -> Result<Vec<T>, StoreError> {
    select_all(conn, sql, |r| r.get::<_, String>(0).map(T::from), what)
}
