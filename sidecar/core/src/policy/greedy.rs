//! `greedy`: demand-driven repartitioning in the spirit of nebuly-ai/nos.
//!
//! nos (Kubernetes) re-shapes a GPU into the geometry that supplies the most
//! pending pod profiles without deleting a busy instance. This policy does
//! the same on a [`ClusterView`], with two refinements for deadlines:
//!
//! - **Demand by deadline.** A waiting job asks for the smallest instance
//!   that fits it (memory, requested size) *and* finishes it by its
//!   deadline if started after one reconfiguration; if no instance is fast
//!   enough, the smallest one of the highest speed it can reach. An
//!   instance *serves* the job when it has at least that many compute
//!   slices and enough memory (bigger is never slower:
//!   [`SpeedupCurve`](crate::workload::SpeedupCurve) is non-decreasing).
//! - **Batching window** (nos: `batchWindowTimeoutSeconds`). Re-shaping for
//!   every new request would thrash: a request younger than
//!   [`GreedyConfig::window_s`] is not demand yet, unless waiting one more
//!   window would make the size it needs now too slow (its deadline is
//!   near; judged on the first GPU's model) or nothing runs on
//!   the whole cluster (no later event would wake the policy up). A job
//!   that waited the window always counts. Young requests are usually
//!   absorbed by instances that free up meanwhile, without a
//!   reconfiguration.
//!
//! ## The decision
//!
//! At an epoch the waiting jobs that count as demand are sorted by urgency
//! (deadline, then id). Instances being created (a reconfiguration in
//! progress) are matched first: jobs they will serve are not demand any
//! more. Then the GPUs are visited in order; for each GPU that is not being
//! reconfigured, every *candidate* layout (the catalog and the maximal
//! layouts of the model, the latter adding the memory-wide 1g profile, that
//! keep every busy instance: [`crate::mig::Geometry::reachable`]; and the
//! current layout) is scored by how many of the remaining demand its free
//! instances would serve (greedy matching in urgency order, each job taking
//! the smallest serving instance). The GPU moves to the best candidate only
//! if it serves strictly more than the current layout; ties prefer fewer
//! instance changes, then the catalog order. Jobs served are removed from
//! the demand before the next GPU is visited. The policy never proposes a
//! layout that destroys a busy instance (tests: `policy_props`).

use super::{ClusterView, Decision, GpuStatus, PendingJob, RepartitionPolicy};
use rustc_hash::FxHashMap;

use crate::mig::{Geometry, GpuModel, Layout, MAX_PROFILES};

use super::MAX_PLACEMENTS;

/// Tunables of [`Greedy`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GreedyConfig {
    /// Batching window, s: younger requests are not demand unless urgent.
    /// Default 60 s (the nos default batch window timeout).
    pub window_s: f64,
    /// Time a reconfiguration takes, s, assumed before a job could start on
    /// a new instance (default 4 s, the simulator's default).
    pub reconfig_time_s: f64,
    /// Most waiting jobs considered per epoch (the most urgent ones): one
    /// GPU holds at most 7 instances, so a longer queue only costs time.
    pub max_demand: usize,
    /// Catalog index of the layout every GPU starts with (default 1:
    /// `4444|3333` on the eight-slice models, the `static` admin layout).
    /// Not the whole GPU: from whole GPUs a reactive policy never sees
    /// demand it can act on, because a job only waits when every GPU is
    /// busy, and the freed GPU takes it at once (measured: identical to
    /// `none` on the default day).
    pub initial: usize,
}

impl Default for GreedyConfig {
    fn default() -> Self {
        GreedyConfig {
            window_s: 60.0,
            reconfig_time_s: 4.0,
            max_demand: 256,
            initial: 1,
        }
    }
}

/// Why a `greedy:...` spec was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "greedy policy `{0}`: expected `greedy` or `greedy:window=<seconds>` (seconds finite and >= 0)"
)]
pub struct GreedyParseError(pub String);

