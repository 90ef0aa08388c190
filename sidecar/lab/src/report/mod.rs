//! The comparison report: every policy on the same workload, side by side,
//! with the gap to the lower bounds (the README's main table).
//!
//! This module is pure: [`Comparison`] holds finished runs (metrics and
//! per-bin series from the event logs) and renders them as a text table,
//! JSON ([`serde`]) or SVG plots ([`plot`]). Running the simulations is the
//! CLI's job (`smartmig simulate --compare`, in `cli::compare`).
//!
//! ## Columns
//!
//! | column | meaning |
//! |---|---|
//! | energy MJ | energy of every GPU over the run, idle included |
//! | tard. s | mean tardiness over the jobs that ran |
//! | late % | share of jobs that finished after their deadline |
//! | ET | `(e + a t) / (1 + a)`, `e`, `t` relative to the `none` run (so `none` = 1) |
//! | vs X | relative change of ET against baseline X: `ET / ET_X - 1` (negative = better) |
//! | E/E_LB | energy over the energy lower bound ([`crate::bound`]) |
//! | reconf. | reconfigurations applied |
//! | fus/fis/resh | of which fusions, fissions, reshapes (`sim::reshape`) |

pub mod advise;
pub mod plot;
pub mod series;
pub mod suite;

use std::fmt::Write as _;

use serde::Serialize;

use crate::bound::Bounds;
use crate::sim::Metrics;
pub use series::TimeSeries;

/// Why a report could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("invalid run data: {0}")]
    Invalid(String),
    #[error("plotting: {0}")]
    Plot(String),
}

/// One policy's run.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Short name of the policy family (`none`, `static`, `static-best`, ...).
    pub policy: String,
    /// Full name, with the layouts a search chose.
    pub description: String,
    pub metrics: Metrics,
    /// Energy relative to the reference run.
    pub e: f64,
    /// Mean tardiness relative to the reference run (`None`: the reference
    /// had none and this run had some).
    pub t: Option<f64>,
    pub et: Option<f64>,
    /// `ET / ET_baseline - 1` for each baseline, in the order of
    /// [`Comparison::baselines`].
    pub et_change: Vec<Option<f64>>,
    /// `energy / energy lower bound`.
    pub energy_over_bound: f64,
    /// Simulations the policy's search ran (static-best, twice-daily).
    pub search_runs: Option<usize>,
    /// Per-bin series from the event log (not in the JSON: large).
    #[serde(skip)]
    pub series: Option<TimeSeries>,
}

/// Everything the comparison table shows.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// What was simulated, e.g. `diurnal day (seed 0)` or a trace path.
    pub workload: String,
    pub gpus: usize,
    pub models: Vec<String>,
    pub placement: String,
    pub seed: u64,
    pub alpha: f64,
    pub reconfig_time_s: f64,
    /// The run that normalises ET (`none` with the same placement).
    pub reference: String,
    /// Policies the `vs` columns compare against (short names).
    pub baselines: Vec<String>,
    pub bounds: Bounds,
    /// ET lower bound with the same normalisation.
    pub et_lower_bound: f64,
    pub rows: Vec<Row>,
    /// Wall-clock time of the whole comparison, s.
    pub elapsed_s: f64,
}

impl Comparison {
    /// Fills `et_change` and `energy_over_bound` of every row from the
    /// rows' ET and the bounds. Call after all rows are in.
    pub fn finish(&mut self) {
        let base: Vec<Option<f64>> = self
            .baselines
            .iter()
            .map(|b| self.rows.iter().find(|r| &r.policy == b).and_then(|r| r.et))
            .collect();
        let lb = self.bounds.energy.total_j;
        for row in &mut self.rows {
            row.et_change = base
                .iter()
                .map(|b| match (row.et, *b) {
                    (Some(x), Some(y)) if y > 0.0 => Some(x / y - 1.0),
                    _ => None,
                })
                .collect();
            row.energy_over_bound = if lb > 0.0 {
                row.metrics.energy_j / lb
            } else {
                f64::NAN
            };
        }
    }

