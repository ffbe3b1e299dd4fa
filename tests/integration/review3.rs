//! Review of 28e8367 (a node vouches only for its own record of what it applied: per
//! subject, the consumer instance, the last delivery it received and applied, and its
//! stream position, kept in the store). Each test demonstrates a suspected defect and
//! fails while it is there.
//!
//! The helpers below are copied from `review2.rs` (private there): its NATS proxy, which
//! drops chosen protocol messages, extended with one more thing to drop (a client's
//! publication whose payload contains a given text), and its JetStream, node, push and
//! export helpers.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::faults::{agg_metric, wait_until};
use crate::nats::NatsCluster;
use crate::util::{AggregatorAddrs, InProcessAggregator, TempDir, channel, runtime};
use hourglass_aggregator::cluster::ClusterConfig;
use hourglass_rpc::proto::v1::{
    self, collector_client::CollectorClient, query_client::QueryClient,
};

const PARTITIONS: u32 = 8;
const HEARTBEAT: Duration = Duration::from_millis(500);
const STREAM: &str = "HOURGLASS";

// ---------------------------------------------------------------------------------------
// A NATS proxy that drops chosen protocol messages.

/// What the [`Proxy`] drops now.
#[derive(Default)]
struct Drops {
    /// Client → server: publications to `$JS.ACK.…` (every acknowledgement).
    acks: AtomicBool,
    /// Client → server: publications to `$KV.…` (the membership renewal's put).
    kv: AtomicBool,
    /// Server → client: deliveries (messages whose reply is `$JS.ACK.…`) of the consumer
    /// whose name ends with this suffix.
    deliveries_of: Mutex<Option<String>>,
    /// Client → server (review3): publications whose payload contains this text (here,
    /// a consumer update that marks the store incomplete).
    payloads_with: Mutex<Option<String>>,
}

/// A TCP proxy on loopback in front of one NATS server that passes the NATS protocol
/// message by message, dropping those [`Drops`] names.
struct Proxy {
    addr: SocketAddr,
    drops: Arc<Drops>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
    closed: Arc<AtomicBool>,
}

