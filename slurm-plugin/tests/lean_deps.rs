//! The SPANK plugin is loaded as root into every job's slurmstepd: it must
//! not link the daemon's stack. This test reads the plugin's normal
//! dependency tree with `cargo tree` and fails if one of the heavy crates
//! (async runtime, ML, ONNX Runtime, NVML, plotting) or the whole
//! `smartmig` library comes back.

use std::process::Command;

#[test]
fn the_plugin_links_no_daemon_stack() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-p",
            "smartmig-spank",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(crates.contains(&"smartmig-client"), "{tree}");
    for heavy in [
        "smartmig",
        "tokio",
        "candle-core",
        "candle-nn",
        "ort",
        "nvml-wrapper",
        "plotters",
        "prometheus-client",
    ] {
        assert!(
            !crates.contains(&heavy),
            "the SPANK plugin depends on `{heavy}` again:\n{tree}"
        );
    }
}
