//! The frames a checkpoint encodes and keeps (`Entry.frames`) for the push of the same
//! flush. A push always sends the sketches as they are at push time, under the version
//! the last successful checkpoint holds; the checkpoint holds the sketches as they were
//! when it was written.

use std::sync::{Arc, Mutex};

use hourglass_rpc::proto::v1;
use hourglass_sketch::Sketch;
use hourglass_sketch::format::Kind;

use super::{Writer, read};
use crate::config::Config;
use crate::table::{Key, MAX_FRAMES_KEPT, Table, lock};

const NOW: i64 = 1_764_000_000;
const HOUR: u32 = (NOW / 3600) as u32;

fn config() -> Config {
    let mut c = Config {
        default_kinds: vec![Kind::Distinct, Kind::Frequency, Kind::Membership],
        ..Config::default()
    };
    c.defaults.capacity = 2000;
    c
}

fn add(table: &Mutex<Table>, metric: &str, items: &[&str]) {
    let mut t = lock(table);
    let id = t
        .resolve_statsd(metric, "", &mut Default::default())
        .unwrap();
    let run: Vec<(&[u8], u64)> = items.iter().map(|i| (i.as_bytes(), 1)).collect();
    t.insert_run(id, HOUR, &run);
}

fn key_of(table: &Mutex<Table>, metric: &str) -> Key {
    let t = lock(table);
    t.keys()
        .into_iter()
        .find(|k| t.get(*k).unwrap().0.to_string() == metric)
        .unwrap()
}

/// (kind, data) of each snapshot of a key.
type Sent = Vec<(i32, Vec<u8>)>;

/// What a push of `keys` sends, per key: (kind, data) of each snapshot, and its version.
fn push(table: &Mutex<Table>, keys: &[Key]) -> Vec<(Key, u64, Sent)> {
    let mut t = lock(table);
    let (snaps, sent, next) = t.encode_batch(keys, 0, usize::MAX, usize::MAX);
    assert_eq!(next, keys.len());
    let mut out = Vec::new();
    let mut at = 0;
    for s in sent {
        let group: Vec<(i32, Vec<u8>)> = snaps[at..at + s.snapshots]
            .iter()
            .map(|snap| {
                assert_eq!(snap.version, s.version);
                let sk = snap.sketch.as_ref().unwrap();
                (sk.kind, sk.data.to_vec())
            })
            .collect();
        at += s.snapshots;
        out.push((s.key, s.version, group));
    }
    assert_eq!(at, snaps.len());
    out
}

/// The sketches of `key` as they are now, as a push must send them.
fn now(table: &Mutex<Table>, key: Key) -> (u64, Vec<(i32, Vec<u8>)>) {
    let t = lock(table);
    let (_, e) = t.get(key).unwrap();
    (
        e.saved.durable,
        e.sketches
            .iter()
            .map(|s| (v1::SketchKind::from(s.kind()) as i32, s.encode()))
            .collect(),
    )
}

/// Every pushed snapshot is the current sketch of its kind, and each data frame decodes
/// to the kind its snapshot names (no zip/order mismatch).
fn assert_push_is_current(table: &Mutex<Table>, what: &str) {
    let keys = lock(table).unacked();
    assert!(!keys.is_empty(), "{what}: nothing to push");
    let expected: Vec<_> = keys.iter().map(|&k| now(table, k)).collect();
    let pushed = push(table, &keys);
    for ((key, version, group), (durable, current)) in pushed.iter().zip(expected) {
        assert_eq!(*version, durable, "{what}: {key:?} version");
        assert_eq!(group.len(), current.len(), "{what}: {key:?} snapshot count");
        for ((kind, data), (ckind, cdata)) in group.iter().zip(current.iter()) {
            let decoded = Sketch::decode(data).unwrap();
            assert_eq!(
                v1::SketchKind::from(decoded.kind()) as i32,
                *kind,
                "{what}: {key:?} data of another kind than its snapshot says"
            );
            assert_eq!(kind, ckind, "{what}: {key:?} kind order");
            assert!(
                data == cdata,
                "{what}: {key:?} a stale {kind} frame was pushed ({} bytes, now {} bytes)",
                data.len(),
                cdata.len()
            );
        }
    }
}

