//! The write path: the rules a push is admitted by (the checks of the whole push and of
//! each snapshot, the series bound), the store's write, and the versions the store then
//! holds ([`held`]): one home for every writer of the store (DESIGN §3). The `Collector`
//! service stores an agent's push through it (a single aggregator), or checks the push
//! and applies the series bound through it before publishing (cluster mode's entry); the
//! cluster's apply loop stores what the stream carries through it. It knows neither the
//! services nor the cluster: both call down into it.
//!
//! Each snapshot is checked on its own ([`check`]); one that breaks a rule is rejected
//! with a reason naming the field, and the rest of the batch is still stored. The store
//! keeps, per (series, hour, server, epoch), the highest version, so retries and
//! duplicates only come back as STALE. The reply is sent after the one `put_push` write
//! returns, which is after the WAL holds it.
//!
//! A server may hold at most `limits.max_series_per_server` series ([`ledger`]); a
//! snapshot of one more is rejected and its series is not created ([`admit`]).
//!
//! [`Writer`] is the one way in, and the only one that keeps state (the store, the
//! bounds, the ledger, the counters); the files below it are its rules as functions:
//! [`check`], [`admit`] (with the store's write), [`held`] and [`ledger`].

mod admit;
mod check;
mod held;
mod ledger;

use std::collections::BTreeSet;
use std::sync::Arc;

use hourglass_rpc::proto::v1;
use hourglass_rpc::series::Series;
use tonic::Status;
use tracing::field;

use crate::config::LimitsConfig;
use crate::convert;
use crate::keys::Hour;
use crate::metrics::Metrics;
use crate::store::{PutOutcome, SeriesName, Store};
use admit::{PushTarget, admit_push, store_push};
use check::checked_server;
pub(crate) use check::{
    CheckedPush, Rejection, Valid, check_snapshot, checked_labels, reject, snapshot_partition,
};
pub(crate) use held::{HeldKey, held_versions};
pub(crate) use ledger::SeriesLedger;

/// The write path of one store: its checks, its series bound and its writes.
pub(crate) struct Writer {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    limits: LimitsConfig,
    retention_hourly: std::time::Duration,
    ledger: Arc<SeriesLedger>,
    /// Cluster mode's apply loop: the series bound was decided at the entry, so every
    /// owner of a partition stores the same snapshots.
    applying: bool,
}

impl Writer {
    /// A writer to `store` within `limits`, counting series in a ledger of its own.
    pub fn new(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        limits: LimitsConfig,
        retention_hourly: std::time::Duration,
    ) -> Self {
        Writer {
            store,
            metrics,
            limits,
            retention_hourly,
            ledger: Arc::new(SeriesLedger::new()),
            applying: false,
        }
    }

    /// This writer counting series in `ledger`, which another writer of the same store
    /// shares (cluster mode: the node's entry and its apply loop), so both count the same
    /// series.
    pub(crate) fn sharing(mut self, ledger: Arc<SeriesLedger>) -> Self {
        self.ledger = ledger;
        self
    }

    /// This writer applying what the cluster's stream carries, with `ledger`, the series
    /// ledger the node's entry uses, so both count the same series.
    pub(crate) fn applying_with(self, ledger: Arc<SeriesLedger>) -> Self {
        Writer {
            applying: true,
            ..self.sharing(ledger)
        }
    }

    /// The store this writer writes to.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The metrics this writer counts in.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The bounds this writer checks pushes against.
    pub(crate) fn limits(&self) -> &LimitsConfig {
        &self.limits
    }

