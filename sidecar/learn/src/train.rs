//! The trainer: the simulator as environment, a demand-covering teacher for
//! the imitation warm start, then PPO with masking (mean-field, shared
//! parameters), then optional ES fine-tuning; the checkpoint with the best
//! validation objective is the result. This module holds the run itself
//! ([`train`]) and its phases; the parts live in sibling modules:
//! [`super::config`], [`super::data`] (days), `super::reward` (the
//! ledger), [`super::teacher`], [`super::rollout`] (episodes),
//! [`super::ppo`] (updates), [`super::es`] and `super::checkpoint`. The
//! re-exports below keep the paths callers used before the split.
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
//! it listens to the event log (`super::reward`), where every job start
//! is recorded with its GPU, slice, start, end and deadline, and integrates
//! the power model over each epoch interval from those records. The team
//! reward of epoch `k` (interval `(t_{k-1}, t_k]`) is
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
//! 3. Optional ES fine-tuning of the best checkpoint ([`super::es`]).
//!
//! Imitation, every `validation.every` PPO and ES iterations and the last
//! of each are validated on days never trained on; the best of them by
//! validation objective is the result (`super::checkpoint`).
//!
//! Deterministic given the seed: the weights are initialised from ChaCha8,
//! actions are sampled from ChaCha8, candle runs on one CPU thread order.

use std::time::Instant;

use candle_nn::{AdamW, Optimizer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::checkpoint::Checkpoint;
use super::model::ActorCritic;
use super::ppo::optimiser;
use super::start::FittedStarts;
use super::LearnError;
use crate::policy::features::FeatureSpec;
use crate::scenario::Scenario;
use crate::sim::Standing;
use crate::workload::{generate_diurnal, Job};

pub use super::config::{
    EsConfig, ImitationConfig, PpoConfig, StartSearch, TeacherBase, TrainConfig, TrainStart,
    ValidationConfig,
};
pub use super::data::{Day, Objective, TrainingData};
pub use super::ppo::{imitation_update, ppo_update};
pub use super::rollout::{run_episode, Batch, CandlePolicy, Episode, Mode};
pub use super::teacher::{
    adaptive_search, best_uniform, static_best, teacher_base, twice_daily_base, twice_daily_search,
    Base, Teacher,
};

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
    /// The fitted starts (`start = "fitted"`) are ready: `fits` searches,
    /// `simulations` simulated days, `seconds` of wall-clock time.
    StartsFitted {
        fits: usize,
        simulations: usize,
        seconds: f64,
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
    /// Best checkpoint (by validation ET): `imitation`, `ppo:<iteration>` or
    /// `es:<iteration>`.
    pub chosen: String,
    /// `start = "fitted"`: each fit's layouts (`diurnal/tight on 8 GPUs:
    /// ...`), empty otherwise.
    pub start_layouts: Vec<String>,
    /// `start = "fitted"`: wall-clock time of the fits, s (part of
    /// `seconds`).
    pub start_fit_seconds: f64,
}

/// Trains a policy; returns the best network (by validation ET) and a report.
pub fn train(
    cfg: &TrainConfig,
    data: &TrainingData,
    mut progress: impl FnMut(Progress),
) -> Result<(ActorCritic, TrainReport), LearnError> {
    cfg.validate()?;
    check_windows(data)?;
    let started = Instant::now();
    let starts = fitted_starts(cfg, data)?;
    if !starts.is_empty() {
        progress(Progress::StartsFitted {
            fits: starts.len(),
            simulations: starts.simulations,
            seconds: starts.seconds,
        });
    }
    let spec = FeatureSpec::new(cfg.gpu_model);
    let net = ActorCritic::new(spec.obs_dim, spec.actions, cfg.hidden, cfg.seed)?;
    let rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5EED);
    let mut opt = optimiser(&net, cfg.imitation.lr)?;
    let validation = validation_days(cfg, data, &starts)?;
    let (static_best_et, static_best_layout) = static_best_on(cfg, &validation)?;
    let base = teacher_base(cfg, &base_days(cfg, data)?)?;
    let teacher_et = teacher_on(cfg, &base, &validation)?;
    let mut run = Run {
        cfg,
        started,
        rng,
        days: EpisodeDays::new(cfg, data, &starts),
        validation,
        static_best_et,
        base,
        episodes: 0,
        progress: &mut progress,
    };

    // 1. closed-loop imitation of the planning teacher, or imitation of
    // the demand-covering teacher
    let mut best = if cfg.dagger.rounds > 0 {
        run.dagger(&net, &mut opt)?
    } else {
        run.imitation(&net, &mut opt)?;
        let first = run.validate(&net)?;
        run.report_validation(0, first);
        Checkpoint::new(first, &net, "imitation".to_string())?
    };
    // 2. PPO
    let iterations = run.ppo(&net, &mut opt, &mut best)?;
    // 3. ES fine-tuning of the best checkpoint so far.
    run.es(iterations, &mut best)?;

    let report = TrainReport {
        seconds: started.elapsed().as_secs_f64(),
        imitation_episodes: cfg.imitation.episodes,
        ppo_iterations: iterations,
        episodes: run.episodes,
        validation_seed: cfg.validation.seed,
        validation_days: cfg.validation.days,
        validation_gpus: cfg.validation.gpus,
        validation_et: Some(best.score.et),
        validation_teacher_et: teacher_et,
        validation_static_best_et: static_best_et,
        validation_static_best_layout: static_best_layout,
        chosen: best.label,
        start_layouts: starts.described.clone(),
        start_fit_seconds: starts.seconds,
    };
    Ok((best.net, report))
}

