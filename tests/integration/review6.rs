//! Review 6: the UltraLogLog form of the distinct kind, end to end, where the forms and
//! the precisions mix (HLL 14 rows from before a switch, ULL 13 rows after it, a metric
//! briefly at ULL 12): hourly rows and day rollups in one range, a set question with an
//! empty side (the aggregator's empty-selection sketch is an empty ULL at p = 18), and
//! cluster mode's partial merges, each against the merge computed here.

use crate::aggregator::selector;
use crate::aggregator::{clients, outcomes, push, server, tag};
use crate::background::{day, push_all, start as start_with_rollups, two_passes};
use crate::util::{InProcessAggregator, TempDir, this_hour};
use hourglass_rpc::proto::v1::{self, query_client::QueryClient};
use hourglass_sketch::Estimate;
use hourglass_sketch::distinct::{Distinct, DistinctForm};
use hourglass_sketch::hll::Hll;
use tonic::transport::Channel;

fn sketch(form: DistinctForm, precision: u8, users: std::ops::Range<u32>) -> Distinct {
    let mut s = Distinct::new(form, precision).expect("a valid precision");
    for u in users {
        s.insert(format!("user{u}").as_bytes());
    }
    s
}

fn union_of<'a>(parts: impl IntoIterator<Item = &'a Distinct>) -> Option<Distinct> {
    let mut parts = parts.into_iter();
    let mut union = parts.next()?.clone();
    for part in parts {
        union.merge(part).expect("distinct sketches merge");
    }
    Some(union)
}

fn row(metric: &str, tags: &[(&str, &str)], hour: u32, sketch: &Distinct) -> v1::Snapshot {
    v1::Snapshot {
        series: Some(v1::Series {
            metric: metric.into(),
            tags: tags.iter().map(|(k, v)| tag(k, v)).collect(),
        }),
        hour,
        epoch: 1,
        version: 1,
        sketch: Some(v1::EncodedSketch {
            kind: v1::SketchKind::Distinct as i32,
            data: sketch.encode().into(),
        }),
    }
}

fn figures(a: &v1::DistinctAnswer) -> (f64, f64, f64, f64) {
    (a.estimate, a.std_error, a.lower95, a.upper95)
}

fn expected(e: &Estimate) -> (f64, f64, f64, f64) {
    (e.estimate, e.std_error, e.lower95, e.upper95)
}

async fn distinct(
    q: &mut QueryClient<Channel>,
    metric: &str,
    hours: std::ops::Range<u32>,
) -> v1::DistinctAnswer {
    q.distinct(v1::DistinctRequest {
        selector: selector(metric, hours),
    })
    .await
    .expect("distinct")
    .into_inner()
    .answer
    .expect("answer")
}

async fn exported(
    q: &mut QueryClient<Channel>,
    metric: &str,
    hours: std::ops::Range<u32>,
) -> Option<Distinct> {
    q.export(v1::ExportRequest {
        selector: selector(metric, hours),
        kind: v1::SketchKind::Distinct as i32,
    })
    .await
    .expect("export")
    .into_inner()
    .sketch
    .map(|s| Distinct::decode(&s.data).expect("a distinct sketch"))
}

/// Three days of one server's rows, HLL 14 then ULL 13 with a stretch of ULL 12, some
/// hours empty: whole days come from rollups and the partial days at either end from hourly
/// rows, in one range. The answer must be the flat merge of every hourly row in it.
#[tokio::test]
async fn review6_rollup_days_and_hourly_edges_of_mixed_forms_and_precisions() {
    use DistinctForm::{Hll as H, Ull as U};
    let dir = TempDir::new("review6-rollups");
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
        rows.push((first + t, sketch(form, p, t * 1000..t * 1000 + n)));
    }
    push_all(
        &mut collector,
        "web-1",
        rows.iter()
            .map(|(h, s)| row("visitors", &[], *h, s))
            .collect(),
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
        let want = union_of(
            rows.iter()
                .filter(|(h, _)| hours.contains(h))
                .map(|(_, s)| s),
        )
        .expect("rows in range");
        let answer = distinct(&mut query, "visitors", hours.clone()).await;
        assert_eq!(
            figures(&answer),
            expected(&want.estimate()),
            "hours {}..{} of day(5)",
            hours.start - first,
            hours.end - first
        );
        assert_eq!(
            exported(&mut query, "visitors", hours.clone()).await,
            Some(want),
            "hours {}..{}",
            hours.start - first,
            hours.end - first
        );
    }
    agg.stop().await;
}

