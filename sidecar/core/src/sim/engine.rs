//! The discrete-event engine. See the module docs of [`crate::sim`] for the
//! semantics; this file is about doing it fast:
//!
//! - arrivals are read in order from the (sorted) job list, never queued;
//!   the [`BinaryHeap`] holds only completions, reconfiguration ends and
//!   epoch ticks, so it stays as small as the number of busy instances;
//! - waiting jobs are indexed by *fit mask* (the set of instance classes
//!   that can hold them; a handful of distinct masks exist) and, inside a
//!   bucket, by heuristic priority; free instances by class. Starting a job
//!   costs O(buckets + log n), never a scan of the queue;
//! - the policy view and the per-GPU state are the same structures, updated
//!   in place; nothing is allocated per event unless an event log is kept.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use super::events::{
    EventSink, GpuHeader, Header, JobRecord, ModelPower, OomHeader, OomRecord, ReconfigRecord,
    Record, Run, UnservedRecord, EVENTS_VERSION,
};
use super::heuristics::{Candidate, PlacementContext, PlacementHeuristic};
use super::metrics::{ChargeBasis, Metrics, NeverRan, RunSums};
use super::reshape::{classify, ReconfigKind, Span};
use super::{EpochRule, OomConfig, SimConfig, SimError};
use crate::mig::{Geometry, GpuModel, GpuNow, Layout, Mix, ProfileSpec, Shape, Spot, SpotId, Way};
use crate::policy::{
    ClusterView, GpuStatus, PendingByProfile, PendingJob, RepartitionPolicy, MAX_PLACEMENTS,
    MODEL_COUNT,
};
use crate::workload::{Job, JobClass, MemoryEstimator, MemoryGrowth, PowerModel};

/// Total order on times (all finite here).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct T(pub(crate) f64);
impl Eq for T {}
impl PartialOrd for T {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for T {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

const EV_COMPLETION: u8 = 0;
const EV_RECONFIG_DONE: u8 = 1;
const EV_TICK: u8 = 2;
mod gang;

const NONE: u32 = u32::MAX;
/// Classes per model slot in the class index (a model has at most 8 profiles).
const CLASS_STRIDE: usize = 8;

/// A heap entry: (time, kind, sequence number, gpu, placement).
type Ev = Reverse<(T, u8, u64, u32, u8)>;

/// One (model, profile) pair present in the cluster.
struct Class {
    model: GpuModel,
    profile: &'static ProfileSpec,
    total: u8,
    profile_index: usize,
}

struct Bucket {
    mask: u64,
    heap: BinaryHeap<Reverse<(T, u32)>>,
}

/// Engine-side state of one GPU (the policy-visible part is in `status`).
struct GpuRt {
    slot: usize,
    total: u8,
    active: u32,
    energy: f64,
    last: f64,
    job_on: [u32; MAX_PLACEMENTS],
    /// Kind of the reconfiguration that created each existing instance
    /// (`Reshape` also for the initial ones): a job completing on a
    /// fusion's or fission's instance counts as served by it.
    origin: [ReconfigKind; MAX_PLACEMENTS],
}

/// Key of the simulator's memory estimates: (class, template), template
/// `u32::MAX` when the job has none (one key per class then).
type SimKey = (u8, u32);

/// Jobs of one fit mask tried per round when served on demand before the
/// mask waits for the next event (see [`Engine::serve_on_demand`]).
const BACKFILL_DEPTH: usize = 16;

fn sim_key(j: &Job) -> SimKey {
    let class = match j.class {
        JobClass::Training => 0,
        JobClass::Inference => 1,
    };
    (class, j.template.unwrap_or(u32::MAX))
}

/// State of the out-of-memory mode ([`SimConfig::oom`]).
struct OomState {
    cfg: OomConfig,
    /// Runs ended so far by an OOM failure or an early restart, per job
    /// index (what `max_retries` bounds).
    failures: Vec<u32>,
    /// Whether the job's current run ends in an early restart (set at its
    /// start, read at its end).
    early: Vec<bool>,
    /// Memory the scheduler asks for, per job index (declaration, estimate,
    /// raised after each failure).
    asked: Vec<f64>,
    estimator: Option<MemoryEstimator<SimKey>>,
    /// Largest profile memory in the cluster (cap of the estimates).
    cap_gb: f64,
}

impl OomState {
    /// The mode's state at t = 0 for `n` jobs; the estimates are capped at
    /// the largest profile memory of the cluster's `classes`.
    fn new(o: &OomConfig, n: usize, classes: &[Option<Class>]) -> OomState {
        OomState {
            cfg: o.clone(),
            failures: vec![0; n],
            early: vec![false; n],
            asked: vec![0.0; n],
            estimator: o
                .estimate
                .clone()
                .and_then(|e| MemoryEstimator::new(e).ok()),
            cap_gb: classes
                .iter()
                .flatten()
                .map(|c| f64::from(c.profile.memory_gb))
                .fold(0.0, f64::max),
        }
    }
}

/// The result of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimResult {
    pub metrics: Metrics,
    pub placement: String,
    pub policy: String,
}

/// Options that do not change the outcome.
#[derive(Default)]
pub struct RunHooks<'a> {
    /// Receives every record of the event log.
    pub sink: Option<&'a mut dyn EventSink>,
    /// Called with the number of jobs started so far, every 65 536 starts.
    pub progress: Option<&'a mut dyn FnMut(u64)>,
}

/// The central engine's run of `jobs` ([`super::simulate`] picks it
/// unless the Slurm-like mode serves the policy; it has checked `cfg` and
/// that the cluster has GPUs).
pub(super) fn simulate_central(
    cluster: &[GpuModel],
    jobs: &[Job],
    heuristic: &mut dyn PlacementHeuristic,
    policy: &mut dyn RepartitionPolicy,
    cfg: &SimConfig,
    hooks: RunHooks<'_>,
) -> Result<SimResult, SimError> {
    let mut engine = Engine::new(cluster, jobs, cfg, policy)?;
    engine.run(heuristic, policy, hooks)
}

struct Engine<'j> {
    cfg: SimConfig,
    jobs: &'j [Job],
    order: Vec<u32>,
    models: Vec<GpuModel>,
    powers: Vec<PowerModel>,
    classes: Vec<Option<Class>>,
    fit_mask: Vec<u64>,
    /// Jobs that fit no class: (job index, reason).
    rejected: Vec<(u32, String)>,
    status: Vec<GpuStatus>,
    rt: Vec<GpuRt>,
    free: Vec<BTreeSet<(u32, u8)>>,
    free_mask: u64,
    buckets: Vec<Bucket>,
    bucket_of: HashMap<u64, usize>,
    pending: Vec<PendingJob>,
    /// Job index of each entry of `pending`.
    pending_idx: Vec<u32>,
    pending_pos: Vec<u32>,
    pending_by_profile: PendingByProfile,
    /// Jobs that arrived since the last decision epoch (the view's
    /// `arrivals`).
    arrived: Vec<PendingJob>,
    heap: BinaryHeap<Ev>,
    seq: u64,
    now: f64,
    m: Metrics,
    wait_sum: f64,
    /// Wait of every started job, s (for the 95th percentile).
    waits: Vec<f32>,
    /// Sum of the bounded slowdowns of the started jobs.
    slowdown_sum: f64,
    busy_slice_s: f64,
    in_reconfig: usize,
    running: usize,
    /// Compute slices of every GPU, and of the busy instances (the
    /// placement context's load).
    total_compute: u32,
    busy_compute: u32,
    cand_buf: Vec<Candidate>,
    oom: Option<OomState>,
    /// Serve a waiting job on demand as smartmigd's allocate would
    /// ([`Engine::serve_on_demand`]): set for policies smartmig runs
    /// ([`RepartitionPolicy::served_through_shards`]); the opponents that
    /// stand for a site without smartmig wait for a matching slot, as Slurm
    /// with fixed GRES types would.
    on_demand: bool,
    /// Slurm's backfill reservation for the first waiting job
    /// ([`Engine::reserve`]); on-demand mode only.
    reservation: Option<Reservation>,
    /// Waiting and running gang jobs ([`gang`]).
    gangs: gang::Gangs,
}

