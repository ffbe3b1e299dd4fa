//! The aggregator's HTTP/JSON API against its gRPC `Query` service: every route's JSON is
//! the gRPC answer of the same question (numbers identical), hour and day groups come in
//! time order, failures carry the gRPC message with the HTTP status of its code, and the
//! port has the gRPC port's TLS, client certificates and tokens, or is not there at all
//! with `--http-listen off`. SIGTERM stops the aggregator process whatever an HTTP client
//! of its HTTP or admin port does (the unit-level tests of the port and the dashboard are
//! in `aggregator/src/http/`).

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;

use hourglass_rpc::proto::v1::{self, query_client::QueryClient};
use hourglass_rpc::time::{format_hour, hour_start};
use hourglass_sketch::bloom::Bloom;
use hourglass_sketch::frequency::{Frequency, FrequencyParams};
use hourglass_sketch::hll::Hll;
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::aggregator::{clients, outcomes, push, server, tag};
use crate::util::{
    AggregatorAddrs, AggregatorProcess, HttpReply, InProcessAggregator, TempDir, http_request,
    snapshot, this_hour,
};

/// `GET` of `path_and_query` on `http` (a URL), plain.
fn get(http: &str, path_and_query: &str) -> HttpReply {
    http_request("GET", &format!("{http}{path_and_query}"), &[], None).expect("HTTP GET")
}

/// A snapshot of `metric` with `tags` at `hour`.
fn tagged(
    metric: &str,
    tags: &[(&str, &str)],
    hour: u32,
    kind: v1::SketchKind,
    data: Vec<u8>,
) -> v1::Snapshot {
    let mut s = snapshot(metric, hour, 1, kind, data);
    s.series.as_mut().expect("a series").tags = tags.iter().map(|(k, v)| tag(k, v)).collect();
    s
}

fn hll(items: &[&str]) -> Vec<u8> {
    let mut hll = Hll::new(14).expect("precision 14");
    for item in items {
        hll.insert(item.as_bytes());
    }
    hll.encode()
}

fn counts(items: &[(&[u8], u64)]) -> Vec<u8> {
    let mut f = Frequency::new(FrequencyParams::default()).expect("frequency sketch");
    for (item, n) in items {
        f.insert_weighted(item, *n).expect("insert");
    }
    f.encode()
}

/// A non-UTF-8 item, and its base64.
const BINARY: &[u8] = b"\xff\xfe";
const BINARY_BASE64: &str = "//4=";

/// Pushes, over gRPC, a day and a bit of data: `visitors` (distinct, tagged by device)
/// from web-1 (eu) and web-2 (us), `pages` (frequency, with a non-UTF-8 item among the
/// heaviest) and `users` (membership). Returns its first hour; the data spans 29 hours.
async fn stock(agg: &InProcessAggregator) -> u32 {
    let (mut collector, _) = clients(agg).await;
    let base = this_hour() - 30;
    let distinct = v1::SketchKind::Distinct;
    let web1 = vec![
        tagged(
            "visitors",
            &[("device", "mobile")],
            base,
            distinct,
            hll(&["a", "b", "c"]),
        ),
        tagged(
            "visitors",
            &[("device", "mobile")],
            base + 1,
            distinct,
            hll(&["a", "d"]),
        ),
        tagged(
            "visitors",
            &[("device", "mobile")],
            base + 28,
            distinct,
            hll(&["e", "f"]),
        ),
        tagged(
            "visitors",
            &[("device", "desktop")],
            base + 28,
            distinct,
            hll(&["a", "g", "h"]),
        ),
        snapshot(
            "pages",
            base + 28,
            1,
            v1::SketchKind::Frequency,
            counts(&[(b"/cart", 50), (b"/home", 20), (BINARY, 30)]),
        ),
        snapshot("users", base, 1, v1::SketchKind::Membership, {
            let mut bloom = Bloom::new(1000, 0.01).expect("bloom");
            for i in 1..=100 {
                bloom.insert(format!("user{i}").as_bytes());
            }
            bloom.encode()
        }),
    ];
    let r = push(
        &mut collector,
        server("web-1", &[("region", "eu")]),
        web1,
        vec![base, base + 1, base + 28],
    )
    .await;
    assert!(
        outcomes(&r).iter().all(|o| *o == v1::PushOutcome::Stored),
        "{r:?}"
    );
    let web2 = vec![
        tagged(
            "visitors",
            &[("device", "mobile")],
            base + 1,
            distinct,
            hll(&["b", "x"]),
        ),
        tagged(
            "visitors",
            &[("device", "mobile")],
            base + 28,
            distinct,
            hll(&["y"]),
        ),
        snapshot(
            "pages",
            base + 1,
            1,
            v1::SketchKind::Frequency,
            counts(&[(b"/cart", 10)]),
        ),
    ];
    let r = push(
        &mut collector,
        server("web-2", &[("region", "us")]),
        web2,
        vec![base + 1, base + 28],
    )
    .await;
    assert!(
        outcomes(&r).iter().all(|o| *o == v1::PushOutcome::Stored),
        "{r:?}"
    );
    base
}

