//! End-to-end (issue 56, item 3): smartmigd's holds in a hidden partition.
//!
//! A real Slurm node typed per GPU (the packaged gres.conf) with a second
//! partition, `smartmig-holds`, `Hidden=YES AllowGroups=root`, and
//! smartmigd with `hold_partition = "smartmig-holds"`. Two `shard:3` jobs
//! on GPU 0 get a hold on its stranded seventh shard: Slurm lists it in that
//! partition for `squeue --all` (root, smartmigd), an ordinary user's
//! `squeue` does not list it, and smartmigd, which reads the queue with
//! `--all`, keeps that one hold across epochs (no duplicate queued).
//!
//! Needs root and a release build of the workspace (`scripts/test`).

use std::time::Duration;

use smartmig_suite::{
    holds_within, job_user, plugstack_line, Sidecar, SidecarBackend, SlurmCluster,
};

const PARTITION: &str = "smartmig-holds";

/// `(name, partition)` of the holds `squeue` lists, as `user` with `args`.
fn holds(cluster: &SlurmCluster, user: Option<&str>, all: bool) -> Vec<(String, String)> {
    let mut cmd = match user {
        Some(u) => {
            let mut c = cluster.command("runuser");
            c.args(["-u", u, "--", "squeue"]);
            c
        }
        None => cluster.command("squeue"),
    };
    cmd.args(["-h", "-o", "%j %P"]);
    if all {
        cmd.arg("--all");
    }
    let out = cmd.output().expect("run squeue");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(n, _)| n.starts_with("smartmig-hold."))
        .map(|(n, p)| (n.to_string(), p.to_string()))
        .collect()
}

#[test]
fn holds_in_a_hidden_partition_are_not_listed_to_users() {
    std::env::remove_var("SMARTMIG_SLURM_JOB_SUBMIT");
    std::env::set_var("SMARTMIG_SLURM_TYPED_GPUS", "1");
    std::env::set_var("SMARTMIG_SLURM_HOLD_PARTITION", PARTITION);
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, ""))
            .expect("write plugstack.conf");
    });
    let sidecar = Sidecar::start_configured(
        cluster.dir(),
        "epoch_s = 1",
        true,
        &format!("hold_partition = \"{PARTITION}\""),
        &SidecarBackend::Sim,
    );
    assert_eq!(sidecar.status()["holds"]["state"], "adaptive");
    for k in [3, 3, 7] {
        cluster.sbatch(&[
            &format!("--gres=shard:{k}"),
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 60",
        ]);
    }
    let held = holds_within(Duration::from_secs(60), || {
        !holds(&cluster, None, true).is_empty()
    });
    assert!(held, "no hold queued:\n{}", cluster.log_tails());
    let listed = holds(&cluster, None, true);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].0.ends_with(".0"), "{listed:?}");
    assert_eq!(listed[0].1, PARTITION, "{listed:?}");
    // An ordinary user's squeue does not list the hidden partition's jobs.
    let user = job_user();
    assert!(
        holds(&cluster, Some(user), false).is_empty(),
        "a user sees the hold"
    );
    // smartmigd sees it (squeue --all): after a few epochs it still holds
    // one, not one more per epoch.
    let since = sidecar.epochs();
    sidecar.wait_epochs(since, 3, Duration::from_secs(30));
    let listed = holds(&cluster, None, true);
    assert_eq!(
        listed.len(),
        1,
        "holds after 3 epochs: {listed:?}\n{}",
        cluster.smartmigd_log()
    );
    assert!(
        !cluster.smartmigd_log().contains("hold released"),
        "the hold was dropped and queued again:\n{}",
        cluster.smartmigd_log()
    );
}