/// The fitted start of every scenario on every episode and validation
/// cluster size with `start = "fitted"` (`super::start`); none with
/// `start = "own"`. Other data than scenarios is refused with a fitted
/// start: its days have no scenario to generate past days from.
fn fitted_starts(cfg: &TrainConfig, data: &TrainingData) -> Result<FittedStarts, LearnError> {
    if cfg.start == TrainStart::Own {
        return Ok(FittedStarts::default());
    }
    let TrainingData::Scenarios(list) = data else {
        return Err(LearnError::Config(
            "start = \"fitted\" needs scenario training data (--scenarios)".into(),
        ));
    };
    let mut sizes = cfg.gpus.clone();
    sizes.push(cfg.validation.gpus);
    FittedStarts::fit(cfg, list, &sizes)
}

/// Scenario `k`'s day on `gpus` GPUs begins from its fitted start, if any.
fn started(day: Day, starts: &FittedStarts, k: usize, gpus: usize) -> Day {
    match starts.get(k, gpus) {
        Some(l) => day.with_start(l.to_vec()),
        None => day,
    }
}

/// Trace data must hold a training and a validation window.
fn check_windows(data: &TrainingData) -> Result<(), LearnError> {
    if matches!(data, TrainingData::Scenarios(list) if list.is_empty()) {
        return Err(LearnError::Config(
            "scenario training data needs at least one scenario".into(),
        ));
    }
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
    Ok(())
}

/// Seeds of a day's past days are the day's seed plus multiples of this:
/// far from every episode, validation and benchmark seed.
const PAST_SEED_STRIDE: u64 = 1_000_000_007;

/// The past days the planning teacher samples futures from (none without
/// a DAgger phase): other days of the same generator, or the trace
/// windows before `window` (cyclically).
fn past_of(
    cfg: &TrainConfig,
    data: &TrainingData,
    scenario: Option<&Scenario>,
    gpus: usize,
    seed: u64,
    window: usize,
) -> Vec<Vec<Job>> {
    if cfg.dagger.rounds == 0 {
        return Vec::new();
    }
    let count = cfg.dagger.planner.past_days;
    match data {
        TrainingData::Trace { train, .. } if !train.is_empty() => (1..=count)
            .map(|j| train[(window + train.len() * count - j) % train.len()].clone())
            .collect(),
        _ => (1..=count as u64)
            .map(|j| {
                let s = seed.wrapping_add(j.wrapping_mul(PAST_SEED_STRIDE));
                match scenario {
                    Some(sc) => sc.generate(cfg.gpu_model, gpus, s),
                    None => generate_diurnal(&cfg.workload, cfg.gpu_model, gpus, s),
                }
            })
            .collect(),
    }
}

