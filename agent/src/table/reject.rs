//! Why an event was not added, and the counts of what a batch of events did.

use hourglass_rpc::series::NameError;

/// Why an event was not added. [`Reject::reason`] is its counter label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reject {
    /// The metric name or a tag breaks a naming rule.
    Name(NameError),
    /// The metric name is longer than `limits.max_metric_len`.
    MetricTooLong(usize),
    /// More tags than `limits.max_tags`.
    TooManyTags(usize),
    /// The item is longer than `limits.max_item_len`.
    ItemTooLong(usize),
    /// The item is empty.
    EmptyItem,
    /// The event's hour closed (its end plus the lateness) before it arrived.
    TooLate {
        /// The event time.
        time: i64,
    },
    /// The event is further in the future than `limits.max_future`.
    TooFarAhead {
        /// The event time.
        time: i64,
    },
    /// A new series beyond `limits.max_series`.
    SeriesLimit(usize),
}

impl Reject {
    /// The counter label.
    pub fn reason(&self) -> &'static str {
        match self {
            Reject::Name(NameError::TooManyTags { .. }) | Reject::TooManyTags(_) => "too_many_tags",
            Reject::Name(NameError::BadTagKey { .. } | NameError::BadTagValue { .. }) => "bad_tag",
            Reject::Name(NameError::DuplicateTag { .. }) => "duplicate_tag",
            Reject::Name(_) => "bad_metric",
            Reject::MetricTooLong(_) => "metric_too_long",
            Reject::ItemTooLong(_) => "item_too_long",
            Reject::EmptyItem => "empty_item",
            Reject::TooLate { .. } => "too_late",
            Reject::TooFarAhead { .. } => "too_far_ahead",
            Reject::SeriesLimit(_) => "series_limit",
        }
    }
}

impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reject::Name(e) => write!(f, "{e}"),
            Reject::MetricTooLong(n) => {
                write!(f, "metric name is {n} bytes, above limits.max_metric_len")
            }
            Reject::TooManyTags(n) => write!(f, "{n} tags, above limits.max_tags"),
            Reject::ItemTooLong(n) => write!(f, "item is {n} bytes, above limits.max_item_len"),
            Reject::EmptyItem => write!(f, "item is empty"),
            Reject::TooLate { time } => write!(
                f,
                "event time {time} is in an hour that closed (its end plus the lateness window is past)"
            ),
            Reject::TooFarAhead { time } => {
                write!(
                    f,
                    "event time {time} is further ahead of the clock than limits.max_future"
                )
            }
            Reject::SeriesLimit(n) => {
                write!(
                    f,
                    "a new series would exceed limits.max_series ({n} series held)"
                )
            }
        }
    }
}

/// Counts of what a batch of events did, added to the metrics once per batch.
#[derive(Debug, Default, Clone)]
pub(crate) struct IngestStats {
    /// Events added.
    pub(crate) accepted: u64,
    /// Events refused, by reason.
    pub(crate) rejected: Vec<(&'static str, u64)>,
    /// Tags dropped because the metric does not allow their key.
    pub(crate) dropped_tags: u64,
}

impl IngestStats {
    /// Counts one refusal.
    pub fn reject(&mut self, reason: &'static str) {
        match self.rejected.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => self.rejected.push((reason, 1)),
        }
    }

    /// Events refused, all reasons.
    pub fn rejected_total(&self) -> u64 {
        self.rejected.iter().map(|(_, n)| n).sum()
    }
}
