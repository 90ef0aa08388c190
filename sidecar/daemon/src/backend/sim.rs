//! Simulated MIG GPUs for tests, benches and laptops.
//!
//! Every create goes through [`Geometry`], so the simulator refuses exactly
//! what the hardware refuses (overlap, compute budget, start slot). Instances
//! get stable `MIG-<uuid>` names (random v4, or deterministic from
//! `sim.seed`), and each GPU's instances are persisted atomically in
//! `<state_dir>/sim/gpu<N>.json`, so a restarted daemon finds the instances
//! that "survived" like real ones do (MIG instances survive a daemon restart,
//! not a reboot).
//!
//! **The file is the device.** A GPU's state lives only in its
//! `gpu<N>.json`: every call reads it, a create or destroy writes the new
//! state atomically (temporary file, rename), so a reader always sees a
//! whole state and nothing is held in memory between calls. Writers of one
//! GPU are serialised by the daemon, not here: every create and destroy
//! runs under that GPU's books transaction (`server/books`, `GpuTx`; at
//! start, before the books are shared, under the `&mut` of the GPU), as the
//! driver serialises calls per GPU on real hardware. That invariant is
//! checked, not assumed: a second create or destroy of a GPU while one runs
//! is refused with an error ([`SimBackend::changing`]) rather than losing
//! an update. The injected faults' remaining counts are atomics.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Backend, BackendError, BackendInstance, GpuInfo};
use crate::config::{InjectError, SimConfig};
use crate::fsutil::{atomic_write, ensure_dir, remove_if_present};
use crate::mig::{Geometry, GpuModel, Shape, SpotId};

/// One persisted instance: keyed on slice counts and start, never on names.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SavedInstance {
    compute: u8,
    memory_slices: u8,
    start: u8,
    uuid: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct SavedGpu {
    model: GpuModel,
    /// Instances created so far (drives deterministic UUIDs).
    serial: u64,
    instances: Vec<SavedInstance>,
}

/// One GPU's state, as read from its file for one call.
struct SimGpu {
    model: GpuModel,
    serial: u64,
    instances: Vec<BackendInstance>,
}

impl SimGpu {
    /// Where instance `uuid` of GPU `gpu` (this one) is in `instances`.
    fn position(&self, gpu: u32, uuid: &str) -> Result<usize, BackendError> {
        self.instances
            .iter()
            .position(|i| i.uuid == uuid)
            .ok_or_else(|| BackendError::UnknownInstance {
                gpu,
                uuid: uuid.to_string(),
            })
    }

    /// Reads GPU `index`'s state from `path` (none yet: no instance). A
    /// saved GPU whose model is not `model` is an error: silently dropping
    /// its instances would lose jobs' slices.
    fn read(path: &Path, index: u32, model: GpuModel) -> Result<SimGpu, BackendError> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(SimGpu {
                    model,
                    serial: 0,
                    instances: Vec::new(),
                })
            }
            Err(e) => return Err(state_err(path, e.to_string())),
        };
        let saved: SavedGpu =
            serde_json::from_slice(&bytes).map_err(|e| state_err(path, format!("corrupt: {e}")))?;
        if saved.model != model {
            return Err(state_err(
                path,
                format!(
                    "holds a {} but the config says GPU {index} is a {model}; remove the file to start afresh",
                    saved.model
                ),
            ));
        }
        let g = Geometry::of(model);
        let mut instances = Vec::new();
        for s in saved.instances {
            let placement = g
                .spot_id(Shape::new(s.compute, s.memory_slices), s.start)
                .ok_or_else(|| state_err(path, format!("invalid instance {s:?}")))?;
            instances.push(BackendInstance {
                placement,
                uuid: s.uuid,
            });
        }
        let layout = instances.iter().map(|i| i.placement).collect();
        if !g.is_valid(layout) {
            return Err(state_err(path, "instances overlap"));
        }
        Ok(SimGpu {
            model,
            serial: saved.serial,
            instances,
        })
    }

    /// Writes this state to `path` atomically: it is the new state.
    fn save(&self, path: &Path) -> Result<(), BackendError> {
        let g = Geometry::of(self.model);
        let saved = SavedGpu {
            model: self.model,
            serial: self.serial,
            instances: self
                .instances
                .iter()
                .map(|i| {
                    let p = g.spot(i.placement);
                    SavedInstance {
                        compute: p.shape().compute,
                        memory_slices: p.shape().memory,
                        start: p.start,
                        uuid: i.uuid.clone(),
                    }
                })
                .collect(),
        };
        let bytes =
            serde_json::to_vec_pretty(&saved).map_err(|e| state_err(path, e.to_string()))?;
        atomic_write(path, &bytes).map_err(|e| state_err(path, e.to_string()))
    }
}

