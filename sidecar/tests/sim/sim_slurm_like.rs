//! The simulator's Slurm-like mode (issue 42): Slurm places jobs by
//! counting shards, smartmigd builds their instances afterwards, and a job
//! that meets a slice MIG cannot build is requeued; smartmigd's holds keep
//! Slurm from offering stranded shards.

use smartmig::mig::{GpuModel, OfferPolicy, OfferRule};
use smartmig::policy::{parse_policy, NoPartition, RepartitionPolicy};
use smartmig::sim::{EpochRule, Metrics, Record, SimConfig, SlurmLike};
use smartmig::workload::Job;

use super::common::{audited, job};

fn cfg(slurm: Option<SlurmLike>) -> SimConfig {
    SimConfig {
        epoch: EpochRule::Events(5),
        slurm,
        ..SimConfig::default()
    }
}

/// The mode with holds under `rule`, lending off: these tests are about
/// stranded shards and requeues, which a lent instance would hide (an
/// idle 4g lent to a 3-shard job leaves no stranded 1g to test).
/// Lending has its own test below.
fn holds(rule: Option<OfferRule>) -> SlurmLike {
    SlurmLike {
        holds: rule.map(OfferPolicy::Fixed),
        lend: false,
        ..SlurmLike::default()
    }
}

/// Runs, audits the event log, returns the metrics.
fn run(
    gpus: &[GpuModel],
    jobs: &[Job],
    policy: &mut dyn RepartitionPolicy,
    cfg: &SimConfig,
) -> Metrics {
    let (r, log) = audited(gpus, jobs, policy, cfg);
    let report = smartmig::sim::audit(&log).unwrap_or_else(|e| panic!("audit: {e}"));
    assert!(r.metrics.energy_j > 0.0, "{:?}", r.metrics);
    // A comparison charges every run at the latest horizon of its runs:
    // the GPUs idle on, and the audit agrees (a run that reported no
    // energy there once made `bench suite --slurm-like` refuse its log).
    let later = r.metrics.horizon_s + 3600.0;
    let (a, m) = (report.at_horizon(later), r.metrics.at_horizon(later));
    assert!(
        (a.energy_j - m.energy_j).abs() <= 1e-6 * m.energy_j.max(1.0),
        "at the common horizon: audit {} J, run {} J",
        a.energy_j,
        m.energy_j
    );
    assert!(m.energy_j > r.metrics.energy_j, "{m:?}");
    r.metrics
}

fn greedy() -> Box<dyn RepartitionPolicy + Send> {
    parse_policy("greedy", &[GpuModel::A100_40gb]).expect("greedy")
}

/// Two long 3-shard jobs take GPU 0; a 1-shard job comes later. Slurm
/// puts it on GPU 0 (lowest index with a free shard), where MIG cannot
/// build a 1g next to two 3g instances: without holds it is requeued
/// until a 3g job ends, each time after Slurm's requeue hold; with holds
/// smartmigd holds the stranded shard and Slurm puts the job on GPU 1.
#[test]
fn a_stranded_shard_requeues_a_job_until_it_is_held() {
    let gpus = [GpuModel::A100_40gb; 2];
    let jobs = [
        job(0, 0.0, 1000.0, 3),
        job(1, 0.0, 1000.0, 3),
        job(2, 10.0, 10.0, 1),
    ];
    let before = run(&gpus, &jobs, &mut *greedy(), &cfg(Some(holds(None))));
    // Each try waits 30 s, then 121 s of hold and up to a 60 s pass: about
    // 4-5 tries before the 3g jobs end at 1004 s.
    assert!(before.requeues >= 4, "{before:?}");
    assert!(before.mean_wait_s > 200.0, "{before:?}");
    for rule in [OfferRule::NextJob, OfferRule::AnyMix] {
        let after = run(&gpus, &jobs, &mut *greedy(), &cfg(Some(holds(Some(rule)))));
        assert_eq!(after.requeues, 0, "{rule}: {after:?}");
        assert_eq!(after.completed, 3);
        assert!(after.held_slice_s > 900.0, "{rule}: {after:?}");
        // The 1-shard job starts on GPU 1 after the instance is made.
        assert!(after.p95_wait_s <= 2.0 * SimConfig::default().reconfig_time_s);
    }
}

