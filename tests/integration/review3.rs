//! Review of 28e8367 (a node vouches only for its own record of what it applied: per
//! subject, the consumer instance, the last delivery it received and applied, and its
//! stream position, kept in the store). Each test demonstrates a suspected defect and
//! fails while it is there.
//!
//! The NATS proxy that drops chosen protocol messages, and the JetStream, node, push and
//! export helpers, are `natsfaults.rs`, shared with `review2.rs`.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use crate::faults::{agg_metric, wait_until};
use crate::nats::NatsCluster;
use crate::natsfaults::*;
use crate::util::{TempDir, runtime};
use hourglass_aggregator::cluster::ClusterConfig;
use hourglass_rpc::proto::v1;

// ---------------------------------------------------------------------------------------
// The tests.

/// The metadata a consumer update carries when `open` marks a store incomplete
/// (`mark_complete(.., false)`, apply.rs), as async-nats serializes it.
const MARKED_INCOMPLETE: &str = "\"hourglass.complete\":\"false\"";

/// Whether an answer for `page` is honest, given the answer `want` of a node that holds
/// every acknowledged push: the same bytes, a missing partition named, or a refusal.
fn honest(answer: &Result<(Vec<u8>, u32), tonic::Status>, want: &[u8]) -> bool {
    match answer {
        Ok((got, missing)) => got == want || *missing > 0,
        Err(s) => s.code() == tonic::Code::Unavailable,
    }
}

