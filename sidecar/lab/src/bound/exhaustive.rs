//! An exhaustive scheduler for tiny instances: the test oracle of the
//! lower bounds.
//!
//! For one GPU and at most [`MAX_JOBS`] jobs it enumerates every start order
//! and every fitting profile per job, and list-schedules each combination:
//! in the chosen order, each job starts at the earliest time, no earlier
//! than its arrival and the previous job's start, at which an instance of
//! its profile fits next to the instances still running (placed by
//! [`Geometry::best_spot`]). Instances are created for free and at
//! once (no reconfiguration time), which only helps the oracle. Every
//! schedule found is feasible for the simulator's rules (one instance per
//! job, no preemption, valid layouts at every instant), so any lower bound
//! must stay below the best of them. The energy of each schedule is
//! integrated exactly with the simulator's definition of load and horizon.

use crate::mig::{Geometry, GpuModel, Layout, Shape, SpotId};
use crate::workload::{Job, PowerModel};

/// Largest instance the oracle accepts (orders x profiles grows as n! 6^n).
pub const MAX_JOBS: usize = 5;

/// Why the oracle refused an instance.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExhaustiveError {
    #[error("{0} jobs: the exhaustive scheduler takes at most {MAX_JOBS}")]
    TooManyJobs(usize),
    #[error("job {0} fits no profile of the GPU")]
    DoesNotFit(u64),
}

/// Value of one schedule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// Energy over `[0, max(workload horizon, last completion)]`, J.
    pub energy_j: f64,
    pub total_tardiness_s: f64,
    pub late_jobs: u64,
    pub makespan_s: f64,
}

/// Every schedule's value, and the best of each objective.
#[derive(Clone, Debug, PartialEq)]
pub struct Best {
    /// Jobs of the instance (mean tardiness = total / jobs).
    pub jobs: usize,
    pub outcomes: Vec<Outcome>,
    pub min_energy_j: f64,
    pub min_total_tardiness_s: f64,
    pub min_late_jobs: u64,
}

impl Best {
    /// The smallest `ET = (E/e_ref + alpha T/t_ref) / (1 + alpha)` over the
    /// schedules, `T` the mean tardiness (`t_ref = 0` counts `t` as 1, as
    /// [`super::Bounds::et`]).
    pub fn min_et(&self, e_ref: f64, t_ref: f64, alpha: f64) -> f64 {
        let n = self.jobs.max(1) as f64;
        self.outcomes
            .iter()
            .map(|o| {
                let e = o.energy_j / e_ref;
                let t = if t_ref > 0.0 {
                    o.total_tardiness_s / n / t_ref
                } else {
                    1.0
                };
                (e + alpha * t) / (1.0 + alpha)
            })
            .fold(f64::INFINITY, f64::min)
    }
}

/// Enumerates the schedules of `jobs` on one GPU of `model`.
pub fn search(
    jobs: &[Job],
    model: GpuModel,
    power: PowerModel,
    workload_horizon_s: f64,
) -> Result<Best, ExhaustiveError> {
    if jobs.len() > MAX_JOBS {
        return Err(ExhaustiveError::TooManyJobs(jobs.len()));
    }
    let geometry = Geometry::of(model);
    let total = geometry.spec.compute_slices;
    let options: Vec<Vec<Shape>> = jobs
        .iter()
        .map(|j| {
            let min_k = j.requested_slices.unwrap_or(0);
            let shapes: Vec<Shape> = geometry
                .spec
                .profiles
                .iter()
                .filter(|p| j.fits(p) && p.shape.compute >= min_k)
                .map(|p| p.shape)
                .collect();
            if shapes.is_empty() {
                Err(ExhaustiveError::DoesNotFit(j.id))
            } else {
                Ok(shapes)
            }
        })
        .collect::<Result<_, _>>()?;

    let mut outcomes = Vec::new();
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    permutations(&mut order, 0, &mut |perm| {
        let mut choice = vec![0usize; jobs.len()];
        loop {
            outcomes.push(list_schedule(
                jobs,
                perm,
                &choice,
                &options,
                geometry,
                total,
                power,
                workload_horizon_s,
            ));
            // Next choice vector (odometer).
            let mut i = 0;
            loop {
                if i == choice.len() {
                    return;
                }
                choice[i] += 1;
                if choice[i] < options[i].len() {
                    break;
                }
                choice[i] = 0;
                i += 1;
            }
        }
    });
    let fold = |f: fn(&Outcome) -> f64| outcomes.iter().map(f).fold(f64::INFINITY, f64::min);
    Ok(Best {
        jobs: jobs.len(),
        min_energy_j: fold(|o| o.energy_j),
        min_total_tardiness_s: fold(|o| o.total_tardiness_s),
        min_late_jobs: outcomes.iter().map(|o| o.late_jobs).min().unwrap_or(0),
        outcomes,
    })
}

