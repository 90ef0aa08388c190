//! Text tables and SVG plots of `smartmig bench suite`
//! ([`crate::eval::SuiteReport`]).
//!
//! | column | meaning |
//! |---|---|
//! | ET | mean over the test days of `(e + a t) / (1 + a)`, `e` and `t` relative to `none` pooled over the training days (one exchange rate per scenario) |
//! | ET/seed | the same with each day scored against its own `none` run |
//! | energy MJ, tard. s | mean energy per test day, mean of the days' mean tardiness |
//! | late %, wait s, p95 wait s | share of late jobs (jobs that never ran count), mean and 95th-percentile wait |
//! | unserved | jobs that never ran over the test days, `UNSERVED n`: such a row ranks behind every row that served all |
//! | bsld | mean bounded slowdown, tau = 10 s |
//! | jobs/h, makespan h | completed jobs per hour of makespan; last completion - first arrival |
//! | reconf. | reconfigurations per test day |
//! | fus/fis/resh | of which fusions, fissions, reshapes (`sim::reshape`) |
//! | served fus/fis | jobs per test day that completed on an instance a fusion / a fission created |
//! | worst day | the worst test day's `ET / ET(none) - 1` |
//! | worse days | test days on which the policy did worse than whole GPUs |

use std::fmt::Write as _;

use plotters::prelude::*;

use super::{aligned, ReportError};
use crate::eval::{GateRow, PolicyRow, RowKind, RunnableBest, ScenarioResult, SuiteReport};

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// `a/b/c` of per-day means, or `-` when any is missing.
fn triple(v: &[Option<f64>]) -> String {
    v.iter()
        .map(|x| x.map(|x| format!("{x:.0}")))
        .collect::<Option<Vec<_>>>()
        .map_or_else(|| "-".to_string(), |p| p.join("/"))
}

fn kind(k: RowKind) -> &'static str {
    match k {
        RowKind::Opponent => "opponent",
        RowKind::Candidate => "ours",
        RowKind::Hindsight => "hindsight",
        RowKind::Bound => "bound",
    }
}

/// `seeds 0-7` for consecutive seeds, else the labels joined.
fn days(labels: &[String]) -> String {
    let seeds: Option<Vec<u64>> = labels
        .iter()
        .map(|l| l.strip_prefix("seed ").and_then(|n| n.parse().ok()))
        .collect();
    match seeds {
        Some(s) if s.len() > 2 && s.windows(2).all(|w| w[1] == w[0] + 1) => {
            format!("seeds {}-{}", s[0], s[s.len() - 1])
        }
        _ => labels.join(", "),
    }
}

/// The table of one scenario.
pub fn scenario_table(s: &ScenarioResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: {} GPUs ({}), {:.0} jobs a test day",
        s.name,
        s.gpus,
        s.models.join(", "),
        s.jobs_per_day
    );
    let _ = writeln!(
        out,
        "  training days (opponents fitted here): {}; test days: {}",
        days(&s.train_days),
        days(&s.test_days)
    );
    let _ = writeln!(
        out,
        "  ET exchange rate: 1 s of mean tardiness = {:.0} J (none pooled over the training days: {:.2} MJ, {:.1} s{})",
        s.joules_per_tardiness_s,
        s.reference.energy_j / 1e6,
        s.reference.tardiness_s,
        if s.reference.tardiness_s <= s.reference.floor_s {
            " = the floor, 1 % of the mean job"
        } else {
            ""
        }
    );
    let mut lines = vec![[
        "policy",
        "kind",
        "ET",
        "ET 90%",
        "ET/seed",
        "energy MJ",
        "tard. s",
        "late %",
        "unserved",
        "wait s",
        "p95 wait s",
        "bsld",
        "jobs/h",
        "makespan h",
        "reconf.",
        "fus/fis/resh",
        "served fus/fis",
        "worst day",
        "worse days",
    ]
    .iter()
    .map(std::string::ToString::to_string)
    .collect::<Vec<_>>()];
    for r in &s.rows {
        lines.push(row_cells(r));
    }
    out.push_str(&aligned(&lines));
    for r in &s.rows {
        let _ = writeln!(out, "  {}: {}", r.policy, r.description);
    }
    let _ = writeln!(
        out,
        "  ({} event logs audited; the searches ran {} simulations)",
        s.audited_logs, s.search_runs
    );
    out
}

