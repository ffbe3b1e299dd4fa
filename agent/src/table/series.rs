//! Series: an event's metric and tags resolved to the series the table holds, remembered
//! by the raw bytes they arrived as.

use std::sync::Arc;

use hourglass_rpc::proto::v1;
use hourglass_rpc::series::Series;

use super::reject::{IngestStats, Reject};
use super::state::{Alias, SeriesSlot, Table};
use crate::config::MetricSpec;

/// Raw spellings longer than this are resolved every time instead of remembered, so a
/// sender of huge tag lists cannot fill memory with cache keys.
const MAX_ALIAS_KEY: usize = 1024;
/// Tags an event may carry before the metric's allowed keys filter them.
pub(crate) const MAX_RAW_TAGS: usize = 64;

impl Table {
    /// The epoch of this table's state.
    /// The series of a DogStatsD line: `tags` as sent (`k:v,k2:v2`).
    pub(crate) fn resolve_statsd(
        &mut self,
        metric: &str,
        tags: &str,
        stats: &mut IngestStats,
    ) -> Result<u64, Reject> {
        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        key.push(b's');
        key.extend_from_slice(metric.as_bytes());
        key.push(b'|');
        key.extend_from_slice(tags.as_bytes());
        let result = self.resolve(&key, metric, || crate::statsd::tag_pairs(tags), stats);
        self.scratch = key;
        result
    }

    /// The series of an Ingest event.
    pub(crate) fn resolve_tags(
        &mut self,
        metric: &str,
        tags: &[v1::Tag],
        stats: &mut IngestStats,
    ) -> Result<u64, Reject> {
        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        key.push(b'g');
        key.extend_from_slice(metric.as_bytes());
        for t in tags {
            key.push(0);
            key.extend_from_slice(t.key.as_bytes());
            key.push(0);
            key.extend_from_slice(t.value.as_bytes());
        }
        let pairs = || tags.iter().map(|t| (t.key.as_str(), t.value.as_str()));
        let result = self.resolve(&key, metric, pairs, stats);
        self.scratch = key;
        result
    }

