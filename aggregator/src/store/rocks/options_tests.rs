//! The column families' RocksDB options (`options.rs`), as RocksDB records them in the
//! OPTIONS file it writes.

use super::*;

/// What the OPTIONS file RocksDB wrote says about compression, against docs/STORAGE.md.
/// With `bottommost_compression_opts` never enabled, RocksDB compresses the bottommost
/// level with `compression_opts` (`GetCompressionOptions` in
/// db/compaction/compaction_picker.cc), i.e. ZSTD level 1, as the docs say. Since the hourly values are compressed as
/// they are written (schema version 2), the hourly column family and the WAL are not
/// compressed again; the rollups and meta column families still are.
#[test]
fn compression_is_zstd_level_1_except_hourly_and_wal() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(
        dir.path(),
        &StoreOptions {
            sync_writes: false,
            query_cache_bytes: 0,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let mut files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let n: u64 = name.strip_prefix("OPTIONS-")?.parse().ok()?;
            Some((n, name))
        })
        .collect();
    files.sort();
    let (_, latest) = files.last().expect("an OPTIONS file");
    let text = std::fs::read_to_string(dir.path().join(latest)).unwrap();
    drop(store);
    let section = |cf: &str| -> String {
        text.split(&format!("[CFOptions \"{cf}\"]"))
            .nth(1)
            .unwrap_or_else(|| panic!("{cf} section"))
            .split("\n[")
            .next()
            .unwrap()
            .to_string()
    };
    let option = |section: &str, name: &str| -> String {
        section
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} in {section}"))
            .to_string()
    };
    let field = |braces: &str, name: &str| -> String {
        braces
            .trim_matches(|c| c == '{' || c == '}')
            .split(';')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} in {braces}"))
            .to_string()
    };
    let hourly = section("hourly");
    assert_eq!(option(&hourly, "compression"), "kNoCompression");
    assert_eq!(option(&hourly, "bottommost_compression"), "kNoCompression");
    for cf in ["rollups", "meta"] {
        let section = section(cf);
        assert_eq!(option(&section, "compression"), "kZSTD", "{cf}");
        assert_eq!(option(&section, "bottommost_compression"), "kZSTD", "{cf}");
        let general = option(&section, "compression_opts");
        let bottom = option(&section, "bottommost_compression_opts");
        assert_eq!(field(&general, "level"), "1", "{cf}");
        assert_eq!(
            field(&bottom, "enabled"),
            "false",
            "the bottommost level follows compression_opts"
        );
        assert!(
            !section.contains("compression_per_level=kNoCompression"),
            "no per-level override is left: {section}"
        );
    }
    let db_section = text
        .split("[DBOptions]")
        .nth(1)
        .unwrap()
        .split("\n[")
        .next()
        .unwrap();
    assert!(
        db_section.contains("wal_compression=kNoCompression"),
        "{db_section}"
    );
}