impl Proxy {
    fn to(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a proxy");
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let drops = Arc::new(Drops::default());
        let sockets = Arc::new(Mutex::new(Vec::<TcpStream>::new()));
        let closed = Arc::new(AtomicBool::new(false));
        {
            let (drops, sockets, closed) = (
                Arc::clone(&drops),
                Arc::clone(&sockets),
                Arc::clone(&closed),
            );
            std::thread::spawn(move || {
                while !closed.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((inbound, _)) => {
                            let _ = inbound.set_nonblocking(false);
                            let Ok(outbound) = TcpStream::connect(target) else {
                                continue;
                            };
                            let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
                            {
                                let mut held = sockets.lock().unwrap();
                                for s in [&inbound, &outbound] {
                                    if let Ok(s) = s.try_clone() {
                                        held.push(s);
                                    }
                                }
                            }
                            let (Ok(in2), Ok(out2)) = (inbound.try_clone(), outbound.try_clone())
                            else {
                                continue;
                            };
                            let up = Arc::clone(&drops);
                            std::thread::spawn(move || pump(inbound, outbound, &up, true));
                            let down = Arc::clone(&drops);
                            std::thread::spawn(move || pump(out2, in2, &down, false));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            });
        }
        Proxy {
            addr,
            drops,
            sockets,
            closed,
        }
    }

    fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    fn drop_acks(&self, on: bool) {
        self.drops.acks.store(on, Ordering::SeqCst);
    }

    fn drop_kv(&self, on: bool) {
        self.drops.kv.store(on, Ordering::SeqCst);
    }

    fn drop_deliveries_of(&self, consumer_suffix: Option<String>) {
        *self.drops.deliveries_of.lock().unwrap() = consumer_suffix;
    }

    fn drop_payloads_with(&self, text: Option<String>) {
        *self.drops.payloads_with.lock().unwrap() = text;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        for s in self.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Copies `from` to `to` one protocol message at a time, leaving out those `drops` names.
/// `upstream`: client to server (else server to client).
fn pump(mut from: TcpStream, mut to: TcpStream, drops: &Drops, upstream: bool) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut chunk) {
            Ok(0) | Err(_) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut out = Vec::new();
        let mut at = 0;
        while let Some((len, dropped)) = frame(&buf[at..], drops, upstream) {
            if !dropped {
                out.extend_from_slice(&buf[at..at + len]);
            }
            at += len;
        }
        buf.drain(..at);
        if !out.is_empty() && to.write_all(&out).is_err() {
            return;
        }
    }
}

/// The length of the first whole protocol message in `buf` and whether to drop it, or
/// `None` while it is incomplete.
fn frame(buf: &[u8], drops: &Drops, upstream: bool) -> Option<(usize, bool)> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[..end]).unwrap_or("");
    let mut words = line.split_ascii_whitespace();
    let op = words.next().unwrap_or("").to_ascii_uppercase();
    let args: Vec<&str> = words.collect();
    let payload = match op.as_str() {
        "PUB" | "HPUB" | "MSG" | "HMSG" => args.last().and_then(|n| n.parse::<usize>().ok()),
        _ => None,
    };
    let len = end + 2 + payload.map_or(0, |n| n + 2);
    if buf.len() < len {
        return None;
    }
    let dropped = match op.as_str() {
        "PUB" | "HPUB" if upstream => {
            let subject = args.first().copied().unwrap_or("");
            let body = &buf[end + 2..len.saturating_sub(2).max(end + 2)];
            let marker = drops.payloads_with.lock().unwrap().clone();
            (drops.acks.load(Ordering::SeqCst) && subject.starts_with("$JS.ACK."))
                || (drops.kv.load(Ordering::SeqCst) && subject.starts_with("$KV."))
                || marker.is_some_and(|m| body.windows(m.len()).any(|w| w == m.as_bytes()))
        }
        "MSG" | "HMSG" if !upstream => {
            let with_reply = if op == "MSG" { 4 } else { 5 };
            let reply = if args.len() == with_reply {
                args[2]
            } else {
                ""
            };
            let suffix = drops.deliveries_of.lock().unwrap().clone();
            suffix.is_some_and(|suffix| {
                reply.starts_with("$JS.ACK.")
                    && reply
                        .split('.')
                        .any(|token| token.starts_with("apply-") && token.ends_with(&suffix))
            })
        }
        _ => false,
    };
    Some((len, dropped))
}

// ---------------------------------------------------------------------------------------
// JetStream's own view, asked over a plain NATS connection of the test's.

/// The JSON answer of a JetStream API request `subject` with `payload`, asked of the NATS
/// server at `url`.
fn js_api(url: &str, subject: &str, payload: &str) -> Result<serde_json::Value, String> {
    let addr = url.trim_start_matches("nats://");
    let stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut writer = stream;
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?; // INFO
    write!(
        writer,
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true,\"protocol\":1}}\r\n\
         SUB _INBOX.review3 1\r\nPUB {subject} _INBOX.review3 {}\r\n{payload}\r\nPING\r\n",
        payload.len()
    )
    .map_err(|e| e.to_string())?;
    loop {
        line.clear();
        if reader.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("the NATS server closed the connection".into());
        }
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        match words.first().copied() {
            Some("PING") => writer.write_all(b"PONG\r\n").map_err(|e| e.to_string())?,
            Some("MSG") | Some("HMSG") => {
                let n: usize = words.last().and_then(|n| n.parse().ok()).ok_or("size")?;
                let mut body = vec![0u8; n + 2];
                reader.read_exact(&mut body).map_err(|e| e.to_string())?;
                if words[0] == "HMSG" {
                    return Err(format!(
                        "no answer: {}",
                        String::from_utf8_lossy(&body[..n]).trim()
                    ));
                }
                return serde_json::from_slice(&body[..n]).map_err(|e| e.to_string());
            }
            Some("-ERR") => return Err(line.trim().to_string()),
            _ => {}
        }
    }
}

