//! Helpers for running the real `hourglass` binary, and the servers built into it.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// What a finished command left behind.
pub struct Run {
    pub status: std::process::ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Run {
    /// The exit was zero; panics with stderr otherwise.
    pub fn ok(self) -> Run {
        assert!(self.status.success(), "command failed: {}", self.stderr);
        self
    }

    /// stdout as UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8(self.stdout.clone()).expect("stdout is UTF-8")
    }

    /// stdout parsed as one JSON value.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.stdout)
            )
        })
    }
}

/// Runs `hourglass ARGS` with `stdin` as its standard input.
pub fn hourglass(args: &[&str], stdin: &[u8]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hourglass");
    let mut input = child.stdin.take().expect("stdin is piped");
    let stdin = stdin.to_vec();
    // Written from a thread so a large input cannot deadlock against a full stdout pipe.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("wait for hourglass");
    writer.join().expect("stdin writer");
    Run {
        status,
        stdout,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// A fresh temporary directory (`tempfile`), removed when dropped.
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        TempDir(
            tempfile::Builder::new()
                .prefix(&format!("hourglass-test-{name}-"))
                .tempdir()
                .expect("create temp dir"),
        )
    }

    /// A path inside the directory, as a string for command lines.
    pub fn file(&self, name: &str) -> String {
        self.0.path().join(name).to_string_lossy().into_owned()
    }
}

/// A gRPC channel to `url`, connected.
pub async fn channel(url: &str) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(url.to_string())
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

/// A single-threaded runtime, for the async calls of a test that is not async itself.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A free loopback port: bound and released, for a process started later.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Seconds since 1970, now.
pub fn now_secs() -> i64 {
    hourglass_rpc::time::unix_now()
}

/// `n` lines `prefix0`, `prefix1`, … as stdin bytes.
pub fn lines(prefix: &str, range: std::ops::Range<u64>) -> Vec<u8> {
    let mut out = Vec::new();
    for i in range {
        writeln!(out, "{prefix}{i}").expect("write to Vec");
    }
    out
}

/// The program `name` (`hourglass-agent`, `hourglass-aggregator`) as the container image
/// ships it: a link of that name to the `hourglass` binary, which runs the program it is
/// called as. The links live in this test target's scratch directory; nothing is built.
pub fn server_binary(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bin");
    let link = dir.join(name);
    static LINKS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = LINKS.lock().unwrap_or_else(|e| e.into_inner());
    let target = PathBuf::from(env!("CARGO_BIN_EXE_hourglass"));
    if std::fs::read_link(&link).ok().as_ref() != Some(&target) {
        std::fs::create_dir_all(&dir).expect("create the links' directory");
        // Made beside and renamed over: another test process may be using the link.
        let fresh = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&fresh);
        std::os::unix::fs::symlink(&target, &fresh).expect("link the program");
        std::fs::rename(&fresh, &link).expect("put the link in place");
    }
    link
}

/// Sends SIGTERM to process `pid`, by the system call: a new machine need not have a
/// `kill` program (Debian's minimal install has none; it comes with procps).
pub fn sigterm(pid: u32) {
    use rustix::process::{Pid, Signal, kill_process};
    let target = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .expect("a positive pid that fits pid_t");
    if let Err(e) = kill_process(target, Signal::TERM) {
        panic!("kill -TERM {pid}: {e}");
    }
}

/// A running service process (aggregator or agent), killed (SIGKILL) when dropped.
pub struct ServiceProcess {
    child: std::process::Child,
    what: &'static str,
    /// The addresses it announced on stderr (`NAME listening on ADDR`), by NAME.
    addrs: std::collections::HashMap<String, String>,
    /// Everything the process wrote to stdout (its logs), for failure messages.
    logs: std::sync::Arc<std::sync::Mutex<String>>,
}

impl ServiceProcess {
    /// Starts `binary ARGS` and waits until it announced `NAME listening on ADDR` for every
    /// name of `announces`.
    pub fn start(
        what: &'static str,
        binary: PathBuf,
        args: &[&str],
        announces: &[&str],
    ) -> ServiceProcess {
        ServiceProcess::start_with_env(what, binary, args, announces, &[])
    }

