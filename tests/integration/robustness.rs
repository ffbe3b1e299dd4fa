//! Bad input from the network: a flood of malformed datagrams and oversized or
//! out-of-range messages leaves the agent and the aggregator serving, with every refusal
//! counted by reason.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use crate::util::{
    AgentProcess, AggregatorProcess, InProcessAggregator, TempDir, channel, http_get,
};
use hourglass_rpc::proto::v1::{
    self, collector_client::CollectorClient, ingest_client::IngestClient,
};

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_malformed_datagrams_and_oversized_requests_leaves_the_agent_serving() {
    let dir = TempDir::new("robust-agent");
    let config = dir.file("agent.toml");
    std::fs::write(&config, "[limits]\nmax_events_per_request = 1000\n").unwrap();
    let agent = AgentProcess::start(
        "web-1",
        "http://127.0.0.1:1",
        &dir.file("agent"),
        &["--config", &config],
    );
    let target = agent.statsd;
    let sent_good = tokio::task::spawn_blocking(move || {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        // A fixed xorshift stream of garbage: every byte value, newlines, long lines.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut good = 0u64;
        for i in 0..20_000u32 {
            let len = (next() % 1400) as usize + 1;
            let mut datagram: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if i % 100 == 0 {
                // Now and then a valid line among the garbage, which must still count.
                datagram.extend_from_slice(format!("\nvisitors:user{i}|s\n").as_bytes());
                good += 1;
            }
            socket.send_to(&datagram, target).unwrap();
            // Paced so that a busy machine's socket buffer does not overflow: UDP drops
            // what it cannot hold, and this test is about parsing, not the buffer.
            if i % 50 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        good
    })
    .await
    .unwrap();
    // Every valid line among the garbage is counted (loopback, paced: no drops).
    let deadline = Instant::now() + Duration::from_secs(30);
    while agent.metric(r#"events_total{source="statsd"}"#) < sent_good as f64 {
        assert!(
            Instant::now() < deadline,
            "valid lines lost in the flood: {}",
            agent.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Lines at and past every bound, once the flood is read: an item of 64 KiB, a metric
    // name of 1,000 bytes, 100 tags.
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let huge_item = format!("visitors:{}|s", "x".repeat(60_000));
    let long_metric = format!("{}:u|s", "m".repeat(1000));
    let many_tags = format!(
        "visitors:u|s|#{}",
        (0..100)
            .map(|i| format!("k{i}:v"))
            .collect::<Vec<_>>()
            .join(",")
    );
    for line in [huge_item, long_metric, many_tags] {
        socket.send_to(line.as_bytes(), target).unwrap();
    }
    let reasons = [
        "no_value",
        "item_too_long",
        "metric_too_long",
        "too_many_tags",
    ];
    let counted = |metrics: &str| {
        reasons
            .iter()
            .all(|reason| metrics.contains(&format!("reason=\"{reason}\"")))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let (status, metrics) = http_get(agent.admin, "/metrics");
        assert_eq!(status, 200);
        if counted(&metrics) {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "not every reason of {reasons:?} counted:\n{metrics}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(agent.metric("datagrams_total") >= 20_003.0, "{metrics}");
    // The log was not flooded: bad input is logged at a bounded rate.
    let warnings = agent
        .logs()
        .lines()
        .filter(|l| l.contains("statsd line"))
        .count();
    assert!(
        warnings <= 40,
        "{warnings} log lines for 20,000 bad datagrams"
    );

    // Ingest: more events than the limit is RESOURCE_EXHAUSTED naming it; then it serves on.
    let mut ingest = IngestClient::new(channel(&agent.ingest).await);
    let event = v1::Event {
        metric: "visitors".into(),
        item: b"u".to_vec().into(),
        ..Default::default()
    };
    let e = ingest
        .send(v1::IngestRequest {
            events: vec![event.clone(); 1001],
            batches: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(
        e.message().contains("max_events_per_request"),
        "{}",
        e.message()
    );
    let ok = ingest
        .send(v1::IngestRequest {
            events: vec![event],
            batches: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.accepted, 1);
    // A message that inflates past the agent's 256 MiB Ingest limit: a few KiB of zstd on
    // the wire. tonic refuses it while decompressing, before the handler; the agent counts
    // it and names the limit.
    let bomb = v1::IngestRequest {
        events: vec![v1::Event {
            metric: "visitors".into(),
            item: vec![0u8; 257 << 20].into(),
            ..Default::default()
        }],
        batches: vec![],
    };
    let e = IngestClient::new(channel(&agent.ingest).await)
        .send_compressed(tonic::codec::CompressionEncoding::Zstd)
        .send(bomb)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("the agent's ingest message limit"),
        "{}",
        e.message()
    );
    assert_eq!(
        agent.metric(r#"requests_too_large_total{method="/hourglass.v1.Ingest/Send"}"#),
        1.0
    );
    assert_eq!(http_get(agent.admin, "/healthz").0, 200);
}

fn hll() -> Vec<u8> {
    let mut s = hourglass_sketch::hll::Hll::new(12).unwrap();
    s.insert(b"x");
    s.encode()
}

/// A dense p=14 HyperLogLog: 12 KiB.
fn dense_hll() -> Vec<u8> {
    let mut s = hourglass_sketch::hll::Hll::new(14).unwrap();
    for i in 0..100_000u32 {
        s.insert(&i.to_le_bytes());
    }
    let bytes = s.encode();
    assert!(bytes.len() > 12_000, "{} bytes", bytes.len());
    bytes
}

fn snapshot(hour: u32, data: Vec<u8>) -> v1::Snapshot {
    crate::util::snapshot("visitors", hour, 1, v1::SketchKind::Distinct, data)
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_and_out_of_range_pushes_are_refused_and_the_aggregator_serves_on() {
    let dir = TempDir::new("robust-agg");
    let config = dir.file("agg.toml");
    std::fs::write(
        &config,
        "[limits]\nmax_message_mib = 1\n[limits.max_sketch_kib]\ndistinct = 2\n",
    )
    .unwrap();
    let agg = InProcessAggregator::start_from_file(&dir.file("agg"), &config);
    let mut collector =
        CollectorClient::new(channel(&agg.grpc).await).max_encoding_message_size(64 << 20);
    let server = Some(v1::Server {
        name: "web-1".into(),
        labels: vec![],
    });
    let now = crate::util::this_hour();
    // A 2 MiB message against a 1 MiB limit, once as it is and once zstd-compressed to
    // a few hundred bytes that inflate past the limit: tonic refuses both before the
    // handler; each is RESOURCE_EXHAUSTED naming the setting, and counted.
    let big = v1::PushRequest {
        server: server.clone(),
        snapshots: vec![snapshot(now, vec![0u8; 2 << 20])],
        live_hours: vec![],
    };
    let e = collector.push(big.clone()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message()
            .contains("more than the limit of 1048576 bytes (limits.max_message_mib)"),
        "{}",
        e.message()
    );
    let e = CollectorClient::new(channel(&agg.grpc).await)
        .send_compressed(tonic::codec::CompressionEncoding::Zstd)
        .push(big)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("decompressed"), "{}", e.message());
    let (_, metrics) = http_get(agg.admin, "/metrics");
    assert!(
        metrics.contains(
            r#"hourglass_aggregator_requests_too_large_total{method="/hourglass.v1.Collector/Push"} 2"#
        ),
        "{metrics}"
    );
    // Hours out of range and garbage sketches are refused one by one; the good one is stored.
    let results = collector
        .push(v1::PushRequest {
            server,
            snapshots: vec![
                snapshot(now + 48, hll()),
                snapshot(now - 24 * 400, hll()),
                snapshot(now, b"HGSK garbage".to_vec()),
                snapshot(now, dense_hll()),
                snapshot(now, hll()),
            ],
            live_hours: vec![now],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    let outcomes: Vec<_> = results.iter().map(|r| r.outcome()).collect();
    use v1::PushOutcome::{Rejected, Stored};
    assert_eq!(
        outcomes,
        vec![Rejected, Rejected, Rejected, Rejected, Stored],
        "{results:?}"
    );
    assert!(
        results[3]
            .reason
            .contains("for a distinct sketch (limits.max_sketch_kib.distinct)"),
        "{}",
        results[3].reason
    );
    assert!(
        results[0].reason.contains("outside the hours accepted"),
        "{}",
        results[0].reason
    );
    let (_, metrics) = http_get(agg.admin, "/metrics");
    assert!(
        metrics.contains(r#"hourglass_aggregator_snapshots_rejected_total{reason="hour"} 2"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"reason="sketch.data""#), "{metrics}");
    assert!(metrics.contains(r#"reason="sketch.size""#), "{metrics}");
    assert_eq!(http_get(agg.admin, "/readyz").0, 200);
    agg.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_series_per_server_bound_refuses_new_series_and_holds_across_a_kill() {
    let dir = TempDir::new("robust-series");
    let config = dir.file("agg.toml");
    std::fs::write(&config, "[limits]\nmax_series_per_server = 2\n").unwrap();
    let data = dir.file("agg");
    let push = crate::util::push_of_metrics;
    let outcomes = |response: v1::PushResponse| -> Vec<(v1::PushOutcome, String)> {
        response
            .results
            .into_iter()
            .map(|r| (r.outcome(), r.reason))
            .collect()
    };
    use v1::PushOutcome::{Rejected, Stale, Stored};

    let agg = AggregatorProcess::start(&data, &["--config", &config]);
    let mut collector = CollectorClient::new(channel(&agg.grpc).await);
    // Two series fit; the third is refused, with the bound named; the first two stored.
    let got = outcomes(
        collector
            .push(push("web-1", &["a", "b", "c"]))
            .await
            .unwrap()
            .into_inner(),
    );
    assert_eq!(got[0].0, Stored, "{got:?}");
    assert_eq!(got[1].0, Stored, "{got:?}");
    assert_eq!(got[2].0, Rejected, "{got:?}");
    assert!(
        got[2].1.contains("limits.max_series_per_server") && got[2].1.contains("\"web-1\""),
        "{}",
        got[2].1
    );
    // Another server has its own bound.
    let got = outcomes(
        collector
            .push(push("web-2", &["c", "d"]))
            .await
            .unwrap()
            .into_inner(),
    );
    assert!(got.iter().all(|(o, _)| *o == Stored), "{got:?}");
    let (_, metrics) = http_get(agg.admin, "/metrics");
    assert!(
        metrics.contains(
            r#"hourglass_aggregator_snapshots_rejected_total{reason="series_per_server"} 1"#
        ),
        "{metrics}"
    );
    // The refused series was not created: only a, b, c (from web-2) and d exist.
    let listed = hourglass_rpc::proto::v1::query_client::QueryClient::new(channel(&agg.grpc).await)
        .list_series(v1::ListSeriesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .series
        .len();
    assert_eq!(listed, 4);

    // After a SIGKILL the bound still knows web-1's series: it comes from the store.
    agg.kill();
    let agg = AggregatorProcess::start(&data, &["--config", &config]);
    let mut collector = CollectorClient::new(channel(&agg.grpc).await);
    let got = outcomes(
        collector
            .push(push("web-1", &["d", "a"]))
            .await
            .unwrap()
            .into_inner(),
    );
    assert_eq!(got[0].0, Rejected, "{got:?}");
    assert_eq!(got[1].0, Stale, "{got:?}");
}

/// Server names of 254 to 256 bytes passed the agent's old check and were refused by the
/// aggregator on every push, each push's snapshots dropped. One rule now serves both: the
/// agent refuses such a name at start, and the aggregator refuses it with the same words.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_name_the_aggregator_refuses_stops_the_agent_at_start() {
    let dir = TempDir::new("robust-server-name");
    let long = "x".repeat(254);
    let out = std::process::Command::new(crate::util::server_binary("hourglass-agent"))
        .args(["--server-name", &long, "--data-dir", &dir.file("agent")])
        .args(["--statsd-listen", "off", "--ingest-listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .output()
        .expect("run hourglass-agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the agent started: {stderr}");
    assert!(
        stderr.contains("server name") && stderr.contains("1 to 253 bytes (it is 254)"),
        "{stderr}"
    );

    // The aggregator's refusal of the same name names the same rule.
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let mut client = CollectorClient::new(channel(&agg.grpc).await);
    let mut push = crate::util::one_item_push("web-1", "visitors", b"u");
    push.server.as_mut().expect("server").name = long.clone();
    let status = client.push(push).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("1 to 253 bytes (it is 254)"),
        "{}",
        status.message()
    );
    // 253 bytes is accepted by both.
    let mut push = crate::util::one_item_push("web-1", "visitors", b"u");
    push.server.as_mut().expect("server").name = "x".repeat(253);
    client
        .push(push)
        .await
        .expect("a 253-byte name is accepted");
    agg.stop().await;
}

/// Live hours are bound like snapshot hours: a declaration far ahead of the clock (or
/// past retention) is ignored and counted, and the rest of the push is stored.
#[tokio::test(flavor = "multi_thread")]
async fn live_hours_outside_the_accepted_hours_are_ignored_and_counted() {
    let dir = TempDir::new("robust-live-hours");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let mut client = CollectorClient::new(channel(&agg.grpc).await);
    let now = crate::util::this_hour();
    let mut push = crate::util::one_item_push("web-1", "visitors", b"u");
    push.live_hours = vec![now, now + 1, now + 2, now + 10_000, now - 24 * 400];
    let reply = client.push(push).await.expect("push").into_inner();
    assert_eq!(reply.results.len(), 1);
    assert_eq!(reply.results[0].outcome, v1::PushOutcome::Stored as i32);
    let (_, metrics) = http_get(agg.admin, "/metrics");
    assert!(
        metrics.contains("hourglass_aggregator_live_hours_refused_total 3"),
        "{metrics}"
    );
    agg.stop().await;
}
