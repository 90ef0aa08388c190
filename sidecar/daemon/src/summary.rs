//! The cluster summary (issue 23; docs/architecture.md, "Cluster scale").
//!
//! Without it every node's smartmigd reads the whole queue (`squeue
//! --json`) and every node (`sinfo --json`) each epoch, so slurmctld
//! serialises the cluster once per node per epoch, and every node sees
//! the same pending demand and may reshape for it at once. With it, one
//! publisher (`smartmig publish`, on the controller or any host with the
//! Slurm client) reads both once per epoch and writes one small file per
//! smartmig node into a directory the nodes share (read-only NFS or the
//! cluster file system): the node's own jobs, its Slurm state, and the
//! pending jobs it *claims* by rendezvous hashing of the job id over the
//! node names ([`smartmig_core::policy::share`]), so each pending job is
//! one node's demand. A node reads its file instead of asking Slurm, and
//! falls back to asking Slurm itself (or to holding its layout) when the
//! file is missing, stale or unreadable, and says so in status and
//! metrics.
//!
//! Everything here is pure: the publisher and the daemon do the IO.

use std::collections::HashMap;

use crate::slurm::{names_node, JobState, ListedNode, QueueSnapshot, QueuedJob};
pub use smartmig_core::formats::summary::{NodeSummary, SummaryError, SUMMARY_VERSION};
use smartmig_core::policy::share;

/// Splits one read of the queue and the nodes into each smartmig node's
/// summary. Nodes without shard or MIG GRES get none; a pending job goes to the
/// one node that claims it among the smartmig nodes (none when there are
/// none).
pub fn build(
    queue: &QueueSnapshot,
    nodes: &[ListedNode],
    now: u64,
    epoch_s: u64,
) -> Vec<NodeSummary> {
    let ours: Vec<&ListedNode> = nodes.iter().filter(|n| n.mig_node).collect();
    let names: Vec<&str> = ours.iter().map(|n| n.name.as_str()).collect();
    let mut out: Vec<NodeSummary> = ours
        .iter()
        .map(|n| NodeSummary {
            version: SUMMARY_VERSION,
            generated_at: now,
            epoch_s,
            node: n.name.clone(),
            nodes: names.len() as u32,
            info: n.info.clone(),
            jobs: Vec::new(),
            requeued: Vec::new(),
            pending_by_shards: [0; 8],
        })
        .collect();
    let mut by_shards = [0u32; 8];
    let mut requeued = Vec::new();
    // Jobs alike (partition, size, profile) have the same eligible nodes.
    type Class = (String, u8, Option<String>);
    let mut classes: HashMap<Class, (Vec<usize>, Vec<&str>)> = HashMap::new();
    for j in &queue.jobs {
        if j.state == JobState::Pending {
            if j.shards > 0 {
                by_shards[usize::from(j.shards.min(8)) - 1] += 1;
            }
            if j.restarts > 0 {
                requeued.push(j.job_id);
            }
            if j.shards > 0 || j.mig_profile.is_some() {
                let key = (j.partition.clone(), j.shards, j.mig_profile.clone());
                let (idx, eligible) = classes
                    .entry(key)
                    .or_insert_with(|| eligible_nodes(&ours, j));
                if let Some(k) = share::claimant(j.job_id, eligible) {
                    out[idx[k]].jobs.push(j.clone());
                }
            }
            continue;
        }
        if j.nodes.is_empty() {
            continue;
        }
        for s in &mut out {
            if names_node(&j.nodes, &s.node) {
                s.jobs.push(j.clone());
            }
        }
    }
    for s in &mut out {
        s.pending_by_shards = by_shards;
        s.requeued.clone_from(&requeued);
    }
    out
}

