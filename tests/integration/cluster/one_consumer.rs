//! One consumer a node (DESIGN §10): a partition caught up by a consumer of its own joins
//! the live consumer's `filter_subjects`, and is then carried by it: the live consumer's
//! position is the partition's. A partition carried by the live consumer must be in its
//! filter, or the live consumer looks past the partition's messages without delivering
//! them while the node takes what it looked at as applied.
//!
//! Where a test's doc tells how a node answered wrongly under its faults, that is what the
//! test keeps out: it fails if the node does so again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::faults::{JOIN_WAIT, agg_metric, wait_until, wait_until_within};
use crate::nats::NatsCluster;
use crate::natsfaults::*;
use crate::util::{InProcessAggregator, TempDir, runtime};
use hourglass_aggregator::cluster::ClusterConfig;
use hourglass_rpc::proto::v1;

/// agg-1, reaching NATS through a proxy (returned), and agg-2, both configured by
/// `tweak`, members and ready, with every partition agg-1 applies (all of them: 2 nodes,
/// 2 owners) carried by its live consumer.
fn two_nodes_carried(
    name: &str,
    tweak: impl Fn(&mut ClusterConfig),
) -> (
    NatsCluster,
    TempDir,
    Proxy,
    InProcessAggregator,
    InProcessAggregator,
) {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new(name);
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let a = node(&dir, vec![proxy.url()], "agg-1", &tweak);
    let b = node(&dir, vec![urls[1].clone()], "agg-2", &tweak);
    let all = f64::from(PARTITIONS);
    wait_until(
        "two members, both ready, agg-1's partitions all carried",
        || {
            [&a, &b]
                .iter()
                .all(|n| agg_metric(*n, "cluster_members") == 2.0 && ready(*n))
                && agg_metric(&a, "cluster_partitions_applying") == all
                && agg_metric(&a, "cluster_partitions_carried") == all
        },
    );
    (nats, dir, proxy, a, b)
}

