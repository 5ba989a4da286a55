//! The HTTP API: `/healthz`, `/metrics`, and JSON under `/v1` behind a bearer token.
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `GET /healthz` | | `ok` (no token needed) |
//! | `GET /readyz` | | `ready` when this replica can serve (its store reachable), else 503 (no token needed) |
//! | `GET /metrics` | | OpenMetrics text (no token needed) |
//! | `GET /v1/machines?application=&status=&zone=&after=&limit=` | | `[MachineView]` |
//! | `POST /v1/machines` | `AddMachines` (`count`, `zones`, `constraints`, `placement`; or `container` and `host`; or `manual` and `address`) | `201 AddedMachines` |
//! | `GET /v1/machines/{id}` | | `MachineDetail` (`{id}` may hold `/`: `3/lxd/0`) |
//! | `GET /v1/applications` | | `[ApplicationView]` |
//! | `POST /v1/applications` | `AddApplication` | `201 ApplicationView` |
//! | `DELETE /v1/applications/{name}` | | `ApplicationView` (the machines taken to dead) |
//! | `POST /v1/machines/remove` | `RemoveMachines` (`force` also takes a host's live containers) | `204` |
//! | `POST /v1/machines/retry` | `RetryMachines` | `204` |
//! | `GET /v1/instances` | | `[InstanceView]` |
//! | `GET /v1/config` | | `[ConfigValue]` |
//! | `GET /v1/config/{key}` | | `ConfigValue` |
//! | `PUT /v1/config/{key}` | `ConfigValue` (`value`) | `ConfigValue` |
//! | `GET /v1/status` | | `StatusView` |
//! | `POST /v1/destroy-model` | `DestroyRequest` | `DestroyView` (409 naming live manual machines unless `force`) |
//! | `GET /v1/events` | | `text/event-stream` of `EventView`s |
//! | `GET /v1/openapi.json` | | this table as an OpenAPI 3.1 document ([`openapi`]; no token needed) |
//! | `POST /v1/tokens` | `CreateToken` (`read_only`) | `201 CreatedToken` (the token, shown once; admin tokens only) |
//! | `GET /v1/tokens` | | `[TokenView]` (never a token or a hash; admin tokens only) |
//! | `DELETE /v1/tokens/{id}` | | `TokenView` (404 unknown id, 409 `admin`; admin tokens only) |
//! | `GET /` (and `/dashboard/...`) | | the dashboard ([`crate::service::dashboard`]; no token needed, not in the OpenAPI document) |
//!
//! Tokens ([`crate::service::token`]): the [`Authorized`] extractor proves the bearer token
//! (the admin token by hash in memory, a created one looked up in the store on every request)
//! and refuses a read-only token's change (any method but `GET`/`HEAD`) with 403. Every change
//! request writes one audit line ([`crate::service::audit`]) from [`app`]'s `wrap_fn`.
//!
//! Errors are `{"error": "one sentence"}` with 400 (bad input: a body that does not parse, an
//! unknown field, a wrong type, a value out of range), 401 (no, wrong or revoked token), 403 (a
//! read-only token's change, or its token management), 404 (no such
//! machine or route), 405 (a method the route does not take; `Allow` lists those it does), 409
//! (the model's state refuses it), 413 (a body over [`BODY_LIMIT`]), 429 (`/v1/events`: a cap
//! on event streams reached, named with its config key), 500, or 503 (`/healthz`,
//! `/readyz`: the store cannot be read; any request: the database cannot be reached, so no
//! answer is given rather than a stale one). A refused request writes nothing.

pub mod add;
pub mod model;
pub mod models;
pub mod openapi;
pub mod reference;
pub mod tokens;
pub mod types;

use std::collections::BTreeMap;

use actix_web::HttpMessage;
use futures::TryFutureExt;

use actix_rt::time::Instant;
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse};
use actix_web::http::header::{ALLOW, CONTENT_LENGTH};
use actix_web::http::{Method, StatusCode};
use actix_web::{web, App, FromRequest, HttpRequest, HttpResponse, ResponseError};

use crate::config::{validate_workers, MAX_WORKERS};
use crate::model::{HarvestMode, MachineId};
use crate::service::audit::{list_summary, AuditLine, AuditNote};
use crate::service::host::{HostError, ModelHost, Shared, DEFAULT_MODEL};
use crate::service::metrics::{Gauges, HttpDone, Render};
use crate::service::runtime::{ModelRuntime, NotRunning};
use crate::service::store::{MachineRecord, Store, StoreError};
use crate::service::token::{self, Scope};
use crate::DestroyError;
use openapi::ConfigKey;
use types::{
    AddMachines, AddedMachines, ConfigValue, DestroyRequest, DestroyView, ErrorBody, InstanceView, MachineView,
    RemoveMachines, RetryMachines, StatusView,
};

/// The most machines one `POST /v1/machines` may add.
pub const MAX_ADD: usize = 10_000;
/// The most machine ids one removal or retry may name.
pub const MAX_IDS: usize = 10_000;
/// The largest request body, in bytes (larger: 413). 10,000 machine ids fit comfortably.
pub const BODY_LIMIT: usize = 256 << 10;

/// An API error: a status and one sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    status: u16,
    message: String,
    /// The methods the route takes (a 405's `Allow`).
    allow: Option<&'static str>,
}

impl ApiError {
    fn new(status: u16, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), allow: None }
    }
    fn too_large() -> Self {
        Self::new(413, format!("the request body is over the limit of {BODY_LIMIT} bytes"))
    }
    fn not_allowed(method: &Method, allow: &'static str) -> Self {
        Self { allow: Some(allow), ..Self::new(405, format!("method {method} is not allowed here: use {allow}")) }
    }
    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }
    fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.status_code());
        if let Some(allow) = self.allow {
            res.insert_header((ALLOW, allow));
        }
        res.json(ErrorBody { error: self.message.clone() })
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let status = match &e {
            StoreError::NotFound(_) | StoreError::NoApplication(_) | StoreError::NoToken(_) => 404,
            StoreError::ModelDying | StoreError::Refused(_) => 409,
            StoreError::Invalid { .. } => 400,
            // The database cannot be reached: no answer rather than a stale one.
            StoreError::Unavailable(_) => 503,
            StoreError::Postgres { source, .. } if source.connection_lost || source.timed_out() => 503,
            _ => 500,
        };
        Self::new(status, e.to_string())
    }
}

impl From<NotRunning> for ApiError {
    fn from(e: NotRunning) -> Self {
        match e {
            NotRunning::Follower { .. } => ApiError::new(503, e.to_string()),
            NotRunning::Internal(message) => ApiError::internal(message),
        }
    }
}

