//! `smartmig bench policy`: the quality gates of the learned policy (issue 7).
//!
//! 1. On the default diurnal day (one run, same seed for every policy): the
//!    full `simulate --compare` table with the learned policy added, then
//!    the gate lines: ET of the policy vs the opponents fitted on eight
//!    other days (`static-hist`, `twice-daily-hist`), the hindsight
//!    references (`static-hindsight`, `twice-daily-hindsight`), `none`,
//!    `greedy`; energy over its lower bound; late-job share vs the best
//!    other policy.
//! 2. The same on a trace (`--trace FILE --trace-format alibaba` for the
//!    Alibaba GPU v2023 trace), when given.
//! 3. Decision latency per GPU, batched (one session run per epoch), at
//!    8, 1,000 and 10,000 GPUs on synthetic busy clusters.

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::args::JsonArg;
use crate::mig::{Geometry, GpuModel};
use crate::policy::onnx::load_policy;
use crate::policy::{
    ClusterView, GpuStatus, PendingByProfile, PendingJob, RepartitionPolicy, MODEL_COUNT,
};
use crate::report::compare::{compare, CompareOptions};
use crate::report::Comparison;
use crate::sim::{EpochRule, Heuristic, SimConfig};
use crate::workload::{
    generate_diurnal, read_trace, DiurnalConfig, SpeedupCurve, TraceFormat, TraceOptions,
};

#[derive(Debug, clap::Args)]
pub struct PolicyArgs {
    /// The learned policy to judge.
    #[arg(long, default_value = "policies/a100-40gb.onnx")]
    pub policy: PathBuf,
    #[arg(long, default_value_t = 8)]
    pub gpus: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value = "edf")]
    pub placement: String,
    /// Also judge on this trace file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    #[arg(long, default_value = "alibaba")]
    pub trace_format: String,
    /// Also run the hindsight rollout oracle on the day (a few seconds at 8
    /// GPUs) to show what any repartitioning policy could gain there.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub oracle: bool,
    /// The tables, the oracle and the latencies.
    #[command(flatten)]
    pub json: JsonArg,
    /// Cluster sizes of the latency measurement, comma-separated.
    #[arg(long, default_value = "8,1000,10000", value_delimiter = ',')]
    pub latency_gpus: Vec<usize>,
}

pub fn run(a: &PolicyArgs) -> Result<()> {
    let spec = format!("policy:{}", a.policy.display());
    let probe = crate::policy::onnx::load_any_policy(&a.policy)?;
    let model = probe.metadata().gpu_model;
    drop(probe);
    let heuristic: Heuristic = a.placement.parse()?;
    let cluster = vec![model; a.gpus];

    let dcfg = DiurnalConfig::default();
    let jobs = generate_diurnal(&dcfg, model, a.gpus, a.seed);
    let cfg = SimConfig {
        seed: a.seed,
        workload_horizon_s: Some(dcfg.horizon_s),
        start_hour: dcfg.start_hour,
        epoch: EpochRule::Events(crate::sim::DEFAULT_EPOCH_EVENTS),
        ..SimConfig::default()
    };
    let mut opts = CompareOptions::new(format!("diurnal 24 h workload (seed {})", a.seed), 1.0);
    opts.extra.push(spec.clone());
    for seed in (1..=8).map(|k| a.seed.wrapping_add(k)) {
        opts.training.push(crate::eval::Day {
            label: format!("seed {seed}"),
            jobs: generate_diurnal(&dcfg, model, a.gpus, seed),
            cfg: SimConfig {
                seed,
                ..cfg.clone()
            },
        });
    }
    let c = compare(&cluster, &jobs, &cfg, heuristic, &opts)?;
    let mut out = a.json.table();
    write!(out, "{}", c.table())?;
    gates(&mut out, &c)?;
    let oracle_et = oracle_line(&mut out, &c, model, heuristic, a)?;
    let mut report = Report {
        day: c,
        oracle_et,
        trace: None,
        latency: Vec::new(),
    };

    if let Some(path) = &a.trace {
        let format: TraceFormat = a.trace_format.parse()?;
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let topts = TraceOptions {
            lenient: true,
            seed: a.seed,
            ..TraceOptions::new(model)
        };
        let trace = read_trace(format, BufReader::new(file), &topts)
            .with_context(|| format!("reading {}", path.display()))?;
        let cfg = SimConfig {
            seed: a.seed,
            ..SimConfig::default()
        };
        let mut opts = CompareOptions::new(format!("{format} trace {}", path.display()), 1.0);
        opts.extra.push(spec.clone());
        writeln!(out)?;
        let c = compare(&cluster, &trace.jobs, &cfg, heuristic, &opts)?;
        write!(out, "{}", c.table())?;
        gates(&mut out, &c)?;
        report.trace = Some(c);
    }

    writeln!(
        out,
        "\ndecision latency (one batched ONNX Runtime call per epoch, 1 intra-op thread):"
    )?;
    writeln!(
        out,
        "{:>8}  {:>12}  {:>12}  {:>10}",
        "GPUs", "per epoch", "per GPU", "epochs"
    )?;
    for &n in &a.latency_gpus {
        let mut policy = load_policy(&a.policy, model)?;
        let (per_epoch, per_gpu, epochs) = latency(&mut policy, model, n, a.seed)?;
        writeln!(
            out,
            "{n:>8}  {:>9.1} us  {:>9.3} us  {epochs:>10}",
            per_epoch * 1e6,
            per_gpu * 1e6
        )?;
        report.latency.push(Latency {
            gpus: n,
            per_epoch_us: per_epoch * 1e6,
            per_gpu_us: per_gpu * 1e6,
            epochs,
        });
    }
    a.json.write(&report)
}

