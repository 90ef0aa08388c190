//! The SPANK plugin's `plugstack.conf` arguments (`socket=PATH timeout=SECONDS
//! on_failure=fail|whole-gpu oom_requeue=yes|no oom_dir=PATH
//! sidecar_wait=SECONDS drain_on_unreachable=yes|no requeue=yes|no
//! scontrol=PATH`).
//!
//! Slurm passes the words after the plugin path to every callback as
//! `(ac, av)`, in every context, so each callback parses them again (the
//! `job_script` context never calls `slurm_spank_init`). Parsing is strict: a
//! misspelt key must not silently turn a node into one that hands out whole
//! GPUs, so an unknown key or a bad value is an error that the remote
//! context turns into a failed job (never a drained node, see the plugin's
//! `lib.rs`).
//!
//! It lives here, not in the plugin crate, so that `smartmig doctor` checks
//! a node's plugstack line with the very parser the plugin uses (the plugin
//! crate needs Slurm's headers and is nobody's dependency).

use std::path::PathBuf;
use std::time::Duration;

use crate::protocol::DEFAULT_ADMIN_SOCKET;

/// Default read/write timeout of one request to the sidecar. Must exceed the
/// daemon's `allocate_wait_s` (30 s by default) so that a "wait for a
/// release" answer arrives before the plugin gives up.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// What the plugin does when the sidecar cannot give the job an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// End the job FAILED with the reason in its output (the default: a job
    /// never silently shares a GPU it was not given).
    Fail,
    /// Run the job anyway with `CUDA_VISIBLE_DEVICES` as Slurm set it (the
    /// GPU index) and print a warning: availability over isolation.
    WholeGpu,
}

/// Parsed plugstack arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginArgs {
    /// The sidecar's Unix socket.
    pub socket: PathBuf,
    /// Read/write timeout of one request.
    pub timeout: Duration,
    pub on_failure: OnFailure,
    /// `oom_requeue=yes`: give each shard job an out-of-memory marker file
    /// (`SMARTMIG_OOM_FILE`) and report a job that wrote it to the sidecar,
    /// which may requeue it on a larger profile (default no).
    pub oom_requeue: bool,
    /// Where the marker files live (`oom_dir=`); default: `oom` next to the
    /// socket (`/run/smartmig/oom`).
    pub oom_dir: Option<PathBuf>,
    /// How long a step waits for a sidecar that cannot be reached (socket
    /// missing or refused, daemon restarting) before giving up
    /// (`sidecar_wait=`, default 15 s): a restart of smartmigd does not
    /// fail the jobs that start meanwhile.
    pub sidecar_wait: Duration,
    /// `drain_on_unreachable=yes` (default): when the sidecar stays
    /// unreachable, drain the node (reason `smartmig: sidecar
    /// unreachable`) and requeue the batch job, so a node without its
    /// sidecar stops taking shard jobs instead of failing them all.
    pub drain_on_unreachable: bool,
    /// `requeue=yes` (default): a batch job that gets no instance because
    /// the sidecar stayed unreachable or found no room in time is requeued
    /// (`scontrol requeue`) rather than failed.
    pub requeue: bool,
    /// The `scontrol` used for that (`scontrol=`, default from PATH).
    pub scontrol: PathBuf,
    /// The slurm.conf that `scontrol` reads (`slurm_conf=`); default:
    /// slurmstepd's own `SLURM_CONF`, else Slurm's compiled-in path. Never
    /// the job's `SLURM_CONF`: the job's environment is the user's, and a
    /// config of the user's would steer a root `scontrol` (issue 53).
    pub slurm_conf: Option<PathBuf>,
    /// `gpu_jobs=fail` (default): a step Slurm gave whole GPUs (`gpu` GRES,
    /// no shards) fails with a message naming `--gres=shard:K`, because on
    /// a GPU in MIG mode it gets no instance and Slurm 22.05 can run it
    /// beside the GPU's shard jobs, unisolated. `allow`: it runs as Slurm
    /// placed it (nodes that also have GPUs smartmigd does not manage).
    pub gpu_jobs_allowed: bool,
}

impl Default for PluginArgs {
    fn default() -> Self {
        PluginArgs {
            socket: PathBuf::from(DEFAULT_ADMIN_SOCKET),
            timeout: DEFAULT_TIMEOUT,
            on_failure: OnFailure::Fail,
            oom_requeue: false,
            oom_dir: None,
            sidecar_wait: DEFAULT_SIDECAR_WAIT,
            drain_on_unreachable: true,
            requeue: true,
            scontrol: PathBuf::from("scontrol"),
            slurm_conf: None,
            gpu_jobs_allowed: false,
        }
    }
}

/// Default time a step waits for an unreachable sidecar.
pub const DEFAULT_SIDECAR_WAIT: Duration = Duration::from_secs(15);

