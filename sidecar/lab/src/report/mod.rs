//! The comparison report: every policy on the same workload, side by side,
//! with the gap to the lower bounds (the README's main table).
//!
//! [`Comparison`] holds finished runs (metrics and per-bin series from the
//! event logs) and renders them as a text table, JSON ([`serde`]) or SVG
//! plots ([`plot`]), all pure. [`compare`] runs the simulations behind it
//! (`smartmig simulate --compare` is a thin shell over it) and assembles
//! the table from the finished runs ([`compare::assemble`]); no IO here:
//! the CLI prints and writes the files.
//!
//! ## Columns
//!
//! | column | meaning |
//! |---|---|
//! | rank | 1 = first: the fewest jobs unserved, then the lowest ET (`sim::Standing`) |
//! | energy MJ | energy of every GPU up to the day's horizon (where `none` ends; a row that ends later, its own end), idle included, plus the charge for jobs that never ran |
//! | tard. s | mean tardiness over all jobs (a job that never ran is charged as if run on a whole GPU after its row's horizon) |
//! | late % | share of jobs that finished after their deadline or never ran |
//! | unserved | jobs that never ran |
//! | ET | `(e + a t) / (1 + a)`, `e`, `t` relative to the exchange rate ([`Comparison::rate`]) |
//! | vs X | relative change of ET against baseline X: `ET / ET_X - 1` (negative = better) |
//! | E/E_LB | energy over the energy lower bound ([`crate::bound`]) |
//! | reconf. | reconfigurations applied |
//! | fus/fis/resh | of which fusions, fissions, reshapes (`sim::reshape`) |
//! | flags | `UNSERVED n` (ranks behind every row that served all), `WORSE` (ET above `none`'s) |

pub mod advise;
pub mod compare;
pub mod plot;
pub mod series;
pub mod suite;

use std::fmt::Write as _;

use serde::Serialize;

use crate::bound::Bounds;
use crate::eval::RowKind;
use crate::sim::{Metrics, Reference, Standing};
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
    /// Short name (`none`, `static`, `static-hist`, `learned`, ...).
    pub policy: String,
    /// Opponent, ours (`candidate`) or a hindsight reference.
    pub kind: RowKind,
    /// Full name, with the layouts a search chose.
    pub description: String,
    /// Charged at the day's horizon ([`Comparison::horizon_s`]), or at the
    /// row's own end if later.
    pub metrics: Metrics,
    /// Energy and mean tardiness relative to [`Comparison::rate`], and ET.
    pub e: f64,
    pub t: f64,
    pub et: f64,
    /// Jobs that never ran (unserved and rejected).
    pub unserved: u64,
    /// 1 for the row that ranks first: the fewest jobs unserved, then the
    /// lowest ET ([`Standing`]; [`Comparison::finish`]).
    pub rank: usize,
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
    /// The runs that normalise ET, in words.
    pub reference: String,
    /// The ET exchange rate: `none` pooled over the past days, or this
    /// workload's own `none` run when it has none; `T_ref` floored.
    pub rate: Reference,
    /// The day's horizon, where `none` ends (`sim::day_horizon`): every
    /// row's energy is integrated at least up to it, and up to its own end
    /// if later; jobs that never ran are charged from the row's horizon.
    /// Fixed by the workload, so a row's figures do not depend on the
    /// other rows. s.
    pub horizon_s: f64,
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
    /// Fills `rank`, `et_change` and `energy_over_bound` of every row from
    /// the rows' ET, jobs unserved and the bounds. Call after all rows are in.
    pub fn finish(&mut self) {
        let base: Vec<Option<f64>> = self
            .baselines
            .iter()
            .map(|b| self.rows.iter().find(|r| &r.policy == b).map(|r| r.et))
            .collect();
        let lb = self.bounds.energy.total_j;
        let mut order: Vec<usize> = (0..self.rows.len()).collect();
        order.sort_by_key(|&i| self.rows[i].standing());
        for (rank, &i) in order.iter().enumerate() {
            self.rows[i].rank = rank + 1;
        }
        for row in &mut self.rows {
            row.et_change = base
                .iter()
                .map(|b| b.filter(|&y| y > 0.0).map(|y| row.et / y - 1.0))
                .collect();
            row.energy_over_bound = if lb > 0.0 {
                row.metrics.energy_j / lb
            } else {
                f64::NAN
            };
        }
    }

    /// The row that ranks first.
    pub fn best(&self) -> Option<&Row> {
        self.rows.iter().find(|r| r.rank == 1)
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
        let mut header: Vec<String> = ["policy", "rank", "energy MJ", "tard. s", "late %"]
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        header.extend(["unserved".to_string(), "ET".into()]);
        header.extend(self.baselines.iter().map(|b| format!("vs {b}")));
        header.extend(["E/E_LB", "reconf.", "fus/fis/resh", "flags"].map(String::from));
        let mut lines: Vec<Vec<String>> = vec![header];
        let none_et = self.rows.iter().find(|r| r.policy == "none").map(|r| r.et);
        lines.extend(self.rows.iter().map(|r| self.cells(r, none_et)));
        lines.push(self.bound_cells());
        out.push_str(&aligned(&lines));
        self.footer(&mut out);
        out
    }

    fn cells(&self, r: &Row, none_et: Option<f64>) -> Vec<String> {
        let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |x| format!("{:+.1}%", 100.0 * x));
        let m = &r.metrics;
        let mut l = vec![
            r.policy.clone(),
            r.rank.to_string(),
            format!("{:.1}", m.energy_mj),
            format!("{:.1}", m.mean_tardiness_s),
            format!("{:.1}", 100.0 * m.late_share),
            r.unserved.to_string(),
            format!("{:.3}", r.et),
        ];
        l.extend(r.et_change.iter().map(|c| pct(*c)));
        let mut flags = Vec::new();
        if r.unserved > 0 {
            flags.push(format!("UNSERVED {}", r.unserved));
        }
        if none_et.is_some_and(|n| r.et > n + 1e-9) {
            flags.push("WORSE".into());
        }
        l.extend([
            format!("{:.3}", r.energy_over_bound),
            m.reconfigurations.to_string(),
            format!("{}/{}/{}", m.fusions, m.fissions, m.reshapes),
            flags.join(" "),
        ]);
        l
    }

    fn bound_cells(&self) -> Vec<String> {
        let b = &self.bounds;
        let mut l = vec![
            "lower bound".to_string(),
            String::new(),
            format!("{:.1}", b.energy.total_j / 1e6),
            format!("{:.1}", b.tardiness.mean_s),
            format!("{:.1}", 100.0 * b.tardiness.late_share),
            String::new(),
            format!("{:.3}", self.et_lower_bound),
        ];
        l.extend(self.baselines.iter().map(|_| String::new()));
        l.push("1.000".to_string());
        l
    }

    fn footer(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "ET = (e + {a} t)/(1 + {a}), e and t relative to {} ({:.1} MJ, T_ref {:.1} s{}).",
            self.reference,
            self.rate.energy_j / 1e6,
            self.rate.tardiness_s,
            if self.rate.floored() {
                " = the floor, 1 % of the mean job, at least 1 s".to_string()
            } else {
                String::new()
            },
            a = self.alpha
        );
        let _ = writeln!(
            out,
            "Every row's energy runs to {:.2} h, where whole GPUs end (a row that ends later, to its own end); a job that never ran is charged as if run on a whole GPU at full power from then, and ranks its row behind every row that served all (docs/evaluation.md).",
            self.horizon_s / 3600.0
        );
        let b = &self.bounds;
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
            let unserved = if r.unserved > 0 {
                format!(" [{} jobs never ran]", r.unserved)
            } else {
                String::new()
            };
            let _ = writeln!(out, "  {}: {}{}{}", r.policy, r.description, runs, unserved);
        }
        if let Some(best) = self.best() {
            let _ = writeln!(out, "Ranks first: {} (ET {:.3}).", best.policy, best.et);
        }
        let _ = writeln!(out, "({:.1} s)", self.elapsed_s);
    }
}

