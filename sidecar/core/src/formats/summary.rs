//! The cluster summary (issue 23; docs/architecture.md, "Cluster scale"):
//! what `smartmig publish` writes for each smartmig node into a directory
//! the nodes share, `<summary_dir>/<node>.json`, and smartmigd reads
//! instead of asking Slurm: the node's own jobs and Slurm state, and the
//! pending jobs it claims. The Slurm records in it ([`QueuedJob`],
//! [`NodeInfo`]) are the ones smartmigd's Slurm client parses
//! (`daemon::slurm`); the publisher's split of one Slurm read into the
//! nodes' files is `daemon::summary::build`.
//!
//! Version: [`SUMMARY_VERSION`]; a node refuses a file of another version
//! by name ([`NodeSummary::check`]), so the publisher and the nodes are
//! updated together. Fields added to the records must be optional
//! (`#[serde(default)]`).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

/// Where a job is in its life, from `squeue --json`'s `job_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    /// Running, suspended, configuring, resizing, signaling, ...: it may
    /// hold its instance.
    Running,
    /// Ending on its node(s): the epilog has not finished yet.
    Completing,
    /// Requeued: on its way back to pending.
    Requeued,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    /// Any other final state (NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL,
    /// DEADLINE, PREEMPTED, ...).
    OtherEnded,
}

impl JobState {
    /// The state of a `job_state` string; several (later Slurm versions
    /// print an array) are folded with completing and requeued first.
    pub fn of(states: &[String]) -> JobState {
        let has = |s: &str| states.iter().any(|x| x == s);
        if has("COMPLETING") {
            return JobState::Completing;
        }
        if has("REQUEUED") || has("REQUEUE_FED") || has("REQUEUE_HOLD") {
            return JobState::Requeued;
        }
        match states.first().map(String::as_str) {
            Some("PENDING") => JobState::Pending,
            Some(
                "RUNNING" | "SUSPENDED" | "CONFIGURING" | "RESIZING" | "SIGNALING" | "STAGE_OUT"
                | "STOPPED",
            ) => JobState::Running,
            Some("COMPLETED") => JobState::Completed,
            Some("FAILED") => JobState::Failed,
            Some("CANCELLED") => JobState::Cancelled,
            Some("TIMEOUT") => JobState::Timeout,
            _ => JobState::OtherEnded,
        }
    }

    /// Whether processes of a job in this state may still run on its
    /// instance (running, suspended, or ending with its epilog not done):
    /// its instance must not be given away (issue 42).
    pub fn may_run(self) -> bool {
        matches!(self, JobState::Running | JobState::Completing)
    }

    /// Whether a job in this state may still hold (or soon hold again)
    /// its instance: anything but a final state.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            JobState::Pending | JobState::Running | JobState::Completing | JobState::Requeued
        )
    }
}

/// One job of `squeue --json`, with what the daemon uses (also the
/// cluster summary's job record, [`NodeSummary::jobs`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueuedJob {
    pub job_id: u64,
    pub state: JobState,
    /// K of its `gres:shard:K` request (0: no shards).
    pub shards: u8,
    /// The GPU index its shards were taken from (`gres_detail`,
    /// `shard:3(IDX:0)`), once running.
    pub gpu: Option<u32>,
    /// Node list (`""` while pending).
    pub nodes: String,
    /// Wall-time limit in seconds (`None`: unlimited).
    pub time_limit_s: Option<u64>,
    /// Unix start time (0 while pending).
    pub start_time: u64,
    /// Unix end time: start + time limit while running, the real end after.
    pub end_time: u64,
    /// Unix `--deadline` (`None`: none).
    pub deadline: Option<u64>,
    pub submit_time: u64,
    /// `(array job id, task id)` of an array task: Slurm reads a bare
    /// array job id as the whole array, so a task is named `A_T`.
    pub array_task: Option<(u64, u64)>,
    /// The job's account (`None` when Slurm shows none).
    pub account: Option<String>,
    /// The job's `AdminComment` (`""` when none).
    pub admin_comment: String,
    /// The MIG profile of a native typed GPU request
    /// (`--gres=gpu:3g.20gb:1`), the way a site without smartmig runs
    /// jobs on a static MIG layout; `mode = "advise"` watches these.
    #[serde(default)]
    pub mig_profile: Option<String>,
    /// How often Slurm restarted (requeued) it: a pending job with
    /// restarts may still be some node's to release.
    #[serde(default)]
    pub restarts: u32,
    /// Its partition(s), comma-separated (`""`: not shown).
    #[serde(default)]
    pub partition: String,
    /// The job's name (`""`: not shown); smartmigd's holds on stranded
    /// shards are named [`HOLD_NAME`]`.<node>.<gpu>`.
    #[serde(default)]
    pub name: String,
}

