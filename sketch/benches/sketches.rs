//! Criterion benchmarks of the sketches, with Apache DataSketches (the `datasketches`
//! crate) measured in the same groups as the peer.
//!
//! Run with `cargo bench --bench sketches`; results and verdicts are recorded in
//! docs/BENCHMARKS.md. Each group holds our figure (`hourglass`), the peer's
//! (`datasketches`) and, where it applies, a floor (`xxh3_floor`: hashing the same items
//! with xxh3 and nothing else), so one run prints all of them side by side. The
//! HyperLogLog insert, merge and estimate groups also time our UltraLogLog
//! (`ultraloglog`) on the same items and precision.
//!
//! Items are generated up front from a fixed seed, outside every timed loop; inserts and
//! queries are timed per batch and reported per item through `Throughput::Elements`,
//! merges through `Throughput::Bytes` or `Throughput::Elements`.

use criterion::{BatchSize, Criterion, Throughput};
use datasketches::bloom::BloomFilterBuilder;
use datasketches::countmin::CountMinSketch;
use datasketches::frequencies::FrequentItemsSketch;
use datasketches::hash::value::raw_bytes;
use datasketches::hll::{HllSketch, HllType, HllUnion};
use hourglass_sketch::bloom::Bloom;
use hourglass_sketch::countmin::CountMin;
use hourglass_sketch::frequent::FrequentItems;
use hourglass_sketch::hash::{ITEM_SEED, item_hash};
use hourglass_sketch::hll::{DEFAULT_PRECISION, Hll};
use hourglass_sketch::ull::Ull;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use std::hint::black_box;
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Items per timed batch of inserts or queries.
const BATCH: usize = 4096;

/// Fixed seed of every generated item set, so every run times the same items.
const SEED: u64 = 0x5eed_0fb3_4c4e;

/// `n` distinct items of `len` bytes (at least 8) in one flat buffer, to be read with
/// `chunks_exact(len)`: the first 8 bytes are `offset + i`, little-endian, which makes
/// them distinct; the rest is random.
fn distinct_items(n: usize, len: usize, offset: u64) -> Vec<u8> {
    assert!(len >= 8);
    let mut rng = StdRng::seed_from_u64(SEED ^ offset ^ (len as u64) << 32);
    let mut out = vec![0u8; n * len];
    for (i, item) in out.chunks_exact_mut(len).enumerate() {
        item[..8].copy_from_slice(&(offset + i as u64).to_le_bytes());
        rng.fill_bytes(&mut item[8..]);
    }
    out
}

/// A Zipf(s = 1) stream of `n` 16-byte items over a universe of `universe` ranks, by
/// inverse transform on the cumulative weights: rank `r` (1-based) has probability
/// `(1/r) / H(universe)`. Item bytes are the rank, little-endian, then 8 fixed bytes.
fn zipf_stream(n: usize, universe: usize, seed: u64) -> Vec<u8> {
    let mut cumulative = Vec::with_capacity(universe);
    let mut sum = 0.0f64;
    for rank in 1..=universe {
        sum += 1.0 / rank as f64;
        cumulative.push(sum);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n * 16);
    for _ in 0..n {
        let u: f64 = rng.random::<f64>() * sum;
        let rank = cumulative.partition_point(|&c| c < u) as u64 + 1;
        out.extend_from_slice(&rank.to_le_bytes());
        out.extend_from_slice(b"zipf-key");
    }
    out
}

// ---------------------------------------------------------------------------------------
// HyperLogLog
// ---------------------------------------------------------------------------------------

/// The peer's register type: HLL_8, one byte per register like our dense form, which its
/// docs call the fastest to update.
const PEER_HLL_TYPE: HllType = HllType::Hll8;

/// Distinct values inserted before a sketch is timed, per register: far past both
/// sketches' switch to dense registers (ours at 3m/16 entries, the peer's at 3m/32
/// coupons), and in the range where every register is set.
const FILL_PER_REGISTER: u64 = 16;

