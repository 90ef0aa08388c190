//! `smartmig simulate --compare`: every policy on the same workload, seed and
//! placement heuristic, in one table with the gap to the lower bounds; the
//! README's main command.
//!
//! The runs, in order: `none` (whole GPUs), `static` (an arbitrary admin
//! layout, catalog index 1: `4444|3333` on the eight-slice models),
//! `static-hist` and `twice-daily-hist` (the opponents: searched on
//! *training days*, other days of the same workload, and applied unchanged;
//! `eval::baselines`), `greedy`, the shipped learned policy (`learned`) and
//! any extra `--compare-policy` specs, each learned one also as
//! `<name>+fallback` (`eval::fallback`: the policy where it beat `none`
//! and the static layout on the training days, else the better of those),
//! and the hindsight references `static-hindsight` and
//! `twice-daily-hindsight` (searched on this very workload, which no admin
//! knows in advance).
//!
//! The yardstick is the suite's (docs/evaluation.md): ET's exchange rate
//! comes from the training days' `none` runs (a workload with no past
//! uses its own `none` run), `T_ref` floored; every row is charged at the
//! horizon common to all rows (`sim::metrics`), and rows are ranked with
//! the jobs they left unserved first. Each final run records its event log
//! in memory; the plots of `--report DIR` are derived from those logs.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::bound::{self, BoundGpu};
use crate::eval::fallback::cross_validate;
use crate::eval::{fit, Day, DaySet, Fitted, RowKind};
use crate::mig::{Geometry, GpuModel};
use crate::policy::search::SearchConfig;
use crate::policy::{
    parse_policy, parse_policy_on, Greedy, NoPartition, RepartitionPolicy, StaticLayout,
};
use crate::report::{plot, series, Comparison, Row};
use crate::sim::{
    common_horizon, simulate, Collect, EtScore, Heuristic, Metrics, Reference, RunHooks, SimConfig,
    SimResult,
};
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
    /// The shipped learned policy's spec (`policy:FILE.onnx`): the rows
    /// `learned` and, with training days, `learned+fallback`.
    pub learned: Option<String>,
    /// Extra policies (specs of `policy::parse_policy`), after the built-ins;
    /// a `policy:` one also gets a `<spec>+fallback` row.
    pub extra: Vec<String>,
    /// Width of the plot bins, s.
    pub bin_s: f64,
    /// Other days of the same workload (never the compared one), on which
    /// the opponents `static-hist` and `twice-daily-hist` are fitted, the
    /// fallback chosen and the exchange rate pooled. Empty: those rows are
    /// left out and the rate is the workload's own `none` run.
    pub training: Vec<Day>,
}

