//! `smartmig bench suite`: every scenario family x test days x policies,
//! against the opponents a site would run without smartmig (whole GPUs, a
//! static or twice-daily layout fitted on *past* days), with the hindsight
//! references and the lower bound beside them. `docs/evaluation.md`
//! explains every column and choice.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::args::{slurm_like, JsonArg, ScenarioDaysArgs};
use super::learned::shipped_learned;
use crate::eval::{
    best_runnable, gate_rows, run_scenario, suite_gates, Day, RowKind, ScenarioDays,
    ScenarioResult, SuiteConfig, SuiteReport,
};
use crate::mig::GpuModel;
use crate::policy::search::{SearchConfig, SwitchHours};
use crate::report::suite::{
    et_bars, gates_table, runnable_table, scenario_table, suite_gates_table, summary_table,
};
use crate::scenario::{
    default_scenarios, parse_scenarios, select_scenarios, DeadlineRegime, Scenario,
};
use crate::sim::{Heuristic, SimConfig};
use crate::workload::{gpus_for_load, read_trace, TraceFormat, TraceOptions};

/// Test days per scenario by default (issue 54): three blocks of 16 days
/// disagreed by 5 % on four, so four days could not tell 3 % apart.
pub const DEFAULT_TEST_DAYS: usize = 48;

#[derive(Debug, clap::Args)]
pub struct SuiteArgs {
    #[command(flatten)]
    pub days: ScenarioDaysArgs,
    /// Scenarios file (TOML, `[[scenario]]` tables; the built-in list is
    /// `sidecar/lab/src/scenarios.toml`).
    #[arg(long, value_name = "FILE")]
    pub scenarios: Option<PathBuf>,
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
    /// Also print, for each of our policies, the gate table: ET against the
    /// best causal opponent, the worst test day against the better of
    /// `none` and `static-hist`, reconfigurations per GPU per day.
    #[arg(long)]
    pub gates: bool,
    /// Leave out the hindsight references (searched on each test day).
    #[arg(long)]
    pub no_hindsight: bool,
    #[command(flatten)]
    pub json: JsonArg,
    /// The shadow rule of the `<learned>+shadow` rows
    /// (`every=S&window=S&margin=X&hold=N`, over the defaults
    /// every=1800&window=10800&margin=0.02&hold=2; docs/policy.md).
    #[arg(long, value_name = "RULE", default_value = "")]
    pub shadow: String,
    /// The shadow's fallbacks, in order (comma-separated): `static-hist`
    /// (the layout fitted on the training days), `none`, or a policy spec
    /// such as `greedy` (the default pair was the better of `static-hist`
    /// alone and both on seeds 500-503, docs/policy.md).
    #[arg(long, value_delimiter = ',', default_value = "static-hist,greedy")]
    pub shadow_fallback: Vec<String>,
    /// Where our learned policies begin each day: `fitted` (the static
    /// layout fitted on the training days, where `static-hist` starts; the
    /// better start on the validation days of all three models,
    /// docs/policy.md) or `own` (the file's initial layout, whole GPUs for
    /// the shipped files). Greedy always starts from its own.
    #[arg(long, value_name = "WHERE", default_value = "fitted", value_parser = ["own", "fitted"])]
    pub start: String,
    /// Write one SVG bar chart per scenario into DIR.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Score the policies in the simulator's Slurm-like mode (Slurm counts
    /// shards, smartmigd builds instances and requeues what it cannot
    /// build; `smartmig simulate --slurm-like`, same SPEC). Whole GPUs and
    /// the fixed layouts (the opponents, served by Slurm's own GRES) stay
    /// in the central view.
    #[arg(long, value_name = "SPEC", num_args = 0..=1, default_missing_value = "")]
    pub slurm_like: Option<String>,
    /// Scenarios scored at once, one thread each (default: the machine's
    /// cores). Every scenario is deterministic and independent of the
    /// others, so the figures are the same for any value.
    #[arg(long, value_name = "N")]
    pub jobs: Option<std::num::NonZeroUsize>,
}

/// Scores the scenarios on `threads` threads and hands each result to
/// `print` in the scenarios' order, as soon as it and those before it are
/// done. Each scenario is deterministic and independent, so the results
/// are those of one thread; the first error stops the threads from taking
/// more scenarios and is returned.
fn run_all(
    all: &[ScenarioDays],
    cfg: &SuiteConfig,
    threads: usize,
    bar: &indicatif::ProgressBar,
    print: &mut dyn FnMut(&ScenarioResult) -> Result<()>,
) -> Result<Vec<ScenarioResult>> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, all.len().max(1)) {
            let (tx, next, stop) = (tx.clone(), &next, &stop);
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(days) = all.get(i) else { break };
                    let mut progress = |step: &str| {
                        bar.inc(1);
                        bar.set_message(format!("{}: {step}", days.name));
                    };
                    let r = run_scenario(days, cfg, &mut progress);
                    if tx.send((i, r)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut done: Vec<Option<ScenarioResult>> = all.iter().map(|_| None).collect();
        let mut printed = 0;
        for (i, r) in rx {
            match r {
                Ok(r) => done[i] = Some(r),
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e.into());
                }
            }
            while let Some(Some(r)) = done.get(printed) {
                if let Err(e) = print(r) {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                printed += 1;
            }
        }
        Ok(done.into_iter().flatten().collect())
    })
}

