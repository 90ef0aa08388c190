//! `smartmig simulate --compare`: every policy on the same workload, seed and
//! placement heuristic, in one table with the gap to the lower bounds; the
//! README's main command.
//!
//! The runs, in order: `none` (the ET reference), `static` (an arbitrary
//! admin layout, catalog index 1: `4444|3333` on the eight-slice models),
//! `static-best` and `twice-daily` (searched on this very workload, see
//! `policy::search`), `greedy`, and any extra `--compare-policy` specs
//! (e.g. the learned `policy:FILE.onnx`). Each final run records its event
//! log in memory; the plots of `--report DIR` are derived from those logs.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::bound::{self, BoundGpu};
use crate::mig::{Geometry, GpuModel};
use crate::policy::search::{self, SearchConfig};
use crate::policy::{parse_policy, Greedy, RepartitionPolicy, StaticLayout};
use crate::report::{plot, series, Comparison, Row};
use crate::sim::{simulate, Collect, EtScore, Heuristic, Metrics, RunHooks, SimConfig, SimResult};
use crate::workload::Job;

/// Default width of the plot bins, s.
pub const DEFAULT_BIN_S: f64 = 900.0;

/// What to compare and how.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    /// Label of the workload in the table.
    pub workload: String,
    /// Weight of tardiness in ET.
    pub alpha: f64,
    pub search: SearchConfig,
    /// Extra policies (specs of `policy::parse_policy`), after the built-ins.
    pub extra: Vec<String>,
    /// Width of the plot bins, s.
    pub bin_s: f64,
}

impl CompareOptions {
    pub fn new(workload: impl Into<String>, alpha: f64) -> Self {
        CompareOptions {
            workload: workload.into(),
            alpha,
            search: SearchConfig::default(),
            extra: Vec::new(),
            bin_s: DEFAULT_BIN_S,
        }
    }
}

/// The objective the searches minimise: ET against the reference run, with
/// the tardiness normalised by `max(reference mean tardiness, 1 s)` so that
/// a reference without tardiness still ranks candidates (it equals ET
/// whenever the reference's mean tardiness is at least 1 s).
pub fn search_score(run: &Metrics, reference: &Metrics, alpha: f64) -> f64 {
    let e = if reference.energy_j > 0.0 {
        run.energy_j / reference.energy_j
    } else {
        1.0
    };
    let t = run.mean_tardiness_s / reference.mean_tardiness_s.max(1.0);
    // Jobs that never ran make a run look cheap: count each as very late.
    let penalty = run.unserved as f64;
    (e + alpha * t) / (1.0 + alpha) + penalty
}

struct Ctx<'a> {
    cluster: &'a [GpuModel],
    jobs: &'a [Job],
    cfg: &'a SimConfig,
    heuristic: Heuristic,
    bin_s: f64,
}

impl Ctx<'_> {
    fn run_plain(&self, policy: &mut dyn RepartitionPolicy) -> Result<Metrics> {
        Ok(self.run(policy, RunHooks::default())?.metrics)
    }

    /// A final run: metrics, the policy's name and the series of its event log.
    fn run_logged(
        &self,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<(Metrics, String, series::TimeSeries)> {
        let mut log = Collect::default();
        let r = self.run(
            policy,
            RunHooks {
                sink: Some(&mut log),
                progress: None,
            },
        )?;
        let s = series::from_records(&log.0, self.bin_s)?;
        Ok((r.metrics, r.policy, s))
    }

    /// One simulation of the compared workload with `policy`.
    fn run(&self, policy: &mut dyn RepartitionPolicy, hooks: RunHooks<'_>) -> Result<SimResult> {
        let mut h = self.heuristic.build(self.cfg.seed);
        Ok(simulate(
            self.cluster,
            self.jobs,
            h.as_mut(),
            policy,
            self.cfg,
            hooks,
        )?)
    }
}

