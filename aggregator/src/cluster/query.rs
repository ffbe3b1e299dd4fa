//! Queries in cluster mode: the node asked merges the partitions it is ready for itself,
//! asks a ready owner of each other partition for its partial merge, and merges the
//! partials into one answer. A partition whose owners all fail is retried on the next
//! ready node; one that no node answers for is named in the answer's coverage, so a low
//! number is never silent.
//!
//! Distinct (HyperLogLog), frequency (Count-Min) and membership (Bloom) merges are
//! commutative and associative byte for byte, so the answer is the same bytes as one
//! node's holding every row. A membership lookup merges nothing: each owner sends each
//! filter's answer (and the bits of those that say "maybe"), and the rows are combined
//! here as one node combines its own (`planner::combine_rows`); a node that answers a
//! lookup with a merged filter (a version before lookups) is taken as not answering.
//! Frequent-items summaries are not: top-K lists depend on the merge tree and agree
//! within their stated bounds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hourglass_rpc::proto::v1;
use hourglass_sketch::hash::item_hash;
use hourglass_sketch::{Kind, Sketch};
use tonic::Status;

use super::Cluster;
use crate::convert;
use crate::planner::{Answer, Planner, QueryError, Selector};
use crate::store::Store;

/// How a query is planned here: the selection, as converted and as sent to the others.
pub(crate) struct Asked {
    /// The converted selector.
    pub(crate) selector: Selector,
    /// The request's selector, for the other nodes.
    pub(crate) proto: v1::Selector,
    /// The kind of sketch.
    pub(crate) kind: Kind,
    /// `limits.max_query_fanout`.
    pub(crate) max_fanout: u64,
    /// `coverage.retire_after`, in hours.
    pub(crate) retire_hours: u32,
    /// A membership lookup: the item, looked up in each filter instead of merging.
    pub(crate) item: Option<Vec<u8>>,
}

/// Answers `asked` over the whole cluster (module docs).
pub(crate) async fn fan_out(
    cluster: &Arc<Cluster>,
    store: &Arc<dyn Store>,
    asked: Asked,
) -> Result<Answer, Status> {
    let count = cluster.config().partitions;
    // Ready, and applied as far as every push acknowledged before this question.
    let here = super::barrier::pass(cluster, cluster.members().ready_here())
        .await
        .map_err(Status::unavailable)?;
    let local = {
        let (store, here, selector) = (Arc::clone(store), here.clone(), asked.selector.clone());
        let (max_fanout, retire_hours) = (asked.max_fanout, asked.retire_hours);
        let lookup = asked.item.as_deref().map(item_hash);
        tokio::task::spawn_blocking(move || {
            let planner = Planner::new(store.as_ref())
                .limit_fanout(max_fanout)
                .retire_after(retire_hours)
                .only_partitions(count, here);
            match lookup {
                Some(hash) => planner.look_up(hash).answer(&selector),
                None => planner.answer(&selector),
            }
        })
        .await
        .map_err(|e| Status::internal(format!("query task failed: {e}")))?
    };
    let mut answer = local.map_err(|e| convert::query_status(&e))?;
    // Every partition not merged here, not only those of the series this node knows: its
    // live consumer may lag the owners', and a series it has not heard of yet is still
    // theirs to merge.
    let needed: BTreeSet<u32> = (0..count).filter(|p| !here.contains(p)).collect();
    let asked = Arc::new(asked);
    let deadline = tokio::time::Instant::now() + cluster.peers().bound();
    let gathered = while_in_touch(
        cluster,
        gather(cluster, &asked, needed, BTreeSet::new(), deadline),
    )
    .await??;
    for reply in &gathered.replies {
        merge_partial(&mut answer, reply, &asked.selector.metric)
            .map_err(|e| convert::query_status(&e))?;
    }
    // Groups only the others knew came last: in key order, as a single aggregator lists
    // them, so that every node gives the same bytes.
    answer.groups.sort_by(|a, b| a.0.cmp(&b.0));
    let missing: Vec<u32> = gathered.missing.into_iter().collect();
    answer
        .total
        .coverage
        .missing_partitions
        .clone_from(&missing);
    for (_, group) in &mut answer.groups {
        group.coverage.missing_partitions.clone_from(&missing);
    }
    if !missing.is_empty() {
        tracing::warn!(
            partitions = missing.len(),
            first = missing[0],
            "query answered without partitions no ready node answered for"
        );
    }
    Ok(answer)
}

