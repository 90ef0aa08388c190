//! The throughput experiment (issue 24, part 3; `docs/oom-and-memory.md`,
//! section 7): a bag of jobs at t = 0 run three ways, side by side with the
//! headline ratios of "Managing MIG for throughput and energy" (arXiv
//! 2508.18556, measured on one A100).
//!
//! **Bags** (deterministic per seed, every job at t = 0, as the yardstick's
//! `batch` family):
//!
//! - [`Bag::Ml`]: a third each of small-batch inference (ViT and ResNet-50,
//!   batch 1-8), large-batch inference (batch 16-256) and BERT-base training
//!   (batch 8-256, sequence 64); each job's speed-up curve is the
//!   MIGProfiler fit of its (model, batch) ([`MIGPROFILER_FITS`]) and its
//!   memory the framebuffer use measured there ([`MIGPROFILER_MEMORY_MIB`]).
//! - [`Bag::Scientific`]: kernels that use a small part of the GPU: speed
//!   saturating between 0.10 and 0.30 of the GPU (at or near a 1g or 2g
//!   slice), 0.5-8 GB of memory. A *model* of the study's description, not
//!   data.
//!
//! An LLM-inference bag is left out: no measured MIG curve or memory of an
//! LLM exists in the project's data, so its ratios would be an invention
//! (the docs give the argument).
//!
//! **Arms**, all with the same bag, placement heuristic and out-of-memory
//! mode (declared memory, restart on a bigger slice, learned estimates):
//!
//! - `whole-gpu`: every GPU one `7g` instance, one job at a time (the
//!   study's baseline);
//! - `static-other-bags`: the best static assignment of the project's
//!   static search ([`static_best`]) **on training bags only** (seeds
//!   disjoint from the scored ones), applied unchanged: what an admin would
//!   choose from past bags, the opponent;
//! - one row per dynamic policy (`greedy`; `greedy-from-static`, greedy
//!   started from the opponent's layout, [`resolve_static_init`]; the
//!   learned policy, added by the CLI): re-shapes while the bag runs
//!   (fusion and fission, counted by the simulator);
//! - `static-hindsight` (optional): the same search on the scored bag
//!   itself, a reference that knew the bag, never the opponent.
//!
//! Ratios are against `whole-gpu` on the same bag: throughput (jobs/h)
//! ratio, and energy-per-job improvement `energy per job (whole-gpu) /
//! energy per job (arm)` (the study's "x energy improvement"). Pure: no IO.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::mig::GpuModel;
use crate::policy::search::{describe_assignment, static_best, SearchConfig};
use crate::policy::{parse_policy, NoPartition, RepartitionPolicy};
use crate::scenario::{BatchConfig, DeadlineRegime, Family, Scenario};
use crate::sim::{
    simulate, Heuristic, Metrics, OomConfig, RunHooks, SimConfig, SimError, Standing,
};
use crate::workload::declare::{underdeclare, Underdeclare};
use crate::workload::speedup::MIGPROFILER_FITS;
use crate::workload::{DiurnalConfig, Job, JobClass, SpeedupCurve, WorkDist, WorkloadError};

/// Framebuffer use (MiB, `fb_used_mean`) of each MIGProfiler run on
/// `7g.80gb` (A100-80GB), as `(model, batch size, MiB)`: the largest of the
/// four profiles for every row, so the memory a job of that kind needs.
/// Re-derived from the copied CSVs by the test
/// `memory_table_matches_the_migprofiler_data`.
pub const MIGPROFILER_MEMORY_MIB: &[(&str, u32, f64)] = &[
    ("vision_transformer", 1, 2052.426),
    ("vision_transformer", 2, 2047.951),
    ("vision_transformer", 4, 2088.59),
    ("vision_transformer", 8, 2146.607),
    ("vision_transformer", 16, 2255.459),
    ("vision_transformer", 32, 2449.492),
    ("vision_transformer", 64, 2829.852),
    ("vision_transformer", 128, 3597.262),
    ("vision_transformer", 256, 5198.82),
    ("resnet50", 1, 1805.852),
    ("resnet50", 2, 1806.918),
    ("resnet50", 4, 1825.246),
    ("resnet50", 8, 1888.295),
    ("resnet50", 16, 2002.246),
    ("resnet50", 32, 2317.656),
    ("resnet50", 64, 2847.18),
    ("resnet50", 128, 3907.049),
    ("resnet50", 256, 6056.0),
    ("bert-base", 8, 4817.77),
    ("bert-base", 16, 4726.0),
    ("bert-base", 32, 5346.0),
    ("bert-base", 64, 6636.0),
    ("bert-base", 128, 9248.0),
    ("bert-base", 256, 14452.0),
];

