//! What a run is judged by, the rule for jobs that never ran, and the ET
//! score against a reference.
//!
//! One rule for every table, search, gate, fallback choice and training
//! reward (docs/evaluation.md, "Jobs that never ran"): a job that never ran
//! is charged as if it had run alone on a whole GPU, at full power, right
//! after the horizon of the comparison it is in, and it counts as late;
//! energy is integrated over that same horizon for every run of the
//! comparison ([`Metrics::at_horizon`], [`common_horizon`]). Runs are then
//! ranked by [`Standing`]: fewer jobs left unserved first, whatever the ET.

use serde::Serialize;

use super::events::{KindCounts, SummaryRecord};
pub use crate::policy::standing::Standing;
use crate::workload::Job;

/// Totals and means of one simulation run.
///
/// Jobs that never ran (`unserved`: still waiting when nothing else could
/// happen; `rejected`: no instance of any GPU in the cluster can hold them)
/// are counted apart *and* charged by the module's rule: each as a late job
/// that ran alone on a whole GPU at full power from `horizon_s` on, so
/// tardiness, late share and energy are over all jobs; the mean wait is
/// over the jobs that ran. The simulator charges at the run's own horizon;
/// a comparison re-charges every run at the horizon common to all of them
/// ([`Metrics::at_horizon`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Metrics {
    pub jobs: u64,
    pub completed: u64,
    pub unserved: u64,
    pub rejected: u64,
    /// Energy of every GPU over `[0, horizon_s]`, idle included, plus
    /// `unserved_energy_j`, J.
    pub energy_j: f64,
    pub energy_mj: f64,
    /// The part of `energy_j` charged for jobs that never ran (each on a
    /// whole GPU at full power for its whole-GPU run time), J.
    pub unserved_energy_j: f64,
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
    /// destroyed again; out-of-memory runs are not counted; a gang job
    /// counts once per GPU it ran on).
    pub jobs_served_by_fusion: u64,
    pub jobs_served_by_fission: u64,
    /// Decisions refused because they would destroy a busy instance, target
    /// an invalid layout or a GPU already being reconfigured.
    pub rejected_decisions: u64,
    pub epochs: u64,
    /// `max(workload horizon, last completion)`, or the later horizon of
    /// the comparison the run was re-charged for.
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
    /// What re-charging the run at a later horizon needs.
    #[serde(skip)]
    pub basis: ChargeBasis,
    /// Slurm-like mode ([`super::SlurmLike`]): jobs Slurm started on a GPU
    /// where smartmigd could not build their instance in time, so they were
    /// requeued (each requeue counts). Omitted from JSON when 0, as the next.
    #[serde(skip_serializing_if = "is_zero")]
    pub requeues: u64,
    /// Slurm-like mode with holds: compute-slice-seconds held back from
    /// Slurm as stranded (what the prevention costs in offered capacity).
    #[serde(skip_serializing_if = "is_zero_f")]
    pub held_slice_s: f64,
    /// Of `reconfigurations`, those made for one job at its allocate
    /// (smartmigd's on-demand create or re-shape, [`crate::mig::Geometry::serve`]),
    /// not by the policy. Omitted from JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub on_demand_builds: u64,
}

/// The parts of a run's totals that do not depend on its horizon, and what
/// the rule for jobs that never ran needs ([`Metrics::at_horizon`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChargeBasis {
    /// Energy of every GPU over `[0, horizon_s]`, J (no charge).
    pub window_energy_j: f64,
    /// Idle power of all GPUs together, W: each further second of the
    /// window costs this much (at the end of a run every GPU is idle).
    pub idle_w: f64,
    /// Full power of one whole GPU of the cluster's hungriest model, W.
    pub whole_gpu_w: f64,
    /// Tardiness and late jobs of the jobs that ran.
    pub served_tardiness_s: f64,
    pub served_late: u64,
    /// Every job that never ran.
    pub never_ran: Vec<NeverRan>,
}