    fn resolve<'t, I: Iterator<Item = (&'t str, &'t str)>>(
        &mut self,
        key: &[u8],
        metric: &str,
        pairs: impl Fn() -> I,
        stats: &mut IngestStats,
    ) -> Result<u64, Reject> {
        if let Some(alias) = self.aliases.get(key) {
            stats.dropped_tags += u64::from(alias.dropped_tags);
            return Ok(alias.id);
        }
        let config = Arc::clone(&self.config);
        let limits = &config.limits;
        if metric.len() > limits.max_metric_len {
            return Err(Reject::MetricTooLong(metric.len()));
        }
        hourglass_rpc::series::validate_metric(metric).map_err(Reject::Name)?;
        let spec = self.spec(metric);
        let mut tags = Vec::new();
        let mut dropped = 0u32;
        let raw = pairs().count();
        if raw > MAX_RAW_TAGS {
            return Err(Reject::TooManyTags(raw));
        }
        for (k, v) in pairs() {
            let allowed = spec
                .allowed_tags
                .as_ref()
                .is_none_or(|keys| keys.binary_search_by(|a| a.as_str().cmp(k)).is_ok());
            if allowed {
                tags.push((k.to_string(), v.to_string()));
            } else {
                dropped += 1;
            }
        }
        if tags.len() > limits.max_tags {
            return Err(Reject::TooManyTags(tags.len()));
        }
        let series = Series::new(metric, tags).map_err(Reject::Name)?;
        let id = match self.by_series.get(&series) {
            Some(&id) => id,
            None => {
                if self.series.len() >= limits.max_series {
                    return Err(Reject::SeriesLimit(self.series.len()));
                }
                self.insert_series(series, spec)
            }
        };
        stats.dropped_tags += u64::from(dropped);
        if key.len() > MAX_ALIAS_KEY {
            return Ok(id);
        }
        // A sender that varies its spelling endlessly must not grow memory without bound.
        if self.aliases.len() >= 4 * limits.max_series + 1024 {
            self.aliases.clear();
        }
        self.aliases.insert(
            key.into(),
            Alias {
                id,
                dropped_tags: dropped,
            },
        );
        Ok(id)
    }

    pub(super) fn spec(&self, metric: &str) -> Arc<MetricSpec> {
        Arc::clone(self.specs.get(metric).unwrap_or(&self.default_spec))
    }

    pub(super) fn insert_series(&mut self, series: Series, spec: Arc<MetricSpec>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.by_series.insert(series.clone(), id);
        self.series.insert(
            id,
            SeriesSlot {
                wire: v1::Series::from(&series),
                series,
                spec,
                hours: 0,
            },
        );
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::testing::{NOW, add, hour, table};
    use hourglass_sketch::Sketch;
    use hourglass_sketch::format::Kind;

    #[test]
    fn tags_in_any_order_are_one_series() {
        let mut t = table();
        add(&mut t, "visitors", "b:2,a:1", "u1", NOW).unwrap();
        add(&mut t, "visitors", "a:1,b:2", "u2", NOW).unwrap();
        assert_eq!(t.series_count(), 1);
        let e = t.entry("visitors{a=1,b=2}", hour(NOW)).unwrap();
        let kinds: Vec<Kind> = e.sketches.iter().map(Sketch::kind).collect();
        assert_eq!(kinds, vec![Kind::Distinct, Kind::Frequency]);
        match &e.sketches[0] {
            Sketch::Distinct(d) => assert_eq!(d.estimate().estimate.round(), 2.0),
            _ => unreachable!(),
        }
    }

    #[test]
    fn disallowed_tags_are_dropped_and_counted() {
        let mut t = table();
        let mut stats = IngestStats::default();
        let a = t
            .resolve_statsd("pages", "region:eu,user:42", &mut stats)
            .unwrap();
        let b = t
            .resolve_statsd("pages", "region:eu,user:42", &mut stats)
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(stats.dropped_tags, 2, "counted per event, also when cached");
        t.insert(a, NOW, NOW, b"/cart", 1).unwrap();
        let e = t.entry("pages{region=eu}", hour(NOW)).unwrap();
        assert!(matches!(&e.sketches[..], [Sketch::Membership(b)] if b.contains(b"/cart")));
    }

    #[test]
    fn limits_and_names_are_enforced() {
        let mut t = table();
        for m in ["a", "b", "c"] {
            add(&mut t, m, "", "x", NOW).unwrap();
        }
        assert_eq!(
            add(&mut t, "d", "", "x", NOW).unwrap_err(),
            Reject::SeriesLimit(3)
        );
        // Known series still take events.
        add(&mut t, "a", "", "y", NOW).unwrap();
        assert_eq!(
            add(&mut t, "9bad", "", "x", NOW).unwrap_err().reason(),
            "bad_metric"
        );
        assert_eq!(
            add(&mut t, "a", "k:1,k:2", "x", NOW).unwrap_err().reason(),
            "duplicate_tag"
        );
        let many: Vec<String> = (0..17).map(|i| format!("k{i}:v")).collect();
        assert_eq!(
            add(&mut t, "a", &many.join(","), "x", NOW)
                .unwrap_err()
                .reason(),
            "too_many_tags"
        );
    }

    #[test]
    fn series_that_never_got_an_event_are_let_go() {
        let mut t = table();
        let mut stats = IngestStats::default();
        t.resolve_statsd("a", "", &mut stats).unwrap();
        t.resolve_statsd("b", "", &mut stats).unwrap();
        assert_eq!(t.series_count(), 2);
        t.free_closed(NOW);
        assert_eq!(t.series_count(), 0);
        let many: Vec<String> = (0..65).map(|i| format!("k{i}:v")).collect();
        let e = t
            .resolve_statsd("pages", &many.join(","), &mut stats)
            .unwrap_err();
        assert_eq!(
            e,
            Reject::TooManyTags(65),
            "checked before the allowed keys filter"
        );
    }
}
