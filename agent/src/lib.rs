//! # hourglass-agent
//!
//! The agent runs on every host. Applications hand it events — DogStatsD lines over UDP
//! or a Unix datagram socket, or batches over the gRPC `Ingest` service — and it keeps,
//! per series and UTC hour of the event's own time, cumulative sketches that it ships to
//! the aggregator as snapshots, effectively once (DESIGN §2, §3, §6).
//!
//! | module | what it is |
//! |---|---|
//! | [`statsd`] | the DogStatsD line parser: borrows, never allocates, never panics |
//! | [`table`] | the sketches per (series, hour), their versions and acknowledgements, limits |
//! | [`ingest`] | the datagram receivers (`recvmmsg` bursts) and the gRPC `Ingest` service |
//! | [`shipper`] | flushes: versions, checkpoint, push with backoff, freeing closed hours |
//! | [`checkpoint`] | the atomic checkpoint file and its hostile-input reader |
//! | [`admin`] | `/metrics`, `/healthz`, `/readyz` |
//! | [`metrics`] | the Prometheus counters and gauges |
//! | [`config`] | the configuration file, its defaults and validation |
//! | [`cli`] | the `hourglass-agent` program (`main.rs`, `hourglass agent`): flags, start-up, the ports it announces |
//!
//! [`Agent::open`] takes the data dir (one agent per directory) and restores the
//! checkpoint, or starts a new epoch when there is none or it is damaged; [`Agent::serve`]
//! runs until its shutdown future completes, then stops taking events, makes a final
//! flush bounded in time, and writes a last checkpoint.

pub mod admin;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod ingest;
pub mod metrics;
pub mod shipper;
pub mod statsd;
pub mod table;

use std::fs::File;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hourglass_rpc::proto::v1;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::codec::CompressionEncoding;

pub use config::Config;

use crate::metrics::Metrics;
use crate::table::Table;

/// The largest Ingest request, in bytes: far above any sane batch of events (the handler
/// bounds events per call), low enough that one request cannot take the host's memory.
const MAX_INGEST_MESSAGE: usize = 256 << 20;

/// Who the agent is and where it ships.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server name, unique in the fleet.
    pub server_name: String,
    /// The server's labels.
    pub labels: Vec<(String, String)>,
    /// The aggregator's URL, `http://host:port`, or `https://` for TLS.
    pub aggregator: String,
    /// TLS to the aggregator: its CA, and this agent's certificate for mutual TLS.
    pub aggregator_tls: hourglass_rpc::tls::ClientTls,
    /// The `authorization` value for an aggregator that requires a token
    /// ([`hourglass_rpc::tls::bearer_header`]).
    pub aggregator_authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    /// Where the checkpoint lives.
    pub data_dir: PathBuf,
    /// Everything else.
    pub config: Config,
}

/// The sockets the agent serves on, bound by the caller (port 0 in tests).
#[derive(Debug)]
pub struct Listeners {
    /// DogStatsD over UDP, if enabled.
    pub statsd: Option<std::net::UdpSocket>,
    /// DogStatsD over a Unix datagram socket, if enabled.
    pub statsd_unix: Option<std::os::unix::net::UnixDatagram>,
    /// The gRPC `Ingest` service.
    pub ingest: TcpListener,
    /// The admin HTTP port.
    pub admin: TcpListener,
    /// TLS for the Ingest port; plaintext when `None`.
    pub ingest_tls: Option<Arc<rustls::ServerConfig>>,
}

/// An agent whose state is loaded, ready to serve.
pub struct Agent {
    options: Options,
    config: Arc<Config>,
    table: Arc<Mutex<Table>>,
    metrics: Arc<Metrics>,
    /// Where the checkpoint log read at start can be appended to.
    resume: Option<checkpoint::LogPosition>,
    // Held for the agent's life: the lock on the data dir.
    _lock: File,
}

