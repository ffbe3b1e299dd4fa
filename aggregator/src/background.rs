//! The background task: every rollup interval, build the rollups of closed dirty days
//! and apply retention.
//!
//! A day is closed once its end plus the lateness window has passed (DESIGN §4): later
//! snapshots are still stored, mark the day dirty again, and the next pass rebuilds it.
//! Each pass runs on a blocking thread and takes no lock of its own; the store's
//! `replace_rollups` detects a push that raced a rebuild, so pushes and queries never
//! wait for a pass.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::config::Config;
use crate::keys::{Day, Hour};
use crate::metrics::Metrics;
use crate::rollup::build_dirty_days;
use crate::store::Store;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Series-days whose rollups were built.
    pub days: u64,
    /// Rollup sketches written.
    pub rollups: u64,
    /// Days rebuilt while a push touched them; they stay dirty for the next pass.
    pub raced: u64,
    /// Hourly rows deleted by retention.
    pub hourly_deleted: u64,
    /// Rollups deleted by retention.
    pub rollups_deleted: u64,
    /// Seconds since the oldest closed day still waiting for rollups closed.
    pub lag_seconds: u64,
}

/// The bounds of one pass, computed from the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassBounds {
    /// Days before this one are closed: their end plus lateness has passed.
    pub closed_before: Day,
    /// Hourly rows before this hour are past retention.
    pub hourly_before: Hour,
    /// Rollups before this day are past retention.
    pub rollups_before: Day,
}

impl PassBounds {
    /// The bounds at `now` (seconds since the epoch) under `config`.
    pub fn at(now: u64, config: &Config) -> PassBounds {
        let hour = |secs: u64| Hour(u32::try_from(secs / 3600).unwrap_or(u32::MAX));
        // The day that holds (now − lateness) is still open; every earlier one is closed.
        let closed_before = hour(now.saturating_sub(config.rollup.lateness.as_secs())).day();
        let hourly_before = hour(now.saturating_sub(config.retention.hourly.as_secs()));
        let rollups_before = hour(now.saturating_sub(config.retention.rollups.as_secs())).day();
        PassBounds {
            closed_before,
            hourly_before,
            rollups_before,
        }
    }
}

/// Runs one pass: rollups first (so a day is rolled up before its hours age out), then
/// retention. Blocking: call it from a blocking thread.
pub fn run_pass(
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
    let hourly_deleted = store.delete_hourly_before(bounds.hourly_before)?;
    let rollups_deleted = store.delete_rollups_before(bounds.rollups_before)?;
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
        lag_seconds,
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs a pass every `config.rollup.interval` until `shutdown` flips to true; a pass in
/// progress is finished first so no rebuild is left half done.
pub async fn run(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    config: Config,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(config.rollup.interval);
    // After a long pass, run the next one an interval later rather than back to back.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
        let now = unix_now();
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
                metrics.rollup_days.inc_by(report.days);
                metrics.rollups_written.inc_by(report.rollups);
                let deleted = |what: &str| vec![("what", what.to_string())];
                metrics
                    .retention_deleted
                    .get_or_create(&deleted("hourly"))
                    .inc_by(report.hourly_deleted);
                metrics
                    .retention_deleted
                    .get_or_create(&deleted("rollups"))
                    .inc_by(report.rollups_deleted);
                metrics
                    .rollup_lag_seconds
                    .set(i64::try_from(report.lag_seconds).unwrap_or(i64::MAX));
                metrics
                    .last_rollup_pass
                    .set(i64::try_from(unix_now()).unwrap_or(i64::MAX));
                let busy = report.days + report.hourly_deleted + report.rollups_deleted > 0;
                if busy {
                    tracing::info!(
                        days = report.days,
                        rollups = report.rollups,
                        raced = report.raced,
                        hourly_deleted = report.hourly_deleted,
                        rollups_deleted = report.rollups_deleted,
                        lag_seconds = report.lag_seconds,
                        elapsed = ?started.elapsed(),
                        "rollup pass"
                    );
                } else {
                    tracing::debug!(
                        lag_seconds = report.lag_seconds,
                        "rollup pass: nothing to do"
                    );
                }
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
            .get_or_create(&vec![("outcome", outcome.to_string())])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Epoch, HourKey};
    use crate::store::{MemoryStore, SeriesName};
    use hourglass::Kind;
    use hourglass::sketch::hll::Hll;

    const DAY_SECS: u64 = 86_400;

    #[test]
    fn a_day_closes_lateness_after_it_ends() {
        let config = Config::default();
        // Day 1000 ends at 1001 * DAY; with 1h lateness it is closed from 01:00 of day 1001.
        let before = PassBounds::at(1001 * DAY_SECS + 3599, &config);
        assert_eq!(before.closed_before, Day(1000));
        let after = PassBounds::at(1001 * DAY_SECS + 3600, &config);
        assert_eq!(after.closed_before, Day(1001));
        assert_eq!(after.hourly_before.day(), Day(1001 - 35));
        assert_eq!(after.rollups_before, Day(1001 - 400));
    }

    #[test]
    fn a_pass_rolls_up_closed_days_and_reports_no_lag_after() {
        let store = MemoryStore::new();
        let name = SeriesName::new("visitors", vec![], Kind::Distinct);
        let series = store.series_id(&name, true).unwrap().unwrap();
        let server = store.server_id("web-1", &[], true).unwrap().unwrap();
        let mut hll = Hll::new(12).unwrap();
        hll.insert(b"user-1");
        let hour = Hour(100 * 24 + 5);
        let key = HourKey {
            series,
            hour,
            server,
            epoch: Epoch(1),
        };
        store.put_hourly(&[(key, 1, hll.encode().into())]).unwrap();
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
