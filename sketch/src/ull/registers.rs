//! The dense representation: 2^p registers of one byte each, in memory and encoded.
//!
//! A hash sets register `h >> (64 − p)` with the update value
//! `k = min(leading_zeros(h << p), 64 − p) + 1`, exactly the rank a HyperLogLog register
//! of the same precision takes, so `k` runs `1..=65 − p`. A register remembers the set of
//! update values it has seen only through its three largest possible members:
//!
//! ```text
//! r = 0                                  nothing seen
//! r = 4·u + 2·[u − 1 seen] + [u − 2 seen]  u = the largest value seen
//! ```
//!
//! so `r >> 2` is the HyperLogLog register and the two low bits are the history that makes
//! UltraLogLog more informative per bit. A register's value is never `1..=3`, `5..=7`
//! (there is no update value 0 or −1 to remember) or `9`, `11`, and `r >> 2 ≤ 65 − p`.
//!
//! Every operation is defined through the *bitmap* of a register, the `u64` with bit `k`
//! set for each remembered update value: an insert ORs in bit `k`, a merge ORs two
//! bitmaps, and the register is the bitmap's top set bit and the two bits below it. Bits
//! further down can never come back into the window, so dropping them loses nothing. The
//! hot paths compute the same thing faster: an insert is one lookup in a 16 KiB table of
//! every (register, value) pair built at compile time, and a merge is branch-free byte
//! arithmetic that vectorizes; both are tested against the bitmap rule exhaustively.

use crate::common::registers::{self, rank_of_low_bits};
pub(super) use registers::{histogram, position};

/// The bitmap of remembered update values of register `r`.
#[inline]
pub(super) fn to_bitmap(r: u8) -> u64 {
    if r == 0 {
        0
    } else {
        // Bits u, u − 1, u − 2 from `1ab` shifted so that its top bit lands on u; for
        // u = 1 the shift drops the (always clear) history bits.
        (u64::from(4 | (r & 3)) << (r >> 2)) >> 2
    }
}

/// The register of a bitmap: its top set bit `u` and the two bits below it. Update values
/// are at least 1, so bit 0 is never set and `u = 1` reads no history.
#[inline]
pub(super) fn from_bitmap(bitmap: u64) -> u8 {
    if bitmap == 0 {
        return 0;
    }
    let u = 63 - bitmap.leading_zeros();
    // u ≤ 61 for every precision from 4, so the shift by two cannot overflow.
    ((u << 2) as u8) | (((bitmap << 2) >> u) & 3) as u8
}

/// Register `r` after seeing update value `value` (1..=61): one load from [`UPDATES`].
#[inline]
pub(super) fn update(r: u8, value: u32) -> u8 {
    UPDATES[usize::from(r) << 6 | (value as usize & 63)]
}

/// Every register update, `UPDATES[r << 6 | value]`, computed at compile time: 16 KiB,
/// which replaces the ~14 shifts, masks and compares of [`update_by_bits`] on the insert
/// path with one load that stays in cache.
static UPDATES: [u8; 256 * 64] = {
    let mut table = [0u8; 256 * 64];
    let mut i = 0;
    while i < table.len() {
        table[i] = update_by_bits((i >> 6) as u8, (i & 63) as u32);
        i += 1;
    }
    table
};

/// The update by the bitmap rule, without its bit scan: the new largest value is
/// `t = max(u, value)`, and the window is read off a bitmap shifted up by two (value `v` at
/// bit `v + 2`, so that `u − 2` needs no negative shift). The empty register's window `100`
/// lands on bit 2, value 0, which no update value sets, so clearing bit 2 makes it empty.
const fn update_by_bits(r: u8, value: u32) -> u8 {
    let u = (r >> 2) as u32;
    if value == 0 || value > 61 || u > 61 {
        // Not an update value, or not a register: never looked up.
        return r;
    }
    let shifted = (((4 | (r & 3)) as u64) << u) & !4 | 4 << value;
    let top = if u > value { u } else { value };
    ((top << 2) as u8) | ((shifted >> top) & 3) as u8
}

/// The union of two registers.
#[inline]
pub(super) fn merge(a: u8, b: u8) -> u8 {
    // Branch-free byte arithmetic (min, max, subtract, compare, and, or, shift by a
    // constant) so that the loop over two register slices vectorizes: the larger register
    // keeps its value and the smaller one contributes the bits of its window that fall
    // into the larger one's, which depend only on the gap between their largest values.
    let (hi, lo) = (a.max(b), a.min(b));
    let gap = (hi >> 2).wrapping_sub(lo >> 2);
    let mask = |condition: bool| 0u8.wrapping_sub(u8::from(condition));
    let extra = (mask(gap == 0) & (lo & 3))
        | (mask(gap == 1) & (2 | ((lo >> 1) & 1)))
        | (mask(gap == 2) & 1);
    hi | (extra & mask(lo != 0))
}

/// `dst[i] = merge(dst[i], src[i])`: the union of two sketches of the same precision.
pub(super) fn merge_into(dst: &mut [u8], src: &[u8]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = merge(*d, s);
    }
}

