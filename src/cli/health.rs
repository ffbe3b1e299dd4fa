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
pub struct HealthArgs {
    /// The admin address (`host:port`) of an aggregator or agent. Default: the address in
    /// HOURGLASS_ADMIN_LISTEN (as both servers read it; 0.0.0.0 and [::] mean loopback),
    /// else 127.0.0.1:7701 (the aggregator's default), then 127.0.0.1:7711 (the agent's).
    #[arg(long)]
    admin: Option<String>,
    /// The path to ask: `/healthz` (the process serves) or `/readyz` (it is ready for
    /// traffic: the aggregator's store is open, the agent's checkpoint loaded).
    #[arg(long, default_value = "/healthz")]
    path: String,
    /// How long to wait for an answer.
    #[arg(long, default_value = "3s", value_parser = hourglass::time::parse_duration)]
    timeout: Duration,
}

pub fn run(args: HealthArgs) -> anyhow::Result<()> {
    let candidates: Vec<String> = match (&args.admin, std::env::var("HOURGLASS_ADMIN_LISTEN")) {
        (Some(admin), _) => vec![admin.clone()],
        (None, Ok(listen)) if !listen.trim().is_empty() => vec![loopback(listen.trim())],
        _ => DEFAULT_ADMIN.iter().map(|a| a.to_string()).collect(),
    };
    let mut failures = Vec::new();
    for address in &candidates {
        match ask(address, &args.path, args.timeout) {
            Ok(status) if status == 200 => {
                println!("{address}{}: healthy (HTTP 200)", args.path);
                return Ok(());
            }
            Ok(status) => failures.push(format!("{address}{}: HTTP {status}", args.path)),
            Err(e) => failures.push(format!("{address}{}: {e:#}", args.path)),
        }
    }
    anyhow::bail!("not healthy: {}", failures.join("; "))
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
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
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
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).unwrap();
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
