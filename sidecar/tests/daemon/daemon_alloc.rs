//! Allocation through a real smartmigd over its Unix socket (sim backend,
//! 2 x A100-40GB).

use std::time::{Duration, Instant};

use crate::daemon_common::{free_port, req, scrape, TestDaemon};
use smartmig::daemon::protocol::{AllocAction, AllocateRequest};
use smartmig::daemon::{ClientError, ErrorKind};

#[test]
fn profile_follows_slices_and_memory() {
    let d = TestDaemon::start("profile", "");
    let c = d.client();
    let a = c.allocate(req(1, 1, 3, Some(15.0))).unwrap();
    assert_eq!(a.profile, "3g.20gb");
    assert_eq!(a.gpu, 1);
    assert!(a.uuid.starts_with("MIG-"), "{}", a.uuid);
    assert_eq!(a.action, AllocAction::Created);
    let b = c.allocate(req(2, 0, 5, None)).unwrap();
    assert_eq!(b.profile, "7g.40gb");
    // Impossible requests are invalid, not no_fit.
    for bad in [
        req(3, 0, 8, None),
        req(3, 5, 1, None),
        req(3, 1, 1, Some(50.0)),
    ] {
        match c.allocate(bad) {
            Err(ClientError::Daemon(e)) => assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}"),
            other => panic!("{other:?}"),
        }
    }
}

