//! The Slurm checks: slurm.conf (`GresTypes`, `SelectType`, this node's
//! `Gres=`) and gres.conf (beside slurm.conf: Slurm always reads
//! `gres.conf` from slurm.conf's directory) against the node's GPUs, as
//! docs/slurm-integration.md section 1 asks: one `gpu` per GPU, one
//! `shard` line per GPU with `Count` = its compute slices and `File` = its
//! device, and no `AutoDetect=nvml` (or `full`, 26.05+).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use smartmig_daemon::config::HoldRule;

use super::hostlist::{expand, HostlistError};
use super::{Check, Context, NodeGpu};

/// What doctor reads from slurm.conf.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlurmConf {
    pub gres_types: Option<String>,
    pub select_type: Option<String>,
    pub plugstack: Option<String>,
    pub plugin_dir: Option<String>,
    pub scheduler_parameters: Option<String>,
    pub auth_info: Option<String>,
    /// `NodeName=` lines: (line number, names, `Gres=` value).
    pub nodes: Vec<NodeLine>,
    /// `Include` lines (not followed).
    pub includes: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLine {
    pub line: usize,
    pub names: Result<Vec<String>, HostlistError>,
    pub gres: Option<String>,
}

/// `Key=Value` words of a line, keys lower-cased; comments removed.
fn words(line: &str) -> Vec<(String, String)> {
    let line = line.split('#').next().unwrap_or("");
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect()
}

/// Lines with `\` continuations joined, numbered from 1 (the first line).
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (n, raw) in text.lines().enumerate() {
        let (start, mut acc) = pending.take().unwrap_or((n + 1, String::new()));
        if let Some(head) = raw.strip_suffix('\\') {
            acc.push_str(head);
            acc.push(' ');
            pending = Some((start, acc));
        } else {
            acc.push_str(raw);
            out.push((start, acc));
        }
    }
    out.extend(pending);
    out
}

pub fn parse_slurm_conf(text: &str) -> SlurmConf {
    let mut c = SlurmConf::default();
    for (n, line) in logical_lines(text) {
        let trimmed = line.trim_start();
        if trimmed.len() > 8 && trimmed[..8].eq_ignore_ascii_case("include ") {
            c.includes.push(trimmed[8..].trim().to_string());
            continue;
        }
        let w = words(&line);
        let get = |k: &str| w.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        if let Some(names) = get("nodename") {
            if !names.eq_ignore_ascii_case("DEFAULT") {
                c.nodes.push(NodeLine {
                    line: n,
                    names: expand(&names),
                    gres: get("gres"),
                });
            }
            continue;
        }
        if get("partitionname").is_some() {
            continue;
        }
        for (k, v) in &w {
            match k.as_str() {
                "grestypes" => c.gres_types = Some(v.clone()),
                "selecttype" => c.select_type = Some(v.clone()),
                "plugstackconfig" => c.plugstack = Some(v.clone()),
                "plugindir" => c.plugin_dir = Some(v.clone()),
                "schedulerparameters" => c.scheduler_parameters = Some(v.clone()),
                "authinfo" => c.auth_info = Some(v.clone()),
                _ => {}
            }
        }
    }
    c
}

/// One gres.conf line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GresLine {
    pub line: usize,
    /// `NodeName=` as written (absent: every node).
    pub nodes: Option<String>,
    pub name: Option<String>,
    /// `Type=` (the per-GPU `mig<i>` that `slurm.holds` needs).
    pub gtype: Option<String>,
    pub count: Option<String>,
    pub file: Option<String>,
    pub autodetect: Option<String>,
}

pub fn parse_gres_conf(text: &str) -> Vec<GresLine> {
    logical_lines(text)
        .into_iter()
        .filter_map(|(n, line)| {
            let w = words(&line);
            if w.is_empty() {
                return None;
            }
            let get = |k: &str| w.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
            Some(GresLine {
                line: n,
                nodes: get("nodename"),
                name: get("name").map(|s| s.to_ascii_lowercase()),
                gtype: get("type"),
                count: get("count"),
                file: get("file"),
                autodetect: get("autodetect"),
            })
        })
        .collect()
}

/// Whether `name` matches `node` (or its short form, `n1` for `n1.example`).
fn is_node(name: &str, node: &str) -> bool {
    name == node || node.split('.').next() == Some(name)
}

/// The gres.conf lines that apply to `node`, and the warnings of lines
/// whose `NodeName=` could not be expanded.
pub fn lines_for_node<'a>(lines: &'a [GresLine], node: &str) -> (Vec<&'a GresLine>, Vec<String>) {
    let mut out = Vec::new();
    let mut bad = Vec::new();
    for l in lines {
        match &l.nodes {
            None => out.push(l),
            Some(list) => match expand(list) {
                Ok(names) if names.iter().any(|n| is_node(n, node)) => out.push(l),
                Ok(_) => {}
                Err(e) => bad.push(format!("line {}: {e}", l.line)),
            },
        }
    }
    (out, bad)
}

/// `gpu:2,shard:14` (also `gpu:a100:2`) -> {gpu: 2, shard: 14}.
pub fn gres_counts(gres: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for item in gres.split(',') {
        let parts: Vec<&str> = item.split(':').collect();
        let Some(name) = parts.first().map(|n| n.trim().to_ascii_lowercase()) else {
            continue;
        };
        let count = match parts.as_slice() {
            [_] => Some(1),
            [.., last] => last.trim().parse::<u64>().ok(),
            [] => None,
        };
        if let Some(c) = count {
            *out.entry(name).or_insert(0) += c;
        }
    }
    out
}

