//! # smartmig
//!
//! Dynamic NVIDIA MIG partitioning for Slurm clusters.
//!
//! The crate is a *functional core* with an *imperative shell*:
//!
//! | module       | what it holds                                                        | IO? |
//! |--------------|----------------------------------------------------------------------|-----|
//! | [`mig`]      | GPU models, MIG profiles, layouts, placement and transitions         | no  |
//! | [`workload`] | jobs, speed-up curves, power model, generators and trace readers     | readers only |
//! | [`sim`]      | the discrete-event cluster simulator and job-placement heuristics    | no  |
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
