//! Coordination across nodes (issue 23, part 2; `docs/evaluation.md`,
//! "Coordination across nodes"): the engine of `smartmig bench
//! coordination`.
//!
//! Every node's smartmigd sees the whole cluster's pending queue and
//! decides its own GPUs alone, so when many jobs wait for one profile,
//! idle GPUs on every node may reshape for them at once (a *herd
//! reaction*), and most of those reshapes are undone unused. The
//! simulator's policies see the whole cluster (a central decider), which
//! never herds. This experiment runs the same days three ways per policy:
//!
//! - `central`: the policy over the whole cluster (the simulator's
//!   reference; no node boundaries);
//! - `nodes/whole`: one policy instance per node, each seeing its own GPUs
//!   and the whole queue ([`crate::policy::nodes::Split::Whole`], today's
//!   daemons);
//! - `nodes/claimed`: the same, each node seeing only the pending jobs it
//!   claims by rendezvous hashing ([`crate::policy::share`],
//!   [`crate::policy::nodes::Split::Claimed`], the coordinated design);
//!
//! plus `none` (whole GPUs) for scale. Each run's event log is audited
//! ([`crate::sim::audit`], which must agree with the run's energy and
//! tardiness) and read by [`crate::sim::waste`] for the instances that
//! reconfigurations created in vain. ET uses one exchange rate for every
//! row: the `none` runs of the scored days pooled ([`Reference::pooled`];
//! nothing is fitted here, the rate only converts joules and
//! tardiness-seconds). Pure: no IO.

use std::fmt;

use serde::Serialize;

use super::days::{Day, DaySet};
use super::score::Reference;
use super::{agrees, audit_run, AuditFailure};
use crate::mig::GpuModel;
use crate::policy::nodes::{Nodes, NodesError, PerNode, Split};
use crate::policy::{parse_policy_on, PolicyParseError, RepartitionPolicy};
use crate::scenario::Scenario;
use crate::sim::{
    count_waste, day_horizon, AuditError, Collect, EpochRule, Heuristic, Metrics, SimError, Waste,
};
use crate::workload::WorkloadError;

/// Who decides the layouts (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arrangement {
    /// Whole GPUs, no policy (the scale of the ET column).
    None,
    Central,
    /// Per node, the whole queue.
    NodesWhole,
    /// Per node, the claimed share of the queue.
    NodesClaimed,
}

impl Arrangement {
    /// The arrangements every policy runs in.
    pub const POLICY: [Arrangement; 3] = [
        Arrangement::Central,
        Arrangement::NodesWhole,
        Arrangement::NodesClaimed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Arrangement::None => "none",
            Arrangement::Central => "central",
            Arrangement::NodesWhole => "nodes/whole",
            Arrangement::NodesClaimed => "nodes/claimed",
        }
    }

    /// The queue split of a per-node arrangement.
    pub fn split(self) -> Option<Split> {
        match self {
            Arrangement::NodesWhole => Some(Split::Whole),
            Arrangement::NodesClaimed => Some(Split::Claimed),
            Arrangement::None | Arrangement::Central => None,
        }
    }
}

impl fmt::Display for Arrangement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The experiment's settings.
#[derive(Clone, Debug)]
pub struct CoordinationConfig {
    pub model: GpuModel,
    pub gpus: usize,
    pub gpus_per_node: usize,
    /// The workload: one day of this scenario per seed, generated for
    /// `load x gpus` GPUs (the scenarios' rates are per GPU, so `load`
    /// scales the offered load; 1 = the scenario's calibration).
    pub scenario: Scenario,
    pub load: f64,
    pub seeds: Vec<u64>,
    /// Policy specs (`greedy`, `policy:FILE.onnx`, ...), each run in every
    /// [`Arrangement::POLICY`].
    pub policies: Vec<String>,
    pub heuristic: Heuristic,
    /// When every arrangement is asked (the same for all).
    pub epoch: EpochRule,
    /// Weight of tardiness in ET.
    pub alpha: f64,
}

/// Seconds between decision epochs of smartmigd (its `epoch_s` default).
pub const DAEMON_EPOCH_S: f64 = 60.0;

