//! End-to-end: `sbatch --gres=shard:K` jobs land on MIG instances chosen by
//! smartmigd, through a real Slurm 22.05 (single node, two fake GPUs of 7
//! shards each), the SPANK plugin (`required` in plugstack.conf) and the
//! daemon with its sim backend (two A100-40GB).
//!
//! Jobs run as an ordinary user (`JOB_USER`), so the plugin is exercised the way it runs on a
//! real cluster (slurmstepd as root, tasks as the user). Every assertion is
//! on real job output, job states, the node state and `smartmig status`.
//!
//! Needs root and a release build of the workspace (`scripts/test` does
//! both); fails, never skips, when Slurm or smartmigd cannot start.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use smartmig_suite::{fields, plugin, Sidecar, SlurmCluster, Wait};

/// Slurm's job timeout for a job to finish once released.
const JOB_TIMEOUT: Duration = Duration::from_secs(90);

use smartmig_suite::plugstack_line as plugstack;

/// A cluster whose plugstack.conf lists the plugin before slurmd starts
/// (slurmd only runs SPANK epilogs of plugins it saw at start), and a
/// sidecar on it.
fn cluster_with_sidecar(sidecar_toml: &str) -> (SlurmCluster, Sidecar) {
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack(dir, "")).expect("write plugstack");
    });
    let sidecar = Sidecar::start(cluster.dir(), sidecar_toml);
    (cluster, sidecar)
}

/// A job body that records what the job saw, then waits until the test
/// creates `GO/go.$SLURM_JOB_ID` or `GO/go.all` (at most ~60 s), so the test
/// can look at the sidecar while the job holds its instance.
fn held_job(go: &Path, extra: &str) -> String {
    format!(
        "echo CVD=$CUDA_VISIBLE_DEVICES PROFILE=$SMARTMIG_PROFILE SH=$SLURM_SHARDS_ON_NODE \
         START=$(date +%s.%N); {extra} \
         for i in $(seq 600); do [ -e {g}/go.$SLURM_JOB_ID ] || [ -e {g}/go.all ] && break; sleep 0.1; done; \
         echo END=$(date +%s.%N)",
        g = go.display()
    )
}

/// Submits a job as the ordinary job user writing to `out`.
fn submit(cluster: &SlurmCluster, out: &Path, args: &[&str], body: &str) -> u32 {
    cluster.sbatch_as_job_user(out, args, body)
}

/// `KEY=value` words of a job's output.
/// Submits a job whose output goes to `name` in the shared directory and
/// waits for its end: (job id, final state, output).
fn run_to_end(
    cluster: &SlurmCluster,
    name: &str,
    args: &[&str],
    body: &str,
) -> (u32, String, String) {
    let out = cluster.shared_dir().join(name);
    let job = submit(cluster, &out, args, body);
    let state = cluster.wait_job(job, JOB_TIMEOUT);
    (job, state, read(&out))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits until every job is RUNNING (or panics with the logs).
fn wait_running(cluster: &SlurmCluster, jobs: &[u32], timeout: Duration) {
    Wait::new(format!("jobs {jobs:?} all running"), timeout)
        .context(|| cluster.log_tails())
        .until(|| {
            let states: Vec<Option<String>> = jobs.iter().map(|&j| cluster.job_state(j)).collect();
            if states.iter().all(|s| s.as_deref() == Some("RUNNING")) {
                Ok(())
            } else {
                Err(states)
            }
        });
}

/// Waits until a job's output file has a line starting with `prefix`.
fn wait_output(cluster: &SlurmCluster, out: &Path, prefix: &str) -> String {
    Wait::new(
        format!("a line starting with {prefix:?} in {}", out.display()),
        JOB_TIMEOUT,
    )
    .every(Duration::from_millis(50))
    .context(|| cluster.log_tails())
    .until(|| {
        let text = read(out);
        if text.lines().any(|l| l.starts_with(prefix)) {
            Ok(text)
        } else {
            Err(text)
        }
    })
}

/// Instances of a status reply that a job holds.
fn busy(status: &Value) -> Vec<Value> {
    Sidecar::instances(status)
        .into_iter()
        .filter(|i| i.get("job_id").is_some_and(|j| !j.is_null()))
        .collect()
}

fn go(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), b"").expect("write go file");
}

