//! What a store holds at a snapshot's place: the version stored for a (series, hour,
//! server, epoch), which answers a snapshot STORED or STALE once its owner applied it in
//! cluster mode (the entry asks the owners; an owner looks it up here).

use crate::keys::{Epoch, Hour};
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

/// The version this store holds for each of `sent` (pushed by `server`), or `None`.
pub(crate) fn held_versions(
    store: &dyn Store,
    server: &str,
    sent: &[HeldKey],
) -> Result<Vec<Option<u64>>, crate::store::StoreError> {
    let Some(server_id) = store.server_id(server)? else {
        return Ok(vec![None; sent.len()]);
    };
    let mut out = Vec::with_capacity(sent.len());
    for v in sent {
        let mut held = None;
        if let Some(series) = store.series_id(&v.name)? {
            store.scan_hourly(series, v.hour..v.hour.next(), &mut |key, stored| {
                if key.server == server_id && key.epoch == Epoch(v.epoch) {
                    held = Some(stored.version);
                    return false;
                }
                true
            })?;
        }
        out.push(held);
    }
    Ok(out)
}
