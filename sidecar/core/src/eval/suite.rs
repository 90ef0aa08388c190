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
use crate::policy::shadow::{MakePolicy, Replay, ShadowRule, Shadowed, Toward};
use crate::policy::{parse_policy, NoPartition, PolicyParseError, RepartitionPolicy};
use crate::sim::{AuditError, Collect, Heuristic, Metrics, SimError};

use super::baselines::{fit, Fitted};
use super::days::{Day, DaySet};
use super::fallback::{cross_validate, FallbackChoice, FallbackError};
use super::score::{DayScore, PolicyRow, Reference, RowKind};
use super::{audit_run, AuditFailure};

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
}

impl ScenarioDays {
    /// The ET exchange rate: `train`'s `none` runs (this scenario's
    /// training days) pooled, floored by the training jobs' mean work.
    pub fn reference(&self, train: &DaySet) -> Reference {
        let (work, jobs) = self
            .train
            .iter()
            .flat_map(|d| &d.jobs)
            .fold((0.0, 0usize), |(w, n), j| (w + j.work, n + 1));
        Reference::pooled(&train.references, work / jobs.max(1) as f64)
    }
}

/// The scored scenario: the table's rows and what they were measured on.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    pub name: String,
    pub gpus: usize,
    pub models: Vec<String>,
    pub batch: bool,
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
    pub elapsed_s: f64,
}

struct Scorer<'a> {
    s: &'a ScenarioDays,
    cfg: &'a SuiteConfig,
    test: DaySet,
    reference: Reference,
    audited: usize,
}

