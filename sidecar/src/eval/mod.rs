//! The yardstick: how a repartitioning policy is judged against what a site
//! would run without it (`docs/evaluation.md` gives every definition and
//! the reasons).
//!
//! - [`days`]: a set of simulated days (jobs + run settings) with their
//!   `none` (whole-GPU) reference runs, and the search objective over them.
//! - [`baselines`]: the fixed competitors, fitted *causally* on training
//!   days and applied unchanged to the scored day (the opponents), or in
//!   hindsight on the scored day itself (references only).
//! - [`score`]: per-day results and their aggregate (energy and tardiness
//!   on their own, ET with an exchange rate fixed by the training days, the
//!   worst day, standard HPC metrics).
//! - [`suite`]: scenarios x test days x policies, the engine of
//!   `smartmig bench suite`.
//!
//! Everything here is pure computation over the simulator (no IO): the CLI
//! prints, plots and writes files.

pub mod baselines;
pub mod days;
pub mod score;
pub mod suite;

pub use baselines::{fit, Fitted};
pub use days::{search_score, Day, DaySet};
pub use score::{DayScore, PolicyRow, Reference, RowKind};
pub use suite::{run_scenario, ScenarioDays, ScenarioResult, SuiteConfig, SuiteReport};
