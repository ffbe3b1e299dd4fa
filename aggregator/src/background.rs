//! The background task: every rollup interval, build the rollups of closed dirty days
//! and apply retention.
//!
//! Hourly retention works in whole UTC days, like rollups: the day holding
//! (now − `retention.hourly`) and every later one keep their rows; an earlier day loses
//! all of its rows at once, and only once it is rolled up (not dirty) and its rows merge
//! (no conflict). The collector accepts snapshots from the first hour of that same day
//! (`accepted_from`), so no snapshot lands in a day whose hours are gone and no
//! rebuild reads a day with some of its hours deleted.
//!
//! In cluster mode hourly rows are kept `cluster.max_age` longer: a node applies a push
//! from the stream up to that long after the entry accepted it, and the push's day must
//! still have its hours then.
//!
//! A day is closed once its end plus the lateness window has passed (DESIGN §4): later
//! snapshots are still stored, mark the day dirty again, and the next pass rebuilds it.
//! Each pass runs on a blocking thread and takes no lock of its own; the store's
//! `replace_rollups` detects a push that raced a rebuild, so pushes and queries never
//! wait for a pass.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use hourglass_rpc::time::{since_unix_epoch, unix_now};

use tokio::time::MissedTickBehavior;

use crate::config::Config;
use crate::keys::{Day, Hour};
use crate::metrics::Metrics;
use crate::rollup::build_dirty_days;
use crate::store::Store;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PassReport {
    /// Series-days whose rollups were built.
    pub(crate) days: u64,
    /// Rollup sketches written.
    pub(crate) rollups: u64,
    /// Days rebuilt while a push touched them; they stay dirty for the next pass.
    pub(crate) raced: u64,
    /// Hourly rows deleted by retention.
    pub(crate) hourly_deleted: u64,
    /// Rollups deleted by retention.
    pub(crate) rollups_deleted: u64,
    /// Days whose rows do not merge, recorded as conflicts this pass.
    pub(crate) conflicts: u64,
    /// Rows that arrived in a day whose hours retention had deleted, not rolled up.
    pub(crate) late_rows_dropped: u64,
    /// (series, day) pairs past hourly retention whose rows are kept: not yet rolled up,
    /// or in conflict.
    pub(crate) held_days: u64,
    /// Days in conflict now (their rollups cannot be built).
    pub(crate) conflicted_days: u64,
    /// Seconds since the oldest closed day still waiting for rollups closed.
    pub(crate) lag_seconds: u64,
}

/// The bounds of one pass, computed from the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PassBounds {
    /// Days before this one are closed: their end plus lateness has passed.
    pub(crate) closed_before: Day,
    /// Hourly rows of days before this one are past retention.
    pub(crate) hourly_before: Day,
    /// Rollups before this day are past retention.
    pub(crate) rollups_before: Day,
}

impl PassBounds {
    /// The bounds at `now` (seconds since the epoch) under `config`.
    pub fn at(now: u64, config: &Config) -> PassBounds {
        let hour = |secs: u64| Hour(u32::try_from(secs / 3600).unwrap_or(u32::MAX));
        // The day that holds (now − lateness) is still open; every earlier one is closed.
        let closed_before = hour(now.saturating_sub(config.rollup.lateness.as_secs())).day();
        // In cluster mode a node may apply a push up to cluster.max_age after the entry
        // accepted it (collector's `checked_hours`): its day's rows must still be here.
        let stream_delay = config
            .cluster
            .as_ref()
            .map_or(Duration::ZERO, |c| c.max_age);
        let hourly_before = hourly_retention_day(
            now.saturating_sub(stream_delay.as_secs()),
            config.retention.hourly,
        );
        let rollups_before = hour(now.saturating_sub(config.retention.rollups.as_secs())).day();
        PassBounds {
            closed_before,
            hourly_before,
            rollups_before,
        }
    }
}

/// The oldest day whose hourly rows retention keeps at `now` (seconds since the epoch):
/// the day holding `now − retention`. The collector accepts snapshots from its first hour.
pub(crate) fn hourly_retention_day(now: u64, retention: Duration) -> Day {
    let hour = u32::try_from(now.saturating_sub(retention.as_secs()) / 3600).unwrap_or(u32::MAX);
    Hour(hour).day()
}

/// The first hour the collector accepts snapshots and live hours of at `now`: the first
/// hour of the oldest day retention will still keep an hour from now. The hour of margin
/// covers a push validated just before a day leaves retention and stored just after the
/// pass that deletes it: its day is never one a pass running meanwhile deletes.
pub(crate) fn accepted_from(now: u64, retention: Duration) -> Hour {
    hourly_retention_day(now.saturating_add(3600), retention).first_hour()
}

