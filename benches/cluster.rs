//! Cluster mode's cost, with real processes on loopback: a 3-server NATS JetStream
//! cluster (`sync_interval: always`, as the design requires) and `hourglass-aggregator`
//! processes, against the same load as a single aggregator.
//!
//! Three setups, each on fresh data dirs and a stream of its own:
//!
//! - **single**: one aggregator without `[cluster]` (the baseline);
//! - **cluster-1**: one node in cluster mode (owners 2, 64 partitions): every push is
//!   published to JetStream, applied back from it, and answered after that;
//! - **cluster-3**: three nodes (owners 2, 64 partitions): each applies the partitions it
//!   owns (about 2/3 of them), pushes go round-robin to the three, queries fan out.
//!
//! For each: K in-process gRPC clients, each a server `web-{i}`, push 50 HyperLogLog
//! series of the current hour as fast as they are answered for a fixed time; then, once
//! every node has applied the stream, `Query/Distinct` over all of it against every
//! node (the answers must be identical across the nodes of a setup). Printed: pushes/s,
//! snapshots/s, push and query latency, errors, the engine's own figures from each node's
//! `/metrics` (publish latency, bytes published, snapshots applied), the stream's size
//! from the NATS monitoring endpoint, RocksDB bytes per node, and the CPU seconds of
//! every process during the load (from `/proc/PID/stat`).
//!
//! `cargo bench --bench cluster` runs the full size (30 s of load per setup); without
//! `--bench` (as `cargo test --all-targets` runs it) it is a short smoke run of the same
//! code (8 partitions, 5 queries per node, no three-node setup: under 20 s in debug).
//! `cargo bench --bench cluster -- single cluster-3` runs only the setups named.
//! The NATS server is the pinned binary `scripts/nats-server` fetches (cached in
//! `~/.cache/hourglass`).
//!
//! Two more measurements put the cluster beside its engine: **engine**, JetStream alone
//! on the same NATS servers (the bytes an entry publishes for one push, in the entry's
//! shape and as one message, with the same concurrency: the ceiling the cluster is held
//! to), and, for cluster-1, a wiped node applying the whole stream against a bare drain
//! of the same messages. Each cluster setup also pushes at half its saturated rate for
//! the latency below saturation.
//!
//! `HOURGLASS_BENCH_BIN=/path/to/hourglass` runs that build's aggregators instead of the
//! one built with the bench: alternate a saved build and the new one to compare them.
//! `HOURGLASS_BENCH_PARTITIONS=N` gives the stream N partitions instead of the size's;
//! `HOURGLASS_BENCH_SUBJECTS=N` groups them into N subjects (`cluster.subjects`; by
//! default the aggregator's, 8, and the setting is not written, so that a build from
//! before subjects were grouped runs too).

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hourglass_rpc::proto::Bytes;
use hourglass_rpc::proto::v1::{
    self, collector_client::CollectorClient, query_client::QueryClient,
};
use tonic::transport::Channel;

struct Sizes {
    /// Concurrent pushing clients, each a server of its own.
    clients: usize,
    /// Series (page tags of metric `visits`) in each push.
    series: usize,
    /// Items in each series' sketch (plus a few per variant).
    items: u32,
    /// How long each setup is pushed to.
    load: Duration,
    /// Distinct queries per node after the load.
    queries: usize,
    /// The stream's partitions. 64 is the default and what the figures are for; the
    /// smoke run takes 8, as each partition a node owns is a durable consumer (a Raft
    /// group of the NATS servers) that takes a while to create on a busy machine.
    partitions: u32,
    /// The subjects the partitions are grouped into (`cluster.subjects`), if set.
    subjects: Option<u32>,
    /// The setups run when none is named on the command line. The smoke run leaves the
    /// three-node cluster out: its nodes take ~12 s to agree on members and be ready
    /// (debug build), which would double the smoke run's time.
    setups: &'static [&'static str],
    /// Pause between the checks that the stream is applied and the answers settled.
    settle: Duration,
    /// Whether the engine is also drained as three nodes' 131 consumers (their creation
    /// alone takes the smoke run's whole budget in a debug build).
    three_nodes_of_consumers: bool,
}

const FULL: Sizes = Sizes {
    clients: 16,
    series: 50,
    items: 300,
    load: Duration::from_secs(30),
    queries: 50,
    partitions: 64,
    subjects: None,
    setups: &["single", "engine", "cluster-1", "cluster-3"],
    settle: Duration::from_secs(1),
    three_nodes_of_consumers: true,
};

const SMOKE: Sizes = Sizes {
    clients: 4,
    series: 50,
    items: 300,
    load: Duration::from_secs(2),
    queries: 5,
    partitions: 8,
    subjects: None,
    setups: &["single", "engine", "cluster-1"],
    settle: Duration::from_millis(300),
    three_nodes_of_consumers: false,
};

/// Each client cycles through this many versions of each series' sketch, so that the
/// last push decides what every node must hold.
const VARIANTS: usize = 4;
const OWNERS: usize = 2;
const HEARTBEAT: &str = "500ms";
const MEMBER_TTL: &str = "3s";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `GET path` as HTTP/1.0 (no chunked body, the connection closes after the answer):
/// the body of a 200 answer, else `None`.
fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    (head.split(' ').nth(1) == Some("200")).then(|| body.to_string())
}