/// The query string of a selection and the same selection as gRPC's selector.
struct Asked {
    query: String,
    selector: v1::Selector,
}

/// `metric` over hours `[start, end)`, grouped by `group_by` (`""`: not grouped), with
/// `extra` query-string parameters and the selector fields they stand for.
fn asked(
    metric: &str,
    hours: std::ops::Range<u32>,
    group_by: &str,
    extra: &str,
    edit: impl Fn(&mut v1::Selector),
) -> Asked {
    let mut query = format!(
        "metric={metric}&from={}&to={}",
        hour_start(hours.start).to_rfc3339(),
        hour_start(hours.end).to_rfc3339()
    )
    .replace('+', "%2B");
    let (grouping, group_tag) = match group_by {
        "" => (v1::GroupBy::None, ""),
        "server" => (v1::GroupBy::Server, ""),
        "hour" => (v1::GroupBy::Hour, ""),
        "day" => (v1::GroupBy::Day, ""),
        tag => (v1::GroupBy::Tag, tag.strip_prefix("tag:").expect("tag:KEY")),
    };
    if !group_by.is_empty() {
        query += &format!("&group_by={group_by}");
    }
    query += extra;
    let mut selector = v1::Selector {
        metric: metric.into(),
        range: Some(v1::TimeRange {
            start_hour: hours.start,
            end_hour: hours.end,
        }),
        group_by: grouping as i32,
        group_tag: group_tag.into(),
        ..Default::default()
    };
    edit(&mut selector);
    Asked { query, selector }
}

// What the API's JSON must be, written from the gRPC reply here, independently of the
// aggregator's own translation.

fn coverage(c: Option<&v1::Coverage>) -> Value {
    let c = c.cloned().unwrap_or_default();
    json!({
        "sketches_merged": c.sketches_merged,
        "server_hours_missing": c.server_hours_missing,
        "missing": c.missing.iter().map(|m| json!({"server": m.server, "hours": m.hours})).collect::<Vec<_>>(),
        "partitions_missing": c.partitions_missing,
        "missing_partitions": c.missing_partitions,
    })
}

/// `"item"` with the text, or `"item_base64"` for [`BINARY`].
fn put_item(v: &mut Value, item: &[u8]) {
    match std::str::from_utf8(item) {
        Ok(text) => v["item"] = json!(text),
        Err(_) => {
            assert_eq!(item, BINARY, "the one non-UTF-8 item of these tests");
            v["item_base64"] = json!(BINARY_BASE64);
        }
    }
}

fn top_items(items: &[v1::TopItem]) -> Value {
    items
        .iter()
        .map(|t| {
            let mut v = json!({"estimate": t.estimate, "lower": t.lower, "upper": t.upper});
            put_item(&mut v, &t.item);
            v
        })
        .collect()
}

fn distinct_answer(a: Option<&v1::DistinctAnswer>) -> Value {
    let a = a.cloned().unwrap_or_default();
    json!({"estimate": a.estimate, "std_error": a.std_error, "lower95": a.lower95, "upper95": a.upper95})
}

fn frequency_answer(a: Option<&v1::FrequencyAnswer>) -> Value {
    let a = a.cloned().unwrap_or_default();
    json!({"estimate": a.estimate, "max_overcount": a.max_overcount, "total": a.total})
}

