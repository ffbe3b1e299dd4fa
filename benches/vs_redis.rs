//! hourglass beside Redis, in one run on one machine, on the same seeded workload: every
//! server-hour sees between `min_users` and `max_users` distinct users (uniform) drawn
//! from a pool of `pool` users, for `servers` servers over `hours` hours ending at the
//! start of this hour.
//!
//! - **Redis** (`redis-server` from Debian's packages, started here on loopback, no
//!   persistence): one HyperLogLog per server-hour (`PFADD hll:SERVER:HOUR`), pipelined;
//!   questions are `PFCOUNT` over the keys of the range.
//! - **hourglass**: one real agent process per server (`--default-kinds distinct`), fed
//!   the same items through its Ingest API (one `SeriesBatch` per server-hour), shipping
//!   to one real aggregator; the agents are stopped (a final flush), then questions are
//!   `Query/Distinct` over gRPC. This runs twice, on fresh agents and aggregators: with
//!   the items in `packed_items` (the form `hourglass send` writes), then in `items` (the
//!   natural field, what a user's own gRPC client sends).
//!
//! Printed, one table of ratios: events per server-side CPU-second (Redis's process;
//! the agents' and the aggregator's, from `/proc`), for each form of the items, stored bytes per server-hour (Redis's
//! `used_memory` growth; the aggregator's data directory while running and after a clean
//! stop), and per question its p50 and p99 latency over the repetitions and its error
//! against the exact answer, counted here.
//!
//! `cargo bench --bench vs_redis` runs the full sizes (100 servers × 168 hours, 500–5,000
//! users per server-hour from 2 million: about 46 million events; release binaries);
//! without `--bench` (as `cargo test --all-targets` runs it) it is a short smoke run of
//! the same code. `redis-server` must be on PATH (`apt-get install redis-server`;
//! `scripts/test` installs it).
//!
//! Options (after `--`): `--full` runs the full sizes in whatever build runs it (a debug
//! build's stored bytes are the release build's; its CPU and latency figures are not);
//! `--form hll|ull` and `--precision P` set the agents' `[defaults] distinct_form` and
//! `precision` (unset: the agent's defaults, UltraLogLog at 13).
//!
//! `HOURGLASS_BENCH_BIN=/path/to/hourglass` runs that build's agents and aggregator
//! instead of the one built with the bench: alternate a saved build and the new one to
//! compare them on a noisy machine (docs/BENCHMARKS.md).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hourglass_rpc::proto::v1::{self, ingest_client::IngestClient, query_client::QueryClient};

mod support;
use support::{Rng, Service, cpu_of, cpu_of_ended_children};

struct Sizes {
    servers: usize,
    hours: u32,
    min_users: u32,
    max_users: u32,
    pool: u32,
    repetitions: usize,
}

const FULL: Sizes = Sizes {
    servers: 100,
    hours: 168,
    min_users: 500,
    max_users: 5000,
    pool: 2_000_000,
    repetitions: 10,
};

const SMOKE: Sizes = Sizes {
    servers: 3,
    hours: 6,
    min_users: 50,
    max_users: 200,
    pool: 10_000,
    repetitions: 2,
};

/// The users of server `s` in hour `h` (index within the range): the same for every
/// call, and independent of the order of calls.
fn users_of(sizes: &Sizes, s: usize, h: u32) -> Vec<u32> {
    let mut rng = Rng((((s as u64) << 32) | u64::from(h)) ^ 0x5EED);
    let n = sizes.min_users + rng.below(sizes.max_users - sizes.min_users + 1);
    let mut users: Vec<u32> = (0..n).map(|_| rng.below(sizes.pool)).collect();
    users.sort_unstable();
    users.dedup();
    users
}

fn item(user: u32) -> Vec<u8> {
    format!("user-{user}").into_bytes()
}

fn server_name(s: usize) -> String {
    format!("web-{}", s + 1)
}

/// A question: a range of hours (indices) over some servers, with its exact answer.
struct Question {
    name: String,
    hours: std::ops::Range<u32>,
    servers: usize,
    truth: u64,
}

