//! Review 4 of cluster mode (DESIGN §10): each test demonstrates a suspected defect (an
//! answer without an acknowledged push, naming nothing missing, or an acknowledged push
//! lost) and fails while it is there. The NATS proxy and the node, push and export helpers
//! are `natsfaults.rs`.
//!
//! A fourth integration test ran a node configured for a longer `max_age` than the stream's (every
//! guard is timed from the node's): it answered NOT_FOUND for an acknowledged series. A
//! node now refuses to start on such a stream (and a consumer to open if the stream is
//! edited so), which `cluster::a_node_configured_unlike_the_stream_refuses_to_start`
//! checks; the scenario cannot be set up any more. The unit-level test is
//! `aggregator/src/cluster/review4_tests.rs`.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use crate::faults::{agg_metric, wait_until};
use crate::nats::NatsCluster;
use crate::natsfaults::*;
use crate::util::{TempDir, channel, runtime};
use hourglass_rpc::proto::v1::{self, query_client::QueryClient};

/// The series of metric `visits` a node lists (`Query.ListSeries`, also
/// `GET /api/v1/series`), by their `page` tag, or its refusal.
async fn listed_pages(grpc: &str) -> Result<Vec<String>, tonic::Status> {
    let mut q = QueryClient::new(channel(grpc).await);
    let r = q
        .list_series(v1::ListSeriesRequest {
            metric: "visits".into(),
        })
        .await?
        .into_inner();
    Ok(r.series
        .iter()
        .filter_map(|s| s.series.as_ref())
        .flat_map(|s| s.tags.iter().filter(|t| t.key == "page"))
        .map(|t| t.value.clone())
        .collect())
}

/// The partitions whose owners include `node`, as `hourglass cluster status` reports them
/// from the node at `grpc`.
fn owned_by(grpc: &str, node: &str) -> Vec<u32> {
    let run = crate::util::hourglass(&["cluster", "status", "--aggregator", grpc, "--json"], b"");
    let status = run.json();
    status["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .filter(|p| {
            p["owners"]
                .as_array()
                .is_some_and(|o| o.iter().any(|n| n.as_str() == Some(node)))
        })
        .map(|p| p["partition"].as_u64().unwrap_or(0) as u32)
        .collect()
}

