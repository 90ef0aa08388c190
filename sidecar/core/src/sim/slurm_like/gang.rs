//! Gang jobs in the deployment model (issue 54): a job of `gpus > 1`
//! ([`crate::workload::Job::gpus`]) is billed every shard of each GPU it
//! spans, so Slurm's pass places it only on GPUs with all their shards
//! free (and, as a simplification, no policy reconfiguration running);
//! smartmigd then makes each of them one whole instance (reuse, or
//! re-shape its idle instances: [`crate::mig::Geometry::serve`]) and the
//! pieces start together once all are ready.
//!
//! Slurm's backfill keeps the first gang job in its queue from starving:
//! the GPUs that will have all their shards free soonest are kept for it,
//! and the pass places another job there only if that job ends first
//! ([`Deploy::gang_allows`]), as the central engine does.

use super::{Deploy, St};
use crate::mig::{GpuNow, Layout, Mix, SpotId, Way};
use crate::sim::{RunHooks, SimError};

/// Gang jobs placed and starting or running.
#[derive(Default)]
pub(super) struct Gangs {
    /// Job -> its pieces (GPU, instance, ready) while they are being built.
    starting: std::collections::HashMap<u32, Vec<(usize, SpotId, bool)>>,
    /// Pieces still running of each started gang job.
    pub(super) left: crate::sim::gang::Pieces,
    /// GPUs kept for the first gang job that does not fit, and when they
    /// will have all their shards free.
    pub(super) keep: Vec<(usize, f64)>,
}

