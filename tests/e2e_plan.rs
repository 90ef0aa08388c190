//! End-to-end: `mode = "confirm"` on the real-Slurm test cluster (Slurm
//! 22.05, the SPANK plugin, smartmigd on the sim backend with Slurm
//! queries on), driven the way an admin does, through `smartmig plan` and
//! `smartmig apply` (issue 22, part 2).
//!
//! The policy (`static:4444|3333`) wants both GPUs re-shaped; nothing
//! happens until the admin applies a plan. Jobs run meanwhile, served on
//! demand. Needs root and a release build; fails, never skips.

use std::time::Duration;

use serde_json::Value;
use smartmig_suite::{artifact, plugstack_line, Sidecar, SlurmCluster};

const TIMEOUT: Duration = Duration::from_secs(90);

fn smartmig(sidecar: &Sidecar, args: &[&str]) -> std::process::Output {
    std::process::Command::new(artifact("smartmig"))
        .args(args)
        .arg("--socket")
        .arg(sidecar.socket())
        .output()
        .expect("run smartmig")
}

fn plans(sidecar: &Sidecar) -> Value {
    let out = smartmig(sidecar, &["plan", "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("plan --json")
}

#[test]
fn confirm_mode_waits_for_the_admin_while_jobs_run() {
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, "")).expect("plugstack");
    });
    // Two held jobs wait in the queue: each plan's expected effect is
    // simulated over them.
    for _ in 0..2 {
        cluster.sbatch(&["-H", "--gres=shard:3", "--wrap=sleep 1"]);
    }
    let sidecar = Sidecar::start_with_slurm(
        cluster.dir(),
        "epoch_s = 1\npolicy = \"static:4444|3333\"\nmode = \"confirm\"\n",
    );
    let mut p = Value::Null;
    assert!(
        smartmig_suite::holds_within(TIMEOUT, || {
            p = plans(&sidecar);
            p["pending"]
                .as_array()
                .is_some_and(|a| a.len() == 2 && a.iter().all(|x| x["effect"]["waiting"] == 2))
        }),
        "no plans with their expected effect: {p:#}\n{}",
        cluster.smartmigd_log()
    );
    assert_eq!(p["mode"], "confirm");
    // Empty GPUs fit no 3-slice job; the plan builds a 3g.20gb on each.
    let e = &p["pending"][0]["effect"];
    assert_eq!(
        (e["unfit_keep"].as_u64(), e["unfit_plan"].as_u64()),
        (Some(2), Some(0)),
        "{p:#}"
    );
    let text = String::from_utf8_lossy(&smartmig(&sidecar, &["plan"]).stdout).to_string();
    assert!(text.contains("expected for the 2 waiting job(s)"), "{text}");
    let out = cluster
        .command("scancel")
        .arg("--state=PENDING")
        .output()
        .expect("scancel");
    assert!(out.status.success(), "{out:?}");
    assert!(
        Sidecar::instances(&sidecar.status()).is_empty(),
        "nothing is built before apply"
    );

    // A job runs meanwhile: served on demand.
    let job = cluster.sbatch_wrap(&["--gres=shard:1"], "echo PROFILE=$SMARTMIG_PROFILE");
    cluster.assert_completed(job, TIMEOUT);

    // The job's GPU changed under its plan: withdrawn at the next epoch.
    let mut p = Value::Null;
    assert!(
        smartmig_suite::holds_within(TIMEOUT, || {
            p = plans(&sidecar);
            p["pending"].as_array().is_some_and(|a| a.len() == 1)
        }),
        "the changed GPU's plan was not withdrawn: {p:#}"
    );

    // The admin applies the plan of the GPU that is still as it found it.
    let pending = p["pending"].as_array().cloned().unwrap_or_default();
    let plan = pending
        .iter()
        .find(|x| {
            x["from"]
                .as_str()
                .is_some_and(|f| f.chars().all(|c| c == '.'))
        })
        .unwrap_or_else(|| panic!("no plan for an empty GPU: {p:#}"));
    let id = plan["id"].as_u64().expect("id").to_string();
    let gpu = plan["gpu"].as_u64().expect("gpu");
    let out = smartmig(&sidecar, &["apply", &id]);
    assert!(out.status.success(), "{out:?}\n{}", cluster.smartmigd_log());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&format!("applied: plan {id}")), "{text}");
    let mut built: Vec<String> = Sidecar::instances(&sidecar.status())
        .into_iter()
        .filter(|i| i["gpu"] == gpu)
        .filter_map(|i| i["profile"].as_str().map(String::from))
        .collect();
    built.sort();
    assert_eq!(built, ["3g.20gb", "4g.20gb"]);
    // Applying it again is refused by name.
    let out = smartmig(&sidecar, &["apply", &id]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("no pending plan {id}")), "{err}");
    // And a 3-shard job now reuses the applied 3g.20gb or gets its own.
    let job = cluster.sbatch_wrap(&["--gres=shard:3"], "echo PROFILE=$SMARTMIG_PROFILE");
    cluster.assert_completed(job, TIMEOUT);
    assert!(
        cluster.smartmigd_log().contains("plan applied"),
        "{}",
        cluster.smartmigd_log()
    );
}
