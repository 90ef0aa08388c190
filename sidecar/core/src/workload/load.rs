//! Offered load: how busy a workload would keep a cluster, and the cluster
//! size that makes it as busy as wanted.
//!
//! A trace replayed on an arbitrary number of GPUs has an accidental load
//! (idle or saturated, and then every policy looks alike); sizing the
//! cluster by [`gpus_for_load`] makes the load a chosen experimental
//! parameter, as the diurnal generator's calibration does for synthetic
//! workloads (`docs/workload.md`).

use super::{Job, WorkloadError};
use crate::mig::GpuModel;

/// GPU-seconds of the jobs arriving in each bin of `bin_s` seconds, each on
/// its most efficient fitting profile (whole-GPU work if none fits). Bin 0
/// starts at time 0 (earlier arrivals count in it); empty for no jobs or a
/// bin width that is not > 0.
fn bin_areas(jobs: &[Job], model: GpuModel, bin_s: f64) -> Vec<f64> {
    if jobs.is_empty() || bin_s.is_nan() || bin_s <= 0.0 {
        return Vec::new();
    }
    let end = jobs.iter().map(|j| j.arrival).fold(0.0_f64, f64::max);
    let bins = (end / bin_s).floor() as usize + 1;
    let mut area = vec![0.0; bins];
    for j in jobs {
        let a = j.most_efficient_profile(model).map_or(j.work, |(_, a)| a);
        let b = ((j.arrival.max(0.0) / bin_s) as usize).min(bins - 1);
        area[b] += a;
    }
    area
}

/// Offered load per time bin: for the jobs *arriving* in each bin of
/// `bin_s` seconds, the GPU-seconds they need on their most efficient
/// fitting profile ([`Job::most_efficient_profile`], honouring a requested
/// size), divided by the capacity of the bin (`bin_s x gpus`). A job that
/// fits no profile counts its whole-GPU work. 1.0 = the arrivals of that bin
/// alone would keep every GPU busy for the bin even with perfect packing.
pub fn offered_load(jobs: &[Job], model: GpuModel, gpus: usize, bin_s: f64) -> Vec<f64> {
    if gpus == 0 {
        return Vec::new();
    }
    let cap = bin_s * gpus as f64;
    bin_areas(jobs, model, bin_s)
        .into_iter()
        .map(|a| a / cap)
        .collect()
}

/// Demand per time bin: the share of the cluster's GPUs busy in each bin
/// of `bin_s` seconds if every job started on arrival on its most
/// efficient fitting profile ([`Job::most_efficient_profile`]): a job of k
/// of the GPU's C compute slices that runs `d` seconds there counts `k / C`
/// GPUs over `[arrival, arrival + d)`. Unlike [`offered_load`], a job of
/// several days spreads over the days it runs instead of loading the hour
/// it arrives in, so the peak measures concurrency (what sizes a cluster).
/// A gang job counts all the GPUs it spans for its `work`; a job that fits
/// no profile counts one whole GPU for its whole-GPU work.
pub fn demand_load(jobs: &[Job], model: GpuModel, gpus: usize, bin_s: f64) -> Vec<f64> {
    if jobs.is_empty() || gpus == 0 || !(bin_s.is_finite() && bin_s > 0.0) {
        return Vec::new();
    }
    let total = f64::from(model.spec().compute_slices);
    let spans: Vec<(f64, f64, f64)> = jobs
        .iter()
        .map(|j| {
            let (share, area) = j
                .most_efficient_profile(model)
                .map_or((1.0, j.work), |(p, a)| {
                    // A gang job's area is that of all its GPUs.
                    (f64::from(p.shape.compute) / total * f64::from(j.gpus), a)
                });
            let start = j.arrival.max(0.0);
            (start, start + area / share, share)
        })
        .collect();
    let end = spans.iter().map(|s| s.1).fold(0.0_f64, f64::max);
    let bins = ((end / bin_s).ceil() as usize).max(1);
    let mut busy = vec![0.0; bins];
    for (start, stop, share) in spans {
        let first = ((start / bin_s) as usize).min(bins - 1);
        let last = ((stop / bin_s) as usize).min(bins - 1);
        for (b, slot) in busy.iter_mut().enumerate().take(last + 1).skip(first) {
            let lo = start.max(b as f64 * bin_s);
            let hi = stop.min((b + 1) as f64 * bin_s);
            if hi > lo {
                *slot += share * (hi - lo);
            }
        }
    }
    let cap = bin_s * gpus as f64;
    for x in &mut busy {
        *x /= cap;
    }
    busy
}

