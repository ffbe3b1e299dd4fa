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
//! A sketch being inserted into holds the same set as one register per occupied index at
//! the sparse precision, in a hash table ([`SparseTokens`]): an insert is one probe and one
//! register update, and the sorted list is spelled out from the registers when it is
//! encoded or merged. The sketch's switch to dense depends on the number of distinct
//! indices, which either layout knows.

use super::{SPARSE_PRECISION, registers};
use crate::common::sparse::RANK_BITS;
pub(super) use crate::common::sparse::{
    MAX_SPARSE_RANK, SPARSE_REGISTERS, dense_position, index_of, rank_of, token_of_hash,
};
use crate::common::state::SparseSet;
use std::borrow::Cow;

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

/// Whether a token of rank `rank` is still remembered in a group whose largest rank is
/// `max`.
#[inline]
fn kept(rank: u32, max: u32) -> bool {
    rank + 2 >= max
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

/// The tokens of a sparse sketch, in one of two layouts holding the same set.
///
/// * **Sorted**: the canonical list, as decoded or merged. What an aggregator holds, and
///   what encoding and merging read without copying.
/// * **Table**: one register per occupied index at the sparse precision, in an
///   open-addressing table. What a sketch takes on its first insert, so that an insert is
///   one probe and one register update instead of a search of a sorted list and an
///   amortised O(√n) merge (the insert path of an agent). The tokens of an index are
///   exactly those its register remembers (`kept`), so the two layouts hold the same
///   information; the canonical list is the table's registers sorted by index and spelled
///   out as tokens.
#[derive(Clone, Debug)]
pub(crate) enum SparseTokens {
    Sorted { list: Vec<u32>, indices: usize },
    Table(IndexTable),
}

impl Default for SparseTokens {
    fn default() -> SparseTokens {
        SparseTokens::Sorted {
            list: Vec::new(),
            indices: 0,
        }
    }
}

impl SparseTokens {
    /// The number of distinct indices.
    pub(super) fn indices(&self) -> usize {
        match self {
            SparseTokens::Sorted { indices, .. } => *indices,
            SparseTokens::Table(table) => table.len,
        }
    }

    /// Makes room for `additional` more indices, `most` in all at most, where the table
    /// would otherwise grow on the way: in one step, to at most half full, so that a run
    /// of inserts neither grows the table step by step (each step places every entry
    /// again) nor probes through long clusters. A run of repeated items may leave the room
    /// unused; [`SparseTokens::trim`] gives it back.
    pub(super) fn reserve(&mut self, additional: usize, most: usize) {
        let wanted = self.indices().saturating_add(additional).min(most);
        let slots = wanted
            .saturating_mul(2)
            .next_power_of_two()
            .max(IndexTable::MIN_SLOTS);
        match self {
            SparseTokens::Table(table) if wanted * 4 <= table.slots.len() * 3 => {}
            SparseTokens::Table(table) => table.resize(slots),
            SparseTokens::Sorted { list, .. } => {
                let mut table = IndexTable::with_slots(slots);
                for &t in list.iter() {
                    table.insert(t);
                }
                *self = SparseTokens::Table(table);
            }
        }
    }

    /// Gives back room that a [`SparseTokens::reserve`] left unused: a table more than
    /// twice the size its entries would have grown it to is sized down to that.
    pub(super) fn trim(&mut self) {
        if let SparseTokens::Table(table) = self {
            let fitting = IndexTable::slots_for(table.len);
            if table.slots.len() > 2 * fitting {
                table.resize(fitting);
            }
        }
    }

    /// Records `token`. Returns whether the set of tokens changed.
    pub(super) fn insert(&mut self, token: u32) -> bool {
        if let SparseTokens::Sorted { list, indices } = self {
            let mut table = IndexTable::with_room_for(*indices + 1);
            for &t in list.iter() {
                table.insert(t);
            }
            *self = SparseTokens::Table(table);
        }
        match self {
            SparseTokens::Table(table) => table.insert(token),
            SparseTokens::Sorted { .. } => unreachable!("turned into a table above"),
        }
    }

    /// Every occupied index with its register at the sparse precision
    /// (`4·u + 2·[u − 1 seen] + [u − 2 seen]`, as a dense register), in no particular order.
    pub(super) fn registers(&self) -> Box<dyn Iterator<Item = (u32, u8)> + '_> {
        match self {
            SparseTokens::Sorted { list, .. } => Box::new(
                list.chunk_by(|a, b| index_of(*a) == index_of(*b))
                    .map(|group| (index_of(group[0]), register_of_group(group))),
            ),
            SparseTokens::Table(table) => Box::new(table.entries()),
        }
    }

    /// Every token, in no particular order (tests; the code calls
    /// [`SparseTokens::for_each`]).
    #[cfg(test)]
    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = u32> + '_> {
        match self {
            SparseTokens::Sorted { list, .. } => Box::new(list.iter().copied()),
            SparseTokens::Table(table) => Box::new(
                table
                    .entries()
                    .flat_map(|(index, register)| tokens_of_register(index, register)),
            ),
        }
    }

    /// Calls `f` with every token, in no particular order.
    #[inline]
    pub(super) fn for_each(&self, mut f: impl FnMut(u32)) {
        match self {
            SparseTokens::Sorted { list, .. } => list.iter().for_each(|&t| f(t)),
            SparseTokens::Table(table) => {
                for (index, register) in table.entries() {
                    tokens_of_register(index, register).for_each(&mut f);
                }
            }
        }
    }
}

