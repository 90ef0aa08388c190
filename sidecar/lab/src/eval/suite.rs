//! Scenarios x test days x policies: the engine of `smartmig bench suite`.
//!
//! For each scenario the fixed opponents are fitted on its training days
//! (disjoint from the test days, and listed in the result), then every
//! policy runs every test day; each run's event log is re-checked by the
//! simulator's audit ([`crate::sim::audit`]) and must agree with the run's
//! metrics. The hindsight references are fitted on each test day itself.

use serde::Serialize;

use crate::bound::{self, BoundGpu};
use crate::mig::GpuModel;
use crate::policy::search::SearchConfig;
use crate::policy::shadow::{MakePolicy, Replay, ShadowError, ShadowRule, Shadowed, Toward};
use crate::policy::{parse_policy, NoPartition, PolicyParseError, RepartitionPolicy};
use crate::sim::{day_horizon, AuditError, AuditReport, Collect, Heuristic, Metrics, SimError};

use super::baselines::{fit, Fitted};
use super::days::{Day, DaySet};
use super::fallback::{chosen_policy, cross_validate, FallbackChoice, FallbackError};
use super::score::{DayScore, PolicyRow, Reference, RowKind};
use super::{agrees, audit_run, AuditFailure};

/// Why a scenario could not be scored.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error("scenario {scenario}: {source}")]
    Sim { scenario: String, source: SimError },
    #[error("scenario {scenario}, {policy} on {day}: the event log fails the audit: {source}")]
    Audit {
        scenario: String,
        policy: String,
        day: String,
        source: AuditError,
    },
    #[error("scenario {scenario}, {policy} on {day}: the audit recomputed {what} {audited}, the run reported {reported}")]
    AuditMismatch {
        scenario: String,
        policy: String,
        day: String,
        what: &'static str,
        audited: f64,
        reported: f64,
    },
    #[error("scenario {scenario}: policy `{spec}`: {source}")]
    Policy {
        scenario: String,
        spec: String,
        source: PolicyParseError,
    },
    #[error("scenario {scenario}: lower bound: {source}")]
    Bound {
        scenario: String,
        source: crate::bound::BoundError,
    },
    #[error("scenario {0}: it needs at least one training day and one test day")]
    NoDays(String),
}

/// How the suite scores each scenario.
#[derive(Clone, Debug)]
pub struct SuiteConfig {
    /// Weight of tardiness in ET.
    pub alpha: f64,
    pub heuristic: Heuristic,
    pub search: SearchConfig,
    /// Our policies, `(row name, policy spec)`, e.g. `("greedy", "greedy")`,
    /// `("learned", "policy:policies/a100-40gb.onnx")`.
    pub candidates: Vec<(String, String)>,
    /// Fit the hindsight references on each test day.
    pub hindsight: bool,
    /// Audit every run's event log.
    pub audit: bool,
    /// Candidates (by row name) also scored as `<name>+fallback`: the
    /// candidate where it beat `none` and the static layout on the
    /// training days, else the better of those ([`super::fallback`]).
    pub fallback_for: Vec<String>,
    /// Candidates (by row name) also scored as `<name>+shadow`: the
    /// candidate switched to and from the static layout fitted on the
    /// training days during each day, by the shadow rule
    /// ([`crate::policy::shadow`]).
    pub shadow_for: Vec<String>,
    pub shadow: ShadowRule,
    /// The shadow's fallbacks, in order: `static-hist` (the layout fitted
    /// on the training days), `none` (whole GPUs), or a policy spec such as
    /// `greedy`.
    pub shadow_fallbacks: Vec<String>,
    /// Our learned candidates (`policy:` specs) begin each day from the
    /// static layout fitted on the training days (as `static-hist` does)
    /// instead of their own initial layout, in every row of theirs
    /// ([`crate::policy::start`]). Greedy, a runnable heuristic, keeps its
    /// own start.
    pub start_fitted: bool,
}

