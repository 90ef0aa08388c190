//! The out-of-memory mode of the simulator: a hand-computed restart, bounded
//! retries, and (proptest) audited, deterministic logs with OOM restarts.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use smartmig::mig::GpuModel;
use smartmig::policy::{parse_policy, ClusterView, Decision, RepartitionPolicy};
use smartmig::sim::events::Record;
use smartmig::sim::{
    audit, read_events, simulate, Collect, EpochRule, Heuristic, JsonLines, OomConfig, RunHooks,
    SimConfig,
};
use smartmig::workload::{EstimatorConfig, Job, JobClass, PowerModel, SpeedupCurve};

const M: GpuModel = GpuModel::A100_40gb;

fn job(id: u64, arrival: f64, need: f64, declared: Option<f64>) -> Job {
    Job {
        id,
        arrival,
        work: 100.0,
        speedup: SpeedupCurve::new(1.0, 1.0).unwrap(),
        memory_gb: need,
        deadline: arrival + 1000.0,
        class: JobClass::Training,
        requested_slices: None,
        declared_memory_gb: declared,
        template: Some(0),
    }
}

fn cfg(retries: u32, estimate: bool) -> SimConfig {
    SimConfig {
        oom: Some(OomConfig {
            fail_fraction: 0.3,
            max_retries: retries,
            estimate: estimate.then(EstimatorConfig::default),
        }),
        ..SimConfig::default()
    }
}

fn run(jobs: &[Job], policy: &str, cfg: &SimConfig) -> (smartmig::sim::Metrics, Vec<Record>) {
    let mut sink = Collect::default();
    let mut p = parse_policy(policy, &[M]).unwrap();
    let mut h = Heuristic::Edf.build(0);
    let r = simulate(
        &[M],
        jobs,
        h.as_mut(),
        p.as_mut(),
        cfg,
        RunHooks {
            sink: Some(&mut sink),
            progress: None,
        },
    )
    .unwrap();
    (r.metrics, sink.0)
}

/// 1 A100-40GB with 4g.20gb, 2g.10gb, 1g.5gb; one linear job (work 100 s)
/// needing 8 GB but declaring 5. EDF's best fit puts it on 1g.5gb (run time
/// 700 s); it fails at 0.3 x 700 = 210 s, is requeued for 10 GB and runs on
/// 2g.10gb for 350 s: end 560 s. Energy: 210 s at load 1/7, 350 s at 2/7.
#[test]
fn hand_computed_restart() {
    let jobs = [job(0, 0.0, 8.0, Some(5.0))];
    let (m, recs) = run(&jobs, "static:4444|22|1|.", &cfg(3, false));
    assert_eq!(m.completed, 1);
    assert_eq!(m.oom_failures, 1);
    assert_eq!(m.rejected + m.unserved, 0);
    assert!((m.last_completion_s - 560.0).abs() < 1e-9);
    assert!((m.horizon_s - 560.0).abs() < 1e-9);
    // The documented A100 model (idle 50 W, max 400 W, exponent 0.7),
    // P(l) = 50 + 350 l^0.7, by hand:
    //   (1/7)^0.7 = 0.256113 -> P = 139.6395 W; x 210 s = 29,324.29 J
    //   (2/7)^0.7 = 0.416057 -> P = 195.6198 W; x 350 s = 68,466.93 J
    //   total 97,791.22 J.
    let e = 97_791.22;
    assert!((m.energy_j - e).abs() < 0.01, "{} vs {e}", m.energy_j);
    assert!((m.oom_lost_gpu_s - 30.0).abs() < 1e-9); // 1/7 x 210 s
    assert!((m.mean_wait_s - 210.0).abs() < 1e-9); // the final start
    let oom: Vec<_> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Oom(o) => Some(o),
            _ => None,
        })
        .collect();
    assert_eq!(oom.len(), 1);
    assert_eq!(oom[0].run.profile, "1g.5gb");
    assert_eq!((oom[0].run.start, oom[0].attempt), (0.0, 1));
    assert!((oom[0].fail - 210.0).abs() < 1e-9);
    let ran = recs
        .iter()
        .find_map(|r| match r {
            Record::Job(j) => Some(j),
            _ => None,
        })
        .unwrap();
    assert_eq!(ran.run.profile, "2g.10gb");
    assert!((ran.run.start - 210.0).abs() < 1e-9 && (ran.end - 560.0).abs() < 1e-9);
    let rep = audit(&recs).unwrap();
    assert_eq!(rep.oom_failures, 1);
    assert!((rep.energy_j - e).abs() < 0.01);

    // Without the OOM mode the true need is known: straight to 2g.10gb.
    let (m0, _) = run(&jobs, "static:4444|22|1|.", &SimConfig::default());
    assert_eq!(m0.oom_failures, 0);
    assert!((m0.last_completion_s - 350.0).abs() < 1e-9);
}

