//! The series-per-server bound (`limits.max_series_per_server`, DESIGN §8).
//!
//! An agent with a bug (a request id in a tag) or a token holder with bad intent can make
//! series without end; each new series grows the dictionary, every query's listing and the
//! rollup work for good. The bound counts, per server, the series it holds data of within
//! hourly retention. The store keeps the index
//! ([`ServerIndex::server_series`](crate::store::ServerIndex::server_series), written in the
//! same batch as the snapshots); this ledger keeps it in memory per server, loaded on the
//! server's first push after a start, so the check is a hash lookup per snapshot.
//!
//! Memory: about 16 bytes per (server, series) held, so 100 servers with 10,000 series
//! each take some 16 MB.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::keys::{Day, SeriesId, ServerId};
use crate::store::{Store, StoreError};

/// The series each server holds, by the last day it has data of.
#[derive(Default)]
pub(crate) struct SeriesLedger {
    servers: Mutex<HashMap<ServerId, Arc<Mutex<Option<ServerSeries>>>>>,
}

/// One server's series, once loaded from the store.
pub(crate) struct ServerSeries {
    held: HashMap<SeriesId, Day>,
    /// Every series held was last seen on this day or later: a sweep for series gone with
    /// retention finds nothing until `oldest` passes it. Without it, a server at its bound
    /// sending new names (the buggy agent the bound is for) would sweep the whole map for
    /// every one of them.
    swept: Day,
}

/// What `ServerSeries::admit` decided for one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The server already holds this series.
    Held,
    /// The series is new to the server and fits under the bound; it is now counted.
    New,
    /// The series is new to the server and the server holds `held` series already.
    Full {
        /// How many series the server holds within retention.
        held: usize,
    },
}

impl SeriesLedger {
    /// An empty ledger: every server is loaded from the store on first use.
    pub fn new() -> Self {
        SeriesLedger::default()
    }

    /// Runs `f` on `server`'s series while holding them (pushes of one server take turns
    /// here; other servers do not wait), loading them from `store` first if this is the
    /// server's first push since the start. Series last seen before `oldest` no longer
    /// count.
    pub(crate) fn with_server<T>(
        &self,
        store: &dyn Store,
        server: ServerId,
        oldest: Day,
        f: impl FnOnce(&mut ServerSeries) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let entry = Arc::clone(lock(&self.servers).entry(server).or_default());
        let mut guard = lock(&entry);
        if guard.is_none() {
            let held = store.server_series(server, oldest)?.into_iter().collect();
            *guard = Some(ServerSeries {
                held,
                swept: oldest,
            });
        }
        let series = guard.as_mut().expect("loaded above");
        f(series)
    }
}

impl ServerSeries {
    /// Decides whether the server may hold `series` with data on `day`, under `limit`
    /// series. A series it holds only moves its last day on; a new one is counted if it
    /// fits, after series whose last day is before `oldest` (gone with retention) are
    /// dropped.
    pub(crate) fn admit(
        &mut self,
        series: SeriesId,
        day: Day,
        oldest: Day,
        limit: usize,
    ) -> Admission {
        if let Some(last) = self.held.get_mut(&series) {
            *last = (*last).max(day);
            return Admission::Held;
        }
        if self.is_full(oldest, limit) {
            return Admission::Full {
                held: self.held.len(),
            };
        }
        self.held.insert(series, day);
        Admission::New
    }

    /// Whether one more new series would be refused (after retention's drop).
    pub(crate) fn is_full(&mut self, oldest: Day, limit: usize) -> bool {
        if self.held.len() >= limit && oldest > self.swept {
            self.held.retain(|_, last| *last >= oldest);
            self.swept = oldest;
        }
        self.held.len() >= limit
    }

    /// How many series the server holds.
    pub fn len(&self) -> usize {
        self.held.len()
    }
}

/// What deciding a push's series needs of a server's series: [`ServerSeries`] itself, or
/// a [`Tentative`] view of it.
pub(crate) trait Admit {
    /// As [`ServerSeries::admit`].
    fn admit(&mut self, series: SeriesId, day: Day, oldest: Day, limit: usize) -> Admission;
    /// As [`ServerSeries::is_full`].
    fn is_full(&mut self, oldest: Day, limit: usize) -> bool;
    /// As [`ServerSeries::len`].
    fn len(&self) -> usize;
}

