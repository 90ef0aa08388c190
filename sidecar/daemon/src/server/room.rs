//! Room for an interactive job (issue 42), the shell of
//! [`crate::make_room`]: an `srun`/`salloc` step that finds no buildable
//! room asks slurmctld whether its job is interactive; if so, the fewest
//! batch jobs that got their instances on the GPU moments ago (within
//! `allocate_wait_s` + the queue refresh, the window of one scheduling
//! pass) and that Slurm may requeue are requeued, and the step waits for
//! their epilogs' releases (a requeued job is killed as a cancelled one
//! is; one that ignores SIGTERM holds the room up to Slurm's `KillWait`).
//! Batch jobs never requeue others: they are requeued themselves when
//! nothing fits. Nor does an interactive step requeue another user's job
//! while another GPU of the node could build its instance now (issue 53):
//! then only its own user's young batch jobs may give way, and its
//! `no_fit` says where the room is ([`advice`]).

use super::books::GpuTx;
use super::context::Cx;
use super::job_record::{self, Record};
use super::queue;
use crate::allocate::GpuBook;
use crate::make_room::{self, RecordFacts, Young};
use crate::mig::{Geometry, Layout, ProfileSpec};
use crate::protocol::{AllocateRequest, BATCH_STEP};
use smartmig_client::told::Requeued;

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
        st: GpuTx<'g>,
        req: &AllocateRequest,
        profile: &'static ProfileSpec,
    ) -> Option<GpuTx<'g>> {
        if self.made || !cx.cfg().slurm.enabled || self.interactive == Some(false) {
            return Some(st);
        }
        let young = young(cx, &st.book);
        let ids: Vec<u64> = young.iter().map(|(y, _)| y.job_id).collect();
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
            // Room elsewhere on the node: no other user's job gives way.
            let young = match room_elsewhere(cx, req.gpu, profile).await {
                Some(other) => {
                    tracing::info!(
                        job = req.job_id,
                        gpu = req.gpu,
                        "interactive step: GPU {other} could build a {} now, so only uid {}'s own young batch jobs may give way",
                        profile.name(),
                        req.uid
                    );
                    young
                        .into_iter()
                        .filter(|(_, uid)| *uid == req.uid)
                        .collect()
                }
                None => young,
            };
            let young = young.into_iter().map(|(y, _)| y).collect();
            self.made = make(cx, req, geometry, busy, young, profile).await;
        }
        None
    }
}

/// The jobs that got their instances on the GPU within one scheduling
/// pass's window (`allocate_wait_s` + the queue refresh), each with its
/// user's uid.
fn young(cx: &Cx<'_>, book: &GpuBook) -> Vec<(Young, u32)> {
    let since = queue::pass_window_start(cx.cfg());
    book.instances
        .iter()
        .filter_map(|i| {
            let a = i.job.as_ref()?;
            let young = Young {
                job_id: a.job_id,
                placement: i.placement,
                since: a.since,
            };
            (a.since >= since).then_some((young, a.uid))
        })
        .collect()
}

/// Another GPU of the node (the first by index) on which `profile` could
/// be built now, with its idle instances re-shaped if need be. Locks one
/// GPU at a time; the caller holds none.
pub(super) async fn room_elsewhere(
    cx: &Cx<'_>,
    gpu: u32,
    profile: &'static ProfileSpec,
) -> Option<u32> {
    for other in cx.books.gpus.iter().filter(|g| g.index != gpu) {
        let st = other.tx().await;
        // The same profile exists there only on a GPU of the same model.
        let same_model = st
            .book
            .geometry
            .spec
            .profiles
            .iter()
            .any(|p| std::ptr::eq(p, profile));
        if same_model
            && st
                .book
                .plan_profile(profile, f64::from(profile.memory_gb))
                .is_ok()
        {
            return Some(other.index);
        }
    }
    None
}

