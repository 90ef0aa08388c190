//! Generates Rust bindings for `<slurm/spank.h>` with bindgen.
//!
//! The header comes from Debian's `libslurm-dev`; bindgen needs libclang
//! (`libclang-dev`). Set `SLURM_INCLUDE_DIR` to the directory that holds
//! `slurm/spank.h` when it is not under `/usr/include` or `/usr/local/include`
//! (`scripts/slurm-series headers 24.11` prints one for each series the
//! project is tested on).
//!
//! The SPANK API grows between series; what the plugin uses of the newer
//! parts is switched on by a `cfg` set here from the header itself, so one
//! source builds against every series (docs/slurm-integration.md, "Slurm
//! series"):
//!
//! - `spank_init_failure_mode` (26.05+: `extern int
//!   slurm_spank_init_failure_mode`, with `ESPANK_JOB_FAILURE`): the plugin
//!   exports that variable, so that a failing `init` fails the job instead
//!   of draining the node.

use std::env;
use std::path::PathBuf;

fn find_include_dir() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = env::var_os("SLURM_INCLUDE_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    candidates.push(PathBuf::from("/usr/include"));
    candidates.push(PathBuf::from("/usr/local/include"));
    candidates
        .into_iter()
        .find(|dir| dir.join("slurm").join("spank.h").is_file())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");

    let include_dir = find_include_dir().unwrap_or_else(|| {
        panic!(
            "smartmig-spank: <slurm/spank.h> not found (looked in $SLURM_INCLUDE_DIR, \
             /usr/include, /usr/local/include). On Debian/Ubuntu install it with \
             `apt-get install libslurm-dev libclang-dev` (bindgen also needs libclang), \
             or set SLURM_INCLUDE_DIR to the directory containing slurm/spank.h."
        )
    });
    let header = include_dir.join("slurm").join("spank.h");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo::rustc-check-cfg=cfg(spank_init_failure_mode)");
    let text = std::fs::read_to_string(&header)
        .unwrap_or_else(|e| panic!("smartmig-spank: read {}: {e}", header.display()));
    if text.contains("slurm_spank_init_failure_mode") {
        println!("cargo:rustc-cfg=spank_init_failure_mode");
    }
    println!(
        "cargo:rerun-if-changed={}",
        include_dir.join("slurm").join("slurm_version.h").display()
    );

    let bindings = bindgen::Builder::default()
        .header_contents("smartmig_spank_wrapper.h", "#include <slurm/spank.h>\n")
        .clang_arg(format!("-I{}", include_dir.display()))
        // The SPANK API proper.
        .allowlist_function("spank_.*")
        .allowlist_type("spank_.*")
        .allowlist_var("spank_.*")
        .allowlist_type("spank_t")
        .allowlist_type("spank_f")
        // Logging functions exported to plugins by slurmd/slurmstepd/sbatch.
        .allowlist_function("slurm_(info|error|verbose|debug|debug2|debug3|spank_log)")
        // Items, error codes and version constants.
        .allowlist_var("S_.*")
        .allowlist_var("ESPANK_.*")
        .allowlist_var("SPANK_.*")
        .allowlist_var("SLURM_VERSION_.*")
        .allowlist_var("SLURM_SUCCESS")
        .allowlist_var("SLURM_ERROR")
        // Never declare the callbacks this plugin itself defines.
        .blocklist_item("slurm_spank_.*")
        .blocklist_item("spank_options")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(true)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "smartmig-spank: bindgen failed on {}: {e}. Is libclang installed \
                 (`apt-get install libclang-dev`)?",
                header.display()
            )
        });

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    bindings
        .write_to_file(out.join("spank_bindings.rs"))
        .expect("write spank_bindings.rs to OUT_DIR");
}
