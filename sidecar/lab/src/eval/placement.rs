//! Placements x repartitioning policies on a scenario's test days: the
//! engine of `smartmig bench placement` (docs/evaluation.md, "Placement").
//!
//! For one scenario, every repartitioning policy (`none`, the static
//! layout fitted on the training days, `greedy`, a learned one) runs every
//! placement (the seven heuristics, the learned placements and any
//! deferral rule given, `sim::deferral`) on every test day. Each of the
//! latter, a *candidate*, is judged against **the opponent**: the
//! heuristic a site would pick from its past days, the one with the fewest
//! late jobs over the *training* days under the same repartitioning (ties:
//! less energy). The heuristic with the fewest late jobs over the test days
//! themselves is shown beside it as a hindsight reference, never as the
//! opponent. Late jobs, energy, tardiness and ET are summed over the test
//! days, with the worst day, every run of a test day charged at that day's
//! common horizon (the latest of every row of the table; `sim::metrics`).
//! Each decision of a candidate is timed.

use std::time::Instant;

use serde::Serialize;

use crate::mig::GpuModel;
use crate::policy::search::{static_best, SearchConfig};
use crate::policy::{parse_policy, RepartitionPolicy};
use crate::sim::{
    learned_model, simulate, Candidate, Heuristic, Metrics, Pick, PlacementContext,
    PlacementHeuristic, PlacementSpec, RunHooks, SimError,
};
use crate::workload::Job;

use super::days::{Day, DaySet};
use super::score::Reference;
use super::suite::ScenarioDays;

/// Totals of one placement under one repartitioning policy.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PlacementRow {
    /// `edf`, ..., `learned:FILE` or a deferral rule (`cedf+rescue:...`).
    pub placement: String,
    /// Scored against the opponent (a learned file or a deferral rule),
    /// not one of the seven heuristics it is chosen from.
    pub candidate: bool,
    pub late_jobs: u64,
    pub jobs: u64,
    pub energy_j: f64,
    pub tardiness_s: f64,
    /// ET with the scenario's exchange rate, as `bench suite` computes it:
    /// mean energy and mean tardiness per day against `none` + `edf`
    /// pooled over the training days ([`Reference`]).
    pub et: f64,
    /// Late jobs per test day.
    pub late_per_day: Vec<u64>,
    /// Mean wall time of one decision, microseconds (candidates only).
    pub decision_us: Option<f64>,
    pub decisions: u64,
}

/// One repartitioning policy's block of rows.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyBlock {
    /// `none`, `static-hist`, `greedy`, `learned`.
    pub policy: String,
    pub description: String,
    pub rows: Vec<PlacementRow>,
    /// The opponent: the heuristic with the fewest late jobs over the
    /// training days (ties: less energy).
    pub opponent: String,
    /// Late jobs of each heuristic over the training days, the opponent's
    /// evidence: `(heuristic, late jobs)`.
    pub training_late: Vec<(String, u64)>,
    /// Hindsight reference: the heuristic with the fewest late jobs over
    /// the test days themselves (ties: less energy).
    pub best_heuristic: String,
}

impl PolicyBlock {
    /// The opponent's row on the test days.
    pub fn opponent(&self) -> Option<&PlacementRow> {
        self.rows.iter().find(|r| r.placement == self.opponent)
    }

    /// The hindsight reference's row.
    pub fn best(&self) -> Option<&PlacementRow> {
        self.rows
            .iter()
            .find(|r| r.placement == self.best_heuristic)
    }
}

