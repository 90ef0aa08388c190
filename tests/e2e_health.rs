//! Per-instance and per-GPU health under a real Slurm (issue 44, item 4):
//! smartmigd on the nvml backend over the NVML emulator, XIDs injected
//! into the emulator (`Emulator::inject_xid`) reach the daemon through
//! NVML's event set. An XID 94 on a job's MIG instance keeps later jobs off
//! it (it is rebuilt once the job ends); an XID 79 on a GPU drains the node
//! in Slurm with reason `smartmig: gpu N xid 79`, so a new job stays
//! pending, until the admin resumes the node.
//!
//! Needs root and a release build of the workspace; fails, never skips.

mod common;

use common::{held_job, instance_of, read, release};

use std::time::Duration;

use smartmig_suite::{fields, plugstack_line, Sidecar, SidecarBackend, SlurmCluster, Wait};

const JOB_TIMEOUT: Duration = common::HELD_JOB_TIMEOUT;

/// `scontrol show node`'s text.
fn show_node(cluster: &SlurmCluster) -> String {
    let out = cluster
        .command("scontrol")
        .args(["show", "node"])
        .output()
        .expect("scontrol show node");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait(cluster: &SlurmCluster, sidecar: &Sidecar, what: &str, f: impl FnMut() -> bool) {
    Wait::new(what, JOB_TIMEOUT)
        .context(|| format!("{}\n{}", sidecar.status_table(), cluster.log_tails()))
        .until(f);
}

/// The job's state and Slurm's reason for it (`None` until the scheduler
/// has looked at it), from `scontrol show job -o`.
fn state_and_reason(cluster: &SlurmCluster, job: u32) -> (String, String) {
    let out = cluster
        .command("scontrol")
        .args(["show", "job", "-o", &job.to_string()])
        .output()
        .expect("scontrol show job");
    let f = fields(&String::from_utf8_lossy(&out.stdout));
    let get = |k: &str| f.get(k).cloned().unwrap_or_default();
    (get("JobState"), get("Reason"))
}

#[test]
fn xids_keep_jobs_off_an_instance_and_drain_the_node_until_resumed() {
    smartmig_suite::require_root("the test cluster and the emulator's device files need root");
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, "")).expect("plugstack");
    });
    let (emu_dir, emu) = common::two_a100s(cluster.dir());
    let backend = SidecarBackend::NvmlEmulator(emu_dir);
    let sidecar = Sidecar::start_on(
        cluster.dir(),
        "allocate_wait_s = 20\nepoch_s = 2\npolicy = \"none\"",
        true,
        &backend,
    );
    let shared = cluster.shared_dir();

    // An XID 94 on job 1's instance: marked unhealthy, job 1 named in the
    // log, and once job 1 ends the instance is destroyed and rebuilt.
    let out1 = shared.join("one.out");
    let job1 = cluster.sbatch_as_job_user(&out1, &["--gres=shard:3"], &held_job(&shared));
    let (sick, _) = instance_of(&cluster, &out1);
    let (gpu, gi) = (0..2u32)
        .find_map(|g| {
            let list = emu.instances(g).expect("emulator instances");
            list.iter()
                .find(|i| i.uuid.as_deref() == Some(sick.as_str()))
                .map(|i| (g, i.gi_id))
        })
        .expect("job 1's instance in the emulator");
    emu.inject_xid(gpu, 94, Some(gi)).expect("inject XID 94");
    wait(&cluster, &sidecar, "instance marked unhealthy", || {
        Sidecar::instances(&sidecar.status())
            .iter()
            .any(|i| i["uuid"] == sick.as_str() && i["unhealthy_xid"] == 94)
    });
    let log = cluster.smartmigd_log();
    assert!(log.contains(&format!("job=Some({job1})")), "{log}");
    release(&cluster, job1, &out1);
    wait(&cluster, &sidecar, "instance rebuilt", || {
        !Sidecar::instances(&sidecar.status())
            .iter()
            .any(|i| i["uuid"] == sick.as_str())
    });
    let out2 = shared.join("two.out");
    let job2 = cluster.sbatch_as_job_user(&out2, &["--gres=shard:3"], &held_job(&shared));
    let (second, _) = instance_of(&cluster, &out2);
    assert_ne!(second, sick, "a job got the instance the XID marked");
    release(&cluster, job2, &out2);

    // An XID 79 on GPU 1: the node is drained with smartmig's reason and a
    // new job waits; the admin's resume brings both back.
    emu.inject_xid(1, 79, None).expect("inject XID 79");
    wait(&cluster, &sidecar, "node drained", || {
        show_node(&cluster).contains("Reason=smartmig: gpu 1 xid 79")
    });
    assert!(
        cluster.node_state().starts_with("drain"),
        "{}",
        cluster.node_state()
    );
    let out3 = shared.join("three.out");
    let job3 =
        cluster.sbatch_as_job_user(&out3, &["--gres=shard:1"], "echo CVD=$CUDA_VISIBLE_DEVICES");
    // Slurm's scheduler has looked at the job once it gives a reason for
    // it (or it has left PENDING: then the assertion below fails).
    let drained_at = sidecar.epochs();
    let (state, reason) = Wait::new("Slurm to judge job 3", JOB_TIMEOUT)
        .context(|| cluster.log_tails())
        .until(|| match state_and_reason(&cluster, job3) {
            (s, r) if s == "PENDING" && (r.is_empty() || r == "None") => Err((s, r)),
            judged => Ok(judged),
        });
    assert_eq!(
        state,
        "PENDING",
        "a job started on a node drained for a GPU-fatal XID ({reason})\n{}",
        cluster.log_tails()
    );
    // Epochs come and go (two more: one ran whole after the drain, and
    // compared the node with Slurm): smartmigd keeps its own drain, and
    // the job still waits.
    sidecar.wait_epochs(drained_at, 2, JOB_TIMEOUT);
    assert!(show_node(&cluster).contains("Reason=smartmig: gpu 1 xid 79"));
    assert_eq!(
        cluster.job_state(job3).as_deref(),
        Some("PENDING"),
        "{}",
        cluster.log_tails()
    );
    let status = sidecar.status();
    assert_eq!(status["gpus"][1]["health"]["fatal_xid"], 79, "{status:#}");
    let resumed = cluster
        .command("scontrol")
        .args(["update", "nodename=ALL", "state=resume"])
        .output()
        .expect("scontrol resume");
    assert!(
        resumed.status.success(),
        "{}",
        smartmig_suite::describe(&resumed)
    );
    let state = cluster.wait_job(job3, JOB_TIMEOUT);
    assert_eq!(
        state,
        "COMPLETED",
        "{}\n{}",
        read(&out3),
        cluster.log_tails()
    );
    wait(&cluster, &sidecar, "GPU 1 back in service", || {
        sidecar.status()["gpus"][1]["health"]["fatal_xid"].is_null()
    });
    assert!(
        !show_node(&cluster).contains("xid 79"),
        "{}",
        show_node(&cluster)
    );
}
