//! `smartmig train --config etc/train.toml`: trains the learned
//! repartitioning policy on the simulator and writes `policy.onnx` plus its
//! metadata JSON (see `docs/policy.md`).

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use super::args::TraceWindow;
use super::policy_out::{write_policy, write_with_metadata};
use super::train_placement::{self, PlacementOverrides};
use crate::formats::policy_file::{PolicyMetadata, POLICY_KEY};
use crate::learn::train::{
    train, Progress, StartSearch, TrainConfig, TrainReport, TrainStart, TrainingData,
};
use crate::policy::features::FeatureSpec;
use crate::scenario::{default_scenarios, select_scenarios};
use crate::workload::{read_trace, TraceFormat, TraceOptions};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Training configuration (TOML, see etc/train.toml).
    #[arg(long, required_unless_present = "merge")]
    pub config: Option<PathBuf>,
    /// Instead of training, merge these policy files (comma-separated,
    /// trained for the same GPU model and feature spec, e.g. with
    /// different `--seed`s) into one that acts on the mean of their logits
    /// (docs/policy.md, "An ensemble of seeds").
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "FILES",
        conflicts_with_all = ["config", "seed", "seeds", "gpu_model", "time_budget", "trace", "scenarios", "start"]
    )]
    pub merge: Vec<PathBuf>,
    /// Where to write the policy (e.g. `policy.onnx`); the metadata goes
    /// next to it as `.json`.
    #[arg(long, short, value_name = "FILE")]
    pub out: PathBuf,
    /// Override the config's seed.
    #[arg(long, conflicts_with = "seeds")]
    pub seed: Option<u64>,
    /// Train once per seed (comma-separated, e.g. `7,8,9,10`), write each
    /// member next to `--out` as `<stem>.seed<N>.onnx`, and merge them into
    /// `--out`: an ensemble acting on the mean of their logits
    /// (docs/policy.md, "An ensemble of seeds").
    #[arg(long, value_delimiter = ',', value_name = "SEEDS")]
    pub seeds: Vec<u64>,
    /// Override the config's GPU model (e.g. `h100-80gb`).
    #[arg(long, value_name = "MODEL", alias = "model")]
    pub gpu_model: Option<crate::mig::GpuModel>,
    /// Override the config's wall-clock budget, s.
    #[arg(long)]
    pub time_budget: Option<f64>,
    /// Train on windows of this trace instead of generated diurnal days
    /// (validation on its last windows; see docs/policy.md).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Format of `--trace`: csv, alibaba or sacct.
    #[arg(long, default_value = "csv", requires = "trace")]
    pub trace_format: String,
    /// Length of one episode cut from `--trace`, hours.
    #[arg(
        long = "trace-window",
        value_name = "LEN_H",
        default_value = "24",
        alias = "trace-window-h",
        requires = "trace"
    )]
    pub trace_window: TraceWindow,
    /// Train on days of the yardstick's scenarios instead of diurnal days:
    /// `all`, or comma-separated scenario or family names (`mix-shift`
    /// selects both deadline regimes; `smartmig bench suite` lists them).
    /// Training and validation seeds never meet the suite's test days.
    #[arg(long, value_delimiter = ',', conflicts_with = "trace")]
    pub scenarios: Vec<String>,
    /// Override the config's `start`: where each scenario episode and
    /// validation day begins, `own` (catalog layout `initial_layout`, whole
    /// GPUs by default) or `fitted` (the static layout fitted on the
    /// scenario's past days, where `bench suite` starts learned policies;
    /// needs --scenarios; docs/policy.md).
    #[arg(long, value_name = "WHERE", value_parser = ["own", "fitted"])]
    pub start: Option<String>,
}