/// The nodes (indices into `ours`, and their names) where pending job `j`
/// could run: in one of its partitions (any, when it shows none), with
/// shards and a GPU of at least its size (when the node's GRES tell), or
/// for a typed request a device of its MIG profile. Only these claim it, so no job is claimed by a
/// node where it fits no GPU.
fn eligible_nodes<'a>(ours: &[&'a ListedNode], j: &QueuedJob) -> (Vec<usize>, Vec<&'a str>) {
    let parts: Vec<&str> = j.partition.split(',').filter(|p| !p.is_empty()).collect();
    ours.iter()
        .enumerate()
        .filter(|(_, n)| {
            parts.is_empty() || n.partitions.iter().any(|p| parts.contains(&p.as_str()))
        })
        .filter(|(_, n)| {
            // A shard job needs shards: not a static-MIG node, and a GPU
            // of at least its size where the GRES tell.
            j.shards == 0
                || (n.shards_per_gpu == 0 && n.mig_types.is_empty())
                || j.shards <= n.shards_per_gpu
        })
        .filter(|(_, n)| {
            j.mig_profile
                .as_ref()
                .is_none_or(|t| n.mig_types.contains(t))
        })
        .map(|(i, n)| (i, n.name.as_str()))
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::NodeInfo;

    fn job(id: u64, state: JobState, shards: u8, nodes: &str) -> QueuedJob {
        QueuedJob {
            shards,
            nodes: nodes.into(),
            time_limit_s: Some(600),
            submit_time: 1,
            ..QueuedJob::new(id, state)
        }
    }

    fn node(name: &str, shards: bool) -> ListedNode {
        ListedNode {
            name: name.into(),
            info: NodeInfo::default(),
            mig_node: shards,
            partitions: vec!["gpu".into()],
            shards_per_gpu: 7,
            mig_types: Vec::new(),
        }
    }

    #[test]
    fn every_pending_job_goes_to_one_node_and_running_jobs_to_theirs() {
        let nodes: Vec<ListedNode> = (0..5)
            .map(|i| node(&format!("gpu{i}"), true))
            .chain([node("cpu0", false)])
            .collect();
        let mut jobs: Vec<QueuedJob> = (0..200)
            .map(|i| job(i, JobState::Pending, 1 + (i % 7) as u8, ""))
            .collect();
        jobs.push(job(1000, JobState::Running, 2, "gpu[1-2]"));
        jobs.push(job(1001, JobState::Completed, 2, "gpu3"));
        jobs.push(job(1002, JobState::Pending, 0, ""));
        let mut requeued = job(1003, JobState::Pending, 3, "");
        requeued.restarts = 1;
        jobs.push(requeued);
        let q = QueueSnapshot { jobs };
        let out = build(&q, &nodes, 50, 60);
        assert_eq!(out.len(), 5, "no summary for a node without shards");
        let claimed: usize = out.iter().map(NodeSummary::claimed).sum();
        assert_eq!(claimed, 201, "200 + the requeued shard job, each once");
        assert!(out.iter().all(|s| s.claimed() > 10), "shares are spread");
        let holders: Vec<&str> = out
            .iter()
            .filter(|s| s.jobs.iter().any(|j| j.job_id == 1000))
            .map(|s| s.node.as_str())
            .collect();
        assert_eq!(holders, ["gpu1", "gpu2"]);
        assert!(out[3].jobs.iter().any(|j| j.job_id == 1001));
        assert!(out.iter().all(|s| s.requeued == [1003]));
        assert!(out
            .iter()
            .all(|s| s.pending_by_shards.iter().sum::<u32>() == 201));
        // Every node's view keeps the requeued job live.
        for s in &out {
            assert!(s.snapshot().live().contains(&1003));
            assert_eq!(s.snapshot().pending_shards().count(), s.claimed());
        }
    }

    #[test]
    fn a_job_is_claimed_only_where_it_can_run() {
        // Two A100 nodes (7 shards a GPU) in `gpu`, two A30 nodes (4) in
        // `small`, one static-MIG node with 3g.20gb devices in `gpu`.
        let mut nodes: Vec<ListedNode> = (0..4).map(|i| node(&format!("n{i}"), true)).collect();
        for n in &mut nodes[2..] {
            n.shards_per_gpu = 4;
            n.partitions = vec!["small".into()];
        }
        let mut mig = node("m0", true);
        mig.shards_per_gpu = 0;
        mig.mig_types = vec!["3g.20gb".into()];
        nodes.push(mig);
        let mut jobs = Vec::new();
        for i in 0..300u64 {
            let mut j = job(i, JobState::Pending, if i % 2 == 0 { 7 } else { 2 }, "");
            j.partition = if i % 3 == 0 {
                "small".into()
            } else {
                String::new()
            };
            jobs.push(j);
        }
        let mut typed = job(1000, JobState::Pending, 0, "");
        typed.mig_profile = Some("3g.20gb".into());
        typed.partition = "gpu".into();
        jobs.push(typed);
        let out = build(&QueueSnapshot { jobs }, &nodes, 1, 60);
        let at = |name: &str| out.iter().find(|s| s.node == name).unwrap();
        for s in &out {
            for j in &s.jobs {
                let small = s.node.starts_with("n2") || s.node.starts_with("n3");
                assert!(
                    !(small && j.shards == 7),
                    "a 7-shard job claimed by A30 node {}",
                    s.node
                );
                assert!(
                    j.partition != "small" || small,
                    "job {} outside its partition on {}",
                    j.job_id,
                    s.node
                );
            }
        }
        // 7-shard jobs in `small` fit nowhere: nobody claims them.
        let claimed: usize = out.iter().map(NodeSummary::claimed).sum();
        let unfit = (0..300u64).filter(|i| i % 2 == 0 && i % 3 == 0).count();
        assert_eq!(claimed, 301 - unfit);
        assert!(at("n0").claimed() > 0 && at("n2").claimed() > 0);
        assert!(
            out.iter()
                .filter(|s| s.jobs.iter().any(|j| j.job_id == 1000))
                .count()
                == 1
        );
    }
}
