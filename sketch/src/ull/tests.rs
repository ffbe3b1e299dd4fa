//! Tests of the UltraLogLog sketch: exactness of the representation changes and of the
//! conversion to HyperLogLog, the decoder's validation, pinned encodings, the merge laws as
//! properties, and the estimator's error against theory.

use super::*;
use crate::common::state::SparseSet;
use crate::hash::item_hash;
use crate::test_support::{apply, mutation};
use proptest::prelude::*;

mod insert_all;
mod sparse_rule;

/// A sketch of the items `i.to_le_bytes()` for each `i`.
fn sketch_of(precision: u8, items: impl IntoIterator<Item = u64>) -> Ull {
    let mut sketch = Ull::new(precision).unwrap();
    for item in items {
        sketch.insert(&item.to_le_bytes());
    }
    sketch
}

/// The HyperLogLog of the same items.
fn hll_of(precision: u8, items: impl IntoIterator<Item = u64>) -> Hll {
    let mut sketch = Hll::new(precision).unwrap();
    for item in items {
        sketch.insert(&item.to_le_bytes());
    }
    sketch
}

pub(super) fn body_of(sketch: &Ull) -> Vec<u8> {
    let mut body = Vec::new();
    sketch.encode_body(&mut body);
    body
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Well-mixed 64-bit values from a counter (splitmix64), for hash-level tests.
pub(super) fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hashes that reach the edge cases of the update values, then random ones, then random
/// ones sharing few indices (so that sparse groups of several ranks form).
fn test_hashes() -> Vec<u64> {
    let mut hashes = vec![0, u64::MAX];
    for k in 0..64 {
        hashes.extend([1 << k, (1 << k) - 1, !(1u64 << k), u64::MAX >> k]);
    }
    let mut state = 7;
    hashes.extend((0..50_000).map(|_| splitmix(&mut state)));
    hashes.extend((0..20_000).map(|i| splitmix(&mut state) & !(u64::MAX >> (i % 30))));
    hashes.extend((0..5_000).map(|_| splitmix(&mut state) >> 40));
    hashes
}

/// The dense registers at `precision` straight from the definition.
fn direct_registers(precision: u8, hashes: &[u64]) -> Box<[u8]> {
    let mut registers = crate::common::registers::empty(precision);
    for &hash in hashes {
        let (index, value) = registers::position(hash, precision);
        registers[index] = registers::update(registers[index], value);
    }
    registers
}

#[test]
fn precision_must_be_in_range() {
    let err = Ull::new(3).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid precision 3: must be between 4 and 18"
    );
    assert!(Ull::new(19).is_err());
    for p in MIN_PRECISION..=MAX_PRECISION {
        let sketch = Ull::new(p).unwrap();
        assert_eq!(sketch.precision(), p);
        assert!(sketch.is_sparse());
    }
    assert_eq!(Ull::default(), Ull::new(DEFAULT_PRECISION).unwrap());
}

#[test]
fn empty_sketch_estimates_zero() {
    let estimate = Ull::default().estimate();
    assert_eq!(estimate.estimate, 0.0);
    assert_eq!((estimate.lower95, estimate.upper95), (0.0, 0.0));
    // An empty dense sketch only arrives by decoding, but must read as zero too.
    let mut body = vec![4, 25, 3, 0];
    body.extend([0; 16]);
    let dense = Ull::decode_body(&body).unwrap();
    assert!(!dense.is_sparse());
    assert_eq!(dense.estimate().estimate, 0.0);
}

#[test]
fn small_counts_are_exact() {
    for p in [4, 10, 14, 18] {
        let mut sketch = Ull::new(p).unwrap();
        for n in 1..=100u64 {
            sketch.insert(&n.to_le_bytes());
            let estimate = sketch.estimate();
            if !sketch.is_sparse() {
                // Precision 4 turns dense above 4 indices.
                assert_eq!(p, 4);
                continue;
            }
            assert_eq!(estimate.estimate.round(), n as f64, "p={p} n={n}");
            assert!(estimate.lower95 <= n as f64 && n as f64 <= estimate.upper95);
            assert_eq!(estimate.lower95, n as f64);
        }
    }
}

