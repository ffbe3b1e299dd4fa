//! Set questions over stored rows: `Query/Overlap` and `Query/Retention` answer exactly
//! what the sketch library's joint estimate gives for the same items (the aggregator adds
//! selection, merging and coverage, never its own arithmetic), the truth lies in their 95%
//! intervals, an overlap too small to tell from zero says so, errors name the selection at
//! fault, and the HTTP API and `hourglass query overlap | retention --json` carry the
//! gRPC answer. An agent may push any sketch the format accepts, a fully saturated one
//! too: the HTTP API, `hourglass query overlap --json` and its text still say something
//! true and well-formed about it.

use hourglass_rpc::proto::v1;
use hourglass_rpc::time::hour_start;
use hourglass_sketch::Estimate;
use hourglass_sketch::hll::Hll;
use hourglass_sketch::overlap::{Verdict, estimate_pair};
use serde_json::Value;

use crate::aggregator::{clients, outcomes, push, server};
use crate::util::{
    AggregatorAddrs, InProcessAggregator, TempDir, hourglass, http_request, snapshot, this_hour,
};

/// The users of day `d`: a cohort of 20,000 on day 0, of whom 6,000 come back on day 1
/// and 2,000 on day 2, beside 10,000 and 5,000 new ones.
fn day_users(d: u32) -> Vec<u32> {
    match d {
        0 => (0..20_000).collect(),
        1 => (0..6_000).chain(100_000..110_000).collect(),
        _ => (0..2_000).chain(100_000..105_000).collect(),
    }
}

/// Which users each server sees: web-1 those not divisible by 3,
/// api-1 those not 1 mod 3; both see 2 mod 3, so together they see every user.
fn seen_by(server: &str, user: u32) -> bool {
    match server {
        "web-1" => !user.is_multiple_of(3),
        _ => user % 3 != 1,
    }
}

fn sketch_of(users: impl Iterator<Item = u32>) -> Hll {
    let mut hll = Hll::new(14).expect("precision 14");
    for u in users {
        hll.insert(format!("user{u}").as_bytes());
    }
    hll
}

