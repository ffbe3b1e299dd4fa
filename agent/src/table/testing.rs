//! What the tests of the table share: a clock, a small table and an event added as the
//! ingest paths add it.

use std::sync::Arc;

use hourglass_sketch::format::Kind;

use super::reject::{IngestStats, Reject};
use super::state::Table;
use crate::config::Config;

/// The clock of the tests: some hour of 2025.
pub(crate) const NOW: i64 = 1_764_000_000;

/// The hour of `t`.
pub(crate) fn hour(t: i64) -> u32 {
    (t / 3600) as u32
}

/// A table of at most three series, epoch 7, where `pages` keeps only a Bloom filter
/// and only its `region` tag.
pub(crate) fn table() -> Table {
    let mut config = Config::default();
    config.limits.max_series = 3;
    config.metrics.insert(
        "pages".into(),
        crate::config::MetricConfig {
            kinds: Some(vec![Kind::Membership]),
            allowed_tags: Some(vec!["region".into()]),
            ..Default::default()
        },
    );
    Table::new(Arc::new(config), 7)
}

/// An event as the ingest paths add it: checked, then its series found, then added.
pub(crate) fn add(
    t: &mut Table,
    metric: &str,
    tags: &str,
    item: &str,
    time: i64,
) -> Result<(), Reject> {
    let mut stats = IngestStats::default();
    let hour = t.check(item.as_bytes(), time, NOW)?;
    let id = t.resolve_statsd(metric, tags, &mut stats)?;
    t.insert_at(id, hour, item.as_bytes(), 1);
    Ok(())
}
