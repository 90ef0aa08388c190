//! A read-only survey of the node's GPUs through NVML, for `smartmig doctor`.
//!
//! Unlike [`super::nvml::NvmlBackend::open`], which refuses a GPU with MIG
//! mode off and destroys GPU instances left without a compute instance,
//! [`survey`] changes nothing and fails only when the library cannot be
//! loaded: every other answer (or refusal) of the driver is recorded per
//! GPU as plain data, so the caller can say what is wrong with each.
//!
//! What it asks, per GPU: name, minor number, MIG mode (current and
//! pending); every GPU-instance profile the driver offers (the backend's
//! own [`super::nvml::driver_profiles`]: id, compute slices, memory, name
//! and possible placements at each NVML profile index), matched with the
//! table ([`crate::mig::match_driver`]) exactly as the backend matches them
//! at start; with MIG mode on, the GPU instances that exist
//! (`nvmlDeviceGetGpuInstances` per profile id) with how many compute
//! instances each has (through the MIG device handles). A symbol the
//! library does not export is reported as `NotSupported`, never called.

use std::path::PathBuf;

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as sys;

use super::nvml::{driver_profiles, load, missing_symbol, nvml_err};
use super::BackendError;
use crate::config::NvmlConfig;
use crate::mig::{match_driver, DriverMatch, DriverProfile, GpuModel};

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
    /// Every profile the driver offers, by NVML index (empty: it offers
    /// none, as some drivers answer with MIG mode off).
    pub driver: Result<Vec<DriverProfile>, BackendError>,
    /// The driver's profiles against the model's row of the table; `None`
    /// when the model is unknown or the driver could not be asked.
    pub matched: Option<DriverMatch>,
    /// The GPU instances that exist; `Ok(empty)` when MIG mode is off.
    pub instances: Result<Vec<GpuInstanceSurvey>, BackendError>,
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

    /// Whether the driver described any profile (some answer only with
    /// MIG mode on).
    pub fn driver_answered(&self) -> bool {
        matches!(&self.driver, Ok(list) if !list.is_empty())
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
                driver: Err(err.clone()),
                matched: None,
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
    // SAFETY: a live handle of this library.
    let driver = unsafe { driver_profiles(nvml, handle, index) };
    let matched = match (model, &driver) {
        (Some(model), Ok(list)) if !list.is_empty() => Some(match_driver(model, list)),
        _ => None,
    };
    let instances = if mig_on {
        let ids: Vec<u32> = driver
            .as_ref()
            .map(|list| list.iter().map(|p| p.id).collect())
            .unwrap_or_default();
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
        driver,
        matched,
        instances,
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
            return Err(missing_symbol(gpu, symbol));
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
            return Err(missing_symbol(gpu, symbol));
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