/// Folds registers of a higher precision into `dst`, exactly: `dst` ends up as if every
/// item behind `src` had been inserted at `dst`'s precision.
///
/// If the `d` dropped bits `low` of a register's index ([`registers::fold_into`]) are not
/// all zero, they alone decide the update value of every hash behind the register,
/// whatever the register held; if they are all zero, each update value grows by `d`,
/// which shifts the register's whole bitmap.
pub(super) fn fold_into(dst: &mut [u8], src: &[u8]) {
    registers::fold_into(dst, src, merge_into, |target, group, dropped| {
        let Some((&first, rest)) = group.split_first() else {
            return target;
        };
        let mut bitmap = to_bitmap(target) | to_bitmap(first) << dropped;
        for (offset, &r) in rest.iter().enumerate() {
            if r != 0 {
                bitmap |= 1 << rank_of_low_bits(offset as u32 + 1, dropped);
            }
        }
        from_bitmap(bitmap)
    })
}

/// Whether `r` is a register value some set of hashes produces at `precision`.
pub(super) fn is_valid(r: u8, precision: u8) -> bool {
    let u = r >> 2;
    match u {
        0 => r == 0,
        1 => r & 3 == 0,
        2 => r & 1 == 0,
        _ => u <= 65 - precision,
    }
}

/// The first register of `registers` that no set of hashes produces at `precision`.
pub(super) fn first_invalid(registers: &[u8], precision: u8) -> Option<(usize, u8)> {
    // The values [`is_valid`] refuses, as comparisons the compiler vectorises: 1..=3,
    // 5..=7, 9, 11 (no set of update values makes them) and above the largest update
    // value's register. A branch-free OR over chunks, then a second pass only on failure
    // to name the register. (A table lookup per register took as long as the merge.)
    let largest = 4 * (65 - precision) + 3;
    let bad = |r: u8| {
        u8::from(r.wrapping_sub(1) < 3)
            | u8::from(r.wrapping_sub(5) < 3)
            | u8::from(r == 9)
            | u8::from(r == 11)
            | u8::from(r > largest)
    };
    let any = registers
        .chunks(256)
        .any(|chunk| chunk.iter().fold(0u8, |acc, &r| acc | bad(r)) != 0);
    if !any {
        return None;
    }
    registers
        .iter()
        .enumerate()
        .find(|(_, r)| !is_valid(**r, precision))
        .map(|(i, &r)| (i, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The register of a set of update values, straight from the definition.
    fn register_of(values: &[u32]) -> u8 {
        let Some(&u) = values.iter().max() else {
            return 0;
        };
        let seen = |v: u32| u8::from(v >= 1 && values.contains(&v));
        (u as u8) << 2 | seen(u.wrapping_sub(1)) << 1 | seen(u.wrapping_sub(2))
    }

    #[test]
    fn update_follows_the_definition() {
        // Every pair and triple of update values in 1..=12, in every order.
        for a in 1..=12u32 {
            for b in 1..=12u32 {
                for c in 1..=12u32 {
                    let r = update(update(update(0, a), b), c);
                    assert_eq!(r, register_of(&[a, b, c]), "{a} {b} {c}");
                    assert!(is_valid(r, 4));
                }
                assert_eq!(update(update(0, a), b), register_of(&[a, b]));
            }
        }
        assert_eq!(update(0, 61), 244);
        assert_eq!(update(update(update(0, 61), 60), 59), 247);
    }

    #[test]
    fn update_table_equals_the_bitmap_rule() {
        for r in (0..=255u8).filter(|&r| is_valid(r, 4)) {
            for value in 1..=61 {
                assert_eq!(
                    update(r, value),
                    from_bitmap(to_bitmap(r) | 1 << value),
                    "{r} {value}"
                );
            }
        }
    }

    #[test]
    fn merge_equals_bitmap_union() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                if is_valid(a, 4) && is_valid(b, 4) {
                    assert_eq!(
                        merge(a, b),
                        from_bitmap(to_bitmap(a) | to_bitmap(b)),
                        "{a} {b}"
                    );
                    assert_eq!(merge(a, b), merge(b, a));
                }
            }
        }
    }

    #[test]
    fn bitmap_round_trips_every_valid_register() {
        for r in 0..=255u8 {
            if is_valid(r, 4) {
                assert_eq!(from_bitmap(to_bitmap(r)), r);
            }
        }
        let valid = (0..=255u8).filter(|&r| is_valid(r, 4)).count();
        // 0, u = 1, u = 2 with one history bit, u = 3..=61 with two.
        assert_eq!(valid, 1 + 1 + 2 + 59 * 4);
        assert!(!is_valid(248, 4), "u = 62 is above 65 − 4");
        assert!(!is_valid(4 * 48, 18) && is_valid(4 * 47 + 3, 18));
    }

    #[test]
    fn the_fast_check_refuses_exactly_what_is_valid_refuses() {
        for precision in super::super::MIN_PRECISION..=super::super::MAX_PRECISION {
            for r in 0..=255u8 {
                let found = first_invalid(&[0, 4, r, 8], precision);
                let want = (!is_valid(r, precision)).then_some((2, r));
                assert_eq!(found, want, "register {r} at precision {precision}");
            }
        }
    }
}
