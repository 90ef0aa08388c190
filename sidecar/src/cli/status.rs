//! `smartmig status`: what the local smartmigd holds, as a table or JSON.
//! Read-only, so any user may run it (the socket is world-writable; writes
//! are refused by the daemon's peer-credential check).

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context;

use super::args::JsonArg;
use super::clock::{local_time, unix_now};
use super::socket::SocketArgs;
use crate::daemon::protocol::{
    AdviseStatus, ClusterViewStatus, GpuHealthStatus, GpuOrderStatus, GpuStatus, HoldsStatus,
    MemoryStatus, ShadowStatus, StatusReply,
};
use crate::daemon::Client;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub socket: SocketArgs,
    #[command(flatten)]
    pub json: JsonArg,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let client = Client::new(args.socket.socket()?).with_io_timeout(Duration::from_secs(10));
    let status = client.status().context("asking smartmigd for its status")?;
    if !args.json.to_stdout() {
        print!("{}", render(&status, unix_now() as i64));
    }
    args.json.write(&status)
}

fn duration(s: u64) -> String {
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The human-readable table; `now` (Unix seconds, this machine's clock,
/// which is the daemon's: the socket is local) dates waiting jobs'
/// deadlines.
pub fn render(s: &StatusReply, now: i64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "node {}  backend {}  policy {}{}  smartmigd {}  up {}",
        s.node,
        s.backend,
        s.policy,
        s.placement
            .as_deref()
            .map(|p| format!("  placement {p}"))
            .unwrap_or_default(),
        s.version,
        duration(s.uptime_s)
    );
    if let Some(sh) = &s.shadow {
        render_shadow(&mut out, sh);
    }
    if let Some(o) = &s.gpu_order {
        render_gpu_order(&mut out, o);
    }
    if let Some(h) = &s.holds {
        render_holds(&mut out, h);
    }
    if s.epilog_missing {
        let _ = writeln!(
            out,
            "\nWARNING: the SPANK plugin's job epilog never ran: instances of ended jobs are freed only\n\
             when smartmigd sees them gone from squeue. Restart slurmd on this node (slurmd reads\n\
             plugstack.conf's epilogs at start); see docs/slurm-integration.md."
        );
    }
    for g in &s.gpus {
        render_gpu(&mut out, g);
    }
    render_queue(&mut out, s, now);
    if let Some(c) = &s.cluster {
        render_cluster(&mut out, c);
    }
    if let Some(a) = &s.advise {
        render_advise(&mut out, a);
    }
    if let Some(m) = &s.memory {
        render_memory(&mut out, m);
    }
    out
}

/// The jobs waiting for an instance and the plans waiting for `apply`.
fn render_queue(out: &mut String, s: &StatusReply, now: i64) {
    if !s.waiting.is_empty() {
        let _ = writeln!(out, "\nWaiting for an instance");
        for w in &s.waiting {
            let _ = writeln!(
                out,
                "  job {:<10} GPU {} {} slice(s), waiting {}{}",
                w.job_id,
                w.gpu,
                w.slices,
                duration(w.waiting_s),
                match w.deadline {
                    Some(d) if d >= now => format!(", deadline in {}", duration((d - now) as u64)),
                    Some(d) => format!(", deadline passed {} ago", duration((now - d) as u64)),
                    None => String::new(),
                }
            );
        }
    }
    if !s.pending_plans.is_empty() {
        let _ = writeln!(
            out,
            "\nPlans waiting for `smartmig apply ID` (mode confirm)"
        );
        for p in &s.pending_plans {
            let _ = writeln!(out, "  {}", super::plan::line(p, now));
        }
    }
}

/// Where smartmigd's view of the cluster's queue comes from.
fn render_cluster(out: &mut String, c: &ClusterViewStatus) {
    match c.source.as_str() {
        "summary" => {
            let _ = writeln!(
                out,
                "\nCluster view: summary {}s old from {} ({} node(s); this node claims {} of {} pending shard job(s))",
                c.age_s.unwrap_or(0),
                c.summary_dir,
                c.nodes.unwrap_or(0),
                c.claimed.unwrap_or(0),
                c.pending_cluster.unwrap_or(0)
            );
        }
        "squeue" | "hold" => {
            let _ = writeln!(
                out,
                "\nCluster view: {} ({})",
                if c.source == "hold" {
                    "no summary, layout held (cluster.fallback = hold)"
                } else {
                    "asking Slurm directly (squeue, sinfo each epoch)"
                },
                c.problem.as_deref().unwrap_or("no summary read yet")
            );
        }
        _ => {}
    }
}

/// Advise mode: what is watched and recorded, and the wishes.
fn render_advise(out: &mut String, a: &AdviseStatus) {
    let _ = writeln!(
        out,
        "\nAdvise mode: watching, changing nothing ({} job(s) running on the node's instances, {} ended job(s) and {} wish(es) recorded in {})",
        a.watched_jobs, a.jobs_recorded, a.advice_recorded, a.log
    );
    for p in &a.wishes {
        let _ = writeln!(out, "  would reshape GPU {}: {} -> {}", p.gpu, p.from, p.to);
    }
    let _ = writeln!(
        out,
        "  `smartmig advise report` estimates what dynamic mode would change"
    );
}

/// One GPU: its line, other users' holds, its health and its instances.
fn render_gpu(out: &mut String, g: &GpuStatus) {
    let energy = g
        .energy_j
        .map(|j| format!("  energy {:.1} kJ", j / 1000.0))
        .unwrap_or_default();
    let idle = if g.idle_s > 0 {
        format!("  idle {}", duration(g.idle_s))
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "\nGPU {} {}  [{}]  {}{idle}{energy}",
        g.index, g.model, g.picture, g.layout
    );
    if !g.others_busy.is_empty() {
        let held: Vec<String> = g
            .others_busy
            .iter()
            .map(|(p, n)| format!("{n} x {p}"))
            .collect();
        let _ = writeln!(out, "  other users' jobs hold: {}", held.join(", "));
    }
    if let Some(h) = &g.health {
        render_gpu_health(out, g.index, h);
    }
    if g.instances.is_empty() {
        if g.others_busy.is_empty() {
            let _ = writeln!(out, "  (no instances)");
        }
        return;
    }
    let _ = writeln!(
        out,
        "  {:<44} {:<9} {:>5} {:>10} {:>6} BUSY/IDLE",
        "UUID", "PROFILE", "START", "JOB", "UID"
    );
    for i in &g.instances {
        // An array task as Slurm names it (`11_1`), else the job id.
        let job = i
            .slurm_id
            .clone()
            .or_else(|| i.job_id.map(|j| j.to_string()))
            .unwrap_or_else(|| "-".into());
        let uid = i.uid.map(|u| u.to_string()).unwrap_or_else(|| "-".into());
        let state = match (i.busy_since, i.idle_s) {
            (Some(since), _) => format!(
                "busy since {} ({})",
                local_time(since),
                duration(unix_now().saturating_sub(since))
            ),
            (None, Some(idle)) => format!("idle {}", duration(idle)),
            _ => "-".into(),
        };
        let state = match i.unhealthy_xid {
            Some(x) => format!("{state}  UNHEALTHY (xid {x}: rebuilt once idle)"),
            None => state,
        };
        let _ = writeln!(
            out,
            "  {:<44} {:<9} {:>5} {:>10} {:>6} {}",
            i.uuid, i.profile, i.start, job, uid, state
        );
    }
}

/// A GPU's XIDs: out of service (and why), and the XIDs seen.
fn render_gpu_health(out: &mut String, index: u32, h: &GpuHealthStatus) {
    if let Some(x) = h.fatal_xid {
        let _ = writeln!(
            out,
            "  OUT OF SERVICE: GPU-fatal XID {x}; no job is placed here and the node is drained \
             (`smartmig: gpu {index} xid {x}`). Reset the GPU, then resume the node \
             (`scontrol update nodename=<node> state=resume`)."
        );
    }
    let seen: Vec<String> = h.xids.iter().map(|(x, n)| format!("{x} x{n}")).collect();
    let _ = writeln!(out, "  XIDs seen: {}", seen.join(", "));
}

/// Slurm's GPU order: one line while it is unknown or wrong, nothing
/// when it matches.
fn render_gpu_order(out: &mut String, o: &GpuOrderStatus) {
    match o.state.as_str() {
        "matches" => {}
        "waiting" => {
            let _ = writeln!(
                out,
                "\nGPU order: not checked yet, Slurm has not answered ({} ask(s)); smartmigd asks again.\n  {}",
                o.attempts, o.detail
            );
        }
        "mismatch" => {
            let _ = writeln!(
                out,
                "\nERROR: Slurm numbers the GPUs differently; allocates are refused.\n  {}",
                o.detail
            );
        }
        _ => {
            let _ = writeln!(out, "\nGPU order: {}: {}", o.state, o.detail);
        }
    }
}

/// The holds on stranded shards: one line, and the reason when they are
/// off although Slurm queries are on (an untyped gres.conf, issue 56).
fn render_holds(out: &mut String, h: &HoldsStatus) {
    if h.state == "off" && h.configured != "off" {
        let _ = writeln!(
            out,
            "\nHolds: off (slurm.holds = {}): {}",
            h.configured, h.reason
        );
    } else {
        let _ = writeln!(out, "Holds: {} (slurm.holds = {})", h.state, h.configured);
    }
}

/// Which policy runs, and the day's shadow that chooses it.
fn render_shadow(out: &mut String, sh: &ShadowStatus) {
    if !sh.enabled {
        let _ = writeln!(
            out,
            "running: {} (shadow off; `[shadow] enabled = true` turns it on, docs/daemon.md)",
            sh.primary
        );
        return;
    }
    let _ = writeln!(
        out,
        "running: {} ({}); shadow on, fallback {}: every {} s over {} s, margin {}, {} check(s) in a row",
        sh.running, sh.running_policy, sh.fallback, sh.every_s, sh.window_s, sh.margin, sh.hold_checks
    );
    let costs = sh
        .last_costs_j
        .map(|[l, f]| format!(", last costs learned {l:.0} J, fallback {f:.0} J"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "  {} check(s), {} failed, {} switch(es), {} job(s) since {}{costs}",
        sh.checks,
        sh.failures,
        sh.switches,
        sh.jobs,
        local_time(sh.day_start)
    );
    if let Some(w) = &sh.last_switch {
        let _ = writeln!(
            out,
            "  last switch {}: {} -> {}: {}",
            local_time(w.at),
            w.from,
            w.to,
            w.reason
        );
    }
}

/// The out-of-memory restarts and learned estimates.
fn render_memory(out: &mut String, m: &MemoryStatus) {
    let onoff = |b: bool| if b { "on" } else { "off" };
    let restarts = match (m.oom_requeue, m.plugin_oom_requeue) {
        (false, _) => "off (oom.requeue = false in smartmigd's config)".to_string(),
        (true, Some(false)) => "off (smartmigd requeues, but the plugin's oom_requeue is off: \
                                no job reports an out-of-memory failure)"
            .to_string(),
        (true, Some(true)) => format!("on, max {} per job", m.max_retries),
        (true, None) => format!(
            "on in smartmigd, max {} per job (needs oom_requeue=yes in plugstack.conf; \
             no job seen yet)",
            m.max_retries
        ),
    };
    let _ = writeln!(out, "\nOOM restarts: {restarts}");
    if let Some(e) = &m.early_restart {
        let _ = writeln!(
            out,
            "  early restart on (window {} samples, horizon {}x the time run, from {:.0} % full): \
             {} restart(s), {} false (the restart's peak would have fitted)",
            e.window,
            e.horizon,
            e.min_fill * 100.0,
            e.restarts,
            e.false_restarts
        );
    }
    if m.oom_events.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for e in &m.oom_events {
        let who = match (&e.user, &e.job_name) {
            (Some(u), Some(n)) => format!("{u}/{n}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "  {:<19} job {:<8} {:<20} GPU {} {:<9} failures {} {:<18} {}",
            local_time(e.at),
            e.job_id,
            who,
            e.gpu,
            e.profile,
            e.failures,
            e.decision,
            e.message
        );
    }
    let _ = writeln!(
        out,
        "\nMemory estimates (jobs without --mig-mem: {})",
        onoff(m.estimate)
    );
    if m.estimates.is_empty() {
        let _ = writeln!(out, "  (none learned yet)");
        return;
    }
    let _ = writeln!(
        out,
        "  {:<12} {:<24} {:>9} {:>5} {:>5} {:>9}",
        "USER", "JOB NAME", "ESTIMATE", "RUNS", "OOMS", "MAX PEAK"
    );
    for e in &m.estimates {
        let peak = e
            .max_peak_gb
            .map(|p| format!("{p:.1} GB"))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "  {:<12} {:<24} {:>6.1} GB {:>5} {:>5} {:>9}",
            e.user, e.job_name, e.estimate_gb, e.runs, e.ooms, peak
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::protocol::InstanceStatus;
    use crate::daemon::protocol::WaitingJob;

    #[test]
    fn gpu_health_shows_out_of_service_and_unhealthy_instances() {
        let mut g = GpuStatus {
            index: 1,
            model: crate::mig::GpuModel::A100_40gb,
            picture: "3333|....".into(),
            layout: "3g.20gb".into(),
            instances: vec![InstanceStatus {
                uuid: "MIG-1".into(),
                profile: "3g.20gb".into(),
                start: 0,
                compute: 3,
                job_id: None,
                slurm_id: None,
                uid: None,
                busy_since: None,
                idle_s: Some(5),
                access_files: Vec::new(),
                unhealthy_xid: Some(94),
            }],
            idle_s: 0,
            energy_j: None,
            others_busy: Default::default(),
            health: Some(GpuHealthStatus {
                fatal_xid: Some(79),
                xids: [(79, 1), (94, 2)].into(),
            }),
        };
        let mut t = String::new();
        render_gpu(&mut t, &g);
        assert!(t.contains("UNHEALTHY (xid 94: rebuilt once idle)"), "{t}");
        assert!(
            t.contains("OUT OF SERVICE: GPU-fatal XID 79")
                && t.contains("`smartmig: gpu 1 xid 79`"),
            "{t}"
        );
        assert!(t.contains("XIDs seen: 79 x1, 94 x2"), "{t}");
        g.health = None;
        g.instances[0].unhealthy_xid = None;
        let mut t = String::new();
        render_gpu(&mut t, &g);
        assert!(!t.contains("XID") && !t.contains("UNHEALTHY"), "{t}");
    }

    #[test]
    fn table_shows_layout_instances_and_jobs() {
        let s = StatusReply {
            node: "n1".into(),
            version: "0.1.0".into(),
            backend: "sim".into(),
            policy: "none".into(),
            placement: None,
            uptime_s: 75,
            epochs: 0,
            gpus: vec![GpuStatus {
                index: 0,
                model: crate::mig::GpuModel::A100_40gb,
                picture: "3333|....".into(),
                layout: "3g.20gb".into(),
                instances: vec![InstanceStatus {
                    uuid: "MIG-1".into(),
                    profile: "3g.20gb".into(),
                    start: 0,
                    compute: 3,
                    job_id: Some(42),
                    slurm_id: None,
                    uid: Some(1000),
                    busy_since: Some(1_700_000_000),
                    idle_s: None,
                    access_files: Vec::new(),
                    unhealthy_xid: None,
                }],
                idle_s: 0,
                energy_j: Some(1500.0),
                others_busy: [("1g.5gb".to_string(), 2)].into(),
                health: None,
            }],
            memory: None,
            epilog_missing: false,
            pending_plans: vec![],
            advise: None,
            cluster: None,
            shadow: None,
            gpu_order: None,
            holds: None,
            waiting: vec![
                WaitingJob {
                    job_id: 77,
                    gpu: 1,
                    slices: 2,
                    waiting_s: 12,
                    uid: Some(1000),
                    deadline: None,
                },
                WaitingJob {
                    job_id: 78,
                    gpu: 1,
                    slices: 1,
                    waiting_s: 3,
                    uid: Some(1000),
                    deadline: Some(1_000_300),
                },
                WaitingJob {
                    job_id: 79,
                    gpu: 0,
                    slices: 1,
                    waiting_s: 3,
                    uid: Some(1000),
                    deadline: Some(999_990),
                },
            ],
        };
        let t = render(&s, 1_000_000);
        assert!(
            t.contains("GPU 0 a100-40gb  [3333|....]  3g.20gb  energy 1.5 kJ"),
            "{t}"
        );
        assert!(t.contains("MIG-1"), "{t}");
        assert!(t.contains("42"), "{t}");
        assert!(t.contains("other users' jobs hold: 2 x 1g.5gb"), "{t}");
        assert!(
            t.contains("job 77         GPU 1 2 slice(s), waiting 12s\n"),
            "{t}"
        );
        // The deadline the placement rule orders waiting jobs by.
        assert!(
            t.contains("job 78         GPU 1 1 slice(s), waiting 3s, deadline in 5m00s\n"),
            "{t}"
        );
        assert!(t.contains("deadline passed 10s ago"), "{t}");
        assert!(t.contains("up 1m15s"), "{t}");
        assert!(!t.contains("OOM restarts"), "{t}");
    }

    #[test]
    fn memory_section_lists_restarts_and_estimates() {
        use crate::daemon::protocol::{EstimateStatus, OomEvent};
        let s = StatusReply {
            node: "n1".into(),
            version: "0.1.0".into(),
            backend: "sim".into(),
            policy: "none".into(),
            placement: None,
            uptime_s: 5,
            epochs: 0,
            gpus: vec![],
            memory: Some(MemoryStatus {
                estimate: true,
                oom_requeue: true,
                max_retries: 2,
                oom_events: vec![OomEvent {
                    at: 1_700_000_000,
                    job_id: 42,
                    user: Some("alice".into()),
                    job_name: Some("train.sh".into()),
                    gpu: 0,
                    profile: "1g.5gb".into(),
                    memory_gb: 5,
                    failures: 1,
                    decision: crate::daemon::protocol::OomDecision::Requeued,
                    next_memory_gb: Some(10),
                    message: "scontrol requeue 42 succeeded".into(),
                    cause: crate::daemon::protocol::OomCause::EarlyRestart,
                    used_gb: Some(4.1),
                    predicted_gb: Some(5.6),
                }],
                oom_jobs: vec![],
                estimates: vec![EstimateStatus {
                    user: "alice".into(),
                    job_name: "train.sh".into(),
                    estimate_gb: 6.0,
                    runs: 1,
                    ooms: 1,
                    max_peak_gb: None,
                }],
                plugin_oom_requeue: Some(false),
                early_restart: Some(crate::daemon::protocol::EarlyRestartStatus {
                    window: 3,
                    horizon: 0.5,
                    min_fill: 0.5,
                    restarts: 4,
                    false_restarts: 1,
                }),
            }),
            epilog_missing: true,
            pending_plans: vec![],
            advise: None,
            cluster: None,
            shadow: None,
            gpu_order: None,
            holds: None,
            waiting: vec![],
        };
        let t = render(&s, 0);
        assert!(
            t.contains(
                "OOM restarts: off (smartmigd requeues, but the plugin's oom_requeue is off"
            ),
            "{t}"
        );
        assert!(
            t.contains("WARNING: the SPANK plugin's job epilog never ran"),
            "{t}"
        );
        assert!(t.contains("alice/train.sh"), "{t}");
        assert!(t.contains("requeued"), "{t}");
        assert!(t.contains("6.0 GB"), "{t}");
        assert!(
            t.contains("early restart on (window 3 samples, horizon 0.5x the time run, from 50 % full): 4 restart(s), 1 false"),
            "{t}"
        );
    }

    /// The shadow is opt-in: status says so, and how to turn it on.
    #[test]
    fn a_shadow_that_is_off_says_how_to_turn_it_on() {
        let mut out = String::new();
        let off = ShadowStatus {
            primary: "policy:/p.onnx".into(),
            ..ShadowStatus::default()
        };
        render_shadow(&mut out, &off);
        assert!(
            out.starts_with("running: policy:/p.onnx (shadow off; `[shadow] enabled = true`"),
            "{out}"
        );
    }

    /// Issue 56: status says which holds run, and why when they are off
    /// although asked for.
    #[test]
    fn the_holds_show_and_say_why_they_are_off() {
        let h = |configured: &str, state: &str| HoldsStatus {
            configured: configured.into(),
            state: state.into(),
            reason: "gres.conf has no per-GPU types: fix".into(),
        };
        let mut out = String::new();
        render_holds(&mut out, &h("auto", "adaptive"));
        assert_eq!(out, "Holds: adaptive (slurm.holds = auto)\n");
        let mut out = String::new();
        render_holds(&mut out, &h("auto", "off"));
        assert!(
            out.contains("Holds: off (slurm.holds = auto): gres.conf has no per-GPU types: fix"),
            "{out}"
        );
        let mut out = String::new();
        render_holds(&mut out, &h("off", "off"));
        assert_eq!(out, "Holds: off (slurm.holds = off)\n");
    }

    /// Issue 56: status says when Slurm's GPU order is not checked yet or
    /// wrong, and nothing when it matches.
    #[test]
    fn the_gpu_order_shows_only_while_unknown_or_wrong() {
        let order = |state: &str| GpuOrderStatus {
            state: state.into(),
            detail: "why".into(),
            attempts: 3,
        };
        let mut out = String::new();
        render_gpu_order(&mut out, &order("matches"));
        assert_eq!(out, "");
        render_gpu_order(&mut out, &order("waiting"));
        assert!(
            out.contains("GPU order: not checked yet, Slurm has not answered (3 ask(s)); smartmigd asks again.\n  why"),
            "{out}"
        );
        let mut out = String::new();
        render_gpu_order(&mut out, &order("mismatch"));
        assert!(
            out.contains(
                "ERROR: Slurm numbers the GPUs differently; allocates are refused.\n  why"
            ),
            "{out}"
        );
    }
}
