//! The API's answers as JSON, with the proto's field names: each answer says what it was
//! asked, and an item that is not UTF-8 is written as base64.

use std::collections::BTreeMap;

use base64::Engine;
use hourglass_rpc::proto::v1;
use serde::Serialize;

/// The envelope of every answer.
#[derive(Debug, Serialize)]
pub(super) struct Answered<A> {
    /// The metric asked about.
    pub(super) metric: String,
    /// The whole hours merged.
    pub(super) range: RangeJson,
    /// frequency, membership: the item asked about.
    #[serde(flatten)]
    pub(super) item: Option<ItemJson>,
    /// topk: how many items were asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) k: Option<u32>,
    /// `answer`, or `items` for topk.
    #[serde(flatten)]
    pub(super) answer: A,
    /// What the whole answer saw.
    pub(super) coverage: CoverageJson,
    /// Per group; empty when not grouped.
    pub(super) groups: Vec<GroupJson<A>>,
}

impl<A> Answered<A> {
    /// This answer, saying the item it is about.
    pub(super) fn about(mut self, item: &[u8]) -> Answered<A> {
        self.item = Some(ItemJson::of(item));
        self
    }
}

/// The hours of an answer: their first instant and the instant after the last, and the
/// same as hours since the epoch.
#[derive(Debug, Serialize)]
pub(super) struct RangeJson {
    pub(super) from: String,
    pub(super) to: String,
    pub(super) start_hour: u32,
    pub(super) end_hour: u32,
}

impl RangeJson {
    /// The hours `[start_hour, end_hour)`.
    pub(super) fn of(start_hour: u32, end_hour: u32) -> RangeJson {
        RangeJson {
            from: hourglass_rpc::time::rfc3339_hour(start_hour),
            to: hourglass_rpc::time::rfc3339_hour(end_hour),
            start_hour,
            end_hour,
        }
    }
}

/// The answer of `/api/v1/overlap`.
#[derive(Debug, Serialize)]
pub(super) struct OverlapJson {
    /// Selection A: what it asked and what its merge saw.
    pub(super) a: SideJson,
    /// Selection B.
    pub(super) b: SideJson,
    pub(super) answer: OverlapAnswerJson,
}

/// One selection of an overlap: its metric, hours and coverage.
#[derive(Debug, Serialize)]
pub(super) struct SideJson {
    pub(super) metric: String,
    pub(super) range: RangeJson,
    pub(super) coverage: CoverageJson,
}

impl SideJson {
    pub(super) fn of(selector: &v1::Selector, coverage: Option<v1::Coverage>) -> SideJson {
        let range = selector.range.unwrap_or_default();
        SideJson {
            metric: selector.metric.clone(),
            range: RangeJson::of(range.start_hour, range.end_hour),
            coverage: CoverageJson::from(coverage),
        }
    }
}

/// The proto's `OverlapAnswer`, its verdict by name.
#[derive(Debug, Serialize)]
pub(super) struct OverlapAnswerJson {
    pub(super) a: DistinctJson,
    pub(super) b: DistinctJson,
    pub(super) union: DistinctJson,
    pub(super) intersection: DistinctJson,
    pub(super) only_a: DistinctJson,
    pub(super) only_b: DistinctJson,
    pub(super) jaccard: DistinctJson,
    pub(super) retained: DistinctJson,
    pub(super) verdict: &'static str,
    pub(super) naive_intersection: f64,
}

/// The answer of `/api/v1/retention`.
#[derive(Debug, Serialize)]
pub(super) struct RetentionJson {
    pub(super) metric: String,
    pub(super) range: RangeJson,
    pub(super) period_hours: u32,
    pub(super) periods: Vec<PeriodJson>,
    pub(super) rows: Vec<RowJson>,
}

/// One period of a retention table: its hours, its distinct count and coverage.
#[derive(Debug, Serialize)]
pub(super) struct PeriodJson {
    pub(super) range: RangeJson,
    pub(super) answer: DistinctJson,
    pub(super) coverage: CoverageJson,
}

/// A cohort's row of a retention table.
#[derive(Debug, Serialize)]
pub(super) struct RowJson {
    pub(super) cohort: u32,
    pub(super) cells: Vec<CellJson>,
}

/// A cohort's return in one later period.
#[derive(Debug, Serialize)]
pub(super) struct CellJson {
    pub(super) period: u32,
    pub(super) returned: DistinctJson,
    pub(super) share: DistinctJson,
    pub(super) verdict: &'static str,
}

/// One group of an answer.
#[derive(Debug, Serialize)]
pub(super) struct GroupJson<A> {
    /// The group's key: a server, an hour (`2026-11-23T14:00Z`), a day, a tag value.
    pub(super) key: String,
    /// Hour and day groups: the RFC 3339 instant the group starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) time: Option<String>,
    #[serde(flatten)]
    pub(super) answer: A,
    pub(super) coverage: CoverageJson,
    /// The group's first hour, for sorting.
    #[serde(skip)]
    pub(super) hour: Option<u32>,
}

/// `"answer": {...}`.
#[derive(Debug, Serialize)]
pub(super) struct One<T> {
    pub(super) answer: T,
}

impl<T: Default> One<T> {
    /// A proto answer, zeros when the reply has none.
    pub(super) fn new(answer: Option<T>) -> One<T> {
        One {
            answer: answer.unwrap_or_default(),
        }
    }
}

/// `"items": [...]`, heaviest first.
#[derive(Debug, Serialize)]
pub(super) struct Items {
    pub(super) items: Vec<TopItemJson>,
}

