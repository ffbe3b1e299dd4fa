//! Dense registers as both sketches keep them in memory: `2^p` registers of one byte
//! each, register `h >> (64 − p)` set by hash `h` with the update value (HyperLogLog's
//! rank) `min(leading_zeros(h << p), 64 − p) + 1`, in `1..=65 − p`. What a register holds
//! beyond that value, and how two registers unite, is each sketch's own.

/// The register index and update value at `precision` that `hash` sets: the top
/// `precision` bits pick the register, and the value is one more than the number of
/// leading zeros in the remaining `64 − precision` bits (all zero counts as
/// `64 − precision`).
#[inline]
pub(crate) fn position(hash: u64, precision: u8) -> (usize, u32) {
    let p = u32::from(precision);
    let index = (hash >> (64 - p)) as usize;
    // A sentinel bit just below the value's bits caps the leading zeros at 64 − p without
    // a compare: the same value as `min(lz, 64 − p)`, one instruction shorter.
    let value = ((hash << p) | (1 << (p - 1))).leading_zeros() + 1;
    (index, value)
}

/// The update value that `bits` dropped index bits holding `low` (not zero) decide alone,
/// whatever follows them: the leading zeros of `low` within `bits` bits, plus one.
#[inline]
pub(crate) fn rank_of_low_bits(low: u32, bits: u32) -> u32 {
    bits - (u32::BITS - low.leading_zeros()) + 1
}

/// Empty registers for `precision`.
pub(crate) fn empty(precision: u8) -> Box<[u8]> {
    vec![0; 1 << precision].into_boxed_slice()
}

/// Folds registers of a higher precision into `dst`: `unite` when the precisions are
/// equal, else `fold(target, group, dropped)` for each register of `dst` with the group of
/// `src` registers that land in it.
///
/// `src.len()` must be `dst.len()` times `2^d` (both are powers of two): register `i` of
/// `src` lands in `i >> d`, `d = dropped` the number of dropped index bits, and the
/// register at offset `low` in its group saw hashes whose first `d` bits after the index
/// are `low` ([`rank_of_low_bits`] when `low` is not zero).
pub(crate) fn fold_into(
    dst: &mut [u8],
    src: &[u8],
    unite: impl FnOnce(&mut [u8], &[u8]),
    fold: impl Fn(u8, &[u8], u32) -> u8,
) {
    // A `src` shorter than `dst` never reaches here; `max(1)` keeps even that from
    // panicking in `chunks_exact`.
    let group = (src.len() / dst.len().max(1)).max(1);
    let dropped = group.trailing_zeros();
    if dropped == 0 {
        unite(dst, src);
        return;
    }
    for (target, registers) in dst.iter_mut().zip(src.chunks_exact(group)) {
        *target = fold(*target, registers, dropped);
    }
}

/// `histogram[r]` = the number of registers holding `r`.
///
/// Four sub-histograms break the dependency between consecutive increments of the same
/// counter, which is what limits a single-histogram loop; indexing a 256-entry table by a
/// `u8` needs no bounds check.
pub(crate) fn histogram(registers: &[u8]) -> [u32; 256] {
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
    let mut out = parts[0];
    for part in &parts[1..] {
        for (total, &n) in out.iter_mut().zip(part) {
            *total += n;
        }
    }
    out
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
    fn histogram_counts_every_register() {
        let registers: Vec<u8> = (0..1001u32).map(|i| (i % 7) as u8).collect();
        let h = histogram(&registers);
        assert_eq!(h.iter().sum::<u32>(), 1001);
        assert_eq!(h[0], 143);
        assert_eq!(h[6], 143);
    }
}