/// What `--json` writes.
#[derive(serde::Serialize)]
struct Report {
    /// The diurnal day's comparison (every row, the learned one included).
    day: Comparison,
    /// ET of the hindsight oracle on the day (best of its two starts).
    oracle_et: Option<f64>,
    trace: Option<Comparison>,
    latency: Vec<Latency>,
}

#[derive(serde::Serialize)]
struct Latency {
    gpus: usize,
    per_epoch_us: f64,
    per_gpu_us: f64,
    epochs: usize,
}

/// What the target should be read against: the hindsight rollout oracle
/// (`learn::oracle`) on the same day, the better of its runs from whole
/// GPUs and from a static-best assignment, next to the table's static-best.
/// A local search, not a bound: it shows what a few well-timed moves gain
/// when the day is known.
fn oracle_line(
    out: &mut dyn Write,
    c: &Comparison,
    model: GpuModel,
    heuristic: Heuristic,
    a: &PolicyArgs,
) -> Result<Option<f64>> {
    if !a.oracle {
        return Ok(None);
    }
    let cfg = crate::learn::train::TrainConfig {
        gpu_model: model,
        heuristic: heuristic.to_string(),
        ..Default::default()
    };
    let day = crate::learn::train::Day::new(&cfg, a.gpus, a.seed)?;
    let t0 = Instant::now();
    let (_, layouts, _) = crate::learn::train::static_best(&cfg, &day)?;
    let from_whole = crate::learn::oracle::from_whole(&cfg, &day, 3, usize::MAX)?;
    let from_static = crate::learn::oracle::rollout(&cfg, &day, &layouts, 3, usize::MAX)?;
    let best = [from_whole.et, from_static.et]
        .into_iter()
        .min_by(f64::total_cmp);
    let sb = c
        .rows
        .iter()
        .find(|r| r.policy == "static-hindsight")
        .map(|r| r.et);
    match (best, sb) {
        (Some(o), Some(s)) => writeln!(
            out,
            "  ET hindsight oracle   {o:.3} vs {s:.3} = {:+.1} %  (best of its runs from whole GPUs and from static-best, vs static-hindsight; {:.1} s)",
            (o / s - 1.0) * 100.0,
            t0.elapsed().as_secs_f64()
        )?,
        _ => writeln!(out, "  ET hindsight oracle   undefined on this day")?,
    }
    Ok(best)
}