    /// Applies a live message read from the cluster's stream: registers the server and
    /// its labels, marks its live hours and records the push's series index (which series
    /// the server holds on which day) in the store and the series ledger, storing no
    /// sketch. Every node applies every live message, so every node knows every series of
    /// every server: the entry's series bound and the queries' selection see them all.
    ///
    /// Blocking (the store's writes): run on a blocking thread, in a write group
    /// ([`crate::store::Replica::write_group`]) with the rest of a batch of messages.
    pub(crate) fn apply_live(&self, mut request: v1::PushRequest) -> Result<(), Status> {
        let server = request
            .server
            .take()
            .ok_or_else(|| Status::invalid_argument("server is required"))?;
        checked_server(&server, None)?;
        let labels = checked_labels(&server)?;
        let accepted_hours = self.accepted_hours();
        let checked_hours = Self::checked_hours(&accepted_hours, true);
        let live = self.live_hours(&request.live_hours, &checked_hours, &server.name)?;
        let mut index = Vec::with_capacity(request.snapshots.len());
        for (i, s) in request.snapshots.iter().enumerate() {
            let Some(series) = s.series.as_ref() else {
                continue;
            };
            let series = Series::try_from(series)
                .map_err(|e| Status::invalid_argument(format!("snapshots[{i}].series: {e}")))?;
            let kind = convert::kind(s.sketch.as_ref().map_or(0, |k| k.kind), "sketch.kind")
                .map_err(Status::invalid_argument)?;
            // A day gone with retention would only be swept again.
            if Hour(s.hour).day() >= Hour(*checked_hours.start()).day() {
                let name = SeriesName::new(series.metric(), series.tags().to_vec(), kind);
                index.push((name, Hour(s.hour).day()));
            }
        }
        let (store, ledger) = (self.store.as_ref(), self.ledger.as_ref());
        let oldest_day = Hour(*accepted_hours.start()).day();
        let stored = (|| {
            let server_id = store.register_server(&server.name, &labels)?;
            let mut held = Vec::with_capacity(index.len());
            ledger.with_server(store, server_id, oldest_day, |counted| {
                for (name, day) in &index {
                    let id = store.series_id_or_create(name)?;
                    counted.admit(id, *day, oldest_day, usize::MAX);
                    held.push((id, *day));
                }
                Ok(())
            })?;
            let live = (!live.is_empty()).then_some((server_id, &live[..]));
            store.put_index(live, server_id, &held)
        })();
        stored.map_err(|e| {
            tracing::error!(error = %e, "storing a live message failed");
            convert::store_status(&e)
        })
    }

    /// Applies a push read from the cluster's stream: every check and the store's write,
    /// as for a push from an agent; what a rule refuses is counted and logged here, since
    /// no agent waits for the answer. An error is the whole push's (the store failed, or
    /// the push breaks a rule of the whole request).
    ///
    /// Blocking (the store's writes): run on a blocking thread, in a write group
    /// ([`crate::store::Replica::write_group`]) with the rest of a batch of messages.
    pub(crate) fn apply(&self, mut request: v1::PushRequest) -> Result<(), Status> {
        let span = push_span("stream", request.snapshots.len());
        let _entered = span.enter();
        let checked = self.checked_request(&mut request, None, true, &span)?;
        let target = self.target(&checked);
        let (results, valid, slots) = self.check_snapshots(&mut request.snapshots, &checked);
        let answers =
            store_push(self.store.as_ref(), &self.ledger, &target, valid).map_err(|e| {
                tracing::error!(error = %e, "storing a push failed");
                convert::store_status(&e)
            })?;
        self.answer(results, slots, answers, &span).map(drop)
    }

    /// Stores a push from an agent whose whole-push checks passed ([`Self::checked_request`]):
    /// checks each snapshot, applies the series bound and writes what passes in one
    /// write, on a blocking thread. The response answers every snapshot, in request order.
    pub(crate) async fn push(
        &self,
        checked: CheckedPush,
        snapshots: &mut [v1::Snapshot],
        span: &tracing::Span,
    ) -> Result<v1::PushResponse, Status> {
        let (results, valid, slots) = self.check_snapshots(snapshots, &checked);
        let store = Arc::clone(&self.store);
        let ledger = Arc::clone(&self.ledger);
        let target = self.target(&checked);
        let answers = tokio::task::spawn_blocking(move || {
            store_push(store.as_ref(), &ledger, &target, valid)
        })
        .await
        .map_err(|e| Status::internal(format!("push task failed: {e}")))?
        .map_err(|e| {
            tracing::error!(error = %e, "storing a push failed");
            convert::store_status(&e)
        })?;
        self.answer(results, slots, answers, span)
    }

