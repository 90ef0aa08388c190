//! Shared harness of the daemon integration tests: a real `smartmigd` on a
//! temporary socket driving 2 x A100-40GB, by default through the sim
//! backend. With `SMARTMIG_TEST_BACKEND=nvml` the same tests drive the nvml
//! backend over the NVML emulator (`sidecar/nvml-emu`, loaded by path from
//! the build's profile directory): `scripts/test` runs the daemon tests
//! both ways.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use smartmig::daemon::protocol::AllocateRequest;
use smartmig::daemon::Client;
use smartmig::mig::GpuModel;
use smartmig_nvml_emu::{Emulator, GpuSetup};
pub use smartmig_test_support::{Outcome, Wait};

/// The backend the tests drive: `sim` (default) or `nvml` (over the
/// emulator), from `SMARTMIG_TEST_BACKEND`.
pub fn backend() -> &'static str {
    match std::env::var("SMARTMIG_TEST_BACKEND").as_deref() {
        Err(_) | Ok("" | "sim") => "sim",
        Ok("nvml") => "nvml",
        Ok(other) => panic!("SMARTMIG_TEST_BACKEND={other}: expected sim or nvml"),
    }
}

/// The profile directory of this build (`target/release` for
/// `cargo test --release`): where cargo put this package's `smartmig`, and
/// where the same profile's build of the other packages puts `smartmigd`
/// and the NVML emulator.
pub fn profile_dir() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_smartmig"))
        .parent()
        .expect("cargo names a binary by its full path")
}

/// The command that builds package `package` in this test's profile.
fn build_command(package: &str) -> String {
    match profile_dir().file_name().and_then(|n| n.to_str()) {
        Some("debug") => format!("cargo build -p {package}"),
        Some("release") | None => format!("cargo build --release -p {package}"),
        Some(profile) => format!("cargo build --profile {profile} -p {package}"),
    }
}

/// The `smartmigd` binary of this build. It is its own package
/// (`sidecar/smartmigd`), and cargo builds only a package's own binaries
/// for its tests, so it must have been built first (`scripts/test` builds
/// the workspace); a missing binary fails the test, saying how to build it.
pub fn smartmigd() -> PathBuf {
    let path = profile_dir().join("smartmigd");
    assert!(
        path.is_file(),
        "{} is missing: build it with `{}` (scripts/test builds the whole workspace); \
         rebuild it after changing the daemon, or these tests run the old one",
        path.display(),
        build_command("smartmigd"),
    );
    path
}

/// The NVML emulator library of this build (beside `smartmigd`).
pub fn emulator_library() -> PathBuf {
    let lib = profile_dir().join("libsmartmig_nvml_emu.so");
    assert!(
        lib.is_file(),
        "{} is missing: build it with `{}` (scripts/test builds the whole workspace)",
        lib.display(),
        build_command("smartmig-nvml-emu"),
    );
    lib
}

/// The emulator's state directory of a test daemon.
fn emulator_dir(dir: &std::path::Path) -> PathBuf {
    dir.join("nvml-emu")
}

/// The backend part of a test config: the 2 x A100-40GB as `[[gpus]]` for
/// the sim backend, or, for the nvml backend, a fresh emulator with the same
/// GPUs and the `[nvml]` table that loads it. `top` goes before the first
/// table, `tables` after the others.
pub struct BackendToml {
    pub top: String,
    pub tables: String,
}

pub fn backend_toml(dir: &std::path::Path) -> BackendToml {
    match backend() {
        "sim" => BackendToml {
            top: "backend = \"sim\"\n".into(),
            tables: "[[gpus]]\nmodel = \"a100-40gb\"\ncount = 2\n".into(),
        },
        _ => {
            let emu = Emulator::create(
                &emulator_dir(dir),
                &[
                    GpuSetup::mig(GpuModel::A100_40gb),
                    GpuSetup::mig(GpuModel::A100_40gb),
                ],
            )
            .expect("create the NVML emulator's state");
            BackendToml {
                top: "backend = \"nvml\"\n".into(),
                tables: format!(
                    "[nvml]\nlibrary = \"{}\"\ncapabilities_dir = \"{}\"\ncaps_dev_dir = \"{}\"\n",
                    emulator_library().display(),
                    emu.capabilities_dir().display(),
                    emu.caps_dev_dir().display(),
                ),
            }
        }
    }
}

