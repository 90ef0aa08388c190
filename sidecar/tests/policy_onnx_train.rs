//! The trainer is deterministic given its seed: two short runs give the
//! same exported bytes, and the export loads (metadata checks included).

use smartmig::learn::train::{train, TrainConfig};
use smartmig::mig::GpuModel;

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
    let cfg = tiny();
    let (a, ra) = train(&cfg, |_| {}).expect("train a");
    let (b, _) = train(&cfg, |_| {}).expect("train b");
    let ea = a.export_onnx(&[]).expect("export a");
    let eb = b.export_onnx(&[]).expect("export b");
    assert_eq!(ea, eb, "same seed, same weights");
    assert_eq!(ra.episodes, 4);
    assert!(ra.validation_static_best_et.is_some());
    assert_eq!(cfg.gpu_model, GpuModel::A100_40gb);
}

#[test]
fn bad_configs_are_refused() {
    let mut cfg = tiny();
    cfg.local_weight = 2.0;
    assert!(train(&cfg, |_| {}).is_err());
    let mut cfg = tiny();
    cfg.teacher_base = "oracle".into();
    let err = train(&cfg, |_| {}).expect_err("bad teacher base");
    assert!(err.to_string().contains("teacher_base"), "{err}");
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
