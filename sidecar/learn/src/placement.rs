//! Training the learned job placement: masked PPO over the simulator's
//! placement decisions (`smartmig train --config etc/train-placement.toml`,
//! docs/policy.md, "The learned placement").
//!
//! One decision = one waiting job (earliest deadline first) and the free
//! instances that fit it; the action is the profile of the instance
//! (masked to the offered ones), the observation
//! [`crate::sim::placement_features`]. The reward comes at once, because
//! the engine does not preempt: when a job starts, its end is known, so
//! the decision is charged `-(late + tardiness + energy)` of that job
//! ([`RewardWeights`]); what the choice does to the jobs behind it reaches
//! it through the discounted returns (GAE over the day's decisions in time
//! order). Episodes are the yardstick's scenario days (both deadline
//! regimes) under each training repartitioning policy.
//!
//! The run: behaviour cloning of a teacher (a heuristic, or one that also
//! defers late jobs: [`parse_teacher`]), then PPO with linear learning-rate
//! and entropy schedules, keeping the network that makes the fewest late
//! jobs on the validation days relative to the best heuristic, with steep
//! penalties for energy above it by more than [`ENERGY_TOLERANCE`] and for
//! per-day tardiness above it; the caller exports the actor with its
//! metadata ([`crate::sim::placement_onnx`]).

use std::time::Instant;

use candle_nn::Optimizer;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::checkpoint::Checkpoint;
use super::config::{ImitationConfig, PpoConfig};
use super::model::ActorCritic;
use super::ppo::{imitation_update, optimiser, ppo_update};
use super::rollout::{sample, Batch};
use super::LearnError;
use crate::eval::Day;
use crate::mig::GpuModel;
use crate::policy::features::argmax_masked;
use crate::policy::parse_policy;
use crate::scenario::{default_scenarios, select_scenarios, Scenario};
use crate::sim::deferral::DeferSpec;
use crate::sim::placement_features::PlacementFeatures;
use crate::sim::{
    simulate, Candidate, Heuristic, Metrics, Pick, PlacementContext, PlacementHeuristic,
    PlacementSpec, RunHooks, Standing,
};
use crate::workload::Job;

/// Energy a checkpoint may add over the best heuristic on the validation
/// days (relative) before the choice penalises it.
pub const ENERGY_TOLERANCE: f64 = 0.01;

/// `etc/train-placement.toml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementTrainConfig {
    /// Must be `"placement"` (what tells `smartmig train` this file apart
    /// from a repartitioning config).
    pub kind: String,
    pub gpu_model: GpuModel,
    pub seed: u64,
    /// Width of the two hidden layers.
    pub hidden: usize,
    /// Wall-clock budget, s: PPO stops early when it is spent.
    pub time_budget_s: f64,
    /// The heuristic behaviour cloning starts from; `auto`: the one with
    /// the fewest late jobs on the validation days.
    pub teacher: String,
    pub data: PlacementData,
    pub reward: RewardWeights,
    pub imitation: ImitationConfig,
    pub ppo: PpoConfig,
    /// Learning rate and entropy weight at the last PPO iteration (linear
    /// from `ppo.lr` and `ppo.entropy`).
    pub lr_end: f64,
    pub entropy_end: f64,
    /// Validate every this many PPO iterations.
    pub validate_every: usize,
    /// Checkpoint choice: weight of the tardiness above the best
    /// heuristic's (relative) against the share of late jobs saved.
    pub select_tardiness: f64,
}

/// Which days episodes run on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementData {
    /// Scenario or family names of the yardstick (empty: all).
    pub scenarios: Vec<String>,
    pub gpus: usize,
    /// Training seeds `train_seed..train_seed + train_days` per scenario
    /// (the suite's training days are seeds 0..8, its test days 1000..).
    pub train_seed: u64,
    pub train_days: usize,
    pub validation_seed: u64,
    pub validation_days: usize,
    /// Repartitioning policies the episodes run under (specs as in
    /// `--policy`; ones needing a file are not allowed here).
    pub policies: Vec<String>,
}

/// The reward of one decision, for the job it starts:
/// `-(late x [ends after its deadline] + tardiness x min(tardiness s /
/// scale, 8) + energy x GPU-seconds / work)`, where `scale` is the mean
/// tardiness per job of `edf` on the episode (at least
/// `tardiness_scale_s`): tardiness counts relative to what the day makes
/// normal, as ET counts it against a reference.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardWeights {
    pub late: f64,
    pub tardiness: f64,
    pub tardiness_scale_s: f64,
    pub energy: f64,
}