/// Jobs placed by one scheduling pass cannot be held apart: 3, 3 and 1
/// shards arriving together on an empty GPU are all placed on it, and the
/// 1 waits for a 3g to end (requeued once here), under either rule.
#[test]
fn one_pass_can_still_strand_a_job() {
    let gpus = [GpuModel::A100_40gb];
    let jobs = [
        job(0, 0.0, 100.0, 3),
        job(1, 0.0, 100.0, 3),
        job(2, 0.0, 10.0, 1),
    ];
    for rule in [None, Some(OfferRule::NextJob)] {
        let m = run(&gpus, &jobs, &mut *greedy(), &cfg(Some(holds(rule))));
        assert_eq!(m.completed, 3);
        assert!(m.requeues >= 1, "{rule:?}: {m:?}");
    }
}

/// Whole GPUs and fixed layouts are served by Slurm's own GRES in a
/// deployment: they run in the central engine whatever the mode.
#[test]
fn slurms_own_gres_are_not_modelled_as_shards() {
    let gpus = [GpuModel::A100_40gb; 2];
    let jobs: Vec<Job> = (0..20)
        .map(|i| {
            job(
                i,
                i as f64 * 7.0,
                50.0 + i as f64,
                [1, 2, 3, 7][i as usize % 4],
            )
        })
        .collect();
    for spec in ["none", "static:4444|3333"] {
        let mut a: Box<dyn RepartitionPolicy> = if spec == "none" {
            Box::new(NoPartition)
        } else {
            parse_policy(spec, &[GpuModel::A100_40gb]).expect("policy")
        };
        let mut b: Box<dyn RepartitionPolicy> = if spec == "none" {
            Box::new(NoPartition)
        } else {
            parse_policy(spec, &[GpuModel::A100_40gb]).expect("policy")
        };
        let central = run(&gpus, &jobs, &mut *a, &cfg(None));
        let slurm = run(&gpus, &jobs, &mut *b, &cfg(Some(SlurmLike::default())));
        assert_eq!(central, slurm, "{spec}");
    }
}

/// A busy mix on a small cluster: every log audits, every job completes,
/// and holds cut the requeues.
#[test]
fn a_busy_mix_audits_and_holds_cut_requeues() {
    let gpus = [GpuModel::A100_40gb; 2];
    // 200 jobs of 1, 2, 3 and 7 shards, one every 20 s, 60-600 s long.
    let jobs: Vec<Job> = (0..200u64)
        .map(|i| {
            let k = [1, 2, 3, 1, 2, 3, 7, 1][(i * 7 % 8) as usize];
            job(i, i as f64 * 20.0, 60.0 + ((i * 37) % 540) as f64, k)
        })
        .collect();
    let mut out = Vec::new();
    for rule in [None, Some(OfferRule::NextJob), Some(OfferRule::AnyMix)] {
        let m = run(&gpus, &jobs, &mut *greedy(), &cfg(Some(holds(rule))));
        assert_eq!(m.completed, 200, "{rule:?}: {m:?}");
        out.push(m);
    }
    assert!(out[0].requeues > 0, "{:?}", out[0]);
    assert!(
        out[1].requeues * 2 < out[0].requeues,
        "next-job {} vs none {}",
        out[1].requeues,
        out[0].requeues
    );
    assert!(out[2].requeues <= out[1].requeues, "{:?}", out[2]);
    // Adaptive: next-job until jobs collide on a GPU, then any-mix there.
    let adaptive = SlurmLike {
        holds: Some(OfferPolicy::Adaptive),
        ..holds(None)
    };
    let m = run(&gpus, &jobs, &mut *greedy(), &cfg(Some(adaptive)));
    assert_eq!(m.completed, 200, "{m:?}");
    assert!(
        m.requeues <= out[1].requeues,
        "adaptive {} vs next-job {}",
        m.requeues,
        out[1].requeues
    );
}