impl From<crate::ProvisionerError> for ApiError {
    fn from(e: crate::ProvisionerError) -> Self {
        match e {
            crate::ProvisionerError::Config(c) => Self::bad_request(c.to_string()),
            other => Self::internal(other.to_string()),
        }
    }
}

/// Who made a request: the id and scope of the token it carried. Kept in the request's
/// extensions once proven (the audit log names the id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
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
pub struct Authorized(pub Caller);

/// Proof that the request carried an admin token (token management).
pub struct AdminOnly(pub Caller);

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
            Ok(AdminOnly(caller))
        })
    }
}

/// Leaves a short summary of what a change request did (or asked for) for the audit log.
pub(crate) fn note(req: &HttpRequest, what: impl Into<String>) {
    req.extensions_mut().insert(AuditNote::new(what));
}

type Result<T, E = ApiError> = std::result::Result<T, E>;
/// The model a request is about: `{model}` of `/v1/models/{model}/...`, else `default`.
type State = ModelState;
/// The service's models.
type Host = web::Data<ModelHost>;

/// The state of the model a request names (`/v1/models/{model}/...`; the plain routes mean
/// `default`): 404 naming an unknown model, 503 for one that does not run.
pub struct ModelState(pub ModelRuntime);

impl std::ops::Deref for ModelState {
    type Target = ModelRuntime;
    fn deref(&self) -> &ModelRuntime {
        &self.0
    }
}

impl From<HostError> for ApiError {
    fn from(e: HostError) -> Self {
        Self::new(e.status(), e.to_string())
    }
}

/// A path's `{key}` (taken by name: per-model paths also hold `{model}`).
#[derive(serde::Deserialize)]
pub(crate) struct KeyPath {
    key: String,
}

/// A path's `{name}` (taken by name: per-model paths also hold `{model}`).
#[derive(serde::Deserialize)]
pub struct NamePath {
    /// The name.
    pub name: String,
}

/// The model a request is about, for a model-scoped token's check: `{model}` in its path, else
/// `default` for a per-model route; `None` for the service's own routes (`/v1/models`,
/// `/v1/tokens`).
fn target_model(req: &HttpRequest) -> Option<&str> {
    match req.match_info().get("model") {
        Some(m) => Some(m),
        None if ["/v1/models", "/v1/tokens"]
            .iter()
            .any(|p| req.path() == *p || req.path().starts_with(&format!("{p}/"))) =>
        {
            None
        }
        None => Some(DEFAULT_MODEL),
    }
}

/// The model a request names: `{model}` in its path, else `default`.
pub(crate) fn model_of(req: &HttpRequest) -> &str {
    req.match_info().get("model").unwrap_or(DEFAULT_MODEL)
}

impl FromRequest for ModelState {
    type Error = ApiError;
    type Future = futures::future::LocalBoxFuture<'static, Result<Self, ApiError>>;
    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        let host = req.app_data::<Host>().cloned();
        let name = model_of(req).to_owned();
        Box::pin(async move {
            match host {
                Some(host) => host.state(&name).await.map(ModelState).map_err(ApiError::from),
                None => Err(ApiError::internal("the API has no models")),
            }
        })
    }
}

fn view(m: &MachineRecord) -> MachineView {
    MachineView {
        id: m.machine.id.to_string(),
        life: m.machine.life.to_string(),
        status: m.machine.status.to_string(),
        instance: m.machine.instance.as_ref().map(ToString::to_string),
        zone: m.zone.clone(),
        instance_status: m.machine.instance_status.to_string(),
        message: m.message().to_owned(),
        container_type: m.machine.id.container_of().map(|(_, kind)| kind.to_owned()),
        host: m.machine.id.container_of().map(|(host, _)| host.to_string()),
        manual: m.machine.manual,
    }
}

/// Machine ids as text.
fn names(ids: &[MachineId]) -> Vec<String> {
    ids.iter().map(ToString::to_string).collect()
}

/// The machine ids of a request, each once (in the order first given), at most [`MAX_IDS`].
fn ids(raw: &[String]) -> Result<Vec<MachineId>> {
    if raw.is_empty() {
        return Err(ApiError::bad_request("no machine ids given"));
    }
    if raw.len() > MAX_IDS {
        return Err(ApiError::bad_request(format!("at most {MAX_IDS} machine ids per request, got {}", raw.len())));
    }
    let mut seen = std::collections::BTreeSet::new();
    Ok(raw.iter().map(|s| s.trim()).filter(|s| seen.insert(*s)).map(MachineId::new).collect())
}

/// Reads a request body of at most [`BODY_LIMIT`] bytes (413 past it, before reading it all
/// when the length is announced).
async fn read_body(req: &HttpRequest, mut payload: web::Payload) -> Result<web::Bytes> {
    use futures::StreamExt;
    let announced = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > BODY_LIMIT as u64) {
        return Err(ApiError::too_large());
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| match e {
            actix_web::error::PayloadError::Overflow => ApiError::too_large(),
            other => ApiError::bad_request(format!("cannot read the request body: {other}")),
        })?;
        if body.len() + chunk.len() > BODY_LIMIT {
            return Err(ApiError::too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// The key of the JSON object member whose value starts before byte `offset` (flat bodies:
/// the last `"key":` before it), to name the field a type error is about.
fn key_before(body: &[u8], offset: usize) -> Option<String> {
    let text = std::str::from_utf8(&body[..offset.min(body.len())]).ok()?;
    let colon = text.rfind(':')?;
    let key = text[..colon].trim_end().strip_suffix('"')?;
    let start = key.rfind('"')?;
    Some(key[start + 1..].to_owned())
}

/// Parses a body strictly (unknown fields and wrong types are refused, naming the field).
/// An empty body means `empty`, if the request has defaults; otherwise it is refused.
fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8], empty: Option<T>) -> Result<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return empty.ok_or_else(|| ApiError::bad_request("a JSON body is required"));
    }
    // Every body is an object: serde would also read a struct from an array of its fields
    // (`[]` taking every default), which no client means.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request("invalid JSON body: expected a JSON object ({...})"));
    }
    serde_json::from_slice(body).map_err(|e| {
        let mut message = e.to_string();
        if e.classify() == serde_json::error::Category::Data && !message.contains("field") {
            let offset =
                body.split(|b| *b == b'\n').take(e.line().saturating_sub(1)).map(|l| l.len() + 1).sum::<usize>()
                    + e.column();
            if let Some(key) = key_before(body, offset) {
                message = format!("field {key:?}: {message}");
            }
        }
        ApiError::bad_request(format!("invalid JSON body: {message}"))
    })
}

