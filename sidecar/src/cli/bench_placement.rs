//! `smartmig bench placement`: the learned job placement against the seven
//! heuristics, under each repartitioning policy (none, the static layout
//! fitted on training days, greedy, the learned repartitioning policy), on
//! the yardstick's scenarios (docs/evaluation.md, "Placement").

use std::io::{IsTerminal, Write};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::args::{JsonArg, ScenarioDaysArgs};
use crate::eval::placement::PlacementRow;
use crate::eval::{
    placement_gates, run_placement_scenario, PlacementBenchConfig, PlacementGate,
    PlacementScenario, ScenarioDays,
};
use crate::scenario::{default_scenarios, select_scenarios};
use crate::sim::PlacementSpec;

#[derive(Debug, clap::Args)]
pub struct PlacementArgs {
    #[command(flatten)]
    pub days: ScenarioDaysArgs,
    /// Placement to score against the heuristics (repeatable): a learned
    /// file, `learned:FILE.onnx`, or a deferral rule such as
    /// `cedf+rescue`; the shipped learned one joins by itself when none is
    /// given.
    #[arg(long, value_name = "SPEC")]
    pub placement: Vec<String>,
    /// Extra repartitioning policy (repeatable) besides none, static-hist
    /// and greedy; the shipped learned policy joins by itself.
    #[arg(long, value_name = "SPEC")]
    pub policy: Vec<String>,
    /// Weight of tardiness in ET.
    #[arg(long, default_value_t = 1.0)]
    pub alpha: f64,
    /// Print every placement's row, not only the best heuristic's and the
    /// scored ones.
    #[arg(long)]
    pub all_rows: bool,
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Serialize)]
struct Report<'a> {
    alpha: f64,
    scenarios: &'a [PlacementScenario],
    gates: &'a [PlacementGate],
    elapsed_s: f64,
}

pub fn run(a: &PlacementArgs) -> Result<()> {
    let gpus = a.days.gpus.unwrap_or(if a.days.quick { 8 } else { 16 });
    let train_days = a
        .days
        .train_days
        .unwrap_or(if a.days.quick { 3 } else { 8 });
    let test_days = a.days.test_days.unwrap_or(if a.days.quick { 2 } else { 4 });
    if gpus == 0 || train_days == 0 || test_days == 0 {
        bail!("--gpus, --train-days and --test-days must be at least 1");
    }
    let train_end = a.days.train_seed.saturating_add(train_days as u64);
    let test_end = a.days.test_seed.saturating_add(test_days as u64);
    if a.days.train_seed < test_end && a.days.test_seed < train_end {
        bail!(
            "training seeds {}..{train_end} and test seeds {}..{test_end} overlap",
            a.days.train_seed,
            a.days.test_seed
        );
    }
    let candidates = candidates(a)?;
    let policies = policies(a);
    let cfg = PlacementBenchConfig {
        alpha: a.alpha,
        search: super::bench_suite::search_for(a.days.quick),
        policies,
        candidates,
    };
    let list = select_scenarios(default_scenarios(), &a.days.only).context("--only")?;
    let started = Instant::now();
    let verbose = std::io::stderr().is_terminal();
    let mut results = Vec::new();
    for s in &list {
        let days = ScenarioDays {
            name: s.name.clone(),
            cluster: vec![a.days.gpu.gpu_model; gpus],
            train: (a.days.train_seed..train_end)
                .map(|seed| super::bench_suite::day(s, a.days.gpu.gpu_model, gpus, seed))
                .collect(),
            test: (a.days.test_seed..test_end)
                .map(|seed| super::bench_suite::day(s, a.days.gpu.gpu_model, gpus, seed))
                .collect(),
            batch: s.is_batch(),
            trace: false,
        };
        let mut progress = |step: &str| {
            if verbose {
                eprintln!("{}: {step}", s.name);
            }
        };
        let r = run_placement_scenario(&days, &cfg, &mut progress)
            .with_context(|| format!("scenario {}", s.name))?;
        write!(a.json.table(), "{}", scenario_table(&r, a.all_rows))?;
        results.push(r);
    }
    let gates = placement_gates(&results);
    let mut out = a.json.table();
    write!(out, "{}", gates_table(&gates))?;
    let elapsed_s = started.elapsed().as_secs_f64();
    writeln!(out, "({elapsed_s:.0} s)")?;
    a.json.write(&Report {
        alpha: a.alpha,
        scenarios: &results,
        gates: &gates,
        elapsed_s,
    })
}

/// The placements to score: `--placement`, each checked before minutes
/// of simulation, else the shipped learned placement when there is one.
fn candidates(a: &PlacementArgs) -> Result<Vec<PlacementSpec>> {
    let mut candidates = Vec::new();
    for p in &a.placement {
        let spec: PlacementSpec = p.parse().with_context(|| format!("--placement {p}"))?;
        if spec.rule().is_some() {
            bail!("--placement {p}: the heuristics always run; give learned:FILE.onnx or a deferral rule (cedf+rescue)");
        }
        // Refuse a wrong file before minutes of simulation.
        spec.build(0, Some(a.days.gpu.gpu_model))
            .with_context(|| format!("--placement {p}"))?;
        candidates.push(spec);
    }
    if candidates.is_empty() {
        match crate::policy::onnx::shipped_placement(a.days.gpu.gpu_model) {
            Some(p) => candidates.push(PlacementSpec::Learned(p)),
            None => eprintln!(
                "smartmig: no shipped learned placement for {}",
                a.days.gpu.gpu_model
            ),
        }
    }
    Ok(candidates)
}

