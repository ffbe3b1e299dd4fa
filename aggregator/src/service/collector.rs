//! The `Collector` service: agents push cumulative snapshots (DESIGN §3). A translation
//! between the RPC and the write path ([`crate::write`]), which checks every push and
//! stores it; in cluster mode the push is checked there, published to the cluster's
//! stream instead, and answered once an owner of each snapshot holds it.

use std::sync::Arc;
use std::time::Instant;

use hourglass_rpc::proto::v1::{self, collector_server::Collector};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::outcome_label;
use crate::write::{CheckedPush, HeldKey, Valid, Writer, check_snapshot, push_span, reject};

/// The `Collector` gRPC service.
pub(crate) struct CollectorService {
    /// The checks and the store's writes.
    writer: Writer,
    /// In cluster mode, checked pushes are published to the stream instead of stored
    /// here; the apply loop stores them (on their owners) through a writer of its own.
    cluster: Option<Arc<crate::cluster::Cluster>>,
}

impl CollectorService {
    /// A service storing the pushes it is sent through `writer`.
    pub(crate) fn new(writer: Writer) -> Self {
        CollectorService {
            writer,
            cluster: None,
        }
    }

    /// This service publishing to `cluster` instead of storing (cluster mode's entry);
    /// unchanged with `None`.
    pub(crate) fn publishing_to(mut self, cluster: Option<Arc<crate::cluster::Cluster>>) -> Self {
        if let Some(cluster) = cluster {
            self.writer = self.writer.sharing(Arc::clone(cluster.ledger()));
            self.cluster = Some(cluster);
        }
        self
    }
}

#[tonic::async_trait]
impl Collector for CollectorService {
    async fn push(
        &self,
        request: Request<v1::PushRequest>,
    ) -> Result<Response<v1::PushResponse>, Status> {
        let started = Instant::now();
        let principal = request
            .extensions()
            .get::<crate::auth::Principal>()
            .cloned();
        let metadata = request.metadata().clone();
        let request = request.into_inner();
        let span = push_span("grpc", request.snapshots.len());
        hourglass_rpc::process::adopt_remote_parent(&span, &metadata);
        let result = self
            .push_inner(request, principal, &span)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(status) => {
                span.in_scope(
                    || tracing::warn!(code = ?status.code(), "push refused: {}", status.message()),
                );
                outcome_label(status.code())
            }
        };
        self.writer
            .metrics()
            .pushes
            .get_or_create(&crate::metrics::OutcomeLabel { outcome })
            .inc();
        self.writer
            .metrics()
            .push_seconds
            .observe(started.elapsed().as_secs_f64());
        result.map(Response::new)
    }
}

impl CollectorService {
    async fn push_inner(
        &self,
        mut request: v1::PushRequest,
        principal: Option<crate::auth::Principal>,
        span: &tracing::Span,
    ) -> Result<v1::PushResponse, Status> {
        let checked = self
            .writer
            .checked_request(&mut request, principal.as_ref(), false, span)?;
        if let Some(cluster) = &self.cluster {
            return self.publish(cluster, checked, request.snapshots).await;
        }
        self.writer
            .push(checked, &mut request.snapshots, span)
            .await
    }

    /// Cluster mode: checks each snapshot as a single aggregator does ([`Writer::push`]),
    /// publishes those that pass (by partition) with the server and its live hours, and
    /// answers STORED for each once JetStream acknowledged every publish. The series bound
    /// refuses here as on a single aggregator, from this node's store (which holds what
    /// the stream carried) and ledger; every node's apply loop applies it again.
    async fn publish(
        &self,
        cluster: &Arc<crate::cluster::Cluster>,
        checked: CheckedPush,
        snapshots: Vec<v1::Snapshot>,
    ) -> Result<v1::PushResponse, Status> {
        let CheckedPush {
            server,
            labels,
            accepted_hours,
            live,
            ..
        } = checked;
        let (server, accepted_hours) = (&server, &accepted_hours);
        let (mut results, valid, originals) =
            self.check_for_cluster(cluster, server, snapshots, accepted_hours);
        let (valid, refusals) = self
            .writer
            .admit_series(server, labels, valid, accepted_hours)
            .await?;
        let partitions = cluster.config().partitions;
        let mut outgoing = Vec::with_capacity(valid.len());
        let mut sent = Vec::with_capacity(valid.len());
        for ((v, refusal), snapshot) in valid.into_iter().zip(refusals).zip(originals) {
            match refusal {
                Some(r) => results[v.index] = self.writer.rejection(r),
                None => {
                    let p = crate::placement::partition(&v.name, partitions);
                    outgoing.push((p, v.index, snapshot));
                    sent.push(v);
                }
            }
        }
        let live: Vec<u32> = live.iter().map(|h| h.0).collect();
        let published = outgoing.len() as u64;
        let stats = cluster
            .publish(server, &live, outgoing)
            .await
            .map_err(|e| self.publish_failed(e))?;
        self.writer.metrics().cluster_published(&stats, published);
        self.answer_from_owners(cluster, &server.name, &stats.sequences, sent, &mut results)
            .await?;
        Ok(v1::PushResponse { results })
    }

