//! What jobs needed, on this node: the learned memory estimates
//! ([`crate::workload::MemoryEstimator`], shared with the simulator) and the
//! out-of-memory ledger that sizes a requeued job's next start.
//!
//! Pure bookkeeping plus one file: `<state_dir>/memory.json`, written
//! atomically ([`atomic_write`]) after every release that taught something
//! and after every out-of-memory decision. It is a cache of what was
//! learned, not a record anyone depends on for correctness: a corrupt file
//! is moved aside (`memory.json.corrupt`) with a warning and the daemon
//! starts with empty estimates, it never refuses to start over it.
//!
//! - **Running jobs** (in memory only): per job id the key (user, job name),
//!   its instance and the largest memory use sampled so far. Lost on a
//!   restart (the journal keeps the assignment, the estimator then simply
//!   learns nothing from that run).
//! - **Estimates**: per (user, job name), see `workload::memory_estimate`
//!   for the formula; observations record the instance memory (the
//!   profile), so "per profile" is part of every observation.
//! - **OOM ledger**: per job id the profile it last ran out of memory on,
//!   its failures and the restarts granted; the next allocate of that job id
//!   (Slurm keeps the id across `scontrol requeue`) asks for at least the
//!   next larger memory size of the GPU ([`next_larger_memory`]).
//! - **Early restarts** (`oom.early_restart`): the recent samples of each
//!   running job feed [`EarlyRestartRule`] (the simulator's rule); when it
//!   predicts the instance will be exceeded, the job goes through the same
//!   ledger and requeue as an out-of-memory failure, marked pending until
//!   the killed run's release, and counted false when the restart's peak
//!   would have fitted the instance it left.
//! - **Events**: the last [`MAX_EVENTS`] out-of-memory decisions, shown by
//!   `smartmig status`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fsutil::atomic_write;
use super::protocol::{
    EarlyRestartStatus, EstimateStatus, MemoryStatus, OomCause, OomDecision, OomEvent, OomJob,
};
use crate::mig::{ModelSpec, ProfileSpec};
use crate::workload::memory_estimate::{EstimateError, Outcome};
use crate::workload::{
    EarlyRestartRule, EstimatorConfig, MemoryEstimator, MemoryKey, MemorySample,
};

/// File name in the state directory.
pub const STATE_FILE: &str = "memory.json";
/// Out-of-memory decisions kept for `smartmig status`.
pub const MAX_EVENTS: usize = 64;
/// Jobs kept in the out-of-memory ledger (oldest dropped first).
pub const MAX_OOM_JOBS: usize = 4096;
/// Estimates listed in a status reply (most recently updated first).
pub const MAX_ESTIMATES_SHOWN: usize = 50;

/// Reading or writing the state file failed.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("memory state {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("memory state {path}: {message}")]
    Encode { path: PathBuf, message: String },
}

/// How the memory an allocate asks for was chosen (logged).
#[derive(Clone, Debug, PartialEq)]
pub enum Sizing {
    /// The job's `--mig-mem` / `--mig-profile` (or nothing: the smallest profile).
    Declared,
    /// A restart after an out-of-memory failure on `after_gb`.
    OomRestart { after_gb: u32 },
    /// The learned estimate of the job's (user, name).
    Estimate,
}

/// A job holding an instance now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunningJob {
    pub key: Option<MemoryKey>,
    /// Largest memory use seen (GB), from the backend's samples.
    pub peak_gb: Option<f64>,
    /// Unix seconds of the allocation (after a daemon restart: of the first
    /// sample, so the rule sees a short run and predicts less far).
    pub started_s: Option<f64>,
    /// The latest samples, oldest first (the early-restart window).
    pub recent: VecDeque<MemorySample>,
    /// `--mig-profile` jobs keep their profile: never restarted early.
    pub exact: bool,
    /// The early-restart rule fired for this run (it decides once per run).
    pub early_decided: bool,
}

/// What the early-restart rule saw when it fired.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EarlyTrigger {
    /// Memory in use now, GB.
    pub used_gb: f64,
    /// Where the trend goes, GB (more than the instance has).
    pub predicted_gb: f64,
}

/// The instance a released job held.
#[derive(Clone, Debug, PartialEq)]
pub struct Released {
    pub gpu: u32,
    pub profile: String,
    pub compute: u8,
    pub memory_gb: u32,
    /// The next larger memory size (GB) a job of `compute` slices can get on
    /// that GPU, if any.
    pub next_memory_gb: Option<u32>,
}

/// The admin's out-of-memory settings at the time of a release.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OomPolicy {
    pub requeue: bool,
    pub max_retries: u32,
    pub slurm_enabled: bool,
}

impl OomPolicy {
    /// The settings of `cfg` (`[oom]` and `slurm.enabled`).
    pub fn of(cfg: &crate::config::Config) -> OomPolicy {
        OomPolicy {
            requeue: cfg.oom.requeue,
            max_retries: cfg.oom.max_retries,
            slurm_enabled: cfg.slurm.enabled,
        }
    }
}

/// The larger of two memory figures, either of which may be unknown.
fn larger(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// One job in the out-of-memory ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomRecord {
    pub job_id: u64,
    #[serde(default)]
    pub key: Option<MemoryKey>,
    pub gpu: u32,
    pub failures: u32,
    pub restarts: u32,
    pub last_profile: String,
    pub last_compute: u8,
    pub last_memory_gb: u32,
    /// Unix seconds of the last failure.
    pub at: u64,
    /// Of `restarts`, the early ones.
    #[serde(default)]
    pub early_restarts: u32,
    /// An early restart was scheduled and the run it kills has not been
    /// released yet: that release is no completion.
    #[serde(default)]
    pub early_pending: bool,
    /// The memory (GB) of the instance the last early restart left: a
    /// completed restart that peaked within it was a false early restart.
    #[serde(default)]
    pub early_from_gb: Option<u32>,
}

