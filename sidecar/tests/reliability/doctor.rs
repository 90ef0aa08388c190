//! `smartmig doctor` against the NVML emulator (`sidecar/nvml-emu`, loaded
//! by path from the build's profile directory): a good node with smartmigd
//! running on the nvml backend, and one broken thing at a time (MIG off,
//! a pending MIG change, a gres.conf that disagrees, no plugin line, no
//! daemon), plus the hardware test (`--hardware-test --gpu-index 0 --yes`).
//!
//! Every node is a fresh directory: the emulator's state, smartmig.toml,
//! slurm.conf, gres.conf, plugstack.conf and a stand-in plugin library.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::daemon_common::{emulator_library, Wait};
use serde_json::Value;
use smartmig::daemon::protocol::AllocateRequest;
use smartmig::daemon::Client;
use smartmig::mig::GpuModel;
use smartmig_nvml_emu::{Emulator, GpuSetup, DIR_ENV};

const NODE: &str = "dr1";

/// gres.conf of a good node whose device files are in `DEV` (the node's
/// `dev/`, see [`Node::new`]).
const GRES: &str = "NodeName=dr[1-2] Name=gpu File=DEV/nvidia[0-1]\n\
                    NodeName=dr[1-2] Name=shard Count=7 File=DEV/nvidia0\n\
                    NodeName=dr[1-2] Name=shard Count=7 File=DEV/nvidia1\n";

/// [`GRES`] (or a variant of it) with the node's device directory.
fn gres(node_dir: &std::path::Path, text: &str) -> String {
    text.replace("DEV/", &format!("{}/", node_dir.join("dev").display()))
}

