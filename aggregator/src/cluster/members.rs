//! Membership and ownership: which nodes are up, and which of them own each partition.
//!
//! Every node renews its key in a JetStream KV bucket (`STREAM_members`) every
//! `cluster.heartbeat`; the bucket forgets a key `cluster.member_ttl` after its last
//! renewal, so the keys present are the live members. Each partition's owners are the
//! `cluster.owners` members that score highest for it by rendezvous hashing
//! ([`owners_of`]): every node computes the same owners from the same members, with no
//! coordinator, and a member that comes or goes moves only the partitions it wins or held.
//!
//! A node applies the partitions it owns (one durable consumer each, `apply.rs`) and says
//! in its heartbeat which of them it is *ready* for: applied up to the end of the stream
//! with nothing missing. Queries and push answers go only to ready nodes. A node that loses
//! a partition keeps applying it until every new owner is ready for it, so a partition is
//! never left with fewer ready copies by a hand-over. A node that cannot renew its key for
//! `member_ttl` is out of the cluster by everyone else's view, and by its own: it then
//! answers for no partition.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hourglass_rpc::proto::v1;

/// What this node knows of the cluster's members, as of its last heartbeat.
pub(crate) struct Membership {
    me: String,
    advertise: String,
    owners: usize,
    partitions: u32,
    member_ttl: Duration,
    /// How recent the last renewal must be for this node to answer for partitions.
    fresh: Duration,
    started_unix: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The live members by name, this node among them once its heartbeat is in.
    members: BTreeMap<String, v1::Member>,
    /// When this node last renewed its key.
    renewed: Option<Instant>,
    /// Partitions this node applies.
    applying: BTreeSet<u32>,
    /// Of those, the ones it has applied completely.
    ready: BTreeSet<u32>,
    /// Messages each partition's consumer has yet to deliver.
    pending: BTreeMap<u32, u64>,
}

/// Where to send one partition's work: the ready members, the best first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The member's name.
    pub(crate) node: String,
    /// Its gRPC address.
    pub(crate) advertise: String,
}