impl Default for SuiteConfig {
    fn default() -> Self {
        SuiteConfig {
            alpha: 1.0,
            heuristic: Heuristic::Edf,
            search: SearchConfig::default(),
            candidates: vec![("greedy".into(), "greedy".into())],
            hindsight: true,
            audit: true,
            fallback_for: Vec::new(),
            shadow_for: Vec::new(),
            shadow: ShadowRule::default(),
            shadow_fallbacks: vec!["static-hist".into(), "greedy".into()],
            start_fitted: true,
        }
    }
}

/// The days of one scenario.
#[derive(Clone, Debug)]
pub struct ScenarioDays {
    /// `mix-shift/tight`, `alibaba/24h@0.8`.
    pub name: String,
    pub cluster: Vec<GpuModel>,
    /// The opponents are fitted on these.
    pub train: Vec<Day>,
    /// Every policy is scored on these.
    pub test: Vec<Day>,
    /// A bag of jobs at t = 0 (makespan and throughput are its metrics).
    pub batch: bool,
    /// Windows of a replayed trace, not generated days: the suite reports
    /// and gates the two kinds apart (issue 54).
    pub trace: bool,
}

impl ScenarioDays {
    /// The ET exchange rate: `train`'s `none` runs (this scenario's
    /// training days) pooled, floored by the training jobs' mean work.
    pub fn reference(&self, train: &DaySet) -> Reference {
        train.rate()
    }
}

/// The scored scenario: the table's rows and what they were measured on.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    pub name: String,
    pub gpus: usize,
    pub models: Vec<String>,
    pub batch: bool,
    /// Windows of a replayed trace ([`ScenarioDays::trace`]).
    pub trace: bool,
    pub train_days: Vec<String>,
    pub test_days: Vec<String>,
    /// Mean jobs per test day.
    pub jobs_per_day: f64,
    /// The ET exchange rate (pooled `none` over the training days).
    pub reference: Reference,
    pub joules_per_tardiness_s: f64,
    pub rows: Vec<PolicyRow>,
    /// Event logs re-checked by the audit.
    pub audited_logs: usize,
    /// Simulations the searches ran (each over all days of their set).
    pub search_runs: usize,
    /// The do-no-harm choices behind the `<name>+fallback` rows.
    pub fallbacks: Vec<FallbackChoice>,
}

impl ScenarioResult {
    /// The row named `policy`.
    pub fn row(&self, policy: &str) -> Option<&PolicyRow> {
        self.rows.iter().find(|r| r.policy == policy)
    }
}

/// The whole suite.
#[derive(Clone, Debug, Serialize)]
pub struct SuiteReport {
    pub alpha: f64,
    pub placement: String,
    pub scenarios: Vec<ScenarioResult>,
    /// Per scenario, the best row a site could run and its gap to the
    /// best hindsight reference ([`super::gates::best_runnable`]).
    pub best_runnable: Vec<super::gates::RunnableBest>,
    pub elapsed_s: f64,
}

/// One run of a row on one test day, at its own horizon, with its audit.
struct Run {
    metrics: Metrics,
    audit: Option<AuditReport>,
}

/// A row whose runs wait for the day's common horizon.
struct RawRow {
    name: String,
    kind: RowKind,
    description: String,
    runs: Vec<Run>,
}

struct Scorer<'a> {
    s: &'a ScenarioDays,
    cfg: &'a SuiteConfig,
    test: DaySet,
    reference: Reference,
    audited: usize,
    rows: Vec<RawRow>,
}

