//! `hourglass-aggregator` as a process: pushes over the generated `Collector` client,
//! answers over the `Query` client and the `hourglass query` command, durability across
//! SIGKILL, the data dir lock, the admin port and gRPC health.

use crate::util::{
    AggregatorAddrs, AggregatorProcess, InProcessAggregator, TempDir, hourglass, http_get, snapshot,
};
use hourglass_rpc::proto::v1::{
    self, collector_client::CollectorClient, query_client::QueryClient,
};
use hourglass_rpc::time::hour_start;
use hourglass_sketch::bloom::Bloom;
use hourglass_sketch::frequency::{Frequency, FrequencyParams};
use hourglass_sketch::hll::Hll;
use tonic::transport::Channel;

/// The hour before the current one: recent enough that retention keeps it, whole so
/// that no agent-side clock matters.
fn recent_hour() -> u32 {
    crate::util::this_hour() - 1
}

pub(crate) fn tag(key: &str, value: &str) -> v1::Tag {
    v1::Tag {
        key: key.into(),
        value: value.into(),
    }
}

pub(crate) fn server(name: &str, labels: &[(&str, &str)]) -> Option<v1::Server> {
    Some(v1::Server {
        name: name.into(),
        labels: labels.iter().map(|(k, v)| tag(k, v)).collect(),
    })
}

pub(crate) fn hll_of(items: std::ops::Range<u32>) -> Vec<u8> {
    let mut hll = Hll::new(14).expect("precision 14");
    for i in items {
        hll.insert(format!("user{i}").as_bytes());
    }
    hll.encode()
}

pub(crate) fn selector(metric: &str, hours: std::ops::Range<u32>) -> Option<v1::Selector> {
    Some(v1::Selector {
        metric: metric.into(),
        range: Some(v1::TimeRange {
            start_hour: hours.start,
            end_hour: hours.end,
        }),
        ..Default::default()
    })
}

pub(crate) async fn clients(
    agg: &impl AggregatorAddrs,
) -> (CollectorClient<Channel>, QueryClient<Channel>) {
    let channel = Channel::from_shared(agg.grpc().to_string())
        .expect("grpc url")
        .connect()
        .await
        .expect("connect to the aggregator");
    (
        CollectorClient::new(channel.clone())
            .send_compressed(tonic::codec::CompressionEncoding::Zstd)
            .accept_compressed(tonic::codec::CompressionEncoding::Zstd),
        QueryClient::new(channel).accept_compressed(tonic::codec::CompressionEncoding::Gzip),
    )
}

pub(crate) async fn push(
    collector: &mut CollectorClient<Channel>,
    from: Option<v1::Server>,
    snapshots: Vec<v1::Snapshot>,
    live_hours: Vec<u32>,
) -> Vec<v1::SnapshotResult> {
    collector
        .push(v1::PushRequest {
            server: from,
            snapshots,
            live_hours,
        })
        .await
        .expect("push accepted")
        .into_inner()
        .results
}

pub(crate) fn outcomes(results: &[v1::SnapshotResult]) -> Vec<v1::PushOutcome> {
    results.iter().map(|r| r.outcome()).collect()
}

/// `hourglass query ... --json` against the aggregator, for `hours`.
fn cli_query(
    agg: &impl AggregatorAddrs,
    args: &[&str],
    hours: std::ops::Range<u32>,
) -> serde_json::Value {
    let from = hour_start(hours.start).to_rfc3339();
    let to = hour_start(hours.end).to_rfc3339();
    let mut all = vec!["query"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[
        "--aggregator",
        agg.grpc(),
        "--from",
        &from,
        "--to",
        &to,
        "--json",
    ]);
    hourglass(&all, b"").ok().json()
}