/// Runs every policy and assembles the comparison.
pub fn compare(
    cluster: &[GpuModel],
    jobs: &[Job],
    cfg: &SimConfig,
    heuristic: Heuristic,
    opts: &CompareOptions,
) -> Result<Comparison> {
    let started = Instant::now();
    let ctx = Ctx {
        cluster,
        jobs,
        cfg,
        heuristic,
        bin_s: opts.bin_s,
    };
    let mut models = cluster.to_vec();
    models.sort();
    models.dedup();
    let alpha = opts.alpha;

    let mut rows: Vec<Row> = Vec::new();
    let (reference, _, ref_series) = ctx
        .run_logged(&mut crate::policy::NoPartition)
        .context("simulating the `none` reference")?;
    let reference_name = format!("none (every GPU one whole-GPU instance) + {heuristic}");
    let push =
        |rows: &mut Vec<Row>, policy: &str, description: String, m: Metrics, s, search_runs| {
            let score = EtScore::new(&m, &reference, reference_name.clone(), alpha);
            rows.push(Row {
                policy: policy.to_string(),
                description,
                metrics: m,
                e: score.e,
                t: score.t,
                et: score.et,
                et_change: Vec::new(),
                energy_over_bound: f64::NAN,
                search_runs,
                series: Some(s),
            });
        };
    push(
        &mut rows,
        "none",
        "MIG off in effect: every GPU is one whole-GPU instance".into(),
        reference.clone(),
        ref_series,
        None,
    );

    // An arbitrary admin layout: catalog index 1 on every model.
    let mut fixed = StaticLayout::parse("1", &models)?;
    let pictures: Vec<String> = models
        .iter()
        .map(|&m| Geometry::of(m).picture(fixed.layout(m)))
        .collect();
    let (m, _, s) = ctx.run_logged(&mut fixed)?;
    push(
        &mut rows,
        "static",
        format!(
            "static:1, an arbitrary admin choice ({} on every GPU)",
            pictures.join(" / ")
        ),
        m,
        s,
        None,
    );

    // The searched fixed competitors.
    let mut evaluate = |p: &mut dyn RepartitionPolicy| -> Result<f64> {
        Ok(search_score(&ctx.run_plain(p)?, &reference, alpha))
    };
    let best =
        search::static_best(cluster, &opts.search, &mut evaluate).context("static-best search")?;
    let twice = search::twice_daily(cluster, &opts.search, &best, cfg.start_hour, &mut evaluate)
        .context("twice-daily search")?;
    let mut sb = best.policy.clone();
    let (m, name, s) = ctx.run_logged(&mut sb)?;
    push(&mut rows, "static-best", name, m, s, Some(best.evaluations));
    let mut td = twice.policy.clone();
    let (m, name, s) = ctx.run_logged(&mut td)?;
    push(
        &mut rows,
        "twice-daily",
        name,
        m,
        s,
        Some(twice.evaluations),
    );

    let mut greedy = Greedy::default();
    let (m, name, s) = ctx.run_logged(&mut greedy)?;
    push(
        &mut rows,
        "greedy",
        format!(
            "{name}: demand-driven (nos-style), starts from catalog layout {}, batching window {} s",
            greedy.config().initial,
            greedy.config().window_s
        ),
        m,
        s,
        None,
    );

    for spec in &opts.extra {
        let mut p = parse_policy(spec, &models).with_context(|| format!("policy `{spec}`"))?;
        let (m, name, s) = ctx.run_logged(p.as_mut())?;
        push(&mut rows, spec, name, m, s, None);
    }

    let gpus: Vec<BoundGpu> = cluster
        .iter()
        .map(|&m| BoundGpu {
            model: m,
            power: cfg.power_for(m),
        })
        .collect();
    let horizon = cfg
        .workload_horizon_s
        .unwrap_or_else(|| jobs.iter().map(|j| j.arrival).fold(0.0, f64::max));
    let bounds = bound::compute(jobs, &gpus, horizon)?;
    let et_lower_bound = bounds.et(reference.energy_j, reference.mean_tardiness_s, alpha);
    let mut c = Comparison {
        workload: opts.workload.clone(),
        gpus: cluster.len(),
        models: models.iter().map(|m| m.to_string()).collect(),
        placement: heuristic.to_string(),
        seed: cfg.seed,
        alpha,
        reconfig_time_s: cfg.reconfig_time_s,
        reference: reference_name,
        baselines: vec![
            "none".into(),
            "static".into(),
            "static-best".into(),
            "twice-daily".into(),
        ],
        bounds,
        et_lower_bound,
        rows,
        elapsed_s: 0.0,
    };
    c.finish();
    c.elapsed_s = started.elapsed().as_secs_f64();
    Ok(c)
}