/// A long 3-shard job runs on an A100; a 4-shard job comes next. Beside
/// `3g@4` a 4g fits, but `any-mix` offers only 3 shards (3 + 1 would not
/// fit), so the 4-shard job waits for the 3-shard one; `next-job`, and
/// `adaptive` with no collision on the GPU, offer 4 and start it at once.
#[test]
fn adaptive_holds_offer_the_room_a_single_job_fits_until_jobs_collide() {
    let gpus = [GpuModel::A100_40gb];
    let jobs = [job(0, 0.0, 1000.0, 3), job(1, 10.0, 100.0, 4)];
    let waits: Vec<f64> = [
        Some(OfferPolicy::Fixed(OfferRule::AnyMix)),
        Some(OfferPolicy::Fixed(OfferRule::NextJob)),
        Some(OfferPolicy::Adaptive),
    ]
    .into_iter()
    .map(|rule| {
        let c = cfg(Some(SlurmLike {
            holds: rule,
            ..holds(None)
        }));
        let m = run(
            &gpus,
            &jobs,
            &mut *parse_policy("on-demand", &gpus).expect("on-demand"),
            &c,
        );
        assert_eq!((m.completed, m.requeues), (2, 0), "{rule:?}: {m:?}");
        m.mean_wait_s
    })
    .collect();
    // any-mix: the 4-shard job waits about 1,000 s (half of it in the mean).
    assert!(waits[0] > 400.0, "{waits:?}");
    assert!(waits[1] < 60.0 && waits[2] < 60.0, "{waits:?}");
}

