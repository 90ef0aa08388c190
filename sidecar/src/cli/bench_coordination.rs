//! `smartmig bench coordination`: per-node decisions against one central
//! decider on a large cluster (issue 23, part 2; `docs/evaluation.md`,
//! "Coordination across nodes"). The engine is
//! [`crate::eval::coordination`]; this prints its table and writes JSON.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::args::{GpuModelArg, JsonArg, PolicyArgs};
use crate::eval::{run_coordination, CoordinationConfig, CoordinationReport};
use crate::scenario::{default_scenarios, select_scenarios};
use crate::sim::{EpochRule, Heuristic};

#[derive(Debug, clap::Args)]
pub struct CoordinationArgs {
    /// GPUs of the simulated cluster.
    #[arg(long, default_value_t = 1000)]
    pub gpus: usize,
    /// GPUs per node (one smartmigd each); the last node takes what is left.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: usize,
    #[command(flatten)]
    pub gpu: GpuModelArg,
    /// The workload: a scenario of the yardstick (`smartmig bench suite`),
    /// generated for --gpus GPUs, one day per seed.
    #[arg(long, default_value = "campaigns/tight")]
    pub scenario: String,
    /// Offered load: jobs are generated for LOAD x --gpus GPUs (the
    /// scenario's rates are per GPU; 1 = its calibration).
    #[arg(long, default_value_t = 1.0)]
    pub load: f64,
    /// Days (seeds --seed, --seed + 1, ...). At the default size a day
    /// takes about 20 s, most of it the per-node whole-queue row.
    #[arg(long, default_value_t = 5)]
    pub days: u64,
    /// First seed.
    #[arg(long, default_value_t = 1000)]
    pub seed: u64,
    /// Policies to compare, each run centrally and per node (default
    /// `greedy`; e.g. `--policy greedy --policy policy:policies/a100-40gb.onnx`;
    /// the learned policy needs ONNX Runtime: ORT_DYLIB_PATH).
    #[command(flatten)]
    pub policies: PolicyArgs,
    /// Job-placement heuristic.
    #[arg(long, default_value = "edf")]
    pub placement: String,
    /// Seconds between decision epochs (default 60, smartmigd's `epoch_s`).
    #[arg(long, default_value_t = crate::eval::coordination::DAEMON_EPOCH_S)]
    pub epoch_s: f64,
    /// Weight of tardiness in ET.
    #[arg(long, default_value_t = 1.0)]
    pub alpha: f64,
    /// The table and every day's numbers.
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Serialize)]
struct Json<'a> {
    #[serde(flatten)]
    report: &'a CoordinationReport,
    elapsed_s: f64,
    /// Wall time of each row over all days (the first entry: generating
    /// the days and their `none` runs).
    row_seconds: &'a [(String, f64)],
}

fn add_time(times: &mut Vec<(String, f64)>, row: String, s: f64) {
    match times.iter_mut().find(|(r, _)| *r == row) {
        Some((_, t)) => *t += s,
        None => times.push((row, s)),
    }
}

