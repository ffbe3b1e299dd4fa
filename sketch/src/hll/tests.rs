//! Tests of the HyperLogLog sketch: exactness of the representation changes, the decoder's
//! validation, pinned encodings, and the merge laws as properties.

use super::*;
use crate::hash::item_hash;
use crate::test_support::{apply, mutation};
use proptest::prelude::*;
use xxhash_rust::xxh3::xxh3_64;

/// A sketch of the items `i.to_le_bytes()` for each `i`.
fn sketch_of(precision: u8, items: impl IntoIterator<Item = u64>) -> Hll {
    let mut sketch = Hll::new(precision).unwrap();
    for item in items {
        sketch.insert(&item.to_le_bytes());
    }
    sketch
}

fn body_of(sketch: &Hll) -> Vec<u8> {
    let mut body = Vec::new();
    sketch.encode_body(&mut body);
    body
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Well-mixed 64-bit values from a counter (splitmix64), for hash-level tests.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hashes that reach the edge cases of both rank computations, then random ones.
fn test_hashes() -> Vec<u64> {
    let mut hashes = vec![0, u64::MAX];
    for k in 0..64 {
        hashes.extend([1 << k, (1 << k) - 1, !(1u64 << k), u64::MAX >> k]);
    }
    let mut state = 7;
    hashes.extend((0..100_000).map(|_| splitmix(&mut state)));
    // Random top bits over long runs of zeros, which exercise the capped ranks.
    hashes.extend((0..20_000).map(|i| splitmix(&mut state) & !(u64::MAX >> (i % 30))));
    hashes
}

#[test]
fn precision_must_be_in_range() {
    assert!(Hll::new(MIN_PRECISION - 1).is_err());
    assert!(Hll::new(MAX_PRECISION + 1).is_err());
    let err = Hll::new(3).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid precision 3: must be between 4 and 18"
    );
    for p in MIN_PRECISION..=MAX_PRECISION {
        let sketch = Hll::new(p).unwrap();
        assert_eq!(sketch.precision(), p);
        assert!(sketch.is_sparse());
    }
    assert_eq!(Hll::default(), Hll::new(DEFAULT_PRECISION).unwrap());
}

#[test]
fn empty_sketch_estimates_zero() {
    let estimate = Hll::default().estimate();
    assert_eq!(estimate.estimate, 0.0);
    assert_eq!(estimate.std_error, 0.0);
    assert_eq!((estimate.lower95, estimate.upper95), (0.0, 0.0));

    // An empty dense sketch only arrives by decoding, but must read as zero too.
    let mut body = vec![4, 25, 1, 0];
    body.extend([0; 12]);
    let dense = Hll::decode_body(&body).unwrap();
    assert!(!dense.is_sparse());
    assert_eq!(dense.estimate().estimate, 0.0);
}

#[test]
fn small_counts_are_exact() {
    for p in [10, 14, 18] {
        let mut sketch = Hll::new(p).unwrap();
        for n in 1..=100u64 {
            sketch.insert(&n.to_le_bytes());
            let estimate = sketch.estimate();
            assert_eq!(estimate.estimate.round(), n as f64, "p={p} n={n}");
            assert!(estimate.lower95 <= n as f64 && n as f64 <= estimate.upper95);
            // No two of these items share a sparse index, so the floor is the count.
            assert_eq!(estimate.lower95, n as f64);
        }
    }
}

#[test]
fn dense_estimate_is_within_its_error() {
    let sketch = sketch_of(12, 0..200_000);
    let estimate = sketch.estimate();
    assert!(!sketch.is_sparse());
    assert!((estimate.estimate - 200_000.0).abs() < 3.0 * estimate.std_error);
    assert!(estimate.lower95 < 200_000.0 && 200_000.0 < estimate.upper95);
}

