//! # smartmig-learn
//!
//! Training the learned repartitioning policy (SMART-MIG style mean-field
//! multi-agent actor-critic) on the simulator, and exporting it to ONNX.
//!
//! - [`model`]: the shared-parameter actor-critic MLP (candle, CPU).
//! - [`export`]: the actor as an ONNX graph (onnx-rs), with its metadata.
//! - [`train`]: the environment loop, imitation warm start and PPO.
//!
//! `docs/policy.md` documents the formulation and how the shipped policy was
//! trained.

// The core crates under the names the modules use (`crate::policy::...`).
use smartmig_core::{policy, sim, workload};
use smartmig_mig as mig;

pub mod es;
pub mod export;
pub mod model;
pub mod oracle;
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
