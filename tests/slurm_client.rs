//! smartmigd's Slurm client (`smartmig_daemon::slurm::CommandSlurm`) and its
//! parsers against the real Slurm of the series under test (the host's
//! 22.05, or `SMARTMIG_SLURM_SERIES=24.11`/`26.05` in their root file
//! systems): what each series prints for `squeue --json`, `sinfo --json`,
//! `scontrol show nodes --json`, `scontrol show job` (text and, from 23.11,
//! JSON) and `slurmd -G` is read right, on a queue with a running shard job
//! on each GPU (the second GPU's job tells whether the GPU index is read
//! or merely defaulted), an array and a time limit and deadline, a node
//! with features and a drain with a reason.
//!
//! With `SMARTMIG_SLURM_SAMPLES=DIR` the raw outputs are also written to
//! `DIR` (how `sidecar/tests/data/slurm/` was made).
//!
//! Needs root and a release build; fails, never skips.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use smartmig_daemon::slurm::{
    number, parse_gres_gpus, parse_job_comment, parse_nodes, parse_queue, CommandSlurm, JobState,
    NodeFeatures, SlurmClient,
};
use smartmig_suite::{describe, holds_within, repo_root, slurm_series, wait_until, SlurmCluster};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Wrappers `DIR/bin/<program>` that run the series' own program with the
/// cluster's slurm.conf (on the host's series: the program from PATH).
fn client_wrappers(cluster: &SlurmCluster) -> PathBuf {
    let bin = cluster.dir().join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir bin");
    let run = match slurm_series() {
        Some(s) => format!(
            "{} run {s} ",
            repo_root().join("scripts/slurm-series").display()
        ),
        None => String::new(),
    };
    for program in ["squeue", "sinfo", "scontrol", "slurmd"] {
        let path = bin.join(program);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\nSLURM_CONF={} exec {run}{program} \"$@\"\n",
                cluster.slurm_conf().display()
            ),
        )
        .expect("write wrapper");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    bin
}

