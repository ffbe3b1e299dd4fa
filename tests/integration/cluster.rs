//! Cluster mode (DESIGN §10) against a real 3-node NATS JetStream cluster: the same
//! seeded traffic as the fault tests, pushed to one node, must be answered
//! byte-identically by every node, as by a single aggregator, with and without faults:
//!
//! - no fault; each node applies only the partitions it owns (2 of 3 owners);
//! - the entry node SIGKILLed mid-ingest and restarted;
//! - the NATS server leading the stream SIGKILLed mid-ingest (and restarted later);
//! - a node whose data dir is wiped: it applies its partitions from the stream again;
//! - two of three nodes lost: answers are right or name the missing partitions, and the
//!   survivor takes every partition over;
//! - a node cut off from NATS and the other nodes, then healed.

use std::time::{Duration, Instant};

use crate::faults::{
    JOIN_WAIT, PARTS, agg_metric, assert_same, reference, send_part, start_agent, stored,
    try_stored, wait_shipped, wait_until, wait_until_within,
};
use crate::nats::NatsCluster;
use crate::natsfaults::right_or_honest;
use crate::netcut::Link;
use crate::util::{
    AggregatorAddrs, AggregatorProcess, InProcessAggregator, TempDir, channel, free_port, runtime,
};
use hourglass_rpc::proto::v1::{
    self, collector_client::CollectorClient, query_client::QueryClient,
};

mod barrier;
mod catch_up;
mod completeness;
mod one_consumer;
mod remade_stream;

/// Few partitions keep the tests' stream small; the rule is the same for 64.
const PARTITIONS: u32 = 8;
/// The tests' membership heartbeat and time to live.
const HEARTBEAT: Duration = Duration::from_millis(500);
const MEMBER_TTL: Duration = Duration::from_secs(6);

/// An aggregator in this process that is node `node` of the cluster on `nats`, its data
/// in `dir/data`.
fn node(dir: &TempDir, nats: &NatsCluster, node: &str, data: &str) -> InProcessAggregator {
    node_with(dir, nats, node, data, PARTITIONS)
}

/// Nodes agg-1, agg-2 and agg-3 of `nats`'s cluster, each with its own data dir.
fn three_nodes(dir: &TempDir, nats: &NatsCluster) -> Vec<InProcessAggregator> {
    ["agg-1", "agg-2", "agg-3"]
        .iter()
        .map(|name| node(dir, nats, name, name))
        .collect()
}

/// [`node`] with `partitions` partitions.
fn node_with(
    dir: &TempDir,
    nats: &NatsCluster,
    node: &str,
    data: &str,
    partitions: u32,
) -> InProcessAggregator {
    crate::natsfaults::test_log();
    let mut cluster = hourglass_aggregator::cluster::ClusterConfig::new(node, nats.urls());
    cluster.partitions = partitions;
    cluster.subjects = Some(crate::natsfaults::SUBJECTS);
    // Quick membership, so that a lost node's partitions move within seconds.
    cluster.heartbeat = HEARTBEAT;
    cluster.member_ttl = MEMBER_TTL;
    cluster.catch_up_behind = crate::natsfaults::CATCH_UP_BEHIND;
    let agg = InProcessAggregator::start_with(hourglass_aggregator::Config {
        data_dir: dir.file(data).into(),
        cluster: Some(cluster),
        ..Default::default()
    });
    wait_ready(&agg);
    agg
}

/// Waits until `node` is a member, applies partitions and is ready for all of them
/// (before, a push to it may be UNAVAILABLE: no ready owner).
fn wait_ready(node: &dyn AggregatorAddrs) {
    wait_until_within("the node to join and be ready", JOIN_WAIT, || {
        let applying = agg_metric(node, "cluster_partitions_applying");
        agg_metric(node, "cluster_members") > 0.0
            && applying > 0.0
            && agg_metric(node, "cluster_partitions_ready") == applying
    });
}

/// A config file that makes an aggregator process node `node` of the cluster on `nats`.
fn config_file(dir: &TempDir, nats: &NatsCluster, node: &str) -> String {
    let path = dir.file(&format!("{node}.toml"));
    let urls: Vec<String> = nats.urls().iter().map(|u| format!("{u:?}")).collect();
    std::fs::write(
        &path,
        format!(
            "[cluster]\nnode = \"{node}\"\nnats = [{}]\npartitions = {PARTITIONS}\nsubjects = {}\nheartbeat = \"{}ms\"\nmember_ttl = \"{}s\"\n",
            urls.join(", "),
            crate::natsfaults::SUBJECTS,
            HEARTBEAT.as_millis(),
            MEMBER_TTL.as_secs()
        ),
    )
    .unwrap();
    path
}

/// Waits until each of `nodes` applies partitions, is ready for all of them and has no
/// message of them left to apply, twice a heartbeat apart.
fn wait_applied(nodes: &[&dyn AggregatorAddrs]) {
    let settled = || {
        nodes.iter().all(|n| {
            let applying = agg_metric(*n, "cluster_partitions_applying");
            applying > 0.0
                && agg_metric(*n, "cluster_partitions_ready") == applying
                && agg_metric(*n, "cluster_pending") == 0.0
        })
    };
    for _ in 0..2 {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !settled() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the nodes to apply the stream: {}",
                nodes
                    .iter()
                    .map(|n| crate::natsfaults::readiness(*n))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(HEARTBEAT * 2);
    }
}

/// Pushes `request` to `agg` until it answers other than UNAVAILABLE (a node serves once
/// it has joined the stream, and answers a publish it has not applied yet UNAVAILABLE).
async fn push_until_answered(
    agg: &InProcessAggregator,
    request: v1::PushRequest,
) -> Vec<v1::PushOutcome> {
    loop {
        match push_when_ready(agg, request.clone()).await {
            Ok(outcomes) => return outcomes,
            Err(s) if s.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(s) => panic!("push refused: {s}"),
        }
    }
}

/// Pushes `request` with `c` until it is answered other than UNAVAILABLE (which
/// acknowledges nothing: no ready owner yet).
async fn push_retrying(
    c: &mut CollectorClient<tonic::transport::Channel>,
    request: &v1::PushRequest,
) {
    loop {
        match c.push(request.clone()).await {
            Ok(_) => return,
            Err(s) if s.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(s) => panic!("push refused: {s}"),
        }
    }
}

