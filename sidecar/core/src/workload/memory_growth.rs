//! How a job's GPU memory use rises over its run, and the early-restart
//! rule that reads that rise (issue 24, part 1; `docs/oom-and-memory.md`).
//!
//! A job does not take its peak memory at once: it starts with the CUDA
//! context and its weights, then grows (activations, caches, a longer
//! sequence, the first evaluation) until it reaches its peak. A job on an
//! instance smaller than its peak runs out of memory when its use crosses
//! the instance's memory, and everything it ran is lost. Watching the use
//! rise lets a scheduler restart the job on a bigger instance *before* the
//! failure: [`EarlyRestartRule`] follows the recent trend of the samples and
//! says when it predicts the instance will be exceeded.
//!
//! The same code decides in the simulator (samples computed from
//! [`MemoryGrowth`]) and in smartmigd (samples read from NVML every
//! `memory.sample_s`), so a rule measured in simulation is the rule the
//! daemon runs. Pure: no IO, no clock.

use serde::{Deserialize, Serialize};

use super::WorkloadError;

/// The family of curves a job's memory use follows from its start to its
/// peak, as a function of `x` = progress / ramp in [0, 1].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrowthShape {
    /// Flat at the base, then the peak at once at the end of the ramp (a
    /// model load or a first big batch): no warning, only a failure.
    Step,
    /// Linear rise (a cache or a buffer that grows steadily).
    Linear,
    /// Fast then slow, `sqrt(x)` (most memory taken early, then a tail).
    Concave,
    /// Slow then fast, `x²` (a sequence length or batch that grows).
    Convex,
}

impl GrowthShape {
    /// Every shape, in a fixed order (for mixes and tables).
    pub const ALL: [GrowthShape; 4] = [
        GrowthShape::Step,
        GrowthShape::Linear,
        GrowthShape::Concave,
        GrowthShape::Convex,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GrowthShape::Step => "step",
            GrowthShape::Linear => "linear",
            GrowthShape::Concave => "concave",
            GrowthShape::Convex => "convex",
        }
    }

    /// `g(x)` in [0, 1] for `x` in [0, 1]; 1 at `x = 1`.
    fn rise(self, x: f64) -> f64 {
        let x = x.clamp(0.0, 1.0);
        match self {
            GrowthShape::Step => {
                if x >= 1.0 {
                    1.0
                } else {
                    0.0
                }
            }
            GrowthShape::Linear => x,
            GrowthShape::Concave => x.sqrt(),
            GrowthShape::Convex => x * x,
        }
    }

    /// The smallest `x` with `g(x) >= y`, for `y` in (0, 1].
    fn first_reach(self, y: f64) -> f64 {
        let y = y.clamp(0.0, 1.0);
        match self {
            GrowthShape::Step => 1.0,
            GrowthShape::Linear => y,
            GrowthShape::Concave => y * y,
            GrowthShape::Convex => y.sqrt(),
        }
    }
}

impl std::fmt::Display for GrowthShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for GrowthShape {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GrowthShape::ALL
            .into_iter()
            .find(|g| g.as_str() == s)
            .ok_or_else(|| {
                WorkloadError::invalid(
                    "memory growth shape",
                    format!("`{s}` (expected step, linear, concave or convex)"),
                )
            })
    }
}

/// A job's memory use over its run: `peak × (base + (1 − base) × g(p /
/// ramp))` at progress `p` (the share of its work done, so the curve does
/// not depend on the slice's speed), and the peak from `p = ramp` on.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryGrowth {
    pub shape: GrowthShape,
    /// Use at the start, as a share of the peak (context and weights), in
    /// [0, 1].
    pub base: f64,
    /// Share of the run by which the peak is reached, in (0, 1].
    pub ramp: f64,
}

impl MemoryGrowth {
    /// The simulator's behaviour before growth was modelled: nothing
    /// noticeable, then the peak at `fail_fraction` of the run.
    pub fn step_at(fraction: f64) -> MemoryGrowth {
        MemoryGrowth {
            shape: GrowthShape::Step,
            base: 0.0,
            ramp: fraction,
        }
    }

