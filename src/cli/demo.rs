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
use serde_json::Value;

use super::numbers::{count, grouped, percent};
use super::simulate::{self, Fleet, PAGES, Plan, REGIONS, VISITORS};

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
        writeln!(out, "{}", next_steps(&url, &truth))?;
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
            &agent_config(dir)?.to_string_lossy(),
        ],
    )?;
    eprintln!(
        "demo: {} agents ({}), {} days of traffic at {} visits per server-hour",
        args.agents,
        fleet.names().join(", "),
        args.days,
        grouped(u64::from(args.events_per_hour))
    );
    let plan = Plan {
        start_hour: simulate::default_start(args.days),
        hour_count: args.days * 24,
        events_per_hour: args.events_per_hour,
        seed: args.seed,
        users: 200_000,
        pages: 1000,
        servers: args.agents,
    };
    let truth = runtime.block_on(simulate::drive(&plan, &fleet.ingest, &fleet.names()))?;
    eprintln!("demo: stopping the agents: each ships what it holds in a final flush");
    fleet.stop()?;
    Ok(truth.to_json(&plan))
}

/// The agents' metric settings: visitors keep distinct counts and membership, pages
/// keep frequencies.
fn agent_config(dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            "[metrics.{VISITORS}]\nkinds = [\"distinct\", \"membership\"]\ncapacity = 20000\nfpr = 0.01\n\n[metrics.{PAGES}]\nkinds = [\"frequency\"]\n"
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
    let channel = super::connect(url, "aggregator", "--listen", &super::TlsArgs::default()).await?;
    let mut q = QueryClient::new(channel);
    let start = u(&truth["start_hour"]) as u32;
    let end = u(&truth["end_hour"]) as u32;
    let mut out = distinct_report(&q, truth, start, end).await?;
    out.push_str(&top_pages_report(&mut q, truth, start, end).await?);
    out.push_str(&membership_report(&mut q, truth, start, end).await?);
    Ok(out)
}

/// Unique visitors per day, for the whole range and per region, beside the truth.
async fn distinct_report(
    q: &QueryClient<tonic::transport::Channel>,
    truth: &Value,
    start: u32,
    end: u32,
) -> anyhow::Result<String> {
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
async fn top_pages_report(
    q: &mut QueryClient<tonic::transport::Channel>,
    truth: &Value,
    start: u32,
    end: u32,
) -> anyhow::Result<String> {
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

/// Membership of the probe users, beside whether they were seen.
async fn membership_report(
    q: &mut QueryClient<tonic::transport::Channel>,
    truth: &Value,
    start: u32,
    end: u32,
) -> anyhow::Result<String> {
    let mut out = String::new();
    out.push_str("\nWas this user seen? (Bloom filters: \"maybe\" can be a false positive, \"no\" is certain)\n");
    for probe in truth["membership"].as_array().cloned().unwrap_or_default() {
        let item = probe["item"].as_str().unwrap_or("").to_string();
        let r = q
            .membership(v1::MembershipRequest {
                selector: selector(VISITORS, start, end, &[]),
                item: item.clone().into_bytes(),
            })
            .await
            .map_err(|s| anyhow::anyhow!("the aggregator answered: {}", s.message()))?
            .into_inner();
        let a = r.answer.unwrap_or_default();
        let seen = probe["seen"].as_bool().unwrap_or(false);
        out.push_str(&format!(
            "  {item:<14} {:<6} exact: {:<4} (false-positive rate of the merged filter {})\n",
            if a.maybe_present { "maybe" } else { "no" },
            if seen { "yes" } else { "no" },
            percent(a.estimated_fpr)
        ));
    }
    Ok(out)
}

fn next_steps(url: &str, truth: &Value) -> String {
    let start = hourglass_rpc::time::hour_start(u(&truth["start_hour"]) as u32).to_rfc3339();
    let end = hourglass_rpc::time::hour_start(u(&truth["end_hour"]) as u32).to_rfc3339();
    let agg = if url == "http://127.0.0.1:7700" {
        String::new()
    } else {
        format!(" --aggregator {url}")
    };
    format!(
        "\nTry next:\n  hourglass query distinct --metric visitors --from {start} --to {end} --group-by day{agg}\n  hourglass query distinct --metric visitors --from {start} --to {end} --label region=eu --group-by server{agg}\n  hourglass query topk --metric pages --from {start} --to {end} --k 5 --group-by day{agg}\n  hourglass query frequency --metric pages --item /page/3 --from {start} --to {end}{agg}\n  hourglass query membership --metric visitors --item user42 --from {start} --to {end} --json{agg}\n"
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
