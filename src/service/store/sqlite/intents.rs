//! Start intents in SQLite (schema version 5, table `start_intents`): a start's client token,
//! its machine and its parameters (JSON), written before the cloud call and dropped once the
//! start is settled (`service::cloud::intents`). The PostgreSQL backend keeps the same rows
//! (`postgres/schema.rs`, migration 5).

use rusqlite::params;

use super::rows::text_column;
use super::StoreCore;
use crate::model::MachineId;
use crate::service::store::errors::StoreError;

/// Writes a start's intent (a token written again keeps its first row).
pub(super) fn put_start_intent(
    core: &mut StoreCore,
    client_token: &str,
    machine: &MachineId,
    params: &str,
) -> Result<(), StoreError> {
    let ctx = "writing a start's intent";
    core.conn
        .prepare_cached("INSERT INTO start_intents (client_token, machine, params) VALUES (?1, ?2, ?3) ON CONFLICT (client_token) DO NOTHING")
        .and_then(|mut st| st.execute(params![client_token, machine.as_str(), params]))
        .map_err(StoreError::sql(ctx))?;
    Ok(())
}

/// Drops a settled start's intent.
pub(super) fn drop_start_intent(core: &mut StoreCore, client_token: &str) -> Result<(), StoreError> {
    let ctx = "dropping a start's intent";
    core.conn
        .prepare_cached("DELETE FROM start_intents WHERE client_token = ?1")
        .and_then(|mut st| st.execute([client_token]))
        .map_err(StoreError::sql(ctx))?;
    Ok(())
}

/// Every intent not settled, oldest first.
pub(super) fn start_intents(core: &StoreCore) -> Result<Vec<String>, StoreError> {
    text_column(&core.conn, "SELECT params FROM start_intents ORDER BY seq", "reading the start intents")
}
