//! The episodes the trainer, the teacher searches, ES and the oracle run
//! on: a [`Day`] (jobs on a cluster, with its `none` reference), its
//! search [`Objective`], and where the days come from ([`TrainingData`]:
//! diurnal days or trace windows).

use super::config::TrainConfig;
use super::LearnError;
use crate::mig::{Geometry, GpuModel, Layout};
use crate::policy::RepartitionPolicy;
use crate::scenario::Scenario;
use crate::sim::{common_horizon, simulate, Metrics, Reference, RunHooks, SimConfig, Standing};
use crate::workload::{generate_diurnal, Job};

/// A workload day (an episode) and its `none` reference totals.
pub struct Day {
    pub cluster: Vec<GpuModel>,
    pub jobs: Vec<Job>,
    pub seed: u64,
    /// End of the arrival window, s (a day, or a trace window).
    pub horizon_s: f64,
    /// Hour of day at time 0 (the policy sees the time of day).
    pub start_hour: f64,
    /// The `none` run.
    pub reference: Metrics,
    /// The ET exchange rate: the `none` run, `T_ref` floored by the day's
    /// jobs ([`Reference::own`]; the day has no past of its own).
    pub rate: Reference,
    /// Other days of the same workload on the same clock (what a site has
    /// seen before): the planning teacher's sample of the future. Empty
    /// unless the trainer fills it.
    pub past: Vec<Vec<Job>>,
    /// The layout each GPU begins the day with (the trainer's fitted start,
    /// `start = "fitted"`); empty: every GPU at the config's
    /// `initial_layout` ([`Day::initial_layouts`]).
    pub start: Vec<Layout>,
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

    /// An episode over given jobs with its own clock (`start_hour` at time
    /// 0), e.g. a yardstick scenario's day built elsewhere.
    pub fn with_clock(
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
            rate: Reference::pooled(&[], 0.0),
            past: Vec::new(),
            start: Vec::new(),
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
        day.rate = Reference::own(&day.reference, &day.jobs);
        Ok(day)
    }

    /// The same day with `past` days (same clock) for the planning teacher.
    pub fn with_past(mut self, past: Vec<Vec<Job>>) -> Self {
        self.past = past;
        self
    }

    /// The same day begun from `layouts` (one per GPU) instead of the
    /// config's `initial_layout`.
    pub fn with_start(mut self, layouts: Vec<Layout>) -> Self {
        self.start = layouts;
        self
    }

    /// The layout every GPU begins the day with: [`Day::start`] when set,
    /// else catalog layout `cfg.initial_layout` on each. What the episode
    /// policy, the deterministic policy and the planning teacher install.
    pub fn initial_layouts(&self, cfg: &TrainConfig) -> Vec<Layout> {
        if self.start.is_empty() {
            vec![
                initial_layout(Geometry::of(cfg.gpu_model), cfg.initial_layout);
                self.cluster.len()
            ]
        } else {
            self.start.clone()
        }
    }

    /// The day's exchange rate ([`Day::rate`], `T_ref` floored as the
    /// yardstick floors it) as the planning teacher uses it.
    pub fn planner_rate(&self) -> crate::planner::Rate {
        crate::planner::Rate::new(
            self.rate.energy_j,
            self.rate.tardiness_s,
            self.jobs.len() as f64,
        )
    }

    /// Scores `policy` on this day for the searches and checkpoint choices:
    /// its [`Standing`] (a run that leaves jobs unserved ranks behind every
    /// run that serves them all, whatever its ET).
    pub fn objective(
        &self,
        cfg: &TrainConfig,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<Objective, LearnError> {
        let (m, et) = self.evaluate(cfg, policy)?;
        Ok(Standing::of(&m, et))
    }

    /// The simulator settings of this episode.
    pub fn sim_config(&self, cfg: &TrainConfig) -> SimConfig {
        SimConfig {
            workload_horizon_s: Some(self.horizon_s),
            start_hour: self.start_hour,
            ..cfg.sim_config(self.seed)
        }
    }

    /// Runs any policy on this day; returns its metrics, charged with the
    /// `none` run at their common horizon (`sim::metrics`), and its ET
    /// with the day's exchange rate.
    pub fn evaluate(
        &self,
        cfg: &TrainConfig,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<(Metrics, f64), LearnError> {
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
        let m = m.at_horizon(common_horizon([&m, &self.reference]));
        let et = self.rate.et_of(&m, 1.0);
        Ok((m, et))
    }
}

/// Catalog layout `index` of `geometry` (the whole GPU if out of range).
pub fn initial_layout(geometry: &Geometry, index: usize) -> Layout {
    geometry
        .catalog()
        .get(index)
        .copied()
        .unwrap_or_else(|| geometry.whole_gpu())
}

/// A day's objective ([`Day::objective`]): jobs that never ran first, then
/// ET (`sim::Standing`, the yardstick's ranking).
pub type Objective = Standing;

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
    /// Days of the yardstick's scenario families (`smartmig_lab::scenario`):
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
        assert!((et - 1.0).abs() < 1e-12);
        let o = d.objective(&cfg, &mut NoPartition).unwrap();
        assert_eq!(o.unserved, 0);
        assert!((o.et - 1.0).abs() < 1e-12);
    }

    /// Seven 1g slices cannot hold the day's big jobs: that layout ranks
    /// behind whole GPUs, whatever its ET, and its ET is a number.
    #[test]
    fn a_layout_that_starves_jobs_ranks_behind_none() {
        let cfg = tiny();
        let d = day(&cfg, 5);
        let g = crate::mig::Geometry::of(cfg.gpu_model);
        let most = |l: &crate::mig::Layout| l.iter().count();
        let ones = (0..g.catalog().len())
            .max_by_key(|&i| most(&g.catalog()[i]))
            .unwrap_or(0);
        let mut p = crate::policy::search::StaticMix::from_indices(
            "1g",
            &d.cluster,
            &vec![ones; d.cluster.len()],
        );
        let o = d.objective(&cfg, &mut p).unwrap();
        let none = d.objective(&cfg, &mut NoPartition).unwrap();
        assert!(o.unserved > 0, "{o:?}");
        assert!(none.beats(&o) && o.et.is_finite(), "{o:?} vs {none:?}");
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
