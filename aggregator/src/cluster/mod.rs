//! Cluster mode (DESIGN §10): aggregators share one write log, a NATS JetStream stream,
//! instead of each keeping only what was pushed to it.
//!
//! Without a `[cluster]` section none of this runs and NATS is not needed. With one:
//!
//! - **Write** (`engine.rs`): the node an agent pushes to checks the push as a
//!   single aggregator would, groups the snapshots that passed by partition
//!   ([`partition`]: `xxh3(series key) mod P`), publishes each group to its partition's
//!   subject, and the server's name, labels and live hours to the `live` subject; the agent
//!   is answered only after JetStream acknowledged every publish. With the servers'
//!   `sync_interval: always` and a stream of 3 replicas, an acknowledged snapshot is on
//!   the disks of a quorum of NATS nodes.
//! - **Ownership** (`members.rs`): nodes renew a key each in a JetStream KV bucket every
//!   `heartbeat`; the keys alive are the members. Each partition's `owners` (2) are the
//!   members that score highest for it by rendezvous hashing, computed alike by every node.
//! - **Apply** (`apply.rs`): each node applies the partitions it owns, one durable
//!   consumer each, with the single aggregator's own path (validation, the version rule)
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
//! subject_prefix = "hourglass"      # its subjects: PREFIX.p.N and PREFIX.live
//! partitions = 64                   # fixed when the stream is created
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
#[cfg(test)]
mod review4_tests;

use std::path::PathBuf;
use std::time::Duration;

use hourglass_rpc::time::deserialize_duration;
use serde::Deserialize;

pub(crate) use apply::{consumer_name, run};
pub(crate) use barrier::index_caught_up;
pub(crate) use peer::{PeerService, held};
pub(crate) use query::{Asked, fan_out};

/// The key of the live subject where partitions are keyed by number.
pub(crate) const LIVE: u32 = u32::MAX;
pub use engine::ClusterError;
pub(crate) use engine::{Cluster, PublishError, PublishStats};

use crate::config::ConfigError;
use crate::store::SeriesName;

/// `[cluster]`: this node's place in a cluster on NATS JetStream.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's name, unique in the cluster; it names the node's durable consumers.
    /// Required, here or from `--cluster-node` / HOURGLASS_CLUSTER_NODE.
    #[serde(default)]
    pub node: String,
    /// The NATS servers' URLs (`nats://host:port`, `tls://host:port`).
    pub nats: Vec<String>,
    /// The JetStream stream that carries the write log.
    #[serde(default = "default_stream")]
    pub stream: String,
    /// The stream's subjects are `PREFIX.p.N` (partition N) and `PREFIX.live`.
    #[serde(default = "default_subject_prefix")]
    pub subject_prefix: String,
    /// How many partitions the series are spread over; fixed when the stream is created.
    #[serde(default = "default_partitions")]
    pub partitions: u32,
    /// Copies JetStream keeps of the stream.
    #[serde(default = "default_replicas")]
    pub replicas: usize,
    /// How long the stream keeps a message.
    #[serde(default = "default_max_age", deserialize_with = "deserialize_duration")]
    pub max_age: Duration,
    /// The longest wait for JetStream to acknowledge a publish.
    #[serde(
        default = "default_publish_timeout",
        deserialize_with = "deserialize_duration"
    )]
    pub publish_timeout: Duration,
    /// A NATS credentials file (JWT and NKey seed).
    #[serde(default)]
    pub credentials: Option<PathBuf>,
    /// A PEM file of CA certificates to trust for `tls://` NATS URLs.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The `host:port` where the other nodes reach this node's gRPC port (query fan-out,
    /// push answers); by default the gRPC listener's address, unless that is 0.0.0.0 or
    /// `[::]`, which peers cannot dial.
    #[serde(default)]
    pub advertise: Option<String>,
    /// How many nodes own (apply and answer for) each partition.
    #[serde(default = "default_owners")]
    pub owners: usize,
    /// How often a node renews its membership and re-reads the members.
    #[serde(
        default = "default_heartbeat",
        deserialize_with = "deserialize_duration"
    )]
    pub heartbeat: Duration,
    /// A node whose membership was not renewed for this long is gone: its partitions move.
    #[serde(
        default = "default_member_ttl",
        deserialize_with = "deserialize_duration"
    )]
    pub member_ttl: Duration,
    /// The longest wait for another node's part of a query or of a push's answer.
    #[serde(
        default = "default_peer_timeout",
        deserialize_with = "deserialize_duration"
    )]
    pub peer_timeout: Duration,
    /// A file holding the bearer token this node sends to the other nodes (a token of
    /// role query or admin in their `[[auth.tokens]]`); needed when they have tokens.
    #[serde(default)]
    pub peer_token_file: Option<PathBuf>,
    /// A PEM file of CA certificates to trust for the other nodes' gRPC when it has TLS;
    /// without it, peers are dialled in plaintext.
    #[serde(default)]
    pub peer_ca_file: Option<PathBuf>,
    /// A PEM certificate this node presents to the other nodes when their gRPC requires
    /// client certificates (mutual TLS; often the node's own serving certificate, if it
    /// allows client authentication). With `peer_key_file`.
    #[serde(default)]
    pub peer_cert_file: Option<PathBuf>,
    /// The PEM key of `peer_cert_file`.
    #[serde(default)]
    pub peer_key_file: Option<PathBuf>,
    /// Fault injection for tests, not a setting (never read from the file): this node
    /// waits this long before applying each message of the stream, as a slow disk would
    /// make it, so that a test can make one node fall behind the others.
    #[serde(skip)]
    #[doc(hidden)]
    pub apply_delay: Duration,
}

