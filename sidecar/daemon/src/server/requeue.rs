//! Out-of-memory requeues, in the background: a job that ran out of memory
//! (a release with `oom`) once it ended FAILED, or one the early-restart
//! rule fired for while it runs; its shard request raised when its next
//! profile has more compute slices than it held.

use std::sync::Arc;
use std::time::{Duration, Instant};

use smartmig_client::told::Requeued;
use tokio::sync::watch;

use super::books::Books;
use super::books::MemoryBook;
use super::context::{unix_now, Cx};
use crate::memory::Released;
use crate::protocol::{OomDecision, OomEvent};
use crate::slurm::{JobState, QueuedJob, SlurmClient};

/// When a job is ready to be requeued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RequeueWhen {
    /// After an out-of-memory failure: once it ended FAILED (a job that was
    /// cancelled or timed out after writing the marker stays ended).
    Failed,
    /// An early restart: while it runs (`scontrol requeue` kills it); a job
    /// that ended meanwhile is left alone.
    Running,
}

/// Why an out-of-memory requeue did not happen.
enum RequeueEnd {
    /// The job ended otherwise than FAILED (cancelled, timed out): it
    /// must stay ended.
    Skipped(String),
    /// Slurm refused or did not answer within the time allowed.
    Failed(String),
}

/// The compute slices Slurm must bill for a restart on the next larger
/// memory size after `held`, when that profile blocks more shards than
/// the job holds (never more than the GPU has); `None` otherwise. The
/// restart profile is the room its memory takes
/// ([`crate::memory::restart_profile`], issue 55): after 1g.5gb on an
/// A100-40GB, 2g.10gb billed shard:2, not 1g.10gb billed shard:1.
pub(super) fn raised_shards(books: &Books, held: &Released) -> Option<u8> {
    let model = books.gpu(held.gpu)?.model.spec();
    let next = held.next_memory_gb?;
    let p = crate::memory::restart_profile(model, held.compute, next)?;
    (p.shape.compute > held.compute).then_some(p.shape.compute)
}

/// Requeues `job_id` in the background: `scontrol requeue` is retried
/// every second for up to `oom.requeue_timeout_s` (Slurm refuses it while
/// the job is still completing, i.e. while its epilog, which sent the
/// release, runs). Success or failure is logged and kept as an event.
///
/// `raise_to`: the compute slices the restart will get when that is more
/// than the job's shard request; the request is raised to it (`scontrol
/// update JobId=.. Gres=shard:K`) once the job is pending. `when`: the
/// state the job must be in to be requeued.
///
/// The job's user is told why (issue 56): its next run prints
/// [`oom_told`]'s line (the note waits in the ledger for the job's next
/// allocate), and once the requeue succeeded its `AdminComment` gets the
/// same reason as a word (which the plugin reads back when the note is
/// lost: smartmigd restarted, or the job runs elsewhere).
pub(super) fn spawn(
    cx: &Cx<'_>,
    job_id: u64,
    raise_to: Option<u8>,
    when: RequeueWhen,
    ev: &OomEvent,
) {
    let slurm = cx.live.slurm.clone();
    let memory = cx.books.memory.clone();
    let stop = cx.node.shutdown.subscribe();
    let limit = Duration::from_secs(cx.cfg().oom.requeue_timeout_s);
    let told = oom_told(ev, when);
    let note = told.line(Some(&format!(
        "out-of-memory restart {}; docs/slurm-integration.md §2a",
        ev.failures
    )));
    cx.books.node(|l| l.requeue_notes.insert(job_id, note));
    let word = cx.cfg().accounting.admin_comment.then(|| told.to_word());
    tokio::spawn(async move {
        let (outcome, attempts) = until_requeued(&slurm, job_id, when, limit, stop).await;
        if let (Ok(()), Some(word)) = (&outcome, word) {
            comment(&slurm, job_id, word).await;
        }
        let outcome = match (outcome, raise_to) {
            (Ok(()), Some(k)) => raise_shards(&slurm, job_id, k).await,
            (o, _) => o,
        };
        let (decision, message) = decision_of(job_id, outcome, attempts, when);
        record(&memory, job_id, decision, message);
    });
}

/// Why a job requeued for its memory was requeued: its `AdminComment`
/// word and, through [`smartmig_client::told::Requeued::line`], the line
/// its next run prints at the start of its output.
pub(super) fn oom_told(ev: &OomEvent, when: RequeueWhen) -> Requeued {
    Requeued::out_of_memory(
        unix_now(),
        ev.gpu,
        &ev.profile,
        when == RequeueWhen::Running,
        ev.next_memory_gb,
    )
}

/// Adds `word` to the requeued job's `AdminComment` (replacing an older
/// requeue word), so that `scontrol show job` says why while it waits.
async fn comment(slurm: &Arc<dyn SlurmClient>, job_id: u64, word: String) {
    let s = slurm.clone();
    let done = tokio::task::spawn_blocking(move || {
        let c = s.job_comment(job_id)?;
        let existing = c.map(|c| c.admin_comment).unwrap_or_default();
        s.set_admin_comment(
            &job_id.to_string(),
            &crate::usage::merge_requeue(&existing, &word),
        )
    })
    .await;
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(
            job = job_id,
            "AdminComment not told why the job was requeued: {e}"
        ),
        Err(e) => tracing::warn!(job = job_id, "AdminComment task failed: {e}"),
    }
}