/// Pushes three days of `visitors` from web-1 and api-1, and `others` (users nobody else
/// has) on day 0. Returns the first hour (a UTC midnight three days ago or more).
async fn stock(agg: &InProcessAggregator) -> u32 {
    let (mut collector, _) = clients(agg).await;
    let base = (this_hour() / 24 - 4) * 24;
    for name in ["web-1", "api-1"] {
        let mut snapshots = Vec::new();
        let mut live = Vec::new();
        for d in 0..3 {
            let hour = base + d * 24 + if name == "web-1" { 3 } else { 7 };
            let users = day_users(d).into_iter().filter(|u| seen_by(name, *u));
            snapshots.push(snapshot(
                "visitors",
                hour,
                1,
                v1::SketchKind::Distinct,
                sketch_of(users).encode(),
            ));
            live.push(hour);
        }
        if name == "web-1" {
            snapshots.push(snapshot(
                "others",
                base + 3,
                1,
                v1::SketchKind::Distinct,
                sketch_of(500_000..520_000).encode(),
            ));
        }
        let region = if name == "web-1" { "eu" } else { "us" };
        let r = push(
            &mut collector,
            server(name, &[("region", region)]),
            snapshots,
            live,
        )
        .await;
        assert!(
            outcomes(&r).iter().all(|o| *o == v1::PushOutcome::Stored),
            "{r:?}"
        );
    }
    base
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

fn wire(e: &Estimate) -> v1::DistinctAnswer {
    v1::DistinctAnswer {
        estimate: e.estimate,
        std_error: e.std_error,
        lower95: e.lower95,
        upper95: e.upper95,
    }
}

fn holds(answer: Option<&v1::DistinctAnswer>, truth: f64, what: &str) {
    let a = answer.unwrap_or_else(|| panic!("{what}: no answer"));
    assert!(
        a.lower95 <= truth && truth <= a.upper95,
        "{what}: the truth {truth} is outside {a:?}"
    );
}

#[tokio::test]
async fn overlap_is_the_joint_estimate_of_the_two_selections_and_holds_the_truth() {
    let dir = TempDir::new("sets-overlap");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let base = stock(&agg).await;
    let (_, mut query) = clients(&agg).await;
    let day0 = base..base + 24;

    // A: what web-1 saw on day 0; B: what api-1 saw. Both saw the users 2 mod 3.
    let a = selector("visitors", day0.clone(), &["web-*"]);
    let b = selector("visitors", day0.clone(), &["api-*"]);
    let r = query
        .overlap(v1::OverlapRequest {
            a: Some(a.clone()),
            b: Some(b.clone()),
        })
        .await
        .expect("overlap")
        .into_inner();
    let answer = r.answer.expect("an answer");
    let local_a = sketch_of(day_users(0).into_iter().filter(|u| seen_by("web-1", *u)));
    let local_b = sketch_of(day_users(0).into_iter().filter(|u| seen_by("api-1", *u)));
    let joint = estimate_pair(&local_a, &local_b).expect("same precision");
    assert_eq!(answer.union, Some(wire(&joint.union)));
    assert_eq!(answer.intersection, Some(wire(&joint.intersection)));
    assert_eq!(answer.only_a, Some(wire(&joint.only_a)));
    assert_eq!(answer.only_b, Some(wire(&joint.only_b)));
    assert_eq!(answer.jaccard, Some(wire(&joint.jaccard)));
    assert_eq!(answer.retained, Some(wire(&joint.retained)));
    assert_eq!(answer.a, Some(wire(&local_a.estimate())));
    assert_eq!(answer.b, Some(wire(&local_b.estimate())));
    assert_eq!(answer.verdict(), v1::OverlapVerdict::Estimable);
    let both = (0..20_000u32).filter(|u| u % 3 == 2).count() as f64;
    holds(answer.union.as_ref(), 20_000.0, "union");
    holds(answer.intersection.as_ref(), both, "intersection");
    holds(answer.only_a.as_ref(), 13_334.0 - both, "A only");
    holds(answer.jaccard.as_ref(), both / 20_000.0, "Jaccard");
    holds(answer.retained.as_ref(), both / 13_334.0, "retained");
    // Hourly rows or a day's rollup (the background may have built it): the same registers.
    assert!(r.coverage_a.expect("A's coverage").sketches_merged >= 1);
    assert!(r.coverage_b.expect("B's coverage").sketches_merged >= 1);

    // Monday and Tuesday: every server, day 0 against day 1; 6,000 came back.
    let r = query
        .overlap(v1::OverlapRequest {
            a: Some(selector("visitors", day0.clone(), &[])),
            b: Some(selector("visitors", base + 24..base + 48, &[])),
        })
        .await
        .expect("overlap of two days")
        .into_inner();
    let answer = r.answer.expect("an answer");
    holds(answer.intersection.as_ref(), 6_000.0, "day 0 ∩ day 1");
    holds(answer.retained.as_ref(), 0.3, "day 0's share back on day 1");
    assert!(r.coverage_a.expect("coverage").sketches_merged >= 1);

    // Sets that share nothing: the overlap is too small to tell from zero, and says so.
    let r = query
        .overlap(v1::OverlapRequest {
            a: Some(selector("visitors", day0.clone(), &[])),
            b: Some(selector("others", day0.clone(), &[])),
        })
        .await
        .expect("overlap of disjoint sets")
        .into_inner();
    let answer = r.answer.expect("an answer");
    assert_eq!(answer.verdict(), v1::OverlapVerdict::TooSmall, "{answer:?}");
    assert_eq!(answer.intersection.expect("intersection").lower95, 0.0);

    // Errors name the selection at fault; a grouped selection is refused.
    let e = query
        .overlap(v1::OverlapRequest {
            a: Some(a.clone()),
            b: Some(selector("nosuchmetric", day0.clone(), &[])),
        })
        .await
        .expect_err("an unknown metric in B");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(e.message().starts_with("b"), "{}", e.message());
    let mut grouped = a.clone();
    grouped.group_by = v1::GroupBy::Day as i32;
    let e = query
        .overlap(v1::OverlapRequest {
            a: Some(grouped),
            b: Some(b.clone()),
        })
        .await
        .expect_err("a grouped selection");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("a.group_by"), "{}", e.message());
    let e = query
        .overlap(v1::OverlapRequest {
            a: None,
            b: Some(b.clone()),
        })
        .await
        .expect_err("no selection A");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("a"), "{}", e.message());

    // The HTTP API: the same answer, field for field.
    let from = hour_start(day0.start).to_rfc3339();
    let to = hour_start(day0.end).to_rfc3339();
    let query_string = format!(
        "metric=visitors&from={}&to={}&server=web-*&vs_server=api-*",
        encode(&from),
        encode(&to)
    );
    let got = get_json(&agg, &format!("/api/v1/overlap?{query_string}"));
    assert_eq!(got["answer"]["verdict"], "estimable");
    assert_eq!(
        got["answer"]["intersection"]["estimate"].as_f64(),
        Some(joint.intersection.estimate)
    );
    assert_eq!(
        got["answer"]["union"]["upper95"].as_f64(),
        Some(joint.union.upper95)
    );
    assert!(got["a"]["coverage"]["sketches_merged"].as_u64() >= Some(1));
    assert_eq!(got["b"]["range"]["start_hour"], day0.start);
    let refused = http_request(
        "GET",
        &format!("{}/api/v1/overlap?metric=visitors&server=web-*", agg.http()),
        &[],
        None,
    )
    .expect("HTTP GET");
    assert_eq!(refused.status, 400);
    assert!(String::from_utf8_lossy(&refused.body).contains("vs_"));

    // The command: the same answer in --json, and text that names each region.
    let run = hourglass(
        &[
            "query",
            "overlap",
            "--aggregator",
            agg.grpc(),
            "--metric",
            "visitors",
            "--from",
            &from,
            "--to",
            &to,
            "--server",
            "web-*",
            "--vs-server",
            "api-*",
            "--json",
        ],
        b"",
    );
    let json = run.ok().json();
    assert_eq!(
        json["intersection"]["estimate"].as_f64(),
        Some(joint.intersection.estimate)
    );
    assert_eq!(json["verdict"], "estimable");
    assert!(json["a"]["sketches_merged"].as_u64() >= Some(1));
    let text = hourglass(
        &[
            "query",
            "overlap",
            "--aggregator",
            agg.grpc(),
            "--metric",
            "visitors",
            "--from",
            &from,
            "--to",
            &to,
            "--vs-metric",
            "others",
        ],
        b"",
    );
    let text = String::from_utf8_lossy(&text.ok().stdout).into_owned();
    assert!(text.contains("A ∩ B"), "{text}");
    assert!(text.contains("too small"), "{text}");
    agg.stop().await;
}

