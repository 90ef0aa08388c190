//! Start-up: open the backend and the journal, rebuild the books from
//! what the backend lists and the journal says, check Slurm's GPU order,
//! and release what jobs that ended while the daemon was down held.
//! Nothing is served yet.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::books::GpuOrderCheck;
use super::books::Outcome;
use super::books::{Books, Decider, Gpu};
use super::context::unix_now_f64;
use super::context::{unix_now, Daemon, NodeId};
use super::gpu_order;
use super::live::{Live, Settings};
use super::services::{enforce_access, Services, UsageLog};
use crate::allocate::GpuBook;
use crate::backend::{nvml::NvmlBackend, sim::SimBackend, Backend, BackendError};
use crate::config::{BackendKind, Config, ConfigError, Mode};
use crate::fsutil::ensure_dir;
use crate::jobmap::JobMap;
use crate::journal::{self, Journal, JournalError};
use crate::memory::MemoryState;
use crate::metrics::Metrics;
use crate::mig::{Geometry, GpuModel};
use crate::placement::{PlacementChoiceError, PlacementRule};
use crate::policy_choice::{build as build_policy, PolicyChoiceError};
use crate::slurm::SlurmClient;
use crate::workload::memory_estimate::EstimateError;

/// Errors that stop the daemon from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Journal(#[from] JournalError),
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
    #[error("{}", gpu_order::mismatch(.0))]
    GpuOrder(String),
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StartError + '_ {
    move |source| StartError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Daemon {
    /// Opens the backend and journal, rebuilds the books and reconciles
    /// journal <-> backend <-> Slurm. Nothing is served yet.
    pub fn start(config: Config, config_path: PathBuf) -> Result<Arc<Daemon>, StartError> {
        ensure_dir(&config.state_dir, 0o700).map_err(io_err(&config.state_dir))?;
        let backend = open_backend(&config)?;
        let journal = open_journal(&config)?;
        let memory = MemoryState::open(&config.state_dir, &config.memory.estimator)
            .map_err(StartError::Memory)?;
        let now = unix_now();
        let mut gpus = Vec::new();
        for gpu in backend.gpus() {
            let book = rebuild_book(backend.as_ref(), &journal, gpu.index, gpu.model, now)?;
            gpus.push(Gpu::new(book, gpu.model, backend.gpu_uuid(gpu.index)));
        }
        let models: Vec<GpuModel> = gpus.iter().map(|g| g.model).collect();
        let policy = build_policy(&config.policy, &models).map_err(StartError::Policy)?;
        let placement =
            PlacementRule::build(&config.placement, &models).map_err(StartError::Placement)?;
        let fallback = shadow_fallback(&config, &models).map_err(StartError::Policy)?;
        let decider = Decider::new(policy, fallback, placement);
        let live = Live::new(config);
        let node = node_name(&live.config);
        let gpu_order = check_slurm(&live, backend.as_ref(), &node)?;
        if live.config.slurm.enabled {
            release_ended_while_down(live.slurm.as_ref(), &mut gpus, now);
        }
        let jobmap = live.config.hpc_job_mapping_dir.as_deref().map(JobMap::new);
        for gpu in &mut gpus {
            restore(&live.config, backend.as_ref(), &journal, gpu)?;
            if let Some(map) = &jobmap {
                map.sync(&gpu.state_mut().book).map_err(io_err(map.dir()))?;
            }
        }
        let (shutdown, _) = watch::channel(false);
        let mut books = Books::new(gpus, decider, memory, unix_now_f64());
        books.node_mut().gpu_order = gpu_order;
        Ok(Arc::new(Daemon {
            svc: Services {
                usage: UsageLog::new(&live.config.state_dir),
                backend,
                journal,
                metrics: Metrics::new(),
                jobmap,
            },
            settings: Settings::new(live, config_path),
            books,
            node: NodeId {
                name: node,
                started: Instant::now(),
                shutdown,
            },
        }))
    }
}

/// The shadow's fallback, when the shadow is on (`[shadow]`).
pub(super) fn shadow_fallback(
    config: &Config,
    models: &[GpuModel],
) -> Result<Option<crate::policy_choice::Built>, PolicyChoiceError> {
    if config.mode == Mode::Advise || !config.shadow.enabled {
        return Ok(None);
    }
    crate::policy_choice::build_fallback(config.shadow.fallback_spec(), models).map(Some)
}

fn open_backend(config: &Config) -> Result<Arc<dyn Backend>, StartError> {
    Ok(match config.backend {
        BackendKind::Sim => {
            let models = config.sim_gpus().map_err(StartError::Config)?;
            let mut sim = config.sim.clone();
            if sim.caps_dir.is_none() {
                sim.caps_dir = config.socket.parent().map(|d| d.join("nvidia-caps"));
            }
            Arc::new(SimBackend::open(&config.state_dir, &models, sim)?)
        }
        BackendKind::Nvml => Arc::new(NvmlBackend::open(&config.nvml)?),
    })
}