pub fn run(a: &Args) -> Result<()> {
    // candle parallelises matrix products with rayon; the networks are tiny
    // and thread hand-offs dominate (and the machine may be shared), so
    // training uses one thread unless the user says otherwise. Set before
    // any thread exists.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    let Some(config) = &a.config else {
        return merge(&a.merge, &a.out);
    };
    let text =
        std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    if train_placement::is_placement_config(&text) {
        if a.trace.is_some() || !a.scenarios.is_empty() {
            bail!("a placement config names its days in [data]; --trace and --scenarios are for repartitioning configs");
        }
        if !a.seeds.is_empty() {
            bail!("--seeds (an ensemble) is for repartitioning configs; train a placement policy with one --seed");
        }
        let overrides = PlacementOverrides {
            seed: a.seed,
            gpu_model: a.gpu_model,
            time_budget_s: a.time_budget,
            out: &a.out,
        };
        return train_placement::run(&overrides, config, &text);
    }
    let mut cfg: TrainConfig =
        toml::from_str(&text).with_context(|| format!("parsing {}", config.display()))?;
    if let Some(s) = a.seed {
        cfg.seed = s;
    }
    if let Some(m) = a.gpu_model {
        cfg.gpu_model = m;
    }
    if let Some(t) = a.time_budget {
        cfg.time_budget_s = t;
    }
    match a.start.as_deref() {
        Some("fitted") => cfg.start = TrainStart::Fitted,
        Some(_) => cfg.start = TrainStart::Own,
        None => {}
    }
    cfg.validate()?;
    let data = match &a.trace {
        None if a.scenarios.is_empty() => TrainingData::Diurnal,
        None => {
            let only: Vec<String> = a
                .scenarios
                .iter()
                .filter(|s| *s != "all")
                .cloned()
                .collect();
            TrainingData::Scenarios(
                select_scenarios(default_scenarios(), &only).context("--scenarios")?,
            )
        }
        Some(path) => {
            let format: TraceFormat = a.trace_format.parse()?;
            let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
            // Real traces hold rows out of scope (CPU-only pods, ...): skip
            // malformed rows rather than refuse the whole file, and say so.
            let opts = TraceOptions {
                lenient: true,
                seed: cfg.seed,
                ..TraceOptions::new(cfg.gpu_model)
            };
            let trace = read_trace(format, BufReader::new(file), &opts)
                .with_context(|| format!("reading {}", path.display()))?;
            eprintln!(
                "{}: {} jobs ({} malformed rows skipped, {} out of scope)",
                path.display(),
                trace.jobs.len(),
                trace.skipped.len(),
                trace.dropped_total()
            );
            TrainingData::from_trace(
                &cfg,
                &trace,
                a.trace_window.length_only("train")? * 3600.0,
                format!("{format} trace {}", path.display()),
            )?
        }
    };
    match a.seeds.as_slice() {
        [] => train_and_write(&cfg, &data, &a.out),
        [seed] => {
            cfg.seed = *seed;
            train_and_write(&cfg, &data, &a.out)
        }
        seeds => {
            let mut members = Vec::with_capacity(seeds.len());
            for &seed in seeds {
                cfg.seed = seed;
                let member = member_path(&a.out, seed);
                train_and_write(&cfg, &data, &member)?;
                members.push(member);
            }
            merge(&members, &a.out)
        }
    }
}

/// Where `--seeds` writes the member trained with `seed`: beside `out`,
/// `<stem>.seed<seed>.onnx`.
fn member_path(out: &std::path::Path, seed: u64) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or_else(|| "policy".into(), |s| s.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}.seed{seed}.onnx"))
}

/// One training run of `cfg` on `data`, written to `out` (and its `.json`).
fn train_and_write(cfg: &TrainConfig, data: &TrainingData, out: &std::path::Path) -> Result<()> {
    let (net, report) = train_with_progress(cfg, data)?;
    let meta = trained_metadata(cfg, data, &report);
    let (bytes, meta_path) = write_policy(&net, POLICY_KEY, &meta, out)?;
    println!(
        "wrote {} ({} bytes) and {}\ntraining: {:.0} s, {} episodes, checkpoint {}\nvalidation days (mean): ET {} vs static-best {} ({}), teacher {}",
        out.display(),
        bytes.len(),
        meta_path.display(),
        report.seconds,
        report.episodes,
        report.chosen,
        fmt(report.validation_et),
        fmt(report.validation_static_best_et),
        report.validation_static_best_layout,
        fmt(report.validation_teacher_et),
    );
    Ok(())
}

