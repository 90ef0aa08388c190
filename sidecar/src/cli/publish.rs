//! `smartmig publish`: the cluster summary's publisher (issue 23;
//! docs/architecture.md, "Cluster scale"). Reads the queue (`squeue
//! --json`) and the nodes (`sinfo --json`) once per epoch for the whole
//! cluster and writes each smartmig node's share,
//! `<dir>/<node>.json` ([`crate::daemon::summary`]), which the nodes read
//! instead of asking Slurm. Run one, on the controller or any host with
//! the Slurm client, with `--dir` on a file system the nodes mount.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::daemon::config::SlurmConfig;
use crate::daemon::fsutil::{atomic_write_mode, ensure_dir};
use crate::daemon::slurm::{CommandSlurm, SlurmClient};
use crate::daemon::summary::{build, NodeSummary};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory to write `<node>.json` into; the nodes' `[cluster]
    /// summary_dir` (created 0755 if missing).
    #[arg(long)]
    pub dir: PathBuf,
    /// Seconds between reads of Slurm: the nodes' `epoch_s`.
    #[arg(long, default_value_t = 60)]
    pub epoch_s: u64,
    /// Read Slurm once, write the files and exit (a Slurm error is then
    /// the exit status).
    #[arg(long)]
    pub once: bool,
    /// Stop after this many epochs (default: until killed).
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Seconds a Slurm command may run.
    #[arg(long, default_value_t = 10)]
    pub command_timeout_s: u64,
}

/// What one epoch wrote.
struct Written {
    jobs: usize,
    nodes: usize,
    bytes: usize,
    claimed: usize,
}

/// A node name that is safe as a file name in `dir`.
fn file_of(dir: &Path, node: &str) -> Option<PathBuf> {
    let ok = !node.is_empty()
        && !node.starts_with('.')
        && node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    ok.then(|| dir.join(format!("{node}.json")))
}

fn epoch(slurm: &dyn SlurmClient, dir: &Path, epoch_s: u64) -> anyhow::Result<Written> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let queue = slurm.queue().context("reading the queue")?;
    let nodes = slurm.nodes().context("reading the nodes")?;
    let summaries: Vec<NodeSummary> = build(&queue, &nodes, now, epoch_s);
    if summaries.is_empty() {
        tracing::warn!(
            nodes = nodes.len(),
            "no node's GRES names shards or MIG devices (gres.conf, docs/slurm-integration.md §1): no summary to write"
        );
    }
    let mut bytes = 0;
    let mut claimed = 0;
    for s in &summaries {
        let Some(path) = file_of(dir, &s.node) else {
            tracing::warn!(node = %s.node, "node name is not a safe file name; no summary written");
            continue;
        };
        let text = serde_json::to_vec(s).context("encoding a summary")?;
        atomic_write_mode(&path, &text, 0o644)
            .with_context(|| format!("writing {}", path.display()))?;
        bytes += text.len();
        claimed += s.claimed();
    }
    Ok(Written {
        jobs: queue.jobs.len(),
        nodes: summaries.len(),
        bytes,
        claimed,
    })
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.epoch_s == 0 {
        bail!("--epoch-s must be at least 1");
    }
    if args.command_timeout_s == 0 {
        bail!("--command-timeout-s must be at least 1");
    }
    ensure_dir(&args.dir, 0o755).with_context(|| format!("creating {}", args.dir.display()))?;
    let defaults = SlurmConfig::default();
    let slurm = CommandSlurm {
        squeue: defaults.squeue,
        sinfo: defaults.sinfo,
        scontrol: defaults.scontrol,
        slurmd: defaults.slurmd,
        salloc: defaults.salloc,
        scancel: defaults.scancel,
        hold_partition: defaults.hold_partition,
        timeout: Duration::from_secs(args.command_timeout_s),
        release: Default::default(),
    };
    let mut done = 0u64;
    loop {
        let t0 = Instant::now();
        match epoch(&slurm, &args.dir, args.epoch_s) {
            Ok(w) => println!(
                "{} jobs, {} smartmig node(s), {} pending claimed: wrote {} file(s), {} bytes, in {} ms",
                w.jobs,
                w.nodes,
                w.claimed,
                w.nodes,
                w.bytes,
                t0.elapsed().as_millis()
            ),
            // The files go stale and the nodes fall back, as documented;
            // the publisher keeps trying.
            Err(e) if !args.once => eprintln!("smartmig publish: {e:#}; trying again next epoch"),
            Err(e) => return Err(e),
        }
        done += 1;
        if args.once || args.epochs.is_some_and(|n| done >= n) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(args.epoch_s).saturating_sub(t0.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::file_of;
    use std::path::Path;

    #[test]
    fn only_plain_node_names_become_files() {
        let d = Path::new("/x");
        assert_eq!(file_of(d, "gpu-01").unwrap(), Path::new("/x/gpu-01.json"));
        assert!(file_of(d, "../etc").is_none());
        assert!(file_of(d, ".hidden").is_none());
        assert!(file_of(d, "a/b").is_none());
        assert!(file_of(d, "").is_none());
    }
}
