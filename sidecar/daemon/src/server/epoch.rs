//! The repartitioning epoch, every `epoch_s`, as named steps: read the
//! queue once and reap what ended jobs hold; (advise mode) observe the
//! site's own layout; show the policy the node; ask it; tidy the plans;
//! carry out or propose what it wants; score the pending plans; resume
//! and publish. A new step is one more function called from [`run_once`].

use super::context::{unix_now, unix_now_f64, Cx};
use super::view::{self, Ahead};
use super::{advise, holds, queue, reap, shadow, xid};
use crate::config::{Mode, SummaryFallback};
use crate::mig::Geometry;
use crate::policy::{self, ClusterView, Decision, PendingByProfile, PendingJob};

/// Installs the policy's initial layout on GPUs that have no instance at
/// all (a fresh boot). `none` leaves GPUs empty: instances are then made
/// on demand, which is what `none` means for a sidecar. Advise mode keeps
/// the site's layout; its first epoch records what the policy would
/// change.
pub(super) async fn install_initial_layouts(cx: &Cx<'_>) {
    let policy = cx.decider.policy.clone();
    if cx.cfg().mode == Mode::Advise || !policy.with(|p| p.installs_initial_layout()).await {
        return;
    }
    for gpu in &cx.books.gpus {
        let mut st = gpu.tx().await;
        if !st.book.instances.is_empty() {
            continue;
        }
        let geometry = st.book.geometry;
        let target = policy
            .with(|p| p.initial_layout(gpu.index as usize, geometry))
            .await;
        view::pursue(cx, gpu, &mut st, target, "initial layout", None);
    }
}

/// One repartitioning epoch: observe, ask the policy, apply what is safe.
/// `cx` is the epoch's snapshot of the settings: a SIGHUP during it takes
/// effect next epoch.
pub(super) async fn run_once(cx: &Cx<'_>) {
    steps(cx).await;
    cx.svc.metrics.epoch();
}

async fn steps(cx: &Cx<'_>) {
    let read = queue::read(cx).await;
    match &read {
        Some((q, t0)) => {
            let _ = reap::ended_jobs(cx, q, *t0).await;
            holds::adopt(cx, q).await;
            holds::sync(cx).await;
        }
        // No fresh summary and told not to ask Slurm: keep the layout.
        None if holding(cx) => return,
        None => {}
    }
    let advise = cx.cfg().mode == Mode::Advise;
    let occupied = if advise {
        Some(advise::observe(cx, read.as_ref().map(|(q, _)| q)).await)
    } else {
        None
    };
    let queue = read.map(|(q, _)| q).unwrap_or_default();
    let now = unix_now_f64();
    let statuses = view::gpu_statuses(cx, &queue, occupied.as_deref()).await;
    let (jobs, by_profile) = view::pending_jobs(&queue, advise, now);
    shadow::step(cx).await;
    let decisions = decide(cx, &statuses, &jobs, &by_profile, now).await;
    tidy_plans(cx).await;
    let mut ahead = view::lookahead_of(&statuses, &jobs, now);
    for d in decisions {
        pursue(cx, d, &mut ahead, occupied.as_deref()).await;
    }
    score_pending_plans(cx, &mut ahead);
    resume_and_publish(cx).await;
}

/// Whether the epoch holds the layout: no fresh summary, and
/// `cluster.fallback = "hold"` says not to ask Slurm instead.
fn holding(cx: &Cx<'_>) -> bool {
    let cfg = cx.cfg();
    cfg.slurm.enabled
        && cfg.cluster.fallback == SummaryFallback::Hold
        && cx.books.node(|l| l.view_source.problem.is_some())
}

/// Asks the policy for its targets. Advise mode, first epoch: the layout
/// the policy would have installed is its first wish (a static policy
/// never wishes again).
async fn decide(
    cx: &Cx<'_>,
    statuses: &[policy::GpuStatus],
    jobs: &[PendingJob],
    by_profile: &PendingByProfile,
    now: f64,
) -> Vec<Decision> {
    // What arrived since the previous epoch: the waiting jobs Slurm took
    // in during the last epoch period (a job that started at once on
    // another node's GPU is not seen here).
    let since = now - cx.cfg().epoch_s as f64;
    let arrivals: Vec<PendingJob> = jobs.iter().filter(|j| j.arrival > since).copied().collect();
    let view = ClusterView {
        now,
        hour_of_day: now.rem_euclid(86_400.0) / 3600.0,
        gpus: statuses,
        pending: jobs,
        pending_by_profile: by_profile,
        arrivals: &arrivals,
    };
    let mut decisions = ask(cx, &view).await;
    if cx.cfg().mode == Mode::Advise && advise::first_epoch(cx) {
        cx.decider
            .policy
            .with(|p| {
                if p.installs_initial_layout() {
                    for (k, gpu) in cx.books.gpus.iter().enumerate() {
                        if !decisions.iter().any(|d| d.gpu == k) {
                            let target = p.initial_layout(k, Geometry::of(gpu.model));
                            decisions.push(Decision { gpu: k, target });
                        }
                    }
                }
            })
            .await;
    }
    decisions
}