/// splitmix64: a cheap stream of distinct 64-bit values, to fill sketches quickly.
fn splitmix(i: u64) -> u64 {
    let mut z = i
        .wrapping_add(0x9e37_79b9_7f4a_7c15)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A dense sketch of `n` distinct values, `offset..offset + n`.
fn dense_hll(precision: u8, n: u64, offset: u64) -> Hll {
    let mut h = Hll::new(precision).unwrap();
    for i in offset..offset + n {
        h.insert_hash(splitmix(i));
    }
    assert!(!h.is_sparse());
    h
}

/// An UltraLogLog of the same `n` values as [`dense_hll`].
fn dense_ull(precision: u8, n: u64, offset: u64) -> Ull {
    let mut u = Ull::new(precision).unwrap();
    for i in offset..offset + n {
        u.insert_hash(splitmix(i));
    }
    assert!(!u.is_sparse());
    u
}

/// The peer's sketch of the same `n` values (its own hash of their 8 bytes).
fn peer_hll(precision: u8, n: u64, offset: u64) -> HllSketch {
    let mut h = HllSketch::new(precision, PEER_HLL_TYPE).unwrap();
    for i in offset..offset + n {
        h.update(raw_bytes::from_slice(&i.to_le_bytes()));
    }
    h
}

fn hll_insert(c: &mut Criterion) {
    let p = DEFAULT_PRECISION;
    let fill = FILL_PER_REGISTER << p;
    for len in [16usize, 64] {
        let items = distinct_items(BATCH, len, 1 << 40);
        let hashes: Vec<u64> = items.chunks_exact(len).map(item_hash).collect();
        let mut group = c.benchmark_group(format!("hll_insert_{len}B"));
        group.throughput(Throughput::Elements(BATCH as u64));

        let mut ours = dense_hll(p, fill, 0);
        group.bench_function("hourglass", |b| {
            b.iter(|| {
                for item in black_box(&items).chunks_exact(len) {
                    ours.insert(item);
                }
            })
        });
        // The register update alone, items hashed beforehand.
        group.bench_function("hourglass_insert_hash", |b| {
            b.iter(|| {
                for &hash in black_box(&hashes) {
                    ours.insert_hash(hash);
                }
            })
        });
        // UltraLogLog at the same precision, on the same items and hashes.
        let mut ull = dense_ull(p, fill, 0);
        group.bench_function("ultraloglog", |b| {
            b.iter(|| {
                for item in black_box(&items).chunks_exact(len) {
                    ull.insert(item);
                }
            })
        });
        group.bench_function("ultraloglog_insert_hash", |b| {
            b.iter(|| {
                for &hash in black_box(&hashes) {
                    ull.insert_hash(hash);
                }
            })
        });
        // The floor: hashing the same items with the same function and nothing else.
        group.bench_function("xxh3_floor", |b| {
            b.iter(|| {
                let mut sum = 0u64;
                for item in black_box(&items).chunks_exact(len) {
                    sum = sum.wrapping_add(xxh3_64_with_seed(item, ITEM_SEED));
                }
                black_box(sum)
            })
        });
        let mut peer = peer_hll(p, fill, 0);
        group.bench_function("datasketches", |b| {
            b.iter(|| {
                for item in black_box(&items).chunks_exact(len) {
                    peer.update(raw_bytes::from_slice(item));
                }
            })
        });
        group.finish();
    }
}

fn hll_merge(c: &mut Criterion) {
    for p in [DEFAULT_PRECISION, 18] {
        let m = 1u64 << p;
        let fill = FILL_PER_REGISTER << p;
        let mut group = c.benchmark_group(format!("hll_merge_dense_p{p}"));
        // Bytes of in-memory registers merged: one byte per register for both (the
        // encoded form is six bits per register and is not what is read here).
        group.throughput(Throughput::Bytes(m));

        let mut ours = dense_hll(p, fill, 0);
        let other = dense_hll(p, fill, fill);
        group.bench_function("hourglass", |b| b.iter(|| ours.merge(black_box(&other))));
        // UltraLogLog of the same values: m registers of one byte, like ours in memory.
        let mut ull = dense_ull(p, fill, 0);
        let ull_other = dense_ull(p, fill, fill);
        group.bench_function("ultraloglog", |b| {
            b.iter(|| ull.merge(black_box(&ull_other)))
        });

        // The peer merges through a union object whose gadget already holds the first
        // sketch: updating it with the second is its in-place dense merge.
        let mut union = HllUnion::new(p).unwrap();
        union.update(&peer_hll(p, fill, 0));
        let peer_other = peer_hll(p, fill, fill);
        group.bench_function("datasketches", |b| {
            b.iter(|| union.update(black_box(&peer_other)))
        });
        group.finish();
    }
}

/// What a query does per stored row: decode the row's bytes and merge them into the
/// answer being built. HyperLogLog's stored form packs six bits per register (unpacked on
/// decode); UltraLogLog's keeps one byte per register.
fn hll_merge_stored(c: &mut Criterion) {
    for p in [DEFAULT_PRECISION, 18] {
        let fill = FILL_PER_REGISTER << p;
        let mut group = c.benchmark_group(format!("hll_merge_stored_dense_p{p}"));
        group.throughput(Throughput::Elements(1));
        let mut ours = dense_hll(p, fill, 0);
        let stored = dense_hll(p, fill, fill).encode();
        group.bench_function("hourglass", |b| {
            b.iter(|| {
                let row = Hll::decode(black_box(&stored)).unwrap();
                ours.merge(&row).unwrap()
            })
        });
        let mut ull = dense_ull(p, fill, 0);
        let mut ull_stored = Vec::new();
        dense_ull(p, fill, fill).encode_body(&mut ull_stored);
        group.bench_function("ultraloglog", |b| {
            b.iter(|| {
                let row = Ull::decode_body(black_box(&ull_stored)).unwrap();
                ull.merge(&row).unwrap()
            })
        });
        group.finish();
    }
}

fn hll_estimate(c: &mut Criterion) {
    let p = DEFAULT_PRECISION;
    let mut group = c.benchmark_group("hll_estimate_dense_p14");
    group.throughput(Throughput::Elements(1));
    let ours = dense_hll(p, FILL_PER_REGISTER << p, 0);
    // Repeated estimates of an unchanged sketch read the cached value.
    group.bench_function("hourglass", |b| b.iter(|| black_box(&ours).estimate()));
    // The first estimate after a change (a clone starts with no cached value): the register
    // histogram and Ertl's estimator.
    group.bench_function("hourglass_first_after_change", |b| {
        b.iter_batched_ref(
            || ours.clone(),
            |fresh| black_box(&*fresh).estimate(),
            BatchSize::SmallInput,
        )
    });
    // UltraLogLog of the same values: cached, and first after a change (the register
    // histogram and the maximum-likelihood solve).
    let ull = dense_ull(p, FILL_PER_REGISTER << p, 0);
    group.bench_function("ultraloglog", |b| b.iter(|| black_box(&ull).estimate()));
    group.bench_function("ultraloglog_first_after_change", |b| {
        b.iter_batched_ref(
            || ull.clone(),
            |fresh| black_box(&*fresh).estimate(),
            BatchSize::SmallInput,
        )
    });
    let peer = peer_hll(p, FILL_PER_REGISTER << p, 0);
    group.bench_function("datasketches", |b| b.iter(|| black_box(&peer).estimate()));
    // The peer keeps a running (HIP) estimate; after a union it recomputes from its
    // register statistics, which it also keeps up to date. Both are O(1) in m.
    let mut union = HllUnion::new(p).unwrap();
    union.update(&peer);
    union.update(&peer_hll(p, FILL_PER_REGISTER << p, FILL_PER_REGISTER << p));
    group.bench_function("datasketches_union", |b| {
        b.iter(|| black_box(&union).estimate())
    });
    group.finish();

    // Sparse: 1000 distinct items, well below both sketches' switch to dense.
    let mut group = c.benchmark_group("hll_estimate_sparse_p14");
    group.throughput(Throughput::Elements(1));
    let mut ours = Hll::new(p).unwrap();
    for i in 0..1000 {
        ours.insert_hash(splitmix(i));
    }
    assert!(ours.is_sparse());
    group.bench_function("hourglass", |b| b.iter(|| black_box(&ours).estimate()));
    group.bench_function("hourglass_first_after_change", |b| {
        b.iter_batched_ref(
            || ours.clone(),
            |fresh| black_box(&*fresh).estimate(),
            BatchSize::SmallInput,
        )
    });
    let mut ull = Ull::new(p).unwrap();
    for i in 0..1000 {
        ull.insert_hash(splitmix(i));
    }
    assert!(ull.is_sparse());
    group.bench_function("ultraloglog_first_after_change", |b| {
        b.iter_batched_ref(
            || ull.clone(),
            |fresh| black_box(&*fresh).estimate(),
            BatchSize::SmallInput,
        )
    });
    let peer = peer_hll(p, 1000, 0);
    group.bench_function("datasketches", |b| b.iter(|| black_box(&peer).estimate()));
    group.finish();
}

fn hll_sparse_to_dense(c: &mut Criterion) {
    let p = DEFAULT_PRECISION;
    // One past our threshold of 3m/16 sparse entries.
    let n = 3 * (1usize << p) / 16 + 1;
    let items = distinct_items(n, 16, 1 << 42);
    let build = |items: &[u8]| {
        let mut h = Hll::new(p).unwrap();
        for item in items.chunks_exact(16) {
            h.insert(item);
        }
        h
    };
    // The last item is the one that turns the sketch dense.
    assert!(build(&items[16..]).is_sparse());
    assert!(!build(&items).is_sparse());

    let mut group = c.benchmark_group("hll_sparse_to_dense_p14");
    // Time per iteration is per sketch: a fresh sketch filled with `n` items, allocation
    // and conversion to dense included.
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function("hourglass", |b| b.iter(|| build(&items)));
    group.bench_function("datasketches", |b| {
        b.iter(|| {
            let mut h = HllSketch::new(p, PEER_HLL_TYPE).unwrap();
            for item in items.chunks_exact(16) {
                h.update(raw_bytes::from_slice(item));
            }
            h
        })
    });
    group.finish();
}

/// An UltraLogLog through its whole sparse phase, at the agents' default precision 13:
/// the path every server-hour of fewer than ~2,000 users takes in an agent, item by item.
fn ull_sparse_build(c: &mut Criterion) {
    let p = 13;
    let n = (1usize << p) / 4;
    let items = distinct_items(n, 16, 1 << 42);
    let build = |items: &[u8]| {
        let mut u = Ull::new(p).unwrap();
        for item in items.chunks_exact(16) {
            u.insert(item);
        }
        u
    };
    assert!(build(&items).is_sparse());
    let built = build(&items);
    let mut group = c.benchmark_group("ull_sparse_p13");
    // Per iteration: a fresh sketch filled with `n` items, allocation included.
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function("build", |b| b.iter(|| build(&items)));
    // What a push and a checkpoint pay for such a sketch: its sorted body.
    group.bench_function("encode", |b| {
        b.iter(|| {
            let mut body = Vec::new();
            black_box(&built).encode_body(&mut body);
            body
        })
    });
    group.finish();
}

fn hll_codec(c: &mut Criterion) {
    let p = DEFAULT_PRECISION;
    let m = 1u64 << p;
    let ours = dense_hll(p, FILL_PER_REGISTER << p, 0);
    let peer = peer_hll(p, FILL_PER_REGISTER << p, 0);
    let encoded = ours.encode();
    let peer_encoded = peer.serialize();

    // Throughput in registers (one byte each in memory) for both, so the figures compare
    // directly although the encodings differ in size (ours six bits per register, the
    // peer's HLL_8 eight).
    let mut group = c.benchmark_group("hll_encode_dense_p14");
    group.throughput(Throughput::Bytes(m));
    group.bench_function("hourglass", |b| b.iter(|| black_box(&ours).encode()));
    group.bench_function("datasketches", |b| b.iter(|| black_box(&peer).serialize()));
    group.finish();

    let mut group = c.benchmark_group("hll_decode_dense_p14");
    group.throughput(Throughput::Bytes(m));
    group.bench_function("hourglass", |b| {
        b.iter(|| Hll::decode(black_box(&encoded)).unwrap())
    });
    group.bench_function("datasketches", |b| {
        b.iter(|| HllSketch::deserialize(black_box(&peer_encoded)).unwrap())
    });
    group.finish();
}

// ---------------------------------------------------------------------------------------
// Count-Min
// ---------------------------------------------------------------------------------------

/// Count-Min at ε = 0.001, δ = 0.01: 2719 × 5 `u64` counters (106 KiB) for both.
fn countmin(c: &mut Criterion) {
    let items = distinct_items(BATCH, 16, 0);
    let ours_empty = CountMin::with_error(0.001, 0.01).unwrap();
    assert_eq!((ours_empty.width(), ours_empty.depth()), (2719, 5));
    let (width, depth) = (ours_empty.width(), ours_empty.depth() as u8);

    let mut group = c.benchmark_group("countmin_update_16B");
    group.throughput(Throughput::Elements(BATCH as u64));
    let mut ours = ours_empty.clone();
    group.bench_function("hourglass", |b| {
        b.iter(|| {
            for item in black_box(&items).chunks_exact(16) {
                ours.insert(item);
            }
        })
    });
    let mut peer = CountMinSketch::<u64>::new(depth, width).unwrap();
    group.bench_function("datasketches", |b| {
        b.iter(|| {
            for item in black_box(&items).chunks_exact(16) {
                peer.update(raw_bytes::from_slice(item));
            }
        })
    });
    group.finish();

    let mut group = c.benchmark_group("countmin_query_16B");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("hourglass", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            for item in black_box(&items).chunks_exact(16) {
                sum = sum.wrapping_add(ours.estimate(item));
            }
            black_box(sum)
        })
    });
    group.bench_function("datasketches", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            for item in black_box(&items).chunks_exact(16) {
                sum = sum.wrapping_add(peer.estimate(raw_bytes::from_slice(item)));
            }
            black_box(sum)
        })
    });
    group.finish();
}

