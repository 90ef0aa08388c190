//! The services the handlers and the epoch loop are handed: the I/O
//! handles (the MIG backend, the journal, the metrics, the usage log, the
//! DCGM job-mapping files). None of them knows the requests, and none
//! keeps node state: what they need of it (the jobs' accounts, the usage
//! log's turn) is in the books (docs/architecture.md, "Who owns node
//! state").

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::auth::user_name;
use super::books::{Accounts, Turn};
use crate::access::{self, Holder, IsolationError};
use crate::allocate::GpuBook;
use crate::backend::Backend;
use crate::config::Config;
use crate::jobmap::JobMap;
use crate::journal::{Durability, Journal, JournalError};
use crate::metrics::Metrics;
use crate::slurm::SlurmClient;
use crate::usage::{merge_comment, SliceTag, UsageRecord, USAGE_LOG, USAGE_LOG_MAX_BYTES};

/// Everything a request or an epoch may use besides the books.
pub(super) struct Services {
    pub backend: Arc<dyn Backend>,
    pub journal: Journal,
    pub metrics: Metrics,
    pub usage: UsageLog,
    /// dcgm-exporter's job-mapping directory (`hpc_job_mapping_dir`).
    pub jobmap: Option<JobMap>,
}

impl Services {
    /// Journals `book` before a reply. On disk the journal's writer thread
    /// answers after an `fdatasync`, so the worker thread is handed over
    /// (`block_in_place`) while waiting; on a tmpfs it answers in
    /// microseconds and the hand-over would cost more.
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

/// The node's usage log (`<state_dir>/usage.jsonl`); the Slurm accounts
/// of running jobs, read when their `AdminComment` was tagged, and the
/// turn that serialises appends are the books'.
pub(super) struct UsageLog {
    path: PathBuf,
}

impl UsageLog {
    /// The log in `state_dir` (a restart-only setting).
    pub(super) fn new(state_dir: &Path) -> UsageLog {
        UsageLog {
            path: state_dir.join(USAGE_LOG),
        }
    }

    /// Appends released instances to the log (rotated to `usage.jsonl.1`
    /// past [`USAGE_LOG_MAX_BYTES`]) and counts them in the metrics.
    pub(super) fn record(
        &self,
        records: Vec<UsageRecord>,
        metrics: &Metrics,
        accounts: &Accounts,
        turn: &Turn,
    ) {
        let mut lines = String::new();
        for mut r in records {
            r.user = Some(tokio::task::block_in_place(|| user_name(r.uid)));
            r.account = accounts.remove(r.job_id);
            metrics.usage(&r);
            match serde_json::to_string(&r) {
                Ok(l) => {
                    lines.push_str(&l);
                    lines.push('\n');
                }
                Err(e) => tracing::error!(job = r.job_id, "usage record not encoded: {e}"),
            }
        }
        turn.take(|| {
            if let Err(e) = tokio::task::block_in_place(|| {
                append_rotating(&self.path, &lines, USAGE_LOG_MAX_BYTES)
            }) {
                tracing::error!(path = %self.path.display(), "usage log not written: {e}");
            }
        });
    }

    /// Adds the job's [`SliceTag`] to its `AdminComment` in the background
    /// (`accounting.admin_comment` and Slurm queries on): one `scontrol
    /// show job` for the comment the site may have set and the account, one
    /// `scontrol update`. A failure is logged, never the job's problem.
    pub(super) fn spawn_tag(
        &self,
        cfg: &Config,
        slurm: Arc<dyn SlurmClient>,
        accounts: &Accounts,
        job_id: u64,
        tag: SliceTag,
    ) {
        if !(cfg.slurm.enabled && cfg.accounting.admin_comment) {
            return;
        }
        let accounts = accounts.clone();
        tokio::task::spawn_blocking(move || {
            let result = slurm.job_comment(job_id).and_then(|job| {
                let Some(job) = job else {
                    return Ok(false);
                };
                if let Some(a) = &job.account {
                    accounts.insert(job_id, a.clone());
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
