//! `smartmig train --config etc/train-placement.toml`: trains the learned
//! job placement (masked PPO, `smartmig::learn::placement`) and writes
//! the `--out` file plus its metadata JSON (docs/policy.md, "The learned
//! placement").

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::formats::policy_file::{PlacementMetadata, PLACEMENT_KEY};
use crate::learn::placement::{train_placement, PlacementProgress, PlacementTrainConfig};
use crate::sim::placement_features::PlacementFeatures;

/// Whether a training config is a placement one (`kind = "placement"`).
pub fn is_placement_config(text: &str) -> bool {
    toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| t.get("kind").and_then(|k| k.as_str().map(str::to_owned)))
        .is_some_and(|k| k == "placement")
}

/// What `smartmig train` may change in a placement config, and where the
/// policy goes: the flags that apply to this kind of training, so that this
/// module needs nothing of `train`'s (the caller refuses the others).
pub struct PlacementOverrides<'a> {
    pub seed: Option<u64>,
    pub gpu_model: Option<crate::mig::GpuModel>,
    pub time_budget_s: Option<f64>,
    pub out: &'a std::path::Path,
}

pub fn run(a: &PlacementOverrides<'_>, config: &std::path::Path, text: &str) -> Result<()> {
    let mut cfg: PlacementTrainConfig =
        toml::from_str(text).with_context(|| format!("parsing {}", config.display()))?;
    if let Some(s) = a.seed {
        cfg.seed = s;
    }
    if let Some(m) = a.gpu_model {
        cfg.gpu_model = m;
    }
    if let Some(t) = a.time_budget_s {
        cfg.time_budget_s = t;
    }
    cfg.validate()?;
    let bar = ProgressBar::new(cfg.ppo.iterations as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {prefix} {msg}")
            .context("progress template")?
            .progress_chars("=> "),
    );
    let say = |bar: &ProgressBar, line: String| {
        if bar.is_hidden() {
            eprintln!("{line}");
        } else {
            bar.println(line);
        }
    };
    let (net, report) = train_placement(&cfg, |p| {
        match p {
        PlacementProgress::Phase(name) => bar.set_prefix(name),
        PlacementProgress::Iteration {
            iteration,
            mean_reward,
            ..
        } => {
            bar.set_position(iteration as u64);
            bar.set_message(format!("reward/decision {mean_reward:.3}"));
        }
        PlacementProgress::Validation {
            iteration,
            late_jobs,
            teacher_late_jobs,
            energy_ratio,
            tardiness_ratio,
        } => say(
            &bar,
            format!(
                "validation after {iteration}: {late_jobs} late jobs (best heuristic {teacher_late_jobs}), energy x{energy_ratio:.4}, tardiness x{tardiness_ratio:.3} of it"
            ),
        ),
    }
    })?;
    bar.finish();

    let mut meta = PlacementMetadata::new(&PlacementFeatures::new(cfg.gpu_model), cfg.hidden);
    meta.training = serde_json::json!({
        "config": cfg,
        "seconds": report.seconds,
        "episodes": report.episodes,
        "ppo_iterations": report.ppo_iterations,
        "teacher": report.teacher,
        "best_heuristic": report.best_heuristic,
        "chosen_checkpoint": report.chosen,
        "train_episodes": report.train_days,
        "smartmig_version": env!("CARGO_PKG_VERSION"),
    });
    meta.validation = serde_json::json!({
        "episodes": report.validation_days,
        "heuristics": report.validation_heuristics,
        "teacher": report.teacher_totals,
        "learned": report.validation_learned,
    });
    let out = a.out;
    let (bytes, meta_path) = super::policy_out::write_policy(&net, PLACEMENT_KEY, &meta, out)?;
    let best = report
        .validation_heuristics
        .iter()
        .find(|(h, _)| *h == report.best_heuristic)
        .map(|(_, t)| *t)
        .unwrap_or_default();
    println!(
        "wrote {} ({} bytes) and {}\ntraining: {:.0} s, {} episodes, {} PPO iterations, checkpoint {}\nvalidation ({} episodes): {} late jobs, best heuristic {} {} ({:+.2} %); energy {:+.2} %, tardiness {:+.2} % (teacher {}: {} late jobs)",
        out.display(),
        bytes.len(),
        meta_path.display(),
        report.seconds,
        report.episodes,
        report.ppo_iterations,
        report.chosen,
        report.validation_days,
        report.validation_learned.late_jobs,
        report.best_heuristic,
        best.late_jobs,
        100.0 * (report.validation_learned.late_jobs as f64 / best.late_jobs.max(1) as f64 - 1.0),
        100.0 * (report.validation_learned.energy_j / best.energy_j.max(1.0) - 1.0),
        100.0 * (report.validation_learned.tardiness_s / best.tardiness_s.max(1.0) - 1.0),
        report.teacher,
        report.teacher_totals.late_jobs,
    );
    Ok(())
}
