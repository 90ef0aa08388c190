//! What the daemon asks Slurm, behind a trait so tests run without Slurm.
//!
//! Slurm 22.05 facts (brief §3): `squeue --json` and `sinfo --json` work but
//! ignore `-j`/`-n` filters, so filtering is client side; `scontrol --json`
//! does not exist; `scontrol update nodename=X AvailableFeatures=..
//! ActiveFeatures=..` replaces the whole list, so the admin's own features
//! must be read first and kept.
//!
//! One `squeue --json` call per epoch ([`SlurmClient::queue`]) feeds the
//! reaper, the policy's pending demand and the running jobs' end times.
//! 22.05 ignores `-t`/`-w`/`-j` with `--json` (checked: `squeue --json -t PD`
//! lists running jobs too), so the answer is the whole queue, about 3.3 KB a
//! job, and recently ended jobs stay in it for `MinJobAge` (300 s by default)
//! with their final state.

use std::collections::HashSet;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a Slurm query failed.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("running `{cmd}`: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Failed {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("`{cmd}` took more than {secs} s")]
    Timeout { cmd: String, secs: u64 },
    #[error("`{cmd}` printed unexpected JSON: {source}")]
    Json {
        cmd: String,
        source: serde_json::Error,
    },
    #[error("`{cmd}` printed unexpected JSON: {source}")]
    Parse { cmd: String, source: ParseError },
}

/// What `squeue --json` or `sinfo --json` printed that [`parse_queue`] or
/// [`parse_node`] cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The top-level array (`jobs`, `nodes`) is missing or not an array.
    #[error("no `{0}` array")]
    MissingArray(&'static str),
    /// `sinfo` does not list the node.
    #[error("node {0} not listed")]
    NodeNotListed(String),
}

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
    fn of(states: &[String]) -> JobState {
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
/// cluster summary's job record, [`crate::summary`]).
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
/// docs/slurm-integration.md §8): placeholder allocations, not demand.
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

/// A job's account and `AdminComment`, as `scontrol show job` prints them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobComment {
    /// `None` for Slurm's `(null)`.
    pub account: Option<String>,
    /// `""` when none.
    pub admin_comment: String,
}

/// Parses `scontrol show job ID` (22.05's multi-line form: `Account=` on
/// the `Priority=` line, `AdminComment=TEXT ` on a line of its own when
/// set, and its text may hold spaces). `None` when no `JobId=` line.
pub fn parse_job_comment(text: &str) -> Option<JobComment> {
    if !text.trim_start().starts_with("JobId=") {
        return None;
    }
    let mut out = JobComment::default();
    for line in text.lines().map(str::trim) {
        if let Some(c) = line.strip_prefix("AdminComment=") {
            out.admin_comment = c.trim_end().to_string();
        } else if let Some(a) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("Account="))
        {
            out.account = (!a.is_empty() && a != "(null)").then(|| a.to_string());
        }
    }
    Some(out)
}

/// The node's features (`AvailableFeatures`, `ActiveFeatures`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFeatures {
    pub available: Vec<String>,
    pub active: Vec<String>,
}

/// One `gpu` GRES line of `slurmd -G`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GresGpu {
    /// Slurm's index: what `CUDA_VISIBLE_DEVICES`/`SLURM_JOB_GPUS` name.
    pub index: u32,
    pub file: String,
    /// `Type=` when it names a MIG profile (`3g.20gb`): a static MIG
    /// setup's device, not a whole GPU.
    pub mig_type: Option<String>,
}

/// Parses `slurmd -G` (22.05 prints one log line per GRES, e.g.
/// `slurmd: Gres Name=gpu Type=(null) Count=1 Index=0 ID=7696487
/// File=/dev/nvidia0 (null)`); only `gpu` lines with an index and a file.
pub fn parse_gres_gpus(text: &str) -> Vec<GresGpu> {
    text.lines()
        .filter(|l| l.contains("Gres Name=gpu "))
        .filter_map(|l| {
            let field = |key: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(key))
                    .map(str::to_string)
            };
            Some(GresGpu {
                index: field("Index=")?.parse().ok()?,
                file: field("File=")?,
                mig_type: field("Type=").and_then(|t| mig_type(&format!("gres:gpu:{t}"))),
            })
        })
        .collect()
}

