//! The reaper: releases what jobs that ended in Slurm still hold, when the
//! plugin's epilog release never came (each epoch, `smartmig reconcile`,
//! and an allocate that waits for room).

use super::books::Gpu;
use super::context::{unix_now, Cx};
use crate::memory::OomPolicy;
use crate::slurm::QueueSnapshot;

/// Releases the instances of jobs that `queue` (read at Unix second `t0`)
/// shows ended or no longer lists, e.g. when the epilog's release never
/// arrived. An assignment made in or after `t0` is never touched (its job
/// may not be in the answer yet). Each release is logged; a reaper
/// release while no epilog release was ever seen is an error in the log
/// (the plugin's job_epilog does not run). Returns the jobs released.
pub(super) async fn ended_jobs(cx: &Cx<'_>, queue: &QueueSnapshot, t0: u64) -> Vec<u64> {
    let mut released = Vec::new();
    for gpu in &cx.books.gpus {
        let ended = release_ended_on(cx, gpu, queue, t0).await;
        if ended.is_empty() {
            continue;
        }
        forget(cx, &ended);
        gpu.released.notify_waiters();
        released.extend(ended);
    }
    released
}

/// Releases, on `gpu`, what jobs `queue` shows ended hold; journals it.
async fn release_ended_on(cx: &Cx<'_>, gpu: &Gpu, queue: &QueueSnapshot, t0: u64) -> Vec<u64> {
    let live = queue.live();
    let now = unix_now();
    let mut st = gpu.tx().await;
    let ended: Vec<u64> = st
        .book
        .instances
        .iter()
        .filter_map(|i| i.job.as_ref())
        .filter(|a| a.since < t0 && !live.contains(&a.job_id))
        .map(|a| a.job_id)
        .collect();
    if ended.is_empty() {
        return ended;
    }
    st.tick_energy();
    for &job in &ended {
        st.book.release(job, now);
        let state = queue
            .job(job)
            .map_or("no longer listed".to_string(), |j| format!("{:?}", j.state));
        tracing::info!(
            gpu = gpu.index,
            job,
            state = %state,
            "job ended in Slurm but its release never arrived; instance released"
        );
    }
    if let Err(e) = tokio::task::block_in_place(|| cx.svc.journal.save(&st.book)) {
        tracing::error!(gpu = gpu.index, "release of ended jobs not journaled: {e}");
    }
    cx.svc.publish_jobs(&st.book);
    ended
}

/// The memory bookkeeping forgets the reaped runs (no out-of-memory
/// decision: the job's end was not seen), and the reaper's releases are
/// counted; an epilog that never ran is called out.
fn forget(cx: &Cx<'_>, ended: &[u64]) {
    let now = unix_now();
    cx.books.memory(|m| {
        for &job in ended {
            let policy = OomPolicy {
                requeue: false,
                max_retries: 0,
                slurm_enabled: false,
            };
            m.on_release(job, None, false, None, policy, now);
        }
    });
    let counts = {
        cx.books.node(|ledger| {
            ledger.releases.reaped += ended.len() as u64;
            ledger.releases
        })
    };
    cx.svc.metrics.reaped(ended.len() as u64);
    if counts.epilog_missing() {
        tracing::error!(
            reaped = counts.reaped,
            "no release ever came from the SPANK plugin's job_epilog: instances are only freed when \
             smartmigd sees the job gone from squeue, so back-to-back jobs may wait or fail. \
             Restart slurmd after adding the plugin to plugstack.conf (docs/slurm-integration.md)"
        );
    }
}