impl Default for PlacementTrainConfig {
    fn default() -> Self {
        PlacementTrainConfig {
            kind: "placement".into(),
            gpu_model: GpuModel::A100_40gb,
            seed: 11,
            hidden: 64,
            time_budget_s: 840.0,
            teacher: "auto".into(),
            data: PlacementData::default(),
            reward: RewardWeights::default(),
            imitation: ImitationConfig {
                episodes: 20,
                epochs: 10,
                minibatch: 256,
                lr: 1e-3,
            },
            ppo: PpoConfig {
                iterations: 60,
                episodes_per_iteration: 8,
                epochs: 4,
                minibatch: 512,
                lr: 3e-4,
                gamma: 0.99,
                gae_lambda: 0.95,
                clip: 0.15,
                entropy: 0.02,
                value_coef: 0.5,
                target_kl: 0.05,
            },
            lr_end: 1e-5,
            entropy_end: 0.001,
            validate_every: 5,
            select_tardiness: 1.0,
        }
    }
}

impl Default for PlacementData {
    fn default() -> Self {
        PlacementData {
            scenarios: Vec::new(),
            gpus: 8,
            train_seed: 0,
            train_days: 8,
            validation_seed: 500,
            validation_days: 2,
            policies: vec!["none".into(), "greedy".into()],
        }
    }
}

impl Default for RewardWeights {
    fn default() -> Self {
        RewardWeights {
            late: 1.0,
            tardiness: 0.25,
            tardiness_scale_s: 60.0,
            energy: 0.1,
        }
    }
}

impl PlacementTrainConfig {
    pub fn validate(&self) -> Result<(), LearnError> {
        let bad = |m: String| Err(LearnError::Config(m));
        if self.kind != "placement" {
            return bad(format!("kind = \"{}\", expected \"placement\"", self.kind));
        }
        if self.hidden == 0 || self.data.gpus == 0 {
            return bad("hidden and data.gpus must be > 0".into());
        }
        if self.data.train_days == 0 || self.data.validation_days == 0 {
            return bad("data.train_days and data.validation_days must be > 0".into());
        }
        let train = self.data.train_seed..self.data.train_seed + self.data.train_days as u64;
        let val =
            self.data.validation_seed..self.data.validation_seed + self.data.validation_days as u64;
        let test = 1000..1100u64;
        if train.start < val.end && val.start < train.end {
            return bad(format!(
                "training seeds {train:?} and validation seeds {val:?} overlap"
            ));
        }
        if [&train, &val]
            .iter()
            .any(|r| r.start < test.end && test.start < r.end)
        {
            return bad(format!(
                "training {train:?} or validation {val:?} seeds meet the suite's test seeds 1000..1100"
            ));
        }
        if self.data.policies.is_empty() {
            return bad("data.policies must name at least one repartitioning policy".into());
        }
        if self.imitation.minibatch == 0 || self.ppo.minibatch == 0 || self.validate_every == 0 {
            return bad("minibatch sizes and validate_every must be > 0".into());
        }
        let w = self.reward;
        if ![w.late, w.tardiness, w.energy, self.select_tardiness]
            .iter()
            .all(|x| x.is_finite() && *x >= 0.0)
        {
            return bad("reward weights and select_tardiness must be finite and >= 0".into());
        }
        if !(w.tardiness_scale_s.is_finite() && w.tardiness_scale_s > 0.0) {
            return bad("reward.tardiness_scale_s must be > 0".into());
        }
        if self.teacher != "auto" {
            parse_teacher(&self.teacher)?;
        }
        for p in &self.data.policies {
            parse_policy(p, &[self.gpu_model])
                .map_err(|e| LearnError::Config(format!("data.policies `{p}`: {e}")))?;
        }
        self.scenarios()?;
        Ok(())
    }

    /// The scenarios episodes are drawn from.
    pub fn scenarios(&self) -> Result<Vec<Scenario>, LearnError> {
        select_scenarios(default_scenarios(), &self.data.scenarios)
            .map_err(|e| LearnError::Config(format!("data.scenarios: {e}")))
    }
}

/// One episode's workload: a scenario day under a repartitioning policy.
#[derive(Clone, Debug)]
pub struct Episode {
    pub day: Day,
    /// Scenario name, for reports.
    pub scenario: String,
    pub policy: String,
    /// `edf` on this day under this policy: the reward's tardiness scale
    /// and the validation's per-day reference.
    pub edf: Metrics,
}

