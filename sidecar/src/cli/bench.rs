//! `smartmig bench sim`: simulator throughput (jobs per second) at several
//! cluster sizes, on the diurnal workload.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::mig::GpuModel;
use crate::policy::parse_policy;
use crate::sim::{simulate, Heuristic, RunHooks, SimConfig};
use crate::workload::{generate_diurnal, DiurnalConfig};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub target: Target,
}

#[derive(Debug, clap::Subcommand)]
pub enum Target {
    /// Jobs simulated per second at 8, 100 and 1,000 GPUs.
    Sim(SimArgs),
    /// Quality gates and decision latency of the learned policy.
    Policy(super::bench_policy::PolicyArgs),
    /// Allocate+release latency and memory of a real smartmigd (sim backend).
    Daemon(super::bench_daemon::Args),
    /// The hindsight rollout oracle: what per-epoch reactivity could gain over static-best.
    Oracle(super::bench_oracle::OracleArgs),
    /// Scenarios x test days x policies against causal opponents (docs/evaluation.md).
    Suite(super::bench_suite::SuiteArgs),
}

#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// Cluster sizes, comma-separated.
    #[arg(long, default_value = "8,100,1000", value_delimiter = ',')]
    pub gpus: Vec<usize>,
    /// Jobs per run (the diurnal workload is stretched over as many days as needed).
    #[arg(long, default_value_t = 200_000)]
    pub jobs: usize,
    #[arg(long, default_value = "a100-40gb")]
    pub model: GpuModel,
    #[arg(long, default_value = "edf")]
    pub placement: String,
    #[arg(long, default_value = "static:4444|3333")]
    pub policy: String,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the table as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Serialize)]
struct Row {
    gpus: usize,
    jobs: usize,
    events: u64,
    generate_s: f64,
    simulate_s: f64,
    jobs_per_s: f64,
    completed: u64,
    unserved: u64,
}

pub fn run(a: &Args) -> Result<()> {
    match &a.target {
        Target::Sim(s) => run_sim(s),
        Target::Policy(p) => super::bench_policy::run(p),
        Target::Daemon(d) => super::bench_daemon::run(d),
        Target::Oracle(o) => super::bench_oracle::run(o),
        Target::Suite(s) => super::bench_suite::run(s),
    }
}

fn run_sim(a: &SimArgs) -> Result<()> {
    let heuristic: Heuristic = a.placement.parse()?;
    let mut rows = Vec::new();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "diurnal workload on {}, placement {}, policy {}",
        a.model, heuristic, a.policy
    )?;
    writeln!(
        out,
        "{:>6} {:>10} {:>11} {:>9} {:>9} {:>12}",
        "GPUs", "jobs", "events", "gen s", "sim s", "jobs/s"
    )?;
    for &gpus in &a.gpus {
        let day = DiurnalConfig::default();
        let per_day = day.expected_jobs(gpus).max(1.0);
        let cfg = DiurnalConfig {
            // 2 % extra so that truncating to `jobs` rarely runs short.
            horizon_s: day.horizon_s * (a.jobs as f64 * 1.02 / per_day).max(0.01),
            ..day
        };
        cfg.validate().context("diurnal workload")?;
        let t0 = Instant::now();
        let mut jobs = generate_diurnal(&cfg, a.model, gpus, a.seed);
        jobs.truncate(a.jobs);
        let generate_s = t0.elapsed().as_secs_f64();
        let cluster = vec![a.model; gpus];
        let mut policy = parse_policy(&a.policy, &[a.model])?;
        let mut h = heuristic.build(a.seed);
        let sim_cfg = SimConfig {
            seed: a.seed,
            workload_horizon_s: jobs.last().map(|j| j.arrival),
            ..SimConfig::default()
        };
        let t1 = Instant::now();
        let r = simulate(
            &cluster,
            &jobs,
            h.as_mut(),
            policy.as_mut(),
            &sim_cfg,
            RunHooks::default(),
        )?;
        let simulate_s = t1.elapsed().as_secs_f64();
        let row = Row {
            gpus,
            jobs: jobs.len(),
            events: r.metrics.events,
            generate_s,
            simulate_s,
            jobs_per_s: jobs.len() as f64 / simulate_s.max(1e-9),
            completed: r.metrics.completed,
            unserved: r.metrics.unserved + r.metrics.rejected,
        };
        writeln!(
            out,
            "{:>6} {:>10} {:>11} {:>9.2} {:>9.2} {:>12.0}",
            row.gpus, row.jobs, row.events, row.generate_s, row.simulate_s, row.jobs_per_s
        )?;
        rows.push(row);
    }
    if let Some(p) = &a.json {
        let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
        serde_json::to_writer_pretty(f, &rows)?;
    }
    Ok(())
}
