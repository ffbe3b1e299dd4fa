//! # hourglass-aggregator
//!
//! The aggregator keeps every sketch the agents ship, in RocksDB, keyed by series, hour and
//! server, and answers queries over any time range and any subset of servers by merging
//! them (DESIGN §4–§5).
//!
//! This crate is a library; the program ([`cli`], which `main.rs` and `hourglass
//! aggregator` call) only parses its configuration and calls into it. Its layers, each
//! understandable alone:
//!
//! | module | what it is |
//! |---|---|
//! | [`keys`] | the encoding of every storage key: fixed-width big-endian fields, so byte order is time order and one series' week is one range scan |
//! | [`store`] | storage behind the [`store::Store`] trait, the sum of six capability traits: hourly snapshots upserted by version ([`store::Hourly`]), rollups ([`store::Rollups`]), retention ([`store::Retention`]), the series dictionary and server registry ([`store::Dictionaries`]), server liveness and series index ([`store::ServerIndex`]), cluster mode's positions and copies ([`store::Replica`]); [`store::RocksStore`] for production, [`store::MemoryStore`] for tests |
//! | [`planner`] | which hourly rows and rollups answer a selection, merged in the one order that makes both give the same bytes |
//! | `convert` | the translations between proto and the planner and store, and their errors as gRPC status codes |
//! | [`rollup`] | the builder of daily rollups for closed and late-touched days |
//! | [`glob`] | shell-style server name globs |
//! | [`placement`] | a series' partition in cluster mode, from its name alone |
//! | `write` | the write path: the rules a push is admitted by (its checks, the series bound) and the store's write, for the `Collector` service and the cluster's apply loop alike |
//! | [`service`] | the gRPC `Collector` and `Query` services, health and reflection: thin translations between proto and the write path, the store and the planner |
//! | [`admin`] | the admin HTTP port: Prometheus `/metrics`, `/healthz`, `/readyz` |
//! | [`http`] | the HTTP port: the JSON query API under `/api/v1/` (the `Query` service's own calls, as JSON) and the dashboard |
//! | [`metrics`] | the Prometheus counters, histograms and gauges |
//! | [`background`] | the periodic rollup builder and retention |
//! | [`config`] | the configuration file, its defaults and validation |
//! | [`cluster`] | cluster mode on NATS JetStream: pushes published by partition, every node applying the stream (DESIGN §10) |
//! | [`cli`] | the `hourglass-aggregator` program: flags, start-up, the ports it announces |
//!
//! [`run`] is the whole process: it opens the store, serves gRPC and admin on listeners
//! the caller bound, runs the background task, and on shutdown drains in-flight RPCs and
//! closes the store. [`Aggregator::open`] and [`Aggregator::serve`] are the same in two
//! steps, so that `main` can report a data dir held by another process before it
//! announces its ports; [`Aggregator::with_http`] adds the HTTP port between them.
//!
//! Sketches are stored as their framed encoding (docs/FORMAT.md) and decoded with
//! [`hourglass_sketch::Sketch`]; the layout on disk and the RocksDB options are
//! explained in docs/STORAGE.md.

pub mod admin;
pub mod auth;
pub mod background;
pub mod cli;
pub mod cluster;
pub mod config;
pub(crate) mod convert;
pub mod glob;
pub mod http;
pub mod keys;
pub mod metrics;
pub mod placement;
pub mod planner;
pub mod rollup;
pub mod service;
pub mod store;
pub(crate) mod write;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::TcpListener;

pub use config::Config;

use crate::metrics::Metrics;
use crate::store::{RocksStore, Store, StoreError};

/// The two listeners the aggregator serves on, bound by the caller (port 0 in tests).
#[derive(Debug)]
pub struct Listeners {
    /// The gRPC port: `Collector`, `Query`, health and reflection.
    pub grpc: TcpListener,
    /// The admin HTTP port: `/metrics`, `/healthz`, `/readyz`.
    pub admin: TcpListener,
    /// TLS for the gRPC port, and for the HTTP port when it is on
    /// ([`Aggregator::with_http`]); plaintext when `None`.
    pub grpc_tls: Option<std::sync::Arc<rustls::ServerConfig>>,
}

