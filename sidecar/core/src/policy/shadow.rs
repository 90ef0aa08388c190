//! Do no harm during the day: a shadow of the running day decides whether
//! the learned policy or its fallback runs (issue 39).
//!
//! Two parts, both pure:
//!
//! - [`ShadowRule`] / [`ShadowState`]: the switch. Every `check_every_s`
//!   it is given the cost of the day so far under each of the two
//!   policies, replayed from the day's start (`energy + rate x tardiness`,
//!   the ET objective in joules: [`Replay::cost`]). Over the last
//!   `window_s` it compares the increase of the two costs; the running
//!   policy hands over when the other one's increase is lower by more than
//!   `margin` (relative) on `hold_checks` checks in a row, and back the
//!   same way, so a switch needs a lead both ways (hysteresis). This is
//!   what a daemon calls per tick: it keeps the node's arrived jobs, calls
//!   [`Replay::cost`] for both policies at each check and feeds
//!   [`ShadowState::observe`].
//! - [`Shadowed`]: the rule as a [`RepartitionPolicy`] for the simulator,
//!   so `bench suite` scores it (`learned+shadow`). It runs the policy the
//!   state names on the live cluster and replays the day's arrivals *up to
//!   now* (never later ones) under fresh copies of both policies.
//!
//! Why replay both from the start instead of measuring the live cluster:
//! once the fallback runs, the learned policy's cost is not observed any
//! more, and switching back needs it. Each replay is the counterfactual
//! "this policy all day", which is also what the `bench suite` rows of the
//! two policies measure.

use std::collections::VecDeque;

use serde::Serialize;

use super::{
    layout_or_whole, step_toward, ClusterView, Decision, PolicyParseError, RepartitionPolicy,
};
use crate::mig::{Geometry, GpuModel, Layout};
use crate::sim::{simulate, Heuristic, RunHooks, SimConfig, SimError};
use crate::workload::Job;

/// When to hand over (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ShadowRule {
    /// Seconds between two comparisons (> 0).
    pub check_every_s: f64,
    /// The sliding window the costs are compared over, s (> 0).
    pub window_s: f64,
    /// Relative lead the other policy needs, e.g. 0.02.
    pub margin: f64,
    /// Consecutive checks with that lead before a switch (>= 1).
    pub hold_checks: u32,
}

impl Default for ShadowRule {
    /// Every 30 minutes over 3 hours, a 2 % lead on 2 checks in a row.
    fn default() -> Self {
        ShadowRule {
            check_every_s: 1800.0,
            window_s: 3.0 * 3600.0,
            margin: 0.02,
            hold_checks: 2,
        }
    }
}

/// Why a shadow rule or a shadowed policy was refused.
#[derive(Debug, thiserror::Error)]
pub enum ShadowError {
    #[error("`{0}`: expected key=value")]
    NotKeyValue(String),
    #[error("`{0}`: not a non-negative number")]
    NotNumber(String),
    #[error("`{0}`: not a whole number")]
    NotWhole(String),
    #[error("unknown shadow setting `{0}` (every, window, margin, hold)")]
    UnknownKey(String),
    #[error("every and window must be > 0, hold >= 1")]
    OutOfRange,
    #[error("the shadow needs a policy and at least one fallback")]
    NoFallback,
    /// A policy of the shadow could not be made.
    #[error(transparent)]
    Policy(#[from] PolicyParseError),
}

impl ShadowRule {
    /// The rule from a spec's `key=value` pairs (`every`, `window` in
    /// seconds, `margin`, `hold`), on top of the defaults.
    pub fn with_overrides(mut self, pairs: &str) -> Result<Self, ShadowError> {
        for kv in pairs.split(['&', ',']).filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| ShadowError::NotKeyValue(kv.to_string()))?;
            let num = |v: &str| {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| ShadowError::NotNumber(kv.to_string()))
            };
            match k {
                "every" => self.check_every_s = num(v)?,
                "window" => self.window_s = num(v)?,
                "margin" => self.margin = num(v)?,
                "hold" => {
                    self.hold_checks = v
                        .parse()
                        .map_err(|_| ShadowError::NotWhole(kv.to_string()))?;
                }
                _ => return Err(ShadowError::UnknownKey(k.to_string())),
            }
        }
        if self.check_every_s <= 0.0 || self.window_s <= 0.0 || self.hold_checks == 0 {
            return Err(ShadowError::OutOfRange);
        }
        Ok(self)
    }
}

