//! The Grafana dashboard (`etc/grafana/smartmig-dashboard.json`, issue 44)
//! against a real Prometheus: Debian's `prometheus` package scrapes a real
//! smartmigd (sim backend, or the NVML emulator with
//! `SMARTMIG_TEST_BACKEND=nvml`) every second while it serves jobs over its
//! Unix socket, and every PromQL expression of the dashboard, and every
//! template variable's query, returns data through Prometheus's HTTP API.

use crate::daemon_common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::daemon_common::{free_port, req, TestDaemon, Wait};
use smartmig::daemon::protocol::{AllocateReply, ReleaseRequest};
use smartmig::daemon::ClientError;

/// Debian's `prometheus` package puts it here (scripts/test installs it).
const PROMETHEUS: &str = "/usr/bin/prometheus";

fn dashboard_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/grafana/smartmig-dashboard.json")
}

/// `GET path` on 127.0.0.1:`port` as HTTP/1.0 (so the answer is neither
/// chunked nor kept alive): the status code and the body.
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// `s` percent-encoded for a URL's query string.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server on a free port with its own storage, scraping
/// smartmigd's `/metrics` every second; killed on drop.
struct Prometheus {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Prometheus {
    fn start(dir: &Path, target_port: u16) -> Prometheus {
        assert!(
            Path::new(PROMETHEUS).is_file(),
            "{PROMETHEUS} is missing: install Debian's `prometheus` package \
             (apt-get install --no-install-recommends prometheus; scripts/test installs it)"
        );
        let dir = dir.join("prometheus");
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: smartmig\n    static_configs:\n\
                 \x20     - targets: [\"127.0.0.1:{target_port}\"]\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {PROMETHEUS}: {e}"));
        let mut p = Prometheus { child, dir, port };
        p.wait_ready();
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    fn wait_ready(&mut self) {
        let log_path = self.dir.join("prometheus.log");
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        let (child, port) = (&mut self.child, self.port);
        Wait::new("prometheus to be ready", Duration::from_secs(30))
            .context(log)
            .until(|| {
                if let Some(st) = child.try_wait().unwrap() {
                    panic!("prometheus exited with {st}:\n{}", log());
                }
                match http_get(port, "/-/ready") {
                    Ok((200, _)) => Ok(()),
                    seen => Err(seen),
                }
            });
    }

    /// `/api/v1/query?query=expr` (evaluated now): the parsed answer.
    fn query(&self, expr: &str) -> serde_json::Value {
        let path = format!("/api/v1/query?query={}", url_encode(expr));
        let (status, body) = http_get(self.port, &path)
            .unwrap_or_else(|e| panic!("query {expr}: {e}\n{}", self.log()));
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("query {expr}: HTTP {status}, not JSON ({e}): {body}"))
    }

    /// The values of an instant query's samples (empty: no series).
    fn values(&self, expr: &str) -> Result<Vec<f64>, String> {
        let v = self.query(expr);
        if v["status"] != "success" {
            return Err(format!("status {}: {}", v["status"], v["error"]));
        }
        let result = v["data"]["result"]
            .as_array()
            .ok_or_else(|| format!("no vector result: {v}"))?;
        Ok(result
            .iter()
            .map(|s| {
                s["value"][1]
                    .as_str()
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(f64::NAN)
            })
            .collect())
    }

    /// Polls until `expr` has a sample equal to `want`; fails after 30 s.
    fn wait_for(&self, expr: &str, want: f64) {
        Wait::new(
            format!("{expr} == {want} in Prometheus"),
            Duration::from_secs(30),
        )
        .every(Duration::from_millis(200))
        .context(|| self.log())
        .until(|| match self.values(expr) {
            Ok(v) if v.contains(&want) => Ok(()),
            seen => Err(seen),
        });
    }

    /// Scrapes of smartmigd Prometheus has stored (samples of `up`).
    fn scrapes(&self) -> Result<f64, String> {
        self.values("count_over_time(up{job=\"smartmig\"}[1h])")
            .map(|v| v.first().copied().unwrap_or(0.0))
    }

    /// Waits until Prometheus has scraped smartmigd `n` more times.
    fn wait_scrapes(&self, n: u32) {
        let before = self.scrapes().unwrap_or(0.0);
        Wait::new(
            format!("{n} more scrapes than {before}"),
            Duration::from_secs(60),
        )
        .every(Duration::from_millis(200))
        .context(|| self.log())
        .until(|| match self.scrapes() {
            Ok(k) if k >= before + f64::from(n) => Ok(()),
            seen => Err(seen),
        });
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("prometheus log:\n{}", self.log());
        }
    }
}

/// Every PromQL expression of the dashboard with where it is: the panels'
/// targets (rows' nested panels included) and the template variables'
/// `label_values(EXPR, LABEL)` queries, as `count by (LABEL) (EXPR)`.
fn expressions(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("(untitled)");
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap_or_else(|| {
                    panic!("panel {title:?}: a target without a PromQL expr: {t}")
                });
                out.push((format!("panel {title:?}"), expr.to_string()));
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let name = v["name"].as_str().unwrap_or("?");
        let q = v["definition"].as_str().unwrap_or("");
        let (expr, label) = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|r| r.rsplit_once(','))
            .unwrap_or_else(|| panic!("variable {name}: not label_values(EXPR, LABEL): {q}"));
        out.push((
            format!("variable {name:?}"),
            format!("count by ({}) ({expr})", label.trim()),
        ));
    }
    out
}

