//! The `Query` service: each RPC converts its selector, asks the [`Planner`] for the
//! merged sketch (on a blocking thread: it reads RocksDB and merges), and turns the
//! merged sketch into the answer of its question. `Membership` merges nothing: it asks
//! for each stored filter's answer for the item and combines them (`planner::lookup`).
//!
//! A selection that matches series and servers but holds no sketches in its range
//! answers zeros with its coverage, since "no events" is an answer; only a metric,
//! kind, tag or server selection that matches nothing is NOT_FOUND.

use std::sync::Arc;
use std::time::Instant;

use hourglass_rpc::proto::code_label as outcome_label;
use hourglass_rpc::proto::v1::{self, query_server::Query};
use hourglass_rpc::time::hours_text;
use hourglass_sketch::Kind;
use hourglass_sketch::Sketch;
use hourglass_sketch::distinct::{Distinct, DistinctForm};
use hourglass_sketch::frequent::MAX_CAPACITY;
use hourglass_sketch::hash::item_hash;
use tonic::{Request, Response, Status};
use tracing::{Instrument, field};

use crate::config::LimitsConfig;
use crate::convert;
use crate::metrics::Metrics;
use crate::planner::{Answer, Merged, Planner, QueryError, Selector};
use crate::store::Store;

/// The `Query` gRPC service.
#[derive(Clone)]
pub(crate) struct QueryService {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    limits: LimitsConfig,
    retire_after: std::time::Duration,
    /// Cluster mode: answers merge the partials of every partition's owners.
    cluster: Option<Arc<crate::cluster::Cluster>>,
}

impl QueryService {
    /// A service answering from `store` within `limits`.
    pub fn new(store: Arc<dyn Store>, metrics: Arc<Metrics>, limits: LimitsConfig) -> Self {
        QueryService {
            store,
            metrics,
            limits,
            retire_after: crate::config::CoverageConfig::default().retire_after,
            cluster: None,
        }
    }

    /// This service answering over `cluster`'s nodes (cluster mode); unchanged with `None`.
    pub(crate) fn in_cluster(mut self, cluster: Option<Arc<crate::cluster::Cluster>>) -> Self {
        self.cluster = cluster;
        self
    }

    /// Servers silent for longer than `after` stop counting as missing (see
    /// [`Planner::retire_after`]).
    pub fn retire_after(mut self, after: std::time::Duration) -> Self {
        self.retire_after = after;
        self
    }

    /// Runs `work` as one counted, timed, traced query.
    async fn measured<T, F>(
        &self,
        method: &'static str,
        metadata: &tonic::metadata::MetadataMap,
        work: F,
    ) -> Result<Response<T>, Status>
    where
        F: Future<Output = Result<T, Status>>,
    {
        let started = Instant::now();
        let span = tracing::info_span!(
            "query",
            method,
            metric = field::Empty,
            kind = field::Empty,
            hourly_rows = field::Empty,
            rollups = field::Empty,
            sketches_merged = field::Empty,
        );
        // The caller's trace, when it sent one: `hourglass query` and other traced clients.
        hourglass_rpc::process::adopt_remote_parent(&span, metadata);
        let result = work.instrument(span.clone()).await;
        let outcome = match &result {
            Ok(_) => {
                span.in_scope(|| tracing::debug!(elapsed = ?started.elapsed(), "query answered"));
                "ok"
            }
            Err(status) => {
                span.in_scope(
                    || tracing::info!(code = ?status.code(), "query refused: {}", status.message()),
                );
                outcome_label(status.code())
            }
        };
        self.metrics
            .query_done(method, outcome, started.elapsed().as_secs_f64());
        result.map(Response::new)
    }

    /// In cluster mode, waits until this node's series index and servers hold every push
    /// acknowledged before the question ([`crate::cluster::index_caught_up`]).
    async fn index_caught_up(&self) -> Result<(), Status> {
        match &self.cluster {
            Some(cluster) => crate::cluster::index_caught_up(cluster).await,
            None => Ok(()),
        }
    }

