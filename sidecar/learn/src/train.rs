//! The trainer: the simulator as environment, a demand-covering teacher for
//! the imitation warm start, then PPO with masking (mean-field, shared
//! parameters).
//!
//! ## Environment and reward
//!
//! One episode is one simulated day (a diurnal workload with its own seed)
//! on `gpus` GPUs of one model. The agent is every GPU of the model; at each
//! decision epoch, a GPU with more than one allowed action contributes one
//! step (obs, mask, action). GPUs with only "keep" allowed contribute
//! nothing (no choice, no gradient).
//!
//! The reward needs energy and tardiness per epoch, which the simulator does
//! not hand to policies. The trainer gets them without touching the engine:
//! it listens to the event log ([`EventSink`]), where every job start is
//! recorded with its GPU, slice, start, end and deadline, and integrates the
//! power model over each epoch interval from those records. The team reward
//! of epoch `k` (interval `(t_{k-1}, t_k]`) is
//!
//! `r_k = -(dE_k / E_ref + dT_k / T_ref) / 2`,
//!
//! `dE_k` the energy of every GPU in the interval, `dT_k` the tardiness of
//! the jobs that *started* in it (known at start: no preemption), `E_ref`
//! and `T_ref` the totals of the `none` reference run (the ET reference of
//! [`crate::sim::EtScore`]). The remainder after the last epoch (energy up
//! to the horizon) is added to the last step, so an episode's rewards sum to
//! exactly `-(e + t) / 2 = -ET` (alpha = 1): maximising return is
//! minimising ET. The *local* part of GPU `i` is the same expression over
//! its own energy and the jobs started on it, times the number of GPUs;
//! an agent's reward is `(1 - w) * team + w * local` (`local_weight`).
//!
//! ## Algorithm
//!
//! 1. Imitation warm start: episodes driven by [`Teacher`] (a nos-style
//!    greedy that covers uncovered demand); the actor is fitted by
//!    cross-entropy to the teacher's actions (behaviour cloning).
//! 2. PPO: sampled actions (seeded), GAE per agent over its own acting
//!    epochs, clipped surrogate, value loss, entropy bonus, AdamW.
//!
//! Deterministic given the seed: the weights are initialised from ChaCha8,
//! actions are sampled from ChaCha8, candle runs on one CPU thread order.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use candle_core::{Device, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::model::ActorCritic;
use super::LearnError;
use crate::mig::{Geometry, GpuModel, Layout};
use crate::policy::adaptive::Adaptive;
use crate::policy::features::{argmax_masked, Encoder, FeatureSpec};
use crate::policy::{ClusterView, Decision, RepartitionPolicy};
use crate::sim::events::{EventSink, Record};
use crate::sim::{simulate, EpochRule, EtScore, Heuristic, Metrics, RunHooks, SimConfig};
use crate::workload::{generate_diurnal, DiurnalConfig, Job, PowerModel};

/// `etc/train.toml`. Every field has a default; see that file for meanings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub gpu_model: GpuModel,
    pub seed: u64,
    /// GPUs per training episode (a list: episodes cycle through it).
    pub gpus: Vec<usize>,
    pub hidden: usize,
    /// Job-placement heuristic in the simulator.
    pub heuristic: String,
    pub epoch_events: u32,
    pub reconfig_time_s: f64,
    /// Weight of the local reward part in [0, 1].
    pub local_weight: f64,
    /// Wall-clock budget of the whole run, s (training stops early).
    pub time_budget_s: f64,
    /// The teacher's resting layouts, searched on a training day:
    /// `uniform` (the best single catalog layout by ET, even if it cannot
    /// hold every job: the teacher re-shapes for those), `static-best` (the
    /// per-GPU mix that serves every job), `twice-daily` (a day and a
    /// night mix) or `adaptive` (driven by the load, not the clock).
    pub teacher_base: TeacherBase,
    /// Training days (of `gpus[0]` GPUs) the teacher's resting layouts are
    /// searched on: the search minimises the mean objective over them, so
    /// the resting layouts fit the workload rather than one day's draw.
    pub teacher_days: usize,
    pub workload: DiurnalConfig,
    pub imitation: ImitationConfig,
    pub ppo: PpoConfig,
    pub es: super::es::EsConfig,
    pub validation: ValidationConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImitationConfig {
    pub episodes: usize,
    pub epochs: usize,
    pub minibatch: usize,
    pub lr: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpoConfig {
    pub iterations: usize,
    pub episodes_per_iteration: usize,
    pub epochs: usize,
    pub minibatch: usize,
    pub lr: f64,
    pub gamma: f64,
    pub gae_lambda: f64,
    pub clip: f64,
    pub entropy: f64,
    pub value_coef: f64,
    /// Stop an update's epochs early once the mean approximate KL
    /// divergence from the rollout policy of a minibatch exceeds this
    /// (0 = never).
    pub target_kl: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationConfig {
    /// Seed of the first validation day (keep them apart from training
    /// seeds and from the benchmark's seed).
    pub seed: u64,
    /// Validation days (seeds `seed`, `seed + 1`, ...); scores are means
    /// over them, which makes checkpoint selection less of a lottery.
    pub days: usize,
    pub gpus: usize,
    /// Validate every this many PPO iterations.
    pub every: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            gpu_model: GpuModel::A100_40gb,
            seed: 7,
            gpus: vec![8],
            hidden: 64,
            heuristic: "edf".into(),
            epoch_events: crate::sim::DEFAULT_EPOCH_EVENTS,
            reconfig_time_s: crate::sim::DEFAULT_RECONFIG_TIME_S,
            local_weight: 0.25,
            time_budget_s: 540.0,
            teacher_base: TeacherBase::TwiceDaily,
            teacher_days: 1,
            workload: DiurnalConfig::default(),
            imitation: ImitationConfig::default(),
            ppo: PpoConfig::default(),
            es: super::es::EsConfig::default(),
            validation: ValidationConfig::default(),
        }
    }
}

impl Default for ImitationConfig {
    fn default() -> Self {
        ImitationConfig {
            episodes: 16,
            epochs: 20,
            minibatch: 256,
            lr: 1e-3,
        }
    }
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            iterations: 60,
            episodes_per_iteration: 4,
            epochs: 4,
            minibatch: 256,
            lr: 2e-4,
            gamma: 0.99,
            gae_lambda: 0.95,
            clip: 0.2,
            entropy: 0.003,
            value_coef: 0.5,
            target_kl: 0.0,
        }
    }
}

impl Default for ValidationConfig {
    fn default() -> Self {
        ValidationConfig {
            seed: 900_001,
            days: 3,
            gpus: 8,
            every: 5,
        }
    }
}

impl TrainConfig {
    pub fn validate(&self) -> Result<(), LearnError> {
        let bad = |m: String| Err(LearnError::Config(m));
        if self.gpus.is_empty() || self.gpus.contains(&0) {
            return bad("gpus must be a non-empty list of positive counts".into());
        }
        if self.teacher_days == 0 {
            return bad("teacher_days must be > 0".into());
        }
        if self.hidden == 0 {
            return bad("hidden must be > 0".into());
        }
        if self.epoch_events == 0 {
            return bad("epoch_events must be > 0".into());
        }
        if !(0.0..=1.0).contains(&self.local_weight) {
            return bad(format!(
                "local_weight {} is not in [0, 1]",
                self.local_weight
            ));
        }
        if self.imitation.minibatch == 0 || self.ppo.minibatch == 0 {
            return bad("minibatch sizes must be > 0".into());
        }
        if self.validation.gpus == 0 || self.validation.every == 0 || self.validation.days == 0 {
            return bad("validation.gpus, .days and .every must be > 0".into());
        }
        self.heuristic()?;
        self.workload
            .validate()
            .map_err(|e| LearnError::Config(format!("workload: {e}")))?;
        Ok(())
    }

