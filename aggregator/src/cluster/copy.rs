//! Catch-up (DESIGN §10): a node whose store lacks messages the stream no longer keeps
//! (`max_age`) — a new or wiped node, one down for longer than that — copies what they
//! left from a node that has them (the `Peer.Copy` stream), then applies the stream from
//! its start.
//!
//! The source first reads the positions it has applied, then streams what its store holds:
//! every message up to those positions is in the copy. The copy is written with the
//! store's own rules (the version upsert for rows; the index and live hours are unions), so
//! it overlaps harmlessly with the stream's messages the receiver applies afterwards. Names,
//! not ids, cross the wire: ids are each store's own.
//!
//! - a partition's copy: every hourly row of its series, and for each day hourly
//!   retention deleted, that day's rollups;
//! - the live subject's copy: every server with its labels, live hours and series index.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use hourglass_rpc::proto::Bytes;
use hourglass_rpc::proto::v1;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::{Cluster, LIVE};
use crate::convert;
use crate::keys::{Day, DayKey, Epoch, Hour, HourKey, SeriesId, ServerId};
use crate::store::{SeriesName, Store, StoreError};

/// About how many bytes of sketches go in one chunk of a copy.
const CHUNK_BYTES: usize = 1 << 20;

/// The chunks of a copy as the Peer service streams them.
pub(crate) type CopyStream = ReceiverStream<Result<v1::CopyChunk, Status>>;

/// The source's side: streams this node's rows of `partitions` (each one it is ready
/// for, checked by the caller) and, with `live`, its live state, once it applied each to
/// the stream's end.
pub(crate) async fn serve(
    cluster: &Cluster,
    store: &Arc<dyn Store>,
    partitions: Vec<u32>,
    live: bool,
) -> Result<CopyStream, Status> {
    let me = cluster.members().me();
    if live && !cluster.barrier().live_complete() {
        return Err(Status::failed_precondition(format!(
            "node {me} lacks live messages the stream no longer keeps itself"
        )));
    }
    // The stream's end, then each subject applied to the end as it was delivered after
    // that: every message up to `last` of each is in what the store holds after.
    let last = cluster
        .stream_last_sequence()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let deadline = std::time::Instant::now() + cluster.config().peer_timeout / 2;
    let mut subjects = partitions.clone();
    if live {
        subjects.push(LIVE);
    }
    let mut applied = HashMap::new();
    for p in subjects {
        let behind = |e: String| Status::unavailable(format!("node {me}, partition {p}: {e}"));
        super::barrier::caught_up(cluster, p, deadline)
            .await
            .map_err(behind)?;
        applied.insert(p, last);
    }
    let count = cluster.config().partitions;
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    let store = Arc::clone(store);
    tokio::task::spawn_blocking(move || {
        let mut out = Chunks {
            tx: &tx,
            chunk: v1::CopyChunk {
                applied,
                ..Default::default()
            },
            bytes: 0,
        };
        let wanted = |name: &SeriesName| partitions.contains(&super::partition(name, count));
        let read = read_store(store.as_ref(), live, &wanted, &mut out).and_then(|()| {
            out.chunk.done = true;
            out.flush()
        });
        if let Err(Stop::Store(e)) = read {
            let _ = tx.blocking_send(Err(convert::store_status(&e)));
        }
    });
    Ok(ReceiverStream::new(rx))
}

/// Why a source stopped reading its store.
enum Stop {
    Store(StoreError),
    /// The receiver went away.
    Gone,
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Store(e)
    }
}

/// A copy being cut into chunks of about [`CHUNK_BYTES`].
struct Chunks<'a> {
    tx: &'a tokio::sync::mpsc::Sender<Result<v1::CopyChunk, Status>>,
    chunk: v1::CopyChunk,
    bytes: usize,
}

impl Chunks<'_> {
    /// Counts `bytes` more into the chunk, sending it once full.
    fn grew(&mut self, bytes: usize) -> Result<(), Stop> {
        self.bytes += bytes;
        if self.bytes >= CHUNK_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Stop> {
        let chunk = std::mem::take(&mut self.chunk);
        self.bytes = 0;
        self.tx.blocking_send(Ok(chunk)).map_err(|_| Stop::Gone)
    }
}

