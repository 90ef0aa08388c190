//! smartmigd's memory half of issue 9 and the plugin engineer's two
//! requests, against a real daemon (sim backend) with fake `squeue` and
//! `scontrol` scripts standing in for Slurm:
//!
//! - an allocate of a job that already holds an instance returns it
//!   (`existing`) whatever GPU, slices or memory the later step asks;
//! - an out-of-memory release is requeued through `scontrol requeue` and the
//!   job's next start gets the next larger memory size; completions teach
//!   the estimate, which jobs without `--mig-mem` then get; it survives a
//!   restart;
//! - retries are bounded;
//! - the repartitioning loop releases instances of jobs Slurm no longer
//!   lists, and only those.

use std::path::Path;
use std::time::Duration;

use crate::daemon_common::{req, with_fake_slurm, TestDaemon};
use smartmig::daemon::protocol::{AllocAction, AllocateRequest, ReleaseRequest};

fn named(job_id: u64, gpu: u32, slices: u8, mem: Option<f64>, name: &str) -> AllocateRequest {
    AllocateRequest {
        job_name: Some(name.into()),
        ..req(job_id, gpu, slices, mem)
    }
}

fn oom(job_id: u64) -> ReleaseRequest {
    ReleaseRequest {
        job_id,
        oom: true,
        used_memory_gb: None,
        from_epilog: false,
    }
}

fn scontrol_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("scontrol.log")).unwrap_or_default()
}

#[test]
fn a_job_that_holds_an_instance_gets_it_back_whatever_it_asks() {
    let d = TestDaemon::start("existing-any", "");
    let c = d.client();
    let first = c.allocate(req(1, 0, 1, None)).unwrap();
    assert_eq!(first.profile, "1g.5gb");
    // A later step asking for another GPU, more slices and more memory.
    for later in [
        req(1, 1, 3, Some(15.0)),
        req(1, 0, 7, None),
        named(1, 0, 1, Some(40.0), "other"),
    ] {
        let again = c.allocate(later).unwrap();
        assert_eq!(again.action, AllocAction::Existing);
        assert_eq!(
            (again.uuid.as_str(), again.gpu, again.profile.as_str()),
            (first.uuid.as_str(), 0, "1g.5gb")
        );
    }
    assert_eq!(c.release(1).unwrap().released, 1);
}

#[test]
fn oom_release_requeues_and_the_restart_gets_more_memory() {
    let mut d = with_fake_slurm(
        "oom-requeue",
        "epoch_s = 3600\n[oom]\nmax_retries = 1\nrequeue_timeout_s = 5\n",
        r#"{"jobs":[{"job_id":5,"job_state":"FAILED"},{"job_id":9,"job_state":"FAILED"}]}"#,
    );
    let c = d.client();
    let a = c.allocate(named(5, 0, 1, None, "train.sh")).unwrap();
    assert_eq!(a.profile, "1g.5gb");
    let r = c.release_with(oom(5)).unwrap();
    assert_eq!(r.released, 1);
    assert_eq!(
        r.oom_decision
            .map(smartmig::daemon::protocol::OomDecision::as_str),
        Some("requeue_scheduled")
    );
    d.wait_until("scontrol requeue 5", || {
        scontrol_log(&d.dir).contains("requeue 5")
    });
    d.wait_until("requeue recorded", || {
        c.status()
            .unwrap()
            .memory
            .unwrap()
            .oom_events
            .iter()
            .any(|e| e.decision.as_str() == "requeued")
    });
    // The requeued job (same id) without --mig-mem: the next larger size,
    // as the room it takes (issue 55): 10 GB needs 1g.10gb, which blocks
    // a 2g.10gb's shards, so the restart is a 2g.10gb and smartmigd raised
    // the job's shard request to 2. Claiming one shard it is refused.
    d.wait_until("shards raised to 2", || {
        scontrol_log(&d.dir).contains("JobId=5 Gres=shard:2")
    });
    match c.allocate(named(5, 1, 1, None, "train.sh")) {
        Err(smartmig::daemon::ClientError::Daemon(e)) => {
            assert_eq!(e.kind, smartmig::daemon::ErrorKind::NotGranted, "{e}");
            assert!(
                e.message.contains("needs 2g.10gb") && e.message.contains("--gres=shard:2"),
                "{e}"
            );
        }
        other => panic!("a restart on 1g.10gb within one shard was served: {other:?}"),
    }
    let b = c.allocate(named(5, 1, 2, None, "train.sh")).unwrap();
    assert_eq!(b.profile, "2g.10gb", "{}", d.log());
    // It completes having used 7.5 GB: learned.
    let r = c
        .release_with(ReleaseRequest {
            job_id: 5,
            oom: false,
            used_memory_gb: Some(7.5),
            from_epilog: false,
        })
        .unwrap();
    assert_eq!((r.released, r.oom_decision), (1, None));
    let m = c.status().unwrap().memory.unwrap();
    assert!(m.oom_jobs.is_empty(), "{m:?}");
    let est = &m.estimates[0];
    assert_eq!(
        (est.job_name.as_str(), est.runs, est.ooms),
        ("train.sh", 2, 1)
    );
    // max(7.5 * 1.1, 7.5 + 1) GB.
    assert!((est.estimate_gb - 8.5).abs() < 1e-9, "{est:?}");
    // A new job of the same name starts on the learned size, within the
    // shards it is billed (two hold 10 GB; one only 1g.5gb's 5, issue 55);
    // a declared need still wins over the estimate.
    assert_eq!(
        c.allocate(named(6, 0, 2, None, "train.sh"))
            .unwrap()
            .profile,
        "2g.10gb"
    );
    assert_eq!(
        c.allocate(named(8, 0, 1, None, "train.sh"))
            .unwrap()
            .profile,
        "1g.5gb"
    );
    assert_eq!(
        c.allocate(named(7, 0, 1, Some(3.0), "train.sh"))
            .unwrap()
            .profile,
        "1g.5gb"
    );
    // Retries are bounded (max_retries = 1).
    c.allocate(named(9, 1, 1, None, "big.sh")).unwrap();
    assert_eq!(
        c.release_with(oom(9))
            .unwrap()
            .oom_decision
            .map(smartmig::daemon::protocol::OomDecision::as_str),
        Some("requeue_scheduled")
    );
    // The restart needs 10 GB, the room of a 2g.10gb (issue 55):
    // smartmigd raises the job's shard request, so Slurm bills and the
    // plugin claims 2. A restart that still claims one shard (the raise
    // failed) is refused, not given a slice Slurm does not bill (issue 53).
    match c.allocate(named(9, 1, 1, None, "big.sh")) {
        Err(smartmig::daemon::ClientError::Daemon(e)) => {
            assert_eq!(e.kind, smartmig::daemon::ErrorKind::NotGranted, "{e}");
            assert!(e.message.contains("--gres=shard:2"), "{e}");
        }
        other => panic!("a restart beyond its grant was served: {other:?}"),
    }
    assert_eq!(
        c.allocate(named(9, 1, 2, None, "big.sh")).unwrap().profile,
        "2g.10gb"
    );
    assert_eq!(
        c.release_with(oom(9))
            .unwrap()
            .oom_decision
            .map(smartmig::daemon::protocol::OomDecision::as_str),
        Some("retries_exhausted")
    );
    // A repeated OOM release of a job that holds nothing decides nothing.
    assert_eq!(c.release_with(oom(9)).unwrap().oom_decision, None);
    // The estimates survive a restart.
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(d.wait(Duration::from_secs(20)).success());
    d.spawn();
    let m = d.client().status().unwrap().memory.unwrap();
    let names: Vec<&str> = m.estimates.iter().map(|e| e.job_name.as_str()).collect();
    assert!(
        names.contains(&"train.sh") && names.contains(&"big.sh"),
        "{m:?}"
    );
    assert!(
        m.oom_events
            .iter()
            .any(|e| e.decision.as_str() == "retries_exhausted"),
        "{m:?}"
    );
}