/// The minor number of a device file: the char device's minor when it is
/// one, else the N of a name ending in `nvidiaN`.
pub fn device_minor(file: &str, rdev_minor: Option<u32>) -> Option<u32> {
    rdev_minor.or_else(|| {
        let name = Path::new(file).file_name()?.to_str()?;
        name.strip_prefix("nvidia")?.parse().ok()
    })
}

fn rdev_minor(file: &str) -> Option<u32> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(file).ok()?;
    // Linux dev_t: minor = bits 0-7 and 20-31.
    let rdev = meta.rdev();
    meta.file_type()
        .is_char_device()
        .then_some(((rdev & 0xff) | ((rdev >> 12) & 0xffff_ff00)) as u32)
}

/// Sorts device files as Slurm numbers them: by name, numbers compared as
/// numbers (`nvidia2` before `nvidia10`).
fn natural_key(s: &str) -> (String, u64) {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = s.split_at(s.len() - digits);
    (head.to_string(), tail.parse().unwrap_or(0))
}

/// Runs the Slurm checks; also returns the parsed slurm.conf for the
/// plugin checks.
pub fn check(slurm_conf: &Path, ctx: &Context) -> (Vec<Check>, Option<SlurmConf>) {
    let mut out = Vec::new();
    let text = match std::fs::read_to_string(slurm_conf) {
        Ok(t) => t,
        Err(e) => {
            out.push(Check::fail(
                "slurm.conf",
                format!("cannot read {}: {e}", slurm_conf.display()),
                "give its path with --slurm-conf (or SLURM_CONF)",
            ));
            return (out, None);
        }
    };
    let conf = parse_slurm_conf(&text);
    out.push(Check::ok(
        "slurm.conf",
        format!("read {} (node {})", slurm_conf.display(), ctx.node),
    ));
    if !conf.includes.is_empty() {
        out.push(Check::warn(
            "slurm.include",
            format!("Include lines not read: {}", conf.includes.join(", ")),
            "settings in included files are not checked; check them by hand",
        ));
    }
    out.extend(conf_checks(&conf, &ctx.node, ctx.gpus.as_deref()));
    out.push(requeue_check(&conf, slurm_release(slurm_conf)));
    let gres_path = slurm_conf
        .parent()
        .map_or_else(|| PathBuf::from("gres.conf"), |d| d.join("gres.conf"));
    match std::fs::read_to_string(&gres_path) {
        Ok(text) => {
            let lines = parse_gres_conf(&text);
            // A missing file has no minor: its name must not pass for one.
            let minors = |f: &str| {
                Path::new(f)
                    .exists()
                    .then(|| device_minor(f, rdev_minor(f)))
                    .flatten()
            };
            out.push(device_files_check(
                &gres_path.display().to_string(),
                &lines,
                &ctx.node,
            ));
            out.extend(gres_checks(
                &gres_path.display().to_string(),
                &lines,
                &ctx.node,
                ctx.gpus.as_deref(),
                &minors,
            ));
            // Without a config: the daemon's default (`auto`).
            if ctx.config.is_none_or(|c| c.slurm.enabled) {
                out.push(holds_check(
                    &gres_path.display().to_string(),
                    &lines,
                    &ctx.node,
                    ctx.config.map_or(HoldRule::Auto, |c| c.slurm.holds),
                ));
            }
        }
        Err(e) => out.push(Check::fail(
            "slurm.gres",
            format!("cannot read {}: {e}", gres_path.display()),
            "create gres.conf beside slurm.conf (etc/slurm/gres.conf.snippet)",
        )),
    }
    (out, Some(conf))
}

/// Every `File=` of this node's gpu and shard lines must be a character
/// device: slurmd waits about 20 s for a missing one and then stops
/// (`fatal: can't stat gres.conf file`), and refuses a regular file
/// (`is not a valid character or block device`). A node without GPUs (the
/// `sim` backend) needs stand-ins.
fn device_files_check(path: &str, lines: &[GresLine], node: &str) -> Check {
    use std::os::unix::fs::FileTypeExt;
    let (mine, _) = lines_for_node(lines, node);
    let mut files: Vec<String> = mine
        .iter()
        .filter(|l| matches!(l.name.as_deref(), Some("gpu" | "shard")))
        .filter_map(|l| l.file.as_deref().map(expand))
        .filter_map(Result::ok)
        .flatten()
        .collect();
    files.sort_by_key(|f| natural_key(f));
    files.dedup();
    let bad: Vec<String> = files
        .iter()
        .filter_map(|f| match std::fs::metadata(f) {
            Err(e) => Some(format!("{f}: {e}")),
            Ok(m) if !m.file_type().is_char_device() => {
                Some(format!("{f}: not a character device"))
            }
            Ok(_) => None,
        })
        .collect();
    if bad.is_empty() {
        Check::ok(
            "slurm.gres.devices",
            format!(
                "{path}: {} device file(s), all character devices",
                files.len()
            ),
        )
    } else {
        Check::fail(
            "slurm.gres.devices",
            format!(
                "{path}: {} (slurmd waits about 20 s for a missing device file, then exits: `fatal: can't stat gres.conf file`)",
                bad.join("; ")
            ),
            "on a GPU node, load the NVIDIA driver (it makes /dev/nvidiaN); on a node without GPUs \
             (backend = \"sim\"), make stand-ins, one per GPU: `mknod -m 0666 /dev/nvidiaN c 195 N` \
             (docs/quickstart-admin.md)",
        )
    }
}

