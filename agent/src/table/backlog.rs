//! The backlog: freeing closed hours the aggregator has, bounding the unacknowledged
//! sketches of closed hours, and what the table holds, for `/metrics` and the admin port.

use std::collections::BTreeSet;

use hourglass_rpc::time::SECONDS_PER_HOUR;
use hourglass_sketch::Sketch;

use super::state::{Key, Table};

/// A Bloom filter more than half full, as the table reports it for the admin port.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BloomFill {
    /// The series, as its canonical text.
    pub(crate) series: String,
    /// The hour.
    pub(crate) hour: u32,
    /// The fraction of its bits set.
    pub(crate) fill: f64,
}

/// What the aggregator is missing, for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Backlog {
    /// Snapshots not yet acknowledged (one per kind of each pending entry).
    pub(crate) snapshots: u64,
    /// Bytes of those sketches in memory.
    pub(crate) bytes: u64,
    /// The oldest hour with something unacknowledged.
    pub(crate) oldest_hour: Option<u32>,
    /// Open (series, hour) entries.
    pub(crate) entries: u64,
    /// Series held.
    pub(crate) series: u64,
    /// Bytes of all sketches held.
    pub(crate) sketch_bytes: u64,
    /// Bytes of the unacknowledged sketches of closed hours: what `shipping.max_backlog_mib`
    /// bounds.
    pub(crate) closed_bytes: u64,
    /// Entries whose latest version no successful checkpoint holds yet: they are not
    /// pushed until one does.
    pub(crate) awaiting_checkpoint: u64,
}

/// What keeping the backlog under `shipping.max_backlog_mib` dropped in one flush.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// (series, hour) entries dropped.
    pub(crate) entries: u64,
    /// Their snapshots (one per kind).
    pub(crate) snapshots: u64,
    /// Bytes of their sketches.
    pub(crate) bytes: u64,
    /// The oldest hour dropped from.
    pub(crate) first_hour: u32,
    /// The newest hour dropped from.
    pub(crate) last_hour: u32,
    /// Hours dropped from that were still to be declared live: they no longer are, so the
    /// aggregator counts them as missing instead of complete.
    pub(crate) undeclared_hours: u64,
}

impl Table {
    /// Frees the entries of closed hours whose final snapshot is acknowledged, and the
    /// series left without hours. Returns how many entries were freed.
    pub(crate) fn free_closed(&mut self, now: i64) -> usize {
        let lateness = i64::try_from(self.config.lateness.as_secs()).unwrap_or(i64::MAX);
        let closed =
            |hour: u32| ((i64::from(hour) + 1) * SECONDS_PER_HOUR).saturating_add(lateness) <= now;
        // The last hour that is closed now: (h + 1)·3600 + lateness ≤ now.
        let last_closed = now.saturating_sub(lateness).div_euclid(SECONDS_PER_HOUR) - 1;
        if let Ok(hour) = u32::try_from(last_closed) {
            self.close_through(hour);
        }
        let freed: Vec<Key> = self
            .entries
            .iter()
            .filter(|(k, e)| closed(k.hour) && !e.pending())
            .map(|(k, _)| *k)
            .collect();
        let mut emptied = false;
        for key in &freed {
            emptied |= self.remove_entry(*key);
        }
        // Series whose every event was refused hold no hour: let them go too.
        let idle: Vec<u64> = self
            .series
            .iter()
            .filter(|(_, slot)| slot.hours == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            let slot = self.series.remove(&id).expect("just seen");
            self.by_series.remove(&slot.series);
            emptied = true;
        }
        if emptied {
            // Aliases may name a freed series; they are rebuilt on the next event.
            self.aliases.clear();
        }
        freed.len()
    }

    /// Removes an entry, and its series when it was the series' last hour; true if a
    /// series went.
    fn remove_entry(&mut self, key: Key) -> bool {
        if self.entries.remove(&key).is_none() {
            return false;
        }
        let Some(slot) = self.series.get_mut(&key.series) else {
            return false;
        };
        // A checkpoint may hold it: the next one says it is gone.
        self.removed.push((slot.series.clone(), key.hour));
        slot.hours -= 1;
        if slot.hours > 0 {
            return false;
        }
        let slot = self.series.remove(&key.series).expect("just seen");
        self.by_series.remove(&slot.series);
        true
    }

    /// Whether `hour` is closed for good (as of the last [`Table::free_closed`]).
    fn is_closed(&self, hour: u32) -> bool {
        self.closed_through.is_some_and(|c| hour <= c)
    }

