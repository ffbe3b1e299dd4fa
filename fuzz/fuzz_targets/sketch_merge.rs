//! Two decoded sketches of the same kind, merged both ways and each with itself.
//!
//! Input: a kind selector byte, a little-endian u16 length `n`, then the body of the
//! first sketch (`n` bytes, fewer if the input ends) and the body of the second (the
//! rest). Both are framed with correct checksums. Self-merges always pass the parameter
//! checks, so they reach the arithmetic (saturating counters and totals) whatever the
//! parameters.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [selector, n0, n1, rest @ ..] = data else {
        return;
    };
    let kind = hourglass_fuzz::kind_of(*selector);
    let n = usize::from(u16::from_le_bytes([*n0, *n1])).min(rest.len());
    let (first, second) = rest.split_at(n);
    let a = hourglass_fuzz::check_frame(&hourglass_fuzz::frame(kind, first));
    let b = hourglass_fuzz::check_frame(&hourglass_fuzz::frame(kind, second));
    if let Some(a) = &a {
        hourglass_fuzz::check_merge(a, a);
    }
    if let (Some(a), Some(b)) = (&a, &b) {
        hourglass_fuzz::check_merge(a, b);
    }
});
