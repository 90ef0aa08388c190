//! `rolling-fit`: a static assignment refitted every hour on the jobs of the
//! last three hours. The causal opponent that needs no history.
//!
//! `static-hist` and `twice-daily-hist` fit their layouts on past days, so
//! they are only what a site with a record of its workload can run. A node
//! that starts today has none: the best it can do without a learned policy
//! is to start from whole GPUs and, now and then, fit a static assignment
//! on the jobs it has seen so far. That is this policy, and a learned
//! policy that does not beat it has learned nothing a rule of thumb could
//! not.
//!
//! How it works:
//!
//! - It starts with every GPU one whole-GPU instance and remembers every
//!   job it sees arrive ([`ClusterView::arrivals`]), keeping those of the
//!   last `window` seconds.
//! - Every `period` seconds (at multiples of `period` since time 0) it
//!   refits: the window's jobs, shifted so the window starts at 0, are
//!   simulated on the same GPUs with EDF placement and the default
//!   [`SimConfig`], under the candidate assignments of a reduced
//!   [`static_best`] search ([`REFIT_SEARCH`]: every uniform catalog layout,
//!   the "k GPUs of X, the rest of Y" splits of the best four, and a short
//!   coordinate descent). Each candidate is scored with the project's rule:
//!   charged at the horizon of the window's `none` run, ET against that
//!   run ([`Reference::own`]), jobs that never ran first ([`Standing`]).
//! - Hysteresis: the refit's winner replaces the current target only when
//!   it beats the current target, scored on the same window, by `margin`:
//!   fewer jobs that never ran, or as many and an ET lower by `margin`
//!   (relative). With fewer than [`MIN_JOBS`] jobs in the window it keeps
//!   the current target.
//! - At every decision epoch each GPU moves toward its target as far as its
//!   busy instances allow ([`super::step_toward`]), as `twice-daily` does.
//!
//! Defaults: `period` 3600 s, because the suite's diurnal and mix-shift
//! families change their mix at hourly granularity, so refitting more often
//! only chases noise, and less often lags a whole phase; `window` 10800 s
//! (3 h), because a window of three hours holds enough jobs (hundreds on a
//! node at the suite's rates) for the search to tell layouts apart while
//! still forgetting the mix of the morning by the afternoon; `margin` 0.05,
//! so a refit that is about as good as the current target does not drain
//! GPUs for nothing.
//!
//! Cost: one refit runs `E + 2` simulations of the window's jobs (`none`,
//! the search's `E` candidates, the current target), with `E` = 19
//! uniform layouts + 12 (n - 1) two-layout splits + at most 8 descent
//! steps on n GPUs of an eight-slice model: at most 209 on 16 GPUs. Each
//! is a static run of a few hundred jobs, so a refit on 16 A100s with 200
//! jobs in the window takes about 0.02 s in a release build (201
//! simulations; 600 jobs: 0.04 s; the `refit_cost_on_16_gpus` test prints
//! it), and a day of 24 refits well under a second. Between refits a
//! decision costs one [`super::step_toward`] per GPU.

use std::collections::VecDeque;

use super::search::{static_best, SearchConfig, SwitchHours};
use super::shadow::Toward;
use super::{step_toward, ClusterView, Decision, NoPartition, PendingJob, RepartitionPolicy};
use crate::mig::{Geometry, GpuModel, Layout};
use crate::sim::{
    day_horizon, simulate, Heuristic, Metrics, Reference, RunHooks, SimConfig, SimError, Standing,
};
use crate::workload::{Job, JobClass};

/// Fewest jobs in the window for a refit to be trusted.
pub const MIN_JOBS: usize = 10;

/// The ET weight of tardiness (the project's `alpha`).
const ALPHA: f64 = 1.0;

/// The reduced search of a refit (module docs): uniform layouts, the pair
/// step over the best four, eight coordinate-descent steps.
pub const REFIT_SEARCH: SearchConfig = SearchConfig {
    top: 4,
    mix_budget: 8,
    pair_top: 4,
    mixes: 0,
    hours: SwitchHours::Narrow,
};

/// Settings of `rolling-fit` (module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RollingConfig {
    /// Seconds between two refits (> 0).
    pub period_s: f64,
    /// The jobs of the last `window_s` seconds are refitted on (> 0).
    pub window_s: f64,
    /// Relative ET lead a refit needs over the current target (>= 0).
    pub margin: f64,
}

impl Default for RollingConfig {
    /// Hourly refits over the last 3 hours, a 5 % lead.
    fn default() -> Self {
        RollingConfig {
            period_s: 3600.0,
            window_s: 3.0 * 3600.0,
            margin: 0.05,
        }
    }
}

