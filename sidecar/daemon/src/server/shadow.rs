//! The day's shadow, the shell's half (docs/daemon.md, "Do no harm during
//! the day: the shadow"): each epoch records the jobs holding instances
//! into the day's book ([`crate::shadow::DayBook`]; releases record their
//! ends as they happen); every `shadow.every_s` it replays the day so far
//! under fresh copies of the configured policy and of the fallback (off the
//! runtime's workers) and feeds the two costs to the switch
//! ([`crate::policy::shadow::ShadowState`]); the epoch then asks whichever
//! policy the switch names. A replay that fails keeps what runs.

use super::books::ShadowRun;
use super::context::{unix_now_f64, Cx};
use crate::allocate::Assignment;
use crate::config::{Config, Mode};
use crate::mig::{Geometry, GpuModel};
use crate::policy::shadow::{Replay, ShadowState, Switch, PRIMARY};
use crate::policy_choice::{build, build_fallback, PolicyChoiceError};
use crate::protocol::{ShadowStatus, ShadowSwitch};
use crate::shadow::SeenJob;
use crate::sim::{EpochRule, Heuristic, SimConfig, SimError};
use crate::workload::{Job, PowerModel};

/// What one check replays, taken under the lock and run off it.
struct Check {
    jobs: Vec<Job>,
    now: f64,
    policy: String,
    fallback: String,
    models: Vec<GpuModel>,
    replay: Replay,
}

impl ShadowRun {
    /// Whether the fallback runs now (never while the shadow is off).
    pub(super) fn fallback_runs(&self, cfg: &Config) -> bool {
        on(cfg) && self.with(|r| r.state.running() != PRIMARY)
    }

    /// A release: the job's run ended at `end`.
    pub(super) fn ended(&self, job_id: u64, end: f64, job: SeenJob) {
        self.with(|r| r.book.ended(job_id, end, job));
    }

    /// The status section.
    pub(super) fn status(&self, cfg: &Config, primary: &str, fallback: &str) -> ShadowStatus {
        self.with(|r| {
            let fallback_runs = on(cfg) && r.state.running() != PRIMARY;
            let s = &cfg.shadow;
            ShadowStatus {
                enabled: on(cfg),
                running: side(if fallback_runs { 1 } else { PRIMARY }).into(),
                running_policy: if fallback_runs { fallback } else { primary }.into(),
                primary: primary.into(),
                fallback: fallback.into(),
                every_s: s.every_s,
                window_s: s.window_s,
                margin: s.margin,
                hold_checks: s.hold_checks,
                checks: r.checks,
                failures: r.failures,
                jobs: r.book.len() as u64,
                day_start: r.book.origin() as u64,
                last_costs_j: r.last_costs,
                last_switch: r.last_switch.clone(),
                switches: r.switches,
            }
        })
    }
}

/// Whether the shadow runs under `cfg` (never in advise mode, where
/// smartmigd allocates nothing and so sees no jobs).
fn on(cfg: &Config) -> bool {
    cfg.mode != Mode::Advise && cfg.shadow.enabled
}

/// `learned` (the configured policy, whatever it is) or `fallback`.
fn side(k: usize) -> &'static str {
    if k == PRIMARY {
        "learned"
    } else {
        "fallback"
    }
}

/// A job holding an instance, as the day's book keeps it: it asked when
/// it got the instance less its wait; its deadline is Slurm's, else the
/// end of its time limit from then.
pub(super) fn seen(
    a: &Assignment,
    g: &Geometry,
    compute: u8,
    memory_gb: u32,
    deadline: f64,
) -> SeenJob {
    let arrival = a.since.saturating_sub(a.wait_s) as f64;
    let deadline = if deadline.is_finite() {
        deadline
    } else {
        a.time_limit_s.map_or(f64::INFINITY, |t| arrival + t as f64)
    };
    SeenJob {
        arrival,
        start: a.since as f64,
        end: None,
        compute,
        gpu_compute: g.spec.compute_slices,
        memory_gb: f64::from(memory_gb),
        deadline,
    }
}

/// The epoch's step: record the running jobs and, when a check is due,
/// replay and feed the switch.
pub(super) async fn step(cx: &Cx<'_>) {
    let cfg = cx.cfg();
    if !on(cfg) {
        // Turned on again later, the switch starts afresh on the policy.
        cx.books.shadow.with(|r| r.key.clear());
        return;
    }
    let now = unix_now_f64();
    let running = running_jobs(cx).await;
    let Some(check) = due(cx, now, running) else {
        return;
    };
    let models = check.models.clone();
    let jobs = check.jobs.len();
    let t0 = std::time::Instant::now();
    let costs = tokio::task::spawn_blocking(move || replay_both(&check))
        .await
        .map_err(ReplayError::from)
        .and_then(|r| r);
    cx.books.shadow.with(|r| {
        r.checks += 1;
        match costs {
            Ok(c) => {
                tracing::debug!(
                    jobs,
                    learned_j = c[0],
                    fallback_j = c[1],
                    ms = t0.elapsed().as_millis() as u64,
                    "shadow: day replayed under both policies"
                );
                r.last_costs = Some(c);
                let rel = now - r.book.origin();
                if let Some(sw) = r.state.observe(rel, &c) {
                    let shown = switched(cx, &sw, now, &models);
                    r.switches += 1;
                    r.last_switch = Some(shown);
                }
            }
            Err(e) => {
                r.failures += 1;
                tracing::warn!("shadow: replay failed, the running policy stays: {e}");
            }
        }
    });
}

