//! slurmctld's record of one job (`scontrol show job -d`), read for the
//! decisions a user's environment or an operator's command must not make
//! alone (issue 42): the shards and GPU a job's allocate may have (the
//! allocate handler) and whether a job still runs on its instance (the
//! release handler).

use super::context::Cx;

/// What slurmctld answered about a job.
pub(super) enum Record {
    /// `scontrol show job -d` output.
    Listed(String),
    /// Slurm no longer lists the job.
    Gone,
}

/// Why slurmctld could not be asked (for the caller's refusal).
#[derive(Debug, thiserror::Error)]
pub(super) enum RecordError {
    #[error("cannot read slurmctld's record of the job: {0}")]
    Slurm(#[from] crate::slurm::SlurmError),
    #[error("the Slurm reader failed: {0}")]
    Reader(#[from] tokio::task::JoinError),
}

/// Reads the job's record off the runtime's worker threads.
pub(super) async fn read(cx: &Cx<'_>, job_id: u64) -> Result<Record, RecordError> {
    let slurm = cx.live.slurm.clone();
    match tokio::task::spawn_blocking(move || slurm.job_detail(job_id)).await {
        Ok(Ok(Some(text))) => Ok(Record::Listed(text)),
        Ok(Ok(None)) => Ok(Record::Gone),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(e.into()),
    }
}