/// The gate lines under a comparison table.
fn gates(out: &mut dyn Write, c: &Comparison) -> Result<()> {
    let row = |name: &str| c.rows.iter().find(|r| r.policy == name);
    let Some(learned) = c.rows.iter().find(|r| r.policy.starts_with("policy:")) else {
        writeln!(out, "(learned policy missing from the table)")?;
        return Ok(());
    };
    writeln!(out, "\ngates ({}):", learned.policy)?;
    for base in [
        "static-hist",
        "twice-daily-hist",
        "static-hindsight",
        "twice-daily-hindsight",
        "none",
        "greedy",
    ] {
        let Some(r) = row(base) else { continue };
        let target = match base {
            "static-hindsight" => "  (target <= -18 %, aim -35 %)",
            "greedy" => "  (target < 0)",
            _ => "",
        };
        let (et, b) = (learned.et, r.et);
        writeln!(
            out,
            "  ET vs {base:<21} {et:.3} vs {b:.3} = {:+.1} %{target}",
            (et / b - 1.0) * 100.0
        )?;
    }
    writeln!(
        out,
        "  energy / lower bound   {:.3}",
        learned.energy_over_bound
    )?;
    let best_other = c
        .rows
        .iter()
        .filter(|r| !r.policy.starts_with("policy:") && r.metrics.unserved == 0)
        .min_by(|a, b| a.metrics.late_share.total_cmp(&b.metrics.late_share));
    if let Some(b) = best_other {
        writeln!(
            out,
            "  late-job share         {:.1} % vs {:.1} % ({}, the best other policy that ran every job)",
            learned.metrics.late_share * 100.0,
            b.metrics.late_share * 100.0,
            b.policy
        )?;
    }
    writeln!(
        out,
        "  jobs never run         {} (learned)",
        learned.metrics.unserved + learned.metrics.rejected
    )?;
    Ok(())
}

/// Mean wall time of `decide` over synthetic views of `n` GPUs: (per epoch,
/// per GPU, epochs timed).
fn latency(
    policy: &mut dyn RepartitionPolicy,
    model: GpuModel,
    n: usize,
    seed: u64,
) -> Result<(f64, f64, usize)> {
    let g = Geometry::of(model);
    let catalog = g.catalog();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut views = Vec::new();
    for _ in 0..4 {
        let gpus: Vec<GpuStatus> = (0..n)
            .map(|_| {
                let layout = catalog[rng.random_range(0..catalog.len())];
                let mut st = GpuStatus::new(model, layout);
                for id in layout.iter() {
                    if rng.random_bool(0.5) {
                        st.busy = st.busy.with(id);
                        st.busy_until[id.0 as usize] = rng.random_range(0.0..7200.0);
                    }
                }
                st
            })
            .collect();
        let pending: Vec<PendingJob> = (0..n / 2)
            .map(|i| {
                let p = &model.spec().profiles[rng.random_range(0..model.spec().profiles.len())];
                let mut shapes = [None; MODEL_COUNT];
                shapes[model as usize] = Some(p.shape);
                PendingJob {
                    id: i as u64,
                    arrival: 0.0,
                    deadline: rng.random_range(0.0..7200.0),
                    work: rng.random_range(10.0..3600.0),
                    memory_gb: f64::from(p.memory_gb),
                    min_compute: 1,
                    speedup: SpeedupCurve::linear(),
                    shapes,
                }
            })
            .collect();
        let mut by_profile = PendingByProfile::default();
        for j in &pending {
            if let Some(k) = model
                .spec()
                .profiles
                .iter()
                .position(|p| Some(p.shape) == j.shape(model))
            {
                by_profile[model as usize][k] += 1;
            }
        }
        views.push((gpus, pending, by_profile));
    }
    let mut run = |k: usize| {
        let (gpus, pending, by_profile) = &views[k % views.len()];
        let view = ClusterView {
            now: 100.0,
            hour_of_day: 12.0,
            gpus,
            pending,
            pending_by_profile: by_profile,
            arrivals: pending,
        };
        std::hint::black_box(policy.decide(&view));
    };
    for k in 0..3 {
        run(k); // warm-up
    }
    let epochs = (200_000 / n.max(1)).clamp(5, 2000);
    let t = Instant::now();
    for k in 0..epochs {
        run(k);
    }
    let per_epoch = t.elapsed().as_secs_f64() / epochs as f64;
    Ok((per_epoch, per_epoch / n.max(1) as f64, epochs))
}