/// The Slurm release series of this node's clients (`scontrol --version`,
/// which needs the slurm.conf), `None` when it cannot be read.
fn slurm_release(slurm_conf: &Path) -> Option<(u32, u32)> {
    let out = std::process::Command::new("scontrol")
        .arg("--version")
        .env("SLURM_CONF", slurm_conf)
        .output()
        .ok()?;
    crate::daemon::slurm::parse_release(&String::from_utf8_lossy(&out.stdout))
}

/// The value of `key=` in a comma-separated parameter list.
fn param<'a>(list: Option<&'a str>, key: &str) -> Option<&'a str> {
    list?
        .split(',')
        .find_map(|p| p.trim().strip_prefix(key)?.strip_prefix('='))
}

/// How long a job smartmigd requeues (an out-of-memory restart) waits
/// before it runs again: Slurm holds it `requeue_delay` (25.11+) or
/// `cred_expire` + 1 s (default 121 s), then starts it at the next
/// scheduling pass (`sched_interval`, default 60 s). On 25.11+ a long hold
/// is a warning, since `requeue_delay` shortens it alone; before, only a
/// shorter `cred_expire` (every credential's lifetime) would.
pub fn requeue_check(conf: &SlurmConf, release: Option<(u32, u32)>) -> Check {
    let sched = conf.scheduler_parameters.as_deref();
    let number = |v: Option<&str>| v.and_then(|v| v.trim().parse::<u64>().ok());
    let cred = number(param(conf.auth_info.as_deref(), "cred_expire")).unwrap_or(120);
    let delay = number(param(sched, "requeue_delay"));
    let interval = number(param(sched, "sched_interval")).unwrap_or(60);
    let has_delay = release.is_some_and(|r| r >= (25, 11));
    let hold = match delay {
        Some(d) if has_delay => d,
        _ => cred + 1,
    };
    let detail = format!(
        "an out-of-memory restart waits {hold} s ({}), then up to {interval} s for the next scheduling pass",
        if delay.is_some() && has_delay {
            "requeue_delay".to_string()
        } else {
            format!("cred_expire {cred} s + 1")
        }
    );
    if has_delay && delay.is_none() && hold > 30 {
        Check::warn(
            "slurm.requeue",
            detail,
            "Slurm 25.11+: set SchedulerParameters=requeue_delay=5 for quick out-of-memory \
             restarts (docs/slurm-integration.md, \"Slurm series\")",
        )
    } else {
        Check::ok("slurm.requeue", detail)
    }
}

/// slurm.conf: GresTypes, SelectType and this node's Gres=.
pub fn conf_checks(conf: &SlurmConf, node: &str, gpus: Option<&[NodeGpu]>) -> Vec<Check> {
    let mut out = vec![grestypes_check(conf), select_check(conf)];
    out.extend(hostlist_check(conf));
    out.push(node_gres_check(conf, node, gpus));
    out
}

/// GresTypes has gpu and shard.
fn grestypes_check(conf: &SlurmConf) -> Check {
    let types: Vec<String> = conf
        .gres_types
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(|t| t.trim().to_ascii_lowercase())
        .collect();
    let lacking: Vec<&str> = ["gpu", "shard"]
        .into_iter()
        .filter(|t| !types.iter().any(|x| x == t))
        .collect();
    if lacking.is_empty() {
        Check::ok("slurm.grestypes", "GresTypes has gpu and shard")
    } else {
        Check::fail(
            "slurm.grestypes",
            format!(
                "GresTypes={} lacks {}",
                conf.gres_types.as_deref().unwrap_or("(unset)"),
                lacking.join(" and ")
            ),
            "set GresTypes=gpu,shard in slurm.conf and restart slurmctld and slurmd",
        )
    }
}

/// SelectType is select/cons_tres, which shards need.
fn select_check(conf: &SlurmConf) -> Check {
    match conf.select_type.as_deref() {
        Some("select/cons_tres") => Check::ok("slurm.select", "SelectType=select/cons_tres"),
        other => Check::fail(
            "slurm.select",
            format!(
                "SelectType={} (shards need select/cons_tres: slurmctld exits at start otherwise)",
                other.unwrap_or("(unset)")
            ),
            "set SelectType=select/cons_tres in slurm.conf",
        ),
    }
}

/// A warning for the NodeName lines doctor does not understand.
fn hostlist_check(conf: &SlurmConf) -> Option<Check> {
    let bad: Vec<String> = conf
        .nodes
        .iter()
        .filter_map(|n| {
            n.names
                .as_ref()
                .err()
                .map(|e| format!("line {}: {e}", n.line))
        })
        .collect();
    (!bad.is_empty()).then(|| {
        Check::warn(
            "slurm.hostlist",
            format!("slurm.conf NodeName not understood: {}", bad.join("; ")),
            "doctor handles NAME[1-4,7] lists only; check these lines by hand",
        )
    })
}

