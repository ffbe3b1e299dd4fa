//! The connection to NATS JetStream: the stream, and publishing a push to it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::jetstream::stream::{Config as StreamConfig, DiscardPolicy, StorageType};
use hourglass_rpc::proto::v1;
use prost::Message;

use super::ClusterConfig;
use crate::metrics::PublishStats;
use crate::store::{Store, StoreError, StreamPosition};

/// The stream's metadata key that records its partition count when each partition has
/// a subject of its own (every stream made before subjects were grouped).
const PARTITIONS_KEY: &str = "hourglass.partitions";

/// The stream's metadata keys when its partitions are grouped into fewer subjects: the
/// partition count and the subjects. Not [`PARTITIONS_KEY`]: a build that knows only
/// that key finds no partition count on such a stream and refuses to start on it, where
/// it would read a subject as one partition's and answer for the others as empty.
const GROUPED_PARTITIONS_KEY: &str = "hourglass.grouped_partitions";
const SUBJECTS_KEY: &str = "hourglass.subjects";

/// How long one JetStream request at start-up may take before it is tried again.
const STARTUP_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How long start-up waits for JetStream (its servers may still be electing a leader).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Why cluster mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A file named in `[cluster]` could not be read.
    #[error("cluster: cannot read {what} {}: {source}", path.display())]
    File {
        /// `cluster.credentials` or `cluster.ca_file`.
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The NATS servers could not be reached.
    #[error("cluster: cannot connect to NATS at {urls}: {detail}")]
    Connect {
        /// `cluster.nats`, joined.
        urls: String,
        /// The client's error.
        detail: String,
    },
    /// The stream could not be created or read.
    #[error("cluster: JetStream stream {stream}: {detail}")]
    Stream {
        /// The stream's name.
        stream: String,
        /// What went wrong.
        detail: String,
    },
    /// The stream exists with another partition count than the configuration's.
    #[error(
        "cluster: stream {stream} was created with {found} partitions but cluster.partitions = {configured}; the partition count is fixed for a stream's life"
    )]
    Partitions {
        /// The stream's name.
        stream: String,
        /// What the stream records.
        found: String,
        /// What the configuration says.
        configured: u32,
    },
    /// The stream groups its partitions into another number of subjects than the
    /// configuration's.
    #[error(
        "cluster: stream {stream} groups its partitions into {found} subjects but cluster.subjects = {configured}; the subjects are fixed for a stream's life (leave cluster.subjects out to take the stream's)"
    )]
    Subjects {
        /// The stream's name.
        stream: String,
        /// What the stream records.
        found: u32,
        /// What the configuration says.
        configured: u32,
    },
}

/// The metadata recording a stream's layout: `partitions` grouped into `subjects`.
fn layout_metadata(partitions: u32, subjects: u32) -> std::collections::HashMap<String, String> {
    if subjects == partitions {
        return [(PARTITIONS_KEY.to_string(), partitions.to_string())].into();
    }
    [
        (GROUPED_PARTITIONS_KEY.to_string(), partitions.to_string()),
        (SUBJECTS_KEY.to_string(), subjects.to_string()),
    ]
    .into()
}

/// A stream's layout from its metadata: its partition count as recorded (`None` if it
/// records none) and its subjects (one a partition unless it records them grouped).
fn stream_layout(
    metadata: &std::collections::HashMap<String, String>,
) -> (Option<String>, Option<u32>) {
    match metadata.get(GROUPED_PARTITIONS_KEY) {
        Some(grouped) => (
            Some(grouped.clone()),
            metadata.get(SUBJECTS_KEY).and_then(|s| s.parse().ok()),
        ),
        None => {
            let partitions = metadata.get(PARTITIONS_KEY).cloned();
            let subjects = partitions.as_deref().and_then(|p| p.parse().ok());
            (partitions, subjects)
        }
    }
}

/// Why a push could not be published; nothing of it may be acknowledged to the agent.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// One snapshot alone is larger than the largest message the NATS servers accept.
    #[error(
        "snapshots[{index}] needs a {bytes}-byte message, more than the NATS servers' max_payload of {max} bytes"
    )]
    TooLarge {
        /// Its index in the push.
        index: usize,
        /// The message it needs.
        bytes: usize,
        /// The servers' limit.
        max: usize,
    },
    /// JetStream did not acknowledge a publish (unreachable, no quorum, timeout).
    #[error("JetStream did not acknowledge the publish to {subject}: {detail}")]
    NotAcknowledged {
        /// The subject.
        subject: String,
        /// The client's error.
        detail: String,
    },
    /// The stream was made again with another layout than the one this node started on:
    /// it would publish partitions where the other nodes do not read them.
    #[error("{0}")]
    LayoutChanged(String),
}

