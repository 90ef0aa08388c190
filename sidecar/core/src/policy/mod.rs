//! Repartitioning policies: who decides the MIG layout of each GPU, and when.
//!
//! One pure trait, [`RepartitionPolicy`], is shared by the simulator
//! ([`crate::sim`]), the trainer and the daemon, so a policy measured in
//! simulation is the policy that runs on a node. A policy never touches
//! hardware or simulator state: it reads a [`ClusterView`] and answers with
//! [`Decision`]s (a target layout per GPU). The caller applies a decision only
//! if the transition destroys no busy instance and the GPU is not already
//! being reconfigured; otherwise it rejects it and counts a *violation*
//! (built-in policies never cause one; the tests assert it).
//!
//! ## When policies are asked
//!
//! At *decision epochs*: every `E` arrival/completion events (default 5, as in
//! SMART-MIG) or every `T` seconds of simulated time, whichever the run is
//! configured for, and once more whenever the cluster goes quiet (nothing
//! running or arriving) while jobs still wait, so a policy can always unblock
//! a job that fits no current instance.
//!
//! ## Why the view looks like this
//!
//! The trainer builds a view millions of times, so [`ClusterView`] is a set of
//! borrowed slices the simulator keeps up to date incrementally: building one
//! costs nothing, and a policy pays only for what it reads. Per GPU it gets
//! the state a real node can observe ([`GpuStatus`]); the queue is given per
//! job ([`PendingJob`], unordered) and as counts per needed shape
//! ([`ClusterView::pending_counts`]), which is what mean-field policies use.

pub mod adaptive;
pub mod features;
pub mod fixed;
pub mod greedy;
pub mod nodes;
pub mod onnx;
pub mod parse;
pub mod rolling;
pub mod search;
pub mod shadow;
pub mod share;
pub mod standing;
pub mod start;

use crate::mig::{Geometry, GpuModel, Layout, Shape, SpotId, MAX_PROFILES};
use crate::workload::{Job, SpeedupCurve};

pub use fixed::{OnDemand, PolicyParseError, StaticLayout, StaticThroughSmartmigd};
pub use greedy::{Greedy, GreedyConfig};
pub use nodes::{Nodes, NodesError, PerNode, Split};
pub use parse::{parse_policy, parse_policy_on};
pub use rolling::{RollingConfig, RollingFit};
pub use search::{SearchConfig, StaticMix, TwiceDaily};

/// Most placements a model has (the [`Layout`] bit set is 32 bits wide).
pub const MAX_PLACEMENTS: usize = 32;

/// Number of GPU models (indexes [`PendingJob::shapes`]).
pub const MODEL_COUNT: usize = GpuModel::ALL.len();

/// Waiting jobs per (model, profile), see [`ClusterView::pending_by_profile`].
pub type PendingByProfile = [[u32; MAX_PROFILES]; MODEL_COUNT];

/// What a node can observe about one GPU at the time of a decision.
///
/// Kept up to date by the simulator (and the daemon) incrementally.
#[derive(Clone, Debug)]
pub struct GpuStatus {
    pub model: GpuModel,
    /// The geometry of `model` (to interpret layouts).
    pub geometry: &'static Geometry,
    /// Instances that exist or are being created.
    pub layout: Layout,
    /// Instances running a job (a subset of `layout`): never destroyable.
    pub busy: Layout,
    /// Instances being created by a reconfiguration in progress (a subset of
    /// `layout`, unusable until `reconfig_until`). Empty when none.
    pub reconfiguring: Layout,
    /// End of the reconfiguration in progress, s (meaningless if none).
    pub reconfig_until: f64,
    /// Whether a reconfiguration is in progress: no decision for this GPU is
    /// accepted until it ends.
    pub in_reconfiguration: bool,
    /// Absolute end time of the job on each busy instance, indexed by
    /// placement id (meaningless for ids not in `busy`).
    pub busy_until: [f64; MAX_PLACEMENTS],
}

impl GpuStatus {
    /// A GPU with `layout`, nothing running.
    pub fn new(model: GpuModel, layout: Layout) -> Self {
        GpuStatus {
            model,
            geometry: Geometry::of(model),
            layout,
            busy: Layout::EMPTY,
            reconfiguring: Layout::EMPTY,
            reconfig_until: 0.0,
            in_reconfiguration: false,
            busy_until: [0.0; MAX_PLACEMENTS],
        }
    }

