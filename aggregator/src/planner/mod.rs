//! The query planner: which hourly rows and daily rollups answer a selection, and the one
//! merge order that makes both give the same bytes.
//!
//! A query names a metric and kind, tag filters, an hour range, a server selection and a
//! grouping. The planner resolves the series and servers, then for every series and every
//! day of the range merges either that day's rollup (a whole day, rolled up, not dirty) or
//! its hourly rows (the edges of the range, days not yet closed or touched by a late
//! snapshot).
//!
//! **One merge tree.** Frequent-items summaries are not associative byte for byte (see
//! `hourglass_sketch::frequent`), so an answer from rollups equals the answer from hourly
//! rows only if both merge in the same order. `merge_day` is that order, and both the
//! rollup builder and the hourly path use it: a day's rows merge in key order (hour,
//! server, epoch) into the all-servers day sketch, and each server's rows in key order into
//! its own day sketch; a subset of servers merges its servers' day sketches in server-id
//! order; days merge in day order, series in id order.
//!
//! **Membership lookups merge nothing** (`Planner::look_up`, `lookup.rs`): each stored
//! filter of the selection answers for the item on its own.

use crate::glob;
use crate::keys::{Day, DayKey, Hour, HourKey, SeriesId, ServerId};
use crate::store::{
    HourCache, HourMerge, HourSelection, SeriesName, ServerEntry, Store, StoreError,
};
use hourglass_sketch::Kind;
use hourglass_sketch::Sketch;
use std::collections::BTreeMap;
use std::ops::Range;
use thiserror::Error;

mod lookup;
pub(crate) use lookup::{FilterRow, combine_rows};

/// How to split an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupBy {
    /// One answer.
    None,
    /// One answer per selected server.
    Server,
    /// One answer per hour.
    Hour,
    /// One answer per UTC day.
    Day,
    /// One answer per value of a tag.
    Tag(String),
}

/// What to merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Selector {
    /// The metric.
    pub(crate) metric: String,
    /// Which kind of the metric's sketches.
    pub(crate) kind: Kind,
    /// A series is selected if it has all of these tags.
    pub(crate) tags: Vec<(String, String)>,
    /// The hours, `[start, end)`.
    pub(crate) hours: Range<Hour>,
    /// Server names or globs; empty selects all.
    pub(crate) servers: Vec<String>,
    /// A server is selected only if it has all of these labels.
    pub(crate) labels: Vec<(String, String)>,
    /// How to split the answer.
    pub(crate) group_by: GroupBy,
}

/// How much data an answer saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Coverage {
    /// Hourly rows and rollups merged.
    pub(crate) sketches_merged: u64,
    /// Selected server-hours no push declared live.
    pub(crate) server_hours_missing: u64,
    /// Servers with missing hours and how many each, at most [`MAX_MISSING_LISTED`].
    pub(crate) missing: Vec<(String, u64)>,
    /// Cluster mode: partitions no ready node answered for.
    pub(crate) missing_partitions: Vec<u32>,
}

/// The most servers with missing hours an answer lists by name.
pub(crate) const MAX_MISSING_LISTED: usize = 100;

/// A merged sketch and what went into it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Merged {
    /// The merge of every selected sketch; `None` if there was none (and always with a
    /// membership lookup, which merges nothing).
    pub(crate) sketch: Option<Sketch>,
    /// What it saw.
    pub(crate) coverage: Coverage,
    /// A membership lookup ([`Planner::look_up`]): each stored filter's answer, in no
    /// particular order ([`lookup::combine_rows`] orders them).
    pub(crate) filters: Vec<FilterRow>,
}

/// The answer to a selection.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Answer {
    /// Over the whole selection.
    pub(crate) total: Merged,
    /// Per group, in key order, when the selector groups.
    pub(crate) groups: Vec<(String, Merged)>,
    /// Which rows and rollups were read: for traces and tests.
    pub(crate) plan: PlanStats,
}

/// What a query read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PlanStats {
    /// Hourly rows merged.
    pub(crate) hourly_rows: u64,
    /// Daily rollups merged.
    pub(crate) rollups: u64,
    /// Series selected.
    pub(crate) series: u64,
    /// Servers selected.
    pub(crate) servers: u64,
}

