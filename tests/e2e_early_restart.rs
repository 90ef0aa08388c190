//! End-to-end: an early restart through a real Slurm 22.05 (single node),
//! the SPANK plugin and smartmigd on the nvml backend over the NVML
//! emulator (two A100-40GB), with Slurm queries on and
//! `oom.early_restart = true` (docs/oom-and-memory.md, "On a Slurm node").
//!
//! The job's memory use climbs on its `1g.5gb` instance (4.875 GB): the
//! test plays the GPU's part and raises the framebuffer use the emulator
//! reports for the instance (as a CUDA process allocating would), every
//! half second, never past 4.6 GB. smartmigd samples it every second; the
//! early-restart rule (the simulator's `workload::memory_growth`) predicts
//! the instance will be exceeded and requeues the running job, before it
//! ever runs out of memory; its second run gets `2g.10gb` (the room 10 GB
//! takes, its shard request raised to 2: issue 55) and completes.
//!
//! Needs root and a release build of the workspace (`scripts/test` does
//! both); fails, never skips.

use std::path::Path;
use std::time::{Duration, Instant};

mod common;

use smartmig_suite::{fields, plugstack_line, Sidecar, SidecarBackend, SlurmCluster, Wait};

/// Time for the job, its requeue (held cred_expire + 1 s) and its second
/// run to get where the test waits.
const TIMEOUT: Duration = Duration::from_secs(150);
/// The emulated CUDA process's pid.
const PID: u32 = 4242;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `(run, uuid, profile)` of each `RUN=` line of the job's output.
fn runs(output: &str) -> Vec<(String, String, String)> {
    output
        .lines()
        .filter(|l| l.starts_with("RUN="))
        .map(|l| {
            let f = fields(l);
            let get = |k: &str| f.get(k).cloned().unwrap_or_default();
            (get("RUN"), get("CVD"), get("PROFILE"))
        })
        .collect()
}

