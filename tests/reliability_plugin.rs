//! Reliability of the SPANK plugin against a sick sidecar, on the real Slurm
//! harness (issue 8): a sidecar that accepts and never answers, a missing
//! socket, and sidecars that answer garbage. In every case the shard job
//! must end FAILED with a readable reason in its output, within the
//! plugstack `timeout=` plus a margin (slurmstepd must not hang), and the
//! node must stay idle (never drained). The plugin runs with
//! `sidecar_wait=0 drain_on_unreachable=no requeue=no`, the settings under
//! which a job fails rather than waits.
//!
//! The "sidecar" here is a tiny fake in the test process (a std
//! `UnixListener` on a thread) that does exactly the wrong thing asked of
//! it. Needs root and `cargo build --release --workspace`; fails, never
//! skips, when Slurm cannot start.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smartmig_suite::{plugin, SlurmCluster, Wait};

/// The plugin's request timeout in these tests (plugstack `timeout=`).
const PLUGIN_TIMEOUT_S: u64 = 3;
/// Slack for Slurm itself (scheduling, step launch, epilog, polling).
const MARGIN: Duration = Duration::from_secs(20);
const JOB_TIMEOUT: Duration = Duration::from_secs(90);
/// Largest job output accepted as "readable" (the reason must not drown in
/// a dump of whatever the sidecar sent).
const MAX_OUTPUT_BYTES: usize = 16 * 1024;

/// The plugin with the job-level failure contract only: no wait for an
/// unreachable sidecar, no drain, no requeue (those defaults are tested in
/// `e2e_agreement.rs`), so each case ends FAILED with its reason.
fn plugstack(socket: &Path) -> String {
    format!(
        "required {} socket={} timeout={PLUGIN_TIMEOUT_S} sidecar_wait=0 \
         drain_on_unreachable=no requeue=no\n",
        plugin().display(),
        socket.display()
    )
}

/// Points the plugin at `socket` (slurmstepd re-reads plugstack.conf for
/// every job; the plugin was listed when slurmd started).
fn point_plugin_at(cluster: &SlurmCluster, socket: &Path) {
    std::fs::write(cluster.dir().join("plugstack.conf"), plugstack(socket))
        .expect("write plugstack.conf");
}

fn cluster() -> SlurmCluster {
    SlurmCluster::up_with(|dir| {
        std::fs::create_dir_all(dir.join("run")).expect("mkdir run");
        std::fs::write(
            dir.join("plugstack.conf"),
            plugstack(&dir.join("run/none.sock")),
        )
        .expect("write plugstack");
    })
}

/// What the fake sidecar does with each connection.
#[derive(Clone)]
enum Behaviour {
    /// Reads the request, never answers, keeps the connection open.
    Silent,
    /// Reads the request, writes these bytes, closes.
    Reply(Vec<u8>),
}