/// Index of the primary (learned) policy among the shadowed ones; the
/// fallbacks follow it in the order given.
pub const PRIMARY: usize = 0;

/// One hand-over, with the window costs that caused it (what the daemon's
/// log and status say).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Switch {
    pub at_s: f64,
    pub from: usize,
    pub to: usize,
    /// Cost increase over the window, J (ET objective), of each policy.
    pub window_costs: Vec<f64>,
}

/// The switch's memory: the cost curves seen at the checks, the running
/// policy and the current streak of checks where another one led.
#[derive(Clone, Debug)]
pub struct ShadowState {
    rule: ShadowRule,
    running: usize,
    /// `(time, cost of each policy)` of the checks within the window.
    history: VecDeque<(f64, Vec<f64>)>,
    /// The policy that led on the last checks, and on how many in a row.
    leader: usize,
    streak: u32,
    switches: Vec<Switch>,
}

impl ShadowState {
    /// Starts with the primary (learned) policy running.
    pub fn new(rule: ShadowRule) -> Self {
        ShadowState {
            rule,
            running: PRIMARY,
            history: VecDeque::new(),
            leader: PRIMARY,
            streak: 0,
            switches: Vec::new(),
        }
    }

    pub fn rule(&self) -> ShadowRule {
        self.rule
    }

    /// The policy that runs now ([`PRIMARY`] or a fallback's index).
    pub fn running(&self) -> usize {
        self.running
    }

    /// Every hand-over so far, in time order.
    pub fn switches(&self) -> &[Switch] {
        &self.switches
    }

    /// Forgets the cost curves and the current streak but keeps the policy
    /// that runs: for a caller that restarts its replays from a new origin
    /// (the daemon's day boundary), where the old cumulative costs no
    /// longer compare with the new ones.
    pub fn restart_costs(&mut self) {
        self.history.clear();
        self.streak = 0;
    }

    /// One check at `now`: the day's cost so far under each policy
    /// (cumulative, from the same start; always as many, primary first).
    /// The cheapest policy over the window takes over when it undercuts the
    /// running one by the margin on `hold_checks` checks in a row. Returns
    /// the switch it made, if any.
    pub fn observe(&mut self, now: f64, costs: &[f64]) -> Option<Switch> {
        let since = now - self.rule.window_s;
        // The oldest kept check is the window's start (or the day's: cost 0).
        while self.history.get(1).is_some_and(|(t, _)| *t <= since) {
            self.history.pop_front();
        }
        let window: Vec<f64> = match self.history.front() {
            Some((t, c)) if *t <= since && c.len() == costs.len() => {
                costs.iter().zip(c).map(|(now, then)| now - then).collect()
            }
            _ => costs.to_vec(),
        };
        self.history.push_back((now, costs.to_vec()));
        let mine = *window.get(self.running)?;
        let (best, &low) = window
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))?;
        if best != self.running && low < mine * (1.0 - self.rule.margin) {
            self.streak = if best == self.leader {
                self.streak + 1
            } else {
                1
            };
            self.leader = best;
        } else {
            self.streak = 0;
        }
        if self.streak < self.rule.hold_checks {
            return None;
        }
        self.streak = 0;
        let s = Switch {
            at_s: now,
            from: self.running,
            to: best,
            window_costs: window,
        };
        self.running = best;
        self.switches.push(s.clone());
        Some(s)
    }
}

/// Replays arrived jobs in the simulator core: the shadow's cost of "this
/// policy since the start" (module docs).
#[derive(Clone, Debug)]
pub struct Replay {
    pub cluster: Vec<GpuModel>,
    pub heuristic: Heuristic,
    /// The run's configuration (epochs, reconfiguration time, start hour,
    /// power); the horizon is set to each check's time.
    pub cfg: SimConfig,
    /// Joules one second of tardiness is worth (the ET exchange rate).
    pub joules_per_tardiness_s: f64,
}

