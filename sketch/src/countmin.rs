//! Count-Min sketch: how often did item X occur, never answered too low.
//!
//! A Count-Min sketch (Cormode and Muthukrishnan, "An improved data stream summary: the
//! count-min sketch and its applications", 2005) is `depth` rows of `width` counters.
//! Inserting an item with weight `c` adds `c` to one counter per row, chosen by double
//! hashing the item (`h1 + i·h2`, see [`crate::hash`]); the estimate of an item is the
//! smallest of its `depth` counters.
//!
//! **Error.** Every counter of an item holds at least the item's true frequency `f`, so
//! the estimate never under-counts. With `w = ⌈e/ε⌉` and `d = ⌈ln(1/δ)⌉`, the estimate
//! exceeds `f` by more than `ε·N` (`N` = total weight inserted) with probability at most
//! `δ`, for each item queried. [`CountMin::with_error`] sizes a sketch from `ε` and `δ`;
//! [`CountMin::epsilon`], [`CountMin::delta`] and [`CountMin::max_overcount`] report the
//! guarantee of any sketch.
//!
//! **Conservative update** (Estan and Varghese, 2002) raises only the counters that fall
//! below `min + c`, and only up to `min + c`. Estimates are still upper bounds and never
//! above those of the standard update, but the result depends on the order of the
//! inserts and merges.
//!
//! **Merge** is the cell-wise sum of the counters and the sum of the totals, and needs
//! equal `width`, `depth` and update rule (an error naming the parameter otherwise).
//! Without conservative update merging is commutative and associative, and the merge of
//! the sketches of two streams is bit for bit the sketch of their union. Merged
//! conservative sketches stay upper bounds, but that last law does not hold for them: a
//! sum of conservative sketches is generally larger than the conservative sketch of the
//! union.
//!
//! **Saturation.** Counters and the total are `u64` and saturate instead of wrapping. A
//! saturated counter is stuck at `u64::MAX`, which is still at least the true frequency,
//! so estimates never under-count even then.
//!
//! ```
//! use hourglass_sketch::countmin::CountMin;
//!
//! let mut a = CountMin::with_error(0.01, 0.01).unwrap();
//! assert_eq!((a.width(), a.depth()), (272, 5));
//! a.insert(b"GET /cart");
//! a.insert_weighted(b"GET /", 3);
//!
//! let mut b = CountMin::with_error(0.01, 0.01).unwrap();
//! b.insert(b"GET /cart");
//! a.merge(&b).unwrap();
//!
//! assert!(a.estimate(b"GET /cart") >= 2);
//! assert!(a.estimate(b"GET /cart") <= 2 + a.max_overcount()); // with probability 1 − δ
//! assert_eq!(a.total(), 5);
//! ```

use crate::error::{DecodeError, MergeError, ParameterError};
use crate::format::BodyReader;
use crate::hash::{double_hash, item_hash, nth_position};
use std::f64::consts::E;

/// The widest row accepted: 2^24 counters.
pub const MAX_WIDTH: u32 = 1 << 24;
/// The most rows accepted.
pub const MAX_DEPTH: u32 = 32;
/// The most counters (`width × depth`) accepted: 2^24, 128 MiB of counters, so that an
/// encoded sketch always fits the frame's body limit with room for its frequent items.
pub const MAX_CELLS: u64 = 1 << 24;

/// Flag bit in the encoding: the sketch uses conservative update.
const FLAG_CONSERVATIVE: u8 = 1;

/// A Count-Min sketch of `depth` rows × `width` saturating `u64` counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountMin {
    width: u32,
    depth: u32,
    conservative: bool,
    /// Sum of all weights inserted (saturating).
    total: u64,
    /// Row-major: row `i` is `counters[i·width .. (i+1)·width]`.
    counters: Vec<u64>,
}

