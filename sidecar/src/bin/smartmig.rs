//! `smartmig`: the command-line front end (layouts, simulate, ...).
//! All logic lives in the library; this file only parses and dispatches.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    smartmig::cli::main()
}
