//! The runs behind `smartmig simulate --compare` (the README's main
//! command): every policy on the same workload, seed and placement
//! heuristic, assembled into one [`Comparison`] with the gap to the lower
//! bounds. [`compare`] runs the simulations; [`assemble`] is the pure step
//! from finished runs to the table; [`report_files`] renders the plots of
//! `--report DIR` (the CLI writes them).
//!
//! The runs, in order: `none` (whole GPUs), `static` (an arbitrary admin
//! layout, catalog index 1: `4444|3333` on the eight-slice models),
//! `on-demand` and `rolling-fit` (the opponents that need no history:
//! smartmigd's allocate alone, and `policy::rolling`),
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
//! day's horizon, where `none` ends (`sim::day_horizon`), and rows are ranked with
//! the jobs they left unserved first. Each final run records its event log
//! in memory; the plots of `--report DIR` are derived from those logs.

use std::time::Instant;

use crate::bound::{self, BoundError, BoundGpu};
use crate::eval::fallback::{chosen_policy, cross_validate, FallbackError};
use crate::eval::suite::candidate;
use crate::eval::{fit, Day, DaySet, Fitted, RowKind};
use crate::mig::{Geometry, GpuModel};
use crate::policy::search::SearchConfig;
use crate::policy::{
    parse_policy_on, Greedy, NoPartition, PolicyParseError, RepartitionPolicy, StaticLayout,
};
use crate::report::{plot, series, Comparison, ReportError, Row};
use crate::sim::{
    common_horizon, day_horizon, simulate, Collect, EtScore, Heuristic, Metrics, Reference,
    RunHooks, SimConfig, SimError, SimResult,
};
use crate::workload::Job;

