//! Membership over a range (issue 16): `Query/Membership` looks the item up in each stored
//! filter of the selection (never in their merge) and says "definitely absent" or where
//! it was seen, over gRPC, the command and the HTTP API, checked against the truth of what
//! was pushed.

use hourglass_rpc::proto::v1::{
    self, collector_client::CollectorClient, query_client::QueryClient,
};
use hourglass_rpc::time::hour_start;
use hourglass_sketch::membership::RangeSizing;
use std::collections::BTreeSet;

use crate::util::{InProcessAggregator, TempDir, channel, hourglass, snapshot, this_hour};

const SERVERS: [&str; 3] = ["web-1", "web-2", "web-3"];
const HOURS: u32 = 48;
/// Regular users, each on one server some hours: `user{u}` on server `u % 3` in hours
/// where `(u + hour) % 5 == 0`.
const REGULARS: u32 = 60;

/// The items of one server-hour: its regulars and 100 one-off visitors.
fn items(server: usize, offset: u32) -> Vec<String> {
    let mut items: Vec<String> = (0..REGULARS)
        .filter(|u| *u as usize % 3 == server && (u + offset).is_multiple_of(5))
        .map(|u| format!("user{u}"))
        .collect();
    items.extend((0..100).map(|k| format!("visitor-{server}-{offset}-{k}")));
    items
}

/// Where `item` was pushed: (server, hour), ordered by server then hour.
fn truth(item: &str, base: u32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for (s, name) in SERVERS.iter().enumerate() {
        for offset in 0..HOURS {
            if items(s, offset).iter().any(|i| i == item) {
                out.push((name.to_string(), base + offset));
            }
        }
    }
    out
}

/// Pushes 3 servers × 48 hours of `users` filters, sized for lookups over that range at
/// 5%; returns the first hour.
async fn stock(agg: &InProcessAggregator) -> u32 {
    let base = this_hour() - HOURS;
    let sizing =
        RangeSizing::for_range(SERVERS.len() as u64 * u64::from(HOURS), 200, 0.05).expect("sizing");
    let mut collector = CollectorClient::new(channel(&agg.grpc).await);
    for (s, name) in SERVERS.iter().enumerate() {
        let snapshots = (0..HOURS)
            .map(|offset| {
                let mut filter = sizing.new_filter().expect("filter");
                for item in items(s, offset) {
                    filter.insert(item.as_bytes());
                }
                snapshot(
                    "users",
                    base + offset,
                    1,
                    v1::SketchKind::Membership,
                    filter.encode(),
                )
            })
            .collect();
        let reply = collector
            .push(v1::PushRequest {
                server: Some(v1::Server {
                    name: name.to_string(),
                    labels: vec![],
                }),
                snapshots,
                live_hours: (base..base + HOURS).collect(),
            })
            .await
            .expect("push")
            .into_inner();
        assert!(
            reply
                .results
                .iter()
                .all(|r| r.outcome == v1::PushOutcome::Stored as i32),
            "{reply:?}"
        );
    }
    base
}

fn selector(base: u32, group_by: v1::GroupBy) -> Option<v1::Selector> {
    Some(v1::Selector {
        metric: "users".into(),
        range: Some(v1::TimeRange {
            start_hour: base,
            end_hour: base + HOURS,
        }),
        group_by: group_by as i32,
        ..Default::default()
    })
}

async fn look_up(
    q: &mut QueryClient<tonic::transport::Channel>,
    base: u32,
    item: &str,
    group_by: v1::GroupBy,
) -> v1::MembershipResponse {
    q.membership(v1::MembershipRequest {
        selector: selector(base, group_by),
        item: item.as_bytes().to_vec(),
    })
    .await
    .expect("membership")
    .into_inner()
}

fn sightings(a: &v1::MembershipAnswer) -> Vec<(String, u32)> {
    a.seen_in
        .iter()
        .map(|s| (s.server.clone(), s.start_hour))
        .collect()
}

