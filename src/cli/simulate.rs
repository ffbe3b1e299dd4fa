//! `hourglass simulate`: deterministic synthetic traffic through real agents' Ingest APIs,
//! with the exact answers beside it.
//!
//! The model: a fleet of web servers in regions (`eu`, `us`, `ap`, by server index).
//! Every server-hour of the simulated days sees `--events-per-hour` visits; a visit is a
//! user (Zipf over `--users`, 70% from the server's own region's third of the users, 30%
//! from everyone, so users overlap across servers, regions and days) looking at a page
//! (Zipf over `--pages`). Each visit adds the user to `visitors` and the page to `pages`,
//! at a time inside its hour. The same seed gives the same events, in any run.
//!
//! The exact answers — distinct visitors per day, per region and per server, for each day
//! and the whole range; page counts and the top 10; users that were and were not seen —
//! are accumulated as the events are sent and written as JSON with `--truth FILE`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use hourglass_rpc::proto::v1::{self, ingest_client::IngestClient};
use serde_json::{Value, json};

use super::numbers::grouped;

/// The regions servers are spread over, by index.
pub(crate) const REGIONS: [&str; 3] = ["eu", "us", "ap"];
/// The metric of users.
pub(crate) const VISITORS: &str = "visitors";
/// The metric of pages.
pub(crate) const PAGES: &str = "pages";

#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// Running agents' Ingest addresses (`host:port` or URLs), comma-separated; server
    /// i of the model is the i-th.
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "spawn",
        conflicts_with = "spawn"
    )]
    agents: Vec<String>,
    /// Start this many agents instead (`hourglass agent`, this binary), named
    /// web-1…web-N with labels region and role=web, shipping to --aggregator; they are
    /// stopped (SIGTERM: a final flush) when the traffic is sent.
    #[arg(long)]
    spawn: Option<usize>,
    /// The aggregator spawned agents ship to.
    #[arg(long, env = "HOURGLASS_AGGREGATOR", default_value = super::grpc::DEFAULT_AGGREGATOR)]
    aggregator: String,
    /// Whole UTC days of traffic, ending at the start of today (or starting at --start).
    #[arg(long, default_value_t = 7)]
    days: u32,
    /// First hour of the traffic (RFC 3339, a date, or relative like -36h; rounded down to
    /// the hour) [default: --days days before the start of today].
    #[arg(long, allow_hyphen_values = true)]
    start: Option<String>,
    /// Hours of traffic, instead of --days: for sending a range in parts.
    #[arg(long)]
    hours: Option<u32>,
    /// Visits per server and hour.
    #[arg(long, default_value_t = 1000)]
    events_per_hour: u32,
    /// Seed of the traffic: the same seed gives the same events.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Distinct users in the model.
    #[arg(long, default_value_t = 200_000)]
    users: u32,
    /// Distinct pages in the model.
    #[arg(long, default_value_t = 1000)]
    pages: u32,
    /// Write the exact answers to this JSON file.
    #[arg(long)]
    truth: Option<PathBuf>,
    /// Data dirs of spawned agents go under this directory [default: a temporary one].
    #[arg(long)]
    spawn_dir: Option<PathBuf>,
}

/// What traffic to make.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// First hour of the traffic.
    pub(crate) start_hour: u32,
    /// Hours of traffic.
    pub(crate) hour_count: u32,
    /// Visits per server-hour.
    pub(crate) events_per_hour: u32,
    /// Seed.
    pub(crate) seed: u64,
    /// Users in the model.
    pub(crate) users: u32,
    /// Pages in the model.
    pub(crate) pages: u32,
    /// Servers, by index.
    pub(crate) servers: usize,
}

impl Plan {
    /// The hours of the traffic.
    pub fn hours(&self) -> std::ops::Range<u32> {
        self.start_hour..self.start_hour + self.hour_count
    }
}

/// SplitMix64: small, fast, and the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf(s = 1) over `0..n` by inverse CDF.
struct Zipf(Vec<f64>);

impl Zipf {
    fn new(n: u32) -> Zipf {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut total = 0.0;
        for k in 0..n {
            total += 1.0 / f64::from(k + 1);
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        Zipf(cdf)
    }
    fn sample(&self, rng: &mut Rng) -> u32 {
        let u = rng.unit();
        (self.0.partition_point(|&c| c < u) as u32).min(self.0.len() as u32 - 1)
    }
}

/// The traffic of the plan: the [`Visit`]s of every server-hour, made from its seed.
pub(crate) struct Traffic {
    plan: Plan,
    region_users: Zipf,
    all_users: Zipf,
    pages: Zipf,
}

impl Traffic {
    /// The model of `plan`.
    pub fn new(plan: Plan) -> Traffic {
        let third = (plan.users / REGIONS.len() as u32).max(1);
        Traffic {
            region_users: Zipf::new(third),
            all_users: Zipf::new(plan.users.max(1)),
            pages: Zipf::new(plan.pages.max(1)),
            plan,
        }
    }