/// `--mig-profile` travels in the allocate: the daemon resolves it on the
/// GPU's model and builds exactly that profile, or refuses naming why, with
/// no status round trip before.
#[test]
fn a_requested_profile_is_built_exactly_or_refused() {
    let d = TestDaemon::start("exact-profile", "");
    let c = d.client();
    let with = |job, slices, name: &str| AllocateRequest {
        profile: Some(name.into()),
        ..req(job, 0, slices, None)
    };
    // Without the name, one slice and no memory is the smallest 1g.
    assert_eq!(c.allocate(req(1, 1, 1, None)).unwrap().profile, "1g.5gb");
    // A memory variant is served at the shards its room blocks (issue 55:
    // 1g.10gb takes a 2g.10gb's room, job_submit.lua bills it shard:2), and
    // built as asked.
    let a = c.allocate(with(2, 2, "1g.10gb")).unwrap();
    assert_eq!((a.profile.as_str(), a.memory_gb), ("1g.10gb", 10));
    // Any --mig-mem beside it is ignored: the profile says the memory.
    let b = c
        .allocate(AllocateRequest {
            memory_gb: Some(1.0),
            ..with(3, 3, "nvidia_a100_3g.20gb")
        })
        .unwrap();
    assert_eq!(b.profile, "3g.20gb");
    for (bad, says) in [
        (
            with(4, 1, "1g.10gb"),
            "--mig-profile=1g.10gb has 1 compute slices but the job asked for --gres=shard:1; \
             use --gres=shard:2 (1g.10gb's memory takes the room of a 2g.10gb, so it is \
             billed shard:2; the job gets 1g.10gb)",
        ),
        (with(4, 3, "1g.10gb"), "use --gres=shard:2"),
        (with(4, 3, "2g.10gb"), "use --gres=shard:2"),
        (
            with(4, 3, "3g.40gb"),
            "a100-40gb has no 3g profile with about 40 GB",
        ),
        (with(4, 1, "banana"), "--mig-profile=banana"),
    ] {
        match c.allocate(bad) {
            Err(ClientError::Daemon(e)) => {
                assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
                assert!(e.message.contains(says), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
    }
    // A refusal changed nothing: job 4 holds no instance.
    let status = c.status().unwrap();
    let jobs: Vec<u64> = status
        .gpus
        .iter()
        .flat_map(|g| g.instances.iter().filter_map(|i| i.job_id))
        .collect();
    assert!(!jobs.contains(&4), "{jobs:?}");
}

/// Issue 55: memory that needs a memory variant (8 GB: 1g.10gb on an
/// A100-40GB) is built as the variant's room, 2g.10gb, at the two shards
/// job_submit.lua bills; a step asking it within one shard is refused
/// with what to ask, never given a 1g.10gb that blocks a shard Slurm
/// counts as free.
#[test]
fn a_memory_variant_need_is_built_as_its_room_within_the_billed_shards() {
    let d = TestDaemon::start("room", "");
    let c = d.client();
    let a = c.allocate(req(1, 0, 2, Some(8.0))).unwrap();
    assert_eq!((a.profile.as_str(), a.compute), ("2g.10gb", 2));
    match c.allocate(req(2, 0, 1, Some(8.0))) {
        Err(ClientError::Daemon(e)) => {
            assert_eq!(e.kind, ErrorKind::NotGranted, "{e}");
            assert_eq!(
                e.message,
                "--mig-mem=8 GB needs 2g.10gb (2 compute slices; 1g.10gb's memory takes the \
                 room of a 2g.10gb), but Slurm billed this job shard:1 on GPU 0, and no \
                 a100-40gb instance within that many shards has more than 5 GB; submit it \
                 with --gres=shard:2, or --mig-mem of at most 5G"
            );
        }
        other => panic!("8 GB within one shard was served: {other:?}"),
    }
    assert_eq!(
        c.allocate(req(3, 0, 1, Some(5.0))).unwrap().profile,
        "1g.5gb"
    );
}

#[test]
fn eighth_one_g_waits_then_fails_with_reason() {
    let d = TestDaemon::start("eighth", "");
    let c = d.client();
    let mut uuids = Vec::new();
    for job in 1..=7 {
        let a = c.allocate(req(job, 0, 1, None)).unwrap();
        assert_eq!(a.profile, "1g.5gb");
        uuids.push(a.uuid);
    }
    let uuids_of_job3 = uuids[2].clone();
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 7, "an instance was handed out twice");
    let t0 = Instant::now();
    let err = c.allocate(req(8, 0, 1, None)).unwrap_err();
    let waited = t0.elapsed();
    let ClientError::Daemon(e) = err else {
        panic!("{err}")
    };
    assert_eq!(e.kind, ErrorKind::NoFit);
    // It names the busy instances, never the jobs holding them (other
    // users' job ids are private); the daemon's log names them.
    assert!(
        e.message
            .starts_with("no 1g.5gb slice can be made on GPU 0: busy instances 1g.5gb@0, "),
        "{}",
        e.message
    );
    assert!(!e.message.contains("job"), "{}", e.message);
    d.wait_until("the log names the holders", || {
        d.log().contains("held_by=[")
    });
    // A step that is not a batch script (step 0 here) is told what is
    // true on this node: holds off, so a rerun may land here again, and
    // GPU 1 could build the 1g now (issue 53).
    assert!(
        e.message
            .contains("waited 1 s; an interactive step is not requeued")
            && e.message.contains("(slurm.holds is off)")
            && e.message
                .contains("GPU 1 of this node has room now, but Slurm chose GPU 0"),
        "{}",
        e.message
    );
    assert!(waited >= Duration::from_millis(950), "{waited:?}");
    // GPU 1 is unaffected.
    assert!(c.allocate(req(9, 1, 1, None)).is_ok());
    // A release during the wait lets the waiter through. The waiter gets
    // 30 s (allocate_wait_s changes live, at SIGHUP): the test sees it
    // waiting through a status call, which can take a second on a loaded
    // machine over the NVML emulator, longer than the 1 s wait above.
    let text = std::fs::read_to_string(&d.config).unwrap();
    std::fs::write(
        &d.config,
        text.replace("allocate_wait_s = 1\n", "allocate_wait_s = 30\n"),
    )
    .unwrap();
    d.signal(nix::sys::signal::Signal::SIGHUP);
    d.wait_until("allocate_wait_s reloaded", || {
        d.log().contains("allocate_wait_s: 1 -> 30")
    });
    let c2 = d.client();
    let waiter = std::thread::spawn(move || c2.allocate(req(10, 0, 1, None)));
    d.wait_until("job 10 waiting in status", || {
        c.status().unwrap().waiting.iter().any(|w| w.job_id == 10)
    });
    assert_eq!(c.release(3).unwrap().released, 1);
    let a = waiter.join().unwrap().unwrap();
    // GPU 0 was full: only the release during the wait can have served it.
    assert_eq!(a.action, AllocAction::Reused);
    assert_eq!(a.uuid, uuids_of_job3, "not job 3's instance");
}

#[test]
fn idempotent_release_and_reuse() {
    let d = TestDaemon::start("idem", "");
    let c = d.client();
    let a = c.allocate(req(42, 0, 2, None)).unwrap();
    let again = c.allocate(req(42, 0, 2, None)).unwrap();
    assert_eq!(a.uuid, again.uuid);
    assert_eq!(again.action, AllocAction::Existing);
    assert_eq!(c.release(42).unwrap().released, 1);
    assert_eq!(c.release(42).unwrap().released, 0);
    assert_eq!(c.release(999).unwrap().released, 0);
    // The freed instance is reused by the next 2g job.
    let b = c.allocate(req(43, 0, 2, None)).unwrap();
    assert_eq!(b.uuid, a.uuid);
    assert_eq!(b.action, AllocAction::Reused);
    assert!(b.reused);
    let s = c.status().unwrap();
    let inst = &s.gpus[0].instances[0];
    assert_eq!(inst.job_id, Some(43));
    assert_eq!(inst.uuid, a.uuid);
}

#[test]
fn idle_ones_are_reshaped_into_a_seven() {
    let d = TestDaemon::start("reshape", "");
    let c = d.client();
    for job in 1..=7 {
        c.allocate(req(job, 1, 1, None)).unwrap();
    }
    assert_eq!(c.status().unwrap().gpus[1].picture, "1|1|1|1|1|1|1|.");
    for job in 1..=7 {
        c.release(job).unwrap();
    }
    let a = c.allocate(req(100, 1, 7, None)).unwrap();
    assert_eq!(a.profile, "7g.40gb");
    assert_eq!(a.action, AllocAction::Reshaped);
    let s = c.status().unwrap();
    assert_eq!(s.gpus[1].picture, "77777777");
    assert_eq!(s.gpus[1].instances.len(), 1);
    // A busy instance is never destroyed: with job 100 on the 7g, a 1g must fail.
    let err = c.allocate(req(101, 1, 1, None)).unwrap_err();
    assert!(
        matches!(err, ClientError::Daemon(ref e) if e.kind == ErrorKind::NoFit),
        "{err}"
    );
    assert_eq!(c.status().unwrap().gpus[1].instances[0].job_id, Some(100));
}

#[test]
fn concurrent_allocations_never_share_an_instance() {
    let d = TestDaemon::start("concurrent", "");
    let handles: Vec<_> = (0..14u64)
        .map(|job| {
            let c = d.client();
            std::thread::spawn(move || c.allocate(req(job + 1, (job % 2) as u32, 1, None)))
        })
        .collect();
    let mut uuids: Vec<String> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap().uuid)
        .collect();
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 14);
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let port = free_port();
    let d = TestDaemon::start("metrics", &format!("metrics_listen = \"127.0.0.1:{port}\""));
    let c = d.client();
    c.allocate(req(1, 0, 3, None)).unwrap();
    let body = scrape(port);
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    for needle in [
        "smartmig_allocations_total{result=\"created\"} 1",
        "smartmig_instances{gpu=\"0\",profile=\"3g.20gb\",state=\"busy\"} 1",
        "smartmig_allocation_latency_seconds_count 1",
        "smartmig_reconfigurations_total{gpu=\"0\",op=\"create\"} 1",
        "smartmig_energy_joules{gpu=\"1\"}",
    ] {
        assert!(body.contains(needle), "{needle} missing:\n{body}");
    }
}