/// Pushes `request` to `agg` once, connecting as soon as it listens.
async fn push_when_ready(
    agg: &InProcessAggregator,
    request: v1::PushRequest,
) -> Result<Vec<v1::PushOutcome>, tonic::Status> {
    let mut c = loop {
        match CollectorClient::connect(agg.grpc.clone()).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    c.push(request)
        .await
        .map(|r| r.into_inner().results.iter().map(|r| r.outcome()).collect())
}

/// Waits until `node`'s Export and answers equal the single aggregator's (the nodes that
/// own the partitions apply them), then requires it, and that no message was refused.
fn assert_applied_same(name: &str, node: &impl AggregatorAddrs) {
    let want = reference();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while std::time::Instant::now() < deadline {
        if try_stored(node).as_ref() == Ok(want) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_same(&stored(node));
    assert_eq!(
        agg_metric(node, r#"cluster_applied_total{outcome="refused"}"#),
        0.0,
        "{name} refused messages"
    );
}

#[test]
fn a_push_to_one_node_is_answered_by_every_node_byte_identically() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-apply");
    let nodes: Vec<InProcessAggregator> = three_nodes(&dir, &nats);
    // The agent pushes to the first node only.
    let agent = start_agent(&dir, &nodes[0].grpc, "agent");
    for p in 0..PARTS {
        send_part(&agent, p);
    }
    wait_shipped(&agent);
    for (i, n) in nodes.iter().enumerate() {
        assert_applied_same(&format!("node {}", i + 1), n);
    }
    assert_eq!(
        agg_metric(&nodes[1], "cluster_published_messages_total"),
        0.0,
        "only the node pushed to publishes"
    );

    // A node replaced by one with an empty data dir (same name) applies its partitions
    // from the stream's start, instead of resuming where the old store was: each subject
    // read once for the partitions of it the node owns (DESIGN §10, "catching up by
    // subject"), then through consumers of its own; once the others are gone it answers
    // everything from its own store.
    let mut nodes = nodes;
    drop(nodes.remove(2));
    let fresh = node(&dir, &nats, "agg-3", "agg-3-replaced");
    wait_applied(&[&fresh]);
    assert!(agg_metric(&fresh, "cluster_applied_snapshots_total") > 0.0);
    let published = agg_metric(&nodes[0], "cluster_published_messages_total");
    let read = agg_metric(&fresh, "cluster_caught_up_messages_total");
    assert!(
        read > 0.0 && read < published,
        "the replaced node read {read} messages by subject of the {published} published"
    );
    drop(nodes);
    assert_applied_same("the replaced node 3, alone", &fresh);
    // Stopped, the others took their keys out of the members bucket, or they expire
    // after member_ttl (a removal lost under load).
    wait_until("the others gone from the members", || {
        agg_metric(&fresh, "cluster_members") == 1.0
    });
}

/// With 3 nodes and 2 owners per partition, each node applies about 2/3 of the
/// snapshots, every snapshot is applied by exactly its 2 owners, and every node answers
/// for all of them: the same bytes as a single aggregator holding everything.
#[test]
fn each_node_applies_its_partitions_and_answers_for_all() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-share");
    let nodes: Vec<InProcessAggregator> = ["agg-1", "agg-2", "agg-3"]
        .iter()
        .map(|name| node_with(&dir, &nats, name, name, 64))
        .collect();
    let single = InProcessAggregator::start(&dir.file("single"));
    wait_until_within("three members", JOIN_WAIT, || {
        nodes
            .iter()
            .all(|n| agg_metric(n, "cluster_members") == 3.0)
    });
    // A former owner keeps applying a partition until its new owners are ready for it:
    // measured once that hand-over is over, when exactly the 2 owners of each apply it.
    wait_until("each partition applied by its 2 owners only", || {
        let applying: f64 = nodes
            .iter()
            .map(|n| agg_metric(n, "cluster_partitions_applying"))
            .sum();
        applying == 2.0 * 64.0
    });
    // Then each node applies what it owns through one replicated consumer (DESIGN §10):
    // its live consumer's filter holds the live subject and the subject of every
    // partition it applies (about 43 of 64 here, in every one of the 3 subjects).
    wait_until(
        "each node's partitions carried by its live consumer",
        || nodes.iter().all(|n| crate::natsfaults::all_carried(n)),
    );
    let mut every_subject: Vec<String> = (0..crate::natsfaults::SUBJECTS)
        .map(crate::natsfaults::subject_of)
        .chain(["hourglass.live".to_string()])
        .collect();
    every_subject.sort();
    for name in ["agg-1", "agg-2", "agg-3"] {
        let (_, mut subjects) = crate::natsfaults::live_consumer(&nats.urls()[0], &dir, name);
        subjects.sort();
        assert_eq!(subjects, every_subject, "{name}");
    }
    let hour = crate::util::this_hour();
    let series = 300u32;
    let request = v1::PushRequest {
        server: web1(),
        snapshots: (0..series)
            .map(|i| {
                let mut s = crate::util::snapshot(
                    "visits",
                    hour,
                    1,
                    v1::SketchKind::Distinct,
                    hll(i * 10..i * 10 + 40),
                );
                s.series.as_mut().unwrap().tags = vec![v1::Tag {
                    key: "page".into(),
                    value: format!("p{i}"),
                }];
                s
            })
            .collect(),
        live_hours: vec![hour],
    };
    let rt = runtime();
    let outcomes = rt.block_on(push_until_answered(&nodes[0], request.clone()));
    assert!(outcomes.iter().all(|o| *o == v1::PushOutcome::Stored));
    rt.block_on(push_until_answered(&single, request));
    wait_applied(&[&nodes[0], &nodes[1], &nodes[2]]);
    let applied: Vec<f64> = nodes
        .iter()
        .map(|n| agg_metric(n, "cluster_applied_snapshots_total"))
        .collect();
    // Each series' partition has 2 owners: 600 applies in all (redeliveries add a few).
    let total: f64 = applied.iter().sum();
    assert!(
        (f64::from(2 * series)..f64::from(2 * series) * 1.05).contains(&total),
        "{applied:?}"
    );
    for a in &applied {
        // 2/3 of 300 is 200; over 64 partitions a node's share varies by ~6%.
        assert!((150.0..=255.0).contains(a), "{applied:?}");
    }
    let want = rt.block_on(async {
        let mut q = QueryClient::new(channel(&single.grpc).await);
        export(&mut q, hour).await
    });
    assert!(!want.is_empty());
    for (i, n) in nodes.iter().enumerate() {
        let got = rt.block_on(async {
            let mut q = QueryClient::new(channel(&n.grpc).await);
            export(&mut q, hour).await
        });
        assert!(
            got == want,
            "node {} answers other bytes than a single aggregator",
            i + 1
        );
    }
    // The status command sees the three members and a ready node for every partition.
    let run = crate::util::hourglass(&["cluster", "status", "--aggregator", &nodes[1].grpc], b"");
    let text = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(run.status.success(), "{text}{}", run.stderr);
    assert!(
        text.starts_with("node agg-2 sees 3 members; 64 partitions in 3 subjects, 2 owners each"),
        "{text}"
    );
    assert!(text.contains("every partition has a ready node"), "{text}");
    assert!(text.contains("stream HOURGLASS: leader "), "{text}");
    let run = crate::util::hourglass(
        &[
            "cluster",
            "status",
            "--aggregator",
            &nodes[0].grpc,
            "--json",
        ],
        b"",
    );
    let status = run.json();
    // Where the stream lives: a leader and two replicas, by their NATS server names.
    let stream = &status["stream"];
    assert_eq!(stream["name"], "HOURGLASS", "{stream}");
    assert!(
        stream["leader"].as_str().is_some_and(|l| !l.is_empty())
            && stream["replicas"].as_array().map(Vec::len) == Some(2),
        "{stream}"
    );
    let partitions = status["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 64);
    assert!(
        partitions
            .iter()
            .all(|p| p["owners"].as_array().unwrap().len() == 2)
    );
    // Not in cluster mode: said plainly.
    let run = crate::util::hourglass(&["cluster", "status", "--aggregator", &single.grpc], b"");
    assert!(!run.status.success());
    assert!(
        run.stderr.contains("is not in cluster mode"),
        "{}",
        run.stderr
    );
}

/// Two of three nodes lost: until the survivor owns and has applied their partitions,
/// an answer is either the right one or names the partitions it lacks; then the
/// survivor alone answers everything.
#[test]
fn queries_while_owners_are_lost_are_right_or_name_the_missing_partitions() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-loss");
    let mut nodes: Vec<InProcessAggregator> = three_nodes(&dir, &nats);
    let agent = start_agent(&dir, &nodes[0].grpc, "agent");
    for p in 0..PARTS {
        send_part(&agent, p);
    }
    wait_shipped(&agent);
    assert_applied_same("node 1", &nodes[0]);
    let survivor = nodes.remove(0);
    drop(nodes);
    let want = reference();
    let (mut right, mut named) = (0, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let got = try_stored(&survivor).expect("the survivor answers");
        if &got == want {
            right += 1;
            if named > 0 || right > 20 {
                break;
            }
        } else {
            // Never a silently different number: a wrong answer names what it lacks.
            let silent = got.silently_unlike(want);
            assert!(
                silent.is_empty(),
                "answers differ without naming a missing partition: {silent:?}"
            );
            named += 1;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the survivor never answered everything"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("answers during the loss: {right} right, {named} naming missing partitions");
    assert_applied_same("the survivor, alone", &survivor);
    assert_eq!(agg_metric(&survivor, "cluster_members"), 1.0);
    assert_eq!(
        agg_metric(&survivor, "cluster_partitions_applying"),
        f64::from(PARTITIONS)
    );
}

#[test]
fn the_entry_node_sigkilled_mid_ingest_loses_nothing_acknowledged() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-kill-entry");
    let listen = format!("127.0.0.1:{}", free_port());
    let config = config_file(&dir, &nats, "agg-1");
    let args = ["--config", config.as_str()];
    let entry = AggregatorProcess::start_on(&listen, &dir.file("agg-1"), &args);
    let other = node(&dir, &nats, "agg-2", "agg-2");
    let agent = start_agent(&dir, &entry.grpc, "agent");
    send_part(&agent, 0);
    send_part(&agent, 1);
    // Pushes are in flight every 200 ms: kill while the agent is shipping part 1.
    std::thread::sleep(Duration::from_millis(150));
    entry.kill();
    send_part(&agent, 2);
    let entry = AggregatorProcess::start_on(&listen, &dir.file("agg-1"), &args);
    send_part(&agent, 3);
    wait_shipped(&agent);
    assert_applied_same("the restarted entry node", &entry);
    assert_applied_same("the other node", &other);
}

/// Three NATS servers and two nodes on them, agg-1 and agg-2, their data in a directory
/// named after `test`.
fn two_nodes(test: &str) -> (NatsCluster, TempDir, Vec<InProcessAggregator>) {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new(test);
    let nodes = ["agg-1", "agg-2"]
        .iter()
        .map(|name| node(&dir, &nats, name, name))
        .collect();
    (nats, dir, nodes)
}

#[test]
fn the_stream_leader_sigkilled_mid_ingest_loses_nothing_acknowledged() {
    let (mut nats, dir, nodes) = two_nodes("cluster-kill-leader");
    let agent = start_agent(&dir, &nodes[0].grpc, "agent");
    send_part(&agent, 0);
    wait_shipped(&agent);
    send_part(&agent, 1);
    let leader = nats.stream_leader("HOURGLASS");
    std::thread::sleep(Duration::from_millis(150));
    nats.kill(leader);
    // Two of three servers keep a quorum: the stream elects a new leader and goes on.
    send_part(&agent, 2);
    send_part(&agent, 3);
    wait_shipped(&agent);
    assert_ne!(
        nats.stream_leader("HOURGLASS"),
        leader,
        "a new leader was elected"
    );
    for (i, n) in nodes.iter().enumerate() {
        assert_applied_same(&format!("node {}", i + 1), n);
    }
    // The killed server returns and catches up from its peers; nothing changes.
    nats.start_node(leader);
    for (i, n) in nodes.iter().enumerate() {
        assert_applied_same(&format!("node {} after the return", i + 1), n);
    }
}

/// A node joining its cluster (here it finds no NATS server: joining waits up to a
/// minute) already answers on its admin port: alive, not ready, with its metrics. Before,
/// the port was bound but served only after the join, so a liveness probe (or a test's
/// wait on `/metrics`) hung meanwhile. Stopped while joining, it ends at once and cleanly
/// (dropping the node fails the test if the server returns an error, as the join's
/// timeout would be).
#[test]
fn a_node_joining_its_cluster_answers_liveness_and_metrics_meanwhile() {
    let dir = TempDir::new("cluster-joining");
    let nowhere = format!("nats://127.0.0.1:{}", free_port());
    let cluster = hourglass_aggregator::cluster::ClusterConfig::new("agg-1", vec![nowhere]);
    let node = InProcessAggregator::start_with(hourglass_aggregator::Config {
        data_dir: dir.file("agg-1").into(),
        cluster: Some(cluster),
        ..Default::default()
    });
    let (status, body) = crate::util::http_get(node.admin, "/healthz");
    assert_eq!((status, body.trim()), (200, "ok"));
    let (status, body) = crate::util::http_get(node.admin, "/readyz");
    assert_eq!(status, 503, "{body}");
    let (status, body) = crate::util::http_get(node.admin, "/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("hourglass_aggregator_"), "{body}");
    drop(node);
}

/// Every NATS server SIGKILLed at once and started again: the stream and the consumers'
/// state are on disk (`sync_interval: always`); pushes meanwhile fail and are retried, and
/// every node ends with everything acknowledged.
#[test]
fn every_nats_server_sigkilled_at_once_loses_nothing_acknowledged() {
    let (mut nats, dir, nodes) = two_nodes("cluster-kill-all-nats");
    let agent = start_agent(&dir, &nodes[0].grpc, "agent");
    send_part(&agent, 0);
    send_part(&agent, 1);
    wait_shipped(&agent);
    wait_applied(&[&nodes[0], &nodes[1]]);
    for i in 0..3 {
        nats.kill(i);
    }
    for i in 0..3 {
        nats.start_node(i);
    }
    for p in 2..PARTS {
        send_part(&agent, p);
    }
    wait_shipped(&agent);
    for (i, n) in nodes.iter().enumerate() {
        assert_applied_same(&format!("node {}", i + 1), n);
    }
}

/// A node cut off from NATS and from the other nodes (its connections go through
/// [`Link`]s that go silent, as a pulled cable does) while the agent keeps pushing through
/// another node: the others keep answering everything right; the cut node either answers
/// right or refuses (it cannot confirm it applied what was acknowledged), never a silently
/// stale number. Healed, it catches up and answers byte-identically to a single
/// aggregator; nothing acknowledged is lost.
#[test]
fn a_node_cut_off_from_nats_and_the_others_answers_right_or_refuses_and_heals() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-cut");
    let a = node(&dir, &nats, "agg-1", "agg-1");
    let b = node(&dir, &nats, "agg-2", "agg-2");
    let to_nats = links_to(&nats);
    let to_x = Link::to(None);
    let mut cluster = hourglass_aggregator::cluster::ClusterConfig::new(
        "agg-x",
        to_nats
            .iter()
            .map(|l| format!("nats://{}", l.addr()))
            .collect(),
    );
    cluster.partitions = PARTITIONS;
    cluster.subjects = Some(crate::natsfaults::SUBJECTS);
    cluster.heartbeat = HEARTBEAT;
    cluster.member_ttl = MEMBER_TTL;
    cluster.peer_timeout = Duration::from_secs(2);
    cluster.advertise = Some(to_x.addr().to_string());
    let x = InProcessAggregator::start_with(hourglass_aggregator::Config {
        data_dir: dir.file("agg-x").into(),
        cluster: Some(cluster),
        ..Default::default()
    });
    to_x.set_target(x.grpc.trim_start_matches("http://").parse().unwrap());
    wait_ready(&x);
    wait_until_within("three members", JOIN_WAIT, || {
        [&a, &b, &x]
            .iter()
            .all(|n| agg_metric(*n, "cluster_members") == 3.0)
    });
    let agent = start_agent(&dir, &a.grpc, "agent");
    send_part(&agent, 0);
    wait_shipped(&agent);
    wait_applied(&[&a, &b, &x]);
    let cut = |on: bool| {
        for link in to_nats.iter().chain([&to_x]) {
            link.cut(on);
        }
    };
    cut(true);
    for p in 1..PARTS - 1 {
        send_part(&agent, p);
    }
    wait_shipped(&agent);
    // During the cut: the others agree with each other; the cut node is right or refuses.
    let want = stored(&b);
    let (mut refused, mut right) = (0, 0);
    for _ in 0..3 {
        assert_eq!(
            stored(&a),
            want,
            "agg-1 and agg-2 answer alike during the cut"
        );
        match try_stored(&x) {
            Ok(got) => {
                assert!(
                    got == want || got.silently_unlike(&want).is_empty(),
                    "the cut node answers stale rows without naming a missing partition: {:?}",
                    got.silently_unlike(&want)
                );
                right += 1;
            }
            Err(e) => {
                assert!(
                    e.contains("Unavailable") || e.contains("cannot confirm"),
                    "{e}"
                );
                refused += 1;
            }
        }
    }
    eprintln!("the cut node during the cut: {refused} refused, {right} right");
    // Its own /metrics say so: no partition answered for, and, past member_ttl, no member
    // seen (not the 3 members and every ready partition of before the cut).
    wait_until(
        "the cut node's metrics to show it answers for nothing",
        || {
            agg_metric(&x, "cluster_partitions_ready") == 0.0
                && agg_metric(&x, "cluster_members") == 0.0
        },
    );
    cut(false);
    send_part(&agent, PARTS - 1);
    wait_shipped(&agent);
    assert_applied_same("agg-1", &a);
    assert_applied_same("agg-2", &b);
    assert_applied_same("the healed agg-x", &x);
}

/// A push and a question through a healthy node are answered while an owner of some of
/// their partitions is cut off (still a member, its key not yet expired): the other owner
/// of each such partition vouches for the push and answers the question. Asked one owner
/// after the other, the entry waited out `peer_timeout` on the cut one first (here 60 s,
/// more than either's deadline).
#[test]
fn a_push_and_a_question_are_answered_by_the_other_owner_while_one_owner_is_cut_off() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-cut-owner");
    // Members for a minute after their last heartbeat, and every wait as long: only the
    // other owners can answer in time.
    let slow_to_forget = |name: &str, nats_urls: Vec<String>, advertise: Option<String>| {
        let mut cluster = hourglass_aggregator::cluster::ClusterConfig::new(name, nats_urls);
        cluster.partitions = PARTITIONS;
        cluster.subjects = Some(crate::natsfaults::SUBJECTS);
        cluster.heartbeat = HEARTBEAT;
        cluster.member_ttl = Duration::from_secs(60);
        cluster.peer_timeout = Duration::from_secs(60);
        cluster.publish_timeout = Duration::from_secs(60);
        cluster.advertise = advertise;
        InProcessAggregator::start_with(hourglass_aggregator::Config {
            data_dir: dir.file(name).into(),
            cluster: Some(cluster),
            ..Default::default()
        })
    };
    let a = slow_to_forget("agg-1", nats.urls(), None);
    let b = slow_to_forget("agg-2", nats.urls(), None);
    let to_nats = links_to(&nats);
    let to_x = Link::to(None);
    let x = slow_to_forget(
        "agg-x",
        to_nats
            .iter()
            .map(|l| format!("nats://{}", l.addr()))
            .collect(),
        Some(to_x.addr().to_string()),
    );
    to_x.set_target(x.grpc.trim_start_matches("http://").parse().unwrap());
    // Three nodes joining one after another hand partitions over; under the whole
    // suite's load that has taken more than wait_until's minute.
    wait_until_within(
        "the three nodes to join and become ready",
        Duration::from_secs(240),
        || {
            [&a, &b, &x].iter().all(|n| {
                agg_metric(*n, "cluster_members") == 3.0
                    && agg_metric(*n, "cluster_partitions_applying") > 0.0
                    && agg_metric(*n, "cluster_partitions_ready")
                        == agg_metric(*n, "cluster_partitions_applying")
            })
        },
    );
    let metrics: Vec<String> = (0..24).map(|i| format!("m{i}")).collect();
    let names: Vec<&str> = metrics.iter().map(String::as_str).collect();
    let request = crate::util::push_of_metrics("web-1", &names);
    // The premise: some partition of the push is x's first and not the entry's at all.
    let owners = runtime().block_on(owners_seen_by(&a.grpc));
    let x_first = request.snapshots.iter().find_map(|s| {
        let metric = s.series.as_ref().unwrap().metric.clone();
        let name = hourglass_aggregator::store::SeriesName::new(
            metric.clone(),
            vec![],
            hourglass_sketch::Kind::Distinct,
        );
        let p = hourglass_aggregator::cluster::partition(&name, PARTITIONS) as usize;
        (owners[p].first().map(String::as_str) == Some("agg-x")
            && !owners[p].iter().any(|o| o == "agg-1"))
        .then_some((metric, p))
    });
    let Some((x_first, p)) = x_first else {
        panic!("premise: no partition of the push is x's first and not agg-1's: {owners:?}");
    };
    // agg-1 may still be ready for the partition (a former owner applies it until its
    // owners are ready): the question would then be answered here without asking x.
    let handed_over = Instant::now();
    let rt = runtime();
    loop {
        let ready = rt
            .block_on(partitions_seen_by(&a.grpc))
            .swap_remove(p)
            .ready;
        if !ready.iter().any(|n| n == "agg-1")
            && ["agg-x", "agg-2"]
                .iter()
                .all(|o| ready.iter().any(|n| n == o))
        {
            break;
        }
        assert!(
            handed_over.elapsed() < Duration::from_secs(120),
            "premise: partition {p} is not handed over to agg-x and agg-2 within 120 s: {ready:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(rt);
    runtime().block_on(push_until_answered(&a, request.clone()));
    for link in to_nats.iter().chain([&to_x]) {
        link.cut(true);
    }
    let mut newer = request;
    for s in &mut newer.snapshots {
        s.version += 1;
    }
    let answered = runtime().block_on(async {
        let mut c = CollectorClient::new(channel(&a.grpc).await);
        let mut push = tonic::Request::new(newer);
        // Well under the cut owner's bound (peer_timeout + 2 s = 62 s), with room for the
        // whole suite's load on 2 cores (20 s was once too short in CI's container).
        push.set_timeout(Duration::from_secs(45));
        c.push(push).await
    });
    let outcomes: Vec<v1::PushOutcome> = answered
        .expect("the push is answered without the cut owner")
        .into_inner()
        .results
        .iter()
        .map(|r| r.outcome())
        .collect();
    assert!(
        outcomes.iter().all(|o| *o == v1::PushOutcome::Stored),
        "{outcomes:?}"
    );
    // A question too: the entry asks x first for x's partitions, and x is silent. The
    // others are asked as well once x has not answered within half of peer_timeout, and
    // the first whole answer is taken, with nothing missing.
    let asked = Instant::now();
    let answer = runtime().block_on(async {
        let mut q = QueryClient::new(channel(&a.grpc).await);
        let hour = crate::util::this_hour();
        let mut question = tonic::Request::new(v1::DistinctRequest {
            selector: Some(v1::Selector {
                metric: x_first.clone(),
                range: Some(v1::TimeRange {
                    start_hour: hour,
                    end_hour: hour + 1,
                }),
                ..Default::default()
            }),
        });
        // Under the cut node's bound (62 s), which the question waited out before.
        question.set_timeout(Duration::from_secs(55));
        q.distinct(question).await
    });
    let answer = answer
        .unwrap_or_else(|s| {
            panic!(
                "the question is answered without the cut owner (after {:?}): {s}",
                asked.elapsed()
            )
        })
        .into_inner();
    let coverage = answer.coverage.unwrap_or_default();
    assert_eq!(
        (
            coverage.partitions_missing,
            coverage.sketches_merged,
            answer.answer.unwrap_or_default().estimate.round()
        ),
        (0, 1, 1.0),
        "{x_first} over the hour, asked while its first owner is cut off"
    );
    // The premise, from the other side: x was asked, and the others once it had not
    // answered within half of peer_timeout.
    assert!(
        asked.elapsed() >= Duration::from_secs(30),
        "premise: the entry asked the cut owner first (answered in {:?})",
        asked.elapsed()
    );
    for link in to_nats.iter().chain([&to_x]) {
        link.cut(false);
    }
}

/// A link (a proxy that can be cut) to each NATS server of `nats`.
fn links_to(nats: &NatsCluster) -> Vec<Link> {
    nats.urls()
        .iter()
        .map(|u| Link::to(Some(u.trim_start_matches("nats://").parse().unwrap())))
        .collect()
}

/// A node that joins after the stream dropped every message (`max_age`) copies what they
/// left from a node that has it (`Peer.Copy`: rows, servers with labels and live hours,
/// series index) before it says it is ready; then, alone, it answers byte-identically to
/// a single aggregator.
#[test]
fn a_new_node_copies_what_the_stream_no_longer_keeps() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-copy");
    let short_lived = |name: &str| {
        let mut cluster = hourglass_aggregator::cluster::ClusterConfig::new(name, nats.urls());
        cluster.partitions = PARTITIONS;
        cluster.subjects = Some(crate::natsfaults::SUBJECTS);
        cluster.heartbeat = HEARTBEAT;
        cluster.member_ttl = MEMBER_TTL;
        cluster.max_age = Duration::from_secs(2);
        let agg = InProcessAggregator::start_with(hourglass_aggregator::Config {
            data_dir: dir.file(name).into(),
            cluster: Some(cluster),
            ..Default::default()
        });
        wait_ready(&agg);
        agg
    };
    let a = short_lived("agg-1");
    let agent = start_agent(&dir, &a.grpc, "agent");
    for p in 0..PARTS {
        send_part(&agent, p);
    }
    wait_shipped(&agent);
    drop(agent);
    wait_applied(&[&a]);
    wait_until("the stream to drop every message", || {
        nats.stream_messages("HOURGLASS") == Some(0)
    });
    let b = short_lived("agg-2");
    wait_applied(&[&a, &b]);
    // The only other copy goes: what agg-2 answers now is what it copied.
    drop(a);
    assert_applied_same("agg-2, which copied everything", &b);
}

/// The series bound refuses at the node an agent pushes to, with its reason, as on a
/// single aggregator, instead of acknowledging a snapshot every node would then refuse.
#[test]
fn the_series_bound_refuses_at_the_entry_node_as_on_a_single_aggregator() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-bound");
    let (entry, other) = two_bounded_nodes(&dir, &nats, 2, "");
    let outcomes: Vec<Vec<v1::PushOutcome>> = runtime().block_on(async {
        let mut all = Vec::new();
        for metrics in [&["a", "b", "c"][..], &["d"][..], &["a"][..]] {
            let request = crate::util::push_of_metrics("web-1", metrics);
            all.push(push_until_answered(&entry, request).await);
        }
        all
    });
    use v1::PushOutcome::{Rejected, Stored};
    assert_eq!(
        outcomes,
        vec![vec![Stored, Stored, Rejected], vec![Rejected], vec![Stored]],
        "two series fit the bound; the third and fourth are refused to the agent"
    );
    wait_applied(&[&entry, &other]);
    for (name, node) in [("entry", &entry), ("other", &other)] {
        // Only what was acknowledged reached the stream: nothing for the nodes to refuse.
        assert_eq!(
            agg_metric(
                node,
                r#"snapshots_rejected_total{reason="series_per_server"}"#
            ),
            if name == "entry" { 2.0 } else { 0.0 },
            "{name}"
        );
    }
}

// ---- What the node pushed to answers, and what it can publish ----

fn web1() -> Option<v1::Server> {
    Some(v1::Server {
        name: "web-1".into(),
        labels: vec![],
    })
}

fn hll(items: std::ops::Range<u32>) -> Vec<u8> {
    let mut h = hourglass_sketch::hll::Hll::new(12).unwrap();
    for i in items {
        h.insert(&i.to_le_bytes());
    }
    h.encode()
}

async fn export(q: &mut QueryClient<tonic::transport::Channel>, hour: u32) -> Vec<u8> {
    q.export(v1::ExportRequest {
        selector: Some(v1::Selector {
            metric: "visits".into(),
            range: Some(v1::TimeRange {
                start_hour: hour,
                end_hour: hour + 1,
            }),
            servers: vec!["web-1".into()],
            ..Default::default()
        }),
        kind: v1::SketchKind::Distinct as i32,
    })
    .await
    .expect("export")
    .into_inner()
    .sketch
    .map(|s| s.data.to_vec())
    .unwrap_or_default()
}

/// A single aggregator answers a push older than what it holds STALE with the held
/// version, which is how an agent whose checkpoint fell behind learns to continue above it
/// (agent/src/shipper.rs: `raise_last_version`, `mark_dirty`). The node pushed to must
/// answer so too: were it to answer STORED, every node would drop the snapshot as stale
/// and the agent would never send the entry again.
#[test]
fn a_stale_push_is_answered_stale_as_by_a_single_aggregator() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-stale");
    let agg = node(&dir, &nats, "agg-1", "agg-1");
    let hour = crate::util::this_hour();
    let rt = runtime();
    let mut c = rt.block_on(async { CollectorClient::new(channel(&agg.grpc).await) });
    let mut q = rt.block_on(async { QueryClient::new(channel(&agg.grpc).await) });
    let push = |c: &mut CollectorClient<_>, snapshots| {
        rt.block_on(c.push(v1::PushRequest {
            server: web1(),
            snapshots,
            live_hours: vec![hour],
        }))
    };
    // A push of live hours alone: answered with no results, published, applied.
    let r = push(&mut c, vec![]).expect("a push with no snapshots");
    assert!(r.into_inner().results.is_empty());
    let held = crate::util::snapshot("visits", hour, 5, v1::SketchKind::Distinct, hll(0..100));
    let r = push(&mut c, vec![held]).expect("push v5").into_inner();
    assert_eq!(r.results[0].outcome(), v1::PushOutcome::Stored);
    wait_applied(&[&agg]);
    let before = rt.block_on(export(&mut q, hour));
    assert!(!before.is_empty());
    // Version 3, other content: a checkpoint that fell behind.
    let behind = crate::util::snapshot("visits", hour, 3, v1::SketchKind::Distinct, hll(0..7));
    let r = push(&mut c, vec![behind]).expect("push v3").into_inner();
    wait_applied(&[&agg]);
    // The version rule holds at apply: the older version did not replace the newer.
    assert_eq!(rt.block_on(export(&mut q, hour)), before);
    // And the agent must be told so, as a single aggregator tells it.
    assert_eq!(
        (r.results[0].outcome(), r.results[0].held_version),
        (v1::PushOutcome::Stale, 5),
        "the entry node acknowledged as STORED a snapshot every node drops as stale"
    );
}

