//! The two Slurm commands the plugin itself runs, from slurmstepd as root,
//! when the node's sidecar cannot be reached: drain the node and requeue
//! the batch job. With the sidecar down nobody else can do it, and a node
//! that keeps taking shard jobs it cannot serve fails every one of them
//! while `sinfo` calls it idle. smartmigd resumes the node when it is back
//! (`docs/slurm-integration.md`, "What can go wrong").

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The drain reason; smartmigd resumes only nodes drained with a reason
/// that starts with `smartmig:`.
pub const UNREACHABLE_REASON: &str = "smartmig: sidecar unreachable";

/// How long one `scontrol` may take (slurmctld down must not hang the step).
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an `scontrol` command did not succeed; `command` is the command line
/// as run.
#[derive(Debug, thiserror::Error)]
pub enum ScontrolError {
    /// It could not be started or waited for.
    #[error("`{command}`: {source}")]
    Io {
        command: String,
        source: std::io::Error,
    },
    /// It ran longer than the limit and was killed.
    #[error("`{command}` took more than {secs} s")]
    Timeout { command: String, secs: u64 },
    /// It exited unsuccessfully; `stderr` is what it printed, trimmed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: ExitStatus,
        stderr: String,
    },
}

/// Runs `scontrol ARGS` with `slurm_conf` as its `SLURM_CONF` (test
/// clusters and sites with a non-default path; the caller's, never the
/// job's); the error carries its stderr.
fn scontrol(program: &Path, slurm_conf: Option<&str>, args: &[&str]) -> Result<(), ScontrolError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(conf) = slurm_conf {
        cmd.env("SLURM_CONF", conf);
    }
    let command = format!("{} {}", program.display(), args.join(" "));
    let io = |source| ScontrolError::Io {
        command: command.clone(),
        source,
    };
    let mut child = cmd.spawn().map_err(io)?;
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() > SCONTROL_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ScontrolError::Timeout {
                    command,
                    secs: SCONTROL_TIMEOUT.as_secs(),
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(io(e)),
        }
    };
    if status.success() {
        return Ok(());
    }
    // scontrol's messages are a line or two: they fit the pipe buffer.
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    Err(ScontrolError::Failed {
        command,
        status,
        stderr: err.trim().to_string(),
    })
}

/// `scontrol update NodeName=NODE State=DRAIN Reason=REASON`.
pub fn drain(
    program: &Path,
    slurm_conf: Option<&str>,
    node: &str,
    reason: &str,
) -> Result<(), ScontrolError> {
    scontrol(
        program,
        slurm_conf,
        &[
            "update",
            &format!("NodeName={node}"),
            "State=DRAIN",
            &format!("Reason={reason}"),
        ],
    )
}

/// `scontrol requeue JOB` (`A_T` for an array task: a bare array job id
/// means the whole array): accepted while the job runs (the plugin is in
/// its first step), it goes back to pending and starts again elsewhere or
/// once the node is resumed.
pub fn requeue(program: &Path, slurm_conf: Option<&str>, job: &str) -> Result<(), ScontrolError> {
    scontrol(program, slurm_conf, &["requeue", job])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_carry_the_command_and_its_stderr() {
        let e = scontrol(Path::new("sh"), None, &["-c", "echo nope >&2; exit 4"]).unwrap_err();
        assert!(matches!(e, ScontrolError::Failed { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("nope") && e.contains("sh -c"), "{e}");
        let e = requeue(Path::new("/nonexistent/scontrol"), None, "5_2").unwrap_err();
        assert!(matches!(e, ScontrolError::Io { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("/nonexistent/scontrol requeue 5_2"), "{e}");
        scontrol(Path::new("true"), Some("/x/slurm.conf"), &[]).unwrap();
    }
}
