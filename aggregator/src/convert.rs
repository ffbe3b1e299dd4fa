//! Translations between the proto messages of `hourglass.v1` and the planner and store,
//! and the mapping of their errors to gRPC status codes: one set for every module that
//! speaks proto (the gRPC services, the write path and the cluster's calls between
//! nodes), below all of them.
//!
//! Every check of a request field happens here, before any storage is touched, and every
//! refusal names the field and the value so that the caller can fix the request.

use hourglass_rpc::proto::v1;
use hourglass_rpc::series::{validate_metric, validate_tag};
use hourglass_sketch::Kind;
use hourglass_sketch::Sketch;
use hourglass_sketch::distinct::Distinct;
use hourglass_sketch::hll::Hll;
use hourglass_sketch::membership::RangeAnswer;
use tonic::Status;

use crate::keys::Hour;
use crate::planner::{Coverage, FilterRow, GroupBy, QueryError, Selector, combine_rows};
use crate::store::StoreError;

/// The setting that bounds a query's range; its refusal names it.
pub(crate) const RANGE_BOUND: &str = "limits.max_query_range";

/// Converts a request's selector for the planner, checking every field.
///
/// `max_hours` bounds the span of the range; `kind` comes from the RPC (or, for Export,
/// from the request).
pub fn selector(
    proto: Option<&v1::Selector>,
    kind: Kind,
    max_hours: u64,
) -> Result<Selector, Status> {
    let proto = proto.ok_or_else(|| Status::invalid_argument("selector is required"))?;
    if proto.metric.is_empty() {
        return Err(Status::invalid_argument("selector.metric is required"));
    }
    validate_metric(&proto.metric)
        .map_err(|e| Status::invalid_argument(format!("selector.metric: {e}")))?;
    let tags = pairs(&proto.tags, "selector.tags")?;
    let labels = pairs(&proto.labels, "selector.labels")?;
    let range = proto
        .range
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("selector.range is required"))?;
    if range.start_hour >= range.end_hour {
        return Err(Status::invalid_argument(format!(
            "selector.range: end_hour {} must be greater than start_hour {}",
            range.end_hour, range.start_hour
        )));
    }
    let span = u64::from(range.end_hour - range.start_hour);
    if span > max_hours {
        return Err(Status::invalid_argument(format!(
            "selector.range spans {span} hours, more than the limit of {max_hours} ({RANGE_BOUND})"
        )));
    }
    for (i, pattern) in proto.servers.iter().enumerate() {
        if pattern.is_empty() || pattern.len() > MAX_SERVER_NAME_LEN {
            return Err(Status::invalid_argument(format!(
                "selector.servers[{i}] {pattern:?} must be 1 to {MAX_SERVER_NAME_LEN} bytes"
            )));
        }
    }
    let group_by = match v1::GroupBy::try_from(proto.group_by) {
        Ok(v1::GroupBy::None) => GroupBy::None,
        Ok(v1::GroupBy::Server) => GroupBy::Server,
        Ok(v1::GroupBy::Hour) => GroupBy::Hour,
        Ok(v1::GroupBy::Day) => GroupBy::Day,
        Ok(v1::GroupBy::Tag) => {
            validate_tag(&proto.group_tag, "").map_err(|_| {
                Status::invalid_argument(format!(
                    "selector.group_tag {:?} must name a tag key when group_by is GROUP_BY_TAG",
                    proto.group_tag
                ))
            })?;
            GroupBy::Tag(proto.group_tag.clone())
        }
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "selector.group_by {} is not a known grouping",
                proto.group_by
            )));
        }
    };
    if !proto.group_tag.is_empty() && !matches!(group_by, GroupBy::Tag(_)) {
        return Err(Status::invalid_argument(format!(
            "selector.group_tag {:?} is set but group_by is not GROUP_BY_TAG",
            proto.group_tag
        )));
    }
    Ok(Selector {
        metric: proto.metric.clone(),
        kind,
        tags,
        hours: Hour(range.start_hour)..Hour(range.end_hour),
        servers: proto.servers.clone(),
        labels,
        group_by,
    })
}

