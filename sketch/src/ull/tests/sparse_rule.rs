//! Tests of the sparse layouts (sorted list and index table) and of the one-pass sparse
//! body check, against a reference model of the rule: the canonical token list of a set
//! of hashes is every distinct token except those three or more ranks below the largest
//! of their index.

use super::*;
use std::collections::BTreeSet;

/// The canonical token list of `hashes`, by the rule (not by any layout).
fn reference_tokens(hashes: &[u64]) -> Vec<u32> {
    let set: BTreeSet<u32> = hashes.iter().map(|&h| sparse::token_of_hash(h)).collect();
    let mut max_rank = std::collections::BTreeMap::<u32, u32>::new();
    for &t in &set {
        let m = max_rank.entry(sparse::index_of(t)).or_insert(0);
        *m = (*m).max(sparse::rank_of(t));
    }
    set.into_iter()
        .filter(|&t| sparse::rank_of(t) + 2 >= max_rank[&sparse::index_of(t)])
        .collect()
}

/// The body a sketch of `hashes` at `precision` must encode to, by the rule.
fn reference_body(precision: u8, hashes: &[u64]) -> Vec<u8> {
    let tokens = reference_tokens(hashes);
    let mut body = vec![precision, SPARSE_PRECISION];
    if sparse::count_indices(&tokens) > sparse_limit(precision) {
        body.extend([REPRESENTATION_DENSE, 0]);
        let mut registers = crate::common::registers::empty(precision);
        for &hash in hashes {
            let (index, value) = registers::position(hash, precision);
            registers[index] = registers::update(registers[index], value);
        }
        body.extend_from_slice(&registers);
    } else {
        body.extend([REPRESENTATION_SPARSE, 0]);
        body.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
        for t in tokens {
            body.extend_from_slice(&t.to_le_bytes());
        }
    }
    body
}

/// Hashes of one of several shapes: uniform, clustered at the top of the index range (the
/// table's last home slots, so probes wrap to slot 0), clustered at index 0, rank 40
/// (nothing below the index), few indices with many ranks, and every index's top.
fn hash_of_shape(shape: u64, state: &mut u64) -> u64 {
    let r = splitmix(state);
    match shape % 7 {
        0 => r,
        // Index 2^25 − 1 − (a few hundred), any rank.
        1 => ((1u64 << 25) - 1 - (r >> 55)) << 39 | (r & ((1 << 39) - 1)) >> (r % 39),
        // Indices from 0, any rank.
        2 => (r >> 55) << 39 | (r & ((1 << 39) - 1)) >> (r % 40),
        // Rank 40: the 39 low bits clear, at index 0, the top, or anywhere.
        3 => match r % 3 {
            0 => 0,
            1 => ((1u64 << 25) - 1) << 39,
            _ => r & !((1u64 << 39) - 1),
        },
        // Few indices, many ranks.
        4 => (r % 5) << 39 | (r >> 25) >> (r % 39),
        // Index 2^25 − 1 with every rank.
        5 => ((1u64 << 25) - 1) << 39 | (1u64 << 38) >> (r % 39),
        _ => r >> (r % 40),
    }
}

