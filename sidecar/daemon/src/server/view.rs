//! The policy's view of the node and what comes of it: each epoch builds a
//! `ClusterView` (busy instances with Slurm's end times, pending shard jobs
//! with time limits and deadlines), asks the policy, applies the targets
//! that destroy no busy instance, and publishes the layout as node
//! features.

use super::*;
use crate::slurm::NodeFeatures;
use smartmig_core::eval::lookahead::{Lookahead, NodeNow, Running, Waiting};

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

/// This epoch's short simulation of the node's queue
/// ([`smartmig_core::eval::lookahead`]), built once for every plan it
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
                let pl = s.geometry.placement(p);
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

/// How `slot` would go to `target`, for `smartmig plan`: `None` when
/// there is nothing to do, the target is invalid or it would destroy a
/// busy instance (which is never done).
pub(super) fn plan_status(slot: &GpuSlot, st: &GpuState, target: Layout) -> Option<PlanStatus> {
    let g = st.book.geometry;
    let keeps_busy = st
        .book
        .instances
        .iter()
        .filter_map(|i| {
            let job = i.job.as_ref()?.job_id;
            Some(format!(
                "{} (job {job})",
                g.placement(i.placement).describe()
            ))
        })
        .collect();
    reshape_shown(
        slot.index,
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

impl Daemon {
    /// The policy wants `slot` at `target` (`why`: the initial layout or an
    /// epoch's decision): carried out and recorded as applied (`mode =
    /// "dynamic"`), or kept as a pending plan (`"confirm"`).
    pub(super) fn pursue(
        &self,
        slot: &GpuSlot,
        st: &mut GpuState,
        target: Layout,
        why: &str,
        cfg: &Config,
        effect: Option<PlanEffect>,
    ) {
        match cfg.mode {
            Mode::Dynamic => {
                let shown = plan_status(slot, st, target);
                if self.apply_target(slot, st, target, why) {
                    if let Some(mut shown) = shown {
                        shown.effect = effect;
                        self.plans().record_applied(shown, unix_now());
                    }
                }
            }
            // A pending plan's effect is refreshed with the others' each epoch.
            Mode::Confirm => self.propose(slot, st, target, cfg.plan_timeout_s),
            // Advise mode records wishes (`advise`) and never pursues them.
            Mode::Advise => {}
        }
    }

    /// `mode = "confirm"`: the policy wants `slot` at `target`; keep (or
    /// replace) the GPU's pending plan, or withdraw it when there is
    /// nothing to do any more.
    fn propose(&self, slot: &GpuSlot, st: &GpuState, target: Layout, timeout_s: u64) {
        let Some(shown) = plan_status(slot, st, target) else {
            if let Some(p) = self.plans().withdraw(slot.index) {
                tracing::info!(
                    plan = p.shown.id,
                    gpu = slot.index,
                    "plan withdrawn: the policy wants something else, or it is no longer safe"
                );
            }
            return;
        };
        let (from, to) = (shown.from.clone(), shown.to.clone());
        let (id, new) = self.plans().propose(
            slot.index,
            st.book.layout(),
            target,
            shown,
            unix_now(),
            timeout_s,
        );
        if new {
            tracing::info!(plan = id, gpu = slot.index, %from, %to,
                "plan waits for `smartmig apply {id}` (mode = confirm; lapses after {timeout_s} s)");
        }
    }

    /// `smartmig plan`: the mode, pending and applied plans.
    pub fn plan_reply(&self) -> PlanReply {
        let cfg = self.config();
        let plans = self.plans();
        PlanReply {
            mode: cfg.mode.as_str().into(),
            policy: self.policy_name(),
            plan_timeout_s: cfg.plan_timeout_s,
            pending: plans.pending(),
            applied: plans.applied(),
        }
    }

    /// `smartmig apply ID`: carries out pending plan `id` if the GPU is
    /// still where the plan started and it destroys no busy instance.
    pub async fn apply_plan(&self, id: u64) -> Result<PlanStatus, ErrorBody> {
        let now = unix_now();
        if self.config().mode == Mode::Advise {
            return Err(ErrorBody::new(
                ErrorKind::InvalidRequest,
                "advise mode carries out nothing: its wishes are in `smartmig status` and the advice log",
            ));
        }
        let plan = self
            .plans()
            .take(id, now)
            .map_err(|e| ErrorBody::new(ErrorKind::InvalidRequest, e.to_string()))?;
        let refuse = |m: String| Err(ErrorBody::new(ErrorKind::InvalidRequest, m));
        let Some(slot) = self.slots.get(plan.shown.gpu as usize) else {
            return refuse(format!("plan {id}: no GPU {}", plan.shown.gpu));
        };
        let mut st = slot.state.lock().await;
        let current = st.book.layout();
        if current != plan.from {
            return refuse(format!(
                "plan {id} was made for GPU {} at {}, which is now {}: not applied; the next epoch proposes a new plan",
                slot.index,
                plan.shown.from,
                st.book.geometry.picture(current)
            ));
        }
        if !self.apply_target(slot, &mut st, plan.to, "apply") {
            return refuse(format!(
                "plan {id} would now destroy a busy instance on GPU {} (or a create failed, see the log): not applied",
                slot.index
            ));
        }
        drop(st);
        tracing::info!(plan = id, gpu = plan.shown.gpu, from = %plan.shown.from, to = %plan.shown.to, "plan applied");
        let mut plans = self.plans();
        self.metrics.pending_plans(plans.pending_count());
        Ok(plans.record_applied(plan.shown, now))
    }

    /// Moves `slot` towards `target`, destroying idle instances only. A
    /// target that would destroy a busy instance is refused (and logged).
    pub(super) fn apply_target(
        &self,
        slot: &GpuSlot,
        st: &mut GpuState,
        target: Layout,
        why: &str,
    ) -> bool {
        let g = st.book.geometry;
        let current = st.book.layout();
        let busy = st.book.busy();
        if !g.is_valid(target) {
            tracing::warn!(gpu = slot.index, why, "target layout is invalid; ignored");
            return false;
        }
        let t = g.transition(current, target);
        if t.is_noop() {
            return false;
        }
        if t.touches(busy) {
            tracing::info!(gpu = slot.index, why, from = %g.picture(current), to = %g.picture(target),
                "target would destroy a busy instance; deferred");
            return false;
        }
        tracing::info!(gpu = slot.index, why, from = %g.picture(current), to = %g.picture(target), "repartitioning");
        let victims: Vec<String> = st
            .book
            .instances
            .iter()
            .filter(|i| t.destroy.contains(i.placement))
            .map(|i| i.uuid.clone())
            .collect();
        for uuid in victims {
            match tokio::task::block_in_place(|| self.backend.destroy(slot.index, &uuid)) {
                Ok(()) => {
                    self.metrics.reconfiguration(slot.index, "destroy");
                    tracing::info!(gpu = slot.index, %uuid, "destroyed idle instance");
                    st.book.remove_instance(&uuid);
                }
                Err(e) => {
                    tracing::warn!(gpu = slot.index, %uuid, "destroy failed: {e}");
                    self.backend_failed(slot.index, &mut st.book, &e);
                    return false;
                }
            }
        }
        let now = unix_now();
        for id in t.create.iter() {
            match tokio::task::block_in_place(|| self.backend.create(slot.index, id)) {
                Ok(uuid) => {
                    self.metrics.reconfiguration(slot.index, "create");
                    tracing::info!(gpu = slot.index, %uuid, instance = %g.placement(id).describe(), "created instance");
                    st.book.add_instance(id, uuid, now);
                }
                Err(e) => {
                    tracing::warn!(
                        gpu = slot.index,
                        "create {} failed: {e}",
                        g.placement(id).describe()
                    );
                    self.backend_failed(slot.index, &mut st.book, &e);
                    return false;
                }
            }
        }
        if let Err(e) = self.isolate(&st.book, None) {
            tracing::error!(
                gpu = slot.index,
                "new instances not restricted to root: {e}"
            );
        }
        slot.released.notify_waiters();
        true
    }

    /// One repartitioning epoch: observe, ask the policy, apply what is safe.
    pub async fn repartition_once(&self) {
        // One snapshot for the epoch: a SIGHUP during it takes effect next epoch.
        let live = self.live();
        let cfg = &live.config;
        let read = self.read_queue().await;
        if let Some((q, t0)) = &read {
            let _ = self.reap_ended_jobs(q, *t0).await;
        } else if cfg.slurm.enabled
            && cfg.cluster.fallback == crate::config::SummaryFallback::Hold
            && self.view_source().problem.is_some()
        {
            // No fresh summary and told not to ask Slurm: keep the layout.
            return;
        }
        let advise = cfg.mode == Mode::Advise;
        let occupied = if advise {
            Some(self.observe(read.as_ref().map(|(q, _)| q), cfg).await)
        } else {
            None
        };
        let queue = read.map(|(q, _)| q).unwrap_or_default();
        let now = unix_now_f64();
        let mut statuses = Vec::new();
        for (k, slot) in self.slots.iter().enumerate() {
            let st = slot.state.lock().await;
            // Every epoch re-asserts who may open each instance (a driver
            // tool or an admin may have reset a mode since).
            if let Err(e) = self.isolate(&st.book, None) {
                tracing::error!(gpu = slot.index, "device isolation: {e}");
            }
            let mut s = policy::GpuStatus::new(slot.model, st.book.layout());
            s.busy = st.book.busy();
            let mut until = [0.0; MAX_PLACEMENTS];
            for i in &st.book.instances {
                if let Some(a) = &i.job {
                    until[i.placement.0 as usize] = expected_end(a, queue.job(a.job_id));
                }
            }
            s.busy_until = until;
            // Advise mode: the jobs Slurm runs on the site's instances.
            if let Some(o) = occupied.as_ref().and_then(|o| o.get(k)) {
                s.busy = o.busy;
                s.busy_until = o.until;
            }
            statuses.push(s);
        }
        let mut by_profile = PendingByProfile::default();
        // Advise mode also counts typed requests (`gpu:3g.20gb:1`) as
        // demand for that profile's compute and memory.
        let typed = queue.pending_typed().filter(|_| advise).filter_map(|p| {
            let (compute, memory) = crate::mig::profile_size(p.mig_profile.as_deref()?)?;
            Some((p, compute, Some(f64::from(memory))))
        });
        let jobs: Vec<PendingJob> = queue
            .pending_shards()
            .map(|p| (p, p.shards, None))
            .chain(typed)
            .map(|(p, shards, memory)| {
                let mut shapes = [None; MODEL_COUNT];
                for m in GpuModel::ALL {
                    if let Ok(prof) = crate::mig::select_profile(m.spec(), shards, memory) {
                        shapes[m as usize] = Some(prof.shape);
                        if let Some(ix) =
                            m.spec().profiles.iter().position(|q| q.shape == prof.shape)
                        {
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
        let hour = (now.rem_euclid(86_400.0)) / 3600.0;
        // What arrived since the previous epoch: the waiting jobs Slurm
        // took in during the last epoch period (a job that started at once
        // on another node's GPU is not seen here).
        let since = now - cfg.epoch_s as f64;
        let arrivals: Vec<PendingJob> =
            jobs.iter().filter(|j| j.arrival > since).copied().collect();
        let view = ClusterView {
            now,
            hour_of_day: hour,
            gpus: &statuses,
            pending: &jobs,
            pending_by_profile: &by_profile,
            arrivals: &arrivals,
        };
        let mut decisions = live.policy.lock().await.decide(&view);
        // Advise mode, first epoch: the layout the policy would have
        // installed is its first wish (a static policy never wishes again).
        if advise && self.advise_first_epoch() {
            let mut p = live.policy.lock().await;
            if p.installs_initial_layout() {
                for (k, slot) in self.slots.iter().enumerate() {
                    if !decisions.iter().any(|d| d.gpu == k) {
                        let target = p.initial_layout(k, Geometry::of(slot.model));
                        decisions.push(policy::Decision { gpu: k, target });
                    }
                }
            }
        }
        let lapsed = self.plans().expire(unix_now());
        for p in lapsed {
            tracing::info!(plan = p.shown.id, gpu = p.shown.gpu, from = %p.shown.from, to = %p.shown.to,
                "plan lapsed: not applied within plan_timeout_s");
        }
        // A plan made for a layout the GPU no longer has (jobs were served
        // on demand meanwhile), or that would now destroy a busy instance,
        // is withdrawn; the policy proposes anew when it still wants to.
        for slot in &self.slots {
            let st = slot.state.lock().await;
            let stale = self.plans().withdraw_if(slot.index, |p| {
                p.from != st.book.layout() || plan_status(slot, &st, p.to).is_none()
            });
            if let Some(p) = stale {
                tracing::info!(plan = p.shown.id, gpu = slot.index, from = %p.shown.from, to = %p.shown.to,
                    "plan withdrawn: the GPU changed since (jobs served on demand)");
            }
        }
        let mut ahead = lookahead_of(&statuses, &jobs, now);
        for d in decisions {
            let Some(slot) = self.slots.get(d.gpu) else {
                tracing::warn!(gpu = d.gpu, "policy decided for a GPU that does not exist");
                continue;
            };
            let mut st = slot.state.lock().await;
            // The expected effect of a reshape carried out now (dynamic) or
            // recorded (advise); pending plans (confirm) get theirs below,
            // once per epoch.
            let effect = if cfg.mode != Mode::Confirm && plan_status(slot, &st, d.target).is_some()
            {
                expected_effect(&mut ahead, d.gpu, d.target)
            } else {
                None
            };
            match occupied.as_ref().and_then(|o| o.get(d.gpu)) {
                Some(o) => self.advise(slot, &st, d.target, o.busy, cfg, effect),
                None => self.pursue(slot, &mut st, d.target, "policy", cfg, effect),
            }
        }
        // Every pending plan's expected effect follows this epoch's queue
        // (also those made before any queue was read: the initial layout).
        let targets = self.plans().pending_targets();
        for (gpu, to) in targets {
            let effect = expected_effect(&mut ahead, gpu as usize, to);
            self.plans().set_effect(gpu, effect);
        }
        self.metrics.pending_plans(self.plans().pending_count());
        // Without Slurm queries there is nowhere to publish to, nothing to resume.
        if cfg.slurm.enabled {
            if let Some(info) = self.read_node().await {
                self.resume_if_drained_by_us(&info).await;
                if cfg.publish_layout && !advise {
                    self.publish_layout(&info.features).await;
                }
            }
        }
    }

    /// Publishes each GPU's compute sizes as node features, keeping the admin's.
    /// `current`: the node's features as this epoch's `sinfo` read them.
    pub(super) async fn publish_layout(&self, current: &NodeFeatures) {
        let mut layouts = Vec::new();
        for slot in &self.slots {
            let st = slot.state.lock().await;
            let g = st.book.geometry;
            let mut sizes: Vec<u8> = st
                .book
                .layout()
                .iter()
                .map(|id| g.placement(id).compute())
                .collect();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            layouts.push((slot.index, sizes));
        }
        let ours = layout_features(&layouts);
        let slurm = self.slurm();
        let node = self.node.clone();
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