/// A job needing 30 GB on a GPU without a 40 GB instance fails on 5, 10 and
/// 20 GB; with 1 restart allowed it is rejected after the second failure.
#[test]
fn retries_are_bounded() {
    let jobs = [job(0, 0.0, 30.0, Some(5.0))];
    let (m, recs) = run(&jobs, "static:4444|22|1|.", &cfg(1, false));
    assert_eq!(
        (m.completed, m.oom_failures, m.rejected, m.oom_rejected),
        (0, 2, 1, 1)
    );
    let reason = recs
        .iter()
        .find_map(|r| match r {
            Record::Unserved(u) => Some(u.reason.clone()),
            _ => None,
        })
        .unwrap();
    assert!(reason.contains("out of memory 2 times"), "{reason}");
    audit(&recs).unwrap();
    // With 0 restarts the first failure rejects it.
    let (m, _) = run(&jobs, "static:4444|22|1|.", &cfg(0, false));
    assert_eq!((m.oom_failures, m.oom_rejected), (1, 1));
}

/// Estimates: the first job of a template that declares nothing fails on
/// the smallest instance; once one has completed, the next one asks for
/// the learned need (+10 %) and does not fail.
#[test]
fn estimates_avoid_repeat_failures() {
    let jobs: Vec<Job> = (0..4)
        .map(|i| job(i, 1000.0 * i as f64, 8.0, Some(0.0)))
        .collect();
    let (without, _) = run(&jobs, "static:4444|22|1|.", &cfg(3, false));
    let (with, recs) = run(&jobs, "static:4444|22|1|.", &cfg(3, true));
    assert_eq!(without.oom_failures, 4);
    assert_eq!(with.oom_failures, 1);
    assert_eq!(with.completed, 4);
    assert!(with.energy_j < without.energy_j);
    audit(&recs).unwrap();
}

/// A log whose failed run does not match the fail fraction is refused.
#[test]
fn audit_catches_a_wrong_failure_time() {
    let jobs = [job(0, 0.0, 8.0, Some(5.0))];
    let (_, mut recs) = run(&jobs, "static:4444|22|1|.", &cfg(3, false));
    for r in &mut recs {
        if let Record::Oom(o) = r {
            o.fail += 1.0;
        }
    }
    assert!(audit(&recs).is_err());
    let (_, mut recs) = run(&jobs, "static:4444|22|1|.", &cfg(3, false));
    for r in &mut recs {
        if let Record::Header(h) = r {
            h.oom = None;
        }
    }
    assert!(audit(&recs).is_err());
}

/// Random valid repartitioning, as in `sim_props.rs`.
struct RandomValid(ChaCha8Rng);

impl RepartitionPolicy for RandomValid {
    fn name(&self) -> String {
        "random-valid".into()
    }
    fn decide(&mut self, v: &ClusterView<'_>) -> Vec<Decision> {
        let mut out = Vec::new();
        for (gpu, s) in v.gpus.iter().enumerate() {
            if s.in_reconfiguration || !self.0.random_bool(0.5) {
                continue;
            }
            let options: Vec<_> = s.geometry.reachable(s.busy, s.geometry.layouts()).collect();
            let target = options[self.0.random_range(0..options.len())];
            out.push(Decision { gpu, target });
        }
        out
    }
}

fn jobs_strategy() -> impl Strategy<Value = Vec<Job>> {
    prop::collection::vec(
        (
            0.0f64..500.0,
            1.0f64..200.0,
            0.3f64..=1.0,
            0.5f64..40.0,
            prop::option::of(prop::sample::select(vec![0.0, 5.0, 10.0, 20.0])),
            0u32..3,
            prop::option::of(prop::sample::select(vec![1u8, 2, 3])),
        ),
        1..25,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (arrival, work, beta, mem, declared, t, k))| Job {
                id: i as u64,
                arrival: arrival.floor(),
                work,
                speedup: SpeedupCurve::new(beta, 1.0).unwrap(),
                memory_gb: mem,
                deadline: arrival.floor() + 1.5 * work,
                class: JobClass::Training,
                requested_slices: k,
                declared_memory_gb: declared,
                template: Some(t),
            })
            .collect()
    })
}

fn run_bytes(
    cluster: &[GpuModel],
    jobs: &[Job],
    h: Heuristic,
    seed: u64,
    cfg: &SimConfig,
) -> (smartmig::sim::Metrics, Vec<u8>) {
    let mut sink = JsonLines::new(Vec::new());
    let mut heur = h.build(seed);
    let mut policy = RandomValid(ChaCha8Rng::seed_from_u64(seed));
    let r = simulate(
        cluster,
        jobs,
        heur.as_mut(),
        &mut policy,
        cfg,
        RunHooks {
            sink: Some(&mut sink),
            progress: None,
        },
    )
    .unwrap();
    (r.metrics, sink.into_inner())
}

