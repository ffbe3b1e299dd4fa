//! Frequent items: which items are heavy, with deterministic bounds on their counts.
//!
//! [`FrequentItems`] is the Misra–Gries summary ("Finding repeated elements", 1982) with
//! the merge rule of Agarwal et al. ("Mergeable Summaries", PODS 2012). It keeps at most
//! `k` (the capacity) item counters between operations, plus `error`, the total amount
//! subtracted from every counter so far.
//!
//! **Invariant.** For every item `x` with true frequency `f` in a stream of total weight
//! `N`: `count(x) ≤ f ≤ count(x) + error`, with `count(x) = 0` for an untracked item, and
//! `error ≤ (N − Σ counts)/(k + 1) ≤ N/(k + 1)`. So every item with `f > N/(k + 1)` is
//! tracked; with `k = ⌈1/ε⌉` that is every item with `f > ε·N`.
//!
//! **Purge.** Reducing a set of counters to at most `k`: take `c`, the `(k+1)`-th largest
//! count, subtract `c` from every counter, drop those that reach zero and add `c` to
//! `error`. The `k + 1` largest counters each lose `c`, so `Σ counts` falls by at least
//! `(k + 1)·c` while `error` grows by `c`, which keeps the invariant.
//!
//! **Updates** add the weight to the item's counter (a new counter if untracked) and let
//! the table grow to `2k` counters; when it exceeds `2k` it is purged to at most `k`. A
//! purge costs `O(k)` (selection, not sorting) and happens at most once per `k` new
//! items, so an update is amortised `O(1)`.
//!
//! **Merge** adds the other summary's counters into this one, adds the errors and the
//! totals, and then purges if more than `k` counters remain: at the end of a merge a
//! summary always holds at most `k` counters. Merging needs equal capacities.
//!
//! **Encoding** holds at most `k` counters: a summary holding more (between purges of
//! its updates) is encoded as if purged, see [`FrequentItems::compact`]. Entries are
//! sorted by item bytes, so `merge(a, b)` and `merge(b, a)` encode byte for byte alike.
//!
//! **Grouping.** Merge is commutative but not associative byte for byte, because where a
//! purge happens depends on the grouping. With `k = 1`, `a = {x: 2}`, `b = {y: 1}`,
//! `c = {z: 1}`: `(a + b) + c` purges twice and ends with no counters and error 2, while
//! `a + (b + c)` ends with `{x: 2}` and error 1. The guarantee — bounds that contain the
//! truth and `error ≤ (N − Σ counts)/(k + 1)` — holds under every grouping.
//!
//! **Limits.** Capacity `1..=65536`; items up to [`MAX_ITEM_LEN`] bytes (longer items are
//! refused with a [`ParameterError`]). Counts, `error` and `N` saturate at `u64::MAX`
//! instead of wrapping.
//!
//! ```
//! use hourglass_sketch::frequent::FrequentItems;
//!
//! let mut a = FrequentItems::new(2).unwrap();
//! for item in ["cart", "cart", "cart", "home", "login", "search", "cart"] {
//!     a.try_insert(item.as_bytes()).unwrap();
//! }
//! let mut b = FrequentItems::new(2).unwrap();
//! b.try_insert_weighted(b"home", 3).unwrap();
//! a.merge(&b).unwrap();
//!
//! let top = a.top(1);
//! assert_eq!(top[0].item, b"cart");
//! assert!(top[0].lower <= 4 && 4 <= top[0].upper);
//! assert!(a.lower(b"home") <= 4 && 4 <= a.upper(b"home"));
//! assert!(a.error() * 3 <= a.total());
//! ```

use crate::error::{DecodeError, MergeError, ParameterError};
use crate::format::BodyReader;
use std::collections::HashMap;

/// The longest item accepted, in bytes.
pub const MAX_ITEM_LEN: usize = 4096;
/// The largest capacity accepted.
pub const MAX_CAPACITY: u32 = 65536;

