//! The imperative shell: the Unix socket, peer credentials, per-GPU
//! serialisation, the backend calls, the journal, signals and the loops.
//! Decisions come from [`super::allocate`] and [`crate::policy`]; this
//! module only executes them. Its parts:
//!
//! - this file: start-up, the socket, allocate/release/status, `run`;
//! - [`reconcile`]: agreement with Slurm (queue reads, reaper, resume,
//!   GPU order, out-of-memory requeue);
//! - [`view`]: the policy's view of the node, applying its targets,
//!   publishing the layout;
//! - [`reload`], SIGHUP;
//! - [`http`]: the Prometheus endpoint.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{watch, Mutex, Notify};
use tokio::task::JoinSet;

use super::access::{self, Holder, IsolationError};
use super::allocate::{Assignment, GpuBook, Need, Plan, Refusal};
use super::backend::{nvml::NvmlBackend, sim::SimBackend, Backend, BackendError};
use super::config::{BackendKind, Config, ConfigError, Mode};
use super::fsutil::ensure_dir;
use super::journal::{self, Durability, Journal};
use super::memory::{next_larger_memory, EarlyTrigger, MemoryState, OomPolicy, Released, Sizing};
use super::metrics::{InstanceCount, Metrics};
use super::placement::{Contender, PlacementChoiceError, PlacementRule, Turn};
use super::plan::Plans;
use super::policy_choice::{build as build_policy, Built, PolicyChoiceError};
use super::protocol::{
    error_line, ok_line, parse_request, AllocAction, AllocateReply, AllocateRequest, ErrorBody,
    ErrorKind, GpuStatus, HealthReply, InstanceStatus, OomDecision, PlanEffect, PlanReply,
    PlanStatus, ReconcileReply, ReleaseReply, ReleaseRequest, Request, StatusReply, WaitingJob,
};
use super::slurm::{
    layout_features, merge_features, CommandSlurm, JobState, NoSlurm, QueueSnapshot, SlurmClient,
};
use super::usage::{
    merge_comment, slice_seconds, SliceTag, UsageRecord, USAGE_LOG, USAGE_LOG_MAX_BYTES,
};
use crate::mig::{Geometry, GpuModel, Layout, PlacementId};
use crate::policy::{
    self, ClusterView, PendingByProfile, PendingJob, RepartitionPolicy, MAX_PLACEMENTS, MODEL_COUNT,
};
use crate::workload::memory_estimate::EstimateError;
use crate::workload::{gpu_load, MemoryKey, PowerModel, SpeedupCurve};

mod advise;
mod http;
mod reconcile;
pub mod redact;
mod reload;
mod view;

use http::serve_metrics;
pub use reconcile::ReleaseCounts;
use reconcile::{check_gpu_order, RequeueWhen};

/// Errors that stop the daemon from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Journal(#[from] super::journal::JournalError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("another smartmigd is already listening on {0}")]
    AlreadyRunning(PathBuf),
    // The wrapped errors are quoted, not `#[source]`: smartmigd prints the
    // chain with `{:#}`, which would repeat them.
    /// The configuration was not validated ([`Config::validate`]) and is
    /// invalid.
    #[error("invalid configuration: {0}")]
    Config(ConfigError),
    #[error("policy: {0}")]
    Policy(PolicyChoiceError),
    #[error("placement: {0}")]
    Placement(PlacementChoiceError),
    /// `[memory.estimator]` is invalid.
    #[error("memory estimates: {0}")]
    Memory(EstimateError),
    #[error("Slurm and smartmigd number the GPUs differently: {0}. Slurm numbers the GPUs of gres.conf by device name (/dev/nvidiaN in sorted order), smartmigd by NVML index; they agree when NVML's GPU N is /dev/nvidiaN (`nvidia-smi -q` shows each GPU's Minor Number)")]
    GpuOrder(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StartError + '_ {
    move |source| StartError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn unix_now_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Energy of one GPU integrated from the workload power model (used when
/// the backend has no energy counter, i.e. on the sim backend).
struct EnergyMeter {
    power: PowerModel,
    last: f64,
    joules: f64,
}

impl EnergyMeter {
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

struct GpuState {
    book: GpuBook,
    energy: EnergyMeter,
    /// The waiting allocate the placement rule chose last: it stands until
    /// that allocate takes it, stops waiting, or no longer fits, so that a
    /// rule whose answer drifts with the clock (the learned one) cannot
    /// make two allocates hand the turn back and forth.
    promised: Option<Turn>,
}

impl GpuState {
    fn load(&self) -> f64 {
        let g = self.book.geometry;
        gpu_load(
            self.book.busy().iter().map(|id| g.placement(id).compute()),
            g.spec.compute_slices,
        )
    }

    fn tick_energy(&mut self) -> f64 {
        let load = self.load();
        self.energy.advance(load)
    }
}

/// One GPU: its state behind an async mutex (requests for one GPU are
/// serialised; GPUs are independent), and a wake-up for waiting allocates.
struct GpuSlot {
    index: u32,
    model: GpuModel,
    state: Mutex<GpuState>,
    released: Notify,
}

/// Appends `text` to `path`, first moving a file of `max_bytes` or more to
/// `<path>.1`. A new file is mode 0600: it names every user's jobs, which
/// `status` shows only to root, `slurm_user` and operators.
fn append_rotating(path: &Path, text: &str, max_bytes: u64) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if std::fs::metadata(path).is_ok_and(|m| m.len() >= max_bytes) {
        std::fs::rename(path, super::usage::rotated(path))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    // A file left looser (by hand, or an older version) is tightened.
    if f.metadata()?.permissions().mode() & 0o777 != 0o600 {
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    f.write_all(text.as_bytes())
}

/// What a job on `placement` of `slot` holds, as the memory bookkeeping
/// sees it (profile, memory, and the next larger memory size for its
/// compute slices).
fn released_of(slot: &GpuSlot, geometry: &Geometry, placement: PlacementId) -> Released {
    let p = geometry.placement(placement);
    Released {
        gpu: slot.index,
        profile: p.profile.name(),
        compute: p.compute(),
        memory_gb: p.profile.memory_gb,
        next_memory_gb: next_larger_memory(slot.model.spec(), p.compute(), p.profile.memory_gb),
    }
}

/// The running daemon.
pub struct Daemon {
    /// Everything SIGHUP may change, swapped as one snapshot.
    live: RwLock<Arc<Live>>,
    config_path: PathBuf,
    backend: Arc<dyn Backend>,
    slots: Vec<GpuSlot>,
    journal: Journal,
    metrics: Metrics,
    /// Learned memory estimates and the out-of-memory ledger (short,
    /// synchronous critical sections; never held across an await).
    memory: Arc<std::sync::Mutex<MemoryState>>,
    node: String,
    started: Instant,
    shutdown: watch::Sender<bool>,
    /// When the queue was last read (`squeue --json`): an allocate that
    /// finds no room re-reads it at most every [`QUEUE_REFRESH`].
    queue_read: std::sync::Mutex<Option<Instant>>,
    /// Releases that came from slurmd's job epilog versus from the reaper,
    /// to notice a plugin whose epilog never runs.
    releases: std::sync::Mutex<ReleaseCounts>,
    /// Connections unprivileged users hold now ([`Daemon::admit`]).
    connections: std::sync::Mutex<Connections>,
    /// Allocates waiting for room, for status and for the placement rule.
    waiting: std::sync::Mutex<HashMap<u64, Waiter>>,
    /// Deadlines and time limits of the jobs the last `squeue` read showed
    /// (the placement rule orders waiting allocates by them).
    job_times: std::sync::Mutex<HashMap<u64, JobTimes>>,
    /// Slurm accounts of running jobs, as read when their `AdminComment`
    /// was tagged (for the usage log).
    accounts: Arc<std::sync::Mutex<HashMap<u64, String>>>,
    /// Slurm's `A_T` name of array tasks (job id -> name), from the last
    /// queue read and the `AdminComment` reads, for status.
    array_names: Arc<std::sync::Mutex<HashMap<u64, String>>>,
    /// Reconfigurations pending (`mode = "confirm"`) and applied.
    plans: std::sync::Mutex<Plans>,
    /// Serialises appends to the usage log.
    usage_log: std::sync::Mutex<()>,
    /// The plugin's `oom_requeue`, as the last allocate said.
    plugin_oom_requeue: std::sync::Mutex<Option<bool>>,
    /// What advise mode watches and last recorded (`mode = "advise"`).
    advise: std::sync::Mutex<advise::AdviseBook>,
    /// Where the view of the queue came from last (summary or Slurm).
    view_source: std::sync::Mutex<reconcile::ViewSource>,
}

/// The settings in effect, and what is built from them: one immutable
/// snapshot that SIGHUP replaces whole ([`Daemon::live`]), so a request or
/// an epoch that took it sees the old settings or the new ones, never a mix
/// (say the new Slurm commands with the old policy).
struct Live {
    config: Arc<Config>,
    slurm: Arc<dyn SlurmClient>,
    /// The uid of `slurm_user` (allowed to write besides root).
    slurm_uid: Option<u32>,
    /// `operators`, resolved: they see every job in `status`.
    operator_uids: Vec<u32>,
    /// The policy has state of its own (learned, greedy's batching window),
    /// so it sits behind its own lock; a new one comes with a new snapshot.
    policy: Arc<Mutex<Box<dyn RepartitionPolicy + Send>>>,
    policy_name: String,
    /// Which waiting allocate goes first (`placement`); asked under a
    /// GPU's lock, never across an await.
    placement: Arc<std::sync::Mutex<PlacementRule>>,
}

impl Live {
    fn new(config: Config, policy: Built, placement: PlacementRule) -> Live {
        let (policy, policy_name) = policy;
        Live {
            placement: Arc::new(std::sync::Mutex::new(placement)),
            slurm: slurm_client(&config),
            slurm_uid: resolve_uid(&config.slurm_user),
            operator_uids: config
                .operators
                .iter()
                .filter_map(|u| {
                    let uid = resolve_uid(u);
                    if uid.is_none() {
                        tracing::warn!(operator = %u, "operators: no such user; ignored");
                    }
                    uid
                })
                .collect(),
            config: Arc::new(config),
            policy: Arc::new(Mutex::new(policy)),
            policy_name,
        }
    }
}

/// Connections of unprivileged users, per uid and in total.
#[derive(Debug, Default)]
struct Connections {
    per_uid: HashMap<u32, usize>,
    total: usize,
}

/// One admitted unprivileged connection; gives its place back when dropped.
struct Admitted {
    daemon: Arc<Daemon>,
    uid: u32,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut c = self
            .daemon
            .connections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                c.per_uid.remove(&self.uid);
            }
        }
    }
}

/// An allocate waiting for room on a GPU.
struct Waiter {
    gpu: u32,
    since: Instant,
    uid: u32,
    contender: Contender,
    /// The deadline and time limit the request carried (the plugin sends
    /// none: Slurm's come from the queue reads).
    asked: (Option<i64>, Option<u64>),
}

/// What Slurm said about a job's time: its deadline (Slurm `--deadline`,
/// else the end of its time limit; infinite when neither) and time limit.
#[derive(Clone, Copy, Debug)]
struct JobTimes {
    deadline: f64,
    time_limit_s: Option<u64>,
}

/// Removes a job from [`Daemon::waiting`] when its allocate returns, by
/// whichever path, and wakes the GPU's other waiters: the placement rule
/// may have been keeping one of them for this job.
struct WaitingGuard<'a> {
    daemon: &'a Daemon,
    slot: &'a GpuSlot,
    job_id: u64,
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.daemon
            .waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.job_id);
        self.slot.released.notify_waiters();
    }
}

