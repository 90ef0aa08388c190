//! The XID listener: NVML XID events become the GPUs' health marks
//! ([`crate::health`]), unhealthy idle instances are rebuilt, and the node
//! is drained (or its drain taken back) through Slurm.
//!
//! One thread owns the backend's XID watcher (`Backend::xid_watch`, an I/O
//! edge: its event set is its own, so nothing is locked) and waits on it
//! one second at a time, handing each outcome to one task, which books the
//! event and, after each wait, rebuilds the idle instances an XID marked.
//! The node's drain follows the marks in [`settle_node`], run after a
//! GPU-fatal XID and by every epoch.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::context::{unix_now, Cx, Daemon};
use super::{instances, queue};
use crate::backend::{BackendError, XidWatch};
use crate::health::{node_action, NodeAction, Severity, Verdict, XidEvent};
use crate::slurm::NodeInfo;

/// How long one wait for an XID lasts: also how soon an instance marked
/// while busy is rebuilt after its job ends.
const WAIT: Duration = Duration::from_secs(1);

/// How long the XID thread waits after a failed wait before the next.
const RETRY: Duration = Duration::from_secs(10);

/// One wait's outcome, from the XID thread to the listener task.
type Waited = Result<Option<XidEvent>, BackendError>;

/// Starts the listener on `watch` (the backend's, when it reports XIDs):
/// its thread and its task, until shutdown.
pub(super) fn spawn(daemon: &Arc<Daemon>, watch: Box<dyn XidWatch>) {
    let (to_task, mut waits) = mpsc::channel(1);
    let thread = std::thread::Builder::new()
        .name("xid".into())
        .spawn(move || watch_xids(watch, &to_task));
    if let Err(e) = thread {
        tracing::error!("cannot start the XID thread: {e}; XID events are not watched");
        return;
    }
    let daemon = daemon.clone();
    let mut stop = daemon.node.shutdown.subscribe();
    tokio::spawn(async move {
        let mut failing = false;
        loop {
            let got = tokio::select! {
                r = waits.recv() => r,
                _ = stop.changed() => break,
            };
            let Some(got) = got else {
                tracing::error!("the XID thread stopped; XID events are no longer watched");
                break;
            };
            let cx = daemon.cx();
            match got {
                Ok(Some(event)) => {
                    failing = false;
                    record(&cx, event).await;
                }
                Ok(None) => failing = false,
                Err(e) => {
                    if !failing {
                        tracing::error!(
                            "cannot wait for NVML XID events: {e}; retrying every {} s",
                            RETRY.as_secs()
                        );
                    }
                    failing = true;
                }
            }
            rebuild_idle(&cx).await;
        }
    });
}

/// The XID thread: owns `watch`, waits on it one [`WAIT`] at a time and
/// hands each outcome to the listener task (one at a time: the next wait
/// starts once the task took the last one), resting [`RETRY`] after a
/// failed wait. Ends when the task is gone (shutdown), dropping the watcher
/// and with it the event set.
fn watch_xids(mut watch: Box<dyn XidWatch>, to_task: &mpsc::Sender<Waited>) {
    loop {
        let got = watch.next(WAIT);
        let failed = got.is_err();
        if to_task.blocking_send(got).is_err() {
            return;
        }
        if failed {
            std::thread::sleep(RETRY);
        }
    }
}

/// Books one XID on its GPU, logs it with the jobs it hits, counts it, and
/// drains the node after a GPU-fatal one.
pub(super) async fn record(cx: &Cx<'_>, event: XidEvent) {
    let Some(gpu) = cx.books.gpus.get(event.gpu as usize) else {
        tracing::warn!(
            gpu = event.gpu,
            xid = event.xid,
            "XID on a GPU smartmigd does not manage; ignored"
        );
        return;
    };
    let mut st = gpu.tx().await;
    let hit = event
        .gpu_instance
        .and_then(|gi| st.book.find_gpu_instance(gi))
        .map(|i| (i.uuid.clone(), i.job.as_ref().map(|a| a.job_id)));
    let uuid = hit.as_ref().map(|(u, _)| u.as_str());
    let verdict = st.book.health.record(event.xid, uuid, unix_now());
    let class = match &verdict {
        Verdict::GpuFatal => "gpu_fatal",
        Verdict::Instance { .. } => "instance",
        Verdict::Counted => "counted",
    };
    cx.svc.metrics.xid(event.gpu, event.xid, class);
    let (gi, xid, n) = (event.gpu_instance, event.xid, event.gpu);
    match verdict {
        Verdict::GpuFatal => tracing::warn!(gpu = n, xid, jobs = ?st.book.holders(),
            "GPU-fatal XID: no job is placed on this GPU any more and the node is drained; the jobs on it are likely lost"),
        Verdict::Instance { uuid } => {
            let job = hit.and_then(|(_, j)| j);
            tracing::warn!(gpu = n, xid, gpu_instance = ?gi, instance = %uuid, job = ?job,
                "XID on a MIG instance: marked unhealthy, no job is placed on it, rebuilt once idle");
        }
        Verdict::Counted => {
            let job = hit.and_then(|(_, j)| j);
            let why = if crate::health::classify(xid, true) == Severity::Counted && gi.is_some() {
                "an application error (NVIDIA's XID catalogue): counted, the instance stays in service"
            } else {
                "not attributed to a known instance and not GPU-fatal: counted"
            };
            tracing::warn!(gpu = n, xid, gpu_instance = ?gi, job = ?job, "XID: {why}");
        }
    }
    let fatal = !st.book.health.usable();
    drop(st);
    // Waiting allocates look again (and fail on a GPU out of service).
    gpu.released.notify_waiters();
    if fatal && cx.cfg().slurm.enabled {
        if let Some(info) = queue::node(cx).await {
            settle_node(cx, &info).await;
        }
    }
}

