//! The node's books: what smartmigd knows of its GPUs and of the jobs on
//! them, with one owner ([`Books`]) and a documented lock order.
//!
//! - Per GPU ([`Gpu::state`], an async mutex): its instances and who holds
//!   them ([`GpuBook`]), its energy meter and the turn the placement rule
//!   promised. Requests for one GPU are serialised; GPUs are independent.
//! - Per node ([`Books::ledger`], one synchronous mutex): the allocates
//!   waiting for room, Slurm's deadlines and time limits, the plans, advise
//!   mode's record, where the queue came from, who returned instances and
//!   the plugin's `oom_requeue`.
//! - Per node ([`Books::holds`], an async mutex): the holds on stranded
//!   shards this node has in Slurm.
//!
//! Lock order (docs/architecture.md, "The daemon's concurrency"): the
//! holds' lock comes first (only a hold sync takes it, and it may then take
//! GPU locks, one at a time); a task holds at most one GPU lock at a time; it may then take the policy's lock
//! and then the ledger; the services' own locks (memory estimates,
//! placement rule, usage log, journal) are taken last and hold nothing
//! else. The ledger is never held across an `.await`.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use super::advise::AdviseBook;
use super::context::unix_now_f64;
use super::holds::HoldBook;
use super::queue::ViewSource;
use super::reap::ReleaseCounts;
use crate::allocate::GpuBook;
use crate::memory::{next_larger_memory, Released};
use crate::mig::{Geometry, GpuModel, Mix, SpotId};
use crate::placement::{Contender, Turn};
use crate::plan::Plans;
use crate::protocol::WaitingJob;
use crate::slurm::{JobState, QueueSnapshot};
use crate::workload::{gpu_load, PowerModel};

/// Energy of one GPU integrated from the workload power model (used when
/// the backend has no energy counter, i.e. on the sim backend).
pub(super) struct EnergyMeter {
    power: PowerModel,
    last: f64,
    joules: f64,
}

impl EnergyMeter {
    pub(super) fn new(model: GpuModel) -> EnergyMeter {
        EnergyMeter {
            power: PowerModel::default_for(model),
            last: unix_now_f64(),
            joules: 0.0,
        }
    }

    /// Accounts the time since the last call at `load` (the load that held
    /// during that time: call before every busy/idle change).
    fn advance(&mut self, load: f64) -> f64 {
        let now = unix_now_f64();
        if now > self.last {
            self.joules += self.power.energy_j(load, now - self.last);
        }
        self.last = now;
        self.joules
    }
}

/// One GPU's state, behind its lock.
pub(super) struct GpuState {
    pub book: GpuBook,
    pub energy: EnergyMeter,
    /// The waiting allocate the placement rule chose last: it stands until
    /// that allocate takes it, stops waiting, or no longer fits, so that a
    /// rule whose answer drifts with the clock (the learned one) cannot
    /// make two allocates hand the turn back and forth.
    pub promised: Option<Turn>,
}

impl GpuState {
    fn load(&self) -> f64 {
        let g = self.book.geometry;
        gpu_load(
            self.book.busy().iter().map(|id| g.spot(id).compute()),
            g.spec.compute_slices,
        )
    }

    /// The modelled energy so far (call before every busy/idle change).
    pub(super) fn tick_energy(&mut self) -> f64 {
        let load = self.load();
        self.energy.advance(load)
    }
}

/// One GPU: its state behind an async mutex, and a wake-up for the
/// allocates waiting on it.
pub(super) struct Gpu {
    pub index: u32,
    pub model: GpuModel,
    /// The GPU's UUID (`GPU-...`) as the backend reported it at start
    /// (DCGM's `UUID` label), if it has one.
    pub uuid: Option<String>,
    pub state: tokio::sync::Mutex<GpuState>,
    pub released: Notify,
}

impl Gpu {
    pub(super) fn new(book: GpuBook, model: GpuModel, uuid: Option<String>) -> Gpu {
        Gpu {
            index: book.index,
            model,
            uuid,
            state: tokio::sync::Mutex::new(GpuState {
                book,
                energy: EnergyMeter::new(model),
                promised: None,
            }),
            released: Notify::new(),
        }
    }

    /// What a job on `placement` holds, as the memory bookkeeping sees it
    /// (profile, memory, and the next larger memory size for its compute
    /// slices).
    pub(super) fn held(&self, geometry: &Geometry, placement: SpotId) -> Released {
        let p = geometry.spot(placement);
        Released {
            gpu: self.index,
            profile: p.profile.name(),
            compute: p.compute(),
            memory_gb: p.profile.memory_gb,
            next_memory_gb: next_larger_memory(self.model.spec(), p.compute(), p.profile.memory_gb),
        }
    }
}

