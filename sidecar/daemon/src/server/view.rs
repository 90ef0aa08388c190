//! The policy's view of the node and what comes of it: the GPUs (busy
//! instances with Slurm's end times) and pending shard jobs (time limits,
//! deadlines) an epoch shows the policy, the short simulation that scores
//! a plan, how a reshape is shown, pursuing a target (carried out in
//! dynamic mode, a plan in confirm mode) and publishing the layout as node
//! features. The epoch's steps are in [`super::epoch`].

use super::context::{unix_now, Cx};
use super::instances;
use crate::slurm::NodeFeatures;
use smartmig_core::sim::lookahead::{Lookahead, NodeNow, Running, Waiting};

use super::books::{Gpu, GpuState};
use crate::allocate::Assignment;
use crate::config::Mode;
use crate::mig::{Geometry, GpuModel, Layout};
use crate::policy::{self, PendingByProfile, PendingJob, MAX_PLACEMENTS, MODEL_COUNT};
use crate::protocol::{PlanEffect, PlanStatus};
use crate::slurm::{layout_features, merge_features, JobState, QueueSnapshot};
use crate::workload::SpeedupCurve;

/// Per GPU, the instances the watched jobs occupy and until when (advise
/// mode's observation, [`super::advise::observe`]).
pub(super) struct Occupied {
    pub busy: Layout,
    pub until: [f64; MAX_PLACEMENTS],
}

/// When a running job's instance frees up, as Unix seconds: Slurm's
/// `end_time` (start + time limit) when the queue lists the job, else the
/// allocation's own time limit, else never (`INFINITY`).
pub(super) fn expected_end(a: &Assignment, queued: Option<&crate::slurm::QueuedJob>) -> f64 {
    if let Some(j) = queued {
        if j.state == JobState::Running && j.end_time > 0 && j.time_limit_s.is_some() {
            return j.end_time as f64;
        }
    }
    let limit = a.time_limit_s.map_or(f64::INFINITY, |t| t as f64);
    a.since as f64 + limit
}

/// The look-ahead an epoch scores its plans with ([`lookahead_of`]).
pub(super) type Ahead = Lookahead;

/// This epoch's short simulation of the node's queue
/// ([`smartmig_core::sim::lookahead`]), built once for every plan it
/// scores: the node's GPUs as the policy saw them this epoch, its running
/// jobs until their end times (at most a day), its waiting jobs.
pub(super) fn lookahead_of(
    statuses: &[policy::GpuStatus],
    pending: &[PendingJob],
    now: f64,
) -> Lookahead {
    const DAY_S: f64 = 86_400.0;
    let running = statuses
        .iter()
        .flat_map(|s| {
            s.busy.iter().map(move |p| {
                let pl = s.geometry.spot(p);
                Running {
                    compute: pl.compute(),
                    memory_gb: f64::from(pl.profile.memory_gb),
                    remaining_s: s.remaining(p, now).min(DAY_S),
                }
            })
        })
        .collect();
    let waiting = pending
        .iter()
        .map(|p| Waiting {
            compute: p.min_compute.max(1),
            memory_gb: p.memory_gb,
            work_s: p.work.min(DAY_S),
            deadline_in_s: p.deadline.is_finite().then(|| (p.deadline - now).max(0.0)),
            waited_s: (now - p.arrival).max(0.0),
        })
        .collect();
    Lookahead::new(NodeNow {
        models: statuses.iter().map(|s| s.model).collect(),
        layouts: statuses.iter().map(|s| s.layout).collect(),
        running,
        waiting,
        speedup: SpeedupCurve::default(),
    })
}

/// What the look-ahead expects of setting GPU `gpu` to `target`, as plans
/// show it. `None` when nothing waits or the simulation fails (logged).
pub(super) fn expected_effect(
    ahead: &mut Lookahead,
    gpu: usize,
    target: Layout,
) -> Option<PlanEffect> {
    let e = match ahead.effect(gpu, target) {
        Ok(e) => e?,
        Err(err) => {
            tracing::warn!(gpu, "plan look-ahead failed: {err}");
            return None;
        }
    };
    let kj = |j: f64| (j / 1000.0).round() as u64;
    Some(PlanEffect {
        waiting: e.waiting as u32,
        running: e.running as u32,
        wait_keep_s: e.keep.mean_wait_s.round() as u64,
        wait_plan_s: e.plan.mean_wait_s.round() as u64,
        energy_keep_kj: kj(e.keep.energy_j),
        energy_plan_kj: kj(e.plan.energy_j),
        late_keep: e.keep.late as u32,
        late_plan: e.plan.late as u32,
        unfit_keep: e.keep.unserved as u32,
        unfit_plan: e.plan.unserved as u32,
    })
}

