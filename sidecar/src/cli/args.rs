//! Flag groups shared by the subcommands (`#[command(flatten)]`), so that
//! one thing has one spelling everywhere:
//!
//! | flag | meaning | old spellings (hidden, for one release) |
//! |---|---|---|
//! | `--gpu-model M` | the GPU model | `--model`, `--gpu` (layouts) |
//! | `--json FILE` | write the result as JSON to FILE; `-` (or `--json` alone) prints it on stdout, where it takes the table's place (the table, if any, goes to stderr) | `--json` alone meant stdout in seven commands |
//! | `--policy SPEC` | a repartitioning policy, repeatable | `--policies a,b` (bench coordination) |
//! | `--trace-window [START_H,]LEN_H` | the trace window | `--window-h` (bench suite), `--trace-window-h` (train) |

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::mig::GpuModel;

/// `--gpu-model M`.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct GpuModelArg {
    /// GPU model: a30-24gb, a100-40gb, a100-80gb, h100-80gb, h100-94gb,
    /// h200-141gb, b200-180gb, gb200-186gb, b300-288gb, gb300-288gb,
    /// rtx-pro-6000-96gb, rtx-pro-5000-48gb (or a family naming one: b200).
    #[arg(
        long = "gpu-model",
        value_name = "MODEL",
        default_value = "a100-40gb",
        aliases = ["model", "gpu"]
    )]
    pub gpu_model: GpuModel,
}

/// `--json FILE`: where the result goes as JSON.
/// The cluster and the days of a benchmark over scenarios (`bench suite`,
/// `bench placement`): the same flags, one definition.
#[derive(Clone, Debug, clap::Args)]
pub struct ScenarioDaysArgs {
    /// GPUs of the simulated cluster for the generated scenarios (default
    /// 16; 8 with --quick).
    #[arg(long)]
    pub gpus: Option<usize>,
    #[command(flatten)]
    pub gpu: GpuModelArg,
    /// Only these scenarios (comma-separated names, or a family name such as
    /// `mix-shift` for both deadline regimes).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Training days per scenario (seeds `train_seed..`): the opponents (the
    /// static layout) are fitted on them (default 8; 3 with --quick).
    #[arg(long)]
    pub train_days: Option<usize>,
    /// Test days per scenario (seeds `test_seed..`): every policy is scored
    /// on them (default: `bench suite` 48, enough to tell 3 % apart,
    /// docs/evaluation.md; `bench placement` 4; 2 with --quick).
    #[arg(long)]
    pub test_days: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub train_seed: u64,
    #[arg(long, default_value_t = 1000)]
    pub test_seed: u64,
    /// A small run: 8 GPUs, 3 training and 2 test days, a smaller search.
    #[arg(long)]
    pub quick: bool,
}

#[derive(Clone, Debug, Default, clap::Args)]
pub struct JsonArg {
    /// Write the result as JSON to FILE; `-` (or `--json` alone) prints it
    /// on stdout in place of the table.
    #[arg(
        long = "json",
        value_name = "FILE",
        num_args = 0..=1,
        default_missing_value = "-"
    )]
    pub json: Option<PathBuf>,
}

impl JsonArg {
    /// Whether the JSON goes to stdout (the table then does not).
    pub fn to_stdout(&self) -> bool {
        self.json.as_deref() == Some(Path::new("-"))
    }

    /// Where the human-readable table goes: stdout, or stderr when the
    /// JSON takes stdout.
    pub fn table(&self) -> Box<dyn Write> {
        if self.to_stdout() {
            Box::new(std::io::stderr())
        } else {
            Box::new(std::io::stdout())
        }
    }

    /// Writes `value` where `--json` says (nothing without it), pretty,
    /// with a final newline.
    pub fn write<T: Serialize + ?Sized>(&self, value: &T) -> Result<()> {
        let Some(path) = &self.json else {
            return Ok(());
        };
        let text = serde_json::to_string_pretty(value)? + "\n";
        if self.to_stdout() {
            std::io::stdout()
                .write_all(text.as_bytes())
                .context("writing the JSON to stdout")
        } else {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
        }
    }
}