/// Compares Slurm's GPU order with the backend's: Slurm's GPU `index` is
/// the device file `file` (minor `minor_of(file)`); the backend's GPU of
/// that index must have that minor number. One line per disagreement;
/// GPUs whose minor is unknown on either side are not compared.
pub fn gpu_order_mismatches(
    backend: &[(u32, Option<u32>)],
    slurm: &[GresGpu],
    minor_of: impl Fn(&str) -> Option<u32>,
) -> Vec<String> {
    let mut out = Vec::new();
    for g in slurm {
        let Some(file_minor) = minor_of(&g.file) else {
            continue;
        };
        match backend.iter().find(|(i, _)| *i == g.index) {
            None => out.push(format!(
                "Slurm's GPU {} ({}) does not exist here (smartmigd sees {} GPU(s))",
                g.index,
                g.file,
                backend.len()
            )),
            Some((_, Some(m))) if *m != file_minor => {
                let owner = backend
                    .iter()
                    .find(|(_, bm)| *bm == Some(file_minor))
                    .map_or("no GPU".to_string(), |(i, _)| format!("GPU {i}"));
                out.push(format!(
                    "Slurm's GPU {} is {} (minor {file_minor}), which is smartmigd's {owner}; \
                     smartmigd's GPU {} is /dev/nvidia{m}",
                    g.index, g.file, g.index
                ));
            }
            Some(_) => {}
        }
    }
    out
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

/// The Slurm queries the daemon makes.
pub trait SlurmClient: Send + Sync {
    /// The whole queue (one `squeue --json`): live jobs, pending shard
    /// requests, time limits, deadlines and recently ended jobs' states.
    fn queue(&self) -> Result<QueueSnapshot, SlurmError>;
    fn node(&self, node: &str) -> Result<NodeInfo, SlurmError>;
    /// Every node (one `sinfo --json`): the cluster summary's publisher.
    fn nodes(&self) -> Result<Vec<ListedNode>, SlurmError> {
        Err(SlurmError::Failed {
            cmd: "sinfo --json".into(),
            status: "not supported by this client".into(),
            stderr: String::new(),
        })
    }
    fn set_node_features(&self, node: &str, features: &NodeFeatures) -> Result<(), SlurmError>;
    /// `scontrol update NodeName=N State=RESUME`.
    fn resume(&self, node: &str) -> Result<(), SlurmError>;
    /// The node's `gpu` GRES as slurmd parsed gres.conf (`slurmd -G`):
    /// Slurm's GPU index and its device file. Clients that cannot tell
    /// say so (the daemon then skips the check).
    fn gres_gpus(&self, node: &str) -> Result<Vec<GresGpu>, SlurmError> {
        Err(SlurmError::Failed {
            cmd: format!("slurmd -G -N {node}"),
            status: "unsupported".into(),
            stderr: "this Slurm client cannot read gres.conf".into(),
        })
    }
    /// Sets a pending job's shard request (`scontrol update JobId=J
    /// Gres=shard:K`), so Slurm bills the larger instance a restart gets.
    fn set_job_shards(&self, job_id: u64, shards: u8) -> Result<(), SlurmError> {
        Err(SlurmError::Failed {
            cmd: format!("scontrol update JobId={job_id} Gres=shard:{shards}"),
            status: "unsupported".into(),
            stderr: "this Slurm client cannot update jobs".into(),
        })
    }
    /// Requeues a job (`scontrol requeue <id>`, `id` as
    /// [`QueuedJob::slurm_id`] names it): used after an out-of-memory
    /// failure. Clients that cannot requeue say so.
    fn requeue(&self, job: &str) -> Result<(), SlurmError> {
        Err(SlurmError::Failed {
            cmd: format!("scontrol requeue {job}"),
            status: "unsupported".into(),
            stderr: "this Slurm client cannot requeue jobs".into(),
        })
    }
    /// One job's account and `AdminComment` (`scontrol show job ID`, one
    /// single-job RPC: `squeue --json --jobs=ID` would serialise the whole
    /// queue, 22.05 ignoring the filter), `None` when Slurm no longer
    /// lists it.
    fn job_comment(&self, job_id: u64) -> Result<Option<JobComment>, SlurmError> {
        Ok(self.queue()?.job(job_id).map(|j| JobComment {
            account: j.account.clone(),
            admin_comment: j.admin_comment.clone(),
        }))
    }
    /// Queues a hold on `shards` shards of GRES type `gres_type` on `node`
    /// (`salloc --no-shell -J NAME -w NODE --gres=shard:TYPE:K
    /// --priority=TOP -n1 --mem=1M`) and returns its job id as soon as
    /// Slurm accepted it, pending or granted; salloc is left waiting for
    /// the grant.
    fn hold(&self, name: &str, node: &str, gres_type: &str, shards: u8) -> Result<u64, SlurmError> {
        Err(SlurmError::Failed {
            cmd: format!("salloc --no-shell -J {name} -w {node} --gres=shard:{gres_type}:{shards}"),
            status: "unsupported".into(),
            stderr: "this Slurm client cannot hold shards".into(),
        })
    }
    /// Cancels a job (`scancel ID`): a hold smartmigd no longer needs.
    fn cancel(&self, job_id: u64) -> Result<(), SlurmError> {
        Err(SlurmError::Failed {
            cmd: format!("scancel {job_id}"),
            status: "unsupported".into(),
            stderr: "this Slurm client cannot cancel jobs".into(),
        })
    }
    /// slurmctld's record of one job with its per-node detail (`scontrol
    /// show job -d ID`, one single-job RPC): its state and the GRES it has
    /// on each node ([`crate::grant::parse_grant`]). `None` when Slurm no
    /// longer lists the job.
    fn job_detail(&self, job_id: u64) -> Result<Option<String>, SlurmError> {
        Err(SlurmError::Failed {
            cmd: format!("scontrol show job -d {job_id}"),
            status: "unsupported".into(),
            stderr: "this Slurm client cannot read a job's record".into(),
        })
    }
    /// Sets a running job's `AdminComment` (`scontrol update JobId=J
    /// AdminComment=TEXT`); Slurm refuses it once the job has finished.
    fn set_admin_comment(&self, job_id: u64, text: &str) -> Result<(), SlurmError> {
        Err(SlurmError::Failed {
            cmd: format!("scontrol update JobId={job_id} AdminComment={text}"),
            status: "unsupported".into(),
            stderr: "this Slurm client cannot update jobs".into(),
        })
    }
}

/// The `JobState=` of `scontrol show job` output (with its flags, e.g.
/// `JobState=RUNNING Reason=None`; later versions may join several with
/// `,`), `None` when there is none.
pub fn parse_job_state(text: &str) -> Option<(JobState, String)> {
    let raw = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("JobState="))?;
    let states: Vec<String> = raw.split(',').map(str::to_ascii_uppercase).collect();
    Some((JobState::of(&states), raw.to_string()))
}