/// Valid keys, for error messages.
const KNOWN_KEYS: &str = "socket, timeout, on_failure, oom_requeue, oom_dir, sidecar_wait, \
                          drain_on_unreachable, requeue, scontrol, slurm_conf, gpu_jobs";

/// A plugstack.conf word the plugin refuses. The text names the word and
/// what is wrong with it, because it ends up in slurmd.log and in the failed
/// job's output.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("plugstack.conf argument `{word}` is not KEY=VALUE (known keys: {KNOWN_KEYS})")]
    NotKeyValue { word: String },
    #[error("unknown plugstack.conf argument `{word}` (known keys: {KNOWN_KEYS})")]
    UnknownKey { word: String },
    /// A known key with a value it does not take.
    #[error("plugstack.conf argument `{word}`: {key} {wanted}")]
    BadValue {
        word: String,
        key: &'static str,
        wanted: Wanted,
    },
}

/// What a key's value must be (the end of [`ArgsError::BadValue`]'s text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Wanted {
    #[error("must be an absolute path")]
    AbsolutePath,
    #[error("must be a number of seconds")]
    Seconds,
    /// A number of seconds outside this range.
    #[error("must be in {0} seconds")]
    SecondsIn(&'static str),
    #[error("must be `fail` or `whole-gpu`")]
    OnFailure,
    #[error("must be `yes` or `no`")]
    YesNo,
    #[error("must name a program")]
    Program,
    #[error("must be `fail` or `allow`")]
    GpuJobs,
}

/// `yes`/`no` (also `true`/`false`, `1`/`0`).
fn yes_no(word: &str, key: &'static str, value: &str) -> Result<bool, ArgsError> {
    match value {
        "yes" | "true" | "1" => Ok(true),
        "no" | "false" | "0" => Ok(false),
        _ => Err(bad_value(word, key, Wanted::YesNo)),
    }
}

fn bad_value(word: &str, key: &'static str, wanted: Wanted) -> ArgsError {
    ArgsError::BadValue {
        word: word.to_string(),
        key,
        wanted,
    }
}

impl PluginArgs {
    /// Parses the plugstack words, e.g. `["socket=/run/s.sock", "timeout=45"]`.
    ///
    /// The error names the offending word and lists the valid keys, because
    /// it ends up in slurmd.log and in the failed job's output.
    pub fn parse<S: AsRef<str>>(words: &[S]) -> Result<PluginArgs, ArgsError> {
        let mut args = PluginArgs::default();
        for word in words {
            let word = word.as_ref();
            let Some((key, value)) = word.split_once('=') else {
                return Err(ArgsError::NotKeyValue {
                    word: word.to_string(),
                });
            };
            let bad = |key, wanted| Err(bad_value(word, key, wanted));
            match key {
                "socket" => {
                    if value.is_empty() || !value.starts_with('/') {
                        return bad("socket", Wanted::AbsolutePath);
                    }
                    args.socket = PathBuf::from(value);
                }
                "timeout" => {
                    let Ok(secs) = value.parse::<f64>() else {
                        return bad("timeout", Wanted::Seconds);
                    };
                    if !secs.is_finite() || secs <= 0.0 || secs > 3600.0 {
                        return bad("timeout", Wanted::SecondsIn("(0, 3600]"));
                    }
                    args.timeout = Duration::from_secs_f64(secs);
                }
                "on_failure" => {
                    args.on_failure = match value {
                        "fail" => OnFailure::Fail,
                        "whole-gpu" | "whole_gpu" => OnFailure::WholeGpu,
                        _ => return bad("on_failure", Wanted::OnFailure),
                    }
                }
                "oom_requeue" => args.oom_requeue = yes_no(word, "oom_requeue", value)?,
                "drain_on_unreachable" => {
                    args.drain_on_unreachable = yes_no(word, "drain_on_unreachable", value)?;
                }
                "requeue" => args.requeue = yes_no(word, "requeue", value)?,
                "gpu_jobs" => {
                    args.gpu_jobs_allowed = match value {
                        "fail" => false,
                        "allow" => true,
                        _ => return bad("gpu_jobs", Wanted::GpuJobs),
                    }
                }
                "sidecar_wait" => {
                    let Ok(secs) = value.parse::<f64>() else {
                        return bad("sidecar_wait", Wanted::Seconds);
                    };
                    if !secs.is_finite() || !(0.0..=600.0).contains(&secs) {
                        return bad("sidecar_wait", Wanted::SecondsIn("[0, 600]"));
                    }
                    args.sidecar_wait = Duration::from_secs_f64(secs);
                }
                "scontrol" => {
                    if value.is_empty() {
                        return bad("scontrol", Wanted::Program);
                    }
                    args.scontrol = PathBuf::from(value);
                }
                "oom_dir" => {
                    if value.is_empty() || !value.starts_with('/') {
                        return bad("oom_dir", Wanted::AbsolutePath);
                    }
                    args.oom_dir = Some(PathBuf::from(value));
                }
                "slurm_conf" => {
                    if value.is_empty() || !value.starts_with('/') {
                        return bad("slurm_conf", Wanted::AbsolutePath);
                    }
                    args.slurm_conf = Some(PathBuf::from(value));
                }
                _ => {
                    return Err(ArgsError::UnknownKey {
                        word: word.to_string(),
                    })
                }
            }
        }
        Ok(args)
    }

