//! What the nodes of a cluster ask each other (the `Peer` gRPC service): partial merges
//! for queries, held versions for push answers, and the cluster's status; and the
//! clients that ask.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hourglass_rpc::proto::v1::{self, peer_client::PeerClient, peer_server::Peer};
use hourglass_sketch::Sketch;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::{Cluster, ClusterConfig, ClusterError};
use crate::convert;
use crate::planner::{Answer, FilterRow, Planner, QueryError};
use crate::store::Store;
use crate::write::{HeldKey, held_versions};
use hourglass_sketch::bloom::Bloom;
use hourglass_sketch::hash::item_hash;

/// Clients of the other nodes: one channel per address, the bearer token and TLS of
/// `[cluster]`.
pub(crate) struct Peers {
    tls: hourglass_rpc::tls::ClientTls,
    bearer: Option<MetadataValue<Ascii>>,
    timeout: Duration,
    channels: Mutex<HashMap<String, Channel>>,
}

impl Peers {
    /// The clients `config` describes; an unreadable token file is an error at start.
    pub(crate) fn new(config: &ClusterConfig) -> Result<Peers, ClusterError> {
        let bearer = match &config.peer_token_file {
            Some(path) => {
                let token = std::fs::read_to_string(path).map_err(|source| ClusterError::File {
                    what: "cluster.peer_token_file",
                    path: path.clone(),
                    source,
                })?;
                let header = hourglass_rpc::tls::bearer_header(token.trim()).map_err(|e| {
                    ClusterError::File {
                        what: "cluster.peer_token_file",
                        path: path.clone(),
                        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
                    }
                })?;
                Some(header)
            }
            None => None,
        };
        Ok(Peers {
            tls: hourglass_rpc::tls::ClientTls {
                ca: config.peer_ca_file.clone(),
                cert: config.peer_cert_file.clone(),
                key: config.peer_key_file.clone(),
            },
            bearer,
            timeout: config.peer_timeout,
            channels: Mutex::new(HashMap::new()),
        })
    }

    /// A client of the node at `advertise`.
    fn client(&self, advertise: &str) -> Result<PeerClient<Channel>, Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        let channel = match channels.get(advertise) {
            Some(channel) => channel.clone(),
            None => {
                let endpoint = self
                    .tls
                    .endpoint(advertise)
                    .map_err(|e| Status::unavailable(format!("peer {advertise}: {e}")))?
                    .connect_timeout(self.timeout);
                let channel = endpoint.connect_lazy();
                channels.insert(advertise.to_string(), channel.clone());
                channel
            }
        };
        // Partials are whole sketches per group: bounded by what the asker merges anyway.
        Ok(PeerClient::new(channel)
            .accept_compressed(tonic::codec::CompressionEncoding::Zstd)
            .send_compressed(tonic::codec::CompressionEncoding::Zstd)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX))
    }

    /// `message` as a request with the token and the deadline.
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = self.untimed_request(message);
        request.set_timeout(self.timeout);
        request
    }

    /// `message` as a request with the token, without a deadline.
    fn untimed_request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(bearer) = &self.bearer {
            request
                .metadata_mut()
                .insert("authorization", bearer.clone());
        }
        request
    }

    /// The longest this node waits for another's answer: `peer_timeout`, and 2 s for the
    /// way there and back.
    pub(crate) fn bound(&self) -> Duration {
        self.timeout + Duration::from_secs(2)
    }

    /// How long a question waits for a node's part before it asks the part's other
    /// nodes too: half of `peer_timeout`, the time the asked node's read barrier has
    /// before it answers, ready or not ([`super::barrier::pass`]).
    pub(crate) fn hedge(&self) -> Duration {
        self.timeout / 2
    }

    /// Asks the node at `advertise` for its partial merge.
    pub(crate) async fn partial(
        &self,
        advertise: &str,
        message: v1::PartialRequest,
    ) -> Result<v1::PartialResponse, Status> {
        let mut client = self.client(advertise)?;
        let call = client.partial(self.request(message));
        Ok(self.bounded(advertise, call).await?.into_inner())
    }

    /// `call` bounded here too: the deadline a request carries (`grpc-timeout`) is the
    /// answering node's to keep, and a connection gone silent (a peer cut off) answers
    /// nothing at all, which would hold the push or the question for ever.
    async fn bounded<T>(
        &self,
        advertise: &str,
        call: impl std::future::Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let limit = self.bound();
        tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            Err(Status::unavailable(format!(
                "peer {advertise} did not answer within {limit:?}"
            )))
        })
    }

    /// Asks the node at `advertise` for a copy (no deadline on the whole: the caller
    /// bounds the wait for each chunk).
    pub(crate) async fn copy(
        &self,
        advertise: &str,
        message: v1::CopyRequest,
    ) -> Result<tonic::Streaming<v1::CopyChunk>, Status> {
        let mut client = self.client(advertise)?;
        let request = self.untimed_request(message);
        Ok(client.copy(request).await?.into_inner())
    }

    /// Asks the node at `advertise` for held versions.
    async fn held(
        &self,
        advertise: &str,
        message: v1::HeldRequest,
    ) -> Result<v1::HeldResponse, Status> {
        let mut client = self.client(advertise)?;
        let call = client.held(self.request(message));
        Ok(self.bounded(advertise, call).await?.into_inner())
    }
}

