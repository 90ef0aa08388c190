//! Per-day results of a policy and their aggregate over the test days.
//!
//! ET needs an exchange rate between joules and tardiness-seconds. Scoring
//! each day against its own `none` run (the seed-wise ET) makes that rate
//! swing with the day: one tardiness-second was worth 155 to 2,497 J across
//! diurnal seeds. Here the rate is fixed per scenario by a [`Reference`]
//! pooled over the *training* days' `none` runs (mean energy, mean
//! tardiness): every scored day, and every policy, is converted with the
//! same rate, which the scored days cannot move.

use serde::Serialize;

pub use crate::sim::Reference;
use crate::sim::{Metrics, Standing};

/// What a row is in the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RowKind {
    /// What a site runs without smartmig: whole GPUs, or a layout chosen
    /// on past days.
    Opponent,
    /// A policy of ours.
    Candidate,
    /// Knows the scored day in advance (hindsight): an upper reference.
    Hindsight,
    /// A lower bound, not a schedule.
    Bound,
}

/// One policy on one test day, charged at the day's horizon (where `none`
/// ends, or the run's own end if later: `sim::day_horizon`).
#[derive(Clone, Debug, Serialize)]
pub struct DayScore {
    pub day: String,
    /// ET with the scenario's pooled reference.
    pub et: f64,
    /// ET against this day's own `none` run, `T_ref` floored by the day's
    /// jobs (the seed-wise ET).
    pub et_seedwise: f64,
    pub energy_j: f64,
    pub tardiness_s: f64,
    /// The full metrics (absent for the lower bound).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
}

impl DayScore {
    /// A simulated run on `day`; `own` is the day's own `none` run as a
    /// reference ([`Reference::own`]), `reference` the scenario's.
    pub fn of_run(
        day: &str,
        m: &Metrics,
        own: &Reference,
        reference: &Reference,
        alpha: f64,
    ) -> Self {
        DayScore {
            day: day.to_string(),
            et: reference.et_of(m, alpha),
            et_seedwise: own.et_of(m, alpha),
            energy_j: m.energy_j,
            tardiness_s: m.mean_tardiness_s,
            metrics: Some(m.clone()),
        }
    }
}

/// One policy over the test days of a scenario: the row of the tables and
/// of the JSON (`policy`, `et`, `energy_j`, `tardiness_s`, `late_share`,
/// `mean_wait_s`, ...).
#[derive(Clone, Debug, Serialize)]
pub struct PolicyRow {
    /// Short name: `none`, `static-hist`, `learned`, ...
    pub policy: String,
    pub kind: RowKind,
    /// What exactly ran (the layouts a search chose, the model file).
    pub description: String,
    /// Mean over the test days of the pooled-reference ET.
    pub et: f64,
    /// The 5th and 95th percentiles of that mean over the test days
    /// resampled with replacement ([`bootstrap_mean_90`]); `None` with
    /// fewer than two days.
    pub et_90: Option<(f64, f64)>,
    /// Mean over the test days of the seed-wise ET.
    pub et_seedwise: f64,
    /// Mean energy per test day, J.
    pub energy_j: f64,
    /// Mean over the test days of the mean tardiness, s.
    pub tardiness_s: f64,
    pub late_share: Option<f64>,
    pub mean_wait_s: Option<f64>,
    /// Mean over the test days of each day's 95th-percentile wait.
    pub p95_wait_s: Option<f64>,
    pub mean_bounded_slowdown: Option<f64>,
    pub jobs_per_hour: Option<f64>,
    pub makespan_s: Option<f64>,
    pub reconfigurations: Option<f64>,
    /// Mean per test day of the reconfigurations by kind (fusion, fission,
    /// reshape; `sim::reshape`): they sum to `reconfigurations`.
    pub fusions: Option<f64>,
    pub fissions: Option<f64>,
    pub reshapes: Option<f64>,
    /// Mean per test day of the jobs that completed on an instance a
    /// fusion (fission) created: what each kind gained.
    pub jobs_served_by_fusion: Option<f64>,
    pub jobs_served_by_fission: Option<f64>,
    /// Jobs that never ran (unserved and rejected), summed over the test
    /// days: a row with any ranks behind every row that has none.
    pub unserved: Option<u64>,
    /// The worst test day's `ET / ET(none) - 1` (both pooled-reference).
    pub worst_day_vs_none: Option<f64>,
    /// Test days on which this policy's ET is above `none`'s.
    pub days_worse_than_none: Option<usize>,
    pub days: Vec<DayScore>,
}

fn mean(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| s / n as f64)
}