/// A `[[sim.inject_errors]]` entry and how many more times it fires.
struct Fault {
    spec: InjectError,
    left: AtomicU32,
}

impl Fault {
    /// Takes one firing, if any is left.
    fn take(&self) -> bool {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Marks a GPU as being changed until dropped ([`SimBackend::changing`]).
struct Changing<'a>(&'a AtomicBool);

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The simulated backend.
pub struct SimBackend {
    dir: PathBuf,
    /// Where the instances' access files live (`sim.caps_dir`).
    caps: PathBuf,
    config: SimConfig,
    /// Each GPU's model, by index (its state is in its file).
    models: Vec<GpuModel>,
    /// Per GPU: a create or destroy is under way (a check of the caller's
    /// serialisation, never waited on).
    busy: Vec<AtomicBool>,
    faults: Vec<Fault>,
}

fn state_err(path: &Path, message: impl Into<String>) -> BackendError {
    BackendError::State {
        path: path.display().to_string(),
        message: message.into(),
    }
}

/// A deterministic 128-bit value from (seed, gpu, serial): SplitMix64 twice.
fn mix(seed: u64, gpu: u32, serial: u64) -> u128 {
    fn sm(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let a = sm(seed ^ (u64::from(gpu) << 48) ^ serial);
    let b = sm(a ^ 0x5555_5555_5555_5555);
    (u128::from(a) << 64) | u128::from(b)
}

impl SimBackend {
    /// Opens (or creates) the simulated GPUs `models` with state in
    /// `state_dir/sim`, checking every saved GPU (model, instances) now so
    /// that a bad file refuses the start rather than a later call.
    pub fn open(
        state_dir: &Path,
        models: &[GpuModel],
        config: SimConfig,
    ) -> Result<SimBackend, BackendError> {
        let dir = state_dir.join("sim");
        ensure_dir(&dir, 0o700).map_err(|e| state_err(&dir, e.to_string()))?;
        for (i, &model) in (0u32..).zip(models) {
            SimGpu::read(&dir.join(format!("gpu{i}.json")), i, model)?;
        }
        let faults = config
            .inject_errors
            .iter()
            .map(|spec| Fault {
                spec: spec.clone(),
                left: AtomicU32::new(spec.times),
            })
            .collect();
        let caps = config
            .caps_dir
            .clone()
            .unwrap_or_else(|| dir.join("nvidia-caps"));
        // Users must reach their own files: the directory is 0755, the
        // files 0600 (crate::access).
        ensure_dir(&caps, 0o755).map_err(|e| state_err(&caps, e.to_string()))?;
        Ok(SimBackend {
            dir,
            caps,
            config,
            models: models.to_vec(),
            busy: models.iter().map(|_| AtomicBool::new(false)).collect(),
            faults,
        })
    }

    /// GPU `gpu`'s state file and model.
    fn slot(&self, gpu: u32) -> Result<(PathBuf, GpuModel), BackendError> {
        let model = self
            .models
            .get(gpu as usize)
            .ok_or(BackendError::NoSuchGpu {
                gpu,
                count: self.models.len() as u32,
            })?;
        Ok((self.dir.join(format!("gpu{gpu}.json")), *model))
    }

    /// GPU `gpu`'s state now.
    fn gpu(&self, gpu: u32) -> Result<SimGpu, BackendError> {
        let (path, model) = self.slot(gpu)?;
        SimGpu::read(&path, gpu, model)
    }

    /// Marks `gpu` as being changed, or refuses when a change of it is
    /// already under way: the daemon runs one create or destroy per GPU at
    /// a time (its books' transaction), so a second one is a bug there,
    /// which would otherwise lose one of the two updates of the file.
    fn changing(&self, gpu: u32) -> Result<Changing<'_>, BackendError> {
        let flag = self.busy.get(gpu as usize).ok_or(BackendError::NoSuchGpu {
            gpu,
            count: self.models.len() as u32,
        })?;
        if flag.swap(true, Ordering::AcqRel) {
            return Err(BackendError::Other(format!(
                "sim GPU {gpu}: a create or destroy while another one runs \
                 (smartmigd serialises them per GPU: a bug)"
            )));
        }
        Ok(Changing(flag))
    }

    /// Consumes one matching injected failure, if any.
    fn injected(&self, op: &str, gpu: u32, what: &str) -> Option<BackendError> {
        let fault = self
            .faults
            .iter()
            .find(|f| f.spec.op == op && f.spec.gpu.is_none_or(|g| g == gpu) && f.take())?;
        let err = BackendError::injected(&fault.spec.error, what)?;
        Some(match err {
            BackendError::InUse { what, .. } => BackendError::InUse { gpu, what },
            BackendError::InsufficientResources { what, .. } => {
                BackendError::InsufficientResources { gpu, what }
            }
            BackendError::NotSupported { what, .. } => BackendError::NotSupported { gpu, what },
            BackendError::NoPermission { what, .. } => BackendError::NoPermission { gpu, what },
            BackendError::Timeout { what, .. } => BackendError::Timeout { gpu, what },
            other => other,
        })
    }

    /// The access files of the instance at slot `start` of `gpu`:
    /// `nvidia-cap<M>` with `M = 1 + 32 gpu + 2 start` for the GPU instance
    /// and `M + 1` for the compute instance (the driver numbers its own
    /// way; only the uniqueness matters here).
    fn cap_paths(&self, gpu: u32, start: u8) -> [PathBuf; 2] {
        let m = 1 + 32 * gpu + 2 * u32::from(start);
        [m, m + 1].map(|m| self.caps.join(format!("nvidia-cap{m}")))
    }

    /// Makes a missing access file as the driver does: a character device
    /// (1:3, so opening it works), root's, mode 0600. Without the right to
    /// mknod (not root: a laptop) a plain file stands in for it.
    fn make_cap(path: &Path) -> std::io::Result<()> {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        match std::fs::symlink_metadata(path) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            Err(_) => {}
        }
        match mknod(
            path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            makedev(1, 3),
        ) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::EPERM) => std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map(drop),
            Err(e) => Err(e.into()),
        }
    }

    fn delay(&self) {
        if self.config.reconfigure_delay_ms > 0 {
            std::thread::sleep(Duration::from_millis(self.config.reconfigure_delay_ms));
        }
    }
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn gpus(&self) -> Vec<GpuInfo> {
        (0u32..)
            .zip(&self.models)
            .map(|(index, &model)| GpuInfo {
                index,
                model,
                minor: Some(index),
            })
            .collect()
    }

    fn list(&self, gpu: u32) -> Result<Vec<BackendInstance>, BackendError> {
        Ok(self.gpu(gpu)?.instances)
    }

    fn create(&self, gpu: u32, placement: SpotId) -> Result<String, BackendError> {
        let (path, model) = self.slot(gpu)?;
        let _changing = self.changing(gpu)?;
        let mut state = SimGpu::read(&path, gpu, model)?;
        let g = Geometry::of(model);
        let what = g.spot(placement).describe().to_string();
        let late = match self.injected("create", gpu, &what) {
            // A timeout is the worst case: the instance was made anyway.
            Some(e @ BackendError::Timeout { .. }) => Some(e),
            Some(err) => return Err(err),
            None => None,
        };
        let layout = state.instances.iter().map(|i| i.placement).collect();
        if !g.fits(layout, placement) {
            return Err(BackendError::InsufficientResources { gpu, what });
        }
        self.delay();
        state.serial += 1;
        let id = match self.config.seed {
            Some(seed) => uuid::Uuid::from_u128(mix(seed, gpu, state.serial)),
            None => uuid::Uuid::new_v4(),
        };
        let uuid = format!("MIG-{id}");
        state.instances.push(BackendInstance {
            placement,
            uuid: uuid.clone(),
        });
        state.instances.sort_by_key(|i| i.placement);
        // Not written: the file still holds the state before.
        state.save(&path)?;
        match late {
            Some(e) => Err(e),
            None => Ok(uuid),
        }
    }

    fn destroy(&self, gpu: u32, uuid: &str) -> Result<(), BackendError> {
        let (path, model) = self.slot(gpu)?;
        let _changing = self.changing(gpu)?;
        let mut state = SimGpu::read(&path, gpu, model)?;
        if let Some(err) = self.injected("destroy", gpu, uuid) {
            return Err(err);
        }
        let pos = state.position(gpu, uuid)?;
        self.delay();
        let removed = state.instances.remove(pos);
        state.save(&path)?;
        let start = Geometry::of(model).spot(removed.placement).start;
        for f in self.cap_paths(gpu, start) {
            if let Err(e) = remove_if_present(&f) {
                tracing::warn!(gpu, uuid, file = %f.display(), "access file not removed: {e}");
            }
        }
        Ok(())
    }

    /// The id the driver's slot tree gives the placement
    /// ([`Geometry::gpu_instance_id`]), as the NVML emulator does.
    fn gpu_instance_id(&self, gpu: u32, uuid: &str) -> Option<u32> {
        let state = self.gpu(gpu).ok()?;
        let inst = &state.instances[state.position(gpu, uuid).ok()?];
        Some(Geometry::of(state.model).gpu_instance_id(inst.placement))
    }

    fn access_files(&self, gpu: u32, uuid: &str) -> Result<Vec<PathBuf>, BackendError> {
        let state = self.gpu(gpu)?;
        let inst = &state.instances[state.position(gpu, uuid)?];
        let start = Geometry::of(state.model).spot(inst.placement).start;
        let files = self.cap_paths(gpu, start);
        for f in &files {
            Self::make_cap(f).map_err(|e| state_err(f, e.to_string()))?;
        }
        Ok(files.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("smartmig-sim-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn enforces_geometry_and_persists() {
        let d = dir("persist");
        let models = [GpuModel::A100_40gb, GpuModel::A100_40gb];
        let cfg = SimConfig {
            seed: Some(7),
            ..SimConfig::default()
        };
        let b = SimBackend::open(&d, &models, cfg.clone()).unwrap();
        let g = Geometry::of(GpuModel::A100_40gb);
        let four = g.spot_id(Shape::new(4, 4), 0).unwrap();
        let three = g.spot_id(Shape::new(3, 4), 4).unwrap();
        let two = g.spot_id(Shape::new(2, 2), 2).unwrap();
        let u4 = b.create(1, four).unwrap();
        assert!(u4.starts_with("MIG-"));
        assert!(matches!(
            b.create(1, two),
            Err(BackendError::InsufficientResources { gpu: 1, .. })
        ));
        let u3 = b.create(1, three).unwrap();
        assert_ne!(u3, u4);
        drop(b);
        let b = SimBackend::open(&d, &models, cfg).unwrap();
        let list = b.list(1).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].uuid, u4);
        b.destroy(1, &u4).unwrap();
        assert!(matches!(
            b.destroy(1, &u4),
            Err(BackendError::UnknownInstance { .. })
        ));
        assert!(b.list(0).unwrap().is_empty());
        assert!(matches!(b.list(2), Err(BackendError::NoSuchGpu { .. })));
        // A model change is refused, not silently wiped.
        let err = SimBackend::open(
            &d,
            &[GpuModel::A30_24gb, GpuModel::A30_24gb],
            SimConfig::default(),
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("the config says GPU 1"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn injected_errors_fire_then_stop() {
        let d = dir("inject");
        let cfg = SimConfig {
            inject_errors: vec![InjectError {
                op: "create".into(),
                gpu: Some(0),
                error: "insufficient_resources".into(),
                times: 1,
            }],
            ..SimConfig::default()
        };
        let b = SimBackend::open(&d, &[GpuModel::A100_40gb], cfg).unwrap();
        let g = Geometry::of(GpuModel::A100_40gb);
        let id = g.spot_id(Shape::new(1, 1), 6).unwrap();
        let err = b.create(0, id).unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
        assert!(b.create(0, id).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }
    /// The file is the device: a second backend on the same directory sees
    /// the first one's instances at once, nothing is kept in memory.
    #[test]
    fn the_state_is_the_file() {
        let d = dir("file");
        let models = [GpuModel::A100_40gb];
        let a = SimBackend::open(&d, &models, SimConfig::default()).unwrap();
        let b = SimBackend::open(&d, &models, SimConfig::default()).unwrap();
        let g = Geometry::of(GpuModel::A100_40gb);
        let uuid = a
            .create(0, g.spot_id(Shape::new(3, 4), 4).unwrap())
            .unwrap();
        assert_eq!(b.list(0).unwrap()[0].uuid, uuid);
        assert!(matches!(
            b.create(0, g.spot_id(Shape::new(2, 2), 4).unwrap()),
            Err(BackendError::InsufficientResources { gpu: 0, .. })
        ));
        b.destroy(0, &uuid).unwrap();
        assert!(a.list(0).unwrap().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The daemon's serialisation per GPU is checked: a create while a
    /// change of the same GPU runs is refused (no lost update), one of
    /// another GPU goes ahead.
    #[test]
    fn a_second_change_of_a_gpu_at_once_is_refused() {
        let d = dir("busy");
        let models = [GpuModel::A100_40gb, GpuModel::A100_40gb];
        let b = SimBackend::open(&d, &models, SimConfig::default()).unwrap();
        let one = Geometry::of(GpuModel::A100_40gb)
            .spot_id(Shape::new(1, 1), 0)
            .unwrap();
        let running = b.changing(0).unwrap();
        let err = b.create(0, one).unwrap_err();
        assert!(err.to_string().contains("serialises them per GPU"), "{err}");
        b.create(1, one).unwrap();
        drop(running);
        b.create(0, one).unwrap();
        assert_eq!((b.list(0).unwrap().len(), b.list(1).unwrap().len()), (1, 1));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