impl Scorer<'_> {
    fn sim_err(&self, source: SimError) -> SuiteError {
        SuiteError::Sim {
            scenario: self.s.name.clone(),
            source,
        }
    }

    fn audit_err(&self, policy: &str, day: &str, failure: AuditFailure) -> SuiteError {
        let (scenario, policy, day) = (self.s.name.clone(), policy.to_string(), day.to_string());
        match failure {
            AuditFailure::Audit(source) => SuiteError::Audit {
                scenario,
                policy,
                day,
                source,
            },
            AuditFailure::Mismatch {
                what,
                audited,
                reported,
            } => SuiteError::AuditMismatch {
                scenario,
                policy,
                day,
                what,
                audited,
                reported,
            },
        }
    }

    /// Runs `policy` on test day `i` and audits its log.
    fn day(
        &mut self,
        i: usize,
        name: &str,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<Run, SuiteError> {
        let mut log = Collect::default();
        let sink = if self.cfg.audit {
            Some(&mut log as &mut dyn crate::sim::EventSink)
        } else {
            None
        };
        let r = self
            .test
            .run(i, policy, sink)
            .map_err(|e| self.sim_err(e))?;
        let audit = if self.cfg.audit {
            let a = audit_run(&log.0, &r.metrics)
                .map_err(|f| self.audit_err(name, &self.test.days[i].label, f))?;
            self.audited += 1;
            Some(a)
        } else {
            None
        };
        Ok(Run {
            metrics: r.metrics,
            audit,
        })
    }

    /// The `<name>+shadow` row of candidate `spec`: the shadow rule
    /// switching it with `cfg.shadow_fallbacks` during each test day
    /// (`fitted`: the static layout fitted on the training days).
    fn shadow_row(
        &mut self,
        name: &str,
        spec: &str,
        fitted: &[crate::mig::Layout],
        models: &[GpuModel],
    ) -> Result<(), SuiteError> {
        let (s, cfg, reference) = (self.s, self.cfg, self.reference);
        let row = format!("{name}+shadow");
        let r = cfg.shadow;
        let description = format!(
            "{spec} or {} (fixed layouts pursued from any state), switched during the day by the shadow rule: every {} s, window {} s, margin {}, {} checks",
            cfg.shadow_fallbacks.join(" or "),
            r.check_every_s, r.window_s, r.margin, r.hold_checks
        );
        self.row(&row, RowKind::Candidate, description, &mut |i| {
            let day = &s.test[i];
            let (spec_c, models_c, start) = (spec.to_string(), models.to_vec(), cfg.start_fitted);
            let fitted_c = fitted.to_vec();
            let mut make: Vec<MakePolicy> = vec![Box::new(move || {
                candidate(&spec_c, &models_c, start, &fitted_c)
            })];
            for f in &cfg.shadow_fallbacks {
                make.push(shadow_fallback(f, fitted, &s.cluster, models));
            }
            let replay = Replay {
                cluster: s.cluster.clone(),
                heuristic: cfg.heuristic,
                cfg: day.cfg.clone(),
                joules_per_tardiness_s: reference.joules_per_tardiness_s(),
            };
            Shadowed::new(row.clone(), make, replay, day.jobs.clone(), r)
                .map(|p| Box::new(p) as Box<dyn RepartitionPolicy + Send>)
                .map_err(|e| SuiteError::Policy {
                    scenario: s.name.clone(),
                    spec: spec.to_string(),
                    source: match e {
                        ShadowError::Policy(e) => e,
                        other => PolicyParseError::Learned {
                            spec: spec.to_string(),
                            reason: other.to_string(),
                        },
                    },
                })
        })
    }

    /// One row: `make(i)` gives the policy for test day `i`.
    fn row(
        &mut self,
        name: &str,
        kind: RowKind,
        description: String,
        make: &mut dyn FnMut(usize) -> Result<Box<dyn RepartitionPolicy + Send>, SuiteError>,
    ) -> Result<(), SuiteError> {
        let mut runs = Vec::new();
        for i in 0..self.test.len() {
            let mut p = make(i)?;
            runs.push(self.day(i, name, p.as_mut())?);
        }
        self.rows.push(RawRow {
            name: name.to_string(),
            kind,
            description,
            runs,
        });
        Ok(())
    }

    /// Charges every run at its day's horizon (where that day's `none`
    /// ends, or the run's own end if later: `sim::day_horizon`), re-checks
    /// the charge against the audit's own, and scores the rows (`none`
    /// first).
    fn finish(&self) -> Result<Vec<PolicyRow>, SuiteError> {
        let horizons: Vec<f64> = (0..self.test.len())
            .map(|i| day_horizon(&self.rows[0].runs[i].metrics))
            .collect();
        let own: Vec<Reference> = (0..self.test.len())
            .map(|i| {
                let none = self.rows[0].runs[i].metrics.at_horizon(horizons[i]);
                Reference::own(&none, &self.test.days[i].jobs)
            })
            .collect();
        let mut scored = Vec::new();
        for row in &self.rows {
            let mut days = Vec::new();
            for (i, run) in row.runs.iter().enumerate() {
                let m = run.metrics.at_horizon(horizons[i]);
                let label = &self.test.days[i].label;
                if let Some(a) = &run.audit {
                    agrees(&a.at_horizon(horizons[i]), &m)
                        .map_err(|f| self.audit_err(&row.name, label, f))?;
                }
                days.push(DayScore::of_run(
                    label,
                    &m,
                    &own[i],
                    &self.reference,
                    self.cfg.alpha,
                ));
            }
            scored.push((row, days));
        }
        let nones = scored[0].1.clone();
        let mut rows: Vec<PolicyRow> = scored
            .into_iter()
            .map(|(r, days)| PolicyRow::new(&r.name, r.kind, r.description.clone(), days, &nones))
            .collect();
        rows.push(self.bound(&own, &nones)?);
        Ok(rows)
    }

    /// The lower bound's row (not a schedule; docs/bounds.md).
    fn bound(&self, own: &[Reference], nones: &[DayScore]) -> Result<PolicyRow, SuiteError> {
        let s = self.s;
        let gpus: Vec<BoundGpu> = s
            .cluster
            .iter()
            .map(|&m| BoundGpu {
                model: m,
                power: s.test[0].cfg.power_for(m),
            })
            .collect();
        let mut days = Vec::new();
        for (day, own) in s.test.iter().zip(own) {
            let horizon = day
                .cfg
                .workload_horizon_s
                .unwrap_or_else(|| day.jobs.iter().map(|j| j.arrival).fold(0.0, f64::max));
            let b =
                bound::compute(&day.jobs, &gpus, horizon).map_err(|source| SuiteError::Bound {
                    scenario: s.name.clone(),
                    source,
                })?;
            days.push(DayScore {
                day: day.label.clone(),
                et: self
                    .reference
                    .et(b.energy.total_j, b.tardiness.mean_s, self.cfg.alpha),
                et_seedwise: own.et(b.energy.total_j, b.tardiness.mean_s, self.cfg.alpha),
                energy_j: b.energy.total_j,
                tardiness_s: b.tardiness.mean_s,
                metrics: None,
            });
        }
        Ok(PolicyRow::new(
            "lower-bound",
            RowKind::Bound,
            "energy and tardiness bounded separately (docs/bounds.md); no schedule attains both"
                .into(),
            days,
            nones,
        ))
    }
}

