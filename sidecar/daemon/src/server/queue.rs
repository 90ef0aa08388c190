//! Where the node's view of Slurm comes from: the cluster summary
//! ([`crate::summary`], no call to Slurm) when a fresh one is there, else
//! one `squeue --json` (`fallback = "squeue"`) or nothing (`"hold"`); the
//! node's own state (`sinfo`, or the summary), and resuming a node the
//! plugin drained.

use std::time::{Duration, Instant};

use super::books::{SummaryFigures, ViewSource};
use super::context::{unix_now, Cx};
use crate::config::{Config, SummaryFallback};
use crate::protocol::ClusterViewStatus;
use crate::slurm::{NodeInfo, QueueSnapshot};
use crate::summary::NodeSummary;

/// The shortest time between two queue reads made for waiting allocates.
pub(super) const QUEUE_REFRESH: Duration = Duration::from_secs(2);

/// Whether the queue was read longer than [`QUEUE_REFRESH`] ago.
pub(super) fn is_stale(cx: &Cx<'_>) -> bool {
    if !cx.cfg().slurm.enabled {
        return false;
    }
    let last = cx.books.node(|l| l.queue_read);
    last.is_none_or(|t| t.elapsed() >= QUEUE_REFRESH)
}

/// The Unix second from which a job Slurm started may still belong to a
/// scheduling pass whose allocates are on their way (`allocate_wait_s` +
/// [`QUEUE_REFRESH`]): the window of the pass's mates and of young jobs.
pub(super) fn pass_window_start(cfg: &Config) -> u64 {
    unix_now().saturating_sub(cfg.allocate_wait_s + QUEUE_REFRESH.as_secs())
}

/// Whether a queue read started at or after `t` (it then shows every job
/// Slurm started before `t`).
pub(super) fn read_since(cx: &Cx<'_>, t: Instant) -> bool {
    cx.books.node(|l| l.queue_read.is_some_and(|r| r >= t))
}

/// The queue as this node sees it, with the Unix second it was read (an
/// assignment made in or after that second may be missing from it): from
/// the cluster summary when a fresh one is there (no call to Slurm), else
/// by one `squeue --json` call (`fallback = "squeue"`) or not at all
/// (`"hold"`). `None` (and a warning) when Slurm queries are off or fail.
pub(super) async fn read(cx: &Cx<'_>) -> Option<(QueueSnapshot, u64)> {
    let cfg = cx.cfg();
    if !cfg.slurm.enabled {
        return None;
    }
    // A small file, but on a shared file system: off the async workers.
    let summary = tokio::task::block_in_place(|| read_summary(cx, cfg));
    if summary.is_err() {
        if cfg.cluster.fallback == SummaryFallback::Hold {
            cx.svc.metrics.queue_read("none", None);
            return None;
        }
        cx.svc.metrics.queue_read("squeue", None);
    }
    cx.books.node(|l| l.queue_read = Some(Instant::now()));
    if let Ok(s) = summary {
        let q = s.snapshot();
        remember(cx, &q);
        return Some((q, s.generated_at));
    }
    let t0 = unix_now();
    let slurm = cx.live.slurm.clone();
    match tokio::task::spawn_blocking(move || slurm.queue()).await {
        Ok(Ok(q)) => {
            remember(cx, &q);
            Some((q, t0))
        }
        Ok(Err(e)) => {
            tracing::warn!("cannot read the Slurm queue ({e}); no instance released, no pending demand this epoch");
            None
        }
        Err(e) => {
            tracing::error!("the Slurm queue reader failed: {e}");
            None
        }
    }
}

/// What the books keep of a queue read: the jobs' times, and the shard
/// jobs running on this node.
fn remember(cx: &Cx<'_>, q: &QueueSnapshot) {
    cx.books.node(|ledger| {
        ledger.remember_job_times(q);
        ledger.remember_shard_jobs(q, &cx.node.name);
    });
}

/// Whether the last queue read already shows `job_id` running here: when
/// it does not, it predates the scheduling pass that started the job, and
/// so misses the others that pass started.
pub(super) fn shows_running(cx: &Cx<'_>, job_id: u64) -> bool {
    cx.books
        .node(|l| l.shard_jobs.iter().any(|j| j.job_id == job_id))
}

