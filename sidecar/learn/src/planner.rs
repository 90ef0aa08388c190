//! A causal planning teacher: every `period_s` it scores candidate
//! assignments by simulating the next hours, and moves the GPUs toward the
//! best one as far as their busy instances allow.
//!
//! **What it simulates.** Only what a node knows at that moment: the jobs
//! running now (their instance and the time left), the jobs waiting, and
//! arrivals drawn from the past: the last `window_s` of this day replayed
//! as the next `window_s` (a burst that is on goes on), and each of the
//! last `past_days` days' arrivals over the next `lookahead_s` at the same
//! time of day (the clock's pattern: a night of big jobs, a morning rush).
//! It never reads a job before its arrival. The score of a candidate is
//! the mean over these futures of `energy + rate x tardiness` (the
//! yardstick's ET up to a constant factor, [`Rate`]).
//!
//! **What it chooses among.** `k` GPUs whole and the others one split
//! layout, for every `k` (step `kstep`), the whole GPUs first or last in
//! GPU order; the split layouts are the `splits` best uniform non-whole
//! layouts on the same futures (re-scored every `rescore_every` plans).
//! The hindsight references of the suite are mostly of this form
//! (`5x 77777777 + 11x 4444|3333`), and a general search over per-GPU
//! mixes, tried first, chose worse on the days that followed.
//!
//! **Why candidates are simulated from the present layouts.** Each one is
//! scored as it would play out: from the GPUs' current layouts, moving
//! toward the candidate only as busy instances end. On a saturated cluster
//! a whole GPU never frees up (the next waiting job takes it at once), so
//! a split that cannot happen scores as what it is, and the planner learns
//! to split before a rush rather than during it.
//!
//! It is too slow for the 10 us per GPU decision budget (hundreds of short
//! simulations per plan), which is why it is a teacher (`learn::dagger`)
//! and not the shipped policy.

use serde::{Deserialize, Serialize};

use crate::mig::{Geometry, GpuModel, Layout};
use crate::policy::{step_toward, ClusterView, Decision, RepartitionPolicy};
use crate::sim::{simulate, EpochRule, Heuristic, RunHooks, SimConfig};
use crate::workload::{Job, JobClass, SpeedupCurve};

/// How far before time 0 a running job's deadline is put: first in
/// deadline order, it keeps its instance, and its tardiness is exactly
/// this when it starts at once (subtracted from the score).
const RUNNING_LEAD_S: f64 = 1.0e6;

/// How the planner plans (`[dagger.planner]` in the training config).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlannerConfig {
    /// Seconds between two plans.
    pub period_s: f64,
    /// Seconds of this day's recent arrivals replayed as a future.
    pub window_s: f64,
    /// Seconds of a past day's arrivals simulated ahead.
    pub lookahead_s: f64,
    /// Past days whose arrivals at the same time of day are futures.
    pub past_days: usize,
    /// A new plan replaces the target only if it scores this much lower
    /// (relative): moves cost reconfigurations and rest on a guess.
    pub margin: f64,
    /// Split layouts tried with `k` whole GPUs.
    pub splits: usize,
    /// Step of `k`, the number of whole GPUs.
    pub kstep: usize,
    /// The split layouts are re-chosen every this many plans.
    pub rescore_every: usize,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            period_s: 1800.0,
            window_s: 7200.0,
            lookahead_s: 21_600.0,
            past_days: 3,
            margin: 0.01,
            splits: 1,
            kstep: 2,
            rescore_every: 4,
        }
    }
}

/// A planner setting that is out of range, named.
#[derive(Debug, thiserror::Error)]
pub enum PlannerConfigError {
    #[error("planner.{name} {value} is not a number of seconds > 0")]
    NotSeconds { name: &'static str, value: f64 },
    #[error("planner.margin {0} is not in [0, 1)")]
    Margin(f64),
    #[error("planner.splits, .kstep and .rescore_every must be > 0")]
    ZeroCount,
}

impl PlannerConfig {
    /// Checks every field, naming the one that is wrong.
    pub fn validate(&self) -> Result<(), PlannerConfigError> {
        for (name, value) in [
            ("period_s", self.period_s),
            ("window_s", self.window_s),
            ("lookahead_s", self.lookahead_s),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(PlannerConfigError::NotSeconds { name, value });
            }
        }
        if !(0.0..1.0).contains(&self.margin) {
            return Err(PlannerConfigError::Margin(self.margin));
        }
        if self.splits == 0 || self.kstep == 0 || self.rescore_every == 0 {
            return Err(PlannerConfigError::ZeroCount);
        }
        Ok(())
    }
}

/// The exchange rate of the planner's objective: `energy + joules_per_s x
/// total tardiness` is the yardstick's ET up to a constant factor
/// (`E / E_ref + mean T / T_ref`, mean T = total T / jobs per day).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub joules_per_tardiness_s: f64,
}

