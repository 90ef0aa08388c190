//! `smartmig bench sim`: simulator throughput (jobs per second) at several
//! cluster sizes, on the diurnal workload.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

use super::args::{GpuModelArg, JsonArg, PolicyArgs};
use crate::policy::parse_policy_on;
use crate::sim::{
    simulate, EpochRule, Heuristic, RunHooks, SimConfig, DEFAULT_EPOCH_EVENTS, NODE_GPUS,
};
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
    #[cfg(feature = "train")]
    /// Quality gates and decision latency of the learned policy.
    Policy(super::bench_policy::PolicyArgs),
    #[cfg(feature = "daemon")]
    /// Allocate+release latency and memory of a real smartmigd (sim backend).
    Daemon(super::bench_daemon::Args),
    #[cfg(feature = "daemon")]
    /// A hostile client: holds many connections to a socket, trickling bytes
    /// (what `bench daemon --flood` runs as another user; internal).
    #[command(hide = true)]
    Flood(super::bench_daemon::FloodArgs),
    #[cfg(feature = "train")]
    /// The hindsight rollout oracle: what per-epoch reactivity could gain over static-best.
    Oracle(super::bench_oracle::OracleArgs),
    /// Scenarios x test days x policies against causal opponents (docs/evaluation.md).
    Suite(super::bench_suite::SuiteArgs),
    /// The learned job placement against the heuristics, under each
    /// repartitioning policy (docs/evaluation.md, "Placement").
    Placement(super::bench_placement::PlacementArgs),
    /// Bags of jobs on whole GPUs, a static layout chosen on other bags and
    /// dynamic policies, beside the MIG study's ratios (docs/oom-and-memory.md, section 7).
    Throughput(super::bench_throughput::ThroughputArgs),
    /// Per-node decisions (whole queue, claimed share) against one central
    /// decider on a large cluster: reconfigurations, wasted reshapes, ET
    /// (docs/evaluation.md, "Coordination across nodes").
    Coordination(super::bench_coordination::CoordinationArgs),
}

#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// Cluster sizes, comma-separated.
    #[arg(long, default_value = "8,100,1000", value_delimiter = ',')]
    pub gpus: Vec<usize>,
    /// Jobs per run, comma-separated (the diurnal workload is stretched
    /// over as many days as needed); with several, a last table puts the
    /// jobs/s of each size side by side.
    #[arg(long, default_value = "200000", value_delimiter = ',')]
    pub jobs: Vec<usize>,
    #[command(flatten)]
    pub gpu: GpuModelArg,
    #[arg(long, default_value = "edf")]
    pub placement: String,
    /// Default `static:4444|3333`.
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Ask the policy after this many arrival or completion events, on any
    /// cluster size. Default: 5 per 8-GPU node (`EpochRule::per_node_events`),
    /// the cadence each GPU gets on the 8-GPU clusters the policies are
    /// trained and scored on; `--epoch-events 5` is the old fixed rule.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub epoch_events: Option<u32>,
    #[command(flatten)]
    pub json: JsonArg,
}

/// One run: its speed and, so that a faster simulator can be checked to
/// give the same results, what it computed.
#[derive(Serialize)]
struct Row {
    policy: String,
    gpus: usize,
    jobs: usize,
    events: u64,
    generate_s: f64,
    simulate_s: f64,
    jobs_per_s: f64,
    completed: u64,
    unserved: u64,
    energy_j: f64,
    mean_tardiness_s: f64,
    reconfigurations: u64,
}

pub fn run(a: &Args) -> Result<()> {
    match &a.target {
        Target::Sim(s) => run_sim(s),
        #[cfg(feature = "train")]
        Target::Policy(p) => super::bench_policy::run(p),
        #[cfg(feature = "daemon")]
        Target::Daemon(d) => super::bench_daemon::run(d),
        #[cfg(feature = "daemon")]
        Target::Flood(f) => super::bench_daemon::flood(f),
        #[cfg(feature = "train")]
        Target::Oracle(o) => super::bench_oracle::run(o),
        Target::Suite(s) => super::bench_suite::run(s),
        Target::Placement(p) => super::bench_placement::run(p),
        Target::Throughput(t) => super::bench_throughput::run(t),
        Target::Coordination(c) => super::bench_coordination::run(c),
    }
}

