//! `smartmig bench oracle`: the hindsight rollout oracle
//! ([`crate::learn::oracle`]) on the test days of a scenario (the first
//! wave's diurnal day, any family of the suite with `--scenario NAME`, or
//! trace windows with `--trace FILE`), beside every row of the suite on
//! the same days: `none`, the causal opponents fitted on training days,
//! greedy, the shipped learned policy (and its `+fallback`), and the
//! hindsight layout searches. It answers "how much ET could per-epoch
//! repartitioning gain on this workload at best, with this placement, over
//! what a site can run today?", which is what a learned policy's target
//! should be compared with. The yardstick is the suite's
//! (docs/evaluation.md): one exchange rate per scenario from its training
//! days, every run of a day charged at the day's horizon (where `none` ends, `sim::day_horizon`), rows with
//! jobs left unserved ranked behind (the oracle optimises that very ET).

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::args::{GpuModelArg, JsonArg};
use super::bench_suite::{search_for, trace_scenarios, TraceArgs};
use super::learned::shipped_learned;
use crate::eval::{run_scenario, Day, RowKind, ScenarioDays, ScenarioResult, SuiteConfig};
use crate::learn::oracle::{from_whole, rollout};
use crate::learn::train::{static_best, TrainConfig};
use crate::mig::GpuModel;
use crate::report::aligned;
use crate::scenario::{default_scenarios, select_scenarios};
use crate::sim::{Heuristic, Reference, Standing};
use crate::workload::{generate_diurnal, DiurnalConfig};

#[derive(Debug, clap::Args)]
pub struct OracleArgs {
    #[command(flatten)]
    pub gpu: GpuModelArg,
    #[arg(long, default_value_t = 8)]
    pub gpus: usize,
    /// A scenario of the suite's families (`mix-shift/tight`, or a family
    /// name for both deadline regimes; `bench suite` lists them); default:
    /// the first wave's diurnal day.
    #[arg(long, value_name = "NAME", conflicts_with = "trace")]
    pub scenario: Option<String>,
    #[command(flatten)]
    pub trace: TraceArgs,
    /// `--trace`: the last N windows with jobs are the test days.
    #[arg(long, default_value_t = 1)]
    pub windows: usize,
    /// Test day seeds (generated days), comma-separated.
    #[arg(long, default_value = "1000", value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// Training days (seeds `train_seed..`, or the trace windows before the
    /// test ones): the causal opponents and the exchange rate come from them.
    #[arg(long, default_value_t = 8)]
    pub train_days: usize,
    #[arg(long, default_value_t = 0)]
    pub train_seed: u64,
    #[arg(long, default_value = "edf")]
    pub placement: String,
    /// The suite's smaller search for the opponents and the hindsight rows.
    #[arg(long)]
    pub quick: bool,
    /// Most whole-day simulations per day (later epochs keep once spent).
    #[arg(long, default_value_t = 200_000)]
    pub max_simulations: usize,
    /// Most improvement sweeps over the day's epochs.
    #[arg(long, default_value_t = 3)]
    pub passes: usize,
    /// Start from whole GPUs (as a live policy does) instead of the day's static-best.
    #[arg(long)]
    pub from_whole: bool,
    /// Print every move of the oracle (epoch, hour, GPU, layout).
    #[arg(long)]
    pub moves: bool,
    #[command(flatten)]
    pub json: JsonArg,
}

/// One test day: every row's ET and the oracle's, all charged at the
/// day's common horizon with the scenario's exchange rate.
#[derive(Serialize)]
struct DayRow {
    day: String,
    /// `(policy, kind, ET, jobs unserved)` of the suite's rows.
    rows: Vec<(String, RowKind, f64, u64)>,
    oracle_et: f64,
    oracle_unserved: u64,
    /// The oracle's ET against greedy's and against the best row a site
    /// could run (causal opponents and our policies), relative.
    oracle_vs_greedy: Option<f64>,
    oracle_vs_best_runnable: Option<f64>,
    best_runnable: String,
    moves: usize,
    simulations: usize,
    passes: usize,
    seconds: f64,
}

#[derive(Serialize)]
struct OracleScenario {
    name: String,
    gpus: usize,
    reference: Reference,
    from_whole: bool,
    days: Vec<DayRow>,
}