/// Why the agent could not start, or stopped with an error. Each names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration is invalid; the error names the field.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The server name breaks the naming rule the aggregator enforces.
    #[error("{0} (--server-name, or the hostname)")]
    ServerName(hourglass_rpc::series::NameError),
    /// The data dir cannot be created or written.
    #[error("cannot {action} the data dir {}", dir.display())]
    DataDir {
        /// What was tried: `create`, `write in`.
        action: &'static str,
        /// The data dir.
        dir: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// Another agent holds the data dir's lock.
    #[error("data dir {} is in use by another agent (one agent per data dir)", .0.display())]
    DataDirInUse(PathBuf),
    /// The checkpoint in the data dir is another server's.
    #[error(
        "the checkpoint in {} belongs to server {found:?}, and this agent is {this:?}: start it as {found:?}, or give it a data dir of its own",
        dir.display()
    )]
    OtherServersCheckpoint {
        /// The data dir.
        dir: PathBuf,
        /// The server the checkpoint belongs to.
        found: String,
        /// This agent's server name.
        this: String,
    },
    /// The checkpoint exists but cannot be read (permissions, I/O); it is left as it is.
    #[error(
        "cannot read the checkpoint in {}: {error} (fix the cause and start again; the checkpoint is left as it is)",
        dir.display()
    )]
    CheckpointUnreadable {
        /// The data dir.
        dir: PathBuf,
        /// The system's error (in the message, so not a `source`: said once).
        error: std::io::Error,
    },
    /// The aggregator's address or TLS settings are unusable.
    #[error("--aggregator: {0}")]
    Aggregator(hourglass_rpc::tls::TlsError),
    /// A DogStatsD socket could not be set up.
    #[error("configuring the {what} socket")]
    Socket {
        /// Which socket.
        what: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// The gRPC Ingest server failed.
    #[error("gRPC ingest server failed: {0}")]
    Grpc(tonic::transport::Error),
    /// The admin HTTP server failed.
    #[error("admin server failed: {0}")]
    Admin(std::io::Error),
    /// A task or thread could not start, panicked or was cancelled.
    #[error("{what} task failed: {detail}")]
    Task {
        /// Which task.
        what: &'static str,
        /// How it ended.
        detail: String,
    },
}

impl Agent {
    /// Validates the options, locks the data dir and restores its checkpoint.
    pub fn open(options: Options) -> Result<Agent, AgentError> {
        options.config.validate()?;
        // The aggregator's rule (one function for both): a name it would refuse on every
        // push is an error now, not a stream of dropped snapshots later.
        hourglass_rpc::series::validate_server_name(&options.server_name)
            .map_err(AgentError::ServerName)?;
        let dir = &options.data_dir;
        let data_dir = |action| {
            move |source| AgentError::DataDir {
                action,
                dir: dir.clone(),
                source,
            }
        };
        std::fs::create_dir_all(dir).map_err(data_dir("create"))?;
        let lock = File::create(dir.join("lock")).map_err(data_dir("write in"))?;
        if lock.try_lock().is_err() {
            return Err(AgentError::DataDirInUse(dir.clone()));
        }
        // A writer killed mid-checkpoint leaves its temporary file; with the lock held, no
        // writer can be using one, and each can be as large as the whole table.
        match checkpoint::remove_leftovers(dir) {
            Ok(0) => {}
            Ok(removed) => tracing::info!(
                removed,
                dir = %dir.display(),
                "removed temporary checkpoint files left by an interrupted write"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                dir = %dir.display(),
                "could not remove temporary checkpoint files left by an interrupted write"
            ),
        }
        let config = Arc::new(options.config.clone());
        let metrics = Arc::new(Metrics::new());
        let (table, resume) = restore(&config, &options, &metrics)?;
        metrics.epoch.set(table.epoch());
        metrics
            .backlog_max_bytes
            .set(i64::try_from(config.max_backlog_bytes()).unwrap_or(i64::MAX));
        Ok(Agent {
            options,
            config,
            table: Arc::new(Mutex::new(table)),
            metrics,
            resume,
            _lock: lock,
        })
    }

    /// The epoch of the agent's state.
    pub fn epoch(&self) -> u64 {
        crate::table::lock(&self.table).epoch()
    }

