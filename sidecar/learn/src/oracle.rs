//! A hindsight rollout oracle: how much could *any* per-epoch repartitioning
//! policy gain on one day if it knew the whole day in advance?
//!
//! This is Bertsekas' rollout algorithm over the deterministic simulator.
//! The base policy is "keep" from an initial assignment (the day's
//! `static-best`). At decision epoch `k`, with the decisions of epochs
//! `0..k` fixed, every single-GPU move (one GPU to one reachable catalog
//! layout) and "keep" are scored by simulating the *whole day* (the same
//! jobs, hindsight) with that move at `k` and "keep" afterwards; the best
//! is fixed and the oracle goes on to epoch `k + 1`. By construction (the
//! "keep" candidate is always scored) the result is never worse than the
//! base on the search objective, so it measures what reactivity buys on top
//! of the hindsight static layout.
//!
//! It is an analysis tool, not a policy: it needs the future and costs one
//! simulation per candidate per epoch (`smartmig bench oracle` prints its
//! cost).

use super::config::TrainConfig;
use super::data::Day;
use super::LearnError;
use crate::mig::{Geometry, Layout};
use crate::policy::{ClusterView, Decision, GpuStatus, RepartitionPolicy};
use crate::sim::Standing;

/// Replays a plan (decisions per epoch), with the decisions of one epoch
/// replaced by a candidate (and the GPUs seen at that epoch recorded).
struct Replay<'a> {
    initial: &'a [Layout],
    plan: &'a [Vec<Decision>],
    at: usize,
    candidate: &'a [Decision],
    epoch: usize,
    seen: Option<Vec<GpuStatus>>,
    /// Hour of day at epoch `at`.
    seen_hour: f64,
}

impl<'a> Replay<'a> {
    fn new(
        initial: &'a [Layout],
        plan: &'a [Vec<Decision>],
        at: usize,
        candidate: &'a [Decision],
    ) -> Self {
        Replay {
            initial,
            plan,
            at,
            candidate,
            epoch: 0,
            seen: None,
            seen_hour: 0.0,
        }
    }
}