    pub fn heuristic(&self) -> Result<Heuristic, LearnError> {
        self.heuristic
            .parse()
            .map_err(|e| LearnError::Config(format!("heuristic: {e}")))
    }

    pub fn sim_config(&self, seed: u64) -> SimConfig {
        SimConfig {
            reconfig_time_s: self.reconfig_time_s,
            epoch: EpochRule::Events(self.epoch_events),
            seed,
            workload_horizon_s: Some(self.workload.horizon_s),
            start_hour: self.workload.start_hour,
            power: Vec::new(),
            oom: None,
        }
    }
}

// ---------------------------------------------------------------------------
// Reward bookkeeping from the event log.

/// Extra tardiness charged per job that never ran, s (reward only).
const UNSERVED_PENALTY_S: f64 = 86_400.0;

/// A started job as the event log reports it.
#[derive(Clone, Copy, Debug)]
struct Started {
    gpu: usize,
    compute: u8,
    start: f64,
    end: f64,
    tardiness: f64,
}

/// Energy and tardiness per epoch, from job-start records.
#[derive(Debug)]
struct Ledger {
    started: Vec<Started>,
    consumed: usize,
    /// Jobs still running at the last epoch, per GPU.
    active: Vec<Vec<Started>>,
    power: Vec<PowerModel>,
    total: Vec<u8>,
    last: f64,
    /// Deadlines of the jobs that never ran.
    unserved: Vec<f64>,
}

impl Ledger {
    fn new(cluster: &[GpuModel], cfg: &SimConfig) -> Self {
        Ledger {
            started: Vec::new(),
            consumed: 0,
            active: vec![Vec::new(); cluster.len()],
            power: cluster.iter().map(|&m| cfg.power_for(m)).collect(),
            total: cluster.iter().map(|m| m.spec().compute_slices).collect(),
            last: 0.0,
            unserved: Vec::new(),
        }
    }

    /// Energy per GPU over `(last, now]` and tardiness per GPU of the jobs
    /// started since the last call.
    fn advance(&mut self, now: f64) -> (Vec<f64>, Vec<f64>) {
        let n = self.active.len();
        let mut tard = vec![0.0; n];
        for s in &self.started[self.consumed..] {
            if let Some(t) = tard.get_mut(s.gpu) {
                *t += s.tardiness;
                self.active[s.gpu].push(*s);
            }
        }
        self.consumed = self.started.len();
        let mut energy = vec![0.0; n];
        let t0 = self.last;
        for (gpu, jobs) in self.active.iter_mut().enumerate() {
            let mut cuts: Vec<f64> = vec![t0, now];
            for j in jobs.iter() {
                for t in [j.start, j.end] {
                    if t > t0 && t < now {
                        cuts.push(t);
                    }
                }
            }
            cuts.sort_by(f64::total_cmp);
            let mut e = 0.0;
            for w in cuts.windows(2) {
                let (a, b) = (w[0], w[1]);
                if b <= a {
                    continue;
                }
                let mid = 0.5 * (a + b);
                let busy: u32 = jobs
                    .iter()
                    .filter(|j| j.start <= mid && mid < j.end)
                    .map(|j| u32::from(j.compute))
                    .sum();
                let load = (f64::from(busy) / f64::from(self.total[gpu])).min(1.0);
                e += self.power[gpu].energy_j(load, b - a);
            }
            energy[gpu] = e;
            jobs.retain(|j| j.end > now);
        }
        self.last = now;
        (energy, tard)
    }
}

struct LedgerSink(Rc<RefCell<Ledger>>);