impl Rate {
    /// From a reference's energy and mean tardiness (floored by the
    /// caller, as the yardstick does) and its jobs per day.
    pub fn new(energy_j: f64, mean_tardiness_s: f64, jobs_per_day: f64) -> Self {
        Rate {
            joules_per_tardiness_s: energy_j / (mean_tardiness_s.max(1e-9) * jobs_per_day.max(1.0)),
        }
    }
}

/// The planner (module docs), for the GPUs of one model.
#[derive(Clone, Debug)]
pub struct Planner {
    model: GpuModel,
    cfg: PlannerConfig,
    rate: Rate,
    heuristic: Heuristic,
    reconfig_time_s: f64,
    /// The day's jobs, sorted by arrival; only those arrived are read.
    history: Vec<Job>,
    /// Past days' jobs (same clock as this day), sorted by arrival.
    past: Vec<Vec<Job>>,
    initial: Vec<Layout>,
    target: Vec<Layout>,
    /// The split layouts of the last scoring.
    splits: Vec<Layout>,
    next_plan_s: f64,
    /// Plans made and target changes.
    pub plans: usize,
    pub changes: usize,
}

fn by_arrival(jobs: &mut [Job]) {
    jobs.sort_by(|a, b| a.arrival.total_cmp(&b.arrival).then(a.id.cmp(&b.id)));
}

impl Planner {
    /// A planner over `history` (the day's jobs; it reads only those that
    /// arrived), placing jobs with `heuristic` in its simulations.
    pub fn new(
        model: GpuModel,
        cfg: PlannerConfig,
        rate: Rate,
        heuristic: Heuristic,
        reconfig_time_s: f64,
        mut history: Vec<Job>,
    ) -> Self {
        by_arrival(&mut history);
        Planner {
            model,
            cfg,
            rate,
            heuristic,
            reconfig_time_s,
            history,
            past: Vec::new(),
            initial: Vec::new(),
            target: Vec::new(),
            splits: Vec::new(),
            next_plan_s: 0.0,
            plans: 0,
            changes: 0,
        }
    }

    /// Past days (same clock as this day: time 0 is the same hour).
    pub fn with_past(mut self, mut days: Vec<Vec<Job>>) -> Self {
        for d in &mut days {
            by_arrival(d);
        }
        self.past = days;
        self
    }

    /// Starts from `layouts` (by GPU) instead of whole GPUs.
    pub fn with_initial(mut self, layouts: Vec<Layout>) -> Self {
        self.initial = layouts;
        self
    }

    /// The current target, by GPU of the model (empty before the first plan).
    pub fn target(&self) -> &[Layout] {
        &self.target
    }

    /// The simulated futures at `view.now`, on a clock that starts now.
    fn futures(&self, view: &ClusterView<'_>) -> Vec<Vec<Job>> {
        let base = self.present(view);
        let now = view.now;
        let with = |arrivals: &mut dyn Iterator<Item = Job>| {
            let mut jobs = base.clone();
            for mut j in arrivals {
                j.id = jobs.len() as u64;
                jobs.push(j);
            }
            jobs
        };
        // The last window of this day, replayed.
        let from = now - self.cfg.window_s;
        let start = self.history.partition_point(|j| j.arrival <= from);
        let mut recent = self.history[start..]
            .iter()
            .take_while(|j| j.arrival <= now)
            .map(|j| shifted(j, from));
        let mut out = vec![with(&mut recent)];
        // The same hours of past days.
        let skip = self.past.len().saturating_sub(self.cfg.past_days);
        for day in &self.past[skip..] {
            let start = day.partition_point(|j| j.arrival < now);
            let mut ahead = day[start..]
                .iter()
                .take_while(|j| j.arrival < now + self.cfg.lookahead_s)
                .map(|j| shifted(j, now));
            out.push(with(&mut ahead));
        }
        out
    }

