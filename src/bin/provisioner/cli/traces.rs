//! The trace export `serve` starts when asked (issue 37): `--otlp-endpoint URL` (or
//! `otlp_endpoint` in the config file), else the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//! or `OTEL_EXPORTER_OTLP_ENDPOINT`. A build without the `otel` feature refuses the flag and
//! says which build has it.

use super::TraceLayer;

/// The export started: where it posts, and its stop (the spans still queued go out first).
pub(super) struct Traces {
    #[cfg(feature = "otel")]
    inner: provisioner::service::telemetry::Traces,
}

impl Traces {
    /// Where the spans go.
    pub(super) fn url(&self) -> &str {
        #[cfg(feature = "otel")]
        return self.inner.url();
        #[cfg(not(feature = "otel"))]
        ""
    }

    /// Exports what is queued, within a few seconds, and stops.
    pub(super) fn shutdown(self) {
        #[cfg(feature = "otel")]
        self.inner.shutdown();
    }
}

/// Starts the export if `flag` or the environment asks for it: its layer (for the logging) and
/// its handle; `None` if none asks. An error is a sentence for the operator.
///
/// `replica`, the replica's id when one is given, names the service instance
/// (`service.instance.id`).
#[cfg(feature = "otel")]
pub(super) fn start(flag: Option<&str>, replica: Option<&str>) -> Result<Option<(TraceLayer, Traces)>, String> {
    use provisioner::service::telemetry;
    use tracing_subscriber::Layer;
    let Some(url) = telemetry::traces_url(flag, |k| std::env::var(k).ok()).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let (layer, inner) = telemetry::layer::<tracing_subscriber::Registry>(&url, replica).map_err(|e| e.to_string())?;
    // The spans meant for traces, and only those.
    let only = tracing_subscriber::filter::Targets::new().with_target(provisioner::TRACE_TARGET, tracing::Level::TRACE);
    Ok(Some((layer.with_filter(only).boxed(), Traces { inner })))
}

/// Without the `otel` feature: `--otlp-endpoint` is refused, naming the build that has it; the
/// standard variables (set for other programs, maybe) are noted and left alone.
#[cfg(not(feature = "otel"))]
pub(super) fn start(flag: Option<&str>, _replica: Option<&str>) -> Result<Option<(TraceLayer, Traces)>, String> {
    if flag.is_some_and(|f| !f.trim().is_empty()) {
        return Err("--otlp-endpoint needs a build with trace export: cargo build --release --features otel".into());
    }
    for var in ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"] {
        if std::env::var(var).is_ok_and(|v| !v.is_empty()) {
            eprintln!("note: {var} is set, but this build exports no traces (feature otel)");
        }
    }
    Ok(None)
}
