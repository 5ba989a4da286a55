//! `provisioner simulate --trace FILE` (issue 37): the spans a scenario's run makes on the
//! trace target (`provisioner::TRACE_TARGET`, the same spans `serve` exports), timed by the
//! simulation's virtual clock, written as one OTLP JSON document (`ExportTraceServiceRequest`
//! in the protobuf JSON mapping: hex ids, times as decimal strings), which trace viewers
//! (Jaeger's "upload JSON", an OpenTelemetry collector's `otlpjsonfile` receiver) read.
//!
//! Virtual time 0 (the run's start, announced by the simulator's `simulation starts` event)
//! is written as 2026-01-01T00:00:00Z. Trace and span ids are counted up from 1 in the order
//! the spans begin: the same scenario and seed write the same file, byte for byte.
//!
//! The layer sends each span as it closes down a channel (no lock here); [`TraceFile::write`]
//! takes what came once the run is over. A span still open then (none, in a run that ended)
//! is left out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

use actix_rt::time::Instant;
use serde_json::{json, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Virtual time 0 as Unix time: 2026-01-01T00:00:00Z.
const VIRTUAL_EPOCH_UNIX_NS: u128 = 1_767_225_600 * 1_000_000_000;

/// A span being recorded (kept in the span's extensions until it closes).
struct Open {
    trace: u64,
    span: u64,
    parent: u64,
    name: String,
    start: Instant,
    attributes: Vec<(String, Value)>,
}

/// A span closed.
struct Closed {
    open: Open,
    end: Instant,
}

/// The layer: ids counted up, the run's start, and where closed spans go.
pub struct FileLayer {
    next_trace: AtomicU64,
    next_span: AtomicU64,
    origin: std::sync::Arc<OnceLock<Instant>>,
    closed: mpsc::Sender<Closed>,
}

/// The other end: what the layer recorded, written once the run is over.
pub struct TraceFile {
    origin: std::sync::Arc<OnceLock<Instant>>,
    closed: mpsc::Receiver<Closed>,
}

/// A layer recording the trace target's spans, and the end that writes them.
pub fn layer() -> (FileLayer, TraceFile) {
    let (tx, rx) = mpsc::channel();
    let origin = std::sync::Arc::new(OnceLock::new());
    let layer =
        FileLayer { next_trace: AtomicU64::new(1), next_span: AtomicU64::new(1), origin: origin.clone(), closed: tx };
    (layer, TraceFile { origin, closed: rx })
}

/// Field values as OTLP attribute values (integers as integers, the rest as text).
struct Fields<'a>(&'a mut Vec<(String, Value)>, &'a mut Option<String>);

impl Fields<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "otel.name" {
            *self.1 = value.as_str().map(str::to_owned);
            return;
        }
        match self.0.iter_mut().find(|(k, _)| k == field.name()) {
            Some((_, v)) => *v = value,
            None => self.0.push((field.name().to_owned(), value)),
        }
    }
}

impl Visit for Fields<'_> {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, json!({ "intValue": value.to_string() }));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, json!({ "intValue": value.to_string() }));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, json!({ "boolValue": value }));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, json!({ "stringValue": value }));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, json!({ "stringValue": format!("{value:?}") }));
    }
}

impl<S> Layer<S> for FileLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let parent = match attrs.parent() {
            Some(p) => ctx.span(p),
            None if attrs.is_contextual() => ctx.lookup_current(),
            None => None,
        };
        let parent = parent.and_then(|p| p.extensions().get::<Open>().map(|o| (o.trace, o.span)));
        let (trace, parent) = match parent {
            Some((trace, span)) => (trace, span),
            None => (self.next_trace.fetch_add(1, Ordering::Relaxed), 0),
        };
        let mut name = None;
        let mut attributes = Vec::new();
        attrs.record(&mut Fields(&mut attributes, &mut name));
        let open = Open {
            trace,
            span: self.next_span.fetch_add(1, Ordering::Relaxed),
            parent,
            name: name.unwrap_or_else(|| attrs.metadata().name().to_owned()),
            start: Instant::now(),
            attributes,
        };
        span.extensions_mut().insert(open);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(open) = ext.get_mut::<Open>() {
            let mut name = None;
            values.record(&mut Fields(&mut open.attributes, &mut name));
            if let Some(name) = name {
                open.name = name;
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        struct Message(bool);
        impl Visit for Message {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                self.0 |= field.name() == "message" && format!("{value:?}") == "simulation starts";
            }
        }
        let mut starts = Message(false);
        event.record(&mut starts);
        if starts.0 {
            let _ = self.origin.set(Instant::now());
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let open = span.extensions_mut().remove::<Open>();
        if let Some(open) = open {
            let _ = self.closed.send(Closed { open, end: Instant::now() });
        }
    }
}

impl TraceFile {
    /// The spans recorded so far as one OTLP JSON document, `scenario` naming the run.
    pub fn document(&self, scenario: &str, seed: u64) -> Value {
        let closed: Vec<Closed> = self.closed.try_iter().collect();
        let origin = self.origin.get().copied().or_else(|| closed.iter().map(|c| c.open.start).min());
        let at = |t: Instant| -> String {
            let since = origin.map_or(Duration::ZERO, |o| t.saturating_duration_since(o));
            (VIRTUAL_EPOCH_UNIX_NS + since.as_nanos()).to_string()
        };
        let mut closed = closed;
        // In the order they began (then by id): one order whatever the order of closing.
        closed.sort_by_key(|c| (c.open.trace, c.open.span));
        let spans: Vec<Value> = closed
            .into_iter()
            .map(|c| {
                let attributes: Vec<Value> =
                    c.open.attributes.into_iter().map(|(key, value)| json!({ "key": key, "value": value })).collect();
                json!({
                    "traceId": format!("{:032x}", c.open.trace),
                    "spanId": format!("{:016x}", c.open.span),
                    "parentSpanId": if c.open.parent == 0 { String::new() } else { format!("{:016x}", c.open.parent) },
                    "name": c.open.name,
                    "kind": 1,
                    "startTimeUnixNano": at(c.open.start),
                    "endTimeUnixNano": at(c.end),
                    "attributes": attributes,
                })
            })
            .collect();
        json!({
            "resourceSpans": [{
                "resource": { "attributes": [
                    { "key": "service.name", "value": { "stringValue": "provisioner-simulate" } },
                    { "key": "scenario", "value": { "stringValue": scenario } },
                    { "key": "seed", "value": { "intValue": seed.to_string() } },
                ]},
                "scopeSpans": [{ "scope": { "name": "provisioner" }, "spans": spans }],
            }]
        })
    }
}
