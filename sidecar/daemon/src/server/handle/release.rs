//! `release` (root or `slurm_user`: the plugin's job epilog, `smartmig
//! release`): frees every instance of a job (idempotent; by hand only once
//! Slurm shows the job ended) and wakes the
//! allocates waiting on its GPU; the job's memory use is learned, its
//! usage recorded, and an out-of-memory end decided (requeued on a larger
//! profile when the admin allows it; docs/oom-and-memory.md).

use super::super::books::Gpu;
use super::super::context::{unix_now, Cx};
use super::super::holds;
use super::super::job_record::{self, Record};
use super::super::requeue::{self, RequeueWhen};
use super::super::shadow;
use crate::memory::{OomPolicy, Released};
use crate::protocol::OomEvent;
use crate::protocol::{ErrorBody, ErrorKind, OomDecision, ReleaseReply, ReleaseRequest};
use crate::usage::{slice_seconds, UsageRecord};

/// What a release freed across the GPUs.
#[derive(Default)]
struct Freed {
    released: u32,
    /// What the job held, as the memory bookkeeping sees it.
    held: Option<Released>,
    usage: Vec<UsageRecord>,
}

pub(super) async fn serve(cx: &Cx<'_>, req: ReleaseRequest) -> Result<ReleaseReply, ErrorBody> {
    if req.from_epilog {
        cx.books.node(|l| l.releases.epilog += 1);
    } else {
        not_running(cx, req.job_id).await?;
    }
    let now = unix_now();
    let mut freed = Freed::default();
    for gpu in &cx.books.gpus {
        release_on(cx, gpu, &req, now, &mut freed).await;
    }
    if freed.released > 0 {
        // Slurm may list the job as running a while longer: it is no
        // allocate's mate any more.
        cx.books.node(|l| l.released_at.insert(req.job_id, now));
    }
    if !freed.usage.is_empty() {
        cx.svc.usage.record(
            freed.usage,
            &cx.svc.metrics,
            &cx.books.accounts,
            &cx.books.usage_turn,
        );
    }
    if freed.released > 0 {
        // Before the epilog ends and Slurm frees the job's shards: a new
        // hold is pending by then and takes what is stranded first.
        holds::sync(cx).await;
    }
    let event = learn(cx, &req, freed.held.as_ref(), now);
    if let Some(ev) = &event {
        out_of_memory(cx, req.job_id, freed.held.as_ref(), ev);
    }
    Ok(ReleaseReply {
        released: freed.released,
        oom_decision: event.map(|e| e.decision),
    })
}

/// A release by hand (`smartmig release`, not the job's epilog) of a job
/// that holds an instance: refused while Slurm shows the job running or
/// ending, since its processes may still use the instance and the next
/// job would share it (issue 42); refused too when Slurm cannot be asked.
/// Nodes without Slurm queries (`slurm.enabled = false`) trust the caller.
async fn not_running(cx: &Cx<'_>, job_id: u64) -> Result<(), ErrorBody> {
    if !cx.cfg().slurm.enabled || !holds_any(cx, job_id).await {
        return Ok(());
    }
    let text = match job_record::read(cx, job_id).await {
        Ok(Record::Listed(text)) => text,
        Ok(Record::Gone) => return Ok(()),
        Err(e) => {
            return Err(ErrorBody::new(
                ErrorKind::Backend,
                format!("job {job_id}: its instance is kept: {e}; retry when slurmctld answers"),
            ))
        }
    };
    match crate::slurm::parse_job_state(&text) {
        Some((state, raw)) if state.may_run() => {
            tracing::warn!(job = job_id, state = %raw, "release refused: the job still runs");
            Err(ErrorBody::new(
                ErrorKind::JobRunning,
                running_message(job_id, &raw),
            ))
        }
        _ => Ok(()),
    }
}

/// Why a release of a running job is refused, and what to do instead.
fn running_message(job_id: u64, state: &str) -> String {
    format!(
        "job {job_id} is {state} in Slurm: its processes may still use its MIG instance, \
         which would go to the next job while they run; its epilog releases it when it \
         ends. To end it now: `smartmig release --force {job_id}` (cancels the job with \
         scancel, then releases once Slurm shows it ended), or `scancel {job_id}` / \
         `scontrol requeue {job_id}` yourself"
    )
}