/// A Misra–Gries frequent-items summary of capacity `k`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrequentItems {
    capacity: u32,
    /// At most `2k` counters between updates, at most `k` after a merge or purge; every
    /// count is positive.
    counts: HashMap<Box<[u8]>, u64>,
    /// Total amount subtracted from every counter so far.
    error: u64,
    /// Sum of all weights inserted, `N` (saturating).
    total: u64,
}

/// An item with the bounds of its frequency, as reported by [`FrequentItems::top`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrequentItem {
    /// The item's bytes.
    pub item: Vec<u8>,
    /// A lower bound on its frequency (its counter).
    pub lower: u64,
    /// An upper bound on its frequency (its counter plus the error).
    pub upper: u64,
}

impl FrequentItems {
    /// An empty summary with `capacity` counters, `1..=65536`.
    pub fn new(capacity: u32) -> Result<FrequentItems, ParameterError> {
        validate_capacity(capacity)?;
        Ok(FrequentItems {
            capacity,
            counts: HashMap::new(),
            error: 0,
            total: 0,
        })
    }

    /// Counts one occurrence of `item`; an item longer than [`MAX_ITEM_LEN`] is refused
    /// and changes nothing.
    pub fn try_insert(&mut self, item: &[u8]) -> Result<(), ParameterError> {
        self.try_insert_weighted(item, 1)
    }

    /// Counts `weight` occurrences of `item`; an item longer than [`MAX_ITEM_LEN`] is
    /// refused and changes nothing.
    pub fn try_insert_weighted(&mut self, item: &[u8], weight: u64) -> Result<(), ParameterError> {
        check_item_len(item)?;
        if weight == 0 {
            return Ok(());
        }
        self.total = self.total.saturating_add(weight);
        match self.counts.get_mut(item) {
            Some(count) => *count = count.saturating_add(weight),
            None => {
                self.counts.insert(item.into(), weight);
                if self.counts.len() > 2 * self.capacity as usize {
                    self.purge();
                }
            }
        }
        Ok(())
    }

    /// Adds `other` into `self` (the merge rule of Agarwal et al.): sums of counters,
    /// errors and totals, then a purge down to at most `k` counters.
    ///
    /// Fails, leaving `self` unchanged, if the capacities differ.
    pub fn merge(&mut self, other: &FrequentItems) -> Result<(), MergeError> {
        self.check_mergeable(other)?;
        for (item, &count) in &other.counts {
            match self.counts.get_mut(item) {
                Some(mine) => *mine = mine.saturating_add(count),
                None => {
                    self.counts.insert(item.clone(), count);
                }
            }
        }
        self.error = self.error.saturating_add(other.error);
        self.total = self.total.saturating_add(other.total);
        self.purge();
        Ok(())
    }

    /// Succeeds if `other` can merge into `self`; the error names `capacity`.
    pub fn check_mergeable(&self, other: &FrequentItems) -> Result<(), MergeError> {
        if self.capacity != other.capacity {
            return Err(MergeError::ParameterMismatch {
                parameter: "capacity",
                left: self.capacity.to_string(),
                right: other.capacity.to_string(),
            });
        }
        Ok(())
    }

    /// Purges down to at most `k` counters if more are held (see the module docs). The
    /// bounds stay valid but may widen; encoding always describes the compacted summary.
    pub fn compact(&mut self) {
        self.purge();
    }

    /// A lower bound on the frequency of `item`: its counter, 0 if untracked.
    pub fn lower(&self, item: &[u8]) -> u64 {
        self.counts.get(item).copied().unwrap_or(0)
    }

    /// An upper bound on the frequency of `item`: its counter plus [`FrequentItems::error`]
    /// (just the error if untracked).
    pub fn upper(&self, item: &[u8]) -> u64 {
        self.lower(item).saturating_add(self.error)
    }

    /// Up to `wanted` tracked items, heaviest first: by lower bound descending, then by
    /// item bytes ascending so that the order is deterministic.
    ///
    /// Every item with frequency above `N/(k + 1)` is tracked; pass `usize::MAX` to get
    /// them all.
    pub fn top(&self, wanted: usize) -> Vec<FrequentItem> {
        let mut entries: Vec<(&[u8], u64)> = self
            .counts
            .iter()
            .map(|(item, &count)| (&item[..], count))
            .collect();
        entries.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        entries
            .into_iter()
            .take(wanted)
            .map(|(item, count)| FrequentItem {
                item: item.to_vec(),
                lower: count,
                upper: count.saturating_add(self.error),
            })
            .collect()
    }

