//! What the two long-running processes (`hourglass-agent`, `hourglass-aggregator`) share
//! as processes: how they log and how they learn to stop.

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// How log lines look (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Logs to stdout in `format`, at the levels of `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a terminal: escape codes in a log file or collector are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
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