/// This node's NodeName line has Gres=gpu:N,shard:M for its GPUs.
fn node_gres_check(conf: &SlurmConf, node: &str, gpus: Option<&[NodeGpu]>) -> Check {
    let line = conf.nodes.iter().find(|n| {
        n.names
            .as_ref()
            .is_ok_and(|ns| ns.iter().any(|x| is_node(x, node)))
    });
    let Some(line) = line else {
        return Check::fail(
            "slurm.node",
            format!("no NodeName line in slurm.conf names {node}"),
            "declare the node (`NodeName=... Gres=gpu:N,shard:M`), or give its Slurm name with --node",
        );
    };
    let Some(gres) = &line.gres else {
        return Check::fail(
            "slurm.node",
            format!("slurm.conf line {}: node {node} has no Gres=", line.line),
            "add Gres=gpu:N,shard:M (N GPUs, M = their compute slices together)",
        );
    };
    let counts = gres_counts(gres);
    let Some(gpus) = gpus else {
        return Check::skipped(
            "slurm.node",
            format!("Gres={gres}: the node's GPUs are unknown"),
            "fix the GPU checks above",
        );
    };
    let want_gpu = gpus.len() as u64;
    let want_shard: u64 = gpus
        .iter()
        .map(|g| u64::from(g.model.spec().compute_slices))
        .sum();
    let have = |k: &str| counts.get(k).copied().unwrap_or(0);
    if have("gpu") == want_gpu && have("shard") == want_shard {
        Check::ok(
            "slurm.node",
            format!(
                "line {}: Gres={gres} ({want_gpu} GPUs, {want_shard} compute slices)",
                line.line
            ),
        )
    } else {
        Check::fail(
            "slurm.node",
            format!(
                "line {}: Gres={gres}, but the node has {want_gpu} GPU(s) with {want_shard} compute slices",
                line.line
            ),
            format!("set Gres=gpu:{want_gpu},shard:{want_shard} on the node's line"),
        )
    }
}

/// gres.conf: AutoDetect, the `gpu` devices against the GPUs' minors and
/// one `shard` line per GPU with its compute slices.
pub fn gres_checks(
    path: &str,
    lines: &[GresLine],
    node: &str,
    gpus: Option<&[NodeGpu]>,
    minor_of: &dyn Fn(&str) -> Option<u32>,
) -> Vec<Check> {
    let mut out = Vec::new();
    let (mine, bad) = lines_for_node(lines, node);
    if !bad.is_empty() {
        out.push(Check::warn(
            "slurm.gres.hostlist",
            format!("{path}: NodeName not understood: {}", bad.join("; ")),
            "doctor handles NAME[1-4,7] lists only; check these lines by hand",
        ));
    }
    out.push(autodetect_check(path, &mine));
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for l in mine.iter().filter(|l| l.name.as_deref() == Some("gpu")) {
        match l.file.as_deref().map(expand) {
            Some(Ok(f)) => files.extend(f),
            Some(Err(e)) => errors.push(format!("line {}: {e}", l.line)),
            None => errors.push(format!("line {}: Name=gpu without File=", l.line)),
        }
    }
    files.sort_by_key(|f| natural_key(f));
    files.dedup();
    if !errors.is_empty() {
        out.push(Check::fail(
            "slurm.gres.gpu",
            format!("{path}: {}", errors.join("; ")),
            "list the GPUs as `Name=gpu File=/dev/nvidia[0-N]` (docs/slurm-integration.md, gres.conf)",
        ));
    }
    if files.is_empty() {
        out.push(Check::fail(
            "slurm.gres.gpu",
            format!("{path} has no Name=gpu File=... line for {node}"),
            format!("add `NodeName={node} Name=gpu File=/dev/nvidia[0-N]`"),
        ));
        return out;
    }
    let Some(gpus) = gpus else {
        out.push(Check::skipped(
            "slurm.gres.gpu",
            format!(
                "{} gpu device(s) in {path}; the node's GPUs are unknown",
                files.len()
            ),
            "fix the GPU checks above",
        ));
        return out;
    };
    out.push(gpu_files_check(path, &files, gpus, minor_of));
    out.extend(shard_checks(path, &mine, &files, gpus));
    out
}