/// Stand-ins for `/dev/nvidia0..2` (character devices with the NVIDIA
/// major and minors 0..2, as on a GPU node): slurmd, and doctor with it,
/// refuse a gres.conf device file that is missing or not a device.
fn make_devices(dir: &std::path::Path) {
    std::fs::create_dir_all(dir.join("dev")).unwrap();
    for minor in 0..3 {
        let path = dir.join("dev").join(format!("nvidia{minor}"));
        let out = Command::new("mknod")
            .arg(&path)
            .args(["c", "195", &minor.to_string()])
            .output()
            .expect("run mknod");
        assert!(
            out.status.success(),
            "mknod {} failed (the doctor tests make fake GPU devices: run as root, \
             as scripts/test does): {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

struct Node {
    dir: PathBuf,
    emu_dir: PathBuf,
    daemon: Option<Child>,
}

impl Node {
    /// A node with these GPUs and the good Slurm files.
    fn new(name: &str, gpus: &[GpuSetup]) -> Node {
        let dir =
            std::env::temp_dir().join(format!("smartmig-doctor-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("run")).unwrap();
        let emu_dir = dir.join("nvml-emu");
        let emu = Emulator::create(&emu_dir, gpus).expect("create the emulator");
        let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
            .ok()
            .flatten()
            .map_or_else(|| "root".to_string(), |u| u.name);
        std::fs::write(
            dir.join("smartmig.toml"),
            format!(
                "socket = \"{}\"\nstate_dir = \"{}\"\nslurm_user = \"{me}\"\npolicy = \"greedy\"\n\
                 backend = \"nvml\"\nlog_level = \"info\"\n\
                 [nvml]\nlibrary = \"{}\"\ncapabilities_dir = \"{}\"\ncaps_dev_dir = \"{}\"\n\
                 [slurm]\nenabled = false\n",
                dir.join("run/smartmig.sock").display(),
                dir.join("state").display(),
                emulator_library().display(),
                emu.capabilities_dir().display(),
                emu.caps_dev_dir().display(),
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("slurm.conf"),
            format!(
                "SelectType=select/cons_tres\nGresTypes=gpu,shard\n\
                 NodeName=dr[1-2] CPUs=64 Gres=gpu:2,shard:14 State=UNKNOWN\n\
                 PlugStackConfig={}\n",
                dir.join("plugstack.conf").display()
            ),
        )
        .unwrap();
        make_devices(&dir);
        std::fs::write(dir.join("gres.conf"), gres(&dir, GRES)).unwrap();
        // The check only needs the library to exist.
        std::fs::write(dir.join("libsmartmig_spank.so"), b"").unwrap();
        std::fs::write(
            dir.join("plugstack.conf"),
            format!(
                "required {} socket={} timeout=60\n",
                dir.join("libsmartmig_spank.so").display(),
                dir.join("run/smartmig-root.sock").display()
            ),
        )
        .unwrap();
        Node {
            dir,
            emu_dir,
            daemon: None,
        }
    }

    fn emulator(&self) -> Emulator {
        Emulator::open(&self.emu_dir).expect("open the emulator")
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("run/smartmig.sock")
    }

    fn start_daemon(&mut self) {
        let log = std::fs::File::create(self.dir.join("daemon.log")).unwrap();
        let child = Command::new(crate::daemon_common::smartmigd())
            .arg("--config")
            .arg(self.dir.join("smartmig.toml"))
            .env(DIR_ENV, &self.emu_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut child = child;
        let client = Client::new(self.socket()).with_io_timeout(Duration::from_secs(5));
        Wait::new("a health reply", Duration::from_secs(20))
            .every(Duration::from_millis(20))
            .context(|| self.log())
            .until(|| {
                if let Some(st) = child.try_wait().unwrap() {
                    panic!("smartmigd exited with {st}: {}", self.log());
                }
                client.health()
            });
        self.daemon = Some(child);
    }

    fn stop_daemon(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = c.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    fn doctor(&self, extra: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_smartmig"))
            .arg("doctor")
            .arg("--config")
            .arg(self.dir.join("smartmig.toml"))
            .arg("--slurm-conf")
            .arg(self.dir.join("slurm.conf"))
            .args(["--node", NODE])
            .args(extra)
            .env(DIR_ENV, &self.emu_dir)
            .env_remove("SLURM_CONF")
            .output()
            .expect("run smartmig doctor")
    }

    /// `doctor --json`: the checks by name, and the output for messages.
    fn checks(&self, extra: &[&str]) -> (Vec<Value>, Output) {
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        let out = self.doctor(&args);
        let v: Vec<Value> = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not a JSON array ({e}): {}", text(&out)));
        (v, out)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop_daemon();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("kept {} (daemon log:\n{})", self.dir.display(), self.log());
        }
    }
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn find<'a>(checks: &'a [Value], name: &str) -> &'a Value {
    checks
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {checks:#?}"))
}

fn status<'a>(checks: &'a [Value], name: &str) -> &'a str {
    find(checks, name)["status"].as_str().unwrap_or("")
}

fn two_a100() -> Vec<GpuSetup> {
    vec![
        GpuSetup::mig(GpuModel::A100_40gb),
        GpuSetup::mig(GpuModel::A100_40gb),
    ]
}

#[test]
fn a_good_node_passes_and_json_lists_the_same_checks() {
    let mut node = Node::new("good", &two_a100());
    node.start_daemon();
    let (checks, out) = node.checks(&[]);
    assert!(out.status.success(), "{}", text(&out));
    let not_ok: Vec<&Value> = checks.iter().filter(|c| c["status"] != "ok").collect();
    assert!(not_ok.is_empty(), "{not_ok:#?}");
    for name in [
        "config",
        "nvml.library",
        "nvml.gpu0.model",
        "nvml.gpu1.mig",
        "nvml.gpu1.profiles",
        "nvml.gpu1.placements",
        "nvml.gpu0.instances",
        "slurm.node",
        "slurm.gres.gpu",
        "slurm.gres.shard.gpu1",
        "plugin.line",
        "plugin.socket",
        "daemon.socket",
        "daemon.admin_socket",
        "daemon.health",
        "daemon.gpus",
        "policy",
    ] {
        assert_eq!(status(&checks, name), "ok", "{name}: {}", text(&out));
    }
    for c in &checks {
        for key in ["check", "status", "detail", "fix"] {
            assert!(c.get(key).is_some(), "{key} missing in {c}");
        }
    }
    // The text report: one line per check, the same names in the same order.
    let plain = node.doctor(&[]);
    assert!(plain.status.success(), "{}", text(&plain));
    let stdout = String::from_utf8_lossy(&plain.stdout);
    let names: Vec<&str> = stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let st = w.next()?;
            ["ok", "warn", "fail"]
                .contains(&st)
                .then(|| w.next())
                .flatten()
        })
        .collect();
    let json_names: Vec<&str> = checks.iter().filter_map(|c| c["check"].as_str()).collect();
    assert_eq!(names, json_names, "{stdout}");
}

#[test]
fn mig_off_on_one_gpu_fails_naming_it() {
    let node = Node::new(
        "migoff",
        &[
            GpuSetup::mig(GpuModel::A100_40gb),
            GpuSetup {
                model: GpuModel::A100_40gb,
                mig_current: false,
                mig_pending: false,
            },
        ],
    );
    let out = node.doctor(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("nvml.gpu1.mig"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.starts_with("fail"), "{line}");
    assert!(
        line.contains("GPU 1") && line.contains("nvidia-smi -i 1 -mig 1"),
        "{line}"
    );
    let (checks, _) = node.checks(&[]);
    assert_eq!(status(&checks, "nvml.gpu0.mig"), "ok");
    // The driver describes profiles and placements with MIG off too (as an
    // H200 with driver 580 does), so the table is still checked; only the
    // instances wait for MIG mode.
    assert_eq!(status(&checks, "nvml.gpu1.placements"), "ok");
    assert_eq!(status(&checks, "nvml.gpu1.profiles"), "ok");
    assert_eq!(status(&checks, "nvml.gpu1.instances"), "warn");
}

#[test]
fn a_pending_mig_change_warns() {
    let node = Node::new("pending", &two_a100());
    node.emulator().set_mig_mode(0, true, false).unwrap();
    let (checks, out) = node.checks(&[]);
    let c = find(&checks, "nvml.gpu0.mig");
    assert_eq!(c["status"], "warn", "{}", text(&out));
    assert!(
        c["detail"]
            .as_str()
            .unwrap_or("")
            .contains("after the next GPU reset"),
        "{c}"
    );
    assert_eq!(status(&checks, "nvml.gpu1.mig"), "ok");
}

/// A gres.conf device file that does not exist (a node without GPUs
/// whose admin copied the snippet) fails, with the fix, and is no match
/// for the GPU's minor number: slurmd would not start with it.
#[test]
fn a_missing_device_file_fails() {
    let node = Node::new("nodev", &two_a100());
    std::fs::remove_file(node.dir.join("dev/nvidia1")).unwrap();
    let (checks, out) = node.checks(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let c = find(&checks, "slurm.gres.devices");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(
        c["detail"]
            .as_str()
            .unwrap_or("")
            .contains("nvidia1: No such file"),
        "{c}"
    );
    assert!(c["fix"].as_str().unwrap_or("").contains("mknod"), "{c}");
    let g = find(&checks, "slurm.gres.gpu");
    assert_eq!(g["status"], "fail", "{g}");
    assert!(
        g["detail"]
            .as_str()
            .unwrap_or("")
            .contains("minor number unknown"),
        "{g}"
    );
}

#[test]
fn a_gres_conf_that_disagrees_fails() {
    let node = Node::new("gres", &two_a100());
    std::fs::write(
        node.dir.join("gres.conf"),
        gres(
            &node.dir,
            &GRES.replace("Count=7 File=DEV/nvidia1", "Count=4 File=DEV/nvidia1"),
        ),
    )
    .unwrap();
    let (checks, out) = node.checks(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let c = find(&checks, "slurm.gres.shard.gpu1");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(
        c["detail"].as_str().unwrap_or("").contains("Count=4"),
        "{c}"
    );
    assert_eq!(status(&checks, "slurm.gres.shard.gpu0"), "ok");

    // Slurm's GPU 0 would be /dev/nvidia1 and GPU 1 /dev/nvidia2.
    std::fs::write(
        node.dir.join("gres.conf"),
        gres(&node.dir, &GRES.replace("nvidia[0-1]", "nvidia[1-2]")),
    )
    .unwrap();
    let (checks, out) = node.checks(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let c = find(&checks, "slurm.gres.gpu");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(
        c["detail"].as_str().unwrap_or("").contains("minor 1"),
        "{c}"
    );
}

#[test]
fn a_missing_plugstack_line_fails() {
    let node = Node::new("plugstack", &two_a100());
    std::fs::write(node.dir.join("plugstack.conf"), "# nothing here\n").unwrap();
    let (checks, out) = node.checks(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let c = find(&checks, "plugin.line");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(
        c["fix"]
            .as_str()
            .unwrap_or("")
            .contains("libsmartmig_spank.so"),
        "{c}"
    );
}

#[test]
fn no_daemon_fails() {
    let node = Node::new("nodaemon", &two_a100());
    let (checks, out) = node.checks(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(status(&checks, "daemon.health"), "fail");
    assert_eq!(status(&checks, "daemon.socket"), "fail");
    assert_eq!(status(&checks, "daemon.gpus"), "warn");
    // Everything else about the node is fine.
    assert_eq!(status(&checks, "nvml.gpu0.placements"), "ok");
    assert_eq!(status(&checks, "plugin.socket"), "ok");
}

#[test]
fn the_hardware_test_refuses_without_yes_and_changes_nothing() {
    let node = Node::new("hwno", &two_a100());
    let out = node.doctor(&["--hardware-test", "--gpu-index", "0"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--yes"),
        "{}",
        text(&out)
    );
    assert!(node.emulator().instances(0).unwrap().is_empty());
}

#[test]
fn the_hardware_test_creates_and_destroys_every_profile() {
    let node = Node::new("hwyes", &two_a100());
    let (checks, out) = node.checks(&["--hardware-test", "--gpu-index", "0", "--yes"]);
    assert!(out.status.success(), "{}", text(&out));
    let profiles = GpuModel::A100_40gb.spec().profiles;
    for p in profiles {
        let name = format!("hardware.gpu0.{}", p.name());
        assert_eq!(status(&checks, &name), "ok", "{name}: {}", text(&out));
    }
    assert_eq!(checks.len(), profiles.len() + 1, "{checks:#?}");
    assert_eq!(status(&checks, "hardware.gpu0.empty"), "ok");
    assert!(node.emulator().instances(0).unwrap().is_empty());
    assert!(node.emulator().instances(1).unwrap().is_empty());
}

#[test]
fn the_hardware_test_refuses_a_gpu_with_an_instance_or_a_running_daemon() {
    let mut node = Node::new("hwbusy", &two_a100());
    node.start_daemon();
    let out = node.doctor(&["--hardware-test", "--gpu-index", "0", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("smartmigd answers"),
        "{}",
        text(&out)
    );
    let client = Client::new(node.socket()).with_io_timeout(Duration::from_secs(20));
    let reply = client
        .allocate(AllocateRequest {
            job_id: 7,
            step: Some(0),
            uid: 0,
            gpu: 0,
            slices: 3,
            memory_gb: None,
            deadline: None,
            time_limit_s: Some(3600),
            job_name: None,
            oom_marker: None,
            profile: None,
        })
        .expect("allocate");
    node.stop_daemon();
    // The greedy policy also installed its initial layout.
    let before = node.emulator().instances(0).unwrap().len();
    assert!(before >= 1, "{reply:?}");
    let out = node.doctor(&["--hardware-test", "--gpu-index", "0", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("has {before} GPU instance")),
        "{}",
        text(&out)
    );
    assert_eq!(node.emulator().instances(0).unwrap().len(), before);
}

#[test]
fn an_orphan_gpu_instance_warns_and_stops_the_hardware_test() {
    let node = Node::new("orphan", &two_a100());
    // 3g.20gb (profile id 9) at start 4 on GPU 1, without a compute instance.
    let id = node
        .emulator()
        .create_orphan_gpu_instance(1, 9, 4)
        .expect("orphan");
    let (checks, out) = node.checks(&[]);
    let c = find(&checks, "nvml.gpu1.instances");
    assert_eq!(c["status"], "warn", "{}", text(&out));
    assert!(
        c["fix"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("-gi {id} -dgi")),
        "{c}"
    );
    assert_eq!(status(&checks, "nvml.gpu0.instances"), "ok");
    // GPU 0 is empty, but opening the backend would destroy GPU 1's orphan.
    let out = node.doctor(&["--hardware-test", "--gpu-index", "0", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("without a compute instance"),
        "{}",
        text(&out)
    );
    assert_eq!(node.emulator().instances(1).unwrap().len(), 1);
}

/// Two B200s: GPU 0's driver renames a profile (same id and slices: a
/// warning, and smartmigd manages it under the driver's name), GPU 1's
/// driver gives the 2g profile another id (a failure naming it, and
/// smartmigd refuses to start rather than guess).
#[test]
fn a_driver_that_differs_fails_and_a_renamed_profile_warns() {
    let model = GpuModel::B200_180gb;
    let mut node = Node::new("driver", &[GpuSetup::mig(model), GpuSetup::mig(model)]);
    let emu = node.emulator();
    let table = emu.driver_profiles(0).unwrap();
    let mut renamed = table.clone();
    let three = renamed.iter_mut().find(|p| p.id == 9).unwrap();
    three.name = Some("3g.85gb".into());
    three.memory_mib = 85 * 1024;
    emu.set_driver_profiles(0, renamed).unwrap();
    let mut other = table.clone();
    other.iter_mut().find(|p| p.id == 14).unwrap().id = 13;
    emu.set_driver_profiles(1, other).unwrap();

    let (checks, out) = node.checks(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(status(&checks, "nvml.gpu0.model"), "ok");
    let warn = find(&checks, "nvml.gpu0.profiles");
    assert_eq!(warn["status"], "warn", "{warn}");
    let detail = warn["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("3g.90gb (id 9) is named 3g.85gb") && detail.contains("3g.85gb 85.00 GiB"),
        "{detail}"
    );
    assert_eq!(status(&checks, "nvml.gpu0.placements"), "ok");
    let fail = find(&checks, "nvml.gpu1.profiles");
    assert_eq!(fail["status"], "fail", "{fail}");
    assert!(
        fail["detail"]
            .as_str()
            .unwrap_or("")
            .contains("2g.45gb: driver id 13, table id 14"),
        "{fail}"
    );
    assert!(
        fail["fix"]
            .as_str()
            .unwrap_or("")
            .contains("refuses to manage"),
        "{fail}"
    );

    // smartmigd will not start on a GPU it cannot describe.
    let log = std::fs::File::create(node.dir.join("daemon.log")).unwrap();
    let mut child = Command::new(crate::daemon_common::smartmigd())
        .arg("--config")
        .arg(node.dir.join("smartmig.toml"))
        .env(DIR_ENV, &node.emu_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let exited = Wait::new("smartmigd to refuse to start", Duration::from_secs(20))
        .every(Duration::from_millis(20))
        .poll(|| child.try_wait().unwrap());
    let status_code = exited.unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("smartmigd kept running: {}", node.log());
    });
    assert!(!status_code.success());
    let log = node.log();
    assert!(
        log.contains("GPU 1") && log.contains("differ from smartmig's b200-180gb table"),
        "{log}"
    );
    assert!(emu.instances(0).unwrap().is_empty() && emu.instances(1).unwrap().is_empty());

    // With GPU 1's driver as the table says, it starts; the rename stays a
    // warning and the node passes.
    emu.set_driver_profiles(1, table).unwrap();
    node.start_daemon();
    assert!(node.log().contains("is named 3g.85gb"), "{}", node.log());
    let (checks, out) = node.checks(&[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(status(&checks, "nvml.gpu1.profiles"), "ok");
    assert_eq!(status(&checks, "daemon.gpus"), "ok");
}

/// `doctor --nvml-survey`: every profile the driver offers, MIG mode and
/// the table's verdict as JSON, read only (the command a real GPU is
/// surveyed with; docs/mig-geometry.md).
#[test]
fn the_nvml_survey_reports_every_profile_and_changes_nothing() {
    let node = Node::new(
        "survey",
        &[
            GpuSetup::mig(GpuModel::H200_141gb),
            GpuSetup {
                model: GpuModel::RtxPro6000_96gb,
                mig_current: false,
                mig_pending: false,
            },
        ],
    );
    let emu = node.emulator();
    let before = emu.calls().unwrap();
    let out = node.doctor(&["--nvml-survey"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    let h200 = &v["gpus"][0];
    assert_eq!(h200["model"], "h200-141gb");
    assert_eq!(h200["mig_current"]["Ok"], true);
    let profiles = h200["driver_profiles"]["Ok"].as_array().expect("profiles");
    // Six default profiles and the +me variant, each with its placements.
    assert_eq!(profiles.len(), 7, "{profiles:#?}");
    let three = profiles.iter().find(|p| p["id"] == 9).expect("id 9");
    assert_eq!(three["slices"], 3);
    assert_eq!(three["name"], "3g.71gb");
    assert_eq!(
        three["placements"]["Ok"],
        serde_json::json!([[0, 4], [4, 4]])
    );
    assert_eq!(h200["table"]["agrees"], true);
    let rtx = &v["gpus"][1];
    assert_eq!(rtx["mig_current"]["Ok"], false);
    assert_eq!(rtx["table"]["agrees"], true);
    assert_eq!(
        rtx["driver_profiles"]["Ok"].as_array().map(Vec::len),
        Some(11)
    );
    assert!(rtx["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["check"] == "nvml.gpu1.mig" && c["status"] == "fail"));
    // Nothing was created, destroyed or switched.
    let after = emu.calls().unwrap();
    for f in [
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlDeviceCreateGpuInstance",
        "nvmlGpuInstanceDestroy",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlComputeInstanceDestroy",
    ] {
        assert_eq!(after.get(f), before.get(f), "{f} was called");
    }
    assert!(emu.instances(0).unwrap().is_empty() && emu.instances(1).unwrap().is_empty());
}