/// The version held of each of `keys` (snapshots of `server` published at `sequences`,
/// per partition), each from an owner ready for its partition once that owner applied the
/// publish. Every ready owner is asked at once, in one request per node (this node reads
/// its own store), and a partition takes the first answer that comes: one slow or cut
/// owner does not hold the push up while another can vouch for the same partitions.
/// UNAVAILABLE when no ready owner of some partition answers within the publish timeout.
pub(crate) async fn held(
    cluster: &Arc<Cluster>,
    store: &Arc<dyn Store>,
    server: &str,
    keys: Vec<HeldKey>,
    sequences: &BTreeMap<u32, u64>,
) -> Result<Vec<Option<u64>>, Status> {
    let count = cluster.config().partitions;
    let mut by_partition: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        by_partition
            .entry(super::partition(&k.name, count))
            .or_default()
            .push(i);
    }
    let asks = asks_by_node(cluster, by_partition.keys().copied());
    let mut last_error: BTreeMap<u32, String> = by_partition
        .keys()
        .map(|&p| (p, format!("no node is ready for partition {p}")))
        .collect();
    let keys = Arc::new(keys);
    let by_partition = Arc::new(by_partition);
    let mut tasks = tokio::task::JoinSet::new();
    for (node, ask) in asks {
        let (cluster, store, keys, by_partition) = (
            Arc::clone(cluster),
            Arc::clone(store),
            Arc::clone(&keys),
            Arc::clone(&by_partition),
        );
        let (server, sequences) = (server.to_string(), sequences.clone());
        tasks.spawn(async move {
            let answer = held_by_node(
                &cluster,
                &store,
                &server,
                &node,
                &ask,
                &keys,
                &by_partition,
                &sequences,
            )
            .await;
            (node, answer)
        });
    }
    let mut out = vec![None; keys.len()];
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < by_partition.len() {
        let Some(joined) = tasks.join_next().await else {
            break;
        };
        let (node, answers) =
            joined.map_err(|e| Status::internal(format!("held task failed: {e}")))?;
        for (p, answer) in answers {
            match answer {
                Ok(held) if !answered.contains(&p) => {
                    for (&i, h) in by_partition[&p].iter().zip(held) {
                        out[i] = h;
                    }
                    answered.insert(p);
                }
                Ok(_) => {}
                Err(e) => {
                    last_error.insert(p, format!("{node}: {e}"));
                }
            }
        }
    }
    // Dropping the others' requests (the set aborts them): their answers are not needed.
    tasks.abort_all();
    if let Some((p, error)) = last_error.iter().find(|(p, _)| !answered.contains(p)) {
        return Err(Status::unavailable(format!(
            "cluster: no owner of partition {p} confirmed this push's snapshots ({error}); the push is in the stream, retry it for its answer"
        )));
    }
    Ok(out)
}

