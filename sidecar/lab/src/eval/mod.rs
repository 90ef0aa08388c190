//! The yardstick: how a repartitioning policy is judged against what a site
//! would run without it (`docs/evaluation.md` gives every definition and
//! the reasons).
//!
//! - [`advise`]: advise mode's record of a node (observed jobs and layouts,
//!   the policy's wishes), written by smartmigd and replayed by
//!   `smartmig advise report`.
//! - [`days`]: a set of simulated days (jobs + run settings) with their
//!   `none` (whole-GPU) reference runs, and the search objective over them.
//! - [`baselines`]: the fixed competitors, fitted *causally* on training
//!   days and applied unchanged to the scored day (the opponents), or in
//!   hindsight on the scored day itself (references only).
//! - [`score`]: per-day results and their aggregate (energy and tardiness
//!   on their own, ET with an exchange rate fixed by the training days, the
//!   worst day, standard HPC metrics).
//! - [`fallback`]: do no harm: a policy of ours runs where it beat the
//!   opponents on past days, else the best of them does.
//! - [`suite`]: scenarios x test days x policies, the engine of
//!   `smartmig bench suite`.
//! - [`placement`]: placements (heuristics and learned) x repartitioning
//!   policies on a scenario's test days, the engine of
//!   `smartmig bench placement`.
//! - [`throughput`]: bags of jobs at t = 0 on whole GPUs, a static layout
//!   chosen on other bags and dynamic policies, beside the MIG study's
//!   headline ratios, the engine of `smartmig bench throughput`.
//!
//! - [`coordination`]: one policy deciding the whole cluster against one
//!   instance per node seeing the whole queue or only the jobs it claims
//!   (reconfigurations, wasted reshapes, ET), the engine of
//!   `smartmig bench coordination`.
//!
//! Everything here is pure computation over the simulator (no IO): the CLI
//! prints, plots and writes files.

pub mod advise;
pub mod baselines;
pub mod coordination;
pub mod days;
pub mod fallback;
pub mod gates;
pub mod placement;
pub mod score;
pub mod suite;
pub mod throughput;

pub use baselines::{fit, Fitted};
pub use coordination::{
    run_coordination, Arrangement, CoordinationConfig, CoordinationError, CoordinationReport,
    CoordinationRow,
};
pub use days::{search_score, Day, DaySet};
pub use fallback::{FallbackChoice, HistoryScore};
pub use gates::{best_runnable, gate_rows, suite_gates, GateRow, RunnableBest, SuiteGates};
pub use placement::{
    placement_gates, run_placement_scenario, PlacementBenchConfig, PlacementGate, PlacementScenario,
};
pub use score::{DayScore, PolicyRow, Reference, RowKind};
pub use suite::{run_scenario, ScenarioDays, ScenarioResult, SuiteConfig, SuiteReport};
pub use throughput::{run_bag, Bag, BagResult, ThroughputConfig, ThroughputError};

/// Why a run's event log was refused by [`audit_run`].
#[derive(Debug)]
pub(crate) enum AuditFailure {
    /// The log itself fails the audit.
    Audit(crate::sim::AuditError),
    /// The audit recomputed a total the run reported differently.
    Mismatch {
        what: &'static str,
        audited: f64,
        reported: f64,
    },
}

/// Re-checks a run's event log from scratch ([`crate::sim::audit`]) and
/// compares its totals with the run's metrics ([`agrees`]): how `suite`,
/// `advise` and `coordination` trust a run.
pub(crate) fn audit_run(
    log: &[crate::sim::Record],
    m: &crate::sim::Metrics,
) -> Result<crate::sim::AuditReport, AuditFailure> {
    let a = crate::sim::audit(log).map_err(AuditFailure::Audit)?;
    agrees(&a, m)?;
    Ok(a)
}

/// Whether the audit's energy, total tardiness (to 1e-6 relative), late
/// and unserved jobs are the run's: at the log's own horizon, or both
/// re-charged at a comparison's common horizon (`a.at_horizon(h)` against
/// `m.at_horizon(h)`, the audit recomputing the rule on its own).
pub(crate) fn agrees(
    a: &crate::sim::AuditReport,
    m: &crate::sim::Metrics,
) -> Result<(), AuditFailure> {
    for (what, audited, reported) in [
        ("energy (J)", a.energy_j, m.energy_j),
        (
            "total tardiness (s)",
            a.total_tardiness_s,
            m.total_tardiness_s,
        ),
        ("late jobs", a.late_jobs as f64, m.late_jobs as f64),
        (
            "jobs that never ran",
            a.unserved as f64,
            m.never_ran() as f64,
        ),
    ] {
        if (audited - reported).abs() > 1e-6 * reported.abs().max(1.0) {
            return Err(AuditFailure::Mismatch {
                what,
                audited,
                reported,
            });
        }
    }
    Ok(())
}

/// Small generated days and a small search for the unit tests of `eval`.
#[cfg(test)]
pub(crate) mod testing {
    use super::Day;
    use crate::mig::GpuModel;
    use crate::policy::search::SearchConfig;
    use crate::workload::{generate_diurnal, DiurnalConfig};

    pub const M: GpuModel = GpuModel::A100_40gb;

    /// A diurnal day of `hours` from `start_hour` on 4 GPUs, peak rate `rate`.
    pub fn day(seed: u64, hours: f64, start_hour: f64, rate: f64) -> Day {
        let w = DiurnalConfig {
            horizon_s: hours * 3600.0,
            start_hour,
            peak_rate: rate,
            ..DiurnalConfig::default()
        };
        Day::generated(
            generate_diurnal(&w, M, 4, seed),
            seed,
            w.horizon_s,
            start_hour,
        )
    }

    /// The coarse search plus a small pair step and one mix.
    pub fn quick_search() -> SearchConfig {
        SearchConfig {
            pair_top: 3,
            mixes: 1,
            ..SearchConfig::coarse()
        }
    }
}