/// A job that never ran, as the charge for it sees it: late from the
/// horizon on, on `gpus` whole GPUs for `run_s` (its whole-GPU run time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NeverRan {
    pub deadline: f64,
    pub run_s: f64,
    /// GPUs it spans ([`Job::gpus`]): each draws a whole GPU's power.
    pub gpus: u32,
}

impl NeverRan {
    pub fn of(job: &Job) -> NeverRan {
        NeverRan {
            deadline: job.deadline,
            run_s: job.work,
            gpus: job.gpus,
        }
    }
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

    /// Jobs that never ran: unserved and rejected.
    pub fn never_ran(&self) -> u64 {
        self.unserved + self.rejected
    }

    /// Sets the charged totals from `basis` at `horizon_s` (the rule in the
    /// module docs). The simulator calls it once at the run's own horizon.
    pub fn charge(&mut self, basis: ChargeBasis, horizon_s: f64) {
        let (tardiness, energy) = never_ran_charge(&basis.never_ran, horizon_s, basis.whole_gpu_w);
        self.horizon_s = horizon_s;
        self.unserved_energy_j = energy;
        self.energy_j = basis.window_energy_j + energy;
        self.energy_mj = self.energy_j / 1e6;
        self.total_tardiness_s = basis.served_tardiness_s + tardiness;
        self.late_jobs = basis.served_late + basis.never_ran.len() as u64;
        let all = self.jobs.max(1) as f64;
        self.mean_tardiness_s = self.total_tardiness_s / all;
        self.late_share = self.late_jobs as f64 / all;
        self.basis = basis;
    }

    /// The run as a comparison whose horizon is `horizon_s` sees it: every
    /// GPU idles from the run's own horizon to `horizon_s` (energy over the
    /// same window as every other run), and each job that never ran is
    /// charged from `horizon_s`. A horizon before the run's own is the
    /// run's own (nothing is taken back).
    pub fn at_horizon(&self, horizon_s: f64) -> Metrics {
        let h = horizon_s.max(self.horizon_s);
        let mut m = self.clone();
        let mut basis = self.basis.clone();
        basis.window_energy_j += basis.idle_w * (h - self.horizon_s);
        if h > 0.0 {
            m.utilisation = self.utilisation * self.horizon_s / h;
        }
        m.charge(basis, h);
        m
    }
}

/// What a simulator adds up over a run for its final figures
/// ([`Metrics::finish`]).
pub(crate) struct RunSums<'a> {
    /// Each started run's wait, s (reordered by the percentile).
    pub waits: &'a mut [f32],
    pub wait_sum: f64,
    pub slowdown_sum: f64,
    /// Compute-slice seconds that ran jobs.
    pub busy_slice_s: f64,
    /// Compute slices of every GPU together.
    pub slices: f64,
}

impl Metrics {
    /// A run's final figures, the one finish of both simulators: the jobs
    /// that never ran charged at `horizon` ([`Metrics::charge`]), then the
    /// mean and 95th-percentile wait, the mean bounded slowdown, the
    /// makespan from the first arrival of `jobs`, the jobs per hour and
    /// the utilisation up to `horizon`.
    pub(crate) fn finish(
        &mut self,
        basis: ChargeBasis,
        horizon: f64,
        jobs: &[Job],
        sums: RunSums<'_>,
    ) {
        self.charge(basis, horizon);
        let ran = self.completed.max(1) as f64;
        self.mean_wait_s = sums.wait_sum / ran;
        self.p95_wait_s = percentile(sums.waits, 0.95);
        self.mean_bounded_slowdown = if self.completed > 0 {
            sums.slowdown_sum / ran
        } else {
            0.0
        };
        let first_arrival = jobs.iter().map(|j| j.arrival).fold(f64::INFINITY, f64::min);
        self.makespan_s = if self.completed > 0 {
            (self.last_completion_s - first_arrival).max(0.0)
        } else {
            0.0
        };
        self.jobs_per_hour = if self.makespan_s > 0.0 {
            self.completed as f64 / (self.makespan_s / 3600.0)
        } else {
            0.0
        };
        let capacity: f64 = sums.slices * horizon;
        self.utilisation = if capacity > 0.0 {
            sums.busy_slice_s / capacity
        } else {
            0.0
        };
    }

