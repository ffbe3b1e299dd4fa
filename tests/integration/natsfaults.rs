//! Faults in the NATS protocol for the cluster's tests: a TCP proxy in front of one NATS
//! server that passes the protocol message by message and drops chosen ones
//! (acknowledgements, membership renewals, one consumer's deliveries, publications
//! carrying a given text) while the connection stays healthy, as around a reconnect or a
//! NATS leader election, or ends one consumer's flow of messages; and the JetStream, node,
//! push, export and answer helpers those tests share.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::faults::{JOIN_WAIT, agg_metric, wait_until_within};
use crate::util::{AggregatorAddrs, InProcessAggregator, TempDir, channel};
use hourglass_aggregator::cluster::ClusterConfig;
use hourglass_rpc::proto::v1::{
    self, collector_client::CollectorClient, query_client::QueryClient,
};

pub(crate) const PARTITIONS: u32 = 8;
/// The subjects they are grouped into: partition p on subject p mod 3, so that these
/// tests run with subjects shared by partitions, as a stream of the defaults does.
pub(crate) const SUBJECTS: u32 = 3;
pub(crate) const HEARTBEAT: Duration = Duration::from_millis(500);
pub(crate) const STREAM: &str = "HOURGLASS";

// ---------------------------------------------------------------------------------------
// A NATS proxy that drops chosen protocol messages.

/// What the [`Proxy`] drops now.
#[derive(Default)]
pub(crate) struct Drops {
    /// Client → server: publications to `$JS.ACK.…` (every acknowledgement).
    acks: AtomicBool,
    /// Client → server: publications to `$KV.…` (the membership renewal's put).
    kv: AtomicBool,
    /// Server → client: deliveries (messages whose reply is `$JS.ACK.…`) of the consumer
    /// whose name ends with this suffix.
    deliveries_of: Mutex<Option<String>>,
    /// Client → server: publications whose payload contains this text (a consumer update
    /// that marks the store incomplete, say).
    payloads_with: Mutex<Option<String>>,
    /// Client → server, recorded: each subscription's id by its subject (`SUB`).
    sids: Mutex<std::collections::HashMap<String, String>>,
    /// Client → server, recorded: the inbox of each pull consumer's last pull request
    /// (`$JS.API.CONSUMER.MSG.NEXT.…`), by consumer name.
    pulls: Mutex<std::collections::HashMap<String, String>>,
    /// Server → client: protocol messages to pass to the client at the next whole message.
    injected: Mutex<Vec<u8>>,
}

/// A TCP proxy on loopback in front of one NATS server that passes the NATS protocol
/// message by message, dropping those [`Drops`] names.
pub(crate) struct Proxy {
    addr: SocketAddr,
    drops: Arc<Drops>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
    closed: Arc<AtomicBool>,
}