/// How `gpu` would go to `target`, for `smartmig plan`: `None` when
/// there is nothing to do, the target is invalid or it would destroy a
/// busy instance (which is never done).
pub(super) fn plan_status(gpu: &Gpu, st: &GpuState, target: Layout) -> Option<PlanStatus> {
    let g = st.book.geometry;
    let keeps_busy = st
        .book
        .instances
        .iter()
        .filter_map(|i| {
            let job = i.job.as_ref()?.job_id;
            Some(format!("{} (job {job})", g.spot(i.placement).describe()))
        })
        .collect();
    reshape_shown(
        gpu.index,
        g,
        st.book.layout(),
        target,
        st.book.busy(),
        keeps_busy,
    )
}

/// How GPU `gpu` would go from `current` to `target` keeping the `busy`
/// instances (described in `keeps_busy`), as plans and advice show it:
/// `None` when there is nothing to do, the target is invalid or it would
/// destroy a busy instance (which is never done).
pub(super) fn reshape_shown(
    gpu: u32,
    g: &Geometry,
    current: Layout,
    target: Layout,
    busy: Layout,
    keeps_busy: Vec<String>,
) -> Option<PlanStatus> {
    if !g.is_valid(target) {
        return None;
    }
    let t = g.transition(current, target);
    if t.is_noop() || t.touches(busy) {
        return None;
    }
    let names = |l: Layout| g.describe(l).iter().map(ToString::to_string).collect();
    Some(PlanStatus {
        id: 0,
        gpu,
        from: g.picture(current),
        to: g.picture(target),
        destroy: names(t.destroy),
        create: names(t.create),
        keeps_busy,
        created_at: 0,
        expires_at: None,
        applied_at: None,
        effect: None,
    })
}

/// The policy's view of each GPU this epoch: its layout, busy instances
/// and when they free up (advise mode: the instances the watched jobs
/// occupy). Also re-asserts who may open each instance (a driver tool or
/// an admin may have reset a mode since).
pub(super) async fn gpu_statuses(
    cx: &Cx<'_>,
    queue: &QueueSnapshot,
    occupied: Option<&[Occupied]>,
) -> Vec<policy::GpuStatus> {
    let mut statuses = Vec::new();
    for (k, gpu) in cx.books.gpus.iter().enumerate() {
        let st = gpu.tx().await;
        if let Err(e) = cx.svc.isolate(cx.cfg(), &st.book, None) {
            tracing::error!(gpu = gpu.index, "device isolation: {e}");
        }
        let mut s = policy::GpuStatus::new(gpu.model, st.book.layout());
        s.busy = st.book.busy();
        let mut until = [0.0; MAX_PLACEMENTS];
        for i in &st.book.instances {
            if let Some(a) = &i.job {
                until[i.placement.0 as usize] = expected_end(a, queue.job(a.job_id));
            }
        }
        s.busy_until = until;
        if let Some(o) = occupied.and_then(|o| o.get(k)) {
            s.busy = o.busy;
            s.busy_until = o.until;
        }
        statuses.push(s);
    }
    statuses
}

/// The pending shard jobs as the policy sees them (advise mode: typed
/// requests, `gpu:3g.20gb:1`, too, as demand for that profile's compute
/// and memory), with the count per profile of each GPU model.
pub(super) fn pending_jobs(
    queue: &QueueSnapshot,
    advise: bool,
    now: f64,
) -> (Vec<PendingJob>, PendingByProfile) {
    let mut by_profile = PendingByProfile::default();
    let typed = queue.pending_typed().filter(|_| advise).filter_map(|p| {
        let (compute, memory) = crate::mig::profile_size(p.mig_profile.as_deref()?)?;
        Some((p, compute, Some(f64::from(memory))))
    });
    let jobs = queue
        .pending_shards()
        .map(|p| (p, p.shards, None))
        .chain(typed)
        .map(|(p, shards, memory)| {
            let mut shapes = [None; MODEL_COUNT];
            for m in GpuModel::ALL {
                if let Ok(prof) = crate::mig::select_profile(m.spec(), shards, memory) {
                    shapes[m as usize] = Some(prof.shape);
                    if let Some(ix) = m.spec().profiles.iter().position(|q| q.shape == prof.shape) {
                        by_profile[m as usize][ix] += 1;
                    }
                }
            }
            let speedup = SpeedupCurve::default();
            PendingJob {
                id: p.job_id,
                arrival: if p.submit_time > 0 {
                    p.submit_time as f64
                } else {
                    now
                },
                deadline: p.deadline.map_or(f64::INFINITY, |d| d as f64),
                work: crate::placement::pending_work(p.time_limit_s, shards, &speedup),
                memory_gb: memory.unwrap_or(0.0),
                min_compute: shards,
                speedup,
                shapes,
            }
        })
        .collect();
    (jobs, by_profile)
}