fn slurm_client(config: &Config) -> Arc<dyn SlurmClient> {
    if config.slurm.enabled {
        Arc::new(CommandSlurm {
            squeue: config.slurm.squeue.clone(),
            sinfo: config.slurm.sinfo.clone(),
            scontrol: config.slurm.scontrol.clone(),
            slurmd: config.slurm.slurmd.clone(),
            timeout: Duration::from_secs(config.slurm.command_timeout_s),
        })
    } else {
        Arc::new(NoSlurm)
    }
}

/// The uid allowed to write besides root, from a user name or a number.
fn resolve_uid(user: &str) -> Option<u32> {
    if let Ok(uid) = user.parse::<u32>() {
        return Some(uid);
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Some(u.uid.as_raw()),
        Ok(None) => {
            tracing::warn!(
                slurm_user = user,
                "slurm_user does not exist; only root may allocate/release"
            );
            None
        }
        Err(e) => {
            tracing::warn!(
                slurm_user = user,
                "cannot look up slurm_user ({e}); only root may allocate/release"
            );
            None
        }
    }
}

/// Characters of a job name kept in a memory key.
const MAX_JOB_NAME_CHARS: usize = 200;

/// The user name of `uid` (the user part of a memory key), or the uid as
/// text when it has none.
fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => uid.to_string(),
    }
}

fn backend_error(e: &BackendError) -> ErrorBody {
    ErrorBody::new(ErrorKind::Backend, e.to_string())
}

/// Gives the access files of every instance of `book`'s GPU (or only of
/// instance `only`) to the user of the job holding it, or to root while it
/// is idle ([`crate::access`]). Tries every file; returns the first failure
/// (each one is logged).
fn enforce_access(
    backend: &dyn Backend,
    book: &GpuBook,
    only: Option<&str>,
) -> Result<(), IsolationError> {
    let mut first = None;
    for inst in book
        .instances
        .iter()
        .filter(|i| only.is_none_or(|u| u == i.uuid))
    {
        let holder = match &inst.job {
            Some(a) if a.uid != 0 => Holder::User(a.uid),
            _ => Holder::Root,
        };
        let files = match backend.access_files(book.index, &inst.uuid) {
            Ok(f) => f,
            Err(source) => {
                let e = IsolationError::Files {
                    gpu: book.index,
                    uuid: inst.uuid.clone(),
                    source,
                };
                tracing::error!("{e}");
                first.get_or_insert(e);
                continue;
            }
        };
        for f in files {
            match access::restrict(&f, holder) {
                Ok(true) => {
                    tracing::debug!(gpu = book.index, uuid = %inst.uuid, file = %f.display(), %holder, "access file restricted");
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(gpu = book.index, uuid = %inst.uuid, "{e}");
                    first.get_or_insert(e.into());
                }
            }
        }
    }
    first.map_or(Ok(()), Err)
}

impl Daemon {
    /// Journals `book` before a reply. On disk the `fdatasync` blocks, so
    /// the worker thread is handed over (`block_in_place`); on a tmpfs the
    /// write takes microseconds and the hand-over would cost more.
    fn save_journal(&self, book: &GpuBook) -> Result<(), super::journal::JournalError> {
        match self.journal.durability() {
            Durability::Disk => tokio::task::block_in_place(|| self.journal.save(book)),
            Durability::Memory => self.journal.save(book),
        }
    }

    /// [`enforce_access`] when `isolate_devices` is on.
    fn isolate(&self, book: &GpuBook, only: Option<&str>) -> Result<(), IsolationError> {
        if self.config().isolates() {
            enforce_access(self.backend.as_ref(), book, only)
        } else {
            Ok(())
        }
    }

