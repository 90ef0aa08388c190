//! `smartmig advise report`: what dynamic mode would have changed on a node
//! smartmigd only watched (`mode = "advise"`). Reads the advice log, replays
//! the observed jobs through the simulator under the layout the site ran,
//! the policy and whole GPUs (`eval::advise`), prints the table
//! (`report::advise`) and writes the plots and, on request, JSON.
//! Everything is computed before anything is written, so bad input writes
//! nothing.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::socket::DEFAULT_CONFIG;
use crate::daemon::config::Config;
use crate::daemon::policy_choice;
use crate::daemon::usage::existing_with_rotated;
use crate::eval::advise::{self, ReplayConfig, Role};
use crate::formats::advice::{AdviceRecord, ADVICE_LOG};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Replay the observed jobs under the as-run layout, the policy and
    /// whole GPUs: energy, wait and tardiness side by side, with plots.
    Report(ReportArgs),
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// smartmigd's config: its state_dir holds the log (`advice.jsonl` and
    /// its rotated `advice.jsonl.1`), its `policy` and `epoch_s` drive the
    /// replay [default: /etc/smartmig/smartmig.toml].
    #[arg(long, conflicts_with = "log")]
    pub config: Option<PathBuf>,
    /// Read this advice log instead (no config: the policy is --policy,
    /// else the one the log's advice names, else greedy; epochs of 60 s).
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Only jobs submitted within this long (e.g. 7d, 12h, 1w).
    #[arg(long, value_parser = super::usage::parse_since)]
    pub since: Option<u64>,
    /// The policy to replay instead of the config's (`greedy`, `none`,
    /// `static:4444|3333`, `policy:FILE.onnx`, ...).
    #[arg(long)]
    pub policy: Option<String>,
    /// Also draw the SVG plots into this directory (created if missing).
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    #[command(flatten)]
    pub json: super::args::JsonArg,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.command {
        Command::Report(a) => report(a),
    }
}

/// Where the records come from and what the daemon was configured with.
struct Source {
    logs: Vec<PathBuf>,
    policy: Option<String>,
    epoch_s: f64,
}

fn source(args: &ReportArgs) -> anyhow::Result<Source> {
    if let Some(log) = &args.log {
        if !log.exists() {
            bail!("no advice log at {}", log.display());
        }
        return Ok(Source {
            logs: vec![log.clone()],
            policy: None,
            epoch_s: ReplayConfig::default().epoch_s,
        });
    }
    let path = args
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
    let config = Config::load(&path)
        .with_context(|| format!("reading smartmigd's config {}", path.display()))?;
    let logs = existing_with_rotated(&config.state_dir.join(ADVICE_LOG));
    if logs.is_empty() {
        bail!(
            "no advice log in {} (smartmigd writes {ADVICE_LOG} there with mode = \"advise\"; \
             give --log PATH or another --config)",
            config.state_dir.display()
        );
    }
    Ok(Source {
        logs,
        policy: Some(config.policy.clone()),
        epoch_s: config.epoch_s as f64,
    })
}

fn read_log(path: &Path) -> anyhow::Result<Vec<AdviceRecord>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    advise::parse_log(&text).with_context(|| path.display().to_string())
}

fn report(args: &ReportArgs) -> anyhow::Result<()> {
    let src = source(args)?;
    let mut records = Vec::new();
    for p in &src.logs {
        records.extend(read_log(p)?);
    }
    let names: Vec<String> = src.logs.iter().map(|p| p.display().to_string()).collect();
    let now = super::clock::unix_now();
    let since = args.since.map(|s| now.saturating_sub(s) as f64);
    let obs = advise::observe(&records, since).with_context(|| names.join(", "))?;
    let spec = args
        .policy
        .clone()
        .or(src.policy)
        // A name such as `greedy (fallback: policy:... unavailable)` is
        // what smartmigd ran: its first word.
        .or_else(|| {
            obs.advice
                .policies
                .last()
                .and_then(|p| p.split_whitespace().next().map(str::to_string))
        })
        .unwrap_or_else(|| "greedy".to_string());
    let (mut policy, built) =
        policy_choice::build(&spec, &obs.cluster()).with_context(|| format!("policy `{spec}`"))?;
    let cfg = ReplayConfig {
        epoch_s: src.epoch_s,
        ..ReplayConfig::default()
    };
    let mut r = advise::replay(&obs, policy.as_mut(), &cfg)?;
    if let Some(row) = r.rows.iter_mut().find(|row| row.role == Role::Policy) {
        if built != row.name {
            row.description = format!("{built}: {}", row.description);
        }
    }
    // Everything is computed before anything is written.
    let bin_s = (obs.span_s() / 200.0).max(60.0);
    let plots = crate::report::advise::plots(&r, bin_s)?;
    let period = format!(
        "{} to {} from {}",
        super::clock::local_time(obs.origin as u64),
        super::clock::local_time(obs.end as u64),
        names.join(", ")
    );
    let mut out = args.json.table();
    write!(out, "{}", crate::report::advise::table(&r, &period))?;
    if let Some(row) = r.rows.iter().find(|row| row.role == Role::Policy) {
        if built != row.name {
            writeln!(out, "Policy: {built}.")?;
        }
    }
    let mut written = Vec::new();
    if let Some(dir) = &args.plots {
        for p in super::write_files(dir, plots)? {
            written.push(p.display().to_string());
        }
    }
    args.json.write(&r)?;
    if let Some(path) = args.json.json.as_ref().filter(|_| !args.json.to_stdout()) {
        written.push(path.display().to_string());
    }
    if !written.is_empty() {
        writeln!(out, "Wrote {}", written.join(", "))?;
    }
    Ok(())
}
