//! End-to-end measurement: what smartmig costs slurmctld per epoch, with
//! and without the cluster summary (issue 23, part 3; docs/architecture.md
//! "Cluster scale").
//!
//! The real-Slurm test cluster gets `N - 1` extra smartmig nodes
//! (`SMARTMIG_SLURM_EXTRA_NODES`: declared, DOWN, no slurmd) and `JOBS`
//! held shard jobs. For N = 1 and N = `NODES`, N smartmigd (sim backend,
//! `epoch_s` as set, each with its own `node_name`) run for a window while
//! `sdiag` counts slurmctld's RPCs by type:
//!
//! - **squeue**: today's behaviour (no summary): each node runs `squeue
//!   --json` and `sinfo --json` every epoch;
//! - **summary**: one `smartmig publish --epoch-s 1` reads Slurm for
//!   everyone and each node reads its file.
//!
//! It prints the table, writes JSON (`SMARTMIG_CONTROL_PLANE_OUT`, default
//! `target/control-plane.json`) and asserts what the design promises: the
//! queue reads per epoch grow with N without the summary and stay at the
//! publisher's one with it. `SMARTMIG_CONTROL_PLANE_JOBS` (default 300),
//! `SMARTMIG_CONTROL_PLANE_NODES` (default 4) and
//! `SMARTMIG_CONTROL_PLANE_EPOCH_S` (default 1) scale it up; the figures in
//! docs/architecture.md come from 2,000 jobs, 8 nodes and 5 s epochs (all
//! the daemons share this machine's cores, and at 1 s eight of them cannot
//! each parse a 6 MB queue every epoch). Needs root and a release build;
//! fails, never skips.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::{json, Value};
use smartmig_suite::{artifact, repo_root, Sidecar, SidecarBackend, SlurmCluster};

