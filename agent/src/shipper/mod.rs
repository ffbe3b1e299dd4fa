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

#[cfg(test)]
mod full_disk;
mod push;
#[cfg(test)]
mod tests;

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
use crate::table::{Dropped, Table};

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
            match self.push_within(push_limit).await {
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
}
