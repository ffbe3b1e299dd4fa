//! Merges of the distinct kind's two forms as hourglass makes them: mixed forms and mixed
//! precisions at the sizes agents really ship (p = 12..14, thousands of items, across every sparse/dense
//! threshold), the empty sketch the aggregator answers an empty selection with, and the
//! merge trees the aggregator builds (per day, then across days).

use super::*;
use crate::hll::MAX_PRECISION;

fn hashes(range: std::ops::Range<u64>) -> Vec<u64> {
    range
        .map(|i| crate::hash::item_hash(format!("user-{i}").as_bytes()))
        .collect()
}

fn merged(parts: &[&Distinct]) -> Distinct {
    let mut out = parts[0].clone();
    for part in &parts[1..] {
        out.merge(part).unwrap();
    }
    out
}

fn hex(d: &Distinct) -> String {
    d.encode().iter().map(|b| format!("{b:02x}")).collect()
}

/// Item counts that put each operand on either side of every threshold that matters at
/// p = 12..14: HLL sparse limits 768 / 1536 / 3072 entries, ULL sparse limits
/// 1024 / 2048 / 4096 indices.
const SIZES: [u64; 9] = [0, 3, 700, 900, 1300, 1800, 2600, 3500, 20_000];

/// ULL p13 ∪ HLL p14 ∪ ULL p12 in all six orders and both bracketings, at sizes across
/// every threshold: one result, byte for byte the HLL p12 of the union, with its error.
#[test]
fn ull13_hll14_ull12_agree_in_every_order() {
    let specs = [
        (DistinctForm::Ull, 13u8),
        (DistinctForm::Hll, 14u8),
        (DistinctForm::Ull, 12u8),
    ];
    let mut offset = 0u64;
    for &na in &SIZES {
        for &nb in &SIZES {
            for &nc in &[0u64, 900, 1800, 20_000] {
                let sets = [
                    hashes(offset..offset + na),
                    // Overlapping by half with the first set.
                    hashes(offset + na / 2..offset + na / 2 + nb),
                    hashes(offset + 7_000_000..offset + 7_000_000 + nc),
                ];
                offset += 100_000;
                let s: Vec<Distinct> = specs
                    .iter()
                    .zip(&sets)
                    .map(|(&(form, p), h)| of_hashes(form, p, h))
                    .collect();
                let all: Vec<u64> = sets.iter().flatten().copied().collect();
                let expected = of_hashes(DistinctForm::Hll, 12, &all);
                for order in [
                    [0, 1, 2],
                    [0, 2, 1],
                    [1, 0, 2],
                    [1, 2, 0],
                    [2, 0, 1],
                    [2, 1, 0],
                ] {
                    let left = merged(&[&s[order[0]], &s[order[1]], &s[order[2]]]);
                    let right = merged(&[&s[order[0]], &merged(&[&s[order[1]], &s[order[2]]])]);
                    for (got, how) in [(&left, "left"), (&right, "right")] {
                        assert_eq!(
                            hex(got),
                            hex(&expected),
                            "sizes {na}/{nb}/{nc}, order {order:?}, {how}"
                        );
                        assert_eq!(got.estimate(), expected.estimate());
                    }
                }
                // The answer's error is HyperLogLog's at p = 12 once dense.
                let e = expected.estimate();
                if !expected.is_sparse() && e.estimate > 0.0 {
                    assert!((e.std_error / e.estimate - 1.04 / 64.0).abs() < 1e-12);
                }
            }
        }
    }
}

/// The empty selection's sketch (an empty ULL at p = 18) merged on either side of any
/// sketch, of either form, sparse or dense, at any precision, changes nothing.
#[test]
fn empty_ull_at_max_precision_is_a_merge_identity() {
    let empty = Distinct::new(DistinctForm::Ull, MAX_PRECISION).unwrap();
    assert_eq!(empty.estimate().estimate, 0.0);
    assert_eq!(empty.estimate().std_error, 0.0);
    assert_eq!(empty.estimate().upper95, 0.0);
    for form in DistinctForm::ALL {
        for p in [4u8, 12, 13, 14, 18] {
            for n in [0u64, 1, 50, 700, 1300, 5000, 50_000] {
                let s = of_hashes(form, p, &hashes(0..n));
                assert_eq!(merged(&[&s, &empty]), s, "{form} p{p} n{n}, s ∪ ∅");
                assert_eq!(merged(&[&empty, &s]), s, "{form} p{p} n{n}, ∅ ∪ s");
                assert_eq!(
                    merged(&[&empty, &s]).estimate(),
                    s.estimate(),
                    "{form} p{p} n{n}"
                );
            }
        }
    }
}