/// [`train`] with a progress bar (phases, steps, validation lines).
fn train_with_progress(
    cfg: &TrainConfig,
    data: &TrainingData,
) -> Result<(crate::learn::model::ActorCritic, TrainReport)> {
    let first = if cfg.dagger.rounds > 0 {
        (cfg.dagger.rounds + 1) * cfg.dagger.episodes
    } else {
        cfg.imitation.episodes
    };
    let total = (first + cfg.ppo.iterations + cfg.es.iterations) as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {prefix} {msg}")
            .context("progress template")?
            .progress_chars("=> "),
    );
    let mut last_val = String::from("val: -");
    let trained = train(cfg, data, |p| match p {
        Progress::Phase { name, .. } => bar.set_prefix(name),
        Progress::StartsFitted {
            fits,
            simulations,
            seconds,
        } => {
            let line = format!(
                "fitted starts: {fits} fits ({simulations} simulated days) in {seconds:.1} s"
            );
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
        }
        Progress::Step {
            mean_return,
            mean_et,
            ..
        } => {
            bar.inc(1);
            let et = mean_et.map_or("-".into(), |e| format!("{e:.3}"));
            bar.set_message(format!("reward {mean_return:.3} ET {et} | {last_val}"));
        }
        Progress::Validation {
            step,
            et,
            static_best_et,
        } => {
            let f = |x: Option<f64>| x.map_or("-".into(), |e| format!("{e:.3}"));
            last_val = format!("val ET {} vs static-best {}", f(et), f(static_best_et));
            let line = format!(
                "validation after {step}: ET {} (static-best {})",
                f(et),
                f(static_best_et)
            );
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
        }
    })?;
    bar.finish();
    Ok(trained)
}

/// The metadata of a trained policy: how it was trained and validated.
fn trained_metadata(
    cfg: &TrainConfig,
    data: &TrainingData,
    report: &TrainReport,
) -> PolicyMetadata {
    let spec = FeatureSpec::new(cfg.gpu_model);
    let mut meta = PolicyMetadata::new(&spec, cfg.hidden);
    meta.initial_layout = cfg.initial_layout;
    meta.training = serde_json::json!({
        "config": cfg,
        "data": data.describe(cfg),
        "seconds": report.seconds,
        "episodes": report.episodes,
        "ppo_iterations": report.ppo_iterations,
        "chosen_checkpoint": report.chosen,
        "smartmig_version": env!("CARGO_PKG_VERSION"),
        "start": match cfg.start {
            TrainStart::Own => serde_json::json!({
                "kind": "own",
                "description": "every GPU began each episode and validation day at catalog layout initial_layout",
            }),
            TrainStart::Fitted => serde_json::json!({
                "kind": "fitted",
                "description": format!(
                    "each scenario episode and validation day began from the static layout fitted ({} search) on the scenario's days with seeds 0..{} on its cluster size",
                    match cfg.start_search {
                        StartSearch::Coarse => "coarse",
                        StartSearch::Full => "full",
                    },
                    cfg.start_days
                ),
                "fit_seconds": report.start_fit_seconds,
                "layouts": report.start_layouts,
            }),
        },
    });
    meta.validation = serde_json::json!({
        "days": match data {
            TrainingData::Diurnal => format!(
                "{} diurnal days, seeds {}..{}, {} GPUs (means over the days)",
                report.validation_days,
                report.validation_seed,
                report.validation_seed + report.validation_days as u64 - 1,
                report.validation_gpus
            ),
            TrainingData::Scenarios(list) => format!(
                "{} scenario days ({} in turn), seeds {}..{}, {} GPUs (means over the days)",
                report.validation_days,
                list.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "),
                report.validation_seed,
                report.validation_seed + report.validation_days as u64 - 1,
                report.validation_gpus
            ),
            TrainingData::Trace { validation, window_s, .. } => format!(
                "the last {} trace windows of {:.1} h with late jobs, {} GPUs (means over the windows)",
                validation.len(),
                window_s / 3600.0,
                report.validation_gpus
            ),
        },
        "reference": "none (whole GPUs) with the same heuristic",
        "et": report.validation_et,
        "teacher_et": report.validation_teacher_et,
        "static_best_et": report.validation_static_best_et,
        "static_best_layout": report.validation_static_best_layout,
    });
    meta
}