/// A saturating curve (beta 0.5, saturation 0.5) and the documented A100
/// power model, with numbers by hand. Layout 4g.20gb + 2g.10gb + 1g.5gb;
/// two jobs of work 100 s at time 0: A needs 4 GB (best fit 1g.5gb), B
/// needs 15 GB (only the 4g.20gb has room).
/// - A on 1g: f = 1/7 < 0.5, speed (0.142857 / 0.5)^0.5 = 0.534522, so it
///   runs 100 / 0.534522 = 187.0829 s.
/// - B on 4g: f = 4/7 >= 0.5, saturated: speed 1, runs 100 s.
/// - Energy, P(l) = 50 + 350 l^0.7: [0, 100] load 5/7, (5/7)^0.7 = 0.790151,
///   P = 326.5530 W -> 32,655.30 J; [100, 187.0829] load 1/7, P = 139.6395 W
///   -> 87.0829 x 139.6395 = 12,160.21 J; total 44,815.51 J.
#[test]
fn saturating_curve_by_hand() {
    let curve = SpeedupCurve::new(0.5, 0.5).unwrap();
    let jobs: Vec<Job> = [(0, 4.0), (1, 15.0)]
        .into_iter()
        .map(|(id, mem)| Job {
            speedup: curve,
            ..job(id, 0.0, mem, None)
        })
        .collect();
    assert_eq!(PowerModel::default_for(M).exponent, 0.7);
    let (m, recs) = run(&jobs, "static:4444|22|1|.", &SimConfig::default());
    assert_eq!((m.completed, m.rejected + m.unserved), (2, 0));
    let mut ran: Vec<(u64, String, f64, f64)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Job(j) => Some((j.run.id, j.run.profile.clone(), j.run.start, j.end)),
            _ => None,
        })
        .collect();
    ran.sort_by_key(|r| r.0);
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert_eq!(
        (ran[0].1.as_str(), ran[1].1.as_str()),
        ("1g.5gb", "4g.20gb")
    );
    assert!((ran[0].3 - 187.0829).abs() < 1e-3, "{ran:?}");
    assert!((ran[1].3 - 100.0).abs() < 1e-9, "{ran:?}");
    assert!((m.energy_j - 44_815.51).abs() < 0.05, "{}", m.energy_j);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// With OOM restarts the log passes the audit (no double-booked
    /// instance, energy and tardiness recomputed), retries stay bounded,
    /// every job is accounted for, and runs are byte-for-byte deterministic.
    #[test]
    fn oom_logs_pass_the_audit(
        jobs in jobs_strategy(),
        h in prop::sample::select(Heuristic::ALL.to_vec()),
        gpus in prop::sample::select(vec![
            vec![GpuModel::A100_40gb],
            vec![GpuModel::A100_40gb, GpuModel::A100_40gb],
            vec![GpuModel::A100_40gb, GpuModel::H100_80gb],
        ]),
        seed in any::<u64>(),
        f in prop::sample::select(vec![0.1, 0.3, 1.0]),
        retries in 0u32..4,
        estimate in any::<bool>(),
    ) {
        let cfg = SimConfig {
            epoch: EpochRule::Events(2),
            seed,
            oom: Some(OomConfig {
                fail_fraction: f,
                max_retries: retries,
                estimate: estimate.then(EstimatorConfig::default),
            }),
            ..SimConfig::default()
        };
        let (m, bytes) = run_bytes(&gpus, &jobs, h, seed, &cfg);
        let recs = read_events(&bytes[..]).unwrap();
        let report = audit(&recs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!((report.energy_j - m.energy_j).abs() <= 1e-9 * m.energy_j.max(1.0));
        prop_assert_eq!(report.oom_failures, m.oom_failures);
        prop_assert_eq!(report.jobs, m.completed);
        prop_assert_eq!(m.completed + m.unserved + m.rejected, jobs.len() as u64);
        prop_assert!(m.oom_failures <= jobs.len() as u64 * u64::from(retries + 1));
        let mut per_job = std::collections::HashMap::new();
        for r in &recs {
            if let Record::Oom(o) = r {
                *per_job.entry(o.run.id).or_insert(0u32) += 1;
            }
        }
        prop_assert!(per_job.values().all(|&n| n <= retries + 1));
        let (_, again) = run_bytes(&gpus, &jobs, h, seed, &cfg);
        prop_assert!(bytes == again);
    }
}