/// Reads what the copy holds out of `store` into `out`: the live state with `live`, then
/// the rows and expired days of the series `wanted` selects.
fn read_store(
    store: &dyn Store,
    live: bool,
    wanted: &dyn Fn(&SeriesName) -> bool,
    out: &mut Chunks,
) -> Result<(), Stop> {
    let series: HashMap<_, _> = store.list_series()?.into_iter().collect();
    let servers = store.list_servers()?;
    let server_names: HashMap<ServerId, &str> =
        servers.iter().map(|s| (s.id, s.name.as_str())).collect();
    if live {
        read_servers(store, &series, &servers, out)?;
    }
    let mut ids: Vec<_> = series.iter().filter(|(_, n)| wanted(n)).collect();
    ids.sort_by_key(|(id, _)| **id);
    for (&id, name) in ids {
        let (wire, kind) = (
            v1::Series::from(name),
            v1::SketchKind::from(name.kind) as i32,
        );
        let mut stopped = Ok(());
        store.scan_hourly(id, Hour(0)..Hour(u32::MAX), &mut |key, stored| {
            out.chunk.rows.push(v1::CopiedRow {
                series: Some(wire.clone()),
                kind,
                hour: key.hour.0,
                server: server_names.get(&key.server).copied().unwrap_or("").into(),
                epoch: key.epoch.0,
                version: stored.version,
                sketch: Bytes::from(stored.sketch.clone()),
            });
            stopped = out.grew(stored.sketch.len() + 64);
            stopped.is_ok()
        })?;
        stopped?;
        let mut days: BTreeMap<Day, Vec<v1::CopiedRollup>> = BTreeMap::new();
        store.scan_rollups(id, Day(0)..Day(u32::MAX), &mut |key, sketch| {
            days.entry(key.day).or_default().push(v1::CopiedRollup {
                server: if key.server == ServerId::ALL {
                    String::new()
                } else {
                    server_names.get(&key.server).copied().unwrap_or("").into()
                },
                sketch: sketch.to_vec(),
            });
            true
        })?;
        for (day, rollups) in days {
            if !store.is_day_expired(id, day)? {
                continue; // its hours are copied: the receiver builds its rollups itself
            }
            let bytes = rollups.iter().map(|r| r.sketch.len() + 32).sum();
            out.chunk.days.push(v1::CopiedDay {
                series: Some(wire.clone()),
                kind,
                day: day.0,
                rollups,
            });
            out.grew(bytes)?;
        }
    }
    Ok(())
}

/// Reads every server of `servers` into `out`: its labels, live hours and series index.
fn read_servers(
    store: &dyn Store,
    series: &HashMap<SeriesId, SeriesName>,
    servers: &[crate::store::ServerEntry],
    out: &mut Chunks,
) -> Result<(), Stop> {
    for server in servers {
        let live_hours = live_hours(store, server.id)?;
        let index: Vec<v1::CopiedIndex> = store
            .server_series(server.id, Day(0))?
            .into_iter()
            .filter_map(|(id, day)| {
                let name = series.get(&id)?;
                Some(v1::CopiedIndex {
                    series: Some(v1::Series::from(name)),
                    kind: v1::SketchKind::from(name.kind) as i32,
                    day: day.0,
                })
            })
            .collect();
        let bytes = 64 * index.len() + 4 * live_hours.len();
        out.chunk.servers.push(v1::CopiedServer {
            server: Some(v1::Server::with_labels(&server.name, &server.labels)),
            live_hours,
            index,
        });
        out.grew(bytes)?;
    }
    Ok(())
}

/// Every hour `server` was recorded live, in order.
fn live_hours(store: &dyn Store, server: ServerId) -> Result<Vec<u32>, StoreError> {
    let Some(span) = store.live_span(server)? else {
        return Ok(Vec::new());
    };
    let mut hours = Vec::new();
    for day in span.start.day().0..=Hour(span.end.0.saturating_sub(1)).day().0 {
        let first = day.saturating_mul(24);
        if store.live_hours(server, Hour(first)..Hour(first.saturating_add(24)))? == 0 {
            continue;
        }
        for h in first..first.saturating_add(24) {
            if store.live_hours(server, Hour(h)..Hour(h + 1))? > 0 {
                hours.push(h);
            }
        }
    }
    Ok(hours)
}