impl EventSink for LedgerSink {
    fn record(&mut self, record: &Record) -> std::io::Result<()> {
        match record {
            Record::Job(j) => self.0.borrow_mut().started.push(Started {
                gpu: j.gpu,
                compute: j.compute,
                start: j.start,
                end: j.end,
                tardiness: (j.end - j.deadline).max(0.0),
            }),
            Record::Unserved(u) => self.0.borrow_mut().unserved.push(u.deadline),
            _ => {}
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The teacher.

/// The imitation teacher: a nos-style greedy plus a resting layout.
///
/// In GPU order, each GPU that may change picks the reachable catalog
/// layout that covers the most still-uncovered waiting demand (in compute
/// slices), counting only gains over its current layout; ties go to fewer
/// changed instances, then the lower catalog index. A GPU with nothing to
/// gain returns to `base` (the best static layout of a training day) when
/// it can without touching busy instances: demand-only greedy never
/// partitions a cluster whose queue is empty, and so misses most of the
/// gain of MIG (several jobs per GPU).
#[derive(Clone, Debug)]
pub struct Teacher {
    model: GpuModel,
    /// Resting layout per GPU position (scaled to the cluster's size), by
    /// day and by night.
    base: Base,
}

/// Resting layouts of the teacher.
#[derive(Clone, Debug, Default)]
pub struct Base {
    pub day: Vec<Layout>,
    pub night: Vec<Layout>,
    /// Hours the day and the night assignments start.
    pub day_hour: f64,
    pub night_hour: f64,
    /// When set, the resting layouts follow this load-driven rule instead
    /// of the clock (`teacher_base = "adaptive"`).
    pub adaptive: Option<Adaptive>,
}

impl Base {
    /// The same layouts all day.
    pub fn fixed(layouts: Vec<Layout>) -> Self {
        Base {
            night: layouts.clone(),
            day: layouts,
            day_hour: 0.0,
            night_hour: 0.0,
            adaptive: None,
        }
    }

    fn at(&self, hour: f64) -> &[Layout] {
        let day = if self.day_hour <= self.night_hour {
            hour >= self.day_hour && hour < self.night_hour
        } else {
            hour >= self.day_hour || hour < self.night_hour
        };
        if day {
            &self.day
        } else {
            &self.night
        }
    }
}

impl Teacher {
    pub fn new(model: GpuModel, base: Base) -> Self {
        Teacher { model, base }
    }

    /// The resting layout of GPU `gpu` of `n` at `hour`.
    fn base_of(&self, gpu: usize, n: usize, hour: f64) -> Option<Layout> {
        let base = self.base.at(hour);
        if base.is_empty() || n == 0 {
            return None;
        }
        base.get(gpu * base.len() / n).copied()
    }

    /// Catalog index per GPU of the model (or `None` = keep), plus the
    /// decisions.
    pub fn choose(&self, view: &ClusterView<'_>) -> Vec<(usize, Option<usize>)> {
        let g = Geometry::of(self.model);
        let catalog = g.catalog();
        // Demand per compute size (1..=total), by the smallest catalog shape
        // with at least the job's compute and memory slices.
        let sizes: Vec<(u8, u8)> = {
            let mut v: Vec<(u8, u8)> = catalog
                .iter()
                .flat_map(|l| l.iter().map(|id| g.placement(id).shape()))
                .map(|s| (s.compute, s.memory))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let class_of =
            |compute: u8, memory: u8| sizes.iter().position(|&(c, m)| c >= compute && m >= memory);
        let mut uncovered = vec![0i64; sizes.len()];
        for job in view.pending {
            if let Some(s) = job.shape(self.model) {
                if let Some(k) = class_of(s.compute, s.memory) {
                    uncovered[k] += 1;
                }
            }
        }
        for st in view.gpus.iter().filter(|s| s.model == self.model) {
            for id in st.idle().iter() {
                let s = g.placement(id).shape();
                if let Some(k) = sizes
                    .iter()
                    .position(|&(c, m)| c == s.compute && m == s.memory)
                {
                    uncovered[k] -= 1;
                }
            }
        }
        let adaptive = self.base.adaptive.map(|a| a.targets(view));
        let mut out = Vec::new();
        for (gi, st) in view.gpus.iter().enumerate() {
            if st.model != self.model {
                continue;
            }
            let rest = || {
                match &adaptive {
                    Some(t) => t.get(gi).copied(),
                    None => self.base_of(gi, view.gpus.len(), view.hour_of_day),
                }
                .filter(|&b| b != st.layout && st.accepts(b))
                .and_then(|b| g.catalog_index(b))
            };
            if st.in_reconfiguration {
                out.push((gi, None));
                continue;
            }
            if uncovered.iter().all(|&u| u <= 0) {
                out.push((gi, rest()));
                continue;
            }
            let idle_counts = |l: Layout| {
                let mut c = vec![0i64; sizes.len()];
                for id in l.minus(st.busy).iter() {
                    let s = g.placement(id).shape();
                    if let Some(k) = sizes
                        .iter()
                        .position(|&(cc, m)| cc == s.compute && m == s.memory)
                    {
                        c[k] += 1;
                    }
                }
                c
            };
            let cover = |counts: &[i64]| -> i64 {
                counts
                    .iter()
                    .zip(&uncovered)
                    .zip(&sizes)
                    .map(|((&n, &u), &(c, _))| n.min(u.max(0)) * i64::from(c))
                    .sum()
            };
            // Idle instances of the current layout are already subtracted
            // from `uncovered`: only what a target adds counts.
            let current = idle_counts(st.layout);
            let mut best: Option<(i64, usize, usize)> = None;
            for (a, &target) in catalog.iter().enumerate() {
                if target == st.layout || !st.accepts(target) {
                    continue;
                }
                let counts = idle_counts(target);
                // Instances the target adds over the current layout.
                let gained: Vec<i64> = counts
                    .iter()
                    .zip(&current)
                    .map(|(&t, &c)| (t - c).max(0))
                    .collect();
                let score = cover(&gained);
                let changed = g.transition(st.layout, target);
                let churn = changed.destroy.len() + changed.create.len();
                if score > 0
                    && best.is_none_or(|(s, ch, _)| score > s || (score == s && churn < ch))
                {
                    best = Some((score, churn, a));
                }
            }
            match best {
                Some((_, _, a)) => {
                    let counts = idle_counts(catalog[a]);
                    for (k, (&t, &c)) in counts.iter().zip(&current).enumerate() {
                        uncovered[k] -= (t - c).max(0);
                    }
                    out.push((gi, Some(a)));
                }
                None => out.push((gi, rest())),
            }
        }
        out
    }
}

impl RepartitionPolicy for Teacher {
    fn name(&self) -> String {
        "teacher".into()
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        let catalog = Geometry::of(self.model).catalog();
        self.choose(view)
            .into_iter()
            .filter_map(|(gpu, a)| {
                a.map(|a| Decision {
                    gpu,
                    target: catalog[a],
                })
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------
// Rollouts.

/// How the rollout policy acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The teacher acts; its actions are the labels.
    Teacher,
    /// Actions sampled from the network (PPO).
    Sample,
    /// Most probable action (evaluation).
    Greedy,
}

/// One agent step.
#[derive(Clone, Debug)]
struct Step {
    gpu: usize,
    epoch: usize,
    action: u32,
    logp: f32,
    value: f32,
}

/// The policy object driven by the simulator during training.
struct Rollout<'m> {
    net: &'m ActorCritic,
    encoder: Encoder,
    teacher: Teacher,
    mode: Mode,
    rng: ChaCha8Rng,
    ledger: Rc<RefCell<Ledger>>,
    obs: Vec<f32>,
    mask: Vec<f32>,
    steps: Vec<Step>,
    /// Per epoch: team energy, team tardiness, per-GPU energy, per-GPU tardiness.
    epoch_e: Vec<Vec<f64>>,
    epoch_t: Vec<Vec<f64>>,
    error: Option<LearnError>,
}

impl RepartitionPolicy for Rollout<'_> {
    fn name(&self) -> String {
        "learning".into()
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        let (e, t) = self.ledger.borrow_mut().advance(view.now);
        self.epoch_e.push(e);
        self.epoch_t.push(t);
        let epoch = self.epoch_e.len() - 1;
        self.encoder.encode(view);
        let spec = *self.encoder.spec();
        let rows = self.encoder.gpus.len();
        let acting: Vec<usize> = (0..rows).filter(|&r| self.encoder.choices(r) > 1).collect();
        if acting.is_empty() {
            return Vec::new();
        }
        let (d, a) = (spec.obs_dim, spec.actions);
        let mut obs = Vec::with_capacity(acting.len() * d);
        let mut mask = Vec::with_capacity(acting.len() * a);
        for &r in &acting {
            obs.extend_from_slice(&self.encoder.obs[r * d..(r + 1) * d]);
            mask.extend_from_slice(&self.encoder.mask[r * a..(r + 1) * a]);
        }
        let teacher_actions = (self.mode == Mode::Teacher).then(|| self.teacher.choose(view));
        let (probs, values) = match self.net.act(&obs, &mask, acting.len()).and_then(|(_, p)| {
            let o = Tensor::from_slice(&obs, (acting.len(), d), &Device::Cpu)?;
            let v = self.net.values(&o)?.to_vec1::<f32>()?;
            Ok((p, v))
        }) {
            Ok(x) => x,
            Err(e) => {
                self.error.get_or_insert(e);
                return Vec::new();
            }
        };
        let mut decisions = Vec::new();
        for (i, &r) in acting.iter().enumerate() {
            let gpu = self.encoder.gpus[r];
            let p = &probs[i * a..(i + 1) * a];
            let m = &mask[i * a..(i + 1) * a];
            let action = match self.mode {
                Mode::Greedy => argmax_masked(p, m),
                Mode::Sample => sample(&mut self.rng, p, m),
                Mode::Teacher => teacher_actions
                    .as_ref()
                    .and_then(|t| t.iter().find(|(g, _)| *g == gpu))
                    .and_then(|&(_, act)| act)
                    .filter(|&act| m[act] > 0.5)
                    .unwrap_or(spec.keep_action()),
            };
            self.obs.extend_from_slice(&obs[i * d..(i + 1) * d]);
            self.mask.extend_from_slice(m);
            self.steps.push(Step {
                gpu,
                epoch,
                action: action as u32,
                logp: p[action].max(1e-30).ln(),
                value: values[i],
            });
            if let Some(dec) = spec.decode(gpu, &view.gpus[gpu], action) {
                decisions.push(dec);
            }
        }
        decisions
    }
}

fn sample(rng: &mut ChaCha8Rng, probs: &[f32], mask: &[f32]) -> usize {
    let total: f32 = probs
        .iter()
        .zip(mask)
        .filter(|(_, &m)| m > 0.5)
        .map(|(p, _)| p)
        .sum();
    let mut x = rng.random::<f32>() * total;
    let mut last = probs.len() - 1;
    for (a, (&p, &m)) in probs.iter().zip(mask).enumerate() {
        if m > 0.5 {
            last = a;
            if x < p {
                return a;
            }
            x -= p;
        }
    }
    last
}

/// The transitions of one or more episodes, ready for an update.
#[derive(Default, Debug)]
pub struct Batch {
    pub obs: Vec<f32>,
    pub mask: Vec<f32>,
    pub actions: Vec<u32>,
    pub logp: Vec<f32>,
    pub advantages: Vec<f32>,
    pub returns: Vec<f32>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.actions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }
}

/// What one episode gave.
#[derive(Clone, Debug)]
pub struct Episode {
    pub metrics: Metrics,
    pub et: Option<f64>,
    /// Sum of team rewards (= -ET when everything ran).
    pub team_return: f64,
}

/// A workload day (an episode) and its `none` reference totals.
pub struct Day {
    pub cluster: Vec<GpuModel>,
    pub jobs: Vec<Job>,
    pub seed: u64,
    /// End of the arrival window, s (a day, or a trace window).
    pub horizon_s: f64,
    pub reference: Metrics,
}

impl Day {
    /// A diurnal day of `cfg.workload` with this seed.
    pub fn new(cfg: &TrainConfig, gpus: usize, seed: u64) -> Result<Self, LearnError> {
        let jobs = generate_diurnal(&cfg.workload, cfg.gpu_model, gpus, seed);
        Day::from_jobs(cfg, gpus, jobs, seed, cfg.workload.horizon_s)
    }

    /// An episode over given jobs (e.g. a trace window of `horizon_s`).
    pub fn from_jobs(
        cfg: &TrainConfig,
        gpus: usize,
        jobs: Vec<Job>,
        seed: u64,
        horizon_s: f64,
    ) -> Result<Self, LearnError> {
        let cluster = vec![cfg.gpu_model; gpus];
        let mut h = cfg.heuristic()?.build(seed);
        let mut none = crate::policy::NoPartition;
        let mut day = Day {
            cluster,
            jobs,
            seed,
            horizon_s,
            reference: Metrics::default(),
        };
        day.reference = simulate(
            &day.cluster,
            &day.jobs,
            h.as_mut(),
            &mut none,
            &day.sim_config(cfg),
            RunHooks::default(),
        )?
        .metrics;
        Ok(day)
    }

    /// Scores `policy` on this day for the searches and checkpoint choices:
    /// ET plus 1 if a job never ran (ET counts only jobs that ran, so a
    /// layout too small for the biggest jobs would otherwise look good).
    pub fn objective(
        &self,
        cfg: &TrainConfig,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<Objective, LearnError> {
        let (m, et) = self.evaluate(cfg, policy)?;
        Ok(Objective {
            et,
            starved: m.unserved + m.rejected > 0,
        })
    }

    /// The simulator settings of this episode.
    pub fn sim_config(&self, cfg: &TrainConfig) -> SimConfig {
        SimConfig {
            workload_horizon_s: Some(self.horizon_s),
            ..cfg.sim_config(self.seed)
        }
    }

    /// Runs any policy on this day; returns its metrics and ET vs `none`.
    pub fn evaluate(
        &self,
        cfg: &TrainConfig,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<(Metrics, Option<f64>), LearnError> {
        let mut h = cfg.heuristic()?.build(self.seed);
        let m = simulate(
            &self.cluster,
            &self.jobs,
            h.as_mut(),
            policy,
            &self.sim_config(cfg),
            RunHooks::default(),
        )?
        .metrics;
        let et = EtScore::new(&m, &self.reference, "none".into(), 1.0).et;
        Ok((m, et))
    }
}

/// A day's objective ([`Day::objective`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Objective {
    /// ET vs `none`; `None` when undefined (the reference had no tardiness).
    pub et: Option<f64>,
    /// Whether a job never ran.
    pub starved: bool,
}

impl Objective {
    /// ET plus 1 if a job never ran; `None` where ET is undefined.
    pub fn defined(self) -> Option<f64> {
        self.et.map(|e| self.value(e))
    }

    /// ET (or `undefined` where it is) plus 1 if a job never ran.
    pub fn or(self, undefined: f64) -> f64 {
        self.value(self.et.unwrap_or(undefined))
    }

    fn value(self, et: f64) -> f64 {
        if self.starved {
            et + 1.0
        } else {
            et
        }
    }
}

/// Runs one episode with `net` in `mode`, appending its transitions to
/// `batch` (advantages and returns computed with `ppo`'s gamma and lambda).
pub fn run_episode(
    cfg: &TrainConfig,
    net: &ActorCritic,
    day: &Day,
    mode: Mode,
    base: &Base,
    rng_seed: u64,
    batch: &mut Batch,
) -> Result<Episode, LearnError> {
    let sim_cfg = day.sim_config(cfg);
    let ledger = Rc::new(RefCell::new(Ledger::new(&day.cluster, &sim_cfg)));
    let mut rollout = Rollout {
        net,
        encoder: Encoder::new(cfg.gpu_model),
        teacher: Teacher::new(cfg.gpu_model, base.clone()),
        mode,
        rng: ChaCha8Rng::seed_from_u64(rng_seed),
        ledger: Rc::clone(&ledger),
        obs: Vec::new(),
        mask: Vec::new(),
        steps: Vec::new(),
        epoch_e: Vec::new(),
        epoch_t: Vec::new(),
        error: None,
    };
    let mut sink = LedgerSink(Rc::clone(&ledger));
    let mut h = cfg.heuristic()?.build(day.seed);
    let result = simulate(
        &day.cluster,
        &day.jobs,
        h.as_mut(),
        &mut rollout,
        &sim_cfg,
        RunHooks {
            sink: Some(&mut sink),
            progress: None,
        },
    )?;
    if let Some(e) = rollout.error.take() {
        return Err(e);
    }
    let m = result.metrics;
    let et = EtScore::new(&m, &day.reference, "none".into(), 1.0).et;

    // Rewards per epoch, with the remainder after the last epoch added to it.
    let n = day.cluster.len();
    let e_ref = day.reference.energy_j.max(1.0);
    let t_ref = day.reference.total_tardiness_s.max(1.0);
    let epochs = rollout.epoch_e.len();
    if epochs > 0 {
        let (tail_e, tail_t) = ledger.borrow_mut().advance(m.horizon_s);
        let e_sum: f64 = rollout.epoch_e.iter().flatten().sum::<f64>() + tail_e.iter().sum::<f64>();
        let t_sum: f64 = rollout.epoch_t.iter().flatten().sum::<f64>() + tail_t.iter().sum::<f64>();
        let last = epochs - 1;
        for g in 0..n {
            rollout.epoch_e[last][g] += tail_e[g];
            rollout.epoch_t[last][g] += tail_t[g];
        }
        // Tiny gaps (energy of jobs still running at the end, counted in the
        // ledger by construction) are reconciled onto the last epoch so the
        // return matches the simulator's totals.
        let de = m.energy_j - e_sum;
        let dt = m.total_tardiness_s - t_sum;
        rollout.epoch_e[last][0] += de;
        rollout.epoch_t[last][0] += dt;
        // A job that never ran is charged as if it finished at the horizon
        // plus its own work: not in ET (which counts jobs that ran), but the
        // policy must not learn to starve jobs.
        let starved: f64 = ledger
            .borrow()
            .unserved
            .iter()
            .map(|&d| (m.horizon_s - d).max(0.0) + UNSERVED_PENALTY_S)
            .sum();
        rollout.epoch_t[last][0] += starved;
    }
    // Rewards are known for epoch k once epoch k+1 happened: reward of the
    // step at epoch k = what accrued in (t_k, t_{k+1}], i.e. epoch_x[k + 1].
    let w = cfg.local_weight;
    let team: Vec<f64> = (0..epochs)
        .map(|k| {
            let (e, t) = next_interval(&rollout.epoch_e, &rollout.epoch_t, k);
            -(e.iter().sum::<f64>() / e_ref + t.iter().sum::<f64>() / t_ref) / 2.0
        })
        .collect();
    let team_return: f64 = team.iter().sum::<f64>()
        - (rollout
            .epoch_e
            .first()
            .map_or(0.0, |e| e.iter().sum::<f64>())
            / e_ref
            + rollout
                .epoch_t
                .first()
                .map_or(0.0, |t| t.iter().sum::<f64>())
                / t_ref)
            / 2.0;
    let reward = |k: usize, g: usize| -> f64 {
        let (e, t) = next_interval(&rollout.epoch_e, &rollout.epoch_t, k);
        let local = -(n as f64)
            * (e.get(g).copied().unwrap_or(0.0) / e_ref + t.get(g).copied().unwrap_or(0.0) / t_ref)
            / 2.0;
        (1.0 - w) * team[k] + w * local
    };

    // Per agent: steps in epoch order; reward of a step = rewards of every
    // epoch from it to the agent's next step (exclusive).
    let mut by_gpu: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, s) in rollout.steps.iter().enumerate() {
        by_gpu[s.gpu].push(i);
    }
    let d = net.obs_dim;
    let a = net.actions;
    let gamma = cfg.ppo.gamma;
    let lambda = cfg.ppo.gae_lambda;
    let mut adv = vec![0.0f32; rollout.steps.len()];
    let mut ret = vec![0.0f32; rollout.steps.len()];
    for (g, idx) in by_gpu.iter().enumerate() {
        let mut next_value = 0.0f64;
        let mut next_adv = 0.0f64;
        for (j, &i) in idx.iter().enumerate().rev() {
            let s = &rollout.steps[i];
            let until = idx.get(j + 1).map_or(epochs, |&k| rollout.steps[k].epoch);
            let r: f64 = (s.epoch..until).map(|k| reward(k, g)).sum();
            let delta = r + gamma * next_value - f64::from(s.value);
            next_adv = delta + gamma * lambda * next_adv;
            adv[i] = next_adv as f32;
            ret[i] = (next_adv + f64::from(s.value)) as f32;
            next_value = f64::from(s.value);
        }
    }
    batch.obs.extend_from_slice(&rollout.obs);
    batch.mask.extend_from_slice(&rollout.mask);
    for (i, s) in rollout.steps.iter().enumerate() {
        batch.actions.push(s.action);
        batch.logp.push(s.logp);
        batch.advantages.push(adv[i]);
        batch.returns.push(ret[i]);
    }
    debug_assert_eq!(batch.obs.len(), batch.actions.len() * d);
    debug_assert_eq!(batch.mask.len(), batch.actions.len() * a);
    Ok(Episode {
        metrics: m,
        et,
        team_return,
    })
}

fn next_interval<'a>(e: &'a [Vec<f64>], t: &'a [Vec<f64>], k: usize) -> (&'a [f64], &'a [f64]) {
    match (e.get(k + 1), t.get(k + 1)) {
        (Some(e), Some(t)) => (e, t),
        _ => (&[], &[]),
    }
}

// ---------------------------------------------------------------------------
// Updates.

fn tensors(
    batch: &Batch,
    idx: &[usize],
    d: usize,
    a: usize,
) -> Result<(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor), LearnError> {
    let n = idx.len();
    let mut obs = Vec::with_capacity(n * d);
    let mut mask = Vec::with_capacity(n * a);
    let mut act = Vec::with_capacity(n);
    let mut logp = Vec::with_capacity(n);
    let mut adv = Vec::with_capacity(n);
    let mut ret = Vec::with_capacity(n);
    for &i in idx {
        obs.extend_from_slice(&batch.obs[i * d..(i + 1) * d]);
        mask.extend_from_slice(&batch.mask[i * a..(i + 1) * a]);
        act.push(batch.actions[i]);
        logp.push(batch.logp[i]);
        adv.push(batch.advantages[i]);
        ret.push(batch.returns[i]);
    }
    let dev = &Device::Cpu;
    Ok((
        Tensor::from_vec(obs, (n, d), dev)?,
        Tensor::from_vec(mask, (n, a), dev)?,
        Tensor::from_vec(act, (n, 1), dev)?,
        Tensor::from_vec(logp, n, dev)?,
        Tensor::from_vec(adv, n, dev)?,
        Tensor::from_vec(ret, n, dev)?,
    ))
}

fn shuffled(n: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.random_range(0..=i);
        idx.swap(i, j);
    }
    idx
}

/// Behaviour cloning (actor) and value regression (critic) on a teacher batch.
pub fn imitation_update(
    net: &ActorCritic,
    opt: &mut AdamW,
    batch: &Batch,
    epochs: usize,
    minibatch: usize,
    rng: &mut ChaCha8Rng,
) -> Result<f32, LearnError> {
    let (d, a) = (net.obs_dim, net.actions);
    let mut last = 0.0;
    for _ in 0..epochs {
        let idx = shuffled(batch.len(), rng);
        for chunk in idx.chunks(minibatch) {
            let (obs, mask, act, _, _, ret) = tensors(batch, chunk, d, a)?;
            let logits = net.masked_logits(&obs, &mask)?;
            let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            let ce = logp.gather(&act, 1)?.squeeze(1)?.mean_all()?.neg()?;
            let v = net.values(&obs)?;
            let vloss = (v - ret)?.sqr()?.mean_all()?;
            let loss = (ce.clone() + (vloss * 0.5)?)?;
            opt.backward_step(&loss)?;
            last = ce.to_scalar::<f32>()?;
        }
    }
    Ok(last)
}

/// PPO epochs over `batch` (advantages normalised per batch).
pub fn ppo_update(
    net: &ActorCritic,
    opt: &mut AdamW,
    batch: &mut Batch,
    p: &PpoConfig,
    rng: &mut ChaCha8Rng,
) -> Result<(), LearnError> {
    let (d, a) = (net.obs_dim, net.actions);
    let n = batch.len() as f32;
    let mean = batch.advantages.iter().sum::<f32>() / n;
    let var = batch
        .advantages
        .iter()
        .map(|x| (x - mean).powi(2))
        .sum::<f32>()
        / n;
    let std = var.sqrt().max(1e-8);
    for x in &mut batch.advantages {
        *x = (*x - mean) / std;
    }
    for _ in 0..p.epochs {
        let idx = shuffled(batch.len(), rng);
        for chunk in idx.chunks(p.minibatch) {
            let (obs, mask, act, old_logp, adv, ret) = tensors(batch, chunk, d, a)?;
            let logits = net.masked_logits(&obs, &mask)?;
            let logp_all = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            let logp = logp_all.gather(&act, 1)?.squeeze(1)?;
            let log_ratio = (logp - old_logp)?;
            if p.target_kl > 0.0 {
                // k3 estimator of KL(old || new): E[(r - 1) - ln r].
                let kl = ((log_ratio.exp()? - 1.0)? - &log_ratio)?
                    .mean_all()?
                    .to_scalar::<f32>()?;
                if f64::from(kl) > p.target_kl {
                    return Ok(());
                }
            }
            let ratio = log_ratio.exp()?;
            let s1 = (&ratio * &adv)?;
            let s2 = (ratio.clamp(1.0 - p.clip, 1.0 + p.clip)? * &adv)?;
            let pi_loss = s1.minimum(&s2)?.mean_all()?.neg()?;
            let probs = logp_all.exp()?;
            // Masked actions have probability 0 and log-probability -1e9:
            // their product is 0, so they add nothing to the entropy.
            let entropy = (probs * logp_all)?.sum(D::Minus1)?.mean_all()?.neg()?;
            let v = net.values(&obs)?;
            let vloss = (v - ret)?.sqr()?.mean_all()?;
            let loss = ((pi_loss + (vloss * p.value_coef)?)? - (entropy * p.entropy)?)?;
            opt.backward_step(&loss)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The whole run.

/// Progress reports from [`train`].
#[derive(Clone, Debug)]
pub enum Progress {
    Phase {
        name: &'static str,
        steps: usize,
    },
    Step {
        phase: &'static str,
        step: usize,
        mean_return: f64,
        mean_et: Option<f64>,
    },
    Validation {
        step: usize,
        et: Option<f64>,
        static_best_et: Option<f64>,
    },
}

/// Outcome of training.
#[derive(Clone, Debug, Serialize)]
pub struct TrainReport {
    pub seconds: f64,
    pub imitation_episodes: usize,
    pub ppo_iterations: usize,
    pub episodes: usize,
    pub validation_seed: u64,
    pub validation_days: usize,
    pub validation_gpus: usize,
    pub validation_et: Option<f64>,
    pub validation_teacher_et: Option<f64>,
    pub validation_static_best_et: Option<f64>,
    pub validation_static_best_layout: String,
    /// Best checkpoint (by validation ET): "imitation" or "ppo:<iteration>".
    pub chosen: String,
}

/// The `static-best` assignment of [`crate::policy::search`] on `day`
/// (hindsight coordinate descent over per-GPU catalog layouts) and its ET.
/// The objective is ET plus 1 per run that leaves a job unserved (ET counts
/// only jobs that ran, so a layout too small for the biggest jobs would
/// otherwise look good).
pub fn static_best(
    cfg: &TrainConfig,
    day: &Day,
) -> Result<(Option<f64>, Vec<Layout>, String), LearnError> {
    let mut evaluate = |p: &mut dyn RepartitionPolicy| -> Result<f64, LearnError> {
        Ok(day.objective(cfg, p)?.or(f64::INFINITY))
    };
    let best = crate::policy::search::static_best(
        &day.cluster,
        &crate::policy::search::SearchConfig::coarse(),
        &mut evaluate,
    )?;
    let label = crate::policy::search::describe_assignment(&day.cluster, best.policy.layouts());
    Ok((
        best.score.is_finite().then_some(best.score),
        best.policy.layouts().to_vec(),
        label,
    ))
}

/// The search objective over `days` (same cluster): mean ET plus 1 per run
/// that leaves a job unserved.
fn objective<'a>(
    cfg: &'a TrainConfig,
    days: &'a [Day],
) -> impl FnMut(&mut dyn RepartitionPolicy) -> Result<f64, LearnError> + 'a {
    move |p: &mut dyn RepartitionPolicy| {
        let mut sum = 0.0;
        for day in days {
            sum += day.objective(cfg, p)?.or(f64::INFINITY);
        }
        Ok(sum / days.len().max(1) as f64)
    }
}

/// The `twice-daily` search of [`crate::policy::search`] on `days` (mean
/// objective), as the teacher's day and night resting layouts.
pub fn twice_daily_base(cfg: &TrainConfig, days: &[Day]) -> Result<Base, LearnError> {
    if days.is_empty() {
        return Ok(Base::default());
    }
    let best = twice_daily_search(cfg, days)?;
    Ok(Base {
        day: best.policy.day().to_vec(),
        night: best.policy.night().to_vec(),
        day_hour: best.policy.day_hour,
        night_hour: best.policy.night_hour,
        adaptive: None,
    })
}

/// The `twice-daily` search of [`crate::policy::search`] on `days` (mean
/// objective; `days` must not be empty).
pub fn twice_daily_search(
    cfg: &TrainConfig,
    days: &[Day],
) -> Result<crate::policy::search::TwiceDailyBest, LearnError> {
    let first = days
        .first()
        .ok_or_else(|| LearnError::Other("twice-daily search needs a day".into()))?;
    let mut evaluate = objective(cfg, days);
    let scfg = crate::policy::search::SearchConfig::coarse();
    let statics = crate::policy::search::static_best(&first.cluster, &scfg, &mut evaluate)?;
    crate::policy::search::twice_daily(
        &first.cluster,
        &scfg,
        &statics,
        cfg.workload.start_hour,
        &mut evaluate,
    )
}

/// The [`Adaptive`] rule with the lowest mean objective on `days`: a grid
/// over the best uniform layouts (as split layout), thresholds and gains.
pub fn adaptive_search(cfg: &TrainConfig, days: &[Day]) -> Result<(Adaptive, f64), LearnError> {
    let g = Geometry::of(cfg.gpu_model);
    let mut evaluate = objective(cfg, days);
    // Split layouts: the best uniform ones that are not the whole GPU.
    let mut uniform = Vec::new();
    for (i, &l) in g.catalog().iter().enumerate() {
        if l == g.whole_gpu() {
            continue;
        }
        let mut p = Adaptive {
            split: i,
            threshold: 0.0,
            gain: 1e9,
        };
        uniform.push((evaluate(&mut p)?, i));
    }
    uniform.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut best = (
        f64::INFINITY,
        Adaptive {
            split: 0,
            threshold: 0.0,
            gain: 0.0,
        },
    );
    for &(_, split) in uniform.iter().take(4) {
        for threshold in [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0] {
            for gain in [0.25, 0.5, 1.0, 2.0, 4.0, 1e9] {
                let mut p = Adaptive {
                    split,
                    threshold,
                    gain,
                };
                let sc = evaluate(&mut p)?;
                if sc < best.0 {
                    best = (sc, p);
                }
            }
        }
    }
    Ok((best.1, best.0))
}

/// Where the teacher's resting layouts come from (`teacher_base` in the
/// training config).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TeacherBase {
    /// The best single catalog layout on every GPU.
    Uniform,
    /// The best per-GPU mix (`policy::search::static_best`).
    StaticBest,
    /// A day and a night mix (`policy::search::twice_daily`).
    TwiceDaily,
    /// A load-driven rule ([`Adaptive`]) instead of the clock.
    Adaptive,
}

/// The teacher's resting layouts searched on `days` (`cfg.teacher_base`).
pub fn teacher_base(cfg: &TrainConfig, days: &[Day]) -> Result<Base, LearnError> {
    let Some(first) = days.first() else {
        return Ok(Base::default());
    };
    Ok(match cfg.teacher_base {
        TeacherBase::Uniform => Base::fixed(vec![best_uniform(cfg, days)?]),
        TeacherBase::Adaptive => Base {
            adaptive: Some(adaptive_search(cfg, days)?.0),
            ..Base::default()
        },
        TeacherBase::StaticBest => {
            let best = crate::policy::search::static_best(
                &first.cluster,
                &crate::policy::search::SearchConfig::coarse(),
                &mut objective(cfg, days),
            )?;
            Base::fixed(best.policy.layouts().to_vec())
        }
        TeacherBase::TwiceDaily => twice_daily_base(cfg, days)?,
    })
}

/// The catalog layout with the lowest mean ET on `days` when every GPU uses
/// it (jobs it cannot hold are ignored, as ET does).
pub fn best_uniform(cfg: &TrainConfig, days: &[Day]) -> Result<Layout, LearnError> {
    let g = Geometry::of(cfg.gpu_model);
    let mut best = (f64::INFINITY, g.whole_gpu());
    for &l in g.catalog() {
        let mut sum = 0.0;
        for day in days {
            let mut p = crate::policy::search::StaticMix::from_indices(
                "uniform",
                &day.cluster,
                &vec![g.catalog_index(l).unwrap_or(0); day.cluster.len()],
            );
            sum += day.evaluate(cfg, &mut p)?.1.unwrap_or(f64::INFINITY);
        }
        if sum < best.0 {
            best = (sum, l);
        }
    }
    Ok(best.1)
}

/// A deterministic evaluation policy over a candle network (same decisions
/// as the exported ONNX policy, up to float ties).
pub struct CandlePolicy<'m> {
    pub net: &'m ActorCritic,
    encoder: Encoder,
}

impl<'m> CandlePolicy<'m> {
    pub fn new(net: &'m ActorCritic, model: GpuModel) -> Self {
        CandlePolicy {
            net,
            encoder: Encoder::new(model),
        }
    }
}

impl RepartitionPolicy for CandlePolicy<'_> {
    fn name(&self) -> String {
        "candle".into()
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        self.encoder.encode(view);
        let rows = self.encoder.gpus.len();
        if rows == 0 {
            return Vec::new();
        }
        let spec: FeatureSpec = *self.encoder.spec();
        let Ok((_, probs)) = self.net.act(&self.encoder.obs, &self.encoder.mask, rows) else {
            return Vec::new();
        };
        let a = spec.actions;
        (0..rows)
            .filter_map(|r| {
                let act = argmax_masked(
                    &probs[r * a..(r + 1) * a],
                    &self.encoder.mask[r * a..(r + 1) * a],
                );
                let gpu = self.encoder.gpus[r];
                spec.decode(gpu, &view.gpus[gpu], act)
            })
            .collect()
    }
}

