//! Set-up shared by the end-to-end tests that run smartmigd's nvml backend
//! over the NVML emulator (the emulator crate is a dev-dependency, so this
//! lives here rather than in the suite's library).

use std::path::{Path, PathBuf};

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
