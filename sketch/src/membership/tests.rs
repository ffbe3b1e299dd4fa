//! Tests of membership over a range: sizing, lookups without merging, and the all-false
//! probability across filters of one size and of several.

use super::*;
use crate::Sketch;
use crate::format::{Kind, encode_frame};
use proptest::prelude::*;

fn filled(sizing: &RangeSizing, items: impl IntoIterator<Item = u64>) -> Bloom {
    let mut f = sizing.new_filter().unwrap();
    for i in items {
        f.insert(&i.to_le_bytes());
    }
    f
}

#[test]
fn per_filter_rate_inverts_the_range_rate() {
    // 5% over the demo's week: 1 − 0.95^(1/1008) = 5.0886e-5.
    let f = filter_fpr_for(0.05, 1008);
    assert!((f - 5.0886e-5).abs() < 1e-8, "{f}");
    assert!((range_fpr_of(f, 1008) - 0.05).abs() < 1e-12);
    // One filter: the range rate is the filter's.
    assert!((filter_fpr_for(0.01, 1) - 0.01).abs() < 1e-15);
    // Tiny rates keep their precision (1 − (1 − P)^(1/N) computed naively loses it).
    let tiny = filter_fpr_for(1e-9, 1_000_000);
    assert!((tiny / 1e-15 - 1.0).abs() < 1e-6, "{tiny}");
}

#[test]
fn sizing_meets_the_wanted_rate_at_capacity() {
    let s = RangeSizing::for_range(1008, 1300, 0.05).unwrap();
    assert_eq!(s.capacity, 1300);
    assert!(s.range_fpr_at_capacity <= 0.05, "{s:?}");
    assert!(s.range_fpr_at_capacity > 0.045, "not oversized: {s:?}");
    assert_eq!(s.hashes, 14);
    // −ln f / ln²2 ≈ 20.58 bits per item.
    let per_item = s.bits as f64 / 1300.0;
    assert!((20.5..20.8).contains(&per_item), "{per_item}");
    let built = s.new_filter().unwrap();
    assert_eq!((built.bits(), built.hashes()), (s.bits, s.hashes));
    assert_eq!(built.size_bytes() as u64, s.bytes);
}

#[test]
fn sizing_names_bad_parameters() {
    assert_eq!(
        RangeSizing::for_range(0, 10, 0.05).unwrap_err().parameter,
        "filters"
    );
    assert_eq!(
        RangeSizing::for_range(10, 0, 0.05).unwrap_err().parameter,
        "items per filter"
    );
    for p in [0.0, 1.0, -0.1, f64::NAN, f64::INFINITY] {
        assert_eq!(
            RangeSizing::for_range(10, 10, p).unwrap_err().parameter,
            "range false-positive rate",
            "{p}"
        );
    }
    let underflow = RangeSizing::for_range(u64::MAX, 10, 1e-300).unwrap_err();
    assert_eq!(underflow.parameter, "range false-positive rate");
    assert!(
        underflow.to_string().contains("per filter") || underflow.to_string().contains("each"),
        "{underflow}"
    );
    let too_big = RangeSizing::for_range(1000, 1 << 36, 0.01).unwrap_err();
    assert_eq!(too_big.parameter, "capacity");
    assert!(too_big.to_string().contains("limit"), "{too_big}");
}

#[test]
fn present_items_are_found_where_they_were_put() {
    let s = RangeSizing::for_range(20, 100, 0.05).unwrap();
    let filters: Vec<Bloom> = (0..20u64)
        .map(|f| filled(&s, (f * 100)..(f * 100 + 100)))
        .collect();
    for item in 0..2000u64 {
        match lookup(&filters, &item.to_le_bytes()) {
            RangeAnswer::Seen {
                where_,
                position_fprs,
                ..
            } => {
                assert!(where_.contains(&((item / 100) as usize)), "item {item}");
                assert_eq!(position_fprs.len(), where_.len());
            }
            other => panic!("item {item} missed: {other:?}"),
        }
    }
}

