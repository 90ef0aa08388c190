//! The discrete-event cluster simulator.
//!
//! N GPUs (models may be mixed), each with a MIG layout; jobs arrive, wait in
//! a queue, run on one instance each, complete; a [`RepartitionPolicy`]
//! reshapes the layouts at decision epochs. `docs/simulator.md` is the full
//! description; in short:
//!
//! - **Fit.** A job runs only on an instance whose profile memory (GB in the
//!   profile name) is at least its need and, if it requested `K` slices,
//!   whose compute slices are at least `K` (exactly `K` with
//!   [`SimConfig::exact_size`]). It runs for `work / speed(k)`
//!   (`work` = seconds on the whole GPU), without interruption.
//! - **Placement.** Work-conserving: whenever a free, ready instance fits a
//!   waiting job, the [`heuristics`] (or a learned placement,
//!   [`placement_onnx`]) choose which job and which instance.
//! - **On demand** (issue 54). For a policy smartmig runs
//!   ([`RepartitionPolicy::served_through_shards`]), a waiting job that no
//!   free instance fits gets one built as smartmigd's allocate builds it
//!   ([`crate::mig::Geometry::serve`]: create its smallest fitting profile
//!   in free space, else re-shape idle instances), on the first GPU that
//!   can without destroying anything, else the one that destroys fewest;
//!   it runs when the instance is ready. No such job waits on a GPU whose
//!   idle instances could be re-shaped for it; the policy decides what is
//!   prepared ahead of demand. The opponents that stand for a site without
//!   smartmig (`none`, fixed layouts: Slurm's own GRES types) wait for a
//!   matching slot.
//! - **Reconfiguration.** Only idle instances may be destroyed. Applying a
//!   decision takes [`SimConfig::reconfig_time_s`] (default 4 s, as in
//!   SMART-MIG): destroyed instances vanish at once, created ones exist but
//!   run nothing until the end; one reconfiguration per GPU at a time.
//!   Decisions that break these rules are rejected and counted.
//! - **Energy.** Every GPU, idle included, from 0 to the horizon
//!   `max(workload horizon, last completion)`: `power_w(load)` integrated
//!   exactly (load is piecewise constant between job starts and ends).
//! - **Out of memory** (only with [`SimConfig::oom`]): instances are chosen
//!   by the declared memory or a learned estimate; a job whose instance is
//!   smaller than its true need fails part-way, its partial run's energy is
//!   counted, and it is requeued for the next larger memory size; with an
//!   early-restart rule, a run whose memory trend predicts an overflow is
//!   requeued the same way before it fails.
//! - **Order of simultaneous events.** Completions, then reconfiguration
//!   ends, then epoch ticks, then arrivals (by id); then placement; then the
//!   decision epoch, if due.
//!
//! The run can write an auditable event log ([`events`]) that [`audit`]
//! re-checks from scratch, and from which [`waste`] counts the instances
//! reconfigurations created in vain.

pub mod audit;
pub mod deferral;
pub mod engine;
pub mod events;
mod gang;
pub mod heuristics;
pub mod lookahead;
pub mod metrics;
pub mod placement;
pub mod placement_features;
pub mod placement_onnx;
pub mod reshape;
pub mod slurm_like;
pub mod waste;

pub use crate::workload::{EarlyRestartRule, MemoryGrowth};
pub use audit::{audit, read_events, AuditError, AuditReport};
pub use engine::{RunHooks, SimResult};
pub use events::{Collect, EventSink, JsonLines, Record};
pub use heuristics::{
    Candidate, Heuristic, Pick, PlacementContext, PlacementHeuristic, UnknownHeuristic,
};
pub use metrics::{
    common_horizon, day_horizon, mean_work_s, never_ran_charge, ChargeBasis, EtScore, Metrics,
    NeverRan, Reference, Standing,
};
pub use placement::{PlacementSpec, PlacementSpecError};
pub use reshape::{classify, ReconfigKind};
pub use slurm_like::SlurmLike;
pub use waste::{count_waste, Waste};

