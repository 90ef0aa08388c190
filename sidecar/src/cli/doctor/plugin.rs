//! The plugin checks: plugstack.conf (slurm.conf's `PlugStackConfig`, else
//! `plugstack.conf` beside slurm.conf, with its `include` lines) has a
//! line loading the smartmig SPANK plugin, the library exists, its
//! arguments parse, and its socket is the daemon's root-only socket.
//!
//! The arguments are parsed by the plugin's own parser
//! (`smartmig_client::plugstack`).

use std::path::{Path, PathBuf};

use super::slurm::SlurmConf;
use super::{Check, Context};

use crate::daemon::plugstack::PluginArgs;

/// One plugin line of a plugstack file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginLine {
    pub file: PathBuf,
    pub line: usize,
    /// `required` or `optional`.
    pub kind: String,
    pub library: String,
    pub args: Vec<String>,
}

/// The parsed lines of one plugstack file: plugin lines and include patterns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plugstack {
    pub plugins: Vec<PluginLine>,
    pub includes: Vec<String>,
}

pub fn parse_plugstack(file: &Path, text: &str) -> Plugstack {
    let mut out = Plugstack::default();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        let mut w = line.split_whitespace();
        match w.next() {
            Some(kind @ ("required" | "optional")) => {
                if let Some(library) = w.next() {
                    out.plugins.push(PluginLine {
                        file: file.to_path_buf(),
                        line: n + 1,
                        kind: kind.to_string(),
                        library: library.to_string(),
                        args: w.map(str::to_string).collect(),
                    });
                }
            }
            Some("include") => out.includes.extend(w.map(str::to_string)),
            _ => {}
        }
    }
    out
}

/// `*`/`?` glob match of one file name.
fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob_match(&pattern[1..], name) || (!name.is_empty() && glob_match(pattern, &name[1..]))
        }
        (Some(b'?'), Some(_)) => glob_match(&pattern[1..], &name[1..]),
        (Some(p), Some(c)) if p == c => glob_match(&pattern[1..], &name[1..]),
        _ => false,
    }
}

/// The files an include pattern names (wildcards in the last component only).
fn include_files(pattern: &str, base: &Path) -> Vec<PathBuf> {
    let path = if Path::new(pattern).is_absolute() {
        PathBuf::from(pattern)
    } else {
        base.join(pattern)
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.contains(['*', '?']) {
        return vec![path];
    }
    let dir = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| glob_match(name.as_bytes(), n.to_string_lossy().as_bytes()))
        })
        .collect();
    out.sort();
    out
}

/// Reads a plugstack file and its includes (up to 4 levels deep).
fn read_all(file: &Path, depth: usize, lines: &mut Vec<PluginLine>, problems: &mut Vec<String>) {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            problems.push(format!("cannot read {}: {e}", file.display()));
            return;
        }
    };
    let parsed = parse_plugstack(file, &text);
    lines.extend(parsed.plugins);
    if depth >= 4 {
        return;
    }
    let base = file.parent().unwrap_or(Path::new("/"));
    for pattern in parsed.includes {
        for inc in include_files(&pattern, base) {
            read_all(&inc, depth + 1, lines, problems);
        }
    }
}

/// Where Slurm looks for a plugin given by a relative name.
fn plugin_dirs(conf: Option<&SlurmConf>) -> Vec<PathBuf> {
    match conf.and_then(|c| c.plugin_dir.as_deref()) {
        Some(dirs) => dirs.split(':').map(PathBuf::from).collect(),
        None => [
            "/usr/lib/x86_64-linux-gnu/slurm-wlm",
            "/usr/lib/aarch64-linux-gnu/slurm-wlm",
            "/usr/lib64/slurm",
            "/usr/lib/slurm",
            "/usr/local/lib/slurm",
        ]
        .into_iter()
        .map(PathBuf::from)
        .collect(),
    }
}

/// Whether a plugstack line loads the smartmig plugin.
pub fn is_smartmig(line: &PluginLine) -> bool {
    Path::new(&line.library)
        .file_name()
        .is_some_and(|n| n.to_string_lossy().contains("smartmig"))
        || line.library.contains("smartmig")
}

