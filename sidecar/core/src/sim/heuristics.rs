//! Job-placement heuristics: which waiting job goes first, and onto which
//! free instance.
//!
//! The simulator is *work-conserving*: whenever a free, ready instance fits
//! some waiting job, a job is started. Among the jobs that can start, the one
//! with the smallest [`PlacementHeuristic::priority`] goes first (ties: the
//! earlier arrival); the heuristic then picks the instance class (model and
//! profile) among the free ones that fit ([`PlacementHeuristic::choose`]).
//! Within a class the engine takes the free instance on the lowest-numbered
//! GPU (packing load onto few GPUs, which the concave power model rewards),
//! starting from the GPU hint a heuristic may give.
//!
//! | name | job order | instance |
//! |---|---|---|
//! | `edf` | earliest deadline | best fit (least memory slack, then fewest compute slices) |
//! | `cedf` | earliest deadline | by speed-up class: sub-linear jobs take the smallest instance, scalable ones the fastest (as `eft`) |
//! | `eft` | arrival (FIFO) | earliest finish time: highest speed for this job, ties to the smaller instance |
//! | `largest-first` | arrival | the largest instance (most compute, then memory) |
//! | `smallest-first` | arrival | the smallest instance (fewest compute, then memory) |
//! | `best-fit` | arrival | least memory slack, then fewest compute slices |
//! | `random` | arrival | uniformly random free instance (seeded) |
//!
//! A job is *sub-linear* for `cedf` when one compute slice gives it at least
//! 1.5 times its linear share (`speed(1, C) * C >= 1.5`): such jobs lose
//! little on small slices, scalable ones gain from big ones.
//!
//! Preemption is an extension point, off: a heuristic could be asked for a
//! victim when no instance fits; the engine does not preempt today and the
//! event-log schema (one start and one end per job) would need a segment list.

use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::mig::GpuModel;
use crate::workload::Job;

/// One class of free instances a job could start on now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Engine-internal class index (model slot and profile).
    pub class: u16,
    pub model: GpuModel,
    /// Compute slices of the instance and of its whole GPU.
    pub compute: u8,
    pub total_compute: u8,
    /// Memory of the instance's profile, GB.
    pub memory_gb: u32,
    /// Index of the profile in its model's profile list
    /// (`model.spec().profiles`).
    pub profile_index: u8,
    /// Free, ready instances of this class (at least 1).
    pub free: u32,
}

/// What the cluster looks like at a placement decision, beyond the job and
/// its candidates: the queue and the load. The rule-based heuristics ignore
/// it; a learned placement reads its features from it
/// ([`super::placement_features`]).
#[derive(Clone, Copy, Debug)]
pub struct PlacementContext<'a> {
    /// Simulated time, s.
    pub now: f64,
    pub gpus: usize,
    /// Compute slices of all GPUs, and of the busy instances among them.
    pub total_compute: u32,
    pub busy_compute: u32,
    /// Every waiting job, the one being placed included.
    pub waiting: &'a [crate::policy::PendingJob],
    /// Waiting jobs per model slot and profile whose smallest fitting
    /// instance is that profile (the job being placed included).
    pub pending_by_profile: &'a crate::policy::PendingByProfile,
    /// Whether [`Pick::defer`] is honoured now: in the first pass of a
    /// placement round, not when deferred jobs are offered again.
    pub may_defer: bool,
}

/// The heuristic's answer: a candidate and where to start looking for a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pick {
    /// Index into the candidates slice.
    pub candidate: usize,
    /// Take the first free instance of the class on a GPU >= this one
    /// (wrapping around); 0 packs onto the lowest GPUs.
    pub gpu_hint: u32,
    /// Let the jobs behind this one go first in this placement round
    /// (honoured only when [`PlacementContext::may_defer`]; the job is
    /// offered again at the end of the round, without this choice, so no
    /// instance idles for it). The rule-based heuristics never defer.
    pub defer: bool,
}

