//! The dense representation: 2^p registers, one byte each in memory, six bits each in the
//! encoding.
//!
//! A byte per register wastes a quarter of the memory but keeps insert to one load and one
//! store and lets merge compile to a vector `max` over the two slices; the six-bit packing
//! is paid only when a sketch is encoded or decoded.

use crate::common::registers::{self, rank_of_low_bits};
pub(super) use registers::{empty, histogram};

/// The register (index and value) at `precision` that `hash` sets
/// ([`registers::position`]): values run `1..=65 − precision` and fit in six bits.
#[inline]
pub(super) fn position(hash: u64, precision: u8) -> (usize, u8) {
    let (index, rank) = registers::position(hash, precision);
    (index, rank as u8)
}

/// `dst[i] = max(dst[i], src[i])`: the union of two sketches of the same precision.
///
/// Plain zipped slices, so the loop has no bounds checks and vectorizes.
pub(super) fn max_into(dst: &mut [u8], src: &[u8]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = (*d).max(s);
    }
}

/// Folds registers of a higher precision into `dst` (taking maxima), exactly: `dst` ends
/// up as if every item behind `src` had been inserted at `dst`'s precision.
///
/// At the lower precision the `d` dropped index bits `low` come first in the rank's bit
/// string ([`registers::fold_into`]): if any is set, they alone decide the rank, whatever
/// the register held; if all are zero, the rank is `d` plus the register's own value.
pub(super) fn fold_into(dst: &mut [u8], src: &[u8]) {
    registers::fold_into(dst, src, max_into, |target, group, dropped| {
        let Some((&first, rest)) = group.split_first() else {
            return target;
        };
        let mut best = target;
        if first != 0 {
            best = best.max(dropped as u8 + first);
        }
        // The smallest non-zero `low` has the most leading zeros, hence the largest rank.
        if let Some(offset) = rest.iter().position(|&r| r != 0) {
            best = best.max(rank_of_low_bits(offset as u32 + 1, dropped) as u8);
        }
        best
    })
}

/// Appends the registers packed six bits each, register `i` in bits `6i..6i+6` of the
/// byte stream, least significant bit first: every four registers make three bytes.
pub(super) fn pack(registers: &[u8], out: &mut Vec<u8>) {
    out.reserve(registers.len() / 4 * 3);
    // Eight registers (48 bits, six bytes) per step; every register count is a power of
    // two of at least 16, so there is no remainder.
    for eight in registers.chunks_exact(8) {
        let mut bits = 0u64;
        for (i, &r) in eight.iter().enumerate() {
            bits |= u64::from(r & 0x3f) << (6 * i);
        }
        out.extend_from_slice(&bits.to_le_bytes()[..6]);
    }
    for quad in registers.chunks_exact(8).remainder().chunks_exact(4) {
        let bits = quad
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &r)| acc | u32::from(r & 0x3f) << (6 * i));
        out.extend_from_slice(&bits.to_le_bytes()[..3]);
    }
}

/// Whether any of the registers packed in `bytes` is above `limit`: the check of
/// [`unpack`] without writing the registers anywhere.
pub(super) fn exceeds(bytes: &[u8], limit: u8) -> bool {
    let add = limit_addend(limit);
    let mut over = 0u64;
    let whole = bytes.len() / 6;
    for k in 0..whole {
        over |= above_limit(eight_registers(bytes, 6 * k), add);
    }
    // A tail of three bytes holds four registers (never at precision 4 or more).
    let tail = &bytes[whole * 6..];
    let mut rest = [0u8; 8];
    let n = (tail.len() / 3 * 4).min(rest.len());
    unpack(tail, &mut rest[..n], limit) || over != 0
}

