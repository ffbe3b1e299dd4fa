//! The apply loop: this node's durable consumer of the stream, applying every message
//! into the local store with the single aggregator's own push path.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::{AckPolicy, pull};
use hourglass_rpc::proto::v1;
use prost::Message;
use tokio_stream::StreamExt;

use super::{Cluster, ClusterError};
use crate::metrics::{ApplyLabel, Metrics};
use crate::service::CollectorService;

/// How long JetStream waits for an acknowledgement before it redelivers.
const ACK_WAIT: Duration = Duration::from_secs(60);
/// Messages delivered and not yet acknowledged, at most.
const MAX_ACK_PENDING: i64 = 256;
/// The wait before a message the store could not take is redelivered.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// What became of one message of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applied {
    /// Written (each snapshot stored, stale or rejected by the push rules).
    Ok,
    /// Not a push the rules accept at all (bad bytes, a bad server name): never retried.
    Refused,
    /// The store failed: redelivered later.
    Retry,
}

/// Consumes the whole stream with this node's durable consumer until `stopped`,
/// applying each message through `applier` (a [`CollectorService`] that stores) and
/// acknowledging it only after the store's write returned. A lost connection or consumer
/// is logged and taken up again; the durable consumer resumes where this node left off.
///
/// The consumer is named after the node *and its store* ([`consumer_name`]): a node whose
/// data dir was wiped or replaced gets a new consumer that starts at the stream's first
/// message, instead of resuming where the old store had got to and missing all of it.
pub(crate) async fn apply(
    cluster: Arc<Cluster>,
    durable: String,
    applier: CollectorService,
    metrics: Arc<Metrics>,
    stopped: impl Future<Output = ()>,
) {
    tokio::pin!(stopped);
    loop {
        let consuming = consume(&cluster, &durable, &applier, &metrics);
        let error = tokio::select! {
            _ = &mut stopped => return,
            error = consuming => error,
        };
        tracing::warn!(consumer = %durable, error = %error, "applying the cluster stream stopped; resuming");
        tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep(RETRY_DELAY) => {}
        }
    }
}

/// Reads and applies messages until the consumer fails; returns why.
async fn consume(
    cluster: &Cluster,
    durable: &str,
    applier: &CollectorService,
    metrics: &Metrics,
) -> ClusterError {
    let config = cluster.config();
    let stream_error = |detail: String| ClusterError::Stream {
        stream: config.stream.clone(),
        detail,
    };
    let stream = match cluster.jetstream().get_stream(&config.stream).await {
        Ok(stream) => stream,
        Err(e) => return stream_error(e.to_string()),
    };
    let consumer = stream
        .get_or_create_consumer(
            durable,
            pull::Config {
                durable_name: Some(durable.to_string()),
                description: Some(format!("hourglass node {} applies the stream", config.node)),
                ack_policy: AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_ack_pending: MAX_ACK_PENDING,
                // The consumer of a store that is gone (a wiped node) is removed by the
                // servers once it has been idle as long as the stream keeps messages.
                inactive_threshold: config.max_age,
                ..pull::Config::default()
            },
        )
        .await;
    let mut messages = match consumer {
        Ok(consumer) => match consumer.messages().await {
            Ok(messages) => messages,
            Err(e) => return stream_error(format!("consumer {durable}: {e}")),
        },
        Err(e) => return stream_error(format!("consumer {durable}: {e}")),
    };
    tracing::info!(consumer = %durable, "applying the cluster stream");
    loop {
        let message = match messages.next().await {
            Some(Ok(message)) => message,
            // The client reconnects by itself; a missed heartbeat and the like end here.
            Some(Err(e)) => return stream_error(format!("consumer {durable}: {e}")),
            None => return stream_error(format!("consumer {durable} ended")),
        };
        let outcome = apply_one(applier, &message.subject, &message.payload).await;
        metrics
            .cluster_applied
            .get_or_create(&ApplyLabel {
                outcome: match outcome {
                    Applied::Ok => "ok",
                    Applied::Refused => "refused",
                    Applied::Retry => "retry",
                },
            })
            .inc();
        // After the count, so that a reader who sees the position also sees the count.
        if let Ok(info) = message.info() {
            // A message to retry is not applied yet; its redelivery will be.
            let applied = outcome != Applied::Retry;
            metrics.cluster_applied_at(info.stream_sequence, info.pending, applied);
            if applied {
                cluster.record_applied(info.stream_sequence);
            }
        }
        let ack = match outcome {
            Applied::Ok => AckKind::Ack,
            Applied::Refused => AckKind::Term,
            Applied::Retry => AckKind::Nak(Some(RETRY_DELAY)),
        };
        // A lost acknowledgement only means a redelivery, which the version rule absorbs.
        if let Err(e) = message.ack_with(ack).await {
            tracing::warn!(consumer = %durable, error = %e, "acknowledging a cluster message");
        }
    }
}

