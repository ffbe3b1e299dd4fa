//! Daily rollups: one sketch per (series, day, server) and one per (series, day, all
//! servers), so that a week's query merges 7 rollups instead of 168 hourly rows per server.
//!
//! Every stored hourly snapshot marks its (series, day) dirty in the same atomic write. The
//! builder takes the dirty days that have closed (their lateness window has passed),
//! rebuilds their rollups from the hourly rows with `merge_day` — the same merge order
//! the planner uses, so rollups and hourly rows answer byte for byte alike — and replaces
//! them while clearing the mark only if no snapshot arrived meanwhile. Until then the
//! planner sees the mark and reads hourly rows, so a late snapshot is never hidden behind
//! an old rollup.
//!
//! Two kinds of day are not rebuilt from their hours:
//! - **a day whose rows do not merge** (a metric's parameters changed within it, or a row
//!   does not decode). It is recorded as a conflict
//!   ([`Rollups::mark_day_conflict`](crate::store::Rollups::mark_day_conflict)): no
//!   rollup, its hourly rows kept until rollup retention, queries over it read the rows
//!   and report the hour and cause. The pass goes on with the other days; one such day
//!   never stops the rollups of later days or retention.
//! - **a day whose hours retention deleted**
//!   ([`Retention::is_day_expired`](crate::store::Retention::is_day_expired)): a row that
//!   arrived after that (only a clock stepped back lets one in) would rebuild the day
//!   from itself alone and shrink it. The rollup is kept as it is and the late rows are
//!   counted, logged, and deleted with the day.

use crate::keys::{Day, DayKey, ServerId};
use crate::planner::{DayParts, DaySketches, QueryError, merge_day};
use crate::store::{DirtyDay, Store};
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
    pub(crate) raced: u64,
    /// Days whose rows do not merge, recorded as conflicts instead of rolled up.
    pub(crate) conflicts: u64,
    /// Rows that arrived in a day after retention had deleted its hours, not rolled up.
    pub(crate) late_rows_dropped: u64,
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
        if store.is_day_expired(mark.series, mark.day)? {
            keep_expired_day(store, name, &mark, &mut report)?;
            continue;
        }
        let day = match merge_day(store, name, mark.series, mark.day.hours(), &|_| true, both) {
            Ok(day) => day,
            Err(e @ (QueryError::Incompatible { .. } | QueryError::Corrupt { .. })) => {
                tracing::warn!(
                    series = %name,
                    day = %hourglass_rpc::time::format_day(mark.day.0),
                    error = %e,
                    "the rollups of a day cannot be built; its hourly rows are kept until rollup retention and queries over it say why"
                );
                report.conflicts += 1;
                if !store.mark_day_conflict(mark.series, mark.day, mark.mark, &e.to_string())? {
                    report.raced += 1;
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        let rollups = day_rollups(&mark, &day);
        report.rollups += rollups.len() as u64;
        report.days += 1;
        if !store.replace_rollups(mark.series, mark.day, rollups, mark.mark)? {
            report.raced += 1;
        }
    }
    Ok(report)
}

/// A dirty day whose hours retention already deleted: rebuilt from what is left, it would
/// hold only the late rows, so its rollups are kept as they are (rewritten, to record the
/// mark as built) and the late rows counted and logged.
fn keep_expired_day(
    store: &dyn Store,
    name: &impl std::fmt::Display,
    mark: &DirtyDay,
    report: &mut RollupReport,
) -> Result<(), QueryError> {
    let mut late = 0u64;
    store.scan_hourly(mark.series, mark.day.hours(), &mut |_, _| {
        late += 1;
        true
    })?;
    let mut kept = Vec::new();
    store.scan_rollups(
        mark.series,
        mark.day..mark.day.next(),
        &mut |key, sketch| {
            kept.push((key, sketch.to_vec()));
            true
        },
    )?;
    tracing::warn!(
        series = %name,
        day = %hourglass_rpc::time::format_day(mark.day.0),
        rows = late,
        "snapshots arrived for a day whose hours retention had deleted; the day's rollups are kept and these rows are not rolled up"
    );
    report.late_rows_dropped += late;
    if !store.replace_rollups(mark.series, mark.day, kept, mark.mark)? {
        report.raced += 1;
    }
    Ok(())
}

/// The encoded rollups of a merged day: one per server, and the whole day's.
fn day_rollups(mark: &DirtyDay, day: &DaySketches) -> Vec<(DayKey, Vec<u8>)> {
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
    rollups
}