    pub fn validate(&self) -> Result<(), WorkloadError> {
        if !(self.base.is_finite() && (0.0..=1.0).contains(&self.base)) {
            return Err(WorkloadError::invalid(
                "memory growth base",
                format!("{} (a share of the peak, in [0, 1])", self.base),
            ));
        }
        if !(self.ramp.is_finite() && self.ramp > 0.0 && self.ramp <= 1.0) {
            return Err(WorkloadError::invalid(
                "memory growth ramp",
                format!("{} (a share of the run, in (0, 1])", self.ramp),
            ));
        }
        Ok(())
    }

    /// Memory in use (GB) at `progress` (share of the work done, in [0, 1])
    /// of a job whose peak is `peak_gb`.
    pub fn usage(&self, peak_gb: f64, progress: f64) -> f64 {
        let x = (progress / self.ramp).clamp(0.0, 1.0);
        peak_gb * (self.base + (1.0 - self.base) * self.shape.rise(x))
    }

    /// The progress at which use first exceeds `limit_gb` (the job runs out
    /// of memory there), `None` when the peak fits. A job whose base alone
    /// exceeds the limit fails at once (0).
    pub fn crossing(&self, peak_gb: f64, limit_gb: f64) -> Option<f64> {
        if peak_gb <= limit_gb {
            return None;
        }
        let base_gb = self.base * peak_gb;
        if base_gb > limit_gb {
            return Some(0.0);
        }
        let y = (limit_gb - base_gb) / (peak_gb - base_gb);
        Some(self.ramp * self.shape.first_reach(y))
    }
}

/// One sample of a running job's memory use.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemorySample {
    /// Seconds since the run started.
    pub t_s: f64,
    /// Memory in use, GB.
    pub used_gb: f64,
}

/// Restart a job on a bigger instance when the trend of its memory use
/// predicts that it will exceed its instance.
///
/// The slope (the slowest rise between consecutive samples of the last
/// `window`, so one jump is not a trend) is followed for
/// `horizon` times the time the job has run so far (a job that took an
/// hour to grow this far is given another `horizon` hours, one that took a
/// minute another `horizon` minutes: the rule needs no run time, which the
/// daemon does not know). Nothing is predicted before the use reaches
/// `min_fill` of the instance, so the noise of a job's first seconds does
/// not restart it. A restart for a job whose peak would have fitted is a
/// *false* early restart: it costs the run so far and one bigger instance;
/// the simulator counts them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EarlyRestartRule {
    /// Samples the trend is measured over (the slowest rise between
    /// consecutive ones of the last `window`), at least 2; at least 3 for a
    /// single jump (a step) never to fire.
    pub window: usize,
    /// How far the trend is followed, as a multiple of the time run so far.
    pub horizon: f64,
    /// Share of the instance's memory the use must reach first, in [0, 1].
    pub min_fill: f64,
}

/// The defaults, from the sweep of `docs/oom-and-memory.md` §5 (the
/// 64-GPU study day and an 8-GPU day with small slices, two seeds each,
/// window 3 to 6, horizon 0.02 to 2, min fill 0.5 to 0.95): no setting made
/// early restart save GPU time on the documented growth family, because a
/// false early restart throws away the whole run so far while a true one
/// saves only the share `horizon / (1 + horizon)` of the run to its
/// failure. A short horizon keeps false early restarts rare (at most
/// 8.5 % of the early restarts in the sweep, against 25 to 58 % with
/// horizon 0.5 and min fill 0.5) and the loss within noise of restarting
/// on failure; min fill 0.9 guards against a noisy start.
impl Default for EarlyRestartRule {
    fn default() -> Self {
        EarlyRestartRule {
            window: 3,
            horizon: 0.02,
            min_fill: 0.9,
        }
    }
}

