//! Bloom filter: the `membership` kind — was item X seen?
//!
//! **Structure.** `m` bits and `k` bit positions per item, sized from the design point the
//! user states: a capacity `n` and a target false-positive rate `p`, with
//! `m = ⌈−n·ln p / (ln 2)²⌉` rounded up to a whole 64-bit word and `k = round((m/n)·ln 2)`.
//! An item's positions are `h1 + i·h2` for `i` in `0..k` (see [`crate::hash`]).
//!
//! **Error.** One-sided: an item that was inserted is always found; an item that was not
//! is reported present with probability about `fill^k`, where `fill` is the fraction of
//! bits set. The filter measures its own fill, so it can say what false-positive rate
//! its answers carry *now* ([`Bloom::estimated_fpr`]) rather than what it was designed for,
//! and how many distinct items that fill implies ([`Bloom::estimated_items`], Swamidass
//! and Baldi 2007). Past its capacity the rate climbs quickly; a saturated filter answers
//! "maybe" to everything. [`Bloom::health`] says so plainly, and every answer of the
//! system carries it.
//!
//! **Merge.** Bitwise OR, for filters of the same size and hash count; the result is
//! exactly the filter of the union of both item sets, whatever the order or grouping.
//!
//! ```
//! use hourglass_sketch::bloom::{Bloom, Health};
//!
//! let mut monday = Bloom::new(1_000, 0.01).unwrap();
//! monday.insert(b"user42");
//! let mut tuesday = Bloom::new(1_000, 0.01).unwrap();
//! tuesday.insert(b"user7");
//!
//! monday.merge(&tuesday).unwrap();
//! assert!(monday.contains(b"user42") && monday.contains(b"user7"));
//! assert_eq!(monday.health(), Health::Healthy);
//! assert!(monday.estimated_fpr() < 1e-9);
//!
//! let bytes = monday.encode();
//! assert_eq!(Bloom::decode(&bytes).unwrap(), monday);
//! ```

use crate::error::{DecodeError, MergeError, ParameterError};
use crate::format::{BodyReader, Kind, decode_frame, encode_frame};
use crate::hash::{double_hash, item_hash, nth_position};

/// The largest filter accepted, in bits (2³¹ bits = 256 MiB), so that a filter always fits
/// one encoded frame.
pub const MAX_BITS: u64 = 1 << 31;
/// The most hash positions per item.
pub const MAX_HASHES: u32 = 32;
/// The target false-positive rate used when none is given.
pub const DEFAULT_FPR: f64 = 0.01;

/// A Bloom filter with its design point.
#[derive(Debug, Clone, PartialEq)]
pub struct Bloom {
    capacity: u64,
    target_fpr: f64,
    hashes: u32,
    words: Vec<u64>,
    /// Bits set, kept in step with `words` so that fill is O(1).
    ones: u64,
}

/// How a filter stands against its design point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Health {
    /// Within capacity: answers carry about the target false-positive rate or less.
    Healthy,
    /// More distinct items than its capacity: the false-positive rate is above target.
    PastDesignPoint {
        /// Estimated distinct items divided by capacity (> 1).
        load: f64,
    },
    /// Every bit is set: the filter answers "maybe" to every item and carries no
    /// information.
    Saturated,
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Health::Healthy => f.write_str("healthy"),
            Health::PastDesignPoint { load } => write!(
                f,
                "past its design point: about {load:.2}× its capacity, false positives above target"
            ),
            Health::Saturated => {
                f.write_str("saturated: every bit is set, every item answers \"maybe\"")
            }
        }
    }
}

/// Bits and hash count for a design point, without range checks.
fn size_for(capacity: u64, fpr: f64) -> (f64, u64, u32) {
    let ln2 = std::f64::consts::LN_2;
    let raw_bits = -(capacity as f64) * fpr.ln() / (ln2 * ln2);
    let bits = (raw_bits.ceil() as u64).div_ceil(64).max(1) * 64;
    let hashes = ((bits as f64 / capacity as f64) * ln2)
        .round()
        .clamp(1.0, MAX_HASHES as f64) as u32;
    (raw_bits, bits, hashes)
}

