//! The service's spans as OpenTelemetry traces (issue 37, feature `otel`): a `tracing` layer
//! (`tracing-opentelemetry`) over the OpenTelemetry SDK, whose finished spans go to an OTLP/HTTP
//! collector (`export`: protobuf posted by ureq) through a bounded queue that never blocks the
//! code ending a span (`processor`: a full queue drops the span and counts it,
//! [`spans_dropped`], the metric `provisioner_trace_spans_dropped`).
//!
//! Off unless a traces URL is given: `--otlp-endpoint URL` (or `[traces] otlp_endpoint`), else
//! the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the traces URL as it is) or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL, to which `/v1/traces` is added) ([`traces_url`]).
//! The SDK reads `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (default: every trace,
//! `parentbased_always_on`) and `OTEL_SERVICE_NAME` (default here: `provisioner`) itself.

mod export;
mod processor;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Subscriber;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// How many finished spans may wait for export; beyond, they are dropped and counted.
pub const QUEUE: usize = 4096;
/// Each export's deadline (a collector that does not answer holds up only the exporting
/// thread, and at most this long a batch).
const EXPORT_DEADLINE: Duration = Duration::from_secs(5);
/// How long the service waits, when it stops, for the spans still queued to go out.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);

/// Spans dropped since the process started, because the export queue was full: shared by
/// every layer the process installs (one, in practice), read by the metrics.
static DROPPED: OnceLock<Arc<AtomicU64>> = OnceLock::new();

/// How many finished spans the export queue has turned away (0 with export off).
pub fn spans_dropped() -> u64 {
    DROPPED.get().map_or(0, |d| d.load(Ordering::Relaxed))
}

/// A traces URL that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// Not an `http://` or `https://` URL with a host.
    #[error("the OTLP endpoint {url:?} ({from}) is not an http:// or https:// URL")]
    BadEndpoint {
        /// What was given.
        url: String,
        /// Where it came from (the flag, or which variable).
        from: &'static str,
    },
    /// The exporting thread could not be started.
    #[error("starting the span export thread")]
    Thread(#[source] std::io::Error),
}

/// The URL spans are posted to, if export is on: `flag` (`--otlp-endpoint`, a base URL or a
/// whole `.../v1/traces` URL) first, then `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, then
/// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` added, read through `env`. An empty value
/// counts as unset.
pub fn traces_url(flag: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Result<Option<String>, TelemetryError> {
    let given = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
    let (url, from, whole) = match given(flag.map(str::to_owned)) {
        Some(url) => {
            let whole = url.trim_end_matches('/').ends_with("/v1/traces");
            (url, "--otlp-endpoint", whole)
        }
        None => match given(env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
            Some(url) => (url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", true),
            None => match given(env("OTEL_EXPORTER_OTLP_ENDPOINT")) {
                Some(url) => (url, "OTEL_EXPORTER_OTLP_ENDPOINT", false),
                None => return Ok(None),
            },
        },
    };
    let url = url.trim().to_owned();
    let host = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    if host.is_none_or(|h| h.is_empty() || h.starts_with('/')) {
        return Err(TelemetryError::BadEndpoint { url, from });
    }
    Ok(Some(if whole { url } else { format!("{}/v1/traces", url.trim_end_matches('/')) }))
}

/// The export, once installed: flushed and stopped by [`Traces::shutdown`] (or when dropped).
pub struct Traces {
    provider: SdkTracerProvider,
    url: String,
}

impl Traces {
    /// Where the spans go.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Exports what is queued (within a few seconds) and stops the export.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_DEADLINE) {
            tracing::warn!(error = %e, "the last spans were not all exported");
        }
    }
}

/// The layer that exports the spans to `url` (see the module), and its handle. `instance`
/// (a replica's id) is the resource's `service.instance.id`: which replica made a span.
pub fn layer<S>(url: &str, instance: Option<&str>) -> Result<(impl Layer<S> + Send + Sync, Traces), TelemetryError>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let dropped = DROPPED.get_or_init(Arc::default).clone();
    let processor = processor::BoundedProcessor::start(export::OtlpHttp::new(url, EXPORT_DEADLINE), QUEUE, dropped)
        .map_err(TelemetryError::Thread)?;
    // `OTEL_SERVICE_NAME` (and `OTEL_RESOURCE_ATTRIBUTES`) as the SDK reads them; else ours.
    let resource = match std::env::var("OTEL_SERVICE_NAME").ok().filter(|n| !n.is_empty()) {
        Some(_) => Resource::builder(),
        None => Resource::builder().with_service_name("provisioner"),
    };
    let resource = match instance {
        Some(id) => resource.with_attribute(opentelemetry::KeyValue::new("service.instance.id", id.to_owned())),
        None => resource,
    }
    .build();
    let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();
    let tracer = provider.tracer("provisioner");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_target(false);
    Ok((layer, Traces { provider, url: url.to_owned() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn the_traces_url_comes_from_the_flag_then_the_standard_variables() {
        let none: &[(&str, &str)] = &[];
        assert_eq!(traces_url(None, env(none)).unwrap(), None, "off unless asked");
        assert_eq!(traces_url(Some(""), env(none)).unwrap(), None);
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")];
        assert_eq!(traces_url(None, env(&base)).unwrap().as_deref(), Some("http://collector:4318/v1/traces"));
        let both = [base[0], ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c:4318/custom")];
        assert_eq!(traces_url(None, env(&both)).unwrap().as_deref(), Some("https://c:4318/custom"), "as it is");
        let flag = traces_url(Some("http://127.0.0.1:4318"), env(&both)).unwrap();
        assert_eq!(flag.as_deref(), Some("http://127.0.0.1:4318/v1/traces"), "the flag first");
        let whole = traces_url(Some("http://127.0.0.1:4318/v1/traces"), env(none)).unwrap();
        assert_eq!(whole.as_deref(), Some("http://127.0.0.1:4318/v1/traces"));
        for bad in ["collector:4318", "ftp://x", "http://", "http:///v1/traces"] {
            let e = traces_url(Some(bad), env(none)).unwrap_err();
            assert!(e.to_string().contains("--otlp-endpoint") && e.to_string().contains(bad), "{e}");
        }
        let e = traces_url(None, env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "4318")])).unwrap_err();
        assert!(e.to_string().contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{e}");
    }
}
