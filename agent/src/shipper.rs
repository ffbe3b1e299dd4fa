//! Flushing: every flush interval, give changed sketches their next version, checkpoint,
//! push what the aggregator lacks, and free closed hours it has (DESIGN §3).
//!
//! The checkpoint is written before the push, and a push sends only versions a successful
//! checkpoint holds, so every version the aggregator can hold is also in the checkpoint: a
//! restarted agent continues above it and its next snapshot replaces, never trails, what it
//! had sent. A failed checkpoint (a full disk) therefore holds back only the new versions:
//! the entries the aggregator lacks still go, at the version the last good one holds. After a failed push the next attempt waits an
//! exponentially growing, jittered delay (checkpoints continue on every tick meanwhile);
//! what waits is at most one snapshot per (series, hour).
//!
//! Live hours go at most `shipping.max_live_hours_per_push` a push, riding with the
//! snapshot batches or in pushes of their own, and fewer when the aggregator refuses that
//! many: a bound on live hours is one the agent can keep, so it never costs a snapshot.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hourglass_rpc::time::{since_unix_epoch, unix_now};

use hourglass_rpc::proto::v1;
use hourglass_rpc::proto::v1::collector_client::CollectorClient;
use tokio::sync::watch;
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;
use tracing::Instrument;

use crate::checkpoint;
use crate::config::{Config, PushCompression};
use crate::metrics::{KindLabel, Metrics, OutcomeLabel, ReasonLabel};
use crate::table::{Dropped, Sent, Table};

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

/// Ships the table's sketches to one aggregator.
pub(crate) struct Shipper {
    table: Arc<Mutex<Table>>,
    metrics: Arc<Metrics>,
    config: Arc<Config>,
    data_dir: PathBuf,
    server: v1::Server,
    client: CollectorClient<Channel>,
    failures: u32,
    next_push: Instant,
    jitter: u64,
    /// Live hours per push: `shipping.max_live_hours_per_push`, halved while the
    /// aggregator refuses that many.
    live_chunk: usize,
    authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    /// What the backlog bound has dropped since the backlog last went over it; `None`
    /// while it is under it. One warning starts an episode and one line ends it.
    backlog_episode: Option<Dropped>,
    /// Writes the checkpoints; shared with the blocking task that runs each write.
    writer: Arc<Mutex<checkpoint::Writer>>,
    /// Checkpoints failed in a row (0: the last one succeeded). While above 0, pushes
    /// carry only the versions an earlier checkpoint holds.
    failed_checkpoints: u32,
}

impl Shipper {
    /// A shipper for `server` to the aggregator at `channel` (connected lazily).
    pub fn new(
        table: Arc<Mutex<Table>>,
        metrics: Arc<Metrics>,
        config: Arc<Config>,
        data_dir: PathBuf,
        server: v1::Server,
        channel: Channel,
        authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    ) -> Shipper {
        let max = 512 << 20;
        let mut client = CollectorClient::new(channel)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        if config.shipping.compression == PushCompression::Zstd {
            client = client
                .send_compressed(CompressionEncoding::Zstd)
                .accept_compressed(CompressionEncoding::Zstd);
        }
        let seed = since_unix_epoch().as_nanos() as u64 | 1;
        let live_chunk = config.shipping.max_live_hours_per_push.max(1);
        let writer = Arc::new(Mutex::new(checkpoint::Writer::new(&data_dir, &server.name)));
        Shipper {
            table,
            metrics,
            config,
            data_dir,
            server,
            client,
            failures: 0,
            next_push: Instant::now(),
            jitter: seed,
            live_chunk,
            authorization,
            backlog_episode: None,
            writer,
            failed_checkpoints: 0,
        }
    }

    /// Appends the next checkpoints to the log the agent's state was read from, at
    /// `position`, instead of writing a whole base first. If that cannot be done, the
    /// first checkpoint writes a base, as for a new data dir.
    pub(crate) fn resume_checkpoint(&self, position: checkpoint::LogPosition) {
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = writer.resume(position) {
            tracing::warn!(error = %e, "cannot append to the checkpoint log read at start; the first checkpoint writes a new base");
        }
    }

