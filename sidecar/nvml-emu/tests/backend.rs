//! smartmigd's real NVML backend (`smartmig_daemon::backend::nvml`) and
//! nvml-wrapper's safe API, loading the built `libsmartmig_nvml_emu.so`.
//!
//! The library keeps the directory of its latest `nvmlInit` in the process,
//! so the tests of this binary take turns ([`Scene`] holds a lock for the
//! whole test), each with its own directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, PoisonError};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::structs::device::MigMode;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as sys;
use smartmig_daemon::backend::nvml::NvmlBackend;
use smartmig_daemon::backend::{Backend, BackendError, BackendInstance, GpuInfo};
use smartmig_daemon::config::NvmlConfig;
use smartmig_mig::{Geometry, GpuModel, Shape, SpotId};
use smartmig_nvml_emu::{mig, Emulator, Fault, GpuSetup, DIR_ENV};

static TURN: Mutex<()> = Mutex::new(());

/// The cdylib of this package, built next to the test executable.
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let candidates = [
        deps.join("libsmartmig_nvml_emu.so"),
        deps.join("../libsmartmig_nvml_emu.so"),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "libsmartmig_nvml_emu.so is in none of {candidates:?}: build it with \
                 `cargo build --release -p smartmig-nvml-emu`"
            )
        })
}

/// One test's emulator directory, with the turn held.
struct Scene {
    emu: Emulator,
    _turn: MutexGuard<'static, ()>,
}