/// The trace options `bench suite` and `bench oracle` share.
#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// Replay windows of this trace (two scenarios: tight and loose
    /// sampled deadlines): the last windows with jobs are the test days,
    /// the earlier ones the training days (`bench suite` adds them to its
    /// scenarios, `bench oracle` runs them instead).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Format of `--trace` (csv, alibaba, sacct).
    #[arg(long, default_value = "alibaba")]
    pub trace_format: String,
    /// Window length for `--trace`, hours (the whole trace is cut into
    /// windows of this length; `--window-h` is the old spelling).
    #[arg(
        long = "trace-window",
        value_name = "LEN_H",
        default_value_t = 24.0,
        alias = "window-h"
    )]
    pub window_h: f64,
    /// Size the `--trace` cluster so the peak hour's demand of the busiest
    /// training window is this share of it (overrides --gpus for the trace).
    #[arg(long, default_value_t = 0.8)]
    pub trace_load: f64,
    /// `--trace` windows with fewer jobs are skipped.
    #[arg(long, default_value_t = 20)]
    pub min_window_jobs: usize,
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
    select_scenarios(all, &a.days.only).context("--only")
}

/// One generated day of `s`.
pub(super) fn day(s: &Scenario, model: GpuModel, gpus: usize, seed: u64) -> Day {
    Day::generated(
        s.generate(model, gpus, seed),
        seed,
        s.horizon_s(),
        s.start_hour(),
    )
}

/// Where trace scenarios come from (`bench suite --trace`, `bench oracle
/// --trace`).
pub(super) struct TraceSource<'a> {
    pub path: &'a std::path::Path,
    pub format: &'a str,
    pub model: GpuModel,
    pub seed: u64,
    pub window_h: f64,
    pub load: f64,
    pub min_window_jobs: usize,
}

impl TraceArgs {
    /// The trace to replay for `model`, deadlines sampled from `seed`
    /// (`None` without `--trace`).
    pub(super) fn source(&self, model: GpuModel, seed: u64) -> Option<TraceSource<'_>> {
        self.trace.as_deref().map(|path| TraceSource {
            path,
            format: &self.trace_format,
            model,
            seed,
            window_h: self.window_h,
            load: self.trace_load,
            min_window_jobs: self.min_window_jobs,
        })
    }
}

/// The search of `--quick` runs (`bench suite`, `oracle`, `placement`,
/// `throughput`): fewer split pairs and mixes, coarser switch hours.
pub(super) fn quick_search() -> SearchConfig {
    SearchConfig {
        pair_top: 5,
        mixes: 2,
        hours: SwitchHours::Narrow,
        ..SearchConfig::default()
    }
}

/// [`quick_search`] with `--quick`, else the full search.
pub(super) fn search_for(quick: bool) -> SearchConfig {
    if quick {
        quick_search()
    } else {
        SearchConfig::default()
    }
}

/// The trace scenarios: one per deadline regime, on the last `train +
/// test` windows that hold jobs (training first, in time order), on a
/// cluster sized by the load from the training windows.
pub(super) fn trace_scenarios(
    a: &TraceSource<'_>,
    train: usize,
    test: usize,
) -> Result<Vec<ScenarioDays>> {
    let path = a.path;
    if !(a.window_h.is_finite() && a.window_h > 0.0) {
        bail!("--trace-window {} is not a number of hours > 0", a.window_h);
    }
    let format: TraceFormat = a.format.parse()?;
    let stem = path
        .file_stem()
        .map_or_else(|| "trace".to_string(), |s| s.to_string_lossy().into_owned());
    let window_s = a.window_h * 3600.0;
    let mut out = Vec::new();
    for regime in DeadlineRegime::ALL {
        let opts = TraceOptions {
            seed: a.seed,
            deadline_factor: regime.factor(),
            ..TraceOptions::new(a.model)
        };
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let trace = read_trace(format, std::io::BufReader::new(file), &opts)
            .with_context(|| format!("reading {format} trace {}", path.display()))?;
        let windows: Vec<(usize, Vec<crate::workload::Job>)> = trace
            .windows(window_s)
            .into_iter()
            .filter(|(_, jobs)| jobs.len() >= a.min_window_jobs)
            .collect();
        if windows.len() < train + test {
            bail!(
                "{}: {} windows of {} h hold at least {} jobs; --train-days {train} + --test-days {test} need {}",
                path.display(),
                windows.len(),
                a.window_h,
                a.min_window_jobs,
                train + test
            );
        }
        let chosen = &windows[windows.len() - train - test..];
        let mut gpus = 1;
        for (_, jobs) in &chosen[..train] {
            gpus = gpus.max(gpus_for_load(jobs, a.model, a.load, 3600.0)?);
        }
        let day = |(k, jobs): &(usize, Vec<crate::workload::Job>)| Day {
            label: format!("window {k}"),
            jobs: jobs.clone(),
            cfg: SimConfig {
                seed: a.seed,
                workload_horizon_s: Some(window_s),
                ..SimConfig::default()
            },
        };
        eprintln!(
            "smartmig: {stem}/{regime}: {gpus} GPUs (peak-hour demand {} of the busiest training window), {} h windows",
            a.load, a.window_h
        );
        out.push(ScenarioDays {
            name: format!("{stem}/{regime}"),
            cluster: vec![a.model; gpus],
            train: chosen[..train].iter().map(day).collect(),
            test: chosen[train..].iter().map(day).collect(),
            batch: false,
            trace: true,
        });
    }
    Ok(out)
}

