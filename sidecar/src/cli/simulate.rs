//! `smartmig simulate`: run the cluster simulator on a workload and print
//! the metrics of the chosen policy next to the `none` reference.

use std::fs::File;
use std::io::{BufReader, BufWriter, IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::args::{slurm_like, GpuModelArg, JsonArg};
use crate::mig::GpuModel;
use crate::policy::parse_policy_on;
use crate::sim::{
    simulate_with_reference, EpochRule, EtScore, Heuristic, JsonLines, Metrics, PlacementSpec,
    RunHooks, SimConfig,
};
use crate::workload::{
    generate_diurnal, gpus_for_load, peak_demand_load, read_trace, window, DiurnalConfig, Job,
    TraceFormat, TraceOptions,
};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Number of GPUs (all of `--gpu-model`; see `--cluster` for mixed models).
    #[arg(long, default_value_t = 8)]
    pub gpus: usize,
    #[command(flatten)]
    pub gpu: GpuModelArg,
    /// Mixed cluster, e.g. `a100-40gb:4,h100-80gb:2` (overrides --gpus and
    /// --gpu-model; workloads are generated/rounded for the first model).
    #[arg(long)]
    pub cluster: Option<String>,
    /// `diurnal` (synthetic, SMART-MIG style) or a trace file.
    #[arg(long, default_value = "diurnal")]
    pub workload: String,
    /// Format of a trace file.
    #[arg(long, default_value = "csv")]
    pub trace_format: String,
    /// Skip malformed trace rows instead of failing.
    #[arg(long)]
    pub lenient: bool,
    /// START_H,LEN_H: replay only the trace's jobs arriving in these hours
    /// (counted from its first arrival), as a workload starting at 0.
    #[arg(long, value_name = "START_H,LEN_H")]
    pub trace_window: Option<String>,
    /// With a trace: use as many --gpu-model GPUs as make the busiest hour's
    /// demand L (the share of GPUs busy if every job started on arrival on
    /// its most efficient slice; overrides --gpus), so the load is a
    /// choice, not an accident of the trace.
    #[arg(long, value_name = "L", conflicts_with = "cluster")]
    pub load: Option<f64>,
    /// LO,HI: deadline = arrival + U(LO, HI) x run time (a trace job's on the
    /// slices it asked for, else on the whole GPU; a sacct Timelimit wins).
    #[arg(long, value_name = "LO,HI", default_value = "1,1.5")]
    pub deadline_factor: String,
    /// Length of the diurnal workload, hours.
    #[arg(long, default_value_t = 24.0)]
    pub hours: f64,
    /// Job placement: a heuristic (edf, cedf, eft, largest-first,
    /// smallest-first, best-fit, random), a heuristic with a deferral rule
    /// (`cedf+rescue[:R[:S[:K]]]`, `cedf+defer-late[:K]`) or
    /// `learned:FILE.onnx`.
    #[arg(long, default_value = "edf")]
    pub placement: String,
    /// Repartitioning policy: none, static:<catalog index>, static:<picture>,
    /// twice:<hour>=<layout>/<hour>=<layout>, greedy, policy:FILE.onnx.
    #[arg(long, default_value = "none")]
    pub policy: String,
    /// Decision epoch every N arrival/completion events.
    #[arg(long, default_value_t = crate::sim::DEFAULT_EPOCH_EVENTS)]
    pub epoch_events: u32,
    /// Decision epoch every T simulated seconds instead.
    #[arg(long)]
    pub epoch_seconds: Option<f64>,
    /// Duration of one reconfiguration, s.
    #[arg(long, default_value_t = crate::sim::DEFAULT_RECONFIG_TIME_S)]
    pub reconfig_time: f64,
    /// Weight of tardiness in ET = (e + a t) / (1 + a).
    #[arg(long, default_value_t = 1.0)]
    pub alpha: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub json: JsonArg,
    /// Write the auditable event log (JSON lines) of the policy run here.
    #[arg(long)]
    pub events: Option<PathBuf>,
    /// Run every policy (none, static, static-best, twice-daily, greedy) on
    /// this workload and print one table with the gap to the lower bounds.
    #[arg(long)]
    pub compare: bool,
    /// With --compare: also write SVG plots and comparison.json into DIR.
    #[arg(long, value_name = "DIR", requires = "compare")]
    pub report: Option<PathBuf>,
    /// With --compare: an extra policy to compare (repeatable), e.g. policy:FILE.onnx.
    #[arg(long, value_name = "SPEC", requires = "compare")]
    pub compare_policy: Vec<String>,
    /// With --compare on a generated workload: the opponents static-hist and
    /// twice-daily-hist are fitted on this many other days (seeds seed+1 ..
    /// seed+N), as an admin picks a layout from past days.
    #[arg(long, default_value_t = 8, requires = "compare")]
    pub train_days: u64,
    /// Choose instances by the declared memory; a job on a too-small
    /// instance fails out of memory and restarts on a bigger one
    /// (docs/oom-and-memory.md). Off: the true need is known (oracle).
    #[arg(long)]
    pub oom_restart: bool,
    /// Learn memory estimates for jobs that declare nothing (needs --oom-restart).
    #[arg(long, value_name = "on|off", default_value = "off")]
    pub memory_estimate: String,
    /// Share of the run after which an out-of-memory job fails.
    #[arg(long, default_value_t = crate::sim::DEFAULT_OOM_FAIL_FRACTION)]
    pub oom_fraction: f64,
    /// Restarts after out-of-memory failures before a job is rejected.
    #[arg(long, default_value_t = crate::sim::DEFAULT_OOM_MAX_RETRIES)]
    pub oom_retries: u32,
    /// SMALL[,NONE]: shares of jobs that declare the smallest profile's
    /// memory / nothing at all (default: every job declares its need).
    #[arg(long, value_name = "SMALL[,NONE]")]
    pub underdeclare: Option<String>,
    /// With --underdeclare on the diurnal workload: job templates (same
    /// user and script) per class, whose jobs need about the same memory.
    #[arg(long, default_value_t = 100)]
    pub memory_templates: u32,
    /// LO,HI: true memory need = the workload's (derived) need x U(LO, HI),
    /// which becomes the declaration (for traces whose memory is a guess).
    #[arg(long, value_name = "LO,HI")]
    pub memory_spread: Option<String>,
    /// Print throughput and energy of the oracle, declared-memory, OOM
    /// restart, early restart and estimate schedulers on this workload
    /// (with --memory-growth mixed unless another family is named).
    #[arg(long)]
    pub oom_study: bool,
    /// How jobs' memory rises to their peak over a run: `mixed` (the
    /// documented default family), one shape for all (`step`, `linear`,
    /// `concave`, `convex`), or `none` (the peak at --oom-fraction of the
    /// run, the model before growth).
    #[arg(long, value_name = "FAMILY")]
    pub memory_growth: Option<String>,
    /// Restart a job on the next larger memory size as soon as its sampled
    /// memory use predicts an overflow, instead of waiting for the failure
    /// (needs --oom-restart).
    #[arg(long)]
    pub early_restart: bool,
    /// Early-restart rule: samples the trend is measured over (default
    /// from the shared rule).
    #[arg(long, value_name = "N")]
    pub early_window: Option<usize>,
    /// Early-restart rule: how far the trend is followed, as a multiple of
    /// the time run so far.
    #[arg(long, value_name = "X")]
    pub early_horizon: Option<f64>,
    /// Early-restart rule: share of the instance the use must reach first.
    #[arg(long, value_name = "SHARE")]
    pub early_min_fill: Option<f64>,
    /// Seconds between memory samples of a running job (the daemon's
    /// memory.sample_s).
    #[arg(long, default_value_t = crate::sim::DEFAULT_MEMORY_SAMPLE_S)]
    pub memory_sample_s: f64,
    /// Model the deployment (issue 42): Slurm places each job by counting
    /// shards and smartmigd builds its instance afterwards, requeueing a
    /// job it cannot serve (docs/simulator.md, "Slurm-like mode"). SPEC:
    /// `holds=off|adaptive|next-job|any-mix,allocate-wait=S,requeue-hold=S,
    /// sched-interval=S,hold-lag=S,pass=S,time-limit=F,bill=room|compute,lend=on|off`,
    /// any subset (none: the packaged defaults, holds adaptive, bill room, lend on,
    /// no time limits). Whole GPUs and fixed layouts stay in the central
    /// view.
    #[arg(long, value_name = "SPEC", num_args = 0..=1, default_missing_value = "")]
    pub slurm_like: Option<String>,
}

