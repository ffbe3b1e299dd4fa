//! The `Collector` service: agents push cumulative snapshots (DESIGN §3).
//!
//! Each snapshot is checked on its own; one that breaks a rule is rejected with a reason
//! naming the field, and the rest of the batch is still stored. The store keeps, per
//! (series, hour, server, epoch), the highest version, so retries and duplicates only
//! come back as STALE. The reply is sent after the one `put_push` write returns, which
//! is after the WAL holds it.
//!
//! A server may hold at most `limits.max_series_per_server` series ([`super::ledger`]);
//! a snapshot of one more is rejected and its series is not created.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use hourglass_rpc::proto::v1::{self, collector_server::Collector};
use hourglass_rpc::series::Series;
use hourglass_sketch::Sketch;
use tonic::{Request, Response, Status};
use tracing::{Instrument, field};

use super::ledger::{Admission, Admit, SeriesLedger, Tentative};
use super::outcome_label;
use crate::config::LimitsConfig;
use crate::convert;
use crate::keys::{Day, Epoch, Hour, HourKey};
use crate::metrics::Metrics;
use crate::store::{PutOutcome, SeriesName, Store};

/// The `Collector` gRPC service.
pub(crate) struct CollectorService {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    limits: LimitsConfig,
    retention_hourly: std::time::Duration,
    ledger: Arc<SeriesLedger>,
    /// In cluster mode, checked pushes are published to the stream instead of stored
    /// here; the apply loop stores them (on their owners) through a service without one.
    cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Cluster mode's apply loop: the series bound was decided at the entry, so every
    /// owner of a partition stores the same snapshots.
    applying: bool,
}

impl CollectorService {
    /// A service writing to `store` within `limits`.
    pub fn new(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        limits: LimitsConfig,
        retention_hourly: std::time::Duration,
    ) -> Self {
        CollectorService {
            store,
            metrics,
            limits,
            retention_hourly,
            ledger: Arc::new(SeriesLedger::new()),
            cluster: None,
            applying: false,
        }
    }

    /// This service publishing to `cluster` instead of storing (cluster mode's entry);
    /// unchanged with `None`.
    pub(crate) fn publishing_to(mut self, cluster: Option<Arc<crate::cluster::Cluster>>) -> Self {
        if let Some(cluster) = cluster {
            self.ledger = Arc::clone(cluster.ledger());
            self.cluster = Some(cluster);
        }
        self
    }

    /// This service applying what `cluster`'s stream carries, with the series ledger the
    /// node's entry uses, so both count the same series.
    pub(crate) fn applying_for(mut self, cluster: &crate::cluster::Cluster) -> Self {
        self.ledger = Arc::clone(cluster.ledger());
        self.applying = true;
        self
    }

    /// The store this service writes to.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The metrics this service counts in.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
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
}

/// A snapshot that passed every check, ready for the store.
struct Valid {
    /// Its index in the push.
    index: usize,
    name: SeriesName,
    hour: Hour,
    epoch: u64,
    version: u64,
    sketch: hourglass_rpc::proto::Bytes,
}

/// A snapshot refused: the rule (a metric label) and the reason for the agent.
struct Rejection {
    rule: &'static str,
    reason: String,
}

fn reject(rule: &'static str, reason: String) -> Rejection {
    Rejection { rule, reason }
}

