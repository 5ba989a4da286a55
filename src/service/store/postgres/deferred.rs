//! Write-behind units in a PostgreSQL group commit, written by set-based statements (see
//! [`LOCK_MACHINES_SQL`]), and run again one at a time when the group cannot keep them all.

use super::client::Piped;
use super::conn::{pg, prepared, Param, Run};
use super::rows::{
    add_many_params, instance_from_row, notice_payload, Was, ADD_MANY_SQL, INSTANCE_COLUMNS, NOTIFY_SQL,
};
use super::schema::RECORD_WRITES_SQL;
use super::{PgStore, CHANGES_CHANNEL, MAX_NOTIFIED_IDS};
use crate::model::{InstanceState, MachineId, MachineStatus};
use crate::service::store::backend::StoreBackend;
use crate::service::store::errors::StoreError;
use crate::service::store::records::InstanceRecord;
use crate::service::store::writes::{Write, Written};
use postgres::types::ToSql;
use postgres::Row;
use std::collections::HashMap;

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
    "SELECT id, status, life, instance_status FROM machines WHERE id = ANY($1::text[]) ORDER BY seq FOR UPDATE";

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
     last_start_error = NULL, capacity_type = v.capacity_type \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) \
     AS v(id, instance, zone, nonce, display_name, status, capacity_type) WHERE m.id = v.id RETURNING m.id"
);

/// One start's instance at a time per client token, across replicas (held to the commit): a
/// run's tokens locked in order.
pub(super) const LOCK_TOKENS_SQL: &str =
    "SELECT count(pg_advisory_xact_lock(hashtext(t))) FROM (SELECT t FROM unnest($1::text[]) AS t ORDER BY t) AS s";

/// [`Write::NewInstance`] units: the instances of the tokens that have none, inserted with
/// ids drawn from the counter in `meta` (bumped once, by their number), in the order given:
/// tokens, zones, models, machines, starts, states (running or pending). Answers each new
/// instance's token and id (a token that had one is read after the commit).
pub(super) const INSERT_INSTANCES_SQL: &str = "WITH v AS (\
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY \
     AS v(token, zone, model, machine, start, state, n) \
     WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.client_token = v.token)), \
     c AS (INSERT INTO meta (key, value) SELECT 'next_instance', count(*)::text FROM v HAVING count(*) > 0 \
     ON CONFLICT (key) DO UPDATE SET value = ((meta.value)::bigint + (EXCLUDED.value)::bigint)::text \
     RETURNING (value)::bigint - (SELECT count(*) FROM v) AS first) \
     INSERT INTO instances (seq, id, state, zone, model, machine, start, client_token) \
     SELECT first + r, 'i-' || lpad(to_hex(first + r + 1), greatest(8, length(to_hex(first + r + 1))), '0'), \
     w.state, w.zone, w.model, w.machine, w.start, w.token \
     FROM c, (SELECT v.*, row_number() OVER (ORDER BY n) - 1 AS r FROM v) AS w \
     RETURNING client_token, id";

/// [`Write::LandInstance`] units: the pending ones of the instances `$1` become running; answers
/// each instance there is as it was before ([`INSTANCE_COLUMNS`]) and whether it was landed
/// (its state then `running`).
pub(super) const LAND_INSTANCES_SQL: &str = concat!(
    "WITH u AS (UPDATE instances SET state = 'running' WHERE id = ANY($1::text[]) AND state = 'pending' \
     RETURNING id) SELECT ",
    "id, state, zone, model, machine, start, client_token",
    ", EXISTS (SELECT 1 FROM u WHERE u.id = i.id) FROM instances i WHERE id = ANY($1::text[])"
);

