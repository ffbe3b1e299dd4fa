//! `[cluster]`: a node's place in a cluster on NATS JetStream (module
//! [`crate::cluster`], DESIGN §10), its defaults and its checks.

use std::path::PathBuf;
use std::time::Duration;

use hourglass_rpc::time::deserialize_duration;
use serde::Deserialize;

use super::ConfigError;

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
    /// The stream's subjects are `PREFIX.p.K` (the partitions p with p mod `subjects` = K)
    /// and `PREFIX.live`.
    #[serde(default = "default_subject_prefix")]
    pub subject_prefix: String,
    /// How many partitions the series are spread over; fixed when the stream is created.
    #[serde(default = "default_partitions")]
    pub partitions: u32,
    /// How many subjects the partitions are grouped into (partition p on subject
    /// p mod `subjects`): a push is one message a subject it touches, not one a partition
    /// (DESIGN §10). Fixed when the
    /// stream is created: by default the stream's own, or [`DEFAULT_SUBJECTS`] (at most
    /// `partitions`) for a new one; a stream made before subjects were grouped has one a
    /// partition. A value set here must match the stream's.
    #[serde(default)]
    pub subjects: Option<u32>,
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
    /// The longest wait for another node's part of a query or of a push's answer (2 s
    /// more for the way there and back); a question asks a part's other nodes too once
    /// one has not answered within half of it.
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
    /// For tests, not a setting (never read from the file): the partitions of a subject
    /// catch up together from one read of it (DESIGN §10, "catching up by subject") when
    /// they are at least this many stream messages behind its last message (else each
    /// through its own consumer).
    #[serde(skip)]
    #[doc(hidden)]
    pub catch_up_behind: u64,
    /// For tests, not a setting (never read from the file): this node's partitions stay
    /// with consumers of their own, never carried by its live consumer nor caught up by
    /// subject (DESIGN §10), so that a test can act on the deliveries of one partition's
    /// consumer.
    #[serde(skip)]
    #[doc(hidden)]
    pub own_partition_consumers: bool,
    /// Fault injection for tests, not a setting (never read from the file): a partition
    /// in the live consumer's filter waits this long before it asks to be carried by it,
    /// so that a test can act while partitions are joining.
    #[serde(skip)]
    #[doc(hidden)]
    pub join_hold: Duration,
    /// Fault injection for tests, not a setting (never read from the file): the live
    /// consumer's loop adopts a partition that asked to be carried only this long after
    /// it asked, applying what it receives meanwhile, so that a test can push between a
    /// partition's last batch through its own consumer and its adoption. Under the
    /// longest wait for an adoption (2 s) to be useful.
    #[serde(skip)]
    #[doc(hidden)]
    pub adopt_hold: Duration,
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
/// The subjects a new stream groups its partitions into, unless `cluster.subjects` says:
/// a push touching many partitions is then at most this many messages and the live one
/// (docs/BENCHMARKS.md, "Subjects grouping partitions, in turn").
pub const DEFAULT_SUBJECTS: u32 = 8;
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
            subjects: None,
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
            catch_up_behind: 4096,
            own_partition_consumers: false,
            join_hold: Duration::ZERO,
            adopt_hold: Duration::ZERO,
        }
    }

    /// Checks every field; the error names it.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
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
        self.validate_stream()?;
        self.validate_membership()
    }

    /// Checks the fields of the stream: its name, subjects, partitions, replicas and ages.
    fn validate_stream(&self) -> Result<(), ConfigError> {
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
        if let Some(subjects) = self.subjects
            && !(1..=self.partitions).contains(&subjects)
        {
            return Err(invalid(
                "cluster.subjects",
                &subjects,
                "must be between 1 and cluster.partitions",
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
        Ok(())
    }

    /// Checks the fields of membership, ownership and the calls between nodes.
    fn validate_membership(&self) -> Result<(), ConfigError> {
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
}

/// The error for a `field` whose `value` breaks `rule`.
fn invalid(field: &'static str, value: &dyn std::fmt::Debug, rule: &'static str) -> ConfigError {
    ConfigError::Invalid {
        field,
        value: format!("{value:?}"),
        rule,
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