pub fn run(a: &SuiteArgs) -> Result<()> {
    let gpus = a.days.gpus.unwrap_or(if a.days.quick { 8 } else { 16 });
    if gpus == 0 {
        bail!("--gpus must be at least 1");
    }
    let heuristic: Heuristic = a.placement.parse()?;
    let seeds = Seeds::of(a)?;
    let list = scenarios(a)?;
    for s in &list {
        s.validate()
            .with_context(|| format!("scenario {}", s.name))?;
    }
    let cfg = suite_config(a, heuristic)?;
    eprintln!(
        "smartmig: {} scenarios on {} {} GPUs; training seeds {}..{}, test seeds {}..{}",
        list.len(),
        gpus,
        a.days.gpu.gpu_model,
        a.days.train_seed,
        seeds.train_end,
        a.days.test_seed,
        seeds.test_end
    );
    let started = Instant::now();
    let steps_per_scenario = 7
        + (cfg.candidates.len() + cfg.fallback_for.len() + cfg.shadow_for.len()) as u64
        + u64::from(cfg.hindsight);
    let bar = progress_bar(list.len() as u64 * steps_per_scenario);
    let all = all_days(a, &list, gpus, &seeds)?;
    bar.set_length(all.len() as u64 * steps_per_scenario);
    let threads = a
        .jobs
        .or_else(|| std::thread::available_parallelism().ok())
        .map_or(1, std::num::NonZeroUsize::get);
    let results = run_all(&all, &cfg, threads, &bar, &mut |r| {
        bar.suspend(|| writeln!(a.json.table(), "{}", scenario_table(r)))?;
        Ok(())
    })?;
    bar.finish_and_clear();
    let report = SuiteReport {
        alpha: a.alpha,
        placement: heuristic.to_string(),
        best_runnable: best_runnable(&results),
        scenarios: results,
        elapsed_s: started.elapsed().as_secs_f64(),
    };
    let mut out = a.json.table();
    write!(out, "{}", summary_table(&report))?;
    if a.gates {
        write_gates(&mut out, &report)?;
    }
    writeln!(out, "({:.0} s)", report.elapsed_s)?;
    a.json.write(&report)?;
    if let Some(p) = a.json.json.as_ref().filter(|_| !a.json.to_stdout()) {
        eprintln!("smartmig: wrote {}", p.display());
    }
    if let Some(dir) = &a.report {
        write_plots(dir, &report)?;
    }
    Ok(())
}

/// The training and test days and where their seeds end; the two ranges
/// must not overlap (a baseline fitted on a test day is not causal).
struct Seeds {
    train_days: usize,
    test_days: usize,
    train_end: u64,
    test_end: u64,
}

impl Seeds {
    fn of(a: &SuiteArgs) -> Result<Seeds> {
        let train_days = a
            .days
            .train_days
            .unwrap_or(if a.days.quick { 3 } else { 8 });
        let test_days =
            a.days
                .test_days
                .unwrap_or(if a.days.quick { 2 } else { DEFAULT_TEST_DAYS });
        if train_days == 0 || test_days == 0 {
            bail!("--train-days and --test-days must be at least 1");
        }
        let train_end = a.days.train_seed.saturating_add(train_days as u64);
        let test_end = a.days.test_seed.saturating_add(test_days as u64);
        if a.days.train_seed < test_end && a.days.test_seed < train_end {
            bail!(
                "training seeds {}..{train_end} and test seeds {}..{test_end} overlap: a baseline fitted on a test day is not causal",
                a.days.train_seed,
                a.days.test_seed
            );
        }
        Ok(Seeds {
            train_days,
            test_days,
            train_end,
            test_end,
        })
    }
}

