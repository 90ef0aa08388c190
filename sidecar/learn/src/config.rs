//! The training configuration (`etc/train.toml`): every section's type,
//! its defaults and its validation, in one place that the trainer, the ES
//! fine-tuning and the oracle all read without depending on each other.

use serde::{Deserialize, Serialize};

use super::LearnError;
use crate::mig::GpuModel;
use crate::sim::{EpochRule, Heuristic, SimConfig};
use crate::workload::DiurnalConfig;

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
    /// Catalog index of the layout every GPU starts the day with (0: the
    /// whole GPU). Written to the policy's metadata: the runtime policy
    /// starts there too.
    pub initial_layout: usize,
    /// Where each scenario episode and validation day begins: `own` (every
    /// GPU at `initial_layout`) or `fitted` (the static layout fitted on
    /// the scenario's past days, where `bench suite` starts a learned
    /// policy; `super::start`). Scenario training data only.
    pub start: TrainStart,
    /// `start = "fitted"`: days each fit runs on (scenario seeds
    /// `0..start_days`, the days `bench suite` fits its opponents on).
    pub start_days: usize,
    /// `start = "fitted"`: the layout search, `coarse` (uniform layouts and
    /// coordinate descent) or `full` (also every two-layout mix: the
    /// suite's search, tens of times dearer on 16 GPUs).
    pub start_search: StartSearch,
    pub workload: DiurnalConfig,
    pub imitation: ImitationConfig,
    pub ppo: PpoConfig,
    pub es: EsConfig,
    pub dagger: DaggerConfig,
    pub validation: ValidationConfig,
}

/// Closed-loop imitation of the planning teacher (`learn::dagger`):
/// `[dagger]` in the training config; `rounds = 0` turns it off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaggerConfig {
    /// Rounds after the first (teacher-driven) one; 0 = no DAgger phase.
    pub rounds: usize,
    /// Episodes of each round (the first included).
    pub episodes: usize,
    /// In the rounds after the first, the probability that the teacher
    /// rather than the network acts at an epoch.
    pub beta: f64,
    /// Passes over the aggregated examples after each round.
    pub epochs: usize,
    pub minibatch: usize,
    pub lr: f64,
    pub planner: crate::planner::PlannerConfig,
}

impl Default for DaggerConfig {
    fn default() -> Self {
        DaggerConfig {
            rounds: 0,
            episodes: 12,
            beta: 0.3,
            epochs: 10,
            minibatch: 256,
            lr: 1e-3,
            planner: crate::planner::PlannerConfig::default(),
        }
    }
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
            initial_layout: 0,
            start: TrainStart::Own,
            start_days: 4,
            start_search: StartSearch::Coarse,
            workload: DiurnalConfig::default(),
            imitation: ImitationConfig::default(),
            ppo: PpoConfig::default(),
            es: EsConfig::default(),
            dagger: DaggerConfig::default(),
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
        if self.initial_layout >= crate::mig::Geometry::of(self.gpu_model).catalog().len() {
            return bad(format!(
                "initial_layout {} is not a catalog index of {} (smartmig layouts --catalog)",
                self.initial_layout, self.gpu_model
            ));
        }
        if self.start == TrainStart::Fitted && self.start_days == 0 {
            return bad("start_days must be > 0 with start = \"fitted\"".into());
        }
        if !(0.0..=1.0).contains(&self.dagger.beta) || self.dagger.minibatch == 0 {
            return bad("dagger.beta must be in [0, 1] and dagger.minibatch > 0".into());
        }
        self.dagger
            .planner
            .validate()
            .map_err(|e| LearnError::Config(e.to_string()))?;
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
            exact_size: false,
            slurm: None,
            // The trainer still learns in the engine where jobs wait for
            // the policy (its teacher, oracle and rewards were built for
            // it); training in the on-demand engine is issue 55's.
            serve_on_demand: false,
        }
    }
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
    /// A load-driven rule ([`crate::policy::adaptive::Adaptive`]) instead of
    /// the clock.
    Adaptive,
}

/// Where training days begin (`start` in the training config).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrainStart {
    /// Every GPU at catalog layout `initial_layout` (whole GPUs by default).
    Own,
    /// The static layout fitted on the scenario's past days.
    Fitted,
}

