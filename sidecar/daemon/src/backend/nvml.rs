//! Real GPUs through NVML.
//!
//! Queries go through `nvml-wrapper`; creating and destroying instances goes
//! through its raw `nvml-wrapper-sys` functions (`Nvml::lib()`), which the
//! safe wrapper does not cover. At start the backend reads every profile the
//! driver offers ([`driver_profiles`]: id, compute slices, memory, name and
//! possible placements at each `NVML_GPU_INSTANCE_PROFILE_*` index) and
//! matches them with [`crate::mig::models`] by index, id and slices
//! ([`crate::mig::match_driver`]): a GPU whose driver differs is refused,
//! naming the differences, never guessed at; a profile the driver merely
//! renames (GB300's `3g.139gb` as `3g.126gb`) is used under the driver's
//! name. Instances are created with an explicit placement to avoid order
//! failures.
//!
//! The daemon never toggles MIG mode (it needs a GPU reset on A100/A30): a
//! GPU with MIG mode off stops the daemon with a message naming it.
//!
//! GPU instances without a compute instance (a crash between the two
//! creates) are destroyed at start: they hold slices nothing can use.
//!
//! This file has run against the NVML emulator (`sidecar/nvml-emu`) in
//! every test run, never yet on a GPU: docs/daemon.md, "Testing the NVML
//! backend", lists which calls only hardware can confirm.

use std::collections::HashMap;
use std::ffi::CStr;
use std::os::raw::{c_char, c_uint};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as sys;

use super::{Backend, BackendError, BackendInstance, GpuInfo, MemoryUse, XidWatch};
use crate::config::NvmlConfig;
use crate::health::{XidEvent, NOT_ATTRIBUTED};
use crate::mig::driver::driver_name;
use crate::mig::{
    match_driver, DriverMatch, DriverProfile, Geometry, GpuModel, ProfileSpec, Shape, SpotId,
};

/// Turns an NVML return code into a result, with the codes the daemon must
/// tell apart mapped to their own [`BackendError`] variants.
pub fn map_return(code: c_uint, gpu: u32, what: &str) -> Result<(), BackendError> {
    let what = what.to_string();
    match code {
        sys::nvmlReturn_enum_NVML_SUCCESS => Ok(()),
        sys::nvmlReturn_enum_NVML_ERROR_IN_USE => Err(BackendError::InUse { gpu, what }),
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => {
            Err(BackendError::InsufficientResources { gpu, what })
        }
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => {
            Err(BackendError::NotSupported { gpu, what })
        }
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => {
            Err(BackendError::NoPermission { gpu, what })
        }
        sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT => Err(BackendError::Timeout { gpu, what }),
        other => Err(BackendError::Other(format!(
            "GPU {gpu}: {what} failed with NVML error {other}"
        ))),
    }
}

/// NVML compute-instance profile index for a GPU instance of `compute`
/// slices: the full-size compute instance (one CI per GI).
pub fn compute_instance_profile(compute: u8) -> Option<c_uint> {
    Some(match compute {
        1 => sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        7 => sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        _ => return None,
    })
}

/// The placement a GPU instance of profile id `profile_id` at memory slot
/// `start` occupies, given the driver's profile-id table `ids` (shape -> id).
pub fn placement_of(
    geometry: &Geometry,
    ids: &HashMap<Shape, c_uint>,
    profile_id: c_uint,
    start: c_uint,
) -> Option<SpotId> {
    let shape = ids
        .iter()
        .find(|(_, &id)| id == profile_id)
        .map(|(s, _)| *s)?;
    geometry.spot_id(shape, u8::try_from(start).ok()?)
}

/// The `nvmlGpuInstanceProfileInfo_t.id` values the table expects, for when
/// the driver cannot be asked (and for tests).
pub fn table_profile_ids(model: GpuModel) -> HashMap<Shape, c_uint> {
    model
        .spec()
        .profiles
        .iter()
        .map(|p: &ProfileSpec| (p.shape, p.smi_id))
        .collect()
}

struct NvmlGpu {
    index: u32,
    model: GpuModel,
    /// `nvmlDeviceGetMinorNumber`: the N of /dev/nvidiaN.
    minor: Option<u32>,
    /// Driver profile ids by shape (read at start; equal to the table's).
    ids: HashMap<Shape, c_uint>,
    /// The driver's profiles matched with the table (names, memory, variants).
    driver: DriverMatch,
}

/// `nvmlGpuInstanceProfileInfo_v2` (nvml.h `NVML_STRUCT_VERSION`): the
/// struct's size with the version in the top byte.
const PROFILE_INFO_V2: c_uint =
    std::mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>() as c_uint | (2 << 24);

