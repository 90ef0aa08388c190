//! End-to-end: out-of-memory restarts on a bigger slice and learned memory
//! estimates, through a real Slurm 22.05 (single node, two fake GPUs), the
//! SPANK plugin with `oom_requeue=yes`, and smartmigd (sim backend, two
//! A100-40GB) with Slurm queries enabled, so that it requeues jobs with
//! `scontrol requeue` itself.
//!
//! A job reports an out-of-memory failure the documented way: it writes its
//! `$SMARTMIG_OOM_FILE` and exits non-zero. Jobs run as the ordinary user `JOB_USER`.
//!
//! Needs root and a release build of the workspace (`scripts/test` does
//! both); fails, never skips, when Slurm or smartmigd cannot start.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use smartmig_suite::{artifact, job_user, Sidecar, SlurmCluster, JOB_USER};

/// Time for a job (including its requeues) to get where a test waits for it.
const TIMEOUT: Duration = Duration::from_secs(150);

fn plugstack(dir: &Path) -> String {
    let oom = format!("oom_requeue=yes oom_dir={}", dir.join("run/oom").display());
    smartmig_suite::plugstack_line(dir, &oom)
}

/// Submits a batch job as [`JOB_USER`] appending to `out` (a requeued job's
/// runs share the file).
fn submit(cluster: &SlurmCluster, out: &Path, name: &str, args: &[&str], body: &str) -> u32 {
    let name_arg = format!("--job-name={name}");
    let user = format!("--uid={}", job_user());
    let group = format!("--gid={}", job_user());
    let mut all = vec![
        user.as_str(),
        group.as_str(),
        "--open-mode=append",
        name_arg.as_str(),
        "-o",
        out.to_str().expect("utf-8 path"),
    ];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--wrap", body]);
    cluster.sbatch(&all)
}

