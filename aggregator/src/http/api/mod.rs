//! The JSON API's routes: each reads its query string, asks the `QueryService` as a
//! gRPC call would, and writes the reply as JSON with the proto's field names.
//!
//! Two things differ from the proto, both for callers without a proto at hand: an answer
//! says what it was asked (`metric`, `range` with its instants and hours, `item`, `k`),
//! and an hour or day group carries `time`, the RFC 3339 instant it starts, beside its
//! key, so that a chart plots the groups as they come (in time order). Items are bytes
//! on the wire: an item that is UTF-8 is `"item"`, any other `"item_base64"`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use base64::Engine;
use hourglass_rpc::proto::v1::{self, query_server::Query};
use hourglass_rpc::selection::{DEFAULT_FROM, DEFAULT_TO, Selection, Spelling, VsSelection};
use serde::Serialize;

use super::{ApiError, HttpState, JSON, caller};

/// The request a handler is given: all of it but the (empty) body, so that nothing is
/// refused before the handler can answer in JSON.
type HttpRequest = axum::http::request::Parts;

/// One route of the API: its path, the query-string parameters it takes and its
/// handler.
#[derive(Clone, Copy)]
pub(crate) struct Route {
    /// The path.
    pub(crate) path: &'static str,
    /// Every parameter it takes; any other is refused.
    pub(crate) parameters: &'static [&'static str],
    /// Its handler, for `GET`.
    handler: fn() -> MethodRouter<Arc<HttpState>>,
}

/// The parameters that select what to merge ([`Selection`]'s fields).
const SELECTION: &[&str] = &["metric", "tag", "from", "to", "server", "label", "group_by"];
/// Parameters that may be given more than once.
const REPEATABLE: &[&str] = &["tag", "server", "label", "vs_tag", "vs_server", "vs_label"];

/// `/api/v1/distinct`.
const DISTINCT: Route = Route {
    path: "/api/v1/distinct",
    parameters: SELECTION,
    handler: || get(distinct),
};
/// `/api/v1/frequency`.
const FREQUENCY: Route = Route {
    path: "/api/v1/frequency",
    parameters: &[
        "metric", "tag", "from", "to", "server", "label", "group_by", "item",
    ],
    handler: || get(frequency),
};
/// `/api/v1/topk`.
const TOPK: Route = Route {
    path: "/api/v1/topk",
    parameters: &[
        "metric", "tag", "from", "to", "server", "label", "group_by", "k",
    ],
    handler: || get(topk),
};
/// `/api/v1/membership`.
const MEMBERSHIP: Route = Route {
    path: "/api/v1/membership",
    parameters: &[
        "metric", "tag", "from", "to", "server", "label", "group_by", "item",
    ],
    handler: || get(membership),
};
/// `/api/v1/overlap`: selection A, and B as A with what the `vs_` parameters replace.
const OVERLAP: Route = Route {
    path: "/api/v1/overlap",
    parameters: &[
        "metric",
        "tag",
        "from",
        "to",
        "server",
        "label",
        "vs_metric",
        "vs_tag",
        "vs_from",
        "vs_to",
        "vs_server",
        "vs_label",
    ],
    handler: || get(overlap),
};
/// `/api/v1/retention`.
const RETENTION: Route = Route {
    path: "/api/v1/retention",
    parameters: &["metric", "tag", "from", "to", "server", "label", "period"],
    handler: || get(retention),
};
/// `/api/v1/series`.
const SERIES: Route = Route {
    path: "/api/v1/series",
    parameters: &["metric"],
    handler: || get(series),
};
/// `/api/v1/servers`.
const SERVERS: Route = Route {
    path: "/api/v1/servers",
    parameters: &[],
    handler: || get(servers),
};

/// Every API route with its parameters.
pub(crate) const ROUTES: [Route; 8] = [
    DISTINCT, FREQUENCY, TOPK, MEMBERSHIP, OVERLAP, RETENTION, SERIES, SERVERS,
];

/// The API's routes and their handlers.
pub(crate) fn routes() -> Vec<(&'static str, MethodRouter<Arc<HttpState>>)> {
    ROUTES
        .iter()
        .map(|route| (route.path, (route.handler)()))
        .collect()
}

/// The `k` of `/api/v1/topk` when none is given, as `hourglass query topk`'s.
const DEFAULT_K: u32 = 10;