/// The first waiting job's reservation, as Slurm's backfill scheduler makes
/// one (issue 55): the GPU where the job's instance can be built soonest,
/// and when. Until then another job may start there only if it ends by
/// then, so a stream of small jobs cannot keep a big one waiting forever.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Reservation {
    job: u32,
    gpu: usize,
    at: f64,
}

impl<'j> Engine<'j> {
    fn new(
        cluster: &[GpuModel],
        jobs: &'j [Job],
        cfg: &SimConfig,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<Self, SimError> {
        if jobs.len() >= NONE as usize {
            return Err(SimError::TooManyJobs(jobs.len()));
        }
        let models = GpuModel::distinct(cluster);
        let mut powers = Vec::with_capacity(models.len());
        for &model in &models {
            let p = cfg.power_for(model);
            p.validate()
                .map_err(|e| SimError::Power { model, source: e })?;
            powers.push(p);
        }
        let mut classes: Vec<Option<Class>> = Vec::new();
        for (slot, &model) in models.iter().enumerate() {
            let spec = model.spec();
            classes.resize_with((slot + 1) * CLASS_STRIDE, || None);
            for (pi, profile) in spec.profiles.iter().enumerate() {
                classes[slot * CLASS_STRIDE + pi] = Some(Class {
                    model,
                    profile,
                    total: spec.compute_slices,
                    profile_index: pi,
                });
            }
        }
        let mut order: Vec<u32> = (0..jobs.len() as u32).collect();
        for j in jobs {
            check_job(j)?;
        }
        order.sort_by(|&a, &b| {
            let (ja, jb) = (&jobs[a as usize], &jobs[b as usize]);
            ja.arrival.total_cmp(&jb.arrival).then(ja.id.cmp(&jb.id))
        });
        let on_demand = cfg.serve_on_demand && policy.served_through_shards();
        let (fit_mask, rejected) = fit_masks(cluster, &models, &classes, jobs, cfg, on_demand);
        let oom = cfg
            .oom
            .as_ref()
            .map(|o| OomState::new(o, jobs.len(), &classes));
        let (status, rt, free, free_mask) = initial_gpus(cluster, &models, classes.len(), policy)?;
        Ok(Engine {
            cfg: cfg.clone(),
            jobs,
            order,
            models,
            powers,
            classes,
            fit_mask,
            rejected,
            status,
            rt,
            free,
            free_mask,
            buckets: Vec::new(),
            bucket_of: HashMap::new(),
            pending: Vec::new(),
            pending_idx: Vec::new(),
            pending_pos: vec![NONE; jobs.len()],
            pending_by_profile: PendingByProfile::default(),
            arrived: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0.0,
            m: Metrics {
                jobs: jobs.len() as u64,
                ..Metrics::default()
            },
            wait_sum: 0.0,
            waits: Vec::with_capacity(jobs.len()),
            slowdown_sum: 0.0,
            busy_slice_s: 0.0,
            in_reconfig: 0,
            running: 0,
            total_compute: cluster
                .iter()
                .map(|m| u32::from(m.spec().compute_slices))
                .sum(),
            busy_compute: 0,
            cand_buf: Vec::with_capacity(64),
            oom,
            on_demand,
            reservation: None,
            gangs: gang::Gangs::default(),
        })
    }

    fn push(&mut self, t: f64, kind: u8, gpu: u32, pid: u8) {
        self.seq += 1;
        self.heap.push(Reverse((T(t), kind, self.seq, gpu, pid)));
    }

    fn header(&self, heuristic: &dyn PlacementHeuristic, policy: &str) -> Header {
        Header {
            version: EVENTS_VERSION,
            seed: self.cfg.seed,
            placement: heuristic.name().to_string(),
            policy: policy.to_string(),
            reconfig_time_s: self.cfg.reconfig_time_s,
            workload_horizon_s: self.workload_horizon(),
            gpus: self
                .status
                .iter()
                .map(|s| GpuHeader {
                    model: s.model,
                    compute_slices: s.model.spec().compute_slices,
                    initial: s.geometry.describe(s.layout),
                })
                .collect(),
            power: self
                .models
                .iter()
                .zip(&self.powers)
                .map(|(&model, &power)| ModelPower { model, power })
                .collect(),
            oom: self.oom.as_ref().map(|o| OomHeader {
                fail_fraction: o.cfg.fail_fraction,
                max_retries: o.cfg.max_retries,
                early_restart: o.cfg.early_restart,
                sample_s: o.cfg.early_restart.map(|_| o.cfg.sample_s),
            }),
        }
    }

    fn workload_horizon(&self) -> f64 {
        self.cfg.workload_horizon_s.unwrap_or_else(|| {
            self.order
                .last()
                .map_or(0.0, |&i| self.jobs[i as usize].arrival)
        })
    }

    fn run(
        &mut self,
        heuristic: &mut dyn PlacementHeuristic,
        policy: &mut dyn RepartitionPolicy,
        mut hooks: RunHooks<'_>,
    ) -> Result<SimResult, SimError> {
        let policy_name = policy.name();
        if let Some(sink) = hooks.sink.as_deref_mut() {
            sink.record(&Record::Header(self.header(heuristic, &policy_name)))?;
        }
        if let EpochRule::Seconds(s) = self.cfg.epoch {
            self.push(s, EV_TICK, 0, 0);
        }
        let mut next_arrival = 0usize;
        let mut since_epoch = 0u32;
        let mut quiet_epochs = 0u32;
        let mut started_at_quiet = u64::MAX;
        loop {
            let th = self.heap.peek().map(|Reverse((t, ..))| t.0);
            let ta = self
                .order
                .get(next_arrival)
                .map(|&i| self.jobs[i as usize].arrival);
            let now = match (th, ta) {
                (None, None) => {
                    // Quiet: nothing runs or arrives. Give the policy a chance
                    // to unblock waiting jobs; stop when it does not (or keeps
                    // reshaping without starting anything).
                    if self.pending.is_empty() {
                        break;
                    }
                    let progress = self.m.completed
                        + self.m.oom_failures
                        + self.m.early_restarts
                        + self.running as u64;
                    if started_at_quiet == progress {
                        quiet_epochs += 1;
                    } else {
                        quiet_epochs = 0;
                        started_at_quiet = progress;
                    }
                    if quiet_epochs >= 8 || self.epoch(policy, &mut hooks)? == 0 {
                        break;
                    }
                    continue;
                }
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (Some(a), Some(b)) => a.min(b),
            };
            self.now = now;
            let mut epoch_due = false;
            while let Some(&Reverse((T(t), kind, _, gpu, pid))) = self.heap.peek() {
                if t != now {
                    break;
                }
                self.heap.pop();
                self.m.events += 1;
                match kind {
                    EV_COMPLETION => {
                        self.complete(gpu as usize, SpotId(pid), heuristic);
                        since_epoch += 1;
                    }
                    EV_RECONFIG_DONE => self.reconfig_done(gpu as usize, &mut hooks)?,
                    _ => {
                        epoch_due = true;
                        if let EpochRule::Seconds(s) = self.cfg.epoch {
                            let active = next_arrival < self.order.len()
                                || self.running > 0
                                || self.in_reconfig > 0;
                            if active {
                                self.push(now + s, EV_TICK, 0, 0);
                            }
                        }
                    }
                }
            }
            while let Some(&i) = self.order.get(next_arrival) {
                if self.jobs[i as usize].arrival != now {
                    break;
                }
                next_arrival += 1;
                self.m.events += 1;
                since_epoch += 1;
                self.arrive(i, heuristic);
            }
            self.serve_gangs(&mut hooks)?;
            self.reserve();
            // Served on demand, waiting jobs are taken in priority order,
            // each reusing an idle instance or having one built, as Slurm
            // offers a freed GPU's shards to the first job that fits them
            // (a whole-GPU job of later deadline took every freed whole GPU
            // before); `dispatch` then backfills what the first ones left.
            self.serve_on_demand(&mut hooks)?;
            self.dispatch(heuristic, &mut hooks)?;
            if let EpochRule::Events(e) = self.cfg.epoch {
                if since_epoch >= e {
                    epoch_due = true;
                }
            }
            if epoch_due {
                since_epoch = 0;
                self.epoch(policy, &mut hooks)?;
            }
        }
        self.finish(&mut hooks)?;
        Ok(SimResult {
            metrics: self.m.clone(),
            placement: heuristic.name().to_string(),
            policy: policy_name,
        })
    }

    fn arrive(&mut self, i: u32, heuristic: &dyn PlacementHeuristic) {
        let mask = self.fit_mask[i as usize];
        if mask == 0 {
            return; // rejected at load
        }
        if self.oom.is_some() {
            let asked = self.asked_memory(i);
            let (k, exact) = request(&self.jobs[i as usize], self.cfg.exact_size);
            if let Some(o) = self.oom.as_mut() {
                o.asked[i as usize] = asked;
            }
            let job = &self.jobs[i as usize];
            let mask = fit_mask_of(&self.classes, job, asked, k, exact, self.on_demand);
            self.fit_mask[i as usize] = mask;
            if mask == 0 {
                let reason = format!(
                    "fits no instance of any GPU in the cluster (needs {k} compute slices and {asked} GB)"
                );
                self.rejected.push((i, reason));
                return;
            }
        }
        if self.jobs[i as usize].is_gang() {
            self.enqueue_gang(i);
        } else {
            self.enqueue(i, heuristic);
        }
        if let Some(p) = self.pending.last() {
            self.arrived.push(*p);
        }
    }

    /// What the scheduler asks for in the OOM mode: the declaration; for a
    /// job that declared nothing, the learned estimate if any, else 0 (any
    /// instance; best-fit heuristics then take the smallest).
    fn asked_memory(&self, i: u32) -> f64 {
        let j = &self.jobs[i as usize];
        match j.declared_memory_gb {
            None => j.memory_gb,
            Some(d) if d > 0.0 => d,
            Some(_) => self
                .oom
                .as_ref()
                .and_then(|o| {
                    o.estimator
                        .as_ref()
                        .and_then(|e| e.estimate(&sim_key(j), o.cap_gb))
                })
                .unwrap_or(0.0),
        }
    }

    /// The job as the scheduler sees it: in the OOM mode its memory is what
    /// was asked, not the true need (a copy; no allocation).
    fn seen_job(&self, i: u32) -> std::borrow::Cow<'j, Job> {
        let jobs: &'j [Job] = self.jobs;
        let j = &jobs[i as usize];
        match &self.oom {
            Some(o) => std::borrow::Cow::Owned(Job {
                memory_gb: o.asked[i as usize],
                ..j.clone()
            }),
            None => std::borrow::Cow::Borrowed(j),
        }
    }