/// Set questions over ULL rows where one side selects nothing: the empty side is the
/// empty set, and neither |A|, the union, the intersection nor a retention cell may
/// depend on the sketch the aggregator stands in for it with.
#[tokio::test]
async fn review6_set_questions_with_an_empty_side() {
    let dir = TempDir::new("review6-sets");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let (mut collector, mut query) = clients(&agg).await;
    let h0 = this_hour() - 10;
    // visitors: ULL 13 rows, dense and sparse; h0+2..h0+4 and h0+6..h0+8 hold nothing.
    let rows = [
        (h0, sketch(DistinctForm::Ull, 13, 0..6000)),
        (h0 + 1, sketch(DistinctForm::Ull, 13, 5000..5300)),
        (h0 + 4, sketch(DistinctForm::Ull, 13, 100..1900)),
        (h0 + 5, sketch(DistinctForm::Hll, 14, 1800..2000)),
    ];
    let r = push(
        &mut collector,
        server("web-1", &[]),
        rows.iter()
            .map(|(h, s)| row("visitors", &[], *h, s))
            .collect(),
        (h0..h0 + 8).collect(),
    )
    .await;
    assert_eq!(outcomes(&r), vec![v1::PushOutcome::Stored; rows.len()]);
    let of = |hours: std::ops::Range<u32>| {
        union_of(
            rows.iter()
                .filter(|(h, _)| hours.contains(h))
                .map(|(_, s)| s),
        )
    };
    let empty_hll = || Hll::new(hourglass_sketch::hll::MAX_PRECISION).unwrap();
    for (a_hours, b_hours) in [
        (h0..h0 + 2, h0 + 2..h0 + 4),
        (h0 + 2..h0 + 4, h0..h0 + 2),
        (h0 + 4..h0 + 6, h0 + 6..h0 + 8),
        (h0 + 1..h0 + 2, h0 + 2..h0 + 3),
    ] {
        let answer = query
            .overlap(v1::OverlapRequest {
                a: selector("visitors", a_hours.clone()),
                b: selector("visitors", b_hours.clone()),
            })
            .await
            .expect("overlap")
            .into_inner()
            .answer
            .expect("answer");
        let (a, b) = (of(a_hours.clone()), of(b_hours.clone()));
        let what = format!("a {:?} b {:?}", a_hours, b_hours);
        let zero = (0.0, 0.0, 0.0, 0.0);
        let (a_hll, b_hll) = (
            a.as_ref().map_or_else(empty_hll, Distinct::to_hll),
            b.as_ref().map_or_else(empty_hll, Distinct::to_hll),
        );
        let joint = hourglass_sketch::overlap::estimate_pair(&a_hll, &b_hll).expect("joint");
        assert_eq!(
            figures(answer.a.as_ref().unwrap()),
            a.as_ref().map_or(zero, |a| expected(&a.estimate())),
            "|A|, {what}"
        );
        assert_eq!(
            figures(answer.b.as_ref().unwrap()),
            b.as_ref().map_or(zero, |b| expected(&b.estimate())),
            "|B|, {what}"
        );
        assert_eq!(
            figures(answer.union.as_ref().unwrap()),
            expected(&joint.union),
            "∪, {what}"
        );
        assert_eq!(
            figures(answer.intersection.as_ref().unwrap()),
            expected(&joint.intersection),
            "∩, {what}"
        );
        assert_eq!(
            figures(answer.intersection.as_ref().unwrap()),
            zero,
            "∩ of an empty side, {what}"
        );
        assert_eq!(answer.naive_intersection, 0.0, "naive ∩, {what}");
        // The one non-empty side's figures equal the distinct question's.
        let one = if a.is_some() {
            a_hours.clone()
        } else {
            b_hours.clone()
        };
        let d = distinct(&mut query, "visitors", one).await;
        let side = if a.is_some() { &answer.a } else { &answer.b };
        assert_eq!(figures(side.as_ref().unwrap()), figures(&d), "{what}");
    }
    // Retention over two-hour periods: [ULL], [nothing], [ULL ∪ HLL], [nothing].
    let retention = query
        .retention(v1::RetentionRequest {
            selector: selector("visitors", h0..h0 + 8),
            period_hours: 2,
        })
        .await
        .expect("retention")
        .into_inner();
    let periods: Vec<Option<Distinct>> = (0..4).map(|i| of(h0 + 2 * i..h0 + 2 * i + 2)).collect();
    for (i, (p, want)) in retention.periods.iter().zip(&periods).enumerate() {
        assert_eq!(
            figures(p.distinct.as_ref().unwrap()),
            want.as_ref()
                .map_or((0.0, 0.0, 0.0, 0.0), |w| expected(&w.estimate())),
            "period {i}"
        );
    }
    let hlls: Vec<Hll> = periods
        .iter()
        .map(|p| p.as_ref().map_or_else(empty_hll, Distinct::to_hll))
        .collect();
    for row in &retention.rows {
        for cell in &row.cells {
            let joint = hourglass_sketch::overlap::estimate_pair(
                &hlls[row.cohort as usize],
                &hlls[cell.period as usize],
            )
            .expect("joint");
            assert_eq!(
                figures(cell.returned.as_ref().unwrap()),
                expected(&joint.intersection),
                "cohort {} period {}",
                row.cohort,
                cell.period
            );
        }
    }
    agg.stop().await;
}