pub fn run(a: &OracleArgs) -> Result<()> {
    if a.gpus == 0 {
        bail!("--gpus must be at least 1");
    }
    if a.train_days == 0 || a.seeds.is_empty() || a.windows == 0 {
        bail!("--train-days, --seeds and --windows need at least one day each");
    }
    let heuristic: Heuristic = a
        .placement
        .parse()
        .with_context(|| format!("--placement {}", a.placement))?;
    let scenarios = scenario_days(a)?;
    let mut cfg = SuiteConfig {
        heuristic,
        search: search_for(a.quick),
        ..SuiteConfig::default()
    };
    if let Some(spec) = shipped_learned(a.gpu.gpu_model) {
        cfg.candidates.push(("learned".into(), spec));
        cfg.fallback_for.push("learned".into());
    }
    let mut out = Vec::new();
    for s in &scenarios {
        let r = run_scenario(s, &cfg, &mut |_| {})?;
        let days = oracle_days(a, s, &r)?;
        print_table(&mut *a.json.table(), &r, &days)?;
        out.push(OracleScenario {
            name: r.name.clone(),
            gpus: r.gpus,
            reference: r.reference,
            from_whole: a.from_whole,
            days,
        });
    }
    a.json.write(&out)
}

/// The scenarios to run: the trace's windows, a family's scenarios, or the
/// first wave's diurnal day; training seeds and test seeds may not overlap.
fn scenario_days(a: &OracleArgs) -> Result<Vec<ScenarioDays>> {
    if let Some(source) = a.trace.source(a.gpu.gpu_model, a.train_seed) {
        return trace_scenarios(&source, a.train_days, a.windows);
    }
    let train = a.train_seed..a.train_seed.saturating_add(a.train_days as u64);
    if let Some(seed) = a.seeds.iter().find(|s| train.contains(s)) {
        bail!(
            "test seed {seed} is also a training seed ({}..{}): an opponent fitted on a test day is not causal",
            train.start,
            train.end
        );
    }
    let cluster = vec![a.gpu.gpu_model; a.gpus];
    let Some(name) = &a.scenario else {
        let w = DiurnalConfig::default();
        let day = |seed| {
            Day::generated(
                generate_diurnal(&w, a.gpu.gpu_model, a.gpus, seed),
                seed,
                w.horizon_s,
                w.start_hour,
            )
        };
        return Ok(vec![ScenarioDays {
            name: "diurnal (first wave)".into(),
            cluster,
            train: train.map(day).collect(),
            test: a.seeds.iter().map(|&s| day(s)).collect(),
            batch: false,
            trace: false,
        }]);
    };
    let list = select_scenarios(default_scenarios(), std::slice::from_ref(name))
        .with_context(|| format!("--scenario {name}"))?;
    Ok(list
        .iter()
        .map(|s| ScenarioDays {
            name: s.name.clone(),
            cluster: cluster.clone(),
            train: train
                .clone()
                .map(|seed| super::bench_suite::day(s, a.gpu.gpu_model, a.gpus, seed))
                .collect(),
            test: a
                .seeds
                .iter()
                .map(|&seed| super::bench_suite::day(s, a.gpu.gpu_model, a.gpus, seed))
                .collect(),
            batch: s.is_batch(),
            trace: false,
        })
        .collect())
}

/// The oracle on each test day of `s`, optimising the scenario's ET, and
/// every row of `r` on that day, re-charged at a horizon common to them all.
fn oracle_days(a: &OracleArgs, s: &ScenarioDays, r: &ScenarioResult) -> Result<Vec<DayRow>> {
    let cfg = TrainConfig {
        gpu_model: a.gpu.gpu_model,
        heuristic: a.placement.clone(),
        ..TrainConfig::default()
    };
    cfg.validate()?;
    let mut out = Vec::new();
    for (i, test) in s.test.iter().enumerate() {
        let mut day = crate::learn::train::Day::with_clock(
            &cfg,
            s.cluster.len(),
            test.jobs.clone(),
            test.cfg.seed,
            test.cfg.workload_horizon_s.unwrap_or(0.0),
            test.cfg.start_hour,
        )?;
        day.rate = r.reference;
        let t0 = Instant::now();
        let run = if a.from_whole {
            from_whole(&cfg, &day, a.passes, a.max_simulations)?
        } else {
            let (_, layouts, _) = static_best(&cfg, &day)?;
            rollout(&cfg, &day, &layouts, a.passes, a.max_simulations)?
        };
        let seconds = t0.elapsed().as_secs_f64();
        if a.moves {
            print_moves(&mut *a.json.table(), a.gpu.gpu_model, &test.label, &run)?;
        }
        out.push(day_row(r, i, &test.label, &run, seconds));
    }
    Ok(out)
}

