//! What admins see beside DCGM (issue 44), through a real smartmigd on
//! its Unix socket (sim backend, or the NVML emulator with
//! `SMARTMIG_TEST_BACKEND=nvml`): dcgm-exporter's HPC job-mapping files
//! appear with jobs and go with them.

use crate::daemon_common;

use std::collections::BTreeMap;
use std::path::Path;

use crate::daemon_common::{req, unix_now, with_fake_slurm, TestDaemon};

/// The mapping directory's files (dot-files, the exporter skips them,
/// left out): name -> content.
fn mapping(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .map(|n| {
            let text = std::fs::read_to_string(dir.join(&n)).unwrap();
            (n, text)
        })
        .collect()
}

/// A daemon keeping the job-mapping files in `<its dir>/dcgm-jobs`.
fn with_job_mapping(name: &str) -> TestDaemon {
    TestDaemon::start_with(name, |dir| {
        let map = dir.join("dcgm-jobs");
        daemon_common::base_config(
            dir,
            &format!("hpc_job_mapping_dir = \"{}\"\n", map.display()),
        )
    })
}

/// The GPU-instance file of `gpu` (`<gpu>.<GI id>`) among `files`.
fn instance_file(files: &BTreeMap<String, String>, gpu: u32) -> (String, String) {
    let prefix = format!("{gpu}.");
    let (name, text) = files
        .iter()
        .find(|(n, _)| n.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {prefix}<GI> file in {files:?}"));
    let gi = &name[prefix.len()..];
    assert!(gi.parse::<u32>().is_ok(), "{name}: not <gpu>.<GI id>");
    (name.clone(), text.clone())
}

#[test]
fn job_mapping_files_follow_allocate_and_release() {
    let d = with_job_mapping("jobmap");
    let map = d.dir.join("dcgm-jobs");
    assert!(mapping(&map).is_empty(), "no jobs, no files");
    let c = d.client();
    c.allocate(req(4101, 0, 3, None)).unwrap();
    c.allocate(req(4102, 0, 1, None)).unwrap();
    c.allocate(req(4103, 1, 2, None)).unwrap();
    let files = mapping(&map);
    assert_eq!(
        files.len(),
        5,
        "GPU files 0 and 1, three instance files: {files:?}"
    );
    assert_eq!(files["0"], "4101\n4102\n");
    assert_eq!(files["1"], "4103\n");
    assert_eq!(instance_file(&files, 1).1, "4103\n");
    let on0: Vec<&String> = files.keys().filter(|n| n.starts_with("0.")).collect();
    assert_eq!(on0.len(), 2, "{files:?}");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(map.join("0")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o644, "the exporter may not run as root");

    c.release(4101).unwrap();
    let files = mapping(&map);
    assert_eq!(files["0"], "4102\n");
    assert_eq!(instance_file(&files, 0).1, "4102\n");
    assert_eq!(
        files.len(),
        4,
        "GPU files 0 and 1, two instance files: {files:?}"
    );
    c.release(4102).unwrap();
    c.release(4103).unwrap();
    assert!(mapping(&map).is_empty(), "{:?}", mapping(&map));
}

/// A restarted daemon rewrites the directory from its books: a file left
/// by hand (or by a crash) for a job that no longer holds anything goes,
/// the running job's file comes back.
#[test]
fn job_mapping_is_rebuilt_at_start() {
    let mut d = with_job_mapping("jobmap-restart");
    let map = d.dir.join("dcgm-jobs");
    d.client().allocate(req(4201, 1, 1, None)).unwrap();
    let (name, _) = instance_file(&mapping(&map), 1);
    d.kill9();
    std::fs::remove_file(map.join(&name)).unwrap();
    std::fs::write(map.join("0.13"), "999\n").unwrap();
    std::fs::write(map.join("notes.txt"), "the admin's\n").unwrap();
    d.spawn();
    let files = mapping(&map);
    assert_eq!(
        files.get(&name).map(String::as_str),
        Some("4201\n"),
        "{files:?}"
    );
    assert!(!files.contains_key("0.13"), "{files:?}");
    assert_eq!(
        files["notes.txt"], "the admin's\n",
        "other files are left alone"
    );
}

/// The reaper (here `smartmig reconcile`'s request) releases a job Slurm
/// no longer lists: its files go too.
#[test]
fn job_mapping_follows_reconcile() {
    let queue = r#"{"jobs":[{"job_id":4301,"job_state":"RUNNING","time_limit":60}]}"#;
    // The daemon's own directory is named only once it starts (one per
    // start), so the mapping directory lives beside it.
    let map = std::env::temp_dir().join(format!(
        "smartmig-it-jobmap-reconcile-dcgm-jobs-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&map);
    let d = with_fake_slurm(
        "jobmap-reconcile",
        &format!(
            "epoch_s = 3600\nhpc_job_mapping_dir = \"{}\"\n",
            map.display()
        ),
        queue,
    );
    let c = d.client();
    c.allocate(req(4301, 0, 1, None)).unwrap();
    c.allocate(req(4302, 0, 1, None)).unwrap();
    assert_eq!(mapping(&map)["0"], "4301\n4302\n");
    // Assignments made in the second the queue is read are never reaped.
    let t = unix_now();
    d.wait_until("the second after the allocations", || unix_now() > t);
    assert_eq!(c.reconcile().unwrap().released_jobs, [4302]);
    let files = mapping(&map);
    assert_eq!(files["0"], "4301\n");
    assert_eq!(instance_file(&files, 0).1, "4301\n");
    assert_eq!(files.len(), 2, "{files:?}");
    drop(d);
    let _ = std::fs::remove_dir_all(&map);
}

/// The value of the series `line_start` (name and labels as printed) in
/// a scrape, if present.
fn value(scrape: &str, line_start: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
}

/// The series that join DCGM's, scraped from a real smartmigd: one per
/// instance with DCGM's labels and the job, slices by state, an allocate
/// waiting by profile and the fragmentation it sees, the reconfiguration
/// histogram and the policy running.
#[test]
fn metrics_join_dcgm_and_show_waiting_and_fragmentation() {
    let port = daemon_common::free_port();
    let d = TestDaemon::start_with("observe-metrics", |dir| {
        daemon_common::base_config(dir, &format!("metrics_listen = \"127.0.0.1:{port}\"\n"))
            .replace("allocate_wait_s = 1\n", "allocate_wait_s = 60\n")
    });
    let c = d.client();
    c.allocate(req(4401, 0, 1, None)).unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let host = host.trim();
    let text = daemon_common::scrape(port);
    let busy = text
        .lines()
        .find(|l| l.starts_with("smartmig_mig_instance_busy{") && l.contains("hpc_job=\"4401\""))
        .unwrap_or_else(|| panic!("no busy instance series for job 4401:\n{text}"));
    for label in [
        "gpu=\"0\"".to_string(),
        "GPU_I_PROFILE=\"1g.5gb\"".into(),
        format!("Hostname=\"{host}\""),
    ] {
        assert!(busy.contains(&label), "{label} missing in {busy}");
    }
    assert!(
        busy.contains("GPU_I_ID=\"") && !busy.contains("GPU_I_ID=\"\""),
        "{busy}"
    );
    assert!(busy.ends_with(" 1"), "{busy}");
    let slices = "smartmig_compute_slices{gpu=\"0\",profile=\"1g.5gb\",state=\"busy\"}";
    assert_eq!(value(&text, slices), Some(1.0), "{text}");
    let created = "smartmig_reconfiguration_duration_seconds_count{op=\"create\"}";
    assert_eq!(value(&text, created), Some(1.0), "{text}");
    assert_eq!(
        value(
            &text,
            "smartmig_policy_info{configured=\"none\",running=\"none\",fallback=\"false\"}"
        ),
        Some(1.0),
        "{text}"
    );

    // A 7g request must wait for the 1g: it is counted, and the 6 free
    // slices it cannot use are fragmentation.
    let waiter = {
        let c = d.client();
        std::thread::spawn(move || c.allocate(req(4402, 0, 7, None)))
    };
    let waiting = "smartmig_waiting_allocations{profile=\"7g.40gb\"}";
    d.wait_until("the 7g allocate is counted waiting", || {
        value(&daemon_common::scrape(port), waiting) == Some(1.0)
    });
    let text = daemon_common::scrape(port);
    assert_eq!(
        value(&text, "smartmig_fragmented_compute_slices{gpu=\"0\"}"),
        Some(6.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "smartmig_fragmented_compute_slices{gpu=\"1\"}"),
        Some(0.0),
        "{text}"
    );
    c.release(4401).unwrap();
    let got = waiter.join().unwrap().unwrap();
    assert_eq!(got.profile, "7g.40gb");
    let text = daemon_common::scrape(port);
    assert_eq!(value(&text, waiting), None, "{text}");
    assert_eq!(
        value(&text, "smartmig_fragmented_compute_slices{gpu=\"0\"}"),
        Some(0.0),
        "{text}"
    );
    let destroyed = "smartmig_reconfiguration_duration_seconds_count{op=\"destroy\"}";
    assert_eq!(
        value(&text, destroyed),
        Some(1.0),
        "the 1g made room: {text}"
    );
    assert!(
        text.contains("hpc_job=\"4402\"") && !text.contains("hpc_job=\"4401\""),
        "{text}"
    );
}
