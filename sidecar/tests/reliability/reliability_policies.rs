//! Busy-instance safety over every built-in repartitioning policy (issue 8).
//!
//! On random small diurnal workloads (1-3 A100-40GB, a few hours), each of
//! `none`, `static:<random catalog index>`, `greedy`, the shipped learned
//! policy (`policy:<repo>/policies/a100-40gb.onnx`), `static-best` and
//! `twice-daily` (through the search API, where *every* candidate the
//! searches evaluate is checked too) runs in the real simulator, and:
//!
//! - no decision is rejected (a rejected decision is a policy trying to
//!   destroy a busy instance, to reconfigure a GPU that is already being
//!   reconfigured or to set an invalid layout);
//! - `sim::audit` passes on the run's event log (it re-checks from the log
//!   alone that no instance was destroyed while it ran a job, and the energy);
//! - every job is accounted for.
//!
//! The learned policy needs ONNX Runtime (`scripts/fetch-onnxruntime`, or
//! `ORT_DYLIB_PATH`): without it the test FAILS with the loader's message.

use std::path::PathBuf;

use proptest::prelude::*;
use smartmig::mig::{Geometry, GpuModel};
use smartmig::policy::parse_policy;
use smartmig::policy::search::{static_best, twice_daily, SearchConfig};
use smartmig::policy::{ClusterView, Decision, RepartitionPolicy};
use smartmig::sim::{audit, simulate, Collect, EpochRule, Heuristic, RunHooks, SimConfig};
use smartmig::workload::{generate_diurnal, DiurnalConfig, Job};

const MODEL: GpuModel = GpuModel::A100_40gb;

fn learned_policy_spec() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .join("policies/a100-40gb.onnx");
    assert!(
        path.is_file(),
        "shipped policy {} is missing from the checkout",
        path.display()
    );
    format!("policy:{}", path.display())
}

/// Runs one policy; checks rejected == 0, the audit and the job count.
/// Returns a score (energy + tardiness) for the searches.
fn run_checked(
    what: &str,
    cluster: &[GpuModel],
    jobs: &[Job],
    heuristic: Heuristic,
    cfg: &SimConfig,
    policy: &mut dyn RepartitionPolicy,
) -> Result<f64, String> {
    run_counted(what, cluster, jobs, heuristic, cfg, policy).map(|(score, _)| score)
}

/// [`run_checked`], also returning the number of reconfigurations.
fn run_counted(
    what: &str,
    cluster: &[GpuModel],
    jobs: &[Job],
    heuristic: Heuristic,
    cfg: &SimConfig,
    policy: &mut dyn RepartitionPolicy,
) -> Result<(f64, u64), String> {
    let mut sink = Collect::default();
    let mut heur = heuristic.build(cfg.seed);
    let name = policy.name();
    let r = simulate(
        cluster,
        jobs,
        heur.as_mut(),
        policy,
        cfg,
        RunHooks {
            sink: Some(&mut sink),
            progress: None,
        },
    )
    .map_err(|e| format!("{what} ({name}): simulate failed: {e}"))?;
    let m = &r.metrics;
    if m.rejected_decisions != 0 {
        return Err(format!(
            "{what} ({name}): {} rejected decision(s) (a policy tried to touch a busy \
             instance or a GPU in reconfiguration), {} jobs, heuristic {heuristic:?}",
            m.rejected_decisions,
            jobs.len()
        ));
    }
    let report = audit(&sink.0).map_err(|e| format!("{what} ({name}): audit failed: {e}"))?;
    if report.jobs != m.completed || report.reconfigurations != m.reconfigurations {
        return Err(format!(
            "{what} ({name}): audit saw {} jobs / {} reconfigurations, sim {} / {}",
            report.jobs, report.reconfigurations, m.completed, m.reconfigurations
        ));
    }
    if m.completed + m.unserved + m.rejected != jobs.len() as u64 {
        return Err(format!(
            "{what} ({name}): {} completed + {} unserved + {} rejected != {} jobs",
            m.completed,
            m.unserved,
            m.rejected,
            jobs.len()
        ));
    }
    Ok((m.energy_j + m.total_tardiness_s, m.reconfigurations))
}

/// Every built-in policy on one workload; returns the number of checked runs.
fn check_all_policies(
    cluster: &[GpuModel],
    jobs: &[Job],
    heuristic: Heuristic,
    cfg: &SimConfig,
    static_index: usize,
) -> Result<usize, String> {
    let mut runs = 0;
    let learned = learned_policy_spec();
    for spec in [
        "none".to_string(),
        format!("static:{static_index}"),
        "greedy".to_string(),
        learned,
    ] {
        let mut policy = parse_policy(&spec, cluster)
            .unwrap_or_else(|e| panic!("policy `{spec}` did not load: {e}"));
        run_checked(&spec, cluster, jobs, heuristic, cfg, policy.as_mut())?;
        runs += 1;
    }
    // static-best and twice-daily: each evaluated candidate is checked.
    let search = SearchConfig {
        top: 3,
        mix_budget: 8,
        pair_top: 3,
        mixes: 2,
        ..SearchConfig::default()
    };
    let mut evaluate = |p: &mut dyn RepartitionPolicy| {
        runs += 1;
        run_checked("search candidate", cluster, jobs, heuristic, cfg, p)
            .map(|score| smartmig::sim::Standing::new(0, score))
    };
    let statics = static_best(cluster, &search, &mut evaluate)?;
    let days = twice_daily(cluster, &search, &statics, cfg.start_hour, &mut evaluate)?;
    let mut best = statics.policy.clone();
    run_checked("static-best", cluster, jobs, heuristic, cfg, &mut best)?;
    let mut td = days.policy.clone();
    run_checked("twice-daily", cluster, jobs, heuristic, cfg, &mut td)?;
    Ok(runs + 2)
}

