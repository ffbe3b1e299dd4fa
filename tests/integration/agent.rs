//! `hourglass-agent` as a process, with a real aggregator: events in over UDP DogStatsD and
//! gRPC Ingest, answers out of the aggregator; the aggregator away and back; the agent
//! SIGKILLed and restarted from its checkpoint; duplicated and reordered pushes; events
//! spread over past days.
//!
//! Where a fault could lose or double-count, the test runs a second, untouched agent
//! ("ref") with the same events beside the faulty one, and requires the aggregator's
//! merged sketches of the two servers to be byte-identical.

use std::net::UdpSocket;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::{
    AgentProcess, AggregatorAddrs, AggregatorProcess, InProcessAggregator, TempDir, channel,
    free_port, hourglass, http_get, now_secs, this_hour,
};
use hourglass_rpc::proto::v1::{
    self, collector_client::CollectorClient, ingest_client::IngestClient, query_client::QueryClient,
};
use hourglass_sketch::Sketch;
use tonic::transport::Channel;

/// A config file with fast retries, so tests do not wait on the default backoff.
pub(crate) fn fast_config(dir: &TempDir, extra: &str) -> String {
    let path = dir.file("agent.toml");
    std::fs::write(
        &path,
        format!("[shipping]\nbackoff_initial = \"100ms\"\nbackoff_max = \"500ms\"\n{extra}"),
    )
    .expect("write config");
    path
}

fn tag(key: &str, value: &str) -> v1::Tag {
    v1::Tag {
        key: key.into(),
        value: value.into(),
    }
}

/// Sends `items` of `metric{tags}` through Ingest at `time` (0 = now).
pub(crate) async fn ingest(
    agent: &AgentProcess,
    metric: &str,
    tags: &[(&str, &str)],
    items: &[String],
    time: i64,
) -> v1::IngestResponse {
    let mut client = IngestClient::new(channel(&agent.ingest).await);
    let events = items
        .iter()
        .map(|i| v1::Event {
            metric: metric.into(),
            item: i.clone().into_bytes().into(),
            tags: tags.iter().map(|(k, v)| tag(k, v)).collect(),
            time_unix_seconds: time,
            weight: 0,
        })
        .collect();
    client
        .send(v1::IngestRequest {
            events,
            batches: Vec::new(),
        })
        .await
        .expect("ingest call")
        .into_inner()
}

/// Sends `lines` over UDP, many per datagram, paced so loopback does not drop.
fn send_udp(to: std::net::SocketAddr, lines: &[String]) {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    let mut datagram = String::new();
    for line in lines {
        if datagram.len() + line.len() + 1 > 1400 {
            socket.send_to(datagram.as_bytes(), to).expect("send");
            datagram.clear();
            std::thread::sleep(Duration::from_micros(200));
        }
        datagram.push_str(line);
        datagram.push('\n');
    }
    if !datagram.is_empty() {
        socket.send_to(datagram.as_bytes(), to).expect("send");
    }
}

/// Waits until `agent`'s metric `name` reaches `at_least`.
fn wait_metric(agent: &AgentProcess, name: &str, at_least: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = agent.metric(name);
        if v >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} is {v}, expected at least {at_least}; logs:\n{}",
            agent.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the agent has nothing unacknowledged and has pushed since `since` events.