/// Registers `8k..8k + 8` from the six bytes at `at`, one per byte of the word: each
/// 24-bit half spreads its four six-bit fields to four bytes with four shifts and masks.
#[inline]
fn eight_registers(bytes: &[u8], at: usize) -> u64 {
    // An eight-byte load where two more bytes exist (all but the last group), masked to
    // the six that belong to this group.
    let bits = match bytes.get(at..at + 8) {
        Some(b) => u64::from_le_bytes(b.try_into().expect("eight bytes")) & 0xffff_ffff_ffff,
        None => {
            let mut word = [0u8; 8];
            word[..6].copy_from_slice(&bytes[at..at + 6]);
            u64::from_le_bytes(word)
        }
    };
    let spread = |x: u64| {
        (x & 0x3f) | ((x << 2) & 0x3f00) | ((x << 4) & 0x3f_0000) | ((x << 6) & 0x3f00_0000)
    };
    spread(bits & 0xff_ffff) | (spread(bits >> 24) << 32)
}

/// What [`above_limit`] adds to every byte for `limit` (at most 127).
#[inline]
fn limit_addend(limit: u8) -> u64 {
    debug_assert!(limit < 128);
    u64::from_ne_bytes([127 - limit; 8])
}

/// The top bit of each byte of `word` (registers, each at most 63) that is above the
/// limit: adding 127 − limit sets a byte's top bit exactly when it exceeds the limit, with
/// no carry into the next byte, so one add and one and check eight registers.
#[inline]
fn above_limit(word: u64, addend: u64) -> u64 {
    word.wrapping_add(addend) & 0x8080_8080_8080_8080
}

/// The inverse of [`pack`]: fills `registers` from `bytes` (three bytes per four
/// registers; extra bytes or registers on either side are left alone). Returns whether
/// any register written is above `limit` (at most 127), so a decoder validates without a
/// second pass.
pub(super) fn unpack(bytes: &[u8], registers: &mut [u8], limit: u8) -> bool {
    // Eight registers from each six bytes, all in one 64-bit word (`eight_registers`),
    // stored at once and checked against the limit together (`above_limit`).
    let add = limit_addend(limit);
    let mut over = 0u64;
    let whole = (registers.len() / 8).min(bytes.len() / 6);
    for (k, eight) in registers[..whole * 8].chunks_exact_mut(8).enumerate() {
        let word = eight_registers(bytes, 6 * k);
        over |= above_limit(word, add);
        eight.copy_from_slice(&word.to_le_bytes());
    }
    let mut above = over != 0;
    let (registers, bytes) = (&mut registers[whole * 8..], &bytes[whole * 6..]);
    for (quad, triple) in registers.chunks_exact_mut(4).zip(bytes.chunks_exact(3)) {
        let mut word = [0u8; 4];
        word[..3].copy_from_slice(triple);
        let bits = u32::from_le_bytes(word);
        for (i, r) in quad.iter_mut().enumerate() {
            let value = (bits >> (6 * i) & 0x3f) as u8;
            above |= value > limit;
            *r = value;
        }
    }
    above
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips_and_is_lsb_first() {
        let registers: Vec<u8> = (0..64u8).map(|i| i % 62).collect();
        let mut bytes = Vec::new();
        pack(&registers, &mut bytes);
        assert_eq!(bytes.len(), 48);
        let mut back = vec![0u8; 64];
        assert!(!unpack(&bytes, &mut back, 61));
        assert_eq!(back, registers);
        assert!(unpack(&bytes, &mut back, 60), "61 is above 60");
        // Every value at every position, including the scalar tail (4 registers).
        for len in [4usize, 12, 16, 64] {
            for v in 0..64u8 {
                for at in 0..len {
                    let mut regs = vec![0u8; len];
                    regs[at] = v;
                    let mut packed = Vec::new();
                    pack(&regs, &mut packed);
                    let mut out = vec![0u8; len];
                    for limit in [0u8, 1, 30, 61, 63] {
                        assert_eq!(
                            unpack(&packed, &mut out, limit),
                            v > limit,
                            "len {len} at {at} v {v} limit {limit}"
                        );
                        assert_eq!(out, regs);
                        assert_eq!(
                            exceeds(&packed, limit),
                            v > limit,
                            "exceeds: len {len} at {at}"
                        );
                    }
                }
            }
        }
        let mut bytes = Vec::new();
        pack(&[1, 2, 3, 61], &mut bytes);
        // 1 | 2<<6 | 3<<12 | 61<<18
        assert_eq!(bytes, [0x81, 0x30, 0xf4]);
    }
}
