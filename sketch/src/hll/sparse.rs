//! The sparse representation: one `u32` per occupied register of a virtual HyperLogLog at
//! precision [`SPARSE_PRECISION`] (2^25 registers), kept sorted by register index.
//!
//! An entry is `index << 6 | rank` with `index` the top 25 bits of the hash and `rank` in
//! `1..=40`. Because entries sort by index first, ascending entry order is ascending index
//! order, and of two entries with the same index the larger is the one with the larger
//! rank, which is the one a register keeps.
//!
//! Inserting into a sorted vector shifts half of it on average, which at the largest
//! threshold (49,152 entries at precision 18) would cost tens of microseconds per item.
//! New indices therefore go to a small sorted `pending` list that is merged into the main
//! list once it holds about √(2n) entries, which balances the cost of shifting within
//! `pending` against the cost of the merge. The two lists never share an index, so the
//! number of distinct indices is always `sorted.len() + pending.len()`, and the sketch
//! switches to dense at exactly the same point whatever the merge schedule. Equality and
//! encoding see only the canonical list, the sorted union of both.

use crate::common::sparse;
use crate::common::state::SparseSet;
pub(super) use sparse::{MAX_SPARSE_RANK, SPARSE_REGISTERS, index_of, rank_of};
use std::borrow::Cow;
use std::cmp::Ordering;

/// The sparse entry of a hash: its token ([`sparse::token_of_hash`]).
pub(super) use sparse::token_of_hash as entry_of_hash;

/// The dense register (index and value) at `precision` that the hash behind `entry` sets
/// ([`sparse::dense_position`]).
#[inline]
pub(super) fn dense_position(entry: u32, precision: u8) -> (usize, u8) {
    let (index, rank) = sparse::dense_position(entry, precision);
    (index, rank as u8)
}

/// The sorted union of two canonical entry lists, keeping the larger rank of an index in
/// both.
pub(super) fn union(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut left, mut right) = (a.iter().peekable(), b.iter().peekable());
    loop {
        let next = match (left.peek(), right.peek()) {
            (Some(&&x), Some(&&y)) => match index_of(x).cmp(&index_of(y)) {
                Ordering::Less => {
                    left.next();
                    x
                }
                Ordering::Greater => {
                    right.next();
                    y
                }
                Ordering::Equal => {
                    left.next();
                    right.next();
                    x.max(y)
                }
            },
            (Some(&&x), None) => {
                left.next();
                x
            }
            (None, Some(&&y)) => {
                right.next();
                y
            }
            (None, None) => return out,
        };
        out.push(next);
    }
}

/// The entries of a sparse sketch: a sorted list plus a small sorted list of recent new
/// indices, disjoint by index (see the module docs).
#[derive(Clone, Debug, Default)]
pub(crate) struct SparseList {
    sorted: Vec<u32>,
    pending: Vec<u32>,
}

impl SparseList {
    /// A list from entries already sorted by strictly increasing index.
    pub(super) fn from_sorted(sorted: Vec<u32>) -> SparseList {
        SparseList {
            sorted,
            pending: Vec::new(),
        }
    }

    /// The number of distinct indices.
    pub(super) fn len(&self) -> usize {
        self.sorted.len() + self.pending.len()
    }

    /// Records `entry`, keeping the larger rank if its index is already present.
    pub(super) fn insert(&mut self, entry: u32) {
        let index = index_of(entry);
        if let Ok(at) = self.sorted.binary_search_by_key(&index, |&e| index_of(e)) {
            let slot = &mut self.sorted[at];
            *slot = (*slot).max(entry);
            return;
        }
        match self.pending.binary_search_by_key(&index, |&e| index_of(e)) {
            Ok(at) => {
                let slot = &mut self.pending[at];
                *slot = (*slot).max(entry);
            }
            Err(at) => {
                self.pending.insert(at, entry);
                // √(2n), at least 32: see the module docs.
                let limit = (2 * self.sorted.len()).isqrt().max(32);
                if self.pending.len() > limit {
                    self.sorted = union(&self.sorted, &self.pending);
                    self.pending.clear();
                }
            }
        }
    }

    /// Every entry, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.sorted.iter().chain(&self.pending).copied()
    }
}

/// One entry per occupied index, the largest rank seen.
impl SparseSet for SparseList {
    fn from_canonical(sorted: Vec<u32>) -> SparseList {
        SparseList::from_sorted(sorted)
    }

    /// Every entry, sorted by strictly increasing index.
    fn canonical(&self) -> Cow<'_, [u32]> {
        if self.pending.is_empty() {
            Cow::Borrowed(&self.sorted)
        } else {
            Cow::Owned(union(&self.sorted, &self.pending))
        }
    }

    fn occupied(&self) -> usize {
        self.len()
    }

    fn union(a: &[u32], b: &[u32]) -> Vec<u32> {
        union(a, b)
    }

    /// Bytes held, counting spare capacity: what the allocator actually gave us.
    fn size_bytes(&self) -> usize {
        (self.sorted.capacity() + self.pending.capacity()) * size_of::<u32>()
    }
}

impl PartialEq for SparseList {
    fn eq(&self, other: &SparseList) -> bool {
        self.len() == other.len() && self.canonical() == other.canonical()
    }
}

impl Eq for SparseList {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_keeps_max_rank_per_index() {
        let a = [1 << 6 | 3, 5 << 6 | 1, 9 << 6 | 2];
        let b = [1 << 6 | 7, 6 << 6 | 4, 9 << 6 | 1, 12 << 6 | 1];
        assert_eq!(
            union(&a, &b),
            vec![1 << 6 | 7, 5 << 6 | 1, 6 << 6 | 4, 9 << 6 | 2, 12 << 6 | 1]
        );
        assert_eq!(union(&[], &b), b.to_vec());
        assert_eq!(union(&a, &[]), a.to_vec());
    }

    #[test]
    fn insert_order_does_not_matter() {
        let entries: Vec<u32> = (0..5000u64)
            .map(|i| entry_of_hash(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            .collect();
        let mut forward = SparseList::default();
        let mut backward = SparseList::default();
        for &e in &entries {
            forward.insert(e);
        }
        for &e in entries.iter().rev() {
            backward.insert(e);
        }
        assert_eq!(forward, backward);
        let canonical = forward.canonical();
        assert!(
            canonical
                .windows(2)
                .all(|w| index_of(w[0]) < index_of(w[1]))
        );
        assert_eq!(canonical.len(), forward.len());
    }
}
