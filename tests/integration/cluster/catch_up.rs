//! Catching up by subject (DESIGN §10, "catching up by subject"): the partitions of one
//! subject far behind read it once, together, through a consumer made for the read.

use std::time::{Duration, Instant};

use crate::nats::NatsCluster;
use crate::natsfaults::*;
use crate::util::{TempDir, runtime};

/// A read by subject takes what its consumer delivers one after another as every message
/// of the subject in between, and counts on the consumer's numbering never starting over
/// (a server restarted, a leader change): the DESIGN has it "replicated and acknowledged
/// as the node's own". A consumer made with a name and no durable name is ephemeral to
/// JetStream, which places it on one server (R1) on a limits stream unless it is told its
/// replicas: its state is then that one server's alone, and while that server is down the
/// read cannot go on. So the read's consumer, seen while a new node reads, must have the
/// stream's replicas.
#[test]
fn the_consumer_of_a_read_by_subject_is_replicated_as_the_stream() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("catch-up-replicated");
    let urls = nats.urls();
    let a = node(&dir, urls.clone(), "agg-1", |_| {});
    let hour = crate::util::this_hour();
    let rt = runtime();
    for i in 0..40 {
        rt.block_on(push_until_answered(
            &a.grpc,
            push(&format!("/catch-up-{i}"), hour, 1, 0..10),
        ));
    }
    // agg-2, a new store, applies slowly: its reads last long enough to be looked at.
    let seen = std::thread::scope(|scope| {
        let b = scope.spawn(|| {
            node(&dir, vec![urls[1].clone()], "agg-2", |c| {
                c.apply_delay = Duration::from_millis(100);
            })
        });
        let started = Instant::now();
        let mut seen = None;
        while seen.is_none() && started.elapsed() < Duration::from_secs(60) && !b.is_finished() {
            let consumer_file = std::path::Path::new(&dir.file("agg-2")).join("cluster-consumer");
            if consumer_file.exists() {
                let durable = durable_of(&dir, "agg-2");
                seen = (0..SUBJECTS).find_map(|k| {
                    let name = format!("{durable}-catch-up-{k}");
                    js_api(
                        &urls[0],
                        &format!("$JS.API.CONSUMER.INFO.{STREAM}.{name}"),
                        "",
                    )
                    .ok()
                    // Once it has a leader: its placement is known.
                    .filter(|info| info["cluster"]["leader"].is_string())
                    .map(|info| (name, info["cluster"].clone()))
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(b.join().expect("agg-2 starts"));
        seen
    });
    let (name, cluster) = seen.expect("agg-2 read a subject through a consumer of its own");
    // Its servers: its leader and its replicas.
    let servers: std::collections::BTreeSet<&str> = cluster["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .chain([&cluster["leader"]])
        .filter_map(|server| server.get("name").or(Some(server)).and_then(|n| n.as_str()))
        .collect();
    let replicas = servers.len();
    assert_eq!(
        replicas, 3,
        "the read's consumer {name} is on {replicas} server(s) of the stream's 3: {cluster}"
    );
    drop(a);
}
