//! `mode = "advise"`: a dry run beside the site's own static MIG setup.
//!
//! Each epoch smartmigd re-reads the real layout from the backend, follows
//! the jobs that Slurm runs on it through native typed GRES
//! (`--gres=gpu:3g.20gb:1`), asks its policy as in dynamic mode and
//! records what the policy would do in `<state_dir>/advice.jsonl`
//! ([`AdviceRecord`], read back by `smartmig advise report`). It creates,
//! destroys and chowns nothing, publishes no node feature and refuses
//! `allocate` (docs/daemon.md, "Advise mode").

use super::context::{unix_now, Cx};
use smartmig_client::protocol::AdviseStatus;
use smartmig_core::formats::advice::AdviceRecord;

use super::books::{AdviseBook, Gpu, GpuState, Watched};
use super::services::append_rotating;
use super::view::Occupied;
use crate::allocate::GpuBook;
use crate::config::{Config, Mode};
use crate::mig::{Layout, SpotId};
use crate::policy::MAX_PLACEMENTS;
use crate::protocol::{PlanEffect, PlanStatus};
use crate::slurm::{JobState, QueueSnapshot};

/// The advice log rotates to `advice.jsonl.1` at this size.
const ADVICE_LOG_MAX_BYTES: u64 = 32 << 20;

/// True once: at the first advise epoch.
pub(super) fn first_epoch(cx: &Cx<'_>) -> bool {
    !cx.books
        .node(|l| std::mem::replace(&mut l.advise.started, true))
}

/// Appends `records` to the advice log (0600, rotated at 32 MiB).
fn record_advice(records: &[AdviceRecord], cfg: &Config) {
    let mut lines = String::new();
    for r in records {
        match serde_json::to_string(r) {
            Ok(l) => {
                lines.push_str(&l);
                lines.push('\n');
            }
            Err(e) => tracing::error!("advice record not encoded: {e}"),
        }
    }
    if lines.is_empty() {
        return;
    }
    let path = cfg.advice_log();
    if let Err(e) =
        tokio::task::block_in_place(|| append_rotating(&path, &lines, ADVICE_LOG_MAX_BYTES))
    {
        tracing::error!(path = %path.display(), "advice log not written: {e}");
    }
}

/// One advise epoch's observation: re-reads each GPU's real layout
/// (recording a change), follows the typed-GRES jobs running on this node
/// (recording those that ended) and says which instances they occupy.
/// `queue` is `None` when Slurm could not be read: then no job is taken
/// for ended.
pub(super) async fn observe(cx: &Cx<'_>, queue: Option<&QueueSnapshot>) -> Vec<Occupied> {
    let now = unix_now();
    let mut records = Vec::new();
    let mut layouts = Vec::new();
    for gpu in &cx.books.gpus {
        layouts.push(reread_layout(cx, gpu, now, &mut records).await);
    }
    let occupied = {
        cx.books.node(|ledger| {
            let book = &mut ledger.advise;
            if let Some(queue) = queue {
                follow_jobs(book, queue, &cx.node.name, now, &mut records);
            }
            occupy(book, &layouts)
        })
    };
    record_advice(&records, cx.cfg());
    occupied
}

/// Re-reads `gpu`'s instances from the backend into its book, records the
/// layout when it changed, and returns its instances' profile names.
async fn reread_layout(
    cx: &Cx<'_>,
    gpu: &Gpu,
    now: u64,
    records: &mut Vec<AdviceRecord>,
) -> Vec<(SpotId, String)> {
    let mut st = gpu.tx().await;
    match tokio::task::block_in_place(|| cx.svc.backend.list(gpu.index)) {
        Ok(real) => sync_instances(&mut st.book, &real, now),
        Err(e) => tracing::warn!(gpu = gpu.index, "advise: cannot read the layout: {e}"),
    }
    let (g, layout) = (st.book.geometry, st.book.layout());
    let names = st
        .book
        .instances
        .iter()
        .map(|i| (i.placement, g.spot(i.placement).profile.name()))
        .collect();
    cx.books.node(|ledger| {
        let book = &mut ledger.advise;
        if book.layouts.get(&gpu.index) != Some(&layout) {
            book.layouts.insert(gpu.index, layout);
            tracing::info!(gpu = gpu.index, layout = %g.picture(layout), "advise: the GPU's layout");
            records.push(AdviceRecord::Layout {
                t: now as f64,
                gpu: gpu.index,
                model: gpu.model,
                layout: layout.0,
                picture: g.picture(layout),
            });
        }
        names
    })
}

/// Follows the typed-GRES jobs `queue` shows running on `node`, and
/// records those that stopped running.
fn follow_jobs(
    book: &mut AdviseBook,
    queue: &QueueSnapshot,
    node: &str,
    now: u64,
    records: &mut Vec<AdviceRecord>,
) {
    for j in &queue.jobs {
        let (Some(profile), JobState::Running) = (&j.mig_profile, j.state) else {
            continue;
        };
        if !crate::slurm::names_node(&j.nodes, node) {
            continue;
        }
        book.watched.insert(
            j.job_id,
            Watched {
                profile: profile.clone(),
                submit: j.submit_time,
                start: j.start_time,
                end_time: j.end_time,
                time_limit_s: j.time_limit_s,
                deadline: j.deadline,
            },
        );
    }
    let ended: Vec<u64> = book
        .watched
        .keys()
        .copied()
        .filter(|id| queue.job(*id).is_none_or(|j| j.state != JobState::Running))
        .collect();
    for id in ended {
        let Some(w) = book.watched.remove(&id) else {
            continue;
        };
        // Slurm's end time once the job is done; else the first epoch
        // that did not see it running.
        let end = queue
            .job(id)
            .map(|j| j.end_time)
            .filter(|&e| e > 0 && e <= now && e >= w.start)
            .unwrap_or(now);
        book.jobs_recorded += 1;
        tracing::info!(job = id, profile = %w.profile, "advise: job ended; recorded");
        records.push(AdviceRecord::Job {
            job_id: id,
            gpu: None,
            profile: w.profile,
            submit: w.submit as f64,
            start: w.start as f64,
            end: end as f64,
            time_limit_s: w.time_limit_s,
            deadline: w.deadline.map(|d| d as f64),
        });
    }
}