impl PolicyRow {
    /// Aggregates `days` (in the order of `nones`, the `none` row's days).
    pub fn new(
        policy: &str,
        kind: RowKind,
        description: String,
        days: Vec<DayScore>,
        nones: &[DayScore],
    ) -> Self {
        let ms: Vec<&Metrics> = days.iter().filter_map(|d| d.metrics.as_ref()).collect();
        let over = |f: &dyn Fn(&Metrics) -> f64| {
            if ms.len() == days.len() {
                mean(ms.iter().map(|m| f(m)))
            } else {
                None
            }
        };
        let vs_none: Vec<f64> = days
            .iter()
            .zip(nones)
            .map(|(d, n)| if n.et > 0.0 { d.et / n.et - 1.0 } else { 0.0 })
            .collect();
        let comparable = kind != RowKind::Bound && vs_none.len() == days.len();
        PolicyRow {
            policy: policy.to_string(),
            kind,
            description,
            et: mean(days.iter().map(|d| d.et)).unwrap_or(f64::NAN),
            et_90: bootstrap_mean_90(&days.iter().map(|d| d.et).collect::<Vec<_>>()),
            et_seedwise: mean(days.iter().map(|d| d.et_seedwise)).unwrap_or(f64::NAN),
            energy_j: mean(days.iter().map(|d| d.energy_j)).unwrap_or(f64::NAN),
            tardiness_s: mean(days.iter().map(|d| d.tardiness_s)).unwrap_or(f64::NAN),
            late_share: over(&|m| m.late_share),
            mean_wait_s: over(&|m| m.mean_wait_s),
            p95_wait_s: over(&|m| m.p95_wait_s),
            mean_bounded_slowdown: over(&|m| m.mean_bounded_slowdown),
            jobs_per_hour: over(&|m| m.jobs_per_hour),
            makespan_s: over(&|m| m.makespan_s),
            reconfigurations: over(&|m| m.reconfigurations as f64),
            fusions: over(&|m| m.fusions as f64),
            fissions: over(&|m| m.fissions as f64),
            reshapes: over(&|m| m.reshapes as f64),
            jobs_served_by_fusion: over(&|m| m.jobs_served_by_fusion as f64),
            jobs_served_by_fission: over(&|m| m.jobs_served_by_fission as f64),
            unserved: (ms.len() == days.len()).then(|| ms.iter().map(|m| m.never_ran()).sum()),
            worst_day_vs_none: comparable
                .then(|| vs_none.iter().copied().fold(f64::NEG_INFINITY, f64::max))
                .filter(|v| v.is_finite()),
            days_worse_than_none: comparable.then(|| vs_none.iter().filter(|&&v| v > 1e-9).count()),
            days,
        }
    }

    /// Where the row stands: its jobs that never ran, then its mean ET.
    pub fn standing(&self) -> Standing {
        Standing::new(self.unserved.unwrap_or(0), self.et)
    }
}

/// Resamples behind every interval of the suite's tables.
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// The 5th and 95th percentiles of the mean of `values` (one per test
/// day) over [`BOOTSTRAP_RESAMPLES`] resamples with replacement; `None`
/// with fewer than two values. Seeded, so a table prints the same interval
/// every time.
pub fn bootstrap_mean_90(values: &[f64]) -> Option<(f64, f64)> {
    use rand::{Rng, SeedableRng};
    let n = values.len();
    if n < 2 {
        return None;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(54);
    let mut means: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| (0..n).map(|_| values[rng.random_range(0..n)]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    Some(percentiles_90(&means))
}

/// The 5th and 95th percentiles of sorted `v` (nearest rank).
pub(crate) fn percentiles_90(v: &[f64]) -> (f64, f64) {
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.05), at(0.95))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_holds_the_mean_and_widens_with_the_spread() {
        assert_eq!(bootstrap_mean_90(&[1.0]), None);
        let (lo, hi) = bootstrap_mean_90(&[1.0, 1.0, 1.0, 1.0]).unwrap();
        assert_eq!((lo, hi), (1.0, 1.0));
        let calm: Vec<f64> = (0..48).map(|i| 1.0 + 0.01 * f64::from(i % 3)).collect();
        let wild: Vec<f64> = (0..48)
            .map(|i| if i % 8 == 0 { 3.0 } else { 1.0 })
            .collect();
        let (a, b) = bootstrap_mean_90(&calm).unwrap();
        let (c, d) = bootstrap_mean_90(&wild).unwrap();
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        assert!(a <= mean(&calm) && mean(&calm) <= b);
        assert!(c <= mean(&wild) && mean(&wild) <= d);
        assert!(d - c > 10.0 * (b - a), "{a}-{b} vs {c}-{d}");
    }

    fn m(energy_j: f64, tardiness: f64) -> Metrics {
        Metrics {
            energy_j,
            mean_tardiness_s: tardiness,
            ..Metrics::default()
        }
    }

    #[test]
    fn rows_flag_days_worse_than_none() {
        let r = Reference::pooled(&[m(100.0, 10.0)], 0.0);
        let day =
            |i: usize, e: f64, t: f64| DayScore::of_run(&format!("d{i}"), &m(e, t), &r, &r, 1.0);
        let nones = vec![day(0, 100.0, 10.0), day(1, 100.0, 10.0)];
        let row = PolicyRow::new(
            "p",
            RowKind::Candidate,
            String::new(),
            vec![day(0, 80.0, 5.0), day(1, 120.0, 10.0)],
            &nones,
        );
        assert_eq!(row.days_worse_than_none, Some(1));
        assert!((row.worst_day_vs_none.unwrap() - 0.1).abs() < 1e-12);
        assert!((row.energy_j - 100.0).abs() < 1e-9);
        assert!((row.et - (0.65 + 1.1) / 2.0).abs() < 1e-12);
        let none = PolicyRow::new(
            "none",
            RowKind::Opponent,
            String::new(),
            nones.clone(),
            &nones,
        );
        assert_eq!(none.days_worse_than_none, Some(0));
    }
}
