//! What the emulated driver accepts, straight from the one MIG table
//! (`smartmig-mig`): profiles, placements, GPU-instance ids, compute
//! instances, and the capability files the driver exposes per instance.
//!
//! Nothing here is copied from the table: profile ids, starts, sizes and
//! the fit rule (`Geometry::fits`) are the table's, so the emulator and the
//! scheduler cannot drift apart; only what the driver adds on top (GPU
//! instance numbering, NVML codes, capability minors) lives here.

use std::ffi::CString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nvml_wrapper_sys::bindings as sys;
use smartmig_mig::{Geometry, GpuModel, Layout, ProfileSpec};

use crate::state::{ComputeInstance, GpuInstance, GpuState, State};

/// An NVML return code.
pub type Code = sys::nvmlReturn_t;

pub const SUCCESS: Code = sys::nvmlReturn_enum_NVML_SUCCESS;
pub const INVALID_ARGUMENT: Code = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub const NOT_SUPPORTED: Code = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub const NOT_FOUND: Code = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub const INSUFFICIENT_RESOURCES: Code = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
pub const IN_USE: Code = sys::nvmlReturn_enum_NVML_ERROR_IN_USE;
pub const UNKNOWN: Code = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// The NVML device name of `model`: one of the table's own `nvml_names`,
/// so `GpuModel::from_nvml_name` maps it back.
pub fn device_name(model: GpuModel) -> String {
    let name = model.spec().nvml_names.first().copied().unwrap_or("GPU");
    format!("NVIDIA {name}")
}

/// Streaming multiprocessors per compute slice (A30/A100: 14, H100/H200: 16).
fn sms_per_slice(model: GpuModel) -> u32 {
    match model {
        GpuModel::A30_24gb | GpuModel::A100_40gb | GpuModel::A100_80gb => 14,
        _ => 16,
    }
}

/// Usable memory of a profile in MiB: a little under its name's GB, as the
/// driver reports (`3g.20gb` -> 19968 MiB).
pub fn memory_mib(p: &ProfileSpec) -> u64 {
    u64::from(p.memory_gb) * 1024 * 39 / 40
}

/// The profile of `NVML_GPU_INSTANCE_PROFILE_*` index `index`.
pub fn profile_by_index(model: GpuModel, index: u32) -> Result<&'static ProfileSpec, Code> {
    if index >= sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    model
        .spec()
        .profiles
        .iter()
        .find(|p| p.nvml_profile == index)
        .ok_or(NOT_SUPPORTED)
}

/// The profile of driver profile id `id` (`nvidia-smi mig -lgip`).
pub fn profile_by_id(model: GpuModel, id: u32) -> Option<&'static ProfileSpec> {
    model.spec().profiles.iter().find(|p| p.smi_id == id)
}

/// `nvmlGpuInstanceProfileInfo_t` of profile `p`.
pub fn profile_info(model: GpuModel, p: &ProfileSpec) -> sys::nvmlGpuInstanceProfileInfo_t {
    let compute = u32::from(p.shape.compute);
    sys::nvmlGpuInstanceProfileInfo_t {
        id: p.smi_id,
        isP2pSupported: 0,
        sliceCount: compute,
        instanceCount: p.starts.len() as u32,
        multiprocessorCount: compute * sms_per_slice(model),
        copyEngineCount: compute,
        decoderCount: compute.div_ceil(2),
        encoderCount: 0,
        jpegCount: u32::from(compute == 7),
        ofaCount: u32::from(compute == 7),
        memorySizeMB: memory_mib(p),
    }
}

/// The placements the driver offers for `p`: (start, size in memory slots).
pub fn placements(p: &ProfileSpec) -> Vec<(u32, u32)> {
    p.starts
        .iter()
        .map(|&s| (u32::from(s), u32::from(p.shape.memory)))
        .collect()
}