fn default_stream() -> String {
    "HOURGLASS".into()
}
fn default_subject_prefix() -> String {
    "hourglass".into()
}
fn default_partitions() -> u32 {
    64
}
fn default_replicas() -> usize {
    3
}
fn default_max_age() -> Duration {
    Duration::from_secs(7 * 86_400)
}
fn default_publish_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_owners() -> usize {
    2
}
fn default_heartbeat() -> Duration {
    Duration::from_secs(1)
}
fn default_member_ttl() -> Duration {
    Duration::from_secs(10)
}
fn default_peer_timeout() -> Duration {
    Duration::from_secs(10)
}

impl ClusterConfig {
    /// A configuration with every default, for `node` on the servers `nats`.
    pub fn new(node: impl Into<String>, nats: Vec<String>) -> ClusterConfig {
        ClusterConfig {
            node: node.into(),
            nats,
            stream: default_stream(),
            subject_prefix: default_subject_prefix(),
            partitions: default_partitions(),
            replicas: default_replicas(),
            max_age: default_max_age(),
            publish_timeout: default_publish_timeout(),
            credentials: None,
            ca_file: None,
            advertise: None,
            owners: default_owners(),
            heartbeat: default_heartbeat(),
            member_ttl: default_member_ttl(),
            peer_timeout: default_peer_timeout(),
            peer_token_file: None,
            peer_ca_file: None,
            peer_cert_file: None,
            peer_key_file: None,
            apply_delay: Duration::ZERO,
        }
    }

    /// Checks every field; the error names it.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, value: &dyn std::fmt::Debug, rule| ConfigError::Invalid {
            field,
            value: format!("{value:?}"),
            rule,
        };
        // The name is part of the consumer's name and of subjects: the server-name rule.
        // JetStream refuses a consumer name with whitespace, '.', '*', '>' or a path
        // separator: only the token characters the message promises.
        if hourglass_rpc::series::validate_server_name(&self.node).is_err() || !is_token(&self.node)
        {
            return Err(invalid(
                "cluster.node",
                &self.node,
                "must be a server name (letters, digits, '-', '_') without '.', given here or by --cluster-node (HOURGLASS_CLUSTER_NODE)",
            ));
        }
        if self.nats.is_empty() || server_addrs(&self.nats).is_err() {
            return Err(invalid(
                "cluster.nats",
                &self.nats,
                "must list at least one NATS URL, each nats://HOST:PORT or tls://HOST:PORT",
            ));
        }
        if self.peer_cert_file.is_some() != self.peer_key_file.is_some() {
            return Err(invalid(
                "cluster.peer_cert_file",
                &self.peer_cert_file,
                "and cluster.peer_key_file go together: set both or neither",
            ));
        }
        if self.peer_cert_file.is_some() && self.peer_ca_file.is_none() {
            return Err(invalid(
                "cluster.peer_cert_file",
                &self.peer_cert_file,
                "needs cluster.peer_ca_file: a client certificate is only sent over TLS",
            ));
        }
        if !is_token(&self.stream) {
            return Err(invalid(
                "cluster.stream",
                &self.stream,
                "must be letters, digits, '-' or '_'",
            ));
        }
        if !self.subject_prefix.split('.').all(is_token) {
            return Err(invalid(
                "cluster.subject_prefix",
                &self.subject_prefix,
                "must be dot-separated tokens of letters, digits, '-' or '_'",
            ));
        }
        if !(1..=4096).contains(&self.partitions) {
            return Err(invalid(
                "cluster.partitions",
                &self.partitions,
                "must be between 1 and 4096",
            ));
        }
        if !(1..=5).contains(&self.replicas) {
            return Err(invalid(
                "cluster.replicas",
                &self.replicas,
                "must be between 1 and 5 (JetStream's limit)",
            ));
        }
        // Short ages only make nodes copy more (catch-up); a second is JetStream's floor
        // for a useful duplicates window and consumer inactivity.
        if self.max_age < Duration::from_secs(1) {
            return Err(invalid(
                "cluster.max_age",
                &self.max_age,
                "must be at least 1s",
            ));
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(600)).contains(&self.publish_timeout)
        {
            return Err(invalid(
                "cluster.publish_timeout",
                &self.publish_timeout,
                "must be between 100ms and 600s",
            ));
        }
        self.validate_membership()
    }

    /// Checks the fields of membership, ownership and the calls between nodes.
    fn validate_membership(&self) -> Result<(), ConfigError> {
        let invalid = |field, value: &dyn std::fmt::Debug, rule| ConfigError::Invalid {
            field,
            value: format!("{value:?}"),
            rule,
        };
        if let Some(a) = &self.advertise
            && !is_host_port(a)
        {
            return Err(invalid(
                "cluster.advertise",
                a,
                "must be HOST:PORT, the address other nodes dial this node's gRPC port at",
            ));
        }
        if !(1..=16).contains(&self.owners) {
            return Err(invalid(
                "cluster.owners",
                &self.owners,
                "must be between 1 and 16",
            ));
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&self.heartbeat) {
            return Err(invalid(
                "cluster.heartbeat",
                &self.heartbeat,
                "must be between 100ms and 60s",
            ));
        }
        if self.member_ttl < self.heartbeat * 3 {
            return Err(invalid(
                "cluster.member_ttl",
                &self.member_ttl,
                "must be at least 3 heartbeats, so one late heartbeat does not move partitions",
            ));
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(600)).contains(&self.peer_timeout) {
            return Err(invalid(
                "cluster.peer_timeout",
                &self.peer_timeout,
                "must be between 100ms and 600s",
            ));
        }
        Ok(())
    }

    /// The subject of partition `p`.
    pub(crate) fn partition_subject(&self, p: u32) -> String {
        format!("{}.p.{p}", self.subject_prefix)
    }

    /// The subject of liveness declarations (server, labels, live hours).
    pub(crate) fn live_subject(&self) -> String {
        format!("{}.live", self.subject_prefix)
    }
}

