//! The synchronous client (used by the SPANK plugin inside slurmstepd and by
//! the CLI) against a sick sidecar: it must give up within its I/O timeout
//! even when the peer trickles bytes, say plainly that it timed out, and
//! keep error messages short when the peer sends megabytes of junk (the
//! message ends up in a job's output and in slurmd.log).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use smartmig::daemon::{Client, ClientError};

fn sock(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("smartmig-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

/// Serves one connection with `f` on a thread.
fn fake(name: &str, f: impl FnOnce(UnixStream) + Send + 'static) -> PathBuf {
    let path = sock(name);
    let listener = UnixListener::bind(&path).expect("bind");
    std::thread::spawn(move || {
        if let Ok((s, _)) = listener.accept() {
            let mut line = String::new();
            let _ = BufReader::new(&s).read_line(&mut line);
            f(s);
        }
    });
    path
}

#[test]
fn silent_peer_times_out_with_a_clear_message() {
    let path = fake("silent.sock", |s| {
        // Not synchronisation: the peer under test says nothing for 10 s.
        std::thread::sleep(Duration::from_secs(10));
        drop(s);
    });
    let c = Client::new(&path).with_io_timeout(Duration::from_millis(800));
    let t0 = Instant::now();
    let err = c.health().expect_err("no reply must be an error");
    let took = t0.elapsed();
    assert!(matches!(err, ClientError::Timeout { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "no reply from smartmigd within 800 ms (request timed out)"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn trickling_peer_cannot_hold_the_client_past_its_timeout() {
    // One byte every 200 ms, never a newline: each read succeeds within the
    // timeout, so only a deadline for the whole reply stops it.
    let path = fake("drip.sock", |mut s| {
        for _ in 0..100 {
            if s.write_all(b"x").is_err() {
                return;
            }
            // Not synchronisation: the trickle under test.
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let c = Client::new(&path).with_io_timeout(Duration::from_secs(1));
    let t0 = Instant::now();
    let err = c.health().expect_err("a trickle is not a reply");
    let took = t0.elapsed();
    assert!(matches!(err, ClientError::Timeout { .. }), "{err:?}");
    assert!(
        took < Duration::from_secs(3),
        "the client waited {took:?} for a trickling peer (timeout 1 s)"
    );
}

#[test]
fn oversized_reply_gives_a_short_error() {
    let path = fake("big.sock", |mut s| {
        let _ = s.write_all(b"{\"v\":1,\"ok\":true,\"uuid\":\"MIG-");
        let junk = vec![b'x'; 64 * 1024];
        for _ in 0..100 {
            if s.write_all(&junk).is_err() {
                return;
            }
        }
    });
    let c = Client::new(&path).with_io_timeout(Duration::from_secs(10));
    let err = c.health().expect_err("6 MiB line");
    let text = err.to_string();
    assert!(matches!(err, ClientError::Protocol(_)), "{text}");
    assert!(
        text.len() < 600,
        "error message is {} bytes: {}...",
        text.len(),
        &text[..300]
    );
    assert!(
        text.starts_with("smartmigd sent an invalid reply: reply longer than 4194304 bytes"),
        "{text}"
    );
}

#[test]
fn junk_reply_is_quoted_but_cut() {
    let path = fake("junk.sock", |mut s| {
        let mut line = vec![b'z'; 10_000];
        line.push(b'\n');
        let _ = s.write_all(&line);
    });
    let c = Client::new(&path).with_io_timeout(Duration::from_secs(5));
    let text = c.health().expect_err("junk").to_string();
    assert!(
        text.starts_with(
            "smartmigd sent an invalid reply: expected value at line 1 column 1: zzzz"
        ),
        "{text}"
    );
    assert!(text.ends_with("... (10001 bytes)"), "{text}");
    assert!(text.len() < 400, "{} bytes", text.len());
}

/// A daemon that dies mid-request (the connection closes, or is reset,
/// before any reply) is `Dropped`, which the plugin treats as a sidecar
/// that is not there yet and asks again, not as a bad reply.
#[test]
fn connection_closed_before_a_reply_is_dropped() {
    let path = fake("dropped.sock", drop);
    let c = Client::new(&path).with_io_timeout(Duration::from_secs(5));
    let err = c.health().expect_err("no reply");
    assert!(matches!(err, ClientError::Dropped), "{err:?}");
    assert!(
        err.to_string()
            .contains("closed the connection without a reply"),
        "{err}"
    );
}