/// Reads and parses a body that must be given.
async fn json_body<T: serde::de::DeserializeOwned>(req: &HttpRequest, payload: web::Payload) -> Result<T> {
    parse_body(&read_body(req, payload).await?, None)
}

/// 200 `ok` while the store can be read; 503 otherwise, saying whether the database is
/// unreachable or answered an error (the reason is in the service's log).
#[utoipa::path(get, path = "/healthz", tag = "service", operation_id = "healthz",
    responses(
        (status = 200, description = "The store can be read", content_type = "text/plain", body = String, example = "ok\n"),
        (status = 503, description = "The store cannot be read (unreachable, or it answered an error: the reason is in the service's log)", content_type = "text/plain", body = String),
    ))]
/// The service's, not a model's: it answers while any model runs or none (`default` destroyed).
async fn healthz(host: Host) -> HttpResponse {
    match host.shared().service_store.exec_lazy(|s| s.check_readable()).await {
        Ok(()) => HttpResponse::Ok().content_type("text/plain").body("ok\n"),
        Err(e) => HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body(unready("the database cannot be read", &e)),
    }
}

/// What an unauthenticated probe is told when the store cannot be read: `what`, and whether the
/// database is unreachable or answered an error, never the error's text (host names, the
/// client's or the server's messages): that goes to the log, at debug for an unreachable
/// database (the store logs its connection failures itself at warn), at warn otherwise.
fn unready(what: &str, e: &StoreError) -> String {
    match e {
        StoreError::Unavailable(_) => {
            tracing::debug!(error = %e, "{what}");
            format!("{what}: the database is unreachable (the reason is in the service's log)\n")
        }
        _ => {
            tracing::warn!(error = %e, "{what}");
            format!("{what}: the store answered an error (the reason is in the service's log)\n")
        }
    }
}

/// `/readyz`: 200 `ready` when this replica can serve (its store is reachable and readable),
/// 503 otherwise, saying whether the database is unreachable or answered an error (the reason
/// is in the service's log).
#[utoipa::path(get, path = "/readyz", tag = "service", operation_id = "readyz",
    responses(
        (status = 200, description = "This replica can serve: its store is reachable", content_type = "text/plain", body = String, example = "ready\n"),
        (status = 503, description = "Not ready: the store is unreachable or unreadable (which of the two; the reason is in the service's log)", content_type = "text/plain", body = String),
    ))]
async fn readyz(host: Host) -> HttpResponse {
    readiness(&host.shared().service_store).await
}

async fn readiness(store: &Store) -> HttpResponse {
    match store.exec_lazy(|s| s.check_readable()).await {
        Ok(()) => HttpResponse::Ok().content_type("text/plain").body("ready\n"),
        Err(e) => HttpResponse::ServiceUnavailable().content_type("text/plain").body(unready("not ready", &e)),
    }
}

/// While the service waits for its database at start (PostgreSQL not reachable yet), this
/// server answers on the listen address, over TLS when `tls` is given (`--tls-cert/--tls-key`,
/// as the real one): every path 503, `starting` or `not ready: waiting for the database`,
/// never the database's error text (it answers callers it cannot authenticate: the reason is
/// in the log). Stop it before binding the real one.
#[cfg(feature = "postgres")]
pub fn start_waiting_server(
    store: Store,
    listen: &str,
    tls: Option<rustls::ServerConfig>,
) -> std::io::Result<actix_web::dev::ServerHandle> {
    let server = actix_web::HttpServer::new(move || {
        let store = store.clone();
        App::new().default_service(web::to(move || {
            let store = store.clone();
            async move {
                match store.exec_lazy(|s| s.check_readable()).await {
                    Ok(()) => HttpResponse::ServiceUnavailable().content_type("text/plain").body("starting\n"),
                    Err(e) => HttpResponse::ServiceUnavailable()
                        .content_type("text/plain")
                        .body(unready("not ready: waiting for the database", &e)),
                }
            }
        }))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1);
    let server = match tls {
        Some(config) => server.bind_rustls_0_23(listen, config)?,
        None => server.bind(listen)?,
    }
    .run();
    let handle = server.handle();
    actix_rt::spawn(server);
    Ok(handle)
}

#[utoipa::path(post, path = "/v1/machines", tag = "machines", operation_id = "add_machines",
    request_body = AddMachines,
    responses(
        (status = 201, description = "The new machines' ids", body = AddedMachines),
        (status = 400, description = "A field is wrong (named), or names what the cloud or model lacks: a zone, a \
            subnet, a host that is not an alive top-level machine, an address already registered", body = ErrorBody),
        (status = 409, description = "The model is dying", body = ErrorBody),
    ))]
async fn add_machines(_: Authorized, st: State, req: HttpRequest, payload: web::Payload) -> Result<HttpResponse> {
    let body: AddMachines = json_body(&req, payload).await?;
    if body.count == 0 || body.count > MAX_ADD {
        return Err(ApiError::bad_request(format!("count must be between 1 and {MAX_ADD}, got {}", body.count)));
    }
    if body.is_container_or_manual() {
        return add_containers_or_manual(&st, &req, &body).await;
    }
    let AddMachines { count, zones, constraints, placement, .. } = body;
    // Constraints (zones among them) and placement, checked against the cloud.
    let cloud = model::CloudShape { zones: st.zones.clone(), subnets: st.subnets.clone() };
    let spec = model::new_machine(&cloud, zones, constraints, placement)?;
    let added = st.store.add_machines(count, spec).await?;
    st.metrics.do_send(crate::service::metrics::MachinesPending(added.clone()));
    let ids = names(&added);
    note(&req, format!("added {} machines: {}", ids.len(), list_summary(&ids)));
    Ok(HttpResponse::Created().json(AddedMachines { ids }))
}

