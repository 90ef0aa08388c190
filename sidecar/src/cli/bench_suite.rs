//! `smartmig bench suite`: every scenario family x test days x policies,
//! against the opponents a site would run without smartmig (whole GPUs, a
//! static or twice-daily layout fitted on *past* days), with the hindsight
//! references and the lower bound beside them. `docs/evaluation.md`
//! explains every column and choice.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::eval::{run_scenario, Day, ScenarioDays, SuiteConfig, SuiteReport};
use crate::mig::GpuModel;
use crate::policy::search::{SearchConfig, SwitchHours};
use crate::report::suite::{et_bars, scenario_table, summary_table};
use crate::sim::{Heuristic, SimConfig};
use crate::workload::{default_scenarios, parse_scenarios, Scenario};

#[derive(Debug, clap::Args)]
pub struct SuiteArgs {
    /// GPUs of the simulated cluster.
    #[arg(long, default_value_t = 8)]
    pub gpus: usize,
    #[arg(long, default_value = "a100-40gb")]
    pub model: GpuModel,
    /// Scenarios file (TOML, `[[scenario]]` tables; the built-in list is
    /// `sidecar/src/workload/scenarios.toml`).
    #[arg(long, value_name = "FILE")]
    pub scenarios: Option<PathBuf>,
    /// Only these scenarios (comma-separated names, or a family name such as
    /// `mix-shift` for both deadline regimes).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Training days per scenario (seeds `train_seed..`): the opponents are
    /// fitted on them.
    #[arg(long)]
    pub train_days: Option<usize>,
    /// Test days per scenario (seeds `test_seed..`): every policy is scored on them.
    #[arg(long)]
    pub test_days: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub train_seed: u64,
    #[arg(long, default_value_t = 1000)]
    pub test_seed: u64,
    /// A small run: 3 training and 2 test days, a smaller search.
    #[arg(long)]
    pub quick: bool,
    /// Job-placement heuristic.
    #[arg(long, default_value = "edf")]
    pub placement: String,
    /// Weight of tardiness in ET.
    #[arg(long, default_value_t = 1.0)]
    pub alpha: f64,
    /// Extra policy to score (repeatable), e.g. `policy:FILE.onnx` or
    /// `greedy:window=60`. The shipped learned policy joins by itself when
    /// it and ONNX Runtime exist.
    #[arg(long, value_name = "SPEC")]
    pub policy: Vec<String>,
    /// Leave out the hindsight references (searched on each test day).
    #[arg(long)]
    pub no_hindsight: bool,
    /// Write the results as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write one SVG bar chart per scenario into DIR.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
}

/// The scenarios to run, filtered by `--only`.
fn scenarios(a: &SuiteArgs) -> Result<Vec<Scenario>> {
    let all = match &a.scenarios {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            parse_scenarios(&text).with_context(|| format!("scenarios file {}", p.display()))?
        }
        None => default_scenarios(),
    };
    if a.only.is_empty() {
        return Ok(all);
    }
    let keep: Vec<Scenario> = all
        .iter()
        .filter(|s| {
            a.only
                .iter()
                .any(|o| s.name == *o || s.name.split('/').next() == Some(o.as_str()))
        })
        .cloned()
        .collect();
    for o in &a.only {
        if !all
            .iter()
            .any(|s| s.name == *o || s.name.split('/').next() == Some(o.as_str()))
        {
            let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
            bail!("--only: no scenario `{o}` (known: {})", names.join(", "));
        }
    }
    Ok(keep)
}

/// One generated day of `s`.
fn day(s: &Scenario, model: GpuModel, gpus: usize, seed: u64) -> Day {
    Day {
        label: format!("seed {seed}"),
        jobs: s.generate(model, gpus, seed),
        cfg: SimConfig {
            seed,
            workload_horizon_s: Some(s.horizon_s()),
            start_hour: s.start_hour(),
            ..SimConfig::default()
        },
    }
}

