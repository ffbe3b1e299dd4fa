//! A stream deleted and made again (an operator recreating it, NATS's JetStream storage
//! lost; a node starting finds none and makes it, `engine.rs`): its sequences start again
//! at 1, so a node's positions in the old stream vouch for nothing in the new one, and
//! what the old stream's live messages required of a partition is not required in the
//! new one.
//!
//! Where a test's doc tells how a node answered wrongly under its faults, that is what the
//! test keeps out: it fails if the node does so again.

use std::time::{Duration, Instant};

use crate::faults::{agg_metric, wait_until};
use crate::nats::NatsCluster;
use crate::natsfaults::*;
use crate::util::{TempDir, runtime};
use hourglass_rpc::proto::v1;

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
fn a_position_in_a_deleted_stream_is_not_trusted_in_the_stream_made_again() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("remade-stream-position");
    let urls = nats.urls();
    // p stays with its own consumer, whose state the test reads.
    let a = node(&dir, vec![urls[0].clone()], "agg-1", |c| {
        c.own_partition_consumers = true
    });
    let hour = crate::util::this_hour();
    let rt = runtime();
    use v1::PushOutcome::Stored;
    let page = "new-stream";
    let p = partition_of(page);
    let subject = subject_of(p);
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
    // p stays with its own consumer, whose state the test reads.
    let a = node(&dir, vec![urls[0].clone()], "agg-1", |c| {
        c.own_partition_consumers = true
    });
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
            right_or_honest(&answer, &want),
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

