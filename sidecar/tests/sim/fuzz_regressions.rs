//! Replays fuzz inputs on stable through the same checks the libFuzzer
//! targets run (`fuzz/harness.rs`): every file under `fuzz/seeds/<target>/`
//! (the seed inputs the fuzzer starts from, and crashing inputs found by
//! fuzzing, kept there after the fix). See docs/reliability.md.

#[path = "../../../fuzz/harness.rs"]
mod harness;

use smartmig::workload::trace::TraceFormat;

fn replay(target: &str, check: impl Fn(&[u8]) + std::panic::RefUnwindSafe) -> usize {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target);
    let mut n = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let bytes = std::fs::read(&path).unwrap();
        let r = std::panic::catch_unwind(|| check(&bytes));
        assert!(
            r.is_ok(),
            "{target}: input {} fails its check",
            path.display()
        );
        n += 1;
    }
    assert!(n > 0, "no inputs in {}", dir.display());
    n
}

#[test]
fn protocol_inputs() {
    replay("protocol", harness::protocol);
}

#[test]
fn config_inputs() {
    replay("config", harness::config);
}

#[test]
fn trace_csv_inputs() {
    replay("trace_csv", |d| harness::trace(TraceFormat::Csv, d));
}

#[test]
fn trace_alibaba_inputs() {
    replay("trace_alibaba", |d| harness::trace(TraceFormat::Alibaba, d));
}

#[test]
fn trace_sacct_inputs() {
    replay("trace_sacct", |d| harness::trace(TraceFormat::Sacct, d));
}
