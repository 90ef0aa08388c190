//! End-to-end: Slurm and the sidecar agree on a busy node (issue 13).
//!
//! Each test drives a real single-node Slurm 22.05 (two fake GPUs of 7
//! shards), the SPANK plugin and smartmigd (sim backend, Slurm queries on)
//! into a state that used to break the node:
//!
//! - a queue whose `squeue --json` outgrows the 64 KiB pipe buffer, with a
//!   plugin whose job epilog never runs (slurmd started before the plugin
//!   was listed): the reaper still frees ended jobs' instances within
//!   seconds, and the daemon says the epilog is missing;
//! - smartmigd down: the node is drained (not idle and failing every job),
//!   the jobs are requeued, and they all complete once smartmigd is back
//!   and has resumed the node; each requeued job is told why (issue 56) in
//!   its `AdminComment` and in its next run's output;
//! - 3+3+1 shards on one GPU (MIG cannot build the 1 next to two 3g
//!   instances): the third job is requeued, not failed, and completes.
//!
//! Needs root and a release build of the workspace (`scripts/test`).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use smartmig_suite::{holds_within, plugstack_line, Sidecar, SlurmCluster, FINAL_JOB_STATES};

const TIMEOUT: Duration = Duration::from_secs(120);

/// A cluster with a short requeue delay (Slurm holds a job requeued while it runs for
/// cred_expire + 1 s) and a scheduler that looks at the queue every 2 s.
fn cluster(plugin_extra: &str) -> SlurmCluster {
    smartmig_suite::quick_requeues();
    let extra = plugin_extra.to_string();
    SlurmCluster::up_with(move |dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, &extra))
            .expect("write plugstack");
    })
}

/// Fills the node: a whole-GPU job on one GPU, two 3-shard jobs (3g
/// instances, the two memory halves) on the other, each running until the
/// test creates `go/<its job id>`. Returns their ids once all three hold
/// their instances.
fn fill_with_held_jobs(cluster: &SlurmCluster, sidecar: &Sidecar, go: &Path) -> [u32; 3] {
    std::fs::create_dir_all(go).expect("mkdir go");
    let held = format!(
        "for i in $(seq 900); do [ -e {}/$SLURM_JOB_ID ] && break; sleep 0.1; done",
        go.display()
    );
    let jobs = [7, 3, 3].map(|k| cluster.sbatch_wrap(&[&format!("--gres=shard:{k}")], &held));
    assert!(
        holds_within(Duration::from_secs(60), || busy(&sidecar.status()).len()
            == 3),
        "three instances expected: {:#}\n{}",
        sidecar.status(),
        cluster.log_tails()
    );
    jobs
}

/// Instances of a status reply that a job holds.
fn busy(status: &Value) -> Vec<Value> {
    Sidecar::instances(status)
        .into_iter()
        .filter(|i| i.get("job_id").is_some_and(|j| !j.is_null()))
        .collect()
}

