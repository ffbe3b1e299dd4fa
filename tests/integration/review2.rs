//! Review of 95ae990 (a consumer reopened after only its acknowledgements were lost counts
//! what it delivered as applied) and of the completeness rule it changes (`apply.rs`,
//! `open`): each test demonstrates a suspected defect, and fails while it is there.
//!
//! Both need a fault no other helper makes: a NATS link that loses *some* protocol
//! messages while passing the rest (a lost acknowledgement, a lost delivery, a lost
//! membership renewal), as happens around a reconnect or a NATS leader election: the
//! proxy of `natsfaults.rs`, which parses the NATS protocol both ways and drops whole
//! messages only, so the connection itself stays healthy.

use std::time::{Duration, Instant};

use crate::faults::{agg_metric, wait_until};
use crate::nats::NatsCluster;
use crate::natsfaults::*;
use crate::util::{TempDir, runtime};
use hourglass_aggregator::cluster::ClusterConfig;
use hourglass_rpc::proto::v1;

// ---------------------------------------------------------------------------------------
// The tests.

/// The case 95ae990 was made for, as it happens on a busy stream: a node applies every
/// message of its partition, its acknowledgement of the last one is lost (here dropped on
/// the way), and its consumers are opened again (here: back in touch after more than
/// `max_age / 2`) once the stream has dropped older messages. The store lacks nothing, so the node must
/// come back ready for the partition; with no other node to copy from, a node that flags
/// itself incomplete never answers for it again.
///
/// 95ae990 counts `delivered` as applied when `applied(p) >= delivered.stream_sequence`,
/// but a consumer of one subject reports as delivered the last sequence it *looked at*,
/// of any subject, whenever a pull request makes it skip more than one message of the
/// others (nats-server records the skip, `updateSkipped`): on a stream that goes on past
/// the partition's last message, `applied(p)` (that message) is below it, the old rule
/// (`seen = ack floor`) applies, and the node is flagged incomplete as before the change.
#[test]
fn a_node_whose_acknowledgements_were_lost_is_complete_when_reopened_after_max_age() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review2-lost-acks");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let max_age = Duration::from_secs(20);
    let a = node(&dir, vec![proxy.url()], "agg-1", |c| {
        c.max_age = max_age;
        c.publish_timeout = Duration::from_secs(2);
    });
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    let page = "lost-acks";
    let p = partition_of(page);
    let other = page_where(p, false, page);
    let subject = format!("hourglass.p.{p}");
    let name = consumer_of(&dir, "agg-1", p);

    // A (partition p) and then C (another partition), acknowledged normally.
    let t0 = Instant::now();
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push(page, hour, 1, 0..100))),
        vec![Stored]
    );
    wait_until("agg-1 to acknowledge A", || {
        consumer_state(&urls[1], &name).is_some_and(|(_, _, pending, _)| pending == 0)
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push(&other, hour, 1, 0..10))),
        vec![Stored]
    );
    // B, a newer version of A's series, applied by agg-1 but its acknowledgement lost.
    std::thread::sleep(Duration::from_secs(10).saturating_sub(t0.elapsed()));
    proxy.drop_acks(true);
    let t_b = Instant::now();
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push(page, hour, 2, 0..3000))),
        vec![Stored]
    );
    let s_b = last_of_subject(&urls[1], &subject).expect("B in the stream");
    // D, in another partition: the stream goes on past p's last message, as a busy one
    // does. (A consumer's reported `delivered` follows what it looked at only when it
    // skips more than one message at once: two here, D's and its live message.)
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push(&other, hour, 2, 0..20))),
        vec![Stored]
    );
    // agg-1 out of touch with the members bucket for longer than max_age / 2 (its
    // renewal's put is dropped): back in touch, it opens every consumer again.
    proxy.drop_kv(true);
    let kv_dropped = Instant::now();
    let out_of_touch = max_age / 2;
    let mut state;
    let premise = loop {
        let (messages, first, last) = stream_state(&urls[1]);
        let consumer = consumer_state(&urls[1], &name);
        state = (messages, first, last, consumer);
        let ok = first == s_b
            && kv_dropped.elapsed() > out_of_touch + Duration::from_millis(1500)
            && consumer.is_some_and(|(delivered, floor, pending, _)| {
                pending >= 1 && delivered > s_b && floor + 1 < first
            });
        if ok {
            break true;
        }
        if t_b.elapsed() > max_age - Duration::from_secs(4) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        premise,
        "premise not reached in time (not the defect): the stream dropped A and C, kept B \
         (at {s_b}), and agg-1's consumer of p{p} has B unacknowledged with its delivered \
         position past B; (messages, first, last, (delivered, floor, ack pending, pending)) = {state:?}"
    );
    proxy.drop_kv(false);
    wait_until("agg-1 to open its consumers again", || {
        agg_metric(&a, "cluster_partitions_ready") < agg_metric(&a, "cluster_partitions_applying")
    });
    // Until each consumer has read its position; then acknowledgements pass again.
    std::thread::sleep(Duration::from_secs(3));
    proxy.drop_acks(false);
    // Ready again at the latest when JetStream redelivers B (ACK_WAIT, 60 s after B).
    let deadline = t_b + Duration::from_secs(95);
    let answer = loop {
        let answer = rt.block_on(export(&a.grpc, page, hour));
        let good = ready(&a) && matches!(&answer, Ok((bytes, 0)) if !bytes.is_empty());
        if good || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        ready(&a) && matches!(&answer, Ok((bytes, 0)) if !bytes.is_empty()),
        "agg-1 applied every message of partition {p} (A at the start, B at {s_b}; only B's \
         acknowledgement was lost) yet, reopened after the stream dropped A, it does not come \
         back ready for it {:?} after B: {}; its answer for the series: {}; consumer \
         (delivered, floor, ack pending, pending) = {:?}, as it was before the reopen: {state:?}",
        t_b.elapsed(),
        readiness(&a),
        match &answer {
            Ok((bytes, missing)) =>
                format!("{} bytes, partitions_missing = {missing}", bytes.len()),
            Err(s) => format!("refused: {s}"),
        },
        consumer_state(&urls[1], &name),
    );
    drop(rt);
}