/// A job-placement heuristic. Object safe: the engine holds a `dyn`.
pub trait PlacementHeuristic {
    /// Name as accepted on the command line.
    fn name(&self) -> &'static str;
    /// Order key of a waiting job: smaller starts first. Computed once, when
    /// the job arrives.
    fn priority(&self, job: &Job) -> f64;
    /// The instance class for `job` among `candidates` (non-empty, every one
    /// fits the job).
    fn choose(&mut self, job: &Job, candidates: &[Candidate]) -> Pick;
    /// [`Self::choose`] with the cluster's state; what the engine calls.
    /// The rule-based heuristics need only the job and the candidates.
    fn choose_in(
        &mut self,
        job: &Job,
        candidates: &[Candidate],
        _ctx: &PlacementContext<'_>,
    ) -> Pick {
        self.choose(job, candidates)
    }
}

/// The built-in heuristics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Heuristic {
    Edf,
    Cedf,
    Eft,
    LargestFirst,
    SmallestFirst,
    BestFit,
    Random,
}

/// Unknown heuristic name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement heuristic `{0}` (known: edf, cedf, eft, largest-first, smallest-first, best-fit, random)")]
pub struct UnknownHeuristic(pub String);

impl Heuristic {
    pub const ALL: [Heuristic; 7] = [
        Heuristic::Edf,
        Heuristic::Cedf,
        Heuristic::Eft,
        Heuristic::LargestFirst,
        Heuristic::SmallestFirst,
        Heuristic::BestFit,
        Heuristic::Random,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Heuristic::Edf => "edf",
            Heuristic::Cedf => "cedf",
            Heuristic::Eft => "eft",
            Heuristic::LargestFirst => "largest-first",
            Heuristic::SmallestFirst => "smallest-first",
            Heuristic::BestFit => "best-fit",
            Heuristic::Random => "random",
        }
    }

    /// A fresh instance (`seed` only matters for `random`).
    pub fn build(self, seed: u64) -> Box<dyn PlacementHeuristic + Send> {
        match self {
            Heuristic::Random => Box::new(RandomFit {
                rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5EED_0F9A_110C),
            }),
            h => Box::new(Rule(h)),
        }
    }
}

impl std::fmt::Display for Heuristic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Heuristic {
    type Err = UnknownHeuristic;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        Heuristic::ALL
            .into_iter()
            .find(|h| h.as_str() == norm)
            .ok_or_else(|| UnknownHeuristic(s.to_string()))
    }
}

/// Whether `cedf` treats the job as sub-linear (see the module docs).
pub fn is_sublinear(job: &Job, total_compute: u8) -> bool {
    job.speed(1, total_compute) * f64::from(total_compute) >= 1.5
}

/// Index of the minimum of `key` over the candidates (first on ties).
fn argmin<K: PartialOrd>(c: &[Candidate], key: impl Fn(&Candidate) -> K) -> usize {
    let mut best = 0;
    let mut best_key = key(&c[0]);
    for (i, cand) in c.iter().enumerate().skip(1) {
        let k = key(cand);
        if k < best_key {
            best = i;
            best_key = k;
        }
    }
    best
}

pub(crate) fn best_fit(job: &Job, c: &[Candidate]) -> usize {
    argmin(c, |x| (f64::from(x.memory_gb) - job.memory_gb, x.compute))
}

fn smallest(c: &[Candidate]) -> usize {
    argmin(c, |x| (x.compute, x.memory_gb))
}

fn fastest(job: &Job, c: &[Candidate]) -> usize {
    argmin(c, |x| {
        (
            -job.speed(x.compute, x.total_compute),
            x.compute,
            x.memory_gb,
        )
    })
}

/// The deterministic heuristics.
struct Rule(Heuristic);

