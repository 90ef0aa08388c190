//! Helpers shared by the end-to-end tests in `tests/`.
//!
//! The tests drive the real binaries of the sibling crates (`smartmig`,
//! `smartmigd`) and the SPANK plugin (`libsmartmig_spank.so`). Cargo does not
//! build another package's binaries for an integration test, so the tests
//! expect a prior `cargo build --release --workspace` (which `scripts/test`
//! runs) and find the artifacts in the same profile directory as themselves.

#![forbid(unsafe_code)]
// The house rule: no function over 100 lines (clippy counts the lines of code).
#![warn(clippy::too_many_lines)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The profile directory (`<target>/<profile>`) this crate was built in,
/// set by `build.rs`.
pub fn artifact_dir() -> &'static Path {
    Path::new(env!("SMARTMIG_ARTIFACT_DIR"))
}

/// Path of a built artifact (`"smartmig"`, `"smartmigd"`,
/// `"libsmartmig_spank.so"`) of the current profile.
///
/// # Panics
/// If the file does not exist, with a message saying how to build it.
pub fn artifact(name: &str) -> PathBuf {
    let path = artifact_dir().join(name);
    assert!(
        path.exists(),
        "artifact `{}` not found at {}: run `cargo build --release --workspace` first \
         (the end-to-end tests use the binaries of the same profile)",
        name,
        path.display()
    );
    path
}

/// The directory holding the repository's scripts and test fixtures.
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Slurm release series the tests run against when it is not the
/// host's: `SMARTMIG_SLURM_SERIES` (e.g. `24.11`), whose Slurm runs in a
/// root file system of its Debian suite (`scripts/slurm-series`). `None`:
/// the host's Slurm.
pub fn slurm_series() -> Option<String> {
    std::env::var("SMARTMIG_SLURM_SERIES")
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// A command that talks to the test cluster's Slurm: run as it is on the
/// host's series, inside the series' root file system otherwise
/// (`scripts/slurm-series run SERIES PROGRAM`, which exec's PROGRAM, so the
/// child's pid is the program's). Paths under /tmp and the checkout are the
/// same inside and out. Slurm's clients, `smartmigd` (which runs them) and
/// `smartmig doctor` go through here.
pub fn in_slurm(program: impl AsRef<OsStr>) -> Command {
    match slurm_series() {
        None => Command::new(program),
        Some(series) => {
            let mut cmd = Command::new(repo_root().join("scripts/slurm-series"));
            cmd.arg("run").arg(series).arg(program);
            cmd
        }
    }
}

/// The test cluster's Slurm release series (`(24, 11)`), from the series'
/// `slurmd -V` (Slurm's clients, `scontrol --version` included, stop
/// without a slurm.conf; slurmd does not).
///
/// # Panics
/// When it prints no version.
pub fn slurm_release() -> (u32, u32) {
    let out = in_slurm("slurmd")
        .arg("-V")
        .output()
        .expect("run slurmd -V");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace().last().unwrap_or("").split('.');
    match (
        parts.next().and_then(|p| p.parse().ok()),
        parts.next().and_then(|p| p.parse().ok()),
    ) {
        (Some(major), Some(minor)) => (major, minor),
        _ => panic!("slurmd -V printed no version: {}", describe(&out)),
    }
}

/// Makes the next [`SlurmCluster`] of this process start a requeued job
/// within seconds instead of minutes: the scheduler looks at the queue
/// every 2 s, and a requeued job is held 5 s (Slurm's default is
/// `cred_expire` + 1 = 121 s). Slurm 25.11 and later set that hold with
/// `SchedulerParameters=requeue_delay=`; older series only through
/// `AuthInfo=cred_expire=`, which also shortens every job credential's
/// lifetime.
pub fn quick_requeues() {
    if slurm_release() >= (25, 11) {
        std::env::remove_var("SMARTMIG_SLURM_CRED_EXPIRE");
        std::env::set_var(
            "SMARTMIG_SLURM_SCHED_EXTRA",
            "sched_interval=2,requeue_delay=5",
        );
    } else {
        std::env::set_var("SMARTMIG_SLURM_CRED_EXPIRE", "5");
        std::env::set_var("SMARTMIG_SLURM_SCHED_EXTRA", "sched_interval=2");
    }
}

/// The SPANK plugin for the test cluster's Slurm: the build's
/// `libsmartmig_spank.so` on the host's series, else the copy built
/// against that series' headers (`scripts/slurm-series plugin SERIES`
/// writes `<target>/slurm/SERIES/libsmartmig_spank.so`).
///
/// # Panics
/// If that file does not exist, saying how to build it.
pub fn plugin() -> PathBuf {
    let Some(series) = slurm_series() else {
        return artifact("libsmartmig_spank.so");
    };
    let target = artifact_dir().parent().unwrap_or(artifact_dir());
    let path = target
        .join("slurm")
        .join(&series)
        .join("libsmartmig_spank.so");
    assert!(
        path.exists(),
        "the plugin for Slurm {series} is not at {}: run `scripts/slurm-series plugin {series}` first",
        path.display()
    );
    path
}

/// Fails the calling test unless it runs as root (the Slurm harness needs
/// root for `mknod` and `SlurmUser=root`). End-to-end tests must never skip
/// silently.
pub fn require_root(what: &str) {
    let out = Command::new("id").arg("-u").output().expect("run `id -u`");
    let uid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        uid == "0",
        "{what} must run as root (uid is {uid}): it starts a real Slurm cluster \
         (mknod of fake GPU devices, SlurmUser=root). Run `scripts/test` as root."
    );
}

