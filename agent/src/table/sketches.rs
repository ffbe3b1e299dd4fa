//! Events into sketches: the hour an event's time falls in, if it is open, and the items
//! of a run added to the entry of a (series, hour).

use hourglass_rpc::time::SECONDS_PER_HOUR;
use hourglass_sketch::Sketch;

use super::reject::Reject;
use super::state::{Entry, Key, Table};

impl Table {
    /// Checks an event's time against the open hours: its hour, or why not.
    pub(crate) fn hour_for(&self, time: i64, now: i64) -> Result<u32, Reject> {
        let lateness = i64::try_from(self.config.lateness.as_secs()).unwrap_or(i64::MAX);
        let future = i64::try_from(self.config.limits.max_future.as_secs()).unwrap_or(i64::MAX);
        if time > now.saturating_add(future) {
            return Err(Reject::TooFarAhead { time });
        }
        let hour = hourglass_rpc::time::hour_of(time).ok_or(Reject::TooLate { time })?;
        let hour_end = (i64::from(hour) + 1) * SECONDS_PER_HOUR;
        // An hour once closed stays closed, even if the clock steps back or the lateness
        // grows across a restart: its final snapshot may be acknowledged and freed, and a
        // new sketch of it would replace, not add to, what the aggregator holds.
        if hour_end.saturating_add(lateness) <= now
            || self.closed_through.is_some_and(|c| hour <= c)
        {
            return Err(Reject::TooLate { time });
        }
        Ok(hour)
    }

    /// Checks an event before its series is looked up, so that events refused anyway
    /// never make a series: the item's length and the event's hour.
    pub(crate) fn check(&self, item: &[u8], time: i64, now: i64) -> Result<u32, Reject> {
        self.check_item(item)?;
        self.hour_for(time, now)
    }

    /// The item's part of [`Table::check`]: not empty, and not above `limits.max_item_len`.
    pub(crate) fn check_item(&self, item: &[u8]) -> Result<(), Reject> {
        if item.is_empty() {
            return Err(Reject::EmptyItem);
        }
        if item.len() > self.config.limits.max_item_len {
            return Err(Reject::ItemTooLong(item.len()));
        }
        Ok(())
    }

    /// Every hour up to this one is closed for good, if any is.
    pub(crate) fn closed_through(&self) -> Option<u32> {
        self.closed_through
    }

    /// Closes every hour up to `hour` for good (when restoring a checkpoint).
    pub(crate) fn close_through(&mut self, hour: u32) {
        self.closed_through = Some(self.closed_through.map_or(hour, |c| c.max(hour)));
    }

    /// Adds `item` (`weight` times, for frequency) to series `id` in the hour of `time`.
    #[cfg(test)]
    pub(crate) fn insert(
        &mut self,
        id: u64,
        time: i64,
        now: i64,
        item: &[u8],
        weight: u64,
    ) -> Result<(), Reject> {
        let hour = self.check(item, time, now)?;
        self.insert_at(id, hour, item, weight);
        Ok(())
    }

    /// Adds an item that [`Table::check`] passed to series `id` in `hour`.
    pub(crate) fn insert_at(&mut self, id: u64, hour: u32, item: &[u8], weight: u64) {
        self.insert_run(id, hour, &[(item, weight)]);
    }

    /// Adds items that [`Table::check`] passed, with their weights (for frequency), to
    /// series `id` in `hour`: the entry is looked up once, and each sketch takes the
    /// whole run in turn.
    pub(crate) fn insert_run(&mut self, id: u64, hour: u32, items: &[(&[u8], u64)]) {
        if items.is_empty() {
            return;
        }
        let generation = self.generation;
        let entry = match self.entries.get_mut(&Key { series: id, hour }) {
            Some(entry) => entry,
            None => {
                // An hour the agent holds events for is one it ingested for, even when
                // they arrive late (a backfill, a replay): it is live for the aggregator.
                if !self.live_hours.contains(&hour) {
                    self.mark_live(hour);
                }
                let slot = self.series.get_mut(&id).expect("resolved series are held");
                slot.hours += 1;
                self.entries
                    .entry(Key { series: id, hour })
                    .or_insert(Entry {
                        sketches: slot.spec.empty.clone(),
                        dirty: true,
                        ..Entry::default()
                    })
            }
        };
        for sketch in &mut entry.sketches {
            match sketch {
                Sketch::Distinct(h) => h.insert_all(items.iter().map(|(item, _)| *item)),
                // The item length was checked against a limit at most MAX_ITEM_LEN.
                Sketch::Frequency(f) => items.iter().for_each(|(item, weight)| {
                    f.insert_weighted(item, (*weight).max(1))
                        .expect("items within limits.max_item_len fit the frequent-items summary")
                }),
                Sketch::Membership(b) => items.iter().for_each(|(item, _)| b.insert(item)),
            }
        }
        entry.dirty = true;
        entry.saved.content = generation;
        entry.frames = None;
    }

