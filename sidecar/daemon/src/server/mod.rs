//! The imperative shell of smartmigd: sockets, peer credentials, the
//! request handlers, the epoch loop and signals. Decisions come from
//! [`crate::allocate`], [`crate::placement`] and [`crate::policy`]; this
//! module carries them out. It is layered, and each layer calls only the
//! ones below it (docs/architecture.md, "The daemon's concurrency"):
//!
//! 1. **Transport and dispatch**: this file (a request line in, a reply
//!    line out, a tracing span per request, a panic answered
//!    `internal`), [`transport`] (the sockets, one connection's requests),
//!    [`http`] (the Prometheus endpoint); start-up [`start`], the loops
//!    and shutdown [`run`], SIGHUP [`reload`].
//! 2. **One handler per request kind** ([`handle`]: allocate, release,
//!    status, reconcile, plan, apply, health) and **the epoch loop**
//!    ([`epoch`], with its steps [`view`], [`advise`]) and the memory
//!    sampler ([`sample`]). Handlers never call each other.
//! 3. **Shared operations**: changing one GPU's instances
//!    ([`instances`]), where the queue comes from ([`queue`]), releasing
//!    what ended jobs hold ([`reap`]), out-of-memory requeues
//!    ([`requeue`]), room for an interactive step ([`room`]), what
//!    `status` shows to whom ([`redact`]), XIDs and the node's drain
//!    ([`xid`]), holds ([`holds`]), the shadow ([`shadow`]), Slurm's GPU
//!    order ([`gpu_order`]), one job's record ([`job_record`]).
//! 4. **The bottom**: the node's books ([`books`]: every piece of mutable
//!    node state and every lock, behind doors that keep the lock order),
//!    the services ([`services`]: I/O handles only), the settings in
//!    effect ([`live`]), roles and connection caps ([`auth`]), what a
//!    request works with ([`context`]: [`Cx`], [`Daemon`], `NodeId`,
//!    `Peer`), the clock ([`clock`]) and [`panic`].
//!
//! A handler gets a [`Cx`]: the books, the services and one snapshot of
//! the settings taken for the whole request.

use tracing::field::Empty;
use tracing::Instrument;

use super::metrics::Metrics;
use super::protocol::{error_line, parse_request, ErrorBody, ErrorKind, Request};

mod advise;
mod auth;
mod books;
mod clock;
mod context;
mod epoch;
mod gpu_order;
mod handle;
mod holds;
mod http;
mod instances;
mod job_record;
mod live;
mod panic;
mod queue;
mod reap;
pub mod redact;
mod reload;
mod requeue;
mod room;
mod run;
mod sample;
mod services;
mod shadow;
mod start;
mod transport;
mod view;
mod xid;

pub use run::run;
pub use start::StartError;
pub use transport::raise_open_files_limit;

pub use context::Daemon;
use context::{Cx, Peer};

impl Daemon {
    /// Handles one request line from `peer`; returns the reply line and
    /// whether to close the connection. Runs in a span naming the request
    /// (op, job, step, GPU, uid); a panic while serving it is logged with
    /// the request, counted (`smartmig_panics_total`) and answered with an
    /// `internal` error on a connection that stays open.
    async fn handle_line(&self, line: &[u8], peer: Peer) -> (String, bool) {
        let request = match parse_request(line) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(uid = peer.uid, pid = ?peer.pid, kind = %e.kind, "bad request: {}", e.message);
                self.svc.metrics.failure(e.kind.as_str());
                return (error_line(&e), true);
            }
        };
        let span = request_span(&request, peer.uid);
        let cx = self.cx();
        async {
            if let Some(refusal) = refuse_write(&cx, &request, peer) {
                return (error_line(&refusal), true);
            }
            let op = request.op();
            match panic::catch(handle::dispatch(&cx, request, peer.uid)).await {
                Ok(Ok(reply)) => (reply, false),
                Ok(Err(e)) => {
                    self.svc.metrics.failure(e.kind.as_str());
                    (error_line(&e), false)
                }
                Err(panicked) => (
                    answer_panic(&self.svc.metrics, op, line, &panicked.0),
                    false,
                ),
            }
        }
        .instrument(span)
        .await
    }
}

