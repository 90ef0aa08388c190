//! The auditable event log: one JSON object per line.
//!
//! Line 1 is a [`Header`]; then, in simulation order, one [`ReconfigRecord`]
//! per applied reconfiguration and one [`JobRecord`] per started job (written
//! when it starts: without preemption its end is known then; in the
//! out-of-memory mode an [`OomRecord`] per failed or early-restarted run
//! instead); then one
//! [`UnservedRecord`] per job that never ran; last a [`SummaryRecord`] with
//! the simulator's own totals. The file alone is enough to re-check
//! feasibility and recompute energy and tardiness ([`super::audit`]).
//! Floats are written with the shortest representation that reads back to
//! the same `f64`, so the checks are exact.

use std::io::Write;

use serde::{Deserialize, Serialize};

pub use super::reshape::ReconfigKind;
use crate::mig::{GpuModel, InstanceDesc};
use crate::workload::{EarlyRestartRule, Job, MemoryGrowth, PowerModel, SpeedupCurve};

/// Version of the schema below; bumped on any incompatible change (2: the
/// summary's energy and tardiness charge jobs that never ran by the rule
/// of `sim::metrics`, on a whole GPU from the horizon on).
pub const EVENTS_VERSION: u32 = 2;

/// One line of the event log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Record {
    Header(Header),
    Reconfig(ReconfigRecord),
    Job(JobRecord),
    Oom(OomRecord),
    Unserved(UnservedRecord),
    Summary(SummaryRecord),
}

/// The run's fixed parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub version: u32,
    pub seed: u64,
    pub placement: String,
    pub policy: String,
    /// Duration of every reconfiguration, s.
    pub reconfig_time_s: f64,
    /// The workload's own horizon, s; energy is integrated up to
    /// `max(workload_horizon_s, last job end)`.
    pub workload_horizon_s: f64,
    /// GPUs in order (index = `gpu` in the other records).
    pub gpus: Vec<GpuHeader>,
    /// Power model of each model present.
    pub power: Vec<ModelPower>,
    /// The out-of-memory mode, when on (absent otherwise: older logs and
    /// runs without it are read unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomHeader>,
}

/// Parameters of the out-of-memory mode, for the audit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomHeader {
    /// A failing run ends at `start + fail_fraction * work / speed`.
    pub fail_fraction: f64,
    /// A job has at most `max_retries + 1` OOM records, and at most
    /// `max_retries` if it finally ran.
    pub max_retries: u32,
    /// The early-restart rule, when on (absent otherwise: older logs read
    /// unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_restart: Option<EarlyRestartRule>,
    /// Seconds between memory samples, with `early_restart`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_s: Option<f64>,
}

/// One GPU at time 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuHeader {
    pub model: GpuModel,
    pub compute_slices: u8,
    /// Instances existing (and ready) at time 0.
    pub initial: Vec<InstanceDesc>,
}

/// `power_w(load) = idle_w + (max_w - idle_w) * load^exponent`, load = busy
/// compute slices / compute slices of the GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelPower {
    pub model: GpuModel,
    pub power: PowerModel,
}

/// A reconfiguration: at `time` the `destroyed` (idle) instances disappear;
/// the `created` ones exist from `time` but run nothing before `ready`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReconfigRecord {
    pub time: f64,
    pub gpu: usize,
    pub destroyed: Vec<InstanceDesc>,
    pub created: Vec<InstanceDesc>,
    pub duration: f64,
    pub ready: f64,
    /// Fusion, fission or reshape ([`ReconfigKind`]), as
    /// [`super::reshape::classify`] reads it off `destroyed` and `created`.
    /// Absent in logs written before it existed (the audit then skips the
    /// check); always written now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ReconfigKind>,
}

/// What every run says, finished or failed: the job's parameters and the
/// instance it ran on, from when. Flattened into [`JobRecord`] and
/// [`OomRecord`], so the log's lines keep one flat object each.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub id: u64,
    pub arrival: f64,
    pub deadline: f64,
    /// Seconds on a whole GPU.
    pub work: f64,
    /// The job's true memory need, GB.
    pub memory_gb: f64,
    pub requested_slices: Option<u8>,
    pub speedup: SpeedupCurve,
    pub gpu: usize,
    /// The instance: profile name, compute and memory slices, start slot.
    pub profile: String,
    pub compute: u8,
    pub memory_slices: u8,
    pub start_slot: u8,
    /// Memory of the instance's profile, GB.
    pub instance_memory_gb: u32,
    /// `speedup` evaluated on the instance: a full run lasts `work / speed`.
    pub speed: f64,
    pub start: f64,
    /// GPUs the job spans ([`Job::gpus`](crate::workload::Job::gpus)): a
    /// gang job logs one run per GPU, with the same start and end.
    #[serde(
        default = "crate::workload::job::one_gpu",
        skip_serializing_if = "crate::workload::job::is_one_gpu"
    )]
    pub gpus: u32,
}

