//! The services the handlers and the epoch loop are handed: the MIG
//! backend, the journal, the metrics, the memory estimates and the usage
//! log. None of them knows the books or the requests; each keeps its own
//! lock, taken last (docs/architecture.md, "The daemon's concurrency").

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::auth::user_name;
use crate::access::{self, Holder, IsolationError};
use crate::allocate::GpuBook;
use crate::backend::Backend;
use crate::config::Config;
use crate::jobmap::JobMap;
use crate::journal::{Durability, Journal, JournalError};
use crate::memory::MemoryState;
use crate::metrics::Metrics;
use crate::slurm::SlurmClient;
use crate::usage::{merge_comment, SliceTag, UsageRecord, USAGE_LOG, USAGE_LOG_MAX_BYTES};

/// Everything a request or an epoch may use besides the books.
pub(super) struct Services {
    pub backend: Arc<dyn Backend>,
    pub journal: Journal,
    pub metrics: Metrics,
    pub memory: MemoryLedger,
    pub usage: UsageLog,
    /// dcgm-exporter's job-mapping directory (`hpc_job_mapping_dir`).
    pub jobmap: Option<JobMap>,
    /// The day's shadow: its jobs and which policy runs.
    pub shadow: super::shadow::ShadowRun,
}

impl Services {
    /// Journals `book` before a reply. On disk the `fdatasync` blocks, so
    /// the worker thread is handed over (`block_in_place`); on a tmpfs the
    /// write takes microseconds and the hand-over would cost more.
    pub(super) fn save_journal(&self, book: &GpuBook) -> Result<(), JournalError> {
        match self.journal.durability() {
            Durability::Disk => tokio::task::block_in_place(|| self.journal.save(book)),
            Durability::Memory => self.journal.save(book),
        }
    }

    /// Rewrites `book`'s GPU's dcgm-exporter job-mapping files, when
    /// `hpc_job_mapping_dir` is set. A failure is logged: it costs the
    /// DCGM series their `hpc_job` label, never a job its instance.
    pub(super) fn publish_jobs(&self, book: &GpuBook) {
        let Some(map) = &self.jobmap else { return };
        if let Err(e) = tokio::task::block_in_place(|| map.sync(book)) {
            tracing::error!(gpu = book.index, dir = %map.dir().display(), "DCGM job-mapping files not written: {e}");
        }
    }

    /// [`enforce_access`] when `isolate_devices` is on.
    pub(super) fn isolate(
        &self,
        cfg: &Config,
        book: &GpuBook,
        only: Option<&str>,
    ) -> Result<(), IsolationError> {
        if cfg.isolates() {
            enforce_access(self.backend.as_ref(), book, only)
        } else {
            Ok(())
        }
    }
}

/// Gives the access files of every instance of `book`'s GPU (or only of
/// instance `only`) to the user of the job holding it, or to root while it
/// is idle ([`crate::access`]). Tries every file; returns the first failure
/// (each one is logged).
pub(super) fn enforce_access(
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

/// The learned memory estimates and the out-of-memory ledger (short,
/// synchronous critical sections; never held across an `.await`).
#[derive(Clone)]
pub(super) struct MemoryLedger(Arc<Mutex<MemoryState>>);

impl MemoryLedger {
    pub(super) fn new(state: MemoryState) -> MemoryLedger {
        MemoryLedger(Arc::new(Mutex::new(state)))
    }

    /// The memory state, also after a panic elsewhere poisoned the lock
    /// (every update leaves it consistent).
    pub(super) fn lock(&self) -> MutexGuard<'_, MemoryState> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Saves the memory state in the background (fsync'd, after the reply;
    /// saves queue on the mutex, so the last one writes the newest state).
    pub(super) fn save_later(&self, job_id: u64) {
        let memory = self.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = memory.lock().save() {
                tracing::error!(job = job_id, "memory estimates not saved: {e}");
            }
        });
    }
}

/// The node's usage log (`<state_dir>/usage.jsonl`) and the Slurm accounts
/// of running jobs, read when their `AdminComment` was tagged.
pub(super) struct UsageLog {
    path: PathBuf,
    /// Serialises appends to the log.
    append: Mutex<()>,
    accounts: Arc<Mutex<HashMap<u64, String>>>,
}

impl UsageLog {
    /// The log in `state_dir` (a restart-only setting).
    pub(super) fn new(state_dir: &Path) -> UsageLog {
        UsageLog {
            path: state_dir.join(USAGE_LOG),
            append: Mutex::new(()),
            accounts: Arc::default(),
        }
    }

    fn accounts(&self) -> MutexGuard<'_, HashMap<u64, String>> {
        self.accounts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends released instances to the log (rotated to `usage.jsonl.1`
    /// past [`USAGE_LOG_MAX_BYTES`]) and counts them in the metrics.
    pub(super) fn record(&self, records: Vec<UsageRecord>, metrics: &Metrics) {
        let mut lines = String::new();
        for mut r in records {
            r.user = Some(tokio::task::block_in_place(|| user_name(r.uid)));
            r.account = self.accounts().remove(&r.job_id);
            metrics.usage(&r);
            match serde_json::to_string(&r) {
                Ok(l) => {
                    lines.push_str(&l);
                    lines.push('\n');
                }
                Err(e) => tracing::error!(job = r.job_id, "usage record not encoded: {e}"),
            }
        }
        let _guard = self
            .append
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) =
            tokio::task::block_in_place(|| append_rotating(&self.path, &lines, USAGE_LOG_MAX_BYTES))
        {
            tracing::error!(path = %self.path.display(), "usage log not written: {e}");
        }
    }

    /// Adds the job's [`SliceTag`] to its `AdminComment` in the background
    /// (`accounting.admin_comment` and Slurm queries on): one `scontrol
    /// show job` for the comment the site may have set and the account, one
    /// `scontrol update`. A failure is logged, never the job's problem.
    pub(super) fn spawn_tag(
        &self,
        cfg: &Config,
        slurm: Arc<dyn SlurmClient>,
        job_id: u64,
        tag: SliceTag,
    ) {
        if !(cfg.slurm.enabled && cfg.accounting.admin_comment) {
            return;
        }
        let accounts = Arc::clone(&self.accounts);
        tokio::task::spawn_blocking(move || {
            let result = slurm.job_comment(job_id).and_then(|job| {
                let Some(job) = job else {
                    return Ok(false);
                };
                if let Some(a) = &job.account {
                    accounts
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(job_id, a.clone());
                }
                // An array task by its `A_T` name: the first task's id is
                // the array's, which alone would update every task.
                let name = job.array_task.map_or_else(
                    || job_id.to_string(),
                    |(array, task)| format!("{array}_{task}"),
                );
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
}

/// Appends `text` to `path`, first moving a file of `max_bytes` or more to
/// `<path>.1`. A new file is mode 0600: it names every user's jobs, which
/// `status` shows only to root, `slurm_user` and operators.
pub(super) fn append_rotating(path: &Path, text: &str, max_bytes: u64) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if std::fs::metadata(path).is_ok_and(|m| m.len() >= max_bytes) {
        std::fs::rename(path, crate::usage::rotated(path))?;
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