/// The demand-driven greedy policy (module docs).
#[derive(Clone, Debug, Default)]
pub struct Greedy {
    cfg: GreedyConfig,
    /// Candidate layouts per model (catalog then maximal, deduplicated).
    candidates: Vec<(GpuModel, Vec<Layout>)>,
}

/// One waiting job reduced to what an instance must offer to serve it.
#[derive(Clone, Copy, Debug)]
struct Demand {
    /// Index in `view.pending`.
    job: usize,
    urgency: f64,
    id: u64,
}

/// A free (or soon free) instance: compute slices and memory in GB.
#[derive(Clone, Copy, Debug)]
struct Slot {
    compute: u8,
    memory_gb: u32,
}

impl Greedy {
    pub fn new(cfg: GreedyConfig) -> Self {
        Greedy {
            cfg,
            candidates: Vec::new(),
        }
    }

    /// `greedy` or `greedy:<key>=<value>,...` with keys `window` (seconds,
    /// at least 0) and `init` (catalog index); `None` if `spec` is not a
    /// greedy spec at all.
    pub fn parse(spec: &str) -> Option<Result<Self, GreedyParseError>> {
        let s = spec.trim();
        if s == "greedy" {
            return Some(Ok(Greedy::new(GreedyConfig::default())));
        }
        let rest = s.strip_prefix("greedy:")?;
        let mut cfg = GreedyConfig::default();
        for part in rest.split(',') {
            let ok = match part.trim().split_once('=') {
                Some(("window", v)) => v
                    .trim()
                    .trim_end_matches('s')
                    .parse::<f64>()
                    .ok()
                    .filter(|w| w.is_finite() && *w >= 0.0)
                    .map(|w| cfg.window_s = w),
                Some(("init", v)) => v.trim().parse::<usize>().ok().map(|i| cfg.initial = i),
                _ => None,
            };
            if ok.is_none() {
                return Some(Err(GreedyParseError(spec.to_string())));
            }
        }
        Some(Ok(Greedy::new(cfg)))
    }

    pub fn config(&self) -> &GreedyConfig {
        &self.cfg
    }

    fn candidates_of(&mut self, geometry: &'static Geometry) -> &[Layout] {
        let model = geometry.model();
        let i = match self.candidates.iter().position(|(m, _)| *m == model) {
            Some(i) => i,
            None => {
                let mut all: Vec<Layout> = geometry.catalog().to_vec();
                for &l in geometry.maximal() {
                    if !all.contains(&l) {
                        all.push(l);
                    }
                }
                self.candidates.push((model, all));
                self.candidates.len() - 1
            }
        };
        &self.candidates[i].1
    }
}

/// Smallest compute size of `model` that serves `job` (module docs), given
/// that it could start at `start`; `None` if the job fits no profile.
fn demanded_compute(job: &PendingJob, model: GpuModel, start: f64) -> Option<u8> {
    let spec = model.spec();
    let total = spec.compute_slices;
    // The distinct compute sizes of the profiles that fit, ascending (no
    // allocation: this runs for every waiting job at every epoch).
    let mut fitting = [0u8; MAX_PROFILES];
    let mut n = 0;
    for p in spec.profiles {
        let k = p.shape.compute;
        if f64::from(p.memory_gb) >= job.memory_gb
            && k >= job.min_compute
            && !fitting[..n].contains(&k)
        {
            fitting[n] = k;
            n += 1;
        }
    }
    let fitting = &mut fitting[..n];
    fitting.sort_unstable();
    let runtime = |k: u8| job.runtime_on(k, total);
    fitting
        .iter()
        .copied()
        .find(|&k| start + runtime(k) <= job.deadline)
        .or_else(|| {
            // Too late on every size: the smallest of the fastest.
            let best = fitting
                .iter()
                .map(|&k| job.speedup.speed(k, total))
                .fold(0.0, f64::max);
            fitting
                .iter()
                .copied()
                .find(|&k| job.speedup.speed(k, total) >= best)
        })
}