/// The days checkpoints are chosen on: `cfg.validation.days` diurnal days
/// from `cfg.validation.seed`, or the trace's validation windows; a
/// scenario's day begins from its fitted start when there is one.
fn validation_days(
    cfg: &TrainConfig,
    data: &TrainingData,
    starts: &FittedStarts,
) -> Result<Vec<Day>, LearnError> {
    let gpus = cfg.validation.gpus;
    match data {
        TrainingData::Diurnal => (0..cfg.validation.days as u64)
            .map(|k| {
                let seed = cfg.validation.seed + k;
                Ok(Day::new(cfg, gpus, seed)?.with_past(past_of(cfg, data, None, gpus, seed, 0)))
            })
            .collect(),
        TrainingData::Scenarios(list) => (0..cfg.validation.days)
            .map(|k| {
                let seed = cfg.validation.seed + k as u64;
                let s = &list[k % list.len()];
                let past = past_of(cfg, data, Some(s), gpus, seed, 0);
                let day = Day::scenario(cfg, s, gpus, seed)?.with_past(past);
                Ok(started(day, starts, k % list.len(), gpus))
            })
            .collect(),
        TrainingData::Trace {
            train,
            validation,
            window_s,
            ..
        } => validation
            .iter()
            .enumerate()
            .map(|(k, jobs)| {
                let seed = cfg.validation.seed + k as u64;
                let past = past_of(cfg, data, None, gpus, seed, train.len() + k);
                Ok(Day::from_jobs(cfg, gpus, jobs.clone(), seed, *window_s)?.with_past(past))
            })
            .collect(),
    }
}

/// The static-best reference on the validation days: its mean ET and its
/// layouts, per day.
fn static_best_on(
    cfg: &TrainConfig,
    validation: &[Day],
) -> Result<(Option<f64>, String), LearnError> {
    let mut sum = 0.0;
    let mut labels = Vec::new();
    for day in validation {
        let (et, _, label) = static_best(cfg, day)?;
        sum += et;
        labels.push(label);
    }
    Ok((
        Some(sum / validation.len().max(1) as f64),
        labels.join("; "),
    ))
}

/// The training days the teacher's resting layouts are searched on (never
/// a validation day). Diurnal: seed `seed * 1_000_003` (training episodes
/// use the seeds right after it), then seeds far beyond any episode's.
/// Trace: the first training windows.
/// The seed of the `k`-th day the teacher's resting layouts are searched on.
fn base_seed(cfg: &TrainConfig, k: u64) -> u64 {
    let s = cfg.seed.wrapping_mul(1_000_003);
    if k == 0 {
        s
    } else {
        s + 500_000 + k
    }
}

fn base_days(cfg: &TrainConfig, data: &TrainingData) -> Result<Vec<Day>, LearnError> {
    match data {
        TrainingData::Diurnal => (0..cfg.teacher_days as u64)
            .map(|k| Day::new(cfg, cfg.gpus[0], base_seed(cfg, k)))
            .collect(),
        TrainingData::Scenarios(list) => (0..cfg.teacher_days)
            .map(|k| {
                let s = &list[k % list.len()];
                Day::scenario(cfg, s, cfg.gpus[0], base_seed(cfg, k as u64))
            })
            .collect(),
        TrainingData::Trace {
            train, window_s, ..
        } => train
            .iter()
            .take(cfg.teacher_days)
            .enumerate()
            .map(|(k, jobs)| Day::from_jobs(cfg, cfg.gpus[0], jobs.clone(), k as u64, *window_s))
            .collect(),
    }
}

/// The teacher's mean objective on the validation days (the planning
/// teacher's with a DAgger phase, else the imitation teacher's).
fn teacher_on(
    cfg: &TrainConfig,
    base: &Base,
    validation: &[Day],
) -> Result<Option<f64>, LearnError> {
    let mut sum = 0.0;
    for day in validation {
        sum += if cfg.dagger.rounds > 0 {
            day.evaluate(cfg, &mut super::rollout::planner_for(cfg, day)?)?
        } else if day.start.is_empty() {
            day.evaluate(cfg, &mut Teacher::new(cfg.gpu_model, base.clone()))?
        } else {
            // A fitted start: the teacher begins the day there too.
            let mut teacher = crate::policy::start::StartingFrom {
                inner: Teacher::new(cfg.gpu_model, base.clone()),
                layouts: day.start.clone(),
            };
            day.evaluate(cfg, &mut teacher)?
        }
        .1;
    }
    Ok(Some(sum / validation.len().max(1) as f64))
}

/// The training episodes' days, in order: a new diurnal day per episode
/// (seeds after `seed * 1_000_003`), or the trace's training windows in
/// turn; the cluster size cycles through `cfg.gpus`.
struct EpisodeDays<'a> {
    cfg: &'a TrainConfig,
    data: &'a TrainingData,
    /// Where scenario days begin (`start = "fitted"`).
    starts: &'a FittedStarts,
    seed: u64,
    /// Trace windows (or scenario days) handed out so far.
    windows: usize,
}

