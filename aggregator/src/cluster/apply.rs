//! The apply loop: this node's durable consumer of the stream, applying every message
//! into the local store with the single aggregator's own push path.

use std::future::Future;
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
pub(crate) async fn apply(
    cluster: Arc<Cluster>,
    applier: CollectorService,
    metrics: Arc<Metrics>,
    stopped: impl Future<Output = ()>,
) {
    tokio::pin!(stopped);
    let durable = format!("apply-{}", cluster.config().node);
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
