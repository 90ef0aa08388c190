//! `smartmig audit FILE`: re-check a simulator event log.

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use anyhow::{Context, Result};

use super::args::JsonArg;
use crate::sim::{audit, read_events};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Event log written by `smartmig simulate --events FILE`.
    pub file: PathBuf,
    #[command(flatten)]
    pub json: JsonArg,
    /// Re-charge the totals at this later horizon, s: what a comparison
    /// whose latest row ended then charges (`simulate --compare` prints
    /// its horizon): GPUs idle until then, and each job that never ran is
    /// charged as if run on a whole GPU from then (docs/evaluation.md).
    #[arg(long, value_name = "S")]
    pub horizon: Option<f64>,
}

pub fn run(a: &Args) -> Result<()> {
    let f = File::open(&a.file).with_context(|| format!("opening {}", a.file.display()))?;
    let records =
        read_events(BufReader::new(f)).with_context(|| format!("reading {}", a.file.display()))?;
    let r = audit(&records).with_context(|| format!("{} fails the audit", a.file.display()))?;
    let r = match a.horizon {
        Some(h) if !(h.is_finite() && h >= r.horizon_s) => anyhow::bail!(
            "--horizon {h}: expected a number of seconds at least the log's own horizon, {} s",
            r.horizon_s
        ),
        Some(h) => r.at_horizon(h),
        None => r,
    };
    if !a.json.to_stdout() {
        println!(
            "OK: {} jobs on {} GPUs, {} reconfigurations ({} fusions, {} fissions, {} reshapes), {} unserved; energy {:.6} MJ over {:.1} s; mean tardiness {:.3} s ({} late)",
            r.jobs,
            r.gpus,
            r.reconfigurations,
            r.kinds.fusions,
            r.kinds.fissions,
            r.kinds.reshapes,
            r.unserved,
            r.energy_j / 1e6,
            r.horizon_s,
            r.mean_tardiness_s,
            r.late_jobs
        );
    }
    a.json.write(&r)
}
