//! Restart recovery, signals and configuration errors of a real smartmigd.

use crate::daemon_common;

use std::process::Command;
use std::time::Duration;

use crate::daemon_common::{base_config, req, TestDaemon};
use nix::sys::signal::Signal;
use smartmig::daemon::protocol::AllocAction;

#[test]
fn sigkill_and_restart_keep_assignments_and_uuids() {
    let mut d = TestDaemon::start("restart", "");
    let c = d.client();
    let a = c.allocate(req(77, 1, 3, Some(15.0))).unwrap();
    let idle = c.allocate(req(78, 1, 2, None)).unwrap();
    c.release(78).unwrap();
    d.kill9();
    d.spawn();
    let c = d.client();
    let s = c.status().unwrap();
    let g1 = &s.gpus[1];
    let held = g1.instances.iter().find(|i| i.job_id == Some(77)).unwrap();
    assert_eq!(held.uuid, a.uuid);
    assert_eq!(held.profile, "3g.20gb");
    let free = g1.instances.iter().find(|i| i.uuid == idle.uuid).unwrap();
    assert_eq!(free.job_id, None);
    let again = c.allocate(req(77, 1, 3, Some(15.0))).unwrap();
    assert_eq!(again.uuid, a.uuid);
    assert_eq!(again.action, AllocAction::Existing);
}

#[test]
fn sigterm_removes_the_socket_and_exits_cleanly() {
    let mut d = TestDaemon::start("term", "");
    d.client().allocate(req(1, 0, 1, None)).unwrap();
    d.signal(Signal::SIGTERM);
    let st = d.wait(Duration::from_secs(15));
    assert!(st.success(), "{st}: {}", d.log());
    assert!(!d.socket.exists());
    let journal = smartmig::daemon::journal::replay(&d.dir.join("state/journal")).unwrap();
    let jobs: Vec<u64> = journal.gpus[&0]
        .iter()
        .map(|e| e.assignment.job_id)
        .collect();
    assert_eq!(jobs, vec![1], "{journal:?}");
}

#[test]
fn sighup_reloads_and_keeps_the_old_config_when_invalid() {
    let d = TestDaemon::start("hup", "");
    assert_eq!(d.client().status().unwrap().policy, "none");
    std::fs::write(
        &d.config,
        base_config(&d.dir, "policy = \"static:4444|3333\""),
    )
    .unwrap();
    d.signal(Signal::SIGHUP);
    d.wait_until("the policy reloaded", || {
        let policy = d.client().status().unwrap().policy;
        if policy == "static:4444|3333" {
            Ok(())
        } else {
            Err(policy)
        }
    });
    std::fs::write(&d.config, "this is = = not toml").unwrap();
    d.signal(Signal::SIGHUP);
    d.wait_until("the bad config refused", || {
        d.log().contains("keeping the old one")
    });
    assert_eq!(d.client().status().unwrap().policy, "static:4444|3333");
}

#[test]
fn check_config_names_the_key() {
    let dir = std::env::temp_dir().join(format!("smartmig-it-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(&good, base_config(&dir, "")).unwrap();
    let out = Command::new(crate::daemon_common::smartmigd())
        .args(["--check-config", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
    let cases = [
        (
            "[[gpus]]\nmodel = \"a100\"\n",
            // gpus[1] after the sim backend's own group, gpus[0] with nvml.
            if daemon_common::backend() == "sim" {
                "gpus[1].model: unknown GPU model \"a100\""
            } else {
                "gpus[0].model: unknown GPU model \"a100\""
            },
        ),
        ("", ""),
    ];
    for (extra_table, want) in cases.iter().take(1) {
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, format!("{}{extra_table}", base_config(&dir, ""))).unwrap();
        let out = Command::new(crate::daemon_common::smartmigd())
            .args(["--check-config", "--config"])
            .arg(&bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err}");
    }
    for (extra, want) in [
        ("policy = \"magic\"", "policy: unknown policy `magic`"),
        ("max_message_bytes = 1", "max_message_bytes: 1 is outside"),
        ("sokcet = \"/x\"", "unknown field `sokcet`"),
        ("allocate_wait_s = \"soon\"", "allocate_wait_s"),
    ] {
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, base_config(&dir, extra)).unwrap();
        let out = Command::new(crate::daemon_common::smartmigd())
            .args(["--check-config", "--config"])
            .arg(&bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{extra}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{extra}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 56: a smartmigd started before munge and Slurm (the quickstart
/// has it in that order) could not check Slurm's GPU order at start and
/// never checked it again. It now asks again, with growing waits, until
/// slurmd answers: here the first `slurmd -G` fails as it does without
/// munge, a later one lists the GPUs, and `status` and the log say the
/// order was checked.
#[test]
fn gpu_order_is_checked_again_once_slurm_answers() {
    let d = TestDaemon::start_with("gpu-order-retry", |dir| {
        let up = dir.join("slurm-up");
        let slurmd = dir.join("slurmd");
        // Device files that do not exist: the order is then taken as
        // Slurm's (no minor numbers to compare), on either backend.
        std::fs::write(
            &slurmd,
            format!(
                "#!/bin/sh\n\
                 [ -e {up} ] || {{ echo 'slurmd: error: Munge decode failed: Failed to connect to \"/run/munge/munge.socket.2\"' >&2; exit 1; }}\n\
                 echo 'slurmd: Gres Name=gpu Type=(null) Count=1 Index=0 ID=7 File=/nonexistent/nvidia0 (null)'\n\
                 echo 'slurmd: Gres Name=gpu Type=(null) Count=1 Index=1 ID=7 File=/nonexistent/nvidia1 (null)'\n",
                up = up.display()
            ),
        )
        .expect("write the fake slurmd");
        let mut perms = std::fs::metadata(&slurmd).expect("stat").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&slurmd, perms).expect("chmod");
        let backend = daemon_common::backend_toml(dir);
        format!(
            "socket = \"{}\"\nstate_dir = \"{}\"\nepoch_s = 3600\nlog_level = \"info\"\n{}\n\
             [slurm]\nenabled = true\ncheck_grants = false\nsqueue = \"/bin/false\"\nscontrol = \"/bin/false\"\n\
             sinfo = \"/bin/false\"\nslurmd = \"{}\"\n{}",
            dir.join("run/smartmig.sock").display(),
            dir.join("state").display(),
            backend.top,
            slurmd.display(),
            backend.tables,
        )
    });
    let order = || {
        d.client()
            .status()
            .expect("status")
            .gpu_order
            .expect("status has no gpu_order with Slurm queries on")
    };
    let first = order();
    assert_eq!(first.state, "waiting", "{first:?}\n{}", d.log());
    assert!(first.detail.contains("Munge decode failed"), "{first:?}");
    assert!(
        d.log().contains("cannot check Slurm's GPU order")
            && d.log().contains("smartmigd asks again until Slurm answers"),
        "{}",
        d.log()
    );

    std::fs::write(d.dir.join("slurm-up"), b"").expect("write slurm-up");
    d.wait_until("the GPU order checked once slurmd answers", || {
        order().state == "matches"
    });
    let last = order();
    assert!(last.attempts >= 2, "{last:?}");
    assert!(last.detail.contains("Slurm's 2 gpu GRES"), "{last:?}");
    let log = d.log();
    assert!(
        log.contains(&format!(
            "Slurm's GPU order matches the backend's (ask {})",
            last.attempts
        )),
        "{log}"
    );
    // Allocates are served (a mismatch would refuse them).
    let r = d.client().allocate(req(1, 0, 1, None)).expect("allocate");
    assert_eq!(r.gpu, 0, "{r:?}");
}
