//! Do no harm during the day, the daemon's pure half (issue 39; the rule
//! itself is [`crate::policy::shadow`]): the `[shadow]` settings, and the
//! node's day as smartmigd saw it, turned into simulator jobs that
//! [`crate::policy::shadow::Replay::cost`] replays under the learned
//! policy and under its fallback.
//!
//! What the daemon knows of a job is what its allocate and release told
//! it: when it got its instance and how long it waited for it (so when it
//! asked), the instance's compute slices and memory, the deadline (Slurm's
//! `--deadline`, else the end of its time limit) and when it released the
//! instance. It does not know a job's speed-up curve or how much work a
//! running job has left, so the replay uses two estimates:
//!
//! - **Work.** A job's speed-up is taken as linear (what the daemon's
//!   look-ahead assumes too), so its whole-GPU work is its observed run
//!   time times `compute / total` of the slice it ran on; replayed on a
//!   slice of the same size (the replay hands out exactly the requested
//!   size, as smartmigd does) it runs exactly as long as it did.
//! - **Running jobs.** Their work so far: elapsed since they started. The
//!   replay then charges at least what was observed and never invents
//!   work; it underestimates a long job until it ends.
//!
//! A job's wait in Slurm's queue before it reached the node is not seen
//! either: it arrives when it asked smartmigd.
//!
//! `bench suite`'s `learned+shadow` row replays the true work of every
//! job, a small optimism the daemon cannot have.
//!
//! The day is bounded: the book restarts every [`DAY_S`] from its origin
//! ([`DayBook::new_day`]), dropping the jobs that ended and carrying the
//! running ones over as if they arrived at the new origin. Replays are
//! therefore at most one day of the node's jobs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::policy::shadow::ShadowRule;
use crate::workload::{Job, JobClass, SpeedupCurve};

/// How long one book lasts before it restarts (a day), s.
pub const DAY_S: f64 = 86_400.0;

/// The deadline of a job with neither `--deadline` nor a time limit, s
/// after its arrival: far enough never to be late within a day.
pub const NO_DEADLINE_S: f64 = 30.0 * DAY_S;

/// Shortest work a replayed job gets, s (a job seen the instant it
/// started still occupies its slice).
pub const MIN_WORK_S: f64 = 1.0;

/// `[shadow]`: whether and how smartmigd keeps a shadow of the day
/// (docs/daemon.md, "Do no harm during the day: the shadow").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShadowConfig {
    /// On or off; off unless set. Opt-in because on the validation days
    /// the switch cost more than it saved beside every shipped policy
    /// (docs/policy.md, "The shadow, off by default").
    pub enabled: bool,
    /// The policy that takes over (any `policy` spec; a `static:` layout
    /// is pursued from whatever layout the GPUs have). Absent: `greedy`.
    pub fallback: Option<String>,
    /// Seconds between two comparisons.
    pub every_s: f64,
    /// The sliding window the two costs are compared over, s.
    pub window_s: f64,
    /// Relative lead the other policy needs, in [0, 1).
    pub margin: f64,
    /// Consecutive checks with that lead before a switch (>= 1).
    pub hold_checks: u32,
    /// Joules one second of a job's tardiness costs in the comparison.
    /// Absent: what one of the node's GPUs draws at full power.
    pub joules_per_tardiness_s: Option<f64>,
}

impl Default for ShadowConfig {
    fn default() -> Self {
        let r = ShadowRule::default();
        ShadowConfig {
            enabled: false,
            fallback: None,
            every_s: r.check_every_s,
            window_s: r.window_s,
            margin: r.margin,
            hold_checks: r.hold_checks,
            joules_per_tardiness_s: None,
        }
    }
}

/// The fallback when the config names none.
pub const DEFAULT_FALLBACK: &str = "greedy";

impl ShadowConfig {
    /// The fallback's spec.
    pub fn fallback_spec(&self) -> &str {
        self.fallback.as_deref().unwrap_or(DEFAULT_FALLBACK).trim()
    }

    /// The switching rule.
    pub fn rule(&self) -> ShadowRule {
        ShadowRule {
            check_every_s: self.every_s,
            window_s: self.window_s,
            margin: self.margin,
            hold_checks: self.hold_checks,
        }
    }

    /// The first bad value as `(key under shadow., why)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let positive = |key: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err((key, format!("{v} is not a positive number of seconds")))
            }
        };
        positive("every_s", self.every_s)?;
        positive("window_s", self.window_s)?;
        if self.window_s > DAY_S {
            return Err((
                "window_s",
                format!(
                    "{} is longer than the day the shadow keeps ({DAY_S} s)",
                    self.window_s
                ),
            ));
        }
        if !(self.margin.is_finite() && (0.0..1.0).contains(&self.margin)) {
            return Err(("margin", format!("{} is outside [0, 1)", self.margin)));
        }
        if self.hold_checks == 0 {
            return Err(("hold_checks", "must be at least 1".into()));
        }
        if let Some(j) = self.joules_per_tardiness_s {
            if !(j.is_finite() && j > 0.0) {
                return Err(("joules_per_tardiness_s", format!("{j} is not positive")));
            }
        }
        if self
            .fallback
            .as_deref()
            .is_some_and(|f| f.trim().is_empty())
        {
            return Err((
                "fallback",
                "must not be empty (leave it out for greedy)".into(),
            ));
        }
        Ok(())
    }
}

