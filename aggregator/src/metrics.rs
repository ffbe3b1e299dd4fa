//! The aggregator's Prometheus metrics, served as text on the admin port's `/metrics`.
//!
//! Counters and histograms are updated where things happen (the gRPC services and the
//! background task); storage gauges are read from RocksDB when `/metrics` is scraped, so
//! they cost nothing between scrapes.

use crate::store::StoreStats;
pub(crate) use hourglass_rpc::metrics::{MethodLabel, OutcomeLabel, ReasonLabel};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `method` of a query (`distinct`, `frequency`, …).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueryLabel {
    /// The query method.
    pub(crate) method: &'static str,
}

/// `method` and `outcome` of a query.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueryOutcomeLabels {
    /// The query method.
    pub(crate) method: &'static str,
    /// `ok`, or the gRPC code's name.
    pub(crate) outcome: &'static str,
}

/// `outcome` of applying one message of the cluster's stream: `ok`, `refused` (never
/// retried) or `retry` (the store failed; redelivered).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ApplyLabel {
    /// The outcome.
    pub(crate) outcome: &'static str,
}

/// `bound`: the setting that refused a query.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BoundLabel {
    /// The setting.
    pub(crate) bound: &'static str,
}

/// `what` retention deleted: `hourly` rows or `rollups`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WhatLabel {
    /// What was deleted.
    pub(crate) what: &'static str,
}

/// `cf`: a RocksDB column family.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CfLabel {
    /// The column family.
    pub(crate) cf: String,
}

/// `cf` and `what` of a RocksDB size.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CfSizeLabels {
    /// The column family.
    pub(crate) cf: String,
    /// Which size (`sst`, `live_data`, `memtable`, `pending_compaction`).
    pub(crate) what: &'static str,
}