/// The driver's GPU-instance id: the memory slots numbered as a binary
/// tree (8 slots: size 8 -> 0, size 4 -> 1 + start/4, size 2 -> 3 +
/// start/2, size 1 -> 7 + start; the A30's 4 slots alike).
pub fn gi_id(model: GpuModel, start: u32, size: u32) -> u32 {
    smartmig_mig::slot_tree_id(u32::from(model.spec().memory_slices), start, size)
}

/// The current layout of `gpu`, in the table's terms.
pub fn layout(gpu: &GpuState) -> Layout {
    let geometry = Geometry::of(gpu.model);
    gpu.instances
        .iter()
        .filter_map(|gi| {
            let p = profile_by_id(gpu.model, gi.profile_id)?;
            geometry.placement_id(p.shape, u8::try_from(gi.start).ok()?)
        })
        .collect()
}

/// How many more instances of `p` fit, taking free placements greedily.
pub fn remaining_capacity(gpu: &GpuState, p: &ProfileSpec) -> u32 {
    let geometry = Geometry::of(gpu.model);
    let mut l = layout(gpu);
    let mut n = 0;
    for &s in p.starts {
        if let Some(id) = geometry.placement_id(p.shape, s) {
            if geometry.fits(l, id) {
                l = l.with(id);
                n += 1;
            }
        }
    }
    n
}

/// Creates a GPU instance of profile id `profile_id` on GPU `index`, at
/// `placement` (start, size) or at the first free one, and its capability
/// file; returns its id. The caller checked the GPU exists.
pub fn create_gi(
    dir: &Path,
    state: &mut State,
    index: u32,
    profile_id: u32,
    placement: Option<(u32, u32)>,
) -> Result<u32, Code> {
    let gpu = &mut state.gpus[index as usize];
    if !gpu.mig_current {
        return Err(NOT_SUPPORTED);
    }
    let p = profile_by_id(gpu.model, profile_id).ok_or(INVALID_ARGUMENT)?;
    let geometry = Geometry::of(gpu.model);
    let current = layout(gpu);
    let start = match placement {
        Some((start, size)) => {
            if size != u32::from(p.shape.memory) {
                return Err(INVALID_ARGUMENT);
            }
            let id = u8::try_from(start)
                .ok()
                .and_then(|s| geometry.placement_id(p.shape, s))
                .ok_or(INVALID_ARGUMENT)?;
            if !geometry.fits(current, id) {
                return Err(INSUFFICIENT_RESOURCES);
            }
            start
        }
        None => p
            .starts
            .iter()
            .find(|&&s| {
                geometry
                    .placement_id(p.shape, s)
                    .is_some_and(|id| geometry.fits(current, id))
            })
            .map(|&s| u32::from(s))
            .ok_or(INSUFFICIENT_RESOURCES)?,
    };
    let size = u32::from(p.shape.memory);
    let id = gi_id(gpu.model, start, size);
    write_cap(dir, index, id, None).map_err(|e| io_failed("capability file", &e))?;
    gpu.instances.push(GpuInstance {
        id,
        profile_id,
        start,
        size,
        ci: None,
    });
    gpu.instances.sort_by_key(|gi| gi.id);
    Ok(id)
}

/// Compute slices of `NVML_COMPUTE_INSTANCE_PROFILE_*` index `profile`
/// (the emulator's compute-instance profile ids equal the indices, as the
/// driver's do for the shared-engine profiles).
pub fn ci_slices(profile: u32) -> Result<u32, Code> {
    Ok(match profile {
        sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE => 1,
        sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE => 2,
        sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE => 3,
        sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE => 4,
        sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE => 7,
        p if p < sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT => return Err(NOT_SUPPORTED),
        _ => return Err(INVALID_ARGUMENT),
    })
}

/// Compute slices of GPU instance `gi` of a `model` GPU.
pub fn gi_compute(model: GpuModel, gi: &GpuInstance) -> u32 {
    profile_by_id(model, gi.profile_id).map_or(0, |p| u32::from(p.shape.compute))
}

