//! The series bound's decisions (`limits.max_series_per_server`, counted in the
//! [`super::ledger`]) and the store's write of a push: a snapshot of one series more than
//! the bound is refused and its series is not created; the rest are written in one
//! `put_push` with the server's live hours.

use std::collections::HashMap;

use super::check::{Rejection, Valid, reject};
use super::ledger::{Admission, Admit, SeriesLedger, Tentative};
use crate::keys::{Day, Epoch, Hour, HourKey};
use crate::store::{PutOutcome, SeriesName, Store};

/// Everything the blocking part of a push needs besides the snapshots.
pub(super) struct PushTarget {
    /// The pushing server's name.
    pub(super) server: String,
    /// Its labels, sorted.
    pub(super) labels: Vec<(String, String)>,
    /// Its live hours that count.
    pub(super) live_hours: Vec<Hour>,
    /// The oldest day hourly retention keeps: series last seen before it stop counting.
    pub(super) oldest_day: Day,
    /// `limits.max_series_per_server`.
    pub(super) max_series: usize,
    /// Cluster mode: the labels of a server already known are left alone; only the live
    /// subject, applied in the stream's order on every node, sets them, so every node
    /// ends with the latest push's labels whatever order its consumers run in.
    pub(super) keep_labels: bool,
}

/// The server's id, registering it (or, unless `keep_labels`, updating its labels).
fn server_of(
    store: &dyn Store,
    target: &PushTarget,
) -> Result<crate::keys::ServerId, crate::store::StoreError> {
    if target.keep_labels
        && let Some(id) = store.server_id(&target.server)?
    {
        return Ok(id);
    }
    store.register_server(&target.server, &target.labels)
}

/// The series bound's decision for each of `valid`, in order: the series' id, or how
/// many series the server holds when this one would be one too many. A refused series is
/// not created in the dictionary.
///
/// With `commit` false (cluster mode's entry) the ledger is only read: the series this
/// push would add are counted for the push alone, and the apply loop, which shares the
/// ledger, counts what the stream actually carries, in the stream's order.
fn admit(
    store: &dyn Store,
    ledger: &SeriesLedger,
    server_id: crate::keys::ServerId,
    target: &PushTarget,
    valid: &[Valid],
    commit: bool,
) -> Result<Vec<Result<crate::keys::SeriesId, usize>>, crate::store::StoreError> {
    ledger.with_server(store, server_id, target.oldest_day, |held| {
        if commit {
            decide(store, held, target, valid)
        } else {
            decide(store, &mut Tentative::new(held), target, valid)
        }
    })
}

/// [`admit`]'s decisions, recorded in `held`.
fn decide(
    store: &dyn Store,
    held: &mut impl Admit,
    target: &PushTarget,
    valid: &[Valid],
) -> Result<Vec<Result<crate::keys::SeriesId, usize>>, crate::store::StoreError> {
    let (oldest, limit) = (target.oldest_day, target.max_series);
    // Batches carry many hours of few series: look each series up once.
    let mut ids: HashMap<&SeriesName, Result<crate::keys::SeriesId, usize>> = HashMap::new();
    let mut decisions = Vec::with_capacity(valid.len());
    for v in valid {
        let day = v.hour.day();
        let decided = match ids.get(&v.name) {
            Some(Ok(id)) => {
                held.admit(*id, day, oldest, limit);
                Ok(*id)
            }
            Some(Err(full)) => Err(*full),
            None => {
                let decided = match store.series_id(&v.name)? {
                    Some(id) => match held.admit(id, day, oldest, limit) {
                        Admission::Held | Admission::New => Ok(id),
                        Admission::Full { held } => Err(held),
                    },
                    None if held.is_full(oldest, limit) => Err(held.len()),
                    None => {
                        let id = store.series_id_or_create(&v.name)?;
                        held.admit(id, day, oldest, limit);
                        Ok(id)
                    }
                };
                ids.insert(&v.name, decided);
                decided
            }
        };
        decisions.push(decided);
    }
    Ok(decisions)
}

/// The rejection of `v` by the series bound, the server holding `count` series.
fn over_series_bound(target: &PushTarget, v: &Valid, count: usize) -> Rejection {
    reject(
        "series_per_server",
        format!(
            "snapshots[{}]: server {:?} holds {count} series with data within retention.hourly and the limit is {} (limits.max_series_per_server); series {} would be one more",
            v.index, target.server, target.max_series, v.name
        ),
    )
}

/// Stores the valid snapshots of one push, with the server's live hours, in one write.
/// Returns, per snapshot of `valid` in order, what the store did or why the series bound
/// refused it.
pub(super) fn store_push(
    store: &dyn Store,
    ledger: &SeriesLedger,
    target: &PushTarget,
    valid: Vec<Valid>,
) -> Result<Vec<Result<PutOutcome, Rejection>>, crate::store::StoreError> {
    let server_id = server_of(store, target)?;
    let decisions = admit(store, ledger, server_id, target, &valid, true)?;
    let mut answers: Vec<Option<Result<PutOutcome, Rejection>>> = Vec::with_capacity(valid.len());
    let mut batch = Vec::with_capacity(valid.len());
    for (v, decision) in valid.into_iter().zip(decisions) {
        match decision {
            Ok(id) => {
                let key = HourKey {
                    series: id,
                    hour: v.hour,
                    server: server_id,
                    epoch: Epoch(v.epoch),
                };
                batch.push((key, v.version, v.sketch));
                answers.push(None);
            }
            Err(count) => answers.push(Some(Err(over_series_bound(target, &v, count)))),
        }
    }
    let live = (!target.live_hours.is_empty()).then_some((server_id, &target.live_hours[..]));
    let mut outcomes = store.put_push(live, &batch)?.into_iter();
    answers
        .into_iter()
        .map(|answer| match answer {
            Some(rejected) => Ok(rejected),
            None => outcomes.next().map(Ok).ok_or_else(|| {
                crate::store::StoreError::Engine(
                    "the store answered fewer outcomes than snapshots".into(),
                )
            }),
        })
        .collect()
}

/// Cluster mode's half of [`store_push`]: registers the server and applies the series
/// bound in this node's store and ledger (the apply loop shares the ledger), storing
/// nothing. Returns, per snapshot of `valid` in order, `None` to publish it or why the
/// bound refuses it.
pub(super) fn admit_push(
    store: &dyn Store,
    ledger: &SeriesLedger,
    target: &PushTarget,
    valid: &[Valid],
) -> Result<Vec<Option<Rejection>>, crate::store::StoreError> {
    let server_id = server_of(store, target)?;
    let decisions = admit(store, ledger, server_id, target, valid, false)?;
    Ok(valid
        .iter()
        .zip(decisions)
        .map(|(v, decision)| {
            decision
                .err()
                .map(|count| over_series_bound(target, v, count))
        })
        .collect())
}
