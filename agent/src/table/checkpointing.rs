//! What the checkpoint holds of each entry: the generations changes are stamped with, the
//! entries a checkpoint must write, the removals it records, and entries restored from it.

use hourglass_rpc::series::Series;

use super::state::{Entry, Key, Saved, Table};

impl Entry {
    /// Whether a checkpoint must write this entry again: its sketches (`Some(true)`), or
    /// only its version, acknowledgement and flag (`Some(false)`).
    pub(crate) fn unsaved(&self) -> Option<bool> {
        if self.saved.content > self.saved.through {
            Some(true)
        } else if self.saved.meta > self.saved.through {
            Some(false)
        } else {
            None
        }
    }
}

impl Table {
    /// Starts a checkpoint: returns the generation it holds the changes of (every change
    /// from now on is stamped with the next), and how many removals it records.
    pub(crate) fn begin_checkpoint(&mut self) -> (u64, usize) {
        let generation = self.generation;
        self.generation += 1;
        (generation, self.removed.len())
    }

    /// The removals a checkpoint records: every one since the last recorded, first `n`.
    pub fn removed(&self, n: usize) -> &[(Series, u32)] {
        &self.removed[..n.min(self.removed.len())]
    }

    /// Entries the next checkpoint must write again, in no order.
    pub(crate) fn unsaved_keys(&self) -> Vec<Key> {
        self.entries
            .iter()
            .filter(|(_, e)| e.unsaved().is_some())
            .map(|(k, _)| *k)
            .collect()
    }

    /// A checkpoint begun at `generation` is durable: it holds the `written` entries at
    /// the given versions, and the first `removals` removals.
    pub(crate) fn checkpoint_done(
        &mut self,
        generation: u64,
        written: &[(Key, u64)],
        removals: usize,
    ) {
        for &(key, version) in written {
            if let Some(entry) = self.entries.get_mut(&key) {
                entry.saved.durable = entry.saved.durable.max(version);
                entry.saved.through = entry.saved.through.max(generation);
            }
        }
        self.removed.drain(..removals.min(self.removed.len()));
    }

    /// Puts back an entry read from a checkpoint. Restored entries are sent again unless
    /// the checkpoint shows the aggregator had their current state.
    pub(crate) fn restore(&mut self, series: Series, hour: u32, mut entry: Entry) {
        self.raise_last_version(entry.version);
        // The checkpoint it came from holds it as it is.
        entry.saved = Saved {
            durable: entry.version,
            content: 0,
            meta: 0,
            through: 0,
        };
        let id = match self.by_series.get(&series) {
            Some(&id) => id,
            None => {
                let spec = self.spec(series.metric());
                self.insert_series(series, spec)
            }
        };
        let slot = self.series.get_mut(&id).expect("just inserted");
        if self
            .entries
            .insert(Key { series: id, hour }, entry)
            .is_none()
        {
            slot.hours += 1;
        }
    }

    /// Marks every entry as a successful checkpoint would, for tests of what follows one.
    #[cfg(test)]
    pub(crate) fn checkpointed(&mut self) {
        let (generation, removals) = self.begin_checkpoint();
        let written: Vec<(Key, u64)> = self.entries.iter().map(|(k, e)| (*k, e.version)).collect();
        self.checkpoint_done(generation, &written, removals);
    }
}
