//! The Prometheus endpoint: a minimal HTTP/1.1 listener that answers
//! `GET /metrics` (and 404 otherwise).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::context::{Cx, Daemon};
use crate::metrics::{MigInstance, Scrape};
use crate::mig::{select_profile, Geometry, ProfileSpec};

/// A minimal HTTP/1.1 responder for `GET /metrics` (one path, no keep-alive).
pub(super) async fn serve_metrics(daemon: Arc<Daemon>, listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let daemon = daemon.clone();
        tokio::spawn(async move {
            let mut head = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            let read_head = async {
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
            };
            if tokio::time::timeout(Duration::from_secs(5), read_head)
                .await
                .is_err()
            {
                return;
            }
            let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
            let first = String::from_utf8_lossy(first);
            let mut parts = first.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let response = if method == "GET"
                && (path == "/metrics" || path.starts_with("/metrics?"))
            {
                let body = metrics_text(&daemon.cx()).await;
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                let body = "only GET /metrics is served here\n";
                format!(
                    "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// The Prometheus text: the counters as they stand, the scrape-time
/// gauges from the books now (each GPU's lock in turn, then the ledger).
async fn metrics_text(cx: &Cx<'_>) -> String {
    let mut now = Scrape {
        epilog_missing: cx.books.node(|l| l.releases.epilog_missing()),
        hostname: nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default(),
        policy: (cx.cfg().policy.clone(), cx.decider.policy_name.clone()),
        running: running_policies(cx),
        ..Scrape::default()
    };
    let mut layouts = Vec::new();
    for gpu in &cx.books.gpus {
        let mut st = gpu.tx().await;
        let modelled = st.tick_energy();
        let g = st.book.geometry;
        for i in &st.book.instances {
            let p = g.spot(i.placement);
            now.instances.push(MigInstance {
                gpu: gpu.index,
                gpu_uuid: gpu.uuid.clone().unwrap_or_default(),
                profile: p.profile.name(),
                gi: i.gi,
                job: i.job.as_ref().map(|a| a.job_id),
                compute: p.compute(),
                healthy: st.book.health.instance_ok(&i.uuid),
            });
        }
        now.gpus_healthy.push((
            gpu.index,
            gpu.uuid.clone().unwrap_or_default(),
            st.book.health.usable(),
        ));
        layouts.push((gpu.index, g, st.book.layout()));
        now.energy.push((
            gpu.index,
            cx.svc.backend.energy_j(gpu.index).unwrap_or(modelled),
        ));
    }
    let (waiting, largest) = waiting_profiles(cx);
    now.waiting = waiting;
    now.fragmentation = layouts
        .into_iter()
        .map(|(index, g, layout)| {
            let stranded = largest
                .get(&index)
                .map_or(0, |p| g.stranded_compute(layout, p.shape));
            (index, i64::from(stranded))
        })
        .collect();
    cx.svc.metrics.render(&now)
}

/// The allocates waiting for room, counted by the profile each would get,
/// and the largest (most compute slices) waiting on each GPU.
fn waiting_profiles(cx: &Cx<'_>) -> (Vec<(String, i64)>, HashMap<u32, &'static ProfileSpec>) {
    cx.books.node(|ledger| {
        let mut counts: HashMap<String, i64> = HashMap::new();
        let mut largest: HashMap<u32, &'static ProfileSpec> = HashMap::new();
        for w in ledger.waiting.values() {
            let Some(gpu) = cx.books.gpu(w.gpu) else {
                continue;
            };
            let need = w.contender.need;
            let profile = match w.contender.exact {
                Some(p) => p,
                None => {
                    match select_profile(Geometry::of(gpu.model).spec, need.slices, need.memory_gb)
                    {
                        Ok(p) => p,
                        Err(_) => continue,
                    }
                }
            };
            *counts.entry(profile.name()).or_default() += 1;
            let top = largest.entry(w.gpu).or_insert(profile);
            if profile.shape.compute > top.shape.compute {
                *top = profile;
            }
        }
        let mut waiting: Vec<(String, i64)> = counts.into_iter().collect();
        waiting.sort();
        (waiting, largest)
    })
}

/// `(role, name, runs)` of the configured policy and, while the shadow is
/// on, its fallback.
fn running_policies(cx: &Cx<'_>) -> Vec<(String, String, bool)> {
    let fallback_runs = cx.books.shadow.fallback_runs(cx.cfg());
    let mut out = vec![(
        "learned".to_string(),
        cx.decider.policy_name.clone(),
        !fallback_runs,
    )];
    if let Some((_, name)) = &cx.decider.fallback {
        out.push(("fallback".to_string(), name.clone(), fallback_runs));
    }
    out
}