    /// Puts job `i` in the waiting queue with its current fit mask.
    fn enqueue(&mut self, i: u32, heuristic: &dyn PlacementHeuristic) {
        let mask = self.fit_mask[i as usize];
        let job = self.seen_job(i);
        let job = job.as_ref();
        let b = match self.bucket_of.get(&mask) {
            Some(&b) => b,
            None => {
                self.buckets.push(Bucket {
                    mask,
                    heap: BinaryHeap::new(),
                });
                self.bucket_of.insert(mask, self.buckets.len() - 1);
                self.buckets.len() - 1
            }
        };
        self.buckets[b]
            .heap
            .push(Reverse((T(heuristic.priority(job)), i)));
        self.push_pending(i);
    }

    /// Adds job `i` to the waiting list the policy sees, with the smallest
    /// shape per model its fit mask allows.
    fn push_pending(&mut self, i: u32) {
        let mask = self.fit_mask[i as usize];
        // Policy-visible summary: smallest fitting shape per model present.
        let mut shapes: [Option<Shape>; MODEL_COUNT] = [None; MODEL_COUNT];
        let mut best: [Option<(Shape, usize)>; MODEL_COUNT] = [None; MODEL_COUNT];
        let mut bits = mask;
        while bits != 0 {
            let c = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(cl) = &self.classes[c] {
                let slot = &mut best[cl.model as usize];
                if slot.is_none_or(|(s, _)| cl.profile.shape < s) {
                    *slot = Some((cl.profile.shape, cl.profile_index));
                }
            }
        }
        for (mi, b) in best.iter().enumerate() {
            if let Some((s, pi)) = b {
                shapes[mi] = Some(*s);
                self.pending_by_profile[mi][*pi] += 1;
            }
        }
        self.pending_pos[i as usize] = self.pending.len() as u32;
        self.pending_idx.push(i);
        let job = self.seen_job(i);
        self.pending.push(PendingJob::of(job.as_ref(), shapes));
    }

    /// Starts waiting jobs while a free instance fits one: the job with the
    /// smallest priority key among those that fit a free class, on the
    /// class the heuristic picks. A job the heuristic defers waits until
    /// the others of this round are placed, then is offered again (without
    /// the choice to defer), so deferring never leaves an instance idle.
    fn dispatch(
        &mut self,
        heuristic: &mut dyn PlacementHeuristic,
        hooks: &mut RunHooks<'_>,
    ) -> Result<(), SimError> {
        let mut deferred: Vec<(T, u32, usize)> = Vec::new();
        // Jobs the reservation keeps off its GPU this round.
        let mut held: Vec<(T, u32, usize)> = Vec::new();
        let mut may_defer = true;
        loop {
            let mut best: Option<(T, u32, usize)> = None;
            if self.free_mask != 0 {
                for (bi, b) in self.buckets.iter().enumerate() {
                    if b.mask & self.free_mask == 0 {
                        continue;
                    }
                    if let Some(&Reverse((k, i))) = b.heap.peek() {
                        if best.is_none_or(|(bk, bj, _)| (k, i) < (bk, bj)) {
                            best = Some((k, i, bi));
                        }
                    }
                }
            }
            let Some((key, i, bi)) = best else {
                if deferred.is_empty() || self.free_mask == 0 {
                    break;
                }
                // Second pass: the deferred jobs, in their order, may no
                // longer defer.
                for (k, j, b) in deferred.drain(..) {
                    self.buckets[b].heap.push(Reverse((k, j)));
                }
                may_defer = false;
                continue;
            };
            self.buckets[bi].heap.pop();
            let mut bits = self.buckets[bi].mask & self.free_mask;
            self.cand_buf.clear();
            while bits != 0 {
                let c = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(cl) = &self.classes[c] {
                    self.cand_buf.push(Candidate {
                        class: c as u16,
                        model: cl.model,
                        compute: cl.profile.shape.compute,
                        total_compute: cl.total,
                        memory_gb: cl.profile.memory_gb,
                        profile_index: cl.profile_index as u8,
                        free: self.free[c].len() as u32,
                    });
                }
            }
            let job = self.seen_job(i);
            let ctx = PlacementContext {
                now: self.now,
                gpus: self.status.len(),
                total_compute: self.total_compute,
                busy_compute: self.busy_compute,
                waiting: &self.pending,
                pending_by_profile: &self.pending_by_profile,
                may_defer,
            };
            let pick = heuristic.choose_in(job.as_ref(), &self.cand_buf, &ctx);
            if pick.defer && may_defer {
                deferred.push((key, i, bi));
                continue;
            }
            let c = self.cand_buf[pick.candidate.min(self.cand_buf.len() - 1)].class as usize;
            let hint = pick.gpu_hint % self.status.len() as u32;
            let set = &self.free[c];
            let compute = self.classes[c]
                .as_ref()
                .map_or(1, |cl| cl.profile.shape.compute);
            let may = |gpu: u32| self.may_start_on(i, gpu as usize, compute);
            let Some(&(gpu, pid)) = set
                .range((hint, 0)..)
                .find(|(g, _)| may(*g))
                .or_else(|| set.iter().find(|(g, _)| may(*g)))
            else {
                // Only the reserved GPU has such an instance, and the job
                // would still run there when the reservation starts.
                held.push((key, i, bi));
                continue;
            };
            self.start(i, gpu as usize, SpotId(pid), c, hooks)?;
        }
        for (k, j, b) in deferred.into_iter().chain(held) {
            self.buckets[b].heap.push(Reverse((k, j)));
        }
        Ok(())
    }

