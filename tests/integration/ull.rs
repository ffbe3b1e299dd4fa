//! UltraLogLog as a form of the distinct kind, end to end: rows of both forms pushed over
//! gRPC into an aggregator on RocksDB, answered from hourly rows, after a restart, from
//! day rollups (alone, and with hourly rows at a range's edges, precisions mixed) and
//! from a cluster's partial merges, against the sketches computed here; and an agent
//! configured with `distinct_form` shipping the form it was told, through a switch of
//! form mid-series.
//!
//! The merge rule under test (docs/FORMAT.md, "Merging the two forms"): a range that holds
//! any HyperLogLog row answers as the HyperLogLog of the union, with HyperLogLog's error;
//! a range of UltraLogLog rows only answers with UltraLogLog's smaller error.

use crate::agent::{export, fast_config, ingest, wait_shipped};
use crate::aggregator::{clients, outcomes, push, server, tag};
use crate::background::{day, metric, push_all, start as start_with_rollups, two_passes};
use crate::util::{AgentProcess, InProcessAggregator, TempDir, snapshot, this_hour};
use hourglass_rpc::proto::v1::{self, query_client::QueryClient};
use hourglass_rpc::time::hour_start;
use hourglass_sketch::distinct::{Distinct, DistinctForm};
use hourglass_sketch::{Estimate, Sketch};
use tonic::transport::Channel;

/// The distinct sketch of `form` at its default precision (what an agent keeps unless
/// told otherwise: 14 for HyperLogLog, 13 for UltraLogLog) of users `range`.
fn sketch_of(form: DistinctForm, users: std::ops::Range<u32>) -> Distinct {
    sketch_at(form, form.default_precision(), users)
}

/// The distinct sketch of `form` at `precision` of users `range`.
pub(crate) fn sketch_at(
    form: DistinctForm,
    precision: u8,
    users: std::ops::Range<u32>,
) -> Distinct {
    let mut sketch = Distinct::new(form, precision).expect("a valid precision");
    for user in users {
        sketch.insert(format!("user{user}").as_bytes());
    }
    sketch
}

/// The merge of `parts`, computed here as the aggregator must.
fn union_of<'a>(parts: impl IntoIterator<Item = &'a Distinct>) -> Distinct {
    let mut parts = parts.into_iter();
    let mut union = parts.next().expect("one part").clone();
    for part in parts {
        union.merge(part).expect("distinct sketches merge");
    }
    union
}

/// The merge of `parts`, or `None` when there are none (the empty set).
pub(crate) fn union_if_any<'a>(parts: impl IntoIterator<Item = &'a Distinct>) -> Option<Distinct> {
    let mut parts = parts.into_iter().peekable();
    parts.peek().is_some().then(|| union_of(parts))
}

/// A distinct snapshot of `visitors` at `hour`.
pub(crate) fn row(hour: u32, sketch: &Distinct) -> v1::Snapshot {
    snapshot(
        "visitors",
        hour,
        1,
        v1::SketchKind::Distinct,
        sketch.encode(),
    )
}

/// [`row`] of the series `visitors{tags}`.
fn tagged_row(tags: &[(&str, &str)], hour: u32, sketch: &Distinct) -> v1::Snapshot {
    let mut s = row(hour, sketch);
    s.series.as_mut().unwrap().tags = tags.iter().map(|(k, v)| tag(k, v)).collect();
    s
}