/// The receiver's side: copies `p` (or the live subject, [`LIVE`]) from the first other
/// node that can give it, into `store`. Returns the position the copy reflects, or why no
/// node could.
pub(crate) async fn fetch(
    cluster: &Cluster,
    store: &Arc<dyn Store>,
    p: u32,
) -> Result<u64, String> {
    let me = cluster.members().me();
    let sources: Vec<(String, String)> = if p == LIVE {
        cluster
            .members()
            .members()
            .into_values()
            .filter(|m| m.node != me)
            .map(|m| (m.node, m.advertise))
            .collect()
    } else {
        cluster
            .members()
            .candidates(p)
            .into_iter()
            .filter(|c| c.node != me)
            .map(|c| (c.node, c.advertise))
            .collect()
    };
    let mut why = vec![];
    for (node, advertise) in sources {
        match copy_from(cluster, store, &advertise, p).await {
            Ok(at) => {
                tracing::info!(partition = p, from = %node, applied_to = at, "copied what the stream no longer keeps");
                return Ok(at);
            }
            Err(e) => why.push(format!("{node}: {e}")),
        }
    }
    if why.is_empty() {
        why.push("no other node is ready for it".into());
    }
    Err(why.join("; "))
}

/// Copies `p` from the node at `advertise`.
async fn copy_from(
    cluster: &Cluster,
    store: &Arc<dyn Store>,
    advertise: &str,
    p: u32,
) -> Result<u64, String> {
    let request = v1::CopyRequest {
        partitions: if p == LIVE { vec![] } else { vec![p] },
        live: p == LIVE,
        partition_count: cluster.config().partitions,
    };
    let mut chunks = cluster
        .peers()
        .copy(advertise, request)
        .await
        .map_err(|s| s.message().to_string())?;
    let wait = cluster.config().peer_timeout;
    let mut at = None;
    loop {
        let chunk = match tokio::time::timeout(wait, chunks.message()).await {
            Err(_) => return Err(format!("no chunk within {wait:?}")),
            Ok(Err(status)) => return Err(status.message().to_string()),
            Ok(Ok(None)) => return Err("the copy ended before its last chunk".into()),
            Ok(Ok(Some(chunk))) => chunk,
        };
        let done = chunk.done;
        if at.is_none() {
            at = Some(
                *chunk
                    .applied
                    .get(&p)
                    .ok_or("its first chunk names no position")?,
            );
        }
        let store = Arc::clone(store);
        // The copy's labels are the source's as of its position: they replace a known
        // server's only if this node has not applied the live subject further itself.
        let with_labels = at.unwrap_or(0) >= cluster.applied(LIVE);
        tokio::task::spawn_blocking(move || write_chunk(store.as_ref(), chunk, with_labels))
            .await
            .map_err(|e| format!("the copy's write failed: {e}"))??;
        if done {
            return at.ok_or_else(|| "it sent nothing".into());
        }
    }
}

/// Writes one chunk of a copy into `store`; `labels` says whether a known server's
/// labels are replaced by the copy's.
fn write_chunk(store: &dyn Store, chunk: v1::CopyChunk, labels: bool) -> Result<(), String> {
    // A push's hours are at most the next one; a copy's come from pushes.
    let now = hourglass_rpc::time::since_unix_epoch().as_secs() / 3600;
    let mut writer = ChunkWriter {
        store,
        latest: u32::try_from(now).unwrap_or(u32::MAX - 1).saturating_add(1),
        series_ids: HashMap::new(),
        servers: HashMap::new(),
    };
    writer.servers(&chunk.servers, labels)?;
    writer.rows(chunk.rows)?;
    writer.days(chunk.days)
}

/// What the copy holds: `what`.
fn bad(what: String) -> String {
    format!("the copy holds {what}")
}

/// A store error while writing a copy.
fn stored(e: StoreError) -> String {
    format!("writing the copy: {e}")
}

/// Writes the parts of one chunk, with the ids it has met.
struct ChunkWriter<'a> {
    store: &'a dyn Store,
    /// The latest hour a copy may hold.
    latest: u32,
    series_ids: HashMap<SeriesName, SeriesId>,
    servers: HashMap<String, ServerId>,
}