/// `(messages, first_seq, last_seq)` of the stream.
fn stream_state(url: &str) -> (u64, u64, u64) {
    let info = js_api(url, &format!("$JS.API.STREAM.INFO.{STREAM}"), "").expect("stream info");
    let state = &info["state"];
    (
        state["messages"].as_u64().unwrap_or(0),
        state["first_seq"].as_u64().unwrap_or(0),
        state["last_seq"].as_u64().unwrap_or(0),
    )
}

/// The stream sequence of the last message on `subject`, if the stream holds one.
fn last_of_subject(url: &str, subject: &str) -> Option<u64> {
    let got = js_api(
        url,
        &format!("$JS.API.STREAM.MSG.GET.{STREAM}"),
        &format!("{{\"last_by_subj\":\"{subject}\"}}"),
    )
    .ok()?;
    got["message"]["seq"].as_u64()
}

/// What JetStream reports of consumer `name`: `(delivered stream seq, ack floor stream
/// seq, num_ack_pending, num_pending)`.
fn consumer_state(url: &str, name: &str) -> Option<(u64, u64, u64, u64)> {
    let info = js_api(url, &format!("$JS.API.CONSUMER.INFO.{STREAM}.{name}"), "").ok()?;
    info.get("error").is_none().then(|| {
        (
            info["delivered"]["stream_seq"].as_u64().unwrap_or(0),
            info["ack_floor"]["stream_seq"].as_u64().unwrap_or(0),
            info["num_ack_pending"].as_u64().unwrap_or(0),
            info["num_pending"].as_u64().unwrap_or(0),
        )
    })
}

// ---------------------------------------------------------------------------------------
// Nodes, pushes, answers.