    /// The checks of a whole push (its size, server, labels and live hours) that every
    /// push passes, from an agent or (`from_stream`) from the cluster's stream.
    pub(crate) fn checked_request(
        &self,
        request: &mut v1::PushRequest,
        principal: Option<&crate::auth::Principal>,
        from_stream: bool,
        span: &tracing::Span,
    ) -> Result<CheckedPush, Status> {
        let limits = &self.limits;
        if request.snapshots.len() > limits.max_snapshots_per_push {
            return Err(Status::resource_exhausted(format!(
                "push has {} snapshots, more than the limit of {} (limits.max_snapshots_per_push)",
                request.snapshots.len(),
                limits.max_snapshots_per_push
            )));
        }
        let server = request
            .server
            .take()
            .ok_or_else(|| Status::invalid_argument("server is required"))?;
        checked_server(&server, principal)?;
        span.record("server", server.name.as_str());
        let labels = checked_labels(&server)?;
        let accepted_hours = self.accepted_hours();
        let checked_hours = Self::checked_hours(&accepted_hours, from_stream);
        let live = self.live_hours(&request.live_hours, &checked_hours, &server.name)?;
        Ok(CheckedPush {
            server,
            labels,
            accepted_hours,
            checked_hours,
            live,
        })
    }

    /// The hours a push may carry now: from the first hour of the oldest day hourly
    /// retention keeps (whole days, as retention deletes them), so no snapshot lands in a
    /// day whose hours are gone, to one hour ahead of the clock.
    fn accepted_hours(&self) -> std::ops::RangeInclusive<u32> {
        let now = hourglass_rpc::time::since_unix_epoch().as_secs();
        let now_hour = u32::try_from(now / 3600).unwrap_or(u32::MAX);
        let oldest = crate::background::accepted_from(now, self.retention_hourly);
        oldest.0..=now_hour.saturating_add(1)
    }

    /// The hours this writer checks snapshots and live hours against: those accepted
    /// now ([`Self::accepted_hours`]), or, for a push from the cluster's stream, any. The entry
    /// checked them against its clock when it accepted the push; this node applies the
    /// same message up to `cluster.max_age` later (a backlog, a restart, a partition that
    /// moved to it) or with another clock, and refusing what the entry acknowledged would
    /// leave this node without it while it answers for it. Its hourly rows are
    /// kept `cluster.max_age` past hourly retention for that ([`crate::background`]).
    fn checked_hours(
        accepted: &std::ops::RangeInclusive<u32>,
        from_stream: bool,
    ) -> std::ops::RangeInclusive<u32> {
        if from_stream {
            0..=u32::MAX
        } else {
            accepted.clone()
        }
    }

    /// The push's live hours as a set, bounded like snapshot hours: one far ahead would
    /// count a server as up for hours that have not happened, one past retention would be
    /// deleted at once. Those outside `accepted` are counted, logged and ignored; more
    /// than the limit refuses the push.
    fn live_hours(
        &self,
        declared: &[u32],
        accepted: &std::ops::RangeInclusive<u32>,
        server: &str,
    ) -> Result<Vec<Hour>, Status> {
        // Agents resend the same live hours with every push; the set is what counts.
        let live: BTreeSet<u32> = declared.iter().copied().collect();
        if live.len() > self.limits.max_live_hours_per_push {
            return Err(Status::resource_exhausted(format!(
                "push declares {} live hours, more than the limit of {} (limits.max_live_hours_per_push)",
                live.len(),
                self.limits.max_live_hours_per_push
            )));
        }
        let (live, refused): (Vec<u32>, Vec<u32>) =
            live.into_iter().partition(|h| accepted.contains(h));
        if !refused.is_empty() {
            self.metrics.live_hours_refused.inc_by(refused.len() as u64);
            tracing::warn!(
                server,
                refused = refused.len(),
                first = %hourglass_rpc::time::format_hour(refused[0].min(u32::MAX / 2)),
                accepted_from = %hourglass_rpc::time::format_hour(*accepted.start()),
                accepted_to = %hourglass_rpc::time::format_hour(*accepted.end()),
                "push declared live hours outside the hours accepted now; ignored"
            );
        }
        Ok(live.into_iter().map(Hour).collect())
    }