    /// Like [`ServiceProcess::start`], with extra environment variables.
    pub fn start_with_env(
        what: &'static str,
        binary: PathBuf,
        args: &[&str],
        announces: &[&str],
        env: &[(&str, &str)],
    ) -> ServiceProcess {
        use std::io::BufRead;
        let mut child = Command::new(binary)
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        // Both pipes are drained from threads, so a chatty process never blocks on a
        // full pipe.
        let logs = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let sink = std::sync::Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let mut logs = sink.lock().expect("log buffer");
                logs.push_str(&line);
                logs.push('\n');
            }
        });
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let mut addrs = std::collections::HashMap::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut seen = String::new();
        while announces.iter().any(|n| !addrs.contains_key(*n)) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{what} did not announce its ports; stderr:\n{seen}\nlogs:\n{}",
                    logs.lock().expect("log buffer")
                );
            };
            seen.push_str(&line);
            seen.push('\n');
            if let Some((name, addr)) = line.split_once(" listening on ") {
                addrs.insert(name.to_string(), addr.trim().to_string());
            }
        }
        ServiceProcess {
            child,
            what,
            addrs,
            logs,
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The address announced for `name`.
    pub fn addr(&self, name: &str) -> String {
        self.addrs[name].clone()
    }

    /// Kills the process with SIGKILL, as a crash would, and waits for it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits up to 30 s for the process to exit; returns its status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        sigterm(self.child.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the process") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} still running 30 s after SIGTERM; logs:\n{}",
                self.what,
                self.logs()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Its logs so far.
    pub fn logs(&self) -> String {
        self.logs.lock().expect("log buffer").clone()
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `hourglass-aggregator` on free loopback ports.
pub struct AggregatorProcess {
    process: ServiceProcess,
    /// The gRPC address as a URL, `http://127.0.0.1:PORT`.
    pub grpc: String,
    /// The admin HTTP address.
    pub admin: std::net::SocketAddr,
    /// The HTTP port (the JSON API and the dashboard) as a URL, `http://127.0.0.1:PORT`;
    /// empty when started with `--http-listen off`.
    pub http: String,
}

impl AggregatorProcess {
    /// Starts the aggregator on free ports with its data in `data_dir`, plus `extra`
    /// arguments, and waits until it announces its ports on stderr (the HTTP port on a
    /// free port too, unless `extra` has `--http-listen`).
    pub fn start(data_dir: &str, extra: &[&str]) -> AggregatorProcess {
        AggregatorProcess::start_on("127.0.0.1:0", data_dir, extra)
    }

    /// Like [`AggregatorProcess::start`], with gRPC on `listen`.
    pub fn start_on(listen: &str, data_dir: &str, extra: &[&str]) -> AggregatorProcess {
        AggregatorProcess::start_with_env(listen, data_dir, extra, &[])
    }

    /// Like [`AggregatorProcess::start_on`], with extra environment variables.
    pub fn start_with_env(
        listen: &str,
        data_dir: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> AggregatorProcess {
        let mut args = vec![
            "--listen",
            listen,
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir,
        ];
        let http = extra
            .iter()
            .position(|a| *a == "--http-listen")
            .map(|i| extra[i + 1]);
        if http.is_none() {
            args.extend_from_slice(&["--http-listen", "127.0.0.1:0"]);
        }
        args.extend_from_slice(extra);
        let announces: &[&str] = if http == Some("off") {
            &["grpc", "admin"]
        } else {
            &["grpc", "admin", "http"]
        };
        let process = ServiceProcess::start_with_env(
            "aggregator",
            server_binary("hourglass-aggregator"),
            &args,
            announces,
            env,
        );
        AggregatorProcess {
            grpc: format!("http://{}", process.addr("grpc")),
            admin: process.addr("admin").parse().expect("admin address"),
            http: process
                .addrs
                .get("http")
                .map(|a| format!("http://{a}"))
                .unwrap_or_default(),
            process,
        }
    }

    /// Kills the process with SIGKILL, as a crash would, and waits for it.
    pub fn kill(self) {
        self.process.kill();
    }

    /// Sends SIGTERM and waits up to 30 s for the process to exit; returns its status.
    pub fn terminate(self) -> std::process::ExitStatus {
        self.process.terminate()
    }

    /// Its logs so far.
    pub fn logs(&self) -> String {
        self.process.logs()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// A running `hourglass-agent` on free loopback ports.
pub struct AgentProcess {
    process: ServiceProcess,
    /// The Ingest address as a URL.
    pub ingest: String,
    /// The DogStatsD UDP address.
    pub statsd: std::net::SocketAddr,
    /// The admin HTTP address.
    pub admin: std::net::SocketAddr,
}

impl AgentProcess {
    /// Starts an agent named `name` shipping to `aggregator` (a URL, need not be up), with
    /// its checkpoint in `data_dir`, plus `extra` arguments.
    pub fn start(name: &str, aggregator: &str, data_dir: &str, extra: &[&str]) -> AgentProcess {
        let mut args = vec![
            "--server-name",
            name,
            "--aggregator",
            aggregator,
            "--statsd-listen",
            "127.0.0.1:0",
            "--ingest-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir,
        ];
        args.extend_from_slice(extra);
        let process = ServiceProcess::start(
            "agent",
            server_binary("hourglass-agent"),
            &args,
            &["statsd", "ingest", "admin"],
        );
        AgentProcess {
            ingest: format!("http://{}", process.addr("ingest")),
            statsd: process.addr("statsd").parse().expect("statsd address"),
            admin: process.addr("admin").parse().expect("admin address"),
            process,
        }
    }

    /// Kills the process with SIGKILL, as a crash would, and waits for it.
    pub fn kill(self) {
        self.process.kill();
    }

    /// Sends SIGTERM and waits up to 30 s for the process to exit; returns its status.
    pub fn terminate(self) -> std::process::ExitStatus {
        self.process.terminate()
    }

    /// Its logs so far.
    pub fn logs(&self) -> String {
        self.process.logs()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The value of one un-labelled metric on `/metrics` (`name` without the prefix's
    /// `hourglass_agent_`), or of a labelled one when `name` includes the labels.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = http_get(self.admin, "/metrics");
        let full = format!("hourglass_agent_{name} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&full))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

/// A server run inside this test process, as mini-redis's tests run theirs: on a tokio
/// runtime of its own in a thread, listening on `127.0.0.1:0`. Dropping it completes the
/// server's shutdown future (it drains and closes its store or checkpoint, as on SIGTERM)
/// and joins the thread; an error or panic of the server then fails the test. Tests that
/// need a real process (SIGKILL, a crash, flags, logs) use [`ServiceProcess`] instead.
pub struct ServerThread {
    what: &'static str,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl ServerThread {
    /// Runs `serve(ready, shutdown)` on the server's thread: it binds its listeners, sends
    /// what the test needs of them (addresses) on `ready`, and serves until `shutdown`.
    fn start<T, F, Fut>(what: &'static str, serve: F) -> (ServerThread, T)
    where
        T: Send + 'static,
        F: FnOnce(std::sync::mpsc::SyncSender<T>, ShutdownSignal) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(what.to_string())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| format!("runtime: {e}"))?;
                let shutdown: ShutdownSignal = Box::pin(async move {
                    let _ = stopped.await;
                });
                let served = runtime.block_on(serve(ready_tx, shutdown));
                // Said at once: a test that meets the closed ports (a reset) panics with
                // that, and the join that would report this error never comes.
                if let Err(e) = &served {
                    eprintln!("{what} stopped with an error: {e}");
                }
                served
            })
            .expect("spawn the server thread");
        let ready = match ready_rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(ready) => ready,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                // Not joined: a server that gets going later would serve on and the join
                // never return. Told to stop, it ends on its own if it ever starts.
                let _ = stop.send(());
                panic!("{what} was not ready within 60 s");
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match thread.join() {
                Ok(Err(e)) => panic!("{what} did not start: {e}"),
                Ok(Ok(())) => panic!("{what} stopped before it was ready"),
                Err(_) => panic!("{what} panicked while starting"),
            },
        };
        let server = ServerThread {
            what,
            stop: Some(stop),
            thread: Some(thread),
        };
        (server, ready)
    }
}

impl ServerThread {
    /// Stops the server and waits for it from an async test. The wait runs off the test's
    /// runtime, which must stay free: the server's graceful drain needs the test's client
    /// connections (tasks of that runtime) to answer its closing handshake.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let thread = self.thread.take().expect("a running server");
        let result = tokio::task::spawn_blocking(move || thread.join())
            .await
            .expect("join the server thread");
        check_stopped(self.what, result);
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(thread) = self.thread.take() else {
            return;
        };
        if std::thread::panicking() {
            return; // the test already fails; the thread ends on its own
        }
        assert!(
            tokio::runtime::Handle::try_current().is_err(),
            "{}: an async test ends an in-process server with `.stop().await` (a join here \
             would block the runtime its clients' connections need to close)",
            self.what
        );
        check_stopped(self.what, thread.join());
    }
}

/// Fails the test if the server stopped with an error or a panic.
fn check_stopped(what: &str, result: std::thread::Result<Result<(), String>>) {
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{what} stopped with an error: {e}"),
        Err(_) => panic!("{what} panicked"),
    }
}

/// What an in-process server waits on to shut down.
type ShutdownSignal = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Binds `127.0.0.1:0` for a server in this process.
async fn bind_loopback() -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind 127.0.0.1:0: {e}"))
}

/// An aggregator in this test process ([`ServerThread`]): `hourglass_aggregator::run`.
pub struct InProcessAggregator {
    server: ServerThread,
    /// The gRPC address as a URL, `http://127.0.0.1:PORT`.
    pub grpc: String,
    /// The admin HTTP address.
    pub admin: std::net::SocketAddr,
    /// The HTTP port (the JSON API and the dashboard) as a URL, `http://127.0.0.1:PORT`.
    pub http: String,
}

impl InProcessAggregator {
    /// Starts an aggregator with the default configuration and its data in `data_dir`.
    pub fn start(data_dir: &str) -> InProcessAggregator {
        InProcessAggregator::start_with(hourglass_aggregator::Config {
            data_dir: data_dir.into(),
            ..Default::default()
        })
    }

    /// Starts an aggregator with the config file at `config` (as `--config` reads it) and
    /// its data in `data_dir`.
    pub fn start_from_file(data_dir: &str, config: &str) -> InProcessAggregator {
        let mut config = hourglass_aggregator::Config::from_file(std::path::Path::new(config))
            .expect("read the aggregator's config file");
        config.data_dir = data_dir.into();
        InProcessAggregator::start_with(config)
    }

    /// Starts an aggregator with `config`.
    pub fn start_with(config: hourglass_aggregator::Config) -> InProcessAggregator {
        let (server, (grpc, admin, http)) =
            ServerThread::start("aggregator", |ready, shutdown| async move {
                // Opened first, as the program does: a bad config or a held data dir is the
                // start's error, not a connection refused later.
                let aggregator =
                    hourglass_aggregator::Aggregator::open(config).map_err(|e| format!("{e:#}"))?;
                let grpc = bind_loopback().await?;
                let admin = bind_loopback().await?;
                let http = bind_loopback().await?;
                let addrs = (
                    grpc.local_addr().map_err(|e| e.to_string())?,
                    admin.local_addr().map_err(|e| e.to_string())?,
                    http.local_addr().map_err(|e| e.to_string())?,
                );
                let _ = ready.send(addrs);
                let listeners = hourglass_aggregator::Listeners {
                    grpc,
                    admin,
                    grpc_tls: None,
                };
                aggregator
                    .with_http(Some(http))
                    .serve(listeners, shutdown)
                    .await
                    .map_err(|e| format!("{e:#}"))
            });
        InProcessAggregator {
            server,
            grpc: format!("http://{grpc}"),
            admin,
            http: format!("http://{http}"),
        }
    }

    /// Stops it from an async test ([`ServerThread::stop`]).
    pub async fn stop(self) {
        self.server.stop().await;
    }
}

/// Where a running aggregator answers, whether it runs as a process or in this one.
pub trait AggregatorAddrs {
    /// The gRPC address as a URL.
    fn grpc(&self) -> &str;
    /// The admin HTTP address.
    fn admin(&self) -> std::net::SocketAddr;
    /// The HTTP port (API and dashboard) as a URL; empty when it is off.
    fn http(&self) -> &str;
}

impl AggregatorAddrs for AggregatorProcess {
    fn grpc(&self) -> &str {
        &self.grpc
    }
    fn admin(&self) -> std::net::SocketAddr {
        self.admin
    }
    fn http(&self) -> &str {
        &self.http
    }
}

impl AggregatorAddrs for InProcessAggregator {
    fn grpc(&self) -> &str {
        &self.grpc
    }
    fn admin(&self) -> std::net::SocketAddr {
        self.admin
    }
    fn http(&self) -> &str {
        &self.http
    }
}

/// A minimal HTTP/1.1 GET: returns the status code and the body.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to admin port");
    stream
        // Generous: under the whole suite's load on 2 cores, 10 s was once too short.
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("set read timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or((response.as_str(), ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {head}"));
    // Chunked bodies keep their chunk sizes; the tests only look for lines inside them.
    (status, body.to_string())
}

