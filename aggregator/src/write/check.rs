//! The rules a push keeps before anything of it is stored, those that need only the push
//! and the bounds: each snapshot's (its hour, series, version and sketch), and the
//! server's (its name, its labels). A snapshot that breaks one is refused alone, with a
//! reason naming the field ([`Rejection`]); a server that breaks one refuses the whole
//! push. The writer runs them, with the rules that need its clock and its counters (the
//! push's size, its live hours, the hours accepted now: [`super::Writer::checked_request`]).

use hourglass_rpc::proto::v1;
use hourglass_rpc::series::Series;
use hourglass_sketch::Sketch;
use tonic::Status;

use crate::config::LimitsConfig;
use crate::convert;
use crate::keys::Hour;
use crate::store::SeriesName;

/// A snapshot that passed every check, ready for the store.
pub(crate) struct Valid {
    /// Its index in the push.
    pub(crate) index: usize,
    /// Its series.
    pub(crate) name: SeriesName,
    /// Its hour.
    pub(crate) hour: Hour,
    /// Its epoch.
    pub(crate) epoch: u64,
    /// Its version.
    pub(crate) version: u64,
    /// Its sketch's bytes, taken out of the request.
    pub(super) sketch: hourglass_rpc::proto::Bytes,
}

/// A snapshot refused: the rule (a metric label) and the reason for the agent.
pub(crate) struct Rejection {
    pub(super) rule: &'static str,
    pub(super) reason: String,
}

/// A snapshot refused under `rule`, for `reason`.
pub(crate) fn reject(rule: &'static str, reason: String) -> Rejection {
    Rejection { rule, reason }
}

/// Checks one snapshot, taking its sketch bytes out of the request without copying.
pub(crate) fn check_snapshot(
    i: usize,
    snapshot: &mut v1::Snapshot,
    limits: &LimitsConfig,
    hours: &std::ops::RangeInclusive<u32>,
) -> Result<Valid, Rejection> {
    // An hour ahead of the clock (beyond the next) is a broken agent clock; one older
    // than hourly retention would be deleted at once, and would revive a deleted hour.
    if !hours.contains(&snapshot.hour) {
        return Err(reject(
            "hour",
            format!(
                "snapshots[{i}].hour {} ({}) is outside the hours accepted now, {} to {} (from the start of the day retention.hourly back, to one hour ahead)",
                snapshot.hour,
                hourglass_rpc::time::format_hour(snapshot.hour.min(u32::MAX / 2)),
                hourglass_rpc::time::format_hour(*hours.start()),
                hourglass_rpc::time::format_hour(*hours.end()),
            ),
        ));
    }
    let series = snapshot
        .series
        .as_ref()
        .ok_or_else(|| reject("series", format!("snapshots[{i}].series is missing")))?;
    let series = Series::try_from(series)
        .map_err(|e| reject("series", format!("snapshots[{i}].series: {e}")))?;
    if snapshot.version == 0 {
        return Err(reject(
            "version",
            format!("snapshots[{i}].version is 0: versions start at 1"),
        ));
    }
    let sketch = snapshot
        .sketch
        .as_mut()
        .ok_or_else(|| reject("sketch", format!("snapshots[{i}].sketch is missing")))?;
    let kind = convert::kind(sketch.kind, &format!("snapshots[{i}].sketch.kind"))
        .map_err(|reason| reject("sketch.kind", reason))?;
    let (max_sketch_bytes, setting) = limits.max_sketch_bytes(kind);
    if sketch.data.len() > max_sketch_bytes {
        return Err(reject(
            "sketch.size",
            format!(
                "snapshots[{i}].sketch.data is {} bytes, more than the limit of {max_sketch_bytes} for a {kind} sketch ({setting})",
                sketch.data.len()
            ),
        ));
    }
    // Every check of a full decode, not only the frame check the store does: a sketch
    // that cannot be merged later would make every query over its hour fail.
    let decoded = Sketch::validate(&sketch.data).map_err(|e| {
        reject(
            "sketch.data",
            format!("snapshots[{i}].sketch.data does not decode: {e}"),
        )
    })?;
    if decoded != kind {
        return Err(reject(
            "sketch.kind",
            format!(
                "snapshots[{i}].sketch.kind is {kind} but sketch.data holds a {} sketch",
                decoded
            ),
        ));
    }
    Ok(Valid {
        index: i,
        name: series_name(&series, kind),
        hour: Hour(snapshot.hour),
        epoch: snapshot.epoch,
        version: snapshot.version,
        sketch: std::mem::take(&mut sketch.data),
    })
}

/// The partition among `partitions` that `snapshot` is stored under in cluster mode
/// ([`crate::placement::partition`] of its series and kind), or `None` if its series or
/// sketch kind would fail [`check_snapshot`]. Cheap: it decodes no sketch.
pub(crate) fn snapshot_partition(snapshot: &v1::Snapshot, partitions: u32) -> Option<u32> {
    let series = Series::try_from(snapshot.series.as_ref()?).ok()?;
    let kind = convert::kind(snapshot.sketch.as_ref()?.kind, "sketch.kind").ok()?;
    Some(crate::placement::partition(
        &series_name(&series, kind),
        partitions,
    ))
}

/// The stored name of a checked series of sketch kind `kind`.
fn series_name(series: &Series, kind: hourglass_sketch::Kind) -> SeriesName {
    SeriesName::new(series.metric(), series.tags().to_vec(), kind)
}

/// What the checks of a whole push found ([`super::Writer::checked_request`]).
pub(crate) struct CheckedPush {
    /// The pushing server.
    pub(crate) server: v1::Server,
    /// Its labels, sorted.
    pub(crate) labels: Vec<(String, String)>,
    /// The hours a push may carry now.
    pub(crate) accepted_hours: std::ops::RangeInclusive<u32>,
    /// The hours its snapshots are checked against (any, from the stream).
    pub(super) checked_hours: std::ops::RangeInclusive<u32>,
    /// Its live hours that count.
    pub(crate) live: Vec<Hour>,
}

/// Checks the pushing server: the principal may push as it, and its name keeps the naming
/// rule (the agent checks the same rule at start, so an agent never runs with a name
/// every push of which would be refused here).
pub(super) fn checked_server(
    server: &v1::Server,
    principal: Option<&crate::auth::Principal>,
) -> Result<(), Status> {
    if let Some(principal) = principal {
        principal.may_push_as(&server.name)?;
    }
    hourglass_rpc::series::validate_server_name(&server.name)
        .map_err(|e| Status::invalid_argument(format!("server.name: {e}")))?;
    Ok(())
}

/// The server's labels, sorted; an error if a label key repeats.
pub(crate) fn checked_labels(server: &v1::Server) -> Result<Vec<(String, String)>, Status> {
    let mut labels = convert::pairs(&server.labels, "server.labels")?;
    labels.sort();
    if let Some(w) = labels.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Status::invalid_argument(format!(
            "server.labels: label {:?} appears more than once",
            w[0].0
        )));
    }
    Ok(labels)
}