impl Membership {
    /// This node (`me`, reachable at `advertise`) in a cluster of `partitions` partitions
    /// with `owners` owners each.
    pub(crate) fn new(
        me: String,
        advertise: String,
        owners: usize,
        partitions: u32,
        member_ttl: Duration,
        heartbeat: Duration,
    ) -> Membership {
        let started_unix = hourglass_rpc::time::since_unix_epoch().as_secs();
        Membership {
            me,
            advertise,
            owners,
            partitions,
            member_ttl,
            // Half the time to live (at least two renewals): cut off from NATS, its
            // partitions may be moving on without it, so it stops answering for them
            // well before the others drop it.
            fresh: member_ttl.min((member_ttl / 2).max(heartbeat * 2)),
            started_unix,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This node's name.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// This node's heartbeat: what it tells the others.
    pub(crate) fn heartbeat(&self) -> v1::Member {
        let state = self.lock();
        v1::Member {
            node: self.me.clone(),
            advertise: self.advertise.clone(),
            ready: state.ready.iter().copied().collect(),
            applying: state.applying.iter().copied().collect(),
            started_unix: self.started_unix,
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// Records a renewal of this node's key and the members read after it.
    pub(crate) fn renewed(&self, members: BTreeMap<String, v1::Member>) {
        let mut state = self.lock();
        state.members = members;
        state.renewed = Some(Instant::now());
    }

    /// True while this node's key is live: renewed within `member_ttl`. A node that is
    /// not has been dropped by the others and answers for nothing.
    pub(crate) fn is_member(&self) -> bool {
        self.lock()
            .renewed
            .is_some_and(|at| at.elapsed() < self.member_ttl)
    }

    /// The live members, this node's own entry reflecting its current state.
    pub(crate) fn members(&self) -> BTreeMap<String, v1::Member> {
        if !self.is_member() {
            return BTreeMap::new();
        }
        let mut members = self.lock().members.clone();
        let mut me = self.heartbeat();
        me.ready = self.ready_here().into_iter().collect();
        members.insert(self.me.clone(), me);
        members
    }

    /// The partitions this node should own among `members`.
    pub(crate) fn owned(&self, members: &BTreeMap<String, v1::Member>) -> BTreeSet<u32> {
        let names: Vec<&str> = members.keys().map(String::as_str).collect();
        (0..self.partitions)
            .filter(|&p| owners_of(p, &names, self.owners).contains(&self.me.as_str()))
            .collect()
    }

    /// Whether every owner of `p` among `members` says it is ready for `p`: a former
    /// owner may then stop applying it.
    pub(crate) fn handed_over(&self, p: u32, members: &BTreeMap<String, v1::Member>) -> bool {
        let names: Vec<&str> = members.keys().map(String::as_str).collect();
        owners_of(p, &names, self.owners)
            .iter()
            .all(|o| members.get(*o).is_some_and(|m| m.ready.contains(&p)))
    }

    /// The ready members for `p`, this node first if it is one, then the owners in
    /// rendezvous order, then former owners still handing it over.
    pub(crate) fn candidates(&self, p: u32) -> Vec<Candidate> {
        let members = self.members();
        let names: Vec<&str> = members.keys().map(String::as_str).collect();
        let mut ranked: Vec<&str> = names.clone();
        ranked.sort_by(|a, b| score(b, p).cmp(&score(a, p)).then(a.cmp(b)));
        ranked.retain(|n| members[*n].ready.contains(&p));
        if let Some(i) = ranked.iter().position(|n| *n == self.me) {
            let me = ranked.remove(i);
            ranked.insert(0, me);
        }
        ranked
            .into_iter()
            .map(|n| Candidate {
                node: n.to_string(),
                advertise: members[n].advertise.clone(),
            })
            .collect()
    }

    /// Whether this node renewed its membership within two heartbeats or so: a node
    /// that cannot reach NATS stops answering for its partitions long before the others
    /// drop it at `member_ttl`.
    pub(crate) fn is_fresh(&self) -> bool {
        self.lock()
            .renewed
            .is_some_and(|at| at.elapsed() < self.fresh)
    }

    /// The partitions this node answers for now: ready, and freshly a member.
    pub(crate) fn ready_here(&self) -> BTreeSet<u32> {
        if !self.is_fresh() {
            return BTreeSet::new();
        }
        self.lock().ready.clone()
    }

    /// Whether this node answers for `p` now.
    pub(crate) fn is_ready_here(&self, p: u32) -> bool {
        self.is_fresh() && self.lock().ready.contains(&p)
    }

    /// Records that `p`'s consumer lost its stream: not ready until it caught up again.
    pub(crate) fn withdraw(&self, p: u32) {
        self.lock().ready.remove(&p);
    }

    /// Records that this node applies `p` (from now on, not yet ready).
    pub(crate) fn start_applying(&self, p: u32) {
        let mut state = self.lock();
        state.applying.insert(p);
        state.ready.remove(&p);
    }

    /// Records that this node stopped applying `p`.
    pub(crate) fn stop_applying(&self, p: u32) {
        let mut state = self.lock();
        state.applying.remove(&p);
        state.ready.remove(&p);
        state.pending.remove(&p);
    }

    /// Records that `p`'s consumer has `pending` messages left; with none left and
    /// `complete` (nothing of it was lost before this node read it), `p` is ready.
    pub(crate) fn caught_up(&self, p: u32, pending: u64, complete: bool) {
        let mut state = self.lock();
        if !state.applying.contains(&p) {
            return;
        }
        state.pending.insert(p, pending);
        if pending == 0 && complete {
            state.ready.insert(p);
        }
    }

    /// Records how many messages `p`'s consumer (or the live subject's) has yet to deliver.
    pub(crate) fn set_pending(&self, p: u32, pending: u64) {
        let mut state = self.lock();
        if p == super::LIVE || state.applying.contains(&p) {
            state.pending.insert(p, pending);
        }
    }

    /// Messages all this node's consumers have yet to deliver.
    pub(crate) fn pending(&self) -> u64 {
        self.lock().pending.values().sum()
    }

    /// Partitions applied, and those this node answers for now ([`Self::ready_here`]:
    /// none while its membership is not fresh, as when it is cut off from NATS), for the
    /// metrics.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let ready = self.ready_here().len();
        (self.lock().applying.len(), ready)
    }

    /// The owners of `p` among the current members, best first.
    pub(crate) fn owners(&self, p: u32) -> Vec<String> {
        let members = self.members();
        let names: Vec<&str> = members.keys().map(String::as_str).collect();
        owners_of(p, &names, self.owners)
            .into_iter()
            .map(str::to_string)
            .collect()
    }
}

/// Rendezvous score of `node` for partition `p`.
fn score(node: &str, p: u32) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(node.as_bytes(), u64::from(p))
}

/// The `r` owners of partition `p` among `members`: the highest scores, ties by name.
pub(crate) fn owners_of<'a>(p: u32, members: &[&'a str], r: usize) -> Vec<&'a str> {
    let mut ranked: Vec<&str> = members.to_vec();
    ranked.sort_by(|a, b| score(b, p).cmp(&score(a, p)).then(a.cmp(b)));
    ranked.dedup();
    ranked.truncate(r);
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("agg-{i}")).collect()
    }

    #[test]
    fn each_partition_has_r_distinct_owners_and_three_nodes_own_about_two_thirds_each() {
        let names = names(3);
        let members: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut owned: BTreeMap<&str, usize> = BTreeMap::new();
        for p in 0..4096 {
            let owners = owners_of(p, &members, 2);
            assert_eq!(owners.len(), 2);
            assert_ne!(owners[0], owners[1]);
            for o in owners {
                *owned.entry(o).or_default() += 1;
            }
        }
        // 2/3 of 4096 is 2731; a binomial's standard deviation here is ~30.
        for (node, n) in owned {
            assert!((2731 - 150..=2731 + 150).contains(&n), "{node} owns {n}");
        }
    }

    #[test]
    fn a_member_leaving_moves_only_the_partitions_it_owned() {
        let names = names(5);
        let all: Vec<&str> = names.iter().map(String::as_str).collect();
        let without: Vec<&str> = all.iter().copied().filter(|n| *n != "agg-3").collect();
        for p in 0..1024 {
            let before = owners_of(p, &all, 2);
            let after = owners_of(p, &without, 2);
            if !before.contains(&"agg-3") {
                assert_eq!(
                    before, after,
                    "partition {p} moved though agg-3 did not own it"
                );
            } else {
                // The surviving owner stays; one new owner joins.
                let kept: Vec<_> = before.iter().filter(|n| **n != "agg-3").collect();
                assert!(kept.iter().all(|k| after.contains(k)), "partition {p}");
            }
        }
    }

    #[test]
    fn fewer_members_than_owners_makes_every_member_an_owner() {
        assert_eq!(owners_of(7, &["agg-1"], 2), vec!["agg-1"]);
        assert!(owners_of(7, &[], 2).is_empty());
    }

    #[test]
    fn a_node_that_has_not_renewed_answers_for_nothing() {
        let m = Membership::new(
            "agg-1".into(),
            "127.0.0.1:1".into(),
            2,
            4,
            Duration::ZERO,
            Duration::from_secs(1),
        );
        m.start_applying(1);
        m.caught_up(1, 0, true);
        m.renewed(BTreeMap::new());
        // A ttl of zero: the renewal is already too old.
        assert!(!m.is_member());
        assert!(m.ready_here().is_empty());
        assert!(m.candidates(1).is_empty());
        let m = Membership::new(
            "agg-1".into(),
            "127.0.0.1:1".into(),
            2,
            4,
            Duration::from_secs(60),
            Duration::from_secs(1),
        );
        m.start_applying(1);
        m.caught_up(1, 3, true);
        m.renewed(BTreeMap::new());
        assert!(m.ready_here().is_empty(), "3 messages behind is not ready");
        m.caught_up(1, 0, false);
        assert!(
            m.ready_here().is_empty(),
            "a partition with a gap is not ready"
        );
        m.caught_up(1, 0, true);
        assert_eq!(m.ready_here(), BTreeSet::from([1]));
        assert_eq!(m.candidates(1)[0].node, "agg-1");
    }
}
