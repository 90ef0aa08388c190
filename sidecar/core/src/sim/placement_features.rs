//! The observation of a learned placement: one row of numbers per decision
//! ("which free instance does this job get?"), and the action mask.
//!
//! Pure code shared by the simulator's [`super::placement_onnx`] runner and
//! the trainer (crate `smartmig-learn`), so a decision measured in training
//! is the decision the simulator makes. The action space is the profile list
//! of one GPU model (`model.spec().profiles`, 6 on the A100/H100/H200
//! family) and one more, *defer*: action `p < P` means "a free instance of
//! profile `p`", allowed when the engine offers one that fits the job;
//! action `P` lets the jobs behind this one go first in this placement
//! round ([`crate::sim::Pick::defer`]), allowed when the engine honours it
//! and another job waits ([`PlacementFeatures::encode`]). Deferring a job
//! that will be late anyway is how a placement trades one late job for
//! several on time; earliest-deadline-first cannot.
//!
//! Row layout (version [`PLACEMENT_SPEC_VERSION`]), every value roughly in
//! [-1, 1]: first [`GLOBAL_FEATURES`] numbers about the job and the
//! cluster, then [`PROFILE_FEATURES`] per profile:
//!
//! | global | meaning |
//! |---|---|
//! | queue | `ln(1 + waiting / GPUs)` / 3 |
//! | load | busy compute slices / all compute slices |
//! | free | compute slices of the free instances that fit the job / all |
//! | urgency | share of waiting jobs whose deadline is less than 1.5x their whole-GPU run time away |
//! | work | `ln(work s) / 10` |
//! | memory | job memory / the GPU's memory |
//! | slack | (deadline - now) / work, clipped to [-4, 4], / 4 |
//! | rank | share of waiting jobs with an earlier deadline |
//! | one-slice speed | speed on one compute slice (1 = whole-GPU speed) |
//! | rescue | 1 if deferring would save another job cheaply, as the `rescue` rule's defaults judge it ([`super::deferral::Rescue::possible`]) |
//! | overdue | (now - deadline) / work, clipped to [0, 8], / 8 |
//! | may defer | 1 if the defer action is allowed |
//!
//! | per profile | meaning |
//! |---|---|
//! | allowed | 1 if a free instance of it fits the job |
//! | free | free instances of it that fit / GPUs, capped at 1 |
//! | size | compute slices / the GPU's |
//! | speed | the job's speed on it (1 = whole GPU) |
//! | finish slack | (deadline - finish if started on it now) / work, clipped to [-2, 4], / 4 |
//! | late | 1 if the job would finish after its deadline on it |
//! | demand | `ln(1 + waiting jobs whose smallest fit is this profile / GPUs)` |
//! | memory slack | (profile memory - job memory) / the GPU's memory, 0 if it does not fit |

use crate::mig::GpuModel;
use crate::workload::Job;

use super::deferral::{shortest_run_s, Rescue};
use super::heuristics::{Candidate, PlacementContext};

/// Version of the row layout above; a policy file trained with another
/// version is refused.
pub const PLACEMENT_SPEC_VERSION: u32 = 2;
/// Numbers about the job and the cluster, at the start of the row.
pub const GLOBAL_FEATURES: usize = 12;
/// Numbers per profile.
pub const PROFILE_FEATURES: usize = 8;

/// The observation and action space of a learned placement on one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementFeatures {
    pub model: GpuModel,
    /// Profiles of the model, then defer: the actions.
    pub actions: usize,
    /// Numbers per row.
    pub obs_dim: usize,
}

impl PlacementFeatures {
    pub fn new(model: GpuModel) -> Self {
        let profiles = model.spec().profiles.len();
        PlacementFeatures {
            model,
            actions: profiles + 1,
            obs_dim: GLOBAL_FEATURES + PROFILE_FEATURES * profiles,
        }
    }

    /// The action space as stored in a policy's metadata: profile names,
    /// then `defer`.
    pub fn action_names(&self) -> Vec<String> {
        self.model
            .spec()
            .profiles
            .iter()
            .map(crate::mig::ProfileSpec::name)
            .chain(std::iter::once("defer".to_string()))
            .collect()
    }

