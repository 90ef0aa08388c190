//! # smartmig-learn
//!
//! Training the learned repartitioning policy (SMART-MIG style mean-field
//! multi-agent actor-critic) on the simulator, and exporting it to ONNX.
//!
//! - [`model`]: the shared-parameter actor-critic MLP (candle, CPU).
//! - [`config`]: the training configuration (`etc/train.toml`).
//! - [`data`]: the days episodes run on (diurnal days or trace windows).
//! - `reward`: energy and tardiness per decision epoch from the event log.
//! - [`teacher`]: the imitation teacher and the layout searches it rests on.
//! - [`start`]: fitted starts (`start = "fitted"`): the static layout
//!   fitted on each scenario's past days, where its days begin.
//! - [`rollout`]: episodes on the simulator, GAE, the deterministic policy.
//! - [`ppo`]: the imitation and PPO updates.
//! - [`es`]: evolution-strategies fine-tuning of the actor.
//! - `checkpoint`: the best network by validation.
//! - [`train`]: the whole run (imitation, PPO, ES, checkpoint choice).
//! - [`export`]: the actor as an ONNX graph (onnx-rs), with its metadata.
//! - [`ensemble`]: exported actors read back and merged into one that
//!   acts on the mean of their logits (`smartmig train --merge`).
//! - [`oracle`]: the hindsight rollout oracle (`smartmig bench oracle`).
//! - [`placement`]: the learned job placement (masked PPO over the
//!   simulator's placement decisions), its config and its episodes.
//!
//! The trainer's modules are layered: `config` -> `data` -> `start` -> `teacher` ->
//! `rollout` (with `reward`) -> `ppo`/`es` -> `train`, each importing only
//! modules before it; no module here imports `train`, whose re-exports keep
//! the paths callers used before the split (`learn::train::TrainConfig`, ...).
//!
//! `docs/policy.md` documents the formulation and how the shipped policy was
//! trained.

#![forbid(unsafe_code)]
// The house rule: no function over 100 lines (clippy counts the lines of code).
#![warn(clippy::too_many_lines)]

// The core crates under the names the modules use (`crate::policy::...`).
use smartmig_core::{formats, policy, sim, workload};
use smartmig_lab::{eval, scenario};
use smartmig_mig as mig;

mod checkpoint;
pub mod config;
pub mod data;
pub mod ensemble;
pub mod es;
pub mod export;
pub mod model;
pub mod oracle;
pub mod placement;
pub mod planner;
pub mod ppo;
mod reward;
pub mod rollout;
pub mod start;
pub mod teacher;
#[cfg(test)]
mod testing;
pub mod train;

/// Errors of training and export.
#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    #[error("tensor computation: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("simulation: {0}")]
    Sim(#[from] crate::sim::SimError),
    #[error("invalid training config: {0}")]
    Config(String),
    #[error("{0}")]
    Other(String),
}
