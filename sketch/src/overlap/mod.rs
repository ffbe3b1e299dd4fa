//! Overlap of two distinct-count sketches: how many items are in both, in one only, in
//! either, from two HyperLogLog sketches alone.
//!
//! # Estimator
//!
//! [`estimate_pair`] is Otmar Ertl's joint maximum-likelihood estimator ("New cardinality
//! estimation methods for HyperLogLog sketches", 2017, arXiv 1702.01284, the section on
//! joint estimation). It reads the two sketches register by register: each pair of
//! values `(a, b)` is `a < b`, `a > b` or `a = b`, and each case has a closed-form
//! probability under a Poisson model with three unknown rates, one per region of the
//! Venn diagram: `|A \ B|`, `|B \ A|` and `|A ∩ B|`. The three are estimated together by
//! maximising the likelihood (the model, the formulas and the solver are in the private
//! `likelihood` module). Union, intersection, both differences, the Jaccard index
//! `|A ∩ B| / |A ∪ B|` and the retained share `|A ∩ B| / |A|` follow from the same fit, so they are consistent with each other:
//! the parts add up to the union, and none is negative.
//!
//! The usual alternative, inclusion–exclusion `|A| + |B| − |A ∪ B|` from three single
//! estimates ([`inclusion_exclusion`], kept for comparison), subtracts two numbers each
//! carrying an error of about `1.04/√m` of the whole: when the intersection is a small
//! part of the union its error swamps it, and it can come out negative. The joint
//! estimate uses the registers where the two sketches agree and disagree, and its error
//! on small intersections is several times smaller (measured in docs/ACCURACY.md).
//!
//! # Error bars
//!
//! Standard errors come from the observed Fisher information: the inverse of minus the
//! Hessian of the log-likelihood at the maximum is the asymptotic covariance of the three
//! rates, and each reported quantity's variance follows from it (exactly for sums, by the
//! delta method for the Jaccard index and the retained share, with the covariances
//! between the rates). The 95% intervals are normal, clamped at zero (the two shares
//! also at one), except for the lower ends when the verdict is [`Verdict::Estimable`]
//! (next section). Their coverage is measured, not assumed (docs/ACCURACY.md).
//!
//! That covariance is the spread of the estimate under the model's own randomness, in
//! which the three counts are Poisson variables of means `m·λ`. A query asks about fixed
//! sets, whose counts do not vary: by the law of total variance the spread around the
//! actual counts is smaller by the Poisson variance `m·λ` of each count, which is
//! subtracted from the diagonal (per register: `λ/m`). The correction matters where the
//! sets are small against the registers (while sparse, the uncorrected error of `n`
//! items would be `√n` although the count is practically exact; at `n ≈ m` it would
//! double the error); above `n ≈ 10·m` it changes the error by under 10%.
//!
//! # When the intersection cannot be estimated
//!
//! A sketch pair carries little information about an intersection far smaller than the
//! union. When the intersection's normal 95% interval reaches zero — equivalently, its
//! relative standard error is at least `1/1.96 ≈ 51%` ([`TOO_SMALL_RELATIVE_ERROR`]) —
//! the [`Overlap::verdict`] is [`Verdict::TooSmall`]: the sketches cannot tell the
//! intersection from zero, and the interval `[0, upper95]`, not the point, is the answer
//! to report (the lower ends of the Jaccard index and the retained share are 0 too).
//!
//! The verdict picks trials by their estimate, so the plain interval is not valid for
//! the trials it declares [`Verdict::Estimable`]: when the true intersection is close to
//! zero, those are exactly the trials whose estimate came out high, and `estimate ±
//! 1.96·σ` misses the truth in most of them (measured: 17%–73% coverage at an
//! intersection of 0.05% of the union). The lower ends of the intersection, Jaccard and
//! retained intervals of an estimable overlap are therefore *selective*: with `t` the
//! estimate in standard errors, the lower end `μ₀` solves `P(T ≥ t | T > 1.96) = 2.5%`
//! for `T ~ N(μ₀, 1)` — the lower end of a 95% interval for a normal mean observed only
//! when it exceeds the verdict's threshold — and the Jaccard and retained lower ends move
//! down by the same number `t − μ₀` of their own standard errors. Far from the
//! threshold this is the plain interval (`t − μ₀ → 1.96`; at `t = 5` it is `2.03`);
//! just past it (`t ≤ 3.23`) the lower end is 0: an estimable answer with a lower end of
//! 0 says the intersection is likely positive but may be anywhere up to `upper95`. The
//! upper ends stay the plain ones, which selection can only make more conservative.