#[test]
fn turns_dense_past_a_quarter_of_m_indices() {
    for p in [4, 8, 12, 18] {
        let limit = sparse_limit(p) as u64;
        let mut sketch = Ull::new(p).unwrap();
        let mut hashes = Vec::new();
        // Hashes `k << 39 | 1 << r` have sparse index k and rank 39 − r: several tokens
        // per index, one index each.
        for k in 0..limit {
            for r in [0, 1, 5] {
                hashes.push(k << 39 | 1 << r);
                sketch.insert_hash(k << 39 | 1 << r);
            }
            assert!(sketch.is_sparse(), "p={p} after {} indices", k + 1);
        }
        sketch.insert_hash(limit << 39);
        hashes.push(limit << 39);
        assert!(!sketch.is_sparse(), "p={p}");
        assert_eq!(sketch.repr, Repr::Dense(direct_registers(p, &hashes)));
        assert_eq!(sketch.to_hll(), {
            let mut hll = Hll::new(p).unwrap();
            hashes.iter().for_each(|&h| hll.insert_hash(h));
            hll
        });
    }
}

#[test]
fn converted_token_equals_direct_dense_insert() {
    let hashes = test_hashes();
    for p in MIN_PRECISION..=MAX_PRECISION {
        for &hash in &hashes {
            assert_eq!(
                sparse::dense_position(sparse::token_of_hash(hash), p),
                registers::position(hash, p),
                "p={p} hash={hash:#018x}"
            );
        }
    }
}

