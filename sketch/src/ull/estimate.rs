//! Cardinality from a histogram of register values: the maximum-likelihood estimator of
//! Ertl's UltraLogLog paper (VLDB 2024, section 3.1), derived here under the Poisson model.
//!
//! Let `λ = n/m` be the expected number of items per register. The update value `k` of an
//! item has probability `ρ_k = 2^−k` for `k ≤ q = 64 − p` and `ρ_{q+1} = 2^−q` (the
//! saturated value). Under the Poisson model each update value occurs in a register
//! independently, with probability `1 − e^(−λ·ρ_k)`, so a register with largest value `u`
//! and history bits for `u − 1` and `u − 2` has likelihood
//!
//! ```text
//! e^(−λ·Σ_{k>u} ρ_k) · (1 − e^(−λ·ρ_u)) · Π_{j=1,2} (1 − e^(−λ·ρ_{u−j}))  if u − j was seen
//!                                                   · e^(−λ·ρ_{u−j})     if not
//! ```
//!
//! (`Σ_{k>u} ρ_k = 2^−u` for `u ≤ q`, 0 for `u = q + 1`; an empty register has `e^−λ`).
//! Over all registers the log-likelihood is `−λ·α + Σ_e β_e·ln(1 − e^(−λ·2^−e))`, with `α`
//! collecting every `ρ` of a value known absent and `β_e` counting the values known present
//! with `ρ = 2^−e`. Setting its derivative to zero and multiplying by `λ` gives
//!
//! ```text
//! g(λ) = α·λ + Σ_e β_e·h(λ·2^−e) − Σ_e β_e = 0,   h(z) = 1 − z/(e^z − 1),
//! ```
//!
//! and `h` is increasing and concave with `h(0) = 0`, `h'(0) = 1/2`, `h(∞) = 1`. So `g` is
//! increasing and concave with `g(0) < 0`: its root is unique, it lies between
//! `B/(α + Σ β_e·2^−e/2)` (the tangent at 0) and `B/α`, and Newton's method started at the
//! lower bound climbs to it monotonically (a concave function lies below its tangents, so
//! no step overshoots). The estimate is `m·λ`.
//!
//! The asymptotic relative standard error is `√(ln 2 / ζ(2, 5/4))/√m ≈ 0.761/√m`, a
//! memory-variance product of `8·ln 2/ζ(2, 5/4) ≈ 4.63` bits, against HyperLogLog's
//! `6·1.04² ≈ 6.49`.

/// Relative standard error × √m of the estimate at large n: `√(ln 2 / ζ(2, 5/4))`.
pub(super) const RELATIVE_ERROR_SQRT_M: f64 = 0.760_862_100_272_682;

/// The memory-variance product of the dense sketch with this estimator, in bits:
/// `8 · RELATIVE_ERROR_SQRT_M²`.
pub const MEMORY_VARIANCE_PRODUCT: f64 = 4.631_289_085_050_854;

/// A stand-in for "more than the hash space can count": the estimate when every register
/// is saturated, where the likelihood keeps growing with n.
const SATURATED: f64 = 18_446_744_073_709_551_616.0;

/// The maximum-likelihood estimate for `m` registers at precision `p` (update values up
/// to `65 − p`), given `histogram[r]` = the number of registers holding `r`. Returns 0 when
/// every register is empty.
pub(super) fn maximum_likelihood(histogram: &[u32; 256], precision: u8, m: u64) -> f64 {
    let q = 64 - u32::from(precision);
    // α and β_e for e in 1..=q (β_0 stays 0).
    let mut alpha = 0.0f64;
    let mut beta = [0.0f64; 64];
    for (r, &count) in histogram.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let count = f64::from(count);
        let (u, history) = ((r >> 2) as u32, r & 3);
        if u == 0 {
            alpha += count;
            continue;
        }
        let exponent = |k: u32| k.min(q) as usize;
        if u <= q {
            alpha += count * pow2(-(u as i32));
        }
        beta[exponent(u)] += count;
        for (j, seen) in [(1, history & 2 != 0), (2, history & 1 != 0)] {
            if u > j {
                let k = u - j;
                if seen {
                    beta[exponent(k)] += count;
                } else {
                    alpha += count * pow2(-(k as i32));
                }
            }
        }
    }
    let total: f64 = beta.iter().sum();
    if total == 0.0 {
        return 0.0;
    }
    if alpha == 0.0 {
        return SATURATED;
    }
    let lambda = solve(alpha, &beta[..=q as usize], total);
    (m as f64 * lambda).min(SATURATED)
}

