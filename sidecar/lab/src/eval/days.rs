//! A set of simulated days and their `none` reference runs.

use crate::mig::GpuModel;
use crate::policy::{NoPartition, RepartitionPolicy};
use crate::sim::{
    simulate, EventSink, Heuristic, Metrics, RunHooks, SimConfig, SimError, SimResult,
};
use crate::workload::Job;

/// One workload to score a policy on: a generated day (a seed of a
/// scenario) or a window of a trace.
#[derive(Clone, Debug)]
pub struct Day {
    /// `seed 1003`, `window 12 (day 13)`.
    pub label: String,
    pub jobs: Vec<Job>,
    /// Horizon, start hour and epochs of the run.
    pub cfg: SimConfig,
}

impl Day {
    /// A generated day: `jobs` drawn with `seed` in an arrival window of
    /// `horizon_s` seconds that starts at `start_hour` o'clock, with the
    /// default epochs and reconfiguration time; labelled `seed N`.
    pub fn generated(jobs: Vec<Job>, seed: u64, horizon_s: f64, start_hour: f64) -> Self {
        Day {
            label: format!("seed {seed}"),
            jobs,
            cfg: SimConfig {
                seed,
                workload_horizon_s: Some(horizon_s),
                start_hour,
                ..SimConfig::default()
            },
        }
    }
}

/// Days on one cluster with one placement heuristic, each with its `none`
/// run (the reference every score is taken against).
#[derive(Clone, Debug)]
pub struct DaySet {
    pub cluster: Vec<GpuModel>,
    pub heuristic: Heuristic,
    pub days: Vec<Day>,
    /// The `none` run of each day.
    pub references: Vec<Metrics>,
}

impl DaySet {
    /// Runs `none` on every day.
    pub fn new(
        cluster: &[GpuModel],
        heuristic: Heuristic,
        days: Vec<Day>,
    ) -> Result<Self, SimError> {
        let mut set = DaySet {
            cluster: cluster.to_vec(),
            heuristic,
            days,
            references: Vec::new(),
        };
        for i in 0..set.days.len() {
            let r = set.run(i, &mut NoPartition, None)?;
            set.references.push(r.metrics);
        }
        Ok(set)
    }

    pub fn len(&self) -> usize {
        self.days.len()
    }

    pub fn is_empty(&self) -> bool {
        self.days.is_empty()
    }

    /// One run of `policy` on day `i`, with the day's heuristic.
    pub fn run(
        &self,
        i: usize,
        policy: &mut dyn RepartitionPolicy,
        sink: Option<&mut dyn EventSink>,
    ) -> Result<SimResult, SimError> {
        let day = &self.days[i];
        let mut h = self.heuristic.build(day.cfg.seed);
        simulate(
            &self.cluster,
            &day.jobs,
            h.as_mut(),
            policy,
            &day.cfg,
            RunHooks {
                sink,
                progress: None,
            },
        )
    }

    /// The search objective of `policy` over the days: the mean of
    /// [`search_score`] against each day's `none` run. The same policy
    /// object runs every day (the fixed policies searched with it keep no
    /// state between runs).
    pub fn objective(
        &self,
        policy: &mut dyn RepartitionPolicy,
        alpha: f64,
    ) -> Result<f64, SimError> {
        let mut sum = 0.0;
        for (i, reference) in self.references.iter().enumerate() {
            sum += search_score(&self.run(i, policy, None)?.metrics, reference, alpha);
        }
        Ok(sum / self.days.len().max(1) as f64)
    }
}

/// The objective the searches minimise on one day: ET against the day's
/// `none` run, with the tardiness normalised by `max(reference mean
/// tardiness, 1 s)` so that a reference without tardiness still ranks
/// candidates (it equals ET whenever the reference's mean tardiness is at
/// least 1 s), plus 1 per job that never ran (a layout too small for the
/// biggest jobs would otherwise look cheap).
pub fn search_score(run: &Metrics, reference: &Metrics, alpha: f64) -> f64 {
    let e = if reference.energy_j > 0.0 {
        run.energy_j / reference.energy_j
    } else {
        1.0
    };
    let t = run.mean_tardiness_s / reference.mean_tardiness_s.max(1.0);
    let penalty = run.unserved as f64;
    (e + alpha * t) / (1.0 + alpha) + penalty
}
