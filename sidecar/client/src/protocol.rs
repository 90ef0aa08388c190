//! The wire protocol between smartmigd and its clients (the SPANK plugin,
//! `smartmig status`): newline-delimited JSON over a Unix socket.
//!
//! Pure serde types and the one request parser, so the daemon, the client
//! and the tests agree on every byte. Every message carries `"v": 1`; a
//! daemon refuses other versions with `unsupported_version` instead of
//! guessing, so an old plugin against a new daemon fails loudly.
//! `docs/protocol.md` documents the messages with examples.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use smartmig_mig::GpuModel;

/// Slurm's step id of a batch script (`SLURM_BATCH_SCRIPT`): the one step
/// the plugin requeues rather than fails when it gets no instance.
pub const BATCH_STEP: u32 = 0xFFFF_FFFB;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// Default upper bound of one request line (bytes, newline excluded).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Default socket path (systemd's `RuntimeDirectory=smartmig`).
pub const DEFAULT_SOCKET: &str = "/run/smartmig/smartmig.sock";
/// smartmigd's root-only socket (mode 0600), the SPANK plugin's default:
/// no user can crowd it with connections.
pub const DEFAULT_ADMIN_SOCKET: &str = "/run/smartmig/smartmig-root.sock";

/// Every `op` a daemon of this build answers ([`Request::op`]).
pub const OPS: [&str; 7] = [
    "allocate",
    "release",
    "status",
    "health",
    "reconcile",
    "plan",
    "apply",
];

/// A request, keyed by `op`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Give job `job_id` an instance of K slices on GPU `gpu`.
    Allocate(AllocateRequest),
    /// Return every instance held by `job_id` (idempotent).
    Release(ReleaseRequest),
    /// The node's GPUs, instances and assignments (anyone may ask).
    Status,
    /// Liveness probe (anyone may ask).
    Health,
    /// Read Slurm's queue now and release the instances of jobs that
    /// ended without a release (the admin's `smartmig reconcile`).
    Reconcile,
    /// The reconfigurations the policy wants and has made (anyone may ask).
    Plan,
    /// Carry out a pending plan (`mode = "confirm"`; root and slurm_user).
    Apply(ApplyRequest),
}

impl Request {
    /// The `op` string, for logs and metrics.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Allocate(_) => "allocate",
            Request::Release(_) => "release",
            Request::Status => "status",
            Request::Health => "health",
            Request::Reconcile => "reconcile",
            Request::Plan => "plan",
            Request::Apply(_) => "apply",
        }
    }

    /// Whether the op changes state (only root and the Slurm user may).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Request::Allocate(_) | Request::Release(_) | Request::Reconcile | Request::Apply(_)
        )
    }

    /// The request as one JSON line (with `v`), newline included.
    pub fn to_line(&self) -> String {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert("v".into(), Value::from(PROTOCOL_VERSION));
        }
        let mut line = value.to_string();
        line.push('\n');
        line
    }
}

/// `allocate`: K compute slices (and optionally M GB) on one GPU for a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocateRequest {
    /// Slurm job id; a second allocate for the same job returns the same instance.
    pub job_id: u64,
    /// Slurm step id (all steps of a job share the instance; a step that
    /// is not [`BATCH_STEP`] cannot be requeued, so its `no_fit` says what
    /// to do instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// The job owner's uid (recorded in the journal and status).
    pub uid: u32,
    /// GPU index on this node (Slurm's `CUDA_VISIBLE_DEVICES` for the shards).
    pub gpu: u32,
    /// Compute slices K (Slurm's shard count).
    pub slices: u8,
    /// GPU memory need in GB (`--mig-mem`); absent means "any".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<f64>,
    /// The job's deadline (unix seconds), for the repartitioning policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<i64>,
    /// The job's time limit in seconds, for the repartitioning policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_s: Option<u64>,
    /// Slurm job name (`SLURM_JOB_NAME`): with the uid, the key of the
    /// learned memory estimates. Optional (v1 clients omit it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// Whether the plugin gives jobs an out-of-memory marker (its
    /// `oom_requeue=`), so status can say whether OOM restarts can happen
    /// at all. Optional (older plugins omit it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_marker: Option<bool>,
    /// The exact MIG profile the job asked for (`--mig-profile`, e.g.
    /// `3g.20gb`): smartmigd resolves it on the GPU's model, refuses it
    /// (`invalid_request`) when that model has no such profile or its
    /// compute slices differ from `slices`, and then hands out exactly that
    /// profile (`memory_gb` is ignored). Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// `apply`: carry out pending plan `plan`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyRequest {
    pub plan: u64,
}