/// Where the training episodes come from.
#[derive(Clone, Debug, Default)]
pub enum TrainingData {
    /// Diurnal days of `cfg.workload`, a new seed per episode; validation on
    /// `cfg.validation.days` days from `cfg.validation.seed`.
    #[default]
    Diurnal,
    /// Windows of a trace ([`crate::workload::Trace::windows`]): episodes
    /// cycle through `train`; the checkpoint is chosen on `validation`
    /// (later windows, never trained on).
    Trace {
        /// What the windows are, for the metadata.
        description: String,
        window_s: f64,
        train: Vec<Vec<Job>>,
        validation: Vec<Vec<Job>>,
    },
}

impl TrainingData {
    /// Splits `trace` into windows of `window_s` for training: windows whose
    /// `none` run has no tardiness (ET undefined) are left out, the last
    /// `cfg.validation.days` remaining ones validate, the rest train.
    /// Fails, naming the numbers, when that leaves no training window.
    pub fn from_trace(
        cfg: &TrainConfig,
        trace: &crate::workload::Trace,
        window_s: f64,
        description: String,
    ) -> Result<Self, LearnError> {
        if !(window_s.is_finite() && window_s > 0.0) {
            return Err(LearnError::Config(format!(
                "trace window {window_s} s is not a positive duration"
            )));
        }
        let windows = trace.windows(window_s);
        let total = windows.len();
        let mut usable = Vec::new();
        for (k, jobs) in windows {
            let day = Day::from_jobs(cfg, cfg.validation.gpus, jobs, k as u64, window_s)?;
            if day.reference.mean_tardiness_s > 0.0 {
                usable.push(day.jobs);
            }
        }
        let v = cfg.validation.days;
        if usable.len() <= v {
            return Err(LearnError::Config(format!(
                "the trace gives {total} windows of {:.1} h, {} with late jobs on whole GPUs \
                 ({} GPUs); training needs more than validation.days = {v} of them \
                 (use shorter windows, fewer validation days or fewer GPUs)",
                window_s / 3600.0,
                usable.len(),
                cfg.validation.gpus
            )));
        }
        let validation = usable.split_off(usable.len() - v);
        Ok(TrainingData::Trace {
            description: format!(
                "{description}: {total} windows of {:.1} h, {} used for training, the last {v} \
                 with late jobs for validation",
                window_s / 3600.0,
                usable.len()
            ),
            window_s,
            train: usable,
            validation,
        })
    }

