//! End-to-end measurement (issue 42, item 2): a busy mix of 1-, 2-, 3- and
//! 7-shard batch jobs on the real Slurm 22.05 test node (two A100-40GB on
//! smartmigd's sim backend, `job_submit.lua`, the SPANK plugin), reported
//! as Slurm records it: requeues per 100 jobs (`Restarts`), jobs that did
//! not complete, and the mean and 95th-percentile wait from submit to
//! (last) start.
//!
//! The same job list is written as a smartmig job CSV and run through
//! `smartmig simulate --slurm-like` with the same timings, so the real and
//! the simulated figures sit side by side (docs/slurm-integration.md §9).
//!
//! Timings are scaled down so that a few hundred jobs fit in minutes: jobs
//! sleep 3-12 s, smartmigd waits `allocate_wait_s = 3` for room, Slurm holds
//! a requeued job `cred_expire + 1 = 6` s and passes every 2 s.
//!
//! Knobs (environment): `SMARTMIG_BUSY_MIX_JOBS` (default 120),
//! `SMARTMIG_BUSY_MIX_SEED` (default 42), `SMARTMIG_BUSY_MIX_HOLDS`
//! (smartmigd's `slurm.holds`: `adaptive` default, as `auto` runs on a
//! typed gres.conf since issue 55; `any-mix`; `next-job`; `off` for the
//! behaviour before issue 42; the requeue bound is asserted for
//! `adaptive` and `any-mix`), `SMARTMIG_BUSY_MIX_OUT=DIR` (keep the job
//! CSV, the per-job records, the summary JSON and smartmigd's and
//! slurmctld's logs there), `SMARTMIG_BUSY_MIX_CONFIG=packaged` (issue 56:
//! what a new site runs: smartmigd on the packaged etc/smartmig.toml, no
//! `holds` key, `allocate_wait_s = 30`; gres.conf typed per GPU as the
//! packaged snippet; Slurm's own `cred_expire` (a requeued job is held
//! 121 s) and `sched_interval` (60 s); `SMARTMIG_BUSY_MIX_HOLDS` is then
//! ignored and the simulator runs with the same settings),
//! `SMARTMIG_BUSY_MIX_POLICY` (issue 55: smartmigd's `policy`: `none`, the
//! packaged default, instances built on demand only, simulated as
//! `on-demand`; `greedy`, the fallback when a policy file is missing;
//! `learned`, the shipped `policies/a100-40gb.onnx`; the simulator runs the
//! same policy), `SMARTMIG_BUSY_MIX_LEND=off` (smartmigd's `lend_idle =
//! false` and the simulator's `lend=off`: every job on exactly its room).
//!
//! Needs root and a release build of the workspace (`scripts/test`).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use smartmig_suite::{
    artifact, describe, fields, plugstack_line, repo_root, Sidecar, SidecarBackend, SlurmCluster,
};

/// smartmigd's wait for room, s (`allocate_wait_s`).
const ALLOCATE_WAIT_S: u64 = 3;
/// Slurm's credential lifetime: a requeued job is held `CRED_EXPIRE + 1` s.
const CRED_EXPIRE_S: u64 = 5;
/// Slurm's periodic scheduling pass, s (`sched_interval`).
const SCHED_INTERVAL_S: u64 = 2;
/// The simulator's batched passes, s (`--slurm-like pass=`): the cluster sets
/// `batch_sched_delay=0`, so a submit or an end is scheduled at slurmctld's
/// next background tick, once a second.
const PASS_S: u64 = 1;
/// Seconds between two submissions: the node is kept busy (about 0.9 of
/// its 14 slices in demand) without an ever-growing queue.
const GAP_S: f64 = 1.6;

/// The most requeues per 100 jobs this test accepts with `adaptive` or
/// `any-mix` holds (`adaptive` holds by `any-mix` on a GPU for an hour after
/// a job collided there, so a burst like this one meets it after its first
/// collision on each GPU). Issue
/// 42's goal is a tenth of the rate before it, 1.1 (docs/slurm-integration.md
/// §9, "Measured"). On 300 jobs of this mix, seed 42, a real Slurm 22.05 on a
/// loaded machine gave 11.0 and 14.3 per 100 jobs with
/// `SMARTMIG_BUSY_MIX_HOLDS=off`, 2.0, 3.7 and 3.3 with `any-mix` (the default
/// here) while allocates were placed one by one, 1.0 and 1.3 once each
/// allocate left room for the rest of its scheduling pass (§9, "Passes
/// placed together"), and 0.7 and 0.7 once every pass's first allocate read
/// the queue (§9, "Every pass's first allocate reads the queue"). The bound sits above the whole spread and well below `off`,
/// so a change that brings the requeues back fails it while a loaded
/// machine does not; the goal is measured, not asserted.
const MAX_REQUEUES_PER_100: f64 = 5.0;

