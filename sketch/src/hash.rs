//! Item hashing shared by every sketch kind.
//!
//! Every sketch hashes an item's bytes once with xxh3-64 under [`ITEM_SEED`]. The seed is
//! part of the binary format (docs/FORMAT.md): two sketches of the same items built by
//! different processes, machines or versions must agree bit for bit, so it never changes
//! within a format version.
//!
//! Sketches that need several positions per item (Count-Min rows, Bloom bits) derive them
//! by double hashing, `h1 + i·h2` (Kirsch and Mitzenmacher, "Less hashing, same
//! performance", 2006): `h1` is the item hash and `h2` a second, odd 64-bit value mixed out
//! of it, so one pass over the item's bytes serves any number of positions.
//!
//! Each `h1 + i·h2` passes through a bijective mixer before it is reduced to a position.
//! Plain double hashing lays an item's positions on an arithmetic progression; when the
//! stride `h2` falls near a fraction `p/q` of the range with small `q`, the positions
//! repeat with period `q` and the item needs only `q` set bits to look present. Measured
//! on a 143,808-bit, k = 10 Bloom filter at half its capacity, that made the true
//! false-positive rate 17% higher than `fill^k` (5.6e-6 against 4.8e-6, ±3%); with the
//! mixer the positions of one item are unrelated and `fill^k` is the rate (docs/ACCURACY.md).

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the item hash, fixed by format version 1: the ASCII bytes `hourglas`.
pub const ITEM_SEED: u64 = 0x686f_7572_676c_6173;

/// The 64-bit hash of an item, as every sketch sees it.
#[inline]
pub fn item_hash(item: &[u8]) -> u64 {
    xxh3_64_with_seed(item, ITEM_SEED)
}

/// The two hashes of double hashing for one item hash: `(h1, h2)` with `h2` odd.
///
/// `h2` is the murmur3 64-bit finaliser of `h1` (offset by a constant), forced odd so that `h1 + i·h2` visits
/// distinct values for distinct `i` modulo any power of two.
#[inline]
pub fn double_hash(h1: u64) -> (u64, u64) {
    (h1, fmix64(h1 ^ 0x9e37_79b9_7f4a_7c15) | 1)
}

/// The `i`-th position of double hashing, reduced to `0..n` without division.
///
/// `h1 + i·h2` is mixed (see the module docs for why), then reduced with Lemire's
/// multiply-shift ("A fast alternative to the modulo reduction", 2016): the high 64 bits
/// of `x · n`, uniform in `0..n` when `x` is uniform.
#[inline]
pub fn nth_position(h1: u64, h2: u64, i: u64, n: u64) -> u64 {
    let x = fmix64(h1.wrapping_add(i.wrapping_mul(h2)));
    ((x as u128 * n as u128) >> 64) as u64
}

/// The murmur3 64-bit finaliser: a bijection that spreads every input bit over the output.
#[inline]
fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the seed and the algorithm: if this changes, every stored sketch is wrong.
    #[test]
    fn item_hash_is_pinned() {
        assert_eq!(
            item_hash(b""),
            xxh3_64_with_seed(b"", 0x686f_7572_676c_6173)
        );
        assert_eq!(item_hash(b"user42"), 0x0728_7c27_6d91_ecd2);
    }

    #[test]
    fn second_hash_is_odd_and_differs() {
        for i in 0..1000u64 {
            let (h1, h2) = double_hash(item_hash(&i.to_le_bytes()));
            assert_eq!(h2 & 1, 1);
            assert_ne!(h1, h2);
        }
    }

    #[test]
    fn positions_stay_in_range() {
        for n in [1u64, 2, 7, 64, 1000, u64::MAX] {
            for i in 0..16 {
                assert!(nth_position(u64::MAX, u64::MAX, i, n) < n);
            }
        }
    }
}