impl RepartitionPolicy for Replay<'_> {
    fn name(&self) -> String {
        "oracle".into()
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        crate::policy::layout_or_whole(self.initial, gpu, geometry)
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        let k = self.epoch;
        self.epoch += 1;
        if k == self.at {
            self.seen = Some(view.gpus.to_vec());
            self.seen_hour = view.hour_of_day;
            return self.candidate.to_vec();
        }
        // A planned move the GPU no longer accepts (an earlier change made
        // it busy) is dropped, so the engine never counts a rejection.
        self.plan
            .get(k)
            .map(|d| {
                d.iter()
                    .copied()
                    .filter(|d| view.gpus.get(d.gpu).is_some_and(|s| s.accepts(d.target)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// What the oracle found on one day.
#[derive(Clone, Debug)]
pub struct OracleRun {
    /// Decisions per epoch (most epochs: none).
    pub decisions: Vec<Vec<Decision>>,
    /// Hour of day of each epoch of `decisions`.
    pub hours: Vec<f64>,
    /// ET of the base (keep from `initial`) and of the oracle, and the
    /// jobs each left unserved.
    pub base_et: f64,
    pub et: f64,
    pub base_unserved: u64,
    pub unserved: u64,
    /// The oracle's run, charged with the day's `none` run at their
    /// common horizon ([`Day::evaluate`]).
    pub metrics: crate::sim::Metrics,
    /// Whole-day simulations run, and improvement passes made.
    pub simulations: usize,
    pub passes: usize,
}

/// The search objective of [`Day::objective`] (as `static_best`).
fn score(day: &Day, cfg: &TrainConfig, p: &mut Replay<'_>) -> Result<Standing, LearnError> {
    day.objective(cfg, p)
}

/// Whether `a` ranks ahead of `b` by more than the noise of float sums:
/// fewer jobs unserved, or as few and an ET lower by over `eps`.
fn improves(a: Standing, b: Standing, eps: f64) -> bool {
    a.unserved < b.unserved || (a.unserved == b.unserved && a.et < b.et - eps)
}

/// [`rollout`] from whole GPUs, where a live policy starts.
pub fn from_whole(
    cfg: &TrainConfig,
    day: &Day,
    passes: usize,
    max_simulations: usize,
) -> Result<OracleRun, LearnError> {
    let whole: Vec<Layout> = day
        .cluster
        .iter()
        .map(|m| Geometry::of(*m).whole_gpu())
        .collect();
    rollout(cfg, day, &whole, passes, max_simulations)
}

/// Runs the rollout oracle on `day` from the assignment `initial`: up to
/// `passes` sweeps over the epochs (the first rolls out "keep", later ones
/// the plan found so far). `max_simulations` bounds the cost.
pub fn rollout(
    cfg: &TrainConfig,
    day: &Day,
    initial: &[Layout],
    passes: usize,
    max_simulations: usize,
) -> Result<OracleRun, LearnError> {
    let mut plan: Vec<Vec<Decision>> = Vec::new();
    let mut hours: Vec<f64> = Vec::new();
    let mut simulations = 0usize;
    let base = day.objective(cfg, &mut Replay::new(initial, &plan, usize::MAX, &[]))?;
    let mut done = 0;
    let mut last_score = Standing::WORST;
    while done < passes && simulations < max_simulations {
        done += 1;
        let mut k = 0;
        let mut current = Standing::WORST;
        while simulations < max_simulations {
            let here = plan.get(k).cloned().unwrap_or_default();
            let mut probe = Replay::new(initial, &plan, k, &here);
            let here_score = score(day, cfg, &mut probe)?;
            simulations += 1;
            // No epoch k: the run ended before it.
            let hour = probe.seen_hour;
            let Some(gpus) = probe.seen else { break };
            let mut best = (here_score, here.clone());
            let mut candidates: Vec<Vec<Decision>> = Vec::new();
            if !here.is_empty() {
                candidates.push(Vec::new());
            }
            for (i, s) in gpus.iter().enumerate() {
                if s.in_reconfiguration {
                    continue;
                }
                for &target in s.geometry.catalog() {
                    if target == s.layout || !s.accepts(target) {
                        continue;
                    }
                    let mut c: Vec<Decision> =
                        here.iter().copied().filter(|d| d.gpu != i).collect();
                    c.push(Decision { gpu: i, target });
                    if c != here {
                        candidates.push(c);
                    }
                }
            }
            for c in candidates {
                if simulations >= max_simulations {
                    break;
                }
                let sc = score(day, cfg, &mut Replay::new(initial, &plan, k, &c))?;
                simulations += 1;
                if improves(sc, best.0, 1e-9) {
                    best = (sc, c);
                }
            }
            if plan.len() <= k {
                plan.resize(k + 1, Vec::new());
                hours.resize(k + 1, 0.0);
            }
            hours[k] = hour;
            plan[k] = best.1;
            current = best.0;
            k += 1;
        }
        if !improves(current, last_score, 1e-6) {
            break;
        }
        last_score = current;
    }
    let (metrics, et) = day.evaluate(cfg, &mut Replay::new(initial, &plan, usize::MAX, &[]))?;
    let end = Standing::of(&metrics, et);
    Ok(OracleRun {
        decisions: plan,
        hours,
        base_et: base.et,
        et: end.et,
        base_unserved: base.unserved,
        unserved: end.unserved,
        metrics,
        simulations,
        passes: done,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle scores "keep" at every epoch, so it is never worse than
    /// its base, and it is deterministic.
    #[test]
    fn never_worse_than_keep_and_deterministic() {
        let mut cfg = TrainConfig::default();
        cfg.workload.horizon_s = 6.0 * 3600.0;
        cfg.workload.start_hour = 10.0;
        let day = Day::new(&cfg, 3, 5).unwrap();
        let a = from_whole(&cfg, &day, 2, usize::MAX).unwrap();
        let (base, et) = (a.base_et, a.et);
        assert!((base - 1.0).abs() < 1e-12, "keep from whole GPUs is `none`");
        assert!(et <= base + 1e-12, "oracle {et} vs base {base}");
        assert!(a.simulations > 1 && a.passes >= 1);
        let b = from_whole(&cfg, &day, 2, usize::MAX).unwrap();
        assert_eq!(a.decisions, b.decisions);
        // A budget of one simulation leaves the base untouched.
        let c = from_whole(&cfg, &day, 2, 1).unwrap();
        assert!(c.decisions.iter().all(Vec::is_empty));
        assert_eq!(c.et, a.base_et);
    }
}