//! # Sketch states
//!
//! Two sparse sketches are compared at the sparse precision 25 (2^25 virtual registers),
//! where small sets are counted almost exactly. Otherwise both are brought to the smaller
//! precision, folding the finer one down exactly as [`Hll::merge`] does, and compared
//! register by register.
//!
//! # Example
//!
//! ```
//! use hourglass_sketch::hll::Hll;
//! use hourglass_sketch::overlap::{Verdict, estimate_pair};
//!
//! let (mut monday, mut tuesday) = (Hll::new(14)?, Hll::new(14)?);
//! for user in 0..60_000u32 {
//!     monday.insert(&user.to_le_bytes());
//! }
//! for user in 40_000..100_000u32 {
//!     tuesday.insert(&user.to_le_bytes());
//! }
//! let overlap = estimate_pair(&monday, &tuesday)?;
//! assert_eq!(overlap.verdict, Verdict::Estimable);
//! let both = overlap.intersection; // truly 20,000
//! assert!(both.lower95 <= 20_000.0 && 20_000.0 <= both.upper95);
//! assert!((overlap.union.estimate - 100_000.0).abs() < 3_000.0);
//! // Of Monday's users, the share back on Tuesday: truly 1/3.
//! let back = overlap.retained;
//! assert!(back.lower95 <= 1.0 / 3.0 && 1.0 / 3.0 <= back.upper95);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod likelihood;

use crate::error::MergeError;
use crate::estimate::{Estimate, Z95};
use crate::hll::{Hll, SPARSE_PRECISION};
use likelihood::{JointHistograms, Matrix, Vector};

/// The relative standard error of the intersection at and above which it is declared
/// [`Verdict::TooSmall`]: `1/1.96`, where the 95% interval `estimate ± 1.96·σ` reaches 0.
pub const TOO_SMALL_RELATIVE_ERROR: f64 = 1.0 / Z95;

/// Whether the intersection estimate means something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Both sketches are empty: every figure is exactly 0.
    Empty,
    /// The intersection's relative standard error is below [`TOO_SMALL_RELATIVE_ERROR`],
    /// or it is known exactly (one sketch is empty). The lower ends of the intervals are
    /// selective (see the [module documentation](self)): 0 when the estimate is less than
    /// about 3.23 standard errors above 0.
    Estimable,
    /// The intersection is too small relative to the union for these sketches to
    /// estimate: its 95% interval reaches 0. Report the interval ("at most `upper95`"),
    /// not the point.
    TooSmall,
    /// A sketch is saturated (the joint fit ends at its cap): the sets are beyond the
    /// range the sketches can measure together. Each figure is then only what the two
    /// sketches bound alone: estimates at their lower ends, errors infinite, and upper
    /// ends infinite where a saturated side bounds them.
    Saturated,
}

/// The overlap of two sets, from their sketches: every region of the Venn diagram with
/// its standard error and 95% interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Overlap {
    /// `|A ∪ B|`.
    pub union: Estimate,
    /// `|A ∩ B|`; read it together with [`Overlap::verdict`].
    pub intersection: Estimate,
    /// `|A \ B|`: items of the first sketch only.
    pub only_a: Estimate,
    /// `|B \ A|`: items of the second sketch only.
    pub only_b: Estimate,
    /// The Jaccard index `|A ∩ B| / |A ∪ B|`, interval clamped to `[0, 1]`.
    pub jaccard: Estimate,
    /// The retained share `|A ∩ B| / |A|`: of the items of the first sketch, the share
    /// also in the second ("of the users seen in week 1, the share that came back in week
    /// 2"). The point is `λx / (λa + λx)` of the same joint fit, the standard error is by
    /// the delta method from the same covariance as the other figures (including the
    /// covariance of `λa` and `λx`), and the 95% interval is clamped to `[0, 1]`. When
    /// `|A|` is 0 the share is 0 with zero error. Read it together with
    /// [`Overlap::verdict`], like the intersection: when that is [`Verdict::TooSmall`],
    /// its lower end is 0 and the answer is "at most `upper95`"; when it is
    /// [`Verdict::Estimable`], the lower end is selective, as the intersection's (see the
    /// [module documentation](self)).
    pub retained: Estimate,
    /// Whether the intersection could be estimated.
    pub verdict: Verdict,
    /// The precision at which the registers were compared: the smaller of the two, or 25
    /// when both sketches are sparse.
    pub precision: u8,
}