/// smartmigd's holds on stranded shards name their GPU by GRES type:
/// Slurm's GPU i (the i-th `gpu` device file in sorted order) needs its
/// own `gpu` and `shard` lines with `Type=mig<i>` (docs/slurm-integration.md
/// §9). Where they lack, smartmigd runs without holds (issue 56): with
/// `holds` absent or `"auto"` (the default) that is a warning with the
/// migration, with an explicit rule a failure, with `"off"` nothing to
/// check.
pub fn holds_check(path: &str, lines: &[GresLine], node: &str, configured: HoldRule) -> Check {
    if configured == HoldRule::Off {
        return Check::ok(
            "slurm.holds",
            "holds = \"off\": Slurm may place jobs on shards MIG cannot build (requeues, failed \
             interactive steps); per-GPU GRES types not checked",
        );
    }
    let (mine, _) = lines_for_node(lines, node);
    let of = |name: &str| {
        mine.iter()
            .filter(|l| l.name.as_deref() == Some(name))
            .flat_map(|l| {
                let files = l.file.as_deref().map(expand).and_then(Result::ok);
                let files = files.unwrap_or_default();
                let shared = files.len() > 1;
                let count = l.count.clone();
                files
                    .into_iter()
                    .map(move |f| (f, l.gtype.clone(), shared, count.clone()))
            })
            .collect::<Vec<_>>()
    };
    let (mut gpus, shards) = (of("gpu"), of("shard"));
    gpus.sort_by_key(|(f, _, _, _)| natural_key(f));
    let mut problems = Vec::new();
    let mut want_lines = Vec::new();
    let mut want_gres = (Vec::new(), Vec::new());
    for (i, (file, gtype, shared, _)) in gpus.iter().enumerate() {
        let want = smartmig_daemon::holds::gres_type(i as u32);
        if *shared || gtype.as_deref() != Some(want.as_str()) {
            problems.push(format!(
                "GPU {i} ({file}) needs its own gpu line with Type={want}"
            ));
        }
        let shard = shards.iter().find(|(f, _, _, _)| f == file);
        if shard.is_none_or(|(_, t, _, _)| t.as_deref() != Some(want.as_str())) {
            problems.push(format!("its shard line (File={file}) needs Type={want}"));
        }
        let count = shard
            .and_then(|(_, _, _, c)| c.clone())
            .unwrap_or_else(|| "7".into());
        want_lines.push(format!("NodeName={node} Name=gpu Type={want} File={file}"));
        want_lines.push(format!(
            "NodeName={node} Name=shard Type={want} Count={count} File={file}"
        ));
        want_gres.0.push(format!("gpu:{want}:1"));
        want_gres.1.push(format!("shard:{want}:{count}"));
    }
    if gpus.is_empty() {
        problems.push(format!("no gpu line for {node}"));
    }
    if problems.is_empty() {
        return Check::ok(
            "slurm.holds",
            format!(
                "holds = \"{}\": {path} gives each GPU its own GRES type (mig0..mig{}), so smartmigd \
                 holds the shards MIG cannot build",
                configured.name(),
                gpus.len() - 1
            ),
        );
    }
    let detail = format!(
        "{path}: {}; smartmigd runs without holds on this node (its start log and `smartmig status` \
         say so), and Slurm may place jobs on shards MIG cannot build: batch jobs are requeued, \
         interactive steps fail",
        problems.join("; ")
    );
    let fix = if want_lines.is_empty() {
        format!(
            "give each GPU its own type, mig<i>, on its gpu and shard lines ({})",
            smartmig_daemon::holds::MIGRATION_DOC
        )
    } else {
        want_gres.0.extend(want_gres.1);
        format!(
            "replace {node}'s gpu and shard lines in {path} with `{}`, set `Gres={}` on its NodeName \
             line in slurm.conf, restart slurmctld, slurmd and smartmigd ({}){}",
            want_lines.join("` `"),
            want_gres.0.join(","),
            smartmig_daemon::holds::MIGRATION_DOC,
            if configured == HoldRule::Auto {
                ", or set holds = \"off\" to silence this"
            } else {
                ", or set holds = \"off\""
            }
        )
    };
    if configured == HoldRule::Auto {
        Check::warn("slurm.holds", detail, fix)
    } else {
        Check::fail(
            "slurm.holds",
            format!("holds = \"{}\" is set, but {detail}", configured.name()),
            fix,
        )
    }
}

/// gres.conf `AutoDetect` of this node. `nvml` (every series) and `full`
/// (26.05+, NVML first) report the MIG instances that exist when slurmd
/// starts: wrong for GPUs whose instances smartmigd changes. `nvidia`
/// (24.11+) reads no library and, by Slurm's documentation, detects no
/// MIG devices, so it would list the whole GPUs as smartmig wants; not
/// tried on a GPU here, hence a warning.
fn autodetect_check(path: &str, mine: &[&GresLine]) -> Check {
    let auto = mine.iter().find_map(|l| {
        let a = l.autodetect.as_deref()?.to_ascii_lowercase();
        (a != "off").then_some((l.line, a))
    });
    match auto {
        None => Check::ok("slurm.gres.autodetect", "no AutoDetect (or AutoDetect=off)"),
        Some((line, a)) if a == "nvidia" => Check::warn(
            "slurm.gres.autodetect",
            format!(
                "{path} line {line}: AutoDetect=nvidia (Slurm 24.11+) detects whole GPUs and, by Slurm's \
                 documentation, no MIG instances: it should list the GPUs as smartmig needs, but it \
                 was not tried on a GPU with MIG here"
            ),
            "to be sure, set AutoDetect=off and list the GPUs with File= (docs/slurm-integration.md, gres.conf)",
        ),
        Some((line, a)) => Check::fail(
            "slurm.gres.autodetect",
            format!(
                "{path} line {line}: AutoDetect={a}: {}in MIG mode Slurm would report the MIG \
                 instances that exist when slurmd starts",
                if a == "full" {
                    "Slurm 26.05+ tries NVML first, and "
                } else {
                    ""
                }
            ),
            "remove AutoDetect (or set AutoDetect=off) for these GPUs and list them with File=",
        ),
    }
}

