//! What the fuzz targets share: building frames the fuzzer could not (the xxh3 checksum
//! is beyond any mutation), and the checks every decoded sketch must pass.
//!
//! Every check here is a property the aggregator or the agent relies on; a failed
//! assertion is reported by libFuzzer as a crash, exactly like a panic in the library.

use hourglass_sketch::format::{self, Kind};
use hourglass_rpc::series::Series;
use hourglass_sketch::Sketch;
use hourglass_sketch::bloom::Bloom;
use hourglass_sketch::distinct::Distinct;
use hourglass_sketch::frequency::Frequency;
use hourglass_sketch::hll::{self, Hll};

/// `body` in a valid frame of `kind`: header, body, checksum.
pub fn frame(kind: Kind, body: &[u8]) -> Vec<u8> {
    format::encode_frame(kind, body)
}

/// The kind a selector byte stands for: every byte means one of the three kinds.
pub fn kind_of(selector: u8) -> Kind {
    Kind::ALL[usize::from(selector) % Kind::ALL.len()]
}

/// `bytes` followed by their xxh3-64: a frame (or checkpoint) whose header and body are
/// the fuzzer's, checksum included, so mutations get past the checksum to what follows.
pub fn with_checksum(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 8);
    out.extend_from_slice(bytes);
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(bytes).to_le_bytes());
    out
}

/// The input of the frame targets: a mode byte, then either a whole frame as it came
/// (mode even) or a frame without its checksum, which is appended (mode odd).
pub fn frame_input(data: &[u8]) -> Option<Vec<u8>> {
    let (&mode, rest) = data.split_first()?;
    Some(if mode % 2 == 0 {
        rest.to_vec()
    } else {
        with_checksum(rest)
    })
}

/// Decodes `bytes` every way the library can and checks that the ways agree:
///
/// - `Sketch::validate` accepts exactly what `Sketch::decode` accepts, with the same kind;
/// - each kind's own decoder (`Distinct::decode`, `Frequency::decode`, `Bloom::decode`)
///   gives the same sketch for its kind and an error for any other, and the strict
///   `Hll::decode` gives the same HyperLogLog and an error for anything else, an
///   UltraLogLog included;
/// - a sketch that decoded passes [`check_sketch`].
///
/// Returns the decoded sketch.
pub fn check_frame(bytes: &[u8]) -> Option<Sketch> {
    let decoded = Sketch::decode(bytes);
    let validated = Sketch::validate(bytes);
    assert_eq!(
        decoded.as_ref().ok().map(Sketch::kind),
        validated.as_ref().ok().copied(),
        "Sketch::validate disagrees with Sketch::decode: decode {decoded:?}, validate {validated:?}"
    );
    let distinct = Distinct::decode(bytes);
    let hll = Hll::decode(bytes);
    let frequency = Frequency::decode(bytes);
    let bloom = Bloom::decode(bytes);
    match &decoded {
        Ok(Sketch::Distinct(s)) => assert_eq!(distinct.as_ref().ok(), Some(s), "Distinct::decode"),
        _ => assert!(
            distinct.is_err(),
            "Distinct::decode accepted what Sketch::decode did not"
        ),
    }
    match &decoded {
        Ok(Sketch::Distinct(Distinct::Hll(s))) => {
            assert_eq!(hll.as_ref().ok(), Some(s), "Hll::decode")
        }
        _ => assert!(
            hll.is_err(),
            "Hll::decode accepted what Sketch::decode did not take for a HyperLogLog"
        ),
    }
    match &decoded {
        Ok(Sketch::Frequency(s)) => {
            assert_eq!(frequency.as_ref().ok(), Some(s), "Frequency::decode")
        }
        _ => assert!(
            frequency.is_err(),
            "Frequency::decode accepted what Sketch::decode did not"
        ),
    }
    match &decoded {
        Ok(Sketch::Membership(s)) => assert_eq!(bloom.as_ref().ok(), Some(s), "Bloom::decode"),
        _ => assert!(
            bloom.is_err(),
            "Bloom::decode accepted what Sketch::decode did not"
        ),
    }
    let sketch = decoded.ok()?;
    check_sketch(&sketch);
    Some(sketch)
}

/// The checks for a sketch built from untrusted bytes:
///
/// - it re-encodes to bytes that decode to an equal sketch, and those bytes are canonical
///   (encoding again gives the same bytes) and pass `Sketch::validate`;
/// - every query the aggregator answers from it returns, with no panic and no NaN where a
///   number is promised;
/// - an item inserted into it (as the agent does to a sketch restored from its
///   checkpoint) leaves a sketch that still encodes to bytes that decode.
pub fn check_sketch(sketch: &Sketch) {
    check_round_trip(sketch);
    match sketch {
        Sketch::Distinct(s) => {
            check_estimate(s);
            // Queries over sketches of different precisions fold to the smallest.
            let folded = s
                .fold_to(hll::MIN_PRECISION)
                .expect("folding to the minimum");
            check_estimate(&folded);
            check_round_trip(&Sketch::Distinct(folded));
            // Overlap and retention questions read the HyperLogLog of either form.
            let hll = Distinct::Hll(s.to_hll());
            check_estimate(&hll);
            check_round_trip(&Sketch::Distinct(hll));
        }
        Sketch::Frequency(s) => {
            let estimate = s.estimate(b"fuzz");
            assert!(estimate.estimate <= estimate.total || estimate.total == u64::MAX);
            // Only the totals of the two parts are checked against each other on decode,
            // so a hostile sketch may rank nonsense; ranking must still not panic.
            let _ = s.top_k(10);
        }
        Sketch::Membership(s) => {
            let _ = s.contains(b"fuzz");
            let fill = s.fill_ratio();
            assert!((0.0..=1.0).contains(&fill), "fill ratio {fill}");
            let fpr = s.estimated_fpr();
            assert!(
                (0.0..=1.0).contains(&fpr),
                "estimated false-positive rate {fpr}"
            );
            let _ = s.health();
        }
    }
    let mut inserted = sketch.clone();
    inserted
        .insert(b"fuzz")
        .expect("a short item is accepted by every kind");
    check_round_trip(&inserted);
}