/// The joint maximum-likelihood estimate of the overlap of the sets behind `a` and `b`
/// (see the [module documentation](self)).
///
/// Sketches of different precisions are compared at the smaller one, as [`Hll::merge`]
/// would, so this never fails; the `Result` keeps the signature of a merge.
pub fn estimate_pair(a: &Hll, b: &Hll) -> Result<Overlap, MergeError> {
    let (histograms, precision, start) = joint_histograms(a, b)?;
    if histograms.is_empty() {
        let zero = Estimate::normal(0.0, 0.0, 0.0);
        return Ok(Overlap {
            union: zero,
            intersection: zero,
            only_a: zero,
            only_b: zero,
            jaccard: zero,
            retained: zero,
            verdict: Verdict::Empty,
            precision,
        });
    }
    let fit = likelihood::maximize(&histograms, start);
    if fit.at_cap {
        return Ok(saturated(a, b, precision));
    }
    let m = histograms.registers;
    let mut covariance = likelihood::covariance(&fit.at_maximum);
    // From the covariance under the Poisson model to the error for the sets at hand: take
    // out the Poisson spread of the counts themselves (see the module docs).
    for (i, rate) in fit.rates.iter().enumerate() {
        covariance[i][i] -= rate / m;
    }
    let rate_x = fit.rates[2];
    let estimate = |weights: Vector| {
        let point: f64 = (0..3).map(|i| weights[i] * fit.rates[i]).sum();
        let std_error = m * quadratic_form(&covariance, &weights).max(0.0).sqrt();
        Estimate::normal(m * point, std_error, 0.0)
    };
    let mut intersection = estimate([0.0, 0.0, 1.0]);
    // A ratio `λx / D` with `D = Σ dᵢ·λᵢ`: ∂/∂λᵢ = (δᵢx·D − dᵢ·λx) / D². Its point, and
    // its standard error by the delta method from the covariance above.
    let ratio = |denominator: Vector| {
        let d: f64 = (0..3).map(|i| denominator[i] * fit.rates[i]).sum();
        if d <= 0.0 {
            return Estimate::normal(0.0, 0.0, 0.0);
        }
        let gradient: Vector = std::array::from_fn(|i| {
            let own = if i == 2 { d } else { 0.0 };
            (own - denominator[i] * rate_x) / (d * d)
        });
        let std_error = quadratic_form(&covariance, &gradient).max(0.0).sqrt();
        let mut share = Estimate::normal(rate_x / d, std_error, 0.0);
        share.upper95 = share.upper95.min(1.0);
        share
    };
    // J = λx / (λa + λb + λx); retained share R = λx / (λa + λx).
    let mut jaccard = ratio([1.0, 1.0, 1.0]);
    let mut retained = ratio([1.0, 0.0, 1.0]);
    let verdict = judge(&mut intersection, &mut jaccard, &mut retained);
    Ok(Overlap {
        union: estimate([1.0, 1.0, 1.0]),
        intersection,
        only_a: estimate([1.0, 0.0, 0.0]),
        only_b: estimate([0.0, 1.0, 0.0]),
        jaccard,
        retained,
        verdict,
        precision,
    })
}