#[test]
fn a_job_whose_memory_climbs_is_requeued_on_a_bigger_profile_before_it_fails() {
    smartmig_suite::require_root("the test cluster and the emulator's device files need root");
    // Slurm holds a requeued job for cred_expire + 1 s and starts it on the
    // next scheduling pass: shorten both (tests/slurm/cluster.sh).
    smartmig_suite::quick_requeues();
    let cluster = SlurmCluster::up_with(|dir| {
        std::fs::write(dir.join("plugstack.conf"), plugstack_line(dir, "")).expect("plugstack");
    });
    let (emu_dir, emu) = common::two_a100s(cluster.dir());
    let backend = SidecarBackend::NvmlEmulator(emu_dir.clone());
    // As docs/daemon.md tells an admin: early restarts on, samples every
    // second (5 s by default) so the test is short, and a rule that looks
    // further ahead than the default (which fires only within a few
    // percent of the instance's size, too close for a 1 s test ramp).
    let config = "epoch_s = 2\nallocate_wait_s = 20\n[memory]\nsample_s = 1\n\
                  [oom]\nrequeue = true\nmax_retries = 2\nearly_restart = true\n\
                  [oom.early]\nwindow = 3\nhorizon = 0.5\nmin_fill = 0.5\n";
    let sidecar = Sidecar::start_on(cluster.dir(), config, true, &backend);
    let shared = cluster.shared_dir();

    // Run 0 works until it is requeued; run 1 waits for `go` and ends.
    let go = shared.join("go");
    let out = shared.join("grow.out");
    let body = format!(
        "R=${{SLURM_RESTART_COUNT:-0}}; \
         echo RUN=$R CVD=$CUDA_VISIBLE_DEVICES PROFILE=$SMARTMIG_PROFILE; \
         for i in $(seq 1200); do [ -e {go}.$R ] && break; sleep 0.1; done; echo DONE=$R",
        go = go.display()
    );
    let job = cluster.sbatch_as_job_user(
        &out,
        &["--gres=shard:1", "--job-name=grow", "--open-mode=append"],
        &body,
    );

    let first = Wait::new(format!("job {job} to start"), TIMEOUT)
        .context(|| cluster.log_tails())
        .until(|| {
            let text = read(&out);
            runs(&text).into_iter().next().ok_or(text)
        });
    assert_eq!(first.2, "1g.5gb", "{first:?}");
    let uuid = first.1.clone();

    // The climb: 1 GB, then +0.25 GB/s, capped at 4.6 GB (the instance has
    // 4.875 GB), until smartmigd decides.
    let t0 = Instant::now();
    let mut highest = 0.0f64;
    let scheduled = loop {
        let gb = (1.0 + 0.25 * t0.elapsed().as_secs_f64()).min(4.6);
        emu.add_process(&uuid, PID, (gb * 1e9) as u64)
            .unwrap_or_else(|e| panic!("set the use of {uuid}: {e}"));
        highest = highest.max(gb);
        let status = sidecar.status();
        if Sidecar::oom_decisions(&status, job).contains(&"requeue_scheduled".to_string()) {
            break status;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no early restart after a climb to {highest:.2} GB:\n{status:#}\n{}",
            cluster.smartmigd_log()
        );
        // Not synchronisation: the climb's input, a new use every 0.5 s
        // (it drives the emulator while it waits for the decision).
        std::thread::sleep(Duration::from_millis(500));
    };
    // The process dies with the requeued run.
    let _ = emu.remove_process(&uuid, PID);
    let ev = Sidecar::oom_events(&scheduled, job)
        .into_iter()
        .next()
        .expect("the early-restart event");
    assert_eq!(ev["cause"], "early_restart", "{ev:#}");
    assert_eq!(ev["profile"], "1g.5gb", "{ev:#}");
    assert_eq!(ev["next_memory_gb"], 10, "{ev:#}");
    let used = ev["used_gb"].as_f64().expect("used_gb");
    let predicted = ev["predicted_gb"].as_f64().expect("predicted_gb");
    assert!(
        used < 4.875 && predicted > 4.875,
        "decided before the instance was full: used {used}, predicted {predicted}: {ev:#}"
    );

    // Run 1: on the next larger memory size. Its use peaks at 6 GB (the
    // restart was right), then it completes.
    let second = Wait::new(format!("job {job} to be restarted"), TIMEOUT)
        .every(Duration::from_millis(200))
        .context(|| format!("{:#}\n{}", sidecar.status(), cluster.log_tails()))
        .until(|| {
            let text = read(&out);
            runs(&text).into_iter().nth(1).ok_or(text)
        });
    assert_eq!(second.0, "1", "{}", read(&out));
    assert_eq!(second.2, "2g.10gb", "{}", read(&out));
    emu.add_process(&second.1, PID, 6_000_000_000)
        .expect("use on the new instance");
    // Two samples of it (smartmigd reads an instance's memory use with
    // nvmlDeviceGetMemoryInfo*, only to sample it while the job runs),
    // then the job ends.
    let reads = || {
        let calls = emu.calls().expect("emulator call counts");
        ["nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"]
            .iter()
            .filter_map(|c| calls.get(*c))
            .sum::<u64>()
    };
    let before = reads();
    let sampled = smartmig_suite::holds_within(TIMEOUT, || reads() >= before + 2);
    assert!(
        sampled,
        "smartmigd did not sample the restarted job's memory twice within {TIMEOUT:?}\n{}",
        cluster.smartmigd_log()
    );
    let _ = emu.remove_process(&second.1, PID);
    std::fs::write(shared.join("go.1"), b"").expect("write go file");
    cluster.assert_completed(job, TIMEOUT);
    let text = read(&out);
    assert!(!text.contains("DONE=0"), "run 0 was not stopped: {text}");
    assert!(text.contains("DONE=1"), "{text}");

    // Status: the decision and its outcome, the counts, and what was
    // learned: the completed run only (the killed one teaches nothing).
    let mut status = sidecar.status();
    let done = smartmig_suite::holds_within(Duration::from_secs(20), || {
        status = sidecar.status();
        Sidecar::oom_decisions(&status, job).contains(&"requeued".to_string())
            && !status["memory"]["oom_jobs"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|j| j["job_id"] == job)
    });
    assert!(done, "{status:#}");
    assert_eq!(
        Sidecar::oom_decisions(&status, job),
        vec!["requeue_scheduled", "requeued"],
        "{status:#}"
    );
    let early = &status["memory"]["early_restart"];
    assert_eq!(early["restarts"], 1, "{status:#}");
    assert_eq!(early["false_restarts"], 0, "{status:#}");
    let est = Sidecar::estimate(&status, smartmig_suite::JOB_USER, "grow")
        .unwrap_or_else(|| panic!("nothing learned: {status:#}"));
    assert_eq!(est["runs"], 1, "{status:#}");
    assert_eq!(est["ooms"], 0, "{status:#}");
    assert_eq!(est["max_peak_gb"], 6.0, "{status:#}");

    let table = sidecar.status_table();
    assert!(
        table.contains("early restart on") && table.contains("1 restart(s), 0 false"),
        "{table}"
    );
    assert!(table.contains("early restart: "), "{table}");
}
