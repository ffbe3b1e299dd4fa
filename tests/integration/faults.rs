//! Fault tests: the same seeded traffic (`hourglass simulate`, in four parts) through an
//! agent into an aggregator, once without faults and once with each fault below; the
//! stored sketches (via Export) and the query answers must be byte-identical.
//!
//! - the aggregator is SIGKILLed in the middle of ingest and restarted;
//! - the aggregator is unreachable for several flush intervals, then returns;
//! - the agent is SIGKILLed and restarted from its checkpoint;
//! - acknowledgements are lost: a TCP proxy forwards pushes but drops the replies, so the
//!   agent retries pushes that were in fact stored;
//! - the agent's data dir is wiped: it rejoins in a new epoch, and the answers still
//!   include everything acknowledged before.
//!
//! Duplicated and reordered pushes are replayed in `agent::duplicated_and_reordered_*`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::util::{
    AgentProcess, AggregatorAddrs, AggregatorProcess, InProcessAggregator, TempDir, free_port,
    hourglass, http_get,
};
use hourglass_rpc::proto::v1::{self, query_client::QueryClient};

/// Parts the traffic is sent in, and hours per part.
pub(crate) const PARTS: u32 = 4;
pub(crate) const HOURS_PER_PART: u32 = 6;

/// The first hour of the traffic: the start of yesterday (UTC), so every part is inside
/// the agents' lateness window and in the past.
pub(crate) fn base_hour() -> u32 {
    let today = hourglass_rpc::time::day_of(crate::util::this_hour());
    (today - 1) * 24
}

