//! # smartmig
//!
//! Dynamic NVIDIA MIG partitioning for Slurm clusters.
//!
//! The crate is a *functional core* with an *imperative shell*:
//!
//! | module       | what it holds                                                        | IO? |
//! |--------------|----------------------------------------------------------------------|-----|
//! | [`mig`]      | GPU models, MIG profiles, layouts, placement and transitions (crate `smartmig-mig`) | no  |
//! | [`workload`] | jobs, speed-up curves, power model, generators, scenarios, load, trace readers | readers take `impl Read` |
//! | [`policy`]   | the repartitioning trait and policies (fixed, greedy, searches, learned via ONNX) | `onnx` loads a model file |
//! | [`bound`]    | lower bounds on energy and tardiness                                 | no  |
//! | [`sim`]      | the discrete-event cluster simulator, placement heuristics, event log and audit | no  |
//! | [`eval`]     | the yardstick: training/test days, causal and hindsight baselines, suite | no  |
//! | [`report`]   | comparison and suite tables, time series, SVG plots                  | no (returns text) |
//! | [`learn`]    | the MF-MARL trainer, ES fine-tuning, ONNX export, hindsight oracle   | checkpoints |
//! | [`daemon`]   | smartmigd: config, allocation, backends, journal, Slurm, the tokio server | yes |
//! | [`cli`]      | the `smartmig` subcommands (thin wrappers over the modules above)    | yes |
//!
//! The simulator, the trainer and the daemon all call the same core, so a
//! scheduling decision measured in simulation is the decision the daemon makes.
//! `docs/architecture.md` is the map for newcomers.

pub mod bound;
pub mod cli;
pub mod daemon;
pub mod eval;
pub mod learn;
pub use smartmig_mig as mig;
pub mod policy;
pub mod report;
pub mod sim;
pub mod workload;
