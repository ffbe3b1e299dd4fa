//! The joint log-likelihood of two HyperLogLog sketches and its maximisation.
//!
//! # Model
//!
//! Under the Poisson model of Ertl (2017, the joint estimation section), the items of
//! `A \ B`, `B \ A` and `A ∩ B` fall into each of the `m` registers as three independent
//! Poisson streams of rates `λa`, `λb` and `λx` (cardinality divided by `m`). A stream of
//! rate `λ` leaves a register at a value `≤ k` with probability `F(λ, k) = e^(−λ/2^k)` for
//! `0 ≤ k ≤ q` (and 1 at the saturated value `q + 1`, where `q = 64 − p`). Register `i` of
//! sketch A is the maximum of the `A \ B` and `A ∩ B` streams, register `i` of B the
//! maximum of the `B \ A` and `A ∩ B` streams. A register pair `(a, b)` therefore has
//! probability
//!
//! * `a < b`: `ρ(λa + λx, a) · ρ(λb, b)` — B's larger value can only come from `B \ A`;
//! * `a > b`: `ρ(λa, a) · ρ(λb + λx, b)`, the mirror image;
//! * `a = b = k`: `F(Λ, k) − F(λa + λx, k−1)·F(λb, k) − F(λa, k)·F(λb + λx, k−1) +
//!   F(Λ, k−1)` with `Λ = λa + λb + λx`, which for `1 ≤ k ≤ q` is
//!   `e^(−Λ/2^k) · B_k` with `B_k = (1 − e^(−(λa+λx)/2^k))·(1 − e^(−(λb+λx)/2^k)) +
//!   e^(−Λ/2^k)·(1 − e^(−λx/2^k))`, for `k = 0` it is `e^(−Λ)`, and for `k = q + 1` it
//!   is `B` at `2^q` without the leading factor;
//!
//! where `ρ(λ, k) = F(λ, k) − F(λ, k−1)` is the single-sketch probability of value `k`.
//! The likelihood depends on the registers only through five histograms (the smaller and
//! larger value of unequal pairs, split by which sketch holds the larger one, and the
//! value of equal pairs), so one pass over the registers suffices and every evaluation
//! afterwards costs `O(q)`.
//!
//! `B_k` is written as a sum of two non-negative products, each factor computed with
//! `expm1`, so it loses no precision when the rates are small against `2^k`, where the
//! textbook form `1 − e^… − e^… + e^…` cancels catastrophically.
//!
//! # Maximisation
//!
//! Damped (Levenberg–Marquardt) Newton steps with the analytic gradient and Hessian,
//! projected onto the box `0 ≤ λ ≤ cap`: a coordinate at a bound whose gradient points out
//! of the box is held there (the disjoint case ends with `λx = 0`, `A = B` with
//! `λa = λb = 0`). A step is kept only if it raises the likelihood; otherwise the damping
//! grows, so the iteration cannot diverge, and it stops when a step no longer moves the
//! rates or no step raises the likelihood. The cap, `50·2^q` per register, is where every
//! register would be saturated with probability `1 − e^(−50)`: a likelihood that still
//! rises there (all registers saturated) has no finite maximum, and the fit reports that.

/// Register values run `0..=q + 1 ≤ 61`: histograms of this many slots hold them all.
pub(super) const SLOTS: usize = 64;

/// The sufficient statistics of a register pair sequence.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct JointHistograms {
    /// `q = 64 − p`: register values run `0..=q + 1`, `q + 1` being saturated.
    pub q: u32,
    /// The number of registers `m`.
    pub registers: f64,
    /// Pairs with `a < b`: the histogram of `a` (rate `λa + λx`).
    pub smaller_a: [u64; SLOTS],
    /// Pairs with `a < b`: the histogram of `b` (rate `λb`).
    pub larger_b: [u64; SLOTS],
    /// Pairs with `a > b`: the histogram of `a` (rate `λa`).
    pub larger_a: [u64; SLOTS],
    /// Pairs with `a > b`: the histogram of `b` (rate `λb + λx`).
    pub smaller_b: [u64; SLOTS],
    /// Pairs with `a = b`: the histogram of the common value.
    pub equal: [u64; SLOTS],
}

