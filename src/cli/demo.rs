//! `hourglass demo`: the whole system on one machine, in one command.
//!
//! It starts an aggregator (RocksDB under `--data-dir`), a fleet of real agents in three
//! regions, feeds them a week of synthetic traffic at accelerated time through their
//! Ingest APIs, stops them (each ships what it holds in a final flush), and prints what
//! the aggregator answers beside the exact truth: unique visitors per day, for the week,
//! per region; the top 10 pages; membership checks. Then it leaves the aggregator running
//! for `hourglass query` until Ctrl-C, or stops at once with `--exit`.
//!
//! A second run on the same data dir reports on the week already stored (the traffic is
//! not sent twice: that would double every frequency); `--fresh` starts clean.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use hourglass_rpc::proto::v1::{self, query_client::QueryClient};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};

use super::numbers::{count, grouped, percent};
use super::simulate::{self, Fleet, PAGES, Plan, REGIONS, Traffic, VISITORS};

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Where the aggregator's RocksDB, the agents' checkpoints, the logs and the truth go.
    #[arg(long, env = "HOURGLASS_DEMO_DIR", default_value = "./hourglass-demo")]
    data_dir: PathBuf,
    /// Delete what an earlier run left in the data dir and simulate again.
    #[arg(long)]
    fresh: bool,
    /// Stop everything after the report instead of leaving the aggregator running.
    #[arg(long)]
    exit: bool,
    /// Agents (servers) in the fleet, spread over the regions eu, us, ap.
    #[arg(long, default_value_t = 6)]
    agents: usize,
    /// Days of traffic, ending at the start of today (UTC).
    #[arg(long, default_value_t = 7)]
    days: u32,
    /// Visits per server and hour.
    #[arg(long, default_value_t = 2000)]
    events_per_hour: u32,
    /// Seed of the traffic.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Address of the aggregator's gRPC port (the default is where `hourglass query`
    /// looks).
    #[arg(long, default_value = "127.0.0.1:7700")]
    listen: String,
    /// Address of the aggregator's admin port.
    #[arg(long, default_value = "127.0.0.1:7701")]
    admin_listen: String,
    /// Address of the aggregator's HTTP port: the JSON API and the dashboard [default:
    /// 127.0.0.1:7702, or a free port when --listen asks for one with port 0].
    #[arg(long)]
    http_listen: Option<String>,
}

impl DemoArgs {
    /// `--http-listen`, or its default: a free port when the gRPC port is one (tests run
    /// demos side by side), else the usual one.
    fn http_listen(&self) -> String {
        self.http_listen.clone().unwrap_or_else(|| {
            if self.listen.ends_with(":0") {
                "127.0.0.1:0".to_string()
            } else {
                "127.0.0.1:7702".to_string()
            }
        })
    }
}

/// Runs the demo.
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.agents == 0 || args.days == 0 || args.events_per_hour == 0 {
        bail!("--agents, --days and --events-per-hour must each be at least 1");
    }
    let dir = &args.data_dir;
    let truth_path = dir.join("truth.json");
    let stored = prepare_data_dir(dir, args.fresh, &truth_path)?;
    let say = |text: String| eprintln!("demo: {text}");
    let config = dir.join("aggregator.toml");
    // Rollups of the closed simulated days are built within seconds.
    std::fs::write(&config, "[rollup]\ninterval = \"2s\"\n")?;
    let (mut aggregator, addrs) = start_aggregator(&args, dir, &config)?;
    let url = format!("http://{}", addrs[0]);
    let dashboard = browser_url(&addrs[2]);
    say(format!(
        "aggregator serving on {url} (admin http://{}), data in {}; dashboard at {dashboard}/",
        addrs[1],
        dir.join("aggregator").display()
    ));
    let result = (|| -> anyhow::Result<()> {
        let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
        let truth = match stored {
            Some(truth) => {
                say("the data dir already holds the simulated traffic; reporting on it (--fresh simulates again)".into());
                truth
            }
            None => {
                let truth = simulate_week(&args, &url, dir, &runtime)?;
                std::fs::write(&truth_path, serde_json::to_string_pretty(&truth)? + "\n")?;
                truth
            }
        };
        let report = runtime.block_on(report(&url, &truth))?;
        let mut out = std::io::stdout().lock();
        out.write_all(report.as_bytes())?;
        writeln!(out, "{}", next_steps(&program_as_typed(), &url, &truth))?;
        writeln!(out, "{}", dashboard_line(&dashboard, &truth))?;
        out.flush()?;
        Ok(())
    })();
    if let Err(e) = result {
        stop(&mut aggregator);
        return Err(e);
    }
    if !args.exit {
        say("the aggregator keeps running; press Ctrl-C to stop it".into());
        wait_for_ctrl_c()?;
    }
    stop(&mut aggregator);
    say("stopped".into());
    Ok(())
}

