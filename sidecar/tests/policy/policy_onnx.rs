//! The learned policy through ONNX Runtime: the exported graph computes what
//! candle computes (to 1e-5), metadata checks refuse mismatched policies, and
//! the shipped policy loads and only proposes acceptable layouts.
//!
//! These tests need the ONNX Runtime library: `scripts/fetch-onnxruntime`
//! (run by `scripts/test`) or `ORT_DYLIB_PATH`. Without it they FAIL with
//! "ONNX Runtime not found: run scripts/fetch-onnxruntime or set
//! ORT_DYLIB_PATH".

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use smartmig::formats::policy_file::{MetadataError, PolicyMetadata, POLICY_KEY};
use smartmig::learn::model::ActorCritic;
use smartmig::mig::{Geometry, GpuModel};
use smartmig::policy::features::{
    Encoder, FeatureSpec, FEATURE_SPEC_VERSION, SUPPORTED_FEATURE_SPECS,
};
use smartmig::policy::onnx::{load_policy, PolicyLoadError};
use smartmig::policy::{ClusterView, GpuStatus, PendingByProfile, RepartitionPolicy};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("smartmig-policy-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// Writes `net` with metadata `meta` to `path`.
fn write_policy(path: &Path, net: &ActorCritic, meta: &PolicyMetadata) {
    let json = serde_json::to_string(meta).expect("metadata json");
    let bytes = net
        .export_onnx(&[(POLICY_KEY, json.as_str())])
        .expect("export");
    std::fs::write(path, bytes).expect("write policy");
}

fn a100_net(seed: u64) -> (FeatureSpec, ActorCritic) {
    let spec = FeatureSpec::new(GpuModel::A100_40gb);
    let net = ActorCritic::new(spec.obs_dim, spec.actions, 64, seed).expect("net");
    (spec, net)
}

#[test]
fn candle_and_onnx_runtime_agree_to_1e5() {
    let (spec, net) = a100_net(42);
    let path = tmp("agree.onnx");
    write_policy(&path, &net, &PolicyMetadata::new(&spec, 64));
    let mut policy = load_policy(&path, GpuModel::A100_40gb).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for rows in [1usize, 7, 64, 300] {
        // Observations in a wider range than the encoder produces, so
        // the hidden units are exercised; random masks with "keep" on.
        let obs: Vec<f32> = (0..rows * spec.obs_dim)
            .map(|_| rng.random_range(-2.0f32..2.0))
            .collect();
        let mask: Vec<f32> = (0..rows * spec.actions)
            .map(|i| {
                if i % spec.actions == spec.keep_action() || rng.random_bool(0.5) {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        let (cl, cp) = net.act(&obs, &mask, rows).expect("candle forward");
        let (ol, op) = policy.infer(&obs, &mask, rows).expect("ort run");
        assert_eq!(cp.len(), op.len());
        let mut worst = 0.0f32;
        for i in 0..cp.len() {
            worst = worst.max((cp[i] - op[i]).abs());
            if mask[i] > 0.5 {
                worst = worst.max((cl[i] - ol[i]).abs());
            } else {
                assert_eq!(op[i], 0.0, "masked action has probability 0");
                assert!(ol[i] < -1e8, "masked logit is penalised");
            }
        }
        assert!(worst <= 1e-5, "rows {rows}: max |candle - ort| = {worst}");
    }
}

#[test]
fn metadata_mismatches_are_refused_with_clear_messages() {
    let (spec, net) = a100_net(1);
    let good = PolicyMetadata::new(&spec, 64);

    let path = tmp("model.onnx");
    write_policy(&path, &net, &good);
    let err = load_policy(&path, GpuModel::H100_80gb).expect_err("wrong model");
    assert!(
        matches!(
            err,
            PolicyLoadError::Metadata(MetadataError::ModelMismatch { .. })
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("a100-40gb") && msg.contains("h100-80gb"),
        "{msg}"
    );

    let mut old = good.clone();
    old.feature_spec_version = FEATURE_SPEC_VERSION + 1;
    let path = tmp("spec.onnx");
    write_policy(&path, &net, &old);
    let err = load_policy(&path, GpuModel::A100_40gb).expect_err("wrong spec");
    assert!(
        matches!(
            err,
            PolicyLoadError::Metadata(MetadataError::FeatureSpecMismatch { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("feature spec version"), "{err}");

    // A version 1 file is still run, with version 1's sizes: a network of
    // the current sizes that claims version 1 is refused.
    let mut v1 = good.clone();
    v1.feature_spec_version = 1;
    let path = tmp("v1-sizes.onnx");
    write_policy(&path, &net, &v1);
    let err = load_policy(&path, GpuModel::A100_40gb).expect_err("v1 with v2 sizes");
    assert!(
        matches!(
            err,
            PolicyLoadError::Metadata(MetadataError::SpaceMismatch { .. })
        ),
        "{err}"
    );

    let mut catalog = good.clone();
    catalog.catalog.swap(1, 2);
    let path = tmp("catalog.onnx");
    write_policy(&path, &net, &catalog);
    let err = load_policy(&path, GpuModel::A100_40gb).expect_err("wrong catalog");
    assert!(
        matches!(
            err,
            PolicyLoadError::Metadata(MetadataError::SpaceMismatch { .. })
        ),
        "{err}"
    );

    let path = tmp("garbage.onnx");
    std::fs::write(&path, b"not an onnx file").expect("write");
    let err = load_policy(&path, GpuModel::A100_40gb).expect_err("garbage");
    assert!(
        matches!(
            err,
            PolicyLoadError::Metadata(
                MetadataError::Parse { .. } | MetadataError::MissingMetadata { .. }
            )
        ),
        "{err}"
    );

    let err = load_policy(&tmp("missing.onnx"), GpuModel::A100_40gb).expect_err("missing");
    assert!(
        matches!(err, PolicyLoadError::Metadata(MetadataError::Io { .. })),
        "{err}"
    );
}

/// A small busy cluster: some GPUs partitioned and running, one
/// reconfiguring, a queue of jobs.
fn scenario() -> (Vec<GpuStatus>, PendingByProfile) {
    scenario_on(GpuModel::A100_40gb)
}

/// [`scenario`] on GPUs of `model`.
fn scenario_on(model: GpuModel) -> (Vec<GpuStatus>, PendingByProfile) {
    let g = Geometry::of(model);
    let mut gpus = Vec::new();
    for i in 0..12 {
        let layout = g.catalog()[i % g.catalog().len()];
        let mut st = GpuStatus::new(model, layout);
        if i % 3 == 1 {
            let id = layout.iter().next().expect("non-empty layout");
            st.busy = st.busy.with(id);
            st.busy_until[id.0 as usize] = 500.0 + i as f64;
        }
        if i == 5 {
            st.in_reconfiguration = true;
            st.reconfig_until = 104.0;
        }
        gpus.push(st);
    }
    let mut by_profile = PendingByProfile::default();
    by_profile[model as usize][0] = 5;
    by_profile[model as usize][3] = 2;
    (gpus, by_profile)
}

/// The view of [`scenario`]'s cluster at 14:30.
fn view_of<'a>(gpus: &'a [GpuStatus], by_profile: &'a PendingByProfile) -> ClusterView<'a> {
    ClusterView {
        now: 100.0,
        hour_of_day: 14.5,
        gpus,
        pending: &[],
        pending_by_profile: by_profile,
        arrivals: &[],
    }
}

/// The default diurnal day (8 GPUs of `model`, seed 0) under the policy
/// `spec`: (reconfigurations, decisions the simulator rejected because
/// they would destroy a busy instance or hit a reconfiguring GPU).
fn simulated_day(spec: &str, model: GpuModel) -> (u64, u64) {
    use smartmig::policy::parse_policy;
    use smartmig::sim::{simulate, Heuristic, RunHooks, SimConfig};
    use smartmig::workload::{generate_diurnal, DiurnalConfig};

    let cluster = vec![model; 8];
    let wl = DiurnalConfig::default();
    let jobs = generate_diurnal(&wl, model, cluster.len(), 0);
    let mut p = parse_policy(spec, &cluster).unwrap_or_else(|e| panic!("{e}"));
    let mut h = Heuristic::Edf.build(0);
    let cfg = SimConfig {
        workload_horizon_s: Some(wl.horizon_s),
        start_hour: wl.start_hour,
        // The policy's own moves, with jobs waiting for them.
        serve_on_demand: false,
        ..SimConfig::default()
    };
    let m = simulate(
        &cluster,
        &jobs,
        h.as_mut(),
        p.as_mut(),
        &cfg,
        RunHooks::default(),
    )
    .unwrap()
    .metrics;
    // The policy's own moves: the instances built on demand for jobs at
    // their allocate (issue 54) are smartmigd's, not the policy's.
    (
        m.reconfigurations - m.on_demand_builds,
        m.rejected_decisions,
    )
}

/// `policy:FILE?serve=MODEL`: the shipped H100-80GB policy acts on B200s
/// (the same slice geometry) and proposes only layouts they accept; it
/// cannot serve a four-slice RTX PRO 6000, which the A30's policy can.
#[test]
fn a_policy_serves_models_of_its_geometry_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let h100 = root.join("policies/h100-80gb.onnx");
    let spec = |model: &str| format!("policy:{}?serve={model}", h100.display());
    let mut policy = smartmig::policy::parse_policy(&spec("b200"), &[GpuModel::B200_180gb])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        policy.name().ends_with("(serving b200-180gb)"),
        "{}",
        policy.name()
    );
    let (gpus, by_profile) = scenario_on(GpuModel::B200_180gb);
    let view = view_of(&gpus, &by_profile);
    for d in &policy.decide(&view) {
        assert!(gpus[d.gpu].accepts(d.target), "{d:?} would be rejected");
    }
    // A whole day on B200s: it moves, and the simulator rejects nothing.
    let (moves, rejected) = simulated_day(&spec("b200"), GpuModel::B200_180gb);
    assert!(moves > 0, "the served policy never moved on a B200 day");
    assert_eq!(rejected, 0, "{rejected} decisions rejected on B200s");
    // Without serve= the policy has no GPU of its model here.
    let plain = format!("policy:{}", h100.display());
    let err = smartmig::policy::parse_policy(&plain, &[GpuModel::B200_180gb])
        .err()
        .expect("no H100 in the cluster")
        .to_string();
    assert!(err.contains("?serve=MODEL"), "{err}");
    let err = smartmig::policy::parse_policy(&spec("rtx-pro-6000"), &[GpuModel::RtxPro6000_96gb])
        .err()
        .expect("another geometry")
        .to_string();
    assert!(err.contains("slice geometry"), "{err}");
    let a30 = root.join("policies/a30-24gb.onnx");
    let rtx = format!("policy:{}?serve=rtx-pro-6000-96gb", a30.display());
    smartmig::policy::parse_policy(&rtx, &[GpuModel::RtxPro6000_96gb])
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn shipped_policy_loads_and_proposes_only_acceptable_layouts() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/a100-40gb.onnx");
    let mut policy = load_policy(&path, GpuModel::A100_40gb).unwrap_or_else(|e| panic!("{e}"));
    let meta = policy.metadata().clone();
    assert_eq!(meta.gpu_model, GpuModel::A100_40gb);
    // Shipped files may be of an older spec this build still runs.
    assert!(
        SUPPORTED_FEATURE_SPECS.contains(&meta.feature_spec_version),
        "{}",
        meta.feature_spec_version
    );
    let (gpus, by_profile) = scenario();
    let view = view_of(&gpus, &by_profile);
    let decisions = policy.decide(&view);
    // The shipped ensemble moves rarely (it keeps a layout unless its
    // members agree): this view may give no decision, so a whole day
    // below checks that it moves and that nothing it asks is rejected.
    for d in &decisions {
        assert!(
            !gpus[d.gpu].in_reconfiguration,
            "{d:?}: GPU is reconfiguring"
        );
        assert!(gpus[d.gpu].accepts(d.target), "{d:?} would be rejected");
        assert_ne!(gpus[d.gpu].layout, d.target, "no-op decision {d:?}");
    }
    // The encoder is what the policy saw: same sizes as the metadata.
    let mut enc = Encoder::for_spec(FeatureSpec::with_version(
        GpuModel::A100_40gb,
        meta.feature_spec_version,
    ));
    enc.encode(&view);
    assert_eq!(enc.obs.len(), gpus.len() * meta.obs_dim);
    assert_eq!(policy.failures, 0);
    for model in [GpuModel::A100_40gb, GpuModel::H100_80gb, GpuModel::A30_24gb] {
        let file =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../policies/{}.onnx", model.id()));
        let (moves, rejected) = simulated_day(&format!("policy:{}", file.display()), model);
        assert!(
            moves > 0,
            "{model}: the shipped policy never moved on the default day"
        );
        assert_eq!(rejected, 0, "{model}: {rejected} decisions rejected");
    }
}

#[test]
fn shipped_metadata_json_matches_the_embedded_copy() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for model in [GpuModel::A100_40gb, GpuModel::H100_80gb, GpuModel::A30_24gb] {
        let onnx = root.join(format!("policies/{}.onnx", model.id()));
        let (embedded, _) = smartmig::policy::onnx::read_metadata(&onnx, Some(model))
            .unwrap_or_else(|e| panic!("{e}"));
        let json = root.join(format!("policies/{}.json", model.id()));
        let text = std::fs::read_to_string(&json).expect("json");
        let file: PolicyMetadata = serde_json::from_str(&text).expect("parse json");
        assert_eq!(file, embedded, "{}", json.display());
        // And ONNX Runtime accepts it for its model.
        load_policy(&onnx, model).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// `smartmig bench policy --json`: the quality-gate benchmark runs end to
/// end on the shipped policy (a small cluster to keep it short) and writes
/// every table, the oracle's ET and the latencies.
#[test]
fn bench_policy_writes_its_report() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let json = tmp("bench-policy.json");
    let args = smartmig::cli::bench_policy::PolicyArgs {
        policy: root.join("policies/a100-40gb.onnx"),
        gpus: 3,
        seed: 4,
        placement: "edf".into(),
        trace: None,
        trace_format: "alibaba".into(),
        oracle: true,
        json: smartmig::cli::args::JsonArg {
            json: Some(json.clone()),
        },
        latency_gpus: vec![8, 64],
    };
    smartmig::cli::bench_policy::run(&args).expect("bench policy");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["day"]["rows"].as_array().expect("rows");
    for name in [
        "none",
        "static-hist",
        "twice-daily-hist",
        "static-hindsight",
        "twice-daily-hindsight",
        "greedy",
    ] {
        assert!(rows.iter().any(|r| r["policy"] == name), "{name} missing");
    }
    let learned = rows
        .iter()
        .find(|r| {
            r["policy"]
                .as_str()
                .is_some_and(|p| p.starts_with("policy:"))
        })
        .expect("learned row");
    assert!(learned["et"].as_f64().is_some_and(f64::is_finite));
    assert!(v["oracle_et"]
        .as_f64()
        .is_some_and(|e| e.is_finite() && e > 0.0));
    let lat = v["latency"].as_array().unwrap();
    assert_eq!(lat.len(), 2);
    assert_eq!(lat[1]["gpus"], 64);
    assert!(lat[1]["per_gpu_us"].as_f64().unwrap() > 0.0);
    std::fs::remove_file(&json).ok();
}

/// The guard ("do no harm") in the spec: a budget of one reconfiguration
/// per GPU per day holds on a whole simulated day where the unguarded
/// policy moves more, `min_confidence=1` stops nearly every move, and a
/// bad override is refused naming the key.
#[test]
fn the_guard_bounds_reconfigurations() {
    use smartmig::policy::parse_policy;

    // An untrained network moves often, so a budget of one move a day
    // binds (the shipped ensemble moves a few times a day and would not).
    let (spec, net) = a100_net(21);
    let path = tmp("guarded.onnx");
    write_policy(&path, &net, &PolicyMetadata::new(&spec, 64));
    let cluster = vec![GpuModel::A100_40gb; 8];
    let reconfigurations = |query: &str| {
        let spec = format!("policy:{}{query}", path.display());
        simulated_day(&spec, GpuModel::A100_40gb).0
    };
    let free = reconfigurations("");
    let budget = reconfigurations("?max_reconfigurations_per_day=1");
    // The day lasts a little over 24 h: at most two moves per GPU.
    assert!(
        budget <= 2 * cluster.len() as u64,
        "{budget} with a budget of 1/day"
    );
    assert!(
        free > budget,
        "unguarded {free} vs guarded {budget}: the test cannot fail"
    );
    assert!(reconfigurations("?min_confidence=1") < free);
    let err = parse_policy(&format!("policy:{}?colour=red", path.display()), &cluster)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("unknown guard `colour`"), "{err}");
}

/// `smartmig train --merge`: the merged file loads as an ordinary policy
/// and ONNX Runtime computes the mean of its members' logits; members of
/// another model are refused by name and nothing is written.
#[test]
fn a_merged_ensemble_acts_on_the_mean_of_its_members_logits() {
    let (spec, a) = a100_net(11);
    let (_, b) = a100_net(12);
    let meta = PolicyMetadata::new(&spec, 64);
    let (pa, pb, merged) = (
        tmp("member-a.onnx"),
        tmp("member-b.onnx"),
        tmp("merged.onnx"),
    );
    write_policy(&pa, &a, &meta);
    write_policy(&pb, &b, &meta);
    let members = format!("{},{}", pa.display(), pb.display());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_smartmig"))
        .args(["train", "--merge", &members, "--out"])
        .arg(&merged)
        .output()
        .expect("run smartmig");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut ens = load_policy(&merged, GpuModel::A100_40gb).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ens.metadata().hidden, 128);
    let mut pa_ = load_policy(&pa, GpuModel::A100_40gb).unwrap_or_else(|e| panic!("{e}"));
    let mut pb_ = load_policy(&pb, GpuModel::A100_40gb).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let rows = 32;
    let obs: Vec<f32> = (0..rows * spec.obs_dim)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect();
    let mask = vec![1.0f32; rows * spec.actions];
    let (le, _) = ens.infer(&obs, &mask, rows).expect("merged");
    let (la, _) = pa_.infer(&obs, &mask, rows).expect("member a");
    let (lb, _) = pb_.infer(&obs, &mask, rows).expect("member b");
    for i in 0..le.len() {
        let mean = (la[i] + lb[i]) / 2.0;
        assert!(
            (le[i] - mean).abs() < 1e-4,
            "logit {i}: {} vs {mean}",
            le[i]
        );
    }
    // A member of another model: refused, naming it; nothing written.
    let h100_spec = FeatureSpec::new(GpuModel::H100_80gb);
    let h100 = ActorCritic::new(h100_spec.obs_dim, h100_spec.actions, 64, 3).expect("net");
    let ph = tmp("member-h100.onnx");
    write_policy(&ph, &h100, &PolicyMetadata::new(&h100_spec, 64));
    let refused = tmp("refused.onnx");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_smartmig"))
        .args([
            "train",
            "--merge",
            &format!("{},{}", pa.display(), ph.display()),
            "--out",
        ])
        .arg(&refused)
        .output()
        .expect("run smartmig");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("member-h100.onnx does not fit") && err.contains("h100-80gb"),
        "{err}"
    );
    assert!(!refused.exists());
}
