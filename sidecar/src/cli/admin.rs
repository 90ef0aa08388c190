//! `smartmig release JOBID` and `smartmig reconcile`: the two repairs an
//! admin makes by hand when Slurm and smartmigd disagree (a job's instance
//! still held after the job ended). Both are write requests: smartmigd
//! accepts them from root and its configured `slurm_user` only.

use std::time::Duration;

use anyhow::Context;

use super::socket::SocketArgs;
use crate::daemon::Client;

#[derive(Debug, clap::Args)]
pub struct ReleaseArgs {
    /// The Slurm job id whose instance(s) to release.
    pub job_id: u64,
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
    let reply = client(&args.socket)?
        .release(args.job_id)
        .with_context(|| format!("releasing job {}", args.job_id))?;
    match reply.released {
        0 => println!("job {} held no instance: nothing released", args.job_id),
        n => println!("job {}: {n} instance(s) released", args.job_id),
    }
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
