//! The exported NVML C functions.
//!
//! Each one runs as one transaction on the shared state ([`crate::state`]):
//! it counts itself, consults the faults ([`crate::fault`]), then does its
//! work with the rules of [`crate::mig`]. A panic never crosses into C
//! (`catch_unwind` -> `NVML_ERROR_UNKNOWN`).
//!
//! Handles are encoded integers, never pointers (nvml-wrapper does not
//! dereference them), so they mean the same thing in every process:
//! device `0x1000 + index`, GPU instance `1<<32 | gpu<<16 | gi`, compute
//! instance `2<<32 | gpu<<16 | gi<<8 | ci`, MIG device `3<<32 | gpu<<16 |
//! gi<<8 | ci`. A handle naming nothing that exists now is
//! `NVML_ERROR_INVALID_ARGUMENT`.
//!
//! As in nvml.h, the calls marked "Requires privileged user" (creating,
//! destroying and enumerating instances, placements, capacity) answer
//! `NVML_ERROR_NO_PERMISSION` unless the effective uid is 0; queries of
//! devices and MIG device handles do not.
//!
//! The process keeps only the init count and the state directory read from
//! `SMARTMIG_NVML_EMU_DIR` at the latest `nvmlInit*`.

// Every function here is `unsafe extern "C"` with NVML's own contract
// (nvml.h): pointers are null or valid for the documented writes, strings
// are NUL-terminated. Repeating it on forty functions would say nothing.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlComputeInstance_t, nvmlDevice_t, nvmlGpuInstance_t, nvmlReturn_t};

use crate::mig::{self, Code, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, SUCCESS, UNKNOWN};
use crate::state::{self, GpuState, State};
use crate::DIR_ENV;

const UNINITIALIZED: Code = sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
const INSUFFICIENT_SIZE: Code = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const DRIVER_NOT_LOADED: Code = sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
const NO_PERMISSION: Code = sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION;
const VERSION_MISMATCH: Code = sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;

pub const DRIVER_VERSION: &str = "550.54.15-emulated";
pub const NVML_VERSION: &str = "12.550.54.15-emulated";
pub const CUDA_VERSION: c_int = 12040;

// ---------------------------------------------------------------- handles

const DEVICE_BASE: u64 = 0x1000;
const GI_TAG: u64 = 1;
const CI_TAG: u64 = 2;
const MIG_TAG: u64 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dev {
    Gpu(u32),
    Mig { gpu: u32, gi: u32, ci: u32 },
}

impl Dev {
    fn gpu(self) -> u32 {
        match self {
            Dev::Gpu(g) | Dev::Mig { gpu: g, .. } => g,
        }
    }
}

fn to_ptr<T>(v: u64) -> *mut T {
    std::ptr::without_provenance_mut(v as usize)
}

fn value<T>(p: *mut T) -> u64 {
    p.addr() as u64
}

fn gpu_handle(gpu: u32) -> nvmlDevice_t {
    to_ptr(DEVICE_BASE + u64::from(gpu))
}

fn tagged(tag: u64, gpu: u32, gi: u32, ci: u32) -> u64 {
    (tag << 32) | (u64::from(gpu) << 16) | (u64::from(gi) << 8) | u64::from(ci)
}

fn mig_handle(gpu: u32, gi: u32, ci: u32) -> nvmlDevice_t {
    to_ptr(tagged(MIG_TAG, gpu, gi, ci))
}

fn gi_handle(gpu: u32, gi: u32) -> nvmlGpuInstance_t {
    to_ptr(tagged(GI_TAG, gpu, 0, 0) | u64::from(gi))
}

fn ci_handle(gpu: u32, gi: u32, ci: u32) -> nvmlComputeInstance_t {
    to_ptr(tagged(CI_TAG, gpu, gi, ci))
}

/// (tag, gpu, gi, ci) of an encoded handle.
fn split(v: u64) -> (u64, u32, u32, u32) {
    (
        v >> 32,
        ((v >> 16) & 0xFFFF) as u32,
        ((v >> 8) & 0xFF) as u32,
        (v & 0xFF) as u32,
    )
}

fn decode_dev(h: nvmlDevice_t) -> Option<Dev> {
    let v = value(h);
    if (DEVICE_BASE..DEVICE_BASE + 0x1_0000).contains(&v) {
        return Some(Dev::Gpu((v - DEVICE_BASE) as u32));
    }
    let (tag, gpu, gi, ci) = split(v);
    (tag == MIG_TAG).then_some(Dev::Mig { gpu, gi, ci })
}

fn decode_gi(h: nvmlGpuInstance_t) -> Option<(u32, u32)> {
    let v = value(h);
    let (tag, gpu, _, _) = split(v);
    (tag == GI_TAG).then_some((gpu, (v & 0xFFFF) as u32))
}

fn decode_ci(h: nvmlComputeInstance_t) -> Option<(u32, u32, u32)> {
    let (tag, gpu, gi, ci) = split(value(h));
    (tag == CI_TAG).then_some((gpu, gi, ci))
}

// ------------------------------------------------------- state look-ups