/// The bits and hash count of the filter [`Bloom::new`] builds for a design point, or
/// why there is none: the one place the design rule and its limits live, so that sizing
/// (crate::membership) can work out a filter's shape without allocating it.
pub(crate) fn design(capacity: u64, fpr: f64) -> Result<(u64, u32), ParameterError> {
    if capacity == 0 {
        return Err(ParameterError::new(
            "capacity",
            capacity,
            "must be at least 1",
        ));
    }
    if !(fpr > 0.0 && fpr < 1.0) {
        return Err(ParameterError::new(
            "false-positive rate",
            fpr,
            "must be strictly between 0 and 1",
        ));
    }
    let (raw_bits, bits, hashes) = size_for(capacity, fpr);
    if raw_bits > MAX_BITS as f64 {
        return Err(ParameterError::new(
            "capacity",
            capacity,
            format!(
                "at false-positive rate {fpr} needs {raw_bits:.0} bits, more than the limit of {MAX_BITS}"
            ),
        ));
    }
    Ok((bits, hashes))
}

impl Bloom {
    /// A filter for `capacity` distinct items at a target false-positive rate `fpr`.
    pub fn new(capacity: u64, fpr: f64) -> Result<Bloom, ParameterError> {
        let (bits, hashes) = design(capacity, fpr)?;
        Ok(Bloom {
            capacity,
            target_fpr: fpr,
            hashes,
            words: vec![0; (bits / 64) as usize],
            ones: 0,
        })
    }

    /// The number of distinct items the filter was sized for.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The false-positive rate the filter was sized for, at capacity.
    pub fn target_fpr(&self) -> f64 {
        self.target_fpr
    }

    /// Bits in the filter (`m`).
    pub fn bits(&self) -> u64 {
        self.words.len() as u64 * 64
    }

    /// Hash positions per item (`k`).
    pub fn hashes(&self) -> u32 {
        self.hashes
    }

    /// Adds an item.
    pub fn insert(&mut self, item: &[u8]) {
        self.insert_hash(item_hash(item));
    }

    /// Adds an item by its [`item_hash`].
    pub fn insert_hash(&mut self, hash: u64) {
        let (h1, h2) = double_hash(hash);
        let bits = self.bits();
        for i in 0..u64::from(self.hashes) {
            let bit = nth_position(h1, h2, i, bits);
            let word = &mut self.words[(bit / 64) as usize];
            let mask = 1u64 << (bit % 64);
            self.ones += u64::from(*word & mask == 0);
            *word |= mask;
        }
    }

    /// Whether the item may have been inserted: `false` is certain, `true` is wrong with
    /// probability about [`Bloom::estimated_fpr`].
    pub fn contains(&self, item: &[u8]) -> bool {
        self.contains_hash(item_hash(item))
    }

    /// [`Bloom::contains`] for an item's [`item_hash`].
    pub fn contains_hash(&self, hash: u64) -> bool {
        let (h1, h2) = double_hash(hash);
        let bits = self.bits();
        (0..u64::from(self.hashes)).all(|i| {
            let bit = nth_position(h1, h2, i, bits);
            self.words[(bit / 64) as usize] & (1u64 << (bit % 64)) != 0
        })
    }

    /// The fraction of bits set, 0 to 1.
    pub fn fill_ratio(&self) -> f64 {
        self.ones as f64 / self.bits() as f64
    }

    /// The false-positive rate the current fill implies, `fill^k`: the probability that
    /// all `k` positions of an item never inserted are set.
    pub fn estimated_fpr(&self) -> f64 {
        self.fill_ratio().powi(self.hashes as i32)
    }

    /// The number of distinct items the fill implies, `−(m/k)·ln(1 − fill)`; infinite
    /// once saturated.
    pub fn estimated_items(&self) -> f64 {
        let m = self.bits() as f64;
        -(m / f64::from(self.hashes)) * (1.0 - self.fill_ratio()).ln()
    }

    /// How the filter stands against its design point.
    pub fn health(&self) -> Health {
        if self.ones == self.bits() {
            return Health::Saturated;
        }
        let load = self.estimated_items() / self.capacity as f64;
        if load > 1.0 {
            Health::PastDesignPoint { load }
        } else {
            Health::Healthy
        }
    }

