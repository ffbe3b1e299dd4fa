//! The hourly values' tuned ZSTD compressor (values.rs `value_compressor`:
//! fast strategy, TargetLength 1000, MinMatch 7, HashLog 6, WindowLog 10, literal
//! compression forced on): every value round-trips, old values still read, nothing
//! stored grows beyond the raw frame.

use super::values::{hourly_sketch, hourly_value, stored_version};
use hourglass_sketch::Sketch;
use hourglass_sketch::distinct::Distinct;

const ZSTD: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn ull(precision: u8, n: u64, seed: u64) -> Vec<u8> {
    let mut s = hourglass_sketch::ull::Ull::new(precision).unwrap();
    for i in 0..n {
        s.insert(&(i ^ (seed << 40)).to_le_bytes());
    }
    Sketch::Distinct(Distinct::Ull(s)).encode()
}

fn hll(precision: u8, n: u64) -> Vec<u8> {
    let mut s = hourglass_sketch::hll::Hll::new(precision).unwrap();
    for i in 0..n {
        s.insert(&i.to_le_bytes());
    }
    s.encode()
}

fn bloom(capacity: u64, n: u64) -> Vec<u8> {
    let mut b = hourglass_sketch::bloom::Bloom::new(capacity, 0.01).unwrap();
    for i in 0..n {
        b.insert(&i.to_le_bytes());
    }
    b.encode()
}

/// Many frames: sparse and dense sketches of every precision, large Bloom filters (MiBs,
/// far beyond the 1 KiB window), incompressible noise, runs, single bytes.
fn frames() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for p in [4u8, 8, 10, 12, 13, 14, 16, 18] {
        for n in [0u64, 1, 50, 1u64 << (p - 2), 3u64 << p] {
            out.push((format!("ull p{p} n{n}"), ull(p, n, u64::from(p))));
        }
        out.push((format!("hll p{p}"), hll(p, 2u64 << p)));
    }
    out.push(("bloom 1M half".into(), bloom(1_000_000, 500_000)));
    out.push(("bloom 3M sparse".into(), bloom(3_000_000, 1000)));
    let mut state = 5;
    let noise: Vec<u8> = (0..300_000).map(|_| splitmix(&mut state) as u8).collect();
    out.push(("noise".into(), noise.clone()));
    let mut framed_noise = b"HGSK".to_vec();
    framed_noise.extend_from_slice(&noise[..5000]);
    out.push(("HGSK noise".into(), framed_noise));
    // Low-entropy bytes with no repeats worth a match: what literal coding is for.
    let nibbles: Vec<u8> = (0..200_000)
        .map(|_| splitmix(&mut state) as u8 & 0x0f)
        .collect();
    out.push(("nibbles".into(), nibbles));
    // Long repeats spaced beyond the window: 2 KiB blocks repeated.
    let block: Vec<u8> = (0..2048).map(|_| splitmix(&mut state) as u8).collect();
    out.push(("repeats past the window".into(), block.repeat(64)));
    out.push(("zeros 4 MiB".into(), vec![0u8; 4 << 20]));
    out.push(("one byte".into(), vec![7u8]));
    out.push(("ten bytes".into(), vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10]));
    out
}

/// Every value round-trips through hourly_sketch, the version in front; compressed
/// values are strictly smaller than the raw frame and read with a plain ZSTD decoder.
#[test]
fn every_value_round_trips_and_never_grows() {
    for (name, frame) in frames() {
        let value = hourly_value(0x0102_0304_0506_0708, &frame, true);
        assert_eq!(
            stored_version(b"k", &value).unwrap(),
            0x0102_0304_0506_0708,
            "{name}"
        );
        let back = hourly_sketch(b"k", &value).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(back == frame, "{name}: read back other bytes");
        assert!(
            value.len() <= 8 + frame.len(),
            "{name}: {} bytes stored for a frame of {}",
            value.len(),
            frame.len()
        );
        if value[8..].starts_with(&ZSTD) {
            assert!(value.len() < 8 + frame.len(), "{name}");
            let plain = zstd::bulk::decompress(&value[8..], frame.len()).unwrap();
            assert!(plain == frame, "{name}: a plain decoder reads other bytes");
        } else {
            assert_eq!(value[8..], frame[..], "{name}: raw");
        }
    }
}

/// The tuned compressor is in use (its parameters accepted): a dense sketch is stored
/// compressed, and at most as large as plain level 1 would store it (the measured gain).
#[test]
fn the_tuned_compressor_is_configured_and_compresses_dense_sketches() {
    for seed in 0..4 {
        let frame = ull(13, 5000, seed);
        let value = hourly_value(1, &frame, true);
        assert!(
            value[8..].starts_with(&ZSTD),
            "a dense sketch was stored raw: the compressor was not made"
        );
        let level1 = zstd::bulk::compress(&frame, 1).unwrap();
        assert!(
            value.len() - 8 <= level1.len(),
            "tuned {} bytes, level 1 {} bytes",
            value.len() - 8,
            level1.len()
        );
    }
}

/// Values an earlier build wrote (ZSTD level 1, and other levels and windows any build
/// might have written) and raw values still read.
#[test]
fn values_of_earlier_compressors_still_read() {
    for (name, frame) in frames() {
        for level in [1, 3, 19] {
            let mut value = 9u64.to_be_bytes().to_vec();
            value.extend_from_slice(&zstd::bulk::compress(&frame, level).unwrap());
            let back =
                hourly_sketch(b"k", &value).unwrap_or_else(|e| panic!("{name} l{level}: {e}"));
            assert!(back == frame, "{name} level {level}");
            if level == 19 && frame.len() > 1 << 20 {
                break;
            }
        }
        // Raw values (before compression, or that did not shrink).
        let mut raw = 9u64.to_be_bytes().to_vec();
        raw.extend_from_slice(&frame);
        if !frame.starts_with(&ZSTD) {
            assert!(hourly_sketch(b"k", &raw).unwrap() == frame, "{name} raw");
        }
        // Interleaved with new writes on the same thread's codec.
        let new = hourly_value(2, &frame, true);
        assert!(hourly_sketch(b"k", &new).unwrap() == frame, "{name} new");
    }
}

/// Many values through one thread's compressor in a row (its parameters persist across
/// compressions, and no state leaks from one value into the next).
#[test]
fn a_reused_compressor_context_gives_the_same_bytes() {
    let frames = frames();
    let first: Vec<Vec<u8>> = frames
        .iter()
        .map(|(_, f)| hourly_value(5, f, true))
        .collect();
    let again: Vec<Vec<u8>> = frames
        .iter()
        .rev()
        .map(|(_, f)| hourly_value(5, f, true))
        .collect();
    for ((name, frame), (a, b)) in frames.iter().zip(first.iter().zip(again.iter().rev())) {
        assert!(
            a == b,
            "{name}: a value depends on what was compressed before"
        );
        assert!(&hourly_sketch(b"k", a).unwrap() == frame);
    }
}