/// The search of a fitted start (`start_search`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartSearch {
    /// `policy::search::SearchConfig::coarse`.
    Coarse,
    /// `policy::search::SearchConfig::default` (the suite's).
    Full,
}

/// ES hyper-parameters (`[es]` in the training config).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EsConfig {
    /// Iterations (0 = no ES phase).
    pub iterations: usize,
    /// Antithetic pairs per iteration.
    pub pairs: usize,
    /// Noise scale, in weight units.
    pub sigma: f64,
    /// Step size.
    pub lr: f64,
    /// Training days each iteration's candidates are scored on.
    pub days: usize,
}

impl Default for EsConfig {
    fn default() -> Self {
        EsConfig {
            iterations: 0,
            pairs: 8,
            sigma: 0.01,
            lr: 0.01,
            days: 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(edit: impl FnOnce(&mut TrainConfig)) -> String {
        let mut cfg = TrainConfig::default();
        edit(&mut cfg);
        match cfg.validate() {
            Err(LearnError::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn the_defaults_are_valid() {
        TrainConfig::default().validate().expect("defaults");
    }

    /// Each bad value is refused with a message that names its field.
    #[test]
    fn bad_values_are_refused_naming_the_field() {
        assert!(refusal(|c| c.gpus.clear()).contains("gpus"));
        assert!(refusal(|c| c.gpus = vec![4, 0]).contains("gpus"));
        assert!(refusal(|c| c.teacher_days = 0).contains("teacher_days"));
        assert!(refusal(|c| c.hidden = 0).contains("hidden"));
        assert!(refusal(|c| c.epoch_events = 0).contains("epoch_events"));
        assert!(refusal(|c| c.local_weight = 1.5).contains("local_weight 1.5"));
        assert!(refusal(|c| c.local_weight = f64::NAN).contains("local_weight"));
        assert!(refusal(|c| c.imitation.minibatch = 0).contains("minibatch"));
        assert!(refusal(|c| c.ppo.minibatch = 0).contains("minibatch"));
        assert!(refusal(|c| c.validation.every = 0).contains("validation.gpus"));
        assert!(refusal(|c| c.validation.days = 0).contains(".days"));
        assert!(refusal(|c| c.heuristic = "fastest".into()).starts_with("heuristic:"));
        assert!(refusal(|c| c.workload.horizon_s = -1.0).starts_with("workload:"));
        assert!(refusal(|c| {
            c.start = TrainStart::Fitted;
            c.start_days = 0;
        })
        .contains("start_days"));
    }

    /// The simulator settings carry the config's epoch rule, reconfiguration
    /// time, day length and start hour, and the episode's seed.
    #[test]
    fn sim_config_follows_the_config() {
        let mut cfg = TrainConfig {
            epoch_events: 3,
            reconfig_time_s: 9.0,
            ..TrainConfig::default()
        };
        cfg.workload.horizon_s = 7200.0;
        cfg.workload.start_hour = 5.0;
        let s = cfg.sim_config(42);
        assert_eq!(s.seed, 42);
        assert!(matches!(s.epoch, EpochRule::Events(3)));
        assert_eq!(s.reconfig_time_s, 9.0);
        assert_eq!(s.workload_horizon_s, Some(7200.0));
        assert_eq!(s.start_hour, 5.0);
    }

    /// Sections left out keep their defaults; enum values are kebab-case;
    /// unknown keys are errors in every section.
    #[test]
    fn toml_sections_default_and_refuse_unknown_keys() {
        let cfg: TrainConfig =
            toml::from_str("teacher_base = \"static-best\"\n[es]\niterations = 3\n").unwrap();
        assert_eq!(cfg.teacher_base, TeacherBase::StaticBest);
        assert_eq!(cfg.es.iterations, 3);
        assert_eq!(cfg.es.pairs, EsConfig::default().pairs);
        assert_eq!(cfg.ppo, PpoConfig::default());
        for bad in [
            "[es]\nnoise = 1\n",
            "[ppo]\nclipping = 0.1\n",
            "[validation]\nevery_n = 1\n",
        ] {
            assert!(toml::from_str::<TrainConfig>(bad).is_err(), "{bad}");
        }
    }
}
