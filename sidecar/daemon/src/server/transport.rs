//! The sockets and one connection's life: newline-delimited requests read
//! within `request_timeout_s` and `max_message_bytes`, each answered by
//! [`Daemon::handle_line`], until EOF, an error, a timeout or shutdown
//! (docs/protocol.md).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedReadHalf;
use tokio::net::{UnixListener, UnixStream};

use super::context::{Daemon, Peer};
use super::start::{io_err, StartError};
use crate::fsutil::ensure_dir;
use crate::protocol::{error_line, ErrorBody, ErrorKind};

/// Binds a socket: parent dir created 0755 if missing, a stale socket
/// file removed (a live one means another daemon: refuse), then `mode` and
/// `owner`: 0666 for the public socket (status is public; writes are
/// checked with SO_PEERCRED), 0600 owned by `slurm_user` for the root-only
/// one.
pub(super) fn bind_socket(
    path: &Path,
    mode: u32,
    owner: Option<u32>,
) -> Result<UnixListener, StartError> {
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            ensure_dir(dir, 0o755).map_err(io_err(dir))?;
        }
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(StartError::AlreadyRunning(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(io_err(path))?;
    }
    let listener = UnixListener::bind(path).map_err(io_err(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err(path))?;
    if let Some(uid) = owner {
        std::os::unix::fs::chown(path, Some(uid), None).map_err(io_err(path))?;
    }
    Ok(listener)
}

/// Raises the soft limit of open files to the hard one (systemd's
/// `LimitNOFILE`), so that connections, not descriptors, run out first
/// (also used by `smartmig bench flood`, which holds thousands).
pub fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "raised the open files limit"),
            Err(e) => tracing::warn!(soft, hard, "cannot raise the open files limit: {e}"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot read the open files limit: {e}"),
    }
}

/// Serves one connection: requests one per line until EOF, an error, a
/// timeout or shutdown. An unprivileged peer over its connection caps is
/// answered `too_many_connections` and the connection closed.
pub(super) async fn serve_connection(daemon: Arc<Daemon>, mut stream: UnixStream) {
    let peer = match stream.peer_cred() {
        Ok(c) => Peer {
            uid: c.uid(),
            pid: c.pid(),
        },
        Err(e) => {
            tracing::warn!("cannot read peer credentials ({e}); closing");
            return;
        }
    };
    let live = daemon.settings.current();
    let admitted = match daemon
        .books
        .connections
        .admit(peer.uid, &live.roles, &live.config)
    {
        Ok(a) => a,
        Err(why) => {
            daemon
                .svc
                .metrics
                .failure(ErrorKind::TooManyConnections.as_str());
            tracing::debug!(uid = peer.uid, pid = ?peer.pid, "connection refused: {why}");
            let e = ErrorBody::new(ErrorKind::TooManyConnections, why);
            // Best effort and bounded: the caller may not be reading.
            let _ = tokio::time::timeout(
                Duration::from_millis(100),
                stream.write_all(error_line(&e).as_bytes()),
            )
            .await;
            return;
        }
    };
    drop(live);
    serve_requests(&daemon, peer, stream).await;
    drop(admitted);
}

/// What reading one request line gave.
enum Line {
    /// A complete line (without its `\n` / `\r\n`), or the bytes before EOF.
    Request(Vec<u8>),
    /// Only whitespace: skipped.
    Blank,
    /// Nothing more to read: EOF, a read error, an idle keep-alive
    /// connection that timed out, or shutdown.
    Done,
    /// Part of a line, then no more within `request_timeout_s`.
    Timeout,
    /// Longer than `max_message_bytes`.
    TooLarge,
}

/// Answers the requests of one connection, in order.
async fn serve_requests(daemon: &Arc<Daemon>, peer: Peer, stream: UnixStream) {
    let mut shutdown = daemon.node.shutdown.subscribe();
    let (rd, mut wr) = stream.into_split();
    let mut reader = BufReader::new(rd);
    loop {
        let cfg = daemon.settings.current().config.clone();
        let line = tokio::select! {
            l = read_line(&mut reader, cfg.max_message_bytes, cfg.request_timeout_s, peer) => l,
            _ = shutdown.changed() => Line::Done,
        };
        let (reply, close) = match line {
            Line::Request(buf) => daemon.handle_line(&buf, peer).await,
            Line::Blank => continue,
            Line::Done => break,
            Line::Timeout => closing(
                daemon,
                ErrorKind::Timeout,
                format!(
                    "no complete request line within {} s",
                    cfg.request_timeout_s
                ),
            ),
            Line::TooLarge => closing(
                daemon,
                ErrorKind::TooLarge,
                format!(
                    "request line longer than max_message_bytes ({})",
                    cfg.max_message_bytes
                ),
            ),
        };
        if wr.write_all(reply.as_bytes()).await.is_err() || close {
            break;
        }
    }
    let _ = wr.shutdown().await;
}

/// The error that closes a connection, counted.
fn closing(daemon: &Daemon, kind: ErrorKind, message: String) -> (String, bool) {
    daemon.svc.metrics.failure(kind.as_str());
    (error_line(&ErrorBody::new(kind, message)), true)
}

/// Reads one request line of at most `max` bytes within `timeout_s`.
async fn read_line(
    reader: &mut BufReader<OwnedReadHalf>,
    max: usize,
    timeout_s: u64,
    peer: Peer,
) -> Line {
    let mut buf = Vec::new();
    let read = async {
        let mut limited = (&mut *reader).take(max as u64 + 1);
        limited.read_until(b'\n', &mut buf).await
    };
    match tokio::time::timeout(Duration::from_secs(timeout_s), read).await {
        // An idle keep-alive connection: just close it.
        Err(_) if buf.is_empty() => Line::Done,
        Err(_) => Line::Timeout,
        Ok(Err(e)) => {
            tracing::debug!(uid = peer.uid, "read error: {e}");
            Line::Done
        }
        Ok(Ok(0)) => Line::Done,
        Ok(Ok(_)) => {
            if buf.last() == Some(&b'\n') {
                buf.pop();
                if buf.last() == Some(&b'\r') {
                    buf.pop();
                }
            } else if buf.len() > max {
                tracing::warn!(uid = peer.uid, pid = ?peer.pid, max, "request line too large; closing");
                return Line::TooLarge;
            }
            if buf.iter().all(u8::is_ascii_whitespace) {
                Line::Blank
            } else {
                Line::Request(buf)
            }
        }
    }
}