/// Default limits accept a membership sketch up to 16 MiB, NATS' default max_payload is
/// 1 MiB. A single aggregator stores such a push; the cluster must refuse that snapshot
/// alone, not the whole push with RESOURCE_EXHAUSTED, which the agent takes as refused for
/// good (`refused_for_good`, `drop_refused`) with every snapshot of the push.
#[test]
fn a_snapshot_over_max_payload_does_not_refuse_the_rest_of_its_push() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-large");
    let agg = node(&dir, &nats, "agg-1", "agg-1");
    let hour = crate::util::this_hour();
    let mut bloom = hourglass_sketch::bloom::Bloom::new(2_000_000, 0.01).unwrap();
    bloom.insert(b"x");
    let big = bloom.encode();
    assert!(big.len() > 1 << 20 && big.len() < 16 << 20, "{}", big.len());
    let rt = runtime();
    let result = rt.block_on(async {
        let mut c =
            CollectorClient::new(channel(&agg.grpc).await).max_encoding_message_size(64 << 20);
        c.push(v1::PushRequest {
            server: web1(),
            snapshots: vec![
                crate::util::snapshot("visits", hour, 1, v1::SketchKind::Distinct, hll(0..10)),
                crate::util::snapshot("members", hour, 1, v1::SketchKind::Membership, big),
            ],
            live_hours: vec![hour],
        })
        .await
    });
    let results = result
        .expect("the push is refused as a whole: its small snapshot is lost with the big one")
        .into_inner()
        .results;
    assert_eq!(results[0].outcome(), v1::PushOutcome::Stored);
}

