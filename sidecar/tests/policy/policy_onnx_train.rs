//! The trainer is deterministic given its seed: two short runs give the
//! same exported bytes, and the export loads (metadata checks included).

use smartmig::learn::train::{train, TrainConfig, TrainingData};
use smartmig::mig::GpuModel;
use smartmig::workload::{generate_diurnal, read_trace, write_csv, TraceFormat, TraceOptions};

fn tiny() -> TrainConfig {
    let mut cfg = TrainConfig {
        gpus: vec![3],
        hidden: 16,
        ..TrainConfig::default()
    };
    cfg.workload.horizon_s = 4.0 * 3600.0;
    cfg.imitation.episodes = 2;
    cfg.imitation.epochs = 2;
    cfg.ppo.iterations = 2;
    cfg.ppo.episodes_per_iteration = 1;
    cfg.ppo.epochs = 1;
    cfg.validation.gpus = 3;
    cfg.validation.days = 1;
    cfg.validation.every = 1;
    cfg
}

#[test]
fn training_is_deterministic_given_the_seed() {
    let mut cfg = tiny();
    // Two ES iterations (2 pairs, 1 day): its two threads must not make
    // the result depend on scheduling.
    cfg.es.iterations = 2;
    cfg.es.pairs = 2;
    cfg.es.days = 1;
    let (a, ra) = train(&cfg, &TrainingData::Diurnal, |_| {}).expect("train a");
    let (b, _) = train(&cfg, &TrainingData::Diurnal, |_| {}).expect("train b");
    let ea = a.export_onnx(&[]).expect("export a");
    let eb = b.export_onnx(&[]).expect("export b");
    assert_eq!(ea, eb, "same seed, same weights");
    // 2 imitation + 2 PPO episodes, then 2 x (2 pairs x 2 signs x 1 day).
    assert_eq!(ra.episodes, 12);
    assert!(ra.validation_static_best_et.is_some());
    assert_eq!(cfg.gpu_model, GpuModel::A100_40gb);
}

#[test]
fn bad_configs_are_refused() {
    let mut cfg = tiny();
    cfg.local_weight = 2.0;
    assert!(train(&cfg, &TrainingData::Diurnal, |_| {}).is_err());
    // An unknown teacher base is refused when the config is read, naming the field.
    let err =
        toml::from_str::<TrainConfig>("teacher_base = \"oracle\"\n").expect_err("bad teacher base");
    assert!(
        err.to_string().contains("teacher_base") && err.to_string().contains("twice-daily"),
        "{err}"
    );
    let cfg: Result<TrainConfig, _> = toml::from_str("gpu_model = \"a100-40gb\"\nunknown = 1\n");
    assert!(cfg.is_err(), "unknown keys are errors");
}

#[test]
fn shipped_training_config_parses() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/train.toml");
    let text = std::fs::read_to_string(path).expect("etc/train.toml");
    let cfg: TrainConfig = toml::from_str(&text).expect("parse etc/train.toml");
    cfg.validate().expect("valid etc/train.toml");
}

/// `train --trace`: a three-day workload written as a CSV trace file and
/// read back is cut into 4 h windows; the last usable one validates, the
/// others train, and the windows are what the episodes run on.
#[test]
fn trains_on_trace_windows() {
    let mut cfg = tiny();
    let mut w = cfg.workload.clone();
    w.horizon_s = 3.0 * 86_400.0;
    let jobs = generate_diurnal(&w, cfg.gpu_model, 3, 11);
    let dir = std::env::temp_dir().join(format!("smartmig-train-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.csv");
    let mut file = std::fs::File::create(&path).unwrap();
    write_csv(&jobs, &mut file).unwrap();
    drop(file);
    let trace = read_trace(
        TraceFormat::Csv,
        std::fs::File::open(&path).unwrap(),
        &TraceOptions::new(cfg.gpu_model),
    )
    .unwrap();
    assert_eq!(trace.jobs.len(), jobs.len());

    let data =
        TrainingData::from_trace(&cfg, &trace, 4.0 * 3600.0, "test trace".into()).expect("windows");
    let TrainingData::Trace {
        train: windows,
        validation,
        ..
    } = &data
    else {
        panic!("not trace data")
    };
    assert_eq!(validation.len(), 1);
    assert!(windows.len() >= 2, "{} training windows", windows.len());
    for w in windows.iter().chain(validation) {
        assert!(w
            .iter()
            .all(|j| j.arrival >= 0.0 && j.arrival < 4.0 * 3600.0));
    }
    assert!(data.describe(&cfg).contains("test trace"));
    let (net, report) = train(&cfg, &data, |_| {}).expect("train on the trace");
    assert_eq!(report.episodes, 4);
    assert!(report.validation_et.is_some());
    net.export_onnx(&[]).expect("export");

    // Too few usable windows, and a nonsense window length: clear errors.
    cfg.validation.days = 1000;
    let err = TrainingData::from_trace(&cfg, &trace, 4.0 * 3600.0, "t".into())
        .expect_err("not enough windows");
    assert!(err.to_string().contains("validation.days = 1000"), "{err}");
    let err = TrainingData::from_trace(&tiny(), &trace, 0.0, "t".into()).expect_err("zero window");
    assert!(err.to_string().contains("window"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
