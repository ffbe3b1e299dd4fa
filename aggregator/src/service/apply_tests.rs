//! The stream's apply path (`CollectorService::apply`): what an owner applying a message
//! of the stream stores, whenever it applies it.

use std::sync::Arc;
use std::time::Duration;

use hourglass_rpc::proto::v1;

use crate::config::LimitsConfig;
use crate::keys::Hour;
use crate::metrics::Metrics;
use crate::service::{CollectorService, HeldKey, held_versions};
use crate::store::{MemoryStore, SeriesName, Store};

/// A distinct sketch of a few items.
fn hll() -> Vec<u8> {
    let mut h = hourglass_sketch::hll::Hll::new(12).unwrap();
    for i in 0u32..50 {
        h.insert(&i.to_le_bytes());
    }
    h.encode()
}

/// The entry checks a push's hours against the clock *when it is pushed* (from the first
/// hour of the oldest day `retention.hourly` keeps, `accepted_from`), publishes it, and
/// acknowledges it once ONE owner confirms it holds it (`peer::held`). Every other owner
/// applies the very same message later — seconds later, or up to `cluster.max_age` (7 d)
/// later after a restart, a backlog, or a partition moving to it — through the single
/// aggregator's push path (`CollectorService::apply` → `push_inner` → `check_snapshot`),
/// which checks the hour *again against its own now*. Once the oldest accepted day has
/// moved on, that owner rejects the snapshot ("hour", counted and logged, the message
/// acknowledged as applied): its store lacks a push the cluster acknowledged, while the
/// owner that confirmed it rolled it into the day's rollup. The late owner is ready
/// (nothing is missing by its positions) and answers that day without it, naming nothing
/// missing. (The single aggregator's hour of margin in `accepted_from` covers a push
/// checked and stored by one process; a stream replay is up to `max_age` late.) The
/// series bound is already taken off the apply path for exactly this reason ("the
/// entry decided the bound, for all owners alike"); the hour window is not.
///
/// Here: a snapshot of the oldest hour the entry accepted one day ago (well within the
/// default `max_age` of 7 days), applied by an owner now.
#[tokio::test]
async fn an_owner_applying_a_published_push_later_stores_what_the_entry_accepted() {
    let retention = Duration::from_secs(3 * 86_400);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let owner = CollectorService::new(
        Arc::clone(&store),
        Arc::new(Metrics::new()),
        LimitsConfig::default(),
        retention,
    );
    let now = hourglass_rpc::time::since_unix_epoch().as_secs();
    let pushed_at = now - 86_400;
    let hour = crate::background::accepted_from(pushed_at, retention).0;
    // The premise: the entry accepted this hour when it was pushed, and it is outside the
    // hours accepted now.
    assert!(
        hour >= crate::background::accepted_from(pushed_at, retention).0
            && hour < crate::background::accepted_from(now, retention).0,
        "premise not reached: hour {hour} is still accepted now"
    );
    let push = v1::PushRequest {
        server: Some(v1::Server {
            name: "web-1".into(),
            labels: vec![],
        }),
        snapshots: vec![v1::Snapshot {
            series: Some(v1::Series {
                metric: "visits".into(),
                tags: vec![],
            }),
            hour,
            epoch: 1,
            version: 3,
            sketch: Some(v1::EncodedSketch {
                kind: v1::SketchKind::Distinct as i32,
                data: hll().into(),
            }),
        }],
        live_hours: vec![hour],
    };
    // What the apply loop does with the partition's message (apply.rs, `apply_one`).
    let applied = owner.apply(push);
    assert!(
        applied.is_ok(),
        "the apply loop would retry or refuse: {applied:?}"
    );
    let held = held_versions(
        store.as_ref(),
        "web-1",
        &[HeldKey {
            name: SeriesName::new("visits", vec![], hourglass_sketch::Kind::Distinct),
            hour: Hour(hour),
            epoch: 1,
        }],
    )
    .unwrap();
    assert_eq!(
        held,
        vec![Some(3)],
        "an owner applying the stream one day after the push (within cluster.max_age) \
         rejected the snapshot the entry accepted and the cluster acknowledged (hour {hour}, \
         now outside the hours accepted); its message counts as applied, so this owner is \
         ready and answers without it"
    );
}
