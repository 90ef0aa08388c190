//! `smartmig usage`: slice-hours per user or account, from the node's usage
//! log (default) or from Slurm's accounting (`--sacct`, the `smartmig:`
//! word smartmigd writes into each job's `AdminComment`). Read-only; the
//! sums are `daemon::usage::summarise`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use super::socket::DEFAULT_CONFIG;
use crate::daemon::config::Config;
use crate::daemon::usage::{
    existing_with_rotated, records_from_sacct, summarise, GroupBy, UsageLine, UsageRecord,
    SACCT_FIELDS, USAGE_LOG,
};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum By {
    User,
    Account,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Group by user or by Slurm account.
    #[arg(long, value_enum, default_value = "user")]
    pub by: By,
    /// Only jobs that ended within this long (e.g. 7d, 12h, 1w).
    #[arg(long, value_parser = parse_since)]
    pub since: Option<u64>,
    /// Read Slurm's accounting (`sacct -a -X`, needs slurmdbd) instead of
    /// this node's usage log: every node's jobs, but no peak memory.
    #[arg(long, conflicts_with = "log")]
    pub sacct: bool,
    /// The usage log(s) to read (default: `usage.jsonl` and `usage.jsonl.1`
    /// in the state_dir of --config).
    #[arg(long)]
    pub log: Vec<PathBuf>,
    /// smartmigd's config file, read for its state_dir.
    #[arg(long, default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    #[command(flatten)]
    pub json: super::args::JsonArg,
}

/// Seconds in a duration such as `7d`, `12h` or `1w` (days of 24 h).
pub(super) fn parse_since(text: &str) -> Result<u64, String> {
    let span: jiff::Span = text
        .parse()
        .map_err(|e| format!("`{text}` is not a duration like 7d, 12h or 1w ({e})"))?;
    let secs = span
        .total((
            jiff::Unit::Second,
            jiff::SpanRelativeTo::days_are_24_hours(),
        ))
        .map_err(|e| format!("`{text}`: {e}"))?;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("`{text}`: must be a positive duration"));
    }
    Ok(secs as u64)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let now = super::clock::unix_now();
    let since = args.since.map_or(0, |s| now.saturating_sub(s));
    let (records, source) = if args.sacct {
        (read_sacct(args.since)?, "sacct (AdminComment)".to_string())
    } else {
        let logs = logs(args)?;
        let mut records = Vec::new();
        for p in &logs {
            records.extend(read_log(p)?);
        }
        let names: Vec<String> = logs.iter().map(|p| p.display().to_string()).collect();
        (records, names.join(", "))
    };
    let by = match args.by {
        By::User => GroupBy::User,
        By::Account => GroupBy::Account,
    };
    let lines = summarise(&records, by, since);
    if !args.json.to_stdout() {
        print!("{}", render(&lines, args.by, &source));
    }
    args.json.write(&lines)
}

/// The usage logs to read: `--log`, else the config's state_dir (the
/// rotated file first, so records stay in time order).
fn logs(args: &Args) -> anyhow::Result<Vec<PathBuf>> {
    if !args.log.is_empty() {
        return Ok(args.log.clone());
    }
    let state_dir = if args.config == Path::new(DEFAULT_CONFIG) && !args.config.exists() {
        Config::default().state_dir
    } else {
        Config::load(&args.config)
            .with_context(|| format!("reading the state_dir from {}", args.config.display()))?
            .state_dir
    };
    let log = state_dir.join(USAGE_LOG);
    let out = existing_with_rotated(&log);
    if out.is_empty() {
        // A user who may not look into state_dir (0700, root's) is told so,
        // not that there is no log.
        if let Err(e) = std::fs::metadata(&log) {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                bail!(
                    "cannot read {}: {e} (the usage log names every user's jobs, so only root \
                     reads it: run `smartmig usage` as root, or `smartmig usage --sacct` for \
                     what Slurm's accounting shows you)",
                    log.display()
                );
            }
        }
        bail!(
            "no usage log in {} (smartmigd writes {USAGE_LOG} there when jobs release their instances; \
             give --log PATH or --config)",
            state_dir.display()
        );
    }
    Ok(out)
}

/// The records of one usage log; a line that does not parse is an error
/// naming the file and line (the log is the daemon's, so it means damage).
fn read_log(path: &Path) -> anyhow::Result<Vec<UsageRecord>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{} line {}: not a usage record", path.display(), i + 1))
        })
        .collect()
}

fn read_sacct(since: Option<u64>) -> anyhow::Result<Vec<UsageRecord>> {
    let start = match since {
        Some(s) => format!("now-{s}seconds"),
        None => "1970-01-01".to_string(),
    };
    let out = Command::new("sacct")
        .args(["-a", "-X", "-n", "-P", "-o", SACCT_FIELDS, "-S", &start])
        .env("SLURM_TIME_FORMAT", "%s")
        .output()
        .context("running sacct")?;
    if !out.status.success() {
        bail!(
            "sacct failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(records_from_sacct(&String::from_utf8_lossy(&out.stdout)))
}

fn render(lines: &[UsageLine], by: By, source: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Slice usage from {source}");
    if lines.is_empty() {
        let _ = writeln!(out, "  (no jobs)");
        return out;
    }
    let who = match by {
        By::User => "USER",
        By::Account => "ACCOUNT",
    };
    let _ = writeln!(
        out,
        "{who:<16} {:>6} {:>12} {:>9} {:>9}  PROFILES",
        "JOBS", "SLICE-HOURS", "MEAN WAIT", "MAX PEAK"
    );
    for l in lines {
        let peak = l
            .max_peak_gb
            .map_or_else(|| "-".to_string(), |p| format!("{p:.1} GB"));
        let profiles: Vec<String> = l.profiles.iter().map(|(p, n)| format!("{p}×{n}")).collect();
        let _ = writeln!(
            out,
            "{:<16} {:>6} {:>12.2} {:>8.0}s {:>9}  {}",
            l.who,
            l.jobs,
            l.slice_hours,
            l.mean_wait_s,
            peak,
            profiles.join(" ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_days_hours_and_weeks_and_refuses_the_rest() {
        assert_eq!(parse_since("7d"), Ok(7 * 86_400));
        assert_eq!(parse_since("12h"), Ok(12 * 3600));
        assert_eq!(parse_since("1w"), Ok(7 * 86_400));
        let e = parse_since("soon").unwrap_err();
        assert!(e.contains("soon"), "{e}");
        assert!(parse_since("0h").is_err());
    }

    #[test]
    fn a_damaged_log_line_is_named() {
        let dir = std::env::temp_dir().join(format!("smartmig-usage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("usage.jsonl");
        std::fs::write(&p, "{\"job_id\":1}\n").unwrap();
        let e = format!("{:#}", read_log(&p).unwrap_err());
        assert!(e.contains("line 1: not a usage record"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_table_names_its_source_and_profiles() {
        let line = UsageLine {
            who: "alice".into(),
            jobs: 2,
            slice_hours: 1.5,
            mean_wait_s: 3.0,
            profiles: [("1g.10gb".to_string(), 2)].into_iter().collect(),
            max_peak_gb: Some(6.0),
        };
        let t = render(&[line], By::User, "usage.jsonl");
        assert!(t.starts_with("Slice usage from usage.jsonl\n"), "{t}");
        assert!(
            t.contains("alice")
                && t.contains("1.50")
                && t.contains("1g.10gb×2")
                && t.contains("6.0 GB"),
            "{t}"
        );
    }
}
