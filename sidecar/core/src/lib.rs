//! # smartmig-core
//!
//! The core of smartmig: everything that decides and simulates, with no
//! sockets, no Slurm and no hardware. The daemon (`smartmig-daemon`), the
//! lab (`smartmig-lab`: the yardstick, studies, bounds and reports) and the
//! trainer (`smartmig-learn`) all call this crate, so a scheduling decision
//! measured in simulation is the decision the daemon makes.
//!
//! | module       | what it holds                                                        | IO? |
//! |--------------|----------------------------------------------------------------------|-----|
//! | [`mig`]      | GPU models, MIG profiles, layouts, placement and transitions (crate `smartmig-mig`) | no  |
//! | [`workload`] | jobs, speed-up curves, power model, generators, scenarios, load, trace readers | readers take `impl Read` |
//! | [`policy`]   | the repartitioning trait and policies (fixed, greedy, searches, learned via ONNX) | `onnx` loads a model file |
//! | [`sim`]      | the discrete-event cluster simulator, placement heuristics, event log and audit, the lookahead of a node's plans | no  |
//! | [`formats`]  | the files smartmig writes and reads back (advice log, journal, policy files), versioned | `policy_file::read` |
//!
//! Layering inside the crate: `mig` -> `formats` -> `workload` -> `policy`
//! -> `sim`; `docs/architecture.md` is the map.

#![forbid(unsafe_code)]
// The house rule: no function over 100 lines (clippy counts the lines of code).
#![warn(clippy::too_many_lines)]

pub use smartmig_mig as mig;

pub mod formats;
pub mod policy;
pub mod sim;
pub mod workload;