/// Checks one snapshot, taking its sketch bytes out of the request without copying.
fn check_snapshot(
    i: usize,
    snapshot: &mut v1::Snapshot,
    limits: &LimitsConfig,
    hours: &std::ops::RangeInclusive<u32>,
) -> Result<Valid, Rejection> {
    // An hour ahead of the clock (beyond the next) is a broken agent clock; one older
    // than hourly retention would be deleted at once, and would revive a deleted hour.
    if !hours.contains(&snapshot.hour) {
        return Err(reject(
            "hour",
            format!(
                "snapshots[{i}].hour {} ({}) is outside the hours accepted now, {} to {} (from the start of the day retention.hourly back, to one hour ahead)",
                snapshot.hour,
                hourglass_rpc::time::format_hour(snapshot.hour.min(u32::MAX / 2)),
                hourglass_rpc::time::format_hour(*hours.start()),
                hourglass_rpc::time::format_hour(*hours.end()),
            ),
        ));
    }
    let series = snapshot
        .series
        .as_ref()
        .ok_or_else(|| reject("series", format!("snapshots[{i}].series is missing")))?;
    let series = Series::try_from(series)
        .map_err(|e| reject("series", format!("snapshots[{i}].series: {e}")))?;
    if snapshot.version == 0 {
        return Err(reject(
            "version",
            format!("snapshots[{i}].version is 0: versions start at 1"),
        ));
    }
    let sketch = snapshot
        .sketch
        .as_mut()
        .ok_or_else(|| reject("sketch", format!("snapshots[{i}].sketch is missing")))?;
    let kind = convert::kind(sketch.kind, &format!("snapshots[{i}].sketch.kind"))
        .map_err(|reason| reject("sketch.kind", reason))?;
    let (max_sketch_bytes, setting) = limits.max_sketch_bytes(kind);
    if sketch.data.len() > max_sketch_bytes {
        return Err(reject(
            "sketch.size",
            format!(
                "snapshots[{i}].sketch.data is {} bytes, more than the limit of {max_sketch_bytes} for a {kind} sketch ({setting})",
                sketch.data.len()
            ),
        ));
    }
    // Every check of a full decode, not only the frame check the store does: a sketch
    // that cannot be merged later would make every query over its hour fail.
    let decoded = Sketch::validate(&sketch.data).map_err(|e| {
        reject(
            "sketch.data",
            format!("snapshots[{i}].sketch.data does not decode: {e}"),
        )
    })?;
    if decoded != kind {
        return Err(reject(
            "sketch.kind",
            format!(
                "snapshots[{i}].sketch.kind is {kind} but sketch.data holds a {} sketch",
                decoded
            ),
        ));
    }
    Ok(Valid {
        index: i,
        name: SeriesName::new(series.metric(), series.tags().to_vec(), kind),
        hour: Hour(snapshot.hour),
        epoch: snapshot.epoch,
        version: snapshot.version,
        sketch: std::mem::take(&mut sketch.data),
    })
}

/// Everything the blocking part of a push needs besides the snapshots.
struct PushTarget {
    server: String,
    labels: Vec<(String, String)>,
    live_hours: Vec<Hour>,
    /// The oldest day hourly retention keeps: series last seen before it stop counting.
    oldest_day: Day,
    /// `limits.max_series_per_server`.
    max_series: usize,
    /// Cluster mode: the labels of a server already known are left alone; only the live
    /// subject, applied in the stream's order on every node, sets them, so every node
    /// ends with the latest push's labels whatever order its consumers run in.
    keep_labels: bool,
}

/// What the checks of a whole push found ([`CollectorService::checked_request`]).
struct CheckedPush {
    server: v1::Server,
    /// Its labels, sorted.
    labels: Vec<(String, String)>,
    /// The hours a push may carry now.
    accepted_hours: std::ops::RangeInclusive<u32>,
    /// The hours its snapshots are checked against (any, from the stream).
    checked_hours: std::ops::RangeInclusive<u32>,
    /// Its live hours that count.
    live: Vec<Hour>,
}

/// The server's id, registering it (or, unless `keep_labels`, updating its labels).
fn server_of(
    store: &dyn Store,
    target: &PushTarget,
) -> Result<crate::keys::ServerId, crate::store::StoreError> {
    if target.keep_labels
        && let Some(id) = store.server_id(&target.server)?
    {
        return Ok(id);
    }
    store.register_server(&target.server, &target.labels)
}

/// The series bound's decision for each of `valid`, in order: the series' id, or how
/// many series the server holds when this one would be one too many. A refused series is
/// not created in the dictionary.
///
/// With `commit` false (cluster mode's entry) the ledger is only read: the series this
/// push would add are counted for the push alone, and the apply loop, which shares the
/// ledger, counts what the stream actually carries, in the stream's order.
fn admit(
    store: &dyn Store,
    ledger: &SeriesLedger,
    server_id: crate::keys::ServerId,
    target: &PushTarget,
    valid: &[Valid],
    commit: bool,
) -> Result<Vec<Result<crate::keys::SeriesId, usize>>, crate::store::StoreError> {
    ledger.with_server(store, server_id, target.oldest_day, |held| {
        if commit {
            decide(store, held, target, valid)
        } else {
            decide(store, &mut Tentative::new(held), target, valid)
        }
    })
}

/// [`admit`]'s decisions, recorded in `held`.
fn decide(
    store: &dyn Store,
    held: &mut impl Admit,
    target: &PushTarget,
    valid: &[Valid],
) -> Result<Vec<Result<crate::keys::SeriesId, usize>>, crate::store::StoreError> {
    let (oldest, limit) = (target.oldest_day, target.max_series);
    // Batches carry many hours of few series: look each series up once.
    let mut ids: HashMap<&SeriesName, Result<crate::keys::SeriesId, usize>> = HashMap::new();
    let mut decisions = Vec::with_capacity(valid.len());
    for v in valid {
        let day = v.hour.day();
        let decided = match ids.get(&v.name) {
            Some(Ok(id)) => {
                held.admit(*id, day, oldest, limit);
                Ok(*id)
            }
            Some(Err(full)) => Err(*full),
            None => {
                let decided = match store.series_id(&v.name)? {
                    Some(id) => match held.admit(id, day, oldest, limit) {
                        Admission::Held | Admission::New => Ok(id),
                        Admission::Full { held } => Err(held),
                    },
                    None if held.is_full(oldest, limit) => Err(held.len()),
                    None => {
                        let id = store.series_id_or_create(&v.name)?;
                        held.admit(id, day, oldest, limit);
                        Ok(id)
                    }
                };
                ids.insert(&v.name, decided);
                decided
            }
        };
        decisions.push(decided);
    }
    Ok(decisions)
}

