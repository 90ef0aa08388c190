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

use super::{GrowthShape, Job, JobClass, MemoryGrowth, WorkloadError};
use crate::mig::GpuModel;

/// Salts of the per-job streams, so the transforms draw independently.
const SALT_TEMPLATE: u64 = 0x7E3A_11CE_0001;
const SALT_DECLARE: u64 = 0x7E3A_11CE_0002;
const SALT_NEED: u64 = 0x7E3A_11CE_0003;
const SALT_GROWTH_SHAPE: u64 = 0x7E3A_11CE_0004;
const SALT_GROWTH: u64 = 0x7E3A_11CE_0005;

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

/// A family of memory-growth curves ([`MemoryGrowth`]) to draw jobs'
/// curves from: a share per shape, and uniform ranges for the base (use at
/// the start, as a share of the peak) and the ramp (share of the run by
/// which the peak is reached).
///
/// **The default family ([`GrowthMix::mixed`]) is an assumption**, not a
/// measurement: no public trace we have records memory over a job's run.
/// It is built from how deep-learning jobs take memory:
///
/// - `step` 25 %: most memory taken at once (the first forward/backward
///   pass of a training step, a model load) and held; no warning before an
///   out-of-memory failure;
/// - `concave` 35 %: most memory early, then a slow tail (the caching
///   allocator's fragmentation, growing optimizer state, the first
///   evaluation); the commonest profile in practice;
/// - `linear` 20 %: a cache or buffer that grows with the work done
///   (KV caches of a serving job, a replay buffer);
/// - `convex` 20 %: slow then fast (a sequence length or batch size that
///   grows, curriculum learning);
/// - base U(0.2, 0.6): the CUDA context (~0.3-0.5 GB) plus weights (and
///   optimizer state) before the first batch;
/// - ramp U(0.1, 0.5): the peak is reached in the first half of the run;
///   the mean 0.3 matches the `fail_fraction` of the step-only model, so a
///   step job fails where it did before growth was modelled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GrowthMix {
    /// Share of each shape, in [`GrowthShape::ALL`] order (step, linear,
    /// concave, convex); each in [0, 1], summing to 1.
    pub shares: [f64; 4],
    /// Range of `MemoryGrowth::base`, within [0, 1].
    pub base: (f64, f64),
    /// Range of `MemoryGrowth::ramp`, within (0, 1].
    pub ramp: (f64, f64),
}

impl GrowthMix {
    /// Default base range (see the type's docs).
    pub const BASE: (f64, f64) = (0.2, 0.6);
    /// Default ramp range.
    pub const RAMP: (f64, f64) = (0.1, 0.5);

    /// The documented default family (`--memory-growth mixed`).
    pub fn mixed() -> GrowthMix {
        GrowthMix {
            shares: [0.25, 0.20, 0.35, 0.20],
            base: Self::BASE,
            ramp: Self::RAMP,
        }
    }

    /// Every job of one shape, with the default base and ramp ranges.
    pub fn only(shape: GrowthShape) -> GrowthMix {
        let mut shares = [0.0; 4];
        let i = GrowthShape::ALL
            .iter()
            .position(|&g| g == shape)
            .unwrap_or(0);
        shares[i] = 1.0;
        GrowthMix {
            shares,
            base: Self::BASE,
            ramp: Self::RAMP,
        }
    }

    /// `mixed` or a shape name (`step`, `linear`, `concave`, `convex`).
    pub fn named(name: &str) -> Result<GrowthMix, WorkloadError> {
        let name = name.trim().to_ascii_lowercase();
        if name == "mixed" {
            return Ok(GrowthMix::mixed());
        }
        name.parse::<GrowthShape>()
            .map(GrowthMix::only)
            .map_err(|_| {
                WorkloadError::invalid(
                    "memory growth",
                    format!("`{name}` (expected mixed, step, linear, concave or convex)"),
                )
            })
    }

    pub fn validate(&self) -> Result<(), WorkloadError> {
        let sum: f64 = self.shares.iter().sum();
        if self.shares.iter().any(|s| !(s.is_finite() && *s >= 0.0)) || (sum - 1.0).abs() > 1e-9 {
            return Err(WorkloadError::invalid(
                "memory growth shares",
                format!("{:?} must be >= 0 and add up to 1", self.shares),
            ));
        }
        let (b0, b1) = self.base;
        if !(b0.is_finite() && b1.is_finite() && 0.0 <= b0 && b0 <= b1 && b1 <= 1.0) {
            return Err(WorkloadError::invalid(
                "memory growth base",
                format!("range ({b0}, {b1}) must satisfy 0 <= low <= high <= 1"),
            ));
        }
        let (r0, r1) = self.ramp;
        if !(r0.is_finite() && r1.is_finite() && 0.0 < r0 && r0 <= r1 && r1 <= 1.0) {
            return Err(WorkloadError::invalid(
                "memory growth ramp",
                format!("range ({r0}, {r1}) must satisfy 0 < low <= high <= 1"),
            ));
        }
        Ok(())
    }

