//! `smartmig bench suite` end to end through the binary: the JSON has the
//! documented shape, every simulated run's event log passed the audit, the
//! training and test days are disjoint, and bad input is refused with an
//! error that names it.

use std::path::PathBuf;
use std::process::{Command, Output};

fn smartmig(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_smartmig"))
        .args(args)
        // The learned policy needs ONNX Runtime; this test is about the
        // yardstick, so it runs the built-in policies only.
        .env("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so")
        .output()
        .expect("run smartmig")
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("smartmig-suite-{}-{name}", std::process::id()))
}

#[test]
fn quick_suite_writes_audited_json_and_plots() {
    let json = temp("out.json");
    let plots = temp("plots");
    let out = smartmig(&[
        "bench",
        "suite",
        "--quick",
        "--only",
        "mix-shift/tight,batch",
        "--json",
        json.to_str().unwrap(),
        "--report",
        plots.to_str().unwrap(),
        "--gates",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Summary: ET per scenario"), "{stdout}");
    // --gates: one table per policy of ours, naming the best causal opponent.
    assert!(stdout.contains("Gates of greedy"), "{stdout}");
    assert!(
        stdout.contains("worst test day over all scenarios vs the better of none and static-hist"),
        "{stdout}"
    );
    assert!(stdout.contains("worse days"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let scenarios = v["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mix-shift/tight", "batch/tight", "batch/loose"]);
    for s in scenarios {
        let train: Vec<&str> = s["train_days"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        let test: Vec<&str> = s["test_days"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        assert_eq!(train, ["seed 0", "seed 1", "seed 2"]);
        assert_eq!(test, ["seed 1000", "seed 1001"]);
        let rows = s["rows"].as_array().unwrap();
        let policies: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
        for p in [
            "none",
            "static-hist",
            "twice-daily-hist",
            "greedy",
            "static-hindsight",
            "twice-daily-hindsight",
            "lower-bound",
        ] {
            assert!(policies.contains(&p), "{p} missing: {policies:?}");
        }
        for r in rows {
            for key in [
                "policy",
                "et",
                "energy_j",
                "tardiness_s",
                "late_share",
                "mean_wait_s",
                "kind",
            ] {
                assert!(r.get(key).is_some(), "{key} missing in {r}");
            }
            assert!(r["et"].as_f64().unwrap() > 0.0);
        }
        // No learned policy here (no ONNX Runtime): no do-no-harm choice.
        assert_eq!(s["fallbacks"].as_array().map(Vec::len), Some(0));
        // Every simulated row on every test day was audited.
        let simulated = rows.iter().filter(|r| r["kind"] != "bound").count() as u64;
        assert_eq!(
            s["audited_logs"].as_u64().unwrap(),
            simulated * 2,
            "{}",
            s["name"]
        );
        // The opponents are fitted on training days: hindsight ones say so.
        let hist = rows.iter().find(|r| r["policy"] == "static-hist").unwrap();
        assert!(hist["description"]
            .as_str()
            .unwrap()
            .contains("training days"));
    }
    // A batch day: every job arrives at 0 and the makespan is reported.
    let batch_none = &scenarios[1]["rows"][0];
    assert!(batch_none["makespan_s"].as_f64().unwrap() > 0.0);
    assert!(batch_none["jobs_per_hour"].as_f64().unwrap() > 0.0);
    let svg = std::fs::read_to_string(plots.join("et-mix-shift-tight.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("static-hist"));
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_dir_all(&plots);
}

#[test]
fn bad_suite_options_are_refused_by_name() {
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--only", "nightly"], "no scenario `nightly`"),
        (vec!["--train-seed", "1000"], "overlap"),
        (vec!["--test-days", "0"], "at least 1"),
        (
            vec!["--scenarios", "/nonexistent/s.toml"],
            "/nonexistent/s.toml",
        ),
        (vec!["--trace", "/nonexistent/t.csv"], "/nonexistent/t.csv"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["bench", "suite", "--quick"];
        args.extend(extra.iter());
        let out = smartmig(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
    }
    // A scenarios file with an unknown field names it.
    let file = temp("bad.toml");
    std::fs::write(
        &file,
        "[[scenario]]\nname = \"x\"\nfamily = \"diurnal\"\ndeadline = \"tight\"\npeak_rates = 3\n",
    )
    .unwrap();
    let out = smartmig(&[
        "bench",
        "suite",
        "--quick",
        "--scenarios",
        file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("peak_rates"),
        "{stderr}"
    );
    let _ = std::fs::remove_file(&file);
}

#[test]
fn scenarios_scored_on_several_threads_give_the_figures_and_order_of_one() {
    let run = |jobs: &str| {
        let json = temp(&format!("jobs{jobs}.json"));
        let out = smartmig(&[
            "bench",
            "suite",
            "--quick",
            "--no-hindsight",
            "--only",
            "diurnal,big-night/tight",
            "--jobs",
            jobs,
            "--json",
            json.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "--jobs {jobs}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let _ = std::fs::remove_file(&json);
        // Wall time is the one figure allowed to differ.
        v.as_object_mut().unwrap().remove("elapsed_s");
        (v, String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (one, one_out) = run("1");
    let (three, three_out) = run("3");
    let names: Vec<&str> = one["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["diurnal/tight", "diurnal/loose", "big-night/tight"]);
    assert_eq!(one, three, "the JSON of --jobs 1 and --jobs 3 differ");
    // The tables come out in the scenarios' order too (the last line is
    // the wall time).
    let body = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with('('))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(body(&one_out), body(&three_out));
    let out = smartmig(&["bench", "suite", "--quick", "--jobs", "0"]);
    assert!(!out.status.success(), "--jobs 0 was accepted");
}