#[tokio::test]
async fn pushed_sketches_answer_within_their_error_over_grpc_and_the_cli() {
    let dir = TempDir::new("agg-answers");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let (mut collector, mut query) = clients(&agg).await;
    let h0 = recent_hour() - 3;
    let hours = h0..h0 + 4;

    // web-1 sees users 0..3000 over four hours; web-2 sees 2000..5000 over two hours and
    // was down for the other two. The union is 5000 distinct users.
    let web1: Vec<_> = (0..4)
        .map(|i| {
            snapshot(
                "visitors",
                h0 + i,
                1,
                v1::SketchKind::Distinct,
                hll_of(i * 750..(i + 1) * 750),
            )
        })
        .collect();
    let r = push(
        &mut collector,
        server("web-1", &[("region", "eu")]),
        web1.clone(),
        hours.clone().collect(),
    )
    .await;
    assert_eq!(outcomes(&r), vec![v1::PushOutcome::Stored; 4]);
    assert!(r.iter().all(|r| r.held_version == 1));
    let web2 = vec![
        snapshot(
            "visitors",
            h0,
            1,
            v1::SketchKind::Distinct,
            hll_of(2000..3500),
        ),
        snapshot(
            "visitors",
            h0 + 1,
            1,
            v1::SketchKind::Distinct,
            hll_of(3500..5000),
        ),
    ];
    push(
        &mut collector,
        server("web-2", &[("region", "us")]),
        web2,
        vec![h0, h0 + 1],
    )
    .await;

    let distinct = |group_by: v1::GroupBy| {
        let mut sel = selector("visitors", hours.clone());
        if let Some(s) = sel.as_mut() {
            s.group_by = group_by as i32;
        }
        v1::DistinctRequest { selector: sel }
    };
    let answer = query
        .distinct(distinct(v1::GroupBy::None))
        .await
        .expect("distinct")
        .into_inner();
    let a = answer.answer.expect("answer");
    // 4σ at p=14: a false failure is a 1-in-15,000 event, and hashing is deterministic.
    assert!((a.estimate - 5000.0).abs() <= 4.0 * a.std_error, "{a:?}");
    assert!(a.lower95 < 5000.0 && a.upper95 > 5000.0, "{a:?}");
    let coverage = answer.coverage.expect("coverage");
    assert_eq!(coverage.sketches_merged, 6);
    assert_eq!(coverage.server_hours_missing, 2, "web-2 was down two hours");
    assert_eq!(
        coverage.missing,
        vec![v1::MissingServer {
            server: "web-2".into(),
            hours: 2
        }]
    );

    // Grouped by server: each saw 3000.
    let grouped = query
        .distinct(distinct(v1::GroupBy::Server))
        .await
        .expect("grouped")
        .into_inner();
    let keys: Vec<&str> = grouped.groups.iter().map(|g| g.key.as_str()).collect();
    assert_eq!(keys, ["web-1", "web-2"]);
    for g in &grouped.groups {
        let a = g.answer.as_ref().expect("group answer");
        assert!(
            (a.estimate - 3000.0).abs() <= 4.0 * a.std_error,
            "{}: {a:?}",
            g.key
        );
    }

    // Duplicates and older versions are STALE and change nothing.
    let again = push(
        &mut collector,
        server("web-1", &[("region", "eu")]),
        web1,
        vec![],
    )
    .await;
    assert_eq!(outcomes(&again), vec![v1::PushOutcome::Stale; 4]);
    assert!(again.iter().all(|r| r.held_version == 1));
    let newer = push(
        &mut collector,
        server("web-1", &[("region", "eu")]),
        vec![snapshot(
            "visitors",
            h0,
            3,
            v1::SketchKind::Distinct,
            hll_of(0..750),
        )],
        vec![],
    )
    .await;
    assert_eq!(outcomes(&newer), vec![v1::PushOutcome::Stored]);
    assert_eq!(newer[0].held_version, 3);
    let older = push(
        &mut collector,
        server("web-1", &[("region", "eu")]),
        vec![snapshot(
            "visitors",
            h0,
            2,
            v1::SketchKind::Distinct,
            hll_of(0..99_999),
        )],
        vec![],
    )
    .await;
    assert_eq!(outcomes(&older), vec![v1::PushOutcome::Stale]);
    assert_eq!(older[0].held_version, 3);
    let after = query
        .distinct(distinct(v1::GroupBy::None))
        .await
        .expect("distinct")
        .into_inner();
    assert_eq!(
        after.answer,
        Some(a),
        "stale and equal snapshots change nothing"
    );

    // The CLI says the same.
    let cli = cli_query(&agg, &["distinct", "--metric", "visitors"], hours.clone());
    assert_eq!(cli["estimate"].as_f64(), Some(a.estimate), "{cli}");
    assert_eq!(cli["server_hours_missing"], 2, "{cli}");
    let by_server = cli_query(
        &agg,
        &["distinct", "--metric", "visitors", "--group-by", "server"],
        hours.clone(),
    );
    assert_eq!(by_server["groups"][0]["key"], "web-1", "{by_server}");
    let eu = cli_query(
        &agg,
        &["distinct", "--metric", "visitors", "--label", "region=eu"],
        hours.clone(),
    );
    assert!(
        (eu["estimate"].as_f64().unwrap() - 3000.0).abs()
            <= 4.0 * eu["std_error"].as_f64().unwrap(),
        "{eu}"
    );

    // Frequency and top-k: /cart 500 times, /home 300, 200 others once.
    let mut freq = Frequency::new(FrequencyParams::from_error(0.01, 0.01).expect("params"))
        .expect("frequency sketch");
    for _ in 0..500 {
        freq.insert(b"/cart").expect("insert");
    }
    for _ in 0..300 {
        freq.insert(b"/home").expect("insert");
    }
    for i in 0..200 {
        freq.insert(format!("/item/{i}").as_bytes())
            .expect("insert");
    }
    // Membership: user1..user100.
    let mut bloom = Bloom::new(1000, 0.01).expect("bloom");
    for i in 1..=100 {
        bloom.insert(format!("user{i}").as_bytes());
    }
    let r = push(
        &mut collector,
        server("web-1", &[("region", "eu")]),
        vec![
            snapshot(
                "http.requests",
                h0,
                1,
                v1::SketchKind::Frequency,
                freq.encode(),
            ),
            snapshot("seen", h0, 1, v1::SketchKind::Membership, bloom.encode()),
        ],
        vec![],
    )
    .await;
    assert_eq!(outcomes(&r), vec![v1::PushOutcome::Stored; 2]);

    let f = query
        .frequency(v1::FrequencyRequest {
            selector: selector("http.requests", hours.clone()),
            item: b"/cart".to_vec(),
        })
        .await
        .expect("frequency")
        .into_inner()
        .answer
        .expect("answer");
    assert_eq!(f.total, 1000);
    assert!(
        f.estimate >= 500 && f.estimate <= 500 + f.max_overcount,
        "{f:?}"
    );
    let top = query
        .top_k(v1::TopKRequest {
            selector: selector("http.requests", hours.clone()),
            k: 2,
        })
        .await
        .expect("topk")
        .into_inner();
    let items: Vec<&[u8]> = top.items.iter().map(|t| t.item.as_slice()).collect();
    assert_eq!(items, [b"/cart".as_slice(), b"/home".as_slice()]);
    let cli = cli_query(
        &agg,
        &["frequency", "--metric", "http.requests", "--item", "/cart"],
        hours.clone(),
    );
    assert_eq!(cli["estimate"].as_u64(), Some(f.estimate), "{cli}");
    let cli = cli_query(
        &agg,
        &["topk", "--metric", "http.requests", "--k", "1"],
        hours.clone(),
    );
    assert_eq!(cli["items"][0]["item"], "/cart", "{cli}");

    for (item, expected) in [("user42", true), ("nobody", false)] {
        let m = query
            .membership(v1::MembershipRequest {
                selector: selector("seen", hours.clone()),
                item: item.as_bytes().to_vec(),
            })
            .await
            .expect("membership")
            .into_inner()
            .answer
            .expect("answer");
        assert_eq!(m.maybe_present, expected, "{item}: {m:?}");
        assert!(
            m.fill_ratio > 0.0 && m.estimated_fpr < 0.01 && !m.past_design_point,
            "{m:?}"
        );
        let cli = cli_query(
            &agg,
            &["membership", "--metric", "seen", "--item", item],
            hours.clone(),
        );
        assert_eq!(cli["maybe_present"], expected, "{cli}");
    }

    // Listings are ordered.
    let series = query
        .list_series(v1::ListSeriesRequest::default())
        .await
        .expect("list series")
        .into_inner()
        .series;
    let metrics: Vec<&str> = series
        .iter()
        .map(|s| s.series.as_ref().expect("series").metric.as_str())
        .collect();
    assert_eq!(metrics, ["http.requests", "seen", "visitors"]);
    let servers = query
        .list_servers(v1::ListServersRequest {})
        .await
        .expect("list servers")
        .into_inner()
        .servers;
    let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["web-1", "web-2"]);
    assert_eq!(servers[0].labels, vec![tag("region", "eu")]);

    // A range with no data answers zeros, not an error.
    let empty = query
        .distinct(v1::DistinctRequest {
            selector: selector("visitors", h0 - 10..h0 - 8),
        })
        .await
        .expect("empty range answers")
        .into_inner();
    assert_eq!(empty.answer.expect("answer").estimate, 0.0);
    assert_eq!(empty.coverage.expect("coverage").sketches_merged, 0);
    agg.stop().await;
}

