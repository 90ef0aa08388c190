//! `smartmig simulate --compare`: every policy on the same workload, seed and
//! placement heuristic, in one table with the gap to the lower bounds; the
//! README's main command.
//!
//! The runs, in order: `none` (the ET reference), `static` (an arbitrary
//! admin layout, catalog index 1: `4444|3333` on the eight-slice models),
//! `static-hist` and `twice-daily-hist` (the opponents: searched on
//! *training days*, other days of the same workload, and applied unchanged;
//! `eval::baselines`), `greedy`, any extra `--compare-policy` specs (e.g.
//! the learned `policy:FILE.onnx`), and the hindsight references
//! `static-hindsight` and `twice-daily-hindsight` (searched on this very
//! workload, which no admin knows in advance). Each final run records its
//! event log in memory; the plots of `--report DIR` are derived from those
//! logs.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::bound::{self, BoundGpu};
use crate::eval::{fit, Day, DaySet};
use crate::mig::{Geometry, GpuModel};
use crate::policy::search::SearchConfig;
use crate::policy::{parse_policy_on, Greedy, RepartitionPolicy, StaticLayout};
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
    /// Other days of the same workload (never the compared one), on which
    /// the opponents `static-hist` and `twice-daily-hist` are fitted. Empty:
    /// those rows are left out.
    pub training: Vec<Day>,
}

impl CompareOptions {
    pub fn new(workload: impl Into<String>, alpha: f64) -> Self {
        CompareOptions {
            workload: workload.into(),
            alpha,
            search: SearchConfig::default(),
            extra: Vec::new(),
            bin_s: DEFAULT_BIN_S,
            training: Vec::new(),
        }
    }
}

struct Ctx<'a> {
    cluster: &'a [GpuModel],
    jobs: &'a [Job],
    cfg: &'a SimConfig,
    heuristic: Heuristic,
    bin_s: f64,
}

impl Ctx<'_> {
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
    let models = GpuModel::distinct(cluster);
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

    // The opponents: fitted on the training days, applied unchanged.
    // The `vs` columns: the opponents (the arbitrary `static` is a row only).
    let mut baselines = vec!["none".to_string()];
    if !opts.training.is_empty() {
        let train = DaySet::new(cluster, heuristic, opts.training.clone())?;
        let fitted = fit(&train, &opts.search, alpha).context("fitting the opponents")?;
        let days = train
            .days
            .iter()
            .map(|d| d.label.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let (m, _, s) = ctx.run_logged(&mut fitted.static_policy())?;
        push(
            &mut rows,
            "static-hist",
            format!("{} (fitted on {days})", fitted.static_spec(&train)),
            m,
            s,
            Some(fitted.statics.evaluations * train.len()),
        );
        let mut td = fitted.twice_policy();
        let (m, _, s) = ctx.run_logged(&mut td)?;
        push(
            &mut rows,
            "twice-daily-hist",
            format!("{} (fitted on {days})", td.schedule(cluster)),
            m,
            s,
            Some(fitted.twice.evaluations * train.len()),
        );
        baselines.extend(["static-hist".to_string(), "twice-daily-hist".to_string()]);
    }

    let mut greedy = Greedy::default();
    let (m, _, s) = ctx.run_logged(&mut greedy)?;
    push(&mut rows, "greedy", greedy.describe(), m, s, None);

    for spec in &opts.extra {
        let mut p =
            parse_policy_on(spec, cluster, 0.0).with_context(|| format!("policy `{spec}`"))?;
        let (m, name, s) = ctx.run_logged(p.as_mut())?;
        push(&mut rows, spec, name, m, s, None);
    }

    // The hindsight references: searched on this very workload.
    let this_day = DaySet::new(
        cluster,
        heuristic,
        vec![Day {
            label: "this workload".into(),
            jobs: jobs.to_vec(),
            cfg: cfg.clone(),
        }],
    )?;
    let hindsight = fit(&this_day, &opts.search, alpha).context("hindsight searches")?;
    let (m, _, s) = ctx.run_logged(&mut hindsight.static_policy())?;
    push(
        &mut rows,
        "static-hindsight",
        format!(
            "{} (searched on this workload: a reference, not an opponent)",
            hindsight.static_spec(&this_day)
        ),
        m,
        s,
        Some(hindsight.statics.evaluations),
    );
    let mut td = hindsight.twice_policy();
    let (m, _, s) = ctx.run_logged(&mut td)?;
    push(
        &mut rows,
        "twice-daily-hindsight",
        format!(
            "{} (searched on this workload: a reference, not an opponent)",
            td.schedule(cluster)
        ),
        m,
        s,
        Some(hindsight.twice.evaluations),
    );

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
        models: models
            .iter()
            .map(std::string::ToString::to_string)
            .collect(),
        placement: heuristic.to_string(),
        seed: cfg.seed,
        alpha,
        reconfig_time_s: cfg.reconfig_time_s,
        reference: reference_name,
        baselines,
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
