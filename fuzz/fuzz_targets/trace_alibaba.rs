//! Fuzz target `trace_alibaba`: see `fuzz/harness.rs` for the checks and
//! `docs/reliability.md` for how to run it.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::trace(
    smartmig_core::workload::trace::TraceFormat::Alibaba,
    data
));
