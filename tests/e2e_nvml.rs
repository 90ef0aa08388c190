//! End-to-end on the nvml backend: the code that drives real GPUs
//! (`sidecar/daemon/src/backend/nvml.rs`, nvml-wrapper and the raw NVML
//! calls) runs under a real Slurm, the SPANK plugin and smartmigd, over
//! the NVML emulator (`sidecar/nvml-emu`: two A100-40GB in MIG mode, the
//! placement rules of the project's MIG table, NVML's return codes).
//!
//! One scenario, in the order a node lives it: allocate, release, reuse,
//! a crash of smartmigd in the middle of an NVML create while one job
//! holds its instance and another job's allocate is in flight (leaving a
//! GPU instance without its compute instance), the restart's reconcile,
//! and a reshape to whole GPUs. Every assertion is on job output and state,
//! `smartmig status` and the emulator's own view of the GPUs.
//!
//! This is the emulator, not a GPU: docs/daemon.md ("Testing the NVML
//! backend") says which behaviours only hardware can confirm.
//!
//! Needs root and a release build of the workspace; fails, never skips.

mod common;

use common::{held_job, instance_of, read, release};

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use smartmig_mig::{GpuModel, Shape};
use smartmig_nvml_emu::{Emulator, Fault};
use smartmig_suite::{plugstack_line, Sidecar, SidecarBackend, SlurmCluster, Wait};

const JOB_TIMEOUT: Duration = Duration::from_secs(90);

/// The GPU index and job of instance `uuid` in `smartmig status`.
fn in_status(sidecar: &Sidecar, uuid: &str) -> Option<(u64, Option<u64>)> {
    Sidecar::instances(&sidecar.status())
        .into_iter()
        .find(|i| i["uuid"] == uuid)
        .map(|i| (i["gpu"].as_u64().unwrap_or(99), i["job_id"].as_u64()))
}

/// What the emulator (the "hardware") holds on `gpu`: (profile id, start,
/// uuid) of every GPU instance, `None` for one without a compute instance.
fn hardware(emu: &Emulator, gpu: u32) -> Vec<(u32, u32, Option<String>)> {
    let mut v: Vec<_> = emu
        .instances(gpu)
        .unwrap_or_else(|e| panic!("emulator state of GPU {gpu}: {e}"))
        .into_iter()
        .map(|i| (i.profile_id, i.start, i.uuid))
        .collect();
    v.sort();
    v
}

fn smi_id(compute: u8, memory: u8) -> u32 {
    GpuModel::A100_40gb
        .spec()
        .profile(Shape::new(compute, memory))
        .expect("A100-40GB profile")
        .smi_id
}

