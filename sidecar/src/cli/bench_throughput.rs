//! `smartmig bench throughput`: the throughput experiment of issue 24
//! (`docs/oom-and-memory.md`, section 7). Bags of jobs at t = 0 on whole
//! GPUs one job at a time, on a static layout chosen on other bags, and
//! with dynamic policies (fusion/fission, OOM restart, memory estimates),
//! beside the headline ratios of the MIG study (arXiv 2508.18556).

use std::io::{IsTerminal, Write};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::args::{GpuModelArg, JsonArg};
use crate::eval::throughput::{ArmKind, STUDY_LLM_INFERENCE};
use crate::eval::{run_bag, Bag, BagResult, ThroughputConfig};
use crate::sim::Heuristic;

#[derive(Debug, clap::Args)]
pub struct ThroughputArgs {
    /// GPUs of the simulated cluster (default 1: the study measured one A100).
    #[arg(long, default_value_t = 1)]
    pub gpus: usize,
    #[command(flatten)]
    pub gpu: GpuModelArg,
    /// Bags to run (comma-separated): ml, scientific.
    #[arg(long, value_delimiter = ',', default_value = "ml,scientific")]
    pub bags: Vec<String>,
    /// Jobs per GPU in each bag (default 100; 40 with --quick).
    #[arg(long)]
    pub jobs_per_gpu: Option<u32>,
    /// Scored bags (comma-separated seeds; default 1000-1009, 1000-1002
    /// with --quick).
    #[arg(long, value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// Training bags the static layout is searched on (comma-separated
    /// seeds, disjoint from --seeds; default 0-7, 0-2 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub train_seeds: Vec<u64>,
    /// Job-placement heuristic of every arm.
    #[arg(long, default_value = "edf")]
    pub placement: String,
    /// Extra dynamic policy (repeatable) besides greedy; the shipped
    /// learned policy joins by itself when it and ONNX Runtime exist.
    #[arg(long, value_name = "SPEC")]
    pub policy: Vec<String>,
    /// Leave out the hindsight reference (the static search on each scored bag).
    #[arg(long)]
    pub no_hindsight: bool,
    /// Fewer and smaller bags, a smaller search (well under a minute).
    #[arg(long)]
    pub quick: bool,
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Serialize)]
struct Report<'a> {
    bags: &'a [BagResult],
    /// The study's LLM-inference ratios, which no bag of ours matches.
    study_llm_inference: crate::eval::throughput::StudyRatios,
    elapsed_s: f64,
}