/// Every metric the aggregator exports.
pub struct Metrics {
    registry: Registry,
    /// Push RPCs answered, by outcome (`ok` or the gRPC code).
    pub(crate) pushes: Family<OutcomeLabel, Counter>,
    /// Snapshots stored (newer than held).
    pub(crate) snapshots_stored: Counter,
    /// Snapshots acknowledged as stale.
    pub(crate) snapshots_stale: Counter,
    /// Snapshots rejected, by the rule they broke.
    pub(crate) snapshots_rejected: Family<ReasonLabel, Counter>,
    /// Live hours declared outside the hours accepted now (a broken agent clock, or
    /// hours past retention), ignored.
    pub(crate) live_hours_refused: Counter,
    /// Requests refused before any handler ran because the message was larger than
    /// `limits.max_message_mib`, by gRPC method.
    pub(crate) requests_too_large: Family<MethodLabel, Counter>,
    /// Query RPCs answered, by method and outcome.
    pub(crate) queries: Family<QueryOutcomeLabels, Counter>,
    /// Queries refused by a bound, by the setting (`limits.max_query_range`,
    /// `limits.max_query_fanout`).
    pub(crate) queries_refused: Family<BoundLabel, Counter>,
    /// Push latency in seconds, from request to reply.
    pub(crate) push_seconds: Histogram,
    /// Query latency in seconds, by method.
    pub(crate) query_seconds: Family<QueryLabel, Histogram>,
    /// Rollup passes run, by outcome.
    pub(crate) rollup_passes: Family<OutcomeLabel, Counter>,
    /// Days whose rollups were (re)built.
    pub(crate) rollup_days: Counter,
    /// Rollup sketches written.
    pub(crate) rollups_written: Counter,
    /// Hourly rows and rollups deleted by retention, by what.
    pub(crate) retention_deleted: Family<WhatLabel, Counter>,
    /// Days found whose rows do not merge (recorded as conflicts, not rolled up).
    pub(crate) rollup_conflicts: Counter,
    /// Rows that arrived in a day whose hours retention had deleted; not rolled up.
    pub(crate) rollup_late_rows_dropped: Counter,
    /// Days in conflict now: no rollups, hourly rows kept, queries over them refused.
    pub(crate) conflicted_days: Gauge,
    /// (series, day) pairs past hourly retention whose rows are kept.
    pub(crate) retention_held_days: Gauge,
    /// Seconds since the oldest closed day that still waits for its rollups was closed;
    /// 0 when every closed day is rolled up.
    pub(crate) rollup_lag_seconds: Gauge,
    /// Unix time of the end of the last successful rollup pass.
    pub(crate) last_rollup_pass: Gauge,
    /// Series in the dictionary.
    pub(crate) series: Gauge,
    /// Servers in the registry.
    pub(crate) servers: Gauge,
    /// RocksDB sizes per column family, by `cf` and `what`.
    pub(crate) store_bytes: Family<CfSizeLabels, Gauge>,
    /// RocksDB estimated keys per column family.
    pub(crate) store_keys: Family<CfLabel, Gauge>,
    /// Bytes in the RocksDB block cache.
    pub(crate) block_cache_bytes: Gauge,
    /// The hour cache (`store::cache`): hours answered from it and merged from rows since
    /// start, and the bytes it holds.
    pub(crate) query_cache_hits: Gauge,
    pub(crate) query_cache_misses: Gauge,
    pub(crate) query_cache_bytes: Gauge,
    /// Compactions running.
    pub(crate) running_compactions: Gauge,
    /// 1 while RocksDB stops writes (too many L0 files or pending compaction).
    pub(crate) write_stopped: Gauge,
    /// Bytes per second RocksDB delays writes to; 0 when it does not.
    pub(crate) delayed_write_rate: Gauge,
    /// Cluster mode: snapshots published to the stream (and acknowledged by it).
    pub(crate) cluster_published_snapshots: Counter,
    /// Cluster mode: messages published to the stream.
    pub(crate) cluster_published_messages: Counter,
    /// Cluster mode: payload bytes published to the stream.
    pub(crate) cluster_published_bytes: Counter,
    /// Cluster mode: pushes whose publishing failed (refused to the agent, who retries).
    pub(crate) cluster_publish_failures: Counter,
    /// Cluster mode: time from a push's first publish to its last acknowledgement.
    pub(crate) cluster_publish_seconds: Histogram,
    /// Cluster mode: messages of the stream applied, by outcome.
    pub(crate) cluster_applied: Family<ApplyLabel, Counter>,
    /// Cluster mode: the highest stream sequence this node published and saw acknowledged.
    pub(crate) cluster_published_sequence: Gauge,
    /// Cluster mode: the highest stream sequence this node applied (or refused for good).
    pub(crate) cluster_applied_sequence: Gauge,
    /// Cluster mode: messages of the stream its consumers have yet to deliver to this
    /// node (summed over the partitions it applies): its lag.
    pub(crate) cluster_pending: Gauge,
    /// Cluster mode: snapshots of owned partitions applied to this node's store.
    pub(crate) cluster_applied_snapshots: Counter,
    /// Cluster mode: stream messages read once for all the partitions of their subject
    /// catching up together.
    pub(crate) cluster_caught_up_messages: Counter,
    /// Cluster mode: live members as this node last read them.
    pub(crate) cluster_members: Gauge,
    /// Cluster mode: partitions this node applies.
    pub(crate) cluster_partitions_applying: Gauge,
    /// Cluster mode: partitions this node answers for (applied completely).
    pub(crate) cluster_partitions_ready: Gauge,
    /// Cluster mode: partitions this node's live consumer carries (DESIGN §10); the rest
    /// of those it applies catch up through consumers of their own.
    pub(crate) cluster_partitions_carried: Gauge,
    /// Cluster mode: partitions missing from query answers (no ready node answered).
    pub(crate) cluster_partitions_missing: Counter,
}

