//! What a node vouches for when a consumer opens (`apply.rs`, `open`; DESIGN §10): only
//! its own record of what it applied (per subject, the consumer instance, the last
//! delivery it received and applied, its stream position, kept in the store), never what
//! JetStream reports delivered or acknowledged for it. A store that lacks nothing comes
//! back complete however many acknowledgements were lost; one that lacks what the stream
//! dropped is never taken as complete, whether a delivery or its "incomplete" mark was
//! lost; and an incomplete store with no node to copy from still applies what the stream
//! has.
//!
//! These need a fault no other helper makes: a NATS link that loses *some* protocol
//! messages while passing the rest (a lost acknowledgement, a lost delivery, a lost
//! membership renewal), as happens around a reconnect or a NATS leader election: the
//! proxy of `natsfaults.rs`, which parses the NATS protocol both ways and drops whole
//! messages only, so the connection itself stays healthy.
//!
//! Where a test's doc tells how a node answered wrongly under its faults, that is what the
//! test keeps out: it fails if the node does so again.

use std::time::{Duration, Instant};

use crate::faults::{agg_metric, wait_until};
use crate::nats::NatsCluster;
use crate::natsfaults::*;
use crate::util::{TempDir, channel, runtime};
use hourglass_aggregator::cluster::ClusterConfig;
use hourglass_rpc::proto::v1;

/// The case of lost acknowledgements, as it happens on a busy stream: a node applies every
/// message of its partition, its acknowledgement of the last one is lost (here dropped on
/// the way), and its consumers are opened again (here: back in touch after more than
/// `max_age / 2`) once the stream has dropped older messages. The store lacks nothing, so the node must
/// come back ready for the partition; with no other node to copy from, a node that flags
/// itself incomplete never answers for it again.
///
/// Counting `delivered` as applied when `applied(p) >= delivered.stream_sequence` is not
/// enough: a consumer of one subject reports as delivered the last sequence it *looked at*,
/// of any subject, whenever a pull request makes it skip more than one message of the
/// others (nats-server records the skip, `updateSkipped`): on a stream that goes on past
/// the partition's last message, `applied(p)` (that message) is below it, the old rule
/// (`seen = ack floor`) applies, and the node is flagged incomplete though it lacks nothing.
#[test]
fn a_node_whose_acknowledgements_were_lost_is_complete_when_reopened_after_max_age() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("complete-lost-acks");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let max_age = Duration::from_secs(20);
    let a = node(&dir, vec![proxy.url()], "agg-1", |c| {
        c.max_age = max_age;
        c.publish_timeout = Duration::from_secs(2);
        // p stays with its own consumer, whose state the test reads.
        c.own_partition_consumers = true;
    });
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    let page = "lost-acks";
    let p = partition_of(page);
    let other = page_where(p, false, page);
    let subject = subject_of(p);
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
    let dir = TempDir::new("complete-lost-delivery");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let max_age = Duration::from_secs(10);
    // p stays with its own consumer, whose deliveries the test drops.
    let tweak = |c: &mut ClusterConfig| {
        c.max_age = max_age;
        c.own_partition_consumers = true;
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
    let page = "lost-delivery";
    let p = partition_of(page);
    let later = page_where(p, true, page);
    let subject = subject_of(p);
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

/// The metadata a consumer update carries when `open` marks a store incomplete
/// (`mark_complete(.., false)`, apply.rs), as async-nats serializes it.
const MARKED_INCOMPLETE: &str = "\"hourglass.complete\":\"false\"";

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
/// The scenario is that of
/// [`a_delivery_lost_then_dropped_by_max_age_is_never_vouched_for_by_the_ack_floor`]:
/// agg-1's deliveries of partition p are lost until the stream dropped M1 (agg-2 applied
/// it); agg-1's consumer updates that mark it incomplete are lost throughout.
#[test]
fn a_consumer_made_again_past_a_gap_is_not_trusted_complete_when_its_mark_is_lost() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("complete-lost-mark");
    let urls = nats.urls();
    let proxy = Proxy::to(urls[0].trim_start_matches("nats://").parse().unwrap());
    let max_age = Duration::from_secs(10);
    // p stays with its own consumer, whose deliveries the test drops.
    let tweak = |c: &mut ClusterConfig| {
        c.max_age = max_age;
        c.publish_timeout = Duration::from_secs(2);
        c.own_partition_consumers = true;
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
    let subject = subject_of(p);

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
            right_or_honest(&answer, &want),
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
fn an_incomplete_store_with_no_copy_source_still_applies_what_the_stream_has() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("complete-no-source");
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
    let live_consumer = format!("{}-live", durable_of(&dir, "agg-1"));
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