/// Why a query cannot be answered.
#[derive(Debug, Error)]
pub enum QueryError {
    /// No series of the metric exists.
    #[error("unknown metric {metric:?}: no agent has pushed it")]
    UnknownMetric {
        /// The metric asked for.
        metric: String,
    },
    /// The metric exists but keeps no sketches of the kind asked for.
    #[error("metric {metric:?} keeps no {kind} sketches (it keeps: {kept})")]
    WrongKind {
        /// The metric.
        metric: String,
        /// The kind asked for.
        kind: Kind,
        /// The kinds it has.
        kept: String,
    },
    /// The tag filters select no series.
    #[error("no series of {metric:?} has the tags {tags}")]
    NoSeries {
        /// The metric.
        metric: String,
        /// The filters, as `k=v,...`.
        tags: String,
    },
    /// The selection would merge more than the fan-out limit.
    #[error(
        "the query would merge {series} series × {servers} servers × {groups} groups, more than limits.max_query_fanout = {limit}: select fewer servers or series, or group less finely"
    )]
    FanOut {
        /// Series selected.
        series: usize,
        /// Servers selected.
        servers: usize,
        /// Groups (1 without grouping).
        groups: usize,
        /// The limit.
        limit: u64,
    },
    /// The server selection matches no server.
    #[error("no server matches the selection ({selection})")]
    NoServers {
        /// The selection, as given.
        selection: String,
    },
    /// The range is empty.
    #[error("empty hour range {start}..{end}")]
    EmptyRange {
        /// First hour.
        start: u32,
        /// End hour.
        end: u32,
    },
    /// Two stored sketches cannot merge (an agent changed a metric's parameters).
    #[error(
        "cannot merge {series} at {key}: {source}; its sketch parameters changed there (a metric's settings or an agent's version): ask for the hours before and after the change separately"
    )]
    Incompatible {
        /// The series.
        series: String,
        /// Where: the hour or day and server of the sketch that did not merge.
        key: String,
        /// Why.
        source: hourglass_sketch::MergeError,
    },
    /// A stored sketch does not decode.
    #[error("stored sketch of {series} at {key} is unreadable: {source}")]
    Corrupt {
        /// The series.
        series: String,
        /// Where.
        key: String,
        /// Why.
        source: hourglass_sketch::DecodeError,
    },
    /// Part of a day was asked for whose hourly rows retention deleted: only its
    /// rollups, of the whole day, are left.
    #[error(
        "hours {start}..{end} of {day} are past hourly retention: only whole days are kept for it; ask for whole days"
    )]
    PastHourlyRetention {
        /// The day, formatted.
        day: String,
        /// First hour asked for.
        start: u32,
        /// End hour asked for.
        end: u32,
    },
    /// A stored sketch of a membership series is not a Bloom filter.
    #[error("stored sketch of {series} at {key} is a {kind} sketch, not a membership filter")]
    NotAFilter {
        /// The series.
        series: String,
        /// Where.
        key: String,
        /// The kind it holds.
        kind: Kind,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `one` of each of `items`, on every core: the results in `items`' order, each as a
/// one-thread map would give it.
fn on_every_core<T: Sync, R: Send>(items: &[T], one: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len());
    if threads <= 1 {
        return items.iter().map(one).collect();
    }
    let mut slots: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let one = &one;
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    items
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| i % threads == t)
                        .map(|(i, d)| (i, one(d)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for worker in workers {
            for (i, result) in worker.join().expect("a day merge panicked") {
                slots[i] = Some(result);
            }
        }
    });
    slots
        .into_iter()
        .map(|slot| slot.expect("every day merged"))
        .collect()
}

/// Merges `next` into `acc`, or makes it the accumulator.
fn fold(acc: &mut Option<Sketch>, next: Sketch) -> Result<(), hourglass_sketch::MergeError> {
    match acc {
        Some(a) => a.merge(&next),
        None => {
            *acc = Some(next);
            Ok(())
        }
    }
}

/// One day's sketches of one series, merged in the canonical order: all servers together,
/// and each server alone.
#[derive(Debug, Default)]
pub(crate) struct DaySketches {
    /// Every row of the day, in key order.
    pub(crate) all: Option<Sketch>,
    /// Each server's rows, in key order.
    pub(crate) per_server: BTreeMap<ServerId, Sketch>,
    /// Rows merged.
    pub(crate) rows: u64,
}