    /// The event log's summary record of a finished run.
    pub(crate) fn summary_record(&self, horizon: f64) -> SummaryRecord {
        SummaryRecord {
            horizon_s: horizon,
            energy_j: self.energy_j,
            total_tardiness_s: self.total_tardiness_s,
            completed: self.completed,
            unserved: self.unserved + self.rejected,
            reconfigurations: self.reconfigurations,
            rejected_decisions: self.rejected_decisions,
            oom_failures: self.oom_failures,
            early_restarts: self.early_restarts,
            kinds: Some(KindCounts {
                fusions: self.fusions,
                fissions: self.fissions,
                reshapes: self.reshapes,
                jobs_served_by_fusion: self.jobs_served_by_fusion,
                jobs_served_by_fission: self.jobs_served_by_fission,
            }),
        }
    }
}

/// The `q` quantile (nearest rank) of `v`, reordering it; 0 when empty.
pub fn percentile(v: &mut [f32], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    let (_, x, _) = v.select_nth_unstable_by(rank, f32::total_cmp);
    f64::from(*x)
}

/// The charge for jobs that never ran at horizon `h`: tardiness
/// `max(0, h + run - deadline)` and energy `whole_gpu_w * run * gpus`,
/// summed.
pub fn never_ran_charge(never_ran: &[NeverRan], h: f64, whole_gpu_w: f64) -> (f64, f64) {
    never_ran.iter().fold((0.0, 0.0), |(t, e), n| {
        (
            t + (h + n.run_s - n.deadline).max(0.0),
            e + whole_gpu_w * n.run_s * f64::from(n.gpus),
        )
    })
}

/// The horizon every row of one day is charged at (issue 54): where that
/// day's `none` run (whole GPUs) ends; a row that ends later is charged at
/// its own end ([`Metrics::at_horizon`] never moves a horizon back). It is
/// fixed by the day's workload (and placement) alone, so a row's figures
/// are the same whatever other rows share its run; the latest horizon of
/// the rows ([`common_horizon`]) moved a row's ET by up to 0.008.
pub fn day_horizon(none: &Metrics) -> f64 {
    none.horizon_s
}

/// The horizon common to the runs of one comparison: the latest of theirs.
pub fn common_horizon<'a>(runs: impl IntoIterator<Item = &'a Metrics>) -> f64 {
    runs.into_iter().map(|m| m.horizon_s).fold(0.0, f64::max)
}

// `Standing` itself lives below the simulator (`policy::standing`), where
// the fixed-layout searches rank their candidates; a run's standing is
// read off its metrics here.
impl Standing {
    /// A run's standing: its jobs that never ran and `et`.
    pub fn of(m: &Metrics, et: f64) -> Self {
        Standing::new(m.never_ran(), et)
    }
}

/// The `none` reference of an ET: the exchange rate between joules and
/// tardiness-seconds. Pooled over past days where there are some
/// (`bench suite`'s training days, `simulate --compare`'s training days or
/// earlier trace windows), else the compared workload's own `none` run;
/// either way `T_ref` is floored, so ET is a finite number on every day.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Reference {
    /// Mean energy of the `none` runs, J.
    pub energy_j: f64,
    /// Mean of the `none` runs' mean tardiness, s, floored at `floor_s`.
    pub tardiness_s: f64,
    /// The floor: 1 % of the jobs' mean whole-GPU run time, at least 1 s
    /// (so a day without late jobs under `none` does not make one second
    /// of tardiness worth a whole day of energy).
    pub floor_s: f64,
}

impl Reference {
    /// Pools `none` runs; `mean_work_s` is their jobs' mean whole-GPU run
    /// time (sets the floor).
    pub fn pooled(nones: &[Metrics], mean_work_s: f64) -> Self {
        let n = nones.len().max(1) as f64;
        let floor_s = (0.01 * mean_work_s).max(1.0);
        Reference {
            energy_j: nones.iter().map(|m| m.energy_j).sum::<f64>() / n,
            tardiness_s: (nones.iter().map(|m| m.mean_tardiness_s).sum::<f64>() / n).max(floor_s),
            floor_s,
        }
    }

