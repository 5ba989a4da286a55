//! The HTTP API: `/healthz`, `/metrics`, and JSON under `/v1` behind a bearer token.
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `GET /healthz` | | `ok` (no token needed) |
//! | `GET /metrics` | | Prometheus text (no token needed) |
//! | `GET /v1/machines` | | `[MachineView]` |
//! | `POST /v1/machines` | `AddMachines` | `201 AddedMachines` |
//! | `POST /v1/machines/remove` | `RemoveMachines` | `204` |
//! | `POST /v1/machines/retry` | `RetryMachines` | `204` |
//! | `GET /v1/instances` | | `[InstanceView]` |
//! | `GET /v1/config` | | `[ConfigValue]` |
//! | `GET /v1/config/{key}` | | `ConfigValue` |
//! | `PUT /v1/config/{key}` | `ConfigValue` (`value`) | `ConfigValue` |
//! | `GET /v1/status` | | `StatusView` |
//! | `POST /v1/destroy-model` | `DestroyRequest` | `DestroyView` |
//! | `GET /v1/events` | | `text/event-stream` of `EventView`s |
//!
//! Errors are `{"error": "one sentence"}` with 400 (bad input), 401 (no or wrong token), 404
//! (no such machine or route), 409 (the model's state refuses it) or 500.

pub mod types;

use std::collections::BTreeMap;
use std::future::{ready, Ready};

use actix_rt::time::Instant;
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::{web, App, FromRequest, HttpRequest, HttpResponse, ResponseError};

use crate::config::{validate_workers, MAX_WORKERS};
use crate::coordinator::DestroyError;
use crate::service::metrics::{Gauges, HttpDone, MeteredBroker, Metrics, Render};
use crate::service::store::{MachineRecord, Store, StoreError};
use crate::types::{HarvestMode, MachineId};
use crate::wiring::ProvisionerHandle;
use crate::Broker;
use types::{
    AddMachines, AddedMachines, ConfigValue, DestroyRequest, DestroyView, ErrorBody, InstanceView, MachineView,
    RemoveMachines, RetryMachines, StatusView,
};

/// The most machines one `POST /v1/machines` may add.
pub const MAX_ADD: usize = 10_000;

/// Everything the handlers share (cheap to clone: handles and addresses).
#[derive(Clone)]
pub struct AppState {
    /// The database.
    pub store: Store,
    /// The running provisioner.
    pub handle: ProvisionerHandle,
    /// The cloud, metered.
    pub broker: MeteredBroker,
    /// The metrics actor.
    pub metrics: actix::Addr<Metrics>,
    /// The event streams.
    pub events: actix::Addr<crate::service::events::EventHub>,
    /// The API token.
    pub token: String,
    /// The cloud's zones.
    pub zones: Vec<String>,
    /// `sim`.
    pub broker_name: String,
    /// The model's uuid.
    pub model_uuid: String,
    /// When the service started.
    pub started: Instant,
}

/// An API error: a status and one sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    status: u16,
    message: String,
}

impl ApiError {
    fn new(status: u16, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
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
        HttpResponse::build(self.status_code()).json(ErrorBody { error: self.message.clone() })
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let status = match &e {
            StoreError::NotFound(_) => 404,
            StoreError::ModelDying | StoreError::Refused(_) => 409,
            _ => 500,
        };
        Self::new(status, e.to_string())
    }
}

impl From<crate::wiring::ProvisionerError> for ApiError {
    fn from(e: crate::wiring::ProvisionerError) -> Self {
        match e {
            crate::wiring::ProvisionerError::Config(c) => Self::bad_request(c.to_string()),
            other => Self::internal(other.to_string()),
        }
    }
}

/// Compares without stopping at the first difference (no timing oracle on the token).
fn same_token(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Proof that the request carried the API token (`Authorization: Bearer TOKEN`).
pub struct Authorized;

fn check_token(req: &HttpRequest) -> Result<Authorized, ApiError> {
    let Some(state) = req.app_data::<web::Data<AppState>>() else {
        return Err(ApiError::internal("the API has no state"));
    };
    let given = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110 11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match given {
        Some(t) if same_token(t.as_bytes(), state.token.as_bytes()) => Ok(Authorized),
        Some(_) => Err(ApiError::new(401, "the API token is wrong")),
        None => Err(ApiError::new(401, "an API token is required: send Authorization: Bearer TOKEN")),
    }
}

impl FromRequest for Authorized {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;
    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(check_token(req))
    }
}

