//! Agreement with Slurm: the one queue read per epoch, the reaper that
//! frees what ended jobs still hold, `smartmig reconcile`, resuming a node
//! the plugin drained, the start-up check of Slurm's GPU order, and the
//! out-of-memory requeue (only a FAILED job, its shard request raised when
//! the restart needs more compute slices), and where the queue comes from:
//! the cluster summary ([`crate::summary`]) or Slurm itself.

use super::*;
use crate::config::SummaryFallback;
use crate::slurm::NodeInfo;
use crate::summary::NodeSummary;
use smartmig_client::protocol::ClusterViewStatus;

/// Refuses to start when Slurm's GPU i (by device name, from `slurmd -G`)
/// is another device than the backend's GPU i: every job would get an
/// instance on a GPU other than the one Slurm gave it. When slurmd cannot
/// tell (not installed, not root), the check is skipped with a warning.
pub(super) fn check_gpu_order(
    backend: &dyn Backend,
    slurm: &dyn SlurmClient,
    node: &str,
) -> Result<(), StartError> {
    let gres = match slurm.gres_gpus(node) {
        Ok(g) if !g.is_empty() => g,
        Ok(_) => {
            tracing::warn!(
                node,
                "slurmd -G lists no gpu GRES for this node; GPU order not checked"
            );
            return Ok(());
        }
        Err(e) => {
            tracing::warn!(node, "cannot check Slurm's GPU order ({e}); make sure gres.conf lists the GPUs in NVML order");
            return Ok(());
        }
    };
    let typed: Vec<&str> = gres.iter().filter_map(|g| g.mig_type.as_deref()).collect();
    if !typed.is_empty() {
        return Err(StartError::GpuOrder(format!(
            "Slurm's gpu GRES on {node} are MIG devices (Type={}): the node still runs a static MIG setup. \
             Keep mode = \"advise\" there, or drain the node and change its gres.conf to one gpu and one \
             shard per compute slice for each GPU (docs/slurm-integration.md §1 and §2d) before running \
             smartmigd in dynamic or confirm mode",
            typed.join(",")
        )));
    }
    let ours: Vec<(u32, Option<u32>)> = backend.gpus().iter().map(|g| (g.index, g.minor)).collect();
    let minor_of = |file: &str| {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = std::fs::metadata(file).ok()?;
        meta.file_type()
            .is_char_device()
            .then(|| libc::minor(meta.rdev() as libc::dev_t))
    };
    let mismatches = crate::slurm::gpu_order_mismatches(&ours, &gres, minor_of);
    if mismatches.is_empty() {
        tracing::info!(
            node,
            gpus = gres.len(),
            "Slurm's GPU order matches the backend's"
        );
        Ok(())
    } else {
        Err(StartError::GpuOrder(mismatches.join("; ")))
    }
}

/// Why an out-of-memory requeue did not happen.
pub(super) enum RequeueEnd {
    /// The job ended otherwise than FAILED (cancelled, timed out): it
    /// must stay ended.
    Skipped(String),
    /// Slurm refused or did not answer within the time allowed.
    Failed(String),
}

/// When a job is ready to be requeued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RequeueWhen {
    /// After an out-of-memory failure: once it ended FAILED (a job that was
    /// cancelled or timed out after writing the marker stays ended).
    Failed,
    /// An early restart: while it runs (`scontrol requeue` kills it); a job
    /// that ended meanwhile is left alone.
    Running,
}

/// The shortest time between two queue reads made for waiting allocates.
pub(super) const QUEUE_REFRESH: Duration = Duration::from_secs(2);

/// Who returned instances since the daemon started.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReleaseCounts {
    /// Releases sent by the plugin's job epilog.
    pub epilog: u64,
    /// Instances the reaper freed because Slurm said the job had ended
    /// and no release arrived.
    pub reaped: u64,
}

impl ReleaseCounts {
    /// The epilog seems not to run: the reaper had to free instances and
    /// no epilog release ever arrived (slurmd not restarted after the
    /// plugin was added to plugstack.conf).
    pub fn epilog_missing(&self) -> bool {
        self.reaped > 0 && self.epilog == 0
    }
}