/// Runs a client command of the cluster and returns its stdout (and
/// stderr, for `slurmd -G`), failing the test when it fails.
fn output(cluster: &SlurmCluster, program: &str, args: &[&str]) -> String {
    let out = cluster
        .command(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        describe(&out)
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn save(name: &str, text: &str) {
    if let Ok(dir) = std::env::var("SMARTMIG_SLURM_SAMPLES") {
        let dir = Path::new(&dir);
        std::fs::create_dir_all(dir).expect("mkdir samples");
        std::fs::write(dir.join(name), text).expect("write sample");
    }
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn the_daemons_slurm_client_reads_this_series() {
    let cluster = SlurmCluster::up();
    let node = std::process::Command::new("hostname")
        .arg("-s")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .expect("hostname");
    let version = output(&cluster, "scontrol", &["--version"]);
    let go = cluster.dir().join("go");
    let wait = format!(
        "for i in $(seq 600); do [ -e {} ] && break; sleep 0.1; done",
        go.display()
    );
    // GPU 0 gets the 3-shard job; the 7-shard job then fits only GPU 1.
    let a = cluster.sbatch_wrap(
        &["--gres=shard:3", "-t", "10", "--deadline=now+2hours"],
        &wait,
    );
    assert!(holds_within(TIMEOUT, || cluster.job_state(a).as_deref()
        == Some("RUNNING")));
    let b = cluster.sbatch_wrap(&["--gres=shard:7"], &wait);
    assert!(holds_within(TIMEOUT, || cluster.job_state(b).as_deref()
        == Some("RUNNING")));
    // Two array tasks on GPU 0's four free shards, and a held job.
    let array = cluster.sbatch_wrap(&["--gres=shard:1", "--array=1-2"], &wait);
    let held = cluster.sbatch_wrap(&["--gres=shard:2", "-H"], "true");
    assert!(
        holds_within(TIMEOUT, || cluster
            .job_records(array)
            .iter()
            .filter(|r| r.get("JobState").map(String::as_str) == Some("RUNNING"))
            .count()
            == 2),
        "the array's tasks did not both start: {:?}",
        cluster.job_records(array)
    );
    let set = output(
        &cluster,
        "scontrol",
        &[
            "update",
            &format!("JobId={a}"),
            "AdminComment=site=abc ticket=7",
        ],
    );
    assert!(!set.contains("error"), "{set}");

    // squeue --json, through the parser.
    let squeue = output(&cluster, "squeue", &["--json"]);
    save("squeue.json", &squeue);
    let q = parse_queue(&json(&squeue)).expect("parse squeue --json");
    let ja = q.job(u64::from(a)).expect("job a listed");
    assert_eq!(
        (ja.state, ja.shards, ja.gpu),
        (JobState::Running, 3, Some(0)),
        "{ja:?}"
    );
    assert_eq!(ja.time_limit_s, Some(600), "{ja:?}");
    assert!(ja.deadline.is_some_and(|d| d > ja.submit_time), "{ja:?}");
    assert!(
        ja.start_time >= ja.submit_time && ja.start_time > 0,
        "{ja:?}"
    );
    assert_eq!(ja.end_time, ja.start_time + 600, "{ja:?}");
    assert_eq!(ja.admin_comment, "site=abc ticket=7");
    assert_eq!(ja.nodes, node);
    assert_eq!(ja.partition, "debug");
    let jb = q.job(u64::from(b)).expect("job b listed");
    assert_eq!(
        (jb.state, jb.shards, jb.gpu),
        (JobState::Running, 7, Some(1)),
        "{jb:?}"
    );
    assert_eq!(jb.time_limit_s, None, "unlimited: {jb:?}");
    let mut tasks: Vec<(u64, u64, Option<u32>)> = q
        .jobs
        .iter()
        .filter_map(|j| j.array_task.map(|(a, t)| (a, t, j.gpu)))
        .collect();
    tasks.sort_unstable();
    assert_eq!(
        tasks,
        vec![
            (u64::from(array), 1, Some(0)),
            (u64::from(array), 2, Some(0))
        ],
        "{q:?}"
    );
    let pending: Vec<(u64, u8)> = q.pending_shards().map(|j| (j.job_id, j.shards)).collect();
    assert_eq!(pending, vec![(u64::from(held), 2)], "{q:?}");

    // sinfo --json (every series' layout) and, from 23.11, scontrol's.
    let features = NodeFeatures {
        available: vec!["site_ib".into(), "smartmig_gpu0_3g".into()],
        active: vec!["site_ib".into(), "smartmig_gpu0_3g".into()],
    };
    let bin = client_wrappers(&cluster);
    let w = |p: &str| bin.join(p).display().to_string();
    let client = CommandSlurm {
        squeue: w("squeue"),
        sinfo: w("sinfo"),
        scontrol: w("scontrol"),
        slurmd: w("slurmd"),
        salloc: w("salloc"),
        scancel: w("scancel"),
        hold_partition: String::new(),
        timeout: Duration::from_secs(30),
        release: Default::default(),
    };
    client
        .set_node_features(&node, &features)
        .expect("set node features");
    output(
        &cluster,
        "scontrol",
        &[
            "update",
            &format!("NodeName={node}"),
            "State=DRAIN",
            "Reason=smartmig: sidecar unreachable",
        ],
    );
    let sinfo = output(&cluster, "sinfo", &["--json"]);
    save("sinfo.json", &sinfo);
    let release = smartmig_daemon::slurm::parse_release(&version).expect("scontrol --version");
    let json_nodes = release >= smartmig_daemon::slurm::SCONTROL_JSON_SINCE;
    // 22.05's sinfo --json lists nodes; 23.11+'s groups them (no per-node
    // source), and `scontrol show nodes --json` lists them.
    let per_node = if json_nodes {
        assert_eq!(
            parse_nodes(&json(&sinfo)),
            Err(smartmig_daemon::slurm::ParseError::GroupedNodes)
        );
        let nodes = output(&cluster, "scontrol", &["show", "nodes", "--json"]);
        save("scontrol-nodes.json", &nodes);
        nodes
    } else {
        sinfo
    };
    let listed = parse_nodes(&json(&per_node)).expect("parse the node records");
    let me = listed
        .iter()
        .find(|n| n.name == node)
        .unwrap_or_else(|| panic!("{node} not in {listed:?}"));
    assert!(me.info.drained_by_smartmig(), "{me:?}");
    assert_eq!(me.info.features, features, "{me:?}");
    assert_eq!((me.mig_node, me.shards_per_gpu), (true, 7), "{me:?}");
    assert_eq!(me.partitions, vec!["debug".to_string()], "{me:?}");
    if json_nodes {
        assert_eq!(listed.len(), 1, "{listed:?}");
        let job = output(
            &cluster,
            "scontrol",
            &["show", "job", &a.to_string(), "--json"],
        );
        save("scontrol-job.json", &job);
        let one = parse_queue(&json(&job)).expect("parse scontrol show job --json");
        assert_eq!(one.jobs.len(), 1, "one job: {one:?}");
        assert_eq!(one.jobs[0], *ja);
        assert!(
            number(&json(&job)["jobs"][0]["job_id"]) == Some(u64::from(a)),
            "{job}"
        );
    }
    // The client, as smartmigd uses it (it picks the commands by release).
    let info = client.node(&node).expect("client.node");
    assert_eq!(info, me.info);
    let all = client.nodes().expect("client.nodes");
    assert_eq!(all.len(), 1, "{all:?}");
    client.resume(&node).expect("client.resume");
    assert!(
        holds_within(TIMEOUT, || !client.node(&node).expect("node").drain),
        "resume did not undo the drain"
    );
    let queue = client.queue().expect("client.queue");
    assert_eq!(queue.job(u64::from(b)).and_then(|j| j.gpu), Some(1));
    let comment = client
        .job_comment(u64::from(a))
        .expect("client.job_comment")
        .expect("job a known");
    assert_eq!(comment.admin_comment, "site=abc ticket=7");
    assert_eq!(comment.account, ja.account);
    assert_eq!(client.job_comment(999_999).expect("unknown job"), None);
    client
        .set_admin_comment(&b.to_string(), "smartmig:profile=7g.40gb,gpu=1")
        .expect("client.set_admin_comment");
    // One task keeps the array's id (Slurm gives the others new ids): it
    // is tagged by its `A_T` name, and only it.
    let (_, own) = q
        .job(u64::from(array))
        .and_then(|j| j.array_task)
        .expect("a task has the array's id");
    client
        .set_admin_comment(&format!("{array}_{own}"), "smartmig:profile=1g.5gb,gpu=0")
        .expect("tag the task");
    let tagged_task = client
        .job_comment(u64::from(array))
        .expect("job_comment of the task")
        .expect("the task is known");
    assert_eq!(
        tagged_task.array_task,
        Some((u64::from(array), own)),
        "{tagged_task:?}"
    );
    assert_eq!(tagged_task.admin_comment, "smartmig:profile=1g.5gb,gpu=0");
    let tagged = client.queue().expect("queue");
    let untagged = tagged
        .jobs
        .iter()
        .filter(|j| j.array_task.is_some() && j.job_id != u64::from(array))
        .map(|j| j.admin_comment.clone())
        .collect::<Vec<_>>();
    assert_eq!(
        untagged,
        vec![String::new()],
        "the other task was tagged too: {tagged:?}"
    );
    client
        .set_job_shards(u64::from(held), 3)
        .expect("client.set_job_shards of a pending job");
    let raised = client.queue().expect("queue");
    assert_eq!(raised.job(u64::from(held)).map(|j| j.shards), Some(3));

    // scontrol show job, text (22.05's only form).
    let text = output(&cluster, "scontrol", &["show", "job", &a.to_string()]);
    save("scontrol-job.txt", &text);
    let parsed = parse_job_comment(&text).expect("scontrol show job text");
    assert_eq!(parsed.admin_comment, "site=abc ticket=7");

    // slurmd -G: Slurm's GPU index of each device file.
    let gres = output(&cluster, "slurmd", &["-G", "-N", &node]);
    save("slurmd-G.txt", &gres);
    let gpus = parse_gres_gpus(&gres);
    assert_eq!(gpus.len(), 2, "{gres}");
    assert!(
        gpus[1].file.ends_with("/dev/nvidia1") && gpus[1].index == 1,
        "{gpus:?}"
    );
    assert_eq!(
        client.gres_gpus(&node).expect("client.gres_gpus"),
        gpus,
        "{gres}"
    );

    std::fs::write(&go, "").expect("release the jobs");
    for job in [a, b] {
        cluster.assert_completed(job, TIMEOUT);
    }
    let ended = client.queue().expect("queue after the end");
    assert_eq!(
        ended.job(u64::from(a)).map(|j| j.state),
        Some(JobState::Completed),
        "{ended:?}"
    );
    output(&cluster, "scancel", &[&held.to_string()]);

    // slurmctld gone: no answer is a queue (22.05's squeue --json exits 0
    // with an error and no jobs; read as a queue, every job had ended).
    let pid = std::fs::read_to_string(cluster.dir().join("run/slurmctld.pid")).expect("pid file");
    let killed = std::process::Command::new("kill")
        .arg(pid.trim())
        .status()
        .expect("kill slurmctld");
    assert!(killed.success());
    // Gone: no process, or a zombie not yet reaped (field 3 of
    // /proc/PID/stat, after the name in parentheses, is `Z`).
    let stat = format!("/proc/{}/stat", pid.trim());
    wait_until(
        "slurmctld to exit",
        TIMEOUT,
        || match std::fs::read_to_string(&stat) {
            Err(_) => Ok(()),
            Ok(s)
                if s.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z')) =>
            {
                Ok(())
            }
            Ok(s) => Err(s),
        },
    );
    let down = client.queue();
    assert!(down.is_err(), "a queue without slurmctld: {down:?}");
    assert!(client.node(&node).is_err(), "a node without slurmctld");
}
