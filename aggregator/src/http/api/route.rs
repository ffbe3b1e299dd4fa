//! What a route of the API is: its path, the query-string parameters it takes and its
//! handler.

use std::sync::Arc;

use axum::routing::MethodRouter;

use crate::http::state::HttpState;

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
/// Parameters that may be given more than once.
/// (`item` only where a route takes many: [`super::params::Params::item`] refuses a second
/// one.)
pub(super) const REPEATABLE: &[&str] = &[
    "tag",
    "server",
    "label",
    "vs_tag",
    "vs_server",
    "vs_label",
    "item",
];