impl CoordinationConfig {
    /// `gpus` GPUs of `model` in nodes of `gpus_per_node`, one day of
    /// `scenario` (seed 1000), `greedy`, EDF placement, an epoch every
    /// [`DAEMON_EPOCH_S`] (the daemon's cadence), alpha 1.
    pub fn new(model: GpuModel, gpus: usize, gpus_per_node: usize, scenario: Scenario) -> Self {
        CoordinationConfig {
            model,
            gpus,
            gpus_per_node,
            scenario,
            load: 1.0,
            seeds: vec![1000],
            policies: vec!["greedy".into()],
            heuristic: Heuristic::Edf,
            epoch: EpochRule::Seconds(DAEMON_EPOCH_S),
            alpha: 1.0,
        }
    }

    /// Checks the settings and every policy spec before any simulation.
    pub fn validate(&self) -> Result<(), CoordinationError> {
        let bad = |s: String| Err(CoordinationError::Config(s));
        Nodes::new(self.gpus, self.gpus_per_node)?;
        if self.seeds.is_empty() {
            return bad("no days: give at least one seed".into());
        }
        let mut seeds = self.seeds.clone();
        seeds.sort_unstable();
        if let Some(w) = seeds.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("seed {} is given twice", w[0]));
        }
        if self.policies.is_empty() {
            return bad("no policy to compare".into());
        }
        if !(self.load.is_finite() && self.load > 0.0 && self.load <= 100.0) {
            return bad(format!("load {} is not in (0, 100]", self.load));
        }
        if !(self.alpha.is_finite() && self.alpha >= 0.0) {
            return bad(format!("alpha {} is not a finite value >= 0", self.alpha));
        }
        self.scenario.validate()?;
        let cluster = vec![self.model; self.gpus];
        for spec in &self.policies {
            parse_policy_on(spec, &cluster, self.scenario.start_hour()).map_err(|source| {
                CoordinationError::Policy {
                    spec: spec.clone(),
                    source,
                }
            })?;
        }
        Ok(())
    }
}

/// Why the experiment could not run.
#[derive(Debug, thiserror::Error)]
pub enum CoordinationError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Nodes(#[from] NodesError),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("policy `{spec}`: {source}")]
    Policy {
        spec: String,
        source: PolicyParseError,
    },
    #[error("{row} on seed {seed}: {source}")]
    Sim {
        row: String,
        seed: u64,
        source: SimError,
    },
    #[error("{row} on seed {seed}: the event log fails the audit: {source}")]
    Audit {
        row: String,
        seed: u64,
        source: AuditError,
    },
    #[error(
        "{row} on seed {seed}: the audit recomputed {what} {audited}, the run reported {reported}"
    )]
    AuditMismatch {
        row: String,
        seed: u64,
        what: &'static str,
        audited: f64,
        reported: f64,
    },
}

/// One row on one day.
#[derive(Clone, Debug, Serialize)]
pub struct DayRun {
    pub seed: u64,
    pub jobs: u64,
    pub et: f64,
    pub energy_j: f64,
    pub mean_tardiness_s: f64,
    pub late_jobs: u64,
    pub mean_wait_s: f64,
    /// Jobs that never ran (unserved or rejected).
    pub unserved: u64,
    pub rejected_decisions: u64,
    pub epochs: u64,
    pub waste: Waste,
}

/// One row: a policy in one arrangement over the days (means per day, and
/// the worst day).
#[derive(Clone, Debug, Serialize)]
pub struct CoordinationRow {
    /// The policy spec (`none` for the whole-GPU row).
    pub policy: String,
    pub arrangement: Arrangement,
    /// What ran, as the policy describes itself.
    pub description: String,
    pub reconfigurations: f64,
    /// Instances the reconfigurations created; of them those that never
    /// ran a job ([`Waste::wasted`]), split into those a later
    /// reconfiguration destroyed and those left at the end; and the
    /// reconfigurations none of whose instances ran a job.
    pub created: f64,
    pub wasted: f64,
    pub destroyed_unused: f64,
    pub unused_at_end: f64,
    pub futile_reconfigurations: f64,
    /// All days' wasted / all days' created.
    pub wasted_share: f64,
    pub et: f64,
    pub energy_mj: f64,
    pub late_jobs: f64,
    pub mean_tardiness_s: f64,
    pub mean_wait_s: f64,
    /// Jobs that never ran, all days.
    pub unserved: u64,
    pub rejected_decisions: u64,
    /// The worst day's ET and wasted instances.
    pub worst_et: f64,
    pub worst_wasted: u64,
    pub days: Vec<DayRun>,
}