#[test]
fn the_mode_parses_its_options_and_refuses_bad_ones() {
    let s: SlurmLike = "holds=any-mix,allocate-wait=5,requeue-hold=6,sched-interval=2,hold-lag=0"
        .parse()
        .expect("parse");
    assert_eq!(s.holds, Some(OfferPolicy::Fixed(OfferRule::AnyMix)));
    let a: SlurmLike = "holds=adaptive".parse().expect("parse");
    assert_eq!(a.holds, Some(OfferPolicy::Adaptive));
    assert_eq!(SlurmLike::default().holds, Some(OfferPolicy::Adaptive));
    assert_eq!(
        (
            s.allocate_wait_s,
            s.requeue_hold_s,
            s.sched_interval_s,
            s.hold_lag_s
        ),
        (5.0, 6.0, 2.0, 0.0)
    );
    assert_eq!(s.to_string().parse::<SlurmLike>(), Ok(s));
    assert_eq!("".parse::<SlurmLike>(), Ok(SlurmLike::default()));
    for (bad, says) in [
        ("holds=most", "next-job"),
        ("wait=5", "unknown slurm-like option"),
        ("allocate-wait=-1", ">= 0"),
        ("sched-interval=0", "> 0"),
        ("pass=-1", "pass=-1: not a finite time >= 0"),
        ("pass=inf", "0: a pass after every event"),
        ("pass=soon", "pass=soon: not a number of seconds"),
        ("holds", "key=value"),
    ] {
        let e = bad.parse::<SlurmLike>().unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

/// Slurm's passes with `pass=S` (`S` > 0: event-triggered passes batched on
/// an `S`-second grid, as slurmctld's background thread does).
fn passes(rule: Option<OfferRule>, pass_s: f64) -> SimConfig {
    SimConfig {
        reconfig_time_s: 0.0,
        ..cfg(Some(SlurmLike {
            pass_s,
            ..holds(rule)
        }))
    }
}

/// When each job of the log started, by id.
fn starts(log: &[Record]) -> Vec<(u64, f64)> {
    let mut out: Vec<(u64, f64)> = log
        .iter()
        .filter_map(|r| match r {
            Record::Job(j) => Some((j.run.id, j.run.start)),
            _ => None,
        })
        .collect();
    out.sort_by_key(|&(id, _)| id);
    out
}

/// The mode's default batches passes as the packaged config does
/// (`batch_sched_delay` left at 3 s); `pass=0` is the model before.
#[test]
fn the_default_batches_passes_as_the_packaged_config() {
    assert_eq!(SlurmLike::default().pass_s, 3.0);
    let s: SlurmLike = "pass=0".parse().expect("parse");
    assert_eq!(s.pass_s, 0.0);
    assert_eq!(s.to_string().parse::<SlurmLike>(), Ok(s));
}

/// With batched passes, jobs submitted within one pass's window are all
/// started by that pass (together, at its time); with a pass after every
/// event each starts on arrival.
#[test]
fn a_burst_within_one_pass_is_started_together() {
    let gpus = [GpuModel::A100_40gb];
    let jobs = [
        job(0, 1.0, 50.0, 1),
        job(1, 2.0, 50.0, 2),
        job(2, 3.5, 50.0, 1),
    ];
    let (batched, log) = audited(&gpus, &jobs, &mut *greedy(), &passes(None, 5.0));
    assert_eq!(batched.metrics.completed, 3);
    assert_eq!(starts(&log), vec![(0, 5.0), (1, 5.0), (2, 5.0)]);
    let (each, log) = audited(&gpus, &jobs, &mut *greedy(), &passes(None, 0.0));
    assert_eq!(each.metrics.completed, 3);
    assert_eq!(starts(&log), vec![(0, 1.0), (1, 2.0), (2, 3.5)]);
    // A job submitted right on the grid is placed by that instant's pass.
    let on_grid = [job(0, 5.0, 50.0, 1)];
    let (_, log) = audited(&gpus, &on_grid, &mut *greedy(), &passes(None, 5.0));
    assert_eq!(starts(&log), vec![(0, 5.0)]);
}

/// The requeue that batching brings: 3, 3 and 1 shards submitted a second
/// or two apart on one A100. With a pass after every event and `any-mix`
/// holds, the first 3g's hold is in place before the second 3g is placed
/// (1 s later), so Slurm never offers the stranded shard and the 1-shard
/// job waits in Slurm's queue, unrequeued. With passes batched every 5 s
/// all three reach the empty GPU in one pass, where no rule holds anything:
/// the 1g cannot be built beside the two 3g and is requeued, holds or not.
/// Without holds it is requeued either way.
#[test]
fn a_burst_placed_by_one_pass_strands_what_holds_would_have_kept() {
    let gpus = [GpuModel::A100_40gb];
    let jobs = [
        job(0, 1.0, 100.0, 3),
        job(1, 2.5, 100.0, 3),
        job(2, 4.0, 10.0, 1),
    ];
    let m = |rule, pass_s| run(&gpus, &jobs, &mut *greedy(), &passes(rule, pass_s));
    let each_held = m(Some(OfferRule::AnyMix), 0.0);
    assert_eq!(each_held.requeues, 0, "{each_held:?}");
    assert!(each_held.held_slice_s > 0.0, "{each_held:?}");
    for rule in [None, Some(OfferRule::AnyMix)] {
        let batched = m(rule, 5.0);
        assert_eq!(batched.completed, 3, "{rule:?}: {batched:?}");
        assert_eq!(batched.requeues, 1, "{rule:?}: {batched:?}");
    }
    let each_unheld = m(None, 0.0);
    assert!(each_unheld.requeues >= 1, "{each_unheld:?}");
}

/// A job whose memory needs a memory variant (`shard:1` with 8 GB on an
/// A100-40GB: `1g.10gb`, two memory slices) is billed and built as the
/// default profile of its room (`2g.10gb`, two shards: issue 55). Billed
/// its one compute slice, as before, the holds' offer beside a busy 3g
/// (three shards, counted in default profiles) let Slurm put three such
/// jobs where MIG builds two, and the third was requeued; billed its
/// room, Slurm puts one beside the 3g and the others wait in its queue
/// or go to GPU 1.
#[test]
fn a_memory_variant_is_billed_the_room_it_takes() {
    let gpus = [GpuModel::A100_40gb; 2];
    let mut jobs = vec![Job {
        memory_gb: 15.0,
        ..job(0, 0.0, 2000.0, 3)
    }];
    // GPU 1 is busy with a whole-GPU job, so the small jobs meet GPU 0's
    // offer beside the 3g.
    jobs.push(job(1, 0.0, 2000.0, 7));
    for id in 2..5 {
        jobs.push(Job {
            memory_gb: 8.0,
            ..job(id, 60.0, 300.0, 1)
        });
    }
    let slurm = |bill: &str| {
        let spec: SlurmLike = format!("holds=any-mix,bill={bill}").parse().expect("spec");
        spec
    };
    let on_demand = || parse_policy("on-demand", &[GpuModel::A100_40gb]).expect("on-demand");
    let before = run(
        &gpus,
        &jobs,
        &mut *on_demand(),
        &cfg(Some(slurm("compute"))),
    );
    assert!(before.requeues >= 1, "{before:?}");
    let after = run(&gpus, &jobs, &mut *on_demand(), &cfg(Some(slurm("room"))));
    assert_eq!(after.requeues, 0, "{after:?}");
    assert_eq!(after.completed, jobs.len() as u64, "{after:?}");
    // The default is the product's rule (and its adaptive holds).
    let default = SlurmLike {
        holds: Some(OfferPolicy::Fixed(OfferRule::AnyMix)),
        ..SlurmLike::default()
    };
    assert_eq!(default, slurm("room"));
    assert_eq!(
        "bill=nonsense".parse::<SlurmLike>().unwrap_err(),
        "slurm-like bill=nonsense: use `room` (the product) or `compute` (before issue 55)"
    );
}

/// smartmigd's pass rule in the Slurm-like mode (issue 56, item 2): one
/// pass places 3, 3 and 1 shards on A100 GPU 1 (GPU 0 runs a 7g until
/// 20 s). With time limits (`time-limit=2`: twice each run time) the 3g
/// jobs run past the 30 s wait, so the 1g is refused at once, requeued
/// (a 1 s hold here), and starts on GPU 0 as soon as its 7g ends, the
/// two 3g built together. Without limits a neighbour might end within
/// the wait, so the first in Slurm's order is served as before (the 1g)
/// and one 3g waits its 30 s before it is requeued. One requeue either
/// way.
#[test]
fn a_pass_turned_away_is_requeued_at_once_when_time_limits_say_so() {
    let gpus = [GpuModel::A100_40gb; 2];
    let jobs = [
        job(0, 0.0, 20.0, 7),
        job(1, 1.0, 100.0, 3),
        job(2, 2.5, 100.0, 3),
        job(3, 4.0, 10.0, 1),
    ];
    let with = |time_limit: f64| {
        let mut c = passes(Some(OfferRule::AnyMix), 5.0);
        if let Some(s) = c.slurm.as_mut() {
            s.requeue_hold_s = 1.0;
            s.sched_interval_s = 1.0;
            s.time_limit = time_limit;
        }
        audited(&gpus, &jobs, &mut *greedy(), &c)
    };
    let (limits, log) = with(2.0);
    assert_eq!((limits.metrics.completed, limits.metrics.requeues), (4, 1));
    let at_once = starts(&log);
    assert_eq!(&at_once[1..3], &[(1, 5.0), (2, 5.0)], "{at_once:?}");
    let (none, log) = with(0.0);
    assert_eq!((none.metrics.completed, none.metrics.requeues), (4, 1));
    let waited = starts(&log);
    assert!(at_once[3].1 <= 21.0, "{at_once:?}");
    let last = waited[1..].iter().map(|s| s.1).fold(0.0, f64::max);
    assert!(last >= 35.0, "{waited:?}");
    let s: SlurmLike = "time-limit=2".parse().expect("parse");
    assert_eq!(s.to_string().parse::<SlurmLike>(), Ok(s));
    assert!("time-limit=0.5".parse::<SlurmLike>().is_err());
}

/// Lending (issue 55, smartmigd's `lend_idle`): job 0 (3 shards) leaves
/// its `3g.20gb` idle on GPU 0 beside a busy whole GPU 1; job 2 (2 shards)
/// then starts on that idle 3g at once, with no reconfiguration, where
/// `lend=off` re-shapes it into a `2g.10gb` (one more reconfiguration and
/// the build's delay). Without holds nothing is lent.
#[test]
fn an_idle_bigger_instance_is_lent_with_holds_instead_of_rebuilt() {
    let gpus = [GpuModel::A100_40gb; 2];
    let jobs = [
        job(0, 0.0, 100.0, 3),
        job(1, 0.0, 5000.0, 7),
        job(2, 500.0, 100.0, 2),
    ];
    let with = |spec: &str| {
        let slurm: SlurmLike = spec.parse().expect("spec");
        let mut on_demand = parse_policy("on-demand", &[GpuModel::A100_40gb]).expect("on-demand");
        run(&gpus, &jobs, &mut *on_demand, &cfg(Some(slurm)))
    };
    let lent = with("holds=any-mix");
    let built = with("holds=any-mix,lend=off");
    let no_holds = with("holds=off");
    for m in [&lent, &built, &no_holds] {
        assert_eq!((m.completed, m.requeues), (3, 0), "{m:?}");
    }
    assert_eq!(
        built.reconfigurations,
        lent.reconfigurations + 1,
        "lent {lent:?}\nbuilt {built:?}"
    );
    assert_eq!(no_holds.reconfigurations, built.reconfigurations);
    assert!(SlurmLike::default().lend);
    assert_eq!(
        "lend=maybe".parse::<SlurmLike>().unwrap_err(),
        "slurm-like lend=maybe: use `on` (the product: an idle bigger instance before a build) or `off` (exact rooms only)"
    );
}
