//! The apply loops: this node's membership heartbeat, and its durable consumers of the
//! stream — one for the live subject (every node) and one per partition it comes to own,
//! which catches the partition up and then hands it to the live consumer ([`Joins`]:
//! one consumer a node in the steady state) — each applying messages into the local
//! store with the single aggregator's own push path.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, FromConsumer, PullConsumer, pull};
use async_nats::jetstream::kv;
use hourglass_rpc::proto::v1;
use prost::Message;
use tokio::sync::watch;
use tokio_stream::StreamExt;

use super::barrier::{Delivered, Vouched, identity, nothing_aged_out, vouched};
use super::{Cluster, ClusterError, LIVE};
use crate::metrics::{ApplyLabel, Metrics};
use crate::write::Writer;

mod catch_up;

/// How long JetStream waits for an acknowledgement before it redelivers.
const ACK_WAIT: Duration = Duration::from_secs(60);
/// Messages delivered and not yet acknowledged, at most.
const MAX_ACK_PENDING: i64 = 256;
/// How long a consumer that lacks what the stream dropped, and could not copy it, applies
/// before it tries the copy again.
const COPY_RETRY: Duration = Duration::from_secs(30);
/// The shortest idle time after which JetStream removes a consumer.
const MIN_INACTIVE: Duration = Duration::from_secs(24 * 3600);
/// The consumer metadata key that says whether the store holds every message of the
/// subject the stream ever had ("true") or missed some the stream dropped ("false").
const COMPLETE_KEY: &str = "hourglass.complete";
/// The wait before a message the store could not take is redelivered.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// What became of one message of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applied {
    /// Written (each snapshot stored, stale or rejected by the push rules).
    Ok,
    /// Not a push the rules accept at all (bad bytes, a bad server name): never retried.
    Refused,
    /// The store failed: tried again.
    Retry,
}

/// One consumer's work: the live subject, or one partition.
#[derive(Clone)]
struct Consuming {
    cluster: Arc<Cluster>,
    /// The store's consumer name prefix ([`consumer_name`]).
    durable: String,
    applier: Arc<Writer>,
    /// This node's one group commit of applied messages ([`GroupCommit`]).
    commit: GroupCommit,
    metrics: Arc<Metrics>,
    /// The partitions the live consumer carries, and those asking it to.
    joins: Arc<Joins>,
    /// The partitions waiting to catch up, by subject ([`catch_up::Gates`]).
    gates: Arc<catch_up::Gates>,
}

/// A partition's consumer task and the switch that stops it.
struct Task {
    stop: watch::Sender<bool>,
    handle: tokio::task::JoinHandle<()>,
}

/// Runs this node's part of the cluster until `stopped`: renews its membership every
/// heartbeat, starts a consumer for each partition it comes to own, stops one for a
/// partition it lost once the new owners are ready for it, and consumes the live subject
/// throughout. Consumers resume where this store left off (durable, named after the store:
/// [`consumer_name`]); a lost connection is logged and taken up again.
pub(crate) async fn run(
    cluster: Arc<Cluster>,
    durable: String,
    applier: Writer,
    metrics: Arc<Metrics>,
    stopped: impl Future<Output = ()>,
) {
    // This node's own record of how far it applied each subject lives in its store.
    cluster.keep_positions_in(Arc::clone(applier.store()));
    let applier = Arc::new(applier);
    let work = Consuming {
        cluster: Arc::clone(&cluster),
        durable,
        commit: GroupCommit::start(Arc::clone(&cluster), Arc::clone(&applier)),
        applier,
        metrics: Arc::clone(&metrics),
        joins: Arc::default(),
        gates: Arc::default(),
    };
    let mut live = start(&work, LIVE);
    let mut running: HashMap<u32, Task> = HashMap::new();
    // Out of touch with NATS this long, messages may have aged out of the stream unseen
    // by consumers that noticed nothing: they are all opened again, which checks.
    // Half of max_age, and never so short that a slow renewal or a NATS leader election
    // (seconds) reopens everything: that would refuse queries over and over.
    let out_of_touch =
        (cluster.config().max_age / 2).max(cluster.config().heartbeat * 3 + Duration::from_secs(2));
    let mut last_renewed = tokio::time::Instant::now();
    let mut bucket: Option<kv::Store> = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(cluster.config().heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            _ = tick.tick() => {}
        }
        match renew(&cluster, &mut bucket).await {
            Ok(members) => {
                if failing {
                    tracing::info!("cluster membership renewed again");
                }
                failing = false;
                if last_renewed.elapsed() > out_of_touch {
                    tracing::warn!(
                        out_of_touch_for = ?last_renewed.elapsed(),
                        "cluster: this node was out of touch with NATS; opening its consumers again"
                    );
                    live = reopen_all(&work, live, &mut running).await;
                }
                last_renewed = tokio::time::Instant::now();
                cluster.members().renewed(members);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cluster: cannot renew this node's membership; after cluster.member_ttl it answers for no partition");
                }
                failing = true;
                bucket = None;
            }
        }
        rebalance(&work, &mut running);
    }
    leave_cluster(&work, bucket.as_ref(), live, running).await;
}

/// This node leaves the cluster: out of the members (the others move its partitions now,
/// not after member_ttl), and every consumer stopped.
async fn leave_cluster(
    work: &Consuming,
    bucket: Option<&kv::Store>,
    live: Task,
    running: HashMap<u32, Task>,
) {
    if let Some(bucket) = bucket {
        let me = work.cluster.members().me().to_string();
        match tokio::time::timeout(Duration::from_secs(2), bucket.delete(&me)).await {
            Ok(Ok(())) => tracing::info!("left the cluster's members"),
            Ok(Err(e)) => tracing::warn!(error = %e, "cluster: leaving the members"),
            Err(_) => tracing::warn!("cluster: leaving the members timed out"),
        }
    }
    // Carried partitions stop without taking themselves out of the live consumer's
    // filter: its next opening sets that back.
    release_carried(work);
    for task in running.values() {
        let _ = task.stop.send(true);
    }
    let _ = live.stop.send(true);
    for (_, task) in running {
        let _ = task.handle.await;
    }
    let _ = live.handle.await;
}

/// Stops every consumer (the read barrier refuses and the partitions go to other owners
/// meanwhile) and starts the live one again; the partition ones are started again by the
/// next [`rebalance`]. Returns the new live consumer's task.
async fn reopen_all(work: &Consuming, live: Task, running: &mut HashMap<u32, Task>) -> Task {
    let barrier = work.cluster.barrier();
    release_carried(work);
    let subjects: Vec<u32> = running.keys().copied().chain([LIVE]).collect();
    let forget = || {
        for &p in &subjects {
            barrier.forget_consumer(p);
            if p != LIVE {
                work.cluster.members().withdraw(p);
            }
        }
    };
    forget();
    let tasks = running.drain().map(|(_, t)| t).chain([live]);
    for task in tasks {
        let _ = task.stop.send(true);
        let _ = task.handle.await;
    }
    // Again: a task stopped while opening may have registered its consumer meanwhile.
    forget();
    start(work, LIVE)
}

/// Starts and stops partition consumers to match the owners among the current members.
fn rebalance(work: &Consuming, running: &mut HashMap<u32, Task>) {
    let membership = work.cluster.members();
    let members = membership.members();
    // What this node sees now, even cut off: no members, no partition answered for.
    let report = || {
        let (applying, ready) = membership.counts();
        let carried = work.cluster.barrier().carried().len();
        work.metrics.cluster_membership(
            members.len(),
            applying,
            ready,
            carried,
            membership.pending(),
        );
    };
    // Out of the cluster (or not yet in): keep applying what it applies, take nothing new.
    if members.is_empty() {
        report();
        return;
    }
    let owned = membership.owned(&members);
    for &p in &owned {
        running.entry(p).or_insert_with(|| {
            membership.start_applying(p);
            start(work, p)
        });
    }
    running.retain(|&p, task| {
        if owned.contains(&p) || !membership.handed_over(p, &members) {
            return true;
        }
        tracing::info!(
            partition = p,
            "partition handed over to its owners; no longer applied here"
        );
        let _ = task.stop.send(true);
        membership.stop_applying(p);
        false
    });
    report();
}

/// Renews this node's key in the members bucket and reads every member's.
async fn renew(
    cluster: &Cluster,
    bucket: &mut Option<kv::Store>,
) -> Result<BTreeMap<String, v1::Member>, String> {
    let config = cluster.config();
    let store = match bucket {
        Some(store) => store,
        None => {
            let created = cluster
                .jetstream()
                .create_or_update_key_value(kv::Config {
                    bucket: members_bucket(&config.stream),
                    description: "hourglass aggregator nodes: one key per live node".into(),
                    history: 1,
                    max_age: config.member_ttl,
                    num_replicas: config.replicas,
                    ..kv::Config::default()
                })
                .await
                .map_err(|e| format!("members bucket: {e}"))?;
            bucket.insert(created)
        }
    };
    let me = cluster.members().heartbeat();
    let timeout = config.heartbeat.max(Duration::from_secs(2));
    let read = async {
        store
            .put(&me.node, me.encode_to_vec().into())
            .await
            .map_err(|e| format!("renewing {}: {e}", me.node))?;
        let mut keys = store
            .keys()
            .await
            .map_err(|e| format!("listing members: {e}"))?;
        let mut members = BTreeMap::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| format!("listing members: {e}"))?;
            let Some(value) = store
                .get(&key)
                .await
                .map_err(|e| format!("reading member {key}: {e}"))?
            else {
                continue;
            };
            match v1::Member::decode(value) {
                Ok(member) if member.node == key => {
                    members.insert(key, member);
                }
                Ok(_) | Err(_) => {
                    tracing::warn!(
                        key,
                        "cluster: a members key that is not a member's; ignored"
                    );
                }
            }
        }
        Ok(members)
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| format!("no answer from JetStream within {timeout:?}"))?
}

/// The KV bucket of the members of the cluster of `stream`.
fn members_bucket(stream: &str) -> String {
    format!("{stream}_members")
}