impl CompareOptions {
    pub fn new(workload: impl Into<String>, alpha: f64) -> Self {
        CompareOptions {
            workload: workload.into(),
            alpha,
            search: SearchConfig::default(),
            learned: None,
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
    opts: &'a CompareOptions,
    /// The finished runs, at their own horizons.
    runs: Vec<Raw>,
}

/// One finished run, before the common horizon is known.
struct Raw {
    policy: String,
    kind: RowKind,
    description: String,
    metrics: Metrics,
    series: series::TimeSeries,
    search_runs: Option<usize>,
}

impl Ctx<'_> {
    /// A final run, recorded with the series of its event log; returns the
    /// name the policy gives itself.
    fn run_logged(
        &mut self,
        policy: &mut dyn RepartitionPolicy,
        row: (&str, RowKind, String),
        search_runs: Option<usize>,
    ) -> Result<String> {
        let mut log = Collect::default();
        let r = self.run(
            policy,
            RunHooks {
                sink: Some(&mut log),
                progress: None,
            },
        )?;
        let series = series::from_records(&log.0, self.opts.bin_s)?;
        self.runs.push(Raw {
            policy: row.0.to_string(),
            kind: row.1,
            description: row.2,
            metrics: r.metrics,
            series,
            search_runs,
        });
        Ok(r.policy)
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

    /// Our policies `(row name, spec)`: greedy, the learned one, extras.
    fn candidates(&self) -> Vec<(String, String)> {
        let mut out = vec![("greedy".to_string(), "greedy".to_string())];
        out.extend(
            self.opts
                .learned
                .iter()
                .map(|s| ("learned".into(), s.clone())),
        );
        out.extend(self.opts.extra.iter().map(|s| (s.clone(), s.clone())));
        out
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
    let mut ctx = Ctx {
        cluster,
        jobs,
        cfg,
        heuristic,
        opts,
        runs: Vec::new(),
    };
    ctx.run_logged(
        &mut NoPartition,
        (
            "none",
            RowKind::Opponent,
            "MIG off in effect: every GPU is one whole-GPU instance".into(),
        ),
        None,
    )
    .context("simulating `none`")?;
    let train = if opts.training.is_empty() {
        None
    } else {
        Some(DaySet::new(cluster, heuristic, opts.training.clone())?)
    };
    let (rate, reference) = exchange_rate(&ctx, train.as_ref());
    arbitrary_static(&mut ctx)?;
    let fitted = match &train {
        Some(t) => Some(opponents(&mut ctx, t, &rate)?),
        None => None,
    };
    candidates(&mut ctx, train.as_ref().zip(fitted.as_ref()), &rate)?;
    hindsight(&mut ctx, &rate)?;
    let mut c = assemble(&ctx, rate, reference)?;
    c.elapsed_s = started.elapsed().as_secs_f64();
    Ok(c)
}

/// The ET exchange rate and its description: `none` pooled over the
/// training days, or the workload's own `none` run (no past days).
fn exchange_rate(ctx: &Ctx<'_>, train: Option<&DaySet>) -> (Reference, String) {
    let placement = ctx.heuristic;
    match train {
        Some(t) => (
            t.rate(),
            format!(
                "none (whole GPUs) + {placement} pooled over the {} training days",
                t.len()
            ),
        ),
        None => (
            Reference::own(&ctx.runs[0].metrics, ctx.jobs),
            format!(
                "this workload's own none (whole GPUs) + {placement} run (no past days to pool)"
            ),
        ),
    }
}

/// An arbitrary admin layout: catalog index 1 on every model.
fn arbitrary_static(ctx: &mut Ctx<'_>) -> Result<()> {
    let models = GpuModel::distinct(ctx.cluster);
    let mut fixed = StaticLayout::parse("1", &models)?;
    let pictures: Vec<String> = models
        .iter()
        .map(|&m| Geometry::of(m).picture(fixed.layout(m)))
        .collect();
    let description = format!(
        "static:1, an arbitrary admin choice ({} on every GPU)",
        pictures.join(" / ")
    );
    ctx.run_logged(&mut fixed, ("static", RowKind::Opponent, description), None)?;
    Ok(())
}

/// The opponents: fitted on the training days, applied unchanged.
fn opponents(ctx: &mut Ctx<'_>, train: &DaySet, rate: &Reference) -> Result<Fitted> {
    let opts = ctx.opts;
    let fitted = fit(train, &opts.search, rate, opts.alpha).context("fitting the opponents")?;
    let days = train
        .days
        .iter()
        .map(|d| d.label.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    ctx.run_logged(
        &mut fitted.static_policy(),
        (
            "static-hist",
            RowKind::Opponent,
            format!("{} (fitted on {days})", fitted.static_spec(train)),
        ),
        Some(fitted.statics.evaluations * train.len()),
    )?;
    let mut td = fitted.twice_policy();
    let description = format!("{} (fitted on {days})", td.schedule(ctx.cluster));
    ctx.run_logged(
        &mut td,
        ("twice-daily-hist", RowKind::Opponent, description),
        Some(fitted.twice.evaluations * train.len()),
    )?;
    Ok(fitted)
}

/// Our policies, and with training days each learned one `+fallback`.
fn candidates(ctx: &mut Ctx<'_>, past: Option<(&DaySet, &Fitted)>, rate: &Reference) -> Result<()> {
    let models = GpuModel::distinct(ctx.cluster);
    for (name, spec) in ctx.candidates() {
        let mut p = if spec == "greedy" {
            Box::new(Greedy::default())
        } else {
            parse_policy_on(&spec, ctx.cluster, 0.0).with_context(|| format!("policy `{spec}`"))?
        };
        let description = p.describe();
        ctx.run_logged(p.as_mut(), (&name, RowKind::Candidate, description), None)?;
    }
    let Some((train, fitted)) = past else {
        return Ok(());
    };
    let opts = ctx.opts;
    for (name, spec) in ctx.candidates() {
        if !spec.starts_with("policy:") {
            continue;
        }
        let choice = cross_validate(train, &opts.search, rate, opts.alpha, &name, &mut || {
            parse_policy(&spec, &models)
        })
        .with_context(|| format!("choosing the fallback of `{spec}` on the training days"))?;
        let mut p: Box<dyn RepartitionPolicy + Send> = match choice.chosen.as_str() {
            "none" => Box::new(NoPartition),
            "static-hist" => Box::new(fitted.static_policy()),
            _ => parse_policy(&spec, &models)?,
        };
        let description = format!("{} on the training days", choice.describe());
        ctx.run_logged(
            p.as_mut(),
            (&format!("{name}+fallback"), RowKind::Candidate, description),
            None,
        )?;
    }
    Ok(())
}

/// The hindsight references: searched on this very workload, with the
/// comparison's exchange rate.
fn hindsight(ctx: &mut Ctx<'_>, rate: &Reference) -> Result<()> {
    let this_day = DaySet::new(
        ctx.cluster,
        ctx.heuristic,
        vec![Day {
            label: "this workload".into(),
            jobs: ctx.jobs.to_vec(),
            cfg: ctx.cfg.clone(),
        }],
    )?;
    let h = fit(&this_day, &ctx.opts.search, rate, ctx.opts.alpha).context("hindsight searches")?;
    let note = "(searched on this workload: a reference, not an opponent)";
    let description = format!("{} {note}", h.static_spec(&this_day));
    ctx.run_logged(
        &mut h.static_policy(),
        ("static-hindsight", RowKind::Hindsight, description),
        Some(h.statics.evaluations),
    )?;
    let mut td = h.twice_policy();
    let description = format!("{} {note}", td.schedule(ctx.cluster));
    ctx.run_logged(
        &mut td,
        ("twice-daily-hindsight", RowKind::Hindsight, description),
        Some(h.twice.evaluations),
    )?;
    Ok(())
}

/// Charges every run at the common horizon, scores it with `rate`, and
/// ranks the rows beside the lower bounds.
fn assemble(ctx: &Ctx<'_>, rate: Reference, reference: String) -> Result<Comparison> {
    let (cluster, cfg, alpha) = (ctx.cluster, ctx.cfg, ctx.opts.alpha);
    let horizon = common_horizon(ctx.runs.iter().map(|r| &r.metrics));
    let rows = ctx
        .runs
        .iter()
        .map(|r| {
            let metrics = r.metrics.at_horizon(horizon);
            let score = EtScore::new(&metrics, &rate, String::new(), alpha);
            Row {
                policy: r.policy.clone(),
                kind: r.kind,
                description: r.description.clone(),
                unserved: metrics.never_ran(),
                metrics,
                e: score.e,
                t: score.t,
                et: score.et,
                rank: 0,
                et_change: Vec::new(),
                energy_over_bound: f64::NAN,
                search_runs: r.search_runs,
                series: Some(r.series.clone()),
            }
        })
        .collect();
    let gpus: Vec<BoundGpu> = cluster
        .iter()
        .map(|&m| BoundGpu {
            model: m,
            power: cfg.power_for(m),
        })
        .collect();
    let bound_horizon = cfg
        .workload_horizon_s
        .unwrap_or_else(|| ctx.jobs.iter().map(|j| j.arrival).fold(0.0, f64::max));
    let bounds = bound::compute(ctx.jobs, &gpus, bound_horizon)?;
    let et_lower_bound = rate.et(bounds.energy.total_j, bounds.tardiness.mean_s, alpha);
    let mut baselines = vec!["none".to_string()];
    if !ctx.opts.training.is_empty() {
        baselines.extend(["static-hist".to_string(), "twice-daily-hist".to_string()]);
    }
    let mut c = Comparison {
        workload: ctx.opts.workload.clone(),
        gpus: cluster.len(),
        models: GpuModel::distinct(cluster)
            .iter()
            .map(std::string::ToString::to_string)
            .collect(),
        placement: ctx.heuristic.to_string(),
        seed: cfg.seed,
        alpha,
        reconfig_time_s: cfg.reconfig_time_s,
        reference,
        rate,
        horizon_s: horizon,
        baselines,
        bounds,
        et_lower_bound,
        rows,
        elapsed_s: 0.0,
    };
    c.finish();
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
