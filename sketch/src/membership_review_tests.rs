//! Review of commit 9145fe1 (membership over a range): failing tests for suspected
//! wrong answers in `membership`, and checks of what was found sound.

use crate::Sketch;
use crate::bloom::Bloom;
use crate::format::{Kind, encode_frame};
use crate::membership::{RangeAnswer, all_maybe_probability, lookup, lookup_hash};
use proptest::prelude::*;

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

/// SUSPICION: `all_maybe_probability` multiplies filters of different sizes "as
/// independent", but positions are reduced with Lemire's multiply-shift
/// (`hash::nth_position`): an item's i-th position is at the same *relative* place in
/// every filter, whatever its size (with m₂ = 2·m₁, p₁ = p₂ >> 1 exactly). Filters of
/// different sizes that share items (the regular users; a metric resized when it adopts
/// `membership_range`, or servers with different capacities) therefore have strongly
/// correlated false positives, and the product understates the chance that all the
/// positives are false by orders of magnitude: a "seen in both" answer claims far more
/// confidence than it has. This reaches `all_false_probability` / `estimated_fpr` of
/// Query/Membership through `planner::combine_rows`.
#[test]
fn review_mixed_size_filters_all_false_probability_is_not_understated() {
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
    /// SOUND (expected to pass): a validly framed membership body with arbitrary field
    /// values (what a malicious peer can send: the checksum is xxh3, not a MAC) decodes to
    /// an error or to a filter every membership function handles without panicking.
    #[test]
    fn review_crafted_filters_never_panic(
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
