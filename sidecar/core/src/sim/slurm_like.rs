//! The deployment model (issue 42): Slurm counts shards, smartmigd builds
//! instances.
//!
//! The central engine ([`super::engine`]) serves a job on demand on a GPU
//! where its instance can be built, so it never meets a slice MIG cannot
//! build. A deployed smartmig does: Slurm picks the GPU by its free *shards* and
//! starts the job; only then does smartmigd look for an instance on that
//! GPU. This engine models that chain:
//!
//! 1. **Slurm's pass** (batched: an event that calls for one, a submit, an
//!    end, a requeue, a hold's release, gets it at the next multiple of
//!    `pass_s`, so the events of one window share a pass, as slurmctld's
//!    background thread batches them; `pass_s = 0`: a pass after every
//!    event; and every `sched_interval_s` for jobs whose requeue hold
//!    ended): queued jobs in priority order (the
//!    placement heuristic's order, e.g. earliest deadline for `edf`, as in
//!    the central engine, so that the two models differ only in what Slurm
//!    and MIG do; a requeued job keeps its place), each on the first GPU, by
//!    index, with enough free shards (Slurm 22.05's `_pick_specific_topo`
//!    takes the lowest GPU index that fits), where free = the GPU's slices
//!    minus the shards of jobs on it minus the shards smartmigd holds. A job
//!    is billed the compute slices of the profile it will get
//!    (`job_submit.lua`: `shard:5` is billed 7, a memory need that takes a
//!    bigger profile is billed that profile, and a memory variant the
//!    default profile of its room: `1g.10gb` is billed and built as
//!    `2g.10gb`, [`SlurmLike::bill_compute`]); a job that leaves its size
//!    open asks for what a user who knows it would ([`super::asked_profile`]). Later jobs may start past one
//!    that does not fit (backfill, without reservations).
//! 2. **smartmigd's allocate** on that GPU, for each job the pass placed, in
//!    order: reuse an idle instance of the job's compute size with enough
//!    memory, else create the job's profile in free space, else re-shape idle
//!    instances (never a busy one); among these, first those that leave room
//!    for the jobs placed on the GPU that hold no instance yet (the rest of
//!    the pass, the waiting ones), then with holds the one after which
//!    Slurm's offer stays largest ([`crate::mig::Geometry::choose_spot`], as
//!    smartmigd). Jobs of a pass that no layout holds together are decided
//!    as a set, as smartmigd does ([`crate::mig::Geometry::turned_away`]):
//!    the rest leave room only for each other, and the one turned away is
//!    requeued at once when the time limits (`time-limit`) keep every job
//!    beside it running past `allocate_wait_s`.
//!    A created instance runs the job after `reconfig_time_s`. Otherwise the job waits on the GPU, holding its
//!    shards, for a neighbour to end; after `allocate_wait_s` it is
//!    *requeued*: its shards are freed and Slurm holds it for
//!    `requeue_hold_s` (`cred_expire + 1`), then it waits for a pass.
//! 3. **Holds** (`holds = Some(rule)`, the prevention): smartmigd holds each
//!    GPU's stranded shards in Slurm ([`crate::mig::Geometry::stranded`]),
//!    so Slurm stops offering what MIG cannot build. After a job's end the
//!    hold is in place before Slurm frees the job's shards (smartmigd hears
//!    of the end in the job's epilog and its pending hold has the top
//!    priority); after a start it takes `hold_lag_s`. Jobs placed by the
//!    same pass, or during the lag, can still meet a slice that cannot be
//!    built.
//! 4. **The policy** reshapes idle instances at decision epochs as in the
//!    central engine (its view's pending jobs are those Slurm has not
//!    placed); an on-demand creation blocks the policy on that GPU until
//!    the instance is ready, and a policy reconfiguration delays on-demand
//!    creations on its GPU until it ends.
//!
//! Energy, tardiness, waits and the event log are as in the central engine
//! (the log passes [`super::audit`]): a job that waits on a GPU or is
//! requeued runs nothing and draws no power until its run starts. Jobs of
//! policies that Slurm serves with its own GRES (whole GPUs, fixed layouts:
//! [`crate::policy::RepartitionPolicy::served_through_shards`]) have nothing
//! to strand and run in the central engine.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

mod gang;

use super::engine::{
    bounded_slowdown, charge_powers, check_job, run_record, transition_kind, SimResult, T,
};
use super::events::{
    GpuHeader, Header, JobRecord, ModelPower, ReconfigRecord, Record, UnservedRecord,
    EVENTS_VERSION,
};
use super::heuristics::PlacementHeuristic;
use super::metrics::{ChargeBasis, Metrics, NeverRan, RunSums};
use super::reshape::ReconfigKind;
use super::{EpochRule, RunHooks, SimConfig, SimError};
use crate::mig::{
    Geometry, GpuModel, GpuNow, Layout, Mix, OfferPolicy, OfferRule, ProfileSpec, SpotId, Way,
};
use crate::policy::{
    ClusterView, GpuStatus, PendingByProfile, PendingJob, RepartitionPolicy, MAX_PLACEMENTS,
    MODEL_COUNT,
};
use crate::workload::{Job, PowerModel};

/// The deployment's timing and whether smartmigd holds stranded shards
/// ([`SimConfig::slurm`]). Defaults are Slurm's and smartmigd's.
#[derive(Clone, Debug, PartialEq)]
pub struct SlurmLike {
    /// Hold stranded shards under this rule; `None`: Slurm offers every
    /// free shard (smartmig before issue 42). Default `adaptive`: the
    /// packaged config (`holds = "auto"` on the typed gres.conf it ships;
    /// each GPU by `any-mix` for an hour after a job was turned away or
    /// requeued there, by `next-job` otherwise, [`OfferPolicy`]).
    pub holds: Option<OfferPolicy>,
    /// smartmigd's `allocate_wait_s`: how long a started job waits on its
    /// GPU for room before it is requeued (30 s).
    pub allocate_wait_s: f64,
    /// Slurm's hold of a requeued job, `cred_expire + 1` (121 s).
    pub requeue_hold_s: f64,
    /// Slurm's periodic scheduling pass, `sched_interval` (60 s): a requeued
    /// job whose hold ended starts at the next pass.
    pub sched_interval_s: f64,
    /// From a change on a GPU to its hold in Slurm (smartmigd's `salloc`), s.
    pub hold_lag_s: f64,
    /// Slurm's event-triggered passes are batched: an event that calls for
    /// one (a submit, an end, a requeue, a hold's release) gets it at the
    /// next multiple of this many seconds, so every job those events let
    /// start reaches smartmigd's allocate in one burst, in Slurm's order.
    /// 3 s: the packaged config, which leaves `batch_sched_delay` at
    /// Slurm's default of 3 s. 0: a pass after every event (the model
    /// before issue 56).
    pub pass_s: f64,
    /// `bill=compute`: the product before issue 55, which built a memory
    /// variant (`1g.10gb` for a `shard:1` job needing 8 GB) and billed its
    /// compute slices, so Slurm offered shards whose memory was gone (a
    /// what-if to measure that rule; default `bill=room`: billed and built
    /// as [`crate::mig::ModelSpec::room_profile`]).
    pub bill_compute: bool,
    /// Each job's Slurm time limit as a multiple of its run time on the
    /// profile it is billed (`>= 1`: every job ends within its limit); 0
    /// (the default): no time limit, as the busy mix's jobs
    /// (`MaxTime=INFINITE`, no `--time`). smartmigd refuses the job a pass
    /// turns away at once only when the time limits keep every job beside
    /// it running past the wait ([`crate::mig::Geometry::turned_away`],
    /// module docs), so without limits it waits as before.
    pub time_limit: f64,
    /// smartmigd's `lend_idle` (issue 55): a job with no idle instance of
    /// its room may be lent an idle bigger one before anything is built
    /// ([`crate::mig::GpuNow::lend`]); `lend=off`: the product before
    /// (every job on exactly its room, built when none is idle).
    pub lend: bool,
}

