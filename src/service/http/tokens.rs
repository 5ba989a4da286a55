//! `/v1/tokens`: API token management, admin tokens only (a read-only token gets 403, even to
//! list them).
//!
//! - `POST /v1/tokens` (`{"read_only": bool}`): a new token (32 random bytes, hex), answered
//!   once with its id and scope; the store keeps its SHA-256 only.
//! - `GET /v1/tokens`: every created token's id, scope, created and revoked times; never a
//!   token or a hash.
//! - `DELETE /v1/tokens/{id}`: revokes it (200 with its record). The next request carrying it
//!   gets 401, on every replica (tokens are looked up in the store per request), and its event
//!   streams end with a last `token-revoked` event (here at once, elsewhere within a second:
//!   [`crate::service::events::StreamGate`]). Revoking a
//!   revoked token again is no error (200, its first revocation time kept); an unknown id is
//!   404 naming it; the admin token (`admin`, the data directory's file) is 409: it cannot be
//!   revoked through the API (replace it by stopping the service, deleting `DATA_DIR/token`
//!   and starting it again, which writes a new one; with PostgreSQL it is the database's).

use actix_web::{web, HttpRequest, HttpResponse};

use super::auth::{note, AdminOnly};
use super::body::json_body;
use super::errors::{ApiError, Result};
use super::target::Host;
use super::wire::{CreateToken, CreatedToken, ErrorBody, TokenScope, TokenView};
use crate::service::audit::now_rfc3339;
use crate::service::token::{self, Scope, TokenRecord};

impl From<Scope> for TokenScope {
    fn from(s: Scope) -> Self {
        match s {
            Scope::Admin => TokenScope::Admin,
            Scope::ReadOnly => TokenScope::ReadOnly,
        }
    }
}

fn view(t: TokenRecord) -> TokenView {
    TokenView { id: t.id, scope: t.scope.into(), created: t.created, revoked: t.revoked, model: t.model }
}

/// Creates an API token (admin tokens only): answered once, only its hash kept.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", operation_id = "create_token",
    request_body = CreateToken,
    responses(
        (status = 201, description = "The new token, shown once (only its hash is kept)", body = CreatedToken),
        (status = 400, description = "A body that does not parse", body = ErrorBody),
        (status = 403, description = "The token is read-only or scoped to a model: only the service's admin tokens \
            manage tokens", body = ErrorBody),
        (status = 404, description = "`model` names no model of the service", body = ErrorBody),
    ))]
pub(crate) async fn create_token(
    _: AdminOnly,
    host: Host,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse> {
    let CreateToken { read_only, model } = json_body(&req, payload).await?;
    let scope = if read_only { Scope::ReadOnly } else { Scope::Admin };
    // Only a model the service hosts (404 naming it otherwise), bound by its uuid: the token is
    // valid for this model, not for a later one of the same name.
    let bound = match &model {
        Some(m) => {
            let entry = host.directory().await.get(m).map_err(crate::service::host::HostError::from)?.clone();
            let uuid = match entry.uuid {
                Some(u) => u,
                None => host.state(m).await?.model_uuid.clone(),
            };
            Some((m.clone(), uuid))
        }
        None => None,
    };
    let secret = token::new_secret();
    let hash = token::sha256_hex(&secret);
    let created = now_rfc3339();
    let record = host
        .shared()
        .service_store
        .exec(move |s| s.create_token(scope, bound.as_ref().map(|(n, u)| (n.as_str(), u.as_str())), &hash, &created))
        .await?;
    let only = model.as_ref().map(|m| format!(", model {m} only")).unwrap_or_default();
    note(&req, format!("created {} ({scope}{only})", record.id));
    Ok(HttpResponse::Created().json(CreatedToken { id: record.id, scope: scope.into(), token: secret, model }))
}

/// Lists the created API tokens (admin tokens only): never a token or a hash.
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", operation_id = "list_tokens",
    responses(
        (status = 200, description = "Every created token, oldest first: ids, scopes, times (never a token or \
            its hash; the admin token of the data directory is not listed)", body = Vec<TokenView>),
        (status = 403, description = "The token is read-only: only admin tokens manage tokens", body = ErrorBody),
    ))]
pub(crate) async fn list_tokens(_: AdminOnly, host: Host) -> Result<HttpResponse> {
    let tokens = host.shared().service_store.read(|s| s.tokens()).await?;
    Ok(HttpResponse::Ok().json(tokens.into_iter().map(view).collect::<Vec<_>>()))
}

/// Revokes an API token (admin tokens only): its next request gets 401, on every replica.
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens", operation_id = "revoke_token",
    params(("id" = String, Path, description = "The token's id (`tok-N`)")),
    responses(
        (status = 200, description = "Revoked (again: no error, the first time kept): its next request gets 401 \
            on every replica", body = TokenView),
        (status = 403, description = "The token is read-only: only admin tokens manage tokens", body = ErrorBody),
        (status = 404, description = "No created token has this id", body = ErrorBody),
        (status = 409, description = "The admin token (`admin`, the data directory's) cannot be revoked through \
            the API", body = ErrorBody),
    ))]
pub(crate) async fn revoke_token(
    _: AdminOnly,
    host: Host,
    id: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse> {
    let id = id.into_inner();
    note(&req, format!("revoke {id}"));
    if id == token::ADMIN_ID {
        return Err(ApiError::new(
            409,
            "the admin token cannot be revoked through the API: to replace it, stop the service, delete the token \
             file in its data directory and start it again (a new one is written)",
        ));
    }
    let at = now_rfc3339();
    let record = host.shared().service_store.exec(move |s| s.revoke_token(&id, &at)).await?;
    // Its event streams here end now (other replicas' within their next check of the tokens).
    host.shared().streams.do_send(crate::service::events::Revoked(record.id.clone()));
    Ok(HttpResponse::Ok().json(view(record)))
}
