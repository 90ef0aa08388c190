//! Job start overhead (issue 17): the time the SPANK plugin adds to a job
//! start, from entering `init_post_opt` to the sidecar's reply, over 200
//! `--gres=shard:7` jobs (two start at a time) and 200 `--gres=shard:1`
//! jobs (up to 14 at a time) on the real-Slurm test cluster (sim backend,
//! the journal on a tmpfs as in the shipped config).
//!
//! The plugin logs that time with every allocation (`smartmig took X ms`
//! in slurmd.log). This test submits the jobs, reads the lines back and
//! prints p50 and p99, over all starts and over the starts that found
//! their instance already there (`Reused`), and writes them as JSON
//! (`$SMARTMIG_JOB_START_JSON`, default `target/tmp/job-start.json`). It asserts what
//! must hold whatever the machine's speed: every job completed, got an
//! instance and logged its time. The figures are a measurement recorded in
//! docs/daemon.md, not a threshold (timings belong in benchmarks).
//!
//! Needs root and a release build of the workspace (`scripts/test` does
//! both); fails, never skips, when Slurm or smartmigd cannot start.

use std::collections::BTreeMap;
use std::time::Duration;

use smartmig_suite::{plugstack_line, Sidecar, SlurmCluster};

const JOBS: usize = 200;

/// `(job id, action, ms)` of every "smartmig took" line of slurmd.log.
fn start_times(log: &str) -> BTreeMap<u32, (String, f64)> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        let Some(rest) = line.split("smartmig: job ").nth(1) else {
            continue;
        };
        let Some((_, took)) = rest.split_once("smartmig took ") else {
            continue;
        };
        let job: Option<u32> = rest.split_whitespace().next().and_then(|j| j.parse().ok());
        let ms: Option<f64> = took.split_whitespace().next().and_then(|m| m.parse().ok());
        let action = ["Existing", "Reused", "Created", "Reshaped"]
            .into_iter()
            .find(|a| rest.contains(&format!(", {a},")))
            .unwrap_or("?");
        if let (Some(job), Some(ms)) = (job, ms) {
            out.insert(job, (action.to_string(), ms));
        }
    }
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs `JOBS` jobs of `--gres=shard:K` (submitted held, released together
/// so that the starts do not compete with 200 sbatch processes) and returns
/// the logged start times of all of them and of those that reused an
/// instance, sorted.
fn measure(cluster: &SlurmCluster, k: u32) -> (Vec<f64>, Vec<f64>) {
    let out = cluster.shared_dir();
    let gres = format!("--gres=shard:{k}");
    let jobs: Vec<u32> = (0..JOBS)
        .map(|i| {
            cluster.sbatch_as_job_user(
                &out.join(format!("start-{k}-{i}.out")),
                &[&gres, "--hold"],
                "true",
            )
        })
        .collect();
    let ids: Vec<String> = jobs.iter().map(u32::to_string).collect();
    let released = cluster
        .command("scontrol")
        .args(["release", &ids.join(",")])
        .output()
        .expect("run scontrol release");
    assert!(released.status.success(), "scontrol release: {released:?}");
    for &job in &jobs {
        let state = cluster.wait_job(job, Duration::from_secs(300));
        assert_eq!(state, "COMPLETED", "job {job} ended {state}");
    }
    let log =
        std::fs::read_to_string(cluster.dir().join("log/slurmd.log")).expect("read slurmd.log");
    let times = start_times(&log);
    let missing: Vec<u32> = jobs
        .iter()
        .copied()
        .filter(|j| !times.contains_key(j))
        .collect();
    assert!(
        missing.is_empty(),
        "jobs without a start time in slurmd.log: {missing:?}"
    );
    let mut all: Vec<f64> = jobs.iter().map(|j| times[j].1).collect();
    let mut reused: Vec<f64> = jobs
        .iter()
        .filter(|j| times[j].0 == "Reused")
        .map(|j| times[j].1)
        .collect();
    all.sort_by(f64::total_cmp);
    reused.sort_by(f64::total_cmp);
    assert!(all.iter().all(|&t| t > 0.0));
    (all, reused)
}

fn stats(v: &[f64]) -> serde_json::Value {
    serde_json::json!({
        "n": v.len(),
        "p50_ms": v.first().map(|_| percentile(v, 0.5)),
        "p99_ms": v.first().map(|_| percentile(v, 0.99)),
        "max_ms": v.last(),
    })
}

#[test]
fn plugin_start_overhead_over_200_jobs() {
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, ""))
            .expect("write plugstack");
    });
    let journal = std::path::PathBuf::from(format!("/dev/shm/smartmig-e2e-{}", std::process::id()));
    let _sidecar = Sidecar::start(
        cluster.dir(),
        &format!("journal_dir = \"{}\"", journal.join("journal").display()),
    );
    // shard:7 holds a whole GPU: 2 starts at a time on the 2 GPUs; shard:1:
    // up to 14 at a time, all competing for this machine's cores.
    let mut report = serde_json::Map::new();
    println!("job start overhead of the plugin (init_post_opt -> sidecar reply), ms");
    println!(
        "{:<16} {:>5} {:>9} {:>9} {:>9}",
        "starts", "n", "p50", "p99", "max"
    );
    for k in [7u32, 1] {
        let (all, reused) = measure(&cluster, k);
        for (name, v) in [("all", &all), ("reused", &reused)] {
            let label = format!("shard:{k} {name}");
            if let Some(max) = v.last() {
                println!(
                    "{label:<16} {:>5} {:>9.2} {:>9.2} {:>9.2}",
                    v.len(),
                    percentile(v, 0.5),
                    percentile(v, 0.99),
                    max
                );
            } else {
                println!("{label:<16} {:>5}", 0);
            }
            report.insert(label, stats(v));
        }
    }
    let path = std::env::var("SMARTMIG_JOB_START_JSON")
        .unwrap_or_else(|_| format!("{}/job-start.json", env!("CARGO_TARGET_TMPDIR")));
    std::fs::write(&path, serde_json::to_vec_pretty(&report).expect("json")).expect("write json");
    println!("wrote {path}");
    let _ = std::fs::remove_dir_all(&journal);
}