/// A job's state strings: 22.05 prints a string, later versions an array.
fn job_states(job: &Value) -> Vec<String> {
    match job.get("job_state") {
        Some(Value::String(s)) => vec![s.to_ascii_uppercase()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_ascii_uppercase))
            .collect(),
        _ => Vec::new(),
    }
}

/// `K` of a TRES string such as `gres:shard:3`, `gres/shard:3` or
/// `gres:gpu:1,gres:shard:2` (0 if none).
pub fn shard_count(tres: &str) -> u8 {
    tres.split(',')
        .filter_map(|part| {
            let part = part.trim().replace('/', ":");
            let rest = part.strip_prefix("gres:shard")?;
            let n = rest.rsplit(':').next()?;
            if rest.is_empty() {
                return Some(1);
            }
            n.parse::<u8>().ok()
        })
        .max()
        .unwrap_or(0)
}

/// The MIG profile of a typed GPU request in a TRES string:
/// `gres:gpu:3g.20gb:1`, `gres/gpu:3g.20gb=1` or `gres:gpu:1g.5gb` give
/// `1g.5gb`-style names; untyped (`gres:gpu:1`) and non-MIG types
/// (`gres:gpu:a100:1`) give `None`.
pub fn mig_type(tres: &str) -> Option<String> {
    tres.split(',').find_map(|part| {
        let part = part.trim().replace(['/', '='], ":");
        let rest = part.strip_prefix("gres:gpu:")?;
        let ty = rest.split(':').next()?;
        crate::mig::profile_size(ty).map(|_| ty.to_string())
    })
}

/// The GPU index of a `gres_detail` entry such as `shard:3(IDX:0)` or
/// `gpu:1(IDX:1),shard:2(IDX:1)`.
fn gres_gpu(detail: &Value) -> Option<u32> {
    let entries: Vec<&str> = match detail {
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        Value::String(s) => vec![s.as_str()],
        _ => return None,
    };
    entries.iter().find_map(|e| {
        let at = e.find("shard")?;
        let rest = &e[at..];
        let idx = rest.split("IDX:").nth(1)?;
        let digits: String = idx.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    })
}

/// `(array_job_id, array_task_id)` when both are set (22.05 prints 0 and
/// null, or NO_VAL, for jobs that are not array tasks).
fn array_task(job: &Value) -> Option<(u64, u64)> {
    let array = job.get("array_job_id").and_then(Value::as_u64)?;
    let task = job.get("array_task_id").and_then(Value::as_u64)?;
    (array > 0 && task < u64::from(u32::MAX - 1)).then_some((array, task))
}

/// A Unix time field: 0 and absent mean "not set".
fn time_field(job: &Value, key: &str) -> u64 {
    job.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Parses `squeue --json` (22.05's v0.0.38 layout; later versions' arrays
/// for `job_state` are accepted too). Jobs without a numeric `job_id` are
/// skipped; a missing `jobs` array is an error.
pub fn parse_queue(json: &Value) -> Result<QueueSnapshot, ParseError> {
    let jobs = json
        .get("jobs")
        .and_then(Value::as_array)
        .ok_or(ParseError::MissingArray("jobs"))?;
    let jobs = jobs
        .iter()
        .filter_map(|j| {
            let job_id = j.get("job_id").and_then(Value::as_u64)?;
            let shards = ["tres_per_node", "tres_per_job", "tres_per_task"]
                .iter()
                .filter_map(|k| j.get(*k).and_then(Value::as_str))
                .map(shard_count)
                .max()
                .unwrap_or(0);
            // Minutes; absent/null is unlimited (22.05 prints null for
            // INFINITE), as are Slurm's NO_VAL/INFINITE sentinels.
            let time_limit_s = j
                .get("time_limit")
                .and_then(Value::as_u64)
                .filter(|&m| m > 0 && m < u64::from(u32::MAX - 1))
                .map(|m| m * 60);
            let deadline = Some(time_field(j, "deadline")).filter(|&d| d > 0);
            Some(QueuedJob {
                job_id,
                state: JobState::of(&job_states(j)),
                shards,
                gpu: j.get("gres_detail").and_then(gres_gpu),
                nodes: j
                    .get("nodes")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                time_limit_s,
                start_time: time_field(j, "start_time"),
                end_time: time_field(j, "end_time"),
                deadline,
                submit_time: time_field(j, "submit_time"),
                array_task: array_task(j),
                account: j
                    .get("account")
                    .and_then(Value::as_str)
                    .filter(|a| !a.is_empty())
                    .map(String::from),
                admin_comment: j
                    .get("admin_comment")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                mig_profile: ["tres_per_node", "tres_per_job", "tres_per_task"]
                    .iter()
                    .filter_map(|k| j.get(*k).and_then(Value::as_str))
                    .find_map(mig_type),
                partition: j
                    .get("partition")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                name: j
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                restarts: j
                    .get("restart_cnt")
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
            })
        })
        .collect();
    Ok(QueueSnapshot { jobs })
}

fn split_features(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    }
}

/// Parses `sinfo --json`: the features, drain flag and reason of `node`.
pub fn parse_node(json: &Value, node: &str) -> Result<NodeInfo, ParseError> {
    parse_nodes(json)?
        .into_iter()
        .find(|n| n.name == node)
        .map(|n| n.info)
        .ok_or_else(|| ParseError::NodeNotListed(node.to_string()))
}

/// One node of `sinfo --json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedNode {
    pub name: String,
    pub info: NodeInfo,
    /// Its GRES (`gres`, e.g. `gpu:2,shard:14`) name shards (a smartmig
    /// node, docs/slurm-integration.md §1) or typed MIG devices
    /// (`gpu:3g.20gb:2`: a static MIG node, which smartmigd may watch in
    /// advise mode).
    pub mig_node: bool,
    /// Its partitions (`partitions`).
    pub partitions: Vec<String>,
    /// Shards per GPU (shard count / untyped gpu count; 0: unknown).
    pub shards_per_gpu: u8,
    /// MIG profiles of its typed gpu GRES (`gpu:3g.20gb:2` gives `3g.20gb`).
    pub mig_types: Vec<String>,
}