/// The file in the data dir that names this store's consumer.
const CONSUMER_FILE: &str = "cluster-consumer";

/// The durable consumer of this node's store: `apply-NODE-ID`, where ID is made when the
/// store first joins the cluster and kept in `DATA_DIR/cluster-consumer` (written and
/// synced before the consumer is created). A store without the file has applied nothing
/// of the stream, so it gets a new ID and reads the stream from its first message.
pub(crate) fn consumer_name(data_dir: &Path, node: &str) -> std::io::Result<String> {
    let path = data_dir.join(CONSUMER_FILE);
    match std::fs::read_to_string(&path) {
        Ok(name) if is_consumer_of(name.trim(), node) => return Ok(name.trim().to_string()),
        Ok(name) => {
            tracing::warn!(
                file = %path.display(),
                found = name.trim(),
                node,
                "the data dir's consumer belongs to another node name; starting a new one"
            );
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let id =
        xxhash_rust::xxh3::xxh3_64(format!("{nanos} {} {node}", std::process::id()).as_bytes());
    let name = format!("apply-{node}-{id:016x}");
    let fresh = data_dir.join(format!(".{CONSUMER_FILE}.new"));
    {
        let mut file = std::fs::File::create(&fresh)?;
        std::io::Write::write_all(&mut file, format!("{name}\n").as_bytes())?;
        file.sync_all()?;
    }
    std::fs::rename(&fresh, &path)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    tracing::info!(consumer = %name, "this store joins the cluster: it applies the stream from its start");
    Ok(name)
}

/// `name` is a consumer name this module made for `node`.
fn is_consumer_of(name: &str, node: &str) -> bool {
    name.strip_prefix("apply-")
        .and_then(|rest| rest.strip_prefix(node))
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|id| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Decodes and stores one message.
async fn apply_one(applier: &CollectorService, subject: &str, payload: &[u8]) -> Applied {
    let request = match v1::PushRequest::decode(payload) {
        Ok(request) => request,
        Err(e) => {
            tracing::error!(subject, error = %e, "a cluster message is not a push; skipped");
            return Applied::Refused;
        }
    };
    match applier.apply(request).await {
        Ok(()) => Applied::Ok,
        Err(status) if is_retryable(status.code()) => {
            tracing::warn!(subject, error = %status.message(), "applying a cluster message failed; it will be redelivered");
            Applied::Retry
        }
        Err(status) => {
            tracing::error!(subject, error = %status.message(), "a cluster message was refused; skipped");
            Applied::Refused
        }
    }
}

/// A failure of the store (or of the task), not of the message.
fn is_retryable(code: tonic::Code) -> bool {
    !matches!(
        code,
        tonic::Code::InvalidArgument
            | tonic::Code::ResourceExhausted
            | tonic::Code::PermissionDenied
            | tonic::Code::OutOfRange
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_keeps_its_consumer_and_a_wiped_one_gets_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let first = consumer_name(dir.path(), "agg-1").unwrap();
        assert!(is_consumer_of(&first, "agg-1"), "{first}");
        // The same store, restarted: the same consumer, which resumes where it was.
        assert_eq!(consumer_name(dir.path(), "agg-1").unwrap(), first);
        // Wiped (or replaced by an empty dir): a consumer of its own, from the start.
        std::fs::remove_file(dir.path().join(CONSUMER_FILE)).unwrap();
        let second = consumer_name(dir.path(), "agg-1").unwrap();
        assert_ne!(second, first);
        // Renamed node: never another node's consumer.
        let renamed = consumer_name(dir.path(), "agg-2").unwrap();
        assert!(is_consumer_of(&renamed, "agg-2") && !is_consumer_of(&renamed, "agg-1"));
        // A prefix of another node's name is not that node's: "agg-1" vs "agg-10".
        assert!(!is_consumer_of(
            &renamed.replace("agg-2", "agg-20"),
            "agg-2"
        ));
    }
}
