//! The bad-input matrix (issue 8): config keys, trace rows, socket messages
//! and impossible requests, each with the exact error it yields. The same
//! table is in docs/reliability.md; `--nocapture` prints it as markdown.
//!
//! Pure parsers are called directly; socket cases (oversized, truncated,
//! impossible requests) go through a real smartmigd (sim backend, 2 x
//! A100-40GB, `max_message_bytes = 1024`, `request_timeout_s = 2`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::daemon_common::TestDaemon;
use smartmig::daemon::config::Config;
use smartmig::daemon::protocol::parse_request;
use smartmig::mig::GpuModel;
use smartmig::workload::trace::{read_trace, TraceFormat, TraceOptions};

const GPUS: &str = "[[gpus]]\nmodel = \"a100-40gb\"\n";

/// (area, case, input, expected error text; `kind: message` for socket cases).
type Case = (&'static str, &'static str, String, &'static str);

fn config_cases() -> Vec<Case> {
    let c = |name, text: String, want| ("config", name, text, want);
    vec![
        c("misspelt key", format!("sokcet = \"/x\"\n{GPUS}"), "<config>: TOML parse error at line 1, column 1\n  |\n1 | sokcet = \"/x\"\n  | ^^^^^^\nunknown field `sokcet`, expected one of `socket`, `admin_socket`…"),
        c("relative socket", format!("socket = \"run/s.sock\"\n{GPUS}"), "socket: must be an absolute path"),
        c("relative state_dir", format!("state_dir = \"state\"\n{GPUS}"), "state_dir: must be an absolute path"),
        c("empty slurm_user", format!("slurm_user = \" \"\n{GPUS}"), "slurm_user: must not be empty"),
        c("relative admin_socket", format!("admin_socket = \"run/r.sock\"\n{GPUS}"), "admin_socket: must be an absolute path"),
        c("admin_socket is socket", format!("socket = \"/run/x.sock\"\nadmin_socket = \"/run/x.sock\"\n{GPUS}"), "admin_socket: must differ from socket"),
        c("max_connections_per_user = 0", format!("max_connections_per_user = 0\n{GPUS}"), "max_connections_per_user: must be at least 1"),
        c("max_connections below per-user", format!("max_connections = 4\n{GPUS}"), "max_connections: must be at least max_connections_per_user"),
        c("relative sim.caps_dir", format!("{GPUS}[sim]\ncaps_dir = \"caps\"\n"), "sim.caps_dir: must be an absolute path"),
        c("unknown GPU model", "[[gpus]]\nmodel = \"a100\"\n".into(), "gpus[0].model: unknown GPU model \"a100\" (known: a100-40gb, a100-80gb)"),
        c("zero GPUs in a group", "[[gpus]]\nmodel = \"a100-40gb\"\ncount = 0\n".into(), "gpus[0].count: 0 is outside 1..=64"),
        c("too many GPUs", "[[gpus]]\nmodel = \"a100-40gb\"\ncount = 65\n".into(), "gpus[0].count: 65 is outside 1..=64"),
        c("sim backend without GPUs", "backend = \"sim\"\n".into(), "gpus: the sim backend needs at least one [[gpus]] entry (model, count)"),
        c("unknown backend", format!("backend = \"cuda\"\n{GPUS}"), "<config>: TOML parse error at line 1, column 11\n  |\n1 | backend = \"cuda\"\n  |           ^^^^^^\nunknown variant `cuda`, expected `sim` or `nvml`"),
        c("request_timeout_s = 0", format!("request_timeout_s = 0\n{GPUS}"), "request_timeout_s: must be at least 1"),
        c("max_message_bytes too small", format!("max_message_bytes = 10\n{GPUS}"), "max_message_bytes: 10 is outside 256..=16777216"),
        c("epoch_s = 0", format!("epoch_s = 0\n{GPUS}"), "epoch_s: must be at least 1"),
        c("unknown policy", format!("policy = \"magic\"\n{GPUS}"), "policy: unknown policy `magic` (known: none, static:<catalog index>, static:<picture>, static:<N>x<layout>+<M>x<layout>..., twice:<hour>=<layout>/<hour>=<layout>, greedy, greedy:window=<s>,init=<index>, rolling-fit, rolling-fit:period=<s>&window=<s>&margin=<x>, e.g. static:0 or static:4444|3333)"),
        c("metrics_listen not host:port", format!("metrics_listen = \"localhost\"\n{GPUS}"), "metrics_listen: \"localhost\" is not host:port (invalid socket address syntax)"),
        c("string for a number", format!("allocate_wait_s = \"ten\"\n{GPUS}"), "<config>: TOML parse error at line 1, column 19\n  |\n1 | allocate_wait_s = \"ten\"\n  |                   ^^^^^\ninvalid type: string \"ten\", expected u64"),
        c("negative number", format!("allocate_wait_s = -1\n{GPUS}"), "<config>: TOML parse error at line 1, column 19\n  |\n1 | allocate_wait_s = -1\n  |                   ^^\ninvalid value: integer `-1`, expected u64"),
        c("slurm.command_timeout_s = 0", format!("{GPUS}[slurm]\ncommand_timeout_s = 0\n"), "slurm.command_timeout_s: must be at least 1"),
        c("unknown injected error", format!("{GPUS}[[sim.inject_errors]]\nop = \"create\"\nerror = \"boom\"\n"), "sim.inject_errors[0].error: unknown error \"boom\" (known: in_use, insufficient_resources, not_supported, no_permission, timeout, other)"),
        c("unknown injected op", format!("{GPUS}[[sim.inject_errors]]\nop = \"explode\"\nerror = \"in_use\"\n"), "sim.inject_errors[0].op: \"explode\" is not create or destroy"),
        c("invalid log_level", format!("log_level = \"smartmig=loud\"\n{GPUS}"), "log_level: \"smartmig=loud\": error parsing level filter: expected one of \"off\", \"error\", \"warn\", \"info\", \"debug\", \"trace\", or a number 0-5"),
    ]
}

fn trace_cases() -> Vec<(
    &'static str,
    &'static str,
    TraceFormat,
    String,
    &'static str,
)> {
    let h = "id,arrival_s,work_s,memory_gb,class\n";
    vec![
        ("trace csv", "not a number", TraceFormat::Csv, format!("{h}a,soon,10,4,training\n"), "line 2: column arrival_s: \"soon\" is not a number"),
        ("trace csv", "missing required column", TraceFormat::Csv, "id,arrival_s,work_s,class\na,0,10,training\n".into(), "csv trace: missing required column(s): memory_gb (header has: id, arrival_s, work_s, class)"),
        ("trace csv", "wrong field count", TraceFormat::Csv, format!("{h}a,0,10\n"), "line 2: expected 5 fields (as in the header), found 3"),
        ("trace csv", "zero work", TraceFormat::Csv, format!("{h}a,0,0,4,training\n"), "line 2: column work_s: 0 is not > 0"),
        ("trace csv", "unknown class", TraceFormat::Csv, format!("{h}a,0,10,4,gaming\n"), "line 2: column class: \"gaming\" is not `training` or `inference`"),
        ("trace csv", "K larger than the GPU", TraceFormat::Csv, "arrival_s,work_s,memory_gb,class,requested_slices\n0,10,4,training,9\n".into(), "line 2: column requested_slices: 9 is not in 1..=7 for a100-40gb"),
        ("trace csv", "empty file", TraceFormat::Csv, String::new(), "the trace is empty (no header line)"),
        ("trace alibaba", "creation_time not a number", TraceFormat::Alibaba, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\np,1,1,1,1000,,LS,Succeeded,x,10,0\n".into(), "line 2: column creation_time: \"x\" is not an integer"),
        ("trace sacct", "bad Elapsed", TraceFormat::Sacct, "JobIDRaw|JobID|JobName|State|Submit|Start|End|Elapsed|Timelimit|ReqTRES|AllocTRES\n1|1|j|COMPLETED|2024-03-01T08:00:00|2024-03-01T08:00:02|2024-03-01T09:00:02|forever|02:00:00|gres/shard=3|gres/shard=3\n".into(), "line 2: column Elapsed: \"forever\" is not a duration like [DD-]HH:MM:SS"),
    ]
}

fn message_cases() -> Vec<Case> {
    let m = |name, line: &str, want| ("socket message", name, line.to_string(), want);
    vec![
        m("not JSON", "hello", "bad_request: not valid JSON: expected value at line 1 column 1"),
        m("JSON array", "[1,2]", "bad_request: a request must be a JSON object"),
        m("missing v", r#"{"op":"status"}"#, "bad_request: missing `v` (protocol version, 1)"),
        m("unknown version", r#"{"v":2,"op":"status"}"#, "unsupported_version: protocol version 2 is not supported (this daemon speaks 1)"),
        m("version as string", r#"{"v":"1","op":"status"}"#, "unsupported_version: protocol version \"1\" is not supported (this daemon speaks 1)"),
        m("unknown op", r#"{"v":1,"op":"format_disk"}"#, "unknown_op: unknown op `format_disk` (known: allocate, release, status, health, reconcile, plan, apply)"),
        m("op not a string", r#"{"v":1,"op":7}"#, "bad_request: `op` must be a string"),
        m("job_id wrong type", r#"{"v":1,"op":"allocate","job_id":"x","uid":0,"gpu":0,"slices":1}"#, "bad_request: invalid request: invalid type: string \"x\", expected u64"),
        m("unknown field", r#"{"v":1,"op":"allocate","job_id":1,"uid":0,"gpu":0,"slices":1,"colour":"red"}"#, "bad_request: invalid request: unknown field `colour`, expected one of `job_id`, `step`, `uid`, `gpu`, `slices`, `memory_gb`, `deadline`, `time_limit_s`, `job_name`, `oom_marker`, `profile`"),
        m("slices out of u8 range", r#"{"v":1,"op":"allocate","job_id":1,"uid":0,"gpu":0,"slices":300}"#, "bad_request: invalid request: invalid value: integer `300`, expected u8"),
        m("missing field", r#"{"v":1,"op":"allocate","job_id":1,"uid":0,"gpu":0}"#, "bad_request: invalid request: missing field `slices`"),
        m("truncated JSON", r#"{"v":1,"op":"allo"#, "bad_request: not valid JSON: EOF while parsing a string at line 1 column 17"),
    ]
}

/// Requests sent to a real daemon: (case, raw bytes, expected `kind: message`).
fn socket_cases() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let mut oversized = br#"{"v":1,"op":"status","pad":""#.to_vec();
    oversized.extend(std::iter::repeat_n(b'x', 2000));
    oversized.extend_from_slice(b"\"}\n");
    vec![
        ("oversized line (2 KB > max_message_bytes 1024)", oversized, "too_large: request line longer than max_message_bytes (1024)"),
        ("truncated line (no newline, peer waits)", br#"{"v":1,"op":"sta"#.to_vec(), "timeout: no complete request line within 2 s"),
        ("K = 8 (> 7 slices)", br#"{"v":1,"op":"allocate","job_id":1,"uid":0,"gpu":0,"slices":8}"#.to_vec(), "invalid_request: GPU 0: 8 compute slices requested but a a100-40gb has only 7"),
        ("K = 0", br#"{"v":1,"op":"allocate","job_id":1,"uid":0,"gpu":0,"slices":0}"#.to_vec(), "invalid_request: GPU 0: a request needs at least one compute slice"),
        ("memory larger than any profile (100 GB on A100-40GB)", br#"{"v":1,"op":"allocate","job_id":1,"uid":0,"gpu":0,"slices":1,"memory_gb":100}"#.to_vec(), "invalid_request: GPU 0: 100 GB of GPU memory requested with 1 compute slices, but the largest a100-40gb profile with at least that many slices has 40 GB"),
        ("negative memory", br#"{"v":1,"op":"allocate","job_id":1,"uid":0,"gpu":0,"slices":1,"memory_gb":-5}"#.to_vec(), "invalid_request: GPU 0: memory need must be a finite, non-negative number of GB (got -5)"),
        ("unknown GPU index", br#"{"v":1,"op":"allocate","job_id":1,"uid":0,"gpu":9,"slices":1}"#.to_vec(), "invalid_request: no GPU 9 on this node (it has 2 GPUs)"),
    ]
}

fn row(rows: &mut Vec<String>, area: &str, case: &str, got: &str) {
    rows.push(format!(
        "| {area} | {case} | `{}` |",
        got.replace('\n', "⏎").replace('|', "\\|")
    ));
}

fn check(failures: &mut Vec<String>, case: &str, got: &str, want: &str) {
    // A trailing `…` marks a prefix (the rest lists every config key, which
    // grows with the config).
    let matches = match want.strip_suffix('…') {
        Some(prefix) => got.starts_with(prefix),
        None => got == want,
    };
    if !want.is_empty() && !matches {
        failures.push(format!("{case}:\n  got  {got:?}\n  want {want:?}"));
    }
    if got.is_empty() || want.is_empty() || got.starts_with("accepted") {
        failures.push(format!("{case}: no error or no expectation ({got:?})"));
    }
}

#[test]
fn every_bad_input_gets_its_exact_error() {
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut n = 0;
    for (area, case, text, want) in config_cases() {
        let got = match Config::parse(&text) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        };
        check(&mut failures, case, &got, want);
        row(&mut rows, area, case, &got);
        n += 1;
    }
    for (area, case, format, text, want) in trace_cases() {
        let got = match read_trace(
            format,
            text.as_bytes(),
            &TraceOptions::new(GpuModel::A100_40gb),
        ) {
            Ok(t) => format!("accepted {} jobs", t.jobs.len()),
            Err(e) => e.to_string(),
        };
        check(&mut failures, case, &got, want);
        row(&mut rows, area, case, &got);
        n += 1;
    }
    for (area, case, line, want) in message_cases() {
        let got = match parse_request(line.as_bytes()) {
            Ok(r) => format!("accepted {r:?}"),
            Err(e) => format!("{}: {}", e.kind, e.message),
        };
        check(&mut failures, case, &got, want);
        row(&mut rows, area, case, &got);
        n += 1;
    }
    let d = TestDaemon::start("badinput", "max_message_bytes = 1024");
    for (case, bytes, want) in socket_cases() {
        let mut s = UnixStream::connect(&d.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&bytes).unwrap();
        if bytes.last() != Some(&b'\n') && !case.starts_with("truncated") {
            s.write_all(b"\n").unwrap();
        }
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let got = if v["ok"] == true {
            format!("accepted {line}")
        } else {
            format!(
                "{}: {}",
                v["error"]["kind"].as_str().unwrap(),
                v["error"]["message"].as_str().unwrap()
            )
        };
        check(&mut failures, case, &got, want);
        row(&mut rows, "socket / request", case, &got);
        n += 1;
    }
    // The daemon survived every case and still serves.
    d.client().health().unwrap();
    println!("| area | case | exact error |\n|---|---|---|");
    for r in &rows {
        println!("{r}");
    }
    assert!(n >= 30, "only {n} cases");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