fn run_sim(a: &SimArgs) -> Result<()> {
    let heuristic: Heuristic = a.placement.parse()?;
    if a.jobs.is_empty() || a.jobs.contains(&0) {
        anyhow::bail!("--jobs: give one or more job counts, each at least 1");
    }
    let mut rows = Vec::new();
    let policies = a.policy.or(&["static:4444|3333"]);
    let mut out = a.json.table();
    let cadence = match a.epoch_events {
        Some(n) => format!("every {n} events"),
        None => format!("every {DEFAULT_EPOCH_EVENTS} events per {NODE_GPUS} GPUs"),
    };
    writeln!(
        out,
        "diurnal workload on {}, placement {}, policy asked {cadence}",
        a.gpu.gpu_model, heuristic
    )?;
    let w = policies.iter().map(String::len).max().unwrap_or(0).max(6);
    writeln!(
        out,
        "{:<w$} {:>6} {:>10} {:>11} {:>9} {:>9} {:>12} {:>12} {:>10} {:>8}",
        "policy",
        "GPUs",
        "jobs",
        "events",
        "gen s",
        "sim s",
        "jobs/s",
        "energy MJ",
        "tard. s",
        "reconf."
    )?;
    for spec in &policies {
        for &gpus in &a.gpus {
            for &jobs in &a.jobs {
                let row = sim_row(a, heuristic, spec, gpus, jobs)?;
                writeln!(
                    out,
                    "{:<w$} {:>6} {:>10} {:>11} {:>9.2} {:>9.2} {:>12.0} {:>12.3} {:>10.2} {:>8}",
                    row.policy,
                    row.gpus,
                    row.jobs,
                    row.events,
                    row.generate_s,
                    row.simulate_s,
                    row.jobs_per_s,
                    row.energy_j / 1e6,
                    row.mean_tardiness_s,
                    row.reconfigurations
                )?;
                rows.push(row);
            }
        }
    }
    if a.jobs.len() > 1 {
        writeln!(out)?;
        write!(out, "{:<w$} {:>6}", "jobs/s", "GPUs")?;
        for jobs in &a.jobs {
            write!(out, " {:>12}", format!("at {jobs}"))?;
        }
        writeln!(out, " {:>10}", "last/first")?;
        for chunk in rows.chunks(a.jobs.len()) {
            write!(out, "{:<w$} {:>6}", chunk[0].policy, chunk[0].gpus)?;
            for r in chunk {
                write!(out, " {:>12.0}", r.jobs_per_s)?;
            }
            let ratio = chunk[chunk.len() - 1].jobs_per_s / chunk[0].jobs_per_s;
            writeln!(out, " {ratio:>10.2}")?;
        }
    }
    a.json.write(&rows)
}

/// The decision cadence of a run on `gpus` GPUs.
fn epoch_rule(a: &SimArgs, gpus: usize) -> EpochRule {
    match a.epoch_events {
        Some(n) => EpochRule::Events(n),
        None => EpochRule::per_node_events(DEFAULT_EPOCH_EVENTS, gpus),
    }
}

/// Generates `jobs` diurnal jobs for `gpus` GPUs and simulates them once.
fn sim_row(a: &SimArgs, heuristic: Heuristic, spec: &str, gpus: usize, jobs: usize) -> Result<Row> {
    let day = DiurnalConfig::default();
    let per_day = day.expected_jobs(gpus).max(1.0);
    // Days of the diurnal workload for `jobs`, 2 % extra; a run that
    // still comes up short (a partial day is lighter than the mean) is
    // regenerated over a longer span, so every row has `jobs` jobs.
    let mut days = (jobs as f64 * 1.02 / per_day).max(0.01);
    let t0 = Instant::now();
    let mut workload = loop {
        let cfg = DiurnalConfig {
            horizon_s: day.horizon_s * days,
            ..day
        };
        cfg.validate().context("diurnal workload")?;
        let w = generate_diurnal(&cfg, a.gpu.gpu_model, gpus, a.seed);
        if w.len() >= jobs {
            break w;
        }
        days *= 1.5;
    };
    workload.truncate(jobs);
    let generate_s = t0.elapsed().as_secs_f64();
    let cluster = vec![a.gpu.gpu_model; gpus];
    let mut policy = parse_policy_on(spec, &cluster, 0.0)?;
    let mut h = heuristic.build(a.seed);
    let sim_cfg = SimConfig {
        epoch: epoch_rule(a, gpus),
        seed: a.seed,
        workload_horizon_s: workload.last().map(|j| j.arrival),
        ..SimConfig::default()
    };
    let t1 = Instant::now();
    let r = simulate(
        &cluster,
        &workload,
        h.as_mut(),
        policy.as_mut(),
        &sim_cfg,
        RunHooks::default(),
    )?;
    let simulate_s = t1.elapsed().as_secs_f64();
    Ok(Row {
        policy: spec.to_string(),
        gpus,
        jobs: workload.len(),
        events: r.metrics.events,
        generate_s,
        simulate_s,
        jobs_per_s: workload.len() as f64 / simulate_s.max(1e-9),
        completed: r.metrics.completed,
        unserved: r.metrics.unserved + r.metrics.rejected,
        energy_j: r.metrics.energy_j,
        mean_tardiness_s: r.metrics.mean_tardiness_s,
        reconfigurations: r.metrics.reconfigurations,
    })
}