/// Every distinct token but those three or more ranks below the largest of their index.
impl SparseSet for SparseTokens {
    fn from_canonical(list: Vec<u32>) -> SparseTokens {
        let indices = count_indices(&list);
        SparseTokens::Sorted { list, indices }
    }

    fn canonical(&self) -> Cow<'_, [u32]> {
        match self {
            SparseTokens::Sorted { list, .. } => Cow::Borrowed(list),
            SparseTokens::Table(table) => Cow::Owned(table.canonical()),
        }
    }

    fn occupied(&self) -> usize {
        self.indices()
    }

    fn union(a: &[u32], b: &[u32]) -> Vec<u32> {
        union(a, b)
    }

    /// Bytes held, counting spare capacity.
    fn size_bytes(&self) -> usize {
        match self {
            SparseTokens::Sorted { list, .. } => list.capacity() * size_of::<u32>(),
            SparseTokens::Table(table) => table.slots.len() * size_of::<u64>(),
        }
    }
}

/// The register at the sparse precision of one index's group of tokens (sorted, pruned).
fn register_of_group(group: &[u32]) -> u8 {
    group
        .iter()
        .fold(0, |r, &t| registers::update(r, rank_of(t)))
}

/// The tokens a register at the sparse precision remembers, ascending: `u − 2`, `u − 1`
/// where seen, then `u`.
fn tokens_of_register(index: u32, register: u8) -> impl Iterator<Item = u32> {
    let u = u32::from(register >> 2);
    let token = move |rank: u32| index << RANK_BITS | rank;
    [
        (register & 1 != 0).then(|| token(u - 2)),
        (register & 2 != 0).then(|| token(u - 1)),
        Some(token(u)),
    ]
    .into_iter()
    .flatten()
}

/// Occupied indices and their registers at the sparse precision, by linear probing.
///
/// A slot is `index << 8 | register`, 0 when empty (an occupied index's register is never
/// 0). The home slot is the index's top bits: indices are bits of a hash, so they spread
/// evenly, and the slots hold them nearly in order (each at most its probe distance past
/// its home), so the canonical list is an insertion sort of a scan, not a full sort. At
/// most three quarters of the slots are occupied.
#[derive(Clone, Debug)]
pub(crate) struct IndexTable {
    slots: Box<[u64]>,
    len: usize,
    /// `index >> shift` is an index's home slot: 25 − log2(slots).
    shift: u32,
}

impl IndexTable {
    /// The fewest slots a table starts with: 64 bytes, for the many small sketches.
    const MIN_SLOTS: usize = 8;

    /// An empty table that holds `n` indices without growing.
    fn with_room_for(n: usize) -> IndexTable {
        Self::with_slots(Self::slots_for(n))
    }

    /// The slots a table holding `n` indices grows to: at most three quarters full.
    fn slots_for(n: usize) -> usize {
        (n * 4).div_ceil(3).next_power_of_two().max(Self::MIN_SLOTS)
    }

    /// An empty table of `slots` slots, a power of two at least [`IndexTable::MIN_SLOTS`].
    fn with_slots(slots: usize) -> IndexTable {
        IndexTable {
            slots: vec![0; slots].into_boxed_slice(),
            len: 0,
            shift: Self::shift_for(slots),
        }
    }

    /// The shift that makes an index's top bits a slot of a table of `slots` (a power of
    /// two, at most 2^25: a sparse sketch holds at most 2^16 indices).
    fn shift_for(slots: usize) -> u32 {
        u32::from(SPARSE_PRECISION) - slots.trailing_zeros()
    }

    /// Records `token`: sets its index's register. Returns whether the register changed.
    #[inline]
    fn insert(&mut self, token: u32) -> bool {
        let index = index_of(token);
        let mask = self.slots.len() - 1;
        let mut at = (index >> self.shift) as usize;
        loop {
            let slot = self.slots[at];
            if slot == 0 {
                break;
            }
            if (slot >> 8) as u32 == index {
                let register = slot as u8;
                let updated = registers::update(register, rank_of(token));
                if updated == register {
                    return false;
                }
                self.slots[at] = u64::from(index) << 8 | u64::from(updated);
                return true;
            }
            at = (at + 1) & mask;
        }
        self.slots[at] = u64::from(index) << 8 | u64::from(registers::update(0, rank_of(token)));
        self.len += 1;
        if self.len * 4 > self.slots.len() * 3 {
            self.grow();
        }
        true
    }