/// One job of the mix.
#[derive(Clone, Debug)]
struct MixJob {
    name: String,
    shards: u8,
    submit_s: f64,
    run_s: u32,
}

/// splitmix64: a fixed, dependency-free stream for the job list.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// `n` jobs: 40 % one shard, 25 % two, 25 % three, 10 % seven; 3-12 s
/// each; one every [`GAP_S`].
fn job_list(n: usize, seed: u64) -> Vec<MixJob> {
    let mut r = Mix(seed);
    (0..n)
        .map(|i| {
            let shards = match r.next() % 20 {
                0..=7 => 1,
                8..=12 => 2,
                13..=17 => 3,
                _ => 7,
            };
            MixJob {
                name: format!("mix-{i}"),
                shards,
                submit_s: i as f64 * GAP_S,
                run_s: 3 + (r.next() % 10) as u32,
            }
        })
        .collect()
}

/// The list as a smartmig job CSV (`smartmig simulate --workload FILE`):
/// the same sizes and submit times; `sleep` runs as long on any slice, so
/// the speed-up curve is flat (saturation 0.1 < 1/7).
fn job_csv(jobs: &[MixJob]) -> String {
    let mut s = String::from(
        "id,arrival_s,work_s,memory_gb,class,deadline_s,requested_slices,speedup_beta,speedup_saturation\n",
    );
    for j in jobs {
        s.push_str(&format!(
            "{},{},{},1,training,{},{},1,0.1\n",
            j.name,
            j.submit_s,
            j.run_s,
            j.submit_s + 10.0 * f64::from(j.run_s),
            j.shards
        ));
    }
    s
}

/// What Slurm recorded for the run.
#[derive(Debug)]
struct Outcome {
    jobs: usize,
    requeues: u64,
    failed: Vec<String>,
    waits: Vec<f64>,
}

impl Outcome {
    fn requeues_per_100(&self) -> f64 {
        100.0 * self.requeues as f64 / self.jobs.max(1) as f64
    }

    fn mean_wait(&self) -> f64 {
        self.waits.iter().sum::<f64>() / self.waits.len().max(1) as f64
    }

    /// Nearest rank, as the simulator's `p95_wait_s`.
    fn p95_wait(&self) -> f64 {
        let mut w = self.waits.clone();
        w.sort_by(f64::total_cmp);
        let rank = ((0.95 * w.len() as f64).ceil() as usize).clamp(1, w.len().max(1)) - 1;
        w.get(rank).copied().unwrap_or(0.0)
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The timings of a run: the test's scaled-down ones, or the packaged
/// defaults (smartmigd's `allocate_wait_s`, Slurm's `cred_expire` and
/// `sched_interval`).
#[derive(Clone, Copy, Debug)]
struct Timings {
    allocate_wait_s: u64,
    requeue_hold_s: u64,
    sched_interval_s: u64,
    /// Seconds between Slurm's batched passes (`--slurm-like pass=S`).
    pass_s: u64,
}

impl Timings {
    fn of(packaged: bool) -> Timings {
        if packaged {
            Timings {
                allocate_wait_s: 30,
                requeue_hold_s: 121,
                sched_interval_s: 60,
                // tests/slurm/cluster.sh sets batch_sched_delay=0 in both
                // modes: passes at slurmctld's 1 s tick.
                pass_s: PASS_S,
            }
        } else {
            Timings {
                allocate_wait_s: ALLOCATE_WAIT_S,
                requeue_hold_s: CRED_EXPIRE_S + 1,
                sched_interval_s: SCHED_INTERVAL_S,
                pass_s: PASS_S,
            }
        }
    }
}

fn cluster(packaged: bool) -> SlurmCluster {
    std::env::set_var(
        "SMARTMIG_SLURM_JOB_SUBMIT",
        repo_root().join("etc/slurm/job_submit.lua"),
    );
    std::env::set_var("SMARTMIG_SLURM_TYPED_GPUS", "1");
    if packaged {
        std::env::remove_var("SMARTMIG_SLURM_CRED_EXPIRE");
        std::env::remove_var("SMARTMIG_SLURM_SCHED_EXTRA");
    } else {
        std::env::set_var("SMARTMIG_SLURM_CRED_EXPIRE", CRED_EXPIRE_S.to_string());
        std::env::set_var(
            "SMARTMIG_SLURM_SCHED_EXTRA",
            format!("sched_interval={SCHED_INTERVAL_S}"),
        );
    }
    std::env::set_var("SMARTMIG_SLURM_CONF_EXTRA", "MinJobAge=3600");
    SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, ""))
            .expect("write plugstack.conf");
    })
}