    /// The defer action.
    pub fn defer_action(&self) -> usize {
        self.actions - 1
    }

    /// Writes one row into `obs` (`obs_dim` numbers) and `mask` (`actions`
    /// numbers, 1 = allowed), replacing their contents. Returns false when
    /// no candidate is of this model (nothing for the network to choose;
    /// the row is still written, with an all-zero mask).
    pub fn encode(
        &self,
        job: &Job,
        candidates: &[Candidate],
        ctx: &PlacementContext<'_>,
        obs: &mut Vec<f32>,
        mask: &mut Vec<f32>,
    ) -> bool {
        obs.clear();
        mask.clear();
        mask.resize(self.actions, 0.0);
        let spec = self.model.spec();
        let total = spec.compute_slices;
        let gpu_mem = f64::from(spec.profiles.last().map_or(1, |p| p.memory_gb)).max(1.0);
        let gpus = ctx.gpus.max(1) as f64;
        let profiles = self.defer_action();
        let mut free = vec![0u32; profiles];
        let mut free_compute = 0u32;
        for c in candidates.iter().filter(|c| c.model == self.model) {
            let p = usize::from(c.profile_index);
            if p < profiles {
                mask[p] = 1.0;
                free[p] += c.free;
                free_compute += c.free * u32::from(c.compute);
            }
        }
        let now = ctx.now;
        let work = job.work.max(1e-9);
        let waiting = ctx.waiting.len().max(1) as f64;
        let urgent = ctx
            .waiting
            .iter()
            .filter(|w| w.deadline - now < 1.5 * w.work)
            .count() as f64;
        let earlier = ctx
            .waiting
            .iter()
            .filter(|w| w.deadline < job.deadline)
            .count() as f64;
        let total_compute = f64::from(ctx.total_compute.max(1));
        let f = |x: f64| x as f32;
        obs.extend_from_slice(&[
            f((ctx.waiting.len() as f64 / gpus).ln_1p() / 3.0),
            f(f64::from(ctx.busy_compute) / total_compute),
            f(f64::from(free_compute) / total_compute),
            f(urgent / waiting),
            f(work.ln() / 10.0),
            f(job.memory_gb / gpu_mem),
            f(((job.deadline - now) / work).clamp(-4.0, 4.0) / 4.0),
            f(earlier / waiting),
            f(job.speed(1, total)),
            if Rescue::DEFAULT.possible(job.id, shortest_run_s(job, candidates), candidates, ctx) {
                1.0
            } else {
                0.0
            },
            f(((now - job.deadline) / work).clamp(0.0, 8.0) / 8.0),
            if ctx.may_defer && ctx.waiting.len() > 1 {
                1.0
            } else {
                0.0
            },
        ]);
        let demand = &ctx.pending_by_profile[self.model as usize];
        for (p, profile) in spec.profiles.iter().enumerate() {
            let compute = profile.shape.compute;
            let speed = job.speed(compute, total);
            let finish = now + work / speed.max(1e-9);
            let fits = f64::from(profile.memory_gb) >= job.memory_gb;
            obs.extend_from_slice(&[
                mask[p],
                f((f64::from(free[p]) / gpus).min(1.0)),
                f(f64::from(compute) / f64::from(total)),
                f(speed),
                f(((job.deadline - finish) / work).clamp(-2.0, 4.0) / 4.0),
                if finish > job.deadline { 1.0 } else { 0.0 },
                f((f64::from(demand.get(p).copied().unwrap_or(0)) / gpus).ln_1p()),
                if fits {
                    f((f64::from(profile.memory_gb) - job.memory_gb) / gpu_mem)
                } else {
                    0.0
                },
            ]);
        }
        let any = mask.iter().any(|&m| m > 0.5);
        mask[profiles] = obs[GLOBAL_FEATURES - 1];
        any
    }

    /// The candidate an action stands for: the one of this model and
    /// profile, if offered (`None` for defer).
    pub fn candidate_of(&self, candidates: &[Candidate], action: usize) -> Option<usize> {
        candidates
            .iter()
            .position(|c| c.model == self.model && usize::from(c.profile_index) == action)
    }

