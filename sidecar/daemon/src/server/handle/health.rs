//! `health`: is the daemon up, which version and backend.

use super::super::context::Cx;
use crate::protocol::HealthReply;

pub(super) fn serve(cx: &Cx<'_>) -> HealthReply {
    HealthReply {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        backend: cx.svc.backend.name().into(),
        uptime_s: cx.node.started.elapsed().as_secs(),
    }
}