/// What an interactive step (any step but the batch script) that got no
/// instance in time is told to do, true for this node's configuration:
/// with `slurm.holds` on Slurm places a rerun on shards MIG can build;
/// with holds off it knows nothing of the layout and may place it on the
/// same GPU again, so a rerun is no advice there (issue 53).
pub(super) fn advice(cx: &Cx<'_>, req: &AllocateRequest, elsewhere: Option<u32>) -> String {
    if req.step.is_none_or(|s| s == BATCH_STEP) {
        return String::new();
    }
    if super::holds::rule(cx).is_some() {
        return "; an interactive step is not requeued: run it again (this node holds the \
                shards MIG cannot build, so Slurm places it where an instance can be made), \
                or submit it with sbatch, which is requeued instead of failing"
            .into();
    }
    let room = elsewhere.map_or_else(String::new, |g| {
        format!(
            " (GPU {g} of this node has room now, but Slurm chose GPU {})",
            req.gpu
        )
    });
    format!(
        "; an interactive step is not requeued, and this node does not tell Slurm which \
         shards MIG can build (slurm.holds is off), so running it again may land on the same \
         GPU{room}: submit it with sbatch, which is requeued instead of failing, or ask the \
         administrator to turn on slurm.holds (docs/slurm-integration.md §9)"
    )
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
            told_why(cx, req, job, &slurm_id, profile);
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

/// Tells the requeued job's user why (issue 56): its next run prints
/// [`requeue_told`]'s line in its output (the note waits in the ledger for the
/// job's next allocate), and its `AdminComment` gets a
/// [`crate::usage::REQUEUE_PREFIX`] word now, in the background, so that
/// `scontrol show job` says it while the job waits to start again.
fn told_why(
    cx: &Cx<'_>,
    req: &AllocateRequest,
    job: u64,
    slurm_id: &str,
    profile: &'static ProfileSpec,
) {
    let told = requeue_told(req, profile);
    cx.books
        .node(|l| l.requeue_notes.insert(job, told.line(None)));
    if !cx.cfg().accounting.admin_comment {
        return;
    }
    let slurm = cx.live.slurm.clone();
    let (name, word) = (slurm_id.to_string(), told.to_word());
    tokio::task::spawn_blocking(move || {
        let done = slurm.job_comment(job).and_then(|c| {
            let existing = c.map(|c| c.admin_comment).unwrap_or_default();
            slurm.set_admin_comment(&name, &crate::usage::merge_requeue(&existing, &word))
        });
        if let Err(e) = done {
            tracing::warn!(job, "AdminComment not told why the job was requeued: {e}");
        }
    });
}

/// Why a batch job gave way to an interactive step: its `AdminComment`
/// word and, through [`Requeued::line`], the line its next run prints.
pub(super) fn requeue_told(req: &AllocateRequest, profile: &'static ProfileSpec) -> Requeued {
    Requeued::gave_way(
        super::context::unix_now(),
        req.job_id,
        req.gpu,
        &profile.name(),
    )
}

/// A batch job that got no instance in time is requeued by the SPANK
/// plugin (`requeue=yes`, the default) on this answer: its user is told
/// why (issue 56), by [`tell_batch_requeue`].
pub(super) fn batch_no_fit_told(
    cx: &Cx<'_>,
    req: &AllocateRequest,
    reason: &str,
    profile: Option<&'static ProfileSpec>,
) {
    let told = Requeued::no_room(
        super::clock::unix_now(),
        req.gpu,
        &profile.map_or("an_instance".to_string(), ProfileSpec::name),
    );
    tell_batch_requeue(cx, req, &told, reason);
}

/// A batch job refused at once because its scheduling pass does not fit
/// its GPU together (the allocate's `burst` rule, issue 56 item 2): the
/// plugin requeues it on this answer, and its user is told why as for
/// [`batch_no_fit_told`].
pub(super) fn pass_refusal_told(
    cx: &Cx<'_>,
    req: &AllocateRequest,
    reason: &str,
    profile: &'static ProfileSpec,
) {
    let told = Requeued::pass_refused(super::clock::unix_now(), req.gpu, &profile.name());
    tell_batch_requeue(cx, req, &told, reason);
}

/// Tells the user of a batch job that the plugin requeues on this answer
/// why: its next run prints the line of `told` with smartmigd's `reason`
/// (it waits in the ledger for the job's next allocate; a job that was not
/// requeued never asks again), and its `AdminComment` gets the requeue
/// word now, while it still runs, which Slurm keeps through the requeue. A
/// step that is not the batch step is not requeued: nothing to tell.
fn tell_batch_requeue(cx: &Cx<'_>, req: &AllocateRequest, told: &Requeued, reason: &str) {
    if req.step.is_some_and(|s| s != BATCH_STEP) {
        return;
    }
    let job = req.job_id;
    cx.books
        .node(|l| l.requeue_notes.insert(job, told.line(Some(reason))));
    if !cx.cfg().accounting.admin_comment || !cx.cfg().slurm.enabled {
        return;
    }
    let slurm = cx.live.slurm.clone();
    let word = told.to_word();
    tokio::task::spawn_blocking(move || {
        let done = slurm.job_comment(job).and_then(|c| {
            let existing = c.map(|c| c.admin_comment).unwrap_or_default();
            slurm.set_admin_comment(
                &job.to_string(),
                &crate::usage::merge_requeue(&existing, &word),
            )
        });
        if let Err(e) = done {
            tracing::warn!(
                job,
                "AdminComment not told why the job gets no instance: {e}"
            );
        }
    });
}