impl JointHistograms {
    /// Empty histograms for `registers` registers with values up to `q + 1`.
    pub(super) fn new(q: u32, registers: f64) -> JointHistograms {
        JointHistograms {
            q,
            registers,
            smaller_a: [0; SLOTS],
            larger_b: [0; SLOTS],
            larger_a: [0; SLOTS],
            smaller_b: [0; SLOTS],
            equal: [0; SLOTS],
        }
    }

    /// Counts one register pair. Values above `q + 1` (never produced by a valid sketch)
    /// are read as `q + 1`, so a slot index never goes out of range.
    pub(super) fn add(&mut self, a: u8, b: u8, count: u64) {
        let top = (self.q + 1).min(SLOTS as u32 - 1) as usize;
        let (a, b) = (usize::from(a).min(top), usize::from(b).min(top));
        match a.cmp(&b) {
            std::cmp::Ordering::Less => {
                self.smaller_a[a] += count;
                self.larger_b[b] += count;
            }
            std::cmp::Ordering::Greater => {
                self.larger_a[a] += count;
                self.smaller_b[b] += count;
            }
            std::cmp::Ordering::Equal => self.equal[a] += count,
        }
    }

    /// Histograms of two register arrays of the same length.
    pub(super) fn from_dense(a: &[u8], b: &[u8], q: u32) -> JointHistograms {
        let mut histograms = JointHistograms::new(q, a.len().min(b.len()) as f64);
        for (&x, &y) in a.iter().zip(b) {
            histograms.add(x, y, 1);
        }
        histograms
    }

    /// Histograms of two sparse register lists (`(index, value)`, sorted by index, each
    /// index at most once) of a sketch with `registers` registers; every index not listed
    /// is 0 in that sketch.
    pub(super) fn from_sparse(
        a: &[(u32, u8)],
        b: &[(u32, u8)],
        q: u32,
        registers: u64,
    ) -> JointHistograms {
        let mut histograms = JointHistograms::new(q, registers as f64);
        let (mut i, mut j, mut occupied) = (0, 0, 0u64);
        loop {
            let pair = match (a.get(i), b.get(j)) {
                (Some(&(ia, va)), Some(&(ib, vb))) => match ia.cmp(&ib) {
                    std::cmp::Ordering::Less => {
                        i += 1;
                        (va, 0)
                    }
                    std::cmp::Ordering::Greater => {
                        j += 1;
                        (0, vb)
                    }
                    std::cmp::Ordering::Equal => {
                        i += 1;
                        j += 1;
                        (va, vb)
                    }
                },
                (Some(&(_, va)), None) => {
                    i += 1;
                    (va, 0)
                }
                (None, Some(&(_, vb))) => {
                    j += 1;
                    (0, vb)
                }
                (None, None) => break,
            };
            histograms.add(pair.0, pair.1, 1);
            occupied += 1;
        }
        histograms.add(0, 0, registers.saturating_sub(occupied));
        histograms
    }

    /// Whether every register of both sketches is 0.
    pub(super) fn is_empty(&self) -> bool {
        let zero = |h: &[u64; SLOTS]| h.iter().all(|&c| c == 0);
        zero(&self.smaller_a) && zero(&self.larger_a) && self.equal[1..].iter().all(|&c| c == 0)
    }

    /// The largest rate the fit considers, per register (see the module docs).
    pub(super) fn cap(&self) -> f64 {
        50.0 * 2f64.powi(self.q as i32)
    }
}

/// A gradient or a rate vector, in the order `(λa, λb, λx)`.
pub(super) type Vector = [f64; 3];
/// A symmetric 3×3 matrix.
pub(super) type Matrix = [[f64; 3]; 3];

/// The log-likelihood with its gradient and Hessian at one point.
#[derive(Clone, Copy, Debug)]
pub(super) struct Evaluation {
    /// `ln L`; `−∞` where the registers are impossible (a set register at rate 0).
    pub value: f64,
    /// `∂ ln L / ∂λ`.
    pub gradient: Vector,
    /// `∂² ln L / ∂λ²`.
    pub hessian: Matrix,
}