/// A partition joins the live consumer C in two steps (`join` in `apply.rs`): C's filter
/// gains it and the stream's last sequence L is read; then, once the partition's own
/// consumer applied up to L, C's loop adopts it. Every opening of C sets its filter back to
/// the live subject alone. When C's loop ends between the two steps and C is opened again
/// as the same instance (its flow of messages ended, as when a NATS server goes away under
/// a pull request: nothing it delivered was lost), the partition's own consumer still
/// holds the join it made before, and C's loop adopts the partition: same instance, the
/// partition applied up to L. But C's filter no longer holds it: C looks past the
/// partition's messages without delivering them, and the node takes what C looked at as
/// applied for the partition. A push acknowledged through the other owner is then missing
/// from the node's answer, which names nothing missing.
#[test]
fn a_partition_joining_while_the_live_consumer_opens_again_misses_no_message() {
    // A short max_age: short pull heartbeats and quiet times (a partition's own consumer
    // checks what it looked at, and joins, within 10 s of opening). Partitions wait 5 s in
    // the live consumer's filter before they ask to be carried: the window the test acts
    // in.
    let tweak = |c: &mut ClusterConfig| {
        c.max_age = Duration::from_secs(40);
        c.join_hold = Duration::from_secs(5);
        // A subject a partition: a partition joined and not yet carried shows as a
        // subject more in the live consumer's filter than partitions carried.
        c.subjects = Some(PARTITIONS);
    };
    let (nats, dir, proxy, a, b) = two_nodes_carried("join-across-reopen", tweak);
    let (urls, all) = (nats.urls(), f64::from(PARTITIONS));
    let carried = || agg_metric(&a, "cluster_partitions_carried");
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;

    // Pushes into one partition q through agg-2, every 100 ms: the stream goes on while
    // agg-1's other partitions join, so their own consumers (which look at their subject
    // only) are behind the stream's last sequence when they join, and wait to reach it.
    let busy = page_where(0, true, "");
    let q = partition_of(&busy);
    let pushing = Arc::new(AtomicBool::new(true));
    let pusher = {
        let (pushing, grpc, busy) = (Arc::clone(&pushing), b.grpc.clone(), busy.clone());
        std::thread::spawn(move || {
            let rt = runtime();
            let mut version = 1;
            while pushing.load(Ordering::SeqCst) {
                rt.block_on(push_until_answered(
                    &grpc,
                    push(&busy, hour, version, 0..version as u32),
                ));
                version += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    // C opened again (1): every partition it carried rejoins through its own consumer.
    assert!(
        proxy.end_pulls_of("-live"),
        "premise not reached (not the defect): no pull request of agg-1's live consumer seen"
    );
    wait_until("agg-1's live consumer to drop what it carried", || {
        carried() < all
    });
    // A partition in C's filter but not carried: joined, waiting to be adopted (seen
    // twice, since the metric follows the node's heartbeat).
    let waiting = || {
        let (created, subjects) = live_consumer(&urls[1], &dir, "agg-1");
        let joined = subjects.len() as f64 - 1.0;
        (joined > carried()).then_some((created, subjects))
    };
    let started = Instant::now();
    let (created, joined) = loop {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "premise not reached (not the defect): no partition of agg-1 seen joined and not \
             yet carried"
        );
        if waiting().is_some() {
            std::thread::sleep(Duration::from_millis(700));
            if let Some(seen) = waiting() {
                break seen;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // The stream stops (no delivery of C can be lost when its flow ends), and C is opened
    // again (2), as the same instance, while partitions wait to be adopted.
    pushing.store(false, Ordering::SeqCst);
    pusher.join().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(proxy.end_pulls_of("-live"));
    let live = "hourglass.live".to_string();
    wait_until("agg-1's live consumer to be opened again", || {
        let (_, subjects) = live_consumer(&urls[1], &dir, "agg-1");
        !joined
            .iter()
            .filter(|s| **s != live)
            .all(|s| subjects.contains(s))
    });
    let (again, _) = live_consumer(&urls[1], &dir, "agg-1");
    assert_eq!(
        again, created,
        "premise not reached (not the defect): agg-1's live consumer was made again, not \
         opened again as the same instance"
    );

    // Every partition carried again: each must be in C's filter.
    wait_until_within(
        "agg-1's partitions all carried again",
        Duration::from_secs(120),
        || carried() == all,
    );
    std::thread::sleep(Duration::from_secs(1));
    let (_, subjects) = live_consumer(&urls[1], &dir, "agg-1");
    let missing: Vec<u32> = (0..PARTITIONS)
        .filter(|&p| !subjects.contains(&subject_of(p)))
        .collect();

    // And what they answer: a push into each partition, acknowledged (agg-2 confirms),
    // is in agg-1's answer or agg-1 says it lacks it.
    let mut wrong = Vec::new();
    for p in 0..PARTITIONS {
        let page = (0..)
            .map(|i| format!("after-{p}-{i}"))
            .find(|page| partition_of(page) == p)
            .expect("a page");
        assert_eq!(
            rt.block_on(push_until_answered(&b.grpc, push(&page, hour, 1, 0..1000))),
            vec![Stored]
        );
        let (want, gap) = rt
            .block_on(export(&b.grpc, &page, hour))
            .expect("agg-2 answers");
        assert!(
            !want.is_empty() && gap == 0,
            "agg-2 holds the push into {p}"
        );
        let answer = rt.block_on(export(&a.grpc, &page, hour));
        if !right_or_honest(&answer, &want) {
            wrong.push(format!("partition {p}: {}", describe(&answer, &want)));
        }
    }
    assert!(
        wrong.is_empty() && missing.is_empty(),
        "agg-1 carries every partition through its live consumer, whose filter lacks \
         partitions {missing:?} (it was set back to the live subject when the consumer was \
         opened again, as the same instance, while they were joining it: {joined:?}); its \
         answers over pushes acknowledged since, naming nothing missing: {wrong:?} (q = {q})"
    );
    drop(rt);
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

/// With partitions grouped into fewer subjects, a partition joining the live consumer C
/// often finds its subject in C's filter already (brought in by another partition of it,
/// carried or joining): C then delivers its messages before and after the stream's last
/// sequence L its join reads, and must apply its snapshots in every batch it receives
/// after the partition was marked joining: between the last batch of the partition's own
/// consumer and C's adoption of it, C alone receives its messages, and one C skipped is
/// taken as applied once C carries the partition: the node answers without it, naming
/// nothing missing. Here every partition rejoins C while pushes of new series into all of
/// them flow from two clients (8 partitions in 3 subjects: at least 5 joins find their
/// subject there; new series of new items, so that a later push cannot cover a lost
/// one), each adopted a second after it asked; then agg-1's export of everything (the
/// union of the series) must be agg-2's.
#[test]
fn a_partition_joining_while_its_subject_is_in_the_live_consumer_misses_no_message() {
    let tweak = |c: &mut ClusterConfig| {
        c.max_age = Duration::from_secs(40);
        c.join_hold = Duration::from_secs(2);
        // A second between a partition's last batch through its own consumer and its
        // adoption, in which C alone receives its messages.
        c.adopt_hold = Duration::from_secs(1);
    };
    let (_nats, _dir, proxy, a, b) = two_nodes_carried("join-shared-subject", tweak);
    let all = f64::from(PARTITIONS);
    let carried = || agg_metric(&a, "cluster_partitions_carried");
    let hour = crate::util::this_hour();
    let pushing = Arc::new(AtomicBool::new(true));
    // Each push: 12 new series (every partition, about), through agg-2.
    let pushers: Vec<_> = (0..2)
        .map(|client| push_new_series(client, &b.grpc, hour, Arc::clone(&pushing)))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    // C opened again: every partition rejoins it, one by one, while the pushes go on.
    assert!(
        proxy.end_pulls_of("-live"),
        "premise not reached (not the defect): no pull request of agg-1's live consumer seen"
    );
    wait_until("agg-1's live consumer to drop what it carried", || {
        carried() < all
    });
    wait_until_within(
        "agg-1's partitions all carried again",
        Duration::from_secs(120),
        || carried() == all,
    );
    // Pushes after every join too, then none.
    std::thread::sleep(Duration::from_secs(2));
    pushing.store(false, Ordering::SeqCst);
    let pushes: u32 = pushers.into_iter().map(|p| p.join().unwrap()).sum();
    assert!(
        pushes > 20,
        "premise not reached (not the defect): {pushes} pushes"
    );
    let rt = runtime();
    let (want, gap) = rt
        .block_on(export_all(&b.grpc, hour))
        .expect("agg-2 answers");
    assert!(!want.is_empty() && gap == 0, "agg-2 holds every push");
    // Settled, agg-1 answers for everything: the same bytes.
    let mut answer = rt.block_on(export_all(&a.grpc, hour));
    let started = Instant::now();
    while !matches!(&answer, Ok((_, 0))) && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        answer = rt.block_on(export_all(&a.grpc, hour));
    }
    assert!(
        matches!(&answer, Ok((got, 0)) if *got == want),
        "agg-1 answers without pushes acknowledged while its partitions rejoined a live \
         consumer already delivering their subjects: {} ({pushes} pushes)",
        describe(&answer, &want)
    );
}

/// Pushes from `client`, through `grpc`, 12 new series at a time (a push every 100 ms
/// or so), each of 20 items of
/// its own (so that the export of all series, their union, lacks some without any one
/// of them), until `pushing` is false; returns how many pushes it made.
fn push_new_series(
    client: u32,
    grpc: &str,
    hour: u32,
    pushing: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u32> {
    let grpc = grpc.to_string();
    std::thread::spawn(move || {
        let rt = runtime();
        let mut n = 0u32;
        while pushing.load(Ordering::SeqCst) {
            let items = |k: u32| {
                let first = ((client * 100_000 + n) * 12 + k) * 20;
                first..first + 20
            };
            let mut request = push(&format!("c{client}-{n}-0"), hour, 1, items(0));
            for k in 1..12 {
                let page = format!("c{client}-{n}-{k}");
                request
                    .snapshots
                    .extend(push(&page, hour, 1, items(k)).snapshots);
            }
            rt.block_on(push_until_answered(&grpc, request));
            n += 1;
            // About 10 pushes a second a client: enough in each adoption's second, and a
            // share of the machine for the tests running beside.
            std::thread::sleep(Duration::from_millis(100));
        }
        n
    })
}