#[test]
fn sketch_equals_direct_registers_whatever_the_path() {
    let hashes = test_hashes();
    for p in [4, 10, 14] {
        let mut sketch = Ull::new(p).unwrap();
        hashes.iter().for_each(|&h| sketch.insert_hash(h));
        assert_eq!(sketch.repr, Repr::Dense(direct_registers(p, &hashes)));
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
                "n={n} -> {low}"
            );
        }
    }
    let hashes = test_hashes();
    let mut high = Ull::new(18).unwrap();
    hashes.iter().for_each(|&h| high.insert_hash(h));
    for low in MIN_PRECISION..=MAX_PRECISION {
        let mut direct = Ull::new(low).unwrap();
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
fn to_hll_equals_the_hll_of_the_same_items() {
    for p in [4, 8, 12, 14] {
        // Across both switches: the HLL's at 3m/16 indices and ours at m/4.
        for n in [
            0,
            1,
            3,
            50,
            3 << (p - 4),
            (3 << (p - 4)) + 1,
            1 << (p - 2),
            (1 << (p - 2)) + 5,
            1 << (p + 3),
        ] {
            let ull = sketch_of(p, 0..n);
            let hll = hll_of(p, 0..n);
            assert_eq!(ull.to_hll(), hll, "p={p} n={n}");
            assert_eq!(ull.to_hll().encode(), hll.encode(), "p={p} n={n}");
        }
    }
}

#[test]
fn size_bytes_follows_the_state() {
    assert_eq!(sketch_of(14, 0..10_000).size_bytes(), 1 << 14);
    // Inserted into: a table of 8-byte slots, at most three quarters full, grown by
    // doubling.
    let sparse = sketch_of(14, 0..1000);
    assert!(sparse.is_sparse());
    assert!(sparse.size_bytes() >= 8 * 1000 * 4 / 3);
    assert!(sparse.size_bytes() <= 8 * 1000 * 8 / 3);
    // Decoded (or merged): the sorted list, four bytes a token, below the registers.
    let mut body = Vec::new();
    sparse.encode_body(&mut body);
    let decoded = Ull::decode_body(&body).unwrap();
    assert!(decoded.size_bytes() >= 4 * 1000);
    assert!(decoded.size_bytes() < 1 << 14);
    assert_eq!(decoded, sparse);
}

/// `insert_all` in runs, each starting from the state the one before left (a table, a
/// decoded sorted list, a reserved table trimmed or not), equals one-by-one inserts of the
/// same items, byte for byte, across the turn to dense and with repeated items; and what
/// a run reserved and left unused is given back.
#[test]
fn insert_all_equals_one_by_one() {
    // The smallest table: eight slots of eight bytes.
    const MIN_TABLE_BYTES: usize = 64;
    let mut state = 11;
    for precision in [4u8, 10, 13] {
        let limit = sparse_limit(precision);
        for run in [1usize, 7, limit / 3 + 1, limit, 3 * limit] {
            // Runs of fresh items, then runs repeating a few items many times.
            let items: Vec<Vec<u8>> = (0..3 * limit + 5)
                .map(|_| splitmix(&mut state).to_le_bytes().to_vec())
                .chain((0..2 * run).map(|i| (i % 3).to_le_bytes().to_vec()))
                .collect();
            let mut one = Ull::new(precision).unwrap();
            let mut all = Ull::new(precision).unwrap();
            for (k, chunk) in items.chunks(run).enumerate() {
                chunk.iter().for_each(|item| one.insert(item));
                all.insert_all(chunk.iter().map(Vec::as_slice));
                assert_eq!(all, one, "p={precision} run={run} chunk {k}");
                assert_eq!(hex(&body_of(&all)), hex(&body_of(&one)));
                assert_eq!(all.estimate(), one.estimate());
                if k % 2 == 1 {
                    // The decoded layout: a sorted list, a table again on the next run.
                    all = Ull::decode_body(&body_of(&all)).unwrap();
                }
                // Never more than twice the table the items alone grow to.
                assert!(
                    all.size_bytes() <= 2 * one.size_bytes().max(MIN_TABLE_BYTES),
                    "p={precision} run={run} chunk {k}: {} bytes, one by one {}",
                    all.size_bytes(),
                    one.size_bytes()
                );
            }
        }
    }
}

/// A long run of a few repeated items reserves a table for the run and gives it back:
/// the sketch ends no larger than one built item by item.
#[test]
fn insert_all_of_repeats_gives_back_the_room() {
    let repeats: Vec<Vec<u8>> = (0..5000u64)
        .map(|i| (i % 40).to_le_bytes().to_vec())
        .collect();
    let mut all = Ull::new(13).unwrap();
    all.insert_all(repeats.iter().map(Vec::as_slice));
    let one = sketch_of(13, 0..40);
    assert_eq!(all, one);
    assert!(all.is_sparse());
    assert!(
        all.size_bytes() <= 2 * one.size_bytes(),
        "{} bytes for 40 items, {} one by one",
        all.size_bytes(),
        one.size_bytes()
    );
}

/// Pins the body of a sparse sketch: precision 14, sparse precision 25, representation 2,
/// reserved 0, three tokens in ascending order. The tokens are the HyperLogLog's entries.
#[test]
fn golden_bytes_sparse() {
    let mut sketch = Ull::new(14).unwrap();
    for item in ["a", "b", "c"] {
        sketch.insert(item.as_bytes());
    }
    assert_eq!(
        hex(&body_of(&sketch)),
        concat!(
            "0e190200", // precision 14, sparse precision 25, UltraLogLog sparse, reserved
            "03000000", // three tokens
            "0119f52d", // tokens, index << 6 | rank, ascending
            "44525338", "42911671",
        )
    );
}

/// Pins the body of a dense sketch: precision 4 has 16 registers, one byte each.
#[test]
fn golden_bytes_dense() {
    let mut sketch = Ull::new(4).unwrap();
    for i in 0..100 {
        sketch.insert(i.to_string().as_bytes());
    }
    assert!(!sketch.is_sparse());
    // The HyperLogLog of the same items has registers 3 6 8 2 4 6 4 8 11 4 2 5 5 1 6 3
    // (docs/FORMAT.md): each byte here is 4 times that plus the history bits.
    assert_eq!(
        hex(&body_of(&sketch)),
        concat!(
            "04190300",                         // precision 4, sparse precision 25, dense, reserved
            "0f18200a131813202c110a141504180f", // 16 registers
        )
    );
    let body = body_of(&sketch);
    let ranks: Vec<u8> = body[4..].iter().map(|r| r >> 2).collect();
    assert_eq!(ranks, [3, 6, 8, 2, 4, 6, 4, 8, 11, 4, 2, 5, 5, 1, 6, 3]);
    assert_eq!(
        sketch.to_hll().encode(),
        {
            let mut hll = Hll::new(4).unwrap();
            (0..100).for_each(|i| hll.insert(i.to_string().as_bytes()));
            hll
        }
        .encode()
    );
}

fn invalid_field(result: Result<Ull, DecodeError>) -> &'static str {
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
        Ull::decode_body(&body)
    };
    assert_eq!(invalid_field(with(0, 3)), "precision");
    assert_eq!(invalid_field(with(0, 19)), "precision");
    assert_eq!(invalid_field(with(1, 24)), "sparse precision");
    assert_eq!(invalid_field(with(2, 0)), "representation");
    assert_eq!(invalid_field(with(2, 1)), "representation");
    assert_eq!(invalid_field(with(3, 1)), "reserved");
    // Precision 8 holds at most 3 · 64 tokens.
    assert_eq!(invalid_field(with(4, 193)), "sparse token count");
    assert!(matches!(with(4, 11), Err(DecodeError::Truncated { .. })));
    assert!(matches!(
        with(4, 9),
        Err(DecodeError::TrailingBytes { extra: 4 })
    ));

    let token =
        |body: &[u8], k: usize| u32::from_le_bytes(body[8 + 4 * k..12 + 4 * k].try_into().unwrap());
    let with_token = |k: usize, value: u32| {
        let mut body = sparse.clone();
        body[8 + 4 * k..12 + 4 * k].copy_from_slice(&value.to_le_bytes());
        Ull::decode_body(&body)
    };
    let (first, second, last) = (token(&sparse, 0), token(&sparse, 1), token(&sparse, 9));
    assert_eq!(invalid_field(with_token(0, second)), "sparse token"); // duplicate
    assert_eq!(invalid_field(with_token(1, first)), "sparse token"); // duplicate
    assert_eq!(
        invalid_field(with_token(0, token(&sparse, 2))),
        "sparse token"
    ); // order
    assert_eq!(invalid_field(with_token(0, first & !63)), "sparse token"); // rank 0
    assert_eq!(
        invalid_field(with_token(0, first & !63 | 41)),
        "sparse token"
    ); // rank 41
    assert_eq!(invalid_field(with_token(9, 1 << 31 | 1)), "sparse token"); // index ≥ 2^25
    assert!(with_token(9, (last & !63) | 40).is_ok()); // rank 40 is the largest
    // Same index as the previous token: two ranks below is kept, three is not.
    let mut body = sparse.clone();
    let base = second & !63;
    body[8..12].copy_from_slice(&(base | 1).to_le_bytes());
    body[12..16].copy_from_slice(&(base | 3).to_le_bytes());
    assert!(Ull::decode_body(&body).is_ok());
    body[12..16].copy_from_slice(&(base | 4).to_le_bytes());
    assert_eq!(invalid_field(Ull::decode_body(&body)), "sparse token");
    // More indices than a sparse sketch holds: 65 at precision 8.
    let mut body = vec![8, 25, 2, 0, 65, 0, 0, 0];
    for index in 0..65u32 {
        body.extend_from_slice(&(index << 6 | 1).to_le_bytes());
    }
    assert_eq!(invalid_field(Ull::decode_body(&body)), "sparse token count");
    body[4] = 64;
    body.truncate(body.len() - 4);
    assert!(Ull::decode_body(&body).is_ok());

    let dense = body_of(&sketch_of(4, 0..100));
    assert_eq!(dense.len(), 4 + 16);
    for (value, ok) in [
        (0, true),
        (4, true),
        (8, true),
        (10, true),
        (244, true),
        (247, true),
    ]
    .into_iter()
    .chain([1, 2, 3, 5, 6, 7, 9, 11, 248, 255].map(|v| (v, false)))
    {
        let mut body = dense.clone();
        body[4 + 7] = value;
        if ok {
            assert!(Ull::decode_body(&body).is_ok(), "{value}");
        } else {
            assert_eq!(
                invalid_field(Ull::decode_body(&body)),
                "register",
                "{value}"
            );
        }
        assert_eq!(Ull::validate_body(&body).is_ok(), ok);
    }
    assert!(matches!(
        Ull::decode_body(&dense[..dense.len() - 1]),
        Err(DecodeError::Truncated { .. })
    ));
    let mut long = dense.clone();
    long.push(0);
    assert!(matches!(
        Ull::decode_body(&long),
        Err(DecodeError::TrailingBytes { extra: 1 })
    ));
    assert!(matches!(
        Ull::decode_body(&[]),
        Err(DecodeError::Truncated { .. })
    ));
    // A HyperLogLog body is not an UltraLogLog body, and the other way round.
    let mut hll_body = Vec::new();
    hll_of(8, 0..10).encode_body(&mut hll_body);
    assert_eq!(invalid_field(Ull::decode_body(&hll_body)), "representation");
    assert!(Hll::decode_body(&sparse).is_err());
}