/// Read-barrier requirements are now kept per stream instance (`barrier::Required`), and
/// a partition named by live messages of another instance than the one its position
/// counts in is "not answered for" (`required` → `None` → `pass` puts it in `behind`).
/// `Required.stream` changes only in `require`, i.e. when a live message is applied: when
/// the stream is deleted and made again, the node's consumers reopen in the new instance
/// (positions start over, `load_position`), but until some push is applied from the new
/// stream's live subject, every partition the old live messages named is refused — with
/// nothing missing (no push was ever acknowledged in the new instance, and the store
/// holds everything of the old one). In a quiet cluster that is forever.
///
/// Here: one node, one push (its live message names partition p), the stream deleted and
/// made again with the same configuration, no push since. The node should answer p
/// completely once its consumers run on the new stream.
#[test]
fn a_node_answers_again_after_the_stream_is_made_again_without_a_new_push() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("remade-stream-no-push");
    let urls = nats.urls();
    let a = node(&dir, vec![urls[0].clone()], "agg-1", |_| {});
    let hour = crate::util::this_hour();
    let rt = runtime();
    use hourglass_rpc::proto::v1::PushOutcome::Stored;
    let page = "remade";
    let p = partition_of(page);
    assert_eq!(
        rt.block_on(push_until_answered(&a.grpc, push(page, hour, 1, 0..500))),
        vec![Stored]
    );
    let mut want = Vec::new();
    wait_until("agg-1 to answer the push", || {
        match rt.block_on(export(&a.grpc, page, hour)) {
            Ok((got, 0)) if !got.is_empty() => {
                want = got;
                true
            }
            _ => false,
        }
    });

    // The stream deleted and made again with the very same configuration.
    let info = js_api(&urls[1], &format!("$JS.API.STREAM.INFO.{STREAM}"), "").expect("info");
    let config = info["config"].to_string();
    let deleted = js_api(&urls[1], &format!("$JS.API.STREAM.DELETE.{STREAM}"), "")
        .expect("delete the stream");
    assert_eq!(deleted["success"].as_bool(), Some(true), "{deleted}");
    std::thread::sleep(Duration::from_secs(1));
    let created = js_api(
        &urls[1],
        &format!("$JS.API.STREAM.CREATE.{STREAM}"),
        &config,
    )
    .expect("make the stream again");
    assert!(created.get("error").is_none(), "{created}");

    // Premise: the node's consumers of p and of the live subject run on the new stream.
    let durable = durable_of(&dir, "agg-1");
    let reopened = Instant::now();
    let mut premise = false;
    while reopened.elapsed() < Duration::from_secs(60) {
        if consumer_state(&urls[1], &format!("{durable}-p{p}")).is_some()
            && consumer_state(&urls[1], &format!("{durable}-live")).is_some()
            && ready(&a)
        {
            premise = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        premise,
        "premise not reached (not the defect): agg-1's consumers did not reopen on the new \
         stream within 60 s ({})",
        readiness(&a)
    );

    // No push since: the node holds everything, nothing was acknowledged in the new
    // instance. It should answer p completely.
    let started = Instant::now();
    let mut answers = Vec::new();
    let mut answered = false;
    while started.elapsed() < Duration::from_secs(30) {
        let answer = rt.block_on(export(&a.grpc, page, hour));
        let text = describe(&answer, &want);
        if answers.last() != Some(&text) {
            answers.push(text);
        }
        if matches!(&answer, Ok((got, 0)) if *got == want) {
            answered = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // Diagnosis: one push to another partition (a live message of the new instance
    // resets the requirements) should unblock it.
    let mut after_push = String::from("(not tried)");
    if !answered {
        let other = page_where((p + 1) % PARTITIONS, true, page);
        let _ = rt.block_on(push_until_answered(&a.grpc, push(&other, hour, 1, 0..5)));
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(15) {
            let answer = rt.block_on(export(&a.grpc, page, hour));
            after_push = describe(&answer, &want);
            if matches!(&answer, Ok((got, 0)) if *got == want) {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    assert!(
        answered,
        "30 s after the stream was made again (consumers running on it, node ready: {}), \
         with no push since, agg-1 still does not answer partition {p} (its requirement \
         counts in the deleted instance: barrier::required -> None); answers: {answers:?}; \
         after one push to another partition: {after_push}",
        readiness(&a)
    );
    drop(rt);
}

/// A node takes the stream's layout (how its partitions are grouped into subjects) when
/// it starts (`ensure_stream` in `engine.rs` sets `cluster.subjects` from the stream's
/// metadata). A stream made before the grouping has one subject a partition, and a node
/// leaving `cluster.subjects` out takes that; a node that makes the stream again with the
/// same configuration groups the partitions into 8 subjects. A node still running on the
/// old layout (agg-1) would publish partition p (p >= 8) on `hourglass.p.{p}`, a subject
/// no consumer of the nodes on the new layout delivers, while its live message names p's
/// position for their read barrier: they would answer for p without the acknowledged
/// push, naming nothing missing. Its consumers, opening on the stream made again, find
/// the other layout: from then on it refuses every push (UNAVAILABLE, saying why), and
/// any push it acknowledged before is in the other nodes' answers or they say they lack
/// it.
#[test]
fn a_running_node_does_not_misread_a_stream_made_again_with_its_partitions_grouped() {
    const P: u32 = 16;
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("remade-stream-layout");
    let urls = nats.urls();
    make_stream_of_one_subject_a_partition(&urls[1], P);
    // Both nodes with the defaults but for the partition count: cluster.subjects left out.
    let defaults = |c: &mut hourglass_aggregator::cluster::ClusterConfig| {
        c.partitions = P;
        c.subjects = None;
    };
    let a = node(&dir, vec![urls[0].clone()], "agg-1", defaults);
    let hour = crate::util::this_hour();
    let rt = runtime();

    // The stream is deleted; agg-2, starting, makes it again (8 subjects now).
    let deleted = js_api(&urls[1], &format!("$JS.API.STREAM.DELETE.{STREAM}"), "")
        .expect("delete the stream");
    assert_eq!(deleted["success"].as_bool(), Some(true), "{deleted}");
    std::thread::sleep(Duration::from_secs(1));
    let b = node(
        &dir,
        vec![urls[1].clone(), urls[2].clone()],
        "agg-2",
        defaults,
    );
    let c = node(&dir, vec![urls[2].clone()], "agg-3", defaults);
    let info = js_api(&urls[1], &format!("$JS.API.STREAM.INFO.{STREAM}"), "").expect("info");
    assert_eq!(
        info["config"]["metadata"]["hourglass.subjects"].as_str(),
        Some("8"),
        "premise (not the defect): the stream made again groups its partitions: {}",
        info["config"]["metadata"]
    );
    wait_until("three members, agg-2 and agg-3 ready", || {
        [&a, &b, &c]
            .iter()
            .all(|n| agg_metric(*n, "cluster_members") == 3.0)
            && [&b, &c].iter().all(|n| ready(*n))
    });
    let partition = |page: &str| partition_among(page, P);
    // Pushes through agg-1 of series whose subject moved (p >= 8), until it refuses.
    let (stored, refusal) = push_until_refused(
        &a.grpc,
        hour,
        (0..1000)
            .map(|i| format!("layout-{i}"))
            .filter(|page| partition(page) >= 8),
    );
    assert!(
        refusal.is_some(),
        "agg-1, started on one subject a partition, still publishes 60 s after the stream \
         was made again with its {P} partitions in 8 subjects ({} pushes stored)",
        stored.len()
    );
    // What it acknowledged before is in the others' answers, or they say they lack it
    // (compared with agg-1's answer where it gives one whole, else never empty).
    for page in &stored {
        let want = match rt.block_on(export(&a.grpc, page, hour)) {
            Ok((got, 0)) => got,
            _ => Vec::new(),
        };
        for (node, grpc) in [("agg-2", &b.grpc), ("agg-3", &c.grpc)] {
            let answer = rt.block_on(export(grpc, page, hour));
            let fine = match (&answer, want.is_empty()) {
                (Ok((got, 0)), true) => !got.is_empty(),
                _ => right_or_honest(&answer, &want),
            };
            assert!(
                fine,
                "{node} answers for partition {} without a push agg-1 acknowledged on the \
                 old layout, naming nothing missing: {}",
                partition(page),
                describe(&answer, &want)
            );
        }
    }
    drop(rt);
}

/// Makes the stream through the JetStream API at `url` as a build before the grouping
/// made it: `partitions` partitions, one subject each (asked again while JetStream has no
/// leader yet).
fn make_stream_of_one_subject_a_partition(url: &str, partitions: u32) {
    let config = format!(
        r#"{{"name":"{STREAM}","subjects":["hourglass.>"],"retention":"limits","storage":"file","num_replicas":3,"discard":"old","max_age":{},"metadata":{{"hourglass.partitions":"{partitions}"}}}}"#,
        Duration::from_secs(7 * 86_400).as_nanos()
    );
    wait_until("JetStream to make the stream", || {
        js_api(url, &format!("$JS.API.STREAM.CREATE.{STREAM}"), &config)
            .is_ok_and(|m| m.get("error").is_none())
    });
}

/// Pushes each of `pages` through `grpc`, one at a time, for at most 60 s, until the
/// node refuses one as on a stream made again: the pages it stored meanwhile, and the
/// refusal if it came.
fn push_until_refused(
    grpc: &str,
    hour: u32,
    pages: impl Iterator<Item = String>,
) -> (Vec<String>, Option<String>) {
    let rt = runtime();
    let started = Instant::now();
    let mut stored = Vec::new();
    for page in pages {
        if started.elapsed() > Duration::from_secs(60) {
            break;
        }
        let answer = rt.block_on(async {
            let mut client =
                v1::collector_client::CollectorClient::new(crate::util::channel(grpc).await);
            client.push(push(&page, hour, 1, 0..500)).await
        });
        match answer {
            Ok(r) if r.get_ref().results[0].outcome() == v1::PushOutcome::Stored => {
                stored.push(page)
            }
            Err(s)
                if s.code() == tonic::Code::Unavailable && s.message().contains("made again") =>
            {
                return (stored, Some(s.message().to_string()));
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    (stored, None)
}
