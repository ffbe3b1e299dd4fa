//! The set questions of the `Query` service (`Query/Overlap`, `Query/Retention`) over a
//! memory store: extreme ranges, saturated sides, errors and bounds.

use std::sync::Arc;

use hourglass_rpc::proto::v1::{self, query_server::Query};
use hourglass_sketch::Kind;
use hourglass_sketch::hll::Hll;
use tonic::Request;

use super::QueryService;
use crate::config::LimitsConfig;
use crate::keys::{Epoch, Hour, HourKey};
use crate::metrics::Metrics;
use crate::store::{Dictionaries, Hourly, MemoryStore, SeriesName};

const HOUR: u32 = 480_000;

/// Stores `sketch` for `metric` (of `kind`) from `server` at `hour`.
fn put(store: &MemoryStore, metric: &str, kind: Kind, server: &str, hour: u32, sketch: Vec<u8>) {
    let series = store
        .series_id_or_create(&SeriesName::new(metric, vec![], kind))
        .unwrap();
    let server = store.register_server(server, &[]).unwrap();
    let key = HourKey {
        series,
        hour: Hour(hour),
        server,
        epoch: Epoch(1),
    };
    store.put_hourly(&[(key, 1, sketch.into())]).unwrap();
}

fn service(store: Arc<MemoryStore>) -> QueryService {
    QueryService::new(store, Arc::new(Metrics::new()), LimitsConfig::default())
}