    /// Checks each snapshot ([`check_snapshot`]): the results so far (rejections filled
    /// in), the valid snapshots, and which result each valid one answers with its
    /// version, so that outcomes land in request order.
    fn check_snapshots(
        &self,
        snapshots: &mut [v1::Snapshot],
        checked: &CheckedPush,
    ) -> (Vec<v1::SnapshotResult>, Vec<Valid>, Vec<(usize, u64)>) {
        let mut results = Vec::with_capacity(snapshots.len());
        let mut valid = Vec::new();
        for (i, snapshot) in snapshots.iter_mut().enumerate() {
            match check_snapshot(i, snapshot, &self.limits, &checked.checked_hours) {
                Ok(v) => {
                    valid.push(v);
                    results.push(v1::SnapshotResult::default());
                }
                Err(r) => results.push(self.rejection(r)),
            }
        }
        let slots = valid.iter().map(|v| (v.index, v.version)).collect();
        (results, valid, slots)
    }

    /// Where a checked push is written, and by which bound.
    fn target(&self, checked: &CheckedPush) -> PushTarget {
        PushTarget {
            server: checked.server.name.clone(),
            labels: checked.labels.clone(),
            live_hours: checked.live.clone(),
            oldest_day: Hour(*checked.accepted_hours.start()).day(),
            // Applying a partition: the entry decided the bound, for all owners alike.
            max_series: match self.applying {
                true => usize::MAX,
                false => self.limits.max_series_per_server,
            },
            keep_labels: self.applying,
        }
    }

    /// Cluster mode's entry: the series bound, as a single aggregator applies it, in this
    /// node's store: per snapshot of `valid`, `None` to publish it or why it is refused.
    pub(crate) async fn admit_series(
        &self,
        server: &v1::Server,
        labels: Vec<(String, String)>,
        valid: Vec<Valid>,
        accepted_hours: &std::ops::RangeInclusive<u32>,
    ) -> Result<(Vec<Valid>, Vec<Option<Rejection>>), Status> {
        let (store, ledger) = (Arc::clone(&self.store), Arc::clone(&self.ledger));
        let name = server.name.clone();
        let oldest_day = Hour(*accepted_hours.start()).day();
        let max_series = self.limits.max_series_per_server;
        tokio::task::spawn_blocking(move || {
            let target = PushTarget {
                server: name,
                labels,
                live_hours: Vec::new(),
                oldest_day,
                max_series,
                keep_labels: true,
            };
            admit_push(store.as_ref(), &ledger, &target, &valid).map(|r| (valid, r))
        })
        .await
        .map_err(|e| Status::internal(format!("push task failed: {e}")))?
        .map_err(|e| {
            tracing::error!(error = %e, "checking a push's series failed");
            convert::store_status(&e)
        })
    }

    /// Counts a refused snapshot under its rule and makes its result.
    pub(crate) fn rejection(&self, r: Rejection) -> v1::SnapshotResult {
        self.metrics.rejected(r.rule);
        v1::SnapshotResult {
            outcome: v1::PushOutcome::Rejected as i32,
            held_version: 0,
            reason: r.reason,
        }
    }