/// The decisions of the policy that runs: the configured one, or the
/// shadow's fallback once the shadow handed over. Both see every epoch (a
/// learned policy remembers the arrivals it saw), as in the simulator's
/// `Shadowed`.
async fn ask(cx: &Cx<'_>, view: &ClusterView<'_>) -> Vec<Decision> {
    let primary = cx.decider.policy.with(|p| p.decide(view)).await;
    let Some((fallback, _)) = &cx.decider.fallback else {
        return primary;
    };
    let other = fallback.with(|p| p.decide(view)).await;
    if cx.books.shadow.fallback_runs(cx.cfg()) {
        other
    } else {
        primary
    }
}

/// Plans that lapsed are dropped; a plan made for a layout the GPU no
/// longer has (jobs were served on demand meanwhile), or that would now
/// destroy a busy instance, is withdrawn; the policy proposes anew when it
/// still wants to.
async fn tidy_plans(cx: &Cx<'_>) {
    let lapsed = cx.books.node(|l| l.plans.expire(unix_now()));
    for p in lapsed {
        tracing::info!(plan = p.shown.id, gpu = p.shown.gpu, from = %p.shown.from, to = %p.shown.to,
            "plan lapsed: not applied within plan_timeout_s");
    }
    for gpu in &cx.books.gpus {
        let st = gpu.tx().await;
        let stale = cx.books.node(|l| {
            l.plans.withdraw_if(gpu.index, |p| {
                p.from != st.book.layout() || view::plan_status(gpu, &st, p.to).is_none()
            })
        });
        if let Some(p) = stale {
            tracing::info!(plan = p.shown.id, gpu = gpu.index, from = %p.shown.from, to = %p.shown.to,
                "plan withdrawn: the GPU changed since (jobs served on demand)");
        }
    }
}

/// One decision of the policy: carried out (dynamic), proposed (confirm)
/// or recorded as a wish (advise, where `occupied` holds the watched
/// jobs' instances).
async fn pursue(cx: &Cx<'_>, d: Decision, ahead: &mut Ahead, occupied: Option<&[view::Occupied]>) {
    let Some(gpu) = cx.books.gpus.get(d.gpu) else {
        tracing::warn!(gpu = d.gpu, "policy decided for a GPU that does not exist");
        return;
    };
    let mut st = gpu.tx().await;
    // The expected effect of a reshape carried out now (dynamic) or
    // recorded (advise); pending plans (confirm) get theirs below, once
    // per epoch.
    let effect =
        if cx.cfg().mode != Mode::Confirm && view::plan_status(gpu, &st, d.target).is_some() {
            view::expected_effect(ahead, d.gpu, d.target)
        } else {
            None
        };
    match occupied.and_then(|o| o.get(d.gpu)) {
        Some(o) => advise::advise(cx, gpu, &st, d.target, o.busy, effect),
        None => view::pursue(cx, gpu, &mut st, d.target, "policy", effect),
    }
}

/// Every pending plan's expected effect follows this epoch's queue (also
/// those made before any queue was read: the initial layout).
fn score_pending_plans(cx: &Cx<'_>, ahead: &mut Ahead) {
    let targets = cx.books.node(|l| l.plans.pending_targets());
    for (gpu, to) in targets {
        let effect = view::expected_effect(ahead, gpu as usize, to);
        cx.books.node(|l| l.plans.set_effect(gpu, effect));
    }
    let pending = cx.books.node(|l| l.plans.pending_count());
    cx.svc.metrics.pending_plans(pending);
}

/// A node the plugin drained is resumed, and the layout published as node
/// features (`publish_layout`). Without Slurm queries there is nowhere to
/// publish to, nothing to resume.
async fn resume_and_publish(cx: &Cx<'_>) {
    let cfg = cx.cfg();
    if !cfg.slurm.enabled {
        return;
    }
    if let Some(info) = queue::node(cx).await {
        xid::resume_if_drained_by_us(cx, &info).await;
        if cfg.publish_layout && cfg.mode != Mode::Advise {
            view::publish_layout(cx, &info.features).await;
        }
    }
}
