//! The sparse tokens both sketches keep while small: a `u32` `index << 6 | rank` per hash,
//! `index` the top 25 bits of the hash and `rank` the register value it sets in a virtual
//! sketch of precision [`SPARSE_PRECISION`] (2^25 registers), `1..=40`. HyperLogLog calls
//! them entries and keeps the largest rank of each index; UltraLogLog keeps the top three.
//! Tokens sort by index first, then by rank.

use super::registers::rank_of_low_bits;

/// The precision of the virtual sketch behind sparse tokens; part of the format.
pub(crate) const SPARSE_PRECISION: u8 = 25;
/// Bits of a token that hold the rank.
pub(crate) const RANK_BITS: u32 = 6;
/// The largest rank at the sparse precision: 64 − 25 + 1.
pub(crate) const MAX_SPARSE_RANK: u32 = 65 - SPARSE_PRECISION as u32;
/// One more than the largest sparse index.
pub(crate) const SPARSE_REGISTERS: u64 = 1 << SPARSE_PRECISION;

/// The token of a hash: top 25 bits as the index, leading zeros of the rest + 1 as the
/// rank (capped so that an all-zero remainder gets the largest rank, 40).
#[inline]
pub(crate) fn token_of_hash(hash: u64) -> u32 {
    let sp = u32::from(SPARSE_PRECISION);
    let index = (hash >> (64 - sp)) as u32;
    let rank = (hash << sp).leading_zeros().min(64 - sp) + 1;
    index << RANK_BITS | rank
}

/// The index at the sparse precision.
#[inline]
pub(crate) fn index_of(token: u32) -> u32 {
    token >> RANK_BITS
}

/// The rank, `1..=40` in a valid token.
#[inline]
pub(crate) fn rank_of(token: u32) -> u32 {
    token & ((1 << RANK_BITS) - 1)
}

/// The dense register (index and rank, the update value) at `precision` that the hash
/// behind `token` sets.
///
/// The dense index is the top `precision` bits of the sparse index. The dense rank counts
/// the leading zeros of the hash after its top `precision` bits; the first `25 − precision`
/// of those bits are the low bits of the sparse index, so if they are not all zero they
/// alone decide the rank, and if they are, the rank continues into the sparse rank. This
/// is exactly what a direct dense insert of the same hash computes (tested in each sketch).
#[inline]
pub(crate) fn dense_position(token: u32, precision: u8) -> (usize, u32) {
    let dropped = u32::from(SPARSE_PRECISION - precision);
    let index = index_of(token);
    let low = index & ((1 << dropped) - 1);
    let rank = if low != 0 {
        rank_of_low_bits(low, dropped)
    } else {
        dropped + rank_of(token)
    };
    ((index >> dropped) as usize, rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HyperLogLog's entries and UltraLogLog's tokens are this one layout.
    #[test]
    fn token_layout() {
        assert_eq!(token_of_hash(0), 40);
        assert_eq!(token_of_hash(u64::MAX), ((1 << 25) - 1) << 6 | 1);
        assert_eq!(token_of_hash(1 << 39), 1 << 6 | 40);
        assert_eq!(token_of_hash(1 << 38), 1);
    }
}
