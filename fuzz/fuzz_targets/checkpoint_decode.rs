//! Checkpoint files into `checkpoint::decode`, the agent's reader of its own state at
//! start.
//!
//! Input: a mode byte, then a checkpoint. Even mode: the file as it came, so the length
//! and checksum checks are fuzzed. Odd mode: the file without its checksum, which is
//! appended, so the fuzzer reaches the records. Asserts, beyond "never panics": every
//! restored series round-trips through its text and wire forms, and every restored
//! sketch passes the sketch checks (round trip, queries, insert).
#![no_main]

use hourglass_agent::checkpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode % 2 == 0 {
        rest.to_vec()
    } else {
        hourglass_fuzz::with_checksum(rest)
    };
    let Ok(loaded) = checkpoint::decode(&bytes) else {
        return;
    };
    for saved in &loaded.entries {
        hourglass_fuzz::check_series(&saved.series);
        for sketch in &saved.entry.sketches {
            hourglass_fuzz::check_sketch(sketch);
        }
    }
});