/// Mixed insert, encode-decode (to the sorted layout), merge and fold sequences encode like
/// a sketch built by the rule, at every step; and the estimate, the HyperLogLog and the
/// registers agree with the sorted layout's.
#[test]
fn layouts_encode_like_the_reference_after_mixed_sequences() {
    let mut state = 0x5eed;
    for round in 0..60u64 {
        let precision = [4u8, 5, 8, 10, 12, 14, 18][(round % 7) as usize];
        let shape_a = round;
        let shape_b = round / 7 + 1;
        let mut sketch = Ull::new(precision).unwrap();
        let mut hashes: Vec<u64> = Vec::new();
        let steps = 1 + splitmix(&mut state) % 12;
        for step in 0..steps {
            let n = splitmix(&mut state) % (1 << (precision - 1)).min(3000) + 1;
            match splitmix(&mut state) % 4 {
                // Inserts.
                0 | 1 => {
                    for _ in 0..n {
                        let h = hash_of_shape(
                            if step.is_multiple_of(2) {
                                shape_a
                            } else {
                                shape_b
                            },
                            &mut state,
                        );
                        hashes.push(h);
                        sketch.insert_hash(h);
                    }
                }
                // Round trip through the encoding: the sorted layout.
                2 => {
                    sketch = Ull::decode_body(&body_of(&sketch)).unwrap();
                }
                // A merge with another sketch, itself inserted into or decoded.
                _ => {
                    let mut other = Ull::new(precision).unwrap();
                    let mut more = Vec::new();
                    for _ in 0..n {
                        let h = hash_of_shape(shape_b + step, &mut state);
                        more.push(h);
                        other.insert_hash(h);
                    }
                    if step % 2 == 1 {
                        other = Ull::decode_body(&body_of(&other)).unwrap();
                    }
                    sketch.merge(&other).unwrap();
                    hashes.extend(more);
                }
            }
            let expected = reference_body(precision, &hashes);
            let body = body_of(&sketch);
            assert_eq!(body, expected, "round {round} step {step} p={precision}");
            let decoded = Ull::decode_body(&body).unwrap();
            assert_eq!(decoded, sketch, "round {round} step {step}");
            assert_eq!(
                decoded.estimate().estimate.to_bits(),
                sketch.estimate().estimate.to_bits(),
                "round {round} step {step}: the estimate depends on the layout"
            );
            let mut hll = crate::hll::Hll::new(precision).unwrap();
            for &h in &hashes {
                hll.insert_hash(h);
            }
            assert_eq!(sketch.to_hll(), hll, "round {round} step {step}");
            if sketch.is_sparse() {
                let lower = precision.saturating_sub(3).max(MIN_PRECISION);
                assert_eq!(
                    body_of(&sketch.fold_to(lower).unwrap()),
                    reference_body(lower, &hashes),
                    "round {round} step {step}: fold to {lower}"
                );
                // Dense at the sketch's own precision, by either layout.
                assert_eq!(
                    sketch.registers_at(precision),
                    decoded.registers_at(precision),
                    "round {round} step {step}"
                );
                // The registers either layout reports, index for index.
                if let (Repr::Sparse(table), Repr::Sparse(sorted)) = (&sketch.repr, &decoded.repr) {
                    let mut a: Vec<(u32, u8)> = table.registers().collect();
                    a.sort_unstable();
                    let b: Vec<(u32, u8)> = sorted.registers().collect();
                    assert_eq!(a, b, "round {round} step {step}");
                    let mut tokens: Vec<u32> = table.iter().collect();
                    tokens.sort_unstable();
                    assert_eq!(tokens, reference_tokens(&hashes));
                }
            }
        }
    }
}

/// The switch to dense happens exactly when the `m/4 + 1`-th index arrives, in a table
/// grown from a decoded list, and repeated or pruned tokens of held indices never switch.
#[test]
fn switch_point_is_exactly_a_quarter_of_m_indices() {
    for precision in [4u8, 6, 9, 13, 16, 18] {
        let limit = sparse_limit(precision) as u64;
        // Distinct indices spread over the range, each with a few ranks.
        let index_hash = |i: u64| (i * ((1u64 << 25) / (limit + 1))) << 39;
        let mut hashes = Vec::new();
        let mut sketch = Ull::new(precision).unwrap();
        for i in 0..limit {
            for rank_bit in [38u32, 37, 30, 0] {
                let h = index_hash(i) | 1 << rank_bit;
                hashes.push(h);
                sketch.insert_hash(h);
            }
            if i == limit / 2 {
                sketch = Ull::decode_body(&body_of(&sketch)).unwrap();
            }
        }
        assert!(sketch.is_sparse(), "p={precision}: {limit} indices");
        assert_eq!(body_of(&sketch), reference_body(precision, &hashes));
        // Rank 40 of index 0 and of an existing index: no new index.
        for h in [index_hash(0), index_hash(limit - 1)] {
            hashes.push(h);
            sketch.insert_hash(h);
        }
        assert!(sketch.is_sparse(), "p={precision}");
        let h = ((1u64 << 25) - 1) << 39;
        hashes.push(h);
        sketch.insert_hash(h);
        assert!(!sketch.is_sparse(), "p={precision}: {} indices", limit + 1);
        assert_eq!(body_of(&sketch), reference_body(precision, &hashes));
    }
}

/// The rules of a sparse body, checked token by token: the reference for the one-pass check.
fn rules_accept(precision: u8, tokens: &[u32]) -> bool {
    let limit = sparse_limit(precision);
    if tokens.len() > 3 * limit {
        return false;
    }
    for (i, &t) in tokens.iter().enumerate() {
        if u64::from(sparse::index_of(t)) >= sparse::SPARSE_REGISTERS {
            return false;
        }
        if !(1..=sparse::MAX_SPARSE_RANK).contains(&sparse::rank_of(t)) {
            return false;
        }
        if i > 0 && t <= tokens[i - 1] {
            return false;
        }
    }
    sparse::first_pruned(tokens).is_none() && sparse::count_indices(tokens) <= limit
}

fn sparse_body(precision: u8, count: u32, tokens: &[u32]) -> Vec<u8> {
    let mut body = vec![precision, SPARSE_PRECISION, REPRESENTATION_SPARSE, 0];
    body.extend_from_slice(&count.to_le_bytes());
    for t in tokens {
        body.extend_from_slice(&t.to_le_bytes());
    }
    body
}