/// Scenarios 1 and 6: a 3-shard job with `--mig-mem=15G` gets a `3g.20gb`
/// instance on an A100-40GB; `CUDA_VISIBLE_DEVICES` is exactly the instance
/// the sidecar reports for the job; an `srun` step inside the job gets the
/// same instance (re-allocation is idempotent); after the job, status shows
/// the instance free.
#[test]
fn shard_job_runs_on_the_instance_the_sidecar_reports() {
    let (cluster, sidecar) = cluster_with_sidecar("");
    let jobs = cluster.shared_dir();
    let out = jobs.join("one.out");
    let body = held_job(
        &jobs,
        "srun bash -c 'echo STEP_CVD=$CUDA_VISIBLE_DEVICES STEP_PROFILE=$SMARTMIG_PROFILE';",
    );
    let job = submit(&cluster, &out, &["--gres=shard:3", "--mig-mem=15G"], &body);
    let text = wait_output(&cluster, &out, "STEP_CVD=");
    let f = fields(&text);
    let cvd = f.get("CVD").cloned().unwrap_or_default();
    assert!(
        cvd.starts_with("MIG-"),
        "job {job} saw CVD={cvd:?}: {text:?}"
    );
    assert_eq!(
        f.get("PROFILE").map(String::as_str),
        Some("3g.20gb"),
        "{text:?}"
    );
    assert_eq!(
        f.get("STEP_CVD"),
        Some(&cvd),
        "srun step got another instance: {text:?}"
    );
    assert_eq!(f.get("STEP_PROFILE").map(String::as_str), Some("3g.20gb"));

    let status = sidecar.status();
    let held = busy(&status);
    assert_eq!(held.len(), 1, "one busy instance expected: {status:#}");
    assert_eq!(held[0]["uuid"], Value::from(cvd.clone()), "{status:#}");
    assert_eq!(held[0]["job_id"], Value::from(job), "{status:#}");
    assert_eq!(held[0]["profile"], "3g.20gb", "{status:#}");
    let uid = smartmig_suite::ensure_user(smartmig_suite::JOB_USER);
    assert_eq!(held[0]["uid"], Value::from(uid), "{status:#}");

    go(&jobs, "go.all");
    let state = cluster.wait_job(job, JOB_TIMEOUT);
    assert_eq!(
        state,
        "COMPLETED",
        "{}\n{}",
        read(&out),
        cluster.log_tails()
    );
    // The epilog released it before Slurm marked the job COMPLETED.
    let after = sidecar.status();
    assert!(
        busy(&after).is_empty(),
        "instance still held after the job: {after:#}"
    );
    assert!(
        Sidecar::instances(&after)
            .iter()
            .any(|i| i["uuid"].as_str() == Some(cvd.as_str())),
        "released instance should stay as an idle instance: {after:#}"
    );
    assert!(
        cluster.wait_node_state("idle", Duration::from_secs(20)),
        "node not idle after the jobs: {}",
        cluster.node_state()
    );
}

/// Scenarios 2 and 6: ten concurrent jobs of mixed sizes all complete, no
/// two jobs ever hold the same instance at the same time, every job's
/// profile has exactly its shard count of compute slices, and afterwards
/// no instance is held.
#[test]
fn concurrent_mixed_jobs_never_share_an_instance() {
    let (cluster, sidecar) = cluster_with_sidecar("allocate_wait_s = 30");
    let jobs_dir = cluster.shared_dir();
    let sizes: [u8; 10] = [1, 2, 3, 1, 2, 4, 1, 3, 2, 1];
    let mut jobs = Vec::new();
    for (i, k) in sizes.iter().enumerate() {
        let out = jobs_dir.join(format!("mix{i}.out"));
        let body =
            "echo CVD=$CUDA_VISIBLE_DEVICES PROFILE=$SMARTMIG_PROFILE START=$(date +%s.%N); \
                    sleep 1; echo END=$(date +%s.%N)";
        let gres = format!("--gres=shard:{k}");
        let job = submit(&cluster, &out, &[&gres], body);
        jobs.push((job, *k, out));
    }
    let mut seen: Vec<(String, f64, f64, u32)> = Vec::new();
    let mut max_busy = 0;
    let start = Instant::now();
    // Sample the sidecar while the jobs run: a job id never appears twice,
    // an instance never has two owners.
    while jobs.iter().any(|(j, _, _)| {
        cluster
            .job_state(*j)
            .is_some_and(|s| s == "PENDING" || s == "RUNNING" || s == "COMPLETING")
    }) {
        let status = sidecar.status();
        let held = busy(&status);
        max_busy = max_busy.max(held.len());
        let mut owners: Vec<u64> = held.iter().filter_map(|i| i["job_id"].as_u64()).collect();
        owners.sort_unstable();
        let n = owners.len();
        owners.dedup();
        assert_eq!(n, owners.len(), "a job holds two instances: {status:#}");
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "jobs did not finish in 120 s"
        );
        // Not synchronisation: the sampling period of a check that runs
        // while the jobs do.
        std::thread::sleep(Duration::from_millis(200));
    }
    for (job, k, out) in &jobs {
        let state = cluster.wait_job(*job, JOB_TIMEOUT);
        let text = read(out);
        assert_eq!(
            state,
            "COMPLETED",
            "job {job} (shard:{k}): {text:?}\n{}",
            cluster.log_tails()
        );
        let f = fields(&text);
        let cvd = f.get("CVD").cloned().unwrap_or_default();
        assert!(cvd.starts_with("MIG-"), "job {job}: {text:?}");
        let profile = f.get("PROFILE").cloned().unwrap_or_default();
        assert!(
            profile.starts_with(&format!("{k}g.")),
            "job {job} asked {k} shards, got {profile}"
        );
        let t = |key: &str| -> f64 {
            f.get(key)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("job {job}: no {key} in {text:?}"))
        };
        seen.push((cvd, t("START"), t("END"), *job));
    }
    for (i, a) in seen.iter().enumerate() {
        for b in &seen[i + 1..] {
            let overlap = a.1 < b.2 && b.1 < a.2;
            assert!(
                !(a.0 == b.0 && overlap),
                "jobs {} and {} used instance {} at the same time",
                a.3,
                b.3,
                a.0
            );
        }
    }
    let after = sidecar.status();
    assert!(busy(&after).is_empty(), "instances still held: {after:#}");
    assert!(
        max_busy >= 2,
        "jobs never overlapped (max {max_busy} busy): test is too weak"
    );
    eprintln!(
        "10 mixed jobs done in {:?}; at most {max_busy} instances held at once",
        start.elapsed()
    );
    assert!(
        cluster.wait_node_state("idle", Duration::from_secs(20)),
        "node not idle after the jobs: {}",
        cluster.node_state()
    );
}