use crate::mig::{select_profile, GpuModel, ProfileSpec};
use crate::policy::RepartitionPolicy;
use crate::workload::{Job, PowerModel, WorkloadError};

/// Repartitioning time of SMART-MIG (s).
pub const DEFAULT_RECONFIG_TIME_S: f64 = 4.0;
/// Arrival/completion events between decision epochs in SMART-MIG.
pub const DEFAULT_EPOCH_EVENTS: u32 = 5;
/// GPUs of one node (one smartmigd): the unit of
/// [`EpochRule::per_node_events`].
pub const NODE_GPUS: usize = 8;

/// When the policy is asked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EpochRule {
    /// After every `n` arrival or completion events (n >= 1).
    Events(u32),
    /// Every `s` seconds of simulated time (s > 0).
    Seconds(f64),
}

impl EpochRule {
    /// `events` arrival or completion events per node of [`NODE_GPUS`]
    /// GPUs: `Events(events * ceil(gpus / 8))`, so each GPU is asked at the
    /// same rate in simulated time whatever the cluster's size. A fixed
    /// `Events(5)` asks every GPU of a 1,000-GPU cluster 125 times as often
    /// as on one 8-GPU node (the policies are trained on 4 to 16 GPUs with
    /// `Events(5)`), and makes the cost per job grow with the cluster.
    /// Identical to `Events(events)` up to 8 GPUs.
    pub fn per_node_events(events: u32, gpus: usize) -> EpochRule {
        let nodes = gpus.div_ceil(NODE_GPUS).max(1);
        EpochRule::Events(events.saturating_mul(u32::try_from(nodes).unwrap_or(u32::MAX)))
    }
}

/// Parameters of a run that are not the workload, the heuristic or the policy.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Duration of one reconfiguration, s (>= 0).
    pub reconfig_time_s: f64,
    pub epoch: EpochRule,
    /// Recorded in the event log; the engine itself draws nothing random
    /// (the `random` heuristic is seeded when built).
    pub seed: u64,
    /// The workload's horizon (the diurnal generator's window). `None`: the
    /// last arrival.
    pub workload_horizon_s: Option<f64>,
    /// Hour of day at time 0 (for the policy view).
    pub start_hour: f64,
    /// Power models overriding [`PowerModel::default_for`].
    pub power: Vec<(GpuModel, PowerModel)>,
    /// Out-of-memory mode. `None` (default): instances are chosen by the
    /// true memory need (an oracle scheduler; `declared_memory_gb` is
    /// ignored), so no job ever runs out of memory.
    pub oom: Option<OomConfig>,
    /// A job that requested `K` compute slices runs only on instances of
    /// exactly `K` (what smartmigd's allocation hands out, and what Slurm's
    /// typed GRES does), never on a larger idle one. Default `false`: any
    /// instance of at least `K` (work-conserving). Jobs without a request
    /// are not affected. The audit checks the looser rule only.
    pub exact_size: bool,
    /// Model the deployment (issue 42): Slurm places jobs by counting
    /// shards and smartmigd builds their instances afterwards, requeueing
    /// a job it cannot serve ([`slurm_like`]). `None` (default): the
    /// central view, where a job starts only on an instance that fits.
    /// Policies Slurm serves with its own GRES (whole GPUs, fixed layouts)
    /// run in the central view either way.
    pub slurm: Option<SlurmLike>,
    /// Serve the jobs of a policy smartmig runs as smartmigd does (issue
    /// 54; the module docs' "On demand"): default `true`. `false` is the
    /// engine before issue 54, where every policy's jobs take any instance
    /// that fits and wait for the policy; kept to measure what on-demand
    /// service changed, and for studies whose figures were measured so
    /// (the OOM study's early-restart comparison).
    pub serve_on_demand: bool,
}

