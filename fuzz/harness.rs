//! The checks each fuzz target runs on one input, shared by the libFuzzer
//! targets (`fuzz/fuzz_targets/*.rs`) and the stable regression test
//! (`sidecar/tests/sim/fuzz_regressions.rs`, via `#[path]`), so a kept crashing
//! input is replayed through exactly the code that crashed.
//!
//! A check "fails" by panicking; libFuzzer reports the panic as a crash.
#![allow(dead_code)]

use smartmig_client::protocol::{error_line, parse_request, ErrorKind, StatusReply};
use smartmig_core::workload::trace::{read_trace, Trace, TraceFormat, TraceOptions};
use smartmig_daemon::config::Config;
use smartmig_daemon::server::redact::redact;
use smartmig_mig::GpuModel;

/// The socket message decoder: never panics; a parsed request survives a
/// serialise/parse round trip; an error is one well-formed reply line.
/// Inputs that decode as a status reply also go through
/// [`status_redaction`].
pub fn protocol(data: &[u8]) {
    status_redaction(data);
    match parse_request(data) {
        Ok(request) => {
            let line = request.to_line();
            assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
            let again = parse_request(line.trim_end().as_bytes())
                .unwrap_or_else(|e| panic!("re-parsing our own line {line:?} failed: {e}"));
            assert_eq!(
                again.to_line(),
                line,
                "round trip changed the request {request:?}"
            );
        }
        Err(e) => {
            let line = error_line(&e);
            assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
            let v: serde_json::Value = serde_json::from_str(&line).expect("error line is JSON");
            assert_eq!(v["ok"], false);
            assert_eq!(v["error"]["kind"], e.kind.as_str());
            assert!(
                matches!(
                    e.kind,
                    ErrorKind::BadRequest | ErrorKind::UnsupportedVersion | ErrorKind::UnknownOp
                ),
                "the parser produced kind {:?}",
                e.kind
            );
        }
    }
}

/// What `status` shows a user who may not see everything
/// (`server::redact`), on any status reply the input decodes to: no
/// instance of another uid is left, each left-out instance is counted
/// once, only the viewer's waiting jobs, estimates and OOM events remain,
/// and redacting twice changes nothing.
pub fn status_redaction(data: &[u8]) {
    let Ok(mut reply) = serde_json::from_slice::<StatusReply>(data) else {
        return;
    };
    let viewer = reply
        .gpus
        .iter()
        .flat_map(|g| &g.instances)
        .find_map(|i| i.uid)
        .unwrap_or(1000);
    let name = "viewer";
    let foreign = |r: &StatusReply| -> u64 {
        r.gpus
            .iter()
            .flat_map(|g| &g.instances)
            .filter(|i| i.uid.is_some_and(|u| u != viewer))
            .count() as u64
    };
    let counted = |r: &StatusReply| -> u64 {
        r.gpus
            .iter()
            .flat_map(|g| g.others_busy.values())
            .map(|&n| u64::from(n))
            .sum()
    };
    let before = foreign(&reply) + counted(&reply);
    redact(&mut reply, viewer, name);
    assert_eq!(foreign(&reply), 0, "another uid's instance is still shown");
    let saturated = reply
        .gpus
        .iter()
        .flat_map(|g| g.others_busy.values())
        .any(|&n| n == u32::MAX);
    assert!(
        saturated || counted(&reply) == before,
        "left-out instances miscounted"
    );
    assert!(reply.waiting.iter().all(|w| w.uid == Some(viewer)));
    if let Some(m) = &reply.memory {
        assert!(m.estimates.iter().all(|e| e.user == name));
        assert!(m.oom_events.iter().all(|e| e.user.as_deref() == Some(name)));
        assert!(m.oom_jobs.is_empty());
    }
    let once = serde_json::to_string(&reply).expect("serialise");
    redact(&mut reply, viewer, name);
    assert_eq!(
        serde_json::to_string(&reply).expect("serialise"),
        once,
        "redacting twice changed the reply"
    );
}

/// The TOML config parser + validation: never panics; an accepted config
/// validates again, has no changes against itself (no NaN or such that
/// would make a SIGHUP report phantom changes), and a change of one
/// restart-only and one live setting is reported as exactly that.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse(text) {
        Ok(c) => {
            c.validate().expect("an accepted config validates again");
            assert!(c.restart_only_changes(&c).is_empty());
            assert!(c.live_changes(&c).is_empty());
            let mut changed = c.clone();
            changed.socket = c.socket.join("other");
            changed.epoch_s = c.epoch_s.wrapping_add(1);
            assert_eq!(c.restart_only_changes(&changed), ["socket"]);
            let live = c.live_changes(&changed);
            assert_eq!(live.len(), 1, "{live:?}");
            assert!(live[0].starts_with("epoch_s: "), "{live:?}");
            let (merged, _) = c.reloaded(&changed);
            assert_eq!(merged.socket, c.socket, "SIGHUP kept the new socket");
            assert_eq!(
                merged.epoch_s, changed.epoch_s,
                "SIGHUP dropped the live change"
            );
            let _ = c.sim_gpus().expect("validated gpus");
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
        }
    }
}

const MODELS: [GpuModel; 3] = [
    GpuModel::A100_40gb,
    GpuModel::A30_24gb,
    GpuModel::H200_141gb,
];

/// Invariants every reader promises for a trace it accepts.
fn check_trace(t: &Trace, model: GpuModel) {
    assert_eq!(t.jobs.len(), t.source_ids.len());
    for (i, j) in t.jobs.iter().enumerate() {
        assert_eq!(j.id, i as u64, "ids are 0..n");
        if let Err(e) = j.validate(model) {
            panic!("reader accepted an invalid job {j:?}: {e}");
        }
        assert!(j.arrival >= 0.0, "arrival {} < 0", j.arrival);
    }
    assert!(
        t.jobs.windows(2).all(|w| w[0].arrival <= w[1].arrival),
        "jobs sorted by arrival"
    );
    if let Some(first) = t.jobs.first() {
        assert_eq!(first.arrival, 0.0, "first arrival is 0");
    }
    assert!(t.time_offset_s.is_finite());
}

/// One trace reader, strict and lenient, on three GPU models (the first
/// input byte picks the model). Strict success implies lenient success
/// with the same jobs and nothing skipped.
pub fn trace(format: TraceFormat, data: &[u8]) {
    let (model, body) = match data.split_first() {
        Some((b, rest)) => (MODELS[*b as usize % MODELS.len()], rest),
        None => (MODELS[0], data),
    };
    let mut opts = TraceOptions::new(model);
    let strict = read_trace(format, body, &opts);
    opts.lenient = true;
    let lenient = read_trace(format, body, &opts);
    if let Ok(t) = &lenient {
        check_trace(t, model);
    }
    match strict {
        Ok(t) => {
            check_trace(&t, model);
            let l = lenient.expect("strict accepted the trace, lenient must too");
            assert!(l.skipped.is_empty());
            assert_eq!(l.jobs, t.jobs);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