impl ChunkWriter<'_> {
    /// Hour `h` of `what`, if it is not after the latest a push may hold.
    fn hour(&self, h: u32, what: &str) -> Result<Hour, String> {
        if h > self.latest {
            Err(bad(format!(
                "{what} hour {h}, after the next hour {}",
                self.latest
            )))
        } else {
            Ok(Hour(h))
        }
    }

    /// The id of a copied series, made if unknown.
    fn series_id(
        &mut self,
        series: Option<&v1::Series>,
        kind: i32,
        what: &str,
    ) -> Result<SeriesId, String> {
        let name = series_name(series, kind).map_err(|e| bad(format!("{what}: {e}")))?;
        if let Some(&id) = self.series_ids.get(&name) {
            return Ok(id);
        }
        let id = self.store.series_id_or_create(&name).map_err(stored)?;
        self.series_ids.insert(name, id);
        Ok(id)
    }

    /// The servers, with their live hours and series index.
    fn servers(&mut self, servers: &[v1::CopiedServer], labels: bool) -> Result<(), String> {
        for (i, s) in servers.iter().enumerate() {
            let server = s
                .server
                .as_ref()
                .ok_or_else(|| bad(format!("servers[{i}] without a server")))?;
            let id = server_id(self.store, server, labels)
                .map_err(|e| bad(format!("servers[{i}]: {e}")))?;
            let hours = s
                .live_hours
                .iter()
                .map(|&h| self.hour(h, &format!("servers[{i}] live")))
                .collect::<Result<Vec<_>, _>>()?;
            let mut held = Vec::with_capacity(s.index.len());
            for (j, entry) in s.index.iter().enumerate() {
                let what = format!("servers[{i}].index[{j}]");
                held.push((
                    self.series_id(entry.series.as_ref(), entry.kind, &what)?,
                    Day(entry.day),
                ));
            }
            self.store
                .put_index(Some((id, &hours)), id, &held)
                .map_err(stored)?;
        }
        Ok(())
    }

    /// The hourly rows.
    fn rows(&mut self, rows: Vec<v1::CopiedRow>) -> Result<(), String> {
        let mut batch = Vec::with_capacity(rows.len());
        for (i, row) in rows.into_iter().enumerate() {
            let what = format!("rows[{i}]");
            let series = self.series_id(row.series.as_ref(), row.kind, &what)?;
            let server = named_server(self.store, &mut self.servers, &row.server)
                .map_err(|e| bad(format!("{what}: {e}")))?;
            let key = HourKey {
                series,
                hour: self.hour(row.hour, &what)?,
                server,
                epoch: Epoch(row.epoch),
            };
            batch.push((key, row.version, row.sketch));
        }
        if batch.is_empty() {
            return Ok(());
        }
        // A day this store's retention expired gets its hours back, all of them (the
        // source holds every row of the day): its rollups are then rebuilt from them,
        // not kept as they were with these rows counted late.
        let days: BTreeSet<(SeriesId, Day)> = batch
            .iter()
            .map(|(k, _, _)| (k.series, k.hour.day()))
            .collect();
        for (series, day) in days {
            if self.store.is_day_expired(series, day).map_err(stored)? {
                self.store.unexpire_day(series, day).map_err(stored)?;
            }
        }
        self.store.put_hourly(&batch).map_err(stored)?;
        Ok(())
    }

    /// The day rollups.
    fn days(&mut self, days: Vec<v1::CopiedDay>) -> Result<(), String> {
        for (i, day) in days.into_iter().enumerate() {
            let what = format!("days[{i}]");
            let series = self.series_id(day.series.as_ref(), day.kind, &what)?;
            let mut rollups = Vec::with_capacity(day.rollups.len());
            for r in day.rollups {
                let server = if r.server.is_empty() {
                    ServerId::ALL
                } else {
                    named_server(self.store, &mut self.servers, &r.server)
                        .map_err(|e| bad(format!("{what}: {e}")))?
                };
                let key = DayKey {
                    series,
                    day: Day(day.day),
                    server,
                };
                rollups.push((key, r.sketch));
            }
            self.store
                .put_copied_day(series, Day(day.day), rollups)
                .map_err(stored)?;
        }
        Ok(())
    }
}