/// The repartitioning policies to run under: greedy and `--policy`, else
/// greedy and the shipped learned policy when it and ONNX Runtime exist.
fn policies(a: &PlacementArgs) -> Vec<(String, String)> {
    let mut policies = vec![("greedy".to_string(), "greedy".to_string())];
    policies.extend(a.policy.iter().map(|p| (p.clone(), p.clone())));
    if a.policy.is_empty() {
        match (
            crate::policy::onnx::shipped_policy(a.days.gpu.gpu_model),
            crate::policy::onnx::find_onnxruntime(),
        ) {
            (Some(p), Ok(_)) => {
                policies.push(("learned".into(), format!("policy:{}", p.display())));
            }
            (Some(p), Err(e)) => eprintln!(
                "smartmig: leaving the learned policy {} out: {e}",
                p.display()
            ),
            (None, _) => eprintln!(
                "smartmig: no shipped learned policy for {}",
                a.days.gpu.gpu_model
            ),
        }
    }
    policies
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:+.1} %", 100.0 * x)
    } else {
        "n/a".into()
    }
}

fn short(placement: &str) -> String {
    match placement.strip_prefix("learned:") {
        Some(path) => format!(
            "learned ({})",
            std::path::Path::new(path)
                .file_name()
                .map_or(path.into(), |f| f.to_string_lossy().into_owned())
        ),
        None => placement.to_string(),
    }
}

/// One scenario: per repartitioning policy, the opponent's row (chosen on
/// the training days), the hindsight-best heuristic's, the scored rows
/// (and every heuristic with `all`).
fn scenario_table(s: &PlacementScenario, all: bool) -> String {
    let mut t = format!(
        "\n{} ({} GPUs, test days {})\n{:<18} {:<30} {:>9} {:>12} {:>14} {:>8} {:>9}\n",
        s.name,
        s.gpus,
        s.test_days.join(", "),
        "repartitioning",
        "placement",
        "late jobs",
        "energy MJ",
        "tardiness h",
        "ET",
        "us/dec"
    );
    for b in &s.blocks {
        for r in &b.rows {
            let opponent = r.placement == b.opponent;
            let best = r.placement == b.best_heuristic;
            if !(all || opponent || best || r.candidate) {
                continue;
            }
            let mark = match (opponent, best) {
                (true, true) => " (opponent, *)",
                (true, false) => " (opponent)",
                (false, true) => " *",
                _ => "",
            };
            t += &line(&b.policy, &format!("{}{mark}", short(&r.placement)), r);
        }
    }
    t + "(opponent: the heuristic with the fewest late jobs on the training days under that repartitioning;\n * the one with the fewest on these test days, a hindsight reference)\n"
}

fn line(policy: &str, name: &str, r: &PlacementRow) -> String {
    format!(
        "{:<18} {:<30} {:>9} {:>12.1} {:>14.1} {:>8.4} {:>9}\n",
        policy,
        name,
        r.late_jobs,
        r.energy_j / 1e6,
        r.tardiness_s / 3600.0,
        r.et,
        r.decision_us.map_or("-".into(), |u| format!("{u:.1}"))
    )
}

/// Every scored row against its block's opponent, the hindsight-best
/// heuristic beside it, and the means over all rows.
fn gates_table(g: &[PlacementGate]) -> String {
    if g.is_empty() {
        return String::new();
    }
    let mut t = format!(
        "\nlearned placement vs the opponent, the heuristic chosen on the training days under the same repartitioning (gates: late jobs <= -12 %, energy <= +1 %, ET not worse); * vs the hindsight-best heuristic, for reference\n{:<18} {:<18} {:<16} {:>9} {:>9} {:>9} {:>10} {:>12}  {:<5} {:<16} {:>9} {:>9}\n",
        "scenario", "repartitioning", "opponent", "late", "energy", "ET", "tardiness", "worst day", "gates", "* best", "* late", "* ET"
    );
    for x in g {
        t += &format!(
            "{:<18} {:<18} {:<16} {:>9} {:>9} {:>9} {:>10} {:>12}  {:<5} {:<16} {:>9} {:>9}\n",
            x.scenario,
            x.policy,
            x.opponent,
            pct(x.late),
            pct(x.energy),
            pct(x.et),
            pct(x.tardiness),
            pct(x.worst_day_late),
            if x.passes() { "pass" } else { "FAIL" },
            x.best_heuristic,
            pct(x.late_vs_best),
            pct(x.et_vs_best),
        );
    }
    let passed = g.iter().filter(|x| x.passes()).count();
    let mean = |f: fn(&PlacementGate) -> f64| {
        g.iter().map(f).filter(|v| v.is_finite()).sum::<f64>() / g.len() as f64
    };
    let us: Vec<f64> = g.iter().filter_map(|x| x.decision_us).collect();
    t += &format!(
        "mean over {} rows vs the opponent: late {}, energy {}, ET {}, tardiness {}; {passed} of {} pass all three; vs the hindsight-best: late {}, ET {}; decision {:.1} us (mean), {:.1} us (worst scenario)\n",
        g.len(),
        pct(mean(|x| x.late)),
        pct(mean(|x| x.energy)),
        pct(mean(|x| x.et)),
        pct(mean(|x| x.tardiness)),
        g.len(),
        pct(mean(|x| x.late_vs_best)),
        pct(mean(|x| x.et_vs_best)),
        us.iter().sum::<f64>() / us.len().max(1) as f64,
        us.iter().copied().fold(0.0, f64::max),
    );
    t
}