/// The read barrier (`barrier::pass`, DESIGN §10: "an acknowledged push is in every answer
/// that begins after its acknowledgement") guards only the planner's queries
/// (`cluster::fan_out`). `Query.ListSeries` and `Query.ListServers` (and the HTTP API's
/// `/api/v1/series`, `/api/v1/servers`, which call them) read the node's local store
/// straight (`service/query.rs`, `list_series`: `store.list_series()`), with no barrier
/// and no refusal, in cluster mode as on a single aggregator. A node learns a series of a
/// partition it does not own only from the live subject; if its live consumer lags — here
/// its live deliveries are lost on the way, as around a reconnect; equally a backlog, or
/// a store that lacks live messages the stream dropped and could not copy them
/// (`live_complete` false, which makes every other query refuse) — it lists the series
/// without the acknowledged push's, while the same node refuses a Distinct query over it.
#[test]
fn review4_list_series_answers_without_an_acknowledged_push_and_no_barrier() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review4-list-series");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let a = node(&dir, vec![proxy.url()], "agg-1", |_| {});
    let b = node(&dir, vec![urls[1].clone()], "agg-2", |_| {});
    let c = node(&dir, vec![urls[2].clone()], "agg-3", |_| {});
    wait_until("three members, all ready", || {
        [&a, &b, &c]
            .iter()
            .all(|n| agg_metric(*n, "cluster_members") == 3.0 && ready(*n))
    });
    let mine = owned_by(&b.grpc, "agg-1");
    // agg-1 hands over what it no longer owns (it applied every partition alone first).
    wait_until("agg-1 to apply only the partitions it owns", || {
        agg_metric(&a, "cluster_partitions_applying") == mine.len() as f64 && ready(&a)
    });
    let p = (0..PARTITIONS)
        .find(|p| !mine.contains(p))
        .expect("a partition agg-1 does not own");
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    let before = nth_page_in(p, "listed-before", 0);
    let after = nth_page_in(p, "listed-after", 0);
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(&before, hour, 1, 0..10))),
        vec![Stored]
    );
    wait_until("agg-1 to list the first series", || {
        rt.block_on(listed_pages(&a.grpc))
            .is_ok_and(|pages| pages.contains(&before))
    });
    // agg-1's live deliveries are lost from now on; a push through agg-2 is acknowledged.
    proxy.drop_deliveries_of(Some("-live".to_string()));
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(&after, hour, 1, 0..10))),
        vec![Stored]
    );
    // The premise: agg-1 cannot confirm it applied the series index, so its queries
    // refuse (the read barrier).
    let distinct = rt.block_on(export(&a.grpc, &after, hour));
    assert!(
        matches!(&distinct, Err(s) if s.code() == tonic::Code::Unavailable),
        "premise not reached (not the defect): agg-1 answers a query over the push ({:?})",
        distinct
            .as_ref()
            .map(|(bytes, missing)| (bytes.len(), *missing))
    );
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        let listed = rt.block_on(listed_pages(&a.grpc));
        assert!(
            match &listed {
                Ok(pages) => pages.contains(&after),
                Err(s) => s.code() == tonic::Code::Unavailable,
            },
            "agg-1 lists the series of metric visits without the acknowledged push's series \
             visits{{page={after}}} (partition {p}, not agg-1's) and without refusing \
             ({listed:?}), while it refuses a Distinct query for want of the series index (the \
             read barrier); agg-2 lists {:?}",
            rt.block_on(listed_pages(&b.grpc)),
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    proxy.drop_deliveries_of(None);
    drop(rt);
}

/// The consumer's metadata `hourglass.complete` of consumer `name`, as JetStream holds it.
fn complete_mark(url: &str, name: &str) -> Option<String> {
    let info = js_api(url, &format!("$JS.API.CONSUMER.INFO.{STREAM}.{name}"), "").ok()?;
    info["config"]["metadata"]["hourglass.complete"]
        .as_str()
        .map(str::to_string)
}

/// `created` of consumer `name` (its instance), as JetStream holds it.
fn consumer_created(url: &str, name: &str) -> Option<String> {
    let info = js_api(url, &format!("$JS.API.CONSUMER.INFO.{STREAM}.{name}"), "").ok()?;
    info["created"].as_str().map(str::to_string)
}

/// One push through `grpc`, answered or refused.
async fn push_once(
    grpc: &str,
    request: v1::PushRequest,
) -> Result<Vec<v1::PushOutcome>, tonic::Status> {
    let mut c = v1::collector_client::CollectorClient::new(channel(grpc).await);
    c.push(request)
        .await
        .map(|r| r.into_inner().results.iter().map(|r| r.outcome()).collect())
}

