//! The node-wide part of the books ([`Ledger`]) and the records it keeps
//! for the layers above (advise mode's, where the queue came from, who
//! returned instances, Slurm's GPU order): their types live here, their
//! logic with the layer that fills them.

use std::collections::HashMap;
use std::time::Instant;

use crate::allocate::GpuBook;
use crate::mig::Layout;
use crate::placement::Contender;
use crate::plan::Plans;
use crate::protocol::{PlanStatus, WaitingJob};
use crate::slurm::{JobState, NodeInfo, QueueSnapshot};

/// An allocate waiting for room on a GPU.
pub(in crate::server) struct Waiter {
    pub(in crate::server) gpu: u32,
    pub(in crate::server) since: Instant,
    pub(in crate::server) uid: u32,
    pub(in crate::server) contender: Contender,
    /// The deadline and time limit the request carried (the plugin sends
    /// none: Slurm's come from the queue reads).
    pub(in crate::server) asked: (Option<i64>, Option<u64>),
}

/// What Slurm said about a job's time: its deadline (Slurm `--deadline`,
/// else the end of its time limit; infinite when neither) and time limit.
#[derive(Clone, Copy, Debug)]
pub(in crate::server) struct JobTimes {
    pub(in crate::server) deadline: f64,
    pub(in crate::server) time_limit_s: Option<u64>,
    /// Unix second Slurm ends a running job at its time limit (`None`:
    /// no time limit, or not running): the one end smartmigd knows in
    /// advance, for [`Ledger::held_past`].
    pub(in crate::server) end: Option<u64>,
}

/// The node-wide part of the books, behind one lock ([`super::Books::node`]).
#[derive(Default)]
pub(in crate::server) struct Ledger {
    /// Allocates waiting for room, for status and for the placement rule.
    pub(in crate::server) waiting: HashMap<u64, Waiter>,
    /// Deadlines and time limits of the jobs the last queue read showed
    /// (the placement rule orders waiting allocates by them).
    pub(in crate::server) job_times: HashMap<u64, JobTimes>,
    /// Slurm's `A_T` names of the array tasks the last queue read showed
    /// (job id -> name), for status.
    pub(in crate::server) array_names: HashMap<u64, String>,
    /// Reconfigurations pending (`mode = "confirm"`) and applied.
    pub(in crate::server) plans: Plans,
    /// What advise mode watches and last recorded (`mode = "advise"`).
    pub(in crate::server) advise: AdviseBook,
    /// Where the view of the queue came from last (summary or Slurm).
    pub(in crate::server) view_source: ViewSource,
    /// Releases that came from slurmd's job epilog versus from the reaper,
    /// to notice a plugin whose epilog never runs.
    pub(in crate::server) releases: ReleaseCounts,
    /// The plugin's `oom_requeue`, as the last allocate said.
    pub(in crate::server) plugin_oom_requeue: Option<bool>,
    /// When the queue was last read: an allocate that finds no room
    /// re-reads it at most every [`super::super::queue::QUEUE_REFRESH`].
    pub(in crate::server) queue_read: Option<Instant>,
    /// The shard jobs the last queue read showed running on this node:
    /// an allocate leaves room for those of its GPU that hold no instance
    /// yet ([`Ledger::pass_mates`]).
    pub(in crate::server) shard_jobs: Vec<ShardJob>,
    /// Slurm's GPU order against the backend's: checked at start, asked
    /// again until Slurm answers ([`super::super::gpu_order`]).
    pub(in crate::server) gpu_order: GpuOrderCheck,
    /// Why smartmigd requeued a job (to make room for an interactive
    /// step), for the job's next run to print in its output: given to its
    /// first allocate after the requeue ([`super::super::room`]).
    pub(in crate::server) requeue_notes: HashMap<u64, String>,
    /// Unix second each job that the last queue read shows running here
    /// released its instance (its epilog, or `smartmig release`): ended,
    /// though the read still lists it, so no longer a mate of anyone's
    /// pass ([`Ledger::pass_mates`]); a requeued run started later is.
    pub(in crate::server) released_at: HashMap<u64, u64>,
}

/// A shard job Slurm runs on this node, as the last queue read showed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::server) struct ShardJob {
    pub(in crate::server) job_id: u64,
    pub(in crate::server) gpu: u32,
    pub(in crate::server) shards: u8,
    /// Unix second Slurm started it.
    pub(in crate::server) start_time: u64,
}

impl Ledger {
    /// A job's deadline and time limit: as the client sent them, else from
    /// the last queue read (Slurm's `--deadline`, else the end of the time
    /// limit of a running job).
    pub(in crate::server) fn times_of(
        &self,
        job_id: u64,
        deadline: Option<i64>,
        time_limit_s: Option<u64>,
    ) -> JobTimes {
        let known = self.job_times.get(&job_id).copied();
        JobTimes {
            deadline: deadline
                .map(|d| d as f64)
                .or(known.map(|k| k.deadline))
                .unwrap_or(f64::INFINITY),
            time_limit_s: time_limit_s.or(known.and_then(|k| k.time_limit_s)),
            end: known.and_then(|k| k.end),
        }
    }