    /// The table printed by `smartmig simulate --compare`.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} on {} GPUs ({}), placement {}, seed {}, reconfiguration {} s, {} jobs",
            self.workload,
            self.gpus,
            self.models.join(", "),
            self.placement,
            self.seed,
            self.reconfig_time_s,
            self.rows.first().map_or(0, |r| r.metrics.jobs),
        );
        let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |x| format!("{:+.1}%", 100.0 * x));
        let mut header = vec![
            "policy".to_string(),
            "energy MJ".into(),
            "tard. s".into(),
            "late %".into(),
            "ET".into(),
        ];
        header.extend(self.baselines.iter().map(|b| format!("vs {b}")));
        header.extend([
            "E/E_LB".to_string(),
            "reconf.".into(),
            "fus/fis/resh".into(),
        ]);
        let mut lines: Vec<Vec<String>> = vec![header];
        for r in &self.rows {
            let m = &r.metrics;
            let mut l = vec![
                r.policy.clone(),
                format!("{:.1}", m.energy_mj),
                format!("{:.1}", m.mean_tardiness_s),
                format!("{:.1}", 100.0 * m.late_share),
                r.et.map_or("n/a".to_string(), |x| format!("{x:.3}")),
            ];
            l.extend(r.et_change.iter().map(|c| pct(*c)));
            l.extend([
                format!("{:.3}", r.energy_over_bound),
                m.reconfigurations.to_string(),
                format!("{}/{}/{}", m.fusions, m.fissions, m.reshapes),
            ]);
            lines.push(l);
        }
        let b = &self.bounds;
        let mut l = vec![
            "lower bound".to_string(),
            format!("{:.1}", b.energy.total_j / 1e6),
            format!("{:.1}", b.tardiness.mean_s),
            format!("{:.1}", 100.0 * b.tardiness.late_share),
            format!("{:.3}", self.et_lower_bound),
        ];
        l.extend(self.baselines.iter().map(|_| String::new()));
        l.extend(["1.000".to_string(), String::new(), String::new()]);
        lines.push(l);
        out.push_str(&aligned(&lines));
        let _ = writeln!(
            out,
            "ET = (e + {a} t)/(1 + {a}), e and t relative to the reference run: {}.",
            self.reference,
            a = self.alpha
        );
        let _ = writeln!(
            out,
            "Lower bound: energy = idle power x {:.2} h + every job on its most efficient slice on full GPUs; \
             tardiness = max(start at arrival on the whole GPU, single-machine SRPT relaxation) (docs/bounds.md).",
            b.energy.horizon_s / 3600.0
        );
        for r in &self.rows {
            let runs = r
                .search_runs
                .map_or(String::new(), |n| format!(" [search: {n} simulations]"));
            let unserved = if r.metrics.unserved > 0 {
                format!(" [{} jobs never ran]", r.metrics.unserved)
            } else {
                String::new()
            };
            let _ = writeln!(out, "  {}: {}{}{}", r.policy, r.description, runs, unserved);
        }
        let _ = writeln!(out, "({:.1} s)", self.elapsed_s);
        out
    }
}

/// Renders rows of cells as a text table: the first column left-aligned,
/// the others right-aligned, a rule under the header (the first row).
pub fn aligned(lines: &[Vec<String>]) -> String {
    let mut out = String::new();
    let cols = lines.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            lines
                .iter()
                .map(|l| l.get(c).map_or(0, |x| x.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (i, l) in lines.iter().enumerate() {
        let mut s = String::new();
        for (c, cell) in l.iter().enumerate() {
            if c == 0 {
                let _ = write!(s, "{:<w$}", cell, w = widths[c]);
            } else {
                let _ = write!(s, "  {:>w$}", cell, w = widths[c]);
            }
        }
        let _ = writeln!(out, "{}", s.trim_end());
        if i == 0 {
            let _ = writeln!(
                out,
                "{}",
                "-".repeat(widths.iter().sum::<usize>() + 2 * cols.saturating_sub(1))
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: &str, energy_j: f64, et: Option<f64>) -> Row {
        Row {
            policy: policy.into(),
            description: policy.into(),
            metrics: Metrics {
                energy_j,
                energy_mj: energy_j / 1e6,
                jobs: 10,
                ..Metrics::default()
            },
            e: 1.0,
            t: Some(1.0),
            et,
            et_change: Vec::new(),
            energy_over_bound: 0.0,
            search_runs: None,
            series: None,
        }
    }

    #[test]
    fn changes_and_ratios() {
        let mut c = Comparison {
            workload: "w".into(),
            gpus: 1,
            models: vec!["a100-40gb".into()],
            placement: "edf".into(),
            seed: 0,
            alpha: 1.0,
            reconfig_time_s: 4.0,
            reference: "none".into(),
            baselines: vec!["none".into(), "static".into()],
            bounds: Bounds::default(),
            et_lower_bound: 0.5,
            rows: vec![
                row("none", 2e6, Some(1.0)),
                row("static", 1.5e6, Some(0.8)),
                row("greedy", 1e6, Some(0.6)),
            ],
            elapsed_s: 0.0,
        };
        c.bounds.energy.total_j = 1e6;
        c.finish();
        let g = &c.rows[2];
        assert!((g.et_change[0].unwrap() + 0.4).abs() < 1e-12);
        assert!((g.et_change[1].unwrap() + 0.25).abs() < 1e-12);
        assert!((g.energy_over_bound - 1.0).abs() < 1e-12);
        let t = c.table();
        assert!(t.contains("vs static"), "{t}");
        assert!(t.contains("-25.0%"), "{t}");
        assert!(t.contains("lower bound"), "{t}");
        let json = serde_json::to_value(&c).unwrap();
        assert!(json["rows"][0].get("series").is_none());
    }
}
