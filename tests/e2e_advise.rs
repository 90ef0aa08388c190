//! End-to-end: `mode = "advise"` on the real-Slurm test cluster (issue 22,
//! part 1). The node is set up the way a site without smartmig runs MIG:
//! a static layout (here made once by smartmigd with `static:4444|3333`,
//! as mig-parted would) and Slurm's native typed GRES, one `gpu` GRES per
//! MIG device (`tests/slurm/cluster.sh`, `SMARTMIG_SLURM_MIG_GRES`), with
//! the SPANK plugin installed. smartmigd then runs in advise mode while a
//! small day of typed jobs runs: it must leave every instance as it was,
//! record the jobs and what its policy would have done, refuse to
//! allocate, and `smartmig advise report` must replay the log. The policy
//! considered is `static:3333|3333` (two 3g.20gb per GPU, for a day of
//! mostly 3g.20gb work), so a wish is certain: `greedy` counts an idle
//! 4g.20gb as serving a 3g.20gb job and in dynamic mode would reshape on
//! demand at allocate, which no epoch wish shows (the report's replay
//! does).
//! Needs root and a release build; fails, never skips.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use smartmig_suite::{artifact, plugstack_line, Sidecar, SlurmCluster};

const TIMEOUT: Duration = Duration::from_secs(120);