impl Daemon {
    /// Requeues `job_id` in the background: `scontrol requeue` is retried
    /// every second for up to `timeout_s` (Slurm refuses it while the job
    /// is still completing, i.e. while its epilog, which sent the release,
    /// runs). Success or failure is logged and kept as an event.
    ///
    /// `raise_to`: the compute slices the restart will get when that is
    /// more than the job's shard request; the request is raised to it
    /// (`scontrol update JobId=.. Gres=shard:K`) once the job is pending.
    /// `when`: the state the job must be in to be requeued.
    pub(super) fn spawn_requeue(
        &self,
        job_id: u64,
        timeout_s: u64,
        raise_to: Option<u8>,
        when: RequeueWhen,
    ) {
        let slurm = self.slurm();
        let memory = self.memory.clone();
        let mut stop = self.shutdown.subscribe();
        tokio::spawn(async move {
            let t0 = Instant::now();
            let limit = Duration::from_secs(timeout_s);
            let mut attempts = 0u32;
            let outcome = loop {
                // Only a job that ended FAILED is requeued: one that was
                // cancelled or hit its time limit after writing the marker
                // must stay ended.
                let s = slurm.clone();
                let queued = tokio::task::spawn_blocking(move || s.queue())
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .and_then(|q| q.job(job_id).cloned());
                let ready = match when {
                    RequeueWhen::Failed => JobState::Failed,
                    RequeueWhen::Running => JobState::Running,
                };
                let last = match queued.as_ref().map(|j| j.state) {
                    Some(st) if st == ready => {
                        attempts += 1;
                        let s = slurm.clone();
                        let id = queued
                            .as_ref()
                            .map_or(job_id.to_string(), super::super::slurm::QueuedJob::slurm_id);
                        match tokio::task::spawn_blocking(move || s.requeue(&id)).await {
                            Ok(Ok(())) => break Ok(()),
                            Ok(Err(e)) => e.to_string(),
                            Err(e) => format!("requeue task failed: {e}"),
                        }
                    }
                    Some(
                        st @ (JobState::Cancelled
                        | JobState::Timeout
                        | JobState::Completed
                        | JobState::Failed
                        | JobState::OtherEnded),
                    ) => {
                        break Err(RequeueEnd::Skipped(match when {
                            RequeueWhen::Failed => {
                                format!("the job ended {st:?}, not FAILED: not requeued")
                            }
                            RequeueWhen::Running => {
                                format!(
                                    "the job ended {st:?} before its early restart: not requeued"
                                )
                            }
                        }))
                    }
                    Some(st) => format!("the job is still {st:?}"),
                    None => "the job is not in squeue's answer".to_string(),
                };
                if t0.elapsed() >= limit {
                    break Err(RequeueEnd::Failed(last));
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => break Err(RequeueEnd::Failed(format!("smartmigd shut down first (last error: {last})"))),
                }
            };
            let outcome = match (outcome, raise_to) {
                (Ok(()), Some(k)) => {
                    let s = slurm.clone();
                    match tokio::task::spawn_blocking(move || s.set_job_shards(job_id, k)).await {
                        Ok(Ok(())) => {
                            tracing::info!(
                                job = job_id,
                                shards = k,
                                "shard request raised for the larger profile"
                            );
                            Ok(())
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(job = job_id, shards = k, "requeued, but its shard request could not be raised ({e}); Slurm bills fewer shards than the instance it will get");
                            Ok(())
                        }
                        Err(e) => Err(RequeueEnd::Failed(format!("shard update task failed: {e}"))),
                    }
                }
                (o, _) => o,
            };
            let (decision, message) = match outcome {
                Ok(()) => {
                    tracing::info!(
                        job = job_id,
                        attempts,
                        ?when,
                        "requeued for running out of GPU memory; its next start gets a larger profile"
                    );
                    (
                        OomDecision::Requeued,
                        format!("scontrol requeue {job_id} succeeded (attempt {attempts})"),
                    )
                }
                Err(RequeueEnd::Skipped(why)) => {
                    tracing::info!(job = job_id, ?when, "{why}");
                    (OomDecision::NotRequeued, why)
                }
                Err(RequeueEnd::Failed(e)) => {
                    tracing::error!(
                        job = job_id,
                        attempts,
                        ?when,
                        "could not requeue the job for running out of GPU memory: {e}"
                    );
                    (
                        OomDecision::RequeueFailed,
                        format!(
                            "scontrol requeue {job_id} failed after {attempts} attempt(s): {e}"
                        ),
                    )
                }
            };
            let mut m = memory
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            m.on_requeue_result(job_id, decision, message, unix_now());
            if let Err(e) = m.save() {
                tracing::error!(job = job_id, "memory estimates not saved: {e}");
            }
        });
    }

    /// Whether the queue was read longer than [`QUEUE_REFRESH`] ago.
    pub(super) fn queue_is_stale(&self) -> bool {
        if !self.config().slurm.enabled {
            return false;
        }
        let last = *self
            .queue_read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        last.is_none_or(|t| t.elapsed() >= QUEUE_REFRESH)
    }