/// A sparse ULL (including one with more indices than an HLL of its precision keeps
/// sparse) merged into a dense HLL of a smaller precision, and the other way round.
#[test]
fn sparse_ull_into_dense_hll_of_smaller_precision() {
    for (ull_p, ull_n) in [
        (13u8, 40u64),
        (13, 1500),
        (13, 1900),
        (14, 4000),
        (18, 20_000),
    ] {
        let u = of_hashes(DistinctForm::Ull, ull_p, &hashes(0..ull_n));
        assert!(u.is_sparse(), "p{ull_p} n{ull_n}");
        for hll_p in [10u8, 12] {
            let h = of_hashes(DistinctForm::Hll, hll_p, &hashes(1_000_000..1_010_000));
            assert!(!h.is_sparse());
            let all: Vec<u64> = hashes(0..ull_n)
                .into_iter()
                .chain(hashes(1_000_000..1_010_000))
                .collect();
            let expected = of_hashes(DistinctForm::Hll, hll_p, &all);
            assert_eq!(
                merged(&[&h, &u]),
                expected,
                "hll p{hll_p} ∪ ull p{ull_p} n{ull_n}"
            );
            assert_eq!(
                merged(&[&u, &h]),
                expected,
                "ull p{ull_p} n{ull_n} ∪ hll p{hll_p}"
            );
        }
    }
}

/// How the aggregator merges a range: hourly rows per day (per server, then all servers),
/// then the days; rollups store the day merges and a later query merges those. Any tree
/// gives the bytes of one flat merge of every hourly row.
#[test]
fn day_rollups_then_days_equal_one_flat_merge() {
    // 3 days × 24 hours × 2 servers; the form and precision switch at different hours on
    // each server (HLL 14 → ULL 13; one server briefly at ULL 12).
    let mut rows = Vec::new();
    for day in 0..3u64 {
        for hour in 0..24u64 {
            for server in 0..2u64 {
                let t = day * 24 + hour;
                let (form, p) = match (server, t) {
                    (0, t) if t < 30 => (DistinctForm::Hll, 14),
                    (1, t) if t < 10 => (DistinctForm::Hll, 14),
                    (1, t) if (40..44).contains(&t) => (DistinctForm::Ull, 12),
                    _ => (DistinctForm::Ull, 13),
                };
                let n = [0u64, 20, 400, 1200, 3000][((t * 7 + server * 3) % 5) as usize];
                let base = t * 1_000 + server * 500_000;
                rows.push((
                    (day, hour, server),
                    of_hashes(form, p, &hashes(base..base + n)),
                ));
            }
        }
    }
    let flat = merged(&rows.iter().map(|(_, s)| s).collect::<Vec<_>>());
    // Per day: each server's hours, then the servers; then the days.
    let mut days = Vec::new();
    for day in 0..3u64 {
        let mut servers = Vec::new();
        for server in 0..2u64 {
            let parts: Vec<&Distinct> = rows
                .iter()
                .filter(|((d, _, s), _)| *d == day && *s == server)
                .map(|(_, s)| s)
                .collect();
            servers.push(merged(&parts));
        }
        days.push(merged(&servers.iter().collect::<Vec<_>>()));
    }
    let by_days = merged(&days.iter().rev().collect::<Vec<_>>());
    assert_eq!(hex(&by_days), hex(&flat));
    assert_eq!(by_days.estimate(), flat.estimate());
    assert_eq!(flat.form(), DistinctForm::Hll);
    assert_eq!(flat.precision(), 12);
}

/// Random triples of forms and precisions 10..=18, each operand of up to 12,000 hashes
/// (the proptests stop at precision 12 and 300 hashes): every order, one result, the
/// sketch of the union in the rule's form and precision.
#[test]
fn random_triples_at_shipping_precisions_follow_the_rule() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    for _ in 0..40 {
        let ops: Vec<(DistinctForm, u8, Vec<u64>)> = (0..3)
            .map(|_| {
                let form = if next() % 2 == 0 {
                    DistinctForm::Hll
                } else {
                    DistinctForm::Ull
                };
                let p = 10 + (next() % 9) as u8;
                let n = [5u64, 200, 1500, 3000, 12_000][(next() % 5) as usize];
                let start = next() % 20_000;
                (form, p, hashes(start..start + n))
            })
            .collect();
        let s: Vec<Distinct> = ops.iter().map(|(f, p, h)| of_hashes(*f, *p, h)).collect();
        let form = if ops.iter().any(|o| o.0 == DistinctForm::Hll) {
            DistinctForm::Hll
        } else {
            DistinctForm::Ull
        };
        let p = ops.iter().map(|o| o.1).min().unwrap();
        let all: Vec<u64> = ops.iter().flat_map(|o| o.2.iter().copied()).collect();
        let expected = of_hashes(form, p, &all);
        for order in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            let got = merged(&[&s[order[0]], &merged(&[&s[order[1]], &s[order[2]]])]);
            assert_eq!(
                hex(&got),
                hex(&expected),
                "{:?} order {order:?}",
                ops.iter()
                    .map(|o| (o.0, o.1, o.2.len()))
                    .collect::<Vec<_>>()
            );
        }
    }
}