fn row_cells(r: &PolicyRow) -> Vec<String> {
    let worse = r.days_worse_than_none.map_or("-".to_string(), |n| {
        if n > 0 {
            format!("{n}/{} WORSE", r.days.len())
        } else {
            format!("0/{}", r.days.len())
        }
    });
    vec![
        r.policy.clone(),
        kind(r.kind).to_string(),
        format!("{:.3}", r.et),
        r.et_90
            .map_or_else(|| "-".into(), |(lo, hi)| format!("{lo:.3}-{hi:.3}")),
        format!("{:.3}", r.et_seedwise),
        format!("{:.2}", r.energy_j / 1e6),
        format!("{:.1}", r.tardiness_s),
        opt(r.late_share, |x| format!("{:.1}", 100.0 * x)),
        unserved_cell(r.unserved),
        opt(r.mean_wait_s, |x| format!("{x:.0}")),
        opt(r.p95_wait_s, |x| format!("{x:.0}")),
        opt(r.mean_bounded_slowdown, |x| format!("{x:.2}")),
        opt(r.jobs_per_hour, |x| format!("{x:.1}")),
        opt(r.makespan_s, |x| format!("{:.2}", x / 3600.0)),
        opt(r.reconfigurations, |x| format!("{x:.0}")),
        triple(&[r.fusions, r.fissions, r.reshapes]),
        triple(&[r.jobs_served_by_fusion, r.jobs_served_by_fission]),
        opt(r.worst_day_vs_none, |x| format!("{:+.1}%", 100.0 * x)),
        worse,
    ]
}

/// `UNSERVED n` for a row that left jobs unserved, `0` for one that did
/// not, `-` for the bound.
fn unserved_cell(n: Option<u64>) -> String {
    match n {
        Some(0) => "0".into(),
        Some(n) => format!("UNSERVED {n}"),
        None => "-".into(),
    }
}

/// One line per policy, one column per scenario: the pooled ET, with `!`
/// when the policy was worse than whole GPUs on some test day and `U` when
/// it left jobs unserved.
pub fn summary_table(r: &SuiteReport) -> String {
    let mut policies: Vec<String> = Vec::new();
    for s in &r.scenarios {
        for row in &s.rows {
            if !policies.contains(&row.policy) {
                policies.push(row.policy.clone());
            }
        }
    }
    let mut header = vec!["policy".to_string()];
    header.extend(r.scenarios.iter().map(|s| s.name.clone()));
    header.push("mean".into());
    let mut lines = vec![header];
    for p in &policies {
        let mut l = vec![p.clone()];
        let mut sum = (0.0, 0usize);
        for s in &r.scenarios {
            l.push(match s.row(p) {
                Some(row) => {
                    sum = (sum.0 + row.et, sum.1 + 1);
                    let worse = if row.days_worse_than_none.unwrap_or(0) > 0 {
                        "!"
                    } else {
                        ""
                    };
                    let unserved = if row.unserved.unwrap_or(0) > 0 {
                        "U"
                    } else {
                        ""
                    };
                    format!("{:.3}{worse}{unserved}", row.et)
                }
                None => "-".into(),
            });
        }
        let all: Vec<&ScenarioResult> = r.scenarios.iter().collect();
        l.push(if sum.1 > 0 {
            let interval = crate::eval::gates::suite_mean_interval(&all, p)
                .map_or(String::new(), |(lo, hi)| format!(" ({lo:.3}-{hi:.3})"));
            format!("{:.3}{interval}", sum.0 / sum.1 as f64)
        } else {
            "-".into()
        });
        lines.push(l);
    }
    let mut out = String::from("Summary: ET per scenario (pooled none reference, lower is better; ! = worse than whole GPUs on some test day; U = left jobs unserved, ranks behind every row that served all); mean over the scenarios with its 90 % interval over resampled test days\n");
    out.push_str(&aligned(&lines));
    out
}

