//! Pushing: what the aggregator lacks goes in batches bounded in bytes and snapshots,
//! with the live hours riding along, and each reply is applied to the table.

use std::time::{Duration, Instant};

use hourglass_rpc::proto::v1;
use hourglass_rpc::time::unix_now;

use crate::metrics::OutcomeLabel;
use crate::table::Sent;

use super::Shipper;

/// Why a push did not complete.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PushError {
    /// The RPC failed: unreachable, timed out, or refused as a whole.
    #[error("push failed: {0}")]
    Rpc(#[from] tonic::Status),
    /// The reply does not match the request.
    #[error("push reply has {got} results for {sent} snapshots")]
    Mismatch {
        /// Results received.
        got: usize,
        /// Snapshots sent.
        sent: usize,
    },
}

impl Shipper {
    /// [`Shipper::push_all`], given up after `limit` if there is one (the final flush's).
    pub(super) async fn push_within(&mut self, limit: Option<Duration>) -> Result<(), PushError> {
        match limit {
            Some(limit) => tokio::time::timeout(limit, self.push_all())
                .await
                .unwrap_or_else(|_| {
                    Err(PushError::Rpc(tonic::Status::deadline_exceeded(format!(
                        "the final flush's push took longer than {limit:?}"
                    ))))
                }),
            None => self.push_all().await,
        }
    }

    /// Pushes every unacknowledged entry in batches bounded in bytes, and the live hours.
    ///
    /// Live hours ride with the snapshot batches, at most `live_chunk` a push, and those
    /// left over go in pushes of their own. A push carrying both that is refused for good
    /// is sent again as two, so that a bound only one part breaks (the aggregator's
    /// `limits.max_live_hours_per_push`, say) never drops the other part: snapshots are
    /// dropped only when a push of snapshots alone is refused for good.
    async fn push_all(&mut self) -> Result<(), PushError> {
        let (keys, live) = {
            let t = crate::table::lock(&self.table);
            (t.unacked(), t.live_hours())
        };
        if keys.is_empty() && live.is_empty() {
            return Ok(());
        }
        let max_bytes = self.config.max_batch_bytes();
        let max_snapshots = self.config.shipping.max_snapshots_per_push;
        // Live hours before `live_at` are acknowledged; `ride` turns false once a push of
        // both was refused, and the rest of the live hours then go alone.
        let mut live_at = 0;
        let mut ride = true;
        let mut start = 0;
        while start < keys.len() {
            let (snapshots, sent, next) = {
                let mut t = crate::table::lock(&self.table);
                t.encode_batch(&keys, start, max_bytes, max_snapshots)
            };
            let count = snapshots.len();
            let rider: &[u32] = if ride {
                &live[live_at..live.len().min(live_at + self.live_chunk)]
            } else {
                &[]
            };
            let results = match self.send(snapshots, rider.to_vec()).await {
                Ok(results) => results,
                Err(status) if refused_for_good(status.code()) && !rider.is_empty() => {
                    // Which part the aggregator refuses is not known: send the snapshots
                    // again alone, and the live hours in pushes of their own.
                    self.metrics.snapshots_retried.inc_by(count as u64);
                    tracing::warn!(
                        code = ?status.code(),
                        message = status.message(),
                        snapshots = count,
                        live_hours = rider.len(),
                        "the aggregator refused a push of snapshots and live hours; sending them apart"
                    );
                    ride = false;
                    continue;
                }
                Err(status) if refused_for_good(status.code()) => {
                    self.drop_refused(&sent, count, &status);
                    start = next;
                    continue;
                }
                Err(status) => {
                    self.metrics.snapshots_retried.inc_by(count as u64);
                    return Err(status.into());
                }
            };
            if results.len() != count {
                self.metrics.snapshots_retried.inc_by(count as u64);
                return Err(PushError::Mismatch {
                    got: results.len(),
                    sent: count,
                });
            }
            self.apply(&sent, &results)?;
            if !rider.is_empty() {
                crate::table::lock(&self.table).live_hours_acked(rider);
                live_at += rider.len();
            }
            start = next;
        }
        self.push_live_hours(&live[live_at..]).await
    }

    /// The aggregator refused a batch as a whole (too large, too many snapshots,
    /// malformed): sending it again would be refused again, and stopping there would hold
    /// every later batch back for good. Its snapshots are dropped: counted, logged and
    /// acknowledged.
    fn drop_refused(&self, sent: &[Sent], count: usize, status: &tonic::Status) {
        self.metrics.snapshots_rejected.inc_by(count as u64);
        tracing::error!(
            code = ?status.code(),
            message = status.message(),
            snapshots = count,
            "the aggregator refused a whole push; its snapshots are dropped"
        );
        let mut t = crate::table::lock(&self.table);
        for s in sent {
            t.ack(s.key, s.version);
        }
    }

