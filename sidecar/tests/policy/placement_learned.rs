//! The learned job placement: the engine's deferral, the ONNX runner
//! against candle, the metadata checks, the trainer and the shipped file.

use std::path::{Path, PathBuf};

use smartmig::formats::policy_file::{PlacementMetadata, PLACEMENT_KEY};
use smartmig::learn::model::ActorCritic;
use smartmig::learn::placement::{train_placement, PlacementTrainConfig};
use smartmig::mig::GpuModel;
use smartmig::policy::onnx::{load_policy, PolicyLoadError};
use smartmig::policy::{parse_policy, NoPartition};
use smartmig::sim::placement_features::PlacementFeatures;
use smartmig::sim::placement_onnx::OnnxPlacement;
use smartmig::sim::{
    simulate, Candidate, Heuristic, Pick, PlacementContext, PlacementHeuristic, PlacementSpec,
    RunHooks, SimConfig,
};
use smartmig::workload::{Job, JobClass, SpeedupCurve};

const M: GpuModel = GpuModel::A100_40gb;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("smartmig-placement-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn job(id: u64, arrival: f64, work: f64, deadline: f64) -> Job {
    Job {
        id,
        arrival,
        work,
        speedup: SpeedupCurve::new(1.0, 1.0).expect("curve"),
        memory_gb: 4.0,
        deadline,
        class: JobClass::Training,
        requested_slices: None,
        declared_memory_gb: None,
        template: None,
        memory_growth: None,
        gpus: 1,
    }
}

/// EDF order; defers every job whose id is in `defer` (when allowed).
struct Deferring(Vec<u64>);

impl PlacementHeuristic for Deferring {
    fn name(&self) -> &'static str {
        "deferring"
    }
    fn priority(&self, job: &Job) -> f64 {
        job.deadline
    }
    fn choose(&mut self, _job: &Job, _c: &[Candidate]) -> Pick {
        Pick::default()
    }
    fn choose_in(&mut self, job: &Job, _c: &[Candidate], _ctx: &PlacementContext<'_>) -> Pick {
        Pick {
            defer: self.0.contains(&job.id),
            ..Pick::default()
        }
    }
}

/// One whole A100 and three linear jobs at t = 0 (work 100, 200, 300 s;
/// deadlines 50, 250, 600). EDF runs 1, 2, 3: ends 100, 300, 600, so jobs
/// 1 and 2 are late (tardiness 50 + 50 = 100). Deferring job 1 whenever
/// another job waits runs 2 (ends 200), 3 (ends 500), then 1 (ends 600):
/// only job 1 is late, by 550 s: one late job fewer, more tardiness.
#[test]
fn deferring_a_hopeless_job_lets_the_next_one_make_its_deadline() {
    let jobs = vec![
        job(1, 0.0, 100.0, 50.0),
        job(2, 0.0, 200.0, 250.0),
        job(3, 0.0, 300.0, 600.0),
    ];
    let cfg = SimConfig::default();
    let run = |h: &mut dyn PlacementHeuristic| {
        simulate(&[M], &jobs, h, &mut NoPartition, &cfg, RunHooks::default())
            .expect("simulate")
            .metrics
    };
    let edf = run(Heuristic::Edf.build(0).as_mut());
    assert_eq!(edf.late_jobs, 2);
    assert!((edf.total_tardiness_s - 100.0).abs() < 1e-9);
    let d = run(&mut Deferring(vec![1]));
    assert_eq!(d.late_jobs, 1);
    assert!((d.total_tardiness_s - 550.0).abs() < 1e-9, "{d:?}");
    assert_eq!(d.completed, 3);
    // Deferring every job changes nothing: each is offered again, without
    // the choice, and the instance never idles.
    let all = run(&mut Deferring(vec![1, 2, 3]));
    assert_eq!(
        (all.late_jobs, all.last_completion_s),
        (edf.late_jobs, edf.last_completion_s)
    );
}