/// Whether the intersection stands apart from zero ([`Verdict::Estimable`]) or not
/// ([`Verdict::TooSmall`]), with the lower ends of the intersection and of the shares that
/// the verdict gives them (see the module docs).
fn judge(intersection: &mut Estimate, jaccard: &mut Estimate, retained: &mut Estimate) -> Verdict {
    let verdict =
        if intersection.std_error > 0.0 && intersection.estimate <= Z95 * intersection.std_error {
            Verdict::TooSmall
        } else {
            Verdict::Estimable
        };
    if verdict == Verdict::TooSmall {
        // The intersection may be 0, and so may the shares.
        jaccard.lower95 = 0.0;
        retained.lower95 = 0.0;
    } else if verdict == Verdict::Estimable && intersection.std_error > 0.0 {
        // The interval given that the verdict is Estimable (see the module docs): the
        // lower ends move down by the same number of standard errors.
        let t = intersection.estimate / intersection.std_error;
        match selective_lower_distance(t, Z95) {
            Some(below) => {
                for e in [&mut *intersection, &mut *jaccard, &mut *retained] {
                    e.lower95 = (e.estimate - below * e.std_error).max(0.0);
                }
            }
            None => {
                for e in [&mut *intersection, &mut *jaccard, &mut *retained] {
                    e.lower95 = 0.0;
                }
            }
        }
    }
    verdict
}

/// The overlap when a sketch is saturated ([`Verdict::Saturated`]): the joint fit ends at
/// its cap and its figures mean nothing, so each is what the two sketches alone bound:
/// `|A ∩ B|` at most the smaller `|A|` or `|B|`, each side's own part at most that side,
/// the union at least the larger side, the shares anywhere in `[0, 1]`. Each estimate is
/// its lower end (a saturated side's own estimate is infinite), with an infinite error.
fn saturated(a: &Hll, b: &Hll, precision: u8) -> Overlap {
    let (ea, eb) = (a.estimate(), b.estimate());
    let at_most = |upper: f64| Estimate {
        estimate: 0.0,
        std_error: f64::INFINITY,
        lower95: 0.0,
        upper95: upper,
    };
    let lower = ea.lower95.max(eb.lower95);
    Overlap {
        union: Estimate {
            estimate: ea.estimate.max(eb.estimate),
            std_error: f64::INFINITY,
            lower95: lower,
            upper95: ea.upper95 + eb.upper95,
        },
        intersection: at_most(ea.upper95.min(eb.upper95)),
        only_a: at_most(ea.upper95),
        only_b: at_most(eb.upper95),
        jaccard: at_most(1.0),
        retained: at_most(1.0),
        verdict: Verdict::Saturated,
        precision,
    }
}

/// How far below `t` the lower end of the 95% interval of a normal mean `μ ≥ 0` lies, in
/// standard errors, given one observation `t` (in standard errors) known to exceed
/// `threshold`: `t − μ₀`, where `μ₀` is the mean at which `P(T ≥ t | T > threshold) =
/// 2.5%` for `T ~ N(μ, 1)` (the lower end of the selective, truncated-normal interval).
/// It is at least `1.96`, the unconditional distance, and tends to it as `t` grows.
/// `None` when even `μ = 0` gives at least 2.5%: the observation, selected for exceeding
/// the threshold, cannot tell `μ` from 0.
fn selective_lower_distance(t: f64, threshold: f64) -> Option<f64> {
    if t.is_nan() || t <= threshold {
        return None;
    }
    if t >= threshold + 40.0 {
        // The selection has probability 1 − 10⁻³⁰⁰ at every μ near t: no correction.
        return Some(Z95);
    }
    // P(T ≥ t | T > threshold) at μ, increasing in μ; its denominator is at least
    // P(T > threshold | μ = 0) > 0 for μ ≥ 0.
    let conditional = |mu: f64| upper_tail(t - mu) / upper_tail(threshold - mu);
    if conditional(0.0) >= 0.025 {
        return None;
    }
    // conditional(t) ≥ 1/2 > 2.5%: the root lies in (0, t).
    let (mut low, mut high) = (0.0, t);
    while high - low > 1e-9 * t {
        let mid = 0.5 * (low + high);
        if conditional(mid) < 0.025 {
            low = mid;
        } else {
            high = mid;
        }
    }
    Some((t - low).max(Z95))
}

/// `P(Z > z)` for a standard normal `Z`, with a relative error below `1.2·10⁻⁷` (the
/// Chebyshev fit of `erfc` in Numerical Recipes, 2nd ed., §6.2).
fn upper_tail(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.5 * a);
    let polynomial = -a * a - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * polynomial.exp();
    0.5 * if x >= 0.0 { erfc } else { 2.0 - erfc }
}

