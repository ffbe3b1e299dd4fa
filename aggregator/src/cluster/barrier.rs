//! The read barrier: what a node must have applied before it answers for a partition, so
//! that every answer reflects every push acknowledged before the question was asked.
//!
//! A node's readiness for a partition says it once reached the end of the partition; it
//! does not say it is there *now*: a consumer that lags (a backlog after a restart, a
//! connection to NATS that stopped delivering) keeps its readiness for a while. So a
//! node answering for partitions first
//!
//! 1. reads its live consumer's position from JetStream, *after* the question arrived,
//!    and waits until it has applied the live subject up to the last message delivered
//!    by then, when nothing was left undelivered or the consumer had looked as far as
//!    the stream's last message after the question came (else it asks again once it
//!    applied more); and then until it has applied the live subject up to the last live
//!    message the stream's *leader* holds (a consumer reports from its own server's copy
//!    of the stream, which may not hold yet what the leader acknowledged: a follower
//!    outside the quorum, or one catching up after a restart). Every push acknowledged
//!    before that read published its live message before it, so this node's series
//!    index now names every acknowledged series;
//! 2. waits, for each partition it answers for, until it has applied that partition up
//!    to the highest position the applied live messages name for it: the entry publishes
//!    a push's live message only after JetStream acknowledged its partitions' messages,
//!    and writes their positions in the live message's [`POSITIONS_HEADER`].
//!
//! A node that cannot do (1) within its time (cut off from NATS, or far behind) answers
//! for nothing; a partition that does not pass (2) is left to another owner. Neither is
//! ever answered from rows that may be older than an acknowledgement.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use async_nats::jetstream::consumer::{Consumer, pull};

use super::{Cluster, LIVE};
use crate::store::StreamPosition;

/// The header of a live message naming, per partition of the push, the highest stream
/// sequence JetStream gave the push's messages of that partition: `P:SEQ` pairs
/// separated by spaces (docs/FORMAT.md).
pub(crate) const POSITIONS_HEADER: &str = "Hourglass-Positions";

/// How long to wait between two reads of the live consumer's position while it has
/// messages left to deliver.
const POLL: Duration = Duration::from_millis(20);

/// What a node must have applied before it answers: per partition, the highest position
/// named by the live messages it applied, and its live consumer.
#[derive(Default)]
pub(crate) struct Barrier {
    required: Mutex<Required>,
    /// This node's consumers, by partition ([`LIVE`] for the live subject).
    consumers: Mutex<HashMap<u32, Running>>,
    /// Whether this node's store holds every live message the stream ever had (applied,
    /// or copied from another node): else its series index may lack series.
    live_complete: std::sync::atomic::AtomicBool,
    /// The partitions the live consumer carries (DESIGN §10, "one consumer a node"): its
    /// deliveries vouch for them, so the barrier reads its entry for them.
    carried: Mutex<BTreeSet<u32>>,
}

impl Barrier {
    /// Records the positions a just-applied live message of the stream instance
    /// `stream` ([`super::engine::stream_identity`]) names. Called before the live
    /// message's own position is recorded as applied, so that a reader who sees that
    /// position also sees these. Positions named in another instance (the stream deleted
    /// and made again: its sequences started over) are forgotten.
    pub(crate) fn require(&self, stream: &str, positions: &[(u32, u64)]) {
        let mut required = self.required.lock().unwrap_or_else(|e| e.into_inner());
        if required.stream != stream {
            *required = Required {
                stream: stream.to_string(),
                at: HashMap::new(),
            };
        }
        for &(p, sequence) in positions {
            let at = required.at.entry(p).or_insert(0);
            *at = (*at).max(sequence);
        }
    }

