//! A read-only survey of the node's GPUs through NVML, for `smartmig doctor`.
//!
//! Unlike [`super::nvml::NvmlBackend::open`], which refuses a GPU with MIG
//! mode off and destroys GPU instances left without a compute instance,
//! [`survey`] changes nothing and fails only when the library cannot be
//! loaded: every other answer (or refusal) of the driver is recorded per
//! GPU as plain data, so the caller can say what is wrong with each.
//!
//! What it asks, per GPU: name, minor number, MIG mode (current and
//! pending); with MIG mode on, for each profile of the table
//! ([`crate::mig::models`]) the driver's profile id
//! (`nvmlDeviceGetGpuInstanceProfileInfo`) and its possible placements
//! (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`), and the GPU instances
//! that exist (`nvmlDeviceGetGpuInstances` per profile id) with how many
//! compute instances each has (through the MIG device handles). A symbol
//! the library does not export is reported as `NotSupported`, never called.

use std::os::raw::c_uint;
use std::path::PathBuf;

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as sys;

use super::nvml::{load, map_return, nvml_err};
use super::BackendError;
use crate::config::NvmlConfig;
use crate::mig::{GpuModel, ProfileSpec};

/// What NVML says about the node.
#[derive(Clone, Debug, PartialEq)]
pub struct Survey {
    /// The library that was loaded (`[nvml] library`).
    pub library: PathBuf,
    /// `nvmlSystemGetDriverVersion`, e.g. `550.54.15`.
    pub driver_version: Result<String, BackendError>,
    /// `nvmlSystemGetNVMLVersion`, e.g. `12.550.54.15`.
    pub nvml_version: Result<String, BackendError>,
    /// `nvmlSystemGetCudaDriverVersion`, e.g. 12040 for CUDA 12.4.
    pub cuda_driver_version: Result<i32, BackendError>,
    /// `nvmlDeviceGetCount` failed: no GPU could be surveyed.
    pub device_count_error: Option<BackendError>,
    pub gpus: Vec<GpuSurvey>,
}

/// Current and pending MIG mode of a GPU (true: enabled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigModes {
    pub current: bool,
    /// The mode after the next GPU reset.
    pub pending: bool,
}

/// One GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSurvey {
    pub index: u32,
    /// `nvmlDeviceGetName`.
    pub name: Result<String, BackendError>,
    /// The model of the table the name maps to ([`GpuModel::from_nvml_name`]).
    pub model: Option<GpuModel>,
    /// `nvmlDeviceGetMinorNumber`: the N of `/dev/nvidiaN`.
    pub minor: Result<u32, BackendError>,
    pub mig: Result<MigModes, BackendError>,
    /// One entry per profile of the model's table; empty when the model is
    /// unknown or MIG mode is off.
    pub profiles: Vec<ProfileSurvey>,
    /// The GPU instances that exist; `Ok(empty)` when MIG mode is off.
    pub instances: Result<Vec<GpuInstanceSurvey>, BackendError>,
}

/// One profile of the table, as the driver sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileSurvey {
    pub spec: &'static ProfileSpec,
    /// `nvmlGpuInstanceProfileInfo_t.id` (the table expects `spec.smi_id`).
    pub driver_id: Result<u32, BackendError>,
    /// The instance memory the driver reports (`memorySizeMB`, MiB); the
    /// profile's name rounds it up (an H200's 1g.18gb has 16,384 MiB).
    pub memory_mib: Option<u64>,
    /// Possible placements as (start, size) in memory slices, in the
    /// driver's order.
    pub placements: Result<Vec<(u32, u32)>, BackendError>,
}

/// A GPU instance that exists on a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInstanceSurvey {
    /// The GPU instance id (`nvidia-smi mig -lgi`).
    pub id: u32,
    /// Its profile id.
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    /// UUIDs of its MIG devices (one per compute instance); empty: a GPU
    /// instance without a compute instance.
    pub mig_uuids: Vec<String>,
}

impl GpuSurvey {
    /// Whether MIG mode is on now (false when it could not be read).
    pub fn mig_on(&self) -> bool {
        matches!(self.mig, Ok(m) if m.current)
    }
}