#[tokio::test]
async fn a_bad_snapshot_is_rejected_alone_and_bad_requests_name_the_field() {
    let dir = TempDir::new("agg-reject");
    let config = dir.file("aggregator.toml");
    std::fs::write(&config, "[limits]\nmax_snapshots_per_push = 5\n").expect("write config");
    let agg = InProcessAggregator::start_from_file(&dir.file("data"), &config);
    let (mut collector, mut query) = clients(&agg).await;
    let h = recent_hour();
    let good = || snapshot("visitors", h, 1, v1::SketchKind::Distinct, hll_of(0..10));
    let mut wrong_kind = snapshot("visitors", h, 1, v1::SketchKind::Frequency, hll_of(0..10));
    wrong_kind.hour = h - 1;
    let mut garbage = snapshot(
        "visitors",
        h - 2,
        1,
        v1::SketchKind::Distinct,
        b"not a sketch".to_vec(),
    );
    garbage.epoch = 2;
    let mut version_zero = good();
    version_zero.version = 0;
    let mut bad_metric = good();
    bad_metric.series = Some(v1::Series {
        metric: "9lives".into(),
        tags: vec![],
    });
    let r = push(
        &mut collector,
        server("web-1", &[]),
        vec![wrong_kind, good(), garbage, version_zero, bad_metric],
        vec![h],
    )
    .await;
    use v1::PushOutcome::{Rejected, Stored};
    assert_eq!(
        outcomes(&r),
        vec![Rejected, Stored, Rejected, Rejected, Rejected]
    );
    assert!(
        r[0].reason.contains("snapshots[0].sketch.kind"),
        "{}",
        r[0].reason
    );
    assert!(
        r[2].reason.contains("snapshots[2].sketch.data"),
        "{}",
        r[2].reason
    );
    assert!(
        r[3].reason.contains("snapshots[3].version"),
        "{}",
        r[3].reason
    );
    assert!(r[4].reason.contains("9lives"), "{}", r[4].reason);

    let too_many = collector
        .push(v1::PushRequest {
            server: server("web-1", &[]),
            snapshots: (0..6).map(|_| good()).collect(),
            live_hours: vec![],
        })
        .await
        .expect_err("over the limit");
    assert_eq!(too_many.code(), tonic::Code::ResourceExhausted);
    assert!(
        too_many.message().contains("6") && too_many.message().contains("max_snapshots_per_push"),
        "{}",
        too_many.message()
    );
    let no_name = collector
        .push(v1::PushRequest {
            server: server("", &[]),
            snapshots: vec![good()],
            live_hours: vec![],
        })
        .await
        .expect_err("empty server name");
    assert_eq!(no_name.code(), tonic::Code::InvalidArgument);
    assert!(
        no_name.message().contains("server.name"),
        "{}",
        no_name.message()
    );

    let status = |sel: Option<v1::Selector>| {
        let mut query = query.clone();
        async move {
            query
                .distinct(v1::DistinctRequest { selector: sel })
                .await
                .expect_err("refused")
        }
    };
    let unknown = status(selector("nothing", h..h + 1)).await;
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    assert!(
        unknown.message().contains("nothing"),
        "{}",
        unknown.message()
    );
    let backwards = status(selector("visitors", h..h)).await;
    assert_eq!(backwards.code(), tonic::Code::InvalidArgument);
    assert!(
        backwards.message().contains("selector.range"),
        "{}",
        backwards.message()
    );
    let too_long = status(selector("visitors", 0..h)).await;
    assert_eq!(too_long.code(), tonic::Code::InvalidArgument);
    assert!(
        too_long.message().contains("max_query_range"),
        "{}",
        too_long.message()
    );
    let (_, metrics) = http_get(agg.admin, "/metrics");
    assert!(
        metrics.contains(
            r#"hourglass_aggregator_queries_refused_total{bound="limits.max_query_range"} 1"#
        ),
        "{metrics}"
    );
    let wrong_kind = query
        .membership(v1::MembershipRequest {
            selector: selector("visitors", h..h + 1),
            item: b"x".to_vec(),
        })
        .await
        .expect_err("visitors keeps no membership sketches");
    assert_eq!(wrong_kind.code(), tonic::Code::NotFound);
    agg.stop().await;
}

