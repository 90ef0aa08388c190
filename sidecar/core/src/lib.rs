//! # smartmig-core
//!
//! The pure core of smartmig: everything that decides, simulates and
//! measures, with no sockets, no Slurm and no hardware. The simulator, the
//! trainer (`smartmig-learn`) and the daemon (`smartmig-daemon`) all call
//! this crate, so a scheduling decision measured in simulation is the
//! decision the daemon makes.
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
//!
//! Layering inside the crate: `mig` -> `workload` -> `policy`/`bound` ->
//! `sim` -> `eval` -> `report`; `docs/architecture.md` is the map.

#![forbid(unsafe_code)]

pub use smartmig_mig as mig;

pub mod bound;
pub mod eval;
pub mod formats;
pub mod policy;
pub mod report;
pub mod sim;
pub mod workload;
