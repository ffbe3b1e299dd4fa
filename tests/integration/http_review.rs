//! Review tests of the aggregator's HTTP port, as a process: SIGTERM must stop the
//! aggregator whatever an HTTP client does. (Unit-level review tests of the port and the
//! dashboard are in aggregator/src/http/review_tests.rs.)

use std::io::Write;

use crate::util::{AggregatorProcess, TempDir};

/// `host:port` of a `http://host:port` URL.
fn host(url: &str) -> &str {
    url.strip_prefix("http://").expect("an http:// URL")
}

/// Control: an HTTP client connected but silent does not hold SIGTERM.
#[test]
fn http_review_sigterm_exits_with_an_idle_http_client() {
    let dir = TempDir::new("http-review-idle");
    let agg = AggregatorProcess::start(&dir.file("agg"), &[]);
    let _idle = std::net::TcpStream::connect(host(&agg.http)).expect("connect");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let status = agg.terminate();
    assert!(status.success(), "{status:?}");
}

/// An HTTP client that sent the first line of a request and then nothing (a slow or
/// stalled client, or anyone on the network) keeps the aggregator from exiting on
/// SIGTERM: `terminate` panics "still running 30 s after SIGTERM" when it does.
#[test]
fn http_review_sigterm_exits_despite_a_half_sent_http_request() {
    let dir = TempDir::new("http-review-half-sent");
    let agg = AggregatorProcess::start(&dir.file("agg"), &[]);
    let mut slow = std::net::TcpStream::connect(host(&agg.http)).expect("connect");
    slow.write_all(b"GET /api/v1/servers HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let status = agg.terminate();
    assert!(status.success(), "{status:?}");
    drop(slow);
}

/// The same on the admin port, which the change did not add (for comparison: whether the
/// fix belongs to both axum servers).
#[test]
fn http_review_sigterm_exits_despite_a_half_sent_admin_request() {
    let dir = TempDir::new("http-review-half-sent-admin");
    let agg = AggregatorProcess::start(&dir.file("agg"), &[]);
    let mut slow = std::net::TcpStream::connect(agg.admin).expect("connect");
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let status = agg.terminate();
    assert!(status.success(), "{status:?}");
    drop(slow);
}