/// A cluster description: one model per GPU.
pub fn parse_cluster(gpus: usize, model: GpuModel, cluster: Option<&str>) -> Result<Vec<GpuModel>> {
    let mut out = Vec::new();
    match cluster {
        Some(spec) => {
            for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let (m, n) = part.split_once(':').unwrap_or((part, "1"));
                let model: GpuModel = m.parse()?;
                let n: usize = n
                    .trim()
                    .parse()
                    .with_context(|| format!("`{part}`: GPU count `{n}` is not a number"))?;
                out.extend(std::iter::repeat_n(model, n));
            }
        }
        None => out.extend(std::iter::repeat_n(model, gpus)),
    }
    if out.is_empty() {
        bail!("the cluster has no GPUs (use --gpus N >= 1)");
    }
    Ok(out)
}

/// The cluster and its workload (jobs, horizon). With `--load` the GPU
/// count follows from the trace, so the trace is read first.
pub fn cluster_and_workload(a: &Args) -> Result<(Vec<GpuModel>, Vec<Job>, Option<f64>)> {
    let cluster = parse_cluster(a.gpus, a.gpu.gpu_model, a.cluster.as_deref())?;
    let (jobs, horizon) = load_workload(a, cluster[0], cluster.len())?;
    let Some(target) = a.load else {
        return Ok((cluster, jobs, horizon));
    };
    let model = cluster[0];
    let n =
        gpus_for_load(&jobs, model, target, 3600.0).with_context(|| format!("--load {target}"))?;
    eprintln!(
        "smartmig: --load {target}: {n} GPUs (peak hour demand {:.2} of the cluster, jobs started on arrival on their most efficient slice)",
        peak_demand_load(&jobs, model, n, 3600.0)
    );
    Ok((vec![model; n], jobs, horizon))
}