impl Proxy {
    pub(crate) fn to(target: SocketAddr) -> Proxy {
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

    pub(crate) fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    pub(crate) fn drop_acks(&self, on: bool) {
        self.drops.acks.store(on, Ordering::SeqCst);
    }

    pub(crate) fn drop_kv(&self, on: bool) {
        self.drops.kv.store(on, Ordering::SeqCst);
    }

    pub(crate) fn drop_deliveries_of(&self, consumer_suffix: Option<String>) {
        *self.drops.deliveries_of.lock().unwrap() = consumer_suffix;
    }

    pub(crate) fn drop_payloads_with(&self, text: Option<String>) {
        *self.drops.payloads_with.lock().unwrap() = text;
    }

    /// Ends the flow of messages of the pull consumer whose name ends with
    /// `consumer_suffix`, as the client sees it, without touching the consumer: its last
    /// pull request is answered "503 No Responders" (the client's message stream gives an
    /// error, and the node opens the consumer again), as when a NATS server goes away
    /// under a pull request. The consumer's deliveries pass as before. Returns whether
    /// such a pull request was seen.
    pub(crate) fn end_pulls_of(&self, consumer_suffix: &str) -> bool {
        let inbox = {
            let pulls = self.drops.pulls.lock().unwrap();
            pulls
                .iter()
                .find(|(name, _)| name.ends_with(consumer_suffix))
                .map(|(_, inbox)| inbox.clone())
        };
        let Some(inbox) = inbox else { return false };
        let Some(sid) = self.drops.sids.lock().unwrap().get(&inbox).cloned() else {
            return false;
        };
        let header = "NATS/1.0 503\r\n\r\n";
        let message = format!(
            "HMSG {inbox} {sid} {len} {len}\r\n{header}\r\n",
            len = header.len()
        );
        self.drops
            .injected
            .lock()
            .unwrap()
            .extend_from_slice(message.as_bytes());
        true
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
pub(crate) fn pump(mut from: TcpStream, mut to: TcpStream, drops: &Drops, upstream: bool) {
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
        if !upstream {
            // Between two whole messages: what the test injects for the client.
            out.append(&mut drops.injected.lock().unwrap());
        }
        if !out.is_empty() && to.write_all(&out).is_err() {
            return;
        }
    }
}

/// The length of the first whole protocol message in `buf` and whether to drop it, or
/// `None` while it is incomplete.
pub(crate) fn frame(buf: &[u8], drops: &Drops, upstream: bool) -> Option<(usize, bool)> {
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
    if upstream {
        record(&op, &args, drops);
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

/// Records, from a client → server protocol message `op` with `args`, a subscription's
/// id and a pull request's inbox ([`Proxy::end_pulls_of`]).
fn record(op: &str, args: &[&str], drops: &Drops) {
    match (op, args) {
        // SUB <subject> [queue group] <sid>
        ("SUB", [subject, .., sid]) => {
            drops
                .sids
                .lock()
                .unwrap()
                .insert(subject.to_string(), sid.to_string());
        }
        // PUB <subject> <reply> <size>, HPUB <subject> <reply> <header size> <size>
        ("PUB", [subject, reply, _]) | ("HPUB", [subject, reply, _, _]) => {
            if let Some(name) = subject
                .strip_prefix("$JS.API.CONSUMER.MSG.NEXT.")
                .and_then(|rest| rest.split('.').nth(1))
            {
                drops
                    .pulls
                    .lock()
                    .unwrap()
                    .insert(name.to_string(), reply.to_string());
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------
// JetStream's own view, asked over a plain NATS connection of the test's.

/// The JSON answer of a JetStream API request `subject` with `payload`, asked of the NATS
/// server at `url`.
pub(crate) fn js_api(url: &str, subject: &str, payload: &str) -> Result<serde_json::Value, String> {
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
         SUB _INBOX.natsfaults 1\r\nPUB {subject} _INBOX.natsfaults {}\r\n{payload}\r\nPING\r\n",
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
pub(crate) fn stream_state(url: &str) -> (u64, u64, u64) {
    let info = js_api(url, &format!("$JS.API.STREAM.INFO.{STREAM}"), "").expect("stream info");
    let state = &info["state"];
    (
        state["messages"].as_u64().unwrap_or(0),
        state["first_seq"].as_u64().unwrap_or(0),
        state["last_seq"].as_u64().unwrap_or(0),
    )
}

/// The stream sequence of the last message on `subject`, if the stream holds one.
pub(crate) fn last_of_subject(url: &str, subject: &str) -> Option<u64> {
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
pub(crate) fn consumer_state(url: &str, name: &str) -> Option<(u64, u64, u64, u64)> {
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

/// In-process nodes log to the test's output with `HOURGLASS_TEST_LOG=FILTER` (a
/// `tracing` filter, e.g. `hourglass_aggregator=debug`).
pub(crate) fn test_log() {
    if let Ok(filter) = std::env::var("HOURGLASS_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
}

/// How far behind (stream messages) a test node's partitions catch up by subject (a
/// node's default, 4096, is more than the tests' streams hold).
pub(crate) const CATCH_UP_BEHIND: u64 = 4;

pub(crate) fn node(
    dir: &TempDir,
    urls: Vec<String>,
    name: &str,
    tweak: impl FnOnce(&mut ClusterConfig),
) -> InProcessAggregator {
    test_log();
    let mut cluster = ClusterConfig::new(name, urls);
    cluster.partitions = PARTITIONS;
    cluster.subjects = Some(SUBJECTS);
    cluster.heartbeat = HEARTBEAT;
    cluster.member_ttl = Duration::from_secs(120);
    // The tests' streams are small: a node behind by this much catches up by subject.
    cluster.catch_up_behind = CATCH_UP_BEHIND;
    tweak(&mut cluster);
    let agg = InProcessAggregator::start_with(hourglass_aggregator::Config {
        data_dir: dir.file(name).into(),
        cluster: Some(cluster),
        ..Default::default()
    });
    wait_until_within("the node to join and be ready", JOIN_WAIT, || ready(&agg));
    agg
}

/// The name prefix of `node`'s durable consumers (`DATA_DIR/cluster-consumer`).
pub(crate) fn durable_of(dir: &TempDir, node: &str) -> String {
    let path = std::path::Path::new(&dir.file(node)).join("cluster-consumer");
    let name = std::fs::read_to_string(&path).expect("the node's consumer file");
    name.trim().to_string()
}

/// The name of `node`'s durable consumer of partition `p`.
pub(crate) fn consumer_of(dir: &TempDir, node: &str, p: u32) -> String {
    format!("{}-p{p}", durable_of(dir, node))
}

/// The live consumer of `node`'s store, as JetStream reports it: its creation time (which
/// tells one instance of it from another) and the subjects of its filter.
pub(crate) fn live_consumer(url: &str, dir: &TempDir, node: &str) -> (String, Vec<String>) {
    let name = format!("{}-live", durable_of(dir, node));
    let info = js_api(url, &format!("$JS.API.CONSUMER.INFO.{STREAM}.{name}"), "")
        .expect("the live consumer's info");
    let config = &info["config"];
    let mut subjects: Vec<String> = config["filter_subjects"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if let Some(one) = config["filter_subject"].as_str().filter(|s| !s.is_empty()) {
        subjects.push(one.to_string());
    }
    let created = info["created"].as_str().unwrap_or_default().to_string();
    (created, subjects)
}

/// Whether `node` applies every partition it applies through its live consumer.
pub(crate) fn all_carried(node: &dyn AggregatorAddrs) -> bool {
    let applying = agg_metric(node, "cluster_partitions_applying");
    applying > 0.0 && agg_metric(node, "cluster_partitions_carried") == applying
}

pub(crate) fn ready(node: &dyn AggregatorAddrs) -> bool {
    let applying = agg_metric(node, "cluster_partitions_applying");
    agg_metric(node, "cluster_members") > 0.0
        && applying > 0.0
        && agg_metric(node, "cluster_partitions_ready") == applying
        && agg_metric(node, "cluster_pending") == 0.0
}

pub(crate) fn readiness(node: &dyn AggregatorAddrs) -> String {
    format!(
        "members {}, applying {}, ready {}, pending {}",
        agg_metric(node, "cluster_members"),
        agg_metric(node, "cluster_partitions_applying"),
        agg_metric(node, "cluster_partitions_ready"),
        agg_metric(node, "cluster_pending"),
    )
}

pub(crate) fn hll(items: std::ops::Range<u32>) -> Vec<u8> {
    let mut h = hourglass_sketch::hll::Hll::new(12).unwrap();
    for i in items {
        h.insert(&i.to_le_bytes());
    }
    h.encode()
}

/// The partition of the distinct series `visits{page=PAGE}`.
pub(crate) fn partition_of(page: &str) -> u32 {
    partition_among(page, PARTITIONS)
}

/// The partition of `visits{page=PAGE}` among `partitions`.
pub(crate) fn partition_among(page: &str, partitions: u32) -> u32 {
    hourglass_aggregator::cluster::partition(
        &hourglass_aggregator::store::SeriesName::new(
            "visits",
            vec![("page".to_string(), page.to_string())],
            hourglass_sketch::Kind::Distinct,
        ),
        partitions,
    )
}

/// A page whose series falls in partition `p` (`in_p`), or on another subject than
/// `p`'s (and so in another partition), other than `not`.
pub(crate) fn page_where(p: u32, in_p: bool, not: &str) -> String {
    (0..1000)
        .map(|i| format!("page-{i}"))
        .find(|page| {
            let q = partition_of(page);
            page != not
                && match in_p {
                    true => q == p,
                    false => q % SUBJECTS != p % SUBJECTS,
                }
        })
        .expect("a page")
}

/// The stream's subject of partition `p`.
pub(crate) fn subject_of(p: u32) -> String {
    format!("hourglass.p.{}", p % SUBJECTS)
}

/// A push from web-1 of `visits{page=PAGE}` at `hour`, at `version`.
pub(crate) fn push(
    page: &str,
    hour: u32,
    version: u64,
    items: std::ops::Range<u32>,
) -> v1::PushRequest {
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
pub(crate) async fn push_until_answered(
    grpc: &str,
    request: v1::PushRequest,
) -> Vec<v1::PushOutcome> {
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
pub(crate) async fn export(
    grpc: &str,
    page: &str,
    hour: u32,
) -> Result<(Vec<u8>, u32), tonic::Status> {
    let tags = vec![v1::Tag {
        key: "page".into(),
        value: page.into(),
    }];
    export_visits(grpc, tags, hour).await
}

/// The distinct Export of every `visits` series over `hour`, merged: its bytes and the
/// partitions it says it lacks, or the node's refusal.
pub(crate) async fn export_all(grpc: &str, hour: u32) -> Result<(Vec<u8>, u32), tonic::Status> {
    export_visits(grpc, vec![], hour).await
}

async fn export_visits(
    grpc: &str,
    tags: Vec<v1::Tag>,
    hour: u32,
) -> Result<(Vec<u8>, u32), tonic::Status> {
    let mut q = QueryClient::new(channel(grpc).await);
    let r = q
        .export(v1::ExportRequest {
            selector: Some(v1::Selector {
                metric: "visits".into(),
                tags,
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

/// An answer of `export` in words, beside the full answer `want`: its size and the
/// partitions it names missing, or the refusal.
pub(crate) fn describe(answer: &Result<(Vec<u8>, u32), tonic::Status>, want: &[u8]) -> String {
    match answer {
        Ok((got, missing)) => format!(
            "{} bytes (the full answer: {}), partitions_missing = {missing}",
            got.len(),
            want.len()
        ),
        Err(s) => format!("refused: {:?} {}", s.code(), s.message()),
    }
}

/// Whether `answer` is `want`, or says honestly that it is not: partitions missing, or a
/// refusal to answer (UNAVAILABLE: the node cannot confirm it applied what was
/// acknowledged).
pub(crate) fn right_or_honest(answer: &Result<(Vec<u8>, u32), tonic::Status>, want: &[u8]) -> bool {
    match answer {
        Ok((got, missing)) => got == want || *missing > 0,
        Err(s) => s.code() == tonic::Code::Unavailable,
    }
}