// ---- Cluster mode: partial merges of mixed forms ----

mod cluster {
    use super::*;
    use crate::faults::{agg_metric, wait_until};
    use crate::nats::NatsCluster;
    use crate::util::{channel, runtime};
    use std::time::Duration;

    const PARTITIONS: u32 = 8;

    fn node(dir: &TempDir, nats: &NatsCluster, name: &str) -> InProcessAggregator {
        let mut cluster = hourglass_aggregator::cluster::ClusterConfig::new(name, nats.urls());
        cluster.partitions = PARTITIONS;
        cluster.heartbeat = Duration::from_millis(500);
        cluster.member_ttl = Duration::from_secs(6);
        InProcessAggregator::start_with(hourglass_aggregator::Config {
            data_dir: dir.file(name).into(),
            cluster: Some(cluster),
            ..Default::default()
        })
    }

    fn settled(nodes: &[&InProcessAggregator]) -> bool {
        nodes.iter().all(|&n| {
            let applying = agg_metric(n, "cluster_partitions_applying");
            agg_metric(n, "cluster_members") as usize == nodes.len()
                && applying > 0.0
                && agg_metric(n, "cluster_partitions_ready") == applying
                && agg_metric(n, "cluster_pending") == 0.0
        })
    }

    /// Series of one metric in every partition, in both forms and three precisions,
    /// pushed to one node of three: every node's answer (its own partitions merged with
    /// the others' partials) is the merge computed here, in its form.
    #[test]
    fn review6_cluster_partials_of_mixed_forms_answer_as_one_merge() {
        let nats = NatsCluster::start(3);
        let dir = TempDir::new("review6-cluster");
        let nodes = [
            node(&dir, &nats, "agg-1"),
            node(&dir, &nats, "agg-2"),
            node(&dir, &nats, "agg-3"),
        ];
        let all: Vec<&InProcessAggregator> = nodes.iter().collect();
        wait_until("three members, each owning part of the partitions", || {
            settled(&all)
        });
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
                    sketch(form, p, start..start + 400 + 300 * shard),
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
                    row(
                        "visitors",
                        &[("p", &p), ("shard", &shard.to_string()), ("ull", ull)],
                        *hour,
                        s,
                    )
                })
                .collect(),
            live_hours: vec![h0, h0 + 1],
        };
        let outcomes = rt.block_on(async {
            let mut c = hourglass_rpc::proto::v1::collector_client::CollectorClient::new(
                channel(&nodes[0].grpc).await,
            );
            loop {
                match c.push(request.clone()).await {
                    Ok(r) => break crate::aggregator::outcomes(&r.into_inner().results),
                    Err(s) if s.code() == tonic::Code::Unavailable => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Err(s) => panic!("push refused: {s}"),
                }
            }
        });
        assert_eq!(outcomes, vec![v1::PushOutcome::Stored; rows.len()]);
        wait_until("every node applied the push", || settled(&all));
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
            let want = union_of(rows.iter().filter(|(s, ..)| pick(*s)).map(|(.., s)| s)).unwrap();
            for (i, n) in nodes.iter().enumerate() {
                let (answer, export) = rt.block_on(async {
                    let mut q = QueryClient::new(channel(&n.grpc).await);
                    let mut sel = selector("visitors", h0..h0 + 2).unwrap();
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
                    expected(&want.estimate()),
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
}