/// Starts consuming `p` (or the live subject, [`LIVE`]).
fn start(work: &Consuming, p: u32) -> Task {
    let (stop, mut stopped) = watch::channel(false);
    let work = work.clone();
    let handle = tokio::spawn(async move {
        loop {
            let ended = tokio::select! {
                _ = stopped.wait_for(|s| *s) => None,
                ended = consume(&work, p) => Some(ended),
            };
            let error = match ended {
                None => break,
                Some(Ended::Failed(error)) => error,
                // Carried by the live consumer until it drops the partition (opened
                // again: the partition catches up through its own consumer again) or
                // this task stops (handed over: out of the live consumer's filter).
                Some(Ended::Carried(dropped)) => {
                    let stop = tokio::select! {
                        _ = stopped.wait_for(|s| *s) => true,
                        _ = dropped => false,
                    };
                    if stop {
                        break;
                    }
                    continue;
                }
            };
            // Until it is opened again, nothing is vouched for by this consumer: the read
            // barrier refuses, and the partition is left to other owners.
            work.cluster.barrier().forget_consumer(p);
            if p != LIVE {
                work.cluster.members().withdraw(p);
            }
            tracing::warn!(partition = p, error = %error, "applying the cluster stream stopped; resuming");
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(RETRY_DELAY) => {}
            }
        }
        // Stopped (handed over): out of the live consumer's filter, if it was in it.
        if p != LIVE {
            leave(&work, p).await;
        }
    });
    Task { stop, handle }
}

/// How a consume loop ended.
enum Ended {
    /// Its consumer failed: why. It is opened again.
    Failed(ClusterError),
    /// The partition is carried by the live consumer from now on, until this says it
    /// dropped it.
    Carried(tokio::sync::oneshot::Receiver<()>),
}

/// Reads and applies one subject's messages until the consumer fails (or, for a
/// partition, until the live consumer carries it: [`join`]); returns why.
async fn consume(work: &Consuming, p: u32) -> Ended {
    let cluster = &work.cluster;
    let config = cluster.config();
    if p != LIVE {
        catch_up::by_subject(work, p).await;
    }
    let (mut subject, mut messages) = match subscribe(work, p).await {
        Ok(subscribed) => subscribed,
        Err(e) => return Ended::Failed(e),
    };
    let fail = |subject: &Subject<'_>, detail: String| Ended::Failed(subject.fail(detail));
    // Incomplete and no node could give what is missing: apply what is there, and try
    // the copy again later.
    let retry_copy = (!subject.complete).then(|| tokio::time::Instant::now() + COPY_RETRY);
    let (quiet, stall) = (config.quiet(), config.stall());
    let mut quiet_until = tokio::time::Instant::now() + quiet;
    let mut unreceived = None;
    let mut joining = None;
    loop {
        if p == LIVE {
            adopt_asked(work, &subject.identity);
        }
        let next = tokio::select! {
            biased;
            next = messages.next() => Some(next),
            () = work.joins.asked.notified(), if p == LIVE => continue,
            _ = tokio::time::sleep_until(retry_copy.unwrap_or(quiet_until)), if retry_copy.is_some() => {
                return fail(&subject, "trying the copy of what the stream no longer keeps again".into());
            }
            _ = tokio::time::sleep_until(quiet_until) => None,
        };
        // The quiet timer went off long after it was due: this loop did not run (a frozen
        // process, a starved runtime), and what came since may follow messages the consumer
        // looked past unseen. Neither it nor what the consumer looked at counts.
        let late = tokio::time::Instant::now().saturating_duration_since(quiet_until);
        if late > stall {
            cluster.distrust(p, &subject.identity);
            return fail(
                &subject,
                format!(
                    "this node's loop did not run for {late:?} past its time; opening the consumer again from this node's position"
                ),
            );
        }
        cluster.barrier().running(p);
        let pending = match next {
            None => {
                if let Err(detail) = subject.idle(&mut unreceived).await {
                    return fail(&subject, detail);
                }
                quiet_until = tokio::time::Instant::now() + quiet;
                0
            }
            Some(Some(Ok(first))) => {
                let pending = match subject.take_and_mark(first, &mut messages).await {
                    Ok(pending) => pending,
                    Err(e) => return Ended::Failed(e),
                };
                quiet_until = tokio::time::Instant::now() + quiet;
                unreceived = None;
                pending
            }
            // The client reconnects by itself; a missed heartbeat and the like end here.
            Some(Some(Err(e))) => return fail(&subject, e.to_string()),
            Some(None) => return fail(&subject, "ended".into()),
        };
        if p != LIVE
            && pending == 0
            && let Some(dropped) = join(work, &subject, &mut joining).await
        {
            return Ended::Carried(dropped);
        }
    }
}

/// The live consumer's partitions (DESIGN §10, "one consumer a node"): a partition is
/// caught up by a consumer of its own (its copy, completeness and guards), then carried
/// by the live consumer, whose `filter_subjects` gain it, so that the node's steady
/// state is one replicated consumer, not one a subject.
#[derive(Default)]
struct Joins {
    /// Serializes changes of the live consumer's filter: two joins at once would each
    /// write back the filter they read.
    filter: tokio::sync::Mutex<()>,
    state: std::sync::Mutex<JoinState>,
    /// Wakes the live consumer's loop for the adoptions asked.
    asked: tokio::sync::Notify,
}

#[derive(Default)]
struct JoinState {
    /// The live consumer's instance and consumer while its loop runs: partitions join it.
    live: Option<(String, PullConsumer)>,
    /// Counts the changes that took subjects out of the live consumer's filter (each of
    /// its openings sets it back to the live subject alone, and a partition handed over
    /// leaves it): a partition added to the filter before one may no longer be in it,
    /// whether or not the consumer is still the same instance, so a join holds only in
    /// the epoch it was made in.
    epoch: u64,
    /// Partitions asking the live consumer's loop to carry them.
    asked: Vec<Adoption>,
    /// Partitions joining the live consumer: marked before the stream's last sequence
    /// their join waits for is read, and applied by the live consumer from then on (its
    /// subject may be in the filter already for another partition: the live consumer
    /// applies only the partitions it carries or that are joining it, [`Keep`]). Each
    /// with its join's number: only that join's adoption takes the partition (one asked
    /// by a task stopped since must not take a later task's join).
    joining: BTreeMap<u32, u64>,
    /// The number of the last join marked.
    joins: u64,
    /// The carried partitions, each with the sender whose drop tells its task that the
    /// live consumer no longer carries it.
    carried: HashMap<u32, tokio::sync::oneshot::Sender<()>>,
}

/// A partition's request to be carried by the live consumer.
struct Adoption {
    p: u32,
    /// The live consumer's instance once `p` was in its filter.
    live: String,
    /// The filter's [`JoinState::epoch`] when `p` was added to it.
    epoch: u64,
    /// The join's number in [`JoinState::joining`].
    join: u64,
    /// The stream's last sequence once `p` was in the live consumer's filter: it
    /// delivers `p`'s messages after it, and `p`'s own consumer applied those up to it.
    at: u64,
    /// When it asked.
    asked: tokio::time::Instant,
    reply: tokio::sync::oneshot::Sender<tokio::sync::oneshot::Receiver<()>>,
}

fn lock(state: &std::sync::Mutex<JoinState>) -> std::sync::MutexGuard<'_, JoinState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The live consumer no longer carries `p`: out of both records of it, the loop's
/// (`state`, whose dropped sender tells `p`'s task) and the barrier's.
fn uncarry(state: &mut JoinState, cluster: &Cluster, p: u32) {
    state.carried.remove(&p);
    cluster.barrier().drop_carried(p);
}

/// The live consumer carries nothing from now on and takes nothing until it is opened
/// again: each partition it carried catches up through its own consumer again, not
/// answered for meanwhile.
fn release_carried(work: &Consuming) {
    let mut state = lock(&work.joins.state);
    state.live = None;
    // Its opening sets its filter back to the live subject alone: what joined before is
    // no longer in it.
    state.epoch += 1;
    state.asked.clear();
    state.joining.clear();
    let carried: Vec<u32> = state.carried.keys().copied().collect();
    for p in carried {
        uncarry(&mut state, &work.cluster, p);
        work.cluster.members().withdraw(p);
    }
}

/// Changes the subjects of `consumer`, of the cluster's stream, with `change` (which says
/// whether it changed them); returns the consumer's state after.
async fn update_filter(
    cluster: &Cluster,
    consumer: &PullConsumer,
    change: impl FnOnce(&mut BTreeSet<String>) -> bool,
) -> Result<jetstream::consumer::Info, String> {
    let info = consumer.get_info().await.map_err(|e| e.to_string())?;
    let mut config =
        pull::Config::try_from_consumer_config(info.config.clone()).map_err(|e| e.to_string())?;
    let mut subjects: BTreeSet<String> = config.filter_subjects.drain(..).collect();
    if !config.filter_subject.is_empty() {
        subjects.insert(std::mem::take(&mut config.filter_subject));
    }
    if !change(&mut subjects) {
        return Ok(info);
    }
    if subjects.len() == 1 {
        config.filter_subject = subjects.pop_first().unwrap_or_default();
    } else {
        config.filter_subjects = subjects.into_iter().collect();
    }
    cluster
        .jetstream()
        .update_consumer_on_stream(config, &cluster.config().stream)
        .await
        .map_err(|e| format!("changing its subjects: {e}"))?;
    consumer.get_info().await.map_err(|e| e.to_string())
}