/// Per node, the partitions of `partitions` it is a ready owner of.
fn asks_by_node(cluster: &Cluster, partitions: impl Iterator<Item = u32>) -> BTreeMap<String, Ask> {
    let mut asks: BTreeMap<String, Ask> = BTreeMap::new();
    for p in partitions {
        for candidate in cluster.members().candidates(p) {
            let ask = asks.entry(candidate.node.clone()).or_insert_with(|| Ask {
                advertise: candidate.advertise.clone(),
                partitions: Vec::new(),
            });
            ask.partitions.push(p);
        }
    }
    asks
}

/// One partition's answer: the versions held of its keys (in order), or why there are none.
type PartitionHeld = Result<Vec<Option<u64>>, String>;

/// What one node is asked for a push's answer: where it is, and the partitions it is a
/// ready owner of.
struct Ask {
    advertise: String,
    partitions: Vec<u32>,
}

/// One node's answers for the partitions of `ask`: per partition, the versions held of
/// its keys (in `by_partition`'s order) or why there are none.
#[allow(clippy::too_many_arguments)]
async fn held_by_node(
    cluster: &Cluster,
    store: &Arc<dyn Store>,
    server: &str,
    node: &str,
    ask: &Ask,
    keys: &[HeldKey],
    by_partition: &BTreeMap<u32, Vec<usize>>,
    sequences: &BTreeMap<u32, u64>,
) -> Vec<(u32, PartitionHeld)> {
    let timeout = cluster.config().publish_timeout;
    let at = |p: u32| sequences.get(&p).copied().unwrap_or(0);
    if node == cluster.members().me() {
        return held_here(cluster, store, server, ask, keys, by_partition, sequences).await;
    }
    let sent = keys_of(&ask.partitions, keys, by_partition);
    let request = v1::HeldRequest {
        server: server.to_string(),
        snapshots: sent.iter().map(held_snapshot).collect(),
        wait_for: ask.partitions.iter().map(|&p| (p, at(p))).collect(),
        timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
    };
    let error = match cluster.peers().held(&ask.advertise, request).await {
        Ok(reply) if reply.held.len() == sent.len() => {
            let held = reply
                .held
                .into_iter()
                .map(|v| (v > 0).then_some(v))
                .collect();
            let mut answers = split(&ask.partitions, by_partition, held);
            for (p, answer) in &mut answers {
                if reply.unanswered.contains(p) {
                    *answer = Err(format!(
                        "not ready for partition {p}, or not applied up to {} in time",
                        at(*p)
                    ));
                }
            }
            return answers;
        }
        Ok(reply) => format!(
            "answered {} versions for {} snapshots",
            reply.held.len(),
            sent.len()
        ),
        Err(status) => status.message().to_string(),
    };
    ask.partitions
        .iter()
        .map(|&p| (p, Err(error.clone())))
        .collect()
}

/// [`held_by_node`] for this node: waits for each partition of `ask` to be applied here
/// up to its sequence (one after another under one deadline: each applies on
/// meanwhile), and reads the versions from this node's store.
async fn held_here(
    cluster: &Cluster,
    store: &Arc<dyn Store>,
    server: &str,
    ask: &Ask,
    keys: &[HeldKey],
    by_partition: &BTreeMap<u32, Vec<usize>>,
    sequences: &BTreeMap<u32, u64>,
) -> Vec<(u32, PartitionHeld)> {
    let at = |p: u32| sequences.get(&p).copied().unwrap_or(0);
    let wanted = ask.partitions.iter().map(|&p| (p, at(p)));
    let late = late_partitions(cluster, wanted, cluster.config().publish_timeout, |_| true).await;
    let (late, applied): (Vec<u32>, Vec<u32>) =
        ask.partitions.iter().partition(|p| late.contains(p));
    let mut out: Vec<(u32, PartitionHeld)> = late
        .into_iter()
        .map(|p| {
            let detail = format!(
                "this node did not apply partition {p} up to {} in time",
                at(p)
            );
            (p, Err(detail))
        })
        .collect();
    match local_held(store, server, keys_of(&applied, keys, by_partition)).await {
        Ok(held) => out.extend(split(&applied, by_partition, held)),
        Err(status) => out.extend(
            applied
                .iter()
                .map(|&p| (p, Err(status.message().to_string()))),
        ),
    }
    out
}

