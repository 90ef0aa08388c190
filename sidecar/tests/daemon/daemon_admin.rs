//! The admin's side of Slurm agreement (issue 13): `smartmig reconcile`,
//! `smartmig release JOBID` and `smartmig status` finding the socket in
//! the config file, against a real smartmigd whose `squeue` is a script
//! printing a queue far larger than a pipe buffer.

use std::process::{Command, Output};

use crate::daemon_common::{req, unix_now, with_fake_slurm, TestDaemon};

/// `smartmig ARGS --config <the daemon's config>`.
fn smartmig(d: &TestDaemon, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_smartmig"))
        .args(args)
        .arg("--config")
        .arg(&d.config)
        .output()
        .expect("run smartmig")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A `squeue --json` answer with `n` padded pending jobs (about 1.3 KB each)
/// plus the listed running ones.
fn big_queue(n: u64, running: &[u64]) -> String {
    let pad = "x".repeat(1200);
    let mut jobs: Vec<String> = (1000..1000 + n)
        .map(|id| {
            format!(
                r#"{{"job_id":{id},"job_state":"PENDING","tres_per_node":"gres:shard:2","time_limit":30,"comment":"{pad}"}}"#
            )
        })
        .collect();
    jobs.extend(
        running
            .iter()
            .map(|id| format!(r#"{{"job_id":{id},"job_state":"RUNNING","time_limit":60}}"#)),
    );
    format!(r#"{{"jobs":[{}]}}"#, jobs.join(","))
}

/// A queue of 1,500 jobs (about 2 MB of JSON, 30 times the pipe buffer):
/// reconcile reads it in one call and releases only the job Slurm no
/// longer lists; before the fix squeue blocked on its full pipe until the
/// 10 s timeout and nothing was ever released.
#[test]
fn reconcile_reads_a_huge_queue_and_releases_only_ended_jobs() {
    let queue = big_queue(1500, &[1]);
    assert!(queue.len() > 1024 * 1024);
    let d = with_fake_slurm("admin-reconcile", "epoch_s = 3600\n", &queue);
    let c = d.client();
    for job in [1, 2] {
        c.allocate(req(job, 0, 1, None)).unwrap();
    }
    // Assignments made in the second the queue is read are never reaped:
    // wait until the clock has left the second of the last one.
    let last = c
        .status()
        .unwrap()
        .gpus
        .iter()
        .flat_map(|g| g.instances.iter().filter_map(|i| i.busy_since))
        .max()
        .expect("jobs 1 and 2 hold instances");
    d.wait_until("the second after the allocations", || unix_now() > last);
    let out = smartmig(&d, &["reconcile"]);
    assert!(out.status.success(), "{}\n{}", text(&out), d.log());
    assert!(
        text(&out).contains("released the instances of ended jobs: 2"),
        "{}",
        text(&out)
    );
    let held: Vec<u64> = c.status().unwrap().gpus[0]
        .instances
        .iter()
        .filter_map(|i| i.job_id)
        .collect();
    assert_eq!(held, vec![1], "{}", d.log());
    assert!(!d.log().contains("took more than"), "{}", d.log());
    // Nothing left to release: said so.
    let again = smartmig(&d, &["reconcile"]);
    assert!(
        text(&again).contains("nothing released"),
        "{}",
        text(&again)
    );
}

/// `smartmig release JOBID` frees a job's instance by hand; `status`
/// finds the socket in `--config` (no `--socket` needed) and a missing
/// config file named on the command line is an error that names it.
#[test]
fn release_and_status_use_the_configured_socket() {
    let d = TestDaemon::start("admin-release", "");
    let c = d.client();
    c.allocate(req(7, 1, 3, None)).unwrap();
    let status = smartmig(&d, &["status"]);
    assert!(status.status.success(), "{}", text(&status));
    assert!(text(&status).contains("3g.20gb"), "{}", text(&status));
    assert!(text(&status).contains("busy since"), "{}", text(&status));

    let out = smartmig(&d, &["release", "7"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("job 7: 1 instance(s) released"),
        "{}",
        text(&out)
    );
    let out = smartmig(&d, &["release", "7"]);
    assert!(
        text(&out).contains("job 7 held no instance"),
        "{}",
        text(&out)
    );
    // Slurm queries are off in this daemon: reconcile says so.
    let out = smartmig(&d, &["reconcile"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("slurm.enabled = false"),
        "{}",
        text(&out)
    );

    let missing = Command::new(env!("CARGO_BIN_EXE_smartmig"))
        .args(["status", "--config", "/nonexistent/smartmig.toml"])
        .output()
        .expect("run smartmig");
    assert!(!missing.status.success());
    assert!(
        text(&missing).contains("/nonexistent/smartmig.toml"),
        "{}",
        text(&missing)
    );
}
