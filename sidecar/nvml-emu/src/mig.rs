//! What the emulated driver accepts: profiles, placements, GPU-instance
//! ids, compute instances, and the capability files the driver exposes per
//! instance.
//!
//! A GPU's profile list is the one table's (`smartmig-mig`:
//! [`table_driver_profiles`], the ids, slices, names and placements of
//! `MODELS`) unless a test replaced it ([`crate::Emulator::set_driver_profiles`]),
//! to present a driver that renames a profile or disagrees with the table.
//! What the emulator enforces is the hardware's rule over that list: a GPU
//! instance takes the memory slots of its placement and its compute slices;
//! two may not share a slot, and the compute slices add up to at most the
//! GPU's. Only what the driver adds on top (GPU instance numbering, NVML
//! codes, capability minors) lives here.

use std::ffi::CString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nvml_wrapper_sys::bindings as sys;
use smartmig_mig::driver::table_driver_profiles;
use smartmig_mig::{DriverProfile, GpuModel};

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

/// Streaming multiprocessors per compute slice (A30/A100: 14, H100/H200:
/// 16, B200-class: 18, RTX PRO 6000: 46 of its 188; RTX PRO 5000: assumed
/// 55, half of 110).
fn sms_per_slice(model: GpuModel) -> u32 {
    match model {
        GpuModel::A30_24gb | GpuModel::A100_40gb | GpuModel::A100_80gb => 14,
        GpuModel::H100_80gb | GpuModel::H100_94gb | GpuModel::H200_141gb => 16,
        GpuModel::RtxPro6000_96gb => 46,
        GpuModel::RtxPro5000_48gb => 55,
        _ => 18,
    }
}

/// Usable memory in MiB of a profile named `gb` GB: a little under the
/// name, as the driver reports (`3g.20gb` -> 19968 MiB).
pub fn memory_mib(gb: u32) -> u64 {
    u64::from(gb) * 1024 * 39 / 40
}

/// The profiles the emulated driver of `gpu` offers.
pub fn driver_profiles(gpu: &GpuState) -> Vec<DriverProfile> {
    gpu.driver
        .clone()
        .unwrap_or_else(|| table_driver_profiles(gpu.model, memory_mib))
}

/// The profile at `NVML_GPU_INSTANCE_PROFILE_*` index `index`.
pub fn profile_by_index(gpu: &GpuState, index: u32) -> Result<DriverProfile, Code> {
    if index >= sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    driver_profiles(gpu)
        .into_iter()
        .find(|p| p.index == index)
        .ok_or(NOT_SUPPORTED)
}

/// The profile of driver profile id `id` (`nvidia-smi mig -lgip`).
pub fn profile_by_id(gpu: &GpuState, id: u32) -> Option<DriverProfile> {
    driver_profiles(gpu).into_iter().find(|p| p.id == id)
}

/// The placements the driver offers for `p`: (start, size in memory slots).
pub fn placements(p: &DriverProfile) -> Vec<(u32, u32)> {
    p.placements.clone().unwrap_or_default()
}

/// Memory slots a GPU instance of `p` takes.
fn slots(p: &DriverProfile) -> u32 {
    placements(p).first().map_or(0, |&(_, size)| size)
}

/// `nvmlGpuInstanceProfileInfo_t` of profile `p`.
pub fn profile_info(model: GpuModel, p: &DriverProfile) -> sys::nvmlGpuInstanceProfileInfo_t {
    let compute = p.slices;
    sys::nvmlGpuInstanceProfileInfo_t {
        id: p.id,
        isP2pSupported: 0,
        sliceCount: compute,
        instanceCount: p.instance_count,
        multiprocessorCount: compute * sms_per_slice(model),
        copyEngineCount: compute,
        decoderCount: compute.div_ceil(2),
        encoderCount: 0,
        jpegCount: u32::from(compute == 7),
        ofaCount: u32::from(compute == 7),
        memorySizeMB: p.memory_mib,
    }
}

/// The versioned `nvmlGpuInstanceProfileInfo_v2_t` of `p`: the same, with
/// the driver's name (`MIG 1g.10gb`).
pub fn profile_info_v2(model: GpuModel, p: &DriverProfile) -> sys::nvmlGpuInstanceProfileInfo_v2_t {
    let v1 = profile_info(model, p);
    let mut name = [0 as std::os::raw::c_char; 96];
    let text = format!("MIG {}", p.label());
    for (dst, &b) in name.iter_mut().zip(text.as_bytes().iter().take(95)) {
        *dst = b as std::os::raw::c_char;
    }
    sys::nvmlGpuInstanceProfileInfo_v2_t {
        version: PROFILE_INFO_V2,
        id: v1.id,
        isP2pSupported: v1.isP2pSupported,
        sliceCount: v1.sliceCount,
        instanceCount: v1.instanceCount,
        multiprocessorCount: v1.multiprocessorCount,
        copyEngineCount: v1.copyEngineCount,
        decoderCount: v1.decoderCount,
        encoderCount: v1.encoderCount,
        jpegCount: v1.jpegCount,
        ofaCount: v1.ofaCount,
        memorySizeMB: v1.memorySizeMB,
        name,
    }
}

/// `nvmlGpuInstanceProfileInfo_v2` of nvml.h: the struct's size with the
/// version in the top byte.
pub const PROFILE_INFO_V2: u32 =
    std::mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);