pub(crate) fn wait_shipped(agent: &AgentProcess) {
    let deadline = Instant::now() + Duration::from_secs(30);
    // One flush after the events assigns versions and pushes; require two successful
    // flushes to be sure the events were in one of them.
    let flushes = agent.metric(r#"flushes_total{outcome="ok"}"#);
    loop {
        let done = agent.metric(r#"flushes_total{outcome="ok"}"#) >= flushes + 2.0
            && agent.metric("pending_snapshots") == 0.0;
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "agent did not ship; logs:\n{}",
            agent.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn selector(metric: &str, hours: std::ops::Range<u32>, servers: &[&str]) -> Option<v1::Selector> {
    Some(v1::Selector {
        metric: metric.into(),
        range: Some(v1::TimeRange {
            start_hour: hours.start,
            end_hour: hours.end,
        }),
        servers: servers.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
}

/// The merged sketch of `kind` for `servers` over `hours`, as exported.
pub(crate) async fn export(
    agg: &impl AggregatorAddrs,
    metric: &str,
    kind: v1::SketchKind,
    hours: std::ops::Range<u32>,
    servers: &[&str],
) -> Vec<u8> {
    let mut q = QueryClient::new(channel(agg.grpc()).await);
    q.export(v1::ExportRequest {
        selector: selector(metric, hours, servers),
        kind: kind as i32,
    })
    .await
    .expect("export")
    .into_inner()
    .sketch
    .map(|s| s.data.to_vec())
    .unwrap_or_default()
}

async fn distinct(
    agg: &impl AggregatorAddrs,
    metric: &str,
    hours: std::ops::Range<u32>,
    servers: &[&str],
) -> v1::DistinctAnswer {
    let mut q = QueryClient::new(channel(agg.grpc()).await);
    q.distinct(v1::DistinctRequest {
        selector: selector(metric, hours, servers),
    })
    .await
    .expect("distinct")
    .into_inner()
    .answer
    .expect("answer")
}

fn users(range: std::ops::Range<u32>) -> Vec<String> {
    range.map(|i| format!("user{i}")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn events_over_udp_and_grpc_answer_within_their_error() {
    let dir = TempDir::new("agent-answers");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let config = fast_config(&dir, "");
    let agent = AgentProcess::start(
        "web-1",
        &agg.grpc,
        &dir.file("agent"),
        &[
            "--flush-interval",
            "200ms",
            "--default-kinds",
            "distinct,frequency,membership",
            "--config",
            &config,
            "--label",
            "region=eu",
        ],
    );
    // 6,000 users over UDP, in multi-line datagrams; tags in either order are one series.
    let lines: Vec<String> = (0..6000u32)
        .map(|i| {
            if i % 2 == 0 {
                format!("visitors:user{i}|s|#country:de,device:mobile")
            } else {
                format!("visitors:user{i}|s|#device:mobile,country:de")
            }
        })
        .collect();
    let statsd = agent.statsd;
    tokio::task::spawn_blocking(move || send_udp(statsd, &lines))
        .await
        .unwrap();
    // 3,000 more over gRPC, 1,000 of them already seen: 8,000 distinct in all.
    let reply = ingest(
        &agent,
        "visitors",
        &[("country", "de"), ("device", "mobile")],
        &users(5000..8000),
        0,
    )
    .await;
    assert_eq!((reply.accepted, reply.rejected), (3000, 0));
    // The same page 700 times over gRPC and 300 over UDP, with other pages between.
    let pages: Vec<String> = (0..1000)
        .map(|i| {
            if i % 10 < 7 {
                "/cart".into()
            } else {
                format!("/p{i}")
            }
        })
        .collect();
    ingest(&agent, "pages", &[], &pages, 0).await;
    let udp_pages: Vec<String> = (0..300).map(|_| "pages:/cart|s".to_string()).collect();
    tokio::task::spawn_blocking(move || send_udp(statsd, &udp_pages))
        .await
        .unwrap();
    // Bad and unsupported input is counted by reason and stops nothing.
    let garbage = vec![
        "no-colon".to_string(),
        "visitors:x|q".into(),
        "9bad:x|s".into(),
        "hits:1|c".into(),
        format!("visitors:late|s|T{}", now_secs() - 3 * 3600),
        "visitors:\u{0}|s|#a:b,a:c".into(),
    ];
    tokio::task::spawn_blocking(move || send_udp(statsd, &garbage))
        .await
        .unwrap();
    wait_metric(&agent, r#"events_total{source="statsd"}"#, 6300.0);
    wait_shipped(&agent);

    let h = this_hour();
    // Events may straddle an hour boundary: ask for both.
    let hours = h - 1..h + 1;
    let answer = distinct(&agg, "visitors", hours.clone(), &["web-1"]).await;
    let truth = 8000.0;
    assert!(
        (answer.estimate - truth).abs() <= 4.0 * answer.std_error,
        "estimate {} vs truth {truth} (se {})",
        answer.estimate,
        answer.std_error
    );
    let via_cli = hourglass(
        &[
            "query",
            "frequency",
            "--metric",
            "pages",
            "--item",
            "/cart",
            "--aggregator",
            &agg.grpc,
            "--from",
            &hourglass_rpc::time::hour_start(hours.start).to_rfc3339(),
            "--to",
            &hourglass_rpc::time::hour_start(hours.end).to_rfc3339(),
            "--label",
            "region=eu",
            "--json",
        ],
        b"",
    )
    .ok()
    .json();
    let estimate = via_cli["estimate"].as_u64().expect("estimate");
    let over = via_cli["max_overcount"].as_u64().expect("max_overcount");
    assert!((1000..=1000 + over).contains(&estimate), "{via_cli}");
    let mut q = QueryClient::new(channel(&agg.grpc).await);
    let seen = |item: &str| {
        let mut q = q.clone();
        let item = item.as_bytes().to_vec();
        let sel = selector("visitors", hours.clone(), &[]);
        async move {
            q.membership(v1::MembershipRequest {
                selector: sel,
                item,
            })
            .await
            .expect("membership")
            .into_inner()
            .answer
            .expect("answer")
            .maybe_present
        }
    };
    assert!(seen("user7999").await && seen("user0").await);
    assert!(!seen("user-never").await);
    q.list_series(v1::ListSeriesRequest::default())
        .await
        .expect("list series");

    let (_, metrics) = http_get(agent.admin, "/metrics");
    for (line, reason) in [
        ("no-colon", "no_value"),
        ("visitors:x|q", "unknown_type"),
        ("9bad:x|s", "bad_metric"),
        ("late", "too_late"),
        ("duplicate", "duplicate_tag"),
    ] {
        let want =
            format!(r#"hourglass_agent_rejected_total{{source="statsd",reason="{reason}"}} 1"#);
        assert!(
            metrics.contains(&want),
            "{line}: {want} missing from\n{metrics}"
        );
    }
    assert!(
        metrics.contains("hourglass_agent_unsupported_lines_total 1"),
        "{metrics}"
    );
    assert_eq!(http_get(agent.admin, "/readyz").0, 200);
    assert_eq!(agent.terminate().code(), Some(0));
    agg.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_makes_a_final_flush() {
    let dir = TempDir::new("agent-term");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    // A flush interval far beyond the test: only the final flush can ship.
    let agent = AgentProcess::start(
        "web-1",
        &agg.grpc,
        &dir.file("agent"),
        &["--flush-interval", "1h"],
    );
    let reply = ingest(&agent, "visitors", &[], &users(0..50), 0).await;
    assert_eq!(reply.accepted, 50);
    assert_eq!(agent.terminate().code(), Some(0));
    let h = this_hour();
    let answer = distinct(&agg, "visitors", h - 1..h + 1, &["web-1"]).await;
    assert_eq!(answer.estimate.round(), 50.0, "small counts are exact");
    agg.stop().await;
}

/// Starts a "ref" and a "fault" agent with the same config, shipping to `aggregator`.
fn pair(dir: &TempDir, aggregator: &str, extra: &[&str]) -> (AgentProcess, AgentProcess) {
    let config = fast_config(dir, "");
    let mut args = vec!["--flush-interval", "200ms", "--config", &config];
    args.extend_from_slice(extra);
    (
        AgentProcess::start("ref", aggregator, &dir.file("ref"), &args),
        AgentProcess::start("fault", aggregator, &dir.file("fault"), &args),
    )
}

/// Requires the two servers' merged sketches of every kind to be byte-identical.
async fn same_answers(agg: &impl AggregatorAddrs, metric: &str, hours: std::ops::Range<u32>) {
    for kind in [v1::SketchKind::Distinct, v1::SketchKind::Frequency] {
        let a = export(agg, metric, kind, hours.clone(), &["ref"]).await;
        let b = export(agg, metric, kind, hours.clone(), &["fault"]).await;
        assert!(!a.is_empty(), "{kind:?}: nothing stored");
        assert!(
            a == b,
            "{kind:?}: the faulty run's sketch differs from the reference"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn aggregator_away_then_back_loses_nothing_and_a_killed_agent_resumes_from_its_checkpoint() {
    let dir = TempDir::new("agent-faults");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let (reference, fault) = pair(&dir, &url, &[]);
    let epoch = fault.metric("epoch");
    assert!(epoch > 0.0);
    // The aggregator is not there: both agents hold and retry.
    for agent in [&reference, &fault] {
        ingest(agent, "visitors", &[("country", "de")], &users(0..3000), 0).await;
        ingest(
            agent,
            "visitors",
            &[("country", "fr")],
            &users(2000..2500),
            0,
        )
        .await;
    }
    wait_metric(&fault, r#"pushes_total{outcome="unavailable"}"#, 3.0);
    wait_metric(&fault, r#"checkpoints_total{outcome="ok"}"#, 3.0);
    assert!(
        fault.metric("pending_snapshots") >= 4.0,
        "two series, two kinds each"
    );
    assert!(fault.metric("pending_bytes") > 0.0);
    assert!(fault.metric("oldest_unacked_hour_timestamp_seconds") > 0.0);
    assert_eq!(fault.metric("last_push_timestamp_seconds"), 0.0);
    // The faulty agent dies with everything unshipped, and comes back from its checkpoint.
    fault.kill();
    let config = fast_config(&dir, "");
    let fault = AgentProcess::start(
        "fault",
        &url,
        &dir.file("fault"),
        &["--flush-interval", "200ms", "--config", &config],
    );
    assert_eq!(fault.metric("epoch"), epoch, "the same epoch continues");
    assert_eq!(
        fault.metric(r#"checkpoint_lost_total{reason="corrupt"}"#),
        0.0
    );
    // More events after the restart, to both.
    for agent in [&reference, &fault] {
        ingest(
            agent,
            "visitors",
            &[("country", "de")],
            &users(2500..4000),
            0,
        )
        .await;
    }
    // The aggregator arrives.
    let agg = AggregatorProcess::start_on(&format!("127.0.0.1:{port}"), &dir.file("agg"), &[]);
    wait_shipped(&reference);
    wait_shipped(&fault);
    assert!(fault.metric("last_push_timestamp_seconds") > 0.0);
    let h = this_hour();
    same_answers(&agg, "visitors", h - 1..h + 1).await;
    let answer = distinct(&agg, "visitors", h - 1..h + 1, &["fault"]).await;
    assert!(
        (answer.estimate - 4000.0).abs() <= 4.0 * answer.std_error,
        "{answer:?}"
    );
    assert!(reference.metric("snapshots_retried_total") > 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_checkpoint_starts_a_new_epoch_loudly() {
    let dir = TempDir::new("agent-corrupt");
    let data = dir.file("agent");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        format!("{data}/checkpoint"),
        b"HGCP\x01 this is not a checkpoint",
    )
    .unwrap();
    let agent = AgentProcess::start("web-1", "http://127.0.0.1:1", &data, &[]);
    assert_eq!(
        agent.metric(r#"checkpoint_lost_total{reason="corrupt"}"#),
        1.0
    );
    assert!(
        agent.logs().contains("CHECKPOINT UNUSABLE"),
        "{}",
        agent.logs()
    );
    let kept = std::fs::read_dir(&data)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("checkpoint.corrupt-")
        });
    assert!(kept, "the damaged file is kept aside for a post-mortem");
    // And it still takes events.
    assert_eq!(
        ingest(&agent, "visitors", &[], &users(0..5), 0)
            .await
            .accepted,
        5
    );
    // A second agent on the same data dir is refused with one clear line.
    let (out, stderr) = start_only("x", &data);
    assert!(
        !out.status.success() && stderr.contains("in use by another agent"),
        "{stderr}"
    );
}

/// Runs `hourglass-agent` as `name` on `data` with no UDP port, for a start that is
/// expected to fail; its output and stderr.
fn start_only(name: &str, data: &str) -> (std::process::Output, String) {
    let out = std::process::Command::new(crate::util::server_binary("hourglass-agent"))
        .args([
            "--server-name",
            name,
            "--statsd-listen",
            "off",
            "--ingest-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

/// A Collector that forwards every push to the real aggregator and records it.
struct Recorder {
    upstream: CollectorClient<Channel>,
    pushes: Arc<Mutex<Vec<v1::PushRequest>>>,
}

#[tonic::async_trait]
impl v1::collector_server::Collector for Recorder {
    async fn push(
        &self,
        request: tonic::Request<v1::PushRequest>,
    ) -> Result<tonic::Response<v1::PushResponse>, tonic::Status> {
        let request = request.into_inner();
        self.pushes.lock().unwrap().push(request.clone());
        self.upstream.clone().push(request).await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn duplicated_and_reordered_pushes_change_nothing() {
    let dir = TempDir::new("agent-replay");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let pushes = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = format!("http://{}", listener.local_addr().unwrap());
    let recorder = Recorder {
        upstream: CollectorClient::new(channel(&agg.grpc).await),
        pushes: Arc::clone(&pushes),
    };
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                v1::collector_server::CollectorServer::new(recorder)
                    .accept_compressed(tonic::codec::CompressionEncoding::Zstd),
            )
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let config = fast_config(&dir, "");
    let agent = AgentProcess::start(
        "web-1",
        &proxy,
        &dir.file("agent"),
        &["--flush-interval", "200ms", "--config", &config],
    );
    // Several rounds, so the same (series, hour) is pushed at several versions.
    for round in 0..4u32 {
        ingest(
            &agent,
            "visitors",
            &[],
            &users(round * 500..round * 500 + 700),
            0,
        )
        .await;
        wait_shipped(&agent);
    }
    let h = this_hour();
    let before_d = export(
        &agg,
        "visitors",
        v1::SketchKind::Distinct,
        h - 1..h + 1,
        &[],
    )
    .await;
    let before_f = export(
        &agg,
        "visitors",
        v1::SketchKind::Frequency,
        h - 1..h + 1,
        &[],
    )
    .await;
    let recorded = pushes.lock().unwrap().clone();
    let versions: std::collections::BTreeSet<u64> = recorded
        .iter()
        .flat_map(|p| p.snapshots.iter().map(|s| s.version))
        .collect();
    assert!(
        versions.len() >= 4,
        "several versions were pushed: {versions:?}"
    );
    // Every recorded push again, newest first, twice over.
    let mut direct = CollectorClient::new(channel(&agg.grpc).await);
    for request in recorded.iter().rev().chain(recorded.iter()) {
        let results = direct
            .push(request.clone())
            .await
            .expect("replay")
            .into_inner()
            .results;
        for r in results {
            assert_eq!(r.outcome(), v1::PushOutcome::Stale, "{r:?}");
        }
    }
    assert_eq!(
        export(
            &agg,
            "visitors",
            v1::SketchKind::Distinct,
            h - 1..h + 1,
            &[]
        )
        .await,
        before_d
    );
    assert_eq!(
        export(
            &agg,
            "visitors",
            v1::SketchKind::Frequency,
            h - 1..h + 1,
            &[]
        )
        .await,
        before_f
    );
    // The frequency total counts every event once: 4 rounds of 700.
    match Sketch::decode(&before_f).expect("frequency sketch") {
        Sketch::Frequency(f) => assert_eq!(f.total(), 2800),
        other => panic!("{:?}", other.kind()),
    }
    drop(agent);
    server.abort();
    agg.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn events_from_past_days_land_in_their_own_hours() {
    let dir = TempDir::new("agent-backfill");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let config = fast_config(&dir, "");
    let agent = AgentProcess::start(
        "web-1",
        &agg.grpc,
        &dir.file("agent"),
        &[
            "--flush-interval",
            "200ms",
            "--lateness",
            "4d",
            "--config",
            &config,
        ],
    );
    let now = now_secs();
    // Day d (1..=3 days ago) gets 20·d users of its own, all at one moment of that day.
    for d in 1..=3u32 {
        let time = now - i64::from(d) * 86_400;
        let reply = ingest(
            &agent,
            "signups",
            &[],
            &users(d * 1000..d * 1000 + 20 * d),
            time,
        )
        .await;
        assert_eq!(reply.accepted, u64::from(20 * d));
    }
    // Older than the window: refused, and the reply says why.
    let reply = ingest(&agent, "signups", &[], &users(0..1), now - 6 * 86_400).await;
    assert_eq!(reply.rejected, 1);
    assert!(
        reply.rejected_events[0].reason.contains("closed"),
        "{:?}",
        reply.rejected_events
    );
    wait_shipped(&agent);
    for d in 1..=3u32 {
        let hour = ((now - i64::from(d) * 86_400) / 3600) as u32;
        let answer = distinct(&agg, "signups", hour..hour + 1, &[]).await;
        assert_eq!(answer.estimate.round() as u32, 20 * d, "day -{d}");
        // And nothing in the hour after it.
        let next = distinct(&agg, "signups", hour + 1..hour + 2, &[]).await;
        assert_eq!(next.estimate, 0.0, "day -{d}, next hour");
    }
    let h = this_hour();
    let week = distinct(&agg, "signups", h - 24 * 7..h + 1, &[]).await;
    assert_eq!(week.estimate.round(), 120.0);
    agg.stop().await;
}

#[test]
fn send_command_reports_what_the_agent_took() {
    let dir = TempDir::new("agent-send");
    let agent = AgentProcess::start("web-1", "http://127.0.0.1:1", &dir.file("agent"), &[]);
    let file = dir.file("items.txt");
    std::fs::write(&file, "a\nb\n\nc\n").unwrap();
    let run = hourglass(
        &[
            "send",
            "--agent",
            &agent.ingest,
            "visitors",
            "x",
            "y",
            "--tag",
            "country=de",
            "--file",
            &file,
        ],
        b"",
    )
    .ok();
    assert!(
        run.text().contains("sent 5 events") && run.text().contains("5 accepted, 0 rejected"),
        "{}",
        run.text()
    );
    let long = "z".repeat(2000);
    let run = hourglass(
        &["send", "--agent", &agent.ingest, "visitors", "ok", &long],
        b"",
    );
    assert!(!run.status.success());
    assert!(
        run.text().contains("1 accepted, 1 rejected")
            && run.text().contains("item 2: item is 2000 bytes"),
        "{}",
        run.text()
    );
    let run = hourglass(
        &["send", "--agent", "http://127.0.0.1:1", "visitors", "x"],
        b"",
    );
    assert!(
        run.stderr.contains("cannot reach the agent"),
        "{}",
        run.stderr
    );
}

/// grpcurl and most gRPC tools take `host:port`: so do the agent's `--aggregator`,
/// `send --agent` and `query --aggregator`, meaning http:// without TLS flags.
#[test]
fn every_address_flag_takes_host_port() {
    let dir = TempDir::new("agent-host-port");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let agg_hostport = agg
        .grpc
        .strip_prefix("http://")
        .expect("http URL")
        .to_string();
    let agent = AgentProcess::start(
        "web-1",
        &agg_hostport,
        &dir.file("agent"),
        &["--flush-interval", "1s"],
    );
    let agent_hostport = agent.ingest.strip_prefix("http://").expect("http URL");
    let run = hourglass(
        &["send", "--agent", agent_hostport, "visitors", "a", "b", "c"],
        b"",
    )
    .ok();
    assert!(run.text().contains("3 accepted"), "{}", run.text());
    wait_shipped(&agent);
    let h = this_hour();
    let answer = hourglass(
        &[
            "query",
            "distinct",
            "--metric",
            "visitors",
            "--aggregator",
            &agg_hostport,
            "--from",
            &hourglass_rpc::time::hour_start(h - 1).to_rfc3339(),
            "--to",
            &hourglass_rpc::time::hour_start(h + 1).to_rfc3339(),
            "--json",
        ],
        b"",
    )
    .ok()
    .json();
    assert_eq!(
        answer["estimate"].as_f64().map(f64::round),
        Some(3.0),
        "{answer}"
    );
    // Something that is neither host:port nor a URL is one clear line.
    let run = hourglass(&["send", "--agent", "ftp://x:1", "visitors", "a"], b"");
    assert!(!run.status.success());
    assert!(run.stderr.contains("host:port"), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn series_batches_take_per_item_times_and_refuse_mismatched_columns() {
    let dir = TempDir::new("agent-batches");
    let agent = AgentProcess::start("web-1", "http://127.0.0.1:1", &dir.file("agent"), &[]);
    let mut client = IngestClient::new(channel(&agent.ingest).await);
    let now = now_secs();
    let batch = |items: Vec<&str>, times: Vec<i64>| v1::SeriesBatch {
        metric: "visitors".into(),
        tags: vec![tag("country", "de")],
        items: items.into_iter().map(str::as_bytes).collect(),
        times_unix_seconds: times,
        ..Default::default()
    };
    let reply = client
        .send(v1::IngestRequest {
            events: vec![v1::Event {
                metric: "visitors".into(),
                item: b"solo".to_vec().into(),
                ..Default::default()
            }],
            batches: vec![
                // Per-item times: the second is a day old and refused, by its own index.
                batch(vec!["a", "b", "c"], vec![now, now - 86_400, 0]),
                // Two times for three items: the whole batch is refused.
                batch(vec!["d", "e", "f"], vec![now, now]),
            ],
        })
        .await
        .expect("ingest")
        .into_inner();
    assert_eq!((reply.accepted, reply.rejected), (3, 4), "{reply:?}");
    let indexes: Vec<u32> = reply.rejected_events.iter().map(|r| r.index).collect();
    assert_eq!(indexes, vec![2, 4, 5, 6]);
    assert!(
        reply.rejected_events[1].reason.contains("2 times"),
        "{reply:?}"
    );
    let (_, metrics) = http_get(agent.admin, "/metrics");
    assert!(
        metrics.contains(r#"hourglass_agent_rejected_total{source="ingest",reason="bad_batch"} 3"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn packed_items_count_as_items_and_a_cut_field_refuses_its_batch() {
    use hourglass_rpc::packed;
    let dir = TempDir::new("agent-packed");
    let agent = AgentProcess::start("web-1", "http://127.0.0.1:1", &dir.file("agent"), &[]);
    let mut client = IngestClient::new(channel(&agent.ingest).await);
    let now = now_secs();
    let batch = |field: Vec<u8>, items: Vec<&str>, times: Vec<i64>| v1::SeriesBatch {
        metric: "visitors".into(),
        packed_items: field.into(),
        items: items.iter().map(|i| i.as_bytes()).collect(),
        times_unix_seconds: times,
        ..Default::default()
    };
    let abc = packed::pack([&b"a"[..], b"b", b"c"]);
    let mut cut = packed::pack([&b"d"[..], b"e"]);
    cut.extend_from_slice(&[9, b'f']);
    let reply = client
        .send(v1::IngestRequest {
            events: vec![],
            batches: vec![
                // Per-item times as with `items`: the second is a day old, refused alone.
                batch(abc.clone(), vec![], vec![now, now - 86_400, 0]),
                // A field that ends inside its third item: all three refused.
                batch(cut, vec![], vec![]),
                // Both forms in one batch: refused, one event per item of either.
                batch(abc, vec!["g"], vec![]),
                // An empty packed field with items is the plain form.
                batch(vec![], vec!["h", "i"], vec![now]),
            ],
        })
        .await
        .expect("ingest")
        .into_inner();
    assert_eq!((reply.accepted, reply.rejected), (4, 8), "{reply:?}");
    let indexes: Vec<u32> = reply.rejected_events.iter().map(|r| r.index).collect();
    assert_eq!(indexes, vec![1, 3, 4, 5, 6, 7, 8, 9]);
    assert!(
        reply.rejected_events[1]
            .reason
            .contains("packed_items: item 2 (at byte 4)"),
        "{reply:?}"
    );
    assert!(
        reply.rejected_events[4].reason.contains("one or the other"),
        "{reply:?}"
    );
    // a, c, h and i, in the sketch: the distinct count is exact this small.
    let (_, metrics) = http_get(agent.admin, "/metrics");
    assert!(
        metrics.contains(r#"hourglass_agent_rejected_total{source="ingest",reason="bad_batch"} 7"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"hourglass_agent_events_total{source="ingest"} 4"#),
        "{metrics}"
    );
}

#[test]
fn dogstatsd_over_a_unix_datagram_socket() {
    let dir = TempDir::new("agent-unix");
    let path = dir.file("statsd.sock");
    // A stale socket file from an earlier run is replaced, not an error.
    drop(std::os::unix::net::UnixDatagram::bind(&path).unwrap());
    let agent = AgentProcess::start(
        "web-1",
        "http://127.0.0.1:1",
        &dir.file("agent"),
        &["--statsd-socket", &path],
    );
    let socket = std::os::unix::net::UnixDatagram::unbound().unwrap();
    let lines: String = (0..100)
        .map(|i| format!("visitors:user{i}|s|#country:de\n"))
        .collect();
    socket.send_to(lines.as_bytes(), &path).unwrap();
    socket.send_to(b"visitors:x|s|bogus", &path).unwrap();
    wait_metric(&agent, r#"events_total{source="statsd"}"#, 100.0);
    wait_metric(
        &agent,
        r#"rejected_total{source="statsd",reason="unknown_section"}"#,
        1.0,
    );
    assert_eq!(agent.metric("datagrams_total"), 2.0);
}

#[test]
fn a_checkpoint_of_another_server_is_refused() {
    let dir = TempDir::new("agent-rename");
    let data = dir.file("agent");
    let agent = AgentProcess::start("web-1", "http://127.0.0.1:1", &data, &[]);
    assert_eq!(agent.terminate().code(), Some(0));
    let out = std::process::Command::new(crate::util::server_binary("hourglass-agent"))
        .args([
            "--server-name",
            "web-2",
            "--statsd-listen",
            "off",
            "--ingest-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
            &data,
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("belongs to server \"web-1\""), "{stderr}");
    // The checkpoint is left as it was: web-1 still starts from it.
    let again = AgentProcess::start("web-1", "http://127.0.0.1:1", &data, &[]);
    assert_eq!(
        again.metric(r#"checkpoint_lost_total{reason="corrupt"}"#),
        0.0
    );
}

/// An agent that cannot start prints one `error: …` line naming the cause once, as it did
/// before its library returned `AgentError`: the binary prints errors with `{:#}`, which
/// appends every `source()`, so a variant that both shows its source and marks it as the
/// source says the cause twice.
#[test]
fn an_agent_that_cannot_start_names_the_cause_once() {
    let dir = TempDir::new("agent-start-errors");
    std::fs::write(dir.file("plain-file"), b"").unwrap();
    let under_a_file = dir.file("plain-file/data");
    // A checkpoint that is a directory cannot be read (EISDIR), and is left as it is.
    let unreadable = dir.file("unreadable");
    std::fs::create_dir_all(dir.file("unreadable/checkpoint")).unwrap();
    let cases: [(&str, &str, &str); 3] = [
        (
            "web 1|bad",
            &dir.file("data"),
            "(--server-name, or the hostname)",
        ),
        ("web-1", &under_a_file, "cannot create the data dir"),
        ("web-1", &unreadable, "cannot read the checkpoint"),
    ];
    for (name, data, what) in cases {
        let (out, stderr) = start_only(name, data);
        assert!(!out.status.success(), "{stderr}");
        let line = stderr
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or_else(|| panic!("no error line: {stderr}"));
        assert!(line.contains(what), "{line}");
        // The cause is the text after the last ": " (or, for the name, before " (--");
        // it must appear once.
        let cause = match line.split_once(" (--server-name") {
            Some((head, _)) => head.trim_start_matches("error: ").to_string(),
            None => line.rsplit(": ").next().unwrap().to_string(),
        };
        assert_eq!(line.matches(&cause).count(), 1, "{cause:?} twice in {line}");
    }
}

/// Issue 13: an aggregator refuses a push declaring more live hours than its
/// `limits.max_live_hours_per_push`. That must cost an agent no snapshot and no live hour:
/// "auto" keeps the default (10,000 a push) and sends fewer once refused, "set" is
/// configured to the aggregator's limit and is never refused. Both hold events in eight
/// hours, and every event must be stored.
#[tokio::test(flavor = "multi_thread")]
async fn live_hours_beyond_the_aggregators_limit_go_in_chunks_and_cost_no_snapshot() {
    let dir = TempDir::new("agent-live-chunks");
    let agg_config = dir.file("aggregator.toml");
    std::fs::write(&agg_config, "[limits]\nmax_live_hours_per_push = 3\n").expect("write config");
    let agg = InProcessAggregator::start_from_file(&dir.file("agg"), &agg_config);
    let auto_config = fast_config(&dir, "");
    let set_config = dir.file("agent-set.toml");
    std::fs::write(
        &set_config,
        "[shipping]\nbackoff_initial = \"100ms\"\nbackoff_max = \"500ms\"\nmax_live_hours_per_push = 3\n",
    )
    .expect("write config");
    let start = |name: &str, config: &str| {
        let args = [
            "--flush-interval",
            "200ms",
            "--lateness",
            "12h",
            "--config",
            config,
        ];
        AgentProcess::start(name, &agg.grpc, &dir.file(name), &args)
    };
    let agents = [
        ("auto", start("auto", &auto_config)),
        ("set", start("set", &set_config)),
    ];

    // Hour k back (k = 0..8) gets 5 + k users of its own, all in one Ingest call, so the
    // first flush holds eight live hours: more than the aggregator takes in one push.
    let now = now_secs();
    let hours: Vec<(u32, u32)> = (0..8u32)
        .map(|k| (((now - i64::from(k) * 3600) / 3600) as u32, 5 + k))
        .collect();
    let events: Vec<v1::Event> = (0..8u32)
        .flat_map(|k| {
            (0..5 + k).map(move |i| v1::Event {
                metric: "visits".into(),
                item: format!("h{k}-user{i}").into_bytes().into(),
                time_unix_seconds: now - i64::from(k) * 3600,
                ..Default::default()
            })
        })
        .collect();
    let total: u32 = hours.iter().map(|(_, n)| n).sum();
    assert_eq!(events.len(), total as usize);
    for (_, agent) in &agents {
        let mut client = IngestClient::new(channel(&agent.ingest).await);
        let reply = client
            .send(v1::IngestRequest {
                events: events.clone(),
                batches: Vec::new(),
            })
            .await
            .expect("ingest")
            .into_inner();
        assert_eq!((reply.accepted, reply.rejected), (u64::from(total), 0));
    }
    for (_, agent) in &agents {
        wait_shipped(agent);
    }

    let range = hours[7].0..hours[0].0 + 1;
    let mut q = QueryClient::new(channel(&agg.grpc).await);
    for (name, agent) in &agents {
        // Nothing was dropped, and a counter would say so if it had been.
        assert_eq!(agent.metric("snapshots_rejected_total"), 0.0, "{name}");
        assert_eq!(agent.metric("live_hours_dropped_total"), 0.0, "{name}");
        // Every hour holds exactly its users (small counts are exact) ...
        for &(hour, users) in &hours {
            let answer = distinct(&agg, "visits", hour..hour + 1, &[name]).await;
            assert_eq!(
                answer.estimate.round() as u32,
                users,
                "{name}: hour {hour}; logs:\n{}",
                agent.logs()
            );
        }
        // ... the range holds every event once, and every hour was declared live.
        let reply = q
            .distinct(v1::DistinctRequest {
                selector: selector("visits", range.clone(), &[name]),
            })
            .await
            .expect("distinct")
            .into_inner();
        assert_eq!(reply.answer.expect("answer").estimate.round() as u32, total);
        let coverage = reply.coverage.expect("coverage");
        assert_eq!(
            (coverage.sketches_merged, coverage.server_hours_missing),
            (8, 0),
            "{name}: {coverage:?}"
        );
        let frequency = export(
            &agg,
            "visits",
            v1::SketchKind::Frequency,
            range.clone(),
            &[name],
        )
        .await;
        match Sketch::decode(&frequency).expect("frequency sketch") {
            Sketch::Frequency(f) => assert_eq!(f.total(), u64::from(total), "{name}"),
            other => panic!("{name}: {:?}", other.kind()),
        }
    }
    let refused =
        |agent: &AgentProcess| agent.metric(r#"pushes_total{outcome="resource_exhausted"}"#);
    assert!(
        refused(&agents[0].1) >= 1.0,
        "the default was above the aggregator's limit"
    );
    assert_eq!(
        refused(&agents[1].1),
        0.0,
        "set to the aggregator's limit: never refused"
    );
    agg.stop().await;
}

/// The distinct estimate of `metric` over `hours`, rounded; 0 before anything arrived.
async fn distinct_or_zero(
    agg: &impl AggregatorAddrs,
    metric: &str,
    hours: std::ops::Range<u32>,
) -> f64 {
    let mut q = QueryClient::new(channel(agg.grpc()).await);
    match q
        .distinct(v1::DistinctRequest {
            selector: selector(metric, hours, &[]),
        })
        .await
    {
        Ok(r) => r.into_inner().answer.map_or(0.0, |a| a.estimate.round()),
        Err(status) if status.code() == tonic::Code::NotFound => 0.0,
        Err(status) => panic!("distinct {metric}: {status:?}"),
    }
}

/// Sets the file-size limit (RLIMIT_FSIZE) of process `pid`: what a full disk does to
/// the agent's checkpoint (writes past it fail with EFBIG), without a mount.
fn limit_file_size(pid: u32, bytes: Option<u64>) {
    use rustix::process::{Pid, Resource, Rlimit, prlimit};
    // `None` would mean this test process: a pid that does not convert is a bug.
    let target = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .expect("a positive pid that fits pid_t");
    let limit = Rlimit {
        current: bytes,
        maximum: None,
    };
    if let Err(e) = prlimit(Some(target), Resource::Fsize, limit) {
        panic!("prlimit({pid}, RLIMIT_FSIZE): {e}");
    }
}

/// The agent's disk fills (its file-size limit drops to what its checkpoint files hold):
/// checkpoints fail, new versions wait and nothing is acknowledged that no checkpoint
/// holds; the agent stays up. When space returns, everything it collected meanwhile
/// arrives, and the aggregator answers the exact truth.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_at_the_agent_loses_nothing_once_space_returns() {
    let dir = TempDir::new("agent-disk-full");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let data = dir.file("agent");
    let agent = AgentProcess::start("web-1", &agg.grpc, &data, &["--flush-interval", "1s"]);
    let hour = this_hour();
    let hours = hour - 1..hour + 2;
    ingest(&agent, "visitors", &[], &users(0..100), 0).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while distinct_or_zero(&agg, "visitors", hours.clone()).await != 100.0 {
        assert!(Instant::now() < deadline, "{}", agent.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The disk is full: no checkpoint file may grow.
    let held: u64 = std::fs::read_dir(&data)
        .expect("data dir")
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0);
    limit_file_size(agent.pid(), Some(held));
    ingest(&agent, "visitors", &[], &users(100..300), 0).await;
    ingest(&agent, "buyers", &[], &users(0..50), 0).await;
    let failed = |agent: &AgentProcess| agent.metric(r#"checkpoints_total{outcome="error"}"#);
    let deadline = Instant::now() + Duration::from_secs(30);
    while failed(&agent) < 3.0 {
        assert!(
            Instant::now() < deadline,
            "checkpoints did not fail: {}",
            agent.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing a checkpoint does not hold was shipped: the aggregator still has 100.
    assert_eq!(
        distinct_or_zero(&agg, "visitors", hours.clone()).await,
        100.0
    );
    assert!(
        agent.metric("awaiting_checkpoint_entries") >= 1.0,
        "{}",
        agent.logs()
    );
    // Space returns: the next checkpoint holds everything, and it all arrives.
    limit_file_size(agent.pid(), None);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let visitors = distinct_or_zero(&agg, "visitors", hours.clone()).await;
        let buyers = distinct_or_zero(&agg, "buyers", hours.clone()).await;
        if visitors == 300.0 && buyers == 50.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "visitors {visitors}, buyers {buyers}: {}",
            agent.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(agent.terminate().code(), Some(0));
    agg.stop().await;
}
