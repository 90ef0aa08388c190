//! Do no harm: a policy of ours runs only where, on the site's *past*
//! days, it beat what the site would run without it.
//!
//! A learned policy can be confidently wrong on a workload unlike its
//! training days (a batch queue, a day whose deadlines are loose), and the
//! confidence of its network does not show it. What does show it is the
//! site's own history: replayed on past days, the policy either beat the
//! layouts an admin would fall back to (whole GPUs, or the static layout
//! fitted on those days) or it did not. [`choose`] keeps the candidate
//! only when it did by more than the day-to-day noise; otherwise the
//! better of the two runs instead.
//!
//! Both fallbacks are what a site can install: whole GPUs (MIG off, no
//! smartmigd) or the fitted layouts put into smartmigd's `policy =
//! "static:..."`, which smartmigd serves through shards on demand, so the
//! static fallback is scored that way ([`StaticThroughSmartmigd`]), not as
//! the `static-hist` opponent under Slurm's own GRES. A twice-daily
//! schedule is an opponent of the yardstick but no daemon setting, so it
//! is no fallback. The choice is causal (past days only); `smartmig bench
//! suite` scores it as `<name>+fallback`, and a site makes the same choice
//! by running the suite on its own trace (`docs/policy.md`, "Do no
//! harm").
//!
//! [`cross_validate`] never judges a fitted layout on a day it was fitted
//! on: scored in-sample (the first version), the fitted layouts beat the
//! learned policy on every scenario's training days, including campaigns,
//! where it wins by 24 % on the test days.

use serde::Serialize;

use crate::mig::Layout;
use crate::policy::search::{static_best, SearchConfig};
use crate::policy::{NoPartition, PolicyParseError, RepartitionPolicy, StaticThroughSmartmigd};
use crate::sim::{day_horizon, Metrics, Reference, SimError, Standing};

use super::days::DaySet;

/// Why the past days could not be scored.
#[derive(Debug, thiserror::Error)]
pub enum FallbackError {
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error(transparent)]
    Policy(#[from] PolicyParseError),
}

/// A contender's scores on the past days (lower is better; see
/// [`cross_validate`]), in the order of the days.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HistoryScore {
    pub policy: String,
    /// The mean of `days`.
    pub objective: f64,
    /// ET per day.
    pub days: Vec<f64>,
    /// Jobs that never ran, over all the days: a contender with more never
    /// runs instead of one with fewer (`sim::Standing`).
    pub unserved: u64,
}

impl HistoryScore {
    pub fn new(policy: &str, days: Vec<f64>, unserved: u64) -> Self {
        let objective = days.iter().sum::<f64>() / days.len().max(1) as f64;
        HistoryScore {
            policy: policy.to_string(),
            objective,
            days,
            unserved,
        }
    }

    /// Where the contender stands on the past days.
    pub fn standing(&self) -> Standing {
        Standing::new(self.unserved, self.objective)
    }
}

/// What [`choose`] decided, with the scores it decided on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FallbackChoice {
    /// The name of the policy that runs: the candidate's or a fallback's.
    pub chosen: String,
    /// The candidate first, then the fallbacks, in the order given.
    pub history: Vec<HistoryScore>,
    /// The candidate's mean per-day lead over the best fallback (positive:
    /// the candidate scored lower) and its standard error.
    pub lead: f64,
    pub lead_se: f64,
}

impl FallbackChoice {
    /// Whether the candidate itself runs.
    pub fn keeps_candidate(&self) -> bool {
        self.history
            .first()
            .is_some_and(|c| c.policy == self.chosen)
    }

    /// `chose static-hist (past days: learned 0.812, none 1.000, ...; lead -0.010 +- 0.020)`,
    /// with `(N unserved)` after a contender that left jobs unserved.
    pub fn describe(&self) -> String {
        let scores: Vec<String> = self
            .history
            .iter()
            .map(|h| {
                let unserved = if h.unserved > 0 {
                    format!(" ({} unserved)", h.unserved)
                } else {
                    String::new()
                };
                format!("{} {:.3}{unserved}", h.policy, h.objective)
            })
            .collect();
        format!(
            "chose {} (past days: {}; lead {:+.3} +- {:.3})",
            self.chosen,
            scores.join(", "),
            self.lead,
            self.lead_se
        )
    }
}

