//! Text table and SVG plots of `smartmig advise report`
//! ([`crate::eval::advise::AdviseReport`]).
//!
//! | column | meaning |
//! |---|---|
//! | energy MJ | energy of every GPU from the first observed submit to the last end (or the row's last completion), idle included; the log has no power reading, so `observed` has none |
//! | vs as-run | energy change against the as-run replay (negative: less) |
//! | wait s, p95 wait s | mean and 95th-percentile (nearest rank) of start - submit |
//! | late, tard. s | jobs that ended after they were due (`--deadline`, else submit + time limit) and their total tardiness |
//! | ET | `(e + a t) / (1 + a)`, energy and mean tardiness relative to the whole-GPU replay (`none` = 1) |
//! | reconf. | reconfigurations (observed: recorded layout changes) |
//! | not run | jobs the replay never ran (no instance of their size ever free, or none in any layout the row had); they count as late, but not in waits or energy |

use super::series::{self, TimeSeries};
use super::{aligned, plot, ReportError};
use crate::eval::advise::{AdviceCounts, AdviseReport, ReplayRow, Role};

fn label(r: &ReplayRow) -> String {
    match r.role {
        Role::AsRun => format!("{} (opponent)", r.name),
        Role::Policy => format!("{} (policy)", r.name),
        Role::WholeGpus => format!("{} (whole GPUs)", r.name),
        Role::NoHistory => format!("{} (opponent, no history)", r.name),
    }
}

fn percent(x: f64) -> String {
    format!("{:+.1}%", 100.0 * x)
}

/// The report as text: what was replayed, the table (observed figures,
/// then the as-run layout, the policy and whole GPUs), the replay's
/// fidelity, the recorded advice and the verdict. `period` names the
/// window (the CLI formats its dates).
pub fn table(r: &AdviseReport, period: &str) -> String {
    let mut out = replayed(r, period);
    out.push_str(&aligned(&rows(r)));
    out.push_str(&fidelity(r));
    out.push_str(&advice(&r.observation.advice));
    for v in verdict(r) {
        out.push_str(&v);
        out.push('\n');
    }
    out
}

/// What was replayed: the window, each GPU's layouts, the replay's
/// settings.
fn replayed(r: &AdviseReport, period: &str) -> String {
    let o = &r.observation;
    let mut out = format!(
        "Advise report: {} jobs on {} GPU(s), {period} ({:.1} h)\n",
        o.jobs.len(),
        o.gpus.len(),
        o.span_s() / 3600.0
    );
    for g in &o.gpus {
        let changes: Vec<String> = g
            .changes
            .iter()
            .map(|c| format!("{} at +{:.1} h", c.picture, (c.t - o.origin) / 3600.0))
            .collect();
        out.push_str(&format!(
            "  GPU {} ({}): {}{}\n",
            g.index,
            g.model,
            g.initial_picture,
            if changes.is_empty() {
                String::new()
            } else {
                format!(", then {}", changes.join(", "))
            }
        ));
    }
    out.push_str(&format!(
        "Replayed with placement {}, epochs every {} s, reconfigurations of {} s, a {} speed-up curve (beta {}, saturation {}); {} event logs audited.\n\n",
        r.config.heuristic,
        r.config.epoch_s,
        r.config.reconfig_time_s,
        if r.config.speedup.beta >= 1.0 && r.config.speedup.saturation >= 1.0 { "linear" } else { "sub-linear" },
        r.config.speedup.beta,
        r.config.speedup.saturation,
        r.audited_logs,
    ));
    out
}

/// The table's lines: the header, the observed figures, then a row per
/// replay.
fn rows(r: &AdviseReport) -> Vec<Vec<String>> {
    let head = [
        "row",
        "energy MJ",
        "vs as-run",
        "wait s",
        "p95 wait s",
        "late",
        "tard. s",
        "ET",
        "reconf.",
        "not run",
    ];
    let mut lines = vec![head.iter().map(ToString::to_string).collect::<Vec<_>>()];
    let s = &r.observed;
    lines.push(vec![
        "observed (log)".into(),
        "-".into(),
        "-".into(),
        format!("{:.0}", s.mean_wait_s),
        format!("{:.0}", s.p95_wait_s),
        s.late_jobs.to_string(),
        format!("{:.0}", s.total_tardiness_s),
        "-".into(),
        s.layout_changes.to_string(),
        "-".into(),
    ]);
    for row in &r.rows {
        let m = &row.metrics;
        lines.push(vec![
            label(row),
            format!("{:.2}", m.energy_mj),
            if row.role == Role::AsRun {
                "-".into()
            } else {
                percent(row.energy_vs_as_run)
            },
            format!("{:.0}", m.mean_wait_s),
            format!("{:.0}", m.p95_wait_s),
            m.late_jobs.to_string(),
            format!("{:.0}", m.total_tardiness_s),
            format!("{:.3}", row.et),
            m.reconfigurations.to_string(),
            (m.unserved + m.rejected).to_string(),
        ]);
    }
    lines
}