/// Why a `rolling-fit:` spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RollingParseError {
    #[error("rolling-fit setting `{0}` is not key=value (e.g. `rolling-fit:period=3600&window=10800&margin=0.05`)")]
    NotKeyValue(String),
    #[error("unknown rolling-fit setting `{0}` (known: period, window, margin)")]
    UnknownKey(String),
    #[error("rolling-fit setting {key}=`{value}`: {key} must be {what}")]
    BadValue {
        key: String,
        value: String,
        what: &'static str,
    },
}

impl RollingConfig {
    /// The settings from `key=value` pairs separated by `&` or `,`
    /// (`period` and `window` in seconds, an optional `s` allowed;
    /// `margin` relative), on top of `self`.
    pub fn with_overrides(mut self, pairs: &str) -> Result<Self, RollingParseError> {
        for kv in pairs
            .split(['&', ','])
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (key, value) = kv
                .split_once('=')
                .ok_or_else(|| RollingParseError::NotKeyValue(kv.to_string()))?;
            let (key, value) = (key.trim(), value.trim());
            let bad = |what| RollingParseError::BadValue {
                key: key.to_string(),
                value: value.to_string(),
                what,
            };
            let seconds = || {
                value
                    .strip_suffix('s')
                    .unwrap_or(value)
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| bad("a number of seconds > 0"))
            };
            match key {
                "period" => self.period_s = seconds()?,
                "window" => self.window_s = seconds()?,
                "margin" => {
                    self.margin = value
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite() && *x >= 0.0)
                        .ok_or_else(|| bad("a finite number >= 0 (0.05 is 5 %)"))?;
                }
                _ => return Err(RollingParseError::UnknownKey(key.to_string())),
            }
        }
        Ok(self)
    }
}

/// The `rolling-fit` policy (module docs).
#[derive(Clone, Debug)]
pub struct RollingFit {
    cfg: RollingConfig,
    /// Jobs seen arriving within the window, in arrival order.
    seen: VecDeque<PendingJob>,
    /// The assignment pursued, one layout per GPU (empty before the first
    /// decision: whole GPUs).
    target: Vec<Layout>,
    next_refit: f64,
    /// Refits run (with enough jobs), target changes, simulations run and
    /// refits abandoned because a simulation failed.
    pub refits: u64,
    pub changes: u64,
    pub simulations: u64,
    pub failures: u64,
}

impl Default for RollingFit {
    fn default() -> Self {
        RollingFit::new(RollingConfig::default())
    }
}

impl RollingFit {
    pub fn new(cfg: RollingConfig) -> Self {
        RollingFit {
            cfg,
            seen: VecDeque::new(),
            target: Vec::new(),
            next_refit: cfg.period_s,
            refits: 0,
            changes: 0,
            simulations: 0,
            failures: 0,
        }
    }

    /// `rolling-fit` or `rolling-fit:period=S&window=S&margin=X`; `None`
    /// when `spec` is not this policy's.
    pub fn parse(spec: &str) -> Option<Result<Self, RollingParseError>> {
        let s = spec.trim();
        if s == "rolling-fit" {
            return Some(Ok(RollingFit::default()));
        }
        let rest = s.strip_prefix("rolling-fit:")?;
        Some(
            RollingConfig::default()
                .with_overrides(rest)
                .map(RollingFit::new),
        )
    }

    pub fn config(&self) -> &RollingConfig {
        &self.cfg
    }

    /// The assignment pursued now, one layout per GPU (empty before the
    /// first decision).
    pub fn target(&self) -> &[Layout] {
        &self.target
    }

    /// Remembers the view's arrivals and forgets those before the window.
    fn observe(&mut self, view: &ClusterView<'_>) {
        self.seen.extend(view.arrivals.iter().copied());
        let since = view.now - self.cfg.window_s;
        while self.seen.front().is_some_and(|j| j.arrival < since) {
            self.seen.pop_front();
        }
    }

    /// The window's jobs as a workload starting at 0 (ids renumbered).
    fn window_jobs(&self, now: f64) -> Vec<Job> {
        let start = (now - self.cfg.window_s).max(0.0);
        self.seen
            .iter()
            .enumerate()
            .map(|(i, p)| Job {
                id: i as u64,
                arrival: (p.arrival - start).max(0.0),
                work: p.work,
                speedup: p.speedup,
                memory_gb: p.memory_gb,
                deadline: p.deadline - start,
                class: JobClass::Training,
                // 1 slice requested and none are the same fit outside
                // exact-size mode, which the refit does not use.
                requested_slices: (p.min_compute > 1).then_some(p.min_compute),
                declared_memory_gb: None,
                template: None,
                memory_growth: None,
                gpus: 1,
            })
            .collect()
    }