impl Admit for ServerSeries {
    fn admit(&mut self, series: SeriesId, day: Day, oldest: Day, limit: usize) -> Admission {
        ServerSeries::admit(self, series, day, oldest, limit)
    }
    fn is_full(&mut self, oldest: Day, limit: usize) -> bool {
        ServerSeries::is_full(self, oldest, limit)
    }
    fn len(&self) -> usize {
        ServerSeries::len(self)
    }
}

/// A server's series plus those one push would add, the ledger itself untouched: the
/// decisions of cluster mode's entry node, where only the apply loop, in the stream's
/// order, records series.
pub(crate) struct Tentative<'a> {
    held: &'a mut ServerSeries,
    added: HashSet<SeriesId>,
}

impl<'a> Tentative<'a> {
    /// A view of `held` with nothing added.
    pub(crate) fn new(held: &'a mut ServerSeries) -> Self {
        Tentative {
            held,
            added: HashSet::new(),
        }
    }
}

impl Admit for Tentative<'_> {
    fn admit(&mut self, series: SeriesId, _day: Day, oldest: Day, limit: usize) -> Admission {
        if self.held.held.contains_key(&series) || self.added.contains(&series) {
            return Admission::Held;
        }
        if self.is_full(oldest, limit) {
            return Admission::Full { held: self.len() };
        }
        self.added.insert(series);
        Admission::New
    }
    fn is_full(&mut self, oldest: Day, limit: usize) -> bool {
        self.held
            .is_full(oldest, limit.saturating_sub(self.added.len()))
    }
    fn len(&self) -> usize {
        self.held.len() + self.added.len()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is a single map operation, so a poisoned lock still guards a whole map.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Epoch, Hour, HourKey};
    use crate::store::{Hourly, MemoryStore};

    fn sketch() -> Vec<u8> {
        hourglass_sketch::hll::Hll::new(4).unwrap().encode()
    }

    #[test]
    fn new_series_count_until_the_limit_and_retention_frees_them() {
        let mut s = ServerSeries {
            held: HashMap::new(),
            swept: Day(0),
        };
        assert_eq!(s.admit(SeriesId(1), Day(10), Day(0), 2), Admission::New);
        assert_eq!(s.admit(SeriesId(1), Day(12), Day(0), 2), Admission::Held);
        assert_eq!(s.admit(SeriesId(2), Day(11), Day(0), 2), Admission::New);
        assert_eq!(
            s.admit(SeriesId(3), Day(12), Day(0), 2),
            Admission::Full { held: 2 }
        );
        assert!(s.is_full(Day(0), 2));
        // Series 2 was last seen on day 11; once retention starts at day 12 it no longer
        // counts, and series 1 (moved on to day 12) still does.
        assert_eq!(s.admit(SeriesId(3), Day(12), Day(12), 2), Admission::New);
        let holds = |id| s.held.contains_key(&SeriesId(id));
        assert!(holds(1) && !holds(2) && holds(3));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn a_server_is_loaded_from_the_store_index_once() {
        let store = MemoryStore::new();
        let server = ServerId(7);
        let put = |series: u32, hour: u32| {
            let key = HourKey {
                series: SeriesId(series),
                hour: Hour(hour),
                server,
                epoch: Epoch(1),
            };
            store.put_hourly(&[(key, 1, sketch().into())]).unwrap();
        };
        put(1, 24); // day 1
        put(2, 48); // day 2
        put(2, 24); // day 1 again: series 2's last day stays 2
        put(3, 0); // day 0: before retention below
        let ledger = SeriesLedger::new();
        let held = ledger
            .with_server(&store, server, Day(1), |s| Ok(s.held.clone()))
            .unwrap();
        assert_eq!(
            held,
            HashMap::from([(SeriesId(1), Day(1)), (SeriesId(2), Day(2))])
        );
        // Once loaded, the ledger is the source: a later store write does not reload it.
        put(4, 48);
        let len = ledger
            .with_server(&store, server, Day(1), |s| Ok(s.len()))
            .unwrap();
        assert_eq!(len, 2);
    }
}