/// A connection to the cluster's stream.
pub struct Cluster {
    config: ClusterConfig,
    /// Set once a consumer found the stream made again with another layout (partitions,
    /// subjects) than this node started on ([`Cluster::check_layout_now`]): why. This node
    /// then publishes nothing and applies nothing until it is restarted, when it takes the
    /// stream's layout.
    layout_changed: std::sync::OnceLock<String>,
    /// The series bound's ledger, shared by this node's entry (which refuses a series
    /// over the bound before publishing, as a single aggregator does) and its apply loop.
    ledger: std::sync::Arc<crate::write::SeriesLedger>,
    /// Per partition (and [`super::LIVE`]), this node's own record of how far it applied
    /// the subject ([`StreamPosition`]): the consumer instance it applies from, the last
    /// delivery of it received and applied, and the stream sequence up to which every
    /// message of the subject is in the store.
    positions: std::sync::Mutex<Positions>,
    /// The store the positions are kept in (set by the apply loop).
    store: std::sync::OnceLock<std::sync::Arc<dyn Store>>,
    /// What this node must have applied before it answers (`barrier.rs`).
    barrier: super::barrier::Barrier,
    /// The members and who owns what.
    members: super::members::Membership,
    /// Clients of the other nodes.
    peers: super::peer::Peers,
    client: async_nats::Client,
    jetstream: jetstream::Context,
}

/// The position watches by subject, and the subjects whose stored position was read.
#[derive(Default)]
struct Positions {
    watches: std::collections::HashMap<u32, tokio::sync::watch::Sender<StreamPosition>>,
    loaded: std::collections::HashSet<u32>,
}

/// One message to publish: the partitions whose snapshots it carries (or
/// [`super::LIVE`] alone), its subject and its encoded push.
struct Outgoing {
    partitions: Vec<u32>,
    subject: String,
    payload: Vec<u8>,
}

impl Outgoing {
    fn is_live(&self) -> bool {
        self.partitions == [super::LIVE]
    }
}

/// Runs `f`, which writes to the store (a RocksDB write can wait behind another thread's
/// WAL sync or a write stall), without holding up the runtime's other tasks: on a
/// worker of a multi-threaded runtime it hands them to another thread first. Elsewhere
/// (a blocking thread, a single-threaded runtime, no runtime) it just runs `f`.
pub(crate) fn off_the_async_threads<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// A stream instance's identity: its name and creation time. A stream deleted and made
/// again under the same name starts its sequences again; its creation time tells it from
/// the one before.
pub(crate) fn stream_identity(info: &jetstream::stream::Info) -> String {
    format!(
        "{}@{}",
        info.config.name,
        info.created.unix_timestamp_nanos()
    )
}

impl Cluster {
    /// Connects to NATS and makes sure the stream exists with this configuration's
    /// partitions, waiting up to a minute for JetStream to be ready.
    /// `advertise` is where the other nodes reach this node's gRPC port.
    pub async fn connect(
        config: ClusterConfig,
        advertise: String,
    ) -> Result<Cluster, ClusterError> {
        let mut options = async_nats::ConnectOptions::new()
            .name(format!("hourglass-aggregator {}", config.node))
            .retry_on_initial_connect();
        if let Some(path) = &config.credentials {
            options =
                options
                    .credentials_file(path)
                    .await
                    .map_err(|source| ClusterError::File {
                        what: "cluster.credentials",
                        path: path.clone(),
                        source,
                    })?;
        }
        if let Some(path) = &config.ca_file {
            std::fs::metadata(path).map_err(|source| ClusterError::File {
                what: "cluster.ca_file",
                path: path.clone(),
                source,
            })?;
            options = options.add_root_certificates(path.clone());
        }
        let urls = config.nats.join(", ");
        let connect_error = |detail: String| ClusterError::Connect {
            urls: urls.clone(),
            detail,
        };
        let addrs = super::server_addrs(&config.nats).map_err(|e| connect_error(e.to_string()))?;
        let client = tokio::time::timeout(START_TIMEOUT, options.connect(addrs))
            .await
            .map_err(|_| connect_error(format!("no server answered within {START_TIMEOUT:?}")))?
            .map_err(|e| connect_error(e.to_string()))?;
        let mut jetstream = jetstream::new(client.clone());
        // Short requests while JetStream may still be electing its leader (each attempt
        // that meets no leader waits out the whole timeout); the publish timeout after.
        jetstream.set_timeout(STARTUP_REQUEST_TIMEOUT);
        let members = super::members::Membership::new(
            config.node.clone(),
            advertise,
            config.owners,
            config.partitions,
            config.member_ttl,
            config.heartbeat,
        );
        let peers = super::peer::Peers::new(&config)?;
        let mut cluster = Cluster {
            peers,
            config,
            layout_changed: Default::default(),
            ledger: Default::default(),
            positions: Default::default(),
            store: Default::default(),
            barrier: Default::default(),
            members,
            client,
            jetstream,
        };
        cluster.ensure_stream().await?;
        let publish_timeout = cluster.config.publish_timeout;
        cluster.jetstream.set_timeout(publish_timeout);
        Ok(cluster)
    }

    /// This node's configuration.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The watch of subject `p`'s position.
    fn position_of(&self, p: u32) -> tokio::sync::watch::Sender<StreamPosition> {
        let mut positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        positions
            .watches
            .entry(p)
            .or_insert_with(|| tokio::sync::watch::Sender::new(StreamPosition::default()))
            .clone()
    }

    /// Keeps this node's positions in `store` from now on.
    pub(crate) fn keep_positions_in(&self, store: std::sync::Arc<dyn Store>) {
        let _ = self.store.set(store);
    }

