//! Multi-GPU (gang) jobs (issue 54 item 2): a job of `gpus > 1` runs on
//! that many whole-GPU instances at once, every piece starting and ending
//! together, in both engines; the event log of such runs passes the
//! audit; a fixed layout without enough whole GPUs leaves it unserved and
//! holds nothing for it; a job wider than the cluster is refused with the
//! reason.

use super::common::audited;
use smartmig::mig::GpuModel;
use smartmig::policy::{parse_policy, RepartitionPolicy};
use smartmig::sim::{EpochRule, Record, SimConfig, SimResult, SlurmLike};
use smartmig::workload::Job;

const A100: GpuModel = GpuModel::A100_40gb;

/// A job of `gpus` GPUs asking for `k` slices (30 GB for a whole GPU).
fn job(id: u64, arrival: f64, work: f64, k: u8, gpus: u32) -> Job {
    Job {
        memory_gb: if k == 7 { 30.0 } else { 4.0 },
        gpus,
        ..super::common::job(id, arrival, work, k)
    }
}

struct Ran {
    result: SimResult,
    /// (job id, GPU, start, end) of every run record.
    runs: Vec<(u64, usize, f64, f64)>,
    /// (job id, reason) of every unserved record.
    unserved: Vec<(u64, String)>,
}

fn run(gpus: usize, jobs: &[Job], policy: &str, slurm: Option<SlurmLike>) -> Ran {
    let cluster = vec![A100; gpus];
    let mut policy: Box<dyn RepartitionPolicy + Send> =
        parse_policy(policy, &cluster).expect("policy");
    let cfg = SimConfig {
        epoch: EpochRule::Events(5),
        slurm,
        ..SimConfig::default()
    };
    let (result, log) = audited(&cluster, jobs, policy.as_mut(), &cfg);
    let mut runs = Vec::new();
    let mut unserved = Vec::new();
    for rec in &log {
        match rec {
            Record::Job(j) => runs.push((j.run.id, j.run.gpu, j.run.start, j.end)),
            Record::Unserved(u) => unserved.push((u.id, u.reason.clone())),
            _ => {}
        }
    }
    Ran {
        result,
        runs,
        unserved,
    }
}

fn pieces(ran: &Ran, id: u64) -> Vec<(usize, f64, f64)> {
    ran.runs
        .iter()
        .filter(|r| r.0 == id)
        .map(|r| (r.1, r.2, r.3))
        .collect()
}

/// When job `id`'s first piece started under `policy` (fails if it never ran).
fn first_start(ran: &Ran, policy: &str, id: u64) -> f64 {
    pieces(ran, id)
        .first()
        .unwrap_or_else(|| panic!("{policy}: job {id} never ran: {:?}", ran.runs))
        .1
}

#[test]
fn whole_gpus_start_a_gang_job_together_once_enough_are_free() {
    // Four whole GPUs: two single jobs, then a job of three GPUs, which
    // waits for the first single to end (t = 1000) and runs 500 s.
    let jobs = [
        job(0, 0.0, 1000.0, 7, 1),
        job(1, 0.0, 2000.0, 7, 1),
        job(2, 10.0, 500.0, 7, 3),
    ];
    let ran = run(4, &jobs, "none", None);
    let p = pieces(&ran, 2);
    assert_eq!(p.len(), 3, "one run per GPU: {p:?}");
    let mut gpus: Vec<usize> = p.iter().map(|x| x.0).collect();
    gpus.sort_unstable();
    gpus.dedup();
    assert_eq!(gpus.len(), 3, "three distinct GPUs: {p:?}");
    for &(_, start, end) in &p {
        assert!((start - 1000.0).abs() < 1e-9, "{p:?}");
        assert!((end - 1500.0).abs() < 1e-9, "{p:?}");
    }
    assert_eq!(ran.result.metrics.completed, 3);
    assert_eq!(ran.result.metrics.unserved, 0);
}

