//! The daemon's life: start, bind the sockets, run the loops (epochs,
//! memory samples, the metrics endpoint), accept connections until
//! SIGTERM/SIGINT (SIGHUP reloads), then shut down cleanly.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::task::JoinSet;

use super::context::Daemon;
use super::http::serve_metrics;
use super::start::{io_err, StartError};
use super::transport::{bind_socket, raise_open_files_limit, serve_connection};
use super::{epoch, gpu_order, holds, panic, queue, sample, xid};
use crate::config::Config;

/// Runs the daemon until SIGTERM/SIGINT.
pub async fn run(config: Config, config_path: PathBuf) -> Result<(), StartError> {
    let socket = config.socket.clone();
    let metrics_listen = config.metrics_listen.clone();
    let daemon = Daemon::start(config, config_path)?;
    epoch::install_initial_layouts(&daemon.cx()).await;
    let mut signals = Signals::new()?;
    raise_open_files_limit();
    let public = bind_socket(&socket, 0o666, None)?;
    let admin_socket = daemon.settings.current().config.admin_socket();
    let admin_owner = daemon
        .settings
        .current()
        .roles
        .slurm_uid
        .filter(|&u| u != 0);
    let admin = bind_socket(&admin_socket, 0o600, admin_owner)?;
    if let Some(addr) = metrics_listen {
        let l = TcpListener::bind(&addr)
            .await
            .map_err(io_err(Path::new(&addr)))?;
        tracing::info!(%addr, "serving Prometheus metrics on /metrics");
        tokio::spawn(serve_metrics(daemon.clone(), l));
    }
    spawn_loops(&daemon);
    announce(&daemon, &socket, &admin_socket).await;
    let mut connections = JoinSet::new();
    let listeners = Listeners {
        admin,
        admin_socket: &admin_socket,
        public,
    };
    accept(&daemon, &mut signals, &listeners, &mut connections).await;
    // Stop accepting, let in-flight requests finish, remove the socket.
    drop(listeners);
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(&admin_socket);
    shut_down(&daemon, connections).await;
    Ok(())
}

/// The root-only socket (and its path, for the log) and the public one.
struct Listeners<'a> {
    admin: UnixListener,
    admin_socket: &'a Path,
    public: UnixListener,
}

struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    fn new() -> Result<Signals, StartError> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).map_err(io_err(Path::new("SIGTERM")))?,
            int: signal(SignalKind::interrupt()).map_err(io_err(Path::new("SIGINT")))?,
            hup: signal(SignalKind::hangup()).map_err(io_err(Path::new("SIGHUP")))?,
        })
    }
}

/// Starts the repartitioning loop and, on backends that measure memory
/// (NVML gives current use only), the memory sampler. A panic in one round
/// is logged and counted, and the loop goes on.
fn spawn_loops(daemon: &Arc<Daemon>) {
    every(
        daemon,
        "epoch",
        |d| d.settings.current().config.epoch_s,
        |d| async move {
            epoch::run_once(&d.cx()).await;
        },
    );
    spawn_hold_sync(daemon);
    holds::log_decision(&daemon.cx(), "at start");
    gpu_order::spawn_retry(daemon);
    if let Some(watch) = daemon.svc.backend.xid_watch() {
        xid::spawn(daemon, watch);
    }
    if daemon.svc.backend.measures_memory() {
        every(
            daemon,
            "memory_sample",
            |d| d.settings.current().config.memory.sample_s,
            |d| async move { sample::sample_memory(&d.cx()).await },
        );
    }
}

/// Syncs the holds on stranded shards each time an allocate asks for it
/// ([`super::books::Books::want_holds`]), until shutdown.
fn spawn_hold_sync(daemon: &Arc<Daemon>) {
    let daemon = daemon.clone();
    let mut stop = daemon.node.shutdown.subscribe();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = daemon.books.holds_wanted() => {}
                _ = stop.changed() => break,
            }
            let span = tracing::info_span!("loop", task = "holds");
            let done = tracing::Instrument::instrument(
                panic::catch(async {
                    holds::sync(&daemon.cx()).await;
                }),
                span,
            );
            if let Err(message) = done.await {
                daemon.svc.metrics.panic("holds");
                tracing::error!("panic in the holds loop: {message}; the loop goes on");
            }
        }
    });
}