fn serves(slot: Slot, compute: u8, memory_gb: f64) -> bool {
    slot.compute >= compute && f64::from(slot.memory_gb) >= memory_gb
}

/// Greedy matching: jobs in the given (urgency) order each take the
/// smallest free slot that serves them (ties: the first). Calls `served`
/// with each matched job and returns how many were matched.
fn match_jobs(slots: &Slots, jobs: &[(usize, u8, f64)], mut served: impl FnMut(usize)) -> usize {
    let slots = slots.as_slice();
    let all = if slots.len() >= 32 {
        u32::MAX
    } else {
        (1u32 << slots.len()) - 1
    };
    let mut used = 0u32;
    let mut matched = 0;
    for &(j, k, memory_gb) in jobs {
        if used == all {
            break;
        }
        let pick = slots
            .iter()
            .enumerate()
            .filter(|(i, s)| used & (1 << i) == 0 && serves(**s, k, memory_gb))
            .min_by_key(|(i, s)| (s.compute, s.memory_gb, *i))
            .map(|(i, _)| i);
        if let Some(i) = pick {
            used |= 1 << i;
            matched += 1;
            served(j);
        }
    }
    matched
}

/// The free instances of a layout as slots, on the stack.
struct Slots {
    slots: [Slot; MAX_PLACEMENTS],
    len: usize,
}

impl Slots {
    fn of(geometry: &Geometry, layout: Layout) -> Self {
        let mut out = Slots {
            slots: [Slot {
                compute: 0,
                memory_gb: 0,
            }; MAX_PLACEMENTS],
            len: 0,
        };
        for id in layout.iter() {
            let p = geometry.spot(id);
            out.slots[out.len] = Slot {
                compute: p.compute(),
                memory_gb: p.profile.memory_gb,
            };
            out.len += 1;
        }
        out
    }

    fn as_slice(&self) -> &[Slot] {
        &self.slots[..self.len]
    }
}

impl RepartitionPolicy for Greedy {
    fn name(&self) -> String {
        let d = GreedyConfig::default();
        let mut opts = Vec::new();
        if self.cfg.window_s != d.window_s {
            opts.push(format!("window={}", self.cfg.window_s));
        }
        if self.cfg.initial != d.initial {
            opts.push(format!("init={}", self.cfg.initial));
        }
        if opts.is_empty() {
            "greedy".to_string()
        } else {
            format!("greedy:{}", opts.join(","))
        }
    }

    fn describe(&self) -> String {
        format!(
            "{}: demand-driven (nos-style), starts from catalog layout {}, batching window {} s",
            self.name(),
            self.cfg.initial,
            self.cfg.window_s
        )
    }

