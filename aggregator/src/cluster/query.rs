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
    let missing = gather(cluster, &asked, needed, &mut answer).await?;
    // Groups only the others knew came last: in key order, as a single aggregator lists
    // them, so that every node gives the same bytes.
    answer.groups.sort_by(|a, b| a.0.cmp(&b.0));
    let missing: Vec<u32> = missing.into_iter().collect();
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

/// Asks the other nodes for the partials of `needed`, trying each partition's ready
/// nodes in turn, and merges what they send into `answer`. Returns the partitions no
/// node answered for.
async fn gather(
    cluster: &Arc<Cluster>,
    asked: &Asked,
    needed: BTreeSet<u32>,
    answer: &mut Answer,
) -> Result<BTreeSet<u32>, Status> {
    let me = cluster.members().me().to_string();
    // Each partition's remaining candidates, best first.
    let mut queue: BTreeMap<u32, Vec<super::members::Candidate>> = needed
        .iter()
        .map(|&p| {
            let mut c = cluster.members().candidates(p);
            c.retain(|c| c.node != me);
            c.reverse();
            (p, c)
        })
        .collect();
    let mut missing = BTreeSet::new();
    while !queue.is_empty() {
        let round = next_round(&mut queue, &mut missing);
        let mut calls = tokio::task::JoinSet::new();
        for (node, (advertise, partitions)) in round {
            let cluster = Arc::clone(cluster);
            let request = v1::PartialRequest {
                selector: Some(asked.proto.clone()),
                kind: v1::SketchKind::from(asked.kind) as i32,
                partitions: partitions.clone(),
                partition_count: cluster.config().partitions,
                lookup: asked.item.is_some(),
                item: asked.item.clone().unwrap_or_default(),
            };
            calls.spawn(async move {
                let reply = cluster.peers().partial(&advertise, request).await;
                (node, partitions, reply)
            });
        }
        while let Some(done) = calls.join_next().await {
            let (node, partitions, reply) =
                done.map_err(|e| Status::internal(format!("query task failed: {e}")))?;
            let failed = take_reply(asked, answer, &node, &partitions, reply)?;
            for p in partitions {
                let candidates = queue.get_mut(&p).expect("queued this round");
                candidates.pop();
                if !failed.contains(&p) {
                    queue.remove(&p);
                }
            }
        }
    }
    Ok(missing)
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

/// Merges `node`'s reply for `partitions` into `answer`; returns the partitions it did
/// not answer for, to be asked of their other owners.
fn take_reply(
    asked: &Asked,
    answer: &mut Answer,
    node: &str,
    partitions: &[u32],
    reply: Result<v1::PartialResponse, Status>,
) -> Result<BTreeSet<u32>, Status> {
    match reply {
        // A membership lookup answered with a merged filter: a node of a version before
        // lookups, which ignored the item. Its filters' answers are not there, so its
        // partitions go to their other owners, or are named missing, never answered from
        // what it did not send.
        Ok(reply) if asked.item.is_some() && merged_filter_in(&reply) => {
            tracing::warn!(
                node,
                "a node answered a membership lookup with a merged filter (an older version?); trying the partitions' other owners"
            );
            Ok(partitions.iter().copied().collect())
        }
        Ok(reply) => {
            merge_partial(answer, &reply, &asked.selector.metric)
                .map_err(|e| convert::query_status(&e))?;
            Ok(reply.not_ready.iter().copied().collect())
        }
        Err(status) => {
            tracing::warn!(node, error = %status.message(), "a node's part of a query failed; trying the partitions' other owners");
            Ok(partitions.iter().copied().collect())
        }
    }
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