    /// Converts the selector and asks the planner, off the async threads.
    async fn plan(&self, selector: Option<&v1::Selector>, kind: Kind) -> Result<Answer, Status> {
        self.plan_with(selector, kind, None).await
    }

    /// [`QueryService::plan`], or with `item` a membership lookup: each stored filter's
    /// answer for the item instead of a merge ([`Planner::look_up`]).
    async fn plan_with(
        &self,
        selector: Option<&v1::Selector>,
        kind: Kind,
        item: Option<Vec<u8>>,
    ) -> Result<Answer, Status> {
        let proto = selector;
        let selector: Selector = convert::selector(selector, kind, self.limits.max_query_hours())
            .inspect_err(|status| {
            if status
                .message()
                .ends_with(&format!("({})", convert::RANGE_BOUND))
            {
                self.metrics.query_refused(convert::RANGE_BOUND);
            }
        })?;
        let span = tracing::Span::current();
        span.record("metric", selector.metric.as_str());
        span.record("kind", kind.to_string());
        let store = Arc::clone(&self.store);
        let fanout = self.limits.max_query_fanout;
        let retire_hours = u32::try_from(self.retire_after.as_secs() / 3600).unwrap_or(u32::MAX);
        if let (Some(cluster), Some(proto)) = (&self.cluster, proto) {
            let asked = crate::cluster::Asked {
                selector,
                proto: proto.clone(),
                kind,
                max_fanout: fanout,
                retire_hours,
                item,
            };
            let answer = crate::cluster::fan_out(cluster, &store, asked)
                .await
                .inspect_err(|status| {
                    if status.message().contains("limits.max_query_fanout") {
                        self.metrics.query_refused("limits.max_query_fanout");
                    }
                })?;
            self.metrics
                .cluster_partitions_missing
                .inc_by(answer.total.coverage.missing_partitions.len() as u64);
            span.record("sketches_merged", answer.total.coverage.sketches_merged);
            return Ok(answer);
        }
        let answer = tokio::task::spawn_blocking(move || {
            let planner = Planner::new(store.as_ref())
                .limit_fanout(fanout)
                .retire_after(retire_hours);
            match item {
                Some(item) => planner.look_up(item_hash(&item)).answer(&selector),
                None => planner.answer(&selector),
            }
        })
        .await
        .map_err(|e| Status::internal(format!("query task failed: {e}")))?
        .map_err(|e| {
            if let QueryError::FanOut { .. } = e {
                self.metrics.query_refused("limits.max_query_fanout");
            }
            convert::query_status(&e)
        })?;
        span.record("hourly_rows", answer.plan.hourly_rows);
        span.record("rollups", answer.plan.rollups);
        span.record("sketches_merged", answer.total.coverage.sketches_merged);
        Ok(answer)
    }

    /// Runs a blocking store read off the async threads.
    async fn read<T: Send + 'static>(
        &self,
        work: impl FnOnce(&dyn Store) -> Result<T, crate::store::StoreError> + Send + 'static,
    ) -> Result<T, Status> {
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || work(store.as_ref()))
            .await
            .map_err(|e| Status::internal(format!("store task failed: {e}")))?
            .map_err(|e| convert::store_status(&e))
    }
}

/// The answer and coverage of every group, converted by `f`.
fn groups<G>(answer: &Answer, f: impl Fn(&str, &Merged) -> G) -> Vec<G> {
    answer.groups.iter().map(|(key, m)| f(key, m)).collect()
}

/// The most items one `MembershipBatch` looks up.
const MAX_BATCH_ITEMS: usize = 1000;
/// The lookups of one `MembershipBatch` under way at once: each waits on reads (and in
/// cluster mode on the read barrier and the owners' answers), not on this node's CPU alone.
const BATCH_LOOKUPS_AT_ONCE: usize = 8;

/// Checks the number of items of a `MembershipBatch`.
fn check_batch(items: usize) -> Result<(), Status> {
    match items {
        0 => Err(Status::invalid_argument(format!(
            "items is empty: a membership batch looks up 1 to {MAX_BATCH_ITEMS} items"
        ))),
        n if n > MAX_BATCH_ITEMS => Err(Status::invalid_argument(format!(
            "{n} items: a membership batch looks up at most {MAX_BATCH_ITEMS} (send several batches)"
        ))),
        _ => Ok(()),
    }
}