/// The rejection of `v` by the series bound, the server holding `count` series.
fn over_series_bound(target: &PushTarget, v: &Valid, count: usize) -> Rejection {
    reject(
        "series_per_server",
        format!(
            "snapshots[{}]: server {:?} holds {count} series with data within retention.hourly and the limit is {} (limits.max_series_per_server); series {} would be one more",
            v.index, target.server, target.max_series, v.name
        ),
    )
}

/// Stores the valid snapshots of one push, with the server's live hours, in one write.
/// Returns, per snapshot of `valid` in order, what the store did or why the series bound
/// refused it.
fn store_push(
    store: &dyn Store,
    ledger: &SeriesLedger,
    target: &PushTarget,
    valid: Vec<Valid>,
) -> Result<Vec<Result<PutOutcome, Rejection>>, crate::store::StoreError> {
    let server_id = server_of(store, target)?;
    let decisions = admit(store, ledger, server_id, target, &valid, true)?;
    let mut answers: Vec<Option<Result<PutOutcome, Rejection>>> = Vec::with_capacity(valid.len());
    let mut batch = Vec::with_capacity(valid.len());
    for (v, decision) in valid.into_iter().zip(decisions) {
        match decision {
            Ok(id) => {
                let key = HourKey {
                    series: id,
                    hour: v.hour,
                    server: server_id,
                    epoch: Epoch(v.epoch),
                };
                batch.push((key, v.version, v.sketch));
                answers.push(None);
            }
            Err(count) => answers.push(Some(Err(over_series_bound(target, &v, count)))),
        }
    }
    let live = (!target.live_hours.is_empty()).then_some((server_id, &target.live_hours[..]));
    let mut outcomes = store.put_push(live, &batch)?.into_iter();
    answers
        .into_iter()
        .map(|answer| match answer {
            Some(rejected) => Ok(rejected),
            None => outcomes.next().map(Ok).ok_or_else(|| {
                crate::store::StoreError::Engine(
                    "the store answered fewer outcomes than snapshots".into(),
                )
            }),
        })
        .collect()
}

/// One snapshot's place: what a held version is looked up by.
#[derive(Debug, Clone)]
pub(crate) struct HeldKey {
    /// Its series.
    pub(crate) name: SeriesName,
    /// Its hour.
    pub(crate) hour: Hour,
    /// Its epoch.
    pub(crate) epoch: u64,
}

/// The version this store holds for each of `sent` (pushed by `server`), or `None`.
pub(crate) fn held_versions(
    store: &dyn Store,
    server: &str,
    sent: &[HeldKey],
) -> Result<Vec<Option<u64>>, crate::store::StoreError> {
    let Some(server_id) = store.server_id(server)? else {
        return Ok(vec![None; sent.len()]);
    };
    let mut out = Vec::with_capacity(sent.len());
    for v in sent {
        let mut held = None;
        if let Some(series) = store.series_id(&v.name)? {
            store.scan_hourly(series, v.hour..v.hour.next(), &mut |key, stored| {
                if key.server == server_id && key.epoch == Epoch(v.epoch) {
                    held = Some(stored.version);
                    return false;
                }
                true
            })?;
        }
        out.push(held);
    }
    Ok(out)
}

/// Cluster mode's half of [`store_push`]: registers the server and applies the series
/// bound in this node's store and ledger (the apply loop shares the ledger), storing
/// nothing. Returns, per snapshot of `valid` in order, `None` to publish it or why the
/// bound refuses it.
fn admit_push(
    store: &dyn Store,
    ledger: &SeriesLedger,
    target: &PushTarget,
    valid: &[Valid],
) -> Result<Vec<Option<Rejection>>, crate::store::StoreError> {
    let server_id = server_of(store, target)?;
    let decisions = admit(store, ledger, server_id, target, valid, false)?;
    Ok(valid
        .iter()
        .zip(decisions)
        .map(|(v, decision)| {
            decision
                .err()
                .map(|count| over_series_bound(target, v, count))
        })
        .collect())
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
        self.metrics
            .pushes
            .get_or_create(&crate::metrics::OutcomeLabel { outcome })
            .inc();
        self.metrics
            .push_seconds
            .observe(started.elapsed().as_secs_f64());
        result.map(Response::new)
    }
}

