//! Where a series lives in cluster mode: its partition, fixed by its name alone, so that
//! every node of a cluster computes the same one (DESIGN §10). It sits below the planner
//! (which answers for some partitions only), the services (which publish by partition)
//! and the cluster itself.

use crate::store::SeriesName;

/// The partition of a series among `partitions`: `xxh3(placement key) mod partitions`
/// (`placement_key`: its kind, metric and sorted tags). Every node computes the same partition for the same series.
pub fn partition(series: &SeriesName, partitions: u32) -> u32 {
    let key = placement_key(series);
    (xxhash_rust::xxh3::xxh3_64(&key) % u64::from(partitions.max(1))) as u32
}

/// The bytes a series is placed by: its kind's format code, then the metric and the tags
/// sorted by key, each string as a big-endian u32 length and its UTF-8 bytes, the tags
/// after a big-endian u32 count. Part of the cluster's protocol, not of any store's
/// encoding: every node of a running cluster must compute the same bytes, so a change
/// moves every series to another partition (a test pins it).
fn placement_key(series: &SeriesName) -> Vec<u8> {
    let series = series.canonical();
    let put = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&u32::try_from(s.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    let mut out = vec![series.kind.code()];
    put(&mut out, &series.metric);
    out.extend_from_slice(
        &u32::try_from(series.tags.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    for (key, value) in &series.tags {
        put(&mut out, key);
        put(&mut out, value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hourglass_sketch::Kind;

    /// `partition` of `visitors` (distinct, no tags) and of `visitors{app=web,region=eu}`
    /// among 2^20 partitions, as every release computed them.
    const PINNED_PLAIN: u32 = 611_033;
    const PINNED_TAGGED: u32 = 975_230;

    #[test]
    fn the_partition_is_fixed_by_the_name_not_the_tag_order() {
        let a = SeriesName::new(
            "visitors",
            vec![("region".into(), "eu".into()), ("app".into(), "web".into())],
            Kind::Distinct,
        );
        let b = SeriesName {
            metric: "visitors".into(),
            tags: vec![("region".into(), "eu".into()), ("app".into(), "web".into())],
            kind: Kind::Distinct,
        };
        assert_eq!(partition(&a, 64), partition(&b, 64));
        // Pinned: a change of the key or the hash would move every series of a running
        // cluster to another partition.
        let plain = SeriesName::new("visitors", vec![], Kind::Distinct);
        assert_eq!(partition(&plain, 1 << 20), PINNED_PLAIN);
        assert_eq!(partition(&a, 1 << 20), PINNED_TAGGED);
    }

    /// Every kind, a tag key given twice (sorted by value), non-ASCII bytes and an empty
    /// name keep the partitions the store's encoding gave them before placement had a key
    /// of its own (computed apart from this code, from that encoding: kind code, then
    /// big-endian u32 lengths and UTF-8 bytes, the tags sorted after their count).
    #[test]
    fn every_kind_and_any_name_keeps_the_partition_the_store_encoding_gave() {
        let tagged = vec![("region".into(), "eu".into()), ("app".into(), "web".into())];
        let cases = [
            (
                SeriesName::new("visitors", tagged.clone(), Kind::Frequency),
                324_557,
            ),
            (
                SeriesName::new("visitors", tagged, Kind::Membership),
                11_435,
            ),
            (
                SeriesName::new(
                    "pages.vues",
                    vec![
                        ("pays".into(), "côte-d'ivoire".into()),
                        ("env".into(), "prod".into()),
                        ("env".into(), "canary".into()),
                    ],
                    Kind::Distinct,
                ),
                293_292,
            ),
            (SeriesName::new("", vec![], Kind::Distinct), 618_112),
        ];
        for (series, pinned) in cases {
            assert_eq!(partition(&series, 1 << 20), pinned, "{series}");
        }
    }

    #[test]
    fn series_spread_over_the_partitions() {
        let mut counts = [0u32; 16];
        for i in 0..16_000 {
            let s = SeriesName::new(format!("m{i}"), vec![], Kind::Distinct);
            counts[partition(&s, 16) as usize] += 1;
        }
        // 1000 expected per partition; binomial sd ~31: 6 sd either side.
        assert!(
            counts.iter().all(|&c| (810..=1190).contains(&c)),
            "{counts:?}"
        );
    }
}