impl From<Vec<v1::TopItem>> for Items {
    fn from(items: Vec<v1::TopItem>) -> Items {
        Items {
            items: items
                .into_iter()
                .map(|t| TopItemJson {
                    item: ItemJson::of(&t.item),
                    estimate: t.estimate,
                    lower: t.lower,
                    upper: t.upper,
                })
                .collect(),
        }
    }
}

/// An item: `"item": "text"` when it is UTF-8, else `"item_base64": "..."`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) enum ItemJson {
    #[serde(rename = "item")]
    Text(String),
    #[serde(rename = "item_base64")]
    Base64(String),
}

impl ItemJson {
    pub(super) fn of(bytes: &[u8]) -> ItemJson {
        match std::str::from_utf8(bytes) {
            Ok(text) => ItemJson::Text(text.to_string()),
            Err(_) => ItemJson::Base64(base64::engine::general_purpose::STANDARD.encode(bytes)),
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct TopItemJson {
    #[serde(flatten)]
    pub(super) item: ItemJson,
    pub(super) estimate: u64,
    pub(super) lower: u64,
    pub(super) upper: u64,
}

#[derive(Debug, Default, Serialize)]
pub(super) struct DistinctJson {
    pub(super) estimate: f64,
    pub(super) std_error: f64,
    pub(super) lower95: f64,
    pub(super) upper95: f64,
}

impl From<v1::DistinctAnswer> for DistinctJson {
    fn from(a: v1::DistinctAnswer) -> DistinctJson {
        use hourglass_rpc::json_figure;
        DistinctJson {
            estimate: json_figure(a.estimate),
            std_error: json_figure(a.std_error),
            lower95: json_figure(a.lower95),
            upper95: json_figure(a.upper95),
        }
    }
}

#[derive(Debug, Default, Serialize)]
pub(super) struct FrequencyJson {
    pub(super) estimate: u64,
    pub(super) max_overcount: u64,
    pub(super) total: u64,
}

impl From<v1::FrequencyAnswer> for FrequencyJson {
    fn from(a: v1::FrequencyAnswer) -> FrequencyJson {
        FrequencyJson {
            estimate: a.estimate,
            max_overcount: a.max_overcount,
            total: a.total,
        }
    }
}

#[derive(Debug, Default, Serialize)]
pub(super) struct MembershipJson {
    pub(super) maybe_present: bool,
    pub(super) definitely_absent: bool,
    pub(super) filters_consulted: u64,
    pub(super) range_fpr: f64,
    pub(super) all_false_probability: f64,
    pub(super) saturated_filters: u64,
    pub(super) seen_in: Vec<SightingJson>,
    pub(super) seen_in_count: u64,
    pub(super) fill_ratio: f64,
    pub(super) estimated_fpr: f64,
    pub(super) past_design_point: bool,
}

/// A filter that said "maybe": where the item was seen.
#[derive(Debug, Serialize)]
pub(super) struct SightingJson {
    pub(super) server: String,
    /// The filter's first hour, RFC 3339.
    pub(super) from: String,
    pub(super) start_hour: u32,
    pub(super) hours: u32,
    pub(super) fpr: f64,
}

impl From<v1::MembershipAnswer> for MembershipJson {
    fn from(a: v1::MembershipAnswer) -> MembershipJson {
        MembershipJson {
            maybe_present: a.maybe_present,
            definitely_absent: a.definitely_absent,
            filters_consulted: a.filters_consulted,
            range_fpr: a.range_fpr,
            all_false_probability: a.all_false_probability,
            saturated_filters: a.saturated_filters,
            seen_in: a
                .seen_in
                .into_iter()
                .map(|s| SightingJson {
                    server: s.server,
                    from: hourglass_rpc::time::rfc3339_hour(s.start_hour),
                    start_hour: s.start_hour,
                    hours: s.hours,
                    fpr: s.fpr,
                })
                .collect(),
            seen_in_count: a.seen_in_count,
            fill_ratio: a.fill_ratio,
            estimated_fpr: a.estimated_fpr,
            past_design_point: a.past_design_point,
        }
    }
}

#[derive(Debug, Default, Serialize)]
pub(super) struct CoverageJson {
    pub(super) sketches_merged: u64,
    pub(super) server_hours_missing: u64,
    pub(super) missing: Vec<MissingJson>,
    pub(super) partitions_missing: u32,
    pub(super) missing_partitions: Vec<u32>,
}

#[derive(Debug, Serialize)]
pub(super) struct MissingJson {
    pub(super) server: String,
    pub(super) hours: u64,
}

impl From<Option<v1::Coverage>> for CoverageJson {
    fn from(c: Option<v1::Coverage>) -> CoverageJson {
        let c = c.unwrap_or_default();
        CoverageJson {
            sketches_merged: c.sketches_merged,
            server_hours_missing: c.server_hours_missing,
            missing: c
                .missing
                .into_iter()
                .map(|m| MissingJson {
                    server: m.server,
                    hours: m.hours,
                })
                .collect(),
            partitions_missing: c.partitions_missing,
            missing_partitions: c.missing_partitions,
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct SeriesList {
    pub(super) series: Vec<SeriesJson>,
}

#[derive(Debug, Serialize)]
pub(super) struct SeriesJson {
    pub(super) metric: String,
    pub(super) tags: BTreeMap<String, String>,
    pub(super) kind: &'static str,
}

#[derive(Debug, Serialize)]
pub(super) struct ServerList {
    pub(super) servers: Vec<ServerJson>,
}

#[derive(Debug, Serialize)]
pub(super) struct ServerJson {
    pub(super) name: String,
    pub(super) labels: BTreeMap<String, String>,
}
