//! The out-of-memory options of `smartmig simulate` and `--oom-study`, the
//! measurement of issue 9: throughput and energy of one workload under an
//! oracle scheduler, with out-of-memory restarts, and with restarts plus
//! learned memory estimates (`docs/oom-and-memory.md`).

use std::io::Write;

use anyhow::{bail, Context, Result};

use crate::mig::GpuModel;
use crate::policy::parse_policy;
use crate::sim::{simulate, Heuristic, Metrics, OomConfig, RunHooks, SimConfig};
use crate::workload::declare::{
    assign_templates, check_spread, sample_true_needs, underdeclare, Underdeclare,
};
use crate::workload::{EstimatorConfig, Job};

/// Spread of the template needs (`need = base * U(1 - jitter, 1)`).
const TEMPLATE_JITTER: f64 = 0.1;

/// The memory options, as parsed from the command line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryOptions {
    pub underdeclare: Option<Underdeclare>,
    pub templates: u32,
    pub spread: Option<(f64, f64)>,
}

/// `a,b` as two numbers (`a` alone: `(a, default_b)`).
pub fn parse_pair(s: &str, what: &str, default_b: Option<f64>) -> Result<(f64, f64)> {
    let num = |x: &str| -> Result<f64> {
        x.trim()
            .parse::<f64>()
            .with_context(|| format!("{what}: `{x}` is not a number"))
    };
    match s.split_once(',') {
        Some((a, b)) => Ok((num(a)?, num(b)?)),
        None => match default_b {
            Some(b) => Ok((num(s)?, b)),
            None => bail!("{what}: expected two numbers `LOW,HIGH`, got `{s}`"),
        },
    }
}

/// Parses `--underdeclare SMALL[,NONE]` and `--memory-spread LO,HI`.
pub fn parse_options(
    underdeclare_arg: Option<&str>,
    templates: u32,
    spread_arg: Option<&str>,
) -> Result<MemoryOptions> {
    let underdeclare = match underdeclare_arg {
        Some(s) => {
            let (small_share, none_share) = parse_pair(s, "--underdeclare", Some(0.0))?;
            let u = Underdeclare {
                small_share,
                none_share,
            };
            u.validate()?;
            Some(u)
        }
        None => None,
    };
    let spread = match spread_arg {
        Some(s) => {
            let p = parse_pair(s, "--memory-spread", None)?;
            check_spread(p)?;
            Some(p)
        }
        None => None,
    };
    Ok(MemoryOptions {
        underdeclare,
        templates,
        spread,
    })
}

/// Applies the options to a loaded workload: templates (diurnal only: a
/// trace's memory is not redrawn), true needs around a trace's derived
/// memory, then the under-declaration. A no-op without options.
pub fn apply(jobs: &mut [Job], model: GpuModel, o: &MemoryOptions, diurnal: bool, seed: u64) {
    if diurnal && o.underdeclare.is_some() {
        assign_templates(jobs, o.templates, TEMPLATE_JITTER, seed);
    }
    if let Some(sp) = o.spread {
        sample_true_needs(jobs, model, sp, seed);
    }
    if let Some(u) = &o.underdeclare {
        underdeclare(jobs, model, u, seed);
    }
}

/// `--oom-restart` and `--memory-estimate` as a [`SimConfig::oom`].
pub fn oom_config(
    restart: bool,
    estimate: &str,
    fail_fraction: f64,
    retries: u32,
) -> Result<Option<OomConfig>> {
    let estimate = match estimate.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" => true,
        "off" | "false" | "no" => false,
        other => bail!("--memory-estimate: `{other}` is not `on` or `off`"),
    };
    if estimate && !restart {
        bail!("--memory-estimate on needs --oom-restart (estimates only matter when instances are chosen by the declared memory)");
    }
    Ok(restart.then(|| OomConfig {
        fail_fraction,
        max_retries: retries,
        estimate: estimate.then(EstimatorConfig::default),
    }))
}

/// One row of the study.
struct Row {
    name: &'static str,
    m: Metrics,
}