fn fresh() -> (tempfile::TempDir, Mutex<Table>, Writer) {
    let dir = tempfile::tempdir().unwrap();
    let table = Mutex::new(Table::new(Arc::new(config()), 5));
    let writer = Writer::new(dir.path(), "web-1");
    (dir, table, writer)
}

/// Two checkpoints before a push, with the sketches changed after each, and again after
/// the second: the push sends the sketches as they are at push time.
#[test]
fn two_checkpoints_with_changes_then_a_push_sends_the_current_sketches() {
    let (_dir, table, mut writer) = fresh();
    add(&table, "a", &["1", "2"]);
    add(&table, "b", &["1"]);
    lock(&table).assign_versions();
    writer.write(&table).unwrap(); // base: keeps frames
    add(&table, "a", &["3"]);
    lock(&table).assign_versions();
    writer.write(&table).unwrap(); // transaction: keeps frames of `a` again
    add(&table, "a", &["4", "5"]);
    add(&table, "b", &["9"]);
    assert_push_is_current(&table, "changed after both checkpoints");

    // A second flush: unchanged entries whose frames the first push took.
    lock(&table).drop_frames();
    lock(&table).assign_versions();
    writer.write(&table).unwrap();
    assert_push_is_current(&table, "next flush");
}

/// Two checkpoints without a change in between (the second writes no sketches) and no
/// push: the frames kept by the first are still the sketches; after a change they are
/// not used.
#[test]
fn frames_kept_across_checkpoints_without_a_push_are_current_or_unused() {
    let (_dir, table, mut writer) = fresh();
    add(&table, "a", &["1"]);
    lock(&table).assign_versions();
    writer.write(&table).unwrap();
    // A flush without a push would drop_frames; a given-up flush might not: keep them.
    writer.write(&table).unwrap();
    assert_push_is_current(&table, "unchanged across two checkpoints");
    writer.write(&table).unwrap();
    add(&table, "a", &["2"]);
    lock(&table).assign_versions();
    writer.write(&table).unwrap();
    add(&table, "a", &["3"]);
    assert_push_is_current(&table, "changed after kept frames");
}

/// A failed push (its snapshots thrown away) then a change: the retry sends the current
/// sketches; without a change, the same sketches again.
#[test]
fn a_retry_after_a_failed_push_sends_the_current_sketches() {
    let (_dir, table, mut writer) = fresh();
    add(&table, "a", &["1", "2", "3"]);
    add(&table, "b", &["x"]);
    lock(&table).assign_versions();
    writer.write(&table).unwrap();
    let keys = lock(&table).unacked();
    let first = push(&table, &keys); // failed: nothing acknowledged
    let again = push(&table, &keys);
    assert_eq!(first, again, "a retry without a change sends the same");
    add(&table, "a", &["4"]);
    assert_push_is_current(&table, "retry after a change");
    // A partial push (byte bound) and the rest after a change.
    lock(&table).drop_frames();
    lock(&table).assign_versions();
    writer.write(&table).unwrap();
    let keys = lock(&table).unacked();
    let (_, sent, next) = lock(&table).encode_batch(&keys, 0, 1, usize::MAX);
    assert_eq!(sent.len(), 1);
    assert!(next < keys.len());
    add(&table, "b", &["y"]);
    add(&table, "a", &["5"]);
    assert_push_is_current(&table, "rest of a partial push after a change");
}