#[test]
fn absent_items_are_mostly_definitely_absent() {
    // 20 filters at capacity, sized for 5% over the range: measured within a few σ.
    let s = RangeSizing::for_range(20, 500, 0.05).unwrap();
    let filters: Vec<Bloom> = (0..20u64)
        .map(|f| filled(&s, (f * 1000)..(f * 1000 + 500)))
        .collect();
    let probes = 20_000u64;
    let seen = (0..probes)
        .map(|i| lookup(&filters, &(1u64 << 40 | i).to_le_bytes()))
        .filter(|a| !a.is_definitely_absent())
        .count() as f64;
    let stated = lookup(&filters, b"whatever").range_fpr();
    assert!((0.035..0.06).contains(&stated), "stated {stated}");
    let measured = seen / probes as f64;
    // σ of the measured share: √(p(1−p)/n) ≈ 0.0015; allow 5σ.
    assert!(
        (measured - stated).abs() < 0.008,
        "measured {measured}, stated {stated}"
    );
}

#[test]
fn an_empty_range_says_no_data() {
    let none: [Bloom; 0] = [];
    let a = lookup(&none, b"x");
    assert_eq!(
        a,
        RangeAnswer::DefinitelyAbsent {
            consulted: 0,
            miss_probability: 0.0,
            range_fpr: 0.0
        }
    );
    assert!(a.to_string().contains("no data"), "{a}");
}

#[test]
fn a_saturated_filter_is_flagged_not_trusted() {
    let mut full = Bloom::new(10, 0.01).unwrap();
    for i in 0..100_000u64 {
        full.insert(&i.to_le_bytes());
    }
    assert_eq!(full.estimated_fpr(), 1.0);
    let empty = Bloom::new(10, 0.01).unwrap();
    let filters = [&empty, &full, &empty];
    let a = lookup(&filters, b"never inserted");
    match &a {
        RangeAnswer::Seen {
            where_,
            saturated,
            range_fpr,
            all_false_probability,
            ..
        } => {
            assert_eq!(where_, &vec![1]);
            assert_eq!(saturated, &vec![1]);
            assert_eq!(*range_fpr, 1.0);
            assert_eq!(*all_false_probability, 1.0);
        }
        other => panic!("a saturated filter says maybe, got {other:?}"),
    }
    assert!(a.is_noise());
    let text = a.to_string();
    assert!(
        text.contains("no evidence") && text.contains("so full"),
        "{text}"
    );
    // Its "maybe" does not mask a certain "no" from the others for other items.
    let mut some = Bloom::new(10, 0.01).unwrap();
    some.insert(b"x");
    let b = lookup(&[&some, &full], b"x");
    assert!(!b.is_noise(), "{b}");
}

#[test]
fn combine_multiplies_and_checks_rates() {
    let answers = [
        FilterAnswer {
            maybe_present: true,
            fpr: 0.1,
        },
        FilterAnswer {
            maybe_present: false,
            fpr: 0.2,
        },
        FilterAnswer {
            maybe_present: true,
            fpr: 0.3,
        },
    ];
    let a = combine(&answers).unwrap();
    match a {
        RangeAnswer::Seen {
            consulted,
            where_,
            position_fprs,
            range_fpr,
            all_false_probability,
            all_false_exact,
            saturated,
        } => {
            assert_eq!(consulted, 3);
            assert_eq!(where_, vec![0, 2]);
            assert_eq!(position_fprs, vec![0.1, 0.3]);
            assert!((range_fpr - (1.0 - 0.9 * 0.8 * 0.7)).abs() < 1e-12);
            assert!((all_false_probability - 0.03).abs() < 1e-12);
            assert!(!all_false_exact);
            assert!(saturated.is_empty());
        }
        other => panic!("{other:?}"),
    }
    let none = combine(&[FilterAnswer {
        maybe_present: false,
        fpr: 0.5,
    }])
    .unwrap();
    assert!(matches!(
        none,
        RangeAnswer::DefinitelyAbsent {
            miss_probability: 0.0,
            ..
        }
    ));
    for bad in [f64::NAN, -0.01, 1.5] {
        let err = combine(&[
            answers[0],
            FilterAnswer {
                maybe_present: false,
                fpr: bad,
            },
        ])
        .unwrap_err();
        assert_eq!(err.parameter, "filter false-positive rate");
        assert!(err.to_string().contains("filter 1"), "{err}");
    }
}

