//! Whole frames into `Sketch::decode`, `Sketch::validate` and each kind's decoder.
//!
//! Input: a mode byte, then a frame. Even mode: the frame as it came, so the header
//! checks (magic, version, kind, flags, body length, checksum) are fuzzed. Odd mode: the
//! frame without its checksum, which is appended, so the fuzzer reaches the bodies of
//! every kind through the kind byte.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(bytes) = hourglass_fuzz::frame_input(data) {
        hourglass_fuzz::check_frame(&bytes);
    }
});