    /// One refit at `now` (module docs): adopts the search's winner if it
    /// beats the current target by the margin.
    fn refit(&mut self, cluster: &[GpuModel], now: f64) -> Result<(), SimError> {
        if self.seen.len() < MIN_JOBS {
            return Ok(());
        }
        let jobs = self.window_jobs(now);
        let mut sims = 0u64;
        let scored = window_objective(cluster, &jobs, &mut sims).and_then(|mut evaluate| {
            let found = static_best(cluster, &REFIT_SEARCH, &mut evaluate)?;
            let mut current = Toward {
                label: "rolling-fit target".into(),
                layouts: self.target.clone(),
            };
            Ok((found, evaluate(&mut current)?))
        });
        self.simulations += sims;
        let (found, current) = scored?;
        self.refits += 1;
        let adopt = leads_by(&found.score, &current, self.cfg.margin)
            && found.policy.layouts() != self.target.as_slice();
        tracing::debug!(
            at_s = now,
            jobs = jobs.len(),
            found = ?found.score,
            current = ?current,
            adopt,
            "rolling-fit refit: {}",
            found.policy.name()
        );
        if adopt {
            self.target = found.policy.layouts().to_vec();
            self.changes += 1;
        }
        Ok(())
    }
}

/// Whether `new` beats `current` by `margin`: fewer jobs that never ran,
/// or as many and an ET lower by `margin` (relative).
fn leads_by(new: &Standing, current: &Standing, margin: f64) -> bool {
    new.unserved < current.unserved
        || (new.unserved == current.unserved && new.et < current.et * (1.0 - margin))
}

/// The refit's objective on `jobs` (module docs): runs `none` once, then
/// scores each policy it is given against it. Counts simulations in `sims`.
fn window_objective<'a>(
    cluster: &'a [GpuModel],
    jobs: &'a [Job],
    sims: &'a mut u64,
) -> Result<impl FnMut(&mut dyn RepartitionPolicy) -> Result<Standing, SimError> + 'a, SimError> {
    // Every candidate, and the current target, is scored as a fixed layout
    // (jobs wait for a matching instance): served on demand, the current
    // target's row would also get instances built for its jobs and win
    // every comparison against the search's fixed layouts.
    let cfg = SimConfig {
        serve_on_demand: false,
        ..SimConfig::default()
    };
    let run = move |policy: &mut dyn RepartitionPolicy| -> Result<Metrics, SimError> {
        let mut h = Heuristic::Edf.build(cfg.seed);
        Ok(simulate(cluster, jobs, h.as_mut(), policy, &cfg, RunHooks::default())?.metrics)
    };
    let none = run(&mut NoPartition)?;
    *sims += 1;
    let reference = Reference::own(&none, jobs);
    let horizon = day_horizon(&none);
    Ok(move |policy: &mut dyn RepartitionPolicy| {
        *sims += 1;
        let m = run(policy)?.at_horizon(horizon);
        Ok(reference.standing(&m, ALPHA))
    })
}

impl RepartitionPolicy for RollingFit {
    fn name(&self) -> String {
        "rolling-fit".to_string()
    }

    fn describe(&self) -> String {
        format!(
            "rolling-fit: from whole GPUs, refits a static assignment every {} s on the jobs of the last {} s, adopted if it beats the current one by {} (relative ET)",
            self.cfg.period_s, self.cfg.window_s, self.cfg.margin
        )
    }