// ---------------------------------------------------------------------------------------
// Frequent items
// ---------------------------------------------------------------------------------------

/// Our capacity: error at most N/(k + 1) ≈ 0.001·N.
const FREQUENT_CAPACITY: u32 = 1000;
/// The peer's map size with the nearest guarantee: ε = 3.5/4096 ≈ 0.00085.
const PEER_MAP_SIZE: usize = 4096;
/// Length of the precomputed Zipf stream, in items.
const ZIPF_LEN: usize = 1 << 18;

fn frequent(c: &mut Criterion) {
    let stream = zipf_stream(ZIPF_LEN, 1_000_000, SEED);
    let batches: Vec<&[u8]> = stream.chunks(BATCH * 16).collect();

    let mut group = c.benchmark_group("frequent_update_zipf");
    group.throughput(Throughput::Elements(BATCH as u64));
    let mut ours = FrequentItems::new(FREQUENT_CAPACITY).unwrap();
    let mut next = 0;
    group.bench_function("hourglass", |b| {
        b.iter(|| {
            for item in batches[next % batches.len()].chunks_exact(16) {
                ours.try_insert(item).unwrap();
            }
            next += 1;
        })
    });
    let mut peer = FrequentItemsSketch::<Vec<u8>>::new(PEER_MAP_SIZE).unwrap();
    let mut next = 0;
    group.bench_function("datasketches", |b| {
        b.iter(|| {
            for item in batches[next % batches.len()].chunks_exact(16) {
                peer.update_ref(item);
            }
            next += 1;
        })
    });
    group.finish();

    // Merges timed on copies of `a` (the copy is made outside the timing), merging `b`
    // in; throughput counts the counters of `b`.
    fn merge_pair(
        c: &mut Criterion,
        name: &str,
        (a, b_): (FrequentItems, FrequentItems),
        (pa, pb): (FrequentItemsSketch<Vec<u8>>, FrequentItemsSketch<Vec<u8>>),
    ) {
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(b_.tracked() as u64));
        group.bench_function("hourglass", |b| {
            b.iter_batched(
                || a.clone(),
                |mut x| {
                    x.merge(&b_).unwrap();
                    x
                },
                BatchSize::SmallInput,
            )
        });
        group.throughput(Throughput::Elements(pb.num_active_items() as u64));
        group.bench_function("datasketches", |b| {
            b.iter_batched(
                || pa.clone(),
                |mut x| {
                    x.merge(&pb);
                    x
                },
                BatchSize::SmallInput,
            )
        });
        group.finish();
    }

    // Full summaries: exactly k = 1000 counters each, all counts distinct, half of the
    // items shared, so the union holds 1500 items and our merge must purge back to k.
    // The peer's map (4096 slots, up to 3072 counters) takes the union without a purge.
    let full_part = |first: u64| -> Vec<(Vec<u8>, u64)> {
        (first..first + u64::from(FREQUENT_CAPACITY))
            .map(|rank| {
                let mut item = rank.to_le_bytes().to_vec();
                item.extend_from_slice(b"full-key");
                (item, 1_000_000 / (rank + 1) + rank)
            })
            .collect()
    };
    let ours_of = |part: &[(Vec<u8>, u64)]| {
        let mut s = FrequentItems::new(FREQUENT_CAPACITY).unwrap();
        for (item, count) in part {
            s.try_insert_weighted(item, *count).unwrap();
        }
        s
    };
    let peer_of = |part: &[(Vec<u8>, u64)]| {
        let mut s = FrequentItemsSketch::<Vec<u8>>::new(PEER_MAP_SIZE).unwrap();
        for (item, count) in part {
            s.update_with_count_ref(&item[..], *count);
        }
        s
    };
    let (left, right) = (full_part(0), full_part(u64::from(FREQUENT_CAPACITY) / 2));
    let ours = (ours_of(&left), ours_of(&right));
    assert_eq!(ours.0.tracked(), FREQUENT_CAPACITY as usize);
    merge_pair(
        c,
        "frequent_merge_full",
        ours,
        (peer_of(&left), peer_of(&right)),
    );

    // The summaries each library keeps of the two halves of the Zipf stream, ours
    // compacted as it is encoded (on this stream most counters tie at small counts, so
    // compaction leaves a few hundred), the peer's as updates left it.
    let (left, right) = stream.split_at(stream.len() / 2);
    let summary = |part: &[u8]| {
        let mut s = FrequentItems::new(FREQUENT_CAPACITY).unwrap();
        for item in part.chunks_exact(16) {
            s.try_insert(item).unwrap();
        }
        s.compact();
        s
    };
    let peer_summary = |part: &[u8]| {
        let mut s = FrequentItemsSketch::<Vec<u8>>::new(PEER_MAP_SIZE).unwrap();
        for item in part.chunks_exact(16) {
            s.update_ref(item);
        }
        s
    };
    merge_pair(
        c,
        "frequent_merge_zipf_halves",
        (summary(left), summary(right)),
        (peer_summary(left), peer_summary(right)),
    );
}

