//! Gang jobs in the central engine (issue 54): a job of `gpus > 1`
//! ([`Job::gpus`]) needs that many whole-GPU instances at once, and all of
//! its pieces start and end together.
//!
//! The waiting gang jobs form one queue in arrival order; its head takes
//! GPUs as they come free and holds them (an idle whole instance the
//! policy sees as busy until the job's expected end, so it cannot re-shape
//! it) until it has all it needs, as Slurm's reservation for the first job
//! in its queue holds nodes. Where to find a whole GPU:
//! - a free whole-GPU instance, under every policy (`none`'s GPUs are all
//!   whole; a fixed layout offers the whole GPUs it has, and a gang job
//!   that needs more of them than the layout has waits for the policy);
//! - served on demand (a policy smartmig runs): a GPU with no busy
//!   instance is re-shaped into one whole instance for the job
//!   ([`Geometry::serve`](crate::mig::Geometry::serve), the allocate's
//!   rule), and the GPUs that will drain soonest are kept for it: a single
//!   job may start there only if it ends before the GPU would drain.
//!
//! The policy sees a waiting gang job as one waiting job of the whole
//! GPU's shape.

use super::{Engine, NONE};
use crate::mig::{GpuNow, Layout, Mix, SpotId};
use crate::sim::{RunHooks, SimError};

/// The head gang job's hold on GPUs.
#[derive(Default)]
pub(super) struct Gangs {
    /// Waiting gang jobs in arrival order (job indices); the first holds.
    pub(super) queue: std::collections::VecDeque<u32>,
    /// Whole-GPU instances the head holds: (GPU, instance, ready).
    held: Vec<(usize, SpotId, bool)>,
    /// On demand: GPUs kept for the head until they drain, and when.
    pub(super) draining: Vec<(usize, f64)>,
    /// Pieces still running of each started gang job.
    left: std::collections::HashMap<u32, u32>,
}