/// The fence's check ([`check_fence`](super::conn::check_fence)) and [`RECORD_WRITES_SQL`] as one
/// statement, for a group
/// whose fence is checked by its write-behind units' pipeline (its first statement): it fails
/// (division by zero, nothing recorded) unless the lease passes (`$1` model, `$2` holder, `$3`
/// epoch), its row share-locked to the commit, then records the group's `$4` fenced writes. The value drawn from `fence_seq` may be drawn before
/// the lease row is locked: no acquisition can commit between the draw and this transaction's
/// commit and leave the check passing (an acquisition changes the row this check locks and
/// re-reads), and one that comes after draws its value after this commit.
pub(super) const FENCE_AND_RECORD_SQL: &str = "WITH held AS (SELECT 1 / count(*) AS ok FROM (SELECT 1 FROM leader_lease      WHERE model_uuid = $1 AND holder = $2 AND epoch = $3 AND expires_at > statement_timestamp() FOR SHARE) AS l)      INSERT INTO epoch_writes AS w (model_uuid, epoch, holder, writer, writes, first_seq, last_seq)      SELECT $1, $3, $2, pg_backend_pid(), $4, s, s FROM held, nextval('fence_seq') AS s      ON CONFLICT (model_uuid, epoch, holder, writer)      DO UPDATE SET writes = w.writes + EXCLUDED.writes, last_seq = EXCLUDED.last_seq";

/// What a deferred statement's answer tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// The fence's check.
    Fence,
    /// A run's machines locked and read (their status and life before).
    Locked(usize),
    /// A run's machines written (their ids).
    Updated(usize),
    /// A run's new instances (their tokens and ids).
    Inserted(usize),
    /// A run's instances landed (each as it was, and whether it was landed).
    Landed(usize),
    /// The group's adds (the first seq drawn).
    Added,
    /// Nothing to read (a lock, a notice, the epochs' record).
    Other,
}

