//! Rule-based deferral: a heuristic's instance choice in earliest-deadline
//! order, where the job at the head of a placement round may let the jobs
//! behind it go first ([`super::Pick::defer`]).
//!
//! Deferring a job that will be late on every free instance is how a
//! placement trades one late job for others on time; but each deferral
//! delays the late job until room frees again, which adds tardiness. Two
//! rules:
//!
//! - `defer-late[:K]` defers every such job while another job waits,
//!   unless it is already overdue by more than K times its work. It saves
//!   many late jobs and adds much tardiness: it also defers when the jobs
//!   it lets by would have been on time anyway, and behind long ones.
//! - `rescue[:R[:S[:K]]]` defers it only for a job the deferral saves, at
//!   little cost: another waiting job that a free instance fits, that is on
//!   time if it starts now, would be late if it waited R times its run
//!   time there, and runs at most S times as long as the late job would.
//!   On one instance, putting a late job h behind an on-time job j costs
//!   h the run of j and spares j the run of h less j's slack; with j's
//!   slack small and j shorter than h, the swap lowers total tardiness
//!   *and* saves j (the modified-due-date argument). K bounds the
//!   deferrals: a job overdue by K times its work is no longer passed
//!   over, so none waits for ever.
//!
//! Written `<heuristic>+defer-late[:K]` or `<heuristic>+rescue[:R[:S[:K]]]`;
//! used as teachers of the learned placement and scored by `bench
//! placement` as candidates, never as opponents (they are not among the
//! seven heuristics a site has without smartmig).

use std::str::FromStr;

use crate::workload::Job;

use super::heuristics::{Candidate, Heuristic, Pick, PlacementContext, PlacementHeuristic};

/// When the head job of a round defers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeferRule {
    /// `defer-late:K`: late on every free instance and overdue by at most
    /// K times its work.
    Late { overdue_work: f64 },
    /// `rescue:R:S:K`: late on every free instance, overdue by at most K
    /// times its work, and [`Rescue::possible`].
    Rescue(Rescue),
}

/// Which waiting job a deferral saves (`rescue:R:S:K`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rescue {
    /// R: the saved job's slack is under R times its run time.
    pub slack_runs: f64,
    /// S: the saved job's run time is at most S times the deferred one's.
    pub shorter: f64,
    /// K: no deferral once overdue by K times the work.
    pub overdue_work: f64,
}

impl Rescue {
    /// `rescue` without numbers: R = 0.5, S = 3, K = 6, chosen on
    /// validation days (docs/policy.md, "The learned placement").
    pub const DEFAULT: Rescue = Rescue {
        slack_runs: 0.5,
        shorter: 3.0,
        overdue_work: 6.0,
    };

    /// Whether a waiting job other than `head` (whose shortest run on the
    /// offered instances is `head_run_s`) fits one of `candidates`, is on
    /// time if it starts there now, would be late if it waited R times its
    /// run time there, and runs at most S times `head_run_s`.
    pub fn possible(
        &self,
        head: u64,
        head_run_s: f64,
        candidates: &[Candidate],
        ctx: &PlacementContext<'_>,
    ) -> bool {
        let longest = self.shorter * head_run_s;
        ctx.waiting.iter().filter(|w| w.id != head).any(|w| {
            candidates.iter().any(|c| {
                if f64::from(c.memory_gb) < w.memory_gb || c.compute < w.min_compute {
                    return false;
                }
                let run = w.runtime_on(c.compute, c.total_compute);
                let slack = w.deadline - (ctx.now + run);
                run <= longest && slack >= 0.0 && slack < self.slack_runs * run
            })
        })
    }
}

/// A heuristic with a deferral rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeferSpec {
    pub inner: Heuristic,
    pub rule: DeferRule,
}

/// Why a `<heuristic>+<rule>` value is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not <heuristic>+defer-late[:K] or <heuristic>+rescue[:R[:S[:K]]] (numbers >= 0): {1}"
)]
pub struct DeferSpecError(pub String, pub String);

