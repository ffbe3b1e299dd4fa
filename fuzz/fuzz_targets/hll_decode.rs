//! Bodies of `distinct` sketches, HyperLogLog and UltraLogLog, into `Distinct::decode` and
//! the strict `Hll::decode` (and, through the shared checks, `Sketch::decode` and
//! `Sketch::validate`).
//!
//! Input: the body. It is framed as a distinct sketch with a correct checksum, so every
//! mutation reaches the body's own validation.
#![no_main]

use hourglass_sketch::format::Kind;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    hourglass_fuzz::check_frame(&hourglass_fuzz::frame(Kind::Distinct, body));
});
