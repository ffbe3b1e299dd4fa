//! What the long-running processes (`hourglass-agent`, `hourglass-aggregator`) and the
//! `hourglass` command share as processes: how they log, how they export traces, and how
//! they learn to stop.
//!
//! Traces: when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (and the other standard `OTEL_*`
//! variables as the OpenTelemetry SDK reads them, such as `OTEL_BSP_SCHEDULE_DELAY`),
//! every `tracing` span is also exported over OTLP/gRPC, with the W3C trace context
//! carried in gRPC metadata from caller to callee ([`inject_context`],
//! [`adopt_remote_parent`]). Unset, nothing is exported and nothing is paid.

use clap::ValueEnum;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines look (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Flushes and stops the trace exporter when dropped; hold it until the process ends.
#[must_use = "traces are flushed when the guard is dropped"]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("traces: flushing the exporter failed: {e}");
        }
    }
}

/// The OTLP tracer provider when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Must be called
/// inside a Tokio runtime, which exports the batches.
fn otlp_provider(service: &str) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok()?;
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!(
                "traces: cannot export to {endpoint} (OTEL_EXPORTER_OTLP_ENDPOINT): {e}; tracing is off"
            );
            return None;
        }
    };
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service.to_string())
                .build(),
        )
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    Some(provider)
}

/// Logs to stdout in `format`, at the levels of `RUST_LOG` (default `info`), and exports
/// spans over OTLP as `service` when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Call it inside
/// a Tokio runtime, and keep the guard.
pub(crate) fn init_logging(format: LogFormat, service: &str) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a terminal: escape codes in a log file or collector are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let text =
        (format == LogFormat::Text).then(|| tracing_subscriber::fmt::layer().with_ansi(ansi));
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
    });
    let provider = otlp_provider(service);
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(service.to_string())));
    tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json)
        .with(otel)
        .init();
    if provider.is_some() {
        tracing::info!("exporting traces over OTLP");
    }
    Telemetry { provider }
}

/// For a command-line client: spans exported over OTLP when configured, no log output.
/// Call it inside a Tokio runtime, and keep the guard.
pub fn init_client_tracing(service: &str) -> Telemetry {
    let provider = otlp_provider(service);
    if let Some(p) = &provider {
        let _ = tracing_subscriber::registry()
            .with(EnvFilter::new("info"))
            .with(tracing_opentelemetry::layer().with_tracer(p.tracer(service.to_string())))
            .try_init();
    }
    Telemetry { provider }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            value.parse(),
        ) {
            self.0.insert(key, value);
        }
    }
}

struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Writes the current span's trace context (`traceparent`) into outgoing metadata.
pub fn inject_context(metadata: &mut tonic::metadata::MetadataMap) {
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&context, &mut MetadataInjector(metadata));
    });
}

/// Makes `span` a child of the caller's span named in incoming metadata, if any.
pub fn adopt_remote_parent(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    let parent =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&MetadataExtractor(metadata)));
    use opentelemetry::trace::TraceContextExt;
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// The whole life of a server process: a Tokio runtime, logging and traces set up on it
/// as `service`, then `start`; the last spans are flushed while the runtime still runs.
/// An error is one `error: …` line on stderr and exit status 1.
///
/// `E` is the binary's error type; it is printed with `{:#}`, which for `anyhow::Error`
/// is the error and its causes on one line.
pub fn run_server<E: std::fmt::Display>(
    format: LogFormat,
    service: &str,
    start: impl FnOnce(&tokio::runtime::Runtime) -> Result<(), E>,
) -> std::process::ExitCode {
    // The runtime comes first: the trace exporter, when configured, runs on it.
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let telemetry = {
        let _entered = runtime.enter();
        init_logging(format, service)
    };
    let result = start(&runtime);
    drop(telemetry);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Watches SIGTERM and SIGINT (Ctrl-C) from now on; the returned future completes on
/// either. Must be called inside a Tokio runtime.
///
/// Install it before announcing ports: a signal that arrives right after the announcement
/// must stop the process gracefully, not by the default action that kills it mid-write.
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static>
{
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}

/// Says that the `what` port of this server listens on `addr`: in the log, and on stderr
/// as exactly `what listening on addr`, the line scripts and tests read the port from.
pub fn announce(what: &str, addr: std::net::SocketAddr) {
    tracing::info!("{what} listening on {addr}");
    eprintln!("{what} listening on {addr}");
}

/// One shutdown, many waiters: a server's tasks (gRPC, admin, background) each wait on
/// their own [`Stop::stopped`].
pub struct Stop {
    rx: tokio::sync::watch::Receiver<bool>,
    watcher: tokio::task::JoinHandle<()>,
}

impl Stop {
    /// Starts watching `shutdown`. Must be called inside a Tokio runtime.
    pub fn new(shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> Stop {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let watcher = tokio::spawn(async move {
            shutdown.await;
            let _ = tx.send(true);
        });
        Stop { rx, watcher }
    }

    /// Completes when shutdown has begun, or when [`Stop::release`] ended the watch.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.rx.clone();
        async move {
            // An error means the sender is gone: the watch ended, so stop anyway.
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    /// Ends the watch, which completes every [`Stop::stopped`] still waiting: for a server
    /// whose main task ended on its own, so the others stop too.
    pub fn release(self) {
        self.watcher.abort();
    }
}

#[cfg(test)]
mod stop_tests {
    use super::Stop;
    use std::time::Duration;

    /// release() ends every stopped() still waiting, though shutdown never comes.
    #[tokio::test]
    async fn release_completes_every_stopped() {
        let stop = Stop::new(std::future::pending::<()>());
        let a = tokio::spawn(stop.stopped());
        let b = stop.stopped();
        stop.release();
        tokio::time::timeout(Duration::from_secs(5), async {
            a.await.unwrap();
            b.await;
        })
        .await
        .expect("stopped() completes after release()");
    }

    /// Shutdown completes every stopped(), made before or after it.
    #[tokio::test]
    async fn shutdown_completes_every_stopped() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let stop = Stop::new(async move {
            let _ = rx.await;
        });
        let before = stop.stopped();
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), before)
            .await
            .expect("stopped() completes on shutdown");
        tokio::time::timeout(Duration::from_secs(5), stop.stopped())
            .await
            .expect("a later stopped() completes at once");
    }
}
