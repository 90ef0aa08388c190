//! The packages, installed: what an admin gets from `target/dist/`.
//!
//! `scripts/test` builds the packages with `scripts/package` and then runs
//! this test with `--ignored` (a plain `cargo test` has no packages to
//! install, so there it shows as ignored, never as passed). The test
//!
//! 1. checks that each `.rpm` lists the same files as its `.deb` (the
//!    plugin's directory is Slurm's on each family);
//! 2. installs both `.deb`s with `dpkg -i`, checks the installed layout
//!    (binaries, unit, conffile, plugin, the commented-out plugstack
//!    snippet) and `systemd-analyze verify`s the unit; runs the plugin
//!    `.rpm`'s `%preun` and `%post` as rpm would on a copy of that snippet,
//!    enabled (what steps 5 and 6 check for the `.deb`, with rpm's
//!    `.rpmsave`);
//! 3. points the real-Slurm test cluster at the installed plugin (the
//!    cluster's plugstack.conf includes the installed
//!    `/etc/slurm/plugstack.conf.d/smartmig.conf`, whose line the test
//!    uncomments as the admin does) and runs the installed
//!    `smartmigd` with the installed config, changed only where a test node
//!    differs (its socket and state directory under the cluster's
//!    directory, and the NVML emulator instead of a GPU's driver);
//! 4. runs `smartmig doctor` from the package and one `--gres=shard:1` job;
//! 5. installs the plugin package over itself (dpkg's upgrade path), which
//!    leaves the enabled line alone, then removes (not purges) both
//!    packages with `dpkg -r`: the package stops smartmigd, comments out
//!    the enabled plugstack line with a marker, and a job without GPUs
//!    submitted with `sbatch` still runs (a `required` line naming the
//!    deleted plugin would fail every sbatch and srun on the node with
//!    "Failed to initialize plugin stack");
//! 6. installs both packages again: the admin's line is back, unchanged,
//!    and a shard job runs again on a restarted smartmigd;
//! 7. purges both packages while that smartmigd still runs (as an admin
//!    who follows the Remove steps does) and checks that the package stopped
//!    it and that nothing is left, `/run/smartmig-journal` included.
//!
//! With `SMARTMIG_SLURM_SERIES=24.11` (or `26.05`) all of it happens in that
//! series' root file system (`scripts/slurm-series`): the same daemon
//! package, built on Debian 12, on trixie's or sid's glibc, and the plugin
//! package built for that series. `systemd-analyze verify` runs on the host
//! only (the unit file is the same for every series).
//!
//! Needs root; fails, never skips, when something is missing.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use smartmig_nvml_emu::Emulator;
use smartmig_suite::{
    artifact, describe, fields, in_slurm, repo_root, require_root, slurm_series, SlurmCluster,
};

const JOB_TIMEOUT: Duration = Duration::from_secs(90);

/// The plugin's plugstack file, a conffile of `smartmig-spank`.
const PLUGSTACK_FILE: &str = "/etc/slurm/plugstack.conf.d/smartmig.conf";

/// What the plugin package's removal puts before the line it disables
/// (then the time in parentheses, `": "` and the admin's line).
const DISABLED_MARKER: &str = "# disabled by smartmig-spank removal (";