    /// Seconds left of the job on busy instance `id` at `now` (0 if idle).
    pub fn remaining(&self, id: SpotId, now: f64) -> f64 {
        if self.busy.contains(id) {
            (self.busy_until[id.0 as usize] - now).max(0.0)
        } else {
            0.0
        }
    }

    /// Instances that exist, are ready and run nothing.
    pub fn idle(&self) -> Layout {
        self.layout.minus(self.busy).minus(self.reconfiguring)
    }

    /// Whether `target` may be applied now: no reconfiguration in progress,
    /// `target` is a valid layout and keeps every busy instance.
    pub fn accepts(&self, target: Layout) -> bool {
        !self.in_reconfiguration
            && self.geometry.is_valid(target)
            && !self
                .geometry
                .transition(self.layout, target)
                .touches(self.busy)
    }
}

/// One waiting job, as policies see it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PendingJob {
    pub id: u64,
    pub arrival: f64,
    /// Absolute deadline, s.
    pub deadline: f64,
    /// Seconds on a whole GPU.
    pub work: f64,
    pub memory_gb: f64,
    /// Requested compute slices (1 when the job leaves the size open).
    pub min_compute: u8,
    pub speedup: SpeedupCurve,
    /// The smallest profile that fits the job (compute >= `min_compute`,
    /// memory >= `memory_gb`) on each model, indexed by `GpuModel as usize`;
    /// `None` where no profile fits.
    pub shapes: [Option<Shape>; MODEL_COUNT],
}

impl PendingJob {
    /// Job `j` waiting, as a policy sees it: its size request (1 slice
    /// when it leaves the size open) and `shapes`, its smallest fitting
    /// shape per model.
    pub fn of(j: &Job, shapes: [Option<Shape>; MODEL_COUNT]) -> PendingJob {
        PendingJob {
            id: j.id,
            arrival: j.arrival,
            deadline: j.deadline,
            work: j.work,
            memory_gb: j.memory_gb,
            min_compute: j.requested_slices.unwrap_or(1).max(1),
            speedup: j.speedup,
            shapes,
        }
    }

    /// The smallest shape that fits the job on `model`.
    pub fn shape(&self, model: GpuModel) -> Option<Shape> {
        self.shapes[model as usize]
    }

    /// Run time on a `compute`-slice instance, as [`crate::workload::Job::runtime_on`].
    #[inline]
    pub fn runtime_on(&self, compute: u8, total_compute: u8) -> f64 {
        self.work / self.speedup.speed(compute, total_compute)
    }
}

/// Everything a policy may read at a decision epoch. Cheap to build: only
/// borrowed slices maintained incrementally by the caller.
#[derive(Clone, Copy, Debug)]
pub struct ClusterView<'a> {
    /// Simulated (or wall-clock) time, s since the start of the workload.
    pub now: f64,
    /// Hour of day at `now` in [0, 24), from the workload's start hour.
    pub hour_of_day: f64,
    /// One entry per GPU, index = GPU number.
    pub gpus: &'a [GpuStatus],
    /// Waiting jobs, in no particular order.
    pub pending: &'a [PendingJob],
    /// Waiting jobs per (model, profile): `pending_by_profile[m][p]` counts
    /// the jobs whose smallest fitting profile on `GpuModel::ALL[m]` is that
    /// model's `profiles[p]`.
    pub pending_by_profile: &'a PendingByProfile,
    /// The jobs that arrived since the previous decision epoch, in arrival
    /// order, including those that already started (most jobs never wait,
    /// so `pending` alone does not show what is arriving). What a policy
    /// learns the workload's mix from.
    pub arrivals: &'a [PendingJob],
}

impl ClusterView<'_> {
    /// Waiting jobs whose smallest fitting shape on `model` is `shape`.
    pub fn pending_counts(&self, model: GpuModel, shape: Shape) -> u32 {
        model
            .spec()
            .profiles
            .iter()
            .position(|p| p.shape == shape)
            .map_or(0, |i| self.pending_by_profile[model as usize][i])
    }
}

/// "Make GPU `gpu` look like `target`": the caller destroys the idle
/// instances not in `target` and creates the missing ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub gpu: usize,
    pub target: Layout,
}