#[test]
fn cached_estimate_follows_every_change() {
    for precision in [4, 14] {
        let mut sketch = Ull::new(precision).unwrap();
        // Unlike HyperLogLog's, the maximum-likelihood estimate is not monotone in the
        // registers (a new largest value can drop two remembered ones), so only freshness is
        // checked.
        for round in 0..40u64 {
            for i in 0..(round * 97) {
                sketch.insert(&(round << 32 | i).to_le_bytes());
            }
            let fresh = Ull::decode_body(&body_of(&sketch))
                .unwrap()
                .estimate()
                .estimate;
            let cached = sketch.estimate().estimate;
            assert_eq!(cached, fresh, "precision {precision}, round {round}");
        }
        let before = sketch.estimate().estimate;
        sketch
            .merge(&sketch_of(precision, 1 << 40..(1 << 40) + 5000))
            .unwrap();
        let fresh = Ull::decode_body(&body_of(&sketch))
            .unwrap()
            .estimate()
            .estimate;
        assert_eq!(sketch.estimate().estimate, fresh);
        assert!(precision == 4 || fresh > before);
    }
}

fn items(max_len: usize) -> impl Strategy<Value = Vec<u64>> {
    proptest::collection::vec(any::<u64>(), 0..max_len)
}

/// Items as hashes, with the low bits of most forced to zero so that sketches see large
/// update values and sparse groups of several ranks: the cases random items almost never
/// reach.
fn hashes(max_len: usize) -> impl Strategy<Value = Vec<u64>> {
    proptest::collection::vec(
        (any::<u64>(), 0u32..64).prop_map(|(h, zeros)| h & !(u64::MAX >> (64 - zeros.max(1)))),
        0..max_len,
    )
}