impl CountMin {
    /// A sketch whose estimates exceed the truth by more than `epsilon·N` with probability
    /// at most `delta`: `width = ⌈e/ε⌉`, `depth = ⌈ln(1/δ)⌉`, standard update.
    ///
    /// Both must lie strictly between 0 and 1, and the resulting width and depth within
    /// the limits of [`CountMin::new`]; the error names the parameter.
    pub fn with_error(epsilon: f64, delta: f64) -> Result<CountMin, ParameterError> {
        let (width, depth) = dimensions_for(epsilon, delta)?;
        CountMin::new(width, depth, false)
    }

    /// A sketch of `depth` rows of `width` counters: `width` in `1..=2^24`, `depth` in
    /// `1..=32`, at most 2^24 counters in all. `conservative` selects conservative update.
    pub fn new(width: u32, depth: u32, conservative: bool) -> Result<CountMin, ParameterError> {
        validate_dimensions(width, depth)?;
        Ok(CountMin {
            width,
            depth,
            conservative,
            total: 0,
            counters: vec![0; width as usize * depth as usize],
        })
    }

    /// Counts one occurrence of `item`.
    pub fn insert(&mut self, item: &[u8]) {
        self.insert_hash_weighted(item_hash(item), 1);
    }

    /// Counts `weight` occurrences of `item`.
    pub fn insert_weighted(&mut self, item: &[u8], weight: u64) {
        self.insert_hash_weighted(item_hash(item), weight);
    }

    /// Counts `weight` occurrences of the item whose [`item_hash`] is `hash`, for callers
    /// that hash once for several sketches.
    pub fn insert_hash_weighted(&mut self, hash: u64, weight: u64) {
        if weight == 0 {
            return;
        }
        self.total = self.total.saturating_add(weight);
        let (h1, h2) = double_hash(hash);
        if self.conservative {
            let target = self.min_cell(h1, h2).saturating_add(weight);
            for row in 0..self.depth {
                let index = self.cell_index(h1, h2, row);
                let cell = &mut self.counters[index];
                if *cell < target {
                    *cell = target;
                }
            }
        } else {
            for row in 0..self.depth {
                let index = self.cell_index(h1, h2, row);
                let cell = &mut self.counters[index];
                *cell = cell.saturating_add(weight);
            }
        }
    }

    /// An upper bound on how often `item` occurred: never below the truth, above it by
    /// more than [`CountMin::max_overcount`] with probability at most [`CountMin::delta`].
    pub fn estimate(&self, item: &[u8]) -> u64 {
        self.estimate_hash(item_hash(item))
    }

    /// [`CountMin::estimate`] for the item whose [`item_hash`] is `hash`.
    pub fn estimate_hash(&self, hash: u64) -> u64 {
        let (h1, h2) = double_hash(hash);
        self.min_cell(h1, h2)
    }

    /// Adds `other` into `self`: cell-wise sum of the counters, sum of the totals.
    ///
    /// Fails, leaving `self` unchanged, if `width`, `depth` or `conservative update`
    /// differ.
    pub fn merge(&mut self, other: &CountMin) -> Result<(), MergeError> {
        self.check_mergeable(other)?;
        for (mine, theirs) in self.counters.iter_mut().zip(&other.counters) {
            *mine = mine.saturating_add(*theirs);
        }
        self.total = self.total.saturating_add(other.total);
        Ok(())
    }

    /// Succeeds if `other` can merge into `self`; the error names the first parameter
    /// that differs.
    pub fn check_mergeable(&self, other: &CountMin) -> Result<(), MergeError> {
        let mismatch = |parameter, left: &dyn ToString, right: &dyn ToString| {
            Err(MergeError::ParameterMismatch {
                parameter,
                left: left.to_string(),
                right: right.to_string(),
            })
        };
        if self.width != other.width {
            return mismatch("width", &self.width, &other.width);
        }
        if self.depth != other.depth {
            return mismatch("depth", &self.depth, &other.depth);
        }
        if self.conservative != other.conservative {
            return mismatch(
                "conservative update",
                &self.conservative,
                &other.conservative,
            );
        }
        Ok(())
    }

