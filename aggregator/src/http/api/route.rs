//! What a route of the API is: its path, the query-string parameters it takes and its
//! handler.

use std::sync::Arc;

use axum::routing::MethodRouter;

use crate::http::state::HttpState;

/// The path of the route that looks one item up in membership filters.
pub(super) const MEMBERSHIP_PATH: &str = "/api/v1/membership";
/// The path of the route that looks many up.
pub(super) const MEMBERSHIP_BATCH_PATH: &str = "/api/v1/membership/batch";

/// One route of the API: its path, the query-string parameters it takes and its
/// handler.
#[derive(Clone, Copy)]
pub(crate) struct Route {
    /// The path.
    pub(crate) path: &'static str,
    /// Every parameter it takes; any other is refused.
    pub(crate) parameters: &'static [&'static str],
    /// Its handler, for `GET`.
    pub(super) handler: fn() -> MethodRouter<Arc<HttpState>>,
}

/// The parameters that select what to merge
/// ([`Selection`](hourglass_rpc::selection::Selection)'s fields).
pub(super) const SELECTION: &[&str] =
    &["metric", "tag", "from", "to", "server", "label", "group_by"];
/// Parameters that may be given more than once, on every route that takes them.
pub(super) const REPEATABLE: &[&str] =
    &["tag", "server", "label", "vs_tag", "vs_server", "vs_label"];

/// Whether `route` takes `name` more than once: [`REPEATABLE`], and `item` on the route
/// that looks up many (every other route that takes `item` asks about one).
pub(super) fn repeatable(route: Route, name: &str) -> bool {
    REPEATABLE.contains(&name) || (name == "item" && route.path == MEMBERSHIP_BATCH_PATH)
}

/// The refusal of a second `name` on `route`.
pub(super) fn given_twice(route: Route, name: &str) -> String {
    if name != "item" {
        return format!("parameter {name:?} is given more than once");
    }
    let many = if route.path == MEMBERSHIP_PATH {
        format!(" ({MEMBERSHIP_BATCH_PATH} looks up many)")
    } else {
        String::new()
    };
    format!(
        "parameter \"item\" is given more than once: {} asks about one item{many}",
        route.path
    )
}
