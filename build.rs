//! Tells the end-to-end tests where the artifacts of the current profile live.
//!
//! Cargo puts this script's output in `<target>/<profile>/build/<pkg>-<hash>/out`,
//! so the profile directory (where `smartmig`, `smartmigd` and
//! `libsmartmig_spank.so` of the same build land) is three levels up.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let profile_dir = out_dir
        .ancestors()
        .nth(3)
        .unwrap_or_else(|| panic!("unexpected OUT_DIR layout: {}", out_dir.display()))
        .to_path_buf();
    println!(
        "cargo:rustc-env=SMARTMIG_ARTIFACT_DIR={}",
        profile_dir.display()
    );
}