/// With every NATS server gone, a push is answered UNAVAILABLE within about
/// publish_timeout, never STORED, and never hangs.
#[test]
fn a_push_while_nats_is_down_is_unavailable_promptly() {
    let mut nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-down");
    let mut cluster = hourglass_aggregator::cluster::ClusterConfig::new("agg-1", nats.urls());
    cluster.partitions = 8;
    cluster.publish_timeout = std::time::Duration::from_secs(2);
    let agg = InProcessAggregator::start_with(hourglass_aggregator::Config {
        data_dir: dir.file("agg-1").into(),
        cluster: Some(cluster),
        ..Default::default()
    });
    wait_ready(&agg);
    let hour = crate::util::this_hour();
    let rt = runtime();
    let mut c = rt.block_on(async { CollectorClient::new(channel(&agg.grpc).await) });
    let snapshots: Vec<v1::Snapshot> = (0..40)
        .map(|i| {
            crate::util::snapshot(
                &format!("m{i}"),
                hour,
                1,
                v1::SketchKind::Distinct,
                hll(0..3),
            )
        })
        .collect();
    let push = |c: &mut CollectorClient<_>| {
        rt.block_on(c.push(v1::PushRequest {
            server: web1(),
            snapshots: snapshots.clone(),
            live_hours: vec![hour],
        }))
    };
    push(&mut c).expect("a push while NATS is up");
    for i in 0..3 {
        nats.kill(i);
    }
    let started = std::time::Instant::now();
    let e = push(&mut c).expect_err("a push while NATS is down");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
}