/// The sum of the samples of `hourglass_aggregator_{name}` (every label set).
fn metric(text: &str, name: &str) -> f64 {
    let full = format!("hourglass_aggregator_{name}");
    text.lines()
        .filter(|l| {
            l.strip_prefix(&full)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A quantile of a Prometheus histogram: the upper bound of the bucket it falls in.
fn histogram_quantile(text: &str, name: &str, q: f64) -> f64 {
    let prefix = format!("hourglass_aggregator_{name}_bucket");
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&prefix))
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
    if total == 0.0 {
        return f64::NAN;
    }
    // Within the bucket that holds the rank, linearly between its bounds, as Prometheus's
    // `histogram_quantile` does: its upper bound alone printed 64.0 ms for every node.
    let rank = q * total;
    let mut below = (0.0, 0.0);
    for &(le, count) in &buckets {
        if count >= rank {
            if le.is_infinite() {
                return below.0;
            }
            let (lower, counted) = below;
            return lower
                + (le - lower) * (rank - counted) / (count - counted).max(f64::MIN_POSITIVE);
        }
        below = (le, count);
    }
    f64::NAN
}

/// CPU seconds (user + system) process `pid` has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces:
    // state is the first of them, utime the 12th, stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / rustix::param::clock_ticks_per_second() as f64
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// A quantile of sorted `values`.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A process killed when dropped.
struct Process {
    child: Child,
}

impl Process {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The NATS server binary, fetched by `scripts/nats-server` if it is not cached yet.
fn nats_server_binary() -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/nats-server");
    let out = Command::new(script)
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Three NATS servers routed to each other, JetStream on, every write synced.
struct Nats {
    servers: Vec<Process>,
    client_ports: Vec<u16>,
    http_ports: Vec<u16>,
}

impl Nats {
    fn start(binary: &Path, dir: &Path) -> Nats {
        let n = 3;
        let route_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let routes: Vec<String> = route_ports
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect();
        let (mut servers, mut client_ports, mut http_ports) = (vec![], vec![], vec![]);
        for (i, route_port) in route_ports.iter().enumerate() {
            let name = format!("nats-{}", i + 1);
            let (client_port, http_port) = (free_port(), free_port());
            let config = dir.join(format!("{name}.conf"));
            std::fs::write(
                &config,
                format!(
                    "server_name: {name}\nlisten: 127.0.0.1:{client_port}\nhttp: 127.0.0.1:{http_port}\n\
                     jetstream {{ store_dir: \"{store}\", sync_interval: always }}\n\
                     cluster {{ name: hourglass-bench, listen: 127.0.0.1:{route_port}, routes: [{routes}] }}\n",
                    store = dir.join(&name).display(),
                    routes = routes.join(", "),
                ),
            )
            .expect("write the NATS config");
            let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
            let child = Command::new(binary)
                .arg("-c")
                .arg(&config)
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("start nats-server");
            servers.push(Process { child });
            client_ports.push(client_port);
            http_ports.push(http_port);
        }
        for port in &client_ports {
            wait_until("nats-server to listen", Duration::from_secs(20), || {
                std::net::TcpStream::connect(("127.0.0.1", *port)).is_ok()
            });
        }
        Nats {
            servers,
            client_ports,
            http_ports,
        }
    }

    fn urls(&self) -> Vec<String> {
        self.client_ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect()
    }

    fn cpu(&self) -> Vec<f64> {
        self.servers.iter().map(|s| cpu_seconds(s.pid())).collect()
    }

    /// `(messages, bytes, leader)` of `stream` as the monitoring endpoint reports them
    /// (the bytes of one replica).
    fn stream(&self, stream: &str) -> Option<(u64, u64, String)> {
        for port in &self.http_ports {
            let Some(body) = http_get(
                &format!("127.0.0.1:{port}"),
                "/jsz?accounts=true&streams=true",
            ) else {
                continue;
            };
            let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let found = json["account_details"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|a| a["stream_detail"].as_array().into_iter().flatten())
                .find(|s| s["name"] == stream);
            if let Some(s) = found {
                return Some((
                    s["state"]["messages"].as_u64().unwrap_or(0),
                    s["state"]["bytes"].as_u64().unwrap_or(0),
                    s["cluster"]["leader"].as_str().unwrap_or("?").to_string(),
                ));
            }
        }
        None
    }
}

/// One `hourglass-aggregator` process on free loopback ports.
struct Node {
    process: Process,
    grpc: String,
    admin: String,
    data: PathBuf,
}

impl Node {
    fn start(dir: &Path, name: &str, config: Option<&str>) -> Node {
        use std::os::unix::process::CommandExt;
        let data = dir.join(name);
        // Another build's binary, to compare two builds in turn on the same machine.
        let binary = std::env::var_os("HOURGLASS_BENCH_BIN").map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_hourglass")),
            PathBuf::from,
        );
        let mut command = Command::new(binary);
        command.arg0("hourglass-aggregator").args([
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--http-listen",
            "off",
            "--data-dir",
            data.to_str().expect("utf-8"),
        ]);
        if let Some(config) = config {
            let path = dir.join(format!("{name}.toml"));
            std::fs::write(&path, config).expect("config file");
            command.arg("--config").arg(path);
        }
        let log_path = dir.join(format!("{name}.log"));
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdout(std::fs::File::create(&log_path).expect("log file"))
            .stderr(Stdio::piped())
            .spawn()
            .expect("start hourglass-aggregator");
        let mut lines = std::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
        let (mut grpc, mut admin) = (String::new(), String::new());
        while grpc.is_empty() || admin.is_empty() {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("{name} ended before announcing its ports"))
                .expect("line");
            if let Some(addr) = line.strip_prefix("grpc listening on ") {
                grpc = format!("http://{}", addr.trim());
            } else if let Some(addr) = line.strip_prefix("admin listening on ") {
                admin = addr.trim().to_string();
            }
        }
        // The rest of stderr (warnings) after the announcements, for a look afterwards.
        let mut rest = std::fs::File::create(dir.join(format!("{name}.stderr"))).expect("log");
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = writeln!(rest, "{line}");
            }
        });
        Node {
            process: Process { child },
            grpc,
            admin,
            data,
        }
    }

    fn metrics(&self) -> String {
        http_get(&self.admin, "/metrics").unwrap_or_default()
    }

    fn cpu(&self) -> f64 {
        cpu_seconds(self.process.pid())
    }
}

/// A setup's `[cluster]` section for node `node`.
fn cluster_config(nats: &Nats, node: &str, stream: &str, sizes: &Sizes) -> String {
    let urls: Vec<String> = nats.urls().iter().map(|u| format!("{u:?}")).collect();
    let subjects = sizes
        .subjects
        .map_or(String::new(), |s| format!("subjects = {s}\n"));
    format!(
        "[cluster]\nnode = \"{node}\"\nnats = [{}]\nstream = \"{stream}\"\nsubject_prefix = \"{}\"\n\
         partitions = {}\n{subjects}replicas = 3\nowners = {OWNERS}\nheartbeat = \"{HEARTBEAT}\"\n\
         member_ttl = \"{MEMBER_TTL}\"\n",
        urls.join(", "),
        stream.to_lowercase(),
        sizes.partitions,
    )
}

/// Waits until every node sees all of them as members and is ready for every partition
/// it applies, each carried by its live consumer (the steady state: one consumer a node;
/// a build from before that reports no such metric), and the nodes together apply each
/// partition `min(owners, nodes)` times.
fn wait_ready(nodes: &[Node], partitions: u32) {
    let n = nodes.len();
    let want = f64::from(partitions) * OWNERS.min(n) as f64;
    wait_until(
        "the nodes to join and be ready",
        Duration::from_secs(90),
        || {
            let mut total = 0.0;
            for node in nodes {
                let text = node.metrics();
                let applying = metric(&text, "cluster_partitions_applying");
                if metric(&text, "cluster_members") != n as f64
                    || applying == 0.0
                    || metric(&text, "cluster_partitions_ready") != applying
                    || (text.contains("cluster_partitions_carried")
                        && metric(&text, "cluster_partitions_carried") != applying)
                {
                    return false;
                }
                total += applying;
            }
            total == want
        },
    );
}