impl Question {
    fn new(sizes: &Sizes, name: &str, last_hours: u32, servers: usize) -> Question {
        let hours = sizes.hours.saturating_sub(last_hours)..sizes.hours;
        let mut seen = vec![0u64; (sizes.pool as usize).div_ceil(64)];
        for s in 0..servers {
            for h in hours.clone() {
                for u in users_of(sizes, s, h) {
                    seen[u as usize / 64] |= 1 << (u % 64);
                }
            }
        }
        Question {
            name: name.into(),
            hours,
            servers,
            truth: seen.iter().map(|w| u64::from(w.count_ones())).sum(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Redis, over RESP on a plain socket.

struct Redis {
    child: Child,
    conn: BufReader<TcpStream>,
}

impl Redis {
    fn start(dir: &Path) -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("a free port")
            .local_addr()
            .expect("its address")
            .port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("redis-server: {e} (apt-get install redis-server; scripts/test installs it)")
            });
        let started = Instant::now();
        let stream = loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => break s,
                Err(e) if started.elapsed() < Duration::from_secs(10) => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("redis-server did not listen on {port}: {e}"),
            }
        };
        Redis {
            child,
            conn: BufReader::new(stream),
        }
    }

    /// Sends `commands` in one write and reads their replies; returns the last one.
    fn pipeline(&mut self, commands: &[Vec<Vec<u8>>]) -> Reply {
        let mut out = Vec::new();
        for args in commands {
            write!(out, "*{}\r\n", args.len()).unwrap();
            for a in args {
                write!(out, "${}\r\n", a.len()).unwrap();
                out.extend_from_slice(a);
                out.extend_from_slice(b"\r\n");
            }
        }
        self.conn.get_mut().write_all(&out).expect("to redis");
        let mut last = Reply::Int(0);
        for _ in commands {
            last = self.reply();
        }
        last
    }

    fn reply(&mut self) -> Reply {
        let mut line = String::new();
        self.conn.read_line(&mut line).expect("from redis");
        let line = line.trim_end();
        let (kind, rest) = line.split_at(1);
        match kind {
            ":" => Reply::Int(rest.parse().expect("an integer reply")),
            "+" => Reply::Text(rest.to_string()),
            "$" => {
                let len: usize = rest.parse().expect("a bulk length");
                let mut buf = vec![0; len + 2];
                self.conn.read_exact(&mut buf).expect("a bulk reply");
                buf.truncate(len);
                Reply::Text(String::from_utf8_lossy(&buf).into_owned())
            }
            _ => panic!("redis answered {line}"),
        }
    }

    fn info_field(&mut self, section: &str, field: &str) -> u64 {
        let Reply::Text(text) = self.pipeline(&[vec![b"INFO".to_vec(), section.into()]]) else {
            panic!("INFO is text");
        };
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

enum Reply {
    Int(i64),
    Text(String),
}

fn key(s: usize, h: u32) -> Vec<u8> {
    format!("hll:{}:{h}", server_name(s)).into_bytes()
}

// ---------------------------------------------------------------------------------------
// Measuring.

fn dir_bytes(dir: &Path) -> u64 {
    dir_parts(dir).iter().map(|(_, b)| b).sum()
}

/// Bytes of the files under `dir` by what RocksDB keeps in them: WAL (`*.log`), SST
/// files, and the rest (MANIFEST, OPTIONS, info LOG, the agents' files).
fn dir_parts(dir: &Path) -> [(&'static str, u64); 3] {
    let mut parts = [("wal", 0), ("sst", 0), ("other", 0)];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return parts;
    };
    for e in entries.flatten() {
        match e.metadata() {
            Ok(m) if m.is_dir() => {
                for (i, (_, b)) in dir_parts(&e.path()).into_iter().enumerate() {
                    parts[i].1 += b;
                }
            }
            Ok(m) => {
                let name = e.file_name();
                let name = name.to_string_lossy();
                let i = if name.ends_with(".log") {
                    0
                } else if name.ends_with(".sst") {
                    1
                } else {
                    2
                };
                parts[i].1 += m.len();
            }
            Err(_) => {}
        }
    }
    parts
}

/// p50 and p99 (nearest rank) of `samples`, in milliseconds.
fn quantiles(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
        samples[rank - 1] * 1000.0
    };
    (at(0.5), at(0.99))
}