/// A reconfiguration of one GPU the policy wants (pending, in `confirm`
/// mode) or made (applied). Layouts are drawn as in the logs
/// (`4444333` style pictures); instances as `profile@start`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStatus {
    pub id: u64,
    pub gpu: u32,
    pub from: String,
    pub to: String,
    /// Idle instances it destroys.
    pub destroy: Vec<String>,
    pub create: Vec<String>,
    /// Busy instances it keeps (with their job), which is why it is safe.
    pub keeps_busy: Vec<String>,
    /// Unix seconds the policy first wanted it.
    pub created_at: u64,
    /// Pending: when it lapses unless applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// Applied: when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<u64>,
    /// What a short simulation of the node's queue expects of it (absent
    /// when nothing waits, or from daemons that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<PlanEffect>,
}

/// A plan's expected effect: the node's waiting jobs (its share on a
/// cluster) and running jobs simulated until the queue drains, with every
/// layout held as it is (`keep`) and with the plan applied (`plan`);
/// instances of exactly the requested size, run times from time limits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanEffect {
    /// Waiting jobs simulated (the oldest, at most 200).
    pub waiting: u32,
    pub running: u32,
    /// Mean wait of the waiting jobs from now, s.
    pub wait_keep_s: u64,
    pub wait_plan_s: u64,
    /// Energy of the node's GPUs until the queue drains, kJ.
    pub energy_keep_kj: u64,
    pub energy_plan_kj: u64,
    /// Waiting jobs that would miss their deadline.
    pub late_keep: u32,
    pub late_plan: u32,
    /// Waiting jobs no instance of the held layouts fits (served only by
    /// an on-demand reshape at allocate).
    pub unfit_keep: u32,
    pub unfit_plan: u32,
}

/// The `plan` reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanReply {
    /// `dynamic` (the policy's targets are applied each epoch) or
    /// `confirm` (they wait for `apply`).
    pub mode: String,
    pub policy: String,
    /// Seconds a pending plan waits for `apply`.
    pub plan_timeout_s: u64,
    pub pending: Vec<PlanStatus>,
    /// The last reconfigurations made, newest last (bounded).
    pub applied: Vec<PlanStatus>,
}

/// `release`: the job ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    pub job_id: u64,
    /// The job ended with an out-of-memory failure (the plugin found the
    /// job's OOM marker). Optional, default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom: bool,
    /// Peak GPU memory the job used, GB, when the caller knows it (tests and
    /// the sim backend; on nvml the daemon samples it itself). Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_memory_gb: Option<f64>,
    /// Sent by the plugin's job epilog (slurmd), not by an admin or a
    /// test: the daemon counts these to notice an epilog that never runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_epilog: bool,
}

impl ReleaseRequest {
    /// A plain release (job ended, nothing else known).
    pub fn new(job_id: u64) -> Self {
        ReleaseRequest {
            job_id,
            ..ReleaseRequest::default()
        }
    }
}

/// How the daemon satisfied an allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocAction {
    /// The job already held this instance (another step, or a retry).
    Existing,
    /// An idle instance of the right size was reused.
    Reused,
    /// A new instance was created in free space.
    Created,
    /// Idle instances were destroyed to make room, then one was created.
    Reshaped,
}

