//! The checkpoint written and read back: round trips, the log and its compaction, torn
//! and damaged files, leftovers of an interrupted write.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hourglass_sketch::Sketch;
use proptest::prelude::*;

use super::format::*;
use super::reader::apply_log;
use super::*;
use crate::config::Config;
use crate::table::{IngestStats, Table};

const NOW: i64 = 1_764_000_000;

thread_local! {
    /// Makes the next base write fail after its rename, at the directory's fsync (as
    /// EIO, or EMFILE opening the directory, would).
    pub(super) static FAIL_DIR_SYNC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// DEFECT: a compaction whose base is renamed into place but whose directory fsync
/// then fails returns an error, and `Writer::write` falls back to appending to the
/// log it had — a log naming the *old* base. On disk the new base is in place, so a
/// reader ignores that log: every transaction appended to it (until the next
/// compaction succeeds) is reported durable, its versions pushed, and none of it is
/// read back after a restart, which then reuses those versions for other content.
#[test]
fn a_compaction_that_fails_after_its_rename_never_appends_to_the_old_log() {
    let dir = tempfile::tempdir().unwrap();
    let table = Mutex::new(filled());
    let mut writer = Writer::new(dir.path(), "web-1");
    writer.write(&table).unwrap();
    add(&table, "visitors", "x", NOW);
    crate::table::lock(&table).assign_versions();
    assert!(!writer.write(&table).unwrap().full);
    // The log is due for compaction; the new base's directory fsync fails.
    writer.compact_at = 0;
    add(&table, "visitors", "y", NOW);
    crate::table::lock(&table).assign_versions();
    FAIL_DIR_SYNC.with(|f| f.set(true));
    let written = writer.write(&table);
    if written.is_ok() {
        // Reported durable: the shipper now pushes these versions.
        let t = crate::table::lock(&table);
        assert!(t.keys().iter().all(|&k| {
            let e = t.get(k).unwrap().1;
            e.saved.durable == e.version
        }));
    }
    // The next checkpoints: a new version (pushed once this returns), then acks.
    add(&table, "visitors", "z", NOW);
    crate::table::lock(&table).assign_versions();
    writer.write(&table).unwrap();
    {
        let mut t = crate::table::lock(&table);
        for key in t.keys() {
            let version = t.get(key).unwrap().1.version;
            t.ack(key, version);
        }
    }
    writer.write(&table).unwrap();
    assert_eq!(
        restored(dir.path()),
        held(&table),
        "a restart reads back less than the checkpoints reported durable"
    );
}

fn filled() -> Table {
    let mut t = Table::new(Arc::new(Config::default()), 42);
    let mut stats = IngestStats::default();
    for (i, tags) in ["a:1", "a:2", ""].iter().enumerate() {
        let id = t.resolve_statsd("visitors", tags, &mut stats).unwrap();
        for j in 0..100 * (i + 1) {
            t.insert(id, NOW, NOW, format!("u{j}").as_bytes(), 1)
                .unwrap();
        }
    }
    t.mark_live((NOW / 3600) as u32);
    t.assign_versions();
    t
}

fn digest(sketches: &[Sketch]) -> u64 {
    let bytes: Vec<u8> = sketches.iter().flat_map(Sketch::encode).collect();
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// What a restart would restore, as comparable text: every entry's series, hour,
/// version, acknowledgement, flag and sketches, and the header fields.
fn restored(dir: &Path) -> (u64, Option<u32>, Vec<u32>, Vec<String>) {
    let loaded = read(dir).unwrap().unwrap();
    let mut entries: Vec<String> = loaded
        .entries
        .iter()
        .map(|saved| {
            let (s, h, e) = (&saved.series, saved.hour, &saved.entry);
            format!(
                "{s}@{h} v{} a{} d{} {:x}",
                e.version,
                e.acked,
                e.dirty,
                digest(&e.sketches)
            )
        })
        .collect();
    entries.sort();
    (
        loaded.last_version,
        loaded.closed_through,
        loaded.live_hours,
        entries,
    )
}

/// The same, of a table in memory.
fn held(table: &Mutex<Table>) -> (u64, Option<u32>, Vec<u32>, Vec<String>) {
    let t = crate::table::lock(table);
    let mut entries: Vec<String> = t
        .keys()
        .into_iter()
        .map(|k| {
            let (s, e) = t.get(k).unwrap();
            format!(
                "{s}@{} v{} a{} d{} {:x}",
                k.hour,
                e.version,
                e.acked,
                e.dirty,
                digest(&e.sketches)
            )
        })
        .collect();
    entries.sort();
    (
        t.last_version(),
        t.closed_through(),
        t.live_hours(),
        entries,
    )
}

fn add(table: &Mutex<Table>, metric: &str, item: &str, time: i64) {
    let mut t = crate::table::lock(table);
    let id = t
        .resolve_statsd(metric, "", &mut IngestStats::default())
        .unwrap();
    t.insert_at(id, (time / 3600) as u32, item.as_bytes(), 1);
}

#[test]
fn checkpoints_after_the_first_write_only_what_changed_and_read_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let table = Mutex::new(filled());
    let mut writer = Writer::new(dir.path(), "web-1");
    let first = writer.write(&table).unwrap();
    assert!(first.full, "the first checkpoint of a start is a base");
    assert_eq!(restored(dir.path()), held(&table));

    // Nothing changed: a transaction of the header alone.
    let idle = writer.write(&table).unwrap();
    assert!(!idle.full);
    assert!(idle.bytes < 100, "{idle:?}");

    // One entry of three changes: about a third of the table is written.
    add(&table, "visitors", "new-item", NOW);
    crate::table::lock(&table).assign_versions();
    let one = writer.write(&table).unwrap();
    assert!(!one.full);
    assert!(one.bytes < first.bytes / 2, "{one:?} against {first:?}");
    assert_eq!(restored(dir.path()), held(&table));

    // Acknowledgements alone: no sketch is written again.
    {
        let mut t = crate::table::lock(&table);
        for key in t.keys() {
            let version = t.get(key).unwrap().1.version;
            t.ack(key, version);
        }
    }
    let acks = writer.write(&table).unwrap();
    assert!(acks.bytes < 300, "{acks:?}");
    assert_eq!(restored(dir.path()), held(&table));

    // Freed entries are gone after a restart too.
    let freed = crate::table::lock(&table).free_closed(NOW + 3 * 3600);
    assert_eq!(freed, 3);
    add(&table, "later", "x", NOW + 3 * 3600);
    writer.write(&table).unwrap();
    assert_eq!(restored(dir.path()), held(&table));
    assert_eq!(read(dir.path()).unwrap().unwrap().entries.len(), 1);

    // A base alone (as every earlier agent wrote it) still reads.
    std::fs::remove_file(log_path(dir.path())).unwrap();
    assert_eq!(read(dir.path()).unwrap().unwrap().entries.len(), 3);
}

#[test]
fn a_log_left_from_an_older_base_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let table = Mutex::new(filled());
    let mut writer = Writer::new(dir.path(), "web-1");
    writer.write(&table).unwrap();
    add(&table, "visitors", "x", NOW);
    crate::table::lock(&table).assign_versions();
    writer.write(&table).unwrap();
    let old_log = std::fs::read(log_path(dir.path())).unwrap();
    // A compaction (a new base) that crashed before writing its new log: the old log
    // still names the old base.
    Writer::new(dir.path(), "web-1").write(&table).unwrap();
    std::fs::write(log_path(dir.path()), &old_log).unwrap();
    let loaded = read(dir.path()).unwrap().unwrap();
    assert_eq!(loaded.transactions, 0);
    assert_eq!(restored(dir.path()), held(&table));
}

