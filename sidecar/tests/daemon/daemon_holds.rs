//! The adaptive holds (issue 55), through a real smartmigd (sim backend,
//! or the NVML emulator) whose `squeue`, `scontrol` and `salloc` are
//! scripts: beside a busy `3g.20gb@4` a 4g still fits, so `adaptive`
//! holds nothing there (as `next-job`); once a job gave up waiting for
//! room on the GPU it holds the shard `any-mix` keeps back (3 + 1 would
//! not fit), for an hour.

use crate::daemon_common::{batch_step as batch, running_on_n1 as queue, TestDaemon};
use smartmig::daemon::{ClientError, ErrorKind};

/// The hold of `n` shards of GPU 0 that smartmigd asked Slurm for (the
/// fake `salloc` fails, and smartmigd logs the command).
fn asked_hold(d: &TestDaemon, n: u8) -> bool {
    d.log().contains(&format!("--gres=shard:mig0:{n} "))
}

#[test]
fn adaptive_holds_hold_strictly_only_after_a_job_collided_on_the_gpu() {
    let d: TestDaemon = crate::daemon_common::with_fake_slurm_in(
        "holds-adaptive",
        "node_name = \"n1\"\nepoch_s = 1\n",
        "slurmd = \"/bin/false\"\nholds = \"adaptive\"\n",
        &queue(&[(31, 3)]),
    );
    d.wait_epochs(0, 1);
    let c = d.client();
    let status = c.status().expect("status");
    assert_eq!(
        status.holds.map(|h| h.state).as_deref(),
        Some("adaptive"),
        "{}",
        d.log()
    );
    let first = c
        .allocate(batch(31, 3))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    // Next-job keeps the offer largest with the 3g at slot 4 (a 4g still
    // fits beside it): nothing is stranded, nothing held.
    assert_eq!((first.profile.as_str(), first.start), ("3g.20gb", 4));
    d.wait_epochs(d.epochs(), 2);
    assert!(
        !asked_hold(&d, 1),
        "held before any collision:\n{}",
        d.log()
    );
    // A whole-GPU job Slurm put beside it cannot be built: it gives up
    // after allocate_wait_s (1 s here). That is a collision.
    std::fs::write(d.dir.join("squeue.json"), queue(&[(31, 3), (32, 7)])).expect("queue");
    let err = c.allocate(batch(32, 7)).expect_err("a 7g beside a busy 3g");
    let ClientError::Daemon(e) = err else {
        panic!("{err}")
    };
    assert_eq!(e.kind, ErrorKind::NoFit, "{e:?}");
    d.wait_until("the any-mix hold of the shard 3 + 1 cannot use", || {
        asked_hold(&d, 1)
    });
}
