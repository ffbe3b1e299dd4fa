//! Daily rollups: one sketch per (series, day, server) and one per (series, day, all
//! servers), so that a week's query merges 7 rollups instead of 168 hourly rows per server.
//!
//! Every stored hourly snapshot marks its (series, day) dirty in the same atomic write. The
//! builder takes the dirty days that have closed (their lateness window has passed),
//! rebuilds their rollups from the hourly rows with [`merge_day`] — the same merge order
//! the planner uses, so rollups and hourly rows answer byte for byte alike — and replaces
//! them while clearing the mark only if no snapshot arrived meanwhile. Until then the
//! planner sees the mark and reads hourly rows, so a late snapshot is never hidden behind
//! an old rollup.

use crate::keys::{Day, DayKey, ServerId};
use crate::planner::{DayParts, QueryError, merge_day};
use crate::store::Store;
use std::collections::HashMap;

/// What one pass of the builder did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollupReport {
    /// (series, day) pairs rebuilt.
    pub days: u64,
    /// Rollups written (per server and all servers).
    pub rollups: u64,
    /// Days whose mark was renewed by a snapshot during the rebuild; they are rebuilt on
    /// a later pass.
    pub raced: u64,
}

/// Rebuilds the rollups of up to `limit` dirty days before `before`.
pub fn build_dirty_days(
    store: &dyn Store,
    before: Day,
    limit: usize,
) -> Result<RollupReport, QueryError> {
    let mut report = RollupReport::default();
    let dirty = store.dirty_days(before, limit)?;
    if dirty.is_empty() {
        return Ok(report);
    }
    let names: HashMap<_, _> = store.list_series()?.into_iter().collect();
    for mark in dirty {
        let Some(name) = names.get(&mark.series) else {
            // A mark for a series the dictionary lost cannot be rebuilt; clearing it keeps
            // the builder from spinning on it.
            store.replace_rollups(mark.series, mark.day, Vec::new(), mark.mark)?;
            continue;
        };
        let both = DayParts {
            all: true,
            per_server: true,
        };
        let day = merge_day(store, name, mark.series, mark.day.hours(), &|_| true, both)?;
        let mut rollups: Vec<(DayKey, Vec<u8>)> = day
            .per_server
            .iter()
            .map(|(server, sketch)| {
                let key = DayKey {
                    series: mark.series,
                    day: mark.day,
                    server: *server,
                };
                (key, sketch.encode())
            })
            .collect();
        if let Some(all) = &day.all {
            let key = DayKey {
                series: mark.series,
                day: mark.day,
                server: ServerId::ALL,
            };
            rollups.push((key, all.encode()));
        }
        report.rollups += rollups.len() as u64;
        report.days += 1;
        if !store.replace_rollups(mark.series, mark.day, rollups, mark.mark)? {
            report.raced += 1;
        }
    }
    Ok(report)
}