/// `POST /v1/machines` with `container` and `host` (containers on a host), or with `manual`
/// and `address` (a manual machine): each field checked ([`add::container_or_manual`]), then
/// the store checks the host (exists, alive) or the address (not a live manual machine's yet)
/// in the transaction that adds. Every refusal is a 400 naming its field, nothing written.
async fn add_containers_or_manual(st: &ModelRuntime, req: &HttpRequest, body: &AddMachines) -> Result<HttpResponse> {
    let kinds = crate::containers::DEFAULT_CONTAINER_TYPES;
    let request = add::container_or_manual(body, kinds).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let added = match request {
        add::SpecialAdd::Containers { kind, host, count } => {
            if st.containers.is_none() {
                return Err(ApiError::bad_request(format!(
                    "field \"container\": this service's cloud ({}) runs no containers; use --broker sim",
                    st.broker_name
                )));
            }
            st.store.exec(move |s| s.add_containers(&host, &kind, count)).await?
        }
        add::SpecialAdd::Manual { address } => vec![st.store.exec(move |s| s.add_manual(&address)).await?],
    };
    let ids = names(&added);
    note(req, format!("added {} machines: {}", ids.len(), list_summary(&ids)));
    Ok(HttpResponse::Created().json(AddedMachines { ids }))
}

#[utoipa::path(post, path = "/v1/machines/remove", tag = "machines", operation_id = "remove_machines",
    request_body = RemoveMachines,
    responses(
        (status = 204, description = "The machines are dying (or dead): their instances are stopped, then they are removed"),
        (status = 400, description = "No ids, too many, or a body that does not parse", body = ErrorBody),
        (status = 404, description = "No such machine (nothing was changed)", body = ErrorBody),
        (status = 409, description = "The model's state refuses it (a host with live containers without `force`, \
            a manual machine's instance to keep, the model dying); nothing was changed", body = ErrorBody),
    ))]
async fn remove_machines(_: Authorized, st: State, req: HttpRequest, payload: web::Payload) -> Result<HttpResponse> {
    let RemoveMachines { ids: raw, keep_instance, force } = json_body(&req, payload).await?;
    let ids = ids(&raw)?;
    let flags =
        [(keep_instance, " keep-instance"), (force, " force")].iter().filter(|f| f.0).map(|f| f.1).collect::<String>();
    note(&req, format!("remove {} machines: {}{flags}", ids.len(), list_summary(&names(&ids))));
    st.store.exec(move |s| s.remove_machines(&ids, keep_instance, force)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(post, path = "/v1/machines/retry", tag = "machines", operation_id = "retry_machines",
    request_body = RetryMachines,
    responses(
        (status = 204, description = "The machines will be started again"),
        (status = 400, description = "No ids, too many, a container, or a body that does not parse", body = ErrorBody),
        (status = 404, description = "No such machine (nothing was changed)", body = ErrorBody),
        (status = 409, description = "A machine is not in provisioning error, or the model is dying; nothing was changed", body = ErrorBody),
    ))]
async fn retry_machines(_: Authorized, st: State, req: HttpRequest, payload: web::Payload) -> Result<HttpResponse> {
    let body: RetryMachines = json_body(&req, payload).await?;
    let ids = ids(&body.ids)?;
    note(&req, format!("retry {} machines: {}", ids.len(), list_summary(&names(&ids))));
    refuse_container_retries(&ids)?;
    st.store.exec(move |s| s.retry_machines(&ids)).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Containers have no retry path (Juju's container provisioner has no retry watcher): a retry
/// of one would be accepted and never happen, so it is refused (400 naming it).
fn refuse_container_retries(ids: &[MachineId]) -> Result<()> {
    match ids.iter().find(|id| id.is_container()) {
        Some(c) => Err(ApiError::bad_request(format!(
            "field \"ids\": machine {c} is a container, and containers have no retry-provisioning path (as in Juju): \
             remove it and add another"
        ))),
        None => Ok(()),
    }
}

#[utoipa::path(get, path = "/v1/instances", tag = "instances", operation_id = "list_instances",
    responses((status = 200, description = "The cloud's instances of this model; on a real cloud from a listing at \
        most 5 s old (its age in seconds in the `Age` header; a start, stop or release through the service makes the \
        next read list again): readers never drive the cloud's API", body = Vec<InstanceView>)))]
async fn list_instances(_: Authorized, st: State) -> Result<HttpResponse> {
    // From the listings the service made (at most `listing::MAX_AGE` old): no reader drives
    // the cloud's API; the listing's age in whole seconds is the answer's `Age` header.
    let (list, age) = st
        .broker
        .read_instances(crate::service::listing::MAX_AGE)
        .await
        .map_err(|e| ApiError::internal(format!("listing the cloud: {e}")))?;
    let views: Vec<InstanceView> = list
        .iter()
        .map(|i| InstanceView {
            id: i.id.to_string(),
            state: i.state.to_string(),
            zone: i.zone.clone(),
            machine: i.tags.machine.as_ref().map(|m| m.to_string()),
        })
        .collect();
    Ok(HttpResponse::Ok().insert_header(("Age", age.as_secs().to_string())).json(views))
}

const CONFIG_KEYS: [&str; 2] = ["harvest-mode", "workers"];

async fn config_value(st: &ModelRuntime, key: &str) -> Result<ConfigValue> {
    let value = match key {
        "harvest-mode" => st.running().await?.handle.harvest_mode().await?.to_string(),
        "workers" => st.running().await?.handle.pool().await?.size.to_string(),
        other => {
            return Err(ApiError::new(
                404,
                format!("unknown config key {other:?}: expected one of {}", CONFIG_KEYS.join(", ")),
            ))
        }
    };
    Ok(ConfigValue { key: key.to_owned(), value })
}

#[utoipa::path(get, path = "/v1/config/{key}", tag = "config", operation_id = "get_config",
    params(("key" = ConfigKey, Path, description = "The setting")),
    responses(
        (status = 200, description = "The setting's value", body = ConfigValue),
        (status = 404, description = "No such setting", body = ErrorBody),
    ))]
async fn get_config(_: Authorized, st: State, key: web::Path<KeyPath>) -> Result<HttpResponse> {
    Ok(HttpResponse::Ok().json(config_value(&st, &key.key).await?))
}

#[utoipa::path(get, path = "/v1/config", tag = "config", operation_id = "list_config",
    responses((status = 200, description = "Every setting", body = Vec<ConfigValue>)))]
async fn list_config(_: Authorized, st: State) -> Result<HttpResponse> {
    let mut out = Vec::new();
    for key in CONFIG_KEYS {
        out.push(config_value(&st, key).await?);
    }
    Ok(HttpResponse::Ok().json(out))
}

#[utoipa::path(put, path = "/v1/config/{key}", tag = "config", operation_id = "set_config",
    params(("key" = ConfigKey, Path, description = "The setting")),
    request_body(content = ConfigValue, description = "`value`: a harvest mode (`none`, `unknown`, `destroyed`, \
        `all`) or a worker count (1..=100, digits only); `key`, if given, is ignored"),
    responses(
        (status = 200, description = "The value now in force", body = ConfigValue),
        (status = 400, description = "The value is wrong for the setting, or the body does not parse", body = ErrorBody),
        (status = 404, description = "No such setting", body = ErrorBody),
    ))]