/// Whether the job holds an instance on any GPU.
async fn holds_any(cx: &Cx<'_>, job_id: u64) -> bool {
    for gpu in &cx.books.gpus {
        if gpu.tx().await.book.find_job(job_id).is_some() {
            return true;
        }
    }
    false
}

/// Frees the job's instance on `gpu`, if it holds one there: its memory
/// sampled (backends that measure it), its usage record made, the access
/// files given back to root, the journal written, the waiters woken.
async fn release_on(cx: &Cx<'_>, gpu: &Gpu, req: &ReleaseRequest, now: u64, freed: &mut Freed) {
    let job_id = req.job_id;
    let mut st = gpu.tx().await;
    let Some(inst) = st.book.find_job(job_id) else {
        return;
    };
    let uuid = inst.uuid.clone();
    let h = gpu.held(st.book.geometry, inst.placement);
    freed.held = Some(h.clone());
    // A blocking section hands the worker thread over (futex wake-ups):
    // only for a backend that measures anything.
    let backend = &cx.svc.backend;
    let measured = backend
        .measures_memory()
        .then(|| tokio::task::block_in_place(|| backend.peak_memory_gb(gpu.index, &uuid)));
    if let Some(gb) = measured.flatten() {
        cx.books.memory(|m| m.sample(job_id, gb));
    }
    if let Some(a) = &inst.job {
        let deadline = cx
            .books
            .node(|l| l.times_of(job_id, a.deadline, None).deadline);
        let job = shadow::seen(a, st.book.geometry, h.compute, h.memory_gb, deadline);
        cx.books.shadow.ended(job_id, now as f64, job);
        let peak = cx.books.memory(|m| m.peak(job_id, req.used_memory_gb));
        freed.usage.push(UsageRecord {
            job_id,
            uid: a.uid,
            user: None,
            account: None,
            gpu: gpu.index,
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
    freed.released += n;
    // One instance per job and GPU; should there be more, all of them.
    if let Err(e) = cx
        .svc
        .isolate(cx.cfg(), &st.book, (n == 1).then_some(uuid.as_str()))
    {
        tracing::error!(
            gpu = gpu.index,
            job = job_id,
            "released instance still open to the job's user: {e}"
        );
    }
    if let Err(e) = cx.svc.save_journal(&st.book) {
        // The release happened; on restart Slurm reconciliation drops it again.
        tracing::error!(gpu = gpu.index, job = job_id, "release not journaled: {e}");
    }
    cx.svc.publish_jobs(&st.book);
    drop(st);
    tracing::info!(gpu = gpu.index, job = job_id, "released");
    gpu.released.notify_waiters();
}

/// What the release teaches the memory bookkeeping, and the out-of-memory
/// decision when the job ran out.
fn learn(cx: &Cx<'_>, req: &ReleaseRequest, held: Option<&Released>, now: u64) -> Option<OomEvent> {
    let policy = OomPolicy::of(cx.cfg());
    let (changed, event) = cx
        .books
        .memory(|m| m.on_release(req.job_id, held, req.oom, req.used_memory_gb, policy, now));
    if changed {
        // On disk with fsync (it must survive a reboot), but after the
        // reply, not before it; shutdown saves once more.
        cx.books.memory.save_later(req.job_id);
    }
    if req.oom && held.is_none() {
        tracing::info!(
            job = req.job_id,
            "out-of-memory release of a job that holds no instance (a repeated release?); ignored"
        );
    }
    event
}

/// An out-of-memory end: counted, logged, and the job requeued in the
/// background when that was decided.
fn out_of_memory(cx: &Cx<'_>, job_id: u64, held: Option<&Released>, ev: &OomEvent) {
    cx.svc.metrics.failure("oom");
    cx.svc.metrics.memory_restart("oom", ev.decision.as_str());
    tracing::warn!(job = job_id, gpu = ev.gpu, profile = %ev.profile, failures = ev.failures,
        decision = %ev.decision, "job ran out of GPU memory: {}", ev.message);
    if ev.decision == OomDecision::RequeueScheduled {
        let raise_to = held.and_then(|h| requeue::raised_shards(cx.books, h));
        requeue::spawn(cx, job_id, raise_to, RequeueWhen::Failed, ev);
    }
}
