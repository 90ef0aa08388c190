//! `smartmig bench oracle`: the hindsight rollout oracle
//! ([`crate::learn::oracle`]) on diurnal days, next to `none`,
//! `static-best` and `twice-daily` (the last two also searched in
//! hindsight). It answers "how much ET could per-epoch repartitioning gain
//! on this workload at best, with this placement?", which is what a learned
//! policy's target should be compared with.

use std::time::Instant;

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::learn::oracle::{from_whole, rollout};
use crate::learn::train::{static_best, twice_daily_search, Day, TrainConfig};
use crate::mig::GpuModel;

#[derive(Debug, clap::Args)]
pub struct OracleArgs {
    #[arg(long, default_value = "a100-40gb")]
    pub model: GpuModel,
    #[arg(long, default_value_t = 8)]
    pub gpus: usize,
    /// Diurnal day seeds, comma-separated.
    #[arg(long, default_value = "0", value_delimiter = ',')]
    pub seeds: Vec<u64>,
    #[arg(long, default_value = "edf")]
    pub placement: String,
    /// Most whole-day simulations per day (later epochs keep once spent).
    #[arg(long, default_value_t = 200_000)]
    pub max_simulations: usize,
    /// Most improvement sweeps over the day's epochs.
    #[arg(long, default_value_t = 3)]
    pub passes: usize,
    /// Start from whole GPUs (as a live policy does) instead of the day's static-best.
    #[arg(long)]
    pub from_whole: bool,
    /// Print every move of the oracle (epoch, hour, GPU, layout).
    #[arg(long)]
    pub moves: bool,
    /// Also write the table as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Serialize)]
struct Row {
    seed: u64,
    gpus: usize,
    static_best_et: Option<f64>,
    twice_daily_et: Option<f64>,
    oracle_et: Option<f64>,
    oracle_vs_static_best: Option<f64>,
    moves: usize,
    simulations: usize,
    passes: usize,
    seconds: f64,
}

pub fn run(a: &OracleArgs) -> Result<()> {
    if a.gpus == 0 {
        anyhow::bail!("--gpus must be at least 1");
    }
    // Named as the command line spells it (the trainer's config would call
    // it `heuristic`).
    let _: crate::sim::Heuristic = a
        .placement
        .parse()
        .with_context(|| format!("--placement {}", a.placement))?;
    let cfg = TrainConfig {
        gpu_model: a.model,
        heuristic: a.placement.clone(),
        ..TrainConfig::default()
    };
    cfg.validate()?;
    println!(
        "{:>6} {:>8} {:>12} {:>12} {:>8} {:>10} {:>8} {:>12} {:>8}",
        "seed",
        "none",
        "static-best",
        "twice-daily",
        "oracle",
        "vs s-best",
        "moves",
        "simulations",
        "time s"
    );
    let mut rows = Vec::new();
    for &seed in &a.seeds {
        let day = Day::new(&cfg, a.gpus, seed)?;
        let (sb_et, layouts, _) = static_best(&cfg, &day)?;
        let (_, td_et) = day.evaluate(
            &cfg,
            &mut twice_daily_search(&cfg, std::slice::from_ref(&day))?.policy,
        )?;
        let t0 = Instant::now();
        let run = if a.from_whole {
            from_whole(&cfg, &day, a.passes, a.max_simulations)?
        } else {
            rollout(&cfg, &day, &layouts, a.passes, a.max_simulations)?
        };
        let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
        let rel = match (run.et, sb_et) {
            (Some(o), Some(s)) if s > 0.0 => Some(o / s - 1.0),
            _ => None,
        };
        let vs = rel.map_or("-".into(), |r| format!("{:+.1}%", r * 100.0));
        let moves = run.decisions.iter().map(Vec::len).sum();
        let seconds = t0.elapsed().as_secs_f64();
        println!(
            "{:>6} {:>8} {:>12} {:>12} {:>8} {:>10} {:>8} {:>12} {:>8.1}",
            seed,
            "1.000",
            f(sb_et),
            f(td_et),
            f(run.et),
            vs,
            moves,
            run.simulations,
            seconds
        );
        if a.moves {
            let g = crate::mig::Geometry::of(a.model);
            for (k, ds) in run.decisions.iter().enumerate() {
                for d in ds {
                    println!(
                        "         epoch {k:>4} {:>5.2} h  gpu {:>3} -> {}",
                        run.hours.get(k).copied().unwrap_or(0.0),
                        d.gpu,
                        g.picture(d.target)
                    );
                }
            }
        }
        rows.push(Row {
            seed,
            gpus: a.gpus,
            static_best_et: sb_et,
            twice_daily_et: td_et,
            oracle_et: run.et,
            oracle_vs_static_best: rel,
            moves,
            simulations: run.simulations,
            passes: run.passes,
            seconds,
        });
    }
    let valid: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.oracle_vs_static_best)
        .collect();
    if !valid.is_empty() {
        println!(
            "mean oracle vs static-best over {} days: {:+.1}%",
            valid.len(),
            valid.iter().sum::<f64>() / valid.len() as f64 * 100.0
        );
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