/// Adds partition `p` to the live consumer's filter: the live consumer's instance, and
/// the stream's last sequence once its leader reported `p` in its filter: every message
/// of `p` after it is delivered by the live consumer (it could not have looked past one
/// before it was in the stream), so `p`'s own consumer must apply up to it. (Not the
/// sequence the consumer reports delivered: that is its stored state, which may trail
/// what it looked past while `p` was not in its filter.) With them, the filter's epoch
/// ([`JoinState::epoch`]) the join holds in. `None` if the live consumer does not take
/// partitions now (not running, another join or its opening under way, or JetStream
/// failed: tried again later).
async fn join_filter(work: &Consuming, p: u32) -> Option<Joined> {
    let cluster = &work.cluster;
    let subject = cluster.config().partition_subject(p);
    let updated = async {
        let _filter = work.joins.filter.lock().await;
        let (live, consumer, epoch, join) = {
            let mut state = lock(&work.joins.state);
            let (live, consumer) = state
                .live
                .clone()
                .ok_or_else(|| "the live consumer is not running".to_string())?;
            // Before the stream's last sequence is read: every message after it reaches
            // a batch of the live consumer received after this mark, which applies `p`.
            state.joins += 1;
            let join = state.joins;
            state.joining.insert(p, join);
            (live, consumer, state.epoch, join)
        };
        let info = update_filter(cluster, &consumer, |subjects| {
            subjects.insert(subject.clone())
        })
        .await?;
        let filtered =
            info.config.filter_subject == subject || info.config.filter_subjects.contains(&subject);
        if identity(&info) != live || !filtered {
            return Err("the live consumer was made again meanwhile".to_string());
        }
        let last = cluster
            .stream_last_sequence()
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(Joined {
            live,
            epoch,
            join,
            at: last,
            since: tokio::time::Instant::now(),
        })
    };
    match tokio::time::timeout(filter_timeout(cluster.config()), updated).await {
        Ok(Ok(joined)) => Some(joined),
        Ok(Err(e)) => {
            tracing::debug!(partition = p, error = %e, "cluster: adding a partition to the live consumer");
            None
        }
        Err(_) => {
            tracing::debug!(
                partition = p,
                "cluster: adding a partition to the live consumer timed out"
            );
            None
        }
    }
}

/// A partition in the live consumer's filter, waiting to be adopted ([`join_filter`]).
#[derive(Clone)]
struct Joined {
    /// The live consumer's instance.
    live: String,
    /// The filter's [`JoinState::epoch`].
    epoch: u64,
    /// The join's number in [`JoinState::joining`].
    join: u64,
    /// The stream's last sequence once the partition was in the filter.
    at: u64,
    /// When it was added to the filter.
    since: tokio::time::Instant,
}

/// The longest a change of the live consumer's filter, or a wait for its loop to adopt
/// a partition, may take: two seconds, and never so long that the consume loop waiting
/// for it stalls ([`super::ClusterConfig::stall`]).
fn filter_timeout(config: &super::ClusterConfig) -> Duration {
    Duration::from_secs(2).min(config.stall() / 4)
}

/// Partition `subject` (its own consumer, with nothing left to deliver) joins the live
/// consumer once ready: in its filter first (`joining` keeps where the live consumer
/// was then), then, once its own consumer applied up to there, adopted by the live
/// consumer's loop between two batches ([`adopt_asked`]). Returns what tells the task
/// the live consumer dropped it, once carried.
async fn join(
    work: &Consuming,
    subject: &Subject<'_>,
    joining: &mut Option<Joined>,
) -> Option<tokio::sync::oneshot::Receiver<()>> {
    let (cluster, p) = (&work.cluster, subject.p);
    if cluster.config().own_partition_consumers
        || !subject.complete
        || !cluster.members().is_ready_here(p)
    {
        return None;
    }
    if joining.is_none() {
        let joined = join_filter(work, p).await?;
        tracing::debug!(
            partition = p,
            until = joined.at,
            "partition in the live consumer's filter; its own consumer applies on until its position reaches the stream's last sequence then"
        );
        *joining = Some(joined);
    }
    let Joined {
        live,
        epoch,
        join,
        at,
        since,
    } = joining.clone()?;
    if since.elapsed() < cluster.config().join_hold {
        return None;
    }
    if lock(&work.joins.state).epoch != epoch {
        // Taken out of the filter since (the live consumer opened again, or a partition
        // left it): joined again from the start.
        *joining = None;
        return None;
    }
    if cluster.position(p).applied < at && !delivered_through(cluster, subject, at).await {
        return None;
    }
    let adopted = {
        let mut state = lock(&work.joins.state);
        if state.epoch != epoch {
            *joining = None;
            return None;
        }
        let (reply, adopted) = tokio::sync::oneshot::channel();
        state.asked.push(Adoption {
            p,
            live,
            epoch,
            join,
            at,
            asked: tokio::time::Instant::now(),
            reply,
        });
        adopted
    };
    work.joins.asked.notify_one();
    match tokio::time::timeout(filter_timeout(cluster.config()), adopted).await {
        Ok(Ok(dropped)) => Some(dropped),
        // Refused (the live consumer opened again since, or its filter lost subjects) or
        // not taken in time: joined again from the start.
        _ => {
            *joining = None;
            None
        }
    }
}

/// Whether this node holds every message of `subject`'s partition up to stream sequence
/// `at`, read after `at` was the stream's last: its own consumer has nothing left to
/// deliver and this node applied every delivery of it (the one rule), so every message
/// of the partition the stream held then is applied, unless the stream dropped some
/// before the consumer reached them (`nothing_aged_out`). Recorded if so. (What the
/// consumer reports it looked at may trail the stream for a while: seen holding a quiet
/// partition's join for minutes.)
async fn delivered_through(cluster: &Cluster, subject: &Subject<'_>, at: u64) -> bool {
    let p = subject.p;
    let Ok(info) = subject.consumer.get_info().await else {
        return false;
    };
    let theirs = Delivered::of(&info);
    let mine = cluster.position(p);
    let through = theirs.consumer == subject.identity
        && info.num_pending == 0
        && matches!(vouched(&theirs, &mine), Vouched::All { .. })
        && matches!(
            guard(subject.complete, nothing_aged_out(cluster, p, mine.applied)).await,
            Ok(true)
        );
    if through {
        cluster.record_applied(p, at);
    }
    through
}

/// The live consumer's loop, between two batches, adopts the partitions that asked
/// ([`join`]) if its instance `live` is the one they joined and each is applied up to
/// where it joined: from then on its deliveries vouch for them
/// ([`super::engine::Cluster::adopt_position`]).
fn adopt_asked(work: &Consuming, live: &str) {
    let cluster = &work.cluster;
    let mut state = lock(&work.joins.state);
    let hold = cluster.config().adopt_hold;
    let (asked, held) = std::mem::take(&mut state.asked)
        .into_iter()
        .partition::<Vec<_>, _>(|a| a.asked.elapsed() >= hold);
    if !held.is_empty() {
        // Wakes the loop once they are due, even with nothing to deliver.
        let joins = Arc::clone(&work.joins);
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            joins.asked.notify_one();
        });
    }
    state.asked = held;
    for adoption in asked {
        let position = cluster.position(LIVE);
        let running = state.live.as_ref().is_some_and(|(l, _)| l == live);
        // The same instance is not enough: each opening sets the filter back, and a
        // partition that left takes itself out; only a join of this very filter holds.
        if !running
            || adoption.epoch != state.epoch
            || adoption.live != live
            || position.consumer != live
            || cluster.position(adoption.p).applied < adoption.at
            // Unmarked since (handed over meanwhile: the live consumer may have passed
            // over some of its messages), or marked by a later join than this one's.
            || state.joining.get(&adoption.p) != Some(&adoption.join)
            // Its task no longer waits (stopped, or gave up): a later join may be under
            // way, whose own consumer applies on.
            || adoption.reply.is_closed()
        {
            tracing::debug!(
                partition = adoption.p,
                running,
                joined = %adoption.live,
                live,
                followed = %position.consumer,
                "a partition's adoption by the live consumer refused; it joins again"
            );
            continue;
        }
        let p = adoption.p;
        state.joining.remove(&p);
        let (dropped, on_drop) = tokio::sync::oneshot::channel();
        let at = cluster.adopt_position(p, &position);
        cluster.barrier().carry(p);
        cluster.members().set_pending(p, 0);
        if adoption.reply.send(on_drop).is_err() {
            // Its task stopped meanwhile.
            cluster.barrier().drop_carried(p);
            continue;
        }
        state.carried.insert(p, dropped);
        tracing::debug!(
            partition = p,
            applied = at.applied,
            "partition carried by the live consumer"
        );
    }
}

/// Partition `p`, carried by the live consumer or joining it, is no longer applied here
/// (handed over): the live consumer no longer records it, and its filter drops it. Its position stays
/// where the live consumer left it.
async fn leave(work: &Consuming, p: u32) {
    let cluster = &work.cluster;
    {
        let mut state = lock(&work.joins.state);
        uncarry(&mut state, cluster, p);
        state.joining.remove(&p);
    }
    let subject = cluster.config().partition_subject(p);
    if lock(&work.joins.state).live.is_none() {
        // Stopping, or opened again: its opening sets the filter back.
        return;
    }
    let left = async {
        let _filter = work.joins.filter.lock().await;
        let Some((_, consumer)) = lock(&work.joins.state).live.clone() else {
            return Ok(());
        };
        update_filter(cluster, &consumer, |subjects| {
            let mut state = lock(&work.joins.state);
            // Its subject stays while another partition of it is carried or joining.
            let shared = state
                .applied()
                .any(|q| cluster.config().partition_subject(q) == subject);
            let removed = !shared && subjects.remove(&subject);
            if removed {
                // Out of the filter from now on: a join of `p` made meanwhile (owned
                // again) holds no more, nor does a carrying of it that began since.
                state.epoch += 1;
                uncarry(&mut state, cluster, p);
            }
            removed
        })
        .await
        .map(drop)
    };
    match tokio::time::timeout(Duration::from_secs(2), left).await {
        Ok(Ok(())) => {}
        // Its messages are applied on, harmlessly, until the live consumer's next opening.
        Ok(Err(e)) => {
            tracing::warn!(partition = p, error = %e, "cluster: taking a partition out of the live consumer")
        }
        Err(_) => tracing::warn!(
            partition = p,
            "cluster: taking a partition out of the live consumer timed out"
        ),
    }
}

