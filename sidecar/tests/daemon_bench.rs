//! `smartmig bench daemon` as a test: a small smoke run always, the full run
//! (1/16/256 clients) with `--ignored`.

use smartmig::cli::bench_daemon::{bench, table, Args};

fn args(clients: Vec<usize>, pairs: usize) -> Args {
    Args {
        clients,
        pairs,
        json: std::env::temp_dir().join("bench-daemon.json"),
        smartmigd: Some(env!("CARGO_BIN_EXE_smartmigd").into()),
        journal_dir: None,
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

#[test]
#[ignore = "full benchmark; run with --ignored --nocapture"]
fn bench_full() {
    let a = args(vec![1, 16, 256], 4096);
    let r = bench(&a).unwrap();
    print!("{}", table(&r));
    let out = std::env::var("SMARTMIG_BENCH_JSON").unwrap_or_else(|_| "bench-daemon.json".into());
    std::fs::write(&out, serde_json::to_vec_pretty(&r).unwrap()).unwrap();
}