/// 200 held jobs make `squeue --json` about 650 KB, ten times the pipe
/// buffer. The plugin is listed only after slurmd started, so its job
/// epilog never runs: only the reaper can free an ended job's instance.
/// Before the fix, squeue blocked on its full pipe, every queue read timed
/// out after 10 s and the second whole-GPU job failed on the first one's
/// leaked instance.
#[test]
fn big_queue_and_no_epilog_still_free_instances() {
    smartmig_suite::quick_requeues();
    let cluster = SlurmCluster::up();
    // Listed now, after slurmd started: steps use it, the epilog does not.
    std::fs::write(
        cluster.dir().join("plugstack.conf"),
        plugstack_line(cluster.dir(), ""),
    )
    .expect("write plugstack");
    let sidecar = Sidecar::start_with_slurm(cluster.dir(), "epoch_s = 1\nallocate_wait_s = 20");
    // 200 held jobs, submitted by one shell to keep it quick.
    let out = cluster
        .command("bash")
        .arg("-c")
        .arg(
            "for i in $(seq 200); do sbatch -H -o /dev/null --wrap true >/dev/null || exit 1; done",
        )
        .output()
        .expect("submit held jobs");
    assert!(out.status.success(), "{out:?}");
    let squeue = cluster
        .command("squeue")
        .arg("--json")
        .output()
        .expect("squeue --json");
    assert!(
        squeue.stdout.len() > 512 * 1024,
        "expected a large queue, got {} bytes",
        squeue.stdout.len()
    );

    // Two whole-GPU jobs in a row on the same GPUs: the second needs the
    // first one's instances back, which only the reaper can give.
    for round in 0..2 {
        let a = cluster.sbatch_wrap(&["--gres=shard:7"], "sleep 1");
        let b = cluster.sbatch_wrap(&["--gres=shard:7"], "sleep 1");
        for job in [a, b] {
            let state = cluster.wait_job(job, TIMEOUT);
            assert_eq!(
                state,
                "COMPLETED",
                "round {round}, job {job}\n{}\n{}",
                std::fs::read_to_string(cluster.dir().join(format!("jobs-{job}.out")))
                    .unwrap_or_default(),
                cluster.log_tails()
            );
        }
        assert!(
            holds_within(Duration::from_secs(15), || busy(&sidecar.status())
                .is_empty()),
            "round {round}: the reaper did not free the ended jobs' instances: {:#}\n{}",
            sidecar.status(),
            cluster.smartmigd_log()
        );
    }
    let log = cluster.smartmigd_log();
    assert!(
        !log.contains("took more than"),
        "a Slurm query timed out:\n{log}"
    );
    assert!(
        log.contains("no release ever came from the SPANK plugin's job_epilog"),
        "the missing epilog went unnoticed:\n{log}"
    );
    let status = sidecar.status();
    assert_eq!(status["epilog_missing"], Value::Bool(true), "{status:#}");
}

/// smartmigd is down when an array of 10 shard jobs arrives: at most one
/// task may fail, the node is drained with the reason, and once smartmigd
/// is back it resumes the node, every task completes and the GPUs' layouts
/// are published as node features. Before the fix
/// all 10 tasks FAILED within seconds while `sinfo` said idle.
#[test]
fn unreachable_sidecar_drains_the_node_and_jobs_wait() {
    let cluster = cluster("sidecar_wait=1");
    let array = cluster.sbatch_wrap(&["--array=1-10", "--gres=shard:2"], "sleep 1");
    assert!(
        holds_within(Duration::from_secs(60), || cluster.node_state()
            == "drained"
            || cluster.node_state() == "draining"),
        "node not drained: {}\n{}",
        cluster.node_state(),
        cluster.log_tails()
    );
    let reason = cluster
        .command("sinfo")
        .args(["-h", "-R", "-o", "%E"])
        .output()
        .expect("sinfo -R");
    let reason = String::from_utf8_lossy(&reason.stdout).trim().to_string();
    assert_eq!(reason, "smartmig: sidecar unreachable");

    let sidecar = Sidecar::start_with_slurm(cluster.dir(), "epoch_s = 1\npublish_layout = true");
    let mut last = Vec::new();
    let done = holds_within(TIMEOUT, || {
        last = cluster.job_records(array);
        last.len() == 10
            && last.iter().all(|r| {
                r.get("JobState")
                    .is_some_and(|s| FINAL_JOB_STATES.contains(&s.as_str()))
            })
    });
    assert!(
        done,
        "array not finished: {last:#?}\n{}\n{}",
        cluster.smartmigd_log(),
        cluster.log_tails()
    );
    let failed: Vec<_> = last
        .iter()
        .filter(|r| r.get("JobState").map(String::as_str) != Some("COMPLETED"))
        .collect();
    assert!(
        failed.len() <= 1,
        "tasks that did not complete: {failed:#?}"
    );
    assert_eq!(cluster.node_state(), "idle");
    assert!(
        cluster.smartmigd_log().contains("node resumed"),
        "{}",
        cluster.smartmigd_log()
    );
    // The same per-epoch sinfo read publishes each GPU's layout.
    let features = cluster
        .command("sinfo")
        .args(["-h", "-o", "%f"])
        .output()
        .expect("sinfo -o %f");
    let features = String::from_utf8_lossy(&features.stdout).to_string();
    assert!(
        features.contains("smartmig_gpu0_") && features.contains("smartmig_gpu1_"),
        "layout not published as node features: {features:?}\n{}",
        cluster.smartmigd_log()
    );
    told_why_smartmigd_was_unreachable(&cluster, &last);
    drop(sidecar);
}