    fn initial_layout(&mut self, _gpu: usize, geometry: &'static Geometry) -> Layout {
        let c = geometry.catalog();
        c[self.cfg.initial.min(c.len() - 1)]
    }

    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        if view.pending.is_empty() {
            return Vec::new();
        }
        let now = view.now;
        let quiet = view.gpus.iter().all(|g| g.busy.is_empty());
        let start = now + self.cfg.reconfig_time_s;
        // Demand: waiting jobs past the window, near their deadline, or any
        // when the cluster is quiet.
        let mut demand: Vec<Demand> = view
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                if quiet || now - p.arrival >= self.cfg.window_s {
                    return true;
                }
                // Near the deadline: waiting one more window would make
                // the size it needs now too slow.
                let model = view.gpus.first().map_or(GpuModel::A100_40gb, |g| g.model);
                demanded_compute(p, model, start).is_some_and(|k| {
                    let runtime = p.runtime_on(k, model.spec().compute_slices);
                    start + self.cfg.window_s + runtime > p.deadline
                })
            })
            .map(|(j, p)| Demand {
                job: j,
                urgency: p.deadline,
                id: p.id,
            })
            .collect();
        if demand.is_empty() {
            return Vec::new();
        }
        demand.sort_by(|a, b| a.urgency.total_cmp(&b.urgency).then(a.id.cmp(&b.id)));
        demand.truncate(self.cfg.max_demand);

        // What each demanded job needs on each model, computed once.
        let mut needs = Needs::new(demand.iter().map(|d| d.job).collect(), view.pending, start);
        // Positions in the demand of the jobs not served yet, by urgency.
        let mut open: Vec<usize> = (0..demand.len()).collect();
        let mut jobs: Vec<(usize, u8, f64)> = Vec::new();
        // Removes from `open` the jobs the free instances `free` of `gpu` serve.
        let serve = |needs: &mut Needs,
                     gpu: &GpuStatus,
                     free: Layout,
                     open: &mut Vec<usize>,
                     jobs: &mut Vec<_>| {
            needs.jobs(gpu.model, open, jobs);
            let mut served = Vec::new();
            match_jobs(&Slots::of(gpu.geometry, free), jobs, |d| served.push(d));
            open.retain(|d| !served.contains(d));
        };
        // Instances being created serve the jobs that fit them.
        for gpu in view.gpus {
            if gpu.reconfiguring.is_empty() || open.is_empty() {
                continue;
            }
            serve(
                &mut needs,
                gpu,
                gpu.reconfiguring.minus(gpu.busy),
                &mut open,
                &mut jobs,
            );
        }

        let mut decisions = Vec::new();
        // A GPU's choice depends only on its model, layout and busy
        // instances while `open` is unchanged: GPUs in the same state that
        // serve nothing (the common case when the demand cannot be served)
        // are decided once.
        let mut idle_choices: FxHashMap<(GpuModel, Layout, Layout), Layout> = FxHashMap::default();
        for (index, gpu) in view.gpus.iter().enumerate() {
            if open.is_empty() {
                break;
            }
            if gpu.in_reconfiguration {
                continue;
            }
            let key = (gpu.model, gpu.layout, gpu.busy);
            if let Some(&target) = idle_choices.get(&key) {
                if target != gpu.layout {
                    decisions.push(Decision { gpu: index, target });
                }
                continue;
            }
            let (target, served) = self.choose(gpu, &mut needs, &open, &mut jobs);
            if target != gpu.layout {
                decisions.push(Decision { gpu: index, target });
            }
            if served > 0 {
                serve(
                    &mut needs,
                    gpu,
                    target.minus(gpu.busy),
                    &mut open,
                    &mut jobs,
                );
                idle_choices.clear();
            } else {
                idle_choices.insert(key, target);
            }
        }
        decisions
    }
}

impl Greedy {
    /// The layout GPU `gpu` moves to (its current one if no candidate
    /// serves strictly more of the open demand, or if the GPU refuses the
    /// move) and how many open jobs that layout's free instances serve.
    fn choose(
        &mut self,
        gpu: &GpuStatus,
        needs: &mut Needs<'_>,
        open: &[usize],
        jobs: &mut Vec<(usize, u8, f64)>,
    ) -> (Layout, usize) {
        let geometry = gpu.geometry;
        let current = gpu.layout;
        let busy = gpu.busy;
        needs.jobs(gpu.model, open, jobs);
        if jobs.is_empty() {
            return (current, 0);
        }
        let score =
            |layout: Layout| match_jobs(&Slots::of(geometry, layout.minus(busy)), jobs, |_| {});
        let current_score = score(current);
        let mut best = (current_score, 0usize, current);
        for target in geometry.reachable(busy, self.candidates_of(geometry)) {
            if target == current {
                continue;
            }
            let s = score(target);
            let t = geometry.transition(current, target);
            let changes = t.destroy.len() + t.create.len();
            // Strictly more served, or as many with fewer changes
            // (never better than staying put: current has 0 changes).
            if s > best.0 || (s == best.0 && s > current_score && changes < best.1) {
                best = (s, changes, target);
            }
        }
        let (s, _, target) = best;
        if target != current && gpu.accepts(target) {
            (target, s)
        } else {
            (current, current_score)
        }
    }
}

