//! Set-up shared by the end-to-end tests that run smartmigd's nvml backend
//! over the NVML emulator (the emulator crate is a dev-dependency, so this
//! lives here rather than in the suite's library), the held jobs those
//! tests submit, and `smartmig doctor --json` on a test cluster.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use smartmig_suite::{artifact, describe, fields, in_slurm, SlurmCluster, Wait};

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

/// `smartmig doctor --json` on `cluster`'s config and slurm.conf: its
/// checks, and the run itself (for [`describe`] and the exit status).
pub fn doctor(cluster: &SlurmCluster) -> (Vec<Value>, Output) {
    let out = in_slurm(artifact("smartmig"))
        .arg("doctor")
        .arg("--config")
        .arg(cluster.dir().join("smartmigd.toml"))
        .arg("--slurm-conf")
        .arg(cluster.slurm_conf())
        .arg("--json")
        .output()
        .expect("run smartmig doctor");
    let checks = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json is not a JSON array ({e}): {}",
            describe(&out)
        )
    });
    (checks, out)
}

/// Doctor's check `name` among `checks`.
pub fn check<'a>(checks: &'a [Value], name: &str) -> &'a Value {
    checks
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {checks:#?}"))
}