/// Filters that share items make false positives come together: the exact figure
/// exceeds the product, and it is what probing measures.
#[test]
fn shared_items_make_false_positives_cluster() {
    let s = RangeSizing::for_range(2, 2000, 0.2).unwrap();
    // Both hold the same 1,500 items and 500 of their own.
    let a = filled(&s, (0..1500).chain(10_000..10_500));
    let b = filled(&s, (0..1500).chain(20_000..20_500));
    let product = a.estimated_fpr() * b.estimated_fpr();
    let exact = all_maybe_probability(&[&a, &b]);
    assert!(exact > 3.0 * product, "exact {exact}, product {product}");
    let probes = 400_000u64;
    let both = (0..probes)
        .map(|i| (1u64 << 50 | i).to_le_bytes())
        .filter(|item| a.contains(item) && b.contains(item))
        .count() as f64;
    let measured = both / probes as f64;
    // Hundreds of double positives: ±15% covers several σ.
    assert!(
        (measured / exact - 1.0).abs() < 0.15,
        "measured {measured}, exact {exact}, product {product}"
    );
}

#[test]
fn fewer_hashes_use_a_prefix_of_the_positions() {
    // Same bits, different hash counts: 64 bits each, k = 7 and k = 4.
    let mut a = Bloom::new(6, 0.01).unwrap();
    let mut b = Bloom::new(10, 0.05).unwrap();
    for i in 0..6u64 {
        a.insert(&i.to_le_bytes());
        b.insert(&(i + 100).to_le_bytes());
    }
    assert_eq!(
        all_maybe_probability(&[&a]),
        a.estimated_fpr(),
        "one filter alone is fill^k"
    );
    if a.bits() == b.bits() && a.hashes() != b.hashes() {
        let (hi, lo) = if a.hashes() > b.hashes() {
            (&a, &b)
        } else {
            (&b, &a)
        };
        let m = a.bits() as f64;
        let both: u64 = hi
            .words()
            .iter()
            .zip(lo.words())
            .map(|(x, y)| u64::from((x & y).count_ones()))
            .sum();
        let expected = (both as f64 / m).powi(lo.hashes() as i32)
            * hi.fill_ratio().powi((hi.hashes() - lo.hashes()) as i32);
        let got = all_maybe_probability(&[&a, &b]);
        assert!((got - expected).abs() < 1e-15, "{got} vs {expected}");
    } else {
        panic!(
            "test setup: expected equal bits and different hash counts, got {}/{} and {}/{}",
            a.bits(),
            a.hashes(),
            b.bits(),
            b.hashes()
        );
    }
}