impl CoordinationRow {
    fn new(policy: &str, arrangement: Arrangement, description: String, days: Vec<DayRun>) -> Self {
        let n = days.len().max(1) as f64;
        let mean = |f: &dyn Fn(&DayRun) -> f64| days.iter().map(f).sum::<f64>() / n;
        let sum = |f: &dyn Fn(&DayRun) -> u64| days.iter().map(f).sum::<u64>();
        let created = sum(&|d| d.waste.created);
        CoordinationRow {
            policy: policy.to_string(),
            arrangement,
            description,
            reconfigurations: mean(&|d| d.waste.reconfigurations as f64),
            created: mean(&|d| d.waste.created as f64),
            wasted: mean(&|d| d.waste.wasted() as f64),
            destroyed_unused: mean(&|d| d.waste.destroyed_unused as f64),
            unused_at_end: mean(&|d| d.waste.unused_at_end as f64),
            futile_reconfigurations: mean(&|d| d.waste.futile_reconfigurations as f64),
            wasted_share: if created == 0 {
                0.0
            } else {
                sum(&|d| d.waste.wasted()) as f64 / created as f64
            },
            et: mean(&|d| d.et),
            energy_mj: mean(&|d| d.energy_j) / 1e6,
            late_jobs: mean(&|d| d.late_jobs as f64),
            mean_tardiness_s: mean(&|d| d.mean_tardiness_s),
            mean_wait_s: mean(&|d| d.mean_wait_s),
            unserved: sum(&|d| d.unserved),
            rejected_decisions: sum(&|d| d.rejected_decisions),
            worst_et: days.iter().map(|d| d.et).fold(f64::NEG_INFINITY, f64::max),
            worst_wasted: days.iter().map(|d| d.waste.wasted()).max().unwrap_or(0),
            days,
        }
    }

    /// `<policy> <arrangement>`, e.g. `greedy nodes/claimed`.
    pub fn label(&self) -> String {
        if self.arrangement == Arrangement::None {
            "none".into()
        } else {
            format!("{} {}", self.policy, self.arrangement)
        }
    }
}

/// The experiment's result.
#[derive(Clone, Debug, Serialize)]
pub struct CoordinationReport {
    pub model: GpuModel,
    pub gpus: usize,
    pub gpus_per_node: usize,
    pub nodes: usize,
    pub scenario: String,
    /// The offered load's multiplier ([`CoordinationConfig::load`]).
    pub load: f64,
    pub seeds: Vec<u64>,
    /// Mean jobs per day.
    pub jobs_per_day: f64,
    /// `every 60 s`, `every 5 events`.
    pub epoch: String,
    pub placement: String,
    pub alpha: f64,
    /// The ET exchange rate: `none` pooled over the scored days.
    pub reference: Reference,
    /// Event logs audited (every simulated run but `none`'s).
    pub audited_logs: usize,
    /// `none`, then per policy `central`, `nodes/whole`, `nodes/claimed`.
    pub rows: Vec<CoordinationRow>,
}

impl CoordinationReport {
    /// The row of `policy` in `arrangement`.
    pub fn row(&self, policy: &str, arrangement: Arrangement) -> Option<&CoordinationRow> {
        self.rows.iter().find(|r| {
            r.arrangement == arrangement && (r.policy == policy || arrangement == Arrangement::None)
        })
    }
}

/// `every 60 s` / `every 5 events`.
pub fn describe_epoch(epoch: EpochRule) -> String {
    match epoch {
        EpochRule::Seconds(s) => format!("every {s} s"),
        EpochRule::Events(n) => format!("every {n} arrival/completion events"),
    }
}

/// The policy `spec` in `arrangement` on `cluster` (`None` is not a
/// policy arrangement: it builds `none`).
pub fn build(
    spec: &str,
    arrangement: Arrangement,
    cluster: &[GpuModel],
    gpus_per_node: usize,
    start_hour: f64,
) -> Result<Box<dyn RepartitionPolicy + Send>, CoordinationError> {
    let parse = |cluster: &[GpuModel]| {
        parse_policy_on(spec, cluster, start_hour).map_err(|source| CoordinationError::Policy {
            spec: spec.to_string(),
            source,
        })
    };
    let Some(split) = arrangement.split() else {
        return match arrangement {
            Arrangement::None => Ok(Box::new(crate::policy::NoPartition)),
            _ => parse(cluster),
        };
    };
    let nodes = Nodes::new(cluster.len(), gpus_per_node)?;
    let policies = (0..nodes.count())
        .map(|n| parse(&cluster[nodes.range(n)]))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Box::new(PerNode::new(nodes, split, policies)?))
}