impl OomRecord {
    /// A job's first entry, before its first failure or early restart.
    fn new(job_id: u64, key: Option<MemoryKey>, inst: &Released, now: u64) -> OomRecord {
        OomRecord {
            job_id,
            key,
            gpu: inst.gpu,
            failures: 0,
            restarts: 0,
            last_profile: String::new(),
            last_compute: inst.compute,
            last_memory_gb: 0,
            at: now,
            early_restarts: 0,
            early_pending: false,
            early_from_gb: None,
        }
    }
}

/// Early restarts since the state file began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EarlyCounts {
    pub restarts: u64,
    pub false_restarts: u64,
}

#[derive(Serialize, Deserialize)]
struct Stored {
    version: u32,
    estimator: MemoryEstimator<MemoryKey>,
    #[serde(default)]
    oom_jobs: Vec<OomRecord>,
    #[serde(default)]
    events: Vec<OomEvent>,
    #[serde(default)]
    early: EarlyCounts,
}

/// The serialized estimator, read back to list its keys (the estimator
/// keeps them private; its JSON form is its documented state format).
#[derive(Deserialize)]
struct EstimatorMirror {
    keys: Vec<MirrorKey>,
}

#[derive(Deserialize)]
struct MirrorKey {
    key: MemoryKey,
    updated: u64,
}

/// The node's memory knowledge.
#[derive(Debug)]
pub struct MemoryState {
    path: PathBuf,
    estimator: MemoryEstimator<MemoryKey>,
    oom_jobs: BTreeMap<u64, OomRecord>,
    events: VecDeque<OomEvent>,
    running: HashMap<u64, RunningJob>,
    early: EarlyCounts,
}

/// The smallest memory size (GB) above `above_gb` among the profiles of
/// `model` with at least `slices` compute slices: what a job that ran out
/// of memory on `above_gb` asks for next (A100-40GB, 1 slice: 5 -> 10 -> 20
/// -> 40 -> none).
pub fn next_larger_memory(model: &ModelSpec, slices: u8, above_gb: u32) -> Option<u32> {
    model
        .profiles
        .iter()
        .filter(|p| p.shape.compute >= slices && p.memory_gb > above_gb)
        .map(|p| p.memory_gb)
        .min()
}

/// The profile a job that ran out of memory on an instance of `compute`
/// slices restarts on, given the next memory size `next_gb`: the smallest
/// profile that holds it, as the room it takes (issue 55). So the ladder
/// of an A100-40GB one-shard job is 1g.5gb -> 2g.10gb -> 3g.20gb ->
/// 7g.40gb, never the 1g.10gb that would block two shards billed as one;
/// its room's slices are what Slurm must bill the restart.
pub fn restart_profile(
    model: &'static ModelSpec,
    compute: u8,
    next_gb: u32,
) -> Option<&'static ProfileSpec> {
    let p = crate::mig::select_profile(model, compute, Some(f64::from(next_gb))).ok()?;
    Some(model.room_profile(p))
}

/// The largest memory (GB) a job of `slices` compute slices can get on `model`.
pub fn largest_memory(model: &ModelSpec, slices: u8) -> Option<u32> {
    model
        .profiles
        .iter()
        .filter(|p| p.shape.compute >= slices)
        .map(|p| p.memory_gb)
        .max()
}

/// The most memory (GB) an instance can have without blocking more shards
/// than `slices` rounds up to (the shards Slurm billed): a learned
/// estimate never buys a bigger slice than the job pays for. A memory
/// variant blocks its room's shards ([`ModelSpec::room_shards`], issue
/// 55), so on an A100-40GB one shard holds 5 GB, not 1g.10gb's 10.
pub fn memory_within_shards(model: &ModelSpec, slices: u8) -> Option<u32> {
    let compute = model
        .profiles
        .iter()
        .map(|p| p.shape.compute)
        .filter(|&c| c >= slices)
        .min()?;
    model
        .profiles
        .iter()
        .filter(|p| model.room_shards(p) == compute)
        .map(|p| p.memory_gb)
        .max()
}

/// Whether a job that ran out of memory on `inst` (or is predicted to) is
/// requeued, given the `restarts` it already had, and the message saying so.
fn decide(restarts: u32, inst: &Released, policy: OomPolicy) -> (OomDecision, String) {
    if !policy.requeue {
        (
            OomDecision::Disabled,
            "not requeued: oom.requeue = false in smartmigd's config".to_string(),
        )
    } else if !policy.slurm_enabled {
        (
            OomDecision::SlurmDisabled,
            "not requeued: Slurm queries are disabled (slurm.enabled = false)".to_string(),
        )
    } else if restarts >= policy.max_retries {
        (
            OomDecision::RetriesExhausted,
            format!(
                "not requeued: {restarts} restart(s) after out-of-memory failures already (oom.max_retries = {})",
                policy.max_retries
            ),
        )
    } else if inst.next_memory_gb.is_none() {
        (
            OomDecision::NoLargerProfile,
            format!(
                "not requeued: no profile with more than {} GB for {} slice(s) on GPU {}",
                inst.memory_gb, inst.compute, inst.gpu
            ),
        )
    } else {
        (
            OomDecision::RequeueScheduled,
            format!(
                "requeue {} of {}: next start gets at least {} GB",
                restarts + 1,
                policy.max_retries,
                inst.next_memory_gb.unwrap_or(inst.memory_gb)
            ),
        )
    }
}