/// The one-pass check accepts exactly the bodies the rules accept, on bodies built
/// near every rule's edge, and decode agrees with validate.
#[test]
fn one_pass_check_accepts_exactly_the_rules() {
    let mut state = 99;
    let max_index = (1u32 << 25) - 1;
    // Bodies refused and accepted by the rules: both must be common.
    let mut outcomes = [0usize; 2];
    for case in 0..40_000u64 {
        let precision = [4u8, 5, 6, 7][(case % 4) as usize];
        let limit = sparse_limit(precision);
        // A valid canonical list of up to limit + 1 indices, then a mutation.
        let n_indices = (splitmix(&mut state) % (limit as u64 + 2)) as usize;
        let mut indices: BTreeSet<u32> = BTreeSet::new();
        while indices.len() < n_indices {
            let i = match splitmix(&mut state) % 4 {
                0 => 0,
                1 => max_index - (splitmix(&mut state) % 3) as u32,
                _ => (splitmix(&mut state) >> 39) as u32,
            };
            indices.insert(i);
        }
        let mut tokens = Vec::new();
        for &i in &indices {
            let top = 1 + (splitmix(&mut state) % 40) as u32;
            let mut ranks = vec![top];
            if top > 1 && splitmix(&mut state).is_multiple_of(2) {
                ranks.push(top - 1);
            }
            if top > 2 && splitmix(&mut state).is_multiple_of(2) {
                ranks.push(top - 2);
            }
            ranks.sort_unstable();
            tokens.extend(ranks.into_iter().map(|r| i << 6 | r));
        }
        match splitmix(&mut state) % 9 {
            0 if !tokens.is_empty() => {
                // A rank at an edge: 0, 41, 63, 40, 1, or three below.
                let at = (splitmix(&mut state) % tokens.len() as u64) as usize;
                let rank = [0u32, 41, 63, 40, 1, 3][(splitmix(&mut state) % 6) as usize];
                tokens[at] = tokens[at] & !63 | rank;
            }
            1 if !tokens.is_empty() => {
                // The top bit, or an index of 2^25 exactly.
                let at = (splitmix(&mut state) % tokens.len() as u64) as usize;
                tokens[at] |= if case.is_multiple_of(2) { 1 << 31 } else { 0 };
                if case % 2 == 1 {
                    tokens[at] = (1 << 31) | (tokens[at] & 63);
                }
            }
            2 if tokens.len() > 1 => {
                // A swap or a duplicate.
                let at = (splitmix(&mut state) % (tokens.len() as u64 - 1)) as usize;
                if case.is_multiple_of(2) {
                    tokens.swap(at, at + 1);
                } else {
                    tokens[at + 1] = tokens[at];
                }
            }
            3 if !tokens.is_empty() => {
                // A token added at some index below its group's top, maybe pruned.
                let at = (splitmix(&mut state) % tokens.len() as u64) as usize;
                let t = tokens[at];
                let below = 1 + (splitmix(&mut state) % 4) as u32;
                if sparse::rank_of(t) > below {
                    tokens.insert(at, t - below);
                }
            }
            _ => {}
        }
        let reference = rules_accept(precision, &tokens);
        outcomes[usize::from(reference)] += 1;
        let body = sparse_body(precision, tokens.len() as u32, &tokens);
        let validated = Ull::validate_body(&body);
        let decoded = Ull::decode_body(&body);
        assert_eq!(
            validated.is_ok(),
            reference,
            "case {case} p={precision} tokens {tokens:x?}: {validated:?}"
        );
        assert_eq!(decoded.is_ok(), reference, "case {case}");
        if let Ok(sketch) = decoded {
            assert_eq!(body_of(&sketch), body, "case {case}");
        }
    }
    assert!(outcomes[0] > 5_000 && outcomes[1] > 5_000, "{outcomes:?}");
}

/// The count edges: 3·m/4 tokens accepted when valid, one more refused, and a count
/// larger than the bytes present refused.
#[test]
fn token_count_edges() {
    let precision = 6u8;
    let limit = sparse_limit(precision) as u32;
    let tokens: Vec<u32> = (0..limit)
        .flat_map(|i| {
            let index = i * 1000;
            [index << 6 | 5, index << 6 | 6, index << 6 | 7]
        })
        .collect();
    assert_eq!(tokens.len() as u32, 3 * limit);
    assert!(Ull::validate_body(&sparse_body(precision, 3 * limit, &tokens)).is_ok());
    let mut more = tokens.clone();
    more.push((limit * 1000) << 6 | 1);
    assert!(Ull::validate_body(&sparse_body(precision, 3 * limit + 1, &more)).is_err());
    // Count says more than present, or fewer (trailing bytes).
    assert!(Ull::validate_body(&sparse_body(precision, 3 * limit, &tokens[1..])).is_err());
    assert!(Ull::validate_body(&sparse_body(precision, 3 * limit - 1, &tokens)).is_err());
    assert!(Ull::validate_body(&sparse_body(precision, 0, &[])).is_ok());
    assert!(Ull::validate_body(&sparse_body(precision, u32::MAX, &tokens)).is_err());
}