/// One scenario's result.
#[derive(Clone, Debug, Serialize)]
pub struct PlacementScenario {
    pub name: String,
    pub gpus: usize,
    pub test_days: Vec<String>,
    pub blocks: Vec<PolicyBlock>,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct PlacementBenchConfig {
    pub alpha: f64,
    pub search: SearchConfig,
    /// `(row name, spec)` of the repartitioning policies besides `none`
    /// and `static-hist` (e.g. `("greedy", "greedy")`).
    pub policies: Vec<(String, String)>,
    /// Placements to score beside the heuristics: learned files and
    /// deferral rules.
    pub candidates: Vec<PlacementSpec>,
}

/// Times a placement's decisions.
struct Timed {
    inner: Box<dyn PlacementHeuristic + Send>,
    nanos: u128,
    decisions: u64,
}

impl PlacementHeuristic for Timed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn priority(&self, job: &Job) -> f64 {
        self.inner.priority(job)
    }
    fn choose(&mut self, job: &Job, candidates: &[Candidate]) -> Pick {
        self.inner.choose(job, candidates)
    }
    fn choose_in(
        &mut self,
        job: &Job,
        candidates: &[Candidate],
        ctx: &PlacementContext<'_>,
    ) -> Pick {
        let t = Instant::now();
        let pick = self.inner.choose_in(job, candidates, ctx);
        self.nanos += t.elapsed().as_nanos();
        self.decisions += 1;
        pick
    }
}

/// One placement's runs under one policy, one per day, each at its own
/// horizon, with the candidate's decision timings.
struct Runs {
    placement: String,
    candidate: bool,
    days: Vec<Metrics>,
    nanos: u128,
    decisions: u64,
}

/// Runs one placement under one policy on every day of `days`.
fn runs(
    s: &ScenarioDays,
    days: &[Day],
    spec: &PlacementSpec,
    policy: &mut dyn FnMut() -> Result<Box<dyn RepartitionPolicy + Send>, SimError>,
) -> Result<Runs, SimError> {
    let mut r = Runs {
        placement: spec.to_string(),
        candidate: spec.rule().is_none(),
        days: Vec::with_capacity(days.len()),
        nanos: 0,
        decisions: 0,
    };
    for day in days {
        let mut p = policy()?;
        let mut h = Timed {
            inner: spec.build(day.cfg.seed, learned_model(&s.cluster))?,
            nanos: 0,
            decisions: 0,
        };
        let m = simulate(
            &s.cluster,
            &day.jobs,
            &mut h,
            p.as_mut(),
            &day.cfg,
            RunHooks::default(),
        )?
        .metrics;
        r.days.push(m);
        r.nanos += h.nanos;
        r.decisions += h.decisions;
    }
    Ok(r)
}

impl Runs {
    /// The row's totals, each day charged at `horizons[day]` (the day's
    /// common horizon, `sim::metrics`; a run's own horizon if later), and
    /// its ET with the scenario's exchange rate.
    fn row(&self, horizons: &[f64], reference: &Reference, alpha: f64) -> PlacementRow {
        let mut r = PlacementRow {
            placement: self.placement.clone(),
            candidate: self.candidate,
            ..PlacementRow::default()
        };
        let mut mean_tardiness = 0.0;
        for (i, m) in self.days.iter().enumerate() {
            let m = m.at_horizon(horizons.get(i).copied().unwrap_or(0.0));
            add(&mut r, &m);
            mean_tardiness += m.mean_tardiness_s;
        }
        let n = self.days.len().max(1) as f64;
        r.et = reference.et(r.energy_j / n, mean_tardiness / n, alpha);
        if r.candidate {
            r.decisions = self.decisions;
            r.decision_us =
                (self.decisions > 0).then(|| self.nanos as f64 / self.decisions as f64 / 1000.0);
        }
        r
    }
}

/// Per day, the latest horizon of any of `runs`.
fn common_horizons<'a>(runs: impl IntoIterator<Item = &'a Runs>) -> Vec<f64> {
    let mut h: Vec<f64> = Vec::new();
    for r in runs {
        h.resize(h.len().max(r.days.len()), 0.0);
        for (i, m) in r.days.iter().enumerate() {
            h[i] = h[i].max(m.horizon_s);
        }
    }
    h
}

fn add(r: &mut PlacementRow, m: &Metrics) {
    r.late_jobs += m.late_jobs;
    r.jobs += m.jobs;
    r.energy_j += m.energy_j;
    r.tardiness_s += m.total_tardiness_s;
    r.late_per_day.push(m.late_jobs);
}