/// Why a comparison could not be run.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("simulating `{policy}`")]
    Simulate {
        policy: String,
        #[source]
        source: SimError,
    },
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error("policy `{spec}`")]
    Policy {
        spec: String,
        #[source]
        source: PolicyParseError,
    },
    #[error(transparent)]
    Layout(#[from] PolicyParseError),
    #[error("fitting the opponents")]
    Opponents(#[source] SimError),
    #[error("hindsight searches")]
    Hindsight(#[source] SimError),
    #[error("choosing the fallback of `{spec}` on the training days")]
    Fallback {
        spec: String,
        #[source]
        source: FallbackError,
    },
    #[error(transparent)]
    Bound(#[from] BoundError),
    #[error(transparent)]
    Report(#[from] ReportError),
}

type Result<T, E = CompareError> = std::result::Result<T, E>;

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

/// What every run of a comparison shares.
#[derive(Clone, Copy, Debug)]
pub struct Setup<'a> {
    pub cluster: &'a [GpuModel],
    pub jobs: &'a [Job],
    pub cfg: &'a SimConfig,
    pub heuristic: Heuristic,
    pub opts: &'a CompareOptions,
}

/// One finished run, at its own horizon (before the common one is known).
#[derive(Clone, Debug)]
pub struct Run {
    /// The row's short name.
    pub policy: String,
    pub kind: RowKind,
    pub description: String,
    pub metrics: Metrics,
    /// Per-bin series of the run's event log.
    pub series: series::TimeSeries,
    /// Simulations the policy's search ran.
    pub search_runs: Option<usize>,
}

/// The comparison while it runs: the setup and the finished runs.
struct Ctx<'a> {
    setup: Setup<'a>,
    runs: Vec<Run>,
}

impl<'a> std::ops::Deref for Ctx<'a> {
    type Target = Setup<'a>;
    fn deref(&self) -> &Setup<'a> {
        &self.setup
    }
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
        let r = self
            .run(
                policy,
                RunHooks {
                    sink: Some(&mut log),
                    progress: None,
                },
            )
            .map_err(|source| CompareError::Simulate {
                policy: row.0.to_string(),
                source,
            })?;
        let series = series::from_records(&log.0, self.opts.bin_s)?;
        self.runs.push(Run {
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
    fn run(
        &self,
        policy: &mut dyn RepartitionPolicy,
        hooks: RunHooks<'_>,
    ) -> Result<SimResult, SimError> {
        let mut h = self.heuristic.build(self.cfg.seed);
        simulate(self.cluster, self.jobs, h.as_mut(), policy, self.cfg, hooks)
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
        setup: Setup {
            cluster,
            jobs,
            cfg,
            heuristic,
            opts,
        },
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
    )?;
    let train = if opts.training.is_empty() {
        None
    } else {
        Some(DaySet::new(cluster, heuristic, opts.training.clone())?)
    };
    let (rate, reference) = exchange_rate(&ctx, train.as_ref());
    arbitrary_static(&mut ctx)?;
    no_history(&mut ctx)?;
    let fitted = match &train {
        Some(t) => Some(opponents(&mut ctx, t, &rate)?),
        None => None,
    };
    candidates(&mut ctx, train.as_ref().zip(fitted.as_ref()), &rate)?;
    hindsight(&mut ctx, &rate)?;
    let mut c = assemble(&ctx.setup, &ctx.runs, rate, reference)?;
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

/// The opponents that need no history (`eval::suite::NO_HISTORY`):
/// smartmigd's allocate alone (`on-demand`), and a static layout refitted
/// every hour on what it has seen (`rolling-fit`), both from whole GPUs.
fn no_history(ctx: &mut Ctx<'_>) -> Result<()> {
    for spec in crate::eval::suite::NO_HISTORY {
        let mut p =
            parse_policy_on(spec, ctx.cluster, 0.0).map_err(|source| CompareError::Policy {
                spec: spec.to_string(),
                source,
            })?;
        let description = p.describe();
        ctx.run_logged(p.as_mut(), (spec, RowKind::Opponent, description), None)?;
    }
    Ok(())
}

/// The opponents: fitted on the training days, applied unchanged.
fn opponents(ctx: &mut Ctx<'_>, train: &DaySet, rate: &Reference) -> Result<Fitted> {
    let opts = ctx.opts;
    let fitted = fit(train, &opts.search, rate, opts.alpha).map_err(CompareError::Opponents)?;
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
        } else if let Some((_, fitted)) = past.filter(|_| spec.starts_with("policy:")) {
            // A learned policy begins the day where `static-hist` does, as
            // in `bench suite` (docs/policy.md, "A fitted start").
            candidate(&spec, &models, true, fitted.static_policy().layouts())
                .map_err(|source| CompareError::Policy { spec, source })?
        } else {
            parse_policy_on(&spec, ctx.cluster, 0.0)
                .map_err(|source| CompareError::Policy { spec, source })?
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
        let layouts = fitted.static_policy().layouts().to_vec();
        let choice = cross_validate(train, &opts.search, rate, opts.alpha, &name, &mut || {
            candidate(&spec, &models, true, &layouts)
        })
        .map_err(|source| CompareError::Fallback {
            spec: spec.clone(),
            source,
        })?;
        let mut p = chosen_policy(&choice.chosen, &layouts, &mut || {
            candidate(&spec, &models, true, &layouts)
        })?;
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
    let h =
        fit(&this_day, &ctx.opts.search, rate, ctx.opts.alpha).map_err(CompareError::Hindsight)?;
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

/// The table from finished runs (pure): charges every run at the common
/// horizon, scores it with `rate` (described by `reference`), and ranks
/// the rows beside the lower bounds.
pub fn assemble(
    setup: &Setup<'_>,
    runs: &[Run],
    rate: Reference,
    reference: String,
) -> Result<Comparison> {
    let (cluster, cfg, alpha) = (setup.cluster, setup.cfg, setup.opts.alpha);
    // The day's horizon: where `none` (the first row) ends.
    let horizon = runs.iter().find(|r| r.policy == "none").map_or_else(
        || common_horizon(runs.iter().map(|r| &r.metrics)),
        |r| day_horizon(&r.metrics),
    );
    let rows = runs
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
        .unwrap_or_else(|| setup.jobs.iter().map(|j| j.arrival).fold(0.0, f64::max));
    let bounds = bound::compute(setup.jobs, &gpus, bound_horizon)?;
    let et_lower_bound = rate.et(bounds.energy.total_j, bounds.tardiness.mean_s, alpha);
    let mut baselines = vec!["none".to_string()];
    if !setup.opts.training.is_empty() {
        baselines.extend(["static-hist".to_string(), "twice-daily-hist".to_string()]);
    }
    let mut c = Comparison {
        workload: setup.opts.workload.clone(),
        gpus: cluster.len(),
        models: GpuModel::distinct(cluster)
            .iter()
            .map(std::string::ToString::to_string)
            .collect(),
        placement: setup.heuristic.to_string(),
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

/// The files of `--report DIR` as `(file name, contents)`: `power.svg`,
/// `queue.svg`, `layouts-<policy>.svg` and `comparison.json`.
pub fn report_files(c: &Comparison) -> Result<Vec<(String, String)>> {
    let runs: Vec<(String, &series::TimeSeries)> = c
        .rows
        .iter()
        .filter_map(|r| r.series.as_ref().map(|s| (r.policy.clone(), s)))
        .collect();
    let mut files = vec![
        (
            "power.svg".to_string(),
            plot::lines(
                &format!("Cluster power, {} GPUs ({})", c.gpus, c.workload),
                "mean power (kW)",
                &runs,
                &|s| s.power_w.iter().map(|w| w / 1000.0).collect(),
            )?,
        ),
        (
            "queue.svg".to_string(),
            plot::lines(
                &format!("Waiting jobs ({})", c.workload),
                "mean queue length (jobs)",
                &runs,
                &|s| s.queue.clone(),
            )?,
        ),
    ];
    for (name, s) in &runs {
        files.push((
            format!("layouts-{}.svg", slug(name)),
            plot::layout_mix(&format!("Layout mix: {name}"), s, c.gpus)?,
        ));
    }
    let json = serde_json::to_string_pretty(c)
        .map_err(|e| ReportError::Invalid(format!("comparison as JSON: {e}")))?;
    files.push(("comparison.json".to_string(), json));
    Ok(files)
}
