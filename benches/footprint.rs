//! What one agent costs on a typical host: a real agent process (default configuration:
//! distinct and frequency sketches, 10 s flush, checkpoints on) receiving DogStatsD set
//! lines over UDP at a steady rate, spread over a number of series, and shipping to a
//! real aggregator.
//!
//! Printed: the agent's CPU (utime + stime from `/proc/PID/stat`, over the measured
//! window, as a share of one core and per event), its resident memory at the end and at
//! its peak (`VmRSS`, `VmHWM`), and the events it counted against the events sent, so a
//! figure from a run that lost datagrams is not taken for a cheap one.
//!
//! `cargo bench --bench footprint` runs the full sizes (50 series, 5,000 events/s, 20 s of
//! warm-up then 60 s measured: six flushes and their checkpoints; release binaries);
//! without `--bench` (as `cargo test --all-targets` runs it) it is a short smoke run of
//! the same code.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

mod support;
use support::{Rng, Service, cpu_of, http_get};

struct Sizes {
    metrics: usize,
    tag_values: usize,
    events_per_second: u32,
    users: u32,
    warm_up: Duration,
    measured: Duration,
}

const FULL: Sizes = Sizes {
    metrics: 10,
    tag_values: 5,
    events_per_second: 5_000,
    users: 100_000,
    warm_up: Duration::from_secs(20),
    measured: Duration::from_secs(60),
};

const SMOKE: Sizes = Sizes {
    metrics: 2,
    tag_values: 2,
    events_per_second: 200,
    users: 1_000,
    warm_up: Duration::from_secs(1),
    measured: Duration::from_secs(2),
};

/// Resident memory of `pid` from `/proc/PID/status`: the field `VmRSS` or `VmHWM`, bytes.
fn memory(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
        * 1024
}

/// The sum of the samples of the metric named `name` in a Prometheus text page.
fn counter(page: &str, name: &str) -> u64 {
    page.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter(|l| l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Sends set lines at `sizes.events_per_second`, one line per datagram (what an
/// unbuffered DogStatsD client sends), for `length`, in 10 ms steps; returns how many.
fn send(socket: &UdpSocket, to: &str, sizes: &Sizes, rng: &mut Rng, length: Duration) -> u64 {
    let start = Instant::now();
    let mut sent = 0u64;
    let series = (sizes.metrics * sizes.tag_values) as u32;
    while start.elapsed() < length {
        let due = (start.elapsed().as_secs_f64() * f64::from(sizes.events_per_second)) as u64;
        while sent < due {
            let s = rng.below(series) as usize;
            let line = format!(
                "app.metric{}:user-{}|s|#endpoint:e{}",
                s / sizes.tag_values,
                rng.below(sizes.users),
                s % sizes.tag_values
            );
            socket.send_to(line.as_bytes(), to).expect("a datagram");
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    sent
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench" || a == "--full");
    let sizes = if full { &FULL } else { &SMOKE };
    let dir = std::env::temp_dir().join(format!("hourglass-agent-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let agg = support::aggregator(&dir);
    let url = format!("http://{}", agg.addrs[0]);
    let data = dir.join("agent");
    let agent = Service::start(
        "hourglass-agent",
        &[
            "--server-name",
            "host-1",
            "--aggregator",
            &url,
            "--statsd-listen",
            "127.0.0.1:0",
            "--ingest-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().expect("utf-8"),
        ],
        &["statsd", "admin"],
        &dir.join("agent.log"),
    );
    let pid = agent.child.id();
    let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    let mut rng = Rng(0xA6E7);
    let mut sent = send(&socket, &agent.addrs[0], sizes, &mut rng, sizes.warm_up);
    let cpu_before = cpu_of(pid);
    let t = Instant::now();
    sent += send(&socket, &agent.addrs[0], sizes, &mut rng, sizes.measured);
    let cpu = cpu_of(pid) - cpu_before;
    let wall = t.elapsed().as_secs_f64();
    let measured_events = f64::from(sizes.events_per_second) * wall;
    let rss = memory(pid, "VmRSS");
    let peak = memory(pid, "VmHWM");
    // Let the last datagrams be read before counting.
    std::thread::sleep(Duration::from_millis(500));
    let page = http_get(&agent.addrs[1], "/metrics");
    let counted = counter(&page, "hourglass_agent_events_total");
    let rejected = counter(&page, "hourglass_agent_rejected_total");
    agent.terminate();
    agg.terminate();
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "agent: {} series ({} metrics × {} tag values; distinct + frequency each), {} events/s of set lines over UDP for {:.0} s after {:.0} s of warm-up",
        sizes.metrics * sizes.tag_values,
        sizes.metrics,
        sizes.tag_values,
        sizes.events_per_second,
        wall,
        sizes.warm_up.as_secs_f64()
    );
    println!("| | |\n|---|---:|");
    println!("| CPU, share of one core | {:.2}% |", 100.0 * cpu / wall);
    println!("| CPU per event | {:.2} µs |", 1e6 * cpu / measured_events);
    println!(
        "| resident memory at the end | {:.1} MiB |",
        rss as f64 / 1048576.0
    );
    println!(
        "| peak resident memory | {:.1} MiB |",
        peak as f64 / 1048576.0
    );
    println!("| events sent / counted / rejected | {sent} / {counted} / {rejected} |");
    assert_eq!(rejected, 0, "the agent rejected events");
    assert!(
        counted * 100 >= sent * 99,
        "the agent counted {counted} of {sent} events: datagrams were lost, so its CPU figure is not the whole load's"
    );
}
