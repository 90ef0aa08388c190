//! `smartmigd`: the per-node sidecar daemon. All logic lives in the
//! `smartmig-daemon` library; this file parses arguments, sets up logging
//! and the runtime, and maps errors to exit codes. It is a package of its
//! own so that the installed binary links no lab or trainer crate
//! (docs/architecture.md, "Workspace layout").

#![forbid(unsafe_code)]
// The house rule: no function over 100 lines (clippy counts the lines of code).
#![warn(clippy::too_many_lines)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use smartmig_daemon::{server, Config};

/// Dynamic MIG partitioning sidecar for Slurm nodes.
// `about` is spelled out: a bare `about` reads the package's description,
// and `--help` (packaged as smartmigd-help.txt) keeps the text it had when
// this binary was built in the `smartmig` package.
#[derive(Debug, Parser)]
#[command(
    name = "smartmigd",
    version,
    about = "Dynamic MIG partitioning for Slurm: the `smartmig` CLI and `smartmigd` binaries \
             over the smartmig crates, re-exported as one library"
)]
struct Args {
    /// Configuration file (see etc/smartmig.toml).
    #[arg(long, short, default_value = "/etc/smartmig/smartmig.toml")]
    config: PathBuf,
    /// Validate the configuration, print OK or the error, and exit.
    #[arg(long)]
    check_config: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("smartmigd: invalid configuration: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.check_config {
        for w in config.warnings() {
            eprintln!("smartmigd: warning: {w}");
        }
        println!("OK");
        return ExitCode::SUCCESS;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log_level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: journald and log files get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    match run(config, args.config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("smartmigd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(config: Config, path: PathBuf) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("smartmigd")
        .build()
        .context("starting the tokio runtime")?;
    runtime
        .block_on(server::run(config, path))
        .context("smartmigd stopped with an error")
}