    /// A waiting allocate as the placement rule sees it now: its times as
    /// the last queue read knows them (it may have come after it started
    /// waiting).
    fn contender_now(&self, w: &Waiter) -> Contender {
        let t = self.times_of(w.contender.job_id, w.asked.0, w.asked.1);
        Contender {
            deadline: t.deadline,
            time_limit_s: t.time_limit_s,
            ..w.contender.clone()
        }
    }

    /// The jobs an allocate of `except` on `book`'s GPU must leave room
    /// for ([`crate::mig::Geometry::choose_spot`]): the other allocates
    /// waiting there, and the shard jobs Slurm started there since
    /// `since` (Unix seconds) that hold no instance yet, mostly the rest of
    /// the scheduling pass that started `except`, whose allocates are on
    /// their way. By job: `(job id, billed compute slices)`, in job id
    /// order (Slurm's submission order), so that every allocate of a pass
    /// sees its mates in the same order
    /// ([`crate::mig::Geometry::turned_away`] turns away the latest).
    pub(in crate::server) fn pass_mates(
        &self,
        book: &GpuBook,
        except: u64,
        since: u64,
    ) -> Vec<(u64, u8)> {
        let spec = book.geometry.spec;
        let billed = |shards: u8| {
            crate::mig::select_profile(spec, shards, None).map_or(0, |p| p.shape.compute)
        };
        let waiting = self
            .waiting
            .iter()
            .filter(|(&job, w)| w.gpu == book.index && job != except)
            .map(|(&job, w)| (job, billed(w.contender.need.slices)));
        let started = self
            .shard_jobs
            .iter()
            .filter(|j| j.gpu == book.index && j.job_id != except && j.start_time >= since)
            .filter(|j| !self.waiting.contains_key(&j.job_id) && book.find_job(j.job_id).is_none())
            .filter(|j| {
                self.released_at
                    .get(&j.job_id)
                    .is_none_or(|&t| t < j.start_time)
            })
            .map(|j| (j.job_id, billed(j.shards)));
        let mut mates: Vec<(u64, u8)> = waiting.chain(started).filter(|m| m.1 > 0).collect();
        mates.sort_unstable();
        mates
    }

    /// Whether job `job_id` runs past `horizon` (Unix seconds) as far as
    /// smartmigd can know in advance: the last queue read shows it running
    /// with a time limit that ends later. A job may end sooner; this is
    /// the only end known beforehand. A job the read does not show, or
    /// shows without a time limit, gives no such bound (`false`): the
    /// pass refusal ([`crate::mig::Geometry::turned_away`]) is conservative
    /// and rests on no guess.
    pub(in crate::server) fn held_past(&self, job_id: u64, horizon: u64) -> bool {
        self.job_times
            .get(&job_id)
            .and_then(|t| t.end)
            .is_some_and(|end| end > horizon)
    }

    /// Remembers the shard jobs `q` shows running on `node`.
    pub(in crate::server) fn remember_shard_jobs(&mut self, q: &QueueSnapshot, node: &str) {
        self.shard_jobs = q
            .jobs
            .iter()
            .filter(|j| j.state == JobState::Running && j.shards > 0 && j.hold_of().is_none())
            .filter(|j| crate::slurm::names_node(&j.nodes, node))
            .filter_map(|j| {
                Some(ShardJob {
                    job_id: j.job_id,
                    gpu: j.gpu?,
                    shards: j.shards,
                    start_time: j.start_time,
                })
            })
            .collect();
        let running = &self.shard_jobs;
        self.released_at
            .retain(|job, _| running.iter().any(|j| j.job_id == *job));
    }

    /// The other allocates waiting on `gpu`, as the placement rule sees them.
    pub(in crate::server) fn contenders(&self, gpu: u32, except: u64) -> Vec<Contender> {
        self.waiting
            .iter()
            .filter(|(&job, w)| w.gpu == gpu && job != except)
            .map(|(_, w)| self.contender_now(w))
            .collect()
    }

    /// The waiting allocates as `status` lists them, longest wait first.
    pub(in crate::server) fn waiting_jobs(&self) -> Vec<WaitingJob> {
        let mut waiting: Vec<WaitingJob> = self
            .waiting
            .iter()
            .map(|(&job_id, w)| WaitingJob {
                job_id,
                gpu: w.gpu,
                slices: w.contender.need.slices,
                waiting_s: w.since.elapsed().as_secs(),
                uid: Some(w.uid),
                deadline: {
                    let d = self.contender_now(w).deadline;
                    d.is_finite().then_some(d as i64)
                },
            })
            .collect();
        waiting.sort_by(|a, b| b.waiting_s.cmp(&a.waiting_s).then(a.job_id.cmp(&b.job_id)));
        waiting
    }