#[tokio::test]
async fn retention_compares_each_period_with_every_later_one() {
    let dir = TempDir::new("sets-retention");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let base = stock(&agg).await;
    let (_, mut query) = clients(&agg).await;

    let r = query
        .retention(v1::RetentionRequest {
            selector: Some(selector("visitors", base..base + 72, &[])),
            period_hours: 24,
        })
        .await
        .expect("retention")
        .into_inner();
    assert_eq!(r.periods.len(), 3);
    assert_eq!(r.rows.len(), 2, "day 2 has no later day");
    let days: Vec<Hll> = (0..3)
        .map(|d| sketch_of(day_users(d).into_iter()))
        .collect();
    for (d, period) in r.periods.iter().enumerate() {
        assert_eq!(period.start_hour, base + 24 * d as u32);
        assert_eq!(period.end_hour, base + 24 * (d as u32 + 1));
        assert_eq!(period.distinct, Some(wire(&days[d].estimate())));
        assert!(period.coverage.as_ref().expect("coverage").sketches_merged >= 1);
    }
    let truth = |cohort: usize, later: usize| -> f64 {
        match (cohort, later) {
            (0, 1) => 6_000.0,
            (0, 2) => 2_000.0,
            // Day 1 and day 2 share 2,000 of the cohort and 5,000 of day 1's new users.
            _ => 7_000.0,
        }
    };
    for row in &r.rows {
        let cohort = row.cohort as usize;
        assert_eq!(row.cells.len(), 2 - cohort);
        for cell in &row.cells {
            let later = cell.period as usize;
            assert!(later > cohort);
            let joint = estimate_pair(&days[cohort], &days[later]).expect("same precision");
            assert_eq!(cell.returned, Some(wire(&joint.intersection)));
            assert_eq!(cell.share, Some(wire(&joint.retained)));
            assert_eq!(joint.verdict, Verdict::Estimable);
            assert_eq!(cell.verdict(), v1::OverlapVerdict::Estimable);
            let returned = truth(cohort, later);
            let size = day_users(cohort as u32).len() as f64;
            holds(cell.returned.as_ref(), returned, "returned");
            holds(cell.share.as_ref(), returned / size, "share");
        }
    }

    // A last period shorter than the others, and the bounds on the periods.
    let r = query
        .retention(v1::RetentionRequest {
            selector: Some(selector("visitors", base..base + 60, &[])),
            period_hours: 24,
        })
        .await
        .expect("retention with a short last period")
        .into_inner();
    assert_eq!(r.periods.last().expect("periods").end_hour, base + 60);
    for (hours, period, expected) in [
        (24, 24, "holds one period"),
        (72, 0, "period_hours must be at least 1"),
        (72, 1, "more than 53"),
    ] {
        let e = query
            .retention(v1::RetentionRequest {
                selector: Some(selector("visitors", base..base + hours, &[])),
                period_hours: period,
            })
            .await
            .expect_err(expected);
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains(expected), "{}", e.message());
    }

    // The HTTP API and the command carry the same table.
    let from = hour_start(base).to_rfc3339();
    let to = hour_start(base + 72).to_rfc3339();
    let got = get_json(
        &agg,
        &format!(
            "/api/v1/retention?metric=visitors&from={}&to={}&period=day",
            encode(&from),
            encode(&to)
        ),
    );
    assert_eq!(got["period_hours"], 24);
    assert_eq!(got["periods"].as_array().map(Vec::len), Some(3));
    let joint = estimate_pair(&days[0], &days[1]).expect("same precision");
    assert_eq!(
        got["rows"][0]["cells"][0]["share"]["estimate"].as_f64(),
        Some(joint.retained.estimate)
    );
    assert_eq!(got["rows"][0]["cells"][0]["verdict"], "estimable");
    let args = [
        "query",
        "retention",
        "--aggregator",
        agg.grpc(),
        "--metric",
        "visitors",
        "--from",
        &from,
        "--to",
        &to,
        "--period",
        "day",
    ];
    let json = hourglass(&[&args[..], &["--json"]].concat(), b"")
        .ok()
        .json();
    assert_eq!(
        json["rows"][0]["cells"][0]["returned"]["estimate"].as_f64(),
        Some(joint.intersection.estimate)
    );
    let text = String::from_utf8_lossy(&hourglass(&args, b"").ok().stdout).into_owned();
    assert!(text.contains("cohort"), "{text}");
    assert!(text.contains("+2"), "{text}");
    agg.stop().await;
}

