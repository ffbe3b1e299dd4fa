//! Versions, acknowledgements and live hours: what the aggregator holds of each entry,
//! and the hours the agent was up in that it has not yet declared.

use super::state::{Key, Table};

/// The most hours kept in the set of live hours not yet reported (about 14 months).
const MAX_LIVE_HOURS: usize = 10_000;

impl Table {
    /// Records that the agent is up during `hour`.
    pub fn mark_live(&mut self, hour: u32) {
        self.live_hours.insert(hour);
        while self.live_hours.len() > MAX_LIVE_HOURS {
            self.live_hours.pop_first();
        }
    }

    /// Live hours not yet reported to the aggregator.
    pub fn live_hours(&self) -> Vec<u32> {
        self.live_hours.iter().copied().collect()
    }

    /// Forgets live hours the aggregator acknowledged.
    pub(crate) fn live_hours_acked(&mut self, hours: &[u32]) {
        for h in hours {
            self.live_hours.remove(h);
        }
    }

    /// Forgets live hours the aggregator refused for good (the caller counts them), so
    /// they are not sent again every flush.
    pub(crate) fn drop_live_hours(&mut self, hours: &[u32]) {
        for h in hours {
            self.live_hours.remove(h);
        }
    }

    /// The highest version given to any entry of this epoch.
    pub(crate) fn last_version(&self) -> u64 {
        self.last_version
    }

    /// Raises the version counter to at least `version` (when restoring a checkpoint).
    pub(crate) fn raise_last_version(&mut self, version: u64) {
        self.last_version = self.last_version.max(version);
    }

    /// Gives every changed entry the next version of the epoch; returns how many changed.
    ///
    /// Versions come from one counter for the whole epoch, not one per entry: an entry
    /// that is freed and made again for the same hour (a clock stepped back, a lateness
    /// raised across a restart) still gets a version above any the aggregator holds for
    /// it, so its snapshot is stored, not taken for a stale duplicate.
    pub(crate) fn assign_versions(&mut self) -> usize {
        let mut changed = 0;
        let version = self.last_version + 1;
        for entry in self.entries.values_mut() {
            if entry.dirty {
                entry.version = version;
                entry.dirty = false;
                entry.saved.meta = self.generation;
                changed += 1;
            }
        }
        if changed > 0 {
            self.last_version = version;
        }
        changed
    }

    /// Entries the aggregator has not acknowledged at the version the last successful
    /// checkpoint holds, oldest hour first: what a push may send. A version no checkpoint
    /// holds waits, since a restarted agent could give it to other content.
    pub(crate) fn unacked(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = self
            .entries
            .iter()
            .filter(|(_, e)| e.acked < e.saved.durable)
            .map(|(k, _)| *k)
            .collect();
        keys.sort_by_key(|k| (k.hour, k.series));
        keys
    }