/// The name prefix of smartmigd's holds on stranded shards (issue 42,
/// docs/slurm-integration.md §9): placeholder allocations, not demand.
pub const HOLD_NAME: &str = "smartmig-hold";

impl QueuedJob {
    /// A job of which only the id and state are known; everything else
    /// empty (no request, no times, no node).
    pub fn new(job_id: u64, state: JobState) -> QueuedJob {
        QueuedJob {
            job_id,
            state,
            shards: 0,
            gpu: None,
            nodes: String::new(),
            time_limit_s: None,
            start_time: 0,
            end_time: 0,
            deadline: None,
            submit_time: 0,
            array_task: None,
            account: None,
            admin_comment: String::new(),
            mig_profile: None,
            restarts: 0,
            partition: String::new(),
            name: String::new(),
        }
    }

    /// `(node, GPU)` of one of smartmigd's holds (`smartmig-hold.n1.0`).
    pub fn hold_of(&self) -> Option<(&str, u32)> {
        let rest = self.name.strip_prefix(HOLD_NAME)?.strip_prefix('.')?;
        let (node, gpu) = rest.rsplit_once('.')?;
        Some((node, gpu.parse().ok()?))
    }

    /// How `scontrol` names this job alone (`A_T` for an array task).
    pub fn slurm_id(&self) -> String {
        match self.array_task {
            Some((array, task)) => format!("{array}_{task}"),
            None => self.job_id.to_string(),
        }
    }
}

/// The whole queue as one `squeue --json` call saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueSnapshot {
    pub jobs: Vec<QueuedJob>,
}

impl QueueSnapshot {
    /// Ids of jobs that are not in a final state.
    pub fn live(&self) -> HashSet<u64> {
        self.jobs
            .iter()
            .filter(|j| j.state.is_live())
            .map(|j| j.job_id)
            .collect()
    }

    /// Pending jobs with a shard request (smartmigd's holds are no
    /// demand).
    pub fn pending_shards(&self) -> impl Iterator<Item = &QueuedJob> {
        self.jobs
            .iter()
            .filter(|j| j.state == JobState::Pending && j.shards > 0 && j.hold_of().is_none())
    }

    pub fn job(&self, job_id: u64) -> Option<&QueuedJob> {
        self.jobs.iter().find(|j| j.job_id == job_id)
    }

    /// Pending jobs with a typed MIG request (`--gres=gpu:3g.20gb:1`).
    pub fn pending_typed(&self) -> impl Iterator<Item = &QueuedJob> {
        self.jobs
            .iter()
            .filter(|j| j.state == JobState::Pending && j.mig_profile.is_some())
    }
}

/// The node's features (`AvailableFeatures`, `ActiveFeatures`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFeatures {
    pub available: Vec<String>,
    pub active: Vec<String>,
}

/// What `sinfo --json` says of one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub features: NodeFeatures,
    /// DRAIN is among its state flags (draining or drained).
    pub drain: bool,
    /// The admin's (or our) reason, `""` when none.
    pub reason: String,
}

/// Reasons smartmig drains a node with start with this; only such a
/// drain is undone by smartmigd.
pub const DRAIN_REASON_PREFIX: &str = "smartmig:";

impl NodeInfo {
    /// Drained by smartmig (the plugin found the sidecar unreachable), so
    /// smartmigd may resume it; an admin's drain is never touched.
    pub fn drained_by_smartmig(&self) -> bool {
        self.drain && self.reason.starts_with(DRAIN_REASON_PREFIX)
    }
}

/// The format's version; a node refuses another one by name.
pub const SUMMARY_VERSION: u32 = 1;

/// Why a node does not use its summary file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SummaryError {
    #[error("version {found} (this smartmigd reads version {SUMMARY_VERSION}): update the publisher and the nodes together")]
    Version { found: u32 },
    #[error("written for node {found}, not {wanted}")]
    Node { found: String, wanted: String },
    #[error("{age} s old (stale after {limit} s: {max_epochs} of the publisher's {epoch_s} s epochs); is `smartmig publish` running?")]
    Stale {
        age: u64,
        limit: u64,
        max_epochs: u64,
        epoch_s: u64,
    },
}

