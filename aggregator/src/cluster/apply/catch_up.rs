//! Catching up by subject (DESIGN §10): the partitions of one subject that this node has
//! to catch up at the same time (a wiped store, a start after a long stop) read the
//! subject once, together, instead of once each through their own consumers. With S
//! subjects grouping P partitions, a wiped node owning them all read every message P/S
//! times over (docs/BENCHMARKS.md, "Catching up, 8 subjects against 64").
//!
//! Each partition's task passes its subject's gate before it opens its own consumer.
//! One task at a time holds the gate; it reads the subject for every partition waiting
//! at it that is far enough behind (`catch_up_behind` stream messages), through a
//! consumer made for the read (replicated and acknowledged like the node's own, so that
//! its deliveries are numbered as theirs; removed after),
//! from right after the lowest of their positions, and applies each message's snapshots
//! of those partitions. After each batch is in the store (one write group, synced), each
//! of those partitions' positions moves to the batch's last message, naming no consumer
//! instance ([`crate::cluster::Cluster::record_read`]): its own consumer is then made again to start
//! right after it. The others waiting find themselves caught up when they pass the gate.
//!
//! A read vouches only for what it delivered, never for what its consumer reports it
//! looked at: every message of the subject after the read's start up to the last
//! delivery is applied if the deliveries came one after another (each consumer sequence
//! the next, each stream sequence further), and none of the messages the consumer
//! passed over can have aged out of the stream (`max_age`) before it reached them (the
//! same check as a consumer's, [`may_have_aged_out`]). A partition whose store lacks
//! what the stream dropped is left to its own consumer, which copies it first. Anything
//! unexpected ends the read: what it recorded stands, and each partition goes on
//! through its own consumer from there.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use async_nats::jetstream;
use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use tokio_stream::StreamExt;

use super::{
    Applies, Consuming, Delivery, apply_in_place, count, in_sequence, ready_messages, stream_first,
    stream_state,
};
use crate::cluster::barrier::may_have_aged_out;

/// A read with neither a message nor a heartbeat for this many pull heartbeats is given up.
const SILENT_HEARTBEATS: u32 = 8;

/// How often a long read logs how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// The read's consumer is removed by the servers once idle this long (a node stopped
/// mid-read leaves it behind).
const READ_INACTIVE: Duration = Duration::from_secs(60);

/// How long a read waits for the other partitions of its subject to come to the gate.
const GATHER: Duration = Duration::from_millis(100);

/// The partitions of each subject waiting to catch up, and the lock that lets one task at
/// a time read the subject for all of them.
#[derive(Default)]
pub(super) struct Gates {
    by_subject: Mutex<HashMap<u32, Arc<Gate>>>,
}

#[derive(Default)]
struct Gate {
    /// Held by the task reading the subject.
    read: tokio::sync::Mutex<()>,
    /// The partitions whose tasks wait at the gate (or hold it).
    waiting: Mutex<BTreeSet<u32>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A partition waiting at its subject's gate, until dropped (its task passed the gate,
/// or stopped).
struct Waiting {
    gate: Arc<Gate>,
    p: u32,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        lock(&self.gate.waiting).remove(&self.p);
    }
}

impl Gates {
    /// `p`, of subject `k`, waits at its gate from now on.
    fn wait(&self, k: u32, p: u32) -> Waiting {
        let gate = Arc::clone(lock(&self.by_subject).entry(k).or_default());
        lock(&gate.waiting).insert(p);
        Waiting { gate, p }
    }
}

/// Passes partition `p`'s subject gate (module docs): reads the subject for the
/// partitions waiting at it that are far enough behind, or waits for the task reading it.
/// Never fails: a read that cannot be made or ends early leaves each partition to its
/// own consumer, from as far as the read got.
pub(super) async fn by_subject(work: &Consuming, p: u32) {
    let config = work.cluster.config();
    if config.own_partition_consumers {
        return;
    }
    let k = p % config.subject_count();
    let subject = config.partition_subject(p);
    // A partition not far behind (a consumer opened again after a brief failure) goes
    // on at once, without waiting for a read of its subject in progress.
    let far = match Ends::of(work, &subject).await {
        Ok(ends) => work
            .cluster
            .load_position(p, &ends.instance)
            .is_ok_and(|position| ends.far_behind(work, position.applied)),
        Err(_) => false,
    };
    if !far {
        return;
    }
    let waiting = work.gates.wait(k, p);
    let _reading = waiting.gate.read.lock().await;
    let started = Instant::now();
    match read(work, k, &subject, &waiting.gate).await {
        Ok(None) => {}
        Ok(Some(read)) => tracing::info!(
            subject,
            partitions = read.partitions,
            messages = read.messages,
            applied_to = read.at,
            took = ?started.elapsed(),
            "caught up the partitions of a subject from one read of it"
        ),
        Err(e) => tracing::warn!(
            subject,
            error = %e,
            "catching up the partitions of a subject together stopped; each goes on through its own consumer from as far as the read got"
        ),
    }
}

