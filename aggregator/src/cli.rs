//! The `hourglass-aggregator` program: parses the command line, reads the config file, opens the
//! store, binds its ports and runs the aggregator until SIGTERM or SIGINT.
//!
//! On stderr it writes exactly `grpc listening on ADDR`, `admin listening on ADDR` and,
//! unless `--http-listen off`, `http listening on ADDR` once it serves (scripts and tests
//! read the ports from there), and one `error: …` line before exiting 1 when it cannot
//! start. Logs go to stdout.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::{Aggregator, Config, Listeners};
use anyhow::Context;
use clap::Parser;
use hourglass_rpc::process::{LogFormat, announce, shutdown_signal};
use tokio::net::TcpListener;

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
    /// Address of the HTTP port: the JSON query API (/api/v1/, described by
    /// /api/v1/openapi.json) and the dashboard (/), with the gRPC port's TLS and tokens;
    /// `off` for none.
    #[arg(long, env = "HOURGLASS_HTTP_LISTEN", default_value = "0.0.0.0:7702")]
    http_listen: HttpListen,
    /// Directory of the RocksDB store; created if missing. One aggregator per directory.
    #[arg(long, env = "HOURGLASS_DATA_DIR", default_value = "./hourglass-data")]
    data_dir: PathBuf,
    #[command(flatten)]
    tls: hourglass_rpc::tls::ServerTlsFlags,
    /// TOML file with rollup, retention, storage and limits settings; every field has a
    /// default, so the file is optional.
    #[arg(long, env = "HOURGLASS_CONFIG")]
    config: Option<PathBuf>,
    /// Cluster mode: this node's name, in place of `[cluster] node` (a StatefulSet sets
    /// it from the pod's name, so one config file serves every node).
    #[arg(long, env = "HOURGLASS_CLUSTER_NODE")]
    cluster_node: Option<String>,
    /// Cluster mode: the HOST:PORT other nodes dial this node's gRPC port at, in place of
    /// `[cluster] advertise`.
    #[arg(long, env = "HOURGLASS_CLUSTER_ADVERTISE")]
    cluster_advertise: Option<String>,
    /// Log format: human-readable text or one JSON object per line. The level comes from
    /// RUST_LOG (default info).
    #[arg(long, env = "HOURGLASS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// Runs the program with `args` as its command line, `args[0]` being the name it was
/// called by; returns its exit status. `hourglass-aggregator`'s `main`, and `hourglass aggregator` (the
/// same program inside the `hourglass` binary, which the container image ships alone).
pub fn main<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    hourglass_rpc::process::run_server(cli.log_format, "hourglass-aggregator", |runtime| {
        start(cli, runtime)
    })
}

/// Where the HTTP port listens, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HttpListen {
    /// No HTTP port.
    Off,
    /// This address.
    At(SocketAddr),
}

impl std::str::FromStr for HttpListen {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "off" => Ok(HttpListen::Off),
            addr => addr
                .parse()
                .map(HttpListen::At)
                .map_err(|_| format!("{addr:?} is neither HOST:PORT (an IP address) nor off")),
        }
    }
}

fn start(cli: Cli, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let mut config = match &cli.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    config.data_dir = cli.data_dir;
    match (&mut config.cluster, cli.cluster_node, cli.cluster_advertise) {
        (Some(cluster), node, advertise) => {
            if let Some(node) = node {
                cluster.node = node;
            }
            if advertise.is_some() {
                cluster.advertise = advertise;
            }
        }
        (None, None, None) => {}
        (None, _, _) => anyhow::bail!(
            "--cluster-node and --cluster-advertise (HOURGLASS_CLUSTER_NODE, HOURGLASS_CLUSTER_ADVERTISE) need a [cluster] section in the config file"
        ),
    }
    let grpc_tls = cli.tls.server_config("gRPC")?;
    if grpc_tls.is_none() && !cli.listen.ip().is_loopback() {
        tracing::warn!(listen = %cli.listen, "gRPC is plaintext on a non-loopback address: anyone who can reach it can read and write (give --tls-cert and --tls-key)");
    }
    if let HttpListen::At(addr) = cli.http_listen
        && grpc_tls.is_none()
        && !addr.ip().is_loopback()
    {
        tracing::warn!(listen = %addr, "the HTTP API is plaintext on a non-loopback address: anyone who can reach it can read (give --tls-cert and --tls-key, or --http-listen off)");
    }
    // Opened before binding: a data dir held by another process is reported before any
    // port is announced.
    let aggregator = Aggregator::open(config)?;
    runtime.block_on(async move {
        let shutdown = shutdown_signal().context("watching SIGTERM and SIGINT")?;
        let grpc = TcpListener::bind(cli.listen)
            .await
            .with_context(|| format!("cannot listen on {} (--listen)", cli.listen))?;
        let admin = TcpListener::bind(cli.admin_listen)
            .await
            .with_context(|| format!("cannot listen on {} (--admin-listen)", cli.admin_listen))?;
        let http = match cli.http_listen {
            HttpListen::Off => None,
            HttpListen::At(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr} (--http-listen)"))?,
            ),
        };
        announce("grpc", grpc.local_addr()?);
        announce("admin", admin.local_addr()?);
        if let Some(http) = &http {
            announce("http", http.local_addr()?);
        }
        aggregator
            .with_http(http)
            .serve(
                Listeners {
                    grpc,
                    admin,
                    grpc_tls,
                },
                shutdown,
            )
            .await?;
        anyhow::Ok(())
    })?;
    tracing::info!("stopped");
    Ok(())
}