/// Slurm's GPU i is the i-th device file in sorted order; it must be the
/// device of the backend's GPU i.
fn gpu_files_check(
    path: &str,
    files: &[String],
    gpus: &[NodeGpu],
    minor_of: &dyn Fn(&str) -> Option<u32>,
) -> Check {
    let mut problems = Vec::new();
    if files.len() != gpus.len() {
        problems.push(format!(
            "{} gpu device(s) ({}), but the node has {} GPU(s)",
            files.len(),
            files.join(" "),
            gpus.len()
        ));
    }
    for (i, file) in files.iter().enumerate() {
        let Some(gpu) = gpus.iter().find(|g| g.index as usize == i) else {
            continue;
        };
        match (minor_of(file), gpu.minor) {
            (Some(f), Some(m)) if f != m => problems.push(format!(
                "Slurm's GPU {i} is {file} (minor {f}), but GPU {i} is /dev/nvidia{m}"
            )),
            (None, _) => problems.push(format!("{file}: minor number unknown")),
            _ => {}
        }
    }
    if problems.is_empty() {
        Check::ok(
            "slurm.gres.gpu",
            format!(
                "{}: gpu devices {} match the GPUs' minor numbers",
                path,
                files.join(" ")
            ),
        )
    } else {
        Check::fail(
            "slurm.gres.gpu",
            format!("{path}: {}", problems.join("; ")),
            "list each GPU's /dev/nvidia<minor> so that Slurm's GPU i is NVML's GPU i (docs/slurm-integration.md, gres.conf)",
        )
    }
}