#[tokio::test]
async fn acknowledged_snapshots_survive_sigkill() {
    let dir = TempDir::new("agg-crash");
    let data = dir.file("data");
    let h0 = recent_hour() - 9;
    let export = |query: &mut QueryClient<Channel>| {
        let mut query = query.clone();
        async move {
            query
                .export(v1::ExportRequest {
                    selector: selector("visitors", h0..h0 + 10),
                    kind: v1::SketchKind::Distinct as i32,
                })
                .await
                .expect("export")
                .into_inner()
        }
    };
    let before = {
        let agg = AggregatorProcess::start(&data, &[]);
        let (mut collector, mut query) = clients(&agg).await;
        for i in 0..10 {
            let r = push(
                &mut collector,
                server(&format!("web-{}", i % 3), &[]),
                vec![snapshot(
                    "visitors",
                    h0 + i,
                    1,
                    v1::SketchKind::Distinct,
                    hll_of(i * 100..i * 100 + 500),
                )],
                vec![h0 + i],
            )
            .await;
            assert_eq!(outcomes(&r), vec![v1::PushOutcome::Stored]);
        }
        let before = export(&mut query).await;
        agg.kill();
        before
    };
    assert_eq!(
        before.coverage.as_ref().expect("coverage").sketches_merged,
        10
    );
    let agg = AggregatorProcess::start(&data, &[]);
    let (_, mut query) = clients(&agg).await;
    let after = export(&mut query).await;
    let bytes = |r: &v1::ExportResponse| r.sketch.as_ref().expect("sketch").data.clone();
    assert_eq!(
        bytes(&after),
        bytes(&before),
        "every acknowledged snapshot is still there"
    );
    assert!(!bytes(&before).is_empty());
}