/// The id of a copied server, registered if unknown; its labels replace the held ones
/// only with `labels`.
fn server_id(store: &dyn Store, server: &v1::Server, labels: bool) -> Result<ServerId, String> {
    hourglass_rpc::series::validate_server_name(&server.name)
        .map_err(|e| format!("server name {:?}: {e}", server.name))?;
    let wanted = crate::write::checked_labels(server).map_err(|s| s.message().to_string())?;
    match store.server_id(&server.name).map_err(|e| e.to_string())? {
        Some(id) if !labels => Ok(id),
        _ => store
            .register_server(&server.name, &wanted)
            .map_err(|e| e.to_string()),
    }
}

/// The id of the server a row names (registered without labels if unknown: its labels
/// come with the live state).
fn named_server(
    store: &dyn Store,
    known: &mut HashMap<String, ServerId>,
    name: &str,
) -> Result<ServerId, String> {
    if let Some(&id) = known.get(name) {
        return Ok(id);
    }
    hourglass_rpc::series::validate_server_name(name)
        .map_err(|e| format!("server name {name:?}: {e}"))?;
    let id = match store.server_id(name).map_err(|e| e.to_string())? {
        Some(id) => id,
        None => store
            .register_server(name, &[])
            .map_err(|e| e.to_string())?,
    };
    known.insert(name.to_string(), id);
    Ok(id)
}

/// The series a Peer message names, checked as a push's are.
pub(crate) fn series_name(series: Option<&v1::Series>, kind: i32) -> Result<SeriesName, String> {
    let series = series.ok_or("the series is missing")?;
    let series = hourglass_rpc::series::Series::try_from(series).map_err(|e| e.to_string())?;
    let kind = convert::kind(kind, "kind")?;
    Ok(SeriesName::new(
        series.metric(),
        series.tags().to_vec(),
        kind,
    ))
}

#[cfg(test)]
mod tests {
    //! What a receiver holds after a catch-up copy, against its source.

    use std::collections::{BTreeMap, BTreeSet};

    use hourglass_sketch::hll::Hll;

    use super::*;
    use crate::store::{Dictionaries, Hourly, MemoryStore, Retention, Rollups, ServerIndex};

    fn hll(items: std::ops::Range<u64>) -> Vec<u8> {
        let mut h = Hll::new(8).unwrap();
        for i in items {
            h.insert(&i.to_le_bytes());
        }
        h.encode()
    }

    fn name(page: &str) -> SeriesName {
        SeriesName::new(
            "visits",
            vec![("page".to_string(), page.to_string())],
            hourglass_sketch::Kind::Distinct,
        )
    }

    /// Copies everything `source` holds (live state too) into `receiver`, through the
    /// chunks the Peer service would send.
    fn copy(source: &dyn Store, receiver: &dyn Store) {
        let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
        {
            let mut out = Chunks {
                tx: &tx,
                chunk: v1::CopyChunk::default(),
                bytes: 0,
            };
            let all = |_: &SeriesName| true;
            if read_store(source, true, &all, &mut out)
                .and_then(|()| out.flush())
                .is_err()
            {
                panic!("reading the source failed");
            }
        }
        drop(tx);
        while let Ok(chunk) = rx.try_recv() {
            write_chunk(receiver, chunk.unwrap(), true).unwrap();
        }
    }

    /// One row: (series, hour, server, epoch, version, sketch), by names.
    type Row = (SeriesName, u32, String, u64, u64, Vec<u8>);

    /// A server's live span (start, end) and live hours.
    type Live = (Option<(u32, u32)>, Vec<u32>);

    /// Everything a store holds, by names (ids are each store's own).
    #[derive(Debug, PartialEq, Eq)]
    struct Held {
        servers: BTreeMap<String, Vec<(String, String)>>,
        live: BTreeMap<String, Live>,
        index: BTreeMap<String, Vec<(SeriesName, u32)>>,
        rows: Vec<Row>,
        rollups: Vec<(SeriesName, u32, String, Vec<u8>)>,
        expired: BTreeSet<(SeriesName, u32)>,
    }

