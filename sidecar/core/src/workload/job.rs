//! The job model shared by the generator, the trace readers, the simulator and
//! the lower bounds.

use serde::{Deserialize, Serialize};

use super::{MemoryGrowth, SpeedupCurve, WorkloadError};
use crate::mig::{GpuModel, ProfileSpec};

/// Coarse job class. It selects the speed-up curve distribution when a curve
/// is not known (training ~ linear, inference ~ sub-linear) and lets policies
/// group jobs, as SMART-MIG groups EDF queues by speed-up class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobClass {
    Training,
    Inference,
}

impl JobClass {
    /// `training` / `inference`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobClass::Training => "training",
            JobClass::Inference => "inference",
        }
    }
}

impl std::fmt::Display for JobClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for JobClass {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "training" | "train" => Ok(JobClass::Training),
            "inference" | "infer" => Ok(JobClass::Inference),
            _ => Err(WorkloadError::invalid(
                "class",
                format!("{s:?} is not `training` or `inference`"),
            )),
        }
    }
}

/// One job: a single-GPU job (on one MIG instance), or a gang job that
/// needs `gpus` whole GPUs at once (`gpus > 1`).
///
/// All times are seconds; `arrival` and `deadline` are absolute on the
/// workload's clock (the first arrival of a trace is 0). `work` is the run
/// time on the whole GPU, so the run time on any slice follows from the
/// curve alone: `runtime_on(k, C) = work / speed(k, C)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Position of the job in its workload, sorted by arrival (ids are `0..n`).
    pub id: u64,
    /// Submit time, s since the start of the workload.
    pub arrival: f64,
    /// Seconds of run time on a whole GPU (7g; 4g on the A30).
    pub work: f64,
    /// Throughput on a slice relative to the whole GPU.
    pub speedup: SpeedupCurve,
    /// GPU memory need in GB (compared with the GB in profile names, `3g.20gb` = 20).
    pub memory_gb: f64,
    /// Absolute deadline, s; tardiness is `max(0, completion - deadline)`.
    pub deadline: f64,
    pub class: JobClass,
    /// `K` of `--gres=shard:K`, when the job asked for a size, already
    /// rounded up to a profile compute size of the workload's GPU model
    /// (Slurm semantics: 5 and 6 become 7). `None`: the scheduler chooses.
    pub requested_slices: Option<u8>,
    /// GPU memory the user *declared* (`--mig-mem`), GB, when it may differ
    /// from the true need `memory_gb` (which is then the peak the job will
    /// actually use). `None`: the declaration equals the true need (every
    /// producer's behaviour unless asked otherwise). `Some(0.0)`: nothing
    /// declared (the scheduler falls back to the smallest profile or a
    /// learned estimate). Only the simulator's out-of-memory mode reads it
    /// (`docs/oom-and-memory.md`).
    #[serde(default)]
    pub declared_memory_gb: Option<f64>,
    /// Synthetic identity of "the same script again" (a user and job name),
    /// the key of learned memory estimates. `None`: unknown (estimates then
    /// fall back to one key per class).
    #[serde(default)]
    pub template: Option<u32>,
    /// How the job's memory use rises to its peak `memory_gb` over its run
    /// ([`MemoryGrowth`]): where a run on too small an instance fails, and
    /// what an early-restart rule sees. `None`: nothing noticeable, then the
    /// peak at the simulator's `fail_fraction` of the run
    /// (`MemoryGrowth::step_at`, the model before growth existed), so
    /// workloads without it behave as before. Only the simulator's
    /// out-of-memory mode reads it (`docs/oom-and-memory.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_growth: Option<MemoryGrowth>,
    /// GPUs the job spans (`--gres=gpu:N`, Alibaba `num_gpu`). A job of
    /// more than one is a gang job: it runs on `gpus` whole-GPU instances
    /// at once (MIG instances cannot be joined by NVLink or NCCL, so a
    /// multi-GPU job needs every GPU it spans whole), all starting and
    /// ending together; `work` is its run time on them and `memory_gb` its
    /// need per GPU. 1 for every single-GPU job (the default of older
    /// files).
    #[serde(default = "one_gpu", skip_serializing_if = "is_one_gpu")]
    pub gpus: u32,
}

/// Serde default of [`Job::gpus`] (and of the event log's `gpus`).
pub(crate) fn one_gpu() -> u32 {
    1
}

/// Whether `gpus` is the default 1 (left out of files then).
#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
pub(crate) fn is_one_gpu(g: &u32) -> bool {
    *g == 1
}