#[test]
fn a_torn_last_transaction_is_ignored_and_damage_before_it_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let table = Mutex::new(filled());
    let mut writer = Writer::new(dir.path(), "web-1");
    writer.write(&table).unwrap();
    add(&table, "visitors", "x", NOW);
    crate::table::lock(&table).assign_versions();
    writer.write(&table).unwrap();
    let before = held(&table);
    let middle = std::fs::read(log_path(dir.path())).unwrap().len();
    add(&table, "visitors", "y", NOW);
    crate::table::lock(&table).assign_versions();
    writer.write(&table).unwrap();
    let whole = std::fs::read(log_path(dir.path())).unwrap();

    // A crash during the last append: the file ends anywhere inside it.
    for cut in [middle + 1, middle + FRAME_HEADER, whole.len() - 1] {
        std::fs::write(log_path(dir.path()), &whole[..cut]).unwrap();
        let loaded = read(dir.path()).unwrap().unwrap();
        assert_eq!((loaded.transactions, loaded.torn_bytes), (1, cut - middle));
        assert_eq!(restored(dir.path()), before, "cut {cut}");
    }
    // A flipped byte in a transaction that was whole: the checkpoint is damaged.
    for at in [LOG_HEADER + 2, LOG_HEADER + FRAME_HEADER + 3, middle + 5] {
        let mut bad = whole.clone();
        bad[at] ^= 0x20;
        std::fs::write(log_path(dir.path()), &bad).unwrap();
        assert!(
            matches!(read(dir.path()), Err(CheckpointError::Corrupt(_))),
            "byte {at}"
        );
    }
}

