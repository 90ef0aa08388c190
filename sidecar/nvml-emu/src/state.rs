//! The emulated hardware: one JSON file, shared by every process.
//!
//! smartmigd, the `smartmig` CLI and a test process each load their own
//! copy of the library (or link the rlib), so nothing may live in process
//! memory: every call runs as a transaction on `<dir>/state.json` under an
//! exclusive `flock` on `<dir>/state.lock`, and the new state replaces the
//! old one atomically (temp file + rename), so a reader never sees half a
//! file and a crash mid-call leaves the previous state.
//!
//! Each transaction also advances the wall clock the state keeps: the GPUs'
//! energy counters grow with the time that passed (60 W idle plus 40 W per
//! compute instance that has a process), so they are monotonic and move
//! between two reads.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use smartmig_mig::GpuModel;

use crate::fault::{Fault, Fired};

pub const STATE_FILE: &str = "state.json";
pub const LOCK_FILE: &str = "state.lock";

/// Idle power of a GPU, and what each busy compute instance adds (W).
const IDLE_W: u64 = 60;
const BUSY_W: u64 = 40;

/// Everything the emulated driver knows.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct State {
    pub gpus: Vec<GpuState>,
    /// Pending faults, consulted in order ([`crate::fault`]).
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// Injected XID events and the event sets reading them ([`crate::event`]).
    #[serde(default)]
    pub events: crate::event::Events,
    /// Calls per exported NVML function.
    #[serde(default)]
    pub calls: BTreeMap<String, u64>,
    /// Seed of this state's UUIDs (so two states never share one).
    pub seed: u64,
    /// Compute instances created so far: the next MIG UUID's number.
    pub next_uuid: u64,
    /// Generator state of the random faults.
    pub rng: u64,
    /// Wall clock (ms since the epoch) of the last transaction.
    pub clock_ms: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpuState {
    pub model: GpuModel,
    pub uuid: String,
    pub mig_current: bool,
    pub mig_pending: bool,
    /// `nvmlDeviceGetTotalEnergyConsumption`, mJ.
    pub energy_mj: u64,
    /// GPU instances, by id.
    pub instances: Vec<GpuInstance>,
    /// The driver's profile list when a test replaced the table's
    /// ([`crate::mig::driver_profiles`]).
    #[serde(default)]
    pub driver: Option<Vec<smartmig_mig::DriverProfile>>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpuInstance {
    pub id: u32,
    /// `nvmlGpuInstanceProfileInfo_t.id` (the table's `smi_id`).
    pub profile_id: u32,
    /// Memory slots: first and how many.
    pub start: u32,
    pub size: u32,
    pub ci: Option<ComputeInstance>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ComputeInstance {
    pub id: u32,
    /// `NVML_COMPUTE_INSTANCE_PROFILE_*` index it was created with.
    pub profile_id: u32,
    pub slices: u32,
    /// `MIG-...`.
    pub uuid: String,
    pub processes: Vec<Process>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    pub used_bytes: u64,
}

/// What can go wrong with the emulator's files or a test's request.
#[derive(Debug, thiserror::Error)]
pub enum EmuError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not an NVML emulator state: {source}")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: no GPU {gpu} (the emulator has {count})")]
    NoSuchGpu { path: PathBuf, gpu: u32, count: u32 },
    #[error("{path}: no MIG device {uuid}")]
    NoSuchInstance { path: PathBuf, uuid: String },
    #[error("{path}: {message}")]
    Refused { path: PathBuf, message: String },
}