/// Makes the data dir (emptied first with `fresh`) and reads the truth an earlier run
/// stored in it; a run that stopped before its traffic was complete leaves partial data,
/// which is removed.
fn prepare_data_dir(dir: &Path, fresh: bool, truth_path: &Path) -> anyhow::Result<Option<Value>> {
    if fresh && dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let stored: Option<Value> =
        match std::fs::read(truth_path) {
            Ok(bytes) => Some(serde_json::from_slice(&bytes).with_context(|| {
                format!("{} is damaged; run with --fresh", truth_path.display())
            })?),
            Err(_) => None,
        };
    if stored.is_none() && dir.join("aggregator").exists() {
        // An earlier run stopped before its traffic was complete: its data is partial.
        std::fs::remove_dir_all(dir.join("aggregator")).ok();
        std::fs::remove_dir_all(dir.join("agents")).ok();
    }
    Ok(stored)
}

/// Starts the demo's aggregator (`hourglass aggregator`) with its data and log in `dir`;
/// returns the process and its gRPC, admin and HTTP addresses.
fn start_aggregator(
    args: &DemoArgs,
    dir: &Path,
    config: &Path,
) -> anyhow::Result<(std::process::Child, Vec<String>)> {
    let http_listen = args.http_listen();
    let agg_args: Vec<String> = [
        "--listen",
        &args.listen,
        "--admin-listen",
        &args.admin_listen,
        "--http-listen",
        &http_listen,
        "--data-dir",
        &dir.join("aggregator").to_string_lossy(),
        "--config",
        &config.to_string_lossy(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    simulate::start_service(
        "aggregator",
        &agg_args,
        &["grpc", "admin", "http"],
        &dir.join("aggregator.log"),
    )
    .with_context(|| {
        format!(
            "starting the aggregator on {} (is another one running? try --listen)",
            args.listen
        )
    })
}

fn simulate_week(
    args: &DemoArgs,
    url: &str,
    dir: &Path,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<Value> {
    let plan = plan_of(args);
    let capacity = membership_capacity(&plan);
    let mut fleet = Fleet::spawn(
        args.agents,
        url,
        Some(&dir.join("agents")),
        &[
            "--lateness",
            &format!("{}d", args.days + 1),
            "--flush-interval",
            "2s",
            "--config",
            &agent_config(dir, args, capacity)?.to_string_lossy(),
        ],
    )?;
    eprintln!(
        "demo: {} agents ({}), {} days of traffic at {} visits per server-hour",
        args.agents,
        fleet.names().join(", "),
        args.days,
        grouped(u64::from(args.events_per_hour))
    );
    let truth = runtime.block_on(simulate::drive(&plan, &fleet.ingest, &fleet.names()))?;
    eprintln!("demo: stopping the agents: each ships what it holds in a final flush");
    fleet.stop()?;
    let mut truth = truth.to_json(&plan);
    truth["membership_sizing"] = json!({
        "capacity": capacity,
        "range_fpr": MEMBERSHIP_RANGE_FPR,
        "servers": args.agents,
        "hours": args.days * 24,
    });
    Ok(truth)
}

/// The demo's traffic plan.
fn plan_of(args: &DemoArgs) -> Plan {
    Plan {
        start_hour: simulate::default_start(args.days),
        hour_count: args.days * 24,
        events_per_hour: args.events_per_hour,
        seed: args.seed,
        users: 200_000,
        pages: 1000,
        servers: args.agents,
    }
}

/// The false-positive probability the demo's membership metric declares for a lookup
/// over its whole range (all servers, all days).
const MEMBERSHIP_RANGE_FPR: f64 = 0.05;

/// Items per server-hour the membership filters are sized for, as a metric's owner would
/// declare it: the mean distinct users of a server-hour in a pilot day of other traffic
/// (another seed), rounded up to a hundred (1,300 at 2,000 visits per server-hour).
fn membership_capacity(plan: &Plan) -> u64 {
    let pilot = Traffic::new(Plan {
        seed: plan.seed ^ 0x9E37_79B9_7F4A_7C15,
        ..plan.clone()
    });
    let hours = plan.start_hour..plan.start_hour + 24;
    let mut distinct = 0usize;
    for server in 0..plan.servers {
        for hour in hours.clone() {
            let users: HashSet<u32> = pilot.visits(server, hour).iter().map(|v| v.user).collect();
            distinct += users.len();
        }
    }
    let mean = distinct as f64 / (plan.servers * 24) as f64;
    ((mean / 100.0).ceil() as u64).max(1) * 100
}

/// The agents' metric settings: visitors keep distinct counts and membership, pages
/// keep frequencies. The membership filters are sized for the question the report asks,
/// "was this user seen in the whole range, on any server?": `capacity` users per
/// server-hour, and at most a 5% chance that a user seen nowhere comes back "maybe".
fn agent_config(dir: &Path, args: &DemoArgs, capacity: u64) -> anyhow::Result<PathBuf> {
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            "[metrics.{VISITORS}]\nkinds = [\"distinct\", \"membership\"]\ncapacity = {capacity}\nmembership_range = \"{}d\"\nmembership_servers = {}\nmembership_range_fpr = {MEMBERSHIP_RANGE_FPR}\n\n[metrics.{PAGES}]\nkinds = [\"frequency\"]\n",
            args.days, args.agents
        ),
    )?;
    Ok(path)
}

fn selector(metric: &str, start: u32, end: u32, labels: &[(&str, &str)]) -> Option<v1::Selector> {
    Some(v1::Selector {
        metric: metric.into(),
        range: Some(v1::TimeRange {
            start_hour: start,
            end_hour: end,
        }),
        labels: labels
            .iter()
            .map(|(k, v)| v1::Tag {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    })
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// One row: what the aggregator said, the truth, and whether the truth is inside the
/// 95% interval.
fn distinct_row(label: &str, a: &v1::DistinctAnswer, exact: u64) -> String {
    let err = (a.estimate - exact as f64) / exact.max(1) as f64;
    let inside = (a.lower95..=a.upper95).contains(&(exact as f64));
    format!(
        "  {label:<22} {:>10} ± {:<6} {:>10} {:>+8}   {}\n",
        count(a.estimate),
        percent(a.std_error / a.estimate.max(1.0)),
        grouped(exact),
        format!("{:.2}%", err * 100.0),
        if inside { "yes" } else { "NO" }
    )
}

async fn report(url: &str, truth: &Value) -> anyhow::Result<String> {
    let channel = super::grpc::connect(
        url,
        "aggregator",
        "--listen",
        &super::grpc::TlsArgs::default(),
    )
    .await?;
    let mut ask = Asking {
        q: QueryClient::new(channel),
        start: u(&truth["start_hour"]) as u32,
        end: u(&truth["end_hour"]) as u32,
    };
    let mut out = distinct_report(&ask, truth).await?;
    out.push_str(&top_pages_report(&mut ask, truth).await?);
    out.push_str(&membership_report(&ask, truth).await?);
    Ok(out)
}

/// Whom the report asks, and over which hours: the aggregator's query service, and the
/// simulated week from its first hour to the hour after its last. Every question of the
/// report is over that one range.
struct Asking {
    q: QueryClient<tonic::transport::Channel>,
    start: u32,
    end: u32,
}

/// Unique visitors per day, for the whole range and per region, beside the truth.
async fn distinct_report(ask: &Asking, truth: &Value) -> anyhow::Result<String> {
    let (q, start, end) = (&ask.q, ask.start, ask.end);
    let mut out = String::new();
    let days = truth["days"].as_array().cloned().unwrap_or_default();
    out.push_str(&format!(
        "\nUnique visitors ({} to {}, {} servers)\n  {:<22} {:>10}   {:<6} {:>10} {:>8}   {}\n",
        hourglass_rpc::time::format_hour(start),
        hourglass_rpc::time::format_hour(end),
        truth["total"]["servers"].as_object().map_or(0, |m| m.len()),
        "",
        "estimate",
        "±1 se",
        "exact",
        "error",
        "in 95% interval?"
    ));
    let ask = |sel| {
        let mut q = q.clone();
        async move {
            q.distinct(v1::DistinctRequest { selector: sel })
                .await
                .map(|r| r.into_inner())
                .map_err(|s| anyhow::anyhow!("the aggregator answered: {}", s.message()))
        }
    };
    for day in &days {
        let s = u(&day["start_hour"]) as u32;
        let r = ask(selector(VISITORS, s, s + 24, &[])).await?;
        let a = r.answer.unwrap_or_default();
        out.push_str(&distinct_row(
            day["day"].as_str().unwrap_or("?"),
            &a,
            u(&day["distinct"]),
        ));
    }
    let week = ask(selector(VISITORS, start, end, &[])).await?;
    let coverage = week.coverage.clone().unwrap_or_default();
    out.push_str(&distinct_row(
        "whole range",
        &week.answer.unwrap_or_default(),
        u(&truth["total"]["distinct"]),
    ));
    for region in REGIONS {
        let exact = u(&truth["total"]["regions"][region]);
        if exact == 0 {
            continue;
        }
        let r = ask(selector(VISITORS, start, end, &[("region", region)])).await?;
        out.push_str(&distinct_row(
            &format!("region={region}"),
            &r.answer.unwrap_or_default(),
            exact,
        ));
    }
    out.push_str(&format!(
        "  ({} sketches merged for the whole range; {} server-hours without data)\n",
        grouped(coverage.sketches_merged),
        grouped(coverage.server_hours_missing)
    ));

    Ok(out)
}

/// The top 10 pages with their bounds, beside the truth.
async fn top_pages_report(ask: &mut Asking, truth: &Value) -> anyhow::Result<String> {
    let (q, start, end) = (&mut ask.q, ask.start, ask.end);
    let mut out = String::new();
    let top = q
        .top_k(v1::TopKRequest {
            selector: selector(PAGES, start, end, &[]),
            k: 10,
        })
        .await
        .map_err(|s| anyhow::anyhow!("the aggregator answered: {}", s.message()))?
        .into_inner();
    out.push_str(&format!(
        "\nTop 10 pages of {} page views (estimate never below the truth)\n  {:<12} {:>10} {:>21} {:>10}   {}\n",
        grouped(u(&truth["pages"]["total"])),
        "page",
        "estimate",
        "bounds",
        "exact",
        "exact within bounds?"
    ));
    let exact_top = truth["pages"]["top"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for item in &top.items {
        let name = String::from_utf8_lossy(&item.item).into_owned();
        let exact = exact_top
            .iter()
            .find(|e| e["item"] == name.as_str())
            .map(|e| u(&e["count"]));
        let (exact_text, ok) = match exact {
            Some(e) => (
                grouped(e),
                if (item.lower..=item.upper).contains(&e) {
                    "yes"
                } else {
                    "NO"
                },
            ),
            None => ("(not top 10)".to_string(), "-"),
        };
        out.push_str(&format!(
            "  {name:<12} {:>10} {:>21} {exact_text:>10}   {ok}\n",
            grouped(item.estimate),
            format!("[{}, {}]", grouped(item.lower), grouped(item.upper))
        ));
    }

    Ok(out)
}

/// Absent users looked up over the whole range: enough that the share answered "maybe"
/// (a few percent) is measured to about ±6% of itself.
const ABSENT_PROBES: u32 = 10_000;
/// Present users looked up, sampled evenly from everyone the traffic made.
const PRESENT_PROBES: usize = 1_000;
/// Lookups in flight at once.
const LOOKUPS_IN_FLIGHT: usize = 4;

/// Looks each of `items` up over the report's hours, a few at a time; answers in item order.
async fn look_up_all(
    ask: &Asking,
    items: Vec<String>,
) -> anyhow::Result<Vec<v1::MembershipAnswer>> {
    let (q, start, end) = (&ask.q, ask.start, ask.end);
    let chunk = items.len().div_ceil(LOOKUPS_IN_FLIGHT).max(1);
    let mut tasks = Vec::new();
    for part in items.chunks(chunk) {
        let (mut q, part) = (q.clone(), part.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::with_capacity(part.len());
            for item in part {
                let r = q
                    .membership(v1::MembershipRequest {
                        selector: selector(VISITORS, start, end, &[]),
                        item: item.into_bytes(),
                    })
                    .await
                    .map_err(|s| anyhow::anyhow!("the aggregator answered: {}", s.message()))?;
                answers.push(r.into_inner().answer.unwrap_or_default());
            }
            Ok::<_, anyhow::Error>(answers)
        }));
    }
    let mut answers = Vec::with_capacity(items.len());
    for task in tasks {
        answers.extend(task.await.context("lookup task failed")??);
    }
    Ok(answers)
}

/// Where each user of the traffic was seen: (server name, hour) pairs, made again from
/// the plan stored with the truth; `None` for a truth stored without it.
fn sightings(truth: &Value) -> Option<BTreeMap<u32, Vec<(String, u32)>>> {
    let p = truth.get("plan")?;
    let servers = u(&p["servers"]) as usize;
    let plan = Plan {
        start_hour: u(&truth["start_hour"]) as u32,
        hour_count: (u(&truth["end_hour"]) - u(&truth["start_hour"])) as u32,
        events_per_hour: u(&p["events_per_hour"]) as u32,
        seed: u(&p["seed"]),
        users: u(&p["users"]) as u32,
        pages: u(&p["pages"]) as u32,
        servers,
    };
    let traffic = Traffic::new(plan.clone());
    let mut seen: BTreeMap<u32, Vec<(String, u32)>> = BTreeMap::new();
    // Server by server, hour by hour: each user's list comes out ordered as answers are.
    for server in 0..servers {
        let name = format!("web-{}", server + 1);
        for hour in plan.hours() {
            let users: HashSet<u32> = traffic
                .visits(server, hour)
                .iter()
                .map(|v| v.user)
                .collect();
            for user in users {
                seen.entry(user).or_default().push((name.clone(), hour));
            }
        }
    }
    // Names sort as strings (web-10 before web-2), as the answers order them.
    for list in seen.values_mut() {
        list.sort();
    }
    Some(seen)
}

/// Whether an answer lists every server-hour of `want` (ordered) that sorts before its
/// last listed sighting, and counts at least all of them: where a user was seen, as far
/// as an answer capped at 100 sightings can show it.
fn found_everywhere(a: &v1::MembershipAnswer, want: &[(String, u32)]) -> bool {
    let listed: HashSet<(&str, u32)> = a
        .seen_in
        .iter()
        .map(|s| (s.server.as_str(), s.start_hour))
        .collect();
    let complete = a.seen_in.len() as u64 == a.seen_in_count;
    let last = a.seen_in.last().map(|s| (s.server.as_str(), s.start_hour));
    a.maybe_present
        && a.seen_in_count >= want.len() as u64
        && want
            .iter()
            .map(|(s, h)| (s.as_str(), *h))
            .filter(|w| complete || last.is_some_and(|l| *w <= l))
            .all(|w| listed.contains(&w))
}

/// Membership over the whole range: the probe users beside whether they were seen, then
/// thousands of absent users (how many come back "definitely absent", and the stated
/// false-positive probability against the measured one) and a sample of present ones
/// (each found wherever it was seen).
async fn membership_report(ask: &Asking, truth: &Value) -> anyhow::Result<String> {
    let mut out = String::new();
    let sizing = &truth["membership_sizing"];
    out.push_str("\nWas this user seen over the whole range? (each server-hour's Bloom filter looked up, never merged: \"no\" is certain, \"maybe\" can be a false positive)\n");
    if sizing.is_null() {
        out.push_str("  filters of an older demo, sized for one server-hour, not for the range (--fresh sizes them for it)\n");
    } else {
        out.push_str(&format!(
            "  filters sized for it: {} users per server-hour, {} false-positive probability over {} servers × {} hours\n",
            grouped(u(&sizing["capacity"])),
            percent(sizing["range_fpr"].as_f64().unwrap_or(0.0)),
            u(&sizing["servers"]),
            u(&sizing["hours"]),
        ));
    }
    let probes = truth["membership"].as_array().cloned().unwrap_or_default();
    let items: Vec<String> = probes
        .iter()
        .map(|p| p["item"].as_str().unwrap_or("").to_string())
        .collect();
    let answers = look_up_all(ask, items.clone()).await?;
    for ((item, probe), a) in items.iter().zip(&probes).zip(&answers) {
        let seen = probe["seen"].as_bool().unwrap_or(false);
        let said = if a.maybe_present {
            format!(
                "seen in {} of {} filters",
                grouped(a.seen_in_count),
                grouped(a.filters_consulted)
            )
        } else {
            format!(
                "definitely absent from all {} filters",
                grouped(a.filters_consulted)
            )
        };
        out.push_str(&format!(
            "  {item:<14} {:<6} exact: {:<4} {said}\n",
            if a.maybe_present { "maybe" } else { "no" },
            if seen { "yes" } else { "no" },
        ));
    }

    out += &absent_users_report(ask, sizing).await?;
    out += &present_users_report(ask, truth).await?;
    Ok(out)
}

/// Users the model never makes: each answer is "definitely absent" or a false positive.
/// The share answered definitely absent, and the false-positive probability the
/// filters state beside the one measured.
async fn absent_users_report(ask: &Asking, sizing: &Value) -> anyhow::Result<String> {
    let mut out = String::new();
    let absent: Vec<String> = (0..ABSENT_PROBES).map(|i| format!("nobody{i}")).collect();
    let answers = look_up_all(ask, absent).await?;
    let definitely = answers.iter().filter(|a| a.definitely_absent).count() as u64;
    let n = f64::from(ABSENT_PROBES);
    let measured = (n - definitely as f64) / n;
    // The stated rate is the filters', the same for every item: the mean guards against
    // a filter stored between two lookups.
    let stated = answers.iter().map(|a| a.range_fpr).sum::<f64>() / n;
    let sigma = (stated * (1.0 - stated) / n).sqrt();
    let share = definitely as f64 / n;
    let wanted = 1.0 - sizing["range_fpr"].as_f64().unwrap_or(MEMBERSHIP_RANGE_FPR);
    out.push_str(&format!(
        "  {:<46} {:>7} of {:<7} ({})   target ≥ {}   {}\n",
        "absent users answered definitely absent",
        grouped(definitely),
        grouped(u64::from(ABSENT_PROBES)),
        percent(share),
        percent(wanted),
        if share >= wanted { "yes" } else { "NO" }
    ));
    let ratio = if stated > 0.0 { measured / stated } else { 0.0 };
    let verdict = if (ratio - 1.0).abs() <= 0.2 {
        "yes".to_string()
    } else if (measured - stated).abs() > 2.0 * sigma + 0.2 * stated {
        "NO".to_string()
    } else {
        // Too few false positives to resolve 20%: the difference is within the noise.
        format!(
            "within the noise (±{} of stated, 1σ)",
            percent(sigma / stated.max(1e-300))
        )
    };
    out.push_str(&format!(
        "  {:<46} stated {} measured {} (±{} 1σ), ratio {:.3}   target within 20%   {verdict}\n",
        "false-positive probability of a lookup",
        percent(stated),
        percent(measured),
        percent(sigma),
        ratio,
    ));
    Ok(out)
}

/// Users the traffic made: each must be found in every server-hour that saw it.
async fn present_users_report(ask: &Asking, truth: &Value) -> anyhow::Result<String> {
    let mut out = String::new();
    match sightings(truth) {
        None => out.push_str(
            "  (present users not checked: the data dir was made by an older demo; --fresh)\n",
        ),
        Some(seen) => {
            let users: Vec<&u32> = seen.keys().collect();
            let step = (users.len() / PRESENT_PROBES).max(1);
            let sample: Vec<u32> = users
                .iter()
                .step_by(step)
                .take(PRESENT_PROBES)
                .map(|u| **u)
                .collect();
            let items = sample.iter().map(|&u| simulate::user_name(u)).collect();
            let answers = look_up_all(ask, items).await?;
            let found = sample
                .iter()
                .zip(&answers)
                .filter(|(user, a)| found_everywhere(a, &seen[user]))
                .count();
            let places: usize = sample.iter().map(|u| seen[u].len()).sum();
            out.push_str(&format!(
                "  {:<46} {:>7} of {:<7} (in all {} server-hours that saw them; {} users in all)   target all   {}\n",
                "present users found wherever they were seen",
                grouped(found as u64),
                grouped(sample.len() as u64),
                grouped(places as u64),
                grouped(users.len() as u64),
                if found == sample.len() { "yes" } else { "NO" }
            ));
        }
    }
    Ok(out)
}

/// How a user types this program in a shell here: `hourglass` when the `hourglass` a shell
/// finds first on `PATH` is this very binary, else its path (relative to the current
/// directory when it lies under it, as `target/debug/hourglass` does after `scripts/demo`,
/// and `./hourglass` in it), so that the commands the report prints run as printed.
fn program_as_typed() -> String {
    let Ok(exe) = std::env::current_exe().and_then(std::fs::canonicalize) else {
        return "hourglass".to_string();
    };
    let path = std::env::var_os("PATH");
    let cwd = std::env::current_dir().and_then(std::fs::canonicalize).ok();
    program_typed(&exe, path.as_deref(), cwd.as_deref())
}

/// [`program_as_typed`] for the binary `exe` (canonical), in a shell whose `PATH` is
/// `path` and whose current directory is `cwd` (canonical).
fn program_typed(exe: &Path, path: Option<&std::ffi::OsStr>, cwd: Option<&Path>) -> String {
    // A shell runs the first `hourglass` on PATH it can execute (an empty entry is the
    // current directory), not any of them: this binary only if it is that one.
    let first = path.and_then(|path| {
        std::env::split_paths(path).find_map(|dir| {
            let dir = match (dir.as_os_str().is_empty(), cwd) {
                (true, Some(cwd)) => cwd.to_path_buf(),
                _ => dir,
            };
            executable(&dir.join("hourglass"))
        })
    });
    if first.as_deref() == Some(exe) {
        return "hourglass".to_string();
    }
    let typed = match cwd.and_then(|cwd| exe.strip_prefix(cwd).ok()) {
        // A bare name is looked up on PATH: one in the current directory is `./name`.
        Some(relative) if relative.components().count() == 1 => Path::new(".").join(relative),
        Some(relative) => relative.to_path_buf(),
        None => exe.to_path_buf(),
    };
    shell_word(&typed.to_string_lossy())
}

/// `candidate`, canonical, if it is a file a shell would run (its execute bits).
fn executable(candidate: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let metadata = std::fs::metadata(candidate).ok()?;
    if !metadata.is_file() || metadata.permissions().mode() & 0o111 == 0 {
        return None;
    }
    std::fs::canonicalize(candidate).ok()
}

/// `word` as a shell reads it back: as it is when it holds only characters a shell takes
/// literally, else in single quotes.
fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:,@%".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The report's last lines: commands to ask the demo's aggregator more, as `program`
/// ([`program_as_typed`]).
fn next_steps(program: &str, url: &str, truth: &Value) -> String {
    let start = hourglass_rpc::time::hour_start(u(&truth["start_hour"]) as u32).to_rfc3339();
    let end = hourglass_rpc::time::hour_start(u(&truth["end_hour"]) as u32).to_rfc3339();
    let agg = if url == "http://127.0.0.1:7700" {
        String::new()
    } else {
        format!(" --aggregator {url}")
    };
    format!(
        "\nTry next:\n  {program} query distinct --metric visitors --from {start} --to {end} --group-by day{agg}\n  {program} query distinct --metric visitors --from {start} --to {end} --label region=eu --group-by server{agg}\n  {program} query topk --metric pages --from {start} --to {end} --k 5 --group-by day{agg}\n  {program} query frequency --metric pages --item /page/3 --from {start} --to {end}{agg}\n  {program} query membership --metric visitors --item user42 --from {start} --to {end} --json{agg}\n"
    )
}

/// An HTTP address as a URL a browser on this machine can open: a wildcard address is
/// reached on loopback.
fn browser_url(http: &str) -> String {
    let address = match http.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => {
            let loopback: std::net::IpAddr = if a.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            };
            std::net::SocketAddr::new(loopback, a.port()).to_string()
        }
        _ => http.to_string(),
    };
    format!("http://{address}")
}

/// The dashboard's view of the simulated week, per day.
fn dashboard_line(dashboard: &str, truth: &Value) -> String {
    let day = |hour: &Value| hourglass_rpc::time::format_day(u(hour) as u32 / 24);
    format!(
        "Open the dashboard:\n  {dashboard}/?metric={VISITORS}&from={}&to={}&group_by=day\n",
        day(&truth["start_hour"]),
        day(&truth["end_hour"])
    )
}

fn stop(aggregator: &mut std::process::Child) {
    use rustix::process::{Pid, Signal, kill_process};
    // Our own child, not yet reaped: the pid is still its.
    let _ = kill_process(Pid::from_child(aggregator), Signal::TERM);
    let _ = aggregator.wait();
}

fn wait_for_ctrl_c() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let stop = hourglass_rpc::process::shutdown_signal().context("watching Ctrl-C")?;
        stop.await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes an executable `dir/hourglass` holding `text`; returns its canonical path.
    fn program(dir: &Path, text: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).unwrap();
        let file = dir.join("hourglass");
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::canonicalize(file).unwrap()
    }

    #[test]
    fn the_program_is_named_as_a_shell_runs_it() {
        let root = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(root.path()).unwrap();
        let (other, mine, elsewhere) = (root.join("other"), root.join("mine"), root.join("cwd"));
        program(&other, "another hourglass");
        let exe = program(&mine, "this one");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let path = |dirs: &[&Path]| std::env::join_paths(dirs).unwrap();
        let typed = |dirs: &[&Path], cwd: &Path| program_typed(&exe, Some(&path(dirs)), Some(cwd));
        // First on PATH: its name.
        assert_eq!(typed(&[&mine, &other], &elsewhere), "hourglass");
        // Another `hourglass` comes first on PATH: a shell runs that one, so not its name.
        assert_eq!(
            typed(&[&other, &mine], &elsewhere),
            shell_word(&exe.to_string_lossy())
        );
        // A file by that name a shell cannot run is passed over, as a shell does.
        let plain = root.join("plain");
        std::fs::create_dir_all(&plain).unwrap();
        std::fs::write(plain.join("hourglass"), "not a program").unwrap();
        assert_eq!(typed(&[&plain, &mine], &elsewhere), "hourglass");
        // Under the current directory: its relative path.
        assert_eq!(typed(&[&other], &root), "mine/hourglass");
        // In the current directory itself: a bare name would be looked up on PATH.
        assert_eq!(typed(&[&other], &mine), "./hourglass");
        assert_eq!(program_typed(&exe, None, Some(&mine)), "./hourglass");
        // An empty entry of PATH is the current directory, to a shell.
        assert_eq!(typed(&[Path::new(""), &other], &mine), "hourglass");
    }

    #[test]
    fn a_word_a_shell_would_not_read_back_as_it_is_is_quoted() {
        assert_eq!(
            shell_word("target/debug/hourglass"),
            "target/debug/hourglass"
        );
        assert_eq!(
            shell_word("/opt/my tools/hourglass"),
            "'/opt/my tools/hourglass'"
        );
        assert_eq!(shell_word("it's/hourglass"), r"'it'\''s/hourglass'");
        // A first word with `=` before any quoting is an assignment to a shell, not a
        // command.
        assert_eq!(shell_word("v=2/hourglass"), "'v=2/hourglass'");
    }
}