    /// The jobs running and waiting at `view.now`, arriving at 0: a
    /// running job asks for its instance's size and runs for the time it
    /// has left.
    fn present(&self, view: &ClusterView<'_>) -> Vec<Job> {
        let g = Geometry::of(self.model);
        let spec = self.model.spec();
        let total = spec.compute_slices;
        let now = view.now;
        let mut jobs = Vec::new();
        for st in view.gpus.iter().filter(|s| s.model == self.model) {
            for id in st.busy.iter() {
                let shape = g.spot(id).shape();
                let memory = spec
                    .profiles
                    .iter()
                    .find(|p| p.shape == shape)
                    .map_or(1.0, |p| f64::from(p.memory_gb));
                let remaining = st.remaining(id, now).max(1.0);
                jobs.push(Job {
                    id: jobs.len() as u64,
                    arrival: 0.0,
                    // Linear curve: the same run time on its own size.
                    work: remaining * f64::from(shape.compute) / f64::from(total),
                    speedup: SpeedupCurve::linear(),
                    memory_gb: memory,
                    deadline: remaining - RUNNING_LEAD_S,
                    class: JobClass::Training,
                    requested_slices: Some(shape.compute),
                    declared_memory_gb: None,
                    template: None,
                    memory_growth: None,
                    gpus: 1,
                });
            }
        }
        for p in view
            .pending
            .iter()
            .filter(|p| p.shape(self.model).is_some())
        {
            jobs.push(Job {
                id: jobs.len() as u64,
                arrival: 0.0,
                work: p.work,
                speedup: p.speedup,
                memory_gb: p.memory_gb,
                deadline: p.deadline - now,
                class: JobClass::Inference,
                requested_slices: (p.min_compute > 1).then_some(p.min_compute),
                declared_memory_gb: None,
                template: None,
                memory_growth: None,
                gpus: 1,
            });
        }
        jobs
    }

    /// The mean over `futures` of moving from `current` toward `target`.
    fn score(&self, futures: &[Vec<Job>], current: &[Layout], target: &[Layout], hour: f64) -> f64 {
        let sum: f64 = futures
            .iter()
            .map(|jobs| self.score_one(jobs, current, target, hour))
            .sum();
        sum / futures.len().max(1) as f64
    }

    /// `energy + rate x tardiness` of moving from `current` toward `target`
    /// (as far as busy instances allow, at every epoch) over `jobs`.
    fn score_one(&self, jobs: &[Job], current: &[Layout], target: &[Layout], hour: f64) -> f64 {
        let cluster = vec![self.model; target.len()];
        let cfg = SimConfig {
            reconfig_time_s: self.reconfig_time_s,
            epoch: EpochRule::Events(crate::sim::DEFAULT_EPOCH_EVENTS),
            workload_horizon_s: Some(self.cfg.window_s),
            start_hour: hour,
            // Plans are compared as layouts (jobs wait for them), as the
            // trainer learns (`TrainConfig::sim_config`).
            serve_on_demand: false,
            ..SimConfig::default()
        };
        let mut h = self.heuristic.build(0);
        let mut p = Toward {
            initial: current.to_vec(),
            target: target.to_vec(),
        };
        let Ok(r) = simulate(
            &cluster,
            jobs,
            h.as_mut(),
            &mut p,
            &cfg,
            RunHooks::default(),
        ) else {
            return f64::INFINITY;
        };
        let m = r.metrics;
        let running = jobs
            .iter()
            .filter(|j| j.deadline < -RUNNING_LEAD_S / 2.0)
            .count() as f64;
        let unserved = (m.unserved + m.rejected) as f64;
        let tardiness =
            m.total_tardiness_s - running * RUNNING_LEAD_S + unserved * self.cfg.lookahead_s;
        m.energy_j + self.rate.joules_per_tardiness_s * tardiness
    }

    /// The candidate assignments: `k` whole GPUs (first or last) and the
    /// rest one of `splits`.
    fn candidates(&self, n: usize, whole: Layout) -> Vec<Vec<Layout>> {
        let mut out = Vec::new();
        for &y in &self.splits {
            for k in (1..=n).filter(|k| k % self.cfg.kstep == 0 || *k == n) {
                let mut a = vec![y; n];
                a[..k].fill(whole);
                out.push(a);
                if k < n {
                    let mut b = vec![y; n];
                    b[n - k..].fill(whole);
                    out.push(b);
                }
            }
        }
        out
    }

    /// Plans at `view`: the best candidate replaces the target if it beats
    /// the target by the margin.
    fn plan(&mut self, view: &ClusterView<'_>, gpus: &[usize]) {
        let g = Geometry::of(self.model);
        let whole = g.whole_gpu();
        let n = gpus.len();
        let futures = self.futures(view);
        let hour = view.hour_of_day;
        let current: Vec<Layout> = gpus.iter().map(|&i| view.gpus[i].layout).collect();
        if self.target.len() != n {
            self.target = current.clone();
        }
        let mut scored: Vec<(f64, Vec<Layout>)> = Vec::new();
        let target_score = self.score(&futures, &current, &self.target, hour);
        if self.splits.is_empty() || self.plans.is_multiple_of(self.cfg.rescore_every) {
            let mut uniform: Vec<(f64, Layout)> = g
                .catalog()
                .iter()
                .filter(|&&l| l != whole)
                .map(|&l| (self.score(&futures, &current, &vec![l; n], hour), l))
                .collect();
            uniform.sort_by(|a, b| a.0.total_cmp(&b.0));
            self.splits = uniform.iter().take(self.cfg.splits).map(|u| u.1).collect();
            scored.extend(uniform.into_iter().map(|(s, l)| (s, vec![l; n])));
        } else {
            for &y in &self.splits {
                scored.push((
                    self.score(&futures, &current, &vec![y; n], hour),
                    vec![y; n],
                ));
            }
        }
        for a in self.candidates(n, whole) {
            scored.push((self.score(&futures, &current, &a, hour), a));
        }
        self.plans += 1;
        if let Some((s, a)) = scored.into_iter().min_by(|a, b| a.0.total_cmp(&b.0)) {
            if s < target_score * (1.0 - self.cfg.margin) && a != self.target {
                self.target = a;
                self.changes += 1;
            }
        }
    }
}

