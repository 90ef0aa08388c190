//! smartmigd's TOML configuration: parsing, defaults and validation.
//!
//! Parsing is strict (`deny_unknown_fields`): a misspelt key is an error, not
//! a silently ignored setting on a production node. Validation errors name
//! the key as written in the file (`gpus[1].model: ...`) so an admin can fix
//! it without reading code. `etc/smartmig.toml` lists every key with its
//! default; `docs/daemon.md` explains them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::mig::GpuModel;

use super::protocol::{DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_SOCKET};

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A value that parsed but makes no sense; `key` is spelt as in the file.
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
    /// `policy` names a policy the daemon will not run.
    #[error("policy: {0}")]
    Policy(#[source] super::policy_choice::PolicyChoiceError),
    /// `placement` names a placement the daemon will not run.
    #[error("placement: {0}")]
    Placement(#[source] super::placement::PlacementChoiceError),
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// Which MIG backend drives the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// Simulated GPUs (`[[gpus]]`), same geometry rules as the hardware.
    Sim,
    /// Real GPUs through NVML.
    Nvml,
}

/// One group of simulated GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuGroup {
    /// Model id, e.g. `a100-40gb` (see `smartmig layouts --help`).
    pub model: String,
    /// How many GPUs of this model (default 1).
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

/// Slurm queries (`squeue`, `sinfo`, `scontrol`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    /// Query Slurm at all (false for tests and nodes without Slurm).
    pub enabled: bool,
    pub squeue: String,
    pub sinfo: String,
    pub scontrol: String,
    /// `slurmd -G` prints the node's GRES as slurmd parsed gres.conf: used
    /// at start to check that Slurm's GPU i is NVML's GPU i.
    pub slurmd: String,
    /// Seconds a Slurm command may run before it is killed.
    pub command_timeout_s: u64,
    /// Check each job's first allocate against slurmctld's record of the
    /// job (`scontrol show job -d`): the step's shard count and GPU come
    /// from an environment the user may have set (issue 42). Off only for
    /// tests whose Slurm is a script.
    pub check_grants: bool,
    /// Hold the shards of each GPU that MIG cannot build next to its busy
    /// instances, so that Slurm does not offer them (issue 42): `auto`
    /// (the default, also when the key is absent), `off`, `adaptive`,
    /// `next-job` or `any-mix` ([`crate::mig::OfferPolicy`]). Needs one GRES type per GPU,
    /// `mig<index>` (docs/slurm-integration.md §9); where gres.conf lacks
    /// them smartmigd runs without holds ([`crate::holds::decide`]).
    pub holds: HoldRule,
    /// The partition the holds are queued in; empty: Slurm's default
    /// partition. A partition with `Hidden=YES` (and `AllowGroups` of
    /// smartmigd's user) keeps them out of users' `squeue`
    /// (docs/slurm-integration.md §9, "Hiding the holds").
    pub hold_partition: String,
    /// Queues the holds (`salloc --no-shell`).
    pub salloc: String,
    /// Cancels holds no longer needed.
    pub scancel: String,
}

/// `slurm.holds`: whether and by which rule smartmigd holds stranded shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HoldRule {
    /// `adaptive` where Slurm's gres.conf gives each GPU its own type
    /// (`mig<index>`), off where it does not (issue 56: prevention by
    /// default on a new node, no broken holds on an old one).
    #[default]
    Auto,
    Off,
    /// `next-job` on each GPU, `any-mix` for an hour after a job was
    /// turned away or requeued there (issue 55).
    Adaptive,
    NextJob,
    AnyMix,
}

impl HoldRule {
    /// The offer rule this setting asks for on a node whose gres.conf is
    /// typed per GPU; `None` when off. What smartmigd runs is
    /// [`crate::holds::decide`]'s answer, which also looks at gres.conf.
    pub fn offer_rule(self) -> Option<crate::mig::OfferPolicy> {
        use crate::mig::{OfferPolicy, OfferRule};
        match self {
            HoldRule::Off => None,
            HoldRule::Auto | HoldRule::Adaptive => Some(OfferPolicy::Adaptive),
            HoldRule::NextJob => Some(OfferPolicy::Fixed(OfferRule::NextJob)),
            HoldRule::AnyMix => Some(OfferPolicy::Fixed(OfferRule::AnyMix)),
        }
    }

    /// The name in smartmig.toml.
    pub fn name(self) -> &'static str {
        match self {
            HoldRule::Auto => "auto",
            HoldRule::Off => "off",
            HoldRule::NextJob => "next-job",
            HoldRule::Adaptive => "adaptive",
            HoldRule::AnyMix => "any-mix",
        }
    }
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            enabled: true,
            squeue: "squeue".into(),
            sinfo: "sinfo".into(),
            scontrol: "scontrol".into(),
            slurmd: "slurmd".into(),
            command_timeout_s: 10,
            check_grants: true,
            holds: HoldRule::Auto,
            hold_partition: String::new(),
            salloc: "salloc".into(),
            scancel: "scancel".into(),
        }
    }
}

