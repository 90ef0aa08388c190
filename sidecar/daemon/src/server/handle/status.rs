//! `status` (anyone): the node's GPUs, instances, waiting allocates,
//! memory estimates, plans and cluster view, redacted for callers who may
//! not see every job ([`super::super::redact`]).

use std::collections::HashMap;

use super::super::auth::user_name;
use super::super::books::Gpu;
use super::super::context::{unix_now, Cx};
use super::super::{advise, queue, redact};
use crate::protocol::{GpuHealthStatus, GpuStatus, InstanceStatus, MemoryStatus, StatusReply};

pub(super) async fn serve(cx: &Cx<'_>, peer: u32) -> StatusReply {
    let mut reply = status(cx).await;
    redact::for_viewer(&mut reply, peer, &cx.live.roles, || {
        tokio::task::block_in_place(|| user_name(peer))
    });
    reply
}

/// The whole status reply, as root sees it.
async fn status(cx: &Cx<'_>) -> StatusReply {
    let now = unix_now();
    // Cloned so that no GPU lock is taken under the ledger's.
    let array_names = cx.books.node(|l| l.array_names.clone());
    let mut gpus = Vec::new();
    for gpu in &cx.books.gpus {
        gpus.push(gpu_status(cx, gpu, now, &array_names).await);
    }
    let cfg = cx.cfg();
    let memory = memory_status(cx);
    let placement = cx.decider.placement_name();
    let fallback = cx.decider.fallback.as_ref().map_or_else(
        || cfg.shadow.fallback_spec().to_string(),
        |(_, name)| name.clone(),
    );
    let holds = super::super::holds::decision(cx);
    cx.books.node(|ledger| StatusReply {
        node: cx.node.name.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        backend: cx.svc.backend.name().into(),
        policy: cx.decider.policy_name.clone(),
        placement: Some(placement),
        uptime_s: cx.node.started.elapsed().as_secs(),
        epochs: cx.svc.metrics.epochs(),
        gpus,
        memory: Some(memory),
        epilog_missing: ledger.releases.epilog_missing(),
        waiting: ledger.waiting_jobs(),
        pending_plans: ledger.plans.pending(),
        advise: advise::status(&ledger.advise, cfg),
        cluster: Some(queue::cluster_status(&ledger.view_source, cfg)),
        shadow: Some(
            cx.books
                .shadow
                .status(cfg, &cx.decider.policy_name, &fallback),
        ),
        gpu_order: ledger.gpu_order.status(),
        holds: Some(crate::protocol::HoldsStatus {
            configured: cfg.slurm.holds.name().into(),
            state: holds.state().into(),
            reason: holds.reason,
        }),
    })
}

/// One GPU's layout, instances, idle time and energy.
async fn gpu_status(
    cx: &Cx<'_>,
    gpu: &Gpu,
    now: u64,
    array_names: &HashMap<u64, String>,
) -> GpuStatus {
    let isolate = cx.cfg().isolate_devices;
    let mut st = gpu.tx().await;
    let modelled = st.tick_energy();
    let b = &st.book;
    let g = b.geometry;
    let layout = b.layout();
    let busy_any = !b.busy().is_empty();
    let instances = b
        .instances
        .iter()
        .map(|i| {
            let p = g.spot(i.placement);
            InstanceStatus {
                uuid: i.uuid.clone(),
                profile: p.profile.name(),
                start: p.start,
                compute: p.compute(),
                job_id: i.job.as_ref().map(|a| a.job_id),
                slurm_id: i
                    .job
                    .as_ref()
                    .and_then(|a| array_names.get(&a.job_id).cloned()),
                uid: i.job.as_ref().map(|a| a.uid),
                busy_since: i.job.as_ref().map(|a| a.since),
                idle_s: i.job.is_none().then(|| now.saturating_sub(i.idle_since)),
                access_files: if isolate {
                    cx.svc
                        .backend
                        .access_files(gpu.index, &i.uuid)
                        .unwrap_or_default()
                        .iter()
                        .map(|f| f.display().to_string())
                        .collect()
                } else {
                    Vec::new()
                },
                unhealthy_xid: b.health.instances.get(&i.uuid).map(|m| m.xid),
            }
        })
        .collect();
    GpuStatus {
        index: gpu.index,
        model: gpu.model,
        picture: g.picture(layout),
        layout: g.name(layout),
        instances,
        idle_s: if busy_any {
            0
        } else {
            now.saturating_sub(b.idle_since)
        },
        energy_j: Some(cx.svc.backend.energy_j(gpu.index).unwrap_or(modelled)),
        others_busy: Default::default(),
        health: (b.health.fatal.is_some() || b.health.total() > 0).then(|| GpuHealthStatus {
            fatal_xid: b.health.fatal.map(|m| m.xid),
            xids: b.health.counts.clone(),
        }),
    }
}

/// The memory section: estimates, out-of-memory decisions, the settings
/// that govern them and the plugin's `oom_requeue`.
fn memory_status(cx: &Cx<'_>) -> MemoryStatus {
    let cfg = cx.cfg();
    let mut memory = cx.books.memory(|m| {
        m.status(
            cfg.memory.estimate,
            cfg.oom.requeue,
            cfg.oom.max_retries,
            cfg.oom.early_restart.then_some(&cfg.oom.early),
        )
    });
    memory.plugin_oom_requeue = cx.books.node(|l| l.plugin_oom_requeue);
    memory
}