/// Codes meaning "no profile at this index" (not a failure).
fn not_offered(code: c_uint) -> bool {
    matches!(
        code,
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
            | sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            | sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND
    )
}

/// The profile at NVML index `index`, with its name when the driver has the
/// versioned call: `Ok(None)` when there is none.
///
/// # Safety
/// `device` must be a live device handle of `nvml`'s library.
unsafe fn profile_at(
    nvml: &Nvml,
    device: sys::nvmlDevice_t,
    gpu: u32,
    index: c_uint,
) -> Result<Option<(sys::nvmlGpuInstanceProfileInfo_t, Option<String>)>, BackendError> {
    let lib = nvml.lib();
    if lib.nvmlDeviceGetGpuInstanceProfileInfoV.is_ok() {
        // SAFETY: zeroed plain C struct with its version set, as nvml.h asks.
        let mut v2: sys::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        v2.version = PROFILE_INFO_V2;
        // SAFETY: live handle (the caller's promise), valid out-pointer.
        let code = unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfoV(device, index, &mut v2) };
        if code == sys::nvmlReturn_enum_NVML_SUCCESS {
            // SAFETY: the driver NUL-terminates `name` within its 96 bytes.
            let raw = unsafe { CStr::from_ptr(v2.name.as_ptr()) }.to_string_lossy();
            let name = Some(driver_name(&raw)).filter(|n| !n.is_empty());
            let v1 = sys::nvmlGpuInstanceProfileInfo_t {
                id: v2.id,
                isP2pSupported: v2.isP2pSupported,
                sliceCount: v2.sliceCount,
                instanceCount: v2.instanceCount,
                multiprocessorCount: v2.multiprocessorCount,
                copyEngineCount: v2.copyEngineCount,
                decoderCount: v2.decoderCount,
                encoderCount: v2.encoderCount,
                jpegCount: v2.jpegCount,
                ofaCount: v2.ofaCount,
                memorySizeMB: v2.memorySizeMB,
            };
            return Ok(Some((v1, name)));
        }
        if not_offered(code) {
            return Ok(None);
        }
        // Another answer (an older versioned struct): ask the plain call.
    }
    // SAFETY: zeroed plain C struct as out-pointer.
    let mut info: sys::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: live handle (the caller's promise), valid out-pointer.
    let code = unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfo(device, index, &mut info) };
    if not_offered(code) {
        return Ok(None);
    }
    map_return(code, gpu, &format!("profile info at NVML index {index}"))?;
    Ok(Some((info, None)))
}

/// The possible placements of driver profile `id` as (start, size).
///
/// # Safety
/// `device` must be a live device handle of `nvml`'s library.
unsafe fn possible_placements(
    nvml: &Nvml,
    device: sys::nvmlDevice_t,
    gpu: u32,
    id: c_uint,
) -> Result<Vec<(u32, u32)>, BackendError> {
    let lib = nvml.lib();
    if lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.is_err() {
        return Err(missing_symbol(
            gpu,
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        ));
    }
    let mut buf = [sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 16];
    let mut count = buf.len() as c_uint;
    // SAFETY: live handle (the caller's promise); the buffer holds `count`.
    let code = unsafe {
        lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, id, buf.as_mut_ptr(), &mut count)
    };
    map_return(
        code,
        gpu,
        &format!("possible placements of profile id {id}"),
    )?;
    Ok(buf
        .iter()
        .take(count as usize)
        .map(|p| (p.start, p.size))
        .collect())
}

/// A function the NVML library does not export: not supported.
pub fn missing_symbol(gpu: u32, symbol: &str) -> BackendError {
    BackendError::NotSupported {
        gpu,
        what: format!("{symbol} (not exported by the NVML library)"),
    }
}

/// Every GPU-instance profile the driver offers on GPU `gpu`: one entry per
/// `NVML_GPU_INSTANCE_PROFILE_*` index it answers, with id, compute slices,
/// memory, name (when the driver has `nvmlDeviceGetGpuInstanceProfileInfoV`)
/// and possible placements. Read only; shared with the survey
/// ([`super::inventory`]).
///
/// # Safety
/// `device` must be a live device handle of `nvml`'s library.
pub unsafe fn driver_profiles(
    nvml: &Nvml,
    device: sys::nvmlDevice_t,
    gpu: u32,
) -> Result<Vec<DriverProfile>, BackendError> {
    if nvml.lib().nvmlDeviceGetGpuInstanceProfileInfo.is_err() {
        return Err(missing_symbol(gpu, "nvmlDeviceGetGpuInstanceProfileInfo"));
    }
    let mut out = Vec::new();
    for index in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        // SAFETY: the caller's promise about `device`.
        let Some((info, name)) = (unsafe { profile_at(nvml, device, gpu, index)? }) else {
            continue;
        };
        // SAFETY: as above. Placements need a privileged user
        // (nvml.h); without one the reason is kept per profile.
        let placements =
            unsafe { possible_placements(nvml, device, gpu, info.id) }.map_err(|e| e.to_string());
        out.push(DriverProfile {
            index,
            id: info.id,
            slices: info.sliceCount,
            memory_mib: info.memorySizeMB,
            instance_count: info.instanceCount,
            name,
            placements,
        });
    }
    Ok(out)
}

