//! `smartmig`: the command-line front end (layouts, simulate, ...).
//! All logic lives in the library; this file only parses and dispatches.

fn main() -> std::process::ExitCode {
    smartmig::cli::main()
}