/// A query string, decoded: names with their values, in order. Values are bytes, since
/// an item may be any bytes (`%FF`); every other value must be UTF-8.
#[derive(Debug, Default)]
pub(crate) struct Params {
    pairs: Vec<(String, Vec<u8>)>,
}

impl Params {
    /// Decodes `query` (`application/x-www-form-urlencoded`: `+` is a space), refusing a
    /// parameter `route` does not take and a second value of one that is not repeatable.
    pub(crate) fn parse(query: Option<&str>, route: Route) -> Result<Params, ApiError> {
        let mut params = Params::default();
        for piece in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = piece.split_once('=').unwrap_or((piece, ""));
            let name = String::from_utf8(decode(name))
                .map_err(|_| ApiError::invalid(format!("parameter name {name:?} is not UTF-8")))?;
            if !route.parameters.contains(&name.as_str()) {
                let takes = if route.parameters.is_empty() {
                    "no parameters".to_string()
                } else {
                    route.parameters.join(", ")
                };
                return Err(ApiError::invalid(format!(
                    "unknown parameter {name:?}: {} takes {takes}",
                    route.path
                )));
            }
            if !REPEATABLE.contains(&name.as_str()) && params.bytes(&name).is_some() {
                return Err(ApiError::invalid(format!(
                    "parameter {name:?} is given more than once"
                )));
            }
            params.pairs.push((name, decode(value)));
        }
        Ok(params)
    }

    /// The value of `name` as bytes, if given.
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Every value of `name`, as text.
    fn texts(&self, name: &str) -> Result<Vec<String>, ApiError> {
        self.pairs
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| {
                String::from_utf8(v.clone())
                    .map_err(|_| ApiError::invalid(format!("{name}: the value is not UTF-8")))
            })
            .collect()
    }

    /// The value of `name` as text, if given.
    fn text(&self, name: &str) -> Result<Option<String>, ApiError> {
        Ok(self.texts(name)?.into_iter().next())
    }

    /// The selection the parameters make, with [`Selection`]'s defaults. A missing
    /// metric is left empty for the service to refuse, as it refuses a gRPC call.
    fn selection(&self) -> Result<Selection, ApiError> {
        Ok(Selection {
            metric: self.text("metric")?.unwrap_or_default(),
            tags: self.texts("tag")?,
            from: self.text("from")?.unwrap_or_else(|| DEFAULT_FROM.into()),
            to: self.text("to")?.unwrap_or_else(|| DEFAULT_TO.into()),
            servers: self.texts("server")?,
            labels: self.texts("label")?,
            group_by: self.text("group_by")?,
        })
    }

    /// What the `vs_` parameters replace of selection A (overlap's selection B).
    fn vs_selection(&self) -> Result<VsSelection, ApiError> {
        Ok(VsSelection {
            metric: self.text("vs_metric")?,
            tags: self.texts("vs_tag")?,
            from: self.text("vs_from")?,
            to: self.text("vs_to")?,
            servers: self.texts("vs_server")?,
            labels: self.texts("vs_label")?,
        })
    }

    /// The item asked about: required, and any bytes (the empty item too).
    fn item(&self, route: Route) -> Result<Vec<u8>, ApiError> {
        self.bytes("item").map(<[u8]>::to_vec).ok_or_else(|| {
            ApiError::invalid(format!(
                "item is required: {} asks about one item",
                route.path
            ))
        })
    }
}

/// One percent-encoded component of a query string, decoded to bytes.
fn decode(text: &str) -> Vec<u8> {
    let spaced: Vec<u8> = text
        .bytes()
        .map(|b| if b == b'+' { b' ' } else { b })
        .collect();
    percent_encoding::percent_decode(&spaced).collect()
}

/// A question, checked and read: who asks, and the selector it makes.
struct Asked {
    metadata: tonic::metadata::MetadataMap,
    extensions: tonic::Extensions,
    params: Params,
    selector: v1::Selector,
    /// The instant relative times were read at (B's too, for an overlap).
    now: chrono::DateTime<chrono::Utc>,
}

impl Asked {
    /// Checks the caller first (a stranger learns nothing of the parameters), then reads
    /// the query string of `route`.
    fn read(state: &HttpState, request: &HttpRequest, route: Route) -> Result<Asked, ApiError> {
        let (metadata, extensions) = caller(&state.auth, request)?;
        let params = Params::parse(request.uri.query(), route)?;
        let now = chrono::Utc::now();
        let selector = params
            .selection()?
            .selector(now, Spelling::Parameters)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        Ok(Asked {
            metadata,
            extensions,
            params,
            selector,
            now,
        })
    }