    /// Serves until `shutdown` completes; then stops taking events, flushes (bounded by
    /// `shipping.shutdown_timeout`) and checkpoints.
    pub async fn serve(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), AgentError> {
        let Agent {
            options,
            config,
            table,
            metrics,
            resume,
            _lock,
        } = self;
        let stop = hourglass_rpc::process::Stop::new(shutdown);
        let ingesting = Arc::new(AtomicBool::new(true));

        // Datagram receivers: one thread per socket, polling `stop_udp` between bursts.
        let stop_udp = Arc::new(AtomicBool::new(false));
        let receivers = start_receivers(
            listeners.statsd,
            listeners.statsd_unix,
            &table,
            &metrics,
            &stop_udp,
        )?;

        let admin = tokio::spawn(admin::serve(
            listeners.admin,
            admin::AdminState {
                table: Arc::clone(&table),
                metrics: Arc::clone(&metrics),
                ingesting: Arc::clone(&ingesting),
            },
            stop.stopped(),
        ));

        // The shipper's own stop comes after ingest has stopped, so its final flush sees
        // every event that was acknowledged.
        let (ship_stop_tx, ship_stop_rx) = watch::channel(false);
        let shipper = new_shipper(&options, &table, &metrics, &config)?;
        if let Some(position) = resume {
            shipper.resume_checkpoint(position);
        }
        let (shipping, ship_died_rx) = spawn_shipper(shipper, ship_stop_rx);

        let grpc = serve_ingest(
            listeners.ingest,
            listeners.ingest_tls,
            ingest::IngestService::new(
                Arc::clone(&table),
                Arc::clone(&metrics),
                Arc::clone(&config),
                Arc::clone(&ingesting),
            ),
            Arc::clone(&metrics),
            grpc_stop(stop.stopped(), ship_died_rx),
        )
        .await;
        // Under the table's lock: an Ingest request still running (the gRPC drain is
        // bounded) added its events before this, and the final flush takes them, or is
        // refused after it.
        ingest::stop_taking(&table, &ingesting);
        tracing::info!("stopped taking events");
        stop_udp.store(true, Ordering::Relaxed);
        for r in receivers {
            let _ = r.join();
        }
        let _ = ship_stop_tx.send(true);
        let shipped = shipping.await;
        stop.release();
        let admin = admin.await;
        stopped_cleanly(grpc, shipped, admin)
    }
}

/// What ends the gRPC server: `stopped` (the agent's stop), or the shipping task ending on
/// its own (`ship_died`, [`spawn_shipper`]), since an agent whose shipper is gone would take
/// events it can never ship.
async fn grpc_stop(
    stopped: impl Future<Output = ()>,
    ship_died: tokio::sync::oneshot::Receiver<()>,
) {
    tokio::select! {
        _ = stopped => {}
        _ = ship_died => tracing::error!("the shipping task ended on its own; stopping"),
    }
}

/// The agent's end: an error of the gRPC server, the shipping task or the admin server,
/// in that order, or `Ok` when all three stopped cleanly.
fn stopped_cleanly(
    grpc: Result<(), tonic::transport::Error>,
    shipped: Result<Result<(), tokio::task::JoinError>, tokio::task::JoinError>,
    admin: Result<std::io::Result<()>, tokio::task::JoinError>,
) -> Result<(), AgentError> {
    let task = |what| {
        move |e: tokio::task::JoinError| AgentError::Task {
            what,
            detail: e.to_string(),
        }
    };
    grpc.map_err(AgentError::Grpc)?;
    shipped
        .map_err(task("shipping"))?
        .map_err(task("shipping"))?;
    admin
        .map_err(task("admin server"))?
        .map_err(AgentError::Admin)?;
    Ok(())
}