fn selector(metric: &str, hours: std::ops::Range<u32>, servers: &[&str]) -> v1::Selector {
    v1::Selector {
        metric: metric.into(),
        range: Some(v1::TimeRange {
            start_hour: hours.start,
            end_hour: hours.end,
        }),
        servers: servers.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn hll(precision: u8, items: std::ops::Range<u32>) -> Hll {
    let mut h = Hll::new(precision).unwrap();
    for i in items {
        h.insert(format!("user{i}").as_bytes());
    }
    h
}

/// Every register at its largest value, 65 − p: a valid sketch an agent may push.
fn saturated(precision: u8) -> Hll {
    let mut h = Hll::new(precision).unwrap();
    for index in 0..1u64 << precision {
        h.insert_hash(index << (64 - precision));
    }
    assert!(!h.is_sparse());
    h
}

/// A range that ends at the last hour a `u32` can name is valid for every query; cutting
/// it into periods must not overflow `start + period_hours` (query.rs, retention_periods).
#[tokio::test]
async fn a_retention_range_ending_at_u32_max_does_not_panic() {
    let store = Arc::new(MemoryStore::new());
    put(
        &store,
        "visitors",
        Kind::Distinct,
        "web-1",
        HOUR,
        hll(12, 0..100).encode(),
    );
    let service = Arc::new(service(store));
    let range = u32::MAX - 10..u32::MAX;
    // The same range is a valid Distinct question (control).
    let control = service
        .distinct(Request::new(v1::DistinctRequest {
            selector: Some(selector("visitors", range.clone(), &[])),
        }))
        .await;
    assert!(
        control.is_ok(),
        "control: distinct over {range:?}: {control:?}"
    );
    let asked = Arc::clone(&service);
    let sel = selector("visitors", range.clone(), &[]);
    let joined = tokio::spawn(async move {
        asked
            .retention(Request::new(v1::RetentionRequest {
                selector: Some(sel),
                period_hours: 6,
            }))
            .await
    })
    .await;
    let reply = match joined {
        Ok(reply) => reply,
        Err(e) => {
            let panic = e.into_panic();
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("retention over {range:?} in periods of 6 hours panicked: {message}");
        }
    };
    let reply = reply
        .unwrap_or_else(|e| panic!("retention over {range:?} refused: {e:?}"))
        .into_inner();
    let hours: Vec<(u32, u32)> = reply
        .periods
        .iter()
        .map(|p| (p.start_hour, p.end_hour))
        .collect();
    assert_eq!(
        hours,
        vec![(u32::MAX - 10, u32::MAX - 4), (u32::MAX - 4, u32::MAX)]
    );
}

/// A saturated stored sketch on one side: the answer stays numbers (the comparison figure
/// `naive_intersection` is documented as a number that "may be negative", never NaN).
#[tokio::test]
async fn an_overlap_with_a_saturated_side_has_no_nan() {
    let store = Arc::new(MemoryStore::new());
    put(
        &store,
        "visitors",
        Kind::Distinct,
        "web-1",
        HOUR,
        saturated(4).encode(),
    );
    put(
        &store,
        "visitors",
        Kind::Distinct,
        "api-1",
        HOUR,
        hll(14, 0..50_000).encode(),
    );
    let service = service(store);
    let reply = service
        .overlap(Request::new(v1::OverlapRequest {
            a: Some(selector("visitors", HOUR..HOUR + 1, &["web-*"])),
            b: Some(selector("visitors", HOUR..HOUR + 1, &["api-*"])),
        }))
        .await
        .expect("overlap")
        .into_inner();
    let answer = reply.answer.expect("an answer");
    assert_eq!(answer.verdict(), v1::OverlapVerdict::Saturated);
    assert!(
        !answer.naive_intersection.is_nan(),
        "naive_intersection is NaN (inf + x - inf): {answer:?}"
    );
}

/// B = 50,000 items, A saturated: the figures that B bounds (|A ∩ B| ≤ |B|, |B \ A| ≤ |B|)
/// must not be reported as quintillions.
#[tokio::test]
async fn an_overlap_with_a_saturated_a_keeps_b_figures_within_b() {
    let store = Arc::new(MemoryStore::new());
    put(
        &store,
        "visitors",
        Kind::Distinct,
        "web-1",
        HOUR,
        saturated(14).encode(),
    );
    put(
        &store,
        "visitors",
        Kind::Distinct,
        "api-1",
        HOUR,
        hll(14, 0..50_000).encode(),
    );
    let service = service(store);
    let reply = service
        .overlap(Request::new(v1::OverlapRequest {
            a: Some(selector("visitors", HOUR..HOUR + 1, &["web-*"])),
            b: Some(selector("visitors", HOUR..HOUR + 1, &["api-*"])),
        }))
        .await
        .expect("overlap")
        .into_inner();
    let answer = reply.answer.expect("an answer");
    let b = answer.b.expect("b");
    for (name, e) in [
        ("intersection", answer.intersection),
        ("only_b", answer.only_b),
    ] {
        let e = e.expect("figure");
        assert!(
            e.estimate <= b.upper95,
            "{name} estimate {} exceeds |B|'s upper95 {} (B is 50,000 items): {answer:?}",
            e.estimate,
            b.upper95
        );
    }
}

/// Errors name the selection at fault: unknown metric, wrong kind, grouping.
#[tokio::test]
async fn overlap_errors_name_the_side() {
    let store = Arc::new(MemoryStore::new());
    put(
        &store,
        "visitors",
        Kind::Distinct,
        "web-1",
        HOUR,
        hll(12, 0..100).encode(),
    );
    let mut f = hourglass_sketch::frequency::Frequency::new(
        hourglass_sketch::frequency::FrequencyParams::default(),
    )
    .unwrap();
    f.insert(b"x").unwrap();
    put(&store, "pages", Kind::Frequency, "web-1", HOUR, f.encode());
    let service = service(store);
    let ok = selector("visitors", HOUR..HOUR + 1, &[]);
    for (a, b, code, prefix) in [
        (
            selector("nosuch", HOUR..HOUR + 1, &[]),
            ok.clone(),
            tonic::Code::NotFound,
            "a: unknown metric",
        ),
        (
            ok.clone(),
            selector("nosuch", HOUR..HOUR + 1, &[]),
            tonic::Code::NotFound,
            "b: unknown metric",
        ),
        (
            ok.clone(),
            selector("pages", HOUR..HOUR + 1, &[]),
            tonic::Code::NotFound,
            "b: metric \"pages\" keeps no distinct",
        ),
        (
            v1::Selector {
                group_by: v1::GroupBy::Server as i32,
                ..ok.clone()
            },
            ok.clone(),
            tonic::Code::InvalidArgument,
            "a.group_by",
        ),
    ] {
        let e = service
            .overlap(Request::new(v1::OverlapRequest {
                a: Some(a),
                b: Some(b),
            }))
            .await
            .expect_err(prefix);
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().starts_with(prefix), "{prefix}: {}", e.message());
    }
}

/// 53 periods pass, 54 are refused; the last period may be shorter.
#[tokio::test]
async fn retention_period_count_bounds() {
    let store = Arc::new(MemoryStore::new());
    put(
        &store,
        "visitors",
        Kind::Distinct,
        "web-1",
        HOUR,
        hll(12, 0..100).encode(),
    );
    let service = service(store);
    let ask = |hours: std::ops::Range<u32>, period_hours: u32| v1::RetentionRequest {
        selector: Some(selector("visitors", hours, &[])),
        period_hours,
    };
    let r = service
        .retention(Request::new(ask(HOUR..HOUR + 53, 1)))
        .await
        .expect("53 periods")
        .into_inner();
    assert_eq!(r.periods.len(), 53);
    assert_eq!(r.rows.len(), 52);
    assert_eq!(
        r.rows.iter().map(|row| row.cells.len()).sum::<usize>(),
        1378
    );
    let e = service
        .retention(Request::new(ask(HOUR..HOUR + 54, 1)))
        .await
        .expect_err("54 periods");
    assert!(e.message().contains("more than 53"), "{}", e.message());
    // Counted in words: one hour is "1 hour", never "1 hours".
    assert!(
        e.message()
            .starts_with("the range of 54 hours holds 54 periods of 1 hour, more than 53"),
        "{}",
        e.message()
    );
    let r = service
        .retention(Request::new(ask(HOUR..HOUR + 105, 2)))
        .await
        .expect("52 periods and a short one")
        .into_inner();
    assert_eq!(r.periods.len(), 53);
    assert_eq!(r.periods[52].start_hour, HOUR + 104);
    assert_eq!(r.periods[52].end_hour, HOUR + 105);
    let e = service
        .retention(Request::new(ask(HOUR..HOUR + 10, u32::MAX)))
        .await
        .expect_err("one period");
    assert!(e.message().contains("holds one period"), "{}", e.message());
}