    /// Changes subject `p`'s position with `change` (which says whether it changed it),
    /// and writes it to the store if it did, under the watch's lock: the store's is never
    /// ahead of the one in memory. A write that fails leaves the store's behind, which is
    /// safe (DESIGN §10); it is logged.
    ///
    /// A change of the live subject's position is a change of every partition the live
    /// consumer carries too ([`super::barrier::Barrier::carry`]): its deliveries vouch for
    /// them as for the live subject.
    fn change_position(&self, p: u32, change: impl Fn(&mut StreamPosition) -> bool) {
        // One hand-over of the runtime's thread for all of them, not one each (the live
        // consumer carries some 40 partitions of 64 on 3 nodes).
        off_the_async_threads(|| {
            self.change_here(p, &change);
            if p == super::LIVE {
                for q in self.barrier.carried() {
                    self.change_here(q, &change);
                }
            }
        });
    }

    /// [`Self::change_position`] of `p` alone.
    fn change_one(&self, p: u32, change: &impl Fn(&mut StreamPosition) -> bool) {
        off_the_async_threads(|| self.change_here(p, change));
    }

    /// [`Self::change_one`] on this thread, whatever it is.
    fn change_here(&self, p: u32, change: &impl Fn(&mut StreamPosition) -> bool) {
        self.position_of(p).send_if_modified(|position| {
            if !change(position) {
                return false;
            }
            if let Some(store) = self.store.get()
                && let Err(e) = store.put_stream_position(p, position)
            {
                tracing::warn!(partition = p, error = %e, "cluster: recording this node's position in the stream");
            }
            true
        });
    }

    /// This node's position in subject `p` (or [`super::LIVE`]) of the stream instance
    /// `stream` ([`stream_identity`]), read from the store the first time (a restart
    /// resumes from it). A position recorded in another instance of the stream (deleted
    /// and made again: its sequences started over), or in none, says nothing of this one:
    /// it starts over at nothing applied, recorded at once. (The positions the live
    /// messages named are kept per instance by the read barrier.)
    pub(crate) fn load_position(&self, p: u32, stream: &str) -> Result<StreamPosition, StoreError> {
        let first = {
            let positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
            !positions.loaded.contains(&p)
        };
        if first && let Some(store) = self.store.get() {
            let stored = store.stream_position(p)?.unwrap_or_default();
            self.position_of(p).send_if_modified(|held| {
                if held.stream.is_empty() && held.consumer.is_empty() && held.applied == 0 {
                    *held = stored;
                    return true;
                }
                false
            });
            let mut positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
            positions.loaded.insert(p);
        }
        let other = self.position(p).stream != stream;
        if other {
            let was = self.position(p);
            if !was.stream.is_empty() || was.applied > 0 {
                tracing::warn!(
                    partition = p,
                    recorded_in = %was.stream,
                    now = %stream,
                    applied_there = was.applied,
                    "the stream is another instance than the one this node's position counts in (deleted and made again?): applying it from its start"
                );
            }
            self.change_one(p, &|position| {
                *position = StreamPosition {
                    stream: stream.to_string(),
                    ..StreamPosition::default()
                };
                true
            });
        }
        Ok(self.position(p))
    }

    /// This node's position in subject `p` (or [`super::LIVE`]).
    pub(crate) fn position(&self, p: u32) -> StreamPosition {
        self.position_of(p).borrow().clone()
    }

    /// Records that this node applies subject `p` from the consumer instance `consumer`
    /// from now on, none of whose deliveries it received yet.
    pub(crate) fn follow(&self, p: u32, consumer: &str) {
        self.change_one(p, &|position| {
            position.consumer = consumer.to_string();
            position.delivered = 0;
            true
        });
    }

    /// Records that the live consumer, at this node's position `live` in the live
    /// subject, vouches for partition `p` from now on, every message of which up to the
    /// position of `p` this node had is in the store; returns `p`'s position then. Called
    /// by the live consumer's loop between two batches, once `p` is in its filter and `p`
    /// is applied up to where the consumer was when it was added (DESIGN §10).
    pub(crate) fn adopt_position(&self, p: u32, live: &StreamPosition) -> StreamPosition {
        self.change_one(p, &|position| {
            position.consumer = live.consumer.clone();
            position.delivered = live.delivered;
            position.applied = position.applied.max(live.applied);
            true
        });
        self.position(p)
    }

    /// Records that no consumer instance's deliveries vouch for anything of `p` here any
    /// more (its consumer stalled: what it looks past may have aged out unseen), as long as
    /// it is still `consumer`.
    pub(crate) fn distrust(&self, p: u32, consumer: &str) {
        self.change_position(p, |position| {
            let same = position.consumer == consumer;
            if same {
                position.consumer.clear();
            }
            same
        });
    }

    /// Records that this node received and applied delivery `delivered` of `consumer`,
    /// the message at stream `sequence` of `p`, and every delivery of it before.
    pub(crate) fn record_delivery(&self, p: u32, consumer: &str, delivered: u64, sequence: u64) {
        self.change_position(p, |position| {
            let mut changed = false;
            if position.consumer == consumer && delivered > position.delivered {
                position.delivered = delivered;
                changed = true;
            }
            if sequence > position.applied {
                position.applied = sequence;
                changed = true;
            }
            changed
        });
    }

    /// Records that every message of partition `p`'s subject up to stream `sequence` of
    /// the stream instance `stream` is applied for `p`, read in order from the stream by
    /// no consumer instance `p`'s position names (a catch-up of its subject): the
    /// position no longer names one, so that `p`'s own consumer is made again to start
    /// right after it. Nothing changes if `p`'s position counts in another instance or is
    /// already that far.
    pub(crate) fn record_read(&self, p: u32, stream: &str, sequence: u64) {
        self.change_one(p, &|position| {
            if position.stream != stream || sequence <= position.applied {
                return false;
            }
            position.applied = sequence;
            position.consumer.clear();
            position.delivered = 0;
            true
        });
    }