    /// A workload's own `none` run (no past days), floored by its jobs.
    pub fn own(none: &Metrics, jobs: &[Job]) -> Self {
        Reference::pooled(std::slice::from_ref(none), mean_work_s(jobs))
    }

    /// `(e + alpha t) / (1 + alpha)` with `e`, `t` relative to this reference.
    pub fn et(&self, energy_j: f64, tardiness_s: f64, alpha: f64) -> f64 {
        let e = if self.energy_j > 0.0 {
            energy_j / self.energy_j
        } else {
            1.0
        };
        (e + alpha * tardiness_s / self.tardiness_s) / (1.0 + alpha)
    }

    /// A run's ET against this reference.
    pub fn et_of(&self, m: &Metrics, alpha: f64) -> f64 {
        self.et(m.energy_j, m.mean_tardiness_s, alpha)
    }

    /// A run's [`Standing`] against this reference.
    pub fn standing(&self, m: &Metrics, alpha: f64) -> Standing {
        Standing::of(m, self.et_of(m, alpha))
    }

    /// Whether `T_ref` is the floor (the `none` runs were about never late).
    pub fn floored(&self) -> bool {
        self.tardiness_s <= self.floor_s
    }

    /// Joules one second of mean tardiness is worth (at `alpha` = 1).
    pub fn joules_per_tardiness_s(&self) -> f64 {
        self.energy_j / self.tardiness_s
    }
}

/// The jobs' mean whole-GPU run time, s (0 without jobs).
pub fn mean_work_s<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> f64 {
    let (w, n) = jobs
        .into_iter()
        .fold((0.0, 0usize), |(w, n), j| (w + j.work, n + 1));
    w / n.max(1) as f64
}

/// `ET = (e + alpha * t) / (1 + alpha)`, with `e` and `t` the run's energy
/// and mean tardiness divided by those of a [`Reference`] (its `none` runs
/// score about 1, lower is better; `t` is over the floored `T_ref`, so ET
/// is always a number).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EtScore {
    /// What the reference was, e.g. `none (whole GPUs) + edf`.
    pub reference: String,
    pub alpha: f64,
    pub e: f64,
    pub t: f64,
    pub et: f64,
    /// `T_ref`, s, and whether it is the floor.
    pub t_ref_s: f64,
    pub t_ref_floored: bool,
}