/// Issue 56, told why: each task the plugin requeued while smartmigd was
/// down says so in `scontrol show job` (an `AdminComment` word the plugin
/// wrote, smartmigd being away), and its next run's output carries the
/// line: smartmigd, started afresh, had no note for it, so the plugin read
/// the word back from Slurm.
fn told_why_smartmigd_was_unreachable(
    cluster: &SlurmCluster,
    records: &[std::collections::HashMap<String, String>],
) {
    let mut told = 0;
    for record in records {
        let Some(id) = record.get("JobId") else {
            continue;
        };
        let show = cluster
            .command("scontrol")
            .args(["show", "job", id])
            .output()
            .expect("scontrol show job");
        let show = String::from_utf8_lossy(&show.stdout).into_owned();
        // The task's own record (an array's first task shares the
        // array's id, whose `show job` lists every task).
        let head = format!("JobId={id} ");
        let comment = show
            .split("\nJobId=")
            .map(|r| format!("JobId={}", r.trim_start_matches("JobId=")))
            .find(|r| r.starts_with(&head))
            .and_then(|r| {
                r.lines()
                    .find_map(|l| l.trim().strip_prefix("AdminComment=").map(String::from))
            })
            .unwrap_or_default();
        if !comment.contains("why=smartmigd_unreachable") {
            continue;
        }
        told += 1;
        assert!(
            comment.contains("smartmig-requeued:at=")
                && comment.contains("next=runs_again_on_another_node_or_once_smartmigd_is_back"),
            "job {id}: {comment}"
        );
        assert_ne!(
            record.get("Restarts").map(String::as_str),
            Some("0"),
            "job {id} says it was requeued but was not: {record:?}"
        );
        let out = std::fs::read_to_string(cluster.dir().join(format!("jobs-{id}.out")))
            .unwrap_or_default();
        assert!(
            out.contains("smartmig: this job was requeued by smartmig at ")
                && out.contains("smartmigd, the node's MIG daemon, did not answer")
                && out.contains("on another node or after smartmigd came back"),
            "job {id}'s next run does not say why it was requeued: {out:?}\n{show}"
        );
    }
    assert!(
        told > 0,
        "no task's AdminComment says smartmigd was unreachable: {records:#?}\n{}",
        cluster.log_tails()
    );
}

/// Two 3-shard jobs on one GPU take both halves of its memory; Slurm still
/// offers the seventh shard, which no MIG layout can build. The 1-shard job
/// Slurm puts there is requeued, not failed, and completes once a 3g job
/// ended. `scontrol show job` counts the restart.
#[test]
fn shard_slurm_sees_but_mig_cannot_build_is_requeued_not_failed() {
    let cluster = cluster("");
    let sidecar = Sidecar::start_with_slurm(cluster.dir(), "epoch_s = 1\nallocate_wait_s = 2");
    let go = cluster.dir().join("go");
    let [whole, a, b] = fill_with_held_jobs(&cluster, &sidecar, &go);
    let small = cluster.sbatch_wrap(&["--gres=shard:1"], "echo small ran");
    // It starts, finds no room, and is requeued (Restarts=1, back to pending).
    assert!(
        holds_within(Duration::from_secs(60), || {
            cluster
                .job_records(small)
                .first()
                .and_then(|r| r.get("Restarts").cloned())
                .is_some_and(|n| n != "0")
        }),
        "the 1-shard job was not requeued: {:#?}\n{}",
        cluster.job_records(small),
        cluster.smartmigd_log()
    );
    assert_ne!(cluster.job_state(small).as_deref(), Some("FAILED"));
    for job in [whole, a, b] {
        std::fs::write(go.join(job.to_string()), b"").expect("write go");
    }
    for job in [whole, a, b, small] {
        cluster.assert_completed(job, TIMEOUT);
    }
    let out = std::fs::read_to_string(cluster.dir().join(format!("jobs-{small}.out")))
        .unwrap_or_default();
    assert!(out.contains("small ran"), "{out}");
    // Told why (issue 56): the next run's output and the job's record.
    assert!(
        out.contains("smartmig: this job was requeued by smartmig")
            && out.contains("got no MIG instance on GPU"),
        "the next run does not say why: {out}"
    );
    let comment = cluster
        .job_records(small)
        .first()
        .and_then(|r| r.get("AdminComment").cloned())
        .unwrap_or_default();
    assert!(
        comment.contains("smartmig-requeued:at=") && comment.contains("why=no_room_for_1g.5gb"),
        "AdminComment does not say why: {comment}"
    );
}