/// Deadline of every bag job, s after t = 0. The study's bags have no
/// deadlines; a far one keeps deadline-driven rules from acting on a
/// meaningless clock: `greedy` then asks for each job's smallest fitting
/// slice (the most efficient one) and `edf` keeps the bag's (random) order.
pub const NO_DEADLINE_S: f64 = 30.0 * 86_400.0;

/// Scientific kernels' work, s on the whole GPU: log-normal, median 10
/// min, sigma 0.8 (assumed). Inference and training work are the diurnal
/// generator's (`DiurnalConfig::default()`: exponential, mean 10 min;
/// log-normal, median 45 min, sigma 1).
const KERNEL_WORK: WorkDist = WorkDist::Lognormal {
    median_s: 600.0,
    sigma: 0.8,
};
/// Kernel curves: saturation in [0.10, 0.30] of the GPU (1g = 0.143, 2g =
/// 0.286), concavity in [0.5, 1].
const KERNEL_SATURATION: (f64, f64) = (0.10, 0.30);
const KERNEL_BETA: (f64, f64) = (0.5, 1.0);
/// Kernel memory, GB.
const KERNEL_MEMORY_GB: (f64, f64) = (0.5, 8.0);
/// Distinct kernels (templates: "the same binary resubmitted") per bag.
const KERNEL_TEMPLATES: u32 = 16;
/// A run's peak memory is the profiled mean use x U(1, 1.1): the CSV gives
/// the mean over the run; the peak is assumed up to 10 % above it.
const PEAK_OVER_MEAN: (f64, f64) = (1.0, 1.1);
/// Salt of the bag's own stream (the skeleton uses the seed itself).
const SALT_BAG: u64 = 0x7480_0024_0003;

/// Which bag of jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bag {
    Ml,
    Scientific,
}

/// The study's headline ratios: throughput and energy improvement over
/// whole GPUs one job at a time ("up to", the best of its experiments).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StudyRatios {
    pub throughput: f64,
    pub energy: f64,
}

/// The study's LLM-inference ratios, printed for completeness: we have no
/// bag to set beside them (module docs).
pub const STUDY_LLM_INFERENCE: StudyRatios = StudyRatios {
    throughput: 1.43,
    energy: 1.11,
};

impl Bag {
    pub const ALL: [Bag; 2] = [Bag::Ml, Bag::Scientific];

    pub fn name(self) -> &'static str {
        match self {
            Bag::Ml => "ml",
            Bag::Scientific => "scientific",
        }
    }

    /// The study's headline ratios for the matching workload.
    pub fn study(self) -> StudyRatios {
        match self {
            Bag::Ml => StudyRatios {
                throughput: 1.59,
                energy: 1.12,
            },
            Bag::Scientific => StudyRatios {
                throughput: 6.20,
                energy: 5.93,
            },
        }
    }

    /// The bag's jobs on `gpus` GPUs of `model`: `jobs_per_gpu x gpus`
    /// jobs at t = 0, ids `0..n`, true memory needs, a template per kind
    /// (the key of learned estimates), declarations equal to the need
    /// (see [`declare`]). The skeleton is the yardstick's `batch` family
    /// (its bag at t = 0); every job is then redrawn from this bag's kinds
    /// with a stream of its own, so the bag is a pure function of the seed.
    pub fn generate(self, model: GpuModel, gpus: usize, jobs_per_gpu: u32, seed: u64) -> Vec<Job> {
        let skeleton = Scenario {
            name: "throughput".into(),
            family: Family::Batch(BatchConfig { jobs_per_gpu }),
            deadline: DeadlineRegime::Loose,
            base: DiurnalConfig::default(),
        }
        .generate(model, gpus, seed);
        let cap = f64::from(model.spec().memory_gb);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ SALT_BAG);
        let kernels: Vec<(SpeedupCurve, f64)> = (0..KERNEL_TEMPLATES)
            .map(|_| {
                let curve = SpeedupCurve {
                    beta: uniform(&mut rng, KERNEL_BETA),
                    saturation: uniform(&mut rng, KERNEL_SATURATION),
                };
                (curve, uniform(&mut rng, KERNEL_MEMORY_GB))
            })
            .collect();
        skeleton
            .into_iter()
            .map(|mut j| {
                let kind = match self {
                    Bag::Ml => ml_kind(&mut rng),
                    Bag::Scientific => {
                        let t = rng.random_range(0..KERNEL_TEMPLATES);
                        let (curve, memory_gb) = kernels[t as usize];
                        Kind {
                            class: JobClass::Inference,
                            curve,
                            memory_gb,
                            template: t,
                            work: work(&mut rng, KERNEL_WORK),
                        }
                    }
                };
                j.arrival = 0.0;
                j.class = kind.class;
                j.speedup = kind.curve;
                j.work = kind.work;
                j.memory_gb = (kind.memory_gb * uniform(&mut rng, PEAK_OVER_MEAN)).min(cap);
                j.deadline = NO_DEADLINE_S;
                j.requested_slices = None;
                j.declared_memory_gb = None;
                j.template = Some(kind.template);
                j
            })
            .collect()
    }
}

