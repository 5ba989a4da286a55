//! Spans meant for traces (issue 37): their `tracing` target, and a machine's trace context as
//! stored with it, so that the work a replica does for a machine joins the trace of the request
//! that added it on another.
//!
//! Every span of a machine's life (the request, the store's commit, the coordinator's pick, the
//! start and its zone decision, cloud calls and record, stops) has target [`TRACE_TARGET`]. The
//! service exports them as OpenTelemetry traces when asked (feature `otel`); its logs never
//! show them, and with no export they are disabled at their call sites (a few loads each).
//!
//! The context is W3C `traceparent` text (`00-{trace id}-{span id}-{flags}`): [`context_of`]
//! reads it off a span, [`continue_from`] makes a new span a child of it, [`link_to`] links a
//! span to it. Without the `otel` feature (or with export off) there is no context: the first
//! answers `None` and the others do nothing.

/// The `tracing` target of the spans meant for traces.
pub const TRACE_TARGET: &str = "provisioner::trace";

/// A span carried with a piece of work to where it is carried out (a start job from the
/// coordinator to a worker): the work's spans are its children there. Compares equal to any
/// other (a span is not part of what the work is).
#[derive(Debug, Clone)]
pub struct Carried(pub tracing::Span);

impl PartialEq for Carried {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Carried {}

impl Carried {
    /// No span (the work is not traced).
    pub fn none() -> Self {
        Self(tracing::Span::none())
    }
}

/// The W3C `traceparent` of `span`, if it is exported (`None` without export, or for a span
/// that is disabled).
pub fn context_of(span: &tracing::Span) -> Option<String> {
    imp::context_of(span)
}

/// Makes `span` a child of the span `traceparent` names (a remote parent: another replica's,
/// or the request's that added a machine). Must come before `span` is first entered; text that
/// is not a `traceparent` is ignored, as is `None`.
pub fn continue_from(span: &tracing::Span, traceparent: Option<&str>) {
    if let Some(parent) = traceparent {
        imp::continue_from(span, parent);
    }
}

/// Links `span` to the span `traceparent` names (a container's start to its host's request).
pub fn link_to(span: &tracing::Span, traceparent: Option<&str>) {
    if let Some(other) = traceparent {
        imp::link_to(span, other);
    }
}

#[cfg(feature = "otel")]
mod imp {
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    pub(super) fn context_of(span: &tracing::Span) -> Option<String> {
        if span.is_disabled() {
            return None;
        }
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8()))
    }

    /// The span context `text` names, if it is a version-00 `traceparent` with non-zero ids.
    pub(super) fn parse(text: &str) -> Option<SpanContext> {
        let mut parts = text.trim().split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if version != "00" || parts.next().is_some() || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
            return None;
        }
        let trace = TraceId::from_hex(trace).ok()?;
        let span = SpanId::from_hex(span).ok()?;
        let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
        let sc = SpanContext::new(trace, span, flags, true, TraceState::default());
        sc.is_valid().then_some(sc)
    }

    pub(super) fn continue_from(span: &tracing::Span, parent: &str) {
        if span.is_disabled() {
            return;
        }
        if let Some(sc) = parse(parent) {
            // Fails only without the OpenTelemetry layer: then nothing is exported anyway.
            let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(sc));
        }
    }

    pub(super) fn link_to(span: &tracing::Span, other: &str) {
        if span.is_disabled() {
            return;
        }
        if let Some(sc) = parse(other) {
            span.add_link(sc);
        }
    }
}

#[cfg(not(feature = "otel"))]
mod imp {
    pub(super) fn context_of(_: &tracing::Span) -> Option<String> {
        None
    }
    pub(super) fn continue_from(_: &tracing::Span, _: &str) {}
    pub(super) fn link_to(_: &tracing::Span, _: &str) {}
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "otel")]
    #[test]
    fn a_traceparent_is_read_only_when_well_formed() {
        use super::imp::parse;
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse(good).expect("a traceparent");
        assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
    }
}
