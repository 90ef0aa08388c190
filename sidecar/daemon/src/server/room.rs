//! Room for an interactive job (issue 42), the shell of
//! [`crate::make_room`]: an `srun`/`salloc` step that finds no buildable
//! room asks slurmctld whether its job is interactive; if so, the fewest
//! batch jobs that got their instances on the GPU moments ago (within
//! `allocate_wait_s` + the queue refresh, the window of one scheduling
//! pass) and that Slurm may requeue are requeued, and the step waits for
//! their epilogs' releases (a requeued job is killed as a cancelled one
//! is; one that ignores SIGTERM holds the room up to Slurm's `KillWait`).
//! Batch jobs never requeue others: they are requeued themselves when
//! nothing fits.

use tokio::sync::MutexGuard;

use super::books::GpuState;
use super::job_record::{self, Record};
use super::{queue, Cx};
use crate::allocate::GpuBook;
use crate::make_room::{self, RecordFacts, Young};
use crate::mig::{Geometry, Layout, ProfileSpec};
use crate::protocol::AllocateRequest;

/// One allocate's asking for room: whether its job is interactive (from
/// the record the grant check read, else read once here), the young jobs
/// it already looked at (asked again only when they change), and whether
/// it made room (once per allocate).
pub(super) struct Asker {
    interactive: Option<bool>,
    seen: Vec<u64>,
    made: bool,
}

impl Asker {
    /// `interactive`: what the job's record said, if it was read.
    pub(super) fn new(interactive: Option<bool>) -> Asker {
        Asker {
            interactive,
            seen: Vec::new(),
            made: false,
        }
    }

    /// With the GPU's lock `st`: when young jobs hold instances there that
    /// this allocate has not looked at yet, gives up the lock, requeues
    /// those that make room for `profile` if `req` is an interactive job's
    /// step, and returns `None` (the caller plans again). Otherwise hands
    /// the lock back for the usual wait.
    pub(super) async fn try_now<'g>(
        &mut self,
        cx: &Cx<'_>,
        st: MutexGuard<'g, GpuState>,
        req: &AllocateRequest,
        profile: &'static ProfileSpec,
    ) -> Option<MutexGuard<'g, GpuState>> {
        if self.made || !cx.cfg().slurm.enabled || self.interactive == Some(false) {
            return Some(st);
        }
        let young = young(cx, &st.book);
        let ids: Vec<u64> = young.iter().map(|y| y.job_id).collect();
        if young.is_empty() || ids == self.seen {
            return Some(st);
        }
        let (geometry, busy) = (st.book.geometry, st.book.busy());
        drop(st);
        self.seen = ids;
        if self.interactive.is_none() {
            self.interactive = Some(facts(cx, req.job_id).await.is_some_and(|f| !f.batch));
        }
        if self.interactive == Some(true) {
            self.made = make(cx, req, geometry, busy, young, profile).await;
        }
        None
    }
}

/// The jobs that got their instances on the GPU within one scheduling
/// pass's window (`allocate_wait_s` + the queue refresh).
fn young(cx: &Cx<'_>, book: &GpuBook) -> Vec<Young> {
    let since = queue::pass_window_start(cx.cfg());
    book.instances
        .iter()
        .filter_map(|i| {
            let a = i.job.as_ref()?;
            (a.since >= since).then_some(Young {
                job_id: a.job_id,
                placement: i.placement,
                since: a.since,
            })
        })
        .collect()
}

/// Requeues the fewest `young` jobs that Slurm may requeue and whose
/// instances, freed, make room for `profile` beside `busy`; whether any
/// was requeued.
async fn make(
    cx: &Cx<'_>,
    req: &AllocateRequest,
    geometry: &'static Geometry,
    busy: Layout,
    young: Vec<Young>,
    profile: &'static ProfileSpec,
) -> bool {
    let mut may_go = Vec::new();
    let mut ids = Vec::new();
    for y in young {
        if let Some(f) = facts(cx, y.job_id).await.filter(RecordFacts::may_give_way) {
            may_go.push(y);
            ids.push((y.job_id, f.slurm_id));
        }
    }
    let Some(victims) = make_room::victims(geometry, busy, &may_go, profile.shape) else {
        tracing::info!(
            job = req.job_id,
            gpu = req.gpu,
            young = ?ids.iter().map(|(j, _)| *j).collect::<Vec<_>>(),
            "interactive step: no young batch job whose requeue makes room for a {}; waiting",
            profile.name()
        );
        return false;
    };
    let mut requeued = false;
    for (job, slurm_id) in ids.into_iter().filter(|(j, _)| victims.contains(j)) {
        requeued |= requeue(cx, req, job, slurm_id, profile).await;
    }
    requeued
}

/// What slurmctld's record says of `job_id`; `None` when it cannot be
/// read or parsed (the job then neither gets room nor gives it).
async fn facts(cx: &Cx<'_>, job_id: u64) -> Option<RecordFacts> {
    match job_record::read(cx, job_id).await {
        Ok(Record::Listed(text)) => make_room::record_facts(&text),
        Ok(Record::Gone) => None,
        Err(e) => {
            tracing::warn!(
                job = job_id,
                "cannot tell whether the job may be requeued: {e}"
            );
            None
        }
    }
}

/// `scontrol requeue` of one young batch job, logged with the step it
/// makes room for.
async fn requeue(
    cx: &Cx<'_>,
    req: &AllocateRequest,
    job: u64,
    slurm_id: String,
    profile: &'static ProfileSpec,
) -> bool {
    let slurm = cx.live.slurm.clone();
    let id = slurm_id.clone();
    match tokio::task::spawn_blocking(move || slurm.requeue(&id)).await {
        Ok(Ok(())) => {
            tracing::warn!(
                job = req.job_id,
                gpu = req.gpu,
                requeued = %slurm_id,
                "requeued batch job {slurm_id}, started moments ago on this GPU, to make room for interactive job {}'s {} (an interactive step cannot be requeued, and MIG could not build its instance beside the GPU's jobs)",
                req.job_id,
                profile.name()
            );
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(job = req.job_id, requeued = %slurm_id, "could not requeue job {job} to make room: {e}");
            false
        }
        Err(e) => {
            tracing::warn!(job = req.job_id, "the requeue task failed: {e}");
            false
        }
    }
}
