//! `smartmig-mig`: MIG geometry, the pure, exact model of what the hardware
//! accepts. Imports nothing of smartmig (serde and thiserror only); the
//! `smartmig` crate re-exports it as `smartmig::mig`, and the SPANK plugin
//! uses it for profile names.
//!
//! - [`models`]: the one table of GPU models and profiles, with sources.
//! - [`driver`]: what a driver reports about a GPU's profiles, matched
//!   with the table by index, id and slices (never by name).
//! - [`profile`]: profile names in (driver and Slurm variants), profiles out;
//!   choosing the profile for K slices and M GB.
//! - [`layout`]: spots (NVIDIA's GPU instance *placements*: a profile at a
//!   start slot) and layouts (bit sets of spots).
//! - [`geometry`]: per-model rules, enumeration of valid and maximal layouts,
//!   the catalog used as the RL action space.
//! - [`spot`]: queries the daemon and simulator share (candidates,
//!   fragmentation-aware choice, reachable layouts, transitions, re-shaping).
//! - [`offer`]: how many free slices Slurm may offer next to busy instances
//!   (the rest is stranded and held, issue 42).
//! - `lua_tables` (tests only): checks that the copy of the tables in
//!   `etc/slurm/job_submit.lua` equals [`models`].
//!
//! No IO happens here; everything is deterministic.

#![forbid(unsafe_code)]
// The house rule: no function over 100 lines (clippy counts the lines of code).
#![warn(clippy::too_many_lines)]

pub mod driver;
pub mod geometry;
pub mod layout;
#[cfg(test)]
mod lua_tables;
pub mod models;
pub mod offer;
pub mod profile;
pub mod serve;
pub mod spot;

pub use driver::{match_driver, Difference, DriverMatch, DriverProfile};
pub use geometry::{slot_tree_id, Geometry, Headroom, LayoutError};
pub use layout::{InstanceDesc, Layout, Spot, SpotId};
pub use models::{
    GpuModel, ModelSpec, ProfileSpec, Provenance, Shape, Sources, UnknownModel, VariantKind,
    VariantSpec, MAX_PROFILES, MODELS,
};
pub use offer::{Mix, OfferPolicy, OfferRule, COLLISION_MEMORY_S};
pub use profile::{
    parse_profile, profile_size, requested_profile, select_profile, variant_meaning,
    ProfileParseError, RequestedProfileError, SelectError,
};
pub use serve::{GpuNow, Way};
pub use spot::Transition;