#[test]
fn turns_dense_just_past_the_threshold() {
    for p in [4, 8, 12, 18] {
        let limit = sparse_limit(p) as u64;
        let mut sketch = Hll::new(p).unwrap();
        // Hashes `k << 39` have sparse index k: one new entry each.
        for k in 0..limit {
            sketch.insert_hash(k << 39);
            assert!(sketch.is_sparse(), "p={p} after {} entries", k + 1);
        }
        // Known indices, with other ranks, add no entry.
        for k in 0..limit {
            sketch.insert_hash(k << 39 | 1);
        }
        assert!(sketch.is_sparse());
        sketch.insert_hash(limit << 39);
        assert!(!sketch.is_sparse(), "p={p}");

        let mut direct = dense::empty(p);
        for k in 0..=limit {
            for hash in [k << 39, k << 39 | 1] {
                let (index, rank) = dense::position(hash, p);
                direct[index] = direct[index].max(rank);
            }
        }
        assert_eq!(sketch.repr, Repr::Dense(direct));
    }
}

#[test]
fn converted_sparse_entry_equals_direct_dense_insert() {
    let hashes = test_hashes();
    for p in MIN_PRECISION..=MAX_PRECISION {
        for &hash in &hashes {
            assert_eq!(
                sparse::dense_position(sparse::entry_of_hash(hash), p),
                dense::position(hash, p),
                "p={p} hash={hash:#018x}"
            );
        }
    }
}

#[test]
fn converted_sketch_equals_direct_dense_registers() {
    for p in [4, 10, 14] {
        let n = 2 * sparse_limit(p) as u64 + 7;
        let sketch = sketch_of(p, 0..n);
        assert!(!sketch.is_sparse());
        let mut direct = dense::empty(p);
        for i in 0..n {
            let (index, rank) = dense::position(item_hash(&i.to_le_bytes()), p);
            direct[index] = direct[index].max(rank);
        }
        assert_eq!(sketch.repr, Repr::Dense(direct));
    }
}

#[test]
fn fold_equals_direct_sketch() {
    for n in [0, 1, 5, 40, 300, 3000, 50_000] {
        let high = sketch_of(16, 0..n);
        for low in [4, 7, 10, 15, 16] {
            assert_eq!(
                high.fold_to(low).unwrap(),
                sketch_of(low, 0..n),
                "n={n} {} -> {low}",
                if high.is_sparse() { "sparse" } else { "dense" }
            );
        }
    }
    // Registers with every kind of dropped bits and extreme ranks.
    let mut state = 3;
    let hashes: Vec<u64> = test_hashes()
        .into_iter()
        .chain((0..50_000).map(|_| splitmix(&mut state) >> 20))
        .collect();
    let mut high = Hll::new(18).unwrap();
    hashes.iter().for_each(|&h| high.insert_hash(h));
    for low in MIN_PRECISION..=MAX_PRECISION {
        let mut direct = Hll::new(low).unwrap();
        hashes.iter().for_each(|&h| direct.insert_hash(h));
        assert_eq!(high.fold_to(low).unwrap(), direct, "18 -> {low}");
    }
}

#[test]
fn fold_only_goes_down() {
    let sketch = sketch_of(12, 0..10);
    let err = sketch.fold_to(13).unwrap_err();
    assert_eq!(err.parameter, "precision");
    assert!(err.reason.contains("only folds down"), "{err}");
    assert!(sketch.fold_to(3).is_err());
    assert_eq!(sketch.fold_to(12).unwrap(), sketch);
}

#[test]
fn merge_with_lower_precision_folds() {
    let cases: [(u8, u64, u8, u64); 4] = [
        (14, 20_000, 10, 30_000), // dense into dense
        (14, 100, 6, 150),        // sparse into sparse, result dense
        (14, 100, 10, 30_000),    // sparse into dense
        (8, 20_000, 12, 300),     // dense into sparse
    ];
    for (pa, na, pb, nb) in cases {
        let a = sketch_of(pa, 0..na);
        let b = sketch_of(pb, na / 2..nb);
        let expected = sketch_of(pa.min(pb), 0..na.max(nb));
        let mut ab = a.clone();
        ab.merge(&b).unwrap();
        let mut ba = b.clone();
        ba.merge(&a).unwrap();
        assert_eq!(ab, expected, "p{pa}·{na} into p{pb}·{nb}");
        assert_eq!(ba, expected, "p{pb}·{nb} into p{pa}·{na}");
    }
}

