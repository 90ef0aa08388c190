//! Small configs, days and networks for the unit tests of `learn`: three
//! GPUs, a three-hour afternoon, a narrow network, so each test runs in
//! well under a second in release mode.

use super::config::TrainConfig;
use super::data::Day;
use super::model::ActorCritic;
use crate::policy::features::FeatureSpec;

/// Three GPUs, hidden width 8, a three-hour day from noon.
pub fn tiny() -> TrainConfig {
    let mut cfg = TrainConfig {
        gpus: vec![3],
        hidden: 8,
        ..TrainConfig::default()
    };
    cfg.workload.horizon_s = 3.0 * 3600.0;
    cfg.workload.start_hour = 12.0;
    cfg
}

/// A day of [`tiny`] on three GPUs.
pub fn day(cfg: &TrainConfig, seed: u64) -> Day {
    Day::new(cfg, 3, seed).expect("tiny day")
}

/// A fresh network for `cfg`'s model.
pub fn net(cfg: &TrainConfig, seed: u64) -> ActorCritic {
    let spec = FeatureSpec::new(cfg.gpu_model);
    ActorCritic::new(spec.obs_dim, spec.actions, cfg.hidden, seed).expect("network")
}
