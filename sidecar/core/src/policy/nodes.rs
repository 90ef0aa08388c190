//! Per-node decisions: one policy instance per node of a cluster, each
//! deciding its own GPUs alone, as every node's smartmigd does (issue 23,
//! part 2; `docs/evaluation.md`, "Coordination across nodes").
//!
//! The simulator's policies see the whole cluster at once (a central
//! decider). On a real cluster each node's daemon sees its own GPUs and the
//! cluster's pending Slurm queue, and decides alone. [`PerNode`] reproduces
//! that in the simulator: at each epoch it cuts the [`ClusterView`] into one
//! view per node (the node's GPUs, renumbered `0..gpus_per_node`), asks that
//! node's own inner policy, and maps the decisions back to the cluster's GPU
//! numbers. [`Split`] says what pending demand each node sees:
//!
//! - [`Split::Whole`]: the whole queue and its counts (today's daemon), so
//!   every idle GPU of every node may reshape for the same waiting jobs;
//! - [`Split::Claimed`]: only the jobs the node claims by rendezvous hashing
//!   of the job id over the node names ([`super::share::claims`], the rule
//!   the daemon uses), with `pending_by_profile` recomputed from those jobs;
//!   every pending job is in exactly one node's view.
//!
//! All nodes are asked at the same epochs, on the same snapshot: the
//! daemons' epochs are not synchronised, but each one reads a queue that
//! does not yet know what the other nodes are reshaping for, which is what
//! a shared snapshot models. Pure: no IO; the claimed views reuse buffers
//! between epochs.
//!
//! Spec: `nodes:<gpus per node>:<whole|claimed>:<inner spec>`, e.g.
//! `nodes:8:claimed:greedy` ([`parse_per_node`]; the inner spec is any
//! [`super::parse_policy`] spec, built once per node).

use std::fmt;
use std::ops::Range;

use rustc_hash::FxHashMap;

use super::share::claimant;
use super::{ClusterView, Decision, PendingByProfile, PendingJob, RepartitionPolicy};
use crate::mig::{Geometry, GpuModel, Layout};

/// What pending demand each node's policy sees (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// The whole queue: today's daemon.
    Whole,
    /// Only the jobs the node claims ([`super::share::claims`]).
    Claimed,
}

impl Split {
    pub const ALL: [Split; 2] = [Split::Whole, Split::Claimed];

    pub fn as_str(self) -> &'static str {
        match self {
            Split::Whole => "whole",
            Split::Claimed => "claimed",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Split {
    type Err = NodesError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Split::ALL
            .into_iter()
            .find(|x| x.as_str() == s.trim())
            .ok_or_else(|| NodesError::UnknownSplit(s.to_string()))
    }
}

/// Why a per-node arrangement could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodesError {
    #[error("{0} GPUs per node: a node needs at least one GPU")]
    NoGpusPerNode(usize),
    #[error("a cluster of 0 GPUs has no nodes")]
    NoGpus,
    #[error("{nodes} nodes need {nodes} policies, {given} were given")]
    PolicyCount { nodes: usize, given: usize },
    #[error("unknown split `{0}` (known: whole, claimed)")]
    UnknownSplit(String),
    #[error("per-node policy `{0}`: expected `nodes:<GPUs per node>:<whole|claimed>:<policy>`, e.g. `nodes:8:claimed:greedy`")]
    BadSpec(String),
}

/// A cluster of `gpus` GPUs cut into nodes of `per_node` consecutive GPUs
/// (the last node takes what is left), named `node001`, `node002`, ...
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nodes {
    gpus: usize,
    per_node: usize,
    names: Vec<String>,
}

impl Nodes {
    pub fn new(gpus: usize, per_node: usize) -> Result<Self, NodesError> {
        if per_node == 0 {
            return Err(NodesError::NoGpusPerNode(per_node));
        }
        if gpus == 0 {
            return Err(NodesError::NoGpus);
        }
        let count = gpus.div_ceil(per_node);
        Ok(Nodes {
            gpus,
            per_node,
            names: (1..=count).map(|i| format!("node{i:03}")).collect(),
        })
    }

