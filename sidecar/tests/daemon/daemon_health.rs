//! Per-instance and per-GPU health from NVML XID events (issue 44, item 4),
//! against a real smartmigd on its real Unix socket. The daemon always runs
//! the nvml backend here, over the NVML emulator, because XIDs come from
//! NVML's event sets: the test injects them into the emulator's state
//! (`Emulator::inject_xid`) and the daemon's `nvmlEventSetWait_v2` hands
//! them out. Slurm is a set of scripts: `scontrol` logs its arguments and
//! keeps the node's drain in a file that `sinfo --json` prints.

use std::path::Path;

use crate::daemon_common::{emulator_library, free_port, req, scrape, TestDaemon};
use smartmig::daemon::{ClientError, ErrorKind};
use smartmig::mig::GpuModel;
use smartmig_nvml_emu::{Emulator, GpuSetup};

/// An executable script `name` in `dir` running `body`.
fn script(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    let mut perms = std::fs::metadata(&p).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&p, perms).unwrap();
    p.display().to_string()
}

/// smartmigd on 2 x A100-40GB through the NVML emulator, node `n1`, with
/// the script Slurm above; `epoch_s` sets how often the node's drain is
/// compared with Slurm's.
fn start(name: &str, epoch_s: u64, port: u16) -> TestDaemon {
    TestDaemon::start_with(name, |dir| {
        let emu = Emulator::create(
            &dir.join("nvml-emu"),
            &[
                GpuSetup::mig(GpuModel::A100_40gb),
                GpuSetup::mig(GpuModel::A100_40gb),
            ],
        )
        .expect("create the NVML emulator's state");
        let d = dir.display();
        std::fs::write(dir.join("squeue.json"), r#"{"jobs":[]}"#).unwrap();
        let squeue = script(dir, "squeue", &format!("cat {d}/squeue.json"));
        let scontrol = script(
            dir,
            "scontrol",
            &format!(
                "echo \"$@\" >> {d}/scontrol.log\n\
                 case \"$*\" in\n\
                 *State=DRAIN*) for a in \"$@\"; do case \"$a\" in Reason=*) printf '%s' \"${{a#Reason=}}\" > {d}/drain;; esac; done;;\n\
                 *State=RESUME*) rm -f {d}/drain;;\n\
                 esac"
            ),
        );
        let sinfo = script(
            dir,
            "sinfo",
            &format!(
                "if [ -f {d}/drain ]; then\n\
                 echo \"{{\\\"nodes\\\":[{{\\\"name\\\":\\\"n1\\\",\\\"state\\\":\\\"idle\\\",\\\"state_flags\\\":[\\\"DRAIN\\\"],\\\"reason\\\":\\\"$(cat {d}/drain)\\\"}}]}}\"\n\
                 else echo '{{\"nodes\":[{{\"name\":\"n1\",\"state\":\"idle\",\"state_flags\":[],\"reason\":\"\"}}]}}'; fi"
            ),
        );
        format!(
            "socket = \"{d}/run/smartmig.sock\"\nstate_dir = \"{d}/state\"\nnode_name = \"n1\"\n\
             allocate_wait_s = 1\nrequest_timeout_s = 2\nepoch_s = {epoch_s}\nlog_level = \"info\"\n\
             policy = \"none\"\npublish_layout = false\nmetrics_listen = \"127.0.0.1:{port}\"\nbackend = \"nvml\"\n\
             [slurm]\nenabled = true\ncheck_grants = false\nsqueue = \"{squeue}\"\nscontrol = \"{scontrol}\"\nsinfo = \"{sinfo}\"\n\
             [nvml]\nlibrary = \"{}\"\ncapabilities_dir = \"{}\"\ncaps_dev_dir = \"{}\"\n",
            emulator_library().display(),
            emu.capabilities_dir().display(),
            emu.caps_dev_dir().display(),
        )
    })
}

fn emulator(d: &TestDaemon) -> Emulator {
    Emulator::open(&d.dir.join("nvml-emu")).unwrap()
}

/// The GPU-instance id NVML gives MIG device `uuid` of `gpu`.
fn gi_of(emu: &Emulator, gpu: u32, uuid: &str) -> u32 {
    emu.instances(gpu)
        .unwrap()
        .into_iter()
        .find(|i| i.uuid.as_deref() == Some(uuid))
        .unwrap_or_else(|| panic!("{uuid} not in the emulator"))
        .gi_id
}

fn uuids(d: &TestDaemon, gpu: usize) -> Vec<String> {
    d.client().status().unwrap().gpus[gpu]
        .instances
        .iter()
        .map(|i| i.uuid.clone())
        .collect()
}

/// An XID 94 (contained ECC error) on a busy instance marks it unhealthy
/// and names its job in the log; an XID 13 (an application error) is only
/// counted; once the job ends the instance is destroyed and rebuilt at the
/// same place, and an instance marked while idle never gets the next job.
#[test]
fn an_instance_xid_keeps_jobs_off_it_and_it_is_rebuilt_when_idle() {
    let port = free_port();
    let d = start("health-instance", 3600, port);
    let emu = emulator(&d);
    let c = d.client();
    let a = c.allocate(req(1, 0, 3, None)).unwrap();
    let gi = gi_of(&emu, 0, &a.uuid);
    emu.inject_xid(0, 13, Some(gi)).unwrap();
    emu.inject_xid(0, 94, Some(gi)).unwrap();
    d.wait_until("instance marked unhealthy", || {
        c.status().unwrap().gpus[0]
            .instances
            .iter()
            .any(|i| i.uuid == a.uuid && i.unhealthy_xid == Some(94))
    });
    let log = d.log();
    assert!(
        log.contains("XID on a MIG instance") && log.contains("job=Some(1)"),
        "{log}"
    );
    let status = c.status().unwrap();
    let health = status.gpus[0].health.as_ref().expect("GPU 0's XIDs");
    assert_eq!(health.fatal_xid, None);
    assert_eq!(health.xids.get(&13), Some(&1));
    assert_eq!(health.xids.get(&94), Some(&1));
    assert!(status.gpus[1].health.is_none());
    // The job keeps its instance until it ends; then it is rebuilt.
    c.release(1).unwrap();
    d.wait_until("instance rebuilt", || {
        let now = uuids(&d, 0);
        now.len() == 1 && now[0] != a.uuid
    });
    let rebuilt = &c.status().unwrap().gpus[0].instances[0];
    assert_eq!((rebuilt.start, rebuilt.compute), (a.start, 3));
    assert_eq!(rebuilt.unhealthy_xid, None);
    let b = c.allocate(req(2, 0, 3, None)).unwrap();
    assert_eq!(b.uuid, rebuilt.uuid, "the rebuilt instance is reused");
    c.release(2).unwrap();
    // Marked while idle: the very next allocate does not get it.
    let gi = gi_of(&emu, 0, &b.uuid);
    emu.inject_xid(0, 94, Some(gi)).unwrap();
    d.wait_until("second XID recorded", || {
        scrape(port)
            .contains("smartmig_xid_events_total{gpu=\"0\",xid=\"94\",class=\"instance\"} 2")
    });
    let next = c.allocate(req(3, 0, 3, None)).unwrap();
    assert_ne!(next.uuid, b.uuid, "an unhealthy instance was handed out");
    let text = scrape(port);
    for needle in [
        "smartmig_xid_events_total{gpu=\"0\",xid=\"13\",class=\"counted\"} 1",
        "smartmig_gpu_healthy{gpu=\"0\",",
    ] {
        assert!(text.contains(needle), "{needle} missing in\n{text}");
    }
    let log = d.log();
    assert!(log.contains("unhealthy instance rebuilt"), "{log}");
    // No drain for instance XIDs.
    let scontrol = std::fs::read_to_string(d.dir.join("scontrol.log")).unwrap_or_default();
    assert!(!scontrol.contains("State=DRAIN"), "{scontrol}");
}

/// An XID 79 (fallen off the bus) on GPU 1 stops placement there, leaves
/// GPU 0 serving, and drains the node with `smartmig: gpu 1 xid 79`; while
/// drained the daemon does not resume it; once an admin resumes the node
/// the GPU is back in service.
#[test]
fn a_fatal_xid_stops_placement_on_the_gpu_and_drains_the_node_until_resumed() {
    let port = free_port();
    let d = start("health-fatal", 1, port);
    let emu = emulator(&d);
    let c = d.client();
    c.allocate(req(1, 1, 2, None)).unwrap();
    emu.inject_xid(1, 79, None).unwrap();
    let drain = d.dir.join("drain");
    d.wait_until("node drained", || drain.exists());
    assert_eq!(
        std::fs::read_to_string(&drain).unwrap(),
        "smartmig: gpu 1 xid 79"
    );
    let log = d.log();
    assert!(
        log.contains("GPU-fatal XID") && log.contains("jobs=[1]"),
        "{log}"
    );
    let err = c.allocate(req(2, 1, 1, None)).unwrap_err();
    assert!(
        matches!(&err, ClientError::Daemon(b) if b.kind == ErrorKind::NoFit),
        "an out-of-service GPU is no fit (the plugin requeues a batch job): {err:?}"
    );
    let err = err.to_string();
    assert!(err.contains("out of service after XID 79"), "{err}");
    c.allocate(req(3, 0, 1, None)).expect("GPU 0 still serves");
    let status = c.status().unwrap();
    assert_eq!(
        status.gpus[1].health.as_ref().and_then(|h| h.fatal_xid),
        Some(79)
    );
    let text = scrape(port);
    assert!(
        text.contains("smartmig_xid_events_total{gpu=\"1\",xid=\"79\",class=\"gpu_fatal\"} 1"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("smartmig_gpu_healthy{gpu=\"1\",") && l.ends_with(" 0")),
        "{text}"
    );
    // Epochs pass (two more: one ran whole after the drain and compared
    // the node with Slurm): our drain stays (the plugin's `smartmig:`
    // rule must not resume it while the GPU is out of service).
    d.wait_epochs(d.epochs(), 2);
    assert!(drain.exists(), "resumed too early: {}", d.log());
    // The admin resumes the node in Slurm: the GPU is back in service.
    std::fs::remove_file(&drain).unwrap();
    d.wait_until("GPU back in service", || {
        c.status().unwrap().gpus[1]
            .health
            .as_ref()
            .is_some_and(|h| h.fatal_xid.is_none())
    });
    c.allocate(req(4, 1, 1, None)).expect("GPU 1 serves again");
    assert!(!drain.exists(), "drained again after the admin's resume");
}

/// A node an admin drained for another reason keeps that reason through a
/// GPU-fatal XID: smartmigd neither drains it again (which would replace
/// the reason) nor resumes it; placement on the GPU still stops.
#[test]
fn a_fatal_xid_on_a_node_drained_by_someone_else_leaves_the_drain_alone() {
    let port = free_port();
    let d = start("health-admin-drain", 1, port);
    let drain = d.dir.join("drain");
    std::fs::write(&drain, "maintenance: bios update").unwrap();
    let emu = emulator(&d);
    let c = d.client();
    emu.inject_xid(1, 48, None).unwrap();
    d.wait_until("GPU 1 out of service", || {
        c.status().unwrap().gpus[1]
            .health
            .as_ref()
            .is_some_and(|h| h.fatal_xid == Some(48))
    });
    // Epochs compare the node with Slurm (two more: one ran whole after
    // the GPU went out of service).
    d.wait_epochs(d.epochs(), 2);
    assert_eq!(
        std::fs::read_to_string(&drain).unwrap(),
        "maintenance: bios update",
        "{}",
        d.log()
    );
    let calls = std::fs::read_to_string(d.dir.join("scontrol.log")).unwrap_or_default();
    assert!(
        !calls.contains("State=DRAIN") && !calls.contains("State=RESUME"),
        "{calls}"
    );
    let err = c.allocate(req(1, 1, 1, None)).unwrap_err().to_string();
    assert!(err.contains("out of service after XID 48"), "{err}");
}