/// Reply to `allocate`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocateReply {
    /// `MIG-<uuid>`: what `CUDA_VISIBLE_DEVICES` should be set to.
    pub uuid: String,
    pub gpu: u32,
    /// NVIDIA profile name, e.g. `3g.20gb`.
    pub profile: String,
    /// Start memory slot of the instance.
    pub start: u8,
    /// Compute slices of the instance.
    pub compute: u8,
    /// Memory of the profile in GB.
    pub memory_gb: u32,
    /// True when no instance had to be created (existing or reused).
    pub reused: bool,
    pub action: AllocAction,
    /// Time spent waiting for a release, in milliseconds.
    pub waited_ms: u64,
    /// What the job's user should read in the job's output: why an earlier
    /// run of this job was requeued (absent otherwise, and from daemons
    /// that predate it). Given once, to the job's first allocate after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Reply to `release`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseReply {
    /// Instances returned (0 when the job held none: release is idempotent).
    pub released: u32,
    /// What the daemon decided about an out-of-memory release (`oom: true`).
    /// Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_decision: Option<OomDecision>,
}

/// What the daemon did about a job that ran out of GPU memory (its wire
/// form is the snake_case name, e.g. `requeue_scheduled`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomDecision {
    /// The job will be requeued with a profile of more memory.
    RequeueScheduled,
    /// Slurm requeued it.
    Requeued,
    /// Slurm did not requeue it: it was cancelled or timed out meanwhile.
    NotRequeued,
    /// `scontrol requeue` failed.
    RequeueFailed,
    /// `oom.max_retries` restarts already.
    RetriesExhausted,
    /// No profile has more memory for the job's slices.
    NoLargerProfile,
    /// `oom.requeue = false`.
    Disabled,
    /// `slurm.enabled = false`.
    SlurmDisabled,
}

impl OomDecision {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            OomDecision::RequeueScheduled => "requeue_scheduled",
            OomDecision::Requeued => "requeued",
            OomDecision::NotRequeued => "not_requeued",
            OomDecision::RequeueFailed => "requeue_failed",
            OomDecision::RetriesExhausted => "retries_exhausted",
            OomDecision::NoLargerProfile => "no_larger_profile",
            OomDecision::Disabled => "disabled",
            OomDecision::SlurmDisabled => "slurm_disabled",
        }
    }
}

impl std::fmt::Display for OomDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reply to `reconcile`: the jobs whose instances were released because
/// Slurm shows them ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileReply {
    pub released_jobs: Vec<u64>,
}

/// Reply to `health`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HealthReply {
    pub status: String,
    pub version: String,
    pub backend: String,
    pub uptime_s: u64,
}

/// Reply to `status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusReply {
    pub node: String,
    pub version: String,
    pub backend: String,
    pub policy: String,
    /// Which waiting allocate goes first (`placement`: `arrival`, `edf`,
    /// `learned:FILE`). Optional (older daemons omit it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    pub uptime_s: u64,
    /// Repartitioning epochs run to the end since smartmigd started (the
    /// count of `/metrics`' `smartmig_epochs_total`): a reader that sees
    /// it advance by two knows a whole epoch ran after it looked (tests
    /// wait on it instead of sleeping; absent, 0, from older daemons).
    #[serde(default)]
    pub epochs: u64,
    pub gpus: Vec<GpuStatus>,
    /// Learned memory estimates and recent out-of-memory restarts (absent
    /// from daemons that predate them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStatus>,
    /// The reaper had to free instances and the plugin's job epilog never
    /// sent a release: slurmd was not restarted after the plugin was added
    /// to plugstack.conf (jobs may then wait for or fail on ended jobs'
    /// instances).
    #[serde(default)]
    pub epilog_missing: bool,
    /// Allocates waiting for room right now, longest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<WaitingJob>,
    /// Plans waiting for `smartmig apply` (`mode = "confirm"`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_plans: Vec<PlanStatus>,
    /// What advise mode watched and recorded (`mode = "advise"` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advise: Option<AdviseStatus>,
    /// Where the node's view of the Slurm queue comes from (absent from
    /// daemons that predate the cluster summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterViewStatus>,
    /// Which policy runs now and why: the day's shadow (absent from
    /// daemons that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowStatus>,
    /// Whether Slurm numbers the GPUs as the backend does (absent with
    /// Slurm queries off, in advise mode, and from daemons that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_order: Option<GpuOrderStatus>,
    /// Whether smartmigd holds the shards MIG cannot build, and why
    /// (absent from daemons that predate it; docs/slurm-integration.md §9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<HoldsStatus>,
}

