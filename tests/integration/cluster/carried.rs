//! One consumer a node (DESIGN §10): once caught up, a node's partitions are delivered by
//! its live consumer. A fault of that one consumer is a fault of every partition it
//! carries, and must never make a node answer without an acknowledged push.

use std::time::{Duration, Instant};

use crate::faults::{JOIN_WAIT, agg_metric, wait_until, wait_until_within};
use crate::nats::NatsCluster;
use crate::natsfaults::*;
use crate::util::{TempDir, runtime};
use hourglass_rpc::proto::v1;

/// Whether `node` applies every partition it applies through its live consumer.
fn all_carried(node: &dyn crate::util::AggregatorAddrs) -> bool {
    let applying = agg_metric(node, "cluster_partitions_applying");
    applying > 0.0 && agg_metric(node, "cluster_partitions_carried") == applying
}

/// agg-1's live consumer carries every partition when its deliveries start to be lost on
/// the way (as around a reconnect) and a push is acknowledged through agg-2: agg-1 answers
/// right or honestly throughout, never from rows without the push; healed, it finds the
/// gap, its partitions catch up through their own consumers and rejoin the live one, and
/// it answers the push.
#[test]
fn deliveries_of_the_live_consumer_lost_on_the_way_never_leave_a_carried_partition_answered_without_a_push()
 {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("carried-lost-deliveries");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let a = node(&dir, vec![proxy.url()], "agg-1", |_| {});
    let b = node(
        &dir,
        vec![urls[1].clone(), urls[2].clone()],
        "agg-2",
        |_| {},
    );
    wait_until_within(
        "both nodes ready, every partition carried",
        JOIN_WAIT,
        || {
            [&a, &b]
                .iter()
                .all(|n| agg_metric(*n, "cluster_members") == 2.0 && ready(*n) && all_carried(*n))
        },
    );
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    let page = "carried";
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(page, hour, 1, 0..10))),
        vec![Stored]
    );
    wait_until("agg-1 to answer the first push", || {
        let (a, b) = (
            rt.block_on(export(&a.grpc, page, hour)),
            rt.block_on(export(&b.grpc, page, hour)),
        );
        matches!((&a, &b), (Ok(x), Ok(y)) if x == y && x.1 == 0)
    });
    // Every delivery of agg-1's live consumer is lost from now on: the partition's
    // messages with it, since it carries the partition.
    proxy.drop_deliveries_of(Some("-live".to_string()));
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(page, hour, 2, 0..500))),
        vec![Stored]
    );
    let want = rt
        .block_on(export(&b.grpc, page, hour))
        .expect("agg-2 answers");
    assert_eq!(want.1, 0, "agg-2 holds the push");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        let got = rt.block_on(export(&a.grpc, page, hour));
        assert!(
            right_or_honest(&got, &want.0),
            "agg-1, whose live consumer's deliveries are lost, answers without the acknowledged push: {}",
            describe(&got, &want.0)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Healed: the next delivery shows the gap; a third push brings one.
    proxy.drop_deliveries_of(None);
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(page, hour, 3, 0..900))),
        vec![Stored]
    );
    let want = rt
        .block_on(export(&b.grpc, page, hour))
        .expect("agg-2 answers");
    wait_until("agg-1 to answer the pushes again", || {
        let got = rt.block_on(export(&a.grpc, page, hour));
        assert!(
            right_or_honest(&got, &want.0),
            "agg-1 answers without an acknowledged push after the heal: {}",
            describe(&got, &want.0)
        );
        got.is_ok_and(|(bytes, missing)| bytes == want.0 && missing == 0)
    });
    let again = Instant::now();
    while !(ready(&a) && all_carried(&a)) {
        assert!(
            again.elapsed() < JOIN_WAIT,
            "agg-1's partitions are not carried again after {JOIN_WAIT:?}: {}, carried {}",
            readiness(&a),
            agg_metric(&a, "cluster_partitions_carried")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
