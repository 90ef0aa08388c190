//! Advise mode's replay (issue 22): smartmigd records what it saw on a
//! node it does not manage (`mode = "advise"`) and what its policy would
//! have done ([`crate::formats::advice`]); `smartmig advise report` reads
//! the records back and replays the observed jobs through the simulator,
//! under the layout the site really ran against the policy, to estimate
//! what dynamic mode would have changed.

use std::collections::BTreeMap;

use serde::Serialize;

use super::score::Reference;
use super::{agrees, audit_run, AuditFailure};
use crate::formats::advice::AdviceRecord;
use crate::mig::{parse_profile, Geometry, GpuModel, Layout, ProfileParseError};
use crate::policy::{layout_or_whole, ClusterView, Decision, NoPartition, RepartitionPolicy};
use crate::sim::metrics::percentile;
use crate::sim::{
    day_horizon, simulate, AuditError, Collect, EpochRule, Heuristic, Metrics, Record, RunHooks,
    SimConfig, SimError,
};
use crate::workload::{Job, JobClass, SpeedupCurve};

// ---------------------------------------------------------------------------
// The replay behind `smartmig advise report`.
//
// From the records: the node's GPUs (model and layout per GPU index, from
// the `Layout` records), the observed jobs as workload jobs, and the layout
// the site ran as a policy ([`AsRun`]) that installs each recorded layout
// at its recorded time. The same jobs then run through the simulator under
// the as-run layout (the opponent), the policy the daemon is configured
// with, and whole GPUs (`none`), each event log audited.
//
// Sizing: a job that asked Slurm for a typed profile (`gpu:3g.20gb:1`) is
// replayed as a request of exactly that profile's compute slices
// (`requested_slices`, as `--gres=shard:K`, with the simulator's
// `exact_size`: what Slurm's typed GRES gave it and what smartmigd's
// allocation hands out) and that profile's memory as its need
// (`memory_gb`), so no policy gives it fewer slices or less memory than it
// had (it may get a profile of the same compute size with more memory,
// `1g.10gb` for `1g.5gb`). Its work is its observed run time on that
// profile through the speed-up curve ([`ReplayConfig::speedup`]): replayed
// on the same compute size it runs exactly as long as observed. The
// whole-GPU row gives every job a whole GPU (`none` is MIG off), so there
// it runs faster by the curve.
//
// Where it is an estimate: the jobs' speed-up curve is assumed (only for
// the whole-GPU row, and for a profile with more memory it makes no
// difference); the simulator starts a job wherever an instance of its
// size is free on any GPU, in arrival order (Slurm may have backfilled or
// pinned it); energy comes from the simulator's power model, not from a
// measurement. [`Fidelity`] says how far the as-run replay is from what
// was observed.
// ---------------------------------------------------------------------------

/// Seconds after its submit that a job without deadline or time limit is
/// due in the replay: never late, but finite (the simulator's jobs need a
/// finite deadline).
pub const NO_DEADLINE_S: f64 = 1.0e9;

/// Shortest run time the replay gives a job (a job that ended the second
/// it started still occupied its instance, and work must be > 0).
pub const MIN_RUN_S: f64 = 1.0;

/// Why the log could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum AdviseError {
    #[error("line {line}: not an advice record: {source}")]
    Line {
        line: usize,
        source: serde_json::Error,
    },
    #[error("no Layout record: the log does not say which GPUs the node has (smartmigd writes one per GPU when it starts)")]
    NoLayouts,
    #[error("no observed jobs {} ({total} job records in the log)", window(*.since))]
    NoJobs { since: Option<f64>, total: usize },
    #[error("GPU {gpu}: recorded as {first} and later as {then}")]
    ModelChanged {
        gpu: u32,
        first: GpuModel,
        then: GpuModel,
    },
    #[error("GPU {gpu} at t={t}: layout {layout:#x} is not a valid {model} layout")]
    InvalidLayout {
        gpu: u32,
        t: f64,
        model: GpuModel,
        layout: u32,
    },
    #[error("job {job_id}: it ran on GPU {gpu}, which has no Layout record")]
    UnknownGpu { job_id: u64, gpu: u32 },
    #[error("job {job_id}: profile `{profile}` on GPU {gpu} ({model}): {source}")]
    Profile {
        job_id: u64,
        profile: String,
        gpu: u32,
        model: GpuModel,
        source: ProfileParseError,
    },
    #[error("job {job_id}: profile `{profile}` is not a profile of any GPU model of the node ({models})")]
    ProfileNowhere {
        job_id: u64,
        profile: String,
        models: String,
    },
    #[error("job {job_id}: {why}")]
    BadJob { job_id: u64, why: String },
    #[error("replaying {row}: {source}")]
    Sim { row: String, source: SimError },
    #[error("building {row}: {source}")]
    Policy {
        row: String,
        source: crate::policy::PolicyParseError,
    },
    #[error("replaying {row}: the event log fails the audit: {source}")]
    Audit { row: String, source: AuditError },
    #[error("replaying {row}: the audit recomputed {what} {audited}, the run reported {reported}")]
    AuditMismatch {
        row: String,
        what: &'static str,
        audited: f64,
        reported: f64,
    },
}

fn window(since: Option<f64>) -> String {
    since.map_or_else(
        || "in the log".to_string(),
        |s| format!("submitted at or after Unix time {s:.0}"),
    )
}