impl Replay {
    /// `energy + rate x tardiness` of `policy` on `arrived` (jobs that
    /// arrived by `now`), run from the start with the horizon at `now`
    /// (jobs still running then are run to their end).
    pub fn cost(
        &self,
        arrived: &[Job],
        now: f64,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<f64, SimError> {
        if arrived.is_empty() {
            return Ok(0.0);
        }
        let cfg = SimConfig {
            workload_horizon_s: Some(now),
            // The policies are compared on what they decide: jobs wait for
            // the layouts in every replay. Served on demand, a policy
            // smartmig runs would get instances built that a fixed layout
            // (Slurm's GRES) does not, and the same layout named two ways
            // would cost two amounts.
            serve_on_demand: false,
            ..self.cfg.clone()
        };
        let mut h = self.heuristic.build(cfg.seed);
        let m = simulate(
            &self.cluster,
            arrived,
            h.as_mut(),
            policy,
            &cfg,
            RunHooks::default(),
        )?
        .metrics;
        Ok(m.energy_j + self.joules_per_tardiness_s * m.total_tardiness_s)
    }
}

/// Makes a fresh copy of a policy (for each replay); the error says why
/// it could not (a policy file gone: the replay is then skipped).
pub type MakePolicy =
    Box<dyn FnMut() -> Result<Box<dyn RepartitionPolicy + Send>, PolicyParseError> + Send>;

/// Fixed layouts pursued from any state ([`step_toward`]): a static
/// fallback that can take over in the middle of a day (a plain `static:`
/// policy only installs its layouts at time 0).
#[derive(Clone, Debug)]
pub struct Toward {
    pub label: String,
    pub layouts: Vec<Layout>,
}

impl RepartitionPolicy for Toward {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        layout_or_whole(&self.layouts, gpu, geometry)
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        view.gpus
            .iter()
            .enumerate()
            .filter_map(|(gpu, st)| {
                let target = layout_or_whole(&self.layouts, gpu, st.geometry);
                step_toward(st, target).map(|target| Decision { gpu, target })
            })
            .collect()
    }
}

/// The shadow rule as a simulator policy (module docs). The day's jobs are
/// given whole, but a replay at `now` sees only those arrived by then.
pub struct Shadowed {
    label: String,
    live: Vec<Box<dyn RepartitionPolicy + Send>>,
    make: Vec<MakePolicy>,
    replay: Replay,
    /// The day's jobs, by arrival.
    jobs: Vec<Job>,
    state: ShadowState,
    next_check: f64,
    /// Replays that failed (the state then keeps what runs).
    pub failures: u64,
}

impl Shadowed {
    /// `make` makes fresh copies of the policies, the primary first, then
    /// the fallbacks; one copy of each runs live (the primary first), the
    /// others are replayed.
    pub fn new(
        label: String,
        mut make: Vec<MakePolicy>,
        replay: Replay,
        mut jobs: Vec<Job>,
        rule: ShadowRule,
    ) -> Result<Self, ShadowError> {
        if make.len() < 2 {
            return Err(ShadowError::NoFallback);
        }
        jobs.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
        let live = make.iter_mut().map(|m| m()).collect::<Result<_, _>>()?;
        Ok(Shadowed {
            label,
            live,
            make,
            replay,
            jobs,
            state: ShadowState::new(rule),
            next_check: rule.check_every_s,
            failures: 0,
        })
    }

    pub fn state(&self) -> &ShadowState {
        &self.state
    }