/// The `holds` section of a status reply: what `slurm.holds` asks and
/// what smartmigd runs, which also depends on gres.conf's per-GPU types.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldsStatus {
    /// `slurm.holds` in smartmig.toml: `auto` (the default), `off`,
    /// `adaptive`, `next-job` or `any-mix`.
    pub configured: String,
    /// What runs: `adaptive`, `any-mix`, `next-job`, `off`, or `no-slurm` (Slurm queries
    /// are off: nothing to hold).
    pub state: String,
    /// Why, in words (with the fix when it is off for gres.conf).
    pub reason: String,
}

/// The `gpu_order` section of a status reply: Slurm's GPU order (`slurmd
/// -G`) against the backend's, checked at start and asked again until
/// Slurm answers once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuOrderStatus {
    /// `matches`; `not-checked` (slurmd lists no gpu GRES); `waiting`
    /// (Slurm has not answered yet, smartmigd asks again); `mismatch`
    /// (allocates are refused).
    pub state: String,
    /// In words.
    pub detail: String,
    /// Times Slurm was asked.
    pub attempts: u32,
}

/// The `shadow` section of a status reply (docs/daemon.md, "Do no harm
/// during the day: the shadow").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShadowStatus {
    /// Whether the shadow compares the policy with its fallback at all.
    pub enabled: bool,
    /// `learned` (the configured policy) or `fallback`.
    pub running: String,
    /// The name of the policy running now.
    pub running_policy: String,
    /// The configured policy and the fallback, by name.
    pub primary: String,
    pub fallback: String,
    /// The rule: seconds between checks, window, relative margin, checks
    /// in a row.
    pub every_s: f64,
    pub window_s: f64,
    pub margin: f64,
    pub hold_checks: u32,
    /// Checks made, and replays that failed (the running policy is kept).
    pub checks: u64,
    pub failures: u64,
    /// Jobs in the day's book, and its start (Unix seconds).
    pub jobs: u64,
    pub day_start: u64,
    /// The last check's window costs (J, ET objective), primary first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_costs_j: Option<[f64; 2]>,
    /// The last hand-over, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_switch: Option<ShadowSwitch>,
    /// Hand-overs since the daemon started.
    pub switches: u64,
}

/// One hand-over between the policy and its fallback.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShadowSwitch {
    /// Unix seconds.
    pub at: u64,
    /// `learned` or `fallback`.
    pub from: String,
    pub to: String,
    /// Each one's cost increase over the window, J (primary first).
    pub window_costs_j: [f64; 2],
    /// Why, in words.
    pub reason: String,
}

/// The `cluster` section of a status reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterViewStatus {
    /// `summary` (the publisher's file), `squeue` (asking Slurm itself),
    /// `hold` (no fresh summary, layout kept) or `none` (Slurm queries off).
    pub source: String,
    /// Where the node looks for `<node>.json`.
    pub summary_dir: String,
    /// The summary's age, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_s: Option<u64>,
    /// smartmig nodes the publisher split the pending jobs over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// Pending jobs this node claims (its share of the demand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed: Option<u32>,
    /// Pending shard jobs in the whole cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_cluster: Option<u32>,
    /// Why no summary is used, when one was looked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The `advise` section of a status reply: smartmigd watches the node's
/// own MIG setup and records what its policy would do, changing nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdviseStatus {
    /// The advice log (`smartmig advise report` reads it).
    pub log: String,
    /// Jobs running on the node's instances now (typed GRES).
    pub watched_jobs: u32,
    /// Ended jobs recorded since smartmigd started.
    pub jobs_recorded: u64,
    /// Reshapes the policy wished since smartmigd started.
    pub advice_recorded: u64,
    /// The policy's current wish per GPU (nothing is carried out).
    pub wishes: Vec<PlanStatus>,
}