/// The records of one log's text, in order; a line that is not a record
/// is an error naming it (1-based). Blank lines are skipped.
pub fn parse_log(text: &str) -> Result<Vec<AdviceRecord>, AdviseError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| AdviseError::Line {
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// One GPU of the node as recorded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObservedGpu {
    /// The node's GPU index (the simulator numbers the GPUs 0.. in index
    /// order).
    pub index: u32,
    pub model: GpuModel,
    /// The layout at the start of the replay: the last one recorded at or
    /// before it, else the first one recorded (in the JSON: its bit set).
    #[serde(serialize_with = "layout_bits")]
    pub initial: Layout,
    /// `initial` as `Geometry::picture` draws it.
    pub initial_picture: String,
    /// Later layouts within the replay (only real changes).
    pub changes: Vec<LayoutChange>,
}

/// A recorded layout change.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayoutChange {
    /// Unix seconds.
    pub t: f64,
    #[serde(serialize_with = "layout_bits")]
    pub layout: Layout,
    pub picture: String,
}

fn layout_bits<S: serde::Serializer>(l: &Layout, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u32(l.0)
}

fn display<S: serde::Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// One observed job, its profile resolved on its GPU's model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObservedJob {
    pub job_id: u64,
    pub gpu: Option<u32>,
    /// The profile's canonical name on `model` (`3g.40gb` for `3g.39gb`).
    pub profile: String,
    pub model: GpuModel,
    pub compute: u8,
    pub memory_gb: u32,
    /// Unix seconds.
    pub submit: f64,
    pub start: f64,
    pub end: f64,
    /// When it is due, Unix seconds: its `--deadline`, else submit + time
    /// limit (the convention of the `sacct` trace reader), else none.
    pub due: Option<f64>,
}

impl ObservedJob {
    pub fn wait_s(&self) -> f64 {
        self.start - self.submit
    }

    /// Observed run time, at least [`MIN_RUN_S`].
    pub fn run_s(&self) -> f64 {
        (self.end - self.start).max(MIN_RUN_S)
    }

    pub fn tardiness_s(&self) -> f64 {
        self.due.map_or(0.0, |d| (self.end - d).max(0.0))
    }
}

/// What the log says about the window: the input of [`replay`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Observation {
    /// The window's lower bound, Unix seconds (`None`: the whole log).
    pub since: Option<f64>,
    /// Time 0 of the replay: the first observed submit, Unix seconds.
    pub origin: f64,
    /// The last observed end, Unix seconds: every row's energy is
    /// integrated at least up to it.
    pub end: f64,
    pub gpus: Vec<ObservedGpu>,
    /// By submit time (then job id); the index is the simulator's job id.
    pub jobs: Vec<ObservedJob>,
    /// What the `Advice` lines in the window say.
    pub advice: AdviceCounts,
}

/// The policy's recorded wishes in the window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AdviceCounts {
    /// `Advice` lines (each a change of the policy's wish for one GPU).
    pub total: usize,
    /// Per GPU index: wishes, and the instances they would have destroyed
    /// and created.
    pub per_gpu: Vec<GpuAdvice>,
    /// The policy names the lines give, each once.
    pub policies: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuAdvice {
    pub gpu: u32,
    pub wishes: usize,
    pub destroy: usize,
    pub create: usize,
    /// The last wished layout (picture).
    pub last_wish: String,
}

impl Observation {
    /// One model per simulated GPU.
    pub fn cluster(&self) -> Vec<GpuModel> {
        self.gpus.iter().map(|g| g.model).collect()
    }

    /// Seconds from the first submit to the last end.
    pub fn span_s(&self) -> f64 {
        self.end - self.origin
    }

    /// Layout changes recorded within the replay.
    pub fn layout_changes(&self) -> usize {
        self.gpus.iter().map(|g| g.changes.len()).sum()
    }

    /// The observed jobs as the simulator's jobs (sizing in the section's
    /// comment above), times relative to [`Observation::origin`].
    pub fn sim_jobs(&self, speedup: SpeedupCurve) -> Vec<Job> {
        self.jobs
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let arrival = o.submit - self.origin;
                let total = o.model.spec().compute_slices;
                Job {
                    id: i as u64,
                    arrival,
                    work: o.run_s() * speedup.speed(o.compute, total),
                    speedup,
                    memory_gb: f64::from(o.memory_gb),
                    deadline: o.due.map_or(arrival + NO_DEADLINE_S, |d| d - self.origin),
                    class: JobClass::Training,
                    requested_slices: Some(o.compute),
                    declared_memory_gb: None,
                    template: None,
                    memory_growth: None,
                    gpus: 1,
                }
            })
            .collect()
    }

    /// The layout the site ran, as a policy.
    pub fn as_run(&self) -> AsRun {
        AsRun {
            initial: self.gpus.iter().map(|g| g.initial).collect(),
            changes: self
                .gpus
                .iter()
                .map(|g| {
                    g.changes
                        .iter()
                        .map(|c| (c.t - self.origin, c.layout))
                        .collect()
                })
                .collect(),
        }
    }

    /// The observed figures: waits (start - submit) and tardiness as Slurm
    /// ran the jobs.
    pub fn observed(&self) -> ObservedStats {
        let n = self.jobs.len().max(1) as f64;
        let mut waits: Vec<f32> = self.jobs.iter().map(|j| j.wait_s() as f32).collect();
        let total_tardiness_s: f64 = self.jobs.iter().map(ObservedJob::tardiness_s).sum();
        ObservedStats {
            jobs: self.jobs.len(),
            mean_wait_s: self.jobs.iter().map(ObservedJob::wait_s).sum::<f64>() / n,
            p95_wait_s: percentile(&mut waits, 0.95),
            late_jobs: self.jobs.iter().filter(|j| j.tardiness_s() > 0.0).count(),
            total_tardiness_s,
            mean_tardiness_s: total_tardiness_s / n,
            layout_changes: self.layout_changes(),
        }
    }

    /// Each observed job's wait, `(submit, start)` in seconds since the
    /// origin (the observed line of the waiting-jobs plot,
    /// `report::series::waiting`).
    pub fn waits(&self) -> Vec<(f64, f64)> {
        self.jobs
            .iter()
            .map(|j| (j.submit - self.origin, j.start - self.origin))
            .collect()
    }
}