    /// For the metadata.
    pub fn describe(&self, cfg: &TrainConfig) -> String {
        match self {
            TrainingData::Diurnal => format!(
                "simulated diurnal days (generate_diurnal, seeds from {}), {} GPUs per episode",
                cfg.seed.wrapping_mul(1_000_003) + 1,
                cfg.gpus
                    .iter()
                    .map(std::string::ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("/")
            ),
            TrainingData::Trace { description, .. } => description.clone(),
        }
    }
}

/// The best network seen so far (by validation ET) and where it came from.
struct Checkpoint {
    et: Option<f64>,
    net: ActorCritic,
    label: String,
}

impl Checkpoint {
    /// Keeps a copy of `net` if its validation ET beats the best so far.
    fn offer(
        &mut self,
        et: Option<f64>,
        net: &ActorCritic,
        label: impl FnOnce() -> String,
    ) -> Result<(), LearnError> {
        if let Some(e) = et {
            if self.et.is_none_or(|b| e < b) {
                self.et = Some(e);
                self.net = net.clone_deep()?;
                self.label = label();
            }
        }
        Ok(())
    }
}

/// Trains a policy; returns the best network (by validation ET) and a report.
pub fn train(
    cfg: &TrainConfig,
    data: &TrainingData,
    mut progress: impl FnMut(Progress),
) -> Result<(ActorCritic, TrainReport), LearnError> {
    cfg.validate()?;
    if let TrainingData::Trace {
        train, validation, ..
    } = data
    {
        if train.is_empty() || validation.is_empty() {
            return Err(LearnError::Config(
                "trace training data needs at least one training and one validation window".into(),
            ));
        }
    }
    let started = Instant::now();
    let spec = FeatureSpec::new(cfg.gpu_model);
    let net = ActorCritic::new(spec.obs_dim, spec.actions, cfg.hidden, cfg.seed)?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5EED);
    let mut vars = net.actor_vars();
    vars.extend(net.critic_vars());
    let mut opt = AdamW::new(
        vars,
        ParamsAdamW {
            lr: cfg.imitation.lr,
            weight_decay: 0.0,
            ..ParamsAdamW::default()
        },
    )?;
    let validation: Vec<Day> = match data {
        TrainingData::Diurnal => (0..cfg.validation.days as u64)
            .map(|k| Day::new(cfg, cfg.validation.gpus, cfg.validation.seed + k))
            .collect::<Result<_, _>>()?,
        TrainingData::Trace {
            validation,
            window_s,
            ..
        } => validation
            .iter()
            .enumerate()
            .map(|(k, jobs)| {
                let seed = cfg.validation.seed + k as u64;
                Day::from_jobs(cfg, cfg.validation.gpus, jobs.clone(), seed, *window_s)
            })
            .collect::<Result<_, _>>()?,
    };
    let mut static_best_et = Some(0.0);
    let mut labels = Vec::new();
    for day in &validation {
        let (et, _, label) = static_best(cfg, day)?;
        static_best_et = static_best_et.zip(et).map(|(a, b)| a + b);
        labels.push(label);
    }
    let static_best_et = static_best_et.map(|s| s / validation.len() as f64);
    let static_best_layout = labels.join("; ");
    // The teacher's resting layout: the best static layout of a training
    // day (never the validation day).
    // Base days: seed * 1_000_003 (training episodes use the seeds right
    // after it), then seeds far beyond any episode's.
    // Trace: the first training windows.
    let base_days: Vec<Day> = match data {
        TrainingData::Diurnal => (0..cfg.teacher_days as u64)
            .map(|k| {
                let s = cfg.seed.wrapping_mul(1_000_003);
                let s = if k == 0 { s } else { s + 500_000 + k };
                Day::new(cfg, cfg.gpus[0], s)
            })
            .collect::<Result<_, _>>()?,
        TrainingData::Trace {
            train, window_s, ..
        } => train
            .iter()
            .take(cfg.teacher_days)
            .enumerate()
            .map(|(k, jobs)| Day::from_jobs(cfg, cfg.gpus[0], jobs.clone(), k as u64, *window_s))
            .collect::<Result<_, _>>()?,
    };
    let base = teacher_base(cfg, &base_days)?;
    let base = &base;
    let mut teacher_et = Some(0.0);
    for day in &validation {
        let (_, et) = day.evaluate(cfg, &mut Teacher::new(cfg.gpu_model, base.clone()))?;
        teacher_et = teacher_et.zip(et).map(|(a, b)| a + b);
    }
    let teacher_et = teacher_et.map(|s| s / validation.len() as f64);
    let over_budget = |started: &Instant| started.elapsed().as_secs_f64() > cfg.time_budget_s;
    let mut episode_seed = cfg.seed.wrapping_mul(1_000_003);
    let mut episode = 0usize;
    let mut next_day = |k: usize| -> Result<Day, LearnError> {
        episode_seed += 1;
        let gpus = cfg.gpus[k % cfg.gpus.len()];
        match data {
            TrainingData::Diurnal => Day::new(cfg, gpus, episode_seed),
            TrainingData::Trace {
                train, window_s, ..
            } => {
                // Cycle through the windows in order (deterministic).
                let jobs = train[episode % train.len()].clone();
                episode += 1;
                Day::from_jobs(cfg, gpus, jobs, episode_seed, *window_s)
            }
        }
    };
    let mut episodes = 0usize;

