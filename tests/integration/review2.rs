//! Review of 95ae990 (a consumer reopened after only its acknowledgements were lost counts
//! what it delivered as applied) and of the completeness rule it changes (`apply.rs`,
//! `open`): each test demonstrates a suspected defect, and fails while it is there.
//!
//! Both need a fault no other helper makes: a NATS link that loses *some* protocol
//! messages while passing the rest (a lost acknowledgement, a lost delivery, a lost
//! membership renewal), as happens around a reconnect or a NATS leader election. The
//! [`Proxy`] here parses the NATS protocol both ways and drops whole messages only, so the
//! connection itself stays healthy.

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
            (drops.acks.load(Ordering::SeqCst) && subject.starts_with("$JS.ACK."))
                || (drops.kv.load(Ordering::SeqCst) && subject.starts_with("$KV."))
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
         SUB _INBOX.review2 1\r\nPUB {subject} _INBOX.review2 {}\r\n{payload}\r\nPING\r\n",
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

/// The case 95ae990 was made for, as it happens on a busy stream: a node applies every
/// message of its partition, its acknowledgement of the last one is lost (here dropped on
/// the way), and its consumers are opened again (here: back in touch after more than
/// `max_age / 2`) once the stream has dropped older messages. The store lacks nothing, so the node must
/// come back ready for the partition; with no other node to copy from, a node that flags
/// itself incomplete never answers for it again.
///
/// 95ae990 counts `delivered` as applied when `applied(p) >= delivered.stream_sequence`,
/// but a consumer of one subject reports as delivered the last sequence it *looked at*,
/// of any subject, whenever a pull request makes it skip more than one message of the
/// others (nats-server records the skip, `updateSkipped`): on a stream that goes on past
/// the partition's last message, `applied(p)` (that message) is below it, the old rule
/// (`seen = ack floor`) applies, and the node is flagged incomplete as before the change.
#[test]
fn a_node_whose_acknowledgements_were_lost_is_complete_when_reopened_after_max_age() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review2-lost-acks");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let max_age = Duration::from_secs(20);
    let a = node(&dir, vec![proxy.url()], "agg-1", |c| {
        c.max_age = max_age;
        c.publish_timeout = Duration::from_secs(2);
    });
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    let page = "lost-acks";
    let p = partition_of(page);
    let other = page_where(p, false, page);
    let subject = format!("hourglass.p.{p}");
    let name = consumer_of(&dir, "agg-1", p);

    // A (partition p) and then C (another partition), acknowledged normally.
    let t0 = Instant::now();
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push(page, hour, 1, 0..100))),
        vec![Stored]
    );
    wait_until("agg-1 to acknowledge A", || {
        consumer_state(&urls[1], &name).is_some_and(|(_, _, pending, _)| pending == 0)
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push(&other, hour, 1, 0..10))),
        vec![Stored]
    );
    // B, a newer version of A's series, applied by agg-1 but its acknowledgement lost.
    std::thread::sleep(Duration::from_secs(10).saturating_sub(t0.elapsed()));
    proxy.drop_acks(true);
    let t_b = Instant::now();
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push(page, hour, 2, 0..3000))),
        vec![Stored]
    );
    let s_b = last_of_subject(&urls[1], &subject).expect("B in the stream");
    // D, in another partition: the stream goes on past p's last message, as a busy one
    // does. (A consumer's reported `delivered` follows what it looked at only when it
    // skips more than one message at once: two here, D's and its live message.)
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push(&other, hour, 2, 0..20))),
        vec![Stored]
    );
    // agg-1 out of touch with the members bucket for longer than max_age / 2 (its
    // renewal's put is dropped): back in touch, it opens every consumer again.
    proxy.drop_kv(true);
    let kv_dropped = Instant::now();
    let out_of_touch = max_age / 2;
    let mut state;
    let premise = loop {
        let (messages, first, last) = stream_state(&urls[1]);
        let consumer = consumer_state(&urls[1], &name);
        state = (messages, first, last, consumer);
        let ok = first == s_b
            && kv_dropped.elapsed() > out_of_touch + Duration::from_millis(1500)
            && consumer.is_some_and(|(delivered, floor, pending, _)| {
                pending >= 1 && delivered > s_b && floor + 1 < first
            });
        if ok {
            break true;
        }
        if t_b.elapsed() > max_age - Duration::from_secs(4) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        premise,
        "premise not reached in time (not the defect): the stream dropped A and C, kept B \
         (at {s_b}), and agg-1's consumer of p{p} has B unacknowledged with its delivered \
         position past B; (messages, first, last, (delivered, floor, ack pending, pending)) = {state:?}"
    );
    proxy.drop_kv(false);
    wait_until("agg-1 to open its consumers again", || {
        agg_metric(&a, "cluster_partitions_ready") < agg_metric(&a, "cluster_partitions_applying")
    });
    // Until each consumer has read its position; then acknowledgements pass again.
    std::thread::sleep(Duration::from_secs(3));
    proxy.drop_acks(false);
    // Ready again at the latest when JetStream redelivers B (ACK_WAIT, 60 s after B).
    let deadline = t_b + Duration::from_secs(95);
    let answer = loop {
        let answer = rt.block_on(export(&a.grpc, page, hour));
        let good = ready(&a) && matches!(&answer, Ok((bytes, 0)) if !bytes.is_empty());
        if good || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        ready(&a) && matches!(&answer, Ok((bytes, 0)) if !bytes.is_empty()),
        "agg-1 applied every message of partition {p} (A at the start, B at {s_b}; only B's \
         acknowledgement was lost) yet, reopened after the stream dropped A, it does not come \
         back ready for it {:?} after B: {}; its answer for the series: {}; consumer \
         (delivered, floor, ack pending, pending) = {:?}, as it was before the reopen: {state:?}",
        t_b.elapsed(),
        readiness(&a),
        match &answer {
            Ok((bytes, missing)) =>
                format!("{} bytes, partitions_missing = {missing}", bytes.len()),
            Err(s) => format!("refused: {s}"),
        },
        consumer_state(&urls[1], &name),
    );
    drop(rt);
}

