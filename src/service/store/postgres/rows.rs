//! PostgreSQL rows: the decoding of machine, instance and token rows, the statements that read
//! and write them (columns, lean reads, counters in `meta`, adds of many machines at once), the
//! change notifications a write sends, and the machine-row writes several operations share.

use super::client::{CallError, Reply};
use super::conn::{pg, Param, Run};
use super::{Notice, PgStore, Tx, CHANGES_CHANNEL, MAX_NOTIFIED_IDS};
use crate::model::{
    CloudInstance, Constraints, InstanceId, InstanceState, InstanceStatus, InstanceTags, Life, Machine, MachineId,
    MachineStatus,
};
use crate::ports::ProvisionedInstance;
use crate::service::store::errors::StoreError;
use crate::service::store::records::{token_record, ConstraintRow, InstanceRecord, MachineRecord, NewMachine};
use crate::service::token::TokenRecord;
use postgres::Row;
use std::collections::HashMap;

/// A machine's status, life and instance status (the counts' before), its row locked: `$1` its
/// id.
pub(super) const STATUS_LIFE_SQL: &str = "SELECT status, life, instance_status FROM machines WHERE id = $1 FOR UPDATE";

/// A machine's status, life and instance status before a write (what the counts need).
pub(super) type Was = (String, String, String);

/// A machine's whole record; its first seven columns are [`LEAN_MACHINE_SQL`]'s.
pub(super) const MACHINE_COLUMNS: &str =
    "m.id, m.life, m.status, m.instance_status, m.instance, m.keep_instance, m.manual, \
                               m.status_message, m.instance_status_message, m.zone, m.transient, \
                               COALESCE(c.zones, m.zones), c.arch, c.cores, c.mem_mb, c.root_disk_mb, \
                               c.instance_type, c.spaces, c.tags, m.placement, m.application, m.changed_at, \
                               m.address, m.start_attempts, m.last_start_error, m.capacity, m.capacity_type";
pub(super) const MACHINE_FROM: &str = "machines m LEFT JOIN constraints c ON c.id = m.constraints_id";
pub(super) const INSTANCE_COLUMNS: &str = "id, state, zone, model, machine, start, client_token";

pub(super) fn bad_row(context: &'static str, message: String) -> StoreError {
    StoreError::Damaged { context, message }
}

pub(super) fn machine_from_row(r: &Row) -> Result<MachineRecord, StoreError> {
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
        capacity: capacity_from(r, 25)?,
        capacity_type: capacity_type_from(r, 26)?,
    })
}

/// A capacity preference column (`NULL`: `on-demand`).
pub(super) fn capacity_from(r: &Row, i: usize) -> Result<crate::model::CapacityPreference, StoreError> {
    let text: Option<String> = r.try_get(i).map_err(pg("reading a machine"))?;
    text.map_or(Ok(crate::model::CapacityPreference::OnDemand), |t| {
        t.parse().map_err(|e| bad_row("reading a machine", format!("{e}")))
    })
}

/// A capacity type column (`NULL`: not known).
fn capacity_type_from(r: &Row, i: usize) -> Result<Option<crate::model::CapacityType>, StoreError> {
    let text: Option<String> = r.try_get(i).map_err(pg("reading a machine"))?;
    match text.as_deref() {
        None => Ok(None),
        Some("spot") => Ok(Some(crate::model::CapacityType::Spot)),
        Some("on-demand") => Ok(Some(crate::model::CapacityType::OnDemand)),
        Some(other) => Err(bad_row("reading a machine", format!("invalid capacity type {other:?}"))),
    }
}

/// A capacity preference as its column holds it (`NULL` for `on-demand`, the default).
pub(super) fn capacity_column(c: crate::model::CapacityPreference) -> Option<&'static str> {
    (!c.is_default()).then(|| c.as_str())
}