    /// Whether job `i` may start on `gpu` on an instance of `compute`
    /// slices now: anywhere but the reserved GPU; there, the reserved job,
    /// or one that ends before the reservation starts (backfill).
    fn may_start_on(&self, i: u32, gpu: usize, compute: u8) -> bool {
        let run_s = self.jobs[i as usize].runtime_on(compute, self.rt[gpu].total);
        let reserved = match self.reservation {
            Some(r) if r.gpu == gpu && r.job != i => self.now + run_s <= r.at,
            _ => true,
        };
        reserved && self.gang_allows(gpu, run_s)
    }

    /// Slurm's backfill reservation ([`Reservation`]) for the first waiting
    /// job (smallest priority key): the GPU where the profile it asks for
    /// can be built soonest, by destroying idle instances once the busy
    /// ones in the way have ended (run ends are known exactly here), and
    /// where the head gang job's reservation lets it run
    /// ([`Engine::after_gang`]). Without that last part a long job reserved
    /// a GPU the gang had reserved before it, could not start there, and
    /// kept every other job off it until the gang ran: GPUs idled for
    /// hours with jobs waiting (Alibaba v2023 window 130, 16 % more
    /// tardiness than whole GPUs).
    fn reserve(&mut self) {
        self.reservation = None;
        if !self.on_demand {
            return;
        }
        let first = self
            .buckets
            .iter()
            .filter_map(|b| b.heap.peek().map(|&Reverse(ki)| ki))
            .min();
        let Some((_, i)) = first else {
            return;
        };
        let job = self.seen_job(i);
        let asked = self.asked_per_model(&job);
        let mut best: Option<(f64, usize)> = None;
        for (gpu, st) in self.status.iter().enumerate() {
            let Some(p) = asked[st.model as usize] else {
                continue;
            };
            let run_s =
                self.cfg.reconfig_time_s + job.runtime_on(p.shape.compute, self.rt[gpu].total);
            let at = self
                .buildable_at(gpu, p.shape)
                .map(|at| self.after_gang(gpu, at, run_s));
            if let Some(at) = at {
                if best.is_none_or(|b| at < b.0) {
                    best = Some((at, gpu));
                }
                if at <= self.now {
                    break; // nothing is sooner than now
                }
            }
        }
        self.reservation = best.map(|(at, gpu)| Reservation { job: i, gpu, at });
    }

    /// The profile `job` asks for on each model of the cluster
    /// ([`super::asked_profile`]), computed once per model rather than per
    /// GPU: on 1,000 GPUs the per-GPU calls made the on-demand engine 500
    /// times slower than `none` (`smartmig bench sim`).
    fn asked_per_model(&self, job: &Job) -> [Option<&'static ProfileSpec>; MODEL_COUNT] {
        let mut out = [None; MODEL_COUNT];
        for &m in &self.models {
            out[m as usize] = super::asked_profile(job, m);
        }
        out
    }

    /// When an instance of `shape` can be built on `gpu`: now (or when its
    /// reconfiguration ends), else at the end of the busy instance after
    /// which the rest leave room; `None` if never.
    fn buildable_at(&self, gpu: usize, shape: Shape) -> Option<f64> {
        let st = &self.status[gpu];
        let g = st.geometry;
        let mut held = st.busy.union(st.reconfiguring);
        let mut at = if st.in_reconfiguration {
            self.now.max(st.reconfig_until)
        } else {
            self.now
        };
        if g.candidates(held, shape).next().is_some() {
            return Some(at);
        }
        // On the stack: this runs for many GPUs at every event while a big
        // job waits.
        let mut ends = [(0.0_f64, SpotId(0)); MAX_PLACEMENTS];
        let mut n = 0;
        for id in st.busy.iter() {
            ends[n] = (st.busy_until[id.0 as usize], id);
            n += 1;
        }
        let ends = &mut ends[..n];
        ends.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for &(end, id) in ends.iter() {
            held = held.without(id);
            at = at.max(end);
            if g.candidates(held, shape).next().is_some() {
                return Some(at);
            }
        }
        None
    }

    fn take_free(&mut self, c: usize, gpu: usize, pid: SpotId) {
        self.free[c].remove(&(gpu as u32, pid.0));
        if self.free[c].is_empty() {
            self.free_mask &= !(1 << c);
        }
    }

    fn put_free(&mut self, c: usize, gpu: usize, pid: SpotId) {
        self.free[c].insert((gpu as u32, pid.0));
        self.free_mask |= 1 << c;
    }

    fn charge(&mut self, gpu: usize) {
        let r = &mut self.rt[gpu];
        let load = f64::from(r.active) / f64::from(r.total);
        r.energy += self.powers[r.slot].power_w(load) * (self.now - r.last);
        r.last = self.now;
    }

    fn start(
        &mut self,
        i: u32,
        gpu: usize,
        pid: SpotId,
        class: usize,
        hooks: &mut RunHooks<'_>,
    ) -> Result<(), SimError> {
        self.take_free(class, gpu, pid);
        self.remove_pending_at(i);
        self.run_job(i, gpu, pid, hooks)
    }

    /// Runs job `i` (no longer waiting) on ready instance `pid` of `gpu`.
    fn run_job(
        &mut self,
        i: u32,
        gpu: usize,
        pid: SpotId,
        hooks: &mut RunHooks<'_>,
    ) -> Result<(), SimError> {
        let jobs: &'j [Job] = self.jobs;
        let job = &jobs[i as usize];
        let total = self.rt[gpu].total;
        let placement = *self.status[gpu].geometry.spot(pid);
        let compute = placement.compute();
        let speed = job.speed(compute, total);
        let end = self.now + job.work / speed;
        self.charge(gpu);
        self.rt[gpu].active += u32::from(compute);
        self.busy_compute += u32::from(compute);
        self.rt[gpu].job_on[pid.0 as usize] = i;
        let st = &mut self.status[gpu];
        st.busy = st.busy.with(pid);
        // The scheduler expects the full run even if it will fail.
        st.busy_until[pid.0 as usize] = end;
        self.running += 1;
        let first_piece = self.gangs.left.started(i, job.is_gang());
        if !job.is_gang() && self.oom_run_fails(i, gpu, pid, speed, hooks)? {
            return Ok(());
        }
        self.push(end, EV_COMPLETION, gpu as u32, pid.0);
        self.busy_slice_s += f64::from(compute) * (end - self.now);
        if let Some(sink) = hooks.sink.as_deref_mut() {
            let run = run_record(job, gpu, &placement, speed, self.now);
            sink.record(&Record::Job(JobRecord { run, end }))?;
        }
        // Per instance: each piece of a gang job counts.
        match self.rt[gpu].origin[pid.0 as usize] {
            ReconfigKind::Fusion => self.m.jobs_served_by_fusion += 1,
            ReconfigKind::Fission => self.m.jobs_served_by_fission += 1,
            ReconfigKind::Reshape => {}
        }
        if !first_piece {
            return Ok(());
        }
        // Metrics are settled at start (a gang job's at its first piece):
        // without preemption the end is known.
        let tardiness = (end - job.deadline).max(0.0);
        self.m.total_tardiness_s += tardiness;
        if end > job.deadline {
            self.m.late_jobs += 1;
        }
        let wait = self.now - job.arrival;
        self.wait_sum += wait;
        self.waits.push(wait as f32);
        self.slowdown_sum += bounded_slowdown(job.arrival, self.now, end);
        self.m.last_completion_s = self.m.last_completion_s.max(end);
        let started = self.m.completed + self.running as u64;
        if started.is_multiple_of(65_536) {
            if let Some(p) = hooks.progress.as_deref_mut() {
                p(started);
            }
        }
        Ok(())
    }