/// The demand of one decision (indices into `pending`, by urgency) and
/// what each of its jobs needs (its [`demanded_compute`]) on each model of
/// the cluster, computed on first use.
struct Needs<'a> {
    demanded: Vec<usize>,
    pending: &'a [PendingJob],
    start: f64,
    per_model: Vec<(GpuModel, Vec<Option<u8>>)>,
}

impl<'a> Needs<'a> {
    fn new(demanded: Vec<usize>, pending: &'a [PendingJob], start: f64) -> Self {
        Needs {
            demanded,
            pending,
            start,
            per_model: Vec::new(),
        }
    }

    /// Fills `jobs` with `(position, size, memory)` of the `open` jobs
    /// (positions in the demand) that some instance of `model` can serve,
    /// in `open`'s order.
    fn jobs(&mut self, model: GpuModel, open: &[usize], jobs: &mut Vec<(usize, u8, f64)>) {
        let i = match self.per_model.iter().position(|(m, _)| *m == model) {
            Some(i) => i,
            None => {
                let sizes = self
                    .demanded
                    .iter()
                    .map(|&j| demanded_compute(&self.pending[j], model, self.start))
                    .collect();
                self.per_model.push((model, sizes));
                self.per_model.len() - 1
            }
        };
        let sizes = &self.per_model[i].1;
        jobs.clear();
        jobs.extend(
            open.iter().filter_map(|&d| {
                sizes[d].map(|k| (d, k, self.pending[self.demanded[d]].memory_gb))
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::Shape;
    use crate::policy::{PendingByProfile, MODEL_COUNT};
    use crate::workload::SpeedupCurve;

    const M: GpuModel = GpuModel::A100_40gb;

    fn pending(id: u64, arrival: f64, memory_gb: f64, min_compute: u8) -> PendingJob {
        PendingJob {
            id,
            arrival,
            deadline: arrival + 10_000.0,
            work: 100.0,
            memory_gb,
            min_compute,
            speedup: SpeedupCurve::new(0.5, 0.5).unwrap(),
            shapes: [None; MODEL_COUNT],
        }
    }

    fn view<'a>(
        now: f64,
        gpus: &'a [GpuStatus],
        pending: &'a [PendingJob],
        counts: &'a PendingByProfile,
    ) -> ClusterView<'a> {
        ClusterView {
            now,
            hour_of_day: 0.0,
            gpus,
            pending,
            pending_by_profile: counts,
            arrivals: &[],
        }
    }

    #[test]
    fn parses() {
        assert_eq!(Greedy::parse("greedy").unwrap().unwrap().name(), "greedy");
        let g = Greedy::parse("greedy:window=10").unwrap().unwrap();
        assert_eq!(g.config().window_s, 10.0);
        assert_eq!(g.name(), "greedy:window=10");
        assert!(Greedy::parse("greedy:window=-1").unwrap().is_err());
        let g = Greedy::parse("greedy:init=0,window=0").unwrap().unwrap();
        assert_eq!((g.config().initial, g.config().window_s), (0, 0.0));
        assert_eq!(g.name(), "greedy:window=0,init=0");
        assert!(Greedy::parse("greedy:speed=3").unwrap().is_err());
        assert!(Greedy::parse("static:0").is_none());
    }

    #[test]
    fn seven_small_requests_get_seven_small_slices() {
        let g = Geometry::of(M);
        let gpus = [GpuStatus::new(M, g.whole_gpu())];
        let jobs: Vec<_> = (0..7).map(|i| pending(i, 0.0, 4.0, 1)).collect();
        let counts = PendingByProfile::default();
        let d = Greedy::default().decide(&view(100.0, &gpus, &jobs, &counts));
        assert_eq!(d.len(), 1);
        assert_eq!(g.picture(d[0].target), "1|1|1|1|1|1|1|.");
    }

    #[test]
    fn young_requests_wait_for_the_window() {
        let g = Geometry::of(M);
        let mut gpu = GpuStatus::new(M, g.whole_gpu());
        // Something runs, so the cluster is not quiet.
        gpu.busy = g.whole_gpu();
        let idle = GpuStatus::new(M, g.whole_gpu());
        let gpus = [gpu, idle];
        let jobs: Vec<_> = (0..3).map(|i| pending(i, 90.0, 4.0, 1)).collect();
        let counts = PendingByProfile::default();
        let mut p = Greedy::default();
        assert!(p.decide(&view(100.0, &gpus, &jobs, &counts)).is_empty());
        // After the window they count.
        let d = p.decide(&view(151.0, &gpus, &jobs, &counts));
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].gpu, 1);
        // Unless the deadline is near.
        let mut urgent = jobs.clone();
        for j in &mut urgent {
            // 1g takes 187 s: due at 350 it must start within 59 s.
            j.deadline = 100.0 + 250.0;
        }
        assert_eq!(p.decide(&view(100.0, &gpus, &urgent, &counts)).len(), 1);
    }