/// A job whose allocate waits for an instance to free up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingJob {
    pub job_id: u64,
    pub gpu: u32,
    pub slices: u8,
    pub waiting_s: u64,
    /// The job's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The deadline the `placement` rule orders it by (unix s): Slurm's
    /// `--deadline`, else the end of its time limit; absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<i64>,
}

/// The `memory` section of a status reply.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryStatus {
    /// Whether jobs without `--mig-mem` get the learned estimate.
    pub estimate: bool,
    /// Whether out-of-memory failures are requeued.
    pub oom_requeue: bool,
    pub max_retries: u32,
    /// Recent out-of-memory decisions, newest last (bounded).
    pub oom_events: Vec<OomEvent>,
    /// Jobs that ran out of memory and whose next start gets more memory.
    pub oom_jobs: Vec<OomJob>,
    /// Learned estimates, most recently updated first (bounded).
    pub estimates: Vec<EstimateStatus>,
    /// The plugin's `oom_requeue` as its last allocate said (`None`: no
    /// allocate yet, or an older plugin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_oom_requeue: Option<bool>,
    /// Early restarts (`oom.early_restart`); absent when off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_restart: Option<EarlyRestartStatus>,
}

/// The early-restart rule in force and what it did since the state file
/// began (`docs/oom-and-memory.md`, "On a Slurm node").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EarlyRestartStatus {
    /// Samples the slope is measured over.
    pub window: usize,
    /// How far the trend is followed, as a multiple of the time run.
    pub horizon: f64,
    /// Share of the instance's memory the use must reach first.
    pub min_fill: f64,
    /// Jobs requeued on a bigger profile before running out of memory.
    pub restarts: u64,
    /// Of those, the ones whose peak on the bigger profile would have fitted
    /// the instance they left (known only when the restart completes and
    /// its memory was sampled).
    pub false_restarts: u64,
}

/// One out-of-memory decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomEvent {
    /// Unix seconds.
    pub at: u64,
    pub job_id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    pub gpu: u32,
    /// The profile the job ran out of memory on.
    pub profile: String,
    pub memory_gb: u32,
    /// OOM failures of this job so far (this one included).
    pub failures: u32,
    pub decision: OomDecision,
    /// Memory (GB) the next start is given at least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_memory_gb: Option<u32>,
    pub message: String,
    /// Why: the job ran out of memory (`failure`, the default, omitted) or
    /// its rising use predicted it would (`early_restart`).
    #[serde(default, skip_serializing_if = "OomCause::is_failure")]
    pub cause: OomCause,
    /// Early restart: the memory in use (GB) when the rule fired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_gb: Option<f64>,
    /// Early restart: the use (GB) the trend predicted, over the instance's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_gb: Option<f64>,
}

/// Why an out-of-memory event was recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomCause {
    /// The job ran out of memory (its marker file).
    #[default]
    Failure,
    /// The job's rising memory use predicted it would (`oom.early_restart`).
    EarlyRestart,
}

impl OomCause {
    pub fn is_failure(&self) -> bool {
        *self == OomCause::Failure
    }
}

/// A job whose next start is sized from its out-of-memory failures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomJob {
    pub job_id: u64,
    pub restarts: u32,
    pub failures: u32,
    pub last_profile: String,
    pub last_memory_gb: u32,
    /// Of `restarts`, those that were early restarts.
    #[serde(default)]
    pub early_restarts: u32,
}

/// One learned estimate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EstimateStatus {
    pub user: String,
    pub job_name: String,
    /// What a job of this key without `--mig-mem` asks for (GB, margin included).
    pub estimate_gb: f64,
    /// Runs remembered (completed and out-of-memory).
    pub runs: u32,
    pub ooms: u32,
    /// Largest peak of a completed run, GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_peak_gb: Option<f64>,
}