    fn initial_layout(&mut self, _gpu: usize, geometry: &'static Geometry) -> Layout {
        geometry.whole_gpu()
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        if self.target.len() != view.gpus.len() {
            self.target = view.gpus.iter().map(|g| g.geometry.whole_gpu()).collect();
        }
        self.observe(view);
        if view.now >= self.next_refit {
            let cluster: Vec<GpuModel> = view.gpus.iter().map(|g| g.model).collect();
            if let Err(e) = self.refit(&cluster, view.now) {
                self.failures += 1;
                tracing::debug!(at_s = view.now, error = %e, "rolling-fit refit failed");
            }
            self.next_refit = ((view.now / self.cfg.period_s).floor() + 1.0) * self.cfg.period_s;
        }
        view.gpus
            .iter()
            .zip(&self.target)
            .enumerate()
            .filter_map(|(gpu, (status, &target))| {
                step_toward(status, target).map(|target| Decision { gpu, target })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{GpuStatus, PendingByProfile};
    use crate::sim::{audit, Collect, EpochRule};
    use crate::workload::SpeedupCurve;

    const M: GpuModel = GpuModel::A100_40gb;

    /// Jobs asking for one slice, as fast on it as on a whole GPU (120 s
    /// of work, 150 s to their deadline), one every `gap` seconds for
    /// `hours`: whole GPUs serve them one by one, 1g slices seven at a time
    /// on one GPU, so the others idle at lower power.
    fn small_jobs(hours: f64, gap: f64) -> Vec<Job> {
        let n = (hours * 3600.0 / gap) as u64;
        (0..n)
            .map(|i| {
                let arrival = i as f64 * gap;
                Job {
                    id: i,
                    arrival,
                    work: 120.0,
                    speedup: SpeedupCurve::new(1.0, 1.0 / 7.0).expect("valid curve"),
                    memory_gb: 4.0,
                    deadline: arrival + 150.0,
                    class: JobClass::Training,
                    requested_slices: Some(1),
                    declared_memory_gb: None,
                    template: None,
                    memory_growth: None,
                    gpus: 1,
                }
            })
            .collect()
    }

    fn run(jobs: &[Job], policy: &mut RollingFit, log: Option<&mut Collect>) -> Metrics {
        let cfg = SimConfig {
            epoch: EpochRule::Events(5),
            // The policy's own refits and moves, without smartmigd's
            // on-demand builds in between.
            serve_on_demand: false,
            ..SimConfig::default()
        };
        let mut h = Heuristic::Edf.build(0);
        let hooks = RunHooks {
            sink: log.map(|l| l as &mut dyn crate::sim::EventSink),
            progress: None,
        };
        simulate(&[M; 3], jobs, h.as_mut(), policy, &cfg, hooks)
            .expect("simulates")
            .metrics
    }

    fn whole(n: usize) -> Vec<Layout> {
        vec![Geometry::of(M).whole_gpu(); n]
    }

    #[test]
    fn rolling_fit_starts_whole_and_waits_for_its_first_period() {
        let mut p = RollingFit::default();
        let g = Geometry::of(M);
        assert_eq!(p.initial_layout(0, g), g.whole_gpu());
        let gpus = vec![GpuStatus::new(M, g.whole_gpu()); 2];
        let jobs: Vec<PendingJob> = (0..40).map(|i| pending(i, i as f64 * 30.0, 1)).collect();
        let counts = PendingByProfile::default();
        let view = ClusterView {
            now: 1200.0,
            hour_of_day: 0.0,
            gpus: &gpus,
            pending: &[],
            pending_by_profile: &counts,
            arrivals: &jobs,
        };
        assert!(p.decide(&view).is_empty());
        assert_eq!((p.refits, p.simulations), (0, 0));
        assert_eq!(p.target(), whole(2).as_slice());
        assert_eq!(p.name(), "rolling-fit");
        let d = p.describe();
        assert!(
            d.contains("3600") && d.contains("10800") && d.contains("0.05"),
            "{d}"
        );
    }

    /// An hour and a half of 1-slice jobs on 3 GPUs: the first refit (at
    /// 3600 s) leaves whole GPUs, the run's event log passes the audit,
    /// and the same run twice gives the same metrics.
    #[test]
    fn rolling_fit_leaves_whole_gpus_for_small_jobs_and_passes_the_audit() {
        let jobs = small_jobs(2.5, 60.0);
        let mut p = RollingFit::default();
        let mut log = Collect::default();
        let m = run(&jobs, &mut p, Some(&mut log));
        assert!(p.refits >= 1 && p.changes >= 1, "{p:?}");
        assert_ne!(p.target(), whole(3).as_slice());
        let g = Geometry::of(M);
        let instances: usize = p.target().iter().map(|l| l.iter().count()).sum();
        assert!(
            instances > 3,
            "{:?}",
            p.target().iter().map(|&l| g.picture(l)).collect::<Vec<_>>()
        );
        assert!(
            m.reconfigurations >= 1 && m.rejected_decisions == 0,
            "{m:?}"
        );
        audit(&log.0).expect("the event log audits");
        // Deterministic.
        let mut q = RollingFit::default();
        assert_eq!(run(&jobs, &mut q, None), m);
        assert_eq!(q.target(), p.target());
        // Better than staying whole on this load.
        let mut stay = RollingFit::new(RollingConfig {
            margin: 10.0,
            ..RollingConfig::default()
        });
        let w = run(&jobs, &mut stay, None);
        assert!(
            m.energy_j < w.energy_j && m.jobs_served_by_fission > 0,
            "{m:?} vs {w:?}"
        );
    }

    #[test]
    fn rolling_fit_with_a_huge_margin_never_changes() {
        let jobs = small_jobs(4.0, 40.0);
        let mut p = RollingFit::new(RollingConfig {
            margin: 10.0,
            ..RollingConfig::default()
        });
        let m = run(&jobs, &mut p, None);
        assert!(p.refits >= 3, "{p:?}");
        assert_eq!(p.changes, 0);
        assert_eq!(p.target(), whole(3).as_slice());
        assert_eq!(m.reconfigurations, 0);
    }

    #[test]
    fn rolling_fit_keeps_its_target_with_too_few_jobs() {
        let jobs = small_jobs(3.0, 1200.0);
        assert!(jobs.len() < MIN_JOBS);
        let mut p = RollingFit::default();
        let m = run(&jobs, &mut p, None);
        assert_eq!((p.refits, p.changes, m.reconfigurations), (0, 0, 0));
    }

    #[test]
    fn rolling_fit_spec_parses_and_bad_ones_say_why() {
        let p = RollingFit::parse("rolling-fit")
            .expect("ours")
            .expect("valid");
        assert_eq!(*p.config(), RollingConfig::default());
        let p = RollingFit::parse(" rolling-fit:period=1800s&window=7200,margin=0 ")
            .expect("ours")
            .expect("valid");
        assert_eq!(
            *p.config(),
            RollingConfig {
                period_s: 1800.0,
                window_s: 7200.0,
                margin: 0.0
            }
        );
        assert!(RollingFit::parse("greedy").is_none());
        for (bad, says) in [
            ("rolling-fit:period=-1", "period=`-1`"),
            ("rolling-fit:window=0", "window=`0`"),
            ("rolling-fit:margin=x", "margin=`x`"),
            ("rolling-fit:margin=-0.1", "margin=`-0.1`"),
            (
                "rolling-fit:periods=60",
                "unknown rolling-fit setting `periods`",
            ),
            ("rolling-fit:period", "`period` is not key=value"),
        ] {
            let e = crate::policy::parse_policy(bad, &[M])
                .err()
                .expect(bad)
                .to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let p = crate::policy::parse_policy("rolling-fit:margin=0.1", &[M]).expect("valid");
        assert_eq!(p.name(), "rolling-fit");
        assert!(p.served_through_shards());
        let p = crate::policy::parse_policy_on("rolling-fit", &[M; 2], 0.0).expect("valid");
        assert_eq!(p.name(), "rolling-fit");
    }

    fn pending(id: u64, arrival: f64, slices: u8) -> PendingJob {
        PendingJob {
            id,
            arrival,
            deadline: arrival + 1800.0,
            work: 300.0 + (id % 7) as f64 * 200.0,
            memory_gb: match slices {
                1 => 4.0,
                2 => 9.0,
                3 | 4 => 18.0,
                _ => 38.0,
            },
            min_compute: slices,
            speedup: SpeedupCurve::new(0.7, 1.0).expect("valid curve"),
            shapes: Default::default(),
        }
    }

    /// What one refit costs on 16 GPUs with about 200 jobs in the window
    /// (`cargo test --release -p smartmig-core refit_cost -- --nocapture`).
    #[test]
    fn refit_cost_on_16_gpus() {
        let g = Geometry::of(M);
        let gpus = vec![GpuStatus::new(M, g.whole_gpu()); 16];
        let sizes = [1u8, 1, 1, 2, 2, 3, 4, 7];
        let jobs: Vec<PendingJob> = (0..200u64)
            .map(|i| pending(i, i as f64 * 54.0, sizes[(i * 5 % 8) as usize]))
            .collect();
        let counts = PendingByProfile::default();
        let view = ClusterView {
            now: 3.0 * 3600.0,
            hour_of_day: 3.0,
            gpus: &gpus,
            pending: &[],
            pending_by_profile: &counts,
            arrivals: &jobs,
        };
        let mut p = RollingFit::default();
        let t = std::time::Instant::now();
        p.decide(&view);
        let took = t.elapsed();
        assert_eq!((p.refits, p.failures), (1, 0));
        // none + 19 uniform + 12 x 15 splits + <= 8 descent + current.
        assert!(p.simulations <= 1 + 19 + 180 + 8 + 1, "{}", p.simulations);
        println!(
            "rolling-fit refit on 16 GPUs, {} jobs: {} simulations, {:.3} s",
            jobs.len(),
            p.simulations,
            took.as_secs_f64()
        );
    }
}