impl fmt::Display for Bag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Bag {
    type Err = ThroughputError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Bag::ALL
            .into_iter()
            .find(|b| b.name() == s.trim())
            .ok_or_else(|| ThroughputError::UnknownBag(s.to_string()))
    }
}

/// One drawn job kind.
struct Kind {
    class: JobClass,
    curve: SpeedupCurve,
    memory_gb: f64,
    template: u32,
    work: f64,
}

fn uniform<R: Rng + ?Sized>(rng: &mut R, (lo, hi): (f64, f64)) -> f64 {
    lo + (hi - lo) * rng.random::<f64>()
}

/// One job's work from `dist`, clamped as the diurnal generator clamps it.
fn work<R: Rng + ?Sized>(rng: &mut R, dist: WorkDist) -> f64 {
    let d = DiurnalConfig::default();
    dist.sample(rng).clamp(d.min_work_s, d.max_work_s)
}

/// A third each of small-batch inference, large-batch inference and BERT
/// training; within a third, a uniform (model, batch) row of the fits.
fn ml_kind<R: Rng + ?Sized>(rng: &mut R) -> Kind {
    let third = rng.random_range(0..3u8);
    let rows: Vec<usize> = (0..MIGPROFILER_FITS.len())
        .filter(|&i| {
            let (model, batch, ..) = MIGPROFILER_FITS[i];
            match third {
                0 => model != "bert-base" && batch <= 8,
                1 => model != "bert-base" && batch > 8,
                _ => model == "bert-base",
            }
        })
        .collect();
    let i = rows[rng.random_range(0..rows.len())];
    let (model, batch, beta, saturation, _) = MIGPROFILER_FITS[i];
    let mib = MIGPROFILER_MEMORY_MIB
        .iter()
        .find(|(m, b, _)| *m == model && *b == batch)
        .map_or(1024.0, |r| r.2);
    let training = model == "bert-base";
    Kind {
        class: if training {
            JobClass::Training
        } else {
            JobClass::Inference
        },
        curve: SpeedupCurve { beta, saturation },
        memory_gb: mib / 1024.0,
        template: u32::try_from(i).unwrap_or(u32::MAX),
        work: work(rng, {
            let d = DiurnalConfig::default();
            if training {
                d.training_kind().work
            } else {
                d.inference_kind().work
            }
        }),
    }
}

/// What no arm can beat on a bag (`docs/oom-and-memory.md`, section 7).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BagBound {
    /// Whole-GPU work / work on each job's most efficient fitting slice
    /// (GPU-seconds): the throughput ratio of a perfect packing without
    /// a tail.
    pub ideal_ratio: f64,
    /// Lower bound on any arm's makespan, s: the larger of (GPU-seconds on
    /// the best slices / GPUs) and the longest job on a whole GPU.
    pub makespan_lower_s: f64,
}

/// The bound of `jobs` on `gpus` GPUs of `model`.
pub fn bag_bound(jobs: &[Job], model: GpuModel, gpus: usize) -> BagBound {
    let whole: f64 = jobs.iter().map(|j| j.work).sum();
    let best: f64 = jobs
        .iter()
        .map(|j| j.most_efficient_profile(model).map_or(j.work, |(_, a)| a))
        .sum();
    let longest = jobs.iter().map(|j| j.work).fold(0.0, f64::max);
    BagBound {
        ideal_ratio: if best > 0.0 { whole / best } else { 1.0 },
        makespan_lower_s: (best / gpus.max(1) as f64).max(longest),
    }
}

/// Why the experiment could not run.
#[derive(Debug, thiserror::Error)]
pub enum ThroughputError {
    #[error(
        "unknown bag `{0}` (known: ml, scientific; llm-inference is not modelled, \
         docs/oom-and-memory.md section 7 says why)"
    )]
    UnknownBag(String),
    #[error("the cluster needs at least one GPU")]
    NoGpus,
    #[error("a bag needs at least one job per GPU")]
    NoJobs,
    #[error("no {0} seeds")]
    NoSeeds(&'static str),
    #[error("seed {0} is both a training and a scored seed (a layout searched on the scored bag is a reference, not the opponent)")]
    SeedsOverlap(u64),
    #[error("policy `{spec}`: {reason}")]
    Policy { spec: String, reason: String },
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error(transparent)]
    Sim(#[from] SimError),
}

