//! Membership lookups over a range: the item looked up in each stored filter a selection
//! covers, never in a merge of them (docs/DESIGN.md §5).
//!
//! Merging a week of hourly Bloom filters makes one filter of every item of the week,
//! which a filter sized for one server-hour cannot hold: it saturates and says "maybe" to
//! everything. A lookup instead reads each filter of the selection (an hourly row per
//! series, server and hour, or a day's per-server rollup once retention deleted the
//! hours) and keeps its answer as a [`FilterRow`]; [`combine_rows`] orders the rows one
//! way (server, hour, series, epoch) and combines them with
//! [`hourglass_sketch::membership`]. The rows of a cluster's partitions are combined by
//! the same function after they are gathered, so a cluster answers the same bytes as one
//! aggregator holding every row.

use std::collections::BTreeMap;
use std::ops::Range;

use hourglass_sketch::Sketch;
use hourglass_sketch::bloom::{Bloom, Health};
use hourglass_sketch::membership::{self, FilterAnswer, RangeAnswer, SATURATED_FPR};

use super::{Coverage, Merged, PlanStats, Planner, QueryError, Unit, days_of, hourly_row_name};
use crate::keys::{Day, DayKey, Hour, HourKey, SeriesId, ServerId};
use crate::store::SeriesName;

/// One stored filter's answer for the item looked up.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FilterRow {
    /// The server that kept the filter.
    pub(crate) server: String,
    /// Its first hour.
    pub(crate) start_hour: u32,
    /// Hours it covers: 1 for an hourly row, 24 for a day's rollup.
    pub(crate) hours: u32,
    /// Its series, as [`SeriesName`] displays it.
    pub(crate) series: String,
    /// The row's epoch; 0 for a rollup.
    pub(crate) epoch: u64,
    /// Whether the filter says "maybe".
    pub(crate) maybe_present: bool,
    /// Its false-positive rate from its fill ([`Bloom::estimated_fpr`]).
    pub(crate) fpr: f64,
    /// Its fraction of set bits.
    pub(crate) fill_ratio: f64,
    /// Whether it holds more items than it was designed for.
    pub(crate) past_design_point: bool,
    /// The filter, kept only when it says "maybe": the bits of the positives give the
    /// probability that they are all false.
    pub(crate) filter: Option<Bloom>,
}

impl FilterRow {
    /// The answer of `filter` for the item of `hash`.
    pub(crate) fn of(
        filter: Bloom,
        hash: u64,
        server: &str,
        start_hour: u32,
        hours: u32,
        series: &str,
        epoch: u64,
    ) -> FilterRow {
        let maybe_present = filter.contains_hash(hash);
        FilterRow {
            server: server.to_string(),
            start_hour,
            hours,
            series: series.to_string(),
            epoch,
            maybe_present,
            fpr: filter.estimated_fpr(),
            fill_ratio: filter.fill_ratio(),
            past_design_point: filter.health() != Health::Healthy,
            filter: maybe_present.then_some(filter),
        }
    }

    /// The order every answer lists filters in.
    fn order_key(&self) -> (&str, u32, u32, &str, u64) {
        (
            &self.server,
            self.start_hour,
            self.hours,
            &self.series,
            self.epoch,
        )
    }
}

/// A range lookup: the combined answer and the rows it came from, in answer order.
#[derive(Debug)]
pub(crate) struct Looked<'r> {
    /// The combined answer; positions index `rows`.
    pub(crate) answer: RangeAnswer,
    /// The consulted filters, ordered by server, hour, series and epoch.
    pub(crate) rows: Vec<&'r FilterRow>,
    /// The highest fill among them (0 with none).
    pub(crate) max_fill: f64,
    /// Whether any is past its design point.
    pub(crate) past_design_point: bool,
    /// How many have a false-positive rate of at least [`SATURATED_FPR`].
    pub(crate) saturated: u64,
}

/// Combines the answers of the filters a lookup consulted (module docs): the one
/// definition both a single aggregator and a cluster's asking node use. An error names a
/// row whose rate is not a probability or that says "maybe" without its filter (only a
/// peer's reply can hold either).
pub(crate) fn combine_rows(rows: &[FilterRow]) -> Result<Looked<'_>, String> {
    let mut rows: Vec<&FilterRow> = rows.iter().collect();
    rows.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    let answers: Vec<FilterAnswer> = rows
        .iter()
        .map(|r| FilterAnswer {
            maybe_present: r.maybe_present,
            fpr: r.fpr,
        })
        .collect();
    let mut answer = membership::combine(&answers).map_err(|e| e.to_string())?;
    if let RangeAnswer::Seen {
        where_,
        all_false_probability,
        all_false_exact,
        ..
    } = &mut answer
    {
        let positives = where_
            .iter()
            .map(|&i| {
                rows[i].filter.as_ref().ok_or_else(|| {
                    format!(
                        "the filter of {} at hour {} says \"maybe\" but was not sent",
                        rows[i].server, rows[i].start_hour
                    )
                })
            })
            .collect::<Result<Vec<&Bloom>, String>>()?;
        *all_false_probability = membership::all_maybe_probability(&positives);
        *all_false_exact = true;
    }
    Ok(Looked {
        answer,
        max_fill: rows.iter().map(|r| r.fill_ratio).fold(0.0, f64::max),
        past_design_point: rows.iter().any(|r| r.past_design_point),
        saturated: rows.iter().filter(|r| r.fpr >= SATURATED_FPR).count() as u64,
        rows,
    })
}

