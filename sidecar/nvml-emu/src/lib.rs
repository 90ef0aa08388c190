//! `smartmig-nvml-emu`: an NVML emulator, so smartmigd's real NVML backend
//! (`smartmig_daemon::backend::nvml`) runs in tests on machines without a
//! GPU.
//!
//! The crate builds two things from one source:
//! - `libsmartmig_nvml_emu.so` (cdylib), exporting the NVML C functions the
//!   backend and nvml-wrapper 0.13 call ([`ffi`]). The daemon loads it by
//!   path (`[nvml] library = ".../libsmartmig_nvml_emu.so"`); it is never
//!   installed system-wide.
//! - an rlib with [`Emulator`], which tests use to set the hardware up,
//!   look at it, run "processes" on instances and inject faults.
//!
//! Both sides meet in the directory `SMARTMIG_NVML_EMU_DIR` names, where
//! the state lives ([`state`]): so a daemon, a CLI and a test process see
//! the same GPUs. MIG rules come from the one table (`smartmig-mig`, see
//! [`mig`]); faults are in [`fault`].
//!
//! Modules: [`ffi`] (the exports), [`state`] (state file and locking),
//! [`mig`] (what the driver accepts), [`fault`] (injected errors),
//! [`event`] (injected XID events).

// The house rule: no function over 100 lines (clippy counts the lines of code).
#![warn(clippy::too_many_lines)]

#[cfg(not(target_pointer_width = "64"))]
compile_error!("the emulator encodes handles in 64-bit pointers");

pub mod event;
pub mod fault;
pub mod ffi;
pub mod mig;
pub mod state;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use smartmig_mig::{DriverProfile, GpuModel};

pub use fault::Fault;
pub use state::EmuError;
use state::{Process, State};

/// The environment variable naming the emulator's state directory.
pub const DIR_ENV: &str = "SMARTMIG_NVML_EMU_DIR";

/// One emulated GPU as a test sets it up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuSetup {
    pub model: GpuModel,
    pub mig_current: bool,
    pub mig_pending: bool,
}

impl GpuSetup {
    /// A GPU of `model` in MIG mode (current and pending).
    pub fn mig(model: GpuModel) -> GpuSetup {
        GpuSetup {
            model,
            mig_current: true,
            mig_pending: true,
        }
    }
}

/// A GPU instance as the emulator holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmuInstance {
    pub gi_id: u32,
    /// Driver profile id (`smi_id` of the table).
    pub profile_id: u32,
    /// Memory slots: first and how many.
    pub start: u32,
    pub size: u32,
    /// The compute instance, if one exists.
    pub ci_id: Option<u32>,
    /// Its MIG device's `MIG-...` UUID.
    pub uuid: Option<String>,
    /// Pids running on the compute instance.
    pub processes: Vec<u32>,
}

/// A handle on the emulator state of one directory (see the crate doc).
#[derive(Clone, Debug)]
pub struct Emulator {
    dir: PathBuf,
}