/// The jobs holding instances now (each GPU's lock in turn, then the
/// ledger for Slurm's deadlines).
async fn running_jobs(cx: &Cx<'_>) -> Vec<(u64, SeenJob)> {
    let mut held = Vec::new();
    for gpu in &cx.books.gpus {
        let st = gpu.tx().await;
        let g = st.book.geometry;
        for i in &st.book.instances {
            if let Some(a) = &i.job {
                let p = g.spot(i.placement);
                held.push((a.clone(), g, p.compute(), p.profile.memory_gb));
            }
        }
    }
    cx.books.node(|ledger| {
        held.into_iter()
            .map(|(a, g, compute, mem)| {
                let d = ledger.times_of(a.job_id, a.deadline, None).deadline;
                (a.job_id, seen(&a, g, compute, mem, d))
            })
            .collect()
    })
}

/// Records the running jobs; when a check is due, what it replays (the
/// switch starts afresh when the settings changed, its costs when a new
/// day began).
fn due(cx: &Cx<'_>, now: f64, running: Vec<(u64, SeenJob)>) -> Option<Check> {
    let cfg = cx.cfg();
    let s = &cfg.shadow;
    cx.books.shadow.with(|r| {
        r.book.running(now, running);
        let key = format!("{}|{}|{:?}", cfg.policy.trim(), s.fallback_spec(), s.rule());
        if r.key != key {
            r.key = key;
            r.state = ShadowState::new(s.rule());
            r.next_check = now + s.every_s;
            r.last_costs = None;
            return None;
        }
        if now < r.next_check {
            return None;
        }
        r.next_check = now + s.every_s;
        if r.book.new_day(now) {
            r.state.restart_costs();
        }
        let models = cx.books.models();
        let origin = r.book.origin();
        Some(Check {
            jobs: r.book.jobs(now),
            now: now - origin,
            policy: cfg.policy.clone(),
            fallback: s.fallback_spec().to_string(),
            replay: replay_of(cfg, &models, origin),
            models,
        })
    })
}

/// How the day is replayed: the node's GPUs, EDF, the daemon's epoch,
/// exactly the requested slice size (as smartmigd hands out), the clock's
/// hour at the origin, and tardiness at `joules_per_tardiness_s` (default:
/// one of the node's GPUs at full power).
fn replay_of(cfg: &Config, models: &[GpuModel], origin: f64) -> Replay {
    let rate = cfg.shadow.joules_per_tardiness_s.unwrap_or_else(|| {
        models
            .iter()
            .map(|&m| PowerModel::default_for(m).max_w)
            .fold(0.0, f64::max)
    });
    Replay {
        cluster: models.to_vec(),
        heuristic: Heuristic::Edf,
        cfg: SimConfig {
            epoch: EpochRule::Seconds(cfg.epoch_s as f64),
            start_hour: origin.rem_euclid(86_400.0) / 3600.0,
            exact_size: true,
            ..SimConfig::default()
        },
        joules_per_tardiness_s: rate,
    }
}

/// Why a check has no costs (the running policy then stays).
#[derive(Debug, thiserror::Error)]
enum ReplayError {
    #[error("`{spec}`: {source}")]
    Policy {
        spec: String,
        source: PolicyChoiceError,
    },
    #[error("replaying `{spec}`: {source}")]
    Sim { spec: String, source: SimError },
    #[error("the replay task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// The day's cost so far under fresh copies of the policy and of the
/// fallback (blocking: a learned policy's file is read, the day simulated).
fn replay_both(c: &Check) -> Result<[f64; 2], ReplayError> {
    let mut out = [0.0; 2];
    for (k, spec) in [&c.policy, &c.fallback].into_iter().enumerate() {
        let built = if k == PRIMARY {
            build(spec, &c.models)
        } else {
            build_fallback(spec, &c.models)
        };
        let (mut p, _) = built.map_err(|source| ReplayError::Policy {
            spec: spec.clone(),
            source,
        })?;
        out[k] = c
            .replay
            .cost(&c.jobs, c.now, p.as_mut())
            .map_err(|source| ReplayError::Sim {
                spec: spec.clone(),
                source,
            })?;
    }
    Ok(out)
}

/// Logs and counts a hand-over; what status shows of it.
fn switched(cx: &Cx<'_>, sw: &Switch, now: f64, models: &[GpuModel]) -> ShadowSwitch {
    let costs = [
        sw.window_costs.get(PRIMARY).copied().unwrap_or(0.0),
        sw.window_costs.get(1).copied().unwrap_or(0.0),
    ];
    let (from, to) = (side(sw.from), side(sw.to));
    let fallback = cx
        .decider
        .fallback
        .as_ref()
        .map_or("the fallback", |(_, n)| n.as_str());
    let names = [cx.decider.policy_name.as_str(), fallback];
    let r = cx.cfg().shadow.rule();
    let reason = format!(
        "over the last {} s the day replayed under {} ({to}) cost {:.0} J, under {} ({from}) {:.0} J: a lead over the {} margin on {} check(s) in a row",
        r.window_s,
        names[sw.to.min(1)],
        costs[sw.to.min(1)],
        names[sw.from.min(1)],
        costs[sw.from.min(1)],
        r.margin,
        r.hold_checks
    );
    tracing::info!(
        from,
        to,
        learned_window_j = costs[0],
        fallback_window_j = costs[1],
        gpus = models.len(),
        "shadow: switching to the {to} policy: {reason}"
    );
    cx.svc.metrics.shadow_switch(to);
    ShadowSwitch {
        at: now as u64,
        from: from.into(),
        to: to.into(),
        window_costs_j: costs,
        reason,
    }
}