/// Runs `round` every `period(daemon)` seconds until shutdown; a round that
/// panics is logged and counted in `smartmig_panics_total{task}`.
fn every<F, Fut>(daemon: &Arc<Daemon>, task: &'static str, period: fn(&Daemon) -> u64, round: F)
where
    F: Fn(Arc<Daemon>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let daemon = daemon.clone();
    let mut stop = daemon.node.shutdown.subscribe();
    tokio::spawn(async move {
        loop {
            let wait = Duration::from_secs(period(&daemon));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.changed() => break,
            }
            let span = tracing::info_span!("loop", task);
            let done = tracing::Instrument::instrument(panic::catch(round(daemon.clone())), span);
            if let Err(message) = done.await {
                daemon.svc.metrics.panic(task);
                tracing::error!(
                    task,
                    "panic in the {task} loop: {message}; the loop goes on"
                );
            }
        }
    });
}

/// The start-up log lines, and a node the plugin drained is resumed.
async fn announce(daemon: &Daemon, socket: &Path, admin_socket: &Path) {
    let cx = daemon.cx();
    for w in cx.cfg().warnings() {
        tracing::warn!("{w}");
    }
    tracing::info!(socket = %socket.display(), admin_socket = %admin_socket.display(),
        backend = cx.svc.backend.name(), gpus = cx.books.gpus.len(),
        policy = %cx.decider.policy_name, placement = %cx.decider.placement_name(), "smartmigd ready");
    if cx.cfg().slurm.enabled {
        if let Some(info) = queue::node(&cx).await {
            xid::resume_if_drained_by_us(&cx, &info).await;
        }
    }
}

/// Accepts connections until SIGTERM/SIGINT, reloading at SIGHUP. Polled
/// in this order: signals, then the root-only socket (a crowd on the
/// public one must not delay a job start), then finished connections,
/// then the public socket.
async fn accept(
    daemon: &Arc<Daemon>,
    signals: &mut Signals,
    listeners: &Listeners<'_>,
    connections: &mut JoinSet<()>,
) {
    loop {
        tokio::select! {
            biased;
            _ = signals.term.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
            _ = signals.int.recv() => { tracing::info!("SIGINT: shutting down"); break; }
            _ = signals.hup.recv() => daemon.reload().await,
            accepted = listeners.admin.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(daemon.clone(), stream));
                }
                Err(e) => {
                    tracing::warn!(socket = %listeners.admin_socket.display(), "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(done) = connections.join_next(), if !connections.is_empty() => {
                if let Err(e) = done {
                    finished_badly(daemon, &e);
                }
            }
            accepted = listeners.public.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(daemon.clone(), stream));
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// A connection task that ended with a panic outside any request (a
/// request's own panic is answered in [`Daemon::handle_line`]): logged and
/// counted, where `join_next` used to drop it silently.
fn finished_badly(daemon: &Daemon, e: &tokio::task::JoinError) {
    if e.is_panic() {
        daemon.svc.metrics.panic("connection");
        tracing::error!("a connection's task panicked: {e}; the connection was dropped");
    }
}

/// Lets in-flight requests finish (waiting allocates get
/// `shutting_down`), writes the journal and the memory estimates once
/// more.
async fn shut_down(daemon: &Daemon, mut connections: JoinSet<()>) {
    let _ = daemon.node.shutdown.send(true);
    let grace = Duration::from_secs(daemon.settings.current().config.request_timeout_s + 5);
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "in-flight requests did not finish within {} s; aborting them",
            grace.as_secs()
        );
        connections.abort_all();
    }
    // Every change was journaled as it happened; write once more for good measure.
    for gpu in &daemon.books.gpus {
        let st = gpu.tx().await;
        if let Err(e) = daemon.svc.journal.save(&st.book) {
            tracing::error!(gpu = gpu.index, "final journal write failed: {e}");
        }
    }
    // The memory estimates are saved after each reply that changed them;
    // save them once more in case the last of those writes was still queued.
    if let Err(e) = daemon.books.memory(|m| m.save()) {
        tracing::error!("final memory estimates write failed: {e}");
    }
    tracing::info!("smartmigd stopped");
}