/// Epochs each configuration is measured.
const WINDOW_EPOCHS: u64 = 10;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `sdiag`'s RPC counts by message type (without sdiag's own).
fn rpc_counts(cluster: &SlurmCluster) -> BTreeMap<String, u64> {
    let out = cluster.command("sdiag").output().expect("run sdiag");
    assert!(out.status.success(), "sdiag: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let section = text
        .split("Remote Procedure Call statistics by message type")
        .nth(1)
        .and_then(|s| s.split("Remote Procedure Call statistics by user").next())
        .unwrap_or_else(|| panic!("no RPC section in sdiag:\n{text}"));
    section
        .lines()
        .filter_map(|l| {
            let name = l.split_whitespace().next()?;
            let count = l
                .split("count:")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            (name != "REQUEST_STATS_INFO").then(|| (name.to_string(), count))
        })
        .collect()
}

fn reset(cluster: &SlurmCluster) {
    let out = cluster
        .command("sdiag")
        .arg("--reset")
        .output()
        .expect("sdiag --reset");
    assert!(out.status.success(), "sdiag --reset: {out:?}");
}

/// Bytes of a command's JSON answer (what slurmctld serialised).
fn answer_bytes(cluster: &SlurmCluster, program: &str) -> u64 {
    let out = cluster
        .command(program)
        .arg("--json")
        .output()
        .expect(program);
    assert!(out.status.success(), "{program} --json: {out:?}");
    out.stdout.len() as u64
}

/// One smartmigd per node name, each in its own directory.
fn daemons(
    cluster: &SlurmCluster,
    tag: &str,
    names: &[String],
    summary: Option<&Path>,
    epoch_s: u64,
) -> Vec<Sidecar> {
    names
        .iter()
        .map(|name| {
            let dir = cluster.dir().join(format!("cp-{tag}-{name}"));
            std::fs::create_dir_all(&dir).expect("daemon dir");
            let conf = dir.join("slurm.conf");
            if !conf.exists() {
                std::os::unix::fs::symlink(cluster.slurm_conf(), &conf).expect("link slurm.conf");
            }
            let mut extra = format!("epoch_s = {epoch_s}\nnode_name = \"{name}\"\n");
            if let Some(d) = summary {
                extra.push_str(&format!("[cluster]\nsummary_dir = \"{}\"\n", d.display()));
            } else {
                // No publisher: the default path holds nothing, so the
                // node asks Slurm itself (today's behaviour).
                extra.push_str("[cluster]\nsummary_dir = \"/nonexistent/smartmig-summary\"\n");
            }
            Sidecar::start_on(&dir, &extra, true, &SidecarBackend::Sim)
        })
        .collect()
}

fn publisher(cluster: &SlurmCluster, dir: &Path, epoch_s: u64) -> Child {
    Command::new(artifact("smartmig"))
        .args(["publish", "--epoch-s", &epoch_s.to_string(), "--dir"])
        .arg(dir)
        .env("SLURM_CONF", cluster.slurm_conf())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start smartmig publish")
}

#[test]
fn the_summary_keeps_slurmctld_load_flat_in_the_number_of_nodes() {
    let jobs = env_or("SMARTMIG_CONTROL_PLANE_JOBS", 300);
    let nodes = env_or("SMARTMIG_CONTROL_PLANE_NODES", 4).max(2);
    let epoch_s = env_or("SMARTMIG_CONTROL_PLANE_EPOCH_S", 1).max(1) as u64;
    let window_s = WINDOW_EPOCHS * epoch_s;
    std::env::set_var("SMARTMIG_SLURM_EXTRA_NODES", (nodes - 1).to_string());
    let cluster = SlurmCluster::up();
    let host = cluster
        .command("hostname")
        .arg("-s")
        .output()
        .expect("hostname");
    let host = String::from_utf8_lossy(&host.stdout).trim().to_string();
    let names: Vec<String> = std::iter::once(host)
        .chain((1..nodes).map(|k| format!("smnode{k}")))
        .collect();

    // The queue: held shard jobs of every size (one sbatch each, as users
    // submit them).
    let script = format!(
        "for i in $(seq 1 {jobs}); do sbatch -H -o /dev/null --gres=shard:$(( i % 7 + 1 )) --wrap=true >/dev/null || exit 1; done"
    );
    let out = cluster
        .command("bash")
        .args(["-c", &script])
        .output()
        .expect("submit");
    assert!(out.status.success(), "submitting {jobs} jobs: {out:?}");
    let squeue_bytes = answer_bytes(&cluster, "squeue");
    let sinfo_bytes = answer_bytes(&cluster, "sinfo");

    let summary_dir = cluster.dir().join("summary");
    let mut rows = Vec::new();
    for mode in ["squeue", "summary"] {
        for n in [1, nodes] {
            let tag = format!("{mode}-{n}");
            let mut publish =
                (mode == "summary").then(|| publisher(&cluster, &summary_dir, epoch_s));
            if publish.is_some() {
                let first = summary_dir.join(format!("{}.json", names[0]));
                assert!(
                    smartmig_suite::holds_within(Duration::from_secs(20), || first.exists()),
                    "smartmig publish wrote no summary"
                );
            }
            let mut running = daemons(
                &cluster,
                &tag,
                &names[..n],
                publish.as_ref().map(|_| summary_dir.as_path()),
                epoch_s,
            );
            // Past start-up: every daemon has run two epochs to the end
            // (in summary mode, reading the publisher's file).
            for d in &running {
                d.wait_epochs(0, 2, Duration::from_secs(60 + 4 * epoch_s));
            }
            reset(&cluster);
            // Not synchronisation: the measurement window. slurmctld's
            // load is counted over this much wall time (epochs wait for a
            // slow read, so the RPCs per epoch_s are what a site sees).
            std::thread::sleep(Duration::from_secs(window_s));
            let counts = rpc_counts(&cluster);
            // Every node says where its view came from.
            for d in &running {
                let source = d.status()["cluster"]["source"].clone();
                assert_eq!(source, mode, "{tag}: {:#}", d.status()["cluster"]);
            }
            for d in &mut running {
                d.stop();
            }
            if let Some(mut p) = publish.take() {
                let _ = p.kill();
                let _ = p.wait();
            }
            let per_epoch =
                |t: &str| counts.get(t).copied().unwrap_or(0) as f64 / WINDOW_EPOCHS as f64;
            let total: f64 = counts.values().sum::<u64>() as f64 / WINDOW_EPOCHS as f64;
            let summary_bytes: u64 = if mode == "summary" {
                names[..n]
                    .iter()
                    .filter_map(|x| std::fs::metadata(summary_dir.join(format!("{x}.json"))).ok())
                    .map(|m| m.len())
                    .sum()
            } else {
                0
            };
            let ctld_bytes = per_epoch("REQUEST_JOB_INFO") * squeue_bytes as f64
                + per_epoch("REQUEST_NODE_INFO") * sinfo_bytes as f64;
            rows.push(json!({
                "mode": mode,
                "nodes": n,
                "rpcs_per_epoch": total,
                "job_info_per_epoch": per_epoch("REQUEST_JOB_INFO"),
                "node_info_per_epoch": per_epoch("REQUEST_NODE_INFO"),
                "slurmctld_bytes_per_epoch": ctld_bytes,
                "summary_bytes_read_per_epoch": summary_bytes,
                "by_type": counts,
            }));
        }
    }

    println!(
        "\n{jobs} held jobs; squeue --json answers {squeue_bytes} bytes ({:.0} per job), sinfo --json {sinfo_bytes}; {WINDOW_EPOCHS} epochs of {epoch_s} s",
        squeue_bytes as f64 / jobs as f64
    );
    println!(
        "{:<8} {:>5} {:>10} {:>9} {:>10} {:>16} {:>14}",
        "mode", "nodes", "RPCs/epoch", "job info", "node info", "ctld bytes/epoch", "summary bytes"
    );
    for r in &rows {
        println!(
            "{:<8} {:>5} {:>10.1} {:>9.1} {:>10.1} {:>16.0} {:>14}",
            r["mode"].as_str().unwrap_or(""),
            r["nodes"],
            r["rpcs_per_epoch"].as_f64().unwrap_or(0.0),
            r["job_info_per_epoch"].as_f64().unwrap_or(0.0),
            r["node_info_per_epoch"].as_f64().unwrap_or(0.0),
            r["slurmctld_bytes_per_epoch"].as_f64().unwrap_or(0.0),
            r["summary_bytes_read_per_epoch"]
        );
    }
    let out_path = std::env::var("SMARTMIG_CONTROL_PLANE_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("target/control-plane.json"));
    let report = json!({"jobs": jobs, "squeue_bytes": squeue_bytes, "sinfo_bytes": sinfo_bytes,
        "epoch_s": epoch_s, "epochs": WINDOW_EPOCHS, "rows": rows});
    std::fs::write(
        &out_path,
        serde_json::to_vec_pretty(&report).unwrap_or_default(),
    )
    .unwrap_or_else(|e| panic!("write {}: {e}", out_path.display()));

    let row = |mode: &str, n: usize| -> &Value {
        rows.iter()
            .find(|r| r["mode"] == mode && r["nodes"] == n)
            .expect("row")
    };
    let ji = |mode: &str, n: usize| row(mode, n)["job_info_per_epoch"].as_f64().unwrap_or(0.0);
    // Without the summary every node reads the whole queue each epoch
    // (fewer here when the shared cores cannot keep up: hence the margin).
    assert!(
        ji("squeue", nodes) >= 0.5 * nodes as f64 * ji("squeue", 1),
        "queue reads did not grow with the nodes: {rows:#?}"
    );
    // With it, the publisher's one read per epoch, whatever N.
    for n in [1, nodes] {
        assert!(
            (0.5..=1.5).contains(&ji("summary", n)),
            "summary mode, {n} node(s): {} queue reads per epoch: {rows:#?}",
            ji("summary", n)
        );
    }
    let total = |mode: &str| row(mode, nodes)["rpcs_per_epoch"].as_f64().unwrap_or(0.0);
    assert!(
        total("summary") * 2.0 <= total("squeue"),
        "the summary did not halve slurmctld's RPCs at {nodes} nodes: {rows:#?}"
    );
}