/// A fallback of the shadow rows: fixed layouts pursued from any state
/// (`static-hist`: the fitted ones; `none`: whole GPUs) or a policy spec.
fn shadow_fallback(
    name: &str,
    fitted: &[crate::mig::Layout],
    cluster: &[GpuModel],
    models: &[GpuModel],
) -> MakePolicy {
    let fixed = |layouts: Vec<crate::mig::Layout>| -> MakePolicy {
        let toward = Toward {
            label: name.to_string(),
            layouts,
        };
        Box::new(move || Ok(Box::new(toward.clone())))
    };
    match name {
        "static-hist" => fixed(fitted.to_vec()),
        "none" => fixed(
            cluster
                .iter()
                .map(|&m| crate::mig::Geometry::of(m).whole_gpu())
                .collect(),
        ),
        spec => {
            let (spec, models) = (spec.to_string(), models.to_vec());
            Box::new(move || parse_policy(&spec, &models))
        }
    }
}

/// Candidate `spec`, started from `fitted` when `start_fitted` (the
/// config's `start_fitted`) and `spec` is a learned policy (`policy:`);
/// `simulate --compare` starts its learned rows the same way.
pub(crate) fn candidate(
    spec: &str,
    models: &[GpuModel],
    start_fitted: bool,
    fitted: &[crate::mig::Layout],
) -> Result<Box<dyn RepartitionPolicy + Send>, PolicyParseError> {
    let inner = parse_policy(spec, models)?;
    if !start_fitted || !spec.trim().starts_with("policy:") {
        return Ok(inner);
    }
    Ok(Box::new(crate::policy::start::StartingFrom {
        inner,
        layouts: fitted.to_vec(),
    }))
}