/// The `rescue` rule on one whole A100 and three linear jobs at t = 0:
/// h (work 1000 s, due 250 s: late whatever happens), j (300 s, due 350 s:
/// on time only if it starts now) and k (100 s, due 5000 s).
/// - EDF runs h, j, k: h ends 1000 (750 late), j 1300 (950 late): 2 late,
///   1700 s of tardiness.
/// - `cedf+rescue` defers h for j (saved, shorter than h), then runs h at
///   300 since k can wait: h ends 1300 (1050 late), k 1400: 1 late, 1050 s.
/// - `cedf+defer-late` also defers h for k, which did not need it: h ends
///   1400: 1 late, 1150 s.
#[test]
fn rescue_saves_a_job_and_lowers_tardiness() {
    let jobs = vec![
        job(1, 0.0, 1000.0, 250.0),
        job(2, 0.0, 300.0, 350.0),
        job(3, 0.0, 100.0, 5000.0),
    ];
    let cfg = SimConfig::default();
    let run = |spec: &str| {
        let spec: PlacementSpec = spec.parse().expect("spec");
        let mut h = spec.build(0, None).expect("build");
        let m = simulate(
            &[M],
            &jobs,
            h.as_mut(),
            &mut NoPartition,
            &cfg,
            RunHooks::default(),
        )
        .expect("simulate")
        .metrics;
        (m.late_jobs, m.total_tardiness_s.round(), m.completed)
    };
    assert_eq!(run("edf"), (2, 1700.0, 3));
    assert_eq!(run("cedf+rescue"), (1, 1050.0, 3));
    assert_eq!(run("cedf+defer-late"), (1, 1150.0, 3));
}

/// A deferred job with no one behind it starts at once: the engine offers
/// it again in the same round, so no instance idles for a deferral.
#[test]
fn a_deferred_job_alone_starts_at_once() {
    let jobs = vec![job(1, 0.0, 100.0, 50.0)];
    let m = simulate(
        &[M],
        &jobs,
        &mut Deferring(vec![1]),
        &mut NoPartition,
        &SimConfig::default(),
        RunHooks::default(),
    )
    .expect("simulate")
    .metrics;
    assert!((m.last_completion_s - 100.0).abs() < 1e-9, "{m:?}");
}

fn net(seed: u64) -> (PlacementFeatures, ActorCritic) {
    let f = PlacementFeatures::new(M);
    let n = ActorCritic::new(f.obs_dim, f.actions, 16, seed).expect("net");
    (f, n)
}

fn write_placement(path: &Path, n: &ActorCritic, meta: &PlacementMetadata) {
    let json = serde_json::to_string(meta).expect("json");
    let bytes = n
        .export_onnx(&[(PLACEMENT_KEY, json.as_str())])
        .expect("export");
    std::fs::write(path, bytes).expect("write");
}

/// ONNX Runtime and candle give the same probabilities for random rows,
/// and the runner picks candle's most probable allowed action.
#[test]
fn onnx_runtime_and_candle_agree() {
    let (f, n) = net(3);
    let path = tmp("agree.onnx");
    write_placement(&path, &n, &PlacementMetadata::new(&f, 16));
    let mut p = OnnxPlacement::load(&path, Some(M)).expect("load");
    let mut seed = 1u64;
    let mut rnd = || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    };
    for _ in 0..20 {
        let obs: Vec<f32> = (0..f.obs_dim).map(|_| rnd()).collect();
        let mask: Vec<f32> = (0..f.actions)
            .map(|a| if a % 2 == 0 || rnd() > 0.0 { 1.0 } else { 0.0 })
            .collect();
        let (_, candle) = n.act(&obs, &mask, 1).expect("candle");
        let ort = p.infer(&obs, &mask).expect("ort");
        for (a, b) in candle.iter().zip(&ort) {
            assert!((a - b).abs() < 1e-5, "{candle:?} vs {ort:?}");
        }
        for (pr, m) in ort.iter().zip(&mask) {
            if *m < 0.5 {
                assert_eq!(*pr, 0.0, "masked actions get probability 0");
            }
        }
    }
}

/// Wrong model, wrong spec, wrong kind: refused with a message that says
/// which; a repartitioning policy refuses a placement file the same way.
#[test]
fn metadata_mismatches_are_refused_with_clear_messages() {
    let (f, n) = net(4);
    let path = tmp("meta.onnx");
    write_placement(&path, &n, &PlacementMetadata::new(&f, 16));
    let err = |r: Result<OnnxPlacement, PolicyLoadError>| {
        r.err().map(|e| e.to_string()).unwrap_or_default()
    };
    let e = err(OnnxPlacement::load(&path, Some(GpuModel::H100_80gb)));
    assert!(
        e.contains("trained for a100-40gb") && e.contains("h100-80gb"),
        "{e}"
    );
    // The repartitioning loader sees a placement file for what it is.
    let e = load_policy(&path, M)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("job-placement policy, not a repartitioning policy")
            && e.contains("--placement learned:"),
        "{e}"
    );
    let mut meta = PlacementMetadata::new(&f, 16);
    meta.feature_spec_version += 1;
    write_placement(&path, &n, &meta);
    let e = err(OnnxPlacement::load(&path, Some(M)));
    assert!(e.contains("feature spec version"), "{e}");
    let mut meta = PlacementMetadata::new(&f, 16);
    meta.profiles.pop();
    write_placement(&path, &n, &meta);
    let e = err(OnnxPlacement::load(&path, Some(M)));
    assert!(e.contains("profiles"), "{e}");
    // A repartitioning policy given as a placement.
    let shipped = smartmig::policy::onnx::shipped_policy(M).expect("shipped policy");
    let e = err(OnnxPlacement::load(&shipped, Some(M)));
    assert!(
        e.contains("repartitioning policy, not a job-placement policy")
            && e.contains("--policy policy:"),
        "{e}"
    );
    // Not a file.
    let e = err(OnnxPlacement::load(Path::new("/nonexistent/p.onnx"), None));
    assert!(e.contains("/nonexistent/p.onnx"), "{e}");
}

