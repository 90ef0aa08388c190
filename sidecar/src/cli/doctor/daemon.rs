//! The daemon checks: both sockets exist with the modes and owners
//! docs/daemon.md documents (public 0666; root-only 0600 owned by
//! `slurm_user`), `health` answers on both, and the daemon's backend and
//! GPUs are what the config and NVML (or the sim's `[[gpus]]`) say. Only
//! `health` and `status` are sent.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use super::{Check, Context, NodeGpu};
use crate::daemon::config::{BackendKind, Config};
use crate::daemon::protocol::{GpuOrderStatus, GpuStatus, HoldsStatus};
use crate::daemon::Client;

/// What `stat` says of a socket path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketFile {
    pub is_socket: bool,
    pub mode: u32,
    pub uid: u32,
}

fn stat(path: &Path) -> std::io::Result<SocketFile> {
    let m = std::fs::metadata(path)?;
    Ok(SocketFile {
        is_socket: m.file_type().is_socket(),
        mode: m.permissions().mode() & 0o7777,
        uid: m.uid(),
    })
}

/// A socket file against the mode (and owner) it should have.
pub fn socket_file_check(
    name: &str,
    path: &Path,
    found: &std::io::Result<SocketFile>,
    mode: u32,
    owner: Option<(u32, &str)>,
) -> Check {
    let shown = path.display();
    match found {
        Err(e) => Check::fail(
            name,
            format!("{shown}: {e}"),
            "start smartmigd (`systemctl start smartmigd`; its log says why it stopped)",
        ),
        Ok(f) if !f.is_socket => Check::fail(
            name,
            format!("{shown} is not a socket"),
            "remove it and restart smartmigd",
        ),
        Ok(f) if f.mode != mode => Check::fail(
            name,
            format!(
                "{shown} has mode {:04o}, smartmigd makes it {mode:04o}",
                f.mode
            ),
            "restart smartmigd (it sets the mode when it binds); do not change it by hand",
        ),
        Ok(f) => match owner {
            Some((uid, user)) if f.uid != uid => Check::fail(
                name,
                format!(
                    "{shown} belongs to uid {}, not to slurm_user {user} (uid {uid})",
                    f.uid
                ),
                "restart smartmigd (it gives the socket to slurm_user when it binds)",
            ),
            _ => Check::ok(name, format!("{shown}: socket, mode {mode:04o}")),
        },
    }
}

/// The daemon's GPUs against the backend's: (index, model) must agree.
pub fn gpus_check(daemon: &[GpuStatus], node: &[NodeGpu]) -> Check {
    let theirs: Vec<String> = daemon
        .iter()
        .map(|g| format!("{} {}", g.index, g.model))
        .collect();
    let ours: Vec<String> = node
        .iter()
        .map(|g| format!("{} {}", g.index, g.model))
        .collect();
    if theirs == ours {
        Check::ok(
            "daemon.gpus",
            format!("smartmigd drives GPU {}", theirs.join(", GPU ")),
        )
    } else {
        Check::fail(
            "daemon.gpus",
            format!(
                "smartmigd drives [{}], the backend has [{}]",
                theirs.join(", "),
                ours.join(", ")
            ),
            "restart smartmigd (gpus and backend are read at start only)",
        )
    }
}

/// The GPUs' XID record (issue 44): a GPU out of service fails, an
/// instance waiting for its rebuild warns, XIDs only counted are shown.
pub fn gpu_health_check(gpus: &[GpuStatus]) -> Check {
    let name = "daemon.gpu_health";
    let fatal: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            let x = g.health.as_ref()?.fatal_xid?;
            Some(format!("GPU {} (xid {x})", g.index))
        })
        .collect();
    if !fatal.is_empty() {
        return Check::fail(
            name,
            format!("out of service after a GPU-fatal XID: {}; the node is drained", fatal.join(", ")),
            "see NVIDIA's XID catalogue for the XID; reset the GPU (`nvidia-smi -r -i N`, or reboot), then `scontrol update nodename=<node> state=resume`",
        );
    }
    let sick: Vec<String> = gpus
        .iter()
        .flat_map(|g| {
            g.instances.iter().filter_map(move |i| {
                i.unhealthy_xid
                    .map(|x| format!("GPU {} {} {} (xid {x})", g.index, i.profile, i.uuid))
            })
        })
        .collect();
    if !sick.is_empty() {
        return Check::warn(
            name,
            format!("unhealthy MIG instances, rebuilt once idle: {}", sick.join(", ")),
            "nothing to do unless it repeats: the same slot failing again points at the GPU (smartmigd's log names the jobs)",
        );
    }
    let seen: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            let h = g.health.as_ref()?;
            let xids: Vec<String> = h.xids.iter().map(|(x, n)| format!("{x} x{n}")).collect();
            Some(format!("GPU {}: {}", g.index, xids.join(", ")))
        })
        .collect();
    if seen.is_empty() {
        Check::ok(name, "no XID events since smartmigd started")
    } else {
        Check::ok(
            name,
            format!("XIDs counted, nothing out of service: {}", seen.join("; ")),
        )
    }
}