/// Calls `f` with every permutation of `v[k..]` (prefix fixed).
fn permutations(v: &mut Vec<usize>, k: usize, f: &mut dyn FnMut(&[usize])) {
    if k == v.len() {
        f(v);
        return;
    }
    for i in k..v.len() {
        v.swap(k, i);
        permutations(v, k + 1, f);
        v.swap(k, i);
    }
}

#[allow(clippy::too_many_arguments)]
fn list_schedule(
    jobs: &[Job],
    order: &[usize],
    choice: &[usize],
    options: &[Vec<Shape>],
    geometry: &Geometry,
    total: u8,
    power: PowerModel,
    workload_horizon_s: f64,
) -> Outcome {
    // (start, end, placement, compute) of the jobs scheduled so far.
    let mut placed: Vec<(f64, f64, SpotId, u8)> = Vec::with_capacity(order.len());
    let mut prev_start = f64::NEG_INFINITY;
    let mut tardiness = 0.0;
    let mut late = 0;
    for &j in order {
        let job = &jobs[j];
        let shape = options[j][choice[j]];
        let t0 = job.arrival.max(prev_start);
        let mut times: Vec<f64> = std::iter::once(t0)
            .chain(placed.iter().map(|p| p.1).filter(|&e| e > t0))
            .collect();
        times.sort_by(f64::total_cmp);
        let (start, id) = times
            .iter()
            .find_map(|&t| {
                let running: Layout = placed
                    .iter()
                    .filter(|p| p.0 <= t && t < p.1)
                    .map(|p| p.2)
                    .collect();
                geometry.best_spot(running, shape).map(|id| (t, id))
            })
            .expect("after every running job has ended the GPU is empty and any profile fits");
        let end = start + job.runtime_on(shape.compute, total);
        let t = (end - job.deadline).max(0.0);
        tardiness += t;
        late += u64::from(t > 0.0);
        prev_start = start;
        placed.push((start, end, id, shape.compute));
    }
    let makespan = placed.iter().map(|p| p.1).fold(0.0_f64, f64::max);
    let horizon = workload_horizon_s.max(makespan);
    // Exact integral of the piecewise-constant power.
    let mut cuts: Vec<f64> = placed
        .iter()
        .flat_map(|p| [p.0, p.1])
        .chain([0.0, horizon])
        .collect();
    cuts.sort_by(f64::total_cmp);
    cuts.dedup();
    let mut energy = 0.0;
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let busy = placed.iter().filter(|p| p.0 <= a && b <= p.1).map(|p| p.3);
        energy += power.energy_j(crate::workload::gpu_load(busy, total), b - a);
    }
    Outcome {
        energy_j: energy,
        total_tardiness_s: tardiness,
        late_jobs: late,
        makespan_s: makespan,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{JobClass, SpeedupCurve};

    #[test]
    fn two_small_jobs_share_the_gpu() {
        let j = |id, arrival| Job {
            id,
            arrival,
            work: 100.0,
            speedup: SpeedupCurve::new(0.5, 0.5).unwrap(),
            memory_gb: 4.0,
            deadline: arrival + 150.0,
            class: JobClass::Inference,
            requested_slices: None,
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        };
        let model = GpuModel::A100_40gb;
        let p = PowerModel::default_for(model);
        let best = search(&[j(0, 0.0), j(1, 0.0)], model, p, 0.0).unwrap();
        // 2 orders x 6 profiles^2.
        assert_eq!(best.outcomes.len(), 72);
        assert_eq!(best.min_total_tardiness_s, 0.0);
        // Both on 4g + 3g (speed 1 at f >= 0.5 for 4g; 3g: (3/7/0.5)^0.5)
        // is no worse than running them one after the other on 7g.
        let serial = p.energy_j(1.0, 200.0);
        assert!(best.min_energy_j < serial);
        assert!(matches!(
            search(&vec![j(0, 0.0); 6], model, p, 0.0),
            Err(ExhaustiveError::TooManyJobs(6))
        ));
    }
}