    /// The queue as this node sees it, with the Unix second it was read
    /// (an assignment made in or after that second may be missing from
    /// it): from the cluster summary when a fresh one is there (no call to
    /// Slurm), else by one `squeue --json` call (`fallback = "squeue"`) or
    /// not at all (`"hold"`). `None` (and a warning) when Slurm queries are
    /// off or fail.
    pub(super) async fn read_queue(&self) -> Option<(QueueSnapshot, u64)> {
        let cfg = self.config();
        if !cfg.slurm.enabled {
            return None;
        }
        // A small file, but on a shared file system: off the async workers.
        let summary = tokio::task::block_in_place(|| self.read_summary(&cfg));
        if summary.is_err() {
            if cfg.cluster.fallback == SummaryFallback::Hold {
                self.metrics.queue_read("none", None);
                return None;
            }
            self.metrics.queue_read("squeue", None);
        }
        *self
            .queue_read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        if let Ok(s) = summary {
            let q = s.snapshot();
            self.remember_job_times(&q);
            return Some((q, s.generated_at));
        }
        let t0 = unix_now();
        let slurm = self.slurm();
        match tokio::task::spawn_blocking(move || slurm.queue()).await {
            Ok(Ok(q)) => {
                self.remember_job_times(&q);
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

    /// Keeps each listed job's deadline and time limit for the placement
    /// rule: Slurm's `--deadline`, else the end of a running job's time
    /// limit.
    fn remember_job_times(&self, q: &QueueSnapshot) {
        let times = q
            .jobs
            .iter()
            .map(|j| {
                let end = (j.end_time > 0 && j.time_limit_s.is_some()).then_some(j.end_time);
                let deadline = j.deadline.or(end).map_or(f64::INFINITY, |d| d as f64);
                (
                    j.job_id,
                    JobTimes {
                        deadline,
                        time_limit_s: j.time_limit_s,
                    },
                )
            })
            .collect();
        *self
            .job_times
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = times;
        *self
            .array_names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = q
            .jobs
            .iter()
            .filter(|j| j.array_task.is_some())
            .map(|j| (j.job_id, j.slurm_id()))
            .collect();
    }

    pub(super) fn release_counts_mut(&self, f: impl FnOnce(&mut ReleaseCounts)) {
        f(&mut self
            .releases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    /// Releases the instances of jobs that `queue` (read at Unix second
    /// `t0`) shows ended or no longer lists, e.g. when the epilog's release
    /// never arrived. An assignment made in or after `t0` is never touched
    /// (its job may not be in the answer yet). Each release is logged; a
    /// reaper release while no epilog release was ever seen is an error
    /// in the log (the plugin's job_epilog does not run).
    pub async fn reap_ended_jobs(&self, queue: &QueueSnapshot, t0: u64) -> Vec<u64> {
        let mut released = Vec::new();
        let live = queue.live();
        let now = unix_now();
        for slot in &self.slots {
            let mut st = slot.state.lock().await;
            let ended: Vec<u64> = st
                .book
                .instances
                .iter()
                .filter_map(|i| i.job.as_ref())
                .filter(|a| a.since < t0 && !live.contains(&a.job_id))
                .map(|a| a.job_id)
                .collect();
            if ended.is_empty() {
                continue;
            }
            st.tick_energy();
            for &job in &ended {
                st.book.release(job, now);
                let state = queue
                    .job(job)
                    .map_or("no longer listed".to_string(), |j| format!("{:?}", j.state));
                tracing::info!(
                    gpu = slot.index,
                    job,
                    state = %state,
                    "job ended in Slurm but its release never arrived; instance released"
                );
            }
            if let Err(e) = tokio::task::block_in_place(|| self.journal.save(&st.book)) {
                tracing::error!(gpu = slot.index, "release of ended jobs not journaled: {e}");
            }
            drop(st);
            {
                let mut m = self.memory();
                for &job in &ended {
                    let policy = OomPolicy {
                        requeue: false,
                        max_retries: 0,
                        slurm_enabled: false,
                    };
                    m.on_release(job, None, false, None, policy, now);
                }
            }
            let mut counts = ReleaseCounts::default();
            self.release_counts_mut(|c| {
                c.reaped += ended.len() as u64;
                counts = *c;
            });
            self.metrics.reaped(ended.len() as u64);
            if counts.epilog_missing() {
                tracing::error!(
                    reaped = counts.reaped,
                    "no release ever came from the SPANK plugin's job_epilog: instances are only freed when \
                     smartmigd sees the job gone from squeue, so back-to-back jobs may wait or fail. \
                     Restart slurmd after adding the plugin to plugstack.conf (docs/slurm-integration.md)"
                );
            }
            slot.released.notify_waiters();
            released.extend(ended);
        }
        released
    }

    /// The admin's `smartmig reconcile`: read the queue now and release
    /// what ended jobs still hold.
    pub async fn reconcile(&self) -> Result<ReconcileReply, ErrorBody> {
        if !self.config().slurm.enabled {
            return Err(ErrorBody::new(
                ErrorKind::InvalidRequest,
                "Slurm queries are disabled (slurm.enabled = false): nothing to reconcile with; \
                 release a job's instance with `smartmig release JOBID`",
            ));
        }
        let Some((queue, t0)) = self.read_queue().await else {
            return Err(ErrorBody::new(
                ErrorKind::Backend,
                "cannot read the Slurm queue (see smartmigd's log); nothing released",
            ));
        };
        let mut released_jobs = self.reap_ended_jobs(&queue, t0).await;
        released_jobs.sort_unstable();
        tracing::info!(?released_jobs, "reconciled with Slurm's queue on request");
        Ok(ReconcileReply { released_jobs })
    }

    /// What `sinfo --json` says of this node (one call per epoch serves
    /// both the resume below and the layout features); `None`, logged,
    /// when Slurm does not answer.
    pub(super) async fn read_node(&self) -> Option<NodeInfo> {
        // The summary read this epoch carries the node's state.
        if let Some(info) = self.view_source().node_info.clone() {
            return Some(info);
        }
        let slurm = self.slurm();
        let node = self.node.clone();
        match tokio::task::spawn_blocking(move || slurm.node(&node)).await {
            Ok(Ok(info)) => Some(info),
            Ok(Err(e)) => {
                tracing::warn!(node = %self.node, "cannot read the node's state from Slurm: {e}");
                None
            }
            Err(e) => {
                tracing::error!("node state task failed: {e}");
                None
            }
        }
    }

    /// The plugin drains the node when it cannot reach smartmigd; this
    /// daemon is up and serving, so it undoes such a drain (and only
    /// such a drain: an admin's reason is left alone).
    pub async fn resume_if_drained_by_us(&self, info: &NodeInfo) {
        if !info.drained_by_smartmig() {
            return;
        }
        let slurm = self.slurm();
        let node = self.node.clone();
        match tokio::task::spawn_blocking(move || slurm.resume(&node)).await {
            Ok(Ok(())) => tracing::warn!(node = %self.node, reason = %info.reason,
                "node was drained by smartmig; smartmigd is serving again: node resumed"),
            Ok(Err(e)) => tracing::warn!(node = %self.node, "cannot resume the node: {e}"),
            Err(e) => tracing::error!("node resume task failed: {e}"),
        }
    }
}

/// Where the node's view of the queue came from last, for status,
/// metrics and `read_node`.
#[derive(Clone, Debug, Default)]
pub(super) struct ViewSource {
    /// The last fresh summary's figures (`None`: none usable).
    pub summary: Option<SummaryFigures>,
    /// Why the summary could not be used (`None`: it was, or never tried).
    pub problem: Option<String>,
    /// The node's Slurm state from the summary (cleared without one).
    pub node_info: Option<NodeInfo>,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct SummaryFigures {
    pub generated_at: u64,
    pub nodes: u32,
    pub claimed: u32,
    pub pending_cluster: u32,
}

impl Daemon {
    pub(super) fn view_source(&self) -> std::sync::MutexGuard<'_, ViewSource> {
        self.view_source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads `<summary_dir>/<node>.json` and checks it; records the
    /// outcome (logged when it changes). `Err` when it cannot be used.
    fn read_summary(&self, cfg: &Config) -> Result<NodeSummary, ()> {
        let path = cfg.cluster.summary_dir.join(format!("{}.json", self.node));
        let now = unix_now();
        let bytes = std::fs::read(&path);
        // No file at all: no publisher feeds this node (a lone node, or a
        // site without `smartmig publish`), which is no fault.
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
                s.check(&self.node, now, cfg.cluster.stale_epochs, 2 * cfg.epoch_s)
                    .map(|()| s)
                    .map_err(|why| format!("{}: {why}", path.display()))
            });
        let mut v = self.view_source();
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
                self.metrics
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
    }

    /// The `cluster` section of a status reply.
    pub(super) fn cluster_status(&self, cfg: &Config) -> ClusterViewStatus {
        let v = self.view_source();
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
}