    /// Pushes `hours` in pushes of live hours alone, at most `live_chunk` each. One refused
    /// with RESOURCE_EXHAUSTED (more live hours than the aggregator's
    /// `limits.max_live_hours_per_push`) is sent again in halves, down to one hour, and the
    /// smaller chunk is kept for later flushes. Live hours refused for good even so are
    /// dropped, logged and counted in `live_hours_dropped`, so they do not come back every
    /// flush; no snapshot is ever dropped here.
    async fn push_live_hours(&mut self, hours: &[u32]) -> Result<(), PushError> {
        let mut at = 0;
        while at < hours.len() {
            let chunk = &hours[at..hours.len().min(at + self.live_chunk)];
            match self.send(Vec::new(), chunk.to_vec()).await {
                Ok(results) if results.is_empty() => {
                    crate::table::lock(&self.table).live_hours_acked(chunk);
                }
                Ok(results) => {
                    return Err(PushError::Mismatch {
                        got: results.len(),
                        sent: 0,
                    });
                }
                Err(status)
                    if status.code() == tonic::Code::ResourceExhausted && chunk.len() > 1 =>
                {
                    self.live_chunk = chunk.len() / 2;
                    tracing::warn!(
                        message = status.message(),
                        live_hours = chunk.len(),
                        retry_with = self.live_chunk,
                        "the aggregator refused a push of live hours as too many; sending fewer at a time \
                         (set shipping.max_live_hours_per_push to at most its limits.max_live_hours_per_push)"
                    );
                    continue;
                }
                Err(status) if refused_for_good(status.code()) => {
                    self.metrics.live_hours_dropped.inc_by(chunk.len() as u64);
                    tracing::error!(
                        code = ?status.code(),
                        message = status.message(),
                        live_hours = chunk.len(),
                        first = chunk[0],
                        last = chunk[chunk.len() - 1],
                        "the aggregator refused a push of live hours alone; they are dropped"
                    );
                    crate::table::lock(&self.table).drop_live_hours(chunk);
                }
                Err(status) => return Err(status.into()),
            }
            at += chunk.len();
        }
        Ok(())
    }

    /// One Push call of `snapshots` and `live_hours`, timed, counted and bounded by
    /// `shipping.push_timeout`: the per-snapshot results, or the call's status.
    async fn send(
        &mut self,
        snapshots: Vec<v1::Snapshot>,
        live_hours: Vec<u32>,
    ) -> Result<Vec<v1::SnapshotResult>, tonic::Status> {
        let count = snapshots.len();
        let request = v1::PushRequest {
            server: Some(self.server.clone()),
            snapshots,
            live_hours,
        };
        let started = Instant::now();
        let mut call = tonic::Request::new(request);
        call.set_timeout(self.config.shipping.push_timeout);
        if let Some(header) = &self.authorization {
            call.metadata_mut().insert("authorization", header.clone());
        }
        let reply = self.client.push(call).await;
        self.metrics
            .push_seconds
            .observe(started.elapsed().as_secs_f64());
        let code = reply
            .as_ref()
            .map_or_else(|s| s.code(), |_| tonic::Code::Ok);
        self.metrics
            .pushes
            .get_or_create(&OutcomeLabel {
                outcome: hourglass_rpc::proto::code_label(code),
            })
            .inc();
        self.metrics.snapshots_sent.inc_by(count as u64);
        if self.failed_checkpoints > 0 {
            self.metrics
                .snapshots_sent_checkpoint_failing
                .inc_by(count as u64);
        }
        let results = reply?.into_inner().results;
        self.metrics.last_push.set(unix_now());
        Ok(results)
    }

    /// Records a push's results: stored and stale snapshots are acknowledged; rejected
    /// ones are logged and counted, and not sent again (the same bytes would be refused
    /// again), until the entry changes.
    pub(super) fn apply(
        &self,
        sent: &[Sent],
        results: &[v1::SnapshotResult],
    ) -> Result<(), PushError> {
        // An outcome this agent does not know is not an acknowledgement: nothing is
        // marked, and the push counts as failed.
        if let Some(r) = results.iter().find(|r| {
            !matches!(
                v1::PushOutcome::try_from(r.outcome),
                Ok(v1::PushOutcome::Stored | v1::PushOutcome::Stale | v1::PushOutcome::Rejected)
            )
        }) {
            return Err(PushError::Rpc(tonic::Status::unknown(format!(
                "push reply has outcome {}, which this agent does not know",
                r.outcome
            ))));
        }
        let mut t = crate::table::lock(&self.table);
        let mut at = 0;
        for &Sent {
            key,
            version,
            snapshots: count,
        } in sent
        {
            for r in &results[at..at + count] {
                match v1::PushOutcome::try_from(r.outcome) {
                    Ok(v1::PushOutcome::Stored) => {
                        self.metrics.snapshots_acked.inc();
                    }
                    Ok(v1::PushOutcome::Stale) => {
                        self.metrics.snapshots_acked.inc();
                        if r.held_version > version {
                            // The aggregator holds a later version of this epoch than the
                            // agent has given: its checkpoint fell behind what it sent.
                            // Continue above it, so new content is not taken for stale.
                            self.metrics.version_divergence.inc();
                            t.raise_last_version(r.held_version);
                            // What it holds is other content than this entry's: only a
                            // version above it gets the entry's content there, so the
                            // entry is owed again, and the next flush gives it one.
                            t.mark_dirty(key);
                            tracing::error!(
                                hour = key.hour,
                                sent = version,
                                held = r.held_version,
                                "the aggregator holds a later version than this agent gave; continuing above it and sending the entry again"
                            );
                        }
                    }
                    _ => {
                        self.metrics.snapshots_rejected.inc();
                        let series = t.get(key).map(|(s, _)| s.to_string()).unwrap_or_default();
                        tracing::error!(
                            series,
                            hour = key.hour,
                            version,
                            reason = %r.reason,
                            "the aggregator rejected a snapshot"
                        );
                    }
                }
            }
            t.ack(key, version);
            at += count;
        }
        Ok(())
    }
}

/// gRPC codes with which the aggregator refuses a push whatever the moment: sending the
/// same push again cannot succeed.
fn refused_for_good(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted | tonic::Code::OutOfRange
    )
}