    /// Keeps each listed job's deadline and time limit for the placement
    /// rule: Slurm's `--deadline`, else the end of a running job's time
    /// limit.
    pub(in crate::server) fn remember_job_times(&mut self, q: &QueueSnapshot) {
        self.job_times = q
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
                        end: (j.state == JobState::Running).then_some(end).flatten(),
                    },
                )
            })
            .collect();
        self.array_names = q
            .jobs
            .iter()
            .filter(|j| j.array_task.is_some())
            .map(|j| (j.job_id, j.slurm_id()))
            .collect();
    }
}

/// A typed-GRES job seen running on this node.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::server) struct Watched {
    pub(in crate::server) profile: String,
    pub(in crate::server) submit: u64,
    pub(in crate::server) start: u64,
    /// Slurm's end time while running (start + time limit; 0: unknown).
    pub(in crate::server) end_time: u64,
    pub(in crate::server) time_limit_s: Option<u64>,
    pub(in crate::server) deadline: Option<u64>,
}

/// What advise mode keeps between epochs (in the node's ledger).
#[derive(Debug, Default)]
pub(in crate::server) struct AdviseBook {
    /// Jobs running on the node's instances now, by job id.
    pub(in crate::server) watched: HashMap<u64, Watched>,
    /// The layout last recorded per GPU.
    pub(in crate::server) layouts: HashMap<u32, Layout>,
    /// The policy's wish last recorded per GPU (the target and how it
    /// reads), so a wish is written when it changes, not every epoch.
    pub(in crate::server) wishes: HashMap<u32, (Layout, PlanStatus)>,
    pub(in crate::server) jobs_recorded: u64,
    pub(in crate::server) advice_recorded: u64,
    /// Whether the first epoch has run (it records the initial layout the
    /// policy would have installed).
    pub(in crate::server) started: bool,
}

/// Where the node's view of the queue came from last, for status,
/// metrics and [`node`].
#[derive(Clone, Debug, Default)]
pub(in crate::server) struct ViewSource {
    /// The last fresh summary's figures (`None`: none usable).
    pub(in crate::server) summary: Option<SummaryFigures>,
    /// Why the summary could not be used (`None`: it was, or never tried).
    pub(in crate::server) problem: Option<String>,
    /// The node's Slurm state from the summary (cleared without one).
    pub(in crate::server) node_info: Option<NodeInfo>,
}

#[derive(Clone, Copy, Debug)]
pub(in crate::server) struct SummaryFigures {
    pub(in crate::server) generated_at: u64,
    pub(in crate::server) nodes: u32,
    pub(in crate::server) claimed: u32,
    pub(in crate::server) pending_cluster: u32,
}

/// Who returned instances since the daemon started.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::server) struct ReleaseCounts {
    /// Releases sent by the plugin's job epilog.
    pub(in crate::server) epilog: u64,
    /// Instances the reaper freed because Slurm said the job had ended
    /// and no release arrived.
    pub(in crate::server) reaped: u64,
}

impl ReleaseCounts {
    /// The epilog seems not to run: the reaper had to free instances and
    /// no epilog release ever arrived (slurmd not restarted after the
    /// plugin was added to plugstack.conf).
    pub(in crate::server) fn epilog_missing(&self) -> bool {
        self.reaped > 0 && self.epilog == 0
    }
}

/// What the last ask found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::server) enum Outcome {
    /// Slurm's GPU i is the backend's GPU i (`gpus` gpu GRES compared);
    /// `typing`: whether each has its own GRES type (for the holds).
    Matches {
        gpus: usize,
        typing: crate::holds::GresTyping,
    },
    /// slurmd lists no gpu GRES for this node: nothing to compare.
    NoGres,
    /// Slurm did not answer (`slurmd -G` failed); asked again later.
    Unanswered(String),
    /// Slurm numbers the GPUs differently, or its gpu GRES are MIG devices.
    Mismatch(String),
}

impl Outcome {
    /// Whether Slurm answered (anything but [`Outcome::Unanswered`]).
    pub(in crate::server) fn answered(&self) -> bool {
        !matches!(self, Outcome::Unanswered(_))
    }
}

/// The check's state in the ledger: `None` when it is not made (advise
/// mode, Slurm queries off).
#[derive(Clone, Debug, Default)]
pub(in crate::server) struct GpuOrderCheck {
    pub(in crate::server) outcome: Option<Outcome>,
    /// Times Slurm was asked.
    pub(in crate::server) attempts: u32,
}

impl GpuOrderCheck {
    /// After the check at start.
    pub(in crate::server) fn started(outcome: Outcome) -> GpuOrderCheck {
        GpuOrderCheck {
            outcome: Some(outcome),
            attempts: 1,
        }
    }
}