#[test]
fn jobs_on_the_nvml_backend_allocate_reuse_survive_a_crash_and_reshape() {
    smartmig_suite::require_root("the test cluster and the emulator's device files need root");
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, "")).expect("plugstack");
    });
    let (emu_dir, emu) = common::two_a100s(cluster.dir());
    let backend = SidecarBackend::NvmlEmulator(emu_dir.clone());
    let config = "allocate_wait_s = 20";
    let mut sidecar = Sidecar::start_on(cluster.dir(), config, true, &backend);
    let status = sidecar.status();
    assert_eq!(status["backend"], "nvml", "{status:#}");
    let shared = cluster.shared_dir();

    // Allocate: a 3-shard job gets a 3g.20gb instance that the "hardware"
    // really has, and only its user may open the instance's access files.
    let out1 = shared.join("one.out");
    let job1 = cluster.sbatch_as_job_user(&out1, &["--gres=shard:3"], &held_job(&shared));
    let (uuid, profile) = instance_of(&cluster, &out1);
    assert_eq!(profile, "3g.20gb");
    let (gpu, holder) = in_status(&sidecar, &uuid).expect("job 1's instance in status");
    assert_eq!(holder, Some(u64::from(job1)));
    let gpu = u32::try_from(gpu).expect("gpu index");
    let on_gpu = hardware(&emu, gpu);
    assert!(
        on_gpu
            .iter()
            .any(|(p, _, u)| *p == smi_id(3, 4) && u.as_deref() == Some(uuid.as_str())),
        "the emulator has no 3g.20gb with {uuid} on GPU {gpu}: {on_gpu:?}"
    );
    let inst = Sidecar::instances(&sidecar.status())
        .into_iter()
        .find(|i| i["uuid"] == uuid.as_str())
        .expect("instance");
    let files: Vec<String> = inst["access_files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(String::from))
        .collect();
    assert_eq!(files.len(), 2, "{inst:#}");
    for f in &files {
        assert!(
            f.starts_with(&emu_dir.join("nvidia-caps").display().to_string()),
            "{f}"
        );
        let m = std::fs::metadata(f).unwrap_or_else(|e| panic!("{f}: {e}"));
        let uid = smartmig_suite::ensure_user(smartmig_suite::JOB_USER);
        assert_eq!((m.uid(), m.mode() & 0o777), (uid, 0o600), "{f}");
    }
    release(&cluster, job1, &out1);
    for f in &files {
        let m = std::fs::metadata(f).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600), "{f} after release");
    }

    // Reuse: the next 3-shard job gets the same (idle) instance: no NVML
    // create in between.
    let creates = |emu: &Emulator| {
        emu.calls()
            .expect("emulator call counts")
            .get("nvmlDeviceCreateGpuInstanceWithPlacement")
            .copied()
            .unwrap_or(0)
    };
    let before = creates(&emu);
    assert!(before >= 1, "the backend never created through NVML");
    let out2 = shared.join("two.out");
    let job2 = cluster.sbatch_as_job_user(&out2, &["--gres=shard:3"], &held_job(&shared));
    let (uuid2, _) = instance_of(&cluster, &out2);
    assert_eq!(uuid2, uuid, "the idle 3g.20gb was not reused");
    assert_eq!(creates(&emu), before, "reuse created an instance");

    // Crash mid-create: the next GPU-instance create is slow (a driver
    // taking its time) and smartmigd is killed while it waits, with job 2
    // holding its instance (a CUDA process on it) and job 5's allocate in
    // flight. The GPU instance exists without its compute instance, as
    // after a real crash between NVML's two creates. The restarted daemon
    // keeps job 2's instance, removes the orphan, and job 5 (whose step
    // asked again: the connection dropped mid-request) gets a 2g.10gb.
    emu.add_process(&uuid, 4242, 1 << 30)
        .expect("a CUDA process on job 2's instance");
    emu.inject(Fault {
        delay_ms: 120_000,
        ..Fault::new("nvmlDeviceCreateGpuInstanceWithPlacement", 0)
    })
    .expect("inject a slow create");
    let out5 = shared.join("five.out");
    let job5 = cluster.sbatch_as_job_user(&out5, &["--gres=shard:2"], &held_job(&shared));
    let orphaned =
        |emu: &Emulator| (0..2).any(|g| hardware(emu, g).iter().any(|(_, _, u)| u.is_none()));
    Wait::new(
        format!("job {job5}'s create to reach the emulator"),
        JOB_TIMEOUT,
    )
    .every(Duration::from_millis(50))
    .context(|| cluster.log_tails())
    .until(|| {
        if orphaned(&emu) {
            Ok(())
        } else {
            Err((hardware(&emu, 0), hardware(&emu, 1)))
        }
    });
    sidecar.kill();
    let sidecar = Sidecar::start_on(cluster.dir(), config, true, &backend);
    assert!(
        !orphaned(&emu),
        "the orphan GPU instance survived the restart: {:?} {:?}",
        hardware(&emu, 0),
        hardware(&emu, 1)
    );
    assert_eq!(
        in_status(&sidecar, &uuid),
        Some((u64::from(gpu), Some(u64::from(job2)))),
        "job 2's instance after the restart: {:#}",
        sidecar.status()
    );
    let (uuid5, p5) = instance_of(&cluster, &out5);
    assert_eq!(p5, "2g.10gb", "{}", read(&out5));
    let (_, holder5) = in_status(&sidecar, &uuid5).expect("job 5's instance in status");
    assert_eq!(holder5, Some(u64::from(job5)));
    assert!(
        (0..2).any(|g| hardware(&emu, g)
            .iter()
            .any(|(p, _, u)| *p == smi_id(2, 2) && u.as_deref() == Some(uuid5.as_str()))),
        "job 5's instance is not on the hardware"
    );
    emu.remove_process(&uuid, 4242).expect("the process ends");
    release(&cluster, job2, &out2);
    release(&cluster, job5, &out5);

    // Reshape: two whole-GPU jobs need both GPUs as 7g.40gb: the idle
    // 3g.20gb goes, and the orphan's slices are free again.
    let (out3, out4) = (shared.join("three.out"), shared.join("four.out"));
    let job3 = cluster.sbatch_as_job_user(&out3, &["--gres=shard:7"], &held_job(&shared));
    let job4 = cluster.sbatch_as_job_user(&out4, &["--gres=shard:7"], &held_job(&shared));
    let (uuid3, p3) = instance_of(&cluster, &out3);
    let (uuid4, p4) = instance_of(&cluster, &out4);
    assert_eq!((p3.as_str(), p4.as_str()), ("7g.40gb", "7g.40gb"));
    let full = smi_id(7, 8);
    let mut whole: Vec<String> = (0..2)
        .flat_map(|g| hardware(&emu, g))
        .map(|(p, start, u)| {
            assert_eq!((p, start), (full, 0), "not a whole GPU instance");
            u.expect("a compute instance")
        })
        .collect();
    whole.sort();
    let mut jobs = vec![uuid3, uuid4];
    jobs.sort();
    assert_eq!(
        whole, jobs,
        "the hardware holds exactly the jobs' instances"
    );
    release(&cluster, job3, &out3);
    release(&cluster, job4, &out4);
    let calls = emu.calls().expect("emulator call counts");
    for call in [
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlComputeInstanceDestroy",
        "nvmlGpuInstanceDestroy",
        "nvmlDeviceGetMigDeviceHandleByIndex",
    ] {
        assert!(
            calls.get(call).copied().unwrap_or(0) > 0,
            "{call} never called: {calls:?}"
        );
    }
    assert!(
        cluster.wait_node_state("idle", Duration::from_secs(30)),
        "node not idle: {}",
        cluster.node_state()
    );
    assert!(
        Sidecar::instances(&sidecar.status())
            .iter()
            .all(|i| i["job_id"].is_null()),
        "{:#}",
        sidecar.status()
    );
}