fn membership_answer(a: Option<&v1::MembershipAnswer>) -> Value {
    let a = a.cloned().unwrap_or_default();
    json!({
        "maybe_present": a.maybe_present,
        "definitely_absent": a.definitely_absent,
        "filters_consulted": a.filters_consulted,
        "range_fpr": a.range_fpr,
        "all_false_probability": a.all_false_probability,
        "saturated_filters": a.saturated_filters,
        "seen_in": a.seen_in.iter().map(|s| json!({
            "server": s.server,
            "from": hourglass_rpc::time::rfc3339_hour(s.start_hour),
            "start_hour": s.start_hour,
            "hours": s.hours,
            "fpr": s.fpr,
        })).collect::<Vec<_>>(),
        "seen_in_count": a.seen_in_count,
        "fill_ratio": a.fill_ratio,
        "estimated_fpr": a.estimated_fpr,
        "past_design_point": a.past_design_point,
    })
}

/// A group: its key, `time` for hour (`2026-11-23T14:00Z`) and day (`2026-11-23`) keys,
/// `field` (`answer` or `items`) and its coverage.
fn group(grouping: i32, key: &str, field: &str, answer: Value, c: Option<&v1::Coverage>) -> Value {
    let mut v = json!({"key": key, field: answer, "coverage": coverage(c)});
    if grouping == v1::GroupBy::Hour as i32 {
        v["time"] = json!(format!(
            "{}:00Z",
            key.strip_suffix('Z').expect("an hour key")
        ));
    } else if grouping == v1::GroupBy::Day as i32 {
        v["time"] = json!(format!("{key}T00:00:00Z"));
    }
    v
}

/// The whole answer to `selector`: the envelope every answer shares, `field` (`answer`
/// or `items`) holding `answer`, the coverage, and `groups`, each taken apart by `part`
/// into its key, answer and coverage.
fn expected<G>(
    selector: &v1::Selector,
    field: &str,
    answer: Value,
    c: Option<&v1::Coverage>,
    groups: &[G],
    part: impl Fn(&G) -> (&str, Value, Option<&v1::Coverage>),
) -> Value {
    let range = selector.range.expect("a range");
    let groups: Vec<Value> = groups
        .iter()
        .map(|g| {
            let (key, answer, c) = part(g);
            group(selector.group_by, key, field, answer, c)
        })
        .collect();
    json!({
        "metric": selector.metric,
        "range": {
            "from": hour_start(range.start_hour).to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "to": hour_start(range.end_hour).to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "start_hour": range.start_hour,
            "end_hour": range.end_hour,
        },
        field: answer,
        "coverage": coverage(c),
        "groups": groups,
    })
}

/// Asserts that the API's answer at `path?query` is `expected`: the same JSON, numbers
/// identical (serde_json's float_roundtrip reads back the very double written).
fn assert_answers(http: &str, path: &str, query: &str, expected: Value) -> Value {
    let reply = get(http, &format!("{path}?{query}"));
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let got = reply.json();
    assert_eq!(reply.status, 200, "{path}?{query}: {got}");
    assert_eq!(got, expected, "{path}?{query}");
    got
}

