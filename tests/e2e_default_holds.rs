//! End-to-end (issue 56, item 1): the packaged config holds stranded shards
//! where gres.conf gives each GPU its own type, and an existing site's
//! untyped gres.conf runs without holds, says so, and migrates by the docs.
//!
//! A real Slurm node (the host's 22.05, or `SMARTMIG_SLURM_SERIES`) set up
//! the way sites ran smartmig before issue 56 (one untyped `gpu` line, one
//! untyped `shard` line per GPU), the SPANK plugin, and smartmigd on the
//! packaged etc/smartmig.toml (no `holds` key: `auto`), sim backend:
//!
//! 1. smartmigd runs without holds and says so: a start-up warning, the
//!    status reply's `holds` (`configured = auto`, `state = off`, the
//!    reason) and `smartmig status`'s `Holds: off` line; `smartmig doctor`
//!    warns `slurm.holds` and `daemon.holds`, with the exact lines.
//! 2. The migration of docs/slurm-integration.md §9 ("Migrating an untyped
//!    gres.conf"), done with the lines doctor printed: gres.conf and
//!    slurm.conf's `Gres=`, then slurmctld, slurmd and smartmigd restarted.
//! 3. Then smartmigd holds by `adaptive` (issue 55), doctor's checks are `ok`, and two
//!    `shard:3` jobs on GPU 0 get the hold on its stranded seventh shard.
//!
//! Needs root and a release build of the workspace (`scripts/test`).

use std::time::Duration;

use smartmig_suite::{holds_within, plugstack_line, Sidecar, SidecarBackend, SlurmCluster};

mod common;
use common::{check, doctor};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The backticked lines of doctor's `slurm.holds` fix: the new gres.conf
/// lines and the node's new `Gres=`.
fn migration(fix: &str) -> (Vec<String>, String) {
    let quoted: Vec<&str> = fix.split('`').skip(1).step_by(2).collect();
    let lines = quoted
        .iter()
        .filter(|q| q.starts_with("NodeName="))
        .map(ToString::to_string)
        .collect();
    let gres = quoted
        .iter()
        .find(|q| q.starts_with("Gres="))
        .unwrap_or_else(|| panic!("no Gres= in the fix: {fix}"))
        .to_string();
    (lines, gres)
}

/// Names of this node's holds in Slurm's queue.
fn holds(cluster: &SlurmCluster) -> Vec<String> {
    let out = cluster
        .command("squeue")
        .args(["-h", "-o", "%j"])
        .output()
        .expect("run squeue");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|n| n.starts_with("smartmig-hold."))
        .map(str::to_string)
        .collect()
}

#[test]
fn an_untyped_site_runs_without_holds_says_so_and_migrates_by_the_docs() {
    std::env::remove_var("SMARTMIG_SLURM_TYPED_GPUS");
    std::env::remove_var("SMARTMIG_SLURM_JOB_SUBMIT");
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, ""))
            .expect("write plugstack.conf");
    });
    let dir = cluster.dir().to_path_buf();
    let config = Sidecar::packaged_config(&dir);
    assert!(
        !config.lines().any(|l| l.trim_start().starts_with("holds")),
        "the packaged config sets no holds key: {config}"
    );
    let mut sidecar = Sidecar::start_text(&dir, &config, &SidecarBackend::Sim);

    // 1. Untyped: no holds, and every place an admin looks says why.
    let s = sidecar.status();
    assert_eq!(s["holds"]["configured"], "auto", "{:#}", s["holds"]);
    assert_eq!(s["holds"]["state"], "off", "{:#}", s["holds"]);
    let reason = s["holds"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("no per-GPU types"), "{reason}");
    assert!(
        reason.contains("Migrating an untyped gres.conf"),
        "{reason}"
    );
    assert!(
        cluster
            .smartmigd_log()
            .contains("running without holds on stranded shards"),
        "{}",
        cluster.smartmigd_log()
    );
    let table = sidecar.status_table();
    assert!(table.contains("Holds: off (slurm.holds = auto)"), "{table}");
    let (checks, _) = doctor(&cluster);
    let holds_check = check(&checks, "slurm.holds");
    assert_eq!(holds_check["status"], "warn", "{holds_check:#}");
    assert_eq!(check(&checks, "daemon.holds")["status"], "warn");
    let (lines, gres) = migration(holds_check["fix"].as_str().unwrap_or_default());
    assert_eq!(lines.len(), 4, "a gpu and a shard line per GPU: {lines:?}");

    // 2. The migration, with doctor's lines: gres.conf's gpu and shard
    // lines replaced, the node's Gres= in slurm.conf, Slurm and smartmigd
    // restarted.
    sidecar.stop();
    let gres_conf = dir.join("gres.conf");
    let kept: Vec<String> = std::fs::read_to_string(&gres_conf)
        .expect("read gres.conf")
        .lines()
        .filter(|l| l.starts_with('#') || !(l.contains("Name=gpu") || l.contains("Name=shard")))
        .map(str::to_string)
        .collect();
    std::fs::write(
        &gres_conf,
        format!("{}\n{}\n", kept.join("\n"), lines.join("\n")),
    )
    .expect("write gres.conf");
    let slurm_conf = std::fs::read_to_string(cluster.slurm_conf()).expect("read slurm.conf");
    assert!(slurm_conf.contains("Gres=gpu:2,shard:14"), "{slurm_conf}");
    std::fs::write(
        cluster.slurm_conf(),
        slurm_conf.replacen("Gres=gpu:2,shard:14", &gres, 1),
    )
    .expect("write slurm.conf");
    cluster.restart_slurm();
    let sidecar = Sidecar::start_text(&dir, &config, &SidecarBackend::Sim);

    // 3. Typed: holds by adaptive, doctor content.
    let s = sidecar.status();
    assert_eq!(s["holds"]["state"], "adaptive", "{:#}", s["holds"]);
    let (checks, _) = doctor(&cluster);
    for name in [
        "slurm.holds",
        "daemon.holds",
        "slurm.node",
        "daemon.gpu_order",
    ] {
        assert_eq!(
            check(&checks, name)["status"],
            "ok",
            "{:#}",
            check(&checks, name)
        );
    }
    // Two 3g.20gb on GPU 0 strand its seventh shard: held at once.
    for _ in 0..2 {
        cluster.sbatch(&["--gres=shard:3", "-o", "/dev/null", "--wrap", "sleep 60"]);
    }
    cluster.sbatch(&["--gres=shard:7", "-o", "/dev/null", "--wrap", "sleep 60"]);
    let held = holds_within(TIMEOUT, || {
        holds(&cluster).iter().any(|h| h.ends_with(".0"))
    });
    assert!(
        held,
        "no hold on GPU 0 next to two 3g.20gb: {:?}\n{}",
        holds(&cluster),
        cluster.log_tails()
    );
    drop(sidecar);
}