/// A table holding what `loaded` holds, as the agent restores one at start.
fn restore(loaded: Loaded) -> Table {
    let mut t = Table::new(Arc::new(Config::default()), loaded.epoch);
    t.raise_last_version(loaded.last_version);
    if let Some(hour) = loaded.closed_through {
        t.close_through(hour);
    }
    for e in loaded.entries {
        t.restore(e.series, e.hour, e.entry);
    }
    for hour in loaded.live_hours {
        t.mark_live(hour);
    }
    t
}

#[test]
fn a_restarted_agent_appends_after_the_last_whole_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let table = Mutex::new(filled());
    let mut writer = Writer::new(dir.path(), "web-1");
    writer.write(&table).unwrap();
    add(&table, "visitors", "x", NOW);
    crate::table::lock(&table).assign_versions();
    writer.write(&table).unwrap();
    let whole = std::fs::metadata(log_path(dir.path())).unwrap().len();
    // Killed during the next append: the file ends halfway into it.
    add(&table, "visitors", "lost", NOW);
    crate::table::lock(&table).assign_versions();
    let lost = writer.write(&table).unwrap();
    let log = std::fs::OpenOptions::new()
        .write(true)
        .open(log_path(dir.path()))
        .unwrap();
    log.set_len(whole + lost.bytes / 2).unwrap();
    drop(log);

    let loaded = read(dir.path()).unwrap().unwrap();
    let position = loaded.resume.unwrap();
    assert_eq!(
        (position.log_len, loaded.torn_bytes as u64),
        (whole, lost.bytes / 2)
    );
    let table = Mutex::new(restore(loaded));
    let mut writer = Writer::new(dir.path(), "web-1");
    writer.resume(position).unwrap();
    assert_eq!(
        std::fs::metadata(log_path(dir.path())).unwrap().len(),
        whole,
        "the torn transaction is cut off before anything is appended"
    );
    add(&table, "visitors", "y", NOW);
    add(&table, "new", "y", NOW);
    crate::table::lock(&table).assign_versions();
    let w = writer.write(&table).unwrap();
    assert!(!w.full, "no whole base after a restart");
    let loaded = read(dir.path()).unwrap().unwrap();
    assert_eq!((loaded.transactions, loaded.torn_bytes), (2, 0));
    assert_eq!(restored(dir.path()), held(&table));
}