impl Default for SlurmLike {
    fn default() -> Self {
        SlurmLike {
            holds: Some(OfferPolicy::Adaptive),
            allocate_wait_s: 30.0,
            requeue_hold_s: 121.0,
            sched_interval_s: 60.0,
            hold_lag_s: 1.0,
            pass_s: 3.0,
            bill_compute: false,
            time_limit: 0.0,
            lend: true,
        }
    }
}

/// A Slurm-like setting out of range.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SlurmLikeError {
    #[error("slurm-like {name}={value}: not a finite time >= 0")]
    Time { name: &'static str, value: f64 },
    #[error("slurm-like sched-interval={0}: not a finite time > 0")]
    SchedInterval(f64),
    #[error(
        "slurm-like pass={0}: not a finite time >= 0 (seconds between Slurm's batched passes; 0: a pass after every event)"
    )]
    Pass(f64),
    #[error(
        "slurm-like time-limit={0}: not 0 (no time limits) or a finite factor >= 1 of each job's run time"
    )]
    TimeLimit(f64),
}

impl SlurmLike {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), SlurmLikeError> {
        for (name, v) in [
            ("allocate-wait", self.allocate_wait_s),
            ("requeue-hold", self.requeue_hold_s),
            ("hold-lag", self.hold_lag_s),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(SlurmLikeError::Time { name, value: v });
            }
        }
        if !(self.sched_interval_s.is_finite() && self.sched_interval_s > 0.0) {
            return Err(SlurmLikeError::SchedInterval(self.sched_interval_s));
        }
        if !(self.pass_s.is_finite() && self.pass_s >= 0.0) {
            return Err(SlurmLikeError::Pass(self.pass_s));
        }
        let f = self.time_limit;
        if !(f == 0.0 || (f.is_finite() && f >= 1.0)) {
            return Err(SlurmLikeError::TimeLimit(f));
        }
        Ok(())
    }
}

impl std::str::FromStr for SlurmLike {
    type Err = String;

    /// `holds=off|adaptive|next-job|any-mix,allocate-wait=S,requeue-hold=S,
    /// sched-interval=S,hold-lag=S,pass=S,time-limit=F,bill=room|compute,
    /// lend=on|off`,
    /// any subset, any order; `""` or
    /// `default` for the defaults.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = SlurmLike::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "default" {
                continue;
            }
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("slurm-like option `{part}`: expected key=value"))?;
            let secs = || {
                value
                    .trim()
                    .parse::<f64>()
                    .map_err(|_| format!("slurm-like {key}={value}: not a number of seconds"))
            };
            match key.trim() {
                "holds" => {
                    out.holds = match value.trim() {
                        "off" => None,
                        v => Some(v.parse::<OfferPolicy>().map_err(|e| format!("{e}, or `off`"))?),
                    }
                }
                "allocate-wait" => out.allocate_wait_s = secs()?,
                "requeue-hold" => out.requeue_hold_s = secs()?,
                "sched-interval" => out.sched_interval_s = secs()?,
                "hold-lag" => out.hold_lag_s = secs()?,
                "pass" => out.pass_s = secs()?,
                "bill" => {
                    out.bill_compute = match value.trim() {
                        "room" => false,
                        "compute" => true,
                        v => {
                            return Err(format!(
                                "slurm-like bill={v}: use `room` (the product) or `compute` (before issue 55)"
                            ))
                        }
                    }
                }
                "lend" => {
                    out.lend = match value.trim() {
                        "on" => true,
                        "off" => false,
                        v => {
                            return Err(format!(
                                "slurm-like lend={v}: use `on` (the product: an idle bigger instance before a build) or `off` (exact rooms only)"
                            ))
                        }
                    }
                }
                "time-limit" => {
                    out.time_limit = value.trim().parse::<f64>().map_err(|_| {
                        format!("slurm-like {key}={value}: not a factor of the run time")
                    })?;
                }
                other => {
                    return Err(format!(
                        "unknown slurm-like option `{other}` (holds, allocate-wait, requeue-hold, sched-interval, hold-lag, pass, time-limit, bill, lend)"
                    ))
                }
            }
        }
        out.validate().map_err(|e| e.to_string())?;
        Ok(out)
    }
}

impl std::fmt::Display for SlurmLike {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "holds={},allocate-wait={},requeue-hold={},sched-interval={},hold-lag={},pass={},bill={},lend={}",
            self.holds.map_or("off", OfferPolicy::name),
            self.allocate_wait_s,
            self.requeue_hold_s,
            self.sched_interval_s,
            self.hold_lag_s,
            self.pass_s,
            if self.bill_compute { "compute" } else { "room" },
            if self.lend { "on" } else { "off" }
        )?;
        if self.time_limit > 0.0 {
            write!(f, ",time-limit={}", self.time_limit)?;
        }
        Ok(())
    }
}

