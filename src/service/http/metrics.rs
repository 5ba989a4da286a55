//! `/metrics` (the service's, no token) and `/v1/metrics` (one model's, behind the token):
//! OpenMetrics text rendered by the metrics actor from gauges read off the actors' own state.

use actix_web::HttpResponse;

use super::auth::Authorized;
use super::errors::{ApiError, Result};
use super::target::{Host, ModelState, State};
use crate::service::host::DEFAULT_MODEL;
use crate::service::metrics::{Gauges, Render};

#[utoipa::path(get, path = "/metrics", tag = "service", operation_id = "metrics",
    responses((status = 200, description = "OpenMetrics text format 1.0.0 (ends in `# EOF`)",
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String)))]
/// The service's metrics: `default`'s families with the HTTP requests of every model while
/// `default` runs; without it (destroyed, or not running), the service's families alone
/// (requests, uptime, the service store's operations), never a 404 or 503 a scraper would
/// take for a dead service.
pub(super) async fn service_metrics(host: Host) -> Result<HttpResponse> {
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
        None => st.store.read(|s| s.settings()).await?.harvest_mode.unwrap_or_default().to_string(),
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
        #[cfg(feature = "otel")]
        trace_spans_dropped: crate::service::telemetry::spans_dropped(),
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
pub(super) async fn model_metrics(_: Authorized, st: State) -> Result<HttpResponse> {
    metrics(st).await
}