fn of_hashes(precision: u8, hashes: &[u64]) -> Ull {
    let mut sketch = Ull::new(precision).unwrap();
    hashes.iter().for_each(|&h| sketch.insert_hash(h));
    sketch
}

/// Commutativity, associativity, idempotence and merge = sketch of the union, all as
/// byte-identical encodings.
fn check_merge_laws(precisions: [u8; 3], sets: [&[u64]; 3]) -> Result<(), TestCaseError> {
    let sketches: Vec<Ull> = precisions
        .iter()
        .zip(sets)
        .map(|(&p, set)| of_hashes(p, set))
        .collect();
    let merged = |x: &Ull, y: &Ull| {
        let mut out = x.clone();
        out.merge(y).unwrap();
        out
    };
    let (a, b, c) = (&sketches[0], &sketches[1], &sketches[2]);
    let ab = merged(a, b);
    prop_assert_eq!(hex(&body_of(&ab)), hex(&body_of(&merged(b, a))));
    let union_ab: Vec<u64> = sets[0].iter().chain(sets[1]).copied().collect();
    let union_ab = of_hashes(precisions[0].min(precisions[1]), &union_ab);
    prop_assert_eq!(hex(&body_of(&ab)), hex(&body_of(&union_ab)));
    let ab_c = merged(&ab, c);
    let a_bc = merged(a, &merged(b, c));
    prop_assert_eq!(hex(&body_of(&ab_c)), hex(&body_of(&a_bc)));
    let p_min = precisions.into_iter().min().unwrap_or(DEFAULT_PRECISION);
    let union: Vec<u64> = sets.into_iter().flatten().copied().collect();
    prop_assert_eq!(
        hex(&body_of(&ab_c)),
        hex(&body_of(&of_hashes(p_min, &union)))
    );
    prop_assert_eq!(&merged(&ab_c, &ab_c), &ab_c);
    prop_assert_eq!(&merged(&ab_c, a), &ab_c);
    Ok(())
}