/// The span every request runs in: its op and the peer's uid, and for an
/// allocate the job, step, GPU and the job's uid (a release: the job).
fn request_span(request: &Request, peer: u32) -> tracing::Span {
    let span = tracing::info_span!(
        "request",
        op = request.op(),
        peer,
        job = Empty,
        step = Empty,
        gpu = Empty,
        uid = Empty,
        plan = Empty
    );
    match request {
        Request::Allocate(r) => {
            span.record("job", r.job_id);
            if let Some(step) = r.step {
                // As the plugin logs it in slurmd.log (the batch step is
                // 0xfffffffb).
                span.record("step", tracing::field::display(format_args!("{step:#x}")));
            }
            span.record("gpu", r.gpu);
            span.record("uid", r.uid);
        }
        Request::Release(r) => {
            span.record("job", r.job_id);
        }
        Request::Apply(r) => {
            span.record("plan", r.plan);
        }
        Request::Status | Request::Health | Request::Reconcile | Request::Plan => {}
    }
    span
}

/// A write (allocate, release, reconcile, apply) from a uid other than
/// root and `slurm_user`: logged, counted, and the refusal to send.
fn refuse_write(cx: &Cx<'_>, request: &Request, peer: Peer) -> Option<ErrorBody> {
    if !request.is_write() || cx.live.roles.may_write(peer.uid) {
        return None;
    }
    let slurm_user = &cx.cfg().slurm_user;
    tracing::warn!(
        uid = peer.uid,
        pid = ?peer.pid,
        op = request.op(),
        "refused: only root and slurm_user `{slurm_user}` may {}",
        request.op()
    );
    cx.svc.metrics.failure(ErrorKind::Unauthorized.as_str());
    Some(ErrorBody::new(
        ErrorKind::Unauthorized,
        format!(
            "uid {} may not {}: only root and the Slurm user ({slurm_user}) may allocate or release",
            peer.uid,
            request.op(),
        ),
    ))
}

/// The reply to a request whose handler panicked, after logging the panic
/// with the request (at most 1 KiB of it) and counting it. The reply does
/// not carry the panic's text: it may name other users' jobs.
fn answer_panic(metrics: &Metrics, op: &'static str, line: &[u8], message: &str) -> String {
    metrics.panic(op);
    metrics.failure(ErrorKind::Internal.as_str());
    let shown = String::from_utf8_lossy(&line[..line.len().min(1024)]);
    tracing::error!(op, request = %shown, "panic while serving a request: {message}; answered with an internal error");
    error_line(&ErrorBody::new(
        ErrorKind::Internal,
        format!("smartmigd hit an internal error while serving `{op}` (a bug, logged with the request); the daemon keeps running"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handler that panics is answered with `internal` (not a dropped
    /// connection), counted by op in `smartmig_panics_total`, and the
    /// connection stays open; the panic's text stays in the log.
    #[test]
    fn a_panicking_handler_is_answered_counted_and_logged() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let caught = rt.block_on(panic::catch(async {
            if std::hint::black_box(true) {
                panic!("job 17 broke an invariant");
            }
            1
        }));
        let message = caught.expect_err("the panic is caught");
        assert!(message.0.contains("job 17 broke an invariant"), "{message}");
        let metrics = Metrics::new();
        let line = answer_panic(&metrics, "status", br#"{"v":1,"op":"status"}"#, &message.0);
        let reply: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(reply["ok"], false, "{line}");
        assert_eq!(reply["error"]["kind"], "internal", "{line}");
        assert!(
            !line.contains("job 17"),
            "the reply leaks the panic: {line}"
        );
        let text = metrics.render(&crate::metrics::Scrape::default());
        assert!(
            text.contains("smartmig_panics_total{task=\"status\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("smartmig_failures_total{kind=\"internal\"} 1"),
            "{text}"
        );
    }
}