#[test]
fn the_log_is_compacted_once_larger_than_the_base() {
    let dir = tempfile::tempdir().unwrap();
    let table = Mutex::new(filled());
    let mut writer = Writer::new(dir.path(), "web-1");
    let base = writer.write(&table).unwrap();
    let mut appended = 0;
    let mut last_on_disk = base.on_disk;
    let compacted = loop {
        add(&table, "visitors", &format!("i{appended}"), NOW);
        crate::table::lock(&table).assign_versions();
        let w = writer.write(&table).unwrap();
        if w.full {
            break w;
        }
        last_on_disk = w.on_disk;
        appended += 1;
        assert!(appended < 1000, "never compacted");
    };
    let base_len = base.bytes - LOG_HEADER as u64;
    assert!(
        last_on_disk >= base_len + base_len.max(MIN_COMPACT_BYTES),
        "compacted after {appended} appends, at {last_on_disk} bytes on disk"
    );
    assert!(
        last_on_disk < 2 * (base_len + base_len.max(MIN_COMPACT_BYTES)),
        "not much later than the bound"
    );
    assert_eq!(
        compacted.on_disk, compacted.bytes,
        "after a compaction, the base and an empty log"
    );
    assert_eq!(restored(dir.path()), held(&table));
}

/// Bytes written per flush in a steady state, whole-table rewrites (what every flush
/// wrote before the log) against the log: `cargo test -p hourglass-agent --lib --
/// --ignored --nocapture bytes_per_flush`. Figures, not a timed assert.
#[test]
#[ignore]
fn bytes_per_flush() {
    // A healthy agent (the open hour alone), and one whose aggregator is three hours
    // away (three closed hours of every series unacknowledged besides).
    for closed_hours in [0u32, 3] {
        bytes_per_flush_with(closed_hours);
    }
}

fn bytes_per_flush_with(closed_hours: u32) {
    let series = 200usize;
    let changing = series / 10;
    let flushes = 100;
    let dir = tempfile::tempdir().unwrap();
    let table = Mutex::new(Table::new(Arc::new(Config::default()), 1));
    // Each flush, a tenth of the series get events.
    for s in 0..series {
        for back in 0..=closed_hours {
            add(&table, &format!("m{s}"), "u", NOW - i64::from(back) * 3600);
        }
    }
    crate::table::lock(&table).assign_versions();
    let mut writer = Writer::new(dir.path(), "web-1");
    let (mut full_total, mut full_samples, mut log_total, mut compactions) = (0, 0, 0u64, 0);
    writer.write(&table).unwrap();
    for f in 0..flushes {
        for s in 0..changing {
            let s = (f * changing + s) % series;
            add(&table, &format!("m{s}"), &format!("u{f}"), NOW);
        }
        crate::table::lock(&table).assign_versions();
        let w = writer.write(&table).unwrap();
        log_total += w.bytes;
        compactions += usize::from(w.full);
        if f % 10 == 0 {
            // What the whole-table checkpoint of every flush wrote, sampled.
            let full_dir = tempfile::tempdir().unwrap();
            full_total += write(&table, full_dir.path(), "web-1").unwrap();
            full_samples += 1;
        }
    }
    println!(
        "{series} series x {} hours ({changing} changing per flush), {flushes} flushes: \
         whole table {} bytes/flush; log {} bytes/flush ({compactions} compactions included)",
        closed_hours + 1,
        full_total / full_samples,
        log_total / flushes as u64,
    );
}

#[test]
fn round_trips_every_entry() {
    let dir = tempfile::tempdir().unwrap();
    let table = Mutex::new(filled());
    crate::table::lock(&table).close_through(7);
    let written = write(&table, dir.path(), "web-1").unwrap();
    let on_disk = |p: PathBuf| std::fs::metadata(p).unwrap().len();
    assert_eq!(
        written,
        on_disk(path(dir.path())) + on_disk(log_path(dir.path()))
    );
    let loaded = read(dir.path()).unwrap().unwrap();
    assert_eq!(loaded.epoch, 42);
    assert_eq!(loaded.server, "web-1");
    assert_eq!(loaded.closed_through, Some(7));
    let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(
        leftovers, 2,
        "only the checkpoint and its log: no temporary file is left"
    );
    assert_eq!(loaded.last_version, 1);
    assert_eq!(loaded.live_hours, vec![(NOW / 3600) as u32]);
    assert_eq!(loaded.entries.len(), 3);
    let t = table.lock().unwrap();
    for SavedEntry {
        series,
        hour,
        entry,
    } in &loaded.entries
    {
        let held = t.entry(&series.to_string(), *hour).unwrap();
        assert_eq!((entry.version, entry.acked, entry.dirty), (1, 0, false));
        assert_eq!(entry.sketches, held.sketches);
    }
    assert!(read(&dir.path().join("nowhere")).unwrap().is_none());
}

