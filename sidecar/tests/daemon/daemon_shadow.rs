//! Do no harm during the day (issue 39): a real smartmigd on its Unix
//! socket (sim backend, or the NVML emulator with
//! `SMARTMIG_TEST_BACKEND=nvml`) keeps a shadow of its day and hands over
//! to the fallback when the configured policy does worse.
//!
//! The configured policy here is deliberately bad, not the shipped
//! learned one (which cannot be made to lose deterministically in a test
//! of seconds): a fixed layout of whole GPUs (`static:77777777`) against a
//! stream of 1-slice jobs. smartmigd still serves the jobs on demand, but
//! the replay, which hands out exactly the requested size as smartmigd
//! does, leaves them unserved under whole GPUs and charges them late,
//! while `greedy` re-shapes into 1g slices and serves them on time. The
//! switch does not look at what the policy is, so this stands for a
//! learned policy that handles a day badly. A second daemon, driven by
//! the same jobs, has a fallback no better than its policy (the same
//! layout): it checks as often and never switches, so the first one's
//! switch comes from the costs, not from the clock.

use std::time::{Duration, Instant};

use crate::daemon_common::{base_config, free_port, req, scrape, TestDaemon};
use smartmig::daemon::protocol::{AllocateRequest, ShadowStatus};

const POLICY: &str = "static:77777777";

/// A daemon deciding every second, checking the shadow every 2 s over a
/// 20 s window, switching on the first check with a 2 % lead.
fn shadowed(name: &str, fallback: &str, port: u16) -> TestDaemon {
    let extra = format!(
        "policy = \"{POLICY}\"\nmetrics_listen = \"127.0.0.1:{port}\"\n\
         [shadow]\nenabled = true\nfallback = \"{fallback}\"\nevery_s = 2\nwindow_s = 20\nmargin = 0.02\nhold_checks = 1\n"
    );
    TestDaemon::start_with(name, |dir| {
        base_config(dir, &extra)
            .replace("epoch_s = 3600", "epoch_s = 1")
            .replace(
                "log_level = \"info\"",
                "log_level = \"info,smartmig_daemon::server::shadow=debug\"",
            )
    })
}

fn shadow(d: &TestDaemon) -> ShadowStatus {
    d.client()
        .status()
        .expect("status")
        .shadow
        .expect("a shadow section")
}

/// A 1-slice job due 10 s after it asks.
fn small_job(id: u64, gpu: u32) -> AllocateRequest {
    AllocateRequest {
        time_limit_s: Some(10),
        ..req(id, gpu, 1, None)
    }
}

/// The metric line starting with `prefix`, e.g. a series with its labels.
fn series(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn the_shadow_hands_a_bad_policy_over_to_the_fallback() {
    let (port_a, port_b) = (free_port(), free_port());
    let a = shadowed("shadow-greedy", "greedy", port_a);
    let b = shadowed("shadow-same", POLICY, port_b);
    let before = shadow(&a);
    assert!(before.enabled, "{before:?}");
    assert_eq!(
        (before.running.as_str(), before.fallback.as_str()),
        ("learned", "greedy")
    );
    assert_eq!(before.running_policy, before.primary);
    // Waves of three 1-slice jobs per GPU every 2 s, each job holding its
    // instance for one wave, until A hands over (at most 60 s).
    let t0 = Instant::now();
    let mut id = 1;
    let mut held: Vec<u64> = Vec::new();
    while shadow(&a).switches == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no switch in 60 s: {:?}\n{}",
            shadow(&a),
            a.log()
        );
        for job in held.drain(..) {
            a.client().release(job).expect("release on A");
            b.client().release(job).expect("release on B");
        }
        for gpu in 0..2 {
            for _ in 0..3 {
                a.client()
                    .allocate(small_job(id, gpu))
                    .expect("allocate on A");
                b.client()
                    .allocate(small_job(id, gpu))
                    .expect("allocate on B");
                held.push(id);
                id += 1;
            }
        }
        // Not synchronisation: the workload's input, a wave every 2 s
        // (each job holds its instance for one wave).
        std::thread::sleep(Duration::from_secs(2));
    }
    let took = t0.elapsed();
    let s = shadow(&a);
    eprintln!("A switched after {took:?}, {} job(s): {s:#?}", id - 1);
    assert_eq!(s.running, "fallback", "{s:?}");
    assert_eq!(s.running_policy, "greedy", "{s:?}");
    let sw = s.last_switch.clone().expect("the last switch");
    assert_eq!((sw.from.as_str(), sw.to.as_str()), ("learned", "fallback"));
    let [learned, fallback] = sw.window_costs_j;
    assert!(
        fallback < learned * (1.0 - 0.02),
        "switched without a lead: learned {learned} J, fallback {fallback} J"
    );
    assert!(
        sw.reason.contains("under greedy (fallback)"),
        "{}",
        sw.reason
    );
    assert_eq!(s.failures, 0, "{s:?}");
    assert!(s.jobs > 0, "{s:?}");
    // The log says it, at info, with the costs.
    let log = a.log();
    assert!(
        log.contains("shadow: switching to the fallback policy"),
        "{log}"
    );
    // The metrics say which runs and count the switch.
    let text = scrape(port_a);
    assert_eq!(
        series(
            &text,
            "smartmig_policy_running{policy=\"greedy\",role=\"fallback\"} "
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            &format!(
                "smartmig_policy_running{{policy=\"{}\",role=\"learned\"}} ",
                s.primary
            )
        ),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "smartmig_shadow_switches_total{to=\"fallback\"} "),
        Some(1.0),
        "{text}"
    );
    // `smartmig status` says it to a person too.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_smartmig"))
        .args(["status", "--socket"])
        .arg(&a.socket)
        .output()
        .expect("smartmig status");
    let human = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{human}");
    let line = |what: &str| log.lines().rfind(|l| l.contains(what)).unwrap_or_default();
    eprintln!(
        "{human}\n{}\n{}",
        line("shadow: switching"),
        line("shadow: day replayed")
    );
    assert!(human.contains("running: fallback (greedy)"), "{human}");
    assert!(human.contains("last switch"), "{human}");
    // B, driven by the same jobs, checked as well but had no better
    // fallback: it never switched.
    let sb = shadow(&b);
    assert!(sb.checks >= 2, "{sb:?}");
    assert_eq!((sb.switches, sb.running.as_str()), (0, "learned"), "{sb:?}");
    let text = scrape(port_b);
    assert_eq!(
        series(&text, "smartmig_shadow_switches_total{to=\"fallback\"} "),
        None,
        "{text}"
    );
}