/// The NVML backend.
pub struct NvmlBackend {
    /// Shared with the XID watcher, which may outlive the backend by one
    /// wait: NVML shuts down when the last of them is gone.
    nvml: Arc<Nvml>,
    gpus: Vec<NvmlGpu>,
    /// The driver's capability tree (`nvml.capabilities_dir`).
    capabilities_dir: PathBuf,
    /// The capability device files (`nvml.caps_dev_dir`).
    caps_dev_dir: PathBuf,
}

/// An NVML event set handle.
struct EventSet(sys::nvmlEventSet_t);

// SAFETY: the handle is an opaque value NVML accepts from any thread ("all
// NVML calls are thread-safe", nvml.h); it is owned by one
// [`NvmlXidWatch`], used only by the thread that owns the watcher, and
// freed once, in the watcher's drop.
unsafe impl Send for EventSet {}

/// Loads the NVML library `config` names and initialises it.
pub fn load(config: &NvmlConfig) -> Result<Nvml, BackendError> {
    Nvml::builder()
        .lib_path(config.library.as_os_str())
        .init()
        .map_err(init_error)
}

fn init_error(e: NvmlError) -> BackendError {
    match e {
        NvmlError::LibloadingError(e) => BackendError::LibraryNotFound(e.to_string()),
        NvmlError::LibraryNotFound => {
            BackendError::LibraryNotFound("the library was not found".into())
        }
        NvmlError::DriverNotLoaded => {
            BackendError::Other("NVML: the NVIDIA driver is not loaded".into())
        }
        other => BackendError::Other(format!("NVML initialisation failed: {other}")),
    }
}

/// Turns an nvml-wrapper error into a [`BackendError`]; a function the
/// library does not export counts as not supported.
pub fn nvml_err(gpu: u32, what: &str, e: NvmlError) -> BackendError {
    match e {
        NvmlError::InUse => BackendError::InUse {
            gpu,
            what: what.into(),
        },
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) => BackendError::NotSupported {
            gpu,
            what: what.into(),
        },
        NvmlError::NoPermission => BackendError::NoPermission {
            gpu,
            what: what.into(),
        },
        other => BackendError::Other(format!("GPU {gpu}: {what}: {other}")),
    }
}

