//! The route table ([`routes`]: the service's own routes, `/v1/models/{model}/...` and the same
//! per-model routes under `/v1` for `default`; `resource`: 405 with `Allow` for a method a
//! route does not take) and the application ([`app`]), whose `wrap_fn` bounds every request
//! by the request deadline (503 past it), writes the audit line of every change request, and
//! counts every request in the metrics.

use actix_rt::time::Instant;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use actix_web::{web, App, HttpMessage, HttpRequest, HttpResponse};

use super::auth::{Authorized, Caller};
use super::errors::{ApiError, Result};
use super::{
    applications, config, dashboard, destroy, drift, events, health, instances, machines, metrics, models, openapi,
    status, tokens,
};
use crate::service::audit::{AuditLine, AuditNote};
use crate::service::host::ModelHost;
use crate::service::metrics::HttpDone;

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
pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    // The dashboard's page and files (no token: every call the page makes sends it).
    cfg.configure(dashboard_routes);
    cfg.service(resource("/healthz", "GET", false).route(web::get().to(health::healthz)))
        .service(resource("/readyz", "GET", false).route(web::get().to(health::readyz)))
        .service(resource("/metrics", "GET", false).route(web::get().to(metrics::service_metrics)))
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

/// The dashboard's page and files ([`dashboard::ASSETS`]; GET only, no token: every call the
/// page makes sends it).
pub(crate) fn dashboard_routes(cfg: &mut web::ServiceConfig) {
    for (path, content_type, body) in dashboard::ASSETS {
        let get = web::get().to(move || async move { dashboard::answer(content_type, body) });
        // Other methods: 405 with `Allow`, as on the API's routes.
        cfg.service(resource(path, "GET", false).route(get));
    }
}

/// The routes of one model: under `/v1/models/{model}`, and under `/v1` for `default`.
fn model_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        resource("/machines", "GET, POST", true)
            .route(web::get().to(machines::list_machines))
            .route(web::post().to(machines::add_machines)),
    )
    .service(resource("/machines/remove", "POST", true).route(web::post().to(machines::remove_machines)))
    .service(resource("/machines/retry", "POST", true).route(web::post().to(machines::retry_machines)))
    // After the two above, and the constraints before the machine itself: a container's id
    // holds `/` (`3/lxd/0`), so `{id:.+}` would take `3/constraints` for a machine id.
    .service(
        resource("/machines/{id:.+}/constraints", "PUT", true).route(web::put().to(machines::set_machine_constraints)),
    )
    .service(resource("/machines/{id:.+}", "GET", true).route(web::get().to(machines::show_machine)))
    .service(
        resource("/applications", "GET, POST", true)
            .route(web::get().to(applications::list_applications))
            .route(web::post().to(applications::add_application)),
    )
    .service(resource("/applications/{name}", "DELETE", true).route(web::delete().to(applications::remove_application)))
    .service(resource("/instances", "GET", true).route(web::get().to(instances::list_instances)))
    .service(resource("/drift", "GET", true).route(web::get().to(drift::list_drift)))
    .service(resource("/config", "GET", true).route(web::get().to(config::list_config)))
    .service(
        resource("/config/{key}", "GET, PUT", true)
            .route(web::get().to(config::get_config))
            .route(web::put().to(config::set_config)),
    )
    .service(resource("/status", "GET", true).route(web::get().to(status::status)))
    .service(resource("/metrics", "GET", true).route(web::get().to(metrics::model_metrics)))
    .service(resource("/destroy-model", "POST", true).route(web::post().to(destroy::destroy_model)))
    .service(resource("/events", "GET", true).route(web::get().to(events::events)));
}

/// The method as a metrics label: one of the methods the API knows, else `other` (a label
/// from the request itself would let any caller add series without bound).
pub(crate) fn method_label(m: &Method) -> &'static str {
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
pub(crate) fn app(
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
            // The request's span (a trace's root, or a child of the caller's `traceparent`):
            // its model and token id (never the token) are recorded once the token is checked
            // (`auth`), its route and status once answered.
            let span = tracing::info_span!(
                target: crate::TRACE_TARGET,
                "http request",
                http.request.method = %req.method(),
                url.path = %req.path(),
                http.route = tracing::field::Empty,
                model = tracing::field::Empty,
                token = tracing::field::Empty,
                http.response.status_code = tracing::field::Empty,
            );
            crate::trace::continue_from(&span, req.headers().get("traceparent").and_then(|v| v.to_str().ok()));
            // Routed now; its handler runs only when the call is awaited.
            let call = srv.call(req);
            let host = metrics_host.clone();
            let audit = audit.clone();
            let answered = span.clone();
            tracing::Instrument::instrument(
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
                    answered.record("http.route", route.as_str());
                    answered.record("http.response.status_code", res.status().as_u16());
                    http_done(&host, method, route, res.status().as_u16(), began);
                    Ok(res)
                },
                span,
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_methods_are_labelled_other() {
        assert_eq!(method_label(&Method::from_bytes(b"MADEUP").unwrap()), "other");
    }
}
