//! Review probes of the joint overlap estimator (adversarial and small-register sketches).

use super::*;
use crate::Estimate;

struct Hashes(u64);

impl Hashes {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn pair(pa: u8, pb: u8, only_a: u64, only_b: u64, both: u64, seed: u64) -> (Hll, Hll) {
    let mut hashes = Hashes(seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let (mut a, mut b) = (Hll::new(pa).unwrap(), Hll::new(pb).unwrap());
    for _ in 0..both {
        let h = hashes.next();
        a.insert_hash(h);
        b.insert_hash(h);
    }
    for _ in 0..only_a {
        a.insert_hash(hashes.next());
    }
    for _ in 0..only_b {
        b.insert_hash(hashes.next());
    }
    (a, b)
}

fn saturated(precision: u8) -> Hll {
    let m = 1usize << precision;
    Hll::from_dense_registers(precision, vec![65 - precision; m].into_boxed_slice())
}

fn fields(o: &Overlap) -> [(&'static str, Estimate); 6] {
    [
        ("union", o.union),
        ("intersection", o.intersection),
        ("only_a", o.only_a),
        ("only_b", o.only_b),
        ("jaccard", o.jaccard),
        ("retained", o.retained),
    ]
}

/// Every figure ordered, non-negative, not NaN; shares within [0, 1]; finite unless
/// the verdict is Saturated (whose upper ends and errors may be infinite).
fn invariant_violations(o: &Overlap) -> Vec<String> {
    let mut out = Vec::new();
    for (name, e) in fields(o) {
        let nan = [e.estimate, e.std_error, e.lower95, e.upper95]
            .iter()
            .any(|v| v.is_nan());
        if nan {
            out.push(format!("{name} has NaN: {e:?}"));
            continue;
        }
        if !(0.0 <= e.lower95 && e.lower95 <= e.estimate && e.estimate <= e.upper95) {
            out.push(format!("{name} not ordered: {e:?}"));
        }
        if o.verdict != Verdict::Saturated
            && ![e.estimate, e.std_error, e.lower95, e.upper95]
                .iter()
                .all(|v| v.is_finite())
        {
            out.push(format!("{name} not finite: {e:?}"));
        }
    }
    for (name, e) in [("jaccard", o.jaccard), ("retained", o.retained)] {
        if !(e.estimate <= 1.0 + 1e-12 && e.upper95 <= 1.0 && e.lower95 >= 0.0) {
            out.push(format!("{name} outside [0, 1]: {e:?}"));
        }
    }
    out
}

/// One sketch saturated (every register at 65 − p), the other a normal set of 50,000: the
/// verdict is Saturated, but the figures the normal side bounds must stay within it.
/// Found: |A ∩ B| and |B \ A| come out at about 9.2·10^18 (the fit's cap), for a B of
/// 50,000, at p = 4, 10 and 18.
#[test]
fn review_sets_saturated_side_does_not_inflate_the_other() {
    for p in [4u8, 10, 18] {
        let full = saturated(p);
        let (normal, _) = pair(p, p, 50_000, 0, 0, 3);
        let bound = normal.estimate().upper95;
        let o = estimate_pair(&full, &normal).unwrap();
        assert_eq!(o.verdict, Verdict::Saturated);
        assert!(
            o.intersection.estimate <= bound && o.only_b.estimate <= bound,
            "p = {p}: A saturated, |B| at most {bound}, yet |A ∩ B| = {} and |B \\ A| = {}: {o:?}",
            o.intersection.estimate,
            o.only_b.estimate
        );
    }
}

/// The invariants (ordered, non-negative, finite unless Saturated, shares in [0, 1]) at
/// the precisions the existing property test leaves out: 17, 18, and sparse against dense
/// at 4 and 18, one side empty (passes: checked fine).
#[test]
fn review_sets_invariants_at_the_edges() {
    let empty = Hll::new(18).unwrap();
    for (pa, pb, oa, ob, both) in [
        (18u8, 18u8, 3_000u64, 3_000u64, 100u64),
        (18, 4, 40_000, 10, 2_000),
        (4, 18, 10, 0, 5),
        (17, 18, 50_000, 50_000, 0),
        (18, 18, 1, 1, 1),
    ] {
        let (a, b) = pair(pa, pb, oa, ob, both, 5);
        for (x, y) in [(&a, &b), (&b, &a), (&a, &empty), (&empty, &b)] {
            let o = estimate_pair(x, y).unwrap();
            let v = invariant_violations(&o);
            assert!(v.is_empty(), "p={pa}/{pb} {oa}/{ob}/{both}: {v:?} {o:?}");
        }
    }
    let o = estimate_pair(&empty, &empty.clone()).unwrap();
    assert_eq!(o.verdict, Verdict::Empty);
}