/// Builds the replay's input from the records: the GPUs from every
/// `Layout` record (the layout at the window's start may have been
/// recorded before it), the jobs submitted at or after `since` (Unix
/// seconds; `None`: all), the `Advice` lines at or after `since`.
pub fn observe(records: &[AdviceRecord], since: Option<f64>) -> Result<Observation, AdviseError> {
    let from = since.unwrap_or(f64::NEG_INFINITY);
    let layouts = seen_layouts(records)?;
    let mut raw = raw_jobs(records, from, since)?;
    raw.sort_by(|a, b| a.3.total_cmp(&b.3).then(a.0.cmp(&b.0)));
    let origin = raw[0].3;
    let end = raw.iter().map(|r| r.5).fold(origin, f64::max);
    let gpus = observed_gpus(layouts, origin, end);
    let jobs = observed_jobs(raw, &gpus)?;
    Ok(Observation {
        since,
        origin,
        end,
        gpus,
        jobs,
        advice: count_advice(records, from),
    })
}

/// Each GPU's model and the layouts recorded for it, `(t, layout)`.
type SeenLayouts = BTreeMap<u32, (GpuModel, Vec<(f64, Layout)>)>;

/// A job record in the window: (job id, GPU, profile, submit, start, end,
/// due).
type RawJob<'a> = (u64, Option<u32>, &'a str, f64, f64, f64, Option<f64>);

/// The `Layout` records per GPU: each valid, at a finite time, and of one
/// model per GPU; at least one.
fn seen_layouts(records: &[AdviceRecord]) -> Result<SeenLayouts, AdviseError> {
    let mut layouts: SeenLayouts = BTreeMap::new();
    for r in records {
        if let AdviceRecord::Layout {
            t,
            gpu,
            model,
            layout,
            ..
        } = r
        {
            if !Geometry::of(*model).is_valid(Layout(*layout)) || !t.is_finite() {
                return Err(AdviseError::InvalidLayout {
                    gpu: *gpu,
                    t: *t,
                    model: *model,
                    layout: *layout,
                });
            }
            let entry = layouts.entry(*gpu).or_insert((*model, Vec::new()));
            if entry.0 != *model {
                return Err(AdviseError::ModelChanged {
                    gpu: *gpu,
                    first: entry.0,
                    then: *model,
                });
            }
            entry.1.push((*t, Layout(*layout)));
        }
    }
    if layouts.is_empty() {
        return Err(AdviseError::NoLayouts);
    }
    Ok(layouts)
}

/// The `Job` records submitted at or after `from`, each with finite times
/// in order and a finite deadline; at least one.
fn raw_jobs(
    records: &[AdviceRecord],
    from: f64,
    since: Option<f64>,
) -> Result<Vec<RawJob<'_>>, AdviseError> {
    let mut total = 0;
    let mut raw = Vec::new();
    for r in records {
        if let AdviceRecord::Job {
            job_id,
            gpu,
            profile,
            submit,
            start,
            end,
            time_limit_s,
            deadline,
        } = r
        {
            total += 1;
            if *submit < from {
                continue;
            }
            let bad = |why: String| AdviseError::BadJob {
                job_id: *job_id,
                why,
            };
            if !(submit.is_finite() && start.is_finite() && end.is_finite()) {
                return Err(bad(format!(
                    "submit {submit}, start {start} and end {end} must be finite"
                )));
            }
            if start < submit {
                return Err(bad(format!(
                    "it starts ({start}) before it is submitted ({submit})"
                )));
            }
            if end < start {
                return Err(bad(format!("it ends ({end}) before it starts ({start})")));
            }
            if let Some(d) = deadline {
                if !d.is_finite() {
                    return Err(bad(format!("deadline {d} is not finite")));
                }
            }
            let due = deadline.or_else(|| time_limit_s.map(|l| submit + l as f64));
            raw.push((*job_id, *gpu, profile.as_str(), *submit, *start, *end, due));
        }
    }
    if raw.is_empty() {
        return Err(AdviseError::NoJobs { since, total });
    }
    Ok(raw)
}

/// Each GPU's layout at `origin` (else its first recorded one) and its
/// changes up to `end`.
fn observed_gpus(layouts: SeenLayouts, origin: f64, end: f64) -> Vec<ObservedGpu> {
    layouts
        .into_iter()
        .map(|(index, (model, mut seen))| {
            seen.sort_by(|a, b| a.0.total_cmp(&b.0));
            let initial = seen
                .iter()
                .rev()
                .find(|(t, _)| *t <= origin)
                .or(seen.first())
                .map_or_else(|| Geometry::of(model).whole_gpu(), |&(_, l)| l);
            let geo = Geometry::of(model);
            let mut changes = Vec::new();
            let mut current = initial;
            for &(t, l) in seen.iter().filter(|(t, _)| *t > origin && *t <= end) {
                if l != current {
                    changes.push(LayoutChange {
                        t,
                        layout: l,
                        picture: geo.picture(l),
                    });
                    current = l;
                }
            }
            ObservedGpu {
                index,
                model,
                initial,
                initial_picture: geo.picture(initial),
                changes,
            }
        })
        .collect()
}