/// Share of the run time after which an out-of-memory job fails.
pub const DEFAULT_OOM_FAIL_FRACTION: f64 = 0.3;
/// Restarts after out-of-memory failures before a job is given up.
pub const DEFAULT_OOM_MAX_RETRIES: u32 = 3;
/// Seconds between two memory samples of a running job (smartmigd's
/// `memory.sample_s`), read by the early-restart rule.
pub const DEFAULT_MEMORY_SAMPLE_S: f64 = 5.0;

/// The out-of-memory mode (`docs/oom-and-memory.md`): instances are chosen
/// by the *declared* memory (or a learned estimate); a job on an instance
/// with less memory than its true need fails where its memory use crosses
/// the instance's (`Job::memory_growth`; without one, after `fail_fraction`
/// of its run time there) and is requeued asking for the next larger
/// memory size, at most `max_retries` times. With `early_restart`, a run
/// whose sampled use the rule predicts will overflow is restarted the same
/// way at once (issue 24).
#[derive(Clone, Debug, PartialEq)]
pub struct OomConfig {
    /// In (0, 1]. Default 0.3: OOMs hit at the first big allocation (model
    /// load, first batch, first evaluation or checkpoint), usually early but
    /// not at once; 0.3 is an assumption, not a measurement.
    pub fail_fraction: f64,
    /// Restarts allowed after OOM failures (0: the first OOM rejects the job).
    pub max_retries: u32,
    /// Learn memory estimates for jobs that declare nothing
    /// ([`crate::workload::MemoryEstimator`]); `None`: such jobs ask for
    /// the smallest profile.
    pub estimate: Option<crate::workload::EstimatorConfig>,
    /// Restart a run before it fails when this rule, fed a sample of its
    /// memory use every `sample_s`, predicts an overflow
    /// ([`crate::workload::EarlyRestartRule::first_restart`]). Every run is
    /// watched, also those that fit: a restart of one of those is a false
    /// early restart (counted). An early restart counts as one of the
    /// `max_retries` restarts and teaches the estimator nothing (it is a
    /// prediction, not a bound). `None`: runs fail or complete.
    pub early_restart: Option<crate::workload::EarlyRestartRule>,
    /// Seconds between memory samples (> 0; default 5, the daemon's).
    pub sample_s: f64,
}

impl Default for OomConfig {
    fn default() -> Self {
        OomConfig {
            fail_fraction: DEFAULT_OOM_FAIL_FRACTION,
            max_retries: DEFAULT_OOM_MAX_RETRIES,
            estimate: None,
            early_restart: None,
            sample_s: DEFAULT_MEMORY_SAMPLE_S,
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            reconfig_time_s: DEFAULT_RECONFIG_TIME_S,
            epoch: EpochRule::Events(DEFAULT_EPOCH_EVENTS),
            seed: 0,
            workload_horizon_s: None,
            start_hour: 0.0,
            power: Vec::new(),
            oom: None,
            exact_size: false,
            slurm: None,
            serve_on_demand: true,
        }
    }
}

