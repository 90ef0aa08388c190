//! The daemon's `placement` setting through a real smartmigd over its Unix
//! socket (2 x A100-40GB, sim backend or the NVML emulator): which waiting
//! allocate goes first when room frees on a GPU.

use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::daemon_common::{base_config, req, TestDaemon};
use smartmig::daemon::protocol::{AllocateReply, AllocateRequest};
use smartmig::daemon::ClientError;

fn start(name: &str, placement: &str) -> TestDaemon {
    TestDaemon::start_with(name, |dir| {
        // Long enough that a waiter outlasts the test's steps.
        base_config(dir, &format!("placement = \"{placement}\"\n"))
            .replace("allocate_wait_s = 1\n", "allocate_wait_s = 60\n")
    })
}

fn shipped(file: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .join("policies")
        .join(file);
    assert!(
        path.is_file(),
        "{} is missing from the checkout",
        path.display()
    );
    path
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

type Answer = (u64, Result<AllocateReply, ClientError>);

/// Sends an allocate from its own thread (the answer comes on `tx`) and
/// returns once status shows it waiting.
fn allocate_in_background(d: &TestDaemon, tx: &mpsc::Sender<Answer>, r: AllocateRequest) {
    let job = r.job_id;
    let (c, tx) = (d.client(), tx.clone());
    std::thread::spawn(move || {
        let _ = tx.send((job, c.allocate(r)));
    });
    let c = d.client();
    d.wait_until(&format!("job {job} waiting in status"), || {
        c.status()
            .map(|s| s.waiting.iter().any(|w| w.job_id == job))
            .unwrap_or(false)
    });
}

/// GPU 0 is full (job 1 holds the 7g). Job 2 (deadline in ~3 h) and then
/// job 3 (deadline in ~2 min) wait for four slices, of which the GPU has
/// room for one 4g at a time. Job 1 ends: returns who got the 4g first,
/// then checks the other gets it after that one ends (nothing is lost).
fn first_served(name: &str, placement: &str) -> (u64, String) {
    let d = start(name, placement);
    let c = d.client();
    assert_eq!(c.allocate(req(1, 0, 7, None)).unwrap().profile, "7g.40gb");
    let (tx, rx) = mpsc::channel();
    let now = unix_now();
    allocate_in_background(
        &d,
        &tx,
        AllocateRequest {
            deadline: Some(now + 10_000),
            ..req(2, 0, 4, None)
        },
    );
    allocate_in_background(
        &d,
        &tx,
        AllocateRequest {
            deadline: Some(now + 120),
            ..req(3, 0, 4, None)
        },
    );
    assert_eq!(c.release(1).unwrap().released, 1);
    let (first, answer) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("no allocate was served");
    let answer = answer.unwrap_or_else(|e| panic!("job {first}: {e}"));
    // Only one 4g fits next to nothing else: the other job still waits.
    let s = c.status().unwrap();
    let waiting: Vec<u64> = s.waiting.iter().map(|w| w.job_id).collect();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_ne!(waiting[0], first);
    assert_eq!(c.release(first).unwrap().released, 1);
    let (second, again) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the second job was not served");
    assert_ne!(second, first);
    assert_eq!(
        again
            .unwrap_or_else(|e| panic!("job {second}: {e}"))
            .profile,
        answer.profile
    );
    (first, s.placement.unwrap_or_default())
}

#[test]
fn edf_serves_the_earlier_deadline_first() {
    let (first, shown) = first_served("placement-edf", "edf");
    assert_eq!(first, 3, "job 3's deadline is earlier");
    assert_eq!(shown, "edf");
}

#[test]
fn arrival_serves_the_longest_waiter_first() {
    let (first, shown) = first_served("placement-arrival", "arrival");
    assert_eq!(first, 2, "job 2 waited longer");
    assert_eq!(shown, "arrival");
}

/// The shipped learned placement runs in the daemon: both jobs are served
/// (it never idles room a job could use) and status names it.
#[test]
fn the_learned_placement_serves_both_and_is_shown() {
    let spec = format!("learned:{}", shipped("a100-40gb-placement.onnx").display());
    let (first, shown) = first_served("placement-learned", &spec);
    assert!(first == 2 || first == 3, "{first}");
    assert_eq!(shown, spec);
}

/// A file of the wrong kind, an unknown name and a missing file are refused
/// by `--check-config`, naming the key and what is wrong.
#[test]
fn bad_placements_are_refused_naming_the_key() {
    let dir = std::env::temp_dir().join(format!("smartmig-it-placement-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let repartitioning = shipped("a100-40gb.onnx");
    for (value, says) in [
        ("fifo".to_string(), "placement: unknown placement `fifo`"),
        (
            format!("learned:{}", repartitioning.display()),
            "is a repartitioning policy, not a job-placement policy",
        ),
        (
            "learned:/nonexistent/p.onnx".to_string(),
            "/nonexistent/p.onnx",
        ),
    ] {
        let file = dir.join("bad.toml");
        std::fs::write(
            &file,
            base_config(&dir, &format!("placement = \"{value}\"\n")),
        )
        .unwrap();
        let out = Command::new(crate::daemon_common::smartmigd())
            .args(["--check-config", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{value}: accepted");
        assert!(
            err.contains("placement:") && err.contains(says),
            "{value}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