/// Those of `wanted` (partition, stream sequence) this node has not applied up to their
/// sequence within `timeout`, or is not `ready` for when their turn comes: one after
/// another under one deadline, as each applies on meanwhile.
async fn late_partitions(
    cluster: &Cluster,
    wanted: impl Iterator<Item = (u32, u64)>,
    timeout: Duration,
    ready: impl Fn(u32) -> bool,
) -> BTreeSet<u32> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut late = BTreeSet::new();
    for (p, at) in wanted {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !ready(p) || !cluster.wait_applied(p, at, left).await {
            late.insert(p);
        }
    }
    late
}

/// The keys of `partitions`, in order.
fn keys_of(
    partitions: &[u32],
    keys: &[HeldKey],
    by_partition: &BTreeMap<u32, Vec<usize>>,
) -> Vec<HeldKey> {
    partitions
        .iter()
        .flat_map(|p| by_partition[p].iter().map(|&i| keys[i].clone()))
        .collect()
}

/// A flat answer for `partitions` (their keys in order, [`keys_of`]), by partition.
fn split(
    partitions: &[u32],
    by_partition: &BTreeMap<u32, Vec<usize>>,
    held: Vec<Option<u64>>,
) -> Vec<(u32, PartitionHeld)> {
    let mut held = held.into_iter();
    partitions
        .iter()
        .map(|&p| (p, Ok(held.by_ref().take(by_partition[&p].len()).collect())))
        .collect()
}

/// The versions this node's store holds of `keys`.
async fn local_held(
    store: &Arc<dyn Store>,
    server: &str,
    keys: Vec<HeldKey>,
) -> Result<Vec<Option<u64>>, Status> {
    let store = Arc::clone(store);
    let server = server.to_string();
    tokio::task::spawn_blocking(move || held_versions(store.as_ref(), &server, &keys))
        .await
        .map_err(|e| Status::internal(format!("held task failed: {e}")))?
        .map_err(|e| convert::store_status(&e))
}

/// A held key as the Held request carries it.
fn held_snapshot(k: &HeldKey) -> v1::HeldSnapshot {
    v1::HeldSnapshot {
        series: Some(v1::Series::from(&k.name)),
        kind: v1::SketchKind::from(k.name.kind) as i32,
        hour: k.hour.0,
        epoch: k.epoch,
    }
}

/// The `Peer` gRPC service of one node.
pub(crate) struct PeerService {
    cluster: Arc<Cluster>,
    store: Arc<dyn Store>,
}

impl PeerService {
    /// The service of this node, answering from `store`.
    pub(crate) fn new(cluster: Arc<Cluster>, store: Arc<dyn Store>) -> PeerService {
        PeerService { cluster, store }
    }

    /// This node's partition count, if the asking node's `theirs` is the same.
    fn same_partitions(&self, theirs: u32) -> Result<u32, Status> {
        let count = self.cluster.config().partitions;
        if theirs != count {
            return Err(Status::failed_precondition(format!(
                "the asking node has {theirs} partitions, this one {count}"
            )));
        }
        Ok(count)
    }

    /// Refuses partitions this node is not ready for.
    fn check_ready(&self, partitions: impl IntoIterator<Item = u32>) -> Result<(), Status> {
        let count = self.cluster.config().partitions;
        for p in partitions {
            if p >= count {
                return Err(Status::invalid_argument(format!(
                    "partition {p} is not below the cluster's {count} partitions"
                )));
            }
            if !self.cluster.members().is_ready_here(p) {
                return Err(Status::failed_precondition(format!(
                    "node {} is not ready for partition {p}",
                    self.cluster.members().me()
                )));
            }
        }
        Ok(())
    }
}

