//! Review 5 of cluster mode (DESIGN §10): each test demonstrates a suspected defect and
//! fails while it is there. The NATS, node, push and export helpers are `natsfaults.rs`.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use crate::faults::wait_until;
use crate::nats::NatsCluster;
use crate::natsfaults::*;
use crate::util::{TempDir, runtime};

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
fn review5_a_node_answers_again_after_the_stream_is_made_again_without_a_new_push() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("review5-remade-stream");
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
    let durable = {
        let path = std::path::Path::new(&dir.file("agg-1")).join("cluster-consumer");
        std::fs::read_to_string(&path)
            .expect("consumer file")
            .trim()
            .to_string()
    };
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