/// `wᵀ·C·w`.
fn quadratic_form(c: &Matrix, w: &Vector) -> f64 {
    (0..3)
        .map(|i| (0..3).map(|j| w[i] * c[i][j] * w[j]).sum::<f64>())
        .sum()
}

/// The register-pair histograms of the two sketches, the precision they were taken at,
/// and a starting point for the fit (from the single-sketch estimates, by
/// inclusion–exclusion).
fn joint_histograms(a: &Hll, b: &Hll) -> Result<(JointHistograms, u8, Vector), MergeError> {
    let start = |a: &Hll, b: &Hll, m: f64| -> Result<Vector, MergeError> {
        let naive = inclusion_exclusion(a, b)?;
        let x = naive.intersection.max(0.0);
        Ok([
            (naive.a.estimate - x).max(0.0) / m,
            (naive.b.estimate - x).max(0.0) / m,
            x / m,
        ])
    };
    if let (Some(sparse_a), Some(sparse_b)) = (a.sparse_registers(), b.sparse_registers()) {
        let q = 64 - u32::from(SPARSE_PRECISION);
        let m = 1u64 << SPARSE_PRECISION;
        let histograms = JointHistograms::from_sparse(&sparse_a, &sparse_b, q, m);
        return Ok((histograms, SPARSE_PRECISION, start(a, b, m as f64)?));
    }
    let precision = a.precision().min(b.precision());
    // Everything below reads the folded sketches only, so folding first changes nothing.
    let (a, b) = (fold_to(a, precision)?, fold_to(b, precision)?);
    let q = 64 - u32::from(precision);
    let histograms = JointHistograms::from_dense(&a.dense_registers(), &b.dense_registers(), q);
    let m = histograms.registers;
    Ok((histograms, precision, start(&a, &b, m)?))
}

/// `sketch` at `precision` (not above its own), borrowed when it is already there.
fn fold_to(sketch: &Hll, precision: u8) -> Result<std::borrow::Cow<'_, Hll>, MergeError> {
    if sketch.precision() == precision {
        return Ok(std::borrow::Cow::Borrowed(sketch));
    }
    // Cannot fail: the caller passes the smaller of two valid precisions.
    sketch
        .fold_to(precision)
        .map(std::borrow::Cow::Owned)
        .map_err(|err| MergeError::ParameterMismatch {
            parameter: "precision",
            left: precision.to_string(),
            right: format!("{} ({err})", sketch.precision()),
        })
}

/// The naive overlap by inclusion–exclusion, `|A| + |B| − |A ∪ B|`, each term from
/// [`Hll::estimate`]; for comparison with [`estimate_pair`], which is more accurate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InclusionExclusion {
    /// The estimate of `|A|`.
    pub a: Estimate,
    /// The estimate of `|B|`.
    pub b: Estimate,
    /// The estimate of `|A ∪ B|`, from the merged sketch.
    pub union: Estimate,
    /// `a + b − union`, unclamped: it is negative when the union's estimate exceeds the
    /// sum. No interval is given: the three errors are correlated in a way the single
    /// estimates do not describe.
    pub intersection: f64,
}

/// The inclusion–exclusion estimate of the overlap (see [`InclusionExclusion`]), from
/// two sketches of either distinct form: `a` and `b` are each one's own estimate (with its
/// form's error), the union that of their merge ([`crate::distinct::Distinct::merge`]).
pub fn inclusion_exclusion<S>(a: &S, b: &S) -> Result<InclusionExclusion, MergeError>
where
    S: Clone + Into<crate::distinct::Distinct>,
{
    let (a, b): (crate::distinct::Distinct, crate::distinct::Distinct) =
        (a.clone().into(), b.clone().into());
    let mut union = a.clone();
    union.merge(&b)?;
    let (a, b, union) = (a.estimate(), b.estimate(), union.estimate());
    Ok(InclusionExclusion {
        a,
        b,
        union,
        intersection: a.estimate + b.estimate - union.estimate,
    })
}

#[cfg(test)]
mod tests;