/// The guard against the lag gap (working tree: `nothing_aged_out` in the consume loop,
/// `idle` and `barrier::caught_up`) checks, for a consumer whose freshness is unknown —
/// every consumer just opened (`Running::fresh` is `None`) — that the stream still starts
/// at or before this node's position plus one, else distrusts the consumer and opens it
/// again. A store that is *known* incomplete (it lacks messages the stream dropped, its
/// consumer marked `hourglass.complete = false`, and no node could copy them) always fails
/// that check: its position is before the stream's start by definition. So each opening
/// distrusts the consumer at its first delivery (or first idle check), opens it again
/// (deleting and making the durable consumer again every `RETRY_DELAY`, and asking every
/// member for a copy each time), and the store applies nothing, for as long as no node can
/// copy. Before the guard such a store "applies what is there but does not answer for
/// them" and tries the copy every 30 s (`COPY_RETRY`, DESIGN §10).
///
/// On the live subject this stops the node's writes: an entry answers a push only once it
/// applied its own live message (`answer_from_owners`), which it never does now. Here a
/// one-node cluster (owners are the members there are) whose live deliveries are lost
/// until the stream dropped one (`max_age` 4 s): its partitions are complete and ready, its
/// live subject incomplete with no other node to copy from; a push through it is never
/// acknowledged again, and its live consumer is made again over and over.
#[test]
fn review4_an_incomplete_store_with_no_copy_source_still_applies_what_the_stream_has() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review4-no-source");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let a = node(&dir, vec![proxy.url()], "agg-1", |c| {
        c.max_age = Duration::from_secs(4);
        c.publish_timeout = Duration::from_secs(2);
    });
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    assert_eq!(
        rt.block_on(push_until_answered(
            &a.grpc,
            push("no-source-0", hour, 1, 0..10)
        )),
        vec![Stored]
    );
    let live_consumer = {
        let path = std::path::Path::new(&dir.file("agg-1")).join("cluster-consumer");
        format!("{}-live", std::fs::read_to_string(path).unwrap().trim())
    };
    // agg-1's live deliveries are lost; a push through it is published (its live message
    // is in the stream) but not acknowledged.
    proxy.drop_deliveries_of(Some("-live".to_string()));
    let lost = rt.block_on(push_once(&a.grpc, push("no-source-1", hour, 1, 0..10)));
    assert!(
        lost.is_err(),
        "premise not reached (not the defect): {lost:?}"
    );
    let x_live = last_of_subject(&urls[1], "hourglass.live").expect("the live message");
    wait_until(
        "the stream to drop the live message agg-1 never received",
        || stream_state(&urls[1]).1 > x_live,
    );
    // agg-1 notices the lost delivery and opens its live consumer again, past the gap:
    // incomplete, and no node to copy from.
    let deadline = Instant::now() + Duration::from_secs(30);
    while complete_mark(&urls[1], &live_consumer).as_deref() != Some("false") {
        assert!(
            Instant::now() < deadline,
            "premise not reached (not the defect): agg-1's live consumer is not marked incomplete ({:?})",
            complete_mark(&urls[1], &live_consumer)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    proxy.drop_deliveries_of(None);
    // Its instances over 10 s: one (or two, the copy retried after 30 s) before the guard.
    let mut instances = std::collections::BTreeSet::new();
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(10) {
        if let Some(created) = consumer_created(&urls[1], &live_consumer) {
            instances.insert(created);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // A push through agg-1, to a partition it is complete and ready for.
    let started = Instant::now();
    let mut answers = Vec::new();
    loop {
        let answer = rt.block_on(push_once(&a.grpc, push("no-source-2", hour, 1, 0..10)));
        match answer {
            Ok(outcomes) => {
                assert_eq!(outcomes, vec![Stored]);
                break;
            }
            Err(s) => answers.push(format!("{:?}: {}", s.code(), s.message())),
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "agg-1, whose live subject lacks a message the stream dropped and which has no node \
             to copy from, never applies its live subject again: its live consumer was made \
             {} times in 10 s and a push through it is never acknowledged (40 s); \
             agg-1 is {}; answers: {:?}",
            instances.len(),
            readiness(&a),
            answers.iter().rev().take(2).collect::<Vec<_>>(),
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(rt);
}

/// A page whose series falls in partition `p`, the `i`th such, prefixed `prefix`.
fn nth_page_in(p: u32, prefix: &str, i: usize) -> String {
    (0..)
        .map(|n| format!("{prefix}-{n}"))
        .filter(|page| partition_of(page) == p)
        .nth(i)
        .expect("a page")
}

/// `wait_until` with its own limit.
fn wait_until_long(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ok() {
        assert!(
            started.elapsed() < limit,
            "premise not reached (not the defect): {what} within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The read barrier's step 2 waits, per partition, for the positions the applied live
/// messages named (`Barrier::required`), kept in memory only. `Cluster::load_position`
/// (engine.rs) calls `barrier.forget_required()` — clearing the requirements of *every*
/// partition — whenever a subject's recorded position is not of the current stream
/// instance, and that includes a subject this store never applied (no position recorded:
/// its stream is empty). So every first opening of a partition on a store — a node gaining
/// a partition when a member leaves, or joins — forgets what every other partition must
/// have applied before answering. A partition this node is ready for but whose consumer
/// lags (here its deliveries are lost on the way, as around a reconnect, for less than the
/// two idle checks that reopen it) is then answered from the store without the pushes
/// acknowledged before, naming nothing missing; the moment before, the same node left it
/// to the other owner.
#[test]
fn review4_gaining_a_partition_forgets_what_every_other_partition_must_have_applied() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review4-forget");
    let urls = nats.urls();
    let b = node(&dir, vec![urls[1].clone()], "agg-2", |_| {});
    let c = node(&dir, vec![urls[2].clone()], "agg-3", |_| {});
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let a = node(&dir, vec![proxy.url()], "agg-1", |_| {});
    wait_until("three members, all ready", || {
        [&a, &b, &c]
            .iter()
            .all(|n| agg_metric(*n, "cluster_members") == 3.0 && ready(*n))
    });
    let mine = owned_by(&b.grpc, "agg-1");
    wait_until("agg-1 to apply only the partitions it owns", || {
        agg_metric(&a, "cluster_partitions_applying") == mine.len() as f64 && ready(&a)
    });
    let gained: Vec<u32> = (0..PARTITIONS).filter(|p| !mine.contains(p)).collect();
    assert!(
        !gained.is_empty(),
        "premise not reached (not the defect): agg-1 owns every partition"
    );
    let q = mine[0];
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    let page = nth_page_in(q, "forget", 0);
    // agg-1's deliveries of q are lost from now on; a push into q through agg-2.
    proxy.drop_deliveries_of(Some(format!("-p{q}")));
    let pushed = Instant::now();
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(&page, hour, 1, 0..2000))),
        vec![Stored]
    );
    let (want, missing) = rt
        .block_on(export(&b.grpc, &page, hour))
        .expect("agg-2 answers");
    assert!(!want.is_empty() && missing == 0, "agg-2 holds the push");
    let honest = |answer: &Result<(Vec<u8>, u32), tonic::Status>| match answer {
        Ok((got, missing)) => *got == want || *missing > 0,
        Err(s) => s.code() == tonic::Code::Unavailable,
    };
    // The premise: agg-1, ready for q but behind what the live message named, leaves q to
    // the other owner.
    let before = rt.block_on(export(&a.grpc, &page, hour));
    assert!(
        honest(&before),
        "premise not reached (not the defect): agg-1 already answers without the push ({:?})",
        before.as_ref().map(|(g, m)| (g.len(), *m))
    );
    // agg-3 leaves; agg-1 gains the partitions agg-2 and agg-3 owned, which its store never
    // applied.
    rt.block_on(c.stop());
    wait_until("agg-1 to apply the partitions it gained", || {
        agg_metric(&a, "cluster_partitions_applying") > mine.len() as f64
    });
    std::thread::sleep(Duration::from_secs(1));
    let mut answers = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        assert!(
            pushed.elapsed() < Duration::from_secs(30),
            "premise not reached (not the defect): too slow, agg-1 may have reopened its consumer of q"
        );
        let answer = rt.block_on(export(&a.grpc, &page, hour));
        answers.push(match &answer {
            Ok((got, missing)) => format!("{} bytes, partitions_missing {missing}", got.len()),
            Err(s) => format!("{:?}", s.code()),
        });
        assert!(
            honest(&answer),
            "agg-1, ready for partition {q} but without the acknowledged push to it (its \
             deliveries lost), answers for q without it, naming nothing missing ({} bytes from \
             agg-2), once it started applying the partitions {gained:?} it gained from agg-3 \
             (their first opening forgot every partition's requirement); agg-1 is {}; \
             answers: {answers:?}",
            want.len(),
            readiness(&a),
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    proxy.drop_deliveries_of(None);
    drop(rt);
}