/// Every instance as (gpu, profile, uuid).
fn instances(sidecar: &Sidecar) -> BTreeSet<(u64, String, String)> {
    Sidecar::instances(&sidecar.status())
        .into_iter()
        .map(|i| {
            (
                i["gpu"].as_u64().unwrap_or(99),
                i["profile"].as_str().unwrap_or("").to_string(),
                i["uuid"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// One allocate over the plugin's socket, as the plugin sends it; the reply.
fn allocate_line(socket: &std::path::Path) -> String {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    stream
        .write_all(
            b"{\"v\":1,\"op\":\"allocate\",\"job_id\":4242,\"uid\":0,\"gpu\":0,\"slices\":1}\n",
        )
        .expect("send allocate");
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .expect("read reply");
    reply
}

fn advice_lines(dir: &std::path::Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(dir.join("smartmigd-state/advice.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("advice line {l}: {e}")))
        .collect()
}

#[test]
fn advise_mode_watches_a_static_mig_node_and_changes_nothing() {
    // Two A100-40GB, each 4g.20gb + 3g.20gb, as Slurm's typed GRES.
    std::env::set_var("SMARTMIG_SLURM_MIG_GRES", "4g.20gb,3g.20gb,4g.20gb,3g.20gb");
    std::env::set_var("SMARTMIG_SLURM_SCHED_EXTRA", "sched_interval=2");
    let cluster = SlurmCluster::up_with(|dir| {
        // Typed MIG devices are `gpu` GRES: in advise mode they run as Slurm
        // placed them (the plugin's default fails whole-GPU steps).
        std::fs::write(
            dir.join("plugstack.conf"),
            plugstack_line(dir, "gpu_jobs=allow"),
        )
        .expect("plugstack");
    });

    // The site's static layout, made once (mig-parted's job at a real site).
    let mut setup = Sidecar::start(cluster.dir(), "policy = \"static:4444|3333\"\n");
    let site = instances(&setup);
    assert_eq!(site.len(), 4, "static layout not built: {site:?}");
    setup.stop();

    // Advise mode with the policy the site considers.
    let sidecar = Sidecar::start_with_slurm(
        cluster.dir(),
        "epoch_s = 1\npolicy = \"static:3333|3333\"\nmode = \"advise\"\n",
    );
    assert_eq!(
        instances(&sidecar),
        site,
        "advise mode changed the layout at start"
    );

    // A small day: more 3g.20gb work than the two 3g.20gb devices take at
    // once, so jobs queue for them.
    let mut jobs = Vec::new();
    for _ in 0..6 {
        jobs.push(cluster.sbatch_wrap(
            &["--gres=gpu:3g.20gb:1", "--time=5"],
            "echo CVD=$CUDA_VISIBLE_DEVICES; sleep 3",
        ));
    }
    for _ in 0..2 {
        jobs.push(cluster.sbatch_wrap(&["--gres=gpu:4g.20gb:1", "--time=5"], "sleep 2"));
    }
    for &job in &jobs {
        cluster.assert_completed(job, TIMEOUT);
    }
    // Every job ended; wait for the epochs that see it.
    let mut lines = Vec::new();
    assert!(
        smartmig_suite::holds_within(Duration::from_secs(30), || {
            lines = advice_lines(cluster.dir());
            lines.iter().filter(|l| l["kind"] == "job").count() == jobs.len()
        }),
        "not every job recorded: {lines:#?}\n{}",
        cluster.smartmigd_log()
    );

    // Nothing changed: the same instances, by UUID.
    assert_eq!(instances(&sidecar), site, "advise mode changed an instance");
    let log = cluster.smartmigd_log();
    for word in [
        "destroyed idle instance",
        "created instance",
        "repartitioning",
    ] {
        assert!(
            !log.split("advise mode").nth(1).unwrap_or("").contains(word),
            "advise mode did `{word}`:\n{log}"
        );
    }

    // The record: both GPUs' layouts, every job with its profile, and the
    // policy's wish for each GPU.
    let layouts: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "layout").collect();
    assert_eq!(layouts.len(), 2, "{lines:#?}");
    assert!(
        layouts.iter().all(|l| l["picture"] == "4444|3333"),
        "{layouts:#?}"
    );
    let recorded: BTreeSet<u64> = lines
        .iter()
        .filter(|l| l["kind"] == "job")
        .filter_map(|l| l["job_id"].as_u64())
        .collect();
    let submitted: BTreeSet<u64> = jobs.iter().map(|&j| u64::from(j)).collect();
    assert_eq!(recorded, submitted);
    let threes = lines
        .iter()
        .filter(|l| l["kind"] == "job" && l["profile"] == "3g.20gb")
        .count();
    assert_eq!(threes, 6, "{lines:#?}");
    for l in lines.iter().filter(|l| l["kind"] == "job") {
        let (s, e) = (
            l["start"].as_f64().unwrap_or(0.0),
            l["end"].as_f64().unwrap_or(0.0),
        );
        assert!(s > 0.0 && e >= s && e - s < 60.0, "job times: {l}");
    }
    let wishes: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "advice").collect();
    let gpus: BTreeSet<u64> = wishes.iter().filter_map(|w| w["gpu"].as_u64()).collect();
    assert_eq!(gpus, BTreeSet::from([0, 1]), "{lines:#?}\n{log}");
    for w in &wishes {
        assert_eq!(w["policy"], "static:3333|3333", "{w}");
        assert_eq!(
            (w["from"].as_str(), w["to"].as_str()),
            (Some("4444|3333"), Some("3333|3333")),
            "{w}"
        );
        assert_eq!(w["destroy"].as_array().map(Vec::len), Some(1), "{w}");
    }

    // Status says so.
    let status = sidecar.status();
    assert_eq!(status["advise"]["jobs_recorded"], jobs.len(), "{status:#}");
    let table = sidecar.status_table();
    assert!(
        table.contains("Advise mode: watching, changing nothing"),
        "{table}"
    );

    // A job asking for shards (dynamic mode's request) fails with the reason.
    let refused = allocate_line(&cluster.dir().join("run/smartmigd-root.sock"));
    assert!(
        refused.contains("advise mode") && refused.contains("invalid_request"),
        "{refused}"
    );

    // The report replays the log.
    let plots = cluster.dir().join("advise-report");
    let json = cluster.dir().join("advise.json");
    let out = std::process::Command::new(artifact("smartmig"))
        .args(["advise", "report", "--config"])
        .arg(cluster.dir().join("smartmigd.toml"))
        .arg("--plots")
        .arg(&plots)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run smartmig advise report");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "advise report failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("3333|3333"), "{text}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(&json).expect("report json")).expect("json");
    assert!(report.is_object() || report.is_array(), "{report}");
    let svgs = std::fs::read_dir(&plots)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "svg"))
                .count()
        })
        .unwrap_or(0);
    assert!(svgs > 0, "no SVG plot in {}", plots.display());
    println!("{text}");
}
