//! Cluster mode (DESIGN §10): aggregators share one write log, a NATS JetStream stream,
//! instead of each keeping only what was pushed to it.
//!
//! Without a `[cluster]` section none of this runs and NATS is not needed. With one:
//!
//! - **Write** (`engine.rs`): the node an agent pushes to checks the push as a
//!   single aggregator would, groups the snapshots that passed by partition
//!   ([`partition`]: `xxh3(series key) mod P`), publishes them in one message a subject
//!   (partition p on subject p mod S, the S subjects fixed with the stream), and the
//!   server's name, labels and live hours to the `live` subject; the agent is answered
//!   only after JetStream acknowledged every publish. With the servers'
//!   `sync_interval: always` and a stream of 3 replicas, an acknowledged snapshot is on
//!   the disks of a quorum of NATS nodes.
//! - **Ownership** (`members.rs`): nodes renew a key each in a JetStream KV bucket every
//!   `heartbeat`; the keys alive are the members. Each partition's `owners` (2) are the
//!   members that score highest for it by rendezvous hashing, computed alike by every node.
//! - **Apply** (`apply.rs`): each node applies the partitions it owns (of each message
//!   of a subject, the snapshots of those partitions) through the live consumer once
//!   caught up, with the single aggregator's own path (validation, the version rule)
//!   into its RocksDB in batches (one write group, one WAL sync, per batch of messages
//!   received), acknowledging a message only after that write, and says in its
//!   heartbeat which partitions it is *ready* for (applied to the end of the stream, with
//!   nothing the stream no longer keeps missing). Every node also applies the live subject,
//!   which carries each push's server, labels, live hours and series index: every node
//!   knows every series and server (selection, coverage, the series bound) without their
//!   sketches. Snapshots replace by version, so a redelivered or duplicated message changes
//!   nothing: at-least-once delivery is effectively once in the store.
//! - **Answers** (`peer.rs`, `query.rs`): the entry answers a push once an owner of each
//!   partition (the first of its ready owners to answer; all are asked at once) confirms
//!   the versions it holds after applying the publish (STALE as a
//!   single aggregator would); a query merges the partitions this node is ready for and
//!   asks a ready owner of each other one for its partial merge (`Peer.Partial`), naming
//!   in the coverage any partition no node answered for.
//!
//! ```toml
//! [cluster]
//! node = "agg-1"                    # this node's name, unique in the cluster
//! nats = ["nats://nats-1:4222", "nats://nats-2:4222", "nats://nats-3:4222"]
//! stream = "HOURGLASS"              # the JetStream stream (created if missing)
//! subject_prefix = "hourglass"      # its subjects: PREFIX.p.K and PREFIX.live
//! partitions = 64                   # fixed when the stream is created
//! # subjects = 8                    # partition p on subject p mod subjects; fixed with
//!                                   # the stream (default: the stream's, 8 for a new one;
//!                                   # fewer: fewer messages a push)
//! replicas = 3                      # copies of the stream (NATS nodes)
//! max_age = "7d"                    # how long the stream keeps what was published (a
//!                                   # node missing older messages copies from another)
//! publish_timeout = "10s"           # longest wait for JetStream's acknowledgement
//! owners = 2                        # nodes that apply and answer for each partition
//! heartbeat = "1s"                  # how often a node renews its membership
//! member_ttl = "10s"                # a node silent this long is gone: its partitions move
//! peer_timeout = "10s"              # longest wait for another node's part of an answer
//! # advertise = "agg-1.hourglass:7700"           # where the others dial this node's gRPC
//! # peer_token_file = "/etc/hourglass/peer-token" # a query token for calls between nodes
//! # peer_ca_file = "/etc/hourglass/ca.pem"        # the CA of the nodes' gRPC TLS
//! # peer_cert_file = "/etc/hourglass/tls/tls.crt" # presented to nodes requiring mutual TLS
//! # peer_key_file = "/etc/hourglass/tls/tls.key"  # its key
//! # credentials = "/etc/hourglass/nats.creds"  # a NATS credentials file
//! # ca_file = "/etc/hourglass/nats-ca.pem"     # trust this CA for tls:// URLs
//! ```

mod apply;
mod barrier;
mod copy;
mod engine;
mod members;
mod peer;
mod query;

use std::time::Duration;

pub(crate) use apply::{consumer_name, run};
pub(crate) use barrier::index_caught_up;
pub(crate) use peer::{PeerService, held};
pub(crate) use query::{Asked, fan_out};

/// The key of the live subject where partitions are keyed by number.
pub(crate) const LIVE: u32 = u32::MAX;
pub use engine::ClusterError;
pub(crate) use engine::{Cluster, PublishError};

pub use crate::config::ClusterConfig;
pub(crate) use crate::config::server_addrs;

/// The consumers' timings, all derived from `max_age` (DESIGN §10): every guard against
/// applying past a message the stream dropped unseen is timed from it.
impl ClusterConfig {
    /// The pull requests' heartbeat. A connection that stops delivering shows as missed
    /// heartbeats well before a message could age out of the stream unseen (a quarter of
    /// max_age, 2 to 10 s, for two): the consumer is then opened again, which checks what
    /// the stream dropped meanwhile.
    pub(crate) fn pull_heartbeat(&self) -> Duration {
        (self.max_age / 8).clamp(Duration::from_secs(1), Duration::from_secs(5))
    }

