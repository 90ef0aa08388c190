//! The out-of-memory options of `smartmig simulate` and `--oom-study`, the
//! measurement of issues 9 and 24: throughput, energy and lost GPU time of
//! one workload under an oracle scheduler, with out-of-memory restarts,
//! early restarts, and learned memory estimates (`docs/oom-and-memory.md`).

use std::io::Write;

use anyhow::{bail, Context, Result};

use crate::mig::GpuModel;
use crate::policy::parse_policy;
use crate::sim::{simulate, EarlyRestartRule, Heuristic, Metrics, OomConfig, RunHooks, SimConfig};
use crate::workload::declare::{
    assign_growth, assign_templates, check_spread, sample_true_needs, underdeclare, GrowthMix,
    Underdeclare,
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
    /// Memory growth family (`None`: the step at `fail_fraction`).
    pub growth: Option<GrowthMix>,
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
        growth: None,
    })
}

/// `--memory-growth FAMILY`: `mixed`, a shape name or `none`. Without the
/// flag, `--oom-study` takes `mixed` (with the step model alone an early
/// restart can never fire, and the study would show nothing) and a plain
/// run keeps the step model.
pub fn parse_growth(arg: Option<&str>, study: bool) -> Result<Option<GrowthMix>> {
    match arg.map(|s| s.trim().to_ascii_lowercase()) {
        None if study => Ok(Some(GrowthMix::mixed())),
        None => Ok(None),
        Some(s) if s == "none" => Ok(None),
        Some(s) => {
            let mix = GrowthMix::named(&s).map_err(|_| {
                anyhow::anyhow!(
                    "--memory-growth: `{s}` is not a family (expected mixed, step, linear, concave, convex or none)"
                )
            })?;
            mix.validate()?;
            Ok(Some(mix))
        }
    }
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
    if let Some(g) = &o.growth {
        assign_growth(jobs, g, seed);
    }
}

/// `--oom-restart`, `--memory-estimate` and `--early-restart` as a
/// [`SimConfig::oom`].
pub fn oom_config(
    restart: bool,
    estimate: &str,
    fail_fraction: f64,
    retries: u32,
    early_restart: Option<EarlyRestartRule>,
    sample_s: f64,
) -> Result<Option<OomConfig>> {
    let estimate = match estimate.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" => true,
        "off" | "false" | "no" => false,
        other => bail!("--memory-estimate: `{other}` is not `on` or `off`"),
    };
    if estimate && !restart {
        bail!("--memory-estimate on needs --oom-restart (estimates only matter when instances are chosen by the declared memory)");
    }
    if early_restart.is_some() && !restart {
        bail!("--early-restart needs --oom-restart (a job is restarted early on the next larger memory size, as after a failure)");
    }
    Ok(restart.then(|| OomConfig {
        fail_fraction,
        max_retries: retries,
        estimate: estimate.then(EstimatorConfig::default),
        early_restart,
        sample_s,
    }))
}

/// The out-of-memory parameters the study's variants share.
#[derive(Clone, Copy, Debug)]
pub struct StudyParams {
    pub fail_fraction: f64,
    pub retries: u32,
    /// The rule of the early-restart rows.
    pub early: EarlyRestartRule,
    pub sample_s: f64,
}

/// One row of the study.
struct Row {
    name: &'static str,
    m: Metrics,
}

/// The study's schedulers, in table order: the oracle, no restart,
/// restart on failure, with estimates, early restart, early restart with
/// estimates.
pub fn study_variants(p: &StudyParams) -> Vec<(&'static str, Option<OomConfig>)> {
    let oom = |retries: u32, estimate: bool, early: bool| {
        Some(OomConfig {
            fail_fraction: p.fail_fraction,
            max_retries: retries,
            estimate: estimate.then(EstimatorConfig::default),
            early_restart: early.then_some(p.early),
            sample_s: p.sample_s,
        })
    };
    vec![
        ("oracle (true need known)", None),
        ("declared, no restart", oom(0, false, false)),
        ("restart on failure", oom(p.retries, false, false)),
        ("restart + estimates", oom(p.retries, true, false)),
        ("early restart", oom(p.retries, false, true)),
        ("early restart + estimates", oom(p.retries, true, true)),
    ]
}