impl EtScore {
    /// Scores `run` against `reference`.
    pub fn new(run: &Metrics, reference: &Reference, reference_name: String, alpha: f64) -> Self {
        let e = if reference.energy_j > 0.0 {
            run.energy_j / reference.energy_j
        } else {
            1.0
        };
        let t = run.mean_tardiness_s / reference.tardiness_s;
        EtScore {
            reference: reference_name,
            alpha,
            e,
            t,
            et: (e + alpha * t) / (1.0 + alpha),
            t_ref_s: reference.tardiness_s,
            t_ref_floored: reference.floored(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(energy_j: f64, tardiness: f64) -> Metrics {
        Metrics {
            energy_j,
            mean_tardiness_s: tardiness,
            ..Metrics::default()
        }
    }

    #[test]
    fn the_reference_scores_one_and_a_floor_keeps_et_finite() {
        let r = Reference::pooled(&[m(10.0, 2.0)], 0.0);
        let s = EtScore::new(&m(10.0, 2.0), &r, "ref".into(), 1.0);
        assert_eq!(s.et, 1.0);
        let s = EtScore::new(&m(8.0, 1.0), &r, "ref".into(), 1.0);
        // (0.8 + 0.5) / 2
        assert!((s.et - 0.65).abs() < 1e-12);
        // A reference never late: T_ref is the floor (1 % of the mean job,
        // at least 1 s), and a run with tardiness still has a number.
        let zero = Reference::pooled(&[m(10.0, 0.0)], 3000.0);
        assert_eq!(zero.tardiness_s, 30.0);
        assert!(zero.floored());
        let s = EtScore::new(&m(10.0, 3.0), &zero, "ref".into(), 1.0);
        assert!((s.et - 0.55).abs() < 1e-12 && s.t_ref_floored);
        assert_eq!(Reference::pooled(&[m(10.0, 0.0)], 5.0).tardiness_s, 1.0);
    }

    #[test]
    fn pooled_reference_fixes_the_exchange_rate() {
        let r = Reference::pooled(&[m(100.0, 10.0), m(300.0, 30.0)], 50.0);
        assert_eq!((r.energy_j, r.tardiness_s), (200.0, 20.0));
        assert_eq!(r.joules_per_tardiness_s(), 10.0);
        assert_eq!(r.et(200.0, 20.0, 1.0), 1.0);
        // Two days, each scored against itself, would both give 1.0; with
        // the pooled rate the busier day counts for more.
        assert!(r.et(300.0, 30.0, 1.0) > 1.4);
    }

    /// A run of 10 jobs, one of which never ran (deadline 50 s, 40 s on a
    /// whole GPU), on GPUs idling at 100 W together, 400 W a whole GPU.
    fn starved() -> Metrics {
        let mut run = Metrics {
            jobs: 10,
            completed: 9,
            unserved: 1,
            ..Metrics::default()
        };
        run.charge(
            ChargeBasis {
                window_energy_j: 1000.0,
                idle_w: 100.0,
                whole_gpu_w: 400.0,
                served_tardiness_s: 5.0,
                served_late: 1,
                never_ran: vec![NeverRan {
                    deadline: 50.0,
                    run_s: 40.0,
                    gpus: 1,
                }],
            },
            100.0,
        );
        run
    }

    #[test]
    fn a_job_that_never_ran_is_charged_after_the_common_horizon() {
        let run = starved();
        // At its own horizon: finishes at 100 + 40, 90 s late; 400 W x 40 s.
        assert_eq!(run.total_tardiness_s, 5.0 + 90.0);
        assert_eq!((run.late_jobs, run.late_share), (2, 0.2));
        assert_eq!(
            (run.energy_j, run.unserved_energy_j),
            (1000.0 + 16_000.0, 16_000.0)
        );
        // Another run of the comparison ended at 300 s: every GPU idles to
        // 300 s and the job starts there.
        let later = run.at_horizon(300.0);
        assert_eq!(later.horizon_s, 300.0);
        assert_eq!(later.total_tardiness_s, 5.0 + 290.0);
        assert_eq!(later.energy_j, 1000.0 + 100.0 * 200.0 + 16_000.0);
        assert!((later.mean_tardiness_s - 29.5).abs() < 1e-12);
        // Re-charging composes, and an earlier horizon takes nothing back.
        assert_eq!(later.at_horizon(500.0), run.at_horizon(500.0));
        assert_eq!(run.at_horizon(50.0), run);
        assert_eq!(common_horizon([&run, &later]), 300.0);
    }

    #[test]
    fn a_run_that_leaves_jobs_unserved_never_ranks_ahead() {
        let served = Standing::new(0, 40.0);
        let starved = Standing::new(1, 0.01);
        assert!(served.beats(&starved) && !starved.beats(&served));
        assert!(Standing::new(0, 0.5).beats(&served));
        assert!(Standing::new(3, 1.0).beats(&Standing::new(4, 0.1)));
        assert!(!Standing::new(0, f64::NAN).beats(&Standing::new(0, 1e9)));
        let days = Standing::over([Standing::new(0, 1.0), Standing::new(2, 3.0)]);
        assert_eq!((days.unserved, days.et), (2, 2.0));
        assert!(Standing::new(u64::MAX - 1, 1e300).beats(&Standing::WORST));
        let mut v = [starved, served, Standing::new(0, 0.5)];
        v.sort();
        assert_eq!(v[2].unserved, 1);
    }
}