    /// The visits of `server` in `hour`, the same for the same seed.
    pub fn visits(&self, server: usize, hour: u32) -> Vec<Visit> {
        let mut rng = Rng(self.plan.seed
            ^ (u64::from(hour) << 20)
            ^ (server as u64).wrapping_mul(0x9E37_79B9));
        let region = (server % REGIONS.len()) as u32;
        let third = (self.plan.users / REGIONS.len() as u32).max(1);
        (0..self.plan.events_per_hour)
            .map(|_| {
                let user = if rng.unit() < 0.7 {
                    // A region's own users, most popular first; shuffled across the third
                    // so regions do not share their heaviest users by rank.
                    region * third + self.region_users.sample(&mut rng)
                } else {
                    // Anyone: the global head is spread over all regions.
                    (self.all_users.sample(&mut rng).wrapping_mul(2_654_435_761))
                        % self.plan.users.max(1)
                };
                let page = self.pages.sample(&mut rng);
                let second = (rng.next() % 3600) as u32;
                Visit { user, page, second }
            })
            .collect()
    }
}

/// One visit: who viewed which page, when in the hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Visit {
    /// The user's number ([`user_name`]).
    pub(crate) user: u32,
    /// The page's number ([`page_name`]).
    pub(crate) page: u32,
    /// The second of the hour.
    pub(crate) second: u32,
}

/// The name of user `u` as sent.
pub fn user_name(u: u32) -> String {
    format!("user{u}")
}

/// The path of page `p` as sent.
pub fn page_name(p: u32) -> String {
    format!("/page/{p}")
}

/// The exact answers, accumulated as visits are sent.
#[derive(Default)]
pub(crate) struct Truth {
    days: BTreeMap<u32, HashSet<u32>>,
    day_regions: BTreeMap<(u32, &'static str), HashSet<u32>>,
    regions: BTreeMap<&'static str, HashSet<u32>>,
    servers: BTreeMap<String, HashSet<u32>>,
    all: HashSet<u32>,
    pages: HashMap<u32, u64>,
    events: u64,
}

impl Truth {
    fn add(&mut self, server: &str, region: &'static str, hour: u32, visits: &[Visit]) {
        let day = hourglass_rpc::time::day_of(hour);
        let d = self.days.entry(day).or_default();
        let dr = self.day_regions.entry((day, region)).or_default();
        let r = self.regions.entry(region).or_default();
        let s = self.servers.entry(server.to_string()).or_default();
        for &Visit { user, page, .. } in visits {
            d.insert(user);
            dr.insert(user);
            r.insert(user);
            s.insert(user);
            self.all.insert(user);
            *self.pages.entry(page).or_default() += 1;
        }
        self.events += visits.len() as u64;
    }

