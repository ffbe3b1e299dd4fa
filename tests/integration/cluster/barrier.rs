//! The read barrier (DESIGN §10: "an acknowledged push is in every answer that begins
//! after its acknowledgement"): every answer from a node's store, a list of series too,
//! holds every acknowledged push, names what it lacks, or is a refusal; and what each
//! partition must have applied before answering is kept when a node gains partitions.
//!
//! Where a test's doc tells how a node answered wrongly under its faults, that is what the
//! test keeps out: it fails if the node does so again.

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

/// A page whose series falls in partition `p`, the `i`th such, prefixed `prefix`.
fn nth_page_in(p: u32, prefix: &str, i: usize) -> String {
    (0..)
        .map(|n| format!("{prefix}-{n}"))
        .filter(|page| partition_of(page) == p)
        .nth(i)
        .expect("a page")
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
fn list_series_lists_every_acknowledged_push_or_refuses() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("barrier-list-series");
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
fn gaining_a_partition_keeps_what_every_other_partition_must_have_applied() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("barrier-gained-partition");
    let urls = nats.urls();
    let b = node(&dir, vec![urls[1].clone()], "agg-2", |_| {});
    let c = node(&dir, vec![urls[2].clone()], "agg-3", |_| {});
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    // q stays with its own consumer, whose deliveries the test drops.
    let a = node(&dir, vec![proxy.url()], "agg-1", |c| {
        c.own_partition_consumers = true
    });
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