/// Loads the library `config` names and asks the driver what it has,
/// changing nothing. Fails only when the library cannot be loaded or
/// initialised.
pub fn survey(config: &NvmlConfig) -> Result<Survey, BackendError> {
    let nvml = load(config)?;
    let (count, device_count_error) = match nvml.device_count() {
        Ok(n) => (n, None),
        Err(e) => (0, Some(nvml_err(0, "device count", e))),
    };
    let gpus = (0..count).map(|i| survey_gpu(&nvml, i)).collect();
    Ok(Survey {
        library: config.library.clone(),
        driver_version: nvml
            .sys_driver_version()
            .map_err(|e| nvml_err(0, "driver version", e)),
        nvml_version: nvml
            .sys_nvml_version()
            .map_err(|e| nvml_err(0, "NVML version", e)),
        cuda_driver_version: nvml
            .sys_cuda_driver_version()
            .map_err(|e| nvml_err(0, "CUDA driver version", e)),
        device_count_error,
        gpus,
    })
}

/// `12040` -> `12.4`.
pub fn cuda_version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

fn missing(gpu: u32, symbol: &str) -> BackendError {
    BackendError::NotSupported {
        gpu,
        what: format!("{symbol} (not exported by the NVML library)"),
    }
}

fn survey_gpu(nvml: &Nvml, index: u32) -> GpuSurvey {
    let device = match nvml.device_by_index(index) {
        Ok(d) => d,
        Err(e) => {
            let err = nvml_err(index, "device handle", e);
            return GpuSurvey {
                index,
                name: Err(err.clone()),
                model: None,
                minor: Err(err.clone()),
                mig: Err(err.clone()),
                profiles: Vec::new(),
                instances: Err(err),
            };
        }
    };
    let name = device.name().map_err(|e| nvml_err(index, "device name", e));
    let model = name.as_deref().ok().and_then(GpuModel::from_nvml_name);
    let minor = device
        .minor_number()
        .map_err(|e| nvml_err(index, "minor number", e));
    let mig = device
        .mig_mode()
        .map(|m| MigModes {
            current: m.current == sys::NVML_DEVICE_MIG_ENABLE,
            pending: m.pending == sys::NVML_DEVICE_MIG_ENABLE,
        })
        .map_err(|e| nvml_err(index, "MIG mode", e));
    let mig_on = matches!(mig, Ok(m) if m.current);
    // SAFETY: the handle lives as long as `nvml`, which outlives this call.
    let handle = unsafe { device.handle() };
    // The driver answers profile and placement queries with MIG mode off
    // too (nvml.h: placements "regardless of whether MIG is enabled";
    // seen on an H200 with driver 580), so doctor can compare the table
    // before the admin turns MIG on.
    let profiles = match model {
        Some(model) => model
            .spec()
            .profiles
            .iter()
            .map(|p| survey_profile(nvml, handle, index, p))
            .collect(),
        _ => Vec::new(),
    };
    let instances = if mig_on {
        let ids: Vec<u32> = profiles
            .iter()
            .filter_map(|p| p.driver_id.as_ref().ok().copied())
            .collect();
        gpu_instances(nvml, handle, index, &ids)
    } else {
        Ok(Vec::new())
    };
    GpuSurvey {
        index,
        name,
        model,
        minor,
        mig,
        profiles,
        instances,
    }
}

fn survey_profile(
    nvml: &Nvml,
    device: sys::nvmlDevice_t,
    gpu: u32,
    spec: &'static ProfileSpec,
) -> ProfileSurvey {
    let lib = nvml.lib();
    let driver_id = if lib.nvmlDeviceGetGpuInstanceProfileInfo.is_err() {
        Err(missing(gpu, "nvmlDeviceGetGpuInstanceProfileInfo"))
    } else {
        // SAFETY: zeroed plain C struct as out-pointer.
        let mut info: sys::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: live device handle and a valid out-pointer; the symbol exists.
        let code = unsafe {
            lib.nvmlDeviceGetGpuInstanceProfileInfo(device, spec.nvml_profile, &mut info)
        };
        map_return(code, gpu, &format!("profile info of {}", spec.name()))
            .map(|()| (info.id, info.memorySizeMB))
    };
    let memory_mib = driver_id.as_ref().ok().map(|&(_, mib)| mib);
    let driver_id = driver_id.map(|(id, _)| id);
    let placements = match &driver_id {
        Err(e) => Err(e.clone()),
        Ok(_) if lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.is_err() => Err(missing(
            gpu,
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        )),
        Ok(id) => {
            let mut buf = [sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 16];
            let mut count = buf.len() as c_uint;
            // SAFETY: live handle; the buffer holds `count` placements.
            let code = unsafe {
                lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                    device,
                    *id,
                    buf.as_mut_ptr(),
                    &mut count,
                )
            };
            map_return(
                code,
                gpu,
                &format!("possible placements of {}", spec.name()),
            )
            .map(|()| {
                buf.iter()
                    .take(count as usize)
                    .map(|p| (p.start, p.size))
                    .collect()
            })
        }
    };
    ProfileSurvey {
        spec,
        driver_id,
        memory_mib,
        placements,
    }
}