    /// Opens the backend and journal, rebuilds the books and reconciles
    /// journal <-> backend <-> Slurm. Nothing is served yet.
    pub fn start(config: Config, config_path: PathBuf) -> Result<Arc<Daemon>, StartError> {
        ensure_dir(&config.state_dir, 0o700).map_err(io_err(&config.state_dir))?;
        let backend: Arc<dyn Backend> = match config.backend {
            BackendKind::Sim => {
                let models = config.sim_gpus().map_err(StartError::Config)?;
                let mut sim = config.sim.clone();
                if sim.caps_dir.is_none() {
                    sim.caps_dir = config.socket.parent().map(|d| d.join("nvidia-caps"));
                }
                Arc::new(SimBackend::open(&config.state_dir, &models, sim)?)
            }
            BackendKind::Nvml => Arc::new(NvmlBackend::open(&config.nvml)?),
        };
        let (journal, moved) = journal::open_moving(&config.journal_dir(), &config.state_dir)?;
        if let Some(m) = moved {
            tracing::warn!(
                from = %m.from.display(),
                to = %config.journal_dir().display(),
                assignments = m.assignments,
                "journal_dir changed: the journal and its assignments were moved"
            );
        }
        tracing::info!(
            dir = %config.journal_dir().display(),
            durability = ?journal.durability(),
            "journal open"
        );
        let memory = MemoryState::open(&config.state_dir, &config.memory.estimator)
            .map_err(StartError::Memory)?;
        let now = unix_now();
        let mut slots = Vec::new();
        for gpu in backend.gpus() {
            let geometry = Geometry::of(gpu.model);
            let mut book = GpuBook::new(gpu.index, geometry, now);
            for inst in backend.list(gpu.index)? {
                if geometry.fits(book.layout(), inst.placement) {
                    book.add_instance(inst.placement, inst.uuid, now);
                } else {
                    tracing::warn!(gpu = gpu.index, uuid = %inst.uuid, "instance overlaps another; ignored");
                }
            }
            for entry in journal.load(gpu.index)? {
                let job = entry.assignment.job_id;
                match book.find_uuid(&entry.uuid) {
                    Some(i) if i.job.is_none() && book.find_job(job).is_none() => {
                        book.assign(&entry.uuid, entry.assignment);
                    }
                    Some(_) => tracing::warn!(gpu = gpu.index, job, uuid = %entry.uuid,
                        "journal assigns an instance twice; keeping the first assignment"),
                    None => tracing::warn!(gpu = gpu.index, job, uuid = %entry.uuid,
                        "journaled instance no longer exists (reboot or manual change); dropping the assignment"),
                }
            }
            let power = PowerModel::default_for(gpu.model);
            slots.push(GpuSlot {
                index: gpu.index,
                model: gpu.model,
                state: Mutex::new(GpuState {
                    book,
                    energy: EnergyMeter {
                        power,
                        last: unix_now_f64(),
                        joules: 0.0,
                    },
                    promised: None,
                }),
                released: Notify::new(),
            });
        }
        let models: Vec<GpuModel> = slots.iter().map(|s| s.model).collect();
        let policy = build_policy(&config.policy, &models).map_err(StartError::Policy)?;
        let placement =
            PlacementRule::build(&config.placement, &models).map_err(StartError::Placement)?;
        let live = Live::new(config, policy, placement);
        let (config, slurm) = (live.config.clone(), live.slurm.clone());
        let node = config.node_name.clone().unwrap_or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "localhost".into())
        });
        if config.mode == Mode::Advise {
            // The site's gpu GRES are its MIG devices, not whole GPUs.
            tracing::info!(node = %node, log = %config.advice_log().display(),
                "advise mode: watching the node's own MIG setup and recording what the policy would do; \
                 no instance is created or destroyed, no device file changed, allocate is refused");
        } else if config.slurm.enabled {
            tracing::info!(node = %node, "asking Slurm (slurmd -G, squeue) about this node; smartmigd waits up to slurm.command_timeout_s for each answer");
            check_gpu_order(backend.as_ref(), slurm.as_ref(), &node)?;
        }
        // Jobs that ended while the daemon was down give their instances back.
        if config.slurm.enabled {
            match slurm.queue().map(|q| q.live()) {
                Ok(live) => {
                    for slot in &mut slots {
                        let st = slot.state.get_mut();
                        let ended: Vec<u64> = st
                            .book
                            .instances
                            .iter()
                            .filter_map(|i| i.job.as_ref().map(|a| a.job_id))
                            .filter(|j| !live.contains(j))
                            .collect();
                        for job in ended {
                            st.book.release(job, now);
                            tracing::info!(gpu = slot.index, job, "job ended while smartmigd was down; instance released");
                        }
                    }
                }
                Err(e) => tracing::warn!("cannot ask Slurm which jobs still run ({e}); keeping every journaled assignment"),
            }
        }
        for slot in &mut slots {
            let book = &slot.state.get_mut().book;
            journal.save(book)?;
            // Whatever a crash left (a release whose files were not given
            // back, a file changed by hand), repaired before serving.
            if config.isolates() {
                if let Err(e) = enforce_access(backend.as_ref(), book, None) {
                    tracing::error!(
                        gpu = slot.index,
                        "device isolation not restored at start: {e}"
                    );
                }
            }
        }
        let (shutdown, _) = watch::channel(false);
        let daemon = Daemon {
            live: RwLock::new(Arc::new(live)),
            config_path,
            backend,
            slots,
            journal,
            metrics: Metrics::new(),
            memory: Arc::new(std::sync::Mutex::new(memory)),
            node,
            started: Instant::now(),
            shutdown,
            queue_read: std::sync::Mutex::new(None),
            releases: std::sync::Mutex::new(ReleaseCounts::default()),
            waiting: std::sync::Mutex::new(HashMap::new()),
            job_times: std::sync::Mutex::new(HashMap::new()),
            accounts: Arc::new(std::sync::Mutex::new(HashMap::new())),
            array_names: Arc::new(std::sync::Mutex::new(HashMap::new())),
            plans: std::sync::Mutex::new(Plans::default()),
            usage_log: std::sync::Mutex::new(()),
            connections: std::sync::Mutex::new(Connections::default()),
            plugin_oom_requeue: std::sync::Mutex::new(None),
            advise: std::sync::Mutex::new(advise::AdviseBook::default()),
            view_source: std::sync::Mutex::new(reconcile::ViewSource::default()),
        };
        Ok(Arc::new(daemon))
    }

    /// The settings in effect: one snapshot, consistent in itself. Take it
    /// once per request or epoch and read everything from it.
    fn live(&self) -> Arc<Live> {
        self.live
            .read()
            .map(|l| l.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    pub fn config(&self) -> Arc<Config> {
        self.live().config.clone()
    }

    fn slurm(&self) -> Arc<dyn SlurmClient> {
        self.live().slurm.clone()
    }

    fn policy_name(&self) -> String {
        self.live().policy_name.clone()
    }

    /// The policy in effect (a SIGHUP installs a new one, with its snapshot).
    fn policy(&self) -> Arc<Mutex<Box<dyn RepartitionPolicy + Send>>> {
        self.live().policy.clone()
    }

    /// The plans, also after a panic elsewhere poisoned the lock.
    fn plans(&self) -> std::sync::MutexGuard<'_, Plans> {
        self.plans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The memory state, also after a panic elsewhere poisoned the lock
    /// (every update leaves it consistent).
    fn memory(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.memory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn authorized(&self, uid: u32) -> bool {
        uid == 0 || self.live().slurm_uid == Some(uid)
    }

    /// Takes a connection place for unprivileged `uid`, or says why not
    /// (`max_connections_per_user`, `max_connections`). Root and
    /// `slurm_user` are never counted nor refused.
    fn admit(self: &Arc<Self>, uid: u32) -> Result<Option<Admitted>, String> {
        if self.authorized(uid) {
            return Ok(None);
        }
        let cfg = self.config();
        let mut c = self
            .connections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mine = c.per_uid.get(&uid).copied().unwrap_or(0);
        if mine >= cfg.max_connections_per_user {
            return Err(format!(
                "uid {uid} holds {mine} connections (max_connections_per_user {})",
                cfg.max_connections_per_user
            ));
        }
        if c.total >= cfg.max_connections {
            return Err(format!(
                "unprivileged users hold {} connections (max_connections {})",
                c.total, cfg.max_connections
            ));
        }
        c.total += 1;
        *c.per_uid.entry(uid).or_default() += 1;
        Ok(Some(Admitted {
            daemon: Arc::clone(self),
            uid,
        }))
    }

    /// Whether `uid` sees every job in `status`: root, the Slurm user and
    /// the configured `operators` ([`redact`]).
    fn sees_everything(&self, uid: u32) -> bool {
        self.authorized(uid) || self.live().operator_uids.contains(&uid)
    }

    /// Installs the policy's initial layout on GPUs that have no instance at
    /// all (a fresh boot). `none` leaves GPUs empty: instances are then made
    /// on demand, which is what `none` means for a sidecar.
    pub async fn install_initial_layouts(&self) {
        let policy = self.policy();
        // Advise mode keeps the site's layout; its first epoch records
        // what the policy would change.
        if self.config().mode == Mode::Advise || !policy.lock().await.installs_initial_layout() {
            return;
        }
        for slot in &self.slots {
            let mut st = slot.state.lock().await;
            if !st.book.instances.is_empty() {
                continue;
            }
            let target = {
                let mut p = policy.lock().await;
                p.initial_layout(slot.index as usize, st.book.geometry)
            };
            self.pursue(
                slot,
                &mut st,
                target,
                "initial layout",
                &self.config(),
                None,
            );
        }
    }

    /// Handles one request line from a peer with `uid`; returns the reply
    /// line and whether to close the connection.
    pub async fn handle_line(&self, line: &[u8], uid: u32, pid: Option<i32>) -> (String, bool) {
        let request = match parse_request(line) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(uid, ?pid, kind = %e.kind, "bad request: {}", e.message);
                self.metrics.failure(e.kind.as_str());
                return (error_line(&e), true);
            }
        };
        if request.is_write() && !self.authorized(uid) {
            let cfg = self.config();
            tracing::warn!(
                uid,
                ?pid,
                op = request.op(),
                "refused: only root and slurm_user `{}` may {}",
                cfg.slurm_user,
                request.op()
            );
            self.metrics.failure(ErrorKind::Unauthorized.as_str());
            let e = ErrorBody::new(
                ErrorKind::Unauthorized,
                format!(
                    "uid {uid} may not {}: only root and the Slurm user ({}) may allocate or release",
                    request.op(),
                    cfg.slurm_user
                ),
            );
            return (error_line(&e), true);
        }
        let reply = match request {
            Request::Allocate(req) => {
                let t0 = Instant::now();
                let r = self.allocate(req).await;
                let result = match &r {
                    Ok(a) => match a.action {
                        AllocAction::Existing => "existing",
                        AllocAction::Reused => "reused",
                        AllocAction::Created => "created",
                        AllocAction::Reshaped => "reshaped",
                    },
                    Err(e) if e.kind == ErrorKind::NoFit => "no_fit",
                    Err(_) => "error",
                };
                self.metrics.allocation(result, t0.elapsed().as_secs_f64());
                r.map(|a| ok_line(&a))
            }
            Request::Release(req) => self.release_request(req).await.map(|r| ok_line(&r)),
            Request::Status => {
                let mut reply = self.status().await;
                if !self.sees_everything(uid) {
                    let name = tokio::task::block_in_place(|| user_name(uid));
                    redact::redact(&mut reply, uid, &name);
                }
                Ok(ok_line(&reply))
            }
            Request::Reconcile => self.reconcile().await.map(|r| ok_line(&r)),
            Request::Plan => {
                let mut reply = self.plan_reply();
                if !self.sees_everything(uid) {
                    redact::redact_plans(&mut reply.pending);
                    redact::redact_plans(&mut reply.applied);
                }
                Ok(ok_line(&reply))
            }
            Request::Apply(req) => self.apply_plan(req.plan).await.map(|r| ok_line(&r)),
            Request::Health => Ok(ok_line(&HealthReply {
                status: "ok".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                backend: self.backend.name().into(),
                uptime_s: self.started.elapsed().as_secs(),
            })),
        };
        match reply {
            Ok(line) => (line, false),
            Err(e) => {
                self.metrics.failure(e.kind.as_str());
                (error_line(&e), false)
            }
        }
    }

    fn existing_reply(book: &GpuBook, job_id: u64) -> Option<AllocateReply> {
        let inst = book.find_job(job_id)?;
        let p = book.geometry.placement(inst.placement);
        Some(AllocateReply {
            uuid: inst.uuid.clone(),
            gpu: book.index,
            profile: p.profile.name(),
            start: p.start,
            compute: p.compute(),
            memory_gb: p.profile.memory_gb,
            reused: true,
            action: AllocAction::Existing,
            waited_ms: 0,
        })
    }

    /// Serves an allocate: idempotent per job, serialised per GPU, waiting
    /// up to `allocate_wait_s` for a release when nothing fits.
    pub async fn allocate(&self, req: AllocateRequest) -> Result<AllocateReply, ErrorBody> {
        let start = Instant::now();
        if self.config().mode == Mode::Advise {
            return Err(ErrorBody::new(
                ErrorKind::InvalidRequest,
                format!(
                    "smartmigd on {} runs in advise mode: it watches the node's own MIG setup and hands out no \
                     instance; request a MIG device through Slurm (--gres=gpu:<profile>:1), or ask the admin \
                     to switch the node to mode = \"dynamic\"",
                    self.node
                ),
            ));
        }
        let Some(slot) = self.slots.get(req.gpu as usize) else {
            return Err(ErrorBody::new(
                ErrorKind::InvalidRequest,
                format!(
                    "no GPU {} on this node (it has {} GPUs)",
                    req.gpu,
                    self.slots.len()
                ),
            ));
        };
        // Another step of a job that already holds an instance (on any GPU).
        for other in &self.slots {
            let st = other.state.lock().await;
            if let Some(r) = Self::existing_reply(&st.book, req.job_id) {
                if other.index != req.gpu {
                    tracing::warn!(
                        job = req.job_id,
                        asked = req.gpu,
                        holds = other.index,
                        "job already holds an instance on another GPU; returning it"
                    );
                }
                return Ok(r);
            }
        }
        if let Some(marker) = req.oom_marker {
            *self
                .plugin_oom_requeue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(marker);
        }
        // `--mig-profile`: exactly that profile, or a refusal naming why.
        let exact = req
            .profile
            .as_deref()
            .map(|name| crate::mig::requested_profile(slot.model.spec(), name, req.slices))
            .transpose()
            .map_err(|e| {
                ErrorBody::new(ErrorKind::InvalidRequest, format!("GPU {}: {e}", req.gpu))
            })?;
        let declared_gb = exact.map_or(req.memory_gb, |p| Some(f64::from(p.memory_gb)));
        let cfg = self.config();
        // The user's name may come from NSS (LDAP, SSSD): a blocking lookup.
        // Job names are the user's to choose: bounded so keys stay small.
        let key = req
            .job_name
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| {
                let name: String = n.chars().take(MAX_JOB_NAME_CHARS).collect();
                MemoryKey::new(tokio::task::block_in_place(|| user_name(req.uid)), name)
            });
        let (memory_gb, sizing) = self.memory().size_request(
            slot.model.spec(),
            req.job_id,
            req.slices,
            declared_gb,
            key.as_ref(),
            cfg.memory.estimate,
        );
        match &sizing {
            Sizing::Declared => {}
            Sizing::OomRestart { after_gb } => tracing::info!(
                job = req.job_id,
                gpu = req.gpu,
                declared_gb = ?declared_gb,
                "restart after running out of memory on a {after_gb} GB instance: asking for at least {} GB",
                memory_gb.unwrap_or(0.0)
            ),
            Sizing::Estimate => tracing::info!(
                job = req.job_id,
                gpu = req.gpu,
                user = key.as_ref().map_or("", |k| k.user.as_str()),
                name = key.as_ref().map_or("", |k| k.name.as_str()),
                "no --mig-mem: using the learned estimate of {:.2} GB",
                memory_gb.unwrap_or(0.0)
            ),
        }
        let need = Need {
            slices: req.slices,
            memory_gb,
        };
        let mut me = Contender {
            job_id: req.job_id,
            need,
            exact,
            arrival: unix_now_f64() - start.elapsed().as_secs_f64(),
            deadline: f64::INFINITY,
            time_limit_s: None,
        };
        let wait = Duration::from_secs(cfg.allocate_wait_s);
        let deadline = tokio::time::Instant::from_std(start + wait);
        let mut shutdown = self.shutdown.subscribe();
        let mut _waiting: Option<WaitingGuard<'_>> = None;
        let placement = self.live().placement.clone();
        loop {
            // Re-read each round: a queue read while waiting may have
            // brought the job's deadline.
            let times = self.times_of(req.job_id, req.deadline, req.time_limit_s);
            (me.deadline, me.time_limit_s) = (times.deadline, times.time_limit_s);
            let mut st = slot.state.lock().await;
            if let Some(r) = Self::existing_reply(&st.book, req.job_id) {
                return Ok(r);
            }
            let planned = st.book.plan(need);
            // Who goes first among this allocate and those waiting on the
            // same GPU (`placement`); only asked when this one could go.
            let turn = match &planned {
                Ok(_) => {
                    let mut others = self.contenders(req.gpu, req.job_id);
                    self.next_turn(&placement, &mut st, &mut others, &me)
                }
                Err(_) => {
                    if st.promised.as_ref().is_some_and(|t| t.job_id == req.job_id) {
                        // Promised room that is gone (a re-shape took it):
                        // let the others decide again.
                        st.promised = None;
                        slot.released.notify_waiters();
                    }
                    None
                }
            };
            let mine = turn.as_ref().is_none_or(|t| t.job_id == req.job_id);
            match planned {
                Err(Refusal::Select(e)) => {
                    return Err(ErrorBody::new(
                        ErrorKind::InvalidRequest,
                        format!("GPU {}: {e}", req.gpu),
                    ))
                }
                Ok((profile, _)) if exact.is_some_and(|p| p != profile) => {
                    // Only an out-of-memory restart asks for more than the
                    // profile, and the plugin gives such jobs no marker.
                    return Err(ErrorBody::new(
                        ErrorKind::InvalidRequest,
                        format!(
                            "GPU {}: --mig-profile={} asked, but this run needs {}",
                            req.gpu,
                            req.profile.as_deref().unwrap_or_default(),
                            profile.name()
                        ),
                    ));
                }
                Ok((profile, plan)) if mine => {
                    let (profile, plan) = match turn {
                        Some(t) => (t.profile, t.plan),
                        None => (profile, plan),
                    };
                    st.promised = None;
                    let waited_ms = start.elapsed().as_millis() as u64;
                    let reply = self.execute(slot, &mut st, &req, profile, plan, waited_ms);
                    if reply.is_ok() {
                        self.memory()
                            .on_allocate(req.job_id, key, exact.is_some(), unix_now_f64());
                        self.spawn_tag(
                            req.job_id,
                            SliceTag {
                                profile: profile.name(),
                                gpu: req.gpu,
                                memory_gb: profile.memory_gb,
                                wait_s: waited_ms / 1000,
                            },
                        );
                    }
                    return reply;
                }
                not_now => {
                    let reason = match not_now {
                        Err(Refusal::NoFit { reason, .. }) => reason,
                        _ => format!(
                            "GPU {}: jobs that go first under placement `{}` take the room",
                            req.gpu,
                            self.placement_name()
                        ),
                    };
                    if tokio::time::Instant::now() >= deadline {
                        let holders = st.book.holders();
                        drop(st);
                        return Err(self.no_fit(
                            &req,
                            format!("{reason}; waited {} s", wait.as_secs()),
                            &holders,
                        ));
                    }
                    // The job whose turn it is may be asleep: wake it
                    // before this allocate starts listening (it would wake
                    // itself otherwise). The GPU's lock is still held, so
                    // nothing can change before we listen.
                    if !mine {
                        slot.released.notify_waiters();
                    }
                    let notified = slot.released.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    drop(st);
                    if _waiting.is_none() {
                        self.waiting
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .insert(
                                req.job_id,
                                Waiter {
                                    gpu: req.gpu,
                                    since: start,
                                    uid: req.uid,
                                    contender: me.clone(),
                                    asked: (req.deadline, req.time_limit_s),
                                },
                            );
                        _waiting = Some(WaitingGuard {
                            daemon: self,
                            slot,
                            job_id: req.job_id,
                        });
                    }
                    // The holders may have ended without a release (no
                    // epilog): ask Slurm now rather than at the next epoch.
                    if mine && self.queue_is_stale() {
                        if let Some(q) = self.read_queue().await {
                            let _ = self.reap_ended_jobs(&q.0, q.1).await;
                            continue;
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::timeout_at(deadline, notified) => {}
                        _ = shutdown.changed() => {
                            return Err(ErrorBody::new(ErrorKind::ShuttingDown, "smartmigd is shutting down"));
                        }
                    }
                }
            }
        }
    }

    /// The turn on `st`'s GPU when `me` could be served now: the promise
    /// still standing, else the placement rule's choice among `me` and
    /// `others` (remembered when it is another job). `None`: `me`, with the
    /// plan [`GpuBook::plan`] gave (no one else waits, and the rule would
    /// not choose a profile).
    fn next_turn(
        &self,
        placement: &std::sync::Mutex<PlacementRule>,
        st: &mut GpuState,
        others: &mut Vec<Contender>,
        me: &Contender,
    ) -> Option<Turn> {
        if let Some(t) = &st.promised {
            if t.job_id != me.job_id && others.iter().any(|c| c.job_id == t.job_id) {
                return Some(t.clone());
            }
            if t.job_id == me.job_id {
                let want = me.need.memory_gb.unwrap_or(0.0);
                if let Ok(plan) = st.book.plan_profile(t.profile, want) {
                    return Some(Turn { plan, ..t.clone() });
                }
            }
            st.promised = None;
        }
        let mut rule = placement
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if others.is_empty() && !matches!(*rule, PlacementRule::Learned { .. }) {
            return None;
        }
        others.push(me.clone());
        let turn = rule.next_turn(&st.book, others, unix_now_f64())?;
        if turn.job_id != me.job_id {
            st.promised = Some(turn.clone());
        }
        Some(turn)
    }

    /// The other allocates waiting on `gpu`, as the placement rule sees them.
    fn contenders(&self, gpu: u32, except: u64) -> Vec<Contender> {
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(&job, w)| w.gpu == gpu && job != except)
            .map(|(_, w)| self.contender_now(w))
            .collect()
    }

    /// A job's deadline and time limit: as the client sent them, else from
    /// the last `squeue` read (Slurm's `--deadline`, else the end of the
    /// time limit of a running job).
    fn times_of(&self, job_id: u64, deadline: Option<i64>, time_limit_s: Option<u64>) -> JobTimes {
        let known = self
            .job_times
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&job_id)
            .copied();
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

    fn placement_name(&self) -> String {
        self.live()
            .placement
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .name()
    }

    /// Runs a plan against the backend, records it in the book and the
    /// journal (durably) and builds the reply.
    fn execute(
        &self,
        slot: &GpuSlot,
        st: &mut GpuState,
        req: &AllocateRequest,
        profile: &'static crate::mig::ProfileSpec,
        plan: Plan,
        waited_ms: u64,
    ) -> Result<AllocateReply, ErrorBody> {
        let gpu = slot.index;
        let now = unix_now();
        let backend = &self.backend;
        let (uuid, action) = match plan {
            Plan::Reuse { uuid } => (uuid, AllocAction::Reused),
            Plan::Create { placement } => (
                self.create_instance(gpu, st, placement, now)?,
                AllocAction::Created,
            ),
            Plan::Reshape { destroy, placement } => {
                for victim in &destroy {
                    let busy = st.book.find_uuid(victim).is_some_and(|i| i.job.is_some());
                    assert!(!busy, "plan destroys busy instance {victim}");
                    tokio::task::block_in_place(|| backend.destroy(gpu, victim))
                        .map_err(|e| self.backend_failed(gpu, &mut st.book, &e))?;
                    self.metrics.reconfiguration(gpu, "destroy");
                    tracing::info!(gpu, uuid = %victim, "destroyed idle instance to re-shape");
                    st.book.remove_instance(victim);
                }
                (
                    self.create_instance(gpu, st, placement, now)?,
                    AllocAction::Reshaped,
                )
            }
        };
        st.tick_energy();
        st.book.assign(
            &uuid,
            Assignment {
                job_id: req.job_id,
                step: req.step,
                uid: req.uid,
                since: now,
                deadline: req.deadline,
                time_limit_s: req.time_limit_s,
                wait_s: waited_ms / 1000,
            },
        );
        if let Err(e) = self.isolate(&st.book, Some(&uuid)) {
            // The job would run on an instance others can open too.
            st.book.release(req.job_id, now);
            let _ = self.isolate(&st.book, Some(&uuid));
            return Err(ErrorBody::new(
                ErrorKind::Backend,
                format!("cannot give instance {uuid} to uid {}: {e}", req.uid),
            ));
        }
        if let Err(e) = self.save_journal(&st.book) {
            st.book.release(req.job_id, now);
            let _ = self.isolate(&st.book, Some(&uuid));
            tracing::error!(gpu, job = req.job_id, "{e}");
            return Err(ErrorBody::new(
                ErrorKind::Backend,
                format!("cannot record the allocation: {e}"),
            ));
        }
        let inst = st.book.find_uuid(&uuid).map(|i| i.placement);
        let start_slot = inst
            .map(|p| st.book.geometry.placement(p).start)
            .unwrap_or(0);
        let p = inst
            .map(|p| st.book.geometry.placement(p).profile)
            .unwrap_or(profile);
        tracing::info!(gpu, job = req.job_id, uid = req.uid, %uuid, profile = %p.name(), start = start_slot, ?action, "allocated");
        Ok(AllocateReply {
            uuid,
            gpu,
            profile: p.name(),
            start: start_slot,
            compute: p.shape.compute,
            memory_gb: p.memory_gb,
            reused: matches!(action, AllocAction::Reused),
            action,
            waited_ms,
        })
    }

    /// After a failed backend call the GPU's real state is uncertain (a
    /// timed-out create may have happened): re-read the backend's instances
    /// and make the book match them, so that the daemon converges instead of
    /// planning against instances that do (not) exist. Busy instances the
    /// backend no longer lists are kept (and logged): a job's assignment is
    /// never dropped behind its back.
    /// Creates the instance at `placement` for an allocation and books it
    /// (still without a job); returns its uuid.
    fn create_instance(
        &self,
        gpu: u32,
        st: &mut GpuState,
        placement: crate::mig::PlacementId,
        now: u64,
    ) -> Result<String, ErrorBody> {
        let backend = &self.backend;
        let uuid = tokio::task::block_in_place(|| backend.create(gpu, placement))
            .map_err(|e| self.backend_failed(gpu, &mut st.book, &e))?;
        self.metrics.reconfiguration(gpu, "create");
        tracing::info!(gpu, %uuid, instance = %st.book.geometry.placement(placement).describe(), "created instance");
        st.book.add_instance(placement, uuid.clone(), now);
        Ok(uuid)
    }

    fn backend_failed(&self, gpu: u32, book: &mut GpuBook, e: &BackendError) -> ErrorBody {
        tracing::warn!(
            gpu,
            "backend call failed: {e}; re-reading the GPU's instances"
        );
        match tokio::task::block_in_place(|| self.backend.list(gpu)) {
            Ok(listed) => {
                let now = unix_now();
                let gone: Vec<String> = book
                    .instances
                    .iter()
                    .filter(|i| !listed.iter().any(|l| l.uuid == i.uuid))
                    .map(|i| i.uuid.clone())
                    .collect();
                for uuid in gone {
                    if book.find_uuid(&uuid).is_some_and(|i| i.job.is_none()) {
                        book.remove_instance(&uuid);
                        tracing::warn!(gpu, %uuid, "idle instance vanished from the backend; forgotten");
                    } else {
                        tracing::error!(gpu, %uuid, "busy instance vanished from the backend; assignment kept");
                    }
                }
                for l in listed {
                    if book.find_uuid(&l.uuid).is_none() {
                        if book.geometry.fits(book.layout(), l.placement) {
                            tracing::warn!(gpu, uuid = %l.uuid, "backend has an instance the daemon did not know (e.g. a timed-out create); adopted as idle");
                            book.add_instance(l.placement, l.uuid, now);
                        } else {
                            tracing::error!(gpu, uuid = %l.uuid, "backend instance overlaps known ones; ignored");
                        }
                    }
                }
            }
            Err(le) => tracing::error!(gpu, "cannot re-read the GPU's instances: {le}"),
        }
        backend_error(e)
    }

    /// Releases every instance of `job_id` (idempotent), wakes waiting allocates.
    pub async fn release(&self, job_id: u64) -> Result<ReleaseReply, ErrorBody> {
        self.release_request(ReleaseRequest::new(job_id)).await
    }

    /// A release with its optional fields: the job's memory use is learned,
    /// an out-of-memory end (`oom`) is recorded and, when the admin allows
    /// it, the job is requeued (see [`MemoryState::on_release`]).
    pub async fn release_request(&self, req: ReleaseRequest) -> Result<ReleaseReply, ErrorBody> {
        let job_id = req.job_id;
        if req.from_epilog {
            self.release_counts_mut(|c| c.epilog += 1);
        }
        let now = unix_now();
        let mut released = 0;
        let mut held: Option<Released> = None;
        let mut usage: Vec<UsageRecord> = Vec::new();
        for slot in &self.slots {
            let mut st = slot.state.lock().await;
            let Some(inst) = st.book.find_job(job_id) else {
                continue;
            };
            let uuid = inst.uuid.clone();
            let h = released_of(slot, st.book.geometry, inst.placement);
            held = Some(h.clone());
            // A blocking section hands the worker thread over (futex
            // wake-ups): only for a backend that measures anything.
            let measured = self.backend.measures_memory().then(|| {
                tokio::task::block_in_place(|| self.backend.peak_memory_gb(slot.index, &uuid))
            });
            if let Some(gb) = measured.flatten() {
                self.memory().sample(job_id, gb);
            }
            if let Some(a) = &inst.job {
                let peak = self.memory().peak(job_id, req.used_memory_gb);
                usage.push(UsageRecord {
                    job_id,
                    uid: a.uid,
                    user: None,
                    account: None,
                    gpu: slot.index,
                    profile: h.profile,
                    compute: h.compute,
                    memory_gb: h.memory_gb,
                    start: a.since,
                    end: now,
                    wait_s: a.wait_s,
                    slice_s: slice_seconds(h.compute, a.since, now),
                    peak_gb: peak,
                });
            }
            st.tick_energy();
            let n = st.book.release(job_id, now);
            released += n;
            // One instance per job and GPU; should there be more, all of them.
            if let Err(e) = self.isolate(&st.book, (n == 1).then_some(uuid.as_str())) {
                tracing::error!(
                    gpu = slot.index,
                    job = job_id,
                    "released instance still open to the job's user: {e}"
                );
            }
            if let Err(e) = self.save_journal(&st.book) {
                // The release happened; on restart Slurm reconciliation drops it again.
                tracing::error!(gpu = slot.index, job = job_id, "release not journaled: {e}");
            }
            drop(st);
            tracing::info!(gpu = slot.index, job = job_id, "released");
            slot.released.notify_waiters();
        }
        if !usage.is_empty() {
            self.record_usage(usage);
        }
        let cfg = self.config();
        let policy = OomPolicy::of(&cfg);
        let event = {
            let mut m = self.memory();
            let (changed, event) = m.on_release(
                job_id,
                held.as_ref(),
                req.oom,
                req.used_memory_gb,
                policy,
                now,
            );
            if changed {
                // On disk with fsync (it must survive a reboot), but after
                // the reply, not before it; shutdown saves once more.
                self.save_memory_later(job_id);
            }
            event
        };
        if req.oom && held.is_none() {
            tracing::info!(
                job = job_id,
                "out-of-memory release of a job that holds no instance (a repeated release?); ignored"
            );
        }
        if let Some(ev) = &event {
            self.metrics.failure("oom");
            self.metrics.memory_restart("oom", ev.decision.as_str());
            tracing::warn!(job = job_id, gpu = ev.gpu, profile = %ev.profile, failures = ev.failures,
                decision = %ev.decision, "job ran out of GPU memory: {}", ev.message);
            if ev.decision == OomDecision::RequeueScheduled {
                let raise_to = held.as_ref().and_then(|h| self.raised_shards(h));
                self.spawn_requeue(
                    job_id,
                    cfg.oom.requeue_timeout_s,
                    raise_to,
                    RequeueWhen::Failed,
                );
            }
        }
        Ok(ReleaseReply {
            released,
            oom_decision: event.map(|e| e.decision),
        })
    }

    /// The compute slices Slurm must bill for a restart on the next larger
    /// memory size after `held`, when that profile has more compute slices
    /// than the job holds (never more than the GPU has); `None` otherwise.
    fn raised_shards(&self, held: &Released) -> Option<u8> {
        let model = self.slots.get(held.gpu as usize)?.model.spec();
        let next = held.next_memory_gb?;
        let p = crate::mig::select_profile(model, held.compute, Some(f64::from(next))).ok()?;
        (p.shape.compute > held.compute).then_some(p.shape.compute)
    }

    /// Samples the memory every busy instance uses now (backends that can
    /// tell: nvml); the largest sample of a job is its peak. With
    /// `oom.early_restart`, each sample also goes to the early-restart rule,
    /// and a job it fires for is requeued on a bigger profile.
    pub async fn sample_memory(&self) {
        let cfg = self.config();
        let rule = cfg.oom.early_restart.then_some(&cfg.oom.early);
        for slot in &self.slots {
            let (geometry, busy) = {
                let st = slot.state.lock().await;
                let busy: Vec<(u64, String, PlacementId)> = st
                    .book
                    .instances
                    .iter()
                    .filter_map(|i| Some((i.job.as_ref()?.job_id, i.uuid.clone(), i.placement)))
                    .collect();
                (st.book.geometry, busy)
            };
            for (job, uuid, placement) in busy {
                let Some(now) =
                    tokio::task::block_in_place(|| self.backend.memory_use(slot.index, &uuid))
                else {
                    continue;
                };
                // The instance's real size where the backend reports one.
                let size = if now.total_gb > 0.0 {
                    now.total_gb
                } else {
                    f64::from(geometry.placement(placement).profile.memory_gb)
                };
                let fired = self
                    .memory()
                    .observe(job, now.used_gb, unix_now_f64(), size, rule);
                if let Some(trigger) = fired {
                    let held = released_of(slot, geometry, placement);
                    self.early_restart(job, &held, trigger, &cfg);
                }
            }
        }
    }

    /// The early-restart rule fired for `job`: decide as for an
    /// out-of-memory failure and, when allowed, requeue the running job.
    fn early_restart(&self, job: u64, held: &Released, trigger: EarlyTrigger, cfg: &Config) {
        let ev = self
            .memory()
            .on_early_restart(job, held, trigger, OomPolicy::of(cfg), unix_now());
        self.metrics.memory_restart("early", ev.decision.as_str());
        tracing::warn!(job, gpu = ev.gpu, profile = %ev.profile, used_gb = trigger.used_gb,
            predicted_gb = trigger.predicted_gb, decision = %ev.decision,
            "job's GPU memory use is predicted to exceed its instance: {}", ev.message);
        self.save_memory_later(job);
        if ev.decision == OomDecision::RequeueScheduled {
            self.spawn_requeue(
                job,
                cfg.oom.requeue_timeout_s,
                self.raised_shards(held),
                RequeueWhen::Running,
            );
        }
    }

    /// Adds the job's [`SliceTag`] to its `AdminComment` in the background
    /// (`accounting.admin_comment` and Slurm queries on): one `scontrol
    /// show job` for the comment the site may have set and the account, one
    /// `scontrol update`. A failure is logged, never the job's problem.
    fn spawn_tag(&self, job_id: u64, tag: SliceTag) {
        let cfg = self.config();
        if !(cfg.slurm.enabled && cfg.accounting.admin_comment) {
            return;
        }
        let slurm = self.slurm();
        let accounts = Arc::clone(&self.accounts);
        let array_names = Arc::clone(&self.array_names);
        tokio::task::spawn_blocking(move || {
            let result = slurm.job_comment(job_id).and_then(|job| {
                let Some(job) = job else {
                    return Ok(false);
                };
                // An array task by its `A_T` name, for status and for the
                // update: the first task's id is the array's, which alone
                // would update every task.
                let name = job
                    .array_task
                    .map(|(array, task)| format!("{array}_{task}"));
                if let Some(name) = &name {
                    array_names
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(job_id, name.clone());
                }
                if let Some(a) = &job.account {
                    accounts
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(job_id, a.clone());
                }
                let name = name.unwrap_or_else(|| job_id.to_string());
                slurm.set_admin_comment(&name, &merge_comment(&job.admin_comment, &tag))?;
                Ok(true)
            });
            match result {
                Ok(true) => {
                    tracing::debug!(job = job_id, tag = %tag.to_word(), "job's AdminComment tagged");
                }
                Ok(false) => {
                    tracing::info!(
                        job = job_id,
                        "Slurm no longer lists the job: AdminComment not tagged"
                    );
                }
                Err(e) => tracing::warn!(job = job_id, "AdminComment not tagged: {e}"),
            }
        });
    }

    /// Appends released instances to the node's usage log
    /// (`<state_dir>/usage.jsonl`, rotated to `usage.jsonl.1` past
    /// [`USAGE_LOG_MAX_BYTES`]) and counts them in the metrics.
    fn record_usage(&self, records: Vec<UsageRecord>) {
        let path = self.config().state_dir.join(USAGE_LOG);
        let mut lines = String::new();
        for mut r in records {
            r.user = Some(tokio::task::block_in_place(|| user_name(r.uid)));
            r.account = self
                .accounts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&r.job_id);
            self.metrics.usage(&r);
            match serde_json::to_string(&r) {
                Ok(l) => {
                    lines.push_str(&l);
                    lines.push('\n');
                }
                Err(e) => tracing::error!(job = r.job_id, "usage record not encoded: {e}"),
            }
        }
        let _guard = self
            .usage_log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) =
            tokio::task::block_in_place(|| append_rotating(&path, &lines, USAGE_LOG_MAX_BYTES))
        {
            tracing::error!(path = %path.display(), "usage log not written: {e}");
        }
    }

    /// Saves the memory state in the background (fsync'd, after the reply;
    /// saves queue on the mutex, so the last one writes the newest state).
    fn save_memory_later(&self, job_id: u64) {
        let memory = Arc::clone(&self.memory);
        tokio::task::spawn_blocking(move || {
            let m = memory
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(e) = m.save() {
                tracing::error!(job = job_id, "memory estimates not saved: {e}");
            }
        });
    }

    /// A job that found no room in time: logged and counted; the plugin
    /// requeues a batch job (it knows its array task id) instead of
    /// failing it.
    /// The refusal the job's user sees, and the log line the admin sees,
    /// which also names the jobs holding the GPU's instances.
    fn no_fit(&self, req: &AllocateRequest, reason: String, holders: &[u64]) -> ErrorBody {
        tracing::warn!(job = req.job_id, gpu = req.gpu, held_by = ?holders, "{reason}");
        ErrorBody::new(ErrorKind::NoFit, reason)
    }

    /// The status reply.
    pub async fn status(&self) -> StatusReply {
        let now = unix_now();
        let isolate = self.config().isolate_devices;
        let array_names = self
            .array_names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut gpus = Vec::new();
        for slot in &self.slots {
            let mut st = slot.state.lock().await;
            let modelled = st.tick_energy();
            let b = &st.book;
            let g = b.geometry;
            let layout = b.layout();
            let busy_any = !b.busy().is_empty();
            let instances = b
                .instances
                .iter()
                .map(|i| {
                    let p = g.placement(i.placement);
                    InstanceStatus {
                        uuid: i.uuid.clone(),
                        profile: p.profile.name(),
                        start: p.start,
                        compute: p.compute(),
                        job_id: i.job.as_ref().map(|a| a.job_id),
                        slurm_id: i
                            .job
                            .as_ref()
                            .and_then(|a| array_names.get(&a.job_id).cloned()),
                        uid: i.job.as_ref().map(|a| a.uid),
                        busy_since: i.job.as_ref().map(|a| a.since),
                        idle_s: i.job.is_none().then(|| now.saturating_sub(i.idle_since)),
                        access_files: if isolate {
                            self.backend
                                .access_files(slot.index, &i.uuid)
                                .unwrap_or_default()
                                .iter()
                                .map(|f| f.display().to_string())
                                .collect()
                        } else {
                            Vec::new()
                        },
                    }
                })
                .collect();
            gpus.push(GpuStatus {
                index: slot.index,
                model: slot.model,
                picture: g.picture(layout),
                layout: g.name(layout),
                instances,
                idle_s: if busy_any {
                    0
                } else {
                    now.saturating_sub(b.idle_since)
                },
                energy_j: Some(self.backend.energy_j(slot.index).unwrap_or(modelled)),
                others_busy: Default::default(),
            });
        }
        let cfg = self.config();
        let mut memory = self.memory().status(
            cfg.memory.estimate,
            cfg.oom.requeue,
            cfg.oom.max_retries,
            cfg.oom.early_restart.then_some(&cfg.oom.early),
        );
        memory.plugin_oom_requeue = *self
            .plugin_oom_requeue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut waiting: Vec<WaitingJob> = self
            .waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        StatusReply {
            node: self.node.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            backend: self.backend.name().into(),
            policy: self.policy_name(),
            placement: Some(self.placement_name()),
            uptime_s: self.started.elapsed().as_secs(),
            gpus,
            memory: Some(memory),
            epilog_missing: self
                .releases
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .epilog_missing(),
            waiting,
            pending_plans: self.plans().pending(),
            advise: self.advise_status(&cfg),
            cluster: Some(self.cluster_status(&cfg)),
        }
    }

    /// The Prometheus text.
    pub async fn metrics_text(&self) -> String {
        let mut counts: HashMap<(u32, String, bool), i64> = HashMap::new();
        let mut energy = Vec::new();
        for slot in &self.slots {
            let mut st = slot.state.lock().await;
            let modelled = st.tick_energy();
            for i in &st.book.instances {
                let name = st.book.geometry.placement(i.placement).profile.name();
                *counts
                    .entry((slot.index, name, i.job.is_some()))
                    .or_default() += 1;
            }
            energy.push((
                slot.index,
                self.backend.energy_j(slot.index).unwrap_or(modelled),
            ));
        }
        let mut list: Vec<InstanceCount> = counts
            .into_iter()
            .map(|((gpu, profile, busy), count)| InstanceCount {
                gpu,
                profile,
                busy,
                count,
            })
            .collect();
        list.sort_by(|a, b| (a.gpu, &a.profile, a.busy).cmp(&(b.gpu, &b.profile, b.busy)));
        let epilog_missing = self
            .releases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .epilog_missing();
        self.metrics.render(&list, &energy, epilog_missing)
    }
}

