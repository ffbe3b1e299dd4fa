//! The sparse representation: the hashes seen, as `u32` tokens of a virtual sketch at
//! precision [`SPARSE_PRECISION`] (2^25 registers), kept sorted.
//!
//! A token is `index << 6 | rank`, with `index` the top 25 bits of the hash and `rank` the
//! update value at precision 25 (`1..=40`): bit for bit the entry a HyperLogLog sparse
//! sketch keeps. Where HyperLogLog keeps only the largest rank per index, an UltraLogLog
//! needs the two ranks below it as well, so the list keeps every distinct token except
//! those at least three ranks below the largest of their index, which no register at any
//! precision can remember (an index's tokens map to one register, and at most to three
//! consecutive update values of it). The list is therefore a function of the set of hashes
//! alone; a token sorts by index first, so the tokens of one index are adjacent and
//! ascending by rank.
//!
//! As in HyperLogLog's sparse list, tokens of indices not yet present go to a small sorted
//! `pending` list that is merged into the main list once it holds about √(2n) tokens; the
//! two lists never share an index. The sketch's switch to dense depends on the number of
//! distinct indices, which is kept as a count.

use super::SPARSE_PRECISION;
use std::borrow::Cow;
use std::ops::Range;

/// Bits of a token that hold the rank.
const RANK_BITS: u32 = 6;
/// The largest rank at the sparse precision: 64 − 25 + 1.
pub(super) const MAX_SPARSE_RANK: u32 = 65 - SPARSE_PRECISION as u32;
/// One more than the largest sparse index.
pub(super) const SPARSE_REGISTERS: u64 = 1 << SPARSE_PRECISION;

/// The token of a hash.
#[inline]
pub(super) fn token_of_hash(hash: u64) -> u32 {
    let sp = u32::from(SPARSE_PRECISION);
    let index = (hash >> (64 - sp)) as u32;
    let rank = (hash << sp).leading_zeros().min(64 - sp) + 1;
    index << RANK_BITS | rank
}

/// A hash whose token is `token`: the index in the top 25 bits, then `rank − 1` zeros and
/// a one (nothing for the largest rank).
pub(super) fn hash_of_token(token: u32) -> u64 {
    let rank = rank_of(token);
    let index = u64::from(index_of(token)) << (64 - u32::from(SPARSE_PRECISION));
    if rank >= MAX_SPARSE_RANK {
        index
    } else {
        index | 1 << (MAX_SPARSE_RANK - 1 - rank)
    }
}

/// The index at the sparse precision.
#[inline]
pub(super) fn index_of(token: u32) -> u32 {
    token >> RANK_BITS
}

/// The rank, `1..=40` in a valid token.
#[inline]
pub(super) fn rank_of(token: u32) -> u32 {
    token & ((1 << RANK_BITS) - 1)
}

/// The register index and update value at `precision` of the hash behind `token`: the
/// dense index is the top `precision` bits of the sparse index; the `25 − precision` bits
/// below them come first in the update value's bit string, so if any is set they decide it
/// alone, and if not it continues into the sparse rank.
#[inline]
pub(super) fn dense_position(token: u32, precision: u8) -> (usize, u32) {
    let dropped = u32::from(SPARSE_PRECISION - precision);
    let index = index_of(token);
    let low = index & ((1 << dropped) - 1);
    let value = if low != 0 {
        low.leading_zeros() - (u32::BITS - dropped) + 1
    } else {
        dropped + rank_of(token)
    };
    ((index >> dropped) as usize, value)
}

/// Whether a token of rank `rank` is still remembered in a group whose largest rank is
/// `max`.
#[inline]
fn kept(rank: u32, max: u32) -> bool {
    rank + 2 >= max
}

/// The range of `list` (sorted) holding the tokens of `index`.
fn group(list: &[u32], index: u32) -> Range<usize> {
    let start = list.partition_point(|&t| index_of(t) < index);
    let end = start + list[start..].partition_point(|&t| index_of(t) == index);
    start..end
}

/// Drops from a sorted, duplicate-free list the tokens three or more ranks below the
/// largest of their index, in place.
fn prune(list: &mut Vec<u32>) {
    let mut out = 0;
    let mut start = 0;
    while start < list.len() {
        let index = index_of(list[start]);
        let mut end = start + 1;
        while end < list.len() && index_of(list[end]) == index {
            end += 1;
        }
        let max = rank_of(list[end - 1]);
        for at in start..end {
            if kept(rank_of(list[at]), max) {
                list[out] = list[at];
                out += 1;
            }
        }
        start = end;
    }
    list.truncate(out);
}

/// The position of the first token of a sorted, duplicate-free list that is three or more
/// ranks below the largest of its index, which a canonical list never holds.
pub(super) fn first_pruned(list: &[u32]) -> Option<usize> {
    let mut start = 0;
    while start < list.len() {
        let index = index_of(list[start]);
        let end = start + list[start..].partition_point(|&t| index_of(t) == index);
        let max = rank_of(list[end - 1]);
        if let Some(at) = (start..end).find(|&at| !kept(rank_of(list[at]), max)) {
            return Some(at);
        }
        start = end;
    }
    None
}