impl Scene {
    fn new(name: &str, gpus: &[GpuSetup]) -> Scene {
        let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
        let dir =
            std::env::temp_dir().join(format!("smartmig-nvml-emu-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let emu = Emulator::create(&dir, gpus).expect("create the emulator");
        std::env::set_var(DIR_ENV, &dir);
        Scene { emu, _turn: turn }
    }

    fn config(&self) -> NvmlConfig {
        NvmlConfig {
            library: library(),
            capabilities_dir: self.emu.capabilities_dir(),
            caps_dev_dir: self.emu.caps_dev_dir(),
        }
    }

    fn backend(&self) -> NvmlBackend {
        NvmlBackend::open(&self.config()).unwrap_or_else(|e| panic!("open the NVML backend: {e}"))
    }

    fn calls(&self, name: &str) -> u64 {
        self.emu
            .calls()
            .expect("call counts")
            .get(name)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for Scene {
    /// Keeps the directory of a failed test for a look.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(self.emu.dir());
        }
    }
}

fn placement_profile(model: GpuModel, compute: u8, memory: u8) -> u32 {
    model
        .spec()
        .profile(Shape::new(compute, memory))
        .expect("a profile of the table")
        .smi_id
}

fn placement(model: GpuModel, compute: u8, memory: u8, start: u8) -> SpotId {
    Geometry::of(model)
        .spot_id(Shape::new(compute, memory), start)
        .expect("a placement of the table")
}

#[test]
fn every_model_places_every_instance_and_full_layouts() {
    for model in GpuModel::ALL {
        assert_eq!(
            GpuModel::from_nvml_name(&mig::device_name(model)),
            Some(model),
            "{model}: the emulated name maps back"
        );
        let scene = Scene::new(&format!("all-{model}"), &[GpuSetup::mig(model)]);
        let backend = scene.backend();
        assert_eq!(
            backend.gpus(),
            vec![GpuInfo {
                index: 0,
                model,
                minor: Some(0)
            }]
        );
        let geometry = Geometry::of(model);
        for id in geometry.ids() {
            let what = format!("{model} {}", geometry.spot(id).describe());
            let uuid = backend
                .create(0, id)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(uuid.starts_with("MIG-"), "{what}: {uuid}");
            assert_eq!(
                backend.list(0).unwrap(),
                vec![BackendInstance {
                    placement: id,
                    uuid: uuid.clone()
                }],
                "{what}"
            );
            let files = backend.access_files(0, &uuid).unwrap();
            assert_eq!(files.len(), 2, "{what}: {files:?}");
            assert_ne!(files[0], files[1], "{what}");
            assert!(files.iter().all(|f| f.exists()), "{what}: {files:?}");
            let held = scene.emu.instances(0).unwrap();
            let p = geometry.spot(id);
            assert_eq!(held.len(), 1, "{what}");
            assert_eq!(
                (held[0].profile_id, held[0].start, held[0].size),
                (
                    p.profile.smi_id,
                    u32::from(p.start),
                    u32::from(p.shape().memory)
                ),
                "{what}"
            );
            backend
                .destroy(0, &uuid)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(backend.list(0).unwrap().is_empty(), "{what}");
            assert!(scene.emu.instances(0).unwrap().is_empty(), "{what}");
            assert!(files.iter().all(|f| !f.exists()), "{what}: {files:?} left");
        }
        // Maximal layouts: all their instances at once.
        let maximal = geometry.maximal();
        for layout in [maximal[0], maximal[maximal.len() - 1]] {
            let mut made: Vec<BackendInstance> = layout
                .iter()
                .map(|id| BackendInstance {
                    placement: id,
                    uuid: backend
                        .create(0, id)
                        .unwrap_or_else(|e| panic!("{model} {}: {e}", geometry.name(layout))),
                })
                .collect();
            made.sort_by_key(|i| i.placement);
            assert_eq!(backend.list(0).unwrap(), made, "{}", geometry.name(layout));
            // Nothing more fits.
            for id in geometry.ids() {
                assert!(
                    matches!(
                        backend.create(0, id),
                        Err(BackendError::InsufficientResources { .. })
                    ),
                    "{model} {}: {} fits",
                    geometry.name(layout),
                    geometry.spot(id).describe()
                );
            }
            for i in &made {
                backend.destroy(0, &i.uuid).unwrap();
            }
        }
        assert!(scene.emu.instances(0).unwrap().is_empty());
    }
}

#[test]
fn conflicts_processes_energy_and_faults() {
    let model = GpuModel::A100_40gb;
    let scene = Scene::new("faults", &[GpuSetup::mig(model), GpuSetup::mig(model)]);
    let backend = scene.backend();
    let three = placement(model, 3, 4, 0);
    let uuid = backend.create(0, three).unwrap();

    // Overlaps.
    for (c, m, s) in [(4, 4, 0), (7, 8, 0), (1, 1, 3)] {
        let err = backend.create(0, placement(model, c, m, s)).unwrap_err();
        assert!(
            matches!(err, BackendError::InsufficientResources { gpu: 0, .. }),
            "{c}g at {s}: {err}"
        );
    }

    // A process: in use, and its memory is the instance's peak.
    scene.emu.add_process(&uuid, 4242, 3_000_000_000).unwrap();
    let err = backend.destroy(0, &uuid).unwrap_err();
    assert!(matches!(err, BackendError::InUse { gpu: 0, .. }), "{err}");
    assert_eq!(backend.list(0).unwrap().len(), 1);
    assert_eq!(scene.emu.instances(0).unwrap()[0].processes, vec![4242]);
    assert_eq!(backend.peak_memory_gb(0, &uuid), Some(3.0));
    let e1 = backend.energy_j(0).expect("energy");
    std::thread::sleep(std::time::Duration::from_millis(30));
    let e2 = backend.energy_j(0).expect("energy");
    assert!(e2 > e1, "{e1} -> {e2}");
    scene.emu.remove_process(&uuid, 4242).unwrap();
    assert_eq!(backend.peak_memory_gb(0, &uuid), Some(0.0));

    // A destroy the driver refuses once: the instance stays.
    scene
        .emu
        .inject(Fault::new(
            "nvmlComputeInstanceDestroy",
            sys::nvmlReturn_enum_NVML_ERROR_IN_USE,
        ))
        .unwrap();
    assert!(matches!(
        backend.destroy(0, &uuid),
        Err(BackendError::InUse { .. })
    ));
    assert_eq!(backend.list(0).unwrap().len(), 1);
    backend.destroy(0, &uuid).unwrap();

    // A compute-instance create that fails: the backend removes its GPU
    // instance again.
    scene
        .emu
        .inject(Fault::new(
            "nvmlGpuInstanceCreateComputeInstance",
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
        ))
        .unwrap();
    assert!(matches!(
        backend.create(0, three),
        Err(BackendError::InsufficientResources { .. })
    ));
    assert!(scene.emu.instances(0).unwrap().is_empty());

    // A create that times out after it happened, on GPU 1 only (the call
    // on GPU 0 passes): the GPU instance was made without its compute
    // instance, and the backend removes it before reporting the timeout,
    // so the slots `list` shows free really are free.
    scene
        .emu
        .inject(Fault {
            gpu: Some(1),
            after: true,
            delay_ms: 20,
            ..Fault::new(
                "nvmlDeviceCreateGpuInstanceWithPlacement",
                sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT,
            )
        })
        .unwrap();
    let on0 = backend.create(0, three).unwrap();
    let before = scene.calls("nvmlDeviceCreateGpuInstanceWithPlacement");
    let destroys = scene.calls("nvmlGpuInstanceDestroy");
    let err = backend.create(1, three).unwrap_err();
    assert!(matches!(err, BackendError::Timeout { gpu: 1, .. }), "{err}");
    assert_eq!(
        scene.calls("nvmlDeviceCreateGpuInstanceWithPlacement"),
        before + 1
    );
    assert_eq!(
        scene.calls("nvmlGpuInstanceDestroy"),
        destroys + 1,
        "the timed-out create's GPU instance was not destroyed"
    );
    assert!(
        scene.emu.instances(1).unwrap().is_empty(),
        "orphan left by the timed-out create: {:?}",
        scene.emu.instances(1)
    );
    let again = backend.create(1, three).expect("the slots are free again");
    backend.destroy(1, &again).unwrap();
    drop(backend);
    let backend = scene.backend();
    assert_eq!(
        backend.list(0).unwrap(),
        vec![BackendInstance {
            placement: three,
            uuid: on0
        }]
    );

    // An orphan made by hand goes the same way.
    let id = scene
        .emu
        .create_orphan_gpu_instance(1, placement_profile(model, 2, 2), 2)
        .unwrap();
    assert_eq!(id, 4, "2g at slot 2");
    drop(backend);
    let _backend = scene.backend();
    assert!(scene.emu.instances(1).unwrap().is_empty());
}

#[test]
fn mig_off_or_no_state_refuses_to_open() {
    let off = GpuSetup {
        model: GpuModel::A100_80gb,
        mig_current: false,
        mig_pending: false,
    };
    let scene = Scene::new("migoff", &[GpuSetup::mig(GpuModel::A100_80gb), off]);
    match NvmlBackend::open(&scene.config()) {
        Err(BackendError::MigDisabled { gpu: 1, name }) => {
            assert_eq!(GpuModel::from_nvml_name(&name), Some(GpuModel::A100_80gb));
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("opened a GPU with MIG mode off"),
    }
    // Turned on (pending only is not enough).
    scene.emu.set_mig_mode(1, false, true).unwrap();
    assert!(NvmlBackend::open(&scene.config()).is_err());
    scene.emu.set_mig_mode(1, true, true).unwrap();
    let backend = scene.backend();
    let uuid = backend
        .create(1, placement(GpuModel::A100_80gb, 7, 8, 0))
        .unwrap();
    assert!(
        scene.emu.set_mig_mode(1, false, false).is_err(),
        "MIG off under an instance"
    );
    backend.destroy(1, &uuid).unwrap();
    drop(backend);

    // No state in the directory: the driver is not loaded.
    let empty = scene.emu.dir().join("nothing-here");
    std::env::set_var(DIR_ENV, &empty);
    let err = NvmlBackend::open(&scene.config())
        .err()
        .expect("no state, no NVML");
    assert!(err.to_string().contains("driver is not loaded"), "{err}");
    std::env::remove_var(DIR_ENV);
    assert!(NvmlBackend::open(&scene.config()).is_err());
    assert!(Emulator::open(&empty).is_err());
}

#[test]
fn nvml_wrapper_sees_the_same_gpus() {
    let model = GpuModel::H100_94gb;
    let scene = Scene::new("wrapper", &[GpuSetup::mig(model)]);
    let backend = scene.backend();
    let uuid = backend.create(0, placement(model, 3, 4, 4)).unwrap();
    scene.emu.add_process(&uuid, 77, 5 << 30).unwrap();

    let nvml = Nvml::builder()
        .lib_path(library().as_os_str())
        .init()
        .expect("nvml-wrapper loads the emulator");
    assert!(nvml.sys_driver_version().unwrap().contains("emulated"));
    assert_eq!(nvml.device_count().unwrap(), 1);
    let gpu = nvml.device_by_index(0).unwrap();
    assert_eq!(GpuModel::from_nvml_name(&gpu.name().unwrap()), Some(model));
    assert!(gpu.uuid().unwrap().starts_with("GPU-"));
    assert_eq!(
        gpu.mig_mode().unwrap(),
        MigMode {
            current: sys::NVML_DEVICE_MIG_ENABLE,
            pending: sys::NVML_DEVICE_MIG_ENABLE
        }
    );
    assert_eq!(gpu.minor_number().unwrap(), 0);
    let full = mig::memory_mib(model.spec().full_profile().memory_gb) << 20;
    let mem = gpu.memory_info().unwrap();
    assert_eq!((mem.total, mem.used), (full, 5 << 30));
    let procs = gpu.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, 77);
    assert_eq!(procs[0].used_gpu_memory, UsedGpuMemory::Used(5 << 30));

    let m = nvml.device_by_uuid(uuid.as_str()).unwrap();
    assert!(m.mig_is_mig_device_handle().unwrap());
    assert_eq!(m.uuid().unwrap(), uuid);
    let mem = m.memory_info().unwrap();
    let three = mig::memory_mib(model.spec().profile(Shape::new(3, 4)).unwrap().memory_gb) << 20;
    assert_eq!(
        (mem.total, mem.used, mem.free),
        (three, 5 << 30, three - (5 << 30))
    );
    assert_eq!(m.running_compute_processes().unwrap().len(), 1);
    let by_index = gpu.mig_device_by_index(0).unwrap();
    assert_eq!(by_index.uuid().unwrap(), uuid);
    assert!(gpu.mig_device_by_index(1).is_err());
    assert!(nvml.device_by_uuid("MIG-not-there").is_err());
    let e1 = gpu.total_energy_consumption().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(gpu.total_energy_consumption().unwrap() > e1);
    assert_eq!(scene.calls("nvmlDeviceGetMemoryInfo_v2"), 2);
    drop(nvml);
    scene.emu.remove_process(&uuid, 77).unwrap();
    backend.destroy(0, &uuid).unwrap();
}

/// Runs helper test `name` of this executable in a child process, as
/// `as_nobody` says, and checks it ran and passed.
fn run_helper(name: &str, dir: &Path, as_nobody: bool) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if as_nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let out = cmd
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_ENV, dir)
        .env("SMARTMIG_NVML_EMU_HELPER", "1")
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} failed:\n{text}");
    assert!(text.contains("1 passed"), "{name} did not run:\n{text}");
}

