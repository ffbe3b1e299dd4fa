//! Batch encoding: the snapshots of a push, and the frames a checkpoint encodes kept for
//! the push of the same flush.

use bytes::Bytes;
use hourglass_rpc::proto::v1;
use hourglass_rpc::series::Series;
use hourglass_sketch::Sketch;

use super::state::{Entry, Key, Table};

/// One entry a push carries, as the table encodes a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sent {
    /// The entry.
    pub(crate) key: Key,
    /// The version its snapshots carry.
    pub(crate) version: u64,
    /// How many snapshots (one per sketch kind) it put in the push.
    pub(crate) snapshots: usize,
}

/// The most bytes of encoded frames a checkpoint keeps for the push of the same flush
/// ([`Table::encoded`]); entries past it are encoded again by the push.
pub(crate) const MAX_FRAMES_KEPT: usize = 16 << 20;

impl Entry {
    /// The sketches' encoded frames: the kept ones, or encoded now.
    fn encode(&self) -> Vec<Bytes> {
        match &self.frames {
            Some(frames) => frames.clone(),
            None => self
                .sketches
                .iter()
                .map(|s| Bytes::from(s.encode()))
                .collect(),
        }
    }
}

impl Table {
    /// Encodes the snapshots of `keys` from `start` on, stopping before `max_bytes` of
    /// sketches or `max_snapshots` snapshots (at least one entry per call). Returns the
    /// snapshots, the (key, version, snapshot count) of each entry sent, and the index to
    /// continue from.
    ///
    /// The version sent is the one the last successful checkpoint holds. It is the
    /// entry's own unless checkpoints are failing; then the current sketch goes out under
    /// the older version, as an event taken between a checkpoint and the push after it
    /// always has (docs/FORMAT.md), and it is replaced at the aggregator once a checkpoint
    /// holds the entry's newer version.
    pub(crate) fn encode_batch(
        &mut self,
        keys: &[Key],
        start: usize,
        max_bytes: usize,
        max_snapshots: usize,
    ) -> (Vec<v1::Snapshot>, Vec<Sent>, usize) {
        let mut snapshots = Vec::new();
        let mut sent = Vec::new();
        let mut bytes = 0usize;
        let mut next = start;
        while next < keys.len() {
            let key = keys[next];
            let (Some(entry), Some(slot)) =
                (self.entries.get_mut(&key), self.series.get(&key.series))
            else {
                next += 1;
                continue;
            };
            let size: usize = entry.sketches.iter().map(Sketch::size_bytes).sum();
            if !sent.is_empty()
                && (bytes + size > max_bytes
                    || snapshots.len() + entry.sketches.len() > max_snapshots)
            {
                break;
            }
            bytes += size;
            // Encoded by this flush's checkpoint, nearly always: taken, not kept for
            // another push.
            let frames = match entry.frames.take() {
                Some(frames) => frames,
                None => entry.encode(),
            };
            for (sketch, data) in entry.sketches.iter().zip(frames) {
                snapshots.push(v1::Snapshot {
                    series: Some(slot.wire.clone()),
                    hour: key.hour,
                    epoch: self.epoch,
                    version: entry.saved.durable,
                    sketch: Some(v1::EncodedSketch {
                        kind: v1::SketchKind::from(sketch.kind()) as i32,
                        data,
                    }),
                });
            }
            sent.push(Sent {
                key,
                version: entry.saved.durable,
                snapshots: entry.sketches.len(),
            });
            next += 1;
        }
        (snapshots, sent, next)
    }

    /// The series of `key`, and its entry's encoded frames, for the checkpoint writer.
    /// An entry the aggregator lacks keeps them, for the push of this flush to send
    /// rather than encode the sketches again.
    ///
    /// At most [`MAX_FRAMES_KEPT`] bytes of them are kept between two
    /// [`Table::drop_frames`], so that a flush of a large backlog does not hold it twice.
    pub(crate) fn encoded(&mut self, key: Key) -> Option<(&Series, &Entry, Vec<Bytes>)> {
        let series = &self.series.get(&key.series)?.series;
        let entry = self.entries.get_mut(&key)?;
        let frames = entry.encode();
        let size: usize = frames.iter().map(Bytes::len).sum();
        if entry.pending() && entry.frames.is_none() && self.frames_kept + size <= MAX_FRAMES_KEPT {
            self.frames_kept += size;
            entry.frames = Some(frames.clone());
        }
        Some((series, entry, frames))
    }