/// A node whose `[cluster]` disagrees with the stream already there (fewer copies, other
/// partitions) refuses to start, naming the setting, instead of weakening durability or
/// sending series to other partitions than the rest of the cluster.
#[test]
fn a_node_configured_unlike_the_stream_refuses_to_start() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-mismatch");
    let first = node(&dir, &nats, "agg-1", "agg-1");
    // It serves once it has made the stream (JetStream may take seconds to be ready).
    wait_until("the first node to serve", || {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(first.admin) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut answer = String::new();
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .is_ok()
            && s.read_to_string(&mut answer).is_ok()
            && answer.starts_with("HTTP/1.1 200")
    });
    let runtime = runtime();
    let start = |name: &str, change: &dyn Fn(&mut hourglass_aggregator::cluster::ClusterConfig)| {
        let mut cluster = hourglass_aggregator::cluster::ClusterConfig::new(name, nats.urls());
        cluster.partitions = PARTITIONS;
        change(&mut cluster);
        let config = hourglass_aggregator::Config {
            data_dir: dir.file(name).into(),
            cluster: Some(cluster),
            ..Default::default()
        };
        runtime.block_on(async {
            let aggregator = hourglass_aggregator::Aggregator::open(config).unwrap();
            let listeners = hourglass_aggregator::Listeners {
                grpc: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
                admin: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
                grpc_tls: None,
            };
            let serving = aggregator.serve(listeners, std::future::pending());
            match tokio::time::timeout(Duration::from_secs(30), serving).await {
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(())) => panic!("{name} started"),
                Err(_) => panic!("{name} is serving"),
            }
        })
    };
    let e = start("agg-2", &|c| c.replicas = 1);
    assert!(
        e.contains("replicas 3") && e.contains("cluster.replicas"),
        "{e}"
    );
    let e = start("agg-3", &|c| c.partitions = 16);
    assert!(
        e.contains("8 partitions") && e.contains("cluster.partitions = 16"),
        "{e}"
    );
    // The first node grouped the 8 partitions into 3 subjects; the others, configured
    // without subjects, take the stream's (their errors above are not about subjects).
    let e = start("agg-6", &|c| c.subjects = Some(4));
    assert!(
        e.contains("into 3 subjects") && e.contains("cluster.subjects = 4"),
        "{e}"
    );
    let e = start("agg-4", &|c| c.subject_prefix = "other".into());
    assert!(
        e.contains("subjects") && e.contains("cluster.subject_prefix"),
        "{e}"
    );
    // Every guard against applying past what the stream dropped unseen is timed from
    // cluster.max_age: a node configured for longer than the stream keeps would trust
    // what its consumers looked past (such a node answered NOT_FOUND for an acknowledged
    // series).
    let e = start("agg-5", &|c| c.max_age = Duration::from_secs(60));
    assert!(
        e.contains("max_age 604800s") && e.contains("60s (cluster.max_age)"),
        "{e}"
    );
}

// ---- The series bound when one server pushes through two nodes ----

/// Two nodes of a cluster on `nats` whose servers may hold `max_series` series each, and
/// `extra` appended to each node's `[cluster]`.
fn two_bounded_nodes(
    dir: &TempDir,
    nats: &NatsCluster,
    max_series: usize,
    extra: &str,
) -> (InProcessAggregator, InProcessAggregator) {
    let start = |name: &str| {
        let config = config_file(dir, nats, name);
        let mut text = std::fs::read_to_string(&config).unwrap();
        text = text.replace("[cluster]\n", &format!("[cluster]\n{extra}"));
        text.push_str(&format!("[limits]\nmax_series_per_server = {max_series}\n"));
        std::fs::write(&config, text).unwrap();
        let agg = InProcessAggregator::start_from_file(&dir.file(name), &config);
        wait_ready(&agg);
        agg
    };
    (start("agg-1"), start("agg-2"))
}