/// What a node does when it has no fresh cluster summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SummaryFallback {
    /// Ask Slurm itself (`squeue --json`, `sinfo --json`), as a node
    /// without a publisher does: correct, at the old cost to slurmctld.
    #[default]
    Squeue,
    /// Keep the layout: no policy decision and no reaping until a fresh
    /// summary is back (jobs are still served on demand). For large
    /// clusters, where a thousand nodes falling back at once is the load
    /// the summary exists to avoid.
    Hold,
}

/// The cluster summary (`[cluster]`; docs/architecture.md, "Cluster
/// scale"): one `smartmig publish` reads Slurm once per epoch for the
/// whole cluster and writes each node its share.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// The directory `smartmig publish --dir` writes (shared with the
    /// nodes, read-only is enough); this node reads `<summary_dir>/<node>.json`.
    pub summary_dir: PathBuf,
    /// A summary older than this many of the publisher's epochs is stale.
    pub stale_epochs: u64,
    /// Without a fresh summary: `squeue` (default) or `hold`.
    pub fallback: SummaryFallback,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            summary_dir: PathBuf::from("/var/spool/smartmig/summary"),
            stale_epochs: 3,
            fallback: SummaryFallback::Squeue,
        }
    }
}

/// One injected backend failure (sim backend only), for fault tests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InjectError {
    /// `create` or `destroy`.
    pub op: String,
    /// Only on this GPU (default: any).
    #[serde(default)]
    pub gpu: Option<u32>,
    /// `in_use`, `insufficient_resources`, `not_supported`, `no_permission`,
    /// `timeout` (a create still happens, then reports the timeout) or `other`.
    pub error: String,
    /// How many times to fail before succeeding again (default 1).
    #[serde(default = "one")]
    pub times: u32,
}

/// Settings of the simulated backend.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Sleep this long for each create/destroy, like a real reconfiguration
    /// (NVML creates take ~0.1-1 s; default 0 so tests are fast).
    pub reconfigure_delay_ms: u64,
    /// Seed for deterministic instance UUIDs (default: random v4 UUIDs).
    pub seed: Option<u64>,
    /// Failures to inject, consumed in order.
    pub inject_errors: Vec<InjectError>,
    /// Directory of the simulated instances' access files (the sim's
    /// `/dev/nvidia-caps`). Default: `nvidia-caps` next to the socket,
    /// a directory users can reach.
    pub caps_dir: Option<PathBuf>,
}

/// Where the nvml backend finds the driver (`[nvml]`). The defaults are
/// the driver's own paths; a site changes them only for a driver installed
/// elsewhere, and the tests point them at the NVML emulator
/// (`sidecar/nvml-emu`, docs/daemon.md "Testing the NVML backend").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvmlConfig {
    /// The NVML library: a file name the dynamic loader looks up
    /// (`libnvidia-ml.so.1`, the default) or an absolute path.
    pub library: PathBuf,
    /// The driver's capability tree, where each MIG instance's
    /// `access` file names the minor of its capability device file.
    pub capabilities_dir: PathBuf,
    /// The capability device files (`nvidia-cap<M>`).
    pub caps_dev_dir: PathBuf,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        NvmlConfig {
            library: PathBuf::from("libnvidia-ml.so.1"),
            capabilities_dir: PathBuf::from("/proc/driver/nvidia/capabilities"),
            caps_dev_dir: PathBuf::from("/dev/nvidia-caps"),
        }
    }
}

/// Learned memory estimates (`[memory]`, docs/oom-and-memory.md "On a
/// Slurm node").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Learn what jobs (per user and job name) needed and give jobs without
    /// `--mig-mem` the learned estimate instead of the smallest profile.
    pub estimate: bool,
    /// Seconds between samples of the instances' framebuffer use (nvml
    /// backend: NVML reports current use, not a peak, so the daemon keeps
    /// the largest sample of each job).
    pub sample_s: u64,
    /// The estimator (window, quantile, margins, key bound), see
    /// `workload::memory_estimate`.
    pub estimator: crate::workload::EstimatorConfig,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            estimate: true,
            sample_s: 5,
            estimator: crate::workload::EstimatorConfig::default(),
        }
    }
}

/// Out-of-memory restarts (`[oom]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OomConfig {
    /// Requeue a job whose release reports an out-of-memory failure (the
    /// plugin reports it only with `oom_requeue=yes`); needs `slurm.enabled`.
    pub requeue: bool,
    /// Restarts per job after out-of-memory failures (then it stays failed).
    pub max_retries: u32,
    /// Seconds the daemon keeps trying `scontrol requeue` (the job must
    /// first leave COMPLETING).
    pub requeue_timeout_s: u64,
    /// Requeue a running job on a bigger profile when the trend of its
    /// memory use (sampled every `memory.sample_s`; backends that measure
    /// memory only: nvml) predicts it will exceed its instance, instead of
    /// waiting for it to fail. Off by default: a wrong prediction restarts
    /// a job that would have fitted (docs/oom-and-memory.md).
    pub early_restart: bool,
    /// The rule (`[oom.early]`: window, horizon, min_fill), the same code
    /// the simulator measures (`workload::memory_growth`).
    pub early: crate::workload::EarlyRestartRule,
}