    /// Keeps the unacknowledged sketches of closed hours within `max_bytes` by dropping
    /// entries, oldest hour first (and within an hour, oldest series first), until they fit.
    /// Open hours are never dropped: `limits.max_series` and the lateness bound them, and a
    /// dropped open entry would come back with the next event and replace at the
    /// aggregator what it had of the hour.
    ///
    /// An hour dropped from is taken out of the live hours still to be declared, so the
    /// aggregator counts it missing rather than complete; the caller counts the drop.
    pub(crate) fn enforce_backlog(&mut self, max_bytes: u64) -> Dropped {
        let mut closed: Vec<(Key, u64, u64)> = self
            .entries
            .iter()
            .filter(|(k, e)| self.is_closed(k.hour) && e.pending())
            .map(|(k, e)| {
                let bytes = e.sketches.iter().map(|s| s.size_bytes() as u64).sum();
                (*k, bytes, e.sketches.len() as u64)
            })
            .collect();
        let mut total: u64 = closed.iter().map(|c| c.1).sum();
        let mut dropped = Dropped::default();
        if total <= max_bytes {
            return dropped;
        }
        closed.sort_unstable_by_key(|&(key, _, _)| (key.hour, key.series));
        let mut emptied = false;
        let mut hours = BTreeSet::new();
        for (key, bytes, snapshots) in closed {
            if total <= max_bytes {
                break;
            }
            emptied |= self.remove_entry(key);
            total -= bytes;
            hours.insert(key.hour);
            dropped.entries += 1;
            dropped.snapshots += snapshots;
            dropped.bytes += bytes;
        }
        if emptied {
            self.aliases.clear();
        }
        dropped.first_hour = hours.first().copied().unwrap_or(0);
        dropped.last_hour = hours.last().copied().unwrap_or(0);
        for hour in hours {
            if self.live_hours.remove(&hour) {
                dropped.undeclared_hours += 1;
            }
        }
        dropped
    }

    /// What the aggregator is missing, and what the table holds.
    pub(crate) fn backlog(&self) -> Backlog {
        let mut b = Backlog {
            entries: self.entries.len() as u64,
            series: self.series.len() as u64,
            ..Backlog::default()
        };
        for (key, entry) in &self.entries {
            let bytes: u64 = entry.sketches.iter().map(|s| s.size_bytes() as u64).sum();
            b.sketch_bytes += bytes;
            if entry.saved.durable < entry.version {
                b.awaiting_checkpoint += 1;
            }
            if entry.pending() {
                b.snapshots += entry.sketches.len() as u64;
                b.bytes += bytes;
                if self.is_closed(key.hour) {
                    b.closed_bytes += bytes;
                }
                b.oldest_hour = Some(b.oldest_hour.map_or(key.hour, |h| h.min(key.hour)));
            }
        }
        b
    }

    /// Bloom filters more than half full: (series, hour, fill ratio).
    pub(crate) fn bloom_fill_above_half(&self) -> Vec<BloomFill> {
        let mut out = Vec::new();
        for (key, entry) in &self.entries {
            for sketch in &entry.sketches {
                if let Sketch::Membership(b) = sketch {
                    let fill = b.fill_ratio();
                    if fill > 0.5 {
                        let name = self.series.get(&key.series).map(|s| s.series.to_string());
                        out.push(BloomFill {
                            series: name.unwrap_or_default(),
                            hour: key.hour,
                            fill,
                        });
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::reject::IngestStats;
    use crate::table::testing::{NOW, add, hour, table};

    #[test]
    fn the_backlog_bound_drops_oldest_closed_hours_first_and_never_open_ones() {
        let mut t = table();
        let start = NOW - NOW % 3600;
        // Three hours of "a" and "b", each given a version the aggregator never acknowledged
        // (it is away); the hour of NOW is open.
        for back in [2, 1, 0] {
            let time = start - back * 3600 + 10;
            for m in ["a", "b"] {
                let id = t
                    .resolve_statsd(m, "", &mut IngestStats::default())
                    .unwrap();
                let hour = hour(time);
                t.insert_at(id, hour, b"x", 1);
            }
        }
        t.assign_versions();
        let entry_bytes = t.backlog().bytes / 6;
        // Three hours after NOW's hour ended, its lateness too: all three hours are closed.
        let later = start + 3 * 3600 + 10;
        t.free_closed(later);
        assert_eq!(t.backlog().closed_bytes, 6 * entry_bytes);
        t.mark_live(hour(start) - 2);
        t.live_hours_acked(&[hour(start) - 1]);
        // Room for three entries and a half: the oldest hour and one series of the next go.
        let dropped = t.enforce_backlog(3 * entry_bytes + entry_bytes / 2);
        assert_eq!(
            dropped,
            Dropped {
                entries: 3,
                snapshots: 6,
                bytes: 3 * entry_bytes,
                first_hour: hour(start) - 2,
                last_hour: hour(start) - 1,
                undeclared_hours: 1,
            }
        );
        assert!(t.entry("a", hour(start) - 2).is_none());
        assert!(t.entry("b", hour(start) - 2).is_none());
        assert_eq!(
            t.entry("a", hour(start) - 1).is_some() as u8
                + t.entry("b", hour(start) - 1).is_some() as u8,
            1
        );
        assert!(t.entry("a", hour(start)).is_some() && t.entry("b", hour(start)).is_some());
        assert_eq!(t.backlog().closed_bytes, 3 * entry_bytes);
        assert!(
            !t.live_hours().contains(&(hour(start) - 2)),
            "a dropped hour is not declared live"
        );
        assert_eq!(t.enforce_backlog(3 * entry_bytes), Dropped::default());

        // Open hours are never dropped, however small the bound.
        let mut t = table();
        add(&mut t, "a", "", "x", NOW).unwrap();
        t.assign_versions();
        t.free_closed(NOW);
        assert_eq!(t.enforce_backlog(0), Dropped::default());
        assert!(t.entry("a", hour(NOW)).is_some());
    }
}
