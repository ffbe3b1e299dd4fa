//! A full disk, for real: the test runs again in a child process whose file size limit
//! (RLIMIT_FSIZE) makes every write past it fail, as ENOSPC would.

use super::*;
use crate::table::{IngestStats, lock};
use hourglass_rpc::proto::v1::collector_server::{Collector, CollectorServer};
use std::sync::atomic::{AtomicBool, Ordering};

const CHILD: &str = "HOURGLASS_TEST_FULL_DISK_CHILD";
/// The file size limit in the child: room for a checkpoint of a few sparse sketches,
/// not for twenty dense ones.
const LIMIT: u64 = 128 << 10;

/// An aggregator that stores everything, or is away.
#[derive(Default, Clone)]
struct Recorder {
    away: Arc<AtomicBool>,
    stored: Arc<Mutex<Vec<(String, u32, u64)>>>,
}

#[tonic::async_trait]
impl Collector for Recorder {
    async fn push(
        &self,
        request: tonic::Request<v1::PushRequest>,
    ) -> Result<tonic::Response<v1::PushResponse>, tonic::Status> {
        if self.away.load(Ordering::SeqCst) {
            return Err(tonic::Status::unavailable("away"));
        }
        let mut stored = self.stored.lock().unwrap();
        let results = request
            .into_inner()
            .snapshots
            .into_iter()
            .map(|s| {
                let series = s.series.map(|s| s.metric).unwrap_or_default();
                stored.push((series, s.hour, s.version));
                v1::SnapshotResult {
                    outcome: v1::PushOutcome::Stored as i32,
                    held_version: s.version,
                    reason: String::new(),
                }
            })
            .collect();
        Ok(tonic::Response::new(v1::PushResponse { results }))
    }
}

/// Sets this process's soft file-size limit (`None`: unlimited).
fn set_file_size_limit(soft: Option<u64>) {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let limit = Rlimit {
        current: soft,
        maximum: None,
    };
    setrlimit(Resource::Fsize, limit).expect("setrlimit(RLIMIT_FSIZE)");
}

#[test]
#[allow(unsafe_code)] // pre_exec, and signal(2); see the SAFETY comment
fn a_full_disk_stops_new_versions_but_not_the_pushes_of_checkpointed_ones() {
    if std::env::var_os(CHILD).is_some() {
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(in_child());
    }
    let name = "shipper::full_disk::a_full_disk_stops_new_versions_but_not_the_pushes_of_checkpointed_ones";
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    // SAFETY: between fork and exec only async-signal-safe calls: setrlimit (a raw
    // system call through rustix) and signal.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            use rustix::process::{Resource, Rlimit, setrlimit};
            let limit = Rlimit {
                current: Some(LIMIT),
                maximum: None,
            };
            setrlimit(Resource::Fsize, limit)?;
            // Writes past the limit then fail with EFBIG instead of killing the process.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the child failed:\n{stdout}\n{stderr}"
    );
}

async fn in_child() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let aggregator = Recorder::default();
    let service = CollectorServer::new(aggregator.clone())
        .accept_compressed(CompressionEncoding::Zstd)
        .send_compressed(CompressionEncoding::Zstd);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    let config = Arc::new(Config {
        default_kinds: vec![hourglass_sketch::format::Kind::Distinct],
        ..Config::default()
    });
    let table = Arc::new(Mutex::new(Table::new(Arc::clone(&config), 7)));
    let now = unix_now();
    let add = |metric: &str, items: std::ops::Range<u32>| {
        let mut t = lock(&table);
        let id = t
            .resolve_statsd(metric, "", &mut IngestStats::default())
            .unwrap();
        for i in items {
            t.insert(id, now, now, format!("u{i}").as_bytes(), 1)
                .unwrap();
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let mut s = super::tests::shipper_in(&table, config, dir.path().to_path_buf(), &url);

    // 1. The aggregator is away; the checkpoint holds "a" and "b" at version 1.
    add("a", 0..10);
    add("b", 0..10);
    aggregator.away.store(true, Ordering::SeqCst);
    s.flush(true).await;
    assert_eq!(checkpoints(&s, "ok"), 1);
    assert!(aggregator.stored.lock().unwrap().is_empty());

    // 2. Twenty dense sketches later, the checkpoint no longer fits; "a" changed too.
    // The aggregator is back: what the checkpoint holds at version 1 goes, nothing else.
    add("a", 10..20);
    for m in 0..20 {
        add(&format!("big{m}"), 0..5000);
    }
    aggregator.away.store(false, Ordering::SeqCst);
    s.flush(true).await;
    assert_eq!(checkpoints(&s, "error"), 1, "the disk is full");
    let mut stored = aggregator.stored.lock().unwrap().clone();
    stored.sort();
    let hour = (now / 3600) as u32;
    assert_eq!(
        stored,
        [("a".to_string(), hour, 1), ("b".to_string(), hour, 1)],
        "only versions a checkpoint holds are pushed"
    );
    assert_eq!(s.metrics.snapshots_sent_checkpoint_failing.get(), 2);
    assert_eq!(lock(&table).backlog().awaiting_checkpoint, 21);
    s.metrics.set_table(&lock(&table).backlog(), &[]);
    let text = s.metrics.encode();
    for want in [
        "hourglass_agent_snapshots_sent_checkpoint_failing_total 2",
        "hourglass_agent_awaiting_checkpoint_entries 21",
        r#"hourglass_agent_checkpoints_total{outcome="error"} 1"#,
    ] {
        assert!(text.contains(want), "{want} missing from\n{text}");
    }
    // The failed append was cut back off: the files hold the first checkpoint whole.
    let loaded = checkpoint::read(dir.path()).unwrap().unwrap();
    assert_eq!((loaded.entries.len(), loaded.last_version), (2, 1));
    assert_eq!(loaded.torn_bytes, 0);

    // 3. Room again: the new versions are checkpointed, then pushed.
    set_file_size_limit(None);
    s.flush(true).await;
    assert_eq!(checkpoints(&s, "ok"), 2);
    let stored = aggregator.stored.lock().unwrap().clone();
    assert_eq!(stored.len(), 2 + 21);
    assert!(stored[2..].iter().all(|(_, _, v)| *v == 2), "{stored:?}");
    assert_eq!(lock(&table).backlog().awaiting_checkpoint, 0);
    assert_eq!(s.metrics.snapshots_sent_checkpoint_failing.get(), 2);
    let loaded = checkpoint::read(dir.path()).unwrap().unwrap();
    assert_eq!((loaded.entries.len(), loaded.last_version), (22, 2));
}

fn checkpoints(s: &Shipper, outcome: &'static str) -> u64 {
    s.metrics
        .checkpoints
        .get_or_create(&OutcomeLabel { outcome })
        .get()
}
