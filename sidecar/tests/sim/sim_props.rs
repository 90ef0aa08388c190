//! Property tests: every run's event log passes the audit, no reconfiguration
//! destroys a busy instance, energy recomputed from the log equals the
//! simulator's, and runs are deterministic.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use smartmig::mig::GpuModel;
use smartmig::policy::{ClusterView, Decision, RepartitionPolicy};
use smartmig::sim::{audit, simulate, EpochRule, Heuristic, JsonLines, RunHooks, SimConfig};
use smartmig::workload::{Job, JobClass, SpeedupCurve};

/// Random *valid* decisions: for random GPUs not being reconfigured, a
/// random valid layout that keeps every busy instance (also used by
/// `sim_oom`).
pub(crate) struct RandomValid(pub(crate) ChaCha8Rng);

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
            0.3f64..=1.0,
            0.5f64..30.0,
            1.0f64..2.0,
            prop::option::of(prop::sample::select(vec![1u8, 2, 3, 4, 7])),
            // Now and then a gang job of two or three whole GPUs.
            prop::sample::select(vec![1u32, 1, 1, 1, 1, 1, 2, 3]),
        ),
        1..25,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (arrival, work, beta, sat, mem, f, k, gpus))| Job {
                id: i as u64,
                arrival: arrival.floor(), // collisions exercise simultaneous events
                work,
                speedup: SpeedupCurve::new(beta, sat).unwrap(),
                memory_gb: mem,
                deadline: arrival.floor() + f * work,
                class: JobClass::Inference,
                // A gang job asks for whole GPUs, whatever their model.
                requested_slices: if gpus > 1 { None } else { k },
                declared_memory_gb: None,
                template: None,
                memory_growth: None,
                gpus,
            })
            .collect()
    })
}