proptest! {
    /// Whatever the range, the filter built meets the wanted range rate at capacity,
    /// and is not much larger than the textbook size for the per-filter rate.
    #[test]
    fn sizing_is_sufficient_and_tight(
        filters in 1u64..100_000,
        items in 1u64..200_000,
        range_fpr in 1e-6f64..0.9,
    ) {
        let s = RangeSizing::for_range(filters, items, range_fpr).unwrap();
        prop_assert!(s.range_fpr_at_capacity <= range_fpr * (1.0 + 1e-12), "{:?}", s);
        prop_assert!(s.fpr <= filter_fpr_for(range_fpr, filters));
        let f = filter_fpr_for(range_fpr, filters);
        let textbook = -(items as f64) * f.ln() / std::f64::consts::LN_2.powi(2);
        prop_assert!((s.bits as f64) <= textbook * 1.02 + 128.0, "{:?} against {}", s, textbook);
    }

    /// The range answer's figures are consistent: bracketing, orders and certainty.
    #[test]
    fn combined_figures_are_consistent(
        answers in prop::collection::vec((any::<bool>(), 0.0f64..=1.0), 0..60),
    ) {
        let answers: Vec<FilterAnswer> = answers
            .into_iter()
            .map(|(maybe_present, fpr)| FilterAnswer { maybe_present, fpr })
            .collect();
        let a = combine(&answers).unwrap();
        prop_assert_eq!(a.consulted(), answers.len());
        prop_assert!((0.0..=1.0).contains(&a.range_fpr()));
        match a {
            RangeAnswer::DefinitelyAbsent { miss_probability, .. } => {
                prop_assert_eq!(miss_probability, 0.0);
                prop_assert!(answers.iter().all(|x| !x.maybe_present));
            }
            RangeAnswer::Seen { where_, all_false_probability, range_fpr, position_fprs, saturated, .. } => {
                prop_assert!(!where_.is_empty());
                prop_assert!(where_.windows(2).all(|w| w[0] < w[1]));
                prop_assert!(where_.iter().all(|&i| answers[i].maybe_present));
                prop_assert_eq!(where_.len(), answers.iter().filter(|x| x.maybe_present).count());
                // All of these false is no likelier than any one being false.
                let least = position_fprs.iter().copied().fold(1.0, f64::min);
                prop_assert!(all_false_probability <= least + 1e-12);
                prop_assert!(all_false_probability <= range_fpr + 1e-12);
                prop_assert!(saturated.iter().all(|i| answers[*i].fpr >= SATURATED_FPR));
            }
        }
    }

    /// A lookup finds every item inserted, in exactly the filters that hold it (and
    /// perhaps others), and the exact all-false figure never exceeds the least rate.
    #[test]
    fn lookup_never_misses(
        contents in prop::collection::vec(prop::collection::vec(0u64..500, 0..150), 1..8),
        probe in 0u64..500,
    ) {
        let s = RangeSizing::for_range(contents.len() as u64, 100, 0.1).unwrap();
        let filters: Vec<Bloom> = contents.iter().map(|c| filled(&s, c.iter().copied())).collect();
        let holders: Vec<usize> = contents.iter().enumerate().filter(|(_, c)| c.contains(&probe)).map(|(i, _)| i).collect();
        match lookup(&filters, &probe.to_le_bytes()) {
            RangeAnswer::DefinitelyAbsent { .. } => prop_assert!(holders.is_empty()),
            RangeAnswer::Seen { where_, position_fprs, all_false_probability, all_false_exact, .. } => {
                prop_assert!(holders.iter().all(|h| where_.contains(h)));
                prop_assert!(all_false_exact);
                let least = position_fprs.iter().copied().fold(1.0, f64::min);
                prop_assert!(all_false_probability <= least + 1e-12);
            }
        }
    }
}

/// Two filters of the same items and the same hash count, the second twice as many bits.
fn doubled_pair(fpr: f64) -> (Bloom, Bloom) {
    for n in 200u64..20_000 {
        let a = Bloom::new(n, fpr).unwrap();
        let b = Bloom::new(2 * n, fpr).unwrap();
        if b.bits() == 2 * a.bits() && a.hashes() == b.hashes() {
            return (a, b);
        }
    }
    panic!("test setup: no doubled pair found");
}

/// (stated all-false probability, measured share of absent probes both say "maybe",
/// probes where b said "maybe" but a did not)
fn stated_and_measured(a: &Bloom, b: &Bloom, probes: u64) -> (f64, f64, u64) {
    let stated = all_maybe_probability(&[a, b]);
    let mut both = 0u64;
    let mut b_not_a = 0u64;
    for i in 0..probes {
        let item = (1u64 << 45 | i).to_le_bytes();
        let (ia, ib) = (a.contains(&item), b.contains(&item));
        both += u64::from(ia && ib);
        b_not_a += u64::from(ib && !ia);
    }
    (stated, both as f64 / probes as f64, b_not_a)
}