/// What to run.
#[derive(Clone, Debug)]
pub struct ThroughputConfig {
    pub model: GpuModel,
    pub gpus: usize,
    pub jobs_per_gpu: u32,
    /// Bags the static layout is searched on.
    pub train_seeds: Vec<u64>,
    /// Bags every arm is scored on (disjoint from `train_seeds`).
    pub test_seeds: Vec<u64>,
    pub heuristic: Heuristic,
    pub search: SearchConfig,
    pub underdeclare: Underdeclare,
    /// The out-of-memory mode of every arm.
    pub oom: OomConfig,
    /// `(row name, policy spec)` of the dynamic arms, e.g. `("greedy", "greedy")`.
    pub dynamic: Vec<(String, String)>,
    /// Also search the static layout on each scored bag (a reference).
    pub hindsight: bool,
}

impl ThroughputConfig {
    /// The defaults of `smartmig bench throughput` on `gpus` GPUs: 20 % of
    /// the jobs declare the smallest profile, 30 % nothing (as in section 5
    /// of the docs), OOM restart with estimates, `greedy`, EDF.
    pub fn new(model: GpuModel, gpus: usize, jobs_per_gpu: u32) -> Self {
        ThroughputConfig {
            model,
            gpus,
            jobs_per_gpu,
            train_seeds: (0..8).collect(),
            test_seeds: (1000..1010).collect(),
            heuristic: Heuristic::Edf,
            search: SearchConfig::default(),
            underdeclare: Underdeclare {
                small_share: 0.2,
                none_share: 0.3,
            },
            oom: OomConfig {
                estimate: Some(crate::workload::EstimatorConfig::default()),
                ..OomConfig::default()
            },
            dynamic: vec![
                ("greedy".into(), "greedy".into()),
                ("greedy-from-static".into(), format!("greedy:{INIT_STATIC}")),
            ],
            hindsight: true,
        }
    }

    /// Checks the sizes, that no scored seed is a training seed, and that
    /// every dynamic policy spec parses.
    pub fn validate(&self) -> Result<(), ThroughputError> {
        if self.gpus == 0 {
            return Err(ThroughputError::NoGpus);
        }
        if self.jobs_per_gpu == 0 {
            return Err(ThroughputError::NoJobs);
        }
        if self.train_seeds.is_empty() {
            return Err(ThroughputError::NoSeeds("training"));
        }
        if self.test_seeds.is_empty() {
            return Err(ThroughputError::NoSeeds("scored"));
        }
        if let Some(&s) = self
            .test_seeds
            .iter()
            .find(|s| self.train_seeds.contains(s))
        {
            return Err(ThroughputError::SeedsOverlap(s));
        }
        self.underdeclare.validate()?;
        // Every dynamic spec parses (and a learned file loads) before any
        // bag is simulated; `init=static` stands for a catalog index.
        for (_, spec) in &self.dynamic {
            self.policy(&spec.replace(INIT_STATIC, "init=0"))?;
        }
        SimConfig {
            oom: Some(self.oom.clone()),
            ..SimConfig::default()
        }
        .validate()?;
        Ok(())
    }

    fn cluster(&self) -> Vec<GpuModel> {
        vec![self.model; self.gpus]
    }

    /// The jobs of one bag as the arms see them (declarations applied).
    pub fn bag_jobs(&self, bag: Bag, seed: u64) -> Vec<Job> {
        let mut jobs = bag.generate(self.model, self.gpus, self.jobs_per_gpu, seed);
        // A share declares the smallest profile's memory, a share nothing,
        // the rest their true need (seeded by the bag's seed).
        underdeclare(&mut jobs, self.model, &self.underdeclare, seed);
        jobs
    }

    fn sim_config(&self, seed: u64) -> SimConfig {
        SimConfig {
            seed,
            workload_horizon_s: Some(0.0),
            oom: Some(self.oom.clone()),
            ..SimConfig::default()
        }
    }