/// The jobs with their model and profile: the profile of their GPU's
/// model, or (no GPU recorded) of the first model that has it.
fn observed_jobs(
    raw: Vec<RawJob<'_>>,
    gpus: &[ObservedGpu],
) -> Result<Vec<ObservedJob>, AdviseError> {
    let models = GpuModel::distinct(&gpus.iter().map(|g| g.model).collect::<Vec<_>>());
    let mut jobs = Vec::with_capacity(raw.len());
    for (job_id, gpu, profile, submit, start, end, due) in raw {
        let (model, spec) = match gpu {
            Some(g) => {
                let model = gpus
                    .iter()
                    .find(|x| x.index == g)
                    .map(|x| x.model)
                    .ok_or(AdviseError::UnknownGpu { job_id, gpu: g })?;
                let spec = parse_profile(model.spec(), profile).map_err(|source| {
                    AdviseError::Profile {
                        job_id,
                        profile: profile.to_string(),
                        gpu: g,
                        model,
                        source,
                    }
                })?;
                (model, spec)
            }
            None => models
                .iter()
                .find_map(|&m| parse_profile(m.spec(), profile).ok().map(|p| (m, p)))
                .ok_or_else(|| AdviseError::ProfileNowhere {
                    job_id,
                    profile: profile.to_string(),
                    models: models.iter().map(|m| m.id()).collect::<Vec<_>>().join(", "),
                })?,
        };
        jobs.push(ObservedJob {
            job_id,
            gpu,
            profile: spec.name(),
            model,
            compute: spec.shape.compute,
            memory_gb: spec.memory_gb,
            submit,
            start,
            end,
            due,
        });
    }
    Ok(jobs)
}

fn count_advice(records: &[AdviceRecord], from: f64) -> AdviceCounts {
    let mut counts = AdviceCounts::default();
    let mut per_gpu: BTreeMap<u32, GpuAdvice> = BTreeMap::new();
    for r in records {
        if let AdviceRecord::Advice {
            t,
            gpu,
            policy,
            to,
            destroy,
            create,
            ..
        } = r
        {
            if *t < from {
                continue;
            }
            counts.total += 1;
            if !counts.policies.contains(policy) {
                counts.policies.push(policy.clone());
            }
            let g = per_gpu.entry(*gpu).or_insert_with(|| GpuAdvice {
                gpu: *gpu,
                ..GpuAdvice::default()
            });
            g.wishes += 1;
            g.destroy += destroy.len();
            g.create += create.len();
            g.last_wish.clone_from(to);
        }
    }
    counts.per_gpu = per_gpu.into_values().collect();
    counts
}

/// The layout the site ran, replayed: each GPU starts in its recorded
/// layout and is moved to each later recorded layout at the first epoch at
/// or after its time at which the change destroys no busy instance (an
/// admin's reshape waits for idle instances too).
#[derive(Clone, Debug)]
pub struct AsRun {
    initial: Vec<Layout>,
    /// Per GPU: (seconds since the origin, layout), in time order.
    changes: Vec<Vec<(f64, Layout)>>,
}

impl RepartitionPolicy for AsRun {
    fn name(&self) -> String {
        "as-run".to_string()
    }

    fn describe(&self) -> String {
        let changes: usize = self.changes.iter().map(Vec::len).sum();
        format!("the layouts the site ran, {changes} recorded change(s) replayed at their times")
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        layout_or_whole(&self.initial, gpu, geometry)
    }

    /// The replay reproduces what the site ran: the recorded layouts, on
    /// which every job waited for its own profile; building instances on
    /// demand on top of them would change what was observed.
    fn served_through_shards(&self) -> bool {
        false
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        let mut out = Vec::new();
        for (gpu, status) in view.gpus.iter().enumerate() {
            let Some(&first) = self.initial.get(gpu) else {
                continue;
            };
            let target = self
                .changes
                .get(gpu)
                .and_then(|c| c.iter().rev().find(|(t, _)| *t <= view.now))
                .map_or(first, |&(_, l)| l);
            if status.layout != target && status.accepts(target) {
                out.push(Decision { gpu, target });
            }
        }
        out
    }
}

/// How the replay runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayConfig {
    /// Seconds between the policy's epochs (the daemon's `epoch_s`).
    pub epoch_s: f64,
    /// Duration of one reconfiguration, s.
    pub reconfig_time_s: f64,
    /// Job order and instance choice in every row. Default `best-fit`
    /// (arrival order, the smallest instance that fits): what Slurm's typed
    /// GRES does under the as-run layout, and what smartmigd's allocation
    /// picks (`mig::select_profile`) under a dynamic policy.
    #[serde(serialize_with = "display")]
    pub heuristic: Heuristic,
    /// The jobs' speed-up curve (the log records none). Default linear.
    pub speedup: SpeedupCurve,
    /// Jobs run on instances of exactly their compute size in the as-run
    /// and policy rows ([`crate::sim::SimConfig::exact_size`]). Default
    /// `true`; `false` lets them start on any larger idle instance, as the
    /// rest of the yardstick does (the whole-GPU row always does, and so
    /// does a policy `none`: the simulator's `none` is whole GPUs, not
    /// smartmigd's instances made on demand).
    pub exact_size: bool,
    /// Weight of tardiness in ET.
    pub alpha: f64,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            epoch_s: 60.0,
            reconfig_time_s: crate::sim::DEFAULT_RECONFIG_TIME_S,
            heuristic: Heuristic::BestFit,
            speedup: SpeedupCurve::linear(),
            exact_size: true,
            alpha: 1.0,
        }
    }
}