/// Every client's encoded sketches: `[client][series][variant]`. Client `i`'s visitors
/// are its own; its series overlap each other.
fn sketches(sizes: &Sizes) -> Arc<Vec<Vec<Vec<Bytes>>>> {
    let all = (0..sizes.clients as u64)
        .map(|i| {
            (0..sizes.series as u64)
                .map(|j| {
                    (0..VARIANTS as u64)
                        .map(|v| {
                            let mut h = hourglass_sketch::hll::Hll::new(12).expect("p = 12");
                            for k in 0..u64::from(sizes.items) + 10 * v {
                                let visitor = i * 1_000_000 + j * 37 + k;
                                h.insert(&visitor.to_le_bytes());
                            }
                            Bytes::from(h.encode())
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    Arc::new(all)
}

fn push_request(
    sketches: &[Vec<Bytes>],
    client: usize,
    hour: u32,
    version: u64,
) -> v1::PushRequest {
    v1::PushRequest {
        server: Some(v1::Server {
            name: format!("web-{client}"),
            labels: vec![],
        }),
        snapshots: sketches
            .iter()
            .enumerate()
            .map(|(j, variants)| v1::Snapshot {
                series: Some(v1::Series {
                    metric: "visits".into(),
                    tags: vec![v1::Tag {
                        key: "page".into(),
                        value: format!("p{j}"),
                    }],
                }),
                hour,
                epoch: 1,
                version,
                sketch: Some(v1::EncodedSketch {
                    kind: v1::SketchKind::Distinct as i32,
                    data: variants[version as usize % VARIANTS].clone(),
                }),
            })
            .collect(),
        live_hours: vec![hour],
    }
}

async fn connect(url: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(url.to_string())
        .expect("url")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

#[derive(Default)]
struct Load {
    seconds: f64,
    pushes: u64,
    stored: u64,
    stale: u64,
    rejected: u64,
    errors: BTreeMap<String, u64>,
    /// Answered pushes' latencies, seconds, sorted.
    latencies: Vec<f64>,
    /// Bytes of sketches per push.
    sketch_bytes_per_push: u64,
}

/// `sizes.clients` clients push to `urls` round-robin for `sizes.load`: each as fast as
/// it is answered, or, with `pace`, at most that many pushes/s in all (each client
/// starts its pushes at fixed times), to measure latency below saturation.
async fn load(
    sizes: &Sizes,
    urls: &[String],
    sketches: &Arc<Vec<Vec<Vec<Bytes>>>>,
    hour: u32,
    pace: Option<f64>,
) -> Load {
    let mut tasks = Vec::new();
    let started = Instant::now();
    let deadline = started + sizes.load;
    let clients_n = sizes.clients;
    for client in 0..sizes.clients {
        let sketches = sketches.clone();
        let urls = urls.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut clients = Vec::new();
            for url in &urls {
                clients.push(CollectorClient::new(connect(url).await));
            }
            let mut out = Load::default();
            let mut version = 0u64;
            // Each client's share of the pace, its first push offset from the others'.
            let interval = pace.map(|rate| Duration::from_secs_f64(clients_n as f64 / rate));
            while Instant::now() < deadline {
                if let Some(interval) = interval {
                    let offset = interval.mul_f64(client as f64 / clients_n as f64);
                    tokio::time::sleep_until((started + offset + interval * version as u32).into())
                        .await;
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                version += 1;
                let target = (client + version as usize) % clients.len();
                let mut request =
                    tonic::Request::new(push_request(&sketches[client], client, hour, version));
                request.set_timeout(Duration::from_secs(30));
                let t = Instant::now();
                match clients[target].push(request).await {
                    Ok(answer) => {
                        out.latencies.push(t.elapsed().as_secs_f64());
                        out.pushes += 1;
                        for r in &answer.get_ref().results {
                            match r.outcome() {
                                v1::PushOutcome::Stored => out.stored += 1,
                                v1::PushOutcome::Stale => out.stale += 1,
                                _ => out.rejected += 1,
                            }
                        }
                    }
                    Err(status) => {
                        *out.errors
                            .entry(format!("{:?}", status.code()))
                            .or_default() += 1;
                        // Not a busy loop against a node that refuses everything.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            out
        }));
    }
    let mut total = Load::default();
    for task in tasks {
        let one = task.await.expect("client task");
        total.pushes += one.pushes;
        total.stored += one.stored;
        total.stale += one.stale;
        total.rejected += one.rejected;
        for (code, n) in one.errors {
            *total.errors.entry(code).or_default() += n;
        }
        total.latencies.extend(one.latencies);
    }
    total.seconds = started.elapsed().as_secs_f64();
    total.latencies.sort_by(f64::total_cmp);
    total.sketch_bytes_per_push = sketches[0].iter().map(|v| v[0].len() as u64).sum();
    total
}

/// The distinct count of `visits` over every server in `hour`, and partitions missing.
async fn distinct(q: &mut QueryClient<Channel>, hour: u32) -> Result<(f64, u32), tonic::Status> {
    let answer = q
        .distinct(v1::DistinctRequest {
            selector: Some(v1::Selector {
                metric: "visits".into(),
                range: Some(v1::TimeRange {
                    start_hour: hour,
                    end_hour: hour + 1,
                }),
                ..Default::default()
            }),
        })
        .await?
        .into_inner();
    Ok((
        answer.answer.map_or(f64::NAN, |a| a.estimate),
        answer.coverage.map_or(0, |c| c.partitions_missing),
    ))
}

struct Queries {
    /// Per node: its estimate and its latencies, seconds, sorted.
    per_node: Vec<(f64, Vec<f64>)>,
    /// Seconds from the end of the load until every node gave the same full answer
    /// twice in a row.
    settle_seconds: f64,
}

/// Waits until every node answers the same estimate with no partition missing, twice a
/// `sizes.settle` apart, then times `sizes.queries` queries against each node.
async fn queries(sizes: &Sizes, nodes: &[Node], hour: u32, load_end: Instant) -> Queries {
    let mut clients = Vec::new();
    for n in nodes {
        clients.push(QueryClient::new(connect(&n.grpc).await));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut previous = None;
    loop {
        let mut answers = Vec::new();
        for c in &mut clients {
            answers.push(distinct(c, hour).await.ok());
        }
        let settled = answers.iter().all(|a| {
            a.is_some_and(|(e, missing)| missing == 0 && Some(e) == answers[0].map(|a| a.0))
        });
        if settled && previous == Some(answers.clone()) {
            break;
        }
        previous = settled.then_some(answers);
        if Instant::now() > deadline {
            println!("  WARNING: the nodes' answers did not settle within 60 s: {previous:?}");
            break;
        }
        tokio::time::sleep(sizes.settle).await;
    }
    let settle_seconds = load_end.elapsed().as_secs_f64();
    let mut per_node = Vec::new();
    for c in &mut clients {
        let mut latencies = Vec::new();
        let mut estimate = f64::NAN;
        for _ in 0..sizes.queries {
            let t = Instant::now();
            if let Ok((e, _)) = distinct(c, hour).await {
                latencies.push(t.elapsed().as_secs_f64());
                estimate = e;
            }
        }
        latencies.sort_by(f64::total_cmp);
        per_node.push((estimate, latencies));
    }
    Queries {
        per_node,
        settle_seconds,
    }
}

/// The engine's ceiling for the same load, with no hourglass in the way: `clients`
/// concurrent publishers on 3 connections (one per would-be entry node), each "push" the
/// bytes an entry publishes for one push, sent as `shape` says and acknowledged by
/// JetStream, on a stream like the cluster's (3 replicas, file storage, the same NATS
/// servers) for `sizes.load`. Returns the pushes/s and the sorted latencies, seconds.
async fn engine_publish(
    nats: &Nats,
    sizes: &Sizes,
    stream: &str,
    shape: &PushShape,
    consumers: Option<Consumers>,
) -> (f64, Vec<f64>) {
    let urls = nats.urls();
    let first = async_nats::connect(urls[0].as_str())
        .await
        .expect("connect to NATS");
    let js = async_nats::jetstream::new(first);
    let prefix = stream.to_lowercase();
    let config = async_nats::jetstream::stream::Config {
        name: stream.to_string(),
        subjects: vec![format!("{prefix}.>")],
        num_replicas: 3,
        storage: async_nats::jetstream::stream::StorageType::File,
        max_age: Duration::from_secs(7 * 86_400),
        ..Default::default()
    };
    // The servers may still be electing JetStream's leader.
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = js.create_stream(config.clone()).await {
        assert!(Instant::now() < deadline, "create the engine stream: {e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut connections = Vec::new();
    for i in 0..3 {
        let client = async_nats::connect(&urls[i % urls.len()])
            .await
            .expect("connect to NATS");
        connections.push(async_nats::jetstream::new(client));
    }
    // While it is published, the stream is drained as a node would: one consumer per
    // subject, each message acknowledged as it comes (or not at all).
    let drains = match consumers {
        Some(kind) => drain_all(&js, stream, &prefix, kind, sizes.partitions).await,
        None => Vec::new(),
    };
    let started = Instant::now();
    let deadline = started + sizes.load;
    let mut tasks = Vec::new();
    for client in 0..sizes.clients {
        let js = connections[client % connections.len()].clone();
        let (prefix, shape) = (prefix.clone(), shape.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0usize;
            while Instant::now() < deadline {
                n += 1;
                let t = Instant::now();
                let mut acks = Vec::new();
                for (k, bytes) in shape.partitions.iter().enumerate() {
                    let subject = format!("{prefix}.p.{}", (client * 7 + n + k) % 64);
                    let payload = Bytes::from(vec![0x5au8; *bytes]);
                    acks.push(js.publish(subject, payload).await.expect("publish"));
                }
                let mut ok = true;
                for ack in acks {
                    ok &= ack.await.is_ok();
                }
                if shape.live > 0 {
                    let payload = Bytes::from(vec![0x5au8; shape.live]);
                    match js.publish(format!("{prefix}.live"), payload).await {
                        Ok(ack) => ok &= ack.await.is_ok(),
                        Err(_) => ok = false,
                    }
                }
                if ok {
                    latencies.push(t.elapsed().as_secs_f64());
                }
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("publisher"));
    }
    let seconds = started.elapsed().as_secs_f64();
    for drain in drains {
        drain.abort();
    }
    latencies.sort_by(f64::total_cmp);
    (latencies.len() as f64 / seconds, latencies)
}

/// How the engine's consumers are made: their replicas, storage and acknowledgements.
#[derive(Clone, Copy, Debug)]
enum Consumers {
    /// As the cluster's: the stream's 3 replicas, file storage, a plain ack per message.
    Replicated,
    /// The same without acknowledgements (AckPolicy::None).
    Unacknowledged,
    /// One replica, file storage, a plain ack per message.
    Single,
    /// One replica in memory, a plain ack per message.
    Memory,
    /// Three nodes' worth as the cluster makes them: one consumer a subject a node,
    /// each node the partitions an owners-2 placement gives it and the live subject (131
    /// consumers), the stream's 3 replicas, file storage, a plain ack per message.
    PerSubjectThreeNodes,
    /// The same in memory: the consumers' Raft groups keep their logs in memory, so
    /// their deliveries and acks are replicated but not fsynced.
    PerSubjectThreeNodesMemory,
    /// Three nodes' worth as one consumer a node, not one a subject: the stream's 3
    /// replicas, file storage, each filtering the partitions an owners-2 placement gives
    /// its node (`filter_subjects`) and the live subject, a plain ack per message.
    PerNode,
    /// The same, acknowledged once per batch received (AckPolicy::All on its last).
    PerNodeAckAll,
}

/// A consumer per partition subject and the live subject of `stream`, each drained (and
/// its messages acknowledged as `kind` says) by a task of its own until aborted.
async fn drain_all(
    js: &async_nats::jetstream::Context,
    stream: &str,
    prefix: &str,
    kind: Consumers,
    partitions: u32,
) -> Vec<tokio::task::JoinHandle<()>> {
    use async_nats::jetstream::consumer::{AckPolicy, pull};
    use tokio_stream::StreamExt;
    let stream = js.get_stream(stream).await.expect("the engine stream");
    if matches!(
        kind,
        Consumers::PerNode
            | Consumers::PerNodeAckAll
            | Consumers::PerSubjectThreeNodes
            | Consumers::PerSubjectThreeNodesMemory
    ) {
        return drain_per_node(&stream, prefix, kind, partitions).await;
    }
    let mut tasks = Vec::new();
    for (i, subject) in (0..partitions)
        .map(|p| format!("{prefix}.p.{p}"))
        .chain([format!("{prefix}.live")])
        .enumerate()
    {
        let consumer: async_nats::jetstream::consumer::PullConsumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(format!("engine-drain-{i}")),
                filter_subject: subject,
                ack_policy: match kind {
                    Consumers::Unacknowledged => AckPolicy::None,
                    _ => AckPolicy::Explicit,
                },
                max_ack_pending: 256,
                num_replicas: match kind {
                    Consumers::Single | Consumers::Memory => 1,
                    _ => 0,
                },
                memory_storage: matches!(kind, Consumers::Memory),
                ..Default::default()
            })
            .await
            .expect("a consumer");
        tasks.push(tokio::spawn(async move {
            let mut messages = consumer.messages().await.expect("its messages");
            while let Some(Ok(message)) = messages.next().await {
                if !matches!(kind, Consumers::Unacknowledged) {
                    let _ = message.ack().await;
                }
            }
        }));
    }
    tasks
}

/// One consumer for each of 3 nodes over `stream`, filtering the partitions an owners-2
/// placement gives the node (partition p to nodes p mod 3 and p + 1 mod 3) and the live
/// subject, each drained by a task of its own until aborted.
async fn drain_per_node(
    stream: &async_nats::jetstream::stream::Stream,
    prefix: &str,
    kind: Consumers,
    partitions: u32,
) -> Vec<tokio::task::JoinHandle<()>> {
    let all = matches!(kind, Consumers::PerNodeAckAll);
    let memory = matches!(kind, Consumers::PerSubjectThreeNodesMemory);
    let mut tasks = Vec::new();
    for node in 0..3u32 {
        let subjects: Vec<String> = (0..partitions)
            .filter(|p| p % 3 == node || (p + 1) % 3 == node)
            .map(|p| format!("{prefix}.p.{p}"))
            .chain([format!("{prefix}.live")])
            .collect();
        // One consumer for all the node's subjects, or (as the cluster does) one each.
        let groups: Vec<Vec<String>> = if matches!(
            kind,
            Consumers::PerSubjectThreeNodes | Consumers::PerSubjectThreeNodesMemory
        ) {
            subjects.into_iter().map(|s| vec![s]).collect()
        } else {
            vec![subjects]
        };
        for (i, subjects) in groups.into_iter().enumerate() {
            let name = format!("engine-node-{node}-{i}");
            tasks.push(drain_one(stream, name, subjects, all, memory).await);
        }
    }
    tasks
}

/// A consumer of `subjects` named `name` (the stream's replicas, its state in memory if
/// `memory`), drained by a task until aborted: each message acknowledged, or (`all`) the
/// last of each batch with AckPolicy::All.
async fn drain_one(
    stream: &async_nats::jetstream::stream::Stream,
    name: String,
    subjects: Vec<String>,
    all: bool,
    memory: bool,
) -> tokio::task::JoinHandle<()> {
    use async_nats::jetstream::consumer::{AckPolicy, pull};
    use tokio_stream::StreamExt;
    let consumer: async_nats::jetstream::consumer::PullConsumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name),
            filter_subjects: subjects,
            ack_policy: if all {
                AckPolicy::All
            } else {
                AckPolicy::Explicit
            },
            max_ack_pending: 4096,
            memory_storage: memory,
            ..Default::default()
        })
        .await
        .expect("a consumer");
    tokio::spawn(async move {
        if !all {
            let mut messages = consumer.messages().await.expect("its messages");
            while let Some(Ok(message)) = messages.next().await {
                let _ = message.ack().await;
            }
            return;
        }
        loop {
            let Ok(mut batch) = consumer
                .batch()
                .max_messages(256)
                .expires(Duration::from_millis(100))
                .messages()
                .await
            else {
                return;
            };
            let mut last = None;
            while let Some(Ok(message)) = batch.next().await {
                last = Some(message);
            }
            if let Some(message) = last {
                let _ = message.ack().await;
            }
        }
    })
}

/// How an entry publishes one push: the payload bytes of each partition's message, sent
/// at once, and then of the live message (0: none).
#[derive(Clone, Debug)]
struct PushShape {
    partitions: Vec<usize>,
    live: usize,
}

impl PushShape {
    /// The push of client 0 as the cluster's entry splits it (one message per subject
    /// its series' partitions fall in, then the live message), or all its bytes as one
    /// message.
    fn of(sketches: &[Vec<Bytes>], sizes: &Sizes, one_message: bool) -> PushShape {
        let partitions = sizes.partitions;
        let subjects = sizes
            .subjects
            .unwrap_or(hourglass_aggregator::config::DEFAULT_SUBJECTS)
            .min(partitions);
        use prost::Message;
        let request = push_request(sketches, 0, 500_000, 1);
        if one_message {
            return PushShape {
                partitions: vec![request.encoded_len()],
                live: 0,
            };
        }
        let mut by_subject: BTreeMap<u32, usize> = BTreeMap::new();
        for s in &request.snapshots {
            let series = s.series.as_ref().expect("series");
            let name = hourglass_aggregator::store::SeriesName::new(
                series.metric.clone(),
                series
                    .tags
                    .iter()
                    .map(|t| (t.key.clone(), t.value.clone()))
                    .collect(),
                hourglass_sketch::Kind::Distinct,
            );
            let p = hourglass_aggregator::cluster::partition(&name, partitions);
            let server = 16; // the server's name and field tags
            *by_subject.entry(p % subjects).or_insert(server) += s.encoded_len() + 3;
        }
        PushShape {
            partitions: by_subject.into_values().collect(),
            // The server, live hours and the series index (names, no sketches).
            live: request
                .snapshots
                .iter()
                .map(|s| s.series.as_ref().map_or(0, |x| x.encoded_len()) + 12)
                .sum::<usize>()
                + 24,
        }
    }

    fn bytes(&self) -> usize {
        self.partitions.iter().sum::<usize>() + self.live
    }
}

/// Runs the engine baselines and prints them; returns the pushes/s of the entry's shape
/// and of one message per push.
fn run_engine(
    sizes: &Sizes,
    nats: &Nats,
    sketches: &Arc<Vec<Vec<Vec<Bytes>>>>,
    rt: &tokio::runtime::Runtime,
) -> (f64, f64) {
    println!();
    println!(
        "== engine: JetStream alone on the same 3 NATS servers (3 replicas, file storage, sync_interval always), {} concurrent publishers, {:.1} s each",
        sizes.clients,
        sizes.load.as_secs_f64()
    );
    let mut rates = Vec::new();
    let variants = [
        ("entry's shape", false, None),
        ("one message", true, None),
        (
            "entry's shape, drained as the cluster's consumers do (R3, ack each)",
            false,
            Some(Consumers::Replicated),
        ),
        (
            "entry's shape, drained by R3 consumers without acks",
            false,
            Some(Consumers::Unacknowledged),
        ),
        (
            "entry's shape, drained by R1 file consumers (ack each)",
            false,
            Some(Consumers::Single),
        ),
        (
            "entry's shape, drained by R1 memory consumers (ack each)",
            false,
            Some(Consumers::Memory),
        ),
        (
            "entry's shape, drained as 3 nodes' consumers (owners 2, R3, one a subject a node: 131, ack each)",
            false,
            Some(Consumers::PerSubjectThreeNodes),
        ),
        (
            "entry's shape, drained as 3 nodes' consumers in memory (owners 2, R3, one a subject a node: 131, ack each)",
            false,
            Some(Consumers::PerSubjectThreeNodesMemory),
        ),
        (
            "entry's shape, drained by one R3 consumer a node for 3 nodes (owners 2, ack each)",
            false,
            Some(Consumers::PerNode),
        ),
        (
            "entry's shape, drained by one R3 consumer a node for 3 nodes (owners 2, ack-all per batch)",
            false,
            Some(Consumers::PerNodeAckAll),
        ),
    ];
    for (i, (name, one, consumers)) in variants.into_iter().enumerate() {
        if matches!(
            consumers,
            Some(Consumers::PerSubjectThreeNodes | Consumers::PerSubjectThreeNodesMemory)
        ) && !sizes.three_nodes_of_consumers
        {
            continue;
        }
        let shape = PushShape::of(&sketches[0], sizes, one);
        let before = nats.cpu();
        let stream = format!("BENCH_ENGINE_{i}");
        let (rate, latencies) =
            rt.block_on(engine_publish(nats, sizes, &stream, &shape, consumers));
        let cpu: f64 = nats.cpu().iter().zip(&before).map(|(a, b)| a - b).sum();
        println!(
            "   {name}: {} message(s) of {} B in all per push{}: {rate:.1} pushes/s, latency p50 {:.1} ms, p99 {:.1} ms; NATS CPU {:.2} ms per push",
            shape.partitions.len() + usize::from(shape.live > 0),
            shape.bytes(),
            if shape.live > 0 {
                " (partitions at once, then the live message)"
            } else {
                ""
            },
            quantile(&latencies, 0.5) * 1e3,
            quantile(&latencies, 0.99) * 1e3,
            cpu / (latencies.len().max(1) as f64) * 1e3,
        );
        rates.push(rate);
    }
    (rates[0], rates[1])
}

/// The push latency p99 (seconds) of the same clients pushing at `rate` pushes/s in all.
fn paced_latency(
    sizes: &Sizes,
    urls: &[String],
    sketches: &Arc<Vec<Vec<Vec<Bytes>>>>,
    hour: u32,
    rate: f64,
    rt: &tokio::runtime::Runtime,
) -> f64 {
    let paced = rt.block_on(load(sizes, urls, sketches, hour, Some(rate.max(1.0))));
    let p99 = quantile(&paced.latencies, 0.99);
    println!(
        "   paced at half that rate ({:.1} pushes/s asked, {:.1} answered): push latency p50 {:.1} ms, p99 {:.1} ms, errors {:?}",
        rate,
        paced.pushes as f64 / paced.seconds,
        quantile(&paced.latencies, 0.5) * 1e3,
        p99 * 1e3,
        paced.errors,
    );
    p99
}

/// How fast a node applies the stream, against a bare drain of the same messages: the
/// node (`node`, the only one) is stopped, its data dir wiped, and started again, so that
/// it applies the whole stream (every partition and the live subject) through new
/// consumers; then 65 bare consumers (one per subject, like the node's: durable, pull,
/// explicit acks, the stream's replicas) drain the same messages with a plain ack each.
/// Both are timed from their start to the last message applied or received, consumer
/// creation included. Returns both rates, messages/s.
fn catch_up(
    sizes: &Sizes,
    dir: &Path,
    node: Node,
    config: &str,
    nats: &Nats,
    stream: &str,
    rt: &tokio::runtime::Runtime,
) -> (f64, f64) {
    let data = node.data.clone();
    let name = data
        .file_name()
        .and_then(|n| n.to_str())
        .expect("node name")
        .to_string();
    drop(node);
    std::fs::remove_dir_all(&data).expect("wipe the node's data dir");
    let (messages, _, _) = nats.stream(stream).expect("the stream's state");
    let started = Instant::now();
    let node = Node::start(dir, &name, Some(config));
    wait_ready(std::slice::from_ref(&node), sizes.partitions);
    wait_until(
        "the node to apply the stream",
        Duration::from_secs(300),
        || metric(&node.metrics(), "cluster_pending") == 0.0,
    );
    let applied = started.elapsed().as_secs_f64();
    drop(node);
    let started = Instant::now();
    let drained = rt.block_on(bare_drain(nats, stream, sizes.partitions));
    let drain = started.elapsed().as_secs_f64();
    let (apply_rate, drain_rate) = (messages as f64 / applied, drained as f64 / drain);
    println!(
        "   a wiped node applies the whole stream ({messages} messages, 1 node owning every partition): {applied:.1} s, {apply_rate:.0} messages/s; a bare drain of the same ({drained} messages, plain acks): {drain:.1} s, {drain_rate:.0} messages/s; the node at {:.0}% of the drain",
        100.0 * apply_rate / drain_rate
    );
    (apply_rate, drain_rate)
}

/// Drains every subject of `stream` (its partitions and live subject) through one new
/// durable pull consumer each, acknowledging each message with a plain ack as it comes,
/// until it received what the stream holds of its subject; returns the messages received.
async fn bare_drain(nats: &Nats, stream: &str, partitions: u32) -> u64 {
    use async_nats::jetstream::consumer::{AckPolicy, pull};
    use tokio_stream::StreamExt;
    let client = async_nats::connect(nats.urls()[0].as_str())
        .await
        .expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream(stream).await.expect("the stream");
    let prefix = stream.cached_info().config.name.to_lowercase();
    let subjects: Vec<String> = (0..partitions)
        .map(|p| format!("{prefix}.p.{p}"))
        .chain([format!("{prefix}.live")])
        .collect();
    // What each subject holds, from the stream itself: a consumer's own count of what it
    // has pending, read right after it is made, was at times short of it (the drain then
    // stopped early and its rate was taken over fewer messages than the node applied).
    let mut held: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let mut counts = stream
        .info_with_subjects(format!("{prefix}.>"))
        .await
        .expect("the stream's subjects");
    while let Some(count) = counts.next().await {
        let (subject, count) = count.expect("a subject's count");
        held.insert(subject, count as u64);
    }
    let mut tasks = Vec::new();
    for (i, subject) in subjects.into_iter().enumerate() {
        let stream = stream.clone();
        let left = held.get(&subject).copied().unwrap_or(0);
        tasks.push(tokio::spawn(async move {
            let consumer: async_nats::jetstream::consumer::PullConsumer = stream
                .create_consumer(pull::Config {
                    durable_name: Some(format!("bare-drain-{i}")),
                    filter_subject: subject,
                    ack_policy: AckPolicy::Explicit,
                    max_ack_pending: 256,
                    ..Default::default()
                })
                .await
                .expect("a consumer");
            let mut messages = consumer.messages().await.expect("its messages");
            let mut received = 0u64;
            while received < left {
                let Some(Ok(message)) = messages.next().await else {
                    break;
                };
                let _ = message.ack().await;
                received += 1;
            }
            received
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("a drain");
    }
    total
}

/// What one setup measured, for the ratios at the end.
struct Summary {
    name: &'static str,
    pushes_per_second: f64,
    push_p50: f64,
    query_p50: f64,
    /// Aggregators' and NATS servers' CPU seconds during the load.
    cpu: f64,
    pushes: u64,
    /// Push latency p99 at half the saturated rate, seconds (cluster setups).
    paced_p99: f64,
    /// Messages/s a wiped node applied from the stream, and a bare drain of the same
    /// messages (cluster-1).
    apply_rate: (f64, f64),
}

fn run_setup(
    name: &'static str,
    sizes: &Sizes,
    dir: &Path,
    nats: Option<&Nats>,
    nodes_wanted: usize,
    sketches: &Arc<Vec<Vec<Vec<Bytes>>>>,
    rt: &tokio::runtime::Runtime,
) -> Summary {
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir).expect("setup dir");
    let stream = format!("BENCH_{}", name.replace('-', "_").to_uppercase());
    let started = Instant::now();
    let nodes: Vec<Node> = (1..=nodes_wanted)
        .map(|i| {
            let node = format!("{name}-agg-{i}");
            let config = nats.map(|n| cluster_config(n, &node, &stream, sizes));
            Node::start(&dir, &node, config.as_deref())
        })
        .collect();
    if nats.is_some() {
        wait_ready(&nodes, sizes.partitions);
    }
    let ready_seconds = started.elapsed().as_secs_f64();
    let hour = hourglass_rpc::time::hour_of(hourglass_rpc::time::unix_now()).expect("an hour");
    let urls: Vec<String> = nodes.iter().map(|n| n.grpc.clone()).collect();

    let cpu_before: Vec<f64> = nodes.iter().map(Node::cpu).collect();
    let nats_before = nats.map(Nats::cpu).unwrap_or_default();
    let bench_before = cpu_seconds(std::process::id());
    // On stderr, for a profiler to start on (BENCHMARKS.md, "What bounds it next").
    eprintln!(
        "   {name}: the load begins ({:.0} s)",
        sizes.load.as_secs_f64()
    );
    let load = rt.block_on(load(sizes, &urls, sketches, hour, None));
    let load_end = Instant::now();
    let cpu_load: Vec<f64> = nodes
        .iter()
        .zip(&cpu_before)
        .map(|(n, b)| n.cpu() - b)
        .collect();
    let nats_load: Vec<f64> = nats
        .map(Nats::cpu)
        .unwrap_or_default()
        .iter()
        .zip(&nats_before)
        .map(|(a, b)| a - b)
        .collect();
    let bench_load = cpu_seconds(std::process::id()) - bench_before;

    // Everything published applied: no message pending on any node, twice in a row.
    if nats.is_some() {
        for _ in 0..2 {
            wait_until(
                "the nodes to apply the stream",
                Duration::from_secs(120),
                || {
                    nodes
                        .iter()
                        .all(|n| metric(&n.metrics(), "cluster_pending") == 0.0)
                },
            );
            std::thread::sleep(sizes.settle);
        }
    }
    let queries = rt.block_on(queries(sizes, &nodes, hour, load_end));

    let texts: Vec<String> = nodes.iter().map(Node::metrics).collect();
    let rocksdb: Vec<u64> = nodes.iter().map(|n| dir_bytes(&n.data)).collect();
    let stream_state = nats.and_then(|n| n.stream(&stream));

    // The table.
    let pps = load.pushes as f64 / load.seconds;
    let snapshots = load.stored + load.stale;
    let errors: u64 = load.errors.values().sum();
    let cpu_aggs: f64 = cpu_load.iter().sum();
    let cpu_nats: f64 = nats_load.iter().sum();
    println!();
    println!(
        "== {name}: {} aggregator node(s){}; {} clients x {} series of HLL p=12 ({} B of sketches per push), {:.1} s of load; ready {ready_seconds:.1} s after start",
        nodes.len(),
        if nats.is_some() {
            format!(
                ", cluster mode (partitions {}, owners {OWNERS}, replicas 3, stream {stream})",
                sizes.partitions
            )
        } else {
            ", no [cluster] (baseline)".to_string()
        },
        sizes.clients,
        sizes.series,
        load.sketch_bytes_per_push,
        load.seconds,
    );
    println!(
        "   pushes/s {pps:.1} | snapshots/s {:.0} acknowledged ({} STORED, {} STALE, {} REJECTED) | push latency p50 {:.1} ms, p99 {:.1} ms | errors {errors} {:?}",
        snapshots as f64 / load.seconds,
        load.stored,
        load.stale,
        load.rejected,
        quantile(&load.latencies, 0.5) * 1e3,
        quantile(&load.latencies, 0.99) * 1e3,
        load.errors,
    );
    let estimates: Vec<f64> = queries.per_node.iter().map(|q| q.0).collect();
    let same = estimates
        .iter()
        .all(|e| e.to_bits() == estimates[0].to_bits());
    println!(
        "   Distinct(visits, all servers, this hour) = {:.1} on every node: {} (settled {:.1} s after the load)",
        estimates[0],
        if same { "yes" } else { "NO" },
        queries.settle_seconds,
    );
    println!(
        "   CPU seconds during the load: aggregators {cpu_aggs:.2} {:?}, NATS {cpu_nats:.2} {:?}, bench clients {bench_load:.2}; pushes per CPU-second (aggregators + NATS) {:.1}",
        cpu_load
            .iter()
            .map(|c| (c * 100.0).round() / 100.0)
            .collect::<Vec<_>>(),
        nats_load
            .iter()
            .map(|c| (c * 100.0).round() / 100.0)
            .collect::<Vec<_>>(),
        load.pushes as f64 / (cpu_aggs + cpu_nats),
    );
    println!(
        "   {:<16} {:>10} {:>10} {:>11} {:>13} {:>12} {:>13} {:>12} {:>10} {:>10}",
        "node",
        "query p50",
        "query p99",
        "published",
        "published MB",
        "publish p50",
        "publish mean",
        "applied",
        "share",
        "RocksDB MB"
    );
    let applied: Vec<f64> = texts
        .iter()
        .map(|t| metric(t, "cluster_applied_snapshots_total"))
        .collect();
    let published_snapshots: f64 = texts
        .iter()
        .map(|t| metric(t, "cluster_published_snapshots_total"))
        .sum();
    for (i, node) in nodes.iter().enumerate() {
        let t = &texts[i];
        let count = metric(t, "cluster_publish_duration_seconds_count");
        let sum = metric(t, "cluster_publish_duration_seconds_sum");
        let lat = &queries.per_node[i].1;
        println!(
            "   {:<16} {:>7.1} ms {:>7.1} ms {:>11.0} {:>13.2} {:>9.1} ms {:>10.1} ms {:>12.0} {:>10} {:>10.2}",
            format!("{name}-agg-{}", i + 1),
            quantile(lat, 0.5) * 1e3,
            quantile(lat, 0.99) * 1e3,
            metric(t, "cluster_published_messages_total"),
            metric(t, "cluster_published_bytes_total") / 1e6,
            histogram_quantile(t, "cluster_publish_duration_seconds", 0.5) * 1e3,
            if count > 0.0 {
                sum / count * 1e3
            } else {
                f64::NAN
            },
            applied[i],
            if published_snapshots > 0.0 {
                format!("{:.2}", applied[i] / published_snapshots)
            } else {
                "-".into()
            },
            rocksdb[i] as f64 / 1e6,
        );
        let _ = node;
    }
    if let Some((messages, bytes, leader)) = &stream_state {
        let published_bytes: f64 = texts
            .iter()
            .map(|t| metric(t, "cluster_published_bytes_total"))
            .sum();
        // Pushes published: an UNAVAILABLE answer may come after the publish.
        let published_pushes = (published_snapshots / sizes.series as f64).max(1.0);
        println!(
            "   stream {stream}: {messages} messages, {:.2} MB per replica (x3 replicas on disk), leader {leader}; {published_pushes:.0} pushes published ({published_snapshots:.0} snapshots), {:.0} B of stream and {:.0} B published per push",
            *bytes as f64 / 1e6,
            *bytes as f64 / published_pushes,
            published_bytes / published_pushes,
        );
    }
    // What cannot flake: a single aggregator answers pushes. A cluster on an overloaded
    // machine may answer none in a 2 s smoke run (its consumers and heartbeats time out
    // against NATS), which is a figure to report, not a failure of the bench.
    if nats.is_none() {
        assert!(
            load.pushes > 0,
            "{name}: no push was answered ({:?})",
            load.errors
        );
    }
    if !same {
        println!("   WARNING: {name}: the nodes answer differently: {estimates:?}");
    }
    let mut paced_p99 = f64::NAN;
    let mut apply_rate = (f64::NAN, f64::NAN);
    if let Some(nats) = nats {
        paced_p99 = paced_latency(sizes, &urls, sketches, hour, pps / 2.0, rt);
        if nodes.len() == 1 {
            let node = nodes.into_iter().next().expect("one node");
            let config = cluster_config(nats, &format!("{name}-agg-1"), &stream, sizes);
            apply_rate = catch_up(sizes, &dir, node, &config, nats, &stream, rt);
        }
    }
    Summary {
        paced_p99,
        apply_rate,
        name,
        pushes_per_second: pps,
        push_p50: quantile(&load.latencies, 0.5),
        query_p50: quantile(&queries.per_node[0].1, 0.5),
        cpu: cpu_aggs + cpu_nats,
        pushes: load.pushes,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench");
    let parts: Vec<&str> = args
        .iter()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .map(String::as_str)
        .collect();
    let mut sizes = if full { FULL } else { SMOKE };
    if let Some(partitions) = std::env::var_os("HOURGLASS_BENCH_PARTITIONS") {
        sizes.partitions = partitions
            .to_str()
            .and_then(|p| p.parse().ok())
            .filter(|&p| p > 0)
            .unwrap_or_else(|| {
                panic!("HOURGLASS_BENCH_PARTITIONS={partitions:?}: not a partition count")
            });
    }
    if let Some(subjects) = std::env::var_os("HOURGLASS_BENCH_SUBJECTS") {
        sizes.subjects = Some(
            subjects
                .to_str()
                .and_then(|s| s.parse().ok())
                .filter(|&s| (1..=sizes.partitions).contains(&s))
                .unwrap_or_else(|| {
                    panic!(
                        "HOURGLASS_BENCH_SUBJECTS={subjects:?}: not between 1 and the partitions"
                    )
                }),
        );
    }
    let sizes = &sizes;
    let runs = |part: &str| {
        if parts.is_empty() {
            sizes.setups.contains(&part)
        } else {
            parts.contains(&part)
        }
    };
    let dir = std::env::temp_dir().join(format!("hourglass-cluster-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let sketches = sketches(sizes);
    println!(
        "cluster bench ({}): {} CPUs; every process on loopback on this machine",
        if full { "full" } else { "smoke" },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let mut summaries = Vec::new();
    if runs("single") {
        summaries.push(run_setup("single", sizes, &dir, None, 1, &sketches, &rt));
    }
    let mut engine = None;
    if runs("engine") || runs("cluster-1") || runs("cluster-3") {
        match nats_server_binary() {
            Some(binary) => {
                let nats_dir = dir.join("nats");
                std::fs::create_dir_all(&nats_dir).expect("nats dir");
                let nats = Nats::start(&binary, &nats_dir);
                if runs("engine") {
                    engine = Some(run_engine(sizes, &nats, &sketches, &rt));
                }
                for (name, n) in [("cluster-1", 1), ("cluster-3", 3)] {
                    if runs(name) {
                        summaries.push(run_setup(
                            name,
                            sizes,
                            &dir,
                            Some(&nats),
                            n,
                            &sketches,
                            &rt,
                        ));
                    }
                }
            }
            // The smoke run must not fail for want of a download; the full run must
            // measure what it was asked to.
            None if !full => {
                println!("no nats-server (scripts/nats-server failed): cluster setups skipped")
            }
            None => panic!("scripts/nats-server failed: no NATS server to run cluster mode on"),
        }
    }

    if let Some(base) = summaries.iter().find(|s| s.name == "single") {
        println!();
        println!("ratios to the single aggregator:");
        for s in summaries.iter().filter(|s| s.name != "single") {
            println!(
                "   {}: pushes/s x{:.2}, push p50 x{:.2}, query p50 x{:.2}, CPU-seconds per push x{:.2}",
                s.name,
                s.pushes_per_second / base.pushes_per_second,
                s.push_p50 / base.push_p50,
                s.query_p50 / base.query_p50,
                (s.cpu / s.pushes as f64) / (base.cpu / base.pushes as f64),
            );
        }
    }
    for s in summaries.iter().filter(|s| s.paced_p99.is_finite()) {
        println!(
            "   {}: push latency p99 at half its saturated rate {:.1} ms",
            s.name,
            s.paced_p99 * 1e3
        );
    }
    for s in summaries.iter().filter(|s| s.apply_rate.0.is_finite()) {
        println!(
            "   {}: applies at {:.0}% of a bare drain of its consumers ({:.0} against {:.0} messages/s)",
            s.name,
            100.0 * s.apply_rate.0 / s.apply_rate.1,
            s.apply_rate.0,
            s.apply_rate.1
        );
    }
    if let Some((shape, one)) = engine {
        println!();
        println!("ratios to the engine (JetStream alone, same bytes per push, same concurrency):");
        for s in summaries.iter().filter(|s| s.name != "single") {
            println!(
                "   {}: {:.0}% of the entry's shape ({shape:.1} pushes/s), {:.0}% of one message per push ({one:.1} pushes/s)",
                s.name,
                100.0 * s.pushes_per_second / shape,
                100.0 * s.pushes_per_second / one,
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