/// `work`, ended with UNAVAILABLE as soon as this node is no longer freshly a member
/// (cut off from NATS: [`super::members::Membership::is_fresh`]). A question this node began
/// before the cut would otherwise wait out every peer's bound, one after another, for
/// peers it most likely cannot reach either; one asked after the cut is refused by the
/// read barrier.
async fn while_in_touch<T>(
    cluster: &Cluster,
    work: impl std::future::Future<Output = T>,
) -> Result<T, Status> {
    let check = (cluster.config().heartbeat / 4).clamp(
        std::time::Duration::from_millis(20),
        std::time::Duration::from_millis(250),
    );
    let out_of_touch = async {
        loop {
            tokio::time::sleep(check).await;
            if !cluster.members().is_fresh() {
                return;
            }
        }
    };
    tokio::select! {
        done = work => Ok(done),
        () = out_of_touch => Err(Status::unavailable(format!(
            "node {} lost touch with the cluster (NATS) while answering; ask another node",
            cluster.members().me()
        ))),
    }
}

/// What the other nodes sent for some partitions.
#[derive(Default)]
struct Gathered {
    /// Each answering node's reply, for the partitions it was asked for less those it
    /// said it is not ready for: every partition is in at most one reply.
    replies: Vec<v1::PartialResponse>,
    /// The partitions no node answered for.
    missing: BTreeSet<u32>,
}