    /// The out-of-memory mode's watch over the run of job `i` that starts
    /// now on `pid` of `gpu` at `speed`: when it fails (out of memory) or is
    /// restarted early, its end is scheduled, the burnt time counted and
    /// true returned; nothing is settled but that. False outside the mode
    /// or for a run that will complete.
    fn oom_run_fails(
        &mut self,
        i: u32,
        gpu: usize,
        pid: SpotId,
        speed: f64,
        hooks: &mut RunHooks<'_>,
    ) -> Result<bool, SimError> {
        let jobs: &'j [Job] = self.jobs;
        let job = &jobs[i as usize];
        let total = self.rt[gpu].total;
        let placement = *self.status[gpu].geometry.spot(pid);
        let compute = placement.compute();
        let Some(o) = self.oom.as_mut() else {
            return Ok(false);
        };
        let inst = f64::from(placement.profile.memory_gb);
        let run_s = job.work / speed;
        let growth = job
            .memory_growth
            .unwrap_or_else(|| MemoryGrowth::step_at(o.cfg.fail_fraction));
        // Every run is watched, fitting or not: a restart of a fitting
        // one is a false early restart. The rule fires strictly before
        // the failure or the end, and only where a restart can help: a
        // larger memory size exists and a restart is left (else the run
        // goes on, and fails or completes).
        let may_restart = inst < o.cap_gb && o.failures[i as usize] < o.cfg.max_retries;
        let early = o
            .cfg
            .early_restart
            .filter(|_| may_restart)
            .and_then(|r| r.first_restart(&growth, job.memory_gb, inst, run_s, o.cfg.sample_s));
        let crossing = growth.crossing(job.memory_gb, inst);
        let fail = match early {
            Some(t) => Some(self.now + t),
            None => crossing.map(|p| self.now + p * run_s),
        };
        if let Some(fail) = fail {
            // The run ends before its work is done: nothing is settled
            // but the burnt time; `complete` requeues the job.
            let (attempt, asked) = (o.failures[i as usize] + 1, o.asked[i as usize]);
            o.early[i as usize] = early.is_some();
            self.push(fail, EV_COMPLETION, gpu as u32, pid.0);
            self.busy_slice_s += f64::from(compute) * (fail - self.now);
            let lost = f64::from(compute) / f64::from(total) * (fail - self.now);
            if early.is_some() {
                self.m.early_restarts += 1;
                self.m.early_restart_lost_gpu_s += lost;
                match crossing {
                    None => {
                        self.m.false_early_restarts += 1;
                        self.m.false_early_restart_lost_gpu_s += lost;
                    }
                    Some(p) => {
                        // What this run would have burnt more had it
                        // run on to its failure.
                        self.m.early_restart_saved_gpu_s +=
                            f64::from(compute) / f64::from(total) * (self.now + p * run_s - fail);
                    }
                }
            } else {
                self.m.oom_lost_gpu_s += lost;
            }
            self.m.last_completion_s = self.m.last_completion_s.max(fail);
            if let Some(sink) = hooks.sink.as_deref_mut() {
                let run = run_record(job, gpu, &placement, speed, self.now);
                sink.record(&Record::Oom(OomRecord {
                    run,
                    asked_memory_gb: asked,
                    fail,
                    attempt,
                    memory_growth: job.memory_growth,
                    early: early.is_some(),
                }))?;
            }
            return Ok(true);
        }
        Ok(false)
    }

    fn remove_pending_at(&mut self, i: u32) {
        let pos = self.pending_pos[i as usize] as usize;
        let p = self.pending.swap_remove(pos);
        self.pending_pos[i as usize] = NONE;
        self.pending_idx.swap_remove(pos);
        if let Some(&moved) = self.pending_idx.get(pos) {
            self.pending_pos[moved as usize] = pos as u32;
        }
        for (mi, s) in p.shapes.iter().enumerate() {
            if let Some(shape) = s {
                let profiles = GpuModel::ALL[mi].spec().profiles;
                if let Some(pi) = profiles.iter().position(|x| x.shape == *shape) {
                    self.pending_by_profile[mi][pi] -= 1;
                }
            }
        }
    }

    fn complete(&mut self, gpu: usize, pid: SpotId, heuristic: &dyn PlacementHeuristic) {
        self.charge(gpu);
        let g = self.status[gpu].geometry;
        let placement = g.spot(pid);
        let compute = placement.compute();
        let i = self.rt[gpu].job_on[pid.0 as usize];
        self.rt[gpu].active -= u32::from(compute);
        self.busy_compute -= u32::from(compute);
        self.rt[gpu].job_on[pid.0 as usize] = NONE;
        let st = &mut self.status[gpu];
        st.busy = st.busy.without(pid);
        self.running -= 1;
        let c = class_of(g, self.rt[gpu].slot, pid);
        self.put_free(c, gpu, pid);
        if self.jobs[i as usize].is_gang() {
            // Gang jobs never run out of memory: each piece has a whole GPU.
            if self.gangs.left.ended(i) {
                self.m.completed += 1;
            }
        } else if self.oom.is_some() {
            self.oom_outcome(i, placement.profile.memory_gb, heuristic);
        } else {
            self.m.completed += 1;
        }
    }

    /// The end of a run in the OOM mode: a completion teaches the estimator
    /// the job's peak; a failure teaches it a lower bound and requeues the
    /// job asking for the next larger memory size in the cluster (the
    /// placement and repartitioning paths then find or make such an
    /// instance), or gives it up after `max_retries` restarts.
    fn oom_outcome(&mut self, i: u32, instance_gb: u32, heuristic: &dyn PlacementHeuristic) {
        let jobs: &'j [Job] = self.jobs;
        let job = &jobs[i as usize];
        let Some(o) = self.oom.as_mut() else { return };
        let key = sim_key(job);
        let inst = f64::from(instance_gb);
        let early = std::mem::take(&mut o.early[i as usize]);
        if !early && inst >= job.memory_gb {
            self.m.completed += 1;
            if let Some(e) = o.estimator.as_mut() {
                // Values are finite (checked at load), so this cannot fail.
                let _ = e.record_completion(key, job.memory_gb, inst);
            }
            return;
        }
        o.failures[i as usize] += 1;
        if !early {
            // An early restart is a prediction, not a bound: the estimator
            // learns only from real failures.
            self.m.oom_failures += 1;
            if let Some(e) = o.estimator.as_mut() {
                let _ = e.record_oom(key, inst);
            }
        }
        let failures = o.failures[i as usize];
        // The next larger memory size present in the cluster (by GB, so in
        // a mixed cluster another model's profile may serve it).
        let next = self
            .classes
            .iter()
            .flatten()
            .map(|c| c.profile.memory_gb)
            .filter(|&m| m > instance_gb)
            .min();
        let (k, exact) = request(job, self.cfg.exact_size);
        let reason = match next {
            _ if failures > o.cfg.max_retries => Some(format!(
                "{} {failures} times (last on {instance_gb} GB; needs {} GB), more than {} restarts",
                if early {
                    "out of memory or restarted early"
                } else {
                    "out of memory"
                },
                job.memory_gb,
                o.cfg.max_retries
            )),
            None => Some(format!(
                "{} on the largest instance ({instance_gb} GB; needs {} GB)",
                if early {
                    "restarted early"
                } else {
                    "out of memory"
                },
                job.memory_gb
            )),
            Some(m) => {
                let asked = o.asked[i as usize].max(f64::from(m));
                o.asked[i as usize] = asked;
                let mask = fit_mask_of(&self.classes, job, asked, k, exact, self.on_demand);
                self.fit_mask[i as usize] = mask;
                (mask == 0).then(|| format!("no instance with {asked} GB after out of memory"))
            }
        };
        match reason {
            Some(r) => {
                self.m.oom_rejected += 1;
                self.rejected.push((i, r));
            }
            None => self.enqueue(i, heuristic),
        }
    }

    /// Counts one applied reconfiguration by its kind.
    fn count_kind(&mut self, kind: ReconfigKind) {
        match kind {
            ReconfigKind::Fusion => self.m.fusions += 1,
            ReconfigKind::Fission => self.m.fissions += 1,
            ReconfigKind::Reshape => self.m.reshapes += 1,
        }
    }

    /// The end of a reconfiguration: its instances are ready; one built on
    /// demand for a job runs it, the others are free.
    fn reconfig_done(&mut self, gpu: usize, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        let st = &mut self.status[gpu];
        let created = st.reconfiguring;
        st.reconfiguring = Layout::EMPTY;
        st.in_reconfiguration = false;
        self.in_reconfig -= 1;
        let g = st.geometry;
        let slot = self.rt[gpu].slot;
        for id in created.iter() {
            let on = self.rt[gpu].job_on[id.0 as usize];
            match on {
                NONE => self.put_free(class_of(g, slot, id), gpu, id),
                // A gang job's piece waits for the others (`serve_gangs`).
                _ if self.gang_piece_ready(gpu, id, hooks)? => {}
                i => self.run_job(i, gpu, id, hooks)?,
            }
        }
        Ok(())
    }

