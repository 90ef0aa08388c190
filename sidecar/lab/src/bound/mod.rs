//! Lower bounds on energy and tardiness: how far from optimal a run can at
//! most be.
//!
//! Every comparison table shows `energy / energy lower bound`, so the bounds
//! must be *valid* (never above the value of any feasible schedule of the
//! simulator) before they are tight. Each bound below is a relaxation whose
//! validity is proved in the comment next to it; `docs/bounds.md` states the
//! relaxations for readers, and `tests/bound_*.rs` checks them against an
//! exhaustive scheduler on tiny instances ([`exhaustive`]) and against the
//! simulator on every static layout and placement heuristic.
//!
//! ## What a "schedule" is here (the simulator's semantics)
//!
//! A job `j` runs once, without preemption, on one MIG instance of `k`
//! compute slices of a GPU of model `m` (C compute slices), from a start
//! `S_j >= r_j` (arrival) for `runtime_j(k) = work_j / speed_j(k, C)`
//! seconds, on an instance whose profile fits its memory and its requested
//! size. Instances on one GPU never share compute slices. The GPU's power is
//! `P(L) = idle + (max - idle) * L^gamma` with `L` the busy compute slices
//! over C (`crate::workload::power`), and energy is integrated over
//! `[0, H]`, `H = max(workload horizon, last completion)`. Reconfigurations
//! only delay jobs and never add load, so ignoring them (as the bounds do)
//! only lowers the optimum. Jobs that fit no profile of any GPU of the
//! cluster are rejected by the simulator and left out here too.
//!
//! A gang job of `g` GPUs ([`Job::gpus`]) runs on `g` whole GPUs at once
//! for `work` seconds: its GPU-seconds and dynamic energy are `g` times a
//! whole GPU's ([`Job::most_efficient_profile`]), which keeps every
//! argument below valid (the single machine's capacity `N` bounds what all
//! pieces consume together; each piece still ends no earlier than
//! `r + work`). A gang job wider than the GPUs that can run it whole is
//! refused by the simulator and left out.

pub mod exhaustive;

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use serde::Serialize;

use crate::mig::GpuModel;
use crate::workload::{Job, PowerModel, WorkloadError};

/// Why the bounds could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BoundError {
    #[error("the cluster has no GPU")]
    NoGpu,
    #[error("power model of {model}: {source}")]
    Power {
        model: GpuModel,
        #[source]
        source: WorkloadError,
    },
    #[error("the workload horizon must be a finite number of seconds >= 0 (got {0})")]
    Horizon(f64),
}

/// One GPU of the cluster, as the bounds see it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BoundGpu {
    pub model: GpuModel,
    pub power: PowerModel,
}

/// The energy lower bound and its two parts.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EnergyBound {
    /// `idle_j + dynamic_j`, J.
    pub total_j: f64,
    /// Every GPU at idle power over `horizon_s`, J.
    pub idle_j: f64,
    /// Every job on its most energy-efficient profile, on fully loaded
    /// GPUs (perfect packing), J.
    pub dynamic_j: f64,
    /// Lower bound on the simulator's horizon
    /// `max(workload horizon, last completion)`, s.
    pub horizon_s: f64,
}

/// The tardiness lower bounds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TardinessBound {
    /// `max(per_job_total_s, single_machine_total_s)`, s.
    pub total_s: f64,
    /// `total_s` over the jobs counted, s.
    pub mean_s: f64,
    /// Every job started at arrival on its fastest profile, s.
    pub per_job_total_s: f64,
    /// The single-machine (SRPT + sorted deadlines) relaxation, s.
    pub single_machine_total_s: f64,
    /// Jobs that are late in every schedule (at least).
    pub late_jobs: u64,
    /// `late_jobs` over the jobs counted.
    pub late_share: f64,
}

/// Both bounds for one workload on one cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Bounds {
    /// Jobs the bounds cover (those that fit some profile of the cluster).
    pub jobs: u64,
    /// Jobs left out because they fit no profile (the simulator rejects them).
    pub excluded: u64,
    pub energy: EnergyBound,
    pub tardiness: TardinessBound,
}

impl Bounds {
    /// The lower bound of `ET = (e + alpha t) / (1 + alpha)` when `e` and `t`
    /// are normalised by a reference run with `reference_energy_j` and
    /// `reference_mean_tardiness_s` (the same rule as
    /// [`crate::sim::metrics::EtScore`]: a reference with zero tardiness gives
    /// `t = 1` to every run with zero tardiness and no ET to the others).
    ///
    /// Valid because ET is increasing in both the energy and the mean
    /// tardiness, each of which is bounded below separately; a sum of lower
    /// bounds is a lower bound of the sum (the two may not be attained by the
    /// same schedule, so the ET bound is looser than either part).
    pub fn et(&self, reference_energy_j: f64, reference_mean_tardiness_s: f64, alpha: f64) -> f64 {
        let e = if reference_energy_j > 0.0 {
            self.energy.total_j / reference_energy_j
        } else {
            1.0
        };
        let t = if reference_mean_tardiness_s > 0.0 {
            self.tardiness.mean_s / reference_mean_tardiness_s
        } else {
            1.0
        };
        (e + alpha * t) / (1.0 + alpha)
    }
}

