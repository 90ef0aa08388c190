//! The lab: the yardstick, the suite, advise mode's report and the lower bounds.
//!
//! One test binary per theme (fewer binaries to link, each with candle,
//! tokio and ONNX Runtime): each module is what was once a test file of
//! its own, under the same name.

mod advise_report;
mod bound_valid;
mod eval_suite;
mod yardstick;