/// Which day sketches `merge_day` builds: both cost a decode-and-merge per row, so a
/// query builds only the one it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DayParts {
    /// Build [`DaySketches::all`].
    pub(crate) all: bool,
    /// Build [`DaySketches::per_server`].
    pub(crate) per_server: bool,
}

/// An hourly row as an error names it: its hour (as stored and as a time), its server
/// and its epoch.
fn hourly_row_name(key: &HourKey) -> String {
    format!(
        "{} ({}) {} epoch {}",
        key.hour,
        hourglass_rpc::time::format_hour(key.hour.0),
        key.server,
        key.epoch.0
    )
}

/// Merges the hourly rows of `series` in `hours` (within one day) the way rollups are
/// built: the single definition of the merge order (module docs).
pub(crate) fn merge_day(
    store: &dyn Store,
    series: &SeriesName,
    series_id: SeriesId,
    hours: Range<Hour>,
    keep: &dyn Fn(ServerId) -> bool,
    parts: DayParts,
) -> Result<DaySketches, QueryError> {
    let mut day = DaySketches::default();
    let mut failure = None;
    store.scan_hourly(series_id, hours, &mut |key: HourKey, stored| {
        if !keep(key.server) {
            return true;
        }
        let where_ = || hourly_row_name(&key);
        let sketch = match Sketch::decode(&stored.sketch) {
            Ok(s) => s,
            Err(source) => {
                failure = Some(QueryError::Corrupt {
                    series: series.to_string(),
                    key: where_(),
                    source,
                });
                return false;
            }
        };
        let per_server = if !parts.per_server {
            Ok(())
        } else if let Some(s) = day.per_server.get_mut(&key.server) {
            s.merge(&sketch)
        } else if parts.all {
            day.per_server.insert(key.server, sketch.clone());
            Ok(())
        } else {
            day.per_server.insert(key.server, sketch);
            day.rows += 1;
            return true;
        };
        let merged = per_server.and_then(|()| match parts.all {
            true => fold(&mut day.all, sketch),
            false => Ok(()),
        });
        if let Err(source) = merged {
            failure = Some(QueryError::Incompatible {
                series: series.to_string(),
                key: where_(),
                source,
            });
            return false;
        }
        day.rows += 1;
        true
    })?;
    match failure {
        Some(e) => Err(e),
        None => Ok(day),
    }
}

/// One day's merged sketch and what it was made of.
struct DaySketch {
    sketch: Option<Sketch>,
    rollups: u64,
    rows: u64,
}

/// Answers selections from a store.
pub(crate) struct Planner<'a> {
    store: &'a dyn Store,
    max_fanout: u64,
    retire_hours: u32,
    /// Cluster mode: the partition count and the partitions whose series are merged.
    only: Option<(u32, std::collections::BTreeSet<u32>)>,
    /// A membership lookup: the item's hash, looked up in each filter instead of merging.
    lookup: Option<u64>,
}

/// A resolved piece of work: which series, servers and hours merge into one answer.
struct Unit<'s> {
    series: Vec<&'s (SeriesId, SeriesName)>,
    servers: Vec<&'s ServerEntry>,
    hours: Range<Hour>,
}

impl<'a> Planner<'a> {
    /// A planner over `store`.
    pub fn new(store: &'a dyn Store) -> Planner<'a> {
        Planner {
            store,
            max_fanout: u64::MAX,
            retire_hours: 7 * 24,
            only: None,
            lookup: None,
        }
    }

    /// A membership lookup of the item of `hash` ([`hourglass_sketch::hash::item_hash`]):
    /// answers carry each stored filter's answer ([`Merged::filters`]) and no merge.
    pub(crate) fn look_up(mut self, hash: u64) -> Planner<'a> {
        self.lookup = Some(hash);
        self
    }