impl Episode {
    /// The reward's tardiness scale on this day ([`RewardWeights`]).
    pub fn tardiness_scale_s(&self, floor_s: f64) -> f64 {
        (self.edf.total_tardiness_s / self.edf.jobs.max(1) as f64).max(floor_s)
    }
}

/// Every (scenario, seed, policy) of a seed range.
pub fn episodes(
    cfg: &PlacementTrainConfig,
    seed: u64,
    days: usize,
) -> Result<Vec<Episode>, LearnError> {
    let mut out = Vec::new();
    for s in cfg.scenarios()? {
        for seed in seed..seed + days as u64 {
            let jobs = s.generate(cfg.gpu_model, cfg.data.gpus, seed);
            let day = Day::generated(jobs, seed, s.horizon_s(), s.start_hour());
            for p in &cfg.data.policies {
                let mut ep = Episode {
                    day: day.clone(),
                    scenario: s.name.clone(),
                    policy: p.clone(),
                    edf: Metrics::default(),
                };
                ep.edf = run_heuristic(cfg, Heuristic::Edf, &ep)?;
                out.push(ep);
            }
        }
    }
    Ok(out)
}

/// How the network acts in an episode.
pub enum Mode {
    /// Sample from the masked probabilities (PPO rollouts).
    Sample(Box<ChaCha8Rng>),
    /// The most probable allowed action (validation; what ONNX runs).
    Greedy,
    /// Follow a heuristic and record its choices (behaviour cloning).
    Teacher(Box<dyn PlacementHeuristic + Send>),
}

/// The transitions of one episode in decision order.
#[derive(Default, Debug)]
struct Trace {
    obs: Vec<f32>,
    mask: Vec<f32>,
    actions: Vec<u32>,
    logp: Vec<f32>,
    rewards: Vec<f32>,
}

/// The network as a placement heuristic inside the simulator, recording
/// every decision.
struct Actor<'n> {
    net: &'n ActorCritic,
    features: PlacementFeatures,
    mode: Mode,
    weights: RewardWeights,
    trace: Trace,
    obs: Vec<f32>,
    mask: Vec<f32>,
    /// The first candle error (the run then goes on with best-fit).
    error: Option<LearnError>,
    fallback: Box<dyn PlacementHeuristic + Send>,
}

impl Actor<'_> {
    fn act(
        &mut self,
        job: &Job,
        candidates: &[Candidate],
        ctx: &PlacementContext<'_>,
    ) -> Result<Option<(usize, f32)>, LearnError> {
        let (obs, mask) = (&mut self.obs, &mut self.mask);
        if !self.features.encode(job, candidates, ctx, obs, mask) {
            return Ok(None);
        }
        Ok(Some(match &mut self.mode {
            Mode::Teacher(h) => {
                let pick = h.choose_in(job, candidates, ctx);
                let c = candidates[pick.candidate.min(candidates.len() - 1)];
                match self.features.action_of(&c) {
                    _ if pick.defer && mask[self.features.defer_action()] > 0.5 => {
                        (self.features.defer_action(), 0.0)
                    }
                    Some(a) => (a, 0.0),
                    None => return Ok(None),
                }
            }
            Mode::Sample(rng) => {
                let (_, probs) = self.net.act(obs, mask, 1)?;
                let a = sample(rng, &probs, mask);
                (a, probs[a].max(1e-12).ln())
            }
            Mode::Greedy => {
                let (_, probs) = self.net.act(obs, mask, 1)?;
                let a = argmax_masked(&probs, mask);
                (a, probs[a].max(1e-12).ln())
            }
        }))
    }
}

/// The reward of starting `job` on an instance of `c` at `now`
/// ([`RewardWeights`]).
pub fn reward(w: RewardWeights, job: &Job, c: &Candidate, now: f64) -> f64 {
    let speed = job.speed(c.compute, c.total_compute).max(1e-9);
    let work = job.work.max(1e-9);
    let end = now + work / speed;
    let tardiness = (end - job.deadline).max(0.0);
    let late = if end > job.deadline { 1.0 } else { 0.0 };
    let gpu_s_per_work = f64::from(c.compute) / f64::from(c.total_compute) / speed;
    -(w.late * late
        + w.tardiness * (tardiness / w.tardiness_scale_s).min(8.0)
        + w.energy * gpu_s_per_work)
}

