//! The simulated cloud's instances in SQLite (table `instances`): created once per client token,
//! landed, listed, terminated, released and retagged.

use std::collections::BTreeSet;

use rusqlite::{params, OptionalExtension};

use super::rows::{instance_from_row, next_counter, text_column, Atomic, INSTANCE_COLUMNS};
use super::StoreCore;
use crate::model::{CloudInstance, InstanceId, InstanceState, InstanceTags, MachineId};
use crate::service::store::errors::StoreError;
use crate::service::store::records::InstanceRecord;

/// Creates an instance in `state` (pending, or running), or returns the one this client
/// token already made.
pub(super) fn create_instance_in(
    core: &mut StoreCore,
    client_token: &str,
    zone: Option<&str>,
    tags: &InstanceTags,
    state: InstanceState,
) -> Result<(InstanceRecord, bool), StoreError> {
    let tx = Atomic::begin(&core.conn).map_err(StoreError::sql("creating an instance"))?;
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
    core.book.instance_moved(None, state.as_str());
    Ok((InstanceRecord::created(id, state, zone, tags, client_token), true))
}

/// One instance.
pub(super) fn instance(core: &StoreCore, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError> {
    core.conn
        .prepare_cached(&format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE id = ?1"))
        .and_then(|mut s| s.query_row([id.as_str()], instance_from_row).optional())
        .map_err(StoreError::sql("reading an instance"))
}

/// A pending instance comes up: it becomes running (any other state is kept). Returns it.
pub(super) fn land_instance(core: &mut StoreCore, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError> {
    let n = core
        .conn
        .prepare_cached("UPDATE instances SET state = 'running' WHERE id = ?1 AND state = 'pending'")
        .and_then(|mut st| st.execute([id.as_str()]))
        .map_err(StoreError::sql("landing an instance"))?;
    if n > 0 {
        core.book.instance_moved(Some(InstanceState::Pending.as_str()), InstanceState::Running.as_str());
    }
    instance(core, id)
}

/// Every instance ever created, terminated ones included, in creation order.
#[cfg(test)]
pub(super) fn all_instances(core: &StoreCore) -> Result<Vec<InstanceRecord>, StoreError> {
    let sql = format!("SELECT {INSTANCE_COLUMNS} FROM instances ORDER BY seq");
    super::rows::select_all(&core.conn, &sql, instance_from_row, "listing instances")
}

/// The non-terminated instances tagged with this model.
pub(super) fn live_instances(core: &StoreCore, model: &str) -> Result<Vec<CloudInstance>, StoreError> {
    let mut stmt = core
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
pub(super) fn terminate_instances(core: &mut StoreCore, ids: &[InstanceId]) -> Result<(), StoreError> {
    let tx = Atomic::begin(&core.conn).map_err(StoreError::sql("terminating instances"))?;
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
        core.book.instance_moved(Some(&state), InstanceState::Terminated.as_str());
    }
    Ok(())
}

/// Removes our model's tag from instances left alone on purpose.
pub(super) fn release_instances(core: &mut StoreCore, ids: &[InstanceId]) -> Result<(), StoreError> {
    let tx = Atomic::begin(&core.conn).map_err(StoreError::sql("releasing instances"))?;
    for id in ids {
        tx.execute("UPDATE instances SET model = NULL WHERE id = ?1", [id.as_str()])
            .map_err(StoreError::sql("releasing instances"))?;
    }
    tx.commit().map_err(StoreError::sql("releasing instances"))
}

/// Gives a live instance new identity tags; `false` if it is not there or terminated.
pub(super) fn retag_instance(core: &mut StoreCore, id: &InstanceId, tags: &InstanceTags) -> Result<bool, StoreError> {
    let n = core
        .conn
        .execute(
            "UPDATE instances SET model = ?2, machine = ?3, start = ?4 WHERE id = ?1 AND state != 'terminated'",
            params![id.as_str(), tags.model, tags.machine.as_ref().map(MachineId::as_str), tags.start],
        )
        .map_err(StoreError::sql("retagging an instance"))?;
    Ok(n > 0)
}

/// The ids of instances still pending (their start's landing was lost with a crash).
pub(super) fn pending_instances(core: &StoreCore) -> Result<Vec<InstanceId>, StoreError> {
    let sql = "SELECT id FROM instances WHERE state = 'pending' ORDER BY seq";
    text_column(&core.conn, sql, "listing pending instances")
}