/// An HTTP response, read whole.
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// The header fields, names in lower case, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl HttpReply {
    /// The value of header `name` (lower case), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON; panics with the body if it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}), status {}: {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// One HTTP/1.1 request (`Connection: close`) to `url` (`http://HOST:PORT/PATH?QUERY`
/// or `https://…`, the latter over `tls`), with extra `headers`; the whole response, or
/// the I/O error (a refused connection or handshake).
pub fn http_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> std::io::Result<HttpReply> {
    use std::io::Read;
    let (https, rest) = match url.split_once("://") {
        Some(("https", rest)) => (true, rest),
        Some(("http", rest)) => (false, rest),
        _ => panic!("{url}: not an http:// or https:// URL"),
    };
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let tcp = std::net::TcpStream::connect(host)?;
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request += &format!("{name}: {value}\r\n");
    }
    request += "\r\n";
    let mut raw = Vec::new();
    if https {
        let config = tls.expect("an https:// URL needs a TLS client configuration");
        let ip = host.rsplit_once(':').map_or(host, |(ip, _)| ip).to_string();
        let name = rustls_pki_types::ServerName::try_from(ip).expect("a server name");
        let connection =
            rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
        let mut stream = rustls::StreamOwned::new(connection, tcp);
        stream.write_all(request.as_bytes())?;
        match stream.read_to_end(&mut raw) {
            Ok(_) => {}
            // A server that closes without TLS's close_notify: the response is whole when
            // its length says so, which the parse below checks.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
            Err(e) => return Err(e),
        }
    } else {
        let mut stream = tcp;
        stream.write_all(request.as_bytes())?;
        stream.read_to_end(&mut raw)?;
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {raw:?}")))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {head}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let reply = HttpReply {
        status,
        headers,
        body: Vec::new(),
    };
    if reply.header("transfer-encoding") == Some("chunked") {
        body = dechunk(&body);
    } else if let Some(length) = reply.header("content-length") {
        let length: usize = length.parse().expect("a content length");
        assert!(
            body.len() >= length,
            "{url}: {} bytes of a {length}-byte body",
            body.len()
        );
        body.truncate(length);
    }
    Ok(HttpReply { body, ..reply })
}