/// One shard line per GPU: `File=` its device, `Count=` its compute slices.
fn shard_checks(path: &str, mine: &[&GresLine], files: &[String], gpus: &[NodeGpu]) -> Vec<Check> {
    let shards: Vec<&&GresLine> = mine
        .iter()
        .filter(|l| l.name.as_deref() == Some("shard"))
        .collect();
    let mut out = Vec::new();
    let mut per_gpu: BTreeMap<usize, Vec<(usize, Option<u64>)>> = BTreeMap::new();
    for l in &shards {
        let count = l
            .count
            .as_deref()
            .and_then(|c| c.trim().parse::<u64>().ok());
        let targets = l.file.as_deref().map(expand);
        match targets {
            Some(Ok(targets)) if targets.len() == 1 => {
                match files.iter().position(|f| *f == targets[0]) {
                    Some(i) => per_gpu.entry(i).or_default().push((l.line, count)),
                    None => out.push(Check::fail(
                        "slurm.gres.shard",
                        format!("{path} line {}: shard File={} is not one of the gpu devices", l.line, targets[0]),
                        "give each shard line the File= of one gpu device",
                    )),
                }
            }
            _ => out.push(Check::fail(
                "slurm.gres.shard",
                format!(
                    "{path} line {}: a shard line must name one GPU's device (File=/dev/nvidiaN), found {}",
                    l.line,
                    l.file.as_deref().unwrap_or("no File=")
                ),
                "one `Name=shard Count=K File=/dev/nvidiaN` line per GPU, so a job's shards come from one GPU",
            )),
        }
    }
    for g in gpus {
        let i = g.index as usize;
        let name = format!("slurm.gres.shard.gpu{i}");
        let want = u64::from(g.model.spec().compute_slices);
        let file = files.get(i).map_or("(no gpu device)", String::as_str);
        let fix = format!(
            "`Name=shard Count={want} File={file}` (K = the GPU's {want} compute slices on {})",
            g.model
        );
        match per_gpu.get(&i).map(Vec::as_slice) {
            None | Some([]) => out.push(Check::fail(name, format!("{path}: no shard line for GPU {i} ({file})"), fix)),
            Some([(line, Some(k))]) if *k == want => out.push(Check::ok(
                name,
                format!("line {line}: Count={k} File={file} = {} compute slices", g.model),
            )),
            Some([(line, count)]) => out.push(Check::fail(
                name,
                format!(
                    "{path} line {line}: shard Count={} for {file}, but the GPU ({}) has {want} compute slices (Slurm would sell shards MIG cannot build, or hide slices)",
                    count.map_or("?".into(), |c| c.to_string()),
                    g.model
                ),
                fix,
            )),
            Some(several) => out.push(Check::fail(
                name,
                format!(
                    "{path}: {} shard lines for {file} (lines {})",
                    several.len(),
                    several.iter().map(|(l, _)| l.to_string()).collect::<Vec<_>>().join(", ")
                ),
                fix,
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;
    use crate::mig::GpuModel;

    const SLURM: &str = "# test\nSelectType=select/cons_tres\nGresTypes=gpu,shard\n\
        NodeName=DEFAULT CPUs=4\nNodeName=n[1-2] CPUs=64 Gres=gpu:2,shard:14 State=UNKNOWN\n\
        PartitionName=debug Nodes=n[1-2] Default=YES\nPlugStackConfig=/etc/slurm/ps.conf\n";
    const GRES: &str = "AutoDetect=off\nNodeName=n[1-2] Name=gpu File=/dev/nvidia[0-1]\n\
        NodeName=n[1-2] Name=shard Count=7 File=/dev/nvidia0\n\
        NodeName=n[1-2] Name=shard Count=7 File=/dev/nvidia1\n";

    fn a100s() -> Vec<NodeGpu> {
        (0..2)
            .map(|i| NodeGpu {
                index: i,
                model: GpuModel::A100_40gb,
                minor: Some(i),
            })
            .collect()
    }

    fn by_name(minor_of: &str) -> Option<u32> {
        device_minor(minor_of, None)
    }

    fn statuses(checks: &[Check]) -> Vec<(String, Status)> {
        checks.iter().map(|c| (c.check.clone(), c.status)).collect()
    }

    #[test]
    fn parses_slurm_conf() {
        let c = parse_slurm_conf(SLURM);
        assert_eq!(c.gres_types.as_deref(), Some("gpu,shard"));
        assert_eq!(c.plugstack.as_deref(), Some("/etc/slurm/ps.conf"));
        assert_eq!(c.nodes.len(), 1);
        assert_eq!(c.nodes[0].gres.as_deref(), Some("gpu:2,shard:14"));
        let checks = conf_checks(&c, "n2", Some(&a100s()));
        assert!(checks.iter().all(|c| c.status == Status::Ok), "{checks:?}");
        let checks = conf_checks(&c, "n3", Some(&a100s()));
        assert!(checks
            .iter()
            .any(|c| c.check == "slurm.node" && c.status == Status::Fail));
        let c = parse_slurm_conf("GresTypes=gpu\nNodeName=n1 Gres=gpu:2,shard:12\n");
        let checks = conf_checks(&c, "n1", Some(&a100s()));
        let s = statuses(&checks);
        assert!(
            s.contains(&("slurm.grestypes".into(), Status::Fail)),
            "{s:?}"
        );
        assert!(s.contains(&("slurm.select".into(), Status::Fail)), "{s:?}");
        let node = checks.iter().find(|c| c.check == "slurm.node").unwrap();
        assert_eq!(node.status, Status::Fail);
        assert!(
            node.fix.as_deref().unwrap().contains("shard:14"),
            "{node:?}"
        );
    }

    #[test]
    fn continuation_lines_and_typed_gres() {
        let c = parse_slurm_conf("NodeName=n1 \\\n  Gres=gpu:a100:2,shard:14\n");
        assert_eq!(c.nodes[0].line, 1);
        assert_eq!(
            gres_counts(c.nodes[0].gres.as_deref().unwrap()).get("gpu"),
            Some(&2)
        );
    }

    #[test]
    fn a_good_gres_conf_passes() {
        let lines = parse_gres_conf(GRES);
        let checks = gres_checks("gres.conf", &lines, "n1", Some(&a100s()), &by_name);
        assert!(checks.iter().all(|c| c.status == Status::Ok), "{checks:?}");
        assert!(checks.iter().any(|c| c.check == "slurm.gres.shard.gpu1"));
    }

    /// Issue 56: the default (`auto`) on an untyped gres.conf is a warning
    /// that says smartmigd runs without holds, with the exact lines.
    #[test]
    fn an_untyped_gres_conf_under_the_default_is_a_warning_with_the_migration() {
        let c = holds_check("g", &parse_gres_conf(GRES), "n1", HoldRule::Auto);
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert_eq!(c.check, "slurm.holds");
        assert!(c.detail.contains("runs without holds"), "{c:?}");
        let fix = c.fix.as_deref().unwrap();
        for want in [
            "NodeName=n1 Name=gpu Type=mig0 File=/dev/nvidia0",
            "NodeName=n1 Name=shard Type=mig1 Count=7 File=/dev/nvidia1",
            "Gres=gpu:mig0:1,gpu:mig1:1,shard:mig0:7,shard:mig1:7",
            "restart slurmctld, slurmd and smartmigd",
            "Migrating an untyped gres.conf",
        ] {
            assert!(fix.contains(want), "{want}: {fix}");
        }
        let off = holds_check("g", &parse_gres_conf(GRES), "n1", HoldRule::Off);
        assert_eq!(off.status, Status::Ok, "{off:?}");
        let typed = GRES
            .replace("Name=gpu File=/dev/nvidia[0-1]", "Name=gpu Type=mig0 File=/dev/nvidia0\nNodeName=n[1-2] Name=gpu Type=mig1 File=/dev/nvidia1")
            .replace("Name=shard Count=7 File=/dev/nvidia0", "Name=shard Type=mig0 Count=7 File=/dev/nvidia0")
            .replace("Name=shard Count=7 File=/dev/nvidia1", "Name=shard Type=mig1 Count=7 File=/dev/nvidia1");
        let ok = holds_check("g", &parse_gres_conf(&typed), "n1", HoldRule::Auto);
        assert_eq!(ok.status, Status::Ok, "{ok:?}");
        assert!(ok.detail.starts_with("holds = \"auto\""), "{ok:?}");
    }

    #[test]
    fn holds_need_one_gres_type_per_gpu() {
        let untyped = holds_check("g", &parse_gres_conf(GRES), "n1", HoldRule::AnyMix);
        assert_eq!(untyped.status, Status::Fail, "{untyped:?}");
        assert!(untyped.detail.contains("Type=mig0"), "{untyped:?}");
        let typed = "NodeName=n1 Name=gpu Type=mig1 File=/dev/nvidia1\n\
                     NodeName=n1 Name=gpu Type=mig0 File=/dev/nvidia0\n\
                     NodeName=n1 Name=shard Type=mig0 Count=7 File=/dev/nvidia0\n\
                     NodeName=n1 Name=shard Type=mig1 Count=7 File=/dev/nvidia1\n";
        let ok = holds_check("g", &parse_gres_conf(typed), "n1", HoldRule::AnyMix);
        assert_eq!(ok.status, Status::Ok, "{ok:?}");
        let swapped = typed.replace("Type=mig1 Count=7", "Type=mig0 Count=7");
        let bad = holds_check("g", &parse_gres_conf(&swapped), "n1", HoldRule::AnyMix);
        assert_eq!(bad.status, Status::Fail, "{bad:?}");
        assert!(
            bad.detail.contains("File=/dev/nvidia1) needs Type=mig1"),
            "{bad:?}"
        );
    }

    #[test]
    fn wrong_shard_count_and_minor_fail() {
        let text = GRES.replace("Count=7 File=/dev/nvidia1", "Count=4 File=/dev/nvidia1");
        let checks = gres_checks(
            "gres.conf",
            &parse_gres_conf(&text),
            "n1",
            Some(&a100s()),
            &by_name,
        );
        let bad = checks
            .iter()
            .find(|c| c.check == "slurm.gres.shard.gpu1")
            .unwrap();
        assert_eq!(bad.status, Status::Fail);
        assert!(
            bad.detail.contains("Count=4") && bad.detail.contains("7 compute slices"),
            "{bad:?}"
        );
        let mut swapped = a100s();
        swapped[0].minor = Some(1);
        swapped[1].minor = Some(0);
        let checks = gres_checks(
            "gres.conf",
            &parse_gres_conf(GRES),
            "n1",
            Some(&swapped),
            &by_name,
        );
        let gpu = checks.iter().find(|c| c.check == "slurm.gres.gpu").unwrap();
        assert_eq!(gpu.status, Status::Fail, "{gpu:?}");
        assert!(
            gpu.detail
                .contains("Slurm's GPU 0 is /dev/nvidia0 (minor 0), but GPU 0 is /dev/nvidia1"),
            "{gpu:?}"
        );
    }

    #[test]
    fn requeue_hold_names_the_setting_of_the_series() {
        let conf = |text: &str| parse_slurm_conf(text);
        let default = conf("SelectType=select/cons_tres\n");
        let c = requeue_check(&default, Some((22, 5)));
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(
            c.detail.starts_with("an out-of-memory restart waits 121 s"),
            "{c:?}"
        );
        let c = requeue_check(&default, Some((26, 5)));
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(
            c.fix.as_deref().unwrap_or("").contains("requeue_delay=5"),
            "{c:?}"
        );
        let tuned =
            conf("SchedulerParameters=batch_sched_delay=0,requeue_delay=5,sched_interval=2\n");
        let c = requeue_check(&tuned, Some((26, 5)));
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(
            c.detail
                .contains("waits 5 s (requeue_delay), then up to 2 s"),
            "{c:?}"
        );
        // 24.11 has no requeue_delay: the credential's lifetime counts.
        let short = conf("AuthInfo=socket=/x,cred_expire=5\nSchedulerParameters=requeue_delay=5\n");
        let c = requeue_check(&short, Some((24, 11)));
        assert!(
            c.detail.contains("waits 6 s (cred_expire 5 s + 1)"),
            "{c:?}"
        );
    }

    #[test]
    fn autodetect_and_missing_shard_lines_fail() {
        let text = "AutoDetect=nvml\nName=gpu File=/dev/nvidia[0-1]\nName=shard Count=7 File=/dev/nvidia0\n";
        let checks = gres_checks("g", &parse_gres_conf(text), "n1", Some(&a100s()), &by_name);
        let s = statuses(&checks);
        assert!(
            s.contains(&("slurm.gres.autodetect".into(), Status::Fail)),
            "{s:?}"
        );
        assert!(
            s.contains(&("slurm.gres.shard.gpu0".into(), Status::Ok)),
            "{s:?}"
        );
        assert!(
            s.contains(&("slurm.gres.shard.gpu1".into(), Status::Fail)),
            "{s:?}"
        );
        for (auto, want) in [
            ("full", Status::Fail),
            ("NVML", Status::Fail),
            ("nvidia", Status::Warn),
            ("off", Status::Ok),
        ] {
            let text = format!("AutoDetect={auto}\nName=gpu File=/dev/nvidia[0-1]\n");
            let checks = gres_checks("g", &parse_gres_conf(&text), "n1", Some(&a100s()), &by_name);
            assert!(
                statuses(&checks).contains(&("slurm.gres.autodetect".into(), want)),
                "{auto}: {checks:?}"
            );
        }
        let text = "Name=gpu File=/dev/nvidia[0-1]\nName=shard Count=14\n";
        let checks = gres_checks("g", &parse_gres_conf(text), "n1", Some(&a100s()), &by_name);
        assert!(checks
            .iter()
            .any(|c| c.check == "slurm.gres.shard" && c.status == Status::Fail));
    }

    #[test]
    fn unparseable_node_lists_warn_and_other_nodes_are_ignored() {
        let text = "NodeName=x[1-2]y[1-2] Name=gpu File=/dev/nvidia0\nNodeName=other Name=gpu File=/dev/nvidia5\n";
        let lines = parse_gres_conf(text);
        let (mine, bad) = lines_for_node(&lines, "n1");
        assert!(mine.is_empty());
        assert_eq!(bad.len(), 1);
        assert!(bad[0].starts_with("line 1:"), "{bad:?}");
    }

    #[test]
    fn devices_sort_numerically_and_minors_come_from_names() {
        let mut f = vec!["/dev/nvidia10".to_string(), "/dev/nvidia2".into()];
        f.sort_by_key(|x| natural_key(x));
        assert_eq!(f, ["/dev/nvidia2", "/dev/nvidia10"]);
        assert_eq!(device_minor("/x/dev/nvidia3", None), Some(3));
        assert_eq!(device_minor("/dev/gpu", None), None);
        assert_eq!(device_minor("/dev/gpu", Some(7)), Some(7));
    }
}
