//! What the end-to-end benches share: the real programs as child processes, announced
//! addresses, and plain HTTP to their admin ports.

#![allow(dead_code)]

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The server program `name` (`hourglass-agent`, `hourglass-aggregator`): the
/// `hourglass` binary called by that name, as the container image's links call it. The
/// binary built with the bench, or the one `HOURGLASS_BENCH_BIN` names, to compare two
/// builds side by side on a noisy machine (runs of each in turn).
pub fn server(name: &str) -> Command {
    use std::os::unix::process::CommandExt;
    let binary = std::env::var_os("HOURGLASS_BENCH_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_hourglass").into());
    let mut command = Command::new(binary);
    command.arg0(name);
    command
}

/// A process announcing `NAME listening on ADDR` lines, killed when dropped.
pub struct Service {
    pub child: Child,
    pub addrs: Vec<String>,
}

impl Service {
    pub fn start(name: &str, args: &[&str], announces: &[&str], log: &Path) -> Service {
        let mut child = server(name)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(std::fs::File::create(log).expect("log file"))
            .stderr(Stdio::piped())
            .spawn()
            .expect("start");
        let mut lines = std::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
        let mut addrs = vec![String::new(); announces.len()];
        while addrs.iter().any(String::is_empty) {
            let line = lines
                .next()
                .expect("process ended before announcing")
                .expect("line");
            if let Some((what, addr)) = line.split_once(" listening on ")
                && let Some(i) = announces.iter().position(|a| *a == what)
            {
                addrs[i] = addr.trim().to_string();
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Service { child, addrs }
    }

    pub fn terminate(mut self) {
        use rustix::process::{Pid, Signal, kill_process};
        kill_process(Pid::from_child(&self.child), Signal::TERM).expect("SIGTERM");
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "exit {status}");
    }

    /// Peak resident memory, bytes.
    pub fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn aggregator(dir: &Path) -> Service {
    std::fs::create_dir_all(dir).expect("bench dir");
    let data = dir.join("agg");
    Service::start(
        "hourglass-aggregator",
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--http-listen",
            "off",
            "--data-dir",
            data.to_str().expect("utf-8"),
        ],
        &["grpc", "admin"],
        &dir.join("agg.log"),
    )
}

pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    text
}

/// SplitMix64: a bench workload's only source of randomness.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next() >> 32) * u64::from(n)) >> 32) as u32
    }
}

/// CPU seconds a process has used, from `/proc/PID/stat` (utime + stime).
pub fn cpu_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    ticks(&stat, 13) + ticks(&stat, 14)
}

/// CPU seconds of this process's children that have ended (cutime + cstime).
pub fn cpu_of_ended_children() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    ticks(&stat, 15) + ticks(&stat, 16)
}

/// Field `i` (0-based, after the command name) of a stat line, in seconds.
fn ticks(stat: &str, i: usize) -> f64 {
    let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let field: f64 = after
        .split(' ')
        .nth(i - 2)
        .and_then(|f| f.parse().ok())
        .expect("a stat field");
    let per_second = rustix::param::clock_ticks_per_second() as f64;
    field / per_second
}