/// Checks `k` against the merged sketch's frequent-items capacity.
fn check_k(k: u32, sketch: Option<&Sketch>) -> Result<usize, Status> {
    if k == 0 {
        return Err(Status::invalid_argument("k must be at least 1"));
    }
    let capacity = match sketch {
        Some(Sketch::Frequency(f)) => f.frequent_items().capacity(),
        _ => MAX_CAPACITY,
    };
    if k > capacity {
        return Err(Status::invalid_argument(format!(
            "k {k} is more than the sketches' frequent-items capacity of {capacity}"
        )));
    }
    Ok(k as usize)
}

#[tonic::async_trait]
impl Query for QueryService {
    async fn distinct(
        &self,
        request: Request<v1::DistinctRequest>,
    ) -> Result<Response<v1::DistinctResponse>, Status> {
        let metadata = request.metadata().clone();
        let request = request.into_inner();
        self.measured("distinct", &metadata, async {
            let a = self.plan(request.selector.as_ref(), Kind::Distinct).await?;
            Ok(v1::DistinctResponse {
                answer: Some(convert::distinct(a.total.sketch.as_ref())),
                coverage: Some(convert::coverage(&a.total.coverage)),
                groups: groups(&a, |key, m| v1::DistinctGroup {
                    key: key.to_string(),
                    answer: Some(convert::distinct(m.sketch.as_ref())),
                    coverage: Some(convert::coverage(&m.coverage)),
                }),
            })
        })
        .await
    }

    async fn frequency(
        &self,
        request: Request<v1::FrequencyRequest>,
    ) -> Result<Response<v1::FrequencyResponse>, Status> {
        let metadata = request.metadata().clone();
        let request = request.into_inner();
        self.measured("frequency", &metadata, async {
            let a = self
                .plan(request.selector.as_ref(), Kind::Frequency)
                .await?;
            let item = request.item.as_slice();
            Ok(v1::FrequencyResponse {
                answer: Some(convert::frequency(a.total.sketch.as_ref(), item)),
                coverage: Some(convert::coverage(&a.total.coverage)),
                groups: groups(&a, |key, m| v1::FrequencyGroup {
                    key: key.to_string(),
                    answer: Some(convert::frequency(m.sketch.as_ref(), item)),
                    coverage: Some(convert::coverage(&m.coverage)),
                }),
            })
        })
        .await
    }

    async fn top_k(
        &self,
        request: Request<v1::TopKRequest>,
    ) -> Result<Response<v1::TopKResponse>, Status> {
        let metadata = request.metadata().clone();
        let request = request.into_inner();
        self.measured("topk", &metadata, async {
            // Checked before reading anything, then again against the merged capacity.
            check_k(request.k, None)?;
            let a = self
                .plan(request.selector.as_ref(), Kind::Frequency)
                .await?;
            let k = check_k(request.k, a.total.sketch.as_ref())?;
            Ok(v1::TopKResponse {
                items: convert::top_k(a.total.sketch.as_ref(), k),
                coverage: Some(convert::coverage(&a.total.coverage)),
                groups: groups(&a, |key, m| v1::TopKGroup {
                    key: key.to_string(),
                    items: convert::top_k(m.sketch.as_ref(), k),
                    coverage: Some(convert::coverage(&m.coverage)),
                }),
            })
        })
        .await
    }

    async fn membership(
        &self,
        request: Request<v1::MembershipRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let metadata = request.metadata().clone();
        let request = request.into_inner();
        self.measured("membership", &metadata, async {
            self.look_up(request.selector.as_ref(), request.item).await
        })
        .await
    }

    async fn membership_batch(
        &self,
        request: Request<v1::MembershipBatchRequest>,
    ) -> Result<Response<v1::MembershipBatchResponse>, Status> {
        let metadata = request.metadata().clone();
        let request = request.into_inner();
        self.measured("membership_batch", &metadata, async {
            check_batch(request.items.len())?;
            let answers = self.look_up_all(request.selector, request.items).await?;
            Ok(v1::MembershipBatchResponse { answers })
        })
        .await
    }