    /// The service's request of `message`, with the caller's metadata and principal.
    fn request<T>(&mut self, message: T) -> tonic::Request<T> {
        tonic::Request::from_parts(
            std::mem::take(&mut self.metadata),
            std::mem::take(&mut self.extensions),
            message,
        )
    }

    /// The selector, for a request message.
    fn selector(&self) -> Option<v1::Selector> {
        Some(self.selector.clone())
    }

    /// The answer to this question: what was asked, then the reply's answer, coverage
    /// and groups.
    fn answered<R: Reply>(&self, reply: R) -> Answered<R::Answer> {
        let (answer, coverage, groups) = reply.split();
        let range = self.selector.range.unwrap_or_default();
        let timed = matches!(
            v1::GroupBy::try_from(self.selector.group_by),
            Ok(v1::GroupBy::Hour | v1::GroupBy::Day)
        );
        let mut groups: Vec<GroupJson<R::Answer>> = groups
            .into_iter()
            .map(|(key, answer, coverage)| {
                let hour = timed.then(|| group_hour(&key)).flatten();
                GroupJson {
                    time: hour.map(hourglass_rpc::time::rfc3339_hour),
                    key,
                    answer,
                    coverage: CoverageJson::from(coverage),
                    hour,
                }
            })
            .collect();
        // The service lists groups in key order, which for hours and days is time order;
        // sorted here all the same, since a chart depends on it.
        if timed {
            groups.sort_by_key(|g| g.hour);
        }
        Answered {
            metric: self.selector.metric.clone(),
            range: RangeJson::of(range.start_hour, range.end_hour),
            item: None,
            k: None,
            answer,
            coverage: CoverageJson::from(coverage),
            groups,
        }
    }
}

/// A reply's answer, coverage and groups (key, answer, coverage), its answers as JSON.
type Split<A> = (
    A,
    Option<v1::Coverage>,
    Vec<(String, A, Option<v1::Coverage>)>,
);

/// A `Query` reply, taken apart for the JSON envelope.
trait Reply {
    /// Its answer as JSON: `{"answer": …}`, or `{"items": […]}` for top-k.
    type Answer: Serialize;
    /// Its answer, coverage and groups.
    fn split(self) -> Split<Self::Answer>;
}

/// [`Reply`] for the replies of one answer (`answer`, `coverage`, `groups` of `key`,
/// `answer`, `coverage`), each answer converted to `$json`.
macro_rules! one_answer_replies {
    ($($reply:ty => $json:ty),* $(,)?) => {$(
        impl Reply for $reply {
            type Answer = One<$json>;
            fn split(self) -> Split<Self::Answer> {
                let groups = self
                    .groups
                    .into_iter()
                    .map(|g| (g.key, One::new(g.answer.map(<$json>::from)), g.coverage))
                    .collect();
                (One::new(self.answer.map(<$json>::from)), self.coverage, groups)
            }
        }
    )*};
}

one_answer_replies!(
    v1::DistinctResponse => DistinctJson,
    v1::FrequencyResponse => FrequencyJson,
    v1::MembershipResponse => MembershipJson,
);

impl Reply for v1::TopKResponse {
    type Answer = Items;
    fn split(self) -> Split<Items> {
        let groups = self
            .groups
            .into_iter()
            .map(|g| (g.key, Items::from(g.items), g.coverage))
            .collect();
        (Items::from(self.items), self.coverage, groups)
    }
}

/// The first hour of an hour or day group, from its key.
fn group_hour(key: &str) -> Option<u32> {
    hourglass_rpc::time::parse_hour(key).or_else(|| {
        hourglass_rpc::time::parse_day(key).map(|day| day * hourglass_rpc::time::HOURS_PER_DAY)
    })
}

