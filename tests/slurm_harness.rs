//! Proves the single-node Slurm harness (`tests/slurm/cluster.sh`): a real
//! slurmctld + slurmd with two fake GPUs of 7 shards each run a batch job that
//! asks for 3 shards, and the job sees one GPU and its shard count.
//!
//! Needs root and the Debian packages `slurmctld slurmd slurm-client munge`
//! (`scripts/test` installs them). The SPANK plugin scenarios build on this.

use std::time::{Duration, Instant};

use smartmig_suite::SlurmCluster;

#[test]
fn shard_job_runs_on_one_gpu() {
    let started = Instant::now();
    let cluster = SlurmCluster::up();
    let up_time = started.elapsed();

    let out_file = cluster.dir().join("shard-job.out");
    let job = cluster.sbatch(&[
        "--gres=shard:3",
        "-o",
        out_file.to_str().expect("utf-8 temp path"),
        "--wrap",
        "echo CVD=$CUDA_VISIBLE_DEVICES SH=$SLURM_SHARDS_ON_NODE",
    ]);
    let state = cluster.wait_job(job, Duration::from_secs(60));
    let output = std::fs::read_to_string(&out_file).unwrap_or_default();
    assert_eq!(
        state,
        "COMPLETED",
        "job {job} ended {state}; output: {output:?}\n{}",
        cluster.log_tails()
    );

    let words: Vec<&str> = output.split_whitespace().collect();
    assert!(
        words.contains(&"SH=3"),
        "job output {output:?} lacks SH=3 (SLURM_SHARDS_ON_NODE)"
    );
    assert!(
        words.contains(&"CVD=0") || words.contains(&"CVD=1"),
        "job output {output:?} lacks CVD=0 or CVD=1 (CUDA_VISIBLE_DEVICES of one GPU)"
    );
    eprintln!(
        "cluster up in {up_time:?}, job {job} done after {:?} in total",
        started.elapsed()
    );
}