/// Every `SRUN_EVERY`-th job of the packaged run (from the 6th) is an
/// interactive `srun` instead of a batch job: a step that cannot be
/// requeued, so a fit it does not get is a failed `srun` (issue 56).
const SRUN_EVERY: usize = 10;

/// An interactive job of the mix that ended: its name and, when `srun`
/// failed, why.
struct SrunResult {
    name: String,
    failure: Option<String>,
}

/// Submits the list at its times (as root), waits for every job to end.
/// With `sruns`, every [`SRUN_EVERY`]-th job runs as `srun` (in the
/// background) and is returned apart.
fn submit_all(
    cluster: &SlurmCluster,
    jobs: &[MixJob],
    sruns: bool,
) -> (Vec<(u32, MixJob)>, Vec<SrunResult>) {
    let start = Instant::now();
    let mut ids = Vec::new();
    let mut interactive = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        let due = Duration::from_secs_f64(j.submit_s);
        if let Some(left) = due.checked_sub(start.elapsed()) {
            // Not synchronisation: the mix's submit times are its input.
            std::thread::sleep(left);
        }
        if sruns && i % SRUN_EVERY == SRUN_EVERY / 2 {
            let child = cluster
                .command("timeout")
                .args(["900", "srun", "-J", &j.name])
                .arg(format!("--gres=shard:{}", j.shards))
                .args(["sleep", &j.run_s.to_string()])
                .current_dir("/tmp")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start srun");
            interactive.push((j.name.clone(), child));
            continue;
        }
        let id = cluster.sbatch(&[
            &format!("--gres=shard:{}", j.shards),
            "-J",
            &j.name,
            "-o",
            "/dev/null",
            "--wrap",
            &format!("sleep {}", j.run_s),
        ]);
        ids.push((id, j.clone()));
    }
    let budget = Duration::from_secs(600 + 30 * jobs.len() as u64);
    let done = smartmig_suite::holds_within(budget, || {
        let out = cluster
            .command("squeue")
            .args(["-h", "-o", "%i"])
            .output()
            .expect("run squeue");
        String::from_utf8_lossy(&out.stdout).trim().is_empty()
    });
    assert!(
        done,
        "jobs still queued after {budget:?}\n{}",
        cluster.log_tails()
    );
    let sruns = interactive
        .into_iter()
        .map(|(name, child)| {
            let out = child.wait_with_output().expect("wait for srun");
            let failure = (!out.status.success()).then(|| {
                format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            });
            SrunResult { name, failure }
        })
        .collect();
    (ids, sruns)
}

/// Reads each job's record (`SLURM_TIME_FORMAT=%s`: times in Unix seconds).
fn outcome(cluster: &SlurmCluster, ids: &[(u32, MixJob)], keep: Option<&Path>) -> Outcome {
    let mut out = Outcome {
        jobs: ids.len(),
        requeues: 0,
        failed: Vec::new(),
        waits: Vec::new(),
    };
    let mut records = Vec::new();
    for (id, j) in ids {
        let o = cluster
            .command("scontrol")
            .env("SLURM_TIME_FORMAT", "%s")
            .args(["show", "job", "-o", &id.to_string()])
            .output()
            .expect("run scontrol");
        let f = fields(&String::from_utf8_lossy(&o.stdout));
        let num = |k: &str| f.get(k).and_then(|v| v.parse::<f64>().ok());
        let state = f.get("JobState").cloned().unwrap_or_default();
        let restarts = num("Restarts").unwrap_or(0.0) as u64;
        out.requeues += restarts;
        if state != "COMPLETED" {
            out.failed.push(format!("{id} ({}): {state}", j.name));
        }
        if let (Some(s), Some(b)) = (num("SubmitTime"), num("StartTime")) {
            out.waits.push((b - s).max(0.0));
        }
        records.push(json!({
            "job": id, "name": j.name, "shards": j.shards, "run_s": j.run_s,
            "state": state, "restarts": restarts,
            "submit": num("SubmitTime"), "start": num("StartTime"), "end": num("EndTime"),
        }));
    }
    if let Some(dir) = keep {
        let text = serde_json::to_string_pretty(&records).expect("json");
        std::fs::write(dir.join("busy-mix-jobs.json"), text).expect("write records");
    }
    out
}

