//! `smartmig bench daemon` as a test: a small smoke run always, the full run
//! (1/16/256 clients) with `--ignored`.

use smartmig::cli::bench_daemon::{bench, table, Args};

fn args(clients: Vec<usize>, pairs: usize) -> Args {
    Args {
        clients,
        pairs,
        json: Default::default(),
        smartmigd: Some(crate::daemon_common::smartmigd()),
        journal_dir: None,
        flood: 0,
        flood_user: "nobody".into(),
    }
}

#[test]
fn bench_smoke() {
    let r = bench(&args(vec![1, 4], 40)).unwrap();
    assert_eq!(r.rows.len(), 2);
    assert!(r.rows.iter().all(|x| x.pair_p99_us > 0.0));
    assert!(r.rss_idle_kib > 0);
    assert!(r.journal.contains("fdatasync"), "{}", r.journal);
}

/// With `--journal-dir` on a tmpfs the daemon runs and the report says how
/// the journal was written.
#[test]
fn bench_smoke_with_the_journal_on_tmpfs() {
    let dir = std::path::PathBuf::from(format!(
        "/dev/shm/smartmig-bench-test-{}",
        std::process::id()
    ));
    let a = Args {
        journal_dir: Some(dir.join("journal")),
        ..args(vec![2], 20)
    };
    let r = bench(&a).unwrap();
    assert!(r.journal.contains("on tmpfs"), "{}", r.journal);
    assert!(r.rows[0].pair_p99_us > 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 18, item 3: an ordinary user holding 2,000 connections to the
/// public socket and trickling bytes on them neither exhausts the daemon's
/// descriptors nor stops root's allocations on the root-only socket. The
/// latency figure (goal: allocate p99 <= 100 ms) is the bench's to print;
/// here every pair must succeed and none may take a whole second.
#[test]
fn a_user_crowding_the_public_socket_does_not_stop_allocations() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "the flood runs as `nobody` through runuser: run as root (scripts/test does)"
    );
    let r = bench(&Args {
        flood: 2000,
        ..args(vec![1, 4], 400)
    })
    .unwrap();
    print!("{}", table(&r));
    let f = r.flood.expect("the flood's report");
    assert!(
        f.refused > 0,
        "the daemon refused none of 2,000 connections: {f:?}"
    );
    assert!(
        f.daemon_fds < 200,
        "smartmigd holds {} descriptors: the caps did not bound it",
        f.daemon_fds
    );
    for row in &r.rows {
        assert!(row.allocate_p99_us < 1e6, "allocations starved: {row:?}");
    }
}

#[test]
#[ignore = "full benchmark; run with --ignored --nocapture"]
fn bench_full() {
    let a = args(vec![1, 16, 256], 4096);
    let r = bench(&a).unwrap();
    print!("{}", table(&r));
    let out = std::env::var_os("SMARTMIG_BENCH_JSON").map_or_else(
        || std::env::temp_dir().join("bench-daemon.json"),
        Into::into,
    );
    std::fs::write(&out, serde_json::to_vec_pretty(&r).unwrap()).unwrap();
}
