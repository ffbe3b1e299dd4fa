//! The port's connections (`server.rs`): slow and idle clients neither hold the
//! shutdown nor stay open forever.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::tests::start;
use crate::store::MemoryStore;

/// A connection that never sent a byte does not hold the port's shutdown.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_connection_does_not_block_shutdown() {
    let (addr, stop, server) = start(Arc::new(MemoryStore::new())).await;
    let _idle = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(()).unwrap();
    let finished = tokio::time::timeout(Duration::from_secs(10), server).await;
    assert!(finished.is_ok(), "an idle connection held the shutdown");
}

/// A client that sent the first line of a request and nothing more must not keep the
/// aggregator from stopping: `Aggregator::serve` waits for the HTTP task before it closes
/// the store and exits, so this is SIGTERM never finishing.
#[tokio::test(flavor = "multi_thread")]
async fn a_half_sent_request_does_not_block_shutdown() {
    let (addr, stop, server) = start(Arc::new(MemoryStore::new())).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /api/v1/servers HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(()).unwrap();
    let finished = tokio::time::timeout(Duration::from_secs(15), server).await;
    assert!(
        finished.is_ok(),
        "the HTTP port had not finished 15 s after its shutdown began: one half-sent request \
         holds it (and with it the aggregator's exit) for as long as the client keeps the \
         connection open"
    );
}

/// A client that never finishes its request head is dropped after a while (hyper's own
/// default is 30 s once a timer is given), so that idle half-open requests cannot pile up.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_head_that_never_ends_is_timed_out() {
    let (addr, _stop, _server) = start(Arc::new(MemoryStore::new())).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /api/v1/servers HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(45), slow.read(&mut buf)).await;
    assert!(
        read.is_ok(),
        "45 s after a request's first line the connection is still open and waiting: the \
         port has no header-read timeout"
    );
}
