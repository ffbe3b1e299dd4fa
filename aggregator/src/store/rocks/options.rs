//! The RocksDB options of each column family (docs/STORAGE.md gives every setting's
//! reason).

use super::*;

/// RocksDB's default window for ZSTD (negative: the library's own choice by level).
const ZSTD_WINDOW_BITS: i32 = -14;
/// ZSTD's fastest positive level: of the SST files, and of each hourly value
/// (`values::hourly_value`).
pub(super) const ZSTD_FAST_LEVEL: i32 = 1;

/// Column family options: what each is tuned for is in docs/STORAGE.md.
pub(super) fn cf_options(name: &str, options: &StoreOptions, cache: &Cache) -> Options {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    // Full (not block-based) filters: one filter per SST file, checked before any data
    // block is read. They hold whole keys, for point lookups, and, where a prefix
    // extractor is set, prefixes too, for scans of one prefix.
    table.set_bloom_filter(options.bloom_bits_per_key, false);
    table.set_whole_key_filtering(true);
    // Index and filter blocks live in the block cache, so its size bounds memory; L0's
    // stay pinned because every lookup consults every L0 file.
    table.set_cache_index_and_filter_blocks(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    // A dense HyperLogLog at precision 14 is 12 KiB: with the default 4 KiB blocks,
    // most values would be blocks of their own. 16 KiB blocks hold several sketches, so
    // compression sees more than one at a time and the index is smaller.
    table.set_block_size(16 << 10);

    let mut cf = Options::default();
    cf.set_block_based_table_factory(&table);
    cf.set_write_buffer_size(options.write_buffer_bytes);
    cf.set_level_compaction_dynamic_level_bytes(true);
    if options.compression && name != CF_HOURLY {
        // ZSTD at every level: sketches are registers, counters and bits with low entropy
        // but few repeated strings, so only an entropy coder shrinks them (LZ4 leaves a
        // dense register array as it is). Its fastest level everywhere, the bottommost
        // included (no bottommost options are enabled, so they follow these): it still
        // entropy-codes, which is what sketches need, at the least CPU on the ingest path.
        // Without this, what a flush wrote stayed uncompressed until a compaction reached
        // it, and a store after a clean stop was mostly raw sketches (docs/STORAGE.md).
        cf.set_compression_type(DBCompressionType::Zstd);
        cf.set_compression_options(ZSTD_WINDOW_BITS, ZSTD_FAST_LEVEL, 0, 0);
        cf.set_bottommost_compression_type(DBCompressionType::Zstd);
    } else {
        // Compression off; or the hourly column family, whose values come compressed,
        // once, as they are written (`hourly_value`, at the same level): compressing
        // their blocks again at every flush and compaction spent CPU for nothing.
        cf.set_compression_type(DBCompressionType::None);
        cf.set_bottommost_compression_type(DBCompressionType::None);
    }
    if name == CF_HOURLY {
        cf.set_prefix_extractor(SliceTransform::create_fixed_prefix(PREFIX_LEN));
        // The memtable gets a Bloom filter too, so absent keys skip its skiplist search.
        cf.set_memtable_prefix_bloom_ratio(0.02);
        cf.set_memtable_whole_key_filtering(true);
    }
    cf
}