/// `open` (apply.rs) makes a consumer again from the store's position (`Behind`/`Other`)
/// with `consumer_config(from, marked)` — the *old* completeness mark, "true" — records
/// the new instance as followed (`cluster.follow`), and only then finds the stream
/// starts after that position and writes the mark "false" (`mark_complete`). JetStream
/// starts the new consumer at the stream's first message, so it reports as delivered
/// (`delivered.stream_seq`) the sequence just before it, past what the store lacks.
///
/// If anything fails between `follow` and the mark (here the consumer update is lost
/// on the way and times out; equally a SIGKILL there, or `stream_first` failing), the
/// next `open` finds the very instance it follows, with no delivery, and
/// `barrier::vouched` gives `All { at: first - 1 }`: `held + 1 >= first`, the mark still
/// "true", so the store is taken as complete, nothing is copied, and the node answers
/// for the partition without the messages the stream dropped.
///
/// The scenario is review2's lost delivery: agg-1's deliveries of partition p are lost
/// until the stream dropped M1 (agg-2 applied it); agg-1's consumer updates that mark it
/// incomplete are lost throughout.
#[test]
fn review3_a_consumer_made_again_past_a_gap_is_trusted_complete_when_its_mark_is_lost() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review3-lost-mark");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let max_age = Duration::from_secs(10);
    let tweak = |c: &mut ClusterConfig| {
        c.max_age = max_age;
        c.publish_timeout = Duration::from_secs(2);
    };
    let a = node(&dir, vec![proxy.url()], "agg-1", tweak);
    let b = node(&dir, vec![urls[1].clone(), urls[2].clone()], "agg-2", tweak);
    wait_until("two members, both ready", || {
        agg_metric(&a, "cluster_members") == 2.0
            && agg_metric(&b, "cluster_members") == 2.0
            && ready(&a)
            && ready(&b)
    });
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    let page = "lost-mark";
    let p = partition_of(page);
    let later = page_where(p, true, page);
    let other = page_where(p, false, page);
    let subject = format!("hourglass.p.{p}");

    // From now on agg-1 can never mark a store incomplete (the update is lost).
    proxy.drop_payloads_with(Some(MARKED_INCOMPLETE.to_string()));
    // M1 reaches agg-2, which confirms it; its deliveries to agg-1 are lost.
    proxy.drop_deliveries_of(Some(format!("-p{p}")));
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(page, hour, 1, 0..2000))),
        vec![Stored]
    );
    let s1 = last_of_subject(&urls[1], &subject).expect("M1 in the stream");
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(&other, hour, 1, 0..20))),
        vec![Stored]
    );
    // The stream drops M1.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (_, first, _) = stream_state(&urls[1]);
        if first > s1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "premise not reached (not the defect): the stream did not drop M1 (at {s1}); first = {first}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // agg-1 notices the lost delivery (two idle checks, ~5 s), makes its consumer again
    // past the gap, fails to mark it, and opens it again a second later.
    std::thread::sleep(Duration::from_secs(12));
    proxy.drop_deliveries_of(None);
    // M2, another series of the same partition.
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(&later, hour, 1, 0..10))),
        vec![Stored]
    );
    let (want, missing) = rt
        .block_on(export(&b.grpc, page, hour))
        .expect("agg-2 answers");
    assert!(!want.is_empty() && missing == 0, "agg-2 holds M1");
    let started = Instant::now();
    let mut answers = Vec::new();
    while started.elapsed() < Duration::from_secs(15) {
        let answer = rt.block_on(export(&a.grpc, page, hour));
        answers.push(describe(&answer, &want));
        assert!(
            honest(&answer, &want),
            "agg-1 answers for partition {p} without the acknowledged push M1 (stream sequence \
             {s1}, dropped by max_age before agg-1 applied it), naming nothing missing: its \
             consumer was made again past the gap and, its 'incomplete' mark lost, opened \
             again as complete; agg-1 is {}; answers so far: {answers:?}",
            readiness(&a),
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(rt);
}

/// A node's position is a stream sequence, kept in its store (`cluster/position/`), but
/// nothing records *which stream* it is a position in. When the stream is deleted and
/// made again (an operator recreating it, NATS's JetStream storage lost; a node starting
/// finds none and makes it, `engine.rs`), its sequences start again at 1: the node's
/// consumers are gone, `open` meets a new instance (`Other`) and makes it again from the
/// old position plus one (apply.rs, `DeliverPolicy::ByStartSequence { held + 1 }`), so
/// every message of the new stream up to the old position is never applied, while the
/// old position, the completeness check (`held + 1 >= first`) and the read barrier
/// (`wait_applied`) all pass: the node is ready and answers without them.
#[test]
fn review3_a_position_in_a_deleted_stream_is_trusted_in_the_stream_made_again() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review3-new-stream");
    let urls = nats.urls();
    let a = node(&dir, vec![urls[0].clone()], "agg-1", |_| {});
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    let page = "new-stream";
    let p = partition_of(page);
    let subject = format!("hourglass.p.{p}");
    let live = "hourglass.live".to_string();
    // The first stream: pushes to every partition, the last one to p, so that agg-1's
    // positions in p and in the live subject are well past what the new stream will hold.
    for i in 0..12 {
        let filler = page_where(i % PARTITIONS, true, page);
        assert_eq!(
            rt.block_on(push_until_answered(&a.grpc, push(&filler, hour, 1, 0..10))),
            vec![Stored]
        );
    }
    let old_p = page_where(p, true, page);
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push(&old_p, hour, 1, 0..10))),
        vec![Stored]
    );
    let old_last = stream_state(&urls[1]).2;
    let old_p_seq = last_of_subject(&urls[1], &subject).expect("p's message");
    wait_until("agg-1 to apply the first stream", || {
        consumer_state(&urls[1], &consumer_of(&dir, "agg-1", p))
            .is_some_and(|(delivered, _, pending, _)| delivered >= old_p_seq && pending == 0)
    });
    std::thread::sleep(Duration::from_secs(2));
    rt.block_on(a.stop());

    // The stream is deleted; a new node makes it again, and a push goes into it.
    let deleted = js_api(&urls[1], &format!("$JS.API.STREAM.DELETE.{STREAM}"), "")
        .expect("delete the stream");
    assert_eq!(deleted["success"].as_bool(), Some(true), "{deleted}");
    let b = node(
        &dir,
        vec![urls[1].clone(), urls[2].clone()],
        "agg-2",
        |_| {},
    );
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(page, hour, 1, 0..2000))),
        vec![Stored]
    );
    let new_seq = last_of_subject(&urls[1], &subject).expect("M in the new stream");
    let new_live = last_of_subject(&urls[1], &live).unwrap_or(0);
    assert!(
        new_seq < old_p_seq && new_live < old_last,
        "premise (not the defect): the new stream's sequences ({new_seq}, live {new_live}) are \
         below the old ones ({old_p_seq}, last {old_last})"
    );
    let (want, missing) = rt
        .block_on(export(&b.grpc, page, hour))
        .expect("agg-2 answers");
    assert!(!want.is_empty() && missing == 0, "agg-2 holds M");

    // agg-1 starts again on its store.
    let a = node(&dir, vec![urls[0].clone()], "agg-1", |_| {});
    wait_until("two members, both ready", || {
        agg_metric(&a, "cluster_members") == 2.0
            && agg_metric(&b, "cluster_members") == 2.0
            && ready(&a)
            && ready(&b)
    });
    let started = Instant::now();
    let mut answers = Vec::new();
    while started.elapsed() < Duration::from_secs(10) {
        let answer = rt.block_on(export(&a.grpc, page, hour));
        answers.push(describe(&answer, &want));
        assert!(
            honest(&answer, &want),
            "agg-1, restarted after the stream was deleted and made again, answers without \
             the acknowledged push M (new stream sequence {new_seq}; its position in p from \
             the old stream is {old_p_seq}, live {old_last}), naming nothing missing: it is {}; \
             answers so far: {answers:?}",
            readiness(&a),
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(rt);
}