impl Emulator {
    /// Makes a fresh state in `dir` with `gpus` (replacing any state and
    /// instance files there) and the capability directories (0755).
    pub fn create(dir: &Path, gpus: &[GpuSetup]) -> Result<Emulator, EmuError> {
        std::fs::create_dir_all(dir).map_err(|e| EmuError::io(dir, e))?;
        let emu = Emulator {
            dir: dir.to_path_buf(),
        };
        for sub in [emu.capabilities_dir(), emu.caps_dev_dir()] {
            match std::fs::remove_dir_all(&sub) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(EmuError::io(&sub, e))
                }
                _ => {}
            }
            std::fs::create_dir_all(&sub).map_err(|e| EmuError::io(&sub, e))?;
            std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| EmuError::io(&sub, e))?;
        }
        let setup: Vec<_> = gpus
            .iter()
            .map(|g| (g.model, g.mig_current, g.mig_pending))
            .collect();
        state::replace(dir, &State::new(&setup))?;
        Ok(emu)
    }

    /// The existing state in `dir`.
    pub fn open(dir: &Path) -> Result<Emulator, EmuError> {
        let emu = Emulator {
            dir: dir.to_path_buf(),
        };
        emu.with(|_| Ok(()))?;
        Ok(emu)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The driver's capability tree (`[nvml] capabilities_dir`).
    pub fn capabilities_dir(&self) -> PathBuf {
        self.dir.join("capabilities")
    }

    /// The capability device files (`[nvml] caps_dev_dir`).
    pub fn caps_dev_dir(&self) -> PathBuf {
        self.dir.join("nvidia-caps")
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> Result<R, EmuError>) -> Result<R, EmuError> {
        state::transact(&self.dir, f)?
    }

    fn state_path(&self) -> PathBuf {
        self.dir.join(state::STATE_FILE)
    }

    fn no_gpu(&self, st: &State, gpu: u32) -> EmuError {
        EmuError::NoSuchGpu {
            path: self.state_path(),
            gpu,
            count: st.gpus.len() as u32,
        }
    }

    /// The GPU instances of `gpu`, by id.
    pub fn instances(&self, gpu: u32) -> Result<Vec<EmuInstance>, EmuError> {
        self.with(|st| {
            let g = st
                .gpus
                .get(gpu as usize)
                .ok_or_else(|| self.no_gpu(st, gpu))?;
            Ok(g.instances
                .iter()
                .map(|gi| EmuInstance {
                    gi_id: gi.id,
                    profile_id: gi.profile_id,
                    start: gi.start,
                    size: gi.size,
                    ci_id: gi.ci.as_ref().map(|c| c.id),
                    uuid: gi.ci.as_ref().map(|c| c.uuid.clone()),
                    processes: gi
                        .ci
                        .as_ref()
                        .map(|c| c.processes.iter().map(|p| p.pid).collect())
                        .unwrap_or_default(),
                })
                .collect())
        })
    }

    /// The processes of MIG device `mig_uuid`, to change.
    fn processes_of<'a>(
        &self,
        st: &'a mut State,
        mig_uuid: &str,
    ) -> Result<&'a mut Vec<Process>, EmuError> {
        st.gpus
            .iter_mut()
            .flat_map(|g| g.instances.iter_mut())
            .filter_map(|gi| gi.ci.as_mut())
            .find(|c| c.uuid == mig_uuid)
            .map(|c| &mut c.processes)
            .ok_or_else(|| EmuError::NoSuchInstance {
                path: self.state_path(),
                uuid: mig_uuid.to_string(),
            })
    }

    /// A process `pid` using `used_bytes` of MIG device `mig_uuid` (replaces
    /// the pid's earlier entry).
    pub fn add_process(&self, mig_uuid: &str, pid: u32, used_bytes: u64) -> Result<(), EmuError> {
        self.with(|st| {
            let procs = self.processes_of(st, mig_uuid)?;
            procs.retain(|p| p.pid != pid);
            procs.push(Process { pid, used_bytes });
            Ok(())
        })
    }

    /// Process `pid` of MIG device `mig_uuid` ends.
    pub fn remove_process(&self, mig_uuid: &str, pid: u32) -> Result<(), EmuError> {
        self.with(|st| {
            let procs = self.processes_of(st, mig_uuid)?;
            let before = procs.len();
            procs.retain(|p| p.pid != pid);
            if procs.len() == before {
                return Err(EmuError::Refused {
                    path: self.state_path(),
                    message: format!("no process {pid} on {mig_uuid}"),
                });
            }
            Ok(())
        })
    }

    /// Sets the MIG mode of `gpu`. Turning it off needs a GPU without
    /// instances, as on the hardware.
    pub fn set_mig_mode(&self, gpu: u32, current: bool, pending: bool) -> Result<(), EmuError> {
        self.with(|st| {
            let count = st.gpus.len() as u32;
            let path = self.state_path();
            let g = st.gpus.get_mut(gpu as usize).ok_or(EmuError::NoSuchGpu {
                path: path.clone(),
                gpu,
                count,
            })?;
            if !current && !g.instances.is_empty() {
                return Err(EmuError::Refused {
                    path,
                    message: format!("GPU {gpu} has MIG instances: MIG mode stays on"),
                });
            }
            g.mig_current = current;
            g.mig_pending = pending;
            Ok(())
        })
    }

    /// The profiles the driver of `gpu` offers: the table's, unless
    /// [`Emulator::set_driver_profiles`] replaced them.
    pub fn driver_profiles(&self, gpu: u32) -> Result<Vec<DriverProfile>, EmuError> {
        self.with(|st| {
            let g = st
                .gpus
                .get(gpu as usize)
                .ok_or_else(|| self.no_gpu(st, gpu))?;
            Ok(mig::driver_profiles(g))
        })
    }

    /// Makes the driver of `gpu` offer `profiles` instead of the table's:
    /// a driver that renames a profile, or one that disagrees with the
    /// table (another id, slice count or placement, a missing or extra
    /// profile). Refused while the GPU has instances.
    pub fn set_driver_profiles(
        &self,
        gpu: u32,
        profiles: Vec<DriverProfile>,
    ) -> Result<(), EmuError> {
        self.with(|st| {
            let path = self.state_path();
            let count = st.gpus.len() as u32;
            let g = st.gpus.get_mut(gpu as usize).ok_or(EmuError::NoSuchGpu {
                path: path.clone(),
                gpu,
                count,
            })?;
            if !g.instances.is_empty() {
                return Err(EmuError::Refused {
                    path,
                    message: format!("GPU {gpu} has MIG instances: its profiles stay"),
                });
            }
            g.driver = Some(profiles);
            Ok(())
        })
    }

    /// Adds a fault at the end of the list ([`fault`]).
    pub fn inject(&self, fault: Fault) -> Result<(), EmuError> {
        self.with(|st| {
            st.faults.push(fault);
            Ok(())
        })
    }

    /// Injects XID `xid` on `gpu`: on the whole GPU (`gpu_instance`
    /// `None`, as NVML reports a GPU-wide error) or on one GPU instance (by
    /// its id, with its compute instance's). Event sets registered for
    /// `nvmlEventTypeXidCriticalError` on that GPU hand it out once
    /// ([`event`]). An instance that does not exist is refused.
    pub fn inject_xid(
        &self,
        gpu: u32,
        xid: u64,
        gpu_instance: Option<u32>,
    ) -> Result<(), EmuError> {
        self.with(|st| {
            let g = st
                .gpus
                .get(gpu as usize)
                .ok_or_else(|| self.no_gpu(st, gpu))?;
            let instance = match gpu_instance {
                None => None,
                Some(gi) => {
                    let inst = g.instances.iter().find(|i| i.id == gi).ok_or_else(|| {
                        EmuError::Refused {
                            path: self.state_path(),
                            message: format!("GPU {gpu} has no GPU instance {gi}"),
                        }
                    })?;
                    Some((gi, inst.ci.as_ref().map_or(0, |c| c.id)))
                }
            };
            st.events.inject(gpu, xid, instance);
            Ok(())
        })
    }

    /// How many times each NVML function was called, by name.
    pub fn calls(&self) -> Result<BTreeMap<String, u64>, EmuError> {
        self.with(|st| Ok(st.calls.clone()))
    }

    /// Creates a GPU instance of driver profile `profile_id` at `start` and
    /// its full-size compute instance, as an admin's `nvidia-smi mig -cgi
    /// ID -C` would (e.g. a variant smartmig never creates); returns the
    /// MIG device's UUID.
    pub fn create_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        start: u32,
    ) -> Result<String, EmuError> {
        self.with(|st| {
            let g = st
                .gpus
                .get(gpu as usize)
                .ok_or_else(|| self.no_gpu(st, gpu))?;
            let p = mig::profile_by_id(g, profile_id).ok_or_else(|| EmuError::Refused {
                path: self.state_path(),
                message: format!("GPU {gpu} has no profile id {profile_id}"),
            })?;
            let size = mig::placements(&p).first().map_or(0, |&(_, size)| size);
            let refused = |what: &str, code| EmuError::Refused {
                path: self.state_path(),
                message: format!(
                    "GPU {gpu}: {what} of profile {profile_id} at {start}: NVML error {code}"
                ),
            };
            let ci_profile = mig::ci_profile_of(p.slices)
                .ok_or_else(|| refused("compute instance", mig::NOT_SUPPORTED))?;
            let gi = mig::create_gi(&self.dir, st, gpu, profile_id, Some((start, size)))
                .map_err(|c| refused("GPU instance", c))?;
            mig::create_ci(&self.dir, st, gpu, gi, ci_profile)
                .map_err(|c| refused("compute instance", c))?;
            let g = &st.gpus[gpu as usize];
            Ok(g.instances
                .iter()
                .find(|i| i.id == gi)
                .and_then(|i| i.ci.as_ref())
                .map(|c| c.uuid.clone())
                .unwrap_or_default())
        })
    }

    /// Creates a GPU instance without a compute instance, as a crash
    /// between the two creates leaves; returns its id.
    pub fn create_orphan_gpu_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        start: u32,
    ) -> Result<u32, EmuError> {
        self.with(|st| {
            let g = st.gpus.get(gpu as usize).ok_or_else(|| self.no_gpu(st, gpu))?;
            let size = mig::profile_by_id(g, profile_id)
                .and_then(|p| mig::placements(&p).first().map(|&(_, size)| size))
                .unwrap_or(0);
            mig::create_gi(&self.dir, st, gpu, profile_id, Some((start, size))).map_err(|code| {
                EmuError::Refused {
                    path: self.state_path(),
                    message: format!(
                        "GPU {gpu}: GPU instance of profile {profile_id} at {start}: NVML error {code}"
                    ),
                }
            })
        })
    }
}
