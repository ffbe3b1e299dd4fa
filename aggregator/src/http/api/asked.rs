//! A question to the API, checked and read: who asks, and the selector its query string
//! makes; and a reply taken apart into the envelope every answer has.

use hourglass_rpc::proto::v1;
use hourglass_rpc::selection::Spelling;
use serde::Serialize;

use super::json::{
    Answered, CoverageJson, DistinctJson, FrequencyJson, GroupJson, Items, MembershipJson, One,
    RangeJson,
};
use super::params::Params;
use super::route::Route;
use crate::http::error::ApiError;
use crate::http::state::{HttpState, caller};

/// The request a handler is given: all of it but the (empty) body, so that nothing is
/// refused before the handler can answer in JSON.
pub(super) type HttpRequest = axum::http::request::Parts;

/// A question, checked and read: who asks, and the selector it makes.
pub(super) struct Asked {
    pub(super) metadata: tonic::metadata::MetadataMap,
    pub(super) extensions: tonic::Extensions,
    pub(super) params: Params,
    pub(super) selector: v1::Selector,
    /// The instant relative times were read at (B's too, for an overlap).
    pub(super) now: chrono::DateTime<chrono::Utc>,
}

impl Asked {
    /// Checks the caller first (a stranger learns nothing of the parameters), then reads
    /// the query string of `route`.
    pub(super) fn read(
        state: &HttpState,
        request: &HttpRequest,
        route: Route,
    ) -> Result<Asked, ApiError> {
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
    pub(super) fn request<T>(&mut self, message: T) -> tonic::Request<T> {
        tonic::Request::from_parts(
            std::mem::take(&mut self.metadata),
            std::mem::take(&mut self.extensions),
            message,
        )
    }

    /// The selector, for a request message.
    pub(super) fn selector(&self) -> Option<v1::Selector> {
        Some(self.selector.clone())
    }

    /// The answer to this question: what was asked, then the reply's answer, coverage
    /// and groups.
    pub(super) fn answered<R: Reply>(&self, reply: R) -> Answered<R::Answer> {
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
pub(super) type Split<A> = (
    A,
    Option<v1::Coverage>,
    Vec<(String, A, Option<v1::Coverage>)>,
);

/// A `Query` reply, taken apart for the JSON envelope.
pub(super) trait Reply {
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