fn client(path: &Path) -> Client {
    Client::new(path).with_io_timeout(Duration::from_secs(10))
}

pub fn check(ctx: &Context) -> Vec<Check> {
    let Some(config) = ctx.config else {
        return vec![Check::skipped(
            "daemon",
            "the config did not load, so the sockets are unknown",
            "fix the config first",
        )];
    };
    let mut out = Vec::new();
    let admin = config.admin_socket();
    let slurm_uid = nix::unistd::User::from_name(&config.slurm_user)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw());
    out.push(socket_file_check(
        "daemon.socket",
        &config.socket,
        &stat(&config.socket),
        0o666,
        None,
    ));
    out.push(match slurm_uid {
        Some(uid) => socket_file_check(
            "daemon.admin_socket",
            &admin,
            &stat(&admin),
            0o600,
            Some((uid, &config.slurm_user)),
        ),
        None => Check::warn(
            "daemon.admin_socket",
            format!("slurm_user {} is not a user here", config.slurm_user),
            "set slurm_user to the user slurmd runs as (root by default)",
        ),
    });
    let health = client(&config.socket).health();
    let want = match config.backend {
        BackendKind::Sim => "sim",
        BackendKind::Nvml => "nvml",
    };
    match &health {
        Ok(h) if h.backend == want => out.push(Check::ok(
            "daemon.health",
            format!(
                "smartmigd {} answers on {} ({}, backend {}, up {} s)",
                h.version,
                config.socket.display(),
                h.status,
                h.backend,
                h.uptime_s
            ),
        )),
        Ok(h) => out.push(Check::fail(
            "daemon.health",
            format!("smartmigd runs backend {}, the config says {want}", h.backend),
            "restart smartmigd (backend is read at start only)",
        )),
        Err(e) => out.push(Check::fail(
            "daemon.health",
            format!("no health reply on {}: {e}", config.socket.display()),
            "start smartmigd (`systemctl start smartmigd`; `journalctl -u smartmigd` says why it is down)",
        )),
    }
    out.push(match client(&admin).health() {
        Ok(_) => Check::ok(
            "daemon.admin_health",
            format!("{} answers", admin.display()),
        ),
        Err(e) if !nix::unistd::geteuid().is_root() => Check::skipped(
            "daemon.admin_health",
            format!("{} refused a non-root user ({e})", admin.display()),
            "run doctor as root to check the plugin's socket",
        ),
        Err(e) => Check::fail(
            "daemon.admin_health",
            format!("no health reply on {}: {e}", admin.display()),
            "restart smartmigd; the plugin talks to this socket",
        ),
    });
    if health.is_err() {
        out.push(Check::skipped(
            "daemon.gpus",
            "smartmigd does not answer",
            "start smartmigd, then run doctor again",
        ));
        return out;
    }
    out.extend(status_checks(config, ctx));
    out
}

/// What smartmigd's status says: its GPUs' health and whether they are
/// the backend's.
fn status_checks(config: &Config, ctx: &Context) -> Vec<Check> {
    let status = client(&config.socket).status();
    let mut out = Vec::new();
    if let Ok(s) = &status {
        out.push(gpu_health_check(&s.gpus));
        if let Some(o) = &s.gpu_order {
            out.push(gpu_order_check(o));
        }
        if let Some(h) = &s.holds {
            out.push(holds_check(h));
        }
    }
    out.push(match (status, ctx.gpus.as_deref()) {
        (Ok(s), Some(node)) => gpus_check(&s.gpus, node),
        (Ok(s), None) => Check::skipped(
            "daemon.gpus",
            format!(
                "smartmigd drives {} GPU(s); the backend's GPUs are unknown",
                s.gpus.len()
            ),
            "fix the GPU checks above",
        ),
        (Err(e), _) => Check::fail(
            "daemon.gpus",
            format!("no status reply: {e}"),
            "check smartmigd's log",
        ),
    });
    out
}

/// smartmigd's own check of Slurm's GPU order (`status`'s `gpu_order`):
/// it asks again until Slurm answers when it started before Slurm.
fn gpu_order_check(o: &GpuOrderStatus) -> Check {
    const NAME: &str = "daemon.gpu_order";
    match o.state.as_str() {
        "matches" => Check::ok(NAME, o.detail.clone()),
        "mismatch" => Check::fail(
            NAME,
            o.detail.clone(),
            "fix gres.conf's GPU order (docs/slurm-integration.md §1), restart slurmd and smartmigd",
        ),
        "waiting" => Check::warn(
            NAME,
            format!("{} ({} ask(s))", o.detail, o.attempts),
            "start munge and Slurm (quickstart step 6); smartmigd checks by itself once slurmd -G answers",
        ),
        _ => Check::warn(NAME, o.detail.clone(), "check gres.conf's gpu lines"),
    }
}