/// Scenario 3: both GPUs are first cut into seven idle 1g instances (14
/// one-shard jobs held at once, then released); a 7-shard job then needs
/// the idle instances of one GPU re-shaped into a 7g.40gb, and gets it.
#[test]
fn job_that_needs_a_reshape_of_idle_instances_gets_it() {
    let (cluster, sidecar) = cluster_with_sidecar("allocate_wait_s = 20");
    let jobs_dir = cluster.shared_dir();
    let mut small = Vec::new();
    for i in 0..14 {
        let out = jobs_dir.join(format!("small{i}.out"));
        let job = submit(
            &cluster,
            &out,
            &["--gres=shard:1"],
            &held_job(&jobs_dir, ""),
        );
        small.push((job, out));
    }
    let ids: Vec<u32> = small.iter().map(|(j, _)| *j).collect();
    wait_running(&cluster, &ids, Duration::from_secs(60));
    for (_, out) in &small {
        wait_output(&cluster, out, "CVD=");
    }
    let full = sidecar.status();
    assert_eq!(busy(&full).len(), 14, "{full:#}");
    go(&jobs_dir, "go.all");
    for (job, out) in &small {
        let state = cluster.wait_job(*job, JOB_TIMEOUT);
        assert_eq!(state, "COMPLETED", "job {job}: {}", read(out));
    }
    std::fs::remove_file(jobs_dir.join("go.all")).expect("remove go.all");
    let idle = sidecar.status();
    let instances = Sidecar::instances(&idle);
    assert!(busy(&idle).is_empty(), "{idle:#}");
    assert_eq!(
        instances.len(),
        14,
        "expected 14 idle 1g instances: {idle:#}"
    );

    let out = jobs_dir.join("big.out");
    let job = submit(
        &cluster,
        &out,
        &["--gres=shard:7"],
        &held_job(&jobs_dir, ""),
    );
    let text = wait_output(&cluster, &out, "CVD=");
    let f = fields(&text);
    assert_eq!(
        f.get("PROFILE").map(String::as_str),
        Some("7g.40gb"),
        "{text:?}"
    );
    let status = sidecar.status();
    let held = busy(&status);
    assert_eq!(held.len(), 1, "{status:#}");
    assert_eq!(held[0]["uuid"], Value::from(f["CVD"].clone()));
    go(&jobs_dir, &format!("go.{job}"));
    assert_eq!(
        cluster.wait_job(job, JOB_TIMEOUT),
        "COMPLETED",
        "{}",
        read(&out)
    );
    let slurmd_log = read(&cluster.dir().join("log/slurmd.log"));
    assert!(
        slurmd_log
            .lines()
            .any(|l| l.contains(&format!("smartmig: job {job} ")) && l.contains("Reshaped")),
        "slurmd.log does not show a re-shape for job {job}\n{}",
        cluster.log_tails()
    );
    assert!(busy(&sidecar.status()).is_empty());
}