pub fn check(slurm_conf: &Path, conf: Option<&SlurmConf>, ctx: &Context) -> Vec<Check> {
    let Some(slurm) = conf else {
        return vec![Check::skipped(
            "plugin.line",
            "slurm.conf could not be read, so plugstack.conf is unknown",
            "give slurm.conf's path with --slurm-conf",
        )];
    };
    let dir = slurm_conf.parent().unwrap_or(Path::new("/"));
    let plugstack = slurm.plugstack.as_ref().map_or_else(
        || dir.join("plugstack.conf"),
        |p| {
            let p = PathBuf::from(p);
            if p.is_absolute() {
                p
            } else {
                dir.join(p)
            }
        },
    );
    let mut lines = Vec::new();
    let mut problems = Vec::new();
    read_all(&plugstack, 0, &mut lines, &mut problems);
    let ours: Vec<PluginLine> = lines.into_iter().filter(is_smartmig).collect();
    let mut out = Vec::new();
    if !problems.is_empty() {
        out.push(Check::warn(
            "plugin.files",
            problems.join("; "),
            "make plugstack.conf and its includes readable (doctor reads them as Slurm does)",
        ));
    }
    let admin = ctx.config.map(crate::daemon::Config::admin_socket);
    let example = format!(
        "required /usr/local/lib/slurm/libsmartmig_spank.so socket={} timeout=60",
        admin
            .as_deref()
            .unwrap_or(Path::new(crate::daemon::protocol::DEFAULT_ADMIN_SOCKET))
            .display()
    );
    out.extend(line_checks(&plugstack, &ours, &example));
    let Some(line) = ours.first() else {
        return out;
    };
    out.push(library_check(line, &plugin_dirs(conf)));
    let args = match PluginArgs::parse(&line.args) {
        Ok(a) => {
            out.push(Check::ok(
                "plugin.args",
                format!("{}:{}: arguments parse", line.file.display(), line.line),
            ));
            a
        }
        Err(e) => {
            out.push(Check::fail(
                "plugin.args",
                format!("{}:{}: {e}", line.file.display(), line.line),
                "fix the argument (docs/slurm-integration.md lists them); until then every shard job on this node fails",
            ));
            return out;
        }
    };
    let Some(config) = ctx.config else {
        out.push(Check::skipped(
            "plugin.socket",
            format!(
                "the plugin uses {}; the daemon's config did not load",
                args.socket.display()
            ),
            "fix the config first",
        ));
        return out;
    };
    out.push(socket_check(
        line,
        &args.socket,
        &config.admin_socket(),
        &config.socket,
    ));
    out.push(timeout_check(
        args.timeout.as_secs_f64(),
        config.allocate_wait_s,
    ));
    out
}

/// Exactly one `required` line loads the plugin.
pub fn line_checks(plugstack: &Path, ours: &[PluginLine], example: &str) -> Vec<Check> {
    let Some(first) = ours.first() else {
        return vec![Check::fail(
            "plugin.line",
            format!(
                "no line in {} (or its includes) loads the smartmig plugin",
                plugstack.display()
            ),
            format!(
                "add `{example}` to {} and restart slurmd",
                plugstack.display()
            ),
        )];
    };
    let place = format!("{}:{}", first.file.display(), first.line);
    if ours.len() > 1 {
        let all: Vec<String> = ours
            .iter()
            .map(|l| format!("{}:{}", l.file.display(), l.line))
            .collect();
        return vec![Check::warn(
            "plugin.line",
            format!(
                "the plugin is loaded {} times ({})",
                ours.len(),
                all.join(", ")
            ),
            "keep one line: Slurm would run the plugin once per line",
        )];
    }
    if first.kind == "optional" {
        return vec![Check::warn(
            "plugin.line",
            format!("{place}: `optional`: Slurm ignores the plugin's errors, so a job whose allocation failed runs on the whole GPU"),
            "use `required`",
        )];
    }
    vec![Check::ok(
        "plugin.line",
        format!("{place}: required {}", first.library),
    )]
}