/// Percent-encodes the characters of an RFC 3339 time a query string cannot carry.
fn encode(text: &str) -> String {
    text.replace('+', "%2B").replace(':', "%3A")
}

fn get_json(agg: &InProcessAggregator, path: &str) -> Value {
    let reply = http_request("GET", &format!("{}{path}", agg.http()), &[], None).expect("HTTP GET");
    let body = String::from_utf8_lossy(&reply.body).into_owned();
    assert_eq!(reply.status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body}"))
}

// ---- An empty side ----

/// Set questions over ULL rows where one side selects nothing: the empty side is the
/// empty set, and neither |A|, the union, the intersection nor a retention cell may
/// depend on the sketch the aggregator stands in for it with (an empty ULL at p = 18).
#[tokio::test]
async fn set_questions_with_an_empty_side_answer_for_the_empty_set() {
    use crate::ull::{
        distinct, estimate_figures as expected, figures, row, sketch_at, union_if_any,
    };
    use hourglass_sketch::distinct::{Distinct, DistinctForm};
    let dir = TempDir::new("sets-empty-side");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let (mut collector, mut query) = clients(&agg).await;
    let h0 = this_hour() - 10;
    // visitors: ULL 13 rows, dense and sparse; h0+2..h0+4 and h0+6..h0+8 hold nothing.
    let rows = [
        (h0, sketch_at(DistinctForm::Ull, 13, 0..6000)),
        (h0 + 1, sketch_at(DistinctForm::Ull, 13, 5000..5300)),
        (h0 + 4, sketch_at(DistinctForm::Ull, 13, 100..1900)),
        (h0 + 5, sketch_at(DistinctForm::Hll, 14, 1800..2000)),
    ];
    let r = push(
        &mut collector,
        server("web-1", &[]),
        rows.iter().map(|(h, s)| row(*h, s)).collect(),
        (h0..h0 + 8).collect(),
    )
    .await;
    assert_eq!(outcomes(&r), vec![v1::PushOutcome::Stored; rows.len()]);
    let of = |hours: std::ops::Range<u32>| {
        union_if_any(
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
                a: Some(selector("visitors", a_hours.clone(), &[])),
                b: Some(selector("visitors", b_hours.clone(), &[])),
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
        let joint = estimate_pair(&a_hll, &b_hll).expect("joint");
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
        let d = distinct(&mut query, one, &[]).await;
        let side = if a.is_some() { &answer.a } else { &answer.b };
        assert_eq!(figures(side.as_ref().unwrap()), figures(&d), "{what}");
    }
    // Retention over two-hour periods: [ULL], [nothing], [ULL ∪ HLL], [nothing].
    let retention = query
        .retention(v1::RetentionRequest {
            selector: Some(selector("visitors", h0..h0 + 8, &[])),
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
            let joint = estimate_pair(&hlls[row.cohort as usize], &hlls[cell.period as usize])
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

// ---- A saturated side ----

/// Every register at its largest value (valid in the format).
fn saturated(precision: u8) -> Hll {
    let mut h = Hll::new(precision).expect("precision");
    for index in 0..1u64 << precision {
        h.insert_hash(index << (64 - precision));
    }
    h
}

/// web-1 pushes a saturated sketch, api-1 one of 50,000 users, both at `hour`.
async fn stock_saturated(agg: &InProcessAggregator, hour: u32) {
    let (mut collector, _) = clients(agg).await;
    for (name, sketch) in [("web-1", saturated(14)), ("api-1", sketch_of(0..50_000))] {
        let r = push(
            &mut collector,
            server(name, &[]),
            vec![snapshot(
                "visitors",
                hour,
                1,
                v1::SketchKind::Distinct,
                sketch.encode(),
            )],
            vec![hour],
        )
        .await;
        assert!(
            outcomes(&r).iter().all(|o| *o == v1::PushOutcome::Stored),
            "{name}: {r:?}"
        );
    }
}

/// The paths of every JSON value under `v` that is not a number where the OpenAPI document
/// promises one (`DistinctAnswer` fields, `naive_intersection`).
fn non_numbers(v: &Value, path: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let p = format!("{path}.{k}");
                if [
                    "estimate",
                    "std_error",
                    "lower95",
                    "upper95",
                    "naive_intersection",
                ]
                .contains(&k.as_str())
                    && !child.is_number()
                {
                    out.push(format!("{p} = {child}"));
                }
                non_numbers(child, &p, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                non_numbers(child, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// `/api/v1/overlap` over a saturated side: its schema says every figure is a number, but
/// serde_json writes an infinite upper95 / std_error and a NaN naive_intersection as
/// `null`.
#[tokio::test]
async fn http_overlap_of_a_saturated_side_keeps_numbers() {
    let dir = TempDir::new("sets-saturated-http");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let hour = this_hour() - 1;
    stock_saturated(&agg, hour).await;
    let (from, to) = (
        hour_start(hour).to_rfc3339(),
        hour_start(hour + 1).to_rfc3339(),
    );
    let path = format!(
        "/api/v1/overlap?metric=visitors&from={}&to={}&server=web-*&vs_server=api-*",
        encode(&from),
        encode(&to)
    );
    let reply = http_request("GET", &format!("{}{path}", agg.http()), &[], None).expect("GET");
    let body = String::from_utf8_lossy(&reply.body).into_owned();
    assert_eq!(reply.status, 200, "{body}");
    let json: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(json["answer"]["verdict"], "saturated", "{body}");
    let mut bad = Vec::new();
    non_numbers(&json, "", &mut bad);
    assert!(
        bad.is_empty(),
        "not numbers, though openapi.json says number: {bad:?}\n{body}"
    );
    agg.stop().await;
}

/// `hourglass query overlap` over a saturated side: the text must not print an upper
/// bound of 0 below a positive estimate (inf goes through a JSON Value, becomes null,
/// then 0), and `--json` keeps numbers.
#[tokio::test]
async fn cli_overlap_of_a_saturated_side_says_true_bounds() {
    let dir = TempDir::new("sets-saturated-cli");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let hour = this_hour() - 1;
    stock_saturated(&agg, hour).await;
    let (from, to) = (
        hour_start(hour).to_rfc3339(),
        hour_start(hour + 1).to_rfc3339(),
    );
    let args = [
        "query",
        "overlap",
        "--aggregator",
        agg.grpc(),
        "--metric",
        "visitors",
        "--from",
        &from,
        "--to",
        &to,
        "--server",
        "web-*",
        "--vs-server",
        "api-*",
    ];
    let text = String::from_utf8_lossy(&hourglass(&args, b"").ok().stdout).into_owned();
    assert!(text.contains("saturated"), "{text}");
    let union = text
        .lines()
        .find(|l| l.trim_start().starts_with("A ∪ B"))
        .unwrap_or_else(|| panic!("no union line: {text}"));
    assert!(
        !union.trim_end().ends_with("– 0)"),
        "the union's upper bound prints as 0 (an infinite upper95 read back from JSON null): {union:?}\n{text}"
    );
    let json = hourglass(&[&args[..], &["--json"]].concat(), b"")
        .ok()
        .json();
    let mut bad = Vec::new();
    non_numbers(&json, "", &mut bad);
    assert!(bad.is_empty(), "--json has null figures: {bad:?}\n{json}");
    agg.stop().await;
}
