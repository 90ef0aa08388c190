//! The observation encoding of the learned policy: pure, versioned, shared by
//! the trainer (candle) and the runtime policy (ONNX Runtime).
//!
//! The policy is *mean-field multi-agent*: every GPU of one model is an agent
//! with the same parameters; an agent sees its own GPU, a summary of the
//! queue, the time of day and the *mean field* (the distribution of layouts
//! over the GPUs of its model and the cluster-wide demand and supply). The
//! vector has a fixed size per GPU model ([`FeatureSpec::obs_dim`]), so the
//! cost of a decision per GPU does not grow with the number of GPUs or jobs
//! (the queue is read once per epoch, not once per GPU).
//!
//! Any change to what a slot means must bump [`FEATURE_SPEC_VERSION`]:
//! a shipped `.onnx` records the version it was trained with and
//! [`super::onnx::load_policy`] refuses a mismatch.
//!
//! ## Version 1 layout (per GPU; `C` catalog layouts, `N` placements, `P` profiles)
//!
//! | slots | meaning |
//! |---|---|
//! | `C + 1` | current layout, one-hot over the catalog; last slot: not a catalog layout |
//! | `3 N` | per placement: exists, busy, remaining run time `1 - exp(-r / 1800 s)` |
//! | 3 | in reconfiguration; busy compute / total; compute not in any instance / total |
//! | `2 P` | local supply per profile: idle ready instances, busy instances (count / 4) |
//! | `4 P` | cluster demand per profile (smallest fitting shape), per GPU of the model, squashed `x / (1 + x)`: waiting jobs, waiting jobs at risk (late even if started now on that shape), idle ready instances, uncovered demand `max(0, waiting - idle)` |
//! | `C + 1` | mean field: share of the model's GPUs in each catalog layout (+ other) |
//! | 2 | mean field: mean busy compute share; share of GPUs in reconfiguration |
//! | 2 | time of day: `sin`, `cos` of `2 pi h / 24` |
//! | 2 | rank of this GPU among its model's GPUs, and among those that are entirely idle (quantiles in [0, 1]); lets identical agents break symmetry the way the engine packs jobs (lowest GPU first) |
//! | 2 | all waiting jobs per GPU, squashed; their mean overdue time `1 - exp(-o / 3600 s)` |
//!
//! ## Version 2 adds (the workload's mix, from [`ClusterView::arrivals`])
//!
//! | slots | meaning |
//! |---|---|
//! | `3 P` | per profile (the arrivals' smallest fitting profile): arrivals in the last hour and in the last 3 hours per GPU of the model, squashed; the compute they need over the last 3 hours as a share of the model's compute, `sum(runtime on the profile x compute / C) / (3 h x GPUs)`, clipped to 4 |
//! | 2 | all arrivals in the last hour and the last 3 hours per GPU, squashed |
//!
//! The arrivals are remembered by the encoder (it keeps 3 hours of them),
//! so one encoder follows one cluster over time.
//!
//! ## Actions
//!
//! `C + 1` actions: catalog layout `a` for `a < C` is the GPU's *target*,
//! and `C` = keep the current layout. A target is pursued as far as the
//! busy instances allow ([`super::step_toward`]): the GPU keeps its busy
//! instances, builds what fits of the target next to them and keeps the
//! idle instances in nobody's way, so a GPU that keeps the same target
//! gets there as its jobs end. The mask ([`Encoder::encode`]) allows every
//! catalog layout unless the GPU is being reconfigured; "keep" is always
//! allowed, so the mask is never empty. (Version 1 allowed only layouts
//! the GPU accepted at once.)

use std::f64::consts::PI;

use super::{ClusterView, Decision, GpuStatus};
use crate::mig::{Geometry, GpuModel, Layout};

/// Version of the observation layout above. Bump on any change of meaning.
pub const FEATURE_SPEC_VERSION: u32 = 2;

/// The versions this build can still run: version 1 files (the shipped
/// v2 policies, trained before the arrival mix) keep their observation
/// (without the version 2 slots), their mask (only the layouts the GPU
/// accepts at once) and their decoding (a move straight to the layout).
pub const SUPPORTED_FEATURE_SPECS: [u32; 2] = [1, FEATURE_SPEC_VERSION];

