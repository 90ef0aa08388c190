//! `smartmig bench daemon` as a test: a small smoke run always, the full run
//! (1/16/256 clients) with `--ignored`.

use smartmig::cli::bench_daemon::{bench, table, Args};

fn args(clients: Vec<usize>, pairs: usize) -> Args {
    Args {
        clients,
        pairs,
        json: std::env::temp_dir().join("bench-daemon.json"),
        smartmigd: Some(env!("CARGO_BIN_EXE_smartmigd").into()),
    }
}

#[test]
fn bench_smoke() {
    let r = bench(&args(vec![1, 4], 40)).unwrap();
    assert_eq!(r.rows.len(), 2);
    assert!(r.rows.iter().all(|x| x.pair_p99_us > 0.0));
    assert!(r.rss_idle_kib > 0);
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