    /// Records that every message of partition `p` (or [`super::LIVE`]) up to stream
    /// `sequence` is in the store.
    pub(crate) fn record_applied(&self, p: u32, sequence: u64) {
        self.change_position(p, |position| {
            let newer = sequence > position.applied;
            if newer {
                position.applied = sequence;
            }
            newer
        });
    }

    /// Waits up to `timeout` for this node to have applied `p` up to stream `sequence`;
    /// false if it did not.
    pub(crate) async fn wait_applied(&self, p: u32, sequence: u64, timeout: Duration) -> bool {
        let mut position = self.position_of(p).subscribe();
        tokio::time::timeout(timeout, position.wait_for(|at| at.applied >= sequence))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Waits up to `timeout` for this node to have received and applied delivery
    /// `delivered` of `consumer` (and every one before); false if it did not, or stopped
    /// following that consumer instance.
    pub(crate) async fn wait_delivered(
        &self,
        p: u32,
        consumer: &str,
        delivered: u64,
        timeout: Duration,
    ) -> bool {
        let mut position = self.position_of(p).subscribe();
        let reached = tokio::time::timeout(
            timeout,
            position.wait_for(|at| at.consumer != consumer || at.delivered >= delivered),
        )
        .await;
        match reached {
            Ok(Ok(at)) => at.consumer == consumer,
            _ => false,
        }
    }

    /// How far this node applied `p` (or [`super::LIVE`]): every message of it up to
    /// this stream sequence is in the store.
    pub(crate) fn applied(&self, p: u32) -> u64 {
        self.position_of(p).borrow().applied
    }

    /// What this node must have applied before it answers.
    pub(crate) fn barrier(&self) -> &super::barrier::Barrier {
        &self.barrier
    }

    /// The highest position this node applied of any subject.
    pub(crate) fn applied_max(&self) -> u64 {
        let positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        positions
            .watches
            .values()
            .map(|w| w.borrow().applied)
            .max()
            .unwrap_or(0)
    }

    /// Clients of the other nodes.
    pub(crate) fn peers(&self) -> &super::peer::Peers {
        &self.peers
    }

    /// The stream's last sequence, as JetStream reports it now.
    pub(crate) async fn stream_last_sequence(&self) -> Result<u64, ClusterError> {
        Ok(self.stream_state().await?.last_sequence)
    }

    /// The stream sequence of the last message on `subject`, as the stream's leader holds
    /// it now (0 if it holds none): unlike a consumer's report, never read from a replica
    /// of the stream that is behind its leader.
    pub(crate) async fn last_sequence_of(&self, subject: &str) -> Result<u64, ClusterError> {
        let error = |detail: String| ClusterError::Stream {
            stream: self.config.stream.clone(),
            detail,
        };
        let stream = self
            .jetstream
            .get_stream_no_info(&self.config.stream)
            .await
            .map_err(|e| error(e.to_string()))?;
        match stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => Ok(message.sequence),
            Err(e) if e.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {
                Ok(0)
            }
            Err(e) => Err(error(e.to_string())),
        }
    }

    /// The stream's first sequence, as JetStream reports it now: the messages before it
    /// are gone (`max_age`).
    pub(crate) async fn stream_first_sequence(&self) -> Result<u64, ClusterError> {
        Ok(self.stream_state().await?.first_sequence)
    }

    /// The stream's state, as JetStream reports it now (one request).
    async fn stream_state(&self) -> Result<jetstream::stream::State, ClusterError> {
        Ok(self.stream_info().await?.state)
    }

    /// The stream's configuration, state and placement, as JetStream reports them now
    /// (one request).
    pub(crate) async fn stream_info(&self) -> Result<jetstream::stream::Info, ClusterError> {
        let stream = self
            .jetstream
            .get_stream(&self.config.stream)
            .await
            .map_err(|e| ClusterError::Stream {
                stream: self.config.stream.clone(),
                detail: e.to_string(),
            })?;
        Ok(stream.cached_info().clone())
    }

    /// The members and who owns what.
    pub(crate) fn members(&self) -> &super::members::Membership {
        &self.members
    }

    /// The series bound's ledger of this node.
    pub(crate) fn ledger(&self) -> &std::sync::Arc<crate::write::SeriesLedger> {
        &self.ledger
    }