/// `decode(encode(x)) == x`, encoding is canonical, and validation agrees.
///
/// A frequency sketch holding more than `capacity` frequent items (allowed between
/// purges, up to twice as many, after inserts) encodes its compacted summary
/// (`FrequentItems::compact`), so for it only the Count-Min part and the totals must come
/// back equal.
pub fn check_round_trip(sketch: &Sketch) {
    let encoded = sketch.encode();
    let again = match Sketch::decode(&encoded) {
        Ok(s) => s,
        Err(e) => panic!("a sketch encodes to bytes that do not decode: {e}; sketch {sketch:?}"),
    };
    match (sketch, &again) {
        (Sketch::Frequency(x), Sketch::Frequency(y))
            if x.frequent_items().tracked() > x.frequent_items().capacity() as usize =>
        {
            assert_eq!(x.count_min(), y.count_min(), "decode(encode(x)) != x");
            assert_eq!(x.frequent_items().total(), y.frequent_items().total());
            assert!(y.frequent_items().tracked() <= y.frequent_items().capacity() as usize);
        }
        _ => assert_eq!(&again, sketch, "decode(encode(x)) != x"),
    }
    assert_eq!(again.encode(), encoded, "encoding is not canonical");
    assert_eq!(Sketch::validate(&encoded).ok(), Some(sketch.kind()));
}

fn check_estimate(s: &Distinct) {
    let e = s.estimate();
    assert!(
        e.estimate.is_finite() && e.estimate >= 0.0,
        "distinct estimate {e:?} of {s:?}"
    );
    assert!(
        e.std_error.is_finite() && e.std_error >= 0.0,
        "standard error {e:?}"
    );
    assert!(!e.lower95.is_nan() && !e.upper95.is_nan(), "interval {e:?}");
}

/// Merges `b` into a copy of `a` and checks the outcome:
///
/// - merging never panics: it is `Ok` or an error;
/// - a failed merge leaves the sketch as it was;
/// - a merged sketch passes [`check_round_trip`] (the aggregator stores and exports
///   merges);
/// - distinct and membership merges commute exactly (registers take the maximum, bits
///   the OR), so `a ∪ b` and `b ∪ a` encode to the same bytes; frequency merges commute
///   in their Count-Min part and their totals.
pub fn check_merge(a: &Sketch, b: &Sketch) {
    let mut ab = a.clone();
    let result_ab = ab.merge(b);
    if result_ab.is_err() {
        assert_eq!(&ab, a, "a failed merge changed the sketch");
        return;
    }
    check_round_trip(&ab);
    let mut ba = b.clone();
    let result_ba = ba.merge(a);
    assert!(
        result_ba.is_ok(),
        "a ∪ b merges but b ∪ a fails: {result_ba:?}"
    );
    check_round_trip(&ba);
    match (&ab, &ba) {
        (Sketch::Frequency(x), Sketch::Frequency(y)) => {
            assert_eq!(
                x.count_min(),
                y.count_min(),
                "count-min merge does not commute"
            );
            assert_eq!(x.total(), y.total());
        }
        _ => assert_eq!(ab.encode(), ba.encode(), "merge does not commute"),
    }
}

/// The checks for a series that passed validation: its wire form and its text form
/// (what the agent's checkpoint stores) both give the same series back.
pub fn check_series(series: &Series) {
    let wire = hourglass_rpc::proto::v1::Series::from(series);
    assert_eq!(
        Series::try_from(&wire).as_ref(),
        Ok(series),
        "wire form does not round-trip"
    );
    let text = series.to_string();
    assert_eq!(
        Series::parse(&text).as_ref(),
        Ok(series),
        "text form {text:?} does not round-trip"
    );
}

/// An agent configuration for fuzzing: every kind, sketches of a few hundred bytes, and
/// at most 4 series, so a run allocates little and an input can reach the series limit.
pub fn small_config() -> hourglass_agent::Config {
    let mut config = hourglass_agent::Config {
        default_kinds: Kind::ALL.to_vec(),
        ..Default::default()
    };
    config.defaults.precision = hll::MIN_PRECISION;
    config.defaults.epsilon = 0.25;
    config.defaults.delta = 0.5;
    config.defaults.capacity = 16;
    config.defaults.fpr = 0.1;
    config.limits.max_series = 4;
    config
        .validate()
        .expect("the fuzzing configuration is valid");
    config
}
