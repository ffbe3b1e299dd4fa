//! Serving an HTTP/1.1 port: the admin port and the API port both run their router here.
//!
//! `axum::serve` gives hyper no timer, so a connection that sends part of a request head
//! and then nothing is kept open for as long as the client likes, and the graceful
//! shutdown waits for it: one such client would keep the aggregator from exiting on
//! SIGTERM (it waits for its HTTP ports before it closes the store). Here each connection
//! has a header-read timeout ([`HEADER_READ_TIMEOUT`]), and the drain after shutdown is
//! bounded ([`DRAIN`]): requests in flight finish within it, and whatever is left after
//! it is dropped.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tower::ServiceExt;

/// How long a client has to send a whole request head, from when the connection waits for
/// one (a new connection, or a kept-alive one between requests).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(20);

/// How long the requests in flight have to finish once shutdown begins: the gRPC port's
/// bound ([`hourglass_rpc::tls::DRAIN`]), so that every port of the process drains alike.
pub(crate) const DRAIN: Duration = hourglass_rpc::tls::DRAIN;

/// Serves `app` on the connections `listener` accepts until `shutdown` completes; then
/// stops accepting, lets the requests in flight finish for up to [`DRAIN`], and drops
/// what is left. Each request carries its connection's address as
/// [`ConnectInfo<L::Addr>`](ConnectInfo).
pub(crate) async fn serve<L>(
    mut listener: L,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: Listener,
    L::Addr: Clone + Send + Sync + 'static,
{
    let (closing, closed) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        // Finished connections are reaped as new ones come, so the set stays small.
        while connections.try_join_next().is_some() {}
        let app = app
            .clone()
            .map_request(move |mut request: axum::http::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(addr.clone()));
                request
            });
        let mut closed = closed.clone();
        connections.spawn(async move {
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
            tokio::pin!(connection);
            tokio::select! {
                // A failed connection (a reset, a bad request head) concerns that client
                // alone; hyper has already answered what it could.
                _ = connection.as_mut() => return,
                _ = closed.wait_for(|c| *c) => connection.as_mut().graceful_shutdown(),
            }
            let _ = connection.await;
        });
    }
    drop(listener);
    let _ = closing.send(true);
    let drained = tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = connections.len(),
            "HTTP connections still open {DRAIN:?} after shutdown began; dropped"
        );
        connections.abort_all();
    }
    Ok(())
}