/// The key a unit writes under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Key<'a> {
    /// A machine.
    Machine(&'a str),
    /// A start's client token.
    Token(&'a str),
    /// An instance.
    Instance(&'a str),
}

/// The key a unit writes under: a machine, a client token or an instance (none for an add: its
/// machines are new).
pub(super) fn write_key(w: &Write) -> Option<Key<'_>> {
    match w {
        Write::MachineStatus { id, .. } | Write::InstanceStatus { id, .. } | Write::StartedInstance { id, .. } => {
            Some(Key::Machine(id.as_str()))
        }
        Write::NewInstance { client_token, .. } => Some(Key::Token(client_token.as_str())),
        Write::LandInstance { id } => Some(Key::Instance(id.as_str())),
        Write::AddMachines { .. } => None,
    }
}

/// Which run each unit belongs to, in order: a unit whose machine (or token) the current run
/// writes already begins the next run.
pub(super) fn runs(writes: &[Write]) -> Vec<usize> {
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
pub(super) fn deferred_statements<'a>(
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
        let mut t_capacity: Vec<Option<&str>> = Vec::new();
        let (mut tokens, mut zones, mut models, mut machines, mut starts, mut states) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut landing: Vec<&str> = Vec::new();
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
                    t_capacity.push(info.capacity_type.map(crate::model::CapacityType::as_str));
                }
                Write::NewInstance { client_token, zone, tags, running } => {
                    tokens.push(client_token.as_str());
                    zones.push(zone.as_deref());
                    models.push(tags.model.as_deref());
                    machines.push(tags.machine.as_ref().map(MachineId::as_str));
                    starts.push(tags.start.as_deref());
                    states.push(new_state(*running).as_str());
                }
                Write::LandInstance { id } => landing.push(id.as_str()),
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
                Box::new(t_capacity),
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
                Box::new(states),
            ];
            out.push((INSERT_INSTANCES_SQL, p, Role::Inserted(run)));
        }
        if !landing.is_empty() {
            out.push((LAND_INSTANCES_SQL, vec![Box::new(landing)], Role::Landed(run)));
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
pub(super) fn deferred_notices(uuid: &str, writes: &[Write]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let ids: Vec<MachineId> = writes
        .iter()
        .filter_map(|w| match w {
            Write::MachineStatus { id, .. } | Write::InstanceStatus { id, .. } | Write::StartedInstance { id, .. } => {
                seen.insert(id.as_str()).then(|| id.clone())
            }
            // An add's statement sends its own notices.
            Write::NewInstance { .. } | Write::LandInstance { .. } | Write::AddMachines { .. } => None,
        })
        .collect();
    ids.chunks(MAX_NOTIFIED_IDS).map(|c| notice_payload(uuid, "machines", c)).collect()
}

/// The state a [`Write::NewInstance`] creates its instance in.
fn new_state(running: bool) -> InstanceState {
    if running {
        InstanceState::Running
    } else {
        InstanceState::Pending
    }
}

impl PgStore {
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
    pub(super) fn send_deferred(&mut self, writes: Vec<Write>) -> Result<bool, StoreError> {
        let ctx = "committing a group's write-behind units";
        let uuid = self.uuid();
        let fence = self.fence.clone();
        self.connection()?;
        let Self { client, group, .. } = self;
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
        // statement that fails if it does not pass (nothing after it runs). Its condition is
        // `Fence::admits` in SQL (one round trip for the whole pipeline); the mutation that
        // skips the check skips it here too.
        let check = fence.as_ref().filter(|f| !f.skip_check && group.fence.is_none() && fenced_units > 0);
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
        let durability = match (conn.durable == Some(group.durable), group.durable) {
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
        let mut before: Vec<HashMap<String, Was>> = vec![HashMap::new(); runs_count];
        let mut updated: Vec<std::collections::HashSet<String>> = vec![Default::default(); runs_count];
        let mut inserted: Vec<HashMap<String, String>> = vec![HashMap::new(); runs_count];
        let mut landed: Vec<HashMap<String, (InstanceRecord, bool)>> = vec![HashMap::new(); runs_count];
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
                        before[run].insert(read(r, 0)?, (read(r, 1)?, read(r, 2)?, read(r, 3)?));
                    }
                    Role::Updated(run) => {
                        updated[run].insert(read(r, 0)?);
                    }
                    Role::Inserted(run) => {
                        inserted[run].insert(read(r, 0)?, read(r, 1)?);
                    }
                    Role::Landed(run) => {
                        let mut record = instance_from_row(r)?;
                        let moved: bool = r.try_get(7).map_err(pg(ctx))?;
                        if moved {
                            record.instance.state = InstanceState::Running;
                        }
                        landed[run].insert(record.instance.id.as_str().to_owned(), (record, moved));
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
                Write::NewInstance { client_token, zone, tags, running } => match inserted[*run].remove(client_token) {
                    Some(id) => {
                        let state = new_state(*running);
                        self.book.instance_moved(None, state.as_str());
                        let record = InstanceRecord::created(id, state, zone.as_deref(), tags, client_token);
                        Ok(Written::Instance(record, true))
                    }
                    None => {
                        // The token's instance was there: read after the commit.
                        look_up.push(i);
                        Ok(Written::Done)
                    }
                },
                Write::LandInstance { id } => match landed[*run].remove(id.as_str()) {
                    Some((record, moved)) => {
                        if moved {
                            self.book
                                .instance_moved(Some(InstanceState::Pending.as_str()), InstanceState::Running.as_str());
                        }
                        Ok(Written::Landed(Some(record)))
                    }
                    None => Ok(Written::Landed(None)),
                },
                Write::MachineStatus { id, .. }
                | Write::InstanceStatus { id, .. }
                | Write::StartedInstance { id, .. } => {
                    match (before[*run].remove(id.as_str()), updated[*run].contains(id.as_str())) {
                        (Some((was, life, instance_status)), true) => {
                            let was_error = (was.as_str(), instance_status.as_str());
                            match w {
                                Write::MachineStatus { status, .. } => {
                                    self.book.count_error_of(was_error, Some(status.as_str()), None);
                                    self.book.count_machine(Some((was, life)), Some(status.as_str()), None)
                                }
                                Write::InstanceStatus { status, .. } => {
                                    self.book.count_error_of(was_error, None, Some(status.as_str()))
                                }
                                Write::StartedInstance { info, .. } => {
                                    let started = MachineStatus::Started.as_str();
                                    self.book.count_error_of(was_error, Some(started), Some(info.status.as_str()));
                                    self.book.count_machine(Some((was, life)), Some(started), None)
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
            let Write::NewInstance { client_token, .. } = &writes[i] else { continue };
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
    pub(super) fn run_alone(&mut self, writes: &[Write], fenced_out: Option<&StoreError>) -> Result<(), StoreError> {
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
}
