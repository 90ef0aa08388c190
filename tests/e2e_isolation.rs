//! End-to-end: device isolation between the jobs on one GPU (issue 18,
//! item 1). Two real users each run a shard job on the same GPU through a
//! real Slurm, the SPANK plugin and smartmigd (sim backend, whose instances
//! have access files that are real character devices, like
//! `/dev/nvidia-caps/nvidia-cap<M>`). A job can open its own instance's
//! access files and no other's; a released instance's files are root's
//! again; after a crash of the daemon, the start repairs what was changed.
//! And (item 2) `smartmig status` run by one of the users shows that
//! user's job in full and the other's only as a count.
//!
//! Needs root (useradd, mknod) and a release build; fails, never skips.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use serde_json::Value;
use smartmig_suite::{ensure_user, plugstack_line, Sidecar, SlurmCluster};

const JOB_TIMEOUT: Duration = Duration::from_secs(90);

/// (uid, mode) of a file.
fn owner_mode(path: &str) -> (u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("stat {path}: {e}"));
    (m.uid(), m.mode() & 0o7777)
}

/// The status entry of the instance `job` holds.
fn held_by(sidecar: &Sidecar, job: u32) -> Value {
    let status = sidecar.status();
    Sidecar::instances(&status)
        .into_iter()
        .find(|i| i["job_id"] == job)
        .unwrap_or_else(|| panic!("job {job} holds no instance: {status:#}"))
}

fn files(inst: &Value) -> Vec<String> {
    let f: Vec<String> = inst["access_files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    assert_eq!(
        f.len(),
        2,
        "an instance has a GPU- and a compute-instance file: {inst:#}"
    );
    f
}

fn wait_for(what: &str, cluster: &SlurmCluster, done: impl FnMut() -> bool) {
    smartmig_suite::Wait::new(what, JOB_TIMEOUT)
        .context(|| cluster.log_tails())
        .until(done);
}