use hourglass_rpc::series::MAX_SERVER_NAME_LEN;

/// Checks and converts tags or labels; `field` names the list in errors.
pub fn pairs(tags: &[v1::Tag], field: &str) -> Result<Vec<(String, String)>, Status> {
    tags.iter()
        .enumerate()
        .map(|(i, t)| {
            validate_tag(&t.key, &t.value)
                .map_err(|e| Status::invalid_argument(format!("{field}[{i}]: {e}")))?;
            Ok((t.key.clone(), t.value.clone()))
        })
        .collect()
}

/// The kind of a wire enum value, or why it is not one.
pub(crate) fn kind(value: i32, field: &str) -> Result<Kind, String> {
    let wire = v1::SketchKind::try_from(value)
        .map_err(|_| format!("{field} {value} is not a known sketch kind"))?;
    Kind::try_from(wire).map_err(|_| format!("{field} is unspecified"))
}

/// The gRPC status for a planner error: the caller's mistake, a mismatch in stored data,
/// or a fault of ours.
pub(crate) fn query_status(e: &QueryError) -> Status {
    let message = e.to_string();
    match e {
        QueryError::UnknownMetric { .. }
        | QueryError::WrongKind { .. }
        | QueryError::NoSeries { .. }
        | QueryError::NoServers { .. } => Status::not_found(message),
        QueryError::EmptyRange { .. } | QueryError::PastHourlyRetention { .. } => {
            Status::invalid_argument(message)
        }
        QueryError::FanOut { .. } => Status::resource_exhausted(message),
        QueryError::Incompatible { .. } => Status::failed_precondition(message),
        QueryError::Corrupt { .. } | QueryError::NotAFilter { .. } => Status::internal(message),
        QueryError::Store(store) => store_status(store),
    }
}