/// A short training run is deterministic given its seed, its file loads,
/// and it runs in the simulator under two repartitioning policies.
#[test]
fn training_is_deterministic_and_its_file_runs() {
    let mut cfg = PlacementTrainConfig {
        hidden: 16,
        teacher: "eft+defer-late:2".into(),
        validate_every: 1,
        ..PlacementTrainConfig::default()
    };
    cfg.data.scenarios = vec!["diurnal/tight".into()];
    cfg.data.gpus = 4;
    cfg.data.train_days = 1;
    cfg.data.validation_days = 1;
    cfg.imitation.episodes = 2;
    cfg.imitation.epochs = 2;
    cfg.ppo.iterations = 2;
    cfg.ppo.episodes_per_iteration = 1;
    cfg.ppo.epochs = 1;
    let (a, ra) = train_placement(&cfg, |_| {}).expect("train a");
    let (b, _) = train_placement(&cfg, |_| {}).expect("train b");
    assert_eq!(
        a.export_onnx(&[]).expect("a"),
        b.export_onnx(&[]).expect("b"),
        "same seed, same weights"
    );
    // 2 imitation + 2 x 1 PPO episodes.
    assert_eq!(ra.episodes, 4);
    assert_eq!(ra.validation_heuristics.len(), 7);
    let path = tmp("trained.onnx");
    let f = PlacementFeatures::new(M);
    write_placement(&path, &a, &PlacementMetadata::new(&f, 16));
    let spec: PlacementSpec = format!("learned:{}", path.display()).parse().expect("spec");
    let s = smartmig::scenario::select_scenarios(
        smartmig::scenario::default_scenarios(),
        &["diurnal/tight".to_string()],
    )
    .expect("scenario");
    let jobs = s[0].generate(M, 4, 1000);
    for policy in ["none", "greedy"] {
        let mut p = parse_policy(policy, &[M]).expect("policy");
        let mut h = spec.build(0, Some(M)).expect("load");
        let r = simulate(
            &[M; 4],
            &jobs,
            h.as_mut(),
            p.as_mut(),
            &SimConfig::default(),
            RunHooks::default(),
        )
        .expect("simulate");
        assert_eq!(r.placement, "learned");
        assert_eq!(r.metrics.completed + r.metrics.unserved, jobs.len() as u64);
    }
    let bad = PlacementTrainConfig {
        kind: "policy".into(),
        ..cfg
    };
    assert!(train_placement(&bad, |_| {}).is_err());
}

/// The shipped placement loads for its model and makes decisions.
#[test]
fn shipped_placement_loads_and_decides() {
    let path =
        smartmig::policy::onnx::shipped_placement(M).expect("policies/a100-40gb-placement.onnx");
    let mut p = OnnxPlacement::load(&path, Some(M)).expect("load");
    assert_eq!(p.metadata().gpu_model, M);
    let jobs: Vec<Job> = (0..40)
        .map(|i| {
            job(
                i,
                f64::from(i as u32) * 30.0,
                600.0,
                f64::from(i as u32) * 30.0 + 900.0,
            )
        })
        .collect();
    // Mixed instances (a 3g, a 2g, a 1g): the network has a choice.
    let mut policy = parse_policy("static:3333|22|1|.", &[M]).expect("policy");
    let r = simulate(
        &[M; 2],
        &jobs,
        &mut p,
        policy.as_mut(),
        &SimConfig::default(),
        RunHooks::default(),
    )
    .expect("simulate");
    assert_eq!(r.metrics.completed, 40);
    assert!(
        p.decisions > 0 && p.failures == 0,
        "{} decisions, {} failures",
        p.decisions,
        p.failures
    );
    // The JSON next to it is the embedded metadata.
    let json: PlacementMetadata =
        serde_json::from_str(&std::fs::read_to_string(path.with_extension("json")).expect("json"))
            .expect("parse json");
    assert_eq!(&json, p.metadata());
}