impl Job {
    /// Relative throughput on a slice of `compute` of the GPU's
    /// `total_compute` slices (1.0 on the whole GPU).
    #[inline]
    pub fn speed(&self, compute: u8, total_compute: u8) -> f64 {
        self.speedup.speed(compute, total_compute)
    }

    /// Run time on a `compute`-slice instance: `work / speed` (infinite on 0 slices).
    #[inline]
    pub fn runtime_on(&self, compute: u8, total_compute: u8) -> f64 {
        self.work / self.speed(compute, total_compute)
    }

    /// GPU-seconds the job occupies on a `compute`-slice instance:
    /// `compute / total_compute * runtime_on`. The lower bounds and the
    /// offered-load statistics minimise this over the profiles that fit.
    #[inline]
    pub fn gpu_seconds_on(&self, compute: u8, total_compute: u8) -> f64 {
        f64::from(compute) / f64::from(total_compute.max(1))
            * self.runtime_on(compute, total_compute)
    }

    /// Whether the job is a gang job (more than one GPU, each whole).
    #[inline]
    pub fn is_gang(&self) -> bool {
        self.gpus > 1
    }

    /// Whether the job declared no memory need (`declared_memory_gb = Some(0.0)`).
    #[inline]
    pub fn declares_nothing(&self) -> bool {
        self.declared_memory_gb.is_some_and(|d| d <= 0.0)
    }

    /// Whether the job's memory need fits the profile.
    #[inline]
    pub fn fits(&self, profile: &ProfileSpec) -> bool {
        self.memory_gb <= f64::from(profile.memory_gb)
    }

    /// The profile of `model` that fits the job's memory and occupies the
    /// fewest GPU-seconds ([`Job::gpu_seconds_on`]); ties go to the larger
    /// (faster) profile. `None` if the job fits no profile. With a requested
    /// size, only profiles of at least that many compute slices count; a
    /// gang job has only the whole GPU, and its GPU-seconds are those of
    /// all the GPUs it spans.
    pub fn most_efficient_profile(&self, model: GpuModel) -> Option<(&'static ProfileSpec, f64)> {
        let spec = model.spec();
        if self.is_gang() {
            return spec
                .profiles
                .iter()
                .filter(|p| p.shape.compute == spec.compute_slices && self.fits(p))
                .max_by_key(|p| p.memory_gb)
                .map(|p| (p, self.work * f64::from(self.gpus)));
        }
        let min_k = self.requested_slices.unwrap_or(0);
        let mut best: Option<(&'static ProfileSpec, f64)> = None;
        for p in spec.profiles {
            if !self.fits(p) || p.shape.compute < min_k {
                continue;
            }
            let a = self.gpu_seconds_on(p.shape.compute, spec.compute_slices);
            match best {
                Some((_, ba)) if a > ba * (1.0 + 1e-12) => {}
                Some((bp, ba))
                    if a >= ba * (1.0 - 1e-12) && p.shape.compute <= bp.shape.compute => {}
                _ => best = Some((p, a)),
            }
        }
        best
    }

    /// Checks the invariants every producer guarantees: finite times,
    /// `work > 0`, `memory_gb > 0`, a valid curve, a requested size that is a
    /// compute size of `model`.
    pub fn validate(&self, model: GpuModel) -> Result<(), WorkloadError> {
        let finite = |field: &'static str, v: f64| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(WorkloadError::invalid(field, format!("{v} is not finite")))
            }
        };
        finite("arrival", self.arrival)?;
        finite("deadline", self.deadline)?;
        finite("work", self.work)?;
        if self.work <= 0.0 {
            return Err(WorkloadError::invalid(
                "work",
                format!("{} is not > 0", self.work),
            ));
        }
        if !(self.memory_gb.is_finite() && self.memory_gb > 0.0) {
            return Err(WorkloadError::invalid(
                "memory_gb",
                format!("{} is not > 0", self.memory_gb),
            ));
        }
        if let Some(d) = self.declared_memory_gb {
            if !(d.is_finite() && d >= 0.0) {
                return Err(WorkloadError::invalid(
                    "declared_memory_gb",
                    format!("{d} is not a finite value >= 0"),
                ));
            }
        }
        if let Some(g) = &self.memory_growth {
            g.validate()?;
        }
        self.speedup.validate()?;
        if self.gpus == 0 {
            return Err(WorkloadError::invalid("gpus", "0 is not >= 1"));
        }
        let whole = model.spec().compute_slices;
        if self.is_gang() && self.requested_slices.is_some_and(|k| k != whole) {
            return Err(WorkloadError::invalid(
                "requested_slices",
                format!(
                    "a job of {} GPUs runs on whole GPUs ({whole} slices of {model}), not on {} slices",
                    self.gpus,
                    self.requested_slices.unwrap_or(0)
                ),
            ));
        }
        if let Some(k) = self.requested_slices {
            if !model.spec().profiles.iter().any(|p| p.shape.compute == k) {
                return Err(WorkloadError::invalid(
                    "requested_slices",
                    format!("{k} is not a compute size of {model}"),
                ));
            }
        }
        Ok(())
    }
}