/// The constraints of a row whose eight columns from `first` on are the machine's zones (its own or its
/// constraint set's), then the constraint set's arch, cores, memory, root disk, instance type, spaces
/// and tags.
pub(super) fn constraints_from_row(r: &Row, first: usize) -> Result<Constraints, StoreError> {
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
pub(super) fn lean_machine_from_row(r: &Row) -> Result<Machine, StoreError> {
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
pub(super) const LEAN_MACHINE_SQL: &str =
    "SELECT id, life, status, instance_status, instance, keep_instance, manual FROM machines WHERE id = ANY($1)";
pub(super) const MACHINE_APPLICATION_SQL: &str = "SELECT id, application FROM machines WHERE id = ANY($1)";
pub(super) const MACHINE_PROVISIONING_SQL: &str =
    "SELECT m.id, COALESCE(c.zones, m.zones), c.arch, c.cores, c.mem_mb, \
     c.root_disk_mb, c.instance_type, c.spaces, c.tags, m.placement, m.capacity, m.trace_parent, \
     CASE WHEN strpos(m.id, '/') > 0 THEN \
     (SELECT h.trace_parent FROM machines h WHERE h.id = substring(m.id from '^(.*)/[^/]+/[^/]+$')) END \
     FROM machines m LEFT JOIN constraints c ON c.id = m.constraints_id WHERE m.id = ANY($1)";

pub(super) fn instance_from_row(r: &Row) -> Result<InstanceRecord, StoreError> {
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
            capacity_type: None,
            image: None,
        },
        client_token: r.try_get(6).map_err(get)?,
    })
}

pub(super) fn ids_of(rows: Vec<Row>, ctx: &'static str) -> Result<Vec<MachineId>, StoreError> {
    rows.iter().map(|r| r.try_get::<_, String>(0).map(MachineId::from).map_err(pg(ctx))).collect()
}

pub(super) fn meta_get(c: &mut impl Run, key: &str) -> Result<Option<String>, CallError> {
    Ok(c.query_opt("SELECT value FROM meta WHERE key = $1", &[&key])?.map(|r| r.get(0)))
}

pub(super) fn meta_set(c: &mut impl Run, key: &str, value: &str) -> Result<(), CallError> {
    c.execute(
        "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&key, &value],
    )
    .map(|_| ())
}

/// Takes the next value of a counter kept in `meta` (0 first), atomically.
pub(super) fn next_counter(tx: &mut Tx<'_>, key: &str) -> Result<i64, CallError> {
    next_counters(tx, key, 1)
}

/// A simulated instance's row, unless one with this client token exists: its seq and id drawn
/// from the counter in the same statement, the counter untouched when the token has its
/// instance already (`$1` `next_instance`, `$2` 1; `$3`... zone, model, machine, start, client
/// token, state): the new id, or no row. The id is `i-` and the seq plus one in hex, at least 8
/// digits.
pub(super) const INSERT_NEW_INSTANCE_SQL: &str = "WITH c AS (\
     INSERT INTO meta (key, value) SELECT $1::text, $2::bigint::text \
     WHERE NOT EXISTS (SELECT 1 FROM instances WHERE client_token = $7) \
     ON CONFLICT (key) DO UPDATE SET value = ((meta.value)::bigint + $2::bigint)::text \
     RETURNING (value)::bigint - $2::bigint AS first\
     ) INSERT INTO instances (seq, id, state, zone, model, machine, start, client_token) \
     SELECT first, 'i-' || lpad(to_hex(first + 1), greatest(8, length(to_hex(first + 1))), '0'), $8, \
     $3, $4, $5, $6, $7 FROM c RETURNING id";

