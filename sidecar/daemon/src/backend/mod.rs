//! The MIG backends: the small interface the daemon needs from the hardware.
//!
//! Two implementations: [`sim::SimBackend`] (simulated GPUs, same geometry
//! rules, persisted in the state dir) and [`nvml::NvmlBackend`] (real GPUs).
//! The interface is deliberately narrow (list, create at a placement,
//! destroy) so that every decision stays in the pure core and the backends
//! only execute.

pub mod inventory;
pub mod nvml;
pub mod sim;

use std::path::PathBuf;
use std::time::Duration;

use crate::health::XidEvent;

use crate::mig::{GpuModel, Shape, SpotId};

/// One GPU the backend drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub model: GpuModel,
    /// The minor number of its device file (`/dev/nvidia<minor>`): what
    /// Slurm's gres.conf names. The sim backend's GPU i is minor i.
    pub minor: Option<u32>,
}

/// An instance as the hardware reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendInstance {
    pub placement: SpotId,
    /// `MIG-<uuid>`.
    pub uuid: String,
}

/// What a backend operation can fail with. The NVML codes that matter get
/// their own variants so logs and replies say what happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("GPU {gpu}: instance {what} is in use (NVML_ERROR_IN_USE)")]
    InUse { gpu: u32, what: String },
    #[error("GPU {gpu}: insufficient resources for {what} (NVML_ERROR_INSUFFICIENT_RESOURCES)")]
    InsufficientResources { gpu: u32, what: String },
    #[error("GPU {gpu}: {what} is not supported (NVML_ERROR_NOT_SUPPORTED)")]
    NotSupported { gpu: u32, what: String },
    #[error("GPU {gpu}: no permission for {what} (NVML_ERROR_NO_PERMISSION): smartmigd must run as root")]
    NoPermission { gpu: u32, what: String },
    /// The call did not answer in time: the operation may or may not have
    /// happened (the daemon re-reads the GPU's instances after it).
    #[error("GPU {gpu}: {what} timed out (NVML_ERROR_TIMEOUT); the GPU's instances are re-read")]
    Timeout { gpu: u32, what: String },
    #[error("GPU {gpu}: unknown instance {uuid}")]
    UnknownInstance { gpu: u32, uuid: String },
    #[error("no GPU {gpu} on this node ({count} GPUs)")]
    NoSuchGpu { gpu: u32, count: u32 },
    #[error("NVML library not found (libnvidia-ml.so.1): {0}")]
    LibraryNotFound(String),
    #[error("GPU {gpu} ({name}): MIG mode is off; enable it with `nvidia-smi -i {gpu} -mig 1` (and a GPU reset) -- smartmigd never toggles MIG mode")]
    MigDisabled { gpu: u32, name: String },
    #[error("GPU {gpu}: unsupported GPU model \"{name}\"")]
    UnsupportedModel { gpu: u32, name: String },
    /// The driver's profiles are not the table's: the GPU is not managed.
    #[error("GPU {gpu} ({name}): the driver's MIG profiles differ from smartmig's {model} table: {differences}; smartmigd does not manage a GPU it cannot describe (run `smartmig doctor`, and report the lines so sidecar/mig/src/models.rs can follow)")]
    TableMismatch {
        gpu: u32,
        name: String,
        model: GpuModel,
        differences: String,
    },
    #[error("state file {path}: {message}")]
    State { path: String, message: String },
    #[error("{0}")]
    Other(String),
}

impl BackendError {
    /// The error a `[[sim.inject_errors]]` entry names (None if unknown).
    pub fn injected(name: &str, what: &str) -> Option<BackendError> {
        let what = format!("{what} (injected)");
        Some(match name {
            "in_use" => BackendError::InUse { gpu: 0, what },
            "insufficient_resources" => BackendError::InsufficientResources { gpu: 0, what },
            "not_supported" => BackendError::NotSupported { gpu: 0, what },
            "no_permission" => BackendError::NoPermission { gpu: 0, what },
            "timeout" => BackendError::Timeout { gpu: 0, what },
            "other" => BackendError::Other(what),
            _ => return None,
        })
    }
}

/// The hardware interface. Implementations are blocking (NVML is); the
/// daemon calls them from blocking sections, serialised per GPU.
/// One reading of an instance's framebuffer (GB = 1e9 bytes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryUse {
    pub used_gb: f64,
    pub total_gb: f64,
}