    /// The times that fall in `hour`, an hour [`Table::hour_for`] accepted at `now`, and
    /// that it accepts without a look: from the hour's start to its end or to the furthest
    /// ahead of `now` accepted, whichever comes first. Nothing else of an event's check
    /// depends on its time.
    pub(crate) fn accepted_times(&self, hour: u32, now: i64) -> std::ops::Range<i64> {
        let future = i64::try_from(self.config.limits.max_future.as_secs()).unwrap_or(i64::MAX);
        let start = i64::from(hour) * SECONDS_PER_HOUR;
        let end = (start + SECONDS_PER_HOUR).min(now.saturating_add(future).saturating_add(1));
        start..end
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use hourglass_rpc::time::unix_now;
    use hourglass_sketch::format::Kind;

    use super::*;
    use crate::config::Config;
    use crate::table::reject::IngestStats;
    use crate::table::testing::{NOW, add, hour, table};

    #[test]
    fn events_land_in_their_own_hour_within_the_window() {
        let mut t = table();
        let hour_start = NOW - NOW % 3600;
        add(&mut t, "v", "", "a", hour_start - 1).unwrap(); // previous hour, within 1h lateness
        add(&mut t, "v", "", "b", NOW + 299).unwrap();
        assert!(t.entry("v", hour(hour_start - 1)).is_some());
        // The hour before last ended more than an hour ago.
        let e = add(&mut t, "v", "", "c", hour_start - 3601 - (NOW - hour_start)).unwrap_err();
        assert_eq!(e.reason(), "too_late");
        let e = add(&mut t, "v", "", "d", NOW + 301).unwrap_err();
        assert_eq!(e.reason(), "too_far_ahead");
        assert_eq!(
            add(&mut t, "v", "", "", NOW).unwrap_err(),
            Reject::EmptyItem
        );
        let long = "x".repeat(1025);
        assert_eq!(
            add(&mut t, "v", "", &long, NOW).unwrap_err().reason(),
            "item_too_long"
        );
    }

    /// `accepted_times(hour, now)` holds exactly the times `check` puts in `hour` at
    /// `now`, for every hour it accepts: every second of the hours around now, clocks at and
    /// around hour boundaries, several max_future and lateness settings, closed hours.
    #[test]
    fn accepted_times_are_exactly_the_checked_times_of_the_hour() {
        let base = 1_767_225_600i64; // an hour start
        for (future, lateness) in [
            (0u64, 0u64),
            (1, 1),
            (300, 600),
            (3599, 3599),
            (3600, 3600),
            (3601, 7200),
            (u64::MAX, 0),
        ] {
            let mut c = Config::default();
            c.limits.max_future = Duration::from_secs(future);
            c.lateness = Duration::from_secs(lateness);
            let c = Arc::new(c);
            for closed in [None, Some((base / 3600 - 2) as u32)] {
                let mut table = Table::new(Arc::clone(&c), 1);
                if let Some(h) = closed {
                    table.close_through(h);
                }
                for now in [base - 1, base, base + 1, base + 1800, base + 3599] {
                    let first = now / 3600 - 4;
                    for hour in first..first + 8 {
                        let hour = hour as u32;
                        let start = i64::from(hour) * 3600;
                        let checked: Vec<i64> = (start..start + 3600)
                            .filter(|&t| table.check(b"x", t, now) == Ok(hour))
                            .collect();
                        if checked.is_empty() {
                            continue;
                        }
                        let range = table.accepted_times(hour, now);
                        let listed: Vec<i64> = (start - 2..start + 3602)
                            .filter(|t| range.contains(t))
                            .collect();
                        assert_eq!(
                            listed, checked,
                            "future {future} lateness {lateness} closed {closed:?} now {now} hour {hour}: {range:?}"
                        );
                    }
                }
            }
        }
    }

    /// `insert_run` of a run is `insert_at` of its items in turn: every kind, weights
    /// included, a new entry and an existing one. The frequent-items summary keeps about
    /// 10 counters, so the order in which items reach it decides what it keeps.
    #[test]
    fn insert_run_is_insert_at_in_turn() {
        let mut c = Config {
            default_kinds: vec![Kind::Distinct, Kind::Frequency, Kind::Membership],
            lateness: Duration::from_secs(600),
            ..Config::default()
        };
        c.limits.max_future = Duration::from_secs(300);
        c.defaults.epsilon = 0.1;
        let c = Arc::new(c);
        let now = unix_now();
        let hour = (now / 3600) as u32;
        let items: Vec<(Vec<u8>, u64)> = (0..500u64)
            .map(|i| {
                let item = format!("user-{}", (i * 7919) % 97).into_bytes();
                (item, [0, 1, 3, 1000][(i % 4) as usize])
            })
            .collect();
        let mut stats = IngestStats::default();
        let mut one = Table::new(Arc::clone(&c), 1);
        let mut run = Table::new(Arc::clone(&c), 1);
        let id1 = one.resolve_tags("m", &[], &mut stats).unwrap();
        let id2 = run.resolve_tags("m", &[], &mut stats).unwrap();
        for chunk in items.chunks(123) {
            for (it, w) in chunk {
                one.insert_at(id1, hour, it, *w);
            }
            let refs: Vec<(&[u8], u64)> = chunk.iter().map(|(i, w)| (i.as_slice(), *w)).collect();
            run.insert_run(id2, hour, &refs);
        }
        let enc = |t: &Table| -> Vec<Vec<u8>> {
            t.entry("m", hour)
                .unwrap()
                .sketches
                .iter()
                .map(|s| s.encode())
                .collect()
        };
        assert_eq!(enc(&run), enc(&one));
        assert_eq!(run.live_hours(), one.live_hours());
    }
}
