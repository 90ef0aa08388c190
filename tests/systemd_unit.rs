//! The shipped systemd unit stays hardened (issue 18, item 4): its exposure
//! score from `systemd-analyze security --offline=true` (systemd 252, from
//! Debian's `systemd` package, which `scripts/test` installs) must stay at
//! most 3.5 ("OK"; it was 9.6, "UNSAFE", before the hardening, and is 2.9
//! now), and the limits the daemon relies on must stay set.

use std::process::Command;

use smartmig_suite::{describe, repo_root};

#[test]
fn the_unit_is_hardened() {
    let unit = repo_root().join("etc/systemd/smartmigd.service");
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit)
        .output()
        .unwrap_or_else(|e| panic!("run systemd-analyze (Debian package `systemd`): {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let score: f64 = text
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for smartmigd.service:")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in the output: {}", describe(&out)));
    assert!(score <= 3.5, "exposure {score} > 3.5:\n{text}");
    let body = std::fs::read_to_string(&unit).expect("read the unit");
    for line in [
        "LimitNOFILE=65536",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "SystemCallFilter=@system-service",
    ] {
        assert!(
            body.lines().any(|l| l.trim() == line),
            "{line} missing from the unit"
        );
    }
    println!("systemd-analyze security: exposure {score}");
}