    /// The JetStream context, for the apply loop's consumer.
    pub(crate) fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// Creates the stream if it is missing, or checks the one there, retrying while
    /// JetStream has no leader yet.
    async fn ensure_stream(&mut self) -> Result<(), ClusterError> {
        let c = &self.config;
        let wanted = StreamConfig {
            name: c.stream.clone(),
            subjects: vec![format!("{}.>", c.subject_prefix)],
            num_replicas: c.replicas,
            storage: StorageType::File,
            max_age: c.max_age,
            discard: DiscardPolicy::Old,
            metadata: layout_metadata(
                c.partitions,
                c.subjects
                    .unwrap_or(crate::config::DEFAULT_SUBJECTS)
                    .min(c.partitions),
            ),
            description: Some("hourglass: the aggregators' write log (DESIGN §10)".into()),
            ..StreamConfig::default()
        };
        let started = Instant::now();
        // The answer that found or made the stream carries its configuration: asking again
        // right after another node made it may meet no stream leader yet and time out,
        // which failed this node's start (seen in CI).
        let stream = loop {
            match self.jetstream.get_or_create_stream(wanted.clone()).await {
                Ok(stream) => break stream,
                Err(e) if started.elapsed() < START_TIMEOUT => {
                    tracing::info!(stream = %c.stream, error = %e, "waiting for JetStream");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    return Err(ClusterError::Stream {
                        stream: c.stream.clone(),
                        detail: e.to_string(),
                    });
                }
            }
        };
        let info = stream.cached_info().clone();
        let subjects = self.check_layout(&info.config.metadata)?;
        let c = &self.config;
        // A stream made with other settings would silently weaken durability (fewer
        // copies) or miss every publish (other subjects): refuse to start on it.
        let mismatch = |setting: &str, found: String, configured: String| ClusterError::Stream {
            stream: c.stream.clone(),
            detail: format!(
                "it exists with {setting} {found} but this node is configured for {configured}; \
                 change the configuration or the stream (nats stream edit)"
            ),
        };
        if info.config.num_replicas != c.replicas {
            return Err(mismatch(
                "replicas",
                info.config.num_replicas.to_string(),
                format!("{} (cluster.replicas)", c.replicas),
            ));
        }
        if info.config.subjects != wanted.subjects {
            return Err(mismatch(
                "subjects",
                format!("{:?}", info.config.subjects),
                format!("{:?} (cluster.subject_prefix)", wanted.subjects),
            ));
        }
        if let Err((setting, found, configured)) = check_limits(&info.config, c) {
            return Err(mismatch(&setting, found, configured));
        }
        tracing::info!(
            stream = %c.stream,
            partitions = c.partitions,
            subjects,
            replicas = info.config.num_replicas,
            "cluster stream ready"
        );
        self.config.subjects = Some(subjects);
        Ok(())
    }

    /// Checks the layout of the stream as it is now (`metadata`: it may have been made
    /// again since this node started) against the one this node started on. On a
    /// difference this node stops publishing ([`PublishError::LayoutChanged`]) and the
    /// error says why; its consumers, which call this when they open, apply nothing.
    pub(crate) fn check_layout_now(
        &self,
        metadata: &std::collections::HashMap<String, String>,
    ) -> Result<(), String> {
        let c = &self.config;
        let (partitions, subjects) = stream_layout(metadata);
        let mine = (c.partitions.to_string(), c.subject_count());
        if partitions.as_ref() == Some(&mine.0) && subjects == Some(mine.1) {
            return Ok(());
        }
        let found = match (partitions, subjects) {
            (Some(p), Some(s)) => format!("{p} partitions in {s} subjects"),
            _ => "no layout hourglass reads".to_string(),
        };
        let why = format!(
            "the stream {} was made again with {found}, where this node started on {} partitions in {} subjects; it publishes and applies nothing until it is restarted",
            c.stream, mine.0, mine.1
        );
        if self.layout_changed.set(why.clone()).is_ok() {
            tracing::error!("cluster: {why}");
        }
        Err(why)
    }

    /// Checks the stream's layout (`metadata`) against the configuration's: the same
    /// partitions, and the same subjects if the configuration names them. Returns the
    /// stream's subjects.
    fn check_layout(
        &self,
        metadata: &std::collections::HashMap<String, String>,
    ) -> Result<u32, ClusterError> {
        let c = &self.config;
        let (partitions, subjects) = stream_layout(metadata);
        if partitions.as_deref() != Some(c.partitions.to_string().as_str()) {
            return Err(ClusterError::Partitions {
                stream: c.stream.clone(),
                found: partitions.unwrap_or_else(|| "an unknown number of".into()),
                configured: c.partitions,
            });
        }
        let subjects = subjects
            .filter(|s| (1..=c.partitions).contains(s))
            .ok_or_else(|| ClusterError::Stream {
                stream: c.stream.clone(),
                detail: format!(
                    "its metadata {SUBJECTS_KEY} is missing or not between 1 and its {} partitions",
                    c.partitions
                ),
            })?;
        match c.subjects {
            Some(configured) if configured != subjects => Err(ClusterError::Subjects {
                stream: c.stream.clone(),
                found: subjects,
                configured,
            }),
            _ => Ok(subjects),
        }
    }

    /// Publishes a checked push: `snapshots` (each with its partition) in one message per
    /// subject their partitions are grouped into (more when a subject's would exceed the
    /// servers' max_payload), and the server with its live hours on the live subject. Returns once JetStream acknowledged
    /// every message; on error some may have been published, which is harmless (a retry
    /// republishes them and the version rule absorbs the duplicates).
    pub async fn publish(
        &self,
        server: &v1::Server,
        live_hours: &[u32],
        snapshots: Vec<(u32, usize, v1::Snapshot)>,
    ) -> Result<PublishStats, PublishError> {
        if let Some(why) = self.layout_changed.get() {
            return Err(PublishError::LayoutChanged(why.clone()));
        }
        let started = Instant::now();
        let (partitions, live): (Vec<Outgoing>, Vec<Outgoing>) = self
            .messages(server, live_hours, snapshots)?
            .into_iter()
            .partition(|m| !m.is_live());
        let (messages, mut bytes) = (partitions.len() + live.len(), 0);
        // The partitions' messages first; the live message(s) only once JetStream holds
        // them, naming their positions: a node that applied the live message knows how
        // far each partition must be applied to answer for this push (`barrier.rs`).
        let mut sequences = BTreeMap::new();
        bytes += self.publish_all(partitions, None, &mut sequences).await?;
        let positions = super::barrier::encode_positions(&sequences);
        bytes += self
            .publish_all(live, Some(&positions), &mut sequences)
            .await?;
        let last_sequence = sequences.values().copied().max().unwrap_or(0);
        Ok(PublishStats {
            messages,
            bytes,
            seconds: started.elapsed().as_secs_f64(),
            last_sequence,
            sequences,
        })
    }