    /// Cluster mode: merges only the series of `partitions` (of `count`); everything else
    /// (the selection, its checks, its groups and coverage) is the whole selection's.
    pub(crate) fn only_partitions(
        mut self,
        count: u32,
        partitions: std::collections::BTreeSet<u32>,
    ) -> Planner<'a> {
        self.only = Some((count, partitions));
        self
    }

    /// Whether a series is merged here (always, outside cluster mode).
    fn merges(&self, name: &SeriesName) -> bool {
        self.only
            .as_ref()
            .is_none_or(|(count, keep)| keep.contains(&crate::placement::partition(name, *count)))
    }

    /// A server is expected from its first live hour until `hours` after its last one;
    /// coverage counts only expected hours as missing (default 7 days).
    pub fn retire_after(mut self, hours: u32) -> Planner<'a> {
        self.retire_hours = hours;
        self
    }

    /// Refuses selections that would merge more than `max` series × servers × groups.
    pub(crate) fn limit_fanout(mut self, max: u64) -> Planner<'a> {
        self.max_fanout = max;
        self
    }

    /// Answers a selection.
    pub fn answer(&self, sel: &Selector) -> Result<Answer, QueryError> {
        if sel.hours.start >= sel.hours.end {
            return Err(QueryError::EmptyRange {
                start: sel.hours.start.0,
                end: sel.hours.end.0,
            });
        }
        let all_series = self.store.list_series()?;
        let series = select_series(&all_series, sel)?;
        let all_servers = self.store.list_servers()?;
        let servers = select_servers(&all_servers, sel)?;
        let every_server = sel.servers.is_empty() && sel.labels.is_empty();
        let mut plan = PlanStats {
            series: series.len() as u64,
            servers: servers.len() as u64,
            ..PlanStats::default()
        };

        let whole = Unit {
            series: series.clone(),
            servers: servers.clone(),
            hours: sel.hours.clone(),
        };
        let groups = group_units(sel, &series, &servers);

        let fanout = (series.len() as u64)
            .saturating_mul(servers.len() as u64)
            .saturating_mul(groups.len().max(1) as u64);
        if fanout > self.max_fanout {
            return Err(QueryError::FanOut {
                series: series.len(),
                servers: servers.len(),
                groups: groups.len().max(1),
                limit: self.max_fanout,
            });
        }
        // With groups, the total is their merge (no row is read twice); its coverage is
        // computed over the whole selection.
        let (total, groups) = if groups.is_empty() {
            (
                self.merge_unit(&whole, every_server, &mut plan)?,
                Vec::new(),
            )
        } else {
            let mut merged_groups = Vec::with_capacity(groups.len());
            let mut total = None;
            let mut filters = Vec::new();
            let mut sketches_merged = 0;
            for (key, unit) in &groups {
                let every = every_server && !matches!(sel.group_by, GroupBy::Server);
                let merged = self.merge_unit(unit, every, &mut plan)?;
                sketches_merged += merged.coverage.sketches_merged;
                filters.extend(merged.filters.iter().cloned());
                if let Some(s) = &merged.sketch {
                    fold(&mut total, s.clone()).map_err(|source| QueryError::Incompatible {
                        series: sel.metric.clone(),
                        key: format!("group {key}"),
                        source,
                    })?;
                }
                merged_groups.push((key.clone(), merged));
            }
            let mut coverage = self.coverage_of(&whole)?;
            coverage.sketches_merged = sketches_merged;
            (
                Merged {
                    sketch: total,
                    coverage,
                    filters,
                },
                merged_groups,
            )
        };
        Ok(Answer {
            total,
            groups,
            plan,
        })
    }

    /// Merges one unit in the canonical order (module docs).
    fn merge_unit(
        &self,
        unit: &Unit,
        every_server: bool,
        plan: &mut PlanStats,
    ) -> Result<Merged, QueryError> {
        if let Some(hash) = self.lookup {
            return self.lookup_unit(unit, hash, plan);
        }
        let selected: std::collections::BTreeSet<ServerId> =
            unit.servers.iter().map(|s| s.id).collect();
        let keep = |id: ServerId| selected.contains(&id);
        let mut acc: Option<Sketch> = None;
        let mut sketches_merged = 0;
        for (series_id, name) in unit.series.iter().map(|s| (s.0, &s.1)) {
            if !self.merges(name) {
                continue;
            }
            let days: Vec<(Day, Range<Hour>)> = days_of(&unit.hours).collect();
            let one_day = |(day, hours): &(Day, Range<Hour>)| {
                self.day_sketch(
                    name,
                    series_id,
                    *day,
                    hours.clone(),
                    every_server,
                    unit,
                    &keep,
                )
            };
            // Days are independent: merge them on every core, then fold them in day
            // order, so the answer is the same bytes as a one-thread merge.
            let merged_days = on_every_core(&days, one_day);
            for ((day, _), merged) in days.iter().zip(merged_days) {
                let merged = merged?;
                plan.rollups += merged.rollups;
                plan.hourly_rows += merged.rows;
                sketches_merged += merged.rollups + merged.rows;
                if let Some(s) = merged.sketch {
                    fold(&mut acc, s).map_err(|source| QueryError::Incompatible {
                        series: name.to_string(),
                        key: format!("{day} ({})", hourglass_rpc::time::format_day(day.0)),
                        source,
                    })?;
                }
            }
        }
        let mut coverage = self.coverage_of(unit)?;
        coverage.sketches_merged = sketches_merged;
        Ok(Merged {
            sketch: acc,
            coverage,
            filters: Vec::new(),
        })
    }

    /// One day of one series: from rollups when the whole day is rolled up and clean,
    /// else from its hourly rows.
    #[allow(clippy::too_many_arguments)]
    fn day_sketch(
        &self,
        name: &SeriesName,
        series_id: SeriesId,
        day: Day,
        hours: Range<Hour>,
        every_server: bool,
        unit: &Unit,
        keep: &(dyn Fn(ServerId) -> bool + Sync),
    ) -> Result<DaySketch, QueryError> {
        if hours == day.hours()
            && let Some((sketch, count)) =
                self.rollup_day(name, series_id, day, every_server, &unit.servers)?
        {
            return Ok(DaySketch {
                sketch,
                rollups: count,
                rows: 0,
            });
        }
        // Part of a day whose hours retention deleted: its rows are gone, and its
        // liveness (kept with the rollups) would call an empty answer complete.
        if hours != day.hours() && self.store.is_day_expired(series_id, day)? {
            return Err(QueryError::PastHourlyRetention {
                day: hourglass_rpc::time::format_day(day.0),
                start: hours.start.0,
                end: hours.end.0,
            });
        }
        if let Some(cache) = self.store.hour_cache()
            && cache.enabled()
            && name.kind == Kind::Distinct
            && let Some(merged) = self.hours_from_cache(
                cache,
                name,
                series_id,
                hours.clone(),
                every_server,
                unit,
                keep,
            )
        {
            return Ok(merged);
        }
        let parts = DayParts {
            all: every_server,
            per_server: !every_server,
        };
        let day_rows = merge_day(self.store, name, series_id, hours, keep, parts)?;
        let sketch = if every_server {
            day_rows.all
        } else {
            merge_servers(day_rows.per_server.into_values(), name, day)?
        };
        Ok(DaySketch {
            sketch,
            rollups: 0,
            rows: day_rows.rows,
        })
    }

    /// Part of a day of a distinct series from the hour cache (`store::cache`): each hour
    /// merged once from its rows and kept while no write touches it. Distinct sketches
    /// merge to the same bytes in any order, so this is the answer of [`merge_day`]'s
    /// order, and it reports the same rows as merged. `None` when an hour does not merge
    /// or decode: the caller then reads the rows in the canonical order, which reports
    /// where and why.
    #[allow(clippy::too_many_arguments)]
    fn hours_from_cache(
        &self,
        cache: &HourCache,
        name: &SeriesName,
        series_id: SeriesId,
        hours: Range<Hour>,
        every_server: bool,
        unit: &Unit,
        keep: &(dyn Fn(ServerId) -> bool + Sync),
    ) -> Option<DaySketch> {
        let mut ids: Vec<ServerId> = unit.servers.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        let servers: std::sync::Arc<[ServerId]> = ids.into();
        let parts = DayParts {
            all: every_server,
            per_server: !every_server,
        };
        let mut acc = None;
        let mut rows = 0;
        for hour in (hours.start.0..hours.end.0).map(Hour) {
            let selection = HourSelection {
                series: series_id,
                hour,
                servers: servers.clone(),
            };
            // Taken before the rows are read (the cache's rule of validity).
            let generation = cache.generation(series_id, hour);
            let merge = match cache.get(&selection, generation) {
                Some(merge) => merge,
                None => {
                    let day =
                        merge_day(self.store, name, series_id, hour..hour.next(), keep, parts)
                            .ok()?;
                    let sketch = if every_server {
                        day.all
                    } else {
                        merge_servers(day.per_server.into_values(), name, hour.day()).ok()?
                    };
                    let merge = HourMerge {
                        sketch,
                        rows: day.rows,
                    };
                    cache.put(selection, generation, merge.clone());
                    merge
                }
            };
            rows += merge.rows;
            if let Some(sketch) = merge.sketch {
                fold(&mut acc, sketch).ok()?;
            }
        }
        Some(DaySketch {
            sketch: acc,
            rollups: 0,
            rows,
        })
    }

    /// A day's answer from rollups, with how many were merged, if the day is rolled up and
    /// clean; `None` sends the caller to the hourly rows.
    fn rollup_day(
        &self,
        name: &SeriesName,
        series: SeriesId,
        day: Day,
        every_server: bool,
        servers: &[&ServerEntry],
    ) -> Result<Option<(Option<Sketch>, u64)>, QueryError> {
        // A dirty day is read from its hours, except one whose hours retention deleted:
        // its rows are only late ones, which the builder will not roll up (rollup.rs),
        // and its rollups are the day.
        if self.store.is_day_dirty(series, day)? && !self.store.is_day_expired(series, day)? {
            return Ok(None);
        }
        // The all-servers rollup is written last and always, so it marks a built day; a
        // server with no rollup that day had no rows.
        let Some(all) = self.store.get_rollup(DayKey {
            series,
            day,
            server: ServerId::ALL,
        })?
        else {
            return Ok(None);
        };
        let decode = |bytes: &[u8], server: ServerId| {
            Sketch::decode(bytes).map_err(|source| QueryError::Corrupt {
                series: name.to_string(),
                key: format!(
                    "the rollup of {day} ({}), {server}",
                    hourglass_rpc::time::format_day(day.0)
                ),
                source,
            })
        };
        if every_server {
            return Ok(Some((Some(decode(&all, ServerId::ALL)?), 1)));
        }
        let mut parts = Vec::new();
        for server in servers {
            if let Some(bytes) = self.store.get_rollup(DayKey {
                series,
                day,
                server: server.id,
            })? {
                parts.push(decode(&bytes, server.id)?);
            }
        }
        let count = parts.len() as u64;
        Ok(Some((merge_servers(parts.into_iter(), name, day)?, count)))
    }

    /// Missing server-hours of a unit: hours a server was expected (from its first live
    /// hour to `retire_hours` after its last) and not recorded live.
    fn coverage_of(&self, unit: &Unit) -> Result<Coverage, QueryError> {
        let mut coverage = Coverage::default();
        for server in &unit.servers {
            // A server never recorded live was never expected.
            let Some(live_span) = self.store.live_span(server.id)? else {
                continue;
            };
            let expected_end = Hour(live_span.end.0.saturating_add(self.retire_hours));
            let expected = unit.hours.start.max(live_span.start)..unit.hours.end.min(expected_end);
            if expected.start >= expected.end {
                continue;
            }
            let span = u64::from(expected.end.0 - expected.start.0);
            let live = self.store.live_hours(server.id, expected)?;
            let missing = span.saturating_sub(live);
            if missing > 0 {
                coverage.server_hours_missing += missing;
                if coverage.missing.len() < MAX_MISSING_LISTED {
                    coverage.missing.push((server.name.clone(), missing));
                }
            }
        }
        Ok(coverage)
    }
}

