//! A span processor that never blocks the code that ends a span: a finished span goes into a
//! bounded queue, or is dropped and counted when the queue is full (the SDK's batch processor
//! keeps its drop count to itself: it only logs it). One thread of its own takes the spans
//! out, in batches of at most [`MAX_BATCH`] or every [`EVERY`], and hands them to the exporter,
//! whose calls are bounded by their own deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use tokio::time::Instant;

/// The most spans one export carries.
pub(super) const MAX_BATCH: usize = 512;
/// How long a span waits at most before its batch is exported.
pub(super) const EVERY: Duration = Duration::from_secs(1);

/// What the exporting thread is told. (A span is nearly every message: boxed, each would cost
/// an allocation more.)
#[allow(clippy::large_enum_variant)]
enum Msg {
    Span(SpanData),
    Resource(Resource),
    Flush(SyncSender<OTelSdkResult>),
    Shutdown(SyncSender<OTelSdkResult>),
}

/// The processor: the queue's sending end and the count of spans dropped.
#[derive(Debug)]
pub(super) struct BoundedProcessor {
    queue: SyncSender<Msg>,
    dropped: Arc<AtomicU64>,
}

impl BoundedProcessor {
    /// Starts the exporting thread over `exporter`, behind a queue of `capacity` spans;
    /// `dropped` counts the spans the full queue turned away.
    pub(super) fn start<E: SpanExporter + 'static>(
        exporter: E,
        capacity: usize,
        dropped: Arc<AtomicU64>,
    ) -> std::io::Result<Self> {
        let (queue, spans) = sync_channel(capacity);
        std::thread::Builder::new().name("otlp-export".into()).spawn(move || export_loop(exporter, spans))?;
        Ok(Self { queue, dropped })
    }

    /// Asks the exporting thread for `what` and waits at most `within` for its answer.
    fn ask(&self, what: fn(SyncSender<OTelSdkResult>) -> Msg, within: Duration) -> OTelSdkResult {
        let (answer, answered) = sync_channel(1);
        // Not on a span's path (a flush, the shutdown): it may wait for room in the queue,
        // which the exporting thread empties.
        self.queue.send(what(answer)).map_err(|_| OTelSdkError::AlreadyShutdown)?;
        answered.recv_timeout(within).map_err(|_| OTelSdkError::Timeout(within))?
    }
}

impl SpanProcessor for BoundedProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.queue.try_send(Msg::Span(span)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Msg::Flush, Duration::from_secs(10))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.ask(Msg::Shutdown, timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        let _ = self.queue.send(Msg::Resource(resource.clone()));
    }
}

/// The exporting thread: batches the spans and exports each batch (a failed export is logged
/// at debug and its spans are lost: the export never holds anything up).
fn export_loop<E: SpanExporter>(mut exporter: E, spans: Receiver<Msg>) {
    // The exports' own work makes no spans.
    let _quiet = Context::enter_telemetry_suppressed_scope();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut due = Instant::now() + EVERY;
    let export = |exporter: &E, batch: &mut Vec<SpanData>| -> OTelSdkResult {
        if batch.is_empty() {
            return Ok(());
        }
        let sent = futures::executor::block_on(exporter.export(std::mem::take(batch)));
        if let Err(e) = &sent {
            tracing::debug!(error = %e, "a batch of spans was not exported");
        }
        sent
    };
    loop {
        match spans.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Ok(Msg::Span(span)) => {
                batch.push(span);
                if batch.len() >= MAX_BATCH {
                    let _ = export(&exporter, &mut batch);
                    due = Instant::now() + EVERY;
                }
            }
            Ok(Msg::Resource(r)) => exporter.set_resource(&r),
            Ok(Msg::Flush(answer)) => {
                let _ = answer.send(export(&exporter, &mut batch));
            }
            Ok(Msg::Shutdown(answer)) => {
                while let Ok(Msg::Span(span)) = spans.try_recv() {
                    batch.push(span);
                }
                let _ = answer.send(export(&exporter, &mut batch).and(exporter.shutdown()));
                return;
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = export(&exporter, &mut batch);
                due = Instant::now() + EVERY;
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = export(&exporter, &mut batch);
                return;
            }
        }
    }
}
