//! A set of simulated days and their `none` reference runs.

use crate::mig::GpuModel;
use crate::policy::{NoPartition, RepartitionPolicy};
use crate::sim::{
    day_horizon, mean_work_s, simulate, EventSink, Heuristic, Metrics, Reference, RunHooks,
    SimConfig, SimError, SimResult, Standing,
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

    /// The `none` runs of the days pooled, floored by their jobs' mean
    /// work: the exchange rate of days that have no other (`bench suite`'s
    /// training days, `simulate --compare`'s past days).
    pub fn rate(&self) -> Reference {
        Reference::pooled(
            &self.references,
            mean_work_s(self.days.iter().flat_map(|d| &d.jobs)),
        )
    }

    /// The search objective of `policy` over the days: [`search_score`]
    /// against each day's `none` run with the exchange rate `reference`,
    /// the jobs that never ran summed and the ET averaged. The same policy
    /// object runs every day (the fixed policies searched with it keep no
    /// state between runs).
    pub fn objective(
        &self,
        policy: &mut dyn RepartitionPolicy,
        reference: &Reference,
        alpha: f64,
    ) -> Result<Standing, SimError> {
        let mut days = Vec::with_capacity(self.len());
        for (i, none) in self.references.iter().enumerate() {
            let run = self.run(i, policy, None)?.metrics;
            days.push(search_score(&run, none, reference, alpha));
        }
        Ok(Standing::over(days))
    }
}

/// The standing the searches minimise on one day: `run` and the day's
/// `none` run are charged at their common horizon (the rule of
/// `sim::metrics`), and `run` is scored with the exchange rate
/// `reference`; a run that leaves jobs unserved ranks behind every run
/// that serves them all.
pub fn search_score(run: &Metrics, none: &Metrics, reference: &Reference, alpha: f64) -> Standing {
    let charged = run.at_horizon(day_horizon(none));
    reference.standing(&charged, alpha)
}