// ---------------------------------------------------------------------------------------
// Bloom
// ---------------------------------------------------------------------------------------

const BLOOM_CAPACITY: u64 = 1_000_000;
const BLOOM_FPR: f64 = 0.01;
/// Items cycled through by the insert bench, so that successive batches touch new bits.
const BLOOM_POOL: usize = 1 << 18;

fn bloom(c: &mut Criterion) {
    // Queries run against filters at their design point: `BLOOM_CAPACITY` items in.
    let present = distinct_items(BLOOM_CAPACITY as usize, 16, 0);
    let absent = distinct_items(BATCH, 16, 1 << 40);
    let pool = distinct_items(BLOOM_POOL, 16, 1 << 41);
    let pool_batches: Vec<&[u8]> = pool.chunks(BATCH * 16).collect();
    let hits = present[..BATCH * 16].to_vec();

    let mut full = Bloom::new(BLOOM_CAPACITY, BLOOM_FPR).unwrap();
    let mut peer_full = BloomFilterBuilder::with_accuracy(BLOOM_CAPACITY, BLOOM_FPR)
        .build()
        .unwrap();
    for item in present.chunks_exact(16) {
        full.insert(item);
        peer_full.insert(raw_bytes::from_slice(item));
    }
    drop(present);

    let mut group = c.benchmark_group("bloom_insert_16B");
    group.throughput(Throughput::Elements(BATCH as u64));
    let mut ours = Bloom::new(BLOOM_CAPACITY, BLOOM_FPR).unwrap();
    let mut next = 0;
    group.bench_function("hourglass", |b| {
        b.iter(|| {
            for item in pool_batches[next % pool_batches.len()].chunks_exact(16) {
                ours.insert(item);
            }
            next += 1;
        })
    });
    let mut peer = BloomFilterBuilder::with_accuracy(BLOOM_CAPACITY, BLOOM_FPR)
        .build()
        .unwrap();
    let mut next = 0;
    group.bench_function("datasketches", |b| {
        b.iter(|| {
            for item in pool_batches[next % pool_batches.len()].chunks_exact(16) {
                peer.insert(raw_bytes::from_slice(item));
            }
            next += 1;
        })
    });
    group.finish();

    for (name, items) in [
        ("bloom_query_hit_16B", &hits),
        ("bloom_query_miss_16B", &absent),
    ] {
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(BATCH as u64));
        group.bench_function("hourglass", |b| {
            b.iter(|| {
                let mut found = 0u32;
                for item in black_box(items).chunks_exact(16) {
                    found += u32::from(full.contains(item));
                }
                black_box(found)
            })
        });
        group.bench_function("datasketches", |b| {
            b.iter(|| {
                let mut found = 0u32;
                for item in black_box(items).chunks_exact(16) {
                    found += u32::from(peer_full.contains(&raw_bytes::from_slice(item)));
                }
                black_box(found)
            })
        });
        group.finish();
    }
}

/// The one configuration of every group: short enough that the whole run takes a few
/// minutes on a 2-core machine.
fn config() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
}

criterion::criterion_group! {
    name = benches;
    config = config();
    targets = hll_insert, hll_merge, hll_merge_stored, hll_estimate, hll_sparse_to_dense, ull_sparse_build, hll_codec, countmin, frequent, bloom
}
criterion::criterion_main!(benches);