/// Filters of different sizes must not be multiplied as independent: positions are reduced
/// with Lemire's multiply-shift (`hash::nth_position`), so an item's i-th position is at
/// the same *relative* place in every filter, whatever its size (with m₂ = 2·m₁,
/// p₁ = p₂ >> 1 exactly). Filters of different sizes that share items (the regular users;
/// a metric resized when it adopts `membership_range`, or servers with different
/// capacities) have strongly correlated false positives; the stated chance that all the
/// positives are false (what `all_false_probability` / `estimated_fpr` of
/// Query/Membership report) stays within twice the measured one.
#[test]
fn mixed_size_filters_all_false_probability_is_not_understated() {
    let (mut a, mut b) = doubled_pair(0.05);
    for i in 0..a.capacity() {
        a.insert(&i.to_le_bytes());
        b.insert(&i.to_le_bytes());
    }
    let (stated, measured, b_not_a) = stated_and_measured(&a, &b, 200_000);

    // Not an exact multiple: 1,000 items at 5% and the same 1,000 in a filter for 1,370.
    let mut c = Bloom::new(1000, 0.05).unwrap();
    let mut d = Bloom::new(1370, 0.05).unwrap();
    for i in 0..1000u64 {
        c.insert(&i.to_le_bytes());
        d.insert(&i.to_le_bytes());
    }
    let (stated2, measured2, _) = stated_and_measured(&c, &d, 200_000);

    // What the answer states for an absent item both say "maybe" to.
    let lookup_stated = (0..200_000u64)
        .map(|i| (1u64 << 45 | i).to_le_bytes())
        .find(|item| a.contains(item) && b.contains(item))
        .map(|item| match lookup(&[&a, &b], &item) {
            RangeAnswer::Seen {
                all_false_probability,
                ..
            } => all_false_probability,
            other => panic!("{other:?}"),
        });
    assert!(
        measured <= 2.0 * stated && measured2 <= 2.0 * stated2,
        "doubled sizes ({} / {} bits, k {}): stated all-false {stated:.3e} (lookup states {lookup_stated:?}), \
         measured {measured:.3e} ({:.0}x; b said maybe without a {b_not_a} times); \
         1000 vs 1370 capacity ({} / {} bits): stated {stated2:.3e}, measured {measured2:.3e} ({:.0}x)",
        a.bits(),
        b.bits(),
        a.hashes(),
        measured / stated,
        c.bits(),
        d.bits(),
        measured2 / stated2,
    );
}

proptest! {
    /// A validly framed membership body with arbitrary field
    /// values (what a malicious peer can send: the checksum is xxh3, not a MAC) decodes to
    /// an error or to a filter every membership function handles without panicking.
    #[test]
    fn crafted_filters_never_panic(
        capacity in any::<u64>(),
        fpr_bits in any::<u64>(),
        words in 0u64..40,
        extra in 0u64..3,
        hashes in any::<u8>(),
        fill in any::<u64>(),
        hash in any::<u64>(),
    ) {
        let mut body = Vec::new();
        body.extend_from_slice(&capacity.to_le_bytes());
        body.extend_from_slice(&f64::from_bits(fpr_bits).to_le_bytes());
        body.extend_from_slice(&(words * 64 + extra).to_le_bytes());
        body.push(hashes);
        for w in 0..words {
            body.extend_from_slice(&fill.rotate_left(w as u32).to_le_bytes());
        }
        let frame = encode_frame(Kind::Membership, &body);
        if let Ok(Sketch::Membership(f)) = Sketch::decode(&frame) {
            let _ = f.contains_hash(hash);
            prop_assert!((0.0..=1.0).contains(&f.estimated_fpr()));
            let _ = f.health();
            let ok = Bloom::new(10, 0.01).unwrap();
            let p = all_maybe_probability(&[&f, &ok, &f]);
            prop_assert!((0.0..=1.0).contains(&p));
            let _ = lookup_hash(&[&f, &ok], hash);
        }
    }
}
