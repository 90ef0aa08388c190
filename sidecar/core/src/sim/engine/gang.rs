//! Gang jobs in the central engine (issue 54): a job of `gpus > 1`
//! ([`Job::gpus`](crate::workload::Job::gpus)) needs that many whole-GPU
//! instances at once, and all of its pieces start and end together.
//!
//! The waiting gang jobs form one queue in arrival order. Its head gets a
//! reservation as Slurm's backfill scheduler makes one for the first job
//! of its queue: the `gpus` GPUs that can run it whole and will drain
//! soonest, from the moment the last of them drains. Until then another
//! job may start on those GPUs only if it ends by that moment
//! ([`Engine::gang_allows`]), so the reservation never moves back and no
//! GPU idles for it before it can start. Which GPUs can run it whole:
//! - under every policy, a GPU whose layout has a whole-GPU instance that
//!   fits it (it drains when that instance ends): `none`'s GPUs are all
//!   whole; a fixed layout offers the whole GPUs it has, and a gang job
//!   that needs more of them waits for the policy (or is never served);
//! - served on demand (a policy smartmig runs), any GPU whose whole
//!   profile fits it (it drains when all its instances are idle): its idle
//!   instances are then re-shaped into one whole instance for the job
//!   ([`Geometry::serve`](crate::mig::Geometry::serve), the allocate's
//!   rule), and the pieces start together when every one is ready.
//!
//! The policy sees a waiting gang job as one waiting job of the whole
//! GPU's shape.

use super::{Engine, NONE};
use crate::mig::{GpuNow, Layout, Mix, SpotId, Way};
use crate::sim::{RunHooks, SimError};

/// One piece of a gang job being started: GPU, instance, ready.
type Piece = (usize, SpotId, bool);

/// The gang queue, the head's reservation and the started gang jobs.
#[derive(Default)]
pub(super) struct Gangs {
    /// Waiting gang jobs in arrival order (job indices).
    queue: std::collections::VecDeque<u32>,
    /// The job whose pieces are being built, and each piece (GPU,
    /// instance, ready); the next head waits until they all run.
    starting: Option<(u32, Vec<Piece>)>,
    /// The head's reservation: its GPUs and the moment all have drained.
    reserved: Vec<usize>,
    reserved_at: f64,
    /// Pieces still running of each started gang job.
    pub(super) left: crate::sim::gang::Pieces,
}