/// A job body: prints what the run saw; run numbers in `oom_runs` write the
/// out-of-memory marker and fail; others print DONE. `marker_and_exit0`
/// writes the marker but exits 0 (not an out-of-memory failure).
fn body(oom_runs: &[u32], marker_and_exit0: bool) -> String {
    let cases: Vec<String> = oom_runs
        .iter()
        .map(std::string::ToString::to_string)
        .collect();
    let oom = if cases.is_empty() {
        String::new()
    } else {
        format!(
            "case \"$R\" in {}) echo 'CUDA out of memory (simulated)' > \"$SMARTMIG_OOM_FILE\"; echo FAILING; exit 1;; esac; ",
            cases.join("|")
        )
    };
    let fake = if marker_and_exit0 {
        "echo 'recovered from an OOM by itself' > \"$SMARTMIG_OOM_FILE\"; "
    } else {
        ""
    };
    format!(
        "R=${{SLURM_RESTART_COUNT:-0}}; \
         echo RUN=$R CVD=$CUDA_VISIBLE_DEVICES PROFILE=$SMARTMIG_PROFILE OOMFILE=$SMARTMIG_OOM_FILE; \
         {oom}{fake}echo DONE=$R"
    )
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `RUN=n ... PROFILE=p` lines of a job's output, in order.
fn runs(output: &str) -> Vec<(u32, String)> {
    output
        .lines()
        .filter(|l| l.starts_with("RUN="))
        .filter_map(|l| {
            let mut run = None;
            let mut profile = None;
            for w in l.split_whitespace() {
                if let Some(v) = w.strip_prefix("RUN=") {
                    run = v.parse().ok();
                }
                if let Some(v) = w.strip_prefix("PROFILE=") {
                    profile = Some(v.to_string());
                }
            }
            Some((run?, profile.unwrap_or_default()))
        })
        .collect()
}

/// Waits until `cond` holds on (job output, status), or panics with both
/// and the logs.
fn wait_for(
    cluster: &SlurmCluster,
    sidecar: &Sidecar,
    out: &Path,
    what: &str,
    cond: impl Fn(&str, &Value) -> bool,
) -> (String, Value) {
    smartmig_suite::Wait::new(what, TIMEOUT)
        .every(Duration::from_millis(200))
        .context(|| cluster.log_tails())
        .until(|| {
            let text = read(out);
            let status = sidecar.status();
            if cond(&text, &status) {
                Ok((text, status))
            } else {
                Err(format!(
                    "\n--- output ---\n{text}\n--- status ---\n{status:#}"
                ))
            }
        })
}

/// A job without `--mig-mem` starts on the smallest 1-slice profile
/// (`1g.5gb`), writes the out-of-memory marker and fails; smartmigd requeues
/// it and its second run gets the next larger memory size as the room it
/// takes (`2g.10gb`, its shard request raised to 2: issue 55) and
/// completes. The same job name submitted again with one shard starts on
/// `1g.5gb` (the learned 6 GB is capped within its one billed shard: the
/// `1g.10gb` that holds it blocks two), and a run that writes the marker
/// but exits 0 is not requeued. A job that always runs out of
/// memory is restarted `max_retries` (2) times on ever larger profiles and
/// then stays FAILED. Every decision is in `smartmig status`.
#[test]
fn oom_job_restarts_on_a_larger_profile_and_the_estimate_is_learned() {
    let t0 = Instant::now();
    // Slurm holds a requeued job for cred_expire + 1 s (default 121 s) and
    // then starts it on the next periodic scheduling pass (default every
    // 60 s): shorten both for this cluster (tests/slurm/cluster.sh).
    smartmig_suite::quick_requeues();
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack(dir)).expect("write plugstack");
    });
    let sidecar = Sidecar::start_with_slurm(
        cluster.dir(),
        "epoch_s = 2\n[oom]\nrequeue = true\nmax_retries = 2\n",
    );
    let jobs = cluster.shared_dir();

    // 1. OOM on 1g.5gb, requeued, completes on 2g.10gb (billed shard:2).
    let out1 = jobs.join("oom1.out");
    let job1 = submit(
        &cluster,
        &out1,
        "oomtest",
        &["--gres=shard:1"],
        &body(&[0], false),
    );
    let (text, _) = wait_for(&cluster, &sidecar, &out1, "second run of job 1", |t, _| {
        t.contains("DONE=1")
    });
    let state = cluster.wait_job(job1, TIMEOUT);
    assert_eq!(state, "COMPLETED", "{text}\n{}", cluster.log_tails());
    let r = runs(&text);
    assert_eq!(
        r,
        vec![(0, "1g.5gb".to_string()), (1, "2g.10gb".to_string())],
        "job {job1} output:\n{text}"
    );
    assert!(text.contains("FAILING"), "{text}");
    // Told why (issue 56): the next run's output and the job's record.
    assert!(
        text.contains("smartmig: this job was requeued by smartmig")
            && text.contains("its previous run ran out of GPU memory on its 1g.5gb (GPU 0")
            && text.contains("on a profile with at least 10 GB"),
        "the next run does not say why: {text}"
    );
    let record = cluster
        .command("scontrol")
        .args(["show", "job", &job1.to_string()])
        .output()
        .expect("run scontrol");
    let record = String::from_utf8_lossy(&record.stdout);
    assert!(
        record.contains("smartmig-requeued:at=")
            && record.contains(
                "why=out_of_gpu_memory,on=1g.5gb,gpu=0,next=runs_again_with_at_least_10gb"
            ),
        "AdminComment does not say why: {record}"
    );
    assert!(
        text.contains("OOMFILE=/"),
        "the job saw no SMARTMIG_OOM_FILE: {text}"
    );
    let (_, status) = wait_for(
        &cluster,
        &sidecar,
        &out1,
        "requeue of job 1 recorded",
        |_, s| Sidecar::oom_decisions(s, job1).contains(&"requeued".to_string()),
    );
    assert_eq!(
        Sidecar::oom_decisions(&status, job1),
        vec!["requeue_scheduled", "requeued"],
        "{status:#}"
    );
    let ev = &Sidecar::oom_events(&status, job1)[0];
    assert_eq!(ev["profile"], "1g.5gb", "{status:#}");
    assert_eq!(ev["next_memory_gb"], 10, "{status:#}");
    assert_eq!(ev["job_name"], "oomtest", "{status:#}");
    let est = Sidecar::estimate(&status, JOB_USER, "oomtest")
        .unwrap_or_else(|| panic!("no estimate: {status:#}"));
    assert_eq!(est["estimate_gb"], 6.0, "{status:#}");
    assert_eq!(est["ooms"], 1, "{status:#}");
    // The completed restart left the ledger.
    assert!(
        !status["memory"]["oom_jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|j| j["job_id"] == job1),
        "{status:#}"
    );
    let table = sidecar.status_table();
    assert!(
        table.contains("OOM restarts") && table.contains(&format!("{JOB_USER}/oomtest")),
        "{table}"
    );
    assert!(table.contains("Memory estimates"), "{table}");
    eprintln!("OOM restart done after {:?}", t0.elapsed());

    // 2. Same name again: the learned size, capped within its one billed
    // shard (issue 55); a marker with exit 0 is no out-of-memory failure.
    let out2 = jobs.join("oom2.out");
    let job2 = submit(
        &cluster,
        &out2,
        "oomtest",
        &["--gres=shard:1"],
        &body(&[], true),
    );
    let state = cluster.wait_job(job2, TIMEOUT);
    let text = read(&out2);
    assert_eq!(state, "COMPLETED", "{text}\n{}", cluster.log_tails());
    assert_eq!(
        runs(&text),
        vec![(0, "1g.5gb".to_string())],
        "job {job2} should start within its one shard:\n{text}"
    );
    let status = sidecar.status();
    assert!(
        Sidecar::oom_events(&status, job2).is_empty(),
        "exit 0 is no OOM: {status:#}"
    );
    eprintln!("estimate reuse done after {:?}", t0.elapsed());

    // 3. Always out of memory: 2 restarts on larger profiles, then FAILED.
    let out3 = jobs.join("oom3.out");
    let job3 = submit(
        &cluster,
        &out3,
        "alwaysoom",
        &["--gres=shard:1"],
        &body(&[0, 1, 2, 3], false),
    );
    let (text, status) = wait_for(&cluster, &sidecar, &out3, "job 3 gives up", |_, s| {
        Sidecar::oom_decisions(s, job3).contains(&"retries_exhausted".to_string())
    });
    let state = cluster.wait_job(job3, TIMEOUT);
    assert_eq!(state, "FAILED", "{text}\n{}", cluster.log_tails());
    let text = read(&out3);
    assert_eq!(
        runs(&text),
        vec![
            (0, "1g.5gb".to_string()),
            (1, "2g.10gb".to_string()),
            (2, "3g.20gb".to_string())
        ],
        "job {job3} output:\n{text}"
    );
    let d = Sidecar::oom_decisions(&status, job3);
    assert_eq!(
        d.iter().filter(|x| *x == "requeue_scheduled").count(),
        2,
        "{status:#}"
    );
    assert_eq!(
        d.last().map(String::as_str),
        Some("retries_exhausted"),
        "{status:#}"
    );
    // Its third run needed 3g.20gb, more compute slices than the one shard
    // it asked for: smartmigd raised the request before the restart, so
    // Slurm billed the three slices the instance really took.
    let show = cluster
        .command("scontrol")
        .args(["show", "job", "-o", &job3.to_string()])
        .output()
        .expect("scontrol show job");
    // `gres:shard:3` in 22.05, `gres/shard:3` from 23.11 on.
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.replace("gres/", "gres:")
            .contains("TresPerNode=gres:shard:3"),
        "job {job3} is not billed the 3 slices it used: {show}\n{}",
        read(&cluster.dir().join("log/smartmigd.log"))
    );
    // 4. The loop (every 2 s here) asks the real `squeue --json` which jobs
    // still run and never releases a running job's instance.
    let out4 = jobs.join("held.out");
    let go = jobs.join("go4");
    let job4 = submit(
        &cluster,
        &out4,
        "held",
        &["--gres=shard:2"],
        &format!(
            "echo RUN=0 PROFILE=$SMARTMIG_PROFILE; for i in $(seq 300); do [ -e {} ] && break; sleep 0.1; done",
            go.display()
        ),
    );
    wait_for(&cluster, &sidecar, &out4, "job 4 started", |t, _| {
        t.contains("RUN=0")
    });
    // Instead of waiting for the loop's next turns: ask for the same
    // reaping now (`smartmig reconcile` reads `squeue --json` and releases
    // ended jobs, as each turn of the loop does), and it must keep job 4.
    let rec = std::process::Command::new(artifact("smartmig"))
        .args(["reconcile", "--socket"])
        .arg(sidecar.socket())
        .output()
        .expect("run smartmig reconcile");
    let rec_out = String::from_utf8_lossy(&rec.stdout);
    assert!(
        rec.status.success() && !rec_out.contains(&job4.to_string()),
        "reconcile released job {job4} or failed: {rec_out}{}",
        String::from_utf8_lossy(&rec.stderr)
    );
    let held_by = |status: &Value| {
        Sidecar::instances(status)
            .iter()
            .any(|i| i["job_id"] == job4)
    };
    assert!(
        held_by(&sidecar.status()),
        "a running job lost its instance
{}",
        cluster.log_tails()
    );
    std::fs::write(&go, b"").expect("write go file");
    assert_eq!(cluster.wait_job(job4, TIMEOUT), "COMPLETED");
    let log = read(&cluster.dir().join("log/smartmigd.log"));
    assert!(
        !log.contains("job ended in Slurm but its release never arrived")
            && !log.contains("cannot read the Slurm queue"),
        "{log}"
    );

    // Nothing stays held, the node is fine.
    assert!(
        Sidecar::instances(&sidecar.status())
            .iter()
            .all(|i| i.get("job_id").is_none_or(Value::is_null)),
        "an instance is still held"
    );
    assert!(
        cluster.wait_node_state("idle", Duration::from_secs(20)),
        "node {}",
        cluster.node_state()
    );
    eprintln!("whole test took {:?}", t0.elapsed());
}
