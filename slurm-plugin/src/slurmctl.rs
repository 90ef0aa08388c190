//! The Slurm commands the plugin itself runs, from slurmstepd as root.
//! When the node's sidecar cannot be reached: drain the node and requeue
//! the batch job, after writing why into its `AdminComment`. With the
//! sidecar down nobody else can do it, and a node that keeps taking shard
//! jobs it cannot serve fails every one of them while `sinfo` calls it
//! idle. smartmigd resumes the node when it is back
//! (`docs/slurm-integration.md`, "What can go wrong"). And on a requeued
//! job's next run that smartmigd has no note for: read the `AdminComment`
//! back, to tell the job's user why (issue 56; `smartmig_client::told`).

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
    run(program, slurm_conf, args, false).map(|_| ())
}

/// The most of `scontrol`'s stdout that is kept: a job record is a few KB,
/// and the fields its user sets (name, comment, paths) must not grow
/// slurmstepd's memory without bound.
const MAX_STDOUT: u64 = 256 * 1024;

/// [`scontrol`], returning its stdout (at most [`MAX_STDOUT`] bytes, as
/// UTF-8 with replacements) when `keep_stdout`. The output is read by a
/// helper thread while the command runs, so a long answer cannot fill the
/// pipe and hold the command past the timeout.
fn run(
    program: &Path,
    slurm_conf: Option<&str>,
    args: &[&str],
    keep_stdout: bool,
) -> Result<String, ScontrolError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(if keep_stdout {
            Stdio::piped()
        } else {
            Stdio::null()
        })
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
    let reader = child.stdout.take().map(|out| {
        std::thread::spawn(move || {
            use std::io::Read;
            let mut out = out;
            let mut kept = Vec::new();
            let _ = (&mut out).take(MAX_STDOUT).read_to_end(&mut kept);
            let _ = std::io::copy(&mut out, &mut std::io::sink());
            String::from_utf8_lossy(&kept).into_owned()
        })
    });
    let status = wait_bounded(&mut child).map_err(|e| match e {
        Waited::Io(source) => io(source),
        Waited::Timeout => ScontrolError::Timeout {
            command: command.clone(),
            secs: SCONTROL_TIMEOUT.as_secs(),
        },
    })?;
    let stdout = reader.and_then(|r| r.join().ok()).unwrap_or_default();
    if status.success() {
        return Ok(stdout);
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

/// Why [`wait_bounded`] gave up.
enum Waited {
    Io(std::io::Error),
    Timeout,
}

/// Waits for `child` at most [`SCONTROL_TIMEOUT`] (slurmctld down must not
/// hang the step), killing it past that.
fn wait_bounded(child: &mut std::process::Child) -> Result<ExitStatus, Waited> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Ok(s),
            Ok(None) if start.elapsed() > SCONTROL_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Waited::Timeout);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(Waited::Io(e)),
        }
    }
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

/// The job's `AdminComment` as slurmctld has it now (`scontrol show job
/// JOB`, `JOB` as [`requeue`] names it; `""` when none). `job_id` is the
/// step's own id (`S_JOB_ID`), whose record is the one read.
pub fn admin_comment(
    program: &Path,
    slurm_conf: Option<&str>,
    job: &str,
    job_id: u32,
) -> Result<String, ScontrolError> {
    let text = run(program, slurm_conf, &["show", "job", job], true)?;
    Ok(parse_admin_comment(&text, job_id).unwrap_or_default())
}

/// The `AdminComment` of job `job_id` in `scontrol show job` text (the
/// multi-line form every series prints: records start at a line
/// `JobId=<id> ...`, the comment is a line `AdminComment=TEXT ` of its
/// own). `None` without that record or line.
///
/// Hostile input: the record's other fields (name, paths, `Comment`) are
/// the job user's, and one with a newline could forge a line. The text is
/// only read through `smartmig_client::told::find`, whose word can do no
/// more than word the job's own output; that is what such a forgery gets.
pub fn parse_admin_comment(text: &str, job_id: u32) -> Option<String> {
    let head = format!("JobId={job_id} ");
    let mut in_record = false;
    for line in text.lines() {
        if line.starts_with("JobId=") {
            in_record = line.starts_with(&head);
        } else if in_record {
            if let Some(c) = line.trim_start().strip_prefix("AdminComment=") {
                return Some(c.trim_end().to_string());
            }
        }
    }
    None
}

/// `scontrol update JobId=JOB AdminComment=TEXT` (`JOB` as [`requeue`]
/// names it).
pub fn set_admin_comment(
    program: &Path,
    slurm_conf: Option<&str>,
    job: &str,
    text: &str,
) -> Result<(), ScontrolError> {
    scontrol(
        program,
        slurm_conf,
        &[
            "update",
            &format!("JobId={job}"),
            &format!("AdminComment={text}"),
        ],
    )
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

    /// The stdout is kept (bounded) and a long answer does not hang the
    /// command on a full pipe.
    #[test]
    fn stdout_is_kept_and_bounded() {
        let out = run(Path::new("sh"), None, &["-c", "echo JobId=1 x"], true).unwrap();
        assert_eq!(out, "JobId=1 x\n");
        let big = run(
            Path::new("sh"),
            None,
            &["-c", "head -c 1000000 /dev/zero | tr '\\0' a"],
            true,
        )
        .unwrap();
        assert_eq!(big.len() as u64, MAX_STDOUT);
    }

    /// The record of the asked job, its own `AdminComment` line; another
    /// record's line, or none, is not taken.
    #[test]
    fn admin_comment_is_read_from_the_jobs_own_record() {
        let text = "JobId=15 ArrayJobId=14 ArrayTaskId=3 JobName=w\n   UserId=u(1000)\n   \
                    AdminComment=site=a smartmig-requeued:at=1,why=x \n   Comment=c \n\n\
                    JobId=16 ArrayJobId=14 ArrayTaskId=4 JobName=w\n   AdminComment=other \n";
        assert_eq!(
            parse_admin_comment(text, 15).as_deref(),
            Some("site=a smartmig-requeued:at=1,why=x")
        );
        assert_eq!(parse_admin_comment(text, 16).as_deref(), Some("other"));
        assert_eq!(parse_admin_comment(text, 1), None);
        assert_eq!(
            parse_admin_comment("JobId=15 JobName=w\n   Comment=x \n", 15),
            None
        );
        assert_eq!(parse_admin_comment("", 15), None);
        // JobId=150 is not job 15's record.
        assert_eq!(
            parse_admin_comment("JobId=150 X\n   AdminComment=z \n", 15),
            None
        );
    }
}