/// The root of `g` (module docs) by Newton's method from the tangent lower bound.
fn solve(alpha: f64, beta: &[f64], total: f64) -> f64 {
    let slope_at_zero: f64 = alpha
        + beta
            .iter()
            .enumerate()
            .map(|(e, &b)| b * pow2(-(e as i32)) * 0.5)
            .sum::<f64>();
    let mut x = total / slope_at_zero;
    for _ in 0..200 {
        let mut g = alpha * x - total;
        let mut slope = alpha;
        for (e, &b) in beta.iter().enumerate() {
            if b != 0.0 {
                let scale = pow2(-(e as i32));
                let (h, dh) = h_and_derivative(x * scale);
                g += b * h;
                slope += b * scale * dh;
            }
        }
        // g ≤ 0 at every iterate (module docs); a rounding error may make it a hair
        // positive at the root, which ends the climb just the same.
        let step = -g / slope;
        if step.is_nan() || step <= 0.0 {
            break;
        }
        x += step;
        if step <= x * 1e-12 {
            break;
        }
    }
    x
}

/// `2^e` for a small integer `e`, exactly.
#[inline]
fn pow2(e: i32) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

/// `h(z) = 1 − z/(e^z − 1)` and its derivative, accurate for every `z ≥ 0`.
fn h_and_derivative(z: f64) -> (f64, f64) {
    if z < 1e-3 {
        // Taylor series: h = z/2 − z²/12 + z⁴/720, h' = 1/2 − z/6 + z³/180.
        let z2 = z * z;
        (
            z * 0.5 - z2 / 12.0 + z2 * z2 / 720.0,
            0.5 - z / 6.0 + z2 * z / 180.0,
        )
    } else if z > 700.0 {
        // e^z overflows; h is 1 and h' is z·e^−z, zero in doubles.
        (1.0, 0.0)
    } else {
        let e = z.exp_m1();
        // h' = (e^z·(z − 1) + 1)/(e^z − 1)² = (e·z − e + z)/e² with e = e^z − 1.
        (1.0 - z / e, (e * z - e + z) / (e * e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_agree() {
        assert!(
            (8.0 * RELATIVE_ERROR_SQRT_M * RELATIVE_ERROR_SQRT_M - MEMORY_VARIANCE_PRODUCT).abs()
                < 1e-12
        );
        // ζ(2, 5/4) = Σ 1/(k + 5/4)², summed with the integral of the tail.
        let n = 200_000;
        let zeta: f64 =
            (0..n).map(|k| 1.0 / (k as f64 + 1.25).powi(2)).sum::<f64>() + 1.0 / (n as f64 + 0.75);
        let mvp = 8.0 * std::f64::consts::LN_2 / zeta;
        assert!((mvp - MEMORY_VARIANCE_PRODUCT).abs() < 1e-6, "{mvp}");
    }

    #[test]
    fn h_is_continuous_across_its_branches() {
        for z in [1e-3f64, 700.0] {
            let (below, dbelow) = h_and_derivative(z * (1.0 - 1e-12));
            let (above, dabove) = h_and_derivative(z * (1.0 + 1e-12));
            assert!((below - above).abs() < 1e-9, "h at {z}");
            assert!((dbelow - dabove).abs() < 1e-9, "h' at {z}");
        }
        assert_eq!(h_and_derivative(0.0), (0.0, 0.5));
    }

    #[test]
    fn empty_is_zero_and_full_is_saturated() {
        let mut histogram = [0u32; 256];
        histogram[0] = 1024;
        assert_eq!(maximum_likelihood(&histogram, 10, 1024), 0.0);
        let mut histogram = [0u32; 256];
        histogram[4 * 55 + 3] = 1024;
        assert_eq!(maximum_likelihood(&histogram, 10, 1024), SATURATED);
    }

    #[test]
    fn one_register_set_among_many_reads_as_one() {
        let mut histogram = [0u32; 256];
        histogram[0] = (1 << 25) - 1;
        histogram[4] = 1;
        let estimate = maximum_likelihood(&histogram, 25, 1 << 25);
        assert!((estimate - 1.0).abs() < 1e-4, "{estimate}");
        // Two items in two registers.
        histogram[0] -= 1;
        histogram[8] = 1;
        let estimate = maximum_likelihood(&histogram, 25, 1 << 25);
        assert!((estimate - 2.0).abs() < 1e-4, "{estimate}");
    }
}
