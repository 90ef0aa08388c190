//! `smartmig bench daemon`: allocate+release latency of a real smartmigd
//! (sim backend) under 1, 16 and 256 concurrent clients, and its memory.
//!
//! The daemon runs as a child process on a temporary socket; clients are
//! threads using the same synchronous [`Client`] as the SPANK plugin, each
//! connection carrying one request, as in production. Enough simulated GPUs
//! are configured that every client can hold a 1g instance at once, so the
//! numbers measure the daemon, not waiting for capacity.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::daemon::client::{Client, ClientError};
use crate::daemon::protocol::AllocateRequest;

/// Arguments of `smartmig bench daemon`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Concurrent client counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    pub clients: Vec<usize>,
    /// Allocate+release pairs per measurement (split among the clients).
    #[arg(long, default_value_t = 4096)]
    pub pairs: usize,
    /// The results.
    #[command(flatten)]
    pub json: super::args::JsonArg,
    /// The smartmigd binary (default: next to this executable).
    #[arg(long)]
    pub smartmigd: Option<PathBuf>,
    /// The daemon's `journal_dir` (default: in its temporary state
    /// directory). On a tmpfs, e.g. `/dev/shm/smartmig-bench`, the journal
    /// is written without fsync, as with `journal_dir = "/run/..."`.
    #[arg(long, value_name = "DIR")]
    pub journal_dir: Option<PathBuf>,
    /// A hostile local user holds this many connections to the public
    /// socket meanwhile, trickling a byte a second on each and reconnecting
    /// whatever the daemon closes (`smartmig bench flood`); the measured
    /// clients use the root-only socket, as the SPANK plugin does.
    #[arg(long, default_value_t = 0)]
    pub flood: usize,
    /// The user the flood runs as (via `runuser`; needs root).
    #[arg(long, default_value = "nobody")]
    pub flood_user: String,
}

/// Arguments of `smartmig bench flood` (the hostile client of `bench
/// daemon --flood`).
#[derive(Clone, Debug, clap::Args)]
pub struct FloodArgs {
    /// The socket to crowd.
    #[arg(long)]
    pub socket: PathBuf,
    /// Connections to hold at once.
    #[arg(long, default_value_t = 2000)]
    pub connections: usize,
    /// Milliseconds between rounds (each round writes one byte, never a
    /// newline, on every open connection and reopens closed ones).
    #[arg(long, default_value_t = 1000)]
    pub trickle_ms: u64,
}

/// What the flood did, printed as JSON when its stdin closes.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct FloodReport {
    pub user: String,
    pub connections: usize,
    /// Connections the daemon accepted and then refused or closed.
    pub closed_by_daemon: u64,
    /// `too_many_connections` replies read.
    pub refused: u64,
    /// connect(2) failures.
    pub connect_failed: u64,
    /// Most connections open on the flood's side at once (accepted or
    /// still in the daemon's backlog), at the end of a round.
    pub held_max: usize,
    /// Open descriptors of smartmigd at the end of the flood (filled in
    /// by `bench daemon`): bounded by the connection caps, not by the
    /// flood's size.
    #[serde(default)]
    pub daemon_fds: usize,
}

/// Latency of one measurement, in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub clients: usize,
    pub pairs: usize,
    pub pair_p50_us: f64,
    pub pair_p99_us: f64,
    pub allocate_p50_us: f64,
    pub allocate_p99_us: f64,
    pub release_p99_us: f64,
    pub pairs_per_s: f64,
    pub rss_after_kib: u64,
}

/// The whole result.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub gpus: usize,
    /// The hostile user's connections during the measurement, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood: Option<FloodReport>,
    /// Where the journal was and how it was written.
    pub journal: String,
    pub rss_idle_kib: u64,
    pub rss_peak_kib: u64,
    pub rows: Vec<Row>,
}

/// Bench failures.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("smartmigd did not come up: {0}")]
    Start(String),
    #[error("request failed: {0}")]
    Client(#[from] ClientError),
    #[error("the flood did not run: {0}")]
    Flood(String),
}

fn rss_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Child_ {
    child: Child,
    dir: PathBuf,
}

