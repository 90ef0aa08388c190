//! What a run is judged by, and the ET score against a reference run.

use serde::Serialize;

/// Totals and means of one simulation run.
///
/// Jobs that never ran (`unserved`: still waiting when nothing else could
/// happen; `rejected`: no instance of any GPU in the cluster can hold them)
/// are counted apart *and* as late jobs with tardiness `horizon - deadline`
/// (a lower bound of what they would have had), so tardiness and late share
/// are over all jobs; the mean wait is over the jobs that ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Metrics {
    pub jobs: u64,
    pub completed: u64,
    pub unserved: u64,
    pub rejected: u64,
    /// Energy of every GPU over `[0, horizon_s]`, idle included, J.
    pub energy_j: f64,
    pub energy_mj: f64,
    pub total_tardiness_s: f64,
    pub mean_tardiness_s: f64,
    pub late_jobs: u64,
    pub late_share: f64,
    /// Mean of start - arrival.
    pub mean_wait_s: f64,
    /// 95th percentile (nearest rank) of start - arrival over the jobs that ran.
    pub p95_wait_s: f64,
    /// Mean of `max(1, (end - arrival) / max(end - start, 10 s))` over the
    /// jobs that ran (bounded slowdown, tau = 10 s).
    pub mean_bounded_slowdown: f64,
    /// Last completion - first arrival (0 when nothing ran): the makespan
    /// of a batch whose jobs all arrive at 0.
    pub makespan_s: f64,
    /// Completed jobs per hour of makespan.
    pub jobs_per_hour: f64,
    /// Busy compute-slice-seconds over available compute-slice-seconds
    /// (all GPUs, `[0, horizon_s]`).
    pub utilisation: f64,
    /// Applied (non-empty) reconfigurations.
    pub reconfigurations: u64,
    /// The reconfigurations by kind (`sim::reshape::ReconfigKind`): idle
    /// neighbours merged into a bigger instance, a big idle instance split,
    /// anything else. `fusions + fissions + reshapes = reconfigurations`.
    pub fusions: u64,
    pub fissions: u64,
    pub reshapes: u64,
    /// What fusions and fissions gained: jobs that completed a run on an
    /// instance one of them created (started before the instance was
    /// destroyed again; out-of-memory runs are not counted).
    pub jobs_served_by_fusion: u64,
    pub jobs_served_by_fission: u64,
    /// Decisions refused because they would destroy a busy instance, target
    /// an invalid layout or a GPU already being reconfigured.
    pub rejected_decisions: u64,
    pub epochs: u64,
    /// `max(workload horizon, last completion)`.
    pub horizon_s: f64,
    pub last_completion_s: f64,
    /// Events processed (arrivals, completions, reconfiguration ends, ticks).
    pub events: u64,
    /// Out-of-memory failures (runs that did not complete; 0 unless the
    /// out-of-memory mode is on).
    pub oom_failures: u64,
    /// Jobs given up after out-of-memory failures (included in `rejected`).
    pub oom_rejected: u64,
    /// GPU-seconds (compute slices / GPU slices x seconds) burnt by runs
    /// that failed out of memory.
    pub oom_lost_gpu_s: f64,
    /// Runs ended by the early-restart rule before they failed (or
    /// completed); not in `oom_failures`. Omitted from JSON when 0, as the
    /// next three.
    #[serde(skip_serializing_if = "is_zero")]
    pub early_restarts: u64,
    /// Early restarts of runs whose peak fitted their instance (they would
    /// have completed).
    #[serde(skip_serializing_if = "is_zero")]
    pub false_early_restarts: u64,
    /// GPU-seconds burnt by early-restarted runs (all of them).
    #[serde(skip_serializing_if = "is_zero_f")]
    pub early_restart_lost_gpu_s: f64,
    /// Of which by false early restarts.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub false_early_restart_lost_gpu_s: f64,
    /// GPU-seconds the true early restarts saved, run by run: from the
    /// restart to where each run would have failed. A counterfactual of
    /// the run alone (the rest of the schedule would have differed too),
    /// to weigh against `false_early_restart_lost_gpu_s`.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub early_restart_saved_gpu_s: f64,
    /// Slurm-like mode ([`super::SlurmLike`]): jobs Slurm started on a GPU
    /// where smartmigd could not build their instance in time, so they were
    /// requeued (each requeue counts). Omitted from JSON when 0, as the next.
    #[serde(skip_serializing_if = "is_zero")]
    pub requeues: u64,
    /// Slurm-like mode with holds: compute-slice-seconds held back from
    /// Slurm as stranded (what the prevention costs in offered capacity).
    #[serde(skip_serializing_if = "is_zero_f")]
    pub held_slice_s: f64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero_f(v: &f64) -> bool {
    *v == 0.0
}

impl Metrics {
    /// GPU-seconds lost to restarts: failed runs plus early-restarted runs.
    pub fn lost_gpu_s(&self) -> f64 {
        self.oom_lost_gpu_s + self.early_restart_lost_gpu_s
    }
}

/// `ET = (e + alpha * t) / (1 + alpha)`, with `e` and `t` the run's energy and
/// mean tardiness divided by those of the reference run (so the reference
/// scores exactly 1, lower is better).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EtScore {
    /// What the reference was, e.g. `none (whole GPUs) + edf`.
    pub reference: String,
    pub alpha: f64,
    pub e: f64,
    /// `None` when the reference had zero tardiness and this run did not.
    pub t: Option<f64>,
    pub et: Option<f64>,
}

impl EtScore {
    /// Scores `run` against `reference`. A zero reference tardiness gives
    /// `t = 1` when the run has none either (no worse), undefined otherwise.
    pub fn new(run: &Metrics, reference: &Metrics, reference_name: String, alpha: f64) -> Self {
        let e = if reference.energy_j > 0.0 {
            run.energy_j / reference.energy_j
        } else {
            1.0
        };
        let t = if reference.mean_tardiness_s > 0.0 {
            Some(run.mean_tardiness_s / reference.mean_tardiness_s)
        } else if run.mean_tardiness_s == 0.0 {
            Some(1.0)
        } else {
            None
        };
        EtScore {
            reference: reference_name,
            alpha,
            e,
            t,
            et: t.map(|t| (e + alpha * t) / (1.0 + alpha)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_scores_one() {
        let m = Metrics {
            energy_j: 10.0,
            mean_tardiness_s: 2.0,
            ..Metrics::default()
        };
        let s = EtScore::new(&m, &m, "ref".into(), 1.0);
        assert_eq!(s.et, Some(1.0));
        let better = Metrics {
            energy_j: 8.0,
            mean_tardiness_s: 1.0,
            ..Metrics::default()
        };
        let s = EtScore::new(&better, &m, "ref".into(), 1.0);
        assert!((s.et.unwrap() - 0.65).abs() < 1e-12); // (0.8 + 0.5) / 2
        let zero = Metrics {
            energy_j: 10.0,
            ..Metrics::default()
        };
        assert_eq!(EtScore::new(&m, &zero, "ref".into(), 1.0).t, None);
        assert_eq!(EtScore::new(&zero, &zero, "ref".into(), 1.0).t, Some(1.0));
    }
}