    /// Publishes `messages` (with `positions` as their [`super::barrier::POSITIONS_HEADER`])
    /// at once and waits for every acknowledgement, recording in `sequences` the highest
    /// of each partition. Returns the payload bytes published.
    async fn publish_all(
        &self,
        messages: Vec<Outgoing>,
        positions: Option<&str>,
        sequences: &mut BTreeMap<u32, u64>,
    ) -> Result<usize, PublishError> {
        let mut pending = Vec::with_capacity(messages.len());
        let mut bytes = 0;
        for m in messages {
            bytes += m.payload.len();
            let ack = match positions {
                Some(positions) => {
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert(super::barrier::POSITIONS_HEADER, positions);
                    self.jetstream
                        .publish_with_headers(m.subject.clone(), headers, m.payload.into())
                        .await
                }
                None => {
                    self.jetstream
                        .publish(m.subject.clone(), m.payload.into())
                        .await
                }
            }
            .map_err(|e| PublishError::NotAcknowledged {
                subject: m.subject.clone(),
                detail: e.to_string(),
            })?;
            pending.push((m.partitions, m.subject, ack));
        }
        for (partitions, subject, ack) in pending {
            let ack = ack.await.map_err(|e| PublishError::NotAcknowledged {
                subject,
                detail: e.to_string(),
            })?;
            for p in partitions {
                let at = sequences.entry(p).or_insert(0);
                *at = ack.sequence.max(*at);
            }
        }
        Ok(bytes)
    }

    /// The message `snapshot` alone needs, from `server`, when it is more than the NATS
    /// servers' max_payload: `(bytes, max)`. Such a snapshot cannot be published.
    pub(crate) fn too_large(
        &self,
        server: &v1::Server,
        snapshot: &v1::Snapshot,
    ) -> Option<(usize, usize)> {
        let max = self.client.server_info().max_payload;
        let bytes = header(server).encoded_len() + entry_bytes(snapshot);
        (bytes > max).then_some((bytes, max))
    }

    /// The messages of one push: per subject, as few as the payload limit allows.
    fn messages(
        &self,
        server: &v1::Server,
        live_hours: &[u32],
        snapshots: Vec<(u32, usize, v1::Snapshot)>,
    ) -> Result<Vec<Outgoing>, PublishError> {
        let max = self.client.server_info().max_payload;
        split(&self.config, max, server, live_hours, snapshots)
    }
}

/// A push message from `server` before its snapshots (and live hours) are added.
/// Whether the stream drops messages only as this node's configuration says: after
/// `cluster.max_age`, and by no other limit (a count, a size, a per-subject count, or a
/// retention other than limits). Every guard against applying past a message the stream
/// dropped unseen (the consumers' timings, the lag check) is derived from
/// `cluster.max_age`: a stream that drops sooner or otherwise would defeat them. Else
/// the setting, what the stream has and what this node expects.
pub(crate) fn check_limits(
    stream: &jetstream::stream::Config,
    c: &ClusterConfig,
) -> Result<(), (String, String, String)> {
    let unlimited = |setting: &str, found: i64| {
        if found > 0 {
            Err((
                setting.to_string(),
                found.to_string(),
                "none (messages leave the stream only by cluster.max_age)".to_string(),
            ))
        } else {
            Ok(())
        }
    };
    if stream.max_age != c.max_age {
        return Err((
            "max_age".into(),
            format!("{:?}", stream.max_age),
            format!("{:?} (cluster.max_age)", c.max_age),
        ));
    }
    unlimited("max_msgs", stream.max_messages)?;
    unlimited("max_bytes", stream.max_bytes)?;
    unlimited("max_msgs_per_subject", stream.max_messages_per_subject)?;
    if stream.retention != jetstream::stream::RetentionPolicy::Limits {
        return Err((
            "retention".into(),
            format!("{:?}", stream.retention),
            "Limits".into(),
        ));
    }
    Ok(())
}

fn header(server: &v1::Server) -> v1::PushRequest {
    v1::PushRequest {
        server: Some(server.clone()),
        snapshots: vec![],
        live_hours: vec![],
    }
}

/// What `snapshot` adds to a push message: a repeated field's entry, its tag, its length
/// and its bytes.
fn entry_bytes(snapshot: &v1::Snapshot) -> usize {
    let len = snapshot.encoded_len();
    1 + prost::length_delimiter_len(len) + len
}

