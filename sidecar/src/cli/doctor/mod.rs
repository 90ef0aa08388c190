//! `smartmig doctor`: a read-only check of a node before the plugin is
//! enabled (docs/doctor.md).
//!
//! Each group gathers what it needs (files, NVML, the daemon's sockets) at
//! its edge and hands plain data to pure functions that decide `ok`, `warn`
//! or `fail`; this module runs the groups in order, prints one line per
//! check (or a JSON array) and fails when any check failed. Nothing here
//! writes a file, changes MIG, or sends the daemon anything but `health`
//! and `status`. The one exception is `--hardware-test --yes`
//! ([`hardware`]), which creates and destroys MIG instances on an idle GPU.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::socket::DEFAULT_CONFIG;
use crate::daemon::config::Config;
use crate::mig::GpuModel;

mod daemon;
mod gpus;
mod hardware;
mod hostlist;
mod plugin;
mod policy;
mod slurm;
mod survey;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// smartmigd's config file (the same file and loader smartmigd uses).
    #[arg(long, default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Slurm's slurm.conf (default: $SLURM_CONF, else /etc/slurm/slurm.conf);
    /// gres.conf is read from the same directory.
    #[arg(long)]
    pub slurm_conf: Option<PathBuf>,
    /// This node's Slurm name (default: the config's node_name, else the host name).
    #[arg(long)]
    pub node: Option<String>,
    /// The checks as a JSON array of {check, status, detail, fix}.
    #[command(flatten)]
    pub json: super::args::JsonArg,
    /// Create and destroy one instance of every profile on an idle MIG GPU
    /// (`--gpu-index N --yes`); refuses on a GPU with instances or while smartmigd runs.
    #[arg(long)]
    pub hardware_test: bool,
    /// The GPU (NVML index) the hardware test uses.
    #[arg(
        long = "gpu-index",
        value_name = "N",
        alias = "gpu",
        requires = "hardware_test"
    )]
    pub gpu: Option<u32>,
    /// Confirm the hardware test: it changes the GPU's MIG instances.
    #[arg(long, requires = "hardware_test")]
    pub yes: bool,
    /// Print, as JSON, every MIG profile NVML reports per GPU (ids, slices,
    /// memory, names, placements), MIG mode, and the table's verdict; read
    /// only, no config needed.
    #[arg(long, conflicts_with_all = ["hardware_test", "json"])]
    pub nvml_survey: bool,
}

/// A check's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Dotted name, e.g. `nvml.gpu0.mig`.
    pub check: String,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do (warn and fail only).
    pub fix: Option<String>,
}

impl Check {
    pub fn ok(check: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            check: check.into(),
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn warn(
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::with_fix(Status::Warn, check.into(), detail.into(), fix.into())
    }

    pub fn fail(
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::with_fix(Status::Fail, check.into(), detail.into(), fix.into())
    }

    fn with_fix(status: Status, check: String, detail: String, fix: String) -> Check {
        Check {
            check,
            status,
            detail,
            fix: Some(fix),
        }
    }

    /// A check that could not run, and why.
    pub fn skipped(
        check: impl Into<String>,
        why: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::warn(check, format!("not checked: {}", why.into()), fix)
    }
}

/// One GPU as the backend sees it (NVML, or the sim's `[[gpus]]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeGpu {
    pub index: u32,
    pub model: GpuModel,
    /// The N of `/dev/nvidiaN` (the sim's GPU i is minor i).
    pub minor: Option<u32>,
}

/// What the earlier groups learnt that later ones compare with.
pub struct Context<'a> {
    pub config: Option<&'a Config>,
    /// The node's GPUs, when the backend could tell.
    pub gpus: Option<Vec<NodeGpu>>,
    pub node: String,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.nvml_survey {
        return survey::run(args);
    }
    let checks = if args.hardware_test {
        hardware::run(args)?
    } else {
        gather(args)
    };
    if !args.json.to_stdout() {
        print!("{}", render(&checks));
    }
    args.json.write(&checks)?;
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    if failed > 0 {
        anyhow::bail!(
            "doctor: {failed} check(s) failed (see the `fail` lines; docs/doctor.md says what each means)"
        );
    }
    Ok(())
}

