//! The agent's throughput and memory, measured on the real process (issue figures in
//! docs/BENCHMARKS.md):
//!
//! 1. gRPC `Ingest`: batches of 10,000 events into distinct + frequency sketches. The agent
//!    is pinned to CPU 0 and the client to CPU 1; the rate is events per second of wall
//!    time and per second of the agent's own CPU time (from /proc), so a slow client
//!    cannot flatter or hide the agent's cost.
//! 2. DogStatsD over UDP: multi-line datagrams of up to 1,400 bytes sent at a paced rate,
//!    and then as fast as one sender can; drops are lines sent minus lines the agent
//!    counted.
//! 3. Memory: 1,000 active series made dense, then a few flushes and checkpoints; peak and
//!    current RSS against the sum of the sketch sizes the agent reports.
//!
//! `cargo bench -p hourglass-agent --bench agent` runs the full sizes (release build);
//! without `--bench` (as `cargo test --all-targets` runs it) it is a quick smoke run with
//! the same code and no figures worth keeping.

use std::io::BufRead;
use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hourglass_rpc::proto::v1::{self, ingest_client::IngestClient};

struct Sizes {
    grpc_events: usize,
    grpc_series: usize,
    udp_seconds: f64,
    udp_rate: f64,
    memory_series: usize,
    memory_items: usize,
}

const FULL: Sizes = Sizes {
    grpc_events: 20_000_000,
    grpc_series: 100,
    udp_seconds: 5.0,
    udp_rate: 1_000_000.0,
    memory_series: 1000,
    memory_items: 3000,
};

const SMOKE: Sizes = Sizes {
    grpc_events: 40_000,
    grpc_series: 10,
    udp_seconds: 0.2,
    udp_rate: 20_000.0,
    memory_series: 20,
    memory_items: 100,
};

/// Pins the calling thread (and what it spawns afterwards) to one CPU, if it exists.
fn pin(cpu: usize) {
    use rustix::thread::{CpuSet, sched_setaffinity};
    if cpu < CpuSet::MAX_CPU {
        let mut set = CpuSet::new();
        set.set(cpu);
        // A CPU that does not exist is refused; the thread then runs where it may.
        let _ = sched_setaffinity(None, &set);
    }
}

struct Agent {
    child: Child,
    ingest: String,
    statsd: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Agent {
    #[allow(unsafe_code)] // a system call std lacks; see the SAFETY comment
    fn start(extra: &[&str]) -> Agent {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut command = Command::new(env!("CARGO_BIN_EXE_hourglass-agent"));
        command
            .args([
                "--server-name",
                "bench",
                // Nothing listens there: shipping fails and backs off, ingest is measured.
                "--aggregator",
                "http://127.0.0.1:9",
                "--statsd-listen",
                "127.0.0.1:0",
                "--ingest-listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(dir.path())
            .args(extra)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: sched_setaffinity is async-signal-safe; nothing else runs in pre_exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                pin(0);
                Ok(())
            });
        }
        let mut child = command.spawn().expect("start hourglass-agent");
        let stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
        let (mut ingest, mut statsd, mut admin) = (None, None, None);
        for line in stderr.lines().map_while(Result::ok) {
            if let Some(a) = line.strip_prefix("ingest listening on ") {
                ingest = Some(format!("http://{a}"));
            } else if let Some(a) = line.strip_prefix("statsd listening on ") {
                statsd = Some(a.parse().expect("addr"));
            } else if let Some(a) = line.strip_prefix("admin listening on ") {
                admin = Some(a.parse().expect("addr"));
            }
            if ingest.is_some() && statsd.is_some() && admin.is_some() {
                break;
            }
        }
        Agent {
            child,
            ingest: ingest.expect("agent announced ingest"),
            statsd: statsd.expect("agent announced statsd"),
            admin: admin.expect("agent announced admin"),
            _dir: dir,
        }
    }