impl CollectorService {
    /// The hours a push may carry now: from the first hour of the oldest day hourly
    /// retention keeps (whole days, as retention deletes them), so no snapshot lands in a
    /// day whose hours are gone, to one hour ahead of the clock.
    fn accepted_hours(&self) -> std::ops::RangeInclusive<u32> {
        let now = hourglass_rpc::time::since_unix_epoch().as_secs();
        let now_hour = u32::try_from(now / 3600).unwrap_or(u32::MAX);
        let oldest = crate::background::accepted_from(now, self.retention_hourly);
        oldest.0..=now_hour.saturating_add(1)
    }

    /// The hours this service checks snapshots and live hours against: those accepted
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

    /// Counts a refused snapshot under its rule and makes its result.
    fn rejection(&self, r: Rejection) -> v1::SnapshotResult {
        self.metrics.rejected(r.rule);
        v1::SnapshotResult {
            outcome: v1::PushOutcome::Rejected as i32,
            held_version: 0,
            reason: r.reason,
        }
    }

    async fn push_inner(
        &self,
        mut request: v1::PushRequest,
        principal: Option<crate::auth::Principal>,
        span: &tracing::Span,
    ) -> Result<v1::PushResponse, Status> {
        let checked = self.checked_request(&mut request, principal.as_ref(), false, span)?;
        if let Some(cluster) = &self.cluster {
            return self.publish(cluster, checked, request.snapshots).await;
        }
        let (results, valid, slots) = self.check_snapshots(&mut request.snapshots, &checked);
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
    fn checked_request(
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

    /// Cluster mode: checks each snapshot as [`Self::push_inner`] does, publishes those
    /// that pass (by partition) with the server and its live hours, and answers STORED
    /// for each once JetStream acknowledged every publish. The series bound refuses here
    /// as on a single aggregator, from this node's store (which holds what the stream
    /// carried) and ledger; every node's apply loop applies it again.
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
            .admit_series(server, labels, valid, accepted_hours)
            .await?;
        let partitions = cluster.config().partitions;
        let mut outgoing = Vec::with_capacity(valid.len());
        let mut sent = Vec::with_capacity(valid.len());
        for ((v, refusal), snapshot) in valid.into_iter().zip(refusals).zip(originals) {
            match refusal {
                Some(r) => results[v.index] = self.rejection(r),
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
        self.metrics.cluster_published(&stats, published);
        self.answer_from_owners(cluster, &server.name, &stats.sequences, sent, &mut results)
            .await?;
        Ok(v1::PushResponse { results })
    }

    /// Checks each snapshot as [`Self::push_inner`] does, and that it fits one message of
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
            let checked = check_snapshot(i, &mut checked, &self.limits, accepted_hours)
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
                Err(r) => results.push(self.rejection(r)),
            }
        }
        (results, valid, originals)
    }

    /// The series bound, as a single aggregator applies it, in this node's store: per
    /// snapshot of `valid`, `None` to publish it or why it is refused.
    async fn admit_series(
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

    /// The status of a push whose publishing failed: nothing of it is acknowledged.
    fn publish_failed(&self, e: crate::cluster::PublishError) -> Status {
        self.metrics.cluster_publish_failures.inc();
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
        let held = crate::cluster::held(cluster, &self.store, server, keys, sequences);
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
fn push_span(via: &'static str, snapshots: usize) -> tracing::Span {
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

/// Checks the pushing server: the principal may push as it, and its name keeps the naming
/// rule (the agent checks the same rule at start, so an agent never runs with a name
/// every push of which would be refused here).
fn checked_server(
    server: &v1::Server,
    principal: Option<&crate::auth::Principal>,
) -> Result<(), Status> {
    if let Some(principal) = principal {
        principal.may_push_as(&server.name)?;
    }
    hourglass_rpc::series::validate_server_name(&server.name)
        .map_err(|e| Status::invalid_argument(format!("server.name: {e}")))?;
    Ok(())
}

/// The server's labels, sorted; an error if a label key repeats.
pub(crate) fn checked_labels(server: &v1::Server) -> Result<Vec<(String, String)>, Status> {
    let mut labels = convert::pairs(&server.labels, "server.labels")?;
    labels.sort();
    if let Some(w) = labels.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Status::invalid_argument(format!(
            "server.labels: label {:?} appears more than once",
            w[0].0
        )));
    }
    Ok(labels)
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod apply_tests;