    /// smartmigd's on-demand rule (issue 54): a waiting job that no free
    /// instance fits gets one built for it, as an allocate would build it
    /// ([`Geometry::serve`]: create in free space, else re-shape idle
    /// instances, never a busy one), and runs when it is ready. Jobs are
    /// taken in priority order; a fit mask no GPU can serve now is not
    /// tried again before the next event. The policy still decides what
    /// is prepared ahead of demand.
    fn serve_on_demand(&mut self, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        if !self.on_demand || self.pending.is_empty() {
            return Ok(());
        }
        let mut tried = vec![false; self.buckets.len()];
        // Jobs that could not be served this round, put back at the end:
        // the next ones of their fit mask are still tried (a shorter one
        // may backfill where a reservation keeps a longer one off), up to
        // `BACKFILL_DEPTH` per mask, as Slurm's backfill tests a bounded
        // number of jobs.
        let mut held: Vec<(T, u32, usize)> = Vec::new();
        let mut depth = vec![0usize; self.buckets.len()];
        let result = loop {
            let mut best: Option<(T, u32, usize)> = None;
            for (bi, b) in self.buckets.iter().enumerate() {
                if let (false, Some(&Reverse((k, i)))) = (tried[bi], b.heap.peek()) {
                    if best.is_none_or(|(bk, bj, _)| (k, i) < (bk, bj)) {
                        best = Some((k, i, bi));
                    }
                }
            }
            let Some((k, i, bi)) = best else {
                break Ok(());
            };
            match self.on_demand_way(i) {
                Some((gpu, pid, way)) => {
                    self.buckets[bi].heap.pop();
                    self.remove_pending_at(i);
                    if let Err(e) = self.build_for(i, gpu, pid, way, hooks) {
                        break Err(e);
                    }
                }
                None => {
                    depth[bi] += 1;
                    if depth[bi] >= BACKFILL_DEPTH {
                        tried[bi] = true;
                    } else {
                        self.buckets[bi].heap.pop();
                        held.push((k, i, bi));
                    }
                }
            }
        };
        for (k, i, bi) in held {
            self.buckets[bi].heap.push(Reverse((k, i)));
        }
        result
    }

    /// Where job `i` is served on demand: the first GPU (by index) that can
    /// create the profile the job asks for ([`super::asked_profile`], as in
    /// the Slurm-like engine) in free space, else the one whose re-shape
    /// destroys the fewest idle instances. GPUs in a reconfiguration wait
    /// for its end, as smartmigd's creations do.
    fn on_demand_way(&self, i: u32) -> Option<(usize, SpotId, Way)> {
        let job = self.seen_job(i);
        let asked = self.asked_per_model(&job);
        // The first GPU whose way destroys nothing, asking smartmigd's rule
        // only where one can exist: the profile fits free space, or an idle
        // instance of its compute size with the memory can be reused (the
        // conditions of `Geometry::ways_to_serve`'s reuse and create). On
        // 1,000 GPUs asking every GPU cost 7x.
        let want_gb = job.memory_gb;
        let may_cost_nothing = |gpu: usize, profile: &ProfileSpec| {
            let st = &self.status[gpu];
            let g = st.geometry;
            g.candidates(st.layout, profile.shape).next().is_some()
                || st.idle().iter().any(|id| {
                    let p = g.spot(id).profile;
                    p.shape.compute == profile.shape.compute && f64::from(p.memory_gb) >= want_gb
                })
        };
        // An idle instance anywhere is reused before anything is built
        // (a build is a reconfiguration); else the first GPU that builds
        // without destroying.
        let may_reuse = self.fit_mask[i as usize] & self.free_mask != 0;
        let mut first_build = None;
        for gpu in 0..self.status.len() {
            let Some(profile) = asked[self.status[gpu].model as usize] else {
                continue;
            };
            if !may_cost_nothing(gpu, profile) {
                continue;
            }
            if let Some((pid, way)) = self.way_on(i, &job, gpu, profile) {
                if matches!(way, Way::Reuse | Way::Lend)
                    || (!may_reuse && way.destroyed().is_empty())
                {
                    return Some((gpu, pid, way));
                }
                if first_build.is_none() && way.destroyed().is_empty() {
                    first_build = Some((gpu, pid, way));
                }
            }
        }
        if first_build.is_some() {
            return first_build;
        }
        // None: the GPU (first by index) whose way destroys the fewest.
        let mut best: Option<(usize, usize, SpotId, Way)> = None;
        for gpu in 0..self.status.len() {
            let Some(profile) = asked[self.status[gpu].model as usize] else {
                continue;
            };
            let Some((pid, way)) = self.way_on(i, &job, gpu, profile) else {
                continue;
            };
            let cost = way.destroyed().len();
            if best.is_none_or(|b| cost < b.0) {
                best = Some((cost, gpu, pid, way));
            }
        }
        best.map(|(_, gpu, pid, way)| (gpu, pid, way))
    }

    /// smartmigd's way to serve job `i` (seen as `job`) `profile` on
    /// `gpu`, if the GPU is not in a reconfiguration, has the compute
    /// slices free and the reservations allow the job there.
    fn way_on(
        &self,
        i: u32,
        job: &Job,
        gpu: usize,
        profile: &'static ProfileSpec,
    ) -> Option<(SpotId, Way)> {
        let st = &self.status[gpu];
        let r = &self.rt[gpu];
        let k = profile.shape.compute;
        if st.in_reconfiguration || u32::from(r.total) < r.active + u32::from(k) {
            return None;
        }
        // The reconfiguration counts: the instance is busy from now on.
        let run_s = self.cfg.reconfig_time_s + job.runtime_on(k, r.total);
        let reserved_ok = match self.reservation {
            Some(res) if res.gpu == gpu && res.job != i => self.now + run_s <= res.at,
            _ => true,
        };
        if !reserved_ok || !self.gang_allows(gpu, run_s) {
            return None;
        }
        let now = GpuNow {
            layout: st.layout,
            taken: st.busy.union(st.reconfiguring),
            reusable: st.idle(),
            may_build: true,
            // The central engine serves each job on its own room (its
            // free-instance buckets are per room); lending is modelled by
            // the Slurm-like engine (issue 55).
            lend: false,
        };
        st.geometry
            .serve(now, profile, job.memory_gb, &Mix::default(), None)
    }

    /// Builds `pid` on `gpu` for job `i` (after destroying the idle
    /// instances `way` names); the job runs when it is ready.
    fn build_for(
        &mut self,
        i: u32,
        gpu: usize,
        pid: SpotId,
        way: Way,
        hooks: &mut RunHooks<'_>,
    ) -> Result<(), SimError> {
        let g = self.status[gpu].geometry;
        let slot = self.rt[gpu].slot;
        if matches!(way, Way::Reuse | Way::Lend) {
            // Not reached after `dispatch` (a free instance that fits is
            // taken there); kept so that the rule's every answer is served.
            self.take_free(class_of(g, slot, pid), gpu, pid);
            return self.run_job(i, gpu, pid, hooks);
        }
        let destroy = way.destroyed();
        let create = Layout::single(pid);
        let kind = transition_kind(g, destroy, create);
        self.count_kind(kind);
        self.m.reconfigurations += 1;
        self.m.on_demand_builds += 1;
        for id in destroy.iter() {
            self.take_free(class_of(g, slot, id), gpu, id);
            self.rt[gpu].origin[id.0 as usize] = ReconfigKind::Reshape;
        }
        let rt = &mut self.rt[gpu];
        rt.origin[pid.0 as usize] = kind;
        rt.job_on[pid.0 as usize] = i;
        let ready = self.now + self.cfg.reconfig_time_s;
        let job = &self.jobs[i as usize];
        let run_s = job.work / job.speed(g.spot(pid).compute(), rt.total);
        let st = &mut self.status[gpu];
        st.layout = st.layout.minus(destroy).with(pid);
        st.busy = st.busy.with(pid);
        st.busy_until[pid.0 as usize] = ready + run_s;
        st.reconfiguring = create;
        st.in_reconfiguration = true;
        st.reconfig_until = ready;
        self.in_reconfig += 1;
        self.push(ready, EV_RECONFIG_DONE, gpu as u32, 0);
        if let Some(s) = hooks.sink.as_deref_mut() {
            s.record(&Record::Reconfig(ReconfigRecord {
                time: self.now,
                gpu,
                destroyed: g.describe(destroy),
                created: g.describe(create),
                duration: self.cfg.reconfig_time_s,
                ready,
                kind: Some(kind),
            }))?;
        }
        Ok(())
    }

