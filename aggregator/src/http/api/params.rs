//! The query string of an API request: decoded to bytes, checked against the parameters
//! its route takes, and read as a selection.

use hourglass_rpc::selection::{DEFAULT_FROM, DEFAULT_TO, Selection, VsSelection};

use super::route::{Route, given_twice, repeatable};
use crate::http::error::ApiError;

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
            if !repeatable(route, &name) && params.bytes(&name).is_some() {
                return Err(ApiError::invalid(given_twice(route, &name)));
            }
            params.pairs.push((name, decode(value)));
        }
        Ok(params)
    }

    /// The value of `name` as bytes, if given.
    pub(super) fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Every value of `name`, as text.
    pub(super) fn texts(&self, name: &str) -> Result<Vec<String>, ApiError> {
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
    pub(super) fn text(&self, name: &str) -> Result<Option<String>, ApiError> {
        Ok(self.texts(name)?.into_iter().next())
    }

    /// The selection the parameters make, with [`Selection`]'s defaults. A missing
    /// metric is left empty for the service to refuse, as it refuses a gRPC call.
    pub(super) fn selection(&self) -> Result<Selection, ApiError> {
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
    pub(super) fn vs_selection(&self) -> Result<VsSelection, ApiError> {
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
    pub(super) fn item(&self, route: Route) -> Result<Vec<u8>, ApiError> {
        match self.items().as_slice() {
            [item] => Ok(item.clone()),
            [] => Err(ApiError::invalid(format!(
                "item is required: {} asks about one item",
                route.path
            ))),
            // Refused as the query string is read ([`Params::parse`]); here too.
            _ => Err(ApiError::invalid(given_twice(route, "item"))),
        }
    }

    /// Every item asked about, in order (the service refuses none, or too many).
    pub(super) fn items(&self) -> Vec<Vec<u8>> {
        self.pairs
            .iter()
            .filter(|(n, _)| n == "item")
            .map(|(_, v)| v.clone())
            .collect()
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