impl Deploy<'_> {
    /// Whether a job that would run `run_s` on `gpu` may be placed there
    /// now as far as the kept GPUs go.
    pub(super) fn gang_allows(&self, gpu: usize, run_s: f64) -> bool {
        self.gangs
            .keep
            .iter()
            .all(|&(g, at)| g != gpu || self.now + run_s <= at)
    }

    /// GPUs gang job `i` may be placed on now: every shard free, no policy
    /// reconfiguration running, a whole profile that fits it.
    fn gang_ready_gpus(&self, i: usize) -> Vec<usize> {
        (0..self.gpus.len())
            .filter(|&g| {
                let gp = &self.gpus[g];
                gp.alloc == 0
                    && gp.held == 0
                    && gp.policy_until <= self.now
                    && !gp.status.in_reconfiguration
                    && self.profile[i][gp.slot].is_some()
            })
            .collect()
    }

    /// Slurm's pass meets gang job `i`: places it if enough GPUs are free
    /// (returns true), else, for the first such job of the pass, keeps the
    /// GPUs that drain soonest for it.
    pub(super) fn place_gang(
        &mut self,
        i: u32,
        first_unplaced: &mut bool,
        hooks: &mut RunHooks<'_>,
    ) -> Result<bool, SimError> {
        let need = self.jobs[i as usize].gpus as usize;
        let ready = self.gang_ready_gpus(i as usize);
        if ready.len() < need {
            if std::mem::take(first_unplaced) {
                self.keep_for_gang(i as usize, need);
            }
            return Ok(false);
        }
        let mut pieces = Vec::with_capacity(need);
        for &gpu in &ready[..need] {
            self.gpus[gpu].alloc = self.gpus[gpu].total;
            self.touched[gpu] = true;
            let (pid, ready) = self.build_whole(i, gpu, hooks)?;
            pieces.push((gpu, pid, ready));
        }
        self.state[i as usize] = St::GangStarting;
        self.gangs.starting.insert(i, pieces);
        self.start_gang_if_ready(i, hooks)?;
        Ok(true)
    }

    /// smartmigd's allocate of one piece of gang job `i` on `gpu`, whose
    /// instances are all idle: the whole instance if there is one (ready
    /// now), else one made from the idle ones (ready after the
    /// reconfiguration).
    fn build_whole(
        &mut self,
        i: u32,
        gpu: usize,
        hooks: &mut RunHooks<'_>,
    ) -> Result<(SpotId, bool), SimError> {
        let st = &self.gpus[gpu].status;
        let profile = self.profile[i as usize][self.gpus[gpu].slot];
        let now = GpuNow {
            layout: st.layout,
            taken: Layout::EMPTY,
            reusable: st.layout,
            may_build: true,
            // A gang's piece takes the whole GPU: nothing is bigger.
            lend: false,
        };
        let way = profile.and_then(|p| {
            st.geometry.serve(
                now,
                p,
                self.jobs[i as usize].memory_gb,
                &Mix::default(),
                None,
            )
        });
        // A GPU with every instance idle can always be made whole.
        let Some((pid, way)) = way else {
            return Err(SimError::Config(format!(
                "internal: GPU {gpu} cannot be made whole for gang job {}",
                self.jobs[i as usize].id
            )));
        };
        if way == Way::Reuse {
            // Held for the job (busy in the policy's view) until the other
            // pieces are ready.
            let until = self.now + self.cfg.reconfig_time_s + self.jobs[i as usize].work;
            let gp = &mut self.gpus[gpu];
            gp.job_on[pid.0 as usize] = i;
            gp.status.busy = gp.status.busy.with(pid);
            gp.status.busy_until[pid.0 as usize] = until;
            return Ok((pid, true));
        }
        self.create(i, gpu, pid, way.destroyed(), hooks)?;
        Ok((pid, false))
    }

    /// An instance built for gang job `i` is ready: returns whether it was
    /// one of its pieces (which then waits for the others).
    pub(super) fn gang_piece_ready(
        &mut self,
        i: u32,
        gpu: usize,
        pid: SpotId,
        hooks: &mut RunHooks<'_>,
    ) -> Result<bool, SimError> {
        let Some(pieces) = self.gangs.starting.get_mut(&i) else {
            return Ok(false);
        };
        for p in pieces.iter_mut() {
            if (p.0, p.1) == (gpu, pid) {
                p.2 = true;
            }
        }
        self.start_gang_if_ready(i, hooks)?;
        Ok(true)
    }

    /// Starts every piece of gang job `i` once all are ready.
    fn start_gang_if_ready(&mut self, i: u32, hooks: &mut RunHooks<'_>) -> Result<(), SimError> {
        let all = self
            .gangs
            .starting
            .get(&i)
            .is_some_and(|p| p.iter().all(|x| x.2));
        if !all {
            return Ok(());
        }
        let pieces = self.gangs.starting.remove(&i).unwrap_or_default();
        for (gpu, pid, _) in pieces {
            self.start(i, gpu, pid, hooks)?;
        }
        Ok(())
    }

    /// Keeps for gang job `i` the `need` GPUs that fit it and will have
    /// all their shards free soonest (each job on them ends by its
    /// expected end), until the last of them drains.
    fn keep_for_gang(&mut self, i: usize, need: usize) {
        let mut drains: Vec<(f64, usize)> = (0..self.gpus.len())
            .filter(|&g| self.profile[i][self.gpus[g].slot].is_some())
            .map(|g| {
                let st = &self.gpus[g].status;
                let busy_end = st
                    .busy
                    .iter()
                    .map(|id| st.busy_until[id.0 as usize])
                    .fold(self.now, f64::max);
                (busy_end.max(self.gpus[g].policy_until), g)
            })
            .collect();
        drains.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        drains.truncate(need);
        // The gang starts when the last of its GPUs drains, so a job that
        // ends by then may still use any of them (Slurm's backfill, as the
        // central engine's reservation): keeping each GPU only until its
        // own drain left the idle ones to no one, and every later job
        // waited for the gang (Alibaba v2023 window 135: 153,000 s).
        let at = drains.last().map_or(self.now, |d| d.0);
        self.gangs.keep = drains.into_iter().map(|(_, g)| (g, at)).collect();
    }
}