/// Opens `p`'s consumer ([`open`]) and its flow of messages.
async fn subscribe(work: &Consuming, p: u32) -> Result<(Subject<'_>, pull::Stream), ClusterError> {
    let config = work.cluster.config();
    let subject = config.subject(p);
    let name = if p == LIVE {
        format!("{}-live", work.durable)
    } else {
        format!("{}-p{p}", work.durable)
    };
    let stream = work
        .cluster
        .jetstream()
        .get_stream(&config.stream)
        .await
        .map_err(|e| ClusterError::Stream {
            stream: config.stream.clone(),
            detail: e.to_string(),
        })?;
    // The live consumer opened again carries no partition: each rejoins through a
    // consumer of its own, which finds any gap since and copies it (DESIGN §10).
    let filter = if p == LIVE {
        release_carried(work);
        Some(work.joins.filter.lock().await)
    } else {
        None
    };
    let Opened {
        consumer,
        identity,
        complete,
        delivered,
        ack_all,
    } = open(work, p, &stream, &name, &subject)
        .await
        .map_err(|detail| consumer_error(work, &name, detail))?;
    if let Some(_filter) = filter {
        let live = subject.clone();
        update_filter(&work.cluster, &consumer, |subjects| {
            let others = subjects.len() > 1 || !subjects.contains(&live);
            *subjects = BTreeSet::from([live]);
            others
        })
        .await
        .map_err(|detail| consumer_error(work, &name, detail))?;
        lock(&work.joins.state).live = Some((identity.clone(), consumer.clone()));
    }
    let heartbeat = config.pull_heartbeat();
    let messages = consumer
        .stream()
        .heartbeat(heartbeat)
        .expires(heartbeat * 4)
        .messages()
        .await
        .map_err(|e| consumer_error(work, &name, e))?;
    tracing::debug!(consumer = %name, "applying {subject}");
    let applying = Subject {
        work,
        p,
        name,
        consumer,
        identity,
        complete,
        delivered,
        ack_all,
    };
    Ok((applying, messages))
}

/// Why consumer `name`'s loop ended: `detail`.
fn consumer_error(work: &Consuming, name: &str, detail: impl std::fmt::Display) -> ClusterError {
    ClusterError::Stream {
        stream: work.cluster.config().stream.clone(),
        detail: format!("consumer {name}: {detail}"),
    }
}

/// One subject's consumer, as its apply loop holds it.
struct Subject<'a> {
    work: &'a Consuming,
    /// The partition, or [`LIVE`].
    p: u32,
    /// The consumer's durable name.
    name: String,
    consumer: PullConsumer,
    /// Its instance ([`super::barrier::identity`]).
    identity: String,
    /// Whether the store holds every message of the subject the stream ever had.
    complete: bool,
    /// The consumer sequence of the last delivery applied: the next must follow it.
    delivered: u64,
    /// Whether one acknowledgement covers every delivery before it ([`Opened::ack_all`]).
    ack_all: bool,
}

impl Subject<'_> {
    /// Why the loop ends: `detail`.
    fn fail(&self, detail: impl std::fmt::Display) -> ClusterError {
        consumer_error(self.work, &self.name, detail)
    }

    /// Applies `first` and every message `messages` already received after it as one
    /// batch, in one write group of the store (one WAL sync), and acknowledges them after
    /// it. Returns the messages of the subject left to deliver after them, or why the
    /// consumer is to be opened again (what ended the batch, the stream's error or end,
    /// is taken up after it is applied).
    async fn take<S>(
        &mut self,
        first: async_nats::jetstream::Message,
        messages: &mut S,
    ) -> Result<u64, ClusterError>
    where
        S: tokio_stream::Stream<Item = Result<async_nats::jetstream::Message, pull::MessagesError>>
            + Unpin,
    {
        let (cluster, p) = (&self.work.cluster, self.p);
        let taken = std::time::Instant::now();
        let (messages, ended) = ready_messages(first, messages);
        // Every delivery of this consumer takes the next consumer sequence: one skipped
        // was delivered and lost on the way (a reconnect). Applying on would record a
        // position past it, so the consumer is opened again, from this node's position,
        // after the deliveries before it are applied.
        let (batch, gap) = in_sequence(messages, self.delivered);
        let ended = gap.or(ended.map(|e| match e {
            Some(e) => e.to_string(),
            None => "ended".to_string(),
        }));
        if batch.is_empty() {
            return Err(self.fail(ended.unwrap_or_default()));
        }
        // Messages of the subject between this node's position and these that the
        // stream dropped (max_age) before the consumer reached them were passed over
        // with no gap in the deliveries: a consumer far enough behind is opened again,
        // which finds what is missing and copies it. (A store already known to lack
        // messages answers for none of the subject and copies them before it does: it
        // applies on meanwhile, and its next copy covers what it skips now.) Checked
        // against the position before the batch: stricter than before each message.
        let applied = cluster.position(p).applied;
        match guard(self.complete, nothing_aged_out(cluster, p, applied)).await {
            Ok(true) => {}
            Ok(false) => {
                cluster.distrust(p, &self.identity);
                return Err(self.fail(
                    "it fell so far behind that the stream may have dropped messages it never delivered; opening it again from this node's position",
                ));
            }
            Err(detail) => return Err(self.fail(detail)),
        }
        let outcomes = apply_in_place(self.work, Applies::Subject(p), &self.name, &batch).await;
        let stall = cluster.config().stall();
        // Stalled: this consumer's deliveries vouch for nothing more (before these
        // messages are recorded, so that no reader takes what it looked at meanwhile as
        // applied).
        let stalled = taken.elapsed() > stall;
        if stalled {
            cluster.distrust(p, &self.identity);
        }
        let pending = self.record(&batch, outcomes).await;
        if stalled || taken.elapsed() > stall {
            cluster.distrust(p, &self.identity);
            return Err(self.fail(format!(
                "{} messages took {:?} to apply and acknowledge, longer than a quarter of cluster.max_age; opening the consumer again from this node's position",
                batch.len(),
                taken.elapsed()
            )));
        }
        match ended {
            Some(ended) => Err(self.fail(ended)),
            None => Ok(pending),
        }
    }

    /// [`idle`]: the consume loop received nothing for a while.
    async fn idle(&self, unreceived: &mut Option<u64>) -> Result<(), String> {
        let cluster = &self.work.cluster;
        idle(
            cluster,
            self.p,
            &self.consumer,
            &self.identity,
            self.complete,
            unreceived,
        )
        .await
    }

    /// [`Self::take`]; then, with nothing left to deliver, whether the partition is ready:
    /// ready once this node applied every delivery too (one request, only while not
    /// ready yet).
    async fn take_and_mark(
        &mut self,
        first: async_nats::jetstream::Message,
        messages: &mut pull::Stream,
    ) -> Result<u64, ClusterError> {
        let pending = self.take(first, messages).await?;
        let (cluster, p) = (&self.work.cluster, self.p);
        cluster.barrier().running(p);
        if p != LIVE && pending == 0 && !cluster.members().is_ready_here(p) {
            let info = self.consumer.get_info().await.map_err(|e| self.fail(e))?;
            record_outstanding(cluster, p, &info, self.complete);
        }
        Ok(pending)
    }

    /// Records `batch`, applied with `outcomes`: counts, this node's position, and
    /// acknowledgements. Returns the messages of the subject left after the batch.
    async fn record(&mut self, batch: &[Delivery], outcomes: Vec<Applied>) -> u64 {
        let (work, cluster, p) = (self.work, &self.work.cluster, self.p);
        for (delivery, outcome) in batch.iter().zip(&outcomes) {
            // Before the position, so that a reader who sees the position also sees the count.
            count(work, *outcome);
            work.metrics.cluster_applied_at(delivery.stream_sequence);
        }
        // The last delivery with an outcome vouches for every one before it: one write of
        // the position for the whole batch (never past a message without an outcome).
        if let Some(last) = batch[..outcomes.len().min(batch.len())].last() {
            cluster.record_delivery(
                p,
                &self.identity,
                last.consumer_sequence,
                last.stream_sequence,
            );
        }
        let mut pending = 0;
        // Under `AckPolicy::All` one acknowledgement, of the furthest delivery in the
        // stream with an outcome, covers the batch (a redelivery may come last with an
        // earlier stream sequence); a refused one among them is then not redelivered, as
        // its Term would have done. A delivery without an outcome (none today: the apply
        // gives each one) is never acknowledged, unless it repeats a message of the
        // stream before the furthest, which this consumer delivered and the node applied
        // first (first deliveries come in stream order, and a gap ends the batch).
        let furthest = batch[..outcomes.len().min(batch.len())]
            .iter()
            .enumerate()
            .max_by_key(|(_, d)| d.stream_sequence)
            .map(|(i, _)| i);
        for (i, (delivery, outcome)) in batch.iter().zip(outcomes).enumerate() {
            // Every message of the subject still to come was published after this one.
            cluster
                .barrier()
                .fresh_since(p, &self.identity, delivery.published);
            self.delivered = delivery.consumer_sequence;
            pending = delivery.pending;
            if self.ack_all && Some(i) != furthest {
                continue;
            }
            let ack = match outcome {
                Applied::Refused if !self.ack_all => AckKind::Term,
                Applied::Refused | Applied::Ok | Applied::Retry => AckKind::Ack,
            };
            // A lost acknowledgement only means a redelivery, which the version rule
            // absorbs; nothing here depends on it (the ack floor vouches for nothing,
            // DESIGN §10), so it is sent without waiting for JetStream's confirmation:
            // awaited, each was a consensus round of the consumer's replicas before the
            // next message (docs/BENCHMARKS.md, "Cluster mode").
            if let Err(e) = delivery.message.ack_with(ack).await {
                tracing::warn!(consumer = %self.name, error = %e, "acknowledging a cluster message");
            }
        }
        cluster.members().set_pending(p, pending);
        pending
    }
}

/// The most messages applied as one batch (one write group of the store).
const MAX_BATCH: usize = 256;

/// `first` and the messages `messages` has already received after it, up to
/// [`MAX_BATCH`] in all; and, if the stream gave an error or ended right after them, that
/// (`Some(None)` for its end).
fn ready_messages<S>(
    first: async_nats::jetstream::Message,
    messages: &mut S,
) -> (
    Vec<async_nats::jetstream::Message>,
    Option<Option<Box<dyn std::error::Error + Send + Sync>>>,
)
where
    S: tokio_stream::Stream<
            Item = Result<
                async_nats::jetstream::Message,
                async_nats::jetstream::consumer::pull::MessagesError,
            >,
        > + Unpin,
{
    let mut batch = vec![first];
    let waker = std::task::Waker::noop();
    let mut context = std::task::Context::from_waker(waker);
    while batch.len() < MAX_BATCH {
        match std::pin::Pin::new(&mut *messages).poll_next(&mut context) {
            std::task::Poll::Ready(Some(Ok(message))) => batch.push(message),
            std::task::Poll::Ready(Some(Err(e))) => return (batch, Some(Some(Box::new(e)))),
            std::task::Poll::Ready(None) => return (batch, Some(None)),
            std::task::Poll::Pending => break,
        }
    }
    (batch, None)
}