    pub fn count(&self) -> usize {
        self.names.len()
    }

    pub fn gpus(&self) -> usize {
        self.gpus
    }

    pub fn per_node(&self) -> usize {
        self.per_node
    }

    /// The node names, in node order (what the claims hash over).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Cluster GPU numbers of node `node` (empty past the last node).
    pub fn range(&self, node: usize) -> Range<usize> {
        let start = (node * self.per_node).min(self.gpus);
        start..(start + self.per_node).min(self.gpus)
    }

    /// The node of cluster GPU `gpu` (the last node for a GPU past the end).
    pub fn node_of(&self, gpu: usize) -> usize {
        (gpu / self.per_node).min(self.count() - 1)
    }
}

/// The pending jobs grouped by claiming node: node `n`'s are
/// `jobs[offsets[n]..offsets[n + 1]]` ([`ClaimedQueue::of`]), in the order
/// of the cluster's pending list, and `counts[n]` their
/// `pending_by_profile`. Buffers are reused between
/// epochs; each job's claimant is cached by id (a job waits over many
/// epochs, and its claimant never changes while the node list does not).
#[derive(Debug, Default)]
pub struct ClaimedQueue {
    pub jobs: Vec<PendingJob>,
    pub offsets: Vec<usize>,
    pub counts: Vec<PendingByProfile>,
    owner: Vec<u32>,
    next: Vec<usize>,
    cache: FxHashMap<u64, u32>,
}

impl ClaimedQueue {
    /// Groups `pending` by the node of `names` that claims each job.
    pub fn assign<S: AsRef<str>>(&mut self, pending: &[PendingJob], names: &[S]) {
        let n = names.len();
        // Keep the cache about as large as the queue: prune it when jobs
        // that left the queue dominate it.
        if self.cache.len() > 4 * pending.len() + 1024 {
            let ids: rustc_hash::FxHashSet<u64> = pending.iter().map(|p| p.id).collect();
            self.cache.retain(|id, _| ids.contains(id));
        }
        self.owner.clear();
        for p in pending {
            let node = *self.cache.entry(p.id).or_insert_with(|| {
                claimant(p.id, names).map_or(u32::MAX, |i| u32::try_from(i).unwrap_or(u32::MAX))
            });
            self.owner.push(node);
        }
        // Counting sort by node, stable.
        self.offsets.clear();
        self.offsets.resize(n + 1, 0);
        for &o in &self.owner {
            if (o as usize) < n {
                self.offsets[o as usize + 1] += 1;
            }
        }
        for i in 0..n {
            self.offsets[i + 1] += self.offsets[i];
        }
        let filler = pending.first().copied();
        self.jobs.clear();
        if let Some(f) = filler {
            self.jobs.resize(self.offsets[n], f);
        }
        self.counts.clear();
        self.counts.resize(n, PendingByProfile::default());
        self.next.clear();
        self.next.extend_from_slice(&self.offsets[..n]);
        for (p, &o) in pending.iter().zip(&self.owner) {
            let o = o as usize;
            if o >= n {
                continue;
            }
            self.jobs[self.next[o]] = *p;
            self.next[o] += 1;
            count_job(&mut self.counts[o], p);
        }
    }

    /// Node `node`'s claimed jobs (after [`ClaimedQueue::assign`]).
    pub fn of(&self, node: usize) -> &[PendingJob] {
        match (self.offsets.get(node), self.offsets.get(node + 1)) {
            (Some(&a), Some(&b)) => &self.jobs[a..b],
            _ => &[],
        }
    }
}

/// Adds `job` to `counts` as the simulator counts it: on each model, the
/// profile whose shape is the job's smallest fitting shape there.
pub fn count_job(counts: &mut PendingByProfile, job: &PendingJob) {
    for (m, shape) in job.shapes.iter().enumerate() {
        if let Some(shape) = shape {
            let profiles = GpuModel::ALL[m].spec().profiles;
            if let Some(p) = profiles.iter().position(|x| x.shape == *shape) {
                counts[m][p] += 1;
            }
        }
    }
}