#[tokio::test]
async fn a_range_lookup_says_definitely_absent_or_where_against_the_truth() {
    let dir = TempDir::new("membership-range");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let base = stock(&agg).await;
    let mut q = QueryClient::new(channel(&agg.grpc).await);
    let consulted = (SERVERS.len() as u32 * HOURS) as u64;

    // Every regular user is found, in every server-hour it was pushed to; a filter below
    // capacity rarely adds a false sighting.
    let mut extra = 0;
    for u in 0..REGULARS {
        let item = format!("user{u}");
        let r = look_up(&mut q, base, &item, v1::GroupBy::None).await;
        let a = r.answer.expect("answer");
        let want = truth(&item, base);
        assert!(!want.is_empty());
        assert!(a.maybe_present && !a.definitely_absent, "{item}: {a:?}");
        assert_eq!(a.filters_consulted, consulted);
        assert_eq!(a.seen_in_count as usize, a.seen_in.len());
        let got: BTreeSet<(String, u32)> = sightings(&a).into_iter().collect();
        assert!(
            want.iter().all(|w| got.contains(w)),
            "{item}: pushed to {want:?}, seen in {got:?}"
        );
        extra += got.len() - want.len();
        // Ordered by server, then hour.
        let mut sorted = sightings(&a);
        sorted.sort();
        assert_eq!(sightings(&a), sorted);
        assert_eq!(a.estimated_fpr, a.range_fpr);
        assert!(a.all_false_probability < 1e-6, "{item}: {a:?}");
        assert!(a.seen_in.iter().all(|s| s.hours == 1 && s.fpr < 1e-3));
        assert_eq!(r.coverage.expect("coverage").sketches_merged, consulted);
    }
    assert!(extra <= 3, "{extra} false sightings among {REGULARS} users");

    // Items pushed nowhere: definitely absent, as often as the stated rate promises.
    let probes = 400;
    let mut seen = 0;
    let mut stated = None;
    for i in 0..probes {
        let a = look_up(&mut q, base, &format!("nobody{i}"), v1::GroupBy::None)
            .await
            .answer
            .expect("answer");
        assert_eq!(a.filters_consulted, consulted);
        assert_eq!(a.definitely_absent, !a.maybe_present);
        if a.maybe_present {
            seen += 1;
        }
        // The range's rate is a property of the filters, the same for every item.
        assert_eq!(*stated.get_or_insert(a.range_fpr), a.range_fpr);
        assert!(!a.past_design_point && a.saturated_filters == 0);
    }
    let stated = stated.unwrap();
    // Under capacity, the rate is well under the 5% the filters were sized for.
    assert!(stated > 0.0 && stated < 0.05, "{stated}");
    let measured = f64::from(seen) / f64::from(probes);
    let sigma = (stated * (1.0 - stated) / f64::from(probes)).sqrt();
    assert!(
        measured <= stated + 4.0 * sigma + 1.0 / f64::from(probes),
        "{seen} of {probes} absent items seen; stated {stated}"
    );

    // Grouped by server: each group looks in its own filters only.
    let r = look_up(&mut q, base, "user7", v1::GroupBy::Server).await;
    assert_eq!(r.groups.len(), 3);
    for g in &r.groups {
        let a = g.answer.as_ref().expect("answer");
        assert_eq!(a.filters_consulted, u64::from(HOURS), "{}", g.key);
        let want: Vec<(String, u32)> = truth("user7", base)
            .into_iter()
            .filter(|(s, _)| *s == g.key)
            .collect();
        if want.is_empty() {
            // user7 is on web-2 only; the others may at most say a rare false "maybe".
            assert!(a.seen_in_count <= 1, "{}: {a:?}", g.key);
        } else {
            let got = sightings(a);
            assert!(want.iter().all(|w| got.contains(w)), "{}: {got:?}", g.key);
            assert!(a.seen_in.iter().all(|s| s.server == g.key));
        }
    }
    // The total of a grouped answer is the ungrouped answer.
    let whole = look_up(&mut q, base, "user7", v1::GroupBy::None).await;
    assert_eq!(r.answer, whole.answer);

    // The command: definitely absent, or where, with the rates; and its JSON.
    let from = hour_start(base).to_rfc3339();
    let to = hour_start(base + HOURS).to_rfc3339();
    let args = |item: &'static str, json: bool| {
        let mut a = vec![
            "query",
            "membership",
            "--metric",
            "users",
            "--item",
            item,
            "--aggregator",
            agg.grpc.as_str(),
            "--from",
            from.as_str(),
            "--to",
            to.as_str(),
        ];
        if json {
            a.push("--json");
        }
        a
    };
    let text = hourglass(&args("nobody-at-all", false), b"").ok().text();
    assert!(
        text.contains(&format!("definitely absent from all {consulted} filters")),
        "{text}"
    );
    let text = hourglass(&args("user7", false), b"").ok().text();
    let want = truth("user7", base);
    assert!(
        text.contains(&format!(
            "seen (maybe) in {} of {consulted} filters",
            want.len()
        )),
        "{text}"
    );
    let first = hourglass_rpc::time::rfc3339_hour(want[0].1);
    assert!(text.contains(&format!("{}  {first}", want[0].0)), "{text}");
    let json = hourglass(&args("user7", true), b"").ok().json();
    let a = whole.answer.as_ref().expect("answer");
    assert_eq!(json["maybe_present"], true, "{json}");
    assert_eq!(json["seen_in_count"], a.seen_in_count, "{json}");
    assert_eq!(json["range_fpr"].as_f64(), Some(a.range_fpr), "{json}");
    let cli_where: Vec<(String, u32)> = json["seen_in"]
        .as_array()
        .expect("seen_in")
        .iter()
        .map(|s| {
            (
                s["server"].as_str().unwrap().to_string(),
                s["start_hour"].as_u64().unwrap() as u32,
            )
        })
        .collect();
    assert_eq!(cli_where, sightings(a));

    // The HTTP API says the same.
    let addr: std::net::SocketAddr = agg.http.trim_start_matches("http://").parse().unwrap();
    let (status, body) = crate::util::http_get(
        addr,
        &format!(
            "/api/v1/membership?metric=users&item=user7&from={}&to={}",
            hourglass_rpc::time::rfc3339_hour(base),
            hourglass_rpc::time::rfc3339_hour(base + HOURS)
        ),
    );
    assert_eq!(status, 200, "{body}");
    let http: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let answer = &http["answer"];
    assert_eq!(answer["filters_consulted"], consulted, "{http}");
    assert_eq!(answer["definitely_absent"], false);
    assert_eq!(answer["seen_in"].as_array().unwrap().len(), a.seen_in.len());
    assert_eq!(answer["seen_in"][0]["server"], a.seen_in[0].server);
    assert_eq!(
        answer["seen_in"][0]["from"],
        hourglass_rpc::time::rfc3339_hour(a.seen_in[0].start_hour)
    );
    agg.stop().await;
}

