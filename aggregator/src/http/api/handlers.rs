//! The API's routes and their handlers: each reads its query string, asks the
//! `QueryService` as a gRPC call would, and writes the reply as JSON.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hourglass_rpc::proto::v1::{self, query_server::Query};
use hourglass_rpc::selection::Spelling;
use serde::Serialize;

use super::asked::{Asked, HttpRequest};
use super::json::{
    CellJson, CoverageJson, OverlapAnswerJson, OverlapJson, PeriodJson, RangeJson, RetentionJson,
    RowJson, SeriesJson, SeriesList, ServerJson, ServerList, SideJson,
};
use super::params::Params;
use super::route::{MEMBERSHIP_BATCH_PATH, MEMBERSHIP_PATH, Route, SELECTION};
use crate::http::error::{ApiError, JSON};
use crate::http::state::{HttpState, caller};

/// `/api/v1/distinct`.
pub(super) const DISTINCT: Route = Route {
    path: "/api/v1/distinct",
    parameters: SELECTION,
    handler: || get(distinct),
};
/// `/api/v1/frequency`.
pub(super) const FREQUENCY: Route = Route {
    path: "/api/v1/frequency",
    parameters: &[
        "metric", "tag", "from", "to", "server", "label", "group_by", "item",
    ],
    handler: || get(frequency),
};
/// `/api/v1/topk`.
pub(super) const TOPK: Route = Route {
    path: "/api/v1/topk",
    parameters: &[
        "metric", "tag", "from", "to", "server", "label", "group_by", "k",
    ],
    handler: || get(topk),
};
/// `/api/v1/membership`.
pub(super) const MEMBERSHIP: Route = Route {
    path: MEMBERSHIP_PATH,
    parameters: &[
        "metric", "tag", "from", "to", "server", "label", "group_by", "item",
    ],
    handler: || get(membership),
};
/// `/api/v1/membership/batch`: `item` given once per item.
pub(super) const MEMBERSHIP_BATCH: Route = Route {
    path: MEMBERSHIP_BATCH_PATH,
    parameters: &[
        "metric", "tag", "from", "to", "server", "label", "group_by", "item",
    ],
    handler: || get(membership_batch),
};
/// `/api/v1/overlap`: selection A, and B as A with what the `vs_` parameters replace.
pub(super) const OVERLAP: Route = Route {
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
pub(super) const RETENTION: Route = Route {
    path: "/api/v1/retention",
    parameters: &["metric", "tag", "from", "to", "server", "label", "period"],
    handler: || get(retention),
};
/// `/api/v1/series`.
pub(super) const SERIES: Route = Route {
    path: "/api/v1/series",
    parameters: &["metric"],
    handler: || get(series),
};
/// `/api/v1/servers`.
pub(super) const SERVERS: Route = Route {
    path: "/api/v1/servers",
    parameters: &[],
    handler: || get(servers),
};

/// The `k` of `/api/v1/topk` when none is given, as `hourglass query topk`'s.
const DEFAULT_K: u32 = 10;

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

/// Many lookups' answers, each the JSON of `/api/v1/membership` for its item.
#[derive(Serialize)]
struct BatchJson<A> {
    answers: Vec<A>,
}

async fn membership_batch(State(state): State<Arc<HttpState>>, request: HttpRequest) -> Response {
    respond(
        async {
            let mut asked = Asked::read(&state, &request, MEMBERSHIP_BATCH)?;
            let items = asked.params.items();
            let message = v1::MembershipBatchRequest {
                selector: asked.selector(),
                items: items.clone(),
            };
            let reply = state
                .query
                .membership_batch(asked.request(message))
                .await?
                .into_inner();
            let answers = items
                .iter()
                .zip(reply.answers)
                .map(|(item, answer)| asked.answered(answer).about(item))
                .collect();
            Ok(BatchJson { answers })
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