/// The series of `server` that `agg` holds data of, by metric name (Export of each).
fn held_metrics(agg: &InProcessAggregator, server: &str, metrics: &[&str]) -> Vec<String> {
    let rt = runtime();
    rt.block_on(async {
        let mut q = QueryClient::new(channel(&agg.grpc).await);
        let hour = crate::util::this_hour();
        let mut out = Vec::new();
        for metric in metrics {
            // A node that cannot confirm its index yet (JetStream just back from a lost
            // quorum answers 503 for a while) refuses honestly: asked again.
            let started = std::time::Instant::now();
            let r = loop {
                let r = q
                    .export(v1::ExportRequest {
                        selector: Some(v1::Selector {
                            metric: (*metric).into(),
                            range: Some(v1::TimeRange {
                                start_hour: hour,
                                end_hour: hour + 1,
                            }),
                            servers: vec![server.into()],
                            ..Default::default()
                        }),
                        kind: v1::SketchKind::Distinct as i32,
                    })
                    .await;
                match r {
                    Err(s)
                        if s.code() == tonic::Code::Unavailable
                            && started.elapsed() < Duration::from_secs(60) =>
                    {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    r => break r,
                }
            };
            let r = match r {
                Ok(r) => r.into_inner(),
                // No series of that metric at all: nothing held.
                Err(s) if s.code() == tonic::Code::NotFound => continue,
                Err(s) => panic!("export: {s}"),
            };
            if r.sketch.is_some_and(|s| !s.data.is_empty()) {
                out.push((*metric).to_string());
            }
        }
        out
    })
}

/// An agent that failed over (its push to one node timed out on its side) pushes to two
/// entry nodes at once, a server at a bound of one series: each entry admits its series
/// into the ledger its apply loop shares before it applies the other's message, so each
/// apply loop refuses the *other* node's series. Each entry then reads its own store,
/// finds its snapshot, answers STORED: both acknowledged, node 1 holds only `a`, node 2
/// only `b`, for good. One of the two must be refused (and every node hold the same).
#[test]
fn concurrent_entries_at_the_series_bound_never_acknowledge_both() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-bound-race");
    let (n1, n2) = two_bounded_nodes(&dir, &nats, 1, "");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Both serve (a push of live hours alone, for a server of its own).
    for n in [&n1, &n2] {
        rt.block_on(push_until_answered(
            n,
            crate::util::push_of_metrics("warm-up", &[]),
        ));
    }
    let rounds = 6;
    let mut answers = Vec::new();
    for round in 0..rounds {
        let server = format!("web-{round}");
        let (a, b) = rt.block_on(async {
            tokio::join!(
                push_when_ready(&n1, crate::util::push_of_metrics(&server, &["a"])),
                push_when_ready(&n2, crate::util::push_of_metrics(&server, &["b"])),
            )
        });
        // UNAVAILABLE acknowledges nothing (the agent retries): as good as not STORED.
        let outcome = |r: Result<Vec<v1::PushOutcome>, tonic::Status>| match r {
            Ok(r) => r[0],
            Err(s) if s.code() == tonic::Code::Unavailable => v1::PushOutcome::Unspecified,
            Err(s) => panic!("{s}"),
        };
        answers.push((outcome(a), outcome(b)));
    }
    wait_applied(&[&n1, &n2]);
    let mut wrong = Vec::new();
    for (round, (a, b)) in answers.iter().enumerate() {
        let server = format!("web-{round}");
        let (h1, h2) = (
            held_metrics(&n1, &server, &["a", "b"]),
            held_metrics(&n2, &server, &["a", "b"]),
        );
        let stored = [(*a, "a"), (*b, "b")]
            .iter()
            .filter(|(o, _)| *o == v1::PushOutcome::Stored)
            .map(|(_, m)| m.to_string())
            .collect::<Vec<_>>();
        // Everything acknowledged is held by every node, and the nodes agree.
        if h1 != h2 || stored.iter().any(|m| !h1.contains(m) || !h2.contains(m)) {
            wrong.push(format!(
                "{server}: answered a={a:?} b={b:?}; node 1 holds {h1:?}, node 2 holds {h2:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A push whose publish fails (no JetStream quorum) is answered UNAVAILABLE, yet its new
/// series stays counted in the entry's ledger, which the apply loop shares. The agent,
/// failing over, pushes another series of the same server to another node: STORED there
/// and applied there, but the first node's apply loop refuses it (the server "holds" the
/// series that was never published), so an acknowledged snapshot is missing on node 1 for
/// good.
#[test]
fn a_failed_publish_leaves_no_series_in_the_ledger() {
    let mut nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-ledger-leak");
    let (n1, n2) = two_bounded_nodes(&dir, &nats, 1, "publish_timeout = \"2s\"\n");
    let rt = runtime();
    for n in [&n1, &n2] {
        rt.block_on(push_until_answered(
            n,
            crate::util::push_of_metrics("warm-up", &[]),
        ));
    }
    // No quorum: the publish of `a` cannot be acknowledged.
    nats.kill(1);
    nats.kill(2);
    let e = rt
        .block_on(push_when_ready(
            &n1,
            crate::util::push_of_metrics("web-1", &["a"]),
        ))
        .expect_err("a push without a JetStream quorum");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
    nats.start_node(1);
    nats.start_node(2);
    // The agent fails over to node 2 with its next series.
    let b = rt.block_on(push_until_answered(
        &n2,
        crate::util::push_of_metrics("web-1", &["b"]),
    ));
    wait_applied(&[&n1, &n2]);
    let (h1, h2) = (
        held_metrics(&n1, "web-1", &["a", "b"]),
        held_metrics(&n2, "web-1", &["a", "b"]),
    );
    // The unacknowledged publish of `a` may still have reached the stream (JetStream
    // commits it once the quorum is back): then `b` is rightly refused. Either way the
    // nodes agree and hold what was acknowledged.
    if b == vec![v1::PushOutcome::Stored] {
        assert!(h2.contains(&"b".to_string()), "{h2:?}");
    }
    assert_eq!(
        h1,
        h2,
        "node 2 answered {b:?}; node 1 refused at apply what node 2 holds (series_per_server rejections on node 1: {})",
        agg_metric(
            &n1,
            r#"snapshots_rejected_total{reason="series_per_server"}"#
        )
    );
}

// ---- Wrong answers and silent loss ----
//
// Each test below sets up faults under which a node answered wrongly (stale rows as
// complete, an answer without an acknowledged push, labels that depend on the order of
// independent consumers): it fails if the node does so again.

/// [`node`] on the NATS servers `urls`, with `tweak` applied to its `[cluster]`.
fn node_on(
    dir: &TempDir,
    urls: Vec<String>,
    name: &str,
    data: &str,
    tweak: impl FnOnce(&mut hourglass_aggregator::cluster::ClusterConfig),
) -> InProcessAggregator {
    let mut cluster = hourglass_aggregator::cluster::ClusterConfig::new(name, urls);
    cluster.partitions = PARTITIONS;
    cluster.subjects = Some(crate::natsfaults::SUBJECTS);
    cluster.heartbeat = HEARTBEAT;
    cluster.member_ttl = MEMBER_TTL;
    tweak(&mut cluster);
    let agg = InProcessAggregator::start_with(hourglass_aggregator::Config {
        data_dir: dir.file(data).into(),
        cluster: Some(cluster),
        ..Default::default()
    });
    wait_ready(&agg);
    agg
}

/// A distinct snapshot of `metric{tags}` at `hour` holding `items`.
fn distinct_snapshot(
    metric: &str,
    tags: &[(&str, &str)],
    hour: u32,
    version: u64,
    items: std::ops::Range<u32>,
) -> v1::Snapshot {
    let mut s = crate::util::snapshot(metric, hour, version, v1::SketchKind::Distinct, hll(items));
    s.series.as_mut().unwrap().tags = tags
        .iter()
        .map(|(k, v)| v1::Tag {
            key: (*k).into(),
            value: (*v).into(),
        })
        .collect();
    s
}

/// The partition of the distinct series `metric{tags}`.
fn partition_of_series(metric: &str, tags: &[(&str, &str)]) -> u32 {
    let tags = tags
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    hourglass_aggregator::cluster::partition(
        &hourglass_aggregator::store::SeriesName::new(
            metric,
            tags,
            hourglass_sketch::Kind::Distinct,
        ),
        PARTITIONS,
    )
}

/// The distinct Export of `metric` over `hour` from every server with `labels`: its
/// bytes and how many partitions it says it lacks.
async fn export_distinct(
    grpc: &str,
    metric: &str,
    hour: u32,
    labels: &[(&str, &str)],
) -> (Vec<u8>, u32) {
    try_export_distinct(grpc, metric, hour, labels)
        .await
        .unwrap_or_else(|s| panic!("export {metric} from {grpc}: {s}"))
}

/// [`export_distinct`], or the node's refusal.
async fn try_export_distinct(
    grpc: &str,
    metric: &str,
    hour: u32,
    labels: &[(&str, &str)],
) -> Result<(Vec<u8>, u32), tonic::Status> {
    let mut q = QueryClient::new(channel(grpc).await);
    let r = q
        .export(v1::ExportRequest {
            selector: Some(v1::Selector {
                metric: metric.into(),
                range: Some(v1::TimeRange {
                    start_hour: hour,
                    end_hour: hour + 1,
                }),
                labels: labels
                    .iter()
                    .map(|(k, v)| v1::Tag {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                ..Default::default()
            }),
            kind: v1::SketchKind::Distinct as i32,
        })
        .await?
        .into_inner();
    Ok((
        r.sketch.map(|s| s.data.to_vec()).unwrap_or_default(),
        r.coverage.map_or(0, |c| c.partitions_missing),
    ))
}

/// Every partition as the node at `grpc` sees it: its owners and the nodes ready for it.
async fn partitions_seen_by(grpc: &str) -> Vec<v1::PartitionStatus> {
    let mut c = v1::peer_client::PeerClient::new(channel(grpc).await);
    c.status(v1::StatusRequest {})
        .await
        .expect("status")
        .into_inner()
        .partitions
}

/// The owners of each partition, as the node at `grpc` sees them.
async fn owners_seen_by(grpc: &str) -> Vec<Vec<String>> {
    let partitions = partitions_seen_by(grpc).await;
    partitions.into_iter().map(|p| p.owners).collect()
}

/// A node whose NATS server stops answering (a network partition) keeps answering
/// queries from its store as complete (`partitions_missing` 0) for up to `member_ttl`,
/// while the rest of the cluster acknowledges newer snapshots of its partitions: readiness
/// is only ever set, never withdrawn when the consumer stops receiving.
#[test]
fn a_node_cut_off_from_nats_never_answers_stale_rows_as_complete() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-cutoff");
    let urls = nats.urls();
    // The default member_ttl is 10 s; 30 s leaves room for a stream leader election.
    let ttl = Duration::from_secs(30);
    let x = node_on(&dir, vec![urls[0].clone()], "agg-x", "agg-x", |c| {
        c.member_ttl = ttl
    });
    let y = node_on(
        &dir,
        vec![urls[1].clone(), urls[2].clone()],
        "agg-y",
        "agg-y",
        |c| c.member_ttl = ttl,
    );
    wait_until_within("two members", JOIN_WAIT, || {
        agg_metric(&x, "cluster_members") == 2.0 && agg_metric(&y, "cluster_members") == 2.0
    });
    wait_applied(&[&x, &y]);
    let hour = crate::util::this_hour();
    let rt = runtime();
    let push = |version, items| v1::PushRequest {
        server: web1(),
        snapshots: vec![distinct_snapshot("visits", &[], hour, version, items)],
        live_hours: vec![hour],
    };
    use v1::PushOutcome::Stored;
    assert_eq!(
        rt.block_on(push_until_answered(&y, push(1, 0..100))),
        vec![Stored]
    );
    wait_applied(&[&x, &y]);
    // X's only NATS server freezes: its connection stays open, nothing arrives.
    nats.pause(0, true);
    let cut = std::time::Instant::now();
    assert_eq!(
        rt.block_on(push_until_answered(&y, push(2, 0..5000))),
        vec![Stored]
    );
    let (want, _) = rt.block_on(export_distinct(&y.grpc, "visits", hour, &[]));
    let answer = rt.block_on(try_export_distinct(&x.grpc, "visits", hour, &[]));
    let after = cut.elapsed();
    nats.pause(0, false);
    assert!(
        right_or_honest(&answer, &want),
        "{after:?} after its NATS server stopped answering, agg-x answers the acknowledged version 2 \
         with the rows of version 1 ({:?}): a silently wrong answer",
        answer.map(|(_, missing)| format!("partitions_missing = {missing}"))
    );
}

/// A SIGKILLed owner restarted within ACK_WAIT (60 s): its durable consumers still have
/// the messages the dead process had been delivered but not acknowledged. `consume` takes
/// `num_pending` (undelivered only, not `num_ack_pending`) as what is left and declares
/// the partitions ready at once; those messages come back only after ACK_WAIT, and until
/// then the node answers without them, naming no missing partition.
#[test]
fn a_restarted_owner_answers_only_once_its_unacknowledged_messages_are_applied() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-inflight");
    let listen = format!("127.0.0.1:{}", free_port());
    let config = config_file(&dir, &nats, "agg-1");
    let args = ["--config", config.as_str()];
    let x = AggregatorProcess::start_on(&listen, &dir.file("agg-1"), &args);
    wait_ready(&x);
    let y = node(&dir, &nats, "agg-2", "agg-2");
    wait_until_within("two members", JOIN_WAIT, || {
        agg_metric(&x, "cluster_members") == 2.0 && agg_metric(&y, "cluster_members") == 2.0
    });
    wait_applied(&[&x, &y]);
    let hour = crate::util::this_hour();
    // A burst through agg-2: 16 pushers, each push 16 new series over the partitions.
    const PUSHES: u32 = 600;
    let grpc = y.grpc.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = std::sync::Arc::clone(&stop);
    let burst = std::thread::spawn(move || {
        runtime().block_on(async move {
            let mut set = tokio::task::JoinSet::new();
            for w in 0..16u32 {
                let grpc = grpc.clone();
                let stopped = std::sync::Arc::clone(&stopped);
                set.spawn(async move {
                    let mut c = CollectorClient::new(channel(&grpc).await);
                    for i in (w..PUSHES).step_by(16) {
                        if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                            break;
                        }
                        let request = v1::PushRequest {
                            server: web1(),
                            snapshots: (0..16u32)
                                .map(|j| {
                                    let n = (i * 16 + j).to_string();
                                    let first = (i * 16 + j) * 10;
                                    distinct_snapshot(
                                        "visits",
                                        &[("n", &n)],
                                        hour,
                                        1,
                                        first..first + 10,
                                    )
                                })
                                .collect(),
                            live_hours: vec![hour],
                        };
                        push_retrying(&mut c, &request).await;
                    }
                });
            }
            while let Some(done) = set.join_next().await {
                done.unwrap();
            }
        })
    });
    std::thread::sleep(Duration::from_millis(1500));
    // Killed while applying the burst; the burst ends at once and agg-1 comes back well
    // within ACK_WAIT (60 s) of the messages it was delivered.
    x.kill();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    burst.join().unwrap();
    let x = AggregatorProcess::start_on(&listen, &dir.file("agg-1"), &args);
    let restarted = std::time::Instant::now();
    wait_until("the restarted agg-1 to be ready", || {
        let applying = agg_metric(&x, "cluster_partitions_applying");
        applying > 0.0 && agg_metric(&x, "cluster_partitions_ready") == applying
    });
    wait_until("agg-1 to have nothing pending", || {
        agg_metric(&x, "cluster_pending") == 0.0
    });
    let rt = runtime();
    let (want, _) = rt.block_on(export_distinct(&y.grpc, "visits", hour, &[]));
    let answer = rt.block_on(try_export_distinct(&x.grpc, "visits", hour, &[]));
    let answered = restarted.elapsed();
    assert!(
        right_or_honest(&answer, &want),
        "the restarted agg-1 says it is ready for every partition with nothing pending, yet answers \
         other bytes than agg-2 ({:?}), {answered:?} after its restart",
        answer.map(|(_, missing)| format!("partitions_missing = {missing}"))
    );
}

/// The node asked decides which partitions to ask others for from the series *it* knows
/// (`answer.partitions`), and it learns other partitions' series only from the live
/// subject. A node whose live consumer lags (here: restarted after pushes it missed,
/// ready for its own partitions long before its live consumer caught up) never asks for a
/// partition whose series it does not know yet: the answer lacks acknowledged series with
/// partitions_missing 0.
#[test]
fn a_node_behind_on_the_live_subject_never_answers_low_without_missing_partitions() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-live-lag");
    let a = node(&dir, &nats, "agg-1", "agg-1");
    let b = node(&dir, &nats, "agg-2", "agg-2");
    let c = node(&dir, &nats, "agg-3", "agg-3");
    wait_until_within("three members", JOIN_WAIT, || {
        [&a, &b, &c]
            .iter()
            .all(|n| agg_metric(*n, "cluster_members") == 3.0)
    });
    let rt = runtime();
    let owners = rt.block_on(owners_seen_by(&a.grpc));
    let not_c: Vec<u32> = (0..PARTITIONS)
        .filter(|&p| !owners[p as usize].iter().any(|o| o == "agg-3"))
        .collect();
    assert!(!not_c.is_empty(), "agg-3 owns every partition: {owners:?}");
    let hour = crate::util::this_hour();
    // A series agg-3 owns and knows before it stops.
    let old = (0..)
        .map(|i| format!("old{i}"))
        .find(|t| !not_c.contains(&partition_of_series("visits", &[("page", t)])))
        .unwrap();
    let probe = (0..)
        .map(|i| format!("probe{i}"))
        .find(|t| not_c.contains(&partition_of_series("visits", &[("page", t)])))
        .unwrap();
    use v1::PushOutcome::Stored;
    let one = |tag: &str, items| v1::PushRequest {
        server: web1(),
        snapshots: vec![distinct_snapshot(
            "visits",
            &[("page", tag)],
            hour,
            1,
            items,
        )],
        live_hours: vec![hour],
    };
    assert_eq!(
        rt.block_on(push_until_answered(&a, one(&old, 0..100))),
        vec![Stored]
    );
    wait_applied(&[&a, &b, &c]);
    drop(c);
    // While agg-3 is away: a backlog on the live subject only (series of partitions
    // agg-3 does not own), then the probe.
    let fillers: Vec<String> = (0..)
        .map(|i| format!("f{i}"))
        .filter(|t| not_c.contains(&partition_of_series("filler", &[("n", t)])))
        .take(20_000)
        .collect();
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for (w, chunk) in fillers.chunks(100).enumerate() {
            let grpc = a.grpc.clone();
            let chunk = chunk.to_vec();
            set.spawn(async move {
                let mut c = CollectorClient::new(channel(&grpc).await);
                let request = v1::PushRequest {
                    server: Some(v1::Server {
                        name: format!("filler-{}", w % 8),
                        labels: vec![],
                    }),
                    snapshots: chunk
                        .iter()
                        .map(|t| distinct_snapshot("filler", &[("n", t)], hour, 1, 0..3))
                        .collect(),
                    live_hours: vec![hour],
                };
                push_retrying(&mut c, &request).await;
            });
            if set.len() >= 8 {
                set.join_next().await.unwrap().unwrap();
            }
        }
        while let Some(done) = set.join_next().await {
            done.unwrap();
        }
    });
    assert_eq!(
        rt.block_on(push_until_answered(&a, one(&probe, 1000..2000))),
        vec![Stored]
    );
    let c = node(&dir, &nats, "agg-3", "agg-3");
    let (want, _) = rt.block_on(export_distinct(&a.grpc, "visits", hour, &[]));
    let answer = rt.block_on(try_export_distinct(&c.grpc, "visits", hour, &[]));
    assert!(
        right_or_honest(&answer, &want),
        "agg-3, ready for its partitions but still applying the live subject, answers other bytes \
         than agg-1 for visits ({:?}): series visits{{page={probe}}} \
         (partition {}) was acknowledged and is missing silently",
        answer.map(|(_, missing)| format!("partitions_missing = {missing}")),
        partition_of_series("visits", &[("page", &probe)])
    ); // Closed before the nodes: their graceful drain waits for the clients' connections.
    drop(rt);
}

/// A server's labels are written by every message applied, from the live subject *and*
/// from each partition's subject, by independent consumers. A node whose partition
/// consumer applies an older push after its live consumer applied a newer one ends with
/// the older labels, unlike a single aggregator (the latest push's labels) and unlike the
/// other nodes; queries selecting by label then answer differently, silently.
#[test]
fn server_labels_do_not_depend_on_the_order_of_independent_consumers() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-labels");
    let a = node(&dir, &nats, "agg-1", "agg-1");
    let hour = crate::util::this_hour();
    let rt = runtime();
    const SERVERS: usize = 20;
    let server = |s: usize, env: &str| {
        Some(v1::Server {
            name: format!("web-{s}"),
            labels: vec![v1::Tag {
                key: "env".into(),
                value: env.into(),
            }],
        })
    };
    rt.block_on(async {
        for s in 0..SERVERS {
            // The push with data, labelled env=old; then the server's next push, labelled
            // env=new, with live hours only.
            let first = v1::PushRequest {
                server: server(s, "old"),
                snapshots: vec![distinct_snapshot(
                    "visits",
                    &[],
                    hour,
                    1,
                    s as u32 * 1000..s as u32 * 1000 + 100,
                )],
                live_hours: vec![hour],
            };
            push_until_answered(&a, first).await;
            let second = v1::PushRequest {
                server: server(s, "new"),
                snapshots: vec![],
                live_hours: vec![hour],
            };
            push_until_answered(&a, second).await;
        }
    });
    // A second node joins (owners = 2: it owns every partition) and applies the stream.
    let d = node(&dir, &nats, "agg-2", "agg-2");
    wait_applied(&[&a, &d]);
    let labels = |grpc: &str| {
        rt.block_on(async {
            let mut q = QueryClient::new(channel(grpc).await);
            q.list_servers(v1::ListServersRequest {})
                .await
                .expect("list servers")
                .into_inner()
                .servers
                .into_iter()
                .map(|s| {
                    let env = s.labels.iter().map(|t| t.value.clone()).collect::<Vec<_>>();
                    (s.name, env.join(","))
                })
                .collect::<Vec<_>>()
        })
    };
    let on_a = labels(&a.grpc);
    let on_d = labels(&d.grpc);
    let by_env = |grpc: &str| {
        rt.block_on(async {
            let mut q = QueryClient::new(channel(grpc).await);
            q.distinct(v1::DistinctRequest {
                selector: Some(v1::Selector {
                    metric: "visits".into(),
                    range: Some(v1::TimeRange {
                        start_hour: hour,
                        end_hour: hour + 1,
                    }),
                    labels: vec![v1::Tag {
                        key: "env".into(),
                        value: "new".into(),
                    }],
                    ..Default::default()
                }),
            })
            .await
            .map(|r| {
                let r = r.into_inner();
                (
                    r.answer.unwrap_or_default().estimate,
                    r.coverage.unwrap_or_default().partitions_missing,
                )
            })
            .map_err(|s| s.message().to_string())
        })
    };
    let (want, got) = (by_env(&a.grpc), by_env(&d.grpc));
    let stale: Vec<_> = on_d.iter().filter(|(_, env)| env != "new").collect();
    assert!(
        on_a == on_d && want == got,
        "agg-2 holds the older labels env=old for {} of {SERVERS} servers ({stale:?}); agg-1 has \
         env=new for all. Distinct visits with env=new: agg-1 {want:?}, agg-2 {got:?} \
         ((estimate, partitions_missing) or the error)",
        stale.len()
    ); // The clients' connections live in `rt`, which runs only inside `block_on`: closed
    // first, so that the nodes' graceful drain does not wait for them forever.
    drop(rt);
}

