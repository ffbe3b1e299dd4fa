//! The aggregator's figures (docs/BENCHMARKS.md): push ingest, query latency from hourly
//! rows and from rollups, and bytes on disk per server-hour.
//!
//! `cargo bench -p hourglass-aggregator --bench aggregator` runs the full scenario: one
//! metric, 100 servers × 7 days = 16,800 dense p=14 snapshots pushed over gRPC (100 agents
//! at once, one push per server-day) into a RocksDB store with the default, WAL-synced
//! writes; `Distinct` for the whole week over all servers and over 10 of them, from hourly
//! rows, then again once rolled up; then the same count of sparse snapshots for their
//! size. Run without `--bench` (as `cargo test` does), it runs a small version of the same
//! scenario as a smoke test.

use hourglass_aggregator::keys::Day;
use hourglass_aggregator::metrics::Metrics;
use hourglass_aggregator::rollup::build_dirty_days;
use hourglass_aggregator::service;
use hourglass_aggregator::store::{RocksStore, Store, StoreOptions};
use hourglass_rpc::proto::v1::{
    self, collector_client::CollectorClient, query_client::QueryClient,
};
use hourglass_sketch::hll::Hll;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first day of the data: two weeks before today, so every day is closed (rollups are
/// built) and inside the hourly retention the aggregator accepts pushes for.
fn first_day() -> u32 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    (now / 86_400) as u32 - 14
}

struct Scale {
    servers: u32,
    days: u32,
    items_per_sketch: u32,
    query_runs: usize,
}

fn server_name(i: u32) -> String {
    format!("web-{i:03}")
}

/// The encoded sketch of one server-hour: `items` users, a quarter of them seen by every
/// server that hour and the rest its own, so the union is known and large.
fn sketch(server: u32, hour: u32, items: u32) -> Vec<u8> {
    let mut hll = Hll::new(14).expect("precision 14");
    for i in 0..items {
        let user = if i % 4 == 0 {
            u64::from(hour) << 32 | u64::from(i)
        } else {
            1 << 63 | u64::from(server) << 40 | u64::from(hour) << 20 | u64::from(i)
        };
        hll.insert(&user.to_le_bytes());
    }
    hll.encode()
}

fn series() -> v1::Series {
    v1::Series {
        metric: "visitors".into(),
        tags: Vec::new(),
    }
}