impl FromStr for DeferSpec {
    type Err = DeferSpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| DeferSpecError(s.to_string(), why.to_string());
        let (h, rule) = s.trim().split_once('+').ok_or_else(|| bad("no `+`"))?;
        let inner = h.parse::<Heuristic>().map_err(|e| bad(&e.to_string()))?;
        let mut parts = rule.split(':');
        let name = parts.next().unwrap_or_default();
        let mut numbers = Vec::new();
        for a in parts {
            numbers.push(
                a.parse::<f64>()
                    .ok()
                    .filter(|k| k.is_finite() && *k >= 0.0)
                    .ok_or_else(|| bad(&format!("`{a}` is not a number >= 0")))?,
            );
        }
        let rule = match (name, numbers.as_slice()) {
            ("defer-late", []) => DeferRule::Late { overdue_work: 2.0 },
            ("defer-late", &[k]) => DeferRule::Late { overdue_work: k },
            ("rescue", n) if n.len() <= 3 => {
                let d = Rescue::DEFAULT;
                DeferRule::Rescue(Rescue {
                    slack_runs: n.first().copied().unwrap_or(d.slack_runs),
                    shorter: n.get(1).copied().unwrap_or(d.shorter),
                    overdue_work: n.get(2).copied().unwrap_or(d.overdue_work),
                })
            }
            ("defer-late" | "rescue", _) => return Err(bad("too many numbers")),
            (other, _) => return Err(bad(&format!("unknown rule `{other}`"))),
        };
        Ok(DeferSpec { inner, rule })
    }
}

// The parameters are finite (the parser refuses others), so equality is
// an equivalence and hashing the printed form agrees with it.
impl Eq for DeferSpec {}

impl std::hash::Hash for DeferSpec {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.to_string().hash(state);
    }
}

impl std::fmt::Display for DeferSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rule {
            DeferRule::Late { overdue_work } => {
                write!(f, "{}+defer-late:{overdue_work}", self.inner)
            }
            DeferRule::Rescue(r) => write!(
                f,
                "{}+rescue:{}:{}:{}",
                self.inner, r.slack_runs, r.shorter, r.overdue_work
            ),
        }
    }
}

impl DeferSpec {
    /// A fresh instance for one run.
    pub fn build(self, seed: u64) -> Box<dyn PlacementHeuristic + Send> {
        Box::new(Deferring {
            inner: self.inner.build(seed),
            rule: self.rule,
        })
    }
}

/// The heuristic of a [`DeferSpec`].
pub struct Deferring {
    pub inner: Box<dyn PlacementHeuristic + Send>,
    pub rule: DeferRule,
}

/// The shortest run of `job` on the offered instances, s.
pub fn shortest_run_s(job: &Job, candidates: &[Candidate]) -> f64 {
    candidates
        .iter()
        .map(|c| job.runtime_on(c.compute, c.total_compute))
        .fold(f64::INFINITY, f64::min)
}