impl EmuError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> EmuError {
        EmuError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl State {
    /// A fresh state over `gpus` (model, MIG current, MIG pending).
    pub fn new(gpus: &[(GpuModel, bool, bool)]) -> State {
        let seed = splitmix(now_ms() ^ (u64::from(std::process::id()) << 32));
        let gpus = gpus
            .iter()
            .enumerate()
            .map(|(i, &(model, mig_current, mig_pending))| GpuState {
                model,
                uuid: format!("GPU-{}", uuid_body(seed, 0xFFFF_0000 + i as u64)),
                mig_current,
                mig_pending,
                energy_mj: 0,
                instances: Vec::new(),
                driver: None,
            })
            .collect();
        State {
            gpus,
            faults: Vec::new(),
            events: crate::event::Events::default(),
            calls: BTreeMap::new(),
            seed,
            next_uuid: 0,
            rng: seed,
            clock_ms: now_ms(),
        }
    }

    /// A new MIG UUID, never handed out before by this state.
    pub fn new_mig_uuid(&mut self) -> String {
        self.next_uuid += 1;
        format!("MIG-{}", uuid_body(self.seed, self.next_uuid))
    }

    /// Consults (and consumes) the faults ([`crate::fault`]) for a call of
    /// `call` on `gpu`.
    pub fn take_fault(&mut self, call: &str, gpu: Option<u32>) -> Option<Fired> {
        let i = self
            .faults
            .iter()
            .position(|f| f.call == call && (f.gpu.is_none() || f.gpu == gpu))?;
        if self.faults[i].skip > 0 {
            self.faults[i].skip -= 1;
            return None;
        }
        if let Some(p) = self.faults[i].probability {
            if self.random() >= p {
                return None;
            }
        }
        let f = &mut self.faults[i];
        let fired = Fired {
            error: f.error,
            after: f.after,
            delay_ms: f.delay_ms,
        };
        f.times = f.times.saturating_sub(1);
        if f.times == 0 {
            self.faults.remove(i);
        }
        Some(fired)
    }

    /// A uniform draw in [0, 1) from the state's generator.
    pub fn random(&mut self) -> f64 {
        self.rng = splitmix(self.rng);
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Advances the energy counters to wall-clock time `now_ms`.
    fn advance(&mut self, now_ms: u64) {
        let dt = now_ms.saturating_sub(self.clock_ms);
        for gpu in &mut self.gpus {
            let busy = gpu
                .instances
                .iter()
                .filter(|gi| gi.ci.as_ref().is_some_and(|ci| !ci.processes.is_empty()))
                .count() as u64;
            // W * ms = mJ.
            gpu.energy_mj += (IDLE_W + BUSY_W * busy) * dt;
        }
        self.clock_ms = self.clock_ms.max(now_ms);
    }
}

/// Runs `f` on the state of `dir` under the lock and writes the result
/// back. Fails when there is no state (see [`crate::Emulator::create`]).
pub fn transact<R>(dir: &Path, f: impl FnOnce(&mut State) -> R) -> Result<R, EmuError> {
    let _lock = lock(dir)?;
    let mut state = read(dir)?;
    state.advance(now_ms());
    let out = f(&mut state);
    write(dir, &state)?;
    Ok(out)
}

/// Reads the state of `dir` under the lock, changing nothing (a poll).
pub fn peek<R>(dir: &Path, f: impl FnOnce(&State) -> R) -> Result<R, EmuError> {
    let _lock = lock(dir)?;
    Ok(f(&read(dir)?))
}

/// Replaces the state of `dir` (under the lock).
pub fn replace(dir: &Path, state: &State) -> Result<(), EmuError> {
    let _lock = lock(dir)?;
    write(dir, state)
}

/// Whether `dir` holds a state.
pub fn exists(dir: &Path) -> bool {
    dir.join(STATE_FILE).is_file()
}

/// The exclusive lock; released when the file is closed.
fn lock(dir: &Path) -> Result<File, EmuError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| EmuError::io(&path, e))?;
    loop {
        // SAFETY: a file descriptor this function owns, open until `file` drops.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(file);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(EmuError::io(&path, err));
        }
    }
}

fn read(dir: &Path) -> Result<State, EmuError> {
    let path = dir.join(STATE_FILE);
    let bytes = std::fs::read(&path).map_err(|e| EmuError::io(&path, e))?;
    serde_json::from_slice(&bytes).map_err(|source| EmuError::Corrupt { path, source })
}

fn write(dir: &Path, state: &State) -> Result<(), EmuError> {
    let path = dir.join(STATE_FILE);
    let tmp = dir.join(format!("{STATE_FILE}.{}.tmp", std::process::id()));
    let bytes = serde_json::to_vec_pretty(state).map_err(|source| EmuError::Corrupt {
        path: path.clone(),
        source,
    })?;
    let mut file = File::create(&tmp).map_err(|e| EmuError::io(&tmp, e))?;
    file.write_all(&bytes).map_err(|e| EmuError::io(&tmp, e))?;
    drop(file);
    std::fs::rename(&tmp, &path).map_err(|e| EmuError::io(&path, e))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// SplitMix64: a small, good-enough generator for UUIDs and fault draws.
pub fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` from a seed and a number.
fn uuid_body(seed: u64, n: u64) -> String {
    let hi = splitmix(seed ^ n);
    let lo = splitmix(hi ^ n.rotate_left(32));
    let hex = format!("{hi:016x}{lo:016x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_unique_and_well_formed() {
        let mut s = State::new(&[(GpuModel::A30_24gb, true, true)]);
        let a = s.new_mig_uuid();
        let b = s.new_mig_uuid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 36, "{a}");
        assert!(s.gpus[0].uuid.starts_with("GPU-"));
    }

    #[test]
    fn energy_grows_with_time_and_load() {
        let mut s = State::new(&[(GpuModel::A30_24gb, true, true)]);
        let t = s.clock_ms;
        s.advance(t + 1000);
        assert_eq!(s.gpus[0].energy_mj, 60_000);
        s.advance(t); // the clock going back changes nothing
        assert_eq!(s.gpus[0].energy_mj, 60_000);
    }
}