/// The messages of one push for servers whose max_payload is `max`: the snapshots by
/// subject (the partitions it groups, in order), and the live message(s) with the
/// server, its live hours and the push's series index ([`series_index`]).
fn split(
    config: &ClusterConfig,
    max: usize,
    server: &v1::Server,
    live_hours: &[u32],
    snapshots: Vec<(u32, usize, v1::Snapshot)>,
) -> Result<Vec<Outgoing>, PublishError> {
    let header = header(server);
    let index = series_index(snapshots.iter().map(|(_, i, s)| (*i, s)));
    let mut by_subject: BTreeMap<u32, Vec<(u32, usize, v1::Snapshot)>> = BTreeMap::new();
    for snapshot in snapshots {
        by_subject
            .entry(snapshot.0 % config.subject_count())
            .or_default()
            .push(snapshot);
    }
    let mut out = Vec::new();
    for (k, mut group) in by_subject {
        // By partition, each in push order (a stable sort).
        group.sort_by_key(|(p, _, _)| *p);
        pack(&mut out, max, config.partition_subject(k), &header, group)?;
    }
    // Always, so that every node registers the server and its labels, as a single
    // aggregator does for a push with no snapshots. Only the first carries live hours.
    let live = v1::PushRequest {
        live_hours: live_hours.to_vec(),
        ..header.clone()
    };
    let index = index
        .into_iter()
        .map(|(i, s)| (super::LIVE, i, s))
        .collect();
    pack(&mut out, max, config.live_subject(), &live, index)?;
    Ok(out)
}

/// Appends `group`'s snapshots (each with its partition, [`super::LIVE`] for the live
/// subject's) to `out` in messages of `first`'s server on `subject`, as few as `max`
/// allows; the first message is `first` itself (with its live hours), the others carry
/// the server alone. One message even for no snapshots.
fn pack(
    out: &mut Vec<Outgoing>,
    max: usize,
    subject: String,
    first: &v1::PushRequest,
    group: Vec<(u32, usize, v1::Snapshot)>,
) -> Result<(), PublishError> {
    let header = v1::PushRequest {
        live_hours: vec![],
        ..first.clone()
    };
    let base = header.encoded_len();
    let mut current = first.clone();
    let mut partitions: Vec<u32> = Vec::new();
    let mut size = current.encoded_len();
    for (p, index, snapshot) in group {
        let entry = entry_bytes(&snapshot);
        if base + entry > max {
            return Err(PublishError::TooLarge {
                index,
                bytes: base + entry,
                max,
            });
        }
        if size + entry > max {
            out.push(Outgoing {
                partitions: std::mem::take(&mut partitions),
                subject: subject.clone(),
                payload: std::mem::replace(&mut current, header.clone()).encode_to_vec(),
            });
            size = base;
        }
        size += entry;
        current.snapshots.push(snapshot);
        if partitions.last() != Some(&p) {
            partitions.push(p);
        }
    }
    if partitions.is_empty() {
        partitions.push(super::LIVE);
    }
    out.push(Outgoing {
        partitions,
        subject,
        payload: current.encode_to_vec(),
    });
    Ok(())
}

