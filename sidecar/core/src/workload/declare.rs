//! What users *declare* about GPU memory, as opposed to what jobs need.
//!
//! Every producer sets `Job::memory_gb` to the true need and leaves
//! `declared_memory_gb = None` (declaration = need). These pure transforms
//! turn a workload into one where some users under-declare or declare
//! nothing, for the simulator's out-of-memory mode
//! (`docs/oom-and-memory.md`). They work on any workload (diurnal or trace),
//! draw from a `ChaCha8Rng` per job (seeded by `seed` and the job id, so a
//! job's draws do not depend on the others) and leave every other field
//! alone, so a run with and without them differs only in memory.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Job, JobClass, WorkloadError};
use crate::mig::GpuModel;

/// Salts of the per-job streams, so the transforms draw independently.
const SALT_TEMPLATE: u64 = 0x7E3A_11CE_0001;
const SALT_DECLARE: u64 = 0x7E3A_11CE_0002;
const SALT_NEED: u64 = 0x7E3A_11CE_0003;

fn job_rng(seed: u64, salt: u64, id: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ salt);
    rng.set_stream(id);
    rng
}

/// Shares of users who do not declare their true need.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Underdeclare {
    /// Share of jobs that declare the memory of the smallest profile
    /// (what `--gres=shard:1` without `--mig-mem` gets), whatever they need.
    pub small_share: f64,
    /// Share of jobs that declare nothing (`declared_memory_gb = Some(0.0)`).
    pub none_share: f64,
}

impl Underdeclare {
    /// Both shares in [0, 1] and their sum at most 1.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let ok = |v: f64| (0.0..=1.0).contains(&v);
        if !ok(self.small_share) || !ok(self.none_share) || self.small_share + self.none_share > 1.0
        {
            return Err(WorkloadError::invalid(
                "underdeclare",
                format!(
                    "shares {} and {} must be in [0, 1] and add up to at most 1",
                    self.small_share, self.none_share
                ),
            ));
        }
        Ok(())
    }
}

/// Sets `declared_memory_gb`: with probability `small_share` the smallest
/// profile memory of `model`, with `none_share` nothing (`Some(0.0)`),
/// otherwise unchanged.
pub fn underdeclare(jobs: &mut [Job], model: GpuModel, u: &Underdeclare, seed: u64) {
    let smallest = model
        .spec()
        .profiles
        .iter()
        .map(|p| p.memory_gb)
        .min()
        .map_or(0.0, f64::from);
    for j in jobs.iter_mut() {
        let x: f64 = job_rng(seed, SALT_DECLARE, j.id).random();
        if x < u.small_share {
            j.declared_memory_gb = Some(smallest);
        } else if x < u.small_share + u.none_share {
            j.declared_memory_gb = Some(0.0);
        }
    }
}

/// Groups jobs into `per_class` templates per class ("the same script
/// resubmitted": `Job::template`, ids `0..per_class` for training and
/// `per_class..2 per_class` for inference) and makes their memory needs
/// alike: the first job of a template (in arrival order) fixes its base,
/// the need of each of its jobs is `base * U(1 - jitter, 1)`. The
/// generator's memory draws are independent per job, which would leave a
/// learner nothing to learn; real resubmissions reuse a model and batch size
/// and peak within a few percent of each other. Does nothing if `per_class`
/// is 0. `jitter` is clamped to [0, 1).
pub fn assign_templates(jobs: &mut [Job], per_class: u32, jitter: f64, seed: u64) {
    if per_class == 0 {
        return;
    }
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 0.999)
    } else {
        0.0
    };
    let mut base: HashMap<u32, f64> = HashMap::new();
    for j in jobs.iter_mut() {
        let mut rng = job_rng(seed, SALT_TEMPLATE, j.id);
        let offset = match j.class {
            JobClass::Training => 0,
            JobClass::Inference => per_class,
        };
        let t = offset + rng.random_range(0..per_class);
        let b = *base.entry(t).or_insert(j.memory_gb);
        let f = 1.0 - jitter * rng.random::<f64>();
        j.memory_gb = b * f;
        j.template = Some(t);
    }
}