/// What a node's `gres` string (`gpu:2,shard:14`, `gpu:3g.20gb:2(S:0)`)
/// says: shards per GPU (0 when it cannot tell) and its MIG device types.
pub fn gres_capacity(gres: &str) -> (u8, Vec<String>) {
    let (mut gpus, mut shards, mut types) = (0u32, 0u32, Vec::new());
    for part in gres.split(',') {
        let part = part.split('(').next().unwrap_or("").trim();
        let fields: Vec<&str> = part.split(':').collect();
        let count = fields
            .last()
            .and_then(|c| c.parse::<u32>().ok())
            .unwrap_or(1);
        match fields.first().copied() {
            Some("shard") => shards += count,
            Some("gpu") => {
                if let Some(t) = mig_type(&format!("gres:{part}")) {
                    types.push(t);
                } else {
                    gpus += count;
                }
            }
            _ => {}
        }
    }
    let per_gpu = shards
        .checked_div(gpus)
        .map_or(0, |n| n.min(u32::from(u8::MAX)) as u8);
    (per_gpu, types)
}

/// Parses every node of `sinfo --json` (a node listed in several
/// partitions once).
pub fn parse_nodes(json: &Value) -> Result<Vec<ListedNode>, ParseError> {
    let nodes = json
        .get("nodes")
        .and_then(Value::as_array)
        .ok_or(ParseError::MissingArray("nodes"))?;
    let mut out: Vec<ListedNode> = Vec::new();
    let mut seen = HashSet::new();
    for n in nodes {
        let Some(name) = n.get("name").and_then(Value::as_str) else {
            continue;
        };
        if !seen.insert(name) {
            continue;
        }
        let drain = split_features(n.get("state_flags"))
            .iter()
            .chain(split_features(n.get("state")).iter())
            .any(|f| f.to_ascii_uppercase().starts_with("DRAIN"));
        let gres = n.get("gres").and_then(Value::as_str).unwrap_or("");
        let (shards_per_gpu, mig_types) = gres_capacity(gres);
        out.push(ListedNode {
            name: name.to_string(),
            info: NodeInfo {
                features: NodeFeatures {
                    available: split_features(n.get("features")),
                    active: split_features(n.get("active_features")),
                },
                drain,
                reason: n
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            },
            mig_node: gres.contains("shard") || !mig_types.is_empty(),
            partitions: split_features(n.get("partitions")),
            shards_per_gpu,
            mig_types,
        });
    }
    Ok(out)
}