type Result<T, E = ApiError> = std::result::Result<T, E>;
type State = web::Data<AppState>;

fn view(m: &MachineRecord) -> MachineView {
    MachineView {
        id: m.machine.id.to_string(),
        life: m.machine.life.to_string(),
        status: m.machine.status.to_string(),
        instance: m.machine.instance.as_ref().map(ToString::to_string),
        zone: m.zone.clone(),
        instance_status: m.machine.instance_status.to_string(),
        message: m.message().to_owned(),
    }
}

fn ids(raw: &[String]) -> Result<Vec<MachineId>> {
    if raw.is_empty() {
        return Err(ApiError::bad_request("no machine ids given"));
    }
    Ok(raw.iter().map(|s| MachineId::new(s.trim())).collect())
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn list_machines(_: Authorized, st: State) -> Result<HttpResponse> {
    let machines = st.store.exec(|s| s.list_machines()).await?;
    Ok(HttpResponse::Ok().json(machines.iter().map(view).collect::<Vec<_>>()))
}

async fn add_machines(_: Authorized, st: State, body: web::Json<AddMachines>) -> Result<HttpResponse> {
    let AddMachines { count, zones } = body.into_inner();
    if count == 0 || count > MAX_ADD {
        return Err(ApiError::bad_request(format!("count must be between 1 and {MAX_ADD}, got {count}")));
    }
    if let Some(z) = &zones {
        if z.is_empty() {
            return Err(ApiError::bad_request("zones must not be empty when given"));
        }
        if st.zones.is_empty() {
            return Err(ApiError::bad_request("this cloud has no availability zones"));
        }
        if let Some(bad) = z.iter().find(|z| !st.zones.contains(z)) {
            return Err(ApiError::bad_request(format!(
                "unknown zone {bad:?}: this cloud's zones are {}",
                st.zones.join(", ")
            )));
        }
    }
    let added = st.store.exec(move |s| s.add_machines(count, zones.as_deref())).await?;
    Ok(HttpResponse::Created().json(AddedMachines { ids: added.iter().map(ToString::to_string).collect() }))
}

async fn remove_machines(_: Authorized, st: State, body: web::Json<RemoveMachines>) -> Result<HttpResponse> {
    let RemoveMachines { ids: raw, keep_instance, force } = body.into_inner();
    let ids = ids(&raw)?;
    st.store.exec(move |s| s.remove_machines(&ids, keep_instance, force)).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn retry_machines(_: Authorized, st: State, body: web::Json<RetryMachines>) -> Result<HttpResponse> {
    let ids = ids(&body.ids)?;
    st.store.exec(move |s| s.retry_machines(&ids)).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn list_instances(_: Authorized, st: State) -> Result<HttpResponse> {
    let list = st.broker.all_instances().await.map_err(|e| ApiError::internal(format!("listing the cloud: {e}")))?;
    let views: Vec<InstanceView> = list
        .into_iter()
        .map(|i| InstanceView {
            id: i.id.to_string(),
            state: i.state.to_string(),
            zone: i.zone,
            machine: i.tags.machine.map(|m| m.to_string()),
        })
        .collect();
    Ok(HttpResponse::Ok().json(views))
}

const CONFIG_KEYS: [&str; 2] = ["harvest-mode", "workers"];

async fn config_value(st: &AppState, key: &str) -> Result<ConfigValue> {
    let value = match key {
        "harvest-mode" => st.handle.harvest_mode().await?.to_string(),
        "workers" => st.handle.pool().await?.size.to_string(),
        other => {
            return Err(ApiError::new(
                404,
                format!("unknown config key {other:?}: expected one of {}", CONFIG_KEYS.join(", ")),
            ))
        }
    };
    Ok(ConfigValue { key: key.to_owned(), value })
}

async fn get_config(_: Authorized, st: State, key: web::Path<String>) -> Result<HttpResponse> {
    Ok(HttpResponse::Ok().json(config_value(&st, &key).await?))
}

async fn list_config(_: Authorized, st: State) -> Result<HttpResponse> {
    let mut out = Vec::new();
    for key in CONFIG_KEYS {
        out.push(config_value(&st, key).await?);
    }
    Ok(HttpResponse::Ok().json(out))
}

/// Validates, persists (so the value survives a restart), then applies.
async fn set_config(
    _: Authorized,
    st: State,
    key: web::Path<String>,
    body: web::Json<ConfigValue>,
) -> Result<HttpResponse> {
    let mut value = body.value.trim().to_owned();
    match key.as_str() {
        "harvest-mode" => {
            let mode: HarvestMode =
                value.parse().map_err(|e: crate::types::ParseError| ApiError::bad_request(e.to_string()))?;
            st.store.exec(move |s| s.set_harvest_mode(mode)).await?;
            st.handle.set_harvest_mode(mode);
            value = mode.to_string();
        }
        "workers" => {
            let n: usize = value
                .parse()
                .map_err(|_| ApiError::bad_request(format!("workers must be a whole number, got {value:?}")))?;
            validate_workers(n, MAX_WORKERS).map_err(|e| ApiError::bad_request(e.to_string()))?;
            st.store.exec(move |s| s.set_workers(n)).await?;
            st.handle.set_workers(n).await?;
        }
        other => {
            return Err(ApiError::new(
                404,
                format!("unknown config key {other:?}: expected one of {}", CONFIG_KEYS.join(", ")),
            ))
        }
    }
    Ok(HttpResponse::Ok().json(ConfigValue { key: key.into_inner(), value }))
}

async fn status(_: Authorized, st: State) -> Result<HttpResponse> {
    let (machines, life) = st.store.exec(|s| Ok((s.list_machines()?, s.model_life()?))).await?;
    let instances = st.broker.all_instances().await.map(|l| l.len()).unwrap_or(0);
    let pool = st.handle.pool().await?;
    let mut by_status = BTreeMap::new();
    for m in &machines {
        *by_status.entry(m.machine.status.to_string()).or_insert(0) += 1;
    }
    let view = StatusView {
        model_uuid: st.model_uuid.clone(),
        model_life: life.to_string(),
        broker: st.broker_name.clone(),
        zones: st.zones.clone(),
        harvest_mode: st.handle.harvest_mode().await?.to_string(),
        workers: pool.size,
        machines: machines.len(),
        machines_in_error: machines.iter().filter(|m| view(m).is_error()).count(),
        machines_by_status: by_status,
        instances,
        jobs_in_flight: pool.in_flight,
        jobs_queued: pool.queued,
        broker_calls_in_flight: st.broker.in_flight(),
        idle: st.handle.is_idle().await,
        uptime_s: st.started.elapsed().as_secs_f64(),
    };
    Ok(HttpResponse::Ok().json(view))
}

async fn destroy_model(_: Authorized, st: State, body: Option<web::Json<DestroyRequest>>) -> Result<HttpResponse> {
    let force = body.map(|b| b.force).unwrap_or(false);
    match st.handle.destroy_model(force).await {
        Ok(s) => Ok(HttpResponse::Ok().json(DestroyView {
            stopping: s.stopping.iter().map(ToString::to_string).collect(),
            awaiting_starts: s.awaiting_starts.iter().map(ToString::to_string).collect(),
        })),
        Err(e @ (DestroyError::AlreadyDying | DestroyError::ManualMachines { .. })) => {
            Err(ApiError::new(409, e.to_string()))
        }
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

async fn events(_: Authorized, st: State) -> Result<HttpResponse> {
    use futures::StreamExt;
    let rx = st
        .events
        .send(crate::service::events::OpenStream)
        .await
        .map_err(|e| ApiError::internal(format!("event stream: {e}")))?;
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(rx.map(|frame| Ok::<_, actix_web::Error>(web::Bytes::from(frame)))))
}

async fn metrics(st: State) -> Result<HttpResponse> {
    let (machines, instances, life) =
        st.store.exec(|s| Ok((s.list_machines()?, s.all_instances()?, s.model_life()?))).await?;
    let pool = st.handle.pool().await?;
    let mut g = Gauges {
        workers: pool.size as u64,
        jobs_in_flight: pool.in_flight as u64,
        jobs_queued: pool.queued as u64,
        broker_in_flight: st.broker.in_flight() as u64,
        harvest_mode: st.handle.harvest_mode().await?.to_string(),
        model_life: life.to_string(),
        uptime_seconds: st.started.elapsed().as_secs_f64(),
        ..Gauges::default()
    };
    for m in &machines {
        *g.machines_by_status.entry(m.machine.status.to_string()).or_default() += 1;
        *g.machines_by_life.entry(m.machine.life.to_string()).or_default() += 1;
    }
    for i in &instances {
        *g.instances_by_state.entry(i.instance.state.to_string()).or_default() += 1;
    }
    for c in st.handle.limiter().await?.classes {
        g.rate_limits.insert(c.class.to_string(), (c.rate, c.waiting as u64, c.throttled));
    }
    let text = st.metrics.send(Render(g)).await.map_err(|e| ApiError::internal(format!("metrics: {e}")))?;
    Ok(HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(text))
}

async fn v1_not_found(_: Authorized, req: HttpRequest) -> Result<HttpResponse> {
    Err(ApiError::new(404, format!("no such API endpoint: {} {}", req.method(), req.path())))
}

async fn not_found(req: HttpRequest) -> Result<HttpResponse> {
    Err(ApiError::new(404, format!("no such endpoint: {} {}", req.method(), req.path())))
}

fn json_error(err: actix_web::error::JsonPayloadError, _req: &HttpRequest) -> actix_web::Error {
    ApiError::bad_request(format!("invalid JSON body: {err}")).into()
}

fn path_error(err: actix_web::error::PathError, _req: &HttpRequest) -> actix_web::Error {
    ApiError::bad_request(format!("invalid path: {err}")).into()
}

/// Configures the routes (for `App::configure`).
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(healthz)).route("/metrics", web::get().to(metrics)).service(
        web::scope("/v1")
            .route("/machines", web::get().to(list_machines))
            .route("/machines", web::post().to(add_machines))
            .route("/machines/remove", web::post().to(remove_machines))
            .route("/machines/retry", web::post().to(retry_machines))
            .route("/instances", web::get().to(list_instances))
            .route("/config", web::get().to(list_config))
            .route("/config/{key}", web::get().to(get_config))
            .route("/config/{key}", web::put().to(set_config))
            .route("/status", web::get().to(status))
            .route("/destroy-model", web::post().to(destroy_model))
            .route("/events", web::get().to(events))
            .default_service(web::to(v1_not_found)),
    );
}

/// The application: the routes, JSON error handling and request metrics.
pub fn app(
    state: AppState,
) -> App<
    impl actix_web::dev::ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let metrics = state.metrics.clone();
    App::new()
        .app_data(web::Data::new(state))
        .app_data(web::JsonConfig::default().limit(1 << 20).error_handler(json_error))
        .app_data(web::PathConfig::default().error_handler(path_error))
        .configure(routes)
        .default_service(web::to(not_found))
        .wrap_fn(move |req, srv| {
            let began = Instant::now();
            let method = req.method().to_string();
            let call = srv.call(req);
            let metrics = metrics.clone();
            async move {
                let res = call.await?;
                let route = res.request().match_pattern().unwrap_or_else(|| "unmatched".to_owned());
                metrics.do_send(HttpDone {
                    method,
                    route,
                    code: res.status().as_u16(),
                    seconds: began.elapsed().as_secs_f64(),
                });
                Ok(res)
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token(b"abc", b"abc"));
        assert!(!same_token(b"abc", b"abd"));
        assert!(!same_token(b"abc", b"abcd"));
        assert!(!same_token(b"", b"a"));
    }

    #[test]
    fn store_errors_map_to_statuses() {
        assert_eq!(ApiError::from(StoreError::NotFound(MachineId::new("3"))).status, 404);
        assert_eq!(ApiError::from(StoreError::ModelDying).status, 409);
        assert_eq!(ApiError::from(StoreError::Unavailable("x".into())).status, 500);
    }
}
