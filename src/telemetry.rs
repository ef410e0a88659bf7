//! Logging: a message plus queryable fields (`job.id`, `duration_ms`), as text for a
//! terminal or JSON (`JOBLEDGER_LOG_FORMAT=json`) for a log pipeline. And traces:
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, spans (one per GraphQL operation, one
//! per attempt with its provider call inside) go to that OpenTelemetry collector over
//! OTLP/HTTP, and log lines inside a span carry its `trace_id`.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::io::IsTerminal;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The variable that turns tracing on: the collector's base URL (`http://host:4318`).
pub const OTLP_ENDPOINT_VARIABLE: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Installs the global subscriber; `RUST_LOG` filters (default `info`). Returns the
/// tracer provider when traces are exported: shut it down at exit to send the last.
pub fn init() -> Option<SdkTracerProvider> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter());
    // Colours only for a terminal: a log file or pipeline would get escape codes.
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let logs = if json_logs() {
        logs.json().boxed()
    } else {
        logs.boxed()
    };
    let endpoint = std::env::var(OTLP_ENDPOINT_VARIABLE)
        .ok()
        .filter(|endpoint| !endpoint.trim().is_empty());
    let provider = endpoint.and_then(|endpoint| match tracer_provider(&endpoint) {
        Ok(provider) => Some(provider),
        Err(error) => {
            eprintln!("traces are off: the OTLP exporter for {endpoint} failed: {error}");
            None
        }
    });
    tracing_subscriber::registry()
        .with(provider.as_ref().map(traces_layer))
        .with(logs)
        .with(filter)
        .init();
    provider
}

/// Whether logs are JSON lines (`JOBLEDGER_LOG_FORMAT=json`) rather than text.
pub fn json_logs() -> bool {
    std::env::var("JOBLEDGER_LOG_FORMAT").is_ok_and(|format| format == "json")
}

/// Reports the error that stopped the process, once: as a log line when logs go to a
/// pipeline, else as one plain line for the operator at the terminal (a log line
/// beside it said the same thing twice).
pub fn report_fatal(error: &dyn std::fmt::Display) {
    if json_logs() {
        tracing::error!(error = %error, "jobledger stopped with an error");
    } else {
        eprintln!("error: {error}");
    }
}

/// What is logged and traced without `RUST_LOG`: `info` and up, but only warnings
/// from the database drivers, whose per-statement spans would drown the rest.
fn default_filter() -> EnvFilter {
    EnvFilter::new("info,sqlx=warn,sea_orm=warn")
}

/// A provider exporting spans in batches to the collector at `endpoint` (its base URL;
/// spans go to `/v1/traces`) as OTLP/HTTP protobuf.
fn tracer_provider(endpoint: &str) -> Result<SdkTracerProvider, Box<dyn std::error::Error>> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        .build()?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("jobledger").build())
        .build())
}

/// The layer that turns `tracing` spans into OpenTelemetry spans of `provider`.
fn traces_layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + use<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("jobledger"))
}

/// Writes the OpenTelemetry trace id into `span`'s `trace_id` field, so that the log
/// lines inside it can be matched with the trace. Nothing when traces are off.
pub fn record_trace_id(span: &tracing::Span) {
    let context = span.context();
    let trace_id = opentelemetry::trace::TraceContextExt::span(&context)
        .span_context()
        .trace_id();
    if trace_id != opentelemetry::trace::TraceId::INVALID {
        span.record("trace_id", tracing::field::display(trace_id));
    }
}