#[test]
fn served_on_demand_a_gang_job_gets_its_gpus_made_whole_in_every_engine() {
    // Greedy starts every A100 as 4g + 3g; smartmigd makes two of them
    // whole for the job of two GPUs, one reconfiguration each.
    let reconfig = SimConfig::default().reconfig_time_s;
    let jobs = [job(0, 0.0, 600.0, 7, 2), job(1, 5.0, 100.0, 1, 1)];
    for slurm in [None, Some(SlurmLike::default())] {
        let engine = if slurm.is_some() {
            "slurm-like"
        } else {
            "central"
        };
        let ran = run(3, &jobs, "greedy", slurm);
        let p = pieces(&ran, 0);
        assert_eq!(p.len(), 2, "{engine}: {p:?}");
        assert_ne!(p[0].0, p[1].0, "{engine}: {p:?}");
        assert!(
            p.iter().all(|x| x.1 <= reconfig + 1e-9 && x.1 == p[0].1),
            "{engine}: both pieces start together within one reconfiguration: {p:?}"
        );
        assert_eq!(
            ran.result.metrics.completed, 2,
            "{engine}: {:?}",
            ran.result.metrics
        );
        assert!(
            ran.result.metrics.on_demand_builds >= 2,
            "{engine}: {:?}",
            ran.result.metrics
        );
    }
}

#[test]
fn a_fixed_layout_without_whole_gpus_leaves_a_gang_job_unserved_and_holds_nothing() {
    let jobs = [job(0, 0.0, 600.0, 7, 2), job(1, 5.0, 100.0, 3, 1)];
    let ran = run(2, &jobs, "static:4444|3333", None);
    assert!(pieces(&ran, 0).is_empty(), "{:?}", ran.runs);
    assert_eq!(ran.result.metrics.unserved, 1, "{:?}", ran.result.metrics);
    let single = pieces(&ran, 1);
    assert_eq!(single.len(), 1);
    assert!(
        (single[0].1 - 5.0).abs() < 1e-9,
        "the single job starts at once: {single:?}"
    );
}

#[test]
fn a_gang_job_wider_than_the_cluster_is_refused_with_the_reason() {
    let jobs = [job(0, 0.0, 600.0, 7, 5), job(1, 5.0, 100.0, 1, 1)];
    for (policy, slurm) in [
        ("none", None),
        ("greedy", None),
        ("greedy", Some(SlurmLike::default())),
    ] {
        let ran = run(4, &jobs, policy, slurm);
        let (_, reason) = ran
            .unserved
            .iter()
            .find(|u| u.0 == 0)
            .unwrap_or_else(|| panic!("{policy}: job 0 is not unserved: {:?}", ran.unserved));
        assert!(
            reason.contains("spans 5 GPUs") && reason.contains("has 4"),
            "{policy}: {reason}"
        );
        assert_eq!(ran.result.metrics.completed, 1, "{policy}");
    }
}

#[test]
fn the_first_gang_job_reserves_its_gpus_and_only_jobs_that_end_in_time_backfill_them() {
    // Two whole GPUs. A runs on one until t = 1000; the gang job of two
    // arrives at 10 and is reserved both GPUs from t = 1000. B (100 s)
    // ends in time and backfills the idle GPU at once; C (5000 s) would
    // not, so it waits for the gang job to end.
    let jobs = [
        job(0, 0.0, 1000.0, 7, 1),
        job(1, 10.0, 500.0, 7, 2),
        job(2, 20.0, 100.0, 7, 1),
        job(3, 30.0, 5000.0, 7, 1),
    ];
    for (policy, slurm) in [
        ("none", None),
        ("greedy", None),
        ("greedy", Some(SlurmLike::default())),
    ] {
        let ran = run(2, &jobs, policy, slurm.clone());
        let start = |id: u64| first_start(&ran, policy, id);
        let slack = if slurm.is_some() || policy != "none" {
            2.0 * SimConfig::default().reconfig_time_s
        } else {
            0.0
        };
        assert!(
            start(2) <= 20.0 + slack + 1e-9,
            "{policy}: B backfills at once: {:?}",
            ran.runs
        );
        assert!(
            (start(1) - 1000.0).abs() <= slack + 1e-9,
            "{policy}: the gang job starts when A ends: {:?}",
            ran.runs
        );
        assert!(
            start(3) >= 1500.0 - 1e-9,
            "{policy}: C waits for the gang job: {:?}",
            ran.runs
        );
    }
}