fn library_check(line: &PluginLine, dirs: &[PathBuf]) -> Check {
    let lib = Path::new(&line.library);
    let candidates: Vec<PathBuf> = if lib.is_absolute() {
        vec![lib.to_path_buf()]
    } else {
        dirs.iter().map(|d| d.join(lib)).collect()
    };
    match candidates.iter().find(|p| p.is_file()) {
        Some(p) => Check::ok("plugin.library", format!("{} exists", p.display())),
        None => Check::fail(
            "plugin.library",
            format!(
                "{}:{}: {} not found (looked for {})",
                line.file.display(),
                line.line,
                line.library,
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "install target/release/libsmartmig_spank.so there, or fix the path",
        ),
    }
}

/// The plugin's `socket=` must be the daemon's root-only socket.
pub fn socket_check(line: &PluginLine, plugin: &Path, admin: &Path, public: &Path) -> Check {
    if plugin == admin {
        return Check::ok(
            "plugin.socket",
            format!("socket={} is smartmigd's admin_socket", plugin.display()),
        );
    }
    let public_note = if plugin == public {
        " (that is the public socket: it answers, but any user can crowd it with connections)"
    } else {
        ""
    };
    Check::fail(
        "plugin.socket",
        format!(
            "{}:{}: the plugin uses {}{public_note}, smartmigd's admin_socket is {}",
            line.file.display(),
            line.line,
            plugin.display(),
            admin.display()
        ),
        format!(
            "set socket={} in plugstack.conf (or admin_socket in smartmig.toml)",
            admin.display()
        ),
    )
}

/// docs/slurm-integration.md: keep `timeout` above `allocate_wait_s`.
pub fn timeout_check(timeout_s: f64, allocate_wait_s: u64) -> Check {
    if timeout_s > allocate_wait_s as f64 {
        Check::ok(
            "plugin.timeout",
            format!("timeout={timeout_s} s > allocate_wait_s={allocate_wait_s} s"),
        )
    } else {
        Check::warn(
            "plugin.timeout",
            format!("timeout={timeout_s} s is not above smartmigd's allocate_wait_s={allocate_wait_s} s: jobs that wait for a release time out instead"),
            format!("set timeout={} or more in plugstack.conf", allocate_wait_s + 30),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;

    #[test]
    fn finds_the_plugin_line_and_includes() {
        let p = parse_plugstack(
            Path::new("/etc/slurm/plugstack.conf"),
            "# c\noptional other.so\nrequired /usr/lib/libsmartmig_spank.so socket=/run/x.sock timeout=60 # end\ninclude /etc/slurm/plugstack.conf.d/*.conf\n",
        );
        assert_eq!(p.plugins.len(), 2);
        assert_eq!(p.includes, ["/etc/slurm/plugstack.conf.d/*.conf"]);
        let ours: Vec<PluginLine> = p.plugins.into_iter().filter(is_smartmig).collect();
        assert_eq!(ours.len(), 1);
        assert_eq!(ours[0].line, 3);
        assert_eq!(ours[0].args, ["socket=/run/x.sock", "timeout=60"]);
        assert_eq!(
            line_checks(Path::new("p"), &ours, "x")[0].status,
            Status::Ok
        );
        assert_eq!(
            line_checks(Path::new("p"), &[], "x")[0].status,
            Status::Fail
        );
    }

    #[test]
    fn globs_match_names() {
        assert!(glob_match(b"*.conf", b"smartmig.conf"));
        assert!(!glob_match(b"*.conf", b"smartmig.conf~"));
        assert!(glob_match(b"a?c", b"abc"));
    }

    #[test]
    fn the_plugins_parser_names_the_bad_word() {
        let e = PluginArgs::parse(&["sokcet=/x"]).unwrap_err().to_string();
        assert!(
            e.contains("unknown plugstack.conf argument `sokcet=/x`"),
            "{e}"
        );
    }

    #[test]
    fn socket_and_timeout_verdicts() {
        let line = PluginLine {
            file: PathBuf::from("/etc/slurm/plugstack.conf"),
            line: 1,
            kind: "required".into(),
            library: "libsmartmig_spank.so".into(),
            args: Vec::new(),
        };
        let admin = Path::new("/run/smartmig/smartmig-root.sock");
        let public = Path::new("/run/smartmig/smartmig.sock");
        assert_eq!(socket_check(&line, admin, admin, public).status, Status::Ok);
        let c = socket_check(&line, public, admin, public);
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains("public socket") && c.detail.contains("smartmig-root.sock"),
            "{c:?}"
        );
        assert_eq!(timeout_check(60.0, 30).status, Status::Ok);
        assert_eq!(timeout_check(30.0, 30).status, Status::Warn);
    }
}