/// Scenario 4 (and the plugstack/`on_failure` contract): with the sidecar
/// stopped and `drain_on_unreachable=no requeue=no` a shard job fails with
/// the reason in its output and the node stays idle (the default, drain and
/// requeue, is tested in `e2e_agreement.rs`); a job without shards still
/// runs; a bad plugstack argument
/// fails shard jobs (not the node); `on_failure=whole-gpu` runs the job on
/// the GPU Slurm chose with a warning.
#[test]
fn sidecar_down_fails_the_job_not_the_node() {
    let (cluster, mut sidecar) = cluster_with_sidecar("");
    sidecar.stop();
    let echo = "echo CVD=$CUDA_VISIBLE_DEVICES PROFILE=$SMARTMIG_PROFILE";
    let plug = cluster.dir().join("plugstack.conf");
    let no_drain = "sidecar_wait=0 drain_on_unreachable=no requeue=no";
    std::fs::write(&plug, plugstack(cluster.dir(), no_drain)).expect("write plugstack");

    let (job, state, text) = run_to_end(&cluster, "down.out", &["--gres=shard:2"], echo);
    assert_eq!(state, "FAILED", "{text:?}");
    assert!(
        text.contains(&format!("smartmig: error: job {job}: no MIG instance"))
            && text.contains("is smartmigd running?"),
        "reason missing from the job output: {text:?}"
    );
    assert!(
        !text.contains("CVD="),
        "the job body must not run: {text:?}"
    );
    assert!(
        cluster.wait_node_state("idle", Duration::from_secs(20)),
        "node not idle after a failed job: {}\n{}",
        cluster.node_state(),
        cluster.log_tails()
    );

    let (_, state, text) = run_to_end(&cluster, "cpu.out", &[], echo);
    assert_eq!(state, "COMPLETED", "{text}");
    assert_eq!(text.trim(), "CVD= PROFILE=");

    // plugstack.conf is re-read by slurmstepd for every job.
    std::fs::write(&plug, plugstack(cluster.dir(), "sokcet=/nowhere")).expect("write plugstack");
    let (_, state, text) = run_to_end(&cluster, "badarg.out", &["--gres=shard:1"], echo);
    assert_eq!(state, "FAILED", "{text}");
    assert!(
        text.contains("unknown plugstack.conf argument `sokcet=/nowhere`"),
        "{text:?}"
    );
    assert!(cluster.wait_node_state("idle", Duration::from_secs(20)));
    assert!(
        read(&cluster.dir().join("log/slurmd.log")).contains("unknown plugstack.conf argument"),
        "slurmstepd did not log the bad argument"
    );

    let whole = format!("on_failure=whole-gpu {no_drain}");
    std::fs::write(&plug, plugstack(cluster.dir(), &whole)).expect("write");
    let (_, state, text) = run_to_end(&cluster, "whole.out", &["--gres=shard:2"], echo);
    assert_eq!(state, "COMPLETED", "{text}");
    assert!(text.contains("smartmig: warning:"), "{text:?}");
    let f = fields(&text);
    assert!(
        matches!(f.get("CVD").map(String::as_str), Some("0" | "1")),
        "whole-gpu keeps Slurm's GPU index: {text:?}"
    );
    assert!(cluster.wait_node_state("idle", Duration::from_secs(20)));
}