impl Engine<'_> {
    /// Whether job `i` may start on `gpu` now for `run_s` seconds as far as
    /// the head gang job's draining GPUs go.
    pub(super) fn gang_allows(&self, gpu: usize, run_s: f64) -> bool {
        self.gangs
            .draining
            .iter()
            .all(|&(g, at)| g != gpu || self.now + run_s <= at)
    }

    /// Puts gang job `i` in the list the policy sees (see the module docs)
    /// and in the gang queue.
    pub(super) fn enqueue_gang(&mut self, i: u32) {
        self.push_pending(i);
        self.gangs.queue.push_back(i);
    }

    /// Starts the gang jobs whose GPUs are all held and ready, in order;
    /// the first that is not takes what it can.
    pub(super) fn serve_gangs(&mut self, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        self.gangs.draining.clear();
        while let Some(&i) = self.gangs.queue.front() {
            let need = self.jobs[i as usize].gpus as usize;
            if !self.gang_may_hold(i, need) {
                return Ok(());
            }
            self.hold_free_whole(i, need);
            if self.on_demand {
                self.build_whole(i, need, hooks)?;
            }
            let held = &self.gangs.held;
            if held.len() < need || held.iter().any(|h| !h.2) {
                if self.on_demand {
                    self.keep_draining(i, need);
                }
                return Ok(());
            }
            self.start_gang(i, hooks)?;
        }
        Ok(())
    }

    /// A ready piece of a gang job: returns whether `(gpu, pid)` was one
    /// the head holds (the piece then waits for the others).
    pub(super) fn gang_piece_ready(&mut self, gpu: usize, pid: SpotId) -> bool {
        let i = self.rt[gpu].job_on[pid.0 as usize];
        if i == NONE || !self.jobs[i as usize].is_gang() {
            return false;
        }
        for h in &mut self.gangs.held {
            if (h.0, h.1) == (gpu, pid) {
                h.2 = true;
            }
        }
        true
    }

    /// A piece of a started gang job begins: true for the first (whose
    /// start settles the job's metrics), and for every single-GPU job.
    pub(super) fn first_piece(&mut self, i: u32) -> bool {
        if !self.jobs[i as usize].is_gang() {
            return true;
        }
        let left = self.gangs.left.entry(i).or_insert(0);
        *left += 1;
        *left == 1
    }

    /// A piece of job `i` ends: true when the job is over (its last piece,
    /// or a single-GPU job).
    pub(super) fn last_piece(&mut self, i: u32) -> bool {
        let Some(left) = self.gangs.left.get_mut(&i) else {
            return true;
        };
        *left -= 1;
        if *left > 0 {
            return false;
        }
        self.gangs.left.remove(&i);
        true
    }

    /// Whether the head may hold GPUs: on demand always (a job that needs
    /// more GPUs than can be whole was rejected at load); otherwise only
    /// when at least `need` GPUs have a whole instance that fits it in
    /// their layout, so a fixed layout that cannot run the job does not
    /// hold GPUs for it forever.
    fn gang_may_hold(&self, i: u32, need: usize) -> bool {
        if self.on_demand {
            return true;
        }
        let mask = self.fit_mask[i as usize];
        let whole = self
            .status
            .iter()
            .zip(&self.rt)
            .filter(|(st, rt)| {
                st.layout
                    .iter()
                    .any(|id| mask & (1 << super::class_of(st.geometry, rt.slot, id)) != 0)
            })
            .count();
        whole >= need
    }

    /// Takes free whole-GPU instances that fit job `i` until it holds `need`.
    fn hold_free_whole(&mut self, i: u32, need: usize) {
        let mut bits = self.fit_mask[i as usize] & self.free_mask;
        while bits != 0 && self.gangs.held.len() < need {
            let c = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let take: Vec<(u32, u8)> = self.free[c]
                .iter()
                .take(need - self.gangs.held.len())
                .copied()
                .collect();
            for (gpu, pid) in take {
                let (gpu, pid) = (gpu as usize, SpotId(pid));
                self.take_free(c, gpu, pid);
                self.hold(i, gpu, pid);
                self.gangs.held.push((gpu, pid, true));
            }
        }
    }

    /// Marks `pid` of `gpu` as held for gang job `i`: busy in the
    /// policy's view until the job's expected end, idle in power.
    fn hold(&mut self, i: u32, gpu: usize, pid: SpotId) {
        self.rt[gpu].job_on[pid.0 as usize] = i;
        let work = self.jobs[i as usize].work;
        let st = &mut self.status[gpu];
        st.busy = st.busy.with(pid);
        st.busy_until[pid.0 as usize] = self.now + work;
    }

    /// On demand: re-shapes GPUs with no busy instance into one whole
    /// instance each for job `i`, until it holds `need`.
    fn build_whole(
        &mut self,
        i: u32,
        need: usize,
        hooks: &mut RunHooks<'_>,
    ) -> Result<(), SimError> {
        let job = &self.jobs[i as usize];
        let want_gb = job.memory_gb;
        for gpu in 0..self.status.len() {
            if self.gangs.held.len() >= need {
                break;
            }
            let st = &self.status[gpu];
            if st.in_reconfiguration || !st.busy.is_empty() {
                continue;
            }
            let Some(profile) = crate::sim::asked_profile(job, st.model) else {
                continue;
            };
            let now = GpuNow {
                layout: st.layout,
                taken: Layout::EMPTY,
                reusable: st.layout,
                may_build: true,
            };
            let Some((pid, way)) = st
                .geometry
                .serve(now, profile, want_gb, &Mix::default(), None)
            else {
                continue;
            };
            // A free whole instance here was taken by `hold_free_whole`.
            if way == crate::mig::Way::Reuse {
                continue;
            }
            self.build_for(i, gpu, pid, way, hooks)?;
            self.gangs.held.push((gpu, pid, false));
        }
        Ok(())
    }

    /// On demand: keeps for job `i` the GPUs (not yet held) that fit it
    /// and will drain soonest, as many as it still needs.
    fn keep_draining(&mut self, i: u32, need: usize) {
        let job = &self.jobs[i as usize];
        let mut drains: Vec<(f64, usize)> = self
            .status
            .iter()
            .enumerate()
            .filter(|(gpu, st)| {
                !self.gangs.held.iter().any(|h| h.0 == *gpu)
                    && crate::sim::asked_profile(job, st.model).is_some()
            })
            .map(|(gpu, st)| {
                let busy_end = st
                    .busy
                    .iter()
                    .map(|id| st.busy_until[id.0 as usize])
                    .fold(self.now, f64::max);
                let reconfig_end = if st.in_reconfiguration {
                    st.reconfig_until
                } else {
                    self.now
                };
                (busy_end.max(reconfig_end), gpu)
            })
            .collect();
        drains.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let missing = need.saturating_sub(self.gangs.held.len());
        self.gangs.draining = drains
            .into_iter()
            .take(missing)
            .map(|(at, gpu)| (gpu, at))
            .collect();
    }

    /// Starts every piece of the head gang job `i` on the GPUs it holds.
    fn start_gang(&mut self, i: u32, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        self.gangs.queue.pop_front();
        self.remove_pending_at(i);
        let held = std::mem::take(&mut self.gangs.held);
        for (gpu, pid, _) in held {
            self.run_job(i, gpu, pid, hooks)?;
        }
        Ok(())
    }
}