// Event kinds, in the order they are handled at equal times.
const EV_COMPLETION: u8 = 0; // a = gpu, b = placement
const EV_READY: u8 = 1; // a = gpu
const EV_TIMEOUT: u8 = 2; // a = job, b = its wait's generation
/// What smartmigd's pass rule makes of one allocate ([`Deploy::pass_rule`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    /// It fits with the rest of its pass: served if there is room now.
    Kept,
    /// Turned away, but a neighbour may end within the wait: served as
    /// before if it can be (beside all its mates; measured on the busy
    /// mix, waiting instead while the rest are built requeued more:
    /// docs/slurm-integration.md §9).
    Away,
    /// Turned away with nothing ending within the wait: requeued at once.
    Refused,
}

/// smartmigd's margin past `allocate_wait_s` when it asks whether a job
/// runs past the wait (its `QUEUE_REFRESH`, 2 s).
const HELD_MARGIN_S: f64 = 2.0;
const EV_ELIGIBLE: u8 = 3; // a = job
const EV_HOLD: u8 = 4; // a = gpu
const EV_PASS: u8 = 5;
const EV_TICK: u8 = 6;

type Ev = Reverse<(T, u8, u64, u32, u32)>;

/// A requeued job may come back at most this often before it is given up
/// (never reached in practice: a GPU whose neighbours end can build it).
const MAX_REQUEUES: u32 = 10_000;

#[derive(Clone, Copy, Debug, PartialEq)]
enum St {
    Future,
    Rejected,
    /// In Slurm's queue, placeable.
    Queued,
    /// Requeued, held by Slurm until its `EV_ELIGIBLE`.
    Held,
    /// Placed by Slurm on `gpu`, waiting in smartmigd for room.
    Waiting {
        gpu: u32,
    },
    /// Its instance is being created; runs when it is ready.
    Creating {
        gpu: u32,
        pid: u8,
    },
    /// A gang job placed on its GPUs, whose whole instances are being
    /// built ([`gang`]).
    GangStarting,
    Running,
    Done,
}

struct Gpu {
    status: GpuStatus,
    total: u8,
    slot: usize,
    /// Shards Slurm has given to jobs on this GPU (waiting, creating, running).
    alloc: u8,
    held: u8,
    /// Jobs waiting for room here, in arrival order of their wait.
    waiting: Vec<u32>,
    /// When each instance being created is ready.
    ready_at: [f64; MAX_PLACEMENTS],
    /// End of the policy's reconfiguration in progress (on-demand creations
    /// wait for it).
    policy_until: f64,
    /// Kind of the reconfiguration that made each instance.
    origin: [ReconfigKind; MAX_PLACEMENTS],
    job_on: [u32; MAX_PLACEMENTS],
    active: u32,
    energy: f64,
    last: f64,
    held_since: f64,
    /// When a job was last turned away or requeued here (the adaptive
    /// holds' memory, [`OfferPolicy::on_gpu`]).
    collided_at: Option<f64>,
}

/// Runs `jobs` through the deployment model (module docs). Called by
/// [`super::simulate`] when [`SimConfig::slurm`] is set and the policy is
/// served through shards.
pub fn simulate(
    cluster: &[GpuModel],
    jobs: &[Job],
    heuristic: &dyn PlacementHeuristic,
    policy: &mut dyn RepartitionPolicy,
    cfg: &SimConfig,
    slurm: &SlurmLike,
    hooks: RunHooks<'_>,
) -> Result<SimResult, SimError> {
    slurm
        .validate()
        .map_err(|e| SimError::Config(e.to_string()))?;
    if cfg.oom.is_some() {
        return Err(SimError::Config(
            "the Slurm-like mode does not model out-of-memory restarts".into(),
        ));
    }
    let mut e = Deploy::new(cluster, jobs, cfg, slurm, policy)?;
    e.priority = jobs.iter().map(|j| heuristic.priority(j)).collect();
    e.run(policy, hooks)
}

struct Deploy<'j> {
    cfg: SimConfig,
    slurm: SlurmLike,
    jobs: &'j [Job],
    order: Vec<u32>,
    models: Vec<GpuModel>,
    powers: Vec<PowerModel>,
    /// Each job's place in Slurm's queue (smallest first; a requeued job
    /// keeps it): the placement heuristic's key, so that both models order
    /// jobs alike and only what Slurm and MIG do differs.
    priority: Vec<f64>,
    /// The profile each job gets on each model slot (`None`: none fits).
    profile: Vec<[Option<&'static ProfileSpec>; MODEL_COUNT]>,
    state: Vec<St>,
    /// Generation of each job's wait (stale timeouts are ignored).
    wait_gen: Vec<u32>,
    requeued: Vec<u32>,
    /// Unix-like second each job placed by Slurm reaches its time limit
    /// (`None`: no limit, [`SlurmLike::time_limit`] = 0, or not placed).
    slurm_end: Vec<Option<f64>>,
    queue: BTreeSet<(T, u64, u32)>,
    gpus: Vec<Gpu>,
    heap: BinaryHeap<Ev>,
    seq: u64,
    now: f64,
    m: Metrics,
    waits: Vec<f32>,
    wait_sum: f64,
    slowdown_sum: f64,
    busy_slice_s: f64,
    /// GPUs whose hold must be updated after this batch of events.
    touched: Vec<bool>,
    /// GPUs where a job ended in this batch (their hold is updated before
    /// Slurm's pass).
    ended: Vec<bool>,
    pass_at: Option<f64>,
    live: usize,
    /// Jobs that arrived since the last decision epoch (the view's
    /// `arrivals`).
    arrived: Vec<u32>,
    /// Gang jobs starting and running ([`gang`]).
    gangs: gang::Gangs,
}