/// Asks the other nodes (but those `excluded`) for the partials of `needed`, trying each
/// partition's ready nodes in turn until `deadline`. Each partition is answered by one
/// node at most, so that a merge that adds (Count-Min) never counts one twice.
fn gather(
    cluster: &Arc<Cluster>,
    asked: &Arc<Asked>,
    needed: BTreeSet<u32>,
    excluded: BTreeSet<String>,
    deadline: tokio::time::Instant,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Gathered, Status>> + Send>> {
    let (cluster, asked) = (Arc::clone(cluster), Arc::clone(asked));
    Box::pin(async move {
        let me = cluster.members().me().to_string();
        // Each partition's remaining candidates, best first.
        let mut queue: BTreeMap<u32, Vec<super::members::Candidate>> = needed
            .iter()
            .map(|&p| {
                let mut c = cluster.members().candidates(p);
                c.retain(|c| c.node != me && !excluded.contains(&c.node));
                c.reverse();
                (p, c)
            })
            .collect();
        let mut gathered = Gathered::default();
        while !queue.is_empty() {
            if tokio::time::Instant::now() >= deadline {
                gathered
                    .missing
                    .extend(std::mem::take(&mut queue).into_keys());
                break;
            }
            let round = next_round(&mut queue, &mut gathered.missing);
            let mut calls = tokio::task::JoinSet::new();
            for (node, (advertise, partitions)) in round {
                let (cluster, asked) = (Arc::clone(&cluster), Arc::clone(&asked));
                let excluded = excluded.clone();
                calls.spawn(async move {
                    let call = Call {
                        node,
                        advertise,
                        partitions,
                    };
                    let outcome = ask(&cluster, &asked, &call, excluded, deadline).await;
                    (call.partitions, outcome)
                });
            }
            while let Some(done) = calls.join_next().await {
                let (partitions, outcome) =
                    done.map_err(|e| Status::internal(format!("query task failed: {e}")))?;
                let outcome = outcome?;
                for p in partitions {
                    let candidates = queue.get_mut(&p).expect("queued this round");
                    candidates.pop();
                    if !outcome.retry.contains(&p) {
                        queue.remove(&p);
                    }
                }
                gathered.replies.extend(outcome.gathered.replies);
                gathered.missing.extend(outcome.gathered.missing);
            }
        }
        Ok(gathered)
    })
}

/// One call of a round: `partitions` asked of `node` at `advertise`.
struct Call {
    node: String,
    advertise: String,
    partitions: Vec<u32>,
}

/// What became of one [`Call`]: what it gathered, and the partitions to ask of their
/// next candidates.
struct Outcome {
    gathered: Gathered,
    retry: BTreeSet<u32>,
}

/// Makes `call`, bounded by `deadline`. If it has not answered within the hedge delay
/// ([`super::peer::Peers::hedge`]: a healthy node answers within its read barrier's
/// half of `peer_timeout`), the same partitions are asked of their other nodes too
/// ([`gather`], without the slow node) while the call goes on, and the first of the two
/// to answer every partition is taken whole, the other dropped: a node cut off while a
/// question is in flight holds it up for the hedge delay, not for its whole bound. Never
/// both: a partition answered twice would be counted twice.
async fn ask(
    cluster: &Arc<Cluster>,
    asked: &Arc<Asked>,
    call: &Call,
    mut excluded: BTreeSet<String>,
    deadline: tokio::time::Instant,
) -> Result<Outcome, Status> {
    let request = v1::PartialRequest {
        selector: Some(asked.proto.clone()),
        kind: v1::SketchKind::from(asked.kind) as i32,
        partitions: call.partitions.clone(),
        partition_count: cluster.config().partitions,
        lookup: asked.item.is_some(),
        item: asked.item.clone().unwrap_or_default(),
    };
    let reply = async {
        tokio::time::timeout_at(deadline, cluster.peers().partial(&call.advertise, request))
            .await
            .unwrap_or_else(|_| {
                Err(Status::unavailable(format!(
                    "peer {} did not answer before the question's deadline",
                    call.advertise
                )))
            })
    };
    tokio::pin!(reply);
    let hedge_at = tokio::time::Instant::now() + cluster.peers().hedge();
    tokio::select! {
        reply = &mut reply => return Ok(take_reply(asked, call, reply)),
        () = tokio::time::sleep_until(hedge_at.min(deadline)) => {}
    }
    tracing::info!(
        node = call.node,
        after = ?cluster.peers().hedge(),
        partitions = call.partitions.len(),
        "a node has not answered its part of a question yet; asking the partitions' other nodes too"
    );
    excluded.insert(call.node.clone());
    let needed: BTreeSet<u32> = call.partitions.iter().copied().collect();
    let mut others = gather(cluster, asked, needed, excluded, deadline);
    let settled = |gathered: Gathered| Outcome {
        gathered,
        retry: BTreeSet::new(),
    };
    tokio::select! {
        reply = &mut reply => {
            let outcome = take_reply(asked, call, reply);
            if outcome.retry.is_empty() {
                return Ok(outcome);
            }
            // Not whole: the others' answer covers every partition of the call.
            Ok(settled(others.await?))
        }
        gathered = &mut others => {
            let gathered = gathered?;
            if gathered.missing.is_empty() {
                return Ok(settled(gathered));
            }
            // The others could not answer every partition: the call's answer, if it
            // comes whole in time, does.
            match take_reply(asked, call, reply.await) {
                outcome if outcome.retry.is_empty() => Ok(outcome),
                _ => Ok(settled(gathered)),
            }
        }
    }
}

/// `call`'s reply, as an [`Outcome`]: the partitions it did not answer for are to be
/// asked of their other nodes.
fn take_reply(asked: &Asked, call: &Call, reply: Result<v1::PartialResponse, Status>) -> Outcome {
    let node = call.node.as_str();
    let all = || call.partitions.iter().copied().collect();
    let (reply, retry) = match reply {
        // A membership lookup answered with a merged filter: a node of a version before
        // lookups, which ignored the item. Its filters' answers are not there, so its
        // partitions go to their other owners, or are named missing, never answered from
        // what it did not send.
        Ok(reply) if asked.item.is_some() && merged_filter_in(&reply) => {
            tracing::warn!(
                node,
                "a node answered a membership lookup with a merged filter (an older version?); trying the partitions' other owners"
            );
            (None, all())
        }
        Ok(reply) => {
            let retry = reply.not_ready.iter().copied().collect();
            (Some(reply), retry)
        }
        Err(status) => {
            tracing::warn!(node, error = %status.message(), "a node's part of a query failed; trying the partitions' other owners");
            (None, all())
        }
    };
    let gathered = Gathered {
        replies: reply.into_iter().collect(),
        missing: BTreeSet::new(),
    };
    Outcome { gathered, retry }
}

/// The next round of asking: each partition of `queue` to its best remaining candidate,
/// one call per node (node → its address and partitions). A partition with no candidate
/// left leaves the queue for `missing`.
fn next_round(
    queue: &mut BTreeMap<u32, Vec<super::members::Candidate>>,
    missing: &mut BTreeSet<u32>,
) -> BTreeMap<String, (String, Vec<u32>)> {
    let mut round: BTreeMap<String, (String, Vec<u32>)> = BTreeMap::new();
    for (p, candidates) in std::mem::take(queue) {
        match candidates.last() {
            Some(c) => {
                round
                    .entry(c.node.clone())
                    .or_insert_with(|| (c.advertise.clone(), Vec::new()))
                    .1
                    .push(p);
                queue.insert(p, candidates);
            }
            None => {
                missing.insert(p);
            }
        }
    }
    round
}

/// Whether a partial answer carries a merged sketch in any group.
fn merged_filter_in(reply: &v1::PartialResponse) -> bool {
    reply
        .total
        .iter()
        .chain(&reply.groups)
        .any(|group| group.sketch.is_some())
}

/// Merges one node's partials into `answer`, group by group.
fn merge_partial(
    answer: &mut Answer,
    reply: &v1::PartialResponse,
    metric: &str,
) -> Result<(), QueryError> {
    if let Some(total) = &reply.total {
        merge_group(&mut answer.total, total, metric)?;
    }
    for group in &reply.groups {
        match answer.groups.iter_mut().find(|(key, _)| *key == group.key) {
            Some((_, merged)) => merge_group(merged, group, metric)?,
            // A group this node does not know yet (its view of the series or servers
            // lags the other's): answered all the same, at the end.
            None => {
                let mut merged = crate::planner::Merged::default();
                merge_group(&mut merged, group, metric)?;
                answer.groups.push((group.key.clone(), merged));
            }
        }
    }
    Ok(())
}

/// Merges one partial sketch into `merged`.
fn merge_group(
    merged: &mut crate::planner::Merged,
    partial: &v1::PartialGroup,
    metric: &str,
) -> Result<(), QueryError> {
    merged.coverage.sketches_merged += partial.sketches_merged;
    let where_ = || format!("a partial merge of group {:?}", partial.key);
    for filter in &partial.filters {
        merged
            .filters
            .push(
                super::peer::filter_row(filter).map_err(|source| QueryError::Corrupt {
                    series: filter.series.clone(),
                    key: where_(),
                    source,
                })?,
            );
    }
    let Some(encoded) = &partial.sketch else {
        return Ok(());
    };
    let sketch = Sketch::decode(&encoded.data).map_err(|source| QueryError::Corrupt {
        series: metric.to_string(),
        key: where_(),
        source,
    })?;
    match &mut merged.sketch {
        Some(acc) => acc
            .merge(&sketch)
            .map_err(|source| QueryError::Incompatible {
                series: metric.to_string(),
                key: where_(),
                source,
            }),
        None => {
            merged.sketch = Some(sketch);
            Ok(())
        }
    }
}
