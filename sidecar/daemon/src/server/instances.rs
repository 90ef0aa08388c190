//! Changing one GPU's instances, under its lock: create, destroy an idle
//! one, move the GPU to a target layout (never destroying a busy
//! instance), and bring the books back in line with the backend after a
//! failed call. Shared by the allocate and apply handlers and the epoch.

use super::books::{Gpu, GpuState};
use super::context::{unix_now, Cx};
use super::services::Services;
use crate::allocate::GpuBook;
use crate::backend::{Backend, BackendError};
use crate::mig::{Layout, SpotId};
use crate::protocol::{ErrorBody, ErrorKind};

/// Creates the instance at `placement` and books it (idle); returns its
/// uuid. On failure the book is unchanged: call [`resync`].
pub(super) fn create(
    svc: &Services,
    gpu: u32,
    book: &mut GpuBook,
    placement: SpotId,
    now: u64,
) -> Result<String, BackendError> {
    let backend = &svc.backend;
    let t0 = std::time::Instant::now();
    let uuid = tokio::task::block_in_place(|| backend.create(gpu, placement))?;
    svc.metrics
        .reconfiguration(gpu, "create", t0.elapsed().as_secs_f64());
    tracing::info!(gpu, %uuid, instance = %book.geometry.spot(placement).describe(), "created instance");
    adopt(svc.backend.as_ref(), book, placement, uuid.clone(), now);
    Ok(uuid)
}

/// Books an instance the backend has (idle) with the GPU-instance id the
/// backend gives it.
pub(super) fn adopt(
    backend: &dyn Backend,
    book: &mut GpuBook,
    placement: SpotId,
    uuid: String,
    now: u64,
) {
    let gi = tokio::task::block_in_place(|| backend.gpu_instance_id(book.index, &uuid));
    book.add_instance(placement, uuid.clone(), now);
    book.set_gpu_instance_id(&uuid, gi);
}

/// Destroys idle instance `uuid` (`why` ends the log line) and forgets
/// it. On failure the book is unchanged: call [`resync`].
pub(super) fn destroy_idle(
    svc: &Services,
    gpu: u32,
    book: &mut GpuBook,
    uuid: &str,
    why: &str,
) -> Result<(), BackendError> {
    let t0 = std::time::Instant::now();
    tokio::task::block_in_place(|| svc.backend.destroy(gpu, uuid))?;
    svc.metrics
        .reconfiguration(gpu, "destroy", t0.elapsed().as_secs_f64());
    tracing::info!(gpu, %uuid, "destroyed idle instance{why}");
    book.remove_instance(uuid);
    Ok(())
}

/// After a failed backend call the GPU's real state is uncertain (a
/// timed-out create may have happened): re-read the backend's instances
/// and make the book match them, so that the daemon converges instead of
/// planning against instances that do (not) exist. Busy instances the
/// backend no longer lists are kept (and logged): a job's assignment is
/// never dropped behind its back. Returns the error to answer.
pub(super) fn resync(svc: &Services, gpu: u32, book: &mut GpuBook, e: &BackendError) -> ErrorBody {
    tracing::warn!(
        gpu,
        "backend call failed: {e}; re-reading the GPU's instances"
    );
    match tokio::task::block_in_place(|| svc.backend.list(gpu)) {
        Ok(listed) => {
            let now = unix_now();
            let gone: Vec<String> = book
                .instances
                .iter()
                .filter(|i| !listed.iter().any(|l| l.uuid == i.uuid))
                .map(|i| i.uuid.clone())
                .collect();
            for uuid in gone {
                if book.find_uuid(&uuid).is_some_and(|i| i.job.is_none()) {
                    book.remove_instance(&uuid);
                    tracing::warn!(gpu, %uuid, "idle instance vanished from the backend; forgotten");
                } else {
                    tracing::error!(gpu, %uuid, "busy instance vanished from the backend; assignment kept");
                }
            }
            for l in listed {
                if book.find_uuid(&l.uuid).is_none() {
                    if book.geometry.fits(book.layout(), l.placement) {
                        tracing::warn!(gpu, uuid = %l.uuid, "backend has an instance the daemon did not know (e.g. a timed-out create); adopted as idle");
                        adopt(svc.backend.as_ref(), book, l.placement, l.uuid, now);
                    } else {
                        tracing::error!(gpu, uuid = %l.uuid, "backend instance overlaps known ones; ignored");
                    }
                }
            }
        }
        Err(le) => tracing::error!(gpu, "cannot re-read the GPU's instances: {le}"),
    }
    ErrorBody::new(ErrorKind::Backend, e.to_string())
}

/// Moves `gpu` towards `target`, destroying idle instances only (`why`:
/// what asked, for the log); a GPU out of service is not touched. A
/// target that would destroy a busy instance is refused (and logged).
/// Whether the GPU is now at `target`.
pub(super) fn apply_target(
    cx: &Cx<'_>,
    gpu: &Gpu,
    st: &mut GpuState,
    target: Layout,
    why: &str,
) -> bool {
    if let Some(mark) = st.book.health.fatal {
        // A GPU out of service after a fatal XID is left as it is until
        // it is reset (its instances may not even answer).
        tracing::info!(
            gpu = gpu.index,
            why,
            xid = mark.xid,
            "GPU out of service: no reconfiguration"
        );
        return false;
    }
    let g = st.book.geometry;
    let current = st.book.layout();
    if !g.is_valid(target) {
        tracing::warn!(gpu = gpu.index, why, "target layout is invalid; ignored");
        return false;
    }
    let t = g.transition(current, target);
    if t.is_noop() {
        return false;
    }
    if t.touches(st.book.busy()) {
        tracing::info!(gpu = gpu.index, why, from = %g.picture(current), to = %g.picture(target),
            "target would destroy a busy instance; deferred");
        return false;
    }
    tracing::info!(gpu = gpu.index, why, from = %g.picture(current), to = %g.picture(target), "repartitioning");
    let (svc, index, book) = (cx.svc, gpu.index, &mut st.book);
    let victims: Vec<String> = book
        .instances
        .iter()
        .filter(|i| t.destroy.contains(i.placement))
        .map(|i| i.uuid.clone())
        .collect();
    for uuid in victims {
        if let Err(e) = destroy_idle(svc, index, book, &uuid, "") {
            tracing::warn!(gpu = index, %uuid, "destroy failed: {e}");
            resync(svc, index, book, &e);
            return false;
        }
    }
    let now = unix_now();
    for id in t.create.iter() {
        if let Err(e) = create(svc, index, book, id, now) {
            tracing::warn!(gpu = index, "create {} failed: {e}", g.spot(id).describe());
            resync(svc, index, book, &e);
            return false;
        }
    }
    if let Err(e) = svc.isolate(cx.cfg(), book, None) {
        tracing::error!(gpu = index, "new instances not restricted to root: {e}");
    }
    gpu.released.notify_waiters();
    true
}