/// The smallest compute size of `model` that is at least `k` (Slurm's
/// `--gres=shard:K` rounds 5 and 6 up to 7). `None` if `k` exceeds the GPU.
pub fn round_up_to_profile(model: GpuModel, k: u8) -> Option<u8> {
    model
        .spec()
        .profiles
        .iter()
        .map(|p| p.shape.compute)
        .filter(|&c| c >= k.max(1))
        .min()
}

/// Memory of the smallest profile with exactly `compute` compute slices:
/// what a job asking `--gres=shard:K` without `--mig-mem` gets.
pub fn default_memory_gb(model: GpuModel, compute: u8) -> Option<u32> {
    model
        .spec()
        .profiles
        .iter()
        .filter(|p| p.shape.compute == compute)
        .map(|p| p.memory_gb)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(beta: f64, sat: f64, mem: f64) -> Job {
        Job {
            id: 0,
            arrival: 0.0,
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

    #[test]
    fn runtime_and_gpu_seconds() {
        let j = job(1.0, 1.0, 4.0);
        assert!((j.runtime_on(1, 7) - 700.0).abs() < 1e-9);
        assert_eq!(j.runtime_on(7, 7), 100.0);
        assert!((j.gpu_seconds_on(1, 7) - 100.0).abs() < 1e-9);
        assert!(j.runtime_on(0, 7).is_infinite());
    }

    #[test]
    fn most_efficient_profile_respects_memory_and_ties() {
        let m = GpuModel::A100_40gb;
        // Sub-linear: the smallest slice that fits is the most efficient.
        let (p, _) = job(0.5, 0.5, 4.0).most_efficient_profile(m).unwrap();
        assert_eq!(p.name(), "1g.5gb");
        let (p, _) = job(0.5, 0.5, 8.0).most_efficient_profile(m).unwrap();
        assert_eq!(p.name(), "1g.10gb");
        let (p, _) = job(0.5, 0.5, 15.0).most_efficient_profile(m).unwrap();
        assert_eq!(p.name(), "3g.20gb");
        // Linear: every slice costs the same GPU-seconds; the fastest wins the tie.
        let (p, a) = job(1.0, 1.0, 4.0).most_efficient_profile(m).unwrap();
        assert_eq!(p.name(), "7g.40gb");
        assert!((a - 100.0).abs() < 1e-9);
        assert!(job(1.0, 1.0, 41.0).most_efficient_profile(m).is_none());
        let mut r = job(0.5, 0.5, 4.0);
        r.requested_slices = Some(2);
        assert_eq!(r.most_efficient_profile(m).unwrap().0.name(), "2g.10gb");
    }

    #[test]
    fn rounding_follows_slurm_semantics() {
        let m = GpuModel::A100_40gb;
        assert_eq!(round_up_to_profile(m, 5), Some(7));
        assert_eq!(round_up_to_profile(m, 4), Some(4));
        assert_eq!(round_up_to_profile(m, 0), Some(1));
        assert_eq!(round_up_to_profile(m, 8), None);
        assert_eq!(round_up_to_profile(GpuModel::A30_24gb, 3), Some(4));
        assert_eq!(default_memory_gb(m, 1), Some(5));
        assert_eq!(default_memory_gb(m, 3), Some(20));
        assert_eq!(default_memory_gb(m, 5), None);
    }

    #[test]
    fn validation() {
        let m = GpuModel::A100_40gb;
        assert!(job(1.0, 1.0, 4.0).validate(m).is_ok());
        let mut j = job(1.0, 1.0, 4.0);
        j.requested_slices = Some(5);
        assert!(j.validate(m).is_err());
        j.requested_slices = None;
        j.work = 0.0;
        assert!(j.validate(m).is_err());
        assert_eq!("Training".parse::<JobClass>().unwrap(), JobClass::Training);
        assert!("gpu".parse::<JobClass>().is_err());
        assert_eq!(
            serde_json::to_string(&JobClass::Inference).unwrap(),
            "\"inference\""
        );
    }
}