    /// The directory of the out-of-memory marker files: `oom_dir=`, else
    /// `oom` next to the socket.
    pub fn oom_dir(&self) -> PathBuf {
        match &self.oom_dir {
            Some(d) => d.clone(),
            None => self
                .socket
                .parent()
                .unwrap_or(std::path::Path::new("/run/smartmig"))
                .join("oom"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_without_arguments() {
        let empty: [&str; 0] = [];
        assert_eq!(PluginArgs::parse(&empty).unwrap(), PluginArgs::default());
        assert_eq!(PluginArgs::default().on_failure, OnFailure::Fail);
    }

    #[test]
    fn parses_every_key() {
        let a = PluginArgs::parse(&["socket=/tmp/x.sock", "timeout=2.5", "on_failure=whole-gpu"])
            .unwrap();
        assert_eq!(a.socket, PathBuf::from("/tmp/x.sock"));
        assert_eq!(a.timeout, Duration::from_millis(2500));
        assert_eq!(a.on_failure, OnFailure::WholeGpu);
        assert!(!a.oom_requeue);
        assert_eq!(a.oom_dir(), PathBuf::from("/tmp/oom"));
        let a = PluginArgs::parse(&[
            "oom_requeue=yes",
            "oom_dir=/var/spool/smartmig-oom",
            "sidecar_wait=2",
            "drain_on_unreachable=no",
            "requeue=no",
            "scontrol=/usr/bin/scontrol",
            "slurm_conf=/etc/slurm/slurm.conf",
            "gpu_jobs=allow",
        ])
        .unwrap();
        assert_eq!(a.slurm_conf, Some(PathBuf::from("/etc/slurm/slurm.conf")));
        assert_eq!(PluginArgs::default().slurm_conf, None);
        assert!(a.gpu_jobs_allowed && !PluginArgs::default().gpu_jobs_allowed);
        assert_eq!(a.sidecar_wait, Duration::from_secs(2));
        assert!(!a.drain_on_unreachable && !a.requeue);
        assert_eq!(a.scontrol, PathBuf::from("/usr/bin/scontrol"));
        assert!(PluginArgs::default().drain_on_unreachable);
        assert!(a.oom_requeue);
        assert_eq!(a.oom_dir(), PathBuf::from("/var/spool/smartmig-oom"));
        assert_eq!(
            PluginArgs::default().oom_dir(),
            PathBuf::from("/run/smartmig/oom")
        );
    }

    #[test]
    fn refuses_bad_words_with_a_clear_message() {
        for (words, needle) in [
            (
                vec!["sokcet=/x"],
                "unknown plugstack.conf argument `sokcet=/x`",
            ),
            (vec!["socket"], "not KEY=VALUE"),
            (vec!["socket=relative.sock"], "absolute path"),
            (vec!["timeout=soon"], "number of seconds"),
            (vec!["gpu_jobs=maybe"], "gpu_jobs must be `fail` or `allow`"),
            (vec!["timeout=0"], "(0, 3600]"),
            (vec!["timeout=-3"], "(0, 3600]"),
            (vec!["on_failure=ignore"], "`fail` or `whole-gpu`"),
            (vec!["oom_requeue=maybe"], "`yes` or `no`"),
            (vec!["drain_on_unreachable=perhaps"], "`yes` or `no`"),
            (vec!["sidecar_wait=-1"], "[0, 600]"),
            (vec!["sidecar_wait=x"], "number of seconds"),
            (vec!["scontrol="], "must name a program"),
            (vec!["oom_dir=oom"], "absolute path"),
            (vec!["slurm_conf=slurm.conf"], "absolute path"),
        ] {
            let err = PluginArgs::parse(&words).unwrap_err().to_string();
            assert!(err.contains(needle), "{words:?}: {err}");
        }
        assert_eq!(
            PluginArgs::parse(&["timeout=0"]),
            Err(ArgsError::BadValue {
                word: "timeout=0".into(),
                key: "timeout",
                wanted: Wanted::SecondsIn("(0, 3600]"),
            })
        );
        assert_eq!(
            PluginArgs::parse(&["socket"]),
            Err(ArgsError::NotKeyValue {
                word: "socket".into()
            })
        );
    }
}