/// Starts a receiver thread for each DogStatsD socket given.
fn start_receivers(
    udp: Option<std::net::UdpSocket>,
    unix: Option<std::os::unix::net::UnixDatagram>,
    table: &Arc<Mutex<Table>>,
    metrics: &Arc<Metrics>,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<std::thread::JoinHandle<()>>, AgentError> {
    let mut receivers = Vec::new();
    if let Some(socket) = udp {
        receivers.push(start_receiver(socket, "statsd-udp", table, metrics, stop)?);
    }
    if let Some(socket) = unix {
        receivers.push(start_receiver(socket, "statsd-unix", table, metrics, stop)?);
    }
    Ok(receivers)
}

/// Runs the shipper until `stop`. Its second value completes when the shipper ends,
/// whether told to or on its own: if it ends on its own (a bug, a panic), the agent would
/// take events it can never ship, so the caller stops everything instead.
fn spawn_shipper(
    shipper: shipper::Shipper,
    stop: watch::Receiver<bool>,
) -> (
    tokio::task::JoinHandle<Result<(), tokio::task::JoinError>>,
    tokio::sync::oneshot::Receiver<()>,
) {
    let (died_tx, died_rx) = tokio::sync::oneshot::channel::<()>();
    let shipping = tokio::spawn(async move {
        let result = tokio::spawn(shipper.run(stop)).await;
        let _ = died_tx.send(());
        result
    });
    (shipping, died_rx)
}

/// Serves the gRPC `Ingest` service and health on `listener` (over TLS when `tls` is
/// given) until `stop` completes, answering requests over the message limit with an
/// error that says so (and counting them).
async fn serve_ingest(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    ingest: ingest::IngestService,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let service = v1::ingest_server::IngestServer::new(ingest)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Zstd)
        .max_decoding_message_size(MAX_INGEST_MESSAGE);
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let too_large = hourglass_rpc::size_limit::SizeLimitLayer::new(
        MAX_INGEST_MESSAGE,
        "the agent's ingest message limit",
        Arc::new(move |method: &str| {
            metrics
                .requests_too_large
                .get_or_create(&metrics::MethodLabel {
                    method: method.to_string(),
                })
                .inc();
        }),
    );
    let router = hourglass_rpc::tls::server()
        .layer(too_large)
        .add_service(health_service)
        .add_service(service);
    hourglass_rpc::tls::serve_router(router, listener, tls, stop).await
}

/// Starts the thread that receives DogStatsD datagrams on `socket` (named `name`) into
/// `table` until `stop`, with a large receive buffer and a read timeout.
fn start_receiver(
    socket: impl ingest::DatagramSocket,
    name: &'static str,
    table: &Arc<Mutex<Table>>,
    metrics: &Arc<Metrics>,
    stop: &Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, AgentError> {
    let granted = ingest::prepare_socket(&socket)
        .map_err(|source| AgentError::Socket { what: name, source })?;
    tracing::info!(receive_buffer = granted, "{name} receiving");
    let handler = ingest::StatsdHandler::new(Arc::clone(table), Arc::clone(metrics));
    let stop = Arc::clone(stop);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || ingest::receive_loop(socket, handler, stop))
        .map_err(|e| AgentError::Task {
            what: name,
            detail: e.to_string(),
        })
}

/// The shipper of `table` to the aggregator of `options`, over a channel that connects
/// on first use (an aggregator that is down at start is retried, not fatal).
fn new_shipper(
    options: &Options,
    table: &Arc<Mutex<Table>>,
    metrics: &Arc<Metrics>,
    config: &Arc<Config>,
) -> Result<shipper::Shipper, AgentError> {
    let channel = options
        .aggregator_tls
        .endpoint(&options.aggregator)
        .map_err(AgentError::Aggregator)?
        .connect_timeout(std::time::Duration::from_secs(5))
        .tcp_nodelay(true)
        .connect_lazy();
    let server = v1::Server::with_labels(&options.server_name, &options.labels);
    Ok(shipper::Shipper::new(
        Arc::clone(table),
        Arc::clone(metrics),
        Arc::clone(config),
        options.data_dir.clone(),
        server,
        channel,
        options.aggregator_authorization.clone(),
    ))
}