/// A TCP port free now on 127.0.0.1 (for `metrics_listen`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The daemon's `GET /metrics` answer (status line, headers, body) from
/// `metrics_listen = "127.0.0.1:<port>"`.
pub fn scrape(port: u16) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// The epochs the daemon's repartitioning loop has run
/// (`smartmig_epochs_total`).
pub fn epochs(port: u16) -> u64 {
    let text = scrape(port);
    text.lines()
        .find_map(|l| l.strip_prefix("smartmig_epochs_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no smartmig_epochs_total in\n{text}"))
}

/// The Unix second now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The batch step of job `job_id`, `slices` shards on GPU 0.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn batch_step(job_id: u64, slices: u8) -> AllocateRequest {
    AllocateRequest {
        step: Some(smartmig::daemon::protocol::BATCH_STEP),
        ..req(job_id, 0, slices, None)
    }
}

/// A `squeue --json` answer for [`with_fake_slurm_in`]: `jobs` (id,
/// shards) running on node `n1`'s GPU 0 since now, with a 60-minute time
/// limit.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn running_on_n1(jobs: &[(u64, u8)]) -> String {
    let now = unix_now();
    let jobs: Vec<String> = jobs
        .iter()
        .map(|(id, k)| {
            format!(
                r#"{{"job_id":{id},"job_state":"RUNNING","tres_per_node":"gres:shard:{k}","nodes":"n1","gres_detail":["shard:{k}(IDX:0)"],"time_limit":60,"start_time":{now},"end_time":{}}}"#,
                now + 3600
            )
        })
        .collect();
    format!(r#"{{"jobs":[{}]}}"#, jobs.join(","))
}

pub struct TestDaemon {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
    pub child: Option<Child>,
}

/// A daemon whose Slurm commands are scripts in its directory: `squeue`
/// prints `squeue.json`, `scontrol` appends its arguments to `scontrol.log`.
pub fn with_fake_slurm(name: &str, extra: &str, squeue_json: &str) -> TestDaemon {
    with_fake_slurm_in(name, extra, "", squeue_json)
}

/// [`with_fake_slurm`] with `extra` top-level keys (`allocate_wait_s` is 1
/// unless they set it) and `slurm_extra` keys of the `[slurm]` table.
pub fn with_fake_slurm_in(
    name: &str,
    extra: &str,
    slurm_extra: &str,
    squeue_json: &str,
) -> TestDaemon {
    TestDaemon::start_with(name, |dir| {
        let script = |file: &str, body: String| {
            let p = dir.join(file);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            let mut perms = std::fs::metadata(&p).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
            std::fs::set_permissions(&p, perms).unwrap();
            p
        };
        std::fs::write(dir.join("squeue.json"), squeue_json).unwrap();
        let squeue = script(
            "squeue",
            format!("cat {}", dir.join("squeue.json").display()),
        );
        let scontrol = script(
            "scontrol",
            format!("echo \"$@\" >> {}", dir.join("scontrol.log").display()),
        );
        let backend = backend_toml(dir);
        let wait = if extra.contains("allocate_wait_s") {
            ""
        } else {
            "allocate_wait_s = 1\n"
        };
        format!(
            "socket = \"{}\"\nstate_dir = \"{}\"\n{wait}request_timeout_s = 2\nlog_level = \"info\"\n{}{extra}\n\
             [slurm]\nenabled = true\ncheck_grants = false\nsqueue = \"{}\"\nscontrol = \"{}\"\nsinfo = \"/bin/false\"\n{slurm_extra}{}",
            dir.join("run/smartmig.sock").display(),
            dir.join("state").display(),
            backend.top,
            squeue.display(),
            scontrol.display(),
            backend.tables,
        )
    })
}

pub fn base_config(dir: &std::path::Path, extra: &str) -> String {
    let backend = backend_toml(dir);
    format!(
        "socket = \"{}\"\nstate_dir = \"{}\"\nallocate_wait_s = 1\nrequest_timeout_s = 2\nepoch_s = 3600\nlog_level = \"info\"\n{}{extra}\n[slurm]\nenabled = false\n{}",
        dir.join("run/smartmig.sock").display(),
        dir.join("state").display(),
        backend.top,
        backend.tables,
    )
}

impl TestDaemon {
    /// Writes a config (`extra` goes before the tables) and starts the daemon.
    pub fn start(name: &str, extra: &str) -> TestDaemon {
        TestDaemon::start_with(name, |dir| base_config(dir, extra))
    }