impl Default for OomConfig {
    fn default() -> Self {
        OomConfig {
            requeue: true,
            max_retries: 2,
            requeue_timeout_s: 60,
            early_restart: false,
            early: crate::workload::EarlyRestartRule::default(),
        }
    }
}

/// Per-job slice accounting (`[accounting]`; docs/slurm-integration.md,
/// "Who used which slice").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccountingConfig {
    /// Add `smartmig:profile=..,gpu=..,mem_gb=..,wait_s=..` to each job's
    /// `AdminComment` when it gets its instance (needs `slurm.enabled`;
    /// the site's own comment is kept). The node's usage log
    /// (`<state_dir>/usage.jsonl`) is always written.
    pub admin_comment: bool,
}

impl Default for AccountingConfig {
    fn default() -> Self {
        AccountingConfig {
            admin_comment: true,
        }
    }
}

/// Whether the policy's reconfigurations happen at once or wait for an
/// admin (`mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Each epoch's targets are carried out (destroying idle instances only).
    #[default]
    Dynamic,
    /// Each epoch's targets become plans that wait for `smartmig apply ID`
    /// and lapse after `plan_timeout_s`; jobs are still served on demand.
    Confirm,
    /// A dry run beside the site's own static MIG setup: smartmigd watches
    /// the real layout and the jobs that run on it through Slurm's typed
    /// GRES, records what its policy would do (`<state_dir>/advice.jsonl`)
    /// and changes nothing: no instance is made or destroyed, no device
    /// file touched, no node feature published, and `allocate` is refused.
    Advise,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Dynamic => "dynamic",
            Mode::Confirm => "confirm",
            Mode::Advise => "advise",
        }
    }
}