/// Runs one pass: rollups first (so a day is rolled up before its hours age out), then
/// retention. Blocking: call it from a blocking thread.
pub(crate) fn run_pass(
    store: &dyn Store,
    bounds: PassBounds,
    days_per_pass: usize,
    lateness: Duration,
    now: u64,
) -> Result<PassReport, crate::planner::QueryError> {
    let span = tracing::info_span!(
        "rollup_pass",
        days = tracing::field::Empty,
        rollups = tracing::field::Empty,
        hourly_deleted = tracing::field::Empty,
        rollups_deleted = tracing::field::Empty,
    );
    let _entered = span.enter();
    let built = build_dirty_days(store, bounds.closed_before, days_per_pass)?;
    // Days past hourly retention keep their rows while they wait for rollups (a backlog
    // bigger than days_per_pass) or cannot have any (a conflict): deleting them would
    // lose data no rollup holds.
    let conflicts = store.day_conflicts()?;
    let mut keep: BTreeSet<_> = store
        .dirty_days(bounds.hourly_before, usize::MAX)?
        .into_iter()
        .map(|d| (d.series, d.day))
        .collect();
    keep.extend(
        conflicts
            .iter()
            .filter(|c| c.day < bounds.hourly_before)
            .map(|c| (c.series, c.day)),
    );
    keep.retain(|(_, day)| *day >= bounds.rollups_before);
    let hourly_deleted = store.delete_hourly_before(bounds.hourly_before, &keep)?;
    let rollups_deleted = store.delete_rollups_before(bounds.rollups_before)?;
    let conflicted_days = conflicts
        .iter()
        .filter(|c| c.day >= bounds.rollups_before)
        .count() as u64;
    span.record("days", built.days);
    span.record("rollups", built.rollups);
    span.record("hourly_deleted", hourly_deleted);
    span.record("rollups_deleted", rollups_deleted);
    // The oldest dirty day still closed after this pass is how far rollups lag.
    let lag_seconds = store
        .dirty_days(bounds.closed_before, 1)?
        .first()
        .map_or(0, |oldest| {
            let closed_at = u64::from(oldest.day.next().first_hour().0) * 3600 + lateness.as_secs();
            now.saturating_sub(closed_at)
        });
    Ok(PassReport {
        days: built.days,
        rollups: built.rollups,
        raced: built.raced,
        hourly_deleted,
        rollups_deleted,
        conflicts: built.conflicts,
        late_rows_dropped: built.late_rows_dropped,
        held_days: keep.len() as u64,
        conflicted_days,
        lag_seconds,
    })
}

/// Runs a pass every `config.rollup.interval` until `shutdown` completes; a pass in
/// progress is finished first so no rebuild is left half done.
pub(crate) async fn run(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    config: Config,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut ticks = tokio::time::interval(config.rollup.interval);
    // After a long pass, run the next one an interval later rather than back to back.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = &mut shutdown => break,
        }
        let now = since_unix_epoch().as_secs();
        let bounds = PassBounds::at(now, &config);
        let pass_store = Arc::clone(&store);
        let (limit, lateness) = (config.rollup.days_per_pass, config.rollup.lateness);
        let started = std::time::Instant::now();
        let result = tokio::task::spawn_blocking(move || {
            run_pass(pass_store.as_ref(), bounds, limit, lateness, now)
        })
        .await;
        let outcome = match result {
            Ok(Ok(report)) => {
                record_pass(&metrics, &report, started.elapsed());
                "ok"
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "rollup pass failed; retrying next interval");
                "error"
            }
            Err(e) => {
                tracing::error!(error = %e, "rollup pass task failed; retrying next interval");
                "error"
            }
        };
        metrics
            .rollup_passes
            .get_or_create(&crate::metrics::OutcomeLabel { outcome })
            .inc();
    }
}

