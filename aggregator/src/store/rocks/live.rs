//! Each server's live hours in memory, for the coverage of every answer.
//!
//! A query's coverage asks, for every selected server, when it was first and last live and
//! how many hours of the range it was live ([`ServerIndex::live_span`],
//! [`ServerIndex::live_hours`]). Read from RocksDB that is four iterators and a scan of the
//! range's `live/` keys per server: 2.4 to 5.6 ms of an answer over 100 servers in
//! `benches/vs_redis.rs`, whatever it merged. So the store keeps, per server, its
//! [`LiveMasks`] (one bit mask per day of its live hours, `live/` and `liveday/` together),
//! loaded at the first question about the server and then kept exact:
//!
//! - every write of live hours adds them to a loaded server's masks after the write is in
//!   the store (`put_push`, `put_index`), and raises a generation;
//! - retention, which rewrites and deletes live records, forgets every server;
//! - a load takes the generation before it reads the store and keeps what it read only if
//!   no write came in between (a write it may have missed would not be in its masks, and
//!   the write found nothing loaded to add to). Otherwise the answer it computed is still
//!   right for that moment; the next question loads again.

use super::*;

#[derive(Debug, Default)]
struct Loaded {
    servers: HashMap<ServerId, LiveMasks>,
    generation: u64,
}

/// The loaded servers' live hours (module docs).
#[derive(Debug, Default)]
pub(super) struct LiveCache {
    loaded: Mutex<Loaded>,
}

impl LiveCache {
    fn lock(&self) -> MutexGuard<'_, Loaded> {
        // Each update is whole under the lock; a panic elsewhere leaves valid masks.
        self.loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `f` of the server's masks, if loaded.
    pub(super) fn with<T>(&self, server: ServerId, f: impl FnOnce(&LiveMasks) -> T) -> Option<T> {
        self.lock().servers.get(&server).map(f)
    }

    /// Take before reading a server's live records from the store.
    pub(super) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Keeps masks read from the store after taking `generation`, if no write came since.
    pub(super) fn keep(&self, server: ServerId, masks: LiveMasks, generation: u64) {
        let mut loaded = self.lock();
        if loaded.generation == generation {
            loaded.servers.insert(server, masks);
        }
    }

    /// After a write of `server`'s live `hours` is in the store.
    pub(super) fn written(&self, server: ServerId, hours: &[Hour]) {
        let mut loaded = self.lock();
        if let Some(masks) = loaded.servers.get_mut(&server) {
            for hour in hours {
                masks.add(hour.day(), hour_bit(*hour));
            }
        }
        loaded.generation += 1;
    }

    /// After a write that rewrote or deleted live records of any server.
    pub(super) fn forget(&self) {
        let mut loaded = self.lock();
        loaded.servers.clear();
        loaded.generation += 1;
    }
}

impl RocksStore {
    /// `f` of `server`'s live hours: from memory, or read from the store (and kept).
    pub(super) fn with_live<T>(
        &self,
        server: ServerId,
        f: impl Fn(&LiveMasks) -> T,
    ) -> Result<T, StoreError> {
        if let Some(answer) = self.live_cache.with(server, &f) {
            return Ok(answer);
        }
        let generation = self.live_cache.generation();
        let meta = self.cf(CF_META);
        let mut masks = LiveMasks::default();
        for prefix in [meta::LIVE, meta::LIVE_DAY] {
            let lo = meta::server_start(prefix, server);
            let mut read = ReadOptions::default();
            read.set_iterate_upper_bound(prefix_end(&lo));
            let mut it = self.db.raw_iterator_cf_opt(meta, read);
            it.seek(&lo);
            while let Some((key, value)) = it.item() {
                let time = meta_id(key, after(key, prefix.len() + 4))?;
                if prefix == meta::LIVE {
                    let hour = Hour(time);
                    masks.add(hour.day(), hour_bit(hour));
                } else {
                    masks.add(Day(time), live_mask(key, value)?);
                }
                it.next();
            }
            it.status().map_err(engine_error)?;
        }
        let answer = f(&masks);
        self.live_cache.keep(server, masks, generation);
        Ok(answer)
    }
}