/// One policy instance per node (module docs).
pub struct PerNode<P> {
    nodes: Nodes,
    split: Split,
    policies: Vec<P>,
    claimed: ClaimedQueue,
}

impl<P: RepartitionPolicy> PerNode<P> {
    /// `policies[n]` decides node `n` of `nodes` (one per node, in order).
    pub fn new(nodes: Nodes, split: Split, policies: Vec<P>) -> Result<Self, NodesError> {
        if policies.len() != nodes.count() {
            return Err(NodesError::PolicyCount {
                nodes: nodes.count(),
                given: policies.len(),
            });
        }
        Ok(PerNode {
            nodes,
            split,
            policies,
            claimed: ClaimedQueue::default(),
        })
    }

    pub fn nodes(&self) -> &Nodes {
        &self.nodes
    }

    pub fn split(&self) -> Split {
        self.split
    }

    /// Node `n`'s policy.
    pub fn policy(&self, n: usize) -> Option<&P> {
        self.policies.get(n)
    }
}

impl<P: RepartitionPolicy> RepartitionPolicy for PerNode<P> {
    fn name(&self) -> String {
        let inner = self.policies.first().map(P::name).unwrap_or_default();
        format!("nodes:{}:{}:{inner}", self.nodes.per_node, self.split)
    }

    fn describe(&self) -> String {
        let inner = self.policies.first().map(P::describe).unwrap_or_default();
        let sees = match self.split {
            Split::Whole => "the whole pending queue",
            Split::Claimed => {
                "only the pending jobs it claims (rendezvous hashing over node names)"
            }
        };
        format!(
            "{inner}; decided per node of {} GPUs ({} nodes), each node sees {sees}",
            self.nodes.per_node,
            self.nodes.count()
        )
    }

    /// The node's policy, asked with the GPU's number on its node.
    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        let node = self.nodes.node_of(gpu);
        let local = gpu - self.nodes.range(node).start.min(gpu);
        self.policies[node].initial_layout(local, geometry)
    }

    /// Nodes are asked in order; a decision for a GPU its node does not
    /// have is passed on as GPU `usize::MAX`, which the simulator rejects
    /// and counts, rather than landing on another node's GPU. GPUs of the
    /// view past the last node get no decision.
    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        if self.split == Split::Claimed {
            self.claimed.assign(view.pending, self.nodes.names());
        }
        let mut out = Vec::new();
        for (n, policy) in self.policies.iter_mut().enumerate() {
            let range = self.nodes.range(n);
            let range = range.start.min(view.gpus.len())..range.end.min(view.gpus.len());
            if range.is_empty() {
                continue;
            }
            let (pending, counts) = match self.split {
                Split::Whole => (view.pending, view.pending_by_profile),
                Split::Claimed => (self.claimed.of(n), &self.claimed.counts[n]),
            };
            let node_view = ClusterView {
                now: view.now,
                hour_of_day: view.hour_of_day,
                gpus: &view.gpus[range.clone()],
                pending,
                pending_by_profile: counts,
                arrivals: view.arrivals,
            };
            out.extend(policy.decide(&node_view).into_iter().map(|d| Decision {
                gpu: if d.gpu < range.len() {
                    range.start + d.gpu
                } else {
                    usize::MAX
                },
                target: d.target,
            }));
        }
        out
    }

    fn installs_initial_layout(&self) -> bool {
        self.policies.iter().all(P::installs_initial_layout)
    }

    fn served_through_shards(&self) -> bool {
        self.policies.iter().all(P::served_through_shards)
    }
}

