//! # smartmig-lab
//!
//! The lab: how smartmig's scheduling claims are measured, above the
//! simulator core (`smartmig-core`). Nothing here runs on a node: smartmigd
//! and the SPANK plugin do not depend on this crate.
//!
//! | module       | what it holds                                                        |
//! |--------------|----------------------------------------------------------------------|
//! | [`scenario`] | the yardstick's scenario families (mix shift, campaigns, big night jobs, batch) and their file |
//! | [`bound`]    | lower bounds on energy and tardiness, and the brute-force test oracle |
//! | [`eval`]     | the yardstick (days, fitted opponents, scores, gates, fallbacks, the suite), the finished studies (placement, throughput, coordination) and advise mode's replay |
//! | [`report`]   | comparison and suite tables, time series, SVG plots, the advise report |
//!
//! Layering: `scenario` -> `bound` -> `eval` -> `report`, over the core's
//! `workload`, `policy` and `sim`; `docs/architecture.md` is the map.

#![forbid(unsafe_code)]
// The house rule: no function over 100 lines (clippy counts the lines of code);
// the unit tests are exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

// The core's modules under the names the lab's modules use
// (`crate::sim::...`), as when they lived in the core.
use smartmig_core::{formats, policy, sim, workload};
use smartmig_mig as mig;

pub mod bound;
pub mod eval;
pub mod report;
pub mod scenario;