struct Side {
    events_per_cpu_second: f64,
    bytes_per_server_hour: f64,
    bytes_per_server_hour_running: f64,
    /// Per question: p50 ms, p99 ms, relative error.
    answers: Vec<(f64, f64, f64)>,
}

fn redis_side(sizes: &Sizes, dir: &Path, questions: &[Question], events: u64) -> Side {
    let mut redis = Redis::start(dir);
    let before = redis.info_field("memory", "used_memory");
    let cpu_before = cpu_of(redis.child.id());
    for s in 0..sizes.servers {
        let commands: Vec<Vec<Vec<u8>>> = (0..sizes.hours)
            .map(|h| {
                let mut args = vec![b"PFADD".to_vec(), key(s, h)];
                args.extend(users_of(sizes, s, h).into_iter().map(item));
                args
            })
            .collect();
        redis.pipeline(&commands);
    }
    let cpu = cpu_of(redis.child.id()) - cpu_before;
    let used = redis.info_field("memory", "used_memory") - before;
    let bytes = used as f64 / (sizes.servers as f64 * f64::from(sizes.hours));
    let answers = questions
        .iter()
        .map(|q| {
            let mut args = vec![b"PFCOUNT".to_vec()];
            for s in 0..q.servers {
                args.extend(q.hours.clone().map(|h| key(s, h)));
            }
            let mut latencies = Vec::new();
            let mut estimate = 0;
            for _ in 0..sizes.repetitions {
                let t = Instant::now();
                let Reply::Int(n) = redis.pipeline(std::slice::from_ref(&args)) else {
                    panic!("PFCOUNT answers an integer");
                };
                latencies.push(t.elapsed().as_secs_f64());
                estimate = n;
            }
            let (p50, p99) = quantiles(latencies);
            (
                p50,
                p99,
                (estimate as f64 - q.truth as f64) / q.truth as f64,
            )
        })
        .collect();
    Side {
        events_per_cpu_second: events as f64 / cpu,
        bytes_per_server_hour: bytes,
        bytes_per_server_hour_running: bytes,
        answers,
    }
}

/// How a `SeriesBatch` carries its items.
#[derive(Clone, Copy, Debug)]
enum Form {
    /// In `packed_items`, one bytes field (what `hourglass send` writes).
    Packed,
    /// In `items`, one bytes value each (what a plain gRPC client writes).
    Items,
}

/// One server-hour's batch of `users`, at `times`, its items in `form`.
fn batch(users: &[u32], times: Vec<i64>, form: Form) -> v1::SeriesBatch {
    let mut batch = v1::SeriesBatch {
        metric: "visitors".into(),
        times_unix_seconds: times,
        ..Default::default()
    };
    match form {
        Form::Packed => {
            let mut field = Vec::new();
            for &u in users {
                hourglass_rpc::packed::push(&mut field, &item(u));
            }
            batch.packed_items = field.into();
        }
        Form::Items => batch.items = users.iter().map(|&u| item(u)).collect(),
    }
    batch
}