/// Validates, persists (so the value survives a restart), then applies.
async fn set_config(
    _: Authorized,
    st: State,
    key: web::Path<KeyPath>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse> {
    let key = key.into_inner().key;
    let body: ConfigValue = json_body(&req, payload).await?;
    let mut value = body.value.trim().to_owned();
    note(&req, format!("set {} to {value:?}", key.as_str()));
    match key.as_str() {
        "harvest-mode" => {
            let mode: HarvestMode =
                value.parse().map_err(|e: crate::model::ParseError| ApiError::bad_request(e.to_string()))?;
            let running = st.running().await?;
            st.store.exec(move |s| s.set_harvest_mode(mode)).await?;
            running.handle.set_harvest_mode(mode);
            if let Some(c) = &running.containers {
                c.set_harvest_mode(mode);
            }
            value = mode.to_string();
        }
        "workers" => {
            // Digits only: `+4` reads like "four more", which is not what would be stored.
            let n: usize = Some(&value)
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "workers must be a whole number such as 4 (no sign: relative changes are not supported), got {value:?}"
                    ))
                })?;
            value = n.to_string();
            validate_workers(n, MAX_WORKERS).map_err(|e| ApiError::bad_request(e.to_string()))?;
            let running = st.running().await?;
            st.store.exec(move |s| s.set_workers(n)).await?;
            running.handle.set_workers(n).await?;
        }
        other => {
            return Err(ApiError::new(
                404,
                format!("unknown config key {other:?}: expected one of {}", CONFIG_KEYS.join(", ")),
            ))
        }
    }
    Ok(HttpResponse::Ok().json(ConfigValue { key, value }))
}

#[utoipa::path(get, path = "/v1/status", tag = "service", operation_id = "status",
    responses((status = 200, description = "The model, its machines, the cloud and the pool", body = StatusView)))]
async fn status(_: Authorized, st: State) -> Result<HttpResponse> {
    // No table is read whole: the counts the store keeps as it writes (and refreshes after other
    // replicas' commits), the partial index of machines in error, the model's life.
    let model = st.store.exec(|s| Ok((s.counts().clone(), s.machines_in_error()?, s.model_life()?)));
    let cloud = st.cloud_store.as_ref().map(|c| c.exec(|s| Ok(s.counts().instances_by_state.clone())));
    let ((counts, in_error, life), cloud) = match cloud {
        Some(cloud) => {
            let (model, cloud) = futures::join!(model, cloud);
            (model?, Some(cloud?))
        }
        None => (model.await?, None),
    };
    let (instances, instances_error) = if st.broker_name == "sim" {
        // The simulated cloud is in the database: its instances are counted as it writes them.
        let by_state = cloud.as_ref().unwrap_or(&counts.instances_by_state);
        let live = by_state.iter().filter(|(state, _)| *state != "terminated").map(|(_, n)| *n);
        (Some(live.sum::<u64>() as usize), None)
    } else {
        instance_count(st.broker.read_instances(crate::service::listing::MAX_AGE).await.map(|(l, _)| l.len()))
    };
    let lease = match &st.replica {
        Some(r) => Some(r.lease_status().await?),
        None => None,
    };
    // A follower runs no provisioner: its pool and mode are the stored settings, and it is
    // never "idle" (it does not know what the leader has left to do).
    let running = if lease.as_ref().is_some_and(|l| l.role != "leader") { None } else { Some(st.running().await?) };
    let (pool, harvest_mode, idle) = match &running {
        Some(p) => (p.handle.pool().await?, p.handle.harvest_mode().await?.to_string(), p.handle.is_idle().await),
        None => {
            let settings = st.store.exec(|s| s.settings()).await?;
            let pool = crate::snapshots::PoolStatus {
                size: settings.workers.unwrap_or(crate::config::DEFAULT_WORKERS),
                in_flight: 0,
                queued: 0,
            };
            (pool, settings.harvest_mode.unwrap_or_default().to_string(), false)
        }
    };
    let by_status: BTreeMap<String, usize> =
        counts.machines_by_status.iter().map(|(status, n)| (status.clone(), *n as usize)).collect();
    let view = StatusView {
        model_uuid: st.model_uuid.clone(),
        model_life: life.to_string(),
        broker: st.broker_name.clone(),
        zones: st.zones.clone(),
        harvest_mode,
        workers: pool.size,
        machines: by_status.values().sum(),
        machines_in_error: in_error as usize,
        machines_by_status: by_status,
        instances,
        instances_error,
        jobs_in_flight: pool.in_flight,
        jobs_queued: pool.queued,
        broker_calls_in_flight: st.broker.in_flight(),
        idle,
        uptime_s: st.started.elapsed().as_secs_f64(),
        role: lease.as_ref().map(|l| l.role.to_owned()),
        leader: lease.as_ref().and_then(|l| l.leader.clone()),
        epoch: lease.as_ref().and_then(|l| l.epoch),
        replica: lease.as_ref().map(|l| l.replica.clone()),
        last_transition: lease.as_ref().and_then(|l| l.last_transition).map(|(from, to, why, ago)| {
            crate::service::api::types::TransitionView {
                from: from.to_owned(),
                to: to.to_owned(),
                why: why.to_owned(),
                seconds_ago: ago.as_secs_f64(),
            }
        }),
        transitions: lease.as_ref().map(|l| l.transitions),
        models_led: st.models_led(),
    };
    Ok(HttpResponse::Ok().json(view))
}

/// The status's instance count: the count, or no count and why the listing failed (never a
/// count of 0 that only means "unknown").
fn instance_count(listed: std::result::Result<usize, crate::ports::BrokerError>) -> (Option<usize>, Option<String>) {
    match listed {
        Ok(n) => (Some(n), None),
        Err(e) => (None, Some(format!("listing the cloud failed: {e}"))),
    }
}

#[utoipa::path(post, path = "/v1/destroy-model", tag = "model", operation_id = "destroy_model",
    request_body(content = Option<DestroyRequest>, description = "Optional: no body (or an empty one) means `force: false`"),
    responses(
        (status = 200, description = "The model is dying: what the destruction set in motion", body = DestroyView),
        (status = 400, description = "A body that does not parse", body = ErrorBody),
        (status = 409, description = "The model is already dying, or live manual machines refuse it (named) without `force`", body = ErrorBody),
    ))]
