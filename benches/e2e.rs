//! End to end, with real processes: `hourglass simulate` → agents → aggregator.
//!
//! 1. **Throughput**: a fleet of agents spawned by `hourglass simulate --spawn`, fed a day
//!    of traffic as fast as they take it and stopped (each ships in a final flush): events
//!    per second from the first event sent to the last snapshot acknowledged.
//! 2. **Bytes per server-hour**: the aggregator's RocksDB directory after a clean stop,
//!    divided by the server-hours stored.
//! 3. **Visibility delay**: one new item at a time into an agent (flush interval 1 s, and
//!    the default 10 s), polled for with a membership query until the aggregator answers
//!    "maybe": the delay from the Ingest acknowledgement to the first positive answer.
//! 4. **Load**: 100 agents push concurrently to one aggregator for a bounded time while a
//!    querier asks the week's distinct count in a loop: push latency from the
//!    aggregator's histogram, query latency, errors, and the aggregator's peak memory.
//!
//! `cargo bench --bench e2e` runs the full sizes (release binaries, built on first use);
//! without `--bench` (as `cargo test --all-targets` runs it) it is a short smoke run of the
//! same code.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod support;
use support::{Service, aggregator, http_get};

struct Sizes {
    throughput_agents: usize,
    throughput_events_per_hour: u32,
    delay_samples: usize,
    load_agents: usize,
    load_seconds: u64,
    load_events_per_hour: u32,
}

const FULL: Sizes = Sizes {
    throughput_agents: 4,
    throughput_events_per_hour: 20_000,
    delay_samples: 20,
    load_agents: 100,
    load_seconds: 120,
    load_events_per_hour: 500,
};

const SMOKE: Sizes = Sizes {
    throughput_agents: 2,
    throughput_events_per_hour: 200,
    delay_samples: 2,
    load_agents: 5,
    load_seconds: 3,
    load_events_per_hour: 50,
};

/// The sum of a metric's samples whose line starts with `prefix`.
fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

/// A quantile from a Prometheus histogram's cumulative buckets (upper bound of the bucket
/// it falls in).
fn histogram_quantile(text: &str, name: &str, q: f64) -> f64 {
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.1);
    buckets
        .iter()
        .find(|(_, c)| *c >= q * total)
        .map_or(f64::NAN, |b| b.0)
}

fn hourglass(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args)
        .output()
        .expect("hourglass");
    assert!(
        out.status.success(),
        "hourglass {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `hourglass ARGS`, or `None` if it failed (a metric not pushed yet, say).
fn try_hourglass(args: &[&str]) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args)
        .output()
        .expect("hourglass");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn throughput(sizes: &Sizes, dir: &Path) {
    let agg = aggregator(dir);
    let url = format!("http://{}", agg.addrs[0]);
    let started = Instant::now();
    let report = hourglass(&[
        "simulate",
        "--spawn",
        &sizes.throughput_agents.to_string(),
        "--aggregator",
        &url,
        "--days",
        "1",
        "--events-per-hour",
        &sizes.throughput_events_per_hour.to_string(),
        "--spawn-dir",
        dir.join("fleet").to_str().expect("utf-8"),
    ]);
    let wall = started.elapsed().as_secs_f64();
    let events =
        2 * 24 * sizes.throughput_agents as u64 * u64::from(sizes.throughput_events_per_hour);
    println!(
        "e2e_throughput: {events} events ({} agents x 24 h x {} visits x 2 metrics) from the simulator through the agents into the aggregator in {wall:.2} s = {:.0} events/s, agents started and stopped (final flush) included; {}",
        sizes.throughput_agents,
        sizes.throughput_events_per_hour,
        events as f64 / wall,
        report.trim()
    );
    agg.terminate();
    // What a clean stop leaves: SST files (and a near-empty WAL).
    let mut bytes = 0u64;
    for entry in std::fs::read_dir(dir.join("agg"))
        .expect("data dir")
        .flatten()
    {
        if entry.file_name().to_string_lossy().ends_with(".sst") {
            bytes += entry.metadata().map_or(0, |m| m.len());
        }
    }
    let server_hours = 24 * sizes.throughput_agents as u64;
    println!(
        "e2e_bytes: {bytes} bytes of SST files for {server_hours} server-hours = {} bytes per server-hour (two metrics, each with the three kinds `simulate --spawn` gives its agents: distinct p=14, frequency eps=0.001 delta=0.01, membership 100,000 at 1%)",
        bytes / server_hours.max(1)
    );
}