/// Whether Slurm's host list `nodes` (`gpu01`, `gpu[01-03,07]`,
/// `a,b[1-2]`) names `node`: top-level commas split names, and one bracket
/// group of numbers and ranges per name is expanded (zero padding kept).
pub fn names_node(nodes: &str, node: &str) -> bool {
    let mut depth = 0;
    let mut items = Vec::new();
    let mut from = 0;
    for (i, c) in nodes.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&nodes[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    items.push(&nodes[from..]);
    items.into_iter().any(|item| {
        let Some((prefix, rest)) = item.split_once('[') else {
            return item == node;
        };
        let Some((ranges, suffix)) = rest.split_once(']') else {
            return false;
        };
        let Some(middle) = node
            .strip_prefix(prefix)
            .and_then(|n| n.strip_suffix(suffix))
        else {
            return false;
        };
        ranges.split(',').any(|r| {
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            let width = lo.len();
            let (Ok(lo), Ok(hi), Ok(n)) =
                (lo.parse::<u64>(), hi.parse::<u64>(), middle.parse::<u64>())
            else {
                return false;
            };
            (lo..=hi).contains(&n)
                && (middle.len() == width || width == 1 && !middle.starts_with('0'))
        })
    })
}

/// The node features that publish a layout: one per GPU, `smartmig_gpu<i>_<sizes>`
/// (e.g. `smartmig_gpu0_4g_2g_1g`), characters Slurm accepts in feature names.
pub fn layout_features(layouts: &[(u32, Vec<u8>)]) -> Vec<String> {
    layouts
        .iter()
        .map(|(gpu, sizes)| {
            if sizes.is_empty() {
                format!("smartmig_gpu{gpu}_empty")
            } else {
                let s: Vec<String> = sizes.iter().map(|c| format!("{c}g")).collect();
                format!("smartmig_gpu{gpu}_{}", s.join("_"))
            }
        })
        .collect()
}

/// The admin's features with ours replaced by `ours`.
pub fn merge_features(current: &NodeFeatures, ours: &[String]) -> NodeFeatures {
    let keep = |list: &[String]| -> Vec<String> {
        let mut v: Vec<String> = list
            .iter()
            .filter(|f| !f.starts_with("smartmig_"))
            .cloned()
            .collect();
        v.extend(ours.iter().cloned());
        v
    };
    NodeFeatures {
        available: keep(&current.available),
        active: keep(&current.active),
    }
}

/// The real client: runs the Slurm commands with a time limit.
pub struct CommandSlurm {
    pub squeue: String,
    pub sinfo: String,
    pub scontrol: String,
    pub slurmd: String,
    pub salloc: String,
    pub scancel: String,
    pub timeout: Duration,
}

impl CommandSlurm {
    /// Runs `program args` and returns its stdout. Both pipes are drained
    /// by threads while the child runs: a child whose output outgrows the
    /// pipe buffer (64 KiB; `squeue --json` with ~20 jobs) would otherwise
    /// block forever and only the timeout would end it.
    fn run(&self, program: &str, args: &[&str]) -> Result<String, SlurmError> {
        self.run_both(program, args).map(|(out, _)| out)
    }

    /// Like [`CommandSlurm::run`], returning stdout and stderr (slurmd
    /// prints what it parsed as log lines on stderr).
    fn run_both(&self, program: &str, args: &[&str]) -> Result<(String, String), SlurmError> {
        let (cmd, mut child) = spawn(program, args, Stdio::piped())?;
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut p) = pipe {
                    let _ = p.read_to_end(&mut buf);
                }
                buf
            })
        };
        let stdout = drain(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let stderr = drain(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if start.elapsed() > self.timeout => {
                    // Killing the child closes its pipes, so the readers end.
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = (stdout.join(), stderr.join());
                    return Err(SlurmError::Timeout {
                        cmd,
                        secs: self.timeout.as_secs(),
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(source) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(SlurmError::Spawn { cmd, source });
                }
            }
        };
        // A grandchild holding the pipes open would keep a reader blocked;
        // squeue/sinfo/scontrol start none.
        let out = stdout.join().unwrap_or_default();
        let err = stderr.join().unwrap_or_default();
        if !status.success() {
            return Err(SlurmError::Failed {
                cmd,
                status: status.to_string(),
                stderr: String::from_utf8_lossy(&err).trim().to_string(),
            });
        }
        Ok((
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        ))
    }

    fn json(&self, program: &str, args: &[&str]) -> Result<Value, SlurmError> {
        let text = self.run(program, args)?;
        serde_json::from_str(&text).map_err(|source| SlurmError::Json {
            cmd: program.to_string(),
            source,
        })
    }
}

impl SlurmClient for CommandSlurm {
    fn queue(&self) -> Result<QueueSnapshot, SlurmError> {
        let v = self.json(&self.squeue, &["--json"])?;
        parse_queue(&v).map_err(|source| SlurmError::Parse {
            cmd: self.squeue.clone(),
            source,
        })
    }

    fn node(&self, node: &str) -> Result<NodeInfo, SlurmError> {
        let v = self.json(&self.sinfo, &["--json"])?;
        parse_node(&v, node).map_err(|source| SlurmError::Parse {
            cmd: self.sinfo.clone(),
            source,
        })
    }

    fn nodes(&self) -> Result<Vec<ListedNode>, SlurmError> {
        let v = self.json(&self.sinfo, &["--json"])?;
        parse_nodes(&v).map_err(|source| SlurmError::Parse {
            cmd: self.sinfo.clone(),
            source,
        })
    }

    fn set_node_features(&self, node: &str, f: &NodeFeatures) -> Result<(), SlurmError> {
        let node_arg = format!("nodename={node}");
        let avail = format!("AvailableFeatures={}", f.available.join(","));
        let active = format!("ActiveFeatures={}", f.active.join(","));
        self.run(&self.scontrol, &["update", &node_arg, &avail, &active])
            .map(|_| ())
    }

    fn requeue(&self, job: &str) -> Result<(), SlurmError> {
        self.run(&self.scontrol, &["requeue", job]).map(|_| ())
    }

