//! smartmigd's holds on stranded shards in Slurm (issue 42,
//! docs/slurm-integration.md §9): the shell around the pure
//! [`crate::holds::plan`]. Each sync reads what the GPUs' busy instances
//! and waiting allocates leave, plans, and queues new holds (`salloc
//! --no-shell`, top priority) before it cancels old ones.
//!
//! A sync runs in the release handler before it answers the job's epilog
//! (so the new hold is pending before Slurm frees the ended job's shards),
//! in the background after an allocate (woken through [`super::books::Books::want_holds`])
//! and at every epoch, which also adopts the holds Slurm lists (after a
//! restart) and forgets those gone.

use super::context::Cx;
use crate::holds::{plan, GpuShards, Hold, Step};
use crate::slurm::{QueueSnapshot, HOLD_NAME};

/// The holds this node runs now and why: `slurm.holds` against what
/// slurmd said of gres.conf's per-GPU types ([`crate::holds::decide`]).
/// Takes the ledger's lock: not for a caller that holds it.
pub(super) fn decision(cx: &Cx<'_>) -> crate::holds::HoldsDecision {
    let typing = cx.books.node(|l| l.gpu_order.typing());
    let cfg = cx.cfg();
    crate::holds::decide(cfg.slurm.holds, &typing, cfg.slurm.enabled)
}

/// The rule the holds follow now; `None`: no holds.
pub(super) fn rule(cx: &Cx<'_>) -> Option<crate::mig::OfferPolicy> {
    decision(cx).rule
}

/// Says at start (and when Slurm first answers) whether smartmigd holds
/// stranded shards, and why: a warning when it runs without them.
pub(super) fn log_decision(cx: &Cx<'_>, at: &str) {
    let d = decision(cx);
    match d.rule {
        Some(_) => tracing::info!(
            holds = d.state(),
            "holding stranded shards in Slurm: {} ({at})",
            d.reason
        ),
        None if cx.cfg().slurm.enabled => {
            tracing::warn!(
                holds = "off",
                "running without holds on stranded shards: {} ({at})",
                d.reason
            );
        }
        None => {}
    }
}

/// Takes this node's holds to what its GPUs should hold now.
pub(super) async fn sync(cx: &Cx<'_>) {
    let Some(rule) = rule(cx) else {
        return;
    };
    let mut held = cx.books.holds().await;
    let gpus = shards(cx).await;
    for step in plan(&gpus, &held, rule) {
        match step {
            Step::Hold { gpu, shards } => {
                if let Some(h) = queue_hold(cx, gpu, shards).await {
                    held.push(h);
                }
            }
            Step::Release { job_id } => {
                if cancel(cx, job_id).await {
                    held.retain(|h| h.job_id != job_id);
                }
            }
        }
    }
}

/// The epoch's look at Slurm's queue: holds of this node Slurm lists are
/// adopted (a restarted smartmigd), holds it no longer lists are forgotten.
pub(super) async fn adopt(cx: &Cx<'_>, queue: &QueueSnapshot) {
    if rule(cx).is_none() {
        return;
    }
    let listed: Vec<Hold> = queue
        .jobs
        .iter()
        .filter(|j| j.state.is_live() && j.hold_of().is_some_and(|(n, _)| n == cx.node.name))
        .filter_map(|j| {
            let (_, gpu) = j.hold_of()?;
            Some(Hold {
                job_id: j.job_id,
                gpu,
                shards: j.shards,
            })
        })
        .collect();
    // A hold queued after the queue was read has a larger job id than
    // any the queue shows: kept.
    let seen = queue.jobs.iter().map(|j| j.job_id).max().unwrap_or(0);
    let mut held = cx.books.holds().await;
    held.retain(|h| h.job_id > seen || listed.iter().any(|l| l.job_id == h.job_id));
    for h in listed {
        if !held.iter().any(|k| k.job_id == h.job_id) {
            held.push(h);
        }
    }
}

/// Each GPU's busy instances and the shards Slurm gave its jobs (those of
/// allocates still waiting for room included).
async fn shards(cx: &Cx<'_>) -> Vec<GpuShards> {
    let waiting: Vec<(u32, u8)> = cx.books.node(|l| {
        l.waiting
            .values()
            .map(|w| (w.gpu, w.contender.need.slices))
            .collect()
    });
    let mut out = Vec::with_capacity(cx.books.gpus.len());
    let now = super::context::unix_now();
    for gpu in &cx.books.gpus {
        let st = gpu.tx().await;
        let busy = st.book.busy();
        let geometry = st.book.geometry;
        let queued: u8 = waiting
            .iter()
            .filter(|(g, _)| *g == gpu.index)
            .map(|(_, k)| *k)
            .sum();
        out.push(GpuShards {
            index: gpu.index,
            geometry,
            busy,
            // Slurm's count: a lent instance's job is billed less than
            // the instance takes, and the rest is what must be held.
            used: st.book.billed_shards().saturating_add(queued),
            since_collision_s: st.book.since_collision_s(now),
        });
    }
    out
}

async fn queue_hold(cx: &Cx<'_>, gpu: u32, shards: u8) -> Option<Hold> {
    let slurm = cx.live.slurm.clone();
    let node = cx.node.name.clone();
    let name = format!("{HOLD_NAME}.{node}.{gpu}");
    let r = tokio::task::spawn_blocking(move || {
        slurm.hold(&name, &node, &crate::holds::gres_type(gpu), shards)
    })
    .await;
    match r {
        Ok(Ok(job_id)) => {
            tracing::info!(
                gpu,
                shards,
                hold = job_id,
                "holding stranded shards in Slurm"
            );
            Some(Hold {
                job_id,
                gpu,
                shards,
            })
        }
        Ok(Err(e)) => {
            tracing::warn!(gpu, shards, "cannot hold stranded shards: {e}");
            None
        }
        Err(e) => {
            tracing::error!(gpu, shards, "the hold task failed: {e}");
            None
        }
    }
}

/// Cancels a hold; `true` when it is gone (cancelled, or Slurm no longer
/// knows it).
async fn cancel(cx: &Cx<'_>, job_id: u64) -> bool {
    let slurm = cx.live.slurm.clone();
    match tokio::task::spawn_blocking(move || slurm.cancel(job_id)).await {
        Ok(Ok(())) => {
            tracing::info!(hold = job_id, "hold released");
            true
        }
        Ok(Err(e)) if e.to_string().contains("Invalid job id") => true,
        Ok(Err(e)) => {
            tracing::warn!(hold = job_id, "cannot release the hold: {e}");
            false
        }
        Err(e) => {
            tracing::error!(hold = job_id, "the hold task failed: {e}");
            false
        }
    }
}