/// Runs the oracle, restarts without and with estimates (and, for scale,
/// no restart at all) on the same jobs and prints one table.
#[allow(clippy::too_many_arguments)]
pub fn study(
    out: &mut impl Write,
    cluster: &[GpuModel],
    jobs: &[Job],
    base: &SimConfig,
    heuristic: Heuristic,
    policy: &str,
    fail_fraction: f64,
    retries: u32,
) -> Result<()> {
    let models = GpuModel::distinct(cluster);
    let oom = |retries: u32, estimate: bool| {
        Some(OomConfig {
            fail_fraction,
            max_retries: retries,
            estimate: estimate.then(EstimatorConfig::default),
        })
    };
    let variants: [(&'static str, Option<OomConfig>); 4] = [
        ("oracle (true need known)", None),
        ("declared, no restart", oom(0, false)),
        ("declared + OOM restart", oom(retries, false)),
        ("restart + estimates", oom(retries, true)),
    ];
    let mut rows = Vec::new();
    for (name, o) in variants {
        let cfg = SimConfig {
            oom: o,
            ..base.clone()
        };
        let mut p = parse_policy(policy, &models)?;
        let mut h = heuristic.build(cfg.seed);
        let r = simulate(
            cluster,
            jobs,
            h.as_mut(),
            p.as_mut(),
            &cfg,
            RunHooks::default(),
        )?;
        rows.push(Row { name, m: r.metrics });
    }
    let undeclared = jobs.iter().filter(|j| j.declares_nothing()).count();
    let under = jobs
        .iter()
        .filter(|j| {
            j.declared_memory_gb
                .is_some_and(|d| d > 0.0 && d < j.memory_gb)
        })
        .count();
    writeln!(
        out,
        "{} GPUs, {} jobs ({} declare less than they need, {} declare nothing), policy {}, placement {}, OOM after {} of the run, {} restarts",
        cluster.len(),
        jobs.len(),
        under,
        undeclared,
        policy,
        heuristic,
        fail_fraction,
        retries
    )?;
    writeln!(
        out,
        "{:<26} {:>9} {:>9} {:>8} {:>10} {:>11} {:>9} {:>9} {:>10} {:>8}",
        "scheduler",
        "completed",
        "rejected",
        "jobs/h",
        "makespan h",
        "energy MJ",
        "OOM runs",
        "lost GPU-h",
        "tardiness s",
        "late %"
    )?;
    for r in &rows {
        let m = &r.m;
        let makespan = m.last_completion_s;
        let per_hour = if makespan > 0.0 {
            m.completed as f64 / (makespan / 3600.0)
        } else {
            0.0
        };
        writeln!(
            out,
            "{:<26} {:>9} {:>9} {:>8.2} {:>10.3} {:>11.3} {:>9} {:>9.2} {:>10.1} {:>8.2}",
            r.name,
            m.completed,
            m.rejected + m.unserved,
            per_hour,
            makespan / 3600.0,
            m.energy_mj,
            m.oom_failures,
            m.oom_lost_gpu_s / 3600.0,
            m.mean_tardiness_s,
            100.0 * m.late_share
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_refuse() {
        let o = parse_options(Some("0.2,0.3"), 100, Some("0.5,1.5")).unwrap();
        assert_eq!(o.underdeclare.unwrap().none_share, 0.3);
        assert_eq!(o.spread, Some((0.5, 1.5)));
        assert_eq!(
            parse_options(Some("0.2"), 0, None)
                .unwrap()
                .underdeclare
                .unwrap()
                .none_share,
            0.0
        );
        assert!(parse_options(Some("0.8,0.8"), 0, None).is_err());
        assert!(parse_options(Some("x"), 0, None).is_err());
        assert!(parse_options(None, 0, Some("2")).is_err());
        assert!(oom_config(false, "on", 0.3, 3).is_err());
        assert!(oom_config(true, "maybe", 0.3, 3).is_err());
        assert!(oom_config(false, "off", 0.3, 3).unwrap().is_none());
        let c = oom_config(true, "on", 0.3, 3).unwrap().unwrap();
        assert!(c.estimate.is_some());
    }
}