pub fn run(a: &SuiteArgs) -> Result<()> {
    if a.gpus == 0 {
        bail!("--gpus must be at least 1");
    }
    let heuristic: Heuristic = a.placement.parse()?;
    let train_days = a.train_days.unwrap_or(if a.quick { 3 } else { 8 });
    let test_days = a.test_days.unwrap_or(if a.quick { 2 } else { 4 });
    if train_days == 0 || test_days == 0 {
        bail!("--train-days and --test-days must be at least 1");
    }
    let train_end = a.train_seed.saturating_add(train_days as u64);
    let test_end = a.test_seed.saturating_add(test_days as u64);
    if a.train_seed < test_end && a.test_seed < train_end {
        bail!(
            "training seeds {}..{train_end} and test seeds {}..{test_end} overlap: a baseline fitted on a test day is not causal",
            a.train_seed,
            a.test_seed
        );
    }
    let list = scenarios(a)?;
    for s in &list {
        s.validate()
            .with_context(|| format!("scenario {}", s.name))?;
    }
    let mut cfg = SuiteConfig {
        alpha: a.alpha,
        heuristic,
        hindsight: !a.no_hindsight,
        search: if a.quick {
            SearchConfig {
                pair_top: 5,
                mixes: 2,
                hours: SwitchHours::Narrow,
                ..SearchConfig::default()
            }
        } else {
            SearchConfig::default()
        },
        ..SuiteConfig::default()
    };
    cfg.candidates
        .extend(a.policy.iter().map(|p| (p.clone(), p.clone())));
    if !a.policy.iter().any(|s| s.starts_with("policy:")) {
        match (
            crate::policy::onnx::shipped_policy(a.model),
            crate::policy::onnx::find_onnxruntime(),
        ) {
            (Some(p), Ok(_)) => cfg
                .candidates
                .push(("learned".into(), format!("policy:{}", p.display()))),
            (Some(p), Err(e)) => eprintln!(
                "smartmig: leaving the learned policy {} out: {e}",
                p.display()
            ),
            (None, _) => eprintln!("smartmig: no shipped learned policy for {}", a.model),
        }
    }
    eprintln!(
        "smartmig: {} scenarios on {} {} GPUs; training seeds {}..{train_end}, test seeds {}..{test_end}",
        list.len(),
        a.gpus,
        a.model,
        a.train_seed,
        a.test_seed
    );
    let started = Instant::now();
    let steps_per_scenario = 4 + cfg.candidates.len() as u64 + u64::from(cfg.hindsight);
    let bar = indicatif::ProgressBar::new(list.len() as u64 * steps_per_scenario);
    if std::io::stderr().is_terminal() {
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut results = Vec::new();
    let cluster = vec![a.model; a.gpus];
    for s in &list {
        let days = ScenarioDays {
            name: s.name.clone(),
            cluster: cluster.clone(),
            train: (a.train_seed..train_end)
                .map(|seed| day(s, a.model, a.gpus, seed))
                .collect(),
            test: (a.test_seed..test_end)
                .map(|seed| day(s, a.model, a.gpus, seed))
                .collect(),
            batch: s.is_batch(),
        };
        let mut progress = |step: &str| {
            bar.inc(1);
            bar.set_message(format!("{}: {step}", s.name));
        };
        let r = run_scenario(&days, &cfg, &mut progress)?;
        bar.suspend(|| print!("{}\n", scenario_table(&r)));
        results.push(r);
    }
    bar.finish_and_clear();
    let report = SuiteReport {
        alpha: a.alpha,
        placement: heuristic.to_string(),
        scenarios: results,
        elapsed_s: started.elapsed().as_secs_f64(),
    };
    let mut out = std::io::stdout().lock();
    write!(out, "{}", summary_table(&report))?;
    writeln!(out, "({:.0} s)", report.elapsed_s)?;
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("smartmig: wrote {}", p.display());
    }
    if let Some(dir) = &a.report {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for s in &report.scenarios {
            let p = dir.join(format!("et-{}.svg", s.name.replace(['/', ' '], "-")));
            std::fs::write(&p, et_bars(s)?).with_context(|| format!("writing {}", p.display()))?;
        }
        eprintln!(
            "smartmig: wrote {} plots to {}",
            report.scenarios.len(),
            dir.display()
        );
    }
    Ok(())
}