/// For traces whose memory is a derived guess (Alibaba: the `gpu_milli`
/// share of the GPU's memory): the guess becomes the declaration and the
/// true need is `guess * U(lo, hi)`, capped to `model`'s memory. Jobs with
/// the same class and guess share a template (the trace has no user or job
/// name; pods asking the same share are the closest thing). `lo <= hi`,
/// both > 0 (not checked here: see [`check_spread`]).
pub fn sample_true_needs(jobs: &mut [Job], model: GpuModel, (lo, hi): (f64, f64), seed: u64) {
    let cap = f64::from(model.spec().memory_gb);
    let mut ids: HashMap<(JobClass, u64), u32> = HashMap::new();
    for j in jobs.iter_mut() {
        let guess = j.memory_gb;
        let n = ids.len() as u32;
        j.template = Some(*ids.entry((j.class, guess.to_bits())).or_insert(n));
        let f = lo + (hi - lo) * job_rng(seed, SALT_NEED, j.id).random::<f64>();
        j.declared_memory_gb = Some(guess);
        j.memory_gb = (guess * f).min(cap);
    }
}

/// Validates a `(lo, hi)` spread of [`sample_true_needs`].
pub fn check_spread((lo, hi): (f64, f64)) -> Result<(), WorkloadError> {
    if lo.is_finite() && hi.is_finite() && lo > 0.0 && lo <= hi {
        Ok(())
    } else {
        Err(WorkloadError::invalid(
            "memory_spread",
            format!("({lo}, {hi}) must be finite with 0 < low <= high"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{generate_diurnal, DiurnalConfig};

    const M: GpuModel = GpuModel::A100_40gb;

    #[test]
    fn shares_and_determinism() {
        let base = generate_diurnal(&DiurnalConfig::default(), M, 32, 3);
        let mut a = base.clone();
        let u = Underdeclare {
            small_share: 0.2,
            none_share: 0.3,
        };
        u.validate().unwrap();
        underdeclare(&mut a, M, &u, 9);
        let mut b = base.clone();
        underdeclare(&mut b, M, &u, 9);
        assert_eq!(a, b);
        let n = a.len() as f64;
        let small = a
            .iter()
            .filter(|j| j.declared_memory_gb == Some(5.0))
            .count() as f64;
        let none = a.iter().filter(|j| j.declares_nothing()).count() as f64;
        assert!((small / n - 0.2).abs() < 0.03, "{}", small / n);
        assert!((none / n - 0.3).abs() < 0.03, "{}", none / n);
        // Nothing else changed.
        for (x, y) in a.iter().zip(&base) {
            assert_eq!(x.memory_gb, y.memory_gb);
            assert_eq!(x.work, y.work);
            x.validate(M).unwrap();
        }
        assert!(Underdeclare {
            small_share: 0.7,
            none_share: 0.4
        }
        .validate()
        .is_err());
    }

    #[test]
    fn templates_make_needs_alike() {
        let mut jobs = generate_diurnal(&DiurnalConfig::default(), M, 32, 3);
        assign_templates(&mut jobs, 20, 0.1, 1);
        let mut lo: HashMap<u32, f64> = HashMap::new();
        let mut hi: HashMap<u32, f64> = HashMap::new();
        for j in &jobs {
            let t = j.template.unwrap();
            assert!(t < 40);
            assert_eq!(t < 20, j.class == JobClass::Training);
            let l = lo.entry(t).or_insert(f64::MAX);
            *l = l.min(j.memory_gb);
            let h = hi.entry(t).or_insert(0.0);
            *h = h.max(j.memory_gb);
            j.validate(M).unwrap();
        }
        for (t, h) in hi {
            assert!(lo[&t] >= 0.9 * h - 1e-9, "template {t}");
        }
    }

    #[test]
    fn true_needs_around_the_guess() {
        let mut jobs = generate_diurnal(&DiurnalConfig::default(), M, 8, 3);
        let guesses: Vec<f64> = jobs.iter().map(|j| j.memory_gb).collect();
        check_spread((0.5, 1.5)).unwrap();
        assert!(check_spread((1.5, 0.5)).is_err());
        sample_true_needs(&mut jobs, M, (0.5, 1.5), 2);
        for (j, g) in jobs.iter().zip(guesses) {
            assert_eq!(j.declared_memory_gb, Some(g));
            assert!(j.memory_gb >= 0.5 * g - 1e-9 && j.memory_gb <= (1.5 * g).min(40.0) + 1e-9);
        }
    }
}