/// A repartitioning policy. Pure: all it knows comes through the view, all it
/// does is return decisions, so the same object runs in the simulator, the
/// trainer and the daemon.
pub trait RepartitionPolicy {
    /// Name for reports and event logs, e.g. `static:4444|3333`.
    fn name(&self) -> String;

    /// One line for the reports' legends: what the policy does and with
    /// which settings. Default: its name.
    fn describe(&self) -> String {
        self.name()
    }

    /// Layout of `gpu` at time 0, before the first job (installed by the
    /// admin, so it costs no reconfiguration). Default: the whole GPU.
    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        let _ = gpu;
        geometry.whole_gpu()
    }

    /// Target layouts at a decision epoch. Return nothing to keep every GPU
    /// as it is; only GPUs that should change need a decision.
    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision>;

    /// Whether the daemon should build [`RepartitionPolicy::initial_layout`]
    /// on a GPU that has no instance at all (a fresh boot). `none` says no:
    /// on a node it means "make each job's instance on demand".
    fn installs_initial_layout(&self) -> bool {
        true
    }

    /// Whether, deployed, the policy's jobs reach their instances through
    /// Slurm shards and smartmigd (the repartitioning policies), rather than
    /// through Slurm's own GRES (the whole-GPU and fixed-layout opponents a
    /// site runs without smartmig: whole GPUs or typed MIG devices, nothing
    /// for Slurm to count wrong). The simulator's Slurm-like mode
    /// ([`crate::sim::SlurmLike`]) models the first kind only.
    fn served_through_shards(&self) -> bool {
        true
    }
}

/// Every GPU is one whole-GPU instance, forever: the `none` reference of the
/// ET metric (what a cluster without MIG does). Here, at the bottom of
/// `policy`, because the simulator runs it (`sim::simulate_with_reference`)
/// and imports nothing of the policies above it.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPartition;

impl RepartitionPolicy for NoPartition {
    fn name(&self) -> String {
        "none".to_string()
    }

    fn installs_initial_layout(&self) -> bool {
        false
    }

    fn served_through_shards(&self) -> bool {
        false
    }

    fn decide(&mut self, _view: &ClusterView<'_>) -> Vec<Decision> {
        Vec::new()
    }
}

/// The layout `layouts[gpu]` if it is valid on `geometry`, else the whole
/// GPU: how assignment policies choose their initial layouts.
pub fn layout_or_whole(layouts: &[Layout], gpu: usize, geometry: &'static Geometry) -> Layout {
    layouts
        .get(gpu)
        .copied()
        .filter(|&l| geometry.is_valid(l))
        .unwrap_or_else(|| geometry.whole_gpu())
}

/// The next layout on the way from `status` to `target`, as far as the busy
/// instances allow: `target` itself when the GPU accepts it; otherwise keep
/// the busy instances, add the target's instances that fit next to them and
/// keep the idle instances still in nobody's way. `None` when the GPU is
/// already there, is being reconfigured, or no step creates an instance of
/// the target (each step does, so a move takes at most as many steps as the
/// target has instances).
pub fn step_toward(status: &GpuStatus, target: Layout) -> Option<Layout> {
    if status.layout == target || status.in_reconfiguration {
        return None;
    }
    let g = status.geometry;
    let add = |from: Layout, ids: Layout| {
        ids.iter()
            .fold(from, |l, id| if g.fits(l, id) { l.with(id) } else { l })
    };
    let next = if status.accepts(target) {
        target
    } else {
        add(add(status.busy, target), status.layout.minus(status.busy))
    };
    let creates_target = !next.intersection(target).minus(status.layout).is_empty();
    (next != status.layout && creates_target && status.accepts(next)).then_some(next)
}

impl<P: RepartitionPolicy + ?Sized> RepartitionPolicy for Box<P> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn initial_layout(&mut self, gpu: usize, geometry: &'static Geometry) -> Layout {
        (**self).initial_layout(gpu, geometry)
    }
    fn decide(&mut self, view: &ClusterView<'_>) -> Vec<Decision> {
        (**self).decide(view)
    }
    fn installs_initial_layout(&self) -> bool {
        (**self).installs_initial_layout()
    }
    fn served_through_shards(&self) -> bool {
        (**self).served_through_shards()
    }
}
