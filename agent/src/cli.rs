//! The `hourglass-agent` program: parses the command line, reads the config file, restores the
//! checkpoint, binds the listeners and runs the agent until SIGTERM or SIGINT.
//!
//! On stderr it writes exactly `statsd listening on ADDR` (when enabled), `ingest
//! listening on ADDR` and `admin listening on ADDR` once it serves (scripts and tests read
//! the ports from there), and one `error: …` line before exiting 1 when it cannot start.
//! Logs go to stdout.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::{Agent, Config, Listeners, Options};
use anyhow::Context;
use clap::Parser;
use hourglass_rpc::process::{LogFormat, announce, shutdown_signal};
use hourglass_sketch::format::Kind;
use tokio::net::TcpListener;

/// The hourglass agent: turns this host's events into hourly sketches and ships them to
/// an aggregator, effectively once.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// This server's name, unique in the fleet. Default: the hostname.
    #[arg(long, env = "HOURGLASS_SERVER_NAME")]
    server_name: Option<String>,
    /// A label of this server, `key=value` (repeat for more), used by queries to select
    /// servers: `--label region=eu --label role=web`. In the environment, comma-separated.
    #[arg(long = "label", env = "HOURGLASS_LABELS", value_delimiter = ',', value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// The aggregator's gRPC address: `host:port` (http://, or https:// when --tls-ca or
    /// --tls-client-cert is given), or a URL `http://host:port` / `https://host:port`.
    #[arg(
        long,
        env = "HOURGLASS_AGGREGATOR",
        default_value = "http://127.0.0.1:7700"
    )]
    aggregator: String,
    /// UDP address for DogStatsD lines; `off` disables it. Loopback by default: open it to
    /// the network only where that is intended.
    #[arg(
        long,
        env = "HOURGLASS_STATSD_LISTEN",
        default_value = "127.0.0.1:8125"
    )]
    statsd_listen: String,
    /// Path of a Unix datagram socket for DogStatsD lines (off unless given). A stale
    /// socket file at the path is replaced.
    #[arg(long, env = "HOURGLASS_STATSD_SOCKET")]
    statsd_socket: Option<PathBuf>,
    /// Address of the gRPC `Ingest` service (and the health service).
    #[arg(
        long,
        env = "HOURGLASS_INGEST_LISTEN",
        default_value = "127.0.0.1:7710"
    )]
    ingest_listen: SocketAddr,
    /// Address of the admin HTTP port (/metrics, /healthz, /readyz).
    #[arg(long, env = "HOURGLASS_ADMIN_LISTEN", default_value = "0.0.0.0:7711")]
    admin_listen: SocketAddr,
    /// Directory of the checkpoint; created if missing. One agent per directory.
    #[arg(
        long,
        env = "HOURGLASS_DATA_DIR",
        default_value = "./hourglass-agent-data"
    )]
    data_dir: PathBuf,
    /// How often changed sketches are shipped and checkpointed [default: 10s, or the
    /// config file's].
    #[arg(long, env = "HOURGLASS_FLUSH_INTERVAL", value_parser = hourglass_rpc::time::parse_duration)]
    flush_interval: Option<Duration>,
    /// How long an hour accepts events after it ends; older events are rejected and
    /// counted [default: 1h, or the config file's].
    #[arg(long, env = "HOURGLASS_LATENESS", value_parser = hourglass_rpc::time::parse_duration)]
    lateness: Option<Duration>,
    /// Sketch kinds of metrics the config file does not list, comma-separated from
    /// distinct, frequency, membership [default: distinct,frequency, or the config file's].
    #[arg(long, env = "HOURGLASS_DEFAULT_KINDS", value_parser = parse_kind_list)]
    default_kinds: Option<KindList>,
    /// TLS and the token for --aggregator.
    #[command(flatten)]
    aggregator_client: hourglass_rpc::tls::ClientTlsFlags,
    #[command(flatten)]
    tls: hourglass_rpc::tls::ServerTlsFlags,
    /// TOML file with per-metric settings, limits and shipping; every field has a
    /// default, so the file is optional.
    #[arg(long, env = "HOURGLASS_CONFIG")]
    config: Option<PathBuf>,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, env = "HOURGLASS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// `--default-kinds`: one value holding a list (clap would take a bare `Vec` for a
/// repeated flag).
#[derive(Debug, Clone)]
struct KindList(Vec<Kind>);

fn parse_kind_list(text: &str) -> Result<KindList, String> {
    crate::config::parse_kinds(text).map(KindList)
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    hourglass_rpc::series::parse_pair(text).map_err(|e| e.to_string())
}

/// Runs the program with `args` as its command line, `args[0]` being the name it was
/// called by; returns its exit status. `hourglass-agent`'s `main`, and `hourglass agent` (the
/// same program inside the `hourglass` binary, which the container image ships alone).
pub fn main<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    tune_allocator();
    hourglass_rpc::process::run_server(cli.log_format, "hourglass-agent", |runtime| {
        start(cli, runtime)
    })
}

/// glibc's malloc, set for an agent's steady churn of same-sized buffers (a request
/// body, a push, a checkpoint's encoding, each up to a few MiB, every flush):
///
/// - one arena: the agent's threads take the table's lock in turn anyway, and blocks one
///   thread frees are then reused by the next, instead of sitting in another arena;
/// - blocks up to 32 MiB come from the heap, not a fresh `mmap` each (glibc's default,
///   128 KiB, rises only as such blocks are freed, and per arena);
/// - free memory above 64 MiB at the heap's top goes back to the system, not every
///   128 KiB.
///
/// Without these, page faults on freshly mapped memory were a tenth of the agent's CPU
/// under load (docs/BENCHMARKS.md, "Ingest CPU"). Called before any thread starts.
#[allow(unsafe_code)] // mallopt(3): no safe binding; see SAFETY
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called before the runtime's
    // threads exist, and an option glibc refuses is left at its default (the result is
    // ignored on purpose: these tune speed, not correctness).
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

