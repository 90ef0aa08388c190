//! # smartmig
//!
//! Dynamic NVIDIA MIG partitioning for Slurm clusters: the `smartmig` CLI
//! and the `smartmigd` daemon, over crates with one job each, re-exported
//! here under one name:
//!
//! | module       | crate              | what it holds                                                        | IO? |
//! |--------------|--------------------|----------------------------------------------------------------------|-----|
//! | [`mig`]      | `smartmig-mig`     | GPU models, MIG profiles, layouts, placement and transitions | no  |
//! | [`workload`] | `smartmig-core`    | jobs, speed-up curves, power model, generators, scenarios, load, trace readers | readers take `impl Read` |
//! | [`policy`]   | `smartmig-core`    | the repartitioning trait and policies (fixed, greedy, searches, learned via ONNX) | `onnx` loads a model file |
//! | [`bound`]    | `smartmig-core`    | lower bounds on energy and tardiness                                 | no  |
//! | [`sim`]      | `smartmig-core`    | the discrete-event cluster simulator, placement heuristics, event log and audit | no  |
//! | [`eval`]     | `smartmig-core`    | the yardstick: training/test days, causal and hindsight baselines, suite | no  |
//! | [`report`]   | `smartmig-core`    | comparison and suite tables, time series, SVG plots                  | no (returns text) |
//! | [`learn`]    | `smartmig-learn`   | the MF-MARL trainer, ES fine-tuning, ONNX export, hindsight oracle   | checkpoints |
//! | [`daemon`]   | `smartmig-daemon`  | smartmigd: config, allocation, backends, journal, Slurm, the tokio server (protocol and client from `smartmig-client`) | yes |
//! | [`cli`]      | this crate         | the `smartmig` subcommands (thin wrappers over the modules above)    | yes |
//!
//! `daemon` (and the commands that talk to smartmigd) and `learn` (and
//! `train`) are behind the default features `daemon` and `train`, so the
//! simulator alone builds quickly (`scripts/simulate-day`).
//!
//! `docs/architecture.md` is the map for newcomers.

#![forbid(unsafe_code)]

pub mod cli;
pub use smartmig_core::{bound, eval, formats, policy, report, sim, workload};
#[cfg(feature = "daemon")]
pub use smartmig_daemon as daemon;
#[cfg(feature = "train")]
pub use smartmig_learn as learn;
pub use smartmig_mig as mig;
