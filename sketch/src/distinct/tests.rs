//! Tests of the distinct kind's two forms together: names, dispatch on the representation
//! byte, pinned frames of the UltraLogLog form, and the merge laws across forms and
//! precisions as properties.

use super::*;
use crate::hll::MAX_PRECISION;
use crate::test_support::{apply, mutation};
use proptest::prelude::*;

mod shipped_merges;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn of_items<'a>(
    form: DistinctForm,
    precision: u8,
    items: impl IntoIterator<Item = &'a str>,
) -> Distinct {
    let mut sketch = Distinct::new(form, precision).unwrap();
    items
        .into_iter()
        .for_each(|item| sketch.insert(item.as_bytes()));
    sketch
}

fn of_hashes(form: DistinctForm, precision: u8, hashes: &[u64]) -> Distinct {
    let mut sketch = Distinct::new(form, precision).unwrap();
    hashes.iter().for_each(|&h| sketch.insert_hash(h));
    sketch
}

fn merged(a: &Distinct, b: &Distinct) -> Distinct {
    let mut out = a.clone();
    out.merge(b).unwrap();
    out
}

fn invalid_field(result: Result<Distinct, DecodeError>) -> &'static str {
    match result {
        Err(DecodeError::Invalid { field, .. }) => field,
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

#[test]
fn forms_parse_and_print_by_name() {
    for form in DistinctForm::ALL {
        assert_eq!(form.name().parse::<DistinctForm>().unwrap(), form);
        assert_eq!(form.to_string(), form.name());
    }
    assert_eq!("ull".parse::<DistinctForm>().unwrap(), DistinctForm::Ull);
    let err = "hyperloglog".parse::<DistinctForm>().unwrap_err();
    assert_eq!(err.parameter, "distinct form");
    assert!(err.to_string().contains("\"hll\""), "{err}");
    assert!(
        "ULL".parse::<DistinctForm>().is_err(),
        "names are lower case"
    );
}

#[test]
fn new_builds_the_form_asked_for_and_checks_the_precision() {
    for form in DistinctForm::ALL {
        let sketch = Distinct::new(form, 10).unwrap();
        assert_eq!(sketch.form(), form);
        assert_eq!(sketch.precision(), 10);
        assert!(sketch.is_sparse());
        assert_eq!(sketch.estimate().estimate, 0.0);
        for bad in [3, 19] {
            assert_eq!(Distinct::new(form, bad).unwrap_err().parameter, "precision");
        }
    }
}

/// Pins the whole frame of a sparse UltraLogLog: the body of docs/FORMAT.md's golden
/// example in a distinct frame, with its checksum.
#[test]
fn golden_frame_ull_sparse() {
    let sketch = of_items(DistinctForm::Ull, 14, ["a", "b", "c"]);
    assert_eq!(
        hex(&sketch.encode()),
        concat!(
            "4847534b0101000014000000", // magic, version 1, kind distinct, flags, body length 20
            "0e190200",                 // precision 14, sparse precision 25, ULL sparse, reserved
            "03000000",                 // three tokens
            "0119f52d4452533842911671", // the tokens, index << 6 | rank, ascending
            "b61ca374a727f614",         // checksum: xxh3-64 of the bytes before it
        )
    );
    assert_eq!(Distinct::decode(&sketch.encode()).unwrap(), sketch);
}

/// Pins the whole frame of a dense UltraLogLog at precision 4: 16 register bytes.
#[test]
fn golden_frame_ull_dense() {
    let items: Vec<String> = (0..100).map(|i| i.to_string()).collect();
    let sketch = of_items(DistinctForm::Ull, 4, items.iter().map(String::as_str));
    assert!(!sketch.is_sparse());
    assert_eq!(
        hex(&sketch.encode()),
        concat!(
            "4847534b0101000014000000", // magic, version 1, kind distinct, flags, body length 20
            "04190300",                 // precision 4, sparse precision 25, ULL dense, reserved
            "0f18200a131813202c110a141504180f", // 16 registers, a byte each
            "8dd03c99e9605201",         // checksum
        )
    );
    assert_eq!(Distinct::decode(&sketch.encode()).unwrap(), sketch);
}

/// The HyperLogLog frames of docs/FORMAT.md decode as HyperLogLogs, unchanged.
#[test]
fn hll_golden_frames_still_decode_as_hll() {
    let sparse = of_items(DistinctForm::Hll, 14, ["a", "b", "c"]);
    assert_eq!(
        hex(&sparse.encode()),
        "4847534b0101000014000000\
         0e190000030000000119f52d4452533842911671\
         4d59747628fa7cf6"
    );
    let decoded = Distinct::decode(&sparse.encode()).unwrap();
    assert_eq!(decoded.form(), DistinctForm::Hll);
    assert_eq!(decoded, sparse);
}

#[test]
fn frames_decode_to_their_form_and_hll_decode_stays_strict() {
    for form in DistinctForm::ALL {
        for n in [0, 3, 5000] {
            let items: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
            let sketch = of_items(form, 10, items.iter().map(String::as_str));
            let bytes = sketch.encode();
            let decoded = Distinct::decode(&bytes).unwrap();
            assert_eq!(decoded.form(), form);
            assert_eq!(decoded, sketch);
            assert_eq!(
                crate::Sketch::decode(&bytes).unwrap(),
                crate::Sketch::Distinct(sketch.clone())
            );
            assert_eq!(crate::Sketch::validate(&bytes).unwrap(), Kind::Distinct);
            let strict = Hll::decode(&bytes);
            match form {
                DistinctForm::Hll => assert_eq!(strict.unwrap(), sketch.to_hll()),
                DistinctForm::Ull => match strict {
                    Err(DecodeError::Invalid { field, .. }) => assert_eq!(field, "representation"),
                    other => panic!("Hll::decode of an UltraLogLog frame: {other:?}"),
                },
            }
        }
    }
    let other_kind = crate::bloom::Bloom::new(10, 0.1).unwrap().encode();
    assert_eq!(
        Distinct::decode(&other_kind).unwrap_err(),
        DecodeError::WrongKind {
            expected: Kind::Distinct,
            found: Kind::Membership
        }
    );
}

#[test]
fn an_unknown_representation_is_named_never_a_panic() {
    let mut body = Vec::new();
    of_items(DistinctForm::Ull, 4, ["x"]).encode_body(&mut body);
    for representation in 4..=255u8 {
        body[2] = representation;
        let err = Distinct::decode_body(&body).unwrap_err();
        assert!(
            err.to_string().contains("2 or 3 (UltraLogLog"),
            "{representation}: {err}"
        );
        assert_eq!(invalid_field(Err(err)), "representation");
        assert!(Distinct::validate_body(&body).is_err());
    }
    // Fields before the representation are checked first, as in either form's reader.
    body[2] = 9;
    body[0] = 30;
    assert_eq!(invalid_field(Distinct::decode_body(&body)), "precision");
    for short in 0..4 {
        assert!(matches!(
            Distinct::decode_body(&body[..short]),
            Err(DecodeError::Truncated { .. }) | Err(DecodeError::Invalid { .. })
        ));
    }
}

/// The lead's bar, in miniature: HyperLogLog rows and UltraLogLog rows of one series merge
/// to the HyperLogLog of the union, with HyperLogLog's error; UltraLogLog rows alone keep
/// UltraLogLog's smaller error.
#[test]
fn mixed_merge_is_the_hll_of_the_union_with_its_error() {
    let users = |range: std::ops::Range<u32>| -> Vec<String> {
        range.map(|u| format!("user-{u}")).collect()
    };
    let (a, b, c) = (
        users(0..40_000),
        users(30_000..70_000),
        users(60_000..100_000),
    );
    fn strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let hll_a = of_items(DistinctForm::Hll, 14, strs(&a));
    let ull_b = of_items(DistinctForm::Ull, 14, strs(&b));
    let ull_c = of_items(DistinctForm::Ull, 12, strs(&c));
    let all: Vec<&str> = strs(&a)
        .into_iter()
        .chain(strs(&b))
        .chain(strs(&c))
        .collect();

    let mixed = merged(&merged(&hll_a, &ull_b), &ull_c);
    let expected = of_items(DistinctForm::Hll, 12, all.iter().copied());
    assert_eq!(mixed.form(), DistinctForm::Hll);
    assert_eq!(mixed, expected);
    let e = mixed.estimate();
    assert_eq!(e, expected.estimate());
    let relative = e.std_error / e.estimate;
    assert!(
        (relative - 1.04 / 64.0).abs() < 1e-9,
        "HLL at p = 12: {relative}"
    );

    let ulls = merged(&ull_b, &ull_c);
    assert_eq!(ulls.form(), DistinctForm::Ull);
    assert_eq!(
        ulls,
        of_items(DistinctForm::Ull, 12, strs(&b).into_iter().chain(strs(&c)))
    );
    let e = ulls.estimate();
    assert!(
        (e.std_error / e.estimate - 0.761 / 64.0).abs() < 1e-3 / 64.0,
        "ULL at p = 12: {}",
        e.std_error / e.estimate
    );
    assert_eq!(
        ulls.into_hll(),
        of_items(DistinctForm::Hll, 12, strs(&b).into_iter().chain(strs(&c))).to_hll()
    );
}

#[test]
fn merging_into_an_ull_from_an_hll_replaces_the_form() {
    let mut ull = of_items(DistinctForm::Ull, 10, ["a", "b"]);
    let hll = of_items(DistinctForm::Hll, 14, ["c"]);
    ull.merge(&hll).unwrap();
    assert_eq!(ull, of_items(DistinctForm::Hll, 10, ["a", "b", "c"]));
    assert_eq!(ull.estimate().estimate.round(), 3.0);
}

#[test]
fn fold_keeps_the_form() {
    for form in DistinctForm::ALL {
        let items: Vec<String> = (0..3000).map(|i| i.to_string()).collect();
        let sketch = of_items(form, 12, items.iter().map(String::as_str));
        let folded = sketch.fold_to(8).unwrap();
        assert_eq!(folded, of_items(form, 8, items.iter().map(String::as_str)));
        assert_eq!(sketch.fold_to(13).unwrap_err().parameter, "precision");
    }
}

#[test]
fn size_bytes_is_the_form_s() {
    let items: Vec<String> = (0..100_000).map(|i| i.to_string()).collect();
    let hll = of_items(DistinctForm::Hll, 14, items.iter().map(String::as_str));
    let ull = of_items(DistinctForm::Ull, 14, items.iter().map(String::as_str));
    assert_eq!(hll.size_bytes(), 1 << 14);
    assert_eq!(ull.size_bytes(), 1 << 14);
    // Encoded, UltraLogLog's byte registers are a third larger than six-bit ones.
    assert_eq!(hll.encode().len(), 20 + 4 + 3 * (1 << 14) / 4);
    assert_eq!(ull.encode().len(), 20 + 4 + (1 << 14));
}

/// A set of hashes with many large update values and shared sparse indices (as in the
/// forms' own tests), in a form and at a precision.
fn operand(max_len: usize) -> impl Strategy<Value = (DistinctForm, u8, Vec<u64>)> {
    (
        prop_oneof![Just(DistinctForm::Hll), Just(DistinctForm::Ull)],
        4u8..=12,
        proptest::collection::vec(
            (any::<u64>(), 0u32..64).prop_map(|(h, zeros)| h & !(u64::MAX >> (64 - zeros.max(1)))),
            0..max_len,
        ),
    )
}

type Operand = (DistinctForm, u8, Vec<u64>);

/// What merging `operands` must give: the sketch of the union, at the smallest precision,
/// a HyperLogLog if any operand is one.
fn union_of(operands: &[&Operand]) -> Distinct {
    let form = if operands.iter().any(|o| o.0 == DistinctForm::Hll) {
        DistinctForm::Hll
    } else {
        DistinctForm::Ull
    };
    let precision = operands.iter().map(|o| o.1).min().unwrap_or(MAX_PRECISION);
    let hashes: Vec<u64> = operands.iter().flat_map(|o| o.2.iter().copied()).collect();
    of_hashes(form, precision, &hashes)
}

fn check_merge_laws(a: &Operand, b: &Operand, c: &Operand) -> Result<(), TestCaseError> {
    let sketch = |o: &Operand| of_hashes(o.0, o.1, &o.2);
    let (sa, sb, sc) = (sketch(a), sketch(b), sketch(c));
    let ab = merged(&sa, &sb);
    prop_assert_eq!(
        hex(&ab.encode()),
        hex(&merged(&sb, &sa).encode()),
        "commutative"
    );
    prop_assert_eq!(hex(&ab.encode()), hex(&union_of(&[a, b]).encode()), "union");
    let ab_c = merged(&ab, &sc);
    let a_bc = merged(&sa, &merged(&sb, &sc));
    prop_assert_eq!(hex(&ab_c.encode()), hex(&a_bc.encode()), "associative");
    prop_assert_eq!(
        hex(&ab_c.encode()),
        hex(&union_of(&[a, b, c]).encode()),
        "union of three"
    );
    let ca_b = merged(&merged(&sc, &sa), &sb);
    prop_assert_eq!(&ca_b, &ab_c, "any order");
    prop_assert_eq!(&merged(&ab_c, &ab_c), &ab_c, "idempotent");
    prop_assert_eq!(&merged(&ab_c, &sa), &ab_c, "absorbs a part");
    prop_assert_eq!(ab_c.estimate(), union_of(&[a, b, c]).estimate());
    Ok(())
}

proptest! {
    /// Commutative, associative, idempotent, and equal to the sketch of the union, for
    /// any mix of forms and precisions, sparse and dense operands.
    #[test]
    fn merge_laws_across_forms_and_precisions(a in operand(300), b in operand(300), c in operand(300)) {
        check_merge_laws(&a, &b, &c)?;
    }

    /// The same at small precisions, where operands of a few hundred hashes are dense.
    #[test]
    fn merge_laws_at_small_precisions(
        forms in proptest::array::uniform3(prop_oneof![Just(DistinctForm::Hll), Just(DistinctForm::Ull)]),
        precision in 4u8..=7,
        a in operand(150), b in operand(150), c in operand(150),
    ) {
        let with = |i: usize, o: Operand| (forms[i], precision.max(o.1 / 2).min(7), o.2);
        check_merge_laws(&with(0, a), &with(1, b), &with(2, c))?;
    }

    #[test]
    fn decode_of_encode_is_identity(o in operand(3000)) {
        let sketch = of_hashes(o.0, o.1, &o.2);
        let bytes = sketch.encode();
        prop_assert_eq!(&Distinct::decode(&bytes).unwrap(), &sketch);
        let mut body = Vec::new();
        sketch.encode_body(&mut body);
        prop_assert_eq!(&Distinct::decode_body(&body).unwrap(), &sketch);
        prop_assert!(Distinct::validate_body(&body).is_ok());
    }

    /// Any bytes: an error or a sketch, never a panic; validation agrees with decoding;
    /// whatever decodes is canonical.
    #[test]
    fn decode_of_arbitrary_bodies_never_panics(
        representation in 0u8..6,
        mut bytes in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        // Often a plausible header, so that the bodies of each form are reached.
        if bytes.len() >= 4 && representation < 5 {
            bytes[0] = 4 + bytes[0] % 3;
            bytes[1] = 25;
            bytes[2] = representation;
            bytes[3] = 0;
        }
        let decoded = Distinct::decode_body(&bytes);
        prop_assert_eq!(decoded.is_ok(), Distinct::validate_body(&bytes).is_ok());
        if let Ok(sketch) = decoded {
            let mut again = Vec::new();
            sketch.encode_body(&mut again);
            prop_assert_eq!(again, bytes);
        }
    }

    /// Valid encodings of either form, damaged: errors or sketches that are safe to use.
    #[test]
    fn decode_of_mutated_encodings_never_panics(
        o in operand(100),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let (form, precision) = (o.0, o.1.min(6));
        let mut body = Vec::new();
        of_hashes(form, precision, &o.2).encode_body(&mut body);
        for m in &mutations {
            apply(&mut body, m);
        }
        let decoded = Distinct::decode_body(&body);
        prop_assert_eq!(decoded.is_ok(), Distinct::validate_body(&body).is_ok());
        if let Ok(sketch) = decoded {
            let _ = sketch.estimate();
            let _ = sketch.to_hll();
            for other_form in DistinctForm::ALL {
                let mut other = of_hashes(other_form, precision, &o.2);
                other.merge(&sketch).unwrap();
                let _ = other.estimate();
            }
        }
    }
}