    /// The response: the store's `answers` put in the `results` slots of their snapshots
    /// (request order), counted in the metrics and the span, rejections logged.
    fn answer(
        &self,
        mut results: Vec<v1::SnapshotResult>,
        slots: Vec<(usize, u64)>,
        answers: Vec<Result<PutOutcome, Rejection>>,
        span: &tracing::Span,
    ) -> Result<v1::PushResponse, Status> {
        if answers.len() != slots.len() {
            return Err(Status::internal(format!(
                "the store answered {} outcomes for {} snapshots",
                answers.len(),
                slots.len()
            )));
        }
        let (mut n_stored, mut n_stale) = (0u64, 0u64);
        for ((slot, version), answer) in slots.into_iter().zip(answers) {
            results[slot] = match answer {
                Ok(PutOutcome::Stored) => {
                    n_stored += 1;
                    v1::SnapshotResult {
                        outcome: v1::PushOutcome::Stored as i32,
                        held_version: version,
                        reason: String::new(),
                    }
                }
                Ok(PutOutcome::Stale { held }) => {
                    n_stale += 1;
                    v1::SnapshotResult {
                        outcome: v1::PushOutcome::Stale as i32,
                        held_version: held,
                        reason: String::new(),
                    }
                }
                Err(r) => self.rejection(r),
            };
        }
        let rejected = results.len() as u64 - n_stored - n_stale;
        self.metrics.snapshots_stored.inc_by(n_stored);
        self.metrics.snapshots_stale.inc_by(n_stale);
        span.record("stored", n_stored);
        span.record("stale", n_stale);
        span.record("rejected", rejected);
        if rejected > 0 {
            let first = results
                .iter()
                .find(|r| r.outcome == v1::PushOutcome::Rejected as i32)
                .map(|r| r.reason.as_str())
                .unwrap_or_default();
            tracing::warn!(
                rejected,
                first_reason = first,
                "push had rejected snapshots"
            );
        } else {
            tracing::debug!("push stored");
        }
        Ok(v1::PushResponse { results })
    }
}

/// The span of one push, from an agent (`via` = `grpc`) or from the cluster's stream
/// (`stream`); the server and the outcome counts are recorded as they become known.
pub(crate) fn push_span(via: &'static str, snapshots: usize) -> tracing::Span {
    tracing::info_span!(
        "push",
        via,
        server = field::Empty,
        snapshots,
        stored = field::Empty,
        stale = field::Empty,
        rejected = field::Empty,
    )
}