/// A job that wrote its marker and was then cancelled or hit its time
/// limit stays ended: only a FAILED job is requeued (before, every job
/// with a marker was).
#[test]
fn oom_marker_of_a_cancelled_or_timed_out_job_is_not_requeued() {
    let d = with_fake_slurm(
        "oom-cancelled",
        "epoch_s = 3600
[oom]
requeue_timeout_s = 5
",
        r#"{"jobs":[{"job_id":3,"job_state":"CANCELLED"},{"job_id":4,"job_state":"TIMEOUT"}]}"#,
    );
    let c = d.client();
    for job in [3, 4] {
        c.allocate(named(job, 0, 1, None, "x")).unwrap();
        assert_eq!(
            c.release_with(oom(job))
                .unwrap()
                .oom_decision
                .map(smartmig::daemon::protocol::OomDecision::as_str),
            Some("requeue_scheduled")
        );
    }
    d.wait_until("both decided", || {
        let m = c.status().unwrap().memory.unwrap();
        m.oom_events
            .iter()
            .filter(|e| e.decision.as_str() == "not_requeued")
            .count()
            == 2
    });
    let m = c.status().unwrap().memory.unwrap();
    assert!(
        m.oom_events
            .iter()
            .any(|e| e.job_id == 3 && e.message.contains("Cancelled, not FAILED")),
        "{m:?}"
    );
    let log = scontrol_log(&d.dir);
    assert!(!log.contains("requeue"), "{log}");
}

#[test]
fn oom_is_not_requeued_when_the_admin_disabled_it() {
    let d = with_fake_slurm(
        "oom-off",
        "epoch_s = 3600\n[oom]\nrequeue = false\n",
        r#"{"jobs":[]}"#,
    );
    let c = d.client();
    c.allocate(named(3, 0, 1, None, "x")).unwrap();
    assert_eq!(
        c.release_with(oom(3))
            .unwrap()
            .oom_decision
            .map(smartmig::daemon::protocol::OomDecision::as_str),
        Some("disabled")
    );
    // The daemon starts a requeue before it replies, and only for the
    // decision `requeue_scheduled`: nothing is left to wait for here.
    assert!(!scontrol_log(&d.dir).contains("requeue"));
}

#[test]
fn the_loop_releases_only_jobs_slurm_no_longer_runs() {
    let d = with_fake_slurm(
        "reap",
        "epoch_s = 1\n",
        r#"{"jobs":[{"job_id":1,"job_state":"RUNNING"},{"job_id":3,"job_state":"COMPLETING"}]}"#,
    );
    let c = d.client();
    for job in [1, 2, 3] {
        c.allocate(req(job, 0, 1, None)).unwrap();
    }
    d.wait_until("job 2 released", || {
        let st = c.status().unwrap();
        !st.gpus[0].instances.iter().any(|i| i.job_id == Some(2))
    });
    let st = c.status().unwrap();
    let mut held: Vec<u64> = st.gpus[0]
        .instances
        .iter()
        .filter_map(|i| i.job_id)
        .collect();
    held.sort_unstable();
    assert_eq!(held, vec![1, 3], "live jobs must keep their instances");
    assert!(
        d.log()
            .contains("job ended in Slurm but its release never arrived"),
        "{}",
        d.log()
    );
}
