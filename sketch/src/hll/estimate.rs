//! Cardinality from a histogram of register values: Otmar Ertl's improved raw estimator
//! ("New cardinality estimation methods for HyperLogLog sketches", 2017, algorithm 6).
//!
//! The classic HyperLogLog estimate is biased at both ends of its range and is usually
//! patched with linear counting below ~2.5·m and empirical bias tables in between. Ertl's
//! estimator replaces both patches with two closed-form corrections: σ accounts for empty
//! registers (the small range) and τ for saturated ones (the large range). It needs only
//! the histogram `C_k` of register values, is unbiased to well within the sketch's own
//! error at every cardinality, and has no tables to ship or keep in sync.

use std::f64::consts::LN_2;

/// α∞ = 1/(2 ln 2), the limit of the HyperLogLog bias constant as m → ∞. Ertl's
/// corrections make the m-dependent constants of the original paper unnecessary.
const ALPHA_INF: f64 = 1.0 / (2.0 * LN_2);

/// The estimate for `m` registers whose values range over `0..=q+1`, given
/// `histogram[k]` = the number of registers holding `k`.
///
/// A histogram shorter than `q + 2` reads as zeros beyond its end. Returns 0 when every
/// register is empty.
pub(super) fn ertl(histogram: &[u32], q: u32, m: u64) -> f64 {
    let m = m as f64;
    let count = |k: u32| histogram.get(k as usize).copied().map_or(0.0, f64::from);
    let mut z = m * tau(1.0 - count(q + 1) / m);
    for k in (1..=q).rev() {
        z = 0.5 * (z + count(k));
    }
    z += m * sigma(count(0) / m);
    if z.is_infinite() {
        // σ(1) = ∞: no register was ever set, so nothing was inserted.
        return 0.0;
    }
    ALPHA_INF * m * m / z
}

/// σ(x) = x + Σ_{k≥1} x^(2^k)·2^(k−1), summed until a term no longer changes the total.
///
/// For x < 1 the powers x^(2^k) fall doubly exponentially, so the loop ends after a few
/// dozen rounds even for x = 1 − 2⁻²⁵ (one item in a sparse sketch).
fn sigma(x: f64) -> f64 {
    if x >= 1.0 {
        return f64::INFINITY;
    }
    let mut power = x;
    let mut weight = 1.0;
    let mut sum = x;
    loop {
        power *= power;
        let previous = sum;
        sum += power * weight;
        weight += weight;
        if sum == previous {
            return sum;
        }
    }
}

/// τ(x) = (1/3)·(1 − x − Σ_{k≥1} (1 − x^(2^−k))²·2^−k), with τ(0) = τ(1) = 0.
fn tau(x: f64) -> f64 {
    if x <= 0.0 || x >= 1.0 {
        return 0.0;
    }
    let mut root = x;
    let mut weight = 1.0;
    let mut sum = 1.0 - x;
    loop {
        root = root.sqrt();
        let previous = sum;
        weight *= 0.5;
        let gap = 1.0 - root;
        sum -= gap * gap * weight;
        if sum == previous {
            return sum / 3.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigma_and_tau_at_their_ends() {
        assert_eq!(sigma(0.0), 0.0);
        assert!(sigma(1.0).is_infinite());
        assert_eq!(tau(0.0), 0.0);
        assert_eq!(tau(1.0), 0.0);
        // σ(x) ≥ x and τ(x) ≥ 0 in between; both finite.
        for i in 1..100 {
            let x = f64::from(i) / 100.0;
            assert!(sigma(x).is_finite() && sigma(x) >= x);
            assert!(tau(x).is_finite() && tau(x) >= 0.0);
        }
    }

    #[test]
    fn empty_histogram_estimates_zero() {
        assert_eq!(ertl(&[16], 60, 16), 0.0);
        assert_eq!(ertl(&[1 << 25], 39, 1 << 25), 0.0);
    }

    #[test]
    fn one_register_set_among_many_reads_as_one() {
        // 2^25 registers, one of them at rank 1: a single item.
        let mut histogram = [0u32; 41];
        histogram[0] = (1 << 25) - 1;
        histogram[1] = 1;
        assert!((ertl(&histogram, 39, 1 << 25) - 1.0).abs() < 1e-4);
    }
}