fn selector(hours: std::ops::Range<u32>, servers: &[&str]) -> Option<v1::Selector> {
    Some(v1::Selector {
        metric: "visitors".into(),
        range: Some(v1::TimeRange {
            start_hour: hours.start,
            end_hour: hours.end,
        }),
        servers: servers.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
}

pub(crate) async fn distinct(
    query: &mut QueryClient<Channel>,
    hours: std::ops::Range<u32>,
    servers: &[&str],
) -> v1::DistinctAnswer {
    query
        .distinct(v1::DistinctRequest {
            selector: selector(hours, servers),
        })
        .await
        .expect("distinct")
        .into_inner()
        .answer
        .expect("answer")
}

/// The merged sketch the aggregator exports for `hours`.
async fn exported(query: &mut QueryClient<Channel>, hours: std::ops::Range<u32>) -> Distinct {
    let bytes = query
        .export(v1::ExportRequest {
            selector: selector(hours, &[]),
            kind: v1::SketchKind::Distinct as i32,
        })
        .await
        .expect("export")
        .into_inner()
        .sketch
        .expect("a sketch")
        .data;
    Distinct::decode(&bytes).expect("a distinct sketch")
}

/// The four figures of a distinct answer.
pub(crate) fn figures(a: &v1::DistinctAnswer) -> (f64, f64, f64, f64) {
    (a.estimate, a.std_error, a.lower95, a.upper95)
}

/// The four figures of `e`, as an answer carries them.
pub(crate) fn estimate_figures(e: &Estimate) -> (f64, f64, f64, f64) {
    (e.estimate, e.std_error, e.lower95, e.upper95)
}

/// `answer` is exactly `expected`: the same merge, the same estimator, bit for bit.
fn assert_answers(answer: &v1::DistinctAnswer, expected: &Estimate, what: &str) {
    assert_eq!(
        (
            answer.estimate,
            answer.std_error,
            answer.lower95,
            answer.upper95
        ),
        (
            expected.estimate,
            expected.std_error,
            expected.lower95,
            expected.upper95
        ),
        "{what}"
    );
}

/// Relative standard errors of a dense sketch at p = 14 (m = 16,384, √m = 128);
/// UltraLogLog's constant is 0.7608… to three places.
const HLL_RSE: f64 = 1.04 / 128.0;
const ULL_RSE: f64 = 0.761 / 128.0;

fn relative_error(answer: &v1::DistinctAnswer) -> f64 {
    answer.std_error / answer.estimate
}

/// web-1 kept HyperLogLog for its first two hours and UltraLogLog after; web-2 switched
/// an hour earlier. Over gRPC into RocksDB, through a restart: a range with any
/// HyperLogLog row is the HyperLogLog of the union, with its error; a range of
/// UltraLogLog rows keeps UltraLogLog's error; overlap and retention read both.
#[tokio::test]
async fn mixed_rows_answer_as_the_hll_of_the_union() {
    use DistinctForm::{Hll, Ull};
    let dir = TempDir::new("ull-mixed");
    let data = dir.file("data");
    let agg = InProcessAggregator::start(&data);
    let (mut collector, _) = clients(&agg).await;
    let h0 = this_hour() - 5;
    // One precision (14) for both forms: the test is of the form, not of the fold.
    // (server, hour offset, form, users): 3,000 users an hour, overlapping by 1,000.
    let plan = [
        ("web-1", 0, Hll, 0..3000),
        ("web-1", 1, Hll, 2000..5000),
        ("web-1", 2, Ull, 4000..7000),
        ("web-1", 3, Ull, 6000..9000),
        ("web-2", 0, Hll, 8000..11_000),
        ("web-2", 1, Ull, 10_000..13_000),
        ("web-2", 2, Ull, 12_000..15_000),
        ("web-2", 3, Ull, 14_000..17_000),
    ];
    let sketches: Vec<Distinct> = plan
        .iter()
        .map(|(_, _, form, users)| sketch_at(*form, 14, users.clone()))
        .collect();
    for name in ["web-1", "web-2"] {
        let rows: Vec<v1::Snapshot> = plan
            .iter()
            .zip(&sketches)
            .filter(|((server, ..), _)| *server == name)
            .map(|((_, offset, ..), sketch)| row(h0 + offset, sketch))
            .collect();
        let n = rows.len();
        let results = push(
            &mut collector,
            server(name, &[]),
            rows,
            (h0..h0 + 4).collect(),
        )
        .await;
        assert_eq!(outcomes(&results), vec![v1::PushOutcome::Stored; n]);
    }
    // What the aggregator must answer, computed here.
    let of = |pick: &dyn Fn(&str, u32) -> bool| {
        union_of(
            plan.iter()
                .zip(&sketches)
                .filter(|((server, offset, ..), _)| pick(server, *offset))
                .map(|(_, sketch)| sketch),
        )
    };
    let everything = of(&|_, _| true);
    let late = of(&|_, offset| offset >= 2);
    let web1 = of(&|server, _| server == "web-1");
    assert_eq!(everything.form(), Hll);
    assert_eq!(late.form(), Ull);
    // The same users as the HyperLogLog of each row: the form changes nothing but the
    // error, and the HyperLogLog of the union does not depend on which rows were ULL.
    assert_eq!(
        everything,
        Distinct::Hll(
            union_of(
                &sketches
                    .iter()
                    .map(|s| Distinct::Hll(s.to_hll()))
                    .collect::<Vec<_>>()
            )
            .into_hll()
        )
    );

    // Stopped and opened again: the rows are read back from RocksDB.
    agg.stop().await;
    let agg = InProcessAggregator::start(&data);
    let (_, mut query) = clients(&agg).await;

    let all_hours = h0..h0 + 4;
    let mixed = distinct(&mut query, all_hours.clone(), &[]).await;
    assert_answers(&mixed, &everything.estimate(), "the mixed range");
    assert!(
        (relative_error(&mixed) - HLL_RSE).abs() < 1e-12,
        "{mixed:?}"
    );
    assert!(
        (mixed.estimate - 17_000.0).abs() <= 4.0 * mixed.std_error,
        "{mixed:?}"
    );
    assert_eq!(exported(&mut query, all_hours.clone()).await, everything);

    let ull_only = distinct(&mut query, h0 + 2..h0 + 4, &[]).await;
    assert_answers(&ull_only, &late.estimate(), "the UltraLogLog range");
    assert!(
        (relative_error(&ull_only) - ULL_RSE).abs() < 1e-3 / 128.0,
        "{ull_only:?}"
    );
    assert!(relative_error(&ull_only) < relative_error(&mixed) * 0.75);
    assert!(
        (ull_only.estimate - 10_000.0).abs() <= 4.0 * ull_only.std_error,
        "{ull_only:?}"
    );
    assert_eq!(exported(&mut query, h0 + 2..h0 + 4).await, late);

    // One server's rows: web-1's two forms merge to HyperLogLog.
    let one = distinct(&mut query, all_hours.clone(), &["web-1"]).await;
    assert_answers(&one, &web1.estimate(), "web-1 alone");
    let grouped = query
        .distinct(v1::DistinctRequest {
            selector: selector(all_hours.clone(), &[]).map(|s| v1::Selector {
                group_by: v1::GroupBy::Server as i32,
                ..s
            }),
        })
        .await
        .expect("grouped")
        .into_inner();
    assert_eq!(grouped.groups.len(), 2);
    assert_eq!(grouped.groups[0].answer.as_ref(), Some(&one));

    // Overlap of the HyperLogLog hours with the UltraLogLog ones: |A| and |B| as Distinct
    // answers them, the joint figures from the HyperLogLogs of both, exactly.
    let early = of(&|_, offset| offset < 2);
    let overlap = query
        .overlap(v1::OverlapRequest {
            a: selector(h0..h0 + 2, &[]),
            b: selector(h0 + 2..h0 + 4, &[]),
        })
        .await
        .expect("overlap")
        .into_inner()
        .answer
        .expect("answer");
    assert_answers(overlap.a.as_ref().expect("a"), &early.estimate(), "|A|");
    assert_answers(overlap.b.as_ref().expect("b"), &late.estimate(), "|B|");
    let joint = hourglass_sketch::overlap::estimate_pair(&early.to_hll(), &late.to_hll())
        .expect("estimable");
    assert_answers(
        overlap.union.as_ref().expect("union"),
        &joint.union,
        "|A ∪ B|",
    );
    assert_answers(
        overlap.intersection.as_ref().expect("intersection"),
        &joint.intersection,
        "|A ∩ B|",
    );
    // Users 4000..5000, 8000..9000 and 12,000..13,000 are in both: 3,000.
    let both = overlap.intersection.expect("intersection");
    assert!(
        (both.estimate - 3000.0).abs() <= 4.0 * both.std_error,
        "{both:?}"
    );

    // A retention table of two-hour periods: each period's count in its own form.
    let retention = query
        .retention(v1::RetentionRequest {
            selector: selector(all_hours, &[]),
            period_hours: 2,
        })
        .await
        .expect("retention")
        .into_inner();
    let periods: Vec<&v1::DistinctAnswer> = retention
        .periods
        .iter()
        .map(|p| p.distinct.as_ref().expect("distinct"))
        .collect();
    assert_answers(periods[0], &early.estimate(), "first period");
    assert_answers(periods[1], &late.estimate(), "second period");
    let returned = retention.rows[0].cells[0]
        .returned
        .as_ref()
        .expect("returned");
    assert_answers(
        returned,
        &joint.intersection,
        "returned in the second period",
    );
    agg.stop().await;
}

/// Whole past days, answered from the rollups the background pass builds: a day of mixed
/// rows rolls up to the HyperLogLog of the day, a day of UltraLogLog rows to an
/// UltraLogLog, and the two days together to a HyperLogLog.
#[tokio::test]
async fn rollups_of_mixed_days_follow_the_merge_rule() {
    use DistinctForm::{Hll, Ull};
    let dir = TempDir::new("ull-rollups");
    let agg = start_with_rollups(&dir, "35d", "");
    let (mut collector, mut query) = clients(&agg).await;
    let (mixed_day, ull_day) = (day(4), day(3));
    let rows = [
        (mixed_day + 1, sketch_of(Hll, 0..4000)),
        (mixed_day + 7, sketch_of(Ull, 3000..8000)),
        (mixed_day + 20, sketch_of(Ull, 7000..9000)),
        (ull_day + 2, sketch_of(Ull, 8000..12_000)),
        (ull_day + 23, sketch_of(Ull, 11_000..20_000)),
    ];
    push_all(
        &mut collector,
        "web-1",
        rows.iter()
            .map(|(hour, sketch)| row(*hour, sketch))
            .collect(),
        (mixed_day..ull_day + 24).collect(),
    )
    .await;
    two_passes(&agg);
    // Both days rolled up, with no conflict: the forms are one kind's parameters that merge.
    assert_eq!(metric(&agg, "hourglass_aggregator_rollup_days_total"), 2.0);
    assert_eq!(
        metric(&agg, "hourglass_aggregator_rollup_conflicts_total"),
        0.0
    );

    let of = |days: std::ops::Range<u32>| {
        union_of(
            rows.iter()
                .filter(|(hour, _)| days.contains(hour))
                .map(|(_, sketch)| sketch),
        )
    };
    let (first, second, both) = (
        of(mixed_day..mixed_day + 24),
        of(ull_day..ull_day + 24),
        of(mixed_day..ull_day + 24),
    );
    assert_eq!((first.form(), second.form(), both.form()), (Hll, Ull, Hll));
    for (hours, expected, what) in [
        (mixed_day..mixed_day + 24, &first, "the mixed day"),
        (ull_day..ull_day + 24, &second, "the UltraLogLog day"),
        (mixed_day..ull_day + 24, &both, "both days"),
    ] {
        let answer = distinct(&mut query, hours.clone(), &[]).await;
        assert_answers(&answer, &expected.estimate(), what);
        assert_eq!(&exported(&mut query, hours).await, expected, "{what}");
    }
    agg.stop().await;
}

/// Three days of one server's rows, HLL 14 then ULL 13 with a stretch of ULL 12, some
/// hours empty: whole days come from rollups and the partial days at either end from hourly
/// rows, in one range. The answer must be the flat merge of every hourly row in it.
#[tokio::test]
async fn rollup_days_and_hourly_edges_of_mixed_forms_and_precisions_answer_the_flat_merge() {
    use DistinctForm::{Hll as H, Ull as U};
    let dir = TempDir::new("ull-mixed-rollups");
    let agg = start_with_rollups(&dir, "35d", "");
    let (mut collector, mut query) = clients(&agg).await;
    let first = day(5);
    let mut rows = Vec::new();
    for t in 0..72u32 {
        let (form, p) = match t {
            t if t < 20 => (H, 14),
            t if (30..34).contains(&t) => (U, 12),
            t if (50..52).contains(&t) => (H, 14),
            _ => (U, 13),
        };
        let n = [0u32, 30, 900, 1700, 2500, 6000][(t as usize * 5) % 6];
        if n == 0 {
            continue;
        }
        rows.push((first + t, sketch_at(form, p, t * 1000..t * 1000 + n)));
    }
    push_all(
        &mut collector,
        "web-1",
        rows.iter().map(|(h, s)| row(*h, s)).collect(),
        (first..first + 72).collect(),
    )
    .await;
    two_passes(&agg);
    for hours in [
        first..first + 72,
        first + 5..first + 72,
        first + 5..first + 60,
        first + 24..first + 48,
        first + 21..first + 50,
        first + 30..first + 34,
        first + 40..first + 70,
    ] {
        let want = union_if_any(
            rows.iter()
                .filter(|(h, _)| hours.contains(h))
                .map(|(_, s)| s),
        )
        .expect("rows in range");
        let answer = distinct(&mut query, hours.clone(), &[]).await;
        assert_eq!(
            figures(&answer),
            estimate_figures(&want.estimate()),
            "hours {}..{} of day(5)",
            hours.start - first,
            hours.end - first
        );
        assert_eq!(
            exported(&mut query, hours.clone()).await,
            want,
            "hours {}..{}",
            hours.start - first,
            hours.end - first
        );
    }
    agg.stop().await;
}

/// An agent told `distinct_form = "ull"` ships UltraLogLog rows, and one told `"hll"`
/// HyperLogLog rows. The same agent switched from `"hll"` to `"ull"` (a restart on its
/// checkpoint) keeps the hour it had open as HyperLogLog, keeps new hours as UltraLogLog,
/// and the range across the switch answers as the HyperLogLog of all its events.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_ships_the_form_it_is_configured_with() {
    let dir = TempDir::new("ull-agent");
    let agg = InProcessAggregator::start(&dir.file("agg"));
    let (_, mut query) = clients(&agg).await;
    let (before, after) = (this_hour() - 2, this_hour() - 1);
    let time = |hour: u32| hour_start(hour).timestamp() + 60;
    let users = |range: std::ops::Range<u32>| -> Vec<String> {
        range.map(|i| format!("user{i}")).collect()
    };
    let run = |form: &str, data: &str| {
        let config = fast_config(
            &dir,
            &format!(
                "[metrics.visitors]\nkinds = [\"distinct\"]\ndistinct_form = \"{form}\"\n\
                 [metrics.pages]\nkinds = [\"distinct\"]\ndistinct_form = \"hll\"\n"
            ),
        );
        AgentProcess::start(
            "web-1",
            &agg.grpc,
            data,
            &[
                "--flush-interval",
                "200ms",
                "--lateness",
                "6h",
                "--config",
                &config,
            ],
        )
    };
    let data = dir.file("agent");

    // First as HyperLogLog: the hour `before`.
    let agent = run("hll", &data);
    let r = ingest(&agent, "visitors", &[], &users(0..3000), time(before)).await;
    assert_eq!(r.accepted, 3000, "{r:?}");
    wait_shipped(&agent);
    assert!(agent.terminate().success());

    // Then as UltraLogLog, on the same checkpoint: more users in `before` (its open
    // HyperLogLog, restored) and the hour `after`, new, as UltraLogLog.
    let agent = run("ull", &data);
    let r = ingest(&agent, "visitors", &[], &users(2000..4000), time(before)).await;
    assert_eq!(r.accepted, 2000, "{r:?}");
    let r = ingest(&agent, "visitors", &[], &users(3000..8000), time(after)).await;
    assert_eq!(r.accepted, 5000, "{r:?}");
    let r = ingest(&agent, "pages", &[], &users(0..100), time(after)).await;
    assert_eq!(r.accepted, 100, "{r:?}");
    wait_shipped(&agent);

    let row_of = |bytes: Vec<u8>| match Sketch::decode(&bytes).expect("a stored sketch") {
        Sketch::Distinct(d) => d,
        other => panic!("not distinct: {other:?}"),
    };
    let visitors = |hours: std::ops::Range<u32>| {
        let agg = &agg;
        async move { row_of(export(agg, "visitors", v1::SketchKind::Distinct, hours, &["web-1"]).await) }
    };
    let old_hour = visitors(before..before + 1).await;
    let new_hour = visitors(after..after + 1).await;
    let across = visitors(before..after + 1).await;
    let pages = row_of(
        export(
            &agg,
            "pages",
            v1::SketchKind::Distinct,
            after..after + 1,
            &["web-1"],
        )
        .await,
    );
    assert_eq!(
        old_hour,
        sketch_of(DistinctForm::Hll, 0..4000),
        "the hour open at the switch"
    );
    assert_eq!(
        new_hour,
        sketch_of(DistinctForm::Ull, 3000..8000),
        "the hour after it"
    );
    assert_eq!(
        across,
        // HyperLogLog at 14 beside UltraLogLog at 13: the HyperLogLog at 13 of both.
        sketch_at(DistinctForm::Hll, 13, 0..8000),
        "across the switch"
    );
    assert_eq!(pages.form(), DistinctForm::Hll, "a metric told hll");
    assert_eq!(pages.estimate().estimate.round(), 100.0);

    let answer = distinct(&mut query, after..after + 1, &[]).await;
    assert_answers(&answer, &new_hour.estimate(), "the UltraLogLog hour");
    let answer = distinct(&mut query, before..after + 1, &[]).await;
    assert_answers(&answer, &across.estimate(), "across the switch");
    assert!(agent.terminate().success());
    agg.stop().await;
}

// ---- Cluster mode: partial merges of mixed forms ----

/// Series of one metric in every partition, in both forms and three precisions,
/// pushed to one node of three: every node's answer (its own partitions merged with
/// the others' partials) is the merge computed here, in its form.
#[test]
fn cluster_partials_of_mixed_forms_answer_as_one_merge() {
    use crate::faults::{agg_metric, wait_until};
    use crate::nats::NatsCluster;
    use crate::natsfaults::{PARTITIONS, node, ready};
    use crate::util::{channel, runtime};
    use std::time::Duration;

    let nats = NatsCluster::start(3);
    let dir = TempDir::new("ull-cluster");
    let start = |name: &str| {
        node(&dir, nats.urls(), name, |c| {
            c.member_ttl = Duration::from_secs(6)
        })
    };
    let nodes = [start("agg-1"), start("agg-2"), start("agg-3")];
    let all: Vec<&InProcessAggregator> = nodes.iter().collect();
    let settled = || {
        all.iter()
            .all(|&n| agg_metric(n, "cluster_members") as usize == all.len() && ready(n))
    };
    wait_until(
        "three members, each owning part of the partitions",
        &settled,
    );
    // Some node answers for only part of the partitions: its answers merge partials.
    assert!(
        all.iter()
            .any(|&n| agg_metric(n, "cluster_partitions_applying") < f64::from(PARTITIONS)),
        "every node applies every partition: no partial would be asked for"
    );
    let rt = runtime();
    let h0 = this_hour() - 3;
    let mut rows = Vec::new();
    for shard in 0..16u32 {
        let (form, p) = match shard % 4 {
            0 => (DistinctForm::Hll, 14),
            1 | 2 => (DistinctForm::Ull, 13),
            _ => (DistinctForm::Ull, 12),
        };
        for hour in 0..2u32 {
            let start = shard * 3000 + hour * 1000;
            rows.push((
                shard,
                h0 + hour,
                sketch_at(form, p, start..start + 400 + 300 * shard),
            ));
        }
    }
    let request = v1::PushRequest {
        server: server("web-1", &[]),
        snapshots: rows
            .iter()
            .map(|(shard, hour, s)| {
                let ull = if s.form() == DistinctForm::Ull {
                    "yes"
                } else {
                    "no"
                };
                let p = s.precision().to_string();
                tagged_row(
                    &[("p", &p), ("shard", &shard.to_string()), ("ull", ull)],
                    *hour,
                    s,
                )
            })
            .collect(),
        live_hours: vec![h0, h0 + 1],
    };
    let outcomes = rt.block_on(async {
        let mut c = v1::collector_client::CollectorClient::new(channel(&nodes[0].grpc).await);
        loop {
            match c.push(request.clone()).await {
                Ok(r) => break outcomes(&r.into_inner().results),
                Err(s) if s.code() == tonic::Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(s) => panic!("push refused: {s}"),
            }
        }
    });
    assert_eq!(outcomes, vec![v1::PushOutcome::Stored; rows.len()]);
    wait_until("every node applied the push", &settled);
    std::thread::sleep(Duration::from_secs(1));
    // (name, tag filter, which series `s` the filter selects)
    type Case<'a> = (
        &'a str,
        Option<(&'a str, &'a str)>,
        Box<dyn Fn(u32) -> bool>,
    );
    let cases: Vec<Case> = vec![
        ("all", None, Box::new(|_| true)),
        ("ull only", Some(("ull", "yes")), Box::new(|s| s % 4 != 0)),
        (
            "ull 13 only",
            Some(("p", "13")),
            Box::new(|s| s % 4 == 1 || s % 4 == 2),
        ),
    ];
    for (what, filter, pick) in &cases {
        let want = union_if_any(rows.iter().filter(|(s, ..)| pick(*s)).map(|(.., s)| s)).unwrap();
        for (i, n) in nodes.iter().enumerate() {
            let (answer, export) = rt.block_on(async {
                let mut q = QueryClient::new(channel(&n.grpc).await);
                let mut sel = selector(h0..h0 + 2, &[]).unwrap();
                if let Some((k, v)) = filter {
                    sel.tags = vec![tag(k, v)];
                }
                let answer = q
                    .distinct(v1::DistinctRequest {
                        selector: Some(sel.clone()),
                    })
                    .await
                    .expect("distinct")
                    .into_inner();
                let export = q
                    .export(v1::ExportRequest {
                        selector: Some(sel),
                        kind: v1::SketchKind::Distinct as i32,
                    })
                    .await
                    .expect("export")
                    .into_inner();
                (answer, export)
            });
            let coverage = answer.coverage.expect("coverage");
            assert!(
                coverage.missing_partitions.is_empty(),
                "{what}, node {i}: {coverage:?}"
            );
            assert_eq!(
                figures(&answer.answer.expect("answer")),
                estimate_figures(&want.estimate()),
                "{what}, node {i}"
            );
            let got = Distinct::decode(&export.sketch.expect("a sketch").data).unwrap();
            assert_eq!(got, want, "{what}, node {i}");
        }
    }
    rt.block_on(async {
        for n in nodes {
            n.stop().await;
        }
    });
}