/// What a row of the report is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// The layout the site ran: the opponent.
    AsRun,
    /// The policy the daemon is configured with (or `--policy`).
    Policy,
    /// Whole GPUs, for context.
    WholeGpus,
    /// `rolling-fit`, the opponent that needs no history (issue 54).
    NoHistory,
}

/// One replay of the observed jobs.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayRow {
    pub name: String,
    pub role: Role,
    pub description: String,
    pub metrics: Metrics,
    /// `(e + alpha t) / (1 + alpha)` against the whole-GPU row (energy and
    /// mean tardiness, tardiness floored as in [`Reference::pooled`]).
    pub et: f64,
    /// Relative change of energy against the as-run row (negative: less).
    pub energy_vs_as_run: f64,
    /// Mean wait minus the as-run row's, s.
    pub wait_vs_as_run_s: f64,
    /// The audited event log (for the plots; not in the JSON).
    #[serde(skip)]
    pub log: Vec<Record>,
}

/// The observed figures, straight from the log.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObservedStats {
    pub jobs: usize,
    pub mean_wait_s: f64,
    /// Nearest rank, as the simulator's.
    pub p95_wait_s: f64,
    pub late_jobs: usize,
    pub total_tardiness_s: f64,
    pub mean_tardiness_s: f64,
    pub layout_changes: usize,
}

/// How faithful the as-run replay is to what was observed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fidelity {
    /// Jobs the as-run replay ran on the profile they ran on.
    pub jobs_on_their_profile: usize,
    pub jobs: usize,
    /// Mean and worst `replayed run time / observed run time` (1 on their
    /// own profile; below 1 on a larger one).
    pub mean_run_time_ratio: f64,
    pub min_run_time_ratio: f64,
    /// Mean wait, observed and in the as-run replay, s.
    pub observed_mean_wait_s: f64,
    pub replayed_mean_wait_s: f64,
}

/// The whole report: rows (as-run first), observed figures, fidelity.
#[derive(Clone, Debug, Serialize)]
pub struct AdviseReport {
    pub observation: Observation,
    pub config: ReplayConfig,
    pub observed: ObservedStats,
    pub rows: Vec<ReplayRow>,
    pub fidelity: Fidelity,
    /// The ET exchange rate (the whole-GPU row's energy and tardiness).
    pub reference: Reference,
    /// Event logs re-checked by the audit.
    pub audited_logs: usize,
}

impl AdviseReport {
    /// The row of `role`.
    pub fn row(&self, role: Role) -> Option<&ReplayRow> {
        self.rows.iter().find(|r| r.role == role)
    }
}

fn audit_error(row: &str, failure: AuditFailure) -> AdviseError {
    let row = row.to_string();
    match failure {
        AuditFailure::Audit(source) => AdviseError::Audit { row, source },
        AuditFailure::Mismatch {
            what,
            audited,
            reported,
        } => AdviseError::AuditMismatch {
            row,
            what,
            audited,
            reported,
        },
    }
}

/// Replays the observed jobs under the as-run layout, `policy` and whole
/// GPUs, audits each event log, and compares (module section above).
pub fn replay(
    obs: &Observation,
    policy: &mut dyn RepartitionPolicy,
    cfg: &ReplayConfig,
) -> Result<AdviseReport, AdviseError> {
    let cluster = obs.cluster();
    let jobs = obs.sim_jobs(cfg.speedup);
    let sim_cfg = SimConfig {
        reconfig_time_s: cfg.reconfig_time_s,
        epoch: EpochRule::Seconds(cfg.epoch_s),
        seed: 0,
        workload_horizon_s: Some(obs.span_s()),
        // The log's times are Unix seconds: hours of day in UTC.
        start_hour: (obs.origin / 3600.0).rem_euclid(24.0),
        ..SimConfig::default()
    };
    let run = |role: Role, p: &mut dyn RepartitionPolicy| {
        let name = p.name();
        let sim_cfg = SimConfig {
            // `none` is whole GPUs in the simulator, whatever the row.
            exact_size: cfg.exact_size && role != Role::WholeGpus && name != "none",
            ..sim_cfg.clone()
        };
        let sim_err = |source| AdviseError::Sim {
            row: name.clone(),
            source,
        };
        let mut log = Collect::default();
        let mut h = cfg.heuristic.build(sim_cfg.seed);
        let r = simulate(
            &cluster,
            &jobs,
            h.as_mut(),
            p,
            &sim_cfg,
            RunHooks {
                sink: Some(&mut log),
                progress: None,
            },
        )
        .map_err(sim_err)?;
        let a = audit_run(&log.0, &r.metrics).map_err(|f| audit_error(&name, f))?;
        Ok::<_, AdviseError>((role, name, p.describe(), r.metrics, log.0, a))
    };
    let rolling = crate::eval::suite::ROLLING_FIT;
    let mut rolling_fit = crate::policy::parse_policy(rolling, &GpuModel::distinct(&cluster))
        .map_err(|source| AdviseError::Policy {
            row: rolling.to_string(),
            source,
        })?;
    let runs = [
        run(Role::AsRun, &mut obs.as_run())?,
        run(Role::Policy, policy)?,
        run(Role::WholeGpus, &mut NoPartition)?,
        run(Role::NoHistory, rolling_fit.as_mut())?,
    ];
    // One energy window and one charge for jobs that never ran (the rule
    // of `sim::metrics`), re-checked against the audit's own.
    let h = day_horizon(&runs[2].3);
    let mut charged = Vec::with_capacity(runs.len());
    for (role, name, description, metrics, log, a) in runs {
        let metrics = metrics.at_horizon(h);
        agrees(&a.at_horizon(h), &metrics).map_err(|f| audit_error(&name, f))?;
        charged.push((role, name, description, metrics, log));
    }
    let runs = charged;
    let reference = Reference::own(&runs[2].3, &jobs);
    let (base_energy, base_wait) = (runs[0].3.energy_j, runs[0].3.mean_wait_s);
    let fidelity = fidelity(obs, &runs[0].3, &runs[0].4);
    let rows: Vec<ReplayRow> = runs
        .into_iter()
        .map(|(role, name, description, metrics, log)| ReplayRow {
            et: reference.et_of(&metrics, cfg.alpha),
            energy_vs_as_run: if base_energy > 0.0 {
                metrics.energy_j / base_energy - 1.0
            } else {
                0.0
            },
            wait_vs_as_run_s: metrics.mean_wait_s - base_wait,
            name,
            role,
            description,
            metrics,
            log,
        })
        .collect();
    Ok(AdviseReport {
        observation: obs.clone(),
        config: cfg.clone(),
        observed: obs.observed(),
        audited_logs: rows.len(),
        rows,
        fidelity,
        reference,
    })
}

