//! The lower bounds are never above a feasible schedule:
//! (1) the best of an exhaustive scheduler on tiny one-GPU instances
//!     (`bound::exhaustive`, every order and every profile);
//! (2) the simulator, on small random clusters, with every catalog layout
//!     as a static policy, the greedy policy and every placement heuristic,
//!     with gang jobs (several whole GPUs at once) among the single ones.

use proptest::prelude::*;
use smartmig::bound::{self, exhaustive, BoundGpu};
use smartmig::mig::{Geometry, GpuModel};
use smartmig::policy::{Greedy, NoPartition, RepartitionPolicy, StaticLayout};
use smartmig::sim::{simulate, Heuristic, RunHooks, SimConfig};
use smartmig::workload::{Job, JobClass, PowerModel, SpeedupCurve};

const M: GpuModel = GpuModel::A100_40gb;

fn arb_job(id: u64) -> impl Strategy<Value = Job> {
    (
        0.0f64..600.0,
        10.0f64..900.0,
        0.3f64..=1.0,
        0.3f64..=1.0,
        1.0f64..39.0,
        1.0f64..2.0,
        prop_oneof![Just(None), (1u8..=7).prop_map(Some)],
        0.3f64..=1.0,
    )
        .prop_map(move |(arrival, work, beta, sat, mem, factor, req, _)| Job {
            id,
            arrival,
            work,
            speedup: SpeedupCurve::new(beta, sat).unwrap(),
            memory_gb: mem,
            deadline: arrival + factor * work,
            class: JobClass::Inference,
            requested_slices: req.and_then(|k| smartmig::workload::round_up_to_profile(M, k)),
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        })
}

fn arb_jobs(max: usize) -> impl Strategy<Value = Vec<Job>> {
    (1..=max).prop_flat_map(|n| {
        (0..n as u64)
            .map(arb_job)
            .collect::<Vec<_>>()
            .prop_map(|mut v| {
                v.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
                for (i, j) in v.iter_mut().enumerate() {
                    j.id = i as u64;
                }
                v
            })
    })
}

fn power(exp: f64) -> PowerModel {
    PowerModel {
        exponent: exp,
        ..PowerModel::default_for(M)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn bound_below_exhaustive_best(jobs in arb_jobs(4), horizon in 0.0f64..1500.0, exp in 0.3f64..=1.0) {
        let p = power(exp);
        let b = bound::compute(&jobs, &[BoundGpu { model: M, power: p }], horizon).unwrap();
        let best = exhaustive::search(&jobs, M, p, horizon).unwrap();
        let tol = 1e-9;
        prop_assert!(b.energy.total_j <= best.min_energy_j * (1.0 + tol), "{} > {}", b.energy.total_j, best.min_energy_j);
        prop_assert!(b.tardiness.total_s <= best.min_total_tardiness_s + 1e-6, "{} > {}", b.tardiness.total_s, best.min_total_tardiness_s);
        prop_assert!(b.tardiness.late_jobs <= best.min_late_jobs);
        // ET against an arbitrary reference.
        let (e_ref, t_ref) = (best.outcomes[0].energy_j, best.outcomes[0].total_tardiness_s / jobs.len() as f64);
        prop_assert!(b.et(e_ref, t_ref, 1.0) <= best.min_et(e_ref, t_ref, 1.0) + 1e-9);
    }

    #[test]
    fn bound_below_the_simulator(
        mut jobs in arb_jobs(12),
        gpus in 1usize..=3,
        exp in 0.3f64..=1.0,
        gang_every in prop::sample::select(vec![0usize, 2, 4]),
    ) {
        // Some jobs span two or more whole GPUs (gang jobs).
        if gang_every > 0 && gpus >= 2 {
            for j in jobs.iter_mut().filter(|j| j.id as usize % gang_every == 1) {
                j.gpus = gpus as u32;
                j.requested_slices = None;
            }
        }
        let cluster = vec![M; gpus];
        let p = power(exp);
        let cfg = SimConfig { power: vec![(M, p)], workload_horizon_s: Some(1000.0), ..SimConfig::default() };
        let bg: Vec<BoundGpu> = cluster.iter().map(|&model| BoundGpu { model, power: p }).collect();
        let b = bound::compute(&jobs, &bg, 1000.0).unwrap();
        let g = Geometry::of(M);
        let mut policies: Vec<Box<dyn RepartitionPolicy>> = vec![Box::new(NoPartition), Box::new(Greedy::default())];
        for i in 0..g.catalog().len() {
            policies.push(Box::new(StaticLayout::parse(&i.to_string(), &[M]).unwrap()));
        }
        let mut checked = 0usize;
        for policy in &mut policies {
            for h in Heuristic::ALL {
                let mut heur = h.build(1);
                let r = simulate(&cluster, &jobs, heur.as_mut(), policy.as_mut(), &cfg, RunHooks::default()).unwrap();
                if r.metrics.unserved > 0 || r.metrics.rejected > 0 {
                    continue; // the bound covers runs that run every job
                }
                prop_assert!(b.energy.total_j <= r.metrics.energy_j * (1.0 + 1e-9),
                    "{} {}: bound {} > {}", r.policy, h, b.energy.total_j, r.metrics.energy_j);
                prop_assert!(b.tardiness.total_s <= r.metrics.total_tardiness_s + 1e-6,
                    "{} {}: bound {} > {}", r.policy, h, b.tardiness.total_s, r.metrics.total_tardiness_s);
                prop_assert!(b.tardiness.late_jobs <= r.metrics.late_jobs);
                prop_assert!(b.energy.horizon_s <= r.metrics.horizon_s + 1e-9);
                checked += 1;
            }
        }
        // Every job fits the whole GPU, so at least the runs without
        // partitioning (one per heuristic) serve all and were checked.
        prop_assert!(checked >= Heuristic::ALL.len(), "only {checked} runs checked");
    }
}