    /// The action a candidate stands for (`None`: another model).
    pub fn action_of(&self, candidate: &Candidate) -> Option<usize> {
        (candidate.model == self.model).then_some(usize::from(candidate.profile_index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{PendingByProfile, PendingJob};
    use crate::workload::{JobClass, SpeedupCurve};

    const M: GpuModel = GpuModel::A100_40gb;

    fn job(work: f64, deadline: f64, mem: f64) -> Job {
        Job {
            id: 7,
            arrival: 0.0,
            work,
            speedup: SpeedupCurve::new(1.0, 1.0).unwrap(),
            memory_gb: mem,
            deadline,
            class: JobClass::Training,
            requested_slices: None,
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        }
    }

    fn cand(profile_index: u8, free: u32) -> Candidate {
        let p = &M.spec().profiles[usize::from(profile_index)];
        Candidate {
            class: u16::from(profile_index),
            model: M,
            compute: p.shape.compute,
            total_compute: 7,
            memory_gb: p.memory_gb,
            profile_index,
            free,
        }
    }

    /// The row has the documented width, the mask marks exactly the
    /// offered profiles, and the per-profile "late" flag says on which
    /// instance a linear job of 700 s with a 300 s deadline would be late
    /// (3g: 700 / (3/7) = 1633 s; 7g: 700 s: late on both).
    #[test]
    fn rows_have_the_spec_width_and_mark_the_offered_profiles() {
        let spec = PlacementFeatures::new(M);
        assert_eq!(spec.actions, 7);
        assert_eq!(spec.obs_dim, 12 + 8 * 6);
        let j = job(700.0, 1000.0, 15.0);
        let waiting = [PendingJob {
            id: 7,
            arrival: 0.0,
            deadline: 1000.0,
            work: 700.0,
            memory_gb: 15.0,
            min_compute: 1,
            speedup: j.speedup,
            shapes: Default::default(),
        }];
        let demand = PendingByProfile::default();
        let mut ctx = PlacementContext {
            now: 0.0,
            gpus: 2,
            total_compute: 14,
            busy_compute: 7,
            waiting: &waiting,
            pending_by_profile: &demand,
            may_defer: true,
        };
        let (mut obs, mut mask) = (Vec::new(), Vec::new());
        let cands = [cand(3, 1), cand(5, 1)];
        assert!(spec.encode(&j, &cands, &ctx, &mut obs, &mut mask));
        assert_eq!(obs.len(), spec.obs_dim);
        // Defer is not offered: no other job waits.
        assert_eq!(mask, [0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
        assert!((obs[1] - 0.5).abs() < 1e-6, "load");
        assert!((obs[2] - 10.0 / 14.0).abs() < 1e-6, "free: 3 + 7 of 14");
        let late = |p: usize| obs[GLOBAL_FEATURES + PROFILE_FEATURES * p + 5];
        // 3g: finishes at 1633 s > 1000 s; 7g: at 700 s.
        assert_eq!((late(3), late(5)), (1.0, 0.0));
        assert_eq!(spec.candidate_of(&cands, 5), Some(1));
        assert_eq!(spec.candidate_of(&cands, 0), None);
        assert_eq!(spec.action_of(&cands[0]), Some(3));
        // No candidate of this model: nothing to choose.
        let other = Candidate {
            model: GpuModel::A30_24gb,
            ..cand(0, 1)
        };
        assert!(!spec.encode(&j, &[other], &ctx, &mut obs, &mut mask));
        assert_eq!(mask, [0.0; 7]);
        assert_eq!(spec.action_of(&other), None);
        assert_eq!(spec.action_names()[5], "7g.40gb");
        assert_eq!(spec.action_names()[6], "defer");
        // Another job waits: defer is offered, unless the engine is in
        // its second pass.
        let two = [waiting[0], waiting[0]];
        ctx.waiting = &two;
        spec.encode(&j, &cands, &ctx, &mut obs, &mut mask);
        assert_eq!(mask[6], 1.0);
        ctx.may_defer = false;
        spec.encode(&j, &cands, &ctx, &mut obs, &mut mask);
        assert_eq!(mask[6], 0.0);
        assert_eq!(spec.candidate_of(&cands, 6), None);
    }
}