/// smartmigd's policy for the run and the simulator's name for the same
/// policy (`SMARTMIG_BUSY_MIX_POLICY`, module docs).
fn policy_pair() -> (String, String) {
    let learned = repo_root().join("policies/a100-40gb.onnx");
    let learned = format!("policy:{}", learned.display());
    match std::env::var("SMARTMIG_BUSY_MIX_POLICY").as_deref() {
        Err(_) | Ok("none") => ("none".into(), "on-demand".into()),
        Ok("greedy") => ("greedy".into(), "greedy".into()),
        Ok("learned") => (learned.clone(), learned),
        Ok(other) => panic!("SMARTMIG_BUSY_MIX_POLICY={other}: expected none, greedy or learned"),
    }
}

/// `smartmig simulate --slurm-like` on the same list, with the same timings.
fn simulated(csv: &Path, holds: &str, t: Timings, policy: &str, lend: bool) -> Value {
    let spec = format!(
        "holds={holds},allocate-wait={},requeue-hold={},sched-interval={},pass={},lend={}",
        t.allocate_wait_s,
        t.requeue_hold_s,
        t.sched_interval_s,
        t.pass_s,
        if lend { "on" } else { "off" }
    );
    let out = std::process::Command::new(artifact("smartmig"))
        .args(["simulate", "--cluster", "a100-40gb:2", "--policy", policy])
        .args(["--reconfig-time", "0", "--json", "--slurm-like", &spec])
        .arg("--workload")
        .arg(csv)
        .output()
        .expect("run smartmig simulate");
    assert!(
        out.status.success(),
        "smartmig simulate: {}",
        describe(&out)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)))
}