    fn shape_at(&self, x: f64) -> GrowthShape {
        let mut acc = 0.0;
        for (shape, share) in GrowthShape::ALL.into_iter().zip(self.shares) {
            acc += share;
            if x < acc {
                return shape;
            }
        }
        // Rounding left a sliver above the last share: the last shape with
        // a share.
        GrowthShape::ALL
            .into_iter()
            .zip(self.shares)
            .rev()
            .find(|&(_, s)| s > 0.0)
            .map_or(GrowthShape::Step, |(g, _)| g)
    }
}

/// Sets every job's `memory_growth` from `mix` (valid: see
/// [`GrowthMix::validate`]). The shape is drawn once per template (a
/// resubmitted script grows alike; per job when it has none), the base and
/// ramp per job. Only the memory curve changes, not the peak.
pub fn assign_growth(jobs: &mut [Job], mix: &GrowthMix, seed: u64) {
    for j in jobs.iter_mut() {
        let x: f64 = match j.template {
            Some(t) => job_rng(seed, SALT_GROWTH_SHAPE, u64::from(t)).random(),
            None => job_rng(seed, SALT_GROWTH_SHAPE ^ SALT_GROWTH, j.id).random(),
        };
        let mut rng = job_rng(seed, SALT_GROWTH, j.id);
        let (b0, b1) = mix.base;
        let (r0, r1) = mix.ramp;
        let base = b0 + (b1 - b0) * rng.random::<f64>();
        let ramp = (r0 + (r1 - r0) * rng.random::<f64>()).clamp(f64::MIN_POSITIVE, 1.0);
        j.memory_growth = Some(MemoryGrowth {
            shape: mix.shape_at(x),
            base,
            ramp,
        });
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
    fn growth_is_drawn_per_template_and_deterministic() {
        let mut jobs = generate_diurnal(&DiurnalConfig::default(), M, 32, 3);
        assign_templates(&mut jobs, 20, 0.1, 1);
        let peaks: Vec<f64> = jobs.iter().map(|j| j.memory_gb).collect();
        let mix = GrowthMix::mixed();
        mix.validate().unwrap();
        let mut again = jobs.clone();
        assign_growth(&mut jobs, &mix, 4);
        assign_growth(&mut again, &mix, 4);
        assert_eq!(jobs, again);
        let mut shape_of: HashMap<u32, GrowthShape> = HashMap::new();
        let mut count = [0usize; 4];
        for (j, p) in jobs.iter().zip(&peaks) {
            let g = j.memory_growth.unwrap();
            g.validate().unwrap();
            assert!(
                (0.2..=0.6).contains(&g.base) && (0.1..=0.5).contains(&g.ramp),
                "{g:?}"
            );
            assert_eq!(j.memory_gb, *p, "the peak is left alone");
            let s = *shape_of.entry(j.template.unwrap()).or_insert(g.shape);
            assert_eq!(s, g.shape, "one shape per template");
            j.validate(M).unwrap();
        }
        for s in shape_of.values() {
            count[GrowthShape::ALL.iter().position(|g| g == s).unwrap()] += 1;
        }
        assert!(count.iter().all(|&c| c > 0), "every shape drawn: {count:?}");
        // Without templates, the shares hold per job.
        let mut free = generate_diurnal(&DiurnalConfig::default(), M, 32, 3);
        assign_growth(&mut free, &mix, 4);
        let n = free.len() as f64;
        for (k, shape) in GrowthShape::ALL.into_iter().enumerate() {
            let c = free
                .iter()
                .filter(|j| j.memory_growth.unwrap().shape == shape)
                .count();
            assert!((c as f64 / n - mix.shares[k]).abs() < 0.03, "{shape}: {c}");
        }
        let only = GrowthMix::named("convex").unwrap();
        assign_growth(&mut free, &only, 4);
        assert!(free
            .iter()
            .all(|j| j.memory_growth.unwrap().shape == GrowthShape::Convex));
        let e = GrowthMix::named("sawtooth").unwrap_err().to_string();
        assert!(e.contains("sawtooth") && e.contains("mixed"), "{e}");
        let bad = GrowthMix {
            shares: [0.5, 0.5, 0.5, 0.0],
            ..GrowthMix::mixed()
        };
        assert!(bad.validate().is_err());
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
