//! The admin HTTP port: Prometheus `/metrics`, liveness `/healthz` and readiness
//! `/readyz`, for the orchestrator and the monitoring system rather than for users.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::store::{Dictionaries, RocksStore};

/// What the admin handlers read.
#[derive(Clone)]
pub(crate) struct AdminState {
    /// The store, for the gauges read at scrape time.
    pub(crate) store: Arc<RocksStore>,
    /// The counters and histograms.
    pub(crate) metrics: Arc<Metrics>,
    /// True while the gRPC server accepts requests; readiness follows it.
    pub(crate) grpc_serving: Arc<AtomicBool>,
}

/// The admin routes.
pub(crate) fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves the admin routes on `listener` until `shutdown` completes.
pub(crate) async fn serve(
    listener: TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // With the API port's bounds: a half-sent request must not hold the shutdown.
    crate::http::server::serve(listener, router(state), shutdown).await
}

async fn healthz() -> &'static str {
    // Answering at all is the point: the process is up and its runtime is not stuck.
    "ok\n"
}

async fn readyz(State(state): State<AdminState>) -> Response {
    // The store is opened before any listener serves and closed only after both stop, so
    // serving gRPC implies an open store.
    if state.grpc_serving.load(Ordering::Acquire) {
        "ready\n".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not serving gRPC\n").into_response()
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    let store = Arc::clone(&state.store);
    // RocksDB property reads and the dictionary listings touch the database: keep them off
    // the async threads. A failure leaves the gauges at their last values.
    let reading = tokio::task::spawn_blocking(move || {
        let stats = store.stats()?;
        let series = store.list_series()?.len();
        let servers = store.list_servers()?.len();
        Ok::<_, crate::store::StoreError>((stats, series, servers))
    })
    .await;
    match reading {
        Ok(Ok((stats, series, servers))) => state.metrics.set_store(&stats, series, servers),
        Ok(Err(e)) => tracing::warn!(error = %e, "reading store statistics failed"),
        Err(e) => tracing::warn!(error = %e, "store statistics task failed"),
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}
