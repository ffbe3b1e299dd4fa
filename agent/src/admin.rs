//! The agent's admin HTTP port: Prometheus `/metrics`, liveness `/healthz` and readiness
//! `/readyz`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::table::Table;

/// What the admin handlers read.
#[derive(Clone)]
pub(crate) struct AdminState {
    /// The sketches, for the backlog and Bloom gauges read at scrape time.
    pub(crate) table: Arc<Mutex<Table>>,
    /// The counters.
    pub(crate) metrics: Arc<Metrics>,
    /// True while the agent takes events; readiness follows it.
    pub(crate) ingesting: Arc<AtomicBool>,
}

/// Serves the admin routes on `listener` until `shutdown` completes.
pub(crate) async fn serve(
    listener: TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn readyz(State(state): State<AdminState>) -> Response {
    if state.ingesting.load(Ordering::Acquire) {
        "ready\n".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not taking events\n").into_response()
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    let table = Arc::clone(&state.table);
    // Walking every entry takes the table's lock; keep it off the async threads.
    let read = tokio::task::spawn_blocking(move || {
        let t = crate::table::lock(&table);
        (t.backlog(), t.bloom_fill_above_half())
    })
    .await;
    match read {
        Ok((backlog, blooms)) => state.metrics.set_table(&backlog, &blooms),
        Err(e) => tracing::warn!(error = %e, "reading the table's gauges failed"),
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