/// Builds `nodes:<gpus per node>:<whole|claimed>:<inner spec>` on a
/// cluster of `cluster.len()` GPUs (module docs): the inner spec is parsed
/// once per node with [`super::parse_policy`] over the cluster's models.
/// `None` when `spec` does not start with `nodes:`.
pub fn parse_per_node(
    spec: &str,
    cluster: &[GpuModel],
) -> Option<Result<Box<dyn RepartitionPolicy + Send>, super::PolicyParseError>> {
    let rest = spec.trim().strip_prefix("nodes:")?;
    let bad = || super::PolicyParseError::PerNode(NodesError::BadSpec(spec.to_string()));
    let mut parts = rest.splitn(3, ':');
    let (Some(per_node), Some(split), Some(inner)) = (parts.next(), parts.next(), parts.next())
    else {
        return Some(Err(bad()));
    };
    Some((|| {
        let per_node: usize = per_node.trim().parse().map_err(|_| bad())?;
        let split: Split = split.parse()?;
        let nodes = Nodes::new(cluster.len(), per_node)?;
        let models = GpuModel::distinct(cluster);
        let policies = (0..nodes.count())
            .map(|_| super::parse_policy(inner, &models))
            .collect::<Result<Vec<_>, _>>()?;
        let p: Box<dyn RepartitionPolicy + Send> = Box::new(PerNode::new(nodes, split, policies)?);
        Ok(p)
    })())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::Shape;
    use crate::policy::share::claims;
    use crate::policy::{GpuStatus, MODEL_COUNT};
    use crate::workload::SpeedupCurve;

    const M: GpuModel = GpuModel::A100_40gb;

    fn job(id: u64, shape: Shape) -> PendingJob {
        let mut shapes = [None; MODEL_COUNT];
        shapes[M as usize] = Some(shape);
        PendingJob {
            id,
            arrival: 0.0,
            deadline: 1e6,
            work: 100.0,
            memory_gb: 1.0,
            min_compute: 1,
            speedup: SpeedupCurve {
                beta: 1.0,
                saturation: 1.0,
            },
            shapes,
        }
    }

    #[test]
    fn nodes_cut_the_cluster_in_order_and_the_last_takes_the_rest() {
        let n = Nodes::new(20, 8).unwrap();
        assert_eq!(n.count(), 3);
        assert_eq!(n.names(), ["node001", "node002", "node003"]);
        assert_eq!((n.range(0), n.range(1), n.range(2)), (0..8, 8..16, 16..20));
        assert!(n.range(3).is_empty());
        assert_eq!((n.node_of(7), n.node_of(8), n.node_of(99)), (0, 1, 2));
        assert_eq!(Nodes::new(8, 0), Err(NodesError::NoGpusPerNode(0)));
        assert_eq!(Nodes::new(0, 8), Err(NodesError::NoGpus));
        assert_eq!(Nodes::new(1000, 8).unwrap().names()[124], "node125");
    }

    #[test]
    fn claimed_queue_gives_each_job_to_its_claimant_once_with_its_counts() {
        let names = Nodes::new(64, 8).unwrap().names().to_vec();
        let small = Shape::new(1, 1);
        let big = Shape::new(3, 4);
        let pending: Vec<PendingJob> = (0..500)
            .map(|i| job(i * 7 + 3, if i % 3 == 0 { big } else { small }))
            .collect();
        let mut q = ClaimedQueue::default();
        // Twice: the second pass runs from the cache and reuses buffers.
        for _ in 0..2 {
            q.assign(&pending, &names);
            let mut seen = Vec::new();
            for (n, name) in names.iter().enumerate() {
                let mut c = PendingByProfile::default();
                for p in q.of(n) {
                    assert!(claims(p.id, name, &names), "job {} on {name}", p.id);
                    count_job(&mut c, p);
                    seen.push(p.id);
                }
                assert_eq!(c, q.counts[n], "{name}");
            }
            seen.sort_unstable();
            let mut all: Vec<u64> = pending.iter().map(|p| p.id).collect();
            all.sort_unstable();
            assert_eq!(seen, all);
        }
        // Every node gets some of 500 jobs over 8 nodes.
        assert!((0..names.len()).all(|n| !q.of(n).is_empty()));
        // A shorter queue next epoch: stale jobs are gone.
        q.assign(&pending[..10], &names);
        assert_eq!(q.jobs.len(), 10);
        q.assign(&[], &names);
        assert!(q.jobs.is_empty() && (0..8).all(|n| q.of(n).is_empty()));
    }

    /// A policy that asks every GPU of its view to become `target` and
    /// records what it saw.
    struct Probe {
        target: Layout,
        seen: Vec<(usize, Vec<u64>)>,
        bogus: bool,
    }

    impl RepartitionPolicy for Probe {
        fn name(&self) -> String {
            "probe".into()
        }
        fn initial_layout(&mut self, gpu: usize, _g: &'static Geometry) -> Layout {
            Layout(u32::try_from(gpu).unwrap_or(0))
        }
        fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
            self.seen
                .push((view.gpus.len(), view.pending.iter().map(|p| p.id).collect()));
            let mut d: Vec<Decision> = (0..view.gpus.len())
                .map(|gpu| Decision {
                    gpu,
                    target: self.target,
                })
                .collect();
            if self.bogus {
                d.push(Decision {
                    gpu: view.gpus.len(),
                    target: self.target,
                });
            }
            d
        }
    }

    #[test]
    fn decisions_map_back_to_cluster_gpus_and_views_follow_the_split() {
        let g = Geometry::of(M);
        let gpus: Vec<GpuStatus> = (0..10).map(|_| GpuStatus::new(M, g.whole_gpu())).collect();
        let pending: Vec<PendingJob> = (0..40).map(|i| job(i, Shape::new(1, 1))).collect();
        let mut counts = PendingByProfile::default();
        for p in &pending {
            count_job(&mut counts, p);
        }
        let view = ClusterView {
            now: 5.0,
            hour_of_day: 1.0,
            gpus: &gpus,
            pending: &pending,
            pending_by_profile: &counts,
            arrivals: &[],
        };
        for split in Split::ALL {
            let nodes = Nodes::new(10, 4).unwrap();
            let probes = (0..3)
                .map(|i| Probe {
                    target: Layout(i),
                    seen: Vec::new(),
                    bogus: i == 1,
                })
                .collect();
            let mut p = PerNode::new(nodes.clone(), split, probes).unwrap();
            // Initial layouts come from the node's policy with local numbers.
            assert_eq!(p.initial_layout(5, g), Layout(1));
            assert_eq!(p.initial_layout(9, g), Layout(1));
            let d = p.decide(&view);
            let want: Vec<(usize, u32)> = (0..4)
                .map(|i| (i, 0))
                .chain((4..8).map(|i| (i, 1)))
                .chain([(usize::MAX, 1)])
                .chain((8..10).map(|i| (i, 2)))
                .collect();
            let got: Vec<(usize, u32)> = d.iter().map(|d| (d.gpu, d.target.0)).collect();
            assert_eq!(got, want, "{split}");
            let sizes: Vec<usize> = p.policies.iter().map(|x| x.seen[0].0).collect();
            assert_eq!(sizes, [4, 4, 2]);
            let seen: usize = p.policies.iter().map(|x| x.seen[0].1.len()).sum();
            match split {
                Split::Whole => assert_eq!(seen, 3 * 40),
                Split::Claimed => assert_eq!(seen, 40),
            }
            assert!(p.name().starts_with(&format!("nodes:4:{split}:probe")));
        }
        assert!(PerNode::<Probe>::new(Nodes::new(10, 4).unwrap(), Split::Whole, vec![]).is_err());
    }

    #[test]
    fn specs_parse_and_refuse_nonsense() {
        let cluster = vec![M; 16];
        let p = parse_per_node("nodes:8:claimed:greedy", &cluster)
            .unwrap()
            .unwrap();
        assert_eq!(p.name(), "nodes:8:claimed:greedy");
        assert!(p.installs_initial_layout());
        let p = parse_per_node("nodes:8:whole:none", &cluster)
            .unwrap()
            .unwrap();
        assert!(!p.installs_initial_layout());
        assert!(parse_per_node("greedy", &cluster).is_none());
        for bad in [
            "nodes:8:greedy",
            "nodes:x:whole:greedy",
            "nodes:0:whole:greedy",
            "nodes:8:some:greedy",
            "nodes:8:whole:nonsense",
        ] {
            assert!(
                parse_per_node(bad, &cluster).unwrap().is_err(),
                "{bad} was accepted"
            );
        }
        let e = parse_per_node("nodes:8:some:greedy", &cluster)
            .unwrap()
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("unknown split `some`"), "{e}");
    }
}