    fn job_comment(&self, job_id: u64) -> Result<Option<JobComment>, SlurmError> {
        let id = job_id.to_string();
        match self.run(&self.scontrol, &["show", "job", &id]) {
            Ok(text) => Ok(parse_job_comment(&text)),
            Err(SlurmError::Failed { stderr, .. }) if stderr.contains("Invalid job id") => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn hold(&self, name: &str, node: &str, gres_type: &str, shards: u8) -> Result<u64, SlurmError> {
        let gres = format!("--gres=shard:{gres_type}:{shards}");
        let args = [
            "--no-shell",
            "-J",
            name,
            "-w",
            node,
            &gres,
            "--priority=TOP",
            "-n1",
            "--mem=1M",
        ];
        queue_allocation(&self.salloc, &args, self.timeout)
    }

    fn cancel(&self, job_id: u64) -> Result<(), SlurmError> {
        self.run(&self.scancel, &[&job_id.to_string()]).map(|_| ())
    }

    fn job_detail(&self, job_id: u64) -> Result<Option<String>, SlurmError> {
        let id = job_id.to_string();
        match self.run(&self.scontrol, &["show", "job", "-d", &id]) {
            Ok(text) => Ok(Some(text)),
            Err(SlurmError::Failed { stderr, .. }) if stderr.contains("Invalid job id") => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn set_admin_comment(&self, job_id: u64, text: &str) -> Result<(), SlurmError> {
        let job = format!("JobId={job_id}");
        let comment = format!("AdminComment={text}");
        self.run(&self.scontrol, &["update", &job, &comment])
            .map(|_| ())
    }

    fn gres_gpus(&self, node: &str) -> Result<Vec<GresGpu>, SlurmError> {
        let (out, err) = self.run_both(&self.slurmd, &["-G", "-N", node])?;
        Ok(parse_gres_gpus(&format!("{out}\n{err}")))
    }

    fn set_job_shards(&self, job_id: u64, shards: u8) -> Result<(), SlurmError> {
        let job = format!("JobId={job_id}");
        let gres = format!("Gres=shard:{shards}");
        self.run(&self.scontrol, &["update", &job, &gres])
            .map(|_| ())
    }

    fn resume(&self, node: &str) -> Result<(), SlurmError> {
        let node_arg = format!("NodeName={node}");
        self.run(&self.scontrol, &["update", &node_arg, "State=RESUME"])
            .map(|_| ())
    }
}

/// Starts `program args` with no stdin, `stdout` and a piped stderr;
/// returns the command line (for errors) and the child.
fn spawn(
    program: &str,
    args: &[&str],
    stdout: Stdio,
) -> Result<(String, std::process::Child), SlurmError> {
    let cmd = format!("{program} {}", args.join(" "));
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| SlurmError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    Ok((cmd, child))
}

/// Runs `salloc ARGS` and returns the job id from its first `job
/// allocation N` line on stderr (`Pending ...` or `Granted ...`). salloc
/// then keeps waiting for the grant (or exits at once when granted): a
/// thread drains its stderr and reaps it.
fn queue_allocation(program: &str, args: &[&str], timeout: Duration) -> Result<u64, SlurmError> {
    use std::io::BufRead;
    let (cmd, mut child) = spawn(program, args, Stdio::null())?;
    let stderr = child.stderr.take();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = String::new();
        let mut sent = false;
        if let Some(pipe) = stderr {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(id) = allocation_id(&line) {
                        sent = tx.send(Ok(id)).is_ok();
                    } else {
                        seen.push_str(&line);
                        seen.push('\n');
                    }
                }
            }
        }
        let status = child.wait();
        if !sent {
            let _ = tx.send(Err((
                status.map(|s| s.to_string()).unwrap_or_default(),
                seen,
            )));
        }
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(id)) => Ok(id),
        Ok(Err((status, stderr))) => Err(SlurmError::Failed {
            cmd,
            status,
            stderr: stderr.trim().to_string(),
        }),
        Err(_) => Err(SlurmError::Timeout {
            cmd,
            secs: timeout.as_secs(),
        }),
    }
}

/// `N` of salloc's `salloc: Pending job allocation N` / `Granted job
/// allocation N`.
fn allocation_id(line: &str) -> Option<u64> {
    line.split("job allocation ").nth(1)?.trim().parse().ok()
}

/// For nodes and tests without Slurm: every journaled job counts as live,
/// nothing is pending, features are not published.
pub struct NoSlurm;