/// An allocate waiting for room on a GPU.
pub(super) struct Waiter {
    pub gpu: u32,
    pub since: Instant,
    pub uid: u32,
    pub contender: Contender,
    /// The deadline and time limit the request carried (the plugin sends
    /// none: Slurm's come from the queue reads).
    pub asked: (Option<i64>, Option<u64>),
}

/// What Slurm said about a job's time: its deadline (Slurm `--deadline`,
/// else the end of its time limit; infinite when neither) and time limit.
#[derive(Clone, Copy, Debug)]
pub(super) struct JobTimes {
    pub deadline: f64,
    pub time_limit_s: Option<u64>,
}

/// The node-wide part of the books, behind one lock ([`Books::ledger`]).
#[derive(Default)]
pub(super) struct Ledger {
    /// Allocates waiting for room, for status and for the placement rule.
    pub waiting: HashMap<u64, Waiter>,
    /// Deadlines and time limits of the jobs the last queue read showed
    /// (the placement rule orders waiting allocates by them).
    pub job_times: HashMap<u64, JobTimes>,
    /// Slurm's `A_T` names of the array tasks the last queue read showed
    /// (job id -> name), for status.
    pub array_names: HashMap<u64, String>,
    /// Reconfigurations pending (`mode = "confirm"`) and applied.
    pub plans: Plans,
    /// What advise mode watches and last recorded (`mode = "advise"`).
    pub advise: AdviseBook,
    /// Where the view of the queue came from last (summary or Slurm).
    pub view_source: ViewSource,
    /// Releases that came from slurmd's job epilog versus from the reaper,
    /// to notice a plugin whose epilog never runs.
    pub releases: ReleaseCounts,
    /// The plugin's `oom_requeue`, as the last allocate said.
    pub plugin_oom_requeue: Option<bool>,
    /// When the queue was last read: an allocate that finds no room
    /// re-reads it at most every [`super::queue::QUEUE_REFRESH`].
    pub queue_read: Option<Instant>,
    /// The shard jobs the last queue read showed running on this node:
    /// an allocate leaves room for those of its GPU that hold no instance
    /// yet ([`Ledger::mates`]).
    pub shard_jobs: Vec<ShardJob>,
    /// Slurm's GPU order against the backend's: checked at start, asked
    /// again until Slurm answers ([`super::gpu_order`]).
    pub gpu_order: super::gpu_order::GpuOrderCheck,
    /// Why smartmigd requeued a job (to make room for an interactive
    /// step), for the job's next run to print in its output: given to its
    /// first allocate after the requeue ([`super::room`]).
    pub requeue_notes: HashMap<u64, String>,
}

/// A shard job Slurm runs on this node, as the last queue read showed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ShardJob {
    pub job_id: u64,
    pub gpu: u32,
    pub shards: u8,
    /// Unix second Slurm started it.
    pub start_time: u64,
}

impl Ledger {
    /// A job's deadline and time limit: as the client sent them, else from
    /// the last queue read (Slurm's `--deadline`, else the end of the time
    /// limit of a running job).
    pub(super) fn times_of(
        &self,
        job_id: u64,
        deadline: Option<i64>,
        time_limit_s: Option<u64>,
    ) -> JobTimes {
        let known = self.job_times.get(&job_id).copied();
        JobTimes {
            deadline: deadline
                .map(|d| d as f64)
                .or(known.map(|k| k.deadline))
                .unwrap_or(f64::INFINITY),
            time_limit_s: time_limit_s.or(known.and_then(|k| k.time_limit_s)),
        }
    }

    /// A waiting allocate as the placement rule sees it now: its times as
    /// the last queue read knows them (it may have come after it started
    /// waiting).
    fn contender_now(&self, w: &Waiter) -> Contender {
        let t = self.times_of(w.contender.job_id, w.asked.0, w.asked.1);
        Contender {
            deadline: t.deadline,
            time_limit_s: t.time_limit_s,
            ..w.contender.clone()
        }
    }

    /// The jobs an allocate of `except` on `book`'s GPU must leave room
    /// for ([`crate::mig::Geometry::choose_spot`]): the other allocates
    /// waiting there, and the shard jobs Slurm started there since
    /// `since` (Unix seconds) that hold no instance yet, mostly the rest of
    /// the scheduling pass that started `except`, whose allocates are on
    /// their way.
    pub(super) fn mates(&self, book: &GpuBook, except: u64, since: u64) -> Mix {
        let spec = book.geometry.spec;
        let billed = |shards: u8| {
            crate::mig::select_profile(spec, shards, None).map_or(0, |p| p.shape.compute)
        };
        let waiting = self
            .waiting
            .iter()
            .filter(|(&job, w)| w.gpu == book.index && job != except)
            .map(|(_, w)| billed(w.contender.need.slices));
        let started = self
            .shard_jobs
            .iter()
            .filter(|j| j.gpu == book.index && j.job_id != except && j.start_time >= since)
            .filter(|j| !self.waiting.contains_key(&j.job_id) && book.find_job(j.job_id).is_none())
            .map(|j| billed(j.shards));
        Mix::of(waiting.chain(started))
    }