    /// The position of `p` this node must have applied before answering for it, if it
    /// counts in the stream instance `stream`: `None` if the live messages named it in
    /// another one (then `p`'s position and the series index count in different
    /// instances, and nothing says how far `p` must be applied).
    fn required(&self, p: u32, stream: &str) -> Option<u64> {
        let required = self.required.lock().unwrap_or_else(|e| e.into_inner());
        match required.at.get(&p) {
            Some(&at) if required.stream == stream => Some(at),
            Some(_) => None,
            None => Some(0),
        }
    }

    /// Records that the live consumer carries partition `p` from now on: `p`'s own
    /// consumer no longer runs, and what the live one delivers and looks at stands for it.
    pub(crate) fn carry(&self, p: u32) {
        let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        consumers.remove(&p);
        self.carried
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p);
    }

    /// Records that the live consumer no longer carries `p` (handed over, or the live
    /// consumer opened again: it rejoins through a consumer of its own).
    pub(crate) fn drop_carried(&self, p: u32) {
        self.carried
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&p);
    }

    /// The partitions the live consumer carries.
    pub(crate) fn carried(&self) -> BTreeSet<u32> {
        self.carried
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The subject whose consumer delivers `p`: [`LIVE`] if the live consumer carries it.
    fn delivering(&self, p: u32) -> u32 {
        let carried = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        if carried.contains(&p) { LIVE } else { p }
    }

    /// This node's consumer of `p` (or [`LIVE`]), from when it runs. Nothing is known yet
    /// of when what it has to deliver was published ([`Running::fresh`]).
    pub(crate) fn set_consumer(&self, p: u32, consumer: Consumer<pull::Config>, instance: &str) {
        let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        consumers.insert(
            p,
            Running {
                consumer,
                instance: instance.to_string(),
                ran: Instant::now(),
                fresh: None,
            },
        );
    }

    /// Records that the loop of `p`'s consumer runs now.
    pub(crate) fn running(&self, p: u32) {
        let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(running) = consumers.get_mut(&p) {
            running.ran = Instant::now();
        }
    }

    /// How long ago the loop of `p`'s consumer last showed it runs.
    fn not_running_for(&self, p: u32) -> Duration {
        let p = self.delivering(p);
        let consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        consumers
            .get(&p)
            .map_or(Duration::MAX, |running| running.ran.elapsed())
    }

    /// Records that every message of `p` this node has yet to receive from the consumer
    /// instance `instance` was published at `since` or later ([`Running::fresh`]); an
    /// earlier time than the one recorded changes nothing, and neither does another
    /// instance than the running one (opened again meanwhile: its backlog is its own).
    pub(crate) fn fresh_since(&self, p: u32, instance: &str, since: SystemTime) {
        let p = self.delivering(p);
        let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(running) = consumers.get_mut(&p)
            && running.instance == instance
        {
            running.fresh = Some(running.fresh.map_or(since, |t| t.max(since)));
        }
    }

    /// [`Running::fresh`] of `p`'s consumer.
    pub(crate) fn fresh(&self, p: u32) -> Option<SystemTime> {
        let p = self.delivering(p);
        let consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        consumers.get(&p).and_then(|running| running.fresh)
    }

    /// Forgets the consumer of `p`, which stopped.
    pub(crate) fn forget_consumer(&self, p: u32) {
        let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        consumers.remove(&p);
    }

    fn consumer(&self, p: u32) -> Option<Consumer<pull::Config>> {
        let p = self.delivering(p);
        let consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        consumers.get(&p).map(|running| running.consumer.clone())
    }

    /// Records whether this node holds every live message the stream ever had.
    pub(crate) fn set_live_complete(&self, complete: bool) {
        self.live_complete
            .store(complete, std::sync::atomic::Ordering::Release);
    }

    /// Whether this node holds every live message the stream ever had.
    pub(crate) fn live_complete(&self) -> bool {
        self.live_complete
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

/// The positions the applied live messages named, in the stream instance they count in.
#[derive(Default)]
struct Required {
    stream: String,
    at: HashMap<u32, u64>,
}

/// One running consumer of this node.
struct Running {
    consumer: Consumer<pull::Config>,
    /// Its instance ([`identity`]).
    instance: String,
    /// When its loop last showed it runs (it asks JetStream for messages, so the consumer
    /// looks at what the stream gets).
    ran: Instant,
    /// A time at or before the publication of every message of the subject this node has
    /// yet to receive from the consumer: the publication of the last message it received,
    /// or when its consumer was last seen with nothing left to deliver. `None` until one
    /// of those is known. What the consumer looked at since can be taken as applied only
    /// while no such message can have aged out of the stream ([`may_have_aged_out`]).
    fresh: Option<SystemTime>,
}

/// Whether a message of a subject published at `fresh` or later (`None`: at any time)
/// may have aged out of the stream (`max_age`) by `now`: then a consumer may have looked
/// past it with no gap in its deliveries (DESIGN §10, "a consumer that falls behind").
///
/// `fresh` and the stream's ages are the NATS servers' clocks, `now` this node's: the
/// answer is "may" from `max_age` less a margin for the difference (a quarter of
/// `max_age`, at most 30 s).
pub(crate) fn may_have_aged_out(
    fresh: Option<SystemTime>,
    now: SystemTime,
    max_age: Duration,
) -> bool {
    let margin = (max_age / 4).min(Duration::from_secs(30));
    fresh.is_none_or(|t| now.duration_since(t).unwrap_or_default() >= max_age - margin)
}

/// Passes the read barrier (module docs) for the `ready` partitions within half of
/// `peer_timeout` (so that an asking node hears in time to ask another owner). Returns
/// those this node answers for, those applied far enough, or why it can answer for none.
pub(crate) async fn pass(cluster: &Cluster, ready: BTreeSet<u32>) -> Result<BTreeSet<u32>, String> {
    let deadline = Instant::now() + cluster.config().peer_timeout / 2;
    live_caught_up(cluster, deadline).await?;
    let mut behind = BTreeSet::new();
    for &p in &ready {
        let left = deadline.saturating_duration_since(Instant::now());
        let passed = match cluster.barrier().required(p, &cluster.position(p).stream) {
            Some(0) => true,
            Some(required) => cluster.wait_applied(p, required, left).await,
            None => false,
        };
        if !passed {
            behind.insert(p);
        }
    }
    if !behind.is_empty() {
        tracing::warn!(
            partitions = behind.len(),
            first = behind.first().copied(),
            "this node has not applied acknowledged pushes of partitions it is ready for; others answer for them"
        );
    }
    Ok(ready.difference(&behind).copied().collect())
}

/// Waits until this node's series index and servers (the live subject) hold every push
/// acknowledged before the call (step (1) of the module docs), so that a listing of
/// series or servers is no older than an answer would be; UNAVAILABLE if it cannot
/// confirm that in time.
pub(crate) async fn index_caught_up(cluster: &Cluster) -> Result<(), tonic::Status> {
    pass(cluster, BTreeSet::new())
        .await
        .map(drop)
        .map_err(tonic::Status::unavailable)
}

/// Step (1) of the module docs: waits until this node applied every live message the
/// stream held when it was asked ([`caught_up`]).
async fn live_caught_up(cluster: &Cluster, deadline: Instant) -> Result<(), String> {
    let behind = |detail: String| {
        format!(
            "node {} cannot confirm it has applied the cluster's series index: {detail}",
            cluster.members().me()
        )
    };
    if cluster.barrier().consumer(LIVE).is_some() && !cluster.barrier().live_complete() {
        return Err(behind(
            "it lacks live messages the stream no longer keeps and no node could copy them yet"
                .into(),
        ));
    }
    caught_up(cluster, LIVE, deadline).await.map_err(behind)
}

/// Waits until this node applied every message of `p` (or [`LIVE`]) the stream held
/// when this was called: every delivery of its consumer up to then
/// ([`consumer_caught_up`]), and up to the last message of its subject the stream's
/// *leader* holds. A consumer reports from its own server's copy of the stream, which
/// may not hold yet what the leader acknowledged (a follower outside the quorum that
/// committed it, or one catching up after a restart): its "nothing left" then passes
/// over the newest messages (it once let a node answer without a push another node had
/// answered STORED).
pub(crate) async fn caught_up(cluster: &Cluster, p: u32, deadline: Instant) -> Result<(), String> {
    consumer_caught_up(cluster, p, deadline).await?;
    let subject = cluster.config().subject(p);
    let left = deadline.saturating_duration_since(Instant::now());
    let last = tokio::time::timeout(left, cluster.last_sequence_of(&subject))
        .await
        .map_err(|_| "JetStream did not answer in time".to_string())?
        .map_err(|e| e.to_string())?;
    let left = deadline.saturating_duration_since(Instant::now());
    if cluster.wait_applied(p, last, left).await {
        return Ok(());
    }
    Err(format!(
        "it has applied {subject} up to sequence {}, the stream's leader holds it up to {last}",
        cluster.position(p).applied
    ))
}

/// Waits until this node applied every message of `p` (or [`LIVE`]) its consumer had
/// delivered when this was called, with nothing left undelivered or the consumer's look
/// as far as the stream's last message after the call: then it applied every message of
/// `p` the stream held at the call. Only this node's own record of the
/// deliveries it received and applied ([`vouched`]) says so, never the consumer's ack
/// floor.
async fn consumer_caught_up(cluster: &Cluster, p: u32, deadline: Instant) -> Result<(), String> {
    let consumer = cluster
        .barrier()
        .consumer(p)
        .ok_or_else(|| "its consumer is not running yet".to_string())?;
    // The stream's last sequence after the call, read once the consumer is found with
    // messages left: a consumer that looked at least that far, every delivery applied,
    // has delivered every message the stream held at the call, messages left or not. A
    // live consumer that carries the node's partitions has messages left most of the
    // time under load: waiting for none left would refuse questions there.
    let mut stream_last: Option<u64> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let asked = SystemTime::now();
        let info = tokio::time::timeout(left, consumer.get_info())
            .await
            .map_err(|_| "JetStream did not answer in time".to_string())?
            .map_err(|e| format!("JetStream: {e}"))?;
        let theirs = Delivered::of(&info);
        let mut verdict = vouched(&theirs, &cluster.position(p));
        if let Vouched::Behind { .. } = verdict {
            // Deliveries this node has not applied (yet): on their way, or in its buffer.
            let left = deadline.saturating_duration_since(Instant::now());
            if cluster
                .wait_delivered(p, &theirs.consumer, theirs.consumer_sequence, left)
                .await
            {
                verdict = vouched(&theirs, &cluster.position(p));
            }
        }
        // A loop that has not run for longer than it may (a frozen process) has a
        // consumer that looked at nothing meanwhile, and may since have looked past what
        // the stream dropped: it vouches for nothing until the loop has seen to it.
        let running = cluster.barrier().not_running_for(p) <= cluster.config().unchecked();
        if let Vouched::All { .. } = verdict
            && info.num_pending > 0
            && running
            && stream_last.is_none()
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Ok(Ok(last)) = tokio::time::timeout(left, cluster.stream_last_sequence()).await {
                stream_last = Some(last);
            }
        }
        let through = info.num_pending == 0 || stream_last.is_some_and(|last| verdict.at() >= last);
        if let Vouched::All { at } = verdict
            && through
            && running
        {
            // What the consumer looked at is applied only if the stream dropped none of it
            // before the consumer reached it.
            if !nothing_aged_out(cluster, p, cluster.position(p).applied).await? {
                return Err(
                    "its consumer may have looked past messages the stream dropped before delivering them; it is being opened again"
                        .into(),
                );
            }
            if info.num_pending == 0 {
                // Nothing was left to deliver: what comes was published after `asked`.
                cluster.barrier().fresh_since(p, &theirs.consumer, asked);
            }
            cluster.record_applied(p, at);
            return Ok(());
        }
        if Instant::now() + POLL >= deadline {
            return Err(why_behind(cluster, p, verdict, running, &info));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Why [`caught_up`] found `p` not caught up, by the last `verdict` on its consumer's
/// `info` and whether its loop was `running`.
fn why_behind(
    cluster: &Cluster,
    p: u32,
    verdict: Vouched,
    running: bool,
    info: &async_nats::jetstream::consumer::Info,
) -> String {
    let (mine, theirs) = (cluster.position(p), Delivered::of(info));
    match verdict {
        Vouched::All { .. } if !running => format!(
            "its consumer's loop has not run for {:?}",
            cluster.barrier().not_running_for(p)
        ),
        Vouched::Other { .. } => {
            "its consumer was opened again meanwhile: it has yet to receive its deliveries"
                .to_string()
        }
        _ if info.num_pending > 0 => format!(
            "{} messages were still to be delivered and it had applied up to {} of {}",
            info.num_pending, mine.applied, theirs.stream_sequence
        ),
        _ => format!(
            "it had received and applied {} of the {} deliveries of its consumer (a delivery lost on the way is taken up when the consumer is opened again)",
            mine.delivered, theirs.consumer_sequence
        ),
    }
}

/// Whether no message of `p` after stream sequence `applied` (this node's position) can
/// have aged out of the stream unseen: the consumer's [`Running::fresh`] says none is old
/// enough, or else the stream still starts at or before `applied + 1` (one request).
pub(crate) async fn nothing_aged_out(
    cluster: &Cluster,
    p: u32,
    applied: u64,
) -> Result<bool, String> {
    let fresh = cluster.barrier().fresh(p);
    if !may_have_aged_out(fresh, SystemTime::now(), cluster.config().max_age) {
        return Ok(true);
    }
    let first = cluster
        .stream_first_sequence()
        .await
        .map_err(|e| format!("reading the stream's start: {e}"))?;
    Ok(first <= applied.saturating_add(1))
}

/// What a consumer instance reports it delivered: its identity, the consumer sequence of
/// its last delivery, and the last stream sequence it looked at (a consumer of one
/// subject runs on over the other subjects' messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delivered {
    /// [`identity`] of the consumer instance.
    pub(crate) consumer: String,
    /// Its deliveries so far (redeliveries count: each takes the next consumer sequence).
    pub(crate) consumer_sequence: u64,
    /// The last stream sequence it looked at.
    pub(crate) stream_sequence: u64,
}

impl Delivered {
    /// What `info` reports delivered.
    pub(crate) fn of(info: &async_nats::jetstream::consumer::Info) -> Delivered {
        Delivered {
            consumer: identity(info),
            consumer_sequence: info.delivered.consumer_sequence,
            stream_sequence: info.delivered.stream_sequence,
        }
    }
}

/// A consumer instance's identity: its name and creation time. A consumer deleted and
/// made again under the same name starts its consumer sequences again; its creation time
/// tells it from the one before.
pub(crate) fn identity(info: &async_nats::jetstream::consumer::Info) -> String {
    format!("{}@{}", info.name, info.created.unix_timestamp_nanos())
}

/// How far a node may take a subject as applied ([`vouched`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vouched {
    /// This node received and applied every delivery the consumer instance made: every
    /// message of the subject up to `at` (what it applied, or what the consumer looked
    /// at, whichever is further) is in the store.
    All { at: u64 },
    /// The same instance made deliveries this node has not applied (yet, or ever: lost on
    /// the way, in a buffer dropped with a stopped process, or given up by the server when
    /// the stream dropped them): only its own position, `at`.
    Behind { at: u64 },
    /// Another instance than the one this node recorded (opened again, or never recorded
    /// here): only its own position, `at`.
    Other { at: u64 },
}

impl Vouched {
    /// The stream sequence up to which every message of the subject is in the store.
    pub(crate) fn at(self) -> u64 {
        match self {
            Vouched::All { at } | Vouched::Behind { at } | Vouched::Other { at } => at,
        }
    }
}

/// The one rule of what a node may take as applied of a subject (DESIGN §10), from what
/// its consumer reports it delivered (`theirs`) and this node's own record (`mine`).
///
/// The consumer's ack floor and its count of unacknowledged deliveries never vouch for
/// anything: nats-server counts a delivered, never acknowledged message that the stream
/// drops (`max_age`) as terminated, leaves it out of the unacknowledged ones and moves the
/// floor past it. Only deliveries this node received and applied, counted by consumer
/// sequence (each delivery takes the next one), do: if it applied all the instance made,
/// every message of the subject up to what the instance looked at is applied.
pub(crate) fn vouched(theirs: &Delivered, mine: &StreamPosition) -> Vouched {
    let at = mine.applied;
    if mine.consumer.is_empty() || mine.consumer != theirs.consumer {
        Vouched::Other { at }
    } else if theirs.consumer_sequence < mine.delivered && theirs.stream_sequence > at {
        // Fewer deliveries than this node received, yet further in the stream than it
        // applied: not a report older than this node's record (that would be behind in
        // both), but the instance's numbering gone back (a consumer state lost in a NATS
        // leader change) while it went on. Its sequences may repeat ones this node
        // counted for other messages: they vouch for nothing.
        Vouched::Other { at }
    } else if theirs.consumer_sequence > mine.delivered {
        Vouched::Behind { at }
    } else {
        Vouched::All {
            at: at.max(theirs.stream_sequence),
        }
    }
}

/// The [`POSITIONS_HEADER`] value of `positions`.
pub(crate) fn encode_positions(positions: &BTreeMap<u32, u64>) -> String {
    positions
        .iter()
        .map(|(p, s)| format!("{p}:{s}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The positions a [`POSITIONS_HEADER`] value names.
pub(crate) fn parse_positions(value: &str) -> Result<Vec<(u32, u64)>, String> {
    value
        .split_ascii_whitespace()
        .map(|pair| {
            let (p, s) = pair
                .split_once(':')
                .ok_or_else(|| format!("{pair:?} is not PARTITION:SEQUENCE"))?;
            let p = p
                .parse()
                .map_err(|e| format!("partition {p:?} in {pair:?}: {e}"))?;
            let s = s
                .parse()
                .map_err(|e| format!("sequence {s:?} in {pair:?}: {e}"))?;
            Ok((p, s))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_and_bad_ones_say_what_is_wrong() {
        let positions = BTreeMap::from([(0, 17), (5, 3), (63, u64::MAX)]);
        let value = encode_positions(&positions);
        assert_eq!(value, "0:17 5:3 63:18446744073709551615");
        assert_eq!(
            parse_positions(&value).unwrap(),
            positions.into_iter().collect::<Vec<_>>()
        );
        assert_eq!(parse_positions("").unwrap(), vec![]);
        let e = parse_positions("1:2 7").unwrap_err();
        assert!(e.contains("\"7\" is not PARTITION:SEQUENCE"), "{e}");
        let e = parse_positions("x:2").unwrap_err();
        assert!(e.contains("partition \"x\""), "{e}");
        let e = parse_positions("1:-2").unwrap_err();
        assert!(e.contains("sequence \"-2\""), "{e}");
    }

    fn theirs(consumer: &str, consumer_sequence: u64, stream_sequence: u64) -> Delivered {
        Delivered {
            consumer: consumer.into(),
            consumer_sequence,
            stream_sequence,
        }
    }

    fn mine(consumer: &str, delivered: u64, applied: u64) -> StreamPosition {
        StreamPosition {
            stream: "HOURGLASS@1".into(),
            consumer: consumer.into(),
            delivered,
            applied,
        }
    }

    #[test]
    fn only_deliveries_this_node_applied_vouch_for_what_the_consumer_looked_at() {
        // Every delivery applied: what it looked at (past other subjects') is applied.
        assert_eq!(
            vouched(&theirs("c@1", 7, 120), &mine("c@1", 7, 100)),
            Vouched::All { at: 120 }
        );
        // Deliveries read before the Info of later ones: never below its own.
        assert_eq!(
            vouched(&theirs("c@1", 7, 90), &mine("c@1", 9, 100)),
            Vouched::All { at: 100 }
        );
        // The instance's numbering gone back while it went on in the stream (a consumer
        // state lost in a leader change): it vouches for nothing. Behind in both is a
        // report older than this node's record: its own position.
        assert_eq!(
            vouched(&theirs("c@1", 5, 130), &mine("c@1", 9, 100)),
            Vouched::Other { at: 100 }
        );
        assert_eq!(
            vouched(&theirs("c@1", 5, 100), &mine("c@1", 9, 100)),
            Vouched::All { at: 100 }
        );
        // A delivery it has not applied (lost, or on its way): only its own position,
        // however far the consumer (and its ack floor) went.
        assert_eq!(
            vouched(&theirs("c@1", 8, 120), &mine("c@1", 7, 100)),
            Vouched::Behind { at: 100 }
        );
        // Another instance of the same name (sequences started again): its own only.
        assert_eq!(
            vouched(&theirs("c@2", 7, 120), &mine("c@1", 7, 100)),
            Vouched::Other { at: 100 }
        );
        assert_eq!(
            vouched(&theirs("c@2", 0, 120), &mine("c@1", 7, 100)),
            Vouched::Other { at: 100 }
        );
        // A distrusted record (a stalled consumer) and a store that recorded nothing.
        assert_eq!(
            vouched(&theirs("c@1", 7, 120), &mine("", 7, 100)),
            Vouched::Other { at: 100 }
        );
        assert_eq!(
            vouched(&theirs("c@1", 0, 0), &StreamPosition::default()),
            Vouched::Other { at: 0 }
        );
        assert_eq!(Vouched::Behind { at: 4 }.at(), 4);
    }

    #[test]
    fn what_a_consumer_looked_past_may_have_aged_out_from_max_age_less_a_margin() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let s = Duration::from_secs;
        let week = s(7 * 24 * 3600);
        // Unknown (just opened): always "may".
        assert!(may_have_aged_out(None, t, week));
        // A week's max_age: 30 s of margin.
        assert!(!may_have_aged_out(Some(t), t + week - s(31), week));
        assert!(may_have_aged_out(Some(t), t + week - s(30), week));
        // A short max_age: a quarter of it.
        let short = Duration::from_millis(2000);
        assert!(!may_have_aged_out(
            Some(t),
            t + Duration::from_millis(1499),
            short
        ));
        assert!(may_have_aged_out(
            Some(t),
            t + Duration::from_millis(1500),
            short
        ));
        // A time after now (clocks apart) is fresh.
        assert!(!may_have_aged_out(Some(t + s(5)), t, short));
    }

    #[test]
    fn the_requirement_of_a_partition_is_the_highest_named() {
        let barrier = Barrier::default();
        assert_eq!(barrier.required(3, "S@1"), Some(0));
        barrier.require("S@1", &[(3, 10), (4, 2)]);
        barrier.require("S@1", &[(3, 7)]);
        assert_eq!(
            (barrier.required(3, "S@1"), barrier.required(4, "S@1")),
            (Some(10), Some(2))
        );
        // A partition whose position counts in another instance: nothing says how far.
        assert_eq!(barrier.required(3, "S@2"), None);
        assert_eq!(barrier.required(5, "S@2"), Some(0));
        // Live messages of a new instance: the old instance's positions are forgotten.
        barrier.require("S@2", &[(4, 1)]);
        assert_eq!(
            (barrier.required(3, "S@2"), barrier.required(4, "S@2")),
            (Some(0), Some(1))
        );
    }
}
