//! Simulated MIG GPUs for tests, benches and laptops.
//!
//! Every create goes through [`Geometry`], so the simulator refuses exactly
//! what the hardware refuses (overlap, compute budget, start slot). Instances
//! get stable `MIG-<uuid>` names (random v4, or deterministic from
//! `sim.seed`), and each GPU's instances are persisted atomically in
//! `<state_dir>/sim/gpu<N>.json`, so a restarted daemon finds the instances
//! that "survived" like real ones do (MIG instances survive a daemon restart,
//! not a reboot).

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
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
}

/// The simulated backend.
pub struct SimBackend {
    dir: PathBuf,
    /// Where the instances' access files live (`sim.caps_dir`).
    caps: PathBuf,
    config: SimConfig,
    gpus: Vec<Mutex<SimGpu>>,
    inject: Mutex<Vec<InjectError>>,
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
    /// Opens (or creates) the simulated GPUs `models` with state in `state_dir/sim`.
    /// A saved GPU whose model differs from the config is an error: silently
    /// dropping its instances would lose jobs' slices.
    pub fn open(
        state_dir: &Path,
        models: &[GpuModel],
        config: SimConfig,
    ) -> Result<SimBackend, BackendError> {
        let dir = state_dir.join("sim");
        ensure_dir(&dir, 0o700).map_err(|e| state_err(&dir, e.to_string()))?;
        let mut gpus = Vec::new();
        for (i, &model) in models.iter().enumerate() {
            let path = dir.join(format!("gpu{i}.json"));
            let gpu = match std::fs::read(&path) {
                Ok(bytes) => {
                    let saved: SavedGpu = serde_json::from_slice(&bytes)
                        .map_err(|e| state_err(&path, format!("corrupt: {e}")))?;
                    if saved.model != model {
                        return Err(state_err(
                            &path,
                            format!(
                                "holds a {} but the config says GPU {i} is a {model}; remove the file to start afresh",
                                saved.model
                            ),
                        ));
                    }
                    let g = Geometry::of(model);
                    let mut instances = Vec::new();
                    for s in saved.instances {
                        let placement = g
                            .spot_id(Shape::new(s.compute, s.memory_slices), s.start)
                            .ok_or_else(|| state_err(&path, format!("invalid instance {s:?}")))?;
                        instances.push(BackendInstance {
                            placement,
                            uuid: s.uuid,
                        });
                    }
                    let layout = instances.iter().map(|i| i.placement).collect();
                    if !g.is_valid(layout) {
                        return Err(state_err(&path, "instances overlap"));
                    }
                    SimGpu {
                        model,
                        serial: saved.serial,
                        instances,
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => SimGpu {
                    model,
                    serial: 0,
                    instances: Vec::new(),
                },
                Err(e) => return Err(state_err(&path, e.to_string())),
            };
            gpus.push(Mutex::new(gpu));
        }
        let inject = Mutex::new(config.inject_errors.clone());
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
            gpus,
            inject,
        })
    }

    fn gpu(&self, gpu: u32) -> Result<std::sync::MutexGuard<'_, SimGpu>, BackendError> {
        let slot = self.gpus.get(gpu as usize).ok_or(BackendError::NoSuchGpu {
            gpu,
            count: self.gpus.len() as u32,
        })?;
        // A panic while holding the lock cannot leave a half-written state
        // (state changes are single pushes/removes), so poisoning is ignored.
        Ok(slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    fn save(&self, index: u32, gpu: &SimGpu) -> Result<(), BackendError> {
        let g = Geometry::of(gpu.model);
        let saved = SavedGpu {
            model: gpu.model,
            serial: gpu.serial,
            instances: gpu
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
        let path = self.dir.join(format!("gpu{index}.json"));
        let bytes =
            serde_json::to_vec_pretty(&saved).map_err(|e| state_err(&path, e.to_string()))?;
        atomic_write(&path, &bytes).map_err(|e| state_err(&path, e.to_string()))
    }

    /// Consumes one matching injected failure, if any.
    fn injected(&self, op: &str, gpu: u32, what: &str) -> Option<BackendError> {
        let mut list = self
            .inject
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let pos = list
            .iter()
            .position(|e| e.op == op && e.gpu.is_none_or(|g| g == gpu) && e.times > 0)?;
        list[pos].times -= 1;
        let err = BackendError::injected(&list[pos].error, what)?;
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
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, g)| GpuInfo {
                index: i as u32,
                model: g
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .model,
                minor: Some(i as u32),
            })
            .collect()
    }

    fn list(&self, gpu: u32) -> Result<Vec<BackendInstance>, BackendError> {
        Ok(self.gpu(gpu)?.instances.clone())
    }

    fn create(&self, gpu: u32, placement: SpotId) -> Result<String, BackendError> {
        let mut state = self.gpu(gpu)?;
        let g = Geometry::of(state.model);
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
        if let Err(e) = self.save(gpu, &state) {
            state.instances.retain(|i| i.uuid != uuid);
            return Err(e);
        }
        match late {
            Some(e) => Err(e),
            None => Ok(uuid),
        }
    }

    fn destroy(&self, gpu: u32, uuid: &str) -> Result<(), BackendError> {
        let mut state = self.gpu(gpu)?;
        if let Some(err) = self.injected("destroy", gpu, uuid) {
            return Err(err);
        }
        let pos = state.position(gpu, uuid)?;
        self.delay();
        let removed = state.instances.remove(pos);
        if let Err(e) = self.save(gpu, &state) {
            state.instances.insert(pos, removed);
            return Err(e);
        }
        let start = Geometry::of(state.model).spot(removed.placement).start;
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
}