    fn held(store: &dyn Store, hours: std::ops::Range<u32>) -> Held {
        let series: BTreeMap<_, _> = store.list_series().unwrap().into_iter().collect();
        let servers = store.list_servers().unwrap();
        let server_name = |id: ServerId| {
            if id == ServerId::ALL {
                "*".to_string()
            } else {
                servers.iter().find(|s| s.id == id).unwrap().name.clone()
            }
        };
        let mut h = Held {
            servers: BTreeMap::new(),
            live: BTreeMap::new(),
            index: BTreeMap::new(),
            rows: Vec::new(),
            rollups: Vec::new(),
            expired: BTreeSet::new(),
        };
        for s in &servers {
            h.servers.insert(s.name.clone(), s.labels.clone());
            let span = store.live_span(s.id).unwrap().map(|r| (r.start.0, r.end.0));
            let live = hours
                .clone()
                .filter(|&x| store.live_hours(s.id, Hour(x)..Hour(x + 1)).unwrap() > 0)
                .collect();
            h.live.insert(s.name.clone(), (span, live));
            let mut index: Vec<_> = store
                .server_series(s.id, Day(0))
                .unwrap()
                .into_iter()
                .map(|(id, day)| (series[&id].clone(), day.0))
                .collect();
            index.sort();
            h.index.insert(s.name.clone(), index);
        }
        for (&id, n) in &series {
            store
                .scan_hourly(id, Hour(0)..Hour(u32::MAX), &mut |k, v| {
                    h.rows.push((
                        n.clone(),
                        k.hour.0,
                        server_name(k.server),
                        k.epoch.0,
                        v.version,
                        v.sketch.clone(),
                    ));
                    true
                })
                .unwrap();
            store
                .scan_rollups(id, Day(0)..Day(u32::MAX), &mut |k, v| {
                    h.rollups
                        .push((n.clone(), k.day.0, server_name(k.server), v.to_vec()));
                    true
                })
                .unwrap();
            for day in hours.start / 24..hours.end / 24 {
                if store.is_day_expired(id, Day(day)).unwrap() {
                    h.expired.insert((n.clone(), day));
                }
            }
        }
        h.rows.sort();
        h.rollups.sort();
        h
    }

    /// The copy of a source holding two servers with labels, live hours and rows over a
    /// day past hourly retention (rollups only) and a day within it: once the receiver
    /// built its rollups, it holds what the source holds.
    #[test]
    fn a_copy_holds_what_the_source_holds() {
        round_trip(&MemoryStore::new(), &MemoryStore::new());
    }

    fn rocks(dir: &tempfile::TempDir, name: &str) -> crate::store::RocksStore {
        crate::store::RocksStore::open(dir.path().join(name), &Default::default()).unwrap()
    }

    /// [`a_copy_holds_what_the_source_holds`] between RocksDB stores (what nodes run).
    #[test]
    fn a_copy_between_rocks_stores_holds_what_the_source_holds() {
        let dir = tempfile::tempdir().unwrap();
        round_trip(&rocks(&dir, "source"), &rocks(&dir, "receiver"));
    }

    fn round_trip(source: &dyn Store, receiver: &dyn Store) {
        let (old, new) = (Day(100), Day(200));
        let env = |v: &str| vec![("env".to_string(), v.to_string())];
        let w1 = source.register_server("web-1", &env("prod")).unwrap();
        let w2 = source.register_server("web-2", &env("dev")).unwrap();
        let a = source.series_id_or_create(&name("a")).unwrap();
        let b = source.series_id_or_create(&name("b")).unwrap();
        let mut n = 0;
        for (server, hours) in [(w1, [1u32, 2, 5]), (w2, [2, 3, 7])] {
            for day in [old, new] {
                let live: Vec<Hour> = hours.iter().map(|h| Hour(day.0 * 24 + h)).collect();
                let rows: Vec<(HourKey, u64, Bytes)> = [a, b]
                    .iter()
                    .flat_map(|&series| live.iter().map(move |&hour| (series, hour)))
                    .map(|(series, hour)| {
                        n += 1;
                        let key = HourKey {
                            series,
                            hour,
                            server,
                            epoch: Epoch(7),
                        };
                        (key, 3, Bytes::from(hll(n * 10..n * 10 + 25)))
                    })
                    .collect();
                source.put_push(Some((server, &live)), &rows).unwrap();
            }
        }
        crate::rollup::build_dirty_days(source, Day(1000), 1000).unwrap();
        source
            .delete_hourly_before(Day(150), &BTreeSet::new())
            .unwrap();
        // A label change after the rows.
        source.register_server("web-2", &env("staging")).unwrap();

        copy(source, receiver);
        crate::rollup::build_dirty_days(receiver, Day(1000), 1000).unwrap();
        let hours = old.0 * 24..(new.0 + 1) * 24;
        let (want, got) = (held(source, hours.clone()), held(receiver, hours));
        assert!(!want.expired.is_empty() && !want.rows.is_empty());
        assert_eq!(want.servers, got.servers, "labels");
        assert_eq!(want.live, got.live, "live hours");
        assert_eq!(want.index, got.index, "series index");
        assert_eq!(want.rows, got.rows, "rows");
        assert_eq!(want.expired, got.expired, "expired days");
        assert_eq!(want.rollups, got.rollups, "rollups");
    }