fn helper_config() -> Option<NvmlConfig> {
    std::env::var_os("SMARTMIG_NVML_EMU_HELPER")?;
    let dir = PathBuf::from(std::env::var_os(DIR_ENV).expect("helper dir"));
    let emu = Emulator::open(&dir).expect("the parent's emulator");
    Some(NvmlConfig {
        library: library(),
        capabilities_dir: emu.capabilities_dir(),
        caps_dev_dir: emu.caps_dev_dir(),
    })
}

#[test]
#[ignore = "helper: run by another_process_sees_the_same_state"]
fn helper_creates_a_three_slice_instance() {
    let config = helper_config().expect("only run as a helper");
    NvmlBackend::open(&config)
        .expect("open the backend in the child")
        .create(0, placement(GpuModel::A100_40gb, 3, 4, 4))
        .expect("create in the child");
}

#[test]
#[ignore = "helper: run as nobody by instances_need_root"]
fn helper_as_nobody() {
    let config = helper_config().expect("only run as a helper");
    // The backend enumerates GPU instances at start: privileged in NVML.
    let err = NvmlBackend::open(&config).err().expect("opened as nobody");
    assert!(
        matches!(err, BackendError::NoPermission { gpu: 0, .. }),
        "{err}"
    );
    // MIG devices can be seen, instances not made.
    let nvml = Nvml::builder()
        .lib_path(config.library.as_os_str())
        .init()
        .expect("nvml-wrapper as nobody");
    let gpu = nvml.device_by_index(0).unwrap();
    let uuid = gpu.mig_device_by_index(0).unwrap().uuid().unwrap();
    assert!(uuid.starts_with("MIG-"), "{uuid}");
    let p = GpuModel::A100_40gb
        .spec()
        .profile(Shape::new(3, 4))
        .unwrap();
    let at = sys::nvmlGpuInstancePlacement_t { start: 4, size: 4 };
    let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: a live device handle and valid in/out pointers.
    let code = unsafe {
        nvml.lib()
            .nvmlDeviceCreateGpuInstanceWithPlacement(gpu.handle(), p.smi_id, &at, &mut gi)
    };
    assert_eq!(code, sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION);
}