    /// Starts the daemon in a fresh directory with the config `config`
    /// writes there (it may also put helper files into the directory).
    pub fn start_with(name: &str, config: impl FnOnce(&std::path::Path) -> String) -> TestDaemon {
        // Tests of several files share one process (one binary per theme),
        // so the directory is unique per start, not only per process.
        static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("smartmig-it-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let text = config(&dir);
        let config = dir.join("smartmig.toml");
        std::fs::write(&config, text).unwrap();
        let mut d = TestDaemon {
            socket: dir.join("run/smartmig.sock"),
            dir,
            config,
            child: None,
        };
        d.spawn();
        d
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("daemon.log"))
            .unwrap();
        let child = Command::new(smartmigd())
            .arg("--config")
            .arg(&self.config)
            .env(smartmig_nvml_emu::DIR_ENV, emulator_dir(&self.dir))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut child = Some(child);
        Wait::new("a health reply", Duration::from_secs(20))
            .every(Duration::from_millis(20))
            .context(|| self.log())
            .until(|| {
                if let Some(st) = child.as_mut().unwrap().try_wait().unwrap() {
                    panic!("smartmigd exited with {st}: {}", self.log());
                }
                self.client().health()
            });
        self.child = child;
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// Polls `probe` (`bool`, `Option` or `Result` with the state seen)
    /// until it succeeds; fails after 30 s naming `what`, with the last
    /// state seen and the daemon's log.
    pub fn wait_until<P: Outcome>(&self, what: &str, probe: impl FnMut() -> P) -> P::Done {
        Wait::new(what, Duration::from_secs(30))
            .every(Duration::from_millis(20))
            .context(|| self.log())
            .until(probe)
    }

    /// The daemon's epoch counter (status `epochs`).
    pub fn epochs(&self) -> u64 {
        self.client().status().expect("status").epochs
    }

    /// Waits until `n` more epochs than `since` have run to the end; with
    /// `since` read after an event and `n = 2`, a whole epoch ran after it.
    pub fn wait_epochs(&self, since: u64, n: u64) -> u64 {
        self.wait_until(&format!("epoch {} (from {since})", since + n), || {
            let now = self.epochs();
            if now >= since + n {
                Ok(now)
            } else {
                Err(now)
            }
        })
    }

    pub fn client(&self) -> Client {
        Client::new(&self.socket).with_io_timeout(Duration::from_secs(20))
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    pub fn kill9(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let mut c = self.child.take().unwrap();
        Wait::new("smartmigd to exit", limit)
            .every(Duration::from_millis(20))
            .context(|| self.log())
            .until(|| c.try_wait().unwrap())
    }

    /// Sends raw bytes on a fresh connection and returns the reply line (parsed).
    pub fn raw(&self, bytes: &[u8]) -> serde_json::Value {
        let mut s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(bytes);
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("daemon log:\n{}", self.log());
        }
    }
}

/// UUIDs of the instances the backend holds on `gpu`, read from disk (the
/// sim backend's state file or the emulator's state): what a restarted
/// daemon would find.
pub fn backend_uuids(
    d: &TestDaemon,
    gpu: u32,
) -> std::io::Result<std::collections::BTreeSet<String>> {
    if backend() == "nvml" {
        let emu = Emulator::open(&emulator_dir(&d.dir)).map_err(std::io::Error::other)?;
        return Ok(emu
            .instances(gpu)
            .map_err(std::io::Error::other)?
            .into_iter()
            .filter_map(|i| i.uuid)
            .collect());
    }
    let bytes = std::fs::read(d.dir.join(format!("state/sim/gpu{gpu}.json")))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("sim state is JSON");
    Ok(v["instances"]
        .as_array()
        .expect("sim state lists instances")
        .iter()
        .map(|i| i["uuid"].as_str().expect("instance uuid").to_string())
        .collect())
}

pub fn req(job_id: u64, gpu: u32, slices: u8, memory_gb: Option<f64>) -> AllocateRequest {
    AllocateRequest {
        job_id,
        step: Some(0),
        uid: 1000,
        gpu,
        slices,
        memory_gb,
        deadline: None,
        time_limit_s: Some(3600),
        job_name: None,
        oom_marker: None,
        profile: None,
    }
}
