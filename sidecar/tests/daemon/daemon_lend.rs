//! Lending an idle instance (issue 55), through a real smartmigd (sim
//! backend, or the NVML emulator) whose `squeue` and `scontrol` are
//! scripts: with holds on, a job whose room has no idle instance starts on
//! an idle bigger one instead of waiting for a build; with `lend_idle =
//! false`, without holds, or with a profile named it gets exactly its room.

use crate::daemon_common::{batch_step as batch, running_on_n1 as queue, TestDaemon};
use smartmig::daemon::protocol::AllocateRequest;

/// smartmigd with `holds` and `lend_idle` as given; job 21 (3 shards) runs
/// and ends, leaving its `3g.20gb` idle; then job 22 (2 shards, `named`:
/// with `--mig-profile=2g.10gb`) asks. Returns the profile job 22 got and
/// the holds' state.
fn second_job_profile(name: &str, holds: &str, lend: bool, named: bool) -> (String, String) {
    let d: TestDaemon = crate::daemon_common::with_fake_slurm_in(
        name,
        &format!("node_name = \"n1\"\nepoch_s = 1\nlend_idle = {lend}\n"),
        &format!("slurmd = \"/bin/false\"\nholds = \"{holds}\"\n"),
        &queue(&[(21, 3)]),
    );
    d.wait_epochs(0, 1);
    let c = d.client();
    let first = c
        .allocate(batch(21, 3))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    assert_eq!(first.profile, "3g.20gb");
    std::fs::write(d.dir.join("squeue.json"), queue(&[(22, 2)])).expect("queue");
    assert_eq!(c.release(21).expect("release 21").released, 1);
    let second = AllocateRequest {
        profile: named.then(|| "2g.10gb".to_string()),
        ..batch(22, 2)
    };
    let second = c
        .allocate(second)
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    if second.profile == "3g.20gb" && holds != "off" {
        // Slurm billed 2 of the lent 3g's slices and counts 5 free shards;
        // MIG builds 3 beside it: 2 must be held (the fake salloc fails,
        // and smartmigd logs what it asked for).
        d.wait_until("a hold of the lent instance's unbilled shards", || {
            d.log().contains("--gres=shard:mig0:2 ")
        });
    }
    let state = c
        .status()
        .expect("status")
        .holds
        .map(|h| h.state)
        .unwrap_or_default();
    (second.profile, state)
}

#[test]
fn with_holds_an_idle_bigger_instance_is_lent_before_one_is_built() {
    let (profile, holds) = second_job_profile("lend-on", "any-mix", true, false);
    assert_eq!(holds, "any-mix");
    assert_eq!(profile, "3g.20gb", "the idle 3g is lent to the 2-shard job");
}

#[test]
fn without_lending_or_without_holds_a_job_gets_exactly_its_room() {
    let (profile, _) = second_job_profile("lend-off", "any-mix", false, false);
    assert_eq!(profile, "2g.10gb", "lend_idle = false");
    let (profile, holds) = second_job_profile("lend-noholds", "off", true, false);
    assert_eq!(holds, "off");
    assert_eq!(profile, "2g.10gb", "no holds keep Slurm off a lent shard");
    let (profile, _) = second_job_profile("lend-named", "any-mix", true, true);
    assert_eq!(
        profile, "2g.10gb",
        "a profile asked for by name is never lent"
    );
}