    /// The bit array, 64 bits a word (bit `b` is bit `b % 64` of word `b / 64`).
    pub(crate) fn words(&self) -> &[u64] {
        &self.words
    }

    /// Bytes of bit array held in memory.
    pub fn size_bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// ORs `other` into this filter. Both must have the same design point, so the same
    /// size and hash count.
    pub fn merge(&mut self, other: &Bloom) -> Result<(), MergeError> {
        let mismatch = |parameter, left: String, right: String| {
            Err(MergeError::ParameterMismatch {
                parameter,
                left,
                right,
            })
        };
        if self.capacity != other.capacity {
            return mismatch(
                "capacity",
                self.capacity.to_string(),
                other.capacity.to_string(),
            );
        }
        if self.target_fpr.to_bits() != other.target_fpr.to_bits() {
            return mismatch(
                "false-positive rate",
                self.target_fpr.to_string(),
                other.target_fpr.to_string(),
            );
        }
        if self.bits() != other.bits() {
            return mismatch("bits", self.bits().to_string(), other.bits().to_string());
        }
        if self.hashes != other.hashes {
            return mismatch(
                "hash count",
                self.hashes.to_string(),
                other.hashes.to_string(),
            );
        }
        let mut ones = 0;
        for (mine, theirs) in self.words.iter_mut().zip(&other.words) {
            *mine |= theirs;
            ones += u64::from(mine.count_ones());
        }
        self.ones = ones;
        Ok(())
    }

