//! `reconcile` (`smartmig reconcile`): read the queue now and release what
//! ended jobs still hold, as the epoch's reaper does.

use super::super::context::Cx;
use super::super::{queue, reap};
use crate::protocol::{ErrorBody, ErrorKind, ReconcileReply};

pub(super) async fn serve(cx: &Cx<'_>) -> Result<ReconcileReply, ErrorBody> {
    if !cx.cfg().slurm.enabled {
        return Err(ErrorBody::new(
            ErrorKind::InvalidRequest,
            "Slurm queries are disabled (slurm.enabled = false): nothing to reconcile with; \
             release a job's instance with `smartmig release JOBID`",
        ));
    }
    let Some((queue, t0)) = queue::read(cx).await else {
        return Err(ErrorBody::new(
            ErrorKind::Backend,
            "cannot read the Slurm queue (see smartmigd's log); nothing released",
        ));
    };
    let mut released_jobs = reap::ended_jobs(cx, &queue, t0).await;
    released_jobs.sort_unstable();
    tracing::info!(?released_jobs, "reconciled with Slurm's queue on request");
    Ok(ReconcileReply { released_jobs })
}