/// The gate measures of one policy ([`crate::eval::gates`]): ET against
/// the best causal opponent, the worst test day against the better of
/// `none` and `static-hist` on that day, reconfigurations per GPU per day.
pub fn gates_table(policy: &str, rows: &[GateRow]) -> String {
    let pct = |v: f64| format!("{v:+.1}%");
    let mut lines = vec![vec![
        "scenario".to_string(),
        "ET".into(),
        "unserved".into(),
        "best causal opponent".into(),
        "vs best".into(),
        "hindsight best".into(),
        "worst day vs min(none, static-hist)".into(),
        "same, best causal opponent".into(),
        "reconf./GPU/day".into(),
    ]];
    for r in rows {
        lines.push(vec![
            r.scenario.clone(),
            format!("{:.3}", r.et),
            unserved_cell(Some(r.unserved)),
            format!("{} {:.3}", r.best_opponent, r.best_opponent_et),
            pct(r.vs_best_pct),
            opt(r.best_hindsight_et, |v| format!("{v:.3}")),
            opt(r.worst_day_vs_safe_pct, pct),
            r.opponents_worst_day_vs_safe_pct
                .iter()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map_or_else(|| "-".into(), |(p, v)| format!("{} {p}", pct(*v))),
            opt(r.reconfigurations_per_gpu_day, |v| format!("{v:.1}")),
        ]);
    }
    let worst = rows
        .iter()
        .filter_map(|r| r.worst_day_vs_safe_pct)
        .reduce(f64::max);
    let mut out = format!("Gates of {policy} (docs/policy.md, issue 16)\n");
    out.push_str(&aligned(&lines));
    let _ = writeln!(
        out,
        "worst test day over all scenarios vs the better of none and static-hist: {}",
        opt(worst, pct)
    );
    out
}

