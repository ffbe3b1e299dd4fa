//! Datagrams into the DogStatsD parser: `statsd::lines`, `parse_line`, `tag_pairs`.
//!
//! Asserts, beyond "never panics": lines are non-empty and hold no `\n`; a set line has a
//! non-empty metric and item borrowed from its line, and UTF-8 tags whose pairs hold no
//! `,` and whose keys hold no `:`; parsing is deterministic.
#![no_main]

use hourglass_agent::statsd::{self, Parsed};
use libfuzzer_sys::fuzz_target;

/// Whether `part` lies inside `whole` (borrowed from it, not copied).
fn within(part: &[u8], whole: &[u8]) -> bool {
    let (start, end) = (
        whole.as_ptr() as usize,
        whole.as_ptr() as usize + whole.len(),
    );
    let p = part.as_ptr() as usize;
    p >= start && p + part.len() <= end
}

fuzz_target!(|datagram: &[u8]| {
    for line in statsd::lines(datagram) {
        assert!(!line.is_empty(), "an empty line was yielded");
        assert!(!line.contains(&b'\n'), "a line holds a newline");
        let parsed = statsd::parse_line(line);
        assert_eq!(
            parsed,
            statsd::parse_line(line),
            "parsing is not deterministic"
        );
        if let Ok(Parsed::Set(set)) = parsed {
            assert!(!set.metric.is_empty() && within(set.metric.as_bytes(), line));
            assert!(!set.item.is_empty() && within(set.item, line));
            assert!(within(set.tags, line) || set.tags.is_empty());
            let tags =
                std::str::from_utf8(set.tags).expect("the parser checked the tags are UTF-8");
            // Empty keys are yielded (`#:v`); the table's tag validation refuses them.
            for (key, value) in statsd::tag_pairs(tags) {
                assert!(!key.contains(',') && !value.contains(','), "{tags:?}");
                assert!(!key.contains(':'), "{tags:?}");
            }
        }
    }
});
