//! Fitted starts (`start = "fitted"` in the training config, issue 39):
//! every scenario episode and validation day begins from the static layout
//! fitted on that scenario's past days, the state `bench suite` starts a
//! learned policy from (`policy::start::StartingFrom`), instead of whole
//! GPUs. A policy trained from whole GPUs never saw those states.
//!
//! The fit is the suite's `static-hist` search
//! ([`crate::eval::baselines::fit_static`], i.e. `policy::search::static_best`
//! over the days' mean objective), run on the scenario's days with seeds
//! `0..start_days` (the suite's training seeds; no training, validation or
//! test day uses them) on the episode's cluster size, once per (scenario,
//! GPU count) before training begins. The fits use no RNG and no clock
//! beyond timing themselves, so the same config gives the same layouts.

use std::collections::BTreeMap;
use std::time::Instant;

use super::config::{StartSearch, TrainConfig};
use super::LearnError;
use crate::eval::baselines::fit_static;
use crate::eval::{Day as EvalDay, DaySet};
use crate::mig::Layout;
use crate::policy::search::{describe_assignment, SearchConfig};
use crate::scenario::Scenario;
use crate::sim::SimConfig;

/// The fitted start of each (scenario index, GPU count), and what the fits
/// cost.
#[derive(Clone, Debug, Default)]
pub struct FittedStarts {
    layouts: BTreeMap<(usize, usize), Vec<Layout>>,
    /// `diurnal/tight on 8 GPUs: 4x 1g.5gb(7) + 4x 7g.40gb`, one per fit.
    pub described: Vec<String>,
    /// Simulated days the searches ran, all fits together.
    pub simulations: usize,
    /// Wall-clock time of all fits, s.
    pub seconds: f64,
}

impl FittedStarts {
    /// Fits every scenario of `scenarios` on every cluster size in `sizes`
    /// (duplicates fitted once).
    pub fn fit(
        cfg: &TrainConfig,
        scenarios: &[Scenario],
        sizes: &[usize],
    ) -> Result<Self, LearnError> {
        let started = Instant::now();
        let mut out = FittedStarts::default();
        for (k, s) in scenarios.iter().enumerate() {
            for &gpus in sizes {
                if out.layouts.contains_key(&(k, gpus)) {
                    continue;
                }
                let (layouts, simulations) = fit_one(cfg, s, gpus)?;
                out.described.push(format!(
                    "{} on {gpus} GPUs: {}",
                    s.name,
                    describe_assignment(&vec![cfg.gpu_model; gpus], &layouts)
                ));
                out.simulations += simulations;
                out.layouts.insert((k, gpus), layouts);
            }
        }
        out.seconds = started.elapsed().as_secs_f64();
        Ok(out)
    }

    /// The fitted start of scenario `k` on `gpus` GPUs (None if not fitted).
    pub fn get(&self, k: usize, gpus: usize) -> Option<&[Layout]> {
        self.layouts.get(&(k, gpus)).map(Vec::as_slice)
    }

    /// Fits done.
    pub fn len(&self) -> usize {
        self.layouts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layouts.is_empty()
    }
}

/// The static layout fitted on `scenario`'s days with seeds
/// `0..cfg.start_days` on `gpus` GPUs of `cfg.gpu_model`, with the
/// trainer's simulator settings; and the simulations the search ran.
pub fn fit_one(
    cfg: &TrainConfig,
    scenario: &Scenario,
    gpus: usize,
) -> Result<(Vec<Layout>, usize), LearnError> {
    let cluster = vec![cfg.gpu_model; gpus];
    let days = (0..cfg.start_days as u64)
        .map(|seed| EvalDay {
            label: format!("seed {seed}"),
            jobs: scenario.generate(cfg.gpu_model, gpus, seed),
            cfg: SimConfig {
                workload_horizon_s: Some(scenario.horizon_s()),
                start_hour: scenario.start_hour(),
                ..cfg.sim_config(seed)
            },
        })
        .collect();
    let set = DaySet::new(&cluster, cfg.heuristic()?, days)?;
    let search = match cfg.start_search {
        StartSearch::Coarse => SearchConfig::coarse(),
        StartSearch::Full => SearchConfig::default(),
    };
    let best = fit_static(&set, &search, &set.rate(), 1.0)?;
    Ok((best.policy.layouts().to_vec(), best.evaluations * set.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::default_scenarios;

    /// Two scenarios, two sizes: the same config fits the same layouts
    /// (one valid layout per GPU), and a size listed twice is fitted once.
    #[test]
    fn fits_are_deterministic_and_one_per_scenario_and_size() {
        let mut cfg = super::super::testing::tiny();
        cfg.start_days = 1;
        let list: Vec<Scenario> = default_scenarios().into_iter().take(2).collect();
        let a = FittedStarts::fit(&cfg, &list, &[3, 2, 3]).unwrap();
        let b = FittedStarts::fit(&cfg, &list, &[3, 2, 3]).unwrap();
        assert_eq!(a.len(), 4);
        assert_eq!(a.described, b.described);
        let g = crate::mig::Geometry::of(cfg.gpu_model);
        for k in 0..2 {
            for gpus in [2, 3] {
                let l = a.get(k, gpus).unwrap();
                assert_eq!(l, b.get(k, gpus).unwrap());
                assert_eq!(l.len(), gpus);
                assert!(l.iter().all(|&x| g.is_valid(x)));
            }
        }
        assert!(a.get(2, 3).is_none() && a.get(0, 4).is_none());
        assert!(a.simulations > 0);
    }
}