fn gpu_state(st: &mut State, gpu: u32) -> Result<&mut GpuState, Code> {
    st.gpus.get_mut(gpu as usize).ok_or(INVALID_ARGUMENT)
}

/// A device handle naming something that exists now.
fn device(st: &State, h: nvmlDevice_t) -> Result<Dev, Code> {
    let d = decode_dev(h).ok_or(INVALID_ARGUMENT)?;
    let gpu = st.gpus.get(d.gpu() as usize).ok_or(INVALID_ARGUMENT)?;
    if let Dev::Mig { gi, ci, .. } = d {
        gpu.instances
            .iter()
            .find(|g| g.id == gi && g.ci.as_ref().is_some_and(|c| c.id == ci))
            .ok_or(INVALID_ARGUMENT)?;
    }
    Ok(d)
}

/// A handle of a whole GPU (a MIG device's: NOT_SUPPORTED).
fn whole_gpu(st: &State, h: nvmlDevice_t) -> Result<u32, Code> {
    match device(st, h)? {
        Dev::Gpu(g) => Ok(g),
        Dev::Mig { .. } => Err(NOT_SUPPORTED),
    }
}

/// A GPU-instance handle naming one that exists: (gpu, gi).
fn gpu_instance(st: &State, h: nvmlGpuInstance_t) -> Result<(u32, u32), Code> {
    let (gpu, gi) = decode_gi(h).ok_or(INVALID_ARGUMENT)?;
    st.gpus
        .get(gpu as usize)
        .and_then(|g| g.instances.iter().find(|i| i.id == gi))
        .ok_or(INVALID_ARGUMENT)?;
    Ok((gpu, gi))
}

fn mig_only(d: Dev) -> Result<(u32, u32, u32), Code> {
    match d {
        Dev::Mig { gpu, gi, ci } => Ok((gpu, gi, ci)),
        Dev::Gpu(_) => Err(NOT_SUPPORTED),
    }
}

/// Processes on a device: (pid, bytes, gi, ci).
fn processes(st: &State, d: Dev) -> Vec<(u32, u64, u32, u32)> {
    let Some(gpu) = st.gpus.get(d.gpu() as usize) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for gi in &gpu.instances {
        let Some(ci) = &gi.ci else { continue };
        if matches!(d, Dev::Mig { gi: g, ci: c, .. } if (g, c) != (gi.id, ci.id)) {
            continue;
        }
        out.extend(
            ci.processes
                .iter()
                .map(|p| (p.pid, p.used_bytes, gi.id, ci.id)),
        );
    }
    out
}

/// (total, used) memory of a device in bytes.
fn memory(st: &State, d: Dev) -> (u64, u64) {
    let gpu = &st.gpus[d.gpu() as usize];
    let total_mib = match d {
        Dev::Gpu(_) => Some(mig::memory_mib(gpu.model.spec().full_profile().memory_gb)),
        Dev::Mig { gi, .. } => gpu
            .instances
            .iter()
            .find(|g| g.id == gi)
            .and_then(|g| mig::profile_by_id(gpu, g.profile_id))
            .map(|p| p.memory_mib),
    };
    let total = total_mib.map_or(0, |mib| mib << 20);
    let used = processes(st, d).iter().map(|p| p.1).sum();
    (total, used)
}

fn root() -> Result<(), Code> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err(NO_PERMISSION)
    }
}

// ------------------------------------------------------- call machinery

static INIT: AtomicU32 = AtomicU32::new(0);
static DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

fn guard(f: impl FnOnce() -> Code) -> Code {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(UNKNOWN)
}

/// One transaction: count, consult faults, run `op` (see the module doc).
fn run(
    name: &'static str,
    dir: &Path,
    gpu: Option<u32>,
    op: impl FnOnce(&Path, &mut State) -> Result<(), Code>,
) -> Code {
    let done = state::transact(dir, |st| {
        *st.calls.entry(name.to_string()).or_default() += 1;
        match st.take_fault(name, gpu) {
            None => (op(dir, st), 0),
            Some(f) if f.error == SUCCESS => (op(dir, st), f.delay_ms),
            Some(f) => {
                if f.after {
                    let _ = op(dir, st);
                }
                (Err(f.error), f.delay_ms)
            }
        }
    });
    match done {
        Ok((result, delay_ms)) => {
            if delay_ms > 0 {
                std::thread::sleep(std::time::Duration::from_millis(delay_ms));
            }
            result.err().unwrap_or(SUCCESS)
        }
        Err(e) => {
            eprintln!("smartmig-nvml-emu: {name}: {e}");
            UNKNOWN
        }
    }
}

/// An exported call after `nvmlInit*`.
fn call(
    name: &'static str,
    gpu: Option<u32>,
    op: impl FnOnce(&Path, &mut State) -> Result<(), Code>,
) -> Code {
    guard(|| {
        let dir = DIR.lock().unwrap_or_else(PoisonError::into_inner).clone();
        match dir {
            Some(dir) if INIT.load(Ordering::SeqCst) > 0 => run(name, &dir, gpu, op),
            _ => UNINITIALIZED,
        }
    })
}