impl PlacementHeuristic for Actor<'_> {
    fn name(&self) -> &'static str {
        "learned"
    }

    fn priority(&self, job: &Job) -> f64 {
        job.deadline
    }

    fn choose(&mut self, job: &Job, candidates: &[Candidate]) -> Pick {
        self.fallback.choose(job, candidates)
    }

    fn choose_in(
        &mut self,
        job: &Job,
        candidates: &[Candidate],
        ctx: &PlacementContext<'_>,
    ) -> Pick {
        let acted = match self.act(job, candidates, ctx) {
            Ok(a) => a,
            Err(e) => {
                self.error.get_or_insert(e);
                None
            }
        };
        let Some((action, logp)) = acted else {
            return self.fallback.choose(job, candidates);
        };
        let defer = action == self.features.defer_action();
        let candidate = self.features.candidate_of(candidates, action);
        if candidate.is_none() && !defer {
            return self.fallback.choose(job, candidates);
        }
        let t = &mut self.trace;
        t.obs.extend_from_slice(&self.obs);
        t.mask.extend_from_slice(&self.mask);
        t.actions.push(action as u32);
        t.logp.push(logp);
        // A deferred job is charged when it starts; deferring itself costs
        // nothing, its effect shows in the rewards of the jobs it let by.
        t.rewards.push(
            candidate.map_or(0.0, |c| reward(self.weights, job, &candidates[c], ctx.now)) as f32,
        );
        match candidate {
            Some(candidate) => Pick {
                candidate,
                gpu_hint: 0,
                defer: false,
            },
            None => Pick {
                defer: true,
                ..self.fallback.choose(job, candidates)
            },
        }
    }
}

/// A teacher: a heuristic (`cedf`, ...) or a heuristic with a deferral
/// rule (`cedf+rescue:0.5:3:6`, `cedf+defer-late:2`; see
/// `smartmig_core::sim::deferral`), parsed as `--placement` parses them;
/// a learned file is not a teacher.
pub fn parse_teacher(spec: &str) -> Result<Box<dyn PlacementHeuristic + Send>, LearnError> {
    let bad = |e: String| LearnError::Config(format!("teacher `{spec}`: {e}"));
    match spec
        .parse::<PlacementSpec>()
        .map_err(|e| bad(e.to_string()))?
    {
        PlacementSpec::Learned(_) => Err(bad(
            "a teacher is a heuristic or a deferral rule, not a learned file".into(),
        )),
        rule => rule.build(0, None).map_err(|e| bad(e.to_string())),
    }
}

/// Runs one episode; returns its metrics and its transitions.
fn run_episode(
    cfg: &PlacementTrainConfig,
    net: &ActorCritic,
    ep: &Episode,
    mode: Mode,
) -> Result<(Metrics, Trace), LearnError> {
    let mut policy = parse_policy(&ep.policy, &[cfg.gpu_model])
        .map_err(|e| LearnError::Config(format!("policy `{}`: {e}", ep.policy)))?;
    let mut actor = Actor {
        net,
        features: PlacementFeatures::new(cfg.gpu_model),
        mode,
        weights: RewardWeights {
            tardiness_scale_s: ep.tardiness_scale_s(cfg.reward.tardiness_scale_s),
            ..cfg.reward
        },
        trace: Trace::default(),
        obs: Vec::new(),
        mask: Vec::new(),
        error: None,
        fallback: Heuristic::BestFit.build(0),
    };
    let cluster = vec![cfg.gpu_model; cfg.data.gpus];
    let r = simulate(
        &cluster,
        &ep.day.jobs,
        &mut actor,
        policy.as_mut(),
        &ep.day.cfg,
        RunHooks::default(),
    )?;
    if let Some(e) = actor.error {
        return Err(e);
    }
    Ok((r.metrics, actor.trace))
}

/// Runs a rule-based heuristic on an episode.
fn run_heuristic(
    cfg: &PlacementTrainConfig,
    h: Heuristic,
    ep: &Episode,
) -> Result<Metrics, LearnError> {
    let mut policy = parse_policy(&ep.policy, &[cfg.gpu_model])
        .map_err(|e| LearnError::Config(format!("policy `{}`: {e}", ep.policy)))?;
    let mut heuristic = h.build(ep.day.cfg.seed);
    let cluster = vec![cfg.gpu_model; cfg.data.gpus];
    Ok(simulate(
        &cluster,
        &ep.day.jobs,
        heuristic.as_mut(),
        policy.as_mut(),
        &ep.day.cfg,
        RunHooks::default(),
    )?
    .metrics)
}