/// The stream's placement as `hourglass cluster status` shows it: its leader and each
/// other replica's state.
fn stream_status(info: &async_nats::jetstream::stream::Info) -> v1::StreamStatus {
    let cluster = info.cluster.as_ref();
    let replicas = cluster
        .map(|c| c.replicas.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|r| v1::StreamReplica {
            name: r.name.clone(),
            current: r.current,
            offline: r.offline,
            lag: r.lag.unwrap_or(0),
            seen_ms_ago: u64::try_from(r.active.as_millis()).unwrap_or(u64::MAX),
        })
        .collect();
    v1::StreamStatus {
        name: info.config.name.clone(),
        leader: cluster.and_then(|c| c.leader.clone()).unwrap_or_default(),
        replicas,
        messages: info.state.messages,
        bytes: info.state.bytes,
    }
}

/// A partial answer as the Peer service sends it.
fn partial_group(key: &str, merged: &crate::planner::Merged) -> v1::PartialGroup {
    v1::PartialGroup {
        key: key.to_string(),
        sketch: merged.sketch.as_ref().map(|s| v1::EncodedSketch {
            kind: v1::SketchKind::from(s.kind()) as i32,
            data: s.encode().into(),
        }),
        sketches_merged: merged.coverage.sketches_merged,
        filters: merged.filters.iter().map(partial_filter).collect(),
    }
}

/// One filter's answer to a lookup as the Peer service sends it: with its bits when it
/// says "maybe".
fn partial_filter(row: &FilterRow) -> v1::PartialFilter {
    v1::PartialFilter {
        server: row.server.clone(),
        start_hour: row.start_hour,
        hours: row.hours,
        series: row.series.clone(),
        epoch: row.epoch,
        maybe_present: row.maybe_present,
        fpr: row.fpr,
        fill_ratio: row.fill_ratio,
        past_design_point: row.past_design_point,
        filter: row.filter.as_ref().map(Bloom::encode).unwrap_or_default(),
    }
}

