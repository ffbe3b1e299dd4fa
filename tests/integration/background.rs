//! The aggregator's background work (rollups and retention): each scenario pushes days in
//! the past over gRPC to an aggregator run in this process from a config file, lets the
//! real background pass run (every second), changes retention by restarting it on the
//! same data dir, and ends in queries whose answers are checked against the exact truth.
//!
//! Days are counted back from today (UTC): `day(n)` is the first hour of the day `n`
//! days ago. Days 3 and more back are closed whatever the hour (lateness is 1 h).

use crate::aggregator::{clients, hll_of, outcomes, push, selector, server};
use crate::util::{InProcessAggregator, TempDir, http_get, snapshot, this_hour};
use hourglass_rpc::proto::v1::{
    self, collector_client::CollectorClient, query_client::QueryClient,
};
use hourglass_rpc::time::format_hour;
use hourglass_sketch::Sketch;
use hourglass_sketch::frequency::{Frequency, FrequencyParams};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// The first hour of the UTC day `n` days before today.
pub(crate) fn day(n: u32) -> u32 {
    (this_hour() / 24 - n) * 24
}

/// Starts an aggregator on `dir` with a background pass every second and `retention`
/// (a `retention.hourly` duration), plus `extra` TOML.
pub(crate) fn start(dir: &TempDir, retention: &str, extra: &str) -> InProcessAggregator {
    let config = dir.file("aggregator.toml");
    std::fs::write(
        &config,
        format!("[rollup]\ninterval = \"1s\"\n[retention]\nhourly = \"{retention}\"\n{extra}"),
    )
    .expect("write config");
    let mut config =
        hourglass_aggregator::Config::from_file(std::path::Path::new(&config)).expect("config");
    config.data_dir = dir.file("data").into();
    InProcessAggregator::start_with(config)
}

/// Stops it (drain, background pass finished, store closed), failing on an error.
async fn stop(agg: InProcessAggregator) {
    agg.stop().await;
}