/// `(f, f′, f″)` of `f(λ) = ln ρ(λ, k)`: the log-probability that one stream of rate
/// `λ` leaves a register at value `k`.
fn single_term(lambda: f64, k: u32, q: u32) -> (f64, f64, f64) {
    if k == 0 {
        return (-lambda, -1.0, 0.0);
    }
    let y = 2f64.powi(-(k.min(q) as i32));
    let x = lambda * y;
    if x <= 0.0 {
        return (f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
    }
    // w = 1/(e^x − 1): the derivative of ln(1 − e^(−x)), finite for every x > 0.
    let w = 1.0 / x.exp_m1();
    let log_set = (-(-x).exp_m1()).ln();
    let curvature = -y * y * (w + w * w);
    if k <= q {
        (-x + log_set, y * (w - 1.0), curvature)
    } else {
        (log_set, y * w, curvature)
    }
}

/// Adds `count · f(c·θ)` to `out`, where `f` is [`single_term`] and `c` a 0/1 vector.
fn add_single(out: &mut Evaluation, count: u64, rates: &Vector, c: Vector, k: u32, q: u32) {
    if count == 0 {
        return;
    }
    let n = count as f64;
    let lambda: f64 = (0..3).map(|i| c[i] * rates[i]).sum();
    let (f, f1, f2) = single_term(lambda, k, q);
    out.value += n * f;
    if f.is_finite() {
        for i in 0..3 {
            out.gradient[i] += n * f1 * c[i];
            for j in 0..3 {
                out.hessian[i][j] += n * f2 * c[i] * c[j];
            }
        }
    }
}

/// Adds `count · ln P(a = b = k)` to `out`.
fn add_equal(out: &mut Evaluation, count: u64, rates: &Vector, k: u32, q: u32) {
    if count == 0 {
        return;
    }
    let n = count as f64;
    let [a, b, x] = *rates;
    let total = a + b + x;
    if k == 0 {
        out.value -= n * total;
        for g in &mut out.gradient {
            *g -= n;
        }
        return;
    }
    let y = 2f64.powi(-(k.min(q) as i32));
    // 1 − e^(−t·y), without cancellation for small t·y.
    let set = |t: f64| -(-t * y).exp_m1();
    let (e_alpha, e_beta, e_total) = (
        (-(a + x) * y).exp(),
        (-(b + x) * y).exp(),
        (-total * y).exp(),
    );
    let (t_a, t_b) = (set(a), set(b));
    let big_b = set(a + x) * set(b + x) + e_total * set(x);
    if big_b <= 0.0 || !big_b.is_finite() {
        out.value = f64::NEG_INFINITY;
        return;
    }
    // ∇B / y and ∇²B / y², with every difference of exponentials factored (see the
    // module docs).
    let d_b = [e_alpha * t_b, e_beta * t_a, e_alpha + e_beta * t_a];
    let dd_b = [
        [-e_alpha * t_b, e_total, -e_alpha * t_b],
        [e_total, -e_beta * t_a, -e_beta * t_a],
        [-e_alpha * t_b, -e_beta * t_a, -e_alpha - e_beta * t_a],
    ];
    let linear = if k <= q { -total * y } else { 0.0 };
    let linear_gradient = if k <= q { -y } else { 0.0 };
    out.value += n * (linear + big_b.ln());
    let g: Vector = std::array::from_fn(|i| y * d_b[i] / big_b);
    for i in 0..3 {
        out.gradient[i] += n * (linear_gradient + g[i]);
        for j in 0..3 {
            out.hessian[i][j] += n * (y * y * dd_b[i][j] / big_b - g[i] * g[j]);
        }
    }
}

/// The rate vectors `c` of the four single-stream categories.
const A_AND_X: Vector = [1.0, 0.0, 1.0];
const B_ONLY: Vector = [0.0, 1.0, 0.0];
const A_ONLY: Vector = [1.0, 0.0, 0.0];
const B_AND_X: Vector = [0.0, 1.0, 1.0];

/// The log-likelihood, gradient and Hessian at `rates = (λa, λb, λx)`.
pub(super) fn evaluate(h: &JointHistograms, rates: &Vector) -> Evaluation {
    let mut out = Evaluation {
        value: 0.0,
        gradient: [0.0; 3],
        hessian: [[0.0; 3]; 3],
    };
    for k in 0..=(h.q + 1).min(SLOTS as u32 - 1) {
        let s = k as usize;
        add_single(&mut out, h.smaller_a[s], rates, A_AND_X, k, h.q);
        add_single(&mut out, h.larger_b[s], rates, B_ONLY, k, h.q);
        add_single(&mut out, h.larger_a[s], rates, A_ONLY, k, h.q);
        add_single(&mut out, h.smaller_b[s], rates, B_AND_X, k, h.q);
        add_equal(&mut out, h.equal[s], rates, k, h.q);
        if out.value == f64::NEG_INFINITY {
            break;
        }
    }
    if out.value.is_nan() {
        out.value = f64::NEG_INFINITY;
    }
    out
}

/// The maximum-likelihood rates and how the fit ended.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fit {
    /// `(λa, λb, λx)` at the maximum.
    pub rates: Vector,
    /// The evaluation there (gradient and Hessian for the error bars).
    pub at_maximum: Evaluation,
    /// Whether a rate ended at the cap: the likelihood has no finite maximum there.
    pub at_cap: bool,
    /// Newton iterations used (read by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub iterations: u32,
}