    // 1. imitation
    progress(Progress::Phase {
        name: "imitation",
        steps: cfg.imitation.episodes,
    });
    let mut teacher_batch = Batch::default();
    for k in 0..cfg.imitation.episodes {
        if over_budget(&started) {
            break;
        }
        let day = next_day(k)?;
        let ep = run_episode(
            cfg,
            &net,
            &day,
            Mode::Teacher,
            base,
            rng.random(),
            &mut teacher_batch,
        )?;
        episodes += 1;
        progress(Progress::Step {
            phase: "imitation",
            step: k + 1,
            mean_return: ep.team_return,
            mean_et: ep.et,
        });
    }
    if !teacher_batch.is_empty() {
        imitation_update(
            &net,
            &mut opt,
            &teacher_batch,
            cfg.imitation.epochs,
            cfg.imitation.minibatch,
            &mut rng,
        )?;
    }
    // A checkpoint that leaves jobs unserved on the validation day is never
    // chosen (ET alone would not see them).
    let validate = |net: &ActorCritic| -> Result<Option<f64>, LearnError> {
        let mut sum = Some(0.0);
        for day in &validation {
            let mut p = CandlePolicy::new(net, cfg.gpu_model);
            let et = day.objective(cfg, &mut p)?.defined();
            sum = sum.zip(et).map(|(a, b)| a + b);
        }
        Ok(sum.map(|s| s / validation.len() as f64))
    };
    let first = validate(&net)?;
    let mut best = Checkpoint {
        et: first,
        net: net.clone_deep()?,
        label: "imitation".to_string(),
    };
    progress(Progress::Validation {
        step: 0,
        et: first,
        static_best_et,
    });