/// Runs every [`study_variants`] scheduler on the same jobs; (name,
/// metrics) in table order.
pub fn study_rows(
    cluster: &[GpuModel],
    jobs: &[Job],
    base: &SimConfig,
    heuristic: Heuristic,
    policy: &str,
    p: &StudyParams,
) -> Result<Vec<(&'static str, Metrics)>> {
    let models = GpuModel::distinct(cluster);
    let mut rows = Vec::new();
    for (name, o) in study_variants(p) {
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
        rows.push((name, r.metrics));
    }
    Ok(rows)
}

/// Runs the study and prints one table.
pub fn study(
    out: &mut impl Write,
    cluster: &[GpuModel],
    jobs: &[Job],
    base: &SimConfig,
    heuristic: Heuristic,
    policy: &str,
    p: &StudyParams,
) -> Result<()> {
    let rows: Vec<Row> = study_rows(cluster, jobs, base, heuristic, policy, p)?
        .into_iter()
        .map(|(name, m)| Row { name, m })
        .collect();
    let undeclared = jobs.iter().filter(|j| j.declares_nothing()).count();
    let under = jobs
        .iter()
        .filter(|j| {
            j.declared_memory_gb
                .is_some_and(|d| d > 0.0 && d < j.memory_gb)
        })
        .count();
    let growth = match jobs.iter().filter(|j| j.memory_growth.is_some()).count() {
        0 => format!(
            "no memory growth (the peak at {} of the run)",
            p.fail_fraction
        ),
        n => format!("memory growth on {n} jobs"),
    };
    writeln!(
        out,
        "{} GPUs, {} jobs ({} declare less than they need, {} declare nothing), policy {}, placement {}, {}, {} restarts; early restart: window {}, horizon {}, min fill {}, a sample every {} s",
        cluster.len(),
        jobs.len(),
        under,
        undeclared,
        policy,
        heuristic,
        growth,
        p.retries,
        p.early.window,
        p.early.horizon,
        p.early.min_fill,
        p.sample_s
    )?;
    writeln!(
        out,
        "{:<26} {:>9} {:>8} {:>8} {:>10} {:>11} {:>8} {:>6} {:>6} {:>10} {:>11} {:>11} {:>11} {:>11} {:>7}",
        "scheduler",
        "completed",
        "rejected",
        "jobs/h",
        "makespan h",
        "energy MJ",
        "OOM runs",
        "early",
        "false",
        "lost GPU-h",
        "early GPU-h",
        "false GPU-h",
        "saved GPU-h",
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
            "{:<26} {:>9} {:>8} {:>8.2} {:>10.3} {:>11.3} {:>8} {:>6} {:>6} {:>10.2} {:>11.2} {:>11.2} {:>11.2} {:>11.1} {:>7.2}",
            r.name,
            m.completed,
            m.rejected + m.unserved,
            per_hour,
            makespan / 3600.0,
            m.energy_mj,
            m.oom_failures,
            m.early_restarts,
            m.false_early_restarts,
            m.lost_gpu_s() / 3600.0,
            m.early_restart_lost_gpu_s / 3600.0,
            m.false_early_restart_lost_gpu_s / 3600.0,
            m.early_restart_saved_gpu_s / 3600.0,
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
        assert!(oom_config(false, "on", 0.3, 3, None, 5.0).is_err());
        assert!(oom_config(true, "maybe", 0.3, 3, None, 5.0).is_err());
        assert!(oom_config(false, "off", 0.3, 3, None, 5.0)
            .unwrap()
            .is_none());
        let c = oom_config(true, "on", 0.3, 3, None, 5.0).unwrap().unwrap();
        assert!(c.estimate.is_some());
        let rule = EarlyRestartRule::default();
        assert!(oom_config(false, "off", 0.3, 3, Some(rule), 5.0).is_err());
        let c = oom_config(true, "off", 0.3, 3, Some(rule), 5.0)
            .unwrap()
            .unwrap();
        assert_eq!(c.early_restart, Some(rule));
        assert_eq!(parse_growth(None, false).unwrap(), None);
        assert_eq!(parse_growth(None, true).unwrap(), Some(GrowthMix::mixed()));
        assert_eq!(parse_growth(Some("none"), true).unwrap(), None);
        assert!(parse_growth(Some("Linear"), false).unwrap().is_some());
        let e = parse_growth(Some("wobbly"), false).unwrap_err().to_string();
        assert!(e.contains("wobbly") && e.contains("mixed"), "{e}");
    }
}