/// `smartmig train --merge A.onnx,B.onnx,... --out M.onnx`: one policy
/// file acting on the mean of the members' logits
/// ([`crate::learn::ensemble`]). The members must be repartitioning
/// policies of one GPU model, feature spec, action space and initial
/// layout; the merged metadata keeps each member's training record and
/// member 0's guard.
fn merge(paths: &[PathBuf], out: &std::path::Path) -> Result<()> {
    use crate::formats::policy_file::{read, Kind};
    use crate::learn::ensemble;
    let mut members = Vec::with_capacity(paths.len());
    let mut metas: Vec<PolicyMetadata> = Vec::with_capacity(paths.len());
    for path in paths {
        let (meta, bytes): (PolicyMetadata, Vec<u8>) = read(path, Kind::Repartitioning)?;
        if let Some(first) = metas.first() {
            let same = |m: &PolicyMetadata| {
                (
                    m.gpu_model,
                    m.feature_spec_version,
                    m.obs_dim,
                    m.actions,
                    m.initial_layout,
                )
            };
            if same(first) != same(&meta) || first.catalog != meta.catalog {
                bail!(
                    "{} does not fit {}: model {} spec {} ({} inputs, {} actions, initial layout {}) against model {} spec {} ({} inputs, {} actions, initial layout {})",
                    path.display(),
                    paths[0].display(),
                    meta.gpu_model, meta.feature_spec_version, meta.obs_dim, meta.actions, meta.initial_layout,
                    first.gpu_model, first.feature_spec_version, first.obs_dim, first.actions, first.initial_layout,
                );
            }
        }
        members.push(
            ensemble::read_actor(&bytes).with_context(|| format!("reading {}", path.display()))?,
        );
        metas.push(meta);
    }
    let merged = ensemble::merge(&members).context("--merge")?;
    let mut meta = metas[0].clone();
    meta.hidden = merged[0].2;
    meta.training = serde_json::json!({
        "ensemble": {
            "how": "one MLP acting on the mean of the members' logits (smartmig train --merge)",
            "members": paths.iter().zip(&metas).map(|(p, m)| serde_json::json!({
                "file": p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned()),
                "hidden": m.hidden,
                "training": m.training,
                "validation": m.validation,
            })).collect::<Vec<_>>(),
        },
        "smartmig_version": env!("CARGO_PKG_VERSION"),
    });
    meta.validation = serde_json::json!({
        "note": "the members' validation is under training.ensemble.members; the merged file was not validated by the trainer (bench suite --test-seed 500 scores it)",
    });
    let json = serde_json::to_string(&meta).context("serialising metadata")?;
    let bytes = crate::learn::export::mlp_policy_onnx(&merged, &[(POLICY_KEY, json.as_str())]);
    let (bytes, meta_path) = write_with_metadata(bytes, &meta, out)?;
    println!(
        "wrote {} ({} bytes, {} members, hidden {}) and {}",
        out.display(),
        bytes.len(),
        paths.len(),
        meta.hidden,
        meta_path.display()
    );
    Ok(())
}

fn fmt(x: Option<f64>) -> String {
    x.map_or("-".into(), |e| format!("{e:.4}"))
}