    /// Flushes every flush interval until `stop` turns true, then makes a final flush
    /// bounded by `shipping.shutdown_timeout` and a last checkpoint.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.config.flush_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            let push = Instant::now() >= self.next_push;
            self.flush(push).await;
        }
        let limit = self.config.shipping.shutdown_timeout;
        tracing::info!(timeout = ?limit, "final flush");
        self.failures = 0;
        self.flush_within(true, Some(limit)).await;
        // The final checkpoint records the acknowledgements of the final push, so a
        // restart does not send again what the aggregator already has.
        self.checkpoint().await;
    }

    /// One flush: versions, checkpoint, push (when `push` and not backing off), free.
    pub async fn flush(&mut self, push: bool) {
        self.flush_within(push, None).await;
    }

    /// A flush whose push, if any, gives up after `push_limit`. Only the push is cut
    /// short: a checkpoint is always written whole (two writers of one file would leave
    /// neither).
    async fn flush_within(&mut self, push: bool, push_limit: Option<Duration>) {
        let span = tracing::info_span!(
            "flush",
            changed = tracing::field::Empty,
            pushed = tracing::field::Empty,
            freed = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        self.flush_inner(push, push_limit, &span)
            .instrument(span.clone())
            .await;
    }

    async fn flush_inner(
        &mut self,
        push: bool,
        push_limit: Option<Duration>,
        span: &tracing::Span,
    ) {
        let now = unix_now();
        {
            let mut t = crate::table::lock(&self.table);
            t.mark_live(hourglass_rpc::time::hour_of(now).unwrap_or(0));
            span.record("changed", t.assign_versions() as u64);
        }
        let checkpointed = self.checkpoint().await;
        // Pushing versions no checkpoint holds would let a restarted agent reuse them for
        // other content. When this checkpoint failed (a full disk, say), the push still
        // goes, with only the versions the last successful one holds (`Table::unacked`):
        // retries of what the aggregator lacks go on, new versions wait.
        let pushed = if push {
            let result = match push_limit {
                Some(limit) => tokio::time::timeout(limit, self.push_all())
                    .await
                    .unwrap_or_else(|_| {
                        Err(PushError::Rpc(tonic::Status::deadline_exceeded(format!(
                            "the final flush's push took longer than {limit:?}"
                        ))))
                    }),
                None => self.push_all().await,
            };
            match result {
                Ok(()) => {
                    self.failures = 0;
                    self.next_push = Instant::now();
                    true
                }
                Err(e) => {
                    self.failures += 1;
                    let delay = self.backoff();
                    self.next_push = Instant::now() + delay;
                    tracing::warn!(error = %e, retry_in = ?delay, failures = self.failures, "push failed; keeping the snapshots");
                    false
                }
            }
        } else {
            false
        };
        let (freed, dropped, backlog) = {
            let mut t = crate::table::lock(&self.table);
            t.drop_frames();
            let freed = t.free_closed(now);
            let dropped = t.enforce_backlog(self.config.max_backlog_bytes());
            (freed, dropped, t.backlog().closed_bytes)
        };
        self.backlog_dropped(dropped, backlog);
        span.record("freed", freed as u64);
        span.record("pushed", push);
        if freed > 0 {
            tracing::debug!(freed, "freed closed hours");
        }
        let outcome = match (checkpointed, pushed) {
            (true, true) => "ok",
            (false, _) => "checkpoint_failed",
            (true, false) => "push_failed",
        };
        span.record("outcome", outcome);
        self.metrics
            .flushes
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Counts what the backlog bound dropped, and logs an episode of drops once when it
    /// starts and once when it ends: when the backlog is back under half the bound (the
    /// aggregator is taking it again), not at every flush between the drops of two hours.
    fn backlog_dropped(&mut self, dropped: Dropped, backlog: u64) {
        self.metrics
            .backlog_bytes
            .set(i64::try_from(backlog).unwrap_or(i64::MAX));
        let max = self.config.max_backlog_bytes();
        if dropped.entries > 0 {
            self.metrics
                .snapshots_dropped
                .get_or_create(&ReasonLabel {
                    reason: "backlog_full",
                })
                .inc_by(dropped.snapshots);
            match &mut self.backlog_episode {
                Some(episode) => {
                    episode.entries += dropped.entries;
                    episode.snapshots += dropped.snapshots;
                    episode.bytes += dropped.bytes;
                    episode.last_hour = episode.last_hour.max(dropped.last_hour);
                    episode.undeclared_hours += dropped.undeclared_hours;
                    tracing::debug!(?dropped, "backlog still full; dropped more");
                }
                None => {
                    tracing::warn!(
                        snapshots = dropped.snapshots,
                        bytes = dropped.bytes,
                        from_hour = %hourglass_rpc::time::format_hour(dropped.first_hour),
                        to_hour = %hourglass_rpc::time::format_hour(dropped.last_hour),
                        hours_no_longer_declared_live = dropped.undeclared_hours,
                        max_backlog_mib = self.config.shipping.max_backlog_mib,
                        "BACKLOG FULL: the aggregator has not acknowledged closed hours beyond shipping.max_backlog_mib; \
                         dropping the oldest (counted in snapshots_dropped_total{{reason=\"backlog_full\"}}; \
                         logged again when the backlog drains)"
                    );
                    self.backlog_episode = Some(dropped);
                }
            }
        } else if backlog <= max / 2
            && let Some(episode) = self.backlog_episode.take()
        {
            tracing::warn!(
                snapshots = episode.snapshots,
                bytes = episode.bytes,
                from_hour = %hourglass_rpc::time::format_hour(episode.first_hour),
                to_hour = %hourglass_rpc::time::format_hour(episode.last_hour),
                hours_no_longer_declared_live = episode.undeclared_hours,
                "backlog under shipping.max_backlog_mib again; while it was full these were dropped"
            );
        }
    }

    /// The delay before the next push after `failures` failures in a row: doubling from
    /// `backoff_initial` up to `backoff_max`, times a uniform factor in [0.5, 1).
    fn backoff(&mut self) -> Duration {
        let s = &self.config.shipping;
        let doublings = self.failures.saturating_sub(1).min(30);
        let full = s
            .backoff_initial
            .saturating_mul(1 << doublings)
            .min(s.backoff_max);
        // xorshift64: jitter only needs to differ between agents, not be unpredictable.
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let factor = 0.5 + 0.5 * (self.jitter >> 11) as f64 / (1u64 << 53) as f64;
        full.mul_f64(factor)
    }

    /// Writes the checkpoint; false (logged and counted) if it failed.
    pub async fn checkpoint(&mut self) -> bool {
        let table = Arc::clone(&self.table);
        let writer = Arc::clone(&self.writer);
        let span = tracing::info_span!(
            "checkpoint",
            bytes = tracing::field::Empty,
            full = tracing::field::Empty
        );
        let inner = span.clone();
        let result = tokio::task::spawn_blocking(move || {
            let _entered = inner.enter();
            // One writer at a time: a write still running from a flush that was given up
            // on finishes before the next begins.
            let mut writer = writer.lock().unwrap_or_else(PoisonError::into_inner);
            writer.write(&table)
        })
        .await;
        let outcome = match result {
            Ok(Ok(written)) => {
                span.record("bytes", written.bytes);
                span.record("full", written.full);
                let m = &self.metrics;
                m.checkpoint_bytes
                    .set(i64::try_from(written.on_disk).unwrap_or(i64::MAX));
                m.checkpoint_written
                    .get_or_create(&KindLabel {
                        kind: if written.full { "base" } else { "log" },
                    })
                    .inc_by(written.bytes);
                m.last_checkpoint.set(unix_now());
                if self.failed_checkpoints > 0 {
                    tracing::warn!(
                        failed = self.failed_checkpoints,
                        "the checkpoint is written again after failing; new versions are pushed"
                    );
                }
                self.failed_checkpoints = 0;
                "ok"
            }
            Ok(Err(e)) => {
                self.checkpoint_failed(&e);
                "error"
            }
            Err(e) => {
                self.checkpoint_failed(&e);
                "error"
            }
        };
        self.metrics
            .checkpoints
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
        outcome == "ok"
    }

    /// Logs a failed checkpoint: loudly the first of a run of failures, quietly the rest
    /// (each is counted in `checkpoints_total{outcome="error"}`), and the end of the run.
    fn checkpoint_failed(&mut self, error: &dyn std::fmt::Display) {
        if self.failed_checkpoints == 0 {
            tracing::error!(
                error = %error,
                dir = %self.data_dir.display(),
                "WRITING THE CHECKPOINT FAILED: until one succeeds, only versions an earlier checkpoint holds are pushed, and new ones wait (logged again when it succeeds)"
            );
        } else {
            tracing::debug!(error = %error, failed = self.failed_checkpoints + 1, "the checkpoint is still failing");
        }
        self.failed_checkpoints = self.failed_checkpoints.saturating_add(1);
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
    fn apply(&self, sent: &[Sent], results: &[v1::SnapshotResult]) -> Result<(), PushError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{IngestStats, lock};

    /// A shipper of `table` whose channel is never used (it connects lazily).
    fn shipper(table: &Arc<Mutex<Table>>, config: Arc<Config>) -> Shipper {
        shipper_in(table, config, PathBuf::from("unused"), "http://127.0.0.1:1")
    }

    /// A shipper of `table` checkpointing into `dir` and pushing to `url`.
    pub(super) fn shipper_in(
        table: &Arc<Mutex<Table>>,
        config: Arc<Config>,
        dir: PathBuf,
        url: &str,
    ) -> Shipper {
        let channel = Channel::from_shared(url.to_string())
            .unwrap()
            .connect_lazy();
        Shipper::new(
            Arc::clone(table),
            Arc::new(Metrics::new()),
            config,
            dir,
            v1::Server {
                name: "web-1".into(),
                labels: Vec::new(),
            },
            channel,
            None,
        )
    }

    fn stale(held_version: u64) -> v1::SnapshotResult {
        v1::SnapshotResult {
            outcome: v1::PushOutcome::Stale as i32,
            held_version,
            reason: String::new(),
        }
    }

    #[tokio::test]
    async fn a_stale_reply_naming_a_later_version_sends_the_entry_again() {
        let config = Arc::new(Config::default());
        let table = Arc::new(Mutex::new(Table::new(Arc::clone(&config), 7)));
        let now = unix_now();
        {
            let mut t = lock(&table);
            for metric in ["diverged", "plain"] {
                let id = t
                    .resolve_statsd(metric, "", &mut IngestStats::default())
                    .unwrap();
                t.insert(id, now, now, b"u1", 1).unwrap();
            }
            assert_eq!(t.assign_versions(), 2, "both at version 1");
            t.checkpointed();
        }
        let s = shipper(&table, config);
        let (keys, sent) = {
            let mut t = lock(&table);
            let keys = t.unacked();
            let (_, sent, _) = t.encode_batch(&keys, 0, usize::MAX, 1000);
            (keys, sent)
        };
        let diverged = keys
            .iter()
            .position(|&k| lock(&table).get(k).unwrap().0.to_string() == "diverged")
            .unwrap();
        // Two kinds an entry, so two results each. The aggregator holds version 5 of
        // "diverged" (sent before the checkpoint fell behind) and version 1 of "plain".
        let mut results = Vec::new();
        for (
            i,
            &Sent {
                version,
                snapshots: count,
                ..
            },
        ) in sent.iter().enumerate()
        {
            let held = if i == diverged { 5 } else { version };
            results.extend(std::iter::repeat_n(stale(held), count));
        }
        s.apply(&sent, &results).unwrap();
        assert_eq!(s.metrics.version_divergence.get(), 2);
        assert_eq!(s.metrics.snapshots_acked.get(), 4);

        let mut t = lock(&table);
        assert_eq!(
            t.last_version(),
            5,
            "continues above what the aggregator holds"
        );
        let entry = |t: &Table, i: usize| t.get(keys[i]).unwrap().1.clone();
        assert!(
            entry(&t, diverged).pending(),
            "the aggregator holds other content: this entry's must still reach it"
        );
        assert!(
            !entry(&t, 1 - diverged).pending(),
            "a plain stale reply acknowledges"
        );
        // The next flush gives it a version above the one held, and sends it.
        assert_eq!(t.assign_versions(), 1);
        t.checkpointed();
        assert_eq!(entry(&t, diverged).version, 6);
        assert_eq!(t.unacked(), vec![keys[diverged]]);
    }

    #[tokio::test]
    async fn an_outage_longer_than_the_backlog_bound_drops_the_oldest_hours_counted() {
        let mut config = Config::default();
        config.shipping.max_backlog_mib = 1;
        let config = Arc::new(config);
        let table = Arc::new(Mutex::new(Table::new(Arc::clone(&config), 7)));
        let now_hour = (unix_now() / 3600) as u32;
        // Four closed hours of four series, never acknowledged: the aggregator is away.
        // A default entry (distinct + frequency) is about 100 KiB, so 16 are above 1 MiB.
        {
            let mut t = lock(&table);
            for back in (3..7).rev() {
                for m in ["a", "b", "c", "d"] {
                    let id = t
                        .resolve_statsd(m, "", &mut IngestStats::default())
                        .unwrap();
                    t.insert_at(id, now_hour - back, b"u1", 1);
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut s = shipper_in(
            &table,
            Arc::clone(&config),
            dir.path().into(),
            "http://127.0.0.1:1",
        );
        s.flush(true).await;
        let held = lock(&table).backlog();
        assert!(held.closed_bytes <= 1 << 20, "{held:?}");
        assert!(
            held.closed_bytes > (1 << 20) - 200 * 1024,
            "only what is over goes: {held:?}"
        );
        let dropped = s
            .metrics
            .snapshots_dropped
            .get_or_create(&ReasonLabel {
                reason: "backlog_full",
            })
            .get();
        assert_eq!(
            dropped,
            32 - held.snapshots,
            "every dropped snapshot is counted"
        );
        assert!(dropped > 0);
        {
            let t = lock(&table);
            assert!(
                t.entry("a", now_hour - 6).is_none(),
                "the oldest hour goes first"
            );
            assert!(t.entry("d", now_hour - 3).is_some(), "the newest stays");
        }
        assert!(s.backlog_episode.is_some(), "an episode of drops began");
        let text = s.metrics.encode();
        for want in [
            format!(
                r#"hourglass_agent_snapshots_dropped_total{{reason="backlog_full"}} {dropped}"#
            ),
            format!("hourglass_agent_backlog_bytes {}", held.closed_bytes),
        ] {
            assert!(text.contains(&want), "{want} missing from\n{text}");
        }
        // Still away, nothing new: nothing more is dropped and the episode goes on.
        s.flush(true).await;
        assert_eq!(lock(&table).backlog(), held);
        assert!(s.backlog_episode.is_some());
    }
}

/// A full disk, for real: the test runs again in a child process whose file size limit
/// (RLIMIT_FSIZE) makes every write past it fail, as ENOSPC would.
#[cfg(test)]
mod full_disk {
    use super::*;
    use crate::table::{IngestStats, lock};
    use hourglass_rpc::proto::v1::collector_server::{Collector, CollectorServer};
    use std::sync::atomic::{AtomicBool, Ordering};

    const CHILD: &str = "HOURGLASS_TEST_FULL_DISK_CHILD";
    /// The file size limit in the child: room for a checkpoint of a few sparse sketches,
    /// not for twenty dense ones.
    const LIMIT: u64 = 128 << 10;

    /// An aggregator that stores everything, or is away.
    #[derive(Default, Clone)]
    struct Recorder {
        away: Arc<AtomicBool>,
        stored: Arc<Mutex<Vec<(String, u32, u64)>>>,
    }

    #[tonic::async_trait]
    impl Collector for Recorder {
        async fn push(
            &self,
            request: tonic::Request<v1::PushRequest>,
        ) -> Result<tonic::Response<v1::PushResponse>, tonic::Status> {
            if self.away.load(Ordering::SeqCst) {
                return Err(tonic::Status::unavailable("away"));
            }
            let mut stored = self.stored.lock().unwrap();
            let results = request
                .into_inner()
                .snapshots
                .into_iter()
                .map(|s| {
                    let series = s.series.map(|s| s.metric).unwrap_or_default();
                    stored.push((series, s.hour, s.version));
                    v1::SnapshotResult {
                        outcome: v1::PushOutcome::Stored as i32,
                        held_version: s.version,
                        reason: String::new(),
                    }
                })
                .collect();
            Ok(tonic::Response::new(v1::PushResponse { results }))
        }
    }

    /// Sets this process's soft file-size limit (`None`: unlimited).
    fn set_file_size_limit(soft: Option<u64>) {
        use rustix::process::{Resource, Rlimit, setrlimit};
        let limit = Rlimit {
            current: soft,
            maximum: None,
        };
        setrlimit(Resource::Fsize, limit).expect("setrlimit(RLIMIT_FSIZE)");
    }

    #[test]
    #[allow(unsafe_code)] // pre_exec, and signal(2); see the SAFETY comment
    fn a_full_disk_stops_new_versions_but_not_the_pushes_of_checkpointed_ones() {
        if std::env::var_os(CHILD).is_some() {
            return tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(in_child());
        }
        let name = "shipper::full_disk::a_full_disk_stops_new_versions_but_not_the_pushes_of_checkpointed_ones";
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(CHILD, "1");
        // SAFETY: between fork and exec only async-signal-safe calls: setrlimit (a raw
        // system call through rustix) and signal.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                use rustix::process::{Resource, Rlimit, setrlimit};
                let limit = Rlimit {
                    current: Some(LIMIT),
                    maximum: None,
                };
                setrlimit(Resource::Fsize, limit)?;
                // Writes past the limit then fail with EFBIG instead of killing the process.
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                Ok(())
            });
        }
        let out = command.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the child failed:\n{stdout}\n{stderr}"
        );
    }

    async fn in_child() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let aggregator = Recorder::default();
        let service = CollectorServer::new(aggregator.clone())
            .accept_compressed(CompressionEncoding::Zstd)
            .send_compressed(CompressionEncoding::Zstd);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );

        let config = Arc::new(Config {
            default_kinds: vec![hourglass_sketch::format::Kind::Distinct],
            ..Config::default()
        });
        let table = Arc::new(Mutex::new(Table::new(Arc::clone(&config), 7)));
        let now = unix_now();
        let add = |metric: &str, items: std::ops::Range<u32>| {
            let mut t = lock(&table);
            let id = t
                .resolve_statsd(metric, "", &mut IngestStats::default())
                .unwrap();
            for i in items {
                t.insert(id, now, now, format!("u{i}").as_bytes(), 1)
                    .unwrap();
            }
        };
        let dir = tempfile::tempdir().unwrap();
        let mut s = super::tests::shipper_in(&table, config, dir.path().to_path_buf(), &url);

        // 1. The aggregator is away; the checkpoint holds "a" and "b" at version 1.
        add("a", 0..10);
        add("b", 0..10);
        aggregator.away.store(true, Ordering::SeqCst);
        s.flush(true).await;
        assert_eq!(checkpoints(&s, "ok"), 1);
        assert!(aggregator.stored.lock().unwrap().is_empty());

        // 2. Twenty dense sketches later, the checkpoint no longer fits; "a" changed too.
        // The aggregator is back: what the checkpoint holds at version 1 goes, nothing else.
        add("a", 10..20);
        for m in 0..20 {
            add(&format!("big{m}"), 0..5000);
        }
        aggregator.away.store(false, Ordering::SeqCst);
        s.flush(true).await;
        assert_eq!(checkpoints(&s, "error"), 1, "the disk is full");
        let mut stored = aggregator.stored.lock().unwrap().clone();
        stored.sort();
        let hour = (now / 3600) as u32;
        assert_eq!(
            stored,
            [("a".to_string(), hour, 1), ("b".to_string(), hour, 1)],
            "only versions a checkpoint holds are pushed"
        );
        assert_eq!(s.metrics.snapshots_sent_checkpoint_failing.get(), 2);
        assert_eq!(lock(&table).backlog().awaiting_checkpoint, 21);
        s.metrics.set_table(&lock(&table).backlog(), &[]);
        let text = s.metrics.encode();
        for want in [
            "hourglass_agent_snapshots_sent_checkpoint_failing_total 2",
            "hourglass_agent_awaiting_checkpoint_entries 21",
            r#"hourglass_agent_checkpoints_total{outcome="error"} 1"#,
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
        // The failed append was cut back off: the files hold the first checkpoint whole.
        let loaded = checkpoint::read(dir.path()).unwrap().unwrap();
        assert_eq!((loaded.entries.len(), loaded.last_version), (2, 1));
        assert_eq!(loaded.torn_bytes, 0);

        // 3. Room again: the new versions are checkpointed, then pushed.
        set_file_size_limit(None);
        s.flush(true).await;
        assert_eq!(checkpoints(&s, "ok"), 2);
        let stored = aggregator.stored.lock().unwrap().clone();
        assert_eq!(stored.len(), 2 + 21);
        assert!(stored[2..].iter().all(|(_, _, v)| *v == 2), "{stored:?}");
        assert_eq!(lock(&table).backlog().awaiting_checkpoint, 0);
        assert_eq!(s.metrics.snapshots_sent_checkpoint_failing.get(), 2);
        let loaded = checkpoint::read(dir.path()).unwrap().unwrap();
        assert_eq!((loaded.entries.len(), loaded.last_version), (22, 2));
    }

    fn checkpoints(s: &Shipper, outcome: &'static str) -> u64 {
        s.metrics
            .checkpoints
            .get_or_create(&OutcomeLabel { outcome })
            .get()
    }
}
