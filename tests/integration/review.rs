//! Review of the catch-up copy and the consumer's applied position (646ec70, f1d8789):
//! each test demonstrates a suspected defect, and fails while it is there.

use std::time::{Duration, Instant};

use crate::faults::{agg_metric, wait_until};
use crate::nats::NatsCluster;
use crate::natsfaults::{export_all as export, push_until_answered};
use crate::netcut::Link;
use crate::util::{AggregatorAddrs, InProcessAggregator, TempDir, runtime};
use hourglass_aggregator::cluster::ClusterConfig;
use hourglass_rpc::proto::v1;

const PARTITIONS: u32 = 8;
const HEARTBEAT: Duration = Duration::from_millis(500);

/// A node of the cluster on the NATS servers `urls`, with `tweak` applied to its
/// `[cluster]`, once it is ready for every partition it applies.
fn review_node(
    dir: &TempDir,
    urls: Vec<String>,
    name: &str,
    tweak: impl FnOnce(&mut ClusterConfig),
) -> InProcessAggregator {
    let mut cluster = ClusterConfig::new(name, urls);
    cluster.partitions = PARTITIONS;
    cluster.heartbeat = HEARTBEAT;
    cluster.member_ttl = Duration::from_secs(6);
    tweak(&mut cluster);
    let agg = InProcessAggregator::start_with(hourglass_aggregator::Config {
        data_dir: dir.file(name).into(),
        cluster: Some(cluster),
        ..Default::default()
    });
    wait_until("the node to join and be ready", || ready(&agg));
    agg
}

fn ready(node: &dyn AggregatorAddrs) -> bool {
    let applying = agg_metric(node, "cluster_partitions_applying");
    agg_metric(node, "cluster_members") > 0.0
        && applying > 0.0
        && agg_metric(node, "cluster_partitions_ready") == applying
        && agg_metric(node, "cluster_pending") == 0.0
}

fn hll(items: std::ops::Range<u32>) -> Vec<u8> {
    let mut h = hourglass_sketch::hll::Hll::new(12).unwrap();
    for i in items {
        h.insert(&i.to_le_bytes());
    }
    h.encode()
}

/// A push from web-1 of the distinct series `visits{page=PAGE}` at `hour`.
fn push(page: &str, hour: u32, items: std::ops::Range<u32>) -> v1::PushRequest {
    let mut s = crate::util::snapshot("visits", hour, 1, v1::SketchKind::Distinct, hll(items));
    s.series.as_mut().unwrap().tags = vec![v1::Tag {
        key: "page".into(),
        value: page.into(),
    }];
    v1::PushRequest {
        server: Some(v1::Server {
            name: "web-1".into(),
            labels: vec![],
        }),
        snapshots: vec![s],
        live_hours: vec![hour],
    }
}

/// A node that is ready for its partitions stays ready for as long as its consumers run:
/// `complete` is decided only when a consumer opens (`apply.rs`, `open`). A node whose
/// connection to NATS goes silent longer than `max_age` (here a cut link: the NATS
/// cluster itself stays healthy, as when one host's network stalls) comes back to a stream
/// that dropped messages it never applied; its consumers skip them (JetStream delivers
/// what is still there), and a node that took the consumer's `delivered` as applied would
/// answer without them, naming no missing partition. (Stopping a NATS server instead,
/// SIGSTOP, stalls JetStream itself for its leader elections; with a `max_age` shorter
/// than that, messages age out before any node reads them: no node could answer.)
#[test]
fn a_ready_node_that_stalls_past_max_age_never_answers_without_what_the_stream_dropped() {
    if let Ok(filter) = std::env::var("HOURGLASS_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review-stall-max-age");
    let urls = nats.urls();
    let tweak = |c: &mut ClusterConfig| {
        c.max_age = Duration::from_secs(3);
        // agg-2 stays a member (and an owner) throughout its stall.
        c.member_ttl = Duration::from_secs(30);
    };
    let link = Link::to(Some(urls[2].trim_start_matches("nats://").parse().unwrap()));
    let a = review_node(&dir, vec![urls[0].clone(), urls[1].clone()], "agg-1", tweak);
    let b = review_node(
        &dir,
        vec![format!("nats://{}", link.addr())],
        "agg-2",
        tweak,
    );
    wait_until("two members, both ready", || {
        agg_metric(&a, "cluster_members") == 2.0
            && agg_metric(&b, "cluster_members") == 2.0
            && ready(&a)
            && ready(&b)
    });
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push("before", hour, 0..100))),
        vec![Stored]
    );
    wait_until("agg-2 to hold the first push", || {
        let (want, got) =
            rt.block_on(async { (export(&a.grpc, hour).await, export(&b.grpc, hour).await) });
        matches!((want, got), (Ok(w), Ok(g)) if w == g)
    });
    // agg-2's link to NATS goes silent; a push is acknowledged meanwhile, and the stream
    // drops it (max_age) before the link comes back.
    link.cut(true);
    assert_eq!(
        rt.block_on(push_until_answered(
            &a.grpc,
            push("during", hour, 1000..3000)
        )),
        vec![Stored]
    );
    wait_until("the stream to drop every message", || {
        nats.stream_messages("HOURGLASS") == Some(0)
    });
    std::thread::sleep(Duration::from_secs(2));
    link.cut(false);
    let (want, _) = rt.block_on(export(&a.grpc, hour)).expect("agg-1 answers");
    // agg-2 may refuse for a while (deliveries it lost come back after ACK_WAIT, 60 s);
    // the first answer it gives must be right or name what it lacks.
    let resumed = Instant::now();
    let answer = loop {
        let answer = rt.block_on(export(&b.grpc, hour));
        match &answer {
            Err(s)
                if s.code() == tonic::Code::Unavailable
                    && resumed.elapsed() < Duration::from_secs(150) =>
            {
                std::thread::sleep(Duration::from_millis(500))
            }
            _ => break answer,
        }
    };
    let after = resumed.elapsed();
    // How long it stays wrong (past ACK_WAIT, 60 s, anything delivered to it and lost
    // has come back).
    let mut wrong_for = Duration::ZERO;
    let later = loop {
        let later = rt.block_on(export(&b.grpc, hour));
        if resumed.elapsed() > Duration::from_secs(65)
            || matches!(&later, Ok((got, _)) if *got == want)
        {
            break later;
        }
        wrong_for = resumed.elapsed();
        std::thread::sleep(Duration::from_millis(250));
    };
    let honest = |answer: &Result<(Vec<u8>, u32), tonic::Status>| match answer {
        Ok((got, missing)) => *got == want || *missing > 0,
        Err(s) => s.code() == tonic::Code::Unavailable,
    };
    let show = |answer: &Result<(Vec<u8>, u32), tonic::Status>| match answer {
        Ok((got, missing)) => format!(
            "same bytes as agg-1: {}, partitions_missing = {missing}",
            *got == want
        ),
        Err(s) => format!("refused: {s}"),
    };
    assert!(
        honest(&answer) && honest(&later),
        "agg-2 answers without the acknowledged push visits{{page=during}} that the stream \
         dropped while its link to NATS was silent: {after:?} after the link came back ({}), still wrong \
         {wrong_for:?} after, then ({}); it says it is ready for {} of {} partitions: a silently wrong answer",
        show(&answer),
        show(&later),
        agg_metric(&b, "cluster_partitions_ready"),
        agg_metric(&b, "cluster_partitions_applying"),
    );
    drop(rt);
}