/// What the running smartmigd does about stranded shards (`status`'s
/// `holds`): a warning when it runs without holds that were asked for or
/// left to the default (issue 56).
fn holds_check(h: &HoldsStatus) -> Check {
    const NAME: &str = "daemon.holds";
    // `no-slurm`: smartmigd does not talk to Slurm, so nothing is held.
    if h.state != "off" || h.configured == "off" {
        return Check::ok(
            NAME,
            format!("{} (slurm.holds = {}): {}", h.state, h.configured, h.reason),
        );
    }
    Check::warn(
        NAME,
        format!("off (slurm.holds = {}): {}", h.configured, h.reason),
        "give each GPU its own GRES type (the slurm.holds check above lists the lines), restart \
         slurmctld, slurmd and smartmigd",
    )
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;
    use crate::mig::GpuModel;

    #[test]
    fn a_daemon_without_the_holds_it_was_left_to_decide_is_a_warning() {
        let h = |configured: &str, state: &str| HoldsStatus {
            configured: configured.into(),
            state: state.into(),
            reason: "why".into(),
        };
        assert_eq!(holds_check(&h("auto", "adaptive")).status, Status::Ok);
        assert_eq!(holds_check(&h("off", "off")).status, Status::Ok);
        assert_eq!(holds_check(&h("auto", "no-slurm")).status, Status::Ok);
        let w = holds_check(&h("auto", "off"));
        assert_eq!((w.check.as_str(), w.status), ("daemon.holds", Status::Warn));
        assert!(w.detail.contains("why"), "{w:?}");
    }

    #[test]
    fn socket_modes_and_owners() {
        let p = Path::new("/run/smartmig/smartmig-root.sock");
        let good = SocketFile {
            is_socket: true,
            mode: 0o600,
            uid: 0,
        };
        assert_eq!(
            socket_file_check("a", p, &Ok(good), 0o600, Some((0, "root"))).status,
            Status::Ok
        );
        let wide = SocketFile {
            mode: 0o666,
            ..good
        };
        assert_eq!(
            socket_file_check("a", p, &Ok(wide), 0o600, None).status,
            Status::Fail
        );
        let other = SocketFile { uid: 64030, ..good };
        let c = socket_file_check("a", p, &Ok(other), 0o600, Some((0, "root")));
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("uid 64030"), "{c:?}");
        let missing = Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        let c = socket_file_check("a", p, &missing, 0o600, None);
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.as_deref().unwrap_or("").contains("start smartmigd"));
    }

    #[test]
    fn gpu_health_fails_on_a_fatal_xid_and_warns_on_an_instance() {
        use crate::daemon::protocol::{GpuHealthStatus, InstanceStatus};
        let mut g = GpuStatus {
            index: 1,
            model: GpuModel::A100_40gb,
            picture: String::new(),
            layout: String::new(),
            instances: vec![InstanceStatus {
                uuid: "MIG-a".into(),
                profile: "3g.20gb".into(),
                start: 0,
                compute: 3,
                job_id: None,
                slurm_id: None,
                uid: None,
                busy_since: None,
                idle_s: None,
                access_files: Vec::new(),
                unhealthy_xid: None,
            }],
            idle_s: 0,
            energy_j: None,
            others_busy: Default::default(),
            health: None,
        };
        assert_eq!(
            gpu_health_check(std::slice::from_ref(&g)).status,
            Status::Ok
        );
        g.instances[0].unhealthy_xid = Some(94);
        g.health = Some(GpuHealthStatus {
            fatal_xid: None,
            xids: [(94, 1)].into(),
        });
        let c = gpu_health_check(std::slice::from_ref(&g));
        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.contains("MIG-a (xid 94)"), "{c:?}");
        g.health.as_mut().unwrap().fatal_xid = Some(79);
        let c = gpu_health_check(std::slice::from_ref(&g));
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("GPU 1 (xid 79)"), "{c:?}");
    }

    #[test]
    fn daemon_gpus_must_match() {
        let gpu = |index, model| GpuStatus {
            index,
            model,
            picture: String::new(),
            layout: String::new(),
            instances: Vec::new(),
            idle_s: 0,
            energy_j: None,
            others_busy: Default::default(),
            health: None,
        };
        let node = [NodeGpu {
            index: 0,
            model: GpuModel::A100_40gb,
            minor: Some(0),
        }];
        assert_eq!(
            gpus_check(&[gpu(0, GpuModel::A100_40gb)], &node).status,
            Status::Ok
        );
        assert_eq!(
            gpus_check(&[gpu(0, GpuModel::H100_80gb)], &node).status,
            Status::Fail
        );
        assert_eq!(gpus_check(&[], &node).status, Status::Fail);
    }
}