/// `s` is `HOST:PORT` with a port number.
fn is_host_port(s: &str) -> bool {
    s.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains(char::is_whitespace) && port.parse::<u16>().is_ok()
    })
}

/// The NATS servers' addresses, each parsed; the error names the URL that is not one.
pub(crate) fn server_addrs(urls: &[String]) -> Result<Vec<async_nats::ServerAddr>, String> {
    urls.iter()
        .map(|u| {
            u.trim()
                .parse::<async_nats::ServerAddr>()
                .map_err(|e| format!("{u:?}: {e}"))
        })
        .collect()
}

/// A NATS subject token or stream name: non-empty, letters, digits, `-` and `_`.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The partition of a series among `partitions`: `xxh3(series key) mod partitions`, where
/// the series key is the store's canonical encoding of the name (kind, metric, sorted
/// tags). Every node computes the same partition for the same series.
pub fn partition(series: &SeriesName, partitions: u32) -> u32 {
    let key = crate::store::series_key(series);
    (xxhash_rust::xxh3::xxh3_64(&key) % u64::from(partitions.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use hourglass_sketch::Kind;

    #[test]
    fn the_partition_is_fixed_by_the_name_not_the_tag_order() {
        let a = SeriesName::new(
            "visitors",
            vec![("region".into(), "eu".into()), ("app".into(), "web".into())],
            Kind::Distinct,
        );
        let b = SeriesName {
            metric: "visitors".into(),
            tags: vec![("region".into(), "eu".into()), ("app".into(), "web".into())],
            kind: Kind::Distinct,
        };
        assert_eq!(partition(&a, 64), partition(&b, 64));
        // Pinned: a change of the key or the hash would move every series of a running
        // cluster to another partition.
        let plain = SeriesName::new("visitors", vec![], Kind::Distinct);
        let pinned = partition(&plain, 1 << 20);
        assert_eq!(partition(&plain, 1 << 20), pinned);
        assert_eq!(
            pinned,
            (xxhash_rust::xxh3::xxh3_64(&crate::store::series_key(&plain)) % (1 << 20)) as u32
        );
    }

    #[test]
    fn series_spread_over_the_partitions() {
        let mut counts = [0u32; 16];
        for i in 0..16_000 {
            let s = SeriesName::new(format!("m{i}"), vec![], Kind::Distinct);
            counts[partition(&s, 16) as usize] += 1;
        }
        // 1000 expected per partition; binomial sd ~31: 6 sd either side.
        assert!(
            counts.iter().all(|&c| (810..=1190).contains(&c)),
            "{counts:?}"
        );
    }

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