/// A chunked body's data.
fn dechunk(mut chunked: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = chunked
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size = std::str::from_utf8(&chunked[..line_end]).expect("a chunk size");
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .expect("a hex chunk size");
        if size == 0 {
            return body;
        }
        let data = &chunked[line_end + 2..];
        body.extend_from_slice(&data[..size]);
        chunked = &data[size + 2..];
    }
}

/// The current UTC hour, as hours since 1970.
pub fn this_hour() -> u32 {
    hourglass_rpc::time::hour_of(now_secs()).expect("the current hour fits u32")
}

/// An epoch-1 snapshot of the encoded sketch `data` of `kind` for `metric` (no tags) at
/// `hour`, at `version`.
pub fn snapshot(
    metric: &str,
    hour: u32,
    version: u64,
    kind: hourglass_rpc::proto::v1::SketchKind,
    data: Vec<u8>,
) -> hourglass_rpc::proto::v1::Snapshot {
    use hourglass_rpc::proto::v1;
    v1::Snapshot {
        series: Some(v1::Series {
            metric: metric.into(),
            tags: vec![],
        }),
        hour,
        epoch: 1,
        version,
        sketch: Some(v1::EncodedSketch {
            kind: kind as i32,
            data: data.into(),
        }),
    }
}

/// A push from `server` of one single-item distinct sketch for each of `metrics`, in
/// the current hour: for tests of the series bound.
pub fn push_of_metrics(server: &str, metrics: &[&str]) -> hourglass_rpc::proto::v1::PushRequest {
    let mut request = one_item_push(server, "m", b"x");
    let template = request.snapshots.pop().expect("one snapshot");
    for metric in metrics {
        let mut s = template.clone();
        s.series.as_mut().expect("a series").metric = (*metric).into();
        request.snapshots.push(s);
    }
    request
}

/// A push from `server` of one distinct sketch holding `item`, for `metric` in the current
/// hour (declared live): the smallest real push, for tests of who may push what.
pub fn one_item_push(
    server: &str,
    metric: &str,
    item: &[u8],
) -> hourglass_rpc::proto::v1::PushRequest {
    use hourglass_rpc::proto::v1;
    let mut hll = hourglass_sketch::hll::Hll::new(12).expect("precision 12");
    hll.insert(item);
    let hour = this_hour();
    v1::PushRequest {
        server: Some(v1::Server {
            name: server.into(),
            labels: vec![],
        }),
        snapshots: vec![snapshot(
            metric,
            hour,
            1,
            v1::SketchKind::Distinct,
            hll.encode(),
        )],
        live_hours: vec![hour],
    }
}