/// Appends an episode's transitions to `batch` with GAE advantages over
/// the decisions in order (the critic sees the observation; its mean-field
/// inputs, meaningless here, are zeros).
fn append(
    net: &ActorCritic,
    t: &Trace,
    gamma: f64,
    lambda: f64,
    batch: &mut Batch,
) -> Result<(), LearnError> {
    let n = t.actions.len();
    if n == 0 {
        return Ok(());
    }
    let (d, a) = (net.obs_dim, net.actions);
    let zeros = vec![0.0f32; n * 2 * a];
    let critic_in = super::rollout::critic_inputs(&t.obs, &zeros, d, a);
    let values = net
        .values(&candle_core::Tensor::from_vec(
            critic_in,
            (n, super::model::critic_dim(d, a)),
            &candle_core::Device::Cpu,
        )?)?
        .to_vec1::<f32>()?;
    let (adv, ret) = gae(&t.rewards, &values, gamma, lambda);
    batch.obs.extend_from_slice(&t.obs);
    batch.mean_actions.extend_from_slice(&zeros);
    batch.mask.extend_from_slice(&t.mask);
    batch.actions.extend_from_slice(&t.actions);
    batch.logp.extend_from_slice(&t.logp);
    batch.advantages.extend(adv);
    batch.returns.extend(ret);
    Ok(())
}

/// Generalised advantage estimation over one sequence that ends with the
/// episode (value 0 after the last step). Returns (advantages, returns).
pub fn gae(rewards: &[f32], values: &[f32], gamma: f64, lambda: f64) -> (Vec<f32>, Vec<f32>) {
    let n = rewards.len();
    let mut adv = vec![0.0f32; n];
    let mut ret = vec![0.0f32; n];
    let (mut next_value, mut next_adv) = (0.0f64, 0.0f64);
    for i in (0..n).rev() {
        let v = f64::from(values[i]);
        let delta = f64::from(rewards[i]) + gamma * next_value - v;
        next_adv = delta + gamma * lambda * next_adv;
        adv[i] = next_adv as f32;
        ret[i] = (next_adv + v) as f32;
        next_value = v;
    }
    (adv, ret)
}

/// Late jobs and energy summed over episodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    pub late_jobs: u64,
    pub energy_j: f64,
    pub tardiness_s: f64,
    pub jobs: u64,
}

impl Totals {
    fn add(&mut self, m: &Metrics) {
        self.late_jobs += m.late_jobs;
        self.energy_j += m.energy_j;
        self.tardiness_s += m.total_tardiness_s;
        self.jobs += m.jobs;
    }
}

/// What the run did, for the metadata and the CLI.
#[derive(Clone, Debug, Serialize)]
pub struct PlacementReport {
    pub seconds: f64,
    pub teacher: String,
    pub teacher_totals: Totals,
    /// The heuristic with the fewest late jobs on the validation days.
    pub best_heuristic: String,
    pub episodes: usize,
    pub ppo_iterations: usize,
    /// Best checkpoint: `imitation` or `ppo:<iteration>`.
    pub chosen: String,
    /// Validation totals of every heuristic and of the chosen network.
    pub validation_heuristics: Vec<(String, Totals)>,
    pub validation_learned: Totals,
    pub validation_days: usize,
    pub train_days: usize,
}

/// Progress of a run, for a progress bar.
pub enum PlacementProgress {
    Phase(&'static str),
    Iteration {
        iteration: usize,
        of: usize,
        mean_reward: f64,
    },
    Validation {
        iteration: usize,
        late_jobs: u64,
        /// Of the best heuristic.
        teacher_late_jobs: u64,
        energy_ratio: f64,
        tardiness_ratio: f64,
    },
}

/// Trains a placement network (module docs); returns it and a report.
pub fn train_placement(
    cfg: &PlacementTrainConfig,
    mut progress: impl FnMut(PlacementProgress),
) -> Result<(ActorCritic, PlacementReport), LearnError> {
    cfg.validate()?;
    let started = Instant::now();
    let features = PlacementFeatures::new(cfg.gpu_model);
    let net = ActorCritic::new(features.obs_dim, features.actions, cfg.hidden, cfg.seed)?;
    let train = episodes(cfg, cfg.data.train_seed, cfg.data.train_days)?;
    let val = episodes(cfg, cfg.data.validation_seed, cfg.data.validation_days)?;

    progress(PlacementProgress::Phase(
        "heuristics on the validation days",
    ));
    let heuristics = heuristic_totals(cfg, &val)?;
    let (best_rule, best_totals_rule) = best_heuristic(&heuristics);
    let teacher_spec = teacher_of(cfg, best_rule);
    let mut teacher_totals = Totals::default();
    for ep in &val {
        let mode = Mode::Teacher(parse_teacher(&teacher_spec)?);
        teacher_totals.add(&run_episode(cfg, &net, ep, mode)?.0);
    }

    let mut opt = optimiser(&net, cfg.imitation.lr)?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x9_1ACE);
    let mut episodes_run = 0usize;
    let mut picker = Picker {
        next: 0,
        len: train.len(),
    };
    let mut pick = |n: usize| picker.pick(n);