proptest! {
    #[test]
    fn merge_laws_at_small_precisions(
        precision in 4u8..=8,
        a in hashes(120),
        b in hashes(120),
        c in hashes(120),
    ) {
        check_merge_laws([precision; 3], [&a, &b, &c])?;
    }

    #[test]
    fn merge_laws_across_precisions(
        precisions in proptest::array::uniform3(4u8..=12),
        a in hashes(400),
        b in hashes(400),
        c in hashes(400),
    ) {
        check_merge_laws(precisions, [&a, &b, &c])?;
    }

    /// The conversion to HyperLogLog is exact for any items, either state, any precision.
    #[test]
    fn to_hll_equals_hll_of_the_same_items(precision in 4u8..=18, set in items(3000)) {
        let ull = sketch_of(precision, set.iter().copied());
        let hll = hll_of(precision, set.iter().copied());
        prop_assert_eq!(hex(&ull.to_hll().encode()), hex(&hll.encode()));
    }

    /// The same with crafted hashes: large update values and shared sparse indices.
    #[test]
    fn to_hll_equals_hll_of_the_same_hashes(precision in 4u8..=12, set in hashes(1000)) {
        let ull = of_hashes(precision, &set);
        let mut hll = Hll::new(precision).unwrap();
        set.iter().for_each(|&h| hll.insert_hash(h));
        prop_assert_eq!(hex(&ull.to_hll().encode()), hex(&hll.encode()));
        // Dense registers are the HyperLogLog's with history bits.
        if !ull.is_sparse() {
            prop_assert!(!ull.to_hll().is_sparse());
        }
    }

    #[test]
    fn decode_of_encode_is_identity(precision in 4u8..=18, set in items(3000), extra in hashes(50)) {
        let mut sketch = sketch_of(precision, set);
        extra.iter().for_each(|&h| sketch.insert_hash(h));
        let body = body_of(&sketch);
        prop_assert_eq!(&Ull::decode_body(&body).unwrap(), &sketch);
        prop_assert!(Ull::validate_body(&body).is_ok());
    }

    #[test]
    fn decode_of_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let decoded = Ull::decode_body(&bytes);
        prop_assert_eq!(decoded.is_ok(), Ull::validate_body(&bytes).is_ok());
        // Whatever decodes is canonical: it encodes back to the same bytes.
        if let Ok(sketch) = decoded {
            prop_assert_eq!(body_of(&sketch), bytes);
        }
    }

    #[test]
    fn decode_of_mutated_encodings_never_panics(
        precision in 4u8..=6,
        set in hashes(100),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let mut bytes = body_of(&of_hashes(precision, &set));
        for m in &mutations {
            apply(&mut bytes, m);
        }
        let decoded = Ull::decode_body(&bytes);
        prop_assert_eq!(decoded.is_ok(), Ull::validate_body(&bytes).is_ok());
        if let Ok(sketch) = decoded {
            prop_assert_eq!(body_of(&sketch), bytes);
            // A decoded sketch is safe to use: estimate, merge, fold, convert.
            let _ = sketch.estimate();
            let _ = sketch.to_hll();
            let mut other = of_hashes(precision, &set);
            other.merge(&sketch).unwrap();
            let _ = sketch.fold_to(MIN_PRECISION).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Precision 12 turns dense above 1024 indices; these sets cross it alone and in union,
    /// mixing sparse and dense operands.
    #[test]
    fn merge_laws_at_precision_12(
        a in items(2000),
        b in items(2000),
        c in hashes(300),
    ) {
        let hashed = |set: &[u64]| set.iter().map(|i| item_hash(&i.to_le_bytes())).collect::<Vec<_>>();
        check_merge_laws([12; 3], [&hashed(&a), &hashed(&b), &c])?;
    }
}

/// The two-sided chi-square bound on a sample variance: with `t` samples, `(t − 1)·s²/σ²`
/// is χ² with `t − 1` degrees of freedom, which for large `t` is within
/// `(t − 1) ± z·√(2(t − 1))` with probability given by `z`. Returns the upper bound on
/// `s/σ` at `z` standard deviations.
fn chi_square_upper_ratio(trials: usize, z: f64) -> f64 {
    let dof = (trials - 1) as f64;
    ((dof + z * (2.0 * dof).sqrt()) / dof).sqrt()
}

/// RMSE and interval coverage against theory, with a fixed seed: at n = 20·m and
/// n = 100·m, where the asymptotic error 0.761/√m holds, the RMSE over 600 sketches must be
/// within the chi-square bound at 4 sigma (with 2% added for the estimator's O(1/m)
/// bias and its approach to the asymptote), and at least 2% lower than HyperLogLog's
/// theory would allow for the same bytes: at the same memory of m bytes, HyperLogLog has
/// 4m/3 registers and error 1.04/√(4m/3) = 0.90/√m. The 95% interval must cover the truth
/// at a rate within the binomial 4-sigma band around 95%.
#[test]
fn error_and_coverage_match_theory() {
    const TRIALS: usize = 600;
    let p = 8;
    let m = 1u64 << p;
    let theory = estimate::RELATIVE_ERROR_SQRT_M / (m as f64).sqrt();
    let mut state = 0x5eed;
    for n in [20 * m, 100 * m] {
        let mut square_sum = 0.0;
        let mut covered = 0usize;
        for _ in 0..TRIALS {
            let mut sketch = Ull::new(p).unwrap();
            for _ in 0..n {
                sketch.insert_hash(splitmix(&mut state));
            }
            let estimate = sketch.estimate();
            let error = (estimate.estimate - n as f64) / n as f64;
            square_sum += error * error;
            covered += usize::from(estimate.lower95 <= n as f64 && n as f64 <= estimate.upper95);
        }
        let rmse = (square_sum / TRIALS as f64).sqrt();
        let bound = theory * chi_square_upper_ratio(TRIALS, 4.0) * 1.02;
        assert!(rmse <= bound, "n={n}: RMSE {rmse:.5} above {bound:.5}");
        assert!(
            rmse >= theory / chi_square_upper_ratio(TRIALS, 4.0) / 1.02,
            "n={n}: RMSE {rmse:.5} suspiciously low"
        );
        let hll_same_bytes = 1.04 / ((4 * m / 3) as f64).sqrt();
        assert!(
            rmse < 0.98 * hll_same_bytes,
            "n={n}: {rmse:.5} vs HLL {hll_same_bytes:.5}"
        );
        let rate = covered as f64 / TRIALS as f64;
        let band = 4.0 * (0.95 * 0.05 / TRIALS as f64).sqrt();
        assert!(
            (rate - 0.95).abs() <= band,
            "n={n}: coverage {rate:.3} outside 0.95 ± {band:.3}"
        );
    }
}

/// The one-pass check of sparse tokens accepts exactly what the token-by-token rules do:
/// random lists over few indices and ranks (so that order, duplicate, pruned and
/// too-many-indices faults all occur), at a precision whose limit is reached.
#[test]
fn sparse_validation_in_one_pass_agrees_with_the_rules() {
    let mut state = 7;
    let precision = 4; // at most 4 indices, 12 tokens
    let (mut valid, mut invalid) = (0, 0);
    for _ in 0..200_000 {
        let count = (splitmix(&mut state) % 8) as usize;
        let mut tokens: Vec<u32> = (0..count)
            .map(|_| {
                let r = splitmix(&mut state);
                let index = (r % 6) as u32 | if r.is_multiple_of(97) { 1 << 25 } else { 0 };
                let rank = ((r >> 8) % 9) as u32 + u32::from(r.is_multiple_of(89)) * 40;
                index << 6 | rank
            })
            .collect();
        if splitmix(&mut state).is_multiple_of(2) {
            tokens.sort_unstable();
        }
        let rules = tokens.windows(2).all(|w| w[0] < w[1])
            && tokens.iter().all(|&t| {
                t >> 31 == 0 && (1..=sparse::MAX_SPARSE_RANK).contains(&sparse::rank_of(t))
            })
            && sparse::first_pruned(&tokens).is_none()
            && sparse::count_indices(&tokens) <= sparse_limit(precision);
        let mut body = vec![precision, SPARSE_PRECISION, REPRESENTATION_SPARSE, 0];
        body.extend_from_slice(&(count as u32).to_le_bytes());
        tokens
            .iter()
            .for_each(|t| body.extend_from_slice(&t.to_le_bytes()));
        assert_eq!(Ull::validate_body(&body).is_ok(), rules, "{tokens:x?}");
        assert_eq!(Ull::decode_body(&body).is_ok(), rules, "{tokens:x?}");
        if rules {
            valid += 1;
        } else {
            invalid += 1;
        }
    }
    assert!(
        valid > 10_000 && invalid > 10_000,
        "{valid} valid, {invalid} invalid"
    );
}