async fn destroy_model(_: Authorized, st: State, req: HttpRequest, payload: web::Payload) -> Result<HttpResponse> {
    // No body (or an empty one) means the defaults; anything else must parse, or nothing happens.
    let DestroyRequest { force } = parse_body(&read_body(&req, payload).await?, Some(DestroyRequest::default()))?;
    note(&req, if force { "destroy the model (force)" } else { "destroy the model" });
    Ok(HttpResponse::Ok().json(destroy_running(&st, force).await?))
}

/// The engine's destruction of a model, as `destroy-model` asks it (and `model destroy` before
/// the model is removed): live manual machines refuse it without `force` (409, nothing
/// changed); containers are in its scope too.
pub(crate) async fn destroy_running(st: &ModelRuntime, force: bool) -> Result<DestroyView> {
    let manual = refuse_destroy_with_manual_machines(st, force).await?;
    let running = st.running().await?;
    let result = running.handle.destroy_model(force).await;
    if let (Some(c), Ok(_) | Err(DestroyError::ManualMachines { .. })) = (&running.containers, &result) {
        // Containers are in the destruction's scope too.
        c.model_destroyed();
    }
    match result {
        Ok(s) => Ok(DestroyView {
            stopping: s.stopping.iter().map(ToString::to_string).collect(),
            awaiting_starts: s.awaiting_starts.iter().map(ToString::to_string).collect(),
            manual_machines: manual.iter().map(ToString::to_string).collect(),
        }),
        Err(DestroyError::ManualMachines { ids, .. }) => Err(ApiError::new(409, manual_machines_message(&ids, true))),
        Err(e @ DestroyError::AlreadyDying) => Err(ApiError::new(409, e.to_string())),
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

/// Juju's check before a model destruction: without `force`, live manual machines refuse it
/// (409 naming them) and nothing changes (the model stays alive); with `force` the
/// destruction goes on and leaves them as they are (answered in `manual_machines`). A manual
/// machine added after this check is caught by the engine's own check, which answers the same
/// way (the model is dying by then).
async fn refuse_destroy_with_manual_machines(st: &ModelRuntime, force: bool) -> Result<Vec<MachineId>> {
    let (manual, life) = st.store.exec(|s| Ok((s.live_manual_machines()?, s.model_life()?))).await?;
    // A dying model is the engine's to answer (already dying).
    if !force && !manual.is_empty() && life == crate::model::Life::Alive {
        return Err(ApiError::new(409, manual_machines_message(&manual, false)));
    }
    Ok(manual)
}

/// The refusal naming the manual machines, as Juju words it, with what to do.
fn manual_machines_message(ids: &[MachineId], dying: bool) -> String {
    let names: Vec<&str> = ids.iter().map(MachineId::as_str).collect();
    format!(
        "manually provisioned machines must first be destroyed with `provisioner machine remove {}`, or the model \
         destroyed with --force, which leaves them as they are: {}{}",
        names.join(" "),
        names.join(", "),
        if dying { " (the model is dying; its other instances are being stopped)" } else { " (nothing was changed)" }
    )
}

#[utoipa::path(get, path = "/v1/events", tag = "service", operation_id = "events",
    responses(
        (status = 200, description = "Server-sent events, one `EventView` (JSON) per `data:` line, until the \
            client disconnects, falls behind or goes idle (`stream-dropped`), or its token is revoked \
            (`token-revoked`)", content_type = "text/event-stream", body = String),
        (status = 429, description = "The token already holds `[events] max_streams_per_token` streams (8) on this \
            replica, or the replica `[events] max_streams` (256), all tokens together; the message names the cap \
            and how to raise it", body = ErrorBody),
    ))]
async fn events(who: Authorized, st: State, host: Host) -> Result<HttpResponse> {
    use crate::service::events::{Admit, OpenStream};
    use futures::StreamExt;
    let ticket = host
        .shared()
        .streams
        .send(Admit(who.0.id))
        .await
        .map_err(|e| ApiError::internal(format!("event stream: {e}")))?
        .map_err(|refused| ApiError::new(429, refused.to_string()))?;
    let rx =
        st.events.send(OpenStream(Some(ticket))).await.map_err(|e| ApiError::internal(format!("event stream: {e}")))?;
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(rx.map(|frame| Ok::<_, actix_web::Error>(web::Bytes::from(frame)))))
}

#[utoipa::path(get, path = "/metrics", tag = "service", operation_id = "metrics",
    responses((status = 200, description = "OpenMetrics text format 1.0.0 (ends in `# EOF`)",
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String)))]
/// The service's metrics: `default`'s families with the HTTP requests of every model while
/// `default` runs; without it (destroyed, or not running), the service's families alone
/// (requests, uptime, the service store's operations), never a 404 or 503 a scraper would
/// take for a dead service.
async fn service_metrics(host: Host) -> Result<HttpResponse> {
    match host.state(DEFAULT_MODEL).await {
        Ok(st) => metrics(ModelState(st)).await,
        Err(_) => {
            let shared = host.shared();
            let g = Gauges {
                uptime_seconds: shared.started.elapsed().as_secs_f64(),
                store_operations: shared.service_store.operations(),
                ..Gauges::default()
            };
            let text = shared
                .metrics
                .send(crate::service::metrics::RenderService(g))
                .await
                .map_err(|e| ApiError::internal(format!("metrics: {e}")))?;
            Ok(HttpResponse::Ok().content_type(crate::service::metrics::CONTENT_TYPE).body(text))
        }
    }
}

/// Reads no table: the state gauges are the counts the store keeps as it writes, held by the
/// metrics actor; the rest comes from the actors' own state.
async fn metrics(st: State) -> Result<HttpResponse> {
    // A follower has no provisioner: its pool and rate gauges are zero, its mode the stored one.
    let running = st.running().await.ok();
    let pool = match &running {
        Some(p) => p.handle.pool().await?,
        None => crate::snapshots::PoolStatus { size: 0, in_flight: 0, queued: 0 },
    };
    let harvest_mode = match &running {
        Some(p) => p.handle.harvest_mode().await?.to_string(),
        None => st.store.exec(|s| s.settings()).await?.harvest_mode.unwrap_or_default().to_string(),
    };
    let mut g = Gauges {
        workers: pool.size as u64,
        jobs_in_flight: pool.in_flight as u64,
        jobs_queued: pool.queued as u64,
        broker_in_flight: st.broker.in_flight() as u64,
        harvest_mode,
        uptime_seconds: st.started.elapsed().as_secs_f64(),
        store_operations: st.store.operations(),
        event_streams_dropped: st.events_dropped.load(std::sync::atomic::Ordering::Relaxed),
        ..Gauges::default()
    };
    let classes = match &running {
        Some(p) => p.handle.limiter().await?.classes,
        None => Vec::new(),
    };
    for c in classes {
        g.rate_limits.insert(c.class.to_string(), (c.rate, c.waiting as u64, c.throttled));
    }
    let text = st.metrics.send(Render(g)).await.map_err(|e| ApiError::internal(format!("metrics: {e}")))?;
    Ok(HttpResponse::Ok().content_type(crate::service::metrics::CONTENT_TYPE).body(text))
}