/// Which instances the watched jobs occupy, per GPU. Slurm's gres index
/// of a MIG device is not the physical GPU, so a watched job occupies the
/// first free instance of its profile.
fn occupy(book: &AdviseBook, layouts: &[Vec<(SpotId, String)>]) -> Vec<Occupied> {
    let mut occupied: Vec<Occupied> = layouts
        .iter()
        .map(|_| Occupied {
            busy: Layout::EMPTY,
            until: [0.0; MAX_PLACEMENTS],
        })
        .collect();
    let mut watched: Vec<(&u64, &Watched)> = book.watched.iter().collect();
    watched.sort_by_key(|(id, _)| **id);
    for (id, w) in watched {
        let spot = layouts.iter().enumerate().find_map(|(k, names)| {
            names
                .iter()
                .find(|(p, name)| *name == w.profile && !occupied[k].busy.contains(*p))
                .map(|(p, _)| (k, *p))
        });
        match spot {
            Some((k, p)) => {
                occupied[k].busy = occupied[k].busy.with(p);
                occupied[k].until[p.0 as usize] = if w.end_time > 0 {
                    w.end_time as f64
                } else {
                    w.time_limit_s
                        .map_or(f64::INFINITY, |l| (w.start + l) as f64)
                };
            }
            None => tracing::warn!(job = id, profile = %w.profile,
                "advise: a job runs on a {} but no such instance is free here", w.profile),
        }
    }
    occupied
}

/// Records what the policy would do to `gpu` (its wish `target`, with the
/// watched jobs' instances `busy`) when the wish changed since the last
/// epoch. Nothing is carried out.
pub(super) fn advise(
    cx: &Cx<'_>,
    gpu: &Gpu,
    st: &GpuState,
    target: Layout,
    busy: Layout,
    effect: Option<PlanEffect>,
) {
    let g = st.book.geometry;
    let keeps: Vec<String> = busy
        .iter()
        .map(|p| g.spot(p).describe().to_string())
        .collect();
    let shown = super::view::reshape_shown(gpu.index, g, st.book.layout(), target, busy, keeps);
    let record = cx.books.node(|ledger| {
        let book = &mut ledger.advise;
        let Some(mut shown) = shown else {
            book.wishes.remove(&gpu.index);
            return None;
        };
        if book
            .wishes
            .get(&gpu.index)
            .is_some_and(|(l, _)| *l == target)
        {
            return None;
        }
        let now = unix_now();
        shown.created_at = now;
        shown.effect = effect;
        tracing::info!(gpu = gpu.index, from = %shown.from, to = %shown.to,
        "advise: the policy would reshape this GPU (nothing done)");
        let record = AdviceRecord::Advice {
            t: now as f64,
            gpu: gpu.index,
            policy: cx.decider.policy_name.clone(),
            from: shown.from.clone(),
            to: shown.to.clone(),
            to_layout: target.0,
            destroy: shown.destroy.clone(),
            create: shown.create.clone(),
            keeps_busy: shown.keeps_busy.clone(),
        };
        book.wishes.insert(gpu.index, (target, shown));
        book.advice_recorded += 1;
        Some(record)
    });
    if let Some(record) = record {
        record_advice(&[record], cx.cfg());
    }
}

/// The `advise` section of a status reply (advise mode only).
pub(super) fn status(book: &AdviseBook, cfg: &Config) -> Option<AdviseStatus> {
    if cfg.mode != Mode::Advise {
        return None;
    }
    let mut wishes: Vec<PlanStatus> = book.wishes.values().map(|(_, s)| s.clone()).collect();
    wishes.sort_by_key(|w| w.gpu);
    Some(AdviseStatus {
        log: cfg.advice_log().display().to_string(),
        watched_jobs: book.watched.len() as u32,
        jobs_recorded: book.jobs_recorded,
        advice_recorded: book.advice_recorded,
        wishes,
    })
}

/// Makes `book`'s instances those the backend lists (advise mode: an
/// admin's tool may reshape the GPU at any time; smartmigd never does).
fn sync_instances(book: &mut GpuBook, real: &[crate::backend::BackendInstance], now: u64) {
    let gone: Vec<String> = book
        .instances
        .iter()
        .filter(|i| !real.iter().any(|r| r.uuid == i.uuid))
        .map(|i| i.uuid.clone())
        .collect();
    for uuid in gone {
        book.remove_instance(&uuid);
    }
    for r in real {
        if book.find_uuid(&r.uuid).is_none() && book.geometry.fits(book.layout(), r.placement) {
            book.add_instance(r.placement, r.uuid.clone(), now);
        }
    }
}