/// Why the aggregator could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AggregatorError {
    /// The configuration is invalid; the error names the field.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The `[auth]` section could not be loaded (a token file, a certificate).
    #[error("config: {0}")]
    Auth(#[from] auth::AuthError),
    /// The store could not be opened, flushed or closed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Grpc(tonic::transport::Error),
    /// Cluster mode could not start: NATS unreachable, the stream refused or mismatched.
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterError),
    /// The admin HTTP server failed.
    #[error("admin server failed: {0}")]
    Admin(std::io::Error),
    /// The HTTP API server failed.
    #[error("HTTP server failed: {0}")]
    Http(std::io::Error),
    /// A task panicked or was cancelled.
    #[error("{what} task failed")]
    Task {
        /// Which task.
        what: &'static str,
        /// How it ended.
        source: tokio::task::JoinError,
    },
}

/// An aggregator whose store is open, ready to serve.
pub struct Aggregator {
    config: Config,
    store: Arc<RocksStore>,
    auth: auth::Auth,
    /// The HTTP port's listener; `None` leaves the port off.
    http: Option<TcpListener>,
}

impl Aggregator {
    /// Validates `config` and opens the store in its data dir. Fails with
    /// [`StoreError::InUse`] when another process holds the directory.
    pub fn open(config: Config) -> Result<Aggregator, AggregatorError> {
        config.validate()?;
        for warning in config.deprecations() {
            tracing::warn!("config: {warning}");
        }
        let auth = auth::Auth::load(&config.auth)?;
        if auth.enabled() {
            tracing::info!(
                tokens = config.auth.tokens.len(),
                "Collector and Query need a bearer token"
            );
        } else {
            tracing::warn!("no [auth] tokens configured: any caller may push and query");
        }
        let store = RocksStore::open(&config.data_dir, &config.store_options())?;
        tracing::info!(data_dir = %config.data_dir.display(), "store open");
        Ok(Aggregator {
            config,
            store: Arc::new(store),
            auth,
            http: None,
        })
    }

    /// Serves the HTTP port ([`http`]: the JSON API and the dashboard) on `listener` too,
    /// with the gRPC port's TLS and the same tokens; `None` leaves it off, as without
    /// this call.
    pub fn with_http(mut self, listener: Option<TcpListener>) -> Aggregator {
        self.http = listener;
        self
    }

    /// Serves until `shutdown` completes; then stops accepting, finishes the RPCs in
    /// flight and the rollup pass in progress, and closes the store.
    pub async fn serve(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), AggregatorError> {
        let Aggregator {
            config,
            store,
            auth,
            http,
        } = self;
        let metrics = Arc::new(Metrics::new());
        let grpc_serving = Arc::new(AtomicBool::new(false));
        // One signal, many listeners: gRPC, admin, HTTP and the background task.
        let stop = hourglass_rpc::process::Stop::new(shutdown);
        // The admin port answers from the start: liveness and metrics while the node
        // joins its cluster ([`join_unless_stopped`]), readiness once gRPC serves.
        let admin = tokio::spawn(admin::serve(
            listeners.admin,
            admin::AdminState {
                store: Arc::clone(&store),
                metrics: Arc::clone(&metrics),
                grpc_serving: Arc::clone(&grpc_serving),
            },
            stop.stopped(),
        ));
        let cluster = match join_unless_stopped(&config, &listeners.grpc, &stop).await {
            Ok(cluster) => cluster,
            Err(failed) => return end_unjoined(failed, stop, admin, store).await,
        };
        let dyn_store: Arc<dyn Store> = store.clone();
        let applying = spawn_apply(cluster.clone(), &dyn_store, &metrics, &config, &stop);
        let background = tokio::spawn(background::run(
            Arc::clone(&dyn_store),
            Arc::clone(&metrics),
            config.clone(),
            stop.stopped(),
        ));

        let http = http.map(|listener| {
            let query = service::QueryService::new(
                Arc::clone(&dyn_store),
                Arc::clone(&metrics),
                config.limits.clone(),
            )
            .retire_after(config.coverage.retire_after)
            .in_cluster(cluster.as_ref().map(|(cluster, _)| Arc::clone(cluster)));
            spawn_http(
                listener,
                query,
                auth.clone(),
                listeners.grpc_tls.clone(),
                &stop,
            )
        });

        grpc_serving.store(true, Ordering::Release);
        let grpc_stop = draining(stop.stopped(), Arc::clone(&grpc_serving));
        let grpc = service::serve(
            listeners.grpc,
            dyn_store,
            Arc::clone(&metrics),
            service::ServeOptions {
                limits: config.limits.clone(),
                retention_hourly: config.retention.hourly,
                retire_after: config.coverage.retire_after,
                auth,
                tls: listeners.grpc_tls,
                cluster: cluster.map(|(cluster, _)| cluster),
            },
            grpc_stop,
        )
        .await;
        grpc_serving.store(false, Ordering::Release);
        // If gRPC failed on its own, stop the rest too.
        stop.release();
        grpc.map_err(AggregatorError::Grpc)
            .and(finish(admin, http, background, applying).await)?;
        close(store)
    }
}