/// Counts a finished pass in the metrics and logs it (at info when it did something).
fn record_pass(metrics: &Metrics, report: &PassReport, elapsed: std::time::Duration) {
    metrics.rollup_days.inc_by(report.days);
    metrics.rollups_written.inc_by(report.rollups);
    let deleted = |what| crate::metrics::WhatLabel { what };
    metrics
        .retention_deleted
        .get_or_create(&deleted("hourly"))
        .inc_by(report.hourly_deleted);
    metrics
        .retention_deleted
        .get_or_create(&deleted("rollups"))
        .inc_by(report.rollups_deleted);
    metrics.rollup_conflicts.inc_by(report.conflicts);
    metrics
        .rollup_late_rows_dropped
        .inc_by(report.late_rows_dropped);
    metrics
        .conflicted_days
        .set(i64::try_from(report.conflicted_days).unwrap_or(i64::MAX));
    metrics
        .retention_held_days
        .set(i64::try_from(report.held_days).unwrap_or(i64::MAX));
    metrics
        .rollup_lag_seconds
        .set(i64::try_from(report.lag_seconds).unwrap_or(i64::MAX));
    metrics.last_rollup_pass.set(unix_now());
    let busy = report.days + report.hourly_deleted + report.rollups_deleted + report.conflicts > 0;
    if busy {
        tracing::info!(
            days = report.days,
            rollups = report.rollups,
            raced = report.raced,
            hourly_deleted = report.hourly_deleted,
            rollups_deleted = report.rollups_deleted,
            conflicts = report.conflicts,
            held_days = report.held_days,
            lag_seconds = report.lag_seconds,
            elapsed = ?elapsed,
            "rollup pass"
        );
    } else {
        tracing::debug!(
            lag_seconds = report.lag_seconds,
            "rollup pass: nothing to do"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Epoch, HourKey};
    use crate::store::{Dictionaries, Hourly, MemoryStore, Rollups, SeriesName};
    use hourglass_sketch::Kind;
    use hourglass_sketch::hll::Hll;

    const DAY_SECS: u64 = 86_400;

    #[test]
    fn a_day_closes_lateness_after_it_ends() {
        let config = Config::default();
        // Day 1000 ends at 1001 * DAY; with 1h lateness it is closed from 01:00 of day 1001.
        let before = PassBounds::at(1001 * DAY_SECS + 3599, &config);
        assert_eq!(before.closed_before, Day(1000));
        let after = PassBounds::at(1001 * DAY_SECS + 3600, &config);
        assert_eq!(after.closed_before, Day(1001));
        assert_eq!(after.hourly_before, Day(1001 - 35));
        assert_eq!(after.rollups_before, Day(1001 - 400));
        // In cluster mode hourly rows stay cluster.max_age longer (7 days by default): a
        // node may apply a push from the stream that much later.
        let cluster = Config {
            cluster: Some(crate::config::ClusterConfig::new(
                "n",
                vec!["nats://h:4222".into()],
            )),
            ..Config::default()
        };
        let after = PassBounds::at(1001 * DAY_SECS + 3600, &cluster);
        assert_eq!(after.hourly_before, Day(1001 - 35 - 7));
        assert_eq!(after.rollups_before, Day(1001 - 400));
    }

    /// One distinct row of precision `p` holding `item`.
    fn row(store: &MemoryStore, hour: Hour, p: u8, item: &[u8]) {
        let name = SeriesName::new("visitors", vec![], Kind::Distinct);
        let series = store.series_id_or_create(&name).unwrap();
        let server = store.register_server("web-1", &[]).unwrap();
        let mut hll = Hll::new(p).unwrap();
        hll.insert(item);
        let key = HourKey {
            series,
            hour,
            server,
            epoch: Epoch(1),
        };
        store.put_hourly(&[(key, 1, hll.encode().into())]).unwrap();
    }

    #[test]
    fn a_day_that_does_not_merge_stops_neither_later_days_nor_retention() {
        let store = MemoryStore::new();
        // Day 100: a row that does not decode as its kind says; day 101: a good one.
        row(&store, Hour(100 * 24 + 1), 12, b"a");
        let name = SeriesName::new("visitors", vec![], Kind::Distinct);
        let series = store.series_id_or_create(&name).unwrap();
        let server = store.register_server("web-1", &[]).unwrap();
        let mut bloom = hourglass_sketch::bloom::Bloom::new(100, 0.01).unwrap();
        bloom.insert(b"x");
        let key = HourKey {
            series,
            hour: Hour(100 * 24 + 2),
            server,
            epoch: Epoch(1),
        };
        store
            .put_hourly(&[(key, 1, bloom.encode().into())])
            .unwrap();
        row(&store, Hour(101 * 24 + 1), 12, b"b");
        row(&store, Hour(90 * 24), 12, b"old");
        let now = 102 * DAY_SECS + 7200;
        let config = Config::default();
        let mut bounds = PassBounds::at(now, &config);
        // Hourly retention up to day 101: day 90 goes, day 100 stays (conflict).
        bounds.hourly_before = Day(101);
        let report = run_pass(&store, bounds, 100, config.rollup.lateness, now).unwrap();
        assert_eq!((report.conflicts, report.days), (1, 2), "{report:?}");
        assert_eq!(report.hourly_deleted, 1, "{report:?}");
        assert_eq!((report.held_days, report.conflicted_days), (1, 1));
        assert!(
            store
                .get_rollup(crate::keys::DayKey {
                    series,
                    day: Day(101),
                    server: crate::keys::ServerId::ALL
                })
                .unwrap()
                .is_some()
        );
        let mut kept = 0;
        store
            .scan_hourly(series, Day(100).hours(), &mut |_, _| {
                kept += 1;
                true
            })
            .unwrap();
        assert_eq!(kept, 2, "the conflicted day keeps its rows");
        // It is not retried every pass.
        let again = run_pass(&store, bounds, 100, config.rollup.lateness, now).unwrap();
        assert_eq!((again.conflicts, again.days), (0, 0), "{again:?}");
    }

    #[test]
    fn a_pass_rolls_up_closed_days_and_reports_no_lag_after() {
        let store = MemoryStore::new();
        row(&store, Hour(100 * 24 + 5), 12, b"user-1");
        let now = 102 * DAY_SECS;
        let config = Config::default();
        let bounds = PassBounds::at(now, &config);
        let report = run_pass(&store, bounds, 100, config.rollup.lateness, now).unwrap();
        assert_eq!(report.days, 1);
        assert_eq!(report.rollups, 2, "one for the server, one for all servers");
        assert_eq!(report.lag_seconds, 0);
        let again = run_pass(&store, bounds, 100, config.rollup.lateness, now).unwrap();
        assert_eq!(again.days, 0, "nothing left dirty");
    }
}