/// Time constant of the remaining-run-time feature, s.
const REMAINING_SCALE_S: f64 = 1800.0;
/// Time constant of the overdue feature, s.
const OVERDUE_SCALE_S: f64 = 3600.0;
/// The short and the long window of the arrival features, s.
const ARRIVALS_SHORT_S: f64 = 3600.0;
const ARRIVALS_LONG_S: f64 = 3.0 * 3600.0;
/// Cap of the arrivals' compute-share feature.
const DEMAND_SHARE_CAP: f64 = 4.0;

/// Sizes of the observation and action spaces of one GPU model.
#[derive(Clone, Copy, Debug)]
pub struct FeatureSpec {
    pub model: GpuModel,
    /// Feature spec version (one of [`SUPPORTED_FEATURE_SPECS`]).
    pub version: u32,
    pub geometry: &'static Geometry,
    /// The action space: catalog layouts, then "keep".
    pub catalog: &'static [Layout],
    pub placements: usize,
    pub profiles: usize,
    pub obs_dim: usize,
    pub actions: usize,
}

impl FeatureSpec {
    /// The current version's spec ([`FEATURE_SPEC_VERSION`]).
    pub fn new(model: GpuModel) -> Self {
        Self::with_version(model, FEATURE_SPEC_VERSION)
    }

    /// The spec of an older `version` (see [`SUPPORTED_FEATURE_SPECS`];
    /// any version above 1 means the current one).
    pub fn with_version(model: GpuModel, version: u32) -> Self {
        let geometry = Geometry::of(model);
        let catalog = geometry.catalog();
        let c = catalog.len();
        let n = geometry.ids().count();
        let p = model.spec().profiles.len();
        let version = version.clamp(1, FEATURE_SPEC_VERSION);
        let v1_dim = (c + 1) + 3 * n + 3 + 2 * p + 4 * p + (c + 1) + 2 + 2 + 2 + 2;
        let obs_dim = if version == 1 {
            v1_dim
        } else {
            v1_dim + 3 * p + 2
        };
        FeatureSpec {
            model,
            version,
            geometry,
            catalog,
            placements: n,
            profiles: p,
            obs_dim,
            actions: c + 1,
        }
    }

    /// Index of the "keep the current layout" action.
    pub fn keep_action(&self) -> usize {
        self.catalog.len()
    }

    /// The decision action `action` means for `gpu`, if any: the next step
    /// toward the catalog layout it names ([`super::step_toward`]); none
    /// for "keep", for the current layout, or when no step is possible now.
    /// (Version 1: a move straight to the layout, if the GPU accepts it now.)
    pub fn decode(&self, gpu: usize, status: &GpuStatus, action: usize) -> Option<Decision> {
        let target = *self.catalog.get(action)?;
        if self.version == 1 {
            return (target != status.layout && status.accepts(target))
                .then_some(Decision { gpu, target });
        }
        super::step_toward(status, target).map(|target| Decision { gpu, target })
    }
}

fn squash(x: f64) -> f32 {
    (x / (1.0 + x)) as f32
}

/// One remembered arrival: time, profile index, compute-seconds it needs
/// on that profile as a share of a GPU.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    at: f64,
    profile: usize,
    gpu_s: f64,
}

/// Encodes views into observation and mask matrices (row-major, one row per
/// GPU of the spec's model), reusing its buffers across epochs. It
/// remembers the arrivals of the last hours (the mix features), so it
/// follows one cluster through time.
#[derive(Clone, Debug)]
pub struct Encoder {
    spec: FeatureSpec,
    recent: std::collections::VecDeque<Arrival>,
    /// GPU numbers of the rows of the last encoding.
    pub gpus: Vec<usize>,
    pub obs: Vec<f32>,
    pub mask: Vec<f32>,
}

impl Encoder {
    pub fn new(model: GpuModel) -> Self {
        Self::for_spec(FeatureSpec::new(model))
    }

