//! `smartmig release JOBID` and `smartmig reconcile`: the two repairs an
//! admin makes by hand when Slurm and smartmigd disagree (a job's instance
//! still held after the job ended). Both are write requests: smartmigd
//! accepts them from root and its configured `slurm_user` only.

use std::time::{Duration, Instant};

use anyhow::Context;

use super::socket::SocketArgs;
use crate::daemon::{Client, ClientError, ErrorKind};

#[derive(Debug, clap::Args)]
pub struct ReleaseArgs {
    /// The Slurm job id whose instance(s) to release. smartmigd refuses a
    /// job Slurm shows running or ending (its processes may still use the
    /// instance); its epilog releases it when it ends.
    pub job_id: u64,
    /// End the job first: `scancel JOBID`, then release once Slurm shows it
    /// ended (waits up to --wait seconds). Never frees the instance of a
    /// job Slurm still runs.
    #[arg(long)]
    pub force: bool,
    /// With --force: seconds to wait for Slurm to show the job ended.
    #[arg(long, default_value_t = 60, requires = "force")]
    pub wait: u64,
    /// With --force: the scancel to run.
    #[arg(long, default_value = "scancel", requires = "force")]
    pub scancel: String,
    #[command(flatten)]
    pub socket: SocketArgs,
}

#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub socket: SocketArgs,
}

fn client(args: &SocketArgs) -> anyhow::Result<Client> {
    Ok(Client::new(args.socket()?).with_io_timeout(Duration::from_secs(30)))
}

pub fn release(args: &ReleaseArgs) -> anyhow::Result<()> {
    let client = client(&args.socket)?;
    if args.force {
        cancel(args)?;
    }
    let deadline = Instant::now() + Duration::from_secs(if args.force { args.wait } else { 0 });
    let reply = loop {
        match client.release(args.job_id) {
            Err(ClientError::Daemon(b))
                if b.kind == ErrorKind::JobRunning && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(500));
            }
            other => break other,
        }
    }
    .with_context(|| format!("releasing job {}", args.job_id))?;
    match reply.released {
        0 => println!("job {} held no instance: nothing released", args.job_id),
        n => println!("job {}: {n} instance(s) released", args.job_id),
    }
    Ok(())
}

/// `--force`: cancels the job in Slurm (`scancel` reports an unknown or
/// ended job, which is fine: the release then goes ahead).
fn cancel(args: &ReleaseArgs) -> anyhow::Result<()> {
    let id = args.job_id.to_string();
    let out = std::process::Command::new(&args.scancel)
        .arg(&id)
        .output()
        .with_context(|| format!("running {} {id}", args.scancel))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && !stderr.contains("Invalid job id") {
        anyhow::bail!(
            "{} {id} failed ({}): {}; job {id}'s instance is kept",
            args.scancel,
            out.status,
            stderr.trim()
        );
    }
    println!("job {id}: cancelled in Slurm; releasing once Slurm shows it ended");
    Ok(())
}

pub fn reconcile(args: &ReconcileArgs) -> anyhow::Result<()> {
    let reply = client(&args.socket)?
        .reconcile()
        .context("reconciling with Slurm's queue")?;
    if reply.released_jobs.is_empty() {
        println!("every held instance belongs to a job Slurm still runs: nothing released");
    } else {
        let jobs: Vec<String> = reply.released_jobs.iter().map(u64::to_string).collect();
        println!("released the instances of ended jobs: {}", jobs.join(", "));
    }
    Ok(())
}