impl<'a> EpisodeDays<'a> {
    fn new(cfg: &'a TrainConfig, data: &'a TrainingData, starts: &'a FittedStarts) -> Self {
        EpisodeDays {
            cfg,
            data,
            starts,
            seed: cfg.seed.wrapping_mul(1_000_003),
            windows: 0,
        }
    }

    /// The next day, on `cfg.gpus[k % len]` GPUs.
    fn next(&mut self, k: usize) -> Result<Day, LearnError> {
        let cfg = self.cfg;
        self.seed += 1;
        let gpus = cfg.gpus[k % cfg.gpus.len()];
        let seed = self.seed;
        match self.data {
            TrainingData::Diurnal => {
                let past = past_of(cfg, self.data, None, gpus, seed, 0);
                Ok(Day::new(cfg, gpus, seed)?.with_past(past))
            }
            TrainingData::Scenarios(list) => {
                // Cycle through the scenarios in order (deterministic).
                let k = self.windows % list.len();
                let s = &list[k];
                self.windows += 1;
                let past = past_of(cfg, self.data, Some(s), gpus, seed, 0);
                let day = Day::scenario(cfg, s, gpus, seed)?.with_past(past);
                Ok(started(day, self.starts, k, gpus))
            }
            TrainingData::Trace {
                train, window_s, ..
            } => {
                // Cycle through the windows in order (deterministic).
                let w = self.windows % train.len();
                let jobs = train[w].clone();
                self.windows += 1;
                let past = past_of(cfg, self.data, None, gpus, seed, w);
                Ok(Day::from_jobs(cfg, gpus, jobs, seed, *window_s)?.with_past(past))
            }
        }
    }
}

/// What the phases of one run share: the clock, the RNG (its draws, in
/// order, are what makes a run reproducible), the days, the teacher's
/// resting layouts and the episode count.
struct Run<'a> {
    cfg: &'a TrainConfig,
    started: Instant,
    rng: ChaCha8Rng,
    days: EpisodeDays<'a>,
    validation: Vec<Day>,
    static_best_et: Option<f64>,
    base: Base,
    episodes: usize,
    progress: &'a mut dyn FnMut(Progress),
}