/// The jobs and the workload horizon.
pub fn load_workload(a: &Args, model: GpuModel, gpus: usize) -> Result<(Vec<Job>, Option<f64>)> {
    load_workload_seed(a, model, gpus, a.seed)
}

/// [`load_workload`] with another seed (another day of a generated workload).
pub fn load_workload_seed(
    a: &Args,
    model: GpuModel,
    gpus: usize,
    seed: u64,
) -> Result<(Vec<Job>, Option<f64>)> {
    let deadline_factor = super::oom::parse_pair(&a.deadline_factor, "--deadline-factor", None)?;
    if a.workload == "diurnal" {
        if a.load.is_some() || a.trace_window.is_some() {
            bail!("--load and --trace-window need a trace (--workload FILE); the diurnal load is set by --gpus and the generator's rates");
        }
        let cfg = DiurnalConfig {
            horizon_s: a.hours * 3600.0,
            deadline_factor,
            ..DiurnalConfig::default()
        };
        cfg.validate().context("diurnal workload")?;
        let mut jobs = generate_diurnal(&cfg, model, gpus, seed);
        super::oom::apply(&mut jobs, model, &memory_options(a)?, true, seed);
        return Ok((jobs, Some(cfg.horizon_s)));
    }
    let format: TraceFormat = a.trace_format.parse()?;
    let opts = TraceOptions {
        lenient: a.lenient,
        seed: a.seed,
        deadline_factor,
        ..TraceOptions::new(model)
    };
    opts.validate().context("--deadline-factor")?;
    let file = File::open(&a.workload).with_context(|| format!("opening trace {}", a.workload))?;
    let mut trace = read_trace(format, BufReader::new(file), &opts)
        .with_context(|| format!("reading {} trace {}", format, a.workload))?;
    for s in trace.skipped.iter().take(5) {
        eprintln!("smartmig: skipped line {}: {}", s.line, s.reason);
    }
    if trace.skipped.len() > 5 {
        eprintln!("smartmig: ... {} rows skipped in all", trace.skipped.len());
    }
    let mut horizon = None;
    if let Some(w) = &a.trace_window {
        let (jobs, h) = trace_window(&trace.jobs, w)?;
        trace.jobs = jobs;
        horizon = Some(h);
    }
    super::oom::apply(&mut trace.jobs, model, &memory_options(a)?, false, a.seed);
    Ok((trace.jobs, horizon))
}