/// Adds of machines with no constraints by one statement (a group's
/// [`Write::AddMachines`](crate::service::store::Write::AddMachines)
/// units, or one add alone), each in order: the model's life read and locked (as
/// [`life_in`]: nothing is added unless it is alive), the ids drawn from the counter at once
/// and the rows inserted; `$1` counts, `$2` placements, `$3` applications; the machines'
/// notices sent (`$4` channel, `$5` model uuid, at most `$6` ids a notice); `$7` capacities,
/// `$8` trace contexts (issue 37). Answers the first
/// seq drawn (the adds' machines follow it, in order), or no row if the model is not alive
/// (nothing added). Its parameters: [`add_many_params`].
pub(super) const ADD_MANY_SQL: &str = concat!(
    "WITH life AS (SELECT value FROM meta WHERE key = 'model_life' FOR SHARE), \
     v AS (SELECT n, count, placement, application, capacity, trace_parent, \
     sum(count) OVER (ORDER BY n) - count AS skip \
     FROM unnest($1::bigint[], $2::text[], $3::text[], $7::text[], $8::text[]) \
     WITH ORDINALITY AS v(count, placement, application, capacity, trace_parent, n)), \
     c AS (INSERT INTO meta (key, value) SELECT 'next_machine', sum(count)::text FROM v \
     HAVING COALESCE((SELECT value FROM life), 'alive') = 'alive' \
     ON CONFLICT (key) DO UPDATE SET value = ((meta.value)::bigint + (EXCLUDED.value)::bigint)::text \
     RETURNING (value)::bigint - (SELECT sum(count) FROM v)::bigint AS first), \
     ins AS (INSERT INTO machines (seq, id, placement, application, capacity, trace_parent, changed_at) \
     SELECT c.first + v.skip + g.k, (c.first + v.skip + g.k)::text, v.placement, v.application, v.capacity, \
     v.trace_parent, ",
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
pub(super) fn add_many_params<'a>(
    adds: impl Iterator<Item = (usize, &'a NewMachine)>,
    uuid: &'a str,
) -> Vec<Param<'a>> {
    let (mut counts, mut placements, mut applications) = (Vec::new(), Vec::new(), Vec::new());
    let (mut capacities, mut traces) = (Vec::new(), Vec::new());
    for (count, spec) in adds {
        counts.push(count as i64);
        placements.push(spec.placement.as_deref());
        applications.push(spec.application.as_deref());
        capacities.push(capacity_column(spec.capacity));
        traces.push(spec.trace_parent.as_deref());
    }
    vec![
        Box::new(counts),
        Box::new(placements),
        Box::new(applications),
        Box::new(CHANGES_CHANNEL),
        Box::new(uuid),
        Box::new(MAX_NOTIFIED_IDS as i64),
        Box::new(capacities),
        Box::new(traces),
    ]
}

/// Takes the next `count` values of a counter kept in `meta` at once: the first of them.
pub(super) fn next_counters(tx: &mut Tx<'_>, key: &str, count: i64) -> Result<i64, CallError> {
    Ok(tx.query_one(counter_sql!(), &[&key, &count])?.try_get(0)?)
}