/// Asserts that hour or day groups are in time order, one per hour or day of the range.
fn assert_timed(answer: &Value, step_hours: i64) {
    let times: Vec<chrono::DateTime<chrono::Utc>> = answer["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| {
            chrono::DateTime::parse_from_rfc3339(g["time"].as_str().expect("a time"))
                .expect("RFC 3339")
                .to_utc()
        })
        .collect();
    assert!(times.len() >= 2, "{answer}");
    for pair in times.windows(2) {
        if step_hours == 1 {
            assert_eq!((pair[1] - pair[0]).num_hours(), 1, "{answer}");
        } else {
            assert_eq!((pair[1] - pair[0]).num_hours(), 24, "{answer}");
        }
    }
    let start = chrono::DateTime::parse_from_rfc3339(answer["range"]["from"].as_str().unwrap())
        .unwrap()
        .to_utc();
    assert!(times[0] <= start && start - times[0] < chrono::TimeDelta::hours(step_hours));
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_answers_what_grpc_answers() {
    let dir = TempDir::new("http-answers");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let base = stock(&agg).await;
    let hours = base..base + 29;
    let (_, mut query) = clients(&agg).await;
    let http = agg.http().to_string();

    // distinct, every grouping, and the filters.
    let filtered = |s: &mut v1::Selector| {
        s.tags = vec![tag("device", "mobile")];
        s.servers = vec!["web-*".into()];
        s.labels = vec![tag("region", "eu")];
    };
    let questions = [
        asked("visitors", hours.clone(), "", "", |_| {}),
        asked("visitors", hours.clone(), "server", "", |_| {}),
        asked("visitors", hours.clone(), "hour", "", |_| {}),
        asked("visitors", hours.clone(), "day", "", |_| {}),
        asked("visitors", hours.clone(), "tag:device", "", |_| {}),
        asked(
            "visitors",
            hours.clone(),
            "day",
            "&tag=device%3Dmobile&server=web-*&label=region=eu",
            filtered,
        ),
    ];
    for a in &questions {
        let r = query
            .distinct(v1::DistinctRequest {
                selector: Some(a.selector.clone()),
            })
            .await
            .expect("gRPC distinct")
            .into_inner();
        let answer = distinct_answer(r.answer.as_ref());
        let expected = expected(
            &a.selector,
            "answer",
            answer,
            r.coverage.as_ref(),
            &r.groups,
            |g| {
                (
                    &g.key,
                    distinct_answer(g.answer.as_ref()),
                    g.coverage.as_ref(),
                )
            },
        );
        let got = assert_answers(&http, "/api/v1/distinct", &a.query, expected);
        match v1::GroupBy::try_from(a.selector.group_by) {
            Ok(v1::GroupBy::Hour) => {
                assert_eq!(got["groups"].as_array().unwrap().len(), 29, "one per hour");
                assert_timed(&got, 1);
            }
            Ok(v1::GroupBy::Day) => assert_timed(&got, 24),
            _ => {}
        }
    }
    // The whole: 8 distinct visitors (a b c d e f g h) and web-2's b x y.
    let whole = get(&http, &format!("/api/v1/distinct?{}", questions[0].query)).json();
    assert_eq!(
        whole["answer"]["estimate"].as_f64().map(f64::round),
        Some(10.0)
    );
    let eu_mobile = get(&http, &format!("/api/v1/distinct?{}", questions[5].query)).json();
    assert_eq!(
        eu_mobile["answer"]["estimate"].as_f64().map(f64::round),
        Some(6.0),
        "{eu_mobile}"
    );

    // frequency and topk, with the non-UTF-8 item.
    for (item, escaped, group_by) in [
        (&b"/cart"[..], "%2Fcart", ""),
        (&b"/cart"[..], "/cart", "day"),
        (BINARY, "%FF%FE", "server"),
        (&b""[..], "", ""),
    ] {
        let a = asked(
            "pages",
            hours.clone(),
            group_by,
            &format!("&item={escaped}"),
            |_| {},
        );
        let r = query
            .frequency(v1::FrequencyRequest {
                selector: Some(a.selector.clone()),
                item: item.to_vec(),
            })
            .await
            .expect("gRPC frequency")
            .into_inner();
        let answer = frequency_answer(r.answer.as_ref());
        let mut expected = expected(
            &a.selector,
            "answer",
            answer,
            r.coverage.as_ref(),
            &r.groups,
            |g| {
                (
                    &g.key,
                    frequency_answer(g.answer.as_ref()),
                    g.coverage.as_ref(),
                )
            },
        );
        put_item(&mut expected, item);
        assert_answers(&http, "/api/v1/frequency", &a.query, expected);
    }
    for (k, group_by) in [(None, ""), (Some(2), "server"), (Some(3), "hour")] {
        let extra = k.map(|k| format!("&k={k}")).unwrap_or_default();
        let a = asked("pages", hours.clone(), group_by, &extra, |_| {});
        let k = k.unwrap_or(10);
        let r = query
            .top_k(v1::TopKRequest {
                selector: Some(a.selector.clone()),
                k,
            })
            .await
            .expect("gRPC topk")
            .into_inner();
        let items = top_items(&r.items);
        let mut expected = expected(
            &a.selector,
            "items",
            items,
            r.coverage.as_ref(),
            &r.groups,
            |g| (&g.key, top_items(&g.items), g.coverage.as_ref()),
        );
        expected["k"] = json!(k);
        let got = assert_answers(&http, "/api/v1/topk", &a.query, expected);
        if group_by.is_empty() {
            // /cart 60, the binary item 30, /home 20.
            assert_eq!(got["items"][0]["item"], "/cart", "{got}");
            assert_eq!(got["items"][1]["item_base64"], BINARY_BASE64, "{got}");
            assert!(got["items"][1].get("item").is_none(), "{got}");
        }
    }

    // membership.
    for (item, group_by, maybe) in [
        ("user5", "", true),
        ("nobody-at-all", "", false),
        ("user5", "day", true),
    ] {
        let a = asked(
            "users",
            hours.clone(),
            group_by,
            &format!("&item={item}"),
            |_| {},
        );
        let r = query
            .membership(v1::MembershipRequest {
                selector: Some(a.selector.clone()),
                item: item.as_bytes().to_vec(),
            })
            .await
            .expect("gRPC membership")
            .into_inner();
        let answer = membership_answer(r.answer.as_ref());
        let mut expected = expected(
            &a.selector,
            "answer",
            answer,
            r.coverage.as_ref(),
            &r.groups,
            |g| {
                (
                    &g.key,
                    membership_answer(g.answer.as_ref()),
                    g.coverage.as_ref(),
                )
            },
        );
        expected["item"] = json!(item);
        let got = assert_answers(&http, "/api/v1/membership", &a.query, expected);
        assert_eq!(got["answer"]["maybe_present"], maybe, "{got}");
    }

    // series and servers.
    for metric in [None, Some("visitors")] {
        let r = query
            .list_series(v1::ListSeriesRequest {
                metric: metric.unwrap_or("").into(),
            })
            .await
            .expect("gRPC series")
            .into_inner();
        let kinds = ["unspecified", "distinct", "frequency", "membership"];
        let expected = json!({"series": r.series.iter().map(|s| {
            let series = s.series.clone().unwrap_or_default();
            json!({
                "metric": series.metric,
                "tags": series.tags.iter().map(|t| (t.key.clone(), json!(t.value))).collect::<serde_json::Map<_, _>>(),
                "kind": kinds[s.kind as usize],
            })
        }).collect::<Vec<_>>()});
        let query_string = metric.map(|m| format!("metric={m}")).unwrap_or_default();
        let got = assert_answers(&http, "/api/v1/series", &query_string, expected);
        let count = got["series"].as_array().unwrap().len();
        assert_eq!(count, if metric.is_some() { 2 } else { 4 }, "{got}");
    }
    let r = query
        .list_servers(v1::ListServersRequest {})
        .await
        .expect("gRPC servers")
        .into_inner();
    let expected = json!({"servers": r.servers.iter().map(|s| json!({
        "name": s.name,
        "labels": s.labels.iter().map(|t| (t.key.clone(), json!(t.value))).collect::<serde_json::Map<_, _>>(),
    })).collect::<Vec<_>>()});
    let got = assert_answers(&http, "/api/v1/servers", "", expected);
    assert_eq!(got["servers"][0]["labels"]["region"], "eu");

    // The defaults: the last 24 hours, as `hourglass query` takes them.
    let got = get(&http, "/api/v1/distinct?metric=visitors").json();
    let end = got["range"]["end_hour"].as_u64().unwrap();
    let now = u64::from(this_hour());
    assert!(end == now + 1 || end == now, "{got}");
    let span = end - got["range"]["start_hour"].as_u64().unwrap();
    assert!(span == 24 || span == 25, "{got}");

    agg.stop().await;
}

