//! A node that falls behind by about `max_age`: its consumers deliver in order with no
//! gap in their consumer sequences, yet the stream drops (max_age) messages they have not
//! delivered yet, and a consumer looks past what is gone. The node must not take what
//! its consumers looked at as applied then: it answers right, names what it lacks, or
//! refuses, and it copies what it missed from a node that has it (DESIGN §10). The same
//! holds for a ready node whose link to NATS stalls for longer than `max_age`.

use std::time::{Duration, Instant};

use crate::faults::{JOIN_WAIT, agg_metric, wait_until, wait_until_within};
use crate::nats::NatsCluster;
use crate::natsfaults::*;
use crate::netcut::Link;
use crate::util::{TempDir, runtime};
use hourglass_aggregator::cluster::ClusterConfig;
use hourglass_rpc::proto::v1;

/// `agg-2` applies each message 100 ms late (`apply_delay`, a slow disk) while a burst of
/// pushes, each a new series of partition `p`, goes through `agg-1`: agg-2's consumers
/// hold what JetStream delivered ahead (a pull batch) and fall seconds behind, the stream
/// drops (max_age 2 s) messages they never delivered, and they look past them. While it
/// lags, every answer agg-2 gives is the full one, names a missing partition, or is a
/// refusal; afterwards, with agg-1 gone, agg-2 alone gives the full answer: it found
/// what it missed and copied it.
#[test]
fn a_node_that_falls_behind_by_max_age_copies_what_the_stream_dropped_before_delivering_it() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("lag");
    let urls = nats.urls();
    let max_age = Duration::from_secs(2);
    let fast = node(&dir, urls.clone(), "agg-1", |c: &mut ClusterConfig| {
        c.max_age = max_age;
    });
    let slow = node(&dir, urls.clone(), "agg-2", |c: &mut ClusterConfig| {
        c.max_age = max_age;
        // Slow enough to fall max_age behind even when a loaded machine pushes the
        // burst slowly.
        c.apply_delay = Duration::from_millis(200);
        // p stays with its own consumer, whose state the test reads.
        c.own_partition_consumers = true;
    });
    wait_until_within("two members, both ready", JOIN_WAIT, || {
        agg_metric(&fast, "cluster_members") == 2.0
            && agg_metric(&slow, "cluster_members") == 2.0
            && ready(&fast)
            && ready(&slow)
    });
    let hour = crate::util::this_hour();
    let p = partition_of("lag-0");
    let pages: Vec<String> = (0..)
        .map(|i| format!("lag-{i}"))
        .filter(|page| partition_of(page) == p)
        // Enough that the pushes run more than MAX_ACK_PENDING (256) ahead of what the
        // slow node acknowledges (5 a second) even when a loaded machine takes a minute
        // over them: only then do undelivered messages age out.
        .take(800)
        .collect();
    let slow_consumer = consumer_of(&dir, "agg-2", p);

    // The burst, eight pushes at a time, while watching for the premise: the stream
    // starts after what agg-2's consumer of p delivered while it has more to deliver.
    let burst = std::thread::spawn({
        let grpc = fast.grpc.clone();
        let pages = pages.clone();
        move || {
            let rt = runtime();
            for (chunk, pages) in pages.chunks(8).enumerate() {
                let outcomes = rt.block_on(async {
                    let pushes: Vec<_> = pages
                        .iter()
                        .enumerate()
                        .map(|(i, page)| {
                            let base = ((chunk * 8 + i) * 10) as u32;
                            let (grpc, request) =
                                (grpc.clone(), push(page, hour, 1, base..base + 10));
                            tokio::spawn(async move { push_until_answered(&grpc, request).await })
                        })
                        .collect();
                    let mut outcomes = Vec::new();
                    for push in pushes {
                        outcomes.push(push.await.expect("a push task"));
                    }
                    outcomes
                });
                for outcome in outcomes {
                    assert_eq!(outcome, vec![v1::PushOutcome::Stored]);
                }
            }
        }
    });
    let mut premise = false;
    let mut burst_ended: Option<Instant> = None;
    while !premise && burst_ended.is_none_or(|t| t.elapsed() < Duration::from_secs(20)) {
        if burst_ended.is_none() && burst.is_finished() {
            burst_ended = Some(Instant::now());
        }
        let (_, first, _) = stream_state(&urls[0]);
        if let Some((delivered, _, _, pending)) = consumer_state(&urls[0], &slow_consumer)
            && pending > 0
            && first > delivered + 1
        {
            premise = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    burst.join().expect("the burst of pushes");
    assert!(
        premise,
        "premise not reached (not the defect): the stream never dropped messages of partition {p} that agg-2's consumer had yet to deliver"
    );
    let rt = runtime();
    wait_until("agg-1 to have applied everything", || ready(&fast));
    let (full, missing) = rt
        .block_on(export_all(&fast.grpc, hour))
        .expect("agg-1 answers");
    assert_eq!(missing, 0, "agg-1 holds every push");

    // Every push was acknowledged before these questions: agg-2 answers in full, names
    // what it lacks, or refuses, until it has caught up and copied what it missed.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut answers = 0;
    loop {
        let caught_up = ready(&slow);
        let answer = rt.block_on(export_all(&slow.grpc, hour));
        answers += 1;
        match &answer {
            Ok((got, missing)) => assert!(
                *got == full || *missing > 0,
                "answer {answers} of agg-2 ({}) lacks acknowledged pushes and names no missing partition ({} bytes, the full answer is {}): it took what its consumers looked past as applied",
                readiness(&slow),
                got.len(),
                full.len()
            ),
            Err(s) => assert_eq!(
                s.code(),
                tonic::Code::Unavailable,
                "answer {answers} of agg-2: {s}"
            ),
        }
        // Caught up means ready for its partitions *and* answering in full: its live
        // subject lacks what the stream dropped too, and it answers nothing until it has
        // copied that (every 30 s while agg-1 is there to copy from). Ready alone, agg-1
        // could leave before that copy, with no node left to copy from.
        if caught_up && matches!(&answer, Ok((got, 0)) if *got == full) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "agg-2 did not catch up in 120 s: {}; its last answer: {:?}",
            readiness(&slow),
            answer.as_ref().map(|(got, missing)| (got.len(), *missing))
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // With agg-1 gone, agg-2 alone holds what it answers for.
    drop(fast);
    wait_until("agg-2 alone in the cluster", || {
        agg_metric(&slow, "cluster_members") == 1.0
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match rt.block_on(export_all(&slow.grpc, hour)) {
            Ok((got, 0)) => {
                assert!(
                    got == full,
                    "agg-2 alone answers without the pushes the stream dropped before its consumers delivered them ({} bytes, the full answer is {}): it took what they looked past as applied",
                    got.len(),
                    full.len()
                );
                break;
            }
            other => assert!(
                Instant::now() < deadline,
                "agg-2 alone does not answer in full after 60 s: {other:?}; {}",
                readiness(&slow)
            ),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(rt);
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
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("lag-stall-max-age");
    let urls = nats.urls();
    let tweak = |c: &mut ClusterConfig| {
        c.max_age = Duration::from_secs(3);
        // agg-2 stays a member (and an owner) throughout its stall.
        c.member_ttl = Duration::from_secs(30);
    };
    let link = Link::to(Some(urls[2].trim_start_matches("nats://").parse().unwrap()));
    let a = node(&dir, vec![urls[0].clone(), urls[1].clone()], "agg-1", tweak);
    let b = node(
        &dir,
        vec![format!("nats://{}", link.addr())],
        "agg-2",
        tweak,
    );
    wait_until_within("two members, both ready", JOIN_WAIT, || {
        agg_metric(&a, "cluster_members") == 2.0
            && agg_metric(&b, "cluster_members") == 2.0
            && ready(&a)
            && ready(&b)
    });
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    assert_eq!(
        rt.block_on(push_until_answered(
            &a.grpc,
            push("before", hour, 1, 0..100)
        )),
        vec![Stored]
    );
    wait_until("agg-2 to hold the first push", || {
        let (want, got) = rt.block_on(async {
            (
                export_all(&a.grpc, hour).await,
                export_all(&b.grpc, hour).await,
            )
        });
        matches!((want, got), (Ok(w), Ok(g)) if w == g)
    });
    // agg-2's link to NATS goes silent; a push is acknowledged meanwhile, and the stream
    // drops it (max_age) before the link comes back.
    link.cut(true);
    assert_eq!(
        rt.block_on(push_until_answered(
            &a.grpc,
            push("during", hour, 1, 1000..3000)
        )),
        vec![Stored]
    );
    wait_until("the stream to drop every message", || {
        nats.stream_messages("HOURGLASS") == Some(0)
    });
    std::thread::sleep(Duration::from_secs(2));
    link.cut(false);
    let (want, _) = rt
        .block_on(export_all(&a.grpc, hour))
        .expect("agg-1 answers");
    // agg-2 may refuse for a while (deliveries it lost come back after ACK_WAIT, 60 s);
    // the first answer it gives must be right or name what it lacks.
    let resumed = Instant::now();
    let answer = loop {
        let answer = rt.block_on(export_all(&b.grpc, hour));
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
        let later = rt.block_on(export_all(&b.grpc, hour));
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