/// Opens the journal in `journal_dir`, moving it there from where it was
/// last (docs/daemon.md, "The journal").
fn open_journal(config: &Config) -> Result<Journal, StartError> {
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
    Ok(journal)
}

/// One GPU's book: the instances the backend lists, assigned as the
/// journal says (an instance that vanished, or one assigned twice, is
/// dropped with a warning).
fn rebuild_book(
    backend: &dyn Backend,
    journal: &Journal,
    index: u32,
    model: GpuModel,
    now: u64,
) -> Result<GpuBook, StartError> {
    let geometry = Geometry::of(model);
    let mut book = GpuBook::new(index, geometry, now);
    for inst in backend.list(index)? {
        if geometry.fits(book.layout(), inst.placement) {
            let gi = backend.gpu_instance_id(index, &inst.uuid);
            book.add_instance(inst.placement, inst.uuid.clone(), now);
            book.set_gpu_instance_id(&inst.uuid, gi);
        } else {
            tracing::warn!(gpu = index, uuid = %inst.uuid, "instance overlaps another; ignored");
        }
    }
    for entry in journal.load(index)? {
        let job = entry.assignment.job_id;
        match book.find_uuid(&entry.uuid) {
            Some(i) if i.job.is_none() && book.find_job(job).is_none() => {
                book.assign(&entry.uuid, entry.assignment);
            }
            Some(_) => tracing::warn!(gpu = index, job, uuid = %entry.uuid,
                "journal assigns an instance twice; keeping the first assignment"),
            None => tracing::warn!(gpu = index, job, uuid = %entry.uuid,
                "journaled instance no longer exists (reboot or manual change); dropping the assignment"),
        }
    }
    Ok(book)
}

/// The node's Slurm name: `node_name`, else the host name.
fn node_name(config: &Config) -> String {
    config.node_name.clone().unwrap_or_else(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".into())
    })
}

/// Says what advise mode does; otherwise, with Slurm queries on, checks
/// that Slurm numbers the GPUs as the backend does. A mismatch refuses the
/// start; a Slurm that does not answer yet is asked again later
/// ([`gpu_order::spawn_retry`]).
fn check_slurm(
    live: &Live,
    backend: &dyn Backend,
    node: &str,
) -> Result<GpuOrderCheck, StartError> {
    let config = &live.config;
    if config.mode == Mode::Advise {
        // The site's gpu GRES are its MIG devices, not whole GPUs.
        tracing::info!(node = %node, log = %config.advice_log().display(),
            "advise mode: watching the node's own MIG setup and recording what the policy would do; \
             no instance is created or destroyed, no device file changed, allocate is refused");
        return Ok(GpuOrderCheck::default());
    }
    if !config.slurm.enabled {
        return Ok(GpuOrderCheck::default());
    }
    tracing::info!(node = %node, "asking Slurm (slurmd -G, squeue) about this node; smartmigd waits up to slurm.command_timeout_s for each answer");
    // Refuses to start when Slurm's GPU i (by device name, from `slurmd
    // -G`) is another device than the backend's GPU i: every job would get
    // an instance on a GPU other than the one Slurm gave it.
    match gpu_order::ask(backend, live.slurm.as_ref(), node) {
        Outcome::Mismatch(m) => Err(StartError::GpuOrder(m)),
        outcome => {
            gpu_order::log(node, &outcome, "at start");
            Ok(GpuOrderCheck::started(outcome))
        }
    }
}

/// Jobs that ended while the daemon was down give their instances back.
/// If squeue fails, every journaled assignment is kept.
fn release_ended_while_down(slurm: &dyn SlurmClient, gpus: &mut [Gpu], now: u64) {
    let live = match slurm.queue().map(|q| q.live()) {
        Ok(live) => live,
        Err(e) => {
            tracing::warn!(
                "cannot ask Slurm which jobs still run ({e}); keeping every journaled assignment"
            );
            return;
        }
    };
    for gpu in gpus.iter_mut() {
        let index = gpu.index;
        let st = gpu.state_mut();
        let ended: Vec<u64> = st
            .book
            .instances
            .iter()
            .filter_map(|i| i.job.as_ref().map(|a| a.job_id))
            .filter(|j| !live.contains(j))
            .collect();
        for job in ended {
            st.book.release(job, now);
            tracing::info!(
                gpu = index,
                job,
                "job ended while smartmigd was down; instance released"
            );
        }
    }
}

/// Journals `gpu`'s rebuilt book and, with `isolate_devices`, repairs
/// whatever a crash left (a release whose files were not given back, a
/// file changed by hand) before serving.
fn restore(
    config: &Config,
    backend: &dyn Backend,
    journal: &Journal,
    gpu: &mut Gpu,
) -> Result<(), StartError> {
    let index = gpu.index;
    let st = gpu.state_mut();
    journal.save(&st.book)?;
    if config.isolates() {
        if let Err(e) = enforce_access(backend, &st.book, None) {
            tracing::error!(gpu = index, "device isolation not restored at start: {e}");
        }
    }
    Ok(())
}