    // 1. Behaviour cloning of the teacher.
    progress(PlacementProgress::Phase("imitation"));
    let mut batch = Batch::default();
    for i in pick(cfg.imitation.episodes) {
        let mode = Mode::Teacher(parse_teacher(&teacher_spec)?);
        let (_, t) = run_episode(cfg, &net, &train[i], mode)?;
        append(&net, &t, cfg.ppo.gamma, cfg.ppo.gae_lambda, &mut batch)?;
        episodes_run += 1;
    }
    if !batch.is_empty() {
        imitation_update(
            &net,
            &mut opt,
            &batch,
            cfg.imitation.epochs,
            cfg.imitation.minibatch,
            &mut rng,
        )?;
    }
    let validator = Validator::new(cfg, &val, best_rule, best_totals_rule)?;
    let (obj, totals) = validator.score(&net)?;
    progress(validator.progress(0, &totals));
    // The placement's own objective (late jobs count every job that never
    // ran); no separate unserved rank.
    let mut best = Checkpoint::new(Standing::new(0, obj), &net, "imitation".into())?;
    let mut best_totals = totals;

    // 2. PPO.
    progress(PlacementProgress::Phase("ppo"));
    let iterations = cfg.ppo.iterations;
    let mut done = 0usize;
    for it in 1..=iterations {
        if started.elapsed().as_secs_f64() > cfg.time_budget_s {
            break;
        }
        let p = ppo_at(cfg, it, iterations);
        opt.set_learning_rate(p.lr);
        let picked = pick(cfg.ppo.episodes_per_iteration);
        let (mut batch, reward_sum) =
            sampled_batch(cfg, &net, &train, &picked, &mut episodes_run, &p)?;
        let decisions = batch.len().max(1);
        if !batch.is_empty() {
            ppo_update(&net, &mut opt, &mut batch, &p, &mut rng)?;
        }
        done = it;
        progress(PlacementProgress::Iteration {
            iteration: it,
            of: iterations,
            mean_reward: reward_sum / decisions as f64,
        });
        if it % cfg.validate_every == 0 || it == iterations {
            let (obj, totals) = validator.score(&net)?;
            progress(validator.progress(it, &totals));
            if Standing::new(0, obj).beats(&best.score) {
                best_totals = totals;
            }
            best.offer(Standing::new(0, obj), &net, || format!("ppo:{it}"))?;
        }
    }
    let report = PlacementReport {
        seconds: started.elapsed().as_secs_f64(),
        teacher: teacher_spec,
        teacher_totals,
        best_heuristic: best_rule.to_string(),
        episodes: episodes_run,
        ppo_iterations: done,
        chosen: best.label.clone(),
        validation_heuristics: heuristics
            .iter()
            .map(|(h, t)| (h.to_string(), *t))
            .collect(),
        validation_learned: best_totals,
        validation_days: val.len(),
        train_days: train.len(),
    };
    Ok((best.net, report))
}

/// PPO's settings at iteration `it` of `iterations`: the learning rate and
/// the entropy bonus move linearly from their start to their end.
fn ppo_at(cfg: &PlacementTrainConfig, it: usize, iterations: usize) -> PpoConfig {
    let frac = if iterations > 1 {
        (it - 1) as f64 / (iterations - 1) as f64
    } else {
        1.0
    };
    let lr = cfg.ppo.lr + (cfg.lr_end - cfg.ppo.lr) * frac;
    PpoConfig {
        entropy: cfg.ppo.entropy + (cfg.entropy_end - cfg.ppo.entropy) * frac,
        lr,
        ..cfg.ppo.clone()
    }
}