/// `nvmlComputeInstanceProfileInfo_t` of a compute-instance profile of
/// `slices` inside a GPU instance of `gi_slices` (NOT_SUPPORTED if larger).
pub fn ci_profile_info(
    model: GpuModel,
    profile: u32,
    gi_slices: u32,
) -> Result<sys::nvmlComputeInstanceProfileInfo_t, Code> {
    let slices = ci_slices(profile)?;
    if slices > gi_slices {
        return Err(NOT_SUPPORTED);
    }
    Ok(sys::nvmlComputeInstanceProfileInfo_t {
        id: profile,
        sliceCount: slices,
        instanceCount: gi_slices / slices,
        multiprocessorCount: slices * sms_per_slice(model),
        sharedCopyEngineCount: gi_slices,
        sharedDecoderCount: gi_slices.div_ceil(2),
        sharedEncoderCount: 0,
        sharedJpegCount: 0,
        sharedOfaCount: 0,
    })
}

/// Creates the compute instance of GPU instance `gi_id` (one per GPU
/// instance), its UUID and capability file; returns its id.
pub fn create_ci(
    dir: &Path,
    state: &mut State,
    index: u32,
    gi_id: u32,
    profile: u32,
) -> Result<u32, Code> {
    let model = state.gpus[index as usize].model;
    let find = |gpu: &GpuState| gpu.instances.iter().position(|gi| gi.id == gi_id);
    let i = find(&state.gpus[index as usize]).ok_or(INVALID_ARGUMENT)?;
    let gi = &state.gpus[index as usize].instances[i];
    let slices = ci_profile_info(model, profile, gi_compute(model, gi))?.sliceCount;
    if gi.ci.is_some() {
        return Err(INSUFFICIENT_RESOURCES);
    }
    write_cap(dir, index, gi_id, Some(0)).map_err(|e| io_failed("capability file", &e))?;
    let uuid = state.new_mig_uuid();
    state.gpus[index as usize].instances[i].ci = Some(ComputeInstance {
        id: 0,
        profile_id: profile,
        slices,
        uuid,
        processes: Vec::new(),
    });
    Ok(0)
}

/// Destroys compute instance `ci` of GPU instance `gi` (IN_USE while a
/// process runs on it).
pub fn destroy_ci(
    dir: &Path,
    gpu: &mut GpuState,
    index: u32,
    gi: u32,
    ci: u32,
) -> Result<(), Code> {
    let g = gpu
        .instances
        .iter_mut()
        .find(|g| g.id == gi)
        .ok_or(INVALID_ARGUMENT)?;
    match &g.ci {
        Some(c) if c.id == ci => {
            if !c.processes.is_empty() {
                return Err(IN_USE);
            }
        }
        _ => return Err(INVALID_ARGUMENT),
    }
    g.ci = None;
    remove_cap(dir, index, gi, Some(ci)).map_err(|e| io_failed("capability file", &e))
}

/// Destroys GPU instance `gi` (IN_USE while it has a compute instance).
pub fn destroy_gi(dir: &Path, gpu: &mut GpuState, index: u32, gi: u32) -> Result<(), Code> {
    let i = gpu
        .instances
        .iter()
        .position(|g| g.id == gi)
        .ok_or(INVALID_ARGUMENT)?;
    if gpu.instances[i].ci.is_some() {
        return Err(IN_USE);
    }
    gpu.instances.remove(i);
    remove_cap(dir, index, gi, None).map_err(|e| io_failed("capability file", &e))
}

/// The MIG devices of `gpu` as (GPU instance, compute instance), in order.
pub fn mig_devices(gpu: &GpuState) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = gpu
        .instances
        .iter()
        .filter_map(|gi| gi.ci.as_ref().map(|ci| (gi.id, ci.id)))
        .collect();
    v.sort_unstable();
    v
}

fn io_failed(what: &str, e: &io::Error) -> Code {
    eprintln!("smartmig-nvml-emu: {what}: {e}");
    UNKNOWN
}