/// One step toward `target` (indexed like `gpus`) for every GPU that can.
fn toward(view: &ClusterView<'_>, gpus: &[usize], target: &[Layout]) -> Vec<Decision> {
    gpus.iter()
        .zip(target)
        .filter_map(|(&gpu, &t)| {
            step_toward(&view.gpus[gpu], t).map(|target| Decision { gpu, target })
        })
        .collect()
}

impl RepartitionPolicy for Planner {
    fn name(&self) -> String {
        "planner".into()
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        crate::policy::layout_or_whole(&self.initial, gpu, geometry)
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        let gpus: Vec<usize> = (0..view.gpus.len())
            .filter(|&i| view.gpus[i].model == self.model)
            .collect();
        if gpus.is_empty() {
            return Vec::new();
        }
        if view.now >= self.next_plan_s || self.target.len() != gpus.len() {
            self.plan(view, &gpus);
            self.next_plan_s = view.now + self.cfg.period_s;
        }
        toward(view, &gpus, &self.target)
    }
}

/// `j` on a clock that starts at `origin`.
fn shifted(j: &Job, origin: f64) -> Job {
    Job {
        arrival: j.arrival - origin,
        deadline: j.deadline - origin,
        ..j.clone()
    }
}

/// Starts at `initial` and moves each GPU toward `target` as far as its
/// busy instances allow, at every epoch (what the planner does between
/// two plans).
struct Toward {
    initial: Vec<Layout>,
    target: Vec<Layout>,
}

impl RepartitionPolicy for Toward {
    fn name(&self) -> String {
        "toward".into()
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        crate::policy::layout_or_whole(&self.initial, gpu, geometry)
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        let gpus: Vec<usize> = (0..view.gpus.len()).collect();
        toward(view, &gpus, &self.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::default_scenarios;
    use crate::sim::{Collect, Record};

    /// The planner's moves before `cut_s`, on a day whose jobs after the
    /// cut are `after`.
    fn moves_before(jobs: &[Job], cut_s: f64, start_hour: f64) -> Vec<(u64, usize)> {
        let model = GpuModel::A100_40gb;
        let cfg = PlannerConfig {
            lookahead_s: 3.0 * 3600.0,
            past_days: 0,
            ..PlannerConfig::default()
        };
        let mut p = Planner::new(
            model,
            cfg,
            Rate {
                joules_per_tardiness_s: 2500.0,
            },
            Heuristic::Edf,
            4.0,
            jobs.to_vec(),
        );
        let sim = SimConfig {
            workload_horizon_s: Some(cut_s + 3.0 * 3600.0),
            start_hour,
            ..SimConfig::default()
        };
        let mut log = Collect::default();
        let mut h = Heuristic::Edf.build(0);
        simulate(
            &[model; 4],
            jobs,
            h.as_mut(),
            &mut p,
            &sim,
            RunHooks {
                sink: Some(&mut log),
                progress: None,
            },
        )
        .expect("simulates");
        log.0
            .iter()
            .filter_map(|r| match r {
                Record::Reconfig(c) if c.time < cut_s => Some((c.time.to_bits(), c.gpu)),
                _ => None,
            })
            .collect()
    }

    /// Causal: the moves before a time do not depend on the jobs that
    /// arrive after it (the planner is given the whole day, as in
    /// training, and must not read ahead).
    #[test]
    fn moves_do_not_depend_on_later_arrivals() {
        let s = default_scenarios()
            .into_iter()
            .find(|s| s.name == "mix-shift/tight")
            .expect("scenario");
        let cut = 10.0 * 3600.0;
        let day: Vec<Job> = s
            .generate(GpuModel::A100_40gb, 4, 3)
            .into_iter()
            .filter(|j| j.arrival < cut + 3.0 * 3600.0)
            .collect();
        let mut other = day.clone();
        for j in other.iter_mut().filter(|j| j.arrival >= cut) {
            j.work *= 3.0;
            j.memory_gb = 1.0;
        }
        let a = moves_before(&day, cut, s.start_hour());
        let b = moves_before(&other, cut, s.start_hour());
        assert!(!a.is_empty(), "the planner moved no GPU before the cut");
        assert_eq!(a, b);
    }
}