impl Row {
    /// Where the row stands: its jobs that never ran, then its ET.
    pub fn standing(&self) -> Standing {
        Standing::new(self.unserved, self.et)
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

    fn row(policy: &str, energy_j: f64, et: f64, unserved: u64) -> Row {
        Row {
            policy: policy.into(),
            kind: RowKind::Opponent,
            description: policy.into(),
            metrics: Metrics {
                energy_j,
                energy_mj: energy_j / 1e6,
                jobs: 10,
                unserved,
                ..Metrics::default()
            },
            e: 1.0,
            t: 1.0,
            et,
            unserved,
            rank: 0,
            et_change: Vec::new(),
            energy_over_bound: 0.0,
            search_runs: None,
            series: None,
        }
    }

    fn comparison(rows: Vec<Row>) -> Comparison {
        let mut c = Comparison {
            workload: "w".into(),
            gpus: 1,
            models: vec!["a100-40gb".into()],
            placement: "edf".into(),
            seed: 0,
            alpha: 1.0,
            reconfig_time_s: 4.0,
            reference: "none".into(),
            rate: Reference::pooled(&[], 0.0),
            horizon_s: 3600.0,
            baselines: vec!["none".into(), "static".into()],
            bounds: Bounds::default(),
            et_lower_bound: 0.5,
            rows,
            elapsed_s: 0.0,
        };
        c.bounds.energy.total_j = 1e6;
        c.finish();
        c
    }

    #[test]
    fn changes_and_ratios() {
        let c = comparison(vec![
            row("none", 2e6, 1.0, 0),
            row("static", 1.5e6, 0.8, 0),
            row("greedy", 1e6, 0.6, 0),
        ]);
        let g = &c.rows[2];
        assert!((g.et_change[0].unwrap() + 0.4).abs() < 1e-12);
        assert!((g.et_change[1].unwrap() + 0.25).abs() < 1e-12);
        assert!((g.energy_over_bound - 1.0).abs() < 1e-12);
        assert_eq!(c.best().map(|r| r.policy.as_str()), Some("greedy"));
        let t = c.table();
        assert!(t.contains("vs static"), "{t}");
        assert!(t.contains("-25.0%"), "{t}");
        assert!(t.contains("lower bound"), "{t}");
        let json = serde_json::to_value(&c).unwrap();
        assert!(json["rows"][0].get("series").is_none());
    }

    /// A row that left jobs unserved ranks behind every row that served
    /// them all, whatever its ET, and the table flags it as it flags a row
    /// worse than `none`.
    #[test]
    fn unserved_rows_rank_last_and_are_flagged() {
        let c = comparison(vec![
            row("none", 2e6, 1.0, 0),
            row("static", 0.5e6, 0.4, 181),
            row("greedy", 1e6, 1.2, 0),
        ]);
        let ranks: Vec<usize> = c.rows.iter().map(|r| r.rank).collect();
        assert_eq!(ranks, [1, 3, 2]);
        let t = c.table();
        let line = |p: &str| {
            t.lines()
                .find(|l| l.split_whitespace().next() == Some(p))
                .unwrap_or_default()
                .to_string()
        };
        assert!(line("static").ends_with("UNSERVED 181"), "{t}");
        assert!(line("greedy").ends_with("WORSE"), "{t}");
        assert!(t.contains("Ranks first: none"), "{t}");
    }
}
