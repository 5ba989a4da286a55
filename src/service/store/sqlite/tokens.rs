//! The created API tokens in SQLite (schema version 4, table `api_tokens`): id, scope, the
//! token's SHA-256 (never the token), created and revoked times, and (version 6) the model a
//! token is scoped to (`NULL`: every model). The PostgreSQL backend keeps
//! the same rows (`postgres/schema.rs`, migration 4). The times are given by the caller (RFC 3339, UTC).

use rusqlite::{params, OptionalExtension, Row};

use super::rows::{next_counter, select_all, Atomic};
use super::StoreCore;
use crate::service::store::errors::StoreError;
use crate::service::store::records::{token_record, TokenRow};
use crate::service::token::{token_id, Scope, TokenRecord};

const COLUMNS: &str = "id, scope, created, revoked, model, model_uuid";

fn record(r: &Row<'_>) -> rusqlite::Result<TokenRow> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
}

/// Creates a token: the next id (`tok-1`, `tok-2`, ...; never reused), its scope, the
/// model it is scoped to (`None`: every model), its hash, created at `created`.
pub(super) fn create_token(
    core: &mut StoreCore,
    scope: Scope,
    model: Option<(&str, &str)>,
    sha256: &str,
    created: &str,
) -> Result<TokenRecord, StoreError> {
    let (name, uuid) = (model.map(|m| m.0), model.map(|m| m.1));
    let ctx = "creating an API token";
    let tx = Atomic::begin(&core.conn).map_err(StoreError::sql(ctx))?;
    let id = token_id(next_counter(&tx, "next_token").map_err(StoreError::sql(ctx))? + 1);
    tx.execute(
        "INSERT INTO api_tokens (id, scope, sha256, created, model, model_uuid) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![id, scope.as_str(), sha256, created, name, uuid],
    )
    .map_err(StoreError::sql(ctx))?;
    tx.commit().map_err(StoreError::sql(ctx))?;
    Ok(TokenRecord::created(id, scope, created, model))
}

/// Revokes at `at` every token scoped to model `name` of uuid `uuid` (and those scoped to
/// `name` made before uuids were kept): the model was destroyed. The tokens revoked now.
pub(super) fn revoke_model_tokens(
    core: &mut StoreCore,
    name: &str,
    uuid: &str,
    at: &str,
) -> Result<Vec<TokenRecord>, StoreError> {
    let ctx = "revoking a destroyed model's API tokens";
    let tx = Atomic::begin(&core.conn).map_err(StoreError::sql(ctx))?;
    let rows: Vec<TokenRow> = {
        let mut st = tx
            .prepare(&format!(
                "UPDATE api_tokens SET revoked = ?3 WHERE revoked IS NULL \
                 AND (model_uuid = ?2 OR (model_uuid IS NULL AND model = ?1)) RETURNING {COLUMNS}"
            ))
            .map_err(StoreError::sql(ctx))?;
        let rows = st.query_map(params![name, uuid, at], record).map_err(StoreError::sql(ctx))?;
        rows.collect::<Result<_, _>>().map_err(StoreError::sql(ctx))?
    };
    tx.commit().map_err(StoreError::sql(ctx))?;
    let mut tokens = rows.into_iter().map(token_record).collect::<Result<Vec<_>, _>>()?;
    tokens.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(tokens)
}

/// Every created token, oldest first.
pub(super) fn tokens(core: &StoreCore) -> Result<Vec<TokenRecord>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM api_tokens ORDER BY seq");
    select_all(&core.conn, &sql, record, "listing API tokens")?.into_iter().map(token_record).collect()
}

/// The created token whose hash this is, revoked or not.
pub(super) fn token_by_hash(core: &StoreCore, sha256: &str) -> Result<Option<TokenRecord>, StoreError> {
    let ctx = "looking up an API token";
    let mut stmt = core
        .conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM api_tokens WHERE sha256 = ?1"))
        .map_err(StoreError::sql(ctx))?;
    let row = stmt.query_row([sha256], record).optional().map_err(StoreError::sql(ctx))?;
    row.map(token_record).transpose()
}

/// Revokes a token at `at`; one revoked already keeps its first time (revoking twice is
/// no error). [`StoreError::NoToken`] if no created token has this id.
pub(super) fn revoke_token(core: &mut StoreCore, id: &str, at: &str) -> Result<TokenRecord, StoreError> {
    let ctx = "revoking an API token";
    let tx = Atomic::begin(&core.conn).map_err(StoreError::sql(ctx))?;
    tx.execute("UPDATE api_tokens SET revoked = ?2 WHERE id = ?1 AND revoked IS NULL", params![id, at])
        .map_err(StoreError::sql(ctx))?;
    let row = tx
        .query_row(&format!("SELECT {COLUMNS} FROM api_tokens WHERE id = ?1"), [id], record)
        .optional()
        .map_err(StoreError::sql(ctx))?;
    tx.commit().map_err(StoreError::sql(ctx))?;
    token_record(row.ok_or_else(|| StoreError::NoToken(id.to_owned()))?)
}
