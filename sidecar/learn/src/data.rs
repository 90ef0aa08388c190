//! The episodes the trainer, the teacher searches, ES and the oracle run
//! on: a [`Day`] (jobs on a cluster, with its `none` reference), its
//! search [`Objective`], and where the days come from ([`TrainingData`]:
//! diurnal days or trace windows).

use super::config::TrainConfig;
use super::LearnError;
use crate::mig::GpuModel;
use crate::policy::RepartitionPolicy;
use crate::sim::{simulate, EtScore, Metrics, RunHooks, SimConfig};
use crate::workload::{generate_diurnal, Job, Scenario};

/// A workload day (an episode) and its `none` reference totals.
pub struct Day {
    pub cluster: Vec<GpuModel>,
    pub jobs: Vec<Job>,
    pub seed: u64,
    /// End of the arrival window, s (a day, or a trace window).
    pub horizon_s: f64,
    /// Hour of day at time 0 (the policy sees the time of day).
    pub start_hour: f64,
    pub reference: Metrics,
    /// Other days of the same workload on the same clock (what a site has
    /// seen before): the planning teacher's sample of the future. Empty
    /// unless the trainer fills it.
    pub past: Vec<Vec<Job>>,
}

impl Day {
    /// A diurnal day of `cfg.workload` with this seed.
    pub fn new(cfg: &TrainConfig, gpus: usize, seed: u64) -> Result<Self, LearnError> {
        let jobs = generate_diurnal(&cfg.workload, cfg.gpu_model, gpus, seed);
        Day::from_jobs(cfg, gpus, jobs, seed, cfg.workload.horizon_s)
    }

    /// A day of `scenario` (one of the yardstick's families) with this seed.
    pub fn scenario(
        cfg: &TrainConfig,
        scenario: &Scenario,
        gpus: usize,
        seed: u64,
    ) -> Result<Self, LearnError> {
        let jobs = scenario.generate(cfg.gpu_model, gpus, seed);
        Day::with_clock(
            cfg,
            gpus,
            jobs,
            seed,
            scenario.horizon_s(),
            scenario.start_hour(),
        )
    }

    /// An episode over given jobs (e.g. a trace window of `horizon_s`).
    pub fn from_jobs(
        cfg: &TrainConfig,
        gpus: usize,
        jobs: Vec<Job>,
        seed: u64,
        horizon_s: f64,
    ) -> Result<Self, LearnError> {
        Day::with_clock(cfg, gpus, jobs, seed, horizon_s, cfg.workload.start_hour)
    }