/// The JSON answer of a handler's result.
fn respond<T: Serialize>(result: Result<T, ApiError>) -> Response {
    match result.and_then(|body| {
        serde_json::to_string(&body)
            .map_err(|e| ApiError::from(tonic::Status::internal(format!("encoding JSON: {e}"))))
    }) {
        Ok(body) => ([(header::CONTENT_TYPE, JSON)], body).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn distinct(State(state): State<Arc<HttpState>>, request: HttpRequest) -> Response {
    respond(
        async {
            let mut asked = Asked::read(&state, &request, DISTINCT)?;
            let message = v1::DistinctRequest {
                selector: asked.selector(),
            };
            let reply = state.query.distinct(asked.request(message)).await?;
            Ok(asked.answered(reply.into_inner()))
        }
        .await,
    )
}

async fn frequency(State(state): State<Arc<HttpState>>, request: HttpRequest) -> Response {
    respond(
        async {
            let mut asked = Asked::read(&state, &request, FREQUENCY)?;
            let item = asked.params.item(FREQUENCY)?;
            let message = v1::FrequencyRequest {
                selector: asked.selector(),
                item: item.clone(),
            };
            let reply = state.query.frequency(asked.request(message)).await?;
            Ok(asked.answered(reply.into_inner()).about(&item))
        }
        .await,
    )
}

async fn topk(State(state): State<Arc<HttpState>>, request: HttpRequest) -> Response {
    respond(
        async {
            let mut asked = Asked::read(&state, &request, TOPK)?;
            let k = match asked.params.text("k")? {
                None => DEFAULT_K,
                Some(text) => text.parse().map_err(|_| {
                    ApiError::invalid(format!(
                        "k: {text:?} is not a whole number from 1 to {}",
                        u32::MAX
                    ))
                })?,
            };
            let message = v1::TopKRequest {
                selector: asked.selector(),
                k,
            };
            let reply = state.query.top_k(asked.request(message)).await?;
            let mut answered = asked.answered(reply.into_inner());
            answered.k = Some(k);
            Ok(answered)
        }
        .await,
    )
}

async fn membership(State(state): State<Arc<HttpState>>, request: HttpRequest) -> Response {
    respond(
        async {
            let mut asked = Asked::read(&state, &request, MEMBERSHIP)?;
            let item = asked.params.item(MEMBERSHIP)?;
            let message = v1::MembershipRequest {
                selector: asked.selector(),
                item: item.clone(),
            };
            let reply = state.query.membership(asked.request(message)).await?;
            Ok(asked.answered(reply.into_inner()).about(&item))
        }
        .await,
    )
}

async fn overlap(State(state): State<Arc<HttpState>>, request: HttpRequest) -> Response {
    respond(
        async {
            let mut asked = Asked::read(&state, &request, OVERLAP)?;
            let vs = asked.params.vs_selection()?;
            if vs.is_empty() {
                return Err(ApiError::invalid(
                    "selection B is selection A with what the vs_ parameters replace: give at least one (vs_from and vs_to for other hours, vs_server or vs_label for other servers)"
                        .to_string(),
                ));
            }
            let b = vs
                .selector(&asked.params.selection()?, asked.now, Spelling::Parameters)
                .map_err(ApiError::invalid)?;
            let message = v1::OverlapRequest {
                a: asked.selector(),
                b: Some(b.clone()),
            };
            let reply = state.query.overlap(asked.request(message)).await?.into_inner();
            let answer = reply.answer.unwrap_or_default();
            Ok(OverlapJson {
                a: SideJson::of(&asked.selector, reply.coverage_a),
                b: SideJson::of(&b, reply.coverage_b),
                answer: OverlapAnswerJson {
                    a: answer.a.unwrap_or_default().into(),
                    b: answer.b.unwrap_or_default().into(),
                    union: answer.union.unwrap_or_default().into(),
                    intersection: answer.intersection.unwrap_or_default().into(),
                    only_a: answer.only_a.unwrap_or_default().into(),
                    only_b: answer.only_b.unwrap_or_default().into(),
                    jaccard: answer.jaccard.unwrap_or_default().into(),
                    retained: answer.retained.unwrap_or_default().into(),
                    verdict: hourglass_rpc::proto::overlap_verdict_name(answer.verdict),
                    naive_intersection: hourglass_rpc::json_figure(answer.naive_intersection),
                },
            })
        }
        .await,
    )
}

async fn retention(State(state): State<Arc<HttpState>>, request: HttpRequest) -> Response {
    respond(
        async {
            let mut asked = Asked::read(&state, &request, RETENTION)?;
            let Some(period) = asked.params.text("period")? else {
                return Err(ApiError::invalid(
                    "period is required: the length of a cohort, day, week or Nh (12h), Nd, Nw"
                        .to_string(),
                ));
            };
            let period_hours = hourglass_rpc::selection::parse_period(&period)
                .map_err(|e| ApiError::invalid(format!("period: {e}")))?;
            let message = v1::RetentionRequest {
                selector: asked.selector(),
                period_hours,
            };
            let reply = state
                .query
                .retention(asked.request(message))
                .await?
                .into_inner();
            let range = asked.selector.range.unwrap_or_default();
            Ok(RetentionJson {
                metric: asked.selector.metric.clone(),
                range: RangeJson::of(range.start_hour, range.end_hour),
                period_hours,
                periods: reply
                    .periods
                    .into_iter()
                    .map(|p| PeriodJson {
                        range: RangeJson::of(p.start_hour, p.end_hour),
                        answer: p.distinct.unwrap_or_default().into(),
                        coverage: CoverageJson::from(p.coverage),
                    })
                    .collect(),
                rows: reply
                    .rows
                    .into_iter()
                    .map(|r| RowJson {
                        cohort: r.cohort,
                        cells: r
                            .cells
                            .into_iter()
                            .map(|c| CellJson {
                                period: c.period,
                                returned: c.returned.unwrap_or_default().into(),
                                share: c.share.unwrap_or_default().into(),
                                verdict: hourglass_rpc::proto::overlap_verdict_name(c.verdict),
                            })
                            .collect(),
                    })
                    .collect(),
            })
        }
        .await,
    )
}

async fn series(State(state): State<Arc<HttpState>>, request: HttpRequest) -> Response {
    respond(
        async {
            let (metadata, extensions) = caller(&state.auth, &request)?;
            let params = Params::parse(request.uri.query(), SERIES)?;
            let message = v1::ListSeriesRequest {
                metric: params.text("metric")?.unwrap_or_default(),
            };
            let reply = state
                .query
                .list_series(tonic::Request::from_parts(metadata, extensions, message))
                .await?
                .into_inner();
            let series = reply
                .series
                .into_iter()
                .map(|info| {
                    let series = info.series.unwrap_or_default();
                    SeriesJson {
                        metric: series.metric,
                        tags: pairs(series.tags),
                        kind: kind_name(info.kind),
                    }
                })
                .collect();
            Ok(SeriesList { series })
        }
        .await,
    )
}

async fn servers(State(state): State<Arc<HttpState>>, request: HttpRequest) -> Response {
    respond(
        async {
            let (metadata, extensions) = caller(&state.auth, &request)?;
            Params::parse(request.uri.query(), SERVERS)?;
            let reply = state
                .query
                .list_servers(tonic::Request::from_parts(
                    metadata,
                    extensions,
                    v1::ListServersRequest {},
                ))
                .await?
                .into_inner();
            let servers = reply
                .servers
                .into_iter()
                .map(|s| ServerJson {
                    name: s.name,
                    labels: pairs(s.labels),
                })
                .collect();
            Ok(ServerList { servers })
        }
        .await,
    )
}

/// Tags or labels as one JSON object.
fn pairs(tags: Vec<v1::Tag>) -> BTreeMap<String, String> {
    tags.into_iter().map(|t| (t.key, t.value)).collect()
}

/// A wire sketch kind's name: `distinct`, `frequency` or `membership`.
fn kind_name(kind: i32) -> &'static str {
    v1::SketchKind::try_from(kind)
        .ok()
        .and_then(|wire| hourglass_sketch::Kind::try_from(wire).ok())
        .map_or("unspecified", |kind| kind.name())
}

/// The envelope of every answer.
#[derive(Debug, Serialize)]
struct Answered<A> {
    /// The metric asked about.
    metric: String,
    /// The whole hours merged.
    range: RangeJson,
    /// frequency, membership: the item asked about.
    #[serde(flatten)]
    item: Option<ItemJson>,
    /// topk: how many items were asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    k: Option<u32>,
    /// `answer`, or `items` for topk.
    #[serde(flatten)]
    answer: A,
    /// What the whole answer saw.
    coverage: CoverageJson,
    /// Per group; empty when not grouped.
    groups: Vec<GroupJson<A>>,
}

impl<A> Answered<A> {
    /// This answer, saying the item it is about.
    fn about(mut self, item: &[u8]) -> Answered<A> {
        self.item = Some(ItemJson::of(item));
        self
    }
}

/// The hours of an answer: their first instant and the instant after the last, and the
/// same as hours since the epoch.
#[derive(Debug, Serialize)]
struct RangeJson {
    from: String,
    to: String,
    start_hour: u32,
    end_hour: u32,
}

impl RangeJson {
    /// The hours `[start_hour, end_hour)`.
    fn of(start_hour: u32, end_hour: u32) -> RangeJson {
        RangeJson {
            from: hourglass_rpc::time::rfc3339_hour(start_hour),
            to: hourglass_rpc::time::rfc3339_hour(end_hour),
            start_hour,
            end_hour,
        }
    }
}

/// The answer of `/api/v1/overlap`.
#[derive(Debug, Serialize)]
struct OverlapJson {
    /// Selection A: what it asked and what its merge saw.
    a: SideJson,
    /// Selection B.
    b: SideJson,
    answer: OverlapAnswerJson,
}

/// One selection of an overlap: its metric, hours and coverage.
#[derive(Debug, Serialize)]
struct SideJson {
    metric: String,
    range: RangeJson,
    coverage: CoverageJson,
}

impl SideJson {
    fn of(selector: &v1::Selector, coverage: Option<v1::Coverage>) -> SideJson {
        let range = selector.range.unwrap_or_default();
        SideJson {
            metric: selector.metric.clone(),
            range: RangeJson::of(range.start_hour, range.end_hour),
            coverage: CoverageJson::from(coverage),
        }
    }
}

/// The proto's `OverlapAnswer`, its verdict by name.
#[derive(Debug, Serialize)]
struct OverlapAnswerJson {
    a: DistinctJson,
    b: DistinctJson,
    union: DistinctJson,
    intersection: DistinctJson,
    only_a: DistinctJson,
    only_b: DistinctJson,
    jaccard: DistinctJson,
    retained: DistinctJson,
    verdict: &'static str,
    naive_intersection: f64,
}

/// The answer of `/api/v1/retention`.
#[derive(Debug, Serialize)]
struct RetentionJson {
    metric: String,
    range: RangeJson,
    period_hours: u32,
    periods: Vec<PeriodJson>,
    rows: Vec<RowJson>,
}

/// One period of a retention table: its hours, its distinct count and coverage.
#[derive(Debug, Serialize)]
struct PeriodJson {
    range: RangeJson,
    answer: DistinctJson,
    coverage: CoverageJson,
}

/// A cohort's row of a retention table.
#[derive(Debug, Serialize)]
struct RowJson {
    cohort: u32,
    cells: Vec<CellJson>,
}

/// A cohort's return in one later period.
#[derive(Debug, Serialize)]
struct CellJson {
    period: u32,
    returned: DistinctJson,
    share: DistinctJson,
    verdict: &'static str,
}

/// One group of an answer.
#[derive(Debug, Serialize)]
struct GroupJson<A> {
    /// The group's key: a server, an hour (`2026-11-23T14:00Z`), a day, a tag value.
    key: String,
    /// Hour and day groups: the RFC 3339 instant the group starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<String>,
    #[serde(flatten)]
    answer: A,
    coverage: CoverageJson,
    /// The group's first hour, for sorting.
    #[serde(skip)]
    hour: Option<u32>,
}

/// `"answer": {...}`.
#[derive(Debug, Serialize)]
struct One<T> {
    answer: T,
}

impl<T: Default> One<T> {
    /// A proto answer, zeros when the reply has none.
    fn new(answer: Option<T>) -> One<T> {
        One {
            answer: answer.unwrap_or_default(),
        }
    }
}

/// `"items": [...]`, heaviest first.
#[derive(Debug, Serialize)]
struct Items {
    items: Vec<TopItemJson>,
}

impl From<Vec<v1::TopItem>> for Items {
    fn from(items: Vec<v1::TopItem>) -> Items {
        Items {
            items: items
                .into_iter()
                .map(|t| TopItemJson {
                    item: ItemJson::of(&t.item),
                    estimate: t.estimate,
                    lower: t.lower,
                    upper: t.upper,
                })
                .collect(),
        }
    }
}

/// An item: `"item": "text"` when it is UTF-8, else `"item_base64": "..."`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
enum ItemJson {
    #[serde(rename = "item")]
    Text(String),
    #[serde(rename = "item_base64")]
    Base64(String),
}

impl ItemJson {
    fn of(bytes: &[u8]) -> ItemJson {
        match std::str::from_utf8(bytes) {
            Ok(text) => ItemJson::Text(text.to_string()),
            Err(_) => ItemJson::Base64(base64::engine::general_purpose::STANDARD.encode(bytes)),
        }
    }
}

#[derive(Debug, Serialize)]
struct TopItemJson {
    #[serde(flatten)]
    item: ItemJson,
    estimate: u64,
    lower: u64,
    upper: u64,
}

#[derive(Debug, Default, Serialize)]
struct DistinctJson {
    estimate: f64,
    std_error: f64,
    lower95: f64,
    upper95: f64,
}

impl From<v1::DistinctAnswer> for DistinctJson {
    fn from(a: v1::DistinctAnswer) -> DistinctJson {
        use hourglass_rpc::json_figure;
        DistinctJson {
            estimate: json_figure(a.estimate),
            std_error: json_figure(a.std_error),
            lower95: json_figure(a.lower95),
            upper95: json_figure(a.upper95),
        }
    }
}

#[derive(Debug, Default, Serialize)]
struct FrequencyJson {
    estimate: u64,
    max_overcount: u64,
    total: u64,
}

impl From<v1::FrequencyAnswer> for FrequencyJson {
    fn from(a: v1::FrequencyAnswer) -> FrequencyJson {
        FrequencyJson {
            estimate: a.estimate,
            max_overcount: a.max_overcount,
            total: a.total,
        }
    }
}

#[derive(Debug, Default, Serialize)]
struct MembershipJson {
    maybe_present: bool,
    definitely_absent: bool,
    filters_consulted: u64,
    range_fpr: f64,
    all_false_probability: f64,
    saturated_filters: u64,
    seen_in: Vec<SightingJson>,
    seen_in_count: u64,
    fill_ratio: f64,
    estimated_fpr: f64,
    past_design_point: bool,
}

/// A filter that said "maybe": where the item was seen.
#[derive(Debug, Serialize)]
struct SightingJson {
    server: String,
    /// The filter's first hour, RFC 3339.
    from: String,
    start_hour: u32,
    hours: u32,
    fpr: f64,
}

impl From<v1::MembershipAnswer> for MembershipJson {
    fn from(a: v1::MembershipAnswer) -> MembershipJson {
        MembershipJson {
            maybe_present: a.maybe_present,
            definitely_absent: a.definitely_absent,
            filters_consulted: a.filters_consulted,
            range_fpr: a.range_fpr,
            all_false_probability: a.all_false_probability,
            saturated_filters: a.saturated_filters,
            seen_in: a
                .seen_in
                .into_iter()
                .map(|s| SightingJson {
                    server: s.server,
                    from: hourglass_rpc::time::rfc3339_hour(s.start_hour),
                    start_hour: s.start_hour,
                    hours: s.hours,
                    fpr: s.fpr,
                })
                .collect(),
            seen_in_count: a.seen_in_count,
            fill_ratio: a.fill_ratio,
            estimated_fpr: a.estimated_fpr,
            past_design_point: a.past_design_point,
        }
    }
}

#[derive(Debug, Default, Serialize)]
struct CoverageJson {
    sketches_merged: u64,
    server_hours_missing: u64,
    missing: Vec<MissingJson>,
    partitions_missing: u32,
    missing_partitions: Vec<u32>,
}

#[derive(Debug, Serialize)]
struct MissingJson {
    server: String,
    hours: u64,
}

impl From<Option<v1::Coverage>> for CoverageJson {
    fn from(c: Option<v1::Coverage>) -> CoverageJson {
        let c = c.unwrap_or_default();
        CoverageJson {
            sketches_merged: c.sketches_merged,
            server_hours_missing: c.server_hours_missing,
            missing: c
                .missing
                .into_iter()
                .map(|m| MissingJson {
                    server: m.server,
                    hours: m.hours,
                })
                .collect(),
            partitions_missing: c.partitions_missing,
            missing_partitions: c.missing_partitions,
        }
    }
}

#[derive(Debug, Serialize)]
struct SeriesList {
    series: Vec<SeriesJson>,
}

#[derive(Debug, Serialize)]
struct SeriesJson {
    metric: String,
    tags: BTreeMap<String, String>,
    kind: &'static str,
}

#[derive(Debug, Serialize)]
struct ServerList {
    servers: Vec<ServerJson>,
}

#[derive(Debug, Serialize)]
struct ServerJson {
    name: String,
    labels: BTreeMap<String, String>,
}