/// Sends a change notification from `tx` (delivered at its commit, not before, not without):
/// queued to go with the transaction's next statement or its commit, no round trip of its own.
pub(super) fn notify(tx: &mut Tx<'_>, model_uuid: &str, kind: &str, ids: &[MachineId]) -> Result<(), StoreError> {
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
pub(super) fn notify_literal(payload: &str) -> Option<String> {
    (!payload.contains("$n$")).then(|| format!("SELECT pg_notify('{CHANGES_CHANNEL}', $n${payload}$n$)"))
}

/// What [`notify`] runs: `$1` the channel, `$2` the payload.
pub(super) const NOTIFY_SQL: &str = "SELECT pg_notify($1, $2)";

/// A change notification's payload (a [`Notice`] as JSON).
pub(super) fn notice_payload(model_uuid: &str, kind: &str, ids: &[MachineId]) -> String {
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
pub(super) fn life_in(tx: &mut Tx<'_>) -> Result<Life, StoreError> {
    let life = tx
        .query_opt("SELECT value FROM meta WHERE key = 'model_life' FOR SHARE", &[])
        .map_err(pg("reading the model life"))?
        .map(|r| r.get::<_, String>(0));
    Ok(life.and_then(|l| l.parse().ok()).unwrap_or(Life::Alive))
}

pub(super) const TOKEN_COLUMNS: &str = "id, scope, created, revoked, model, model_uuid";

pub(super) fn token_from_row(r: &Row, ctx: &'static str) -> Result<TokenRecord, StoreError> {
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

impl PgStore {
    pub(super) fn status_life_in(tx: &mut Tx<'_>, id: &MachineId) -> Result<Option<Was>, StoreError> {
        Ok(tx
            .query_opt(STATUS_LIFE_SQL, &[&id.as_str()])
            .map_err(pg("reading a machine"))?
            .map(|r| (r.get(0), r.get(1), r.get(2))))
    }

    /// Creates an instance in `state` (pending, or running for a start with no latency to wait),
    /// or returns the one this client token already made, as it is (`false`).
    pub(super) fn create_instance_in(
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
    pub(super) fn record_instance(
        &mut self,
        id: &MachineId,
        info: &ProvisionedInstance,
        started: bool,
    ) -> Result<(), StoreError> {
        const SQL: &str = "UPDATE machines SET instance = $2, zone = $3, nonce = $4, display_name = $5, \
             instance_status = $6, instance_status_message = '', status = 'started', status_message = '', \
             transient = false, capacity_type = $7 WHERE id = $1";
        const STARTED_SQL: &str = "UPDATE machines SET instance = $2, zone = $3, nonce = $4, display_name = $5, \
             instance_status = $6, instance_status_message = '', status = 'started', status_message = '', \
             transient = false, start_attempts = start_attempts + 1, last_start_error = NULL, capacity_type = $7 \
             WHERE id = $1";
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
                &info.capacity_type.map(crate::model::CapacityType::as_str),
            ],
        )?;
        if let Some((status, life, instance_status)) = before {
            self.book.count_error_of((&status, &instance_status), Some("started"), Some(info.status.as_str()));
            self.book.count_machine(Some((status, life)), Some(MachineStatus::Started.as_str()), None);
        }
        Ok(())
    }

    /// One machine update in its own (fenced) transaction, notified; `NotFound` if no row.
    pub(super) fn update_machine(
        &mut self,
        id: &MachineId,
        ctx: &'static str,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Option<Was>, StoreError> {
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
        let before =
            replies.next().map(Reply::into_rows).unwrap_or_default().first().map(|r| (r.get(0), r.get(1), r.get(2)));
        if replies.next().is_none_or(|n| n.count() == 0) {
            return Err(StoreError::NotFound(id.clone()));
        }
        tx.commit().map_err(pg(ctx))?;
        Ok(before)
    }

    pub(super) fn constraint_row(tx: &mut Tx<'_>, c: &Constraints) -> Result<Option<i64>, StoreError> {
        let Some(r) = ConstraintRow::of(c) else { return Ok(None) };
        let ctx = "storing a constraint";
        tx.execute(
            "INSERT INTO constraints (spec, zones, arch, cores, mem_mb, root_disk_mb, instance_type, spaces, tags) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (spec) DO NOTHING",
            &[&r.spec, &r.zones, &r.arch, &r.cores, &r.mem_mb, &r.root_disk_mb, &r.instance_type, &r.spaces, &r.tags],
        )
        .map_err(pg(ctx))?;
        tx.query_one("SELECT id FROM constraints WHERE spec = $1", &[&r.spec])
            .and_then(|r| r.try_get(0).map_err(CallError::from))
            .map(Some)
            .map_err(pg(ctx))
    }

    /// Adds `count` machines in two statements whatever the count (their ids drawn at once, the
    /// rows inserted by one statement): an add of 1,000 machines is two round trips, not 2,000.
    pub(super) fn insert_machines(
        tx: &mut Tx<'_>,
        count: usize,
        spec: &NewMachine,
    ) -> Result<Vec<MachineId>, StoreError> {
        let constraint = Self::constraint_row(tx, &spec.constraints)?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let first = next_counters(tx, "next_machine", count as i64).map_err(pg("allocating machine ids"))?;
        let last = first + count as i64 - 1;
        tx.execute(
            "INSERT INTO machines (seq, id, constraints_id, placement, application, capacity, trace_parent) \
             SELECT g.n, g.n::text, $3, $4, $5, $6, $7 FROM generate_series($1::bigint, $2::bigint) AS g(n) ORDER BY g.n",
            &[
                &first,
                &last,
                &constraint,
                &spec.placement,
                &spec.application,
                &capacity_column(spec.capacity),
                &spec.trace_parent,
            ],
        )
        .map_err(pg("adding machines"))?;
        Ok((first..=last).map(|n| MachineId::from(n.to_string())).collect())
    }

    /// Reads `ids` by one statement (`sql`, `$1` the ids, each row's first column its id), each
    /// row by `read`: in request order, `None` for an id not found.
    pub(super) fn read_many<T: Clone>(
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

    pub(super) fn query_ids(
        &mut self,
        ctx: &'static str,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<MachineId>, StoreError> {
        let rows = self.client()?.query(sql, params).map_err(pg(ctx))?;
        ids_of(rows, ctx)
    }
}