pub trait Backend: Send + Sync {
    /// `sim` or `nvml`.
    fn name(&self) -> &'static str;
    /// The GPUs, by index.
    fn gpus(&self) -> Vec<GpuInfo>;
    /// The name the driver gives the profile of `shape` on `gpu` (it may
    /// rename a profile: GB300's `3g.139gb` is `3g.126gb` on R61x
    /// drivers); `None`: the table's name stands.
    fn profile_name(&self, _gpu: u32, _shape: Shape) -> Option<String> {
        None
    }
    /// The instances that exist on `gpu` now.
    fn list(&self, gpu: u32) -> Result<Vec<BackendInstance>, BackendError>;
    /// Creates a GPU instance and its compute instance at `placement`; returns its uuid.
    fn create(&self, gpu: u32, placement: SpotId) -> Result<String, BackendError>;
    /// Destroys an instance (compute instance first, then the GPU instance).
    fn destroy(&self, gpu: u32, uuid: &str) -> Result<(), BackendError>;
    /// The device files whose opening grants the use of instance `uuid`
    /// of `gpu`: its GPU instance's and its compute instance's capability
    /// files (`/dev/nvidia-caps/nvidia-cap<M>` on real GPUs). The daemon
    /// gives them to the job's user and back to root ([`crate::access`]).
    fn access_files(&self, gpu: u32, uuid: &str) -> Result<Vec<PathBuf>, BackendError>;
    /// The GPU-instance id of instance `uuid` of `gpu` (what DCGM labels
    /// `GPU_I_ID` and names HPC job-mapping files by), if known.
    fn gpu_instance_id(&self, _gpu: u32, _uuid: &str) -> Option<u32> {
        None
    }
    /// The GPU's own UUID (`GPU-...`, DCGM's `UUID` label, also on its MIG
    /// instances' series), if the backend has one.
    fn gpu_uuid(&self, _gpu: u32) -> Option<String> {
        None
    }
    /// Energy used by `gpu` since the backend started (J), if known.
    fn energy_j(&self, _gpu: u32) -> Option<f64> {
        None
    }
    /// GPU memory (GB = 1e9 bytes) instance `uuid` of `gpu` uses, as far as
    /// the backend can tell, or `None` when it cannot.
    ///
    /// NVML reports the *current* framebuffer use of a MIG device, not a
    /// peak, so the nvml backend returns the current use and the daemon
    /// samples it every `memory.sample_s` seconds while the job runs,
    /// keeping the largest sample as the job's peak: a spike shorter than
    /// the sampling period can be missed. The sim backend has no memory to
    /// measure (`None`); there the release request's `used_memory_gb` is
    /// the job's peak.
    fn peak_memory_gb(&self, gpu: u32, uuid: &str) -> Option<f64> {
        self.memory_use(gpu, uuid).map(|m| m.used_gb)
    }
    /// The memory instance `uuid` of `gpu` uses now and has in all (GB), as
    /// far as the backend can tell. The total is the instance's real size
    /// (an A100-40GB `1g.5gb` has 4.875 GB, not 5), which is what the
    /// early-restart rule must compare with: a job fails at the real size.
    fn memory_use(&self, _gpu: u32, _uuid: &str) -> Option<MemoryUse> {
        None
    }
    /// Whether [`Backend::peak_memory_gb`] can measure anything, so the
    /// daemon should sample it while jobs run (false: no sampling task).
    fn measures_memory(&self) -> bool {
        false
    }
    /// A watcher of the GPUs' XID events, for the daemon's one XID thread
    /// to own; `None` when the backend reports none (no listener then).
    fn xid_watch(&self) -> Option<Box<dyn XidWatch>> {
        None
    }
}

/// The GPUs' XID events, waited for by the one thread that owns this (an
/// I/O edge, like the journal's writer): what it waits on (NVML's event
/// set) is its own, so no lock is shared with the backend.
pub trait XidWatch: Send {
    /// Waits up to `timeout` for the GPUs' next XID event (NVML's
    /// `nvmlEventSetWait_v2` on an event set registered for
    /// `nvmlEventTypeXidCriticalError`); `Ok(None)` when none came.
    fn next(&mut self, timeout: Duration) -> Result<Option<XidEvent>, BackendError>;
}
