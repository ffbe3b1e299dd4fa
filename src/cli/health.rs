//! `hourglass health`: asks a server's admin port whether it is healthy, for container
//! health checks (the image has no curl). Exit status 0 when the answer is HTTP 200.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;
use clap::Args;

/// The admin ports of the image's two servers, tried in turn when no address is given.
const DEFAULT_ADMIN: [&str; 2] = ["127.0.0.1:7701", "127.0.0.1:7711"];

#[derive(Debug, Args)]
pub(crate) struct HealthArgs {
    /// The admin address (`host:port`) of an aggregator or agent. Default, in a container
    /// whose PID 1 is hourglass-aggregator or hourglass-agent: that program's
    /// --admin-listen, else HOURGLASS_ADMIN_LISTEN, else its default port (7701, 7711);
    /// elsewhere HOURGLASS_ADMIN_LISTEN, else 127.0.0.1:7701 then 127.0.0.1:7711.
    /// 0.0.0.0 and `[::]` mean loopback.
    #[arg(long)]
    admin: Option<String>,
    /// The path to ask: `/healthz` (the process serves) or `/readyz` (it is ready for
    /// traffic: the aggregator's store is open, the agent's checkpoint loaded).
    #[arg(long, default_value = "/healthz")]
    path: String,
    /// How long to wait for an answer.
    #[arg(long, default_value = "3s", value_parser = hourglass_rpc::time::parse_duration)]
    timeout: Duration,
}

pub fn run(args: HealthArgs) -> anyhow::Result<()> {
    let pid1 = std::fs::read("/proc/1/cmdline")
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let env = std::env::var("HOURGLASS_ADMIN_LISTEN").ok();
    let candidates = candidates(args.admin.as_deref(), &pid1, env.as_deref());
    let mut failures = Vec::new();
    for address in &candidates {
        match ask(address, &args.path, args.timeout) {
            Ok(200) => {
                println!("{address}{}: healthy (HTTP 200)", args.path);
                return Ok(());
            }
            Ok(status) => failures.push(format!("{address}{}: HTTP {status}", args.path)),
            Err(e) => failures.push(format!("{address}{}: {e:#}", args.path)),
        }
    }
    anyhow::bail!("not healthy: {}", failures.join("; "))
}

/// The admin addresses to ask, in turn. In a container, PID 1 is the server itself: its
/// own `--admin-listen` flag, else HOURGLASS_ADMIN_LISTEN, else its program's default, so
/// an agent sharing a network namespace with an aggregator never answers for it.
/// Elsewhere: HOURGLASS_ADMIN_LISTEN, else both defaults.
fn candidates(given: Option<&str>, pid1: &[String], env: Option<&str>) -> Vec<String> {
    if let Some(admin) = given {
        return vec![admin.to_string()];
    }
    let program = pid1
        .first()
        .map(|p| p.rsplit('/').next().unwrap_or(p).to_string());
    // `hourglass-agent …`, or the same program as `hourglass agent …`.
    let program = match (program.as_deref(), pid1.get(1).map(String::as_str)) {
        (Some("hourglass"), Some(server @ ("agent" | "aggregator"))) => {
            Some(format!("hourglass-{server}"))
        }
        _ => program,
    };
    let default = match program.as_deref() {
        Some("hourglass-aggregator") => Some(DEFAULT_ADMIN[0]),
        Some("hourglass-agent") => Some(DEFAULT_ADMIN[1]),
        _ => None,
    };
    if default.is_some() {
        for (i, arg) in pid1.iter().enumerate() {
            if let Some(value) = arg.strip_prefix("--admin-listen=") {
                return vec![loopback(value)];
            }
            if arg == "--admin-listen"
                && let Some(value) = pid1.get(i + 1)
            {
                return vec![loopback(value)];
            }
        }
    }
    if let Some(listen) = env.map(str::trim).filter(|l| !l.is_empty()) {
        return vec![loopback(listen)];
    }
    match default {
        Some(admin) => vec![admin.to_string()],
        None => DEFAULT_ADMIN.iter().map(|a| a.to_string()).collect(),
    }
}

/// A listen address as a place to connect to: the wildcard addresses mean this host.
fn loopback(listen: &str) -> String {
    if let Some(port) = listen.strip_prefix("0.0.0.0:") {
        format!("127.0.0.1:{port}")
    } else if let Some(port) = listen.strip_prefix("[::]:") {
        format!("[::1]:{port}")
    } else {
        listen.to_string()
    }
}

