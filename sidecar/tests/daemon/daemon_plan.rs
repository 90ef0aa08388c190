//! Plans before reconfigurations (issue 22, part 2) through a real
//! smartmigd over its Unix socket (2 x A100-40GB, sim backend or the NVML
//! emulator): with `mode = "confirm"` the policy's targets wait for
//! `apply` and lapse; with the default `mode = "dynamic"` they are carried
//! out and listed as applied. Jobs are served on demand either way.

use crate::daemon_common::{base_config, epochs, free_port, req, TestDaemon};
use smartmig::daemon::protocol::PlanReply;

fn start(name: &str, extra: &str) -> TestDaemon {
    TestDaemon::start_with(name, |dir| {
        base_config(dir, &format!("policy = \"static:4444|3333\"\n{extra}"))
            .replace("epoch_s = 3600\n", "epoch_s = 1\n")
    })
}

fn instances_on(d: &TestDaemon, gpu: usize) -> Vec<String> {
    let s = d.client().status().expect("status");
    s.gpus[gpu]
        .instances
        .iter()
        .map(|i| i.profile.clone())
        .collect()
}

fn plans(d: &TestDaemon) -> PlanReply {
    d.client().plan().expect("plan")
}

#[test]
fn confirm_mode_waits_for_apply_and_plans_lapse() {
    let port = free_port();
    let d = start(
        "plan-confirm",
        &format!(
            "mode = \"confirm\"\nplan_timeout_s = 3600\nmetrics_listen = \"127.0.0.1:{port}\"\n"
        ),
    );
    d.wait_until("a plan per GPU", || plans(&d).pending.len() == 2);
    let r = plans(&d);
    assert_eq!(r.mode, "confirm");
    // Nothing happened to the GPUs: the plans wait.
    assert!(instances_on(&d, 0).is_empty(), "{r:?}");
    assert!(instances_on(&d, 1).is_empty(), "{r:?}");
    let p0 = r
        .pending
        .iter()
        .find(|p| p.gpu == 0)
        .expect("GPU 0's plan")
        .clone();
    assert_eq!(p0.create.len(), 2, "{p0:?}");
    assert!(p0.expires_at.is_some(), "{p0:?}");
    // The status shows them too.
    assert_eq!(d.client().status().unwrap().pending_plans.len(), 2);
    // The id stays while the policy wants the same thing: two epochs on.
    let seen = epochs(port);
    d.wait_until("two more epochs", || epochs(port) >= seen + 2);
    assert!(
        plans(&d).pending.iter().any(|p| p.id == p0.id),
        "{:?}",
        plans(&d)
    );

    // Apply GPU 0's plan: its layout is built; GPU 1 still waits.
    let done = d.client().apply(p0.id).expect("apply");
    assert_eq!(done.id, p0.id);
    assert!(done.applied_at.is_some());
    let mut on0 = instances_on(&d, 0);
    on0.sort();
    assert_eq!(on0, ["3g.20gb", "4g.20gb"]);
    assert!(instances_on(&d, 1).is_empty());
    let r = plans(&d);
    assert_eq!(r.pending.len(), 1, "{r:?}");
    assert_eq!(r.applied.last().map(|p| p.id), Some(p0.id));

    // An unknown or spent id is refused by name and changes nothing.
    let e = d.client().apply(p0.id).unwrap_err().to_string();
    assert!(e.contains(&format!("no pending plan {}", p0.id)), "{e}");
    // Jobs are still served on demand on the GPU that waits.
    let a = d.client().allocate(req(7, 1, 1, None)).expect("allocate");
    assert_eq!(a.profile, "1g.5gb");
    // Every 1-slice placement overlaps `4444|3333`'s instances, so the
    // target would now destroy job 7's instance: the plan is withdrawn.
    d.wait_until("GPU 1's plan withdrawn", || {
        plans(&d).pending.iter().all(|p| p.gpu != 1)
    });
    assert_eq!(instances_on(&d, 1), ["1g.5gb"]);
}

#[test]
fn a_plan_not_applied_in_time_lapses() {
    let d = start("plan-lapse", "mode = \"confirm\"\nplan_timeout_s = 1\n");
    d.wait_until("a plan", || !plans(&d).pending.is_empty());
    let first = plans(&d).pending[0].clone();
    let lapsed = format!("plan={} ", first.id);
    d.wait_until("the plan lapsed", || {
        d.log()
            .lines()
            .any(|l| l.contains("plan lapsed") && l.contains(&lapsed))
    });
    let e = d.client().apply(first.id).unwrap_err().to_string();
    assert!(
        e.contains(&format!("plan {} lapsed", first.id))
            || e.contains(&format!("no pending plan {}", first.id)),
        "{e}"
    );
    assert!(instances_on(&d, first.gpu as usize).is_empty());
}

#[test]
fn dynamic_mode_applies_and_lists_what_it_did() {
    let d = start("plan-dynamic", "");
    d.wait_until("both layouts built", || {
        !instances_on(&d, 0).is_empty() && !instances_on(&d, 1).is_empty()
    });
    let r = plans(&d);
    assert_eq!(r.mode, "dynamic");
    assert!(r.pending.is_empty(), "{r:?}");
    assert_eq!(r.applied.len(), 2, "{r:?}");
    assert!(r
        .applied
        .iter()
        .all(|p| p.applied_at.is_some() && p.create.len() == 2));
    // Apply is for confirm mode: nothing pending, refused by name.
    let e = d.client().apply(1).unwrap_err().to_string();
    assert!(e.contains("no pending plan 1 (pending: none)"), "{e}");
}