    /// A decision epoch: asks the policy, applies what is acceptable.
    /// Returns the number of applied reconfigurations.
    fn epoch(
        &mut self,
        policy: &mut dyn RepartitionPolicy,
        hooks: &mut RunHooks<'_>,
    ) -> Result<u64, SimError> {
        self.m.epochs += 1;
        let view = ClusterView {
            now: self.now,
            hour_of_day: (self.cfg.start_hour + self.now / 3600.0).rem_euclid(24.0),
            gpus: &self.status,
            pending: &self.pending,
            pending_by_profile: &self.pending_by_profile,
            arrivals: &self.arrived,
        };
        let decisions = policy.decide(&view);
        self.arrived.clear();
        let mut applied = 0;
        for d in decisions {
            let Some(st) = self.status.get(d.gpu) else {
                self.m.rejected_decisions += 1;
                continue;
            };
            if d.target == st.layout {
                continue;
            }
            if !st.accepts(d.target) {
                self.m.rejected_decisions += 1;
                continue;
            }
            let g = st.geometry;
            let tr = g.transition(st.layout, d.target);
            let kind = transition_kind(g, tr.destroy, tr.create);
            self.count_kind(kind);
            let slot = self.rt[d.gpu].slot;
            for id in tr.destroy.iter() {
                self.take_free(class_of(g, slot, id), d.gpu, id);
                self.rt[d.gpu].origin[id.0 as usize] = ReconfigKind::Reshape;
            }
            for id in tr.create.iter() {
                self.rt[d.gpu].origin[id.0 as usize] = kind;
            }
            let ready = self.now + self.cfg.reconfig_time_s;
            let st = &mut self.status[d.gpu];
            st.layout = d.target;
            st.reconfiguring = tr.create;
            st.in_reconfiguration = true;
            st.reconfig_until = ready;
            self.in_reconfig += 1;
            self.push(ready, EV_RECONFIG_DONE, d.gpu as u32, 0);
            self.m.reconfigurations += 1;
            applied += 1;
            if let Some(s) = hooks.sink.as_deref_mut() {
                s.record(&Record::Reconfig(ReconfigRecord {
                    time: self.now,
                    gpu: d.gpu,
                    destroyed: g.describe(tr.destroy),
                    created: g.describe(tr.create),
                    duration: self.cfg.reconfig_time_s,
                    ready,
                    kind: Some(kind),
                }))?;
            }
        }
        Ok(applied)
    }

    fn finish(&mut self, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        let horizon = self.workload_horizon().max(self.m.last_completion_s);
        self.now = horizon;
        let mut energy = 0.0;
        for gpu in 0..self.rt.len() {
            self.charge(gpu);
            energy += self.rt[gpu].energy;
        }
        self.m.rejected = self.rejected.len() as u64;
        self.m.unserved = self.pending.len() as u64;
        let basis = self.charge_basis(energy);
        // Jobs that never ran are charged by the one rule of
        // `sim::metrics` (late, on a whole GPU from the horizon on).
        let sums = RunSums {
            waits: &mut self.waits,
            wait_sum: self.wait_sum,
            slowdown_sum: self.slowdown_sum,
            busy_slice_s: self.busy_slice_s,
            slices: self.rt.iter().map(|r| f64::from(r.total)).sum::<f64>(),
        };
        self.m.finish(basis, horizon, self.jobs, sums);
        if let Some(s) = hooks.sink.as_deref_mut() {
            let mut left: Vec<(u32, String)> = self.rejected.clone();
            let waiting = "still waiting when nothing else could happen: no instance that fits it was free and the policy made none";
            left.extend(
                (0..self.jobs.len() as u32)
                    .filter(|&i| self.pending_pos[i as usize] != NONE)
                    .map(|i| (i, waiting.to_string())),
            );
            left.sort_by_key(|&(i, _)| self.jobs[i as usize].id);
            for (i, reason) in left {
                let j = &self.jobs[i as usize];
                s.record(&Record::Unserved(UnservedRecord::of(j, reason)))?;
            }
            s.record(&Record::Summary(self.m.summary_record(horizon)))?;
        }
        Ok(())
    }

    /// What the rule for jobs that never ran needs (`Metrics::charge`):
    /// `energy` is every GPU's energy up to the horizon; the served jobs'
    /// tardiness is what `self.m` holds before the charge.
    fn charge_basis(&self, energy: f64) -> ChargeBasis {
        let never_ran = self
            .rejected
            .iter()
            .map(|&(i, _)| i)
            .chain((0..self.jobs.len() as u32).filter(|&i| self.pending_pos[i as usize] != NONE))
            .map(|i| NeverRan::of(&self.jobs[i as usize]))
            .collect();
        let (idle_w, whole_gpu_w) = charge_powers(&self.powers, self.rt.iter().map(|r| r.slot));
        ChargeBasis {
            window_energy_j: energy,
            idle_w,
            whole_gpu_w,
            served_tardiness_s: self.m.total_tardiness_s,
            served_late: self.m.late_jobs,
            never_ran,
        }
    }
}

/// The powers [`ChargeBasis`] needs, from each model's power (`powers`)
/// and each GPU's index into it (`slots`): the idle power of all GPUs
/// together, and the full power of one whole GPU of the hungriest model.
pub(super) fn charge_powers(
    powers: &[PowerModel],
    slots: impl Iterator<Item = usize>,
) -> (f64, f64) {
    let idle_w = slots.map(|s| powers[s].power_w(0.0)).sum();
    let whole_gpu_w = powers.iter().map(|p| p.power_w(1.0)).fold(0.0, f64::max);
    (idle_w, whole_gpu_w)
}

/// Threshold of the bounded slowdown, s: jobs shorter than this count as
/// this long, so a 1 s job that waited 1 s does not dominate the mean
/// (Feitelson's bounded slowdown, tau = 10 s).
pub const SLOWDOWN_TAU_S: f64 = 10.0;

/// [`classify`] of a transition, on the stack: a layout has at most one
/// instance per placement, so `MAX_PLACEMENTS` spans always suffice.
pub(crate) fn transition_kind(g: &Geometry, destroy: Layout, create: Layout) -> ReconfigKind {
    fn spans(g: &Geometry, l: Layout, out: &mut [Span; MAX_PLACEMENTS]) -> usize {
        let mut n = 0;
        for (slot, id) in out.iter_mut().zip(l.iter()) {
            *slot = Span::from(g.spot(id));
            n += 1;
        }
        n
    }
    let (mut d, mut c) = (
        [Span::default(); MAX_PLACEMENTS],
        [Span::default(); MAX_PLACEMENTS],
    );
    let nd = spans(g, destroy, &mut d);
    let nc = spans(g, create, &mut c);
    classify(&d[..nd], &c[..nc])
}

/// `max(1, (end - arrival) / max(end - start, tau))`.
/// The part of a job's log record that finished and failed runs share.
pub(crate) fn run_record(job: &Job, gpu: usize, placement: &Spot, speed: f64, start: f64) -> Run {
    let d = placement.describe();
    Run {
        id: job.id,
        arrival: job.arrival,
        deadline: job.deadline,
        work: job.work,
        memory_gb: job.memory_gb,
        requested_slices: job.requested_slices,
        speedup: job.speedup,
        gpu,
        profile: d.profile,
        compute: placement.compute(),
        memory_slices: d.memory_slices,
        start_slot: d.start,
        instance_memory_gb: placement.profile.memory_gb,
        speed,
        start,
        gpus: job.gpus,
    }
}

pub(crate) fn bounded_slowdown(arrival: f64, start: f64, end: f64) -> f64 {
    ((end - arrival) / (end - start).max(SLOWDOWN_TAU_S)).max(1.0)
}