    /// The agent's user + system CPU seconds so far.
    #[allow(unsafe_code)] // a system call std lacks; see the SAFETY comment
    fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).expect("stat");
        // Fields after the command name (which is in parentheses): utime is the 12th and
        // stime the 13th of them.
        let rest = &stat[stat.rfind(')').expect("comm") + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 =
            fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
        ticks / rustix::param::clock_ticks_per_second() as f64
    }

    /// (current, peak) resident memory in bytes.
    fn rss(&self) -> (u64, u64) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        let kib = |key: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (kib("VmRSS:") * 1024, kib("VmHWM:") * 1024)
    }

    fn metric(&self, name: &str) -> f64 {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.admin).expect("admin");
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .expect("request");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("response");
        let full = format!("hourglass_agent_{name} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&full))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits until the metric stops changing (the agent has taken what was sent).
    fn settled(&self, name: &str) -> f64 {
        let mut last = self.metric(name);
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = self.metric(name);
            if now == last {
                return now;
            }
            last = now;
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A deterministic stream of user ids: a 64-bit LCG, so runs are comparable.
struct Users(u64);
impl Users {
    fn next(&mut self, universe: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % universe
    }
}

/// The same events as one request per 10,000 `Event`s, or grouped by series into
/// `SeriesBatch`es (what a client library does before sending).
fn grpc(sizes: &Sizes, runtime: &tokio::runtime::Runtime, grouped: bool) {
    let agent = Agent::start(&[]);
    let batch = 10_000usize;
    let mut users = Users(42);
    let requests: Vec<v1::IngestRequest> = (0..sizes.grpc_events.div_ceil(batch).min(200))
        .map(|_| v1::IngestRequest {
            events: (0..batch)
                .map(|_| {
                    let series = users.next(sizes.grpc_series as u64);
                    v1::Event {
                        metric: "visitors".into(),
                        item: format!("user{}", users.next(1_000_000)).into_bytes().into(),
                        tags: vec![
                            v1::Tag {
                                key: "country".into(),
                                value: format!("c{series}"),
                            },
                            v1::Tag {
                                key: "device".into(),
                                value: "mobile".into(),
                            },
                        ],
                        time_unix_seconds: 0,
                        weight: 0,
                    }
                })
                .collect(),
            batches: Vec::new(),
        })
        .map(|r| if grouped { group(r) } else { r })
        .collect();
    let form = if grouped { "series_batches" } else { "events" };
    let rounds = sizes.grpc_events / batch;
    let (sent, wall, cpu) = runtime.block_on(async {
        let channel = tonic::transport::Channel::from_shared(agent.ingest.clone())
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let client = IngestClient::new(channel).max_encoding_message_size(64 << 20);
        // Warm-up: every series exists and its sketches are allocated.
        client
            .clone()
            .send(requests[0].clone())
            .await
            .expect("warm-up");
        let cpu0 = agent.cpu_seconds();
        let t0 = Instant::now();
        let mut sent = 0u64;
        // Four calls in flight, so the agent never waits on the client's round trip.
        let mut inflight = tokio::task::JoinSet::new();
        for i in 0..rounds {
            if inflight.len() >= 4 {
                sent += inflight.join_next().await.expect("task").expect("join");
            }
            let mut c = client.clone();
            let request = requests[i % requests.len()].clone();
            inflight
                .spawn(async move { c.send(request).await.expect("ingest").into_inner().accepted });
        }
        while let Some(done) = inflight.join_next().await {
            sent += done.expect("join");
        }
        (sent, t0.elapsed().as_secs_f64(), agent.cpu_seconds() - cpu0)
    });
    let counted = agent.settled(r#"events_total{source="ingest"}"#) as u64;
    println!(
        "grpc_ingest_{form}: {sent} events in {wall:.2} s = {:.0} events/s wall; agent CPU {cpu:.2} s = {:.0} events per CPU-second; counted {counted} (incl. {batch} warm-up)",
        sent as f64 / wall,
        sent as f64 / cpu.max(1e-9),
    );
    assert_eq!(
        counted,
        sent + batch as u64,
        "every acknowledged event is counted"
    );
}

/// The request's events regrouped into one `SeriesBatch` per series.
fn group(request: v1::IngestRequest) -> v1::IngestRequest {
    let mut batches: Vec<v1::SeriesBatch> = Vec::new();
    for e in request.events {
        match batches
            .iter_mut()
            .find(|b| b.metric == e.metric && b.tags == e.tags)
        {
            Some(b) => b.items.push(&e.item),
            None => batches.push(v1::SeriesBatch {
                metric: e.metric,
                tags: e.tags,
                items: std::iter::once(e.item).collect(),
                ..Default::default()
            }),
        }
    }
    v1::IngestRequest {
        events: Vec::new(),
        batches,
    }
}

/// Datagrams of whole lines, up to 1,400 bytes each; returns them with their line counts.
fn datagrams(count: usize, series: u64, users: &mut Users) -> Vec<(Vec<u8>, usize)> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let mut d = Vec::with_capacity(1400);
        let mut lines = 0;
        loop {
            let line = format!(
                "visitors:user{}|s|#country:c{},device:mobile\n",
                users.next(1_000_000),
                users.next(series)
            );
            if d.len() + line.len() > 1400 {
                break;
            }
            d.extend_from_slice(line.as_bytes());
            lines += 1;
        }
        out.push((d, lines));
    }
    out
}

fn udp(sizes: &Sizes) {
    let agent = Agent::start(&[]);
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket.connect(agent.statsd).expect("connect");
    let grams = datagrams(4096, 100, &mut Users(7));
    // Warm-up: every series exists.
    for (d, _) in &grams[..64] {
        socket.send(d).expect("send");
    }
    let warm: usize = grams[..64].iter().map(|(_, n)| n).sum();
    while (agent.metric(r#"events_total{source="statsd"}"#) as usize) < warm {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (label, rate) in [("paced", Some(sizes.udp_rate)), ("unpaced", None)] {
        let before = agent.metric(r#"events_total{source="statsd"}"#) as u64;
        let cpu0 = agent.cpu_seconds();
        let t0 = Instant::now();
        let mut lines = 0u64;
        let mut i = 0;
        while t0.elapsed().as_secs_f64() < sizes.udp_seconds {
            if let Some(rate) = rate {
                // Send only what the schedule allows by now.
                if lines as f64 > rate * t0.elapsed().as_secs_f64() {
                    std::hint::spin_loop();
                    continue;
                }
            }
            let (d, n) = &grams[i % grams.len()];
            socket.send(d).expect("send");
            lines += *n as u64;
            i += 1;
        }
        let wall = t0.elapsed().as_secs_f64();
        let received = agent.settled(r#"events_total{source="statsd"}"#) as u64 - before;
        let cpu = agent.cpu_seconds() - cpu0;
        println!(
            "udp_{label}: sent {lines} lines in {i} datagrams over {wall:.2} s = {:.0} lines/s; agent counted {received} ({} dropped, {:.3}%); agent CPU {cpu:.2} s",
            lines as f64 / wall,
            lines - received.min(lines),
            100.0 * (lines - received.min(lines)) as f64 / lines as f64,
        );
    }
}

fn memory(sizes: &Sizes, runtime: &tokio::runtime::Runtime) {
    let agent = Agent::start(&["--flush-interval", "1s"]);
    let (baseline, _) = agent.rss();
    runtime.block_on(async {
        let channel = tonic::transport::Channel::from_shared(agent.ingest.clone())
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let mut client = IngestClient::new(channel).max_encoding_message_size(64 << 20);
        let mut users = Users(99);
        // Series by series, so each gets `memory_items` distinct items (dense at p=14).
        for chunk in (0..sizes.memory_series).collect::<Vec<_>>().chunks(10) {
            let batches = chunk
                .iter()
                .map(|&s| v1::SeriesBatch {
                    metric: "visitors".into(),
                    tags: vec![v1::Tag {
                        key: "page".into(),
                        value: format!("p{s}"),
                    }],
                    items: (0..sizes.memory_items)
                        .map(|_| format!("user{}", users.next(u64::MAX >> 1)))
                        .collect(),
                    times_unix_seconds: Vec::new(),
                    weights: Vec::new(),
                    ..Default::default()
                })
                .collect();
            client
                .send(v1::IngestRequest {
                    events: Vec::new(),
                    batches,
                })
                .await
                .expect("ingest");
        }
    });
    // Let several flushes and checkpoints run over the full table.
    std::thread::sleep(Duration::from_secs(4));
    let sketch = agent.metric("sketch_bytes");
    let series = agent.metric("active_series");
    let checkpoint = agent.metric("checkpoint_bytes");
    let (rss, peak) = agent.rss();
    let bound = 1.5 * sketch + 50.0 * 1048576.0;
    let mib = |b: f64| b / 1048576.0;
    println!(
        "memory: {series} series, sketches {:.1} MiB, checkpoint {:.1} MiB; RSS {:.1} MiB (peak {:.1} MiB, {:.1} MiB before any event); bound 1.5 x sketches + 50 MiB = {:.1} MiB; peak / bound = {:.2}",
        mib(sketch),
        mib(checkpoint),
        mib(rss as f64),
        mib(peak as f64),
        mib(baseline as f64),
        mib(bound),
        peak as f64 / bound,
    );
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let sizes = if full { &FULL } else { &SMOKE };
    // The client side runs on CPU 1, away from the agent's CPU 0.
    pin(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    grpc(sizes, &runtime, false);
    grpc(sizes, &runtime, true);
    udp(sizes);
    memory(sizes, &runtime);
}