/// One delivery of a consumer, with its place in the stream.
struct Delivery {
    message: async_nats::jetstream::Message,
    consumer_sequence: u64,
    stream_sequence: u64,
    /// Messages of the subject left to deliver after it.
    pending: u64,
    /// When it was published.
    published: std::time::SystemTime,
}

/// The deliveries of `messages` that follow delivery `delivered` one by one, and why the
/// rest do not (a delivery lost on the way, or a message without its position).
fn in_sequence(
    messages: Vec<async_nats::jetstream::Message>,
    mut delivered: u64,
) -> (Vec<Delivery>, Option<String>) {
    let mut batch = Vec::with_capacity(messages.len());
    for message in messages {
        let (consumer_sequence, stream_sequence, pending, published) = match message.info() {
            Ok(info) if info.consumer_sequence == delivered + 1 => (
                info.consumer_sequence,
                info.stream_sequence,
                info.pending,
                system_time(info.published.unix_timestamp_nanos()),
            ),
            Ok(info) => {
                let gap = format!(
                    "deliveries {} to {} were lost on the way",
                    delivered + 1,
                    info.consumer_sequence.saturating_sub(1)
                );
                return (batch, Some(gap));
            }
            Err(e) => return (batch, Some(format!("a message without its position: {e}"))),
        };
        let info = Delivery {
            message,
            consumer_sequence,
            stream_sequence,
            pending,
            published,
        };
        delivered = info.consumer_sequence;
        batch.push(info);
    }
    (batch, None)
}

/// Applies `batch` in order, retrying in place from the first message the store could
/// not take (with those after it), so that the position recorded as applied never passes
/// a message not applied. Returns each message's outcome (never [`Applied::Retry`]).
async fn apply_in_place(
    work: &Consuming,
    applies: Applies<'_>,
    name: &str,
    batch: &[Delivery],
) -> Vec<Applied> {
    let mut outcomes = Vec::with_capacity(batch.len());
    loop {
        let rest = &batch[outcomes.len()..];
        let delay = work.cluster.config().apply_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay * u32::try_from(rest.len()).unwrap_or(u32::MAX)).await;
        }
        let applied = apply_batch(work, applies, rest).await;
        // It stops at the first message to retry: those after it are retried with it.
        let retry = applied.iter().position(|o| *o == Applied::Retry);
        outcomes.extend(applied.into_iter().take(retry.unwrap_or(usize::MAX)));
        if retry.is_none() {
            return outcomes;
        }
        count(work, Applied::Retry);
        for delivery in &batch[outcomes.len()..] {
            if let Err(e) = delivery.message.ack_with(AckKind::Progress).await {
                tracing::warn!(consumer = %name, error = %e, "telling JetStream a cluster message is being retried");
            }
        }
        tokio::time::sleep(RETRY_DELAY).await;
    }
}

/// Applies `batch` through this node's [`GroupCommit`], in one write group of the store with
/// whatever the node's other consumers apply at the same time (one WAL sync at its end):
/// each message's outcome, in order. A failed sync makes every message [`Applied::Retry`].
async fn apply_batch(work: &Consuming, applies: Applies<'_>, batch: &[Delivery]) -> Vec<Applied> {
    let messages: Vec<async_nats::Message> =
        batch.iter().map(|d| d.message.message.clone()).collect();
    let (done, outcomes) = tokio::sync::oneshot::channel();
    // Read once the batch was received, never before (DESIGN §10, a partition joining
    // the live consumer).
    let (p, keep) = match applies {
        Applies::Subject(LIVE) => (LIVE, Keep::Live(work.joins.applied())),
        Applies::Subject(p) => (p, Keep::One(p)),
        Applies::Partitions(set) => (
            set.first().copied().unwrap_or(LIVE),
            Keep::Many(set.clone()),
        ),
    };
    let job = Job {
        keep,
        messages,
        done,
    };
    if work.commit.jobs.send(job).is_err() {
        tracing::error!(
            partition = p,
            "this node's group commit of cluster messages has stopped; retrying"
        );
        return vec![Applied::Retry; batch.len()];
    }
    outcomes.await.unwrap_or_else(|_| {
        tracing::error!(
            partition = p,
            "a batch of cluster messages was dropped by the group commit; retrying it"
        );
        vec![Applied::Retry; batch.len()]
    })
}

/// The most messages one write group of the [`GroupCommit`] takes: batches waiting beyond it
/// go in the next group.
const MAX_GROUP: usize = 4 * MAX_BATCH;

/// This node's one group commit of what its consumers apply (through the [`Writer`]).
/// Each consumer applies its subject's messages in order, a batch at a time; the group
/// commit takes every batch waiting
/// when it is free (up to [`MAX_GROUP`] messages) and writes them in one write group of
/// the store, synced once, so that a node applying many partitions at once pays one WAL
/// sync for all of them, not one each (they were 20 to 40 syncs a push with one each).
/// Each batch still stops at its first message to retry, and its consumer waits for its
/// outcome before its next batch, so a subject's order is kept.
#[derive(Clone)]
struct GroupCommit {
    jobs: std::sync::mpsc::Sender<Job>,
}

/// One consumer's batch for the [`GroupCommit`], and where its outcomes go.
struct Job {
    /// The partitions whose snapshots it applies.
    keep: Keep,
    messages: Vec<async_nats::Message>,
    done: tokio::sync::oneshot::Sender<Vec<Applied>>,
}

impl GroupCommit {
    /// Starts the group commit on a thread of the blocking pool; it ends once every
    /// [`Consuming`] (which hold its sender) is gone.
    fn start(cluster: Arc<Cluster>, applier: Arc<Writer>) -> GroupCommit {
        let (jobs, waiting) = std::sync::mpsc::channel::<Job>();
        tokio::task::spawn_blocking(move || {
            while let Ok(first) = waiting.recv() {
                let mut group = vec![first];
                let mut messages = group[0].messages.len();
                while messages < MAX_GROUP {
                    let Ok(job) = waiting.try_recv() else { break };
                    messages += job.messages.len();
                    group.push(job);
                }
                let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    write_group(&cluster, &applier, &group)
                }));
                let outcomes = written.unwrap_or_else(|_| {
                    tracing::error!("applying a group of cluster messages panicked; retrying them");
                    group
                        .iter()
                        .map(|job| vec![Applied::Retry; job.messages.len()])
                        .collect()
                });
                for (job, outcomes) in group.into_iter().zip(outcomes) {
                    // A consumer stopped meanwhile no longer waits: its messages come again.
                    let _ = job.done.send(outcomes);
                }
            }
        });
        GroupCommit { jobs }
    }
}

/// Applies every job of `group` in one write group of the store: each job's outcomes, in
/// order, up to its first message the store could not take (the rest of that job are
/// applied after it, in order: a later live message must not set a server's labels
/// before an earlier one does). A failed sync makes every outcome [`Applied::Retry`].
fn write_group(cluster: &Cluster, applier: &Writer, group: &[Job]) -> Vec<Vec<Applied>> {
    let mut outcomes: Vec<Vec<Applied>> = group
        .iter()
        .map(|job| Vec::with_capacity(job.messages.len()))
        .collect();
    let synced = applier.store().write_group(&mut || {
        for (job, outcomes) in group.iter().zip(outcomes.iter_mut()) {
            for m in &job.messages {
                // The live consumer delivers the subjects of the partitions it carries too.
                let live = match &job.keep {
                    Keep::One(_) | Keep::Many(_) => Some(false),
                    Keep::Live(_) => stream_subject(cluster.config(), m.subject.as_str())
                        .map(|k| k == LIVE),
                };
                let outcome = match live {
                    Some(true) => apply_live(cluster, applier, m),
                    Some(false) => apply_partitions(cluster, applier, &job.keep, m),
                    None => {
                        tracing::error!(subject = %m.subject, "a cluster message on a subject of no partition; skipped");
                        Applied::Refused
                    }
                };
                outcomes.push(outcome);
                if outcome == Applied::Retry {
                    break;
                }
            }
        }
        Ok(())
    });
    if let Err(e) = synced {
        tracing::warn!(batches = group.len(), error = %e, "syncing a group of cluster messages failed; retrying them");
        for outcome in outcomes.iter_mut().flatten() {
            *outcome = Applied::Retry;
        }
    }
    outcomes
}

/// The consume loop of `p` received nothing for a while: asks its consumer what it
/// delivered. Deliveries this node has not received, still missing at the next such
/// check (`unreceived` holds the last seen), were lost on the way and will not come back
/// before `ACK_WAIT`, or ever if the stream drops them first: the consumer is opened
/// again (the error). With every delivery applied and nothing left, what the consumer
/// looked at is applied, unless the stream may have dropped some of it before the
/// consumer reached it ([`nothing_aged_out`]: the consumer is distrusted and opened
/// again, the error): recorded, so that a quiet subject's position follows the stream
/// and a reopen after `max_age` does not take what the stream dropped of others as
/// missing.
async fn idle(
    cluster: &Cluster,
    p: u32,
    consumer: &PullConsumer,
    identity: &str,
    complete: bool,
    unreceived: &mut Option<u64>,
) -> Result<(), String> {
    let asked = std::time::SystemTime::now();
    let info = match consumer.get_info().await {
        Ok(info) => info,
        Err(e) => {
            tracing::debug!(partition = p, error = %e, "cluster: reading an idle consumer's state");
            return Ok(());
        }
    };
    let theirs = Delivered::of(&info);
    if theirs.consumer != identity {
        return Err("JetStream holds another instance of it than the one opened".into());
    }
    let mine = cluster.position(p);
    // Below, what is left is recorded as the consumer counts it now: the last delivery's
    // count is stale once messages it counted are gone (aged out, or a publish a lost
    // quorum never committed), and would say "pending" for good (seen: 16 left for 120 s).
    match vouched(&theirs, &mine) {
        Vouched::All { at } => {
            if info.num_pending == 0 {
                if !guard(complete, nothing_aged_out(cluster, p, mine.applied)).await? {
                    cluster.distrust(p, identity);
                    return Err("it fell so far behind that the stream may have dropped messages it looked past without delivering them".into());
                }
                // Nothing was left to deliver: what comes was published after `asked`.
                cluster.barrier().fresh_since(p, identity, asked);
                cluster.record_applied(p, at);
            }
            record_outstanding(cluster, p, &info, complete);
            *unreceived = None;
            Ok(())
        }
        Vouched::Behind { .. } if unreceived.is_some_and(|d| d > mine.delivered) => Err(format!(
            "deliveries {} to {} never arrived",
            mine.delivered + 1,
            theirs.consumer_sequence
        )),
        Vouched::Behind { .. } => {
            record_outstanding(cluster, p, &info, complete);
            *unreceived = Some(theirs.consumer_sequence);
            Ok(())
        }
        Vouched::Other { .. } => Err("its deliveries no longer vouch for anything here".into()),
    }
}