    /// Checks each snapshot as [`Writer::push`] does, and that it fits one message of
    /// the NATS servers. Returns the results so far (rejections filled in), the valid
    /// snapshots and, beside each, the snapshot as it arrived (to publish).
    fn check_for_cluster(
        &self,
        cluster: &crate::cluster::Cluster,
        server: &v1::Server,
        snapshots: Vec<v1::Snapshot>,
        accepted_hours: &std::ops::RangeInclusive<u32>,
    ) -> (Vec<v1::SnapshotResult>, Vec<Valid>, Vec<v1::Snapshot>) {
        let mut results = Vec::with_capacity(snapshots.len());
        let mut valid = Vec::with_capacity(snapshots.len());
        let mut originals = Vec::with_capacity(snapshots.len());
        for (i, snapshot) in snapshots.into_iter().enumerate() {
            // The check takes the sketch's bytes (a reference count, not a copy).
            let mut checked = snapshot.clone();
            let checked = check_snapshot(i, &mut checked, self.writer.limits(), accepted_hours)
                .and_then(|v| match cluster.too_large(server, &snapshot) {
                    // Refused alone: refusing the whole push would make the agent drop
                    // every snapshot of it (RESOURCE_EXHAUSTED is refused for good).
                    Some((bytes, max)) => Err(reject(
                        "sketch.size",
                        format!(
                            "snapshots[{i}] needs a {bytes}-byte message, more than the NATS servers' max_payload of {max} bytes (cluster mode)"
                        ),
                    )),
                    None => Ok(v),
                });
            match checked {
                Ok(v) => {
                    results.push(v1::SnapshotResult::default());
                    valid.push(v);
                    originals.push(snapshot);
                }
                Err(r) => results.push(self.writer.rejection(r)),
            }
        }
        (results, valid, originals)
    }

    /// The status of a push whose publishing failed: nothing of it is acknowledged.
    fn publish_failed(&self, e: crate::cluster::PublishError) -> Status {
        self.writer.metrics().cluster_publish_failures.inc();
        match e {
            e @ crate::cluster::PublishError::TooLarge { .. } => {
                Status::resource_exhausted(format!("cluster: {e}"))
            }
            e => {
                tracing::warn!(error = %e, "cluster: publishing a push failed");
                Status::unavailable(format!(
                    "cluster: {e}; nothing of this push is acknowledged, retry it"
                ))
            }
        }
    }

    /// Answers the published snapshots `sent` as a single aggregator would, from what
    /// their owners hold once they applied the publish (`sequences`, per partition):
    /// STALE with the version held where a newer one is, else STORED. UNAVAILABLE if
    /// this node does not apply its live message, or no owner answers, within the
    /// publish timeout (the push is in the stream; a retry gets its answer).
    async fn answer_from_owners(
        &self,
        cluster: &Arc<crate::cluster::Cluster>,
        server: &str,
        sequences: &std::collections::BTreeMap<u32, u64>,
        sent: Vec<Valid>,
        results: &mut [v1::SnapshotResult],
    ) -> Result<(), Status> {
        // This node's apply of the live message (its next check of the server's series
        // bound then counts this push's series) and the owners' answers, at once.
        let timeout = cluster.config().publish_timeout;
        let live = async {
            match sequences.get(&crate::cluster::LIVE) {
                Some(&live)
                    if !cluster
                        .wait_applied(crate::cluster::LIVE, live, timeout)
                        .await =>
                {
                    Err(Status::unavailable(format!(
                        "cluster: this node has not yet applied the stream up to its own publish (sequence {live}) within cluster.publish_timeout; the push is in the stream, retry it for its answer"
                    )))
                }
                _ => Ok(()),
            }
        };
        let keys: Vec<HeldKey> = sent
            .iter()
            .map(|v| HeldKey {
                name: v.name.clone(),
                hour: v.hour,
                epoch: v.epoch,
            })
            .collect();
        let held = crate::cluster::held(cluster, self.writer.store(), server, keys, sequences);
        let (live, held) = tokio::join!(live, held);
        live?;
        let held = held?;
        // Applied up to the publish, yet not held at its version: the owner refused it
        // or will retry it. Nothing of the push is acknowledged; the retry gets the answer.
        if let Some(v) = sent
            .iter()
            .zip(&held)
            .find_map(|(v, h)| (h.is_none_or(|h| h < v.version)).then_some(v))
        {
            return Err(Status::unavailable(format!(
                "cluster: snapshots[{}] is not held at version {} after its owner applied its publish (refused or to be retried there); nothing of this push is acknowledged, retry it",
                v.index, v.version
            )));
        }
        for (v, held) in sent.iter().zip(held) {
            results[v.index] = match held {
                Some(held) if held > v.version => v1::SnapshotResult {
                    outcome: v1::PushOutcome::Stale as i32,
                    held_version: held,
                    reason: String::new(),
                },
                _ => v1::SnapshotResult {
                    outcome: v1::PushOutcome::Stored as i32,
                    held_version: v.version,
                    reason: String::new(),
                },
            };
        }
        Ok(())
    }
}