/// Binds a socket: parent dir created 0755 if missing, a stale socket
/// file removed (a live one means another daemon: refuse), then `mode` and
/// `owner`: 0666 for the public socket (status is public; writes are
/// checked with SO_PEERCRED), 0600 owned by `slurm_user` for the root-only
/// one.
fn bind_socket(path: &Path, mode: u32, owner: Option<u32>) -> Result<UnixListener, StartError> {
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            ensure_dir(dir, 0o755).map_err(io_err(dir))?;
        }
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(StartError::AlreadyRunning(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(io_err(path))?;
    }
    let listener = UnixListener::bind(path).map_err(io_err(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err(path))?;
    if let Some(uid) = owner {
        std::os::unix::fs::chown(path, Some(uid), None).map_err(io_err(path))?;
    }
    Ok(listener)
}

/// Raises the soft limit of open files to the hard one (systemd's
/// `LimitNOFILE`), so that connections, not descriptors, run out first
/// (also used by `smartmig bench flood`, which holds thousands).
pub fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "raised the open files limit"),
            Err(e) => tracing::warn!(soft, hard, "cannot raise the open files limit: {e}"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot read the open files limit: {e}"),
    }
}

/// Serves one connection: requests one per line until EOF, an error, a
/// timeout or shutdown.
async fn serve_connection(daemon: Arc<Daemon>, stream: UnixStream) {
    let (uid, pid) = match stream.peer_cred() {
        Ok(c) => (c.uid(), c.pid()),
        Err(e) => {
            tracing::warn!("cannot read peer credentials ({e}); closing");
            return;
        }
    };
    let _admitted = match daemon.admit(uid) {
        Ok(a) => a,
        Err(why) => {
            daemon
                .metrics
                .failure(ErrorKind::TooManyConnections.as_str());
            tracing::debug!(uid, ?pid, "connection refused: {why}");
            let e = ErrorBody::new(ErrorKind::TooManyConnections, why);
            let mut stream = stream;
            // Best effort and bounded: the caller may not be reading.
            let _ = tokio::time::timeout(
                Duration::from_millis(100),
                stream.write_all(error_line(&e).as_bytes()),
            )
            .await;
            return;
        }
    };
    let mut shutdown = daemon.shutdown.subscribe();
    let (rd, mut wr) = stream.into_split();
    let mut reader = BufReader::new(rd);
    loop {
        let cfg = daemon.config();
        let max = cfg.max_message_bytes;
        let mut buf = Vec::new();
        let read = async {
            let mut limited = (&mut reader).take(max as u64 + 1);
            limited.read_until(b'\n', &mut buf).await
        };
        let res = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(cfg.request_timeout_s), read) => r,
            _ = shutdown.changed() => break,
        };
        let (reply, close) = match res {
            Err(_) => {
                if buf.is_empty() {
                    // An idle keep-alive connection: just close it.
                    break;
                }
                daemon.metrics.failure(ErrorKind::Timeout.as_str());
                let e = ErrorBody::new(
                    ErrorKind::Timeout,
                    format!(
                        "no complete request line within {} s",
                        cfg.request_timeout_s
                    ),
                );
                (error_line(&e), true)
            }
            Ok(Err(e)) => {
                tracing::debug!(uid, "read error: {e}");
                break;
            }
            Ok(Ok(0)) => break,
            Ok(Ok(_)) => {
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                    if buf.last() == Some(&b'\r') {
                        buf.pop();
                    }
                } else if buf.len() > max {
                    tracing::warn!(uid, ?pid, max, "request line too large; closing");
                    daemon.metrics.failure(ErrorKind::TooLarge.as_str());
                    let e = ErrorBody::new(
                        ErrorKind::TooLarge,
                        format!("request line longer than max_message_bytes ({max})"),
                    );
                    let line = error_line(&e);
                    let _ = wr.write_all(line.as_bytes()).await;
                    break;
                }
                if buf.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                daemon.handle_line(&buf, uid, pid).await
            }
        };
        if wr.write_all(reply.as_bytes()).await.is_err() || close {
            break;
        }
    }
    let _ = wr.shutdown().await;
}