impl NvmlBackend {
    /// Loads NVML, identifies every GPU and checks that MIG mode is on.
    pub fn open(config: &NvmlConfig) -> Result<NvmlBackend, BackendError> {
        let nvml = load(config)?;
        let count = nvml
            .device_count()
            .map_err(|e| nvml_err(0, "device count", e))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            let device = nvml
                .device_by_index(index)
                .map_err(|e| nvml_err(index, "device handle", e))?;
            let name = device
                .name()
                .map_err(|e| nvml_err(index, "device name", e))?;
            let model =
                GpuModel::from_nvml_name(&name).ok_or_else(|| BackendError::UnsupportedModel {
                    gpu: index,
                    name: name.clone(),
                })?;
            let mig = device
                .mig_mode()
                .map_err(|e| nvml_err(index, "MIG mode", e))?;
            if mig.current != sys::NVML_DEVICE_MIG_ENABLE {
                return Err(BackendError::MigDisabled { gpu: index, name });
            }
            // SAFETY: a live device handle of this library.
            let offered = unsafe { driver_profiles(&nvml, device.handle(), index)? };
            // Placements are privileged: as another user, say so rather
            // than report every profile as a difference.
            if offered.iter().any(|p| {
                p.placements
                    .as_ref()
                    .is_err_and(|e| e.contains("NVML_ERROR_NO_PERMISSION"))
            }) {
                return Err(BackendError::NoPermission {
                    gpu: index,
                    what: "possible placements".into(),
                });
            }
            let driver = match_driver(model, &offered);
            if !driver.agrees() {
                return Err(BackendError::TableMismatch {
                    gpu: index,
                    name,
                    model,
                    differences: driver.differences_text(),
                });
            }
            for note in &driver.notes {
                tracing::warn!(gpu = index, %model, "{note}");
            }
            let ids = driver
                .profiles
                .iter()
                .map(|m| (m.spec.shape, m.driver.id))
                .collect();
            tracing::info!(gpu = index, %name, %model, "NVML GPU in MIG mode");
            let minor = device.minor_number().ok();
            gpus.push(NvmlGpu {
                index,
                model,
                minor,
                ids,
                driver,
            });
        }
        let backend = NvmlBackend {
            nvml: Arc::new(nvml),
            gpus,
            capabilities_dir: config.capabilities_dir.clone(),
            caps_dev_dir: config.caps_dev_dir.clone(),
        };
        for gpu in 0..count {
            backend.remove_orphans(gpu)?;
        }
        Ok(backend)
    }

    /// Destroys the GPU instances of `gpu` that have no compute instance.
    ///
    /// A crash between creating a GPU instance and its compute instance
    /// leaves one behind; it has no MIG device, so [`Backend::list`] cannot
    /// show it, yet it holds its memory slices and every create over them
    /// fails with `INSUFFICIENT_RESOURCES`. Nothing can run on a GPU
    /// instance without a compute instance, so removing it at start loses
    /// nothing (found by the NVML emulator's crash tests).
    fn remove_orphans(&self, gpu: u32) -> Result<(), BackendError> {
        let info = self.gpu(gpu)?;
        let with_ci: Vec<c_uint> = self
            .mig_devices(gpu)?
            .into_iter()
            .map(|(_, gi, _)| gi)
            .collect();
        let device = self
            .nvml
            .device_by_index(gpu)
            .map_err(|e| nvml_err(gpu, "device handle", e))?;
        let profile_ids: Vec<c_uint> = info.ids.values().copied().collect();
        // SAFETY: a live device handle of this library.
        let instances = unsafe { gpu_instances(&self.nvml, device.handle(), gpu, &profile_ids)? };
        for (gi, gi_info) in instances {
            if with_ci.contains(&gi_info.id) {
                continue;
            }
            tracing::warn!(
                gpu,
                gpu_instance = gi_info.id,
                profile = gi_info.profileId,
                start = gi_info.placement.start,
                "GPU instance without a compute instance (left by a crash); destroying it"
            );
            map_return(
                // SAFETY: a handle NVML just returned.
                unsafe { self.nvml.lib().nvmlGpuInstanceDestroy(gi) },
                gpu,
                &format!("destroy orphan GPU instance {}", gi_info.id),
            )?;
        }
        Ok(())
    }

    /// The driver's profiles of `gpu` as matched with the table at start
    /// (names, memory, variants).
    pub fn driver_match(&self, gpu: u32) -> Option<&DriverMatch> {
        self.gpus.get(gpu as usize).map(|g| &g.driver)
    }

    fn gpu(&self, gpu: u32) -> Result<&NvmlGpu, BackendError> {
        self.gpus.get(gpu as usize).ok_or(BackendError::NoSuchGpu {
            gpu,
            count: self.gpus.len() as u32,
        })
    }

    /// (GPU instance id, compute instance id) of MIG device `uuid` of `gpu`.
    fn instance_ids(&self, gpu: u32, uuid: &str) -> Result<(c_uint, c_uint), BackendError> {
        self.mig_devices(gpu)?
            .into_iter()
            .find(|(u, _, _)| u == uuid)
            .map(|(_, gi, ci)| (gi, ci))
            .ok_or_else(|| BackendError::UnknownInstance {
                gpu,
                uuid: uuid.to_string(),
            })
    }

    /// Every MIG device of `gpu`: (uuid, GPU instance id, compute instance id).
    fn mig_devices(&self, gpu: u32) -> Result<Vec<(String, c_uint, c_uint)>, BackendError> {
        let device = self
            .nvml
            .device_by_index(gpu)
            .map_err(|e| nvml_err(gpu, "device handle", e))?;
        // SAFETY: a live device handle of this library.
        unsafe { mig_devices(&self.nvml, device.handle(), gpu) }
    }
}