    /// The total amount subtracted from every counter: the width of every item's bounds.
    pub fn error(&self) -> u64 {
        self.error
    }

    /// Sum of all weights inserted, `N` (saturating).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The capacity `k`.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// How many items are tracked now (at most `2k`, at most `k` after a merge).
    pub fn tracked(&self) -> usize {
        self.counts.len()
    }

    /// Approximate heap and inline bytes the summary occupies.
    pub fn size_bytes(&self) -> usize {
        // Per entry: the boxed slice's pointer and length, the count, a control byte, and
        // the item's bytes on the heap.
        let per_entry = std::mem::size_of::<(Box<[u8]>, u64)>() + 1;
        std::mem::size_of::<Self>()
            + self.counts.capacity() * per_entry
            + self.counts.keys().map(|k| k.len()).sum::<usize>()
    }

    /// Appends the frequent-items part of the encoding (docs/FORMAT.md) of the compacted
    /// summary: capacity, error, total, entry count, entries sorted by item bytes.
    pub(crate) fn encode_body(&self, out: &mut Vec<u8>) {
        let threshold = self.purge_threshold();
        let mut entries: Vec<(&[u8], u64)> = self
            .counts
            .iter()
            .filter(|&(_, &count)| count > threshold)
            .map(|(item, &count)| (&item[..], count - threshold))
            .collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        out.extend_from_slice(&self.capacity.to_le_bytes());
        out.extend_from_slice(&self.error.saturating_add(threshold).to_le_bytes());
        out.extend_from_slice(&self.total.to_le_bytes());
        // At most k ≤ 65536 entries survive the threshold.
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for (item, count) in entries {
            // Items are at most MAX_ITEM_LEN bytes.
            out.extend_from_slice(&(item.len() as u32).to_le_bytes());
            out.extend_from_slice(item);
            out.extend_from_slice(&count.to_le_bytes());
        }
    }

    /// Reads the frequent-items part of the encoding, validating every field.
    pub(crate) fn decode_from(reader: &mut BodyReader<'_>) -> Result<FrequentItems, DecodeError> {
        let capacity = reader.u32("frequent-items capacity")?;
        if let Err(e) = validate_capacity(capacity) {
            return Err(invalid("frequent-items capacity", e.reason));
        }
        let error = reader.u64("frequent-items error")?;
        let total = reader.u64("frequent-items total")?;
        let entries = reader.u32("frequent-items entry count")?;
        if entries > capacity {
            return Err(invalid(
                "frequent-items entry count",
                format!("{entries} entries exceed the capacity {capacity}"),
            ));
        }
        // Each entry takes at least 12 bytes (length and count): check before allocating.
        const MIN_ENTRY_LEN: usize = 12;
        if reader.remaining() / MIN_ENTRY_LEN < entries as usize {
            return Err(DecodeError::Truncated {
                what: "frequent-items entries",
                needed: entries as usize * MIN_ENTRY_LEN,
                available: reader.remaining(),
            });
        }
        let mut counts = HashMap::with_capacity(entries as usize);
        let mut previous: Option<&[u8]> = None;
        let mut sum: u128 = 0;
        for _ in 0..entries {
            let len = reader.u32("frequent-items item length")? as usize;
            if len > MAX_ITEM_LEN {
                return Err(invalid(
                    "frequent-items item length",
                    format!("{len} bytes exceeds the limit of {MAX_ITEM_LEN}"),
                ));
            }
            let item = reader.take(len, "frequent-items item")?;
            if previous.is_some_and(|p| p >= item) {
                return Err(invalid(
                    "frequent-items order",
                    "items must be sorted strictly ascending by their bytes".to_string(),
                ));
            }
            previous = Some(item);
            let count = reader.u64("frequent-items count")?;
            if count == 0 {
                return Err(invalid(
                    "frequent-items count",
                    "a tracked item's count must be positive".to_string(),
                ));
            }
            sum += u128::from(count);
            counts.insert(Box::from(item), count);
        }
        // Without saturation the invariant is exact: Σ counts ≤ N and
        // (k + 1)·error ≤ N − Σ counts. Once N saturates it says nothing.
        if total != u64::MAX {
            if sum > u128::from(total) {
                return Err(invalid(
                    "frequent-items total",
                    format!("{total} is below the sum of the counts, {sum}"),
                ));
            }
            let slack = u128::from(total) - sum;
            if u128::from(error) * (u128::from(capacity) + 1) > slack {
                return Err(invalid(
                    "frequent-items error",
                    format!(
                        "{error} exceeds (N − Σ counts)/(k + 1) = {slack}/{}",
                        u64::from(capacity) + 1
                    ),
                ));
            }
        }
        Ok(FrequentItems {
            capacity,
            counts,
            error,
            total,
        })
    }