#[test]
fn a_busy_mix_completes_without_requeue_loops() {
    let n: usize = env_or("SMARTMIG_BUSY_MIX_JOBS", 120);
    let seed: u64 = env_or("SMARTMIG_BUSY_MIX_SEED", 42);
    let packaged = std::env::var("SMARTMIG_BUSY_MIX_CONFIG").is_ok_and(|c| c == "packaged");
    let holds = if packaged {
        "adaptive".to_string()
    } else {
        std::env::var("SMARTMIG_BUSY_MIX_HOLDS").unwrap_or_else(|_| "adaptive".into())
    };
    let timings = Timings::of(packaged);
    let (daemon_policy, sim_policy) = policy_pair();
    let lend = std::env::var("SMARTMIG_BUSY_MIX_LEND").map_or(true, |v| v != "off");
    let keep = std::env::var_os("SMARTMIG_BUSY_MIX_OUT").map(std::path::PathBuf::from);
    let jobs = job_list(n, seed);
    let cluster = cluster(packaged);
    let _sidecar = if packaged {
        let text = Sidecar::packaged_config(cluster.dir())
            .replacen(
                "\npolicy = \"none\"\n",
                &format!("\npolicy = \"{daemon_policy}\"\n"),
                1,
            )
            .replacen(
                "\nlend_idle = true\n",
                &format!("\nlend_idle = {lend}\n"),
                1,
            );
        let sidecar = Sidecar::start_text(cluster.dir(), &text, &SidecarBackend::Sim);
        // The default (`auto`) must have chosen adaptive on the typed gres.conf.
        let status = sidecar.status();
        assert_eq!(
            (&status["holds"]["configured"], &status["holds"]["state"]),
            (&json!("auto"), &json!("adaptive")),
            "{:#}",
            status["holds"]
        );
        sidecar
    } else {
        Sidecar::start_configured(
            cluster.dir(),
            &format!(
                "allocate_wait_s = {ALLOCATE_WAIT_S}\npolicy = \"{daemon_policy}\"\nlend_idle = {lend}\n"
            ),
            true,
            &format!("holds = \"{holds}\""),
            &SidecarBackend::Sim,
        )
    };
    let started = Instant::now();
    let (ids, sruns) = submit_all(&cluster, &jobs, packaged);
    let failed_sruns: Vec<String> = sruns
        .iter()
        .filter_map(|r| r.failure.as_ref().map(|f| format!("{}: {f}", r.name)))
        .collect();
    let took = started.elapsed();
    let dir = keep.clone().unwrap_or_else(|| cluster.dir().to_path_buf());
    std::fs::create_dir_all(&dir).expect("create the output directory");
    let csv = dir.join("busy-mix.csv");
    std::fs::write(&csv, job_csv(&jobs)).expect("write the job CSV");
    let real = outcome(&cluster, &ids, keep.as_deref());
    let sim = simulated(&csv, &holds, timings, &sim_policy, lend);
    let run = &sim["run"];
    let summary = json!({
        "jobs": n, "seed": seed, "holds": holds, "policy": daemon_policy, "lend_idle": lend, "wall_s": took.as_secs_f64(),
        "config": if packaged { "packaged" } else { "test" },
        "series": smartmig_suite::slurm_series(),
        "real": {
            "requeues_per_100": real.requeues_per_100(), "failed": real.failed.len(),
            "batch_jobs": real.jobs, "sruns": sruns.len(), "failed_sruns": failed_sruns.len(),
            "mean_wait_s": real.mean_wait(), "p95_wait_s": real.p95_wait(),
        },
        "simulated": {
            "requeues_per_100": 100.0 * run["requeues"].as_f64().unwrap_or(0.0) / n as f64,
            "unserved": run["unserved"], "mean_wait_s": run["mean_wait_s"],
            "p95_wait_s": run["p95_wait_s"],
        },
    });
    eprintln!(
        "busy mix: {n} jobs (seed {seed}, holds {holds}, policy {daemon_policy}, lend_idle {lend}, {} config) in {took:.0?}\n{:>22} {:>10} {:>10}\n{:>22} {:>10.1} {:>10.1}\n{:>22} {:>10} {:>10}\n{:>22} {:>10.1} {:>10.1}\n{:>22} {:>10.1} {:>10.1}",
        if packaged { "packaged" } else { "test" },
        "", "real", "simulated",
        "requeues / 100 jobs", real.requeues_per_100(), summary["simulated"]["requeues_per_100"].as_f64().unwrap_or(f64::NAN),
        "failed / unserved", real.failed.len(), run["unserved"],
        "mean wait (s)", real.mean_wait(), run["mean_wait_s"].as_f64().unwrap_or(f64::NAN),
        "p95 wait (s)", real.p95_wait(), run["p95_wait_s"].as_f64().unwrap_or(f64::NAN),
    );
    if let Some(dir) = &keep {
        std::fs::write(
            dir.join("busy-mix-summary.json"),
            serde_json::to_string_pretty(&summary).expect("json"),
        )
        .expect("write the summary");
        // The logs that say why a job was requeued (smartmigd's `no ...
        // slice can be made`, slurmctld's `Requeuing`).
        for log in ["smartmigd.log", "slurmctld.log"] {
            let from = cluster.dir().join("log").join(log);
            std::fs::copy(&from, dir.join(log))
                .unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
        }
    }
    eprintln!(
        "interactive: {} srun(s), {} failed{}",
        sruns.len(),
        failed_sruns.len(),
        if failed_sruns.is_empty() {
            String::new()
        } else {
            format!(": {failed_sruns:#?}")
        }
    );
    assert!(
        failed_sruns.is_empty(),
        "srun steps that failed: {failed_sruns:#?}\n{}",
        cluster.log_tails()
    );
    assert!(
        real.failed.is_empty(),
        "jobs that did not complete: {:?}\n{}",
        real.failed,
        cluster.log_tails()
    );
    if holds == "any-mix" || holds == "adaptive" {
        assert!(
            real.requeues_per_100() <= MAX_REQUEUES_PER_100,
            "{:.1} requeues per 100 jobs (goal: at most {MAX_REQUEUES_PER_100}): {summary:#}",
            real.requeues_per_100()
        );
    }
}