#[test]
fn another_process_sees_the_same_state() {
    let model = GpuModel::A100_40gb;
    let scene = Scene::new("shared", &[GpuSetup::mig(model)]);
    let here = scene
        .backend()
        .create(0, placement(model, 3, 4, 0))
        .unwrap();
    run_helper(
        "helper_creates_a_three_slice_instance",
        scene.emu.dir(),
        false,
    );
    let fresh = Emulator::open(scene.emu.dir()).unwrap();
    let held = fresh.instances(0).unwrap();
    assert_eq!(held.len(), 2, "{held:?}");
    let listed = scene.backend().list(0).unwrap();
    assert_eq!(
        listed.iter().map(|i| i.placement).collect::<Vec<_>>(),
        vec![placement(model, 3, 4, 0), placement(model, 3, 4, 4)]
    );
    assert!(listed.iter().any(|i| i.uuid == here));
    assert_ne!(listed[0].uuid, listed[1].uuid);
}

#[test]
fn instances_need_root() {
    let model = GpuModel::A100_40gb;
    let scene = Scene::new("nobody", &[GpuSetup::mig(model)]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Not root here: the backend itself is refused.
        let err = NvmlBackend::open(&scene.config()).err().expect("opened");
        assert!(matches!(err, BackendError::NoPermission { .. }), "{err}");
        return;
    }
    scene
        .backend()
        .create(0, placement(model, 3, 4, 0))
        .unwrap();
    // nobody must reach the state (every call writes it).
    let dir = scene.emu.dir();
    for p in [
        dir.to_path_buf(),
        dir.join("state.json"),
        dir.join("state.lock"),
    ] {
        use std::os::unix::fs::PermissionsExt;
        let mode = if p.is_dir() { 0o777 } else { 0o666 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    run_helper("helper_as_nobody", dir, true);
    assert_eq!(scene.emu.instances(0).unwrap().len(), 1);
}

/// A driver that renames a profile (GB300 on R61x drivers: id 9 is
/// `3g.126gb` with 126 GiB, not the table's `3g.139gb`) is matched by id
/// and slices: the GPU is managed, every placement of the profile is
/// created through the backend, and the name shown is the driver's.
#[test]
fn a_renamed_profile_is_matched_by_id() {
    let model = GpuModel::Gb300_288gb;
    let scene = Scene::new("renamed", &[GpuSetup::mig(model)]);
    let mut driver = scene.emu.driver_profiles(0).unwrap();
    let three = driver.iter_mut().find(|p| p.id == 9).expect("id 9");
    three.name = Some("3g.126gb".into());
    three.memory_mib = 126 * 1024;
    scene.emu.set_driver_profiles(0, driver).unwrap();

    let backend = scene.backend();
    assert_eq!(backend.gpus()[0].model, model);
    let shape = Shape::new(3, 4);
    assert_eq!(backend.profile_name(0, shape).as_deref(), Some("3g.126gb"));
    assert_eq!(
        backend.profile_name(0, Shape::new(1, 1)).as_deref(),
        Some("1g.35gb")
    );
    let m = backend.driver_match(0).expect("matched at start");
    assert!(
        m.notes.iter().any(|n| n.contains("is named 3g.126gb")),
        "{:?}",
        m.notes
    );
    assert!(
        scene.calls("nvmlDeviceGetGpuInstanceProfileInfoV") > 0,
        "the names come from the versioned call"
    );
    for start in [0, 4] {
        let id = placement(model, 3, 4, start);
        let uuid = backend.create(0, id).unwrap();
        assert_eq!(
            backend.list(0).unwrap(),
            vec![BackendInstance {
                placement: id,
                uuid: uuid.clone()
            }]
        );
        let held = scene.emu.instances(0).unwrap();
        assert_eq!((held[0].profile_id, held[0].start), (9, u32::from(start)));
        // The MIG device's memory is the driver's 126 GiB.
        let mem = backend.memory_use(0, &uuid).expect("memory");
        assert!((mem.total_gb - 126.0 * 1024.0 * 1024.0 * 1024.0 / 1e9).abs() < 1e-6);
        backend.destroy(0, &uuid).unwrap();
    }
}

/// A driver whose profiles differ from the table (another id, slice count,
/// placement, a missing or an extra default profile) makes the backend
/// refuse the GPU, naming the difference; nothing is guessed or created.
#[test]
fn a_driver_that_differs_from_the_table_is_refused() {
    let model = GpuModel::B200_180gb;
    type Edit = fn(&mut Vec<smartmig_mig::DriverProfile>);
    let cases: [(&str, Edit, &str); 5] = [
        (
            "id",
            |d| d.iter_mut().find(|p| p.id == 14).unwrap().id = 13,
            "2g.45gb: driver id 13, table id 14",
        ),
        (
            "slices",
            |d| d.iter_mut().find(|p| p.id == 5).unwrap().slices = 3,
            "4g.90gb: driver 3 compute slices, table 4",
        ),
        (
            "placements",
            |d| d.iter_mut().find(|p| p.id == 15).unwrap().placements = Ok(vec![(0, 2), (2, 2)]),
            "1g.45gb: driver placements [0+2 2+2], table [0+2 2+2 4+2 6+2]",
        ),
        (
            "missing",
            |d| d.retain(|p| p.id != 0),
            "7g.180gb: the driver offers no profile at NVML index 4",
        ),
        (
            "extra",
            |d| {
                let mut six = d.iter().find(|p| p.id == 0).unwrap().clone();
                six.index = sys::NVML_GPU_INSTANCE_PROFILE_6_SLICE;
                six.id = 99;
                six.slices = 6;
                six.name = Some("6g.180gb".into());
                d.push(six);
            },
            "6g.180gb (id 99, 6 compute slices, NVML index 6): a profile the table lacks",
        ),
    ];
    for (what, edit, needle) in cases {
        let scene = Scene::new(
            &format!("differs-{what}"),
            &[GpuSetup::mig(model), GpuSetup::mig(model)],
        );
        let mut driver = scene.emu.driver_profiles(1).unwrap();
        edit(&mut driver);
        scene.emu.set_driver_profiles(1, driver).unwrap();
        match NvmlBackend::open(&scene.config()) {
            Err(e @ BackendError::TableMismatch { gpu: 1, .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(needle), "{what}: {msg}");
                assert!(msg.contains("does not manage"), "{what}: {msg}");
            }
            Err(e) => panic!("{what}: wrong error: {e}"),
            Ok(_) => panic!("{what}: opened a GPU whose driver differs from the table"),
        }
        assert!(scene.emu.instances(1).unwrap().is_empty(), "{what}");
    }
}

/// The emulator presents each new model under a name the table maps back,
/// with its variants listed by the driver and never scheduled: a `+gfx`
/// instance made outside smartmig is left alone by `list`.
#[test]
fn blackwell_variants_are_listed_and_left_alone() {
    let model = GpuModel::RtxPro6000_96gb;
    let scene = Scene::new("variants", &[GpuSetup::mig(model)]);
    let backend = scene.backend();
    let m = backend.driver_match(0).unwrap();
    let names: Vec<String> = m.variants.iter().map(|v| v.driver.label()).collect();
    for want in ["1g.24gb+gfx", "1g.24gb-me", "1g.24gb+me.all", "4g.96gb+gfx"] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    // A +gfx instance (id 47) at slot 3, made as an admin would: `list`
    // leaves it out (smartmig neither uses nor destroys it), and the
    // driver refuses a create over it.
    let gfx = scene.emu.create_instance(0, 47, 3).unwrap();
    assert!(backend.list(0).unwrap().is_empty());
    assert!(matches!(
        backend.create(0, placement(model, 2, 2, 2)),
        Err(BackendError::InsufficientResources { .. })
    ));
    let two = backend.create(0, placement(model, 2, 2, 0)).unwrap();
    assert_eq!(backend.list(0).unwrap().len(), 1);
    backend.destroy(0, &two).unwrap();
    assert_eq!(
        scene.emu.instances(0).unwrap()[0].uuid.as_deref(),
        Some(gfx.as_str())
    );
}