    /// Counters per row.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Number of rows.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Whether the sketch uses conservative update.
    pub fn is_conservative(&self) -> bool {
        self.conservative
    }

    /// Sum of all weights inserted, `N` (saturating).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The relative error `ε = e/width` of the sketch's guarantee.
    pub fn epsilon(&self) -> f64 {
        E / f64::from(self.width)
    }

    /// The failure probability `δ = e^(−depth)` of the sketch's guarantee.
    pub fn delta(&self) -> f64 {
        (-f64::from(self.depth)).exp()
    }

    /// `⌈ε·N⌉`: an estimate exceeds the truth by more than this with probability at most
    /// [`CountMin::delta`].
    pub fn max_overcount(&self) -> u64 {
        // `as` saturates; ε·N is irrational for N > 0, so the ceiling is never off by one
        // through an exact-integer product.
        (self.epsilon() * self.total as f64).ceil() as u64
    }

    /// The counters, row-major: row `i` is `[i·width, (i+1)·width)`.
    pub fn counters(&self) -> &[u64] {
        &self.counters
    }

    /// Approximate heap and inline bytes the sketch occupies.
    pub fn size_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.counters.len() * std::mem::size_of::<u64>()
    }

    /// Appends the Count-Min part of the encoding (docs/FORMAT.md): width, depth, flags,
    /// total, counters.
    pub(crate) fn encode_body(&self, out: &mut Vec<u8>) {
        out.reserve(17 + self.counters.len() * 8);
        out.extend_from_slice(&self.width.to_le_bytes());
        out.extend_from_slice(&self.depth.to_le_bytes());
        out.push(if self.conservative {
            FLAG_CONSERVATIVE
        } else {
            0
        });
        out.extend_from_slice(&self.total.to_le_bytes());
        for counter in &self.counters {
            out.extend_from_slice(&counter.to_le_bytes());
        }
    }

    /// Reads the Count-Min part of the encoding, validating every field.
    pub(crate) fn decode_from(reader: &mut BodyReader<'_>) -> Result<CountMin, DecodeError> {
        let width = reader.u32("count-min width")?;
        let depth = reader.u32("count-min depth")?;
        if let Err(e) = validate_dimensions(width, depth) {
            return Err(DecodeError::Invalid {
                field: match e.parameter {
                    "width" => "count-min width",
                    "depth" => "count-min depth",
                    _ => "count-min width × depth",
                },
                reason: format!("{} {}", e.value, e.reason),
            });
        }
        let flags = reader.u8("count-min flags")?;
        if flags & !FLAG_CONSERVATIVE != 0 {
            return Err(DecodeError::Invalid {
                field: "count-min flags",
                reason: format!("{flags:#04x} sets undefined bits (only bit 0 is defined)"),
            });
        }
        let conservative = flags & FLAG_CONSERVATIVE != 0;
        let total = reader.u64("count-min total")?;
        let cells = width as usize * depth as usize;
        // Check the length before allocating: `cells` comes from untrusted bytes.
        if reader.remaining() / 8 < cells {
            return Err(DecodeError::Truncated {
                what: "count-min counters",
                needed: cells * 8,
                available: reader.remaining(),
            });
        }
        let raw = reader.take(cells * 8, "count-min counters")?;
        let counters: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        validate_rows(&counters, width as usize, total, conservative)?;
        Ok(CountMin {
            width,
            depth,
            conservative,
            total,
            counters,
        })
    }

    fn cell_index(&self, h1: u64, h2: u64, row: u32) -> usize {
        let column = nth_position(h1, h2, u64::from(row), u64::from(self.width));
        row as usize * self.width as usize + column as usize
    }

    fn min_cell(&self, h1: u64, h2: u64) -> u64 {
        (0..self.depth)
            .map(|row| self.counters[self.cell_index(h1, h2, row)])
            .min()
            .unwrap_or(0)
    }
}