/// `--trace-window START_H,LEN_H` applied to a trace whose first arrival is
/// 0: the window's jobs and its horizon (the part of the window the trace
/// covers, so that no idle time past the trace's end is charged).
fn trace_window(jobs: &[Job], arg: &str) -> Result<(Vec<Job>, f64)> {
    let (start_h, len_h) = super::oom::parse_pair(arg, "--trace-window", None)?;
    if !(start_h.is_finite() && start_h >= 0.0 && len_h.is_finite() && len_h > 0.0) {
        bail!("--trace-window {arg}: expected START_H >= 0 and LEN_H > 0 hours");
    }
    let end_s = jobs.iter().map(|j| j.arrival).fold(0.0, f64::max);
    let (start_s, len_s) = (start_h * 3600.0, len_h * 3600.0);
    if start_s > end_s {
        bail!(
            "--trace-window {arg}: starts after the trace's last arrival (the trace spans {:.2} h)",
            end_s / 3600.0
        );
    }
    let out = window(jobs, start_s, len_s);
    if out.is_empty() {
        bail!(
            "--trace-window {arg}: no job arrives in hours [{start_h}, {}) of the trace (it spans {:.2} h)",
            start_h + len_h,
            end_s / 3600.0
        );
    }
    eprintln!(
        "smartmig: --trace-window {arg}: {} of {} jobs (the trace spans {:.2} h)",
        out.len(),
        jobs.len(),
        end_s / 3600.0
    );
    Ok((out, len_s.min(end_s - start_s)))
}

fn memory_options(a: &Args) -> Result<super::oom::MemoryOptions> {
    let mut o = super::oom::parse_options(
        a.underdeclare.as_deref(),
        a.memory_templates,
        a.memory_spread.as_deref(),
    )?;
    o.growth = super::oom::parse_growth(a.memory_growth.as_deref(), a.oom_study)?;
    Ok(o)
}

/// The early-restart rule of the command line: the shared defaults with
/// the knobs given.
fn early_rule(a: &Args) -> Result<Option<crate::sim::EarlyRestartRule>> {
    let knobs = a.early_window.is_some() || a.early_horizon.is_some() || a.early_min_fill.is_some();
    if !a.early_restart && !a.oom_study {
        if knobs {
            bail!("--early-window, --early-horizon and --early-min-fill need --early-restart (or --oom-study)");
        }
        return Ok(None);
    }
    let d = crate::sim::EarlyRestartRule::default();
    let rule = crate::sim::EarlyRestartRule {
        window: a.early_window.unwrap_or(d.window),
        horizon: a.early_horizon.unwrap_or(d.horizon),
        min_fill: a.early_min_fill.unwrap_or(d.min_fill),
    };
    rule.validate().context("early-restart rule")?;
    Ok(Some(rule))
}

#[derive(Serialize)]
struct Report<'a> {
    gpus: usize,
    models: Vec<String>,
    placement: &'a str,
    policy: &'a str,
    seed: u64,
    reconfig_time_s: f64,
    run: &'a Metrics,
    reference: &'a Metrics,
    score: &'a EtScore,
}

pub fn run(a: &Args) -> Result<()> {
    let placement: PlacementSpec = a.placement.parse()?;
    let heuristic = || -> Result<Heuristic> {
        placement.rule().with_context(|| {
            format!(
                "--placement {placement}: --compare and --oom-study take a heuristic; compare learned placements with `smartmig bench placement`"
            )
        })
    };
    let (cluster, jobs, horizon) = cluster_and_workload(a)?;
    let models = GpuModel::distinct(&cluster);
    let mut policy = parse_policy_on(&a.policy, &cluster, 0.0)?;
    // Checked on every run, so knobs without --early-restart are refused.
    let early = early_rule(a)?;
    let cfg = sim_config(a, horizon, early)?;
    if a.oom_study {
        let mut out = std::io::stdout().lock();
        return super::oom::study(
            &mut out,
            &cluster,
            &jobs,
            &cfg,
            heuristic()?,
            &a.policy,
            &super::oom::StudyParams {
                fail_fraction: a.oom_fraction,
                retries: a.oom_retries,
                early: early.unwrap_or_default(),
                sample_s: a.memory_sample_s,
            },
        );
    }
    if a.compare {
        return run_compare(a, &cluster, &jobs, &cfg, heuristic()?);
    }
    let bar = progress_bar(jobs.len());
    let mut tick = |n: u64| {
        if let Some(b) = &bar {
            b.set_position(n);
        }
    };
    let mut writer = match &a.events {
        Some(p) => Some(JsonLines::new(BufWriter::new(
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        ))),
        None => None,
    };
    let hooks = RunHooks {
        sink: writer.as_mut().map(|w| w as &mut dyn crate::sim::EventSink),
        progress: Some(&mut tick),
    };
    let (run, reference, score) = simulate_with_reference(
        &cluster,
        &jobs,
        &placement,
        policy.as_mut(),
        &cfg,
        a.alpha,
        hooks,
    )?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if let Some(w) = writer {
        w.into_inner().flush().context("writing the event log")?;
    }
    let report = Report {
        gpus: cluster.len(),
        models: models
            .iter()
            .map(std::string::ToString::to_string)
            .collect(),
        placement: &run.placement,
        policy: &run.policy,
        seed: a.seed,
        reconfig_time_s: a.reconfig_time,
        run: &run.metrics,
        reference: &reference.metrics,
        score: &score,
    };
    print_table(&mut a.json.table(), &report)?;
    a.json.write(&report)
}

