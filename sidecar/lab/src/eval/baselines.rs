//! The fixed competitors of a dynamic policy: the best static assignment
//! and the best twice-daily schedule ([`crate::policy::search`]), fitted on
//! a set of days.
//!
//! Fitted on *training* days and applied unchanged to other days, they are
//! what an admin who chooses a layout from past days would run: the
//! opponents (`static-hist`, `twice-daily-hist`). Fitted on the scored day
//! itself they know its jobs in advance: references only
//! (`static-hindsight`, `twice-daily-hindsight`).

use crate::policy::search::{
    self, SearchConfig, StaticBest, StaticMix, TwiceDaily, TwiceDailyBest,
};
use crate::sim::{Reference, SimError};

use super::days::DaySet;

/// The two fitted policies and what their searches cost.
#[derive(Clone, Debug)]
pub struct Fitted {
    pub statics: StaticBest,
    pub twice: TwiceDailyBest,
}

impl Fitted {
    /// The static assignment, as a policy.
    pub fn static_policy(&self) -> StaticMix {
        self.statics.policy.clone()
    }

    /// The twice-daily schedule, as a policy.
    pub fn twice_policy(&self) -> TwiceDaily {
        self.twice.policy.clone()
    }

    /// The static assignment in the `static:` replay syntax.
    pub fn static_spec(&self, days: &DaySet) -> String {
        format!(
            "static:{}",
            search::describe_assignment(&days.cluster, self.statics.policy.layouts())
        )
    }

    /// Simulations both searches ran, each over every day of the set.
    pub fn evaluations(&self) -> usize {
        self.statics.evaluations + self.twice.evaluations
    }
}

/// Searches both policies on `days` ([`DaySet::objective`] with the
/// exchange rate `reference`: the one the fitted rows are scored with).
/// The days must share the hour of day at time 0 (the twice-daily clock).
pub fn fit(
    days: &DaySet,
    cfg: &SearchConfig,
    reference: &Reference,
    alpha: f64,
) -> Result<Fitted, SimError> {
    let start_hour = days.days.first().map_or(0.0, |d| d.cfg.start_hour);
    let statics = fit_static(days, cfg, reference, alpha)?;
    let mut evaluate =
        |p: &mut dyn crate::policy::RepartitionPolicy| days.objective(p, reference, alpha);
    let twice = search::twice_daily(&days.cluster, cfg, &statics, start_hour, &mut evaluate)?;
    Ok(Fitted { statics, twice })
}

/// The static half of [`fit`] alone (`static-hist`'s layout): what the
/// trainer's fitted start (`start = "fitted"`, `smartmig_learn::start`)
/// needs, without the twice-daily search's cost.
pub fn fit_static(
    days: &DaySet,
    cfg: &SearchConfig,
    reference: &Reference,
    alpha: f64,
) -> Result<StaticBest, SimError> {
    let mut evaluate =
        |p: &mut dyn crate::policy::RepartitionPolicy| days.objective(p, reference, alpha);
    search::static_best(&days.cluster, cfg, &mut evaluate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::testing::{quick_search as quick, M};
    use crate::sim::Heuristic;

    fn day(seed: u64) -> crate::eval::Day {
        crate::eval::testing::day(
            seed,
            6.0,
            10.0,
            crate::workload::DiurnalConfig::default().peak_rate,
        )
    }

    #[test]
    fn fit_is_deterministic_and_at_least_as_good_as_every_uniform_layout() {
        let cluster = vec![M; 4];
        let train = DaySet::new(&cluster, Heuristic::Edf, vec![day(1), day(2)]).unwrap();
        let rate = train.rate();
        let a = fit(&train, &quick(), &rate, 1.0).unwrap();
        let b = fit(&train, &quick(), &rate, 1.0).unwrap();
        assert_eq!(a.statics.policy, b.statics.policy);
        assert_eq!(a.twice.policy, b.twice.policy);
        assert!(a.statics.uniform.iter().all(|u| a.statics.score <= u.1));
        assert!(a.twice.score <= a.statics.score);
        assert!(
            a.static_spec(&train).starts_with("static:4x ")
                || a.static_spec(&train).contains(" + ")
        );
        // The printed assignment replays to the same layouts.
        let spec = a.static_spec(&train);
        let mut replay = crate::policy::parse_policy(&spec, &[M]).unwrap();
        let g = crate::mig::Geometry::of(M);
        for (i, &l) in a.statics.policy.layouts().iter().enumerate() {
            assert_eq!(replay.initial_layout(i, g), l, "{spec}");
        }
    }
}
