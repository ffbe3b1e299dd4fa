//! The rules every store follows, written once, above the engines: [`MemoryStore`] and
//! [`RocksStore`] each keep their data their own way and decide by these functions.
//!
//! [`MemoryStore`]: super::MemoryStore
//! [`RocksStore`]: super::RocksStore

use std::collections::BTreeMap;
use std::ops::Range;

use super::{Bytes, HourCache, PutOutcome, StoreError};
use crate::keys::{Day, Hour, HourKey};

/// What a snapshot of `version` does to a key that holds `held` (the version held, if
/// any): it replaces it only if it is newer. This rule is what makes retries, duplicates
/// and reordering of pushes harmless (DESIGN §3): a snapshot already held, or an older
/// one arriving late, changes nothing.
pub(super) fn put_outcome(held: Option<u64>, version: u64) -> PutOutcome {
    match held {
        Some(held) if held >= version => PutOutcome::Stale { held },
        _ => PutOutcome::Stored,
    }
}

/// Tells `cache` which hours a written `batch` changed: those of the entries whose
/// outcome (`outcomes`, one per entry) is [`PutOutcome::Stored`]; a stale entry changed
/// nothing. Call after the write is in the store, never before: the cache's rule of
/// validity.
pub(super) fn written_hours(
    cache: &HourCache,
    batch: &[(HourKey, u64, Bytes)],
    outcomes: &[PutOutcome],
) {
    for ((key, _, _), outcome) in batch.iter().zip(outcomes) {
        if *outcome == PutOutcome::Stored {
            cache.written(key.series, key.hour);
        }
    }
}

/// Whether a (series, day) whose latest stored snapshot left the mark `dirty` and whose
/// rollups were built from `built` must be (re)built: a day is dirty while it has a mark
/// that differs from its built mark (module docs of `store`, "Dirty days"). No mark at
/// all is a day never written, or one whose marks rollup retention deleted: clean.
pub(super) fn is_dirty(dirty: Option<u64>, built: Option<u64>) -> bool {
    dirty.is_some_and(|mark| built != Some(mark))
}

/// The id after `last` (ids start at 1; 0 is never assigned, so a zeroed key field is never
/// a real series or server). `u32::MAX` is reserved for [`ServerId::ALL`].
///
/// [`ServerId::ALL`]: crate::keys::ServerId::ALL
pub(super) fn next_id(last: Option<u32>, what: &'static str) -> Result<u32, StoreError> {
    match last {
        None => Ok(1),
        Some(last) if last < u32::MAX - 1 => Ok(last + 1),
        Some(_) => Err(StoreError::IdsExhausted {
            what,
            limit: u64::from(u32::MAX - 1),
        }),
    }
}

/// The bit of `hour` in its day's live-hours mask.
pub(super) fn hour_bit(hour: Hour) -> u32 {
    1 << (hour.0 - hour.day().first_hour().0)
}

/// One server's live hours: bit `h` of `masks[day]` is hour `h` of that day. Hourly live
/// records and the day summaries retention folds them into add to the same masks, so an
/// hour in both counts once; [`super::ServerIndex::live_hours`] and
/// [`super::ServerIndex::live_span`] are [`LiveMasks::count`] and [`LiveMasks::span`].
#[derive(Debug, Clone, Default)]
pub(super) struct LiveMasks(BTreeMap<Day, u32>);

impl LiveMasks {
    /// Adds the hours of `mask` (bits of [`hour_bit`]) to `day`'s.
    pub(super) fn add(&mut self, day: Day, mask: u32) {
        if mask != 0 {
            *self.0.entry(day).or_default() |= mask;
        }
    }

    /// From the first live hour to the last (its end), if any.
    pub(super) fn span(&self) -> Option<Range<Hour>> {
        let first = self.0.iter().next().and_then(|(d, m)| mask_span(*d, *m));
        let last = self
            .0
            .iter()
            .next_back()
            .and_then(|(d, m)| mask_span(*d, *m));
        span_union(first, last)
    }

    /// Live hours within `hours` (not empty).
    pub(super) fn count(&self, hours: &Range<Hour>) -> u64 {
        let last_day = Hour(hours.end.0 - 1).day();
        self.0
            .range(hours.start.day()..=last_day)
            .map(|(day, mask)| u64::from(mask_within(*day, *mask, hours).count_ones()))
            .sum()
    }
}