    /// The JSON form written by `--truth`.
    pub fn to_json(&self, plan: &Plan) -> Value {
        let mut days = Vec::new();
        for (day, users) in &self.days {
            let regions: BTreeMap<&str, usize> = self
                .day_regions
                .iter()
                .filter(|((d, _), _)| d == day)
                .map(|((_, r), u)| (*r, u.len()))
                .collect();
            days.push(json!({
                "day": hourglass_rpc::time::format_day(*day),
                "start_hour": day * 24,
                "distinct": users.len(),
                "regions": regions,
            }));
        }
        let mut top: Vec<(u32, u64)> = self.pages.iter().map(|(p, c)| (*p, *c)).collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        // Probes for membership: the heaviest user of each region (seen) and users the
        // model never makes (not seen).
        let third = (plan.users / REGIONS.len() as u32).max(1);
        let mut probes = Vec::new();
        for (i, _) in REGIONS.iter().enumerate() {
            let u = i as u32 * third;
            probes.push(json!({"item": user_name(u), "seen": self.all.contains(&u)}));
        }
        for i in 0..3 {
            probes.push(json!({"item": format!("nobody{i}"), "seen": false}));
        }
        json!({
            "metric_visitors": VISITORS,
            "metric_pages": PAGES,
            "start_hour": plan.start_hour,
            "end_hour": plan.hours().end,
            "events": self.events,
            "days": days,
            "total": {
                "distinct": self.all.len(),
                "regions": self.regions.iter().map(|(r, u)| (r.to_string(), u.len())).collect::<BTreeMap<_, _>>(),
                "servers": self.servers.iter().map(|(s, u)| (s.clone(), u.len())).collect::<BTreeMap<_, _>>(),
            },
            "pages": {
                "total": self.events,
                "top": top.iter().take(10).map(|(p, c)| json!({"item": page_name(*p), "count": c})).collect::<Vec<_>>(),
            },
            "membership": probes,
            // What made the traffic: enough to make it again (`Traffic::new`), as the
            // demo does to know where each user was seen.
            "plan": {
                "events_per_hour": plan.events_per_hour,
                "seed": plan.seed,
                "users": plan.users,
                "pages": plan.pages,
                "servers": plan.servers,
            },
        })
    }
}

/// Agents started by the simulator (or the demo), stopped with SIGTERM when dropped.
pub(crate) struct Fleet {
    agents: Vec<(String, Child)>,
    /// Their Ingest URLs, by server index.
    pub(crate) ingest: Vec<String>,
    /// Their admin addresses, by server index.
    pub(crate) admin: Vec<String>,
    _temp: Option<TempDir>,
}

/// A directory removed when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts `hourglass SERVER ARGS` (this program running the `agent` or the `aggregator`
/// built into it), waits for `NAME listening on ADDR` lines for each of `names` on its
/// stderr, and returns the child with the addresses. Its logs go to `log`.
pub fn start_service(
    server: &str,
    args: &[String],
    names: &[&str],
    log: &Path,
) -> anyhow::Result<(Child, Vec<String>)> {
    use std::io::BufRead;
    let log_file =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let me = std::env::current_exe().context("finding this program's path")?;
    let mut child = Command::new(&me)
        .arg(server)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} {server}", me.display()))?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = std::io::BufReader::new(stderr).lines();
    let mut found: Vec<Option<String>> = vec![None; names.len()];
    let mut seen = String::new();
    while found.iter().any(Option::is_none) {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the {server} stopped before announcing its ports:\n{seen}(logs in {})",
                log.display()
            );
        };
        seen.push_str(&line);
        seen.push('\n');
        if let Some((name, addr)) = line.split_once(" listening on ")
            && let Some(i) = names.iter().position(|n| *n == name)
        {
            found[i] = Some(addr.trim().to_string());
        }
    }
    // Keep draining stderr so the process never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok((
        child,
        found.into_iter().map(|a| a.expect("all found")).collect(),
    ))
}