fn agent_args(config: &str) -> Vec<String> {
    [
        "--flush-interval",
        "200ms",
        "--lateness",
        "3d",
        "--default-kinds",
        "distinct,frequency,membership",
        "--config",
        config,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub(crate) fn start_agent(dir: &TempDir, aggregator: &str, data: &str) -> AgentProcess {
    let config = dir.file("agent.toml");
    if !std::path::Path::new(&config).exists() {
        std::fs::write(
            &config,
            "[shipping]\nbackoff_initial = \"100ms\"\nbackoff_max = \"500ms\"\n",
        )
        .unwrap();
    }
    let args = agent_args(&config);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    AgentProcess::start("web-1", aggregator, &dir.file(data), &args)
}

/// Sends part `p` of the traffic to `agent`.
pub(crate) fn send_part(agent: &AgentProcess, p: u32) {
    let start = hourglass_rpc::time::hour_start(base_hour() + p * HOURS_PER_PART).to_rfc3339();
    hourglass(
        &[
            "simulate",
            "--agents",
            &agent.ingest,
            "--seed",
            "11",
            "--start",
            &start,
            "--hours",
            &HOURS_PER_PART.to_string(),
            "--events-per-hour",
            "150",
        ],
        b"",
    )
    .ok();
}

/// Waits until the agent has nothing unacknowledged, two successful flushes after now.
pub(crate) fn wait_shipped(agent: &AgentProcess) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let flushes = agent.metric(r#"flushes_total{outcome="ok"}"#);
    while !(agent.metric(r#"flushes_total{outcome="ok"}"#) >= flushes + 2.0
        && agent.metric("pending_snapshots") == 0.0)
    {
        assert!(
            Instant::now() < deadline,
            "agent did not ship; logs:\n{}",
            agent.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn wait_until(what: &str, done: impl FnMut() -> bool) {
    wait_until_within(what, Duration::from_secs(60), done);
}

/// How long a cluster node may take to join and be ready: joining alone may take a minute
/// (the aggregator's `START_TIMEOUT`, while a new NATS cluster elects its JetStream
/// leaders), then its consumers are made and catch up. Under the whole suite's load on 2
/// cores, 60 s for both was once too short (twice: the mutual-TLS cluster test in CI).
pub(crate) const JOIN_WAIT: Duration = Duration::from_secs(150);

/// [`wait_until`] with a limit of its own.
pub(crate) fn wait_until_within(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what} ({limit:?})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One value of the aggregator's `/metrics`.
pub(crate) fn agg_metric(agg: &(impl AggregatorAddrs + ?Sized), name: &str) -> f64 {
    let (_, text) = http_get(agg.admin(), "/metrics");
    let full = format!("hourglass_aggregator_{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&full))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// What the aggregator holds for the traffic: every kind of both metrics exported, a few
/// membership lookups, and the distinct answers per part and for the whole range.
#[derive(Debug, PartialEq)]
pub(crate) struct Stored {
    /// Per metric and kind: the exported bytes and the partitions the export lacked
    /// (cluster mode); then per membership lookup, its answers' text.
    exports: Vec<(String, Vec<u8>, u32)>,
    distinct: Vec<String>,
}

impl Stored {
    /// The answers that differ from `want`'s without naming a missing partition: a
    /// silently wrong number.
    pub(crate) fn silently_unlike(&self, want: &Stored) -> Vec<String> {
        let mut silent: Vec<String> = self
            .exports
            .iter()
            .zip(&want.exports)
            .filter(|(got, want)| got.2 == 0 && got.1 != want.1)
            .map(|(got, _)| format!("export {}", got.0))
            .collect();
        silent.extend(
            self.distinct
                .iter()
                .zip(&want.distinct)
                .filter(|(got, want)| got.ends_with(" 0 partitions") && got != want)
                .map(|(got, want)| format!("distinct {got} (want {want})")),
        );
        silent
    }
}

pub(crate) fn stored(agg: &impl AggregatorAddrs) -> Stored {
    try_stored(agg).unwrap_or_else(|e| panic!("{e}"))
}

/// [`stored`], or what kept it from being read.
pub(crate) fn try_stored(agg: &(impl AggregatorAddrs + ?Sized)) -> Result<Stored, String> {
    crate::util::runtime().block_on(async {
        let mut q = QueryClient::new(crate::util::channel(agg.grpc()).await);
        let base = base_hour();
        let selector = |metric: &str, hours: std::ops::Range<u32>| {
            Some(v1::Selector {
                metric: metric.into(),
                range: Some(v1::TimeRange {
                    start_hour: hours.start,
                    end_hour: hours.end,
                }),
                servers: vec!["web-1".into()],
                ..Default::default()
            })
        };
        let all = base..base + PARTS * HOURS_PER_PART;
        let mut exports = Vec::new();
        for metric in ["visitors", "pages"] {
            for kind in [
                v1::SketchKind::Distinct,
                v1::SketchKind::Frequency,
                v1::SketchKind::Membership,
            ] {
                let r = q
                    .export(v1::ExportRequest {
                        selector: selector(metric, all.clone()),
                        kind: kind as i32,
                    })
                    .await
                    .map_err(|e| format!("export {metric} {kind:?}: {e}"))?
                    .into_inner();
                let missing = r.coverage.map_or(0, |c| c.partitions_missing);
                let bytes = r.sketch.map(|s| s.data.to_vec()).unwrap_or_default();
                if bytes.is_empty() && missing == 0 {
                    return Err(format!("{metric} {kind:?}: nothing stored"));
                }
                exports.push((format!("{metric} {kind:?}"), bytes, missing));
            }
        }
        // Membership lookups: each filter looked up, not merged (a cluster's owners send
        // each filter's answer), so the answer with where it was seen is compared whole.
        for item in ["user1", "user42", "nobody"] {
            for group_by in [v1::GroupBy::None, v1::GroupBy::Hour] {
                let mut s = selector("visitors", all.clone());
                if let Some(s) = s.as_mut() {
                    s.group_by = group_by as i32;
                }
                let r = q
                    .membership(v1::MembershipRequest {
                        selector: s,
                        item: item.as_bytes().to_vec(),
                    })
                    .await
                    .map_err(|e| format!("membership {item}: {e}"))?
                    .into_inner();
                let missing = r.coverage.map_or(0, |c| c.partitions_missing);
                let groups: Vec<_> = r.groups.iter().map(|g| (&g.key, &g.answer)).collect();
                // Debug prints each f64 in its shortest round-trip form: equal text is
                // equal bits.
                let answer = format!("{:?} {groups:?}", r.answer).into_bytes();
                exports.push((format!("membership {item} {group_by:?}"), answer, missing));
            }
        }
        let mut distinct = Vec::new();
        for p in 0..=PARTS {
            let hours = if p == PARTS {
                all.clone()
            } else {
                base + p * HOURS_PER_PART..base + (p + 1) * HOURS_PER_PART
            };
            let r = q
                .distinct(v1::DistinctRequest {
                    selector: selector("visitors", hours),
                })
                .await
                .map_err(|e| format!("distinct: {e}"))?
                .into_inner();
            let a = r.answer.unwrap_or_default();
            let c = r.coverage.unwrap_or_default();
            distinct.push(format!(
                "{} ± {} [{}, {}] missing {} hours, {} partitions",
                a.estimate,
                a.std_error,
                a.lower95,
                a.upper95,
                c.server_hours_missing,
                c.partitions_missing
            ));
        }
        Ok(Stored { exports, distinct })
    })
}

/// The run without faults, made once and shared by the tests.
pub(crate) fn reference() -> &'static Stored {
    static REFERENCE: OnceLock<Stored> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let dir = TempDir::new("faults-ref");
        let agg = InProcessAggregator::start(&dir.file("agg"));
        let agent = start_agent(&dir, &agg.grpc, "agent");
        for p in 0..PARTS {
            send_part(&agent, p);
        }
        wait_shipped(&agent);
        stored(&agg)
    })
}

pub(crate) fn assert_same(faulty: &Stored) {
    let reference = reference();
    for ((name, a, _), (_, b, missing)) in reference.exports.iter().zip(&faulty.exports) {
        assert!(
            a == b && *missing == 0,
            "{name}: the faulty run's sketch differs from the run without faults ({missing} partitions missing)"
        );
    }
    assert_eq!(faulty.distinct, reference.distinct, "query answers differ");
}

#[test]
fn aggregator_sigkilled_mid_ingest_and_restarted() {
    let dir = TempDir::new("faults-agg-kill");
    let listen = format!("127.0.0.1:{}", free_port());
    let agg = AggregatorProcess::start_on(&listen, &dir.file("agg"), &[]);
    let agent = start_agent(&dir, &agg.grpc, "agent");
    send_part(&agent, 0);
    send_part(&agent, 1);
    // Pushes are in flight every 200 ms: kill while the agent is shipping part 1.
    std::thread::sleep(Duration::from_millis(150));
    agg.kill();
    send_part(&agent, 2);
    let agg = AggregatorProcess::start_on(&listen, &dir.file("agg"), &[]);
    send_part(&agent, 3);
    wait_shipped(&agent);
    assert_same(&stored(&agg));
}

#[test]
fn aggregator_unreachable_for_several_flushes() {
    let dir = TempDir::new("faults-agg-away");
    let listen = format!("127.0.0.1:{}", free_port());
    let agg = AggregatorProcess::start_on(&listen, &dir.file("agg"), &[]);
    let agent = start_agent(&dir, &agg.grpc, "agent");
    send_part(&agent, 0);
    wait_shipped(&agent);
    assert_eq!(agg.terminate().code(), Some(0));
    send_part(&agent, 1);
    send_part(&agent, 2);
    // Several flush intervals of failed pushes, with the backlog visible.
    wait_until("failed pushes", || {
        agent.metric(r#"pushes_total{outcome="unavailable"}"#) >= 3.0
    });
    assert!(agent.metric("pending_snapshots") > 0.0);
    let agg = AggregatorProcess::start_on(&listen, &dir.file("agg"), &[]);
    send_part(&agent, 3);
    wait_shipped(&agent);
    assert_same(&stored(&agg));
}

#[test]
fn agent_sigkilled_and_restarted_from_its_checkpoint() {
    let dir = TempDir::new("faults-agent-kill");
    let listen = format!("127.0.0.1:{}", free_port());
    let url = format!("http://{listen}");
    // The aggregator is away, so what the agent holds exists only in its checkpoint.
    let agent = start_agent(&dir, &url, "agent");
    send_part(&agent, 0);
    send_part(&agent, 1);
    let checkpoints = agent.metric(r#"checkpoints_total{outcome="ok"}"#);
    wait_until("a checkpoint after the events", || {
        agent.metric(r#"checkpoints_total{outcome="ok"}"#) >= checkpoints + 2.0
    });
    agent.kill();
    let agent = start_agent(&dir, &url, "agent");
    assert_eq!(
        agent.metric(r#"checkpoint_lost_total{reason="corrupt"}"#),
        0.0
    );
    let agg = AggregatorProcess::start_on(&listen, &dir.file("agg"), &[]);
    send_part(&agent, 2);
    send_part(&agent, 3);
    wait_shipped(&agent);
    assert_same(&stored(&agg));
}

/// A TCP proxy that forwards both ways, and while `drop_replies` is set forwards the
/// agent's pushes but swallows the aggregator's replies and then cuts the connection, as
/// a network that loses acknowledgements does. It reads the aggregator's side as HTTP/2
/// frames: settings, pings and window updates still pass (a push larger than the
/// flow-control window waits for them), and the first other frame past the connection
/// preface (a reply's headers or data) is swallowed.
struct Proxy {
    addr: SocketAddr,
    drop_replies: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let drop_replies = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&drop_replies);
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let sent = Arc::new(AtomicUsize::new(0));
                let (mut c_read, mut s_write) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let counted = Arc::clone(&sent);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n @ 1..) = c_read.read(&mut buf) {
                        counted.fetch_add(n, Ordering::Relaxed);
                        if s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = s_write.shutdown(std::net::Shutdown::Write);
                });
                let flag = Arc::clone(&flag);
                let (mut s_read, mut c_write) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    let mut pending = Vec::new();
                    while let Ok(n @ 1..) = s_read.read(&mut buf) {
                        pending.extend_from_slice(&buf[..n]);
                        // Whole frames: a 9-byte header (24-bit length, type), then the
                        // payload.
                        while pending.len() >= 9 {
                            let len = usize::from(pending[0]) << 16
                                | usize::from(pending[1]) << 8
                                | usize::from(pending[2]);
                            if pending.len() < 9 + len {
                                break;
                            }
                            let frame: Vec<u8> = pending.drain(..9 + len).collect();
                            // SETTINGS, PING and WINDOW_UPDATE keep the connection going.
                            let control = matches!(frame[3], 0x4 | 0x6 | 0x8);
                            // Past the connection preface (a few hundred bytes), other
                            // frames answer pushes: swallow them, let the aggregator
                            // finish, cut.
                            if !control
                                && flag.load(Ordering::Relaxed)
                                && sent.load(Ordering::Relaxed) > 1024
                            {
                                std::thread::sleep(Duration::from_millis(300));
                                let _ = c_write.shutdown(std::net::Shutdown::Both);
                                let _ = s_read.shutdown(std::net::Shutdown::Both);
                                return;
                            }
                            if c_write.write_all(&frame).is_err() {
                                return;
                            }
                        }
                    }
                    let _ = c_write.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Proxy { addr, drop_replies }
    }
}

#[test]
fn lost_acknowledgements_are_retried_harmlessly() {
    let dir = TempDir::new("faults-lost-acks");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let upstream: SocketAddr = agg.grpc.trim_start_matches("http://").parse().unwrap();
    let proxy = Proxy::start(upstream);
    let agent = start_agent(&dir, &format!("http://{}", proxy.addr), "agent");
    send_part(&agent, 0);
    wait_shipped(&agent);
    proxy.drop_replies.store(true, Ordering::Relaxed);
    send_part(&agent, 1);
    send_part(&agent, 2);
    // Pushes reach the aggregator and are stored, but the agent never hears so.
    let stored_before = agg_metric(&agg, "snapshots_stored_total");
    wait_until("pushes stored without acknowledgement", || {
        agg_metric(&agg, "snapshots_stored_total") > stored_before
            && agent.metric(r#"pushes_total{outcome="unavailable"}"#)
                + agent.metric(r#"pushes_total{outcome="unknown"}"#)
                + agent.metric(r#"pushes_total{outcome="internal"}"#)
                + agent.metric(r#"pushes_total{outcome="cancelled"}"#)
                >= 2.0
    });
    assert!(agent.metric("pending_snapshots") > 0.0);
    proxy.drop_replies.store(false, Ordering::Relaxed);
    send_part(&agent, 3);
    wait_shipped(&agent);
    assert!(
        agg_metric(&agg, "snapshots_stale_total") > 0.0,
        "the agent sent again what was stored"
    );
    assert_same(&stored(&agg));
}

#[test]
fn a_wiped_agent_rejoins_in_a_new_epoch_and_nothing_acknowledged_is_lost() {
    let dir = TempDir::new("faults-wipe");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let agent = start_agent(&dir, &agg.grpc, "agent");
    let epoch = agent.metric("epoch");
    send_part(&agent, 0);
    send_part(&agent, 1);
    wait_shipped(&agent);
    agent.kill();
    std::fs::remove_dir_all(dir.file("agent")).unwrap();
    let agent = start_agent(&dir, &agg.grpc, "agent");
    assert_ne!(agent.metric("epoch"), epoch, "a new epoch");
    assert_eq!(
        agent.metric(r#"checkpoint_lost_total{reason="missing"}"#),
        1.0
    );
    send_part(&agent, 2);
    send_part(&agent, 3);
    wait_shipped(&agent);
    let faulty = stored(&agg);
    let reference = reference();
    // Epochs merge by each kind's own rule. Distinct (max) and membership (OR) are
    // idempotent, so two epochs give the very bytes of one; so are the distinct answers.
    for ((name, a, _), (_, b, _)) in reference.exports.iter().zip(&faulty.exports) {
        if name.contains("Frequency") {
            // Count-Min sums, so its counters equal the single epoch's; the frequent-items
            // summary of a merge may keep other candidates than one stream's.
            let (hourglass_sketch::Sketch::Frequency(a), hourglass_sketch::Sketch::Frequency(b)) = (
                hourglass_sketch::Sketch::decode(a).unwrap(),
                hourglass_sketch::Sketch::decode(b).unwrap(),
            ) else {
                panic!("{name} is not a frequency sketch");
            };
            assert_eq!(a.count_min(), b.count_min(), "{name}: Count-Min counters");
        } else {
            assert!(a == b, "{name}: differs from the run without faults");
        }
    }
    assert_eq!(faulty.distinct, reference.distinct);
}