impl SlurmClient for NoSlurm {
    fn queue(&self) -> Result<QueueSnapshot, SlurmError> {
        Err(SlurmError::Failed {
            cmd: "squeue".into(),
            status: "disabled".into(),
            stderr: "Slurm queries are disabled (slurm.enabled = false)".into(),
        })
    }
    fn node(&self, _node: &str) -> Result<NodeInfo, SlurmError> {
        Ok(NodeInfo::default())
    }
    fn resume(&self, _node: &str) -> Result<(), SlurmError> {
        Ok(())
    }
    fn set_node_features(&self, _node: &str, _f: &NodeFeatures) -> Result<(), SlurmError> {
        Ok(())
    }
    fn requeue(&self, job: &str) -> Result<(), SlurmError> {
        Err(SlurmError::Failed {
            cmd: format!("scontrol requeue {job}"),
            status: "disabled".into(),
            stderr: "Slurm queries are disabled (slurm.enabled = false)".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scontrol_show_job_gives_account_and_admin_comment() {
        let text = "JobId=12 JobName=wrap\n   UserId=root(0) GroupId=root(0) MCS_label=N/A\n   \
            Priority=4294901748 Nice=0 Account=physics QOS=normal\n   JobState=RUNNING Reason=None\n   \
            WorkDir=/tmp\n   AdminComment=site=abc ticket=7 \n   StdErr=/tmp/slurm-12.out\n";
        let c = parse_job_comment(text).unwrap();
        assert_eq!(c.account.as_deref(), Some("physics"));
        assert_eq!(c.admin_comment, "site=abc ticket=7");
        let bare =
            "JobId=13 JobName=x\n   Priority=1 Nice=0 Account=(null) QOS=normal\n   WorkDir=/\n";
        assert_eq!(parse_job_comment(bare), Some(JobComment::default()));
        assert_eq!(
            parse_job_comment("slurm_load_jobs error: Invalid job id specified"),
            None
        );
    }

    #[test]
    fn salloc_lines_give_the_job_id_and_holds_their_gpu() {
        assert_eq!(allocation_id("salloc: Pending job allocation 42"), Some(42));
        assert_eq!(allocation_id("salloc: Granted job allocation 7"), Some(7));
        assert_eq!(
            allocation_id("salloc: job 42 queued and waiting for resources"),
            None
        );
        let hold = QueuedJob {
            name: "smartmig-hold.vm.1".into(),
            ..QueuedJob::new(3, JobState::Pending)
        };
        assert_eq!(hold.hold_of(), Some(("vm", 1)));
        let job = QueuedJob {
            name: "smartmig-hold-ish".into(),
            ..QueuedJob::new(4, JobState::Pending)
        };
        assert_eq!(job.hold_of(), None);
    }

    #[test]
    fn scontrol_show_job_gives_the_state() {
        let text = "JobId=12 JobName=wrap\n   JobState=RUNNING Reason=None Dependency=(null)\n";
        let (state, raw) = parse_job_state(text).unwrap();
        assert_eq!((state, raw.as_str()), (JobState::Running, "RUNNING"));
        assert!(state.may_run());
        let (state, _) = parse_job_state("   JobState=COMPLETING Reason=x").unwrap();
        assert!(state.may_run());
        let (state, _) = parse_job_state("   JobState=CANCELLED Reason=x").unwrap();
        assert!(!state.may_run());
        assert!(!JobState::Pending.may_run());
        assert_eq!(parse_job_state("JobId=3 JobName=x"), None);
    }

    #[test]
    fn gres_strings_give_shards_per_gpu_and_mig_types() {
        assert_eq!(gres_capacity("gpu:2,shard:14"), (7, vec![]));
        assert_eq!(
            gres_capacity("gpu:a30:2(S:0-1),shard:8(S:0-1)"),
            (4, vec![])
        );
        assert_eq!(
            gres_capacity("gpu:3g.20gb:2,gpu:4g.20gb:2"),
            (0, vec!["3g.20gb".to_string(), "4g.20gb".to_string()])
        );
        assert_eq!(gres_capacity(""), (0, vec![]));
    }

    #[test]
    fn host_lists_name_the_node() {
        assert!(names_node("gpu01", "gpu01"));
        assert!(!names_node("gpu01", "gpu1"));
        assert!(names_node("gpu[01-03,07]", "gpu02"));
        assert!(names_node("gpu[01-03,07]", "gpu07"));
        assert!(!names_node("gpu[01-03,07]", "gpu05"));
        assert!(!names_node("gpu[01-03]", "gpu2"));
        assert!(names_node("a,b[1-12]", "b10"));
        assert!(names_node("x[1-2]-ib,node9", "x2-ib"));
        assert!(!names_node("", "node"));
        assert!(!names_node("gpu[01-", "gpu01"));
    }

    #[test]
    fn typed_mig_requests_from_tres_strings() {
        assert_eq!(mig_type("gres:gpu:3g.20gb:1").as_deref(), Some("3g.20gb"));
        assert_eq!(mig_type("gres/gpu:1g.5gb=2").as_deref(), Some("1g.5gb"));
        assert_eq!(
            mig_type("cpu=1,gres:gpu:1g.10gb").as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(
            mig_type("gres:gpu:1g.5gb+me:1").as_deref(),
            Some("1g.5gb+me")
        );
        assert_eq!(mig_type("gres:gpu:1"), None);
        assert_eq!(mig_type("gres:gpu:a100:1"), None);
        assert_eq!(mig_type("gres:shard:3"), None);
    }

    #[test]
    fn shard_counts_from_tres_strings() {
        assert_eq!(shard_count("gres:shard:3"), 3);
        assert_eq!(shard_count("gres/shard:2"), 2);
        assert_eq!(shard_count("gres:gpu:1,gres:shard:7"), 7);
        assert_eq!(shard_count("gres:shard"), 1);
        assert_eq!(shard_count("gres:gpu:1"), 0);
        assert_eq!(shard_count(""), 0);
    }

    #[test]
    fn squeue_json_both_state_formats() {
        let v = json!({"jobs": [
            {"job_id": 1, "job_state": "RUNNING", "tres_per_node": "gres:shard:3",
             "gres_detail": ["shard:3(IDX:1)"], "time_limit": 5, "start_time": 100,
             "end_time": 400, "nodes": "n1"},
            {"job_id": 2, "job_state": "PENDING", "tres_per_node": "gres:shard:2",
             "deadline": 9000, "time_limit": null},
            {"job_id": 3, "job_state": ["PENDING"], "tres_per_job": "gres/shard:4"},
            {"job_id": 4, "job_state": "COMPLETED"},
            {"job_id": 5, "job_state": "PENDING"},
            {"job_id": 6, "job_state": ["FAILED", "COMPLETING"]},
            {"job_id": 7, "job_state": "CANCELLED", "array_job_id": 5, "array_task_id": 2},
            {"job_state": "RUNNING"}
        ]});
        let q = parse_queue(&v).unwrap();
        assert_eq!(q.jobs.len(), 7, "the job without an id is skipped");
        assert_eq!(q.live(), HashSet::from([1, 2, 3, 5, 6]));
        let pending: Vec<(u64, u8)> = q.pending_shards().map(|j| (j.job_id, j.shards)).collect();
        assert_eq!(pending, vec![(2, 2), (3, 4)]);
        let one = q.job(1).unwrap();
        assert_eq!(one.gpu, Some(1));
        assert_eq!(one.time_limit_s, Some(300));
        assert_eq!((one.start_time, one.end_time), (100, 400));
        assert_eq!(q.job(2).unwrap().deadline, Some(9000));
        assert_eq!(q.job(2).unwrap().time_limit_s, None);
        assert_eq!(q.job(6).unwrap().state, JobState::Completing);
        assert_eq!(q.job(7).unwrap().state, JobState::Cancelled);
        assert_eq!(q.job(7).unwrap().slurm_id(), "5_2");
        assert_eq!(q.job(1).unwrap().slurm_id(), "1");
        let e = parse_queue(&json!({})).err();
        assert_eq!(e, Some(ParseError::MissingArray("jobs")));
        assert_eq!(e.map(|e| e.to_string()).as_deref(), Some("no `jobs` array"));
    }

    #[test]
    fn only_our_drains_are_ours_to_undo() {
        let v = json!({"nodes": [
            {"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "reason": "smartmig: sidecar unreachable"},
            {"name": "n2", "state": "idle", "state_flags": ["DRAIN"], "reason": "bad DIMM"},
            {"name": "n3", "state": "mixed", "state_flags": [], "reason": ""}
        ]});
        assert!(parse_node(&v, "n1").unwrap().drained_by_smartmig());
        let n2 = parse_node(&v, "n2").unwrap();
        assert!(n2.drain && !n2.drained_by_smartmig());
        assert!(!parse_node(&v, "n3").unwrap().drain);
    }

    #[test]
    fn gpu_order_is_checked_against_slurmd() {
        let text = "slurmd: Gres Name=shard Type=(null) Count=7 Index=0 ID=1 File=/d/nvidia1 (null)\n\
                    slurmd: Gres Name=gpu Type=(null) Count=1 Index=0 ID=7 File=/d/nvidia1 (null)\n\
                    slurmd: Gres Name=gpu Type=(null) Count=1 Index=1 ID=7 File=/d/nvidia0 (null)\n";
        let gres = parse_gres_gpus(text);
        assert_eq!(
            gres,
            vec![
                GresGpu {
                    index: 0,
                    file: "/d/nvidia1".into(),
                    mig_type: None,
                },
                GresGpu {
                    index: 1,
                    file: "/d/nvidia0".into(),
                    mig_type: None,
                }
            ]
        );
        // A static MIG setup's device names its profile.
        let typed = parse_gres_gpus(
            "slurmd: Gres Name=gpu Type=3g.20gb Count=1 Index=0 ID=7 File=/d/nvidia-mig0 (null)\n",
        );
        assert_eq!(typed[0].mig_type.as_deref(), Some("3g.20gb"));
        let minor = |f: &str| f.strip_prefix("/d/nvidia")?.parse().ok();
        let swapped = gpu_order_mismatches(&[(0, Some(0)), (1, Some(1))], &gres, minor);
        assert_eq!(swapped.len(), 2, "{swapped:?}");
        assert!(swapped[0]
            .contains("Slurm's GPU 0 is /d/nvidia1 (minor 1), which is smartmigd's GPU 1"));
        assert!(gpu_order_mismatches(&[(0, Some(1)), (1, Some(0))], &gres, minor).is_empty());
        assert!(gpu_order_mismatches(&[(0, None), (1, None)], &gres, minor).is_empty());
        let missing = gpu_order_mismatches(&[(0, Some(1))], &gres, minor);
        assert!(missing[0].contains("does not exist here"), "{missing:?}");
    }

    #[test]
    fn gres_detail_names_the_gpu() {
        assert_eq!(gres_gpu(&json!(["gpu:1(IDX:1),shard:2(IDX:1)"])), Some(1));
        assert_eq!(gres_gpu(&json!("shard:7(IDX:0)")), Some(0));
        assert_eq!(gres_gpu(&json!(["gpu:1(IDX:0)"])), None);
        assert_eq!(gres_gpu(&json!([])), None);
    }

    /// A child that prints far more than a pipe holds is read while it
    /// runs: before the fix this ended in the timeout.
    #[test]
    fn large_outputs_do_not_block_the_child() {
        let slurm = CommandSlurm {
            squeue: "sh".into(),
            sinfo: "sh".into(),
            scontrol: "sh".into(),
            slurmd: "sh".into(),
            salloc: "sh".into(),
            scancel: "sh".into(),
            timeout: Duration::from_secs(20),
        };
        let out = slurm
            .run(
                "sh",
                &["-c", "head -c 2000000 /dev/zero | tr '\\0' x; echo err >&2"],
            )
            .unwrap();
        assert_eq!(out.len(), 2_000_000);
        let e = slurm
            .run("sh", &["-c", "echo oops >&2; exit 3"])
            .unwrap_err();
        assert!(e.to_string().contains("oops"), "{e}");
        let slow = CommandSlurm {
            timeout: Duration::from_millis(300),
            ..slurm
        };
        let e = slow.run("sleep", &["5"]).unwrap_err();
        assert!(matches!(e, SlurmError::Timeout { .. }), "{e}");
    }

    #[test]
    fn features_keep_the_admins() {
        let v = json!({"nodes": [{"name": "n1", "features": "ib,fast,smartmig_gpu0_7g", "active_features": "ib,smartmig_gpu0_7g"}]});
        let f = parse_node(&v, "n1").unwrap().features;
        let ours = layout_features(&[(0, vec![4, 2, 1]), (1, vec![])]);
        assert_eq!(ours, vec!["smartmig_gpu0_4g_2g_1g", "smartmig_gpu1_empty"]);
        let m = merge_features(&f, &ours);
        assert_eq!(
            m.available,
            vec![
                "ib",
                "fast",
                "smartmig_gpu0_4g_2g_1g",
                "smartmig_gpu1_empty"
            ]
        );
        assert_eq!(
            m.active,
            vec!["ib", "smartmig_gpu0_4g_2g_1g", "smartmig_gpu1_empty"]
        );
        let e = parse_node(&v, "n2").err();
        assert_eq!(e, Some(ParseError::NodeNotListed("n2".into())));
        assert_eq!(
            e.map(|e| e.to_string()).as_deref(),
            Some("node n2 not listed")
        );
        assert_eq!(
            parse_node(&json!({}), "n1").err(),
            Some(ParseError::MissingArray("nodes"))
        );
    }
}