    /// An encoder for `spec` (an older version's, to run an older file).
    pub fn for_spec(spec: FeatureSpec) -> Self {
        Encoder {
            spec,
            recent: std::collections::VecDeque::new(),
            gpus: Vec::new(),
            obs: Vec::new(),
            mask: Vec::new(),
        }
    }

    pub fn spec(&self) -> &FeatureSpec {
        &self.spec
    }

    /// Encodes every GPU of the spec's model in `view` (GPUs of other models
    /// are skipped). Afterwards `gpus[i]` is the GPU of row `i` of `obs`
    /// (`obs_dim` wide) and `mask` (`actions` wide, 1.0 = allowed).
    ///
    /// Each row is the GPU's own features ([`own_features`]), then those
    /// every row shares ([`Shared`], computed once per epoch), then (from
    /// version 2) the arrival mix ([`mix_features`]).
    pub fn encode(&mut self, view: &ClusterView<'_>) {
        let s = self.spec;
        let c = s.catalog.len();
        if self.select_rows(view) == 0 {
            return;
        }
        let shared = Shared::of(&s, view, &self.gpus);
        let mix = self.remember(view);
        for (row, &gi) in self.gpus.iter().enumerate() {
            let g = &view.gpus[gi];
            let o = &mut self.obs[row * s.obs_dim..(row + 1) * s.obs_dim];
            let at = own_features(&s, o, g, view.now);
            let at = shared.write(&s, o, at, row);
            let m = &mut self.mask[row * s.actions..(row + 1) * s.actions];
            if s.version == 1 {
                debug_assert_eq!(at, s.obs_dim);
                mask_v1(m, g, s.catalog);
                continue;
            }
            mix_features(&s, o, at, &mix, shared.gcount);
            if !g.in_reconfiguration {
                // Every catalog layout is a target the GPU can work toward.
                m[..c].fill(1.0);
            }
            m[c] = 1.0;
        }
    }

    /// Picks the rows (the GPUs of the spec's model) and clears the
    /// buffers to their size; returns the number of rows.
    fn select_rows(&mut self, view: &ClusterView<'_>) -> usize {
        let s = self.spec;
        self.gpus.clear();
        self.gpus.extend(
            view.gpus
                .iter()
                .enumerate()
                .filter(|(_, g)| g.model == s.model)
                .map(|(i, _)| i),
        );
        let rows = self.gpus.len();
        self.obs.clear();
        self.obs.resize(rows * s.obs_dim, 0.0);
        self.mask.clear();
        self.mask.resize(rows * s.actions, 0.0);
        rows
    }

    /// Adds the view's arrivals to the remembered ones, forgets those older
    /// than the long window, and sums them per profile.
    fn remember(&mut self, view: &ClusterView<'_>) -> Mix {
        if self.spec.version == 1 {
            // Version 1 has no arrival slots: nothing to remember.
            return Mix {
                short: Vec::new(),
                long: Vec::new(),
                share: Vec::new(),
            };
        }
        let s = self.spec;
        let profiles = s.model.spec().profiles;
        let total = s.model.spec().compute_slices;
        for job in view.arrivals {
            let Some(shape) = job.shape(s.model) else {
                continue;
            };
            let Some(k) = profiles.iter().position(|q| q.shape == shape) else {
                continue;
            };
            let share = f64::from(shape.compute) / f64::from(total);
            self.recent.push_back(Arrival {
                at: job.arrival,
                profile: k,
                gpu_s: job.runtime_on(shape.compute, total) * share,
            });
        }
        while self
            .recent
            .front()
            .is_some_and(|a| a.at < view.now - ARRIVALS_LONG_S)
        {
            self.recent.pop_front();
        }
        let mut mix = Mix {
            short: vec![0.0; s.profiles],
            long: vec![0.0; s.profiles],
            share: vec![0.0; s.profiles],
        };
        for a in &self.recent {
            mix.long[a.profile] += 1.0;
            mix.share[a.profile] += a.gpu_s;
            if a.at >= view.now - ARRIVALS_SHORT_S {
                mix.short[a.profile] += 1.0;
            }
        }
        mix
    }

