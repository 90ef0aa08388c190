//! smartmigd end to end: a real daemon on a temporary socket (sim backend, or nvml over the NVML
//! emulator with `SMARTMIG_TEST_BACKEND=nvml`: scripts/test runs this binary both ways), and its crash test.
//!
//! One test binary per theme (fewer binaries to link, each with candle,
//! tokio and ONNX Runtime): each module is what was once a test file of
//! its own, under the same name.

#[path = "../daemon_common/mod.rs"]
mod daemon_common;

mod daemon_admin;
mod daemon_alloc;
mod daemon_auth;
mod daemon_bench;
mod daemon_burst;
mod daemon_dashboard;
mod daemon_health;
mod daemon_holds;
mod daemon_lend;
mod daemon_lifecycle;
mod daemon_memory;
mod daemon_observe;
mod daemon_placement;
mod daemon_plan;
mod daemon_protocol;
mod daemon_shadow;
mod reliability_crash;
