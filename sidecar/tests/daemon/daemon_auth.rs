//! Peer-credential checks with a real second uid: the client runs as user
//! `smartmig-test` (created with useradd if missing). Must run as root: the
//! test FAILS (never skips) otherwise. Also checks the file modes of a real
//! daemon's socket, socket directory, state directory and state files.

use crate::daemon_common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::daemon_common::{req, TestDaemon};
use smartmig::daemon::{Client, ClientError, ErrorKind};

const USER: &str = "smartmig-test";
const CHILD_ENV: &str = "SMARTMIG_AUTH_CHILD_SOCKET";

/// Runs inside the child process as the unprivileged user (ignored in a
/// normal run, so it is never reported as a pass on its own).
#[test]
#[ignore = "child process of unprivileged_writes_are_refused"]
fn auth_child() {
    let socket = std::env::var(CHILD_ENV)
        .unwrap_or_else(|_| panic!("auth_child runs only as the child of unprivileged_writes_are_refused ({CHILD_ENV} unset)"));
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

/// The second user's (uid, gid); creates it if missing. Panics unless this
/// process runs as root.
fn test_user() -> (u32, u32) {
    let euid = nix::unistd::Uid::effective();
    assert!(
        euid.is_root(),
        "daemon_auth must run as root to create a second uid ({USER}) and run a client \
         as that uid (euid is {euid}); run `scripts/test` or `cargo test` as root"
    );
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
            .unwrap_or_else(|e| panic!("run useradd: {e}"));
        assert!(st.success(), "useradd {USER} failed: {st}");
    }
    let u = nix::unistd::User::from_name(USER)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("user {USER} missing after useradd"));
    (u.uid.as_raw(), u.gid.as_raw())
}

#[test]
fn unprivileged_writes_are_refused() {
    let (uid, gid) = test_user();
    let d = TestDaemon::start("auth", "");
    // The unprivileged user must be able to reach the socket: the daemon made
    // it 0666; the test's temp dirs must be traversable too.
    for p in [d.dir.clone(), d.dir.join("run")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mode = std::fs::metadata(&d.socket).unwrap();
    assert_eq!(mode.permissions().mode() & 0o777, 0o666);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "daemon_auth::auth_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
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

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Every directory under `dir` (and `dir`) and every regular file, with its
/// mode.
fn walk(dir: &Path, out: &mut Vec<(PathBuf, bool, u32)>) {
    out.push((dir.to_path_buf(), true, mode_of(dir)));
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        if meta.is_dir() {
            walk(&path, out);
        } else {
            out.push((path.clone(), false, mode_of(&path)));
        }
    }
}

/// Modes of a real daemon's files (docs/reliability.md, "Auth and
/// permissions"): the socket directory it creates 0755, the socket 0666
/// (status is public, writes are checked with SO_PEERCRED), the state
/// directory and every directory under it 0700, every state file
/// (journal log and snapshot, sim backend state, memory estimates) 0600.
/// Checked after allocations, a release and a restart, so the journal has
/// been written and compacted.
#[test]
fn daemon_files_have_safe_modes() {
    let _ = test_user(); // root only, like the rest of this file
    let mut d = TestDaemon::start("modes", "");
    let run = d.dir.join("run");
    let state = d.dir.join("state");
    assert_eq!(mode_of(&run), 0o755, "socket directory {}", run.display());
    assert_eq!(
        mode_of(&d.socket) & 0o777,
        0o666,
        "socket {}",
        d.socket.display()
    );
    let c = d.client();
    c.allocate(req(1, 0, 1, None)).expect("allocate 1");
    c.allocate(req(2, 1, 3, None)).expect("allocate 2");
    c.release(1).expect("release 1");
    d.signal(nix::sys::signal::Signal::SIGTERM);
    let st = d.wait(std::time::Duration::from_secs(20));
    assert!(st.success(), "smartmigd exit: {st}: {}", d.log());
    d.spawn();
    d.client()
        .allocate(req(3, 0, 2, None))
        .expect("allocate after restart");

    let mut entries = Vec::new();
    walk(&state, &mut entries);
    let files: Vec<_> = entries.iter().filter(|e| !e.1).collect();
    assert!(
        files.iter().any(|e| e.0.ends_with("journal/log")),
        "no journal log under {}: {entries:?}",
        state.display()
    );
    let mut bad = Vec::new();
    for (path, is_dir, mode) in &entries {
        let want = if *is_dir { 0o700 } else { 0o600 };
        if *mode != want {
            bad.push(format!("{} is {mode:o}, want {want:o}", path.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "unsafe modes under the state dir:\n{}",
        bad.join("\n")
    );
}

/// An existing state directory with loose modes (e.g. created by hand or by
/// an older version) is tightened at start, and state files that the
/// daemon rewrites come out 0600.
#[test]
fn loose_existing_state_dir_is_tightened() {
    let _ = test_user();
    let dir = std::env::temp_dir().join(format!("smartmig-it-loose-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let state = dir.join("state");
    std::fs::create_dir_all(state.join("journal")).unwrap();
    for p in [&state, &state.join("journal")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let log = state.join("journal/log");
    std::fs::write(&log, b"").unwrap();
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666)).unwrap();
    let config = dir.join("smartmig.toml");
    std::fs::write(&config, daemon_common::base_config(&dir, "")).unwrap();
    let mut d = TestDaemon {
        socket: dir.join("run/smartmig.sock"),
        dir: dir.clone(),
        config,
        child: None,
    };
    d.spawn();
    d.client().allocate(req(1, 0, 1, None)).expect("allocate");
    let mut entries = Vec::new();
    walk(&state, &mut entries);
    let mut bad = Vec::new();
    for (path, is_dir, mode) in &entries {
        let want = if *is_dir { 0o700 } else { 0o600 };
        if *mode != want {
            bad.push(format!("{} is {mode:o}, want {want:o}", path.display()));
        }
    }
    assert!(bad.is_empty(), "loose modes kept:\n{}", bad.join("\n"));
}