/// The batch of the `picked` training episodes, each sampled with a seed
/// of its own (`episodes_run` counts them), and the sum of their rewards.
fn sampled_batch(
    cfg: &PlacementTrainConfig,
    net: &ActorCritic,
    train: &[Episode],
    picked: &[usize],
    episodes_run: &mut usize,
    p: &PpoConfig,
) -> Result<(Batch, f64), LearnError> {
    let mut batch = Batch::default();
    let mut reward_sum = 0.0f64;
    for &i in picked {
        let mode = Mode::Sample(Box::new(ChaCha8Rng::seed_from_u64(
            cfg.seed ^ (*episodes_run as u64).wrapping_mul(0x9E37_79B9),
        )));
        let (_, t) = run_episode(cfg, net, &train[i], mode)?;
        reward_sum += t.rewards.iter().map(|&r| f64::from(r)).sum::<f64>();
        append(net, &t, p.gamma, p.gae_lambda, &mut batch)?;
        *episodes_run += 1;
    }
    Ok((batch, reward_sum))
}

/// Every heuristic's totals on the validation days.
fn heuristic_totals(
    cfg: &PlacementTrainConfig,
    val: &[Episode],
) -> Result<Vec<(Heuristic, Totals)>, LearnError> {
    let mut heuristics = Vec::new();
    for h in Heuristic::ALL {
        let mut t = Totals::default();
        for ep in val {
            t.add(&run_heuristic(cfg, h, ep)?);
        }
        heuristics.push((h, t));
    }
    Ok(heuristics)
}

/// The yardstick of checkpoint selection: the heuristic with the fewest
/// late jobs on the validation days (then the least energy).
fn best_heuristic(heuristics: &[(Heuristic, Totals)]) -> (Heuristic, Totals) {
    heuristics
        .iter()
        .min_by(|a, b| {
            a.1.late_jobs
                .cmp(&b.1.late_jobs)
                .then(a.1.energy_j.total_cmp(&b.1.energy_j))
        })
        .map_or((Heuristic::Edf, Totals::default()), |(h, t)| (*h, *t))
}

/// The teacher as it ran: a rule's defaults are written out, so the
/// metadata says what taught the file even if the defaults change.
fn teacher_of(cfg: &PlacementTrainConfig, best_rule: Heuristic) -> String {
    if cfg.teacher == "auto" {
        best_rule.to_string()
    } else if let Ok(rule) = cfg.teacher.parse::<DeferSpec>() {
        rule.to_string()
    } else {
        cfg.teacher.clone()
    }
}

/// The training episodes to run next: a fixed stride through the
/// (scenario, seed, policy) list visits every kind of day evenly.
struct Picker {
    next: usize,
    len: usize,
}

impl Picker {
    fn pick(&mut self, n: usize) -> Vec<usize> {
        (0..n)
            .map(|_| {
                let i = self.next % self.len;
                self.next += 7;
                if self.next.is_multiple_of(self.len) {
                    self.next += 1;
                }
                i
            })
            .collect()
    }
}

/// Scores a network on the validation days against the best heuristic.
struct Validator<'a> {
    cfg: &'a PlacementTrainConfig,
    val: &'a [Episode],
    /// Per validation episode, the best heuristic's tardiness: the
    /// checkpoint's tardiness counts day by day, so a day with little
    /// tardiness weighs as much as one with much (as ET does).
    best_tardiness: Vec<f64>,
    /// The best heuristic's totals.
    rule: Totals,
}

impl<'a> Validator<'a> {
    fn new(
        cfg: &'a PlacementTrainConfig,
        val: &'a [Episode],
        best_rule: Heuristic,
        rule: Totals,
    ) -> Result<Self, LearnError> {
        let mut best_tardiness = Vec::with_capacity(val.len());
        for ep in val {
            best_tardiness.push(run_heuristic(cfg, best_rule, ep)?.total_tardiness_s);
        }
        Ok(Validator {
            cfg,
            val,
            best_tardiness,
            rule,
        })
    }

    /// The objective (lower is better) and the totals of `net`: fewer late
    /// jobs than the best heuristic, energy within the tolerance and
    /// tardiness (mean ratio per day) not above it, with steep penalties
    /// beyond.
    fn score(&self, net: &ActorCritic) -> Result<(f64, Totals), LearnError> {
        let mut t = Totals::default();
        let mut tard = 0.0;
        for (ep, &bt) in self.val.iter().zip(&self.best_tardiness) {
            let m = run_episode(self.cfg, net, ep, Mode::Greedy)?.0;
            tard += (m.total_tardiness_s + 60.0) / (bt + 60.0);
            t.add(&m);
        }
        let b = &self.rule;
        let energy = t.energy_j / b.energy_j.max(1.0);
        let late = t.late_jobs as f64 / b.late_jobs.max(1) as f64;
        let tard = tard / self.val.len().max(1) as f64;
        let objective = late
            + 20.0 * (energy - 1.0 - ENERGY_TOLERANCE).max(0.0)
            + self.cfg.select_tardiness * (tard - 1.0).max(0.0);
        Ok((objective, t))
    }