/// Runs the daemon until SIGTERM/SIGINT.
pub async fn run(config: Config, config_path: PathBuf) -> Result<(), StartError> {
    use tokio::signal::unix::{signal, SignalKind};
    let socket = config.socket.clone();
    let metrics_listen = config.metrics_listen.clone();
    let daemon = Daemon::start(config, config_path)?;
    daemon.install_initial_layouts().await;
    let mut term = signal(SignalKind::terminate()).map_err(io_err(Path::new("SIGTERM")))?;
    let mut int = signal(SignalKind::interrupt()).map_err(io_err(Path::new("SIGINT")))?;
    let mut hup = signal(SignalKind::hangup()).map_err(io_err(Path::new("SIGHUP")))?;
    raise_open_files_limit();
    let listener = bind_socket(&socket, 0o666, None)?;
    let admin_socket = daemon.config().admin_socket();
    let admin_owner = daemon.live().slurm_uid.filter(|&u| u != 0);
    let admin = bind_socket(&admin_socket, 0o600, admin_owner)?;
    if let Some(addr) = metrics_listen {
        let l = TcpListener::bind(&addr)
            .await
            .map_err(io_err(Path::new(&addr)))?;
        tracing::info!(%addr, "serving Prometheus metrics on /metrics");
        tokio::spawn(serve_metrics(daemon.clone(), l));
    }
    // The repartitioning loop.
    {
        let daemon = daemon.clone();
        let mut stop = daemon.shutdown.subscribe();
        tokio::spawn(async move {
            loop {
                let epoch = Duration::from_secs(daemon.config().epoch_s);
                tokio::select! {
                    _ = tokio::time::sleep(epoch) => daemon.repartition_once().await,
                    _ = stop.changed() => break,
                }
            }
        });
    }
    // Memory sampling (backends that measure it; NVML gives current use only).
    if daemon.backend.measures_memory() {
        let daemon = daemon.clone();
        let mut stop = daemon.shutdown.subscribe();
        tokio::spawn(async move {
            loop {
                let period = Duration::from_secs(daemon.config().memory.sample_s);
                tokio::select! {
                    _ = tokio::time::sleep(period) => daemon.sample_memory().await,
                    _ = stop.changed() => break,
                }
            }
        });
    }
    for w in daemon.config().warnings() {
        tracing::warn!("{w}");
    }
    tracing::info!(socket = %socket.display(), admin_socket = %admin_socket.display(), backend = daemon.backend.name(), gpus = daemon.slots.len(),
        policy = %daemon.policy_name(), placement = %daemon.placement_name(), "smartmigd ready");
    if daemon.config().slurm.enabled {
        if let Some(info) = daemon.read_node().await {
            daemon.resume_if_drained_by_us(&info).await;
        }
    }
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            // Polled in this order: signals, then the root-only socket (a
            // crowd on the public one must not delay a job start), then
            // finished connections, then the public socket.
            biased;
            _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: shutting down"); break; }
            _ = hup.recv() => daemon.reload().await,
            accepted = admin.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(daemon.clone(), stream));
                }
                Err(e) => {
                    tracing::warn!(socket = %admin_socket.display(), "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(daemon.clone(), stream));
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    // Stop accepting, let in-flight requests finish, remove the socket.
    drop(listener);
    drop(admin);
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(&admin_socket);
    let _ = daemon.shutdown.send(true);
    let grace = Duration::from_secs(daemon.config().request_timeout_s + 5);
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "in-flight requests did not finish within {} s; aborting them",
            grace.as_secs()
        );
        connections.abort_all();
    }
    // Every change was journaled as it happened; write once more for good measure.
    for slot in &daemon.slots {
        let st = slot.state.lock().await;
        if let Err(e) = daemon.journal.save(&st.book) {
            tracing::error!(gpu = slot.index, "final journal write failed: {e}");
        }
    }
    // The memory estimates are saved after each reply that changed them;
    // save them once more in case the last of those writes was still queued.
    if let Err(e) = daemon.memory().save() {
        tracing::error!("final memory estimates write failed: {e}");
    }
    tracing::info!("smartmigd stopped");
    Ok(())
}