/// One GPU in a status reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    pub index: u32,
    /// On the wire, the model's id (`a100-40gb`).
    pub model: GpuModel,
    /// Memory-slot picture (`4444|22|1|.`), see `Geometry::picture`.
    pub picture: String,
    /// Layout name (`4g.20gb+2g.10gb+1g.5gb`).
    pub layout: String,
    pub instances: Vec<InstanceStatus>,
    /// Seconds since the GPU last had a busy instance (0 while busy).
    pub idle_s: u64,
    /// Energy integrated since the daemon started (J), when the backend knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<f64>,
    /// Instances other users' jobs hold, per profile, in a status shown to
    /// a user who may not see them (their entries are left out of
    /// `instances`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub others_busy: BTreeMap<String, u32>,
    /// XIDs NVML reported for this GPU (absent when none, and from daemons
    /// that predate them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<GpuHealthStatus>,
}

/// A GPU's XID record in a status reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHealthStatus {
    /// The GPU-fatal XID that put the GPU out of service (no placement,
    /// node drained), until an admin resumes the node in Slurm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fatal_xid: Option<u64>,
    /// XIDs seen since the daemon started, by number.
    pub xids: BTreeMap<u64, u64>,
}

/// One instance in a status reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceStatus {
    pub uuid: String,
    pub profile: String,
    pub start: u8,
    pub compute: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<u64>,
    /// How Slurm names the job when it is an array task (`11_1`, while
    /// `job_id` is the task's own id), once smartmigd has seen it in the
    /// queue or in its `AdminComment` read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Unix seconds since which the job holds the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_since: Option<u64>,
    /// Seconds the instance has been idle (absent while busy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_s: Option<u64>,
    /// The device files whose opening grants the use of the instance
    /// (owned by the job's user while busy, by root while idle; empty when
    /// `isolate_devices` is off).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_files: Vec<String>,
    /// The XID that marked the instance unhealthy: no job is placed on it
    /// and it is rebuilt once idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_xid: Option<u64>,
}

/// Stable error kinds: clients (the SPANK plugin) branch on these, never on messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Not JSON, not an object, missing or mistyped fields.
    BadRequest,
    /// `v` is not [`PROTOCOL_VERSION`].
    UnsupportedVersion,
    /// `op` names no operation.
    UnknownOp,
    /// The line exceeds `max_message_bytes` (the connection is closed).
    TooLarge,
    /// No complete request within `request_timeout_s`.
    Timeout,
    /// The peer may not perform a write op.
    Unauthorized,
    /// Well-formed but impossible: unknown GPU index, more slices than the GPU has, ...
    InvalidRequest,
    /// No instance could be made within `allocate_wait_s`.
    NoFit,
    /// The allocate's shard count or GPU is not what slurmctld granted the
    /// job (read from an environment the user may have set), or Slurm does
    /// not list the job: nothing is built (issue 42).
    NotGranted,
    /// A `release` of a job Slurm shows still running (or still ending):
    /// its processes may use the instance, so it is kept.
    JobRunning,
    /// The MIG backend (NVML or the simulator) failed.
    Backend,
    /// The daemon is shutting down.
    ShuttingDown,
    /// The caller's user holds `max_connections_per_user` connections
    /// already, or unprivileged users hold `max_connections` (the
    /// connection is closed; root is never refused).
    TooManyConnections,
    /// A bug: reported rather than hidden.
    Internal,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::UnsupportedVersion => "unsupported_version",
            ErrorKind::UnknownOp => "unknown_op",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::NoFit => "no_fit",
            ErrorKind::NotGranted => "not_granted",
            ErrorKind::JobRunning => "job_running",
            ErrorKind::Backend => "backend",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::TooManyConnections => "too_many_connections",
            ErrorKind::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `error` object of a failed reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ErrorBody {
    pub kind: ErrorKind,
    pub message: String,
}

impl ErrorBody {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ErrorBody {
            kind,
            message: message.into(),
        }
    }
}

/// A successful reply line: the body's fields plus `v` and `ok`.
pub fn ok_line<T: Serialize>(body: &T) -> String {
    let mut map = match serde_json::to_value(body) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    map.insert("v".into(), Value::from(PROTOCOL_VERSION));
    map.insert("ok".into(), Value::Bool(true));
    let mut line = Value::Object(map).to_string();
    line.push('\n');
    line
}