/// What [`open`] opened.
struct Opened {
    consumer: PullConsumer,
    /// Its instance ([`super::barrier::identity`]).
    identity: String,
    /// Whether the store holds every message of the subject the stream ever had.
    complete: bool,
    /// The consumer sequence of its last delivery: the next one must follow it.
    delivered: u64,
    /// Whether one acknowledgement covers every delivery before it (`AckPolicy::All`;
    /// consumers made before that policy acknowledge each delivery).
    ack_all: bool,
}

/// Opens the durable consumer `name` of `subject` (partition `p` or [`LIVE`]) for this
/// store, and says whether the store holds every message the stream ever had of it: if
/// not, it first copies what is missing from another node ([`super::copy`]). Records what
/// the store has applied, and its readiness.
///
/// How far the store holds the subject comes from this node's own record
/// ([`super::barrier::vouched`]): what the consumer looked at counts only if this node
/// received and applied every delivery of this very consumer instance. Else (deliveries
/// it never applied, or another instance) the consumer starts again right after the
/// store's own position.
async fn open(
    work: &Consuming,
    p: u32,
    stream: &jetstream::stream::Stream,
    name: &str,
    subject: &str,
) -> Result<Opened, String> {
    let cluster = &work.cluster;
    let config = cluster.config();
    let consumer_config = |deliver_policy, complete: bool| {
        consumer_config(config, name, subject, deliver_policy, complete)
    };
    let (first, instance) = stream_state(stream, &work.cluster).await?;
    let mine = cluster
        .load_position(p, &instance)
        .map_err(|e| format!("reading this store's position: {e}"))?;
    // The live subject in another instance (the stream made again): the positions the
    // old one's live messages named say nothing here, and none of the new one is named
    // yet (every push acknowledged in it is named by a live message of it, which the
    // barrier's first step waits for). Without this, partitions opened in the new
    // instance stayed behind requirements of the old one until a push came.
    if p == LIVE {
        cluster.barrier().require(&instance, &[]);
    }
    // A new consumer is of a new store (or of one whose consumer JetStream removed, idle
    // for longer than the stream keeps messages): complete if the stream never dropped a
    // message.
    let mut consumer = stream
        .get_or_create_consumer(name, consumer_config(DeliverPolicy::All, first <= 1))
        .await
        .map_err(|e| e.to_string())?;
    let mut info = consumer.get_info().await.map_err(|e| e.to_string())?;
    // Its record says whether it missed messages (consumers of older versions have none),
    // and it missed those the stream dropped (max_age) after what it holds.
    let mut marked = info
        .config
        .metadata
        .get(COMPLETE_KEY)
        .is_none_or(|v| v == "true");
    let theirs = Delivered::of(&info);
    let verdict = verdict_on(stream, &theirs, &mine).await?;
    // Every message of the subject up to it is in the store.
    let held = verdict.at();
    match verdict {
        Vouched::All { .. } => {}
        // A consumer that delivered nothing yet and starts right after what the store
        // holds (a new store's, on a stream that never dropped a message): this store's.
        Vouched::Other { .. }
            if theirs.consumer_sequence == 0 && theirs.stream_sequence == mine.applied =>
        {
            cluster.follow(p, &theirs.consumer);
        }
        // Deliveries this store never applied (lost on the way, in the buffer of a process
        // that stopped, or given up by JetStream when the stream dropped them) would
        // claim messages never applied, or come back (after ACK_WAIT) behind later ones;
        // another instance's deliveries say nothing of this store. So the consumer starts
        // again right after what the store holds, and delivers in order from there (what
        // it delivers again was applied or not; the version rule makes both the same).
        Vouched::Behind { .. } | Vouched::Other { .. } => {
            // Marked complete if it was and the stream's start as read at the top keeps
            // everything after `held`: if the start moved since, the skip check finds it
            // from the consumer itself.
            let created_marked = marked && held.saturating_add(1) >= first;
            (consumer, info, marked) = start_again(
                stream,
                name,
                &theirs,
                &mine,
                held,
                created_marked,
                &consumer_config,
            )
            .await?;
            cluster.follow(p, &identity(&info));
        }
    }
    finish_opening(work, p, stream, consumer, &info, held, marked).await
}

/// What the consumer's deliveries (`theirs`) vouch for in this store, at position `mine`
/// ([`vouched`]), and no more than the stream still holds after the position.
async fn verdict_on(
    stream: &jetstream::stream::Stream,
    theirs: &Delivered,
    mine: &crate::store::StreamPosition,
) -> Result<Vouched, String> {
    let mut verdict = vouched(theirs, mine);
    // What the consumer looked at past this store's position counts only if the stream
    // dropped none of it before the consumer reached it: one that fell behind by
    // max_age (in this process or the one before) may have looked past such messages
    // with no gap in its deliveries. Read after the consumer's state: if the stream has
    // dropped anything after the position by now, the consumer starts again from the
    // position, and the check below finds what is missing.
    if let Vouched::All { at } = verdict
        && at > mine.applied
        && stream_first(stream).await? > mine.applied.saturating_add(1)
    {
        verdict = Vouched::Behind { at: mine.applied };
    }
    Ok(verdict)
}

/// The durable pull consumer `name` of `subject`, as this node opens it.
fn consumer_config(
    config: &super::ClusterConfig,
    name: &str,
    subject: &str,
    deliver_policy: DeliverPolicy,
    complete: bool,
) -> pull::Config {
    pull::Config {
        durable_name: Some(name.to_string()),
        description: Some(format!("hourglass node {} applies {subject}", config.node)),
        filter_subject: subject.to_string(),
        deliver_policy,
        // One acknowledgement a batch, for every delivery of it: each acknowledgement of a
        // replicated consumer is a consensus round of its servers, and nothing here relies
        // on the ack floor (DESIGN §10), only on redelivery of what was not acknowledged.
        ack_policy: AckPolicy::All,
        ack_wait: ACK_WAIT,
        max_ack_pending: MAX_ACK_PENDING,
        // The consumer of a store that is gone (a wiped node) is removed by the
        // servers once it has been idle as long as the stream keeps messages (a day at
        // least: a short max_age must not remove the consumer of a quiet partition).
        inactive_threshold: config.max_age.max(MIN_INACTIVE),
        metadata: HashMap::from([(COMPLETE_KEY.to_string(), complete.to_string())]),
        ..pull::Config::default()
    }
}

/// Makes consumer `name` again, to deliver in order from right after `held`, what this
/// store holds (its deliveries so far vouch for nothing here: [`open`]), marked
/// `created_marked`; follows it once what it skipped is on record. Returns it, its state,
/// and whether it is marked complete.
async fn start_again(
    stream: &jetstream::stream::Stream,
    name: &str,
    theirs: &Delivered,
    mine: &crate::store::StreamPosition,
    held: u64,
    created_marked: bool,
    consumer_config: &impl Fn(DeliverPolicy, bool) -> pull::Config,
) -> Result<(PullConsumer, jetstream::consumer::Info, bool), String> {
    tracing::info!(
        consumer = %name,
        delivered = theirs.consumer_sequence,
        applied_here = mine.delivered,
        from = held + 1,
        "starting the consumer again from what this store holds"
    );
    stream
        .delete_consumer(name)
        .await
        .map_err(|e| e.to_string())?;
    let from = DeliverPolicy::ByStartSequence {
        start_sequence: held + 1,
    };
    let consumer = stream
        .create_consumer(consumer_config(from, created_marked))
        .await
        .map_err(|e| e.to_string())?;
    let info = consumer.get_info().await.map_err(|e| e.to_string())?;
    // The server starts a consumer whose start the stream no longer has at the
    // stream's first message, and counts the ones before as looked at: those this
    // store lacks. That must be on record before this instance is followed (its
    // deliveries then vouch for what it looked at): a mark written after, and lost
    // to a failure or a kill in between, would leave a followed instance that
    // looked past them and a consumer marked complete. Until then the instance is
    // not followed, and the next opening makes the consumer again.
    let skipped = info.delivered.stream_sequence > held;
    if skipped && created_marked {
        mark_complete(stream, &info, false).await?;
    }
    let marked = created_marked && !skipped;
    Ok((consumer, info, marked))
}

/// The end of [`open`], once `consumer` is what this node applies from, having applied
/// `held`: whether the store holds every message the stream ever had of the subject
/// (copying what it lacks if not), and what that says, recorded.
async fn finish_opening(
    work: &Consuming,
    p: u32,
    stream: &jetstream::stream::Stream,
    consumer: PullConsumer,
    info: &jetstream::consumer::Info,
    held: u64,
    marked: bool,
) -> Result<Opened, String> {
    let cluster = &work.cluster;
    let identity = identity(info);
    // Read once the consumer is what it applies from: what the stream dropped by then,
    // the consumer cannot deliver.
    let first = stream_first(stream).await?;
    let mut complete = marked && held.saturating_add(1) >= first;
    if !complete {
        // Recorded first: once this consumer applies past the stream's start, this
        // store's position alone would no longer show what it missed.
        if marked {
            mark_complete(stream, info, false).await?;
        }
        if let Some(at) = copy_missing(work, p, stream, held).await {
            mark_complete(stream, info, true).await?;
            // Every message up to it is in the store, copied.
            cluster.record_applied(p, at);
            complete = true;
        }
    }
    cluster.record_applied(p, held);
    cluster
        .barrier()
        .set_consumer(p, consumer.clone(), &identity);
    record_outstanding(cluster, p, info, complete);
    if p == LIVE {
        cluster.barrier().set_live_complete(complete);
    }
    Ok(Opened {
        consumer,
        identity,
        complete,
        delivered: info.delivered.consumer_sequence,
        ack_all: info.config.ack_policy == AckPolicy::All,
    })
}