/// One job that ran: its parameters, where and when
/// (`end - start = work / speed`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    #[serde(flatten)]
    pub run: Run,
    pub end: f64,
}

/// A run that ran out of memory, or (`early`) was restarted before it
/// would have. Out of memory: the instance (`instance_memory_gb`) was
/// smaller than the job's true need (`memory_gb`), and the run ended where
/// its memory use crossed the instance's: `fail = start + crossing × work
/// / speed`, crossing from `memory_growth` (without one, `fail_fraction`).
/// Early: the early-restart rule of the header fired at `fail = start +
/// first_restart(..)`, whatever the instance (a restart of a job that
/// fitted is a false one). Either way the run occupied the instance from
/// `start` to `fail`, drew power meanwhile, and the job was requeued (or
/// given up: then an [`UnservedRecord`] follows). `attempt` counts from 1
/// over both kinds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomRecord {
    #[serde(flatten)]
    pub run: Run,
    /// What the scheduler went by: the declaration or the estimate, GB.
    pub asked_memory_gb: f64,
    pub fail: f64,
    pub attempt: u32,
    /// The job's memory curve, when it has one (absent: a step at
    /// `fail_fraction`, as in logs written before growth existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_growth: Option<MemoryGrowth>,
    /// An early restart rather than a failure (absent when false, so
    /// older logs read unchanged).
    #[serde(default, skip_serializing_if = "is_false")]
    pub early: bool,
}

/// A job that never ran, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnservedRecord {
    pub id: u64,
    pub arrival: f64,
    pub deadline: f64,
    pub work: f64,
    pub memory_gb: f64,
    pub requested_slices: Option<u8>,
    pub reason: String,
    /// GPUs the job spans (charged as that many whole GPUs).
    #[serde(
        default = "crate::workload::job::one_gpu",
        skip_serializing_if = "crate::workload::job::is_one_gpu"
    )]
    pub gpus: u32,
}

impl UnservedRecord {
    /// The record of job `j`, which never ran for `reason`.
    pub fn of(j: &Job, reason: String) -> Self {
        UnservedRecord {
            id: j.id,
            arrival: j.arrival,
            deadline: j.deadline,
            work: j.work,
            memory_gb: j.memory_gb,
            requested_slices: j.requested_slices,
            reason,
            gpus: j.gpus,
        }
    }
}

/// The simulator's own totals, for the audit to compare with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SummaryRecord {
    pub horizon_s: f64,
    /// Energy of every GPU up to the horizon, plus the charge for the jobs
    /// that never ran (`sim::metrics`), J.
    pub energy_j: f64,
    /// Tardiness of the jobs that ran, plus that charged for the others, s.
    pub total_tardiness_s: f64,
    pub completed: u64,
    pub unserved: u64,
    pub reconfigurations: u64,
    pub rejected_decisions: u64,
    /// Out-of-memory failures (runs that did not complete).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub oom_failures: u64,
    /// Early restarts (runs the rule ended; not in `oom_failures`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub early_restarts: u64,
    /// Reconfigurations by kind and the jobs served by what fusions and
    /// fissions created (absent in older logs: the audit then skips them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<KindCounts>,
}

/// Reconfigurations by [`ReconfigKind`] (their sum is the number of
/// reconfigurations) and what the fusions and fissions gained: jobs that
/// completed a run on an instance a fusion (fission) created, started
/// before that instance was destroyed again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindCounts {
    pub fusions: u64,
    pub fissions: u64,
    pub reshapes: u64,
    pub jobs_served_by_fusion: u64,
    pub jobs_served_by_fission: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// Where the simulator sends records. Only called when a sink is given, so a
/// run without `--events` builds no records at all.
pub trait EventSink {
    fn record(&mut self, record: &Record) -> std::io::Result<()>;
}

/// Writes JSON lines.
pub struct JsonLines<W: Write> {
    out: W,
}

impl<W: Write> JsonLines<W> {
    pub fn new(out: W) -> Self {
        JsonLines { out }
    }

    /// The writer back (flush it).
    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: Write> EventSink for JsonLines<W> {
    fn record(&mut self, record: &Record) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, record)?;
        self.out.write_all(b"\n")
    }
}

/// Keeps records in memory (tests, the audit of a fresh run).
#[derive(Default, Debug)]
pub struct Collect(pub Vec<Record>);

impl EventSink for Collect {
    fn record(&mut self, record: &Record) -> std::io::Result<()> {
        self.0.push(record.clone());
        Ok(())
    }
}