/// Slurm numbers GPUs by their device file names (`slurmd -G`: nvidia0 is
/// index 0 whatever order gres.conf lists them in), smartmigd by NVML index,
/// whose device is `/dev/nvidia<minor number>`. Here the device named
/// nvidia0 has minor 1 (as on a node whose NVML order differs from its
/// device numbering): Slurm's GPU 0 is the sidecar's GPU 1. smartmigd
/// refuses to start and names the GPUs, instead of giving every job an
/// instance on a GPU other than the one Slurm assigned. (`slurmd -G` reads
/// gres.conf afresh, so it is rewritten after the cluster started.)
#[test]
fn smartmigd_refuses_a_gres_conf_in_another_gpu_order() {
    let cluster = cluster("");
    let gres = cluster.dir().join("gres.conf");
    let text = std::fs::read_to_string(&gres).expect("read gres.conf");
    let dev = cluster.dir().join("dev");
    let crossed = cluster.dir().join("dev-crossed");
    std::fs::create_dir_all(&crossed).expect("mkdir");
    for (name, minor) in [("nvidia0", "1"), ("nvidia1", "0")] {
        let out = std::process::Command::new("mknod")
            .arg(crossed.join(name))
            .args(["c", "195", minor])
            .output()
            .expect("run mknod");
        assert!(out.status.success(), "{out:?}");
    }
    let swapped = text.replace(
        &format!("{}/", dev.display()),
        &format!("{}/", crossed.display()),
    );
    assert_ne!(swapped, text, "gres.conf layout changed: {text}");
    std::fs::write(&gres, swapped).expect("write gres.conf");
    let dir = cluster.dir().to_path_buf();
    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Sidecar::start_with_slurm(&dir, "")
    }));
    let message = match started {
        Ok(_) => panic!("smartmigd started with GPUs in another order than Slurm's"),
        Err(p) => p.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(
        message.contains("Slurm and smartmigd number the GPUs differently")
            && message.contains("Slurm's GPU 0 is")
            && message.contains("nvidia0 (minor 1), which is smartmigd's GPU 1"),
        "{message}"
    );
}

/// smartmigd restarts (SIGTERM, then start) while a job waits for room:
/// the waiting job is listed in status, its step waits for the new daemon
/// (`sidecar_wait`) instead of failing, and it gets its instance once a
/// holder ends, without a requeue.
#[test]
fn a_restart_of_smartmigd_does_not_fail_waiting_jobs() {
    let cluster = cluster("");
    let mut sidecar = Sidecar::start_with_slurm(cluster.dir(), "epoch_s = 1\nallocate_wait_s = 60");
    let go = cluster.dir().join("go");
    let [whole, a, b] = fill_with_held_jobs(&cluster, &sidecar, &go);
    let small = cluster.sbatch_wrap(&["--gres=shard:1"], "echo small ran");
    let listed = |s: &Value| {
        s["waiting"]
            .as_array()
            .is_some_and(|w| w.iter().any(|j| j["job_id"] == small))
    };
    assert!(
        holds_within(Duration::from_secs(60), || listed(&sidecar.status())),
        "job {small} not listed as waiting: {:#}",
        sidecar.status()
    );
    sidecar.stop();
    let sidecar = Sidecar::start_with_slurm(cluster.dir(), "epoch_s = 1\nallocate_wait_s = 60");
    assert!(
        holds_within(Duration::from_secs(30), || listed(&sidecar.status())),
        "job {small} does not wait on the new daemon: {:#}\n{}",
        sidecar.status(),
        cluster.log_tails()
    );
    std::fs::write(go.join(a.to_string()), b"").expect("write go");
    assert_eq!(
        cluster.wait_job(small, TIMEOUT),
        "COMPLETED",
        "{:#?}\n{}",
        cluster.job_records(small),
        cluster.smartmigd_log()
    );
    let restarts = cluster
        .job_records(small)
        .first()
        .and_then(|r| r.get("Restarts").cloned());
    assert_eq!(
        restarts.as_deref(),
        Some("0"),
        "it was requeued instead of waiting"
    );
    for job in [whole, b] {
        std::fs::write(go.join(job.to_string()), b"").expect("write go");
    }
    for job in [whole, a, b] {
        assert_eq!(cluster.wait_job(job, TIMEOUT), "COMPLETED");
    }
}