#[test]
fn any_damage_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write(&Mutex::new(filled()), dir.path(), "web-1").unwrap();
    let good = std::fs::read(path(dir.path())).unwrap();
    for cut in [0, 5, good.len() / 2, good.len() - 1] {
        assert!(
            matches!(decode(&good[..cut]), Err(CheckpointError::Corrupt(_))),
            "cut {cut}"
        );
    }
    let mut flipped = good.clone();
    flipped[good.len() / 3] ^= 0x40;
    let e = decode(&flipped).unwrap_err().to_string();
    assert!(e.contains("checksum"), "{e}");
}

#[test]
fn leftover_temporary_files_are_removed_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    write(&Mutex::new(filled()), dir.path(), "web-1").unwrap();
    for name in [
        "checkpoint.tmp-123-0",
        "checkpoint.tmp-9-4",
        "lock",
        "notes",
    ] {
        std::fs::write(dir.path().join(name), b"partial").unwrap();
    }
    std::fs::create_dir(dir.path().join("checkpoint.tmp-dir")).unwrap();
    assert_eq!(remove_leftovers(dir.path()).unwrap(), 2);
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "checkpoint",
            "checkpoint.log",
            "checkpoint.tmp-dir",
            "lock",
            "notes"
        ]
    );
    assert!(
        read(dir.path()).unwrap().is_some(),
        "the checkpoint is kept"
    );
}

proptest! {
    /// A log of arbitrary frames after a valid header, for the base it names, never
    /// panics: it applies, is a torn tail, or is an error.
    #[test]
    fn hostile_logs_never_panic(frames in prop::collection::vec((prop::collection::vec(any::<u8>(), 0..200), any::<u8>(), any::<bool>()), 0..6)) {
        let mut log = LOG_MAGIC.to_vec();
        log.push(LOG_VERSION);
        log.extend_from_slice(&7u64.to_le_bytes());
        for (payload, flags, honest) in frames {
            let mut header = (payload.len() as u32).to_le_bytes().to_vec();
            header.push(flags & 1);
            let sum = if honest { xxhash_rust::xxh3::xxh3_64(&payload) } else { 0 };
            header.extend_from_slice(&sum.to_le_bytes());
            let check = xxhash_rust::xxh3::xxh3_64(&header) as u32;
            header.extend_from_slice(&check.to_le_bytes());
            log.extend_from_slice(&header);
            log.extend_from_slice(&payload);
        }
        let mut loaded = Loaded {
            server: "web-1".into(),
            epoch: 1,
            closed_through: None,
            last_version: 0,
            live_hours: Vec::new(),
            entries: Vec::new(),
            transactions: 0,
            torn_bytes: 0,
            resume: None,
        };
        let _ = apply_log(&mut loaded, 7, &log);
    }

    /// Bytes with a valid checksum but arbitrary content reach the field checks, which
    /// never panic.
    #[test]
    fn hostile_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..300), head in any::<bool>()) {
        let mut bytes = if head { b"HGCP\x02".to_vec() } else { Vec::new() };
        bytes.extend_from_slice(&body);
        let sum = xxhash_rust::xxh3::xxh3_64(&bytes);
        bytes.extend_from_slice(&sum.to_le_bytes());
        let _ = decode(&bytes);
    }
}