    /// Remembers the shard jobs `q` shows running on `node`.
    pub(super) fn remember_shard_jobs(&mut self, q: &QueueSnapshot, node: &str) {
        self.shard_jobs = q
            .jobs
            .iter()
            .filter(|j| j.state == JobState::Running && j.shards > 0 && j.hold_of().is_none())
            .filter(|j| crate::slurm::names_node(&j.nodes, node))
            .filter_map(|j| {
                Some(ShardJob {
                    job_id: j.job_id,
                    gpu: j.gpu?,
                    shards: j.shards,
                    start_time: j.start_time,
                })
            })
            .collect();
    }

    /// The other allocates waiting on `gpu`, as the placement rule sees them.
    pub(super) fn contenders(&self, gpu: u32, except: u64) -> Vec<Contender> {
        self.waiting
            .iter()
            .filter(|(&job, w)| w.gpu == gpu && job != except)
            .map(|(_, w)| self.contender_now(w))
            .collect()
    }

    /// The waiting allocates as `status` lists them, longest wait first.
    pub(super) fn waiting_jobs(&self) -> Vec<WaitingJob> {
        let mut waiting: Vec<WaitingJob> = self
            .waiting
            .iter()
            .map(|(&job_id, w)| WaitingJob {
                job_id,
                gpu: w.gpu,
                slices: w.contender.need.slices,
                waiting_s: w.since.elapsed().as_secs(),
                uid: Some(w.uid),
                deadline: {
                    let d = self.contender_now(w).deadline;
                    d.is_finite().then_some(d as i64)
                },
            })
            .collect();
        waiting.sort_by(|a, b| b.waiting_s.cmp(&a.waiting_s).then(a.job_id.cmp(&b.job_id)));
        waiting
    }

    /// Keeps each listed job's deadline and time limit for the placement
    /// rule: Slurm's `--deadline`, else the end of a running job's time
    /// limit.
    pub(super) fn remember_job_times(&mut self, q: &QueueSnapshot) {
        self.job_times = q
            .jobs
            .iter()
            .map(|j| {
                let end = (j.end_time > 0 && j.time_limit_s.is_some()).then_some(j.end_time);
                let deadline = j.deadline.or(end).map_or(f64::INFINITY, |d| d as f64);
                (
                    j.job_id,
                    JobTimes {
                        deadline,
                        time_limit_s: j.time_limit_s,
                    },
                )
            })
            .collect();
        self.array_names = q
            .jobs
            .iter()
            .filter(|j| j.array_task.is_some())
            .map(|j| (j.job_id, j.slurm_id()))
            .collect();
    }
}

/// The node's books: the GPUs, each behind its own lock, and the
/// node-wide [`Ledger`] behind one more.
pub(super) struct Books {
    pub gpus: Vec<Gpu>,
    ledger: Mutex<Ledger>,
    /// The holds on stranded shards this node has in Slurm.
    pub holds: HoldBook,
    /// This daemon drained the node for a GPU-fatal XID and has not seen
    /// it resumed since ([`crate::health::node_action`]).
    pub health_drained: std::sync::atomic::AtomicBool,
    /// Taken by an allocate that reads the queue for its scheduling pass:
    /// the pass's other allocates wait for that read instead of deciding
    /// on the older one (measured: the first job of a pass reading, the
    /// two behind it placed without knowing of it).
    pub pass_read: tokio::sync::Mutex<()>,
}

impl Books {
    pub(super) fn new(gpus: Vec<Gpu>) -> Books {
        Books {
            gpus,
            ledger: Mutex::new(Ledger::default()),
            holds: HoldBook::default(),
            health_drained: std::sync::atomic::AtomicBool::new(false),
            pass_read: tokio::sync::Mutex::new(()),
        }
    }

    /// The node-wide books, also after a panic elsewhere poisoned the lock
    /// (every update leaves them consistent). Never hold it across an
    /// `.await` or while taking a GPU's lock.
    pub(super) fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The GPU with `index`.
    pub(super) fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.get(index as usize)
    }

    pub(super) fn models(&self) -> Vec<GpuModel> {
        self.gpus.iter().map(|g| g.model).collect()
    }
}

/// Removes a job from the ledger's waiting allocates when its allocate
/// returns, by whichever path, and wakes the GPU's other waiters: the
/// placement rule may have been keeping one of them for this job.
pub(super) struct WaitingGuard<'a> {
    pub books: &'a Books,
    pub gpu: &'a Gpu,
    pub job_id: u64,
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.books.ledger().waiting.remove(&self.job_id);
        self.gpu.released.notify_waiters();
    }
}