    // 2. PPO
    opt.set_learning_rate(cfg.ppo.lr);
    progress(Progress::Phase {
        name: "ppo",
        steps: cfg.ppo.iterations,
    });
    let mut iterations = 0;
    for it in 0..cfg.ppo.iterations {
        if over_budget(&started) {
            break;
        }
        let mut batch = Batch::default();
        let mut ret = 0.0;
        let mut ets = Vec::new();
        for k in 0..cfg.ppo.episodes_per_iteration {
            let day = next_day(it * cfg.ppo.episodes_per_iteration + k)?;
            let ep = run_episode(
                cfg,
                &net,
                &day,
                Mode::Sample,
                base,
                rng.random(),
                &mut batch,
            )?;
            episodes += 1;
            ret += ep.team_return;
            ets.extend(ep.et);
        }
        if !batch.is_empty() {
            ppo_update(&net, &mut opt, &mut batch, &cfg.ppo, &mut rng)?;
        }
        iterations += 1;
        let n = cfg.ppo.episodes_per_iteration.max(1) as f64;
        progress(Progress::Step {
            phase: "ppo",
            step: it + 1,
            mean_return: ret / n,
            mean_et: (!ets.is_empty()).then(|| ets.iter().sum::<f64>() / ets.len() as f64),
        });
        if (it + 1) % cfg.validation.every == 0 || it + 1 == cfg.ppo.iterations {
            let et = validate(&net)?;
            progress(Progress::Validation {
                step: it + 1,
                et,
                static_best_et,
            });
            best.offer(et, &net, || format!("ppo:{}", it + 1))?;
        }
    }
    // 3. ES fine-tuning of the best checkpoint so far.
    if cfg.es.iterations > 0 {
        progress(Progress::Phase {
            name: "es",
            steps: cfg.es.iterations,
        });
        let es_net = best.net.clone_deep()?;
        for it in 0..cfg.es.iterations {
            if over_budget(&started) {
                break;
            }
            let days: Vec<Day> = (0..cfg.es.days)
                .map(&mut next_day)
                .collect::<Result<_, _>>()?;
            let mean = super::es::step(cfg, &cfg.es, &es_net, &days, rng.random())?;
            episodes += 2 * cfg.es.pairs * days.len();
            progress(Progress::Step {
                phase: "es",
                step: it + 1,
                mean_return: -mean,
                mean_et: Some(mean),
            });
            if (it + 1) % cfg.validation.every == 0 || it + 1 == cfg.es.iterations {
                let et = validate(&es_net)?;
                progress(Progress::Validation {
                    step: iterations + it + 1,
                    et,
                    static_best_et,
                });
                best.offer(et, &es_net, || format!("es:{}", it + 1))?;
            }
        }
    }
    let report = TrainReport {
        seconds: started.elapsed().as_secs_f64(),
        imitation_episodes: cfg.imitation.episodes,
        ppo_iterations: iterations,
        episodes,
        validation_seed: cfg.validation.seed,
        validation_days: cfg.validation.days,
        validation_gpus: cfg.validation.gpus,
        validation_et: best.et,
        validation_teacher_et: teacher_et,
        validation_static_best_et: static_best_et,
        validation_static_best_layout: static_best_layout,
        chosen: best.label,
    };
    Ok((best.net, report))
}

impl ActorCritic {
    /// A copy with its own parameters (candle `Var`s are shared handles, so
    /// `clone` would alias the weights being trained).
    pub fn clone_deep(&self) -> Result<Self, LearnError> {
        let copy = |m: &super::model::Mlp| -> Result<super::model::Mlp, LearnError> {
            let mut layers = m.layers.clone();
            for l in &mut layers {
                l.weight = candle_core::Var::from_tensor(&l.weight.as_tensor().copy()?)?;
                l.bias = candle_core::Var::from_tensor(&l.bias.as_tensor().copy()?)?;
            }
            Ok(super::model::Mlp { layers })
        };
        Ok(ActorCritic {
            obs_dim: self.obs_dim,
            actions: self.actions,
            hidden: self.hidden,
            actor: copy(&self.actor)?,
            critic: copy(&self.critic)?,
        })
    }
}