/// The ordinary user test jobs run as (a system user with a group of the
/// same name). Not `nobody`: Slurm 26.05 refuses `--uid=nobody` ("Invalid
/// --uid specification"; it reserves that name).
pub const JOB_USER: &str = "smartmig-job";

/// [`JOB_USER`], created first when it does not exist.
pub fn job_user() -> &'static str {
    static MADE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    MADE.get_or_init(|| ensure_user(JOB_USER));
    JOB_USER
}

/// The uid of local user `name`, created first (a system user with a group
/// of the same name, no home, no login shell) when it does not exist: tests
/// of isolation between users need real uids that Slurm can resolve.
pub fn ensure_user(name: &str) -> u32 {
    let id = |name: &str| -> Option<u32> {
        let out = Command::new("id").args(["-u", name]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    if let Some(uid) = id(name) {
        return uid;
    }
    let out = Command::new("useradd")
        .args([
            "--system",
            "--user-group",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ])
        .output()
        .unwrap_or_else(|e| panic!("run useradd {name}: {e}"));
    assert!(out.status.success(), "useradd {name}: {}", describe(&out));
    id(name).unwrap_or_else(|| panic!("user {name} has no uid after useradd"))
}

/// Output of a finished command as text, for error messages.
pub fn describe(out: &Output) -> String {
    format!(
        "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A throw-away single-node Slurm cluster started by `tests/slurm/cluster.sh`
/// in a fresh directory; stopped again (`cluster.sh down`) on drop, even when
/// the test panics. The directory is removed after a passing test and kept
/// (its path printed) after a failing one.
///
/// Clusters use fixed ports, so within one test binary they are started one
/// at a time: `up` waits while another `SlurmCluster` of the process is alive.
/// (Cargo runs test binaries one after another.)
pub struct SlurmCluster {
    dir: PathBuf,
    /// (slurmctld, slurmd) ports.
    ports: (u16, u16),
    _exclusive: MutexGuard<'static, ()>,
}

static CLUSTER_LOCK: Mutex<()> = Mutex::new(());

/// The cluster's ports: from the environment, else two ports that are free
/// right now (bound to port 0 and released; a tiny race with other
/// processes remains, which `cluster.sh` reports as "port in use").
fn pick_ports() -> (u16, u16) {
    let env_port = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u16>().ok());
    if let (Some(a), Some(b)) = (
        env_port("SMARTMIG_SLURMCTLD_PORT"),
        env_port("SMARTMIG_SLURMD_PORT"),
    ) {
        return (a, b);
    }
    let a = std::net::TcpListener::bind("0.0.0.0:0");
    let b = std::net::TcpListener::bind("0.0.0.0:0");
    match (a, b) {
        (Ok(a), Ok(b)) => match (a.local_addr(), b.local_addr()) {
            (Ok(x), Ok(y)) => (x.port(), y.port()),
            _ => (6917, 6918),
        },
        _ => (6917, 6918),
    }
}

/// The `KEY=value` words of a job's output (or of `scontrol show job -o`).
pub fn fields(output: &str) -> std::collections::HashMap<String, String> {
    output
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The plugstack.conf line that loads the built plugin for a test cluster
/// in `dir` (the sidecar's root-only socket, `dir/run/smartmigd-root.sock`,
/// as [`Sidecar::start`] makes it), with a 40 s request timeout and `extra`
/// plugin arguments.
pub fn plugstack_line(dir: &Path, extra: &str) -> String {
    format!(
        "required {} socket={} timeout=40 {extra}\n",
        plugin().display(),
        dir.join("run/smartmigd-root.sock").display()
    )
}

/// Job states after which a Slurm job no longer changes.
pub const FINAL_JOB_STATES: &[&str] = &[
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
];

/// The one polling helper of the test crates (`sidecar/test-support`,
/// shared with the CLI's tests): wait for an observable event, fail naming
/// it and the last state seen.
pub use smartmig_test_support::{wait_until, Outcome, TimedOut, Wait};

/// Whether `f` holds within `timeout` (polled every 200 ms), for callers
/// that assert with a message of their own; [`wait_until`] fails by
/// itself.
pub fn holds_within(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    Wait::new("", timeout)
        .every(Duration::from_millis(200))
        .poll(f)
        .is_ok()
}

impl SlurmCluster {
    /// Starts a cluster; panics with the script's output (which includes the
    /// daemons' log tails) when it does not come up.
    pub fn up() -> SlurmCluster {
        SlurmCluster::up_with(|_| {})
    }

    /// Like [`SlurmCluster::up`], but first calls `prepare` with the
    /// (empty) cluster directory, e.g. to write `plugstack.conf`: slurmd
    /// decides at start whether SPANK plugins have a job epilog, so a plugin
    /// that releases in `job_epilog` must be listed before slurmd starts.
    ///
    /// Ports: `SMARTMIG_SLURMCTLD_PORT`/`SMARTMIG_SLURMD_PORT` when set, else
    /// two free ports picked now, so that clusters of different processes
    /// (other checkouts on a shared machine) do not collide.
    pub fn up_with(prepare: impl FnOnce(&Path)) -> SlurmCluster {
        require_root("the Slurm end-to-end test");
        // A test that panicked while holding the lock has already stopped
        // its cluster in Drop, so a poisoned lock is fine to take.
        let exclusive = CLUSTER_LOCK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("smartmig-slurm-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        // The guard exists before `up` so that a half-started cluster is
        // stopped too.
        let cluster = SlurmCluster {
            dir,
            ports: pick_ports(),
            _exclusive: exclusive,
        };
        prepare(&cluster.dir);
        let out = cluster.script("up");
        assert!(
            out.status.success(),
            "`cluster.sh up {}` failed: {}",
            cluster.dir.display(),
            describe(&out)
        );
        cluster
    }

    /// Stops slurmd and slurmctld and starts them again on the cluster's
    /// (edited) slurm.conf and gres.conf, as an admin does after changing
    /// GRES (`cluster.sh restart`); panics when the node is not idle again.
    pub fn restart_slurm(&self) {
        let out = self.script("restart");
        assert!(
            out.status.success(),
            "`cluster.sh restart {}` failed: {}",
            self.dir.display(),
            describe(&out)
        );
    }

    fn script(&self, cmd: &str) -> Output {
        Command::new("bash")
            .arg(repo_root().join("tests/slurm/cluster.sh"))
            .arg(cmd)
            .arg(&self.dir)
            .env("SMARTMIG_SLURMCTLD_PORT", self.ports.0.to_string())
            .env("SMARTMIG_SLURMD_PORT", self.ports.1.to_string())
            .output()
            .unwrap_or_else(|e| panic!("run tests/slurm/cluster.sh {cmd}: {e}"))
    }

    /// The cluster's directory (slurm.conf, gres.conf, plugstack.conf, log/).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `slurm.conf` of this cluster (what `SLURM_CONF` points at).
    pub fn slurm_conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// A Slurm client command (`sbatch`, `squeue`, ...) aimed at this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = in_slurm(program);
        cmd.env("SLURM_CONF", self.slurm_conf())
            .current_dir(&self.dir);
        cmd
    }

    /// Runs `sbatch --parsable ARGS` and returns the job id.
    pub fn sbatch(&self, args: &[&str]) -> u32 {
        self.sbatch_env(&[], args)
    }

    /// Runs `sbatch --parsable ARGS` with `env` added to sbatch's own
    /// environment (which the job inherits: `--export=ALL`, the default)
    /// and returns the job id. Use this, not `--export=ALL,VAR=value`, for a
    /// variable a user sets: an `--export` list implies `--get-user-env`,
    /// which loads the job user's login environment on the node and, from
    /// Slurm 26.05 on, fails the launch (the job is requeued and held) for a
    /// user without a login shell, such as the test user.
    pub fn sbatch_env(&self, env: &[(&str, &str)], args: &[&str]) -> u32 {
        let out = self
            .command("sbatch")
            .envs(env.iter().copied())
            .arg("--parsable")
            .arg(format!("--chdir={}", self.dir.display()))
            .args(args)
            .output()
            .expect("run sbatch");
        assert!(
            out.status.success(),
            "sbatch {args:?} failed: {}",
            describe(&out)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let id = text.trim().split(';').next().unwrap_or("");
        id.parse()
            .unwrap_or_else(|_| panic!("sbatch printed no job id: {}", describe(&out)))
    }

    /// Submits `sbatch --parsable ARGS --wrap BODY` as root, the job's
    /// output going to `DIR/jobs-<id>.out`.
    pub fn sbatch_wrap(&self, args: &[&str], body: &str) -> u32 {
        let out = self.dir.join("jobs-%j.out");
        let out = out.to_str().expect("utf-8 path");
        let mut all = vec!["-o", out];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--wrap", body]);
        self.sbatch(&all)
    }

    /// Waits for `job` to end and fails the test, with its records,
    /// smartmigd's log and the daemons' log tails, unless it COMPLETED.
    pub fn assert_completed(&self, job: u32, timeout: Duration) {
        let state = self.wait_job(job, timeout);
        assert_eq!(
            state,
            "COMPLETED",
            "job {job}: {:#?}\n{}\n{}",
            self.job_records(job),
            self.smartmigd_log(),
            self.log_tails()
        );
    }

    /// smartmigd's log as [`Sidecar::start_on`] writes it in this cluster's
    /// directory (empty when there is none yet).
    pub fn smartmigd_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log/smartmigd.log")).unwrap_or_default()
    }

    /// Runs `sbatch --parsable ARGS` and returns its output whatever the
    /// outcome (for tests of refused submissions).
    pub fn try_sbatch(&self, args: &[&str]) -> Output {
        self.command("sbatch")
            .arg("--parsable")
            .arg(format!("--chdir={}", self.dir.display()))
            .args(args)
            .output()
            .expect("run sbatch")
    }

    /// Submits `BODY` as the ordinary user [`JOB_USER`] (as a real
    /// cluster runs the plugin: slurmstepd as root, tasks as the user),
    /// output to `out`; returns the job id.
    pub fn sbatch_as_job_user(&self, out: &Path, args: &[&str], body: &str) -> u32 {
        let user = job_user();
        self.sbatch_as(user, user, out, args, body)
    }

    /// Submits `BODY` as `user` (group `group`), output to `out`.
    pub fn sbatch_as(&self, user: &str, group: &str, out: &Path, args: &[&str], body: &str) -> u32 {
        self.sbatch_as_env(user, group, &[], out, args, body)
    }

    /// [`SlurmCluster::sbatch_as_job_user`] with `env` in sbatch's
    /// environment, as a user who set it in their shell.
    pub fn sbatch_as_job_user_env(
        &self,
        env: &[(&str, &str)],
        out: &Path,
        args: &[&str],
        body: &str,
    ) -> u32 {
        let user = job_user();
        self.sbatch_as_env(user, user, env, out, args, body)
    }

    fn sbatch_as_env(
        &self,
        user: &str,
        group: &str,
        env: &[(&str, &str)],
        out: &Path,
        args: &[&str],
        body: &str,
    ) -> u32 {
        let (uid, gid) = (format!("--uid={user}"), format!("--gid={group}"));
        let mut all = vec![
            uid.as_str(),
            gid.as_str(),
            "-o",
            out.to_str().expect("utf-8 path"),
        ];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--wrap", body]);
        self.sbatch_env(env, &all)
    }

    /// Runs `sbatch --parsable ARGS`, asserts that Slurm refused it and
    /// returns what the user saw (stdout and stderr).
    pub fn sbatch_refused(&self, args: &[&str]) -> String {
        let out = self.try_sbatch(args);
        assert!(
            !out.status.success(),
            "sbatch {args:?} was accepted: {}",
            describe(&out)
        );
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `scontrol show job -o JOB` as `Key=value` maps, one per record (an
    /// array job has one per task); empty when Slurm no longer knows it.
    pub fn job_records(&self, job: u32) -> Vec<std::collections::HashMap<String, String>> {
        let out = self
            .command("scontrol")
            .args(["show", "job", "-o", &job.to_string()])
            .output()
            .expect("run scontrol");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(fields)
            .collect()
    }

    /// The node's state as `sinfo -h -o %T` prints it (`idle`, `mixed`,
    /// `drained`, ...).
    pub fn node_state(&self) -> String {
        let out = self
            .command("sinfo")
            .args(["-h", "-o", "%T"])
            .output()
            .expect("run sinfo");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Waits until the node reports `state` (e.g. `idle` once the last
    /// job's epilog finished); returns whether it did within `timeout`.
    pub fn wait_node_state(&self, state: &str, timeout: Duration) -> bool {
        Wait::new("", timeout)
            .poll(|| self.node_state() == state)
            .is_ok()
    }

    /// A directory in the cluster that any user may write (job output of
    /// jobs submitted as [`JOB_USER`]).
    pub fn shared_dir(&self) -> PathBuf {
        let dir = self.dir.join("jobs");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let mut perms = std::fs::metadata(&dir)
            .unwrap_or_else(|e| panic!("stat {}: {e}", dir.display()))
            .permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o1777);
        std::fs::set_permissions(&dir, perms)
            .unwrap_or_else(|e| panic!("chmod {}: {e}", dir.display()));
        dir
    }

    /// Current state of a job (`PENDING`, `RUNNING`, `COMPLETED`, ...), from
    /// `scontrol show job` (completed jobs stay visible for `MinJobAge`).
    pub fn job_state(&self, job: u32) -> Option<String> {
        let out = self
            .command("scontrol")
            .args(["show", "job", "-o", &job.to_string()])
            .output()
            .expect("run scontrol");
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("JobState="))
            .map(str::to_string)
    }

    /// Waits until the job reaches a final state and returns that state;
    /// panics after `timeout` with the job's last state and the logs.
    pub fn wait_job(&self, job: u32, timeout: Duration) -> String {
        Wait::new(format!("job {job} to finish"), timeout)
            .context(|| self.log_tails())
            .until(|| match self.job_state(job) {
                Some(state) if FINAL_JOB_STATES.contains(&state.as_str()) => Ok(state),
                last => Err(last),
            })
    }

    /// The last lines of slurmctld.log and slurmd.log, for failure messages.
    pub fn log_tails(&self) -> String {
        let mut text = String::new();
        for name in ["slurmctld.log", "slurmd.log", "smartmigd.log"] {
            let path = self.dir.join("log").join(name);
            if !path.exists() {
                continue;
            }
            let content = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = content.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            text.push_str(&format!("----- tail {} -----\n", path.display()));
            for line in tail {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        let out = self.script("down");
        if !out.status.success() {
            eprintln!(
                "warning: `cluster.sh down {}` failed: {}",
                self.dir.display(),
                describe(&out)
            );
        }
        if std::thread::panicking() {
            eprintln!(
                "Slurm test cluster kept for inspection: {}",
                self.dir.display()
            );
        } else if out.status.success() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// What a test sidecar drives.
pub enum SidecarBackend {
    /// The sim backend with two A100-40GB.
    Sim,
    /// The nvml backend over the NVML emulator (`sidecar/nvml-emu`, the
    /// build's `libsmartmig_nvml_emu.so`) whose state is in this directory.
    NvmlEmulator(PathBuf),
}

impl SidecarBackend {
    fn top_toml(&self) -> String {
        match self {
            SidecarBackend::Sim => "backend = \"sim\"\n".into(),
            SidecarBackend::NvmlEmulator(_) => "backend = \"nvml\"\n".into(),
        }
    }

    fn tables_toml(&self) -> String {
        match self {
            SidecarBackend::Sim => "[[gpus]]\nmodel = \"a100-40gb\"\ncount = 2\n".into(),
            SidecarBackend::NvmlEmulator(emu) => format!(
                "[nvml]\nlibrary = \"{}\"\ncapabilities_dir = \"{}\"\ncaps_dev_dir = \"{}\"\n",
                artifact("libsmartmig_nvml_emu.so").display(),
                emu.join("capabilities").display(),
                emu.join("nvidia-caps").display(),
            ),
        }
    }

    fn env(&self) -> Vec<(&'static str, PathBuf)> {
        match self {
            SidecarBackend::Sim => Vec::new(),
            SidecarBackend::NvmlEmulator(emu) => vec![("SMARTMIG_NVML_EMU_DIR", emu.clone())],
        }
    }
}

/// A `smartmigd` started for a test from the build's binary, with a config
/// written into the cluster directory (`smartmigd.toml`), its socket at
/// `DIR/run/smartmigd.sock`, state in `DIR/smartmigd-state` and its log in
/// `DIR/log/smartmigd.log`. Stopped (SIGTERM, then SIGKILL) on drop.
pub struct Sidecar {
    child: Option<std::process::Child>,
    socket: PathBuf,
}

impl Sidecar {
    /// Starts smartmigd with the sim backend (`gpus` as TOML `[[gpus]]`
    /// tables, e.g. two A100-40GB) plus `extra` TOML lines, and waits until
    /// `smartmig status` answers. Panics with the daemon's log otherwise.
    pub fn start(dir: &Path, extra: &str) -> Sidecar {
        Sidecar::start_on(dir, extra, false, &SidecarBackend::Sim)
    }

    /// Like [`Sidecar::start`], but with Slurm queries enabled
    /// (`[slurm] enabled = true`): the daemon runs `squeue`, `scontrol`
    /// against the cluster of `DIR/slurm.conf` (requeue after an
    /// out-of-memory failure, releasing instances of ended jobs).
    pub fn start_with_slurm(dir: &Path, extra: &str) -> Sidecar {
        Sidecar::start_on(dir, extra, true, &SidecarBackend::Sim)
    }

    /// Starts smartmigd on `backend`, with Slurm queries on or off. Called
    /// again on the same directory (after [`Sidecar::kill`]), it restarts
    /// the daemon on the state the first one left.
    pub fn start_on(dir: &Path, extra: &str, slurm: bool, backend: &SidecarBackend) -> Sidecar {
        Sidecar::start_configured(dir, extra, slurm, "", backend)
    }

    /// [`Sidecar::start_on`] with `slurm_extra` added to the `[slurm]`
    /// table (e.g. `holds = "next-job"`).
    pub fn start_configured(
        dir: &Path,
        extra: &str,
        slurm: bool,
        slurm_extra: &str,
        backend: &SidecarBackend,
    ) -> Sidecar {
        let socket = dir.join("run/smartmigd.sock");
        let state = dir.join("smartmigd-state");
        let text = format!(
            "# Written by the smartmig end-to-end tests.\n\
             socket = \"{}\"\n\
             state_dir = \"{}\"\n\
             slurm_user = \"root\"\n\
             log_level = \"info\"\n\
             {}\
             {extra}\n\
             {}\
             \n\
             [slurm]\n\
             enabled = {slurm}\n\
             {slurm_extra}\n",
            socket.display(),
            state.display(),
            backend.top_toml(),
            backend.tables_toml(),
        );
        Sidecar::start_text(dir, &text, backend)
    }

    /// The packaged example config (etc/smartmig.toml, every key at its
    /// shipped value) made to run in the cluster directory: the socket,
    /// state and journal there, the sim backend with two A100-40GB, and
    /// nothing else changed (no `holds` key, `allocate_wait_s = 30`).
    pub fn packaged_config(dir: &Path) -> String {
        let shipped = std::fs::read_to_string(repo_root().join("etc/smartmig.toml"))
            .expect("read etc/smartmig.toml");
        let mut out =
            String::from("# etc/smartmig.toml as packaged, paths moved into the test cluster.\n");
        for line in shipped.lines() {
            let line = match line.split_once(" = ") {
                Some(("socket", _)) => {
                    format!("socket = \"{}\"", dir.join("run/smartmigd.sock").display())
                }
                Some(("state_dir", _)) => {
                    format!("state_dir = \"{}\"", dir.join("smartmigd-state").display())
                }
                Some(("journal_dir", _)) => format!(
                    "journal_dir = \"{}\"",
                    dir.join("smartmigd-journal").display()
                ),
                Some(("backend", _)) => "backend = \"sim\"".to_string(),
                _ => line.to_string(),
            };
            out.push_str(&line);
            out.push('\n');
        }
        out.push_str("\n[[gpus]]\nmodel = \"a100-40gb\"\ncount = 2\n");
        out
    }

    /// Starts smartmigd with `text` as its whole config (written to
    /// `DIR/smartmigd.toml`; its socket must be `DIR/run/smartmigd.sock`).
    pub fn start_text(dir: &Path, text: &str, backend: &SidecarBackend) -> Sidecar {
        let socket = dir.join("run/smartmigd.sock");
        let log_dir = dir.join("log");
        for d in [dir.join("run"), log_dir.clone()] {
            std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        }
        let config = dir.join("smartmigd.toml");
        std::fs::write(&config, text).unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
        let log_path = log_dir.join("smartmigd.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap_or_else(|e| panic!("open {}: {e}", log_path.display()));
        let log2 = log.try_clone().expect("clone log handle");
        let child = in_slurm(artifact("smartmigd"))
            .arg("--config")
            .arg(&config)
            .env("SLURM_CONF", dir.join("slurm.conf"))
            .envs(backend.env())
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .unwrap_or_else(|e| panic!("start smartmigd: {e}"));
        let mut sidecar = Sidecar {
            child: Some(child),
            socket,
        };
        Wait::new(
            "smartmigd to answer `smartmig status`",
            Duration::from_secs(20),
        )
        .every(Duration::from_millis(50))
        .context(|| std::fs::read_to_string(&log_path).unwrap_or_default())
        .until(|| {
            if let Some(Ok(Some(status))) = sidecar.child.as_mut().map(Child::try_wait) {
                panic!(
                    "smartmigd exited during start-up ({status}):\n{}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            sidecar.try_status().map(|_| ())
        });
        sidecar
    }

    /// The daemon's epoch counter (status `epochs`).
    pub fn epochs(&self) -> u64 {
        let status = self.status();
        status["epochs"]
            .as_u64()
            .unwrap_or_else(|| panic!("a status without `epochs`: {status:#}"))
    }

    /// Waits until `n` more epochs than `since` have run to the end
    /// (`since + n`); with `since` read after an event and `n = 2`, a whole
    /// epoch ran after the event. Returns the count reached.
    pub fn wait_epochs(&self, since: u64, n: u64, timeout: Duration) -> u64 {
        Wait::new(format!("epoch {} (from {since})", since + n), timeout)
            .every(Duration::from_millis(200))
            .until(|| {
                let now = self.epochs();
                if now >= since + n {
                    Ok(now)
                } else {
                    Err(now)
                }
            })
    }

    /// The daemon's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `smartmig status --socket S --json`, parsed.
    pub fn try_status(&self) -> Result<serde_json::Value, String> {
        let out = Command::new(artifact("smartmig"))
            .args(["status", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .map_err(|e| format!("run smartmig status: {e}"))?;
        if !out.status.success() {
            return Err(describe(&out));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", describe(&out)))
    }

    /// Like [`Sidecar::try_status`]; panics on failure.
    pub fn status(&self) -> serde_json::Value {
        self.try_status()
            .unwrap_or_else(|e| panic!("smartmig status failed: {e}"))
    }

    /// The human table of `smartmig status` for this daemon, as an admin
    /// reads it.
    pub fn status_table(&self) -> String {
        let out = Command::new(artifact("smartmig"))
            .args(["status", "--socket"])
            .arg(self.socket())
            .output()
            .expect("run smartmig status");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The out-of-memory events of `job` in a status reply
    /// (`memory.oom_events`), oldest first.
    pub fn oom_events(status: &serde_json::Value, job: u32) -> Vec<serde_json::Value> {
        status["memory"]["oom_events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["job_id"] == job)
            .cloned()
            .collect()
    }

    /// The decisions of [`Sidecar::oom_events`], e.g. `requeue_scheduled`.
    pub fn oom_decisions(status: &serde_json::Value, job: u32) -> Vec<String> {
        Self::oom_events(status, job)
            .iter()
            .filter_map(|e| e["decision"].as_str().map(String::from))
            .collect()
    }

    /// The learned estimate of (`user`, `job_name`) in a status reply.
    pub fn estimate(
        status: &serde_json::Value,
        user: &str,
        job_name: &str,
    ) -> Option<serde_json::Value> {
        status["memory"]["estimates"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["job_name"] == job_name && e["user"] == user)
            .cloned()
    }

    /// Every instance in a status reply, with its GPU index added as `gpu`.
    pub fn instances(status: &serde_json::Value) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        for gpu in status["gpus"].as_array().into_iter().flatten() {
            for inst in gpu["instances"].as_array().into_iter().flatten() {
                let mut inst = inst.clone();
                inst["gpu"] = gpu["index"].clone();
                out.push(inst);
            }
        }
        out
    }

    /// Stops the daemon (SIGTERM, up to 10 s, then SIGKILL). Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let exited = Wait::new("", Duration::from_secs(10))
            .every(Duration::from_millis(50))
            .poll(|| matches!(child.try_wait(), Ok(Some(_))));
        if exited.is_ok() {
            return;
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the daemon with SIGKILL (a crash): nothing is cleaned up.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_dir_is_a_profile_dir() {
        let dir = artifact_dir();
        assert!(dir.join("build").is_dir(), "{}", dir.display());
    }

    #[test]
    #[should_panic(expected = "cargo build --release --workspace")]
    fn missing_artifact_says_how_to_build_it() {
        artifact("no-such-artifact");
    }
}