/// The busiest bin's [`demand_load`] (0 for no jobs): the load the cluster
/// must absorb at the peak, which decides whether a policy can keep up.
pub fn peak_demand_load(jobs: &[Job], model: GpuModel, gpus: usize, bin_s: f64) -> f64 {
    demand_load(jobs, model, gpus, bin_s)
        .into_iter()
        .fold(0.0, f64::max)
}

/// The smallest GPU count (>= 1) of `model` whose [`peak_demand_load`]
/// with bins of `bin_s` is at most `target_peak_load`, so that a trace
/// replay runs at a chosen load instead of an accidental one. The load
/// scales as 1/GPUs, so the count is computed in closed form (then checked
/// against rounding). Errors: a target or bin width that is not a finite
/// value > 0, or a count beyond `u32::MAX`.
pub fn gpus_for_load(
    jobs: &[Job],
    model: GpuModel,
    target_peak_load: f64,
    bin_s: f64,
) -> Result<usize, WorkloadError> {
    let positive = |field: &'static str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(WorkloadError::invalid(
                field,
                format!("{v} is not a finite value > 0"),
            ))
        }
    };
    positive("target peak load", target_peak_load)?;
    positive("bin width", bin_s)?;
    // Busy GPUs at the peak on a one-GPU cluster = GPUs needed at load 1.
    let peak_gpus = peak_demand_load(jobs, model, 1, bin_s);
    let load = |n: usize| peak_gpus / n as f64;
    let estimate = (peak_gpus / target_peak_load).ceil();
    if estimate > f64::from(u32::MAX) {
        return Err(WorkloadError::invalid(
            "target peak load",
            format!(
                "{target_peak_load} needs more than {} GPUs (peak demand {peak_gpus} GPUs)",
                u32::MAX
            ),
        ));
    }
    let mut n = (estimate as usize).max(1);
    while n > 1 && load(n - 1) <= target_peak_load {
        n -= 1;
    }
    while load(n) > target_peak_load {
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{JobClass, SpeedupCurve};

    const M: GpuModel = GpuModel::A100_40gb;

    /// A linear job of `work` s on the whole GPU, arriving at `arrival`:
    /// every profile costs `work` GPU-seconds.
    fn job(arrival: f64, work: f64) -> Job {
        Job {
            id: 0,
            arrival,
            work,
            speedup: SpeedupCurve::new(1.0, 1.0).unwrap(),
            memory_gb: 4.0,
            deadline: arrival + 2.0 * work,
            class: JobClass::Training,
            requested_slices: Some(7),
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        }
    }

    #[test]
    fn offered_and_peak_load_by_hand() {
        // Hour 0: 3600 + 1800 GPU-s; hour 1: nothing; hour 2: 7200 GPU-s.
        let jobs = [job(0.0, 3600.0), job(10.0, 1800.0), job(7300.0, 7200.0)];
        let l = offered_load(&jobs, M, 2, 3600.0);
        assert_eq!(l, vec![0.75, 0.0, 1.0]);
        assert!(offered_load(&jobs, M, 0, 3600.0).is_empty());
        assert!(offered_load(&jobs, M, 2, 0.0).is_empty());
        // Demand spreads each job over the hours it runs (whole GPUs here).
        let d = demand_load(&jobs, M, 2, 3600.0);
        let want = [0.75, 0.0, 3500.0 / 7200.0, 0.5, 100.0 / 7200.0];
        assert_eq!(d.len(), want.len(), "{d:?}");
        for (a, b) in d.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{d:?}");
        }
        assert_eq!(peak_demand_load(&jobs, M, 4, 3600.0), 0.375);
        assert_eq!(peak_demand_load(&[], M, 4, 3600.0), 0.0);
        // A three-day job: 72 GPU-hours arrive in hour 0, but it keeps one
        // GPU busy, not 72.
        let long = [job(0.0, 3.0 * 86_400.0)];
        assert_eq!(offered_load(&long, M, 1, 3600.0)[0], 72.0);
        assert_eq!(peak_demand_load(&long, M, 1, 3600.0), 1.0);
        assert_eq!(gpus_for_load(&long, M, 0.5, 3600.0), Ok(2));
        // A gang job of four GPUs for two hours keeps four GPUs busy for
        // two hours (not one GPU for eight) and offers 8 GPU-hours.
        let mut gang = job(0.0, 7200.0);
        gang.gpus = 4;
        let d = demand_load(std::slice::from_ref(&gang), M, 4, 3600.0);
        assert_eq!(d, vec![1.0, 1.0]);
        assert_eq!(
            offered_load(std::slice::from_ref(&gang), M, 4, 3600.0),
            vec![2.0]
        );
    }

    #[test]
    fn requested_size_counts_in_the_load() {
        // A sub-linear job is cheapest on 1g; asking for 7g costs its whole-GPU work.
        let mut j = job(0.0, 3600.0);
        j.speedup = SpeedupCurve::new(0.5, 0.5).unwrap();
        j.requested_slices = None;
        let free = offered_load(std::slice::from_ref(&j), M, 1, 3600.0)[0];
        j.requested_slices = Some(7);
        let asked = offered_load(std::slice::from_ref(&j), M, 1, 3600.0)[0];
        assert!(free < 0.9 && asked == 1.0, "{free} {asked}");
    }

    #[test]
    fn gpus_for_load_is_the_smallest_count_meeting_the_target() {
        // Peak hour: 10 whole-GPU jobs of an hour, starting 0-9 s apart.
        let jobs: Vec<Job> = (0..10).map(|i| job(f64::from(i), 3600.0)).collect();
        assert_eq!(gpus_for_load(&jobs, M, 1.0, 3600.0), Ok(10));
        assert_eq!(gpus_for_load(&jobs, M, 0.8, 3600.0), Ok(13));
        assert_eq!(gpus_for_load(&jobs, M, 0.5, 3600.0), Ok(20));
        assert_eq!(gpus_for_load(&jobs, M, 100.0, 3600.0), Ok(1));
        assert_eq!(gpus_for_load(&[], M, 0.8, 3600.0), Ok(1));
        // Against the definition, for awkward targets.
        for target in [0.07, 0.3, 0.333, 0.77, 0.9999, 2.5] {
            let n = gpus_for_load(&jobs, M, target, 3600.0).unwrap();
            assert!(peak_demand_load(&jobs, M, n, 3600.0) <= target, "{target}");
            assert!(n == 1 || peak_demand_load(&jobs, M, n - 1, 3600.0) > target);
        }
    }

    #[test]
    fn gpus_for_load_rejects_bad_targets() {
        let jobs = [job(0.0, 3600.0)];
        for bad in [0.0, -0.5, f64::NAN, f64::INFINITY] {
            let e = gpus_for_load(&jobs, M, bad, 3600.0)
                .unwrap_err()
                .to_string();
            assert!(e.contains("target peak load"), "{e}");
        }
        assert!(gpus_for_load(&jobs, M, 0.8, 0.0).is_err());
        let e = gpus_for_load(&jobs, M, 1e-300, 3600.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than"), "{e}");
    }
}