fn day_row(
    r: &ScenarioResult,
    i: usize,
    label: &str,
    run: &crate::learn::oracle::OracleRun,
    seconds: f64,
) -> DayRow {
    let schedules = || r.rows.iter().filter(|row| row.kind != RowKind::Bound);
    // The day's horizon (`sim::day_horizon`): where `none` ends.
    let horizon = schedules()
        .find(|row| row.policy == "none")
        .and_then(|row| row.days[i].metrics.as_ref())
        .map_or(run.metrics.horizon_s, crate::sim::day_horizon);
    let alpha = 1.0;
    let rows: Vec<(String, RowKind, f64, u64)> = schedules()
        .filter_map(|row| {
            let m = row.days[i].metrics.as_ref()?.at_horizon(horizon);
            Some((
                row.policy.clone(),
                row.kind,
                r.reference.et_of(&m, alpha),
                m.never_ran(),
            ))
        })
        .collect();
    let oracle = run.metrics.at_horizon(horizon);
    let oracle_et = r.reference.et_of(&oracle, alpha);
    let vs = |et: f64| (et > 0.0).then(|| oracle_et / et - 1.0);
    let best = rows
        .iter()
        .filter(|x| matches!(x.1, RowKind::Opponent | RowKind::Candidate))
        .min_by_key(|x| Standing::new(x.3, x.2));
    DayRow {
        day: label.to_string(),
        oracle_vs_greedy: rows.iter().find(|x| x.0 == "greedy").and_then(|x| vs(x.2)),
        oracle_vs_best_runnable: best.and_then(|x| vs(x.2)),
        best_runnable: best.map_or(String::new(), |x| x.0.clone()),
        rows,
        oracle_et,
        oracle_unserved: oracle.never_ran(),
        moves: run.decisions.iter().map(Vec::len).sum(),
        simulations: run.simulations,
        passes: run.passes,
        seconds,
    }
}

fn print_moves(
    out: &mut dyn Write,
    model: GpuModel,
    label: &str,
    run: &crate::learn::oracle::OracleRun,
) -> Result<()> {
    let g = crate::mig::Geometry::of(model);
    writeln!(out, "oracle moves on {label}:")?;
    for (k, ds) in run.decisions.iter().enumerate() {
        for d in ds {
            writeln!(
                out,
                "  epoch {k:>4} {:>5.2} h  gpu {:>3} -> {}",
                run.hours.get(k).copied().unwrap_or(0.0),
                d.gpu,
                g.picture(d.target)
            )?;
        }
    }
    Ok(())
}

/// One table per scenario: a line per test day, a column per row (`U` =
/// left jobs unserved), the oracle, its gain over greedy and over the best
/// runnable row, and its cost; then the means.
fn print_table(out: &mut dyn Write, r: &ScenarioResult, days: &[DayRow]) -> Result<()> {
    let Some(first) = days.first() else {
        return Ok(());
    };
    writeln!(
        out,
        "{}: {} GPUs, exchange rate from the training days (1 s of mean tardiness = {:.0} J)",
        r.name,
        r.gpus,
        r.reference.joules_per_tardiness_s()
    )?;
    let mut header = vec!["day".to_string()];
    header.extend(first.rows.iter().map(|x| x.0.clone()));
    header.extend(
        [
            "oracle",
            "vs greedy",
            "vs best runnable",
            "moves",
            "simulations",
            "time s",
        ]
        .map(String::from),
    );
    let mut lines = vec![header];
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{:+.1}%", 100.0 * x));
    let et = |et: f64, unserved: u64| format!("{et:.3}{}", if unserved > 0 { "U" } else { "" });
    for d in days {
        let mut l = vec![d.day.clone()];
        l.extend(d.rows.iter().map(|x| et(x.2, x.3)));
        l.extend([
            et(d.oracle_et, d.oracle_unserved),
            pct(d.oracle_vs_greedy),
            format!("{} {}", pct(d.oracle_vs_best_runnable), d.best_runnable),
            d.moves.to_string(),
            d.simulations.to_string(),
            format!("{:.1}", d.seconds),
        ]);
        lines.push(l);
    }
    let n = days.len() as f64;
    let mean = |f: &dyn Fn(&DayRow) -> Option<f64>| {
        let v: Vec<f64> = days.iter().filter_map(f).collect();
        (v.len() == days.len()).then(|| v.iter().sum::<f64>() / n)
    };
    let mut l = vec!["mean".to_string()];
    l.extend(
        (0..first.rows.len()).map(|k| {
            mean(&|d| d.rows.get(k).map(|x| x.2)).map_or("-".into(), |v| format!("{v:.3}"))
        }),
    );
    l.extend([
        mean(&|d| Some(d.oracle_et)).map_or("-".into(), |v| format!("{v:.3}")),
        pct(mean(&|d| d.oracle_vs_greedy)),
        pct(mean(&|d| d.oracle_vs_best_runnable)),
    ]);
    lines.push(l);
    writeln!(out, "{}", aligned(&lines))?;
    Ok(())
}