/// What one look at the queue and, when the job is ready, one `scontrol
/// requeue` gave.
enum Attempt {
    Requeued,
    /// The job ended in a state that must not be requeued.
    Ended(String),
    /// Not yet (the job is still completing, Slurm refused): why.
    NotYet(String),
}

/// Tries until the job is requeued, it ended otherwise, `limit` passed or
/// the daemon shuts down; returns the outcome and the attempts made.
async fn until_requeued(
    slurm: &Arc<dyn SlurmClient>,
    job_id: u64,
    when: RequeueWhen,
    limit: Duration,
    mut stop: watch::Receiver<bool>,
) -> (Result<(), RequeueEnd>, u32) {
    let t0 = Instant::now();
    let mut attempts = 0u32;
    let outcome = loop {
        let last = match attempt(slurm, job_id, when, &mut attempts).await {
            Attempt::Requeued => break Ok(()),
            Attempt::Ended(why) => break Err(RequeueEnd::Skipped(why)),
            Attempt::NotYet(why) => why,
        };
        if t0.elapsed() >= limit {
            break Err(RequeueEnd::Failed(last));
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => break Err(RequeueEnd::Failed(format!("smartmigd shut down first (last error: {last})"))),
        }
    };
    (outcome, attempts)
}

/// Reads the job's state and requeues it when it is in the state `when`
/// asks for. Only a job that ended FAILED is requeued after a failure: one
/// that was cancelled or hit its time limit after writing the marker must
/// stay ended.
async fn attempt(
    slurm: &Arc<dyn SlurmClient>,
    job_id: u64,
    when: RequeueWhen,
    attempts: &mut u32,
) -> Attempt {
    let s = slurm.clone();
    let queued = tokio::task::spawn_blocking(move || s.queue())
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|q| q.job(job_id).cloned());
    let ready = match when {
        RequeueWhen::Failed => JobState::Failed,
        RequeueWhen::Running => JobState::Running,
    };
    match queued.as_ref().map(|j| j.state) {
        Some(st) if st == ready => {
            *attempts += 1;
            let s = slurm.clone();
            let id = queued
                .as_ref()
                .map_or(job_id.to_string(), QueuedJob::slurm_id);
            match tokio::task::spawn_blocking(move || s.requeue(&id)).await {
                Ok(Ok(())) => Attempt::Requeued,
                Ok(Err(e)) => Attempt::NotYet(e.to_string()),
                Err(e) => Attempt::NotYet(format!("requeue task failed: {e}")),
            }
        }
        Some(
            st @ (JobState::Cancelled
            | JobState::Timeout
            | JobState::Completed
            | JobState::Failed
            | JobState::OtherEnded),
        ) => Attempt::Ended(match when {
            RequeueWhen::Failed => format!("the job ended {st:?}, not FAILED: not requeued"),
            RequeueWhen::Running => {
                format!("the job ended {st:?} before its early restart: not requeued")
            }
        }),
        Some(st) => Attempt::NotYet(format!("the job is still {st:?}")),
        None => Attempt::NotYet("the job is not in squeue's answer".to_string()),
    }
}

/// Raises the requeued job's shard request to `k` (a failure is logged:
/// the job still restarts, Slurm bills fewer shards than it gets).
async fn raise_shards(slurm: &Arc<dyn SlurmClient>, job_id: u64, k: u8) -> Result<(), RequeueEnd> {
    let s = slurm.clone();
    match tokio::task::spawn_blocking(move || s.set_job_shards(job_id, k)).await {
        Ok(Ok(())) => {
            tracing::info!(
                job = job_id,
                shards = k,
                "shard request raised for the larger profile"
            );
            Ok(())
        }
        Ok(Err(e)) => {
            tracing::warn!(job = job_id, shards = k, "requeued, but its shard request could not be raised ({e}); Slurm bills fewer shards than the instance it will get");
            Ok(())
        }
        Err(e) => Err(RequeueEnd::Failed(format!("shard update task failed: {e}"))),
    }
}

/// The decision an outcome records, and its message (logged).
fn decision_of(
    job_id: u64,
    outcome: Result<(), RequeueEnd>,
    attempts: u32,
    when: RequeueWhen,
) -> (OomDecision, String) {
    match outcome {
        Ok(()) => {
            tracing::info!(
                job = job_id,
                attempts,
                ?when,
                "requeued for running out of GPU memory; its next start gets a larger profile"
            );
            (
                OomDecision::Requeued,
                format!("scontrol requeue {job_id} succeeded (attempt {attempts})"),
            )
        }
        Err(RequeueEnd::Skipped(why)) => {
            tracing::info!(job = job_id, ?when, "{why}");
            (OomDecision::NotRequeued, why)
        }
        Err(RequeueEnd::Failed(e)) => {
            tracing::error!(
                job = job_id,
                attempts,
                ?when,
                "could not requeue the job for running out of GPU memory: {e}"
            );
            (
                OomDecision::RequeueFailed,
                format!("scontrol requeue {job_id} failed after {attempts} attempt(s): {e}"),
            )
        }
    }
}

/// Keeps the outcome as an event of the job and saves the memory state.
fn record(memory: &MemoryBook, job_id: u64, decision: OomDecision, message: String) {
    memory.with(|m| {
        m.on_requeue_result(job_id, decision, message, unix_now());
        if let Err(e) = m.save() {
            tracing::error!(job = job_id, "memory estimates not saved: {e}");
        }
    });
}