/// Scores one scenario (module docs).
pub fn run_placement_scenario(
    s: &ScenarioDays,
    cfg: &PlacementBenchConfig,
    progress: &mut dyn FnMut(&str),
) -> Result<PlacementScenario, SimError> {
    let models: Vec<GpuModel> = GpuModel::distinct(&s.cluster);
    progress("fitting static-hist on the training days");
    let train = DaySet::new(&s.cluster, Heuristic::Edf, s.train.clone())?;
    // The exchange rate of ET: none + edf pooled over the training days.
    let reference = s.reference(&train);
    let mut evaluate = |p: &mut dyn RepartitionPolicy| train.objective(p, &reference, cfg.alpha);
    let fitted = static_best(&s.cluster, &cfg.search, &mut evaluate)?.policy;
    let mut placements: Vec<PlacementSpec> = Heuristic::ALL
        .iter()
        .map(|&h| PlacementSpec::Rule(h))
        .collect();
    placements.extend(cfg.candidates.iter().cloned());
    let mut policies: Vec<(String, String)> = vec![("none".into(), "none".into())];
    policies.push(("static-hist".into(), String::new()));
    policies.extend(cfg.policies.iter().cloned());
    let mut blocks = Vec::new();
    let mut tested: Vec<Vec<Runs>> = Vec::new();
    for (name, spec) in &policies {
        progress(name);
        let description = if spec.is_empty() {
            format!("static layout fitted on {} training days", s.train.len())
        } else {
            spec.clone()
        };
        let mut make = || -> Result<Box<dyn RepartitionPolicy + Send>, SimError> {
            if spec.is_empty() {
                return Ok(Box::new(fitted.clone()));
            }
            parse_policy(spec, &models).map_err(|e| SimError::Config(format!("{spec}: {e}")))
        };
        let mut rows = Vec::new();
        for p in &placements {
            rows.push(runs(s, &s.test, p, &mut make)?);
        }
        // The opponent is chosen by late jobs on the training days, each
        // day a comparison of the seven heuristics.
        let mut training = Vec::new();
        for &h in &Heuristic::ALL {
            training.push(runs(s, &s.train, &PlacementSpec::Rule(h), &mut make)?);
        }
        let horizons = common_horizons(&training);
        let training: Vec<PlacementRow> = training
            .iter()
            .map(|r| r.row(&horizons, &reference, cfg.alpha))
            .collect();
        blocks.push(PolicyBlock {
            policy: name.clone(),
            description,
            opponent: fewest_late(&training),
            training_late: training
                .iter()
                .map(|r| (r.placement.clone(), r.late_jobs))
                .collect(),
            best_heuristic: String::new(),
            rows: Vec::new(),
        });
        tested.push(rows);
    }
    // Every row of the scenario's table is charged at each test day's
    // common horizon: one energy window per day (docs/evaluation.md).
    let horizons = common_horizons(tested.iter().flatten());
    for (block, rows) in blocks.iter_mut().zip(&tested) {
        block.rows = rows
            .iter()
            .map(|r| r.row(&horizons, &reference, cfg.alpha))
            .collect();
        block.best_heuristic = fewest_late(&block.rows);
    }
    Ok(PlacementScenario {
        name: s.name.clone(),
        gpus: s.cluster.len(),
        test_days: s.test.iter().map(|d: &Day| d.label.clone()).collect(),
        blocks,
    })
}

/// The heuristic row with the fewest late jobs (ties: less energy).
fn fewest_late(rows: &[PlacementRow]) -> String {
    rows.iter()
        .filter(|r| !r.candidate)
        .min_by(|a, b| {
            a.late_jobs
                .cmp(&b.late_jobs)
                .then(a.energy_j.total_cmp(&b.energy_j))
        })
        .map(|r| r.placement.clone())
        .unwrap_or_default()
}