#[test]
fn a_second_process_on_the_same_data_dir_fails_with_one_clear_line() {
    let dir = TempDir::new("agg-lock");
    let data = dir.file("data");
    let _first = AggregatorProcess::start(&data, &[]);
    let second = std::process::Command::new(crate::util::server_binary("hourglass-aggregator"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
            &data,
        ])
        .output()
        .expect("run a second aggregator");
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("in use"), "{stderr}");
    assert!(
        !stderr.contains("listening on"),
        "no port is announced: {stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

#[tokio::test]
async fn admin_port_and_grpc_health_answer() {
    let dir = TempDir::new("agg-admin");
    let agg = AggregatorProcess::start(&dir.file("data"), &["--log-format", "json"]);
    let (mut collector, _) = clients(&agg).await;
    let h = recent_hour();
    push(
        &mut collector,
        server("web-1", &[]),
        vec![
            snapshot("visitors", h, 1, v1::SketchKind::Distinct, hll_of(0..10)),
            snapshot("visitors", h, 0, v1::SketchKind::Distinct, hll_of(0..10)),
        ],
        vec![h],
    )
    .await;

    assert_eq!(http_get(agg.admin, "/healthz").0, 200);
    assert_eq!(http_get(agg.admin, "/readyz").0, 200);
    let (status, metrics) = http_get(agg.admin, "/metrics");
    assert_eq!(status, 200);
    for line in [
        "hourglass_aggregator_snapshots_stored_total 1",
        r#"hourglass_aggregator_snapshots_rejected_total{reason="version"} 1"#,
        r#"hourglass_aggregator_pushes_total{outcome="ok"} 1"#,
        "hourglass_aggregator_push_duration_seconds_count 1",
        "hourglass_aggregator_series 1",
        "hourglass_aggregator_servers 1",
        r#"hourglass_aggregator_store_bytes{cf="hourly",what="sst"}"#,
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }

    let channel = Channel::from_shared(agg.grpc.clone())
        .expect("grpc url")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "hourglass.v1.Collector", "hourglass.v1.Query"] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status();
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving,
            "{service:?}"
        );
    }
    assert!(!logs_mention_reflection_off(&agg.logs()), "{}", agg.logs());
    // --log-format json: every log line is one JSON object.
    let logs = agg.logs();
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(
        lines.iter().any(|v| v["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("grpc listening on"))),
        "{logs}"
    );
}

#[test]
fn sigterm_stops_cleanly_with_exit_code_zero() {
    let dir = TempDir::new("agg-term");
    let data = dir.file("data");
    let agg = AggregatorProcess::start(&data, &[]);
    let status = agg.terminate();
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
    // The lock is released: the same data dir opens again at once.
    let again = AggregatorProcess::start(&data, &[]);
    assert_eq!(again.terminate().code(), Some(0));
}

/// A gRPC client that opened a request and never finished sending it (a stalled client, or
/// a peer node's connection that never closes) must not keep the aggregator from exiting on
/// SIGTERM: tonic waits for every connection to close, so the drain is bounded
/// (`hourglass_rpc::tls::DRAIN`); `terminate` panics "still running 30 s after SIGTERM"
/// when it is not.
#[test]
fn sigterm_exits_despite_a_half_sent_grpc_request() {
    let dir = TempDir::new("agg-term-half-sent-grpc");
    let agg = AggregatorProcess::start(&dir.file("data"), &[]);
    let addr = agg.grpc.trim_start_matches("http://");
    let mut slow = std::net::TcpStream::connect(addr).expect("connect");
    std::io::Write::write_all(
        &mut slow,
        &half_sent_grpc_request("/hourglass.v1.Collector/Push"),
    )
    .expect("write");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let started = std::time::Instant::now();
    let status = agg.terminate();
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
    eprintln!("exited {:?} after SIGTERM", started.elapsed());
    drop(slow);
}

/// The bytes of an HTTP/2 connection that opens a gRPC request to `path` and sends no body
/// and no end of stream: the client preface, empty SETTINGS, and one HEADERS frame (HPACK
/// from the static table and literals, RFC 7541).
fn half_sent_grpc_request(path: &str) -> Vec<u8> {
    fn literal(out: &mut Vec<u8>, text: &str) {
        out.push(u8::try_from(text.len()).expect("short"));
        out.extend_from_slice(text.as_bytes());
    }
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (indexed)
    block.push(0x04); // :path, literal without indexing, name index 4
    literal(&mut block, path);
    block.push(0x01); // :authority, name index 1
    literal(&mut block, "localhost");
    block.extend_from_slice(&[0x0f, 0x10]); // content-type, name index 31
    literal(&mut block, "application/grpc");
    block.push(0x00); // te, a new name
    literal(&mut block, "te");
    literal(&mut block, "trailers");
    let frame = |kind: u8, flags: u8, stream: u32, payload: &[u8]| {
        let len = u32::try_from(payload.len()).expect("short").to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    };
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS, no END_STREAM
    out
}

fn logs_mention_reflection_off(logs: &str) -> bool {
    logs.contains("reflection v1 is off") || logs.contains("reflection v1alpha is off")
}

#[test]
fn a_bad_config_file_fails_naming_the_field() {
    let dir = TempDir::new("agg-config");
    let config = dir.file("aggregator.toml");
    for (text, field) in [
        (
            "[limits.max_sketch_kib]\nmembership = 0\n",
            "limits.max_sketch_kib.membership",
        ),
        ("[rollup]\nlateness = \"soon\"\n", "lateness"),
        ("[retention]\nhourly_days = 3\n", "hourly_days"),
    ] {
        std::fs::write(&config, text).expect("write config");
        let out = std::process::Command::new(crate::util::server_binary("hourglass-aggregator"))
            .args(["--data-dir", &dir.file("data"), "--config", &config])
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .output()
            .expect("run the aggregator");
        assert_eq!(out.status.code(), Some(1), "{text}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with("error: ") && stderr.contains(field),
            "{text}: {stderr}"
        );
    }
}

/// A push refused for its server labels is logged inside the push span, which has
/// recorded the server's name by then: the "push refused" line names the server.
#[tokio::test]
async fn a_push_refused_for_its_labels_is_logged_with_the_server_name() {
    let dir = TempDir::new("agg-refused-labels");
    let agg = AggregatorProcess::start(&dir.file("data"), &[]);
    let (mut collector, _) = clients(&agg).await;
    let h = recent_hour();
    let status = collector
        .push(v1::PushRequest {
            server: server("web-labels-7", &[("a", "1"), ("a", "2")]),
            snapshots: vec![snapshot(
                "visitors",
                h,
                1,
                v1::SketchKind::Distinct,
                hll_of(0..10),
            )],
            live_hours: vec![h],
        })
        .await
        .expect_err("a repeated label key is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let line = loop {
        let logs = agg.logs();
        if let Some(line) = logs.lines().find(|l| l.contains("push refused")) {
            break line.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no refusal logged:\n{logs}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        line.contains("web-labels-7"),
        "the refusal does not name the server: {line}"
    );
}