fn hourglass_side(
    sizes: &Sizes,
    dir: &Path,
    questions: &[Question],
    start_hour: u32,
    events: u64,
    distinct: &str,
    form: Form,
) -> Side {
    let agg = support::aggregator(dir);
    let url = format!("http://{}", agg.addrs[0]);
    let lateness = format!("{}h", sizes.hours + 2);
    let config = dir.join("agent.toml");
    std::fs::write(&config, format!("[defaults]\n{distinct}")).expect("the agents' config");
    let agents: Vec<Service> = (0..sizes.servers)
        .map(|s| {
            let data = dir.join(server_name(s));
            Service::start(
                "hourglass-agent",
                &[
                    "--server-name",
                    &server_name(s),
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
                    &lateness,
                    "--default-kinds",
                    "distinct",
                    "--config",
                    config.to_str().expect("utf-8"),
                ],
                &["ingest", "admin"],
                &dir.join(format!("{}.log", server_name(s))),
            )
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    // Server-side CPU from the first event on, as for Redis: the agents' start-up (a
    // runtime, a checkpoint directory, a connection) is not ingest work.
    let agg_cpu_before = cpu_of(agg.child.id());
    let ended_before = cpu_of_ended_children();
    let agents_started: f64 = agents.iter().map(|a| cpu_of(a.child.id())).sum();
    rt.block_on(async {
        for (s, agent) in agents.iter().enumerate() {
            let mut client = IngestClient::connect(format!("http://{}", agent.addrs[0]))
                .await
                .expect("an agent's Ingest API");
            for h in 0..sizes.hours {
                let hour_start = i64::from(start_hour + h) * 3600;
                let users = users_of(sizes, s, h);
                let times = (0..users.len() as i64)
                    .map(|i| hour_start + i % 3600)
                    .collect();
                let r = client
                    .send(v1::IngestRequest {
                        events: vec![],
                        batches: vec![batch(&users, times, form)],
                    })
                    .await
                    .expect("ingest")
                    .into_inner();
                assert_eq!(
                    r.rejected, 0,
                    "the agent rejected events: {:?}",
                    r.rejected_events
                );
            }
        }
    });
    let peaks: Vec<u64> = agents.iter().map(Service::peak_rss).collect();
    eprintln!(
        "vs_redis: the agents' peak RSS, MiB: mean {:.1}, largest {:.1}",
        peaks.iter().sum::<u64>() as f64 / peaks.len() as f64 / 1048576.0,
        *peaks.iter().max().expect("agents") as f64 / 1048576.0
    );
    // Each agent ships what it holds in a final flush as it stops.
    for agent in agents {
        agent.terminate();
    }
    let agents_cpu = cpu_of_ended_children() - ended_before - agents_started;
    let agg_cpu = cpu_of(agg.child.id()) - agg_cpu_before;
    eprintln!(
        "vs_redis: server-side CPU seconds ({form:?} form): agents {agents_cpu:.2} ({:.0} ns an event), aggregator {agg_cpu:.2} ({:.0} ns an event)",
        agents_cpu * 1e9 / events as f64,
        agg_cpu * 1e9 / events as f64
    );
    let server_hours = sizes.servers as f64 * f64::from(sizes.hours);
    let running = dir_bytes(&dir.join("agg")) as f64 / server_hours;
    eprintln!(
        "vs_redis: the aggregator's data dir while running, bytes: {:?}",
        dir_parts(&dir.join("agg"))
    );
    let answers = rt.block_on(async {
        let mut client = QueryClient::connect(url.clone())
            .await
            .expect("the Query API");
        let mut answers = Vec::new();
        for q in questions {
            let selector = v1::Selector {
                metric: "visitors".into(),
                range: Some(v1::TimeRange {
                    start_hour: start_hour + q.hours.start,
                    end_hour: start_hour + q.hours.end,
                }),
                servers: if q.servers == sizes.servers {
                    vec![]
                } else {
                    (0..q.servers).map(server_name).collect()
                },
                ..Default::default()
            };
            let mut latencies = Vec::new();
            let mut estimate = 0.0;
            for _ in 0..sizes.repetitions {
                let t = Instant::now();
                let r = client
                    .distinct(v1::DistinctRequest {
                        selector: Some(selector.clone()),
                    })
                    .await
                    .expect("a distinct answer")
                    .into_inner();
                latencies.push(t.elapsed().as_secs_f64());
                estimate = r.answer.expect("an answer").estimate;
            }
            let (p50, p99) = quantiles(latencies);
            answers.push((p50, p99, (estimate - q.truth as f64) / q.truth as f64));
        }
        answers
    });
    agg.terminate();
    eprintln!(
        "vs_redis: the aggregator's data dir after a clean stop, bytes: {:?}",
        dir_parts(&dir.join("agg"))
    );
    Side {
        events_per_cpu_second: events as f64 / (agents_cpu + agg_cpu),
        bytes_per_server_hour: dir_bytes(&dir.join("agg")) as f64 / server_hours,
        bytes_per_server_hour_running: running,
        answers,
    }
}

/// The value after `flag` among the arguments, if given.
fn option(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == flag)?;
    Some(
        args.get(at + 1)
            .unwrap_or_else(|| panic!("{flag} needs a value"))
            .clone(),
    )
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench" || a == "--full");
    let sizes = if full { &FULL } else { &SMOKE };
    // The agents' [defaults]: what the table's hourglass column keeps.
    let mut distinct = String::new();
    if let Some(form) = option("--form") {
        distinct += &format!("distinct_form = \"{form}\"\n");
    }
    if let Some(p) = option("--precision") {
        distinct += &format!("precision = {p}\n");
    }
    let dir = std::env::temp_dir().join(format!("hourglass-vs-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let now_hour = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
        / 3600) as u32;
    let start_hour = now_hour - sizes.hours;
    let events: u64 = (0..sizes.servers)
        .flat_map(|s| (0..sizes.hours).map(move |h| (s, h)))
        .map(|(s, h)| users_of(sizes, s, h).len() as u64)
        .sum();
    let ten = sizes.servers.min(10);
    let questions = [
        Question::new(
            sizes,
            &format!("last {} h × {} servers", sizes.hours, sizes.servers),
            sizes.hours,
            sizes.servers,
        ),
        Question::new(
            sizes,
            &format!("last 24 h × {} servers", sizes.servers),
            24,
            sizes.servers,
        ),
        Question::new(
            sizes,
            &format!("last {} h × {ten} servers", sizes.hours),
            sizes.hours,
            ten,
        ),
    ];
    eprintln!(
        "vs_redis: {} servers × {} h, {}–{} users per server-hour from {}: {events} events; agents' [defaults]: {}",
        sizes.servers,
        sizes.hours,
        sizes.min_users,
        sizes.max_users,
        sizes.pool,
        if distinct.is_empty() {
            "none (the agent's defaults)".to_string()
        } else {
            distinct.trim().replace('\n', "; ")
        }
    );
    let redis_dir = dir.join("redis");
    std::fs::create_dir_all(&redis_dir).expect("redis dir");
    let redis = redis_side(sizes, &redis_dir, &questions, events);
    let ours = hourglass_side(
        sizes,
        &dir.join("hourglass"),
        &questions,
        start_hour,
        events,
        &distinct,
        Form::Packed,
    );
    let plain = hourglass_side(
        sizes,
        &dir.join("hourglass-items"),
        &questions,
        start_hour,
        events,
        &distinct,
        Form::Items,
    );
    // The same sketches whatever the form: the same estimates.
    for (i, q) in questions.iter().enumerate() {
        assert_eq!(
            ours.answers[i].2, plain.answers[i].2,
            "{}: the two forms of the items gave different estimates",
            q.name
        );
    }

    print_table(&redis, &ours, &plain, &questions);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The record's table: Redis beside hourglass with the items packed (`ours`) and plain
/// (`plain`).
fn print_table(redis: &Side, ours: &Side, plain: &Side, questions: &[Question]) {
    println!("| | Redis | hourglass | hourglass ÷ Redis |");
    println!("|---|---:|---:|---:|");
    println!(
        "| events per server-side CPU-second, `packed_items` | {:.0} | {:.0} | {:.2}× |",
        redis.events_per_cpu_second,
        ours.events_per_cpu_second,
        ours.events_per_cpu_second / redis.events_per_cpu_second
    );
    println!(
        "| events per server-side CPU-second, `items` | {:.0} | {:.0} | {:.2}× |",
        redis.events_per_cpu_second,
        plain.events_per_cpu_second,
        plain.events_per_cpu_second / redis.events_per_cpu_second
    );
    println!(
        "| stored bytes per server-hour, after a clean stop | {:.0} | {:.0} | {:.2}× |",
        redis.bytes_per_server_hour,
        ours.bytes_per_server_hour,
        ours.bytes_per_server_hour / redis.bytes_per_server_hour
    );
    println!(
        "| stored bytes per server-hour, running | {:.0} | {:.0} | {:.2}× |",
        redis.bytes_per_server_hour_running,
        ours.bytes_per_server_hour_running,
        ours.bytes_per_server_hour_running / redis.bytes_per_server_hour_running
    );
    for (i, q) in questions.iter().enumerate() {
        let (r, o) = (redis.answers[i], ours.answers[i]);
        println!(
            "| {}: p50 / p99 ms (error) | {:.2} / {:.2} ({:+.2}%) | {:.2} / {:.2} ({:+.2}%) | {:.2}× faster at p50 |",
            q.name,
            r.0,
            r.1,
            r.2 * 100.0,
            o.0,
            o.1,
            o.2 * 100.0,
            r.0 / o.0
        );
    }
}