/// Scenario 5: bad `--mig-mem`/`--mig-profile` values are refused by sbatch
/// with a clear message; jobs without shards run untouched and cause no
/// socket call at all (the plugin points at a listening socket that would
/// see any connection).
#[test]
fn bad_options_are_refused_at_submit_and_cpu_jobs_are_untouched() {
    let spy_path: std::cell::RefCell<Option<PathBuf>> = std::cell::RefCell::new(None);
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::create_dir_all(dir.join("run")).expect("mkdir run");
        let spy = dir.join("run/spy.sock");
        std::fs::write(
            dir.join("plugstack.conf"),
            format!(
                "required {} socket={} timeout=5\n",
                plugin().display(),
                spy.display()
            ),
        )
        .expect("write plugstack");
        *spy_path.borrow_mut() = Some(spy);
    });
    let spy = spy_path.borrow().clone().expect("spy path");
    let listener = std::os::unix::net::UnixListener::bind(&spy).expect("bind spy socket");
    listener.set_nonblocking(true).expect("nonblocking");

    for (args, needle) in [
        (vec!["--mig-mem=lots"], "--mig-mem=lots: not a size"),
        (vec!["--mig-mem=15Q"], "unknown unit"),
        (vec!["--mig-mem=0"], "more than 0"),
        (vec!["--mig-profile=banana"], "--mig-profile=banana"),
        (
            vec!["--mig-profile=5g.30gb"],
            "no MIG-capable GPU model has this profile",
        ),
        (
            vec!["--mig-profile=3g.20gb+me"],
            "--mig-profile=3g.20gb+me is a `+me` variant",
        ),
        (
            vec!["--mig-profile=3g.20gb", "--mig-mem=10G"],
            "use either --mig-mem or --mig-profile",
        ),
    ] {
        let mut all = args.clone();
        all.extend_from_slice(&["--gres=shard:3", "--wrap", "true"]);
        let err = cluster.sbatch_refused(&all);
        assert!(
            err.contains(needle),
            "sbatch {all:?}: stderr lacks {needle:?}:\n{err}"
        );
    }

    let jobs_dir = cluster.shared_dir();
    let mut jobs = Vec::new();
    for i in 0..3 {
        let out = jobs_dir.join(format!("cpu{i}.out"));
        let body = "echo CVD=$CUDA_VISIBLE_DEVICES PROFILE=$SMARTMIG_PROFILE; srun true";
        jobs.push((submit(&cluster, &out, &[], body), out));
    }
    for (job, out) in &jobs {
        assert_eq!(
            cluster.wait_job(*job, JOB_TIMEOUT),
            "COMPLETED",
            "{}",
            read(out)
        );
        assert_eq!(read(out).trim(), "CVD= PROFILE=");
    }
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok(_) => panic!("a job without shards connected to the sidecar socket"),
        Err(e) => panic!("spy socket: {e}"),
    }
    assert!(
        cluster.wait_node_state("idle", Duration::from_secs(20)),
        "node not idle after the jobs: {}",
        cluster.node_state()
    );
}

/// `--mig-profile`: a profile of the node's GPU model that agrees with the
/// shard count (its `Ng`, or a memory variant's room: 1g.10gb at shard:2)
/// is what the job gets; one that the model lacks, or billed other shards
/// than it blocks, fails the job with the reason (the model is only known
/// on the node, so sbatch accepted them).
#[test]
fn mig_profile_is_checked_on_the_node() {
    let (cluster, sidecar) = cluster_with_sidecar("");
    let echo = "echo CVD=$CUDA_VISIBLE_DEVICES PROFILE=$SMARTMIG_PROFILE";

    // 1g.10gb blocks a 2g.10gb's shards (issue 55): at shard:1 (no
    // job_submit.lua here to bill it shard:2) it is refused.
    let args = ["--gres=shard:1", "--mig-profile=1g.10gb"];
    let (_, state, text) = run_to_end(&cluster, "profile-short.out", &args, echo);
    assert_eq!(state, "FAILED", "{text}");
    assert!(
        text.contains(
            "--mig-profile=1g.10gb has 1 compute slices but the job asked for --gres=shard:1; \
             use --gres=shard:2 (1g.10gb's memory takes the room of a 2g.10gb"
        ),
        "{text}"
    );
    let args = ["--gres=shard:3", "--mig-profile=2g.10gb"];
    let (_, state, text) = run_to_end(&cluster, "profile-ok.out", &args, echo);
    assert_eq!(state, "FAILED", "{text}");
    assert!(
        text.contains(
            "--mig-profile=2g.10gb has 2 compute slices but the job asked for --gres=shard:3; \
             use --gres=shard:2"
        ),
        "{text}"
    );

    let args = ["--gres=shard:3", "--mig-profile=3g.40gb"];
    let (_, state, text) = run_to_end(&cluster, "profile-model.out", &args, echo);
    assert_eq!(state, "FAILED", "{text}");
    assert!(text.contains("a100-40gb"), "{text}");

    let args = ["--gres=shard:2", "--mig-profile=1g.10gb"];
    let (_, state, text) = run_to_end(&cluster, "profile-1g10.out", &args, echo);
    assert_eq!(state, "COMPLETED", "{text}");
    let f = fields(&text);
    assert_eq!(f.get("PROFILE").map(String::as_str), Some("1g.10gb"));
    assert!(f.get("CVD").is_some_and(|c| c.starts_with("MIG-")));
    assert!(busy(&sidecar.status()).is_empty());
    assert!(
        cluster.wait_node_state("idle", Duration::from_secs(20)),
        "node not idle after the jobs: {}",
        cluster.node_state()
    );
}