/// The cheapest way to run `job` on one of `gpus`: the smallest
/// `(max - idle) * GPU-seconds` and the smallest GPU-seconds, each minimised
/// separately over the models present and the profiles that fit (memory and
/// requested size). `None` if nothing fits.
fn cheapest(job: &Job, gpus: &[BoundGpu]) -> Option<(f64, f64)> {
    // A gang job the cluster cannot run whole is refused by the simulator.
    let whole = gpus
        .iter()
        .filter(|g| job.most_efficient_profile(g.model).is_some())
        .count();
    if whole < job.gpus as usize {
        return None;
    }
    gpus.iter()
        .filter_map(|g| {
            job.most_efficient_profile(g.model)
                .map(|(_, area)| ((g.power.max_w - g.power.idle_w) * area, area))
        })
        .reduce(|(j1, a1), (j2, a2)| (j1.min(j2), a1.min(a2)))
}

/// Computes both lower bounds of `jobs` on the cluster `gpus` whose
/// workload horizon (the window arrivals were drawn in) is
/// `workload_horizon_s`.
pub fn compute(
    jobs: &[Job],
    gpus: &[BoundGpu],
    workload_horizon_s: f64,
) -> Result<Bounds, BoundError> {
    if gpus.is_empty() {
        return Err(BoundError::NoGpu);
    }
    for g in gpus {
        g.power.validate().map_err(|source| BoundError::Power {
            model: g.model,
            source,
        })?;
    }
    if !(workload_horizon_s.is_finite() && workload_horizon_s >= 0.0) {
        return Err(BoundError::Horizon(workload_horizon_s));
    }

    // Jobs the simulator can run, each with: release, deadline, fastest
    // run time, relaxed processing time (GPU-seconds), cheapest dynamic energy.
    struct Relaxed {
        release: f64,
        deadline: f64,
        fastest: f64,
        area: f64,
        dynamic_j: f64,
    }
    let mut relaxed = Vec::with_capacity(jobs.len());
    let mut excluded = 0u64;
    for job in jobs {
        match cheapest(job, gpus) {
            Some((dynamic_j, area)) => relaxed.push(Relaxed {
                release: job.arrival,
                deadline: job.deadline,
                // Every slice has speed <= 1 and the whole GPU (speed 1)
                // fits every job that fits anything, so `work` is the
                // shortest possible run time.
                fastest: job.work,
                area,
                dynamic_j,
            }),
            None => excluded += 1,
        }
    }
    let n = relaxed.len();

    // ---- Tardiness --------------------------------------------------------
    //
    // (a) Per job: `C_j >= r_j + runtime_j(k) >= r_j + work_j` because
    //     `speed <= 1` on every slice, so `T_j >= max(0, r_j + work_j - d_j)`
    //     in every schedule; summing gives `per_job`.
    //
    // (b) Single machine (Chu 1992): view the cluster as ONE machine that
    //     processes `N` GPU-seconds per second (N = number of GPUs). Job j
    //     running on k of C slices for runtime_j(k) uses a fraction k/C of
    //     one GPU, i.e. it consumes `a_j(k) = k/C * runtime_j(k) >= a_j`
    //     GPU-seconds of the machine (a_j = its most efficient fitting
    //     profile, minimised over the models present), inside [r_j, C_j],
    //     and at every instant the jobs together consume at most N per
    //     second (instances never share compute slices). Such a
    //     processor-sharing schedule meets the deadlines C_j with releases
    //     r_j, so by Horn's theorem the preemptive EDF schedule with
    //     processing times a_j / N does too: every schedule of the
    //     simulator maps to a preemptive single-machine schedule whose
    //     completion times are no later. SRPT minimises the i-th smallest
    //     completion time of all preemptive single-machine schedules
    //     simultaneously for every i, so the sorted SRPT completions
    //     C'_(1) <= ... <= C'_(n) are below the sorted completions of any
    //     simulator schedule, element by element. Finally, for a fixed
    //     sorted vector of completions, pairing it with the sorted deadlines
    //     minimises sum max(0, C - d) over all assignments (exchange
    //     argument: max(0, c - d) has decreasing differences in (c, d)).
    //     Hence sum_i max(0, C'_(i) - d_(i)) <= total tardiness of any
    //     schedule.
    //
    // Both are valid, so is their maximum.
    let per_job_total_s: f64 = relaxed
        .iter()
        .map(|j| (j.release + j.fastest - j.deadline).max(0.0))
        .sum();
    let per_job_late = relaxed
        .iter()
        .filter(|j| j.release + j.fastest > j.deadline)
        .count() as u64;
    let capacity = gpus.len() as f64;
    let mut completions = srpt_completions(
        &relaxed
            .iter()
            .map(|j| (j.release, j.area / capacity))
            .collect::<Vec<_>>(),
    );
    completions.sort_by(f64::total_cmp);
    let mut deadlines: Vec<f64> = relaxed.iter().map(|j| j.deadline).collect();
    deadlines.sort_by(f64::total_cmp);
    let single_machine_total_s: f64 = completions
        .iter()
        .zip(&deadlines)
        .map(|(c, d)| (c - d).max(0.0))
        .sum();
    // Late jobs: a schedule's on-time jobs form a matching of completions to
    // deadlines with C <= d. With sorted completions dominated element-wise
    // by any schedule's, the largest such matching of the SRPT completions
    // is at least as large as any schedule's; greedy over ascending
    // deadlines (each takes the smallest unused completion <= it) finds it.
    let mut on_time = 0usize;
    for &d in &deadlines {
        if on_time < completions.len() && completions[on_time] <= d {
            on_time += 1;
        }
    }
    let late_jobs = per_job_late.max((n - on_time) as u64);
    let total_s = per_job_total_s.max(single_machine_total_s);
    let tardiness = TardinessBound {
        total_s,
        mean_s: if n > 0 { total_s / n as f64 } else { 0.0 },
        per_job_total_s,
        single_machine_total_s,
        late_jobs,
        late_share: if n > 0 {
            late_jobs as f64 / n as f64
        } else {
            0.0
        },
    };

    // ---- Energy -----------------------------------------------------------
    //
    // Energy of a schedule: sum over GPUs g of the integral over [0, H] of
    // P_g(L_g(t)) = idle_g * H + integral of f_g(L_g(t)),
    // f_g(L) = (max_g - idle_g) * L^gamma_g.
    //
    // Idle part: H = max(workload horizon, last completion) and the last
    // completion is at least every job's r_j + work_j and at least the
    // largest SRPT completion above (the n-th completion of any schedule
    // is no earlier), so H >= `horizon_s` below and the idle part is at
    // least sum_g idle_g * horizon_s.
    //
    // Dynamic part: for 0 <= L <= 1 and 0 < gamma <= 1, L^gamma >= L (a
    // number in [0, 1] raised to a power <= 1 does not shrink). So
    // f_g(L) >= (max_g - idle_g) * L: a GPU never does better than when it
    // is fully loaded or fully idle; concavity punishes partial loads, it
    // never rewards them. The integral of L_g over time is the sum, over the
    // jobs run on g, of k_j / C * runtime_j(k_j) (the load definition:
    // each running job counts its instance's share). So the dynamic energy
    // is at least sum_j (max - idle)_{m(j)} * k_j/C * runtime_j(k_j), and
    // each term is at least the job's cheapest choice over models and
    // fitting profiles (`cheapest`). Equality needs every GPU to be full
    // or idle at every instant: the "perfect packing" of the relaxation.
    let srpt_makespan = completions.last().copied().unwrap_or(0.0);
    let last_fastest = relaxed
        .iter()
        .map(|j| j.release + j.fastest)
        .fold(0.0_f64, f64::max);
    let horizon_s = workload_horizon_s.max(srpt_makespan).max(last_fastest);
    let idle_j = gpus.iter().map(|g| g.power.idle_w).sum::<f64>() * horizon_s;
    let dynamic_j: f64 = relaxed.iter().map(|j| j.dynamic_j).sum();
    Ok(Bounds {
        jobs: n as u64,
        excluded,
        energy: EnergyBound {
            total_j: idle_j + dynamic_j,
            idle_j,
            dynamic_j,
            horizon_s,
        },
        tardiness,
    })
}