/// Merges per-server day sketches, given in server-id order.
fn merge_servers(
    parts: impl Iterator<Item = Sketch>,
    name: &SeriesName,
    day: Day,
) -> Result<Option<Sketch>, QueryError> {
    let mut acc = None;
    for part in parts {
        fold(&mut acc, part).map_err(|source| QueryError::Incompatible {
            series: name.to_string(),
            key: format!("{day} ({})", hourglass_rpc::time::format_day(day.0)),
            source,
        })?;
    }
    Ok(acc)
}

/// The days a range of hours touches, each with the hours of it inside the range.
pub(crate) fn days_of(hours: &Range<Hour>) -> impl Iterator<Item = (Day, Range<Hour>)> + use<> {
    let (start, end) = (hours.start, hours.end);
    let first = start.day().0;
    let last = if end.0 == 0 {
        0
    } else {
        Hour(end.0 - 1).day().0
    };
    (first..=last).filter(move |_| start < end).map(move |d| {
        let day = Day(d);
        let span = day.hours();
        (day, span.start.max(start)..span.end.min(end))
    })
}

/// `servers` in the order of their names.
fn sorted_by_name<'s>(servers: &[&'s ServerEntry]) -> Vec<&'s ServerEntry> {
    let mut sorted = servers.to_vec();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    sorted
}

