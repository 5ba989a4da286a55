//! Who calls: the bearer token of a request proven once ([`Caller`], kept in the request's
//! extensions), and the extractors a handler takes to require it: [`Authorized`] (any valid
//! token whose scope allows the method, and whose model, for a model-scoped token, is the one
//! the path names) and [`AdminOnly`] (an admin token for every model: token management). Also
//! `note`, what a change request's handler leaves for its audit line.

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest};
use futures::TryFutureExt;

use super::errors::{ApiError, Result};
use super::target::{target_model, Host};
use crate::service::audit::AuditNote;
use crate::service::host::Shared;
use crate::service::token::{self, Scope};

/// Who made a request: the id and scope of the token it carried. Kept in the request's
/// extensions once proven (the audit log names the id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    /// `admin` (the data directory's token) or `tok-N` (a created one).
    pub id: String,
    /// What it may do.
    pub scope: Scope,
    /// The one model it may use (`None`: every model, and the service's own routes).
    pub model: Option<String>,
    /// That model's uuid when the token was made: valid for that model only.
    pub model_uuid: Option<String>,
}

impl Caller {
    /// Whether this caller may manage the service (models, tokens): an admin token for every
    /// model. `Err` is the 403's sentence.
    pub(crate) fn service_admin(&self, what: &str) -> Result<()> {
        match (&self.model, self.scope) {
            (None, Scope::Admin) => Ok(()),
            (Some(m), _) => Err(ApiError::new(
                403,
                format!("{what} needs an admin token for every model; {} is scoped to model {m:?}", self.id),
            )),
            (None, scope) => Err(ApiError::new(403, format!("{what} needs an admin token; {} is {scope}", self.id))),
        }
    }
}

/// Proof that the request carried a valid API token (`Authorization: Bearer TOKEN`) whose
/// scope allows its method: a read-only token's change is refused here (403), for every route
/// that takes this extractor, so a new route cannot forget the check.
pub(crate) struct Authorized(pub Caller);

/// Proof that the request carried an admin token (token management).
pub(crate) struct AdminOnly;

/// The admin token's hash as this replica knows it (none: no admin token here).
fn admin_hash(state: &Shared) -> Option<String> {
    match &state.token_sha256 {
        Some(hash) => Some(hash.clone()),
        None if !state.token.is_empty() => Some(token::sha256_hex(&state.token)),
        None => None,
    }
}

/// Who holds `given`: the admin token (compared by hash in constant time, no store access), or
/// a created token looked up by its hash in the store on every request, so that a revocation
/// through any replica refuses the token's next request everywhere (one indexed read).
async fn authenticate(state: &Shared, given: &str) -> Result<Caller> {
    let hash = token::sha256_hex(given);
    if admin_hash(state).is_some_and(|admin| token::hashes_equal(&hash, &admin)) {
        return Ok(Caller { id: token::ADMIN_ID.to_owned(), scope: Scope::Admin, model: None, model_uuid: None });
    }
    let found = state.service_store.read(move |s| s.token_by_hash(&hash)).await?;
    match found {
        Some(t) if t.revoked.is_none() => {
            Ok(Caller { id: t.id, scope: t.scope, model: t.model, model_uuid: t.model_uuid })
        }
        Some(t) => Err(ApiError::new(401, format!("the API token {} was revoked", t.id))),
        None => Err(ApiError::new(401, "the API token is wrong")),
    }
}

/// The bearer token of a request, if it has one.
fn bearer(req: &HttpRequest) -> Option<String> {
    req.headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110 11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim().to_owned())
}

/// The request's caller: proven once per request (kept in its extensions), then its scope
/// checked against the method.
async fn check_token(req: HttpRequest) -> Result<Caller> {
    let known = req.extensions().get::<Caller>().cloned();
    let caller = match known {
        Some(c) => c,
        None => {
            let Some(host) = req.app_data::<Host>().cloned() else {
                return Err(ApiError::internal("the API has no state"));
            };
            let Some(given) = bearer(&req) else {
                return Err(ApiError::new(401, "an API token is required: send Authorization: Bearer TOKEN"));
            };
            let caller = authenticate(host.shared(), &given).await?;
            req.extensions_mut().insert(caller.clone());
            caller
        }
    };
    // The request's span (`routes`) names who asked, by the token's id, and for which model.
    let span = tracing::Span::current();
    span.record("token", caller.id.as_str());
    if let Some(model) = target_model(&req) {
        span.record("model", model);
    }
    caller.scope.may(req.method().as_str()).map_err(|why| ApiError::new(403, why))?;
    // A model-scoped token: its model's routes only (the service's own routes check it in
    // their handlers: a list shows its model alone, management is refused).
    if let Some(target) = target_model(&req) {
        token::may_use_model(caller.model.as_deref(), target).map_err(|why| ApiError::new(403, why))?;
        // Bound to the model it was made for, not to a later model of the same name.
        if let Some(uuid) = &caller.model_uuid {
            let Some(host) = req.app_data::<Host>() else {
                return Err(ApiError::internal("the API has no state"));
            };
            let now = host.directory().await.get(target).ok().and_then(|e| e.uuid.clone());
            if now.as_ref().is_some_and(|u| u != uuid) {
                return Err(ApiError::new(
                    401,
                    format!(
                        "the API token {} was made for an earlier model {target:?} (uuid {uuid}), which was destroyed",
                        caller.id
                    ),
                ));
            }
        }
    }
    Ok(caller)
}

impl FromRequest for Authorized {
    type Error = ApiError;
    type Future = futures::future::LocalBoxFuture<'static, Result<Self, ApiError>>;
    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        Box::pin(check_token(req.clone()).map_ok(Authorized))
    }
}

impl FromRequest for AdminOnly {
    type Error = ApiError;
    type Future = futures::future::LocalBoxFuture<'static, Result<Self, ApiError>>;
    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            let caller = check_token(req).await?;
            caller.service_admin("managing API tokens")?;
            Ok(AdminOnly)
        })
    }
}

/// Leaves a short summary of what a change request did (or asked for) for the audit log.
pub(crate) fn note(req: &HttpRequest, what: impl Into<String>) {
    req.extensions_mut().insert(AuditNote::new(what));
}