/// A job waiting in the SRPT queue: smallest remaining time first, then
/// lowest index (deterministic).
#[derive(Clone, Copy, Debug)]
struct Remaining(f64, usize);

impl PartialEq for Remaining {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Remaining {}
impl PartialOrd for Remaining {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Remaining {
    // Reversed: BinaryHeap is a max-heap, we pop the smallest.
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(other.1.cmp(&self.1))
    }
}

/// Completion times of the preemptive shortest-remaining-processing-time
/// schedule of `(release, processing)` jobs on one unit-speed machine, in the
/// order of the input.
pub fn srpt_completions(jobs: &[(f64, f64)]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| jobs[a].0.total_cmp(&jobs[b].0).then(a.cmp(&b)));
    let mut done = vec![0.0; jobs.len()];
    let mut heap = BinaryHeap::new();
    let mut next = 0;
    let mut t = f64::NEG_INFINITY;
    while next < order.len() || !heap.is_empty() {
        if heap.is_empty() {
            t = t.max(jobs[order[next]].0);
        }
        while next < order.len() && jobs[order[next]].0 <= t {
            let i = order[next];
            heap.push(Remaining(jobs[i].1.max(0.0), i));
            next += 1;
        }
        let Some(Remaining(rem, i)) = heap.pop() else {
            continue;
        };
        let release = order.get(next).map_or(f64::INFINITY, |&k| jobs[k].0);
        if t + rem <= release {
            t += rem;
            done[i] = t;
        } else {
            heap.push(Remaining(rem - (release - t), i));
            t = release;
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{JobClass, SpeedupCurve};

    fn job(id: u64, arrival: f64, work: f64, slack: f64, curve: SpeedupCurve) -> Job {
        Job {
            id,
            arrival,
            work,
            speedup: curve,
            memory_gb: 4.0,
            deadline: arrival + slack,
            class: JobClass::Inference,
            requested_slices: None,
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        }
    }

    fn a100(n: usize) -> Vec<BoundGpu> {
        vec![
            BoundGpu {
                model: GpuModel::A100_40gb,
                power: PowerModel::default_for(GpuModel::A100_40gb),
            };
            n
        ]
    }

    #[test]
    fn srpt_by_hand() {
        // Job 0: [0, 10) needs 4; job 1 arrives at 1 needing 1: preempts.
        let c = srpt_completions(&[(0.0, 4.0), (1.0, 1.0), (10.0, 2.0)]);
        assert_eq!(c, vec![5.0, 2.0, 12.0]);
        assert!(srpt_completions(&[]).is_empty());
    }

    #[test]
    fn energy_bound_by_hand() {
        // One linear job of 700 s on 7g: 700 GPU-seconds on any slice; the
        // bound is idle * horizon + 350 W * 700 s.
        let j = job(0, 0.0, 700.0, 2000.0, SpeedupCurve::linear());
        let b = compute(&[j], &a100(2), 1000.0).unwrap();
        assert_eq!(b.energy.horizon_s, 1000.0);
        assert!((b.energy.idle_j - 2.0 * 50.0 * 1000.0).abs() < 1e-9);
        assert!((b.energy.dynamic_j - 350.0 * 700.0).abs() < 1e-6);
        assert_eq!(b.tardiness.total_s, 0.0);
        // The horizon stretches to the earliest possible last completion.
        let late = job(0, 900.0, 700.0, 700.0, SpeedupCurve::linear());
        let b = compute(&[late], &a100(1), 1000.0).unwrap();
        assert_eq!(b.energy.horizon_s, 1600.0);
    }

    #[test]
    fn tardiness_bound_sees_contention() {
        // Ten linear whole-GPU jobs of 100 s at t = 0 with deadline 100 on one
        // GPU: at most ~one meets it; SRPT on a 1-GPU machine completes them
        // at 10, 20, ... (processor sharing relaxed to preemption), each
        // area 100 -> completions 100, 200, ..., 1000.
        let jobs: Vec<Job> = (0..10)
            .map(|i| job(i, 0.0, 100.0, 100.0, SpeedupCurve::linear()))
            .collect();
        let b = compute(&jobs, &a100(1), 0.0).unwrap();
        assert_eq!(b.tardiness.per_job_total_s, 0.0);
        let expected: f64 = (1..10).map(|i| 100.0 * f64::from(i)).sum();
        assert!((b.tardiness.single_machine_total_s - expected).abs() < 1e-6);
        assert_eq!(b.tardiness.late_jobs, 9);
        assert!((b.energy.horizon_s - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn excluded_jobs_and_errors() {
        let mut big = job(0, 0.0, 10.0, 10.0, SpeedupCurve::linear());
        big.memory_gb = 41.0;
        let b = compute(&[big], &a100(1), 10.0).unwrap();
        assert_eq!((b.jobs, b.excluded), (0, 1));
        assert_eq!(compute(&[], &[], 1.0).unwrap_err(), BoundError::NoGpu);
        assert!(matches!(
            compute(&[], &a100(1), f64::NAN),
            Err(BoundError::Horizon(_))
        ));
    }

    #[test]
    fn et_bound_follows_the_reference_rule() {
        let b = Bounds {
            energy: EnergyBound {
                total_j: 50.0,
                ..EnergyBound::default()
            },
            ..Bounds::default()
        };
        assert!((b.et(100.0, 10.0, 1.0) - 0.25).abs() < 1e-12);
        assert!((b.et(100.0, 0.0, 1.0) - 0.75).abs() < 1e-12);
    }
}