/// A delivery lost on the way (a reconnect, a NATS leader election) that the stream drops
/// (`max_age`) before the consumer's next delivery reveals the gap: JetStream then removes
/// it from the consumer's pending deliveries as if acknowledged ("Message deleted by
/// stream limits", `decStreamPending` → `processTerm` in nats-server) and moves the ack
/// floor to what the consumer reports delivered, which on a stream that went on is past
/// it (here a push to another partition follows). The gap reopens the consumer from that floor (`apply.rs`, `open`), which
/// now vouches for the lost message: the node takes itself as complete, applies on, and
/// answers for the partition without an acknowledged push, naming nothing missing. (The
/// other owner holds the push: an honest node refuses, leaves the partition to it, or
/// copies.) A node may also notice the lost delivery by itself before M2 (its idle
/// consumer reports a delivery it never received) and make its consumer again from its
/// own position: the premise then sees that new consumer, nothing pending and its floor
/// where it started; what is checked after is the same.
#[test]
fn a_delivery_lost_then_dropped_by_max_age_is_never_vouched_for_by_the_ack_floor() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review2-lost-delivery");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let max_age = Duration::from_secs(10);
    let tweak = |c: &mut ClusterConfig| c.max_age = max_age;
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
    let page = "lost-delivery";
    let p = partition_of(page);
    let later = page_where(p, true, page);
    let subject = format!("hourglass.p.{p}");
    let name = consumer_of(&dir, "agg-1", p);

    // M1 reaches agg-2 (which confirms it) but its delivery to agg-1 is lost.
    proxy.drop_deliveries_of(Some(format!("-p{p}")));
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(page, hour, 1, 0..2000))),
        vec![Stored]
    );
    let s1 = last_of_subject(&urls[1], &subject).expect("M1 in the stream");
    // D, in another partition: the stream goes on (agg-1's consumer of p looks past it at
    // its next pull request, and reports that as delivered).
    let other = page_where(p, false, page);
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(&other, hour, 1, 0..20))),
        vec![Stored]
    );
    // The stream drops it; JetStream forgets agg-1 never acknowledged it (at once when
    // the stream drops it, at the latest when its ack floor check runs, about 2 min).
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut seen;
    let forgotten = loop {
        let (_, first, _) = stream_state(&urls[1]);
        let consumer = consumer_state(&urls[1], &name);
        seen = (first, consumer);
        if first > s1 && consumer.is_some_and(|(_, _, pending, _)| pending == 0) {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        forgotten,
        "premise not reached (not the defect): the stream dropped M1 (at {s1}) and agg-1's \
         consumer no longer counts it pending (its ack floor past it, or made again); \
         (first, (delivered, floor, ack pending, pending)) = {seen:?}"
    );
    let after_drop = consumer_state(&urls[1], &name);
    proxy.drop_deliveries_of(None);
    // M2, another series of the same partition: agg-1's next delivery shows the gap.
    assert_eq!(
        rt.block_on(push_until_answered(&b.grpc, push(&later, hour, 1, 0..10))),
        vec![Stored]
    );
    let (want, _) = rt
        .block_on(export(&b.grpc, page, hour))
        .expect("agg-2 answers");
    // Watch agg-1's answers until it has been ready for a while.
    let started = Instant::now();
    let mut ready_since: Option<Instant> = None;
    let mut answers = Vec::new();
    loop {
        let answer = rt.block_on(export(&a.grpc, page, hour));
        let honest = match &answer {
            Ok((got, missing)) => *got == want || *missing > 0,
            Err(s) => s.code() == tonic::Code::Unavailable,
        };
        answers.push(match &answer {
            Ok((got, missing)) => format!(
                "{} bytes (agg-2: {}), partitions_missing = {missing}",
                got.len(),
                want.len()
            ),
            Err(s) => format!("refused: {}", s.code()),
        });
        assert!(
            honest,
            "agg-1 answers without the acknowledged push visits{{page={page}}} (M1, stream \
             sequence {s1}) whose delivery to it was lost and which the stream then dropped: \
             {:?} after M2; its consumer of p{p} after the drop (delivered, floor, ack pending, \
             pending) = {after_drop:?}; it is {}; answers so far: {answers:?}",
            started.elapsed(),
            readiness(&a),
        );
        if ready(&a) {
            let since = *ready_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(10) {
                break;
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(rt);
}
