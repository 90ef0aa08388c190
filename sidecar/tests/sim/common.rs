//! What the engine tests share: a job with a linear curve, and a run whose
//! event log is audited.

use smartmig::mig::GpuModel;
use smartmig::policy::RepartitionPolicy;
use smartmig::sim::{audit, simulate, Collect, Heuristic, Record, RunHooks, SimConfig, SimResult};
use smartmig::workload::{Job, JobClass, SpeedupCurve};

/// A training job of `work` s (linear curve) arriving at `arrival` and
/// asking for `k` slices with 1 GB, due at `arrival + 3 x work`; tests set
/// other fields with `Job { .., ..job(..) }`.
pub(crate) fn job(id: u64, arrival: f64, work: f64, k: u8) -> Job {
    Job {
        id,
        arrival,
        work,
        speedup: SpeedupCurve::new(1.0, 1.0).expect("curve"),
        memory_gb: 1.0,
        deadline: arrival + 3.0 * work,
        class: JobClass::Training,
        requested_slices: Some(k),
        declared_memory_gb: None,
        template: None,
        memory_growth: None,
        gpus: 1,
    }
}

/// Runs `jobs` on `gpus` with EDF placement, audits the event log (its
/// energy must be the run's), and returns the result and the log.
pub(crate) fn audited(
    gpus: &[GpuModel],
    jobs: &[Job],
    policy: &mut dyn RepartitionPolicy,
    cfg: &SimConfig,
) -> (SimResult, Vec<Record>) {
    let mut log = Collect::default();
    let mut h = Heuristic::Edf.build(0);
    let r = simulate(
        gpus,
        jobs,
        h.as_mut(),
        policy,
        cfg,
        RunHooks {
            sink: Some(&mut log),
            progress: None,
        },
    )
    .expect("simulate");
    let report = audit(&log.0).unwrap_or_else(|e| panic!("audit: {e}"));
    assert!(
        (report.energy_j - r.metrics.energy_j).abs() <= 1e-6 * r.metrics.energy_j.max(1.0),
        "audit {} J, run {} J",
        report.energy_j,
        r.metrics.energy_j
    );
    assert_eq!(report.jobs, r.metrics.completed, "a gang job counts once");
    (r, log.0)
}