/// One simulation under [`RandomValid`], with its event log (also used by
/// `sim_oom`).
pub(crate) fn run_to_bytes(
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn logs_pass_the_audit_and_energy_matches(
        jobs in jobs_strategy(),
        h in prop::sample::select(Heuristic::ALL.to_vec()),
        gpus in prop::sample::select(vec![
            vec![GpuModel::A100_40gb],
            vec![GpuModel::A100_40gb, GpuModel::A100_40gb],
            vec![GpuModel::A100_40gb, GpuModel::A30_24gb],
            vec![GpuModel::H100_80gb, GpuModel::A30_24gb, GpuModel::A100_40gb],
        ]),
        seed in any::<u64>(),
        by_time in any::<bool>(),
        rt in prop::sample::select(vec![0.0, 4.0, 30.0]),
        extra_s in prop::sample::select(vec![0.0, 1.0, 3600.0]),
    ) {
        let cfg = SimConfig {
            reconfig_time_s: rt,
            epoch: if by_time { EpochRule::Seconds(7.0) } else { EpochRule::Events(2) },
            seed,
            ..SimConfig::default()
        };
        let (m, bytes) = run_to_bytes(&gpus, &jobs, h, seed, &cfg);
        let recs = smartmig::sim::read_events(&bytes[..]).unwrap();
        let report = audit(&recs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(m.rejected_decisions, 0);
        prop_assert!((report.energy_j - m.energy_j).abs() <= 1e-9 * m.energy_j.max(1.0),
            "audit {} vs sim {}", report.energy_j, m.energy_j);
        prop_assert!((report.total_tardiness_s - m.total_tardiness_s).abs() <= 1e-9 * m.total_tardiness_s.max(1.0));
        prop_assert_eq!(report.late_jobs, m.late_jobs);
        prop_assert_eq!(report.unserved, m.unserved + m.rejected);
        prop_assert_eq!(report.jobs, m.completed);
        // Charged at a later, common horizon (a comparison's), the audit's
        // own recomputation of the rule agrees with the simulator's.
        let later = m.horizon_s + extra_s;
        let (a, b) = (report.at_horizon(later), m.at_horizon(later));
        prop_assert!((a.energy_j - b.energy_j).abs() <= 1e-9 * b.energy_j.max(1.0),
            "at {} s: audit {} vs sim {}", later, a.energy_j, b.energy_j);
        prop_assert!((a.total_tardiness_s - b.total_tardiness_s).abs() <= 1e-9 * b.total_tardiness_s.max(1.0));
        prop_assert_eq!(a.late_jobs, b.late_jobs);
        prop_assert!((a.unserved_energy_j - b.unserved_energy_j).abs() <= 1e-9 * b.unserved_energy_j.max(1.0));
        prop_assert_eq!(report.reconfigurations, m.reconfigurations);
        // The kinds partition the reconfigurations, and the audit, reading
        // them off the instances, finds what the simulator counted.
        prop_assert_eq!(m.fusions + m.fissions + m.reshapes, m.reconfigurations);
        prop_assert_eq!(
            (report.kinds.fusions, report.kinds.fissions, report.kinds.reshapes),
            (m.fusions, m.fissions, m.reshapes)
        );
        prop_assert_eq!(
            (report.kinds.jobs_served_by_fusion, report.kinds.jobs_served_by_fission),
            (m.jobs_served_by_fusion, m.jobs_served_by_fission)
        );
        prop_assert_eq!(m.completed + m.unserved + m.rejected, jobs.len() as u64);

        // Determinism: same inputs, byte-identical log.
        let (_, again) = run_to_bytes(&gpus, &jobs, h, seed, &cfg);
        prop_assert!(bytes == again);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Served on demand (the policies smartmig runs), in both engines, with
    /// gang jobs among the single ones: every log passes the audit and
    /// every job is counted once.
    #[test]
    fn served_on_demand_logs_pass_the_audit(
        jobs in jobs_strategy(),
        policy in prop::sample::select(vec!["greedy", "on-demand"]),
        gpus in prop::sample::select(vec![
            vec![GpuModel::A100_40gb, GpuModel::A100_40gb],
            vec![GpuModel::A100_40gb, GpuModel::A100_40gb, GpuModel::A100_40gb],
            vec![GpuModel::H100_80gb, GpuModel::A30_24gb, GpuModel::A100_40gb],
        ]),
        slurm_like in any::<bool>(),
    ) {
        let cfg = SimConfig {
            reconfig_time_s: 4.0,
            epoch: EpochRule::Events(2),
            slurm: slurm_like.then(smartmig::sim::SlurmLike::default),
            ..SimConfig::default()
        };
        let mut p = smartmig::policy::parse_policy(policy, &gpus).unwrap();
        let mut heur = Heuristic::Edf.build(0);
        let mut sink = JsonLines::new(Vec::new());
        let r = simulate(&gpus, &jobs, heur.as_mut(), p.as_mut(), &cfg, RunHooks {
            sink: Some(&mut sink),
            progress: None,
        }).unwrap();
        let bytes = sink.into_inner();
        let recs = smartmig::sim::read_events(&bytes[..]).unwrap();
        let report = audit(&recs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let m = r.metrics;
        prop_assert!((report.energy_j - m.energy_j).abs() <= 1e-9 * m.energy_j.max(1.0),
            "audit {} vs sim {}", report.energy_j, m.energy_j);
        prop_assert_eq!(report.jobs, m.completed);
        prop_assert_eq!(report.unserved, m.unserved + m.rejected);
        prop_assert_eq!(m.completed + m.unserved + m.rejected, jobs.len() as u64);
    }
}

/// A policy that asks for impossible things is refused and counted, and the
/// log still passes the audit.
struct Vandal;
impl RepartitionPolicy for Vandal {
    fn name(&self) -> String {
        "vandal".into()
    }
    fn decide(&mut self, v: &ClusterView<'_>) -> Vec<Decision> {
        let g = v.gpus[0].geometry;
        vec![
            Decision {
                gpu: 0,
                target: g.layouts()[1],
            },
            Decision {
                gpu: 99,
                target: g.whole_gpu(),
            },
            Decision {
                gpu: 0,
                target: smartmig::mig::Layout(u32::MAX),
            },
        ]
    }
}

#[test]
fn invalid_decisions_are_rejected_and_counted() {
    let jobs: Vec<Job> = (0..10)
        .map(|i| Job {
            id: i,
            arrival: i as f64,
            work: 50.0,
            speedup: SpeedupCurve::linear(),
            memory_gb: 1.0,
            deadline: 1000.0,
            class: JobClass::Training,
            requested_slices: None,
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        })
        .collect();
    let mut sink = smartmig::sim::Collect::default();
    let mut h = Heuristic::Edf.build(0);
    let cfg = SimConfig {
        epoch: EpochRule::Events(1),
        ..SimConfig::default()
    };
    let r = simulate(
        &[GpuModel::A100_40gb],
        &jobs,
        h.as_mut(),
        &mut Vandal,
        &cfg,
        RunHooks {
            sink: Some(&mut sink),
            progress: None,
        },
    )
    .unwrap();
    assert!(r.metrics.rejected_decisions >= 2);
    audit(&sink.0).unwrap();
    assert_eq!(r.metrics.completed, 10);
}