/// `expr` with Grafana's variables replaced: `$node` and `$gpu` by
/// `node` and `gpu` (regexes), the intervals by ones that hold several
/// 1 s scrapes. Fails on a variable it does not know.
fn concrete(expr: &str, node: &str, gpu: &str) -> String {
    let mut e = expr.to_string();
    for (var, value) in [
        ("${node}", node),
        ("$node", node),
        ("${gpu}", gpu),
        ("$gpu", gpu),
        ("$__rate_interval", "2m"),
        ("$__range", "5m"),
        ("$__interval_ms", "1000"),
        ("$__interval", "1s"),
    ] {
        e = e.replace(var, value);
    }
    let unknown = e
        .match_indices('$')
        .map(|(i, _)| &e[i..])
        .find(|rest| !rest[1..].starts_with(|c: char| c.is_ascii_digit()));
    assert!(
        unknown.is_none(),
        "{expr}: a template variable the test does not know: {unknown:?}"
    );
    e
}

fn release(job_id: u64, oom: bool) -> ReleaseRequest {
    ReleaseRequest {
        job_id,
        oom,
        used_memory_gb: None,
        from_epilog: false,
    }
}

/// Serves jobs while Prometheus scrapes, spaced by two scrapes so that
/// counters and histograms rise between samples: creates and destroys on
/// GPU 1, a normal and an out-of-memory release; leaves job 4501 busy on
/// GPU 0 and a 7g allocate (job 4599) waiting behind it. Returns the waiter.
fn serve_jobs(
    d: &TestDaemon,
    prom: &Prometheus,
) -> std::thread::JoinHandle<Result<AllocateReply, ClientError>> {
    let pause = || prom.wait_scrapes(2);
    let c = d.client();
    c.allocate(req(4501, 0, 1, None)).unwrap();
    pause();
    c.allocate(req(4502, 1, 3, None)).unwrap();
    c.allocate(req(4503, 1, 2, None)).unwrap();
    c.release_with(release(4502, false)).unwrap();
    c.release_with(release(4503, true)).unwrap();
    pause();
    // The 7g needs GPU 1 empty: the idle 3g and 2g are destroyed.
    c.allocate(req(4504, 1, 7, None)).unwrap();
    c.release_with(release(4504, false)).unwrap();
    pause();
    c.allocate(req(4505, 1, 1, None)).unwrap();
    c.release_with(release(4505, false)).unwrap();
    let c = d.client();
    std::thread::spawn(move || c.allocate(req(4599, 0, 7, None)))
}

#[test]
fn every_dashboard_expression_returns_data_from_a_real_prometheus() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dashboard_path()).expect("read the dashboard JSON"),
    )
    .expect("the dashboard is JSON");
    let exprs = expressions(&dashboard);
    assert!(exprs.len() >= 15, "{exprs:?}");

    let metrics_port = free_port();
    let d = TestDaemon::start_with("dashboard", |dir| {
        // A learned policy whose file is missing: greedy runs (it
        // reconfigures), and the fallback shows in smartmig_policy_info.
        daemon_common::base_config(
            dir,
            &format!(
                "metrics_listen = \"127.0.0.1:{metrics_port}\"\npolicy = \"policy:{}\"\n\
                 [oom]\nrequeue = false\n",
                dir.join("missing.onnx").display()
            ),
        )
        .replace("allocate_wait_s = 1\n", "allocate_wait_s = 120\n")
        .replace("epoch_s = 3600\n", "epoch_s = 1\n")
    });
    let prom = Prometheus::start(&d.dir, metrics_port);
    prom.wait_for("up{job=\"smartmig\"}", 1.0);

    let waiter = serve_jobs(&d, &prom);
    prom.wait_for("sum(smartmig_waiting_allocations)", 1.0);
    // A few more scrapes with the last state.
    prom.wait_scrapes(3);

    let node = format!("127\\\\.0\\\\.0\\\\.1:{metrics_port}");
    let mut failures = Vec::new();
    let mut checked = 0;
    for (place, expr) in &exprs {
        for (n, g) in [(".*", ".*"), (node.as_str(), "0")] {
            let q = concrete(expr, n, g);
            checked += 1;
            match prom.values(&q) {
                Err(e) => failures.push(format!("{place}: {q}\n    {e}")),
                Ok(v) if v.is_empty() => failures.push(format!("{place}: {q}\n    no series")),
                Ok(v) if !v.iter().any(|x| x.is_finite()) => {
                    failures.push(format!("{place}: {q}\n    only NaN/Inf: {v:?}"));
                }
                Ok(_) => {}
            }
        }
    }
    println!(
        "{} dashboard expressions ({} queries with node/gpu = all and = this daemon/GPU 0) \
         checked against {PROMETHEUS}",
        exprs.len(),
        checked
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} dashboard queries returned no data:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // The waiter is served once job 4501 goes.
    d.client().release(4501).unwrap();
    assert_eq!(waiter.join().unwrap().unwrap().profile, "7g.40gb");
}