impl PlacementHeuristic for Rule {
    fn name(&self) -> &'static str {
        self.0.as_str()
    }

    fn priority(&self, job: &Job) -> f64 {
        match self.0 {
            Heuristic::Edf | Heuristic::Cedf => job.deadline,
            _ => job.arrival,
        }
    }

    fn choose(&mut self, job: &Job, c: &[Candidate]) -> Pick {
        let candidate = match self.0 {
            Heuristic::Edf | Heuristic::BestFit => best_fit(job, c),
            Heuristic::Cedf => {
                if is_sublinear(job, c[0].total_compute) {
                    smallest(c)
                } else {
                    fastest(job, c)
                }
            }
            Heuristic::Eft => fastest(job, c),
            Heuristic::LargestFirst => argmin(c, |x| (u8::MAX - x.compute, u32::MAX - x.memory_gb)),
            Heuristic::SmallestFirst | Heuristic::Random => smallest(c),
        };
        Pick {
            candidate,
            gpu_hint: 0,
            defer: false,
        }
    }
}

/// Uniform over the free instances that fit, from a seeded stream.
struct RandomFit {
    rng: ChaCha8Rng,
}

impl PlacementHeuristic for RandomFit {
    fn name(&self) -> &'static str {
        "random"
    }

    fn priority(&self, job: &Job) -> f64 {
        job.arrival
    }

    fn choose(&mut self, _job: &Job, c: &[Candidate]) -> Pick {
        let total: u64 = c.iter().map(|x| u64::from(x.free)).sum();
        let mut r = self.rng.random_range(0..total.max(1));
        let mut candidate = c.len() - 1;
        for (i, x) in c.iter().enumerate() {
            if r < u64::from(x.free) {
                candidate = i;
                break;
            }
            r -= u64::from(x.free);
        }
        Pick {
            candidate,
            gpu_hint: self.rng.random(),
            defer: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{JobClass, SpeedupCurve};

    fn job(beta: f64, sat: f64, mem: f64) -> Job {
        Job {
            id: 0,
            arrival: 1.0,
            work: 100.0,
            speedup: SpeedupCurve::new(beta, sat).unwrap(),
            memory_gb: mem,
            deadline: 150.0,
            class: JobClass::Inference,
            requested_slices: None,
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        }
    }

    fn cands() -> Vec<Candidate> {
        // A100-40GB: 1g.5gb, 1g.10gb, 3g.20gb, 7g.40gb
        [(1, 5), (1, 10), (3, 20), (7, 40)]
            .iter()
            .enumerate()
            .map(|(i, &(compute, memory_gb))| Candidate {
                class: i as u16,
                model: GpuModel::A100_40gb,
                compute,
                total_compute: 7,
                memory_gb,
                profile_index: i as u8 + 1,
                free: 1,
            })
            .collect()
    }

    #[test]
    fn each_rule_picks_its_instance() {
        let c = cands();
        let lin = job(1.0, 1.0, 4.0);
        let sub = job(0.5, 0.4, 8.0);
        let pick = |h: Heuristic, j: &Job, c: &[Candidate]| h.build(0).choose(j, c).candidate;
        assert_eq!(pick(Heuristic::BestFit, &lin, &c), 0);
        assert_eq!(pick(Heuristic::Edf, &sub, &c[1..]), 0); // 1g.10gb: 2 GB slack
        assert_eq!(pick(Heuristic::LargestFirst, &lin, &c), 3);
        assert_eq!(pick(Heuristic::SmallestFirst, &lin, &c), 0);
        assert_eq!(pick(Heuristic::Eft, &lin, &c), 3);
        // Saturates at 0.4 of the GPU: 3g (0.43) is as fast as 7g, and smaller.
        assert_eq!(pick(Heuristic::Eft, &sub, &c), 2);
        assert!(is_sublinear(&sub, 7) && !is_sublinear(&lin, 7));
        assert_eq!(pick(Heuristic::Cedf, &sub, &c), 0);
        assert_eq!(pick(Heuristic::Cedf, &lin, &c), 3);
        assert!(pick(Heuristic::Random, &lin, &c) < 4);
        assert_eq!(Heuristic::build(Heuristic::Edf, 0).priority(&lin), 150.0);
        assert_eq!(Heuristic::build(Heuristic::Eft, 0).priority(&lin), 1.0);
    }

    #[test]
    fn names_round_trip() {
        for h in Heuristic::ALL {
            assert_eq!(h.as_str().parse::<Heuristic>().unwrap(), h);
        }
        assert!("fifo".parse::<Heuristic>().is_err());
    }
}