/// One run of a row on one day, at its own horizon, with its audit.
struct RawDay {
    seed: u64,
    metrics: Metrics,
    audit: Option<crate::sim::AuditReport>,
    waste: Waste,
}

/// A row whose days wait for their common horizons.
struct RawRow {
    policy: String,
    arrangement: Arrangement,
    description: String,
    days: Vec<RawDay>,
}

/// Runs the experiment (module docs). `progress` hears each run's name.
pub fn run_coordination(
    cfg: &CoordinationConfig,
    progress: &mut dyn FnMut(&str),
) -> Result<CoordinationReport, CoordinationError> {
    cfg.validate()?;
    let cluster = vec![cfg.model; cfg.gpus];
    let s = &cfg.scenario;
    progress("days and none");
    let workload_gpus = ((cfg.gpus as f64 * cfg.load).round() as usize).max(1);
    let days: Vec<Day> = cfg
        .seeds
        .iter()
        .map(|&seed| {
            let mut d = Day::generated(
                s.generate(cfg.model, workload_gpus, seed),
                seed,
                s.horizon_s(),
                s.start_hour(),
            );
            d.cfg.epoch = cfg.epoch;
            d
        })
        .collect();
    let set =
        DaySet::new(&cluster, cfg.heuristic, days).map_err(|source| CoordinationError::Sim {
            row: "none".into(),
            seed: cfg.seeds[0],
            source,
        })?;
    let reference = set.rate();
    let mut raw = vec![RawRow {
        policy: "none".into(),
        arrangement: Arrangement::None,
        description: "whole GPUs (MIG off in effect)".into(),
        days: set
            .references
            .iter()
            .zip(&cfg.seeds)
            .map(|(m, &seed)| RawDay {
                seed,
                metrics: m.clone(),
                audit: None,
                waste: Waste::default(),
            })
            .collect(),
    }];
    for spec in &cfg.policies {
        for arrangement in Arrangement::POLICY {
            raw.push(policy_row(
                cfg,
                &set,
                &cluster,
                spec,
                arrangement,
                progress,
            )?);
        }
    }
    let rows = charged_rows(&raw, &reference, cfg.alpha)?;
    let jobs: usize = set.days.iter().map(|d| d.jobs.len()).sum();
    Ok(CoordinationReport {
        model: cfg.model,
        gpus: cfg.gpus,
        gpus_per_node: cfg.gpus_per_node,
        nodes: cfg.gpus.div_ceil(cfg.gpus_per_node),
        scenario: s.name.clone(),
        load: cfg.load,
        seeds: cfg.seeds.clone(),
        jobs_per_day: jobs as f64 / set.len().max(1) as f64,
        epoch: describe_epoch(cfg.epoch),
        placement: cfg.heuristic.to_string(),
        alpha: cfg.alpha,
        reference,
        audited_logs: raw
            .iter()
            .flat_map(|r| &r.days)
            .filter(|d| d.audit.is_some())
            .count(),
        rows,
    })
}

fn audit_error(row: &str, seed: u64, failure: AuditFailure) -> CoordinationError {
    let row = row.to_string();
    match failure {
        AuditFailure::Audit(source) => CoordinationError::Audit { row, seed, source },
        AuditFailure::Mismatch {
            what,
            audited,
            reported,
        } => CoordinationError::AuditMismatch {
            row,
            seed,
            what,
            audited,
            reported,
        },
    }
}

