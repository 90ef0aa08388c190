//! End-to-end: the daemon's `placement = "edf"` on a real Slurm 22.05 node
//! (two fake GPUs of 7 shards, the SPANK plugin, smartmigd on the sim
//! backend with Slurm queries on).
//!
//! Slurm counts shards, MIG also counts memory: two 3-shard jobs (two
//! `3g.20gb`, all eight memory slots) leave Slurm one free shard that no
//! `1g` fits, and holds are off on this untyped node. A 1-shard job Slurm
//! puts there waits in smartmigd, which knows its `--deadline` from
//! `squeue`, and gets the slice when a neighbour ends. (Since memory
//! variants are billed the room they take (issue 55), one stranded shard
//! is the most Slurm can overcommit on an A100-40GB, so two jobs cannot
//! wait on one GPU here; which of two waiting jobs EDF serves first is
//! tested on the daemon, `daemon_placement::edf_serves_the_earlier_deadline_first`.)
//!
//! Needs root and a release build of the workspace (`scripts/test`).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use smartmig_suite::{holds_within, plugstack_line, Sidecar, SlurmCluster};

const TIMEOUT: Duration = Duration::from_secs(120);

/// A job body that runs until the test creates `go/<job id>`.
fn held(go: &Path) -> String {
    format!(
        "for i in $(seq 1200); do [ -e {}/$SLURM_JOB_ID ] && break; sleep 0.1; done",
        go.display()
    )
}

fn release(go: &Path, job: u32) {
    std::fs::write(go.join(job.to_string()), b"").expect("write go");
}

/// Job ids holding an instance, and the waiting ones with their deadlines.
fn holders(status: &Value) -> Vec<u64> {
    Sidecar::instances(status)
        .iter()
        .filter_map(|i| i.get("job_id").and_then(Value::as_u64))
        .collect()
}

fn waiting(status: &Value) -> Vec<(u64, Option<i64>)> {
    status
        .get("waiting")
        .and_then(Value::as_array)
        .map(|w| {
            w.iter()
                .filter_map(|j| {
                    Some((
                        j.get("job_id")?.as_u64()?,
                        j.get("deadline").and_then(Value::as_i64),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_job_on_a_stranded_shard_waits_with_its_deadline_and_gets_the_freed_room() {
    std::env::set_var("SMARTMIG_SLURM_SCHED_EXTRA", "sched_interval=2");
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, ""))
            .expect("write plugstack");
    });
    // The harness's plugin request timeout (40 s) stays above the wait.
    let sidecar = Sidecar::start_with_slurm(
        cluster.dir(),
        "epoch_s = 1\nallocate_wait_s = 30\nplacement = \"edf\"",
    );
    assert_eq!(sidecar.status()["placement"], "edf");
    let go = cluster.dir().join("go");
    std::fs::create_dir_all(&go).expect("mkdir go");
    let body = held(&go);
    // GPU 1 full, so every other job lands on GPU 0.
    let whole = cluster.sbatch_wrap(&["--gres=shard:7"], &body);
    assert!(
        holds_within(Duration::from_secs(60), || holders(&sidecar.status()).len()
            == 1),
        "the whole-GPU job has no instance: {:#}\n{}",
        sidecar.status(),
        cluster.log_tails()
    );
    // No time limits: smartmigd cannot know that the 3g jobs run past its
    // wait, so the job on the stranded shard waits (with limits that keep
    // them running, it is refused at once: docs/slurm-integration.md §9,
    // "Passes decided as a set").
    let three = ["--gres=shard:3"];
    let pair: Vec<u32> = (0..2).map(|_| cluster.sbatch_wrap(&three, &body)).collect();
    assert!(
        holds_within(Duration::from_secs(60), || holders(&sidecar.status()).len()
            == 3),
        "two 3g.20gb expected: {:#}\n{}",
        sidecar.status(),
        cluster.smartmigd_log()
    );
    // Slurm's last free shard of GPU 0, which MIG cannot build.
    let late = cluster.sbatch_wrap(
        &["--gres=shard:1", "--deadline=now+3hours"],
        &format!("echo late ran; {body}"),
    );
    assert!(
        holds_within(Duration::from_secs(20), || {
            let w = waiting(&sidecar.status());
            w.len() == 1 && w[0].0 == u64::from(late) && w[0].1.is_some()
        }),
        "job {late} should wait with its deadline: {:#}\n{}",
        sidecar.status(),
        cluster.smartmigd_log()
    );
    // A 3g ends within the wait: the room goes to the waiting job.
    release(&go, pair[0]);
    assert!(
        holds_within(Duration::from_secs(25), || holders(&sidecar.status())
            .contains(&u64::from(late))),
        "job {late} did not get the freed room: {:#}\n{}",
        sidecar.status(),
        cluster.smartmigd_log()
    );
    assert!(waiting(&sidecar.status()).is_empty());
    // Nothing is lost: the rest end, all complete.
    for &job in pair[1..].iter().chain([&whole, &late]) {
        release(&go, job);
    }
    for job in pair.iter().copied().chain([whole, late]) {
        cluster.assert_completed(job, TIMEOUT);
    }
    let out =
        std::fs::read_to_string(cluster.dir().join(format!("jobs-{late}.out"))).unwrap_or_default();
    assert!(out.contains("late ran"), "job {late}: {out}");
}