/// `DeviceFileMinor` of a GPU instance's (`ci` None) or compute instance's
/// capability: distinct for every GPU, GPU instance and compute instance.
pub fn cap_minor(gpu: u32, gi: u32, ci: Option<u32>) -> u32 {
    (gpu + 1) * 256 + gi * 16 + ci.map_or(0, |c| c + 1)
}

/// The driver's `access` file of an instance's capability.
pub fn access_file(dir: &Path, gpu: u32, gi: u32, ci: Option<u32>) -> PathBuf {
    let base = dir.join(format!("capabilities/gpu{gpu}/mig/gi{gi}"));
    match ci {
        Some(c) => base.join(format!("ci{c}/access")),
        None => base.join("access"),
    }
}

/// The capability device file `nvidia-cap<M>`.
pub fn cap_device(dir: &Path, minor: u32) -> PathBuf {
    dir.join(format!("nvidia-caps/nvidia-cap{minor}"))
}

/// Writes an instance's `access` file and makes its device file, as the
/// driver does: a character device (1:3) when root may mknod, a plain file
/// otherwise; mode 0444.
fn write_cap(dir: &Path, gpu: u32, gi: u32, ci: Option<u32>) -> io::Result<()> {
    let m = cap_minor(gpu, gi, ci);
    let access = access_file(dir, gpu, gi, ci);
    if let Some(parent) = access.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(
        &access,
        format!("DeviceFileMinor: {m}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
    )?;
    let dev = cap_device(dir, m);
    match std::fs::remove_file(&dev) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let c_path = CString::new(dev.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a NUL-terminated path that outlives the call.
    let made = unsafe { libc::mknod(c_path.as_ptr(), libc::S_IFCHR | 0o444, libc::makedev(1, 3)) };
    if made != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EPERM) {
            return Err(err);
        }
        std::fs::File::create(&dev)?;
    }
    std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o444))
}

fn remove_cap(dir: &Path, gpu: u32, gi: u32, ci: Option<u32>) -> io::Result<()> {
    let access = access_file(dir, gpu, gi, ci);
    let ignore_missing = |r: io::Result<()>| match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    if let Some(parent) = access.parent() {
        ignore_missing(std::fs::remove_dir_all(parent))?;
    }
    ignore_missing(std::fs::remove_file(cap_device(
        dir,
        cap_minor(gpu, gi, ci),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_instance_ids_follow_the_slot_tree() {
        let m = GpuModel::A100_40gb;
        assert_eq!(gi_id(m, 0, 8), 0);
        assert_eq!((gi_id(m, 0, 4), gi_id(m, 4, 4)), (1, 2));
        assert_eq!((gi_id(m, 0, 2), gi_id(m, 6, 2)), (3, 6));
        assert_eq!((gi_id(m, 0, 1), gi_id(m, 6, 1)), (7, 13));
        let a30 = GpuModel::A30_24gb;
        assert_eq!(
            (gi_id(a30, 0, 4), gi_id(a30, 2, 2), gi_id(a30, 3, 1)),
            (0, 2, 6)
        );
    }

    #[test]
    fn capability_minors_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for gpu in 0..4 {
            for gi in 0..15 {
                assert!(seen.insert(cap_minor(gpu, gi, None)));
                for ci in 0..8 {
                    assert!(seen.insert(cap_minor(gpu, gi, Some(ci))));
                }
            }
        }
    }

    #[test]
    fn profile_indices_outside_nvml_are_invalid() {
        let m = GpuModel::A30_24gb;
        assert_eq!(profile_by_index(m, 99), Err(INVALID_ARGUMENT));
        // 3_SLICE exists in NVML but not on the A30.
        assert_eq!(
            profile_by_index(m, sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE),
            Err(NOT_SUPPORTED)
        );
        assert!(profile_by_index(m, sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE).is_ok());
    }
}
