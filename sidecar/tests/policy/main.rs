//! Policies: the ONNX runner against candle, training, the policies' properties and the learned
//! job placement.
//!
//! One test binary per theme (fewer binaries to link, each with candle,
//! tokio and ONNX Runtime): each module is what was once a test file of
//! its own, under the same name.

mod placement_learned;
mod policy_onnx;
mod policy_onnx_train;
mod policy_props;