/// Writes `v` through an out-pointer.
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), Code> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for a write of T by the caller's (NVML's) contract.
    unsafe { p.write(v) };
    Ok(())
}

fn nonnull<T>(p: *const T) -> Result<(), Code> {
    if p.is_null() {
        Err(INVALID_ARGUMENT)
    } else {
        Ok(())
    }
}

/// Copies `s` and its NUL into `buf` of `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Code> {
    nonnull(buf)?;
    let bytes = s.as_bytes();
    if bytes.len() >= len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds `len` > bytes.len() bytes (caller's contract).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

// ------------------------------------------------------ init, system

fn init(name: &'static str) -> Code {
    guard(|| {
        let Some(dir) = std::env::var_os(DIR_ENV).map(PathBuf::from) else {
            eprintln!("smartmig-nvml-emu: {DIR_ENV} is not set: no emulated GPUs");
            return DRIVER_NOT_LOADED;
        };
        if !state::exists(&dir) {
            eprintln!(
                "smartmig-nvml-emu: {} does not exist: no emulated GPUs (Emulator::create makes it)",
                dir.join(state::STATE_FILE).display()
            );
            return DRIVER_NOT_LOADED;
        }
        let code = run(name, &dir, None, |_, _| Ok(()));
        if code == SUCCESS {
            *DIR.lock().unwrap_or_else(PoisonError::into_inner) = Some(dir);
            INIT.fetch_add(1, Ordering::SeqCst);
        }
        code
    })
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init("nvmlInit_v2")
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init("nvmlInitWithFlags")
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(|| {
        let was = INIT.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if was.is_err() {
            return UNINITIALIZED;
        }
        let dir = DIR.lock().unwrap_or_else(PoisonError::into_inner).clone();
        dir.map_or(SUCCESS, |dir| {
            run("nvmlShutdown", &dir, None, |_, _| Ok(()))
        })
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static CStr = match result {
        sys::nvmlReturn_enum_NVML_SUCCESS => c"Success",
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => c"Not Found",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT => c"Timeout",
        sys::nvmlReturn_enum_NVML_ERROR_IN_USE => c"In use by another client",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => c"Insufficient resources",
        sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(v: *mut c_char, len: c_uint) -> nvmlReturn_t {
    // SAFETY: NVML's contract for `v` and `len`.
    call("nvmlSystemGetDriverVersion", None, |_, _| unsafe {
        put_str(v, len, DRIVER_VERSION)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(v: *mut c_char, len: c_uint) -> nvmlReturn_t {
    // SAFETY: NVML's contract for `v` and `len`.
    call("nvmlSystemGetNVMLVersion", None, |_, _| unsafe {
        put_str(v, len, NVML_VERSION)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: NVML's contract for `v`.
    call("nvmlSystemGetCudaDriverVersion_v2", None, |_, _| unsafe {
        put(v, CUDA_VERSION)
    })
}

// ------------------------------------------------------------- devices

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: NVML's contract for `count`.
    call("nvmlDeviceGetCount_v2", None, |_, st| unsafe {
        put(count, st.gpus.len() as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    call("nvmlDeviceGetHandleByIndex_v2", Some(index), |_, st| {
        gpu_state(st, index)?;
        // SAFETY: NVML's contract for `out`.
        unsafe { put(out, gpu_handle(index)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    call("nvmlDeviceGetHandleByUUID", None, |_, st| {
        nonnull(uuid)?;
        nonnull(out)?;
        // SAFETY: a non-null NUL-terminated string (NVML's contract).
        let wanted = unsafe { CStr::from_ptr(uuid) }.to_string_lossy();
        let mut found = None;
        for (i, gpu) in st.gpus.iter().enumerate() {
            if gpu.uuid == wanted {
                found = Some(gpu_handle(i as u32));
            }
            for gi in &gpu.instances {
                if let Some(ci) = gi.ci.as_ref().filter(|c| c.uuid == wanted) {
                    found = Some(mig_handle(i as u32, gi.id, ci.id));
                }
            }
        }
        // SAFETY: checked non-null above.
        unsafe { put(out, found.ok_or(NOT_FOUND)?) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    dev: nvmlDevice_t,
    name: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    call(
        "nvmlDeviceGetName",
        decode_dev(dev).map(Dev::gpu),
        |_, st| {
            let d = device(st, dev)?;
            let gpu = &st.gpus[d.gpu() as usize];
            let mut s = mig::device_name(gpu.model);
            if let Dev::Mig { gi, .. } = d {
                let p = gpu
                    .instances
                    .iter()
                    .find(|g| g.id == gi)
                    .and_then(|g| mig::profile_by_id(gpu, g.profile_id))
                    .ok_or(INVALID_ARGUMENT)?;
                s = format!("{s} MIG {}", p.label());
            }
            // SAFETY: NVML's contract for `name` and `len`.
            unsafe { put_str(name, len, &s) }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    dev: nvmlDevice_t,
    uuid: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    call(
        "nvmlDeviceGetUUID",
        decode_dev(dev).map(Dev::gpu),
        |_, st| {
            let d = device(st, dev)?;
            let gpu = &st.gpus[d.gpu() as usize];
            let s = match d {
                Dev::Gpu(_) => gpu.uuid.clone(),
                Dev::Mig { gi, .. } => gpu
                    .instances
                    .iter()
                    .find(|g| g.id == gi)
                    .and_then(|g| g.ci.as_ref())
                    .map(|c| c.uuid.clone())
                    .ok_or(INVALID_ARGUMENT)?,
            };
            // SAFETY: NVML's contract for `uuid` and `len`.
            unsafe { put_str(uuid, len, &s) }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    dev: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    call(
        "nvmlDeviceGetMinorNumber",
        decode_dev(dev).map(Dev::gpu),
        |_, st| {
            let g = whole_gpu(st, dev)?;
            // SAFETY: NVML's contract for `minor`.
            unsafe { put(minor, g) }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    call(
        "nvmlDeviceGetIndex",
        decode_dev(dev).map(Dev::gpu),
        |_, st| {
            let g = whole_gpu(st, dev)?;
            // SAFETY: NVML's contract for `index`.
            unsafe { put(index, g) }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    dev: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    call(
        "nvmlDeviceGetMigMode",
        decode_dev(dev).map(Dev::gpu),
        |_, st| {
            nonnull(current)?;
            nonnull(pending)?;
            let g = whole_gpu(st, dev)?;
            let gpu = &st.gpus[g as usize];
            let mode = |on: bool| {
                if on {
                    sys::NVML_DEVICE_MIG_ENABLE
                } else {
                    sys::NVML_DEVICE_MIG_DISABLE
                }
            };
            // SAFETY: checked non-null; NVML's contract.
            unsafe {
                put(current, mode(gpu.mig_current))?;
                put(pending, mode(gpu.mig_pending))
            }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    dev: nvmlDevice_t,
    out: *mut sys::nvmlMemory_t,
) -> nvmlReturn_t {
    call(
        "nvmlDeviceGetMemoryInfo",
        decode_dev(dev).map(Dev::gpu),
        |_, st| {
            let (total, used) = memory(st, device(st, dev)?);
            let m = sys::nvmlMemory_t {
                total,
                free: total.saturating_sub(used),
                used,
            };
            // SAFETY: NVML's contract for `out`.
            unsafe { put(out, m) }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: nvmlDevice_t,
    out: *mut sys::nvmlMemory_v2_t,
) -> nvmlReturn_t {
    call(
        "nvmlDeviceGetMemoryInfo_v2",
        decode_dev(dev).map(Dev::gpu),
        |_, st| {
            nonnull(out)?;
            // SAFETY: non-null; the caller set `version` (nvml.h: nvmlMemory_v2).
            let version = unsafe { (*out).version };
            if version != (std::mem::size_of::<sys::nvmlMemory_v2_t>() as c_uint | (2 << 24)) {
                return Err(VERSION_MISMATCH);
            }
            let (total, used) = memory(st, device(st, dev)?);
            let m = sys::nvmlMemory_v2_t {
                version,
                total,
                reserved: 0,
                free: total.saturating_sub(used),
                used,
            };
            // SAFETY: checked non-null.
            unsafe { put(out, m) }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut sys::nvmlProcessInfo_t,
) -> nvmlReturn_t {
    let gpu = decode_dev(dev).map(Dev::gpu);
    call("nvmlDeviceGetComputeRunningProcesses_v3", gpu, |_, st| {
        nonnull(count)?;
        let procs = processes(st, device(st, dev)?);
        // SAFETY: checked non-null; `infos` holds `*count` entries (NVML's contract).
        unsafe {
            let room = *count as usize;
            *count = procs.len() as c_uint;
            if room < procs.len() {
                return Err(INSUFFICIENT_SIZE);
            }
            if !procs.is_empty() {
                nonnull(infos)?;
            }
            for (i, &(pid, bytes, gi, ci)) in procs.iter().enumerate() {
                infos.add(i).write(sys::nvmlProcessInfo_t {
                    pid,
                    usedGpuMemory: bytes,
                    gpuInstanceId: gi,
                    computeInstanceId: ci,
                });
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    dev: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    let gpu = decode_dev(dev).map(Dev::gpu);
    call("nvmlDeviceGetTotalEnergyConsumption", gpu, |_, st| {
        let g = whole_gpu(st, dev)?;
        // SAFETY: NVML's contract for `energy`.
        unsafe { put(energy, st.gpus[g as usize].energy_mj) }
    })
}

// ------------------------------------------------------- MIG profiles

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    dev: nvmlDevice_t,
    profile: c_uint,
    info: *mut sys::nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    let gpu = decode_dev(dev).map(Dev::gpu);
    call("nvmlDeviceGetGpuInstanceProfileInfo", gpu, |_, st| {
        nonnull(info)?;
        let g = &st.gpus[whole_gpu(st, dev)? as usize];
        let p = mig::profile_by_index(g, profile)?;
        // SAFETY: checked non-null.
        unsafe { put(info, mig::profile_info(g.model, &p)) }
    })
}

/// The versioned profile info with the profile's name (nvml.h: `info->version`
/// must be `nvmlGpuInstanceProfileInfo_v2`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    dev: nvmlDevice_t,
    profile: c_uint,
    info: *mut sys::nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    let gpu = decode_dev(dev).map(Dev::gpu);
    call("nvmlDeviceGetGpuInstanceProfileInfoV", gpu, |_, st| {
        nonnull(info)?;
        // SAFETY: checked non-null; the caller set `version`.
        let version = unsafe { (*info).version };
        if version != mig::PROFILE_INFO_V2 {
            return Err(VERSION_MISMATCH);
        }
        let g = &st.gpus[whole_gpu(st, dev)? as usize];
        let p = mig::profile_by_index(g, profile)?;
        // SAFETY: checked non-null.
        unsafe { put(info, mig::profile_info_v2(g.model, &p)) }
    })
}

/// The GPU of `dev` (in MIG mode if `need_mig`) and the profile of driver
/// id `profile_id`, for a privileged caller (nvml.h: "Requires privileged
/// user" on every call that takes a profile id).
fn mig_profile(
    st: &State,
    dev: nvmlDevice_t,
    profile_id: c_uint,
    need_mig: bool,
) -> Result<(u32, smartmig_mig::DriverProfile), Code> {
    let g = whole_gpu(st, dev)?;
    let gpu = &st.gpus[g as usize];
    if need_mig && !gpu.mig_current {
        return Err(NOT_SUPPORTED);
    }
    let p = mig::profile_by_id(gpu, profile_id).ok_or(INVALID_ARGUMENT)?;
    root()?;
    Ok((g, p))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    dev: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut sys::nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let gpu = decode_dev(dev).map(Dev::gpu);
    call(
        "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        gpu,
        |_, st| {
            nonnull(count)?;
            // nvml.h: the placements "regardless of whether MIG is enabled".
            let (_, p) = mig_profile(st, dev, profile_id, false)?;
            let all = mig::placements(&p);
            // SAFETY: checked non-null; a non-null `placements` holds every
            // placement of the profile (nvml.h: "must be large enough").
            unsafe {
                *count = all.len() as c_uint;
                if !placements.is_null() {
                    for (i, &(start, size)) in all.iter().enumerate() {
                        placements
                            .add(i)
                            .write(sys::nvmlGpuInstancePlacement_t { start, size });
                    }
                }
            }
            Ok(())
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    dev: nvmlDevice_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let gpu = decode_dev(dev).map(Dev::gpu);
    call("nvmlDeviceGetGpuInstanceRemainingCapacity", gpu, |_, st| {
        let (g, p) = mig_profile(st, dev, profile_id, true)?;
        let n = mig::remaining_capacity(&st.gpus[g as usize], &p);
        // SAFETY: NVML's contract for `count`.
        unsafe { put(count, n) }
    })
}

// ------------------------------------------------------ GPU instances

fn create_gi(
    name: &'static str,
    dev: nvmlDevice_t,
    profile_id: c_uint,
    placement: Option<*const sys::nvmlGpuInstancePlacement_t>,
    out: *mut nvmlGpuInstance_t,
) -> Code {
    call(name, decode_dev(dev).map(Dev::gpu), |dir, st| {
        nonnull(out)?;
        let placement = match placement {
            Some(p) => {
                nonnull(p)?;
                // SAFETY: non-null, pointing at a placement (NVML's contract).
                let p = unsafe { *p };
                Some((p.start, p.size))
            }
            None => None,
        };
        let g = whole_gpu(st, dev)?;
        if !st.gpus[g as usize].mig_current {
            return Err(NOT_SUPPORTED);
        }
        root()?;
        let id = mig::create_gi(dir, st, g, profile_id, placement)?;
        // SAFETY: checked non-null.
        unsafe { put(out, gi_handle(g, id)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    dev: nvmlDevice_t,
    profile_id: c_uint,
    out: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    create_gi("nvmlDeviceCreateGpuInstance", dev, profile_id, None, out)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    dev: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const sys::nvmlGpuInstancePlacement_t,
    out: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    let name = "nvmlDeviceCreateGpuInstanceWithPlacement";
    create_gi(name, dev, profile_id, Some(placement), out)
}

#[no_mangle]
pub extern "C" fn nvmlGpuInstanceDestroy(gi: nvmlGpuInstance_t) -> nvmlReturn_t {
    call(
        "nvmlGpuInstanceDestroy",
        decode_gi(gi).map(|g| g.0),
        |dir, st| {
            let (g, id) = gpu_instance(st, gi)?;
            root()?;
            mig::destroy_gi(dir, gpu_state(st, g)?, g, id)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    dev: nvmlDevice_t,
    profile_id: c_uint,
    out: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(
        "nvmlDeviceGetGpuInstances",
        decode_dev(dev).map(Dev::gpu),
        |_, st| {
            nonnull(out)?;
            nonnull(count)?;
            let (g, _) = mig_profile(st, dev, profile_id, true)?;
            let ids: Vec<u32> = st.gpus[g as usize]
                .instances
                .iter()
                .filter(|i| i.profile_id == profile_id)
                .map(|i| i.id)
                .collect();
            // SAFETY: checked non-null; `out` holds the profile's instanceCount
            // handles (nvml.h), and at most that many instances exist.
            unsafe {
                for (i, &id) in ids.iter().enumerate() {
                    out.add(i).write(gi_handle(g, id));
                }
                *count = ids.len() as c_uint;
            }
            Ok(())
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    dev: nvmlDevice_t,
    id: c_uint,
    out: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    call(
        "nvmlDeviceGetGpuInstanceById",
        decode_dev(dev).map(Dev::gpu),
        |_, st| {
            nonnull(out)?;
            let g = whole_gpu(st, dev)?;
            let gpu = &st.gpus[g as usize];
            if !gpu.mig_current {
                return Err(NOT_SUPPORTED);
            }
            root()?;
            gpu.instances.iter().find(|i| i.id == id).ok_or(NOT_FOUND)?;
            // SAFETY: checked non-null.
            unsafe { put(out, gi_handle(g, id)) }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gi: nvmlGpuInstance_t,
    info: *mut sys::nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    call(
        "nvmlGpuInstanceGetInfo",
        decode_gi(gi).map(|g| g.0),
        |_, st| {
            let (g, id) = gpu_instance(st, gi)?;
            let i = st.gpus[g as usize]
                .instances
                .iter()
                .find(|i| i.id == id)
                .ok_or(INVALID_ARGUMENT)?;
            let v = sys::nvmlGpuInstanceInfo_t {
                device: gpu_handle(g),
                id,
                profileId: i.profile_id,
                placement: sys::nvmlGpuInstancePlacement_t {
                    start: i.start,
                    size: i.size,
                },
            };
            // SAFETY: NVML's contract for `info`.
            unsafe { put(info, v) }
        },
    )
}

// -------------------------------------------------- compute instances

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut sys::nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    let name = "nvmlGpuInstanceGetComputeInstanceProfileInfo";
    call(name, decode_gi(gi).map(|g| g.0), |_, st| {
        nonnull(info)?;
        if eng_profile >= sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT {
            return Err(INVALID_ARGUMENT);
        }
        let (g, id) = gpu_instance(st, gi)?;
        let gpu = &st.gpus[g as usize];
        let i = gpu.instances.iter().find(|i| i.id == id);
        let slices = i.map_or(0, |i| mig::gi_compute(gpu, i));
        let v = mig::ci_profile_info(gpu.model, profile, slices)?;
        // SAFETY: checked non-null.
        unsafe { put(info, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    out: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    let name = "nvmlGpuInstanceCreateComputeInstance";
    call(name, decode_gi(gi).map(|g| g.0), |dir, st| {
        nonnull(out)?;
        let (g, id) = gpu_instance(st, gi)?;
        root()?;
        let ci = mig::create_ci(dir, st, g, id, profile_id)?;
        // SAFETY: checked non-null.
        unsafe { put(out, ci_handle(g, id, ci)) }
    })
}

/// A compute-instance handle naming one that exists: (gpu, gi, ci).
fn compute_instance(st: &State, h: nvmlComputeInstance_t) -> Result<(u32, u32, u32), Code> {
    let (g, gi, ci) = decode_ci(h).ok_or(INVALID_ARGUMENT)?;
    st.gpus
        .get(g as usize)
        .and_then(|gpu| gpu.instances.iter().find(|i| i.id == gi))
        .and_then(|i| i.ci.as_ref())
        .filter(|c| c.id == ci)
        .ok_or(INVALID_ARGUMENT)?;
    Ok((g, gi, ci))
}

#[no_mangle]
pub extern "C" fn nvmlComputeInstanceDestroy(ci: nvmlComputeInstance_t) -> nvmlReturn_t {
    call(
        "nvmlComputeInstanceDestroy",
        decode_ci(ci).map(|c| c.0),
        |dir, st| {
            let (g, gi, c) = compute_instance(st, ci)?;
            root()?;
            mig::destroy_ci(dir, gpu_state(st, g)?, g, gi, c)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    out: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let name = "nvmlGpuInstanceGetComputeInstances";
    call(name, decode_gi(gi).map(|g| g.0), |_, st| {
        nonnull(out)?;
        nonnull(count)?;
        mig::ci_slices(profile_id)?;
        let (g, id) = gpu_instance(st, gi)?;
        root()?;
        let ci = st.gpus[g as usize]
            .instances
            .iter()
            .find(|i| i.id == id)
            .and_then(|i| i.ci.as_ref())
            .filter(|c| c.profile_id == profile_id)
            .map(|c| c.id);
        // SAFETY: checked non-null; `out` holds the profile's instanceCount
        // (>= 1) handles (nvml.h).
        unsafe {
            if let Some(c) = ci {
                out.write(ci_handle(g, id, c));
            }
            *count = c_uint::from(ci.is_some());
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gi: nvmlGpuInstance_t,
    id: c_uint,
    out: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    let name = "nvmlGpuInstanceGetComputeInstanceById";
    call(name, decode_gi(gi).map(|g| g.0), |_, st| {
        nonnull(out)?;
        let (g, gid) = gpu_instance(st, gi)?;
        root()?;
        st.gpus[g as usize]
            .instances
            .iter()
            .find(|i| i.id == gid)
            .and_then(|i| i.ci.as_ref())
            .filter(|c| c.id == id)
            .ok_or(NOT_FOUND)?;
        // SAFETY: checked non-null.
        unsafe { put(out, ci_handle(g, gid, id)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    ci: nvmlComputeInstance_t,
    info: *mut sys::nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    call(
        "nvmlComputeInstanceGetInfo_v2",
        decode_ci(ci).map(|c| c.0),
        |_, st| {
            let (g, gi, c) = compute_instance(st, ci)?;
            let i = st.gpus[g as usize]
                .instances
                .iter()
                .find(|i| i.id == gi)
                .and_then(|i| i.ci.as_ref())
                .ok_or(INVALID_ARGUMENT)?;
            let v = sys::nvmlComputeInstanceInfo_t {
                device: gpu_handle(g),
                gpuInstance: gi_handle(g, gi),
                id: c,
                profileId: i.profile_id,
                placement: sys::nvmlComputeInstancePlacement_t {
                    start: 0,
                    size: i.slices,
                },
            };
            // SAFETY: NVML's contract for `info`.
            unsafe { put(info, v) }
        },
    )
}

// -------------------------------------------------------- MIG devices

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    dev: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let gpu = decode_dev(dev).map(Dev::gpu);
    call("nvmlDeviceGetMaxMigDeviceCount", gpu, |_, st| {
        let g = whole_gpu(st, dev)?;
        let n = st.gpus[g as usize].model.spec().compute_slices;
        // SAFETY: NVML's contract for `count`.
        unsafe { put(count, c_uint::from(n)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    dev: nvmlDevice_t,
    index: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let gpu = decode_dev(dev).map(Dev::gpu);
    call("nvmlDeviceGetMigDeviceHandleByIndex", gpu, |_, st| {
        nonnull(out)?;
        let g = whole_gpu(st, dev)?;
        let gpu = &st.gpus[g as usize];
        if !gpu.mig_current {
            return Err(NOT_SUPPORTED);
        }
        if index >= c_uint::from(gpu.model.spec().compute_slices) {
            return Err(INVALID_ARGUMENT);
        }
        let &(gi, ci) = mig::mig_devices(gpu).get(index as usize).ok_or(NOT_FOUND)?;
        // SAFETY: checked non-null.
        unsafe { put(out, mig_handle(g, gi, ci)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    dev: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    let gpu = decode_dev(dev).map(Dev::gpu);
    call("nvmlDeviceIsMigDeviceHandle", gpu, |_, st| {
        let d = device(st, dev)?;
        // SAFETY: NVML's contract for `is_mig`.
        unsafe { put(is_mig, c_uint::from(matches!(d, Dev::Mig { .. }))) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: nvmlDevice_t,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let gpu = decode_dev(mig).map(Dev::gpu);
    call(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        gpu,
        |_, st| {
            let d = device(st, mig)?;
            let (g, _, _) = mig_only(d).map_err(|_| INVALID_ARGUMENT)?;
            // SAFETY: NVML's contract for `out`.
            unsafe { put(out, gpu_handle(g)) }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    dev: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    let gpu = decode_dev(dev).map(Dev::gpu);
    call("nvmlDeviceGetGpuInstanceId", gpu, |_, st| {
        let (_, gi, _) = mig_only(device(st, dev)?)?;
        // SAFETY: NVML's contract for `id`.
        unsafe { put(id, gi) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    dev: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    let gpu = decode_dev(dev).map(Dev::gpu);
    call("nvmlDeviceGetComputeInstanceId", gpu, |_, st| {
        let (_, _, ci) = mig_only(device(st, dev)?)?;
        // SAFETY: NVML's contract for `id`.
        unsafe { put(id, ci) }
    })
}

// ---------------------------------------------------------------- events

const SET_TAG: u64 = 4;

fn set_handle(id: u32) -> sys::nvmlEventSet_t {
    to_ptr((SET_TAG << 32) | u64::from(id))
}

fn decode_set(h: sys::nvmlEventSet_t) -> Option<u32> {
    let v = value(h);
    (v >> 32 == SET_TAG).then_some((v & 0xFFFF_FFFF) as u32)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut sys::nvmlEventSet_t) -> nvmlReturn_t {
    call("nvmlEventSetCreate", None, |_, st| {
        nonnull(set)?;
        let id = st.events.create_set();
        // SAFETY: NVML's contract for `set`.
        unsafe { put(set, set_handle(id)) }
    })
}

#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: sys::nvmlEventSet_t) -> nvmlReturn_t {
    call("nvmlEventSetFree", None, |_, st| {
        let id = decode_set(set).ok_or(INVALID_ARGUMENT)?;
        if st.events.free_set(id) {
            Ok(())
        } else {
            Err(INVALID_ARGUMENT)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    dev: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    call(
        "nvmlDeviceGetSupportedEventTypes",
        decode_dev(dev).map(Dev::gpu),
        |_, st| {
            whole_gpu(st, dev)?;
            // SAFETY: NVML's contract for `types`.
            unsafe { put(types, crate::event::XID_CRITICAL_ERROR) }
        },
    )
}

/// Registers a whole GPU of the set for XIDs (the only event type the
/// emulator has: other types are NOT_SUPPORTED, as on a GPU that lacks them).
#[no_mangle]
pub extern "C" fn nvmlDeviceRegisterEvents(
    dev: nvmlDevice_t,
    types: c_ulonglong,
    set: sys::nvmlEventSet_t,
) -> nvmlReturn_t {
    call(
        "nvmlDeviceRegisterEvents",
        decode_dev(dev).map(Dev::gpu),
        |_, st| {
            let gpu = whole_gpu(st, dev)?;
            if types & !crate::event::XID_CRITICAL_ERROR != 0 {
                return Err(NOT_SUPPORTED);
            }
            let id = decode_set(set).ok_or(INVALID_ARGUMENT)?;
            let s = st.events.set_mut(id).ok_or(INVALID_ARGUMENT)?;
            if !s.gpus.contains(&gpu) {
                s.gpus.push(gpu);
            }
            Ok(())
        },
    )
}

/// Hands out the set's next XID, waiting up to `timeoutms` for one
/// (`NVML_ERROR_TIMEOUT` when none came). The wait polls the state
/// read-only every 20 ms and counts as one call.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: sys::nvmlEventSet_t,
    data: *mut sys::nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(u64::from(timeoutms));
    let mut first = true;
    loop {
        let mut got = None;
        let take = |_: &Path, st: &mut State| {
            nonnull(data)?;
            let id = decode_set(set).ok_or(INVALID_ARGUMENT)?;
            st.events.set_mut(id).ok_or(INVALID_ARGUMENT)?;
            got = st.events.take(id);
            Ok(())
        };
        let code = if first {
            call("nvmlEventSetWait_v2", None, take)
        } else {
            call_uncounted(take)
        };
        first = false;
        if code != SUCCESS {
            return code;
        }
        if let Some(x) = got {
            let out = sys::nvmlEventData_t {
                device: gpu_handle(x.gpu),
                eventType: crate::event::XID_CRITICAL_ERROR,
                eventData: x.xid,
                gpuInstanceId: x.gpu_instance,
                computeInstanceId: x.compute_instance,
            };
            // SAFETY: NVML's contract for `data` (checked non-null above).
            return guard(|| unsafe { put(data, out) }.err().unwrap_or(SUCCESS));
        }
        if !poll_until(set, deadline) {
            return sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
        }
    }
}

/// Sleeps in 20 ms steps until set `set` has an XID waiting (true) or
/// `deadline` passes (false), reading the state without changing it.
fn poll_until(set: sys::nvmlEventSet_t, deadline: std::time::Instant) -> bool {
    let Some(id) = decode_set(set) else {
        return false;
    };
    let Some(dir) = DIR.lock().unwrap_or_else(PoisonError::into_inner).clone() else {
        return false;
    };
    loop {
        if state::peek(&dir, |st| st.events.peek(id).is_some()).unwrap_or(false) {
            return true;
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep((deadline - now).min(std::time::Duration::from_millis(20)));
    }
}

/// A transaction that neither counts as a call nor consults the faults.
fn call_uncounted(op: impl FnOnce(&Path, &mut State) -> Result<(), Code>) -> Code {
    guard(|| {
        let dir = DIR.lock().unwrap_or_else(PoisonError::into_inner).clone();
        match dir {
            Some(dir) if INIT.load(Ordering::SeqCst) > 0 => {
                match state::transact(&dir, |st| op(&dir, st)) {
                    Ok(r) => r.err().unwrap_or(SUCCESS),
                    Err(e) => {
                        eprintln!("smartmig-nvml-emu: nvmlEventSetWait_v2: {e}");
                        UNKNOWN
                    }
                }
            }
            _ => UNINITIALIZED,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip() {
        assert_eq!(decode_set(set_handle(5)), Some(5));
        assert_eq!(decode_set(gpu_handle(5).cast()), None);
        assert_eq!(decode_dev(gpu_handle(3)), Some(Dev::Gpu(3)));
        assert_eq!(
            decode_dev(mig_handle(1, 13, 0)),
            Some(Dev::Mig {
                gpu: 1,
                gi: 13,
                ci: 0
            })
        );
        assert_eq!(decode_gi(gi_handle(2, 7)), Some((2, 7)));
        assert_eq!(decode_ci(ci_handle(2, 7, 1)), Some((2, 7, 1)));
        // A handle of one kind is no handle of another.
        assert_eq!(decode_dev(gi_handle(0, 0).cast()), None);
        assert_eq!(decode_gi(gpu_handle(0).cast()), None);
        assert_eq!(decode_ci(mig_handle(0, 0, 0).cast()), None);
        assert_eq!(decode_dev(std::ptr::null_mut()), None);
    }
}