/// What one node reads each epoch: `<summary_dir>/<node>.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    pub version: u32,
    /// Unix seconds when the publisher read Slurm.
    pub generated_at: u64,
    /// The publisher's epoch, s (a node allows a few before it calls the
    /// file stale).
    pub epoch_s: u64,
    pub node: String,
    /// smartmig nodes (with shard GRES) the pending jobs were split over.
    pub nodes: u32,
    /// The node's Slurm state (features, drain and reason), as `sinfo`
    /// showed it.
    pub info: NodeInfo,
    /// The node's jobs (any state Slurm still lists, with the node in
    /// their node list) and the pending shard (or typed MIG) jobs it claims.
    pub jobs: Vec<QueuedJob>,
    /// Pending jobs that ran before (requeued): they may still hold an
    /// instance here until the epilog's release, so they count as live.
    pub requeued: Vec<u64>,
    /// Pending shard jobs in the whole cluster, by shard count (index 0:
    /// one shard), for the record and the status.
    pub pending_by_shards: [u32; 8],
}

impl NodeSummary {
    /// Pending jobs this node claims.
    pub fn claimed(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| j.state == JobState::Pending)
            .count()
    }

    /// The queue as this node sees it: its jobs, its claimed pending jobs
    /// and the requeued ones (as pending jobs without a request, so they
    /// are live but no demand).
    pub fn snapshot(&self) -> QueueSnapshot {
        let mut jobs = self.jobs.clone();
        for &id in &self.requeued {
            if jobs.iter().all(|j| j.job_id != id) {
                jobs.push(QueuedJob {
                    restarts: 1,
                    ..QueuedJob::new(id, JobState::Pending)
                });
            }
        }
        QueueSnapshot { jobs }
    }

    /// Whether the file can stand for Slurm at `now` for `node`: right
    /// version, right node, and no older than `max_epochs` of the
    /// publisher's epochs (at least `min_age_s`). The reason otherwise.
    pub fn check(
        &self,
        node: &str,
        now: u64,
        max_epochs: u64,
        min_age_s: u64,
    ) -> Result<(), SummaryError> {
        if self.version != SUMMARY_VERSION {
            return Err(SummaryError::Version {
                found: self.version,
            });
        }
        if self.node != node {
            return Err(SummaryError::Node {
                found: self.node.clone(),
                wanted: node.to_string(),
            });
        }
        let age = now.saturating_sub(self.generated_at);
        let limit = (self.epoch_s.saturating_mul(max_epochs)).max(min_age_s);
        if age > limit {
            return Err(SummaryError::Stale {
                age,
                limit,
                max_epochs,
                epoch_s: self.epoch_s,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(node: &str, generated_at: u64) -> NodeSummary {
        NodeSummary {
            version: SUMMARY_VERSION,
            generated_at,
            epoch_s: 60,
            node: node.into(),
            nodes: 1,
            info: NodeInfo::default(),
            jobs: vec![QueuedJob::new(7, JobState::Pending)],
            requeued: vec![8],
            pending_by_shards: [0; 8],
        }
    }

    #[test]
    fn a_stale_or_foreign_file_is_refused_by_name() {
        let s = summary("gpu0", 1_000);
        assert!(s.check("gpu0", 1_100, 3, 10).is_ok());
        let err = s.check("gpu0", 1_200, 3, 10).unwrap_err().to_string();
        assert!(err.starts_with("200 s old (stale after 180 s"), "{err}");
        assert!(s
            .check("gpu1", 1_000, 3, 10)
            .unwrap_err()
            .to_string()
            .contains("not gpu1"));
        let mut v2 = s.clone();
        v2.version = 2;
        assert!(v2
            .check("gpu0", 1_000, 3, 10)
            .unwrap_err()
            .to_string()
            .starts_with("version 2"));
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<NodeSummary>(&text).unwrap(), s);
    }

    #[test]
    fn a_node_sees_its_requeued_jobs_as_live_without_demand() {
        let q = summary("gpu0", 0).snapshot();
        assert_eq!(q.live(), HashSet::from([7, 8]));
        assert_eq!(q.pending_shards().count(), 0);
        assert_eq!(q.job(8).map(|j| j.restarts), Some(1));
    }
}