/// The stream's first sequence: messages before it are gone (max_age).
async fn stream_first<I>(stream: &jetstream::stream::Stream<I>) -> Result<u64, String> {
    let info = stream.get_info().await.map_err(|e| e.to_string())?;
    Ok(info.state.first_sequence)
}

/// The stream's first sequence and the identity of its instance
/// ([`super::engine::stream_identity`]).
async fn stream_state<I>(
    stream: &jetstream::stream::Stream<I>,
    cluster: &Cluster,
) -> Result<(u64, String), String> {
    let config = cluster.config();
    let info = stream.get_info().await.map_err(|e| e.to_string())?;
    // Made again with other partitions or subjects? Its subjects are no longer what
    // this node reads them as.
    cluster.check_layout_now(&info.config.metadata)?;
    // Edited since this node started? Its guards assume it drops messages only by age.
    if let Err((setting, found, configured)) = super::engine::check_limits(&info.config, config) {
        return Err(format!(
            "the stream now has {setting} {found} where this node expects {configured}; it applies nothing until they agree"
        ));
    }
    Ok((
        info.state.first_sequence,
        super::engine::stream_identity(&info),
    ))
}

/// Copies what the stream dropped of `p` from another node. Returns the position the
/// copy reflects once this store holds every message of `p` the stream ever had (the
/// copy's, and from `held`, what the store held before, on the stream's), else `None`.
async fn copy_missing(
    work: &Consuming,
    p: u32,
    stream: &jetstream::stream::Stream,
    held: u64,
) -> Option<u64> {
    let copied = super::copy::fetch(&work.cluster, work.applier.store(), p).await;
    let at = match copied {
        Ok(at) => at,
        Err(e) => {
            tracing::error!(
                partition = p,
                error = %e,
                "this store lacks messages the stream no longer keeps (cluster.max_age) and no node could copy them; it applies what is there but does not answer for them"
            );
            return None;
        }
    };
    match stream_first(stream).await {
        // Nothing after the copy's position has been dropped since.
        Ok(first) if at.max(held).saturating_add(1) >= first => Some(at),
        Ok(first) => {
            tracing::warn!(
                partition = p,
                copied_to = at,
                stream_starts_at = first,
                "the stream dropped messages after the copy's position; copying again later"
            );
            None
        }
        Err(e) => {
            tracing::warn!(partition = p, error = %e, "reading the stream's start after a copy");
            None
        }
    }
}