/// `(⌈e/ε⌉, ⌈ln(1/δ)⌉)`, or an error naming `epsilon` or `delta`.
pub(crate) fn dimensions_for(epsilon: f64, delta: f64) -> Result<(u32, u32), ParameterError> {
    if !(epsilon > 0.0 && epsilon < 1.0) {
        return Err(ParameterError::new(
            "epsilon",
            epsilon,
            "must lie strictly between 0 and 1",
        ));
    }
    if !(delta > 0.0 && delta < 1.0) {
        return Err(ParameterError::new(
            "delta",
            delta,
            "must lie strictly between 0 and 1",
        ));
    }
    let width = (E / epsilon).ceil();
    if width > f64::from(MAX_WIDTH) {
        return Err(ParameterError::new(
            "epsilon",
            epsilon,
            format!("needs width ⌈e/ε⌉ = {width}, above the limit of {MAX_WIDTH}"),
        ));
    }
    let depth = (1.0 / delta).ln().ceil().max(1.0);
    if depth > f64::from(MAX_DEPTH) {
        return Err(ParameterError::new(
            "delta",
            delta,
            format!("needs depth ⌈ln(1/δ)⌉ = {depth}, above the limit of {MAX_DEPTH}"),
        ));
    }
    // Both are integers in range after the checks above.
    Ok((width as u32, depth as u32))
}

fn validate_dimensions(width: u32, depth: u32) -> Result<(), ParameterError> {
    if !(1..=MAX_WIDTH).contains(&width) {
        return Err(ParameterError::new(
            "width",
            width,
            format!("must be in 1..={MAX_WIDTH}"),
        ));
    }
    if !(1..=MAX_DEPTH).contains(&depth) {
        return Err(ParameterError::new(
            "depth",
            depth,
            format!("must be in 1..={MAX_DEPTH}"),
        ));
    }
    let cells = u64::from(width) * u64::from(depth);
    if cells > MAX_CELLS {
        return Err(ParameterError::new(
            "width × depth",
            cells,
            format!("counters exceed the limit of {MAX_CELLS}"),
        ));
    }
    Ok(())
}