/// Scores one scenario (module docs). `progress` hears each step's name.
pub fn run_scenario(
    s: &ScenarioDays,
    cfg: &SuiteConfig,
    progress: &mut dyn FnMut(&str),
) -> Result<ScenarioResult, SuiteError> {
    if s.train.is_empty() || s.test.is_empty() {
        return Err(SuiteError::NoDays(s.name.clone()));
    }
    let sim_err = |source| SuiteError::Sim {
        scenario: s.name.clone(),
        source,
    };
    progress("fitting the opponents on the training days");
    let train = DaySet::new(&s.cluster, cfg.heuristic, s.train.clone()).map_err(sim_err)?;
    let reference = s.reference(&train);
    let fitted = fit(&train, &cfg.search, &reference, cfg.alpha).map_err(sim_err)?;
    let test = DaySet::new(&s.cluster, cfg.heuristic, s.test.clone()).map_err(sim_err)?;
    let mut sc = Scorer {
        s,
        cfg,
        test,
        reference,
        audited: 0,
        rows: Vec::new(),
    };
    let mut search_runs = fitted.evaluations() * train.len();
    opponent_rows(&mut sc, &fitted, train.len(), progress)?;
    let fallbacks = candidate_rows(&mut sc, &train, &fitted, progress)?;
    shadow_rows(&mut sc, &fitted, progress)?;
    if cfg.hindsight {
        progress("hindsight references");
        search_runs += hindsight_rows(&mut sc)?;
    }
    progress("lower bound");
    let rows = sc.finish()?;
    let jobs_per_day =
        s.test.iter().map(|d| d.jobs.len() as f64).sum::<f64>() / s.test.len() as f64;
    Ok(ScenarioResult {
        name: s.name.clone(),
        gpus: s.cluster.len(),
        models: GpuModel::distinct(&s.cluster)
            .iter()
            .map(std::string::ToString::to_string)
            .collect(),
        batch: s.batch,
        trace: s.trace,
        train_days: s.train.iter().map(|d| d.label.clone()).collect(),
        test_days: s.test.iter().map(|d| d.label.clone()).collect(),
        jobs_per_day,
        reference,
        joules_per_tardiness_s: reference.joules_per_tardiness_s(),
        rows,
        audited_logs: sc.audited,
        search_runs,
        fallbacks,
    })
}

