//! `/healthz` and `/readyz` (no token): whether the service's store can be read, saying only
//! whether the database is unreachable or answered an error (the reason goes to the log); and
//! the waiting server that answers every path 503 while the service waits for its database at
//! start.

use actix_web::HttpResponse;
#[cfg(feature = "postgres")]
use actix_web::{web, App};

use super::target::Host;
use crate::service::store::{Store, StoreError};

/// 200 `ok` while the store can be read; 503 otherwise, saying whether the database is
/// unreachable or answered an error (the reason is in the service's log).
#[utoipa::path(get, path = "/healthz", tag = "service", operation_id = "healthz",
    responses(
        (status = 200, description = "The store can be read", content_type = "text/plain", body = String, example = "ok\n"),
        (status = 503, description = "The store cannot be read (unreachable, or it answered an error: the reason is in the service's log)", content_type = "text/plain", body = String),
    ))]
/// The service's, not a model's: it answers while any model runs or none (`default` destroyed).
pub(super) async fn healthz(host: Host) -> HttpResponse {
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
pub(super) async fn readyz(host: Host) -> HttpResponse {
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
pub(crate) fn start_waiting_server(
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