/// Destroys and re-creates, at the same placement, every idle instance an
/// XID marked: the new instance is healthy.
async fn rebuild_idle(cx: &Cx<'_>) {
    for gpu in &cx.books.gpus {
        let mut st = gpu.tx().await;
        if !st.book.health.usable() {
            continue;
        }
        for (uuid, placement) in st.book.rebuild_due() {
            let why = " (unhealthy after an XID: rebuilt)";
            if let Err(e) = instances::destroy_idle(cx.svc, gpu.index, &mut st.book, &uuid, why) {
                instances::resync(cx.svc, gpu.index, &mut st.book, &e);
                continue;
            }
            match instances::create(cx.svc, gpu.index, &mut st.book, placement, unix_now()) {
                Ok(new) => tracing::info!(gpu = gpu.index, old = %uuid, instance = %new,
                    "unhealthy instance rebuilt"),
                Err(e) => {
                    instances::resync(cx.svc, gpu.index, &mut st.book, &e);
                }
            }
        }
        drop(st);
        gpu.released.notify_waiters();
    }
}

/// The GPUs out of service, as (GPU, XID).
async fn fatal_gpus(cx: &Cx<'_>) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    for gpu in &cx.books.gpus {
        if let Some(m) = gpu.tx().await.book.health.fatal {
            out.push((gpu.index, m.xid));
        }
    }
    out
}

/// Brings Slurm's drain and the GPUs' fatal marks in line
/// ([`node_action`]); returns whether no GPU is out of service now (then
/// a `smartmig:` drain may be resumed).
pub(super) async fn settle_node(cx: &Cx<'_>, info: &NodeInfo) -> bool {
    let fatal = fatal_gpus(cx).await;
    let drained = &cx.books.health_drained;
    let action = node_action(
        &fatal,
        info.drain,
        &info.reason,
        drained.load(Ordering::SeqCst),
    );
    let node = cx.node.name.clone();
    match action {
        NodeAction::Nothing => {}
        NodeAction::Drain { reason } => {
            let slurm = cx.live.slurm.clone();
            let (n, r) = (node.clone(), reason.clone());
            match tokio::task::spawn_blocking(move || slurm.drain(&n, &r)).await {
                Ok(Ok(())) => {
                    drained.store(true, Ordering::SeqCst);
                    tracing::warn!(node = %node, %reason, "node drained");
                }
                Ok(Err(e)) => tracing::error!(node = %node, %reason, "cannot drain the node: {e}"),
                Err(e) => tracing::error!("node drain task failed: {e}"),
            }
        }
        NodeAction::ClearMarks => {
            // The node info may be the cluster summary's (older than our
            // drain): only Slurm's own answer counts as a resume.
            let slurm = cx.live.slurm.clone();
            let n = node.clone();
            match tokio::task::spawn_blocking(move || slurm.node(&n)).await {
                Ok(Ok(fresh)) if !fresh.drain => {}
                _ => return false,
            }
            for gpu in &cx.books.gpus {
                if let Some(xid) = gpu.tx().await.book.health.clear() {
                    tracing::warn!(gpu = gpu.index, xid, node = %node,
                        "the node was resumed in Slurm: the GPU is back in service");
                }
            }
            drained.store(false, Ordering::SeqCst);
            return true;
        }
        NodeAction::Adopt { gpu, xid } => {
            if let Some(g) = cx.books.gpus.get(gpu as usize) {
                let mut st = g.tx().await;
                st.book.health.record(xid, None, unix_now());
                drained.store(true, Ordering::SeqCst);
                tracing::warn!(gpu, xid, node = %node, reason = %info.reason,
                    "the node is drained for this GPU's XID: the GPU stays out of service until an admin resumes the node");
            }
            return false;
        }
    }
    fatal.is_empty()
}

/// The plugin drains the node when it cannot reach smartmigd; this daemon
/// is up and serving, so it undoes such a drain (and only such a drain:
/// an admin's reason is left alone). A drain for a GPU-fatal XID stays
/// while a GPU is out of service ([`settle_node`]).
pub(super) async fn resume_if_drained_by_us(cx: &Cx<'_>, info: &NodeInfo) {
    if !settle_node(cx, info).await || !info.drained_by_smartmig() {
        return;
    }
    cx.books
        .health_drained
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let slurm = cx.live.slurm.clone();
    let node = cx.node.name.clone();
    match tokio::task::spawn_blocking(move || slurm.resume(&node)).await {
        Ok(Ok(())) => tracing::warn!(node = %cx.node.name, reason = %info.reason,
            "node was drained by smartmig; smartmigd is serving again: node resumed"),
        Ok(Err(e)) => tracing::warn!(node = %cx.node.name, "cannot resume the node: {e}"),
        Err(e) => tracing::error!("node resume task failed: {e}"),
    }
}