/// Every insert adds its weight to one counter per row (standard update) or at most its
/// weight (conservative update), and totals saturate no later than counters do, so a row
/// sums to exactly `N` (standard) or at most `N` (conservative) unless `N` saturated.
fn validate_rows(
    counters: &[u64],
    width: usize,
    total: u64,
    conservative: bool,
) -> Result<(), DecodeError> {
    for (row, cells) in counters.chunks_exact(width).enumerate() {
        let sum: u128 = cells.iter().map(|&c| u128::from(c)).sum();
        let ok = if conservative || total == u64::MAX {
            sum <= u128::from(total) || total == u64::MAX
        } else {
            sum == u128::from(total)
        };
        if !ok {
            return Err(DecodeError::Invalid {
                field: "count-min counters",
                reason: format!(
                    "row {row} sums to {sum}, but the total is {total} ({} update)",
                    if conservative {
                        "conservative"
                    } else {
                        "standard"
                    }
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn encoded(s: &CountMin) -> Vec<u8> {
        let mut out = Vec::new();
        s.encode_body(&mut out);
        out
    }

    fn decoded(bytes: &[u8]) -> Result<CountMin, DecodeError> {
        let mut reader = BodyReader::new(bytes);
        let s = CountMin::decode_from(&mut reader)?;
        reader.finish()?;
        Ok(s)
    }

    #[test]
    fn sizing_follows_epsilon_and_delta() {
        let s = CountMin::with_error(0.001, 0.01).unwrap();
        assert_eq!((s.width(), s.depth()), (2719, 5));
        assert!(s.epsilon() <= 0.001);
        assert!(s.delta() <= 0.01);
        let s = CountMin::with_error(0.01, 0.05).unwrap();
        assert_eq!((s.width(), s.depth()), (272, 3));
        let s = CountMin::with_error(0.5, 0.9).unwrap();
        assert_eq!((s.width(), s.depth()), (6, 1));
    }

    #[test]
    fn bad_parameters_are_named() {
        for (eps, delta, name) in [
            (0.0, 0.5, "epsilon"),
            (1.0, 0.5, "epsilon"),
            (f64::NAN, 0.5, "epsilon"),
            (1e-9, 0.5, "epsilon"),
            (0.1, 0.0, "delta"),
            (0.1, 1.0, "delta"),
            (0.1, f64::NAN, "delta"),
            (0.1, 1e-20, "delta"),
        ] {
            assert_eq!(
                CountMin::with_error(eps, delta).unwrap_err().parameter,
                name
            );
        }
        assert_eq!(CountMin::new(0, 1, false).unwrap_err().parameter, "width");
        assert_eq!(
            CountMin::new(MAX_WIDTH + 1, 1, false)
                .unwrap_err()
                .parameter,
            "width"
        );
        assert_eq!(CountMin::new(1, 0, false).unwrap_err().parameter, "depth");
        assert_eq!(CountMin::new(1, 33, false).unwrap_err().parameter, "depth");
        assert_eq!(
            CountMin::new(MAX_WIDTH, 2, false).unwrap_err().parameter,
            "width × depth"
        );
        assert!(CountMin::new(MAX_WIDTH, 1, false).is_ok());
    }

    #[test]
    fn estimates_never_under_count() {
        let mut standard = CountMin::new(64, 3, false).unwrap();
        let mut conservative = CountMin::new(64, 3, true).unwrap();
        let mut truth: HashMap<u32, u64> = HashMap::new();
        for i in 0..5000u32 {
            let item = (i * i % 997).to_le_bytes();
            let weight = u64::from(i % 3);
            standard.insert_weighted(&item, weight);
            conservative.insert_weighted(&item, weight);
            *truth.entry(i * i % 997).or_default() += weight;
        }
        for (item, &f) in &truth {
            let item = item.to_le_bytes();
            let (s, c) = (standard.estimate(&item), conservative.estimate(&item));
            assert!(c >= f, "conservative {c} < truth {f}");
            assert!(s >= c, "standard {s} < conservative {c}");
        }
        assert_eq!(standard.total(), truth.values().sum::<u64>());
        assert_eq!(standard.total(), conservative.total());
        assert!(standard.estimate(b"never inserted") <= standard.total());
    }

    #[test]
    fn saturated_counters_still_bound_the_truth() {
        let mut s = CountMin::new(4, 2, false).unwrap();
        s.insert_weighted(b"x", u64::MAX - 1);
        s.insert_weighted(b"x", 5);
        assert_eq!(s.estimate(b"x"), u64::MAX);
        assert_eq!(s.total(), u64::MAX);
        let mut t = s.clone();
        t.merge(&s).unwrap();
        assert_eq!(t.estimate(b"x"), u64::MAX);
        assert_eq!(decoded(&encoded(&t)).unwrap(), t);
    }

    #[test]
    fn merge_mismatch_names_the_parameter() {
        let a = CountMin::new(16, 2, false).unwrap();
        for (other, name) in [
            (CountMin::new(17, 2, false).unwrap(), "width"),
            (CountMin::new(16, 3, false).unwrap(), "depth"),
            (CountMin::new(16, 2, true).unwrap(), "conservative update"),
        ] {
            let mut left = a.clone();
            match left.merge(&other) {
                Err(MergeError::ParameterMismatch { parameter, .. }) => {
                    assert_eq!(parameter, name)
                }
                other => panic!("expected a mismatch on {name}, got {other:?}"),
            }
            assert_eq!(left, a);
        }
    }

    #[test]
    fn decode_names_each_invalid_field() {
        let mut s = CountMin::new(3, 2, false).unwrap();
        s.insert_weighted(b"a", 4);
        let good = encoded(&s);
        assert_eq!(decoded(&good).unwrap(), s);

        let field_of = |bytes: &[u8]| match decoded(bytes) {
            Err(DecodeError::Invalid { field, .. }) => field,
            other => panic!("expected Invalid, got {other:?}"),
        };
        let mut bad = good.clone();
        bad[0..4].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(field_of(&bad), "count-min width");
        let mut bad = good.clone();
        bad[4..8].copy_from_slice(&33u32.to_le_bytes());
        assert_eq!(field_of(&bad), "count-min depth");
        let mut bad = good.clone();
        bad[0..4].copy_from_slice(&MAX_WIDTH.to_le_bytes());
        assert_eq!(field_of(&bad), "count-min width × depth");
        let mut bad = good.clone();
        bad[8] = 2;
        assert_eq!(field_of(&bad), "count-min flags");
        let mut bad = good.clone();
        bad[9] ^= 1;
        assert_eq!(field_of(&bad), "count-min counters");
        // Huge declared dimensions with few bytes: refused before allocating.
        let mut bad = good.clone();
        bad[0..4].copy_from_slice(&(1u32 << 22).to_le_bytes());
        bad[4..8].copy_from_slice(&4u32.to_le_bytes());
        assert!(matches!(
            decoded(&bad),
            Err(DecodeError::Truncated {
                what: "count-min counters",
                ..
            })
        ));
        assert!(matches!(
            decoded(&good[..good.len() - 1]),
            Err(DecodeError::Truncated { .. })
        ));
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            decoded(&long),
            Err(DecodeError::TrailingBytes { extra: 1 })
        ));
    }

    fn stream() -> impl Strategy<Value = Vec<(u8, u64)>> {
        prop::collection::vec((any::<u8>(), 0u64..1000), 0..60)
    }

    fn sketch_of(items: &[(u8, u64)], conservative: bool) -> CountMin {
        let mut s = CountMin::new(7, 3, conservative).unwrap();
        for &(item, weight) in items {
            s.insert_weighted(&[item], weight);
        }
        s
    }

    fn merged(a: &CountMin, b: &CountMin) -> CountMin {
        let mut m = a.clone();
        m.merge(b).unwrap();
        m
    }

    proptest! {
        #[test]
        fn merge_is_commutative_and_associative(
            a in stream(), b in stream(), c in stream(), conservative in any::<bool>()
        ) {
            let (a, b, c) = (
                sketch_of(&a, conservative),
                sketch_of(&b, conservative),
                sketch_of(&c, conservative),
            );
            prop_assert_eq!(encoded(&merged(&a, &b)), encoded(&merged(&b, &a)));
            prop_assert_eq!(
                encoded(&merged(&merged(&a, &b), &c)),
                encoded(&merged(&a, &merged(&b, &c)))
            );
        }

        #[test]
        fn merge_equals_sketch_of_union(a in stream(), b in stream()) {
            let union: Vec<_> = a.iter().chain(&b).copied().collect();
            prop_assert_eq!(
                encoded(&merged(&sketch_of(&a, false), &sketch_of(&b, false))),
                encoded(&sketch_of(&union, false))
            );
        }

        #[test]
        fn merged_conservative_sketches_bound_the_truth(a in stream(), b in stream()) {
            let m = merged(&sketch_of(&a, true), &sketch_of(&b, true));
            let standard = merged(&sketch_of(&a, false), &sketch_of(&b, false));
            let mut truth: HashMap<u8, u64> = HashMap::new();
            for &(item, weight) in a.iter().chain(&b) {
                *truth.entry(item).or_default() += weight;
            }
            for (item, f) in truth {
                prop_assert!(m.estimate(&[item]) >= f);
                prop_assert!(m.estimate(&[item]) <= standard.estimate(&[item]));
            }
        }

        #[test]
        fn encoding_round_trips(a in stream(), conservative in any::<bool>()) {
            let s = sketch_of(&a, conservative);
            prop_assert_eq!(decoded(&encoded(&s)).unwrap(), s);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decoded(&bytes);
        }
    }
}