    /// The amount a purge would subtract: the `(k+1)`-th largest count, or 0 if at most
    /// `k` counters are held.
    fn purge_threshold(&self) -> u64 {
        let k = self.capacity as usize;
        if self.counts.len() <= k {
            return 0;
        }
        let mut counts: Vec<u64> = self.counts.values().copied().collect();
        *counts.select_nth_unstable_by(k, |a, b| b.cmp(a)).1
    }

    fn purge(&mut self) {
        let threshold = self.purge_threshold();
        if threshold == 0 {
            return;
        }
        self.counts.retain(|_, count| {
            *count = count.saturating_sub(threshold);
            *count > 0
        });
        self.error = self.error.saturating_add(threshold);
    }
}

fn validate_capacity(capacity: u32) -> Result<(), ParameterError> {
    if !(1..=MAX_CAPACITY).contains(&capacity) {
        return Err(ParameterError::new(
            "capacity",
            capacity,
            format!("must be in 1..={MAX_CAPACITY}"),
        ));
    }
    Ok(())
}

/// Refuses items longer than [`MAX_ITEM_LEN`], naming `item length`.
pub(crate) fn check_item_len(item: &[u8]) -> Result<(), ParameterError> {
    if item.len() > MAX_ITEM_LEN {
        return Err(ParameterError::new(
            "item length",
            item.len(),
            format!("items are at most {MAX_ITEM_LEN} bytes"),
        ));
    }
    Ok(())
}