/// Runs `smartmig bench placement --quick ARGS --json JSON`, which must
/// succeed; returns its standard output.
fn bench_placement(args: &[&str], json: &Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_smartmig"))
        .args(["bench", "placement", "--quick"])
        .args(args)
        .arg("--json")
        .arg(json)
        .output()
        .expect("run smartmig");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `smartmig bench placement` runs the shipped placement against the
/// seven heuristics and writes its report: one gate row per
/// repartitioning policy, each against the heuristic with the fewest late
/// jobs of its block, with a measured decision time.
#[test]
fn bench_placement_writes_its_report() {
    let json = tmp("bench.json");
    let stdout = bench_placement(&["--only", "diurnal/tight"], &json);
    assert!(
        stdout.contains("learned placement vs the opponent"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report")).expect("json");
    let blocks = v["scenarios"][0]["blocks"].as_array().expect("blocks");
    let names: Vec<&str> = blocks.iter().filter_map(|b| b["policy"].as_str()).collect();
    assert_eq!(names[..3], ["none", "static-hist", "greedy"]);
    for b in blocks {
        let rows = b["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), 8, "seven heuristics and the learned placement");
        let best = b["best_heuristic"].as_str().expect("best");
        let late = |r: &serde_json::Value| r["late_jobs"].as_u64().expect("late");
        let min = rows
            .iter()
            .filter(|r| r["candidate"] == false)
            .map(late)
            .min()
            .expect("heuristics");
        let best_row = rows
            .iter()
            .find(|r| r["placement"] == best)
            .expect("best row");
        assert_eq!(
            late(best_row),
            min,
            "the best heuristic has the fewest late jobs"
        );
        // The opponent is the heuristic with the fewest late jobs on the
        // training days, which it lists.
        let training = b["training_late"].as_array().expect("training_late");
        assert_eq!(training.len(), 7, "{b}");
        let fewest = training
            .iter()
            .filter_map(|t| t[1].as_u64())
            .min()
            .expect("training late jobs");
        let opponent = b["opponent"].as_str().expect("opponent");
        let opp_training = training
            .iter()
            .find(|t| t[0] == opponent)
            .and_then(|t| t[1].as_u64());
        assert_eq!(opp_training, Some(fewest), "{b}");
    }
    let gates = v["gates"].as_array().expect("gates");
    assert_eq!(gates.len(), blocks.len());
    for g in gates {
        assert!(g["decision_us"].as_f64().is_some_and(|us| us > 0.0), "{g}");
    }
    // A repartitioning file is refused as a placement before any run.
    let shipped = smartmig::policy::onnx::shipped_policy(M).expect("shipped policy");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_smartmig"))
        .args(["bench", "placement", "--quick", "--placement"])
        .arg(format!("learned:{}", shipped.display()))
        .output()
        .expect("run smartmig");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("not a job-placement policy"),
        "{stderr}"
    );
}

/// A deferral rule (`sim::deferral`) is scored like a learned file: a gate
/// row against the opponent, marked a candidate, never chosen as the
/// opponent; a malformed rule is refused naming it, before any run.
#[test]
fn bench_placement_scores_a_deferral_rule() {
    let json = tmp("bench-rule.json");
    let stdout = bench_placement(
        &["--only", "campaigns/tight", "--placement", "cedf+rescue"],
        &json,
    );
    assert!(stdout.contains("cedf+rescue:0.5:3:6"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report")).expect("json");
    let gates = v["gates"].as_array().expect("gates");
    assert!(!gates.is_empty());
    for g in gates {
        assert_eq!(g["placement"], "cedf+rescue:0.5:3:6", "{g}");
        assert_ne!(g["opponent"], g["placement"], "{g}");
    }
    for b in v["scenarios"][0]["blocks"].as_array().expect("blocks") {
        let rows = b["rows"].as_array().expect("rows");
        let rule = rows
            .iter()
            .find(|r| r["placement"] == "cedf+rescue:0.5:3:6")
            .expect("the rule's row");
        assert_eq!(rule["candidate"], true, "{rule}");
        assert_eq!(
            rows.iter().filter(|r| r["candidate"] == false).count(),
            7,
            "the seven heuristics"
        );
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_smartmig"))
        .args([
            "bench",
            "placement",
            "--quick",
            "--placement",
            "cedf+rescue:x",
        ])
        .output()
        .expect("run smartmig");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("`x` is not a number"),
        "{stderr}"
    );
}