/// `--policy SPEC`, repeatable (a command's default applies when none is
/// given: [`PolicyArgs::or`]).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct PolicyArgs {
    /// Repartitioning policy (repeatable; `smartmig simulate --help` lists them).
    #[arg(long = "policy", value_name = "SPEC")]
    pub policy: Vec<String>,
    /// The old spelling: comma-separated (a spec with a comma, such as
    /// `greedy:window=60,init=1`, needs `--policy`).
    #[arg(long = "policies", hide = true, value_delimiter = ',')]
    pub policies: Vec<String>,
}

impl PolicyArgs {
    /// The policies given, or `default` when none was.
    pub fn or(&self, default: &[&str]) -> Vec<String> {
        let given: Vec<String> = self.policy.iter().chain(&self.policies).cloned().collect();
        if given.is_empty() {
            default.iter().map(|s| (*s).to_string()).collect()
        } else {
            given
        }
    }
}

/// `--trace-window [START_H,]LEN_H`: windows of LEN_H hours of a trace,
/// from START_H hours after its first arrival (default 0). `simulate` runs
/// the one window; `train` and `bench suite` cut the whole trace into
/// windows of LEN_H and take no START_H.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceWindow {
    pub start_h: Option<f64>,
    pub len_h: f64,
}

impl std::str::FromStr for TraceWindow {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let hours = |x: &str| {
            x.trim()
                .parse::<f64>()
                .ok()
                .filter(|h| h.is_finite() && *h >= 0.0)
                .ok_or_else(|| format!("`{x}` is not a number of hours >= 0"))
        };
        let (start_h, len_h) = match s.split_once(',') {
            Some((a, b)) => (Some(hours(a)?), hours(b)?),
            None => (None, hours(s)?),
        };
        if len_h <= 0.0 {
            return Err(format!("`{s}`: LEN_H must be > 0 hours"));
        }
        Ok(TraceWindow { start_h, len_h })
    }
}

impl TraceWindow {
    /// The window length, refusing a START_H (for commands that cut the
    /// whole trace into windows).
    pub fn length_only(&self, command: &str) -> Result<f64> {
        match self.start_h {
            None => Ok(self.len_h),
            Some(_) => anyhow::bail!(
                "--trace-window: {command} cuts the whole trace into windows of LEN_H hours; give LEN_H alone"
            ),
        }
    }
}

/// `--slurm-like[=SPEC]` as the simulator's setting (`simulate`, `bench
/// suite`).
pub fn slurm_like(spec: Option<&str>) -> Result<Option<crate::sim::SlurmLike>> {
    spec.map(|s| {
        s.parse()
            .map_err(|e: String| anyhow::anyhow!("--slurm-like={s}: {e}"))
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_window_is_a_length_with_an_optional_start() {
        let w: TraceWindow = "24".parse().unwrap();
        assert_eq!((w.start_h, w.len_h), (None, 24.0));
        assert_eq!(w.length_only("train").unwrap(), 24.0);
        let w: TraceWindow = "6,12".parse().unwrap();
        assert_eq!((w.start_h, w.len_h), (Some(6.0), 12.0));
        assert!(w.length_only("train").is_err());
        for bad in ["0", "x", "1,0", "-1,3", "1,2,3"] {
            assert!(bad.parse::<TraceWindow>().is_err(), "{bad}");
        }
    }

    #[test]
    fn policies_merge_both_spellings_or_take_the_default() {
        let p = PolicyArgs {
            policy: vec!["greedy:window=60,init=1".into()],
            policies: vec!["none".into(), "static:7".into()],
        };
        assert_eq!(
            p.or(&["x"]),
            ["greedy:window=60,init=1", "none", "static:7"]
        );
        assert_eq!(PolicyArgs::default().or(&["greedy"]), ["greedy"]);
    }
}