fn node(
    dir: &TempDir,
    urls: Vec<String>,
    name: &str,
    tweak: impl FnOnce(&mut ClusterConfig),
) -> InProcessAggregator {
    if let Ok(filter) = std::env::var("HOURGLASS_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
    let mut cluster = ClusterConfig::new(name, urls);
    cluster.partitions = PARTITIONS;
    cluster.heartbeat = HEARTBEAT;
    cluster.member_ttl = Duration::from_secs(120);
    tweak(&mut cluster);
    let agg = InProcessAggregator::start_with(hourglass_aggregator::Config {
        data_dir: dir.file(name).into(),
        cluster: Some(cluster),
        ..Default::default()
    });
    wait_until("the node to join and be ready", || ready(&agg));
    agg
}

/// The name of `node`'s durable consumer of partition `p`.
fn consumer_of(dir: &TempDir, node: &str, p: u32) -> String {
    let path = std::path::Path::new(&dir.file(node)).join("cluster-consumer");
    let name = std::fs::read_to_string(&path).expect("the node's consumer file");
    format!("{}-p{p}", name.trim())
}

fn ready(node: &dyn AggregatorAddrs) -> bool {
    let applying = agg_metric(node, "cluster_partitions_applying");
    agg_metric(node, "cluster_members") > 0.0
        && applying > 0.0
        && agg_metric(node, "cluster_partitions_ready") == applying
        && agg_metric(node, "cluster_pending") == 0.0
}

fn readiness(node: &dyn AggregatorAddrs) -> String {
    format!(
        "members {}, applying {}, ready {}, pending {}",
        agg_metric(node, "cluster_members"),
        agg_metric(node, "cluster_partitions_applying"),
        agg_metric(node, "cluster_partitions_ready"),
        agg_metric(node, "cluster_pending"),
    )
}

fn hll(items: std::ops::Range<u32>) -> Vec<u8> {
    let mut h = hourglass_sketch::hll::Hll::new(12).unwrap();
    for i in items {
        h.insert(&i.to_le_bytes());
    }
    h.encode()
}

/// The partition of the distinct series `visits{page=PAGE}`.
fn partition_of(page: &str) -> u32 {
    hourglass_aggregator::cluster::partition(
        &hourglass_aggregator::store::SeriesName::new(
            "visits",
            vec![("page".to_string(), page.to_string())],
            hourglass_sketch::Kind::Distinct,
        ),
        PARTITIONS,
    )
}

/// A page whose series falls in partition `p` (`in_p`) or outside it, other than `not`.
fn page_where(p: u32, in_p: bool, not: &str) -> String {
    (0..1000)
        .map(|i| format!("page-{i}"))
        .find(|page| page != not && (partition_of(page) == p) == in_p)
        .expect("a page")
}

/// A push from web-1 of `visits{page=PAGE}` at `hour`, at `version`.
fn push(page: &str, hour: u32, version: u64, items: std::ops::Range<u32>) -> v1::PushRequest {
    let mut s = crate::util::snapshot(
        "visits",
        hour,
        version,
        v1::SketchKind::Distinct,
        hll(items),
    );
    s.series.as_mut().unwrap().tags = vec![v1::Tag {
        key: "page".into(),
        value: page.into(),
    }];
    v1::PushRequest {
        server: Some(v1::Server {
            name: "web-1".into(),
            labels: vec![],
        }),
        snapshots: vec![s],
        live_hours: vec![hour],
    }
}

/// Pushes `request` to `grpc` until it is answered other than UNAVAILABLE (90 s at most).
async fn push_until_answered(grpc: &str, request: v1::PushRequest) -> Vec<v1::PushOutcome> {
    let mut c = CollectorClient::new(channel(grpc).await);
    let started = Instant::now();
    loop {
        match c.push(request.clone()).await {
            Ok(r) => return r.into_inner().results.iter().map(|r| r.outcome()).collect(),
            Err(s) if s.code() == tonic::Code::Unavailable => {
                assert!(
                    started.elapsed() < Duration::from_secs(90),
                    "a push through {grpc} is not answered after {:?}: {s}",
                    started.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(s) => panic!("push refused: {s}"),
        }
    }
}

/// The distinct Export of `visits{page=PAGE}` over `hour`: its bytes and the partitions
/// it says it lacks, or the node's refusal.
async fn export(grpc: &str, page: &str, hour: u32) -> Result<(Vec<u8>, u32), tonic::Status> {
    let mut q = QueryClient::new(channel(grpc).await);
    let r = q
        .export(v1::ExportRequest {
            selector: Some(v1::Selector {
                metric: "visits".into(),
                tags: vec![v1::Tag {
                    key: "page".into(),
                    value: page.into(),
                }],
                range: Some(v1::TimeRange {
                    start_hour: hour,
                    end_hour: hour + 1,
                }),
                ..Default::default()
            }),
            kind: v1::SketchKind::Distinct as i32,
        })
        .await?
        .into_inner();
    Ok((
        r.sketch.map(|s| s.data.to_vec()).unwrap_or_default(),
        r.coverage.map_or(0, |c| c.partitions_missing),
    ))
}

// ---------------------------------------------------------------------------------------
// The tests.

/// The metadata a consumer update carries when `open` marks a store incomplete
/// (`mark_complete(.., false)`, apply.rs), as async-nats serializes it.
const MARKED_INCOMPLETE: &str = "\"hourglass.complete\":\"false\"";

/// Whether an answer for `page` is honest, given the answer `want` of a node that holds
/// every acknowledged push: the same bytes, a missing partition named, or a refusal.
fn honest(answer: &Result<(Vec<u8>, u32), tonic::Status>, want: &[u8]) -> bool {
    match answer {
        Ok((got, missing)) => got == want || *missing > 0,
        Err(s) => s.code() == tonic::Code::Unavailable,
    }
}

fn describe(answer: &Result<(Vec<u8>, u32), tonic::Status>, want: &[u8]) -> String {
    match answer {
        Ok((got, missing)) => format!(
            "{} bytes (the full answer: {}), partitions_missing = {missing}",
            got.len(),
            want.len()
        ),
        Err(s) => format!("refused: {:?} {}", s.code(), s.message()),
    }
}

/// `open` (apply.rs) makes a consumer again from the store's position (`Behind`/`Other`)
/// with `consumer_config(from, marked)` — the *old* completeness mark, "true" — records
/// the new instance as followed (`cluster.follow`), and only then finds the stream
/// starts after that position and writes the mark "false" (`mark_complete`). JetStream
/// starts the new consumer at the stream's first message, so it reports as delivered
/// (`delivered.stream_seq`) the sequence just before it, past what the store lacks.
///
/// If anything fails between `follow` and the mark (here the consumer update is lost
/// on the way and times out; equally a SIGKILL there, or `stream_first` failing), the
/// next `open` finds the very instance it follows, with no delivery, and
/// `barrier::vouched` gives `All { at: first - 1 }`: `held + 1 >= first`, the mark still
/// "true", so the store is taken as complete, nothing is copied, and the node answers
/// for the partition without the messages the stream dropped.
///
/// The scenario is review2's lost delivery: agg-1's deliveries of partition p are lost
/// until the stream dropped M1 (agg-2 applied it); agg-1's consumer updates that mark it
/// incomplete are lost throughout.
#[test]
fn review3_a_consumer_made_again_past_a_gap_is_trusted_complete_when_its_mark_is_lost() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review3-lost-mark");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let max_age = Duration::from_secs(10);
    let tweak = |c: &mut ClusterConfig| {
        c.max_age = max_age;
        c.publish_timeout = Duration::from_secs(2);
    };
    let a = node(&dir, vec![proxy.url()], "agg-1", tweak);
    let b = node(&dir, vec![urls[1].clone(), urls[2].clone()], "agg-2", tweak);
    wait_until("two members, both ready", || {
        agg_metric(&a, "cluster_members") == 2.0
            && agg_metric(&b, "cluster_members") == 2.0
            && ready(&a)
            && ready(&b)
    });
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    let page = "lost-mark";
    let p = partition_of(page);
    let later = page_where(p, true, page);
    let other = page_where(p, false, page);
    let subject = format!("hourglass.p.{p}");

    // From now on agg-1 can never mark a store incomplete (the update is lost).
    proxy.drop_payloads_with(Some(MARKED_INCOMPLETE.to_string()));
    // M1 reaches agg-2, which confirms it; its deliveries to agg-1 are lost.
    proxy.drop_deliveries_of(Some(format!("-p{p}")));
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(page, hour, 1, 0..2000))),
        vec![Stored]
    );
    let s1 = last_of_subject(&urls[1], &subject).expect("M1 in the stream");
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(&other, hour, 1, 0..20))),
        vec![Stored]
    );
    // The stream drops M1.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (_, first, _) = stream_state(&urls[1]);
        if first > s1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "premise not reached (not the defect): the stream did not drop M1 (at {s1}); first = {first}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // agg-1 notices the lost delivery (two idle checks, ~5 s), makes its consumer again
    // past the gap, fails to mark it, and opens it again a second later.
    std::thread::sleep(Duration::from_secs(12));
    proxy.drop_deliveries_of(None);
    // M2, another series of the same partition.
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(&later, hour, 1, 0..10))),
        vec![Stored]
    );
    let (want, missing) = rt
        .block_on(export(&b.grpc, page, hour))
        .expect("agg-2 answers");
    assert!(!want.is_empty() && missing == 0, "agg-2 holds M1");
    let started = Instant::now();
    let mut answers = Vec::new();
    while started.elapsed() < Duration::from_secs(15) {
        let answer = rt.block_on(export(&a.grpc, page, hour));
        answers.push(describe(&answer, &want));
        assert!(
            honest(&answer, &want),
            "agg-1 answers for partition {p} without the acknowledged push M1 (stream sequence \
             {s1}, dropped by max_age before agg-1 applied it), naming nothing missing: its \
             consumer was made again past the gap and, its 'incomplete' mark lost, opened \
             again as complete; agg-1 is {}; answers so far: {answers:?}",
            readiness(&a),
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(rt);
}

/// A node's position is a stream sequence, kept in its store (`cluster/position/`), but
/// nothing records *which stream* it is a position in. When the stream is deleted and
/// made again (an operator recreating it, NATS's JetStream storage lost; a node starting
/// finds none and makes it, `engine.rs`), its sequences start again at 1: the node's
/// consumers are gone, `open` meets a new instance (`Other`) and makes it again from the
/// old position plus one (apply.rs, `DeliverPolicy::ByStartSequence { held + 1 }`), so
/// every message of the new stream up to the old position is never applied, while the
/// old position, the completeness check (`held + 1 >= first`) and the read barrier
/// (`wait_applied`) all pass: the node is ready and answers without them.
#[test]
fn review3_a_position_in_a_deleted_stream_is_trusted_in_the_stream_made_again() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review3-new-stream");
    let urls = nats.urls();
    let a = node(&dir, vec![urls[0].clone()], "agg-1", |_| {});
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    let page = "new-stream";
    let p = partition_of(page);
    let subject = format!("hourglass.p.{p}");
    let live = "hourglass.live".to_string();
    // The first stream: pushes to every partition, the last one to p, so that agg-1's
    // positions in p and in the live subject are well past what the new stream will hold.
    for i in 0..12 {
        let filler = page_where(i % PARTITIONS, true, page);
        assert_eq!(
            rt.block_on(push_until_answered(&a.grpc, push(&filler, hour, 1, 0..10))),
            vec![Stored]
        );
    }
    let old_p = page_where(p, true, page);
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push(&old_p, hour, 1, 0..10))),
        vec![Stored]
    );
    let old_last = stream_state(&urls[1]).2;
    let old_p_seq = last_of_subject(&urls[1], &subject).expect("p's message");
    wait_until("agg-1 to apply the first stream", || {
        consumer_state(&urls[1], &consumer_of(&dir, "agg-1", p))
            .is_some_and(|(delivered, _, pending, _)| delivered >= old_p_seq && pending == 0)
    });
    std::thread::sleep(Duration::from_secs(2));
    rt.block_on(a.stop());

    // The stream is deleted; a new node makes it again, and a push goes into it.
    let deleted = js_api(&urls[1], &format!("$JS.API.STREAM.DELETE.{STREAM}"), "")
        .expect("delete the stream");
    assert_eq!(deleted["success"].as_bool(), Some(true), "{deleted}");
    let b = node(
        &dir,
        vec![urls[1].clone(), urls[2].clone()],
        "agg-2",
        |_| {},
    );
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(page, hour, 1, 0..2000))),
        vec![Stored]
    );
    let new_seq = last_of_subject(&urls[1], &subject).expect("M in the new stream");
    let new_live = last_of_subject(&urls[1], &live).unwrap_or(0);
    assert!(
        new_seq < old_p_seq && new_live < old_last,
        "premise (not the defect): the new stream's sequences ({new_seq}, live {new_live}) are \
         below the old ones ({old_p_seq}, last {old_last})"
    );
    let (want, missing) = rt
        .block_on(export(&b.grpc, page, hour))
        .expect("agg-2 answers");
    assert!(!want.is_empty() && missing == 0, "agg-2 holds M");

    // agg-1 starts again on its store.
    let a = node(&dir, vec![urls[0].clone()], "agg-1", |_| {});
    wait_until("two members, both ready", || {
        agg_metric(&a, "cluster_members") == 2.0
            && agg_metric(&b, "cluster_members") == 2.0
            && ready(&a)
            && ready(&b)
    });
    let started = Instant::now();
    let mut answers = Vec::new();
    while started.elapsed() < Duration::from_secs(10) {
        let answer = rt.block_on(export(&a.grpc, page, hour));
        answers.push(describe(&answer, &want));
        assert!(
            honest(&answer, &want),
            "agg-1, restarted after the stream was deleted and made again, answers without \
             the acknowledged push M (new stream sequence {new_seq}; its position in p from \
             the old stream is {old_p_seq}, live {old_last}), naming nothing missing: it is {}; \
             answers so far: {answers:?}",
            readiness(&a),
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(rt);
}