/// `spec` in `arrangement` on every day, each run audited and its wasted
/// instances counted.
fn policy_row(
    cfg: &CoordinationConfig,
    set: &DaySet,
    cluster: &[GpuModel],
    spec: &str,
    arrangement: Arrangement,
    progress: &mut dyn FnMut(&str),
) -> Result<RawRow, CoordinationError> {
    let row = format!("{spec} {arrangement}");
    let mut days = Vec::new();
    let mut description = String::new();
    for (i, &seed) in cfg.seeds.iter().enumerate() {
        progress(&format!("{row}, seed {seed}"));
        let start_hour = cfg.scenario.start_hour();
        let mut policy = build(spec, arrangement, cluster, cfg.gpus_per_node, start_hour)?;
        description = policy.describe();
        let mut log = Collect::default();
        let r = set
            .run(i, policy.as_mut(), Some(&mut log))
            .map_err(|source| CoordinationError::Sim {
                row: row.clone(),
                seed,
                source,
            })?;
        let m = r.metrics;
        let audit = audit_run(&log.0, &m).map_err(|e| audit_error(&row, seed, e))?;
        let waste = count_waste(&log.0);
        if waste.reconfigurations != m.reconfigurations {
            return Err(CoordinationError::AuditMismatch {
                row,
                seed,
                what: "reconfigurations",
                audited: waste.reconfigurations as f64,
                reported: m.reconfigurations as f64,
            });
        }
        days.push(RawDay {
            seed,
            metrics: m,
            audit: Some(audit),
            waste,
        });
    }
    Ok(RawRow {
        policy: spec.to_string(),
        arrangement,
        description,
        days,
    })
}

/// Charges every run at its day's common horizon (`sim::metrics`; the
/// audit re-charges on its own and must agree) and scores the rows.
fn charged_rows(
    raw: &[RawRow],
    reference: &Reference,
    alpha: f64,
) -> Result<Vec<CoordinationRow>, CoordinationError> {
    let days = raw.first().map_or(0, |r| r.days.len());
    let horizons: Vec<f64> = (0..days)
        .map(|i| day_horizon(&raw[0].days[i].metrics))
        .collect();
    let mut rows = Vec::new();
    for r in raw {
        let mut out = Vec::new();
        for (d, &h) in r.days.iter().zip(&horizons) {
            let m = d.metrics.at_horizon(h);
            if let Some(a) = &d.audit {
                let label = format!("{} {}", r.policy, r.arrangement);
                agrees(&a.at_horizon(h), &m).map_err(|e| audit_error(&label, d.seed, e))?;
            }
            out.push(DayRun {
                seed: d.seed,
                jobs: m.jobs,
                et: reference.et_of(&m, alpha),
                energy_j: m.energy_j,
                mean_tardiness_s: m.mean_tardiness_s,
                late_jobs: m.late_jobs,
                mean_wait_s: m.mean_wait_s,
                unserved: m.never_ran(),
                rejected_decisions: m.rejected_decisions,
                epochs: m.epochs,
                waste: d.waste,
            });
        }
        rows.push(CoordinationRow::new(
            &r.policy,
            r.arrangement,
            r.description.clone(),
            out,
        ));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::default_scenarios;

    fn scenario(name: &str) -> Scenario {
        default_scenarios()
            .into_iter()
            .find(|s| s.name == name)
            .expect("a shipped scenario")
    }

    #[test]
    fn bad_settings_are_refused_before_any_run() {
        let ok = CoordinationConfig::new(GpuModel::A100_40gb, 16, 8, scenario("campaigns/tight"));
        assert!(ok.validate().is_ok());
        let cases: Vec<(CoordinationConfig, &str)> = vec![
            (
                CoordinationConfig {
                    gpus_per_node: 0,
                    ..ok.clone()
                },
                "GPUs per node",
            ),
            (
                CoordinationConfig {
                    gpus: 0,
                    ..ok.clone()
                },
                "0 GPUs",
            ),
            (
                CoordinationConfig {
                    seeds: vec![],
                    ..ok.clone()
                },
                "no days",
            ),
            (
                CoordinationConfig {
                    seeds: vec![3, 4, 3],
                    ..ok.clone()
                },
                "seed 3 is given twice",
            ),
            (
                CoordinationConfig {
                    policies: vec![],
                    ..ok.clone()
                },
                "no policy",
            ),
            (
                CoordinationConfig {
                    policies: vec!["greedyish".into()],
                    ..ok.clone()
                },
                "policy `greedyish`",
            ),
            (
                CoordinationConfig {
                    alpha: -1.0,
                    ..ok.clone()
                },
                "alpha",
            ),
        ];
        for (c, says) in cases {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    #[test]
    fn arrangements_build_what_they_name() {
        let cluster = vec![GpuModel::A100_40gb; 20];
        let name = |a| build("greedy", a, &cluster, 8, 0.0).unwrap().name();
        assert_eq!(name(Arrangement::None), "none");
        assert_eq!(name(Arrangement::Central), "greedy");
        assert_eq!(name(Arrangement::NodesWhole), "nodes:8:whole:greedy");
        assert_eq!(name(Arrangement::NodesClaimed), "nodes:8:claimed:greedy");
    }
}