/// The gRPC status for a storage error.
pub(crate) fn store_status(e: &StoreError) -> Status {
    match e {
        StoreError::IdsExhausted { .. } => Status::resource_exhausted(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

/// The proto form of a planner coverage.
pub fn coverage(c: &Coverage) -> v1::Coverage {
    v1::Coverage {
        sketches_merged: c.sketches_merged,
        server_hours_missing: c.server_hours_missing,
        missing: c
            .missing
            .iter()
            .map(|(server, hours)| v1::MissingServer {
                server: server.clone(),
                hours: *hours,
            })
            .collect(),
        partitions_missing: u32::try_from(c.missing_partitions.len()).unwrap_or(u32::MAX),
        missing_partitions: c
            .missing_partitions
            .iter()
            .take(crate::planner::MAX_MISSING_LISTED)
            .copied()
            .collect(),
    }
}

/// A distinct answer; zeros when nothing was merged.
pub fn distinct(sketch: Option<&Sketch>) -> v1::DistinctAnswer {
    match sketch {
        Some(Sketch::Distinct(distinct)) => distinct_of(&distinct.estimate()),
        _ => v1::DistinctAnswer::default(),
    }
}

/// The wire form of an estimate.
pub fn distinct_of(e: &hourglass_sketch::Estimate) -> v1::DistinctAnswer {
    v1::DistinctAnswer {
        estimate: e.estimate,
        std_error: e.std_error,
        lower95: e.lower95,
        upper95: e.upper95,
    }
}

/// The overlap of the sets behind `a` and `b` (joint maximum likelihood), beside
/// inclusion–exclusion's intersection.
///
/// The joint estimator is HyperLogLog's, so it reads each side's HyperLogLog, converted
/// exactly from an UltraLogLog. `a`, `b` and inclusion–exclusion are the distinct answers
/// of the sketches as merged, each in its own form, as Distinct answers them.
pub fn overlap(a: &Distinct, b: &Distinct) -> Result<v1::OverlapAnswer, Status> {
    let joint = estimate_pair(&a.to_hll(), &b.to_hll())?;
    let naive = hourglass_sketch::overlap::inclusion_exclusion(a, b).map_err(estimate_failed)?;
    Ok(v1::OverlapAnswer {
        a: Some(distinct_of(&naive.a)),
        b: Some(distinct_of(&naive.b)),
        union: Some(distinct_of(&joint.union)),
        intersection: Some(distinct_of(&joint.intersection)),
        only_a: Some(distinct_of(&joint.only_a)),
        only_b: Some(distinct_of(&joint.only_b)),
        jaccard: Some(distinct_of(&joint.jaccard)),
        retained: Some(distinct_of(&joint.retained)),
        verdict: verdict(joint.verdict) as i32,
        // inf − inf when a side is saturated: then there is nothing to compare.
        naive_intersection: if naive.intersection.is_nan() {
            0.0
        } else {
            naive.intersection
        },
    })
}

/// The joint estimate of the overlap of `a` and `b`. Sketches of any precisions compare
/// (the finer is folded), so this fails only on a defect, answered as INTERNAL.
fn estimate_pair(a: &Hll, b: &Hll) -> Result<hourglass_sketch::overlap::Overlap, Status> {
    hourglass_sketch::overlap::estimate_pair(a, b).map_err(estimate_failed)
}

fn estimate_failed(e: hourglass_sketch::MergeError) -> Status {
    Status::internal(format!("estimating an overlap: {e}"))
}

/// The wire form of an overlap verdict.
fn verdict(v: hourglass_sketch::overlap::Verdict) -> v1::OverlapVerdict {
    use hourglass_sketch::overlap::Verdict;
    match v {
        Verdict::Empty => v1::OverlapVerdict::Empty,
        Verdict::Estimable => v1::OverlapVerdict::Estimable,
        Verdict::TooSmall => v1::OverlapVerdict::TooSmall,
        Verdict::Saturated => v1::OverlapVerdict::Saturated,
    }
}

/// A retention table's rows over the sets of consecutive `periods`: each period's set
/// (the cohort) against every later one.
pub fn retention_rows(periods: &[Hll]) -> Result<Vec<v1::RetentionRow>, Status> {
    (0..periods.len().saturating_sub(1))
        .map(|cohort| {
            let cells = (cohort + 1..periods.len())
                .map(|later| {
                    let joint = estimate_pair(&periods[cohort], &periods[later])?;
                    Ok(v1::RetentionCell {
                        period: later as u32,
                        returned: Some(distinct_of(&joint.intersection)),
                        share: Some(distinct_of(&joint.retained)),
                        verdict: verdict(joint.verdict) as i32,
                    })
                })
                .collect::<Result<_, Status>>()?;
            Ok(v1::RetentionRow {
                cohort: cohort as u32,
                cells,
            })
        })
        .collect()
}

/// A frequency answer for `item`; zeros when nothing was merged.
pub fn frequency(sketch: Option<&Sketch>, item: &[u8]) -> v1::FrequencyAnswer {
    match sketch {
        Some(Sketch::Frequency(f)) => {
            let e = f.estimate(item);
            v1::FrequencyAnswer {
                estimate: e.estimate,
                max_overcount: e.max_overcount,
                total: e.total,
            }
        }
        _ => v1::FrequencyAnswer::default(),
    }
}

/// The `k` heaviest items; none when nothing was merged.
pub fn top_k(sketch: Option<&Sketch>, k: usize) -> Vec<v1::TopItem> {
    match sketch {
        Some(Sketch::Frequency(f)) => f
            .top_k(k)
            .into_iter()
            .map(|t| v1::TopItem {
                item: t.item,
                estimate: t.estimate,
                lower: t.lower,
                upper: t.upper,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The most filters a membership answer lists where the item was seen.
pub(crate) const MAX_SIGHTINGS_LISTED: usize = 100;

/// A membership answer from the answers of the filters a lookup consulted
/// ([`crate::planner::combine_rows`]); no filters answer "no data" (nothing set).
pub fn membership(filters: &[FilterRow]) -> Result<v1::MembershipAnswer, Status> {
    let looked = combine_rows(filters)
        .map_err(|e| Status::internal(format!("cannot combine the filters' answers: {e}")))?;
    let consulted = looked.rows.len() as u64;
    let mut answer = v1::MembershipAnswer {
        fill_ratio: looked.max_fill,
        past_design_point: looked.past_design_point,
        filters_consulted: consulted,
        range_fpr: looked.answer.range_fpr(),
        saturated_filters: looked.saturated,
        ..v1::MembershipAnswer::default()
    };
    match &looked.answer {
        RangeAnswer::DefinitelyAbsent { .. } => answer.definitely_absent = consulted > 0,
        RangeAnswer::Seen {
            where_,
            all_false_probability,
            ..
        } => {
            answer.maybe_present = true;
            answer.all_false_probability = *all_false_probability;
            // What a client reading only `estimated_fpr` needs: how often an item seen
            // nowhere gets "maybe" over this range. The all-false figure is about these
            // particular positions, after seeing which said "maybe": quoting it as the
            // chance of being wrong would understate that about as many times as there
            // are filters.
            answer.estimated_fpr = answer.range_fpr;
            answer.seen_in_count = where_.len() as u64;
            answer.seen_in = where_
                .iter()
                .take(MAX_SIGHTINGS_LISTED)
                .map(|&i| {
                    let row = looked.rows[i];
                    v1::MembershipSighting {
                        server: row.server.clone(),
                        start_hour: row.start_hour,
                        hours: row.hours,
                        fpr: row.fpr,
                    }
                })
                .collect();
        }
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> v1::Selector {
        v1::Selector {
            metric: "visitors".into(),
            tags: vec![v1::Tag {
                key: "country".into(),
                value: "de".into(),
            }],
            range: Some(v1::TimeRange {
                start_hour: 10,
                end_hour: 34,
            }),
            servers: vec!["web-*".into()],
            labels: vec![],
            group_by: v1::GroupBy::Tag as i32,
            group_tag: "device".into(),
        }
    }

    #[test]
    fn a_good_selector_converts_field_by_field() {
        let s = selector(Some(&good()), Kind::Distinct, 9600).unwrap();
        assert_eq!(s.metric, "visitors");
        assert_eq!(s.tags, vec![("country".to_string(), "de".to_string())]);
        assert_eq!(s.hours, Hour(10)..Hour(34));
        assert_eq!(s.servers, vec!["web-*".to_string()]);
        assert_eq!(s.group_by, GroupBy::Tag("device".into()));
    }

    #[test]
    fn each_bad_field_is_named() {
        type Edit = Box<dyn Fn(&mut v1::Selector)>;
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|s| s.metric.clear()), "selector.metric"),
            (Box::new(|s| s.metric = "9x".into()), "selector.metric"),
            (Box::new(|s| s.range = None), "selector.range"),
            (
                Box::new(|s| {
                    s.range = Some(v1::TimeRange {
                        start_hour: 5,
                        end_hour: 5,
                    })
                }),
                "selector.range",
            ),
            (
                Box::new(|s| {
                    s.range = Some(v1::TimeRange {
                        start_hour: 0,
                        end_hour: 9601,
                    })
                }),
                "limits.max_query_range",
            ),
            (
                Box::new(|s| s.tags[0].key = "a b".into()),
                "selector.tags[0]",
            ),
            (Box::new(|s| s.group_tag.clear()), "selector.group_tag"),
            (Box::new(|s| s.group_by = 99), "selector.group_by"),
            (
                Box::new(|s| s.group_by = v1::GroupBy::Server as i32),
                "selector.group_tag",
            ),
            (
                Box::new(|s| s.servers.push(String::new())),
                "selector.servers[1]",
            ),
        ];
        for (edit, field) in cases {
            let mut s = good();
            edit(&mut s);
            let status = selector(Some(&s), Kind::Distinct, 9600).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(
                status.message().contains(field),
                "{field}: {}",
                status.message()
            );
        }
        let missing = selector(None, Kind::Distinct, 9600).unwrap_err();
        assert!(missing.message().contains("selector"));
    }

    #[test]
    fn kinds_are_checked() {
        assert_eq!(kind(1, "kind").unwrap(), Kind::Distinct);
        assert_eq!(kind(0, "kind").unwrap_err(), "kind is unspecified");
        assert!(
            kind(9, "sketch.kind")
                .unwrap_err()
                .contains("sketch.kind 9")
        );
    }

    #[test]
    fn no_sketch_answers_zeros() {
        assert_eq!(distinct(None), v1::DistinctAnswer::default());
        assert_eq!(frequency(None, b"x").estimate, 0);
        assert!(top_k(None, 10).is_empty());
        let none = membership(&[]).unwrap();
        assert!(!none.maybe_present && !none.definitely_absent);
        assert_eq!(none.filters_consulted, 0);
    }

    /// A row of a hand-made filter holding `items`.
    fn row(server: &str, hour: u32, items: &[&[u8]], looked_up: &[u8]) -> FilterRow {
        let mut filter = hourglass_sketch::bloom::Bloom::new(100, 0.01).unwrap();
        for item in items {
            filter.insert(item);
        }
        FilterRow::of(
            filter,
            hourglass_sketch::hash::item_hash(looked_up),
            server,
            hour,
            1,
            "m{} (membership)",
            1,
        )
    }

    #[test]
    fn a_membership_answer_says_where_in_order_capped_with_the_count() {
        // 150 server-hours hold the item, given out of order.
        let mut rows: Vec<FilterRow> = (0..150u32)
            .rev()
            .map(|i| row(&format!("s{}", i % 3), 1000 + i, &[b"x", b"y"], b"x"))
            .collect();
        rows.push(row("s0", 5, &[b"y"], b"x"));
        let a = membership(&rows).unwrap();
        assert!(a.maybe_present && !a.definitely_absent);
        assert_eq!(a.filters_consulted, 151);
        assert_eq!(a.seen_in_count, 150);
        assert_eq!(a.seen_in.len(), MAX_SIGHTINGS_LISTED);
        let order: Vec<(String, u32)> = a
            .seen_in
            .iter()
            .map(|s| (s.server.clone(), s.start_hour))
            .collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted);
        assert_eq!(order[0], ("s0".to_string(), 1000));
        assert_eq!(a.estimated_fpr, a.range_fpr);
        // The 150 filters hold the same items, so their false positives come together:
        // all of them say "maybe" exactly when one does (not the product of 150 rates).
        assert_eq!(a.all_false_probability, a.seen_in[0].fpr);
        assert!(a.fill_ratio > 0.0 && !a.past_design_point);
        // The same rows in another order: the same answer, to the bit.
        rows.reverse();
        assert_eq!(membership(&rows).unwrap(), a);
    }

    #[test]
    fn a_membership_answer_of_no_positive_is_definitely_absent_with_its_rate() {
        let rows: Vec<FilterRow> = (0..10u32)
            .map(|i| row("s", i, &[b"a", b"b", b"c"], b"zzz-not-there"))
            .collect();
        assert!(rows.iter().all(|r| !r.maybe_present), "test setup");
        let a = membership(&rows).unwrap();
        assert!(a.definitely_absent && !a.maybe_present);
        assert!(a.seen_in.is_empty() && a.seen_in_count == 0);
        assert_eq!((a.estimated_fpr, a.all_false_probability), (0.0, 0.0));
        let expected = 1.0 - rows.iter().map(|r| 1.0 - r.fpr).product::<f64>();
        assert!(
            (a.range_fpr - expected).abs() < 1e-15,
            "{} vs {expected}",
            a.range_fpr
        );
        // A positive sent without its filter (only a peer can do that) is refused.
        let mut bad = row("s", 0, &[b"q"], b"q");
        bad.filter = None;
        assert_eq!(
            membership(&[bad]).unwrap_err().code(),
            tonic::Code::Internal
        );
    }
}
