//! `apply` (`smartmig apply ID`, root or `slurm_user`): carries out a
//! pending plan if its GPU is still where the plan started and it destroys
//! no busy instance.

use super::super::context::{unix_now, Cx};
use super::super::instances;
use crate::config::Mode;
use crate::protocol::{ErrorBody, ErrorKind, PlanStatus};

pub(super) async fn serve(cx: &Cx<'_>, id: u64) -> Result<PlanStatus, ErrorBody> {
    let now = unix_now();
    if cx.cfg().mode == Mode::Advise {
        return Err(ErrorBody::new(
            ErrorKind::InvalidRequest,
            "advise mode carries out nothing: its wishes are in `smartmig status` and the advice log",
        ));
    }
    let plan = cx.books.node(|l| {
        l.plans
            .take(id, now)
            .map_err(|e| ErrorBody::new(ErrorKind::InvalidRequest, e.to_string()))
    })?;
    let refuse = |m: String| Err(ErrorBody::new(ErrorKind::InvalidRequest, m));
    let Some(gpu) = cx.books.gpu(plan.shown.gpu) else {
        return refuse(format!("plan {id}: no GPU {}", plan.shown.gpu));
    };
    let mut st = gpu.tx().await;
    let current = st.book.layout();
    if current != plan.from {
        return refuse(format!(
            "plan {id} was made for GPU {} at {}, which is now {}: not applied; the next epoch proposes a new plan",
            gpu.index,
            plan.shown.from,
            st.book.geometry.picture(current)
        ));
    }
    if !instances::apply_target(cx, gpu, &mut st, plan.to, "apply") {
        return refuse(format!(
            "plan {id} would now destroy a busy instance on GPU {} (or a create failed, see the log): not applied",
            gpu.index
        ));
    }
    drop(st);
    tracing::info!(plan = id, gpu = plan.shown.gpu, from = %plan.shown.from, to = %plan.shown.to, "plan applied");
    cx.books.node(|ledger| {
        cx.svc.metrics.pending_plans(ledger.plans.pending_count());
        Ok(ledger.plans.record_applied(plan.shown, now))
    })
}