/// The same reservation when the short job comes after the gang job in
/// priority order (a later deadline): Slurm's backfill still lets it use a
/// reserved GPU that idles until the gang job can start. The Slurm-like
/// engine once kept each reserved GPU only until its own drain, so the
/// idle one went to no one and every later job waited for the gang job
/// (Alibaba v2023 window 135: 153,000 s).
#[test]
fn a_later_job_backfills_a_reserved_gpu_that_idles_until_the_gang_starts() {
    let jobs = [
        job(0, 0.0, 1000.0, 7, 1),
        job(1, 10.0, 500.0, 7, 2),
        Job {
            deadline: 50_000.0,
            ..job(2, 20.0, 100.0, 7, 1)
        },
    ];
    for (policy, slurm) in [
        ("none", None),
        ("on-demand", None),
        ("on-demand", Some(SlurmLike::default())),
    ] {
        let ran = run(2, &jobs, policy, slurm.clone());
        let start = |id: u64| first_start(&ran, policy, id);
        let slack = 2.0 * SimConfig::default().reconfig_time_s;
        assert!(
            start(2) <= 20.0 + slack + 1e-9,
            "{policy} {slurm:?}: the later job backfills the idle GPU: {:?}",
            ran.runs
        );
        assert!(
            (start(1) - 1000.0).abs() <= slack + 1e-9,
            "{policy} {slurm:?}: the gang job still starts when job 0 ends: {:?}",
            ran.runs
        );
    }
}

#[test]
fn a_waiting_job_that_cannot_start_before_the_gang_keeps_no_gpu_idle() {
    // Two whole GPUs. A runs on one until t = 1000; the gang job of two
    // arrives at 10 and is reserved both GPUs from t = 1000. L (5000 s,
    // the earliest deadline) ends too late to run before the gang job,
    // so it waits; S (100 s) ends in time and backfills the idle GPU at
    // once. Before the fix, L's own reservation took the idle GPU (where
    // it could not start) and kept S off it until the gang job had run:
    // the GPU idled with S waiting.
    let jobs = [
        job(0, 0.0, 1000.0, 7, 1),
        job(1, 10.0, 500.0, 7, 2),
        Job {
            deadline: 100.0,
            ..job(2, 20.0, 5000.0, 7, 1)
        },
        job(3, 30.0, 100.0, 7, 1),
    ];
    let slack = 2.0 * SimConfig::default().reconfig_time_s;
    for policy in ["on-demand", "greedy"] {
        let ran = run(2, &jobs, policy, None);
        let start = |id: u64| first_start(&ran, policy, id);
        assert!(
            start(3) <= 30.0 + slack + 1e-9,
            "{policy}: S backfills the idle GPU at once: {:?}",
            ran.runs
        );
        assert!(
            (start(1) - 1000.0).abs() <= slack + 1e-9,
            "{policy}: the gang job starts when A ends: {:?}",
            ran.runs
        );
        assert!(
            start(2) >= 1500.0 - 1e-9,
            "{policy}: L waits for the gang job: {:?}",
            ran.runs
        );
    }
}

#[test]
fn served_on_demand_a_freed_gpu_goes_to_the_first_job_in_priority_order() {
    // One GPU. A (whole) runs until t = 1000. W (whole, deadline 1510) and
    // s (3 slices, deadline 200) wait. As Slurm offers the freed GPU's
    // shards to the first job that fits them, s (the earlier deadline) is
    // served first, on an instance built for it, although an idle whole
    // instance would have let W start without a reconfiguration.
    let jobs = [
        job(0, 0.0, 1000.0, 7, 1),
        job(1, 10.0, 500.0, 7, 1),
        Job {
            deadline: 200.0,
            ..job(2, 20.0, 100.0, 3, 1)
        },
    ];
    let ran = run(1, &jobs, "on-demand", None);
    let run_of = |id: u64| {
        *pieces(&ran, id)
            .first()
            .unwrap_or_else(|| panic!("job {id} never ran: {:?}", ran.runs))
    };
    let slack = 2.0 * SimConfig::default().reconfig_time_s;
    let (_, s_start, s_end) = run_of(2);
    assert!(
        s_start <= 1000.0 + slack + 1e-9,
        "s is served when A ends: {:?}",
        ran.runs
    );
    assert!(
        run_of(1).1 >= s_end - 1e-9,
        "W waits for the GPU s holds: {:?}",
        ran.runs
    );
}