#[utoipa::path(get, path = "/v1/metrics", tag = "service", operation_id = "model_metrics",
    responses((status = 200, description = "The model's metrics: OpenMetrics text format 1.0.0 (ends in `# EOF`), \
        the families of `/metrics` for this model (its machines, starts, pool, cloud calls; the HTTP families \
        count the whole service)",
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String)))]
/// One model's metrics (`/v1/models/NAME/metrics`; `/metrics`, without a token, is `default`'s):
/// behind the token, so that a token scoped to a model reads that model's alone.
async fn model_metrics(_: Authorized, st: State) -> Result<HttpResponse> {
    metrics(st).await
}

async fn v1_not_found(_: Authorized, req: HttpRequest) -> Result<HttpResponse> {
    Err(ApiError::new(404, format!("no such API endpoint: {} {}", req.method(), req.path())))
}

async fn not_found(req: HttpRequest) -> Result<HttpResponse> {
    Err(ApiError::new(404, format!("no such endpoint: {} {}", req.method(), req.path())))
}

fn path_error(err: actix_web::error::PathError, _req: &HttpRequest) -> actix_web::Error {
    ApiError::bad_request(format!("invalid path: {err}")).into()
}

/// A resource whose other methods answer 405 with `Allow` (after the token check under `/v1`).
pub(crate) fn resource(path: &str, allow: &'static str, v1: bool) -> actix_web::Resource {
    let r = web::resource(path);
    if v1 {
        r.default_service(web::to(move |_: Authorized, req: HttpRequest| async move {
            Err::<HttpResponse, _>(ApiError::not_allowed(req.method(), allow))
        }))
    } else {
        r.default_service(web::to(move |req: HttpRequest| async move {
            Err::<HttpResponse, _>(ApiError::not_allowed(req.method(), allow))
        }))
    }
}

/// Configures the routes (for `App::configure`).
pub fn routes(cfg: &mut web::ServiceConfig) {
    // The dashboard's page and files (no token: every call the page makes sends it).
    cfg.configure(crate::service::dashboard::routes);
    cfg.service(resource("/healthz", "GET", false).route(web::get().to(healthz)))
        .service(resource("/readyz", "GET", false).route(web::get().to(readyz)))
        .service(resource("/metrics", "GET", false).route(web::get().to(service_metrics)))
        .service(
            web::scope("/v1")
                .service(resource("/openapi.json", "GET", false).route(web::get().to(openapi::openapi_json)))
                .service(
                    resource("/models", "GET, POST", true)
                        .route(web::get().to(models::list_models))
                        .route(web::post().to(models::add_model)),
                )
                .service(
                    resource("/models/{model}", "GET, DELETE", true)
                        .route(web::get().to(models::show_model))
                        .route(web::delete().to(models::destroy_model)),
                )
                // Everything per model, for the model the path names...
                .service(web::scope("/models/{model}").configure(model_routes).default_service(web::to(v1_not_found)))
                // ... and the same routes without it, for `default`.
                .configure(model_routes)
                .service(
                    resource("/tokens", "GET, POST", true)
                        .route(web::get().to(tokens::list_tokens))
                        .route(web::post().to(tokens::create_token)),
                )
                .service(resource("/tokens/{id}", "DELETE", true).route(web::delete().to(tokens::revoke_token)))
                .default_service(web::to(v1_not_found)),
        );
}

/// The routes of one model: under `/v1/models/{model}`, and under `/v1` for `default`.
fn model_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        resource("/machines", "GET, POST", true)
            .route(web::get().to(model::list_machines))
            .route(web::post().to(add_machines)),
    )
    .service(resource("/machines/remove", "POST", true).route(web::post().to(remove_machines)))
    .service(resource("/machines/retry", "POST", true).route(web::post().to(retry_machines)))
    // After the two above: a container's id holds `/` (`3/lxd/0`).
    .service(resource("/machines/{id:.+}", "GET", true).route(web::get().to(model::show_machine)))
    .service(
        resource("/applications", "GET, POST", true)
            .route(web::get().to(model::list_applications))
            .route(web::post().to(model::add_application)),
    )
    .service(resource("/applications/{name}", "DELETE", true).route(web::delete().to(model::remove_application)))
    .service(resource("/instances", "GET", true).route(web::get().to(list_instances)))
    .service(resource("/config", "GET", true).route(web::get().to(list_config)))
    .service(
        resource("/config/{key}", "GET, PUT", true).route(web::get().to(get_config)).route(web::put().to(set_config)),
    )
    .service(resource("/status", "GET", true).route(web::get().to(status)))
    .service(resource("/metrics", "GET", true).route(web::get().to(model_metrics)))
    .service(resource("/destroy-model", "POST", true).route(web::post().to(destroy_model)))
    .service(resource("/events", "GET", true).route(web::get().to(events)));
}

