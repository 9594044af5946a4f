//! Logs and traces of sandboxd and its operator.
//!
//! [`init`] sets up the process's logs (to stderr, as text or JSON lines, filtered by
//! `RUST_LOG`) and, only when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, the standard variables), OpenTelemetry spans sent over
//! OTLP/HTTP with JSON bodies by a batch processor on a thread of its own
//! (`OTEL_BSP_SCHEDULE_DELAY` and the other standard variables apply). Without an endpoint no
//! span is made for OpenTelemetry and nothing is sent: a request costs what it did before.
//!
//! The W3C trace context travels as a `traceparent` string: [`parent`] makes a span the child
//! of one (a header, an annotation), [`traceparent`] names the current span for the next hop.
//! With tracing off, [`traceparent`] is `None` and callers pass on the one they were given.

use std::collections::HashMap;
use std::sync::OnceLock;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The header, and the annotation's last segment, that carries the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The environment variables that turn tracing on (either one).
pub const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The provider, once tracing is on.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Whether spans are sent (an OTLP endpoint was configured and its exporter built).
pub fn enabled() -> bool {
    PROVIDER.get().is_some()
}

/// What [`init`] set up: flushes the spans still queued when dropped (at the process's end).
#[must_use = "spans still queued are sent when the guard is dropped"]
pub struct Guard(());

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = PROVIDER.get() {
            // The exporter's blocking client must not be used on a runtime's thread.
            let provider = provider.clone();
            let _ = std::thread::spawn(move || provider.shutdown()).join();
        }
    }
}

/// Sets up logs and, with an OTLP endpoint configured, traces for `service` (the
/// `service.name` of its spans). `json`: logs as JSON lines. Spans are made for the targets of
/// `crates` at INFO and above, whatever `RUST_LOG` keeps of the logs. An endpoint whose
/// exporter cannot be built is said in the log and tracing stays off: a trace is never a
/// reason not to start.
pub fn init(service: &'static str, crates: &[&str], json: bool) -> Guard {
    let filter =
        || tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter())
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(filter())
            .boxed()
    };
    let (traces, failed) = match exporter() {
        None => (None, None),
        Some(Err(e)) => (None, Some(e)),
        Some(Ok(exporter)) => {
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name(service)
                        .build(),
                )
                .build();
            let tracer = provider.tracer(service);
            let _ = PROVIDER.set(provider);
            let targets = crates
                .iter()
                .fold(tracing_subscriber::filter::Targets::new(), |t, c| {
                    t.with_target(*c, tracing::Level::INFO)
                });
            (
                Some(
                    tracing_opentelemetry::layer()
                        .with_tracer(tracer)
                        .with_filter(targets),
                ),
                None,
            )
        }
    };
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .init();
    if let Some(e) = failed {
        tracing::warn!(error = %e, "the OTLP endpoint is configured but its exporter cannot be built: no spans are sent");
    }
    Guard(())
}

/// The OTLP exporter when an endpoint is configured.
fn exporter() -> Option<Result<opentelemetry_otlp::SpanExporter, String>> {
    use opentelemetry_otlp::{Protocol, WithExportConfig as _};
    let configured = ENDPOINT_VARS
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|e| !e.trim().is_empty()));
    if !configured {
        return None;
    }
    // An https:// endpoint is verified with the provider the rest of the process uses.
    sandboxd_api::tls::install_provider();
    Some(
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .build()
            .map_err(|e| e.to_string()),
    )
}

/// Makes `span` a child of the W3C `traceparent` (a header's or an annotation's value), before
/// it is entered. A malformed value, or tracing off, leaves it a root: a caller's bad header
/// never fails a request.
pub fn parent(span: &tracing::Span, traceparent: &str) {
    if !enabled() {
        return;
    }
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// The W3C `traceparent` of the current span, for the next hop; `None` with tracing off.
pub fn traceparent() -> Option<String> {
    if !enabled() {
        return None;
    }
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Whether `value` is a W3C `traceparent` as version 00 writes it
/// (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`, ids not all zero): what is carried
/// to a sandbox's run and kept on a session, checked before it is.
pub fn valid(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    matches!(parts.as_slice(), [v, t, s, f]
        if *v == "00" && hex(t, 32) && hex(s, 16) && hex(f, 2)
            && t.bytes().any(|b| b != b'0') && s.bytes().any(|b| b != b'0'))
}

#[cfg(test)]
mod tests {
    use super::valid;

    #[test]
    fn only_a_version_00_traceparent_is_valid() {
        assert!(valid(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nx: y",
        ] {
            assert!(!valid(bad), "{bad:?}");
        }
    }
}