    fn check(&mut self, now: f64) {
        let arrived = self.jobs.partition_point(|j| j.arrival <= now);
        let jobs = &self.jobs[..arrived];
        let mut cost = vec![0.0; self.make.len()];
        for (k, make) in self.make.iter_mut().enumerate() {
            let c = make()
                .ok()
                .and_then(|mut p| self.replay.cost(jobs, now, p.as_mut()).ok());
            match c {
                Some(c) => cost[k] = c,
                None => {
                    self.failures += 1;
                    return;
                }
            }
        }
        let switch = self.state.observe(now, &cost);
        // The replays' day costs at each check, for diagnosing a switch
        // (`RUST_LOG=smartmig_core::policy::shadow=debug smartmig bench suite ...`).
        tracing::debug!(
            policy = %self.label,
            at_s = now,
            costs_j = ?cost,
            running = self.state.running(),
            switched = switch.is_some(),
            "shadow check"
        );
    }
}

impl RepartitionPolicy for Shadowed {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn describe(&self) -> String {
        let r = self.state.rule();
        let names: Vec<String> = self.live.iter().map(RepartitionPolicy::name).collect();
        format!(
            "{}: {}, whichever the day's replay favours (every {} s over {} s, margin {}, {} checks)",
            self.label,
            names.join(" or "),
            r.check_every_s,
            r.window_s,
            r.margin,
            r.hold_checks
        )
    }

    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        self.live[0].initial_layout(gpu, geometry)
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        if view.now >= self.next_check {
            // One check at the first epoch past each check time (epochs can
            // skip several of them on a quiet night).
            let every = self.state.rule().check_every_s;
            self.next_check = ((view.now / every).floor() + 1.0) * every;
            self.check(view.now);
        }
        // Both live copies see every epoch (a learned policy remembers the
        // arrivals); only the running one's decisions are applied.
        let running = self.state.running();
        let mut out = Vec::new();
        for (k, p) in self.live.iter_mut().enumerate() {
            let d = p.decide(view);
            if k == running {
                out = d;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::Geometry;
    use crate::workload::{JobClass, SpeedupCurve};
    use proptest::prelude::*;

    const RULE: ShadowRule = ShadowRule {
        check_every_s: 1800.0,
        window_s: 3.0 * 3600.0,
        margin: 0.02,
        hold_checks: 2,
    };

    const FALLBACK: usize = 1;

    /// Feeds per-check cost increases of (primary, fallback); returns the
    /// running policy after each.
    fn run(state: &mut ShadowState, steps: &[(f64, f64)]) -> Vec<usize> {
        let (mut p, mut f) = (0.0, 0.0);
        let mut out = Vec::new();
        for (k, &(dp, df)) in steps.iter().enumerate() {
            p += dp;
            f += df;
            state.observe((k + 1) as f64 * RULE.check_every_s, &[p, f]);
            out.push(state.running());
        }
        out
    }

    #[test]
    fn hands_over_after_hold_checks_and_back() {
        let mut s = ShadowState::new(RULE);
        // Fallback 10 % cheaper: the switch comes at the second check.
        let seen = run(&mut s, &[(110.0, 100.0); 3]);
        assert_eq!(seen, [PRIMARY, FALLBACK, FALLBACK]);
        // The primary becomes cheaper: the window (6 checks) still holds
        // the earlier costs, so it takes a while, then it switches back.
        let seen = run(&mut s, &[(50.0, 100.0); 8]);
        let back = seen.iter().position(|&r| r == PRIMARY).expect("back");
        assert!(back >= 1, "{seen:?}");
        assert_eq!(s.switches().len(), 2);
        let back = &s.switches()[1];
        assert_eq!((back.from, back.to), (FALLBACK, PRIMARY));
        assert!(back.window_costs[PRIMARY] < back.window_costs[FALLBACK]);
    }

    /// With two fallbacks the cheapest one over the window takes over, and
    /// a change of leader restarts the count.
    #[test]
    fn the_cheapest_of_several_takes_over() {
        let mut s = ShadowState::new(RULE);
        let mut c = [0.0; 3];
        let mut seen = Vec::new();
        for (k, inc) in [
            [100.0, 90.0, 95.0],
            [100.0, 95.0, 80.0],
            [100.0, 95.0, 80.0],
        ]
        .iter()
        .enumerate()
        {
            for (x, d) in c.iter_mut().zip(inc) {
                *x += d;
            }
            s.observe((k + 1) as f64 * RULE.check_every_s, &c);
            seen.push(s.running());
        }
        // Check 1: fallback 1 leads; check 2: fallback 2 (the count
        // restarts); check 3: fallback 2 again, so it takes over.
        assert_eq!(seen, [PRIMARY, PRIMARY, 2]);
        assert_eq!(s.switches()[0].from, PRIMARY);
    }

    /// After a restart of the costs (the daemon's new day) the running
    /// policy stays and the next check compares the new cumulative costs
    /// from zero, not against the old day's curve.
    #[test]
    fn restarting_the_costs_keeps_the_running_policy() {
        let mut s = ShadowState::new(RULE);
        run(&mut s, &[(110.0, 100.0); 3]);
        assert_eq!(s.running(), FALLBACK);
        s.restart_costs();
        assert_eq!(s.running(), FALLBACK);
        // New-day costs far below the old ones: taken whole, the primary
        // leads by 50 % on this check (hold 2: no switch yet).
        assert!(s
            .observe(10.0 * RULE.check_every_s, &[50.0, 100.0])
            .is_none());
        let sw = s
            .observe(11.0 * RULE.check_every_s, &[100.0, 200.0])
            .expect("the primary leads on two checks");
        assert_eq!(sw.window_costs, [100.0, 200.0]);
        assert_eq!(sw.to, PRIMARY);
    }

    #[test]
    fn a_lead_within_the_margin_never_switches() {
        let mut s = ShadowState::new(RULE);
        run(&mut s, &[(101.0, 100.0); 20]);
        assert!(s.switches().is_empty());
        assert_eq!(s.running(), PRIMARY);
    }

    #[test]
    fn overrides_parse_and_bad_ones_are_refused() {
        let r = ShadowRule::default()
            .with_overrides("every=600&window=7200&margin=0.05&hold=3")
            .unwrap();
        assert_eq!(
            (r.check_every_s, r.window_s, r.margin, r.hold_checks),
            (600.0, 7200.0, 0.05, 3)
        );
        assert!(ShadowRule::default().with_overrides("hold=0").is_err());
        assert!(ShadowRule::default()
            .with_overrides("speed=2")
            .unwrap_err()
            .to_string()
            .contains("speed"));
        assert!(ShadowRule::default().with_overrides("margin=-1").is_err());
    }

    proptest! {
        /// Every switch is earned: at the switch the new policy's window
        /// cost undercuts the old one's by the margin, and the one before
        /// it (on the previous check) did too; a lead within the margin
        /// never switches.
        #[test]
        fn every_switch_is_earned(
            steps in proptest::collection::vec((0.0f64..1000.0, 0.0f64..1000.0), 1..60),
        ) {
            let mut s = ShadowState::new(RULE);
            let mut running = PRIMARY;
            let (mut p, mut f) = (0.0, 0.0);
            let mut hist: Vec<(f64, f64)> = Vec::new();
            let mut led = 0u32;
            for (k, &(dp, df)) in steps.iter().enumerate() {
                p += dp;
                f += df;
                let now = (k + 1) as f64 * RULE.check_every_s;
                // The window: back to the last check at or before now - window.
                let start = hist
                    .iter()
                    .enumerate()
                    .rev()
                    .find(|(j, _)| (*j + 1) as f64 * RULE.check_every_s <= now - RULE.window_s)
                    .map_or((0.0, 0.0), |(_, &c)| c);
                hist.push((p, f));
                let (pw, fw) = (p - start.0, f - start.1);
                let (mine, other) = if running == PRIMARY { (pw, fw) } else { (fw, pw) };
                let leads = other < mine * (1.0 - RULE.margin);
                led = if leads { led + 1 } else { 0 };
                let switched = s.observe(now, &[p, f]);
                if let Some(sw) = switched {
                    prop_assert!(leads && led >= RULE.hold_checks, "unearned switch at {now}");
                    prop_assert!((sw.window_costs[0] - pw).abs() < 1e-6 && (sw.window_costs[1] - fw).abs() < 1e-6);
                    running = sw.to;
                    led = 0;
                } else {
                    prop_assert!(led < RULE.hold_checks, "a due switch did not happen at {now}");
                }
                prop_assert_eq!(s.running(), running);
            }
        }
    }

    fn job(id: u64, arrival: f64, work: f64, slack: f64, saturation: f64) -> Job {
        Job {
            id,
            arrival,
            work,
            speedup: SpeedupCurve::new(1.0, saturation).unwrap(),
            memory_gb: 4.0,
            deadline: arrival + slack,
            class: JobClass::Inference,
            requested_slices: None,
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        }
    }

    /// Two phases on two GPUs: first jobs that need a whole GPU to be on
    /// time (slices make them 7 times slower), then floods of small jobs
    /// that run as fast on a 1g slice as on a whole GPU (whole GPUs queue
    /// them one by one).
    fn two_phase_day() -> Vec<Job> {
        let mut jobs = Vec::new();
        for k in 0..12 {
            for _ in 0..2 {
                jobs.push(job(0, f64::from(k) * 1800.0, 1500.0, 1950.0, 1.0));
            }
        }
        for k in 0..12 {
            for _ in 0..6 {
                jobs.push(job(
                    0,
                    6.0 * 3600.0 + f64::from(k) * 1800.0,
                    1200.0,
                    1500.0,
                    1.0 / 7.0,
                ));
            }
        }
        for (i, j) in jobs.iter_mut().enumerate() {
            j.id = i as u64;
        }
        jobs
    }

    fn toward(picture: &str) -> Toward {
        let g = Geometry::of(GpuModel::A100_40gb);
        let l = *g
            .catalog()
            .iter()
            .find(|&&l| g.picture(l) == picture)
            .expect("catalog layout");
        Toward {
            label: format!("toward:{picture}"),
            layouts: vec![l; 2],
        }
    }

    fn replay(jobs: &[Job]) -> Replay {
        let horizon = jobs.iter().map(|j| j.arrival).fold(0.0, f64::max) + 1.0;
        Replay {
            cluster: vec![GpuModel::A100_40gb; 2],
            heuristic: Heuristic::Edf,
            cfg: SimConfig {
                workload_horizon_s: Some(horizon),
                epoch: crate::sim::EpochRule::Seconds(300.0),
                ..SimConfig::default()
            },
            joules_per_tardiness_s: 2500.0,
        }
    }

    /// A primary that suits only the second phase (every GPU in 1g
    /// slices) hands over to whole GPUs in the first phase and takes over
    /// again in the second; the shadowed day costs less than either alone.
    #[test]
    fn a_policy_that_fits_half_the_day_is_switched_off_and_back_on() {
        let jobs = two_phase_day();
        let r = replay(&jobs);
        let horizon = r.cfg.workload_horizon_s.unwrap();
        let primary: MakePolicy = Box::new(|| Ok(Box::new(toward("1|1|1|1|1|1|1|."))));
        let fallback: MakePolicy = Box::new(|| Ok(Box::new(toward("77777777"))));
        let mut shadowed = Shadowed::new(
            "shadow".into(),
            vec![primary, fallback],
            r.clone(),
            jobs.clone(),
            RULE,
        )
        .expect("two policies");
        let alone = |mut p: Toward| r.cost(&jobs, horizon, &mut p).unwrap();
        let small = alone(toward("1|1|1|1|1|1|1|."));
        let whole = alone(toward("77777777"));
        let both = r.cost(&jobs, horizon, &mut shadowed).unwrap();
        let sw = shadowed.state().switches();
        assert_eq!(shadowed.failures, 0);
        assert!(sw.len() >= 2, "{sw:?}");
        assert_eq!(sw[0].to, FALLBACK);
        assert!(sw[0].at_s <= 3600.0, "{sw:?}");
        assert_eq!(sw[1].to, PRIMARY);
        assert!(sw[1].at_s > 6.0 * 3600.0, "{sw:?}");
        assert!(
            both < small && both < whole,
            "shadow {both}, 1g {small}, whole {whole}"
        );
    }
}