    fn with_clock(
        cfg: &TrainConfig,
        gpus: usize,
        jobs: Vec<Job>,
        seed: u64,
        horizon_s: f64,
        start_hour: f64,
    ) -> Result<Self, LearnError> {
        let cluster = vec![cfg.gpu_model; gpus];
        let mut h = cfg.heuristic()?.build(seed);
        let mut none = crate::policy::NoPartition;
        let mut day = Day {
            cluster,
            jobs,
            seed,
            horizon_s,
            start_hour,
            reference: Metrics::default(),
            past: Vec::new(),
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

    /// The same day with `past` days (same clock) for the planning teacher.
    pub fn with_past(mut self, past: Vec<Vec<Job>>) -> Self {
        self.past = past;
        self
    }

    /// The `none` reference's mean tardiness floored as the yardstick
    /// floors it (1 % of the jobs' mean whole-GPU run time, at least 1 s),
    /// and the planning teacher's exchange rate from it.
    pub fn rate(&self) -> crate::planner::Rate {
        crate::planner::Rate::new(
            self.reference.energy_j,
            self.floored_tardiness_s(),
            self.jobs.len() as f64,
        )
    }

    /// The `none` run's mean tardiness, floored at 1 % of the jobs' mean
    /// whole-GPU run time and at 1 s (the yardstick's floor).
    fn floored_tardiness_s(&self) -> f64 {
        let n = self.jobs.len().max(1) as f64;
        let floor = (0.01 * self.jobs.iter().map(|j| j.work).sum::<f64>() / n).max(1.0);
        self.reference.mean_tardiness_s.max(floor)
    }

    /// ET of `policy` against this day's `none` run with the tardiness
    /// reference floored ([`Day::rate`]), so it is defined on every day,
    /// plus 1 if a job never ran: what checkpoints are chosen by.
    pub fn floored_objective(
        &self,
        cfg: &TrainConfig,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<f64, LearnError> {
        let (m, _) = self.evaluate(cfg, policy)?;
        let e = m.energy_j / self.reference.energy_j.max(1.0);
        let et = (e + m.mean_tardiness_s / self.floored_tardiness_s()) / 2.0;
        Ok(et
            + if m.unserved + m.rejected > 0 {
                1.0
            } else {
                0.0
            })
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
            start_hour: self.start_hour,
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
    /// Days of the yardstick's scenario families (`workload::scenario`):
    /// episodes cycle through the scenarios, a new seed per episode (seeds
    /// the suite never scores: its test days are 1000-1003); validation on
    /// `cfg.validation.days` days, cycling through them too.
    Scenarios(Vec<Scenario>),
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
        let sizes = cfg
            .gpus
            .iter()
            .map(std::string::ToString::to_string)
            .collect::<Vec<_>>()
            .join("/");
        let first = cfg.seed.wrapping_mul(1_000_003) + 1;
        match self {
            TrainingData::Diurnal => format!(
                "simulated diurnal days (generate_diurnal, seeds from {first}), {sizes} GPUs per episode"
            ),
            TrainingData::Scenarios(list) => format!(
                "simulated days of the scenarios {} in turn (seeds from {first}), {sizes} GPUs per episode",
                list.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
            TrainingData::Trace { description, .. } => description.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::testing::{day, tiny};
    use super::*;
    use crate::policy::NoPartition;
    use crate::workload::Trace;

    #[test]
    fn a_day_is_determined_by_its_seed() {
        let cfg = tiny();
        let (a, b, c) = (day(&cfg, 5), day(&cfg, 5), day(&cfg, 6));
        assert!(!a.jobs.is_empty());
        assert_eq!(a.jobs, b.jobs);
        assert_eq!(a.reference, b.reference);
        assert_ne!(a.jobs, c.jobs);
        assert_eq!(a.cluster, vec![cfg.gpu_model; 3]);
        assert_eq!(a.horizon_s, cfg.workload.horizon_s);
        assert_eq!(a.sim_config(&cfg).seed, 5);
    }

    /// `none` on its own day is the reference: the same metrics, ET 1,
    /// nothing starved.
    #[test]
    fn none_scores_one_against_itself() {
        let cfg = tiny();
        let d = day(&cfg, 5);
        assert!(d.reference.total_tardiness_s > 0.0, "a busy afternoon");
        let (m, et) = d.evaluate(&cfg, &mut NoPartition).unwrap();
        assert_eq!(m, d.reference);
        assert!((et.unwrap() - 1.0).abs() < 1e-12);
        let o = d.objective(&cfg, &mut NoPartition).unwrap();
        assert!(!o.starved);
        assert!((o.or(f64::INFINITY) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn objective_adds_one_when_starved() {
        let starved = Objective {
            et: Some(0.5),
            starved: true,
        };
        assert_eq!(starved.defined(), Some(1.5));
        assert_eq!(starved.or(9.0), 1.5);
        let undefined = Objective {
            et: None,
            starved: false,
        };
        assert_eq!(undefined.defined(), None);
        assert_eq!(undefined.or(2.0), 2.0);
        let both = Objective {
            et: None,
            starved: true,
        };
        assert_eq!(both.or(2.0), 3.0);
    }

    /// A day-long trace in 4 h windows: the windows kept all have late
    /// jobs on whole GPUs, the last kept one validates, and bad window
    /// lengths or too many validation days are refused, naming them.
    #[test]
    fn trace_windows_split_into_training_and_validation() {
        let mut cfg = tiny();
        cfg.validation.gpus = 3;
        cfg.validation.days = 1;
        let mut w = cfg.workload.clone();
        w.horizon_s = 86_400.0;
        let jobs = generate_diurnal(&w, cfg.gpu_model, 3, 11);
        let trace = Trace {
            jobs,
            skipped: Vec::new(),
            dropped: BTreeMap::new(),
            source_ids: Vec::new(),
            time_offset_s: 0.0,
        };
        let window = 4.0 * 3600.0;
        let data = TrainingData::from_trace(&cfg, &trace, window, "test".into()).unwrap();
        let TrainingData::Trace {
            description,
            window_s,
            train,
            validation,
        } = &data
        else {
            panic!("not trace data");
        };
        assert_eq!(*window_s, window);
        assert_eq!(validation.len(), 1);
        assert!(!train.is_empty() && train.len() < 6, "{}", train.len());
        for jobs in train.iter().chain(validation) {
            let d = Day::from_jobs(&cfg, 3, jobs.clone(), 0, window).unwrap();
            assert!(d.reference.mean_tardiness_s > 0.0);
            assert!(jobs.iter().all(|j| j.arrival >= 0.0 && j.arrival < window));
        }
        assert!(
            description.starts_with("test: 6 windows of 4.0 h"),
            "{description}"
        );
        assert_eq!(data.describe(&cfg), *description);

        for bad in [0.0, -1.0, f64::NAN] {
            let err = TrainingData::from_trace(&cfg, &trace, bad, "t".into()).unwrap_err();
            assert!(err.to_string().contains("trace window"), "{err}");
        }
        cfg.validation.days = 50;
        let err = TrainingData::from_trace(&cfg, &trace, window, "t".into()).unwrap_err();
        assert!(err.to_string().contains("validation.days = 50"), "{err}");
    }

    #[test]
    fn diurnal_data_describes_its_seeds_and_sizes() {
        let cfg = TrainConfig {
            seed: 2,
            gpus: vec![3, 4],
            ..tiny()
        };
        let text = TrainingData::Diurnal.describe(&cfg);
        assert!(text.contains("seeds from 2000007"), "{text}");
        assert!(text.contains("3/4 GPUs per episode"), "{text}");
    }
}