/// Mean and standard error of the paired differences `b - a`.
fn paired_lead(a: &[f64], b: &[f64]) -> (f64, f64) {
    let d: Vec<f64> = b.iter().zip(a).map(|(b, a)| b - a).collect();
    let n = d.len() as f64;
    if d.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = d.iter().sum::<f64>() / n;
    if d.len() < 2 {
        return (mean, f64::INFINITY);
    }
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// The one-standard-error rule: the candidate runs only if, against the
/// best fallback (the fewest jobs left unserved, then the lowest mean), it
/// left fewer jobs unserved, or as few and its mean per-day lead exceeds
/// one standard error of the paired differences (a lead within the
/// day-to-day noise of the past days is no evidence; Breiman et al. 1984,
/// Hastie et al., ESL 7.10). More jobs unserved never wins, nor does a
/// NaN; with one past day the standard error is unknown and the fallback
/// runs. Otherwise the best fallback runs (the first on ties). With no
/// fallbacks the candidate runs.
pub fn choose(candidate: HistoryScore, fallbacks: Vec<HistoryScore>) -> FallbackChoice {
    let best_fallback = fallbacks.iter().filter(|f| !f.objective.is_nan()).fold(
        None::<&HistoryScore>,
        |best, f| match best {
            Some(b) if b.standing() <= f.standing() => Some(b),
            _ => Some(f),
        },
    );
    let (lead, lead_se) = best_fallback.map_or((f64::NAN, f64::NAN), |f| {
        paired_lead(&candidate.days, &f.days)
    });
    // A NaN lead (a NaN day) or standard error is no evidence either.
    let convincing = best_fallback.is_none_or(|f| match candidate.unserved.cmp(&f.unserved) {
        std::cmp::Ordering::Less => true,
        std::cmp::Ordering::Greater => false,
        std::cmp::Ordering::Equal => lead > lead_se,
    }) && !candidate.objective.is_nan();
    let chosen = match best_fallback {
        Some(f) if !convincing => f.policy.clone(),
        _ => candidate.policy.clone(),
    };
    let mut history = vec![candidate];
    history.extend(fallbacks);
    FallbackChoice {
        chosen,
        history,
        lead,
        lead_se,
    }
}

/// A fresh copy of the candidate, for each run that needs one.
pub type MakeCandidate<'a> =
    dyn FnMut() -> Result<Box<dyn RepartitionPolicy + Send>, PolicyParseError> + 'a;

/// The policy a `<name>+fallback` row runs for its `chosen` contender:
/// whole GPUs for `none`, the `fitted` layouts as smartmigd runs them for
/// `static-hist` (the contender [`cross_validate`] scored), else the
/// candidate.
pub fn chosen_policy(
    chosen: &str,
    fitted: &[Layout],
    candidate: &mut MakeCandidate<'_>,
) -> Result<Box<dyn RepartitionPolicy + Send>, PolicyParseError> {
    Ok(match chosen {
        "none" => Box::new(NoPartition),
        "static-hist" => Box::new(static_fallback(fitted)),
        _ => candidate()?,
    })
}

/// The static fallback: `layouts` installed by smartmigd (module docs).
fn static_fallback(layouts: &[Layout]) -> StaticThroughSmartmigd {
    StaticThroughSmartmigd {
        label: "static-hist".to_string(),
        layouts: layouts.to_vec(),
    }
}

/// Scores the candidate and the fallbacks (`none`, `static-hist`) on the
/// past days `history` by two-fold cross-validation, and [`choose`]s. The
/// static layout is fitted on the first half of the days and scored, as
/// smartmigd runs it, on the second, then the other way round; the
/// candidate (a fresh one per day, from `candidate`) runs every day once,
/// and `none` is each day's reference run. Each day's three runs are
/// charged at their common horizon (`sim::metrics`) and scored with
/// `reference`. With a single past day there is nothing to hold out: the
/// layout is fitted and scored on it (in-sample, which favours falling
/// back).
pub fn cross_validate(
    history: &DaySet,
    search: &SearchConfig,
    reference: &Reference,
    alpha: f64,
    candidate_name: &str,
    candidate: &mut MakeCandidate<'_>,
) -> Result<FallbackChoice, FallbackError> {
    let n = history.len();
    let ours = (0..n)
        .map(|i| Ok(history.run(i, candidate()?.as_mut(), None)?.metrics))
        .collect::<Result<Vec<Metrics>, FallbackError>>()?;
    let mut statics: Vec<Metrics> = vec![Metrics::default(); n];
    let half = n / 2;
    let folds: Vec<(Vec<usize>, Vec<usize>)> = if n < 2 {
        vec![((0..n).collect(), (0..n).collect())]
    } else {
        vec![
            ((0..half).collect(), (half..n).collect()),
            ((half..n).collect(), (0..half).collect()),
        ]
    };
    for (fit_on, score_on) in folds {
        let subset = DaySet {
            cluster: history.cluster.clone(),
            heuristic: history.heuristic,
            days: fit_on.iter().map(|&i| history.days[i].clone()).collect(),
            references: fit_on
                .iter()
                .map(|&i| history.references[i].clone())
                .collect(),
        };
        let mut evaluate = |p: &mut dyn RepartitionPolicy| subset.objective(p, reference, alpha);
        let fitted = static_best(&subset.cluster, search, &mut evaluate)?;
        for &i in &score_on {
            let mut installed = static_fallback(fitted.policy.layouts());
            statics[i] = history.run(i, &mut installed, None)?.metrics;
        }
    }
    // The `none` run of every day is already in the set.
    let contenders = [&ours, &history.references, &statics];
    let mut scores = contenders.map(|_| (Vec::with_capacity(n), 0u64));
    for i in 0..n {
        let h = day_horizon(&history.references[i]);
        for (c, (days, unserved)) in contenders.iter().zip(&mut scores) {
            let m = c[i].at_horizon(h);
            days.push(reference.et_of(&m, alpha));
            *unserved += m.never_ran();
        }
    }
    let [ours, none, statics] = scores;
    Ok(choose(
        HistoryScore::new(candidate_name, ours.0, ours.1),
        vec![
            HistoryScore::new("none", none.0, none.1),
            HistoryScore::new("static-hist", statics.0, statics.1),
        ],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::days::{Day, DaySet};
    use crate::mig::{Geometry, GpuModel};
    use crate::policy::search::StaticMix;
    use crate::sim::Heuristic;
    use crate::workload::{Job, JobClass, SpeedupCurve};

    /// A `+fallback` row that chose `static-hist` runs the fitted layouts
    /// as smartmigd runs them once a site puts them into `policy =
    /// "static:..."`: a job billed 2 shards has a `2g` re-shaped out of an
    /// idle whole GPU (a reconfiguration each time), where the
    /// `static-hist` opponent under Slurm's own GRES runs it on the whole
    /// GPU and never reconfigures. `none` stays whole GPUs.
    #[test]
    fn the_static_fallback_is_served_as_smartmigd_serves_it() {
        let cluster = vec![GpuModel::A100_40gb; 2];
        let whole = Geometry::of(GpuModel::A100_40gb).whole_gpu();
        let jobs: Vec<Job> = (0..4)
            .map(|id| Job {
                id,
                arrival: id as f64 * 600.0,
                work: 300.0,
                speedup: SpeedupCurve::new(1.0, 1.0).unwrap(),
                memory_gb: 4.0,
                deadline: 86_400.0,
                class: JobClass::Inference,
                requested_slices: Some(2),
                declared_memory_gb: None,
                template: None,
                memory_growth: None,
                gpus: 1,
            })
            .collect();
        let days = DaySet::new(
            &cluster,
            Heuristic::Edf,
            vec![Day::generated(jobs, 0, 3_600.0, 0.0)],
        )
        .unwrap();
        let mut never = || -> Result<Box<dyn RepartitionPolicy + Send>, PolicyParseError> {
            unreachable!("the candidate is not the choice")
        };
        let fitted = [whole, whole];
        let mut fallback = chosen_policy("static-hist", &fitted, &mut never).unwrap();
        assert!(fallback.served_through_shards());
        assert_eq!(fallback.name(), "static-hist");
        let deployed = days.run(0, fallback.as_mut(), None).unwrap().metrics;
        let mut opponent = StaticMix::from_indices("static-hist", &cluster, &[0, 0]);
        assert_eq!(opponent.layouts(), &fitted[..]);
        let gres = days.run(0, &mut opponent, None).unwrap().metrics;
        assert_eq!(gres.reconfigurations, 0);
        assert!(deployed.reconfigurations > 0, "{deployed:?}");
        assert_eq!(deployed.completed, 4);
        let none = chosen_policy("none", &fitted, &mut never).unwrap();
        assert!(!none.served_through_shards());
    }

    fn s(policy: &str, days: &[f64]) -> HistoryScore {
        HistoryScore::new(policy, days.to_vec(), 0)
    }

    #[test]
    fn the_candidate_runs_only_when_its_lead_exceeds_the_noise() {
        let fallbacks = || {
            vec![
                s("none", &[1.0, 1.0, 1.0]),
                s("static-hist", &[0.8, 0.7, 0.9]),
                s("twice", &[0.8, 0.8, 0.8]),
            ]
        };
        // A steady lead of 0.05 a day over static-hist (the first of the
        // two best fallbacks): zero spread, it runs.
        let c = choose(s("learned", &[0.75, 0.65, 0.85]), fallbacks());
        assert_eq!(c.chosen, "learned");
        assert!(c.keeps_candidate());
        assert!((c.lead - 0.05).abs() < 1e-12 && c.lead_se < 1e-12);
        // The same mean lead, but won on one day and lost on two: noise.
        let c = choose(s("learned", &[0.5, 0.75, 0.95]), fallbacks());
        assert_eq!(c.chosen, "static-hist");
        assert!(!c.keeps_candidate());
        // A tie is not a win.
        let c = choose(s("learned", &[0.8, 0.7, 0.9]), fallbacks());
        assert_eq!(c.chosen, "static-hist");
        let c = choose(s("learned", &[1.3, 1.3, 1.3]), fallbacks());
        assert_eq!(c.chosen, "static-hist");
        assert_eq!(c.history.len(), 4);
        assert!(
            c.describe()
                .starts_with("chose static-hist (past days: learned 1.300, none 1.000"),
            "{}",
            c.describe()
        );
    }

    #[test]
    fn nan_never_wins_one_day_is_no_evidence_and_no_fallback_keeps_the_candidate() {
        let c = choose(s("learned", &[f64::NAN, 0.1]), vec![s("none", &[1.0, 1.0])]);
        assert_eq!(c.chosen, "none");
        let c = choose(
            s("learned", &[0.5, 0.5]),
            vec![s("none", &[f64::NAN, 1.0]), s("static-hist", &[0.6, 0.7])],
        );
        assert_eq!(c.chosen, "learned");
        assert_eq!(
            choose(s("learned", &[0.1]), vec![s("none", &[1.0])]).chosen,
            "none"
        );
        assert_eq!(choose(s("learned", &[2.0]), vec![]).chosen, "learned");
    }

    /// Jobs left unserved on the past days decide before any ET: the
    /// candidate that starved jobs never runs, one that served more does.
    #[test]
    fn leaving_jobs_unserved_decides_before_et() {
        let starving = HistoryScore::new("learned", vec![0.1, 0.1, 0.1], 2);
        let c = choose(starving, vec![s("none", &[1.0, 1.0, 1.0])]);
        assert_eq!(c.chosen, "none");
        assert!(
            c.describe().contains("learned 0.100 (2 unserved)"),
            "{}",
            c.describe()
        );
        let c = choose(
            s("learned", &[3.0, 3.0, 3.0]),
            vec![
                HistoryScore::new("none", vec![1.0, 1.0, 1.0], 1),
                HistoryScore::new("static-hist", vec![0.5, 0.5, 0.5], 4),
            ],
        );
        assert_eq!(c.chosen, "learned");
        // The best fallback is the one with fewer unserved jobs.
        let c = choose(
            HistoryScore::new("learned", vec![0.9, 0.9], 1),
            vec![
                HistoryScore::new("none", vec![1.0, 1.0], 1),
                HistoryScore::new("static-hist", vec![0.5, 0.5], 4),
            ],
        );
        assert_eq!(c.chosen, "learned");
    }
}