#[cfg(test)]
/// The stream's apply path ([`Writer::apply`]): what an owner applying a message of the
/// stream stores, whenever it applies it.
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use hourglass_rpc::proto::v1;

    use super::*;
    use crate::store::MemoryStore;

    /// A distinct sketch of a few items.
    fn hll() -> Vec<u8> {
        let mut h = hourglass_sketch::hll::Hll::new(12).unwrap();
        for i in 0u32..50 {
            h.insert(&i.to_le_bytes());
        }
        h.encode()
    }

    /// A distinct snapshot of `visits` with `tags`, at `hour` and `version` (epoch 1).
    fn visits(tags: Vec<v1::Tag>, hour: u32, version: u64) -> v1::Snapshot {
        v1::Snapshot {
            series: Some(v1::Series {
                metric: "visits".into(),
                tags,
            }),
            hour,
            epoch: 1,
            version,
            sketch: Some(v1::EncodedSketch {
                kind: v1::SketchKind::Distinct as i32,
                data: hll().into(),
            }),
        }
    }

    /// A consumer of a subject grouping partitions keeps the snapshots of its partitions
    /// by [`snapshot_partition`]: it must be the partition the entry published the
    /// snapshot under (the checked series' `placement::partition`), whatever the order
    /// of its tags, and `None` for a snapshot the checks refuse.
    #[test]
    fn a_snapshots_partition_is_the_one_its_checked_series_is_published_under() {
        let limits = LimitsConfig::default();
        let hour = 500_000u32;
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..200u32 {
            // Unsorted tags: the stores and placement sort them.
            let tags = vec![
                v1::Tag {
                    key: "region".into(),
                    value: format!("r{}", i % 7),
                },
                v1::Tag {
                    key: "page".into(),
                    value: format!("p{i}"),
                },
            ];
            let mut snapshot = visits(tags, hour, 1);
            let told = snapshot_partition(&snapshot, 16);
            let checked = check_snapshot(0, &mut snapshot, &limits, &(hour..=hour))
                .unwrap_or_else(|r| panic!("{}", r.reason));
            let published = crate::placement::partition(&checked.name, 16);
            assert_eq!(told, Some(published), "snapshot {i}");
            seen.insert(published);
        }
        assert_eq!(seen.len(), 16, "200 series fall in every partition of 16");
        let no_series = v1::Snapshot {
            series: None,
            ..Default::default()
        };
        assert_eq!(snapshot_partition(&no_series, 16), None);
    }

    /// The entry checks a push's hours against the clock *when it is pushed* (from the first
    /// hour of the oldest day `retention.hourly` keeps, `accepted_from`), publishes it, and
    /// acknowledges it once ONE owner confirms it holds it (`peer::held`). Every other owner
    /// applies the very same message later — seconds later, or up to `cluster.max_age` (7 d)
    /// later after a restart, a backlog, or a partition moving to it — through the single
    /// aggregator's push path (`Writer::apply` → `check_snapshots` → `check_snapshot`),
    /// which checks the hour *again against its own now*. Once the oldest accepted day has
    /// moved on, that owner rejects the snapshot ("hour", counted and logged, the message
    /// acknowledged as applied): its store lacks a push the cluster acknowledged, while the
    /// owner that confirmed it rolled it into the day's rollup. The late owner is ready
    /// (nothing is missing by its positions) and answers that day without it, naming nothing
    /// missing. (The single aggregator's hour of margin in `accepted_from` covers a push
    /// checked and stored by one process; a stream replay is up to `max_age` late.) The
    /// series bound is already taken off the apply path for exactly this reason ("the
    /// entry decided the bound, for all owners alike"); the hour window is not.
    ///
    /// Here: a snapshot of the oldest hour the entry accepted one day ago (well within the
    /// default `max_age` of 7 days), applied by an owner now.
    #[tokio::test]
    async fn an_owner_applying_a_published_push_later_stores_what_the_entry_accepted() {
        let retention = Duration::from_secs(3 * 86_400);
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let owner = Writer::new(
            Arc::clone(&store),
            Arc::new(Metrics::new()),
            LimitsConfig::default(),
            retention,
        );
        let now = hourglass_rpc::time::since_unix_epoch().as_secs();
        let pushed_at = now - 86_400;
        let hour = crate::background::accepted_from(pushed_at, retention).0;
        // The premise: the entry accepted this hour when it was pushed, and it is outside the
        // hours accepted now.
        assert!(
            hour >= crate::background::accepted_from(pushed_at, retention).0
                && hour < crate::background::accepted_from(now, retention).0,
            "premise not reached: hour {hour} is still accepted now"
        );
        let push = v1::PushRequest {
            server: Some(v1::Server {
                name: "web-1".into(),
                labels: vec![],
            }),
            snapshots: vec![visits(vec![], hour, 3)],
            live_hours: vec![hour],
        };
        // What the apply loop does with the partition's message (apply.rs,
        // `apply_partitions`).
        let applied = owner.apply(push);
        assert!(
            applied.is_ok(),
            "the apply loop would retry or refuse: {applied:?}"
        );
        let held = held_versions(
            store.as_ref(),
            "web-1",
            &[HeldKey {
                name: SeriesName::new("visits", vec![], hourglass_sketch::Kind::Distinct),
                hour: Hour(hour),
                epoch: 1,
            }],
        )
        .unwrap();
        assert_eq!(
            held,
            vec![Some(3)],
            "an owner applying the stream one day after the push (within cluster.max_age) \
             rejected the snapshot the entry accepted and the cluster acknowledged (hour {hour}, \
             now outside the hours accepted); its message counts as applied, so this owner is \
             ready and answers without it"
        );
    }
}