/// The value of the first sample of `metric` (full name, labels included) on /metrics.
pub(crate) fn metric(agg: &InProcessAggregator, name: &str) -> f64 {
    let (status, body) = http_get(agg.admin, "/metrics");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Waits up to 60 s for `done`, then fails saying `what`, with the aggregator's metrics.
fn wait_for(agg: &InProcessAggregator, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within 60s; metrics:\n{}",
            http_get(agg.admin, "/metrics").1
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits for two complete background passes after now, so everything dirty before now
/// was rolled up and retention ran on it.
pub(crate) fn two_passes(agg: &InProcessAggregator) {
    let name = "hourglass_aggregator_rollup_passes_total{outcome=\"ok\"}";
    let start = metric(agg, name);
    wait_for(agg, "two background passes", || {
        metric(agg, name) >= start + 2.0
    });
}

/// A distinct query over `hours`: (estimate, sketches merged, server-hours missing).
async fn distinct(
    query: &mut QueryClient<Channel>,
    metric: &str,
    hours: std::ops::Range<u32>,
) -> (f64, u64, u64) {
    let r = query
        .distinct(v1::DistinctRequest {
            selector: selector(metric, hours),
        })
        .await
        .expect("distinct query")
        .into_inner();
    let coverage = r.coverage.expect("coverage");
    (
        r.answer.expect("answer").estimate,
        coverage.sketches_merged,
        coverage.server_hours_missing,
    )
}

/// How often `item` was counted in `hours` of `metric`, or the query's error.
async fn frequency(
    query: &mut QueryClient<Channel>,
    metric: &str,
    hours: std::ops::Range<u32>,
    item: &[u8],
) -> Result<u64, tonic::Status> {
    let r = query
        .frequency(v1::FrequencyRequest {
            selector: selector(metric, hours),
            item: item.to_vec(),
        })
        .await?;
    Ok(r.into_inner().answer.expect("answer").estimate)
}

/// The estimate of the merge of `sketches`, as the aggregator would compute it.
fn merged_estimate(sketches: &[Vec<u8>]) -> f64 {
    let mut acc: Option<Sketch> = None;
    for bytes in sketches {
        let s = Sketch::decode(bytes).expect("decode");
        match &mut acc {
            Some(a) => a.merge(&s).expect("merge"),
            None => acc = Some(s),
        }
    }
    match acc.expect("at least one sketch") {
        Sketch::Distinct(h) => h.estimate().estimate,
        other => panic!("not a distinct sketch: {other:?}"),
    }
}

fn one_item(params: FrequencyParams, item: &[u8]) -> Vec<u8> {
    let mut f = Frequency::new(params).expect("frequency sketch");
    f.insert(item).expect("insert");
    f.encode()
}

pub(crate) async fn push_all(
    collector: &mut CollectorClient<Channel>,
    from: &str,
    snapshots: Vec<v1::Snapshot>,
    live: Vec<u32>,
) {
    let n = snapshots.len();
    let r = push(collector, server(from, &[]), snapshots, live).await;
    assert_eq!(outcomes(&r), vec![v1::PushOutcome::Stored; n], "{r:?}");
}

/// A metric's Count-Min width changes at noon of one day. Before: the pass stopped at
/// that day for good, no later day was rolled up and retention never ran. Now: the day
/// is recorded as a conflict and skipped, later days roll up, retention runs but keeps
/// the conflicted day's rows, and queries answer each side of the change exactly and
/// refuse the day as a whole naming the hour of the change.
#[tokio::test]
async fn a_parameter_change_mid_day_stops_nothing_and_loses_nothing() {
    let dir = TempDir::new("bg-params");
    let agg = start(&dir, "5d", "");
    let (mut collector, mut query) = clients(&agg).await;
    let (x, y) = (day(4), day(3));
    let coarse = FrequencyParams::from_error(0.01, 0.01).expect("params");
    let fine = FrequencyParams::from_error(0.001, 0.01).expect("params");
    let clicks: Vec<v1::Snapshot> = (0..24)
        .map(|h| {
            let params = if h < 12 { coarse } else { fine };
            snapshot(
                "clicks",
                x + h,
                1,
                v1::SketchKind::Frequency,
                one_item(params, b"buy"),
            )
        })
        .collect();
    push_all(&mut collector, "web-1", clicks, (x..y + 24).collect()).await;
    let visitors = [hll_of(0..100), hll_of(50..150), hll_of(1000..1300)];
    push_all(
        &mut collector,
        "web-1",
        vec![
            snapshot(
                "visitors",
                x + 3,
                1,
                v1::SketchKind::Distinct,
                visitors[0].clone(),
            ),
            snapshot(
                "visitors",
                x + 9,
                1,
                v1::SketchKind::Distinct,
                visitors[1].clone(),
            ),
            snapshot(
                "visitors",
                y + 5,
                1,
                v1::SketchKind::Distinct,
                visitors[2].clone(),
            ),
        ],
        vec![],
    )
    .await;
    two_passes(&agg);
    assert_eq!(
        metric(&agg, "hourglass_aggregator_rollup_conflicts_total"),
        1.0
    );
    assert_eq!(metric(&agg, "hourglass_aggregator_conflicted_days"), 1.0);
    // The later day was rolled up: one rollup answers it.
    let (estimate, merged, missing) = distinct(&mut query, "visitors", y..y + 24).await;
    assert_eq!((merged, missing), (1, 0));
    assert_eq!(estimate, merged_estimate(&visitors[2..]));

    // Each side of the change answers exactly; the whole day is refused, naming the hour.
    assert_eq!(
        frequency(&mut query, "clicks", x..x + 12, b"buy")
            .await
            .unwrap(),
        12
    );
    assert_eq!(
        frequency(&mut query, "clicks", x + 12..x + 24, b"buy")
            .await
            .unwrap(),
        12
    );
    let refused = frequency(&mut query, "clicks", x..x + 24, b"buy")
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains(&format_hour(x + 12)) && refused.message().contains("differs"),
        "{}",
        refused.message()
    );

    // Retention down to 1 day: the clean day's rows go, the conflicted day's stay.
    drop((collector, query));
    stop(agg).await;
    let agg = start(&dir, "1d", "");
    let (_, mut query) = clients(&agg).await;
    two_passes(&agg);
    assert!(
        metric(
            &agg,
            "hourglass_aggregator_retention_deleted_total{what=\"hourly\"}"
        ) >= 2.0
    );
    assert_eq!(
        metric(&agg, "hourglass_aggregator_retention_held_days"),
        1.0
    );
    assert_eq!(
        frequency(&mut query, "clicks", x..x + 12, b"buy")
            .await
            .unwrap(),
        12
    );
    assert_eq!(
        frequency(&mut query, "clicks", x + 12..x + 24, b"buy")
            .await
            .unwrap(),
        12
    );
    // The expired day answers from its rollup, and its coverage is whole: liveness was
    // kept with the rollups (before, every server-hour past retention was "missing").
    let (estimate, merged, missing) = distinct(&mut query, "visitors", x..x + 24).await;
    assert_eq!((merged, missing), (1, 0));
    assert_eq!(estimate, merged_estimate(&visitors[..2]));
    assert!(
        (estimate - 150.0).abs() <= 4.0 * 150.0 * 1.04 / 128.0,
        "{estimate}"
    );
    drop(query);
    stop(agg).await;
}

/// Two servers, a day rolled up; then retention reaches into that day and a late resend
/// of one of its hours arrives. Before: retention deleted the day's morning, the resend
/// was accepted, and the rebuild from the afternoon alone shrank the day for both
/// servers. Now: retention keeps or deletes whole days, the rebuild sees every hour, and
/// once the day is gone a resend into it is refused and the rollup answers unchanged.
#[tokio::test]
async fn a_late_resend_into_a_day_reached_by_retention_never_shrinks_it() {
    let dir = TempDir::new("bg-late");
    let agg = start(&dir, "5d", "");
    let (mut collector, mut query) = clients(&agg).await;
    let x = day(3);
    let mut all = Vec::new();
    for (s, name) in ["web-1", "web-2"].into_iter().enumerate() {
        let s = s as u32;
        let snapshots: Vec<v1::Snapshot> = (0..24)
            .map(|h| {
                let items = hll_of(s * 10_000 + h * 100..s * 10_000 + h * 100 + 100);
                all.push(items.clone());
                snapshot("visitors", x + h, 1, v1::SketchKind::Distinct, items)
            })
            .collect();
        push_all(&mut collector, name, snapshots, (x..x + 24).collect()).await;
    }
    two_passes(&agg);
    let truth = merged_estimate(&all);
    let (estimate, merged, _) = distinct(&mut query, "visitors", x..x + 24).await;
    assert_eq!((estimate, merged), (truth, 1));
    assert!(
        (truth - 4800.0).abs() <= 4.0 * 4800.0 * 1.04 / 128.0,
        "{truth}"
    );

    // Retention that ends at noon of that day (in hours, as a user may set it).
    drop((collector, query));
    stop(agg).await;
    let noon = this_hour() - (x + 12);
    let agg = start(&dir, &format!("{noon}h"), "");
    let (mut collector, mut query) = clients(&agg).await;
    two_passes(&agg);
    // The resend of 20:00 from web-1 (same content, a newer version) is accepted.
    let resend = snapshot(
        "visitors",
        x + 20,
        2,
        v1::SketchKind::Distinct,
        all[20].clone(),
    );
    push_all(&mut collector, "web-1", vec![resend], vec![]).await;
    two_passes(&agg);
    let (estimate, merged, missing) = distinct(&mut query, "visitors", x..x + 24).await;
    assert_eq!((estimate, merged, missing), (truth, 1, 0));
    // Hour by hour, the morning is still there: nothing was deleted from a kept day.
    let (morning, _, _) = distinct(&mut query, "visitors", x..x + 12).await;
    assert_eq!(
        morning,
        merged_estimate(&[&all[..12], &all[24..36]].concat())
    );

    // Retention past the whole day: the day goes, and a resend into it is refused.
    drop((collector, query));
    stop(agg).await;
    let agg = start(&dir, "1d", "");
    let (mut collector, mut query) = clients(&agg).await;
    two_passes(&agg);
    let late = snapshot(
        "visitors",
        x + 21,
        3,
        v1::SketchKind::Distinct,
        all[21].clone(),
    );
    let r = push(&mut collector, server("web-1", &[]), vec![late], vec![]).await;
    assert_eq!(outcomes(&r), vec![v1::PushOutcome::Rejected], "{r:?}");
    assert!(r[0].reason.contains("outside the hours accepted"), "{r:?}");
    let (estimate, merged, missing) = distinct(&mut query, "visitors", x..x + 24).await;
    assert_eq!((estimate, merged, missing), (truth, 1, 0));
    // Hourly rows of the day are gone: part of it is refused, not answered empty with
    // every server-hour counted present (its liveness outlives its rows).
    let refused = query
        .distinct(v1::DistinctRequest {
            selector: selector("visitors", x..x + 12),
        })
        .await
        .expect_err("part of a day past hourly retention");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("past hourly retention"),
        "{refused:?}"
    );
    drop((collector, query));
    stop(agg).await;
}