/// Records in the consumer's metadata whether this store holds every message of its
/// subject the stream ever had.
async fn mark_complete(
    stream: &jetstream::stream::Stream,
    info: &async_nats::jetstream::consumer::Info,
    complete: bool,
) -> Result<(), String> {
    let mut config =
        pull::Config::try_from_consumer_config(info.config.clone()).map_err(|e| e.to_string())?;
    config
        .metadata
        .insert(COMPLETE_KEY.to_string(), complete.to_string());
    stream
        .update_consumer(config)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Counts one apply of a message by its outcome.
fn count(work: &Consuming, outcome: Applied) {
    work.metrics
        .cluster_applied
        .get_or_create(&ApplyLabel {
            outcome: match outcome {
                Applied::Ok => "ok",
                Applied::Refused => "refused",
                Applied::Retry => "retry",
            },
        })
        .inc();
}

/// The lag check `check` ([`nothing_aged_out`]) where it matters: in a store complete
/// so far. One known to lack messages vouches for nothing of the subject until a copy
/// fills it (then from the copy's position), so what its consumer skips meanwhile needs
/// no check, and checking would reopen it over the gap already on record.
async fn guard(
    complete: bool,
    check: impl Future<Output = Result<bool, String>>,
) -> Result<bool, String> {
    if complete { check.await } else { Ok(true) }
}

/// A NATS timestamp, in nanoseconds since the Unix epoch, as a `SystemTime` (one
/// before the epoch as the epoch).
fn system_time(unix_nanos: i128) -> std::time::SystemTime {
    let nanos = u64::try_from(unix_nanos).unwrap_or(0);
    std::time::UNIX_EPOCH + Duration::from_nanos(nanos)
}

/// The messages of `p` this node has still to apply, by its consumer's `info`: those not
/// delivered yet, and the deliveries this node has not received and applied (by the one
/// rule, [`super::barrier::vouched`]; the ack floor says nothing of them).
fn outstanding(cluster: &Cluster, p: u32, info: &async_nats::jetstream::consumer::Info) -> u64 {
    let theirs = Delivered::of(info);
    let mine = cluster.position(p);
    let unapplied = match vouched(&theirs, &mine) {
        Vouched::All { .. } => 0,
        Vouched::Behind { .. } => theirs.consumer_sequence - mine.delivered,
        Vouched::Other { .. } => theirs.consumer_sequence.max(1),
    };
    info.num_pending + unapplied
}

/// Records what `p`'s consumer has left by its `info` ([`outstanding`]): the live
/// subject's pending count, or a partition's, and with it whether the partition is ready.
fn record_outstanding(
    cluster: &Cluster,
    p: u32,
    info: &async_nats::jetstream::consumer::Info,
    complete: bool,
) {
    let left = outstanding(cluster, p, info);
    if p == LIVE {
        cluster.members().set_pending(LIVE, left);
    } else {
        cluster.members().caught_up(p, left, complete);
    }
}

/// The file in the data dir that names this store's consumer.
const CONSUMER_FILE: &str = "cluster-consumer";

/// The durable consumer of this node's store: `apply-NODE-ID`, where ID is made when the
/// store first joins the cluster and kept in `DATA_DIR/cluster-consumer` (written and
/// synced before the consumer is created). A store without the file has applied nothing
/// of the stream, so it gets a new ID and reads the stream from its first message.
pub(crate) fn consumer_name(data_dir: &Path, node: &str) -> std::io::Result<String> {
    let path = data_dir.join(CONSUMER_FILE);
    match std::fs::read_to_string(&path) {
        Ok(name) if is_consumer_of(name.trim(), node) => return Ok(name.trim().to_string()),
        Ok(name) => {
            tracing::warn!(
                file = %path.display(),
                found = name.trim(),
                node,
                "the data dir's consumer belongs to another node name; starting a new one"
            );
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let id =
        xxhash_rust::xxh3::xxh3_64(format!("{nanos} {} {node}", std::process::id()).as_bytes());
    let name = format!("apply-{node}-{id:016x}");
    let fresh = data_dir.join(format!(".{CONSUMER_FILE}.new"));
    {
        let mut file = std::fs::File::create(&fresh)?;
        std::io::Write::write_all(&mut file, format!("{name}\n").as_bytes())?;
        file.sync_all()?;
    }
    std::fs::rename(&fresh, &path)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    tracing::info!(consumer = %name, "this store joins the cluster: it applies the stream from its start");
    Ok(name)
}

/// `name` is a consumer name this module made for `node`.
fn is_consumer_of(name: &str, node: &str) -> bool {
    name.strip_prefix("apply-")
        .and_then(|rest| rest.strip_prefix(node))
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|id| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Which subject of the stream `subject` is: K of `PREFIX.p.K` ([`LIVE`] for the live
/// subject), or `None` for a subject of neither.
fn stream_subject(config: &super::ClusterConfig, subject: &str) -> Option<u32> {
    if subject == config.live_subject() {
        return Some(LIVE);
    }
    subject
        .strip_prefix(config.subject_prefix.as_str())?
        .strip_prefix(".p.")?
        .parse()
        .ok()
        .filter(|&k| k < config.subject_count())
}

/// The partitions whose snapshots a batch applies: a partition's own consumer, its own;
/// the live consumer, those it carries or that are joining it, as they were once the
/// batch was received ([`Joins::applied`]).
enum Keep {
    One(u32),
    Live(BTreeSet<u32>),
    /// A read of one partition subject for the partitions of it catching up together
    /// ([`catch_up`]).
    Many(BTreeSet<u32>),
}

/// What a batch is applied for: a subject's consumer (a partition's own, or [`LIVE`]),
/// or the partitions of one subject catching up together ([`catch_up`]).
#[derive(Clone, Copy)]
enum Applies<'a> {
    Subject(u32),
    Partitions(&'a BTreeSet<u32>),
}

impl Keep {
    fn keeps(&self, p: u32) -> bool {
        match self {
            Keep::One(q) => *q == p,
            Keep::Live(set) | Keep::Many(set) => set.contains(&p),
        }
    }
}

impl Joins {
    /// The partitions the live consumer applies now ([`JoinState::applied`]).
    fn applied(&self) -> BTreeSet<u32> {
        lock(&self.state).applied().collect()
    }
}

impl JoinState {
    /// The partitions the live consumer applies: those it carries, and those joining.
    fn applied(&self) -> impl Iterator<Item = u32> + '_ {
        self.carried.keys().chain(self.joining.keys()).copied()
    }
}

/// Decodes `message` as a push, or says why it is skipped. From the payload as `Bytes`
/// (a reference count, not a copy), so that the sketches are slices of it: decoded from a
/// byte slice, each was copied into a buffer of its own, every message on every node.
fn decode(message: &async_nats::Message) -> Result<v1::PushRequest, Applied> {
    v1::PushRequest::decode(message.payload.clone()).map_err(|e| {
        tracing::error!(subject = %message.subject, error = %e, "a cluster message is not a push; skipped");
        Applied::Refused
    })
}

/// Stores a live message: its server, live hours and series index, and the positions it
/// names, for the read barrier.
fn apply_live(cluster: &Cluster, applier: &Writer, message: &async_nats::Message) -> Applied {
    let request = match decode(message) {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    let subject = message.subject.as_str();
    let positions = message
        .headers
        .as_ref()
        .and_then(|h| h.get(super::barrier::POSITIONS_HEADER))
        .map(|v| super::barrier::parse_positions(v.as_str()))
        .transpose();
    let applied = applier.apply_live(request);
    match positions {
        Ok(positions) if applied.is_ok() => {
            let stream = cluster.position(LIVE).stream;
            cluster
                .barrier()
                .require(&stream, &positions.unwrap_or_default());
        }
        Ok(_) => {}
        // Only the read barrier's wait for this push's rows is lost: its series are
        // indexed all the same.
        Err(e) => {
            tracing::error!(subject, error = %e, "a live message's positions header is malformed; ignored")
        }
    }
    outcome(subject, applied)
}

/// Stores the snapshots of a partition subject's message that belong to the partitions
/// `keep` names (a subject groups several: the others are another consumer's or another
/// node's). A snapshot whose partition cannot be told (it would fail the push checks) is
/// kept, so that the checks refuse and count it.
fn apply_partitions(
    cluster: &Cluster,
    applier: &Writer,
    keep: &Keep,
    message: &async_nats::Message,
) -> Applied {
    let mut request = match decode(message) {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    let partitions = cluster.config().partitions;
    request
        .snapshots
        .retain(|s| crate::write::snapshot_partition(s, partitions).is_none_or(|p| keep.keeps(p)));
    if request.snapshots.is_empty() {
        return Applied::Ok;
    }
    let snapshots = request.snapshots.len() as u64;
    let applied = applier.apply(request).inspect(|()| {
        applier
            .metrics()
            .cluster_applied_snapshots
            .inc_by(snapshots);
    });
    outcome(message.subject.as_str(), applied)
}

/// What became of a message of `subject` the store was given.
fn outcome(subject: &str, applied: Result<(), tonic::Status>) -> Applied {
    match applied {
        Ok(()) => Applied::Ok,
        Err(status) if is_retryable(status.code()) => {
            tracing::warn!(subject, error = %status.message(), "applying a cluster message failed; retrying it");
            Applied::Retry
        }
        Err(status) => {
            tracing::error!(subject, error = %status.message(), "a cluster message was refused; skipped");
            Applied::Refused
        }
    }
}

/// A failure of the store (or of the task), not of the message.
fn is_retryable(code: tonic::Code) -> bool {
    !matches!(
        code,
        tonic::Code::InvalidArgument
            | tonic::Code::ResourceExhausted
            | tonic::Code::PermissionDenied
            | tonic::Code::OutOfRange
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JetStream client that never connects: enough to hold deliveries in a test.
    async fn context() -> async_nats::jetstream::Context {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect("127.0.0.1:1")
            .await
            .unwrap();
        async_nats::jetstream::new(client)
    }

    /// Delivery `consumer_sequence` of a partition's consumer, the message at stream
    /// `stream_sequence`; `None` for a message without its position (no reply subject).
    fn delivery(
        context: &async_nats::jetstream::Context,
        position: Option<(u64, u64)>,
    ) -> async_nats::jetstream::Message {
        let reply = position.map(|(consumer_sequence, stream_sequence)| {
            format!(
                "$JS.ACK.hourglass.apply-agg-1-p0.1.{stream_sequence}.{consumer_sequence}.1700000000000000000.0"
            )
            .into()
        });
        async_nats::jetstream::Message {
            message: async_nats::Message {
                subject: "hourglass.p.0".into(),
                reply,
                payload: Default::default(),
                headers: None,
                status: None,
                description: None,
                length: 0,
            },
            context: context.clone(),
        }
    }

    /// A stream of what a pull consumer has already received: every item ready at once
    /// (`tokio_stream::iter` yields to the runtime every 32 items; a pull stream's buffer
    /// does not).
    struct Received(
        std::collections::VecDeque<
            Result<
                async_nats::jetstream::Message,
                async_nats::jetstream::consumer::pull::MessagesError,
            >,
        >,
    );

    impl tokio_stream::Stream for Received {
        type Item = Result<
            async_nats::jetstream::Message,
            async_nats::jetstream::consumer::pull::MessagesError,
        >;

        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            std::task::Poll::Ready(self.0.pop_front())
        }
    }

    fn sequences(batch: &[Delivery]) -> Vec<(u64, u64)> {
        batch
            .iter()
            .map(|d| (d.consumer_sequence, d.stream_sequence))
            .collect()
    }

    #[tokio::test]
    async fn in_sequence_keeps_the_deliveries_before_a_gap_and_none_after() {
        let c = context().await;
        let messages = [(5, 50), (6, 52), (8, 60), (9, 61)]
            .map(|p| delivery(&c, Some(p)))
            .into();
        let (batch, gap) = in_sequence(messages, 4);
        assert_eq!(sequences(&batch), [(5, 50), (6, 52)]);
        assert_eq!(
            gap.as_deref(),
            Some("deliveries 7 to 7 were lost on the way")
        );
        // A gap before the first: nothing.
        let (batch, gap) = in_sequence(vec![delivery(&c, Some((6, 50)))], 4);
        assert!(batch.is_empty() && gap.is_some());
        // A redelivery of one already applied is not the next delivery either.
        let (batch, gap) = in_sequence(vec![delivery(&c, Some((4, 49)))], 4);
        assert!(batch.is_empty() && gap.is_some());
    }

    #[tokio::test]
    async fn in_sequence_stops_at_a_message_without_its_position() {
        let c = context().await;
        let messages = vec![
            delivery(&c, Some((1, 10))),
            delivery(&c, None),
            delivery(&c, Some((3, 12))),
        ];
        let (batch, why) = in_sequence(messages, 0);
        assert_eq!(sequences(&batch), [(1, 10)]);
        assert!(
            why.as_deref()
                .is_some_and(|w| w.starts_with("a message without its position")),
            "{why:?}"
        );
        // All in order: all, and nothing ends the batch.
        let messages = (1..=3).map(|i| delivery(&c, Some((i, 10 + i)))).collect();
        let (batch, why) = in_sequence(messages, 0);
        assert_eq!(sequences(&batch), [(1, 11), (2, 12), (3, 13)]);
        assert!(why.is_none());
    }

    #[tokio::test]
    async fn ready_messages_takes_at_most_a_batch_and_leaves_the_rest_in_the_stream() {
        use tokio_stream::StreamExt;
        let c = context().await;
        let mut stream = Received(
            (1..=MAX_BATCH as u64 + 10)
                .map(|i| Ok(delivery(&c, Some((i, i)))))
                .collect(),
        );
        let first = stream.next().await.unwrap().unwrap();
        let (messages, ended) = ready_messages(first, &mut stream);
        assert!(ended.is_none());
        let (batch, gap) = in_sequence(messages, 0);
        assert!(gap.is_none());
        assert_eq!(batch.len(), MAX_BATCH);
        assert_eq!(batch.last().unwrap().consumer_sequence, MAX_BATCH as u64);
        // The next message is still the stream's: taken by the next batch, none lost.
        let next = stream.next().await.unwrap().unwrap();
        assert_eq!(next.info().unwrap().consumer_sequence, MAX_BATCH as u64 + 1);
    }

    #[tokio::test]
    async fn ready_messages_keeps_what_came_before_the_streams_error_or_end() {
        use async_nats::jetstream::consumer::pull::{MessagesError, MessagesErrorKind};
        use tokio_stream::StreamExt;
        let c = context().await;
        let mut stream = Received(
            [
                Ok(delivery(&c, Some((1, 1)))),
                Ok(delivery(&c, Some((2, 2)))),
                Err(MessagesError::new(MessagesErrorKind::MissingHeartbeat)),
                Ok(delivery(&c, Some((3, 3)))),
            ]
            .into(),
        );
        let first = stream.next().await.unwrap().unwrap();
        let (messages, ended) = ready_messages(first, &mut stream);
        assert_eq!(messages.len(), 2);
        assert!(matches!(ended, Some(Some(_))), "the error ends the batch");
        // What came after the error is left to the consumer opened again: not taken.
        assert_eq!(stream.0.len(), 1);
        let mut stream = Received([Ok(delivery(&c, Some((2, 2))))].into());
        let (messages, ended) = ready_messages(delivery(&c, Some((1, 1))), &mut stream);
        assert_eq!(messages.len(), 2);
        assert!(
            matches!(ended, Some(None)),
            "the stream's end ends the batch"
        );
    }

    #[test]
    fn the_live_consumer_tells_each_subject_of_the_stream_by_its_number() {
        let mut config = super::super::ClusterConfig::new("agg-1", vec![]);
        config.partitions = 8;
        config.subjects = Some(3);
        assert_eq!(stream_subject(&config, "hourglass.live"), Some(LIVE));
        assert_eq!(stream_subject(&config, "hourglass.p.0"), Some(0));
        assert_eq!(stream_subject(&config, "hourglass.p.2"), Some(2));
        // Past the subject count, malformed, or another prefix: no subject of the stream.
        for subject in [
            "hourglass.p.3",
            "hourglass.p.7",
            "hourglass.p.",
            "hourglass.p.-1",
            "hourglass.p.1.2",
            "hourglass.q.1",
            "other.p.1",
            "hourglassx.p.1",
        ] {
            assert_eq!(stream_subject(&config, subject), None, "{subject}");
        }
    }

    #[test]
    fn a_store_keeps_its_consumer_and_a_wiped_one_gets_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let first = consumer_name(dir.path(), "agg-1").unwrap();
        assert!(is_consumer_of(&first, "agg-1"), "{first}");
        // The same store, restarted: the same consumer, which resumes where it was.
        assert_eq!(consumer_name(dir.path(), "agg-1").unwrap(), first);
        // Wiped (or replaced by an empty dir): a consumer of its own, from the start.
        std::fs::remove_file(dir.path().join(CONSUMER_FILE)).unwrap();
        let second = consumer_name(dir.path(), "agg-1").unwrap();
        assert_ne!(second, first);
        // Renamed node: never another node's consumer.
        let renamed = consumer_name(dir.path(), "agg-2").unwrap();
        assert!(is_consumer_of(&renamed, "agg-2") && !is_consumer_of(&renamed, "agg-1"));
        // A prefix of another node's name is not that node's: "agg-1" vs "agg-10".
        assert!(!is_consumer_of(
            &renamed.replace("agg-2", "agg-20"),
            "agg-2"
        ));
    }
}