impl Scorer<'_> {
    fn sim_err(&self, source: SimError) -> SuiteError {
        SuiteError::Sim {
            scenario: self.s.name.clone(),
            source,
        }
    }

    /// Runs `policy` on test day `i`, audits its log, scores it.
    fn day(
        &mut self,
        i: usize,
        name: &str,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<DayScore, SuiteError> {
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
        let label = self.test.days[i].label.clone();
        if self.cfg.audit {
            self.check(name, &label, &log, &r.metrics)?;
        }
        Ok(DayScore::of_run(
            &label,
            &r.metrics,
            &self.test.references[i],
            &self.reference,
            self.cfg.alpha,
        ))
    }

    fn check(
        &mut self,
        policy: &str,
        day: &str,
        log: &Collect,
        m: &Metrics,
    ) -> Result<(), SuiteError> {
        audit_run(&log.0, m).map_err(|failure| match failure {
            AuditFailure::Audit(source) => SuiteError::Audit {
                scenario: self.s.name.clone(),
                policy: policy.to_string(),
                day: day.to_string(),
                source,
            },
            AuditFailure::Mismatch {
                what,
                audited,
                reported,
            } => SuiteError::AuditMismatch {
                scenario: self.s.name.clone(),
                policy: policy.to_string(),
                day: day.to_string(),
                what,
                audited,
                reported,
            },
        })?;
        self.audited += 1;
        Ok(())
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
        nones: &[DayScore],
    ) -> Result<PolicyRow, SuiteError> {
        let (s, cfg, reference) = (self.s, self.cfg, self.reference);
        let row = format!("{name}+shadow");
        let r = cfg.shadow;
        let description = format!(
            "{spec} or {} (fixed layouts pursued from any state), switched during the day by the shadow rule: every {} s, window {} s, margin {}, {} checks",
            cfg.shadow_fallbacks.join(" or "),
            r.check_every_s, r.window_s, r.margin, r.hold_checks
        );
        self.row(&row, RowKind::Candidate, description, nones, &mut |i| {
            let day = &s.test[i];
            let (spec_c, models_c) = (spec.to_string(), models.to_vec());
            let mut make: Vec<MakePolicy> = vec![Box::new(move || {
                parse_policy(&spec_c, &models_c).map_err(|e| e.to_string())
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
                .map_err(|reason| SuiteError::Policy {
                    scenario: s.name.clone(),
                    spec: spec.to_string(),
                    source: PolicyParseError::Learned {
                        spec: spec.to_string(),
                        reason,
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
        nones: &[DayScore],
        make: &mut dyn FnMut(usize) -> Result<Box<dyn RepartitionPolicy + Send>, SuiteError>,
    ) -> Result<PolicyRow, SuiteError> {
        let mut days = Vec::new();
        for i in 0..self.test.len() {
            let mut p = make(i)?;
            days.push(self.day(i, name, p.as_mut())?);
        }
        Ok(PolicyRow::new(name, kind, description, days, nones))
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
            Box::new(move || parse_policy(&spec, &models).map_err(|e| e.to_string()))
        }
    }
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
    let fitted = fit(&train, &cfg.search, cfg.alpha).map_err(sim_err)?;
    let reference = s.reference(&train);
    let test = DaySet::new(&s.cluster, cfg.heuristic, s.test.clone()).map_err(sim_err)?;
    let models = GpuModel::distinct(&s.cluster);
    let mut sc = Scorer {
        s,
        cfg,
        test,
        reference,
        audited: 0,
    };
    let mut search_runs = fitted.evaluations() * train.len();

    progress("none");
    let mut nones = Vec::new();
    for i in 0..sc.test.len() {
        nones.push(sc.day(i, "none", &mut NoPartition)?);
    }
    let mut rows = vec![PolicyRow::new(
        "none",
        RowKind::Opponent,
        "whole GPUs (MIG off in effect)".into(),
        nones.clone(),
        &nones,
    )];
    progress("static-hist");
    let train_label = format!("fitted on {} training days", train.len());
    let sp = fitted.static_policy();
    rows.push(sc.row(
        "static-hist",
        RowKind::Opponent,
        format!("{} ({train_label})", fitted.static_spec(&train)),
        &nones,
        &mut |_| Ok(Box::new(sp.clone())),
    )?);
    progress("twice-daily-hist");
    let tp = fitted.twice_policy();
    rows.push(sc.row(
        "twice-daily-hist",
        RowKind::Opponent,
        format!("{} ({train_label})", tp.schedule(&s.cluster)),
        &nones,
        &mut |_| Ok(Box::new(tp.clone())),
    )?);
    for (name, spec) in &cfg.candidates {
        progress(name);
        let policy_err = |source| SuiteError::Policy {
            scenario: s.name.clone(),
            spec: spec.clone(),
            source,
        };
        let description = parse_policy(spec, &models).map_err(policy_err)?.describe();
        rows.push(
            sc.row(name, RowKind::Candidate, description, &nones, &mut |_| {
                parse_policy(spec, &models).map_err(policy_err)
            })?,
        );
    }
    let mut fallbacks = Vec::new();
    for (name, spec) in cfg
        .candidates
        .iter()
        .filter(|(name, _)| cfg.fallback_for.contains(name))
    {
        let row = format!("{name}+fallback");
        progress(&row);
        let policy_err = |source| SuiteError::Policy {
            scenario: s.name.clone(),
            spec: spec.clone(),
            source,
        };
        let choice = cross_validate(
            &train,
            &cfg.search,
            &reference,
            cfg.alpha,
            name,
            &mut || parse_policy(spec, &models),
        )
        .map_err(|e| match e {
            FallbackError::Sim(e) => sim_err(e),
            FallbackError::Policy(e) => policy_err(e),
        })?;
        rows.push(sc.row(
            &row,
            RowKind::Candidate,
            format!("{} on the training days", choice.describe()),
            &nones,
            &mut |_| match choice.chosen.as_str() {
                "none" => Ok(Box::new(NoPartition)),
                "static-hist" => Ok(Box::new(sp.clone())),
                _ => parse_policy(spec, &models).map_err(policy_err),
            },
        )?);
        fallbacks.push(choice);
    }
    for (name, spec) in cfg
        .candidates
        .iter()
        .filter(|(name, _)| cfg.shadow_for.contains(name))
    {
        progress(&format!("{name}+shadow"));
        rows.push(sc.shadow_row(name, spec, sp.layouts(), &models, &nones)?);
    }
    if cfg.hindsight {
        progress("hindsight references");
        let mut per_day: Vec<Fitted> = Vec::new();
        for day in &s.test {
            let one = DaySet::new(&s.cluster, cfg.heuristic, vec![day.clone()]).map_err(sim_err)?;
            let f = fit(&one, &cfg.search, cfg.alpha).map_err(sim_err)?;
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
        rows.push(sc.row(
            "static-hindsight",
            RowKind::Hindsight,
            format!("searched on each test day: {d}"),
            &nones,
            &mut |i| Ok(Box::new(per_day[i].static_policy())),
        )?);
        let d = described(&|f: &Fitted| f.twice.policy.schedule(&s.cluster));
        rows.push(sc.row(
            "twice-daily-hindsight",
            RowKind::Hindsight,
            format!("searched on each test day: {d}"),
            &nones,
            &mut |i| Ok(Box::new(per_day[i].twice_policy())),
        )?);
    }
    progress("lower bound");
    let gpus: Vec<BoundGpu> = s
        .cluster
        .iter()
        .map(|&m| BoundGpu {
            model: m,
            power: s.test[0].cfg.power_for(m),
        })
        .collect();
    let mut bound_days = Vec::new();
    for day in &s.test {
        let horizon = day
            .cfg
            .workload_horizon_s
            .unwrap_or_else(|| day.jobs.iter().map(|j| j.arrival).fold(0.0, f64::max));
        let b = bound::compute(&day.jobs, &gpus, horizon).map_err(|source| SuiteError::Bound {
            scenario: s.name.clone(),
            source,
        })?;
        bound_days.push(DayScore {
            day: day.label.clone(),
            et: reference.et(b.energy.total_j, b.tardiness.mean_s, cfg.alpha),
            et_seedwise: None,
            energy_j: b.energy.total_j,
            tardiness_s: b.tardiness.mean_s,
            metrics: None,
        });
    }
    rows.push(PolicyRow::new(
        "lower-bound",
        RowKind::Bound,
        "energy and tardiness bounded separately (docs/bounds.md); no schedule attains both".into(),
        bound_days,
        &nones,
    ));
    let jobs_per_day =
        s.test.iter().map(|d| d.jobs.len() as f64).sum::<f64>() / s.test.len() as f64;
    Ok(ScenarioResult {
        name: s.name.clone(),
        gpus: s.cluster.len(),
        models: models
            .iter()
            .map(std::string::ToString::to_string)
            .collect(),
        batch: s.batch,
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
        }
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
                "greedy",
                "static-hindsight",
                "twice-daily-hindsight",
                "lower-bound"
            ]
        );
        // Every simulated run's log was audited: 6 policies x 2 days.
        assert_eq!(r.audited_logs, 12);
        let none = r.row("none").unwrap();
        assert_eq!(none.days_worse_than_none, Some(0));
        assert!(none.et_seedwise.is_some_and(|e| (e - 1.0).abs() < 1e-12));
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
