//! `hourglass-aggregator`: parses the command line, reads the config file, opens the
//! store, binds the two ports and runs the aggregator until SIGTERM or SIGINT.
//!
//! On stderr it writes exactly `grpc listening on ADDR` and `admin listening on ADDR`
//! once it serves (scripts and tests read the ports from there), and one `error: …` line
//! before exiting 1 when it cannot start. Logs go to stdout.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use hourglass_aggregator::{Aggregator, Config, Listeners};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// The hourglass aggregator: stores the sketches agents push and answers queries by
/// merging them.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Address of the gRPC port (Collector, Query, health, reflection).
    #[arg(long, env = "HOURGLASS_LISTEN", default_value = "0.0.0.0:7700")]
    listen: SocketAddr,
    /// Address of the admin HTTP port (/metrics, /healthz, /readyz).
    #[arg(long, env = "HOURGLASS_ADMIN_LISTEN", default_value = "0.0.0.0:7701")]
    admin_listen: SocketAddr,
    /// Directory of the RocksDB store; created if missing. One aggregator per directory.
    #[arg(long, env = "HOURGLASS_DATA_DIR", default_value = "./hourglass-data")]
    data_dir: PathBuf,
    /// TOML file with rollup, retention, storage and limits settings; every field has a
    /// default, so the file is optional.
    #[arg(long, env = "HOURGLASS_CONFIG")]
    config: Option<PathBuf>,
    /// Log format: human-readable text or one JSON object per line. The level comes from
    /// RUST_LOG (default info).
    #[arg(long, env = "HOURGLASS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

fn init_logging(format: LogFormat) {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match start(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn start(cli: Cli) -> anyhow::Result<()> {
    let mut config = match &cli.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    config.data_dir = cli.data_dir;
    // Opened before binding: a data dir held by another process is reported before any
    // port is announced.
    let aggregator = Aggregator::open(config)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let shutdown = shutdown_signal()?;
        let grpc = TcpListener::bind(cli.listen)
            .await
            .with_context(|| format!("cannot listen on {} (--listen)", cli.listen))?;
        let admin = TcpListener::bind(cli.admin_listen)
            .await
            .with_context(|| format!("cannot listen on {} (--admin-listen)", cli.admin_listen))?;
        for (what, listener) in [("grpc", &grpc), ("admin", &admin)] {
            let addr = listener.local_addr()?;
            tracing::info!("{what} listening on {addr}");
            eprintln!("{what} listening on {addr}");
        }
        aggregator.serve(Listeners { grpc, admin }, shutdown).await
    })?;
    tracing::info!("stopped");
    Ok(())
}

/// Watches SIGTERM and SIGINT (Ctrl-C) from now on; the returned future completes on
/// either.
///
/// The handlers are installed before the ports are announced: a signal that arrives
/// right after the announcement must stop the aggregator gracefully, not by the default
/// action that kills it mid-write.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("watching SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("watching SIGINT")?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = int.recv() => tracing::info!("SIGINT received"),
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}