/// The compute slices a job asks for (1 when it leaves the size open),
/// and whether it must get exactly that many ([`SimConfig::exact_size`],
/// only for a job that asked for a size).
fn request(j: &Job, exact_size: bool) -> (u8, bool) {
    (
        j.requested_slices.unwrap_or(1).max(1),
        exact_size && j.requested_slices.is_some(),
    )
}

/// The classes job `j` may run on, with `mem` GB asked. Served on demand
/// (a policy smartmig runs), as in a deployment: Slurm bills the job the
/// compute slices of the profile it asks for ([`super::asked_profile`]) and
/// smartmigd hands it an instance of exactly that size with enough memory,
/// never a bigger one (a 1-slice job on an idle whole GPU would hold all
/// of it). Otherwise [`mask_for`].
fn fit_mask_of(
    classes: &[Option<Class>],
    j: &Job,
    mem: f64,
    k: u8,
    exact: bool,
    on_demand: bool,
) -> u64 {
    if j.is_gang() {
        // Whole GPUs only, with `mem` GB each, whatever the policy.
        return classes
            .iter()
            .enumerate()
            .filter_map(|(c, cl)| cl.as_ref().map(|cl| (c, cl)))
            .filter(|(_, cl)| {
                cl.profile.shape.compute == cl.total && f64::from(cl.profile.memory_gb) >= mem
            })
            .fold(0, |mask, (c, _)| mask | 1 << c);
    }
    if !on_demand {
        return mask_for(classes, mem, k, exact);
    }
    let asked = Job {
        memory_gb: mem,
        ..j.clone()
    };
    let mut mask = 0u64;
    for (c, class) in classes.iter().enumerate() {
        let Some(cl) = class else { continue };
        let Some(p) = super::asked_profile(&asked, cl.model) else {
            continue;
        };
        if cl.profile.shape.compute == p.shape.compute && f64::from(cl.profile.memory_gb) >= mem {
            mask |= 1 << c;
        }
    }
    mask
}

/// Classes whose profile has at least `mem` GB and at least (`exact`:
/// exactly) `k` compute slices.
fn mask_for(classes: &[Option<Class>], mem: f64, k: u8, exact: bool) -> u64 {
    let mut mask = 0u64;
    for (c, class) in classes.iter().enumerate() {
        if let Some(cl) = class {
            let compute = cl.profile.shape.compute;
            let size_fits = if exact { compute == k } else { compute >= k };
            if size_fits && f64::from(cl.profile.memory_gb) >= mem {
                mask |= 1 << c;
            }
        }
    }
    mask
}

/// Every job's fit mask ([`fit_mask_of`]; in the OOM mode the scheduler
/// knows only the declaration), and the jobs refused at load with why: a
/// job that fits no class, a gang job wider than the GPUs that can run it
/// whole.
fn fit_masks(
    cluster: &[GpuModel],
    models: &[GpuModel],
    classes: &[Option<Class>],
    jobs: &[Job],
    cfg: &SimConfig,
    on_demand: bool,
) -> (Vec<u64>, Vec<(u32, String)>) {
    let mut fit_mask = vec![0u64; jobs.len()];
    let mut rejected = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        let (k, exact) = request(j, cfg.exact_size);
        let mem = if cfg.oom.is_some() {
            j.declared_memory_gb.unwrap_or(j.memory_gb)
        } else {
            j.memory_gb
        };
        let mut mask = fit_mask_of(classes, j, mem, k, exact, on_demand);
        if mask != 0 && j.is_gang() {
            let whole = gang_capable(cluster, models, classes, mask);
            if whole < j.gpus as usize {
                mask = 0;
                rejected.push((
                    i as u32,
                    format!(
                        "spans {} GPUs, each whole with {mem} GB; the cluster has {whole} such GPUs",
                        j.gpus
                    ),
                ));
            }
        } else if mask == 0 {
            rejected.push((
                i as u32,
                format!(
                    "fits no instance of any GPU in the cluster (needs {k} compute slices and {mem} GB)"
                ),
            ));
        }
        fit_mask[i] = mask;
    }
    (fit_mask, rejected)
}

/// Free instances per class (GPU, instance), and the mask of the classes
/// with any.
type FreeSets = (Vec<BTreeSet<(u32, u8)>>, u64);

/// What [`initial_gpus`] builds: each GPU's status and engine state, and
/// the free instances.
type InitialGpus = (Vec<GpuStatus>, Vec<GpuRt>, Vec<BTreeSet<(u32, u8)>>, u64);

/// Each GPU's status and engine state at t = 0, in the policy's initial
/// layout, and the free instances per class (`n_classes` sets).
fn initial_gpus(
    cluster: &[GpuModel],
    models: &[GpuModel],
    n_classes: usize,
    policy: &mut dyn RepartitionPolicy,
) -> Result<InitialGpus, SimError> {
    let mut status = Vec::with_capacity(cluster.len());
    let mut rt = Vec::with_capacity(cluster.len());
    let (mut free, mut free_mask): FreeSets = (Vec::new(), 0);
    free.resize_with(n_classes, BTreeSet::new);
    for (gi, &model) in cluster.iter().enumerate() {
        let g = Geometry::of(model);
        let layout = policy.initial_layout(gi, g);
        if !g.is_valid(layout) {
            return Err(SimError::InvalidInitialLayout {
                gpu: gi,
                policy: policy.name(),
            });
        }
        let slot = models.iter().position(|&m| m == model).unwrap_or(0);
        for id in layout.iter() {
            let c = class_of(g, slot, id);
            free[c].insert((gi as u32, id.0));
            free_mask |= 1 << c;
        }
        status.push(GpuStatus::new(model, layout));
        rt.push(GpuRt {
            slot,
            total: model.spec().compute_slices,
            active: 0,
            energy: 0.0,
            last: 0.0,
            job_on: [NONE; MAX_PLACEMENTS],
            origin: [ReconfigKind::Reshape; MAX_PLACEMENTS],
        });
    }
    Ok((status, rt, free, free_mask))
}

/// GPUs of `cluster` with a profile among the classes of `mask`: how many
/// whole GPUs a gang job whose fit mask is `mask` can ever get.
fn gang_capable(
    cluster: &[GpuModel],
    models: &[GpuModel],
    classes: &[Option<Class>],
    mask: u64,
) -> usize {
    cluster
        .iter()
        .filter(|&&model| {
            let slot = models.iter().position(|&m| m == model).unwrap_or(0);
            (0..CLASS_STRIDE).any(|pi| {
                let c = slot * CLASS_STRIDE + pi;
                c < classes.len() && mask & (1 << c) != 0
            })
        })
        .count()
}

fn class_of(g: &Geometry, slot: usize, id: SpotId) -> usize {
    let shape = g.spot(id).shape();
    let pi = g
        .spec
        .profiles
        .iter()
        .position(|p| p.shape == shape)
        .unwrap_or(0);
    slot * CLASS_STRIDE + pi
}

pub(crate) fn check_job(j: &Job) -> Result<(), SimError> {
    let bad = |what: &str| SimError::InvalidJob {
        id: j.id,
        reason: what.to_string(),
    };
    if !(j.arrival.is_finite() && j.arrival >= 0.0) {
        return Err(bad(&format!(
            "arrival {} is not a finite time >= 0",
            j.arrival
        )));
    }
    if !j.deadline.is_finite() {
        return Err(bad(&format!("deadline {} is not finite", j.deadline)));
    }
    if !(j.work.is_finite() && j.work > 0.0) {
        return Err(bad(&format!("work {} is not a finite value > 0", j.work)));
    }
    if j.gpus == 0 {
        return Err(bad("spans 0 GPUs"));
    }
    if !(j.memory_gb.is_finite() && j.memory_gb >= 0.0) {
        return Err(bad(&format!(
            "memory need {} GB is not finite and >= 0",
            j.memory_gb
        )));
    }
    if let Some(d) = j.declared_memory_gb {
        if !(d.is_finite() && d >= 0.0) {
            return Err(bad(&format!(
                "declared memory {d} GB is not finite and >= 0"
            )));
        }
    }
    if let Some(g) = &j.memory_growth {
        g.validate().map_err(|e| bad(&e.to_string()))?;
    }
    j.speedup
        .validate()
        .map_err(|e| bad(&format!("speed-up curve: {e}")))
}