#[test]
fn merge_of_sparse_sketches_stays_sparse_while_small() {
    let mut a = sketch_of(14, 0..1000);
    a.merge(&sketch_of(14, 1000..2000)).unwrap();
    assert!(a.is_sparse());
    assert_eq!(a, sketch_of(14, 0..2000));
    a.merge(&sketch_of(14, 2000..4000)).unwrap();
    assert!(!a.is_sparse());
    assert_eq!(a, sketch_of(14, 0..4000));
}

#[test]
fn encoding_round_trips_in_both_states() {
    for (p, n) in [
        (4, 0),
        (4, 3),
        (4, 1000),
        (14, 3000),
        (14, 4000),
        (18, 100_000),
    ] {
        let sketch = sketch_of(p, 0..n);
        let bytes = sketch.encode();
        assert_eq!(Hll::decode(&bytes).unwrap(), sketch, "p={p} n={n}");
    }
}

#[test]
fn size_bytes_follows_the_state() {
    assert_eq!(sketch_of(14, 0..10_000).size_bytes(), 1 << 14);
    let sparse = sketch_of(14, 0..1000);
    assert!(sparse.size_bytes() >= 4 * 1000);
    assert!(sparse.size_bytes() < 1 << 14);
}

/// Pins the full frame of a sparse sketch: header, precision 14, sparse precision 25,
/// representation 0, reserved 0, three entries in index order, checksum.
#[test]
fn golden_bytes_sparse() {
    let mut sketch = Hll::new(14).unwrap();
    for item in ["a", "b", "c"] {
        sketch.insert(item.as_bytes());
    }
    assert_eq!(
        hex(&sketch.encode()),
        concat!(
            "4847534b01010000", // magic, version 1, kind 1 (distinct), flags 0
            "14000000",         // body length 20
            "0e190000",         // precision 14, sparse precision 25, sparse, reserved
            "03000000",         // three entries
            "0119f52d",         // entries, index << 6 | rank, ascending
            "44525338",
            "42911671",
            "4d59747628fa7cf6", // checksum
        )
    );
}

/// Pins the full frame of a dense sketch: precision 4 has 16 registers, 12 bytes packed.
#[test]
fn golden_bytes_dense() {
    let mut sketch = Hll::new(4).unwrap();
    for i in 0..100 {
        sketch.insert(i.to_string().as_bytes());
    }
    assert!(!sketch.is_sparse());
    assert_eq!(
        hex(&sketch.encode()),
        concat!(
            "4847534b01010000",         // magic, version 1, kind 1 (distinct), flags 0
            "10000000",                 // body length 16
            "04190100",                 // precision 4, sparse precision 25, dense, reserved
            "8381088441200b211445600c", // 16 registers, 6 bits each, LSB first
            "cff75e92be8c8253",         // checksum
        )
    );
}

