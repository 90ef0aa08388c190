//! Smoke test of the SPANK plugin against a real Slurm: with
//! `libsmartmig_spank.so` listed as `required` in plugstack.conf, a shard job
//! still runs (with `on_failure=whole-gpu`, as no sidecar runs here), and
//! slurmstepd logged the plugin's `slurm_spank_init` message.
//! (A `required` plugin that fails to load makes the job fail.)
//!
//! Uses the plugin of the same profile: run `cargo build --release --workspace`
//! first (`scripts/test` does).

use std::time::Duration;

use smartmig_suite::{plugin, SlurmCluster};

#[test]
fn required_plugin_loads_in_slurmstepd() {
    let plugin = plugin();
    let cluster = SlurmCluster::up();
    // plugstack.conf is read for each new job: no daemon restart needed.
    // No smartmigd runs here, so the shard job gets no MIG instance;
    // `on_failure=whole-gpu` lets it run on the GPU Slurm chose (the
    // allocation itself is covered by tests/e2e_mig.rs).
    std::fs::write(
        cluster.dir().join("plugstack.conf"),
        format!(
            "required {} socket={} on_failure=whole-gpu\n",
            plugin.display(),
            cluster.dir().join("no-sidecar.sock").display()
        ),
    )
    .expect("write plugstack.conf");

    let out_file = cluster.dir().join("spank-job.out");
    let job = cluster.sbatch(&[
        "--gres=shard:2",
        "-o",
        out_file.to_str().expect("utf-8 temp path"),
        "--wrap",
        "echo SH=$SLURM_SHARDS_ON_NODE",
    ]);
    let state = cluster.wait_job(job, Duration::from_secs(60));
    let output = std::fs::read_to_string(&out_file).unwrap_or_default();
    assert_eq!(
        state,
        "COMPLETED",
        "job {job} ended {state}; output: {output:?}\n{}",
        cluster.log_tails()
    );
    assert!(output.contains("SH=2"), "job output {output:?}");

    let slurmd_log =
        std::fs::read_to_string(cluster.dir().join("log/slurmd.log")).expect("read slurmd.log");
    assert!(
        slurmd_log.contains("smartmig: plugin loaded"),
        "slurmstepd did not log the plugin's init message\n{}",
        cluster.log_tails()
    );
}