/// A policy that asks, whenever a GPU has a busy instance, for a layout that
/// would destroy it: the checker must catch it (the audit is not vacuous).
struct Reckless;

impl RepartitionPolicy for Reckless {
    fn name(&self) -> String {
        "reckless".into()
    }
    fn decide(&mut self, v: &ClusterView<'_>) -> Vec<Decision> {
        let mut out = Vec::new();
        for (gpu, s) in v.gpus.iter().enumerate() {
            if s.in_reconfiguration || s.busy.is_empty() {
                continue;
            }
            if let Some(&target) = s.geometry.layouts().iter().find(|&&l| !s.accepts(l)) {
                out.push(Decision { gpu, target });
            }
        }
        out
    }
}

#[test]
fn the_checker_catches_a_policy_that_touches_busy_instances() {
    let jobs = workload(2, 6.0, 9.0, 10.0, 7);
    assert!(!jobs.is_empty());
    let cfg = SimConfig {
        epoch: EpochRule::Events(1),
        workload_horizon_s: Some(6.0 * 3600.0),
        start_hour: 9.0,
        ..SimConfig::default()
    };
    let err = run_checked(
        "reckless",
        &[MODEL; 2],
        &jobs,
        Heuristic::Edf,
        &cfg,
        &mut Reckless,
    )
    .expect_err("a policy that tries to destroy busy instances must be caught");
    assert!(err.contains("rejected decision"), "{err}");
}

/// The dynamic policies do reconfigure on a busy day (so the audit above
/// covers real repartitioning, not only fixed layouts).
#[test]
fn dynamic_policies_reconfigure_and_stay_safe() {
    let jobs = workload(3, 8.0, 8.0, 12.0, 11);
    let cluster = [MODEL; 3];
    let cfg = SimConfig {
        epoch: EpochRule::Seconds(60.0),
        workload_horizon_s: Some(8.0 * 3600.0),
        start_hour: 8.0,
        ..SimConfig::default()
    };
    for spec in ["greedy".to_string(), learned_policy_spec()] {
        let mut p = parse_policy(&spec, &cluster)
            .unwrap_or_else(|e| panic!("policy `{spec}` did not load: {e}"));
        let (_, reconfigs) = run_counted(&spec, &cluster, &jobs, Heuristic::Edf, &cfg, p.as_mut())
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{spec}: {reconfigs} reconfigurations, {} jobs", jobs.len());
        assert!(
            reconfigs > 0,
            "{spec} never reconfigured on {} jobs",
            jobs.len()
        );
    }
}

fn workload(gpus: usize, hours: f64, start_hour: f64, rate: f64, seed: u64) -> Vec<Job> {
    let cfg = DiurnalConfig {
        horizon_s: hours * 3600.0,
        start_hour,
        base_rate: rate / 3.0,
        peak_rate: rate,
        // Keep single runs short: the tail of the log-normal is clamped.
        max_work_s: 4.0 * 3600.0,
        ..DiurnalConfig::default()
    };
    cfg.validate().expect("diurnal config");
    generate_diurnal(&cfg, MODEL, gpus, seed)
}

#[test]
fn learned_policy_loads_or_the_test_fails() {
    // Outside the property test so that a missing ONNX Runtime gives one
    // clear failure (the loader's message says what to run).
    let spec = learned_policy_spec();
    if let Err(e) = parse_policy(&spec, &[MODEL]) {
        panic!(
            "the shipped learned policy must load for the busy-instance audit: {e} \
             (run scripts/fetch-onnxruntime or set ORT_DYLIB_PATH)"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_policy_touches_a_busy_instance(
        gpus in 1usize..=3,
        hours in 2.0f64..8.0,
        start_hour in 0.0f64..24.0,
        rate in 3.0f64..12.0,
        seed in any::<u64>(),
        static_index in 0usize..Geometry::of(MODEL).catalog().len(),
        heuristic in prop::sample::select(Heuristic::ALL.to_vec()),
        reconfig in prop::sample::select(vec![0.0, 4.0, 30.0]),
        by_time in any::<bool>(),
    ) {
        let jobs = workload(gpus, hours, start_hour, rate, seed);
        prop_assume!(!jobs.is_empty());
        let cluster = vec![MODEL; gpus];
        let cfg = SimConfig {
            reconfig_time_s: reconfig,
            epoch: if by_time { EpochRule::Seconds(60.0) } else { EpochRule::Events(2) },
            seed,
            workload_horizon_s: Some(hours * 3600.0),
            start_hour,
            ..SimConfig::default()
        };
        let runs = check_all_policies(&cluster, &jobs, heuristic, &cfg, static_index)
            .map_err(TestCaseError::fail)?;
        prop_assert!(runs >= 6);
        if std::env::var_os("SMARTMIG_POLICY_AUDIT_VERBOSE").is_some() {
            eprintln!("{gpus} GPU(s), {} jobs, {heuristic:?}: {runs} runs checked", jobs.len());
        }
    }
}