pub fn run(a: &CoordinationArgs) -> Result<()> {
    let heuristic: Heuristic = a
        .placement
        .parse()
        .with_context(|| format!("--placement {}", a.placement))?;
    if a.days == 0 {
        bail!("--days: give at least 1 day");
    }
    if !(a.epoch_s.is_finite() && a.epoch_s > 0.0) {
        bail!(
            "--epoch-s {}: give a finite number of seconds > 0",
            a.epoch_s
        );
    }
    let scenario = select_scenarios(default_scenarios(), std::slice::from_ref(&a.scenario))
        .context("--scenario")?
        .into_iter()
        .find(|s| s.name == a.scenario || s.name.starts_with(&format!("{}/", a.scenario)))
        .with_context(|| format!("--scenario {}", a.scenario))?;
    let last = a
        .seed
        .checked_add(a.days - 1)
        .with_context(|| format!("--seed {} + --days {} overflows", a.seed, a.days))?;
    let mut cfg = CoordinationConfig::new(a.gpu.gpu_model, a.gpus, a.gpus_per_node, scenario);
    cfg.seeds = (a.seed..=last).collect();
    cfg.policies = a.policies.or(&["greedy"]);
    cfg.heuristic = heuristic;
    cfg.load = a.load;
    cfg.epoch = EpochRule::Seconds(a.epoch_s);
    cfg.alpha = a.alpha;
    cfg.validate()?;

    let started = Instant::now();
    let verbose = std::io::stderr().is_terminal();
    // Wall time per row (its runs over all days, audits included): each
    // step lasts until the next one starts.
    let mut times: Vec<(String, f64)> = Vec::new();
    let mut current: Option<(String, Instant)> = None;
    let mut progress = |step: &str| {
        if verbose {
            eprintln!("[{:>6.1} s] {step}", started.elapsed().as_secs_f64());
        }
        let row = step.split(", seed").next().unwrap_or(step).to_string();
        if let Some((r, t)) = current.replace((row, Instant::now())) {
            add_time(&mut times, r, t.elapsed().as_secs_f64());
        }
    };
    let report = run_coordination(&cfg, &mut progress)?;
    if let Some((r, t)) = current.take() {
        add_time(&mut times, r, t.elapsed().as_secs_f64());
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    let mut out = a.json.table();
    write!(out, "{}", table(&report))?;
    let per_row: Vec<String> = times.iter().map(|(r, s)| format!("{r} {s:.1} s")).collect();
    writeln!(
        out,
        "({elapsed_s:.0} s wall time; per row over all days: {})",
        per_row.join(", ")
    )?;
    a.json.write(&Json {
        report: &report,
        elapsed_s,
        row_seconds: &times,
    })
}

/// The table: one row per policy and arrangement, means per day and the
/// worst day.
pub fn table(r: &CoordinationReport) -> String {
    let seeds = match (r.seeds.first(), r.seeds.last()) {
        (Some(a), Some(b)) if r.seeds.len() > 1 => format!("seeds {a}-{b}"),
        (Some(a), _) => format!("seed {a}"),
        _ => String::new(),
    };
    let mut t = format!(
        "{} x {} in {} nodes of {}, {} at load x{} ({} days, {seeds}, {:.0} jobs/day), placement {}, policies asked {}\n",
        r.gpus,
        r.model,
        r.nodes,
        r.gpus_per_node,
        r.scenario,
        r.load,
        r.seeds.len(),
        r.jobs_per_day,
        r.placement,
        r.epoch,
    );
    let w = r
        .rows
        .iter()
        .map(|x| x.label().len())
        .max()
        .unwrap_or(0)
        .max(10);
    t += &format!(
        "{:<w$} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8} {:>7} {:>7} {:>7} {:>10} {:>8} {:>8} {:>8}\n",
        "row",
        "reconf.",
        "created",
        "wasted",
        "undone",
        "wasted%",
        "w. worst",
        "futile",
        "ET",
        "ET wrst",
        "energy MJ",
        "late",
        "tard. s",
        "wait s",
    );
    for x in &r.rows {
        t += &format!(
            "{:<w$} {:>8.1} {:>8.1} {:>8.1} {:>7.1} {:>7.1} {:>8} {:>7.1} {:>7.3} {:>7.3} {:>10.1} {:>8.1} {:>8.1} {:>8.1}\n",
            x.label(),
            x.reconfigurations,
            x.created,
            x.wasted,
            x.destroyed_unused,
            100.0 * x.wasted_share,
            x.worst_wasted,
            x.futile_reconfigurations,
            x.et,
            x.worst_et,
            x.energy_mj,
            x.late_jobs,
            x.mean_tardiness_s,
            x.mean_wait_s,
        );
    }
    t += &format!(
        "(means per day; wasted = instances a reconfiguration created that never ran a job, undone = of those, the ones a later \
         reconfiguration destroyed (the rest were left at the end), wasted% = of created, w. worst = the worst day's wasted; \
         futile = reconfigurations none of whose instances ran a job; \
         ET = (E + {a} T) / (1 + {a}) against none pooled over these days; late = late jobs; {n} audited logs)\n",
        a = r.alpha,
        n = r.audited_logs,
    );
    if r.rows.iter().any(|x| x.unserved > 0) {
        t += "WARNING: some row left jobs unserved (see the JSON)\n";
    }
    t
}