/// The hours of `day` in which a live-hours bit mask (bit `h` for hour `h` of the day)
/// has bits, within `hours`.
pub(super) fn mask_within(day: Day, mask: u32, hours: &Range<Hour>) -> u32 {
    let first = day.first_hour().0;
    let lo = hours.start.0.saturating_sub(first).min(24);
    let hi = hours.end.0.saturating_sub(first).min(24);
    let range = if hi <= lo {
        0
    } else {
        ((1u64 << hi) - (1u64 << lo)) as u32
    };
    mask & range
}

/// A live-hours mask's first and last hour (`last + 1` as the end), if it has any.
pub(super) fn mask_span(day: Day, mask: u32) -> Option<Range<Hour>> {
    (mask != 0).then(|| {
        let first = day.first_hour().0;
        // Saturating: the last day of u32 hours would overflow at its end.
        Hour(first.saturating_add(mask.trailing_zeros()))
            ..Hour(first.saturating_add(32 - mask.leading_zeros()))
    })
}

/// The span covering both `a` and `b`.
pub(super) fn span_union(a: Option<Range<Hour>>, b: Option<Range<Hour>>) -> Option<Range<Hour>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.start.min(b.start)..a.end.max(b.end)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_newer_version_replaces() {
        assert_eq!(put_outcome(None, 0), PutOutcome::Stored);
        assert_eq!(put_outcome(None, 7), PutOutcome::Stored);
        assert_eq!(put_outcome(Some(6), 7), PutOutcome::Stored);
        // The same version again (a retry, a duplicate) changes nothing.
        assert_eq!(put_outcome(Some(7), 7), PutOutcome::Stale { held: 7 });
        // An older one arriving late changes nothing, and says what is held.
        assert_eq!(put_outcome(Some(9), 7), PutOutcome::Stale { held: 9 });
        assert_eq!(
            put_outcome(Some(u64::MAX), u64::MAX),
            PutOutcome::Stale { held: u64::MAX }
        );
    }

    #[test]
    fn a_day_is_dirty_while_its_mark_is_not_the_built_one() {
        assert!(!is_dirty(None, None));
        assert!(!is_dirty(None, Some(3)));
        assert!(is_dirty(Some(3), None));
        assert!(!is_dirty(Some(3), Some(3)));
        // A snapshot that landed during a rebuild: built from an older mark.
        assert!(is_dirty(Some(4), Some(3)));
        // Marks are compared, not ordered.
        assert!(is_dirty(Some(3), Some(4)));
    }

    #[test]
    fn live_hours_count_once_and_span_from_first_to_last() {
        assert_eq!(hour_bit(Hour(0)), 1);
        assert_eq!(hour_bit(Hour(23)), 1 << 23);
        assert_eq!(hour_bit(Hour(24 * 5 + 7)), 1 << 7);
        let mut masks = LiveMasks::default();
        assert_eq!(masks.span(), None);
        assert_eq!(masks.count(&(Hour(0)..Hour(1000))), 0);
        // Hour 26 from an hourly record and from a day's summary alike: counted once.
        masks.add(Day(1), hour_bit(Hour(26)));
        masks.add(Day(1), hour_bit(Hour(26)) | hour_bit(Hour(30)));
        masks.add(Day(3), hour_bit(Hour(72 + 23)));
        // An empty summary adds no day.
        masks.add(Day(9), 0);
        assert_eq!(masks.count(&(Hour(0)..Hour(1000))), 3);
        assert_eq!(masks.count(&(Hour(27)..Hour(31))), 1);
        assert_eq!(masks.count(&(Hour(26)..Hour(96))), 3);
        assert_eq!(masks.count(&(Hour(26)..Hour(95))), 2);
        assert_eq!(masks.span(), Some(Hour(26)..Hour(96)));
    }

    #[test]
    fn ids_start_at_one_and_never_reach_all() {
        assert_eq!(next_id(None, "series").unwrap(), 1);
        assert_eq!(next_id(Some(1), "series").unwrap(), 2);
        assert_eq!(next_id(Some(u32::MAX - 2), "server").unwrap(), u32::MAX - 1);
        match next_id(Some(u32::MAX - 1), "server") {
            Err(StoreError::IdsExhausted { what, limit }) => {
                assert_eq!(what, "server");
                assert_eq!(limit, u64::from(u32::MAX - 1));
            }
            other => panic!("expected IdsExhausted, got {other:?}"),
        }
    }
}
