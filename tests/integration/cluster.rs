//! Cluster mode (DESIGN §10) against a real 3-node NATS JetStream cluster: the same
//! seeded traffic as the fault tests, pushed to one node, must be held byte-identically by
//! every node, as by a single aggregator, with and without faults:
//!
//! - no fault;
//! - the entry node SIGKILLed mid-ingest and restarted;
//! - the NATS server leading the stream SIGKILLed mid-ingest (and restarted later);
//! - a node whose data dir is wiped: it applies the whole stream again.

use std::time::Duration;

use crate::faults::{
    PARTS, agg_metric, assert_same, send_part, start_agent, stored, wait_shipped, wait_until,
};
use crate::nats::NatsCluster;
use crate::util::{AggregatorAddrs, AggregatorProcess, InProcessAggregator, TempDir, free_port};

/// Few partitions keep the tests' stream small; the rule is the same for 64.
const PARTITIONS: u32 = 8;

/// An aggregator in this process that is node `node` of the cluster on `nats`, its data
/// in `dir/data`.
fn node(dir: &TempDir, nats: &NatsCluster, node: &str, data: &str) -> InProcessAggregator {
    let mut cluster = hourglass_aggregator::cluster::ClusterConfig::new(node, nats.urls());
    cluster.partitions = PARTITIONS;
    InProcessAggregator::start_with(hourglass_aggregator::Config {
        data_dir: dir.file(data).into(),
        cluster: Some(cluster),
        ..Default::default()
    })
}

/// A config file that makes an aggregator process node `node` of the cluster on `nats`.
fn config_file(dir: &TempDir, nats: &NatsCluster, node: &str) -> String {
    let path = dir.file(&format!("{node}.toml"));
    let urls: Vec<String> = nats.urls().iter().map(|u| format!("{u:?}")).collect();
    std::fs::write(
        &path,
        format!(
            "[cluster]\nnode = \"{node}\"\nnats = [{}]\npartitions = {PARTITIONS}\n",
            urls.join(", ")
        ),
    )
    .unwrap();
    path
}

/// Waits until `node` has applied the stream up to `sequence`, then requires its Export
/// and answers to equal the single aggregator's.
fn assert_applied_same(name: &str, node: &impl AggregatorAddrs, sequence: f64) {
    assert!(sequence > 0.0, "nothing was published");
    wait_until(&format!("{name} to apply the stream"), || {
        agg_metric(node, "cluster_applied_sequence") >= sequence
    });
    assert_same(&stored(node));
    assert_eq!(
        agg_metric(node, r#"cluster_applied_total{outcome="refused"}"#),
        0.0,
        "{name} refused messages"
    );
}

#[test]
fn a_push_to_one_node_is_applied_by_every_node_byte_identically() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-apply");
    let nodes: Vec<InProcessAggregator> = ["agg-1", "agg-2", "agg-3"]
        .iter()
        .map(|name| node(&dir, &nats, name, name))
        .collect();
    // The agent pushes to the first node only.
    let agent = start_agent(&dir, &nodes[0].grpc, "agent");
    for p in 0..PARTS {
        send_part(&agent, p);
    }
    wait_shipped(&agent);
    // Everything the agent saw acknowledged was published: every node applies all of it.
    let sequence = agg_metric(&nodes[0], "cluster_published_sequence");
    for (i, n) in nodes.iter().enumerate() {
        assert_applied_same(&format!("node {}", i + 1), n, sequence);
    }
    let published = agg_metric(&nodes[0], "cluster_published_messages_total");
    for n in &nodes {
        assert!(agg_metric(n, r#"cluster_applied_total{outcome="ok"}"#) >= published);
    }
    assert_eq!(
        agg_metric(&nodes[1], "cluster_published_messages_total"),
        0.0,
        "only the node pushed to publishes"
    );

    // A node replaced by one with an empty data dir (same name) reads the whole stream
    // again with a consumer of its own, instead of resuming where the old store was.
    let mut nodes = nodes;
    drop(nodes.remove(2));
    let fresh = node(&dir, &nats, "agg-3", "agg-3-replaced");
    assert_applied_same("the replaced node 3", &fresh, sequence);
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
    // The agent's last pushes went through the restarted entry: the highest sequence.
    let sequence = agg_metric(&entry, "cluster_published_sequence");
    assert_applied_same("the restarted entry node", &entry, sequence);
    assert_applied_same("the other node", &other, sequence);
}

#[test]
fn the_stream_leader_sigkilled_mid_ingest_loses_nothing_acknowledged() {
    let mut nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-kill-leader");
    let nodes: Vec<InProcessAggregator> = ["agg-1", "agg-2"]
        .iter()
        .map(|name| node(&dir, &nats, name, name))
        .collect();
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
    let sequence = agg_metric(&nodes[0], "cluster_published_sequence");
    for (i, n) in nodes.iter().enumerate() {
        assert_applied_same(&format!("node {}", i + 1), n, sequence);
    }
    // The killed server returns and catches up from its peers; nothing changes.
    nats.start_node(leader);
    for (i, n) in nodes.iter().enumerate() {
        assert_applied_same(&format!("node {} after the return", i + 1), n, sequence);
    }
}

/// The series bound refuses at the node an agent pushes to, with its reason, as on a
/// single aggregator, instead of acknowledging a snapshot every node would then refuse.
#[test]
fn the_series_bound_refuses_at_the_entry_node_as_on_a_single_aggregator() {
    use hourglass_rpc::proto::v1::{self, collector_client::CollectorClient};
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-bound");
    let start = |name: &str| {
        let config = config_file(&dir, &nats, name);
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str("[limits]\nmax_series_per_server = 2\n");
        std::fs::write(&config, text).unwrap();
        InProcessAggregator::start_from_file(&dir.file(name), &config)
    };
    let (entry, other) = (start("agg-1"), start("agg-2"));
    let push = |metrics: &[&str]| crate::util::push_of_metrics("web-1", metrics);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcomes: Vec<Vec<v1::PushOutcome>> = runtime.block_on(async {
        let mut collector = loop {
            match CollectorClient::connect(entry.grpc.clone()).await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let mut all = Vec::new();
        for metrics in [&["a", "b", "c"][..], &["d"][..], &["a"][..]] {
            let response = loop {
                // The node serves once it has joined the stream.
                match collector.push(push(metrics)).await {
                    Ok(r) => break r.into_inner(),
                    Err(s) if s.code() == tonic::Code::Unavailable => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Err(s) => panic!("push refused: {s}"),
                }
            };
            all.push(response.results.iter().map(|r| r.outcome()).collect());
        }
        all
    });
    use v1::PushOutcome::{Rejected, Stored};
    assert_eq!(
        outcomes,
        vec![vec![Stored, Stored, Rejected], vec![Rejected], vec![Stored]],
        "two series fit the bound; the third and fourth are refused to the agent"
    );
    let sequence = agg_metric(&entry, "cluster_published_sequence");
    for (name, node) in [("entry", &entry), ("other", &other)] {
        wait_until(&format!("the {name} node to apply the stream"), || {
            agg_metric(node, "cluster_applied_sequence") >= sequence
        });
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