/// The event of a decision about job `job_id` on `inst` (a failure's; an
/// early restart overrides the cause and what the rule saw).
fn oom_event(
    now: u64,
    job_id: u64,
    key: Option<&MemoryKey>,
    inst: &Released,
    failures: u32,
    decision: OomDecision,
    message: String,
) -> OomEvent {
    OomEvent {
        at: now,
        job_id,
        user: key.map(|k| k.user.clone()),
        job_name: key.map(|k| k.name.clone()),
        gpu: inst.gpu,
        profile: inst.profile.clone(),
        memory_gb: inst.memory_gb,
        failures,
        decision,
        next_memory_gb: (decision == OomDecision::RequeueScheduled)
            .then_some(inst.next_memory_gb)
            .flatten(),
        message,
        cause: OomCause::Failure,
        used_gb: None,
        predicted_gb: None,
    }
}

/// Sets the estimator's configuration through its serialized form, which
/// validates the values and trims the history to the new bounds.
fn reconfigure(
    est: &MemoryEstimator<MemoryKey>,
    cfg: &EstimatorConfig,
) -> Result<MemoryEstimator<MemoryKey>, serde_json::Error> {
    let mut v = serde_json::to_value(est)?;
    v["config"] = serde_json::to_value(cfg)?;
    serde_json::from_value(v)
}

impl MemoryState {
    /// An empty state that will be saved in `state_dir`; fails only when
    /// `cfg` is invalid.
    pub fn empty(state_dir: &Path, cfg: &EstimatorConfig) -> Result<MemoryState, EstimateError> {
        Ok(MemoryState {
            path: state_dir.join(STATE_FILE),
            estimator: MemoryEstimator::new(cfg.clone())?,
            oom_jobs: BTreeMap::new(),
            events: VecDeque::new(),
            running: HashMap::new(),
            early: EarlyCounts::default(),
        })
    }

    /// Loads `<state_dir>/memory.json` (empty when missing). A file that
    /// cannot be parsed is renamed to `memory.json.corrupt` and a warning
    /// logged: estimates are a cache, never a reason not to start. Fails
    /// only when `cfg` is invalid.
    pub fn open(state_dir: &Path, cfg: &EstimatorConfig) -> Result<MemoryState, EstimateError> {
        let mut st = MemoryState::empty(state_dir, cfg)?;
        let bytes = match std::fs::read(&st.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(st),
            Err(e) => {
                tracing::warn!(path = %st.path.display(), "cannot read the memory estimates ({e}); starting without them");
                return Ok(st);
            }
        };
        let stored = serde_json::from_slice::<Stored>(&bytes)
            .and_then(|s| Ok((reconfigure(&s.estimator, cfg)?, s)));
        match stored {
            Ok((estimator, s)) => {
                st.estimator = estimator;
                st.oom_jobs = s.oom_jobs.into_iter().map(|r| (r.job_id, r)).collect();
                st.events = s.events.into_iter().collect();
                st.early = s.early;
                st.trim();
                tracing::info!(
                    keys = st.estimator.len(),
                    oom_jobs = st.oom_jobs.len(),
                    "loaded learned memory estimates"
                );
            }
            Err(e) => {
                let aside = st.path.with_extension("json.corrupt");
                let _ = std::fs::rename(&st.path, &aside);
                tracing::warn!(path = %st.path.display(), aside = %aside.display(),
                    "memory estimates unreadable ({e}); moved aside, starting without them");
            }
        }
        Ok(st)
    }

    fn trim(&mut self) {
        while self.events.len() > MAX_EVENTS {
            self.events.pop_front();
        }
        while self.oom_jobs.len() > MAX_OOM_JOBS {
            let oldest = self
                .oom_jobs
                .values()
                .min_by_key(|r| (r.at, r.job_id))
                .map(|r| r.job_id);
            match oldest {
                Some(id) => {
                    self.oom_jobs.remove(&id);
                }
                None => break,
            }
        }
    }