fn delay(sizes: &Sizes, dir: &Path, flush: &str) {
    let agg = aggregator(dir);
    let url = format!("http://{}", agg.addrs[0]);
    let data = dir.join(format!("delay-agent-{flush}"));
    let agent = Service::start(
        "hourglass-agent",
        &[
            "--server-name",
            "web-1",
            "--aggregator",
            &url,
            "--statsd-listen",
            "off",
            "--ingest-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--flush-interval",
            flush,
            "--default-kinds",
            "membership",
        ],
        &["ingest", "admin"],
        &dir.join("delay-agent.log"),
    );
    let ingest = format!("http://{}", agent.addrs[0]);
    let mut delays = Vec::new();
    for i in 0..sizes.delay_samples {
        let item = format!("probe-{i}");
        hourglass(&["send", "--agent", &ingest, "probes", &item]);
        let sent = Instant::now();
        loop {
            let answer = try_hourglass(&[
                "query",
                "membership",
                "--metric",
                "probes",
                "--item",
                &item,
                "--aggregator",
                &url,
                "--from",
                "-2h",
                "--json",
            ]);
            if answer.is_some_and(|a| a.contains("\"maybe_present\":true")) {
                break;
            }
            assert!(
                sent.elapsed() < Duration::from_secs(120),
                "{item} never became visible"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        delays.push(sent.elapsed().as_secs_f64());
        // Each next event at another phase of the flush cycle (a golden-ratio sequence
        // over one interval), as events arrive at any moment; right after a sample the
        // phase is always "just after a flush", the worst case.
        let interval = hourglass_rpc::time::parse_duration(flush).expect("flush interval");
        let phase = (i as f64 * 0.618_033_988_7).fract();
        std::thread::sleep(interval.mul_f64(phase));
    }
    delays.sort_by(f64::total_cmp);
    let q = |p: f64| delays[((delays.len() - 1) as f64 * p).round() as usize];
    println!(
        "e2e_visibility (flush interval {flush}): {} samples, delay from the Ingest acknowledgement to a positive membership answer p50 {:.2} s, p90 {:.2} s, max {:.2} s (each poll is a `hourglass query` process, about 20 ms)",
        delays.len(),
        q(0.5),
        q(0.9),
        delays[delays.len() - 1]
    );
    drop(agent);
    agg.terminate();
}

fn load(sizes: &Sizes, dir: &Path) {
    let agg = aggregator(dir);
    let url = format!("http://{}", agg.addrs[0]);
    let admin = agg.addrs[1].clone();
    // The fleet: real agent processes with the default flush interval (10 s).
    let mut agents = Vec::new();
    for i in 0..sizes.load_agents {
        let data = dir.join(format!("load-{i}"));
        agents.push(Service::start(
            "hourglass-agent",
            &[
                "--server-name",
                &format!("load-{i}"),
                "--label",
                &format!("shard={}", i % 10),
                "--aggregator",
                &url,
                "--statsd-listen",
                "off",
                "--ingest-listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--data-dir",
                data.to_str().expect("utf-8"),
                "--lateness",
                "2d",
            ],
            &["ingest", "admin"],
            &dir.join(format!("load-{i}.log")),
        ));
    }
    let ingest: Vec<String> = agents
        .iter()
        .map(|a| format!("http://{}", a.addrs[0]))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(sizes.load_seconds);
    // The querier: the last day's distinct count over every server, in a loop.
    let querier = {
        let url = url.clone();
        std::thread::spawn(move || {
            let mut latencies = Vec::new();
            let mut errors = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
                    .args([
                        "query",
                        "distinct",
                        "--metric",
                        "visitors",
                        "--aggregator",
                        &url,
                        "--from",
                        "-1d",
                        "--json",
                    ])
                    .output()
                    .expect("query");
                if out.status.success() {
                    latencies.push(t.elapsed().as_secs_f64());
                } else if !latencies.is_empty() {
                    // Before the first push the metric is unknown: that is not a failure.
                    errors += 1;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            (latencies, errors)
        })
    };
    // Traffic: the last two whole hours, as live traffic keeps one or two hours of each
    // series changing; again and again with new seeds until the deadline.
    let mut rounds = 0u64;
    let started = Instant::now();
    while Instant::now() < deadline {
        rounds += 1;
        hourglass(&[
            "simulate",
            "--agents",
            &ingest.join(","),
            "--start",
            "-2h",
            "--hours",
            "2",
            "--events-per-hour",
            &sizes.load_events_per_hour.to_string(),
            "--seed",
            &rounds.to_string(),
        ]);
    }
    let sent = rounds * 2 * 2 * sizes.load_agents as u64 * u64::from(sizes.load_events_per_hour);
    let elapsed = started.elapsed().as_secs_f64();
    // Let the last flushes land, then read every agent's errors.
    std::thread::sleep(Duration::from_secs(12));
    let mut push_errors = 0.0;
    let mut pending = 0.0;
    for a in &agents {
        let text = http_get(&a.addrs[1], "/metrics");
        push_errors += metric_sum(&text, "hourglass_agent_pushes_total{")
            - metric_sum(&text, "hourglass_agent_pushes_total{outcome=\"ok\"}");
        pending += metric_sum(&text, "hourglass_agent_pending_snapshots ");
    }
    let text = http_get(&admin, "/metrics");
    let pushes = metric_sum(&text, "hourglass_aggregator_push_duration_seconds_count");
    let stored = metric_sum(&text, "hourglass_aggregator_snapshots_stored_total");
    let rejected = metric_sum(&text, "hourglass_aggregator_snapshots_rejected_total");
    let p50 = histogram_quantile(&text, "hourglass_aggregator_push_duration_seconds", 0.5);
    let p99 = histogram_quantile(&text, "hourglass_aggregator_push_duration_seconds", 0.99);
    let (mut latencies, query_errors) = querier.join().expect("querier");
    latencies.sort_by(f64::total_cmp);
    let q = |p: f64| {
        latencies
            .get(((latencies.len().max(1) - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    println!(
        "e2e_load: {} agents for {elapsed:.0} s, {sent} events ({rounds} rounds); aggregator: {pushes} pushes, {stored} snapshots stored, {rejected} rejected; push latency p50 <= {:.1} ms, p99 <= {:.1} ms (histogram bucket bounds); agents: {push_errors} failed pushes, {pending} snapshots pending at the end; {} queries answered during the load, p50 {:.0} ms, p99 {:.0} ms (each a `hourglass query` process), {query_errors} failed; aggregator peak RSS {:.1} MiB",
        sizes.load_agents,
        p50 * 1e3,
        p99 * 1e3,
        latencies.len(),
        q(0.5) * 1e3,
        q(0.99) * 1e3,
        agg.peak_rss() as f64 / 1048576.0,
    );
    drop(agents);
    agg.terminate();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench");
    // `cargo bench --bench e2e -- delay` runs only the parts named.
    let parts: Vec<&str> = args
        .iter()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .map(String::as_str)
        .collect();
    let runs = |part: &str| parts.is_empty() || parts.contains(&part);
    let sizes = if full { &FULL } else { &SMOKE };
    let dir = std::env::temp_dir().join(format!("hourglass-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    if runs("throughput") {
        throughput(sizes, &dir.join("throughput"));
    }
    if runs("delay") {
        delay(sizes, &dir.join("delay-1s"), "1s");
        if full {
            delay(sizes, &dir.join("delay-10s"), "10s");
        }
    }
    if runs("load") {
        load(sizes, &dir.join("load"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
