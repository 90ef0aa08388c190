//! Jobs served on demand (issue 54): in every engine, a job of a policy
//! smartmig runs that fits no ready instance gets one built as smartmigd's
//! allocate would build it; it never waits on a GPU whose idle instances
//! could be re-shaped for it. The opponents that stand for a site without
//! smartmig (fixed Slurm GRES types) still wait for a matching slot.

use super::common::audited;
use smartmig::mig::GpuModel;
use smartmig::policy::{parse_policy, RepartitionPolicy};
use smartmig::sim::{EpochRule, Record, SimConfig, SimResult, SlurmLike};
use smartmig::workload::Job;

const A100: GpuModel = GpuModel::A100_40gb;

/// A job needing `memory_gb`, due at `arrival + 2 x work`.
fn job(id: u64, arrival: f64, work: f64, memory_gb: f64, k: u8) -> Job {
    Job {
        memory_gb,
        deadline: arrival + 2.0 * work,
        ..super::common::job(id, arrival, work, k)
    }
}

/// The lone whole-GPU job of the issue: at t = 0 on two A100-40GB that
/// greedy starts as 4g.20gb + 3g.20gb, and a 1-slice job ten days later.
fn lone_whole_gpu_job() -> Vec<Job> {
    vec![
        job(0, 0.0, 3600.0, 40.0, 7),
        job(1, 864_000.0, 60.0, 5.0, 1),
    ]
}

/// Runs with an audited event log; returns the result and the start of
/// every job that ran, by id.
fn run(
    jobs: &[Job],
    policy: &mut dyn RepartitionPolicy,
    slurm: Option<SlurmLike>,
) -> (SimResult, Vec<(u64, f64)>) {
    let cfg = SimConfig {
        epoch: EpochRule::Events(5),
        slurm,
        ..SimConfig::default()
    };
    let (r, log) = audited(&[A100, A100], jobs, policy, &cfg);
    let starts = log
        .iter()
        .filter_map(|rec| match rec {
            Record::Job(j) => Some((j.run.id, j.run.start)),
            _ => None,
        })
        .collect();
    (r, starts)
}

fn start_of(starts: &[(u64, f64)], id: u64) -> f64 {
    starts
        .iter()
        .find(|s| s.0 == id)
        .unwrap_or_else(|| panic!("job {id} never ran: {starts:?}"))
        .1
}

#[test]
fn a_lone_whole_gpu_job_waits_at_most_one_reconfiguration_in_every_engine() {
    let reconfig = SimConfig::default().reconfig_time_s;
    for slurm in [None, Some(SlurmLike::default())] {
        let engine = if slurm.is_some() {
            "slurm-like"
        } else {
            "central"
        };
        let mut greedy = parse_policy("greedy", &[A100]).expect("greedy");
        let (r, starts) = run(&lone_whole_gpu_job(), greedy.as_mut(), slurm);
        let start = start_of(&starts, 0);
        assert!(
            start <= reconfig + 1e-9,
            "{engine}: the whole-GPU job started at {start} s, not within one reconfiguration ({reconfig} s)"
        );
        assert_eq!(r.metrics.completed, 2, "{engine}: {:?}", r.metrics);
        assert!(
            r.metrics.on_demand_builds >= 1,
            "{engine}: the job's 7g was built on demand: {:?}",
            r.metrics
        );
    }
}

#[test]
fn the_engines_serve_the_lone_job_alike() {
    // The whole-GPU job is built at the same time in both. The 1-slice job
    // may differ by one reconfiguration: the central engine lets it run on
    // an idle bigger instance, Slurm bills it one shard and smartmigd
    // builds a 1g for it.
    let reconfig = SimConfig::default().reconfig_time_s;
    let mut a = parse_policy("greedy", &[A100]).expect("greedy");
    let mut b = parse_policy("greedy", &[A100]).expect("greedy");
    let (_, central) = run(&lone_whole_gpu_job(), a.as_mut(), None);
    let (_, slurm) = run(
        &lone_whole_gpu_job(),
        b.as_mut(),
        Some(SlurmLike::default()),
    );
    let (c, s) = (start_of(&central, 0), start_of(&slurm, 0));
    assert!(
        (c - s).abs() <= 1e-9,
        "the whole-GPU job: central engine starts it at {c} s, Slurm-like at {s} s"
    );
    for starts in [&central, &slurm] {
        let wait = start_of(starts, 1) - 864_000.0;
        assert!(wait <= reconfig + 1e-9, "the 1-slice job waited {wait} s");
    }
}

#[test]
fn a_fixed_layout_still_waits_for_a_matching_slot() {
    // `static:1` is 4g.20gb + 3g.20gb on every GPU: Slurm's fixed GRES
    // types have no whole GPU to give, so the job never runs.
    let mut fixed = parse_policy("static:1", &[A100]).expect("static");
    let (r, starts) = run(&lone_whole_gpu_job(), fixed.as_mut(), None);
    assert!(starts.iter().all(|s| s.0 != 0), "{starts:?}");
    assert_eq!(r.metrics.unserved, 1, "{:?}", r.metrics);
    assert_eq!(r.metrics.on_demand_builds, 0);
}

#[test]
fn a_busy_instance_is_never_reshaped_for_a_waiting_job() {
    // A 3g job runs on GPU 0's 3g.20gb; a whole-GPU job arrives. GPU 1 is
    // re-shaped for it at once; GPU 0 keeps its running job.
    let jobs = vec![
        job(0, 0.0, 7200.0, 10.0, 3),
        job(1, 10.0, 600.0, 40.0, 7),
        job(2, 20.0, 600.0, 40.0, 7),
    ];
    let mut greedy = parse_policy("greedy", &[A100]).expect("greedy");
    let (r, starts) = run(&jobs, greedy.as_mut(), None);
    let reconfig = SimConfig::default().reconfig_time_s;
    assert!(start_of(&starts, 1) <= 10.0 + reconfig + 1e-9, "{starts:?}");
    // The second whole-GPU job needs GPU 0 or GPU 1 whole: it waits for
    // one of the two runs to end, not more.
    assert!(
        start_of(&starts, 2) <= 10.0 + reconfig + 600.0 + reconfig + 1e-9,
        "{starts:?}"
    );
    assert_eq!(r.metrics.completed, 3);
}
