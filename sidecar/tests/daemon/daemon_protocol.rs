//! Malformed input over the real socket: each gets its error kind, and the
//! daemon keeps serving.

use crate::daemon_common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::daemon_common::TestDaemon;

#[test]
fn bad_messages_get_their_kind_and_the_daemon_survives() {
    let d = TestDaemon::start("proto", "");
    let cases: &[(&[u8], &str)] = &[
        (b"garbage\n", "bad_request"),
        (b"[1,2,3]\n", "bad_request"),
        (b"{\"v\":2,\"op\":\"status\"}\n", "unsupported_version"),
        (b"{\"op\":\"status\"}\n", "bad_request"),
        (b"{\"v\":1,\"op\":\"explode\"}\n", "unknown_op"),
        (
            b"{\"v\":1,\"op\":\"allocate\",\"job_id\":\"seven\",\"uid\":0,\"gpu\":0,\"slices\":1}\n",
            "bad_request",
        ),
        (
            b"{\"v\":1,\"op\":\"allocate\",\"job_id\":1,\"uid\":0,\"gpu\":0,\"slices\":-3}\n",
            "bad_request",
        ),
        (b"\xff\xfe\x00\n", "bad_request"),
    ];
    for (bytes, kind) in cases {
        let r = d.raw(bytes);
        assert_eq!(r["v"], 1);
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(
            r["error"]["kind"],
            *kind,
            "{} -> {r}",
            String::from_utf8_lossy(bytes)
        );
        assert!(d.client().health().is_ok());
    }
    // Oversized line (70 KiB > 64 KiB default): too_large, connection closed.
    let mut big = vec![b'x'; 70 * 1024];
    big.push(b'\n');
    let r = d.raw(&big);
    assert_eq!(r["error"]["kind"], "too_large", "{r}");
    // An incomplete line times out (request_timeout_s = 2).
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"{\"v\":1,").unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    let r: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(r["error"]["kind"], "timeout", "{r}");
    // Several requests on one connection are answered in order.
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"{\"v\":1,\"op\":\"health\"}\n{\"v\":1,\"op\":\"status\"}\n")
        .unwrap();
    let mut r = BufReader::new(&s);
    let mut a = String::new();
    let mut b = String::new();
    r.read_line(&mut a).unwrap();
    r.read_line(&mut b).unwrap();
    assert!(a.contains("\"status\":\"ok\""), "{a}");
    assert!(b.contains("\"gpus\""), "{b}");
    // Still healthy, and a real allocate still works.
    let s = d.client().status().unwrap();
    assert_eq!(s.gpus.len(), 2);
    assert!(d
        .client()
        .allocate(daemon_common::req(1, 0, 1, None))
        .is_ok());
}