    /// Nothing received for this long, a consume loop asks its consumer what it delivered
    /// (`apply.rs`, `idle`): four pull heartbeats, and at most a quarter of max_age, so
    /// that a quiet subject's position follows the stream closely enough.
    pub(crate) fn quiet(&self) -> Duration {
        (self.pull_heartbeat() * 4).min(self.max_age / 4)
    }

    /// A consume loop not asking for messages this long (one message retried in place
    /// after a store failure, a process frozen or starved) stalls its consumer: it looks
    /// at nothing meanwhile, and what the stream drops before it looks again it would look
    /// past without a gap in its deliveries. A stalled consumer vouches for nothing more.
    pub(crate) fn stall(&self) -> Duration {
        self.max_age / 4
    }

    /// The longest a running consume loop goes without showing it runs (its quiet time,
    /// and a stall): longer, its consumer vouches for nothing ([`barrier::caught_up`]).
    pub(crate) fn unchecked(&self) -> Duration {
        self.quiet() + self.stall()
    }
}

impl ClusterConfig {
    /// How many subjects the partitions are grouped into: the stream's, once the node
    /// connected ([`Cluster::connect`] sets `subjects` from the stream).
    pub(crate) fn subject_count(&self) -> u32 {
        self.subjects
            .unwrap_or(self.partitions)
            .clamp(1, self.partitions.max(1))
    }

    /// The subject partition `p` is published on: `PREFIX.p.K`, K = p mod the subjects.
    pub(crate) fn partition_subject(&self, p: u32) -> String {
        format!("{}.p.{}", self.subject_prefix, p % self.subject_count())
    }

    /// The subject of liveness declarations (server, labels, live hours).
    pub(crate) fn live_subject(&self) -> String {
        format!("{}.live", self.subject_prefix)
    }

    /// The subject `p` is applied from: the live subject for [`LIVE`], else the
    /// partition's.
    pub(crate) fn subject(&self, p: u32) -> String {
        if p == LIVE {
            self.live_subject()
        } else {
            self.partition_subject(p)
        }
    }
}

pub use crate::placement::partition;

#[cfg(test)]
mod tests {
    use super::*;

    /// The node's name is part of its durable consumer's name, which JetStream refuses
    /// with a space, '*', '>', '/' or '\\': such a node would start, publish, and never
    /// apply anything, answering every query from an empty store.
    #[test]
    fn a_node_name_jetstream_refuses_as_a_consumer_name_is_refused() {
        let ok = ClusterConfig::new("agg-1", vec!["nats://127.0.0.1:4222".into()]);
        for bad in ["agg 1", "agg*", "agg>", "a/b", "a\\b"] {
            let config = ClusterConfig {
                node: bad.into(),
                ..ok.clone()
            };
            let e = config.validate().map_err(|e| e.to_string());
            assert!(
                matches!(&e, Err(m) if m.contains("cluster.node")),
                "{bad:?} was accepted: {e:?}"
            );
        }
    }

    #[test]
    fn every_field_is_checked_by_name() {
        let ok = ClusterConfig::new("agg-1", vec!["nats://127.0.0.1:4222".into()]);
        ok.validate().unwrap();
        let cases: Vec<(&str, ClusterConfig)> = vec![
            (
                "cluster.node",
                ClusterConfig {
                    node: "a.b".into(),
                    ..ok.clone()
                },
            ),
            (
                "cluster.node",
                ClusterConfig {
                    node: String::new(),
                    ..ok.clone()
                },
            ),
            (
                "cluster.nats",
                ClusterConfig {
                    nats: vec![],
                    ..ok.clone()
                },
            ),
            (
                "cluster.nats",
                ClusterConfig {
                    nats: vec!["nats://h:port".into()],
                    ..ok.clone()
                },
            ),
            (
                "cluster.stream",
                ClusterConfig {
                    stream: "a.b".into(),
                    ..ok.clone()
                },
            ),
            (
                "cluster.subject_prefix",
                ClusterConfig {
                    subject_prefix: "a..b".into(),
                    ..ok.clone()
                },
            ),
            (
                "cluster.partitions",
                ClusterConfig {
                    partitions: 0,
                    ..ok.clone()
                },
            ),
            (
                "cluster.replicas",
                ClusterConfig {
                    replicas: 6,
                    ..ok.clone()
                },
            ),
            (
                "cluster.peer_cert_file",
                ClusterConfig {
                    peer_ca_file: Some("ca.pem".into()),
                    peer_cert_file: Some("node.pem".into()),
                    ..ok.clone()
                },
            ),
            (
                "cluster.peer_cert_file",
                ClusterConfig {
                    peer_cert_file: Some("node.pem".into()),
                    peer_key_file: Some("node.key".into()),
                    ..ok.clone()
                },
            ),
            (
                "cluster.max_age",
                ClusterConfig {
                    max_age: Duration::from_millis(999),
                    ..ok.clone()
                },
            ),
            (
                "cluster.publish_timeout",
                ClusterConfig {
                    publish_timeout: Duration::ZERO,
                    ..ok.clone()
                },
            ),
        ];
        for (field, config) in cases {
            let e = config.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }
}
