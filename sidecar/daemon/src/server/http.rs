//! The Prometheus endpoint: a minimal HTTP/1.1 listener that answers
//! `GET /metrics` (and 404 otherwise).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{Cx, Daemon};
use crate::metrics::InstanceCount;

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

/// The Prometheus text: the counters as they stand, the instance and
/// energy gauges from the books now.
async fn metrics_text(cx: &Cx<'_>) -> String {
    let mut counts: HashMap<(u32, String, bool), i64> = HashMap::new();
    let mut energy = Vec::new();
    for gpu in &cx.books.gpus {
        let mut st = gpu.state.lock().await;
        let modelled = st.tick_energy();
        for i in &st.book.instances {
            let name = st.book.geometry.placement(i.placement).profile.name();
            *counts
                .entry((gpu.index, name, i.job.is_some()))
                .or_default() += 1;
        }
        energy.push((
            gpu.index,
            cx.svc.backend.energy_j(gpu.index).unwrap_or(modelled),
        ));
    }
    let mut list: Vec<InstanceCount> = counts
        .into_iter()
        .map(|((gpu, profile, busy), count)| InstanceCount {
            gpu,
            profile,
            busy,
            count,
        })
        .collect();
    list.sort_by(|a, b| (a.gpu, &a.profile, a.busy).cmp(&(b.gpu, &b.profile, b.busy)));
    let epilog_missing = cx.books.ledger().releases.epilog_missing();
    cx.svc.metrics.render(&list, &energy, epilog_missing)
}