/// The API's failure at `path?query`: its status, and its message equals `grpc`'s.
fn assert_refused_as(
    http: &str,
    path: &str,
    query: &str,
    status: u16,
    code: &str,
    grpc: &tonic::Status,
) {
    let reply = get(http, &format!("{path}?{query}"));
    let v = reply.json();
    assert_eq!(reply.status, status, "{path}?{query}: {v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["error"]["message"], grpc.message(), "{path}?{query}");
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_carry_the_grpc_message_and_the_status_of_its_code() {
    let dir = TempDir::new("http-errors");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let base = stock(&agg).await;
    let hours = base..base + 29;
    let (_, mut query) = clients(&agg).await;
    let http = agg.http.clone();

    // An invalid metric name: INVALID_ARGUMENT, 400.
    let a = asked("9lives", hours.clone(), "", "", |_| {});
    let e = query
        .distinct(v1::DistinctRequest {
            selector: Some(a.selector.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_refused_as(
        &http,
        "/api/v1/distinct",
        &a.query,
        400,
        "INVALID_ARGUMENT",
        &e,
    );
    // A metric the aggregator does not hold, and one of another kind: NOT_FOUND, 404.
    let a = asked("nothing", hours.clone(), "", "", |_| {});
    let e = query
        .distinct(v1::DistinctRequest {
            selector: Some(a.selector.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert_refused_as(&http, "/api/v1/distinct", &a.query, 404, "NOT_FOUND", &e);
    let a = asked("visitors", hours.clone(), "", "&item=x", |_| {});
    let e = query
        .membership(v1::MembershipRequest {
            selector: Some(a.selector.clone()),
            item: b"x".to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert_refused_as(&http, "/api/v1/membership", &a.query, 404, "NOT_FOUND", &e);
    // More items than the sketches hold: INVALID_ARGUMENT from the merged sketch.
    let a = asked("pages", hours.clone(), "", "&k=60000", |_| {});
    let e = query
        .top_k(v1::TopKRequest {
            selector: Some(a.selector.clone()),
            k: 60000,
        })
        .await
        .unwrap_err();
    assert_refused_as(&http, "/api/v1/topk", &a.query, 400, "INVALID_ARGUMENT", &e);
    // A query string the API cannot read never reaches the service: 400 all the same.
    for bad in [
        "metric=visitors&colour=red",
        "metric=visitors&from=last-week",
        "metric=visitors&group_by=month",
        "metric=visitors&metric=pages",
    ] {
        let reply = get(&http, &format!("/api/v1/distinct?{bad}"));
        assert_eq!(reply.status, 400, "{bad}");
        assert_eq!(reply.json()["error"]["code"], "INVALID_ARGUMENT", "{bad}");
    }
    let reply = get(&http, "/api/v1/topk?metric=pages&k=many");
    assert_eq!(
        (reply.status, reply.json()["error"]["code"].clone()),
        (400, json!("INVALID_ARGUMENT"))
    );
    // Unknown paths and other methods: JSON too.
    let reply = get(&http, "/api/v1/nothing-here");
    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["error"]["code"], "NOT_FOUND");
    let reply = http_request("DELETE", &format!("{http}/api/v1/servers"), &[], None).unwrap();
    assert_eq!(reply.status, 405);
    assert_eq!(reply.json()["error"]["code"], "UNIMPLEMENTED");
    agg.stop().await;
}

/// A certificate authority for one test, writing PEM files into `dir`.
struct TestCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    fn new(dir: &TempDir) -> TestCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "hourglass http test CA");
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        std::fs::write(dir.file("ca.pem"), issuer.pem()).unwrap();
        TestCa { issuer }
    }

    /// A certificate named `name` (its common name and files) for 127.0.0.1, for a
    /// server or a client; returns the certificate and key as PEM.
    fn issue(&self, dir: &TempDir, name: &str, client: bool) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![if client {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        }];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(dir.file(&format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.file(&format!("{name}.key")), key.serialize_pem()).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A TLS client trusting this CA, presenting `identity` (certificate and key PEM).
    fn client(&self, identity: Option<&(String, String)>) -> Arc<rustls::ClientConfig> {
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.issuer.der().clone()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    vec![
                        rustls_pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).unwrap(),
                    ],
                    rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_port_has_the_grpc_ports_tls_client_certificates_and_tokens() {
    let dir = TempDir::new("http-tls");
    let ca = TestCa::new(&dir);
    ca.issue(&dir, "server", false);
    // A certificate an [auth] entry names (role query), and one no entry names.
    let dashboard = ca.issue(&dir, "dashboard", true);
    let stranger = ca.issue(&dir, "stranger", true);
    let query_token = "http-query-token-0123456789";
    let agent_token = "http-agent-token-0123456789";
    std::fs::write(dir.file("query.token"), query_token).unwrap();
    std::fs::write(dir.file("agent.token"), agent_token).unwrap();
    std::fs::write(
        dir.file("agg.toml"),
        format!(
            "[[auth.tokens]]\nname = \"dashboards\"\nrole = \"query\"\nfile = \"{}\"\n\n[[auth.tokens]]\nname = \"web-agents\"\nrole = \"agent\"\nservers = [\"web-*\"]\nfile = \"{}\"\n\n[[auth.tokens]]\nname = \"dashboard certificate\"\nrole = \"query\"\nclient_cert_cn = \"dashboard\"\n",
            dir.file("query.token"),
            dir.file("agent.token")
        ),
    )
    .unwrap();
    let agg = AggregatorProcess::start(
        &dir.file("agg"),
        &[
            "--tls-cert",
            &dir.file("server.pem"),
            "--tls-key",
            &dir.file("server.key"),
            "--tls-client-ca",
            &dir.file("ca.pem"),
            "--config",
            &dir.file("agg.toml"),
        ],
    );
    let https = agg.http.replacen("http://", "https://", 1);
    let url = |path: &str| format!("{https}{path}");

    // A pushed sketch, and its answer over gRPC (mutual TLS, the query token).
    let grpc = agg.grpc.replacen("http://", "https://", 1);
    let tls = hourglass_rpc::tls::ClientTls {
        ca: Some(dir.file("ca.pem").into()),
        cert: Some(dir.file("stranger.pem").into()),
        key: Some(dir.file("stranger.key").into()),
    };
    let channel: Channel = tls.endpoint(&grpc).unwrap().connect().await.unwrap();
    let bearer = |token: &str| -> tonic::metadata::MetadataValue<tonic::metadata::Ascii> {
        hourglass_rpc::tls::bearer_header(token).unwrap()
    };
    let mut push = tonic::Request::new(crate::util::one_item_push("web-1", "visitors", b"someone"));
    push.metadata_mut()
        .insert("authorization", bearer(agent_token));
    v1::collector_client::CollectorClient::new(channel.clone())
        .push(push)
        .await
        .expect("the agent token pushes");
    let hour = this_hour();
    let selector = v1::Selector {
        metric: "visitors".into(),
        range: Some(v1::TimeRange {
            start_hour: hour,
            end_hour: hour + 1,
        }),
        ..Default::default()
    };
    let mut ask = tonic::Request::new(v1::DistinctRequest {
        selector: Some(selector),
    });
    ask.metadata_mut()
        .insert("authorization", bearer(query_token));
    let over_grpc = QueryClient::new(channel)
        .distinct(ask)
        .await
        .expect("gRPC answers the query token")
        .into_inner();
    let path = format!(
        "/api/v1/distinct?metric=visitors&from={}&to={}",
        format_hour(hour).replace('Z', ":00Z"),
        format_hour(hour + 1).replace('Z', ":00Z")
    );

    // No client certificate: no TLS session, as on the gRPC port; nor plaintext.
    assert!(http_request("GET", &url("/"), &[], Some(ca.client(None))).is_err());
    if let Ok(reply) = http_request("GET", &format!("{}/", agg.http), &[], None) {
        assert_ne!(reply.status, 200, "plaintext on the TLS port");
    }
    // A certificate no entry names: the token decides.
    let stranger_tls = ca.client(Some(&stranger));
    let page = http_request("GET", &url("/"), &[], Some(stranger_tls.clone())).unwrap();
    assert_eq!(
        (page.status, page.header("content-type")),
        (200, Some("text/html; charset=utf-8"))
    );
    let reply = http_request("GET", &url(&path), &[], Some(stranger_tls.clone())).unwrap();
    assert_eq!(
        reply.status,
        401,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
    assert_eq!(reply.json()["error"]["code"], "UNAUTHENTICATED");
    let agent = format!("Bearer {agent_token}");
    let reply = http_request(
        "GET",
        &url(&path),
        &[("Authorization", &agent)],
        Some(stranger_tls.clone()),
    )
    .unwrap();
    assert_eq!(reply.status, 403);
    assert_eq!(reply.json()["error"]["code"], "PERMISSION_DENIED");
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("may not call Query")
    );
    let wrong = "Bearer not-a-token-of-this-aggregator";
    let reply = http_request(
        "GET",
        &url(&path),
        &[("Authorization", wrong)],
        Some(stranger_tls.clone()),
    )
    .unwrap();
    assert_eq!(reply.status, 401);
    let good = format!("Bearer {query_token}");
    let reply = http_request(
        "GET",
        &url(&path),
        &[("Authorization", &good)],
        Some(stranger_tls),
    )
    .unwrap();
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let answer = reply.json();
    let expected = over_grpc.answer.expect("an answer");
    assert_eq!(
        answer["answer"]["estimate"].as_f64(),
        Some(expected.estimate)
    );
    assert_eq!(answer["answer"]["upper95"].as_f64(), Some(expected.upper95));
    // The certificate an entry names stands in for a token.
    let reply = http_request("GET", &url(&path), &[], Some(ca.client(Some(&dashboard)))).unwrap();
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["answer"], answer["answer"]);
    assert!(!agg.logs().contains(query_token), "a token reached the log");
}

/// The TCP ports process `pid` listens on (from /proc: its sockets, and the listening
/// ones among the system's).
fn listening_ports(pid: u32) -> BTreeSet<u16> {
    let mut inodes = BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the process's fds") {
        let Ok(target) = std::fs::read_link(fd.expect("an fd").path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let mut ports = BTreeSet::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT; state 0A is LISTEN; field 9 is the inode.
            if fields.len() > 9 && fields[3] == "0A" && inodes.contains(fields[9]) {
                let port = fields[1].rsplit_once(':').expect("ip:port").1;
                ports.insert(u16::from_str_radix(port, 16).expect("a hex port"));
            }
        }
    }
    ports
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .expect("host:port")
        .1
        .trim_end_matches('/')
        .parse()
        .expect("a port")
}

#[test]
fn http_listen_off_serves_nothing() {
    let dir = TempDir::new("http-off");
    let on = AggregatorProcess::start(&dir.file("on"), &[]);
    let expected: BTreeSet<u16> = [&on.grpc, &on.http, &on.admin.to_string()]
        .into_iter()
        .map(|a| port_of(a))
        .collect();
    assert_eq!(listening_ports(on.pid()), expected, "with the HTTP port");
    assert_eq!(get(&on.http, "/api/v1/servers").status, 200);
    on.terminate();

    let off = AggregatorProcess::start(&dir.file("off"), &["--http-listen", "off"]);
    assert!(off.http.is_empty());
    let expected: BTreeSet<u16> = [port_of(&off.grpc), off.admin.port()].into();
    assert_eq!(listening_ports(off.pid()), expected, "only gRPC and admin");
    assert!(!off.logs().contains("http listening"), "{}", off.logs());
    assert_eq!(off.terminate().code(), Some(0));
}

// ---- SIGTERM with HTTP clients connected ----

/// `host:port` of a `http://host:port` URL.
fn host(url: &str) -> &str {
    url.strip_prefix("http://").expect("an http:// URL")
}

/// Control: an HTTP client connected but silent does not hold SIGTERM.
#[test]
fn sigterm_exits_with_an_idle_http_client() {
    let dir = TempDir::new("http-sigterm-idle");
    let agg = AggregatorProcess::start(&dir.file("agg"), &[]);
    let _idle = std::net::TcpStream::connect(host(&agg.http)).expect("connect");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let status = agg.terminate();
    assert!(status.success(), "{status:?}");
}

/// An HTTP client that sent the first line of a request and then nothing (a slow or
/// stalled client, or anyone on the network) must not keep the aggregator from exiting
/// on SIGTERM: `terminate` panics "still running 30 s after SIGTERM" when it does.
#[test]
fn sigterm_exits_despite_a_half_sent_http_request() {
    let dir = TempDir::new("http-sigterm-half-sent");
    let agg = AggregatorProcess::start(&dir.file("agg"), &[]);
    let mut slow = std::net::TcpStream::connect(host(&agg.http)).expect("connect");
    slow.write_all(b"GET /api/v1/servers HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let status = agg.terminate();
    assert!(status.success(), "{status:?}");
    drop(slow);
}

/// The same on the admin port, the other axum server.
#[test]
fn sigterm_exits_despite_a_half_sent_admin_request() {
    let dir = TempDir::new("http-sigterm-half-sent-admin");
    let agg = AggregatorProcess::start(&dir.file("agg"), &[]);
    let mut slow = std::net::TcpStream::connect(agg.admin).expect("connect");
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let status = agg.terminate();
    assert!(status.success(), "{status:?}");
    drop(slow);
}