    /// A receiver whose own retention already expired a day (its store rolled the day up
    /// from the rows it had, then deleted them) while the source still holds that day's
    /// hourly rows (its retention pass has not run yet): the copy sends the rows, the
    /// receiver counts them as late rows of an expired day and keeps its own rollup,
    /// which lacks the row it missed. The day then answers without it, with nothing said.
    #[test]
    fn a_day_the_receiver_expired_takes_the_copied_rows() {
        let day = Day(100);
        let (first, second) = (Hour(day.0 * 24 + 1), Hour(day.0 * 24 + 2));
        let row = |store: &MemoryStore, hour: Hour, items| {
            let server = store.register_server("web-1", &[]).unwrap();
            let series = store.series_id_or_create(&name("a")).unwrap();
            let key = HourKey {
                series,
                hour,
                server,
                epoch: Epoch(1),
            };
            store
                .put_push(
                    Some((server, &[hour])),
                    &[(key, 1, Bytes::from(hll(items)))],
                )
                .unwrap();
        };
        // The source applied both rows; its retention has not reached the day yet.
        let source = MemoryStore::new();
        row(&source, first, 0..100);
        row(&source, second, 1000..1100);
        crate::rollup::build_dirty_days(&source, Day(1000), 1000).unwrap();
        // The receiver missed the second row (the stream dropped it) and its retention
        // expired the day.
        let receiver = MemoryStore::new();
        row(&receiver, first, 0..100);
        crate::rollup::build_dirty_days(&receiver, Day(1000), 1000).unwrap();
        receiver
            .delete_hourly_before(day.next(), &BTreeSet::new())
            .unwrap();
        copy(&source, &receiver);
        crate::rollup::build_dirty_days(&receiver, Day(1000), 1000).unwrap();
        let all = |store: &MemoryStore| {
            let series = store.series_id(&name("a")).unwrap().unwrap();
            store
                .get_rollup(DayKey {
                    series,
                    day,
                    server: ServerId::ALL,
                })
                .unwrap()
        };
        assert_eq!(
            all(&receiver),
            all(&source),
            "after the copy, the receiver's rollup of the day is not the source's: the copied row is dropped as late"
        );
    }

    /// A copy's live hours are written unchecked (a push's are bounded to the hours
    /// accepted now); one at the end of time makes the receiver's own reads of its store
    /// panic (`live_span` adds one to the last hour), e.g. when it serves a copy or a query.
    #[test]
    fn copied_live_hours_cannot_make_the_receiver_panic() {
        let dir = tempfile::tempdir().unwrap();
        let receiver = rocks(&dir, "receiver");
        let chunk = v1::CopyChunk {
            servers: vec![v1::CopiedServer {
                server: Some(v1::Server {
                    name: "web-1".into(),
                    labels: vec![],
                }),
                live_hours: vec![u32::MAX],
                index: vec![],
            }],
            ..Default::default()
        };
        let written = write_chunk(&receiver, chunk, true);
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let id = receiver.server_id("web-1").unwrap().unwrap();
            receiver.live_span(id).map(drop)
        }));
        assert!(
            written.is_err() || read.is_ok(),
            "the copy was written ({written:?}) and reading the receiver's live span then panics"
        );
    }
}