/// The simulator's settings from the arguments (`early`: the checked
/// early-restart rule, used with `--early-restart`).
fn sim_config(
    a: &Args,
    horizon: Option<f64>,
    early: Option<crate::sim::EarlyRestartRule>,
) -> Result<SimConfig> {
    Ok(SimConfig {
        reconfig_time_s: a.reconfig_time,
        epoch: match a.epoch_seconds {
            Some(s) => EpochRule::Seconds(s),
            None => EpochRule::Events(a.epoch_events),
        },
        seed: a.seed,
        workload_horizon_s: horizon,
        oom: super::oom::oom_config(
            a.oom_restart,
            &a.memory_estimate,
            a.oom_fraction,
            a.oom_retries,
            if a.early_restart { early } else { None },
            a.memory_sample_s,
        )?,
        slurm: slurm_like(a.slurm_like.as_deref())?,
        ..SimConfig::default()
    })
}

/// A progress bar for runs of over 200,000 jobs on a terminal.
fn progress_bar(jobs: usize) -> Option<indicatif::ProgressBar> {
    (std::io::stderr().is_terminal() && jobs > 200_000).then(|| {
        let b = indicatif::ProgressBar::new(jobs as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} jobs started ({eta})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    })
}

/// One table row: label and how to format it from the metrics.
type Row = (&'static str, Box<dyn Fn(&Metrics) -> String>);

fn print_table(out: &mut impl Write, r: &Report<'_>) -> Result<()> {
    writeln!(
        out,
        "{} GPUs ({}), placement {}, seed {}, reconfiguration {} s",
        r.gpus,
        r.models.join(", "),
        r.placement,
        r.seed,
        r.reconfig_time_s
    )?;
    let rows: [Row; 18] = [
        ("jobs", Box::new(|m| m.jobs.to_string())),
        ("completed", Box::new(|m| m.completed.to_string())),
        (
            "unserved + rejected",
            Box::new(|m| format!("{} + {}", m.unserved, m.rejected)),
        ),
        ("energy (MJ)", Box::new(|m| format!("{:.3}", m.energy_mj))),
        (
            "mean tardiness (s)",
            Box::new(|m| format!("{:.2}", m.mean_tardiness_s)),
        ),
        (
            "late jobs",
            Box::new(|m| format!("{:.2} %", 100.0 * m.late_share)),
        ),
        (
            "mean wait (s)",
            Box::new(|m| format!("{:.2}", m.mean_wait_s)),
        ),
        ("p95 wait (s)", Box::new(|m| format!("{:.2}", m.p95_wait_s))),
        (
            "utilisation",
            Box::new(|m| format!("{:.2} %", 100.0 * m.utilisation)),
        ),
        (
            "reconfigurations",
            Box::new(|m| m.reconfigurations.to_string()),
        ),
        (
            "  fusion/fission/resh.",
            Box::new(|m| format!("{}/{}/{}", m.fusions, m.fissions, m.reshapes)),
        ),
        (
            "  jobs served fus/fis",
            Box::new(|m| format!("{}/{}", m.jobs_served_by_fusion, m.jobs_served_by_fission)),
        ),
        (
            "rejected decisions",
            Box::new(|m| m.rejected_decisions.to_string()),
        ),
        ("decision epochs", Box::new(|m| m.epochs.to_string())),
        (
            "horizon (h)",
            Box::new(|m| format!("{:.2}", m.horizon_s / 3600.0)),
        ),
        ("events", Box::new(|m| m.events.to_string())),
        ("requeues", Box::new(|m| m.requeues.to_string())),
        (
            "held slice-h",
            Box::new(|m| format!("{:.2}", m.held_slice_s / 3600.0)),
        ),
    ];
    let w = r.policy.len().max(12);
    writeln!(
        out,
        "{:<22} {:>w$} {:>14}",
        "metric", r.policy, "none (ref)"
    )?;
    for (name, f) in &rows {
        writeln!(out, "{:<22} {:>w$} {:>14}", name, f(r.run), f(r.reference))?;
    }
    let s = r.score;
    writeln!(
        out,
        "ET = (e + {a} t)/(1 + {a}) = {:.4} with e = {:.4}, t = {:.4} (reference: {}; T_ref {:.2} s{})",
        s.et,
        s.e,
        s.t,
        s.reference,
        s.t_ref_s,
        if s.t_ref_floored { ", the floor" } else { "" },
        a = s.alpha
    )?;
    writeln!(
        out,
        "Both runs' energy runs to {:.2} h, the later end; a job that never ran is charged as if run on a whole GPU at full power from then (docs/evaluation.md).",
        r.run.horizon_s / 3600.0
    )?;
    Ok(())
}

/// The `--compare` branch of `smartmig simulate`: runs the comparison on the
/// workload `simulate` loaded, prints the table (or JSON with `--json`) and
/// writes the plots with `--report DIR`.
fn run_compare(
    a: &Args,
    cluster: &[GpuModel],
    jobs: &[Job],
    cfg: &SimConfig,
    heuristic: Heuristic,
) -> Result<()> {
    use std::io::Write;
    let label = if a.workload == "diurnal" {
        format!("diurnal {} h workload", a.hours)
    } else {
        let window = a
            .trace_window
            .as_ref()
            .map_or(String::new(), |w| format!(", window {w} h"));
        let load = a
            .load
            .map_or(String::new(), |l| format!(", sized for peak load {l}"));
        format!("{} trace {}{window}{load}", a.trace_format, a.workload)
    };
    let mut opts = crate::report::compare::CompareOptions::new(label, a.alpha);
    opts.extra.clone_from(&a.compare_policy);
    if let Some(w) = &a.trace_window {
        // The windows just before the compared one, as an admin looks back.
        let (start_h, len_h) = super::oom::parse_pair(w, "--trace-window", None)?;
        let whole = Args {
            trace_window: None,
            ..a.clone()
        };
        let (all, _) = load_workload(&whole, cluster[0], cluster.len())?;
        for k in 1..=a.train_days {
            let start = (start_h - k as f64 * len_h) * 3600.0;
            if start < 0.0 {
                break;
            }
            let jobs = crate::workload::window(&all, start, len_h * 3600.0);
            if !jobs.is_empty() {
                opts.training.push(crate::eval::Day {
                    label: format!("hours {:.0}-{:.0}", start / 3600.0, start / 3600.0 + len_h),
                    jobs,
                    cfg: SimConfig {
                        workload_horizon_s: Some(len_h * 3600.0),
                        ..cfg.clone()
                    },
                });
            }
        }
        if opts.training.is_empty() {
            eprintln!("smartmig: no jobs in the {} windows before --trace-window {w}: static-hist, twice-daily-hist and learned+fallback left out, and ET's exchange rate is this window's own none run (T_ref floored)", a.train_days);
        }
    } else if a.workload != "diurnal" {
        eprintln!("smartmig: a whole trace has no past days: static-hist, twice-daily-hist and learned+fallback are left out, and ET's exchange rate is the trace's own none run (T_ref floored); use --trace-window START_H,LEN_H (the windows before it are the training days)");
    }
    if a.workload == "diurnal" {
        for seed in (1..=a.train_days).map(|k| a.seed.wrapping_add(k)) {
            let (jobs, horizon) = load_workload_seed(a, cluster[0], cluster.len(), seed)?;
            opts.training.push(crate::eval::Day {
                label: format!("seed {seed}"),
                jobs,
                cfg: SimConfig {
                    seed,
                    workload_horizon_s: horizon,
                    ..cfg.clone()
                },
            });
        }
    }
    // The shipped learned policy joins the table as `learned` (and
    // `learned+fallback`) when the cluster has one model, its file exists
    // and ONNX Runtime does (docs/policy.md).
    // On a mixed cluster each model's file is a row of its own.
    if !opts.extra.iter().any(|s| s.starts_with("policy:")) {
        let models = GpuModel::distinct(cluster);
        if let [one] = models.as_slice() {
            opts.learned = super::learned::shipped_learned(*one);
        } else {
            opts.extra.extend(
                models
                    .into_iter()
                    .filter_map(super::learned::shipped_learned),
            );
        }
    }
    let c = crate::report::compare::compare(cluster, jobs, cfg, heuristic, &opts)?;
    write!(a.json.table(), "{}", c.table())?;
    a.json.write(&c)?;
    if let Some(dir) = &a.report {
        let files = super::write_files(dir, crate::report::compare::report_files(&c)?)?;
        eprintln!("smartmig: wrote {} files to {}", files.len(), dir.display());
    }
    Ok(())
}