/// The canonical union of two canonical token lists.
pub(super) fn union(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        if x <= y {
            out.push(x);
            i += 1;
            j += usize::from(x == y);
        } else {
            out.push(y);
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    prune(&mut out);
    out
}

/// The number of distinct indices of a sorted token list.
pub(super) fn count_indices(list: &[u32]) -> usize {
    list.windows(2)
        .filter(|w| index_of(w[0]) != index_of(w[1]))
        .count()
        + usize::from(!list.is_empty())
}

/// The tokens of a sparse sketch: a sorted list plus a small sorted list of recent new
/// indices, disjoint by index, and the number of distinct indices of both.
#[derive(Clone, Debug, Default)]
pub(super) struct SparseTokens {
    sorted: Vec<u32>,
    pending: Vec<u32>,
    indices: usize,
}

impl SparseTokens {
    /// Tokens from a canonical list.
    pub(super) fn from_canonical(sorted: Vec<u32>) -> SparseTokens {
        let indices = count_indices(&sorted);
        SparseTokens {
            sorted,
            pending: Vec::new(),
            indices,
        }
    }

    /// The number of distinct indices.
    pub(super) fn indices(&self) -> usize {
        self.indices
    }

    /// Records `token`. Returns whether the list changed.
    pub(super) fn insert(&mut self, token: u32) -> bool {
        let index = index_of(token);
        for list in [&mut self.sorted, &mut self.pending] {
            let range = group(list, index);
            if !range.is_empty() {
                return insert_into_group(list, range, token);
            }
        }
        let at = self.pending.partition_point(|&t| t < token);
        self.pending.insert(at, token);
        self.indices += 1;
        // √(2n), at least 32: balances shifting within `pending` against the merge.
        let limit = (2 * self.sorted.len()).isqrt().max(32);
        if self.pending.len() > limit {
            // Disjoint by index, so the union needs no pruning; `union` prunes anyway.
            self.sorted = union(&self.sorted, &self.pending);
            self.pending.clear();
        }
        true
    }

    /// The canonical list: every token, sorted.
    pub(super) fn canonical(&self) -> Cow<'_, [u32]> {
        if self.pending.is_empty() {
            Cow::Borrowed(&self.sorted)
        } else {
            Cow::Owned(union(&self.sorted, &self.pending))
        }
    }

    /// Every token, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.sorted.iter().chain(&self.pending).copied()
    }

    /// Bytes held, counting spare capacity.
    pub(super) fn size_bytes(&self) -> usize {
        (self.sorted.capacity() + self.pending.capacity()) * size_of::<u32>()
    }
}

/// Adds `token` to the non-empty group `range` of its index in `list`, keeping the group
/// sorted and pruned. Returns whether the list changed.
fn insert_into_group(list: &mut Vec<u32>, range: Range<usize>, token: u32) -> bool {
    let group = &list[range.clone()];
    let max = rank_of(group[group.len() - 1]);
    let rank = rank_of(token);
    if group.contains(&token) || !kept(rank, max) {
        return false;
    }
    // At most three tokens in a group: rebuild it.
    let max = max.max(rank);
    let mut new_group: Vec<u32> = group
        .iter()
        .copied()
        .chain([token])
        .filter(|&t| kept(rank_of(t), max))
        .collect();
    new_group.sort_unstable();
    list.splice(range, new_group);
    true
}

impl PartialEq for SparseTokens {
    fn eq(&self, other: &SparseTokens) -> bool {
        self.indices == other.indices && self.canonical() == other.canonical()
    }
}

impl Eq for SparseTokens {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_layout_matches_hll_entries() {
        assert_eq!(token_of_hash(0), 40);
        assert_eq!(token_of_hash(u64::MAX), ((1 << 25) - 1) << 6 | 1);
        assert_eq!(token_of_hash(1 << 39), 1 << 6 | 40);
        assert_eq!(token_of_hash(1 << 38), 1);
    }

    #[test]
    fn hash_of_token_inverts_token_of_hash() {
        for index in [0u32, 1, 12345, (1 << 25) - 1] {
            for rank in 1..=MAX_SPARSE_RANK {
                let token = index << 6 | rank;
                assert_eq!(token_of_hash(hash_of_token(token)), token);
            }
        }
    }

    #[test]
    fn groups_keep_three_ranks() {
        let mut tokens = SparseTokens::default();
        for rank in [1, 5, 3, 4, 2] {
            tokens.insert(7 << 6 | rank);
        }
        assert_eq!(&*tokens.canonical(), &[7 << 6 | 3, 7 << 6 | 4, 7 << 6 | 5]);
        assert!(!tokens.insert(7 << 6 | 2), "three below the largest");
        assert!(!tokens.insert(7 << 6 | 4), "already there");
        assert!(tokens.insert(7 << 6 | 9));
        assert_eq!(&*tokens.canonical(), &[7 << 6 | 9]);
        assert_eq!(tokens.indices(), 1);
    }

    #[test]
    fn union_prunes_and_dedups() {
        let a = [1 << 6 | 3, 5 << 6 | 1, 9 << 6 | 2];
        let b = [1 << 6 | 7, 5 << 6 | 1, 9 << 6 | 1, 12 << 6 | 1];
        assert_eq!(
            union(&a, &b),
            vec![1 << 6 | 7, 5 << 6 | 1, 9 << 6 | 1, 9 << 6 | 2, 12 << 6 | 1]
        );
        assert_eq!(count_indices(&union(&a, &b)), 4);
    }

    #[test]
    fn insert_order_does_not_matter() {
        // Few indices, many ranks, so that groups form, and many indices.
        let tokens: Vec<u32> = (0..5000u64)
            .map(|i| {
                let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                token_of_hash(if i % 3 == 0 { h >> 20 } else { h })
            })
            .collect();
        let mut forward = SparseTokens::default();
        let mut backward = SparseTokens::default();
        for &t in &tokens {
            forward.insert(t);
        }
        for &t in tokens.iter().rev() {
            backward.insert(t);
        }
        assert_eq!(forward, backward);
        let mut expected = tokens.clone();
        expected.sort_unstable();
        expected.dedup();
        prune(&mut expected);
        assert_eq!(&*forward.canonical(), &expected[..]);
        assert_eq!(forward.indices(), count_indices(&expected));
    }
}