/// Every GPU instance of GPU `gpu` (handle `device`) whose profile id is
/// one of `profile_ids`: its handle and its info (id, profile, placement).
/// Shared with the read-only survey ([`super::inventory`]).
///
/// # Safety
/// `device` must be a live device handle of `nvml`'s library.
pub unsafe fn gpu_instances(
    nvml: &Nvml,
    device: sys::nvmlDevice_t,
    gpu: u32,
    profile_ids: &[c_uint],
) -> Result<Vec<(sys::nvmlGpuInstance_t, sys::nvmlGpuInstanceInfo_t)>, BackendError> {
    let lib = nvml.lib();
    let mut ids = profile_ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut out = Vec::new();
    for profile_id in ids {
        // At most 8 GPU instances of one profile on any MIG GPU
        // (`nvmlDeviceGetGpuInstances`' count is output only).
        let mut handles: [sys::nvmlGpuInstance_t; 8] = [std::ptr::null_mut(); 8];
        let mut count: c_uint = handles.len() as c_uint;
        map_return(
            // SAFETY: live device handle (the caller's promise); the buffer
            // holds `count` handles.
            unsafe {
                lib.nvmlDeviceGetGpuInstances(device, profile_id, handles.as_mut_ptr(), &mut count)
            },
            gpu,
            "GPU instances",
        )?;
        for &gi in handles.iter().take(count as usize) {
            // SAFETY: zeroed plain C struct as out-pointer.
            let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
            map_return(
                // SAFETY: a handle NVML just returned and a valid out-pointer.
                unsafe { lib.nvmlGpuInstanceGetInfo(gi, &mut info) },
                gpu,
                "GPU instance info",
            )?;
            out.push((gi, info));
        }
    }
    Ok(out)
}

/// Every MIG device of GPU `gpu` (handle `device`): (uuid, GPU instance id,
/// compute instance id). Shared with the read-only survey
/// ([`super::inventory`]).
///
/// # Safety
/// `device` must be a live device handle of `nvml`'s library.
pub unsafe fn mig_devices(
    nvml: &Nvml,
    device: sys::nvmlDevice_t,
    gpu: u32,
) -> Result<Vec<(String, c_uint, c_uint)>, BackendError> {
    let lib = nvml.lib();
    let mut out = Vec::new();
    let mut max: c_uint = 0;
    // SAFETY: live handle (the caller's promise), valid out-pointers,
    // buffers sized as NVML documents.
    unsafe {
        map_return(
            lib.nvmlDeviceGetMaxMigDeviceCount(device, &mut max),
            gpu,
            "MIG device count",
        )?;
        for i in 0..max {
            let mut mig: sys::nvmlDevice_t = std::ptr::null_mut();
            match lib.nvmlDeviceGetMigDeviceHandleByIndex(device, i, &mut mig) {
                sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => continue, // none at this index
                // Any other failure is the driver's, not an empty slot: a
                // GPU must not look empty because NVML misbehaved.
                code => map_return(code, gpu, "MIG device handle")?,
            }
            let (mut gi, mut ci) = (0, 0);
            map_return(
                lib.nvmlDeviceGetGpuInstanceId(mig, &mut gi),
                gpu,
                "GPU instance id",
            )?;
            map_return(
                lib.nvmlDeviceGetComputeInstanceId(mig, &mut ci),
                gpu,
                "compute instance id",
            )?;
            let mut buf = [0 as c_char; sys::NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize];
            map_return(
                lib.nvmlDeviceGetUUID(mig, buf.as_mut_ptr(), buf.len() as c_uint),
                gpu,
                "MIG UUID",
            )?;
            let uuid = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
            out.push((uuid, gi, ci));
        }
    }
    Ok(out)
}

/// The GPUs' XID events, as NVML reports them: the watcher owns its event
/// set (made at the first wait, freed on drop), and the one thread that
/// owns the watcher is the set's only user, so no lock guards it.
struct NvmlXidWatch {
    nvml: Arc<Nvml>,
    /// The GPUs to register, by index.
    gpus: Vec<u32>,
    set: Option<EventSet>,
}

impl NvmlXidWatch {
    /// An event set with every GPU registered for XID events.
    fn xid_set(&self) -> Result<EventSet, BackendError> {
        let lib = self.nvml.lib();
        if lib.nvmlEventSetCreate.is_err() || lib.nvmlEventSetWait_v2.is_err() {
            return Err(missing_symbol(0, "nvmlEventSetWait_v2"));
        }
        let mut set: sys::nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        map_return(unsafe { lib.nvmlEventSetCreate(&mut set) }, 0, "event set")?;
        let set = EventSet(set);
        for &index in &self.gpus {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(|e| nvml_err(index, "device handle", e))?;
            // SAFETY: a live device handle and the set just made.
            let code = unsafe {
                lib.nvmlDeviceRegisterEvents(
                    device.handle(),
                    u64::from(sys::nvmlEventTypeXidCriticalError),
                    set.0,
                )
            };
            if let Err(e) = map_return(code, index, "XID event registration") {
                tracing::warn!(gpu = index, "no XID events from this GPU: {e}");
            }
        }
        tracing::info!(gpus = self.gpus.len(), "listening for NVML XID events");
        Ok(set)
    }
}