/// `Query/MembershipBatch` asked of each node of a cluster, whose partitions are spread
/// over the nodes: every answer is, in the request's order, what `Query/Membership`
/// answers for that item alone on that node, and what a single aggregator holding the
/// same pushes answers.
#[test]
fn a_membership_batch_is_answered_across_the_cluster_as_lookups_one_by_one() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-membership-batch");
    let nodes: Vec<InProcessAggregator> = three_nodes(&dir, &nats);
    let single = InProcessAggregator::start(&dir.file("single"));
    wait_until_within("three members", JOIN_WAIT, || {
        nodes
            .iter()
            .all(|n| agg_metric(n, "cluster_members") == 3.0)
    });
    let hour = crate::util::this_hour();
    let rt = runtime();
    // 16 series (pages) of one metric, over the 8 partitions; two servers.
    for server in ["web-1", "web-2"] {
        let snapshots = (0..16u32)
            .map(|i| {
                let mut bloom = hourglass_sketch::bloom::Bloom::new(1000, 0.01).unwrap();
                bloom.insert(format!("u{i}").as_bytes());
                bloom.insert(format!("{server}-u{i}").as_bytes());
                let mut s = crate::util::snapshot(
                    "members",
                    hour,
                    1,
                    v1::SketchKind::Membership,
                    bloom.encode(),
                );
                s.series.as_mut().unwrap().tags = vec![v1::Tag {
                    key: "page".into(),
                    value: format!("p{i}"),
                }];
                s
            })
            .collect();
        let request = v1::PushRequest {
            server: Some(v1::Server {
                name: server.into(),
                labels: vec![],
            }),
            snapshots,
            live_hours: vec![hour],
        };
        let outcomes = rt.block_on(push_until_answered(&nodes[0], request.clone()));
        assert!(outcomes.iter().all(|o| *o == v1::PushOutcome::Stored));
        rt.block_on(push_until_answered(&single, request));
    }
    wait_applied(&[&nodes[0], &nodes[1], &nodes[2]]);
    let items: Vec<Vec<u8>> = ["u3", "nobody", "web-2-u15", "", "u3", "web-1-u0", "u15"]
        .iter()
        .map(|i| i.as_bytes().to_vec())
        .collect();
    rt.block_on(async {
        let mut alone_here = QueryClient::new(channel(&single.grpc).await);
        for node in &nodes {
            let mut q = QueryClient::new(channel(&node.grpc).await);
            for group_by in [v1::GroupBy::None, v1::GroupBy::Server] {
                let selector = Some(v1::Selector {
                    metric: "members".into(),
                    range: Some(v1::TimeRange {
                        start_hour: hour,
                        end_hour: hour + 1,
                    }),
                    group_by: group_by as i32,
                    ..Default::default()
                });
                let batch = q
                    .membership_batch(v1::MembershipBatchRequest {
                        selector: selector.clone(),
                        items: items.clone(),
                    })
                    .await
                    .expect("a batch")
                    .into_inner();
                assert_eq!(batch.answers.len(), items.len());
                for (item, answer) in items.iter().zip(&batch.answers) {
                    let ask = v1::MembershipRequest {
                        selector: selector.clone(),
                        item: item.clone(),
                    };
                    let alone = q.membership(ask.clone()).await.expect("a lookup");
                    let what = (String::from_utf8_lossy(item), group_by, &node.grpc);
                    assert_eq!(*answer, alone.into_inner(), "{what:?}");
                    let single = alone_here.membership(ask).await.expect("a lookup");
                    assert_eq!(
                        *answer,
                        single.into_inner(),
                        "{what:?}: a single aggregator's"
                    );
                }
                let seen = |i: usize| batch.answers[i].answer.as_ref().unwrap().maybe_present;
                assert!(seen(0) && seen(2) && seen(4) && seen(5) && seen(6));
                assert!(!seen(1));
            }
        }
    });
}