/// The partitions a read is for, and the lowest of their positions.
struct Behind {
    partitions: BTreeSet<u32>,
    from: u64,
}

impl Default for Behind {
    fn default() -> Self {
        Behind {
            partitions: BTreeSet::new(),
            from: u64::MAX,
        }
    }
}

/// The stream as a read of one subject starts from it.
struct Ends {
    stream: jetstream::stream::Stream<()>,
    /// The stream's first sequence: the messages before it are gone (max_age).
    first: u64,
    /// The stream's instance ([`crate::cluster::engine::stream_identity`]).
    instance: String,
    /// The last message of the subject the stream's leader holds.
    last: u64,
}

impl Ends {
    async fn of(work: &Consuming, subject: &str) -> Result<Ends, String> {
        let cluster = &work.cluster;
        let stream = cluster
            .jetstream()
            .get_stream_no_info(&cluster.config().stream)
            .await
            .map_err(|e| e.to_string())?;
        let (first, instance) = stream_state(&stream, cluster).await?;
        let last = cluster
            .last_sequence_of(subject)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Ends {
            stream,
            first,
            instance,
            last,
        })
    }

    /// Whether a partition applied up to `applied` is read for: at least
    /// `catch_up_behind` before the subject's last message, and not before the stream's
    /// first (a store that lacks what the stream dropped copies it first, through its own
    /// consumer's opening).
    fn far_behind(&self, work: &Consuming, applied: u64) -> bool {
        applied.saturating_add(1) >= self.first
            && applied.saturating_add(work.cluster.config().catch_up_behind) <= self.last
    }
}

impl Behind {
    /// Adds the partitions waiting at `gate` whose position is [`Ends::far_behind`].
    fn add(&mut self, work: &Consuming, gate: &Gate, ends: &Ends) -> Result<(), String> {
        let waiting = lock(&gate.waiting).clone();
        for q in waiting.difference(&self.partitions.clone()) {
            let applied = work
                .cluster
                .load_position(*q, &ends.instance)
                .map_err(|e| format!("reading this store's position: {e}"))?
                .applied;
            if ends.far_behind(work, applied) {
                self.partitions.insert(*q);
                self.from = self.from.min(applied);
            }
        }
        Ok(())
    }
}

/// What a read did.
struct Read {
    partitions: usize,
    messages: u64,
    /// Every message of the subject up to it is applied for the partitions read for.
    at: u64,
}

/// Reads `subject` (number `k`) for the partitions waiting at its `gate` that are far
/// enough behind its last message and complete up to the stream's start; `None` if none
/// is.
async fn read(
    work: &Consuming,
    k: u32,
    subject: &str,
    gate: &Gate,
) -> Result<Option<Read>, String> {
    let config = work.cluster.config();
    // Again, once this task holds the gate: a read before may have caught it up.
    let ends = Ends::of(work, subject).await?;
    let mut behind = Behind::default();
    behind.add(work, gate, &ends)?;
    if behind.partitions.is_empty() {
        return Ok(None);
    }
    // The tasks of a node's partitions start together (a start, a wiped store): the
    // others of this subject come to the gate right after this one.
    tokio::time::sleep(GATHER).await;
    behind.add(work, gate, &ends)?;
    let Ends {
        stream,
        instance,
        last,
        ..
    } = ends;
    let (behind, from) = (behind.partitions, behind.from);
    let name = format!("{}-catch-up-{k}", work.durable);
    // One left by a process stopped mid-read is this store's: made again from here.
    let _ = stream.delete_consumer(&name).await;
    let consumer = stream
        .create_consumer(pull::Config {
            name: Some(name.clone()),
            description: Some(format!(
                "hourglass node {} catches up {subject}",
                config.node
            )),
            filter_subject: subject.to_string(),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from + 1,
            },
            // Replicated and acknowledged as this node's own consumers are, so that its
            // deliveries are numbered as theirs: a delivery is sent only once its servers
            // agreed on it, so its numbering never starts over in a restart or a leader
            // change (one acknowledgement a batch, of its last delivery).
            ack_policy: AckPolicy::All,
            // Told, as JetStream makes a consumer without a durable name on one server
            // (R1) on a limits stream otherwise, whatever the stream's replicas.
            num_replicas: config.replicas,
            ack_wait: super::ACK_WAIT,
            max_ack_pending: super::MAX_ACK_PENDING,
            inactive_threshold: READ_INACTIVE,
            ..pull::Config::default()
        })
        .await
        .map_err(|e| format!("making its consumer: {e}"))?;
    tracing::info!(
        subject,
        partitions = behind.len(),
        from = from + 1,
        to = last,
        "catching up the partitions of a subject from one read of it"
    );
    let mut reading = Reading {
        work,
        stream: &stream,
        instance: &instance,
        name: &name,
        partitions: &behind,
        delivered: 0,
        at: from,
        fresh: None,
        messages: 0,
    };
    let read = reading.until(&consumer, last).await;
    let _ = stream.delete_consumer(&name).await;
    read?;
    Ok(Some(Read {
        partitions: behind.len(),
        messages: reading.messages,
        at: reading.at,
    }))
}

