//! The `frequency` sketch kind: how often did item X occur, and what are the top K?
//!
//! A [`Frequency`] sketch is a [`CountMin`] sketch and a [`FrequentItems`] summary fed
//! the same stream. Both give upper bounds on an item's frequency `f`:
//!
//! - the Count-Min estimate, above `f` by more than `ε·N` with probability at most `δ`
//!   (`N` = total weight, `ε = e/width`, `δ = e^(−depth)`);
//! - the frequent-items upper bound, above `f` by at most the summary's error, which never
//!   exceeds `N/(k + 1)` for capacity `k`.
//!
//! [`Frequency::estimate`] answers with the smaller of the two, so it is never below the
//! truth. [`Frequency::top_k`] lists the tracked items with a lower bound (the
//! frequent-items counter) and an upper bound (the smaller upper bound). With
//! [`FrequencyParams::from_error`], `k = ⌈1/ε⌉`, so every item with `f > ε·N` is tracked:
//! its counter is at least `f − error > ε·N − N/(k + 1) ≥ 0`.
//!
//! **Merge** merges both parts (cell-wise sum; the Agarwal et al. merge rule) and needs
//! equal `width`, `depth`, `conservative update` and `capacity`; a mismatch is an error
//! naming the parameter and leaves the sketch unchanged. The Count-Min part of a merge is
//! bit for bit the sketch of the union of the streams (without conservative update); the
//! frequent-items part is commutative but depends on the grouping of merges, with the
//! same guarantee under any grouping (see [`crate::frequent`]).
//!
//! **Encoding** is the frame of [`crate::format`] with kind `frequency` around the
//! Count-Min part and then the frequent-items part, specified byte by byte in
//! docs/FORMAT.md. The frequent-items part holds at most `k` entries sorted by item bytes,
//! so merges in either order encode alike.
//!
//! ```
//! use hourglass_sketch::frequency::{Frequency, FrequencyParams};
//!
//! let params = FrequencyParams::from_error(0.01, 0.01).unwrap();
//! assert_eq!((params.width, params.depth, params.capacity), (272, 5, 100));
//!
//! let mut eu = Frequency::new(params).unwrap();
//! let mut us = Frequency::new(params).unwrap();
//! for _ in 0..50 {
//!     eu.insert(b"/cart").unwrap();
//! }
//! us.insert_weighted(b"/cart", 20).unwrap();
//! us.insert_weighted(b"/home", 30).unwrap();
//! eu.merge(&us).unwrap();
//!
//! let cart = eu.estimate(b"/cart");
//! assert!(cart.estimate >= 70 && cart.estimate <= 70 + cart.max_overcount);
//! assert_eq!(cart.total, 100);
//!
//! let top = eu.top_k(2);
//! assert_eq!(top[0].item, b"/cart");
//! assert_eq!(top[1].item, b"/home");
//!
//! let decoded = Frequency::decode(&eu.encode()).unwrap();
//! assert_eq!(decoded.estimate(b"/home"), eu.estimate(b"/home"));
//! ```

use crate::countmin::{self, CountMin};
use crate::error::{DecodeError, MergeError, ParameterError};
use crate::format::{BodyReader, Kind, decode_frame, encode_frame};
use crate::frequent::{self, FrequentItems};
use crate::hash::item_hash;

/// The parameters of a [`Frequency`] sketch; sketches merge only if all four are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrequencyParams {
    /// Count-Min counters per row, `1..=2^24`.
    pub width: u32,
    /// Count-Min rows, `1..=32` (at most 2^24 counters in all).
    pub depth: u32,
    /// Whether the Count-Min part uses conservative update.
    pub conservative: bool,
    /// Counters of the frequent-items part, `1..=65536`.
    pub capacity: u32,
}

impl FrequencyParams {
    /// Parameters for relative error `epsilon` and failure probability `delta`:
    /// `width = ⌈e/ε⌉`, `depth = ⌈ln(1/δ)⌉`, `capacity = ⌈1/ε⌉`, standard update.
    ///
    /// Both must lie strictly between 0 and 1, and `ε ≥ 1/65536` so that the capacity
    /// stays within its limit; the error names the parameter.
    pub fn from_error(epsilon: f64, delta: f64) -> Result<FrequencyParams, ParameterError> {
        let (width, depth) = countmin::dimensions_for(epsilon, delta)?;
        let capacity = (1.0 / epsilon).ceil();
        if capacity > f64::from(frequent::MAX_CAPACITY) {
            return Err(ParameterError::new(
                "epsilon",
                epsilon,
                format!(
                    "needs capacity ⌈1/ε⌉ = {capacity}, above the limit of {}",
                    frequent::MAX_CAPACITY
                ),
            ));
        }
        Ok(FrequencyParams {
            width,
            depth,
            conservative: false,
            // In 1..=65536 after the checks above.
            capacity: capacity as u32,
        })
    }
}