impl XidWatch for NvmlXidWatch {
    fn next(&mut self, timeout: Duration) -> Result<Option<XidEvent>, BackendError> {
        if self.set.is_none() {
            self.set = Some(self.xid_set()?);
        }
        let Some(set) = &self.set else {
            return Ok(None);
        };
        let lib = self.nvml.lib();
        // SAFETY: zeroed plain C struct as out-pointer.
        let mut data: sys::nvmlEventData_t = unsafe { std::mem::zeroed() };
        let ms = c_uint::try_from(timeout.as_millis()).unwrap_or(c_uint::MAX);
        // SAFETY: a live set of this library, valid out-pointer.
        let code = unsafe { lib.nvmlEventSetWait_v2(set.0, &mut data, ms) };
        if code == sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT {
            return Ok(None);
        }
        map_return(code, 0, "XID event wait")?;
        if data.eventType & u64::from(sys::nvmlEventTypeXidCriticalError) == 0 {
            return Ok(None);
        }
        let mut index: c_uint = 0;
        // SAFETY: the device handle NVML just gave, valid out-pointer.
        let code = unsafe { lib.nvmlDeviceGetIndex(data.device, &mut index) };
        map_return(code, 0, "index of the XID event's GPU")?;
        Ok(Some(XidEvent {
            gpu: index,
            xid: data.eventData,
            gpu_instance: Some(data.gpuInstanceId).filter(|&gi| gi != NOT_ATTRIBUTED),
        }))
    }
}

impl Drop for NvmlXidWatch {
    fn drop(&mut self) {
        if let (Some(set), Ok(free)) = (self.set.take(), self.nvml.lib().nvmlEventSetFree.as_ref())
        {
            // SAFETY: a set this watcher made, freed once; NVML is still
            // up (this watcher holds it).
            unsafe { free(set.0) };
        }
    }
}

impl Backend for NvmlBackend {
    fn measures_memory(&self) -> bool {
        true
    }

    fn xid_watch(&self) -> Option<Box<dyn XidWatch>> {
        Some(Box::new(NvmlXidWatch {
            nvml: self.nvml.clone(),
            gpus: self.gpus.iter().map(|g| g.index).collect(),
            set: None,
        }))
    }