    /// Number of allowed actions of row `row` (1 = only "keep": no choice).
    pub fn choices(&self, row: usize) -> usize {
        let a = self.spec.actions;
        self.mask[row * a..(row + 1) * a]
            .iter()
            .filter(|&&m| m > 0.5)
            .count()
    }
}

/// Version 1's mask: a catalog layout only when the GPU accepts it now
/// (not reconfiguring, keeps every busy instance), and "keep".
fn mask_v1(m: &mut [f32], g: &GpuStatus, catalog: &[Layout]) {
    if !g.in_reconfiguration {
        for (a, &target) in catalog.iter().enumerate() {
            // A catalog layout is valid, and one that keeps every busy
            // instance destroys none of them: exactly `g.accepts(target)`,
            // without its validity lookup.
            debug_assert_eq!(target.contains_all(g.busy), g.accepts(target));
            if target.contains_all(g.busy) {
                m[a] = 1.0;
            }
        }
    }
    m[catalog.len()] = 1.0;
}

/// The remembered arrivals per profile: counts in the short and the long
/// window, compute-seconds (share of a GPU) in the long one.
struct Mix {
    short: Vec<f64>,
    long: Vec<f64>,
    share: Vec<f64>,
}

/// The features every row shares, computed once per epoch: the cluster's
/// idle supply, layouts and load, and the queue's demand.
struct Shared {
    gcount: f64,
    idle_supply: Vec<u32>,
    hist: Vec<u32>,
    busy_share: f64,
    reconfiguring: u32,
    idle_rank: Vec<u32>,
    waiting: Vec<u32>,
    at_risk: Vec<u32>,
    waiting_model: u32,
    mean_overdue: f64,
    sin_h: f64,
    cos_h: f64,
}

impl Shared {
    fn of(s: &FeatureSpec, view: &ClusterView<'_>, gpus: &[usize]) -> Shared {
        let (c, p) = (s.catalog.len(), s.profiles);
        let profiles = s.model.spec().profiles;
        let total = f64::from(s.model.spec().compute_slices);
        let rows = gpus.len();
        let mut sh = Shared {
            gcount: rows as f64,
            idle_supply: vec![0u32; p],
            hist: vec![0u32; c + 1],
            busy_share: 0.0,
            reconfiguring: 0,
            idle_rank: vec![0u32; rows],
            waiting: vec![0u32; p],
            at_risk: vec![0u32; p],
            waiting_model: 0,
            mean_overdue: 0.0,
            sin_h: 0.0,
            cos_h: 0.0,
        };
        let mut idle_gpus = 0u32;
        for (row, &gi) in gpus.iter().enumerate() {
            let g = &view.gpus[gi];
            for id in g.idle().iter() {
                if let Some(k) = profile_index(s.geometry, id, profiles) {
                    sh.idle_supply[k] += 1;
                }
            }
            sh.hist[s.geometry.catalog_index(g.layout).unwrap_or(c)] += 1;
            sh.busy_share += f64::from(s.geometry.compute_used(g.busy)) / total;
            sh.reconfiguring += u32::from(g.in_reconfiguration);
            sh.idle_rank[row] = idle_gpus;
            if g.busy.is_empty() && !g.in_reconfiguration {
                idle_gpus += 1;
            }
        }
        sh.queue(s, view);
        (sh.sin_h, sh.cos_h) = (2.0 * PI * view.hour_of_day / 24.0).sin_cos();
        sh
    }

    /// The waiting jobs per profile, those at risk, and the mean overdue.
    fn queue(&mut self, s: &FeatureSpec, view: &ClusterView<'_>) {
        let profiles = s.model.spec().profiles;
        let mut overdue = 0.0;
        for job in view.pending {
            let Some(shape) = job.shape(s.model) else {
                continue;
            };
            let Some(k) = profiles.iter().position(|q| q.shape == shape) else {
                continue;
            };
            self.waiting_model += 1;
            self.waiting[k] += 1;
            let speed = job
                .speedup
                .speed(shape.compute, s.model.spec().compute_slices);
            if speed <= 0.0 || view.now + job.work / speed > job.deadline {
                self.at_risk[k] += 1;
            }
            overdue += (view.now - job.deadline).max(0.0);
        }
        self.mean_overdue = if self.waiting_model > 0 {
            overdue / f64::from(self.waiting_model)
        } else {
            0.0
        };
    }