/// The table of the checkpoint in the data dir, or an empty one in a new epoch — with a
/// loud log line and a metric — when there is none or it is damaged.
///
/// A checkpoint of another server is an error: continuing its epoch under this name would
/// ship its cumulative sketches a second time. So is a checkpoint that cannot be read for
/// a reason other than its content (permissions, I/O): the state may be intact.
fn restore(
    config: &Arc<Config>,
    options: &Options,
    metrics: &Metrics,
) -> Result<(Table, Option<checkpoint::LogPosition>), AgentError> {
    let dir = &options.data_dir;
    let new_epoch = || {
        // Microseconds since the Unix epoch: unique per start of this server, and growing.
        (hourglass_rpc::time::since_unix_epoch().as_micros() as u64).max(1)
    };
    let lost = |reason: &'static str| {
        metrics
            .checkpoint_lost
            .get_or_create(&metrics::ReasonLabel { reason })
            .inc();
    };
    match checkpoint::read(dir) {
        Ok(Some(loaded)) if loaded.server != options.server_name => {
            Err(AgentError::OtherServersCheckpoint {
                dir: dir.clone(),
                found: loaded.server,
                this: options.server_name.clone(),
            })
        }
        Ok(Some(loaded)) => Ok(continue_epoch(config, loaded)),
        Ok(None) => {
            let epoch = new_epoch();
            lost("missing");
            tracing::warn!(
                epoch,
                dir = %dir.display(),
                "NO CHECKPOINT in the data dir: starting a new epoch (expected on a first start; otherwise the agent's earlier state is gone, and what it had not shipped is lost)"
            );
            Ok((Table::new(Arc::clone(config), epoch), None))
        }
        Err(checkpoint::CheckpointError::Io(error)) => Err(AgentError::CheckpointUnreadable {
            dir: dir.clone(),
            error,
        }),
        Err(e) => {
            let epoch = new_epoch();
            lost("corrupt");
            let aside = dir.join(format!("checkpoint.corrupt-{epoch}"));
            let kept = std::fs::rename(checkpoint::path(dir), &aside).is_ok();
            tracing::error!(
                error = %e,
                epoch,
                kept_as = %if kept { aside.display().to_string() } else { "(could not move it aside)".into() },
                "CHECKPOINT UNUSABLE: starting a new epoch; what it held and had not been shipped is lost"
            );
            Ok((Table::new(Arc::clone(config), epoch), None))
        }
    }
}

/// The table of a checkpoint of this server: its epoch, versions, closed hours, entries
/// and live hours, continued; with where its log can be appended to.
fn continue_epoch(
    config: &Arc<Config>,
    loaded: checkpoint::Loaded,
) -> (Table, Option<checkpoint::LogPosition>) {
    let mut table = Table::new(Arc::clone(config), loaded.epoch);
    table.raise_last_version(loaded.last_version);
    if let Some(hour) = loaded.closed_through {
        table.close_through(hour);
    }
    let entries = loaded.entries.len();
    let (transactions, torn_bytes, resume) =
        (loaded.transactions, loaded.torn_bytes, loaded.resume);
    for e in loaded.entries {
        table.restore(e.series, e.hour, e.entry);
    }
    for hour in loaded.live_hours {
        table.mark_live(hour);
    }
    tracing::info!(
        epoch = table.epoch(),
        entries,
        log_transactions = transactions,
        "restored the checkpoint; continuing its epoch"
    );
    if torn_bytes > 0 {
        // An append the agent was killed in: its fsync never returned, so no push
        // carried what it held.
        tracing::warn!(
            torn_bytes,
            "ignored the unfinished last transaction of the checkpoint log"
        );
    }
    (table, resume)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(dir: &std::path::Path) -> Options {
        Options {
            server_name: "web-1".into(),
            labels: Vec::new(),
            aggregator: "http://127.0.0.1:1".into(),
            aggregator_tls: hourglass_rpc::tls::ClientTls::default(),
            aggregator_authorization: None,
            data_dir: dir.to_path_buf(),
            config: Config::default(),
        }
    }

    #[test]
    fn opening_removes_temporary_files_of_an_interrupted_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("checkpoint.tmp-4242-0"), vec![7u8; 4096]).unwrap();
        std::fs::write(dir.path().join("checkpoint.tmp-4242-1"), b"").unwrap();
        let agent = Agent::open(options(dir.path())).unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["lock"], "only the lock is left");
        drop(agent);
    }

    /// The binary prints an error with `{:#}` (anyhow: the message, then each source,
    /// joined by ": "), so a variant must not both show its cause and name it as its
    /// source: the line would say the cause twice. These read as before AgentError.
    #[test]
    fn an_error_says_its_cause_once() {
        let printed = |e: AgentError| format!("{:#}", anyhow::Error::from(e));
        let io = || std::io::Error::other("address in use");
        assert_eq!(
            printed(AgentError::Admin(io())),
            "admin server failed: address in use"
        );
        assert_eq!(
            printed(AgentError::Socket {
                what: "statsd-udp",
                source: io(),
            }),
            "configuring the statsd-udp socket: address in use"
        );
        let name = hourglass_rpc::series::validate_server_name("a|b").unwrap_err();
        assert_eq!(
            printed(AgentError::ServerName(name.clone())),
            format!("{name} (--server-name, or the hostname)")
        );
    }
}
