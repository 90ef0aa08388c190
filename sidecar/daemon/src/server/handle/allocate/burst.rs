//! The allocates of one scheduling pass on a GPU, decided as a set
//! (issue 56, item 2).
//!
//! Slurm counts shards; one pass can fill a GPU's free shards with jobs
//! that no MIG layout holds together (3 + 3 + 1 on an empty A100-40GB: the
//! two 3g take all 8 memory slices). Served one at a time, the job left
//! over waited `allocate_wait_s` for room only a neighbour's end could
//! make, and was requeued after all, its user told nothing until then.
//! Here an allocate looks at its whole pass (its mates,
//! [`crate::server::books::Ledger::pass_mates`], plus itself, beside the
//! GPU's busy instances): the shared rule
//! ([`crate::mig::Geometry::turned_away`]) names the jobs that cannot be
//! built with the rest; the others leave room only for each other, so
//! those that fit together are built together, in any arrival order.
//!
//! The batch job turned away is refused at once (`no_fit`, so the plugin
//! requeues it) when waiting cannot help as far as smartmigd can know:
//! every busy instance on the GPU and every mate runs, by its Slurm time
//! limit, past the wait. Otherwise (a job without a known time limit may
//! end within the wait), and for an interactive step (it cannot be
//! requeued; `room` may make room for it), it is served as before if it
//! can be, beside all its mates. (Measured in the simulator on the busy
//! mix's job list: making it wait instead while the rest are built
//! requeued more, docs/slurm-integration.md §9.)

use super::super::super::books::GpuState;
use super::super::super::context::{unix_now, Cx};
use super::super::super::queue;
use crate::allocate::Need;
use crate::mig::{select_profile, Mix, ProfileSpec};
use crate::protocol::{AllocateRequest, BATCH_STEP};

/// What the pass of an allocate's GPU asks of it.
pub(super) enum Pass {
    /// Served, if it can be, leaving room for these mates: the pass's
    /// other jobs, less those it turns away.
    Place(Mix),
    /// Turned away with nothing ending within the wait: refused now, for
    /// this reason.
    Refuse(String, &'static ProfileSpec),
}

/// The pass of `req` on its GPU (locked in `st`), needing `need`: the
/// mates it leaves room for, and whether it is refused now (module docs).
/// `since`: the start of the pass window (Unix seconds).
pub(super) fn decide(
    cx: &Cx<'_>,
    st: &GpuState,
    req: &AllocateRequest,
    need: Need,
    since: u64,
) -> Pass {
    let book = &st.book;
    let spec = book.geometry.spec;
    let horizon = unix_now() + cx.cfg().allocate_wait_s + queue::QUEUE_REFRESH.as_secs();
    let busy_jobs = book.holders();
    let (mates, all_held) = cx.books.node(|l| {
        let mates = l.pass_mates(book, req.job_id, since);
        let held = busy_jobs
            .iter()
            .chain(mates.iter().map(|m| &m.0))
            .all(|&job| l.held_past(job, horizon));
        (mates, held)
    });
    let all = Pass::Place(Mix::of(mates.iter().map(|m| m.1)));
    let Ok(mine) = select_profile(spec, need.slices, need.memory_gb) else {
        // The plan refuses it as such.
        return all;
    };
    let mut pass: Vec<(u64, u8)> = mates.clone();
    pass.push((req.job_id, mine.shape.compute));
    pass.sort_unstable();
    let away: Vec<u64> = book
        .geometry
        .turned_away(book.busy(), &pass.iter().map(|p| p.1).collect::<Vec<_>>())
        .into_iter()
        .map(|i| pass[i].0)
        .collect();
    if away.is_empty() {
        return all;
    }
    let kept = Mix::of(mates.iter().filter(|m| !away.contains(&m.0)).map(|m| m.1));
    if !away.contains(&req.job_id) {
        return Pass::Place(kept);
    }
    if req.step.is_some_and(|s| s != BATCH_STEP) || !all_held {
        return all;
    }
    let took = what_took(st, &mates, &away, since);
    let (model, p) = (book.geometry.spec.id, mine.name());
    let fits_not = format!(
        "no MIG layout of GPU {gpu} ({model}) holds this job's {p} beside what Slurm placed there \
         ({took}): Slurm filled the GPU's free shards with jobs that cannot all be built together",
        gpu = req.gpu
    );
    let reason = format!(
        "{fits_not}, and by their time limits none of them ends within allocate_wait_s ({w} s); \
         this job is refused now instead of waiting, and a batch job goes back to Slurm's queue \
         (requeued) to run later",
        w = cx.cfg().allocate_wait_s
    );
    tracing::warn!(
        job = req.job_id,
        gpu = req.gpu,
        held_by = ?busy_jobs,
        pass = ?pass,
        turned_away = ?away,
        "refused at once: {reason}"
    );
    Pass::Refuse(reason, mine)
}

/// What took the room, for the sentence the turned-away job's user reads
/// (its step's error, then its next run's output): profiles only, as in
/// [`crate::allocate::GpuBook::no_fit_reason`] (other users' job ids stay
/// private; the daemon's log names the jobs).
fn what_took(st: &GpuState, mates: &[(u64, u8)], away: &[u64], since: u64) -> String {
    let book = &st.book;
    let g = book.geometry;
    let name =
        |k: u8| select_profile(g.spec, k, None).map_or_else(|_| format!("{k}g"), ProfileSpec::name);
    let mut took: Vec<String> = book
        .instances
        .iter()
        .filter_map(|i| i.job.as_ref().map(|a| (i, a)))
        .map(|(i, a)| {
            let d = g.spot(i.placement).describe();
            if a.since >= since {
                format!("{d} (same scheduling pass)")
            } else {
                format!("{d} (busy)")
            }
        })
        .collect();
    took.extend(
        mates
            .iter()
            .filter(|m| !away.contains(&m.0))
            .map(|m| format!("{} (same scheduling pass, starting)", name(m.1))),
    );
    if took.is_empty() {
        "nothing else".to_string()
    } else {
        took.join(", ")
    }
}