/// A filter's answer as a peer sent it; an error when its filter does not decode.
pub(crate) fn filter_row(
    filter: &v1::PartialFilter,
) -> Result<FilterRow, hourglass_sketch::DecodeError> {
    let bloom = if filter.maybe_present {
        match Sketch::decode(&filter.filter)? {
            Sketch::Membership(bloom) => Some(bloom),
            // Not a filter: combining reports the positive as sent without one.
            _ => None,
        }
    } else {
        None
    };
    Ok(FilterRow {
        server: filter.server.clone(),
        start_hour: filter.start_hour,
        hours: filter.hours,
        series: filter.series.clone(),
        epoch: filter.epoch,
        maybe_present: filter.maybe_present,
        fpr: filter.fpr,
        fill_ratio: filter.fill_ratio,
        past_design_point: filter.past_design_point,
        filter: bloom,
    })
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn partial(
        &self,
        request: Request<v1::PartialRequest>,
    ) -> Result<Response<v1::PartialResponse>, Status> {
        let request = request.into_inner();
        let count = self.same_partitions(request.partition_count)?;
        let kind = convert::kind(request.kind, "kind").map_err(Status::invalid_argument)?;
        let selector = convert::selector(request.selector.as_ref(), kind, u64::MAX)?;
        let wanted: BTreeSet<u32> = request.partitions.iter().copied().collect();
        let ready: BTreeSet<u32> = wanted
            .iter()
            .copied()
            .filter(|&p| p < count && self.cluster.members().is_ready_here(p))
            .collect();
        let ready = super::barrier::pass(&self.cluster, ready)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "answering for no partition of a query");
                BTreeSet::new()
            });
        let not_ready: Vec<u32> = wanted.difference(&ready).copied().collect();
        let store = Arc::clone(&self.store);
        let lookup = request.lookup.then(|| item_hash(&request.item));
        let answer = tokio::task::spawn_blocking(move || {
            let planner = Planner::new(store.as_ref()).only_partitions(count, ready);
            match lookup {
                Some(hash) => planner.look_up(hash).answer(&selector),
                None => planner.answer(&selector),
            }
        })
        .await
        .map_err(|e| Status::internal(format!("partial task failed: {e}")))?;
        let answer = match answer {
            Ok(answer) => answer,
            // What this node's store does not name, it holds no rows of.
            Err(
                QueryError::UnknownMetric { .. }
                | QueryError::WrongKind { .. }
                | QueryError::NoSeries { .. }
                | QueryError::NoServers { .. },
            ) => Answer::default(),
            Err(e) => return Err(convert::query_status(&e)),
        };
        Ok(Response::new(v1::PartialResponse {
            total: Some(partial_group("", &answer.total)),
            groups: answer
                .groups
                .iter()
                .map(|(key, m)| partial_group(key, m))
                .collect(),
            not_ready,
        }))
    }

    async fn held(
        &self,
        request: Request<v1::HeldRequest>,
    ) -> Result<Response<v1::HeldResponse>, Status> {
        let request = request.into_inner();
        let count = self.cluster.config().partitions;
        if let Some(p) = request.wait_for.keys().find(|&&p| p >= count) {
            return Err(Status::invalid_argument(format!(
                "partition {p} is not below the cluster's {count} partitions"
            )));
        }
        let timeout = Duration::from_millis(u64::from(request.timeout_ms))
            .min(self.cluster.config().publish_timeout);
        // Each partition on its own: one this node is not ready for, or has not applied
        // far enough in time, leaves the others answered (another owner answers it).
        let wanted = request.wait_for.iter().map(|(&p, &at)| (p, at));
        let ready = |p| self.cluster.members().is_ready_here(p);
        let unanswered: Vec<u32> = late_partitions(&self.cluster, wanted, timeout, ready)
            .await
            .into_iter()
            .collect();
        let mut keys = Vec::with_capacity(request.snapshots.len());
        for (i, s) in request.snapshots.iter().enumerate() {
            let name = super::copy::series_name(s.series.as_ref(), s.kind)
                .map_err(|e| Status::invalid_argument(format!("snapshots[{i}]: {e}")))?;
            keys.push(HeldKey {
                name,
                hour: crate::keys::Hour(s.hour),
                epoch: s.epoch,
            });
        }
        let held = local_held(&self.store, &request.server, keys).await?;
        Ok(Response::new(v1::HeldResponse {
            held: held.into_iter().map(|h| h.unwrap_or(0)).collect(),
            unanswered,
        }))
    }

    type CopyStream = super::copy::CopyStream;

    async fn copy(
        &self,
        request: Request<v1::CopyRequest>,
    ) -> Result<Response<Self::CopyStream>, Status> {
        let request = request.into_inner();
        self.same_partitions(request.partition_count)?;
        self.check_ready(request.partitions.iter().copied())?;
        let stream =
            super::copy::serve(&self.cluster, &self.store, request.partitions, request.live)
                .await?;
        Ok(Response::new(stream))
    }

    async fn status(
        &self,
        _request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        let members = self.cluster.members();
        let view = members.members();
        let partitions = (0..self.cluster.config().partitions)
            .map(|p| v1::PartitionStatus {
                partition: p,
                owners: members.owners(p),
                ready: view
                    .values()
                    .filter(|m| m.ready.contains(&p))
                    .map(|m| m.node.clone())
                    .collect(),
            })
            .collect();
        let info = self.cluster.stream_info().await.ok();
        Ok(Response::new(v1::StatusResponse {
            node: members.me().to_string(),
            members: view.into_values().collect(),
            partitions,
            owners: u32::try_from(self.cluster.config().owners).unwrap_or(u32::MAX),
            subjects: self.cluster.config().subject_count(),
            stream_last_sequence: info.as_ref().map_or(0, |i| i.state.last_sequence),
            applied_sequence: self.cluster.applied_max(),
            stream: info.as_ref().map(stream_status),
        }))
    }
}