fn latency_buckets() -> Histogram {
    // 0.5 ms to about 16 s: pushes are fsync-bound, queries over a year read rollups.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// All metrics at zero, registered under the `hourglass_aggregator` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("hourglass_aggregator");
        let mut m = Metrics {
            pushes: Family::default(),
            snapshots_stored: Counter::default(),
            snapshots_stale: Counter::default(),
            snapshots_rejected: Family::default(),
            live_hours_refused: Counter::default(),
            requests_too_large: Family::default(),
            queries: Family::default(),
            queries_refused: Family::default(),
            push_seconds: latency_buckets(),
            query_seconds: Family::new_with_constructor(latency_buckets),
            rollup_passes: Family::default(),
            rollup_days: Counter::default(),
            rollups_written: Counter::default(),
            retention_deleted: Family::default(),
            rollup_conflicts: Counter::default(),
            rollup_late_rows_dropped: Counter::default(),
            conflicted_days: Gauge::default(),
            retention_held_days: Gauge::default(),
            rollup_lag_seconds: Gauge::default(),
            last_rollup_pass: Gauge::default(),
            series: Gauge::default(),
            servers: Gauge::default(),
            store_bytes: Family::default(),
            store_keys: Family::default(),
            block_cache_bytes: Gauge::default(),
            query_cache_hits: Gauge::default(),
            query_cache_misses: Gauge::default(),
            query_cache_bytes: Gauge::default(),
            running_compactions: Gauge::default(),
            write_stopped: Gauge::default(),
            delayed_write_rate: Gauge::default(),
            cluster_published_snapshots: Counter::default(),
            cluster_published_messages: Counter::default(),
            cluster_published_bytes: Counter::default(),
            cluster_publish_failures: Counter::default(),
            cluster_publish_seconds: latency_buckets(),
            cluster_applied: Family::default(),
            cluster_published_sequence: Gauge::default(),
            cluster_applied_sequence: Gauge::default(),
            cluster_pending: Gauge::default(),
            cluster_applied_snapshots: Counter::default(),
            cluster_caught_up_messages: Counter::default(),
            cluster_members: Gauge::default(),
            cluster_partitions_applying: Gauge::default(),
            cluster_partitions_ready: Gauge::default(),
            cluster_partitions_carried: Gauge::default(),
            cluster_partitions_missing: Counter::default(),
            registry: Registry::default(),
        };
        m.register_requests(&mut registry);
        m.register_background(&mut registry);
        m.register_store(&mut registry);
        m.register_cluster(&mut registry);
        m.registry = registry;
        m
    }

    /// Registers the request families: pushes, snapshots, queries and their latencies.
    fn register_requests(&self, r: &mut Registry) {
        r.register(
            "pushes",
            "Push RPCs answered, by outcome",
            self.pushes.clone(),
        );
        r.register(
            "snapshots_stored",
            "Snapshots stored because they were newer than the version held",
            self.snapshots_stored.clone(),
        );
        r.register(
            "snapshots_stale",
            "Snapshots acknowledged and ignored because a newer or equal version is held",
            self.snapshots_stale.clone(),
        );
        r.register(
            "snapshots_rejected",
            "Snapshots refused, by the rule they broke",
            self.snapshots_rejected.clone(),
        );
        r.register(
            "live_hours_refused",
            "Live hours a push declared outside the hours accepted now (retention.hourly back, one hour ahead); ignored",
            self.live_hours_refused.clone(),
        );
        r.register(
            "queries_refused",
            "Queries refused by a bound, by the setting that sets it",
            self.queries_refused.clone(),
        );
        r.register(
            "requests_too_large",
            "Requests refused for a message larger than limits.max_message_mib, by method",
            self.requests_too_large.clone(),
        );
        r.register(
            "queries",
            "Query RPCs answered, by method and outcome",
            self.queries.clone(),
        );
        r.register(
            "push_duration_seconds",
            "Time to answer a push, including the WAL sync",
            self.push_seconds.clone(),
        );
        r.register(
            "query_duration_seconds",
            "Time to answer a query, by method",
            self.query_seconds.clone(),
        );
    }

    /// Registers the background families: rollups and retention.
    fn register_background(&self, r: &mut Registry) {
        r.register(
            "rollup_passes",
            "Background rollup and retention passes, by outcome",
            self.rollup_passes.clone(),
        );
        r.register(
            "rollup_days",
            "Series-days whose rollups were built or rebuilt",
            self.rollup_days.clone(),
        );
        r.register(
            "rollups_written",
            "Daily rollup sketches written",
            self.rollups_written.clone(),
        );
        r.register(
            "retention_deleted",
            "Rows deleted by retention, by table",
            self.retention_deleted.clone(),
        );
        r.register(
            "rollup_conflicts",
            "Days found whose hourly rows do not merge (a metric's parameters changed within the day, or a row is unreadable): not rolled up, rows kept, queries over them refused with the cause",
            self.rollup_conflicts.clone(),
        );
        r.register(
            "rollup_late_rows_dropped",
            "Rows that arrived in a day whose hours retention had already deleted; not rolled up, deleted with the day",
            self.rollup_late_rows_dropped.clone(),
        );
        r.register(
            "conflicted_days",
            "Series-days whose rollups cannot be built (see rollup_conflicts)",
            self.conflicted_days.clone(),
        );
        r.register(
            "retention_held_days",
            "Series-days past retention.hourly whose hourly rows are kept: not rolled up yet, or in conflict",
            self.retention_held_days.clone(),
        );
        r.register(
            "rollup_lag_seconds",
            "Seconds since the oldest closed day still waiting for rollups was closed",
            self.rollup_lag_seconds.clone(),
        );
        r.register(
            "last_rollup_pass_timestamp_seconds",
            "Unix time at which the last successful rollup pass ended",
            self.last_rollup_pass.clone(),
        );
    }

    /// Registers the storage families: series and servers held, RocksDB sizes, cache, compactions and stalls.
    fn register_store(&self, r: &mut Registry) {
        r.register("series", "Series in the dictionary", self.series.clone());
        r.register("servers", "Servers in the registry", self.servers.clone());
        r.register(
            "store_bytes",
            "RocksDB bytes per column family: sst, live data, memtable, pending compaction",
            self.store_bytes.clone(),
        );
        r.register(
            "store_estimated_keys",
            "RocksDB estimated keys per column family",
            self.store_keys.clone(),
        );
        r.register(
            "block_cache_usage_bytes",
            "Bytes held in the RocksDB block cache",
            self.block_cache_bytes.clone(),
        );
        r.register(
            "query_cache_hits",
            "Hours of distinct series a query took from the hour cache, since start",
            self.query_cache_hits.clone(),
        );
        r.register(
            "query_cache_misses",
            "Hours of distinct series a query merged from their rows (not cached, or written since), since start",
            self.query_cache_misses.clone(),
        );
        r.register(
            "query_cache_bytes",
            "Bytes of merged hours held in the hour cache",
            self.query_cache_bytes.clone(),
        );
        r.register(
            "running_compactions",
            "RocksDB compactions running",
            self.running_compactions.clone(),
        );
        r.register(
            "write_stopped",
            "1 while RocksDB stops writes",
            self.write_stopped.clone(),
        );
        r.register(
            "delayed_write_rate_bytes",
            "Rate RocksDB delays writes to, 0 when not delaying",
            self.delayed_write_rate.clone(),
        );
    }

    /// Registers cluster mode's families (zero without `[cluster]`).
    fn register_cluster(&self, r: &mut Registry) {
        r.register(
            "cluster_published_snapshots",
            "Cluster mode: snapshots published to the stream and acknowledged by JetStream",
            self.cluster_published_snapshots.clone(),
        );
        r.register(
            "cluster_published_messages",
            "Cluster mode: messages published to the stream",
            self.cluster_published_messages.clone(),
        );
        r.register(
            "cluster_published_bytes",
            "Cluster mode: payload bytes published to the stream",
            self.cluster_published_bytes.clone(),
        );
        r.register(
            "cluster_publish_failures",
            "Cluster mode: pushes refused because JetStream did not acknowledge their publishes",
            self.cluster_publish_failures.clone(),
        );
        r.register(
            "cluster_publish_duration_seconds",
            "Cluster mode: time from a push's first publish to its last acknowledgement",
            self.cluster_publish_seconds.clone(),
        );
        r.register(
            "cluster_applied",
            "Cluster mode: messages of the stream applied to this node's store, by outcome",
            self.cluster_applied.clone(),
        );
        r.register(
            "cluster_published_sequence",
            "Cluster mode: the highest stream sequence this node published and saw acknowledged",
            self.cluster_published_sequence.clone(),
        );
        r.register(
            "cluster_applied_sequence",
            "Cluster mode: the highest stream sequence this node applied",
            self.cluster_applied_sequence.clone(),
        );
        r.register(
            "cluster_pending",
            "Cluster mode: messages of the partitions this node applies not yet delivered to it (its lag)",
            self.cluster_pending.clone(),
        );
        r.register(
            "cluster_applied_snapshots",
            "Cluster mode: snapshots of the partitions this node owns applied to its store",
            self.cluster_applied_snapshots.clone(),
        );
        r.register(
            "cluster_caught_up_messages",
            "Cluster mode: stream messages read once for all the partitions of their subject catching up together (a wiped store, a long stop)",
            self.cluster_caught_up_messages.clone(),
        );
        r.register(
            "cluster_members",
            "Cluster mode: live members as this node last read them",
            self.cluster_members.clone(),
        );
        r.register(
            "cluster_partitions_applying",
            "Cluster mode: partitions this node applies",
            self.cluster_partitions_applying.clone(),
        );
        r.register(
            "cluster_partitions_ready",
            "Cluster mode: partitions this node answers for (applied completely)",
            self.cluster_partitions_ready.clone(),
        );
        r.register(
            "cluster_partitions_carried",
            "Cluster mode: partitions applied through this node's live consumer (one consumer a node); the others catch up through consumers of their own",
            self.cluster_partitions_carried.clone(),
        );
        r.register(
            "cluster_partitions_missing",
            "Cluster mode: partitions left out of query answers because no ready node answered for them",
            self.cluster_partitions_missing.clone(),
        );
    }

    /// Records the stream position of the message just applied.
    pub(crate) fn cluster_applied_at(&self, sequence: u64) {
        // Redeliveries of older messages do not move it back.
        self.cluster_applied_sequence.inner().fetch_max(
            i64::try_from(sequence).unwrap_or(i64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Records this node's view of the cluster after a heartbeat.
    pub(crate) fn cluster_membership(
        &self,
        members: usize,
        applying: usize,
        ready: usize,
        carried: usize,
        pending: u64,
    ) {
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.cluster_partitions_carried.set(clamp(carried as u64));
        self.cluster_members.set(clamp(members as u64));
        self.cluster_partitions_applying.set(clamp(applying as u64));
        self.cluster_partitions_ready.set(clamp(ready as u64));
        self.cluster_pending.set(clamp(pending));
    }

    /// Counts one push published to the cluster's stream.
    pub(crate) fn cluster_published(&self, stats: &PublishStats, snapshots: u64) {
        self.cluster_published_snapshots.inc_by(snapshots);
        self.cluster_published_messages
            .inc_by(stats.messages as u64);
        self.cluster_published_bytes.inc_by(stats.bytes as u64);
        self.cluster_publish_seconds.observe(stats.seconds);
        let sequence = i64::try_from(stats.last_sequence).unwrap_or(i64::MAX);
        // Pushes finish in any order: keep the highest.
        self.cluster_published_sequence
            .inner()
            .fetch_max(sequence, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one finished query.
    pub(crate) fn query_done(&self, method: &'static str, outcome: &'static str, seconds: f64) {
        self.queries
            .get_or_create(&QueryOutcomeLabels { method, outcome })
            .inc();
        self.query_seconds
            .get_or_create(&QueryLabel { method })
            .observe(seconds);
    }

    /// Counts one query refused by the bound `setting`.
    pub(crate) fn query_refused(&self, setting: &'static str) {
        self.queries_refused
            .get_or_create(&BoundLabel { bound: setting })
            .inc();
    }

    /// Counts one rejected snapshot under the rule it broke.
    pub fn rejected(&self, rule: &'static str) {
        self.snapshots_rejected
            .get_or_create(&ReasonLabel { reason: rule })
            .inc();
    }

    /// Sets the storage gauges from a fresh reading.
    pub(crate) fn set_store(&self, stats: &StoreStats, series: usize, servers: usize) {
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.series.set(clamp(series as u64));
        self.servers.set(clamp(servers as u64));
        for cf in &stats.column_families {
            let bytes = |what: &'static str| CfSizeLabels {
                cf: cf.name.to_string(),
                what,
            };
            self.store_bytes
                .get_or_create(&bytes("sst"))
                .set(clamp(cf.sst_bytes));
            self.store_bytes
                .get_or_create(&bytes("live_data"))
                .set(clamp(cf.live_data_bytes));
            self.store_bytes
                .get_or_create(&bytes("memtable"))
                .set(clamp(cf.memtable_bytes));
            self.store_bytes
                .get_or_create(&bytes("pending_compaction"))
                .set(clamp(cf.pending_compaction_bytes));
            self.store_keys
                .get_or_create(&CfLabel {
                    cf: cf.name.to_string(),
                })
                .set(clamp(cf.estimated_keys));
        }
        self.block_cache_bytes
            .set(clamp(stats.block_cache_usage_bytes));
        self.query_cache_hits.set(clamp(stats.hour_cache.hits));
        self.query_cache_misses.set(clamp(stats.hour_cache.misses));
        self.query_cache_bytes.set(clamp(stats.hour_cache.bytes));
        self.running_compactions
            .set(clamp(stats.running_compactions));
        self.write_stopped.set(i64::from(stats.write_stopped));
        self.delayed_write_rate.set(clamp(stats.delayed_write_rate));
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error here would be a bug in a label.
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

/// What one publish cost.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishStats {
    /// Messages published.
    pub messages: usize,
    /// Their payload bytes.
    pub bytes: usize,
    /// From the first publish to the last acknowledgement.
    pub seconds: f64,
    /// The highest stream sequence JetStream gave the messages.
    pub last_sequence: u64,
    /// Per partition (and the live subject), the highest sequence of its messages.
    pub sequences: std::collections::BTreeMap<u32, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_names_every_family_with_its_prefix() {
        let m = Metrics::new();
        m.snapshots_stored.inc_by(3);
        m.rejected("sketch.kind");
        m.query_done("distinct", "ok", 0.01);
        m.pushes
            .get_or_create(&OutcomeLabel { outcome: "ok" })
            .inc();
        let text = m.encode();
        assert!(
            text.contains("hourglass_aggregator_snapshots_stored_total 3"),
            "{text}"
        );
        assert!(
            text.contains(
                r#"hourglass_aggregator_snapshots_rejected_total{reason="sketch.kind"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"hourglass_aggregator_queries_total{method="distinct",outcome="ok"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("hourglass_aggregator_query_duration_seconds_bucket"),
            "{text}"
        );
        assert!(text.contains("# EOF"), "{text}");
    }
}