impl PlacementHeuristic for Deferring {
    fn name(&self) -> &'static str {
        match self.rule {
            DeferRule::Late { .. } => "defer-late",
            DeferRule::Rescue(_) => "rescue",
        }
    }

    fn priority(&self, job: &Job) -> f64 {
        job.deadline
    }

    fn choose(&mut self, job: &Job, candidates: &[Candidate]) -> Pick {
        self.inner.choose(job, candidates)
    }

    fn choose_in(
        &mut self,
        job: &Job,
        candidates: &[Candidate],
        ctx: &PlacementContext<'_>,
    ) -> Pick {
        let pick = self.inner.choose_in(job, candidates, ctx);
        let offered = ctx.may_defer && ctx.waiting.len() > 1;
        let overdue = ctx.now - job.deadline;
        let run = shortest_run_s(job, candidates);
        let late_everywhere = ctx.now + run > job.deadline;
        let defer = offered
            && late_everywhere
            && match self.rule {
                DeferRule::Late { overdue_work } => overdue < overdue_work * job.work,
                DeferRule::Rescue(r) => {
                    overdue < r.overdue_work * job.work && r.possible(job.id, run, candidates, ctx)
                }
            };
        Pick { defer, ..pick }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::GpuModel;
    use crate::policy::{PendingByProfile, PendingJob};
    use crate::workload::{JobClass, SpeedupCurve};

    #[test]
    fn specs_parse_and_print_back() {
        for s in [
            "cedf+defer-late:2",
            "eft+rescue:0.25:2:3",
            "edf+rescue:0:0:0",
        ] {
            assert_eq!(s.parse::<DeferSpec>().unwrap().to_string(), s);
        }
        assert_eq!(
            "cedf+defer-late".parse::<DeferSpec>().unwrap().rule,
            DeferRule::Late { overdue_work: 2.0 }
        );
        assert_eq!(
            "cedf+rescue".parse::<DeferSpec>().unwrap().to_string(),
            "cedf+rescue:0.5:3:6"
        );
        assert_eq!(
            "cedf+rescue:0.25".parse::<DeferSpec>().unwrap().to_string(),
            "cedf+rescue:0.25:3:6"
        );
        for bad in [
            "cedf",
            "fifo+rescue",
            "cedf+rescue:-1",
            "cedf+later",
            "cedf+rescue:x",
            "cedf+rescue:1:2:3:4",
            "cedf+defer-late:1:2",
        ] {
            let e = bad.parse::<DeferSpec>().unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    const M: GpuModel = GpuModel::A100_40gb;

    fn job(id: u64, work: f64, deadline: f64) -> Job {
        Job {
            id,
            arrival: 0.0,
            work,
            speedup: SpeedupCurve::new(1.0, 1.0).unwrap(),
            memory_gb: 4.0,
            deadline,
            class: JobClass::Training,
            requested_slices: None,
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        }
    }

    fn pending(j: &Job) -> PendingJob {
        PendingJob::of(j, Default::default())
    }

    /// A whole free GPU, a late head job of 1000 s (deadline 500 s) and
    /// one other waiting job: the rescue rule defers the head exactly when
    /// the other is saved cheaply; `defer-late` defers it in every case.
    #[test]
    fn rescue_defers_only_for_a_short_job_the_wait_would_make_late() {
        let whole = Candidate {
            class: 0,
            model: M,
            compute: 7,
            total_compute: 7,
            memory_gb: 40,
            profile_index: 5,
            free: 1,
        };
        let head = job(1, 1000.0, 500.0);
        let decide_for = |rule: &str, head: &Job, other: &Job| {
            let waiting = [pending(head), pending(other)];
            let demand = PendingByProfile::default();
            let ctx = PlacementContext {
                now: 0.0,
                gpus: 1,
                total_compute: 7,
                busy_compute: 0,
                waiting: &waiting,
                pending_by_profile: &demand,
                may_defer: true,
            };
            let spec: DeferSpec = rule.parse().unwrap();
            spec.build(0).choose_in(head, &[whole], &ctx).defer
        };
        let decide = |rule: &str, other: &Job| decide_for(rule, &head, other);
        // 300 s of work due at 400 s: on time now, late after waiting
        // 150 s (R = 0.5), and shorter than the head: saved.
        let saved = job(2, 300.0, 400.0);
        assert!(decide("cedf+rescue", &saved));
        // Plenty of slack (due at 2000 s): it can wait, no deferral.
        let relaxed = job(2, 300.0, 2000.0);
        assert!(!decide("cedf+rescue", &relaxed));
        assert!(decide("cedf+defer-late", &relaxed));
        // Already late itself: nothing to save.
        let hopeless = job(2, 300.0, 200.0);
        assert!(!decide("cedf+rescue", &hopeless));
        // Longer than S = 3 times the head's run: too dear.
        let long = job(2, 3500.0, 3600.0);
        assert!(!decide("cedf+rescue", &long));
        assert!(decide("cedf+rescue:0.5:4", &long));
        // Overdue by more than K = 6 works: passed over no more.
        let mut old = head;
        old.deadline = -6001.0;
        assert!(!decide_for("cedf+rescue", &old, &saved));
    }
}