    fn name(&self) -> &'static str {
        "nvml"
    }

    fn profile_name(&self, gpu: u32, shape: Shape) -> Option<String> {
        let g = self.gpus.get(gpu as usize)?;
        let spec = g.model.spec().profile(shape)?;
        Some(g.driver.matched(spec)?.name())
    }

    fn gpus(&self) -> Vec<GpuInfo> {
        self.gpus
            .iter()
            .map(|g| GpuInfo {
                index: g.index,
                model: g.model,
                minor: g.minor,
            })
            .collect()
    }

    fn list(&self, gpu: u32) -> Result<Vec<BackendInstance>, BackendError> {
        let info = self.gpu(gpu)?;
        let geometry = Geometry::of(info.model);
        let device = self
            .nvml
            .device_by_index(gpu)
            .map_err(|e| nvml_err(gpu, "device handle", e))?;
        let lib = self.nvml.lib();
        let mut out = Vec::new();
        for (uuid, gi_id, _) in self.mig_devices(gpu)? {
            let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
            // SAFETY: a plain C struct of integers, for which all zeroes is valid.
            let mut gi_info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: live handle and valid out-pointers.
            unsafe {
                map_return(
                    lib.nvmlDeviceGetGpuInstanceById(device.handle(), gi_id, &mut gi),
                    gpu,
                    "GPU instance",
                )?;
                map_return(
                    lib.nvmlGpuInstanceGetInfo(gi, &mut gi_info),
                    gpu,
                    "GPU instance info",
                )?;
            }
            match placement_of(
                geometry,
                &info.ids,
                gi_info.profileId,
                gi_info.placement.start,
            ) {
                Some(placement) => out.push(BackendInstance { placement, uuid }),
                None => {
                    tracing::warn!(gpu, %uuid, profile = gi_info.profileId, start = gi_info.placement.start,
                    "instance with a profile smartmig does not schedule (e.g. +me); left alone");
                }
            }
        }
        out.sort_by_key(|i| i.placement);
        Ok(out)
    }

    fn create(&self, gpu: u32, placement: SpotId) -> Result<String, BackendError> {
        let info = self.gpu(gpu)?;
        let p = *Geometry::of(info.model).spot(placement);
        let what = p.describe().to_string();
        let profile_id = *info
            .ids
            .get(&p.shape())
            .ok_or_else(|| BackendError::NotSupported {
                gpu,
                what: format!("profile {what}"),
            })?;
        let ci_profile =
            compute_instance_profile(p.compute()).ok_or_else(|| BackendError::NotSupported {
                gpu,
                what: format!("compute instance for {what}"),
            })?;
        let device = self
            .nvml
            .device_by_index(gpu)
            .map_err(|e| nvml_err(gpu, "device handle", e))?;
        let lib = self.nvml.lib();
        let placement_arg = sys::nvmlGpuInstancePlacement_t {
            start: c_uint::from(p.start),
            size: c_uint::from(p.shape().memory),
        };
        let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: a plain C struct of integers, for which all zeroes is valid.
        let mut gi_info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: live handle, valid in/out pointers; on a compute-instance
        // failure the new GPU instance is destroyed again so no orphan stays.
        unsafe {
            let created = map_return(
                lib.nvmlDeviceCreateGpuInstanceWithPlacement(
                    device.handle(),
                    profile_id,
                    &placement_arg,
                    &mut gi,
                ),
                gpu,
                &format!("create GPU instance {what}"),
            );
            if let Err(e @ BackendError::Timeout { .. }) = created {
                // The GPU instance may exist without its compute
                // instance: invisible to `list`, yet holding its slices.
                if let Err(cleanup) = self.remove_orphans(gpu) {
                    tracing::error!(gpu, "after a timed-out create: {cleanup}");
                }
                return Err(e);
            }
            created?;
            map_return(
                lib.nvmlGpuInstanceGetInfo(gi, &mut gi_info),
                gpu,
                "GPU instance info",
            )?;
            let mut ci_info: sys::nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
            let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
            let made = map_return(
                lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi,
                    ci_profile,
                    sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut ci_info,
                ),
                gpu,
                "compute instance profile",
            )
            .and_then(|()| {
                map_return(
                    lib.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id, &mut ci),
                    gpu,
                    &format!("create compute instance {what}"),
                )
            });
            if let Err(e) = made {
                let _ = lib.nvmlGpuInstanceDestroy(gi);
                return Err(e);
            }
        }
        self.mig_devices(gpu)?
            .into_iter()
            .find(|(_, gi_id, _)| *gi_id == gi_info.id)
            .map(|(uuid, _, _)| uuid)
            .ok_or_else(|| {
                BackendError::Other(format!(
                    "GPU {gpu}: created {what} but found no MIG device for it"
                ))
            })
    }

    fn gpu_uuid(&self, gpu: u32) -> Option<String> {
        self.nvml.device_by_index(gpu).and_then(|d| d.uuid()).ok()
    }

    fn gpu_instance_id(&self, gpu: u32, uuid: &str) -> Option<u32> {
        self.instance_ids(gpu, uuid).ok().map(|(gi, _)| gi)
    }

    fn destroy(&self, gpu: u32, uuid: &str) -> Result<(), BackendError> {
        self.gpu(gpu)?;
        let (gi_id, ci_id) = self.instance_ids(gpu, uuid)?;
        let device = self
            .nvml
            .device_by_index(gpu)
            .map_err(|e| nvml_err(gpu, "device handle", e))?;
        let lib = self.nvml.lib();
        // SAFETY: live handle, valid out-pointers; compute instance first.
        unsafe {
            let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
            let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
            map_return(
                lib.nvmlDeviceGetGpuInstanceById(device.handle(), gi_id, &mut gi),
                gpu,
                uuid,
            )?;
            map_return(
                lib.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id, &mut ci),
                gpu,
                uuid,
            )?;
            map_return(
                lib.nvmlComputeInstanceDestroy(ci),
                gpu,
                &format!("destroy compute instance of {uuid}"),
            )?;
            map_return(
                lib.nvmlGpuInstanceDestroy(gi),
                gpu,
                &format!("destroy GPU instance of {uuid}"),
            )?;
        }
        Ok(())
    }

    /// `/dev/nvidia-caps/nvidia-cap<M>` of the GPU instance and of the
    /// compute instance, `M` read from the driver's
    /// `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access`
    /// (both directories as `[nvml]` names them)
    /// (`DeviceFileMinor: M`), as Slurm's own MIG support does.
    fn access_files(&self, gpu: u32, uuid: &str) -> Result<Vec<PathBuf>, BackendError> {
        let minor = self.gpu(gpu)?.minor.ok_or_else(|| {
            BackendError::Other(format!("GPU {gpu}: device minor number unknown"))
        })?;
        let (gi, ci) = self.instance_ids(gpu, uuid)?;
        let base = self.capabilities_dir.join(format!("gpu{minor}/mig/gi{gi}"));
        [base.join("access"), base.join(format!("ci{ci}/access"))]
            .iter()
            .map(|proc_file| {
                let shown = proc_file.display();
                let text = std::fs::read_to_string(proc_file)
                    .map_err(|e| BackendError::Other(format!("GPU {gpu}: reading {shown}: {e}")))?;
                let m = cap_minor(&text).ok_or_else(|| {
                    BackendError::Other(format!("GPU {gpu}: {shown} names no DeviceFileMinor"))
                })?;
                Ok(self.caps_dev_dir.join(format!("nvidia-cap{m}")))
            })
            .collect()
    }

    /// Current framebuffer use and size of the MIG device
    /// (`nvmlDeviceGetMemoryInfo_v2` on the handle of its MIG UUID); the
    /// daemon samples it for the peak and the early-restart rule. `used`
    /// includes the driver's small per-context reservation.
    fn memory_use(&self, gpu: u32, uuid: &str) -> Option<MemoryUse> {
        self.gpu(gpu).ok()?;
        let device = self.nvml.device_by_uuid(uuid).ok()?;
        let info = device.memory_info().ok()?;
        Some(MemoryUse {
            used_gb: info.used as f64 / 1e9,
            total_gb: info.total as f64 / 1e9,
        })
    }

    fn energy_j(&self, gpu: u32) -> Option<f64> {
        let device = self.nvml.device_by_index(gpu).ok()?;
        // mJ since the driver was loaded.
        device
            .total_energy_consumption()
            .ok()
            .map(|mj| mj as f64 / 1000.0)
    }
}

