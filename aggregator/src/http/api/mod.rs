//! The JSON API's routes: each reads its query string, asks the `QueryService` as a
//! gRPC call would, and writes the reply as JSON with the proto's field names.
//!
//! Two things differ from the proto, both for callers without a proto at hand: an answer
//! says what it was asked (`metric`, `range` with its instants and hours, `item`, `k`),
//! and an hour or day group carries `time`, the RFC 3339 instant it starts, beside its
//! key, so that a chart plots the groups as they come (in time order). Items are bytes
//! on the wire: an item that is UTF-8 is `"item"`, any other `"item_base64"`.
//!
//! `handlers` answers each route, `params` reads the query string (against the
//! parameters of its `route`), `asked` turns it into the service's request and the reply
//! into the envelope, and `json` is the shape of every answer.

mod asked;
mod handlers;
mod json;
mod params;
mod route;

use std::sync::Arc;

use axum::routing::MethodRouter;

use route::Route;

use crate::http::state::HttpState;

/// Every API route with its parameters.
pub(crate) const ROUTES: [Route; 9] = [
    handlers::DISTINCT,
    handlers::FREQUENCY,
    handlers::TOPK,
    handlers::MEMBERSHIP,
    handlers::MEMBERSHIP_BATCH,
    handlers::OVERLAP,
    handlers::RETENTION,
    handlers::SERIES,
    handlers::SERVERS,
];

/// The API's routes and their handlers.
pub(crate) fn routes() -> Vec<(&'static str, MethodRouter<Arc<HttpState>>)> {
    ROUTES
        .iter()
        .map(|route| (route.path, (route.handler)()))
        .collect()
}

#[cfg(test)]
mod tests;