/// A failed reply line.
pub fn error_line(error: &ErrorBody) -> String {
    let mut line =
        serde_json::json!({"v": PROTOCOL_VERSION, "ok": false, "error": error}).to_string();
    line.push('\n');
    line
}

/// Parses one request line (without its newline).
///
/// Checks in order: JSON, object, `v`, `op`, then the op's fields, so each
/// kind of garbage gets its own stable error kind.
pub fn parse_request(line: &[u8]) -> Result<Request, ErrorBody> {
    let bad = |m: String| ErrorBody::new(ErrorKind::BadRequest, m);
    let value: Value =
        serde_json::from_slice(line).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(bad("a request must be a JSON object".into()));
    };
    match map.remove("v") {
        None => {
            return Err(bad(format!(
                "missing `v` (protocol version, {PROTOCOL_VERSION})"
            )))
        }
        Some(Value::Number(n)) if n.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => {}
        Some(other) => {
            return Err(ErrorBody::new(
                ErrorKind::UnsupportedVersion,
                format!(
                "protocol version {other} is not supported (this daemon speaks {PROTOCOL_VERSION})"
            ),
            ))
        }
    }
    match map.get("op") {
        None => return Err(bad("missing `op`".into())),
        Some(Value::String(op)) => {
            if !OPS.contains(&op.as_str()) {
                return Err(ErrorBody::new(
                    ErrorKind::UnknownOp,
                    format!("unknown op `{op}` (known: {})", OPS.join(", ")),
                ));
            }
        }
        Some(_) => return Err(bad("`op` must be a string".into())),
    }
    serde_json::from_value(Value::Object(map)).map_err(|e| bad(format!("invalid request: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_op_parses_to_its_request() {
        let lines = [
            r#"{"v":1,"op":"allocate","job_id":1,"uid":0,"gpu":0,"slices":1}"#,
            r#"{"v":1,"op":"release","job_id":1}"#,
            r#"{"v":1,"op":"status"}"#,
            r#"{"v":1,"op":"health"}"#,
            r#"{"v":1,"op":"reconcile"}"#,
            r#"{"v":1,"op":"plan"}"#,
            r#"{"v":1,"op":"apply","plan":3}"#,
        ];
        let ops: Vec<&str> = lines
            .iter()
            .map(|l| parse_request(l.as_bytes()).expect(l).op())
            .collect();
        assert_eq!(ops, OPS);
    }

    fn kind(line: &str) -> ErrorKind {
        parse_request(line.as_bytes()).unwrap_err().kind
    }

    #[test]
    fn parses_every_op() {
        let r = parse_request(
            br#"{"v":1,"op":"allocate","job_id":7,"step":0,"uid":1000,"gpu":1,"slices":3,"memory_gb":15}"#,
        )
        .unwrap();
        let Request::Allocate(a) = r else {
            panic!("not allocate")
        };
        assert_eq!(
            (a.job_id, a.gpu, a.slices, a.memory_gb),
            (7, 1, 3, Some(15.0))
        );
        assert_eq!(
            parse_request(br#"{"v":1,"op":"release","job_id":7}"#).unwrap(),
            Request::Release(ReleaseRequest::new(7))
        );
        assert_eq!(
            parse_request(br#"{"v":1,"op":"status"}"#).unwrap(),
            Request::Status
        );
        assert_eq!(
            parse_request(br#"{"op":"health","v":1}"#).unwrap(),
            Request::Health
        );
    }

    #[test]
    fn each_kind_of_garbage_has_its_kind() {
        assert_eq!(kind("garbage"), ErrorKind::BadRequest);
        assert_eq!(kind("[1,2]"), ErrorKind::BadRequest);
        assert_eq!(kind(r#"{"op":"status"}"#), ErrorKind::BadRequest);
        assert_eq!(
            kind(r#"{"v":2,"op":"status"}"#),
            ErrorKind::UnsupportedVersion
        );
        assert_eq!(
            kind(r#"{"v":"1","op":"status"}"#),
            ErrorKind::UnsupportedVersion
        );
        assert_eq!(kind(r#"{"v":1,"op":"format_disk"}"#), ErrorKind::UnknownOp);
        assert_eq!(kind(r#"{"v":1,"op":7}"#), ErrorKind::BadRequest);
        assert_eq!(
            kind(r#"{"v":1,"op":"allocate","job_id":"x","uid":0,"gpu":0,"slices":1}"#),
            ErrorKind::BadRequest
        );
        assert_eq!(
            kind(r#"{"v":1,"op":"allocate","job_id":1,"uid":0,"gpu":0,"slices":1,"colour":"red"}"#),
            ErrorKind::BadRequest
        );
        assert_eq!(
            kind(r#"{"v":1,"op":"allocate","job_id":1,"uid":0,"gpu":0,"slices":300}"#),
            ErrorKind::BadRequest
        );
    }

    #[test]
    fn optional_v1_fields_are_additive() {
        // Old clients: no job_name / oom / used_memory_gb.
        let Request::Allocate(a) =
            parse_request(br#"{"v":1,"op":"allocate","job_id":7,"uid":0,"gpu":0,"slices":1}"#)
                .unwrap()
        else {
            panic!("not allocate")
        };
        assert_eq!(a.job_name, None);
        let Request::Allocate(a) = parse_request(
            br#"{"v":1,"op":"allocate","job_id":7,"uid":0,"gpu":0,"slices":1,"job_name":"train.sh"}"#,
        )
        .unwrap() else {
            panic!("not allocate")
        };
        assert_eq!(a.job_name.as_deref(), Some("train.sh"));
        assert_eq!(
            parse_request(br#"{"v":1,"op":"release","job_id":7,"oom":true,"used_memory_gb":4.5}"#)
                .unwrap(),
            Request::Release(ReleaseRequest {
                job_id: 7,
                oom: true,
                used_memory_gb: Some(4.5),
                from_epilog: false,
            })
        );
        // A plain release serializes exactly as before.
        let plain: Value =
            serde_json::from_str(&Request::Release(ReleaseRequest::new(7)).to_line()).unwrap();
        assert_eq!(
            plain,
            serde_json::json!({"v": 1, "op": "release", "job_id": 7})
        );
        // Out-of-memory decisions travel as their snake_case names.
        for d in [
            OomDecision::RequeueScheduled,
            OomDecision::Requeued,
            OomDecision::NotRequeued,
            OomDecision::RequeueFailed,
            OomDecision::RetriesExhausted,
            OomDecision::NoLargerProfile,
            OomDecision::Disabled,
            OomDecision::SlurmDisabled,
        ] {
            assert_eq!(serde_json::to_value(d).unwrap(), Value::from(d.as_str()));
        }
        let r: ReleaseReply =
            serde_json::from_str(r#"{"released":1,"oom_decision":"requeue_scheduled"}"#).unwrap();
        assert_eq!(r.oom_decision, Some(OomDecision::RequeueScheduled));
        // Old replies (no oom_decision, no memory section) still parse.
        let r: ReleaseReply = serde_json::from_str(r#"{"released":1}"#).unwrap();
        assert_eq!(r.oom_decision, None);
        let s: StatusReply = serde_json::from_str(
            r#"{"node":"n","version":"0","backend":"sim","policy":"none","uptime_s":1,"gpus":[]}"#,
        )
        .unwrap();
        assert!(s.memory.is_none());
    }

    #[test]
    fn lines_round_trip() {
        let req = Request::Release(ReleaseRequest::new(3));
        let line = req.to_line();
        assert!(line.ends_with('\n'));
        assert_eq!(parse_request(line.trim_end().as_bytes()).unwrap(), req);
        let ok: Value = serde_json::from_str(&ok_line(&ReleaseReply {
            released: 1,
            oom_decision: None,
        }))
        .unwrap();
        assert_eq!(ok["ok"], true);
        assert_eq!(ok["v"], 1);
        assert_eq!(ok["released"], 1);
        let err: Value =
            serde_json::from_str(&error_line(&ErrorBody::new(ErrorKind::NoFit, "full"))).unwrap();
        assert_eq!(err["ok"], false);
        assert_eq!(err["error"]["kind"], "no_fit");
    }
}