/// Every check, in order: config, GPUs, Slurm, plugin, daemon, policy.
fn gather(args: &Args) -> Vec<Check> {
    let mut out = Vec::new();
    let config = match Config::load(&args.config) {
        Ok(c) => {
            out.push(Check::ok(
                "config",
                format!("{} loads and validates", args.config.display()),
            ));
            Some(c)
        }
        Err(e) => {
            out.push(Check::fail(
                "config",
                e.to_string(),
                format!(
                    "fix {} (`smartmigd --config {} --check-config` says the same); see etc/smartmig.toml",
                    args.config.display(),
                    args.config.display()
                ),
            ));
            None
        }
    };
    let (gpu_checks, gpus) = gpus::check(config.as_ref());
    out.extend(gpu_checks);
    let node = args
        .node
        .clone()
        .or_else(|| config.as_ref().and_then(|c| c.node_name.clone()))
        .unwrap_or_else(hostname);
    let ctx = Context {
        config: config.as_ref(),
        gpus,
        node,
    };
    let slurm_conf = slurm_conf_path(args.slurm_conf.as_deref());
    let (slurm_checks, conf) = slurm::check(&slurm_conf, &ctx);
    out.extend(slurm_checks);
    out.extend(plugin::check(&slurm_conf, conf.as_ref(), &ctx));
    out.extend(daemon::check(&ctx));
    out.extend(policy::check(&ctx));
    out
}

/// `--slurm-conf`, else `$SLURM_CONF`, else `/etc/slurm/slurm.conf`.
fn slurm_conf_path(given: Option<&Path>) -> PathBuf {
    given.map(Path::to_path_buf).unwrap_or_else(|| {
        std::env::var_os("SLURM_CONF")
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from("/etc/slurm/slurm.conf"), PathBuf::from)
    })
}

/// The host name (as smartmigd takes it when `node_name` is unset).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// One line per check: status, name, detail and, for warn/fail, the fix.
pub fn render(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.check.len()).max().unwrap_or(0);
    let mut out = String::new();
    for c in checks {
        let _ = write!(
            out,
            "{:<4}  {:<width$}  {}",
            c.status.word(),
            c.check,
            c.detail
        );
        if let Some(fix) = &c.fix {
            let _ = write!(out, " -> {fix}");
        }
        out.push('\n');
    }
    let count = |s| checks.iter().filter(|c| c.status == s).count();
    let _ = writeln!(
        out,
        "{} ok, {} warn, {} fail",
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail)
    );
    let names_docs = checks.iter().any(|c| {
        c.detail.contains("docs/") || c.fix.as_deref().is_some_and(|f| f.contains("docs/"))
    });
    if names_docs {
        let _ = writeln!(out, "{DOCS_HINT}");
    }
    out
}

/// Where the `docs/NAME.md` that checks name are on a node: package
/// smartmig installs them outside /usr/share/doc, which minimal images drop.
pub const DOCS_HINT: &str =
    "docs/NAME.md above: /usr/share/smartmig/doc/NAME.md (package smartmig), or docs/ in the source";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_check_with_the_fix() {
        let text = render(&[
            Check::ok("config", "loads"),
            Check::fail("nvml.gpu0.mig", "MIG mode is off", "nvidia-smi -i 0 -mig 1"),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("ok    config"), "{text}");
        assert!(
            lines[1].starts_with("fail  nvml.gpu0.mig  MIG mode is off -> nvidia-smi"),
            "{text}"
        );
        assert_eq!(lines[2], "1 ok, 0 warn, 1 fail");
        // A check that names a doc: one more line says where docs are.
        let text = render(&[Check::warn(
            "slurm.requeue",
            "off",
            "see docs/slurm-integration.md §3",
        )]);
        assert_eq!(text.lines().last(), Some(DOCS_HINT), "{text}");
    }

    #[test]
    fn json_has_the_four_fields() {
        let v = serde_json::to_value([Check::warn("a", "b", "c")]).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"check": "a", "status": "warn", "detail": "b", "fix": "c"}])
        );
    }

    #[test]
    fn slurm_conf_from_the_flag_first() {
        assert_eq!(
            slurm_conf_path(Some(Path::new("/x/slurm.conf"))),
            PathBuf::from("/x/slurm.conf")
        );
    }
}
