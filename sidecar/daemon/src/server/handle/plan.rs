//! `plan` (`smartmig plan`, anyone): the mode, the pending and the applied
//! plans; the jobs a plan keeps are named only to those who see every job.

use super::super::context::Cx;
use super::super::redact;
use crate::protocol::PlanReply;

pub(super) fn serve(cx: &Cx<'_>, peer: u32) -> PlanReply {
    let cfg = cx.cfg();
    let mut reply = {
        cx.books.node(|ledger| PlanReply {
            mode: cfg.mode.as_str().into(),
            policy: cx.decider.policy_name.clone(),
            plan_timeout_s: cfg.plan_timeout_s,
            pending: ledger.plans.pending(),
            applied: ledger.plans.applied(),
        })
    };
    if !cx.live.roles.sees_everything(peer) {
        redact::redact_plans(&mut reply.pending);
        redact::redact_plans(&mut reply.applied);
    }
    reply
}