    /// The framed encoding (docs/FORMAT.md).
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(32 + self.size_bytes());
        self.encode_body(&mut body);
        encode_frame(Kind::Membership, &body)
    }

    /// Decodes a framed membership sketch.
    pub fn decode(bytes: &[u8]) -> Result<Bloom, DecodeError> {
        let (kind, body) = decode_frame(bytes)?;
        if kind != Kind::Membership {
            return Err(DecodeError::WrongKind {
                expected: Kind::Membership,
                found: kind,
            });
        }
        Bloom::decode_body(body)
    }

    /// Body: u64 capacity, f64 target rate, u64 bits, u8 hashes, u64 words.
    pub(crate) fn encode_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.capacity.to_le_bytes());
        out.extend_from_slice(&self.target_fpr.to_le_bytes());
        out.extend_from_slice(&self.bits().to_le_bytes());
        out.push(self.hashes as u8);
        for word in &self.words {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }

    pub(crate) fn decode_body(body: &[u8]) -> Result<Bloom, DecodeError> {
        let invalid = |field, reason: String| Err(DecodeError::Invalid { field, reason });
        let mut r = BodyReader::new(body);
        let capacity = r.u64("capacity")?;
        if capacity == 0 {
            return invalid("capacity", "is 0; must be at least 1".into());
        }
        let target_fpr = r.f64("false-positive rate")?;
        if !(target_fpr > 0.0 && target_fpr < 1.0) {
            return invalid(
                "false-positive rate",
                format!("{target_fpr} is not strictly between 0 and 1"),
            );
        }
        let bits = r.u64("bits")?;
        if bits == 0 || bits % 64 != 0 || bits > MAX_BITS {
            return invalid(
                "bits",
                format!("{bits} is not a positive multiple of 64 up to {MAX_BITS}"),
            );
        }
        let hashes = u32::from(r.u8("hash count")?);
        if !(1..=MAX_HASHES).contains(&hashes) {
            return invalid("hash count", format!("{hashes} is not in 1..={MAX_HASHES}"));
        }
        let words = (bits / 64) as usize;
        // Checked against the bytes present before anything is allocated.
        let raw = r.take(words * 8, "bit array")?;
        r.finish()?;
        let words: Vec<u64> = raw
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("chunks of 8")))
            .collect();
        let ones = words.iter().map(|w| u64::from(w.count_ones())).sum();
        Ok(Bloom {
            capacity,
            target_fpr,
            hashes,
            words,
            ones,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn filter_of(items: impl IntoIterator<Item = u64>) -> Bloom {
        let mut b = Bloom::new(200, 0.05).unwrap();
        for i in items {
            b.insert(&i.to_le_bytes());
        }
        b
    }

    #[test]
    fn sizes_follow_the_textbook_formulas() {
        // n = 1000, p = 0.01: m = 9585.06 → 9586 → 150 words = 9600 bits; k = round(6.65) = 7.
        let b = Bloom::new(1000, 0.01).unwrap();
        assert_eq!(b.bits(), 9600);
        assert_eq!(b.hashes(), 7);
        let b = Bloom::new(1_000_000, 0.001).unwrap();
        assert_eq!(b.bits(), 14_377_600);
        assert_eq!(b.hashes(), 10);
    }

    #[test]
    fn bad_parameters_are_named() {
        assert_eq!(Bloom::new(0, 0.01).unwrap_err().parameter, "capacity");
        assert_eq!(
            Bloom::new(10, 0.0).unwrap_err().parameter,
            "false-positive rate"
        );
        assert_eq!(
            Bloom::new(10, 1.0).unwrap_err().parameter,
            "false-positive rate"
        );
        assert_eq!(
            Bloom::new(10, f64::NAN).unwrap_err().parameter,
            "false-positive rate"
        );
        let too_big = Bloom::new(1 << 40, 0.01).unwrap_err();
        assert_eq!(too_big.parameter, "capacity");
        assert!(too_big.to_string().contains("limit"), "{too_big}");
    }

    #[test]
    fn no_false_negatives() {
        let b = filter_of(0..200);
        assert!((0..200u64).all(|i| b.contains(&i.to_le_bytes())));
    }

    #[test]
    fn an_empty_filter_contains_nothing() {
        let b = Bloom::new(100, 0.01).unwrap();
        assert!(!b.contains(b"anything"));
        assert_eq!(b.fill_ratio(), 0.0);
        assert_eq!(b.estimated_fpr(), 0.0);
        assert_eq!(b.estimated_items(), 0.0);
        assert_eq!(b.health(), Health::Healthy);
    }

    #[test]
    fn overfilling_is_never_silent() {
        let mut b = Bloom::new(100, 0.01).unwrap();
        for i in 0..300u64 {
            b.insert(&i.to_le_bytes());
        }
        match b.health() {
            Health::PastDesignPoint { load } => assert!((2.5..3.5).contains(&load), "load {load}"),
            other => panic!("expected past design point, got {other:?}"),
        }
        assert!(b.estimated_fpr() > 0.1, "fpr {}", b.estimated_fpr());
        for i in 300..100_000u64 {
            b.insert(&i.to_le_bytes());
        }
        assert_eq!(b.health(), Health::Saturated);
        assert_eq!(b.estimated_fpr(), 1.0);
        assert!(b.contains(b"never inserted"));
        assert!(b.health().to_string().contains("maybe"));
    }

    #[test]
    fn estimated_items_tracks_the_truth() {
        let b = filter_of(0..150);
        let est = b.estimated_items();
        assert!((135.0..165.0).contains(&est), "estimated {est}");
    }

    #[test]
    fn merge_refuses_other_design_points() {
        let mut a = Bloom::new(100, 0.01).unwrap();
        let err = a.merge(&Bloom::new(200, 0.01).unwrap()).unwrap_err();
        assert!(matches!(
            err,
            MergeError::ParameterMismatch {
                parameter: "capacity",
                ..
            }
        ));
        let err = a.merge(&Bloom::new(100, 0.02).unwrap()).unwrap_err();
        assert!(matches!(
            err,
            MergeError::ParameterMismatch {
                parameter: "false-positive rate",
                ..
            }
        ));
        assert!(err.to_string().contains("0.02"), "{err}");
    }

    /// Pins format version 1 of the membership kind, byte for byte.
    #[test]
    fn golden_bytes() {
        let mut b = Bloom::new(10, 0.1).unwrap();
        for item in ["a", "b", "c"] {
            b.insert(item.as_bytes());
        }
        let hex: String = b.encode().iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(hex, GOLDEN_BLOOM);
    }

    const GOLDEN_BLOOM: &str = "4847534b01030000210000000a000000000000009a9999999999b93f400000000000000004c480040311080022bd7e2d9c99f8f996";

    fn decode_err(body: &[u8]) -> DecodeError {
        Bloom::decode(&encode_frame(Kind::Membership, body)).unwrap_err()
    }

    #[test]
    fn decoder_names_each_invalid_field() {
        let good = Bloom::new(10, 0.1).unwrap();
        let mut body = Vec::new();
        good.encode_body(&mut body);
        let field_of = |e: DecodeError| match e {
            DecodeError::Invalid { field, .. } => field,
            other => panic!("expected Invalid, got {other:?}"),
        };
        let mut bad = body.clone();
        bad[0..8].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(field_of(decode_err(&bad)), "capacity");
        let mut bad = body.clone();
        bad[8..16].copy_from_slice(&1.5f64.to_le_bytes());
        assert_eq!(field_of(decode_err(&bad)), "false-positive rate");
        let mut bad = body.clone();
        bad[16..24].copy_from_slice(&65u64.to_le_bytes());
        assert_eq!(field_of(decode_err(&bad)), "bits");
        let mut bad = body.clone();
        bad[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert_eq!(field_of(decode_err(&bad)), "bits");
        let mut bad = body.clone();
        bad[24] = 0;
        assert_eq!(field_of(decode_err(&bad)), "hash count");
        assert!(matches!(
            decode_err(&body[..body.len() - 1]),
            DecodeError::Truncated { .. }
        ));
        let mut long = body.clone();
        long.push(0);
        assert!(matches!(
            decode_err(&long),
            DecodeError::TrailingBytes { extra: 1 }
        ));
        let other_kind = encode_frame(Kind::Distinct, &body);
        assert!(matches!(
            Bloom::decode(&other_kind),
            Err(DecodeError::WrongKind { .. })
        ));
    }

    fn small_sets() -> impl Strategy<Value = Vec<u64>> {
        prop::collection::vec(0u64..1000, 0..300)
    }

    proptest! {
        #[test]
        fn merge_is_commutative_and_associative(a in small_sets(), b in small_sets(), c in small_sets()) {
            let (fa, fb, fc) = (filter_of(a), filter_of(b), filter_of(c));
            let mut ab = fa.clone();
            ab.merge(&fb).unwrap();
            let mut ba = fb.clone();
            ba.merge(&fa).unwrap();
            prop_assert_eq!(ab.encode(), ba.encode());
            let mut ab_c = ab.clone();
            ab_c.merge(&fc).unwrap();
            let mut bc = fb.clone();
            bc.merge(&fc).unwrap();
            let mut a_bc = fa.clone();
            a_bc.merge(&bc).unwrap();
            prop_assert_eq!(ab_c.encode(), a_bc.encode());
        }

        #[test]
        fn merge_equals_the_filter_of_the_union(a in small_sets(), b in small_sets()) {
            let mut merged = filter_of(a.clone());
            merged.merge(&filter_of(b.clone())).unwrap();
            let union = filter_of(a.into_iter().chain(b));
            prop_assert_eq!(merged.encode(), union.encode());
            prop_assert_eq!(merged.ones, union.ones);
        }

        #[test]
        fn decode_inverts_encode(a in small_sets()) {
            let f = filter_of(a);
            prop_assert_eq!(Bloom::decode(&f.encode()).unwrap(), f);
        }

        #[test]
        fn decoding_random_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = Bloom::decode(&bytes);
            let _ = Bloom::decode_body(&bytes);
        }

        #[test]
        fn decoding_mutated_bodies_never_panics(
            a in small_sets(),
            edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            cut in any::<usize>(),
        ) {
            let mut body = Vec::new();
            filter_of(a).encode_body(&mut body);
            for (at, byte) in edits {
                let at = at % body.len();
                body[at] = byte;
            }
            body.truncate(cut % (body.len() + 1));
            // Framed afresh, so the checksum passes and the body validation is what runs.
            let _ = Bloom::decode(&encode_frame(Kind::Membership, &body));
        }
    }
}
