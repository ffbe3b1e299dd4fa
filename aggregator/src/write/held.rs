//! What a store holds at a snapshot's place: the version stored for a (series, hour,
//! server, epoch), which answers a snapshot STORED or STALE once its owner applied it in
//! cluster mode (the entry asks the owners; an owner looks it up here).

use crate::keys::{Epoch, Hour, HourKey};
use crate::store::{SeriesName, Store};

/// One snapshot's place: what a held version is looked up by.
#[derive(Debug, Clone)]
pub(crate) struct HeldKey {
    /// Its series.
    pub(crate) name: SeriesName,
    /// Its hour.
    pub(crate) hour: Hour,
    /// Its epoch.
    pub(crate) epoch: u64,
}

/// The version this store holds for each of `sent` (pushed by `server`), or `None`: one
/// point lookup of each (series, hour, server, epoch), whatever the other servers hold.
pub(crate) fn held_versions(
    store: &dyn Store,
    server: &str,
    sent: &[HeldKey],
) -> Result<Vec<Option<u64>>, crate::store::StoreError> {
    let Some(server) = store.server_id(server)? else {
        return Ok(vec![None; sent.len()]);
    };
    // The keys of the series this store knows, and where each goes in the answer.
    let mut keys = Vec::with_capacity(sent.len());
    let mut at = Vec::with_capacity(sent.len());
    for (i, v) in sent.iter().enumerate() {
        if let Some(series) = store.series_id(&v.name)? {
            keys.push(HourKey {
                series,
                hour: v.hour,
                server,
                epoch: Epoch(v.epoch),
            });
            at.push(i);
        }
    }
    let mut out = vec![None; sent.len()];
    for (i, held) in at.into_iter().zip(store.hourly_versions(&keys)?) {
        out[i] = held;
    }
    Ok(out)
}
