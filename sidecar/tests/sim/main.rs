//! The simulator and the MIG geometry: properties, scenarios, OOM and early restarts, the
//! Slurm-like baseline, throughput, coordination, and the fuzz targets' kept inputs.
//!
//! One test binary per theme (fewer binaries to link, each with candle,
//! tokio and ONNX Runtime): each module is what was once a test file of
//! its own, under the same name.

mod common;
mod fuzz_regressions;
mod geometry_props;
mod sim_coordination;
mod sim_gang;
mod sim_on_demand;
mod sim_oom;
mod sim_props;
mod sim_scenarios;
mod sim_slurm_like;
mod sim_throughput;