/// A read of one subject for some of its partitions, as far as it got.
struct Reading<'a> {
    work: &'a Consuming,
    stream: &'a jetstream::stream::Stream<()>,
    /// The stream instance the positions count in.
    instance: &'a str,
    /// The read's consumer.
    name: &'a str,
    partitions: &'a BTreeSet<u32>,
    /// The consumer sequence of the last delivery applied.
    delivered: u64,
    /// Every message of the subject up to this stream sequence is applied for the
    /// partitions.
    at: u64,
    /// The publication of the last delivery applied: every message still to come was
    /// published at or after it.
    fresh: Option<SystemTime>,
    messages: u64,
}

impl Reading<'_> {
    /// Applies what `consumer` delivers until every message of the subject up to `last`
    /// is applied, or says why it stopped.
    async fn until(
        &mut self,
        consumer: &jetstream::consumer::Consumer<pull::Config>,
        last: u64,
    ) -> Result<(), String> {
        let heartbeat = self.work.cluster.config().pull_heartbeat();
        let mut messages = consumer
            .stream()
            .heartbeat(heartbeat)
            .expires(heartbeat * 4)
            .messages()
            .await
            .map_err(|e| e.to_string())?;
        let mut logged = Instant::now();
        while self.at < last {
            let first =
                match tokio::time::timeout(heartbeat * SILENT_HEARTBEATS, messages.next()).await {
                    Err(_) => return Err("neither a message nor a heartbeat came".into()),
                    Ok(None) => return Err("its messages ended".into()),
                    Ok(Some(Err(e))) => return Err(e.to_string()),
                    Ok(Some(Ok(message))) => message,
                };
            let (batch, ended) = ready_messages(first, &mut messages);
            // Every delivery takes the next consumer sequence: one skipped was lost on
            // the way, and the deliveries after it vouch for nothing.
            let (batch, gap) = in_sequence(batch, self.delivered);
            self.apply(&batch).await?;
            if let Some(gap) = gap {
                return Err(gap);
            }
            if let Some(ended) = ended {
                return Err(ended.map_or_else(|| "its messages ended".into(), |e| e.to_string()));
            }
            if logged.elapsed() >= PROGRESS_EVERY {
                logged = Instant::now();
                tracing::info!(
                    name = self.name,
                    at = self.at,
                    to = last,
                    "catching up a subject"
                );
            }
        }
        Ok(())
    }

    /// Applies `batch`, which follows the deliveries applied before it, and records it.
    async fn apply(&mut self, batch: &[Delivery]) -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        // In the stream's order, after what was applied: a redelivery (an acknowledgement
        // lost, or late by ACK_WAIT) ends the read.
        let mut previous = self.at;
        for delivery in batch {
            if delivery.stream_sequence <= previous {
                return Err(format!(
                    "stream sequence {} delivered after {previous}",
                    delivery.stream_sequence
                ));
            }
            previous = delivery.stream_sequence;
        }
        // What the consumer passed over between them was of other subjects, unless the
        // stream dropped it first (max_age): then this read vouches for nothing more.
        let max_age = self.work.cluster.config().max_age;
        if may_have_aged_out(self.fresh, SystemTime::now(), max_age)
            && stream_first(self.stream).await? > self.at.saturating_add(1)
        {
            return Err(
                "the stream may have dropped messages (max_age) the read passed over".into(),
            );
        }
        let work = self.work;
        let outcomes =
            apply_in_place(work, Applies::Partitions(self.partitions), self.name, batch).await;
        // Each has its outcome (a failed write is retried in place): never past one without.
        let applied = &batch[..outcomes.len().min(batch.len())];
        for (delivery, outcome) in applied.iter().zip(outcomes) {
            count(work, outcome);
            work.metrics.cluster_applied_at(delivery.stream_sequence);
        }
        let Some(last) = applied.last() else {
            return Err("no message of a batch was applied".into());
        };
        work.metrics
            .cluster_caught_up_messages
            .inc_by(applied.len() as u64);
        for &q in self.partitions {
            work.cluster
                .record_read(q, self.instance, last.stream_sequence);
        }
        // Lost, it only makes a redelivery, which ends the read: nothing waits for it.
        if let Err(e) = last.message.ack_with(AckKind::Ack).await {
            tracing::debug!(name = self.name, error = %e, "acknowledging a catch-up batch");
        }
        self.delivered = last.consumer_sequence;
        self.at = last.stream_sequence;
        self.fresh = Some(last.published);
        self.messages += applied.len() as u64;
        if applied.len() < batch.len() {
            return Err("a message of a batch was not applied".into());
        }
        Ok(())
    }
}