pub fn run(a: &ThroughputArgs) -> Result<()> {
    let bags = a
        .bags
        .iter()
        .map(|b| b.parse::<Bag>().with_context(|| format!("--bags {b}")))
        .collect::<Result<Vec<_>>>()?;
    if bags.is_empty() {
        bail!("--bags: name at least one bag (ml, scientific)");
    }
    let heuristic: Heuristic = a
        .placement
        .parse()
        .with_context(|| format!("--placement {}", a.placement))?;
    let jobs_per_gpu = a.jobs_per_gpu.unwrap_or(if a.quick { 40 } else { 100 });
    let mut cfg = ThroughputConfig::new(a.gpu.gpu_model, a.gpus, jobs_per_gpu);
    cfg.heuristic = heuristic;
    cfg.hindsight = !a.no_hindsight;
    if a.quick {
        cfg.train_seeds = (0..3).collect();
        cfg.test_seeds = (1000..1003).collect();
        cfg.search = super::bench_suite::quick_search();
    }
    if !a.seeds.is_empty() {
        cfg.test_seeds.clone_from(&a.seeds);
    }
    if !a.train_seeds.is_empty() {
        cfg.train_seeds.clone_from(&a.train_seeds);
    }
    cfg.dynamic
        .extend(a.policy.iter().map(|p| (p.clone(), p.clone())));
    if a.policy.is_empty() {
        match (
            crate::policy::onnx::shipped_policy(a.gpu.gpu_model),
            crate::policy::onnx::find_onnxruntime(),
        ) {
            (Some(p), Ok(_)) => cfg
                .dynamic
                .push(("learned".into(), format!("policy:{}", p.display()))),
            (Some(p), Err(e)) => eprintln!(
                "smartmig: leaving the learned policy {} out: {e}",
                p.display()
            ),
            (None, _) => eprintln!(
                "smartmig: no shipped learned policy for {}",
                a.gpu.gpu_model
            ),
        }
    }
    // Refuse bad sizes, overlapping seeds or a bad policy before minutes of work.
    cfg.validate()?;
    let started = Instant::now();
    let verbose = std::io::stderr().is_terminal();
    let mut results = Vec::new();
    let mut out = a.json.table();
    for bag in bags {
        let mut progress = |step: &str| {
            if verbose {
                eprintln!("{bag}: {step}");
            }
        };
        let r = run_bag(bag, &cfg, &mut progress).with_context(|| format!("bag {bag}"))?;
        write!(out, "{}", table(&r))?;
        results.push(r);
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    writeln!(
        out,
        "\nstudy, LLM inference: {:.2}x throughput, {:.2}x energy (no bag of ours: \
         the project has no measured LLM curve or memory; docs/oom-and-memory.md section 7)\n({elapsed_s:.0} s)",
        STUDY_LLM_INFERENCE.throughput, STUDY_LLM_INFERENCE.energy
    )?;
    a.json.write(&Report {
        bags: &results,
        study_llm_inference: STUDY_LLM_INFERENCE,
        elapsed_s,
    })
}

/// One bag: an arm per row (means over the scored bags; ratios mean and
/// worst bag), the study's ratios and the bound under it.
fn table(r: &BagResult) -> String {
    let seeds = |s: &[u64]| match (s.first(), s.last()) {
        (Some(a), Some(b)) if s.len() > 1 => format!("{a}-{b}"),
        (Some(a), _) => a.to_string(),
        _ => String::new(),
    };
    let mut t = format!(
        "\n{} bag: {} jobs at t = 0 on {} x {}, scored bags {} ({}), static layout searched on bags {}: {}\n",
        r.bag,
        r.jobs_per_bag,
        r.gpus,
        r.model,
        seeds(&r.test_seeds),
        r.test_seeds.len(),
        seeds(&r.train_seeds),
        r.static_layout,
    );
    t += &format!(
        "{:<20} {:>6} {:>10} {:>8} {:>10} {:>9} {:>6} {:>6} {:>5} {:>15} {:>15}\n",
        "arm",
        "jobs",
        "makespan h",
        "jobs/h",
        "energy MJ",
        "kJ/job",
        "fus.",
        "fis.",
        "OOM",
        "thru x (worst)",
        "energy x (worst)"
    );
    for a in &r.arms {
        let s = &a.summary;
        let name = match a.kind {
            ArmKind::Hindsight => format!("{} *", a.name),
            _ => a.name.clone(),
        };
        t += &format!(
            "{:<20} {:>6.0} {:>10.2} {:>8.2} {:>10.2} {:>9.1} {:>6.1} {:>6.1} {:>5.1} {:>15} {:>15}\n",
            name,
            s.completed,
            s.makespan_h,
            s.jobs_per_hour,
            s.energy_mj,
            s.energy_per_job_kj,
            s.fusions,
            s.fissions,
            s.oom_runs,
            format!("{:.2} ({:.2})", s.throughput_ratio, s.worst_throughput_ratio),
            format!("{:.2} ({:.2})", s.energy_ratio, s.worst_energy_ratio),
        );
    }
    let max_ratio = r
        .bounds
        .iter()
        .map(|b| b.max_ratio)
        .fold(f64::NEG_INFINITY, f64::max);
    t += &format!(
        "{:<20} {:>88} {:>15}\n",
        "study (\"up to\")",
        format!("{:.2}", r.study.throughput),
        format!("{:.2}", r.study.energy)
    );
    t += &format!(
        "bound: whole-GPU work / work on the best slices {:.2} (mean); no arm can exceed {:.2} (whole-GPU makespan / makespan lower bound, largest bag)\n",
        r.mean_ideal_ratio(),
        max_ratio
    );
    if !r.arms.iter().all(|a| a.summary.all_completed) {
        t += "WARNING: some arm did not complete every job (see the JSON)\n";
    }
    t + "(ratios vs whole-gpu on the same bag: throughput = jobs/h ratio, energy = energy per job of whole-gpu / the arm's; * = hindsight reference, searched on the scored bag)\n"
}