/// The `DeviceFileMinor` of a driver capability file
/// (`DeviceFileMinor: 21\nDeviceFileMode: 292\nDeviceFileModify: 1`).
pub fn cap_minor(text: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("DeviceFileMinor:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_capability_minor() {
        let text = "DeviceFileMinor: 21\nDeviceFileMode: 292\nDeviceFileModify: 1\n";
        assert_eq!(cap_minor(text), Some(21));
        assert_eq!(cap_minor("DeviceFileMode: 292\n"), None);
        assert_eq!(cap_minor("DeviceFileMinor: x\n"), None);
    }

    #[test]
    fn error_codes_map_to_variants() {
        assert!(map_return(sys::nvmlReturn_enum_NVML_SUCCESS, 0, "x").is_ok());
        assert!(matches!(
            map_return(sys::nvmlReturn_enum_NVML_ERROR_IN_USE, 1, "3g@0"),
            Err(BackendError::InUse { gpu: 1, .. })
        ));
        assert!(matches!(
            map_return(
                sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
                0,
                "x"
            ),
            Err(BackendError::InsufficientResources { .. })
        ));
        assert!(matches!(
            map_return(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED, 0, "x"),
            Err(BackendError::NotSupported { .. })
        ));
        let err = map_return(sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION, 0, "x").unwrap_err();
        assert!(err.to_string().contains("must run as root"), "{err}");
        assert!(matches!(
            map_return(999, 0, "x"),
            Err(BackendError::Other(_))
        ));
    }

    #[test]
    fn profile_ids_and_placements_follow_the_table() {
        for model in GpuModel::ALL {
            let g = Geometry::of(model);
            let ids = table_profile_ids(model);
            for id in g.ids() {
                let p = g.spot(id);
                let got = placement_of(g, &ids, p.profile.smi_id, c_uint::from(p.start));
                assert_eq!(got, Some(id), "{model} {}", p.describe());
                assert!(compute_instance_profile(p.compute()).is_some());
            }
            // A start the profile does not allow maps to nothing.
            let full = model.spec().full_profile();
            assert_eq!(placement_of(g, &ids, full.smi_id, 1), None);
        }
        // A100-40GB 3g.20gb: NVML profile 2 (3_SLICE), id 9, starts 0 and 4.
        let p = GpuModel::A100_40gb
            .spec()
            .profile(Shape::new(3, 4))
            .unwrap();
        assert_eq!(
            (p.nvml_profile, p.smi_id),
            (sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9)
        );
        let p = GpuModel::A100_40gb
            .spec()
            .profile(Shape::new(1, 2))
            .unwrap();
        assert_eq!(p.nvml_profile, sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2);
    }

    #[test]
    fn loading_without_a_driver_says_so() {
        // A library path that cannot exist stands for a node without the
        // driver, on every machine: the message must say what is missing.
        let config = NvmlConfig {
            library: std::path::PathBuf::from("/nonexistent/smartmig-test/libnvidia-ml.so.1"),
            ..NvmlConfig::default()
        };
        match NvmlBackend::open(&config) {
            Err(e) => {
                assert!(matches!(e, BackendError::LibraryNotFound(_)), "{e}");
                let msg = e.to_string();
                assert!(msg.contains("NVML library not found"), "{msg}");
            }
            Ok(b) => panic!("NVML loaded from a missing file ({} GPUs)", b.gpus().len()),
        }
    }
}
