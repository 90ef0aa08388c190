//! Memory sampling (backends that measure it: nvml): every
//! `memory.sample_s` the memory each busy instance uses now; the largest
//! sample of a job is its peak. With `oom.early_restart`, each sample also
//! goes to the early-restart rule, and a job it fires for is requeued on
//! a bigger profile while it runs.

use super::books::Gpu;
use super::context::{unix_now, unix_now_f64, Cx};
use super::requeue::{self, RequeueWhen};
use crate::memory::{EarlyTrigger, OomPolicy, Released};
use crate::mig::SpotId;
use crate::protocol::OomDecision;

/// One round of samples over every GPU.
pub(super) async fn sample_memory(cx: &Cx<'_>) {
    for gpu in &cx.books.gpus {
        sample_gpu(cx, gpu).await;
    }
}

/// Samples the busy instances of `gpu` (its lock is held only to list
/// them, not while the backend is asked).
async fn sample_gpu(cx: &Cx<'_>, gpu: &Gpu) {
    let cfg = cx.cfg();
    let rule = cfg.oom.early_restart.then_some(&cfg.oom.early);
    let (geometry, busy) = {
        let st = gpu.tx().await;
        let busy: Vec<(u64, String, SpotId)> = st
            .book
            .instances
            .iter()
            .filter_map(|i| Some((i.job.as_ref()?.job_id, i.uuid.clone(), i.placement)))
            .collect();
        (st.book.geometry, busy)
    };
    for (job, uuid, placement) in busy {
        let Some(now) = tokio::task::block_in_place(|| cx.svc.backend.memory_use(gpu.index, &uuid))
        else {
            continue;
        };
        // The instance's real size where the backend reports one.
        let size = if now.total_gb > 0.0 {
            now.total_gb
        } else {
            f64::from(geometry.spot(placement).profile.memory_gb)
        };
        let fired = cx
            .books
            .memory(|m| m.observe(job, now.used_gb, unix_now_f64(), size, rule));
        if let Some(trigger) = fired {
            early_restart(cx, job, &gpu.held(geometry, placement), trigger);
        }
    }
}

/// The early-restart rule fired for `job`: decide as for an out-of-memory
/// failure and, when allowed, requeue the running job.
fn early_restart(cx: &Cx<'_>, job: u64, held: &Released, trigger: EarlyTrigger) {
    let ev = cx
        .books
        .memory(|m| m.on_early_restart(job, held, trigger, OomPolicy::of(cx.cfg()), unix_now()));
    cx.svc.metrics.memory_restart("early", ev.decision.as_str());
    tracing::warn!(job, gpu = ev.gpu, profile = %ev.profile, used_gb = trigger.used_gb,
        predicted_gb = trigger.predicted_gb, decision = %ev.decision,
        "job's GPU memory use is predicted to exceed its instance: {}", ev.message);
    cx.books.memory.save_later(job);
    if ev.decision == OomDecision::RequeueScheduled {
        requeue::spawn(
            cx,
            job,
            requeue::raised_shards(cx.books, held),
            RequeueWhen::Running,
            &ev,
        );
    }
}