/// The jobs a test drives: those holding instances, and the next id.
#[derive(Default)]
struct Jobs {
    held: Vec<u64>,
    next: u64,
}

impl Jobs {
    /// Waves every 2 s of `per_gpu` jobs of `slices` per GPU, each
    /// released at the next wave, until `role` runs (at most 90 s);
    /// returns how long it took.
    fn until_running(&mut self, d: &TestDaemon, role: &str, slices: u8, per_gpu: u32) -> Duration {
        let t0 = Instant::now();
        while shadow(d).running != role {
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "{role} does not run: {:?}\n{}",
                shadow(d),
                d.log()
            );
            for job in self.held.drain(..) {
                d.client().release(job).expect("release");
            }
            for gpu in 0..2 {
                for _ in 0..per_gpu {
                    self.next += 1;
                    let r = AllocateRequest {
                        time_limit_s: Some(10),
                        ..req(self.next, gpu, slices, None)
                    };
                    d.client().allocate(r).expect("allocate");
                    self.held.push(self.next);
                }
            }
            // Not synchronisation: the workload's input, a wave every 2 s.
            std::thread::sleep(Duration::from_secs(2));
        }
        t0.elapsed()
    }
}

/// And back: a policy of 1g slices everywhere loses to whole GPUs while
/// the jobs want whole GPUs, and wins back once they want 1g slices (the
/// core's two-phase day, live). Both are fixed layouts for the same reason
/// as above; the fallback's is pursued from any state.
#[test]
fn the_shadow_hands_back_when_the_policy_leads_again() {
    let port = free_port();
    let extra = format!(
        "policy = \"static:1|1|1|1|1|1|1|.\"\nmetrics_listen = \"127.0.0.1:{port}\"\n\
         [shadow]\nenabled = true\nfallback = \"static:77777777\"\nevery_s = 2\nwindow_s = 20\nmargin = 0.02\nhold_checks = 1\n"
    );
    let d = TestDaemon::start_with("shadow-back", |dir| {
        base_config(dir, &extra).replace("epoch_s = 3600", "epoch_s = 1")
    });
    let mut jobs = Jobs::default();
    // Whole-GPU jobs, one per GPU per wave, until the fallback takes over.
    let took = jobs.until_running(&d, "fallback", 7, 1);
    eprintln!("handed over after {took:?}: {:?}", shadow(&d).last_switch);
    // 1-slice jobs, three per GPU per wave, until the policy is back.
    let took = jobs.until_running(&d, "learned", 1, 3);
    let s = shadow(&d);
    eprintln!("handed back after {took:?} more: {s:#?}");
    assert_eq!(s.switches, 2, "{s:?}");
    let back = s.last_switch.clone().expect("a switch");
    assert_eq!(
        (back.from.as_str(), back.to.as_str()),
        ("fallback", "learned")
    );
    let [learned, fallback] = back.window_costs_j;
    assert!(learned < fallback * (1.0 - 0.02), "{back:?}");
    let text = scrape(port);
    for (line, want) in [
        ("smartmig_shadow_switches_total{to=\"fallback\"} ", 1.0),
        ("smartmig_shadow_switches_total{to=\"learned\"} ", 1.0),
    ] {
        assert_eq!(series(&text, line), Some(want), "{line}\n{text}");
    }
    assert!(d.log().contains("shadow: switching to the learned policy"));
}