/// A table restored from the checkpoint pushes the sketches it restored, and after a
/// checkpoint and a change, the changed sketches; the checkpoint reads back the same.
#[test]
fn a_restored_table_pushes_what_it_restored_then_what_changed() {
    let (dir, table, mut writer) = fresh();
    add(&table, "a", &["1", "2"]);
    add(&table, "b", &["7"]);
    lock(&table).assign_versions();
    writer.write(&table).unwrap();
    let held: Vec<Vec<Vec<u8>>> = {
        let t = lock(&table);
        let mut keys = t.keys();
        keys.sort_by_key(|k| t.get(*k).unwrap().0.to_string());
        keys.iter()
            .map(|k| {
                t.get(*k)
                    .unwrap()
                    .1
                    .sketches
                    .iter()
                    .map(Sketch::encode)
                    .collect()
            })
            .collect()
    };
    let loaded = read(dir.path()).unwrap().unwrap();
    let mut restored: Vec<(String, Vec<Vec<u8>>)> = loaded
        .entries
        .iter()
        .map(|e| {
            (
                e.series.to_string(),
                e.entry.sketches.iter().map(Sketch::encode).collect(),
            )
        })
        .collect();
    restored.sort();
    assert_eq!(
        restored.into_iter().map(|r| r.1).collect::<Vec<_>>(),
        held,
        "the checkpoint holds the sketches as they were"
    );
    let mut t2 = Table::new(Arc::new(config()), loaded.epoch);
    t2.raise_last_version(loaded.last_version);
    for e in loaded.entries {
        t2.restore(e.series, e.hour, e.entry);
    }
    let table2 = Mutex::new(t2);
    assert_push_is_current(&table2, "restored");
    let dir2 = tempfile::tempdir().unwrap();
    let mut writer2 = Writer::new(dir2.path(), "web-1");
    writer2.write(&table2).unwrap();
    add(&table2, "a", &["3"]);
    assert_push_is_current(&table2, "restored, checkpointed, changed");
}

/// The kept frames never exceed MAX_FRAMES_KEPT bytes between two drop_frames (the
/// claim of `Table::encoded`).
#[test]
fn frames_kept_stay_within_max_frames_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Config {
        default_kinds: vec![Kind::Membership],
        ..Config::default()
    };
    // Bloom filters of a few MiB each.
    c.defaults.capacity = 4_000_000;
    c.limits.max_series = 100;
    let table = Mutex::new(Table::new(Arc::new(c), 5));
    for m in ["a", "b", "c", "d", "e"] {
        add(&table, m, &["x"]);
    }
    let a = key_of(&table, "a");
    let frame = lock(&table).get(a).unwrap().1.sketches[0].encode().len();
    assert!(frame > 3 << 20, "frame of {frame} bytes");
    lock(&table).assign_versions();
    Writer::new(dir.path(), "web-1").write(&table).unwrap();
    let kept: usize = {
        let t = lock(&table);
        t.keys()
            .into_iter()
            .filter_map(|k| t.get(k).unwrap().1.frames.clone())
            .flatten()
            .map(|f| f.len())
            .sum()
    };
    assert!(
        kept <= MAX_FRAMES_KEPT,
        "{kept} bytes of frames kept, more than MAX_FRAMES_KEPT ({MAX_FRAMES_KEPT})"
    );
}

/// The checkpoint file after frames were kept and reused (a second base over kept frames)
/// reads back exactly the sketches held.
#[test]
fn a_base_written_over_kept_frames_holds_the_current_sketches() {
    let (dir, table, mut writer) = fresh();
    add(&table, "a", &["1"]);
    add(&table, "b", &["2"]);
    lock(&table).assign_versions();
    writer.write(&table).unwrap(); // keeps frames of a and b
    add(&table, "a", &["3"]); // a's frames cleared
    lock(&table).assign_versions();
    // A whole new base, written while b's frames are kept (and reused by encoded()).
    writer.write_full(&table).unwrap();
    let loaded = read(dir.path()).unwrap().unwrap();
    let t = lock(&table);
    for e in &loaded.entries {
        let key = t
            .keys()
            .into_iter()
            .find(|k| t.get(*k).unwrap().0 == &e.series)
            .unwrap();
        let held = &t.get(key).unwrap().1.sketches;
        assert_eq!(&e.entry.sketches, held, "{}", e.series);
        assert_eq!(e.entry.version, t.get(key).unwrap().1.version);
    }
}