/// A learned row against its block's opponent: relative changes
/// (learned / opponent - 1) of late jobs, energy, ET and tardiness, and the
/// worst day's late-job change; and, for reference, late jobs and ET
/// against the hindsight-best heuristic.
#[derive(Clone, Debug, Serialize)]
pub struct PlacementGate {
    pub scenario: String,
    pub policy: String,
    pub placement: String,
    /// The heuristic chosen on the training days.
    pub opponent: String,
    pub late: f64,
    pub energy: f64,
    pub et: f64,
    pub tardiness: f64,
    /// The day where the learned placement did worst against the best
    /// heuristic (largest late-job change; +inf when the heuristic had none
    /// late and the learned one some).
    pub worst_day_late: f64,
    pub decision_us: Option<f64>,
    /// Hindsight reference: the heuristic with the fewest late jobs on the
    /// test days, and the learned row's late-job and ET changes against it.
    pub best_heuristic: String,
    pub late_vs_best: f64,
    pub et_vs_best: f64,
}

impl PlacementGate {
    /// Issue 21's gates: late jobs <= -12 %, energy <= +1 %, ET not worse.
    pub fn passes(&self) -> bool {
        self.late <= -0.12 && self.energy <= 0.01 && self.et <= 0.0
    }
}

/// The gate rows of every learned placement in `scenarios`.
pub fn placement_gates(scenarios: &[PlacementScenario]) -> Vec<PlacementGate> {
    let rel = |a: f64, b: f64| {
        if b > 0.0 {
            a / b - 1.0
        } else if a > 0.0 {
            f64::INFINITY
        } else {
            0.0
        }
    };
    let mut out = Vec::new();
    for s in scenarios {
        for b in &s.blocks {
            let (Some(opp), Some(best)) = (b.opponent(), b.best()) else {
                continue;
            };
            for r in b.rows.iter().filter(|r| r.candidate) {
                let worst_day_late = r
                    .late_per_day
                    .iter()
                    .zip(&opp.late_per_day)
                    .map(|(&l, &h)| rel(l as f64, h as f64))
                    .fold(f64::NEG_INFINITY, f64::max);
                out.push(PlacementGate {
                    scenario: s.name.clone(),
                    policy: b.policy.clone(),
                    placement: r.placement.clone(),
                    opponent: opp.placement.clone(),
                    late: rel(r.late_jobs as f64, opp.late_jobs as f64),
                    energy: rel(r.energy_j, opp.energy_j),
                    et: rel(r.et, opp.et),
                    tardiness: rel(r.tardiness_s, opp.tardiness_s),
                    worst_day_late,
                    decision_us: r.decision_us,
                    best_heuristic: best.placement.clone(),
                    late_vs_best: rel(r.late_jobs as f64, best.late_jobs as f64),
                    et_vs_best: rel(r.et, best.et),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gates compare each learned row with its block's opponent (chosen on
    /// the training days), not with the hindsight-best heuristic.
    #[test]
    fn gates_are_relative_to_the_opponent() {
        let r = |name: &str, candidate: bool, late: u64, days: Vec<u64>| PlacementRow {
            placement: name.into(),
            candidate,
            late_jobs: late,
            energy_j: 100.0,
            tardiness_s: 10.0,
            et: 1.0,
            late_per_day: days,
            ..PlacementRow::default()
        };
        let s = PlacementScenario {
            name: "x".into(),
            gpus: 1,
            test_days: vec!["a".into(), "b".into()],
            blocks: vec![PolicyBlock {
                policy: "none".into(),
                description: String::new(),
                rows: vec![
                    r("edf", false, 10, vec![5, 5]),
                    r("eft", false, 4, vec![2, 2]),
                    r("learned:f", true, 8, vec![2, 6]),
                ],
                opponent: "edf".into(),
                training_late: vec![("edf".into(), 30), ("eft".into(), 31)],
                best_heuristic: "eft".into(),
            }],
        };
        let g = placement_gates(&[s]);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].opponent, "edf");
        assert!((g[0].late + 0.2).abs() < 1e-12);
        assert!((g[0].worst_day_late - 0.2).abs() < 1e-12, "day b: 6 vs 5");
        assert_eq!(g[0].energy, 0.0);
        assert_eq!(g[0].best_heuristic, "eft");
        assert!((g[0].late_vs_best - 1.0).abs() < 1e-12, "8 vs 4");
    }
}