    /// Writes the state atomically.
    pub fn save(&self) -> Result<(), MemoryError> {
        let stored = Stored {
            version: 1,
            estimator: self.estimator.clone(),
            oom_jobs: self.oom_jobs.values().cloned().collect(),
            events: self.events.iter().cloned().collect(),
            early: self.early,
        };
        let bytes = serde_json::to_vec_pretty(&stored).map_err(|e| MemoryError::Encode {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        atomic_write(&self.path, &bytes).map_err(|source| MemoryError::Io {
            path: self.path.clone(),
            source,
        })
    }

    pub fn estimator(&self) -> &MemoryEstimator<MemoryKey> {
        &self.estimator
    }

    pub fn oom_record(&self, job_id: u64) -> Option<&OomRecord> {
        self.oom_jobs.get(&job_id)
    }

    /// The memory (GB) an allocate of `job_id` asks for, and why:
    ///
    /// 1. a job in the OOM ledger: at least the next larger memory size
    ///    after the profile it ran out of memory on (its own `--mig-mem`
    ///    proved too small, so this overrides it upwards); the largest size
    ///    when there is no larger one;
    /// 2. a declared need (`--mig-mem`, `--mig-profile`): as declared;
    /// 3. no declaration, `use_estimate` and a learned estimate for `key`:
    ///    the estimate (margin included, capped to the GPU);
    /// 4. otherwise nothing (the smallest profile with K slices).
    pub fn size_request(
        &self,
        model: &ModelSpec,
        job_id: u64,
        slices: u8,
        declared: Option<f64>,
        key: Option<&MemoryKey>,
        use_estimate: bool,
    ) -> (Option<f64>, Sizing) {
        if let Some(rec) = self.oom_jobs.get(&job_id) {
            let floor = next_larger_memory(model, slices, rec.last_memory_gb)
                .or_else(|| largest_memory(model, slices));
            if let Some(floor) = floor {
                let gb = declared.unwrap_or(0.0).max(f64::from(floor));
                return (
                    Some(gb),
                    Sizing::OomRestart {
                        after_gb: rec.last_memory_gb,
                    },
                );
            }
        }
        if declared.is_some() {
            return (declared, Sizing::Declared);
        }
        if use_estimate {
            if let Some(key) = key {
                let cap = memory_within_shards(model, slices).map_or(f64::NAN, f64::from);
                if let Some(gb) = self.estimator.estimate(key, cap) {
                    return (Some(gb), Sizing::Estimate);
                }
            }
        }
        (None, Sizing::Declared)
    }

    /// A job got an instance at `now_s` (unix seconds; not for `existing`
    /// replies: the first allocate of a job registers it). `exact`: it
    /// asked for its profile by name (`--mig-profile`).
    pub fn on_allocate(&mut self, job_id: u64, key: Option<MemoryKey>, exact: bool, now_s: f64) {
        self.running.insert(
            job_id,
            RunningJob {
                key,
                started_s: Some(now_s),
                exact,
                ..RunningJob::default()
            },
        );
    }

    /// A sample of the memory a job uses now (GB); keeps the largest.
    /// Jobs not registered (e.g. allocated before a daemon restart) are
    /// registered without a key.
    pub fn sample(&mut self, job_id: u64, gb: f64) {
        if !(gb.is_finite() && gb >= 0.0) {
            return;
        }
        let r = self.running.entry(job_id).or_default();
        r.peak_gb = larger(r.peak_gb, Some(gb));
    }

    /// A running job's peak so far: its largest sample, or `reported` (a
    /// release's `used_memory_gb`) when that is larger.
    pub fn peak(&self, job_id: u64, reported: Option<f64>) -> Option<f64> {
        larger(self.running(job_id).and_then(|r| r.peak_gb), reported)
    }

    /// A periodic sample (GB) of a job on an instance of `instance_gb`,
    /// taken at `now_s` (unix seconds): kept as [`Self::sample`] does and,
    /// with a `rule`, asked whether the job should restart early. Fires at
    /// most once per run, never for `--mig-profile` jobs.
    pub fn observe(
        &mut self,
        job_id: u64,
        gb: f64,
        now_s: f64,
        instance_gb: f64,
        rule: Option<&EarlyRestartRule>,
    ) -> Option<EarlyTrigger> {
        if !(gb.is_finite() && gb >= 0.0) {
            return None;
        }
        self.sample(job_id, gb);
        let r = self.running.get_mut(&job_id)?;
        let started = *r.started_s.get_or_insert(now_s);
        let rule = rule?;
        r.recent.push_back(MemorySample {
            t_s: now_s - started,
            used_gb: gb,
        });
        while r.recent.len() > rule.window {
            r.recent.pop_front();
        }
        if r.exact || r.early_decided {
            return None;
        }
        let predicted_gb = rule.predicts_overflow(r.recent.make_contiguous(), instance_gb)?;
        r.early_decided = true;
        Some(EarlyTrigger {
            used_gb: gb,
            predicted_gb,
        })
    }

    pub fn running(&self, job_id: u64) -> Option<&RunningJob> {
        self.running.get(&job_id)
    }

    /// A job released its instance. `released` is what it held (None: it
    /// held nothing, e.g. a repeated release: nothing is learned twice).
    ///
    /// Without `oom`: the job's peak (largest of the samples and the
    /// caller's `used_gb`) is recorded as a completed run of its key, and
    /// the job leaves the OOM ledger. With `oom`: the instance's memory is
    /// recorded as a lower bound of the key's need, the ledger counts the
    /// failure and the decision is returned (and kept as an event);
    /// `RequeueScheduled` (`requeue_scheduled`) counts a restart.
    ///
    /// Returns `(changed, event)`: whether anything was learned (the state
    /// should be saved), and the OOM decision.
    pub fn on_release(
        &mut self,
        job_id: u64,
        released: Option<&Released>,
        oom: bool,
        used_gb: Option<f64>,
        policy: OomPolicy,
        now: u64,
    ) -> (bool, Option<OomEvent>) {
        let running = self.running.remove(&job_id);
        let Some(inst) = released else {
            return (false, None);
        };
        let key = running.as_ref().and_then(|r| r.key.clone());
        if !oom {
            if let Some(rec) = self.oom_jobs.get_mut(&job_id) {
                if rec.early_pending {
                    // The run the early restart killed: not a completion,
                    // and its peak is not the job's.
                    rec.early_pending = false;
                    return (true, None);
                }
            }
            let peak = larger(running.and_then(|r| r.peak_gb), used_gb);
            let left = self.oom_jobs.remove(&job_id);
            let mut changed = left.is_some();
            if let (Some(from), Some(peak)) = (left.and_then(|r| r.early_from_gb), peak) {
                if peak <= f64::from(from) {
                    self.early.false_restarts += 1;
                    tracing::warn!(job = job_id, peak_gb = peak, left_gb = from,
                        "false early restart: the job's peak would have fitted the instance it was restarted from");
                }
            }
            if let (Some(key), Some(peak)) = (key, peak) {
                match self
                    .estimator
                    .record_completion(key.clone(), peak, f64::from(inst.memory_gb))
                {
                    Ok(()) => {
                        tracing::info!(job = job_id, user = %key.user, name = %key.name, peak_gb = peak,
                            profile = %inst.profile, "learned the memory a job needed");
                        changed = true;
                    }
                    Err(e) => tracing::warn!(job = job_id, "memory sample not recorded: {e}"),
                }
            }
            return (changed, None);
        }
        if let Some(key) = &key {
            if let Err(e) = self
                .estimator
                .record_oom(key.clone(), f64::from(inst.memory_gb))
            {
                tracing::warn!(job = job_id, "out-of-memory bound not recorded: {e}");
            }
        }
        let rec = self
            .oom_jobs
            .entry(job_id)
            .or_insert_with(|| OomRecord::new(job_id, key.clone(), inst, now));
        rec.failures += 1;
        // It failed before an early restart's requeue killed it: the
        // failure decides now.
        rec.early_pending = false;
        rec.gpu = inst.gpu;
        rec.last_profile = inst.profile.clone();
        rec.last_compute = inst.compute;
        rec.last_memory_gb = rec.last_memory_gb.max(inst.memory_gb);
        rec.at = now;
        if key.is_some() {
            rec.key = key.clone();
        }
        let (decision, message) = decide(rec.restarts, inst, policy);
        if decision == OomDecision::RequeueScheduled {
            rec.restarts += 1;
        }
        let event = oom_event(
            now,
            job_id,
            key.as_ref(),
            inst,
            rec.failures,
            decision,
            message,
        );
        self.events.push_back(event.clone());
        self.trim();
        (true, Some(event))
    }

    /// The early-restart rule fired for a running job on `inst`: the same
    /// decisions as an out-of-memory failure (requeue allowed, Slurm on,
    /// restarts left, a larger profile exists), counted in the same
    /// `restarts`. A scheduled one puts the job in the ledger (its next
    /// start gets more memory) and marks the killed run's release as no
    /// completion. Nothing is learned: a prediction is no bound.
    pub fn on_early_restart(
        &mut self,
        job_id: u64,
        inst: &Released,
        trigger: EarlyTrigger,
        policy: OomPolicy,
        now: u64,
    ) -> OomEvent {
        let key = self.running.get(&job_id).and_then(|r| r.key.clone());
        let restarts = self.oom_jobs.get(&job_id).map_or(0, |r| r.restarts);
        let (decision, message) = decide(restarts, inst, policy);
        let mut failures = 0;
        let message = if decision == OomDecision::RequeueScheduled {
            let rec = self
                .oom_jobs
                .entry(job_id)
                .or_insert_with(|| OomRecord::new(job_id, key.clone(), inst, now));
            rec.restarts += 1;
            rec.early_restarts += 1;
            rec.early_pending = true;
            rec.early_from_gb = Some(inst.memory_gb);
            rec.gpu = inst.gpu;
            rec.last_profile = inst.profile.clone();
            rec.last_compute = inst.compute;
            rec.last_memory_gb = rec.last_memory_gb.max(inst.memory_gb);
            rec.at = now;
            failures = rec.failures;
            self.early.restarts += 1;
            format!(
                "early restart: {:.2} GB in use and rising, {:.2} GB predicted on a {} GB instance; {message}",
                trigger.used_gb, trigger.predicted_gb, inst.memory_gb
            )
        } else {
            format!(
                "early restart predicted ({:.2} GB in use, {:.2} GB predicted on a {} GB instance) but {message}",
                trigger.used_gb, trigger.predicted_gb, inst.memory_gb
            )
        };
        let event = OomEvent {
            cause: OomCause::EarlyRestart,
            used_gb: Some(trigger.used_gb),
            predicted_gb: Some(trigger.predicted_gb),
            ..oom_event(now, job_id, key.as_ref(), inst, failures, decision, message)
        };
        self.events.push_back(event.clone());
        self.trim();
        event
    }

    /// The outcome of a scheduled requeue (`requeued` or `requeue_failed`),
    /// kept as an event.
    /// `decision`: `requeued`, `not_requeued` (the job was cancelled or
    /// timed out) or `requeue_failed`.
    pub fn on_requeue_result(
        &mut self,
        job_id: u64,
        decision: OomDecision,
        message: String,
        now: u64,
    ) {
        let base = self
            .events
            .iter()
            .rev()
            .find(|e| e.job_id == job_id)
            .cloned();
        let Some(mut e) = base else {
            return;
        };
        if e.cause == OomCause::EarlyRestart && decision != OomDecision::Requeued {
            // The job ended on its own first, or Slurm would not requeue
            // it (not a batch job): no restart happened.
            if let Some(rec) = self.oom_jobs.get_mut(&job_id) {
                rec.early_pending = false;
                rec.restarts = rec.restarts.saturating_sub(1);
                rec.early_restarts = rec.early_restarts.saturating_sub(1);
                rec.early_from_gb = None;
                if rec.failures == 0 {
                    self.oom_jobs.remove(&job_id);
                }
            }
            self.early.restarts = self.early.restarts.saturating_sub(1);
        }
        e.at = now;
        e.decision = decision;
        e.message = message;
        self.events.push_back(e);
        self.trim();
    }

    /// The `memory` section of a status reply.
    pub fn status(
        &self,
        estimate: bool,
        oom_requeue: bool,
        max_retries: u32,
        early: Option<&EarlyRestartRule>,
    ) -> MemoryStatus {
        let mut keys: Vec<(u64, MemoryKey)> = serde_json::to_value(&self.estimator)
            .ok()
            .and_then(|v| serde_json::from_value::<EstimatorMirror>(v).ok())
            .map(|m| m.keys.into_iter().map(|k| (k.updated, k.key)).collect())
            .unwrap_or_default();
        keys.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let estimates = keys
            .into_iter()
            .take(MAX_ESTIMATES_SHOWN)
            .filter_map(|(_, key)| {
                let gb = self.estimator.estimate(&key, f64::NAN)?;
                let (mut runs, mut ooms, mut max_peak) = (0u32, 0u32, None::<f64>);
                for o in self.estimator.history(&key) {
                    runs += 1;
                    match o.outcome {
                        Outcome::OutOfMemory => ooms += 1,
                        Outcome::Completed => {
                            max_peak = Some(max_peak.map_or(o.peak_gb, |m| m.max(o.peak_gb)));
                        }
                    }
                }
                Some(EstimateStatus {
                    user: key.user,
                    job_name: key.name,
                    estimate_gb: (gb * 100.0).round() / 100.0,
                    runs,
                    ooms,
                    max_peak_gb: max_peak,
                })
            })
            .collect();
        MemoryStatus {
            plugin_oom_requeue: None,
            estimate,
            oom_requeue,
            max_retries,
            oom_events: self.events.iter().cloned().collect(),
            oom_jobs: self
                .oom_jobs
                .values()
                .map(|r| OomJob {
                    job_id: r.job_id,
                    restarts: r.restarts,
                    failures: r.failures,
                    last_profile: r.last_profile.clone(),
                    last_memory_gb: r.last_memory_gb,
                    early_restarts: r.early_restarts,
                })
                .collect(),
            estimates,
            early_restart: early.map(|rule| EarlyRestartStatus {
                window: rule.window,
                horizon: rule.horizon,
                min_fill: rule.min_fill,
                restarts: self.early.restarts,
                false_restarts: self.early.false_restarts,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::GpuModel;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("smartmig-mem-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn on(requeue: bool, max_retries: u32) -> OomPolicy {
        OomPolicy {
            requeue,
            max_retries,
            slurm_enabled: true,
        }
    }

    fn held(model: GpuModel, name: &str) -> Released {
        let spec = model.spec();
        let p = spec
            .profiles
            .iter()
            .find(|p| p.name() == name)
            .unwrap_or_else(|| panic!("no {name}"));
        Released {
            gpu: 0,
            profile: name.into(),
            compute: p.shape.compute,
            memory_gb: p.memory_gb,
            next_memory_gb: next_larger_memory(spec, p.shape.compute, p.memory_gb),
        }
    }

    #[test]
    fn next_larger_memory_walks_the_sizes() {
        let a = GpuModel::A100_40gb.spec();
        assert_eq!(next_larger_memory(a, 1, 5), Some(10));
        assert_eq!(next_larger_memory(a, 1, 10), Some(20));
        assert_eq!(next_larger_memory(a, 2, 10), Some(20));
        assert_eq!(next_larger_memory(a, 1, 40), None);
        assert_eq!(largest_memory(a, 3), Some(40));
        // 1g.10gb blocks a 2g.10gb's shards (issue 55): not within one.
        assert_eq!(memory_within_shards(a, 1), Some(5));
        assert_eq!(memory_within_shards(a, 2), Some(10));
        assert_eq!(memory_within_shards(a, 3), Some(20));
        assert_eq!(memory_within_shards(a, 5), Some(40));
        let h = GpuModel::H100_80gb.spec();
        assert_eq!(next_larger_memory(h, 1, 10), Some(20));
    }

    /// The out-of-memory ladder follows the billing rule (issue 55): each
    /// restart is the room its memory takes, billed what it blocks.
    #[test]
    fn the_restart_ladder_climbs_rooms() {
        let a = GpuModel::A100_40gb.spec();
        let mut held = a.profiles.iter().find(|p| p.name() == "1g.5gb").unwrap();
        let mut ladder = vec![held.name()];
        while let Some(next) = next_larger_memory(a, held.shape.compute, held.memory_gb) {
            held = restart_profile(a, held.shape.compute, next).unwrap();
            assert_eq!(a.room_shards(held), held.shape.compute, "{}", held.name());
            ladder.push(held.name());
        }
        assert_eq!(ladder, ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]);
        let h = GpuModel::H100_80gb.spec();
        assert_eq!(restart_profile(h, 1, 20).unwrap().name(), "2g.20gb");
        let a30 = GpuModel::A30_24gb.spec();
        assert_eq!(restart_profile(a30, 1, 12).unwrap().name(), "2g.12gb");
    }

    #[test]
    fn oom_restart_then_estimate_then_completion() {
        let d = dir("flow");
        let a = GpuModel::A100_40gb.spec();
        let mut m = MemoryState::empty(&d, &EstimatorConfig::default()).unwrap();
        let key = MemoryKey::new("alice", "train.sh");
        // First start: nothing known, smallest profile.
        assert_eq!(
            m.size_request(a, 7, 1, None, Some(&key), true),
            (None, Sizing::Declared)
        );
        m.on_allocate(7, Some(key.clone()), false, 0.0);
        let (changed, ev) = m.on_release(
            7,
            Some(&held(GpuModel::A100_40gb, "1g.5gb")),
            true,
            None,
            on(true, 2),
            100,
        );
        assert!(changed);
        let ev = ev.unwrap();
        assert_eq!(ev.decision, OomDecision::RequeueScheduled);
        assert_eq!(ev.next_memory_gb, Some(10));
        assert_eq!(ev.user.as_deref(), Some("alice"));
        // The requeued job (same id) asks for the next larger size, even with a declaration.
        assert_eq!(
            m.size_request(a, 7, 1, Some(4.0), Some(&key), true),
            (Some(10.0), Sizing::OomRestart { after_gb: 5 })
        );
        // Another job of the same key gets the learned estimate (5 GB + 1 GB
        // margin), within what its shards hold: one shard holds 1g.5gb's
        // 5 GB, not 1g.10gb's, which blocks two (issue 55).
        assert_eq!(
            m.size_request(a, 8, 2, None, Some(&key), true),
            (Some(6.0), Sizing::Estimate)
        );
        assert_eq!(
            m.size_request(a, 8, 1, None, Some(&key), true),
            (Some(5.0), Sizing::Estimate)
        );
        // ... but not when estimates are off, and never over a declaration.
        assert_eq!(
            m.size_request(a, 8, 1, None, Some(&key), false),
            (None, Sizing::Declared)
        );
        assert_eq!(
            m.size_request(a, 8, 1, Some(3.0), Some(&key), true),
            (Some(3.0), Sizing::Declared)
        );
        // The restart completes with a sampled peak: learned, ledger cleared.
        m.on_allocate(7, Some(key.clone()), false, 0.0);
        m.sample(7, 7.5);
        m.sample(7, 3.0);
        let (changed, ev) = m.on_release(
            7,
            Some(&held(GpuModel::A100_40gb, "1g.10gb")),
            false,
            Some(6.0),
            on(true, 2),
            200,
        );
        assert!(changed && ev.is_none());
        assert!(m.oom_record(7).is_none());
        let peaks: Vec<f64> = m.estimator().history(&key).map(|o| o.peak_gb).collect();
        assert_eq!(peaks, vec![5.0, 7.5]);
        // Persisted and reloaded.
        m.on_requeue_result(7, OomDecision::Requeued, "requeued".into(), 150);
        m.save().unwrap();
        let back = MemoryState::open(&d, &EstimatorConfig::default()).unwrap();
        assert_eq!(back.estimator(), m.estimator());
        let s = back.status(true, true, 2, None);
        assert_eq!(s.estimates.len(), 1);
        assert_eq!(s.estimates[0].runs, 2);
        assert_eq!(s.estimates[0].ooms, 1);
        assert_eq!(s.estimates[0].max_peak_gb, Some(7.5));
        let decisions: Vec<&str> = s.oom_events.iter().map(|e| e.decision.as_str()).collect();
        assert_eq!(decisions, vec!["requeue_scheduled", "requeued"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Samples every 5 s of a job whose use rises by `per_sample` GB from
    /// `from` GB, until the rule fires (or `n` samples).
    fn feed(
        m: &mut MemoryState,
        job: u64,
        from: f64,
        per_sample: f64,
        n: u32,
        rule: &EarlyRestartRule,
    ) -> Option<(u32, EarlyTrigger)> {
        (1..=n).find_map(|k| {
            let t = f64::from(k) * 5.0;
            let gb = from + per_sample * f64::from(k);
            m.observe(job, gb, 1000.0 + t, 5.0, Some(rule))
                .map(|tr| (k, tr))
        })
    }

    /// A rule that looks far ahead (not the default), so a steady rise
    /// fires well before the instance is full.
    const FAR: EarlyRestartRule = EarlyRestartRule {
        window: 3,
        horizon: 0.5,
        min_fill: 0.5,
    };

    #[test]
    fn early_restart_requeues_then_the_killed_run_is_no_completion() {
        let d = dir("early");
        let a = GpuModel::A100_40gb.spec();
        let rule = FAR;
        let mut m = MemoryState::empty(&d, &EstimatorConfig::default()).unwrap();
        let key = MemoryKey::new("bob", "grow.sh");
        m.on_allocate(3, Some(key.clone()), false, 1000.0);
        // 1 GB + 0.1 GB per 5 s on a 5 GB instance: the rule fires while
        // the use is still under the instance.
        let (k, tr) = feed(&mut m, 3, 1.0, 0.1, 100, &rule).expect("fires");
        assert!(tr.used_gb < 5.0 && tr.predicted_gb > 5.0, "{tr:?} at {k}");
        // Once per run: later samples do not fire again.
        assert_eq!(m.observe(3, 4.9, 2000.0, 5.0, Some(&rule)), None);
        let inst = held(GpuModel::A100_40gb, "1g.5gb");
        let ev = m.on_early_restart(3, &inst, tr, on(true, 2), 50);
        assert_eq!(ev.decision, OomDecision::RequeueScheduled);
        assert_eq!(ev.cause, OomCause::EarlyRestart);
        assert_eq!(ev.failures, 0);
        assert_eq!(ev.next_memory_gb, Some(10));
        assert!(ev.message.starts_with("early restart: "), "{}", ev.message);
        // The requeue kills the run: its release keeps the ledger and
        // teaches nothing.
        let (changed, none) = m.on_release(3, Some(&inst), false, Some(4.9), on(true, 2), 60);
        assert!(changed && none.is_none());
        assert_eq!(m.estimator().history(&key).count(), 0);
        assert_eq!(
            m.size_request(a, 3, 1, None, Some(&key), true),
            (Some(10.0), Sizing::OomRestart { after_gb: 5 })
        );
        m.on_requeue_result(3, OomDecision::Requeued, "requeued".into(), 61);
        // The restart peaks at 7 GB: a true early restart; ledger cleared.
        m.on_allocate(3, Some(key.clone()), false, 2000.0);
        m.sample(3, 7.0);
        let ten = held(GpuModel::A100_40gb, "1g.10gb");
        let (changed, _) = m.on_release(3, Some(&ten), false, None, on(true, 2), 90);
        assert!(changed && m.oom_record(3).is_none());
        let s = m.status(true, true, 2, Some(&rule));
        let e = s.early_restart.expect("on");
        assert_eq!((e.restarts, e.false_restarts), (1, 0));
        // A second job restarted early that peaks within 5 GB: false.
        m.on_allocate(4, Some(key.clone()), false, 1000.0);
        let (_, tr) = feed(&mut m, 4, 1.0, 0.1, 100, &rule).expect("fires");
        m.on_early_restart(4, &inst, tr, on(true, 2), 100);
        m.on_release(4, Some(&inst), false, None, on(true, 2), 101);
        m.on_requeue_result(4, OomDecision::Requeued, "requeued".into(), 102);
        m.on_allocate(4, Some(key.clone()), false, 4000.0);
        m.sample(4, 4.5);
        m.on_release(4, Some(&ten), false, None, on(true, 2), 200);
        let e = m.status(true, true, 2, Some(&rule)).early_restart.unwrap();
        assert_eq!((e.restarts, e.false_restarts), (2, 1));
        // Counts survive a restart of the daemon.
        m.save().unwrap();
        let back = MemoryState::open(&d, &EstimatorConfig::default()).unwrap();
        let e = back
            .status(true, true, 2, Some(&rule))
            .early_restart
            .unwrap();
        assert_eq!((e.restarts, e.false_restarts), (2, 1));
        assert_eq!(back.status(true, true, 2, None).early_restart, None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn early_restart_is_bounded_and_undone_when_slurm_says_no() {
        let d = dir("early-bounded");
        let rule = FAR;
        let mut m = MemoryState::empty(&d, &EstimatorConfig::default()).unwrap();
        let inst = held(GpuModel::A100_40gb, "1g.5gb");
        // --mig-profile jobs are never restarted early.
        m.on_allocate(5, None, true, 1000.0);
        assert_eq!(feed(&mut m, 5, 1.0, 0.1, 100, &rule), None);
        // Without a rule, samples only feed the peak.
        m.on_allocate(6, None, false, 1000.0);
        assert_eq!(
            (1..50).find_map(|k| m.observe(
                6,
                f64::from(k) * 0.1,
                1000.0 + f64::from(k),
                5.0,
                None
            )),
            None
        );
        assert_eq!(m.running(6).and_then(|r| r.peak_gb), Some(4.9));
        // The same ladder as an out-of-memory failure: disabled, retries.
        m.on_allocate(7, None, false, 1000.0);
        let (_, tr) = feed(&mut m, 7, 1.0, 0.1, 100, &rule).unwrap();
        let ev = m.on_early_restart(7, &inst, tr, on(false, 2), 1);
        assert_eq!(ev.decision, OomDecision::Disabled);
        assert!(
            m.oom_record(7).is_none(),
            "nothing scheduled, no ledger entry"
        );
        let ev = m.on_early_restart(7, &inst, tr, on(true, 0), 1);
        assert_eq!(ev.decision, OomDecision::RetriesExhausted);
        // Slurm would not requeue (an interactive job): undone.
        let ev = m.on_early_restart(7, &inst, tr, on(true, 2), 2);
        assert_eq!(ev.decision, OomDecision::RequeueScheduled);
        assert!(m.oom_record(7).is_some_and(|r| r.early_pending));
        m.on_requeue_result(7, OomDecision::RequeueFailed, "not a batch job".into(), 3);
        assert!(m.oom_record(7).is_none());
        let e = m.status(true, true, 2, Some(&rule)).early_restart.unwrap();
        assert_eq!(e.restarts, 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn retries_are_bounded_and_policies_respected() {
        let d = dir("bounded");
        let mut m = MemoryState::empty(&d, &EstimatorConfig::default()).unwrap();
        let mut decisions = Vec::new();
        for name in ["1g.5gb", "1g.10gb", "3g.20gb"] {
            let (_, ev) = m.on_release(
                9,
                Some(&held(GpuModel::A100_40gb, name)),
                true,
                None,
                on(true, 2),
                1,
            );
            decisions.push(ev.unwrap().decision.as_str());
        }
        assert_eq!(
            decisions,
            vec![
                "requeue_scheduled",
                "requeue_scheduled",
                "retries_exhausted"
            ]
        );
        assert_eq!(m.oom_record(9).unwrap().failures, 3);
        let (_, ev) = m.on_release(
            10,
            Some(&held(GpuModel::A100_40gb, "7g.40gb")),
            true,
            None,
            on(true, 2),
            1,
        );
        assert_eq!(ev.unwrap().decision, OomDecision::NoLargerProfile);
        let (_, ev) = m.on_release(
            11,
            Some(&held(GpuModel::A100_40gb, "1g.5gb")),
            true,
            None,
            on(false, 2),
            1,
        );
        assert_eq!(ev.unwrap().decision, OomDecision::Disabled);
        let policy = OomPolicy {
            slurm_enabled: false,
            ..on(true, 2)
        };
        let (_, ev) = m.on_release(
            12,
            Some(&held(GpuModel::A100_40gb, "1g.5gb")),
            true,
            None,
            policy,
            1,
        );
        assert_eq!(ev.unwrap().decision, OomDecision::SlurmDisabled);
        // A repeated release (nothing held) learns nothing.
        assert_eq!(
            m.on_release(12, None, true, None, on(true, 2), 1),
            (false, None)
        );
        // A job at the largest size restarts at the largest size.
        let a = GpuModel::A100_40gb.spec();
        assert_eq!(m.size_request(a, 10, 7, None, None, true).0, Some(40.0));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn corrupt_state_is_moved_aside() {
        let d = dir("corrupt");
        std::fs::write(d.join(STATE_FILE), b"{not json").unwrap();
        let m = MemoryState::open(&d, &EstimatorConfig::default()).unwrap();
        assert!(m.estimator().is_empty());
        assert!(d.join("memory.json.corrupt").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ledger_and_events_are_bounded() {
        let d = dir("bounds");
        let mut m = MemoryState::empty(&d, &EstimatorConfig::default()).unwrap();
        for job in 0..(MAX_OOM_JOBS as u64 + 10) {
            m.on_release(
                job,
                Some(&held(GpuModel::A100_40gb, "1g.5gb")),
                true,
                None,
                on(true, 2),
                job,
            );
        }
        assert_eq!(m.oom_jobs.len(), MAX_OOM_JOBS);
        assert!(m.oom_record(0).is_none());
        assert_eq!(m.events.len(), MAX_EVENTS);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
