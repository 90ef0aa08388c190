//! `smartmig doctor` against the real-Slurm test cluster (`tests/slurm/
//! cluster.sh`: one node, two fake GPUs with 7 shards each, the plugin in
//! plugstack.conf) and a sidecar on the sim backend: the Slurm and plugin
//! checks pass on the configuration the other end-to-end tests run jobs
//! with, and the whole run exits 0 (the sim backend is one warning).
//!
//! Needs root and a release build of the workspace; fails, never skips.

use serde_json::Value;
use smartmig_suite::{describe, plugstack_line, Sidecar, SlurmCluster};

mod common;
use common::{check, doctor};

#[test]
fn doctor_passes_the_test_clusters_slurm_and_plugin_checks() {
    // Quick requeues as the other tests have them: on 25.11+ without
    // `requeue_delay` doctor warns (slurm.requeue).
    smartmig_suite::quick_requeues();
    // The packaged gres.conf (etc/slurm/gres.conf.snippet): one GRES type
    // per GPU, so that the default holds run (issue 56).
    std::env::set_var("SMARTMIG_SLURM_TYPED_GPUS", "1");
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, ""))
            .expect("write plugstack.conf");
    });
    let sidecar = Sidecar::start_with_slurm(cluster.dir(), "");
    let (checks, out) = doctor(&cluster);
    let status = |name: &str| {
        check(&checks, name)["status"]
            .as_str()
            .unwrap_or_else(|| panic!("check {name} has no status: {}", describe(&out)))
            .to_string()
    };
    for name in [
        "slurm.conf",
        "slurm.grestypes",
        "slurm.select",
        "slurm.node",
        "slurm.gres.autodetect",
        "slurm.gres.devices",
        "slurm.requeue",
        "slurm.gres.gpu",
        "slurm.gres.shard.gpu0",
        "slurm.gres.shard.gpu1",
        "slurm.holds",
        "plugin.line",
        "plugin.library",
        "plugin.args",
        "plugin.socket",
        "plugin.timeout",
        "daemon.health",
        "daemon.gpus",
        // smartmigd's own check of Slurm's GPU order, on the real slurmd -G.
        "daemon.gpu_order",
        // The default holds (`auto`) run on the typed gres.conf.
        "daemon.holds",
    ] {
        assert_eq!(status(name), "ok", "{name}: {}", describe(&out));
    }
    let slurm_or_plugin_not_ok: Vec<&Value> = checks
        .iter()
        .filter(|c| {
            let n = c["check"].as_str().unwrap_or("");
            (n.starts_with("slurm.") || n.starts_with("plugin.")) && c["status"] != "ok"
        })
        .collect();
    assert!(
        slurm_or_plugin_not_ok.is_empty(),
        "{slurm_or_plugin_not_ok:?}"
    );
    assert_eq!(status("gpus.sim"), "warn");
    assert!(out.status.success(), "{}", describe(&out));
    drop(sidecar);
}