/// The HTTP API on `listener`, until `stop`: it asks `query`, a `Query` service like the
/// one gRPC serves (the same store, metrics, limits and cluster), with the same tokens.
fn spawn_http(
    listener: tokio::net::TcpListener,
    query: service::QueryService,
    auth: auth::Auth,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: &hourglass_rpc::process::Stop,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let state = http::HttpState { query, auth };
    tokio::spawn(http::serve(listener, state, tls, stop.stopped()))
}

/// Cluster mode: joins the cluster ([`join_cluster`]) unless `stop` comes first
/// (`Err(None)`). Joining can take a minute while JetStream elects its leaders; the admin
/// port answers meanwhile, as a liveness probe left unanswered would restart the node.
async fn join_unless_stopped(
    config: &Config,
    grpc: &tokio::net::TcpListener,
    stop: &hourglass_rpc::process::Stop,
) -> Result<Option<(Arc<cluster::Cluster>, String)>, Option<AggregatorError>> {
    tokio::select! {
        joined = join_cluster(config, grpc) => joined.map_err(Some),
        () = stop.stopped() => Err(None),
    }
}

/// The end of a serve that never joined its cluster: the join `failed`, or (`None`) the
/// shutdown came first. Only the admin port was served: it is stopped, and the store
/// closed.
async fn end_unjoined(
    failed: Option<AggregatorError>,
    stop: hourglass_rpc::process::Stop,
    admin: tokio::task::JoinHandle<std::io::Result<()>>,
    store: Arc<RocksStore>,
) -> Result<(), AggregatorError> {
    stop.release();
    let _ = admin.await;
    match failed {
        Some(e) => Err(e),
        None => {
            tracing::info!("stopped while joining the cluster");
            close(store)
        }
    }
}

/// Cluster mode: the task that applies the cluster's stream to `store` as `consumer`, with
/// the write path's checks and limits, until `stop`; `None` without `[cluster]`.
fn spawn_apply(
    cluster: Option<(Arc<cluster::Cluster>, String)>,
    store: &Arc<dyn Store>,
    metrics: &Arc<Metrics>,
    config: &Config,
    stop: &hourglass_rpc::process::Stop,
) -> Option<tokio::task::JoinHandle<()>> {
    cluster.map(|(cluster, consumer)| {
        let applier = write::Writer::new(
            Arc::clone(store),
            Arc::clone(metrics),
            config.limits.clone(),
            config.retention.hourly,
        )
        .applying_with(Arc::clone(cluster.ledger()));
        tokio::spawn(cluster::run(
            cluster,
            consumer,
            applier,
            Arc::clone(metrics),
            stop.stopped(),
        ))
    })
}