/// The error bound ε used when none is given.
pub const DEFAULT_EPSILON: f64 = 0.001;
/// The failure probability δ used when none is given.
pub const DEFAULT_DELTA: f64 = 0.01;

impl Default for FrequencyParams {
    /// `ε = 0.001`, `δ = 0.01`: width 2719, depth 5, capacity 1000, standard update.
    fn default() -> Self {
        FrequencyParams::from_error(DEFAULT_EPSILON, DEFAULT_DELTA)
            .expect("the default ε and δ are valid")
    }
}

/// The answer to "how often did X occur?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrequencyEstimate {
    /// An upper bound on the item's frequency: never below the truth.
    pub estimate: u64,
    /// `⌈ε·N⌉`: the estimate exceeds the truth by more than this with probability at
    /// most `δ`.
    pub max_overcount: u64,
    /// `N`, the total weight of the stream.
    pub total: u64,
}

/// One of the heaviest items, as reported by [`Frequency::top_k`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopItem {
    /// The item's bytes.
    pub item: Vec<u8>,
    /// The point estimate, equal to `upper`.
    pub estimate: u64,
    /// A lower bound on the frequency (the frequent-items counter).
    pub lower: u64,
    /// An upper bound on the frequency: the smaller of the frequent-items upper bound
    /// and the Count-Min estimate.
    pub upper: u64,
}

/// A Count-Min sketch and a frequent-items summary of the same stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frequency {
    count_min: CountMin,
    frequent: FrequentItems,
}

impl Frequency {
    /// An empty sketch; the error names the parameter out of range.
    pub fn new(params: FrequencyParams) -> Result<Frequency, ParameterError> {
        Ok(Frequency {
            count_min: CountMin::new(params.width, params.depth, params.conservative)?,
            frequent: FrequentItems::new(params.capacity)?,
        })
    }

    /// Counts one occurrence of `item`. Items longer than
    /// [`MAX_ITEM_LEN`](frequent::MAX_ITEM_LEN) bytes are refused and change nothing.
    pub fn insert(&mut self, item: &[u8]) -> Result<(), ParameterError> {
        self.insert_weighted(item, 1)
    }

    /// Counts `weight` occurrences of `item`. Items longer than
    /// [`MAX_ITEM_LEN`](frequent::MAX_ITEM_LEN) bytes are refused and change nothing.
    pub fn insert_weighted(&mut self, item: &[u8], weight: u64) -> Result<(), ParameterError> {
        frequent::check_item_len(item)?;
        self.frequent.try_insert_weighted(item, weight)?;
        self.count_min.insert_hash_weighted(item_hash(item), weight);
        Ok(())
    }

    /// How often `item` occurred: the smaller of the two upper bounds, never below the
    /// truth.
    pub fn estimate(&self, item: &[u8]) -> FrequencyEstimate {
        FrequencyEstimate {
            estimate: self.count_min.estimate(item).min(self.frequent.upper(item)),
            max_overcount: self.count_min.max_overcount(),
            total: self.count_min.total(),
        }
    }

    /// Up to `k` tracked items, heaviest first: by estimate descending, then lower bound
    /// descending, then item bytes ascending.
    ///
    /// With parameters from [`FrequencyParams::from_error`] every item with frequency
    /// above `ε·N` is tracked; there are at most `⌈1/ε⌉` of them.
    pub fn top_k(&self, k: usize) -> Vec<TopItem> {
        let mut items: Vec<TopItem> = self
            .frequent
            .top(usize::MAX)
            .into_iter()
            .map(|entry| {
                let upper = entry.upper.min(self.count_min.estimate(&entry.item));
                TopItem {
                    item: entry.item,
                    estimate: upper,
                    lower: entry.lower,
                    upper,
                }
            })
            .collect();
        items.sort_unstable_by(|a, b| {
            b.estimate
                .cmp(&a.estimate)
                .then(b.lower.cmp(&a.lower))
                .then_with(|| a.item.cmp(&b.item))
        });
        items.truncate(k);
        items
    }

    /// Merges `other` into `self`. Fails, leaving `self` unchanged, if `width`, `depth`,
    /// `conservative update` or `capacity` differ; the error names the parameter.
    pub fn merge(&mut self, other: &Frequency) -> Result<(), MergeError> {
        self.count_min.check_mergeable(&other.count_min)?;
        self.frequent.check_mergeable(&other.frequent)?;
        self.count_min.merge(&other.count_min)?;
        self.frequent.merge(&other.frequent)?;
        Ok(())
    }