/// The series index of a push for the live subject: one entry per series and day, its
/// sketch empty (only its kind), so that every node knows every series of every server
/// (names for queries, the series bound) without holding their sketches.
fn series_index<'a>(
    snapshots: impl Iterator<Item = (usize, &'a v1::Snapshot)>,
) -> Vec<(usize, v1::Snapshot)> {
    let mut seen = std::collections::HashSet::new();
    let mut index = Vec::new();
    for (i, s) in snapshots {
        let kind = s.sketch.as_ref().map_or(0, |k| k.kind);
        let key = (
            s.series.clone().map(|x| x.encode_to_vec()),
            kind,
            s.hour / 24,
        );
        if seen.insert(key) {
            index.push((
                i,
                v1::Snapshot {
                    series: s.series.clone(),
                    hour: s.hour,
                    epoch: 0,
                    version: 0,
                    sketch: Some(v1::EncodedSketch {
                        kind,
                        data: Default::default(),
                    }),
                },
            ));
        }
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> v1::Server {
        v1::Server {
            name: "web-1".into(),
            labels: vec![],
        }
    }

    /// A snapshot whose sketch bytes are `n` long (the split never looks inside them).
    fn snapshot(version: u64, n: usize) -> v1::Snapshot {
        v1::Snapshot {
            series: Some(v1::Series {
                metric: "m".into(),
                tags: vec![],
            }),
            hour: 500_000,
            epoch: 1,
            version,
            sketch: Some(v1::EncodedSketch {
                kind: 1,
                data: vec![7u8; n].into(),
            }),
        }
    }

    fn entry(s: &v1::Snapshot) -> usize {
        let len = s.encoded_len();
        1 + prost::length_delimiter_len(len) + len
    }

    #[test]
    fn the_split_keeps_every_snapshot_in_order_and_each_message_within_max_payload() {
        for subjects in [None, Some(2)] {
            let config = ClusterConfig {
                subjects,
                ..ClusterConfig::new("agg-1", vec!["nats://127.0.0.1:4222".into()])
            };
            split_keeps_every_snapshot(&config);
        }
    }

    /// [`split`] over snapshots of partitions 0 to 2 (version i + 1 in partition i mod
    /// 3): every snapshot in one message of its partition's subject, those of a subject
    /// by partition then in push order, each message naming the partitions it carries.
    fn split_keeps_every_snapshot(config: &ClusterConfig) {
        let base = v1::PushRequest {
            server: Some(server()),
            ..Default::default()
        }
        .encoded_len();
        let partition = |s: &v1::Snapshot| ((s.version - 1) % 3) as u32;
        // Sizes across the 1- and 2-byte length prefixes (127/128) and the 2/3 (16383/16384).
        let sizes = [
            0usize, 1, 100, 120, 127, 128, 300, 16_000, 16_380, 16_384, 5, 9_000,
        ];
        for max in [base + entry(&snapshot(1, 16_384)), 20_000, 40_000, 70_000] {
            let input: Vec<(u32, usize, v1::Snapshot)> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| ((i % 3) as u32, i, snapshot(i as u64 + 1, n)))
                .collect();
            let out = split(config, max, &server(), &[1, 2], input.clone()).unwrap();
            let mut got: Vec<v1::Snapshot> = Vec::new();
            let mut index = Vec::new();
            for m in &out {
                assert!(m.payload.len() <= max, "{} > {max}", m.payload.len());
                let r = v1::PushRequest::decode(m.payload.as_slice()).unwrap();
                assert_eq!(r.server, Some(server()));
                if m.subject == config.live_subject() {
                    assert!(m.is_live());
                    assert_eq!(r.live_hours, vec![1, 2]);
                    index.extend(r.snapshots);
                    continue;
                }
                assert!(!r.snapshots.is_empty(), "an empty message on {}", m.subject);
                let mut carried: Vec<u32> = r.snapshots.iter().map(partition).collect();
                carried.dedup();
                assert_eq!(m.partitions, carried, "{}", m.subject);
                for &p in &m.partitions {
                    assert_eq!(m.subject, config.partition_subject(p));
                }
                got.extend(r.snapshots);
            }
            let mut want: Vec<v1::Snapshot> = input.into_iter().map(|(_, _, s)| s).collect();
            // Stable: push order within a partition.
            want.sort_by_key(|s| (partition(s) % config.subject_count(), partition(s)));
            assert_eq!(got, want, "max {max}");
            // The live message indexes the one series (one day) without its sketch.
            assert_eq!(index.len(), 1, "max {max}");
            assert_eq!(index[0].series, want[0].series);
            assert!(index[0].sketch.as_ref().unwrap().data.is_empty());
        }
    }

    /// A stream records its layout so that a node reads it back; one grouping its
    /// partitions records no `hourglass.partitions`, which a build that knows only that
    /// key takes as an unknown partition count and refuses.
    #[test]
    fn a_streams_layout_reads_back_and_a_grouped_one_hides_its_partitions_from_older_builds() {
        for (partitions, subjects) in [(64, 64), (64, 8), (8, 3), (1, 1)] {
            let metadata = layout_metadata(partitions, subjects);
            assert_eq!(
                stream_layout(&metadata),
                (Some(partitions.to_string()), Some(subjects)),
                "{partitions} in {subjects}"
            );
            assert_eq!(
                metadata.contains_key(PARTITIONS_KEY),
                partitions == subjects,
                "{partitions} in {subjects}"
            );
        }
        // A stream made before subjects were grouped: one a partition.
        let before = [(PARTITIONS_KEY.to_string(), "16".to_string())].into();
        assert_eq!(stream_layout(&before), (Some("16".into()), Some(16)));
        assert_eq!(stream_layout(&Default::default()), (None, None));
    }

    #[test]
    fn a_push_over_partitions_of_one_subject_is_one_message_naming_them_all() {
        let config = ClusterConfig {
            subjects: Some(4),
            ..ClusterConfig::new("agg-1", vec!["nats://127.0.0.1:4222".into()])
        };
        let input: Vec<(u32, usize, v1::Snapshot)> = [9u32, 1, 5, 2, 1]
            .iter()
            .enumerate()
            .map(|(i, &p)| (p, i, snapshot(i as u64 + 1, 10)))
            .collect();
        let out = split(&config, 1 << 20, &server(), &[], input).unwrap();
        let named: Vec<(&str, &[u32])> = out
            .iter()
            .map(|m| (m.subject.as_str(), m.partitions.as_slice()))
            .collect();
        assert_eq!(
            named,
            vec![
                ("hourglass.p.1", &[1u32, 5, 9][..]),
                ("hourglass.p.2", &[2][..]),
                ("hourglass.live", &[crate::cluster::LIVE][..]),
            ]
        );
    }

    #[test]
    fn a_snapshot_exactly_at_max_payload_fits_and_one_byte_more_does_not() {
        let config = ClusterConfig::new("agg-1", vec!["nats://127.0.0.1:4222".into()]);
        let s = snapshot(1, 5_000);
        let max = v1::PushRequest {
            server: Some(server()),
            snapshots: vec![s.clone()],
            live_hours: vec![],
        }
        .encoded_len();
        let out = split(&config, max, &server(), &[], vec![(0, 0, s.clone())]).unwrap();
        assert_eq!(out[0].payload.len(), max);
        // Two of them: two messages, each exactly max.
        let out = split(
            &config,
            max,
            &server(),
            &[],
            vec![(0, 0, s.clone()), (0, 1, s.clone())],
        )
        .unwrap();
        assert_eq!(out.len(), 3);
        assert!(out[..2].iter().all(|m| m.payload.len() == max));
        let e = split(&config, max - 1, &server(), &[], vec![(0, 0, s)])
            .err()
            .unwrap();
        assert!(
            matches!(e, PublishError::TooLarge { index: 0, bytes, max: m } if bytes == max && m == max - 1)
        );
    }
}