/// The policy wants `gpu` at `target` (`why`: the initial layout or an
/// epoch's decision): carried out and recorded as applied (`mode =
/// "dynamic"`), or kept as a pending plan (`"confirm"`).
pub(super) fn pursue(
    cx: &Cx<'_>,
    gpu: &Gpu,
    st: &mut GpuState,
    target: Layout,
    why: &str,
    effect: Option<PlanEffect>,
) {
    match cx.cfg().mode {
        Mode::Dynamic => {
            let shown = plan_status(gpu, st, target);
            if instances::apply_target(cx, gpu, st, target, why) {
                if let Some(mut shown) = shown {
                    shown.effect = effect;
                    cx.books.node(|l| l.plans.record_applied(shown, unix_now()));
                }
            }
        }
        // A pending plan's effect is refreshed with the others' each epoch.
        Mode::Confirm => propose(cx, gpu, st, target),
        // Advise mode records wishes (`advise`) and never pursues them.
        Mode::Advise => {}
    }
}

/// `mode = "confirm"`: the policy wants `gpu` at `target`; keep (or
/// replace) the GPU's pending plan, or withdraw it when there is nothing
/// to do any more.
fn propose(cx: &Cx<'_>, gpu: &Gpu, st: &GpuState, target: Layout) {
    let timeout_s = cx.cfg().plan_timeout_s;
    let Some(shown) = plan_status(gpu, st, target) else {
        if let Some(p) = cx.books.node(|l| l.plans.withdraw(gpu.index)) {
            tracing::info!(
                plan = p.shown.id,
                gpu = gpu.index,
                "plan withdrawn: the policy wants something else, or it is no longer safe"
            );
        }
        return;
    };
    let (from, to) = (shown.from.clone(), shown.to.clone());
    let (id, new) = cx.books.node(|l| {
        l.plans.propose(
            gpu.index,
            st.book.layout(),
            target,
            shown,
            unix_now(),
            timeout_s,
        )
    });
    if new {
        tracing::info!(plan = id, gpu = gpu.index, %from, %to,
            "plan waits for `smartmig apply {id}` (mode = confirm; lapses after {timeout_s} s)");
    }
}

/// Publishes each GPU's compute sizes as node features, keeping the
/// admin's. `current`: the node's features as this epoch's `sinfo` read
/// them.
pub(super) async fn publish_layout(cx: &Cx<'_>, current: &NodeFeatures) {
    let mut layouts = Vec::new();
    for gpu in &cx.books.gpus {
        let st = gpu.tx().await;
        let g = st.book.geometry;
        let mut sizes: Vec<u8> = st
            .book
            .layout()
            .iter()
            .map(|id| g.spot(id).compute())
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        layouts.push((gpu.index, sizes));
    }
    let ours = layout_features(&layouts);
    let slurm = cx.live.slurm.clone();
    let node = cx.node.name.clone();
    let result = tokio::task::block_in_place(|| {
        let merged = merge_features(current, &ours);
        if merged != *current {
            slurm.set_node_features(&node, &merged)?;
            tracing::info!(node = %node, features = %merged.available.join(","), "published layout as node features");
        }
        Ok::<_, crate::slurm::SlurmError>(())
    });
    if let Err(e) = result {
        tracing::warn!("cannot publish the layout to Slurm: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::QueuedJob;

    fn queued(state: JobState, end_time: u64, limit: Option<u64>) -> QueuedJob {
        QueuedJob {
            shards: 3,
            gpu: Some(0),
            nodes: "n1".into(),
            time_limit_s: limit,
            start_time: 100,
            end_time,
            submit_time: 50,
            ..QueuedJob::new(1, state)
        }
    }

    /// A running instance frees up at Slurm's end time (start + time
    /// limit); without it, at the allocation's own limit; else never.
    /// Before, every instance looked as if it never ended.
    #[test]
    fn running_jobs_end_when_slurm_says() {
        let a = Assignment {
            job_id: 1,
            step: None,
            uid: 0,
            since: 100,
            deadline: None,
            time_limit_s: None,
            wait_s: 0,
            billed: None,
        };
        let running = queued(JobState::Running, 700, Some(600));
        assert_eq!(expected_end(&a, Some(&running)), 700.0);
        let unlimited = queued(JobState::Running, 0, None);
        assert_eq!(expected_end(&a, Some(&unlimited)), f64::INFINITY);
        assert_eq!(expected_end(&a, None), f64::INFINITY);
        let own = Assignment {
            time_limit_s: Some(60),
            ..a
        };
        assert_eq!(expected_end(&own, None), 160.0);
    }
}