/// The configuration file as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub socket: PathBuf,
    /// A second socket, mode 0600 (owned by `slurm_user`), that only root
    /// and `slurm_user` can reach: the SPANK plugin's, so no user can crowd
    /// it out. Default: `<socket's stem>-root.sock` next to `socket`.
    pub admin_socket: Option<PathBuf>,
    /// Connections one unprivileged user may hold at once; more are
    /// refused (`too_many_connections`) and closed.
    pub max_connections_per_user: usize,
    /// Connections all unprivileged users together may hold at once. Root
    /// and `slurm_user` are never refused.
    pub max_connections: usize,
    pub state_dir: PathBuf,
    /// Where the assignment journal lives (default `<state_dir>/journal`).
    /// On a tmpfs (`/run`) it is written without fsync: it must survive a
    /// crash of smartmigd, not a reboot, which MIG instances and their jobs
    /// do not survive either (docs/daemon.md, "The journal").
    pub journal_dir: Option<PathBuf>,
    /// The user slurmstepd runs the SPANK plugin as; it (and root) may allocate/release.
    pub slurm_user: String,
    /// Users (names or uids) who see every job in `status`, like root and
    /// `slurm_user`; everyone else sees their own jobs and counts of the
    /// others' (default: none).
    pub operators: Vec<String>,
    /// This node's Slurm name (default: the host name).
    pub node_name: Option<String>,
    pub backend: BackendKind,
    /// Simulated GPUs (sim backend); ignored by the nvml backend.
    pub gpus: Vec<GpuGroup>,
    pub sim: SimConfig,
    /// Where the nvml backend finds the driver (ignored by the sim backend).
    pub nvml: NvmlConfig,
    pub allocate_wait_s: u64,
    /// Lend a job an idle instance bigger than its room when none of its
    /// own is idle, instead of building one (issue 55; only while holds
    /// keep Slurm off the shards it takes beyond its bill). `false`: every
    /// job on exactly its room.
    pub lend_idle: bool,
    pub request_timeout_s: u64,
    pub max_message_bytes: usize,
    /// Seconds between repartitioning decisions.
    pub epoch_s: u64,
    /// `none`, `static:<catalog index or picture>` (see `crate::policy`);
    /// `greedy`/`onnx` are accepted but run as `none` until they exist.
    pub policy: String,
    /// Which waiting allocate goes first when room frees on a GPU, and
    /// which profile it gets: `arrival`, `edf` or `learned:FILE.onnx`
    /// (see [`super::placement`]).
    pub placement: String,
    /// Publish each GPU's layout as Slurm node features.
    pub publish_layout: bool,
    /// Give each instance's access files (the capability device files that
    /// let a process use it) to the user of the job holding it and keep
    /// them root's while idle (`crate::access`), so a job cannot run on
    /// another job's instance. Off only where the files cannot be managed.
    pub isolate_devices: bool,
    /// `host:port` of the Prometheus endpoint (absent: no metrics server).
    pub metrics_listen: Option<String>,
    /// The directory dcgm-exporter reads with `--hpc-job-mapping-dir`:
    /// smartmigd keeps one file per GPU and per busy MIG instance there,
    /// naming the jobs on it (absent: none written; docs/daemon.md "DCGM
    /// job mapping").
    pub hpc_job_mapping_dir: Option<PathBuf>,
    pub slurm: SlurmConfig,
    /// Learned memory estimates.
    pub memory: MemoryConfig,
    /// Out-of-memory restarts.
    pub oom: OomConfig,
    /// Per-job slice accounting.
    pub accounting: AccountingConfig,
    /// `dynamic` (default), `confirm` (the policy's reconfigurations wait
    /// for `smartmig apply`, docs/daemon.md "Plans") or `advise` (a dry run
    /// that changes nothing, docs/daemon.md "Advise mode").
    pub mode: Mode,
    /// Seconds a pending plan waits for `smartmig apply` before it lapses.
    pub plan_timeout_s: u64,
    /// Where the cluster summary comes from, and what to do without it.
    pub cluster: ClusterConfig,
    /// Do no harm during the day: the shadow that hands over to a fallback
    /// when the policy does worse (docs/daemon.md, "Do no harm during the
    /// day: the shadow").
    pub shadow: super::shadow::ShadowConfig,
    /// `tracing` filter (e.g. `info`, `smartmig=debug`); `RUST_LOG` overrides it.
    pub log_level: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: PathBuf::from(DEFAULT_SOCKET),
            admin_socket: None,
            max_connections_per_user: 16,
            max_connections: 256,
            state_dir: PathBuf::from("/var/lib/smartmig"),
            journal_dir: None,
            slurm_user: "root".into(),
            operators: Vec::new(),
            node_name: None,
            backend: BackendKind::Sim,
            gpus: Vec::new(),
            sim: SimConfig::default(),
            nvml: NvmlConfig::default(),
            allocate_wait_s: 30,
            lend_idle: true,
            request_timeout_s: 10,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            epoch_s: 60,
            policy: "none".into(),
            placement: "arrival".into(),
            publish_layout: false,
            isolate_devices: true,
            metrics_listen: None,
            hpc_job_mapping_dir: None,
            slurm: SlurmConfig::default(),
            memory: MemoryConfig::default(),
            oom: OomConfig::default(),
            accounting: AccountingConfig::default(),
            mode: Mode::Dynamic,
            plan_timeout_s: 600,
            cluster: ClusterConfig::default(),
            shadow: super::shadow::ShadowConfig::default(),
            log_level: "info".into(),
        }
    }
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<config>"),
            message: e.to_string().trim_end().to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value; the first problem is reported with its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_paths()?;
        self.sim_gpus()?;
        if self.backend == BackendKind::Sim && self.gpus.is_empty() {
            return Err(invalid(
                "gpus",
                "the sim backend needs at least one [[gpus]] entry (model, count)",
            ));
        }
        self.check_limits()?;
        self.check_policy()?;
        self.check_shadow()?;
        self.check_placement()?;
        if let Some(listen) = &self.metrics_listen {
            listen.parse::<SocketAddr>().map_err(|e| {
                invalid(
                    "metrics_listen",
                    format!("\"{listen}\" is not host:port ({e})"),
                )
            })?;
        }
        if self.slurm.command_timeout_s == 0 {
            return Err(invalid("slurm.command_timeout_s", "must be at least 1"));
        }
        self.check_injected_errors()?;
        self.check_memory()
    }

    /// The sockets, directories and files (absolute, distinct, present)
    /// and the connection caps.
    fn check_paths(&self) -> Result<(), ConfigError> {
        if !self.socket.is_absolute() {
            return Err(invalid("socket", "must be an absolute path"));
        }
        if self.admin_socket.as_ref().is_some_and(|d| !d.is_absolute()) {
            return Err(invalid("admin_socket", "must be an absolute path"));
        }
        if self.admin_socket() == self.socket {
            return Err(invalid("admin_socket", "must differ from socket"));
        }
        if self.max_connections_per_user == 0 {
            return Err(invalid("max_connections_per_user", "must be at least 1"));
        }
        if self.max_connections < self.max_connections_per_user {
            return Err(invalid(
                "max_connections",
                "must be at least max_connections_per_user",
            ));
        }
        if !self.state_dir.is_absolute() {
            return Err(invalid("state_dir", "must be an absolute path"));
        }
        if self.journal_dir.as_ref().is_some_and(|d| !d.is_absolute()) {
            return Err(invalid("journal_dir", "must be an absolute path"));
        }
        if let Some(d) = &self.hpc_job_mapping_dir {
            if !d.is_absolute() || d == &self.state_dir || d == &self.journal_dir() {
                return Err(invalid(
                    "hpc_job_mapping_dir",
                    "must be an absolute path of its own (not state_dir or journal_dir): \
                     smartmigd removes the files there that no job needs",
                ));
            }
        }
        if self.sim.caps_dir.as_ref().is_some_and(|d| !d.is_absolute()) {
            return Err(invalid("sim.caps_dir", "must be an absolute path"));
        }
        if self.nvml.library.as_os_str().is_empty() {
            return Err(invalid("nvml.library", "must not be empty"));
        }
        if !self.nvml.capabilities_dir.is_absolute() {
            return Err(invalid("nvml.capabilities_dir", "must be an absolute path"));
        }
        if !self.nvml.caps_dev_dir.is_absolute() {
            return Err(invalid("nvml.caps_dev_dir", "must be an absolute path"));
        }
        if self.slurm_user.trim().is_empty() {
            return Err(invalid("slurm_user", "must not be empty"));
        }
        Ok(())
    }

    /// Time limits, message size, epochs and the cluster summary.
    fn check_limits(&self) -> Result<(), ConfigError> {
        if self.request_timeout_s == 0 {
            return Err(invalid("request_timeout_s", "must be at least 1"));
        }
        if !(256..=16 * 1024 * 1024).contains(&self.max_message_bytes) {
            return Err(invalid(
                "max_message_bytes",
                format!("{} is outside 256..=16777216", self.max_message_bytes),
            ));
        }
        if self.epoch_s == 0 {
            return Err(invalid("epoch_s", "must be at least 1"));
        }
        if self.cluster.stale_epochs == 0 {
            return Err(invalid("cluster.stale_epochs", "must be at least 1"));
        }
        if !self.cluster.summary_dir.is_absolute() {
            return Err(invalid(
                "cluster.summary_dir",
                format!(
                    "must be an absolute path, not \"{}\"",
                    self.cluster.summary_dir.display()
                ),
            ));
        }
        Ok(())
    }

    /// `[[sim.inject_errors]]`: known ops and errors.
    fn check_injected_errors(&self) -> Result<(), ConfigError> {
        for (i, inject) in self.sim.inject_errors.iter().enumerate() {
            if !["create", "destroy"].contains(&inject.op.as_str()) {
                return Err(invalid(
                    format!("sim.inject_errors[{i}].op"),
                    format!("\"{}\" is not create or destroy", inject.op),
                ));
            }
            if super::backend::BackendError::injected(&inject.error, "x").is_none() {
                return Err(invalid(
                    format!("sim.inject_errors[{i}].error"),
                    format!("unknown error \"{}\" (known: in_use, insufficient_resources, not_supported, no_permission, timeout, other)", inject.error),
                ));
            }
        }
        Ok(())
    }

    /// `[memory]`, `[oom]`, plans and the log level.
    fn check_memory(&self) -> Result<(), ConfigError> {
        if self.memory.sample_s == 0 {
            return Err(invalid("memory.sample_s", "must be at least 1"));
        }
        self.memory
            .estimator
            .validate()
            .map_err(|e| invalid("memory.estimator", e.to_string()))?;
        if self.oom.max_retries > 16 {
            return Err(invalid(
                "oom.max_retries",
                format!("{} is outside 0..=16", self.oom.max_retries),
            ));
        }
        if self.oom.requeue_timeout_s == 0 {
            return Err(invalid("oom.requeue_timeout_s", "must be at least 1"));
        }
        if self.plan_timeout_s == 0 {
            return Err(invalid("plan_timeout_s", "must be at least 1"));
        }
        self.oom
            .early
            .validate()
            .map_err(|e| invalid("oom.early", e.to_string()))?;
        tracing_subscriber::EnvFilter::try_new(&self.log_level)
            .map_err(|e| invalid("log_level", format!("\"{}\": {e}", self.log_level)))?;
        Ok(())
    }

    /// Settings that are valid but will not do what they say, for
    /// `--check-config` and the start-up log.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.oom.early_restart && self.backend == BackendKind::Sim {
            out.push(
                "oom.early_restart: the sim backend measures no memory use, so no job will be restarted early (nvml only)".to_string(),
            );
        }
        if self.oom.early_restart && !self.slurm.enabled {
            out.push(
                "oom.early_restart: Slurm queries are disabled (slurm.enabled = false), so no job can be requeued".to_string(),
            );
        }
        if !matches!(self.slurm.holds, HoldRule::Off | HoldRule::Auto) && !self.slurm.enabled {
            out.push(
                "slurm.holds: Slurm queries are disabled (slurm.enabled = false), so no stranded shard is held".to_string(),
            );
        }
        if self.mode == Mode::Advise && !self.slurm.enabled {
            out.push(
                "mode = \"advise\": Slurm queries are disabled (slurm.enabled = false), so no job is watched and the report will have nothing to replay".to_string(),
            );
        }
        if self.mode == Mode::Advise && self.policy.trim() == "none" {
            out.push(
                "mode = \"advise\" with policy = \"none\": the policy never wants a reshape, so the advice log will hold no advice (name the policy you consider, e.g. \"greedy\")".to_string(),
            );
        }
        out
    }

    /// Any policy the daemon can run (see [`super::policy_choice::build`]), checked
    /// against the sim GPUs.
    fn check_policy(&self) -> Result<(), ConfigError> {
        let p = self.policy.trim();
        let models = if self.backend == BackendKind::Sim {
            GpuModel::distinct(&self.sim_gpus()?)
        } else {
            Vec::new()
        };
        super::policy_choice::build(p, &models)
            .map(|_| ())
            .map_err(ConfigError::Policy)
    }

    /// `[shadow]`: the rule's values, and a fallback the daemon can run
    /// (checked as `policy` is, against the sim GPUs).
    fn check_shadow(&self) -> Result<(), ConfigError> {
        self.shadow
            .check()
            .map_err(|(key, why)| invalid(format!("shadow.{key}"), why))?;
        let models = if self.backend == BackendKind::Sim {
            self.sim_gpus()?
        } else {
            Vec::new()
        };
        super::policy_choice::build_fallback(self.shadow.fallback_spec(), &models)
            .map(|_| ())
            .map_err(|e| invalid("shadow.fallback", e.to_string()))
    }

    /// Any placement the daemon can run (see
    /// [`super::placement::PlacementRule::build`]), checked against the sim
    /// GPUs (a learned file is loaded, so a wrong one is refused here).
    fn check_placement(&self) -> Result<(), ConfigError> {
        let models = if self.backend == BackendKind::Sim {
            GpuModel::distinct(&self.sim_gpus()?)
        } else {
            Vec::new()
        };
        super::placement::PlacementRule::build(&self.placement, &models)
            .map(|_| ())
            .map_err(ConfigError::Placement)
    }

    /// The simulated GPUs in index order.
    pub fn sim_gpus(&self) -> Result<Vec<GpuModel>, ConfigError> {
        let mut out = Vec::new();
        for (i, group) in self.gpus.iter().enumerate() {
            let model: GpuModel = group.model.parse().map_err(|e: crate::mig::UnknownModel| {
                invalid(
                    format!("gpus[{i}].model"),
                    format!("unknown GPU model \"{}\" (known: {})", e.given, e.known),
                )
            })?;
            if group.count == 0 || group.count > 64 {
                return Err(invalid(
                    format!("gpus[{i}].count"),
                    format!("{} is outside 1..=64", group.count),
                ));
            }
            out.extend(std::iter::repeat_n(model, group.count as usize));
        }
        Ok(out)
    }

    /// The root-only socket: `admin_socket`, or `<stem>-root.sock` beside
    /// `socket` (`/run/smartmig/smartmig-root.sock`).
    pub fn admin_socket(&self) -> PathBuf {
        self.admin_socket.clone().unwrap_or_else(|| {
            let stem = self
                .socket
                .file_stem()
                .map_or_else(|| "smartmig".into(), |s| s.to_string_lossy().into_owned());
            self.socket.with_file_name(format!("{stem}-root.sock"))
        })
    }

    /// Whether smartmigd manages the instances' access files: on with
    /// `isolate_devices`, never in advise mode (the site's own setup owns
    /// them).
    pub fn isolates(&self) -> bool {
        self.isolate_devices && self.mode != Mode::Advise
    }

    /// Advise mode's record (`formats::advice::AdviceRecord` per line).
    pub fn advice_log(&self) -> PathBuf {
        self.state_dir.join(crate::formats::advice::ADVICE_LOG)
    }

    /// The journal's directory: `journal_dir`, or `<state_dir>/journal`.
    pub fn journal_dir(&self) -> PathBuf {
        self.journal_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("journal"))
    }

    /// Settings whose change needs a restart (SIGHUP keeps the old values).
    pub fn restart_only_changes(&self, new: &Config) -> Vec<&'static str> {
        self.reloaded(new).1
    }

    /// What SIGHUP makes of `new` when `self` is running: `new` with every
    /// restart-only setting (socket, state_dir, journal_dir, backend, gpus, sim, nvml,
    /// metrics_listen, hpc_job_mapping_dir, log_level, memory.estimator) kept from `self`, and
    /// the names of those that differed. The one list of restart-only keys.
    pub fn reloaded(&self, new: &Config) -> (Config, Vec<&'static str>) {
        let mut merged = new.clone();
        let mut kept = Vec::new();
        macro_rules! keep {
            ($name:literal, $($field:ident).+) => {
                if self.$($field).+ != new.$($field).+ {
                    kept.push($name);
                    merged.$($field).+ = self.$($field).+.clone();
                }
            };
        }
        keep!("socket", socket);
        keep!("admin_socket", admin_socket);
        keep!("state_dir", state_dir);
        keep!("journal_dir", journal_dir);
        keep!("backend", backend);
        keep!("gpus", gpus);
        keep!("sim", sim);
        keep!("nvml", nvml);
        keep!("metrics_listen", metrics_listen);
        keep!("hpc_job_mapping_dir", hpc_job_mapping_dir);
        keep!("log_level", log_level);
        keep!("memory.estimator", memory.estimator);
        // Into or out of advise mode only by a restart: a node leaving
        // advise still runs jobs smartmigd never allocated (drain it first,
        // docs/slurm-integration.md "Adopting smartmig").
        if self.mode != new.mode && (self.mode == Mode::Advise || new.mode == Mode::Advise) {
            kept.push("mode (into or out of advise)");
            merged.mode = self.mode;
        }
        (merged, kept)
    }

    /// Settings that SIGHUP applies at once, as `key: old -> new`.
    pub fn live_changes(&self, new: &Config) -> Vec<String> {
        let mut out = Vec::new();
        macro_rules! diff {
            ($($field:ident).+) => {
                if self.$($field).+ != new.$($field).+ {
                    out.push(format!(
                        "{}: {:?} -> {:?}",
                        stringify!($($field).+),
                        self.$($field).+,
                        new.$($field).+
                    ));
                }
            };
        }
        diff!(slurm_user);
        diff!(operators);
        diff!(node_name);
        diff!(allocate_wait_s);
        diff!(lend_idle);
        diff!(request_timeout_s);
        diff!(max_message_bytes);
        diff!(max_connections_per_user);
        diff!(max_connections);
        diff!(epoch_s);
        diff!(policy);
        diff!(placement);
        diff!(publish_layout);
        diff!(isolate_devices);
        diff!(slurm);
        diff!(memory);
        diff!(oom);
        diff!(accounting);
        diff!(mode);
        diff!(plan_timeout_s);
        diff!(cluster);
        diff!(shadow);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "[[gpus]]\nmodel = \"a100-40gb\"\ncount = 2\n";

    #[test]
    fn holds_and_grant_checks_are_slurm_settings() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!(
            c.slurm.holds,
            HoldRule::Auto,
            "absent: decided by gres.conf"
        );
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
        let c = Config::parse(&format!("{MINIMAL}[slurm]\nholds = \"auto\"\n")).unwrap();
        assert_eq!(c.slurm.holds, HoldRule::Auto);
        let c = Config::parse(&format!("{MINIMAL}[slurm]\nholds = \"off\"\n")).unwrap();
        assert_eq!(c.slurm.holds.offer_rule(), None);
        assert!(c.slurm.check_grants);
        let c = Config::parse(&format!("{MINIMAL}[slurm]\nholds = \"any-mix\"\n")).unwrap();
        assert_eq!(
            c.slurm.holds.offer_rule(),
            Some(crate::mig::OfferPolicy::Fixed(
                crate::mig::OfferRule::AnyMix
            ))
        );
        for key in ["auto", "adaptive"] {
            let c = Config::parse(&format!("{MINIMAL}[slurm]\nholds = \"{key}\"\n")).unwrap();
            assert_eq!(
                c.slurm.holds.offer_rule(),
                Some(crate::mig::OfferPolicy::Adaptive),
                "{key}"
            );
        }
        let e = Config::parse(&format!("{MINIMAL}[slurm]\nholds = \"always\"\n")).unwrap_err();
        assert!(e.to_string().contains("always"), "{e}");
        let c = Config::parse(&format!(
            "{MINIMAL}[slurm]\nenabled = false\nholds = \"next-job\"\n"
        ))
        .unwrap();
        assert!(c.warnings().iter().any(|w| w.starts_with("slurm.holds")));
    }

    #[test]
    fn advise_mode_is_entered_and_left_only_by_a_restart() {
        let running = Config::parse(&format!("mode = \"advise\"\n{MINIMAL}")).unwrap();
        assert!(
            !running.isolates(),
            "advise mode never touches device files"
        );
        let new = Config::parse(&format!("mode = \"dynamic\"\n{MINIMAL}")).unwrap();
        let (merged, kept) = running.reloaded(&new);
        assert_eq!(merged.mode, Mode::Advise);
        assert_eq!(kept, vec!["mode (into or out of advise)"]);
        assert!(running.live_changes(&merged).is_empty());
        // Between confirm and dynamic, SIGHUP is enough.
        let confirm = Config::parse(&format!("mode = \"confirm\"\n{MINIMAL}")).unwrap();
        let (merged, kept) = new.reloaded(&confirm);
        assert_eq!((merged.mode, kept.len()), (Mode::Confirm, 0));
        assert!(Config::parse(&format!("mode = \"advice\"\n{MINIMAL}"))
            .unwrap_err()
            .to_string()
            .contains("mode"));
    }

    #[test]
    fn defaults_are_documented_values() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!(c.socket, PathBuf::from("/run/smartmig/smartmig.sock"));
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/smartmig"));
        assert_eq!(
            c.slurm_user, "root",
            "only root allocates unless the admin names another user"
        );
        assert_eq!(c.allocate_wait_s, 30);
        assert_eq!(c.max_message_bytes, 65536);
        assert!(!c.publish_layout);
        assert_eq!(c.sim_gpus().unwrap(), vec![GpuModel::A100_40gb; 2]);
        assert_eq!(c.journal_dir(), PathBuf::from("/var/lib/smartmig/journal"));
        let c = Config::parse(&format!("journal_dir = \"/run/j\"\n{MINIMAL}")).unwrap();
        assert_eq!(c.journal_dir(), PathBuf::from("/run/j"));
        // A relative journal_dir is refused by name; changing it needs a restart.
        let err = Config::parse(&format!("journal_dir = \"j\"\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("journal_dir: must be an absolute path"),
            "{err}"
        );
        let d = Config::parse(MINIMAL).unwrap();
        assert_eq!(d.restart_only_changes(&c), ["journal_dir"]);
    }

    #[test]
    fn errors_name_the_key() {
        let text = format!("{MINIMAL}[[gpus]]\nmodel = \"a100\"\n");
        let err = Config::parse(&text).unwrap_err().to_string();
        assert!(
            err.starts_with("gpus[1].model: unknown GPU model \"a100\""),
            "{err}"
        );
        let err = Config::parse(&format!("policy = \"magic\"\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("policy: unknown policy"), "{err}");
        let err = Config::parse(&format!("metrics_listen = \"localhost\"\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("metrics_listen:"), "{err}");
        for dir in ["dcgm", "/var/lib/smartmig"] {
            let err = Config::parse(&format!("hpc_job_mapping_dir = \"{dir}\"\n{MINIMAL}"))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("hpc_job_mapping_dir:"), "{err}");
        }
        let err = Config::parse(&format!("sokcet = \"/x\"\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `sokcet`"), "{err}");
        let err = Config::parse("backend = \"sim\"").unwrap_err().to_string();
        assert!(err.starts_with("gpus:"), "{err}");
        let err = Config::parse(&format!(
            "{MINIMAL}[[sim.inject_errors]]\nop = \"create\"\nerror = \"boom\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("sim.inject_errors[0].error"), "{err}");
        let err = Config::parse(&format!("{MINIMAL}[oom.early]\nwindow = 1\n"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("oom.early: invalid window: 1"), "{err}");
        let err = Config::parse(&format!("{MINIMAL}[oom.early]\nhorizn = 1\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `horizn`"), "{err}");
        // Off by default; a partial table keeps the other defaults.
        let c = Config::parse(&format!(
            "{MINIMAL}[oom]\nearly_restart = true\n[oom.early]\nhorizon = 1.0\n"
        ))
        .unwrap();
        assert!(c.oom.early_restart);
        assert_eq!(c.oom.early.horizon, 1.0);
        assert_eq!(
            c.oom.early.window,
            crate::workload::EarlyRestartRule::default().window
        );
        assert!(!Config::parse(MINIMAL).unwrap().oom.early_restart);
        // Valid, but the sim backend cannot measure memory: a warning.
        assert!(Config::parse(MINIMAL).unwrap().warnings().is_empty());
        let w = c.warnings();
        assert!(
            w.iter()
                .any(|w| w.contains("sim backend measures no memory")),
            "{w:?}"
        );
    }

    #[test]
    fn reload_diffs() {
        let a = Config::parse(MINIMAL).unwrap();
        let mut b = a.clone();
        b.policy = "static:0".into();
        b.socket = PathBuf::from("/tmp/other.sock");
        assert_eq!(a.restart_only_changes(&b), vec!["socket"]);
        assert_eq!(
            a.live_changes(&b),
            vec!["policy: \"none\" -> \"static:0\"".to_string()]
        );
        // The merge keeps every restart-only key and takes the live ones.
        b.log_level = "debug".into();
        b.memory.estimator.window += 1;
        let (merged, kept) = a.reloaded(&b);
        assert_eq!(kept, vec!["socket", "log_level", "memory.estimator"]);
        assert_eq!(merged.socket, a.socket);
        assert_eq!(merged.log_level, a.log_level);
        assert_eq!(merged.memory.estimator, a.memory.estimator);
        assert_eq!(merged.policy, "static:0");
    }

    /// `[shadow]`: the defaults (off, whatever the policy; greedy as the
    /// fallback, the core rule), explicit values, and bad ones refused
    /// with the key named.
    #[test]
    fn shadow_settings_parse_and_bad_ones_name_the_key() {
        let c = Config::parse(MINIMAL).unwrap();
        assert!(!c.shadow.enabled);
        assert_eq!(c.shadow.fallback_spec(), "greedy");
        assert_eq!(
            c.shadow.rule(),
            crate::policy::shadow::ShadowRule::default()
        );
        let c = Config::parse(&format!(
            "{MINIMAL}[shadow]\nenabled = true\nfallback = \"static:7\"\nevery_s = 2\nwindow_s = 60\nmargin = 0.05\nhold_checks = 1\njoules_per_tardiness_s = 100\n"
        ))
        .unwrap();
        assert!(c.shadow.enabled);
        assert_eq!(c.shadow.fallback_spec(), "static:7");
        assert_eq!(
            (
                c.shadow.every_s,
                c.shadow.window_s,
                c.shadow.margin,
                c.shadow.hold_checks
            ),
            (2.0, 60.0, 0.05, 1)
        );
        for (bad, key) in [
            ("every_s = 0", "shadow.every_s"),
            ("window_s = -5", "shadow.window_s"),
            ("margin = 1.5", "shadow.margin"),
            ("hold_checks = 0", "shadow.hold_checks"),
            (
                "joules_per_tardiness_s = 0",
                "shadow.joules_per_tardiness_s",
            ),
            ("fallback = \"static:nonsense\"", "shadow.fallback"),
            ("fallback = \"magic\"", "shadow.fallback"),
        ] {
            let err = Config::parse(&format!("{MINIMAL}[shadow]\n{bad}\n"))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.starts_with(&format!("{key}:")), "{bad}: {err}");
        }
        let err = Config::parse(&format!("{MINIMAL}[shadow]\nspeed = 2\n"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("speed"), "{err}");
        // A reload names the change.
        let a = Config::parse(MINIMAL).unwrap();
        let mut b = a.clone();
        b.shadow.margin = 0.1;
        assert_eq!(a.live_changes(&b).len(), 1);
        assert!(a.live_changes(&b)[0].starts_with("shadow:"));
    }
}