/// At most this many iterations; convergence takes 5 to 30 in practice.
const MAX_ITERATIONS: u32 = 500;

/// Maximises the log-likelihood over `0 ≤ λ ≤ cap`, starting from `start` (any finite
/// point; it is moved inside the box and away from impossible zeros first).
pub(super) fn maximize(h: &JointHistograms, start: Vector) -> Fit {
    let cap = h.cap();
    let clamp = |v: f64| if v.is_nan() { 0.0 } else { v.clamp(0.0, cap) };
    let mut rates = start.map(clamp);
    // A rate of exactly 0 makes every register it alone could have set impossible: start
    // each rate at no less than 1% of the total, which the iteration moves back down.
    let total: f64 = rates.iter().sum::<f64>().max(1.0 / h.registers);
    rates = rates.map(|r| clamp(r.max(0.01 * total)));
    let mut current = evaluate(h, &rates);
    // Should even that be impossible (it cannot be for registers of a real sketch), grow
    // the rates until it is not.
    let mut grow = 0;
    while current.value == f64::NEG_INFINITY && grow < 64 {
        rates = rates.map(|r| clamp(r.max(total) * 4.0));
        current = evaluate(h, &rates);
        grow += 1;
    }
    let mut damping = 1e-3;
    let mut iterations = 0;
    while iterations < MAX_ITERATIONS && current.value.is_finite() {
        iterations += 1;
        let g = current.gradient;
        // Held coordinates: at a bound, with the gradient pointing out of the box.
        let free: [bool; 3] = std::array::from_fn(|i| {
            !((rates[i] <= 0.0 && g[i] <= 0.0) || (rates[i] >= cap && g[i] >= 0.0))
        });
        if !free.contains(&true) {
            break;
        }
        let Some(step) = damped_newton_step(&current, &free, damping) else {
            damping = (damping * 10.0).max(1e-3);
            if damping > 1e30 {
                break;
            }
            continue;
        };
        let candidate: Vector = std::array::from_fn(|i| clamp(rates[i] + step[i]));
        let next = evaluate(h, &candidate);
        if next.value > current.value {
            let moved = (0..3).any(|i| {
                (candidate[i] - rates[i]).abs() > 1e-12 * (candidate[i].abs() + total * 1e-6)
            });
            let gain = next.value - current.value;
            rates = candidate;
            current = next;
            damping *= 0.25;
            if !moved || gain <= 1e-13 * current.value.abs() {
                break;
            }
        } else {
            damping = (damping * 8.0).max(1e-6);
            if damping > 1e30 {
                break;
            }
        }
    }
    Fit {
        rates,
        at_maximum: current,
        at_cap: rates.iter().any(|&r| r >= cap),
        iterations,
    }
}

/// The step solving `(−H + μ·D)·d = g` on the free coordinates (0 on the held ones), with
/// `D` the diagonal of `−H` (floored so that a flat coordinate still moves); `None` if the
/// damped matrix is not positive definite.
fn damped_newton_step(at: &Evaluation, free: &[bool; 3], damping: f64) -> Option<Vector> {
    let scale = (0..3)
        .map(|i| at.hessian[i][i].abs())
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let index: Vec<usize> = (0..3).filter(|&i| free[i]).collect();
    let mut matrix = [[0.0; 3]; 3];
    let mut rhs = [0.0; 3];
    for (r, &i) in index.iter().enumerate() {
        rhs[r] = at.gradient[i];
        for (c, &j) in index.iter().enumerate() {
            matrix[r][c] = -at.hessian[i][j];
        }
        let diagonal = at.hessian[i][i].abs().max(1e-12 * scale);
        matrix[r][r] += damping * diagonal;
    }
    let solved = solve_positive_definite(&matrix, &rhs, index.len())?;
    let mut step = [0.0; 3];
    for (r, &i) in index.iter().enumerate() {
        step[i] = solved[r];
    }
    step.iter().all(|s| s.is_finite()).then_some(step)
}