/// The HTTP status of `GET path` at `address`.
fn ask(address: &str, path: &str, timeout: Duration) -> anyhow::Result<u16> {
    let addrs: Vec<SocketAddr> = address
        .to_socket_addrs()
        .with_context(|| format!("{address:?} is not host:port"))?
        .collect();
    let addr = addrs
        .first()
        .with_context(|| format!("{address:?} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(addr, timeout).context("cannot connect")?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    // One write: a request in pieces may meet a server that answers after the first.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .context("cannot send the request")?;
    let mut head = Vec::new();
    stream
        .take(4096)
        .read_to_end(&mut head)
        .context("no answer")?;
    let text = String::from_utf8_lossy(&head);
    let status_line = text.lines().next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(status))) if version.starts_with("HTTP/") => Ok(status),
        _ => anyhow::bail!("not an HTTP answer: {status_line:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_container_program_decides_which_port() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let agent = argv(&["/usr/local/bin/hourglass-agent", "--server-name", "w"]);
        let agg = argv(&["hourglass-aggregator"]);
        // An agent next to an aggregator (host network) asks its own port only.
        assert_eq!(candidates(None, &agent, None), ["127.0.0.1:7711"]);
        assert_eq!(candidates(None, &agg, None), ["127.0.0.1:7701"]);
        let flagged = argv(&["hourglass-agent", "--admin-listen", "0.0.0.0:7799"]);
        assert_eq!(
            candidates(None, &flagged, Some("0.0.0.0:1")),
            ["127.0.0.1:7799"]
        );
        let flagged = argv(&["hourglass-aggregator", "--admin-listen=10.1.2.3:9"]);
        assert_eq!(candidates(None, &flagged, None), ["10.1.2.3:9"]);
        assert_eq!(candidates(None, &agent, Some("[::]:7")), ["[::1]:7"]);
        // The same programs run as subcommands of the multi-call binary.
        let sub = argv(&[
            "/usr/local/bin/hourglass",
            "agent",
            "--admin-listen=0.0.0.0:9",
        ]);
        assert_eq!(candidates(None, &sub, None), ["127.0.0.1:9"]);
        assert_eq!(
            candidates(None, &argv(&["hourglass", "aggregator"]), None),
            ["127.0.0.1:7701"]
        );
        // Not in a container of ours (PID 1 is an init): the env, else both defaults.
        let init = argv(&["/sbin/init"]);
        assert_eq!(candidates(None, &init, Some("0.0.0.0:5")), ["127.0.0.1:5"]);
        assert_eq!(candidates(None, &init, None), DEFAULT_ADMIN);
        assert_eq!(candidates(Some("h:1"), &agent, Some("x:2")), ["h:1"]);
    }

    #[test]
    fn wildcard_listen_addresses_mean_loopback() {
        assert_eq!(loopback("0.0.0.0:7701"), "127.0.0.1:7701");
        assert_eq!(loopback("[::]:7711"), "[::1]:7711");
        assert_eq!(loopback("10.0.0.5:7701"), "10.0.0.5:7701");
    }

    #[test]
    fn status_of_a_real_listener_and_errors_of_others() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            for status in ["200 OK", "503 Service Unavailable", "garbage"] {
                let (mut s, _) = listener.accept().unwrap();
                // The whole request, so closing leaves nothing unread (no reset).
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut buf).unwrap();
                    assert!(n > 0, "request cut short");
                    got.extend_from_slice(&buf[..n]);
                }
                let reply = if status == "garbage" {
                    "hello\r\n".to_string()
                } else {
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n")
                };
                s.write_all(reply.as_bytes()).unwrap();
            }
        });
        let t = Duration::from_secs(3);
        assert_eq!(ask(&address, "/healthz", t).unwrap(), 200);
        assert_eq!(ask(&address, "/healthz", t).unwrap(), 503);
        let e = ask(&address, "/healthz", t).unwrap_err().to_string();
        assert!(e.contains("not an HTTP answer"), "{e}");
        server.join().unwrap();
        let e = ask("not an address", "/healthz", t).unwrap_err();
        assert!(format!("{e:#}").contains("host:port"), "{e:#}");
    }
}
