//! `smartmig`: the command-line front end (layouts, simulate, ...).
//! All logic lives in the library; this file only parses and dispatches.

#![forbid(unsafe_code)]
// The house rule: no function over 100 lines (clippy counts the lines of code).
#![warn(clippy::too_many_lines)]

fn main() -> std::process::ExitCode {
    smartmig::cli::main()
}