impl Drop for Child_ {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_daemon(
    exe: &Path,
    gpus: usize,
    journal_dir: Option<&Path>,
) -> Result<(Child_, Client), BenchError> {
    // Unique per run, not only per process: tests run benches in parallel.
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("smartmig-bench-{}-{run}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("smartmig.sock");
    // The root-only socket: the SPANK plugin's, and the measured clients'.
    let admin = dir.join("smartmig-root.sock");
    let journal = journal_dir.map_or_else(String::new, |j| {
        let _ = std::fs::remove_dir_all(j);
        format!("journal_dir = \"{}\"\n", j.display())
    });
    let config = format!(
        "socket = \"{}\"\nadmin_socket = \"{}\"\nstate_dir = \"{}\"\n{journal}allocate_wait_s = 5\nlog_level = \"warn\"\n[slurm]\nenabled = false\n[[gpus]]\nmodel = \"a100-40gb\"\ncount = {gpus}\n",
        socket.display(),
        admin.display(),
        dir.join("state").display()
    );
    let path = dir.join("smartmig.toml");
    std::fs::write(&path, config)?;
    let child = Command::new(exe)
        .arg("--config")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let guard = Child_ { child, dir };
    let client = Client::new(&admin).with_io_timeout(Duration::from_secs(30));
    let t0 = Instant::now();
    loop {
        match client.health() {
            Ok(_) => break,
            Err(e) if t0.elapsed() > Duration::from_secs(20) => {
                return Err(BenchError::Start(e.to_string()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    Ok((guard, client))
}

/// Runs the benchmark and returns the report (also printed and written as JSON).
pub fn bench(args: &Args) -> Result<Report, BenchError> {
    let exe = match &args.smartmigd {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("smartmigd"),
    };
    let max_clients = args.clients.iter().copied().max().unwrap_or(1).max(1);
    let gpus = max_clients.div_ceil(7).clamp(1, 64);
    let (daemon, client) = start_daemon(&exe, gpus, args.journal_dir.as_deref())?;
    let pid = daemon.child.id();
    let flood = if args.flood > 0 {
        // `smartmig`, next to smartmigd (also when a test runs the bench).
        let cli = exe.with_file_name("smartmig");
        Some(start_flood(&cli, &daemon.dir.join("smartmig.sock"), args)?)
    } else {
        None
    };
    let rss_idle = rss_kib(pid, "VmRSS:");
    let mut rows = Vec::new();
    let mut next_job = 1u64;
    for &clients in &args.clients {
        let clients = clients.max(1);
        let per = (args.pairs / clients).max(1);
        let t0 = Instant::now();
        let all = run_clients(&client, clients, per, gpus, next_job)?;
        let wall = t0.elapsed().as_secs_f64();
        next_job += (clients * per) as u64 + 1;
        rows.push(row(clients, &all, wall, pid));
    }
    let journal_dir = args
        .journal_dir
        .clone()
        .unwrap_or_else(|| daemon.dir.join("state/journal"));
    let journal = format!(
        "{} ({})",
        journal_dir.display(),
        match crate::daemon::journal::Durability::of(&journal_dir) {
            crate::daemon::journal::Durability::Disk => "on disk: write + fdatasync",
            crate::daemon::journal::Durability::Memory => "on tmpfs: write, no fsync",
        }
    );
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count);
    let flood = flood.map(stop_flood).transpose()?.map(|f| FloodReport {
        daemon_fds: fds,
        ..f
    });
    let report = Report {
        gpus,
        flood,
        journal,
        rss_idle_kib: rss_idle,
        rss_peak_kib: rss_kib(pid, "VmHWM:"),
        rows,
    };
    drop(daemon);
    Ok(report)
}

/// `clients` threads, each allocating and releasing `per` jobs (from job
/// `next_job` on) as fast as it can on its GPU; each pair's (allocate,
/// allocate + release) time, s.
fn run_clients(
    client: &Client,
    clients: usize,
    per: usize,
    gpus: usize,
    next_job: u64,
) -> Result<Vec<(f64, f64)>, BenchError> {
    let barrier = Arc::new(Barrier::new(clients));
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let client = client.clone();
            let barrier = barrier.clone();
            let base = next_job + (c * per) as u64;
            let gpu = (c % gpus) as u32;
            std::thread::spawn(move || -> Result<Vec<(f64, f64)>, ClientError> {
                barrier.wait();
                let mut lat = Vec::with_capacity(per);
                for k in 0..per as u64 {
                    let job_id = base + k;
                    let a = Instant::now();
                    client.allocate(AllocateRequest {
                        job_id,
                        step: None,
                        uid: 0,
                        gpu,
                        slices: 1,
                        memory_gb: None,
                        deadline: None,
                        time_limit_s: None,
                        job_name: None,
                        oom_marker: None,
                        profile: None,
                    })?;
                    let alloc = a.elapsed().as_secs_f64();
                    client.release(job_id)?;
                    lat.push((alloc, a.elapsed().as_secs_f64()));
                }
                Ok(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        match h.join() {
            Ok(r) => all.extend(r?),
            Err(_) => return Err(BenchError::Start("a client thread panicked".into())),
        }
    }
    Ok(all)
}

/// One row of the table: the latencies of `all` and the daemon's memory.
fn row(clients: usize, all: &[(f64, f64)], wall: f64, pid: u32) -> Row {
    let mut pair: Vec<f64> = all.iter().map(|x| x.1 * 1e6).collect();
    let mut alloc: Vec<f64> = all.iter().map(|x| x.0 * 1e6).collect();
    let mut rel: Vec<f64> = all.iter().map(|x| (x.1 - x.0) * 1e6).collect();
    for v in [&mut pair, &mut alloc, &mut rel] {
        v.sort_by(f64::total_cmp);
    }
    Row {
        clients,
        pairs: all.len(),
        pair_p50_us: percentile(&pair, 0.5),
        pair_p99_us: percentile(&pair, 0.99),
        allocate_p50_us: percentile(&alloc, 0.5),
        allocate_p99_us: percentile(&alloc, 0.99),
        release_p99_us: percentile(&rel, 0.99),
        pairs_per_s: all.len() as f64 / wall,
        rss_after_kib: rss_kib(pid, "VmRSS:"),
    }
}

/// Starts `smartmig bench flood` as `args.flood_user` against `socket`
/// and waits until it holds its connections (or 3 s).
fn start_flood(exe: &Path, socket: &Path, args: &Args) -> Result<Child, BenchError> {
    let child = Command::new("runuser")
        .args(["-u", &args.flood_user, "--"])
        .arg(exe)
        .args(["bench", "flood", "--socket"])
        .arg(socket)
        .args(["--connections", &args.flood.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| BenchError::Flood(format!("runuser: {e}")))?;
    std::thread::sleep(Duration::from_secs(3));
    Ok(child)
}

/// Closes the flood's stdin (its signal to stop) and reads its report.
fn stop_flood(mut child: Child) -> Result<FloodReport, BenchError> {
    drop(child.stdin.take());
    let out = child
        .wait_with_output()
        .map_err(|e| BenchError::Flood(e.to_string()))?;
    serde_json::from_slice(&out.stdout).map_err(|e| {
        BenchError::Flood(format!(
            "{e}: `{}` ({})",
            String::from_utf8_lossy(&out.stdout).trim(),
            out.status
        ))
    })
}

/// `smartmig bench flood`: holds `connections` connections to a socket,
/// trickling bytes and reopening what the daemon closes, until stdin
/// closes; then prints a [`FloodReport`] as JSON.
pub fn flood(a: &FloodArgs) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicBool, Ordering};
    // One descriptor per connection: lift the soft limit to the hard one.
    crate::daemon::server::raise_open_files_limit();
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let mut r = FloodReport {
        user: nix::unistd::Uid::current().to_string(),
        connections: a.connections,
        ..FloodReport::default()
    };
    let mut conns: Vec<Option<UnixStream>> = (0..a.connections).map(|_| None).collect();
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        for c in &mut conns {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            match c {
                None => match UnixStream::connect(&a.socket) {
                    Ok(s) => {
                        let _ = s.set_nonblocking(true);
                        *c = Some(s);
                    }
                    Err(_) => r.connect_failed += 1,
                },
                Some(s) => {
                    let closed = match s.read(&mut buf) {
                        Ok(0) => true,
                        Ok(n) => {
                            if String::from_utf8_lossy(&buf[..n]).contains("too_many_connections") {
                                r.refused += 1;
                            }
                            true
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            s.write(b" ").is_err()
                        }
                        Err(_) => true,
                    };
                    if closed {
                        r.closed_by_daemon += 1;
                        *c = None;
                    }
                }
            }
        }
        r.held_max = r.held_max.max(conns.iter().flatten().count());
        std::thread::sleep(Duration::from_millis(a.trickle_ms.min(1000)));
    }
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

/// Prints the table.
pub fn table(r: &Report) -> String {
    let mut s = format!(
        "smartmigd sim backend, {} x A100-40GB, K=1 allocate+release over a Unix socket\n\
         journal {}\n\
         RSS idle {} KiB, peak {} KiB\n\
         {:>7} {:>7} {:>11} {:>11} {:>12} {:>12} {:>12} {:>10} {:>10}\n",
        r.gpus,
        r.journal,
        r.rss_idle_kib,
        r.rss_peak_kib,
        "clients",
        "pairs",
        "pair p50us",
        "pair p99us",
        "alloc p50us",
        "alloc p99us",
        "rel p99us",
        "pairs/s",
        "RSS KiB"
    );
    if let Some(f) = &r.flood {
        s.push_str(&format!(
            "during a flood by uid {} ({} connections, a byte a second each, on the public socket): \
             {} refused (too_many_connections), {} closed in all; smartmigd had {} descriptors open\n",
            f.user, f.connections, f.refused, f.closed_by_daemon, f.daemon_fds
        ));
    }
    for x in &r.rows {
        s.push_str(&format!(
            "{:>7} {:>7} {:>11.0} {:>11.0} {:>12.0} {:>12.0} {:>12.0} {:>10.0} {:>10}\n",
            x.clients,
            x.pairs,
            x.pair_p50_us,
            x.pair_p99_us,
            x.allocate_p50_us,
            x.allocate_p99_us,
            x.release_p99_us,
            x.pairs_per_s,
            x.rss_after_kib
        ));
    }
    s
}

/// Entry point for the CLI: runs, prints the table, writes the JSON.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let report = bench(args)?;
    write!(args.json.table(), "{}", table(&report))?;
    args.json.write(&report)
}