/// The method as a metrics label: one of the methods the API knows, else `other` (a label
/// from the request itself would let any caller add series without bound).
pub fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The audit log's line for an answered change request: the caller's token id (never the
/// token), what the handler noted, the status and the error sentence, if any.
fn audit_line<B>(res: &ServiceResponse<B>) -> AuditLine {
    let req = res.request();
    let result = match res.response().error() {
        Some(e) => e.as_error::<ApiError>().map(|a| a.message.clone()).unwrap_or_else(|| e.to_string()),
        None if res.status().is_success() => "ok".to_owned(),
        None => res.status().to_string(),
    };
    AuditLine {
        time: crate::service::audit::now_rfc3339(),
        token: req.extensions().get::<Caller>().map(|c| c.id.clone()),
        method: req.method().to_string(),
        path: req.path().to_owned(),
        status: res.status().as_u16(),
        what: req.extensions().get::<AuditNote>().map(|n| n.0.clone()),
        result,
    }
}

/// Request metrics, in the service's registry (the one `/metrics` renders, `default`'s
/// families too while it runs).
fn http_done(host: &ModelHost, method: &'static str, route: String, code: u16, began: Instant) {
    host.shared().metrics.do_send(HttpDone { method, route, code, seconds: began.elapsed().as_secs_f64() });
}

/// The 503 of a request not answered within `deadline`: what may have happened, and what to do.
fn no_answer_within(deadline: std::time::Duration, change: bool) -> ApiError {
    let mut message = format!(
        "no answer within {} (the database may be unreachable or slow); try again later",
        humantime::format_duration(deadline)
    );
    if change {
        message.push_str(": the change asked for may still be made, so read before repeating it");
    }
    ApiError::new(503, message)
}

/// The application: the routes, JSON error handling, request metrics and the audit log.
pub fn app(
    host: ModelHost,
) -> App<
    impl actix_web::dev::ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let audit = host.shared().audit.clone();
    let deadline = host.shared().opts.request_deadline;
    let metrics_host = host.clone();
    App::new()
        .app_data(web::Data::new(host))
        .app_data(web::PathConfig::default().error_handler(path_error))
        .configure(routes)
        .default_service(web::to(not_found))
        .wrap_fn(move |req, srv| {
            let began = Instant::now();
            let method = method_label(req.method());
            let change = crate::service::audit::is_change(req.method().as_str(), req.path());
            // Kept for a request refused before (or not answered by) its handler: its own
            // request is with the handler.
            let asked = change.then(|| (req.method().to_string(), req.path().to_owned()));
            let peer = req.peer_addr().map(|a| a.ip());
            // Routed now; its handler runs only when the call is awaited.
            let call = srv.call(req);
            let host = metrics_host.clone();
            let audit = audit.clone();
            async move {
                let unheard = |status: u16, result: String| {
                    asked.clone().map(|(method, path)| AuditLine {
                        time: crate::service::audit::now_rfc3339(),
                        // The caller is known only to the handler: not named.
                        token: None,
                        method,
                        path,
                        status,
                        what: None,
                        result,
                    })
                };
                // No unaudited change: none goes ahead while its line could not be written.
                if change {
                    if let Err(e) = audit.ready().await {
                        let e = ApiError::new(
                            503,
                            format!("{e}: no change is accepted until it can be (reads keep working)"),
                        );
                        if let Some(line) = unheard(503, e.message.clone()) {
                            let _ = audit.record(line).await;
                        }
                        http_done(&host, method, "unmatched".to_owned(), 503, began);
                        return Err(e.into());
                    }
                }
                // Bounded: a store that cannot answer (the database unreachable, a call stuck)
                // makes a 503, never a caller that hangs.
                let Ok(res) = actix_rt::time::timeout(deadline, call).await else {
                    let e = no_answer_within(deadline, change);
                    if let Some(line) = unheard(503, e.message.clone()) {
                        let _ = audit.record(line).await;
                    }
                    http_done(&host, method, "unmatched".to_owned(), 503, began);
                    return Err(e.into());
                };
                let res = res?;
                if change {
                    // Written before the answer leaves: an answered change is in the log. A
                    // request refused for want of a valid token changed nothing: its line is
                    // written at a bounded rate (an unauthenticated caller cannot fill the disk).
                    let line = audit_line(&res);
                    if res.status() == StatusCode::UNAUTHORIZED {
                        if !audit.refused(peer, line, Instant::now()).await {
                            host.shared().metrics.do_send(crate::service::metrics::AuditSuppressed);
                        }
                    } else {
                        let _ = audit.record(line).await;
                    }
                }
                let route = res.request().match_pattern().unwrap_or_else(|| "unmatched".to_owned());
                http_done(&host, method, route, res.status().as_u16(), began);
                Ok(res)
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_listing_is_no_count_and_says_so() {
        assert_eq!(instance_count(Ok(3)), (Some(3), None));
        let (n, why) = instance_count(Err(crate::ports::BrokerError::transient("the cloud is down")));
        assert_eq!(n, None);
        assert!(why.is_some_and(|w| w.contains("listing the cloud failed") && w.contains("the cloud is down")));
        let view = StatusView {
            model_uuid: "u".into(),
            model_life: "alive".into(),
            broker: "sim".into(),
            zones: Vec::new(),
            harvest_mode: "destroyed".into(),
            workers: 1,
            machines: 0,
            machines_by_status: BTreeMap::new(),
            machines_in_error: 0,
            instances: None,
            instances_error: Some("listing the cloud failed: x".into()),
            jobs_in_flight: 0,
            jobs_queued: 0,
            broker_calls_in_flight: 0,
            idle: true,
            uptime_s: 0.0,
            role: None,
            leader: None,
            epoch: None,
            replica: None,
            last_transition: None,
            transitions: None,
            models_led: None,
        };
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["instances"], serde_json::Value::Null);
        assert_eq!(json["instances_error"], "listing the cloud failed: x");
    }

    #[test]
    fn type_errors_name_their_field_and_empty_bodies_take_the_defaults() {
        let e = parse_body::<DestroyRequest>(br#"{"force": "yes"}"#, None).unwrap_err();
        assert!(e.message.contains("\"force\""), "{e}");
        let e = parse_body::<DestroyRequest>(br#"{"forse": true}"#, None).unwrap_err();
        assert!(e.message.contains("forse"), "{e}");
        let e = parse_body::<RemoveMachines>(b"{\n  \"ids\": [\"1\"],\n  \"force\": 3\n}", None).unwrap_err();
        assert!(e.message.contains("\"force\""), "{e}");
        assert_eq!(parse_body(b"  ", Some(DestroyRequest::default())).unwrap(), DestroyRequest::default());
        assert_eq!(parse_body::<DestroyRequest>(b"", None).unwrap_err().status, 400);
        // schemathesis found `[]` taken as a struct with every default.
        let e = parse_body::<DestroyRequest>(b" []", None).unwrap_err();
        assert!(e.status == 400 && e.message.contains("JSON object"), "{e}");
        assert_eq!(parse_body::<DestroyRequest>(b" {}", None).unwrap(), DestroyRequest::default());
        assert_eq!(ids(&["3".into(), "3".into(), " 4".into()]).unwrap(), [MachineId::new("3"), MachineId::new("4")]);
        assert_eq!(method_label(&Method::from_bytes(b"MADEUP").unwrap()), "other");
    }

    #[test]
    fn store_errors_map_to_statuses() {
        assert_eq!(ApiError::from(StoreError::NotFound(MachineId::new("3"))).status, 404);
        assert_eq!(ApiError::from(StoreError::ModelDying).status, 409);
        assert_eq!(ApiError::from(StoreError::Stopped(actix::MailboxError::Closed)).status, 500);
    }
}
