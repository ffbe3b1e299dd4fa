//! The dense representation: 2^p registers, one byte each in memory, six bits each in the
//! encoding.
//!
//! A byte per register wastes a quarter of the memory but keeps insert to one load and one
//! store and lets merge compile to a vector `max` over the two slices; the six-bit packing
//! is paid only when a sketch is encoded or decoded.

/// The register (index and value) at `precision` that `hash` sets: the top `precision`
/// bits pick the register, and the value is one more than the number of leading zeros in
/// the remaining `64 − precision` bits (all zero counts as `64 − precision`), so values
/// run `1..=65 − precision` and fit in six bits.
#[inline]
pub(super) fn position(hash: u64, precision: u8) -> (usize, u8) {
    let p = u32::from(precision);
    let index = (hash >> (64 - p)) as usize;
    // A sentinel bit just below the rank's bits caps the leading zeros at 64 − p without
    // a compare: the same value as `min(lz, 64 − p)`, one instruction shorter.
    let rank = ((hash << p) | (1 << (p - 1))).leading_zeros() + 1;
    (index, rank as u8)
}

/// Empty registers for `precision`.
pub(super) fn empty(precision: u8) -> Box<[u8]> {
    vec![0; 1 << precision].into_boxed_slice()
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
/// `src.len()` must be `dst.len()` times a power of two (both are powers of two). Register
/// `i` of `src` lands in `i >> d`, where `d` is the number of dropped index bits. At the
/// lower precision those `d` bits `low` come first in the rank's bit string: if any is set,
/// they alone decide the rank (`leading zeros of low within d bits + 1`, whatever the
/// register held); if all are zero, the rank is `d` plus the register's own value.
pub(super) fn fold_into(dst: &mut [u8], src: &[u8]) {
    // A `src` shorter than `dst` never reaches here; `max(1)` keeps even that from
    // panicking in `chunks_exact`.
    let group = (src.len() / dst.len().max(1)).max(1);
    let dropped = group.trailing_zeros();
    if dropped == 0 {
        max_into(dst, src);
        return;
    }
    for (target, registers) in dst.iter_mut().zip(src.chunks_exact(group)) {
        let Some((&first, rest)) = registers.split_first() else {
            continue;
        };
        let mut best = *target;
        if first != 0 {
            best = best.max(dropped as u8 + first);
        }
        // The smallest non-zero `low` has the most leading zeros, hence the largest rank.
        if let Some(offset) = rest.iter().position(|&r| r != 0) {
            let low = offset + 1;
            let bit_length = usize::BITS - low.leading_zeros();
            best = best.max((dropped - bit_length + 1) as u8);
        }
        *target = best;
    }
}

/// `histogram[k]` = the number of registers holding `k`.
///
/// Four sub-histograms break the dependency between consecutive increments of the same
/// counter, which is what limits a single-histogram loop; indexing a 256-entry table by a
/// `u8` needs no bounds check.
pub(super) fn histogram(registers: &[u8]) -> [u32; 64] {
    let mut parts = [[0u32; 256]; 4];
    let mut quads = registers.chunks_exact(4);
    for quad in &mut quads {
        for (part, &r) in parts.iter_mut().zip(quad) {
            part[usize::from(r)] += 1;
        }
    }
    for &r in quads.remainder() {
        parts[0][usize::from(r)] += 1;
    }
    let mut out = [0u32; 64];
    for part in &parts {
        for (total, &n) in out.iter_mut().zip(part) {
            *total += n;
        }
    }
    out
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
    fn position_extremes() {
        assert_eq!(position(0, 4), (0, 61));
        assert_eq!(position(u64::MAX, 4), (15, 1));
        assert_eq!(position(1, 18), (0, 46));
        assert_eq!(position(0, 18), (0, 47));
    }

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

    #[test]
    fn histogram_counts_every_register() {
        let registers: Vec<u8> = (0..1001u32).map(|i| (i % 7) as u8).collect();
        let h = histogram(&registers);
        assert_eq!(h.iter().sum::<u32>(), 1001);
        assert_eq!(h[0], 143);
        assert_eq!(h[6], 143);
    }
}