/// `none`, the opponents fitted on the training days, and those that need
/// no history ([`NO_HISTORY`]: `on-demand` and `rolling-fit`, which start
/// each day from whole GPUs).
fn opponent_rows(
    sc: &mut Scorer<'_>,
    fitted: &Fitted,
    train_days: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<(), SuiteError> {
    progress("none");
    sc.row(
        "none",
        RowKind::Opponent,
        "whole GPUs (MIG off in effect)".into(),
        &mut |_| Ok(Box::new(NoPartition)),
    )?;
    progress("static-hist");
    let train_label = format!("fitted on {train_days} training days");
    let sp = fitted.static_policy();
    let spec = format!(
        "static:{}",
        crate::policy::search::describe_assignment(&sc.s.cluster, sp.layouts())
    );
    sc.row(
        "static-hist",
        RowKind::Opponent,
        format!("{spec} ({train_label})"),
        &mut |_| Ok(Box::new(sp.clone())),
    )?;
    progress("twice-daily-hist");
    let tp = fitted.twice_policy();
    sc.row(
        "twice-daily-hist",
        RowKind::Opponent,
        format!("{} ({train_label})", tp.schedule(&sc.s.cluster)),
        &mut |_| Ok(Box::new(tp.clone())),
    )?;
    let models = GpuModel::distinct(&sc.s.cluster);
    for spec in NO_HISTORY {
        progress(spec);
        let policy_err = |source| SuiteError::Policy {
            scenario: sc.s.name.clone(),
            spec: spec.to_string(),
            source,
        };
        let description = parse_policy(spec, &models).map_err(policy_err)?.describe();
        sc.row(spec, RowKind::Opponent, description, &mut |_| {
            parse_policy(spec, &models).map_err(policy_err)
        })?;
    }
    Ok(())
}

/// The causal opponent that needs no history (`policy::rolling`).
pub const ROLLING_FIT: &str = "rolling-fit";

/// The opponents that need no history, each a row of every table: what
/// smartmigd does with no policy at all (`on-demand`: every instance built
/// at the job's allocate, nothing prepared), and [`ROLLING_FIT`]. A policy
/// that does not beat `on-demand` adds nothing to smartmigd's allocate.
pub const NO_HISTORY: [&str; 2] = ["on-demand", ROLLING_FIT];

/// Our policies, then the `+fallback` rows; returns the fallback choices.
fn candidate_rows(
    sc: &mut Scorer<'_>,
    train: &DaySet,
    fitted: &Fitted,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<FallbackChoice>, SuiteError> {
    let (s, cfg) = (sc.s, sc.cfg);
    let models = GpuModel::distinct(&s.cluster);
    let policy_err = |spec: &str, source| SuiteError::Policy {
        scenario: s.name.clone(),
        spec: spec.to_string(),
        source,
    };
    let sp = fitted.static_policy();
    let start = cfg.start_fitted;
    for (name, spec) in &cfg.candidates {
        progress(name);
        let description = candidate(spec, &models, start, sp.layouts())
            .map_err(|e| policy_err(spec, e))?
            .describe();
        sc.row(name, RowKind::Candidate, description, &mut |_| {
            candidate(spec, &models, start, sp.layouts()).map_err(|e| policy_err(spec, e))
        })?;
    }
    let mut fallbacks = Vec::new();
    for (name, spec) in cfg
        .candidates
        .iter()
        .filter(|(name, _)| cfg.fallback_for.contains(name))
    {
        let row = format!("{name}+fallback");
        progress(&row);
        let choice = cross_validate(
            train,
            &cfg.search,
            &sc.reference,
            cfg.alpha,
            name,
            &mut || candidate(spec, &models, start, sp.layouts()),
        )
        .map_err(|e| match e {
            FallbackError::Sim(e) => sc.sim_err(e),
            FallbackError::Policy(e) => policy_err(spec, e),
        })?;
        sc.row(
            &row,
            RowKind::Candidate,
            format!("{} on the training days", choice.describe()),
            &mut |_| {
                chosen_policy(&choice.chosen, sp.layouts(), &mut || {
                    candidate(spec, &models, start, sp.layouts())
                })
                .map_err(|e| policy_err(spec, e))
            },
        )?;
        fallbacks.push(choice);
    }
    Ok(fallbacks)
}

/// The `<name>+shadow` rows of the candidates in `cfg.shadow_for`.
fn shadow_rows(
    sc: &mut Scorer<'_>,
    fitted: &Fitted,
    progress: &mut dyn FnMut(&str),
) -> Result<(), SuiteError> {
    let (s, cfg) = (sc.s, sc.cfg);
    let models = GpuModel::distinct(&s.cluster);
    let sp = fitted.static_policy();
    for (name, spec) in cfg
        .candidates
        .iter()
        .filter(|(name, _)| cfg.shadow_for.contains(name))
    {
        progress(&format!("{name}+shadow"));
        sc.shadow_row(name, spec, sp.layouts(), &models)?;
    }
    Ok(())
}

/// The hindsight references, fitted on each test day itself with the
/// scenario's exchange rate; returns the simulations the searches ran.
fn hindsight_rows(sc: &mut Scorer<'_>) -> Result<usize, SuiteError> {
    let (s, cfg) = (sc.s, sc.cfg);
    let mut per_day: Vec<Fitted> = Vec::new();
    let mut search_runs = 0;
    for day in &s.test {
        let one =
            DaySet::new(&s.cluster, cfg.heuristic, vec![day.clone()]).map_err(|e| sc.sim_err(e))?;
        let f = fit(&one, &cfg.search, &sc.reference, cfg.alpha).map_err(|e| sc.sim_err(e))?;
        search_runs += f.evaluations();
        per_day.push(f);
    }
    let described = |f: &dyn Fn(&Fitted) -> String| {
        per_day
            .iter()
            .zip(&s.test)
            .map(|(p, d)| format!("{}: {}", d.label, f(p)))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let d = described(&|f: &Fitted| {
        crate::policy::search::describe_assignment(&s.cluster, f.statics.policy.layouts())
    });
    sc.row(
        "static-hindsight",
        RowKind::Hindsight,
        format!("searched on each test day: {d}"),
        &mut |i| Ok(Box::new(per_day[i].static_policy())),
    )?;
    let d = described(&|f: &Fitted| f.twice.policy.schedule(&s.cluster));
    sc.row(
        "twice-daily-hindsight",
        RowKind::Hindsight,
        format!("searched on each test day: {d}"),
        &mut |i| Ok(Box::new(per_day[i].twice_policy())),
    )?;
    Ok(search_runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::testing::{quick_search, M};

    fn day(seed: u64, rate: f64) -> Day {
        crate::eval::testing::day(seed, 8.0, 6.0, rate)
    }

    fn cfg() -> SuiteConfig {
        SuiteConfig {
            search: quick_search(),
            ..SuiteConfig::default()
        }
    }

    fn scenario(test: Vec<Day>) -> ScenarioDays {
        ScenarioDays {
            name: "t".into(),
            cluster: vec![M; 4],
            train: vec![day(1, 4.6), day(2, 4.6)],
            test,
            batch: false,
            trace: false,
        }
    }

    #[test]
    fn only_learned_candidates_start_from_the_fitted_layout() {
        let g = crate::mig::Geometry::of(M);
        let split = g.catalog()[g.catalog().len() - 1];
        let mut greedy = candidate("greedy", &[M], true, &[split]).unwrap();
        let mut own = parse_policy("greedy", &[M]).unwrap();
        assert_ne!(own.initial_layout(0, g), split);
        assert_eq!(greedy.initial_layout(0, g), own.initial_layout(0, g));
        // A `policy:` spec is wrapped before its file is read: a missing
        // file is the parse error, not a silent unwrapped policy.
        assert!(candidate("policy:/nonexistent.onnx", &[M], true, &[split]).is_err());
    }

    fn describe(r: &ScenarioResult, policy: &str) -> String {
        r.row(policy)
            .map(|r| r.description.clone())
            .unwrap_or_default()
    }

    /// Causality: whatever the scored days hold, the opponents fitted on the
    /// training days are the same layouts; the hindsight references follow
    /// the scored days.
    #[test]
    fn opponents_do_not_see_the_scored_days() {
        let quiet = run_scenario(&scenario(vec![day(50, 1.2)]), &cfg(), &mut |_| {}).unwrap();
        let busy = run_scenario(
            &scenario(vec![day(60, 9.0), day(61, 9.0)]),
            &cfg(),
            &mut |_| {},
        )
        .unwrap();
        for p in ["static-hist", "twice-daily-hist"] {
            assert!(!describe(&quiet, p).is_empty());
            assert_eq!(describe(&quiet, p), describe(&busy, p), "{p}");
        }
        assert_ne!(
            describe(&quiet, "static-hindsight"),
            describe(&busy, "static-hindsight")
        );
        // The exchange rate comes from the training days alone too.
        assert_eq!(quiet.reference, busy.reference);
        assert_eq!(quiet.train_days, ["seed 1", "seed 2"]);
        assert_eq!(busy.test_days, ["seed 60", "seed 61"]);
    }

    #[test]
    fn rows_are_complete_audited_and_ordered() {
        let r = run_scenario(
            &scenario(vec![day(7, 4.6), day(8, 4.6)]),
            &cfg(),
            &mut |_| {},
        )
        .unwrap();
        let names: Vec<&str> = r.rows.iter().map(|r| r.policy.as_str()).collect();
        assert_eq!(
            names,
            [
                "none",
                "static-hist",
                "twice-daily-hist",
                "on-demand",
                "rolling-fit",
                "greedy",
                "static-hindsight",
                "twice-daily-hindsight",
                "lower-bound"
            ]
        );
        // Every simulated run's log was audited: 8 policies x 2 days.
        assert_eq!(r.audited_logs, 16);
        let none = r.row("none").unwrap();
        assert_eq!(none.days_worse_than_none, Some(0));
        assert!((none.et_seedwise - 1.0).abs() < 1e-12);
        // The bound is below every schedule on both energy and tardiness.
        let lb = r.row("lower-bound").unwrap();
        for row in r.rows.iter().filter(|r| r.kind != RowKind::Bound) {
            assert!(lb.energy_j <= row.energy_j + 1e-6, "{}", row.policy);
            assert!(lb.tardiness_s <= row.tardiness_s + 1e-6, "{}", row.policy);
            assert!(row.mean_wait_s.is_some() && row.p95_wait_s.is_some_and(|p| p >= 0.0));
        }
        // No training day: a clear error, not a silent hindsight fit.
        let mut none = scenario(vec![day(7, 4.6)]);
        none.train.clear();
        let e = run_scenario(&none, &cfg(), &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("training day"), "{e}");
    }

    /// The `+fallback` row runs, on every test day, exactly the policy its
    /// choice names: the candidate's runs or the chosen fallback's.
    #[test]
    fn the_fallback_row_runs_what_it_chose() {
        let mut s = scenario(vec![day(7, 4.6), day(8, 4.6)]);
        s.train.extend([day(3, 4.6), day(4, 4.6)]);
        let cfg = SuiteConfig {
            hindsight: false,
            fallback_for: vec!["greedy".into()],
            ..cfg()
        };
        let r = run_scenario(&s, &cfg, &mut |_| {}).unwrap();
        assert_eq!(r.fallbacks.len(), 1);
        let choice = &r.fallbacks[0];
        let names: Vec<&str> = choice.history.iter().map(|h| h.policy.as_str()).collect();
        assert_eq!(names, ["greedy", "none", "static-hist"]);
        assert!(choice.history.iter().all(|h| h.days.len() == 4));
        let row = r.row("greedy+fallback").unwrap();
        assert!(row
            .description
            .starts_with(&format!("chose {}", choice.chosen)));
        let ran = r.row(&choice.chosen).unwrap();
        for (a, b) in row.days.iter().zip(&ran.days) {
            assert_eq!(a.et, b.et, "{}", choice.chosen);
        }
    }

    /// The `+shadow` row runs every test day (audited like the others);
    /// with `none` as the only fallback and a rule that never finds a
    /// lead big enough, it is the candidate itself, day by day.
    #[test]
    fn the_shadow_row_is_the_candidate_until_a_fallback_leads() {
        let s = scenario(vec![day(7, 4.6), day(8, 4.6)]);
        let cfg = SuiteConfig {
            hindsight: false,
            shadow_for: vec!["greedy".into()],
            shadow_fallbacks: vec!["none".into()],
            shadow: ShadowRule {
                margin: 1.0,
                ..ShadowRule::default()
            },
            ..cfg()
        };
        let r = run_scenario(&s, &cfg, &mut |_| {}).unwrap();
        let row = r.row("greedy+shadow").unwrap();
        let alone = r.row("greedy").unwrap();
        assert_eq!(row.days.len(), 2);
        for (a, b) in row.days.iter().zip(&alone.days) {
            assert_eq!(a.et, b.et);
        }
        assert!(
            row.description.contains("greedy or none"),
            "{}",
            row.description
        );
    }
}