fn invalid_field(result: Result<Hll, DecodeError>) -> &'static str {
    match result {
        Err(DecodeError::Invalid { field, .. }) => field,
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

#[test]
fn decode_names_each_invalid_field() {
    let sparse = body_of(&sketch_of(8, 0..10));
    assert_eq!(sparse.len(), 8 + 4 * 10);
    let with = |at: usize, value: u8| {
        let mut body = sparse.clone();
        body[at] = value;
        Hll::decode_body(&body)
    };
    assert_eq!(invalid_field(with(0, 3)), "precision");
    assert_eq!(invalid_field(with(0, 19)), "precision");
    assert_eq!(invalid_field(with(1, 24)), "sparse precision");
    assert_eq!(invalid_field(with(2, 2)), "representation");
    assert_eq!(invalid_field(with(3, 1)), "reserved");
    // Precision 8 turns dense above 48 entries.
    assert_eq!(invalid_field(with(4, 49)), "sparse entry count");
    assert!(matches!(with(4, 11), Err(DecodeError::Truncated { .. })));
    assert!(matches!(
        with(4, 9),
        Err(DecodeError::TrailingBytes { extra: 4 })
    ));

    let entry =
        |body: &[u8], k: usize| u32::from_le_bytes(body[8 + 4 * k..12 + 4 * k].try_into().unwrap());
    let with_entry = |k: usize, value: u32| {
        let mut body = sparse.clone();
        body[8 + 4 * k..12 + 4 * k].copy_from_slice(&value.to_le_bytes());
        Hll::decode_body(&body)
    };
    let (first, second, last) = (entry(&sparse, 0), entry(&sparse, 1), entry(&sparse, 9));
    assert_eq!(invalid_field(with_entry(0, second)), "sparse entry"); // duplicate
    assert_eq!(invalid_field(with_entry(1, first)), "sparse entry"); // duplicate
    assert_eq!(
        invalid_field(with_entry(0, (second & !63) | 1)),
        "sparse entry"
    ); // same index, other rank
    assert_eq!(
        invalid_field(with_entry(0, entry(&sparse, 2))),
        "sparse entry"
    ); // order
    assert_eq!(invalid_field(with_entry(0, first & !63)), "sparse entry"); // rank 0
    assert_eq!(
        invalid_field(with_entry(0, first & !63 | 41)),
        "sparse entry"
    ); // rank 41
    assert!(Hll::decode_body(&sparse).is_ok());
    assert!(with_entry(9, (last & !63) | 40).is_ok()); // rank 40 is the largest
    assert_eq!(invalid_field(with_entry(9, 1 << 31 | 1)), "sparse entry"); // index ≥ 2^25

    let dense = body_of(&sketch_of(4, 0..100));
    assert_eq!(dense.len(), 4 + 12);
    let mut body = dense.clone();
    body[4] = (body[4] & !63) | 62; // register 0 above 61, the largest rank at p=4
    assert_eq!(invalid_field(Hll::decode_body(&body)), "register");
    body[4] = (body[4] & !63) | 61;
    assert!(Hll::decode_body(&body).is_ok());
    assert!(matches!(
        Hll::decode_body(&dense[..dense.len() - 1]),
        Err(DecodeError::Truncated { .. })
    ));
    let mut long = dense.clone();
    long.push(0);
    assert!(matches!(
        Hll::decode_body(&long),
        Err(DecodeError::TrailingBytes { extra: 1 })
    ));
    assert!(matches!(
        Hll::decode_body(&[]),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn decode_refuses_other_kinds() {
    let body = body_of(&sketch_of(8, 0..10));
    let framed = encode_frame(Kind::Frequency, &body);
    assert_eq!(
        Hll::decode(&framed),
        Err(DecodeError::WrongKind {
            expected: Kind::Distinct,
            found: Kind::Frequency
        })
    );
}

fn items(max_len: usize) -> impl Strategy<Value = Vec<u64>> {
    proptest::collection::vec(any::<u64>(), 0..max_len)
}

/// Checks commutativity, associativity, idempotence and merge = sketch of the union, all
/// as byte-identical encodings.
fn check_merge_laws(precisions: [u8; 3], sets: [&[u64]; 3]) -> Result<(), TestCaseError> {
    let sketches: Vec<Hll> = precisions
        .iter()
        .zip(sets)
        .map(|(&p, set)| sketch_of(p, set.iter().copied()))
        .collect();
    let merged = |x: &Hll, y: &Hll| {
        let mut out = x.clone();
        out.merge(y).unwrap();
        out
    };
    let (a, b, c) = (&sketches[0], &sketches[1], &sketches[2]);
    let ab = merged(a, b);
    prop_assert_eq!(hex(&ab.encode()), hex(&merged(b, a).encode()));
    let union_ab = sketch_of(
        precisions[0].min(precisions[1]),
        sets[0].iter().chain(sets[1]).copied(),
    );
    prop_assert_eq!(hex(&ab.encode()), hex(&union_ab.encode()));
    let ab_c = merged(&ab, c);
    let a_bc = merged(a, &merged(b, c));
    prop_assert_eq!(hex(&ab_c.encode()), hex(&a_bc.encode()));
    let p_min = precisions.into_iter().min().unwrap_or(DEFAULT_PRECISION);
    let union = sketch_of(p_min, sets.into_iter().flatten().copied());
    prop_assert_eq!(hex(&ab_c.encode()), hex(&union.encode()));
    prop_assert_eq!(&merged(&ab_c, &ab_c), &ab_c);
    Ok(())
}

/// Rewrites the frame's length field and checksum so that decoding gets past the frame
/// and into the body's own validation.
fn refit_frame(bytes: &mut [u8]) {
    let len = bytes.len();
    if len < crate::format::HEADER_LEN + crate::format::CHECKSUM_LEN {
        return;
    }
    let body_len = (len - crate::format::HEADER_LEN - crate::format::CHECKSUM_LEN) as u32;
    bytes[8..12].copy_from_slice(&body_len.to_le_bytes());
    let checksum = xxh3_64(&bytes[..len - 8]);
    bytes[len - 8..].copy_from_slice(&checksum.to_le_bytes());
}

proptest! {
    #[test]
    fn merge_laws_at_small_precisions(
        precision in 4u8..=8,
        a in items(120),
        b in items(120),
        c in items(120),
    ) {
        check_merge_laws([precision; 3], [&a, &b, &c])?;
    }

    #[test]
    fn merge_laws_across_precisions(
        precisions in proptest::array::uniform3(4u8..=12),
        a in items(400),
        b in items(400),
        c in items(400),
    ) {
        check_merge_laws(precisions, [&a, &b, &c])?;
    }

    #[test]
    fn decode_of_encode_is_identity(precision in 4u8..=18, set in items(3000)) {
        let sketch = sketch_of(precision, set);
        prop_assert_eq!(Hll::decode(&sketch.encode()).unwrap(), sketch);
    }

    #[test]
    fn decode_of_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = Hll::decode(&bytes);
        let _ = Hll::decode_body(&bytes);
        // Framed, the bytes always reach the body's validation.
        let framed = encode_frame(Kind::Distinct, &bytes);
        if let Ok(sketch) = Hll::decode(&framed) {
            prop_assert_eq!(sketch.encode(), framed);
        }
    }

    #[test]
    fn decode_of_mutated_encodings_never_panics(
        precision in 4u8..=6,
        set in items(100),
        mutations in proptest::collection::vec(mutation(), 1..4),
        refit in any::<bool>(),
    ) {
        let mut bytes = sketch_of(precision, set).encode();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        if refit {
            refit_frame(&mut bytes);
        }
        // Whatever decodes is canonical: it encodes back to the same bytes.
        if let Ok(sketch) = Hll::decode(&bytes) {
            prop_assert_eq!(sketch.encode(), bytes);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Precision 12 turns dense above 768 entries; these sets cross it alone and in union.
    #[test]
    fn merge_laws_at_precision_12(
        a in items(1600),
        b in items(1600),
        c in items(1600),
    ) {
        check_merge_laws([12; 3], [&a, &b, &c])?;
    }
}

/// The cached estimate never outlives a change of the registers, in either representation.
#[test]
fn cached_estimate_follows_every_change() {
    for precision in [4, 14] {
        let mut sketch = Hll::new(precision).unwrap();
        let mut last = sketch.estimate().estimate;
        assert_eq!(last, 0.0);
        for round in 0..50u32 {
            for i in 0..(round * 97) {
                sketch.insert(&(round, i).0.to_le_bytes());
                sketch.insert(&(u64::from(round) << 32 | u64::from(i)).to_le_bytes());
            }
            let fresh = Hll::decode(&sketch.encode()).unwrap().estimate().estimate;
            let cached = sketch.estimate().estimate;
            assert_eq!(cached, fresh, "precision {precision}, round {round}");
            assert!(cached >= last);
            last = cached;
        }
        let mut other = Hll::new(precision).unwrap();
        for i in 0..5000u32 {
            other.insert(&(i + 1_000_000).to_le_bytes());
        }
        let before = sketch.estimate().estimate;
        sketch.merge(&other).unwrap();
        let fresh = Hll::decode(&sketch.encode()).unwrap().estimate().estimate;
        assert_eq!(sketch.estimate().estimate, fresh);
        assert!(
            precision == 4 || fresh > before,
            "a merge of new items must move the estimate"
        );
        // A clone is equal whatever its cache holds.
        assert_eq!(sketch.clone(), Hll::decode(&sketch.encode()).unwrap());
    }
}

#[test]
fn inverse_square_roots_of_powers_of_two_are_exact_enough() {
    for k in 4..=25u32 {
        let m = 1u64 << k;
        let exact = 1.0 / (m as f64).sqrt();
        assert!(
            (super::inverse_sqrt_power_of_two(m) - exact).abs() <= exact * 1e-15,
            "2^{k}"
        );
    }
}
