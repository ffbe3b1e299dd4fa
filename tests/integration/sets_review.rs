//! Review probes of the set questions end to end: an agent may push any sketch the format
//! accepts, a fully saturated one too; the HTTP API, `hourglass query overlap --json` and
//! its text must still say something true and well-formed.

use hourglass_rpc::proto::v1;
use hourglass_rpc::time::hour_start;
use hourglass_sketch::hll::Hll;
use serde_json::Value;

use crate::aggregator::{clients, outcomes, push, server};
use crate::util::{
    AggregatorAddrs, InProcessAggregator, TempDir, hourglass, http_request, snapshot, this_hour,
};

/// Every register at its largest value (valid in the format).
fn saturated(precision: u8) -> Hll {
    let mut h = Hll::new(precision).expect("precision");
    for index in 0..1u64 << precision {
        h.insert_hash(index << (64 - precision));
    }
    h
}

fn normal(n: u32) -> Hll {
    let mut h = Hll::new(14).expect("precision 14");
    for u in 0..n {
        h.insert(format!("user{u}").as_bytes());
    }
    h
}

/// web-1 pushes a saturated sketch, api-1 one of 50,000 users, both at `hour`.
async fn stock(agg: &InProcessAggregator, hour: u32) {
    let (mut collector, _) = clients(agg).await;
    for (name, sketch) in [("web-1", saturated(14)), ("api-1", normal(50_000))] {
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

fn encode(text: &str) -> String {
    text.replace('+', "%2B").replace(':', "%3A")
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
async fn review_sets_http_overlap_of_a_saturated_side_keeps_numbers() {
    let dir = TempDir::new("sets-review-http");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let hour = this_hour() - 1;
    stock(&agg, hour).await;
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
async fn review_sets_cli_overlap_of_a_saturated_side_says_true_bounds() {
    let dir = TempDir::new("sets-review-cli");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let hour = this_hour() - 1;
    stock(&agg, hour).await;
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