    /// Writes the shared features into row `row`'s `o` from `at`; returns
    /// where they end.
    fn write(&self, s: &FeatureSpec, o: &mut [f32], mut at: usize, row: usize) -> usize {
        let (c, p) = (s.catalog.len(), s.profiles);
        let gcount = self.gcount;
        for k in 0..p {
            o[at + k] = squash(f64::from(self.waiting[k]) / gcount);
            o[at + p + k] = squash(f64::from(self.at_risk[k]) / gcount);
            o[at + 2 * p + k] = squash(f64::from(self.idle_supply[k]) / gcount);
            o[at + 3 * p + k] =
                squash(f64::from(self.waiting[k].saturating_sub(self.idle_supply[k])) / gcount);
        }
        at += 4 * p;
        for (k, &h) in self.hist.iter().enumerate() {
            o[at + k] = (f64::from(h) / gcount) as f32;
        }
        at += c + 1;
        o[at] = (self.busy_share / gcount) as f32;
        o[at + 1] = (f64::from(self.reconfiguring) / gcount) as f32;
        o[at + 2] = self.sin_h as f32;
        o[at + 3] = self.cos_h as f32;
        o[at + 4] = (row as f64 / gcount) as f32;
        o[at + 5] = (f64::from(self.idle_rank[row]) / gcount) as f32;
        o[at + 6] = squash(f64::from(self.waiting_model) / gcount);
        o[at + 7] = (1.0 - (-self.mean_overdue / OVERDUE_SCALE_S).exp()) as f32;
        at + 8
    }
}

/// Writes a GPU's own features (its layout, each placement's state, its
/// load, its idle and busy profiles) at the start of its row `o`; returns
/// where they end.
fn own_features(s: &FeatureSpec, o: &mut [f32], g: &GpuStatus, now: f64) -> usize {
    let (c, n, p) = (s.catalog.len(), s.placements, s.profiles);
    let profiles = s.model.spec().profiles;
    let total = f64::from(s.model.spec().compute_slices);
    let mut at = 0;
    o[s.geometry.catalog_index(g.layout).unwrap_or(c)] = 1.0;
    at += c + 1;
    for id in s.geometry.ids() {
        // Placement ids are 0..n (Geometry::ids).
        let base = at + 3 * id.0 as usize;
        o[base] = f32::from(u8::from(g.layout.contains(id)));
        o[base + 1] = f32::from(u8::from(g.busy.contains(id)));
        o[base + 2] = (1.0 - (-g.remaining(id, now) / REMAINING_SCALE_S).exp()) as f32;
    }
    at += 3 * n;
    o[at] = f32::from(u8::from(g.in_reconfiguration));
    o[at + 1] = (f64::from(s.geometry.compute_used(g.busy)) / total) as f32;
    o[at + 2] = (1.0 - f64::from(s.geometry.compute_used(g.layout)) / total) as f32;
    at += 3;
    for id in g.idle().iter() {
        if let Some(k) = profile_index(s.geometry, id, profiles) {
            o[at + k] += 0.25;
        }
    }
    for id in g.busy.iter() {
        if let Some(k) = profile_index(s.geometry, id, profiles) {
            o[at + p + k] += 0.25;
        }
    }
    at + 2 * p
}

/// Writes the arrival mix (version 2) into row `o` from `at`, to its end.
fn mix_features(s: &FeatureSpec, o: &mut [f32], mut at: usize, mix: &Mix, gcount: f64) {
    let p = s.profiles;
    for k in 0..p {
        o[at + k] = squash(mix.short[k] / gcount);
        o[at + p + k] = squash(mix.long[k] / gcount);
        o[at + 2 * p + k] =
            (mix.share[k] / (ARRIVALS_LONG_S * gcount)).min(DEMAND_SHARE_CAP) as f32;
    }
    at += 3 * p;
    o[at] = squash(mix.short.iter().sum::<f64>() / gcount);
    o[at + 1] = squash(mix.long.iter().sum::<f64>() / gcount);
    debug_assert_eq!(at + 2, s.obs_dim);
}