/// Runs `program` where the series' Slurm is installed (the host, or the
/// series' root file system).
fn run(program: &str, args: &[&str]) -> Output {
    in_slurm(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

/// Runs `program` on the host (package inspection).
fn run_here(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

/// `path` of the node the packages are installed on, seen from here.
fn on_node(path: &str) -> PathBuf {
    let root = match slurm_series() {
        None => PathBuf::from("/"),
        Some(series) => repo_root().join("target/slurm").join(series).join("root"),
    };
    root.join(path.trim_start_matches('/'))
}

/// The Slurm series of the test cluster's Slurm (`22.05`).
fn running_series() -> String {
    let (major, minor) = smartmig_suite::slurm_release();
    format!("{major}.{minor:02}")
}

fn ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        describe(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ok_here(program: &str, args: &[&str]) -> String {
    let out = run_here(program, args);
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        describe(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one file in `target/dist` whose name starts with `prefix`, holds
/// `middle` and ends with `suffix`.
fn package(prefix: &str, middle: &str, suffix: &str) -> PathBuf {
    let dist = repo_root().join("target/dist");
    let found: Vec<PathBuf> = std::fs::read_dir(&dist)
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/package first", dist.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.contains(middle) && n.ends_with(suffix))
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {prefix}*{middle}*{suffix} in {}: {found:?}",
        dist.display()
    );
    found.into_iter().next().expect("one package")
}

/// The non-directory paths a `.deb` installs.
fn deb_files(deb: &Path) -> BTreeSet<String> {
    ok_here("dpkg-deb", &["-c", &deb.display().to_string()])
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches('.').to_string())
        .collect()
}

/// The non-directory paths an `.rpm` installs.
fn rpm_files(rpm: &Path) -> BTreeSet<String> {
    ok_here(
        "rpm",
        &[
            "-qp",
            "--qf",
            "[%{FILEMODES:perms} %{FILENAMES}\n]",
            &rpm.display().to_string(),
        ],
    )
    .lines()
    .filter(|l| !l.starts_with('d'))
    .filter_map(|l| l.split_whitespace().nth(1))
    .map(String::from)
    .collect()
}

/// The plugin's path with each family's Slurm plugin directory replaced by
/// `<slurm plugin dir>`, so the two lists can be compared; Debian's own
/// package records (`/usr/share/doc/<package>/copyright` and
/// `changelog.Debian.gz`, which Debian policy requires and RPM keeps in
/// its header) are left out.
fn same_family(paths: &BTreeSet<String>) -> BTreeSet<String> {
    paths
        .iter()
        .filter(|p| !(p.ends_with("/copyright") || p.ends_with("/changelog.Debian.gz")))
        .map(|p| {
            for dir in ["/usr/lib/x86_64-linux-gnu/slurm-wlm/", "/usr/lib64/slurm/"] {
                if let Some(rest) = p.strip_prefix(dir) {
                    return format!("<slurm plugin dir>/{rest}");
                }
            }
            p.clone()
        })
        .collect()
}

/// Where the package puts the docs: not /usr/share/doc, which Debian's
/// minimal images and dpkg `path-exclude` rules drop (issue 56).
const DOC_DIR: &str = "/usr/share/smartmig/doc/";

/// Every doc the installed files point to is installed: the
/// `/usr/share/smartmig/doc/NAME` the plugstack snippet (`snippet`) and the
/// unit name, and the `docs/NAME.md` of the config and the Slurm snippets,
/// which say that they are in [`DOC_DIR`].
fn assert_named_docs_installed(snippet: &str) {
    let mut named = BTreeSet::new();
    let mut texts = vec![("plugstack snippet".to_string(), snippet.to_string())];
    for file in [
        "/usr/lib/systemd/system/smartmigd.service",
        "/etc/smartmig/smartmig.toml",
        "/usr/share/smartmig/slurm/slurm.conf.snippet",
        "/usr/share/smartmig/slurm/gres.conf.snippet",
    ] {
        let text = std::fs::read_to_string(on_node(file))
            .unwrap_or_else(|e| panic!("read the installed {file}: {e}"));
        texts.push((file.to_string(), text));
    }
    let name_end = |rest: &str| {
        rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'))
            .unwrap_or(rest.len())
    };
    for (file, text) in &texts {
        let mut found = 0;
        for (i, _) in text.match_indices(DOC_DIR) {
            let rest = &text[i + DOC_DIR.len()..];
            named.insert(rest[..name_end(rest)].trim_end_matches('.').to_string());
            found += 1;
        }
        if file.ends_with(".toml") || file.ends_with(".snippet") {
            for (i, _) in text.match_indices("docs/") {
                let rest = &text[i + "docs/".len()..];
                let name = rest[..name_end(rest)].trim_end_matches('.');
                if name.ends_with(".md") {
                    named.insert(name.to_string());
                }
            }
        }
        assert!(
            found > 0,
            "{file} does not say where the docs are ({DOC_DIR}):\n{text}"
        );
    }
    named.remove("NAME.md");
    assert!(
        named.contains("slurm-integration.md") && named.contains("daemon.md"),
        "{named:?}"
    );
    for name in &named {
        let path = format!("{DOC_DIR}{name}");
        assert!(
            on_node(&path).is_file(),
            "{path} is named but not installed"
        );
    }
}

/// Purges the packages when dropped, so a failed test leaves the machine
/// as it found it.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let out = run("dpkg", &["--purge", "smartmig-spank", "smartmig"]);
        if !out.status.success() {
            eprintln!("dpkg --purge failed: {}", describe(&out));
        }
    }
}

/// The installed config with a test node's differences: sockets and state
/// under `dir`, and the NVML emulator for the driver.
fn test_node_config(installed: &str, dir: &Path, emu: &Emulator) -> String {
    let mut out = String::new();
    let mut replaced = BTreeSet::new();
    for line in installed.lines() {
        let key = line.split('=').next().unwrap_or("").trim();
        let value = match key {
            "socket" => Some(dir.join("run/smartmig.sock")),
            "state_dir" => Some(dir.join("smartmigd-state")),
            "library" => Some(artifact("libsmartmig_nvml_emu.so")),
            "capabilities_dir" => Some(emu.capabilities_dir()),
            "caps_dev_dir" => Some(emu.caps_dev_dir()),
            _ => None,
        };
        match value {
            Some(v) if !line.trim_start().starts_with('#') => {
                replaced.insert(key.to_string());
                out.push_str(&format!("{key} = \"{}\"\n", v.display()));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    for key in [
        "socket",
        "state_dir",
        "library",
        "capabilities_dir",
        "caps_dev_dir",
    ] {
        assert!(
            replaced.contains(key),
            "the installed config sets no `{key}`: {installed}"
        );
    }
    out
}

/// Whether `line` loads the plugin (`required` or `optional`, not
/// commented out).
fn loads_plugin(line: &str) -> bool {
    let mut words = line.split_whitespace();
    matches!(words.next(), Some("required" | "optional"))
        && words
            .next()
            .is_some_and(|p| p.rsplit('/').next() == Some("libsmartmig_spank.so"))
}

/// The shipped plugstack file as an admin enables it: the commented
/// `#required libsmartmig_spank.so ...` line uncommented (the quickstart's
/// `sed 's/^#required /required /'`), with the test node's `socket`.
fn enable_plugstack(shipped: &str, socket: &Path) -> String {
    let mut enabled = 0;
    let mut out = String::new();
    for line in shipped.lines() {
        match line.strip_prefix("#required ") {
            Some(rest) if rest.starts_with("libsmartmig_spank.so ") => {
                enabled += 1;
                let words: Vec<String> = line[1..]
                    .split_whitespace()
                    .map(|w| {
                        if w.starts_with("socket=") {
                            format!("socket={}", socket.display())
                        } else {
                            w.to_string()
                        }
                    })
                    .collect();
                out.push_str(&words.join(" "));
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    assert_eq!(
        enabled, 1,
        "expected one `#required libsmartmig_spank.so ...` line: {shipped}"
    );
    out
}

/// The lines of a plugstack file that name the plugin (for messages).
fn plugin_lines(text: &str) -> String {
    text.lines()
        .filter(|l| l.contains("libsmartmig_spank.so"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks a plugstack file after the plugin package's removal: no line
/// loads the plugin, and each line the admin had enabled is there once,
/// commented out behind [`DISABLED_MARKER`].
fn assert_disabled(text: &str, enabled: &str, what: &str) {
    assert!(
        !text.lines().any(loads_plugin),
        "{what}: a line still loads the deleted plugin:\n{}",
        plugin_lines(text)
    );
    let disabled: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix(DISABLED_MARKER))
        .filter_map(|l| l.split_once("): ").map(|(_, line)| line))
        .collect();
    let wanted: Vec<&str> = enabled.lines().filter(|l| loads_plugin(l)).collect();
    assert_eq!(
        disabled,
        wanted,
        "{what}: the enabled line is not commented out behind `{DISABLED_MARKER}...): `:\n{}",
        plugin_lines(text)
    );
}

/// One scriptlet of an `.rpm` (`PREUN`, `POSTIN`) with the plugstack file's
/// path replaced by `conf`.
fn rpm_scriptlet(rpm: &Path, tag: &str, conf: &Path) -> String {
    let text = ok_here(
        "rpm",
        &[
            "-qp",
            "--qf",
            &format!("%{{{tag}}}"),
            &rpm.display().to_string(),
        ],
    );
    assert!(
        text.contains(PLUGSTACK_FILE) && text.contains("exit 0"),
        "{}: %{{{tag}}} is not the scriptlet of packaging/rpm/ (a wrong path in \
         slurm-plugin/Cargo.toml becomes the scriptlet's text): {text:?}",
        rpm.display()
    );
    text.replace(PLUGSTACK_FILE, &conf.display().to_string())
}

/// Runs a scriptlet as rpm does (`sh`, `$1` = the number of instances left
/// or installed).
fn run_scriptlet(script: &str, arg: &str) {
    ok_here("sh", &["-c", script, "sh", arg]);
}

/// The plugin `.rpm`'s `%preun` and `%post` on a copy of the plugstack
/// file (installing the `.rpm` itself needs a RHEL-like root): an upgrade
/// leaves the enabled line alone; an erase disables it (rpm then keeps the
/// changed file as `.rpmsave`, which plugstack.conf's `*.conf` include does
/// not read) and a new install restores the admin's file from it; an erase
/// that stopped after `%preun` is undone by the next `%post`; a first
/// install leaves the shipped line commented out.
fn rpm_scriptlets_round_trip(rpm: &Path, shipped: &str, enabled: &str) {
    let dir = std::env::temp_dir().join(format!("smartmig-rpm-scriptlets-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scriptlet directory");
    let conf = dir.join("smartmig.conf");
    let rpmsave = dir.join("smartmig.conf.rpmsave");
    let (preun, post) = (
        rpm_scriptlet(rpm, "PREUN", &conf),
        rpm_scriptlet(rpm, "POSTIN", &conf),
    );
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let write = |p: &Path, text: &str| std::fs::write(p, text).expect("write scriptlet file");

    write(&conf, enabled);
    run_scriptlet(&preun, "1");
    assert_eq!(
        read(&conf),
        enabled,
        "rpm %preun on upgrade changed the line"
    );

    run_scriptlet(&preun, "0");
    assert_disabled(&read(&conf), enabled, "after rpm %preun (erase)");
    std::fs::rename(&conf, &rpmsave).expect("rename to .rpmsave");
    write(&conf, shipped);
    run_scriptlet(&post, "1");
    assert_eq!(
        read(&conf),
        enabled,
        "rpm %post after rpm -e did not bring back the admin's file"
    );
    assert!(!rpmsave.exists(), "rpm %post left the restored .rpmsave");

    run_scriptlet(&preun, "0");
    run_scriptlet(&post, "1");
    assert_eq!(
        read(&conf),
        enabled,
        "rpm %post after an erase that stopped after %preun"
    );

    write(&conf, shipped);
    run_scriptlet(&post, "1");
    assert_eq!(
        read(&conf),
        shipped,
        "rpm %post changed a first install's file"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs the packages: scripts/test builds them (scripts/package) and runs this with --ignored"]
fn installed_packages_run_a_shard_job() {
    require_root("dpkg -i and the test cluster need root");
    // `cargo test` puts target/release on LD_LIBRARY_PATH, and the build's
    // libsmartmig_spank.so is there: Slurm, given the plugin's bare name,
    // falls back to dlopen's search when the plugin is not in its
    // PluginDir, so sbatch and the daemons this test starts would load
    // that copy once the package's is gone, and hide a plugstack line
    // that names a deleted plugin (step 5).
    std::env::remove_var("LD_LIBRARY_PATH");
    // The node as the quickstart sets it up: one GRES type per GPU, so the
    // installed config's `holds = "auto"` (no key) holds by `adaptive`
    // (issue 56, item 6: the installed path covers the default holds).
    std::env::set_var("SMARTMIG_SLURM_TYPED_GPUS", "1");
    // Each series has its own plugin packages: `+slurm24.11.5` in the
    // .deb's version, `.slurm24.11.5` in the .rpm's release.
    let series = running_series();
    let (deb, deb_plugin) = (
        package("smartmig_", "", ".deb"),
        package("smartmig-spank_", &format!("+slurm{series}."), ".deb"),
    );
    let (rpm, rpm_plugin) = (
        package("smartmig-0", "", ".rpm"),
        package("smartmig-spank-", &format!(".slurm{series}."), ".rpm"),
    );

    // 1. The .rpm lists the same files as the .deb.
    for (d, r) in [(&deb, &rpm), (&deb_plugin, &rpm_plugin)] {
        let (df, rf) = (same_family(&deb_files(d)), same_family(&rpm_files(r)));
        assert!(!df.is_empty(), "{} installs nothing", d.display());
        assert_eq!(
            df,
            rf,
            "{} and {} install different files",
            d.display(),
            r.display()
        );
    }

    // 2. Installed layout.
    ok(
        "dpkg",
        &[
            "-i",
            &deb.display().to_string(),
            &deb_plugin.display().to_string(),
        ],
    );
    let _installed = Installed;
    for path in [
        "/usr/sbin/smartmigd",
        "/usr/bin/smartmig",
        "/usr/lib/systemd/system/smartmigd.service",
        "/etc/smartmig/smartmig.toml",
        "/etc/slurm/plugstack.conf.d/smartmig.conf",
    ] {
        assert!(on_node(path).exists(), "{path} not installed");
    }
    let conffiles = ok("dpkg-query", &["-W", "-f=${Conffiles}", "smartmig"]);
    assert!(
        conffiles.contains("/etc/smartmig/smartmig.toml"),
        "the config is not a conffile: {conffiles:?}"
    );
    let plugin_files = ok("dpkg-query", &["-L", "smartmig-spank"]);
    let plugin = plugin_files
        .lines()
        .find(|l| l.ends_with("libsmartmig_spank.so"))
        .unwrap_or_else(|| panic!("no plugin in smartmig-spank: {plugin_files}"))
        .to_string();
    let snippet =
        std::fs::read_to_string(on_node(PLUGSTACK_FILE)).expect("read the plugstack snippet");
    assert!(
        !snippet
            .lines()
            .any(|l| l.trim_start().starts_with("required")
                || l.trim_start().starts_with("optional")),
        "the shipped plugstack line must be commented out: {snippet}"
    );
    assert_named_docs_installed(&snippet);
    rpm_scriptlets_round_trip(
        &rpm_plugin,
        &snippet,
        &enable_plugstack(&snippet, Path::new("/run/smartmig/smartmig-root.sock")),
    );
    if slurm_series().is_none() {
        let verify = run(
            "systemd-analyze",
            &["verify", "/usr/lib/systemd/system/smartmigd.service"],
        );
        assert!(
            verify.status.success(),
            "systemd-analyze verify: {}",
            describe(&verify)
        );
    }

    // 3. The test cluster on the installed plugin and plugstack file,
    // enabled as the admin does (with the test node's socket); the
    // installed daemon.
    let mut enabled = String::new();
    let cluster = SlurmCluster::up_with(|dir| {
        enabled = enable_plugstack(&snippet, &dir.join("run/smartmig-root.sock"));
        std::fs::write(on_node(PLUGSTACK_FILE), &enabled).expect("enable the plugstack line");
        std::fs::write(
            dir.join("plugstack.conf"),
            format!("include {PLUGSTACK_FILE}\n"),
        )
        .expect("write plugstack.conf");
    });
    let dir = cluster.dir().to_path_buf();
    std::fs::create_dir_all(dir.join("run")).expect("mkdir run");
    let (_, emu) = common::two_a100s(&dir);
    let installed = std::fs::read_to_string(on_node("/etc/smartmig/smartmig.toml"))
        .expect("read the installed config");
    let config = dir.join("smartmig.toml");
    std::fs::write(&config, test_node_config(&installed, &dir, &emu)).expect("write config");
    // The installed smartmigd, started by hand (no systemd), once it
    // answers.
    let start_daemon = || {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(dir.join("log/smartmigd.log"))
            .expect("smartmigd log");
        let daemon = in_slurm("/usr/sbin/smartmigd")
            .arg("--config")
            .arg(&config)
            .env("SLURM_CONF", dir.join("slurm.conf"))
            .env(smartmig_nvml_emu::DIR_ENV, emu.dir())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("start the installed smartmigd");
        let daemon = Killed(daemon);
        let answers = || {
            in_slurm("/usr/bin/smartmig")
                .args(["status", "--json", "--socket"])
                .arg(dir.join("run/smartmig.sock"))
                .output()
                .is_ok_and(|o| o.status.success())
        };
        assert!(
            smartmig_suite::holds_within(Duration::from_secs(20), answers),
            "the installed smartmigd does not answer: {}",
            cluster.log_tails()
        );
        daemon
    };
    let _daemon = start_daemon();
    // The packaged default holds: `auto` runs `adaptive` once Slurm shows
    // the typed gres.conf (it may answer before Slurm does).
    let holds_state = || {
        let out = in_slurm("/usr/bin/smartmig")
            .args(["status", "--json", "--socket"])
            .arg(dir.join("run/smartmig.sock"))
            .output()
            .expect("smartmig status");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        (
            v["holds"]["configured"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            v["holds"]["state"].as_str().unwrap_or_default().to_string(),
        )
    };
    assert!(
        smartmig_suite::holds_within(Duration::from_secs(30), || holds_state()
            == ("auto".to_string(), "adaptive".to_string())),
        "the installed default config does not hold adaptively on a typed node: {:?}\n{}",
        holds_state(),
        cluster.log_tails()
    );

    // 4. doctor from the package, then a job.
    let doctor = in_slurm("/usr/bin/smartmig")
        .args(["doctor", "--config"])
        .arg(&config)
        .arg("--slurm-conf")
        .arg(dir.join("slurm.conf"))
        .env(smartmig_nvml_emu::DIR_ENV, emu.dir())
        .output()
        .expect("run smartmig doctor");
    assert!(
        doctor.status.success(),
        "smartmig doctor on the installed layout: {}",
        describe(&doctor)
    );
    let shard_job = |name: &str| {
        let out = cluster.shared_dir().join(name);
        let job = cluster.sbatch_as_job_user(
            &out,
            &["--gres=shard:1"],
            "echo CVD=$CUDA_VISIBLE_DEVICES PROFILE=$SMARTMIG_PROFILE",
        );
        let state = cluster.wait_job(job, JOB_TIMEOUT);
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        assert_eq!(state, "COMPLETED", "{text}\n{}", cluster.log_tails());
        let f = fields(&text);
        assert!(
            f.get("CVD").is_some_and(|c| c.starts_with("MIG-")),
            "{text}"
        );
        assert_eq!(
            f.get("PROFILE").map(String::as_str),
            Some("1g.5gb"),
            "{text}"
        );
    };
    shard_job("installed.out");
    assert!(
        on_node("/run/smartmig-journal").is_dir(),
        "the installed config's journal_dir is not in use"
    );

    // 5. An upgrade (here the same version again: dpkg runs the old
    // package's `prerm upgrade`) replaces the plugin in place and leaves the
    // line alone.
    ok("dpkg", &["-i", &deb_plugin.display().to_string()]);
    assert_eq!(
        std::fs::read_to_string(on_node(PLUGSTACK_FILE)).expect("read the plugstack file"),
        enabled,
        "an upgrade of smartmig-spank changed the plugstack file"
    );

    // Remove (not purge) both packages with smartmigd running: the
    // package stops it, the plugin is gone, its plugstack line is commented
    // out with the marker, and a job without GPUs is still submitted and
    // runs (sbatch and slurmstepd load the plugin stack).
    let removed = ok("dpkg", &["-r", "smartmig-spank", "smartmig"]);
    wait_exit(_daemon, "dpkg -r");
    assert!(
        !on_node(&plugin).exists(),
        "{plugin} left after dpkg -r: {removed}"
    );
    let after_remove =
        std::fs::read_to_string(on_node(PLUGSTACK_FILE)).expect("dpkg -r keeps the conffile");
    let out = cluster.shared_dir().join("no-gpu.out");
    let submitted = cluster.try_sbatch(&[
        "-o",
        out.to_str().expect("utf-8 path"),
        "--wrap",
        "echo PLAIN=ran",
    ]);
    assert!(
        submitted.status.success(),
        "sbatch of a job without GPUs failed after dpkg -r smartmig-spank:\n\
         {PLUGSTACK_FILE} has\n{}\n{}",
        plugin_lines(&after_remove),
        describe(&submitted)
    );
    let job: u32 = String::from_utf8_lossy(&submitted.stdout)
        .trim()
        .split(';')
        .next()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("sbatch printed no job id: {}", describe(&submitted)));
    let state = cluster.wait_job(job, JOB_TIMEOUT);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert_eq!(
        (
            state.as_str(),
            fields(&text).get("PLAIN").map(String::as_str)
        ),
        ("COMPLETED", Some("ran")),
        "a job without GPUs after dpkg -r: {text}\n{}",
        cluster.log_tails()
    );
    assert_disabled(&after_remove, &enabled, "after dpkg -r");

    // 6. Install again: the admin's line is back as it was, and shard jobs
    // get instances again.
    ok(
        "dpkg",
        &[
            "-i",
            &deb.display().to_string(),
            &deb_plugin.display().to_string(),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(on_node(PLUGSTACK_FILE)).expect("read the plugstack file"),
        enabled,
        "installing smartmig-spank again did not bring back the admin's line"
    );
    let _daemon = start_daemon();
    shard_job("reinstalled.out");

    // 7. Purge as the quickstart's Remove steps do, with smartmigd still
    // running (started by hand, no systemd): the package stops it, and
    // nothing of either package is left.
    drop(_installed);
    wait_exit(_daemon, "dpkg --purge");
    drop(cluster);
    for path in [
        "/usr/sbin/smartmigd",
        "/usr/bin/smartmig",
        "/etc/smartmig/smartmig.toml",
        PLUGSTACK_FILE,
        "/var/lib/smartmig",
        "/run/smartmig-journal",
        plugin.as_str(),
    ] {
        assert!(!on_node(path).exists(), "{path} left after dpkg --purge");
    }
}

/// A child process killed (and reaped) when dropped.
struct Killed(Child);

/// Waits until the packages' removal (`what`) has stopped `daemon`.
fn wait_exit(mut daemon: Killed, what: &str) {
    let start = Instant::now();
    while daemon.0.try_wait().ok().flatten().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what} left smartmigd running from the deleted binary"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