    /// Drops the encoded frames a push did not take: they live within one flush.
    pub(crate) fn drop_frames(&mut self) {
        if self.frames_kept > 0 {
            for entry in self.entries.values_mut() {
                entry.frames = None;
            }
            self.frames_kept = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::testing::{NOW, add, table};

    /// The frames a checkpoint encodes are what the push of the same flush sends, unless
    /// an event changed the sketches in between: then the push sends them as they are
    /// now. Only entries the aggregator lacks keep frames, and only until the flush ends.
    #[test]
    fn a_push_sends_the_sketches_as_they_are_now_not_as_checkpointed() {
        let encoded = |t: &Table, key: Key| -> Vec<Vec<u8>> {
            t.get(key)
                .unwrap()
                .1
                .sketches
                .iter()
                .map(Sketch::encode)
                .collect()
        };
        let sent = |t: &mut Table, key: Key| -> Vec<Vec<u8>> {
            let (snaps, _, _) = t.encode_batch(&[key], 0, usize::MAX, 1000);
            snaps
                .into_iter()
                .map(|s| s.sketch.unwrap().data.to_vec())
                .collect()
        };
        let mut t = table();
        add(&mut t, "v", "", "a", NOW).unwrap();
        add(&mut t, "w", "", "a", NOW).unwrap();
        t.assign_versions();
        let mut keys = t.keys();
        keys.sort_by_key(|k| t.get(*k).unwrap().0.to_string());
        let (v, w) = (keys[0], keys[1]);
        for key in [v, w] {
            let (_, _, frames) = t.encoded(key).unwrap();
            assert_eq!(
                frames.iter().map(|f| f.to_vec()).collect::<Vec<_>>(),
                encoded(&t, key)
            );
            assert!(t.get(key).unwrap().1.frames.is_some(), "pending: kept");
        }
        // An event between the checkpoint and the push: `v` is sent as it is now.
        add(&mut t, "v", "", "b", NOW).unwrap();
        assert!(t.get(v).unwrap().1.frames.is_none());
        let now = sent(&mut t, v);
        assert_eq!(now, encoded(&t, v));
        assert_ne!(now, {
            let mut one = table();
            add(&mut one, "v", "", "a", NOW).unwrap();
            let key = one.keys()[0];
            encoded(&one, key)
        });
        // `w` unchanged: its kept frames go, taken.
        assert_eq!(sent(&mut t, w), encoded(&t, w));
        assert!(t.get(w).unwrap().1.frames.is_none(), "taken by the push");
        // Acknowledged entries keep nothing; what a push did not take goes at the flush's end.
        t.encoded(v).unwrap();
        t.ack(w, t.get(w).unwrap().1.version);
        t.encoded(w).unwrap();
        assert!(t.get(v).unwrap().1.frames.is_some());
        assert!(t.get(w).unwrap().1.frames.is_none(), "not pending");
        t.drop_frames();
        assert!(t.get(v).unwrap().1.frames.is_none());
    }

    #[test]
    fn batches_respect_the_byte_bound() {
        let mut t = table();
        for m in ["a", "b", "c"] {
            add(&mut t, m, "", "x", NOW).unwrap();
        }
        t.assign_versions();
        t.checkpointed();
        let keys = t.unacked();
        let one: usize = t
            .get(keys[0])
            .unwrap()
            .1
            .sketches
            .iter()
            .map(Sketch::size_bytes)
            .sum();
        let (_, sent, next) = t.encode_batch(&keys, 0, one, 1000);
        assert_eq!((sent.len(), next), (1, 1));
        let (_, sent, next) = t.encode_batch(&keys, 1, 10 * one, 1000);
        assert_eq!((sent.len(), next), (2, 3));
        // Two kinds, two snapshots an entry: a bound of 3 snapshots takes one entry.
        let (snaps, sent, _) = t.encode_batch(&keys, 0, usize::MAX, 3);
        assert_eq!((snaps.len(), sent.len()), (2, 1));
    }
}