impl<'j> Deploy<'j> {
    fn new(
        cluster: &[GpuModel],
        jobs: &'j [Job],
        cfg: &SimConfig,
        slurm: &SlurmLike,
        policy: &mut dyn RepartitionPolicy,
    ) -> Result<Self, SimError> {
        if cluster.is_empty() {
            return Err(SimError::NoGpus);
        }
        if jobs.len() >= u32::MAX as usize {
            return Err(SimError::TooManyJobs(jobs.len()));
        }
        for j in jobs {
            check_job(j)?;
        }
        let models = GpuModel::distinct(cluster);
        let mut powers = Vec::new();
        for &model in &models {
            let p = cfg.power_for(model);
            p.validate()
                .map_err(|e| SimError::Power { model, source: e })?;
            powers.push(p);
        }
        let profile = billed_profiles(jobs, &models, slurm);
        let mut order: Vec<u32> = (0..jobs.len() as u32).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (&jobs[a as usize], &jobs[b as usize]);
            x.arrival.total_cmp(&y.arrival).then(x.id.cmp(&y.id))
        });
        let mut gpus = Vec::new();
        for (gi, &model) in cluster.iter().enumerate() {
            let g = Geometry::of(model);
            let layout = if policy.installs_initial_layout() {
                policy.initial_layout(gi, g)
            } else {
                Layout::EMPTY
            };
            if !g.is_valid(layout) {
                return Err(SimError::InvalidInitialLayout {
                    gpu: gi,
                    policy: policy.name(),
                });
            }
            gpus.push(Gpu {
                status: GpuStatus::new(model, layout),
                total: model.spec().compute_slices,
                slot: models.iter().position(|&m| m == model).unwrap_or(0),
                alloc: 0,
                held: 0,
                waiting: Vec::new(),
                ready_at: [0.0; MAX_PLACEMENTS],
                policy_until: 0.0,
                origin: [ReconfigKind::Reshape; MAX_PLACEMENTS],
                job_on: [u32::MAX; MAX_PLACEMENTS],
                active: 0,
                energy: 0.0,
                last: 0.0,
                held_since: 0.0,
                collided_at: None,
            });
        }
        let n = jobs.len();
        Ok(Deploy {
            cfg: cfg.clone(),
            slurm: slurm.clone(),
            jobs,
            order,
            models,
            powers,
            priority: jobs.iter().map(|j| j.arrival).collect(),
            profile,
            state: vec![St::Future; n],
            wait_gen: vec![0; n],
            requeued: vec![0; n],
            slurm_end: vec![None; n],
            queue: BTreeSet::new(),
            touched: vec![false; gpus.len()],
            ended: vec![false; gpus.len()],
            gpus,
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0.0,
            m: Metrics {
                jobs: n as u64,
                ..Metrics::default()
            },
            waits: Vec::with_capacity(n),
            wait_sum: 0.0,
            slowdown_sum: 0.0,
            busy_slice_s: 0.0,
            pass_at: None,
            live: 0,
            arrived: Vec::new(),
            gangs: gang::Gangs::default(),
        })
    }

    fn push(&mut self, t: f64, kind: u8, a: u32, b: u32) {
        self.seq += 1;
        self.heap.push(Reverse((T(t), kind, self.seq, a, b)));
    }

    fn workload_horizon(&self) -> f64 {
        self.cfg.workload_horizon_s.unwrap_or_else(|| {
            self.order
                .last()
                .map_or(0.0, |&i| self.jobs[i as usize].arrival)
        })
    }

    fn header(&self, policy: &str) -> Header {
        Header {
            version: EVENTS_VERSION,
            seed: self.cfg.seed,
            placement: format!("slurm-like({})", self.slurm),
            policy: policy.to_string(),
            reconfig_time_s: self.cfg.reconfig_time_s,
            workload_horizon_s: self.workload_horizon(),
            gpus: self
                .gpus
                .iter()
                .map(|g| GpuHeader {
                    model: g.status.model,
                    compute_slices: g.total,
                    initial: g.status.geometry.describe(g.status.layout),
                })
                .collect(),
            power: self
                .models
                .iter()
                .zip(&self.powers)
                .map(|(&model, &power)| ModelPower { model, power })
                .collect(),
            oom: None,
        }
    }

    fn run(
        &mut self,
        policy: &mut dyn RepartitionPolicy,
        mut hooks: RunHooks<'_>,
    ) -> Result<SimResult, SimError> {
        let name = policy.name();
        if let Some(s) = hooks.sink.as_deref_mut() {
            s.record(&Record::Header(self.header(&name)))?;
        }
        for i in 0..self.jobs.len() {
            if self.profile[i].iter().all(Option::is_none) || self.gang_too_wide(i) {
                self.state[i] = St::Rejected;
            }
        }
        if let EpochRule::Seconds(s) = self.cfg.epoch {
            self.push(s, EV_TICK, 0, 0);
        }
        let mut next = 0usize;
        let mut since_epoch = 0u32;
        loop {
            let th = self.heap.peek().map(|Reverse((t, ..))| t.0);
            let ta = self.order.get(next).map(|&i| self.jobs[i as usize].arrival);
            let now = match (th, ta) {
                (None, None) => break,
                (Some(a), None) | (None, Some(a)) => a,
                (Some(a), Some(b)) => a.min(b),
            };
            self.now = now;
            // `pass`: an event calls for Slurm's pass (batched, `pass_s`);
            // `pass_now`: a scheduled pass is due.
            let (mut pass, mut pass_now, mut epoch_due) = (false, false, false);
            while let Some(&Reverse((T(t), kind, _, a, b))) = self.heap.peek() {
                if t != now {
                    break;
                }
                self.heap.pop();
                self.m.events += 1;
                match kind {
                    EV_COMPLETION => {
                        self.complete(a as usize, SpotId(b as u8));
                        since_epoch += 1;
                        pass = true;
                    }
                    EV_READY => self.ready(a as usize, &mut hooks)?,
                    EV_TIMEOUT => pass |= self.timeout(a, b),
                    EV_ELIGIBLE => self.eligible(a),
                    EV_HOLD => pass |= self.update_hold(a as usize),
                    EV_PASS => {
                        if self.pass_at.is_some_and(|p| p <= now) {
                            self.pass_at = None;
                        }
                        pass_now = true;
                    }
                    _ => {
                        epoch_due = true;
                        if let EpochRule::Seconds(s) = self.cfg.epoch {
                            if next < self.order.len() || self.live > 0 {
                                self.push(now + s, EV_TICK, 0, 0);
                            }
                        }
                    }
                }
            }
            while let Some(&i) = self.order.get(next) {
                if self.jobs[i as usize].arrival != now {
                    break;
                }
                next += 1;
                self.m.events += 1;
                since_epoch += 1;
                if self.state[i as usize] == St::Future {
                    self.enqueue(i);
                    self.arrived.push(i);
                    pass = true;
                }
            }
            let pass = pass_now || self.batch(pass);
            self.settle(pass, &mut hooks)?;
            if let EpochRule::Events(e) = self.cfg.epoch {
                epoch_due |= since_epoch >= e;
            }
            if epoch_due {
                since_epoch = 0;
                self.epoch(policy, &mut hooks)?;
            }
        }
        self.finish(&mut hooks)?;
        Ok(SimResult {
            metrics: self.m.clone(),
            placement: "slurm-like".into(),
            policy: name,
        })
    }

    fn enqueue(&mut self, i: u32) {
        let j = &self.jobs[i as usize];
        self.queue.insert((T(self.priority[i as usize]), j.id, i));
        self.state[i as usize] = St::Queued;
        self.live += 1;
    }

    /// Free shards Slurm offers on `gpu`.
    fn free(&self, gpu: usize) -> u8 {
        let g = &self.gpus[gpu];
        g.total.saturating_sub(g.alloc).saturating_sub(g.held)
    }

    /// Slurm's pass, then smartmigd's allocate for each job it placed.
    fn pass(&mut self, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        let mut placed = Vec::new();
        let mut most = (0..self.gpus.len())
            .map(|g| self.free(g))
            .max()
            .unwrap_or(0);
        let queued: Vec<(T, u64, u32)> = self.queue.iter().copied().collect();
        self.gangs.keep.clear();
        let mut first_gang = true;
        for key in queued {
            if most == 0 {
                break;
            }
            let i = key.2 as usize;
            if self.jobs[i].is_gang() {
                if self.place_gang(key.2, &mut first_gang, hooks)? {
                    self.queue.remove(&key);
                    most = (0..self.gpus.len())
                        .map(|g| self.free(g))
                        .max()
                        .unwrap_or(0);
                }
                continue;
            }
            let found = (0..self.gpus.len()).find(|&g| {
                self.profile[i][self.gpus[g].slot].is_some_and(|p| {
                    p.shape.compute <= self.free(g)
                        && self.gang_allows(
                            g,
                            self.jobs[i].runtime_on(p.shape.compute, self.gpus[g].total),
                        )
                })
            });
            let Some(g) = found else { continue };
            let billed = self.billed(i, g);
            let limit = self.slurm.time_limit * self.jobs[i].runtime_on(billed, self.gpus[g].total);
            self.slurm_end[i] = (limit > 0.0).then_some(self.now + limit);
            self.queue.remove(&key);
            self.gpus[g].alloc += billed;
            self.state[i] = St::Waiting { gpu: g as u32 };
            placed.push(i as u32);
            most = (0..self.gpus.len())
                .map(|g| self.free(g))
                .max()
                .unwrap_or(0);
        }
        for (n, &i) in placed.iter().enumerate() {
            let St::Waiting { gpu } = self.state[i as usize] else {
                continue;
            };
            self.touched[gpu as usize] = true;
            // The rest of the pass on this GPU, and the jobs waiting there.
            let later: Vec<u32> = placed[n + 1..]
                .iter()
                .copied()
                .filter(|&j| self.state[j as usize] == St::Waiting { gpu })
                .chain(self.gpus[gpu as usize].waiting.iter().copied())
                .collect();
            let (mates, turn) = self.pass_rule(i, gpu as usize, &later);
            let refused = turn == Turn::Refused;
            if refused || !self.allocate(i, gpu as usize, &mates, hooks)? {
                self.wait_gen[i as usize] += 1;
                self.gpus[gpu as usize].waiting.push(i);
                // Refused at once: requeued now rather than after the wait.
                let wait = if refused {
                    0.0
                } else {
                    self.slurm.allocate_wait_s
                };
                self.push(self.now + wait, EV_TIMEOUT, i, self.wait_gen[i as usize]);
            }
        }
        Ok(())
    }

    /// GPUs whose whole profile fits job `i`.
    fn gang_capable(&self, i: usize) -> usize {
        self.gpus
            .iter()
            .filter(|g| self.profile[i][g.slot].is_some())
            .count()
    }

    /// Whether gang job `i` spans more GPUs than can run it.
    fn gang_too_wide(&self, i: usize) -> bool {
        self.jobs[i].is_gang() && self.gang_capable(i) < self.jobs[i].gpus as usize
    }

    fn billed(&self, i: usize, gpu: usize) -> u8 {
        self.profile[i][self.gpus[gpu].slot].map_or(0, |p| p.shape.compute)
    }

    /// Jobs placed on `gpu` that hold no instance yet, by billed size.
    fn mates<'a>(&self, gpu: usize, jobs: impl Iterator<Item = &'a u32>) -> Mix {
        Mix::of(jobs.map(|&j| self.billed(j as usize, gpu)))
    }

    /// smartmigd's pass rule for job `i` on `gpu` beside its `mates` (the
    /// jobs placed there that hold no instance yet), as its allocate runs
    /// it (`server/handle/allocate/burst.rs`): the pass in job order
    /// beside the busy instances; [`Geometry::turned_away`] names the jobs
    /// that cannot be built with the rest. Returns the mates `i` leaves
    /// room for (those kept), and what becomes of `i` ([`Turn`]).
    fn pass_rule(&self, i: u32, gpu: usize, mates: &[u32]) -> (Mix, Turn) {
        let all = self.mates(gpu, mates.iter());
        let mut pass: Vec<(u64, u8, u32)> = mates
            .iter()
            .chain([&i])
            .map(|&j| (self.jobs[j as usize].id, self.billed(j as usize, gpu), j))
            .collect();
        pass.sort_unstable();
        let st = &self.gpus[gpu].status;
        let sizes: Vec<u8> = pass.iter().map(|p| p.1).collect();
        let away: Vec<u32> = st
            .geometry
            .turned_away(st.busy, &sizes)
            .into_iter()
            .map(|k| pass[k].2)
            .collect();
        if away.is_empty() {
            return (all, Turn::Kept);
        }
        let kept = self.mates(gpu, mates.iter().filter(|j| !away.contains(j)));
        if !away.contains(&i) {
            return (kept, Turn::Kept);
        }
        let horizon = self.now + self.slurm.allocate_wait_s + HELD_MARGIN_S;
        let held = |j: u32| {
            self.slurm_end
                .get(j as usize)
                .copied()
                .flatten()
                .is_some_and(|end| end > horizon)
        };
        let busy_held = st
            .busy
            .iter()
            .all(|id| held(self.gpus[gpu].job_on[id.0 as usize]));
        let refused = busy_held && mates.iter().all(|&j| held(j));
        (all, if refused { Turn::Refused } else { Turn::Away })
    }

    /// smartmigd's allocate of job `i` on `gpu`: reuse, create or re-shape
    /// (module docs). `false`: no room now.
    fn allocate(
        &mut self,
        i: u32,
        gpu: usize,
        mates: &Mix,
        hooks: &mut RunHooks<'_>,
    ) -> Result<bool, SimError> {
        let Some(p) = self.profile[i as usize][self.gpus[gpu].slot] else {
            return Ok(false);
        };
        let need = self.jobs[i as usize].memory_gb;
        let st = &self.gpus[gpu].status;
        let g = st.geometry;
        // smartmigd's rule ([`Geometry::serve`]): creations wait for the
        // policy's reconfiguration to end; the choice leaves room for the
        // jobs placed here that hold no instance yet, and with holds keeps
        // what Slurm may still send.
        let now = GpuNow {
            layout: st.layout,
            taken: st.busy.union(st.reconfiguring),
            reusable: st.idle(),
            may_build: self.gpus[gpu].policy_until <= self.now,
            lend: self.slurm.lend,
        };
        let rule = self.offer_rule(gpu);
        let chosen = g
            .serve(now, p, need, mates, rule)
            .map(|(pid, way)| match way {
                Way::Reuse | Way::Lend => (pid, None),
                way => (pid, Some(way.destroyed())),
            });
        match chosen {
            None => Ok(false),
            Some((pid, None)) => {
                self.start(i, gpu, pid, hooks)?;
                Ok(true)
            }
            Some((pid, Some(destroy))) => {
                self.create(i, gpu, pid, destroy, hooks)?;
                Ok(true)
            }
        }
    }

    /// Creates `pid` for job `i` (after destroying idle `destroy`); the job
    /// runs when it is ready.
    fn create(
        &mut self,
        i: u32,
        gpu: usize,
        pid: SpotId,
        destroy: Layout,
        hooks: &mut RunHooks<'_>,
    ) -> Result<(), SimError> {
        let rt = self.cfg.reconfig_time_s;
        let ready = self.now + rt;
        let create = Layout::single(pid);
        let g = self.gpus[gpu].status.geometry;
        let kind = transition_kind(g, destroy, create);
        self.count_kind(kind);
        self.m.on_demand_builds += 1;
        let gp = &mut self.gpus[gpu];
        for id in destroy.iter() {
            gp.origin[id.0 as usize] = ReconfigKind::Reshape;
        }
        gp.origin[pid.0 as usize] = kind;
        gp.ready_at[pid.0 as usize] = ready;
        gp.job_on[pid.0 as usize] = i;
        let st = &mut gp.status;
        st.layout = st.layout.minus(destroy).with(pid);
        st.busy = st.busy.with(pid);
        st.reconfiguring = st.reconfiguring.with(pid);
        st.in_reconfiguration = true;
        st.reconfig_until = st.reconfig_until.max(ready);
        self.state[i as usize] = St::Creating {
            gpu: gpu as u32,
            pid: pid.0,
        };
        self.push(ready, EV_READY, gpu as u32, 0);
        if let Some(s) = hooks.sink.as_deref_mut() {
            s.record(&Record::Reconfig(ReconfigRecord {
                time: self.now,
                gpu,
                destroyed: g.describe(destroy),
                created: g.describe(create),
                duration: rt,
                ready,
                kind: Some(kind),
            }))?;
        }
        Ok(())
    }

    fn count_kind(&mut self, kind: ReconfigKind) {
        self.m.reconfigurations += 1;
        match kind {
            ReconfigKind::Fusion => self.m.fusions += 1,
            ReconfigKind::Fission => self.m.fissions += 1,
            ReconfigKind::Reshape => self.m.reshapes += 1,
        }
    }

    fn charge(&mut self, gpu: usize) {
        let now = self.now;
        let g = &mut self.gpus[gpu];
        let load = f64::from(g.active) / f64::from(g.total);
        g.energy += self.powers[g.slot].power_w(load) * (now - g.last);
        g.last = now;
    }

    /// Runs job `i` on the ready instance `pid` of `gpu`.
    fn start(
        &mut self,
        i: u32,
        gpu: usize,
        pid: SpotId,
        hooks: &mut RunHooks<'_>,
    ) -> Result<(), SimError> {
        let jobs: &'j [Job] = self.jobs;
        let job = &jobs[i as usize];
        let placement = *self.gpus[gpu].status.geometry.spot(pid);
        let compute = placement.compute();
        let speed = job.speed(compute, self.gpus[gpu].total);
        let end = self.now + job.work / speed;
        self.charge(gpu);
        let gp = &mut self.gpus[gpu];
        gp.active += u32::from(compute);
        gp.job_on[pid.0 as usize] = i;
        gp.status.busy = gp.status.busy.with(pid);
        gp.status.busy_until[pid.0 as usize] = end;
        // Per instance: each piece of a gang job counts.
        match gp.origin[pid.0 as usize] {
            ReconfigKind::Fusion => self.m.jobs_served_by_fusion += 1,
            ReconfigKind::Fission => self.m.jobs_served_by_fission += 1,
            ReconfigKind::Reshape => {}
        }
        self.state[i as usize] = St::Running;
        self.push(end, EV_COMPLETION, gpu as u32, u32::from(pid.0));
        self.busy_slice_s += f64::from(compute) * (end - self.now);
        if let Some(s) = hooks.sink.as_deref_mut() {
            let run = run_record(job, gpu, &placement, speed, self.now);
            s.record(&Record::Job(JobRecord { run, end }))?;
        }
        if !self.gangs.left.started(i, job.is_gang()) {
            return Ok(());
        }
        self.m.total_tardiness_s += (end - job.deadline).max(0.0);
        if end > job.deadline {
            self.m.late_jobs += 1;
        }
        let wait = self.now - job.arrival;
        self.wait_sum += wait;
        self.waits.push(wait as f32);
        self.slowdown_sum += bounded_slowdown(job.arrival, self.now, end);
        self.m.last_completion_s = self.m.last_completion_s.max(end);
        Ok(())
    }

    fn complete(&mut self, gpu: usize, pid: SpotId) {
        self.charge(gpu);
        let i = self.gpus[gpu].job_on[pid.0 as usize];
        let billed = self.billed(i as usize, gpu);
        let gp = &mut self.gpus[gpu];
        let compute = gp.status.geometry.spot(pid).compute();
        gp.active -= u32::from(compute);
        gp.job_on[pid.0 as usize] = u32::MAX;
        gp.status.busy = gp.status.busy.without(pid);
        gp.alloc -= billed;
        if self.gangs.left.ended(i) {
            self.state[i as usize] = St::Done;
            self.m.completed += 1;
            self.live -= 1;
        }
        // Jobs waiting here try again before Slurm's next pass. smartmigd
        // hears of the end in the job's epilog, before Slurm frees its
        // shards, and asks for the new hold then (after the waiting jobs
        // took their room): a pending hold at the top priority gets the
        // stranded shards before any job does.
        self.touched[gpu] = true;
        self.ended[gpu] = true;
    }

    /// Instances of `gpu` whose creation ends now become ready; the jobs
    /// they were made for start.
    fn ready(&mut self, gpu: usize, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        let now = self.now;
        let gp = &mut self.gpus[gpu];
        let done: Vec<SpotId> = gp
            .status
            .reconfiguring
            .iter()
            .filter(|id| gp.ready_at[id.0 as usize] <= now)
            .collect();
        for &id in &done {
            gp.status.reconfiguring = gp.status.reconfiguring.without(id);
        }
        if gp.status.reconfiguring.is_empty() {
            gp.status.in_reconfiguration = false;
        }
        for id in done {
            let i = self.gpus[gpu].job_on[id.0 as usize];
            let creating = St::Creating {
                gpu: gpu as u32,
                pid: id.0,
            };
            if self.state.get(i as usize) == Some(&creating) {
                self.start(i, gpu, id, hooks)?;
            } else if self.state.get(i as usize) == Some(&St::GangStarting) {
                self.gang_piece_ready(i, gpu, id, hooks)?;
            }
        }
        self.touched[gpu] = true;
        Ok(())
    }

    /// Job `i`'s wait ran out: smartmigd gives up and the job is requeued.
    /// Returns whether Slurm's pass should run (shards were freed).
    fn timeout(&mut self, i: u32, generation: u32) -> bool {
        let St::Waiting { gpu } = self.state[i as usize] else {
            return false;
        };
        if self.wait_gen[i as usize] != generation {
            return false;
        }
        let gpu = gpu as usize;
        let billed = self.billed(i as usize, gpu);
        let gp = &mut self.gpus[gpu];
        gp.alloc -= billed;
        gp.collided_at = Some(self.now);
        gp.waiting.retain(|&w| w != i);
        self.touched[gpu] = true;
        self.m.requeues += 1;
        self.requeued[i as usize] += 1;
        if self.requeued[i as usize] >= MAX_REQUEUES {
            self.state[i as usize] = St::Rejected;
            self.live -= 1;
        } else {
            self.state[i as usize] = St::Held;
            self.push(self.now + self.slurm.requeue_hold_s, EV_ELIGIBLE, i, 0);
        }
        true
    }

    /// An event called for Slurm's pass (`wanted`): whether it runs now
    /// (`pass_s = 0`, or now is on the pass grid); else one is scheduled at
    /// the next multiple of `pass_s`, shared by every event until then.
    fn batch(&mut self, wanted: bool) -> bool {
        let every = self.slurm.pass_s;
        if !wanted || every <= 0.0 {
            return wanted;
        }
        let at = (self.now / every).ceil() * every;
        if at <= self.now {
            return true;
        }
        self.schedule_pass(at);
        false
    }

    /// A pass at `at`, unless one is due by then already.
    fn schedule_pass(&mut self, at: f64) {
        if self.pass_at.is_none_or(|p| p > at) {
            self.pass_at = Some(at);
            self.push(at, EV_PASS, 0, 0);
        }
    }

    /// Job `i`'s requeue hold ended: it waits for Slurm's next periodic pass.
    fn eligible(&mut self, i: u32) {
        if self.state[i as usize] != St::Held {
            return;
        }
        let j = &self.jobs[i as usize];
        self.queue.insert((T(self.priority[i as usize]), j.id, i));
        self.state[i as usize] = St::Queued;
        let every = self.slurm.sched_interval_s;
        let at = ((self.now / every).floor() + 1.0) * every;
        self.schedule_pass(at);
    }

    /// After a batch of events: the jobs waiting on GPUs where something
    /// changed try again (smartmigd wakes them on a release, before Slurm
    /// places anything), Slurm's pass runs if an event called for it, and
    /// the holds of the GPUs that changed are scheduled.
    fn settle(&mut self, pass: bool, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        for gpu in 0..self.gpus.len() {
            if self.touched[gpu] {
                self.retry(gpu, hooks)?;
            }
            if std::mem::take(&mut self.ended[gpu]) {
                self.update_hold(gpu);
            }
        }
        if pass {
            self.pass(hooks)?;
        }
        for gpu in 0..self.gpus.len() {
            if !std::mem::take(&mut self.touched[gpu]) || self.slurm.holds.is_none() {
                continue;
            }
            if self.slurm.hold_lag_s > 0.0 {
                self.push(self.now + self.slurm.hold_lag_s, EV_HOLD, gpu as u32, 0);
            } else {
                self.update_hold(gpu);
            }
        }
        Ok(())
    }

    /// Another allocate for each job waiting on `gpu`, in order.
    fn retry(&mut self, gpu: usize, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        let waiting = std::mem::take(&mut self.gpus[gpu].waiting);
        let mut still = Vec::new();
        for (n, &i) in waiting.iter().enumerate() {
            let rest: Vec<u32> = still.iter().chain(&waiting[n + 1..]).copied().collect();
            let (mates, turn) = self.pass_rule(i, gpu, &rest);
            if turn == Turn::Refused {
                // Refused at once now that nothing ends within the wait.
                self.push(self.now, EV_TIMEOUT, i, self.wait_gen[i as usize]);
                still.push(i);
            } else if !self.allocate(i, gpu, &mates, hooks)? {
                still.push(i);
            }
        }
        self.gpus[gpu].waiting = still;
        Ok(())
    }

    /// The offer rule of `gpu`'s holds now; `None`: no holds.
    fn offer_rule(&self, gpu: usize) -> Option<OfferRule> {
        let since = self.gpus[gpu]
            .collided_at
            .map(|t| (self.now - t).max(0.0) as u64);
        Some(self.slurm.holds?.on_gpu(since))
    }

    /// Sets `gpu`'s hold to its stranded shards (at most what is free).
    /// Returns whether shards were given back to Slurm (its pass runs).
    fn update_hold(&mut self, gpu: usize) -> bool {
        let Some(rule) = self.offer_rule(gpu) else {
            return false;
        };
        let now = self.now;
        let gp = &mut self.gpus[gpu];
        let free = gp.total.saturating_sub(gp.alloc);
        let target = gp.status.geometry.stranded(gp.status.busy, free, rule);
        self.m.held_slice_s += f64::from(gp.held) * (now - gp.held_since);
        gp.held_since = now;
        let released = target < gp.held;
        gp.held = target;
        released
    }

    /// A decision epoch: the policy sees the jobs Slurm has not placed.
    fn epoch(
        &mut self,
        policy: &mut dyn RepartitionPolicy,
        hooks: &mut RunHooks<'_>,
    ) -> Result<(), SimError> {
        self.m.epochs += 1;
        let (pending, by_profile) = self.pending_view();
        let arrived = std::mem::take(&mut self.arrived);
        let arrivals: Vec<PendingJob> = arrived
            .iter()
            .map(|&i| self.pending_job(i as usize))
            .collect();
        let status: Vec<GpuStatus> = self.gpus.iter().map(|g| g.status.clone()).collect();
        let view = ClusterView {
            now: self.now,
            hour_of_day: (self.cfg.start_hour + self.now / 3600.0).rem_euclid(24.0),
            gpus: &status,
            pending: &pending,
            pending_by_profile: &by_profile,
            arrivals: &arrivals,
        };
        for d in policy.decide(&view) {
            let Some(gp) = self.gpus.get(d.gpu) else {
                self.m.rejected_decisions += 1;
                continue;
            };
            if d.target == gp.status.layout {
                continue;
            }
            if !gp.status.accepts(d.target) {
                self.m.rejected_decisions += 1;
                continue;
            }
            self.reconfigure(d.gpu, d.target, hooks)?;
        }
        Ok(())
    }

    /// Applies a policy decision the GPU accepts.
    fn reconfigure(
        &mut self,
        gpu: usize,
        target: Layout,
        hooks: &mut RunHooks<'_>,
    ) -> Result<(), SimError> {
        let rt = self.cfg.reconfig_time_s;
        let ready = self.now + rt;
        let g = self.gpus[gpu].status.geometry;
        let tr = g.transition(self.gpus[gpu].status.layout, target);
        let kind = transition_kind(g, tr.destroy, tr.create);
        self.count_kind(kind);
        let gp = &mut self.gpus[gpu];
        for id in tr.destroy.iter() {
            gp.origin[id.0 as usize] = ReconfigKind::Reshape;
        }
        for id in tr.create.iter() {
            gp.origin[id.0 as usize] = kind;
            gp.ready_at[id.0 as usize] = ready;
            gp.job_on[id.0 as usize] = u32::MAX;
        }
        gp.policy_until = ready;
        let st = &mut gp.status;
        st.layout = target;
        st.reconfiguring = tr.create;
        st.in_reconfiguration = true;
        st.reconfig_until = ready;
        self.push(ready, EV_READY, gpu as u32, 0);
        if let Some(s) = hooks.sink.as_deref_mut() {
            s.record(&Record::Reconfig(ReconfigRecord {
                time: self.now,
                gpu,
                destroyed: g.describe(tr.destroy),
                created: g.describe(tr.create),
                duration: rt,
                ready,
                kind: Some(kind),
            }))?;
        }
        Ok(())
    }

    /// The jobs in Slurm's queue (placeable or held after a requeue), as
    /// the policy sees them.
    fn pending_view(&self) -> (Vec<PendingJob>, PendingByProfile) {
        let mut by_profile = PendingByProfile::default();
        let mut out = Vec::new();
        for (i, st) in self.state.iter().enumerate() {
            if !matches!(st, St::Queued | St::Held) {
                continue;
            }
            for (slot, m) in self.models.iter().enumerate() {
                if let Some(p) = self.profile[i][slot] {
                    if let Some(pi) = m.spec().profiles.iter().position(|x| x.shape == p.shape) {
                        by_profile[*m as usize][pi] += 1;
                    }
                }
            }
            out.push(self.pending_job(i));
        }
        (out, by_profile)
    }

    /// Job `i` as a policy sees it waiting or arriving.
    fn pending_job(&self, i: usize) -> PendingJob {
        let j = &self.jobs[i];
        let mut shapes = [None; MODEL_COUNT];
        for (slot, m) in self.models.iter().enumerate() {
            if let Some(p) = self.profile[i][slot] {
                shapes[*m as usize] = Some(p.shape);
            }
        }
        PendingJob::of(j, shapes)
    }

    fn finish(&mut self, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        let horizon = self.workload_horizon().max(self.m.last_completion_s);
        self.now = horizon;
        let mut energy = 0.0;
        for gpu in 0..self.gpus.len() {
            self.charge(gpu);
            energy += self.gpus[gpu].energy;
            let gp = &self.gpus[gpu];
            self.m.held_slice_s += f64::from(gp.held) * (horizon - gp.held_since);
        }
        let never: Vec<u32> = (0..self.jobs.len() as u32)
            .filter(|&i| self.state[i as usize] != St::Done)
            .collect();
        for &i in &never {
            if self.state[i as usize] == St::Rejected {
                self.m.rejected += 1;
            } else {
                self.m.unserved += 1;
            }
        }
        // Jobs that never ran are charged by the one rule of `sim::metrics`
        // (late, on a whole GPU from the horizon on), as in the central
        // engine; the basis also lets a comparison re-charge the run at a
        // common horizon (`Metrics::at_horizon`).
        let (idle_w, whole_gpu_w) = charge_powers(&self.powers, self.gpus.iter().map(|g| g.slot));
        let basis = ChargeBasis {
            window_energy_j: energy,
            idle_w,
            whole_gpu_w,
            served_tardiness_s: self.m.total_tardiness_s,
            served_late: self.m.late_jobs,
            never_ran: never
                .iter()
                .map(|&i| NeverRan::of(&self.jobs[i as usize]))
                .collect(),
        };
        let sums = RunSums {
            waits: &mut self.waits,
            wait_sum: self.wait_sum,
            slowdown_sum: self.slowdown_sum,
            busy_slice_s: self.busy_slice_s,
            slices: self.gpus.iter().map(|g| f64::from(g.total)).sum::<f64>(),
        };
        self.m.finish(basis, horizon, self.jobs, sums);
        let Some(s) = hooks.sink.as_deref_mut() else {
            return Ok(());
        };
        for i in never {
            let j = &self.jobs[i as usize];
            let reason = if self.profile[i as usize].iter().all(Option::is_none) {
                "fits no profile of any GPU in the cluster".to_string()
            } else if self.gang_too_wide(i as usize) {
                format!(
                    "spans {} GPUs, each whole with {} GB; the cluster has {} such GPUs",
                    j.gpus,
                    j.memory_gb,
                    self.gang_capable(i as usize)
                )
            } else {
                format!(
                    "requeued {} times without finding room",
                    self.requeued[i as usize]
                )
            };
            s.record(&Record::Unserved(UnservedRecord::of(j, reason)))?;
        }
        s.record(&Record::Summary(self.m.summary_record(horizon)))?;
        Ok(())
    }
}

/// The profile each job is built on each model (by the cluster's model
/// slots), as `job_submit.lua` bills it ([`SlurmLike::bill_compute`]).
fn billed_profiles(
    jobs: &[Job],
    models: &[GpuModel],
    slurm: &SlurmLike,
) -> Vec<[Option<&'static ProfileSpec>; MODEL_COUNT]> {
    jobs.iter()
        .map(|j| {
            let mut out = [None; MODEL_COUNT];
            for (slot, m) in models.iter().enumerate() {
                out[slot] = if slurm.bill_compute {
                    super::asked_variant(j, *m)
                } else {
                    super::asked_profile(j, *m)
                };
            }
            out
        })
        .collect()
}
