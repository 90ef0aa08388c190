//! `smartmig bound`: the energy and tardiness lower bounds of a workload on a
//! cluster (`docs/bounds.md`), for the same workload options as
//! `smartmig simulate` (placement and policy options are accepted and
//! ignored: the bounds hold for every policy and placement).

use std::io::Write;

use anyhow::Result;
use serde::Serialize;

use super::simulate;
use crate::bound::{self, BoundGpu, Bounds};
use crate::sim::SimConfig;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub workload: simulate::Args,
}

#[derive(Serialize)]
struct Out<'a> {
    gpus: usize,
    models: Vec<String>,
    workload: &'a str,
    seed: u64,
    workload_horizon_s: f64,
    bounds: &'a Bounds,
}

pub fn run(args: &Args) -> Result<()> {
    let a = &args.workload;
    let (cluster, jobs, horizon) = simulate::cluster_and_workload(a)?;
    // Same defaults as the simulator: power per model, horizon = the
    // workload's or the last arrival.
    let cfg = SimConfig::default();
    let gpus: Vec<BoundGpu> = cluster
        .iter()
        .map(|&m| BoundGpu {
            model: m,
            power: cfg.power_for(m),
        })
        .collect();
    let horizon = horizon.unwrap_or_else(|| jobs.iter().map(|j| j.arrival).fold(0.0, f64::max));
    let b = bound::compute(&jobs, &gpus, horizon)?;
    let mut models: Vec<String> = cluster
        .iter()
        .map(std::string::ToString::to_string)
        .collect();
    models.dedup();
    a.json.write(&Out {
        gpus: cluster.len(),
        models: models.clone(),
        workload: &a.workload,
        seed: a.seed,
        workload_horizon_s: horizon,
        bounds: &b,
    })?;
    if a.json.to_stdout() {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} jobs on {} GPUs ({}), workload {}, seed {} ({} jobs fit no profile and are left out)",
        b.jobs,
        cluster.len(),
        models.join(", "),
        a.workload,
        a.seed,
        b.excluded
    )?;
    let e = &b.energy;
    let t = &b.tardiness;
    writeln!(out, "energy      >= {:.3} MJ", e.total_j / 1e6)?;
    writeln!(
        out,
        "  idle      >= {:.3} MJ (idle power of every GPU over {:.2} h)",
        e.idle_j / 1e6,
        e.horizon_s / 3600.0
    )?;
    writeln!(
        out,
        "  dynamic   >= {:.3} MJ (every job on its most efficient slice, full GPUs)",
        e.dynamic_j / 1e6
    )?;
    writeln!(
        out,
        "tardiness   >= {:.2} s mean, {:.1} s total",
        t.mean_s, t.total_s
    )?;
    writeln!(
        out,
        "  per job   >= {:.1} s (start at arrival on the whole GPU)",
        t.per_job_total_s
    )?;
    writeln!(
        out,
        "  1 machine >= {:.1} s (cluster as one preemptive machine, SRPT + sorted deadlines)",
        t.single_machine_total_s
    )?;
    writeln!(
        out,
        "late jobs   >= {} ({:.2} %)",
        t.late_jobs,
        100.0 * t.late_share
    )?;
    Ok(())
}
