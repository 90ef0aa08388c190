//! The `smartmig` command line: one module per subcommand, each a thin
//! shell (parse, read files, print) over the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use clap::{Parser, Subcommand};

#[cfg(feature = "daemon")]
pub mod admin;
#[cfg(feature = "daemon")]
pub mod advise;
pub mod args;
pub mod audit;
pub mod bench;
pub mod bench_coordination;
#[cfg(feature = "daemon")]
pub mod bench_daemon;
#[cfg(feature = "train")]
pub mod bench_oracle;
pub mod bench_placement;
#[cfg(feature = "train")]
pub mod bench_policy;
pub mod bench_suite;
pub mod bench_throughput;
pub mod bound;
#[cfg(feature = "daemon")]
pub mod clock;
#[cfg(feature = "daemon")]
pub mod doctor;
pub mod layouts;
pub mod learned;
pub mod oom;
#[cfg(feature = "daemon")]
pub mod plan;
#[cfg(feature = "train")]
pub mod policy_out;
#[cfg(feature = "daemon")]
pub mod publish;
pub mod simulate;
#[cfg(feature = "daemon")]
pub mod socket;
#[cfg(feature = "daemon")]
pub mod status;
#[cfg(feature = "train")]
pub mod train;
#[cfg(feature = "train")]
pub mod train_placement;
#[cfg(feature = "daemon")]
pub mod usage;

/// The `smartmig` command line.
#[derive(Debug, Parser)]
#[command(
    name = "smartmig",
    version,
    about = "Dynamic NVIDIA MIG partitioning for Slurm. On a node: the local smartmigd's \
             state, plans and repairs, and the node check. Anywhere, without a GPU: \
             simulation, lower bounds, benchmarks and training.",
    long_about = None
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands: the node's first, then the simulator's.
#[derive(Debug, Subcommand)]
pub enum Command {
    #[cfg(feature = "daemon")]
    /// Show the local smartmigd's GPUs, instances, jobs and policy.
    Status(status::Args),
    #[cfg(feature = "daemon")]
    /// The reconfigurations the policy wants (pending) and made (applied).
    Plan(plan::PlanArgs),
    #[cfg(feature = "daemon")]
    /// Carry out a pending plan (mode = "confirm"; root or slurm_user).
    Apply(plan::ApplyArgs),
    #[cfg(feature = "daemon")]
    /// Release a job's MIG instance(s) by hand (root or smartmigd's slurm_user).
    Release(admin::ReleaseArgs),
    #[cfg(feature = "daemon")]
    /// Release the instances of every job Slurm shows ended (root or slurm_user).
    Reconcile(admin::ReconcileArgs),
    #[cfg(feature = "daemon")]
    /// Slice-hours per user or account, from the node's usage log or sacct.
    Usage(usage::Args),
    #[cfg(feature = "daemon")]
    /// Check a node before enabling the plugin: config, NVML, Slurm, plugin, daemon, policy (read-only).
    Doctor(doctor::Args),
    #[cfg(feature = "daemon")]
    /// Advise mode (`mode = "advise"`): what the policy would have changed
    /// on a node smartmigd only watched (`advise report`).
    Advise(advise::Args),
    #[cfg(feature = "daemon")]
    /// Read Slurm once per epoch for the whole cluster and write each node's summary (run one, e.g. on the controller).
    Publish(publish::Args),
    /// List the MIG layouts of a GPU model.
    Layouts(layouts::Args),
    /// Simulate a cluster day or a trace under a job placement and a
    /// repartitioning policy (`--compare`: every policy side by side).
    Simulate(simulate::Args),
    /// Re-check a simulator event log (feasibility, energy, tardiness).
    Audit(audit::Args),
    /// Lower bounds on energy and tardiness of a workload (the gap every comparison reports).
    Bound(bound::Args),
    /// Benchmarks and studies: the yardstick (`suite`), the simulator's
    /// speed, the learned policy and placement, throughput, coordination,
    /// the daemon's latency.
    Bench(bench::Args),
    #[cfg(feature = "train")]
    /// Train the learned repartitioning policy or job placement on the simulator (writes ONNX + metadata).
    Train(train::Args),
}

/// Entry point of the `smartmig` binary.
pub fn main() -> ExitCode {
    init_tracing();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Layouts(args) => layouts::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Audit(args) => audit::run(&args),
        Command::Bench(args) => bench::run(&args),
        #[cfg(feature = "daemon")]
        Command::Status(args) => status::run(&args),
        #[cfg(feature = "daemon")]
        Command::Release(args) => admin::release(&args),
        #[cfg(feature = "daemon")]
        Command::Reconcile(args) => admin::reconcile(&args),
        #[cfg(feature = "train")]
        Command::Train(args) => train::run(&args),
        Command::Bound(args) => bound::run(&args),
        #[cfg(feature = "daemon")]
        Command::Doctor(args) => doctor::run(&args),
        #[cfg(feature = "daemon")]
        Command::Usage(args) => usage::run(&args),
        #[cfg(feature = "daemon")]
        Command::Plan(args) => plan::plan(&args),
        #[cfg(feature = "daemon")]
        Command::Apply(args) => plan::apply(&args),
        #[cfg(feature = "daemon")]
        Command::Publish(args) => publish::run(&args),
        #[cfg(feature = "daemon")]
        Command::Advise(args) => advise::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A closed stdout (`smartmig layouts | head`) is the reader's
        // choice, not an error worth reporting.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("smartmig: error: {}", chain_message(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by ": ", skipping a cause whose text
/// the message already ends with (library errors that wrap a source often
/// quote it, e.g. `simulation: {0}`, and `{:#}` would print it twice).
pub fn chain_message(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if out.is_empty() {
            out = text;
        } else if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            || cause
                .downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == Some(std::io::ErrorKind::BrokenPipe)
    })
}

/// Logs go to stderr, filtered by `RUST_LOG` (default: warnings).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Writes rendered files (`(file name, contents)`, e.g. a report's plots)
/// into `dir`, created if missing. Returns the paths written.
pub fn write_files(dir: &Path, files: Vec<(String, String)>) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::with_capacity(files.len());
    for (name, text) in files {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        written.push(p);
    }
    Ok(written)
}

// The example error is the trainer's.
#[cfg(all(test, feature = "train"))]
mod tests {
    use super::*;

    #[test]
    fn chain_message_quotes_each_cause_once() {
        let inner = crate::sim::SimError::NoGpus;
        let err = anyhow::Error::new(crate::learn::LearnError::Sim(inner)).context("bench oracle");
        assert_eq!(
            chain_message(&err),
            "bench oracle: simulation: the cluster has no GPUs"
        );
        let plain = anyhow::anyhow!("outer").context("ctx");
        assert_eq!(chain_message(&plain), "ctx: outer");
    }
}