    fn run(
        &self,
        jobs: &[Job],
        seed: u64,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<Metrics, SimError> {
        let mut h = self.heuristic.build(seed);
        Ok(simulate(
            &self.cluster(),
            jobs,
            h.as_mut(),
            policy,
            &self.sim_config(seed),
            RunHooks::default(),
        )?
        .metrics)
    }

    fn policy(&self, spec: &str) -> Result<Box<dyn RepartitionPolicy + Send>, ThroughputError> {
        parse_policy(spec, &[self.model]).map_err(|e| ThroughputError::Policy {
            spec: spec.to_string(),
            reason: e.to_string(),
        })
    }
}

/// The static search's objective on a set of bags (lower is better): the
/// jobs that never completed first (a layout without a slice big enough
/// for some job would otherwise look fast; `sim::Standing`), then the mean
/// of makespan / whole-GPU makespan.
fn static_objective(
    cfg: &ThroughputConfig,
    bags: &[(u64, Vec<Job>, Metrics)],
    policy: &mut dyn RepartitionPolicy,
) -> Result<Standing, SimError> {
    let mut days = Vec::with_capacity(bags.len());
    for (seed, jobs, whole) in bags {
        let m = cfg.run(jobs, *seed, policy)?;
        days.push(Standing::new(
            m.jobs - m.completed,
            m.makespan_s / whole.makespan_s.max(1e-9),
        ));
    }
    Ok(Standing::over(days))
}

/// Searches the static assignment on `bags`; returns it and its replay spec.
fn search_static(
    cfg: &ThroughputConfig,
    bags: &[(u64, Vec<Job>, Metrics)],
) -> Result<(crate::policy::StaticMix, String, usize), SimError> {
    let mut evaluate = |p: &mut dyn RepartitionPolicy| static_objective(cfg, bags, p);
    let best = static_best(&cfg.cluster(), &cfg.search, &mut evaluate)?;
    let spec = format!(
        "static:{}",
        describe_assignment(&cfg.cluster(), best.policy.layouts())
    );
    Ok((best.policy, spec, best.evaluations))
}

/// The placeholder of a dynamic spec for "start from the layout chosen on
/// the training bags": `greedy:init=static`.
pub const INIT_STATIC: &str = "init=static";

/// Replaces [`INIT_STATIC`] in `spec` with the catalog index of the first
/// GPU's layout of `fitted` (`greedy:init=N`), so a dynamic policy starts
/// where the opponent stays and re-shapes from there. Why: the engine
/// places work-conservingly, so on a bag at t = 0 every instance of the
/// initial layout is filled at once and a policy can only split or merge
/// slices that fall idle; the starting layout decides much of a bag's
/// throughput (docs, section 7). A layout outside the catalog keeps the
/// policy's default start.
pub fn resolve_static_init(
    spec: &str,
    fitted: &crate::policy::StaticMix,
    model: GpuModel,
) -> String {
    let g = crate::mig::Geometry::of(model);
    match fitted.layouts().first().and_then(|&l| g.catalog_index(l)) {
        Some(i) if spec.contains(INIT_STATIC) => spec.replace(INIT_STATIC, &format!("init={i}")),
        _ => spec
            .replace(&format!(",{INIT_STATIC}"), "")
            .replace(&format!(":{INIT_STATIC}"), ""),
    }
}

/// Who an arm is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArmKind {
    /// Whole GPUs one job at a time: what every ratio is taken against.
    Baseline,
    /// The static layout chosen on other bags.
    Opponent,
    /// A dynamic policy.
    Dynamic,
    /// Searched on the scored bag itself: a reference only.
    Hindsight,
}

/// One arm on one scored bag.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ArmRun {
    pub seed: u64,
    pub jobs: u64,
    pub completed: u64,
    pub makespan_s: f64,
    pub jobs_per_hour: f64,
    pub energy_j: f64,
    pub energy_per_job_j: f64,
    pub reconfigurations: u64,
    pub fusions: u64,
    pub fissions: u64,
    pub reshapes: u64,
    pub jobs_served_by_fusion: u64,
    pub jobs_served_by_fission: u64,
    /// Runs that ended out of memory (each restarted or rejected).
    pub oom_runs: u64,
    /// jobs/h / jobs/h of `whole-gpu` on the same bag.
    pub throughput_ratio: f64,
    /// Energy per job of `whole-gpu` / this arm's (> 1: less energy).
    pub energy_ratio: f64,
    /// The static assignment this run used (hindsight: its own search).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
}

impl ArmRun {
    fn new(seed: u64, m: &Metrics, whole: &Metrics) -> Self {
        let per_job = |m: &Metrics| m.energy_j / m.completed.max(1) as f64;
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        ArmRun {
            seed,
            jobs: m.jobs,
            completed: m.completed,
            makespan_s: m.makespan_s,
            jobs_per_hour: m.jobs_per_hour,
            energy_j: m.energy_j,
            energy_per_job_j: per_job(m),
            reconfigurations: m.reconfigurations,
            fusions: m.fusions,
            fissions: m.fissions,
            reshapes: m.reshapes,
            jobs_served_by_fusion: m.jobs_served_by_fusion,
            jobs_served_by_fission: m.jobs_served_by_fission,
            oom_runs: m.oom_failures,
            throughput_ratio: ratio(m.jobs_per_hour, whole.jobs_per_hour),
            energy_ratio: ratio(per_job(whole), per_job(m)),
            layout: None,
        }
    }
}