impl Planner<'_> {
    /// The filters of one unit, each looked up for the item of `hash`: hourly rows, or a
    /// whole day's per-server rollups once retention deleted the day's hours (as
    /// [`Planner::day_sketch`] reads them, less the merge).
    pub(super) fn lookup_unit(
        &self,
        unit: &Unit,
        hash: u64,
        plan: &mut PlanStats,
    ) -> Result<Merged, QueryError> {
        let names: BTreeMap<ServerId, &str> = unit
            .servers
            .iter()
            .map(|s| (s.id, s.name.as_str()))
            .collect();
        let mut filters = Vec::new();
        for (series_id, name) in unit.series.iter().map(|s| (s.0, &s.1)) {
            if !self.merges(name) {
                continue;
            }
            for (day, hours) in days_of(&unit.hours) {
                let whole = hours == day.hours();
                if self.store.is_day_expired(series_id, day)? {
                    if !whole {
                        return Err(QueryError::PastHourlyRetention {
                            day: hourglass_rpc::time::format_day(day.0),
                            start: hours.start.0,
                            end: hours.end.0,
                        });
                    }
                    // The all-servers rollup marks a built day.
                    let built = self
                        .store
                        .get_rollup(DayKey {
                            series: series_id,
                            day,
                            server: ServerId::ALL,
                        })?
                        .is_some();
                    if built {
                        filters
                            .extend(self.lookup_rollups(name, series_id, day, &names, hash, plan)?);
                        // Rows that came after retention expired the day (late, never
                        // rolled in: `rollup::keep_expired_day`) are filters too: a lookup
                        // merges nothing, so reading them can only find more.
                        self.lookup_hours(
                            name,
                            series_id,
                            hours,
                            &names,
                            hash,
                            &mut filters,
                            plan,
                        )?;
                        continue;
                    }
                }
                self.lookup_hours(name, series_id, hours, &names, hash, &mut filters, plan)?;
            }
        }
        let mut coverage: Coverage = self.coverage_of(unit)?;
        coverage.sketches_merged = filters.len() as u64;
        Ok(Merged {
            sketch: None,
            coverage,
            filters,
        })
    }

    /// The per-server rollups of a built `day` of `series` on the servers of `names`,
    /// looked up.
    fn lookup_rollups(
        &self,
        name: &SeriesName,
        series_id: SeriesId,
        day: Day,
        names: &BTreeMap<ServerId, &str>,
        hash: u64,
        plan: &mut PlanStats,
    ) -> Result<Vec<FilterRow>, QueryError> {
        let series = name.to_string();
        let mut filters = Vec::new();
        for (&server, server_name) in names {
            let key = DayKey {
                series: series_id,
                day,
                server,
            };
            let Some(bytes) = self.store.get_rollup(key)? else {
                continue;
            };
            let where_ = || {
                format!(
                    "the rollup of {day} ({}), {server}",
                    hourglass_rpc::time::format_day(day.0)
                )
            };
            let filter = decode_filter(name, &bytes, where_)?;
            filters.push(FilterRow::of(
                filter,
                hash,
                server_name,
                day.hours().start.0,
                24,
                &series,
                0,
            ));
            plan.rollups += 1;
        }
        Ok(filters)
    }

    /// The hourly rows of `series` in `hours` on the servers of `names`, looked up.
    #[allow(clippy::too_many_arguments)]
    fn lookup_hours(
        &self,
        name: &SeriesName,
        series_id: SeriesId,
        hours: Range<Hour>,
        names: &BTreeMap<ServerId, &str>,
        hash: u64,
        filters: &mut Vec<FilterRow>,
        plan: &mut PlanStats,
    ) -> Result<(), QueryError> {
        let series = name.to_string();
        let mut failure = None;
        self.store
            .scan_hourly(series_id, hours, &mut |key: HourKey, stored| {
                let Some(server_name) = names.get(&key.server) else {
                    return true;
                };
                let where_ = || hourly_row_name(&key);
                match decode_filter(name, &stored.sketch, where_) {
                    Ok(filter) => {
                        filters.push(FilterRow::of(
                            filter,
                            hash,
                            server_name,
                            key.hour.0,
                            1,
                            &series,
                            key.epoch.0,
                        ));
                        plan.hourly_rows += 1;
                        true
                    }
                    Err(e) => {
                        failure = Some(e);
                        false
                    }
                }
            })?;
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A stored membership sketch's filter; an error says where a row is unreadable or holds
/// another kind of sketch.
fn decode_filter(
    name: &SeriesName,
    bytes: &[u8],
    where_: impl Fn() -> String,
) -> Result<Bloom, QueryError> {
    match Sketch::decode(bytes) {
        Ok(Sketch::Membership(filter)) => Ok(filter),
        Ok(other) => Err(QueryError::NotAFilter {
            series: name.to_string(),
            key: where_(),
            kind: other.kind(),
        }),
        Err(source) => Err(QueryError::Corrupt {
            series: name.to_string(),
            key: where_(),
            source,
        }),
    }
}