/// Index in `profiles` of the profile of placement `id`.
fn profile_index(
    geometry: &Geometry,
    id: crate::mig::SpotId,
    profiles: &[crate::mig::ProfileSpec],
) -> Option<usize> {
    let shape = geometry.spot(id).shape();
    profiles.iter().position(|q| q.shape == shape)
}

/// Index of the largest allowed probability (ties: the lowest index; the
/// "keep" action when nothing is allowed, which cannot happen with masks
/// from [`Encoder::encode`]).
pub fn argmax_masked(probs: &[f32], mask: &[f32]) -> usize {
    let mut best = probs.len().saturating_sub(1);
    let mut best_p = f32::NEG_INFINITY;
    for (a, (&pr, &m)) in probs.iter().zip(mask).enumerate() {
        if m > 0.5 && pr > best_p {
            best = a;
            best_p = pr;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{GpuStatus, PendingByProfile};

    #[test]
    fn sizes_and_masks() {
        let spec = FeatureSpec::new(GpuModel::A100_40gb);
        assert_eq!(spec.catalog.len(), 19);
        assert_eq!(spec.actions, 20);
        let g = Geometry::of(GpuModel::A100_40gb);
        let mut gpus = vec![GpuStatus::new(GpuModel::A100_40gb, g.whole_gpu()); 3];
        // GPU 1 runs a job on its whole-GPU instance: every target stays
        // allowed (it is pursued as the job ends), but none moves it now.
        gpus[1].busy = g.whole_gpu();
        gpus[1].busy_until[g.whole_gpu().iter().next().unwrap().0 as usize] = 100.0;
        gpus[2].in_reconfiguration = true;
        let pending_by_profile = PendingByProfile::default();
        let view = ClusterView {
            now: 10.0,
            hour_of_day: 6.0,
            gpus: &gpus,
            pending: &[],
            pending_by_profile: &pending_by_profile,
            arrivals: &[],
        };
        let mut e = Encoder::new(GpuModel::A100_40gb);
        e.encode(&view);
        assert_eq!(e.obs.len(), 3 * spec.obs_dim);
        assert_eq!(e.choices(0), spec.actions);
        assert_eq!(e.choices(1), spec.actions);
        assert_eq!(e.choices(2), 1);
        assert!(e.obs.iter().all(|x| x.is_finite()));
        // Decoding the whole-GPU action on a whole GPU is a no-op.
        assert_eq!(spec.decode(0, &gpus[0], 0), None);
        assert!(spec.decode(0, &gpus[0], 5).is_some());
        assert_eq!(spec.decode(0, &gpus[0], spec.keep_action()), None);
        assert_eq!(spec.decode(1, &gpus[1], 5), None);
    }

    /// Version 1 (the files trained before the arrival mix) keeps its
    /// sizes, its mask (only layouts accepted now) and its decoding.
    #[test]
    fn version_1_keeps_its_sizes_mask_and_moves() {
        let m = GpuModel::A100_40gb;
        let v1 = FeatureSpec::with_version(m, 1);
        assert_eq!(v1.obs_dim, 141, "the shipped files' size");
        assert_eq!(FeatureSpec::new(m).obs_dim, 141 + 3 * v1.profiles + 2);
        let g = Geometry::of(m);
        let mut gpus = vec![GpuStatus::new(m, g.whole_gpu()); 2];
        gpus[1].busy = g.whole_gpu();
        gpus[1].busy_until[g.whole_gpu().iter().next().unwrap().0 as usize] = 100.0;
        let counts = PendingByProfile::default();
        let mut e = Encoder::for_spec(v1);
        e.encode(&ClusterView {
            now: 0.0,
            hour_of_day: 0.0,
            gpus: &gpus,
            pending: &[],
            pending_by_profile: &counts,
            arrivals: &[],
        });
        assert_eq!(e.obs.len(), 2 * v1.obs_dim);
        assert_eq!(e.choices(0), v1.actions);
        assert_eq!(e.choices(1), 2, "keep and the whole GPU only");
        assert!(v1
            .decode(0, &gpus[0], 5)
            .is_some_and(|d| d.target == v1.catalog[5]));
        assert_eq!(v1.decode(1, &gpus[1], 5), None);
    }

    /// A target the busy instances rule out today is reached step by step:
    /// the busy 1g instance stays, the target's three 1g are built beside
    /// it; once the job ends the target itself is taken.
    #[test]
    fn targets_are_pursued_around_busy_instances() {
        let m = GpuModel::A100_40gb;
        let spec = FeatureSpec::new(m);
        let g = Geometry::of(m);
        let pic = |p: &str| {
            spec.catalog
                .iter()
                .position(|&l| g.picture(l) == p)
                .unwrap()
        };
        let from = spec.catalog[pic("1|1|22|3333")];
        let first = from.iter().next().unwrap();
        let mut st = GpuStatus::new(m, from);
        st.busy = Layout::EMPTY.with(first);
        let target = pic("4444|1|1|1|.");
        let d = spec.decode(0, &st, target).expect("a step");
        assert_eq!(g.picture(d.target), "1|1|22|1|1|1|.");
        st.busy = Layout::EMPTY;
        let d = spec.decode(0, &st, target).unwrap();
        assert_eq!(g.picture(d.target), "4444|1|1|1|.");
    }

    /// Arrivals are remembered for three hours: the short window counts the
    /// last hour's, the long one all, per the jobs' smallest profile.
    #[test]
    fn arrivals_are_counted_per_profile_and_window() {
        let m = GpuModel::A100_40gb;
        let spec = FeatureSpec::new(m);
        let g = Geometry::of(m);
        let gpus = vec![GpuStatus::new(m, g.whole_gpu()); 2];
        let counts = PendingByProfile::default();
        let job = |id: u64, at: f64| {
            let mut shapes = [None; crate::policy::MODEL_COUNT];
            shapes[m as usize] = Some(m.spec().profiles[0].shape);
            crate::policy::PendingJob {
                id,
                arrival: at,
                deadline: at + 1e4,
                work: 700.0,
                memory_gb: 1.0,
                min_compute: 1,
                speedup: crate::workload::SpeedupCurve::linear(),
                shapes,
            }
        };
        let mut e = Encoder::new(m);
        let tail = |e: &Encoder| e.obs[spec.obs_dim - 3 * spec.profiles - 2..spec.obs_dim].to_vec();
        let first = [job(0, 0.0), job(1, 100.0)];
        let view = |now: f64, arrivals: &'static [crate::policy::PendingJob]| (now, arrivals);
        let _ = view;
        for (now, arrivals) in [
            (100.0, &first[..]),
            (2.0 * 3600.0, &[][..]),
            (3.5 * 3600.0, &[][..]),
        ] {
            e.encode(&ClusterView {
                now,
                hour_of_day: 0.0,
                gpus: &gpus,
                pending: &[],
                pending_by_profile: &counts,
                arrivals,
            });
            let t = tail(&e);
            let (short, long) = (t[0], t[spec.profiles]);
            let total_long = t[3 * spec.profiles + 1];
            match now as u64 {
                100 => assert!(short > 0.0 && (short - long).abs() < 1e-6, "{t:?}"),
                7200 => assert!(short == 0.0 && long > 0.0 && total_long > 0.0, "{t:?}"),
                _ => assert!(long == 0.0 && total_long == 0.0, "{t:?}"),
            }
        }
    }

    #[test]
    fn argmax_respects_mask() {
        assert_eq!(argmax_masked(&[0.9, 0.1, 0.0], &[0.0, 1.0, 1.0]), 1);
        assert_eq!(argmax_masked(&[0.5, 0.5], &[1.0, 1.0]), 0);
    }
}