    /// The framed encoding (docs/FORMAT.md).
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        self.encode_body(&mut body);
        encode_frame(Kind::Frequency, &body)
    }

    /// Decodes a framed `frequency` sketch, validating every field;
    /// [`DecodeError::WrongKind`] if the frame holds another kind.
    pub fn decode(bytes: &[u8]) -> Result<Frequency, DecodeError> {
        let (kind, body) = decode_frame(bytes)?;
        if kind != Kind::Frequency {
            return Err(DecodeError::WrongKind {
                expected: Kind::Frequency,
                found: kind,
            });
        }
        Frequency::decode_body(body)
    }

    /// Appends the body of the encoding: the Count-Min part, then the frequent-items part.
    pub(crate) fn encode_body(&self, out: &mut Vec<u8>) {
        self.count_min.encode_body(out);
        self.frequent.encode_body(out);
    }

    /// Decodes a body written by [`Frequency::encode_body`], validating every field and
    /// that both parts count the same total.
    pub(crate) fn decode_body(body: &[u8]) -> Result<Frequency, DecodeError> {
        let mut reader = BodyReader::new(body);
        let count_min = CountMin::decode_from(&mut reader)?;
        let frequent = FrequentItems::decode_from(&mut reader)?;
        reader.finish()?;
        if frequent.total() != count_min.total() {
            return Err(DecodeError::Invalid {
                field: "frequent-items total",
                reason: format!(
                    "{} differs from the count-min total {}; both parts count the same stream",
                    frequent.total(),
                    count_min.total()
                ),
            });
        }
        Ok(Frequency {
            count_min,
            frequent,
        })
    }

    /// Approximate bytes the sketch occupies in memory.
    pub fn size_bytes(&self) -> usize {
        self.count_min.size_bytes() + self.frequent.size_bytes()
    }

    /// The Count-Min part.
    pub fn count_min(&self) -> &CountMin {
        &self.count_min
    }

    /// The frequent-items part.
    pub fn frequent_items(&self) -> &FrequentItems {
        &self.frequent
    }

    /// The sketch's parameters.
    pub fn params(&self) -> FrequencyParams {
        FrequencyParams {
            width: self.count_min.width(),
            depth: self.count_min.depth(),
            conservative: self.count_min.is_conservative(),
            capacity: self.frequent.capacity(),
        }
    }

    /// `N`, the total weight inserted.
    pub fn total(&self) -> u64 {
        self.count_min.total()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{CHECKSUM_LEN, HEADER_LEN};
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use xxhash_rust::xxh3::xxh3_64;

    fn small() -> Frequency {
        let mut s = Frequency::new(FrequencyParams {
            width: 4,
            depth: 2,
            conservative: false,
            capacity: 3,
        })
        .unwrap();
        for item in ["a", "a", "a", "b", "b", "c", "d"] {
            s.insert(item.as_bytes()).unwrap();
        }
        s
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Recomputes the frame checksum so that a mutated body reaches body validation.
    fn reseal(bytes: &mut [u8]) {
        let n = bytes.len();
        if n >= HEADER_LEN + CHECKSUM_LEN {
            let sum = xxh3_64(&bytes[..n - CHECKSUM_LEN]);
            bytes[n - CHECKSUM_LEN..].copy_from_slice(&sum.to_le_bytes());
        }
    }

    #[test]
    fn params_follow_epsilon_and_delta() {
        let p = FrequencyParams::from_error(0.001, 0.01).unwrap();
        assert_eq!(p, FrequencyParams::default());
        assert_eq!(
            FrequencyParams::from_error(0.01, 0.05).unwrap(),
            FrequencyParams {
                width: 272,
                depth: 3,
                conservative: false,
                capacity: 100
            }
        );
        assert_eq!(
            FrequencyParams::from_error(1e-5, 0.5)
                .unwrap_err()
                .parameter,
            "epsilon"
        );
        assert_eq!(
            FrequencyParams::from_error(0.1, 2.0).unwrap_err().parameter,
            "delta"
        );
        for (params, name) in [
            (
                FrequencyParams {
                    width: 0,
                    ..FrequencyParams::default()
                },
                "width",
            ),
            (
                FrequencyParams {
                    depth: 33,
                    ..FrequencyParams::default()
                },
                "depth",
            ),
            (
                FrequencyParams {
                    capacity: 0,
                    ..FrequencyParams::default()
                },
                "capacity",
            ),
        ] {
            assert_eq!(Frequency::new(params).unwrap_err().parameter, name);
        }
    }

    #[test]
    fn long_items_change_nothing() {
        let mut s = small();
        let before = s.clone();
        let long = vec![0u8; frequent::MAX_ITEM_LEN + 1];
        assert_eq!(s.insert(&long).unwrap_err().parameter, "item length");
        assert_eq!(s, before);
    }

    #[test]
    fn estimates_and_top_k() {
        let s = small();
        let a = s.estimate(b"a");
        assert_eq!(a.total, 7);
        assert!(a.estimate >= 3);
        assert_eq!(
            a.max_overcount,
            (std::f64::consts::E / 4.0 * 7.0).ceil() as u64
        );
        for (item, f) in [("a", 3), ("b", 2), ("c", 1), ("d", 1), ("e", 0)] {
            let e = s.estimate(item.as_bytes()).estimate;
            assert!(e >= f, "{item}: {e} < {f}");
            assert!(e <= s.count_min().estimate(item.as_bytes()));
            assert!(e <= s.frequent_items().upper(item.as_bytes()));
        }
        let top = s.top_k(2);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].item, b"a");
        for t in &top {
            assert_eq!(t.estimate, t.upper);
            assert!(t.lower <= t.upper);
        }
        assert!(s.size_bytes() >= 8 * 8);
    }

    #[test]
    fn merge_mismatch_names_the_parameter() {
        let base = FrequencyParams::default();
        for (other, name) in [
            (FrequencyParams { width: 100, ..base }, "width"),
            (FrequencyParams { depth: 2, ..base }, "depth"),
            (
                FrequencyParams {
                    conservative: true,
                    ..base
                },
                "conservative update",
            ),
            (
                FrequencyParams {
                    capacity: 10,
                    ..base
                },
                "capacity",
            ),
        ] {
            let mut s = Frequency::new(base).unwrap();
            s.insert(b"x").unwrap();
            let before = s.clone();
            let mut o = Frequency::new(other).unwrap();
            o.insert(b"y").unwrap();
            match s.merge(&o) {
                Err(MergeError::ParameterMismatch { parameter, .. }) => {
                    assert_eq!(parameter, name)
                }
                other => panic!("expected a mismatch on {name}, got {other:?}"),
            }
            assert_eq!(s, before);
        }
    }

    #[test]
    fn encoding_is_pinned() {
        let s = small();
        let bytes = s.encode();
        let expected = concat!(
            // Frame: magic, version 1, kind 2 (frequency), flags 0, body length 131.
            "4847534b",
            "01",
            "02",
            "0000",
            "83000000",
            // Count-Min: width 4, depth 2, flags 0, total 7.
            "04000000",
            "02000000",
            "00",
            "0700000000000000",
            // Row 0: 1 3 0 3.
            "0100000000000000",
            "0300000000000000",
            "0000000000000000",
            "0300000000000000",
            // Row 1: 2 1 3 1.
            "0200000000000000",
            "0100000000000000",
            "0300000000000000",
            "0100000000000000",
            // Frequent items: capacity 3, error 1, total 7, 2 entries. The tracked
            // a3 b2 c1 d1 are encoded purged by the 4th largest count, 1.
            "03000000",
            "0100000000000000",
            "0700000000000000",
            "02000000",
            // "a": 2, "b": 1.
            "01000000",
            "61",
            "0200000000000000",
            "01000000",
            "62",
            "0100000000000000",
            // Checksum.
            "c8c72709a5396d4d",
        );
        assert_eq!(hex(&bytes), expected);
        let decoded = Frequency::decode(&bytes).unwrap();
        let mut compacted = s.clone();
        compacted.frequent.compact();
        assert_eq!(decoded, compacted);
        assert_eq!(decoded.encode(), bytes);
    }

    #[test]
    fn decode_rejects_invalid_bodies() {
        let good = small().encode();
        let field_of = |patch: &dyn Fn(&mut Vec<u8>)| {
            let mut bad = good.clone();
            patch(&mut bad);
            reseal(&mut bad);
            Frequency::decode(&bad).unwrap_err()
        };
        let body = HEADER_LEN;
        let invalid = |e: DecodeError| match e {
            DecodeError::Invalid { field, .. } => field,
            other => panic!("expected Invalid, got {other:?}"),
        };
        assert_eq!(invalid(field_of(&|b| b[body] = 0)), "count-min width");
        assert_eq!(invalid(field_of(&|b| b[body + 4] = 0)), "count-min depth");
        assert_eq!(
            invalid(field_of(&|b| b[body + 8] = 0x80)),
            "count-min flags"
        );
        assert_eq!(
            invalid(field_of(&|b| b[body + 9] = 8)),
            "count-min counters"
        );
        let fi = body + 17 + 64;
        assert_eq!(invalid(field_of(&|b| b[fi] = 0)), "frequent-items capacity");
        // Both totals raised by the same amount: each part is valid, they disagree.
        assert_eq!(
            invalid(field_of(&|b| b[fi + 12] = 9)),
            "frequent-items total"
        );
        assert!(matches!(
            field_of(&|b| b.truncate(b.len() - 9)),
            DecodeError::LengthMismatch { .. }
        ));
        let mut other_kind = good.clone();
        other_kind[5] = Kind::Membership.code();
        reseal(&mut other_kind);
        assert_eq!(
            Frequency::decode(&other_kind).unwrap_err(),
            DecodeError::WrongKind {
                expected: Kind::Frequency,
                found: Kind::Membership
            }
        );
    }

    fn params() -> impl Strategy<Value = FrequencyParams> {
        (1u32..9, 1u32..4, any::<bool>(), 1u32..5).prop_map(
            |(width, depth, conservative, capacity)| FrequencyParams {
                width,
                depth,
                conservative,
                capacity,
            },
        )
    }

    fn stream() -> impl Strategy<Value = Vec<(u8, u64)>> {
        prop::collection::vec((0u8..30, 1u64..50), 0..60).prop_map(|v| {
            v.into_iter()
                .map(|(item, weight)| (item % (item / 6 + 1), weight))
                .collect()
        })
    }

    fn sketch_of(params: FrequencyParams, items: &[(u8, u64)]) -> Frequency {
        let mut s = Frequency::new(params).unwrap();
        for &(item, weight) in items {
            s.insert_weighted(&[item], weight).unwrap();
        }
        s
    }

    proptest! {
        #[test]
        fn merge_is_commutative(p in params(), a in stream(), b in stream()) {
            let (a, b) = (sketch_of(p, &a), sketch_of(p, &b));
            let mut ab = a.clone();
            ab.merge(&b).unwrap();
            let mut ba = b.clone();
            ba.merge(&a).unwrap();
            prop_assert_eq!(ab.encode(), ba.encode());
        }

        #[test]
        fn estimates_bound_the_truth_after_merges(
            p in params(), streams in prop::collection::vec(stream(), 1..6)
        ) {
            let mut truth: BTreeMap<u8, u64> = BTreeMap::new();
            for &(item, weight) in streams.iter().flatten() {
                *truth.entry(item).or_default() += weight;
            }
            let mut merged = Frequency::new(p).unwrap();
            for s in &streams {
                let part = Frequency::decode(&sketch_of(p, s).encode()).unwrap();
                merged.merge(&part).unwrap();
            }
            let n: u64 = truth.values().sum();
            prop_assert_eq!(merged.total(), n);
            let top = merged.top_k(usize::MAX);
            for item in 0..=u8::MAX {
                let f = truth.get(&item).copied().unwrap_or(0);
                prop_assert!(merged.estimate(&[item]).estimate >= f);
                if f * (u64::from(p.capacity) + 1) > n {
                    prop_assert!(top.iter().any(|t| t.item == [item] && t.lower <= f && f <= t.upper));
                }
            }
        }

        #[test]
        fn encoding_round_trips(p in params(), a in stream()) {
            let mut s = sketch_of(p, &a);
            let bytes = s.encode();
            s.frequent.compact();
            prop_assert_eq!(Frequency::decode(&bytes).unwrap(), s);
        }

        #[test]
        fn decoding_random_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = Frequency::decode(&bytes);
            let mut framed = bytes.clone();
            framed.splice(0..0, encode_frame(Kind::Frequency, &[])[..HEADER_LEN].iter().copied());
            let body_len = (framed.len() - HEADER_LEN) as u32;
            framed[8..12].copy_from_slice(&body_len.to_le_bytes());
            framed.extend_from_slice(&[0; CHECKSUM_LEN]);
            reseal(&mut framed);
            let _ = Frequency::decode(&framed);
        }

        #[test]
        fn decoding_mutated_encodings_never_panics(
            p in params(),
            a in stream(),
            mutations in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = sketch_of(p, &a).encode();
            let body_len = bytes.len() - HEADER_LEN - CHECKSUM_LEN;
            for (at, value) in mutations {
                bytes[HEADER_LEN + at.index(body_len)] = value;
            }
            reseal(&mut bytes);
            if let Ok(s) = Frequency::decode(&bytes) {
                // Whatever decodes must re-encode to the same bytes.
                prop_assert_eq!(s.encode(), bytes);
            }
        }
    }
}
