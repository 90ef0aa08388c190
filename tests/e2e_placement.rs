//! End-to-end: the daemon's `placement = "edf"` on a real Slurm 22.05 node
//! (two fake GPUs of 7 shards, the SPANK plugin, smartmigd on the sim
//! backend with Slurm queries on).
//!
//! Slurm counts shards, MIG also counts memory: five 1-shard jobs that
//! each ask `--mig-mem=8` (a 1g.10gb, two of the GPU's eight memory
//! slots) fit Slurm's seven shards but only four fit the GPU. The fifth
//! and sixth wait in smartmigd. When a slice frees, the one with the
//! earlier `--deadline` gets it, although it started later.
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
fn edf_gives_freed_room_to_the_earlier_deadline() {
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
    let small = ["--gres=shard:1", "--mig-mem=8", "-t", "10"];
    let four: Vec<u32> = (0..4).map(|_| cluster.sbatch_wrap(&small, &body)).collect();
    assert!(
        holds_within(Duration::from_secs(60), || holders(&sidecar.status()).len()
            == 5),
        "four 1g.10gb expected: {:#}\n{}",
        sidecar.status(),
        cluster.smartmigd_log()
    );
    // Started first, deadline in three hours; then one in one hour.
    let late = cluster.sbatch_wrap(
        &[&small[..], &["--deadline=now+3hours"]].concat(),
        &format!("echo late ran; {body}"),
    );
    assert!(
        holds_within(Duration::from_secs(60), || waiting(&sidecar.status()).len()
            == 1),
        "the late job does not wait: {:#}\n{}",
        sidecar.status(),
        cluster.smartmigd_log()
    );
    let soon = cluster.sbatch_wrap(
        &[&small[..], &["--deadline=now+1hour"]].concat(),
        &format!("echo soon ran; {body}"),
    );
    // Both wait, and smartmigd knows both deadlines (from squeue).
    assert!(
        holds_within(Duration::from_secs(60), || {
            let w = waiting(&sidecar.status());
            w.len() == 2 && w.iter().all(|(_, d)| d.is_some())
        }),
        "both should wait with their deadlines: {:#}\n{}",
        sidecar.status(),
        cluster.smartmigd_log()
    );
    let w = waiting(&sidecar.status());
    let deadline = |job: u32| {
        w.iter()
            .find(|(j, _)| *j == u64::from(job))
            .and_then(|(_, d)| *d)
    };
    assert!(deadline(soon) < deadline(late), "{w:?}");
    // One 1g.10gb ends: the room goes to the earlier deadline.
    release(&go, four[0]);
    assert!(
        holds_within(Duration::from_secs(60), || holders(&sidecar.status())
            .contains(&u64::from(soon))),
        "job {soon} (earlier deadline) did not get the freed slice: {:#}\n{}",
        sidecar.status(),
        cluster.smartmigd_log()
    );
    let s = sidecar.status();
    assert!(!holders(&s).contains(&u64::from(late)), "{s:#}");
    assert_eq!(
        waiting(&s).iter().map(|(j, _)| *j).collect::<Vec<_>>(),
        [u64::from(late)]
    );
    // Nothing is lost: the rest end, the late job gets its slice, all complete.
    for &job in four[1..].iter().chain([&whole, &late, &soon]) {
        release(&go, job);
    }
    for job in four.iter().copied().chain([whole, late, soon]) {
        cluster.assert_completed(job, TIMEOUT);
    }
    for (job, says) in [(late, "late ran"), (soon, "soon ran")] {
        let out = std::fs::read_to_string(cluster.dir().join(format!("jobs-{job}.out")))
            .unwrap_or_default();
        assert!(out.contains(says), "job {job}: {out}");
    }
}