/// File-name-safe form of a policy name.
fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes `power.svg`, `queue.svg`, `layouts-<policy>.svg` and
/// `comparison.json` into `dir` (created if missing). Returns the files.
pub fn write_report(c: &Comparison, dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let runs: Vec<(String, &series::TimeSeries)> = c
        .rows
        .iter()
        .filter_map(|r| r.series.as_ref().map(|s| (r.policy.clone(), s)))
        .collect();
    let mut files = Vec::new();
    let mut write = |name: String, text: String| -> Result<()> {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        files.push(p);
        Ok(())
    };
    write(
        "power.svg".into(),
        plot::lines(
            &format!("Cluster power, {} GPUs ({})", c.gpus, c.workload),
            "mean power (kW)",
            &runs,
            &|s| s.power_w.iter().map(|w| w / 1000.0).collect(),
        )?,
    )?;
    write(
        "queue.svg".into(),
        plot::lines(
            &format!("Waiting jobs ({})", c.workload),
            "mean queue length (jobs)",
            &runs,
            &|s| s.queue.clone(),
        )?,
    )?;
    for (name, s) in &runs {
        write(
            format!("layouts-{}.svg", slug(name)),
            plot::layout_mix(&format!("Layout mix: {name}"), s, c.gpus)?,
        )?;
    }
    write("comparison.json".into(), serde_json::to_string_pretty(c)?)?;
    Ok(files)
}

/// The `--compare` branch of `smartmig simulate`: runs the comparison on the
/// workload `simulate` loaded, prints the table (or JSON with `--json`) and
/// writes the plots with `--report DIR`.
pub fn run_cli(
    a: &super::simulate::Args,
    cluster: &[GpuModel],
    jobs: &[Job],
    cfg: &SimConfig,
    heuristic: Heuristic,
) -> Result<()> {
    use std::io::Write;
    let label = if a.workload == "diurnal" {
        format!("diurnal {} h workload", a.hours)
    } else {
        format!("{} trace {}", a.trace_format, a.workload)
    };
    let mut opts = CompareOptions::new(label, a.alpha);
    opts.extra.clone_from(&a.compare_policy);
    // The shipped learned policy of each model joins the table when it and
    // ONNX Runtime exist (docs/policy.md).
    if !opts.extra.iter().any(|s| s.starts_with("policy:")) {
        for m in cluster
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
        {
            match (
                crate::policy::onnx::shipped_policy(m),
                crate::policy::onnx::find_onnxruntime(),
            ) {
                (Some(p), Ok(_)) => opts.extra.push(format!("policy:{}", p.display())),
                (Some(p), Err(e)) => eprintln!("smartmig: not comparing {}: {e}", p.display()),
                (None, _) => {}
            }
        }
    }
    let c = compare(cluster, jobs, cfg, heuristic, &opts)?;
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &c)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", c.table())?;
    }
    if let Some(dir) = &a.report {
        let files = write_report(&c, dir)?;
        eprintln!("smartmig: wrote {} files to {}", files.len(), dir.display());
    }
    Ok(())
}