fn invalid(field: &'static str, reason: String) -> DecodeError {
    DecodeError::Invalid { field, reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn encoded(s: &FrequentItems) -> Vec<u8> {
        let mut out = Vec::new();
        s.encode_body(&mut out);
        out
    }

    fn decoded(bytes: &[u8]) -> Result<FrequentItems, DecodeError> {
        let mut reader = BodyReader::new(bytes);
        let s = FrequentItems::decode_from(&mut reader)?;
        reader.finish()?;
        Ok(s)
    }

    fn summary(capacity: u32, items: &[(&str, u64)]) -> FrequentItems {
        let mut s = FrequentItems::new(capacity).unwrap();
        for &(item, weight) in items {
            s.try_insert_weighted(item.as_bytes(), weight).unwrap();
        }
        s
    }

    fn merged(a: &FrequentItems, b: &FrequentItems) -> FrequentItems {
        let mut m = a.clone();
        m.merge(b).unwrap();
        m
    }

    #[test]
    fn parameters_are_checked() {
        assert_eq!(FrequentItems::new(0).unwrap_err().parameter, "capacity");
        assert_eq!(
            FrequentItems::new(MAX_CAPACITY + 1).unwrap_err().parameter,
            "capacity"
        );
        let mut s = FrequentItems::new(MAX_CAPACITY).unwrap();
        let long = vec![b'x'; MAX_ITEM_LEN + 1];
        assert_eq!(s.try_insert(&long).unwrap_err().parameter, "item length");
        assert_eq!(s.total(), 0);
        assert!(s.try_insert(&long[..MAX_ITEM_LEN]).is_ok());
        assert!(s.try_insert(b"").is_ok());
        assert_eq!(s.lower(b""), 1);
    }

    #[test]
    fn bounds_hold_on_a_handmade_stream() {
        // k = 2: the table grows to 4 counters, the 5th distinct item triggers a purge.
        let mut s = FrequentItems::new(2).unwrap();
        for item in ["a", "a", "a", "a", "b", "b", "c", "d", "e", "a", "f"] {
            s.try_insert(item.as_bytes()).unwrap();
        }
        // After "e": a4 b2 c1 d1 e1, 3rd largest = 1 → a3 b1, error 1; then a4 b1 f1.
        assert_eq!(s.error(), 1);
        assert_eq!((s.lower(b"a"), s.upper(b"a")), (4, 5));
        assert_eq!((s.lower(b"b"), s.upper(b"b")), (1, 2));
        assert_eq!((s.lower(b"c"), s.upper(b"c")), (0, 1));
        assert_eq!(s.total(), 11);
        assert_eq!(
            s.top(2),
            vec![
                FrequentItem {
                    item: b"a".to_vec(),
                    lower: 4,
                    upper: 5
                },
                FrequentItem {
                    item: b"b".to_vec(),
                    lower: 1,
                    upper: 2
                },
            ]
        );
        s.compact();
        assert!(s.tracked() <= 2);
        assert_eq!((s.lower(b"a"), s.upper(b"a")), (3, 5));
    }

    #[test]
    fn purge_keeps_at_most_capacity() {
        let mut s = FrequentItems::new(10).unwrap();
        for i in 0..10_000u32 {
            s.try_insert_weighted(&(i % 777).to_le_bytes(), u64::from(i % 5 + 1))
                .unwrap();
            assert!(s.tracked() <= 20);
        }
        let t = merged(&s, &FrequentItems::new(10).unwrap());
        assert!(t.tracked() <= 10);
        assert!(
            t.error() * 11 <= t.total() - t.top(usize::MAX).iter().map(|e| e.lower).sum::<u64>()
        );
        let decoded = decoded(&encoded(&s)).unwrap();
        assert!(decoded.tracked() <= 10);
        assert_eq!(decoded, t);
    }

    #[test]
    fn merge_is_not_byte_associative_but_keeps_bounds() {
        let (a, b, c) = (
            summary(1, &[("x", 2)]),
            summary(1, &[("y", 1)]),
            summary(1, &[("z", 1)]),
        );
        let left = merged(&merged(&a, &b), &c);
        let right = merged(&a, &merged(&b, &c));
        assert_eq!((left.tracked(), left.error()), (0, 2));
        assert_eq!((right.lower(b"x"), right.error()), (2, 1));
        for s in [&left, &right] {
            assert!(s.lower(b"x") <= 2 && 2 <= s.upper(b"x"));
            assert!(s.upper(b"y") >= 1 && s.upper(b"z") >= 1);
        }
    }

    #[test]
    fn merge_mismatch_names_capacity() {
        let mut a = FrequentItems::new(3).unwrap();
        match a.merge(&FrequentItems::new(4).unwrap()) {
            Err(MergeError::ParameterMismatch { parameter, .. }) => {
                assert_eq!(parameter, "capacity")
            }
            other => panic!("expected a capacity mismatch, got {other:?}"),
        }
    }

    #[test]
    fn decode_names_each_invalid_field() {
        let s = summary(3, &[("a", 3), ("b", 2)]);
        let good = encoded(&s);
        assert_eq!(decoded(&good).unwrap(), s);
        // capacity 0..4, error 4..12, total 12..20, entries 20..24,
        // "a": len 24..28, byte 28, count 29..37; "b": len 37..41, byte 41, count 42..50.
        let field_of = |patch: &dyn Fn(&mut Vec<u8>)| {
            let mut bad = good.clone();
            patch(&mut bad);
            match decoded(&bad) {
                Err(DecodeError::Invalid { field, .. }) => field,
                other => panic!("expected Invalid, got {other:?}"),
            }
        };
        let put32 =
            |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let put64 =
            |b: &mut Vec<u8>, at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        assert_eq!(field_of(&|b| put32(b, 0, 0)), "frequent-items capacity");
        assert_eq!(field_of(&|b| put32(b, 0, 1)), "frequent-items entry count");
        assert_eq!(field_of(&|b| put64(b, 4, 1)), "frequent-items error");
        assert_eq!(field_of(&|b| put64(b, 12, 4)), "frequent-items total");
        assert_eq!(field_of(&|b| b[41] = b'a'), "frequent-items order");
        assert_eq!(field_of(&|b| put64(b, 42, 0)), "frequent-items count");
        assert_eq!(
            field_of(&|b| {
                put32(b, 24, 5000);
                b.resize(6000, 0);
            }),
            "frequent-items item length"
        );
        let mut bad = good.clone();
        put32(&mut bad, 0, MAX_CAPACITY);
        put32(&mut bad, 20, MAX_CAPACITY);
        assert!(matches!(
            decoded(&bad),
            Err(DecodeError::Truncated {
                what: "frequent-items entries",
                ..
            })
        ));
    }

    fn weighted_stream() -> impl Strategy<Value = Vec<(u8, u64)>> {
        // A skewed alphabet so that some items are heavy.
        prop::collection::vec((0u8..40, 1u64..20), 0..80).prop_map(|v| {
            v.into_iter()
                .map(|(item, weight)| (item % (item / 8 + 1), weight))
                .collect()
        })
    }

    fn sketch_of(capacity: u32, items: &[(u8, u64)]) -> FrequentItems {
        let mut s = FrequentItems::new(capacity).unwrap();
        for &(item, weight) in items {
            s.try_insert_weighted(&[item], weight).unwrap();
        }
        s
    }

    proptest! {
        #[test]
        fn merge_is_commutative(
            capacity in 1u32..6, a in weighted_stream(), b in weighted_stream()
        ) {
            let (a, b) = (sketch_of(capacity, &a), sketch_of(capacity, &b));
            prop_assert_eq!(encoded(&merged(&a, &b)), encoded(&merged(&b, &a)));
        }

        #[test]
        fn bounds_contain_the_truth_after_any_merge_tree(
            capacity in 1u32..6,
            streams in prop::collection::vec(weighted_stream(), 1..8),
            choices in prop::collection::vec((any::<usize>(), any::<usize>(), any::<bool>()), 8),
        ) {
            let mut truth: BTreeMap<u8, u64> = BTreeMap::new();
            for &(item, weight) in streams.iter().flatten() {
                *truth.entry(item).or_default() += weight;
            }
            let mut pool: Vec<FrequentItems> =
                streams.iter().map(|s| sketch_of(capacity, s)).collect();
            let mut step = 0;
            while pool.len() > 1 {
                let (i, j, reencode) = choices[step % choices.len()];
                step += 1;
                let left = pool.swap_remove(i % pool.len());
                let right = pool.swap_remove(j % pool.len());
                let mut m = merged(&left, &right);
                if reencode {
                    m = decoded(&encoded(&m)).unwrap();
                }
                pool.push(m);
            }
            let s = &pool[0];
            let n: u64 = truth.values().sum();
            prop_assert_eq!(s.total(), n);
            let sum: u64 = s.top(usize::MAX).iter().map(|e| e.lower).sum();
            prop_assert!(s.error() * (u64::from(capacity) + 1) <= n - sum);
            for item in 0..=u8::MAX {
                let f = truth.get(&item).copied().unwrap_or(0);
                prop_assert!(s.lower(&[item]) <= f && f <= s.upper(&[item]));
                if f * (u64::from(capacity) + 1) > n {
                    prop_assert!(s.lower(&[item]) > 0, "heavy item {} untracked", item);
                    prop_assert!(s.top(capacity as usize).iter().any(|e| e.item == [item]));
                }
            }
        }

        #[test]
        fn encoding_round_trips(capacity in 1u32..6, a in weighted_stream()) {
            let mut s = sketch_of(capacity, &a);
            let bytes = encoded(&s);
            s.compact();
            prop_assert_eq!(decoded(&bytes).unwrap(), s);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decoded(&bytes);
        }
    }
}