impl SimConfig {
    /// The power model used for `model`.
    pub fn power_for(&self, model: GpuModel) -> PowerModel {
        self.power
            .iter()
            .find(|(m, _)| *m == model)
            .map_or_else(|| PowerModel::default_for(model), |&(_, p)| p)
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |what: String| Err(SimError::Config(what));
        if !(self.reconfig_time_s.is_finite() && self.reconfig_time_s >= 0.0) {
            return bad(format!(
                "reconfiguration time {} s is not a finite value >= 0",
                self.reconfig_time_s
            ));
        }
        match self.epoch {
            EpochRule::Events(0) => return bad("epoch every 0 events".into()),
            EpochRule::Seconds(s) if !(s.is_finite() && s > 0.0) => {
                return bad(format!("epoch every {s} s is not a finite value > 0"))
            }
            _ => {}
        }
        if let Some(h) = self.workload_horizon_s {
            if !(h.is_finite() && h >= 0.0) {
                return bad(format!("workload horizon {h} s is not finite and >= 0"));
            }
        }
        if !self.start_hour.is_finite() {
            return bad(format!("start hour {} is not finite", self.start_hour));
        }
        if let Some(s) = &self.slurm {
            s.validate().map_err(|e| SimError::Config(e.to_string()))?;
            if self.oom.is_some() {
                return bad("the Slurm-like mode does not model out-of-memory restarts".into());
            }
        }
        if let Some(o) = &self.oom {
            if !(o.fail_fraction > 0.0 && o.fail_fraction <= 1.0) {
                return bad(format!(
                    "out-of-memory fail fraction {} is not in (0, 1]",
                    o.fail_fraction
                ));
            }
            if o.max_retries > 64 {
                return bad(format!("{} out-of-memory retries (max 64)", o.max_retries));
            }
            if let Some(e) = &o.estimate {
                e.validate().map_err(|e| SimError::Config(e.to_string()))?;
            }
            if !(o.sample_s.is_finite() && o.sample_s > 0.0) {
                return bad(format!(
                    "memory sample period {} s is not a finite value > 0",
                    o.sample_s
                ));
            }
            if let Some(r) = &o.early_restart {
                r.validate().map_err(|e| SimError::Config(e.to_string()))?;
            }
        }
        Ok(())
    }
}

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("the cluster has no GPUs")]
    NoGpus,
    #[error("invalid simulation setting: {0}")]
    Config(String),
    #[error("job {id}: {reason}")]
    InvalidJob { id: u64, reason: String },
    #[error("{0} jobs are more than the simulator indexes (u32)")]
    TooManyJobs(usize),
    #[error("power model of {model}: {source}")]
    Power {
        model: GpuModel,
        source: WorkloadError,
    },
    #[error("policy {policy} gave GPU {gpu} an invalid initial layout")]
    InvalidInitialLayout { gpu: usize, policy: String },
    #[error("writing the event log: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Placement(#[from] crate::policy::onnx::PolicyLoadError),
    #[error("internal error: {0}")]
    Internal(&'static str),
}

/// Simulates `jobs` on the GPUs of `cluster` (one entry per GPU): in the
/// Slurm-like mode ([`slurm_like`]) when the configuration asks for it and
/// the policy is served through shards, else in the central engine
/// ([`engine`]). Both engines sit below this choice, and the Slurm-like
/// mode borrows the central engine's helpers, never the other way.
///
/// Jobs may come in any order (they are processed by arrival, then id).
/// Errors: an empty cluster, an invalid job or configuration, or a failing
/// event sink. Deterministic: same inputs, same result and same records.
pub fn simulate(
    cluster: &[GpuModel],
    jobs: &[Job],
    heuristic: &mut dyn PlacementHeuristic,
    policy: &mut dyn RepartitionPolicy,
    cfg: &SimConfig,
    hooks: RunHooks<'_>,
) -> Result<SimResult, SimError> {
    cfg.validate()?;
    if cluster.is_empty() {
        return Err(SimError::NoGpus);
    }
    if let Some(slurm) = cfg
        .slurm
        .as_ref()
        .filter(|_| policy.served_through_shards())
    {
        return slurm_like::simulate(cluster, jobs, heuristic, policy, cfg, slurm, hooks);
    }
    engine::simulate_central(cluster, jobs, heuristic, policy, cfg, hooks)
}

