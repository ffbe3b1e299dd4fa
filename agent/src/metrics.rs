//! The agent's Prometheus metrics, served as text on the admin port's `/metrics`.
//!
//! Counters are added once per batch of events (a datagram burst, an Ingest call), not per
//! event; the backlog and Bloom gauges are read from the table when `/metrics` is scraped.

pub(crate) use hourglass_rpc::metrics::{MethodLabel, OutcomeLabel, ReasonLabel};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::table::{Backlog, BloomFill, IngestStats};

/// `source`: where events came from (`statsd`, `ingest`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SourceLabel {
    /// The source.
    pub(crate) source: &'static str,
}

/// `source` and `reason` of refused events.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RejectLabels {
    /// Where the events came from.
    pub(crate) source: &'static str,
    /// Why they were refused.
    pub(crate) reason: &'static str,
}

/// `kind` of checkpoint write: `base` or `log`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabel {
    /// The kind.
    pub(crate) kind: &'static str,
}

/// `series` and `hour` of a Bloom filter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BloomLabels {
    /// The series, as its canonical text.
    pub(crate) series: String,
    /// The hour, RFC 3339.
    pub(crate) hour: String,
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    /// Events added to sketches, by source (`statsd`, `ingest`).
    pub(crate) events: Family<SourceLabel, Counter>,
    /// Events or lines refused, by source and reason.
    pub(crate) rejected: Family<RejectLabels, Counter>,
    /// Ingest requests refused before the handler ran because the message was larger
    /// than the ingest limit, by gRPC method.
    pub(crate) requests_too_large: Family<MethodLabel, Counter>,
    /// StatsD lines of types hourglass does not count.
    pub(crate) unsupported: Counter,
    /// Datagrams received.
    pub(crate) datagrams: Counter,
    /// Tags dropped because the metric does not allow their key.
    pub(crate) dropped_tags: Counter,
    /// Snapshots sent in pushes.
    pub(crate) snapshots_sent: Counter,
    /// Snapshots the aggregator acknowledged (stored or stale).
    pub(crate) snapshots_acked: Counter,
    /// Snapshots the aggregator refused, by nothing more than a count (the reason is
    /// logged).
    pub(crate) snapshots_rejected: Counter,
    /// Snapshots sent again after a failed push.
    pub(crate) snapshots_retried: Counter,
    /// Stale replies naming a later version than the agent gave (a checkpoint behind
    /// what was sent).
    pub(crate) version_divergence: Counter,
    /// Live hours dropped because the aggregator refused a push of them alone for good
    /// (the reason is logged).
    pub(crate) live_hours_dropped: Counter,
    /// Snapshots the agent dropped without the aggregator having them, by reason
    /// (`backlog_full`: beyond `shipping.max_backlog_mib`).
    pub(crate) snapshots_dropped: Family<ReasonLabel, Counter>,
    /// Push RPCs, by outcome (`ok` or the gRPC code).
    pub(crate) pushes: Family<OutcomeLabel, Counter>,
    /// Push latency, seconds.
    pub(crate) push_seconds: Histogram,
    /// Flushes, by outcome.
    pub(crate) flushes: Family<OutcomeLabel, Counter>,
    /// Checkpoints written, by outcome.
    pub(crate) checkpoints: Family<OutcomeLabel, Counter>,
    /// Bytes of the checkpoint on disk (base and log) after the last successful write.
    pub(crate) checkpoint_bytes: Gauge,
    /// Bytes written by successful checkpoints, by kind (`base`: a whole new base;
    /// `log`: a transaction of what changed).
    pub(crate) checkpoint_written: Family<KindLabel, Counter>,
    /// Unix time of the last successful checkpoint, 0 before the first.
    pub(crate) last_checkpoint: Gauge,
    /// Snapshots pushed while the checkpoint was failing, at the versions an earlier
    /// checkpoint holds (new versions wait for a checkpoint).
    pub(crate) snapshots_sent_checkpoint_failing: Counter,
    /// Entries whose latest version no successful checkpoint holds yet.
    pub(crate) awaiting_checkpoint: Gauge,
    /// Starts without a usable checkpoint, by reason (`missing`, `corrupt`).
    pub(crate) checkpoint_lost: Family<ReasonLabel, Counter>,
    /// The current epoch.
    pub(crate) epoch: Gauge<u64, AtomicU64>,
    /// Unix time of the last successful push, 0 before the first.
    pub(crate) last_push: Gauge,
    /// Snapshots not yet acknowledged.
    pub(crate) pending_snapshots: Gauge,
    /// Bytes of sketches not yet acknowledged.
    pub(crate) pending_bytes: Gauge,
    /// Bytes of unacknowledged sketches of closed hours (what `shipping.max_backlog_mib`
    /// bounds).
    pub(crate) backlog_bytes: Gauge,
    /// `shipping.max_backlog_mib` in bytes.
    pub(crate) backlog_max_bytes: Gauge,
    /// Start (Unix time) of the oldest hour with something unacknowledged; 0 if none.
    pub(crate) oldest_unacked_hour: Gauge,
    /// Series held.
    pub(crate) active_series: Gauge,
    /// Open (series, hour) entries.
    pub(crate) open_entries: Gauge,
    /// Bytes of all sketches held.
    pub(crate) sketch_bytes: Gauge,
    /// Fill ratio of Bloom filters more than half full, by series and hour.
    pub(crate) bloom_fill: Family<BloomLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// All metrics at zero, under the `hourglass_agent` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("hourglass_agent");
        let m = Metrics {
            events: Family::default(),
            rejected: Family::default(),
            requests_too_large: Family::default(),
            unsupported: Counter::default(),
            datagrams: Counter::default(),
            dropped_tags: Counter::default(),
            snapshots_sent: Counter::default(),
            snapshots_acked: Counter::default(),
            snapshots_rejected: Counter::default(),
            snapshots_retried: Counter::default(),
            version_divergence: Counter::default(),
            live_hours_dropped: Counter::default(),
            snapshots_dropped: Family::default(),
            pushes: Family::default(),
            // 0.5 ms to about 16 s.
            push_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            flushes: Family::default(),
            checkpoints: Family::default(),
            checkpoint_bytes: Gauge::default(),
            checkpoint_written: Family::default(),
            last_checkpoint: Gauge::default(),
            snapshots_sent_checkpoint_failing: Counter::default(),
            awaiting_checkpoint: Gauge::default(),
            checkpoint_lost: Family::default(),
            epoch: Gauge::default(),
            last_push: Gauge::default(),
            pending_snapshots: Gauge::default(),
            pending_bytes: Gauge::default(),
            backlog_bytes: Gauge::default(),
            backlog_max_bytes: Gauge::default(),
            oldest_unacked_hour: Gauge::default(),
            active_series: Gauge::default(),
            open_entries: Gauge::default(),
            sketch_bytes: Gauge::default(),
            bloom_fill: Family::default(),
            registry: Registry::default(),
        };
        m.register_ingest(&mut registry);
        m.register_shipping(&mut registry);
        m.register_checkpoint(&mut registry);
        m.register_state(&mut registry);
        Metrics { registry, ..m }
    }

    /// Registers the ingest families: events, refusals, lines and tags.
    fn register_ingest(&self, r: &mut Registry) {
        r.register(
            "events",
            "Events added to sketches, by source",
            self.events.clone(),
        );
        r.register(
            "rejected",
            "Events and lines refused, by source and reason",
            self.rejected.clone(),
        );
        r.register(
            "requests_too_large",
            "Ingest requests refused for a message larger than the ingest limit, by method",
            self.requests_too_large.clone(),
        );
        r.register(
            "unsupported_lines",
            "StatsD lines of types hourglass does not count",
            self.unsupported.clone(),
        );
        r.register("datagrams", "Datagrams received", self.datagrams.clone());
        r.register(
            "dropped_tags",
            "Tags dropped because the metric does not allow their key",
            self.dropped_tags.clone(),
        );
    }

    /// Registers the shipping families: snapshots, pushes and flushes.
    fn register_shipping(&self, r: &mut Registry) {
        r.register(
            "snapshots_sent",
            "Snapshots sent in pushes",
            self.snapshots_sent.clone(),
        );
        r.register(
            "snapshots_acked",
            "Snapshots the aggregator stored or already held",
            self.snapshots_acked.clone(),
        );
        r.register(
            "snapshots_rejected",
            "Snapshots the aggregator refused (reasons are logged)",
            self.snapshots_rejected.clone(),
        );
        r.register(
            "snapshots_retried",
            "Snapshots sent again after a failed push",
            self.snapshots_retried.clone(),
        );
        r.register(
            "version_divergence",
            "Stale replies naming a later version than the agent gave",
            self.version_divergence.clone(),
        );
        r.register(
            "live_hours_dropped",
            "Live hours dropped because the aggregator refused them for good (reasons are logged)",
            self.live_hours_dropped.clone(),
        );
        r.register(
            "snapshots_dropped",
            "Snapshots dropped by the agent without the aggregator having them, by reason",
            self.snapshots_dropped.clone(),
        );
        r.register("pushes", "Push RPCs, by outcome", self.pushes.clone());
        r.register(
            "push_duration_seconds",
            "Push latency",
            self.push_seconds.clone(),
        );
        r.register("flushes", "Flushes, by outcome", self.flushes.clone());
    }

    /// Registers the checkpoint families and the epoch.
    fn register_checkpoint(&self, r: &mut Registry) {
        r.register(
            "checkpoints",
            "Checkpoints written, by outcome",
            self.checkpoints.clone(),
        );
        r.register(
            "checkpoint_bytes",
            "Size of the checkpoint on disk, base and log",
            self.checkpoint_bytes.clone(),
        );
        r.register(
            "checkpoint_written_bytes",
            "Bytes written by successful checkpoints, by kind (base, log)",
            self.checkpoint_written.clone(),
        );
        r.register(
            "last_checkpoint_timestamp_seconds",
            "Unix time of the last successful checkpoint",
            self.last_checkpoint.clone(),
        );
        r.register(
            "snapshots_sent_checkpoint_failing",
            "Snapshots pushed while the checkpoint was failing, at versions an earlier checkpoint holds",
            self.snapshots_sent_checkpoint_failing.clone(),
        );
        r.register(
            "awaiting_checkpoint_entries",
            "Entries whose latest version no successful checkpoint holds yet (not pushed until one does)",
            self.awaiting_checkpoint.clone(),
        );
        r.register(
            "checkpoint_lost",
            "Starts without a usable checkpoint (a new epoch), by reason",
            self.checkpoint_lost.clone(),
        );
        r.register(
            "epoch",
            "The epoch of the agent's state",
            self.epoch.clone(),
        );
    }

    /// Registers the state read from the table: the epoch, the backlog, series, entries and Bloom fill.
    fn register_state(&self, r: &mut Registry) {
        r.register(
            "last_push_timestamp_seconds",
            "Unix time of the last successful push",
            self.last_push.clone(),
        );
        r.register(
            "pending_snapshots",
            "Snapshots not yet acknowledged by the aggregator",
            self.pending_snapshots.clone(),
        );
        r.register(
            "pending_bytes",
            "Bytes of sketches not yet acknowledged",
            self.pending_bytes.clone(),
        );
        r.register(
            "backlog_bytes",
            "Bytes of unacknowledged sketches of closed hours (bounded by shipping.max_backlog_mib)",
            self.backlog_bytes.clone(),
        );
        r.register(
            "backlog_max_bytes",
            "shipping.max_backlog_mib in bytes",
            self.backlog_max_bytes.clone(),
        );
        r.register(
            "oldest_unacked_hour_timestamp_seconds",
            "Start of the oldest hour with something unacknowledged, 0 if none",
            self.oldest_unacked_hour.clone(),
        );
        r.register("active_series", "Series held", self.active_series.clone());
        r.register(
            "open_entries",
            "Open (series, hour) entries",
            self.open_entries.clone(),
        );
        r.register(
            "sketch_bytes",
            "Bytes of all sketches held",
            self.sketch_bytes.clone(),
        );
        r.register(
            "bloom_fill_ratio",
            "Fill ratio of Bloom filters more than half full",
            self.bloom_fill.clone(),
        );
    }

    /// Adds a batch's counts.
    pub(crate) fn ingested(&self, source: &'static str, stats: &IngestStats) {
        if stats.accepted > 0 {
            self.events
                .get_or_create(&SourceLabel { source })
                .inc_by(stats.accepted);
        }
        for (reason, n) in &stats.rejected {
            self.reject(source, reason, *n);
        }
        if stats.dropped_tags > 0 {
            self.dropped_tags.inc_by(stats.dropped_tags);
        }
    }

    /// Counts refusals.
    pub fn reject(&self, source: &'static str, reason: &'static str, n: u64) {
        self.rejected
            .get_or_create(&RejectLabels { source, reason })
            .inc_by(n);
    }

    /// Sets the gauges read from the table.
    pub(crate) fn set_table(&self, backlog: &Backlog, blooms: &[BloomFill]) {
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.pending_snapshots.set(clamp(backlog.snapshots));
        self.pending_bytes.set(clamp(backlog.bytes));
        self.backlog_bytes.set(clamp(backlog.closed_bytes));
        self.awaiting_checkpoint
            .set(clamp(backlog.awaiting_checkpoint));
        self.oldest_unacked_hour
            .set(backlog.oldest_hour.map_or(0, |h| i64::from(h) * 3600));
        self.active_series.set(clamp(backlog.series));
        self.open_entries.set(clamp(backlog.entries));
        self.sketch_bytes.set(clamp(backlog.sketch_bytes));
        self.bloom_fill.clear();
        for b in blooms {
            self.bloom_fill
                .get_or_create(&BloomLabels {
                    series: b.series.clone(),
                    hour: hourglass_rpc::time::format_hour(b.hour),
                })
                .set(b.fill);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_names_every_family_with_its_prefix() {
        let m = Metrics::new();
        let mut stats = IngestStats {
            accepted: 5,
            dropped_tags: 2,
            ..IngestStats::default()
        };
        stats.reject("too_late");
        stats.reject("too_late");
        m.ingested("statsd", &stats);
        m.set_table(
            &Backlog {
                snapshots: 4,
                closed_bytes: 1234,
                oldest_hour: Some(10),
                ..Backlog::default()
            },
            &[BloomFill {
                series: "pages".into(),
                hour: 10,
                fill: 0.75,
            }],
        );
        let text = m.encode();
        for want in [
            r#"hourglass_agent_events_total{source="statsd"} 5"#,
            r#"hourglass_agent_rejected_total{source="statsd",reason="too_late"} 2"#,
            "hourglass_agent_dropped_tags_total 2",
            "hourglass_agent_pending_snapshots 4",
            "hourglass_agent_backlog_bytes 1234",
            "hourglass_agent_oldest_unacked_hour_timestamp_seconds 36000",
            r#"hourglass_agent_bloom_fill_ratio{series="pages",hour="1970-01-01T10:00Z"} 0.75"#,
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
    }
}