    /// Doubles the slots, placing every entry again.
    fn grow(&mut self) {
        self.resize(self.slots.len() * 2);
    }

    /// Places every entry again in `slots` slots, a power of two that holds them at most
    /// three quarters full.
    fn resize(&mut self, slots: usize) {
        debug_assert!(slots.is_power_of_two() && self.len * 4 <= slots * 3);
        let resized = vec![0; slots].into_boxed_slice();
        let old = std::mem::replace(&mut self.slots, resized);
        self.shift = Self::shift_for(self.slots.len());
        let mask = self.slots.len() - 1;
        for slot in old.iter().copied().filter(|&s| s != 0) {
            let mut at = (slot >> (8 + self.shift)) as usize;
            while self.slots[at] != 0 {
                at = (at + 1) & mask;
            }
            self.slots[at] = slot;
        }
    }

    /// Every occupied index and its register, in slot order.
    fn entries(&self) -> impl Iterator<Item = (u32, u8)> + '_ {
        self.slots
            .iter()
            .filter(|&&s| s != 0)
            .map(|&s| ((s >> 8) as u32, s as u8))
    }

    /// The canonical list of the tokens held.
    fn canonical(&self) -> Vec<u32> {
        let mut slots: Vec<u64> = self.slots.iter().copied().filter(|&s| s != 0).collect();
        // By index, the high bits: the order of the canonical list.
        sort_nearly_sorted(&mut slots);
        let mut list = Vec::with_capacity(slots.len() + slots.len() / 8);
        for s in slots {
            list.extend(tokens_of_register((s >> 8) as u32, s as u8));
        }
        list
    }
}

/// Sorts `values`, which are expected to be nearly sorted: an insertion sort, which gives
/// up for a full sort once it has moved more than a few values per value (a table whose
/// indices cluster, or a cluster wrapped from the last slot to the first).
fn sort_nearly_sorted(values: &mut [u64]) {
    let budget = 8 * values.len() + 64;
    let mut moves = 0;
    for i in 1..values.len() {
        let value = values[i];
        let mut j = i;
        while j > 0 && values[j - 1] > value {
            values[j] = values[j - 1];
            j -= 1;
        }
        values[j] = value;
        moves += i - j;
        if moves > budget {
            values.sort_unstable();
            return;
        }
    }
}

impl PartialEq for SparseTokens {
    fn eq(&self, other: &SparseTokens) -> bool {
        self.indices() == other.indices() && self.canonical() == other.canonical()
    }
}

impl Eq for SparseTokens {}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_sorted_list_inserted_into_becomes_the_same_table() {
        let tokens: Vec<u32> = (0..3000u64)
            .map(|i| {
                let h = i.wrapping_mul(0xd1b5_4a32_d192_ed03);
                token_of_hash(if i % 4 == 0 { h >> 22 } else { h })
            })
            .collect();
        let (first, rest) = tokens.split_at(1000);
        let mut all = SparseTokens::default();
        for &t in &tokens {
            all.insert(t);
        }
        let mut start = SparseTokens::default();
        for &t in first {
            start.insert(t);
        }
        // As decoded: the sorted layout, then a table again on the next insert.
        let mut resumed = SparseTokens::from_canonical(start.canonical().into_owned());
        assert!(matches!(resumed, SparseTokens::Sorted { .. }));
        for &t in rest {
            resumed.insert(t);
        }
        assert!(matches!(resumed, SparseTokens::Table(_)));
        assert_eq!(resumed, all);
        // The registers either layout reports agree, index for index.
        let mut from_table: Vec<(u32, u8)> = all.registers().collect();
        from_table.sort_unstable();
        let sorted = SparseTokens::from_canonical(all.canonical().into_owned());
        assert_eq!(sorted.registers().collect::<Vec<_>>(), from_table);
        let mut iterated: Vec<u32> = all.iter().collect();
        iterated.sort_unstable();
        assert_eq!(iterated, &*all.canonical());
    }

    #[test]
    fn nearly_sorted_values_sort_either_way() {
        let mut state = 1u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state >> 33
        };
        for n in [0, 1, 2, 10, 1000] {
            // Nearly sorted, and shuffled (past the budget: the full sort).
            let mut near: Vec<u64> = (0..n).map(|i| i * 10 + next() % 25).collect();
            let mut shuffled: Vec<u64> = (0..n).map(|_| next()).collect();
            for v in [&mut near, &mut shuffled] {
                let mut expected = v.clone();
                expected.sort_unstable();
                sort_nearly_sorted(v);
                assert_eq!(*v, expected);
            }
        }
    }
}
