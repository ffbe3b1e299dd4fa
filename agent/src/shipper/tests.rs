//! The shipper against a scripted aggregator: a stale reply naming a later version, and an
//! outage longer than the backlog bound.

use super::*;
use crate::table::{IngestStats, Sent, lock};

/// A shipper of `table` whose channel is never used (it connects lazily).
fn shipper(table: &Arc<Mutex<Table>>, config: Arc<Config>) -> Shipper {
    shipper_in(table, config, PathBuf::from("unused"), "http://127.0.0.1:1")
}

/// A shipper of `table` checkpointing into `dir` and pushing to `url`.
pub(super) fn shipper_in(
    table: &Arc<Mutex<Table>>,
    config: Arc<Config>,
    dir: PathBuf,
    url: &str,
) -> Shipper {
    let channel = Channel::from_shared(url.to_string())
        .unwrap()
        .connect_lazy();
    Shipper::new(
        Arc::clone(table),
        Arc::new(Metrics::new()),
        config,
        dir,
        v1::Server {
            name: "web-1".into(),
            labels: Vec::new(),
        },
        channel,
        None,
    )
}

fn stale(held_version: u64) -> v1::SnapshotResult {
    v1::SnapshotResult {
        outcome: v1::PushOutcome::Stale as i32,
        held_version,
        reason: String::new(),
    }
}

#[tokio::test]
async fn a_stale_reply_naming_a_later_version_sends_the_entry_again() {
    let config = Arc::new(Config::default());
    let table = Arc::new(Mutex::new(Table::new(Arc::clone(&config), 7)));
    let now = unix_now();
    {
        let mut t = lock(&table);
        for metric in ["diverged", "plain"] {
            let id = t
                .resolve_statsd(metric, "", &mut IngestStats::default())
                .unwrap();
            t.insert(id, now, now, b"u1", 1).unwrap();
        }
        assert_eq!(t.assign_versions(), 2, "both at version 1");
        t.checkpointed();
    }
    let s = shipper(&table, config);
    let (keys, sent) = {
        let mut t = lock(&table);
        let keys = t.unacked();
        let (_, sent, _) = t.encode_batch(&keys, 0, usize::MAX, 1000);
        (keys, sent)
    };
    let diverged = keys
        .iter()
        .position(|&k| lock(&table).get(k).unwrap().0.to_string() == "diverged")
        .unwrap();
    // Two kinds an entry, so two results each. The aggregator holds version 5 of
    // "diverged" (sent before the checkpoint fell behind) and version 1 of "plain".
    let mut results = Vec::new();
    for (
        i,
        &Sent {
            version,
            snapshots: count,
            ..
        },
    ) in sent.iter().enumerate()
    {
        let held = if i == diverged { 5 } else { version };
        results.extend(std::iter::repeat_n(stale(held), count));
    }
    s.apply(&sent, &results).unwrap();
    assert_eq!(s.metrics.version_divergence.get(), 2);
    assert_eq!(s.metrics.snapshots_acked.get(), 4);

    let mut t = lock(&table);
    assert_eq!(
        t.last_version(),
        5,
        "continues above what the aggregator holds"
    );
    let entry = |t: &Table, i: usize| t.get(keys[i]).unwrap().1.clone();
    assert!(
        entry(&t, diverged).pending(),
        "the aggregator holds other content: this entry's must still reach it"
    );
    assert!(
        !entry(&t, 1 - diverged).pending(),
        "a plain stale reply acknowledges"
    );
    // The next flush gives it a version above the one held, and sends it.
    assert_eq!(t.assign_versions(), 1);
    t.checkpointed();
    assert_eq!(entry(&t, diverged).version, 6);
    assert_eq!(t.unacked(), vec![keys[diverged]]);
}

#[tokio::test]
async fn an_outage_longer_than_the_backlog_bound_drops_the_oldest_hours_counted() {
    let mut config = Config::default();
    config.shipping.max_backlog_mib = 1;
    let config = Arc::new(config);
    let table = Arc::new(Mutex::new(Table::new(Arc::clone(&config), 7)));
    let now_hour = (unix_now() / 3600) as u32;
    // Four closed hours of four series, never acknowledged: the aggregator is away.
    // A default entry (distinct + frequency) is about 100 KiB, so 16 are above 1 MiB.
    {
        let mut t = lock(&table);
        for back in (3..7).rev() {
            for m in ["a", "b", "c", "d"] {
                let id = t
                    .resolve_statsd(m, "", &mut IngestStats::default())
                    .unwrap();
                t.insert_at(id, now_hour - back, b"u1", 1);
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut s = shipper_in(
        &table,
        Arc::clone(&config),
        dir.path().into(),
        "http://127.0.0.1:1",
    );
    s.flush(true).await;
    let held = lock(&table).backlog();
    assert!(held.closed_bytes <= 1 << 20, "{held:?}");
    assert!(
        held.closed_bytes > (1 << 20) - 200 * 1024,
        "only what is over goes: {held:?}"
    );
    let dropped = s
        .metrics
        .snapshots_dropped
        .get_or_create(&ReasonLabel {
            reason: "backlog_full",
        })
        .get();
    assert_eq!(
        dropped,
        32 - held.snapshots,
        "every dropped snapshot is counted"
    );
    assert!(dropped > 0);
    {
        let t = lock(&table);
        assert!(
            t.entry("a", now_hour - 6).is_none(),
            "the oldest hour goes first"
        );
        assert!(t.entry("d", now_hour - 3).is_some(), "the newest stays");
    }
    assert!(s.backlog_episode.is_some(), "an episode of drops began");
    let text = s.metrics.encode();
    for want in [
        format!(r#"hourglass_agent_snapshots_dropped_total{{reason="backlog_full"}} {dropped}"#),
        format!("hourglass_agent_backlog_bytes {}", held.closed_bytes),
    ] {
        assert!(text.contains(&want), "{want} missing from\n{text}");
    }
    // Still away, nothing new: nothing more is dropped and the episode goes on.
    s.flush(true).await;
    assert_eq!(lock(&table).backlog(), held);
    assert!(s.backlog_episode.is_some());
}