/// Means over the scored bags, and the worst bag's ratios.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ArmSummary {
    pub jobs: f64,
    pub completed: f64,
    pub makespan_h: f64,
    pub jobs_per_hour: f64,
    pub energy_mj: f64,
    pub energy_per_job_kj: f64,
    pub fusions: f64,
    pub fissions: f64,
    pub oom_runs: f64,
    pub throughput_ratio: f64,
    pub energy_ratio: f64,
    /// The smallest throughput ratio over the scored bags.
    pub worst_throughput_ratio: f64,
    /// The smallest energy ratio over the scored bags.
    pub worst_energy_ratio: f64,
    /// Every job of every bag completed.
    pub all_completed: bool,
}

impl ArmSummary {
    fn of(runs: &[ArmRun]) -> Self {
        let n = runs.len().max(1) as f64;
        let mean = |f: fn(&ArmRun) -> f64| runs.iter().map(f).sum::<f64>() / n;
        let min = |f: fn(&ArmRun) -> f64| runs.iter().map(f).fold(f64::INFINITY, f64::min);
        ArmSummary {
            jobs: mean(|r| r.jobs as f64),
            completed: mean(|r| r.completed as f64),
            makespan_h: mean(|r| r.makespan_s / 3600.0),
            jobs_per_hour: mean(|r| r.jobs_per_hour),
            energy_mj: mean(|r| r.energy_j / 1e6),
            energy_per_job_kj: mean(|r| r.energy_per_job_j / 1e3),
            fusions: mean(|r| r.fusions as f64),
            fissions: mean(|r| r.fissions as f64),
            oom_runs: mean(|r| r.oom_runs as f64),
            throughput_ratio: mean(|r| r.throughput_ratio),
            energy_ratio: mean(|r| r.energy_ratio),
            worst_throughput_ratio: min(|r| r.throughput_ratio),
            worst_energy_ratio: min(|r| r.energy_ratio),
            all_completed: runs.iter().all(|r| r.completed == r.jobs),
        }
    }
}

/// One arm over the scored bags.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ArmResult {
    /// `whole-gpu`, `static-other-bags`, `greedy`, `learned`, `static-hindsight`.
    pub name: String,
    pub kind: ArmKind,
    pub description: String,
    pub runs: Vec<ArmRun>,
    pub summary: ArmSummary,
}

/// One scored bag's bounds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeedBound {
    pub seed: u64,
    #[serde(flatten)]
    pub bound: BagBound,
    /// Whole-GPU makespan / the makespan lower bound: no arm's throughput
    /// ratio on this bag can exceed it.
    pub max_ratio: f64,
}

/// One bag's experiment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BagResult {
    pub bag: Bag,
    pub model: String,
    pub gpus: usize,
    pub jobs_per_bag: usize,
    pub train_seeds: Vec<u64>,
    pub test_seeds: Vec<u64>,
    pub study: StudyRatios,
    /// The static assignment found on the training bags (replay syntax).
    pub static_layout: String,
    pub static_search_runs: usize,
    pub bounds: Vec<SeedBound>,
    pub arms: Vec<ArmResult>,
}

impl BagResult {
    pub fn arm(&self, name: &str) -> Option<&ArmResult> {
        self.arms.iter().find(|a| a.name == name)
    }

    /// Mean over the scored bags of the whole-work / best-slice ratio.
    pub fn mean_ideal_ratio(&self) -> f64 {
        self.bounds.iter().map(|b| b.bound.ideal_ratio).sum::<f64>()
            / self.bounds.len().max(1) as f64
    }
}