    /// The progress report of a validation after `iteration`.
    fn progress(&self, iteration: usize, totals: &Totals) -> PlacementProgress {
        PlacementProgress::Validation {
            iteration,
            late_jobs: totals.late_jobs,
            teacher_late_jobs: self.rule.late_jobs,
            energy_ratio: totals.energy_j / self.rule.energy_j.max(1.0),
            tardiness_ratio: totals.tardiness_s / self.rule.tardiness_s.max(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gae_by_hand() {
        // gamma 0.5, lambda 1: returns are discounted sums of rewards.
        let (adv, ret) = gae(&[1.0, 2.0, 4.0], &[0.0, 0.0, 0.0], 0.5, 1.0);
        assert_eq!(ret, [1.0 + 0.5 * 2.0 + 0.25 * 4.0, 2.0 + 0.5 * 4.0, 4.0]);
        assert_eq!(adv, ret);
        // With values, lambda 0: one-step TD errors r + gamma V' - V.
        let (adv, _) = gae(&[1.0, 1.0], &[2.0, 4.0], 0.5, 0.0);
        assert_eq!(adv, [1.0 + 0.5 * 4.0 - 2.0, 1.0 - 4.0]);
    }

    /// A late start costs the late weight plus the clipped tardiness; an
    /// on-time one only its GPU-seconds per work.
    #[test]
    fn reward_by_hand() {
        let job = Job {
            id: 1,
            arrival: 0.0,
            work: 700.0,
            speedup: crate::workload::SpeedupCurve::new(1.0, 1.0).unwrap(),
            memory_gb: 4.0,
            deadline: 1000.0,
            class: crate::workload::JobClass::Training,
            requested_slices: None,
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        };
        let c = |compute: u8| Candidate {
            class: 0,
            model: GpuModel::A100_40gb,
            compute,
            total_compute: 7,
            memory_gb: 40,
            profile_index: 5,
            free: 1,
        };
        let w = RewardWeights {
            late: 1.0,
            tardiness: 0.5,
            tardiness_scale_s: 3600.0,
            energy: 0.1,
        };
        // 7g: ends at 700 s, on time; GPU-s per work 1.
        assert!((reward(w, &job, &c(7), 0.0) + 0.1).abs() < 1e-9);
        // 1g: runs 4900 s, ends 3900 s late: 1 + 0.5 x 3900/3600 + 0.1.
        let expected = 1.0 + 0.5 * 3900.0 / 3600.0 + 0.1;
        assert!((reward(w, &job, &c(1), 0.0) + expected).abs() < 1e-9);
        // 30 h late is capped at 8 scale units.
        let late = reward(w, &job, &c(1), 30.0 * 3600.0);
        assert!((late + (1.0 + 0.5 * 8.0 + 0.1)).abs() < 1e-9);
    }

    #[test]
    fn configs_that_would_leak_test_days_are_refused() {
        let mut c = PlacementTrainConfig::default();
        c.validate().unwrap();
        c.data.validation_seed = 999;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("1000..1100"), "{e}");
        let mut c = PlacementTrainConfig::default();
        c.data.validation_seed = 3;
        assert!(c.validate().unwrap_err().to_string().contains("overlap"));
        let c = PlacementTrainConfig {
            kind: "repartition".into(),
            ..PlacementTrainConfig::default()
        };
        assert!(c.validate().is_err());
        let mut c = PlacementTrainConfig::default();
        c.data.policies = vec!["policy:x.onnx".into()];
        assert!(c.validate().is_err());
    }

    /// Teachers parse as `--placement` does: heuristics and deferral
    /// rules; a learned file or a malformed rule is refused by name.
    #[test]
    fn teachers_are_heuristics_or_deferral_rules() {
        for ok in ["cedf", "eft", "cedf+rescue", "cedf+defer-late:2"] {
            assert!(parse_teacher(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("fifo", "unknown placement heuristic"),
            ("cedf+rescue:x", "`x` is not a number"),
            ("learned:p.onnx", "not a learned file"),
        ] {
            let e = parse_teacher(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                e.contains(&format!("teacher `{bad}`")) && e.contains(why),
                "{e}"
            );
        }
    }
}
