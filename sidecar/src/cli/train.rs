//! `smartmig train --config etc/train.toml`: trains the learned
//! repartitioning policy on the simulator and writes `policy.onnx` plus its
//! metadata JSON (see `docs/policy.md`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::learn::train::{train, Progress, TrainConfig};
use crate::policy::features::FeatureSpec;
use crate::policy::onnx::{PolicyMetadata, METADATA_KEY};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Training configuration (TOML, see etc/train.toml).
    #[arg(long)]
    pub config: PathBuf,
    /// Where to write the policy; the metadata goes next to it as `.json`.
    #[arg(long, short, default_value = "policy.onnx")]
    pub out: PathBuf,
    /// Override the config's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override the config's GPU model (e.g. `h100-80gb`).
    #[arg(long)]
    pub gpu_model: Option<crate::mig::GpuModel>,
    /// Override the config's wall-clock budget, s.
    #[arg(long)]
    pub time_budget: Option<f64>,
}

pub fn run(a: &Args) -> Result<()> {
    // candle parallelises matrix products with rayon; the networks are tiny
    // and thread hand-offs dominate (and the machine may be shared), so
    // training uses one thread unless the user says otherwise. Set before
    // any thread exists.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    let text = std::fs::read_to_string(&a.config)
        .with_context(|| format!("reading {}", a.config.display()))?;
    let mut cfg: TrainConfig =
        toml::from_str(&text).with_context(|| format!("parsing {}", a.config.display()))?;
    if let Some(s) = a.seed {
        cfg.seed = s;
    }
    if let Some(m) = a.gpu_model {
        cfg.gpu_model = m;
    }
    if let Some(t) = a.time_budget {
        cfg.time_budget_s = t;
    }
    cfg.validate()?;
    let total = (cfg.imitation.episodes + cfg.ppo.iterations) as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {prefix} {msg}")
            .context("progress template")?
            .progress_chars("=> "),
    );
    let mut last_val = String::from("val: -");
    let (net, report) = train(&cfg, |p| match p {
        Progress::Phase { name, .. } => bar.set_prefix(name),
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

    let spec = FeatureSpec::new(cfg.gpu_model);
    let mut meta = PolicyMetadata::new(&spec, cfg.hidden);
    meta.training = serde_json::json!({
        "config": cfg,
        "data": format!(
            "simulated diurnal days (generate_diurnal, seeds from {}), {} GPUs per episode",
            cfg.seed.wrapping_mul(1_000_003) + 1,
            cfg.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join("/")
        ),
        "seconds": report.seconds,
        "episodes": report.episodes,
        "ppo_iterations": report.ppo_iterations,
        "chosen_checkpoint": report.chosen,
        "smartmig_version": env!("CARGO_PKG_VERSION"),
    });
    meta.validation = serde_json::json!({
        "days": format!(
            "{} diurnal days, seeds {}..{}, {} GPUs (means over the days)",
            report.validation_days,
            report.validation_seed,
            report.validation_seed + report.validation_days as u64 - 1,
            report.validation_gpus
        ),
        "reference": "none (whole GPUs) with the same heuristic",
        "et": report.validation_et,
        "teacher_et": report.validation_teacher_et,
        "static_best_et": report.validation_static_best_et,
        "static_best_layout": report.validation_static_best_layout,
    });
    let json = serde_json::to_string(&meta).context("serialising metadata")?;
    let bytes = net.export_onnx(&[(METADATA_KEY, json.as_str())])?;
    std::fs::write(&a.out, &bytes).with_context(|| format!("writing {}", a.out.display()))?;
    let meta_path = a.out.with_extension("json");
    std::fs::write(
        &meta_path,
        serde_json::to_string_pretty(&meta).context("serialising metadata")? + "\n",
    )
    .with_context(|| format!("writing {}", meta_path.display()))?;
    println!(
        "wrote {} ({} bytes) and {}\ntraining: {:.0} s, {} episodes, checkpoint {}\nvalidation days (mean): ET {} vs static-best {} ({}), teacher {}",
        a.out.display(),
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

fn fmt(x: Option<f64>) -> String {
    x.map_or("-".into(), |e| format!("{e:.4}"))
}