/// Runs `policy` and, with the same placement, the `none` reference (whole
/// GPUs), charges both at their common horizon (`metrics`, the rule for
/// jobs that never ran) and scores the first against the second: a single
/// workload has no past days, so `T_ref` is `none`'s own, floored
/// ([`Reference::own`]). Returns (run, reference, score).
pub fn simulate_with_reference(
    cluster: &[GpuModel],
    jobs: &[crate::workload::Job],
    placement: &PlacementSpec,
    policy: &mut dyn RepartitionPolicy,
    cfg: &SimConfig,
    alpha: f64,
    hooks: RunHooks<'_>,
) -> Result<(SimResult, SimResult, EtScore), SimError> {
    let model = learned_model(cluster);
    let mut h = placement.build(cfg.seed, model)?;
    let run = simulate(cluster, jobs, h.as_mut(), policy, cfg, hooks)?;
    let mut h = placement.build(cfg.seed, model)?;
    let mut none = crate::policy::NoPartition;
    let reference = simulate(
        cluster,
        jobs,
        h.as_mut(),
        &mut none,
        cfg,
        RunHooks::default(),
    )?;
    let (mut run, mut reference) = (run, reference);
    let h = common_horizon([&run.metrics, &reference.metrics]);
    run.metrics = run.metrics.at_horizon(h);
    reference.metrics = reference.metrics.at_horizon(h);
    let rate = Reference::own(&reference.metrics, jobs);
    let name = format!(
        "none (every GPU one whole-GPU instance) + {placement}, this workload's own run (no past days){}",
        if rate.floored() {
            format!(", T_ref floored at {:.1} s", rate.floor_s)
        } else {
            String::new()
        }
    );
    let score = EtScore::new(&run.metrics, &rate, name, alpha);
    Ok((run, reference, score))
}

/// The model a learned placement must be for on `cluster`: its model when
/// it has one, `None` (whatever the file names; other models fall back to
/// best-fit) when it mixes models.
pub fn learned_model(cluster: &[GpuModel]) -> Option<GpuModel> {
    match GpuModel::distinct(cluster).as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// The profile a job gets on `model` in a deployment, where every job asks
/// Slurm for K shards: its own `requested_slices`; for a job that leaves
/// the size open (either engine lets it take any free instance that fits; this is what
/// is built for it on demand), the
/// K a user who knows the job would ask for, as the diurnal generator
/// draws the requesting jobs' sizes: the smallest profile that holds its
/// memory and meets its deadline if started at once, else the whole GPU.
/// Then smartmigd's choice for K and the memory (`select_profile`), built
/// and billed as the default profile of the room it takes
/// ([`crate::mig::ModelSpec::room_profile`]: `2g.10gb` where the memory
/// needs `1g.10gb`).
pub fn asked_profile(job: &Job, model: GpuModel) -> Option<&'static ProfileSpec> {
    asked_variant(job, model).map(|p| model.spec().room_profile(p))
}

/// [`asked_profile`] before issue 55: the smallest profile for K and the
/// memory, memory variants included (`1g.10gb`), billed its compute
/// slices. Kept for the Slurm-like engine's `bill=compute` what-if.
pub fn asked_variant(job: &Job, model: GpuModel) -> Option<&'static ProfileSpec> {
    let spec = model.spec();
    // A gang job needs every GPU it spans whole.
    let whole = job.is_gang().then_some(spec.compute_slices);
    let k = whole.or(job.requested_slices).unwrap_or_else(|| {
        let mut sizes: Vec<&ProfileSpec> = spec.profiles.iter().collect();
        sizes.sort_by_key(|p| (p.shape.compute, p.memory_gb));
        sizes
            .iter()
            .find(|p| {
                job.memory_gb <= f64::from(p.memory_gb)
                    && job.runtime_on(p.shape.compute, spec.compute_slices)
                        <= job.deadline - job.arrival
            })
            .map_or(spec.compute_slices, |p| p.shape.compute)
    });
    select_profile(spec, k.max(1), Some(job.memory_gb)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_node_cadence_scales_with_nodes_and_keeps_small_clusters() {
        for (gpus, n) in [(0, 5), (1, 5), (8, 5), (9, 10), (100, 65), (1000, 625)] {
            assert_eq!(
                EpochRule::per_node_events(5, gpus),
                EpochRule::Events(n),
                "{gpus}"
            );
        }
        assert_eq!(
            EpochRule::per_node_events(u32::MAX, 16),
            EpochRule::Events(u32::MAX)
        );
    }
}