/// Compares the as-run replay's job records with the observed jobs.
fn fidelity(obs: &Observation, m: &Metrics, log: &[Record]) -> Fidelity {
    let mut on_profile = 0;
    let mut ratios = Vec::new();
    for r in log {
        if let Record::Job(j) = r {
            let Some(o) = usize::try_from(j.run.id).ok().and_then(|i| obs.jobs.get(i)) else {
                continue;
            };
            if j.run.profile == o.profile && j.run.compute == o.compute {
                on_profile += 1;
            }
            ratios.push((j.end - j.run.start) / o.run_s());
        }
    }
    let n = ratios.len().max(1) as f64;
    Fidelity {
        jobs_on_their_profile: on_profile,
        jobs: obs.jobs.len(),
        mean_run_time_ratio: if ratios.is_empty() {
            1.0
        } else {
            ratios.iter().sum::<f64>() / n
        },
        min_run_time_ratio: ratios.iter().copied().reduce(f64::min).unwrap_or(1.0),
        observed_mean_wait_s: obs.observed().mean_wait_s,
        replayed_mean_wait_s: m.mean_wait_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: GpuModel = GpuModel::A100_40gb;

    fn layout(picture: &str) -> u32 {
        let g = Geometry::of(M);
        g.layouts()
            .iter()
            .find(|&&l| g.picture(l) == picture)
            .map(|l| l.0)
            .unwrap_or_else(|| panic!("{picture} is not an A100-40GB layout"))
    }

    fn whole() -> String {
        let g = Geometry::of(M);
        g.picture(g.whole_gpu())
    }

    fn layout_at(t: f64, gpu: u32, picture: &str) -> AdviceRecord {
        AdviceRecord::Layout {
            t,
            gpu,
            model: M,
            layout: layout(picture),
            picture: picture.into(),
        }
    }

    fn job(job_id: u64, profile: &str, submit: f64, start: f64, end: f64) -> AdviceRecord {
        AdviceRecord::Job {
            job_id,
            gpu: Some(0),
            profile: profile.into(),
            submit,
            start,
            end,
            time_limit_s: Some(3600),
            deadline: None,
        }
    }

    /// Job runs of a replay's event log: id -> (profile, start, end).
    fn runs(log: &[Record]) -> BTreeMap<u64, (String, f64, f64)> {
        log.iter()
            .filter_map(|r| match r {
                Record::Job(j) => Some((j.run.id, (j.run.profile.clone(), j.run.start, j.end))),
                _ => None,
            })
            .collect()
    }

    fn as_run(r: &AdviseReport) -> &ReplayRow {
        r.row(Role::AsRun).unwrap()
    }

    #[test]
    fn the_as_run_replay_gives_the_observed_run_times_back() {
        // 4g.20gb + 3g.20gb; one job at a time, each on its own profile.
        let mut records = vec![layout_at(0.0, 0, "4444|3333")];
        let observed = [
            (1, "3g.20gb", 1000.0, 1030.0, 2230.0),
            (2, "4g.20gb", 1500.0, 1500.0, 1800.0),
            (3, "3g.20gb", 4000.0, 4000.0, 4123.5),
        ];
        for &(id, p, a, b, c) in &observed {
            records.push(job(id, p, a, b, c));
        }
        let obs = observe(&records, None).unwrap();
        assert_eq!(obs.origin, 1000.0);
        assert_eq!(obs.span_s(), 3123.5);
        let r = replay(&obs, &mut NoPartition, &ReplayConfig::default()).unwrap();
        let runs = runs(&as_run(&r).log);
        for (i, &(_, p, a, b, c)) in observed.iter().enumerate() {
            let (profile, start, end) = &runs[&(i as u64)];
            assert_eq!(profile, p);
            assert_eq!(*start, a - 1000.0, "job {i} starts at once");
            assert!(
                ((end - start) - (c - b)).abs() < 1e-9,
                "job {i}: {} vs {}",
                end - start,
                c - b
            );
        }
        let f = &r.fidelity;
        assert_eq!((f.jobs_on_their_profile, f.jobs), (3, 3));
        assert!(
            (f.mean_run_time_ratio - 1.0).abs() < 1e-12
                && (f.min_run_time_ratio - 1.0).abs() < 1e-12,
            "{f:?}"
        );
        // Observed waits were 30, 0, 0 s; the replay starts each at once.
        assert!((r.observed.mean_wait_s - 10.0).abs() < 1e-9);
        assert_eq!(as_run(&r).metrics.mean_wait_s, 0.0);
        assert_eq!(as_run(&r).metrics.reconfigurations, 0);
        assert_eq!(r.audited_logs, 4);
        // Whole GPUs: every job on 7g, faster by the linear curve.
        let none = r.row(Role::WholeGpus).unwrap();
        assert_eq!(none.metrics.completed, 3);
        assert!(none.energy_vs_as_run.is_finite());
    }

    #[test]
    fn a_job_waits_for_its_own_size_as_under_typed_gres() {
        // Two 3g jobs at once on 4444|3333: Slurm made the second wait for
        // the 3g instance; so does the replay, though the 4g one is idle.
        let records = vec![
            layout_at(0.0, 0, "4444|3333"),
            job(1, "3g.20gb", 100.0, 100.0, 500.0),
            job(2, "3g.20gb", 100.0, 500.0, 900.0),
        ];
        let obs = observe(&records, None).unwrap();
        let r = replay(&obs, &mut NoPartition, &ReplayConfig::default()).unwrap();
        let f = &r.fidelity;
        assert_eq!(f.jobs_on_their_profile, 2, "{f:?}");
        assert_eq!((f.min_run_time_ratio, f.mean_run_time_ratio), (1.0, 1.0));
        assert_eq!(
            (f.observed_mean_wait_s, f.replayed_mean_wait_s),
            (200.0, 200.0)
        );
        // Work-conserving instead: the second job takes the idle 4g
        // instance at once and runs 3/4 as long (linear curve).
        let loose = ReplayConfig {
            exact_size: false,
            ..ReplayConfig::default()
        };
        let f = replay(&obs, &mut NoPartition, &loose).unwrap().fidelity;
        assert_eq!(f.jobs_on_their_profile, 1, "{f:?}");
        assert!((f.min_run_time_ratio - 0.75).abs() < 1e-9, "{f:?}");
        assert_eq!(f.replayed_mean_wait_s, 0.0);
        // Whole GPUs run every job on the 7g instance: 3/7 of the time.
        let none = r.row(Role::WholeGpus).unwrap();
        let (_, start, end) = runs(&none.log)[&0].clone();
        assert!(((end - start) - 400.0 * 3.0 / 7.0).abs() < 1e-9);
    }

    #[test]
    fn the_window_keeps_jobs_submitted_since_and_the_layout_before_it() {
        let records = vec![
            layout_at(0.0, 0, "4444|3333"),
            layout_at(50.0, 1, &whole()),
            job(1, "3g.20gb", 100.0, 100.0, 200.0),
            job(2, "4g.20gb", 5000.0, 5010.0, 5200.0),
        ];
        let all = observe(&records, None).unwrap();
        assert_eq!(all.jobs.len(), 2);
        let recent = observe(&records, Some(1000.0)).unwrap();
        assert_eq!(
            recent.jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(),
            [2]
        );
        assert_eq!((recent.origin, recent.end), (5000.0, 5200.0));
        // GPU 1's layout was recorded before the window: it still counts.
        let pics: Vec<&str> = recent
            .gpus
            .iter()
            .map(|g| g.initial_picture.as_str())
            .collect();
        assert_eq!(pics, ["4444|3333", whole().as_str()]);
        assert_eq!(recent.cluster(), [M, M]);
        // Nothing submitted since: an error that says so.
        let e = observe(&records, Some(6000.0)).unwrap_err();
        assert!(matches!(e, AdviseError::NoJobs { total: 2, .. }), "{e}");
        assert!(
            e.to_string()
                .contains("no observed jobs submitted at or after Unix time 6000"),
            "{e}"
        );
    }

    #[test]
    fn a_layout_change_mid_window_is_replayed_at_its_time() {
        // 4444|3333 until t = 3600, then the whole GPU, which the 7g job
        // submitted at 3700 needs.
        let records = vec![
            layout_at(0.0, 0, "4444|3333"),
            job(1, "3g.20gb", 100.0, 100.0, 200.0),
            layout_at(3600.0, 0, &whole()),
            job(2, "7g.40gb", 3700.0, 3700.0, 4700.0),
            // The same layout again is not a change.
            layout_at(4000.0, 0, &whole()),
        ];
        let obs = observe(&records, None).unwrap();
        assert_eq!(obs.layout_changes(), 1);
        assert_eq!(obs.gpus[0].changes[0].t, 3600.0);
        let r = replay(&obs, &mut NoPartition, &ReplayConfig::default()).unwrap();
        let a = as_run(&r);
        assert_eq!(a.metrics.reconfigurations, 1);
        assert_eq!(a.metrics.completed, 2);
        // Reconfigured at the first epoch after 3500 s (sim time), ready
        // 4 s later: before the 7g job arrives at 3600 s.
        let reconfig = a
            .log
            .iter()
            .find_map(|r| match r {
                Record::Reconfig(c) => Some(c.time),
                _ => None,
            })
            .unwrap();
        assert!((3500.0..3560.0).contains(&reconfig), "{reconfig}");
        let (profile, start, end) = runs(&a.log)[&1].clone();
        assert_eq!((profile.as_str(), start, end), ("7g.40gb", 3600.0, 4600.0));
        // Without the change the 7g job could never have run there.
        let stuck = observe(&records[..2], None).unwrap();
        assert_eq!(stuck.layout_changes(), 0);
    }

    #[test]
    fn the_policy_row_runs_and_the_advice_is_counted() {
        // The 1g jobs ran on 1|1|22|3333's two 1g instances.
        let mut records = vec![layout_at(0.0, 0, "1|1|22|3333")];
        for i in 0..6u64 {
            let t = 100.0 * i as f64;
            records.push(job(i, "1g.5gb", t, t + 10.0, t + 610.0));
        }
        records.push(AdviceRecord::Advice {
            t: 150.0,
            gpu: 0,
            policy: "greedy".into(),
            from: "1|1|22|3333".into(),
            to: "1|1|1|1|1|1|1|.".into(),
            to_layout: 0,
            destroy: vec!["2g.10gb@2".into(), "3g.20gb@4".into()],
            create: vec!["1g.5gb@0".into(); 7],
            keeps_busy: vec![],
        });
        let obs = observe(&records, None).unwrap();
        assert_eq!(obs.advice.total, 1);
        assert_eq!(obs.advice.per_gpu[0].wishes, 1);
        assert_eq!(
            (obs.advice.per_gpu[0].destroy, obs.advice.per_gpu[0].create),
            (2, 7)
        );
        assert_eq!(obs.advice.policies, ["greedy"]);
        let mut greedy = crate::policy::parse_policy("greedy", &[M]).unwrap();
        let r = replay(&obs, greedy.as_mut(), &ReplayConfig::default()).unwrap();
        let names: Vec<&str> = r.rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["as-run", "greedy", "none", "rolling-fit"]);
        assert!(
            r.rows.iter().all(|r| r.metrics.completed == 6),
            "{:?}",
            r.rows
                .iter()
                .map(|r| r.metrics.completed)
                .collect::<Vec<_>>()
        );
        assert_eq!(as_run(&r).energy_vs_as_run, 0.0);
        // The table names the opponent and the verdict compares with it.
        let text = crate::report::advise::table(&r, "test");
        assert!(
            text.contains("as-run (opponent)") && text.contains("greedy (policy)"),
            "{text}"
        );
        assert!(text.contains("GPU 0: 1 reshape(s) wanted"), "{text}");
        // A static layout without 1g instances never runs these jobs: the
        // verdict says so before its (smaller) energy can flatter it.
        let mut no_1g = crate::policy::parse_policy("static:4444|3333", &[M]).unwrap();
        let r = replay(&obs, no_1g.as_mut(), &ReplayConfig::default()).unwrap();
        assert_eq!(r.row(Role::Policy).unwrap().metrics.unserved, 6);
        let verdict = crate::report::advise::verdict(&r);
        assert!(
            verdict[0].starts_with("WORSE: 6 job(s) never ran under static:4444|3333"),
            "{verdict:?}"
        );
    }

    #[test]
    fn bad_records_are_refused_with_what_is_wrong() {
        let e = parse_log("\n{\"kind\":\"layout\"}\n").unwrap_err();
        assert!(
            e.to_string().starts_with("line 2: not an advice record"),
            "{e}"
        );
        let ok = layout_at(0.0, 0, "4444|3333");
        let line = serde_json::to_string(&ok).unwrap();
        assert_eq!(parse_log(&format!("{line}\n\n{line}\n")).unwrap().len(), 2);
        // A profile the A100-40GB does not have.
        let e = observe(&[ok.clone(), job(9, "3g.40gb", 0.0, 1.0, 2.0)], None).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("job 9: profile `3g.40gb` on GPU 0 (a100-40gb)")
                && text.contains("3g.20gb"),
            "{text}"
        );
        // A GPU without a Layout record.
        let mut on_gpu_3 = job(4, "1g.5gb", 0.0, 1.0, 2.0);
        if let AdviceRecord::Job { gpu, .. } = &mut on_gpu_3 {
            *gpu = Some(3);
        }
        let e = observe(&[ok.clone(), on_gpu_3], None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "job 4: it ran on GPU 3, which has no Layout record"
        );
        let e = observe(&[ok.clone(), job(5, "1g.5gb", 10.0, 20.0, 15.0)], None).unwrap_err();
        assert!(
            e.to_string()
                .contains("job 5: it ends (15) before it starts (20)"),
            "{e}"
        );
        let e = observe(&[job(5, "1g.5gb", 10.0, 20.0, 25.0)], None).unwrap_err();
        assert!(matches!(e, AdviseError::NoLayouts), "{e}");
        let bad = AdviceRecord::Layout {
            t: 0.0,
            gpu: 0,
            model: M,
            layout: u32::MAX,
            picture: "?".into(),
        };
        let e = observe(&[bad], None).unwrap_err();
        assert!(
            e.to_string().contains("is not a valid a100-40gb layout"),
            "{e}"
        );
    }
}