impl Fleet {
    /// Starts `n` agents shipping to `aggregator`, with data dirs under `dir` (a temporary
    /// directory if `None`) and the given extra flags.
    pub fn spawn(
        n: usize,
        aggregator: &str,
        dir: Option<&Path>,
        extra: &[&str],
    ) -> anyhow::Result<Fleet> {
        let (root, temp) = match dir {
            Some(d) => (d.to_path_buf(), None),
            None => {
                let d =
                    std::env::temp_dir().join(format!("hourglass-fleet-{}", std::process::id()));
                (d.clone(), Some(TempDir(d)))
            }
        };
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let mut fleet = Fleet {
            agents: Vec::new(),
            ingest: Vec::new(),
            admin: Vec::new(),
            _temp: temp,
        };
        for i in 0..n {
            let name = format!("web-{}", i + 1);
            let data = root.join(&name);
            let mut args: Vec<String> = [
                "--server-name",
                &name,
                "--label",
                &format!("region={}", REGIONS[i % REGIONS.len()]),
                "--label",
                "role=web",
                "--aggregator",
                aggregator,
                "--statsd-listen",
                "off",
                "--ingest-listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--data-dir",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.push(data.to_string_lossy().into_owned());
            args.extend(extra.iter().map(|s| s.to_string()));
            let log = root.join(format!("{name}.log"));
            let (child, addrs) = start_service("agent", &args, &["ingest", "admin"], &log)?;
            fleet.agents.push((name, child));
            fleet.ingest.push(format!("http://{}", addrs[0]));
            fleet.admin.push(addrs[1].clone());
        }
        Ok(fleet)
    }

    /// The server names, by index.
    pub fn names(&self) -> Vec<String> {
        self.agents.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Stops every agent with SIGTERM (each makes a final flush) and waits for them.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        use rustix::process::{Pid, Signal, kill_process};
        for (_, child) in &self.agents {
            // Our own child, not yet reaped: the pid is still its. One that has already
            // exited shows below, in its exit status.
            let _ = kill_process(Pid::from_child(child), Signal::TERM);
        }
        let mut failed = Vec::new();
        for (name, child) in &mut self.agents {
            let status = child
                .wait()
                .with_context(|| format!("waiting for {name}"))?;
            if !status.success() {
                failed.push(format!("{name} ({status})"));
            }
        }
        self.agents.clear();
        if !failed.is_empty() {
            bail!("agents did not stop cleanly: {}", failed.join(", "));
        }
        Ok(())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The first hour of `days` whole days ending at the start of today (UTC).
pub fn default_start(days: u32) -> u32 {
    let now = chrono::Utc::now().timestamp();
    let today = (now / 86_400) as u32;
    (today - days) * 24
}

/// Sends the traffic of `plan` to the agents at `ingest` (server i to the i-th, named
/// `names[i]`), and returns the exact answers. Progress goes to stderr once a second.
pub async fn drive(plan: &Plan, ingest: &[String], names: &[String]) -> anyhow::Result<Truth> {
    let traffic = Traffic::new(plan.clone());
    let mut clients = Vec::new();
    for url in ingest {
        let channel =
            super::grpc::connect(url, "agent", "--agents", &super::grpc::TlsArgs::default())
                .await?;
        clients.push(IngestClient::new(channel).max_encoding_message_size(256 << 20));
    }
    let mut truth = Truth::default();
    let started = Instant::now();
    let mut last_report = Instant::now();
    let total = u64::from(plan.hour_count) * plan.servers as u64 * u64::from(plan.events_per_hour);
    for hour in plan.hours() {
        let mut calls = Vec::new();
        for (server, client) in clients.iter().enumerate() {
            let visits = traffic.visits(server, hour);
            let region = REGIONS[server % REGIONS.len()];
            truth.add(&names[server], region, hour, &visits);
            let request = hour_request(hour, &visits);
            let mut client = client.clone();
            // One task per agent: the agents work on their hour at the same time.
            calls.push(tokio::spawn(async move { client.send(request).await }));
        }
        for (server, call) in calls.into_iter().enumerate() {
            let reply = call
                .await
                .context("ingest task failed")?
                .map_err(|s| anyhow::anyhow!("agent {} answered: {}", ingest[server], s.message()))?
                .into_inner();
            if reply.rejected > 0 {
                let first = reply
                    .rejected_events
                    .first()
                    .map(|r| r.reason.clone())
                    .unwrap_or_default();
                bail!(
                    "agent {} rejected {} events (first: {first}); is its --lateness at least {} hours?",
                    ingest[server],
                    reply.rejected,
                    plan.hours().len() + 1
                );
            }
        }
        if last_report.elapsed() >= Duration::from_secs(1) || hour + 1 == plan.hours().end {
            let done = truth.events * 2;
            let rate = done as f64 / started.elapsed().as_secs_f64();
            eprint!(
                "\rsent {} of {} events ({}/s), through {}   ",
                grouped(done),
                grouped(total * 2),
                grouped(rate as u64),
                hourglass_rpc::time::format_hour(hour)
            );
            last_report = Instant::now();
        }
    }
    eprintln!();
    Ok(truth)
}

/// The Ingest request of one server's visits in `hour`: the visitors and the pages they
/// viewed, as two batches with the visits' own times.
fn hour_request(hour: u32, visits: &[Visit]) -> v1::IngestRequest {
    let base = i64::from(hour) * 3600;
    let times: Vec<i64> = visits.iter().map(|v| base + i64::from(v.second)).collect();
    v1::IngestRequest {
        events: Vec::new(),
        batches: vec![
            v1::SeriesBatch {
                metric: VISITORS.into(),
                items: visits.iter().map(|v| user_name(v.user)).collect(),
                times_unix_seconds: times.clone(),
                ..Default::default()
            },
            v1::SeriesBatch {
                metric: PAGES.into(),
                items: visits.iter().map(|v| page_name(v.page)).collect(),
                times_unix_seconds: times,
                ..Default::default()
            },
        ],
    }
}

/// Runs `hourglass simulate`.
pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if args.days == 0 || args.days > 366 {
        bail!("--days must be between 1 and 366");
    }
    let hour_count = args.hours.unwrap_or(args.days * 24);
    if hour_count == 0 || hour_count > 366 * 24 {
        bail!("--hours must be between 1 and {}", 366 * 24);
    }
    let start_hour = match &args.start {
        Some(text) => {
            let t = hourglass_rpc::time::parse_time(text, chrono::Utc::now())?;
            hourglass_rpc::time::hour_of(t.timestamp()).context("--start is before 1970")?
        }
        None => default_start(args.days),
    };
    let lateness_days = (chrono::Utc::now().timestamp() / 3600 - i64::from(start_hour)) / 24 + 2;
    if args.events_per_hour == 0 {
        bail!("--events-per-hour must be at least 1");
    }
    if args.users < 3 || args.pages == 0 {
        bail!("--users must be at least 3 and --pages at least 1");
    }
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let mut fleet = match args.spawn {
        Some(0) => bail!("--spawn must be at least 1"),
        Some(n) => Some(Fleet::spawn(
            n,
            &args.aggregator,
            args.spawn_dir.as_deref(),
            &[
                "--lateness",
                &format!("{}d", lateness_days.max(1)),
                "--flush-interval",
                "2s",
                "--default-kinds",
                "distinct,frequency,membership",
            ],
        )?),
        None => None,
    };
    let (ingest, names) = match &fleet {
        Some(f) => (f.ingest.clone(), f.names()),
        None => (
            args.agents.clone(),
            (0..args.agents.len())
                .map(|i| format!("agent-{}", i + 1))
                .collect(),
        ),
    };
    let plan = Plan {
        start_hour,
        hour_count,
        events_per_hour: args.events_per_hour,
        seed: args.seed,
        users: args.users,
        pages: args.pages,
        servers: ingest.len(),
    };
    let truth = runtime.block_on(drive(&plan, &ingest, &names))?;
    if let Some(f) = fleet.as_mut() {
        eprintln!("stopping the agents (each ships what it holds in a final flush)");
        f.stop()?;
    }
    let json = truth.to_json(&plan);
    if let Some(path) = &args.truth {
        std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "sent {} visits ({} events) over {} hours to {} agents; exactly {} distinct visitors",
        grouped(truth.events),
        grouped(truth.events * 2),
        hour_count,
        ingest.len(),
        grouped(json["total"]["distinct"].as_u64().unwrap_or(0))
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            start_hour: 480_000,
            hour_count: 48,
            events_per_hour: 500,
            seed: 7,
            users: 30_000,
            pages: 100,
            servers: 3,
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_visits() {
        let a = Traffic::new(plan());
        let b = Traffic::new(plan());
        assert_eq!(a.visits(1, 480_005), b.visits(1, 480_005));
        assert_ne!(a.visits(1, 480_005), a.visits(2, 480_005), "servers differ");
        assert_ne!(a.visits(1, 480_005), a.visits(1, 480_006), "hours differ");
        let other = Traffic::new(Plan { seed: 8, ..plan() });
        assert_ne!(a.visits(1, 480_005), other.visits(1, 480_005));
    }

    #[test]
    fn users_overlap_and_regions_lean_on_their_own() {
        let t = Traffic::new(plan());
        let mut truth = Truth::default();
        for hour in plan().hours() {
            for (s, region) in REGIONS.iter().enumerate() {
                truth.add(&format!("s{s}"), region, hour, &t.visits(s, hour));
            }
        }
        let total = truth.all.len();
        let sum: usize = truth.servers.values().map(HashSet::len).sum();
        assert!(sum > total, "servers share users: {sum} > {total}");
        let days: Vec<usize> = truth.days.values().map(HashSet::len).collect();
        assert!(days.iter().sum::<usize>() > total, "days share users");
        // 70% of a region's visits come from its own third of the users.
        let third = 10_000;
        let own = truth.servers["s0"].iter().filter(|&&u| u < third).count();
        assert!(own * 2 > truth.servers["s0"].len(), "{own}");
        let json = truth.to_json(&plan());
        assert_eq!(json["events"], 2 * 24 * 3 * 500);
        assert_eq!(json["days"].as_array().unwrap().len(), 2);
        let top = json["pages"]["top"].as_array().unwrap();
        assert_eq!(
            top[0]["item"], "/page/0",
            "Zipf: the first page is the most visited"
        );
        assert!(top[0]["count"].as_u64() >= top[1]["count"].as_u64());
    }

    #[test]
    fn zipf_puts_rank_one_first() {
        let z = Zipf::new(1000);
        let mut rng = Rng(1);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[z.sample(&mut rng) as usize] += 1;
        }
        // P(rank 1) = 1/H(1000) ≈ 0.1336; 100,000 draws give 13,360 ± 108.
        assert!((12_900..13_800).contains(&counts[0]), "{}", counts[0]);
        assert!(counts[0] > counts[1] && counts[1] > counts[9]);
    }
}