/// A fake smartmigd on a Unix socket, serving until dropped.
struct FakeSidecar {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeSidecar {
    fn start(path: &Path, behaviour: Behaviour) -> FakeSidecar {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)
            .unwrap_or_else(|e| panic!("bind fake sidecar {}: {e}", path.display()));
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
            .expect("chmod fake socket");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (s, c, r) = (stop.clone(), connections.clone(), requests.clone());
        let thread = std::thread::spawn(move || {
            // Connections held open by `Silent` (closed when the fake stops).
            let held: Arc<Mutex<Vec<UnixStream>>> = Arc::new(Mutex::new(Vec::new()));
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        c.fetch_add(1, Ordering::SeqCst);
                        let (b, r, held) = (behaviour.clone(), r.clone(), held.clone());
                        std::thread::spawn(move || serve(stream, b, r, held));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        // The fake's idle accept loop, not the test waiting.
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => panic!("fake sidecar accept: {e}"),
                }
            }
            if let Ok(mut h) = held.lock() {
                h.clear();
            };
        });
        FakeSidecar {
            path: path.to_path_buf(),
            stop,
            connections,
            requests,
            thread: Some(thread),
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

fn serve(
    stream: UnixStream,
    behaviour: Behaviour,
    requests: Arc<Mutex<Vec<String>>>,
    held: Arc<Mutex<Vec<UnixStream>>>,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut line = String::new();
    let _ = BufReader::new(&stream).read_line(&mut line);
    if let Ok(mut r) = requests.lock() {
        r.push(line);
    }
    match behaviour {
        Behaviour::Silent => {
            if let Ok(mut h) = held.lock() {
                h.push(stream);
            }
        }
        Behaviour::Reply(bytes) => {
            let mut s = &stream;
            let _ = s.set_write_timeout(Some(Duration::from_secs(30)));
            let _ = s.write_all(&bytes);
            let _ = s.flush();
        }
    }
}

impl Drop for FakeSidecar {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Submits a 2-shard job as the ordinary job user and waits for its final state; returns
/// (state, output, wall time from submit to the final state).
fn run_shard_job(cluster: &SlurmCluster, name: &str) -> (u32, String, String, Duration) {
    let out = cluster.shared_dir().join(format!("{name}.out"));
    let start = Instant::now();
    let user = format!("--uid={}", smartmig_suite::job_user());
    let group = format!("--gid={}", smartmig_suite::job_user());
    let job = cluster.sbatch(&[
        &user,
        &group,
        "-o",
        out.to_str().expect("utf-8 path"),
        "--gres=shard:2",
        "--wrap",
        "echo BODY-RAN CVD=$CUDA_VISIBLE_DEVICES",
    ]);
    let state = cluster.wait_job(job, JOB_TIMEOUT);
    let elapsed = start.elapsed();
    // slurmstepd may flush the output file just after the state changed:
    // poll until it holds the plugin's error or the body's line (the
    // callers' assertions then judge whatever it holds).
    let text = Wait::new("", Duration::from_secs(10))
        .every(Duration::from_millis(20))
        .poll(|| {
            let text = read(&out);
            if text.contains("smartmig: error") || text.contains("BODY-RAN") {
                Ok(text)
            } else {
                Err(text)
            }
        })
        .unwrap_or_else(|timed_out| timed_out.last);
    (job, state, text, elapsed)
}

/// The common contract: FAILED, the reason (`needles`) in the output, the
/// body never ran, the output is readable, the node goes back to idle and
/// no step of the job is left.
fn assert_failed_cleanly(
    cluster: &SlurmCluster,
    case: &str,
    (job, state, text, elapsed): &(u32, String, String, Duration),
    needles: &[&str],
) {
    eprintln!(
        "[{case}] job {job}: {state} after {:.1} s; output {} bytes: {}",
        elapsed.as_secs_f64(),
        text.len(),
        text.chars().take(400).collect::<String>().trim()
    );
    assert_eq!(
        state,
        "FAILED",
        "[{case}] job {job}: {text:?}\n{}",
        cluster.log_tails()
    );
    let prefix = format!("smartmig: error: job {job}: no MIG instance");
    assert!(
        text.contains(&prefix),
        "[{case}] reason missing from the job output (want {prefix:?}): {text:?}"
    );
    for n in needles {
        assert!(
            text.contains(n),
            "[{case}] job output lacks {n:?}: {:?}",
            text.chars().take(2000).collect::<String>()
        );
    }
    assert!(
        !text.contains("BODY-RAN"),
        "[{case}] the job body must not run: {text:?}"
    );
    assert!(
        text.len() <= MAX_OUTPUT_BYTES,
        "[{case}] job output is {} bytes (> {MAX_OUTPUT_BYTES}): the reason is not readable: {:?}...",
        text.len(),
        text.chars().take(600).collect::<String>()
    );
    assert!(
        cluster.wait_node_state("idle", Duration::from_secs(30)),
        "[{case}] node not idle after the failed job: {}\n{}",
        cluster.node_state(),
        cluster.log_tails()
    );
    let steps = cluster
        .command("squeue")
        .args(["-h", "-s", "-j", &job.to_string()])
        .output()
        .expect("run squeue -s");
    let steps = String::from_utf8_lossy(&steps.stdout).trim().to_string();
    assert!(
        steps.is_empty(),
        "[{case}] steps of job {job} still there: {steps}"
    );
}

/// (a) A sidecar that accepts and never answers: the job fails after the
/// plugin's `timeout=3`, well within timeout + margin; slurmstepd does not
/// hang; the node stays idle; the node survives a second such job too.
#[test]
fn silent_sidecar_fails_the_job_within_the_timeout() {
    let cluster = cluster();
    let sock = cluster.dir().join("run/silent.sock");
    let fake = FakeSidecar::start(&sock, Behaviour::Silent);
    point_plugin_at(&cluster, &sock);
    for round in 0..2 {
        let r = run_shard_job(&cluster, &format!("silent{round}"));
        assert_failed_cleanly(
            &cluster,
            "silent sidecar",
            &r,
            &["no reply from smartmigd within 3000 ms (request timed out)"],
        );
        let limit = Duration::from_secs(PLUGIN_TIMEOUT_S) + MARGIN;
        assert!(
            r.3 >= Duration::from_secs(PLUGIN_TIMEOUT_S) - Duration::from_millis(500),
            "job {} failed after {:?}, before the {PLUGIN_TIMEOUT_S} s timeout could expire: {:?}",
            r.0,
            r.3,
            r.2
        );
        assert!(
            r.3 <= limit,
            "job {} took {:?} to fail (limit {limit:?})",
            r.0,
            r.3
        );
    }
    assert!(
        fake.connections() >= 2,
        "the plugin never connected to the fake sidecar ({} connections)",
        fake.connections()
    );
    assert!(
        fake.requests().iter().any(|r| r.contains("\"allocate\"")),
        "no allocate request reached the fake: {:?}",
        fake.requests()
    );
}

/// (b) The socket path is missing, a regular file, or a stale socket with
/// nobody listening: FAILED with the connect error, node idle.
#[test]
fn missing_or_dead_socket_fails_the_job_not_the_node() {
    let cluster = cluster();
    let run = cluster.dir().join("run");

    let missing = run.join("missing.sock");
    point_plugin_at(&cluster, &missing);
    let r = run_shard_job(&cluster, "missing");
    let at = format!("cannot connect to smartmigd at {}", missing.display());
    assert_failed_cleanly(
        &cluster,
        "socket missing",
        &r,
        &[&at, "No such file or directory", "is smartmigd running?"],
    );

    let file = run.join("file.sock");
    std::fs::write(&file, b"not a socket").expect("write file");
    point_plugin_at(&cluster, &file);
    let r = run_shard_job(&cluster, "file");
    let at = format!("cannot connect to smartmigd at {}", file.display());
    assert_failed_cleanly(
        &cluster,
        "regular file",
        &r,
        &[&at, "Connection refused", "is smartmigd running?"],
    );

    let stale = run.join("stale.sock");
    drop(UnixListener::bind(&stale).expect("bind stale socket"));
    point_plugin_at(&cluster, &stale);
    let r = run_shard_job(&cluster, "stale");
    let at = format!("cannot connect to smartmigd at {}", stale.display());
    assert_failed_cleanly(
        &cluster,
        "stale socket",
        &r,
        &[&at, "Connection refused", "is smartmigd running?"],
    );
}

/// (c) Garbage replies: junk text, `ok: true` without a uuid, an error
/// without a body, and a line larger than the client's 4 MiB reply limit.
/// Each fails the job with a readable reason; the node stays idle.
#[test]
fn garbage_replies_fail_the_job_with_a_reason() {
    let cluster = cluster();
    let run = cluster.dir().join("run");
    let big = {
        let mut v = b"{\"v\":1,\"ok\":true,\"uuid\":\"MIG-".to_vec();
        v.extend(std::iter::repeat_n(b'x', 5 * 1024 * 1024));
        v
    };
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        (
            "junk text",
            b"HTTP/1.1 200 OK\r\n\r\nhello\n".to_vec(),
            vec!["smartmigd sent an invalid reply: expected value at line 1 column 1"],
        ),
        (
            "ok without uuid",
            b"{\"v\":1,\"ok\":true}\n".to_vec(),
            vec!["smartmigd sent an invalid reply: missing field `uuid`"],
        ),
        (
            "error without body",
            b"{\"v\":1,\"ok\":false}\n".to_vec(),
            vec!["smartmigd sent an invalid reply: error without a body"],
        ),
        (
            "no ok field",
            b"{\"v\":1,\"uuid\":\"MIG-1\"}\n".to_vec(),
            vec!["smartmigd sent an invalid reply: no `ok` field"],
        ),
        (
            "closed without reply",
            Vec::new(),
            vec!["smartmigd closed the connection without a reply"],
        ),
        (
            "oversized line (5 MiB)",
            big,
            vec!["smartmigd sent an invalid reply: reply longer than 4194304 bytes"],
        ),
    ];
    for (i, (case, bytes, needles)) in cases.into_iter().enumerate() {
        let sock = run.join(format!("garbage{i}.sock"));
        let fake = FakeSidecar::start(&sock, Behaviour::Reply(bytes));
        point_plugin_at(&cluster, &sock);
        let r = run_shard_job(&cluster, &format!("garbage{i}"));
        assert_failed_cleanly(&cluster, case, &r, &needles);
        assert!(
            r.3 <= Duration::from_secs(PLUGIN_TIMEOUT_S) + MARGIN,
            "[{case}] job {} took {:?} to fail",
            r.0,
            r.3
        );
        assert!(
            fake.connections() >= 1,
            "[{case}] the plugin never connected"
        );
    }
}