/// A server that stopped (decommissioned) and one that started mid-range. Before: both
/// were counted missing for every hour of the range they were not there. Now: a server
/// is expected from its first live hour to `coverage.retire_after` past its last.
#[tokio::test]
async fn servers_are_missing_only_while_expected() {
    let dir = TempDir::new("bg-retired");
    let agg = start(&dir, "5d", "[coverage]\nretire_after = \"2h\"\n");
    let (mut collector, mut query) = clients(&agg).await;
    let (x, y) = (day(4), day(3));
    let old = vec![snapshot(
        "visitors",
        x,
        1,
        v1::SketchKind::Distinct,
        hll_of(0..10),
    )];
    push_all(&mut collector, "old-1", old, (x..x + 12).collect()).await;
    let new = vec![snapshot(
        "visitors",
        y,
        1,
        v1::SketchKind::Distinct,
        hll_of(5..20),
    )];
    push_all(&mut collector, "new-1", new, (y..y + 24).collect()).await;
    // old-1: expected 00:00 to 14:00 of x, live until noon: 2 hours missing. new-1:
    // expected from the start of y, live all of it: none.
    let (_, _, missing) = distinct(&mut query, "visitors", x..y + 24).await;
    assert_eq!(missing, 2);
    two_passes(&agg);
    let (estimate, merged, missing) = distinct(&mut query, "visitors", x..y + 24).await;
    assert_eq!((merged, missing), (2, 2));
    assert_eq!(estimate, merged_estimate(&[hll_of(0..10), hll_of(5..20)]));
    drop((collector, query));
    stop(agg).await;
}
