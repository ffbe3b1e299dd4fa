//! A real NATS JetStream cluster for cluster mode's tests: `nats-server` processes (the
//! pinned binary `scripts/nats-server` fetches) on loopback ports, with JetStream on,
//! `sync_interval: always`, and routes between all of them. No mock of NATS anywhere.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::util::{TempDir, free_port};

/// The nats-server binary, fetched once per test run by `scripts/nats-server`.
fn nats_server() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/nats-server");
        let out = Command::new(&script)
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/nats-server");
        assert!(
            out.status.success(),
            "scripts/nats-server failed ({}); it fetches the NATS server cluster mode's tests run",
            out.status
        );
        PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
    })
}

/// One NATS server of the cluster.
struct Node {
    name: String,
    client_port: u16,
    /// The monitoring port (`/jsz`, `/healthz`).
    http_port: u16,
    config: String,
    log: String,
    child: Option<Child>,
}

/// A NATS cluster of JetStream servers, all killed when dropped.
pub struct NatsCluster {
    nodes: Vec<Node>,
    _dir: TempDir,
}

impl NatsCluster {
    /// Starts `n` servers routed to each other and waits until each accepts clients.
    /// JetStream elects its meta leader by itself shortly after; the aggregators wait
    /// for it when they create the stream.
    ///
    /// The ports are free when chosen but may be taken before a server binds them (other
    /// tests pick ports at the same time): a server that exits for it is retried with a
    /// new set of ports.
    pub fn start(n: usize) -> NatsCluster {
        let mut failures = Vec::new();
        for _ in 0..3 {
            let mut cluster = NatsCluster::configure(n);
            match (0..n).try_for_each(|i| cluster.try_start_node(i)) {
                Ok(()) => return cluster,
                Err(e) => failures.push(e),
            }
        }
        panic!("the NATS cluster did not start:\n{}", failures.join("\n"))
    }

    /// `n` servers' configs on ports free now; none started.
    fn configure(n: usize) -> NatsCluster {
        let dir = TempDir::new("nats");
        let cluster_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let routes: Vec<String> = cluster_ports
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect();
        let mut nodes = Vec::new();
        for (i, cluster_port) in cluster_ports.iter().enumerate() {
            let name = format!("nats-{}", i + 1);
            let client_port = free_port();
            let http_port = free_port();
            let config = dir.file(&format!("{name}.conf"));
            std::fs::write(
                &config,
                format!(
                    "server_name: {name}\nlisten: 127.0.0.1:{client_port}\nhttp: 127.0.0.1:{http_port}\n\
                     jetstream {{ store_dir: \"{store}\", sync_interval: always }}\n\
                     cluster {{ name: hourglass-test, listen: 127.0.0.1:{cluster_port}, routes: [{routes}] }}\n",
                    store = dir.file(&name),
                    routes = routes.join(", "),
                ),
            )
            .expect("write the NATS config");
            nodes.push(Node {
                name,
                client_port,
                http_port,
                config,
                log: dir.file(&format!("nats-{}.log", i + 1)),
                child: None,
            });
        }
        NatsCluster { nodes, _dir: dir }
    }

    /// Starts node `i` (again, after [`Self::kill`]) with its store as it was left.
    pub fn start_node(&mut self, i: usize) {
        if let Err(e) = self.try_start_node(i) {
            panic!("{e}");
        }
    }

    /// [`Self::start_node`], or why the server did not come up (its log).
    fn try_start_node(&mut self, i: usize) -> Result<(), String> {
        let node = &mut self.nodes[i];
        assert!(node.child.is_none(), "{} is running", node.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .expect("open the NATS log");
        let child = Command::new(nats_server())
            .args(["-c", &node.config])
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start nats-server");
        node.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", node.client_port)).is_err() {
            let exited = node
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if exited || Instant::now() > deadline {
                if let Some(mut child) = node.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return Err(format!(
                    "{} did not listen; its log:\n{}",
                    node.name,
                    std::fs::read_to_string(&node.log).unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// SIGKILLs node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The index of the node that leads `stream` now, as the servers' monitoring
    /// endpoint (`/jsz`) reports it; asks each running node until one knows.
    pub fn stream_leader(&self, stream: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for node in self.nodes.iter().filter(|n| n.child.is_some()) {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], node.http_port));
                let (status, body) = crate::util::http_get(addr, "/jsz?accounts=true&streams=true");
                if status != 200 {
                    continue;
                }
                let json: serde_json::Value = serde_json::from_str(&body)
                    .or_else(|_| serde_json::from_str(&dechunk(&body)))
                    .unwrap_or_default();
                let leader = json["account_details"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|a| a["stream_detail"].as_array().into_iter().flatten())
                    .find(|s| s["name"] == stream)
                    .and_then(|s| s["cluster"]["leader"].as_str());
                if let Some(i) = leader.and_then(|l| self.nodes.iter().position(|n| n.name == l)) {
                    return i;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no node names a leader of {stream}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// How many messages `stream` holds now, as the first running node that knows the
    /// stream reports it on its monitoring endpoint (`/jsz`).
    pub fn stream_messages(&self, stream: &str) -> Option<u64> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .find_map(|node| {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], node.http_port));
                let (status, body) = crate::util::http_get(addr, "/jsz?accounts=true&streams=true");
                if status != 200 {
                    return None;
                }
                let json: serde_json::Value = serde_json::from_str(&body)
                    .or_else(|_| serde_json::from_str(&dechunk(&body)))
                    .unwrap_or_default();
                json["account_details"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|a| a["stream_detail"].as_array().into_iter().flatten())
                    .find(|s| s["name"] == stream)
                    .and_then(|s| s["state"]["messages"].as_u64())
            })
    }

    /// Every node's client URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.client_port))
            .collect()
    }
}

/// The body of a chunked HTTP/1.1 response (`http_get` keeps the chunk sizes).
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

impl NatsCluster {
    /// Stops (`stop` true, SIGSTOP) or resumes (SIGCONT) node `i`: a stopped server keeps
    /// its clients' TCP connections open but answers nothing, as behind a network
    /// partition. By the system call: a new machine need not have a `kill` program.
    pub fn pause(&self, i: usize, stop: bool) {
        use rustix::process::{Pid, Signal, kill_process};
        if let Some(child) = &self.nodes[i].child {
            let pid = i32::try_from(child.id())
                .ok()
                .and_then(Pid::from_raw)
                .expect("a positive pid");
            let signal = if stop { Signal::STOP } else { Signal::CONT };
            kill_process(pid, signal)
                .unwrap_or_else(|e| panic!("{signal:?} {}: {e}", self.nodes[i].name));
        }
    }
}
