//! How a run, a row or a set of days ranks ([`Standing`]): the objective
//! the fixed-layout searches ([`super::search`]) minimise, and what the
//! simulator's metrics rank runs by (`sim::metrics`, which reads a run's
//! standing off its metrics and re-exports it as `sim::Standing`). It sits
//! in `policy` so that the searches need nothing of the simulator.

use std::cmp::Ordering;

use serde::Serialize;

/// Where a run, a row or a set of days stands: fewer jobs that never ran
/// first, whatever the ET; then lower ET (a NaN never ranks ahead).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Standing {
    /// Jobs that never ran (unserved and rejected), summed over the days.
    pub unserved: u64,
    /// ET, or its mean over the days.
    pub et: f64,
}

impl Standing {
    /// Ranks behind every real run.
    pub const WORST: Standing = Standing {
        unserved: u64::MAX,
        et: f64::INFINITY,
    };

    pub fn new(unserved: u64, et: f64) -> Self {
        Standing { unserved, et }
    }

    /// Over several days: the jobs that never ran summed, the ET averaged.
    pub fn over(days: impl IntoIterator<Item = Standing>) -> Self {
        let (unserved, sum, n) = days.into_iter().fold((0u64, 0.0, 0usize), |(u, s, n), d| {
            (u.saturating_add(d.unserved), s + d.et, n + 1)
        });
        Standing::new(unserved, if n > 0 { sum / n as f64 } else { f64::NAN })
    }

    /// Whether `self` ranks strictly ahead of `other`.
    pub fn beats(&self, other: &Standing) -> bool {
        self.cmp(other) == Ordering::Less
    }
}

impl Ord for Standing {
    fn cmp(&self, other: &Self) -> Ordering {
        self.unserved
            .cmp(&other.unserved)
            .then(self.et.total_cmp(&other.et))
    }
}

impl PartialOrd for Standing {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Standing {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Standing {}