    async fn list_series(
        &self,
        request: Request<v1::ListSeriesRequest>,
    ) -> Result<Response<v1::ListSeriesResponse>, Status> {
        let metadata = request.metadata().clone();
        let metric = request.into_inner().metric;
        self.measured("list_series", &metadata, async {
            self.index_caught_up().await?;
            let mut names: Vec<_> = self
                .read(|store| store.list_series())
                .await?
                .into_iter()
                .map(|(_, name)| name)
                .filter(|name| metric.is_empty() || name.metric == metric)
                .collect();
            names.sort();
            Ok(v1::ListSeriesResponse {
                series: names
                    .into_iter()
                    .map(|name| v1::SeriesInfo {
                        series: Some(v1::Series::from(&name)),
                        kind: v1::SketchKind::from(name.kind) as i32,
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn list_servers(
        &self,
        request: Request<v1::ListServersRequest>,
    ) -> Result<Response<v1::ListServersResponse>, Status> {
        self.measured("list_servers", request.metadata(), async {
            self.index_caught_up().await?;
            let mut servers = self.read(|store| store.list_servers()).await?;
            servers.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(v1::ListServersResponse {
                servers: servers
                    .into_iter()
                    .map(|s| v1::ServerInfo {
                        name: s.name,
                        labels: s
                            .labels
                            .into_iter()
                            .map(|(key, value)| v1::Tag { key, value })
                            .collect(),
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn export(
        &self,
        request: Request<v1::ExportRequest>,
    ) -> Result<Response<v1::ExportResponse>, Status> {
        let metadata = request.metadata().clone();
        let request = request.into_inner();
        self.measured("export", &metadata, async {
            let kind = convert::kind(request.kind, "kind").map_err(Status::invalid_argument)?;
            if request
                .selector
                .as_ref()
                .is_some_and(|s| s.group_by != v1::GroupBy::None as i32)
            {
                return Err(Status::invalid_argument(
                    "selector.group_by must be GROUP_BY_NONE for Export: it returns one sketch",
                ));
            }
            let a = self.plan(request.selector.as_ref(), kind).await?;
            // No sketch in the range: no sketch in the reply, and the coverage says why.
            Ok(v1::ExportResponse {
                sketch: a.total.sketch.as_ref().map(|s| v1::EncodedSketch {
                    kind: v1::SketchKind::from(s.kind()) as i32,
                    data: s.encode().into(),
                }),
                coverage: Some(convert::coverage(&a.total.coverage)),
            })
        })
        .await
    }

    async fn overlap(
        &self,
        request: Request<v1::OverlapRequest>,
    ) -> Result<Response<v1::OverlapResponse>, Status> {
        let metadata = request.metadata().clone();
        let request = request.into_inner();
        self.measured("overlap", &metadata, async {
            let (a, coverage_a) = self.one_set(request.a.as_ref(), "a").await?;
            let (b, coverage_b) = self.one_set(request.b.as_ref(), "b").await?;
            let answer = off_the_async_threads(move || convert::overlap(&a, &b)).await??;
            Ok(v1::OverlapResponse {
                answer: Some(answer),
                coverage_a: Some(coverage_a),
                coverage_b: Some(coverage_b),
            })
        })
        .await
    }

    async fn retention(
        &self,
        request: Request<v1::RetentionRequest>,
    ) -> Result<Response<v1::RetentionResponse>, Status> {
        let metadata = request.metadata().clone();
        let request = request.into_inner();
        self.measured("retention", &metadata, async {
            // The whole selection is checked as Distinct checks one (the range bound too),
            // then asked period by period.
            convert::selector(
                request.selector.as_ref(),
                Kind::Distinct,
                self.limits.max_query_hours(),
            )?;
            let periods = retention_periods(request.selector.as_ref(), request.period_hours)?;
            let mut sets = Vec::with_capacity(periods.len());
            let mut answer = v1::RetentionResponse::default();
            for hours in periods {
                let mut selector = request.selector.clone().unwrap_or_default();
                selector.range = Some(v1::TimeRange {
                    start_hour: hours.start,
                    end_hour: hours.end,
                });
                let (set, coverage) = self.one_set(Some(&selector), "selector").await?;
                answer.periods.push(v1::RetentionPeriod {
                    start_hour: hours.start,
                    end_hour: hours.end,
                    distinct: Some(convert::distinct_of(&set.estimate())),
                    coverage: Some(coverage),
                });
                // The joint estimator is HyperLogLog's: an UltraLogLog converts exactly.
                sets.push(set.into_hll());
            }
            answer.rows = off_the_async_threads(move || convert::retention_rows(&sets)).await??;
            Ok(answer)
        })
        .await
    }
}

/// The most periods a retention table has: a year of weeks. Its cost grows with the
/// square of the periods (every pair is estimated).
pub(crate) const MAX_RETENTION_PERIODS: u32 = 53;

/// The periods of a retention table over `selector`'s range: `period_hours` long from its
/// start, the last one possibly shorter.
fn retention_periods(
    selector: Option<&v1::Selector>,
    period_hours: u32,
) -> Result<Vec<std::ops::Range<u32>>, Status> {
    let range = selector
        .and_then(|s| s.range)
        .ok_or_else(|| Status::invalid_argument("selector.range is required"))?;
    if range.start_hour >= range.end_hour {
        return Err(Status::invalid_argument(format!(
            "selector.range: end_hour {} must be greater than start_hour {}",
            range.end_hour, range.start_hour
        )));
    }
    if period_hours == 0 {
        return Err(Status::invalid_argument(
            "period_hours must be at least 1 (24 for days, 168 for weeks)",
        ));
    }
    let span = range.end_hour - range.start_hour;
    let count = span.div_ceil(period_hours);
    if count < 2 {
        return Err(Status::invalid_argument(format!(
            "the range of {} holds one period of {}: a retention table needs at least two",
            hours_text(span),
            hours_text(period_hours)
        )));
    }
    if count > MAX_RETENTION_PERIODS {
        return Err(Status::invalid_argument(format!(
            "the range of {} holds {count} periods of {}, more than {MAX_RETENTION_PERIODS}: ask for longer periods or a shorter range",
            hours_text(span),
            hours_text(period_hours)
        )));
    }
    Ok((0..count)
        .map(|i| {
            // At most 53 periods, each starting before end_hour: neither sum overflows
            // but the last end, which saturates into end_hour.
            let start = range.start_hour + i * period_hours;
            start..start.saturating_add(period_hours).min(range.end_hour)
        })
        .collect())
}

/// Runs the CPU-bound `work` (estimating pairs of sketches) off the async threads.
async fn off_the_async_threads<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Status::internal(format!("estimate task failed: {e}")))
}

impl QueryService {
    /// What `Membership` answers for each of `items` over `selector`, in order, at most
    /// [`BATCH_LOOKUPS_AT_ONCE`] under way at a time; the first refusal refuses them all.
    async fn look_up_all(
        &self,
        selector: Option<v1::Selector>,
        items: Vec<Vec<u8>>,
    ) -> Result<Vec<v1::MembershipResponse>, Status> {
        let mut answers = vec![None; items.len()];
        let mut items = items.into_iter().enumerate();
        let mut running = tokio::task::JoinSet::new();
        loop {
            while running.len() < BATCH_LOOKUPS_AT_ONCE {
                let Some((i, item)) = items.next() else { break };
                let (service, selector) = (self.clone(), selector.clone());
                let lookup = async move { (i, service.look_up(selector.as_ref(), item).await) };
                running.spawn(lookup.in_current_span());
            }
            let Some(done) = running.join_next().await else {
                break;
            };
            let (i, answer) =
                done.map_err(|e| Status::internal(format!("a lookup of the batch failed: {e}")))?;
            answers[i] = Some(answer?);
        }
        // Every item was looked up: the loop ends only when none is left or running.
        Ok(answers.into_iter().flatten().collect())
    }

    /// What `Membership` answers for `item` over `selector`.
    async fn look_up(
        &self,
        selector: Option<&v1::Selector>,
        item: Vec<u8>,
    ) -> Result<v1::MembershipResponse, Status> {
        let a = self
            .plan_with(selector, Kind::Membership, Some(item))
            .await?;
        // Combining reads the bits of the filters that say "maybe": off the async threads,
        // like the lookups.
        off_the_async_threads(move || {
            Ok::<_, Status>(v1::MembershipResponse {
                answer: Some(convert::membership(&a.total.filters)?),
                coverage: Some(convert::coverage(&a.total.coverage)),
                groups: a
                    .groups
                    .iter()
                    .map(|(key, m)| {
                        Ok(v1::MembershipGroup {
                            key: key.to_string(),
                            answer: Some(convert::membership(&m.filters)?),
                            coverage: Some(convert::coverage(&m.coverage)),
                        })
                    })
                    .collect::<Result<_, Status>>()?,
            })
        })
        .await?
    }

    /// The merged distinct sketch of one selection of a set question, in the form the
    /// merge gave (an empty one when nothing was merged), and its coverage; errors name
    /// the selection `name`.
    async fn one_set(
        &self,
        selector: Option<&v1::Selector>,
        name: &str,
    ) -> Result<(Distinct, v1::Coverage), Status> {
        if selector.is_some_and(|s| s.group_by != v1::GroupBy::None as i32) {
            return Err(Status::invalid_argument(format!(
                "{name}.group_by must be GROUP_BY_NONE: a set question compares whole selections"
            )));
        }
        let a = self
            .plan(selector, Kind::Distinct)
            .await
            .map_err(|status| named(status, name))?;
        let set = match a.total.sketch {
            Some(Sketch::Distinct(distinct)) => distinct,
            // Nothing merged: the empty set, as the sketch that leaves any other unchanged
            // by a merge: the largest precision, and UltraLogLog (a HyperLogLog would
            // turn an UltraLogLog into one).
            _ => Distinct::new(DistinctForm::Ull, hourglass_sketch::hll::MAX_PRECISION)
                .expect("the largest precision is valid"),
        };
        Ok((set, convert::coverage(&a.total.coverage)))
    }
}

/// `status` with its message about `selector` said of the selection `name` instead.
fn named(status: Status, name: &str) -> Status {
    if name == "selector" {
        return status;
    }
    let message = match status.message().strip_prefix("selector") {
        Some(rest) => format!("{name}{rest}"),
        None => format!("{name}: {}", status.message()),
    };
    Status::new(status.code(), message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Epoch, Hour, HourKey};
    use crate::store::{Dictionaries, Hourly, MemoryStore, SeriesName};

    #[tokio::test]
    async fn a_query_over_the_fanout_bound_is_refused_and_counted() {
        let store = Arc::new(MemoryStore::new());
        let series = store
            .series_id_or_create(&SeriesName::new("visitors", vec![], Kind::Distinct))
            .unwrap();
        let hour = Hour(480_000);
        for name in ["web-1", "web-2"] {
            let server = store.register_server(name, &[]).unwrap();
            let key = HourKey {
                series,
                hour,
                server,
                epoch: Epoch(1),
            };
            let sketch = hourglass_sketch::hll::Hll::new(4).unwrap().encode();
            store.put_hourly(&[(key, 1, sketch.into())]).unwrap();
        }
        let metrics = Arc::new(Metrics::new());
        let limits = LimitsConfig {
            max_query_fanout: 1,
            ..LimitsConfig::default()
        };
        let service = QueryService::new(store, Arc::clone(&metrics), limits);
        let request = v1::DistinctRequest {
            selector: Some(v1::Selector {
                metric: "visitors".into(),
                range: Some(v1::TimeRange {
                    start_hour: hour.0,
                    end_hour: hour.0 + 1,
                }),
                ..Default::default()
            }),
        };
        let refused = service
            .distinct(Request::new(request))
            .await
            .expect_err("2 servers over a fan-out of 1");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            metrics
                .encode()
                .contains(r#"queries_refused_total{bound="limits.max_query_fanout"} 1"#),
            "{}",
            metrics.encode()
        );
    }
}