/// `Query/MembershipBatch` and `/api/v1/membership/batch`: many items in one request, each
/// answered exactly as `Query/Membership` answers it alone, in the request's order; an
/// empty or oversized batch is refused with what is wrong.
#[tokio::test]
async fn a_batch_of_lookups_answers_each_item_as_a_lookup_alone() {
    let dir = TempDir::new("membership-batch");
    let agg = InProcessAggregator::start(&dir.file("data"));
    let base = stock(&agg).await;
    let mut q = QueryClient::new(channel(&agg.grpc).await);
    // Found, absent, the empty item, a repeat, and grouped.
    let items = ["user7", "nobody-1", "", "user12", "user7", "nobody-2"];
    for group_by in [v1::GroupBy::None, v1::GroupBy::Server] {
        let batch = q
            .membership_batch(v1::MembershipBatchRequest {
                selector: selector(base, group_by),
                items: items.iter().map(|i| i.as_bytes().to_vec()).collect(),
            })
            .await
            .expect("a batch")
            .into_inner();
        assert_eq!(batch.answers.len(), items.len());
        for (item, answer) in items.iter().zip(&batch.answers) {
            assert_eq!(
                *answer,
                look_up(&mut q, base, item, group_by).await,
                "{item:?} grouped {group_by:?}"
            );
        }
        let found = batch.answers[0].answer.as_ref().expect("answer");
        assert!(found.maybe_present && !truth("user7", base).is_empty());
    }
    // Refused whole, saying why.
    for (n, says) in [(0, "items is empty"), (1001, "at most 1000")] {
        let e = q
            .membership_batch(v1::MembershipBatchRequest {
                selector: selector(base, v1::GroupBy::None),
                items: (0..n).map(|i| format!("x{i}").into_bytes()).collect(),
            })
            .await
            .expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains(says), "{n}: {}", e.message());
    }

    // The command: `--item` again and again, one request; each answer as alone.
    let from = hour_start(base).to_rfc3339();
    let to = hour_start(base + HOURS).to_rfc3339();
    let command = |items: &[&str], json: bool| {
        let mut a = vec!["query", "membership", "--metric", "users"];
        for item in items {
            a.extend(["--item", *item]);
        }
        a.extend([
            "--aggregator",
            agg.grpc.as_str(),
            "--from",
            &from,
            "--to",
            &to,
        ]);
        if json {
            a.push("--json");
        }
        hourglass(&a, b"")
    };
    let both = command(&["user7", "nobody-1"], true).ok().json();
    let answers = both["answers"].as_array().expect("answers");
    assert_eq!(answers.len(), 2, "{both}");
    for (answer, item) in answers.iter().zip(["user7", "nobody-1"]) {
        assert_eq!(*answer, command(&[item], true).ok().json(), "{item}");
    }
    let text = command(&["user7", "nobody-1"], false).ok().text();
    let alone = [
        command(&["user7"], false).ok().text(),
        command(&["nobody-1"], false).ok().text(),
    ];
    assert_eq!(text, alone.join("\n"));
    let refused = hourglass(
        &[
            "query",
            "frequency",
            "--metric",
            "users",
            "--item",
            "a",
            "--item",
            "b",
            "--aggregator",
            agg.grpc.as_str(),
        ],
        b"",
    );
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("query frequency takes one --item"),
        "{}",
        refused.stderr
    );

    // The HTTP API: `item` once per item, the answers in order, each the single lookup's
    // JSON.
    let addr: std::net::SocketAddr = agg.http.trim_start_matches("http://").parse().unwrap();
    let range = format!(
        "from={}&to={}",
        hourglass_rpc::time::rfc3339_hour(base),
        hourglass_rpc::time::rfc3339_hour(base + HOURS)
    );
    let (status, body) = crate::util::http_get(
        addr,
        &format!("/api/v1/membership/batch?metric=users&item=user7&item=nobody-1&item=%FF&{range}"),
    );
    assert_eq!(status, 200, "{body}");
    let batch: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let answers = batch["answers"].as_array().expect("answers");
    assert_eq!(answers.len(), 3, "{batch}");
    for (answer, item) in answers.iter().zip(["user7", "nobody-1"]) {
        let (status, body) = crate::util::http_get(
            addr,
            &format!("/api/v1/membership?metric=users&item={item}&{range}"),
        );
        assert_eq!(status, 200, "{body}");
        let alone: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(*answer, alone, "{item}");
    }
    assert_eq!(answers[2]["item_base64"], "/w==", "{batch}");
    // The single lookup takes one item, and says where many go.
    let (status, body) = crate::util::http_get(
        addr,
        &format!("/api/v1/membership?metric=users&item=a&item=b&{range}"),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("/api/v1/membership/batch"), "{body}");
    let (status, body) = crate::util::http_get(
        addr,
        &format!("/api/v1/membership/batch?metric=users&{range}"),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("items is empty"), "{body}");
    agg.stop().await;
}