/// Reads `<summary_dir>/<node>.json` and checks it; records the outcome
/// (logged when it changes). `Err` when it cannot be used.
fn read_summary(cx: &Cx<'_>, cfg: &Config) -> Result<NodeSummary, ()> {
    let node = &cx.node.name;
    let path = cfg.cluster.summary_dir.join(format!("{node}.json"));
    let now = unix_now();
    let bytes = std::fs::read(&path);
    // No file at all: no publisher feeds this node (a lone node, or a site
    // without `smartmig publish`), which is no fault.
    let missing = bytes
        .as_ref()
        .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
    let read = bytes
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|b| {
            serde_json::from_slice::<NodeSummary>(&b)
                .map_err(|e| format!("{}: not a cluster summary: {e}", path.display()))
        })
        .and_then(|s| {
            s.check(node, now, cfg.cluster.stale_epochs, 2 * cfg.epoch_s)
                .map(|()| s)
                .map_err(|why| format!("{}: {why}", path.display()))
        });
    cx.books.node(|ledger| {
        let v = &mut ledger.view_source;
        match read {
            Ok(s) => {
                if v.problem.take().is_some() || v.summary.is_none() {
                    tracing::info!(path = %path.display(), nodes = s.nodes,
                    "reading the cluster summary instead of asking Slurm");
                }
                v.summary = Some(SummaryFigures {
                    generated_at: s.generated_at,
                    nodes: s.nodes,
                    claimed: s.claimed() as u32,
                    pending_cluster: s.pending_by_shards.iter().sum(),
                });
                v.node_info = Some(s.info.clone());
                cx.svc
                    .metrics
                    .queue_read("summary", Some(now.saturating_sub(s.generated_at)));
                Ok(s)
            }
            Err(why) => {
                if v.problem.as_deref() != Some(why.as_str()) {
                    let then = match cfg.cluster.fallback {
                        SummaryFallback::Squeue => "asking Slurm directly (squeue, sinfo)",
                        SummaryFallback::Hold => "holding the layout (cluster.fallback = \"hold\")",
                    };
                    if missing {
                        tracing::info!("no cluster summary ({why}); {then}");
                    } else {
                        tracing::warn!("no usable cluster summary ({why}); {then}");
                    }
                }
                v.summary = None;
                v.node_info = None;
                v.problem = Some(why);
                Err(())
            }
        }
    })
}

/// The `cluster` section of a status reply.
pub(super) fn cluster_status(v: &ViewSource, cfg: &Config) -> ClusterViewStatus {
    let now = unix_now();
    ClusterViewStatus {
        source: match (&v.summary, cfg.slurm.enabled, cfg.cluster.fallback) {
            (_, false, _) => "none",
            (Some(_), _, _) => "summary",
            (None, _, SummaryFallback::Squeue) => "squeue",
            (None, _, SummaryFallback::Hold) => "hold",
        }
        .into(),
        summary_dir: cfg.cluster.summary_dir.display().to_string(),
        age_s: v.summary.map(|s| now.saturating_sub(s.generated_at)),
        nodes: v.summary.map(|s| s.nodes),
        claimed: v.summary.map(|s| s.claimed),
        pending_cluster: v.summary.map(|s| s.pending_cluster),
        problem: v.problem.clone(),
    }
}

/// What `sinfo --json` says of this node (one call per epoch serves both
/// the resume below and the layout features); `None`, logged, when Slurm
/// does not answer. The summary read this epoch carries it, when there is
/// one.
pub(super) async fn node(cx: &Cx<'_>) -> Option<NodeInfo> {
    if let Some(info) = cx.books.node(|l| l.view_source.node_info.clone()) {
        return Some(info);
    }
    let slurm = cx.live.slurm.clone();
    let node = cx.node.name.clone();
    match tokio::task::spawn_blocking(move || slurm.node(&node)).await {
        Ok(Ok(info)) => Some(info),
        Ok(Err(e)) => {
            tracing::warn!(node = %cx.node.name, "cannot read the node's state from Slurm: {e}");
            None
        }
        Err(e) => {
            tracing::error!("node state task failed: {e}");
            None
        }
    }
}