    #[test]
    fn mixed_demand_picks_the_serving_layout() {
        // A 4g request (requested size) and three 1g requests: 4g+1g+1g+1g
        // serves all four.
        let g = Geometry::of(M);
        let gpus = [GpuStatus::new(M, g.whole_gpu())];
        let mut jobs = vec![pending(0, 0.0, 15.0, 4)];
        jobs.extend((1..4).map(|i| pending(i, 0.0, 4.0, 1)));
        let counts = PendingByProfile::default();
        let d = Greedy::default().decide(&view(100.0, &gpus, &jobs, &counts));
        assert_eq!(d.len(), 1);
        let t = d[0].target;
        let shapes: Vec<Shape> = t.iter().map(|id| g.spot(id).shape()).collect();
        assert!(shapes.contains(&Shape::new(4, 4)), "{}", g.picture(t));
        assert_eq!(
            shapes.iter().filter(|s| s.compute == 1).count(),
            3,
            "{}",
            g.picture(t)
        );
    }

    #[test]
    fn keeps_busy_instances_and_skips_reconfiguring_gpus() {
        let g = Geometry::of(M);
        let layout = g
            .layout_from(&[(Shape::new(4, 4), 0), (Shape::new(3, 4), 4)])
            .unwrap();
        let mut gpu = GpuStatus::new(M, layout);
        gpu.busy = g.layout_from(&[(Shape::new(4, 4), 0)]).unwrap();
        let jobs: Vec<_> = (0..3).map(|i| pending(i, 0.0, 4.0, 1)).collect();
        let counts = PendingByProfile::default();
        let gpus = [gpu.clone()];
        let d = Greedy::default().decide(&view(100.0, &gpus, &jobs, &counts));
        assert_eq!(d.len(), 1);
        assert!(d[0].target.contains_all(gpu.busy));
        assert_eq!(g.picture(d[0].target), "4444|1|1|1|.");
        gpu.in_reconfiguration = true;
        let gpus = [gpu];
        assert!(Greedy::default()
            .decide(&view(100.0, &gpus, &jobs, &counts))
            .is_empty());
    }

    #[test]
    fn deadline_aware_demand_asks_for_speed() {
        // A linear job of 100 s on 7g due in 120 s needs >= 6/7 of the GPU
        // (only 7g): the whole GPU stays.
        let g = Geometry::of(M);
        let gpus = [GpuStatus::new(M, g.whole_gpu())];
        let mut j = pending(0, 0.0, 4.0, 1);
        j.speedup = SpeedupCurve::linear();
        j.deadline = 100.0 + 120.0;
        let counts = PendingByProfile::default();
        // Job is urgent; the current 7g serves it: no change.
        assert!(Greedy::default()
            .decide(&view(100.0, &gpus, &[j], &counts))
            .is_empty());
        assert_eq!(demanded_compute(&j, M, 104.0), Some(7));
        j.deadline = 10_000.0;
        assert_eq!(demanded_compute(&j, M, 104.0), Some(1));
    }
}