/// The suite's settings: the candidates (`--policy`, else the shipped
/// learned policy when it exists), each learned one also behind the
/// fallback and the shadow rule.
fn suite_config(a: &SuiteArgs, heuristic: Heuristic) -> Result<SuiteConfig> {
    let mut cfg = SuiteConfig {
        alpha: a.alpha,
        heuristic,
        hindsight: !a.no_hindsight,
        search: search_for(a.days.quick),
        ..SuiteConfig::default()
    };
    cfg.candidates
        .extend(a.policy.iter().map(|p| (p.clone(), p.clone())));
    if !a.policy.iter().any(|s| s.starts_with("policy:")) {
        if let Some(spec) = shipped_learned(a.days.gpu.gpu_model) {
            cfg.candidates.push(("learned".into(), spec));
        }
    }
    // Do no harm: every learned policy is also scored as it would run on a
    // site that checks it against its past days first (eval::fallback).
    cfg.fallback_for = cfg
        .candidates
        .iter()
        .filter(|(_, spec)| spec.starts_with("policy:"))
        .map(|(name, _)| name.clone())
        .collect();
    // ... and as it runs with the shadow rule switching it during the day.
    cfg.shadow_for.clone_from(&cfg.fallback_for);
    cfg.shadow_fallbacks.clone_from(&a.shadow_fallback);
    cfg.start_fitted = a.start == "fitted";
    cfg.shadow = crate::policy::shadow::ShadowRule::default()
        .with_overrides(&a.shadow)
        .context("--shadow")?;
    Ok(cfg)
}

/// The progress bar on stderr, hidden when it is not a terminal.
fn progress_bar(len: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    if std::io::stderr().is_terminal() {
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}

/// Every scenario's training and test days (the generated ones, then
/// those of `--trace`), in `--slurm-like` mode when asked.
fn all_days(
    a: &SuiteArgs,
    list: &[Scenario],
    gpus: usize,
    seeds: &Seeds,
) -> Result<Vec<ScenarioDays>> {
    let (train_end, test_end) = (seeds.train_end, seeds.test_end);
    let cluster = vec![a.days.gpu.gpu_model; gpus];
    let mut all: Vec<ScenarioDays> = list
        .iter()
        .map(|s| ScenarioDays {
            name: s.name.clone(),
            cluster: cluster.clone(),
            train: (a.days.train_seed..train_end)
                .map(|seed| day(s, a.days.gpu.gpu_model, gpus, seed))
                .collect(),
            test: (a.days.test_seed..test_end)
                .map(|seed| day(s, a.days.gpu.gpu_model, gpus, seed))
                .collect(),
            batch: s.is_batch(),
            trace: false,
        })
        .collect();
    if let Some(source) = a.trace.source(a.days.gpu.gpu_model, a.days.train_seed) {
        all.extend(trace_scenarios(&source, seeds.train_days, seeds.test_days)?);
    }
    let slurm = slurm_like(a.slurm_like.as_deref())?;
    for d in all
        .iter_mut()
        .flat_map(|s| s.train.iter_mut().chain(s.test.iter_mut()))
    {
        d.cfg.slurm.clone_from(&slurm);
    }
    Ok(all)
}

/// The gate tables of each of our policies, generated and trace
/// scenarios apart, then the best runnable policies.
fn write_gates(out: &mut impl Write, report: &SuiteReport) -> Result<()> {
    let mut ours: Vec<&str> = Vec::new();
    for row in report.scenarios.iter().flat_map(|s| &s.rows) {
        if row.kind == RowKind::Candidate && !ours.contains(&row.policy.as_str()) {
            ours.push(&row.policy);
        }
    }
    // Generated and trace scenarios are gated apart: a gate met only
    // thanks to one kind is not met (issue 54).
    let (traces, generated): (Vec<ScenarioResult>, Vec<ScenarioResult>) =
        report.scenarios.iter().cloned().partition(|s| s.trace);
    for (kind, group) in [("generated", &generated), ("trace", &traces)] {
        if group.is_empty() {
            continue;
        }
        for p in &ours {
            writeln!(out)?;
            writeln!(out, "[{kind} scenarios]")?;
            write!(out, "{}", gates_table(p, &gate_rows(group, p)))?;
            if let Some(g) = suite_gates(group, p) {
                write!(out, "{}", suite_gates_table(&g))?;
            }
        }
    }
    writeln!(out)?;
    write!(out, "{}", runnable_table(&report.best_runnable))?;
    Ok(())
}

/// One SVG bar chart of ET per scenario into `dir`.
fn write_plots(dir: &std::path::Path, report: &SuiteReport) -> Result<()> {
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
    Ok(())
}
