//! End-to-end: per-job slice accounting where admins already look (issue
//! 22, part 3), through a real Slurm 22.05, the SPANK plugin and smartmigd
//! (sim backend) with Slurm queries on.
//!
//! A job whose admin already wrote an `AdminComment` gets its instance;
//! smartmigd adds `smartmig:profile=..,gpu=..,mem_gb=..,wait_s=..` to the
//! comment while the job runs (Slurm refuses updates once it has ended)
//! and keeps the admin's words. When the job ends, the node's usage log
//! has its record, and `smartmig usage --config` (the command an admin
//! types) sums its slice-hours for its user.
//!
//! Needs root and a release build of the workspace; fails, never skips.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::Value;
use smartmig_suite::{artifact, plugstack_line, Sidecar, SlurmCluster};

const TIMEOUT: Duration = Duration::from_secs(90);

/// The job's `AdminComment` as `scontrol show job` prints it (its own
/// line; the value may hold spaces, so not the `-o` form).
fn admin_comment(cluster: &SlurmCluster, job: u32) -> String {
    let out = cluster
        .command("scontrol")
        .args(["show", "job", &job.to_string()])
        .output()
        .expect("run scontrol show job");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("AdminComment="))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn the_slice_a_job_got_is_in_its_admin_comment_and_the_usage_log() {
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, "")).expect("plugstack");
    });
    let sidecar = Sidecar::start_with_slurm(cluster.dir(), "epoch_s = 2\n");
    let shared = cluster.shared_dir();
    let go = shared.join("go");
    let out = shared.join("acct.out");
    let body = format!(
        "echo PROFILE=$SMARTMIG_PROFILE; \
         for i in $(seq 900); do [ -e {} ] && break; sleep 0.1; done",
        go.display()
    );
    // Held, so the site's comment is there before the job starts.
    let job = cluster.sbatch_as_job_user(&out, &["--gres=shard:2", "--hold"], &body);
    let set = cluster
        .command("scontrol")
        .args([
            "update",
            &format!("JobId={job}"),
            "AdminComment=site=abc ticket=7",
        ])
        .output()
        .expect("run scontrol update");
    assert!(set.status.success(), "{set:?}");
    let released = cluster
        .command("scontrol")
        .args(["release", &job.to_string()])
        .output()
        .expect("run scontrol release");
    assert!(released.status.success(), "{released:?}");

    let mut comment = String::new();
    let tagged = smartmig_suite::holds_within(TIMEOUT, || {
        comment = admin_comment(&cluster, job);
        comment.contains("smartmig:")
    });
    assert!(
        tagged,
        "job {job}'s AdminComment was never tagged: {comment:?}\n{}\n{}",
        cluster.smartmigd_log(),
        cluster.log_tails()
    );
    let output = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(output.contains("PROFILE=2g.10gb"), "{output}");
    assert!(
        comment.starts_with("site=abc ticket=7 smartmig:profile=2g.10gb,gpu="),
        "the site's words first, then ours: {comment:?}"
    );
    assert!(comment.contains(",mem_gb=10,wait_s="), "{comment:?}");

    // Not synchronisation: the test's input. The job holds its slice for
    // at least these 2 s of wall time, which the slice-hours bound below
    // (2 slices x 2 s at least) checks the usage log counted.
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(&go, b"").expect("write go file");
    cluster.assert_completed(job, TIMEOUT);
    // Still there once the job has ended: Slurm keeps it with the job.
    assert!(
        admin_comment(&cluster, job).contains("smartmig:profile=2g.10gb"),
        "{:?}",
        admin_comment(&cluster, job)
    );

    // The node's usage log and `smartmig usage`, as an admin runs it.
    let config = cluster.dir().join("smartmigd.toml");
    let mut lines = Value::Null;
    let logged = smartmig_suite::holds_within(Duration::from_secs(20), || {
        let o = smartmig_suite::in_slurm(artifact("smartmig"))
            .args(["usage", "--json", "--config"])
            .arg(&config)
            .output()
            .expect("run smartmig usage");
        lines = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        lines.as_array().is_some_and(|a| !a.is_empty())
    });
    assert!(logged, "no usage: {lines:#}\n{}", cluster.smartmigd_log());
    let log = cluster.dir().join("smartmigd-state/usage.jsonl");
    let mode = std::fs::metadata(&log)
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()))
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the usage log names every user's jobs");
    let user = &lines[0];
    assert_eq!(user["who"], smartmig_suite::JOB_USER, "{lines:#}");
    assert_eq!(user["jobs"], 1, "{lines:#}");
    assert_eq!(user["profiles"]["2g.10gb"], 1, "{lines:#}");
    // Two slices for at least the two seconds the test held the job.
    let hours = user["slice_hours"].as_f64().expect("slice_hours");
    assert!(
        (2.0 * 2.0 / 3600.0..2.0 * 120.0 / 3600.0).contains(&hours),
        "{lines:#}"
    );
    let table = smartmig_suite::in_slurm(artifact("smartmig"))
        .args(["usage", "--config"])
        .arg(&config)
        .output()
        .expect("run smartmig usage");
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains(smartmig_suite::JOB_USER) && table.contains("2g.10gb×1"),
        "{table}"
    );
    drop(sidecar);
}