/// The replay's fidelity, with a warning when jobs left their profile.
fn fidelity(r: &AdviseReport) -> String {
    let mut out = String::new();
    let f = &r.fidelity;
    out.push_str(&format!(
        "\nFidelity of the as-run replay: {} of {} jobs ran on the profile they had; replayed run time / observed {:.3} on average (lowest {:.3}); mean wait {:.0} s replayed vs {:.0} s observed.\n",
        f.jobs_on_their_profile,
        f.jobs,
        f.mean_run_time_ratio,
        f.min_run_time_ratio,
        f.replayed_mean_wait_s,
        f.observed_mean_wait_s,
    ));
    if f.jobs_on_their_profile < f.jobs {
        out.push_str(&format!(
            "WARNING: {} observed job(s) did not run on their profile in the replay of the recorded layout, so the layout smartmigd recorded is not the one Slurm ran them on (does smartmigd see the node's real GPUs? the sim backend does not): read the rows below with care.\n",
            f.jobs - f.jobs_on_their_profile
        ));
    }
    out
}

/// The advice the log recorded in the window.
fn advice(a: &AdviceCounts) -> String {
    let mut out = String::new();
    if a.total == 0 {
        out.push_str("Advice in the log: none in the window (the policy wished no change).\n");
    } else {
        out.push_str(&format!(
            "Advice in the log: {} wish(es) by {}:\n",
            a.total,
            a.policies.join(", ")
        ));
        for g in &a.per_gpu {
            out.push_str(&format!(
                "  GPU {}: {} reshape(s) wanted ({} instances destroyed, {} created), last {}\n",
                g.gpu, g.wishes, g.destroy, g.create, g.last_wish
            ));
        }
    }
    out
}

/// Plain sentences: the policy against the as-run layout on energy, wait
/// and tardiness; "worse" is said in capitals.
pub fn verdict(r: &AdviseReport) -> Vec<String> {
    let (Some(p), Some(a)) = (r.row(Role::Policy), r.row(Role::AsRun)) else {
        return Vec::new();
    };
    let (pm, am) = (&p.metrics, &a.metrics);
    let mut out = Vec::new();
    let (p_lost, a_lost) = (pm.unserved + pm.rejected, am.unserved + am.rejected);
    if p_lost > a_lost {
        out.push(format!(
            "WORSE: {p_lost} job(s) never ran under {} (against {a_lost} under the as-run layout): its energy and waits below leave them out.",
            p.name
        ));
    }
    out.push(if pm.energy_j > am.energy_j {
        format!(
            "WORSE on energy: {} would have used {} more energy than the as-run layout ({:.2} vs {:.2} MJ).",
            p.name,
            percent(p.energy_vs_as_run).trim_start_matches('+'),
            pm.energy_mj,
            am.energy_mj
        )
    } else {
        format!(
            "Energy: {} would have used {} less than the as-run layout ({:.2} vs {:.2} MJ).",
            p.name,
            percent(-p.energy_vs_as_run).trim_start_matches('+'),
            pm.energy_mj,
            am.energy_mj
        )
    });
    out.push(if pm.mean_wait_s > am.mean_wait_s {
        format!(
            "WORSE on wait: jobs would have waited {:.0} s longer on average under {} than under the as-run layout ({:.0} vs {:.0} s).",
            pm.mean_wait_s - am.mean_wait_s,
            p.name,
            pm.mean_wait_s,
            am.mean_wait_s
        )
    } else {
        format!(
            "Wait: jobs would have waited {:.0} s less on average under {} ({:.0} vs {:.0} s).",
            am.mean_wait_s - pm.mean_wait_s,
            p.name,
            pm.mean_wait_s,
            am.mean_wait_s
        )
    });
    if pm.total_tardiness_s > am.total_tardiness_s {
        out.push(format!(
            "WORSE on tardiness: {} late job(s), {:.0} s in all, against {} and {:.0} s.",
            pm.late_jobs, pm.total_tardiness_s, am.late_jobs, am.total_tardiness_s
        ));
    }
    out
}

/// The plots, as `(file name, SVG)`: waiting jobs over time (the replays
/// and the observed queue), cluster power, and energy per row.
pub fn plots(r: &AdviseReport, bin_s: f64) -> Result<Vec<(String, String)>, ReportError> {
    let o = &r.observation;
    let mut runs: Vec<(String, TimeSeries)> = Vec::new();
    for row in &r.rows {
        runs.push((label(row), series::from_records(&row.log, bin_s)?));
    }
    let observed = series::waiting(&o.waits(), o.span_s(), bin_s)?;
    let mut with_observed: Vec<(String, &TimeSeries)> =
        runs.iter().map(|(n, s)| (n.clone(), s)).collect();
    with_observed.push(("observed (log)".into(), &observed));
    let period = format!("{} jobs, {:.1} h", o.jobs.len(), o.span_s() / 3600.0);
    let waiting = plot::lines(
        &format!("Waiting jobs ({period})"),
        "mean waiting jobs",
        &with_observed,
        &|s| s.queue.clone(),
    )?;
    let replays: Vec<(String, &TimeSeries)> = runs.iter().map(|(n, s)| (n.clone(), s)).collect();
    let power = plot::lines(
        &format!("Power of the node's GPUs ({period})"),
        "mean power (kW)",
        &replays,
        &|s| s.power_w.iter().map(|w| w / 1000.0).collect(),
    )?;
    let energy: Vec<(String, f64, usize)> = r
        .rows
        .iter()
        .enumerate()
        .map(|(i, row)| (label(row), row.metrics.energy_mj, i))
        .collect();
    let energy = plot::bars(
        &format!("Energy per replay ({period})"),
        "energy (MJ), every GPU idle included",
        &energy,
    )?;
    Ok(vec![
        ("waiting.svg".into(), waiting),
        ("power.svg".into(), power),
        ("energy.svg".into(), energy),
    ])
}