/// Per scenario, the best row a site could run (causal opponents and our
/// policies; the fewest jobs unserved, then the lowest ET) and its gap to
/// the best hindsight reference ([`crate::eval::best_runnable`]).
pub fn runnable_table(rows: &[RunnableBest]) -> String {
    let mut lines = vec![[
        "scenario",
        "best runnable row",
        "ET",
        "unserved",
        "best hindsight reference",
        "ET",
        "gap",
    ]
    .map(String::from)
    .to_vec()];
    for r in rows {
        lines.push(vec![
            r.scenario.clone(),
            r.policy.clone(),
            format!("{:.3}", r.et),
            unserved_cell(Some(r.unserved)),
            r.hindsight.as_ref().map_or("-".into(), |h| h.0.clone()),
            r.hindsight
                .as_ref()
                .map_or("-".into(), |h| format!("{:.3}", h.1)),
            opt(r.gap_pct, |v| format!("{v:+.1}%")),
        ]);
    }
    let mean = |f: &dyn Fn(&RunnableBest) -> Option<f64>| {
        let v: Vec<f64> = rows.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    lines.push(vec![
        "mean".into(),
        String::new(),
        opt(mean(&|r| Some(r.et)), |v| format!("{v:.3}")),
        String::new(),
        String::new(),
        opt(mean(&|r| r.hindsight.as_ref().map(|h| h.1)), |v| {
            format!("{v:.3}")
        }),
        String::new(),
    ]);
    let mut out = String::from(
        "Best row a site could run per scenario (the runnable opponents and our policies: nothing fitted on the scored days), against the best hindsight reference\n",
    );
    out.push_str(&aligned(&lines));
    out
}

/// Horizontal bars of a scenario's ET per policy (`none` = the reference
/// line at its ET).
pub fn et_bars(s: &ScenarioResult) -> Result<String, ReportError> {
    let err = |e: &dyn std::fmt::Debug| ReportError::Plot(format!("{e:?}"));
    let mut svg = String::new();
    {
        let rows: Vec<&PolicyRow> = s.rows.iter().filter(|r| r.et.is_finite()).collect();
        let n = rows.len().max(1);
        let root =
            SVGBackend::with_string(&mut svg, (900, 120 + 40 * n as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let x_max = rows.iter().map(|r| r.et).fold(1.0_f64, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("ET by policy: {}", s.name), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(180)
            .build_cartesian_2d(0.0..x_max, (0..n).into_segmented())
            .map_err(|e| err(&e))?;
        let names: Vec<String> = rows.iter().map(|r| r.policy.clone()).collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("ET (lower is better; none pooled over the training days = reference)")
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .draw()
            .map_err(|e| err(&e))?;
        let color = |k: RowKind| match k {
            RowKind::Opponent => RGBColor(127, 127, 127),
            RowKind::Candidate => RGBColor(31, 119, 180),
            RowKind::Hindsight => RGBColor(255, 187, 120),
            RowKind::Bound => RGBColor(44, 160, 44),
        };
        chart
            .draw_series(rows.iter().enumerate().map(|(i, r)| {
                Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (r.et, SegmentValue::Exact(i + 1)),
                    ],
                    color(r.kind).filled(),
                )
            }))
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// Issue 39's gates of one policy over the suite, one line per gate with
/// its value and the bar.
pub fn suite_gates_table(g: &crate::eval::SuiteGates) -> String {
    let pct = |v: f64| format!("{v:+.1}%");
    let yes = |ok: bool| if ok { "met" } else { "MISSED" };
    let mut out = format!(
        "Gates of {} over {} scenarios (docs/policy.md, issue 39; runnable: {})\n",
        g.policy,
        g.scenarios,
        crate::eval::gates::RUNNABLE.join(", ")
    );
    let _ = writeln!(
        out,
        "1. suite mean ET {:.3} = {:.3} x the best runnable ({} {:.3}; {}); gate <= 0.95: {}",
        g.mean_et,
        g.mean_ratio,
        g.best_runnable,
        g.best_runnable_mean,
        g.mean_ratio_90.map_or_else(
            || "no interval: rows scored on different days".into(),
            |(lo, hi)| format!("{lo:.3}-{hi:.3} over resampled test days, 90 %")
        ),
        yes(g.mean_ratio <= 0.95)
    );
    let over: Vec<String> = g
        .per_scenario
        .iter()
        .filter(|(_, v, above_none)| *v > 3.0 || *above_none)
        .map(|(n, v, above_none)| {
            format!(
                "{n} {}{}",
                pct(*v),
                if *above_none { " (above none)" } else { "" }
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "2. scenarios above 1.03 x their best runnable row or above none: {} of {}{}; {}",
        over.len(),
        g.per_scenario.len(),
        if over.is_empty() {
            String::new()
        } else {
            format!(": {}", over.join(", "))
        },
        yes(over.is_empty())
    );
    let _ = writeln!(
        out,
        "3. worst test day vs min(none, static-hist): {}; the best runnable's own: {}; {}",
        opt(g.worst_day_pct, pct),
        g.best_runnable_worst_day
            .as_ref()
            .map_or_else(|| "-".into(), |(p, v)| format!("{} ({p})", pct(*v))),
        match (g.worst_day_pct, &g.best_runnable_worst_day) {
            (Some(w), Some((_, b))) => yes(w <= *b),
            _ => "-",
        }
    );
    let _ = writeln!(
        out,
        "4. gap to the best hindsight mean ({}) closed: {}; gate >= 30 %: {}",
        opt(g.hindsight_mean, |v| format!("{v:.3}")),
        opt(g.gap_closed, |v| format!("{:.1} %", v * 100.0)),
        g.gap_closed.map_or("-", |v| yes(v >= 0.3))
    );
    let _ = writeln!(
        out,
        "5. reconfigurations per GPU per day, most in a scenario: {}; gate <= 12: {}",
        opt(g.max_reconfigurations_per_gpu_day, |v| format!("{v:.1}")),
        g.max_reconfigurations_per_gpu_day
            .map_or("-", |v| yes(v <= 12.0))
    );
    out
}