/// Solves `M·x = v` for the leading `n × n` block of a symmetric `M` by Cholesky
/// factorisation; `None` unless that block is positive definite.
pub(super) fn solve_positive_definite(matrix: &Matrix, v: &Vector, n: usize) -> Option<Vector> {
    let mut l = [[0.0; 3]; 3];
    for i in 0..n {
        for j in 0..=i {
            let sum: f64 = (0..j).map(|k| l[i][k] * l[j][k]).sum();
            if i == j {
                let d = matrix[i][i] - sum;
                // Written to refuse a NaN as well as a non-positive pivot.
                if d.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) || !d.is_finite() {
                    return None;
                }
                l[i][i] = d.sqrt();
            } else {
                l[i][j] = (matrix[i][j] - sum) / l[j][j];
            }
        }
    }
    let mut z = [0.0; 3];
    for i in 0..n {
        let sum: f64 = (0..i).map(|k| l[i][k] * z[k]).sum();
        z[i] = (v[i] - sum) / l[i][i];
    }
    let mut x = [0.0; 3];
    for i in (0..n).rev() {
        let sum: f64 = (i + 1..n).map(|k| l[k][i] * x[k]).sum();
        x[i] = (z[i] - sum) / l[i][i];
    }
    Some(x)
}

/// The inverse of the observed Fisher information `−H` at the maximum: the asymptotic
/// covariance of the rates.
///
/// Coordinates along which the likelihood is flat (`H_ii = 0`: a rate pinned at 0 by
/// registers that are all empty, such as `λa` and `λx` when A is empty) are known
/// exactly and get variance 0; the rest get the inverse of their block, or, should that
/// block not be positive definite, `1/(−H_ii)` each.
pub(super) fn covariance(at: &Evaluation) -> Matrix {
    let information: Matrix = std::array::from_fn(|i| std::array::from_fn(|j| -at.hessian[i][j]));
    let scale = (0..3).map(|i| information[i][i].abs()).fold(0.0, f64::max);
    let index: Vec<usize> = (0..3)
        .filter(|&i| information[i][i] > 1e-14 * scale && information[i][i].is_finite())
        .collect();
    let mut out = [[0.0; 3]; 3];
    let mut block = [[0.0; 3]; 3];
    for (r, &i) in index.iter().enumerate() {
        for (c, &j) in index.iter().enumerate() {
            block[r][c] = information[i][j];
        }
    }
    let mut columns = Vec::with_capacity(index.len());
    for r in 0..index.len() {
        let mut unit = [0.0; 3];
        unit[r] = 1.0;
        match solve_positive_definite(&block, &unit, index.len()) {
            Some(column) => columns.push(column),
            None => break,
        }
    }
    if columns.len() == index.len() {
        for (c, column) in columns.iter().enumerate() {
            for (r, value) in column.iter().take(index.len()).enumerate() {
                out[index[r]][index[c]] = *value;
            }
        }
    } else {
        for &i in &index {
            out[i][i] = 1.0 / information[i][i];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The analytic gradient and Hessian agree with central differences of the value, at
    /// points that exercise every category and both ends of the value range.
    #[test]
    fn derivatives_match_finite_differences() {
        let mut h = JointHistograms::new(10, 64.0);
        for (a, b, n) in [
            (0u8, 0u8, 7u64),
            (1, 3, 2),
            (4, 2, 3),
            (2, 2, 5),
            (11, 11, 1),
            (0, 11, 1),
            (11, 5, 2),
            (6, 6, 4),
            (3, 0, 2),
        ] {
            h.add(a, b, n);
        }
        for rates in [[0.7, 1.3, 2.1], [0.05, 0.2, 0.01], [30.0, 5.0, 80.0]] {
            let at = evaluate(&h, &rates);
            for i in 0..3 {
                let step = 1e-5 * rates[i];
                let mut up = rates;
                let mut down = rates;
                up[i] += step;
                down[i] -= step;
                let (eu, ed) = (evaluate(&h, &up), evaluate(&h, &down));
                let numeric = (eu.value - ed.value) / (2.0 * step);
                let tolerance = 1e-5 * (numeric.abs() + 1.0);
                assert!(
                    (numeric - at.gradient[i]).abs() < tolerance,
                    "gradient {i} at {rates:?}: {numeric} vs {}",
                    at.gradient[i]
                );
                for j in 0..3 {
                    let numeric = (eu.gradient[j] - ed.gradient[j]) / (2.0 * step);
                    let tolerance = 1e-4 * (numeric.abs() + 1.0);
                    assert!(
                        (numeric - at.hessian[i][j]).abs() < tolerance,
                        "hessian {i},{j} at {rates:?}: {numeric} vs {}",
                        at.hessian[i][j]
                    );
                }
            }
        }
    }

    /// The pair probabilities of each category, summed over every pair of values, make 1:
    /// the categories are complete and disjoint.
    #[test]
    fn pair_probabilities_sum_to_one() {
        let q = 6;
        for rates in [[0.3, 0.8, 1.1], [5.0, 0.01, 20.0], [100.0, 100.0, 100.0]] {
            let mut total = 0.0;
            for a in 0..=q + 1 {
                for b in 0..=q + 1 {
                    let mut h = JointHistograms::new(q, 1.0);
                    h.add(a as u8, b as u8, 1);
                    total += evaluate(&h, &rates).value.exp();
                }
            }
            assert!((total - 1.0).abs() < 1e-12, "{rates:?}: {total}");
        }
    }

    /// From a poor start and from a good one, the fit reaches the same maximum, where the
    /// gradient vanishes on every free coordinate and points out of the box on held ones.
    #[test]
    fn fit_converges_to_the_same_maximum_from_any_start() {
        let mut state = 11u64;
        let mut next = move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for (only_a, only_b, both) in [
            (20_000u64, 3_000u64, 7_000u64),
            (50_000, 50_000, 0),
            (0, 0, 30_000),
            (1_000, 200_000, 100),
            (0, 5_000, 0),
        ] {
            let (mut a, mut b) = (
                crate::hll::Hll::new(10).unwrap(),
                crate::hll::Hll::new(10).unwrap(),
            );
            for _ in 0..both {
                let h = next();
                a.insert_hash(h);
                b.insert_hash(h);
            }
            (0..only_a).for_each(|_| a.insert_hash(next()));
            (0..only_b).for_each(|_| b.insert_hash(next()));
            let h = JointHistograms::from_dense(&a.dense_registers(), &b.dense_registers(), 54);
            let truth = [only_a, only_b, both].map(|n| n as f64 / 1024.0);
            let fits = [
                maximize(&h, [1.0, 1.0, 1.0]),
                maximize(&h, truth),
                maximize(&h, [1e6, 0.0, 1e-9]),
            ];
            for fit in &fits {
                assert!(fit.iterations < MAX_ITERATIONS, "{fit:?}");
                assert!(!fit.at_cap);
                for (i, g) in fit.at_maximum.gradient.iter().enumerate() {
                    let curvature = fit.at_maximum.hessian[i][i].abs().max(1e-300);
                    // The gradient, in units of the rate's standard deviation.
                    let scaled = g / curvature.sqrt();
                    if fit.rates[i] > 0.0 {
                        assert!(scaled.abs() < 1e-4, "{i}: {fit:?}");
                    } else {
                        assert!(scaled < 1e-4, "{i}: {fit:?}");
                    }
                }
                for i in 0..3 {
                    let spread = (1.0 / fits[0].at_maximum.hessian[i][i].abs()).sqrt();
                    assert!(
                        (fit.rates[i] - fits[0].rates[i]).abs() <= 1e-4 * spread.min(1.0) + 1e-9,
                        "{i}: {fit:?} vs {:?}",
                        fits[0]
                    );
                }
            }
        }
    }

    #[test]
    fn cholesky_solves_and_refuses_indefinite() {
        let m = [[4.0, 2.0, 0.0], [2.0, 3.0, 1.0], [0.0, 1.0, 2.0]];
        let x = solve_positive_definite(&m, &[1.0, 2.0, 3.0], 3).unwrap();
        for (row, want) in m.iter().zip([1.0, 2.0, 3.0]) {
            let got: f64 = row.iter().zip(&x).map(|(a, b)| a * b).sum();
            assert!((got - want).abs() < 1e-12);
        }
        let indefinite = [[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
        assert!(solve_positive_definite(&indefinite, &[1.0, 1.0, 1.0], 3).is_none());
    }
}