/// Runs every arm on `bag` (module docs). `progress` hears each step.
pub fn run_bag(
    bag: Bag,
    cfg: &ThroughputConfig,
    progress: &mut dyn FnMut(&str),
) -> Result<BagResult, ThroughputError> {
    cfg.validate()?;
    // The opponent's layout: searched on the training bags only.
    progress("searching the static layout on the training bags");
    let mut train = Vec::new();
    for &seed in &cfg.train_seeds {
        let jobs = cfg.bag_jobs(bag, seed);
        let whole = cfg.run(&jobs, seed, &mut NoPartition)?;
        train.push((seed, jobs, whole));
    }
    let (fitted, static_layout, static_search_runs) = search_static(cfg, &train)?;

    let mut arms: Vec<ArmResult> = Vec::new();
    let mut push = |name: &str, kind: ArmKind, description: String, run: ArmRun| match arms
        .iter_mut()
        .find(|a| a.name == name)
    {
        Some(a) => a.runs.push(run),
        None => arms.push(ArmResult {
            name: name.to_string(),
            kind,
            description,
            runs: vec![run],
            summary: ArmSummary::of(&[]),
        }),
    };
    let mut bounds = Vec::new();
    let mut jobs_per_bag = 0;
    for &seed in &cfg.test_seeds {
        progress(&format!("scored bag {seed}"));
        let jobs = cfg.bag_jobs(bag, seed);
        jobs_per_bag = jobs.len();
        let whole = cfg.run(&jobs, seed, &mut NoPartition)?;
        let bound = bag_bound(&jobs, cfg.model, cfg.gpus);
        bounds.push(SeedBound {
            seed,
            bound,
            max_ratio: whole.makespan_s / bound.makespan_lower_s.max(1e-9),
        });
        push(
            "whole-gpu",
            ArmKind::Baseline,
            "every GPU one 7g instance, one job at a time".into(),
            ArmRun::new(seed, &whole, &whole),
        );
        let m = cfg.run(&jobs, seed, &mut fitted.clone())?;
        push(
            "static-other-bags",
            ArmKind::Opponent,
            format!(
                "{static_layout}, searched on training bags {:?}",
                cfg.train_seeds
            ),
            ArmRun::new(seed, &m, &whole),
        );
        for (name, spec) in &cfg.dynamic {
            let spec = &resolve_static_init(spec, &fitted, cfg.model);
            let mut p = cfg.policy(spec)?;
            let m = cfg.run(&jobs, seed, p.as_mut())?;
            push(
                name,
                ArmKind::Dynamic,
                spec.clone(),
                ArmRun::new(seed, &m, &whole),
            );
        }
        if cfg.hindsight {
            let own = [(seed, jobs.clone(), whole.clone())];
            let (mut p, spec, _) = search_static(cfg, &own)?;
            let m = cfg.run(&jobs, seed, &mut p)?;
            let mut run = ArmRun::new(seed, &m, &whole);
            run.layout = Some(spec);
            push(
                "static-hindsight",
                ArmKind::Hindsight,
                "the same search on the scored bag itself (reference, knew the bag)".into(),
                run,
            );
        }
    }
    for a in &mut arms {
        a.summary = ArmSummary::of(&a.runs);
    }
    Ok(BagResult {
        bag,
        model: cfg.model.to_string(),
        gpus: cfg.gpus,
        jobs_per_bag,
        train_seeds: cfg.train_seeds.clone(),
        test_seeds: cfg.test_seeds.clone(),
        study: bag.study(),
        static_layout,
        static_search_runs,
        bounds,
        arms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const M: GpuModel = GpuModel::A100_40gb;

    fn small(gpus: usize, jobs: u32) -> ThroughputConfig {
        ThroughputConfig {
            train_seeds: vec![0, 1],
            test_seeds: vec![100, 101],
            search: SearchConfig::coarse(),
            hindsight: false,
            ..ThroughputConfig::new(M, gpus, jobs)
        }
    }

    /// `(model, batch) -> largest fb_used_mean over the profiles`, MiB.
    fn memory(csv_text: &str) -> BTreeMap<(String, u32), f64> {
        let mut rdr = csv::Reader::from_reader(csv_text.as_bytes());
        let h = rdr.headers().unwrap().clone();
        let col = |n: &str| h.iter().position(|c| c == n).unwrap();
        let (cm, cb, cf) = (col("model_name"), col("batch_size"), col("fb_used_mean"));
        let mut out: BTreeMap<(String, u32), f64> = BTreeMap::new();
        for rec in rdr.records() {
            let rec = rec.unwrap();
            let v: f64 = rec[cf].parse().unwrap();
            let e = out
                .entry((rec[cm].to_string(), rec[cb].parse().unwrap()))
                .or_insert(0.0);
            *e = e.max(v);
        }
        out
    }

    #[test]
    fn memory_table_matches_the_migprofiler_data() {
        let mut all = memory(include_str!(
            "../../../tests/data/migprofiler_a100-80gb_infer_cv.csv"
        ));
        all.extend(memory(include_str!(
            "../../../tests/data/migprofiler_a100-80gb_train_nlp_bert.csv"
        )));
        assert_eq!(all.len(), MIGPROFILER_MEMORY_MIB.len());
        for &(m, b, mib) in MIGPROFILER_MEMORY_MIB {
            let got = all[&(m.to_string(), b)];
            assert!((got - mib).abs() < 1e-6, "{m} {b}: {got} vs {mib}");
            // Every fitted row has a memory row.
            assert!(MIGPROFILER_FITS.iter().any(|f| f.0 == m && f.1 == b));
        }
    }

    #[test]
    fn bags_are_deterministic_valid_and_at_time_zero() {
        for bag in Bag::ALL {
            let a = bag.generate(M, 2, 30, 7);
            assert_eq!(a, bag.generate(M, 2, 30, 7), "{bag}");
            assert_ne!(a, bag.generate(M, 2, 30, 8), "{bag}");
            assert_eq!(a.len(), 60);
            for (i, j) in a.iter().enumerate() {
                j.validate(M).unwrap();
                assert_eq!(j.id, i as u64);
                assert_eq!(j.arrival, 0.0);
                assert!(j.template.is_some() && j.requested_slices.is_none());
                assert!(j.memory_gb <= 40.0);
            }
        }
    }

    #[test]
    fn the_ml_bag_is_a_third_of_each_kind_with_the_measured_curves() {
        let jobs = Bag::Ml.generate(M, 10, 300, 1);
        let (mut small_inf, mut large_inf, mut train) = (0, 0, 0);
        for j in &jobs {
            let (model, batch, beta, sat, _) = MIGPROFILER_FITS[j.template.unwrap() as usize];
            assert_eq!((j.speedup.beta, j.speedup.saturation), (beta, sat));
            match (model, batch) {
                ("bert-base", _) => train += 1,
                (_, b) if b <= 8 => small_inf += 1,
                _ => large_inf += 1,
            }
            assert_eq!(j.class == JobClass::Training, model == "bert-base");
        }
        for n in [small_inf, large_inf, train] {
            assert!((900..=1100).contains(&n), "{small_inf} {large_inf} {train}");
        }
        // BERT batch 256 needs 14 GB: more than any 1g or 2g slice holds.
        assert!(jobs.iter().any(|j| j.memory_gb > 10.0));
    }

    #[test]
    fn scientific_kernels_saturate_at_a_small_slice() {
        for j in Bag::Scientific.generate(M, 4, 50, 3) {
            assert!(j.speedup.saturation <= 0.30 && j.memory_gb <= 8.8);
            // 2g (2/7 = 0.286) gives at least 0.95 of the whole GPU.
            assert!(j.speed(2, 7) >= 0.95, "{:?}", j.speedup);
            assert!(j.speed(1, 7) >= (0.1429f64 / 0.30).powf(1.0) - 1e-3);
        }
    }

    #[test]
    fn bad_input_is_named() {
        assert!(matches!(
            "llm".parse::<Bag>(),
            Err(ThroughputError::UnknownBag(s)) if s == "llm"
        ));
        assert_eq!("scientific".parse::<Bag>().unwrap(), Bag::Scientific);
        let mut c = small(0, 5);
        assert!(matches!(c.validate(), Err(ThroughputError::NoGpus)));
        c.gpus = 1;
        c.jobs_per_gpu = 0;
        assert!(matches!(c.validate(), Err(ThroughputError::NoJobs)));
        c.jobs_per_gpu = 5;
        c.test_seeds = vec![1, 2];
        assert!(matches!(
            c.validate(),
            Err(ThroughputError::SeedsOverlap(1))
        ));
        c.test_seeds.clear();
        assert!(matches!(
            c.validate(),
            Err(ThroughputError::NoSeeds("scored"))
        ));
        c.test_seeds = vec![9];
        c.dynamic = vec![("x".into(), "nonsense".into())];
        let e = run_bag(Bag::Ml, &c, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("nonsense"), "{e}");
    }

    #[test]
    fn the_bound_holds_and_every_job_completes() {
        let cfg = small(2, 20);
        for bag in Bag::ALL {
            let r = run_bag(bag, &cfg, &mut |_| {}).unwrap();
            let whole = r.arm("whole-gpu").unwrap();
            assert!(whole.runs.iter().all(|x| x.throughput_ratio == 1.0));
            for a in &r.arms {
                assert!(a.summary.all_completed, "{bag} {}", a.name);
                for (run, b) in a.runs.iter().zip(&r.bounds) {
                    assert!(
                        run.throughput_ratio <= b.max_ratio * (1.0 + 1e-9),
                        "{bag} {} {} > {}",
                        a.name,
                        run.throughput_ratio,
                        b.max_ratio
                    );
                }
            }
        }
    }
}
