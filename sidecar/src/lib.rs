//! # smartmig
//!
//! Dynamic NVIDIA MIG partitioning for Slurm clusters: the `smartmig` CLI,
//! over crates with one job each, re-exported here under one name (the
//! `smartmigd` binary is a package of its own, `sidecar/smartmigd`, over
//! the `daemon` crate alone):
//!
//! | module       | crate              | what it holds                                                        | IO? |
//! |--------------|--------------------|----------------------------------------------------------------------|-----|
//! | [`mig`]      | `smartmig-mig`     | GPU models, MIG profiles, layouts, placement and transitions | no  |
//! | [`formats`]  | `smartmig-core`    | the files smartmig writes and reads back, versioned (advice log, journal, policy files) | `policy_file::read` |
//! | [`workload`] | `smartmig-core`    | jobs, speed-up curves, power model, the diurnal generator, load, trace readers | readers take `impl Read` |
//! | [`policy`]   | `smartmig-core`    | the repartitioning trait and policies (fixed, greedy, searches, learned via ONNX) | `onnx` loads a model file |
//! | [`sim`]      | `smartmig-core`    | the discrete-event cluster simulator, placement heuristics, event log and audit, the plans' lookahead | no  |
//! | [`scenario`] | `smartmig-lab`     | the yardstick's scenario families                                    | no  |
//! | [`bound`]    | `smartmig-lab`     | lower bounds on energy and tardiness                                 | no  |
//! | [`eval`]     | `smartmig-lab`     | the yardstick (training/test days, causal and hindsight baselines, suite) and the studies | no  |
//! | [`report`]   | `smartmig-lab`     | comparison and suite tables, time series, SVG plots                  | no (returns text) |
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
// The house rule: no function over 100 lines (clippy counts the lines of code).
#![warn(clippy::too_many_lines)]

pub mod cli;
pub use smartmig_core::{formats, policy, sim, workload};
#[cfg(feature = "daemon")]
pub use smartmig_daemon as daemon;
pub use smartmig_lab::{bound, eval, report, scenario};
#[cfg(feature = "train")]
pub use smartmig_learn as learn;
pub use smartmig_mig as mig;