/// Issue 56, told why across a smartmigd restart: a 1-shard job that found
/// no room is requeued (smartmigd keeps the note in memory and writes the
/// `AdminComment` word); smartmigd then restarts while the job is held, so
/// the new daemon has no note. The job's next run still prints why: the
/// plugin reads the word back from Slurm, as the job's (ordinary) user.
#[test]
fn a_requeued_jobs_reason_survives_a_smartmigd_restart() {
    let cluster = cluster("");
    let conf = "epoch_s = 1\nallocate_wait_s = 2";
    let mut sidecar = Sidecar::start_with_slurm(cluster.dir(), conf);
    let go = cluster.dir().join("go");
    let [whole, a, b] = fill_with_held_jobs(&cluster, &sidecar, &go);
    // The ordinary user's job: the plugin reads its record in task_init,
    // with that user's rights.
    let output = cluster.shared_dir().join("small.out");
    let small = cluster.sbatch_as_job_user(&output, &["--gres=shard:1"], "echo small ran");
    let restarted = || {
        cluster
            .job_records(small)
            .first()
            .and_then(|r| r.get("Restarts").cloned())
            .is_some_and(|n| n != "0")
    };
    assert!(
        holds_within(Duration::from_secs(60), restarted),
        "the 1-shard job was not requeued: {:#?}\n{}",
        cluster.job_records(small),
        cluster.smartmigd_log()
    );
    // Held while pending (it may have run and been requeued again first).
    let held = holds_within(Duration::from_secs(60), || {
        cluster
            .command("scontrol")
            .args(["hold", &small.to_string()])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(
        held,
        "job {small} could not be held: {:#?}",
        cluster.job_records(small)
    );
    sidecar.stop();
    let sidecar = Sidecar::start_with_slurm(cluster.dir(), conf);
    std::fs::write(go.join(a.to_string()), b"").expect("write go");
    cluster.assert_completed(a, TIMEOUT);
    let released = cluster
        .command("scontrol")
        .args(["release", &small.to_string()])
        .output()
        .expect("scontrol release");
    assert!(released.status.success(), "{released:?}");
    cluster.assert_completed(small, TIMEOUT);
    let out = std::fs::read_to_string(&output).unwrap_or_default();
    assert!(
        out.contains("small ran")
            && out.contains("smartmig: this job was requeued by smartmig at ")
            && out.contains("smartmigd found no room for a 1g.5gb in time"),
        "the run after smartmigd's restart does not say why: {out:?}\n{}",
        cluster.smartmigd_log()
    );
    let slurmd = std::fs::read_to_string(cluster.dir().join("log/slurmd.log")).unwrap_or_default();
    assert!(
        slurmd.contains("its AdminComment says why it was requeued"),
        "the line did not come from Slurm's record:\n{slurmd}"
    );
    for job in [whole, b] {
        std::fs::write(go.join(job.to_string()), b"").expect("write go");
    }
    for job in [whole, b] {
        cluster.assert_completed(job, TIMEOUT);
    }
    drop(sidecar);
}