/// A delivery lost on the way (a reconnect, a NATS leader election) that the stream drops
/// (`max_age`) before the consumer's next delivery reveals the gap: JetStream then removes
/// it from the consumer's pending deliveries as if acknowledged ("Message deleted by
/// stream limits", `decStreamPending` → `processTerm` in nats-server) and moves the ack
/// floor to what the consumer reports delivered, which on a stream that went on is past
/// it (here a push to another partition follows). The gap reopens the consumer from that floor (`apply.rs`, `open`), which
/// now vouches for the lost message: the node takes itself as complete, applies on, and
/// answers for the partition without an acknowledged push, naming nothing missing. (The
/// other owner holds the push: an honest node refuses, leaves the partition to it, or
/// copies.) A node may also notice the lost delivery by itself before M2 (its idle
/// consumer reports a delivery it never received) and make its consumer again from its
/// own position: the premise then sees that new consumer, nothing pending and its floor
/// where it started; what is checked after is the same.
#[test]
fn a_delivery_lost_then_dropped_by_max_age_is_never_vouched_for_by_the_ack_floor() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review2-lost-delivery");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let max_age = Duration::from_secs(10);
    let tweak = |c: &mut ClusterConfig| c.max_age = max_age;
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
    let page = "lost-delivery";
    let p = partition_of(page);
    let later = page_where(p, true, page);
    let subject = format!("hourglass.p.{p}");
    let name = consumer_of(&dir, "agg-1", p);

    // M1 reaches agg-2 (which confirms it) but its delivery to agg-1 is lost.
    proxy.drop_deliveries_of(Some(format!("-p{p}")));
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(page, hour, 1, 0..2000))),
        vec![Stored]
    );
    let s1 = last_of_subject(&urls[1], &subject).expect("M1 in the stream");
    // D, in another partition: the stream goes on (agg-1's consumer of p looks past it at
    // its next pull request, and reports that as delivered).
    let other = page_where(p, false, page);
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(&other, hour, 1, 0..20))),
        vec![Stored]
    );
    // The stream drops it; JetStream forgets agg-1 never acknowledged it (at once when
    // the stream drops it, at the latest when its ack floor check runs, about 2 min).
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut seen;
    let forgotten = loop {
        let (_, first, _) = stream_state(&urls[1]);
        let consumer = consumer_state(&urls[1], &name);
        seen = (first, consumer);
        if first > s1 && consumer.is_some_and(|(_, _, pending, _)| pending == 0) {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        forgotten,
        "premise not reached (not the defect): the stream dropped M1 (at {s1}) and agg-1's \
         consumer no longer counts it pending (its ack floor past it, or made again); \
         (first, (delivered, floor, ack pending, pending)) = {seen:?}"
    );
    let after_drop = consumer_state(&urls[1], &name);
    proxy.drop_deliveries_of(None);
    // M2, another series of the same partition: agg-1's next delivery shows the gap.
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(&later, hour, 1, 0..10))),
        vec![Stored]
    );
    let (want, _) = rt
        .block_on(export(&b.grpc, page, hour))
        .expect("agg-2 answers");
    // Watch agg-1's answers until it has been ready for a while.
    let started = Instant::now();
    let mut ready_since: Option<Instant> = None;
    let mut answers = Vec::new();
    loop {
        let answer = rt.block_on(export(&a.grpc, page, hour));
        let honest = match &answer {
            Ok((got, missing)) => *got == want || *missing > 0,
            Err(s) => s.code() == tonic::Code::Unavailable,
        };
        answers.push(match &answer {
            Ok((got, missing)) => format!(
                "{} bytes (agg-2: {}), partitions_missing = {missing}",
                got.len(),
                want.len()
            ),
            Err(s) => format!("refused: {}", s.code()),
        });
        assert!(
            honest,
            "agg-1 answers without the acknowledged push visits{{page={page}}} (M1, stream \
             sequence {s1}) whose delivery to it was lost and which the stream then dropped: \
             {:?} after M2; its consumer of p{p} after the drop (delivered, floor, ack pending, \
             pending) = {after_drop:?}; it is {}; answers so far: {answers:?}",
            started.elapsed(),
            readiness(&a),
        );
        if ready(&a) {
            let since = *ready_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(10) {
                break;
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(rt);
}