/// The units of `sel`'s groups (none without `group_by`), in the order answers list them:
/// by key (a server's name, a tag's value; hours and days, whose keys are fixed-width
/// times, in time order).
fn group_units<'s>(
    sel: &Selector,
    series: &[&'s (SeriesId, SeriesName)],
    servers: &[&'s ServerEntry],
) -> Vec<(String, Unit<'s>)> {
    match &sel.group_by {
        GroupBy::None => Vec::new(),
        // By name, not by when each server first pushed (its id): every node of a
        // cluster, and a single aggregator, list the groups alike.
        GroupBy::Server => sorted_by_name(servers)
            .into_iter()
            .map(|s| {
                let unit = Unit {
                    series: series.to_vec(),
                    servers: vec![s],
                    hours: sel.hours.clone(),
                };
                (s.name.clone(), unit)
            })
            .collect(),
        GroupBy::Hour => (sel.hours.start.0..sel.hours.end.0)
            .map(|h| {
                let unit = Unit {
                    series: series.to_vec(),
                    servers: servers.to_vec(),
                    hours: Hour(h)..Hour(h + 1),
                };
                (hourglass_rpc::time::format_hour(h), unit)
            })
            .collect(),
        GroupBy::Day => days_of(&sel.hours)
            .map(|(day, hours)| {
                let unit = Unit {
                    series: series.to_vec(),
                    servers: servers.to_vec(),
                    hours,
                };
                (hourglass_rpc::time::format_day(day.0), unit)
            })
            .collect(),
        GroupBy::Tag(key) => {
            let mut by_value: BTreeMap<String, Vec<&(SeriesId, SeriesName)>> = BTreeMap::new();
            for s in series {
                let value =
                    s.1.tags
                        .iter()
                        .find(|(k, _)| k == key)
                        .map_or_else(|| format!("(no {key})"), |(_, v)| v.clone());
                by_value.entry(value).or_default().push(*s);
            }
            by_value
                .into_iter()
                .map(|(value, series)| {
                    let unit = Unit {
                        series,
                        servers: servers.to_vec(),
                        hours: sel.hours.clone(),
                    };
                    (value, unit)
                })
                .collect()
        }
    }
}

fn select_series<'s>(
    all: &'s [(SeriesId, SeriesName)],
    sel: &Selector,
) -> Result<Vec<&'s (SeriesId, SeriesName)>, QueryError> {
    let of_metric: Vec<_> = all.iter().filter(|(_, n)| n.metric == sel.metric).collect();
    if of_metric.is_empty() {
        return Err(QueryError::UnknownMetric {
            metric: sel.metric.clone(),
        });
    }
    let of_kind: Vec<_> = of_metric
        .iter()
        .copied()
        .filter(|(_, n)| n.kind == sel.kind)
        .collect();
    if of_kind.is_empty() {
        let mut kinds: Vec<Kind> = of_metric.iter().map(|(_, n)| n.kind).collect();
        kinds.sort();
        kinds.dedup();
        return Err(QueryError::WrongKind {
            metric: sel.metric.clone(),
            kind: sel.kind,
            kept: kinds
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let selected: Vec<_> = of_kind
        .into_iter()
        .filter(|(_, n)| {
            sel.tags
                .iter()
                .all(|(k, v)| n.tags.iter().any(|(nk, nv)| nk == k && nv == v))
        })
        .collect();
    if selected.is_empty() {
        return Err(QueryError::NoSeries {
            metric: sel.metric.clone(),
            tags: pairs(&sel.tags),
        });
    }
    Ok(selected)
}

fn select_servers<'s>(
    all: &'s [ServerEntry],
    sel: &Selector,
) -> Result<Vec<&'s ServerEntry>, QueryError> {
    let selected: Vec<_> = all
        .iter()
        .filter(|s| sel.servers.is_empty() || sel.servers.iter().any(|p| glob::matches(p, &s.name)))
        .filter(|s| {
            sel.labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
        })
        .collect();
    if selected.is_empty() {
        let mut parts: Vec<String> = sel.servers.iter().map(|s| format!("server {s}")).collect();
        parts.extend(sel.labels.iter().map(|(k, v)| format!("label {k}={v}")));
        if parts.is_empty() {
            parts.push("no server has pushed yet".to_string());
        }
        return Err(QueryError::NoServers {
            selection: parts.join(", "),
        });
    }
    Ok(selected)
}

fn pairs(tags: &[(String, String)]) -> String {
    tags.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod lookup_tests;
#[cfg(test)]
mod tests;
