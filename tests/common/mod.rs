//! Set-up shared by the end-to-end tests that run smartmigd's nvml backend
//! over the NVML emulator (the emulator crate is a dev-dependency, so this
//! lives here rather than in the suite's library), and the held jobs
//! those tests submit.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use smartmig_suite::{fields, SlurmCluster, Wait};

use smartmig_mig::GpuModel;
use smartmig_nvml_emu::{Emulator, GpuSetup};

/// Two emulated A100-40GB in MIG mode, in `<dir>/nvml-emu` (the directory
/// `SidecarBackend::NvmlEmulator` is then given), and that directory.
pub fn two_a100s(dir: &Path) -> (PathBuf, Emulator) {
    let emu_dir = dir.join("nvml-emu");
    let emu = Emulator::create(
        &emu_dir,
        &[
            GpuSetup::mig(GpuModel::A100_40gb),
            GpuSetup::mig(GpuModel::A100_40gb),
        ],
    )
    .expect("create the emulator's GPUs");
    (emu_dir, emu)
}

/// How long a held job may take to start or to end.
pub const HELD_JOB_TIMEOUT: Duration = Duration::from_secs(90);

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A job that prints what it got, then waits for `GO/go.<job id>`.
pub fn held_job(go: &Path) -> String {
    format!(
        "echo CVD=$CUDA_VISIBLE_DEVICES PROFILE=$SMARTMIG_PROFILE; \
         for i in $(seq 900); do [ -e {g}/go.$SLURM_JOB_ID ] && break; sleep 0.1; done",
        g = go.display()
    )
}

/// Waits until `out` names the instance the job got; returns (uuid, profile).
pub fn instance_of(cluster: &SlurmCluster, out: &Path) -> (String, String) {
    Wait::new(
        format!("{} to name an instance", out.display()),
        HELD_JOB_TIMEOUT,
    )
    .context(|| cluster.log_tails())
    .until(|| {
        let text = read(out);
        let f = fields(&text);
        match (f.get("CVD"), f.get("PROFILE")) {
            (Some(cvd), Some(profile)) => Ok((cvd.clone(), profile.clone())),
            _ => Err(text),
        }
    })
}

/// Lets held job `job` end and checks that it completed.
pub fn release(cluster: &SlurmCluster, job: u32, out: &Path) {
    std::fs::write(cluster.shared_dir().join(format!("go.{job}")), b"").expect("write go file");
    let state = cluster.wait_job(job, HELD_JOB_TIMEOUT);
    assert_eq!(
        state,
        "COMPLETED",
        "job {job}: {}\n{}",
        read(out),
        cluster.log_tails()
    );
}