impl Run<'_> {
    fn over_budget(&self) -> bool {
        self.started.elapsed().as_secs_f64() > self.cfg.time_budget_s
    }

    /// The standing of `net`'s deterministic policy on the validation
    /// days: a checkpoint that leaves more jobs unserved is never chosen
    /// over one that leaves fewer, whatever its ET.
    fn validate(&self, net: &ActorCritic) -> Result<Standing, LearnError> {
        let mut days = Vec::with_capacity(self.validation.len());
        for day in &self.validation {
            let mut p = CandlePolicy::new(net, self.cfg.gpu_model)
                .starting_from(day.initial_layouts(self.cfg));
            days.push(day.objective(self.cfg, &mut p)?);
        }
        Ok(Standing::over(days))
    }

    fn report_validation(&mut self, step: usize, score: Standing) {
        (self.progress)(Progress::Validation {
            step,
            et: Some(score.et),
            static_best_et: self.static_best_et,
        });
    }

    /// Phase 1: teacher episodes, then behaviour cloning on all of them.
    fn imitation(&mut self, net: &ActorCritic, opt: &mut AdamW) -> Result<(), LearnError> {
        let cfg = self.cfg;
        (self.progress)(Progress::Phase {
            name: "imitation",
            steps: cfg.imitation.episodes,
        });
        let mut batch = Batch::default();
        for k in 0..cfg.imitation.episodes {
            if self.over_budget() {
                break;
            }
            let day = self.days.next(k)?;
            let seed = self.rng.random();
            let ep = run_episode(cfg, net, &day, Mode::Teacher, &self.base, seed, &mut batch)?;
            self.episodes += 1;
            (self.progress)(Progress::Step {
                phase: "imitation",
                step: k + 1,
                mean_return: ep.team_return,
                mean_et: Some(ep.et),
            });
        }
        if !batch.is_empty() {
            imitation_update(
                net,
                opt,
                &batch,
                cfg.imitation.epochs,
                cfg.imitation.minibatch,
                &mut self.rng,
            )?;
        }
        Ok(())
    }

    /// Phase 1 with `[dagger] rounds > 0`: closed-loop imitation of the
    /// planning teacher (`super::planner`). Round 0 lets the teacher act;
    /// later rounds let the network act (the teacher with probability
    /// `beta`) and label the states it visits with the teacher's targets.
    /// After each round the actor is fitted to every example so far and
    /// validated; the best round is the first checkpoint.
    fn dagger(&mut self, net: &ActorCritic, opt: &mut AdamW) -> Result<Checkpoint, LearnError> {
        let cfg = self.cfg;
        let d = &cfg.dagger;
        opt.set_learning_rate(d.lr);
        (self.progress)(Progress::Phase {
            name: "dagger",
            steps: (d.rounds + 1) * d.episodes,
        });
        let mut examples = Batch::default();
        let mut best: Option<Checkpoint> = None;
        for round in 0..=d.rounds {
            let beta = if round == 0 { 1.0 } else { d.beta };
            for k in 0..d.episodes {
                if self.over_budget() {
                    break;
                }
                let day = self.days.next(round * d.episodes + k)?;
                let seed = self.rng.random();
                let mode = Mode::Dagger { beta };
                let ep = run_episode(cfg, net, &day, mode, &self.base, seed, &mut examples)?;
                self.episodes += 1;
                (self.progress)(Progress::Step {
                    phase: "dagger",
                    step: round * d.episodes + k + 1,
                    mean_return: ep.team_return,
                    mean_et: Some(ep.et),
                });
            }
            if !examples.is_empty() {
                imitation_update(net, opt, &examples, d.epochs, d.minibatch, &mut self.rng)?;
            }
            let et = self.validate(net)?;
            self.report_validation(round, et);
            let label = || format!("dagger:{round}");
            match best.as_mut() {
                Some(b) => b.offer(et, net, label)?,
                None => best = Some(Checkpoint::new(et, net, label())?),
            }
            if self.over_budget() {
                break;
            }
        }
        best.ok_or_else(|| LearnError::Other("DAgger ran no round".into()))
    }

    /// Phase 2: PPO iterations, validated every `validation.every` and at
    /// the end; returns the iterations done.
    fn ppo(
        &mut self,
        net: &ActorCritic,
        opt: &mut AdamW,
        best: &mut Checkpoint,
    ) -> Result<usize, LearnError> {
        let cfg = self.cfg;
        opt.set_learning_rate(cfg.ppo.lr);
        (self.progress)(Progress::Phase {
            name: "ppo",
            steps: cfg.ppo.iterations,
        });
        let mut iterations = 0;
        for it in 0..cfg.ppo.iterations {
            if self.over_budget() {
                break;
            }
            let mut batch = Batch::default();
            let mut ret = 0.0;
            let mut ets = Vec::new();
            for k in 0..cfg.ppo.episodes_per_iteration {
                let day = self.days.next(it * cfg.ppo.episodes_per_iteration + k)?;
                let seed = self.rng.random();
                let ep = run_episode(cfg, net, &day, Mode::Sample, &self.base, seed, &mut batch)?;
                self.episodes += 1;
                ret += ep.team_return;
                ets.push(ep.et);
            }
            if !batch.is_empty() {
                ppo_update(net, opt, &mut batch, &cfg.ppo, &mut self.rng)?;
            }
            iterations += 1;
            let n = cfg.ppo.episodes_per_iteration.max(1) as f64;
            (self.progress)(Progress::Step {
                phase: "ppo",
                step: it + 1,
                mean_return: ret / n,
                mean_et: (!ets.is_empty()).then(|| ets.iter().sum::<f64>() / ets.len() as f64),
            });
            if (it + 1) % cfg.validation.every == 0 || it + 1 == cfg.ppo.iterations {
                let et = self.validate(net)?;
                self.report_validation(it + 1, et);
                best.offer(et, net, || format!("ppo:{}", it + 1))?;
            }
        }
        Ok(iterations)
    }

    /// Phase 3 (when `es.iterations > 0`): ES on a copy of the best
    /// checkpoint so far, validated like PPO; validation steps are counted
    /// on from the `ppo_iterations` done.
    fn es(&mut self, ppo_iterations: usize, best: &mut Checkpoint) -> Result<(), LearnError> {
        let cfg = self.cfg;
        if cfg.es.iterations == 0 {
            return Ok(());
        }
        (self.progress)(Progress::Phase {
            name: "es",
            steps: cfg.es.iterations,
        });
        let es_net = best.net.clone_deep()?;
        for it in 0..cfg.es.iterations {
            if self.over_budget() {
                break;
            }
            let days: Vec<Day> = (0..cfg.es.days)
                .map(|k| self.days.next(k))
                .collect::<Result<_, _>>()?;
            let mean = super::es::step(cfg, &cfg.es, &es_net, &days, self.rng.random())?;
            self.episodes += 2 * cfg.es.pairs * days.len();
            (self.progress)(Progress::Step {
                phase: "es",
                step: it + 1,
                mean_return: -mean,
                mean_et: Some(mean),
            });
            if (it + 1) % cfg.validation.every == 0 || it + 1 == cfg.es.iterations {
                let et = self.validate(&es_net)?;
                self.report_validation(ppo_iterations + it + 1, et);
                best.offer(et, &es_net, || format!("es:{}", it + 1))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::tiny;
    use super::*;
    use crate::workload::generate_diurnal;

    /// Trace data without a validation (or training) window is refused.
    #[test]
    fn trace_data_needs_both_kinds_of_window() {
        let cfg = tiny();
        let jobs = generate_diurnal(&cfg.workload, cfg.gpu_model, 3, 1);
        let data = |train: usize, validation: usize| TrainingData::Trace {
            description: "t".into(),
            window_s: 3600.0,
            train: vec![jobs.clone(); train],
            validation: vec![jobs.clone(); validation],
        };
        assert!(check_windows(&data(1, 1)).is_ok());
        for bad in [data(1, 0), data(0, 1)] {
            let err = check_windows(&bad).unwrap_err();
            assert!(err.to_string().contains("validation window"), "{err}");
            assert!(train(&cfg, &bad, |_| {}).is_err());
        }
    }

    /// Episode days: diurnal seeds count up from `seed * 1_000_003`, the
    /// cluster size cycles through `gpus`; trace windows come in turn;
    /// base and validation days use seeds of their own.
    #[test]
    fn days_come_in_a_fixed_order() {
        let cfg = TrainConfig {
            seed: 4,
            gpus: vec![3, 2],
            teacher_days: 3,
            ..tiny()
        };
        let none = FittedStarts::default();
        let mut days = EpisodeDays::new(&cfg, &TrainingData::Diurnal, &none);
        let got: Vec<(u64, usize)> = (0..3)
            .map(|k| days.next(k).map(|d| (d.seed, d.cluster.len())).unwrap())
            .collect();
        assert_eq!(got, [(4_000_013, 3), (4_000_014, 2), (4_000_015, 3)]);
        let base: Vec<u64> = base_days(&cfg, &TrainingData::Diurnal)
            .unwrap()
            .iter()
            .map(|d| d.seed)
            .collect();
        assert_eq!(base, [4_000_012, 4_500_013, 4_500_014]);
        let v: Vec<u64> = validation_days(&cfg, &TrainingData::Diurnal, &none)
            .unwrap()
            .iter()
            .map(|d| d.seed)
            .collect();
        assert_eq!(v, [900_001, 900_002, 900_003]);

        let window = |seed| generate_diurnal(&cfg.workload, cfg.gpu_model, 3, seed);
        let data = TrainingData::Trace {
            description: "t".into(),
            window_s: cfg.workload.horizon_s,
            train: vec![window(1), window(2)],
            validation: vec![window(3)],
        };
        let mut days = EpisodeDays::new(&cfg, &data, &none);
        for want in [1, 2, 1] {
            assert_eq!(days.next(0).unwrap().jobs, window(want));
        }
        assert_eq!(base_days(&cfg, &data).unwrap().len(), 2);
        assert_eq!(
            validation_days(&cfg, &data, &none).unwrap()[0].jobs,
            window(3)
        );
    }

    /// `start = "fitted"`: every scenario episode and validation day begins
    /// from the layout fitted on its scenario's past days for its cluster
    /// size (one fit per scenario and size, the same on a second run);
    /// `start = "own"` keeps catalog layout `initial_layout` (whole GPUs);
    /// data without scenarios is refused a fitted start.
    #[test]
    fn fitted_starts_reach_every_scenario_day() {
        let mut cfg = TrainConfig {
            gpus: vec![3, 2],
            start: TrainStart::Fitted,
            start_days: 1,
            ..tiny()
        };
        cfg.validation.gpus = 2;
        cfg.validation.days = 3;
        let list: Vec<Scenario> = crate::scenario::default_scenarios()
            .into_iter()
            .filter(|s| s.name.starts_with("batch/") || s.name == "diurnal/tight")
            .collect();
        assert_eq!(list.len(), 3);
        let data = TrainingData::Scenarios(list.clone());
        let starts = fitted_starts(&cfg, &data).unwrap();
        assert_eq!(starts.len(), 3 * 2, "sizes 3 and 2 (validation's 2 once)");
        let again = fitted_starts(&cfg, &data).unwrap();
        let whole = crate::mig::Geometry::of(cfg.gpu_model).whole_gpu();
        let mut days = EpisodeDays::new(&cfg, &data, &starts);
        let mut split = 0;
        for k in 0..6 {
            let d = days.next(k).unwrap();
            let want = starts.get(k % 3, d.cluster.len()).unwrap();
            assert_eq!(want, again.get(k % 3, d.cluster.len()).unwrap());
            assert_eq!(d.initial_layouts(&cfg), want);
            split += usize::from(want.iter().any(|&l| l != whole));
        }
        assert!(split > 0, "some fitted start is not whole GPUs");
        for (k, d) in validation_days(&cfg, &data, &starts)
            .unwrap()
            .iter()
            .enumerate()
        {
            assert_eq!(d.initial_layouts(&cfg), starts.get(k, 2).unwrap());
        }

        let own = TrainConfig {
            start: TrainStart::Own,
            ..cfg.clone()
        };
        let none = fitted_starts(&own, &data).unwrap();
        assert!(none.is_empty());
        let d = EpisodeDays::new(&own, &data, &none).next(0).unwrap();
        assert_eq!(d.initial_layouts(&own), vec![whole; 3]);

        let err = fitted_starts(&cfg, &TrainingData::Diurnal).unwrap_err();
        assert!(err.to_string().contains("scenario"), "{err}");
    }

    /// The phases run in order and report as they go: imitation, a
    /// validation, PPO iterations each validated, then ES steps counted on
    /// from the PPO iterations; the report counts every episode.
    #[test]
    fn phases_run_in_order() {
        let mut cfg = tiny();
        cfg.teacher_base = TeacherBase::Uniform;
        cfg.imitation.episodes = 1;
        cfg.imitation.epochs = 1;
        cfg.ppo.iterations = 2;
        cfg.ppo.episodes_per_iteration = 1;
        cfg.ppo.epochs = 1;
        cfg.es.iterations = 1;
        cfg.es.pairs = 1;
        cfg.es.days = 1;
        cfg.validation.gpus = 3;
        cfg.validation.days = 1;
        cfg.validation.every = 1;
        let mut seen = Vec::new();
        let (_, report) = train(&cfg, &TrainingData::Diurnal, |p| {
            seen.push(match p {
                Progress::Phase { name, steps } => format!("{name}:{steps}"),
                Progress::Step { phase, step, .. } => format!("{phase} {step}"),
                Progress::Validation { step, .. } => format!("val {step}"),
                Progress::StartsFitted { .. } => "fitted".into(),
            });
        })
        .unwrap();
        assert_eq!(
            seen,
            [
                "imitation:1",
                "imitation 1",
                "val 0",
                "ppo:2",
                "ppo 1",
                "val 1",
                "ppo 2",
                "val 2",
                "es:1",
                "es 1",
                "val 3"
            ]
        );
        assert_eq!(report.ppo_iterations, 2);
        assert_eq!(report.episodes, 1 + 2 + 2);
        assert!(
            ["imitation", "ppo:1", "ppo:2", "es:1"].contains(&report.chosen.as_str()),
            "{}",
            report.chosen
        );
        assert!(report.validation_static_best_et.is_some());
        assert!(!report.validation_static_best_layout.is_empty());
    }

    /// A zero time budget stops every phase before its first episode.
    #[test]
    fn the_time_budget_stops_the_phases() {
        let mut cfg = tiny();
        cfg.teacher_base = TeacherBase::Uniform;
        cfg.time_budget_s = 0.0;
        cfg.validation.gpus = 3;
        cfg.validation.days = 1;
        cfg.es.iterations = 3;
        let (_, report) = train(&cfg, &TrainingData::Diurnal, |_| {}).unwrap();
        assert_eq!((report.episodes, report.ppo_iterations), (0, 0));
        assert_eq!(report.chosen, "imitation");
    }
}