/// Completes when `stopped` does, marking gRPC not serving from the moment draining
/// starts, so that no new traffic is sent.
async fn draining(stopped: impl Future<Output = ()>, serving: Arc<AtomicBool>) {
    stopped.await;
    serving.store(false, Ordering::Release);
    tracing::info!("shutting down: draining RPCs in flight");
}

/// Waits for the tasks that run beside gRPC once they were told to stop, and reports the
/// first that failed.
async fn finish(
    admin: tokio::task::JoinHandle<std::io::Result<()>>,
    http: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    background: tokio::task::JoinHandle<()>,
    applying: Option<tokio::task::JoinHandle<()>>,
) -> Result<(), AggregatorError> {
    let task = |what| move |source| AggregatorError::Task { what, source };
    let (admin, background) = tokio::join!(admin, background);
    if let Some(applying) = applying {
        applying.await.map_err(task("cluster apply"))?;
    }
    if let Some(http) = http {
        http.await
            .map_err(task("HTTP server"))?
            .map_err(AggregatorError::Http)?;
    }
    admin
        .map_err(task("admin server"))?
        .map_err(AggregatorError::Admin)?;
    background.map_err(task("background"))
}

/// Cluster mode: this store's consumer name and the connection to the stream, or `None`
/// without `[cluster]`.
async fn join_cluster(
    config: &Config,
    grpc: &tokio::net::TcpListener,
) -> Result<Option<(Arc<cluster::Cluster>, String)>, AggregatorError> {
    let Some(c) = &config.cluster else {
        return Ok(None);
    };
    let advertise = match &c.advertise {
        Some(advertise) => advertise.clone(),
        None => {
            let addr = grpc.local_addr().map_err(AggregatorError::Admin)?;
            if addr.ip().is_unspecified() {
                return Err(AggregatorError::Config(
                    crate::config::ConfigError::Invalid {
                        field: "cluster.advertise",
                        value: "(not set)".into(),
                        rule: "is needed when gRPC listens on every address (0.0.0.0 or [::]): the HOST:PORT other nodes dial this node at (or HOURGLASS_CLUSTER_ADVERTISE)",
                    },
                ));
            }
            addr.to_string()
        }
    };
    let consumer = cluster::consumer_name(&config.data_dir, &c.node).map_err(|e| {
        StoreError::Io(format!(
            "cluster: the consumer file in {}: {e}",
            config.data_dir.display()
        ))
    })?;
    let cluster = cluster::Cluster::connect(c.clone(), advertise).await?;
    Ok(Some((Arc::new(cluster), consumer)))
}

/// Flushes and closes the store once every other holder has let go of it, so RocksDB
/// shuts down cleanly instead of being torn down with the process.
fn close(store: Arc<RocksStore>) -> Result<(), AggregatorError> {
    match Arc::try_unwrap(store) {
        Ok(store) => {
            store.flush()?;
            drop(store);
            tracing::info!("store closed");
        }
        Err(_) => tracing::warn!("store still referenced at shutdown; it closes on exit"),
    }
    Ok(())
}

/// The whole aggregator: opens the store of `config`, serves on `listeners` until
/// `shutdown` completes, and closes the store.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AggregatorError> {
    Aggregator::open(config)?.serve(listeners, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The binary prints an error with `{:#}` (anyhow: the message, then each source,
    /// joined by ": "), so a variant must not both show its cause and name it as its
    /// source: the line would say the cause twice. These read as before AggregatorError.
    #[tokio::test]
    async fn an_error_says_its_cause_once() {
        let printed = |e: AggregatorError| format!("{:#}", anyhow::Error::from(e));
        assert_eq!(
            printed(AggregatorError::Admin(std::io::Error::other(
                "address in use"
            ))),
            "admin server failed: address in use"
        );
        let task = tokio::spawn(std::future::pending::<()>());
        task.abort();
        let join = task.await.unwrap_err();
        let why = join.to_string();
        assert_eq!(
            printed(AggregatorError::Task {
                what: "background",
                source: join,
            }),
            format!("background task failed: {why}")
        );
    }
}