impl EarlyRestartRule {
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.window < 2 {
            return Err(WorkloadError::invalid(
                "window",
                format!(
                    "{} (at least 2 samples are needed for a slope)",
                    self.window
                ),
            ));
        }
        if !(self.horizon.is_finite() && self.horizon > 0.0) {
            return Err(WorkloadError::invalid(
                "horizon",
                format!("{} (a positive multiple of the time run)", self.horizon),
            ));
        }
        if !(self.min_fill.is_finite() && (0.0..=1.0).contains(&self.min_fill)) {
            return Err(WorkloadError::invalid(
                "min_fill",
                format!("{} (a share of the instance, in [0, 1])", self.min_fill),
            ));
        }
        Ok(())
    }

    /// The use the trend predicts (GB) when it exceeds `instance_gb`, else
    /// `None`. `recent` holds the latest samples, oldest first (more than
    /// `window` is fine: only the last `window` count). A use already over
    /// the instance is its own prediction.
    pub fn predicts_overflow(&self, recent: &[MemorySample], instance_gb: f64) -> Option<f64> {
        let last = *recent.last()?;
        if last.used_gb > instance_gb {
            return Some(last.used_gb);
        }
        if recent.len() < self.window || last.used_gb < self.min_fill * instance_gb {
            return None;
        }
        // The slowest rise between consecutive samples of the window: a
        // sustained trend, not one jump. A job that takes its peak at once
        // (a step) shows one jump between two flat stretches; following
        // that jump's slope would restart every such job, fitting or not.
        // With `window >= 3` a single jump never fires.
        let mut slope = f64::INFINITY;
        for pair in recent[recent.len() - self.window..].windows(2) {
            let dt = pair[1].t_s - pair[0].t_s;
            if dt <= 0.0 {
                return None;
            }
            slope = slope.min((pair[1].used_gb - pair[0].used_gb) / dt);
        }
        if slope.is_nan() || slope <= 0.0 {
            return None;
        }
        let predicted = last.used_gb + slope * self.horizon * last.t_s.max(0.0);
        (predicted > instance_gb).then_some(predicted)
    }

    /// When the rule restarts a job that runs `run_s` seconds on an
    /// instance of `instance_gb`, sampled every `sample_s` from its start:
    /// the time of the first sample at which it fires, strictly before the
    /// job would run out of memory (or finish), or `None`. The simulator's
    /// and the audit's one computation of an early restart.
    pub fn first_restart(
        &self,
        growth: &MemoryGrowth,
        peak_gb: f64,
        instance_gb: f64,
        run_s: f64,
        sample_s: f64,
    ) -> Option<f64> {
        if !(run_s > 0.0 && sample_s > 0.0) {
            return None;
        }
        // Past the ramp the use is flat, so nothing can fire once the
        // window holds only flat samples; stop at the failure or the end.
        let stop = growth
            .crossing(peak_gb, instance_gb)
            .map_or(run_s, |p| p * run_s)
            .min(growth.ramp * run_s + self.window as f64 * sample_s);
        // Samples below `min_fill` of the instance never fire (use only
        // rises), so start a few samples before the use first passes it:
        // the same answer as sampling from the start, without walking
        // hours of a long job's flat beginning.
        let fill_gb = self.min_fill * instance_gb;
        if peak_gb < fill_gb {
            return None;
        }
        let skip = growth
            .crossing(peak_gb, fill_gb)
            .map_or(0.0, |p| (p * run_s / sample_s).floor());
        let mut recent: Vec<MemorySample> = Vec::with_capacity(self.window);
        let mut k = (skip as u64).saturating_sub(self.window as u64 + 2).max(1);
        loop {
            let t = k as f64 * sample_s;
            if t >= stop {
                return None;
            }
            if recent.len() == self.window {
                recent.remove(0);
            }
            recent.push(MemorySample {
                t_s: t,
                used_gb: growth.usage(peak_gb, t / run_s),
            });
            if self.predicts_overflow(&recent, instance_gb).is_some() {
                return Some(t);
            }
            k += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear(base: f64, ramp: f64) -> MemoryGrowth {
        MemoryGrowth {
            shape: GrowthShape::Linear,
            base,
            ramp,
        }
    }

    #[test]
    fn usage_rises_to_the_peak_and_stays() {
        for shape in GrowthShape::ALL {
            let g = MemoryGrowth {
                shape,
                base: 0.2,
                ramp: 0.5,
            };
            assert!((g.usage(10.0, 0.0) - 2.0).abs() < 1e-12, "{shape}");
            assert!((g.usage(10.0, 0.5) - 10.0).abs() < 1e-12, "{shape}");
            assert!((g.usage(10.0, 0.9) - 10.0).abs() < 1e-12, "{shape}");
            let mut prev = 0.0;
            for i in 0..=100 {
                let u = g.usage(10.0, f64::from(i) / 100.0);
                assert!(u >= prev - 1e-12, "{shape} not monotone at {i}");
                prev = u;
            }
        }
    }

    #[test]
    fn crossing_is_where_usage_passes_the_limit() {
        for shape in [
            GrowthShape::Linear,
            GrowthShape::Concave,
            GrowthShape::Convex,
        ] {
            let g = MemoryGrowth {
                shape,
                base: 0.25,
                ramp: 0.4,
            };
            let p = g.crossing(8.0, 5.0).expect("8 GB does not fit 5");
            assert!((g.usage(8.0, p) - 5.0).abs() < 1e-9, "{shape}: {p}");
            assert!(g.usage(8.0, p * 0.99) <= 5.0, "{shape}");
        }
        // The old model: nothing until `fail_fraction`, then the peak.
        assert_eq!(MemoryGrowth::step_at(0.3).crossing(8.0, 5.0), Some(0.3));
        assert_eq!(
            linear(0.2, 0.5).crossing(5.0, 5.0),
            None,
            "a peak equal to the instance fits"
        );
        assert_eq!(
            linear(0.8, 0.5).crossing(10.0, 5.0),
            Some(0.0),
            "base alone too big"
        );
    }

    #[test]
    fn validation_names_the_field() {
        let e = linear(1.5, 0.3).validate().unwrap_err().to_string();
        assert!(e.contains("base"), "{e}");
        let e = linear(0.1, 0.0).validate().unwrap_err().to_string();
        assert!(e.contains("ramp"), "{e}");
        let bad = EarlyRestartRule {
            window: 1,
            ..EarlyRestartRule::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("window"), "{e}");
        let e = "sawtooth".parse::<GrowthShape>().unwrap_err().to_string();
        assert!(e.contains("sawtooth") && e.contains("linear"), "{e}");
        assert_eq!("convex".parse::<GrowthShape>(), Ok(GrowthShape::Convex));
    }

    fn s(t_s: f64, used_gb: f64) -> MemorySample {
        MemorySample { t_s, used_gb }
    }

    /// A rule that looks further ahead than the defaults (the defaults
    /// before the sweep), so the numbers below are easy to follow.
    const FAR: EarlyRestartRule = EarlyRestartRule {
        window: 3,
        horizon: 0.5,
        min_fill: 0.5,
    };

    #[test]
    fn the_rule_follows_the_trend() {
        let rule = FAR;
        // Rising 0.01 GB/s at 300 s: 3.4 + 0.01 × 150 = 4.9, not over 5.
        let rising = [s(290.0, 3.3), s(295.0, 3.35), s(300.0, 3.4)];
        assert_eq!(rule.predicts_overflow(&rising, 5.0), None);
        // A little later and higher: 4.0 + 0.01 × 160 = 5.6 > 5.
        let later = [s(310.0, 3.9), s(315.0, 3.95), s(320.0, 4.0)];
        let p = rule.predicts_overflow(&later, 5.0).expect("predicted");
        assert!((p - 5.6).abs() < 1e-9, "{p}");
        // Flat use never restarts, however full.
        let flat = [s(10.0, 4.9), s(15.0, 4.9), s(20.0, 4.9)];
        assert_eq!(rule.predicts_overflow(&flat, 5.0), None);
        // Below min_fill nothing is predicted, however steep.
        let early = [s(1.0, 0.1), s(2.0, 1.0), s(3.0, 2.0)];
        assert_eq!(rule.predicts_overflow(&early, 5.0), None);
        // Too few samples for the window.
        assert_eq!(rule.predicts_overflow(&later[1..], 5.0), None);
        // Already over: that is the prediction.
        assert_eq!(rule.predicts_overflow(&[s(5.0, 6.0)], 5.0), Some(6.0));
        assert_eq!(rule.predicts_overflow(&[], 5.0), None);
    }

    #[test]
    fn first_restart_comes_before_the_failure() {
        let rule = EarlyRestartRule::default();
        // 8 GB peak on 5 GB, linear from 20 % over the first half of a
        // 1000 s run: fails at p = (5 − 1.6) / 6.4 × 0.5 = 0.265625.
        let g = linear(0.2, 0.5);
        let fail = g.crossing(8.0, 5.0).expect("fails") * 1000.0;
        let t = rule
            .first_restart(&g, 8.0, 5.0, 1000.0, 5.0)
            .expect("restarted early");
        assert!(t < fail, "{t} >= {fail}");
        assert!(t > 0.0 && (t / 5.0).fract() == 0.0, "on a sample: {t}");
        // A step gives no warning.
        let step = MemoryGrowth::step_at(0.3);
        assert_eq!(rule.first_restart(&step, 8.0, 5.0, 1000.0, 5.0), None);
        // A job that fits with room to spare is left alone.
        assert_eq!(rule.first_restart(&g, 3.0, 5.0, 1000.0, 5.0), None);
    }

    #[test]
    fn a_step_that_fits_never_fires() {
        // The peak comes at once at 30 % of the run and fits: one jump
        // between two flat stretches is not a trend (window >= 3).
        for window in [3, 4, 8] {
            let rule = EarlyRestartRule {
                window,
                horizon: 2.0,
                min_fill: 0.0,
            };
            for base in [0.0, 0.3, 0.9] {
                let g = MemoryGrowth {
                    shape: GrowthShape::Step,
                    base,
                    ramp: 0.3,
                };
                assert_eq!(
                    rule.first_restart(&g, 4.9, 5.0, 1000.0, 5.0),
                    None,
                    "{window} {base}"
                );
                assert_eq!(
                    rule.first_restart(&g, 8.0, 5.0, 1000.0, 5.0),
                    None,
                    "{window} {base}"
                );
            }
        }
    }

    /// `first_restart` skips the samples below `min_fill`; the answer is
    /// the one of sampling from the start.
    #[test]
    fn skipping_the_flat_start_changes_nothing() {
        fn naive(
            r: &EarlyRestartRule,
            g: &MemoryGrowth,
            peak: f64,
            inst: f64,
            run_s: f64,
            dt: f64,
        ) -> Option<f64> {
            let stop = g
                .crossing(peak, inst)
                .map_or(run_s, |p| p * run_s)
                .min(g.ramp * run_s + r.window as f64 * dt);
            let mut recent = Vec::new();
            let mut k = 1u64;
            loop {
                let t = k as f64 * dt;
                if t >= stop {
                    return None;
                }
                recent.push(MemorySample {
                    t_s: t,
                    used_gb: g.usage(peak, t / run_s),
                });
                if r.predicts_overflow(&recent, inst).is_some() {
                    return Some(t);
                }
                k += 1;
            }
        }
        let mut fired = 0;
        for shape in GrowthShape::ALL {
            for base in [0.0, 0.2, 0.5] {
                for ramp in [0.05, 0.3, 1.0] {
                    for peak in [3.0, 4.6, 5.0, 6.0, 12.0] {
                        for (window, horizon, min_fill) in
                            [(3, 0.1, 0.8), (2, 0.5, 0.5), (5, 1.0, 0.0)]
                        {
                            let r = EarlyRestartRule {
                                window,
                                horizon,
                                min_fill,
                            };
                            let g = MemoryGrowth { shape, base, ramp };
                            let fast = r.first_restart(&g, peak, 5.0, 3000.0, 5.0);
                            assert_eq!(
                                fast,
                                naive(&r, &g, peak, 5.0, 3000.0, 5.0),
                                "{g:?} {r:?} {peak}"
                            );
                            fired += usize::from(fast.is_some());
                        }
                    }
                }
            }
        }
        assert!(fired > 20, "{fired}");
    }

    #[test]
    fn a_job_just_under_its_instance_can_be_restarted_falsely() {
        // 4.9 GB peak on 5 GB, steep linear rise: the trend overshoots
        // with a far horizon; the default's short horizon does not.
        let g = linear(0.2, 0.5);
        assert!(g.crossing(4.9, 5.0).is_none());
        assert!(FAR.first_restart(&g, 4.9, 5.0, 1000.0, 5.0).is_some());
        let rule = EarlyRestartRule::default();
        assert_eq!(rule.first_restart(&g, 4.9, 5.0, 1000.0, 5.0), None);
        rule.validate().unwrap();
    }
}