/// One job of the node's day as the daemon saw it; times are Unix seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct SeenJob {
    /// When it asked for its instance (its start less its wait).
    pub arrival: f64,
    /// When it got its instance.
    pub start: f64,
    /// When it released it (`None`: still running).
    pub end: Option<f64>,
    /// Compute slices of its instance, and of its GPU.
    pub compute: u8,
    pub gpu_compute: u8,
    /// The instance's memory, GB (the job's need is at most this).
    pub memory_gb: f64,
    /// Slurm's deadline, else the end of the time limit; infinite: none.
    pub deadline: f64,
}

/// The node's jobs since the book's origin (module docs).
#[derive(Clone, Debug)]
pub struct DayBook {
    origin: f64,
    jobs: BTreeMap<u64, SeenJob>,
}

impl DayBook {
    pub fn new(origin: f64) -> DayBook {
        DayBook {
            origin,
            jobs: BTreeMap::new(),
        }
    }

    /// The Unix time the replays start from.
    pub fn origin(&self) -> f64 {
        self.origin
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The jobs holding instances at `now` (an epoch's look at the books):
    /// new ones are recorded; a recorded job still running that is not
    /// among them ended by `now` (freed by the reaper, or its release was
    /// missed).
    pub fn running(&mut self, now: f64, running: Vec<(u64, SeenJob)>) {
        let seen: std::collections::HashSet<u64> = running.iter().map(|(id, _)| *id).collect();
        for (id, job) in &mut self.jobs {
            if job.end.is_none() && !seen.contains(id) {
                job.end = Some(now.max(job.start));
            }
        }
        for (id, job) in running {
            match self.jobs.get(&id) {
                // Read before a release that was recorded first: stale.
                Some(old) if old.end.is_some_and(|e| job.start <= e) => {}
                // The same run seen again.
                Some(old) if old.end.is_none() && old.start == job.start => {}
                _ => {
                    self.jobs.insert(id, job);
                }
            }
        }
    }

    /// A release at `end`: the job's recorded run ends (its deadline as
    /// first seen is kept); a job never seen running is recorded whole.
    pub fn ended(&mut self, id: u64, end: f64, job: SeenJob) {
        match self.jobs.get_mut(&id) {
            Some(old) if old.end.is_none() => old.end = Some(end.max(old.start)),
            _ => {
                self.jobs.insert(
                    id,
                    SeenJob {
                        end: Some(end.max(job.start)),
                        ..job
                    },
                );
            }
        }
    }

    /// At `now`, a day after the origin: starts a new day at `now`,
    /// dropping the jobs that ended and carrying the running ones over.
    /// Returns whether it did.
    pub fn new_day(&mut self, now: f64) -> bool {
        if now - self.origin < DAY_S {
            return false;
        }
        self.origin = now;
        self.jobs.retain(|_, j| j.end.is_none());
        true
    }

    /// The day's jobs as the simulator takes them at `now`: times from the
    /// origin, sorted by arrival, ids `0..n` (module docs for the work).
    pub fn jobs(&self, now: f64) -> Vec<Job> {
        let mut out: Vec<Job> = self.jobs.values().map(|j| self.job(j, now)).collect();
        out.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
        for (i, j) in out.iter_mut().enumerate() {
            j.id = i as u64;
        }
        out
    }

    fn job(&self, j: &SeenJob, now: f64) -> Job {
        let arrival = (j.arrival - self.origin).max(0.0);
        // A job carried over into a new day counts from the origin.
        let start = j.start.max(self.origin);
        let ran = (j.end.unwrap_or(now) - start).max(MIN_WORK_S);
        let speed = f64::from(j.compute) / f64::from(j.gpu_compute.max(1));
        let deadline = if j.deadline.is_finite() {
            j.deadline - self.origin
        } else {
            arrival + NO_DEADLINE_S
        };
        Job {
            id: 0,
            arrival,
            work: ran * speed.min(1.0),
            speedup: SpeedupCurve::linear(),
            memory_gb: j.memory_gb,
            deadline,
            // Unknown to the daemon; the replay's heuristics and policies
            // read the curve, which is the same for both classes here.
            class: JobClass::Training,
            requested_slices: Some(j.compute),
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(arrival: f64, start: f64, end: Option<f64>, compute: u8) -> SeenJob {
        SeenJob {
            arrival,
            start,
            end,
            compute,
            gpu_compute: 7,
            memory_gb: 10.0,
            deadline: start + 100.0,
        }
    }

    #[test]
    fn work_is_the_observed_run_time_at_the_slice_speed() {
        let mut b = DayBook::new(1000.0);
        // 1 slice of 7, ran 70 s: 10 s of whole-GPU work, on a 1g slice 70 s.
        b.running(1100.0, vec![(5, seen(1010.0, 1030.0, None, 1))]);
        b.ended(5, 1100.0, seen(0.0, 0.0, None, 1));
        // Running since 1050 on a whole GPU, seen at 1100: 50 s so far.
        b.running(1100.0, vec![(6, seen(1050.0, 1050.0, None, 7))]);
        let jobs = b.jobs(1100.0);
        assert_eq!(jobs.len(), 2);
        let (a, c) = (&jobs[0], &jobs[1]);
        assert_eq!((a.id, a.arrival, a.requested_slices), (0, 10.0, Some(1)));
        assert!((a.work - 10.0).abs() < 1e-9, "{}", a.work);
        assert!((a.runtime_on(1, 7) - 70.0).abs() < 1e-9);
        assert!((a.deadline - 130.0).abs() < 1e-9);
        assert_eq!((c.id, c.arrival), (1, 50.0));
        assert!((c.work - 50.0).abs() < 1e-9, "{}", c.work);
        // Later, the running job's work grows with what was observed.
        let later = b.jobs(1160.0);
        assert!((later[1].work - 110.0).abs() < 1e-9);
        assert!((later[0].work - 10.0).abs() < 1e-9);
    }

    #[test]
    fn a_job_gone_from_the_books_ended_and_a_stale_look_is_ignored() {
        let mut b = DayBook::new(0.0);
        b.running(10.0, vec![(1, seen(0.0, 5.0, None, 3))]);
        // Released at 20 (the release is recorded), then a look taken
        // before it arrives late: the job stays ended.
        b.ended(1, 20.0, seen(0.0, 5.0, None, 3));
        b.running(20.0, vec![(1, seen(0.0, 5.0, None, 3))]);
        assert!((b.jobs(50.0)[0].work - 15.0 * 3.0 / 7.0).abs() < 1e-9);
        // A job the books no longer show ended at that look.
        b.running(30.0, vec![(2, seen(25.0, 25.0, None, 7))]);
        b.running(40.0, vec![]);
        let j = b.jobs(100.0);
        assert!((j[1].work - 15.0).abs() < 1e-9, "{}", j[1].work);
        // A job with no deadline is never late within the day.
        let mut none = seen(0.0, 0.0, None, 1);
        none.deadline = f64::INFINITY;
        b.ended(3, 10.0, none);
        assert!(b.jobs(100.0).iter().any(|j| j.deadline >= NO_DEADLINE_S));
    }

    #[test]
    fn a_new_day_drops_the_ended_jobs_and_carries_the_running_ones() {
        let mut b = DayBook::new(0.0);
        b.ended(1, 100.0, seen(0.0, 10.0, None, 1));
        b.running(200.0, vec![(2, seen(150.0, 150.0, None, 2))]);
        assert!(!b.new_day(DAY_S - 1.0));
        assert!(b.new_day(DAY_S + 5.0));
        assert_eq!(b.origin(), DAY_S + 5.0);
        let jobs = b.jobs(DAY_S + 65.0);
        assert_eq!(jobs.len(), 1);
        // Carried over: arrives at the origin, work counted from it.
        assert_eq!(jobs[0].arrival, 0.0);
        assert!((jobs[0].work - 60.0 * 2.0 / 7.0).abs() < 1e-9);
    }

    #[test]
    fn settings_default_to_the_core_rule_and_bad_ones_name_the_key() {
        let c = ShadowConfig::default();
        assert_eq!(c.rule(), ShadowRule::default());
        assert!(!c.enabled, "the shadow is opt-in");
        assert_eq!(c.fallback_spec(), "greedy");
        for (bad, key) in [
            (
                ShadowConfig {
                    every_s: 0.0,
                    ..c.clone()
                },
                "every_s",
            ),
            (
                ShadowConfig {
                    window_s: f64::NAN,
                    ..c.clone()
                },
                "window_s",
            ),
            (
                ShadowConfig {
                    window_s: 2.0 * DAY_S,
                    ..c.clone()
                },
                "window_s",
            ),
            (
                ShadowConfig {
                    margin: 1.0,
                    ..c.clone()
                },
                "margin",
            ),
            (
                ShadowConfig {
                    hold_checks: 0,
                    ..c.clone()
                },
                "hold_checks",
            ),
            (
                ShadowConfig {
                    joules_per_tardiness_s: Some(-1.0),
                    ..c.clone()
                },
                "joules_per_tardiness_s",
            ),
            (
                ShadowConfig {
                    fallback: Some(" ".into()),
                    ..c.clone()
                },
                "fallback",
            ),
        ] {
            assert_eq!(bad.check().map_err(|e| e.0), Err(key));
        }
        assert!(c.check().is_ok());
    }
}
