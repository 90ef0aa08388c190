//! `smartmig advise report` through the binary, on a hand-written advice
//! log: the table names the opponent, the SVG plots and the JSON are
//! written, the config's state_dir and the rotated log are read, and a
//! damaged log fails with its line number and writes nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use smartmig::mig::{Geometry, GpuModel};

fn smartmig(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_smartmig"))
        .args(args)
        .env("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so")
        .output()
        .expect("run smartmig")
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("smartmig-advise-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as f64
}

fn layout_line(t: f64, gpu: u32, picture: &str) -> String {
    let g = Geometry::of(GpuModel::A100_40gb);
    let bits = g
        .layouts()
        .iter()
        .find(|&&l| g.picture(l) == picture)
        .unwrap()
        .0;
    format!(
        r#"{{"kind":"layout","t":{t},"gpu":{gpu},"model":"a100-40gb","layout":{bits},"picture":"{picture}"}}"#
    )
}

/// (job id, GPU, profile, submit, start, end, deadline) in seconds from `base`.
type J = (u64, u32, &'static str, f64, f64, f64, Option<f64>);

const JOBS: [J; 12] = [
    (1, 0, "4g.20gb", 0.0, 0.0, 3000.0, None),
    (2, 0, "3g.20gb", 60.0, 60.0, 2000.0, None),
    (3, 1, "1g.5gb", 100.0, 100.0, 1900.0, None),
    (4, 1, "1g.5gb", 120.0, 120.0, 1500.0, None),
    (5, 1, "1g.5gb", 200.0, 1500.0, 3000.0, None),
    (6, 1, "2g.10gb", 300.0, 300.0, 2300.0, None),
    (7, 1, "3g.20gb", 400.0, 400.0, 4000.0, None),
    (8, 0, "3g.20gb", 500.0, 2000.0, 3500.0, None),
    (9, 1, "1g.5gb", 3000.0, 3000.0, 5000.0, Some(4000.0)),
    (10, 0, "4g.20gb", 3100.0, 3100.0, 6000.0, None),
    (11, 1, "2g.10gb", 3200.0, 3200.0, 4200.0, None),
    (12, 0, "3g.20gb", 3500.0, 3500.0, 5500.0, None),
];

fn job_line(base: f64, j: &J) -> String {
    let (id, gpu, profile, submit, start, end, deadline) = *j;
    let deadline = deadline.map_or_else(|| "null".to_string(), |d| (base + d).to_string());
    format!(
        r#"{{"kind":"job","job_id":{id},"gpu":{gpu},"profile":"{profile}","submit":{},"start":{},"end":{},"time_limit_s":7200,"deadline":{deadline}}}"#,
        base + submit,
        base + start,
        base + end
    )
}

/// The log of a 2-GPU node whose jobs ran in the last 6 h, plus one old
/// job two days before; the first `split` lines, and the rest.
fn log_lines() -> Vec<String> {
    let base = (now() - 6.0 * 3600.0).floor();
    let mut lines = vec![
        layout_line(base - 200_000.0, 0, "4444|3333"),
        layout_line(base - 200_000.0, 1, "1|1|22|3333"),
        job_line(
            base - 172_800.0,
            &(99, 0, "4g.20gb", 0.0, 10.0, 600.0, None),
        ),
    ];
    lines.extend(JOBS.iter().map(|j| job_line(base, j)));
    lines.push(format!(
        r#"{{"kind":"advice","t":{},"gpu":1,"policy":"greedy","from":"1|1|22|3333","to":"1|1|1|1|3333","to_layout":0,"destroy":["2g.10gb@2"],"create":["1g.5gb@2","1g.5gb@3"],"keeps_busy":["1g.5gb@0"]}}"#,
        base + 150.0
    ));
    lines
}

fn is_svg(p: &Path) -> bool {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    text.len() > 1000 && text.starts_with("<svg") && text.trim_end().ends_with("</svg>")
}

#[test]
fn the_report_prints_the_table_and_writes_plots_and_json() {
    let dir = temp("log");
    let log = dir.join("advice.jsonl");
    std::fs::write(&log, log_lines().join("\n") + "\n").unwrap();
    let plots = dir.join("plots");
    let json = dir.join("report.json");
    let out = smartmig(&[
        "advise",
        "report",
        "--log",
        log.to_str().unwrap(),
        "--since",
        "1d",
        "--policy",
        "greedy",
        "--plots",
        plots.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The old job is outside --since 1d.
    assert!(
        stdout.starts_with("Advise report: 12 jobs on 2 GPU(s)"),
        "{stdout}"
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            [
                "observed (log)",
                "as-run (opponent)",
                "greedy (policy)",
                "none (whole GPUs)",
            ]
            .iter()
            .any(|r| l.starts_with(r))
        })
        .collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    assert!(
        rows[1].starts_with("as-run (opponent)"),
        "as-run comes first: {stdout}"
    );
    assert!(stdout.contains("Fidelity of the as-run replay"), "{stdout}");
    assert!(
        stdout.contains("GPU 1: 1 reshape(s) wanted (1 instances destroyed, 2 created)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("on energy") && stdout.contains("on wait") || stdout.contains("Energy:"),
        "{stdout}"
    );
    for f in ["waiting.svg", "power.svg", "energy.svg"] {
        assert!(is_svg(&plots.join(f)), "{f} is not a non-empty SVG");
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let names: Vec<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["as-run", "greedy", "none", "rolling-fit"]);
    assert_eq!(v["rows"][0]["role"], "as-run");
    assert_eq!(v["observed"]["jobs"], 12);
    // Waits seen: 1300 s (job 5) and 1500 s (job 8) over 12 jobs.
    let mean_wait = v["observed"]["mean_wait_s"].as_f64().unwrap();
    assert!((mean_wait - 2800.0 / 12.0).abs() < 1e-6, "{mean_wait}");
    assert_eq!(v["observed"]["late_jobs"], 1);
    assert_eq!(v["audited_logs"], 4);
    for r in v["rows"].as_array().unwrap() {
        assert_eq!(r["metrics"]["completed"], 12, "{r}");
        assert!(r["metrics"]["energy_mj"].as_f64().unwrap() > 0.0, "{r}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_config_gives_the_state_dir_the_rotated_log_and_the_policy() {
    let dir = temp("config");
    let lines = log_lines();
    // The older half was rotated to advice.jsonl.1.
    std::fs::write(dir.join("advice.jsonl.1"), lines[..6].join("\n") + "\n").unwrap();
    std::fs::write(dir.join("advice.jsonl"), lines[6..].join("\n") + "\n").unwrap();
    let config = dir.join("smartmig.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = \"{}\"\npolicy = \"static:1|1|22|3333\"\nepoch_s = 30\n[[gpus]]\nmodel = \"a100-40gb\"\ncount = 2\n",
            dir.display()
        ),
    )
    .unwrap();
    let plots = dir.join("plots");
    let out = smartmig(&[
        "advise",
        "report",
        "--config",
        config.to_str().unwrap(),
        "--plots",
        plots.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Both files, and no --since: the old job too.
    assert!(
        stdout.starts_with("Advise report: 13 jobs on 2 GPU(s)"),
        "{stdout}"
    );
    assert!(stdout.contains("static:1|1|22|3333 (policy)"), "{stdout}");
    assert!(stdout.contains("epochs every 30 s"), "{stdout}");
    // Nothing submitted in the last minute: a clear error.
    let out = smartmig(&[
        "advise",
        "report",
        "--config",
        config.to_str().unwrap(),
        "--since",
        "1m",
        "--plots",
        plots.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("no observed jobs submitted at or after"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_damaged_log_fails_with_its_line_number_and_writes_nothing() {
    let dir = temp("bad");
    let mut lines = log_lines();
    lines[3] = r#"{"kind":"job","job_id":1,"profile":"1g.5gb""#.to_string();
    let log = dir.join("advice.jsonl");
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    let plots = dir.join("plots");
    let json = dir.join("report.json");
    let args = |log: &Path| {
        smartmig(&[
            "advise",
            "report",
            "--log",
            log.to_str().unwrap(),
            "--plots",
            plots.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ])
    };
    let out = args(&log);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("{}: line 4: not an advice record", log.display())),
        "{stderr}"
    );
    assert!(
        !plots.exists() && !json.exists(),
        "bad input wrote something"
    );
    // A profile the GPU does not have: named with the job.
    lines[3] = job_line(now(), &(77, 0, "3g.40gb", 0.0, 1.0, 2.0, None));
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    let out = args(&log);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("job 77: profile `3g.40gb` on GPU 0 (a100-40gb)"),
        "{stderr}"
    );
    assert!(
        !plots.exists() && !json.exists(),
        "bad input wrote something"
    );
    // No log at all.
    let out = args(&dir.join("missing.jsonl"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no advice log at"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The synthetic day of `tests/data/advice_example.jsonl` (queued as
/// typed GRES would, a layout change at 6 h): the as-run replay puts
/// every job on its own profile for its observed run time, and its waits
/// agree with the observed ones to 1 %.
#[test]
fn the_as_run_replay_of_the_example_day_agrees_with_what_was_observed() {
    let dir = temp("example");
    let json = dir.join("report.json");
    let log = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/advice_example.jsonl");
    let out = smartmig(&[
        "advise",
        "report",
        "--log",
        log.to_str().unwrap(),
        "--policy",
        "greedy",
        "--plots",
        dir.join("plots").to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let f = &v["fidelity"];
    assert_eq!(f["jobs"], 74);
    assert_eq!(f["jobs_on_their_profile"], 74, "{f}");
    assert_eq!(f["min_run_time_ratio"], 1.0, "{f}");
    let (seen, replayed) = (
        f["observed_mean_wait_s"].as_f64().unwrap(),
        f["replayed_mean_wait_s"].as_f64().unwrap(),
    );
    assert!((replayed / seen - 1.0).abs() < 0.01, "{replayed} vs {seen}");
    // The layout change at 6 h was replayed.
    assert_eq!(
        v["observation"]["gpus"][0]["changes"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(v["rows"][0]["metrics"]["reconfigurations"], 1);
    assert_eq!(v["observation"]["advice"]["total"], 3);
    std::fs::remove_dir_all(&dir).unwrap();
}