impl Engine<'_> {
    /// Whether a job may start on `gpu` now for `run_s` seconds as far as
    /// the head gang job's reservation goes.
    pub(super) fn gang_allows(&self, gpu: usize, run_s: f64) -> bool {
        !self.gangs.reserved.contains(&gpu) || self.now + run_s <= self.gangs.reserved_at
    }

    /// When a job that could start on `gpu` at `at` for `run_s` seconds may
    /// start there as far as the head gang job's reservation goes: at `at`
    /// if the GPU is not reserved or the job ends by the time the gang
    /// starts (backfill), else once the gang's piece there has run.
    pub(super) fn after_gang(&self, gpu: usize, at: f64, run_s: f64) -> f64 {
        let Some(&head) = self.gangs.queue.front() else {
            return at;
        };
        if !self.gangs.reserved.contains(&gpu) || at + run_s <= self.gangs.reserved_at {
            return at;
        }
        let total = self.rt[gpu].total;
        let gang_run = self.jobs[head as usize].runtime_on(total, total);
        at.max(self.gangs.reserved_at + self.cfg.reconfig_time_s + gang_run)
    }

    /// Puts gang job `i` in the list the policy sees (see the module docs)
    /// and in the gang queue.
    pub(super) fn enqueue_gang(&mut self, i: u32) {
        self.push_pending(i);
        self.gangs.queue.push_back(i);
    }

    /// Starts the head gang job where its GPUs have drained, in order, and
    /// reserves GPUs for the first that cannot start yet.
    pub(super) fn serve_gangs(&mut self, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        self.gangs.reserved.clear();
        if self.gangs.starting.is_some() {
            return Ok(());
        }
        while let Some(&i) = self.gangs.queue.front() {
            let need = self.jobs[i as usize].gpus as usize;
            let mut drains = self.gang_drains(i);
            if drains.len() < need {
                // Not enough GPUs can be whole now: the policy may make more.
                return Ok(());
            }
            drains.truncate(need);
            let at = drains.last().map_or(self.now, |d| d.0);
            if at > self.now {
                self.gangs.reserved = drains.iter().map(|d| d.1).collect();
                self.gangs.reserved_at = at;
                return Ok(());
            }
            self.gangs.queue.pop_front();
            self.remove_pending_at(i);
            let gpus: Vec<usize> = drains.iter().map(|d| d.1).collect();
            self.start_gang(i, &gpus, hooks)?;
            if self.gangs.starting.is_some() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// `(when it drains, GPU)` of every GPU that can run gang job `i`
    /// whole, soonest first (module docs).
    fn gang_drains(&self, i: u32) -> Vec<(f64, usize)> {
        let job = &self.jobs[i as usize];
        let mask = self.fit_mask[i as usize];
        let mut out = Vec::new();
        for (gpu, (st, rt)) in self.status.iter().zip(&self.rt).enumerate() {
            let reconfig_end = if st.in_reconfiguration {
                st.reconfig_until
            } else {
                self.now
            };
            let busy_end = |ids: Layout| {
                ids.iter()
                    .map(|id| st.busy_until[id.0 as usize])
                    .fold(reconfig_end, f64::max)
            };
            let whole = st
                .layout
                .iter()
                .find(|&id| mask & (1 << super::class_of(st.geometry, rt.slot, id)) != 0);
            if let Some(id) = whole {
                out.push((busy_end(st.busy.intersection(Layout::single(id))), gpu));
            } else if self.on_demand && crate::sim::asked_profile(job, st.model).is_some() {
                out.push((busy_end(st.busy), gpu));
            }
        }
        out.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        out
    }

    /// Starts gang job `i` on `gpus`, all drained: a free whole instance
    /// runs its piece at once; otherwise the GPU's idle instances are
    /// re-shaped into one and the pieces start when all are ready.
    fn start_gang(
        &mut self,
        i: u32,
        gpus: &[usize],
        hooks: &mut RunHooks<'_>,
    ) -> Result<(), SimError> {
        let mut pieces = Vec::with_capacity(gpus.len());
        for &gpu in gpus {
            let (pid, way) = self.whole_for(i, gpu)?;
            if way == Way::Reuse {
                let slot = self.rt[gpu].slot;
                self.take_free(
                    super::class_of(self.status[gpu].geometry, slot, pid),
                    gpu,
                    pid,
                );
                self.hold(i, gpu, pid);
                pieces.push((gpu, pid, true));
            } else {
                self.build_for(i, gpu, pid, way, hooks)?;
                pieces.push((gpu, pid, false));
            }
        }
        self.gangs.starting = Some((i, pieces));
        self.run_gang_if_ready(hooks)
    }

    /// The whole instance for gang job `i` on the drained `gpu`, and how
    /// smartmigd's rule gets it (reuse or re-shape the idle instances).
    fn whole_for(&self, i: u32, gpu: usize) -> Result<(SpotId, Way), SimError> {
        let job = &self.jobs[i as usize];
        let st = &self.status[gpu];
        let now = GpuNow {
            layout: st.layout,
            taken: Layout::EMPTY,
            reusable: st.layout,
            may_build: true,
            // A gang's piece takes the whole GPU: nothing is bigger.
            lend: false,
        };
        crate::sim::asked_profile(job, st.model)
            .and_then(|p| {
                st.geometry
                    .serve(now, p, job.memory_gb, &Mix::default(), None)
            })
            .ok_or_else(|| SimError::InvalidJob {
                id: job.id,
                reason: format!("internal: GPU {gpu} drained but cannot be made whole for it"),
            })
    }

    /// Marks `pid` of `gpu` as held for gang job `i` while its other
    /// pieces are built: busy in the policy's view, idle in power.
    fn hold(&mut self, i: u32, gpu: usize, pid: SpotId) {
        self.rt[gpu].job_on[pid.0 as usize] = i;
        let until = self.now + self.cfg.reconfig_time_s + self.jobs[i as usize].work;
        let st = &mut self.status[gpu];
        st.busy = st.busy.with(pid);
        st.busy_until[pid.0 as usize] = until;
    }

    /// A reconfiguration made `(gpu, pid)` ready: returns whether it is a
    /// piece of the gang job being started (which then waits for the
    /// others, or starts with them).
    pub(super) fn gang_piece_ready(
        &mut self,
        gpu: usize,
        pid: SpotId,
        hooks: &mut RunHooks<'_>,
    ) -> Result<bool, SimError> {
        let i = self.rt[gpu].job_on[pid.0 as usize];
        let Some((_, pieces)) = self
            .gangs
            .starting
            .as_mut()
            .filter(|s| s.0 == i && i != NONE)
        else {
            return Ok(false);
        };
        for p in pieces.iter_mut() {
            if (p.0, p.1) == (gpu, pid) {
                p.2 = true;
            }
        }
        self.run_gang_if_ready(hooks)?;
        Ok(true)
    }

    /// Runs every piece of the gang job being started once all are ready.
    fn run_gang_if_ready(&mut self, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        let ready = self
            .gangs
            .starting
            .as_ref()
            .is_some_and(|(_, p)| p.iter().all(|x| x.2));
        if !ready {
            return Ok(());
        }
        let Some((i, pieces)) = self.gangs.starting.take() else {
            return Ok(());
        };
        for (gpu, pid, _) in pieces {
            self.run_job(i, gpu, pid, hooks)?;
        }
        Ok(())
    }
}