/// Every GPU instance of the profile ids `ids`, with the MIG devices
/// (compute instances) each has.
fn gpu_instances(
    nvml: &Nvml,
    device: sys::nvmlDevice_t,
    gpu: u32,
    ids: &[u32],
) -> Result<Vec<GpuInstanceSurvey>, BackendError> {
    let lib = nvml.lib();
    for (ok, symbol) in [
        (
            lib.nvmlDeviceGetGpuInstances.is_ok(),
            "nvmlDeviceGetGpuInstances",
        ),
        (lib.nvmlGpuInstanceGetInfo.is_ok(), "nvmlGpuInstanceGetInfo"),
    ] {
        if !ok {
            return Err(missing(gpu, symbol));
        }
    }
    let devices = mig_devices(nvml, device, gpu)?;
    // SAFETY: the symbols it calls exist (checked above) and `device` is a
    // live handle of this library.
    let instances = unsafe { super::nvml::gpu_instances(nvml, device, gpu, ids)? };
    let mut out: Vec<GpuInstanceSurvey> = instances
        .into_iter()
        .map(|(_, info)| GpuInstanceSurvey {
            id: info.id,
            profile_id: info.profileId,
            start: info.placement.start,
            size: info.placement.size,
            mig_uuids: devices
                .iter()
                .filter(|(_, gi_id)| *gi_id == info.id)
                .map(|(u, _)| u.clone())
                .collect(),
        })
        .collect();
    out.sort_by_key(|i| (i.start, i.id));
    Ok(out)
}

/// Every MIG device of a GPU: (uuid, GPU instance id).
fn mig_devices(
    nvml: &Nvml,
    device: sys::nvmlDevice_t,
    gpu: u32,
) -> Result<Vec<(String, u32)>, BackendError> {
    let lib = nvml.lib();
    for (ok, symbol) in [
        (
            lib.nvmlDeviceGetMaxMigDeviceCount.is_ok(),
            "nvmlDeviceGetMaxMigDeviceCount",
        ),
        (
            lib.nvmlDeviceGetMigDeviceHandleByIndex.is_ok(),
            "nvmlDeviceGetMigDeviceHandleByIndex",
        ),
        (
            lib.nvmlDeviceGetGpuInstanceId.is_ok(),
            "nvmlDeviceGetGpuInstanceId",
        ),
        (
            lib.nvmlDeviceGetComputeInstanceId.is_ok(),
            "nvmlDeviceGetComputeInstanceId",
        ),
        (lib.nvmlDeviceGetUUID.is_ok(), "nvmlDeviceGetUUID"),
    ] {
        if !ok {
            return Err(missing(gpu, symbol));
        }
    }
    // SAFETY: every symbol it calls exists (checked above) and `device`
    // is a live handle of this library.
    let devices = unsafe { super::nvml::mig_devices(nvml, device, gpu)? };
    Ok(devices
        .into_iter()
        .map(|(uuid, gi, _)| (uuid, gi))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions_read_as_major_minor() {
        assert_eq!(cuda_version_text(12040), "12.4");
        assert_eq!(cuda_version_text(11080), "11.8");
    }

    #[test]
    fn a_missing_library_is_the_only_failure() {
        let config = NvmlConfig {
            library: PathBuf::from("/nonexistent/libnvidia-ml.so.1"),
            ..NvmlConfig::default()
        };
        match survey(&config) {
            Err(BackendError::LibraryNotFound(_)) => {}
            other => panic!("{other:?}"),
        }
    }
}