#[test]
fn a_job_opens_only_its_own_instance_and_a_crash_does_not_undo_that() {
    smartmig_suite::require_root("device isolation needs useradd and mknod");
    let (user_a, user_b) = ("smartmig-iso-a", "smartmig-iso-b");
    let uid_a = ensure_user(user_a);
    let uid_b = ensure_user(user_b);
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, "")).expect("plugstack");
    });
    let mut sidecar = Sidecar::start(cluster.dir(), "");
    let shared = cluster.shared_dir();
    let caps = cluster.dir().join("run/nvidia-caps");
    let go = shared.join("go");

    // Job A (user a) holds a 3-slice instance until told to stop.
    let out_a = shared.join("a.out");
    let hold = format!(
        "echo CVD=$CUDA_VISIBLE_DEVICES; for i in $(seq 900); do [ -e {} ] && break; sleep 0.1; done",
        go.display()
    );
    let job_a = cluster.sbatch_as(user_a, user_a, &out_a, &["--gres=shard:3"], &hold);
    wait_for("job A never got its instance", &cluster, || {
        std::fs::read_to_string(&out_a).is_ok_and(|t| t.contains("CVD=MIG-"))
    });
    let inst_a = held_by(&sidecar, job_a);
    let files_a = files(&inst_a);
    for f in &files_a {
        assert_eq!(owner_mode(f), (uid_a, 0o600), "{f} while job A holds it");
        assert!(f.starts_with(&caps.display().to_string()), "{f}");
    }

    // Job B (user b), on the same GPU, tries to open every access file
    // there is: its own must open, every other must be refused.
    let out_b = shared.join("b.out");
    let probe = format!(
        "for f in {}/nvidia-cap*; do if (exec 3<\"$f\") 2>/dev/null; then echo \"OPENED $f\"; else echo \"REFUSED $f\"; fi; done; echo PROBED",
        caps.display()
    );
    let body_b = format!("{probe}; {hold}");
    let job_b = cluster.sbatch_as(user_b, user_b, &out_b, &["--gres=shard:3"], &body_b);
    wait_for("job B never probed every access file", &cluster, || {
        std::fs::read_to_string(&out_b).is_ok_and(|t| t.contains("PROBED"))
    });
    let inst_b = held_by(&sidecar, job_b);
    let files_b = files(&inst_b);
    let text_b = std::fs::read_to_string(&out_b).unwrap_or_default();
    let opened: Vec<&str> = text_b
        .lines()
        .filter_map(|l| l.strip_prefix("OPENED "))
        .collect();
    let refused: Vec<&str> = text_b
        .lines()
        .filter_map(|l| l.strip_prefix("REFUSED "))
        .collect();
    let mut own: Vec<&str> = files_b.iter().map(String::as_str).collect();
    own.sort_unstable();
    let mut got = opened.clone();
    got.sort_unstable();
    assert_eq!(got, own, "job B opened exactly its own files: {text_b}");
    for f in &files_a {
        assert!(
            refused.contains(&f.as_str()),
            "job B could open job A's {f}: {text_b}"
        );
    }

    // Status as user a: its own job in full, job B only as a count.
    let out = std::process::Command::new("runuser")
        .args(["-u", user_a, "--"])
        .arg(smartmig_suite::artifact("smartmig"))
        .args(["status", "--json", "--socket"])
        .arg(sidecar.socket())
        .output()
        .expect("runuser smartmig status");
    assert!(
        out.status.success(),
        "status as {user_a}: {}",
        smartmig_suite::describe(&out)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let seen: Value = serde_json::from_str(&text).expect("status JSON");
    let mine = Sidecar::instances(&seen);
    assert!(mine.iter().any(|i| i["job_id"] == job_a), "{text}");
    for secret in [
        inst_b["uuid"].as_str().unwrap_or("?"),
        &format!("\"job_id\":{job_b}"),
        &format!("\"uid\":{uid_b}"),
    ] {
        assert!(!text.contains(secret), "user a sees {secret}: {text}");
    }
    let others: u64 = seen["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["others_busy"].as_object())
        .flat_map(|o| o.values().filter_map(Value::as_u64))
        .sum();
    assert_eq!(others, 1, "job B counted once for user a: {text}");
    // Root still sees both.
    let all = sidecar.status().to_string();
    assert!(
        all.contains(inst_b["uuid"].as_str().unwrap_or("?")),
        "{all}"
    );

    // Job A ends: its instance stays (idle) and is root's again.
    let state = {
        let out = cluster
            .command("scancel")
            .arg(job_a.to_string())
            .output()
            .expect("scancel");
        assert!(out.status.success(), "scancel {job_a}");
        cluster.wait_job(job_a, JOB_TIMEOUT)
    };
    assert!(
        state == "CANCELLED" || state == "COMPLETED",
        "job A ended {state}"
    );
    wait_for("job A's instance never released", &cluster, || {
        Sidecar::instances(&sidecar.status())
            .iter()
            .any(|i| i["uuid"] == inst_a["uuid"] && i.get("job_id").is_none_or(Value::is_null))
    });
    for f in &files_a {
        assert_eq!(owner_mode(f), (0, 0o600), "{f} after job A's release");
    }

    // A crash, then someone widens the files: the restarted daemon
    // restores the idle instance's files to root and job B's to user b.
    sidecar.kill();
    for f in files_a.iter().chain(&files_b) {
        std::os::unix::fs::chown(f, Some(uid_a), None).expect("chown");
        std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .expect("chmod");
    }
    let sidecar = Sidecar::start(cluster.dir(), "");
    for f in &files_a {
        assert_eq!(owner_mode(f), (0, 0o600), "{f} after the restart");
    }
    for f in &files_b {
        assert_eq!(owner_mode(f), (uid_b, 0o600), "{f} after the restart");
    }
    assert_eq!(held_by(&sidecar, job_b)["uid"], Value::from(uid_b));
    std::fs::write(&go, b"").expect("go");
    let state = cluster.wait_job(job_b, JOB_TIMEOUT);
    assert_eq!(state, "COMPLETED", "{}", cluster.log_tails());
}
