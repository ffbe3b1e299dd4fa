//! Cluster mode (DESIGN §10) against a real 3-node NATS JetStream cluster: the same
//! seeded traffic as the fault tests, pushed to one node, must be held byte-identically by
//! every node, as by a single aggregator.

use crate::faults::{
    PARTS, agg_metric, assert_same, send_part, start_agent, stored, wait_shipped, wait_until,
};
use crate::nats::NatsCluster;
use crate::util::{InProcessAggregator, TempDir};

/// An aggregator that is node `node` of the cluster on `nats`, its data in `dir`.
fn node(dir: &TempDir, nats: &NatsCluster, node: &str) -> InProcessAggregator {
    let mut cluster = hourglass_aggregator::cluster::ClusterConfig::new(node, nats.urls());
    // Few partitions keep the test's stream small; the rule is the same for 64.
    cluster.partitions = 8;
    InProcessAggregator::start_with(hourglass_aggregator::Config {
        data_dir: dir.file(node).into(),
        cluster: Some(cluster),
        ..Default::default()
    })
}

#[test]
fn a_push_to_one_node_is_applied_by_every_node_byte_identically() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("cluster-apply");
    let nodes: Vec<InProcessAggregator> = ["agg-1", "agg-2", "agg-3"]
        .iter()
        .map(|name| node(&dir, &nats, name))
        .collect();
    // The agent pushes to the first node only.
    let agent = start_agent(&dir, &nodes[0].grpc, "agent");
    for p in 0..PARTS {
        send_part(&agent, p);
    }
    wait_shipped(&agent);
    // Everything the agent saw acknowledged was published: every node applies all of it.
    let published = agg_metric(&nodes[0], "cluster_published_messages_total");
    assert!(published > 0.0, "nothing was published");
    for (i, n) in nodes.iter().enumerate() {
        wait_until(&format!("node {} to apply the stream", i + 1), || {
            agg_metric(n, r#"cluster_applied_total{outcome="ok"}"#) >= published
        });
        assert_same(&stored(n));
        // Nothing was stored on the entry node outside the stream's apply.
        assert_eq!(
            agg_metric(n, r#"cluster_applied_total{outcome="refused"}"#),
            0.0
        );
    }
    assert_eq!(
        agg_metric(&nodes[1], "cluster_published_messages_total"),
        0.0,
        "only the node pushed to publishes"
    );
}