    /// Marks `key` changed, so the next flush gives it a new version and sends it again
    /// (when the aggregator holds a later version of it than this agent gave, with other
    /// content). Nothing happens if the table does not hold `key`.
    pub(crate) fn mark_dirty(&mut self, key: Key) {
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.dirty = true;
            entry.saved.meta = self.generation;
        }
    }

    /// Records that the aggregator holds `version` of `key` (or a newer one).
    pub(crate) fn ack(&mut self, key: Key, version: u64) {
        if let Some(entry) = self.entries.get_mut(&key)
            && version > entry.acked
        {
            entry.acked = version;
            entry.saved.meta = self.generation;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::reject::IngestStats;
    use crate::table::testing::{NOW, add, hour, table};

    #[test]
    fn versions_acks_and_freeing_follow_the_protocol() {
        let mut t = table();
        add(&mut t, "v", "", "a", NOW).unwrap();
        assert_eq!(t.assign_versions(), 1);
        assert_eq!(t.assign_versions(), 0, "nothing changed since");
        t.checkpointed();
        let keys = t.unacked();
        assert_eq!(keys.len(), 1);
        let (snaps, sent, next) = t.encode_batch(&keys, 0, 1 << 20, 1000);
        assert_eq!((snaps.len(), next), (2, 1), "one snapshot per kind");
        assert!(snaps.iter().all(|s| s.version == 1 && s.epoch == 7));
        // Not acknowledged: still owed, and a change makes the next version.
        add(&mut t, "v", "", "b", NOW).unwrap();
        assert_eq!(t.assign_versions(), 1);
        t.checkpointed();
        assert_eq!(t.backlog().snapshots, 2);
        t.ack(sent[0].key, sent[0].version);
        assert_eq!(
            t.unacked().len(),
            1,
            "version 1 acked, version 2 still owed"
        );
        t.ack(keys[0], 2);
        assert!(t.unacked().is_empty());
        assert_eq!(t.backlog().snapshots, 0);
        // Open hours are kept; closed and acknowledged ones are freed with their series.
        assert_eq!(t.free_closed(NOW), 0);
        assert_eq!(t.free_closed(NOW + 3 * 3600), 1);
        assert_eq!(t.series_count(), 0);
        // A freed series comes back with its next event.
        let later = NOW + 3 * 3600;
        let id = t
            .resolve_statsd("v", "", &mut IngestStats::default())
            .unwrap();
        t.insert(id, later, later, b"c", 1).unwrap();
        assert_eq!(t.series_count(), 1);
    }

    #[test]
    fn an_entry_marked_dirty_is_sent_again_above_a_raised_counter() {
        let mut t = table();
        add(&mut t, "v", "", "a", NOW).unwrap();
        add(&mut t, "w", "", "a", NOW).unwrap();
        assert_eq!(t.assign_versions(), 2);
        t.checkpointed();
        let keys = t.unacked();
        for &k in &keys {
            t.ack(k, 1);
        }
        assert!(t.unacked().is_empty());
        // The aggregator holds version 5 of "v": continue above it, and owe "v" again.
        let v = t.get(keys[0]).map(|(s, _)| s.to_string()).unwrap();
        t.raise_last_version(5);
        t.mark_dirty(keys[0]);
        t.mark_dirty(Key {
            series: 999,
            hour: 1,
        }); // not held: nothing happens
        assert!(t.entry(&v, hour(NOW)).unwrap().pending());
        assert_eq!(t.backlog().snapshots, 2, "one entry, two kinds");
        assert_eq!(t.assign_versions(), 1, "only the marked entry");
        t.checkpointed();
        assert_eq!(t.entry(&v, hour(NOW)).unwrap().version, 6);
        assert_eq!(t.unacked(), vec![keys[0]]);
    }

    #[test]
    fn live_hours_are_forgotten_when_acknowledged_or_dropped() {
        let mut t = table();
        for h in [10, 11, 12, 13] {
            t.mark_live(h);
        }
        t.live_hours_acked(&[10, 11]);
        t.drop_live_hours(&[13]);
        assert_eq!(t.live_hours(), vec![12]);
    }

    #[test]
    fn a_closed_hour_stays_closed_and_versions_only_grow() {
        let mut t = table();
        add(&mut t, "v", "", "a", NOW).unwrap();
        add(&mut t, "w", "", "a", NOW).unwrap();
        t.assign_versions();
        add(&mut t, "w", "", "b", NOW).unwrap();
        t.assign_versions();
        t.checkpointed();
        let versions = (
            t.entry("v", hour(NOW)).unwrap().version,
            t.entry("w", hour(NOW)).unwrap().version,
        );
        assert_eq!(versions, (1, 2), "one counter for the epoch");
        for k in t.unacked() {
            t.ack(k, 2);
        }
        assert_eq!(t.free_closed(NOW + 3 * 3600), 2);
        // The clock steps back: the freed hour must not open again, or a new sketch of a
        // few late events would replace the whole hour at the aggregator.
        assert_eq!(
            add(&mut t, "v", "", "c", NOW).unwrap_err().reason(),
            "too_late"
        );
        assert_eq!(t.series_count(), 0, "refused events make no series");
        assert!(t.closed_through().unwrap() >= hour(NOW));
    }
}