/// Pushes every server's week, one push per server-day, all servers at once. Returns the
/// wall time and the per-push latencies.
async fn push_all(addr: &str, scale: &Scale, items: u32) -> (Duration, Vec<Duration>) {
    let first_hour = first_day() * 24;
    let hours = scale.days * 24;
    // Sketches are built before the clock starts: the figure is the aggregator's.
    let mut pushes = Vec::new();
    for server in 0..scale.servers {
        for day in 0..scale.days {
            let snapshots: Vec<v1::Snapshot> = (day * 24..(day + 1) * 24)
                .filter(|h| *h < hours)
                .map(|h| v1::Snapshot {
                    series: Some(series()),
                    hour: first_hour + h,
                    epoch: 1,
                    version: 1,
                    sketch: Some(v1::EncodedSketch {
                        kind: v1::SketchKind::Distinct as i32,
                        data: sketch(server, first_hour + h, items).into(),
                    }),
                })
                .collect();
            let live_hours = snapshots.iter().map(|s| s.hour).collect();
            pushes.push((
                server,
                v1::PushRequest {
                    server: Some(v1::Server {
                        name: server_name(server),
                        labels: vec![v1::Tag {
                            key: "region".into(),
                            value: if server % 2 == 0 { "eu" } else { "us" }.into(),
                        }],
                    }),
                    snapshots,
                    live_hours,
                },
            ));
        }
    }
    let mut per_agent: Vec<Vec<v1::PushRequest>> = (0..scale.servers).map(|_| Vec::new()).collect();
    for (server, push) in pushes {
        per_agent[server as usize].push(push);
    }
    let started = Instant::now();
    let mut agents = Vec::new();
    for pushes in per_agent {
        let addr = addr.to_string();
        agents.push(tokio::spawn(async move {
            let mut client = CollectorClient::connect(addr)
                .await
                .expect("connect")
                .max_decoding_message_size(64 << 20);
            let mut latencies = Vec::new();
            for push in pushes {
                let expected = push.snapshots.len();
                let t = Instant::now();
                let reply = client.push(push).await.expect("push").into_inner();
                latencies.push(t.elapsed());
                let stored = reply
                    .results
                    .iter()
                    .filter(|r| r.outcome == v1::PushOutcome::Stored as i32)
                    .count();
                assert_eq!(stored, expected, "every snapshot must be stored");
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for agent in agents {
        latencies.extend(agent.await.expect("agent task"));
    }
    (started.elapsed(), latencies)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Runs `Distinct` over the week `runs` times; returns the sorted latencies and the answer.
async fn query(
    addr: &str,
    scale: &Scale,
    servers: Vec<String>,
    runs: usize,
) -> (Vec<Duration>, f64, u64) {
    let mut client = QueryClient::connect(addr.to_string())
        .await
        .expect("connect");
    let request = v1::DistinctRequest {
        selector: Some(v1::Selector {
            metric: "visitors".into(),
            range: Some(v1::TimeRange {
                start_hour: first_day() * 24,
                end_hour: (first_day() + scale.days) * 24,
            }),
            servers,
            ..Default::default()
        }),
    };
    let mut latencies = Vec::with_capacity(runs);
    let mut last = (0.0, 0);
    for _ in 0..runs {
        let t = Instant::now();
        let reply = client
            .distinct(request.clone())
            .await
            .expect("query")
            .into_inner();
        latencies.push(t.elapsed());
        last = (
            reply.answer.map_or(0.0, |a| a.estimate),
            reply.coverage.map_or(0, |c| c.sketches_merged),
        );
    }
    latencies.sort();
    (latencies, last.0, last.1)
}

fn hourly_sst_bytes(store: &RocksStore) -> u64 {
    let stats = store.stats().expect("stats");
    stats
        .column_families
        .iter()
        .filter(|cf| cf.name == "hourly")
        .map(|cf| cf.sst_bytes)
        .sum()
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

struct Served {
    addr: String,
    store: Arc<RocksStore>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn serve() -> Served {
    let dir = tempfile::tempdir().expect("temp dir");
    // The defaults a deployment gets: WAL synced before every acknowledgement.
    let store =
        Arc::new(RocksStore::open(dir.path(), &StoreOptions::default()).expect("open store"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let dyn_store: Arc<dyn Store> = store.clone();
    let task = tokio::spawn(async move {
        service::serve(
            listener,
            dyn_store,
            Arc::new(Metrics::new()),
            service::ServeOptions {
                retention_hourly: hourglass_aggregator::config::RetentionConfig::default().hourly,
                ..service::ServeOptions::default()
            },
            async {
                let _ = stopped.await;
            },
        )
        .await
        .expect("serve");
    });
    Served {
        addr,
        store,
        stop,
        task,
        _dir: dir,
    }
}

async fn scenario(scale: Scale) {
    let snapshots = u64::from(scale.servers * scale.days * 24);
    println!(
        "aggregator bench: {} servers × {} days = {snapshots} dense p=14 snapshots\n",
        scale.servers, scale.days
    );
    let served = serve().await;
    let (wall, mut latencies) = push_all(&served.addr, &scale, scale.items_per_sketch).await;
    // For investigations: RocksDB's account of the push (flushes, compactions, stalls),
    // and a way to stop after the push, for profiling it alone.
    if std::env::var_os("HOURGLASS_BENCH_ENGINE").is_some() {
        println!("{}", served.store.engine_report());
    }
    if std::env::var_os("HOURGLASS_BENCH_PUSH_ONLY").is_some() {
        latencies.sort();
        println!(
            "push only: {:.0} snapshots/s ({snapshots} in {:.2} s), p50 {}",
            snapshots as f64 / wall.as_secs_f64(),
            wall.as_secs_f64(),
            ms(percentile(&latencies, 0.5))
        );
        return;
    }
    latencies.sort();
    let rate = snapshots as f64 / wall.as_secs_f64();
    let subset: Vec<String> = (0..scale.servers.min(10)).map(server_name).collect();

    let (all_hourly, estimate, merged_hourly) =
        query(&served.addr, &scale, Vec::new(), scale.query_runs).await;
    let (sub_hourly, _, _) = query(&served.addr, &scale, subset.clone(), scale.query_runs).await;

    let built_at = Instant::now();
    let store = Arc::clone(&served.store);
    let report = tokio::task::spawn_blocking(move || {
        let report = build_dirty_days(&*store, Day(u32::MAX), usize::MAX).expect("rollups");
        store.flush().expect("flush");
        store.compact().expect("compact");
        report
    })
    .await
    .expect("rollup task");
    let rollup_time = built_at.elapsed();
    let (all_rolled, estimate_rolled, merged_rolled) =
        query(&served.addr, &scale, Vec::new(), scale.query_runs).await;
    let (sub_rolled, _, _) = query(&served.addr, &scale, subset, scale.query_runs).await;
    assert_eq!(
        estimate, estimate_rolled,
        "rollups must answer like hourly rows"
    );
    let dense_bytes = hourly_sst_bytes(&served.store) as f64 / snapshots as f64;
    let _ = served.stop.send(());
    served.task.await.expect("server task");

    // Sparse sketches (500 users a server-hour) for their size on disk.
    let sparse = serve().await;
    push_all(&sparse.addr, &scale, 500).await;
    let store = Arc::clone(&sparse.store);
    tokio::task::spawn_blocking(move || {
        store.flush().expect("flush");
        store.compact().expect("compact");
    })
    .await
    .expect("compact task");
    let sparse_bytes = hourly_sst_bytes(&sparse.store) as f64 / snapshots as f64;
    let _ = sparse.stop.send(());
    sparse.task.await.expect("server task");

    let p = |v: &[Duration], q| ms(percentile(v, q));
    println!("| measurement | p50 | p99 | notes |");
    println!("|---|---:|---:|---|");
    println!(
        "| push: {} agents at once, 24 snapshots a push | {} | {} | {rate:.0} snapshots/s ({snapshots} in {:.2} s) |",
        scale.servers,
        p(&latencies, 0.5),
        p(&latencies, 0.99),
        wall.as_secs_f64()
    );
    println!(
        "| Distinct, week, all {} servers, hourly rows | {} | {} | {merged_hourly} sketches merged; estimate {estimate:.0} |",
        scale.servers,
        p(&all_hourly, 0.5),
        p(&all_hourly, 0.99)
    );
    println!(
        "| Distinct, week, 10 servers, hourly rows | {} | {} | |",
        p(&sub_hourly, 0.5),
        p(&sub_hourly, 0.99)
    );
    println!(
        "| Distinct, week, all servers, rolled up | {} | {} | {merged_rolled} rollups merged; same estimate |",
        p(&all_rolled, 0.5),
        p(&all_rolled, 0.99)
    );
    println!(
        "| Distinct, week, 10 servers, rolled up | {} | {} | |",
        p(&sub_rolled, 0.5),
        p(&sub_rolled, 0.99)
    );
    println!(
        "\nrollups: {} days built, {} rollups written, in {:.2} s (with flush and full compaction)",
        report.days,
        report.rollups,
        rollup_time.as_secs_f64()
    );
    println!(
        "bytes on disk per server-hour after compaction: dense p=14 {dense_bytes:.0}, sparse (500 items) {sparse_bytes:.0}"
    );
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    let p50 = |v: &[Duration]| percentile(v, 0.5);
    println!("\ntargets:");
    println!(
        "  push ≥ 20,000 dense snapshots/s: {}",
        verdict(rate >= 20_000.0)
    );
    println!(
        "  week over all servers p50 < 100 ms from hourly rows: {}",
        verdict(p50(&all_hourly) < Duration::from_millis(100))
    );
    println!(
        "  week over 10 servers p50 < 100 ms from hourly rows: {}",
        verdict(p50(&sub_hourly) < Duration::from_millis(100))
    );
    println!(
        "  week over all servers p50 < 10 ms rolled up: {}",
        verdict(p50(&all_rolled) < Duration::from_millis(10))
    );
    println!(
        "  week over 10 servers p50 < 10 ms rolled up: {}",
        verdict(p50(&sub_rolled) < Duration::from_millis(10))
    );
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let scale = if full {
        Scale {
            servers: 100,
            days: 7,
            items_per_sketch: 20_000,
            query_runs: 30,
        }
    } else {
        Scale {
            servers: 4,
            days: 2,
            items_per_sketch: 4_000,
            query_runs: 2,
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(scenario(scale));
}
