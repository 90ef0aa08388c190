//! Reliability: bad input, the plugin's client against bad peers, faults and soak, the policies
//! under random states (docs/reliability.md), and `smartmig doctor`.
//!
//! One test binary per theme (fewer binaries to link, each with candle,
//! tokio and ONNX Runtime): each module is what was once a test file of
//! its own, under the same name.

#[path = "../daemon_common/mod.rs"]
mod daemon_common;

mod doctor;
mod reliability_bad_input;
mod reliability_client;
mod reliability_faults;
mod reliability_policies;
