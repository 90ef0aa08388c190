//! Peer-credential checks with a real second uid: the client runs as user
//! `smartmig-test` (created with useradd if missing; needs root).

mod daemon_common;

use std::os::unix::process::CommandExt;
use std::process::Command;

use daemon_common::{req, TestDaemon};
use smartmig::daemon::{Client, ClientError, ErrorKind};

const USER: &str = "smartmig-test";
const CHILD_ENV: &str = "SMARTMIG_AUTH_CHILD_SOCKET";

/// Runs inside the child process as the unprivileged user.
#[test]
fn auth_child() {
    let Ok(socket) = std::env::var(CHILD_ENV) else {
        return; // only meaningful when started by `unprivileged_writes_are_refused`
    };
    let c = Client::new(&socket);
    c.status().expect("status must be open to everyone");
    c.health().expect("health must be open to everyone");
    match c.allocate(req(5, 0, 1, None)) {
        Err(ClientError::Daemon(e)) => {
            assert_eq!(e.kind, ErrorKind::Unauthorized, "{e}");
            println!("CHILD-ALLOCATE-REFUSED");
        }
        other => panic!("allocate as a normal user: {other:?}"),
    }
    match c.release(1) {
        Err(ClientError::Daemon(e)) => {
            assert_eq!(e.kind, ErrorKind::Unauthorized, "{e}");
            println!("CHILD-RELEASE-REFUSED");
        }
        other => panic!("release as a normal user: {other:?}"),
    }
}

fn test_user() -> Option<(u32, u32)> {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipping: needs root to switch uid");
        return None;
    }
    if nix::unistd::User::from_name(USER).ok().flatten().is_none() {
        let st = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ])
            .status()
            .ok()?;
        assert!(st.success(), "useradd {USER} failed");
    }
    let u = nix::unistd::User::from_name(USER).ok().flatten()?;
    Some((u.uid.as_raw(), u.gid.as_raw()))
}

#[test]
fn unprivileged_writes_are_refused() {
    let Some((uid, gid)) = test_user() else {
        return;
    };
    let d = TestDaemon::start("auth", "");
    // The unprivileged user must be able to reach the socket: the daemon made
    // it 0666; the test's temp dirs must be traversable too.
    for p in [d.dir.clone(), d.dir.join("run")] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mode = std::fs::metadata(&d.socket).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o666);
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["auth_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &d.socket)
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("CHILD-ALLOCATE-REFUSED"), "{stdout}");
    assert!(stdout.contains("CHILD-RELEASE-REFUSED"), "{stdout}");
    // Root (this process) may allocate, and the refusal was logged.
    assert!(d.client().allocate(req(5, 0, 1, None)).is_ok());
    let log = d.log();
    assert!(
        log.contains("refused") && log.contains(&format!("uid={uid}")),
        "{log}"
    );
}