/// The host's name: uname(2)'s node name, which is what gethostname(2) returns on Linux.
fn hostname() -> anyhow::Result<String> {
    let name = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    anyhow::ensure!(
        !name.is_empty(),
        "the host has no name (give --server-name)"
    );
    Ok(name)
}

/// A file-size limit (RLIMIT_FSIZE) reached must fail the checkpoint write with EFBIG,
/// like a full disk, not kill the agent with SIGXFSZ and its unshipped sketches.
#[allow(unsafe_code)] // signal(2): neither std nor rustix sets a disposition; see SAFETY
fn ignore_file_size_signal() {
    // SAFETY: setting a signal's disposition to SIG_IGN has no handler to race.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

fn start(cli: Cli, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let config = config(&cli)?;
    let server_name = match &cli.server_name {
        Some(name) => name.clone(),
        None => hostname()?,
    };
    let ingest_tls_config = cli.tls.clone().server_config("Ingest")?;
    let (aggregator, aggregator_tls) = aggregator(&cli)?;
    let aggregator_authorization = cli.aggregator_client.bearer()?;
    let agent = Agent::open(Options {
        server_name,
        labels: cli.labels.clone(),
        aggregator,
        aggregator_tls,
        aggregator_authorization,
        data_dir: cli.data_dir.clone(),
        config,
    })?;
    tracing::info!(epoch = agent.epoch(), "agent state ready");
    ignore_file_size_signal();
    runtime.block_on(async move {
        let shutdown = shutdown_signal().context("watching SIGTERM and SIGINT")?;
        let listeners = bind(&cli, ingest_tls_config).await?;
        agent.serve(listeners, shutdown).await?;
        anyhow::Ok(())
    })?;
    tracing::info!("stopped");
    Ok(())
}

/// The config file's settings (or the defaults), with the flags that override them.
fn config(cli: &Cli) -> anyhow::Result<Config> {
    let mut config = match &cli.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(d) = cli.flush_interval {
        config.flush_interval = d;
    }
    if let Some(d) = cli.lateness {
        config.lateness = d;
    }
    if let Some(kinds) = &cli.default_kinds {
        config.default_kinds = kinds.0.clone();
    }
    Ok(config)
}

/// The aggregator's URL and the TLS to reach it, checked now, so a bad URL or a missing
/// CA is one line at start, not a retry loop. `host:port` is taken too, and means
/// http:// or https:// by the TLS flags.
fn aggregator(cli: &Cli) -> anyhow::Result<(String, hourglass_rpc::tls::ClientTls)> {
    let tls = cli.aggregator_client.settings();
    tls.endpoint(&cli.aggregator).context("--aggregator")?;
    let url = tls.url(&cli.aggregator);
    tracing::info!(
        "shipping to {} over {}",
        url,
        if url.starts_with("https://") {
            "TLS"
        } else {
            "plaintext"
        }
    );
    Ok((url, tls))
}

/// Binds every listener the flags ask for and announces each on stderr (`NAME listening
/// on ADDR`, which scripts and tests read).
async fn bind(
    cli: &Cli,
    ingest_tls: Option<std::sync::Arc<rustls::ServerConfig>>,
) -> anyhow::Result<Listeners> {
    let statsd = match cli.statsd_listen.as_str() {
        "off" | "" => None,
        addr => Some(
            std::net::UdpSocket::bind(addr)
                .with_context(|| format!("cannot listen on UDP {addr} (--statsd-listen)"))?,
        ),
    };
    let statsd_unix = match &cli.statsd_socket {
        Some(path) => Some(bind_unix_datagram(path)?),
        None => None,
    };
    let ingest = TcpListener::bind(cli.ingest_listen)
        .await
        .with_context(|| format!("cannot listen on {} (--ingest-listen)", cli.ingest_listen))?;
    let admin = TcpListener::bind(cli.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (--admin-listen)", cli.admin_listen))?;
    if let Some(s) = &statsd {
        announce("statsd", s.local_addr()?);
    }
    if let Some(path) = &cli.statsd_socket {
        tracing::info!("statsd socket at {}", path.display());
    }
    announce("ingest", ingest.local_addr()?);
    announce("admin", admin.local_addr()?);
    Ok(Listeners {
        statsd,
        statsd_unix,
        ingest,
        admin,
        ingest_tls,
    })
}

/// Binds the DogStatsD Unix datagram socket at `path`, replacing a socket file an earlier
/// run left there (it would make bind fail).
fn bind_unix_datagram(path: &std::path::Path) -> anyhow::Result<std::os::unix::net::UnixDatagram> {
    if std::fs::symlink_metadata(path)
        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
    {
        std::fs::remove_file(path).ok();
    }
    std::os::unix::net::UnixDatagram::bind(path)
        .with_context(|| format!("cannot bind {} (--statsd-socket)", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "hourglass-agent",
            "--default-kinds",
            "distinct,membership",
            "--label",
            "region=eu",
            "--label",
            "role=web",
            "--flush-interval",
            "250ms",
        ])
        .unwrap();
        assert_eq!(
            cli.default_kinds.unwrap().0,
            vec![Kind::Distinct, Kind::Membership]
        );
        assert_eq!(cli.labels.len(), 2);
        assert_eq!(cli.flush_interval, Some(Duration::from_millis(250)));
        assert!(Cli::try_parse_from(["hourglass-agent", "--label", "novalue"]).is_err());
    }
}