/// The driver's GPU-instance id: the memory slots numbered as a binary
/// tree (8 slots: size 8 -> 0, size 4 -> 1 + start/4, size 2 -> 3 +
/// start/2, size 1 -> 7 + start; the four- and two-slot GPUs alike).
pub fn gi_id(model: GpuModel, start: u32, size: u32) -> u32 {
    smartmig_mig::slot_tree_id(u32::from(model.spec().memory_slices), start, size)
}

/// Memory slots in use (a bit mask) and compute slices in use on `gpu`.
fn occupied(gpu: &GpuState) -> (u32, u32) {
    gpu.instances.iter().fold((0, 0), |(mask, compute), gi| {
        (
            mask | (((1u32 << gi.size) - 1) << gi.start),
            compute + gi_compute(gpu, gi),
        )
    })
}

/// Whether a GPU instance of `p` at `start` fits next to the instances of
/// `gpu`, and `p` is below its instance count.
fn fits(gpu: &GpuState, p: &DriverProfile, start: u32) -> bool {
    let (mask, compute) = occupied(gpu);
    let size = slots(p);
    let want = ((1u32 << size) - 1) << start;
    let same = gpu
        .instances
        .iter()
        .filter(|gi| gi.profile_id == p.id)
        .count() as u32;
    mask & want == 0
        && compute + p.slices <= u32::from(gpu.model.spec().compute_slices)
        && same < p.instance_count
}

/// How many more instances of `p` fit, taking free placements in order.
pub fn remaining_capacity(gpu: &GpuState, p: &DriverProfile) -> u32 {
    let mut g = gpu.clone();
    let mut n = 0;
    for (start, size) in placements(p) {
        if fits(&g, p, start) {
            g.instances.push(GpuInstance {
                id: u32::MAX - n,
                profile_id: p.id,
                start,
                size,
                ci: None,
            });
            n += 1;
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
    let p = profile_by_id(gpu, profile_id).ok_or(INVALID_ARGUMENT)?;
    let offered = placements(&p);
    let start = match placement {
        Some(wanted) => {
            if !offered.contains(&wanted) {
                return Err(INVALID_ARGUMENT);
            }
            if !fits(gpu, &p, wanted.0) {
                return Err(INSUFFICIENT_RESOURCES);
            }
            wanted.0
        }
        None => offered
            .iter()
            .find(|&&(s, _)| fits(gpu, &p, s))
            .map(|&(s, _)| s)
            .ok_or(INSUFFICIENT_RESOURCES)?,
    };
    let size = slots(&p);
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

/// The full-size `NVML_COMPUTE_INSTANCE_PROFILE_*` index of a GPU instance
/// of `slices` compute slices (the inverse of [`ci_slices`]).
pub fn ci_profile_of(slices: u32) -> Option<u32> {
    Some(match slices {
        1 => sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        7 => sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        _ => return None,
    })
}

/// Compute slices of GPU instance `gi` of `gpu`.
pub fn gi_compute(gpu: &GpuState, gi: &GpuInstance) -> u32 {
    profile_by_id(gpu, gi.profile_id).map_or(0, |p| p.slices)
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
    let gpu = &state.gpus[index as usize];
    let i = gpu
        .instances
        .iter()
        .position(|gi| gi.id == gi_id)
        .ok_or(INVALID_ARGUMENT)?;
    let gi = &gpu.instances[i];
    let slices = ci_profile_info(gpu.model, profile, gi_compute(gpu, gi))?.sliceCount;
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
        let state = State::new(&[(GpuModel::A30_24gb, true, true)]);
        let g = &state.gpus[0];
        assert_eq!(profile_by_index(g, 99), Err(INVALID_ARGUMENT));
        // 3_SLICE exists in NVML but not on the A30.
        assert_eq!(
            profile_by_index(g, sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE),
            Err(NOT_SUPPORTED)
        );
        assert!(profile_by_index(g, sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE).is_ok());
    }

    #[test]
    fn the_versioned_info_carries_the_name() {
        let state = State::new(&[(GpuModel::Gb300_288gb, true, true)]);
        let p = profile_by_id(&state.gpus[0], 9).unwrap();
        let info = profile_info_v2(GpuModel::Gb300_288gb, &p);
        let name: Vec<u8> = info
            .name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        assert_eq!(String::from_utf8(name).unwrap(), "MIG 3g.139gb");
        assert_eq!(info.version >> 24, 2);
        assert_eq!(info.sliceCount, 3);
    }

    /// The +me variant of an eight-slice GPU: one per GPU, on a 1g slot.
    #[test]
    fn variants_follow_their_instance_count() {
        let dir = std::env::temp_dir().join(format!("emu-mig-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("nvidia-caps")).unwrap();
        let mut state = State::new(&[(GpuModel::B200_180gb, true, true)]);
        assert_eq!(create_gi(&dir, &mut state, 0, 20, Some((6, 1))), Ok(13));
        assert_eq!(
            create_gi(&dir, &mut state, 0, 20, Some((5, 1))),
            Err(INSUFFICIENT_RESOURCES)
        );
        assert_eq!(create_gi(&dir, &mut state, 0, 19, Some((5, 1))), Ok(12));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
